//! Helpers of the extended XYZ tests (tests/extxyz.rs, tests/extxyz_reader.rs).

use mlff_distiller::io::extxyz::write_extxyz_to;
use mlff_distiller::io::parse_extxyz_str;
use mlff_distiller::Structure;
use std::path::{Path, PathBuf};

/// A valid two-atom file.
pub const GOOD: &str = "2\nProperties=species:S:1:pos:R:3 energy=1.0\nH 0 0 0\nH 0 0 0.74\n";

/// A file of tests/fixtures.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Each coordinate as its bits.
pub fn bits3(v: &[[f64; 3]]) -> Vec<[u64; 3]> {
    v.iter().map(|r| r.map(f64::to_bits)).collect()
}

/// Equality that also tells -0.0 from 0.0 and compares NaNs by bits.
pub fn assert_bitwise_eq(a: &Structure, b: &Structure) {
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

/// `frames` as our writer writes them.
pub fn to_text(frames: &[Structure]) -> String {
    let mut out = Vec::new();
    write_extxyz_to(&mut out, frames).unwrap();
    String::from_utf8(out).unwrap()
}

/// `frames` written and read back.
pub fn reparse(frames: &[Structure]) -> Vec<Structure> {
    parse_extxyz_str(&to_text(frames), Path::new("<mem>")).unwrap()
}

/// `text` read, or a panic naming the error.
pub fn parse(text: &str) -> Vec<Structure> {
    parse_extxyz_str(text, Path::new("test.xyz")).unwrap_or_else(|e| panic!("{e}\n{text}"))
}
