//! Accuracy of a model against labelled frames: energy and force errors overall, per element
//! and per molecule, and stress errors where frames have stress labels.

use crate::calculator::{Calculator, PainnCalculator};
use crate::error::{Error, Result};
use crate::io::extxyz::symbol;
use crate::stress::{stress_volume, voigt, Matrix3};
use crate::structure::{Batch, Structure};
use serde::Serialize;
use std::collections::BTreeMap;

/// Running sums of one group's errors.
#[derive(Clone, Debug, Default)]
struct Acc {
    frames: usize,
    atoms: usize,
    e_abs: f64,
    e_sq: f64,
    e_atom_abs: f64,
    e_atom_sq: f64,
    f_abs: f64,
    f_sq: f64,
    f_comps: usize,
    cos_sum: f64,
    cos_n: usize,
}

/// Errors of one group of frames or atoms. Energies in eV, forces in eV/Å.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Errors {
    pub frames: usize,
    pub atoms: usize,
    pub energy_mae: f64,
    pub energy_rmse: f64,
    pub energy_per_atom_mae: f64,
    pub energy_per_atom_rmse: f64,
    pub force_mae: f64,
    pub force_rmse: f64,
    /// Mean cosine similarity between predicted and reference force vectors (atoms whose
    /// reference force is below 1e-6 eV/Å are skipped).
    pub force_cosine: f64,
}

impl Acc {
    fn add_frame(&mut self, s: &Structure, e_pred: f64) {
        let de = e_pred - s.energy.unwrap_or(f64::NAN);
        let n = s.len() as f64;
        self.frames += 1;
        self.e_abs += de.abs();
        self.e_sq += de * de;
        self.e_atom_abs += de.abs() / n;
        self.e_atom_sq += (de / n).powi(2);
    }

    fn add_atom(&mut self, f_pred: &[f64; 3], f_ref: &[f64; 3]) {
        self.atoms += 1;
        let mut dot = 0.0;
        for d in 0..3 {
            let e = f_pred[d] - f_ref[d];
            self.f_abs += e.abs();
            self.f_sq += e * e;
            dot += f_pred[d] * f_ref[d];
        }
        self.f_comps += 3;
        let norm = |v: &[f64; 3]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let (np, nr) = (norm(f_pred), norm(f_ref));
        if nr > 1e-6 && np > 0.0 {
            self.cos_sum += dot / (np * nr);
            self.cos_n += 1;
        }
    }

    fn finish(&self) -> Errors {
        let per = |x: f64, n: usize| if n > 0 { x / n as f64 } else { f64::NAN };
        Errors {
            frames: self.frames,
            atoms: self.atoms,
            energy_mae: per(self.e_abs, self.frames),
            energy_rmse: per(self.e_sq, self.frames).sqrt(),
            energy_per_atom_mae: per(self.e_atom_abs, self.frames),
            energy_per_atom_rmse: per(self.e_atom_sq, self.frames).sqrt(),
            force_mae: per(self.f_abs, self.f_comps),
            force_rmse: per(self.f_sq, self.f_comps).sqrt(),
            force_cosine: per(self.cos_sum, self.cos_n),
        }
    }
}

/// The whole evaluation.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub overall: Errors,
    /// Force errors of the atoms of each element (energy fields unused).
    pub per_element: BTreeMap<String, Errors>,
    /// Errors of the frames of each molecule (info key `molecule`, else the formula).
    pub per_molecule: BTreeMap<String, Errors>,
    /// Over the frames with a `stress` label ([`stress_errors`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stress: Option<StressErrors>,
}

/// Stress errors over the six Voigt components of the labelled frames, eV/Å³.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StressErrors {
    pub frames: usize,
    pub mae: f64,
    pub rmse: f64,
}

/// A frame's stress label: its `stress` info value, nine numbers (the rows of the 3x3) or six
/// (ASE's Voigt order xx yy zz yz xz xy), eV/Å³ with ASE's sign.
pub fn stress_label(s: &Structure) -> std::result::Result<Option<Matrix3>, String> {
    let Some(text) = s.info_value("stress") else {
        return Ok(None);
    };
    let v = (text.split_whitespace())
        .map(|x| x.parse::<f64>())
        .collect::<std::result::Result<Vec<f64>, _>>()
        .map_err(|_| format!("stress `{text}` is not a list of numbers"))?;
    match v[..] {
        [a, b, c, d, e, f, g, h, i] => Ok(Some([[a, b, c], [d, e, f], [g, h, i]])),
        [xx, yy, zz, yz, xz, xy] => Ok(Some([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])),
        _ => Err(format!("stress has {} values, expected 9 or 6", v.len())),
    }
}

