//! The comment line's grammar: ASE's `key=value` pairs (quotes, escapes, flags) and the
//! `Properties` spec that gives each atom-line column its role.

use crate::structure::Lattice;

/// The role of one `Properties` entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Role {
    Species,
    /// Species column when a `Z` column gives the numbers (ASE then ignores the symbols).
    IgnoredSpecies,
    Z,
    Pos,
    Forces,
    Extra,
}

#[derive(Debug)]
pub(super) struct Property {
    pub(super) name: String,
    pub(super) kind: char,
    pub(super) ncols: usize,
    pub(super) role: Role,
}

/// What the comment line says about a frame.
#[derive(Debug)]
pub(super) struct Header {
    pub(super) cell: Option<Lattice>,
    pub(super) pbc: [bool; 3],
    pub(super) energy: Option<f64>,
    pub(super) info: Vec<(String, String)>,
    pub(super) properties: Vec<Property>,
    /// The `Properties` value, for messages.
    pub(super) spec: String,
    /// Total number of columns on an atom line.
    pub(super) ncols: usize,
}

const DEFAULT_PROPERTIES: &str = "species:S:1:pos:R:3";

fn parse_bool(t: &str) -> Option<bool> {
    match t {
        "T" | "True" | "true" | "TRUE" => Some(true),
        "F" | "False" | "false" | "FALSE" => Some(false),
        _ => None,
    }
}

/// Checks that a token of an extra column parses as its declared type, as ASE requires.
pub(super) fn check_token(kind: char, t: &str) -> std::result::Result<(), String> {
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

pub(super) fn parse_header(line: &str) -> std::result::Result<Header, String> {
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
pub(super) fn split_key_values(
    line: &str,
) -> std::result::Result<Vec<(String, Option<String>)>, String> {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::io::extxyz) fn kv(line: &str) -> Vec<(String, Option<String>)> {
        split_key_values(line).unwrap()
    }

    pub(in crate::io::extxyz) fn p(k: &str, v: Option<&str>) -> (String, Option<String>) {
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
