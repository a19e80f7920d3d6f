//! The CPU twin of kernels/neighbors.cu: the same operations in the same order.

use super::step::GEOMETRY_LEN;

/// One list's constants.
pub(super) struct Twin<'a> {
    pub g: &'a [f64; GEOMETRY_LEN],
    pub n: usize,
    pub periodic: bool,
    pub cut2: f64,
    /// Each atom's candidate neighbours `spans[2i]..spans[2i + 1]` (its system in a batch);
    /// all atoms without.
    pub spans: Option<&'a [u32]>,
}

fn dot3(a: [f64; 3], b: &[f64]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

impl Twin<'_> {
    /// Image shift of pair i <- j and whether it is an edge.
    fn pair(&self, x: &[f64], i: usize, j: usize) -> (bool, [i32; 3]) {
        let d = [
            x[3 * j] - x[3 * i],
            x[3 * j + 1] - x[3 * i + 1],
            x[3 * j + 2] - x[3 * i + 2],
        ];
        let mut s = [0i32; 3];
        if self.periodic {
            for (k, sk) in s.iter_mut().enumerate() {
                if self.g[27 + k] != 0.0 {
                    *sk = -(dot3(d, &self.g[3 * k..3 * k + 3]).round() as i32);
                }
            }
        }
        if i == j && s == [0; 3] {
            return (false, s);
        }
        let mut v = d;
        for (k, &sk) in s.iter().enumerate() {
            if sk != 0 {
                for (c, vc) in v.iter_mut().enumerate() {
                    *vc += sk as f64 * self.g[18 + 3 * k + c];
                }
            }
        }
        (v[0] * v[0] + v[1] * v[1] + v[2] * v[2] < self.cut2, s)
    }

    pub fn wrap(&self, x: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; x.len()];
        for (xi, oi) in x.chunks_exact(3).zip(out.chunks_exact_mut(3)) {
            let mut f = [0.0; 3];
            for (k, fk) in f.iter_mut().enumerate() {
                *fk = dot3([xi[0], xi[1], xi[2]], &self.g[3 * k..3 * k + 3]);
                if self.g[27 + k] != 0.0 {
                    *fk -= fk.floor();
                }
            }
            for (c, oc) in oi.iter_mut().enumerate() {
                let mut o = 0.0;
                for (k, fk) in f.iter().enumerate() {
                    o += fk * self.g[9 + 3 * k + c];
                }
                *oc = o;
            }
        }
        out
    }

    fn candidates(&self, i: usize) -> std::ops::Range<usize> {
        match self.spans {
            Some(s) => s[2 * i] as usize..s[2 * i + 1] as usize,
            None => 0..self.n,
        }
    }

    pub fn count(&self, x: &[f64]) -> Vec<u32> {
        (0..self.n)
            .map(|i| self.candidates(i).filter(|&j| self.pair(x, i, j).0).count() as u32)
            .collect()
    }

    pub fn fill(&self, x: &[f64], scan: &[u32], capacity: usize) -> Vec<u32> {
        slots(scan, capacity, self.n, |i| {
            (self.candidates(i).filter(|&j| self.pair(x, i, j).0))
                .map(|j| j as u32)
                .collect()
        })
    }

    /// Each atom's slots of a built list (`scan`, `neighbors`, f64 `off`sets) whose pair
    /// is still within the cutoff at `x`.
    pub fn kept(&self, x: &[f64], scan: &[u32], neighbors: &[u32], off: &[f64]) -> Vec<Vec<usize>> {
        (0..self.n)
            .map(|i| {
                (scan[i] as usize..scan[i + 1] as usize)
                    .filter(|&k| {
                        let j = neighbors[k] as usize;
                        let v: [f64; 3] =
                            std::array::from_fn(|c| x[3 * j + c] - x[3 * i + c] + off[3 * k + c]);
                        v[0] * v[0] + v[1] * v[1] + v[2] * v[2] < self.cut2
                    })
                    .collect()
            })
            .collect()
    }

    pub fn offsets(
        &self,
        x: &[f64],
        scan: &[u32],
        edges: &[u32],
        capacity: usize,
        pad: f64,
    ) -> Vec<f64> {
        let n = self.n;
        let total = if scan[n + 1] != 0 {
            0
        } else {
            scan[n] as usize
        };
        let mut out = Vec::with_capacity(3 * capacity);
        for k in 0..capacity {
            if k >= total {
                out.extend([pad, 0.0, 0.0]);
                continue;
            }
            let (i, j) = (edges[k] as usize, edges[capacity + k] as usize);
            let (_, s) = self.pair(x, i, j);
            for c in 0..3 {
                let mut o = 0.0;
                if s != [0; 3] {
                    for (kk, &sk) in s.iter().enumerate() {
                        o += sk as f64 * self.g[18 + 3 * kk + c];
                    }
                }
                out.push(o);
            }
        }
        out
    }
}

