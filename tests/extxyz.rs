//! Extended XYZ reader and writer: ASE-made fixtures, bitwise round trips, malformed input.
//!
//! Fixtures come from `tests/fixtures/make_fixtures.py` (ASE); each `NAME.expected.json` is
//! what ASE itself reads from `NAME.xyz`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use mlff_distiller::io::extxyz::{atomic_number, write_extxyz_to};
use mlff_distiller::io::{parse_extxyz_str, read_extxyz, write_extxyz};
use mlff_distiller::structure::ExtraArray;
use mlff_distiller::{Error, Structure};
use proptest::prelude::*;
use serde_json::Value;

const FIXTURES: [&str; 3] = ["molecules", "triclinic", "orthorhombic"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn expected(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture(&format!("{name}.expected.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 1e-12, "{what}: {a} vs {b}");
}

fn close_rows(ours: &[[f64; 3]], want: &Value, what: &str) {
    let want = want.as_array().unwrap();
    assert_eq!(ours.len(), want.len(), "{what}: row count");
    for (i, (o, w)) in ours.iter().zip(want).enumerate() {
        for k in 0..3 {
            close(o[k], f(&w[k]), &format!("{what}[{i}][{k}]"));
        }
    }
}

fn flat_numbers(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| flat_numbers(x, out)),
        x => out.push(f(x)),
    }
}

/// Compares one of our frames with ASE's reading of the same frame.
fn check_against_ase(s: &Structure, want: &Value, what: &str) {
    let numbers: Vec<u8> = want["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_u64().unwrap() as u8)
        .collect();
    assert_eq!(s.numbers, numbers, "{what}: numbers");
    close_rows(
        &s.positions,
        &want["positions"],
        &format!("{what}: positions"),
    );
    match (&s.cell, &want["cell"]) {
        (None, Value::Null) => {}
        (Some(c), w @ Value::Array(_)) => close_rows(c, w, &format!("{what}: cell")),
        (c, w) => panic!("{what}: cell {c:?} vs ASE {w}"),
    }
    let pbc: Vec<bool> = want["pbc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    assert_eq!(s.pbc.to_vec(), pbc, "{what}: pbc");
    match (s.energy, &want["energy"]) {
        (None, Value::Null) => {}
        (Some(e), w) => close(e, f(w), &format!("{what}: energy")),
        (e, w) => panic!("{what}: energy {e:?} vs ASE {w}"),
    }
    match (&s.forces, &want["forces"]) {
        (None, Value::Null) => {}
        (Some(fs), w @ Value::Array(_)) => close_rows(fs, w, &format!("{what}: forces")),
        (fs, w) => panic!("{what}: forces {fs:?} vs ASE {w}"),
    }
    let info = |k: &str| {
        s.info
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{what}: info has no `{k}`: {:?}", s.info))
    };
    if let Value::Array(voigt) = &want["stress"] {
        // ASE turns the 3x3 `stress` of the comment line into Voigt order xx yy zz yz xz xy.
        let m: Vec<f64> = info("stress")
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(m.len(), 9);
        for (k, idx) in [0, 4, 8, 5, 2, 1].into_iter().enumerate() {
            close(m[idx], f(&voigt[k]), &format!("{what}: stress[{k}]"));
        }
    }
    for (k, v) in want["info"].as_object().unwrap() {
        let ours = info(k);
        match v {
            Value::String(w) => assert_eq!(ours, w, "{what}: info {k}"),
            Value::Number(_) => close(ours.parse().unwrap(), f(v), &format!("{what}: info {k}")),
            other => panic!("{what}: unexpected info value {other}"),
        }
    }
    let want_arrays = want["arrays"].as_object().unwrap();
    assert_eq!(
        s.arrays.len(),
        want_arrays.len(),
        "{what}: arrays {:?} vs ASE {:?}",
        s.arrays.iter().map(|a| &a.name).collect::<Vec<_>>(),
        want_arrays.keys().collect::<Vec<_>>()
    );
    for (name, w) in want_arrays {
        let a = s
            .arrays
            .iter()
            .find(|a| a.name == *name)
            .unwrap_or_else(|| panic!("{what}: no array `{name}`"));
        let mut wv = Vec::new();
        flat_numbers(w, &mut wv);
        assert_eq!(a.values.len(), wv.len(), "{what}: array {name} length");
        assert_eq!(a.values.len(), a.ncols * s.len());
        for (t, w) in a.values.iter().zip(wv) {
            close(t.parse().unwrap(), w, &format!("{what}: array {name}"));
        }
    }
}

#[test]
fn ase_fixtures_match_what_ase_reads() {
    for name in FIXTURES {
        let frames = read_extxyz(&fixture(&format!("{name}.xyz"))).unwrap();
        let want = expected(name);
        assert_eq!(frames.len(), want.len(), "{name}: frame count");
        for (k, (s, w)) in frames.iter().zip(&want).enumerate() {
            check_against_ase(s, w, &format!("{name} frame {k}"));
        }
    }
}

#[test]
fn fixture_details() {
    let mol = read_extxyz(&fixture("molecules.xyz")).unwrap();
    assert_eq!(
        mol.iter().map(Structure::len).collect::<Vec<_>>(),
        [3, 9, 3]
    );
    for s in &mol {
        assert_eq!(s.cell, None);
        assert_eq!(s.pbc, [false; 3]);
        assert!(s.energy.is_some() && s.forces.is_some());
        assert!(s.arrays.is_empty());
        assert!(s.info.iter().all(|(k, _)| k != "energy" && k != "pbc"));
        s.validate().unwrap();
    }
    assert_eq!(mol[0].numbers, [8, 1, 1]);
    assert!(mol[1]
        .info
        .contains(&("comment".into(), "ethanol, gas phase".into())));
    assert_eq!(mol[2].info[0], ("config_type".into(), "md".into()));

    let tri = &read_extxyz(&fixture("triclinic.xyz")).unwrap()[0];
    assert_eq!(tri.pbc, [true, true, false]);
    let cols: Vec<(&str, char, usize)> = tri
        .arrays
        .iter()
        .map(|a| (a.name.as_str(), a.kind, a.ncols))
        .collect();
    assert_eq!(
        cols,
        [("tags", 'I', 1), ("momenta", 'R', 3), ("masses", 'R', 1)]
    );
    assert_eq!(tri.arrays[0].values, ["0", "1", "1", "2", "0", "3"]);
    assert!(tri.info.iter().any(|(k, _)| k == "stress"));

    let ortho = &read_extxyz(&fixture("orthorhombic.xyz")).unwrap()[0];
    assert_eq!(ortho.pbc, [true; 3]);
    assert_eq!(ortho.energy, None);
    assert_eq!(ortho.forces, None);
    assert!(ortho.info.is_empty() && ortho.arrays.is_empty());
}

// ---------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------

fn bits3(v: &[[f64; 3]]) -> Vec<[u64; 3]> {
    v.iter().map(|r| r.map(f64::to_bits)).collect()
}

/// Equality that also tells -0.0 from 0.0 and compares NaNs by bits.
fn assert_bitwise_eq(a: &Structure, b: &Structure) {
    assert_eq!(a.numbers, b.numbers);
    assert_eq!(bits3(&a.positions), bits3(&b.positions));
    assert_eq!(a.cell.map(|c| bits3(&c)), b.cell.map(|c| bits3(&c)), "cell");
    assert_eq!(a.pbc, b.pbc);
    assert_eq!(a.energy.map(f64::to_bits), b.energy.map(f64::to_bits));
    assert_eq!(
        a.forces.as_deref().map(bits3),
        b.forces.as_deref().map(bits3)
    );
    assert_eq!(a.info, b.info);
    assert_eq!(a.arrays, b.arrays);
}

fn to_text(frames: &[Structure]) -> String {
    let mut out = Vec::new();
    write_extxyz_to(&mut out, frames).unwrap();
    String::from_utf8(out).unwrap()
}

fn reparse(frames: &[Structure]) -> Vec<Structure> {
    parse_extxyz_str(&to_text(frames), Path::new("<mem>")).unwrap()
}

#[test]
fn fixtures_round_trip_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let frames = read_extxyz(&fixture(&format!("{name}.xyz"))).unwrap();
        let path = dir.path().join(format!("{name}.xyz"));
        write_extxyz(&path, &frames).unwrap();
        let back = read_extxyz(&path).unwrap();
        assert_eq!(frames.len(), back.len());
        for (a, b) in frames.iter().zip(&back) {
            assert_bitwise_eq(a, b);
        }
        // Writing what we read gives the same text again.
        assert_eq!(
            to_text(&back),
            std::fs::read_to_string(&path).unwrap(),
            "{name}"
        );
    }
}

/// A structure exercising awkward floats, info strings and every column type.
fn tricky() -> Structure {
    let positions = vec![
        [0.1 + 0.2, -0.0, 1e-300],
        [f64::MIN_POSITIVE, 5e-324, 123_456_789.123_456_79],
        [-1.0 / 3.0, 1e22, 2.0f64.sqrt()],
    ];
    Structure {
        numbers: vec![1, 118, 26],
        positions,
        cell: Some([
            [10.000000000000002, 0.0, -0.0],
            [1.0 / 7.0, 9.5, 1e-17],
            [0.25, -3.75, 1e17],
        ]),
        pbc: [true, false, true],
        energy: Some(-1234.5678901234567),
        forces: Some(vec![
            [1e-7, -2.5e-8, 3.0],
            [f64::MAX, -f64::MAX, 0.30000000000000004],
            [f64::INFINITY, f64::NEG_INFINITY, -1e-310],
        ]),
        info: vec![
            ("config_type".into(), "md".into()),
            ("comment".into(), "two words here".into()),
            ("quoted".into(), r#"say "hi" \ ok"#.into()),
            ("eq".into(), "a=b".into()),
            ("braces".into(), "{x} [y]".into()),
            ("apostrophe".into(), "it's".into()),
            ("REF_energy".into(), "-1.5".into()),
            ("flag".into(), "T".into()),
            ("stress".into(), "1 2 3 2 5 6 3 6 9".into()),
        ],
        arrays: vec![
            ExtraArray {
                name: "tags".into(),
                kind: 'I',
                ncols: 1,
                values: vec!["0".into(), "-7".into(), "12".into()],
            },
            ExtraArray {
                name: "momenta".into(),
                kind: 'R',
                ncols: 3,
                values: (0..9).map(|i| format!("{}", i as f64 * 0.1)).collect(),
            },
            ExtraArray {
                name: "label".into(),
                kind: 'S',
                ncols: 1,
                values: vec!["a".into(), "b_c".into(), "Dé".into()],
            },
            ExtraArray {
                name: "move_mask".into(),
                kind: 'L',
                ncols: 1,
                values: vec!["T".into(), "F".into(), "T".into()],
            },
        ],
    }
}

#[test]
fn tricky_values_round_trip_bitwise() {
    let s = tricky();
    let water = Structure::molecule(
        vec![8, 1, 1],
        vec![[0.0; 3], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]],
    );
    let back = reparse(&[s.clone(), water.clone()]);
    assert_eq!(back.len(), 2);
    assert_bitwise_eq(&back[0], &s);
    assert_bitwise_eq(&back[1], &water);
    // An empty info value round-trips through our reader.
    let mut e = water.clone();
    e.info.push(("empty".into(), String::new()));
    e.info.push(("after".into(), "1".into()));
    assert_bitwise_eq(&reparse(&[e.clone()])[0], &e);
}

#[test]
fn writer_format() {
    let mut s = Structure::molecule(vec![8, 1], vec![[0.0, 0.0, 0.1], [0.0, 0.75, -0.5]]);
    s.energy = Some(-1.0);
    s.info.push(("config_type".into(), "gas phase".into()));
    let text = to_text(&[s]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "2");
    assert_eq!(
        lines[1],
        r#"Properties=species:S:1:pos:R:3 energy=-1.0 config_type="gas phase" pbc="F F F""#
    );
    assert_eq!(lines[2], "O  0.0 0.0 0.1");

    let t = tricky();
    let text = to_text(&[t]);
    let comment = text.lines().nth(1).unwrap();
    assert!(
        comment.starts_with("Lattice=\"10.000000000000002 0.0 -0.0 "),
        "{comment}"
    );
    assert!(comment.contains(
        " Properties=species:S:1:pos:R:3:forces:R:3:tags:I:1:momenta:R:3:label:S:1:move_mask:L:1 energy=-1234.5678901234567 "
    ), "{comment}");
    assert!(comment.ends_with(r#" pbc="T F T""#), "{comment}");
}

#[test]
fn write_frame_by_frame() {
    let a = Structure::molecule(vec![1], vec![[0.0; 3]]);
    let b = Structure::molecule(vec![2, 3], vec![[1.0; 3], [2.0; 3]]);
    let mut out: Vec<u8> = Vec::new();
    write_extxyz_to(&mut out, std::slice::from_ref(&a)).unwrap();
    write_extxyz_to(&mut out, std::slice::from_ref(&b)).unwrap();
    let back = parse_extxyz_str(std::str::from_utf8(&out).unwrap(), Path::new("x")).unwrap();
    assert_eq!(back, vec![a, b]);
}

#[test]
fn writer_rejects_bad_structures_and_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.xyz");
    let good = Structure::molecule(vec![1], vec![[0.0; 3]]);
    write_extxyz(&path, std::slice::from_ref(&good)).unwrap();
    let before = std::fs::read(&path).unwrap();

    let mut bads = Vec::new();
    let mut s = good.clone();
    s.positions.push([1.0; 3]);
    bads.push((s, "positions"));
    let mut s = good.clone();
    s.forces = Some(vec![]);
    bads.push((s, "force rows"));
    let mut s = good.clone();
    s.numbers[0] = 0;
    bads.push((s, "atomic number 0"));
    let mut s = good.clone();
    s.info.push(("energy".into(), "1".into()));
    bads.push((s, "energy"));
    let mut s = good.clone();
    s.info.push(("k".into(), "two\nlines".into()));
    bads.push((s, "line break"));
    let mut s = good.clone();
    s.info.push(("k".into(), "1".into()));
    s.info.push(("k".into(), "2".into()));
    bads.push((s, "twice"));
    for (name, kind, values, why) in [
        ("pos", 'R', vec!["1"; 1], "structure field"),
        ("force", 'R', vec!["1"; 3], "structure field"),
        ("a:b", 'R', vec!["1"; 1], "not allowed"),
        ("x", 'Q', vec!["1"; 1], "type"),
        ("x", 'R', vec!["1"; 2], "values"),
        ("x", 'R', vec!["one"; 1], "`one`"),
        ("x", 'S', vec!["a b"; 1], "whitespace"),
        ("x", 'I', vec!["1.5"; 1], "`1.5`"),
    ] {
        let mut s = good.clone();
        let ncols = if name == "force" { 3 } else { 1 };
        s.arrays.push(ExtraArray {
            name: name.into(),
            kind,
            ncols,
            values: values.into_iter().map(String::from).collect(),
        });
        bads.push((s, why));
    }
    for (bad, why) in bads {
        let err = write_extxyz(&path, &[good.clone(), bad.clone()]).unwrap_err();
        match &err {
            Error::Structure(msg) => {
                assert!(msg.starts_with("frame 1: "), "{msg}");
                assert!(msg.contains(why), "`{msg}` should mention `{why}`");
            }
            e => panic!("expected Error::Structure, got {e:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), before, "old file lost");
    }
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["data.xyz"]);

    // Unwritable destination: an I/O error naming the path.
    let missing = dir.path().join("no/such/dir/out.xyz");
    assert!(matches!(
        write_extxyz(&missing, &[good]),
        Err(Error::Io { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// Reader features
// ---------------------------------------------------------------------------------------

fn parse(text: &str) -> Vec<Structure> {
    parse_extxyz_str(text, Path::new("test.xyz")).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn free_text_comment_is_plain_xyz() {
    for comment in [
        "water molecule, it's from \"somewhere\" {",
        "",
        "   ",
        "Generated by some program v1.2",
    ] {
        let s = &parse(&format!(
            "3\n{comment}\nO 0.0 0.0 0.1\nH 0.0 0.75 -0.5\nh 0.0 -0.75 -0.5\n"
        ))[0];
        assert_eq!(s.numbers, [8, 1, 1], "{comment}");
        assert_eq!(s.positions[1], [0.0, 0.75, -0.5]);
        assert_eq!(s.cell, None);
        assert_eq!(s.pbc, [false; 3]);
        assert!(s.info.is_empty() && s.arrays.is_empty() && s.energy.is_none());
    }
}

#[test]
fn extra_columns_are_preserved_in_any_order() {
    let text = "2\n\
        Properties=pos:R:3:magmoms:R:1:species:S:1:force:R:3:label:S:1:fixed:L:1:tags:I:1 \
        pbc=\"T T T\" Lattice=\"3 0 0 0 3 0 0 0 3\"\n\
        0 0 0  0.5  Fe 0.1 0.2 0.3  a_1 T  7\n\
        1.5 1.5 1.5  -0.5  fe -0.1 -0.2 -0.3  b F -2\n";
    let s = &parse(text)[0];
    assert_eq!(s.numbers, [26, 26]);
    assert_eq!(s.positions[1], [1.5; 3]);
    assert_eq!(
        s.forces.as_deref(),
        Some(&[[0.1, 0.2, 0.3], [-0.1, -0.2, -0.3]][..])
    );
    let arr = |name: &str| s.arrays.iter().find(|a| a.name == name).unwrap();
    assert_eq!(s.arrays.len(), 4);
    assert_eq!(arr("magmoms").values, ["0.5", "-0.5"]);
    assert_eq!(arr("label").values, ["a_1", "b"]);
    assert_eq!(
        (arr("fixed").kind, arr("fixed").values.clone()),
        ('L', vec!["T".to_string(), "F".into()])
    );
    assert_eq!(arr("tags").values, ["7", "-2"]);
    assert_bitwise_eq(&reparse(std::slice::from_ref(s))[0], s);
}

#[test]
fn comment_line_syntax() {
    // Braces and brackets, commas, spaces around `=`, bare flags, escapes, Z column,
    // Lattice without pbc (periodic in all directions, as ASE), case-sensitive keys.
    let text = "1\n\
        Lattice={1, 0, 0, 0, 2, 0, 0, 0, 3} Properties = [Z:I:1:pos:R:3] is_relaxed \
        Energy=4 REF_energy=-2.5 free_energy=-2.6 note='a \"b\"' path=C:\\\\dir energy = -3\n\
        6 0.5 0.5 0.5\n";
    let s = &parse(text)[0];
    assert_eq!(s.numbers, [6]);
    assert_eq!(
        s.cell,
        Some([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    );
    assert_eq!(s.pbc, [true; 3]);
    assert_eq!(s.energy, Some(-3.0));
    let info: Vec<(&str, &str)> = s
        .info
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        info,
        [
            ("is_relaxed", "T"),
            ("Energy", "4"),
            ("REF_energy", "-2.5"),
            ("free_energy", "-2.6"),
            ("note", "a \"b\""),
            ("path", "C:\\dir"),
        ]
    );
    assert_bitwise_eq(&reparse(std::slice::from_ref(s))[0], s);

    // pbc given as one flag, duplicates: the last one wins (a dict in ASE).
    let s = &parse("1\nLattice=\"1 0 0 0 1 0 0 0 1\" pbc=F a=1 a=2\nH 0 0 0\n")[0];
    assert_eq!(s.pbc, [false; 3]);
    assert_eq!(s.info, [("a".to_string(), "2".to_string())]);
    // Both species and Z: Z wins, as in ASE.
    let s = &parse("1\nProperties=species:S:1:pos:R:3:Z:I:1\nXx 0 0 0 8\n")[0];
    assert_eq!(s.numbers, [8]);
    assert!(s.arrays.is_empty());
}

#[test]
fn whitespace_tolerance() {
    let frame = "2\nProperties=species:S:1:pos:R:3\n  H\t0 0 0  \nH 1 0 0\n";
    let crlf = frame.replace('\n', "\r\n");
    for text in [
        format!("{frame}{frame}"),
        format!("{frame}{frame}\n\n  \n"),
        format!("{crlf}{crlf}\r\n"),
        format!("{frame}{}", frame.trim_end()),
    ] {
        let frames = parse(&text);
        assert_eq!(frames.len(), 2, "{text:?}");
        assert_eq!(frames[1].positions[1], [1.0, 0.0, 0.0]);
    }
    assert!(parse("").is_empty());
    assert!(parse("\n\n").is_empty());
    // Zero atoms is a valid frame.
    let s = &parse("0\nconfig_type=empty\n")[0];
    assert!(s.is_empty());
}

/// A UTF-8 byte-order mark before the first atom count (as some editors write) is skipped, in
/// text and in bytes read from a file.
#[test]
fn a_byte_order_mark_is_skipped() {
    let plain = parse(GOOD);
    assert_eq!(parse(&format!("\u{feff}{GOOD}")), plain);
    let bytes = [b"\xEF\xBB\xBF".as_slice(), GOOD.as_bytes()].concat();
    let read = mlff_distiller::io::parse_extxyz_bytes(&bytes, Path::new("bom.xyz")).unwrap();
    assert_eq!(read, plain);
}

// ---------------------------------------------------------------------------------------
// Malformed input
// ---------------------------------------------------------------------------------------

const GOOD: &str = "2\nProperties=species:S:1:pos:R:3 energy=1.0\nH 0 0 0\nH 0 0 0.74\n";

/// (text, frame, line, words the message must contain)
#[rustfmt::skip]
fn malformed_cases() -> Vec<(String, usize, usize, &'static str)> {
    let one = |comment: &str, atom: &str| format!("1\n{comment}\n{atom}\n");
    vec![
        ("abc\n\nH 0 0 0\n".into(), 0, 1, "bad atom count `abc`"),
        ("-1\n\n".into(), 0, 1, "bad atom count `-1`"),
        ("2 atoms\n\n".into(), 0, 1, "bad atom count"),
        (format!("{GOOD}1.5\n"), 1, 5, "bad atom count `1.5`"),
        ("2\n".into(), 0, 2, "comment line is missing"),
        (
            "3\nProperties=species:S:1:pos:R:3\nH 0 0 0\nH 1 0 0\n".into(),
            0,
            5,
            "file ended after 2 of 3 atoms",
        ),
        (format!("{GOOD}3\n\nO 0 0 0\n"), 1, 8, "file ended after 1 of 3 atoms"),
        (
            "3\n\nH 0 0 0\nH 1 0 0\n\nH 2 0 0\n".into(),
            0,
            5,
            "blank line where atom 2 (counted from 0) of 3",
        ),
        ("2\n\nH 0 0 0\nH 1 0\n".into(), 0, 4, "wrong number of columns: atom line has 3 but Properties=species:S:1:pos:R:3 needs 4"),
        (one("", "H 0 0 0 1"), 0, 3, "wrong number of columns"),
        (one("", "0 0 0"), 0, 3, "wrong number of columns"),
        (one("", "H 0 x1.5 0"), 0, 3, "cannot parse `x1.5` as a number (column `pos` of atom 0)"),
        (format!("{GOOD}{}", one("Properties=species:S:1:pos:R:3:forces:R:3", "H 0 0 0 0 1,0 0")), 1, 7, "`1,0`"),
        (one("", "Qq 0 0 0"), 0, 3, "unknown element symbol `Qq`"),
        (one("", "X 0 0 0"), 0, 3, "unknown element symbol `X`"),
        (one("Properties=Z:I:1:pos:R:3", "0 0 0 0"), 0, 3, "bad atomic number `0`"),
        (one("Properties=Z:I:1:pos:R:3", "O 0 0 0"), 0, 3, "bad atomic number `O`"),
        (one("Properties=species:S:1:pos:R:3:tags:I:1", "H 0 0 0 1.5"), 0, 3, "column `tags`: cannot parse `1.5` as an integer"),
        (one("Properties=species:S:1:pos:R:3:m:R:1", "H 0 0 0 x"), 0, 3, "column `m`"),
        (one("Properties=species:S:1:pos:R:3:fix:L:1", "H 0 0 0 yes"), 0, 3, "`yes`"),
        (one(r#"Lattice="1 0 0 0 1 0 0 0""#, "H 0 0 0"), 0, 2, "Lattice must have 9 numbers (a, b, c), got 8"),
        (one(r#"Lattice="1 0 0 0 1 0 0 0 1 0""#, "H 0 0 0"), 0, 2, "got 10"),
        (one(r#"Lattice="1 0 0 0 one 0 0 0 1""#, "H 0 0 0"), 0, 2, "`one` as a number in Lattice"),
        (one("Lattice pbc=T", "H 0 0 0"), 0, 2, "cannot parse `T` as a number in Lattice"),
        (one(r#"Lattice="1 0 0 0 1 0 0 0 1"#, "H 0 0 0"), 0, 2, "unterminated quote"),
        (one("a=1 b={1 2", "H 0 0 0"), 0, 2, "unterminated quote: `{` in the entry for `b`"),
        (one("Properties=species:S:1:pos:R", "H 0 0 0"), 0, 2, "bad Properties spec `species:S:1:pos:R`"),
        (one("Properties=species:S:1:pos:R:2", "H 0 0"), 0, 2, "`pos` must be pos:R:3"),
        (one("Properties=species:S:1:pos:X:3", "H 0 0 0"), 0, 2, "type `X`"),
        (one("Properties=species:S:1:pos:R:three", "H 0 0 0"), 0, 2, "column count `three`"),
        (one("Properties=species:S:1:tags:I:1", "H 0"), 0, 2, "no pos:R:3"),
        (one("Properties=pos:R:3", "0 0 0"), 0, 2, "no species:S:1"),
        (one("Properties=species:S:1:pos:R:3:pos:R:3", "H 0 0 0 0 0 0"), 0, 2, "twice"),
        (one("Properties=species:S:1:pos:R:3:a:R:18446744073709551615", "H 0 0 0"), 0, 2, "too many columns"),
        (one(r#"pbc="T T""#, "H 0 0 0"), 0, 2, "pbc must be 3 logicals"),
        (one("pbc=yes", "H 0 0 0"), 0, 2, "pbc"),
        (one("energy=high", "H 0 0 0"), 0, 2, "cannot parse energy `high`"),
        (one("=5", "H 0 0 0"), 0, 2, "without a key"),
        (format!("{GOOD}\n{GOOD}"), 1, 5, "blank line where the atom count of frame 1 was expected, but more data follows on line 6"),
    ]
}

#[test]
fn malformed_input_names_line_and_cause() {
    for (text, frame, line, words) in malformed_cases() {
        let err = parse_extxyz_str(&text, Path::new("bad.xyz")).unwrap_err();
        match &err {
            Error::Xyz {
                path,
                frame: f,
                line: l,
                msg,
            } => {
                assert_eq!(path, Path::new("bad.xyz"));
                assert_eq!(
                    (*f, *l),
                    (frame, line),
                    "frame/line of `{msg}` for {text:?}"
                );
                assert!(msg.contains(words), "`{msg}` should contain `{words}`");
            }
            e => panic!("expected Error::Xyz, got {e:?} for {text:?}"),
        }
        let shown = err.to_string();
        assert!(
            shown.starts_with(&format!("bad.xyz: frame {frame}, line {line}: ")),
            "{shown}"
        );
    }
}

#[test]
fn file_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.xyz");
    assert!(matches!(read_extxyz(&missing), Err(Error::Io { path, .. }) if path == missing));

    let path = dir.path().join("latin1.xyz");
    let mut bytes = GOOD.as_bytes().to_vec();
    bytes.extend_from_slice(b"1\ncomment=caf\xe9\nH 0 0 0\n");
    std::fs::write(&path, bytes).unwrap();
    match read_extxyz(&path).unwrap_err() {
        Error::Xyz {
            frame, line, msg, ..
        } => {
            assert_eq!((frame, line), (1, 6));
            assert!(msg.contains("UTF-8"), "{msg}");
        }
        e => panic!("{e:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary text never panics.
    #[test]
    fn never_panics_on_arbitrary_text(text in "(\\PC|\n|\t| |=|\"|\\\\|:){0,200}") {
        let _ = parse_extxyz_str(&text, Path::new("fuzz"));
    }

    /// Nor does a valid file with one character replaced or cut short.
    #[test]
    fn never_panics_on_damaged_files(pos in 0usize..2000, ch in prop::char::any(), cut in any::<bool>()) {
        let text = std::fs::read_to_string(fixture("triclinic.xyz")).unwrap();
        let chars: Vec<char> = text.chars().collect();
        let pos = pos % chars.len();
        let damaged: String = if cut {
            chars[..pos].iter().collect()
        } else {
            chars.iter().enumerate().map(|(i, &c)| if i == pos { ch } else { c }).collect()
        };
        if let Err(e) = parse_extxyz_str(&damaged, Path::new("fuzz")) {
            prop_assert!(matches!(e, Error::Xyz { .. }), "{e:?}");
        }
    }

    /// Any non-NaN coordinates and any printable info text survive a write and read.
    #[test]
    fn random_structures_round_trip(
        atoms in prop::collection::vec(
            (1u8..=118, prop::array::uniform3(any::<f64>().prop_filter("NaN", |x| !x.is_nan()))),
            0..6,
        ),
        cell in prop::option::of(prop::array::uniform3(prop::array::uniform3(-1e3f64..1e3))),
        pbc in prop::array::uniform3(any::<bool>()),
        energy in prop::option::of(any::<f64>().prop_filter("NaN", |x| !x.is_nan())),
        info in prop::collection::vec(("[A-Za-z_][A-Za-z0-9_]{0,6}", "[^\n\r]{0,12}"), 0..4),
    ) {
        let mut s = Structure {
            numbers: atoms.iter().map(|a| a.0).collect(),
            positions: atoms.iter().map(|a| a.1).collect(),
            cell,
            pbc,
            energy,
            ..Default::default()
        };
        s.forces = Some(s.positions.iter().map(|p| p.map(|x| -x)).collect());
        for (k, v) in info {
            if !["Lattice", "pbc", "Properties", "energy"].contains(&k.as_str())
                && !s.info.iter().any(|(key, _)| *key == k)
            {
                s.info.push((k, v));
            }
        }
        let back = reparse(std::slice::from_ref(&s));
        prop_assert_eq!(back.len(), 1);
        assert_bitwise_eq(&back[0], &s);
    }
}

// ---------------------------------------------------------------------------------------
// ASE reads our output (skipped when python3 with ase is not installed)
// ---------------------------------------------------------------------------------------

/// What ASE reads from `path`, floats as hex bit strings.
fn ase_dump_bits(path: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(fixture("ase_dump.py"))
        .arg(path)
        .arg("--bits")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ase_dump.py {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn hex_bits(v: &Value) -> u64 {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("not a bit string: {v}"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

fn rows_bits(v: &Value) -> Vec<[u64; 3]> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| [hex_bits(&r[0]), hex_bits(&r[1]), hex_bits(&r[2])])
        .collect()
}

#[test]
fn ase_reads_our_output_identically() {
    if !common::ase_available() {
        eprintln!("skipping ase_reads_our_output_identically: python3 with ase not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Fixtures: ASE reads our rewrite exactly as it reads its own file.
    for name in FIXTURES {
        let original = fixture(&format!("{name}.xyz"));
        let ours = dir.path().join(format!("{name}.xyz"));
        write_extxyz(&ours, &read_extxyz(&original).unwrap()).unwrap();
        assert_eq!(ase_dump_bits(&ours), ase_dump_bits(&original), "{name}");
    }
    // Full-precision values: ASE gets the very same bits.
    let s = tricky();
    let path = dir.path().join("tricky.xyz");
    write_extxyz(&path, std::slice::from_ref(&s)).unwrap();
    let ase = &ase_dump_bits(&path)[0];
    let numbers: Vec<u64> = ase["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_u64().unwrap())
        .collect();
    assert_eq!(
        numbers,
        s.numbers.iter().map(|&z| u64::from(z)).collect::<Vec<_>>()
    );
    assert_eq!(rows_bits(&ase["positions"]), bits3(&s.positions));
    assert_eq!(rows_bits(&ase["cell"]), bits3(&s.cell.unwrap()));
    assert_eq!(ase["pbc"], serde_json::json!([true, false, true]));
    assert_eq!(hex_bits(&ase["energy"]), s.energy.unwrap().to_bits());
    assert_eq!(rows_bits(&ase["forces"]), bits3(s.forces.as_ref().unwrap()));
    for key in [
        "config_type",
        "comment",
        "quoted",
        "eq",
        "braces",
        "apostrophe",
    ] {
        let ours = &s.info.iter().find(|(k, _)| k == key).unwrap().1;
        assert_eq!(ase["info"][key].as_str(), Some(ours.as_str()), "info {key}");
    }
    assert_eq!(ase["info"]["flag"], Value::Bool(true));
    assert_eq!(ase["arrays"]["tags"], serde_json::json!([0, -7, 12]));
    assert_eq!(
        ase["arrays"]["label"],
        serde_json::json!(["a", "b_c", "Dé"])
    );
    assert_eq!(ase["arrays"]["momenta"].as_array().unwrap().len(), 3);
    assert!(atomic_number("Og") == Some(118));
}
