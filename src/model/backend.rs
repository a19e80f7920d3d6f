//! How a model computes energies and forces: the public choice of implementation, as
//! candle-transformers passes `use_flash_attn` and TorchMD-Net passes `strategy`.

use crate::ops::{gather, scatter_add};
use candle_core::{Result, Tensor};

/// The model's implementation. Every backend gives the same energies and forces to rounding;
/// which kernels a fused call launches is then the plan's choice (`crate::plan`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// candle's autograd through the model's graph, with our gather and scatter ops (a
    /// parallel atomic scatter on CUDA): what training differentiates.
    #[default]
    Autograd,
    /// candle's autograd with candle's own `index_select` / `index_add` (a serial scatter on
    /// CUDA): the baseline the benchmarks compare against.
    Stock,
    /// Fused kernels and an explicit force adjoint (inference, the fastest). The model's
    /// autograd graph, where training differentiates it, uses the differentiable fused
    /// message op (`ops::message`).
    Fused,
}

impl Backend {
    /// `out[e, ...] = x[idx[e], ...]` along dimension 0; `idx` is u32.
    pub fn gather(self, x: &Tensor, idx: &Tensor) -> Result<Tensor> {
        match self {
            Self::Autograd | Self::Fused => gather(x, idx),
            Self::Stock => x.contiguous()?.index_select(idx, 0),
        }
    }

    /// `out[idx[e], ...] += src[e, ...]` into `n` zero rows; `idx` is u32.
    pub fn scatter_add(self, src: &Tensor, idx: &Tensor, n: usize) -> Result<Tensor> {
        match self {
            Self::Autograd | Self::Fused => scatter_add(src, idx, n),
            Self::Stock => {
                let mut dims = src.dims().to_vec();
                dims[0] = n;
                // candle's index_add needs a contiguous source.
                Tensor::zeros(dims, src.dtype(), src.device())?.index_add(
                    idx,
                    &src.contiguous()?,
                    0,
                )
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Autograd => "autograd",
            Self::Stock => "stock",
            Self::Fused => "fused",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            // (custom: the name before the backends had one.)
            "autograd" | "custom" => Ok(Self::Autograd),
            "stock" => Ok(Self::Stock),
            "fused" => Ok(Self::Fused),
            _ => Err(format!(
                "unknown backend `{s}` (expected fused, autograd or stock)"
            )),
        }
    }
}
