//! O(N) cell list in fractional coordinates, for molecules, orthorhombic and triclinic cells,
//! and cells narrower than the cutoff.
//!
//! Atoms are wrapped into the cell along periodic axes and binned: axis k gets about
//! `BINS_PER_CUTOFF · d_k / cutoff` bins (`ROW_BINS_PER_CUTOFF` along axis 2; d_k the
//! perpendicular width, or the extent of the atoms' bounding box along a non-periodic axis),
//! and the atoms are sorted by bin with axis 2 fastest. Around an atom the search visits the
//! "unwrapped" bins `t` within the cutoff's perpendicular reach along each axis; along periodic
//! axes `t` maps to (bin `t mod n_k`, image `floor(t / n_k)`), an injective map, so each
//! (neighbour, image) is visited once even when `n_k` is 1 or 2 and the cutoff spans several
//! cells. Along non-periodic axes out-of-range bins are skipped. Bins along axis 2 at fixed
//! bins along axes 0 and 1 (a row) are contiguous in the sorted atoms, so a row is searched as
//! one run of atoms per image, cut in an orthogonal cell to the sphere's chord over the row's
//! nearest point: fine bins along axis 2 fit the runs to the sphere at no cost per row.

use super::axis::Axis;
use super::runs::fill_in_order;
use super::sort_key::{Packing, SortKey};
use super::{edge_vector, norm2, work_threads, Geometry, NeighborList};
use crate::error::{Error, Result};
use crate::structure::Lattice;
use std::ops::Range;

/// Relative safety margin on the cutoff for binning and for the band around the cutoff in
/// which the exact test decides, far above the rounding of fractional coordinates and
/// wrapping (the band also grows with the largest coordinates; see `search_into`).
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
/// Bins per cutoff length along axes 0 and 1: finer bins fit the rows to the sphere better,
/// but a row (its bounds, its loop) costs more than the candidates finer bins save; the
/// timings of benches/harness/neighbor_list_times.rs chose this.
const BINS_PER_CUTOFF: f64 = 1.0;
/// Bins per cutoff length along axis 2, within a row: finer bins cut a row's run closer to
/// the sphere at no cost per row (a run is one range of atoms however many bins it spans).
const ROW_BINS_PER_CUTOFF: f64 = 12.0;
/// Relative non-orthogonality of the basis rows below which the search treats the cell as
/// orthogonal; far below `MARGIN`, whose slack covers the error of that treatment.
const ORTHOGONAL_TOLERANCE: f64 = 1e-12;
/// Centers the search threads take at a time: small enough that a run's edges stay in the
/// thread's cache until appended to the list, large enough that taking turns costs little.
const CENTERS_PER_RUN: usize = 512;

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

/// [`neighbor_list`] written into `out`, whose buffers are reused: a list rebuilt in place
/// (a Verlet list's) writes to memory it already holds instead of fresh pages. On an error
/// `out` is left empty.
pub fn neighbor_list_into(
    positions: &[[f64; 3]],
    cell: Option<&Lattice>,
    pbc: [bool; 3],
    cutoff: f64,
    out: &mut NeighborList,
) -> Result<()> {
    search_into(positions, cell, pbc, cutoff, None, out)
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
    let mut out = NeighborList::default();
    search_into(positions, cell, pbc, cutoff, threads, &mut out)?;
    Ok(out)
}

