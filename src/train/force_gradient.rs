//! How the force loss is differentiated with respect to the weights.
//!
//! The force loss w_F·mean((F − F̂)²) has the gradient (2 w_F / M) Σ u·∂F/∂θ with u = F − F̂
//! (held fixed) and M the number of force components. Since F = −∇ₓE, Σ u·∂F/∂θ is
//! −∂/∂θ (u·∇ₓE), and u·∇ₓE is the derivative of E along u:
//! (E(x + h·u) − E(x − h·u)) / 2h + O(h²). So the weights' gradient of
//! −(w_F / M h)·(E(x + h·u) − E(x − h·u)) is the force loss's gradient: two displaced copies of
//! the batch through one ordinary forward and backward pass, instead of a backward pass whose
//! own graph is differentiated again (several times the ops, each a launch on the GPU). The
//! copies' mean energy also gives the energy term's gradient (exact to O(h²)); the loss values
//! themselves come from the energies and forces at x. That pass runs either through candle's
//! autograd ([`ForceGradient::Directional`]) or through the fused kernels' hand-written adjoint
//! ([`ForceGradient::Fused`], `FusedPainn::weight_gradients`).

use serde::{Deserialize, Serialize};

/// Which way the trainer takes the force loss's gradient.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForceGradient {
    /// Fused: the most structures per second on CUDA and on the CPU (BENCHMARKS.md,
    /// "Training throughput").
    #[default]
    Auto,
    /// The directional gradient with the displaced copies' weight gradients from the fused
    /// kernels' adjoint: no autograd graph at all.
    Fused,
    /// Central difference of the energy gradient along the force error (see the module docs):
    /// first-order backprop through candle's autograd; forces at x by the fused kernels.
    Directional,
    /// Exact: backprop through the backward pass that gives the forces (needs
    /// CANDLE_GRAD_DO_NOT_DETACH=1 before the first backward on the thread).
    DoubleBackward,
}

impl ForceGradient {
    /// The way used on `device` (`Auto` resolved).
    pub fn on(self, _device: &candle_core::Device) -> Self {
        match self {
            Self::Auto => Self::Fused,
            mode => mode,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fused => "fused",
            Self::Directional => "directional",
            Self::DoubleBackward => "double-backward",
        }
    }
}

impl std::str::FromStr for ForceGradient {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "fused" => Ok(Self::Fused),
            "directional" => Ok(Self::Directional),
            "double-backward" => Ok(Self::DoubleBackward),
            _ => Err(format!(
                "unknown force gradient `{s}` (expected auto, fused, directional or \
                 double-backward)"
            )),
        }
    }
}

/// Root-mean-square displacement (Å) of the difference quotient's two copies. In f32 the
/// rounding of the positions (ulp ~5e-7 Å at 5 Å) and of the two gradients' difference stays
/// ~1e-4 of the result at 1e-3 Å, and the O(h²) error ~(1e-3 Å / 0.26 Å Gaussian width)² ~ 1e-5.
pub fn displacement_rms(dtype: candle_core::DType) -> f64 {
    match dtype {
        candle_core::DType::F64 => 1e-5,
        _ => 1e-3,
    }
}

/// Step h along u = F − F̂ (eV/Å) so that the displacements h·u have `rms` root mean square;
/// `None` when every force is already exact (the force term then has no gradient).
pub fn step_along(u: &[[f64; 3]], rms: f64) -> Option<f64> {
    let m = (3 * u.len()).max(1) as f64;
    let u_rms = (u.iter().flatten().map(|c| c * c).sum::<f64>() / m).sqrt();
    (u_rms > 0.0 && u_rms.is_finite()).then(|| rms / u_rms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_gives_the_wanted_rms_displacement() {
        let u = [[3.0, 0.0, -4.0], [0.0, 0.0, 0.0]];
        let h = step_along(&u, 1e-3).unwrap();
        let rms = (u.iter().flatten().map(|c| (h * c).powi(2)).sum::<f64>() / 6.0).sqrt();
        assert!((rms - 1e-3).abs() < 1e-15, "{rms}");
        assert_eq!(step_along(&[[0.0; 3]; 4], 1e-3), None);
        assert_eq!(step_along(&[[f64::NAN, 0.0, 0.0]], 1e-3), None);
        assert_eq!(step_along(&[], 1e-3), None);
    }

    #[test]
    fn auto_resolves_by_device_and_names_parse_back() {
        let cpu = candle_core::Device::Cpu;
        assert_eq!(ForceGradient::Auto.on(&cpu), ForceGradient::Fused);
        assert_eq!(
            ForceGradient::Directional.on(&cpu),
            ForceGradient::Directional
        );
        for g in [
            ForceGradient::Auto,
            ForceGradient::Fused,
            ForceGradient::Directional,
            ForceGradient::DoubleBackward,
        ] {
            assert_eq!(g.name().parse::<ForceGradient>(), Ok(g));
        }
        assert!("exact"
            .parse::<ForceGradient>()
            .unwrap_err()
            .contains("double-backward"));
    }
}
