//! O(N) cell list in fractional coordinates, for molecules, orthorhombic and triclinic cells,
//! and cells narrower than the cutoff.
//!
//! Atoms are wrapped into the cell along periodic axes and binned: axis k gets
//! `n_k = max(1, floor(d_k / cutoff))` bins (d_k the perpendicular width, or the extent of the
//! atoms' bounding box along a non-periodic axis). A sphere of radius `cutoff` spans
//! `cutoff / d_k` in fractional coordinates, so every neighbour of an atom in bin `b` lies in an
//! "unwrapped" bin `b + o`, `o ∈ -m_k..=m_k`, `m_k = ceil(cutoff · n_k / d_k)`. Along periodic
//! axes `b + o` maps to (bin `(b + o) mod n_k`, image `floor((b + o) / n_k)`); that map is
//! injective, so each (neighbour, image) is visited once even when `n_k` is 1 or 2 and the
//! cutoff spans several cells. Along non-periodic axes out-of-range bins are skipped.

use super::{edge_vector, norm2, work_threads, Geometry, NeighborList};
use crate::error::{Error, Result};
use crate::structure::Lattice;
use std::ops::Range;

/// Relative safety margin on the cutoff for binning and the first distance filter, far above
/// the rounding of fractional coordinates and wrapping. The final test is exact (see below).
const MARGIN: f64 = 1e-9;
/// Bins per axis before the total cap (keeps the product far from overflow).
const MAX_BINS_PER_AXIS: usize = 1 << 20;
/// Atoms further than this many cell lengths from the cell are refused (shift overflow and
/// loss of precision in the wrapped coordinates).
const MAX_WRAP: f64 = 1e6;
/// Centers per thread below which the search stays on fewer threads: a thread's start costs
/// about what a few hundred centers' search does, so small lists (a molecule, a training
/// batch) stay on one.
const MIN_CENTERS_PER_THREAD: usize = 4096;

/// Neighbour list by cell list, O(N) for bounded density. Same output as
/// [`brute_force_neighbor_list`](super::brute_force_neighbor_list), edges sorted by
/// `(center, neighbor, shift)`.
///
/// `cell = None` or `pbc` all false: non-periodic. Periodic axes accept any non-degenerate cell
/// (orthorhombic or triclinic) with `cutoff` up to
/// [`MAX_CUTOFF_WIDTH_RATIO`](super::MAX_CUTOFF_WIDTH_RATIO) times the perpendicular width;
/// non-periodic cell rows are ignored (they may be zero). Positions may lie outside the cell.
pub fn neighbor_list(
    positions: &[[f64; 3]],
    cell: Option<&Lattice>,
    pbc: [bool; 3],
    cutoff: f64,
) -> Result<NeighborList> {
    search(positions, cell, pbc, cutoff, None)
}

