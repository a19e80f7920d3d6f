//! Model hyper-parameters, stored as JSON in every checkpoint.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// PaiNN hyper-parameters. Defaults follow the paper and the original project: 128 features,
/// 3 interaction blocks, 20 Gaussians, 5 Å cosine cutoff.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PainnConfig {
    /// Feature width F of the scalar and vector channels.
    #[serde(default = "default_hidden")]
    pub hidden: usize,
    /// Number of message + update blocks.
    #[serde(default = "default_blocks")]
    pub n_blocks: usize,
    /// Number of Gaussian radial basis functions between 0 and the cutoff.
    #[serde(default = "default_rbf")]
    pub n_rbf: usize,
    /// Cutoff radius in Å.
    #[serde(default = "default_cutoff")]
    pub cutoff: f64,
    /// Atomic numbers the model knows, in embedding order.
    #[serde(default = "default_elements")]
    pub elements: Vec<u8>,
}

fn default_hidden() -> usize {
    128
}
fn default_blocks() -> usize {
    3
}
fn default_rbf() -> usize {
    20
}
fn default_cutoff() -> f64 {
    5.0
}
fn default_elements() -> Vec<u8> {
    vec![1, 6, 7, 8]
}

impl Default for PainnConfig {
    fn default() -> Self {
        Self {
            hidden: default_hidden(),
            n_blocks: default_blocks(),
            n_rbf: default_rbf(),
            cutoff: default_cutoff(),
            elements: default_elements(),
        }
    }
}

impl PainnConfig {
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: Self =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("invalid JSON: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.into(),
            cause: source,
        })?;
        Self::from_json(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("config serialises")
    }

    /// What a valid config cannot do on the default code path, if anything: more radial
    /// functions than the fused kernels take (such a model runs with `--backend autograd`).
    pub fn fused_note(&self) -> Option<String> {
        let max = crate::ops::FUSED_MAX_RBF;
        (self.n_rbf > max).then(|| {
            format!(
                "n_rbf = {} is more than the fused kernels take ({max}): md, predict, eval and \
                 validate-md will need --backend autograd (slower)",
                self.n_rbf
            )
        })
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.hidden < 2 || !self.hidden.is_multiple_of(2) {
            return bad(format!("hidden must be even and ≥ 2, got {}", self.hidden));
        }
        if self.n_blocks == 0 {
            return bad("n_blocks must be ≥ 1".into());
        }
        if self.n_rbf < 2 {
            return bad(format!("n_rbf must be ≥ 2, got {}", self.n_rbf));
        }
        if !(self.cutoff.is_finite() && self.cutoff > 0.0) {
            return bad(format!("cutoff must be positive, got {}", self.cutoff));
        }
        if self.elements.is_empty() {
            return bad("elements must list at least one atomic number".into());
        }
        for (k, &z) in self.elements.iter().enumerate() {
            if z == 0 || z > 118 {
                return bad(format!("elements[{k}] = {z} is not an atomic number"));
            }
            if self.elements[..k].contains(&z) {
                return bad(format!("element {z} is listed twice"));
            }
        }
        Ok(())
    }

    /// Embedding row of each atomic number, or the first atom the model does not know.
    pub fn species_of(&self, numbers: &[u8]) -> std::result::Result<Vec<u32>, (usize, u8)> {
        let mut table = [u32::MAX; 256];
        for (k, &z) in self.elements.iter().enumerate() {
            table[z as usize] = k as u32;
        }
        numbers
            .iter()
            .enumerate()
            .map(|(i, &z)| match table[z as usize] {
                u32::MAX => Err((i, z)),
                s => Ok(s),
            })
            .collect()
    }
}
