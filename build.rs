//! Compiles kernels/*.cu to PTX with nvcc when the `cuda` feature is on; the crate embeds the
//! PTX with include_str!. Without the feature nothing is compiled, so CPU-only builds need no
//! CUDA toolchain.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    git_commit();
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|root| PathBuf::from(root).join("bin").join("nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    // PTX for an older virtual architecture is JIT-compiled forward by the driver.
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "70".into());
    let mut sources: Vec<PathBuf> = std::fs::read_dir("kernels")
        .expect("kernels/ directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for src in sources {
        let stem = src.file_stem().unwrap().to_string_lossy().to_string();
        let ptx = out_dir.join(format!("{stem}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "-Ikernels"])
            .arg(format!("-arch=compute_{cap}"))
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("running {nvcc:?} (set CUDA_ROOT or PATH): {e}"));
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}

/// Records the source commit (for checkpoint provenance) as MLFF_GIT_COMMIT.
fn git_commit() {
    for p in [".git/HEAD", ".git/refs/heads"] {
        if std::path::Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MLFF_GIT_COMMIT={commit}");
}
