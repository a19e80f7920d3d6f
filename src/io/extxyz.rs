//! Extended XYZ, as read and written by ASE (`ase.io.extxyz`).
//!
//! A frame is an atom-count line, a comment line of `key=value` pairs and one line per atom:
//!
//! ```text
//! 2
//! Lattice="4 0 0 0 4 0 0 0 4" Properties=species:S:1:pos:R:3:forces:R:3 energy=-1.5 pbc="T T T"
//! H 0.0 0.0 0.0 0.1 0.0 0.0
//! H 0.74 0.0 0.0 -0.1 0.0 0.0
//! ```
//!
//! Reading follows ASE's rules: values may be quoted with `"..."`, `'...'`, `{...}` or
//! `[...]`, a backslash escapes the next character, a key without `=` is a flag with value
//! `T`, `Lattice` lists the cell vectors a, b, c, `pbc` defaults to `T T T` when a `Lattice`
//! is given, and `Properties` defaults to `species:S:1:pos:R:3`. A comment line without any
//! `=` is plain XYZ free text and is ignored. `energy` and the `forces` (or `force`) column
//! become [`Structure::energy`] and [`Structure::forces`]; every other comment-line key goes
//! to [`Structure::info`] and every other column to [`Structure::arrays`], verbatim, so that
//! files round-trip.
//!
//! Writing produces what ASE reads back to the same values: floats are written in Rust's
//! shortest round-trip form, so reading our output gives bitwise-identical `f64`s.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::structure::{ExtraArray, Lattice, Structure};

/// Element symbols by atomic number: `ELEMENTS[z - 1]`.
pub const ELEMENTS: [&str; 118] = [
    "H", "He", "Li", "Be", "B", "C", "N", "O", "F", "Ne", "Na", "Mg", "Al", "Si", "P", "S", "Cl",
    "Ar", "K", "Ca", "Sc", "Ti", "V", "Cr", "Mn", "Fe", "Co", "Ni", "Cu", "Zn", "Ga", "Ge", "As",
    "Se", "Br", "Kr", "Rb", "Sr", "Y", "Zr", "Nb", "Mo", "Tc", "Ru", "Rh", "Pd", "Ag", "Cd", "In",
    "Sn", "Sb", "Te", "I", "Xe", "Cs", "Ba", "La", "Ce", "Pr", "Nd", "Pm", "Sm", "Eu", "Gd", "Tb",
    "Dy", "Ho", "Er", "Tm", "Yb", "Lu", "Hf", "Ta", "W", "Re", "Os", "Ir", "Pt", "Au", "Hg", "Tl",
    "Pb", "Bi", "Po", "At", "Rn", "Fr", "Ra", "Ac", "Th", "Pa", "U", "Np", "Pu", "Am", "Cm", "Bk",
    "Cf", "Es", "Fm", "Md", "No", "Lr", "Rf", "Db", "Sg", "Bh", "Hs", "Mt", "Ds", "Rg", "Cn", "Nh",
    "Fl", "Mc", "Lv", "Ts", "Og",
];

/// The symbol of atomic number `z` (1..=118).
pub fn symbol(z: u8) -> Option<&'static str> {
    ELEMENTS.get(usize::from(z).checked_sub(1)?).copied()
}

/// Table index of a one- or two-letter ASCII symbol, ignoring case.
fn symbol_key(s: &[u8]) -> Option<usize> {
    let letter = |b: u8| {
        let l = b.to_ascii_lowercase();
        l.is_ascii_lowercase().then(|| usize::from(l - b'a'))
    };
    match *s {
        [a] => Some(letter(a)? * 27),
        [a, b] => Some(letter(a)? * 27 + letter(b)? + 1),
        _ => None,
    }
}

/// The atomic number of an element symbol. Case is ignored, as ASE capitalises symbols
/// (`si` and `SI` are silicon).
pub fn atomic_number(sym: &str) -> Option<u8> {
    static TABLE: OnceLock<[u8; 26 * 27]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u8; 26 * 27];
        for (i, s) in ELEMENTS.iter().enumerate() {
            if let Some(k) = symbol_key(s.as_bytes()) {
                t[k] = (i + 1) as u8;
            }
        }
        t
    });
    let z = table[symbol_key(sym.as_bytes())?];
    (z != 0).then_some(z)
}