/// The binned steps: kernels/neighbors.cu's traversal of the bins around each atom.
impl Twin<'_> {
    /// Atom i's bin along axis k (`grid`: bins, lo, inv per axis).
    fn bin_axis(&self, x: &[f64], i: usize, grid: &[f64], k: usize) -> u32 {
        let mut u = dot3(
            [x[3 * i], x[3 * i + 1], x[3 * i + 2]],
            &self.g[3 * k..3 * k + 3],
        );
        if self.g[27 + k] != 0.0 {
            u -= u.floor();
        }
        let t = ((u - grid[3 + k]) * grid[6 + k]).floor();
        let t = if t >= 0.0 { t } else { 0.0 };
        t.min(grid[k] - 1.0) as u32
    }

    pub fn bin_of(&self, x: &[f64], grid: &[f64]) -> Vec<u32> {
        let (nb1, nb2) = (grid[1] as u32, grid[2] as u32);
        (0..self.n)
            .map(|i| {
                let b: [u32; 3] = std::array::from_fn(|k| self.bin_axis(x, i, grid, k));
                (b[0] * nb1 + b[1]) * nb2 + b[2]
            })
            .collect()
    }

    /// Atom i's candidates: the atoms of its own and the adjacent bins, in traversal order.
    fn binned_candidates(&self, grid: &[f64], bins: &Placed, i: usize) -> Vec<usize> {
        let nb: [u32; 3] = std::array::from_fn(|k| grid[k] as u32);
        let own = bins.bin[i];
        let b = [own / (nb[1] * nb[2]), (own / nb[2]) % nb[1], own % nb[2]];
        let next = |k: usize, d: i64| next_bin(b[k], d, nb[k], self.g[27 + k] != 0.0);
        let mut out = Vec::new();
        for d0 in -1..=1 {
            let Some(c0) = next(0, d0) else { continue };
            for d1 in -1..=1 {
                let Some(c1) = next(1, d1) else { continue };
                for d2 in -1..=1 {
                    let Some(c2) = next(2, d2) else { continue };
                    let c = ((c0 * nb[1] + c1) * nb[2] + c2) as usize;
                    let slots = bins.scan[c] as usize..bins.scan[c + 1] as usize;
                    out.extend(slots.map(|k| bins.atoms[k] as usize));
                }
            }
        }
        out
    }

    fn binned_edges(&self, x: &[f64], grid: &[f64], bins: &Placed, i: usize) -> Vec<u32> {
        let mut edges: Vec<u32> = (self.binned_candidates(grid, bins, i).into_iter())
            .filter(|&j| self.pair(x, i, j).0)
            .map(|j| j as u32)
            .collect();
        edges.sort_unstable();
        edges
    }

    pub fn count_binned(&self, x: &[f64], grid: &[f64], bins: &Placed) -> Vec<u32> {
        (0..self.n)
            .map(|i| self.binned_edges(x, grid, bins, i).len() as u32)
            .collect()
    }

    pub fn fill_binned(
        &self,
        x: &[f64],
        grid: &[f64],
        bins: &Placed,
        scan: &[u32],
        capacity: usize,
    ) -> Vec<u32> {
        slots(scan, capacity, self.n, |i| {
            self.binned_edges(x, grid, bins, i)
        })
    }
}

