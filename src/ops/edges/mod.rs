pub(crate) mod gather;
pub(crate) mod partition;
pub(crate) mod rows;
pub(crate) mod scatter_add;
