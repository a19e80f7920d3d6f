//! Stochastic cell rescaling (Bernetti & Bussi, J. Chem. Phys. 153, 114107 (2020); the
//! anisotropic form of Del Tatto et al., Appl. Sci. 12, 1139 (2022)): a first-order barostat
//! whose noise makes the volume sample the isothermal-isobaric ensemble, on top of the Langevin
//! thermostat. This module holds its settings and its host-side arithmetic (the cell's move
//! from the pressure tensor, and the effective-energy bookkeeping); `npt` drives a step.
//!
//! The volume moves as λ = √V, whose noise is additive: Δλ = (D/kT) f dt + √(2 D dt) ξ with
//! D = kT β / 4τ and f = −2λ (P₀ − P − kT/2V). The anisotropic mode moves the traceless part
//! of the log cell lengths as well: Δe_α = μ V (P_αα − P) dt + √(2 μ kT dt) (ξ_α − ξ̄) with
//! μ = β / 3τV. P is the instantaneous pressure with the kinetic tensor (velocities are scaled
//! with the cell). Each move adds to the effective energy what its Euler–Maruyama step breaks
//! of detailed balance, so that E_kin + E_pot + P₀V + heat stays constant up to the time
//! step's error: the check of the integration (and of the stress it is fed).

use crate::error::{Error, Result};
use crate::stress::Matrix3;
use crate::units::{BAR_PER_EV_A3, FS, KB};
use serde::{Deserialize, Serialize};

/// Which cell shapes the barostat explores (`--barostat-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BarostatMode {
    /// The cell scales as a whole (liquids, solvated molecules): its shape is kept.
    #[default]
    Iso,
    /// The x, y and z lengths move independently (crystals); no shear.
    Aniso,
}

impl BarostatMode {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Iso => "iso",
            Self::Aniso => "aniso",
        }
    }
}

impl std::str::FromStr for BarostatMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "iso" => Ok(Self::Iso),
            "aniso" => Ok(Self::Aniso),
            _ => Err(format!(
                "unknown --barostat-mode `{s}` (expected iso or aniso)"
            )),
        }
    }
}

/// The barostat of an NPT run (on a Langevin thermostat, whose temperature it shares).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Barostat {
    /// Target pressure in bar.
    pub pressure_bar: f64,
    pub mode: BarostatMode,
    /// Relaxation time of the volume, fs.
    pub time_fs: f64,
    /// Isothermal compressibility the coupling assumes, 1/bar (water's 4.5e-5 by default;
    /// only β/τ matters, so a wrong β is a different relaxation time, not a wrong ensemble).
    pub compressibility_per_bar: f64,
}

impl Default for Barostat {
    fn default() -> Self {
        Self {
            pressure_bar: 1.0,
            mode: BarostatMode::Iso,
            time_fs: 1000.0,
            compressibility_per_bar: 4.5e-5,
        }
    }
}

impl Barostat {
    pub fn validate(&self) -> Result<()> {
        if !self.pressure_bar.is_finite() {
            return Err(Error::Md(format!(
                "barostat pressure must be finite, got {} bar",
                self.pressure_bar
            )));
        }
        if !(self.time_fs.is_finite() && self.time_fs > 0.0) {
            return Err(Error::Md(format!(
                "barostat time must be finite and > 0 fs, got {}",
                self.time_fs
            )));
        }
        if !(self.compressibility_per_bar.is_finite() && self.compressibility_per_bar > 0.0) {
            return Err(Error::Md(format!(
                "barostat compressibility must be finite and > 0 (1/bar), got {}",
                self.compressibility_per_bar
            )));
        }
        Ok(())
    }

    /// The target pressure in eV/Å³.
    pub fn pressure(&self) -> f64 {
        self.pressure_bar / BAR_PER_EV_A3
    }

    /// β/τ in Å³/eV per ASE time unit.
    fn rate(&self) -> f64 {
        self.compressibility_per_bar * BAR_PER_EV_A3 / (self.time_fs * FS)
    }
}

/// What the barostat reads at a step: the cell volume (Å³), twice the kinetic energy along
/// each axis (Σ m v_α², eV) and the stress (ASE's sign, eV/Å³).
#[derive(Clone, Copy, Debug)]
pub struct PressureInputs {
    pub volume: f64,
    pub twice_kinetic: [f64; 3],
    pub stress: Matrix3,
}

