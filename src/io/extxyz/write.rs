//! Writing extended XYZ that ASE and our reader read back to the same values, atomically to a
//! file or to any writer.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::elements::symbol;
use super::grammar::check_token;
use crate::error::{Error, Result};
use crate::structure::Structure;

/// Writes `frames` to `path`, replacing it atomically: the data goes to a temporary file in
/// the same directory, which is renamed over `path` only once everything was written and
/// synced. On any error `path` is left as it was.
pub fn write_extxyz(path: &Path, frames: &[Structure]) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let io_err = |p: &Path, source: io::Error| Error::Io {
        path: p.to_path_buf(),
        cause: source,
    };
    let name = path.file_name().ok_or_else(|| {
        io_err(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "not a file path"),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let (tmp, file) = loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
        let tmp: PathBuf = dir.join(tmp_name);
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1 << 20 => continue,
            Err(e) => return Err(io_err(&tmp, e)),
        }
    };
    let written = (|| {
        if let Ok(meta) = fs::metadata(path) {
            // Keep the permissions of the file we replace; failing that is not fatal.
            let _ = fs::set_permissions(&tmp, meta.permissions());
        }
        let mut w = BufWriter::new(file);
        write_frames(&mut w, frames, path)?;
        let file = w.into_inner().map_err(|e| io_err(path, e.into_error()))?;
        file.sync_all().map_err(|e| io_err(path, e))?;
        fs::rename(&tmp, path).map_err(|e| io_err(path, e))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Writes `frames` to any writer, one `write_all` per frame (wrap unbuffered sinks in a
/// `BufWriter` if frames are small). Pass `&mut w` to keep using the writer, e.g. to append
/// and flush frame by frame. A frame that cannot be written (see [`Error::Structure`]) is
/// rejected before any of its bytes are written.
pub fn write_extxyz_to<W: Write>(mut w: W, frames: &[Structure]) -> Result<()> {
    write_frames(&mut w, frames, Path::new("<writer>"))
}

fn write_frames<W: Write>(w: &mut W, frames: &[Structure], path: &Path) -> Result<()> {
    let mut buf = String::new();
    for (k, s) in frames.iter().enumerate() {
        buf.clear();
        format_frame(s, &mut buf).map_err(|m| Error::Structure(format!("frame {k}: {m}")))?;
        w.write_all(buf.as_bytes()).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            cause: source,
        })?;
    }
    w.flush().map_err(|source| Error::Io {
        path: path.to_path_buf(),
        cause: source,
    })
}

/// Keys and property names written by the format itself.
const RESERVED_KEYS: [&str; 4] = ["Lattice", "pbc", "Properties", "energy"];
const RESERVED_COLUMNS: [&str; 4] = ["species", "pos", "Z", "forces"];

/// Writes a value (or key) so that ASE's and our reader get it back unchanged.
fn push_escaped(buf: &mut String, v: &str) {
    let plain = !v.is_empty()
        && !v.chars().any(|c| {
            c.is_whitespace() || matches!(c, '"' | '\'' | '{' | '}' | '[' | ']' | '\\' | '=')
        });
    if plain {
        buf.push_str(v);
        return;
    }
    buf.push('"');
    for c in v.chars() {
        if matches!(c, '"' | '\\') {
            buf.push('\\');
        }
        buf.push(c);
    }
    buf.push('"');
}

/// Shortest text that parses back to the same `f64` (Rust's `Debug` form: `1.0`, `1e-7`).
fn push_f64(buf: &mut String, x: f64) {
    let _ = write!(buf, "{x:?}");
}

fn push_bools(buf: &mut String, p: [bool; 3]) {
    let t = |b: bool| if b { 'T' } else { 'F' };
    let _ = write!(buf, "\"{} {} {}\"", t(p[0]), t(p[1]), t(p[2]));
}

fn check_frame(s: &Structure) -> std::result::Result<(), String> {
    let n = s.numbers.len();
    if s.positions.len() != n {
        return Err(format!(
            "{n} atomic numbers but {} positions",
            s.positions.len()
        ));
    }
    if let Some(f) = &s.forces {
        if f.len() != n {
            return Err(format!("{n} atoms but {} force rows", f.len()));
        }
    }
    if let Some(i) = s.numbers.iter().position(|&z| symbol(z).is_none()) {
        return Err(format!("atom {i} has atomic number {}", s.numbers[i]));
    }
    for (i, (key, value)) in s.info.iter().enumerate() {
        if key.is_empty() {
            return Err("info has an empty key".into());
        }
        if RESERVED_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "info key `{key}` is written from the structure itself; use the field instead"
            ));
        }
        if key.contains(['\n', '\r']) || value.contains(['\n', '\r']) {
            return Err(format!("info `{key}` contains a line break"));
        }
        if s.info[..i].iter().any(|(k, _)| k == key) {
            return Err(format!("info key `{key}` appears twice"));
        }
    }
    for (i, a) in s.arrays.iter().enumerate() {
        let name = &a.name;
        if name.is_empty()
            || name.chars().any(|c| {
                c.is_whitespace()
                    || matches!(c, ':' | '"' | '\'' | '{' | '}' | '[' | ']' | '\\' | '=')
            })
        {
            return Err(format!(
                "array name `{name}` is empty or has a character not allowed in Properties"
            ));
        }
        if RESERVED_COLUMNS.contains(&name.as_str()) || (name == "force" && s.forces.is_none()) {
            return Err(format!(
                "array `{name}` would be read back as a structure field, not an extra array"
            ));
        }
        if s.arrays[..i].iter().any(|b| b.name == *name) {
            return Err(format!("array `{name}` appears twice"));
        }
        if !matches!(a.kind, 'R' | 'I' | 'S' | 'L') {
            return Err(format!(
                "array `{name}` has type `{}`, not one of R, I, S, L",
                a.kind
            ));
        }
        if a.ncols == 0 || Some(a.values.len()) != n.checked_mul(a.ncols) {
            return Err(format!(
                "array `{name}` has {} values, expected {n} atoms x {} columns",
                a.values.len(),
                a.ncols
            ));
        }
        for t in &a.values {
            if t.is_empty() || t.chars().any(char::is_whitespace) {
                return Err(format!(
                    "array `{name}` has the value `{t}`, which is empty or has whitespace"
                ));
            }
            check_token(a.kind, t).map_err(|m| format!("array `{name}`: {m}"))?;
        }
    }
    Ok(())
}