/// The atoms sorted into bins: each atom's bin, the bins' scan, the atoms in bin order.
pub(super) struct Placed {
    pub bin: Vec<u32>,
    pub scan: Vec<u32>,
    pub atoms: Vec<u32>,
}

/// The bin `d` away from `b` along an axis of `nb` bins, as kernels/neighbors.cu next_bin.
fn next_bin(b: u32, d: i64, nb: u32, periodic: bool) -> Option<u32> {
    let t = b as i64 + d;
    if periodic {
        if (nb == 1 && d != 0) || (nb == 2 && d == 1) {
            return None;
        }
        return Some((t + nb as i64).rem_euclid(nb as i64) as u32);
    }
    (0..nb as i64).contains(&t).then_some(t as u32)
}

/// Centers (out[0..capacity]) and neighbours (out[capacity..2 capacity]) of every slot: atom
/// i's `edges(i)` from its first slot (`scan`), then padding, atom k mod n to itself; an
/// overflowed list (`scan[n + 1]`) is padding only.
fn slots(scan: &[u32], capacity: usize, n: usize, edges: impl Fn(usize) -> Vec<u32>) -> Vec<u32> {
    let mut out = vec![0u32; 2 * capacity];
    let overflow = scan[n + 1] != 0;
    let total = if overflow { 0 } else { scan[n] as usize };
    if !overflow {
        for (i, &start) in scan[..n].iter().enumerate() {
            for (slot, j) in (start as usize..).zip(edges(i)) {
                out[slot] = i as u32;
                out[capacity + slot] = j;
            }
        }
    }
    for k in total..capacity {
        let a = ((k - total) % n) as u32;
        out[k] = a;
        out[capacity + k] = a;
    }
    out
}

/// Atoms per bin.
pub(super) fn bin_count(bin: &[u32], bins: usize) -> Vec<u32> {
    let mut counts = vec![0u32; bins];
    for &b in bin {
        counts[b as usize] += 1;
    }
    counts
}

/// The atoms at their bins' slots (in increasing order within a bin: the kernel's order
/// there is any), then each bin's count (the kernel's cursors).
pub(super) fn bin_place(bin: &[u32], bscan: &[u32], bins: usize) -> Vec<u32> {
    let n = bin.len();
    let mut out = vec![0u32; n + bins];
    for (i, &b) in bin.iter().enumerate() {
        let b = b as usize;
        let slot = bscan[b] as usize + out[n + b] as usize;
        out[slot] = i as u32;
        out[n + b] += 1;
    }
    out
}

/// The kept slots ([`Twin::kept`]) at their new places (`kept_scan`): [centers |
/// neighbours | slot in the old list], each `edges` long.
pub(super) fn prune_fill(
    kept: &[Vec<usize>],
    neighbors: &[u32],
    kept_scan: &[u32],
    edges: usize,
) -> Vec<u32> {
    let mut out = vec![0u32; 3 * edges];
    for (i, (slots, &start)) in kept.iter().zip(kept_scan).enumerate() {
        for (s, &k) in (start as usize..).zip(slots) {
            out[s] = i as u32;
            out[edges + s] = neighbors[k];
            out[2 * edges + s] = k as u32;
        }
    }
    out
}

/// Exclusive prefix sum, then the edge count (saturated) and the overflow flag.
pub(super) fn scan(counts: &[u32], capacity: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(counts.len() + 2);
    let mut total = 0u64;
    for &c in counts {
        out.push(total as u32);
        total += c as u64;
    }
    out.push(total.min(u32::MAX as u64) as u32);
    out.push(u32::from(total > capacity as u64));
    out
}