/// [`neighbor_list`] on `threads` threads (None: the cores, at most one per
/// [`MIN_CENTERS_PER_THREAD`] centers).
fn search(
    positions: &[[f64; 3]],
    cell: Option<&Lattice>,
    pbc: [bool; 3],
    cutoff: f64,
    threads: Option<usize>,
) -> Result<NeighborList> {
    let g = Geometry::new(positions, cell, pbc, cutoff)?;
    let n = positions.len();
    let mut out = NeighborList::default();
    if n == 0 {
        return Ok(out);
    }
    let eff = cutoff * (1.0 + MARGIN);
    let c2 = cutoff * cutoff;
    let c2_loose = (cutoff * (1.0 + 10.0 * MARGIN)).powi(2);

    // Fractional coordinates wrapped into [0, 1) along periodic axes; `wrap` counts the cell
    // vectors removed, `wrapped` is the Cartesian position after removing them.
    let mut frac = Vec::with_capacity(n);
    let mut wrap = Vec::with_capacity(n);
    let mut wrapped = Vec::with_capacity(n);
    for (i, x) in positions.iter().enumerate() {
        let mut s = g.frac(x);
        let mut w = [0i32; 3];
        let mut xw = *x;
        for k in 0..3 {
            if g.periodic[k] {
                let f = s[k].floor();
                if f.abs() > MAX_WRAP {
                    return Err(Error::NeighborList(format!(
                        "atom {i} lies {f} cell lengths outside the cell along axis {k} \
                         (limit {MAX_WRAP}); wrap the positions first"
                    )));
                }
                s[k] -= f;
                w[k] = f as i32;
                for (xd, bd) in xw.iter_mut().zip(&g.basis[k]) {
                    *xd -= f * bd;
                }
            }
        }
        frac.push(s);
        wrap.push(w);
        wrapped.push(xw);
    }

    // Bins per axis.
    let mut nb = [1usize; 3];
    let mut lo = [0.0f64; 3];
    let mut span = [1.0f64; 3];
    for k in 0..3 {
        let d = g.widths[k];
        let extent = if g.periodic[k] {
            d
        } else {
            let min = frac.iter().map(|s| s[k]).fold(f64::INFINITY, f64::min);
            let max = frac.iter().map(|s| s[k]).fold(f64::NEG_INFINITY, f64::max);
            lo[k] = min;
            span[k] = max - min;
            span[k] * d
        };
        let bins = (extent / eff).floor();
        nb[k] = if bins >= 1.0 {
            (bins.min(MAX_BINS_PER_AXIS as f64) as usize).max(1)
        } else {
            1
        };
    }
    // Cap the total so memory stays O(N) for sparse systems (a far-flung molecule); coarser
    // bins only cost speed, never correctness.
    let cap = (4 * n).max(64);
    while nb[0] * nb[1] * nb[2] > cap {
        let k = (0..3).max_by_key(|&k| nb[k]).unwrap_or(0);
        nb[k] = (nb[k] / 2).max(1);
    }
    let mut m = [0i64; 3];
    for k in 0..3 {
        m[k] = if g.periodic[k] {
            (eff * nb[k] as f64 / g.widths[k]).ceil() as i64
        } else if nb[k] == 1 {
            0
        } else {
            let need = (eff * nb[k] as f64 / (span[k] * g.widths[k])).ceil() as i64;
            need.min(nb[k] as i64 - 1)
        };
    }

    // Counting sort of the atoms by bin.
    let bin_of = |s: &[f64; 3]| -> [usize; 3] {
        let mut b = [0usize; 3];
        for k in 0..3 {
            if nb[k] > 1 {
                let t = if g.periodic[k] {
                    s[k]
                } else {
                    (s[k] - lo[k]) / span[k]
                };
                b[k] = ((t * nb[k] as f64).floor() as i64).clamp(0, nb[k] as i64 - 1) as usize;
            }
        }
        b
    };
    let flat = |b: [usize; 3]| (b[0] * nb[1] + b[1]) * nb[2] + b[2];
    let nbins = nb[0] * nb[1] * nb[2];
    let bins: Vec<[usize; 3]> = frac.iter().map(bin_of).collect();
    let mut start = vec![0usize; nbins + 1];
    for b in &bins {
        start[flat(*b) + 1] += 1;
    }
    for t in 0..nbins {
        start[t + 1] += start[t];
    }
    let mut fill = start.clone();
    let mut order = vec![0u32; n];
    for (i, b) in bins.iter().enumerate() {
        let f = flat(*b);
        order[fill[f]] = i as u32;
        fill[f] += 1;
    }
    let sorted_pos: Vec<[f64; 3]> = order.iter().map(|&i| wrapped[i as usize]).collect();

    // Reserve the expected number of edges (n · density · sphere) when the atoms fill a
    // fully periodic cell: growing half a million edges by doubling is a large part of the time.
    if g.periodic == [true; 3] {
        let vol = crate::structure::volume(&g.basis).abs();
        let est = n as f64 * n as f64 / vol * (4.0 / 3.0 * std::f64::consts::PI * c2 * cutoff);
        let est = (1.1 * est).min((1u64 << 24) as f64) as usize + 16;
        out.centers.reserve(est);
        out.neighbors.reserve(est);
        out.shifts.reserve(est);
    }

    // Range of every shift component, to pack (neighbor, shift) into a u64 sort key when the
    // ranges are small (always, unless atoms lie very far outside the cell).
    let mut packing = Packing {
        lo: [i64::from(i32::MIN); 3],
        bits: [32; 3],
    };
    let mut total_bits = 0;
    for k in 0..3 {
        let nk = nb[k] as i64;
        let (img_lo, img_hi) = if g.periodic[k] {
            ((-m[k]).div_euclid(nk), (nk - 1 + m[k]).div_euclid(nk))
        } else {
            (0, 0)
        };
        let w_lo = wrap.iter().map(|w| i64::from(w[k])).min().unwrap_or(0);
        let w_hi = wrap.iter().map(|w| i64::from(w[k])).max().unwrap_or(0);
        let lo_k = img_lo + w_lo - w_hi;
        let width = (img_hi + w_hi - w_lo) - lo_k + 1;
        packing.lo[k] = lo_k;
        packing.bits[k] = 64 - ((width - 1) as u64).leading_zeros();
        total_bits += packing.bits[k];
    }
    let grid = Grid {
        positions,
        cell: &g.cell,
        basis: &g.basis,
        periodic: g.periodic,
        nb,
        m,
        bins: &bins,
        start: &start,
        order: &order,
        sorted_pos: &sorted_pos,
        wrapped: &wrapped,
        wrap: &wrap,
        c2,
        c2_loose,
    };
    let threads = threads.unwrap_or_else(|| work_threads(n, MIN_CENTERS_PER_THREAD));
    if total_bits <= 32 {
        grid.fill_on::<u64>(&packing, threads, &mut out);
    } else {
        let wide = Packing {
            lo: [i64::from(i32::MIN); 3],
            bits: [32; 3],
        };
        grid.fill_on::<u128>(&wide, threads, &mut out);
    }
    Ok(out)
}

