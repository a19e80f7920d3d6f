//! `mlff predict MODEL FILE`: energies and forces for every frame, written as extended XYZ.

use super::{BatchGraphArgs, ModelArgs};
use crate::fsutil::{Mode, OutputSet};
use crate::io::{read_extxyz, write_extxyz};
use crate::structure::ExtraArray;
use crate::{Batch, Calculator, Structure};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct PredictArgs {
    /// Checkpoint (.safetensors).
    model: PathBuf,
    /// Extended-XYZ file with one or more frames.
    input: PathBuf,
    /// Write the frames with predicted `energy` and `forces` here (input labels are kept as
    /// `ref_energy` and `ref_forces`).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Replace --output if it exists (by default it is refused).
    #[arg(long)]
    overwrite: bool,
    /// Frames per model call.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Also the stress of every frame with a cell periodic along all three axes, written as
    /// `stress` (eV/Å³, 3x3, ASE's sign: `atoms.get_stress()` reads it back; an input
    /// `stress` label is kept as `ref_stress`). The fused backend gathers it in its force
    /// kernel (a few percent over energy and forces); the others through autograd.
    #[arg(long)]
    stress: bool,
    /// Also every atom's virial as the per-atom column `virials` (9 values, eV, rows of the
    /// 3x3): W_i = Σ over its edges of r_ij ⊗ F_ij, the share of the structure's −V σ that
    /// the force kernel gathers at atom i (with --stress; --backend fused).
    #[arg(long, requires = "stress")]
    virials: bool,
    /// Also every atom's energy as the per-atom column `energies` (eV; ASE's
    /// `atoms.get_potential_energies()` reads it back): the terms each frame's energy sums.
    #[arg(long)]
    energies: bool,
    #[command(flatten)]
    run: ModelArgs,
    #[command(flatten)]
    graphs: BatchGraphArgs,
}

pub fn run(a: PredictArgs) -> Result<()> {
    anyhow::ensure!(a.batch_size > 0, "--batch-size must be at least 1");
    let mut io = OutputSet::new();
    io.input("MODEL", &a.model).input("FILE", &a.input);
    if let Some(t) = &a.run.tuning.tuning {
        io.input("--tuning", t);
    }
    if let Some(out) = &a.output {
        io.output("--output", out, Mode::for_existing(a.overwrite, false));
    }
    let _claim = super::claim(&io)?;
    let model = a.run.calculator(&a.model)?;
    let calc = a.graphs.wrap(&model)?;
    let frames = read_extxyz(&a.input)?;
    anyhow::ensure!(!frames.is_empty(), "{}: no frames", a.input.display());
    // Overlapping atoms give non-finite forces: refused up front, as `mlff md` refuses them.
    for (k, s) in frames.iter().enumerate() {
        crate::md::check_separation(s)
            .map_err(|e| anyhow::anyhow!("{}: frame {k}: {e}", a.input.display()))?;
    }
    let mut out = Vec::with_capacity(frames.len());
    for (c, chunk) in frames.chunks(a.batch_size).enumerate() {
        let first = c * a.batch_size;
        let batch = Batch::new(chunk.to_vec())
            .map_err(|e| super::at_frame(e, |k| (a.input.clone(), first + k)))?;
        // Every atom's energy where asked for, with the prediction it sums to (one call).
        let with_atoms = match a.energies {
            true => Some(
                model
                    .compute_with_atom_energies(&batch)
                    .map_err(|e| super::at_frame(e, |k| (a.input.clone(), first + k)))?,
            ),
            false => None,
        };
        let (pred, stresses, virials) = match (a.stress, a.virials) {
            (true, true) => model
                .compute_with_virials(&batch)
                .map(|(p, w)| (p.prediction, p.stresses, w.into_iter().map(Some).collect())),
            (true, false) => {
                let p = model.compute_with_stress(&batch);
                p.map(|p| (p.prediction, p.stresses, vec![None; chunk.len()]))
            }
            _ => match &with_atoms {
                Some((p, _)) => Ok(p.clone()),
                None => calc.compute(&batch),
            }
            .map(|p| (p, vec![None; chunk.len()], vec![None; chunk.len()])),
        }
        .map_err(|e| super::at_frame(e, |k| (a.input.clone(), first + k)))?;
        // A non-finite result (a NaN weight, say) is an error naming the frame and atom;
        // nothing has been written yet.
        pred.check_finite()
            .map_err(|e| super::at_frame(e, |k| (a.input.clone(), first + k)))?;
        let atom_energies = match with_atoms {
            Some((_, ea)) => ea.into_iter().map(Some).collect(),
            None => vec![None; chunk.len()],
        };
        let results = (pred.energies.into_iter().zip(pred.forces))
            .zip(stresses)
            .zip(virials)
            .zip(atom_energies);
        for (s, ((((e, f), sigma), w), ea)) in chunk.iter().zip(results) {
            let mut s = with_prediction(s.clone(), e, f);
            if let Some(ea) = ea {
                set_column(&mut s, "energies", 1, ea.iter());
            }
            if let Some(w) = w {
                set_column(&mut s, "virials", 9, w.iter().flatten().flatten());
            }
            if let Some(sigma) = sigma {
                anyhow::ensure!(
                    sigma.iter().flatten().all(|x| x.is_finite()),
                    "{}: frame {}: the predicted stress is not finite: {sigma:?}",
                    a.input.display(),
                    out.len()
                );
                let old = s.info.iter().position(|(k, _)| k == "stress");
                if let Some(i) = old {
                    let (_, v) = s.info.remove(i);
                    s.info.retain(|(k, _)| k != "ref_stress");
                    s.info.push(("ref_stress".into(), v));
                }
                let rows = sigma.iter().flatten().map(|x| format!("{x:?}"));
                s.info
                    .push(("stress".into(), rows.collect::<Vec<_>>().join(" ")));
            }
            out.push(s);
        }
    }
    BatchGraphArgs::report(&calc);
    print_summary(&out);
    if let Some(path) = &a.output {
        write_extxyz(path, &out)?;
        eprintln!("wrote {} frames to {}", out.len(), path.display());
    }
    Ok(())
}

