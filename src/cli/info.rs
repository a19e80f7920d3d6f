//! `mlff info MODEL`.

use crate::checkpoint;
use crate::io::extxyz::symbol;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct InfoArgs {
    /// Checkpoint (.safetensors).
    model: PathBuf,
    /// Print the whole description as JSON instead.
    #[arg(long)]
    json: bool,
}

pub fn run(a: InfoArgs) -> Result<()> {
    let ck = checkpoint::load(&a.model)?;
    let c = &ck.config;
    if a.json {
        let v = serde_json::json!({
            "path": a.model, "format_version": ck.format_version, "config": c,
            "parameters": ck.n_parameters(), "units": ck.units, "provenance": ck.provenance,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let elements: Vec<String> = c
        .elements
        .iter()
        .map(|&z| symbol(z).map_or(z.to_string(), str::to_string))
        .collect();
    println!("{}", a.model.display());
    println!("  model      PaiNN, format version {}", ck.format_version);
    println!(
        "  size       hidden {}, {} blocks, {} Gaussians, cutoff {} Å, {} parameters",
        c.hidden,
        c.n_blocks,
        c.n_rbf,
        c.cutoff,
        ck.n_parameters()
    );
    println!("  elements   {}", elements.join(" "));
    println!("  units      {}", ck.units);
    println!(
        "  provenance {}",
        serde_json::to_string_pretty(&ck.provenance)?.replace('\n', "\n             ")
    );
    Ok(())
}