/// The binned atoms, ready for the search.
struct Grid<'a> {
    positions: &'a [[f64; 3]],
    cell: &'a Lattice,
    basis: &'a Lattice,
    periodic: [bool; 3],
    nb: [usize; 3],
    m: [i64; 3],
    bins: &'a [[usize; 3]],
    start: &'a [usize],
    order: &'a [u32],
    sorted_pos: &'a [[f64; 3]],
    wrapped: &'a [[f64; 3]],
    wrap: &'a [[i32; 3]],
    c2: f64,
    c2_loose: f64,
}

impl Grid<'_> {
    /// [`fill`](Self::fill) for every center, on `threads` threads that each take a contiguous
    /// run of centers: concatenated in order, the edges are the one-thread list exactly.
    fn fill_on<K: SortKey>(&self, packing: &Packing, threads: usize, out: &mut NeighborList) {
        let n = self.bins.len();
        if threads <= 1 {
            return self.fill::<K>(packing, 0..n, out);
        }
        let chunk = n.div_ceil(threads);
        // The caller reserved the expected edges where it could estimate them.
        let per_center = out.centers.capacity() / n;
        let parts: Vec<NeighborList> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .step_by(chunk)
                .map(|lo| {
                    scope.spawn(move || {
                        let mut part = NeighborList::default();
                        let expected = per_center * chunk;
                        part.centers.reserve(expected);
                        part.neighbors.reserve(expected);
                        part.shifts.reserve(expected);
                        self.fill::<K>(packing, lo..(lo + chunk).min(n), &mut part);
                        part
                    })
                })
                .collect();
            // A search thread only panics on a bug; carry the panic on.
            (handles.into_iter())
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        for part in parts {
            out.centers.extend_from_slice(&part.centers);
            out.neighbors.extend_from_slice(&part.neighbors);
            out.shifts.extend_from_slice(&part.shifts);
        }
    }

    /// Appends the edges of `centers` in order, each center's sorted by (neighbor, shift).
    fn fill<K: SortKey>(&self, packing: &Packing, centers: Range<usize>, out: &mut NeighborList) {
        let nb = self.nb;
        // Per center: the (bin, image, image · cell) choices along each axis, then every bin
        // triple. Scratch buffers are reused: no allocation per edge or per atom.
        let mut axes: [Vec<(usize, i32, [f64; 3])>; 3] = Default::default();
        let mut scratch: Vec<K> = Vec::new();
        for i in centers {
            let bi = &self.bins[i];
            for k in 0..3 {
                axes[k].clear();
                let nk = nb[k] as i64;
                for o in -self.m[k]..=self.m[k] {
                    let t = bi[k] as i64 + o;
                    if self.periodic[k] {
                        let img = t.div_euclid(nk);
                        let v = self.basis[k];
                        let f = img as f64;
                        axes[k].push((
                            t.rem_euclid(nk) as usize,
                            img as i32,
                            [v[0] * f, v[1] * f, v[2] * f],
                        ));
                    } else if (0..nk).contains(&t) {
                        axes[k].push((t as usize, 0, [0.0; 3]));
                    }
                }
            }
            let xi = self.wrapped[i];
            let wi = self.wrap[i];
            scratch.clear();
            for &(t0, i0, v0) in &axes[0] {
                for &(t1, i1, v1) in &axes[1] {
                    let base = (t0 * nb[1] + t1) * nb[2];
                    let v01 = [v0[0] + v1[0], v0[1] + v1[1], v0[2] + v1[2]];
                    for &(t2, i2, v2) in &axes[2] {
                        let bin = base + t2;
                        let (lo_j, hi_j) = (self.start[bin], self.start[bin + 1]);
                        if lo_j == hi_j {
                            continue;
                        }
                        // x_j + image·cell - x_i = x_j - ci
                        let ci = [
                            xi[0] - (v01[0] + v2[0]),
                            xi[1] - (v01[1] + v2[1]),
                            xi[2] - (v01[2] + v2[2]),
                        ];
                        let img = [i0, i1, i2];
                        for (jj, xj) in self.sorted_pos[lo_j..hi_j].iter().enumerate() {
                            let d = [xj[0] - ci[0], xj[1] - ci[1], xj[2] - ci[2]];
                            if norm2(&d) >= self.c2_loose {
                                continue;
                            }
                            let j = self.order[lo_j + jj] as usize;
                            if j == i && img == [0, 0, 0] {
                                continue;
                            }
                            // Shift for the positions as given, then the exact, canonical test.
                            let wj = self.wrap[j];
                            let s = [
                                img[0] + wi[0] - wj[0],
                                img[1] + wi[1] - wj[1],
                                img[2] + wi[2] - wj[2],
                            ];
                            let v =
                                edge_vector(&self.positions[i], &self.positions[j], s, self.cell);
                            if norm2(&v) < self.c2 {
                                scratch.push(K::pack(j as u32, s, packing));
                            }
                        }
                    }
                }
            }
            scratch.sort_unstable();
            out.centers
                .extend(std::iter::repeat_n(i as u32, scratch.len()));
            for &key in &scratch {
                let (j, s) = key.unpack(packing);
                out.neighbors.push(j);
                out.shifts.push(s);
            }
        }
    }
}

