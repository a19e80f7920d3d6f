//! The crate's layout holds: no import cycles between modules (docs/architecture.md), and no
//! source file grows past the sizes the house keeps (about 600 lines, tests about 800).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `model::fused` for src/model/fused/mod.rs, `ops::layers::dense` for its file.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into()).collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// The paths after `crate::` and `super::` in `text` (comments dropped), as segments from the
/// crate root; `super::` counts from `module` (inside a file's own nested `mod tests` that is
/// one level too high, which only ever names an ancestor, and ancestors are not counted).
fn references(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest
            .find("crate::")
            .into_iter()
            .chain(rest.find("super::"))
            .min()
        {
            let before = &rest[..at];
            let is_super = rest[at..].starts_with("super::");
            let mut tail = &rest[at..];
            rest = &rest[at + 7..];
            // `$crate::` is a macro's path to the crate; other word characters before: not a path.
            if before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let mut base: Vec<String> = Vec::new();
            if is_super {
                let mut ups = 0;
                while let Some(t) = tail.strip_prefix("super::") {
                    ups += 1;
                    tail = t;
                }
                rest = tail;
                base = module[..module.len().saturating_sub(ups)].to_vec();
            } else {
                tail = &tail[7..];
            }
            base.extend(
                tail.split("::")
                    .map(|s| {
                        s.chars()
                            .take_while(|c| {
                                c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit()
                            })
                            .collect::<String>()
                    })
                    .take_while(|s| !s.is_empty()),
            );
            out.push(base);
        }
    }
    out
}

/// No two modules at one depth import each other (top level: `md` and `profiler`; one down:
/// `md::forces` and `md::integrator`).
#[test]
fn no_import_cycles_between_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(&src, f)).collect();
    let resolve = |mut p: Vec<String>| {
        while !p.is_empty() && !modules.contains(&p) {
            p.pop();
        }
        p
    };
    let mut cycles = Vec::new();
    for depth in [1, 2] {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in &files {
            let module = module_of(&src, file);
            let text = std::fs::read_to_string(file).unwrap();
            let from: Vec<String> = module.iter().take(depth).cloned().collect();
            for target in references(&text, &module) {
                let to: Vec<String> = resolve(target).into_iter().take(depth).collect();
                // A module and its ancestors (a parent declares its children) do not count.
                let related = to.starts_with(&from) || from.starts_with(&to);
                if !to.is_empty() && !from.is_empty() && !related {
                    edges
                        .entry(from.join("::"))
                        .or_default()
                        .insert(to.join("::"));
                }
            }
        }
        for (a, targets) in &edges {
            for b in targets {
                if a < b && edges.get(b).is_some_and(|t| t.contains(a)) {
                    cycles.push(format!("{a} <-> {b}"));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles: {}", cycles.join(", "));
}

/// Source files stay at about 600 lines, test files at about 800 (one concept per file).
#[test]
fn files_stay_small() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut too_long = Vec::new();
    for (dir, most) in [
        ("src", 650),
        ("tests", 850),
        ("benches", 650),
        ("examples", 650),
    ] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for f in files {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            if lines > most {
                too_long.push(format!("{} ({lines} lines, at most {most})", f.display()));
            }
        }
    }
    assert!(too_long.is_empty(), "{}", too_long.join("\n"));
}
