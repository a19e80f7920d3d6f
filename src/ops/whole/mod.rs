pub(crate) mod atom_split;
pub(crate) mod cpu_twin;
pub(crate) mod feature_split;
pub(crate) mod md_step;
pub(crate) mod packed;
pub(crate) mod stamps;