// ------------------------------------------------------------------------------------------
// Reading
// ------------------------------------------------------------------------------------------

/// Reads every frame of an extended XYZ file.
pub fn read_extxyz(path: &Path) -> Result<Vec<Structure>> {
    let bytes = fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_extxyz_bytes(&bytes, path)
}

/// Parses the bytes of an extended XYZ file (already read, e.g. to hash them too);
/// `path_for_errors` only labels errors.
pub fn parse_extxyz_bytes(bytes: &[u8], path_for_errors: &Path) -> Result<Vec<Structure>> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Parser::new(text, path_for_errors, None).run(),
        Err(e) => {
            // Parse up to the bad line so the error names its frame.
            let bad_line = 1 + bytes[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            let text = String::from_utf8_lossy(bytes);
            Parser::new(&text, path_for_errors, Some(bad_line)).run()
        }
    }
}

/// Parses extended XYZ text; `path_for_errors` only labels errors.
pub fn parse_extxyz_str(text: &str, path_for_errors: &Path) -> Result<Vec<Structure>> {
    Parser::new(text, path_for_errors, None).run()
}

/// The role of one `Properties` entry.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Species,
    /// Species column when a `Z` column gives the numbers (ASE then ignores the symbols).
    IgnoredSpecies,
    Z,
    Pos,
    Forces,
    Extra,
}

#[derive(Debug)]
struct Property {
    name: String,
    kind: char,
    ncols: usize,
    role: Role,
}

/// What the comment line says about a frame.
#[derive(Debug)]
struct Header {
    cell: Option<Lattice>,
    pbc: [bool; 3],
    energy: Option<f64>,
    info: Vec<(String, String)>,
    properties: Vec<Property>,
    /// The `Properties` value, for messages.
    spec: String,
    /// Total number of columns on an atom line.
    ncols: usize,
}

const DEFAULT_PROPERTIES: &str = "species:S:1:pos:R:3";