/// [`search`] into `out` (cleared first, its capacity kept).
fn search_into(
    positions: &[[f64; 3]],
    cell: Option<&Lattice>,
    pbc: [bool; 3],
    cutoff: f64,
    threads: Option<usize>,
    out: &mut NeighborList,
) -> Result<()> {
    out.centers.clear();
    out.neighbors.clear();
    out.shifts.clear();
    let g = Geometry::new(positions, cell, pbc, cutoff)?;
    let n = positions.len();
    if n == 0 {
        return Ok(());
    }
    let eff = cutoff * (1.0 + MARGIN);
    let c2 = cutoff * cutoff;

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

    // The search measures distances between wrapped positions, the exact test between the
    // positions as given: the two differ by rounding, a few ulps of the largest coordinates and
    // image offsets involved. Within `slack` of the cutoff the exact test decides; further in
    // or out the wrapped distance does, and the bin ranges reach beyond both.
    let max_abs = |xs: &[[f64; 3]]| (xs.iter().flatten()).fold(0.0f64, |m, x| m.max(x.abs()));
    let images: f64 = (0..3)
        .filter(|&k| g.periodic[k])
        .map(|k| {
            let row = g.basis[k].iter().fold(0.0f64, |m, x| m.max(x.abs()));
            ((4.0 * cutoff / g.widths[k]).ceil() + 2.0) * row
        })
        .sum();
    let scale = 4.0 * max_abs(positions) + 2.0 * max_abs(&wrapped) + 2.0 * images;
    let slack = 10.0 * MARGIN * cutoff + 64.0 * f64::EPSILON * scale;
    let c2_outer = (cutoff + slack).powi(2);
    let c2_inner = (cutoff - slack).max(0.0).powi(2);
    let reach = cutoff + 2.0 * slack;

    // Bins per axis (fewer where the extent is smaller than a bin).
    let bin_len = |k: usize| eff / [BINS_PER_CUTOFF, BINS_PER_CUTOFF, ROW_BINS_PER_CUTOFF][k];
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
        let bins = (extent / bin_len(k)).floor();
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
    let axes: [Axis; 3] = std::array::from_fn(|k| Axis::new(&g, k, nb[k], lo[k], span[k], reach));

    // Counting sort of the atoms by bin (stable: within a bin, by index).
    let bin_coords: Vec<[f64; 3]> = (frac.iter())
        .map(|s| std::array::from_fn(|k| axes[k].coord(s[k])))
        .collect();
    let flat = |u: &[f64; 3]| {
        let b: [usize; 3] = std::array::from_fn(|k| axes[k].bin_of(u[k]));
        (b[0] * nb[1] + b[1]) * nb[2] + b[2]
    };
    let nbins = nb[0] * nb[1] * nb[2];
    let bins: Vec<usize> = bin_coords.iter().map(flat).collect();
    let mut start = vec![0usize; nbins + 1];
    for &b in &bins {
        start[b + 1] += 1;
    }
    for t in 0..nbins {
        start[t + 1] += start[t];
    }
    let mut fill = start.clone();
    let mut order = vec![0u32; n];
    for (i, &b) in bins.iter().enumerate() {
        order[fill[b]] = i as u32;
        fill[b] += 1;
    }
    // What the search reads of a candidate, in bin order: the search walks runs of these.
    let sorted_wrapped: Vec<[f64; 3]> = order.iter().map(|&j| wrapped[j as usize]).collect();
    let sorted: Vec<Candidate> = (order.iter())
        .map(|&j| Candidate {
            wrap: wrap[j as usize],
            index: j,
        })
        .collect();
    let sorted_positions: Vec<[f64; 3]> = order.iter().map(|&j| positions[j as usize]).collect();

    // Reserve the expected number of edges (n · density · sphere) when the atoms fill a
    // fully periodic cell: growing millions of edges by doubling is a large part of the time.
    let per_center = if g.periodic == [true; 3] {
        let vol = crate::structure::volume(&g.basis).abs();
        n as f64 / vol * (4.0 / 3.0 * std::f64::consts::PI * c2 * cutoff)
    } else {
        0.0
    };

    // Range of every shift component, to pack (neighbor, shift) into a u32 or u64 sort key
    // when the ranges are small (always, unless atoms lie very far outside the cell).
    let mut packing = Packing {
        lo: [i64::from(i32::MIN); 3],
        bits: [32; 3],
    };
    let mut total_bits = 0;
    for k in 0..3 {
        let (img_lo, img_hi) = axes[k].image_range(reach);
        let w_lo = wrap.iter().map(|w| i64::from(w[k])).min().unwrap_or(0);
        let w_hi = wrap.iter().map(|w| i64::from(w[k])).max().unwrap_or(0);
        let lo_k = img_lo + w_lo - w_hi;
        let width = (img_hi + w_hi - w_lo) - lo_k + 1;
        packing.lo[k] = lo_k;
        packing.bits[k] = 64 - ((width - 1) as u64).leading_zeros();
        total_bits += packing.bits[k];
    }
    let grid = Grid {
        cell: &g.cell,
        basis: &g.basis,
        orthogonal: is_orthogonal(&g.basis),
        axes,
        nb,
        bin_coords: &bin_coords,
        start: &start,
        sorted_wrapped: &sorted_wrapped,
        sorted: &sorted,
        sorted_positions: &sorted_positions,
        wrapped: &wrapped,
        positions,
        wrap: &wrap,
        reach,
        c2,
        c2_inner,
        c2_outer,
        per_center,
    };
    let threads = threads.unwrap_or_else(|| work_threads(n, MIN_CENTERS_PER_THREAD));
    let index_bits = 32 - (n as u32 - 1).leading_zeros();
    if index_bits + total_bits < 32 {
        grid.fill_on::<u32>(&packing, threads, out);
    } else if total_bits <= 32 {
        grid.fill_on::<u64>(&packing, threads, out);
    } else {
        let wide = Packing {
            lo: [i64::from(i32::MIN); 3],
            bits: [32; 3],
        };
        grid.fill_on::<u128>(&wide, threads, out);
    }
    Ok(())
}

