//! File formats.

pub mod extxyz;

pub use extxyz::{
    parse_extxyz_bytes, parse_extxyz_str, read_extxyz, write_extxyz, write_extxyz_to,
};