struct Parser<'a> {
    path: &'a Path,
    lines: std::str::Lines<'a>,
    /// Number of the line last returned (1-based).
    line_no: usize,
    /// A line that was not valid UTF-8 in the file; reaching it is an error.
    bad_utf8_line: Option<usize>,
    frame: usize,
    /// Reused token buffer for atom lines.
    tokens: Vec<&'a str>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str, path: &'a Path, bad_utf8_line: Option<usize>) -> Self {
        Self {
            path,
            lines: text.lines(),
            line_no: 0,
            bad_utf8_line,
            frame: 0,
            tokens: Vec::new(),
        }
    }

    fn err(&self, line: usize, msg: impl Into<String>) -> Error {
        Error::Xyz {
            path: self.path.to_path_buf(),
            frame: self.frame,
            line,
            msg: msg.into(),
        }
    }

    fn next_line(&mut self) -> Result<Option<&'a str>> {
        let Some(line) = self.lines.next() else {
            return Ok(None);
        };
        self.line_no += 1;
        if self.bad_utf8_line == Some(self.line_no) {
            return Err(self.err(self.line_no, "line is not valid UTF-8"));
        }
        Ok(Some(line))
    }

    fn run(mut self) -> Result<Vec<Structure>> {
        let mut frames = Vec::new();
        while let Some(line) = self.next_line()? {
            if line.trim().is_empty() {
                // Blank lines may only end the file.
                let blank = self.line_no;
                while let Some(rest) = self.next_line()? {
                    if !rest.trim().is_empty() {
                        return Err(self.err(
                            blank,
                            format!(
                                "blank line where the atom count of frame {} was expected, \
                                 but more data follows on line {}",
                                self.frame, self.line_no
                            ),
                        ));
                    }
                }
                break;
            }
            let s = self.frame_after_count(line)?;
            frames.push(s);
            self.frame += 1;
        }
        Ok(frames)
    }

    fn frame_after_count(&mut self, count_line: &str) -> Result<Structure> {
        let count_no = self.line_no;
        let natoms: usize = count_line.trim().parse().map_err(|_| {
            self.err(
                count_no,
                format!(
                    "bad atom count `{}`: expected a non-negative integer",
                    count_line.trim()
                ),
            )
        })?;
        let Some(comment) = self.next_line()? else {
            return Err(self.err(
                count_no + 1,
                format!("file ended after the atom count ({natoms}); the comment line is missing"),
            ));
        };
        let header = parse_header(comment).map_err(|m| self.err(self.line_no, m))?;

        let cap = natoms.min(1 << 16);
        let mut numbers = Vec::with_capacity(cap);
        let mut positions = Vec::with_capacity(cap);
        let mut forces = header
            .properties
            .iter()
            .any(|p| p.role == Role::Forces)
            .then(|| Vec::with_capacity(cap));
        let mut arrays: Vec<ExtraArray> = header
            .properties
            .iter()
            .filter(|p| p.role == Role::Extra)
            .map(|p| ExtraArray {
                name: p.name.clone(),
                kind: p.kind,
                ncols: p.ncols,
                values: Vec::with_capacity(cap.saturating_mul(p.ncols).min(1 << 18)),
            })
            .collect();

        for atom in 0..natoms {
            let Some(line) = self.next_line()? else {
                return Err(self.err(
                    self.line_no + 1,
                    format!(
                        "truncated frame: file ended after {atom} of {natoms} atoms \
                         (atom count on line {count_no})"
                    ),
                ));
            };
            let ln = self.line_no;
            let mut tokens = std::mem::take(&mut self.tokens);
            tokens.clear();
            tokens.extend(line.split_whitespace());
            if tokens.len() != header.ncols {
                let msg = if tokens.is_empty() {
                    format!(
                        "blank line where atom {} of {natoms} was expected \
                         (atom count on line {count_no})",
                        atom + 1
                    )
                } else {
                    format!(
                        "wrong number of columns: atom line has {} but Properties={} needs {}",
                        tokens.len(),
                        header.spec,
                        header.ncols
                    )
                };
                return Err(self.err(ln, msg));
            }
            let mut col = 0;
            let mut extra = 0;
            for p in &header.properties {
                let toks = &tokens[col..col + p.ncols];
                col += p.ncols;
                match p.role {
                    Role::Species => {
                        let z = atomic_number(toks[0]).ok_or_else(|| {
                            self.err(ln, format!("unknown element symbol `{}`", toks[0]))
                        })?;
                        numbers.push(z);
                    }
                    Role::IgnoredSpecies => {}
                    Role::Z => {
                        let z = toks[0]
                            .parse::<u8>()
                            .ok()
                            .filter(|z| (1..=118).contains(z))
                            .ok_or_else(|| {
                                self.err(
                                    ln,
                                    format!(
                                        "bad atomic number `{}` in column Z: expected an \
                                         integer in 1..=118",
                                        toks[0]
                                    ),
                                )
                            })?;
                        numbers.push(z);
                    }
                    Role::Pos => positions.push(self.vec3(toks, &p.name, atom, ln)?),
                    Role::Forces => {
                        let f = self.vec3(toks, &p.name, atom, ln)?;
                        if let Some(forces) = forces.as_mut() {
                            forces.push(f);
                        }
                    }
                    Role::Extra => {
                        for t in toks {
                            check_token(p.kind, t)
                                .map_err(|m| self.err(ln, format!("column `{}`: {m}", p.name)))?;
                        }
                        if let Some(a) = arrays.get_mut(extra) {
                            a.values.extend(toks.iter().map(|t| (*t).to_owned()));
                        }
                        extra += 1;
                    }
                }
            }
            self.tokens = tokens;
        }

        Ok(Structure {
            numbers,
            positions,
            cell: header.cell,
            pbc: header.pbc,
            energy: header.energy,
            forces,
            info: header.info,
            arrays,
        })
    }

    fn vec3(&self, toks: &[&str], name: &str, atom: usize, ln: usize) -> Result<[f64; 3]> {
        let mut v = [0.0; 3];
        for (x, t) in v.iter_mut().zip(toks) {
            *x = t.parse().map_err(|_| {
                self.err(
                    ln,
                    format!(
                        "cannot parse `{t}` as a number (column `{name}` of atom {})",
                        atom + 1
                    ),
                )
            })?;
        }
        Ok(v)
    }
}