/// True when the basis rows are orthogonal to far below the margins: then the perpendicular
/// gaps along the three axes are orthogonal components of an edge, and their squares add up.
fn is_orthogonal(b: &Lattice) -> bool {
    let len = |v: &[f64; 3]| norm2(v).sqrt();
    [(0, 1), (0, 2), (1, 2)].iter().all(|&(p, q)| {
        let d = b[p][0] * b[q][0] + b[p][1] * b[q][1] + b[p][2] * b[q][2];
        d.abs() <= ORTHOGONAL_TOLERANCE * len(&b[p]) * len(&b[q])
    })
}

/// One slab of bins along axis 0 or 1 around a center: its bin, its image, the image's
/// offset (image · basis row) and the squared perpendicular distance from the center to it.
#[derive(Clone, Copy, Debug)]
struct Slab {
    bin: usize,
    image: i32,
    offset: [f64; 3],
    gap2: f64,
}

/// A center's search results, reused from center to center.
struct Found<K> {
    /// Offsets in the run and wrapped squared distances of the candidates that passed the
    /// loose test (written past the count too: the buffer holds a whole run).
    hits: Vec<(u32, f64)>,
    /// The edges' sort keys.
    keys: Vec<K>,
}

impl<K> Default for Found<K> {
    fn default() -> Self {
        Self {
            hits: Vec::new(),
            keys: Vec::new(),
        }
    }
}

/// What the search reads of a binned atom that passed the loose test.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    /// Cell vectors removed by the wrap.
    wrap: [i32; 3],
    index: u32,
}

/// The binned atoms, ready for the search.
struct Grid<'a> {
    cell: &'a Lattice,
    basis: &'a Lattice,
    orthogonal: bool,
    axes: [Axis; 3],
    nb: [usize; 3],
    /// Bin coordinates of every atom, by index.
    bin_coords: &'a [[f64; 3]],
    /// Start of every flat bin in the sorted atoms, and the end.
    start: &'a [usize],
    /// Wrapped positions of the sorted atoms (the binned ones), for the first, loose test.
    sorted_wrapped: &'a [[f64; 3]],
    sorted: &'a [Candidate],
    /// Positions as given of the sorted atoms, for the exact test.
    sorted_positions: &'a [[f64; 3]],
    wrapped: &'a [[f64; 3]],
    positions: &'a [[f64; 3]],
    wrap: &'a [[i32; 3]],
    /// The cutoff with the margin of the bin ranges, Å.
    reach: f64,
    c2: f64,
    /// Squared wrapped distances below which a pair is an edge, and at or above which it is
    /// not; in between, the exact test decides.
    c2_inner: f64,
    c2_outer: f64,
    /// Expected edges per center (0: no estimate), to size the buffers.
    per_center: f64,
}

