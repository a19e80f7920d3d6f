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
        let n = self.n;
        let mut out = vec![0u32; 2 * capacity];
        let overflow = scan[n + 1] != 0;
        let total = if overflow { 0 } else { scan[n] as usize };
        if !overflow {
            for (i, &start) in scan[..n].iter().enumerate() {
                let edges = self.candidates(i).filter(|&j| self.pair(x, i, j).0);
                for (slot, j) in (start as usize..).zip(edges) {
                    out[slot] = i as u32;
                    out[capacity + slot] = j as u32;
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
