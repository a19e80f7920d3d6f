//! ASE's units: Å, eV, amu, and time in Å·sqrt(amu/eV) (≈ 10.18 fs), so that a = F/m and
//! E_kin = m v²/2 need no factors. Constants are CODATA 2014, ASE's default, so that velocities
//! and momenta written to extended XYZ mean the same to ASE.

/// One femtosecond in ASE time units (`ase.units.fs`).
pub const FS: f64 = 0.098_226_947_884_640_63;

/// One picosecond in ASE time units.
pub const PS: f64 = 1000.0 * FS;

/// Boltzmann constant in eV/K (`ase.units.kB`).
pub const KB: f64 = 8.617_330_337_217_213e-5;

/// One eV/Å³ in bar (`1 / ase.units.bar` in eV/Å³: 1 eV/Å³ = 160.21766 GPa).
pub const BAR_PER_EV_A3: f64 = 1.602_176_620_8e6;