/// Bit fields of a sort key: shift component k is stored as `s_k - lo[k]` in `bits[k]` bits,
/// below the neighbour index, so integer order is the lexicographic order of (neighbor, shift).
struct Packing {
    lo: [i64; 3],
    bits: [u32; 3],
}

/// (neighbor, shift) packed into an integer: sorting integers is much faster than tuples.
trait SortKey: Copy + Ord {
    fn pack(j: u32, s: [i32; 3], p: &Packing) -> Self;
    fn unpack(self, p: &Packing) -> (u32, [i32; 3]);
}

macro_rules! impl_sort_key {
    ($t:ty) => {
        impl SortKey for $t {
            #[inline]
            fn pack(j: u32, s: [i32; 3], p: &Packing) -> Self {
                let mut key = <$t>::from(j);
                for k in 0..3 {
                    key = (key << p.bits[k]) | (i64::from(s[k]) - p.lo[k]) as $t;
                }
                key
            }

            #[inline]
            fn unpack(self, p: &Packing) -> (u32, [i32; 3]) {
                let mut key = self;
                let mut s = [0i32; 3];
                for k in (0..3).rev() {
                    let mask: $t = (1 << p.bits[k]) - 1;
                    s[k] = ((key & mask) as i64 + p.lo[k]) as i32;
                    key >>= p.bits[k];
                }
                (key as u32, s)
            }
        }
    };
}
impl_sort_key!(u64);
impl_sort_key!(u128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_split_the_centers_without_changing_the_list() {
        // 600 atoms in a triclinic cell periodic along two axes, some far outside it.
        let cell = [[14.0, 0.0, 0.0], [3.0, 13.0, 0.0], [1.0, -2.0, 12.0]];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let positions: Vec<[f64; 3]> = (0..600)
            .map(|_| std::array::from_fn(|_| 40.0 * next() - 13.0))
            .collect();
        for pbc in [[true, true, false], [true; 3], [false; 3]] {
            let one = search(&positions, Some(&cell), pbc, 4.5, Some(1)).unwrap();
            assert!(one.len() > 1000, "{pbc:?}: {} edges", one.len());
            for threads in [2, 3, 7] {
                let many = search(&positions, Some(&cell), pbc, 4.5, Some(threads)).unwrap();
                assert_eq!(many.centers, one.centers, "{pbc:?}, {threads} threads");
                assert_eq!(many.neighbors, one.neighbors, "{pbc:?}, {threads} threads");
                assert_eq!(many.shifts, one.shifts, "{pbc:?}, {threads} threads");
            }
        }
    }

    #[test]
    fn sort_keys_round_trip_and_keep_tuple_order() {
        let narrow = Packing {
            lo: [-3, 0, -8],
            bits: [3, 0, 4],
        };
        let wide = Packing {
            lo: [i64::from(i32::MIN); 3],
            bits: [32; 3],
        };
        let mut t = vec![];
        for j in [0u32, 1, 7, u32::MAX] {
            for a in -3..=4 {
                for c in -8..=7 {
                    t.push((j, [a, 0, c]));
                }
            }
        }
        let mut by_key: Vec<u64> = t.iter().map(|&(j, s)| u64::pack(j, s, &narrow)).collect();
        let mut by_wide: Vec<u128> = t.iter().map(|&(j, s)| u128::pack(j, s, &wide)).collect();
        by_key.sort_unstable();
        by_wide.sort_unstable();
        t.sort_unstable();
        let back: Vec<_> = by_key.iter().map(|k| k.unpack(&narrow)).collect();
        let back_wide: Vec<_> = by_wide.iter().map(|k| k.unpack(&wide)).collect();
        assert_eq!(back, t);
        assert_eq!(back_wide, t);
        let extreme = (u32::MAX, [i32::MIN, i32::MAX, -1]);
        assert_eq!(
            u128::pack(extreme.0, extreme.1, &wide).unpack(&wide),
            extreme
        );
    }
}