fn parse_bool(t: &str) -> Option<bool> {
    match t {
        "T" | "True" | "true" | "TRUE" => Some(true),
        "F" | "False" | "false" | "FALSE" => Some(false),
        _ => None,
    }
}

/// Checks that a token of an extra column parses as its declared type, as ASE requires.
fn check_token(kind: char, t: &str) -> std::result::Result<(), String> {
    let ok = match kind {
        'R' => t.parse::<f64>().is_ok(),
        'I' => t.parse::<i64>().is_ok(),
        'L' => matches!(t, "T" | "F" | "True" | "False"),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        let what = match kind {
            'R' => "a real number",
            'I' => "an integer",
            _ => "a logical (T or F)",
        };
        Err(format!("cannot parse `{t}` as {what}"))
    }
}

/// Values of an ASE array: tokens separated by whitespace or commas.
fn list_tokens(v: &str) -> impl Iterator<Item = &str> {
    v.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
}

fn parse_header(line: &str) -> std::result::Result<Header, String> {
    let mut cell = None;
    let mut pbc = None;
    let mut energy = None;
    let mut info: Vec<(String, String)> = Vec::new();
    let mut spec = None;

    // A comment line without `=` is plain-XYZ free text.
    let pairs = if line.contains('=') {
        split_key_values(line)?
    } else {
        Vec::new()
    };
    for (key, value) in pairs {
        // A bare key is a flag, `T` as in ASE.
        let value = value.unwrap_or_else(|| "T".to_owned());
        match key.as_str() {
            "Lattice" => {
                let mut c = [[0.0; 3]; 3];
                let mut n = 0;
                for t in list_tokens(&value) {
                    let x: f64 = t
                        .parse()
                        .map_err(|_| format!("cannot parse `{t}` as a number in Lattice"))?;
                    if n < 9 {
                        c[n / 3][n % 3] = x;
                    }
                    n += 1;
                }
                if n != 9 {
                    return Err(format!(
                        "Lattice must have 9 numbers (a, b, c), got {n}: `{value}`"
                    ));
                }
                cell = Some(c);
            }
            "pbc" => {
                let flags: Option<Vec<bool>> = list_tokens(&value).map(parse_bool).collect();
                pbc = Some(match flags.as_deref() {
                    Some(&[p]) => [p; 3],
                    Some(&[a, b, c]) => [a, b, c],
                    _ => {
                        return Err(format!(
                            "pbc must be 3 logicals such as \"T T F\", got `{value}`"
                        ))
                    }
                });
            }
            "Properties" => spec = Some(value),
            "energy" => {
                let e = value
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| format!("cannot parse energy `{value}` as a number"))?;
                energy = Some(e);
            }
            _ => match info.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => info.push((key, value)),
            },
        }
    }
    let pbc = pbc.unwrap_or([cell.is_some(); 3]);
    let spec = spec.unwrap_or_else(|| DEFAULT_PROPERTIES.to_owned());
    let (properties, ncols) = parse_properties(&spec)?;
    Ok(Header {
        cell,
        pbc,
        energy,
        info,
        properties,
        spec,
        ncols,
    })
}

