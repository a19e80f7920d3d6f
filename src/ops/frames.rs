//! A training step's batch gathered from frames held on the device (kernels/frames.cu), so
//! that a captured step's only per-step upload is which frames it takes: the padded inputs and
//! labels come out exactly as the host assembles them.

use crate::ops::launch::{kernel_source, launch, Init, Kernel, Real};
use candle_core::{bail, DType, Result, Tensor};

/// Frames on the device, one after another. Floats (f64): positions and forces [A, 3],
/// energies \[F\], image offsets [E, 3]; u32: the first atom and edge of each frame [F + 1],
/// species \[A\], centers and neighbors \[E\] numbered within their frame.
pub struct FrameTensors {
    pub positions: Tensor,
    pub forces: Tensor,
    pub energy: Tensor,
    pub offsets: Tensor,
    pub atom_begin: Tensor,
    pub edge_begin: Tensor,
    pub species: Tensor,
    pub centers: Tensor,
    pub neighbors: Tensor,
}

/// The padded shape of a gathered batch: structures (padding included), atoms, edge capacity,
/// and the distance the padding atoms and edges are set apart by (`neighbors::padding_offset`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatherShape {
    pub structures: usize,
    pub atoms: usize,
    pub capacity: usize,
    pub far: f64,
}

impl GatherShape {
    /// Length of the u32 table [`gather_frames`] reads.
    pub fn table_len(&self) -> usize {
        3 * self.structures + 5
    }

    /// Length of the f64 output: labels, geometry, indices (see kernels/frames.cu).
    pub fn out_len(&self) -> usize {
        let (s, n, c) = (self.structures, self.atoms, self.capacity);
        (2 * s + 4 * n + 2) + (3 * n + 3 * c) + (2 * n + 2 * c)
    }
}

struct GatherFrames(GatherShape);

impl Kernel for GatherFrames {
    kernel_source!("gather_frames", "frames");
    fn work(&self) -> usize {
        let s = &self.0;
        s.structures + s.atoms + s.capacity
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.0.structures, self.0.atoms, self.0.capacity]
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.0.far]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let f = |v: T| candle_core::WithDType::to_f64(v);
        let GatherShape {
            structures: s,
            atoms: n_pad,
            capacity: c,
            far,
        } = self.0;
        let (positions, forces, energy, offsets) = (x[0], x[1], x[2], x[3]);
        let [table, atom_begin, edge_begin, species, centers, neighbors] =
            [idx[0], idx[1], idx[2], idx[3], idx[4], idx[5]];
        let b = table[0] as usize;
        let frame = &table[3..3 + s];
        let atom_start = &table[3 + s..4 + 2 * s];
        let edge_start = &table[4 + 2 * s..5 + 3 * s];
        let (n, e) = (atom_start[b] as usize, edge_start[b] as usize);
        // The structure holding row `i`: the last start at or below it (see the kernel).
        let owner = |start: &[u32], i: usize| start[..b].partition_point(|&a| a as usize <= i) - 1;
        let mut w = vec![0.0f64; out.len()];
        let (labels, rest) = w.split_at_mut(2 * s + 4 * n_pad + 2);
        let (geometry, indices) = rest.split_at_mut(3 * n_pad + 3 * c);
        let (pos_out, offsets_out) = geometry.split_at_mut(3 * n_pad);
        let (atom_rows, edge_rows) = indices.split_at_mut(2 * n_pad);
        let (species_out, structure_out) = atom_rows.split_at_mut(n_pad);
        let (centers_out, neighbors_out) = edge_rows.split_at_mut(c);
        for k in 0..b {
            let fr = frame[k] as usize;
            let atoms = atom_begin[fr + 1] - atom_begin[fr];
            labels[k] = f(energy[fr]);
            labels[s + k] = 1.0 / atoms.max(1) as f64;
        }
        let (forces_out, rest) = labels[2 * s..].split_at_mut(3 * n_pad);
        let (mask, norms) = rest.split_at_mut(n_pad);
        norms[0] = 1.0 / (table[1] as f64).max(1.0);
        norms[1] = 1.0 / (3.0 * table[2] as f64).max(1.0);
        for i in 0..n_pad {
            if i < n {
                let k = owner(atom_start, i);
                let g = atom_begin[frame[k] as usize] as usize + i - atom_start[k] as usize;
                for d in 0..3 {
                    pos_out[3 * i + d] = f(positions[3 * g + d]);
                    forces_out[3 * i + d] = f(forces[3 * g + d]);
                }
                mask[i] = 1.0;
                species_out[i] = species[g] as f64;
                structure_out[i] = k as f64;
            } else {
                pos_out[3 * i] = 1e4 + far * (i - n) as f64;
                structure_out[i] = b as f64;
            }
        }
        for j in 0..c {
            if j < e {
                let k = owner(edge_start, j);
                let g = edge_begin[frame[k] as usize] as usize + j - edge_start[k] as usize;
                centers_out[j] = (centers[g] + atom_start[k]) as f64;
                neighbors_out[j] = (neighbors[g] + atom_start[k]) as f64;
                for d in 0..3 {
                    offsets_out[3 * j + d] = f(offsets[3 * g + d]);
                }
            } else {
                let q = ((j - e) % n_pad) as f64;
                centers_out[j] = q;
                neighbors_out[j] = q;
                offsets_out[3 * j] = far;
            }
        }
        for (o, v) in out.iter_mut().zip(w) {
            *o = T::of(v);
        }
    }
}

/// The batch that `table` picks from `frames`, padded to `shape`, as one f64 tensor (its
/// parts: kernels/frames.cu). `table` (u32, [`GatherShape::table_len`]) is
/// [b, B, n, frame (S), atom start (S + 1), edge start (S + 1)]: the b frames the batch
/// takes, where their atoms and edges start in it (from b on, the batch's atom and edge
/// counts), and the structures B and atoms n the loss is averaged over. The caller checks it
/// against the frames (it is read on the device, unchecked).
pub fn gather_frames(frames: &FrameTensors, table: &Tensor, shape: GatherShape) -> Result<Tensor> {
    if table.dims() != [shape.table_len()] || table.dtype() != DType::U32 {
        bail!(
            "gather_frames: the table is {:?} {:?}, not [{}] u32",
            table.dtype(),
            table.dims(),
            shape.table_len()
        )
    }
    if shape.atoms == 0 || shape.structures == 0 {
        bail!("gather_frames: a batch padded to {shape:?} has no room")
    }
    let fr = frames;
    launch(
        GatherFrames(shape),
        &[&fr.positions, &fr.forces, &fr.energy, &fr.offsets],
        &[
            table,
            &fr.atom_begin,
            &fr.edge_begin,
            &fr.species,
            &fr.centers,
            &fr.neighbors,
        ],
        shape.out_len(),
        Init::Uninit,
    )
}
