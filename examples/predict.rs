//! Energies and forces from code: load the shipped student, read the held-out aspirin frames,
//! predict them in batches (on CUDA when this build and machine have it), and compare with the
//! GFN2-xTB labels the file carries.
//!
//!     cargo run --release --example predict [-- FRAMES.extxyz [BATCH]]
//!
//! What `mlff predict` does, in a few lines of the library: a `PainnCalculator` (a model on a
//! device, in a dtype, with a backend and a tuning) and `Calculator::compute` on a `Batch`.

use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::io::read_extxyz;
use mlff_distiller::model::Backend;
use mlff_distiller::{Batch, Calculator, PainnCalculator, Tuning};
use std::path::{Path, PathBuf};

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut args = std::env::args().skip(1);
    let frames = args
        .next()
        .map_or_else(|| root.join("data/gfn2/aspirin_test.extxyz"), PathBuf::from);
    let batch_size: usize = args.next().map_or(Ok(16), |s| s.parse())?;
    anyhow::ensure!(batch_size > 0, "BATCH must be at least 1");
    let device = select(DeviceSpec::Auto)?.device;
    let model = root.join("models/painn-gfn2.safetensors");
    // The fused kernels (the default of every command) under the built-in tuning.
    let calc = PainnCalculator::from_checkpoint(&model, &device, candle_core::DType::F32)?
        .with_backend(Backend::Fused)
        .with_tuning(Tuning::default());
    let structures = read_extxyz(&frames)?;
    let (mut abs_df, mut components, mut abs_de) = (0.0, 0usize, Vec::new());
    for chunk in structures.chunks(batch_size) {
        let prediction = calc.compute(&Batch::new(chunk.to_vec())?)?;
        for (s, (e, f)) in chunk
            .iter()
            .zip(prediction.energies.iter().zip(&prediction.forces))
        {
            if let Some(label) = s.energy {
                abs_de.push((e - label).abs() / s.numbers.len() as f64);
            }
            for (fa, fb) in f.iter().zip(s.forces.iter().flatten()) {
                abs_df += (0..3).map(|k| (fa[k] - fb[k]).abs()).sum::<f64>();
                components += 3;
            }
        }
    }
    println!(
        "{} frames of {} on {device:?}: energy MAE {:.2} meV/atom, force MAE {:.1} meV/Å \
         (against the labels in the file)",
        structures.len(),
        frames.display(),
        1e3 * abs_de.iter().sum::<f64>() / abs_de.len().max(1) as f64,
        1e3 * abs_df / components.max(1) as f64,
    );
    Ok(())
}