impl PressureInputs {
    /// The diagonal of the pressure tensor, eV/Å³.
    fn diagonal(&self) -> [f64; 3] {
        std::array::from_fn(|a| self.twice_kinetic[a] / self.volume - self.stress[a][a])
    }

    /// The pressure, eV/Å³.
    pub fn pressure(&self) -> f64 {
        self.diagonal().iter().sum::<f64>() / 3.0
    }
}

/// The generalized forces of the barostat's variables at one state: on λ = √V, and on the
/// traceless log lengths (zero in iso mode).
#[derive(Clone, Copy, Debug)]
struct Forces {
    lambda: f64,
    shape: [f64; 3],
}

/// One barostat move, decided from the state before the drift; [`finish`](Self::finish)
/// completes its effective-energy term from the state after the force call.
#[derive(Clone, Copy, Debug)]
pub struct Move {
    /// Every axis's length is multiplied by `scale[α]` (positions too; velocities divided).
    pub scale: [f64; 3],
    d_lambda: f64,
    d_shape: [f64; 3],
    /// The part of the move's heat known before the force call, eV.
    heat: f64,
}

impl Barostat {
    fn forces(&self, p: &PressureInputs, kt: f64) -> Forces {
        let diag = p.diagonal();
        let mean = diag.iter().sum::<f64>() / 3.0;
        let lambda = -2.0 * p.volume.sqrt() * (self.pressure() - mean - 0.5 * kt / p.volume);
        let shape = match self.mode {
            BarostatMode::Iso => [0.0; 3],
            BarostatMode::Aniso => std::array::from_fn(|a| p.volume * (diag[a] - mean)),
        };
        Forces { lambda, shape }
    }

    /// Mobilities times dt: of λ (D dt / kT) and of the shape at volume `v` (μ dt).
    fn steps(&self, dt: f64, v: f64) -> (f64, f64) {
        (0.25 * self.rate() * dt, self.rate() * dt / (3.0 * v))
    }

    /// The move over a step of `dt` (ASE time units) at `temperature` K, from the state `p`
    /// before the drift and standard normals `xi` (the first for the volume, three for the
    /// shape in aniso mode).
    pub fn propose(
        &self,
        p: &PressureInputs,
        temperature: f64,
        dt: f64,
        xi: [f64; 4],
    ) -> Result<Move> {
        let kt = KB * temperature;
        let f = self.forces(p, kt);
        let (a_lambda, _) = self.steps(dt, p.volume);
        let lambda = p.volume.sqrt();
        let d_lambda = a_lambda * f.lambda + (2.0 * a_lambda * kt).sqrt() * xi[0];
        let lambda_new = lambda + d_lambda;
        if !(lambda_new > 0.0 && lambda_new.is_finite()) {
            return Err(Error::NonFinite(format!(
                "the barostat moved the volume from {:.6e} Å³ to nothing (pressure {:.6e} bar): \
                 a shorter step or a longer --barostat-time",
                p.volume,
                p.pressure() * BAR_PER_EV_A3
            )));
        }
        let volume_new = lambda_new * lambda_new;
        let (_, a_shape) = self.steps(dt, volume_new);
        let mean_xi = (xi[1] + xi[2] + xi[3]) / 3.0;
        let d_shape: [f64; 3] = match self.mode {
            BarostatMode::Iso => [0.0; 3],
            BarostatMode::Aniso => std::array::from_fn(|a| {
                a_shape * f.shape[a] + (2.0 * a_shape * kt).sqrt() * (xi[a + 1] - mean_xi)
            }),
        };
        let linear = (volume_new / p.volume).cbrt();
        let scale = std::array::from_fn(|a| linear * d_shape[a].exp());
        let shape_term: f64 = (0..3).map(|a| d_shape[a] * f.shape[a]).sum::<f64>();
        let shape_norm: f64 = f.shape.iter().map(|x| x * x).sum();
        let heat = 0.5 * d_lambda * f.lambda - 0.25 * a_lambda * f.lambda * f.lambda
            + 0.5 * shape_term
            - 0.25 * a_shape * shape_norm
            + 0.5 * kt * p.volume.ln();
        Ok(Move {
            scale,
            d_lambda,
            d_shape,
            heat,
        })
    }
}

