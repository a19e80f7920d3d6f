//! Neighbour lists for molecules and (partly) periodic cells, in the ASE convention.
//!
//! An edge `(i, j, S)` stands for the vector `r_ij = x_j - x_i + S · cell`, with `S` an integer
//! row vector and `cell` the lattice whose rows are a, b, c — the same as the `D` of
//! `ase.neighborlist.primitive_neighbor_list`. An edge is listed iff `|r_ij| < cutoff` (strict)
//! and it is not the atom itself (`i == j` with `S == 0`); both directions are always present.
//! Along non-periodic directions `S` is 0. Shifts refer to the positions as given, which may lie
//! outside the cell.
//!
//! [`neighbor_list`] is an O(N) cell list that works for triclinic cells and for cells smaller
//! than the cutoff (many images); [`brute_force_neighbor_list`] is the O(N² · images) oracle it is
//! tested against; [`VerletList`] adds a skin so that MD can reuse a list over several steps.

mod axis;
mod brute;
mod cell_list;
mod device;
mod runs;
mod sort_key;
mod verlet;

pub use brute::brute_force_neighbor_list;
pub use cell_list::{neighbor_list, neighbor_list_into};
pub use device::{
    padding_offset, BinGrid, DeviceListBuilder, ListStatus, PaddedList, PRUNE_MARGIN,
};
pub use verlet::{moved_past_half_skin, strained_half_skin, VerletList};

use crate::error::{Error, Result};
use crate::structure::{Batch, Lattice, Structure};
use candle_core::WithDType;

/// Largest accepted `cutoff / perpendicular width` along a periodic axis. Beyond it the number
/// of periodic images (≈ (2·ratio)³ per atom) would blow up memory, so the build is refused.
pub const MAX_CUTOFF_WIDTH_RATIO: f64 = 100.0;

/// Directed edges `i -> j` (both directions present) with integer image shifts `S` such that
/// `r_ij = x_j - x_i + S · cell` (S as a row vector times the lattice whose rows are a, b, c; same
/// as `D = positions[j] - positions[i] + S.dot(cell)` in `ase.neighborlist.primitive_neighbor_list`).
///
/// Edges are sorted by `(center, neighbor, shift)`, so lists are deterministic and comparable.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NeighborList {
    /// `i` of every edge.
    pub centers: Vec<u32>,
    /// `j` of every edge.
    pub neighbors: Vec<u32>,
    /// Image shift `S` of every edge.
    pub shifts: Vec<[i32; 3]>,
}

impl NeighborList {
    /// Number of (directed) edges.
    pub fn len(&self) -> usize {
        self.centers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.centers.is_empty()
    }

    /// Edge vectors `x_j - x_i + S · cell`.
    ///
    /// # Panics
    /// When an edge has a non-zero shift but `cell` is `None`, or an index is out of range.
    pub fn vectors(&self, positions: &[[f64; 3]], cell: Option<&Lattice>) -> Vec<[f64; 3]> {
        let zero = [[0.0; 3]; 3];
        let has_cell = cell.is_some();
        let cell = cell.unwrap_or(&zero);
        self.centers
            .iter()
            .zip(&self.neighbors)
            .zip(&self.shifts)
            .map(|((&i, &j), &s)| {
                assert!(
                    has_cell || s == [0; 3],
                    "edge {i}->{j} has image shift {s:?} but no cell was given"
                );
                edge_vector(&positions[i as usize], &positions[j as usize], s, cell)
            })
            .collect()
    }

    /// Edge lengths `|x_j - x_i + S · cell|`.
    pub fn distances(&self, positions: &[[f64; 3]], cell: Option<&Lattice>) -> Vec<f64> {
        self.vectors(positions, cell)
            .iter()
            .map(|v| norm2(v).sqrt())
            .collect()
    }

    /// Structure index of every edge of a batch list, given the batch's atom `offsets`
    /// (`offsets[k]..offsets[k+1]` are the atoms of structure k).
    pub fn edge_structures(&self, offsets: &[usize]) -> Vec<u32> {
        self.centers
            .iter()
            .map(|&c| (offsets.partition_point(|&o| o <= c as usize) - 1) as u32)
            .collect()
    }