impl Grid<'_> {
    /// [`fill`](Self::fill) for every center, on `threads` threads that take runs of
    /// [`CENTERS_PER_RUN`] centers in turn: the edges are the one-thread list exactly.
    fn fill_on<K: SortKey>(&self, packing: &Packing, threads: usize, out: &mut NeighborList) {
        let n = self.bin_coords.len();
        let expected = (1.1 * self.per_center * n as f64) as usize;
        out.centers.reserve(expected);
        out.neighbors.reserve(expected);
        out.shifts.reserve(expected);
        fill_in_order(n, CENTERS_PER_RUN, threads, out, |centers, part| {
            self.fill::<K>(packing, centers, part)
        });
    }

    /// Appends the edges of `centers` in order, each center's sorted by (neighbor, shift).
    ///
    /// Around a center, rows of bins along axis 2 (fixed bins along axes 0 and 1) are
    /// contiguous in `sorted`, so each row is one or a few runs of candidates (one per image).
    /// Rows whose perpendicular gap exceeds the cutoff are skipped, and in an orthogonal cell
    /// each row's span is cut to the sphere's chord over the row's nearest point.
    fn fill<K: SortKey>(&self, packing: &Packing, centers: Range<usize>, out: &mut NeighborList) {
        let [a0, a1, a2] = self.axes;
        let nb = self.nb;
        let reach2 = self.reach * self.reach;
        // Reused from center to center: no allocation per center or per edge.
        let mut slabs: [Vec<Slab>; 2] = Default::default();
        let mut found = Found::<K>::default();
        for i in centers {
            let u = self.bin_coords[i];
            for (k, (axis, slabs)) in [a0, a1].iter().zip(slabs.iter_mut()).enumerate() {
                slabs.clear();
                let (lo, hi) = axis.range(u[k], self.reach);
                for t in lo..=hi {
                    let gap = axis.gap(u[k], t);
                    if gap * gap > reach2 {
                        continue;
                    }
                    let (bin, image) = axis.split(t);
                    let (f, v) = (image as f64, self.basis[k]);
                    slabs.push(Slab {
                        bin: bin as usize,
                        image: image as i32,
                        offset: [v[0] * f, v[1] * f, v[2] * f],
                        gap2: gap * gap,
                    });
                }
            }
            let xi = self.wrapped[i];
            let b2 = self.basis[2];
            found.keys.clear();
            for s0 in &slabs[0] {
                for s1 in &slabs[1] {
                    let h = if self.orthogonal {
                        let rest = reach2 - s0.gap2 - s1.gap2;
                        if rest < 0.0 {
                            continue;
                        }
                        rest.sqrt()
                    } else {
                        self.reach
                    };
                    let base = (s0.bin * nb[1] + s1.bin) * nb[2];
                    let (v0, v1) = (s0.offset, s1.offset);
                    let c01: [f64; 3] = std::array::from_fn(|d| xi[d] - v0[d] - v1[d]);
                    let (lo, hi) = a2.range(u[2], h);
                    let mut t = lo;
                    while t <= hi {
                        let (bin, i2) = a2.split(t);
                        // The run ends where the image changes or the range does.
                        let last = hi.min(t + (a2.nb - 1 - bin));
                        let end_bin = (bin + (last - t)) as usize;
                        t = last + 1;
                        let run = self.start[base + bin as usize]..self.start[base + end_bin + 1];
                        if !run.is_empty() {
                            // x_j + image·basis - x_i = x_j - ci
                            let f = i2 as f64;
                            let ci = std::array::from_fn(|d| c01[d] - f * b2[d]);
                            let image = [s0.image, s1.image, i2 as i32];
                            self.search_run(i, run, ci, image, packing, &mut found);
                        }
                    }
                }
            }
            let keys = &mut found.keys;
            keys.sort_unstable();
            out.centers
                .extend(std::iter::repeat_n(i as u32, keys.len()));
            (out.neighbors).extend(keys.iter().map(|key| key.unpack(packing).0));
            (out.shifts).extend(keys.iter().map(|key| key.unpack(packing).1));
        }
    }

    /// Appends to `found` the edges from center `i` to the sorted atoms `run`, seen through
    /// `image` (`ci`: the center's wrapped position less the image's offset).
    fn search_run<K: SortKey>(
        &self,
        i: usize,
        run: Range<usize>,
        ci: [f64; 3],
        image: [i32; 3],
        packing: &Packing,
        found: &mut Found<K>,
    ) {
        // The loose test without branches (about half the candidates pass, at random): the
        // offsets and distances of those that pass, then the shifts and keys of these.
        let xs = &self.sorted_wrapped[run.clone()];
        if found.hits.len() < xs.len() {
            found.hits.resize(xs.len(), (0, 0.0));
        }
        let mut hits = 0;
        for (jj, xj) in xs.iter().enumerate() {
            let d = [xj[0] - ci[0], xj[1] - ci[1], xj[2] - ci[2]];
            let d2 = norm2(&d);
            found.hits[hits] = (jj as u32, d2);
            hits += usize::from(d2 < self.c2_outer);
        }
        let wi = self.wrap[i];
        for &(jj, d2) in &found.hits[..hits] {
            let jj = run.start + jj as usize;
            let Candidate { wrap: wj, index: j } = self.sorted[jj];
            if j as usize == i && image == [0, 0, 0] {
                continue;
            }
            // The shift for the positions as given, and near the cutoff the exact, canonical
            // test.
            let s: [i32; 3] = std::array::from_fn(|d| image[d] + wi[d] - wj[d]);
            if d2 < self.c2_inner || {
                let v = edge_vector(&self.positions[i], &self.sorted_positions[jj], s, self.cell);
                norm2(&v) < self.c2
            } {
                found.keys.push(K::pack(j, s, packing));
            }
        }
    }
}

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
}