impl Move {
    /// The move's whole effective-energy term (eV), with the state `p` after the drift and
    /// the force call: kT ln of the ratio of the forward and backward moves' probabilities,
    /// less the change of the volume's entropy term.
    pub fn finish(
        &self,
        barostat: &Barostat,
        p: &PressureInputs,
        temperature: f64,
        dt: f64,
    ) -> f64 {
        let kt = KB * temperature;
        let f = barostat.forces(p, kt);
        let (a_lambda, a_shape) = barostat.steps(dt, p.volume);
        let shape_term: f64 = (0..3).map(|a| self.d_shape[a] * f.shape[a]).sum::<f64>();
        let shape_norm: f64 = f.shape.iter().map(|x| x * x).sum();
        self.heat
            + 0.5 * self.d_lambda * f.lambda
            + 0.25 * a_lambda * f.lambda * f.lambda
            + 0.5 * shape_term
            + 0.25 * a_shape * shape_norm
            - 0.5 * kt * p.volume.ln()
    }
}

/// Scales the rows of `cell` (lattice vectors) along the Cartesian axes.
pub fn scale_cell(cell: &Matrix3, scale: &[f64; 3]) -> Matrix3 {
    std::array::from_fn(|r| std::array::from_fn(|a| cell[r][a] * scale[a]))
}

/// Density in g/cm³ of `mass_amu` in `volume` Å³.
pub fn density_g_cm3(mass_amu: f64, volume: f64) -> f64 {
    // 1 amu = 1.66053904e-24 g (CODATA 2014, as ASE), 1 Å³ = 1e-24 cm³.
    mass_amu * 1.660_539_04 / volume
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(volume: f64, pressure_ev: f64) -> PressureInputs {
        PressureInputs {
            volume,
            twice_kinetic: [0.0; 3],
            stress: std::array::from_fn(|a| {
                std::array::from_fn(|b| -pressure_ev * ((a == b) as u8 as f64))
            }),
        }
    }

    #[test]
    fn the_cell_shrinks_when_the_pressure_is_below_target_without_noise() {
        let b = Barostat {
            pressure_bar: 1000.0,
            ..Default::default()
        };
        let p = inputs(1000.0, 0.0);
        let m = b.propose(&p, 300.0, FS, [0.0; 4]).unwrap();
        assert!(m.scale.iter().all(|&s| s < 1.0), "{:?}", m.scale);
        let p = inputs(1000.0, 2000.0 / BAR_PER_EV_A3);
        let m = b.propose(&p, 0.0, FS, [0.0; 4]).unwrap();
        assert!(m.scale.iter().all(|&s| s > 1.0), "{:?}", m.scale);
    }

    #[test]
    fn iso_moves_keep_the_shape_and_aniso_moves_follow_the_stress() {
        let mut b = Barostat::default();
        let mut p = inputs(1000.0, 1.0 / BAR_PER_EV_A3);
        p.stress[0][0] = -3000.0 / BAR_PER_EV_A3;
        let iso = b.propose(&p, 300.0, FS, [0.3, 1.0, -2.0, 0.5]).unwrap();
        assert_eq!(iso.scale[0], iso.scale[1]);
        assert_eq!(iso.scale[1], iso.scale[2]);
        b.mode = BarostatMode::Aniso;
        let aniso = b.propose(&p, 0.0, FS, [0.0; 4]).unwrap();
        // Pushed along x: x grows relative to y and z.
        assert!(aniso.scale[0] > aniso.scale[1], "{:?}", aniso.scale);
        assert!((aniso.scale[1] - aniso.scale[2]).abs() < 1e-15);
        // The shape's move is traceless: the volume moves as in iso mode.
        let v: f64 = aniso.scale.iter().product();
        b.mode = BarostatMode::Iso;
        let iso0 = b.propose(&p, 0.0, FS, [0.0; 4]).unwrap();
        assert!((v - iso0.scale.iter().product::<f64>()).abs() < 1e-12);
    }
}
