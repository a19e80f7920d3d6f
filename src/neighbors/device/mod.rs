//! Neighbour lists built where the positions are, padded to a fixed capacity, with an overflow
//! flag on the device: MD on a GPU rebuilds its list without copying positions to the host,
//! and a CUDA graph can keep reading the list from the same buffers.
//!
//! For geometries where every pair has at most one image within the cutoff: molecules, and
//! cells whose perpendicular width is more than twice the cutoff along every periodic axis
//! ([`DeviceListBuilder::new`] refuses others; the host cell list handles them). Then the image
//! is the rounded fractional difference, and each atom's edges come from one pass over all
//! atoms: O(N²) pair tests, a small share of a call at MD sizes
//! (docs/bench-log/14-gpu-neighbour-lists.md). Edges are listed exactly as
//! [`neighbor_list`](crate::neighbors::neighbor_list) lists them for the same positions: sorted by
//! (center, neighbor), the same exact test |x_j − x_i + S·cell|² < c² (the kernels round every
//! product and sum as Rust does). Slots after the edges are padding: atom k mod N to its own
//! image 2 c + 1 Å away along x, beyond the cutoff, so they change no energy or force.
//!
//! kernels/neighbors.cu on CUDA; on the CPU a twin of the same arithmetic, the test oracle.
//!
//! `list` holds the padded list, `builder` builds it, `prune` cuts it to a cutoff; `step` names
//! the kernels of a build and `op` runs one on the CPU twin (`cpu`) or on CUDA (`cuda`).

mod bins;
mod builder;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod list;
mod op;
mod prune;
mod step;

pub use bins::BinGrid;
pub use builder::DeviceListBuilder;
pub use list::{padding_offset, ListStatus, PaddedList};
pub use prune::PRUNE_MARGIN;
