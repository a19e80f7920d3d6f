//! Reading extended XYZ: frames from a file, bytes or text, with errors naming the frame and line.

use std::fs;
use std::path::Path;

use super::elements::atomic_number;
use super::grammar::{check_token, parse_header, Role};
use crate::error::{Error, Result};
use crate::structure::{ExtraArray, Structure};

/// Reads every frame of an extended XYZ file.
pub fn read_extxyz(path: &Path) -> Result<Vec<Structure>> {
    let bytes = fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        cause: source,
    })?;
    parse_extxyz_bytes(&bytes, path)
}

/// Parses the bytes of an extended XYZ file (already read, e.g. to hash them too);
/// `path_for_errors` only labels errors.
pub fn parse_extxyz_bytes(bytes: &[u8], path_for_errors: &Path) -> Result<Vec<Structure>> {
    // A UTF-8 byte-order mark (editors on Windows write one) is not part of the atom count.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
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
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    Parser::new(text, path_for_errors, None).run()
}

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
                        "blank line where atom {atom} (counted from 0) of {natoms} was \
                         expected (atom count on line {count_no})"
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
                    format!("cannot parse `{t}` as a number (column `{name}` of atom {atom})"),
                )
            })?;
        }
        Ok(v)
    }
}