/// Sets the per-atom real column `name` (`ncols` values per atom), replacing one read in.
fn set_column<'a>(
    s: &mut Structure,
    name: &str,
    ncols: usize,
    values: impl Iterator<Item = &'a f64>,
) {
    s.arrays.retain(|x| x.name != name);
    s.arrays.push(ExtraArray {
        name: name.into(),
        kind: 'R',
        ncols,
        values: values.map(|x| format!("{x:?}")).collect(),
    });
}

/// Puts the prediction in `energy`/`forces`, moving any input labels to `ref_*`.
fn with_prediction(mut s: Structure, energy: f64, forces: Vec<[f64; 3]>) -> Structure {
    if let Some(e) = s.energy.replace(energy) {
        s.info.retain(|(k, _)| k != "ref_energy");
        s.info.push(("ref_energy".into(), format!("{e:?}")));
    }
    if let Some(f) = s.forces.replace(forces) {
        s.arrays.retain(|x| x.name != "ref_forces");
        s.arrays.push(ExtraArray {
            name: "ref_forces".into(),
            kind: 'R',
            ncols: 3,
            values: f.iter().flatten().map(|x| format!("{x:?}")).collect(),
        });
    }
    s
}

/// One line per frame, plus the error against reference labels when the input had them.
fn print_summary(frames: &[Structure]) {
    println!(
        "{:>6} {:>6} {:>18} {:>12}",
        "frame", "atoms", "energy/eV", "max|F|/eV/Å"
    );
    let (mut e_err, mut f_err, mut n_e, mut n_f) = (0.0, 0.0, 0usize, 0usize);
    for (k, s) in frames.iter().enumerate() {
        let forces = s.forces.as_deref().unwrap_or_default();
        let fmax = forces
            .iter()
            .map(|f| (f[0] * f[0] + f[1] * f[1] + f[2] * f[2]).sqrt())
            .fold(0.0, f64::max);
        println!(
            "{k:>6} {:>6} {:>18.6} {:>12.4}",
            s.len(),
            s.energy.unwrap_or(f64::NAN),
            fmax
        );
        if let Some(r) = s
            .info_value("ref_energy")
            .and_then(|v| v.parse::<f64>().ok())
        {
            e_err += (s.energy.unwrap_or(f64::NAN) - r).abs();
            n_e += 1;
        }
        if let Some(r) = s.arrays.iter().find(|x| x.name == "ref_forces") {
            for (p, v) in forces.iter().flatten().zip(&r.values) {
                f_err += (p - v.parse::<f64>().unwrap_or(f64::NAN)).abs();
                n_f += 1;
            }
        }
    }
    if n_e > 0 {
        println!(
            "energy MAE vs reference: {:.6} eV ({n_e} frames)",
            e_err / n_e as f64
        );
    }
    if n_f > 0 {
        println!("force MAE vs reference: {:.6} eV/Å", f_err / n_f as f64);
    }
}
