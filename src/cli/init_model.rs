//! `mlff init-model`: a seeded random checkpoint, the starting point before training.

use crate::checkpoint;
use crate::fsutil::{Mode, OutputSet};
use crate::model::{init_varmap, PainnConfig};
use anyhow::Result;
use candle_core::{DType, Device};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct InitModelArgs {
    /// Model config JSON (fields: hidden, n_blocks, n_rbf, cutoff, elements); defaults when
    /// omitted: 128 features, 3 blocks, 20 Gaussians, 5 Å, H C N O.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Output checkpoint.
    #[arg(short, long)]
    output: PathBuf,
    /// Seed of the initialisation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Replace outputs that exist already (by default they are refused).
    #[arg(long)]
    overwrite: bool,
}

pub fn run(a: InitModelArgs) -> Result<()> {
    let cfg = match &a.config {
        Some(p) => PainnConfig::from_file(p)?,
        None => PainnConfig::default(),
    };
    let mut io = OutputSet::new();
    if let Some(c) = &a.config {
        io.input("--config", c);
    }
    io.output(
        "--output",
        &a.output,
        Mode::for_existing(a.overwrite, false),
    );
    let _claim = super::claim(&io)?;
    if let Some(note) = cfg.fused_note() {
        eprintln!("note: {note}");
    }
    let vm = init_varmap(&cfg, a.seed, DType::F32, &Device::Cpu)?;
    let provenance = serde_json::json!({
        "created_by": format!("mlff {} init-model", env!("CARGO_PKG_VERSION")),
        "trained": false,
        "init_seed": a.seed,
        "note": "random initialisation, not trained: energies and forces are meaningless",
    });
    checkpoint::save_varmap(&a.output, &cfg, &vm, &provenance)?;
    println!(
        "wrote untrained model {} (seed {})",
        a.output.display(),
        a.seed
    );
    Ok(())
}
