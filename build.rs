//! Compiles kernels/*.cu with nvcc when the `cuda` feature is on, to PTX and to a fatbin of
//! machine code plus PTX, which the crate embeds with include_bytes! (ops::kernel). Without
//! the feature nothing is compiled, so CPU-only builds need no CUDA toolchain.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    git_commit();
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        nccl_link(&out_dir);
    }
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|root| PathBuf::from(root).join("bin").join("nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    // PTX for an older virtual architecture is JIT-compiled forward by the driver.
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "70".into());
    // kernels/ mirrors src/ops (edges/, layers/, whole/), headers shared between files in
    // kernels/include/; each .cu file's stem names its module, so stems are unique.
    let mut sources = Vec::new();
    files_under(Path::new("kernels"), &mut sources);
    sources.retain(|p| p.extension().is_some_and(|x| x == "cu"));
    sources.sort();
    // A change under src/ reruns this script (for the name check below) but recompiles
    // nothing unless a kernel source, a header or this script is newer than the PTX (or the
    // target changed).
    let stamp = out_dir.join("compute_cap");
    let cap_changed = std::fs::read_to_string(&stamp).ok().as_deref() != Some(cap.as_str());
    let this_script = std::fs::metadata("build.rs")
        .and_then(|m| m.modified())
        .ok();
    let newest_kernel = newest_mtime(Path::new("kernels")).max(this_script);
    // Each stale kernel as PTX (the names are checked in it below) and as a fatbin image of
    // machine code for `cap` plus that PTX, which the crate loads: the driver then compiles
    // nothing on a machine of that architecture (the one kernel took it 80-160 s). All nvcc
    // runs at once; compiling the machine code is most of the time.
    let mut runs = Vec::new();
    for src in sources {
        let stem = src.file_stem().unwrap().to_string_lossy().to_string();
        let ptx = out_dir.join(format!("{stem}.ptx"));
        let image = out_dir.join(format!("{stem}.fatbin"));
        let fresh = [&ptx, &image].iter().all(|p| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| Some(t) >= newest_kernel)
        });
        if fresh && !cap_changed {
            continue;
        }
        let nvcc_run = |args: &[String], out: &Path| {
            Command::new(&nvcc)
                // -lineinfo: line tables for profilers (ncu's source view); same code.
                .args(["-O3", "-std=c++17", "-Ikernels/include", "-lineinfo"])
                .args(args)
                .arg("-o")
                .arg(out)
                .arg(&src)
                .spawn()
                .unwrap_or_else(|e| panic!("running {nvcc:?} (set CUDA_ROOT or PATH): {e}"))
        };
        let ptx_args = ["--ptx".to_string(), format!("-arch=compute_{cap}")];
        let image_args = [
            "--fatbin".to_string(),
            "-gencode".to_string(),
            format!("arch=compute_{cap},code=sm_{cap}"),
            "-gencode".to_string(),
            format!("arch=compute_{cap},code=compute_{cap}"),
        ];
        runs.push((src.clone(), nvcc_run(&ptx_args, &ptx)));
        runs.push((src.clone(), nvcc_run(&image_args, &image)));
    }
    for (src, mut child) in runs {
        let status = child.wait().expect("waiting for nvcc");
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
    std::fs::write(&stamp, &cap).expect("writing the compute-capability stamp");
    check_kernel_names(Path::new("src"), &out_dir);
}

/// Every file under `dir`, recursively.
/// With the `nccl` feature cudarc links libnccl. The folder holding it is added to the link
/// search: `$NCCL_HOME/lib`, else the `nvidia-nccl` wheel PyTorch installs (found through
/// `python3`), else the linker's own paths. The wheel holds only `libnccl.so.2`, so a
/// `libnccl.so` link to it is made in OUT_DIR. At run time the library must be on the
/// loader's path (LD_LIBRARY_PATH).
fn nccl_link(out_dir: &Path) {
    println!("cargo:rerun-if-env-changed=NCCL_HOME");
    let mut dirs = Vec::new();
    if let Some(home) = std::env::var_os("NCCL_HOME").map(PathBuf::from) {
        dirs.extend([home.join("lib"), home.join("lib64"), home]);
    }
    let probe = "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))";
    if let Ok(out) = Command::new("python3").args(["-c", probe]).output() {
        if out.status.success() {
            dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    for dir in dirs {
        if dir.join("libnccl.so").exists() {
            println!("cargo:rustc-link-search=native={}", dir.display());
            return;
        }
        let versioned = dir.join("libnccl.so.2");
        if versioned.exists() {
            let links = out_dir.join("nccl-link");
            let link = links.join("libnccl.so");
            let _ = std::fs::create_dir_all(&links);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&versioned, &link)
                .unwrap_or_else(|e| panic!("linking {}: {e}", versioned.display()));
            println!("cargo:rustc-link-search=native={}", links.display());
            return;
        }
    }
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut files = Vec::new();
    files_under(dir, &mut files);
    files
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok()?.modified().ok())
        .max()
}

/// Every kernel that Rust code names as `kernel_source!("NAME", "MODULE")` must be an entry
/// (`NAME_f32` or `NAME_f64`, or a variant's `NAME_<digit>..._f32`) of kernels/MODULE.cu's
/// PTX. Names are strings, so without this a
/// kernel missing from a committed .cu file builds everywhere and fails only on a GPU.
fn check_kernel_names(dir: &Path, out_dir: &Path) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("src/ directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    for path in files {
        if path.is_dir() {
            check_kernel_names(&path, out_dir);
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("reading a source file");
        for (line_no, line) in text.lines().enumerate() {
            let Some(rest) = line.trim().strip_prefix("kernel_source!(") else {
                continue;
            };
            let quoted: Vec<&str> = rest.split('"').skip(1).step_by(2).collect();
            let [name, module] = quoted[..] else {
                continue; // the macro's own definition
            };
            let ptx_path = out_dir.join(format!("{module}.ptx"));
            let ptx = std::fs::read_to_string(&ptx_path).unwrap_or_else(|_| {
                panic!(
                    "{}:{}: kernel `{name}` names module `{module}`, but no kernels/**/{module}.cu exists",
                    path.display(),
                    line_no + 1
                )
            });
            // `{name}_f32(`, or a variant's `{name}_{variant}_f32(` where the variant starts
            // with a digit (Kernel::function, e.g. a feature count).
            let defined = ptx.lines().any(|l| {
                let Some(rest) = l
                    .split_once(".entry ")
                    .and_then(|(_, e)| e.strip_prefix(name))
                else {
                    return false;
                };
                let typed = rest.ends_with("_f32(") || rest.ends_with("_f64(");
                let variant =
                    rest.starts_with('_') && rest[1..].starts_with(|c: char| c.is_ascii_digit());
                typed && (rest.len() == 5 || variant)
            });
            assert!(
                defined,
                "{}:{}: kernel `{name}` (`{name}_f32` or `{name}_f64`) is not defined in kernels/{module}.cu",
                path.display(),
                line_no + 1
            );
        }
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