    /// One list from per-structure lists, atom indices shifted by `offsets[k]` for list k.
    pub fn concat<'a>(lists: impl Iterator<Item = &'a NeighborList>, offsets: &[usize]) -> Self {
        let mut out = NeighborList::default();
        for (nl, &off) in lists.zip(offsets) {
            let off = off as u32;
            out.centers.extend(nl.centers.iter().map(|&c| c + off));
            out.neighbors.extend(nl.neighbors.iter().map(|&c| c + off));
            out.shifts.extend_from_slice(&nl.shifts);
        }
        out
    }

    /// Edge vectors of a list built by [`batch_neighbor_list`], each with its own structure's
    /// positions and cell.
    pub fn batch_vectors(&self, batch: &Batch) -> Vec<[f64; 3]> {
        let zero = [[0.0; 3]; 3];
        self.edge_structures(&batch.offsets)
            .iter()
            .zip(self.centers.iter().zip(&self.neighbors).zip(&self.shifts))
            .map(|(&k, ((&i, &j), &s))| {
                let st = &batch.structures[k as usize];
                let off = batch.offsets[k as usize];
                assert!(
                    st.cell.is_some() || s == [0; 3],
                    "edge {i}->{j} has image shift {s:?} but structure {k} has no cell"
                );
                edge_vector(
                    &st.positions[i as usize - off],
                    &st.positions[j as usize - off],
                    s,
                    st.cell.as_ref().unwrap_or(&zero),
                )
            })
            .collect()
    }
}

/// Neighbour list of one structure (its positions, cell and pbc).
pub fn structure_neighbor_list(s: &Structure, cutoff: f64) -> Result<NeighborList> {
    neighbor_list(&s.positions, s.cell.as_ref(), s.pbc, cutoff)
}

/// Cartesian image offset `S · cell` of an edge shift (zero for `S = 0` or without a cell).
pub fn image_offset(s: [i32; 3], cell: Option<&Lattice>) -> [f64; 3] {
    match cell {
        Some(c) if s != [0; 3] => {
            std::array::from_fn(|d| (0..3).map(|k| s[k] as f64 * c[k][d]).sum::<f64>())
        }
        _ => [0.0; 3],
    }
}

/// Threads for `items` independent pieces of work: the machine's cores (as the process may
/// use them), at most one per `min_per_thread` items, at least one.
pub(crate) fn work_threads(items: usize, min_per_thread: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    cores.min(items / min_per_thread.max(1)).max(1)
}

/// Edges per thread below which [`flat_image_offsets`] uses fewer threads.
const MIN_OFFSETS_PER_THREAD: usize = 1 << 16;

/// [`image_offset`] of every shift, flattened to `[E * 3]` (the layout a device tensor takes),
/// on several threads for long lists: a million-atom list has ~55 million edges.
pub fn flat_image_offsets(shifts: &[[i32; 3]], cell: Option<&Lattice>) -> Vec<f64> {
    let mut out = Vec::new();
    flat_image_offsets_into(shifts, cell, &mut out);
    out
}

/// [`flat_image_offsets`] converted to `T` (as a cast of the f64 tensor would), written into
/// `out`, whose memory is reused: a Verlet list's inputs rebuilt in place touch no fresh pages.
pub fn flat_image_offsets_into<T: WithDType>(
    shifts: &[[i32; 3]],
    cell: Option<&Lattice>,
    out: &mut Vec<T>,
) {
    let threads = work_threads(shifts.len(), MIN_OFFSETS_PER_THREAD);
    flat_image_offsets_on(shifts, cell, threads, out)
}

fn flat_image_offsets_on<T: WithDType>(
    shifts: &[[i32; 3]],
    cell: Option<&Lattice>,
    threads: usize,
    out: &mut Vec<T>,
) {
    let len = 3 * shifts.len();
    if out.capacity() < len {
        // Zeroed fresh memory is mapped lazily: its pages are first touched by the threads
        // below, or not at all where every shift is zero.
        *out = vec![T::zero(); len];
    } else {
        out.clear();
        out.resize(len, T::zero());
    }
    let Some(c) = cell else { return };
    // Zero shifts (most edges in a large cell) keep their zeros.
    let fill = |shifts: &[[i32; 3]], out: &mut [T]| {
        for (s, o) in shifts.iter().zip(out.chunks_exact_mut(3)) {
            if *s != [0; 3] {
                let v = image_offset(*s, Some(c));
                o.iter_mut()
                    .zip(v)
                    .for_each(|(od, vd)| *od = T::from_f64(vd));
            }
        }
    };
    if threads <= 1 {
        fill(shifts, out);
        return;
    }
    let chunk = shifts.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (s, o) in shifts.chunks(chunk).zip(out.chunks_mut(3 * chunk)) {
            scope.spawn(move || fill(s, o));
        }
    });
}