/// Parses `name:type:ncols:...`, assigning each entry its role.
fn parse_properties(spec: &str) -> std::result::Result<(Vec<Property>, usize), String> {
    let bad = |why: String| format!("bad Properties spec `{spec}`: {why}");
    let fields: Vec<&str> = spec.split(':').collect();
    if !fields.len().is_multiple_of(3) {
        return Err(bad(format!(
            "{} fields, expected name:type:ncols triplets",
            fields.len()
        )));
    }
    let mut props: Vec<Property> = Vec::with_capacity(fields.len() / 3);
    for f in fields.chunks_exact(3) {
        let (name, ty, n) = (f[0], f[1], f[2]);
        if name.is_empty() {
            return Err(bad("empty property name".into()));
        }
        let kind = match ty {
            "R" | "I" | "S" | "L" => ty.chars().next().unwrap_or('S'),
            _ => {
                return Err(bad(format!(
                    "type `{ty}` of `{name}` is not one of R, I, S, L"
                )))
            }
        };
        let ncols: usize = n.parse().ok().filter(|&c| c > 0).ok_or_else(|| {
            bad(format!(
                "column count `{n}` of `{name}` is not a positive integer"
            ))
        })?;
        if props.iter().any(|p| p.name == name) {
            return Err(bad(format!("`{name}` appears twice")));
        }
        props.push(Property {
            name: name.to_owned(),
            kind,
            ncols,
            role: Role::Extra,
        });
    }

    let need = |props: &mut Vec<Property>,
                name: &str,
                kind: char,
                ncols: usize,
                role: Role|
     -> std::result::Result<bool, String> {
        match props.iter_mut().find(|p| p.name == name) {
            Some(p) if p.kind == kind && p.ncols == ncols => {
                p.role = role;
                Ok(true)
            }
            Some(p) => Err(bad(format!(
                "`{name}` must be {name}:{kind}:{ncols}, got {}:{}:{}",
                p.name, p.kind, p.ncols
            ))),
            None => Ok(false),
        }
    };
    if !need(&mut props, "pos", 'R', 3, Role::Pos)? {
        return Err(bad("no pos:R:3 column".into()));
    }
    // As ASE: `Z` gives the numbers when present, else `species`.
    if need(&mut props, "Z", 'I', 1, Role::Z)? {
        if let Some(p) = props.iter_mut().find(|p| p.name == "species") {
            p.role = Role::IgnoredSpecies;
        }
    } else if !need(&mut props, "species", 'S', 1, Role::Species)? {
        return Err(bad("no species:S:1 (or Z:I:1) column".into()));
    }
    if !need(&mut props, "forces", 'R', 3, Role::Forces)? {
        need(&mut props, "force", 'R', 3, Role::Forces)?;
    }
    let ncols = props
        .iter()
        .try_fold(0usize, |n, p| n.checked_add(p.ncols))
        .ok_or_else(|| bad("too many columns".into()))?;
    Ok((props, ncols))
}

