//! Extended XYZ reader and writer: ASE-made fixtures, bitwise round trips, malformed input.
//!
//! Fixtures come from `tests/fixtures/make_fixtures.py` (ASE); each `NAME.expected.json` is
//! what ASE itself reads from `NAME.xyz`.

mod common;

use common::extxyz::{assert_bitwise_eq, bits3, fixture, reparse, to_text};

use std::path::Path;
use std::process::Command;

use mlff_distiller::io::extxyz::{atomic_number, write_extxyz_to};
use mlff_distiller::io::{parse_extxyz_str, read_extxyz, write_extxyz};
use mlff_distiller::structure::ExtraArray;
use mlff_distiller::{Error, Structure};
use serde_json::Value;

const FIXTURES: [&str; 3] = ["molecules", "triclinic", "orthorhombic"];

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