/// Wraps positions into the cell along its periodic directions (fractional coordinates in
/// [0, 1)), as `ase.Atoms.wrap()`. Non-periodic directions and molecules are left alone.
pub fn wrap_positions(
    positions: &mut [[f64; 3]],
    cell: Option<&Lattice>,
    pbc: [bool; 3],
) -> Result<()> {
    let g = Geometry::of_cell(cell, pbc)?;
    if !g.periodic.iter().any(|&p| p) {
        return Ok(());
    }
    for x in positions.iter_mut() {
        let mut f = g.frac(x);
        for (fk, periodic) in f.iter_mut().zip(g.periodic) {
            if periodic {
                *fk -= fk.floor();
            }
        }
        *x = std::array::from_fn(|d| (0..3).map(|k| f[k] * g.basis[k][d]).sum());
    }
    Ok(())
}

/// `batch` with the positions of its periodic structures wrapped into their cells in f64
/// wherever one lies outside, so that no coordinate far out loses digits when the model casts
/// it to f32 (energies and forces do not depend on which image of an atom is given).
pub fn wrap_batch(batch: &Batch) -> Result<std::borrow::Cow<'_, Batch>> {
    let mut wrapped: Option<Vec<Structure>> = None;
    for (k, s) in batch.structures.iter().enumerate() {
        let g = Geometry::of_cell(s.cell.as_ref(), s.pbc)?;
        let outside = |x: &[f64; 3]| {
            let f = g.frac(x);
            (0..3).any(|d| g.periodic[d] && !(0.0..1.0).contains(&f[d]))
        };
        if g.periodic.iter().any(|&p| p) && s.positions.iter().any(outside) {
            let all = wrapped.get_or_insert_with(|| batch.structures.clone());
            wrap_positions(&mut all[k].positions, s.cell.as_ref(), s.pbc)?;
        }
    }
    Ok(match wrapped {
        Some(structures) => std::borrow::Cow::Owned(Batch {
            structures,
            offsets: batch.offsets.clone(),
        }),
        None => std::borrow::Cow::Borrowed(batch),
    })
}

/// Distances `|x_j - x_i|` of the given pairs under the minimum-image convention along periodic
/// directions (fractional differences rounded to the nearest integer): exact for pairs closer
/// than half the smallest perpendicular cell width, which is what bond checks need.
pub fn minimum_image_distances(
    pairs: &[(u32, u32)],
    positions: &[[f64; 3]],
    cell: Option<&Lattice>,
    pbc: [bool; 3],
) -> Result<Vec<f64>> {
    let g = Geometry::of_cell(cell, pbc)?;
    Ok(pairs
        .iter()
        .map(|&(i, j)| {
            let (xi, xj) = (&positions[i as usize], &positions[j as usize]);
            let mut v = [xj[0] - xi[0], xj[1] - xi[1], xj[2] - xi[2]];
            let f = g.frac(&v);
            for ((fk, periodic), row) in f.iter().zip(g.periodic).zip(&g.basis) {
                if periodic {
                    let n = fk.round();
                    v.iter_mut().zip(row).for_each(|(vd, b)| *vd -= n * b);
                }
            }
            norm2(&v).sqrt()
        })
        .collect())
}

