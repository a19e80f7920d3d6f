//! Extended XYZ, as read and written by ASE (`ase.io.extxyz`): `elements` maps symbols to
//! atomic numbers, `grammar` parses the comment line, `read` and `write` handle whole files.
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
//!
//! [`Structure::energy`]: crate::structure::Structure::energy
//! [`Structure::forces`]: crate::structure::Structure::forces
//! [`Structure::info`]: crate::structure::Structure::info
//! [`Structure::arrays`]: crate::structure::Structure::arrays

mod elements;
mod grammar;
mod read;
mod write;

pub use elements::{atomic_number, symbol, ELEMENTS};
pub use read::{parse_extxyz_bytes, parse_extxyz_str, read_extxyz};
pub use write::{write_extxyz, write_extxyz_to};