/// Splits a comment line into `(key, value)` pairs with ASE's rules
/// (`ase.io.extxyz.key_val_str_to_dict`): whitespace separates pairs, `"`, `'`, `{}` and `[]`
/// delimit text that may contain spaces, a backslash escapes the next character, and spaces
/// around `=` are allowed. Keys without `=` get `None`.
fn split_key_values(line: &str) -> std::result::Result<Vec<(String, Option<String>)>, String> {
    // Each pair is its key followed by the parts of its value (split at further `=`).
    let mut pairs: Vec<Vec<String>> = vec![vec![String::new()]];
    // Whether the current part has begun (text, an escape or an opening quote).
    let mut started = false;
    let mut quote: Option<(char, char)> = None;
    let mut escaped = false;

    fn push(pairs: &mut [Vec<String>], ch: char) {
        if let Some(part) = pairs.last_mut().and_then(|p| p.last_mut()) {
            part.push(ch);
        }
    }

    for ch in line.trim().chars() {
        if escaped {
            push(&mut pairs, ch);
            escaped = false;
        } else if ch == '\\' {
            escaped = true;
            started = true;
        } else if let Some((_, close)) = quote {
            if ch == close {
                quote = None;
            } else {
                push(&mut pairs, ch);
            }
        } else {
            match ch {
                '"' | '\'' | '{' | '[' => {
                    let close = match ch {
                        '{' => '}',
                        '[' => ']',
                        c => c,
                    };
                    quote = Some((ch, close));
                    started = true;
                }
                '=' => {
                    // `key = value`: the `=` belongs to the previous key.
                    if !started && pairs.last().is_some_and(|p| p.len() == 1) {
                        pairs.pop();
                    }
                    match pairs.last_mut() {
                        Some(p) => p.push(String::new()),
                        None => return Err("`=` without a key before it".into()),
                    }
                    started = false;
                }
                c if c.is_whitespace() => {
                    if started {
                        pairs.push(vec![String::new()]);
                        started = false;
                    }
                }
                c => {
                    push(&mut pairs, c);
                    started = true;
                }
            }
        }
    }
    if let Some((open, close)) = quote {
        let key = pairs
            .last()
            .and_then(|p| p.first())
            .map(String::as_str)
            .unwrap_or("");
        return Err(format!(
            "unterminated quote: `{open}` in the entry for `{key}` is never closed by `{close}`"
        ));
    }

    let mut out = Vec::with_capacity(pairs.len());
    for mut parts in pairs {
        if parts.is_empty() {
            continue;
        }
        let key = parts.remove(0);
        let value = (!parts.is_empty()).then(|| parts.join("="));
        if key.is_empty() {
            if value.is_some() {
                return Err("empty key before `=`".into());
            }
            continue;
        }
        out.push((key, value));
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// Writing
// ------------------------------------------------------------------------------------------

/// Writes `frames` to `path`, replacing it atomically: the data goes to a temporary file in
/// the same directory, which is renamed over `path` only once everything was written and
/// synced. On any error `path` is left as it was.
pub fn write_extxyz(path: &Path, frames: &[Structure]) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let io_err = |p: &Path, source: io::Error| Error::Io {
        path: p.to_path_buf(),
        source,
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
            source,
        })?;
    }
    w.flush().map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
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
    use super::*;

    #[test]
    fn element_table() {
        assert_eq!(ELEMENTS.len(), 118);
        for (i, s) in ELEMENTS.iter().enumerate() {
            assert_eq!(atomic_number(s), Some(i as u8 + 1), "{s}");
            assert_eq!(symbol(i as u8 + 1), Some(*s));
        }
        assert_eq!(atomic_number("si"), Some(14));
        assert_eq!(atomic_number("SI"), Some(14));
        for bad in ["", "X", "Xx", "Abc", "1", "é", "Q"] {
            assert_eq!(atomic_number(bad), None, "{bad}");
        }
        assert_eq!(symbol(0), None);
        assert_eq!(symbol(119), None);
    }

    fn kv(line: &str) -> Vec<(String, Option<String>)> {
        split_key_values(line).unwrap()
    }

    fn p(k: &str, v: Option<&str>) -> (String, Option<String>) {
        (k.to_owned(), v.map(str::to_owned))
    }

    #[test]
    fn key_values() {
        assert_eq!(
            kv(r#"a=1 b="x y" c={1 2} d=[3, 4] e='q' flag f = g"#),
            vec![
                p("a", Some("1")),
                p("b", Some("x y")),
                p("c", Some("1 2")),
                p("d", Some("3, 4")),
                p("e", Some("q")),
                p("flag", None),
                p("f", Some("g")),
            ]
        );
        assert_eq!(
            kv(r#"s="say \"hi\" \\ ok" t=a=b u="""#),
            vec![
                p("s", Some(r#"say "hi" \ ok"#)),
                p("t", Some("a=b")),
                p("u", Some("")),
            ]
        );
        assert!(split_key_values(r#"a="open"#)
            .unwrap_err()
            .contains("unterminated"));
        assert!(split_key_values("=5").is_err());
        assert!(split_key_values(r#"""=5"#).is_err());
    }

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

    #[test]
    fn properties() {
        let (props, n) = parse_properties("species:S:1:pos:R:3:force:R:3:tags:I:1").unwrap();
        assert_eq!(n, 8);
        let roles: Vec<Role> = props.iter().map(|p| p.role).collect();
        assert_eq!(roles, [Role::Species, Role::Pos, Role::Forces, Role::Extra]);
        let (props, _) = parse_properties("species:S:1:pos:R:3:Z:I:1").unwrap();
        assert_eq!(props[0].role, Role::IgnoredSpecies);
        for bad in [
            "species:S:1:pos:R",
            "species:S:1:pos:R:2",
            "species:S:1:pos:X:3",
            "species:S:1:pos:R:0",
            "species:S:1",
            "pos:R:3",
            "species:S:1:pos:R:3:pos:R:3",
            "species:S:1:pos:R:3:forces:I:3",
        ] {
            assert!(parse_properties(bad).is_err(), "{bad}");
        }
    }
}