/// One list over a whole batch: atom indices are offset by `batch.offsets`, shifts are per edge
/// and refer to each structure's own cell. Edges stay sorted by center, so the structure of an
/// edge follows from its center ([`NeighborList::edge_structures`]).
pub fn batch_neighbor_list(batch: &Batch, cutoff: f64) -> Result<NeighborList> {
    if batch.n_atoms() > u32::MAX as usize {
        return Err(Error::NeighborList(format!(
            "batch has {} atoms, more than u32 indices can address",
            batch.n_atoms()
        )));
    }
    let lists = batch
        .structures
        .iter()
        .enumerate()
        .map(|(k, s)| {
            structure_neighbor_list(s, cutoff).map_err(|e| match e {
                Error::NeighborList(m) => Error::NeighborList(format!("structure {k}: {m}")),
                other => other,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(NeighborList::concat(lists.iter(), &batch.offsets))
}

/// The canonical edge vector `x_j - x_i + S · cell`. Both the cell list and the brute-force
/// oracle decide `|r| < cutoff` with this very expression, so they agree to the last bit; cell
/// rows with a zero shift are not touched (a non-periodic axis may hold anything).
#[inline]
pub(crate) fn edge_vector(xi: &[f64; 3], xj: &[f64; 3], s: [i32; 3], cell: &Lattice) -> [f64; 3] {
    let mut v = [xj[0] - xi[0], xj[1] - xi[1], xj[2] - xi[2]];
    for (k, &sk) in s.iter().enumerate() {
        if sk != 0 {
            let f = sk as f64;
            for (vd, cd) in v.iter_mut().zip(&cell[k]) {
                *vd += f * cd;
            }
        }
    }
    v
}

#[inline]
pub(crate) fn norm2(v: &[f64; 3]) -> f64 {
    v[0] * v[0] + v[1] * v[1] + v[2] * v[2]
}

fn cross(a: &[f64; 3], b: &[f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn dot(a: &[f64; 3], b: &[f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

fn scale(a: &[f64; 3], f: f64) -> [f64; 3] {
    [a[0] * f, a[1] * f, a[2] * f]
}

/// Validated inputs and the geometry shared by the cell list and the oracle.
pub(crate) struct Geometry {
    /// Effective periodicity: `pbc` where a cell is given, all false otherwise.
    pub periodic: [bool; 3],
    /// The caller's cell (zeros when none), for the canonical edge vectors.
    pub cell: Lattice,
    /// The cell with its non-periodic rows replaced by unit vectors orthogonal to the periodic
    /// rows (identity when nothing is periodic): always invertible, same lattice translations.
    pub basis: Lattice,
    /// Reciprocal rows: fractional coordinate `s_k = x · recip[k]` with `x = s · basis`.
    pub recip: Lattice,
    /// Perpendicular widths `1 / |recip[k]|` of `basis` (distance between opposite faces).
    pub widths: [f64; 3],
}

impl Geometry {
    pub fn new(
        positions: &[[f64; 3]],
        cell: Option<&Lattice>,
        pbc: [bool; 3],
        cutoff: f64,
    ) -> Result<Self> {
        if !(cutoff.is_finite() && cutoff > 0.0) {
            return Err(Error::NeighborList(format!(
                "cutoff must be positive and finite, got {cutoff}"
            )));
        }
        if positions.len() > u32::MAX as usize {
            return Err(Error::NeighborList(format!(
                "{} atoms are more than u32 indices can address",
                positions.len()
            )));
        }
        if let Some((i, p)) = positions
            .iter()
            .enumerate()
            .find(|(_, p)| p.iter().any(|x| !x.is_finite()))
        {
            return Err(Error::NeighborList(format!(
                "atom {i} has a non-finite position {p:?}"
            )));
        }
        let geometry = Self::of_cell(cell, pbc)?;
        for k in 0..3 {
            if geometry.periodic[k] {
                let ratio = cutoff / geometry.widths[k];
                if ratio.is_nan() || ratio > MAX_CUTOFF_WIDTH_RATIO {
                    return Err(Error::NeighborList(format!(
                        "cutoff {cutoff} Å is {ratio:.1} times the perpendicular width {:.4} Å of \
                         periodic cell axis {k}: that needs too many periodic images \
                         (limit {MAX_CUTOFF_WIDTH_RATIO} times)",
                        geometry.widths[k]
                    )));
                }
            }
        }
        Ok(geometry)
    }

    /// The basis, reciprocal rows and widths of a cell, without the cutoff and position checks.
    pub fn of_cell(cell: Option<&Lattice>, pbc: [bool; 3]) -> Result<Self> {
        let periodic = match cell {
            Some(_) => pbc,
            None => [false; 3],
        };
        let cell = cell.copied().unwrap_or([[0.0; 3]; 3]);
        let basis = complete_basis(&cell, periodic)?;
        let vol = dot(&basis[0], &cross(&basis[1], &basis[2]));
        let mut recip = [[0.0; 3]; 3];
        let mut widths = [0.0; 3];
        for k in 0..3 {
            recip[k] = scale(&cross(&basis[(k + 1) % 3], &basis[(k + 2) % 3]), 1.0 / vol);
            widths[k] = 1.0 / norm2(&recip[k]).sqrt();
        }
        Ok(Self {
            periodic,
            cell,
            basis,
            recip,
            widths,
        })
    }

    /// Fractional coordinates of `x` in `basis`.
    #[inline]
    pub fn frac(&self, x: &[f64; 3]) -> [f64; 3] {
        [
            dot(x, &self.recip[0]),
            dot(x, &self.recip[1]),
            dot(x, &self.recip[2]),
        ]
    }
}

/// Replaces the non-periodic rows of `cell` by orthonormal vectors orthogonal to the periodic
/// rows, so that slabs and wires whose cell is degenerate along non-periodic axes still get an
/// invertible basis. Errors when the periodic rows are not finite or linearly dependent.
fn complete_basis(cell: &Lattice, periodic: [bool; 3]) -> Result<Lattice> {
    let degenerate = || {
        Error::NeighborList(format!(
            "periodic cell {cell:?} (pbc {periodic:?}) is degenerate: zero volume"
        ))
    };
    let p: Vec<usize> = (0..3).filter(|&k| periodic[k]).collect();
    for &k in &p {
        if cell[k].iter().any(|x| !x.is_finite()) {
            return Err(Error::NeighborList(format!(
                "periodic cell vector {k} is not finite: {:?}",
                cell[k]
            )));
        }
        if norm2(&cell[k]) == 0.0 {
            return Err(degenerate());
        }
    }
    let unit = |v: [f64; 3]| scale(&v, 1.0 / norm2(&v).sqrt());
    let mut b = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
    match p.len() {
        1 => {
            let k = p[0];
            let u = unit(cell[k]);
            // The Cartesian axis least aligned with u gives a well-conditioned cross product.
            let mut e = [0.0; 3];
            let d = (0..3)
                .min_by(|&x, &y| u[x].abs().total_cmp(&u[y].abs()))
                .unwrap_or(0);
            e[d] = 1.0;
            let v1 = unit(cross(&u, &e));
            let v2 = cross(&u, &v1);
            b[k] = cell[k];
            b[(k + 1) % 3] = v1;
            b[(k + 2) % 3] = v2;
        }
        2 => {
            let q = 3 - p[0] - p[1];
            let n = cross(&cell[p[0]], &cell[p[1]]);
            let scale_ab = norm2(&cell[p[0]]).sqrt() * norm2(&cell[p[1]]).sqrt();
            let area = norm2(&n).sqrt();
            if area.is_nan() || area <= 1e-10 * scale_ab {
                return Err(degenerate());
            }
            b[p[0]] = cell[p[0]];
            b[p[1]] = cell[p[1]];
            b[q] = unit(n);
        }
        3 => b = *cell,
        _ => {}
    }
    let vol = dot(&b[0], &cross(&b[1], &b[2]));
    let lengths: f64 = b.iter().map(|r| norm2(r).sqrt()).product();
    if vol.is_nan() || vol.abs() <= 1e-10 * lengths {
        return Err(degenerate());
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_offsets_are_the_offsets_of_each_edge_on_any_thread_count() {
        let cell = [[9.0, 0.5, 0.0], [1.0, 8.0, 0.2], [0.3, -1.0, 7.0]];
        let shifts: Vec<[i32; 3]> = (0..1000)
            .map(|e: i32| [e % 3 - 1, (e / 3) % 5 - 2, (e * 7) % 3 - 1])
            .collect();
        let each: Vec<f64> = (shifts.iter())
            .flat_map(|s| image_offset(*s, Some(&cell)))
            .collect();
        let single: Vec<f32> = each.iter().map(|&x| x as f32).collect();
        // A reused buffer, longer or shorter than the list, holds just the list's offsets.
        let mut out = vec![7.0; 5000];
        let mut out32 = vec![7.0f32; 10];
        for threads in [1, 2, 3, 8] {
            flat_image_offsets_on(&shifts, Some(&cell), threads, &mut out);
            assert_eq!(out, each);
            flat_image_offsets_on(&shifts, Some(&cell), threads, &mut out32);
            assert_eq!(out32, single);
            flat_image_offsets_on(&shifts, None, threads, &mut out);
            assert_eq!(out, vec![0.0; 3000]);
        }
        assert_eq!(flat_image_offsets(&[], Some(&cell)), Vec::<f64>::new());
    }

    #[test]
    fn completed_basis_keeps_periodic_rows_and_is_orthonormal_elsewhere() {
        let cell = [[2.0, 1.0, 0.5], [0.0; 3], [0.0; 3]];
        for periodic in [
            [true, false, false],
            [false, true, false],
            [false, false, true],
        ] {
            let mut c = [[0.0; 3]; 3];
            let k = periodic.iter().position(|&p| p).unwrap();
            c[k] = cell[0];
            let b = complete_basis(&c, periodic).unwrap();
            assert_eq!(b[k], c[k]);
            for (p, q) in [(0, 1), (1, 2), (0, 2)] {
                assert!(dot(&b[p], &b[q]).abs() < 1e-12, "{b:?}");
            }
            for (r, row) in b.iter().enumerate() {
                assert!(r == k || (norm2(row) - 1.0).abs() < 1e-12);
            }
        }
        let slab = [[3.0, 0.0, 0.0], [1.0, 2.0, 0.0], [0.0; 3]];
        let b = complete_basis(&slab, [true, true, false]).unwrap();
        assert_eq!(b[2], [0.0, 0.0, 1.0]);
        assert!(complete_basis(&slab, [true, true, true]).is_err());
        assert_eq!(
            complete_basis(&slab, [false; 3]).unwrap()[2],
            [0.0, 0.0, 1.0]
        );
    }
}