/// Stress errors of the frames of `frames` with a stress label (none without). `name(k)`
/// names frame k in errors: a label that is not a stress, or one on a frame without a cell
/// periodic along all three axes.
pub fn stress_errors(
    calc: &PainnCalculator,
    frames: &[Structure],
    batch_size: usize,
    name: &dyn Fn(usize) -> String,
) -> Result<Option<StressErrors>> {
    let mut labelled = Vec::new();
    for (k, s) in frames.iter().enumerate() {
        let bad = |m: String| Error::Structure(format!("{}: {m}", name(k)));
        if let Some(label) = stress_label(s).map_err(bad)? {
            if stress_volume(s).is_none() {
                return Err(bad(
                    "a stress label, but no cell periodic along all three axes".into(),
                ));
            }
            labelled.push((k, label));
        }
    }
    if labelled.is_empty() {
        return Ok(None);
    }
    let (mut abs, mut sq, mut n) = (0.0, 0.0, 0usize);
    for chunk in labelled.chunks(batch_size.max(1)) {
        let batch = Batch::new(chunk.iter().map(|(k, _)| frames[*k].clone()).collect())?;
        let got = calc.compute_with_stress(&batch)?;
        for ((k, label), sigma) in chunk.iter().zip(&got.stresses) {
            let sigma =
                sigma.ok_or_else(|| Error::Structure(format!("{}: no stress", name(*k))))?;
            for (p, r) in voigt(&sigma).iter().zip(voigt(label)) {
                abs += (p - r).abs();
                sq += (p - r) * (p - r);
                n += 1;
            }
        }
    }
    Ok(Some(StressErrors {
        frames: labelled.len(),
        mae: abs / n as f64,
        rmse: (sq / n as f64).sqrt(),
    }))
}

/// Reference and predicted force components, for parity plots.
#[derive(Clone, Debug, Default)]
pub struct Parity {
    pub reference: Vec<f64>,
    pub predicted: Vec<f64>,
}

/// Name of a frame's molecule: its `molecule` info value, else its Hill formula.
pub fn molecule_name(s: &Structure) -> String {
    if let Some(v) = s.info_value("molecule") {
        return v.to_string();
    }
    let mut counts: BTreeMap<u8, usize> = BTreeMap::new();
    for &z in &s.numbers {
        *counts.entry(z).or_default() += 1;
    }
    let mut order: Vec<u8> = counts.keys().copied().collect();
    // Hill order: C, H, then alphabetical.
    order.sort_by_key(|&z| match z {
        6 => (0, String::new()),
        1 if counts.contains_key(&6) => (1, String::new()),
        _ => (2, symbol(z).unwrap_or("?").to_string()),
    });
    order
        .iter()
        .map(|&z| match counts[&z] {
            1 => symbol(z).unwrap_or("?").to_string(),
            n => format!("{}{n}", symbol(z).unwrap_or("?")),
        })
        .collect()
}

/// Predicts every frame (in batches) and compares with its labels.
pub fn evaluate(
    calc: &dyn Calculator,
    frames: &[Structure],
    batch_size: usize,
) -> Result<(Report, Parity)> {
    let mut overall = Acc::default();
    let mut per_element: BTreeMap<String, Acc> = BTreeMap::new();
    let mut per_molecule: BTreeMap<String, Acc> = BTreeMap::new();
    let mut parity = Parity::default();
    let size = batch_size.max(1);
    for (c, chunk) in frames.chunks(size).enumerate() {
        // Errors about one structure name it by its index in `frames`.
        let first = c * size;
        let pred = Batch::new(chunk.to_vec())
            .and_then(|b| calc.compute(&b))
            .and_then(|p| p.check_finite().map(|_| p))
            .map_err(|e| e.shifted(first))?;
        for (s, (e, forces)) in chunk.iter().zip(pred.energies.iter().zip(&pred.forces)) {
            let mol = per_molecule.entry(molecule_name(s)).or_default();
            overall.add_frame(s, *e);
            mol.add_frame(s, *e);
            let refs = s.forces.as_deref().unwrap_or_default();
            for ((fp, fr), &z) in forces.iter().zip(refs).zip(&s.numbers) {
                overall.add_atom(fp, fr);
                mol.add_atom(fp, fr);
                let el = symbol(z).unwrap_or("?").to_string();
                per_element.entry(el).or_default().add_atom(fp, fr);
                parity.reference.extend_from_slice(fr);
                parity.predicted.extend_from_slice(fp);
            }
        }
    }
    let finish = |m: BTreeMap<String, Acc>| m.into_iter().map(|(k, a)| (k, a.finish())).collect();
    Ok((
        Report {
            overall: overall.finish(),
            per_element: finish(per_element),
            per_molecule: finish(per_molecule),
            stress: None,
        },
        parity,
    ))
}