/// Appends one frame to `buf`, or says why it cannot be written.
fn format_frame(s: &Structure, buf: &mut String) -> std::result::Result<(), String> {
    check_frame(s)?;
    let n = s.numbers.len();
    let _ = writeln!(buf, "{n}");
    if let Some(c) = &s.cell {
        buf.push_str("Lattice=\"");
        for (i, x) in c.iter().flatten().enumerate() {
            if i > 0 {
                buf.push(' ');
            }
            push_f64(buf, *x);
        }
        buf.push_str("\" ");
    }
    buf.push_str("Properties=species:S:1:pos:R:3");
    if s.forces.is_some() {
        buf.push_str(":forces:R:3");
    }
    for a in &s.arrays {
        let _ = write!(buf, ":{}:{}:{}", a.name, a.kind, a.ncols);
    }
    if let Some(e) = s.energy {
        buf.push_str(" energy=");
        push_f64(buf, e);
    }
    for (k, v) in &s.info {
        buf.push(' ');
        push_escaped(buf, k);
        buf.push('=');
        push_escaped(buf, v);
    }
    buf.push_str(" pbc=");
    push_bools(buf, s.pbc);
    buf.push('\n');

    for i in 0..n {
        // Checked above: every number has a symbol.
        let sym = symbol(s.numbers[i]).unwrap_or("X");
        let _ = write!(buf, "{sym:<2}");
        for x in s.positions[i] {
            buf.push(' ');
            push_f64(buf, x);
        }
        if let Some(f) = &s.forces {
            for x in f[i] {
                buf.push(' ');
                push_f64(buf, x);
            }
        }
        for a in &s.arrays {
            for t in &a.values[i * a.ncols..(i + 1) * a.ncols] {
                buf.push(' ');
                buf.push_str(t);
            }
        }
        buf.push('\n');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::grammar::tests::{kv, p};
    use super::*;

    #[test]
    fn escaping_round_trips() {
        for v in ["plain", "", "two words", r#"q"uo\te"#, "a=b", "{x}", "it's"] {
            let mut line = String::from("k=");
            push_escaped(&mut line, v);
            line.push_str(" z=1");
            assert_eq!(
                kv(&line),
                vec![p("k", Some(v)), p("z", Some("1"))],
                "{line}"
            );
        }
    }
}
