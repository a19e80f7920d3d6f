//! The one-launch kernels' CPU twin: the forward and explicit adjoint of `model::fused`,
//! written out as plain loops over the packed weights; the CPU path of every one-launch op and
//! the oracle of their CUDA tests.

use super::packed::ModelShape;
use crate::ops::launch::Real;
use crate::ops::layers::edge_basis::{basis_width, Geometry};
use crate::ops::layers::update::NORM_EPS;

/// Forces [N, 3] then energies [N] into `out` by the CPU twin, for float inputs positions,
/// offsets, packed weights (`x`) and species, centers, neighbours (`idx`): the CPU path of
/// every one-kernel op.
pub(crate) fn cpu_twin<T: Real>(m: &ModelShape, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
    let n = idx[0].len();
    let (forces, rest) = out.split_at_mut(3 * n);
    let reference = Reference {
        m,
        pos: x[0],
        off: x[1],
        w: x[2],
        species: idx[0],
        centers: idx[1],
        neighbors: idx[2],
    };
    reference.run(forces, &mut rest[..n]);
}

/// The CPU twin: the forward and explicit adjoint of `model::fused`, written out.
struct Reference<'a, T> {
    m: &'a ModelShape,
    pos: &'a [T],
    off: &'a [T],
    w: &'a [T],
    species: &'a [u32],
    centers: &'a [u32],
    neighbors: &'a [u32],
}

/// x [rows, k] · wt [k, m] (+ bias) → [rows, m].
fn linear<T: Real>(x: &[T], k: usize, wt: &[T], m: usize, bias: Option<&[T]>) -> Vec<T> {
    let rows = x.len() / k;
    let mut y = vec![T::zero(); rows * m];
    for r in 0..rows {
        let yr = &mut y[r * m..(r + 1) * m];
        if let Some(b) = bias {
            yr.copy_from_slice(&b[..m]);
        }
        for (i, &xi) in x[r * k..(r + 1) * k].iter().enumerate() {
            for (yo, &wo) in yr.iter_mut().zip(&wt[i * m..(i + 1) * m]) {
                *yo += xi * wo;
            }
        }
    }
    y
}

/// g [rows, m] · wtᵀ for wt [k, m] → [rows, k]: the adjoint of [`linear`].
fn linear_adjoint<T: Real>(g: &[T], m: usize, wt: &[T], k: usize) -> Vec<T> {
    let rows = g.len() / m;
    let mut x = vec![T::zero(); rows * k];
    for r in 0..rows {
        for i in 0..k {
            let w = &wt[i * m..(i + 1) * m];
            x[r * k + i] = g[r * m..(r + 1) * m]
                .iter()
                .zip(w)
                .fold(T::zero(), |a, (&gv, &wv)| a + gv * wv);
        }
    }
    x
}

fn sigmoid<T: Real>(z: T) -> T {
    T::one() / (T::one() + (-z).exp())
}

fn silu<T: Real>(z: T) -> T {
    z * sigmoid(z)
}

fn silu_grad<T: Real>(z: T) -> T {
    let s = sigmoid(z);
    s * (T::one() + z * (T::one() - s))
}

/// What one block's adjoint reads from its forward.
struct BlockTape<T> {
    v_in: Vec<T>,
    h1: Vec<T>,
    phi: Vec<T>,
    mixed: Vec<T>,
    nrm: Vec<T>,
    cpre: Vec<T>,
    act: Vec<T>,
}

impl<T: Real> Reference<'_, T> {
    fn edges(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (self.centers.iter().zip(self.neighbors).enumerate())
            .map(|(e, (&i, &j))| (i as usize, j as usize, e))
    }

    /// Block `b`'s filter row (3F values) for edge basis `g`.
    fn filter(&self, b: &[T], g: &[T]) -> Vec<T> {
        let (f3, r) = (3 * self.m.hidden, self.m.n_rbf);
        let mut w = vec![T::zero(); f3];
        for (k, &gk) in g[..=r].iter().enumerate() {
            for (wo, &fo) in w.iter_mut().zip(&b[k * f3..(k + 1) * f3]) {
                *wo += gk * fo;
            }
        }
        w
    }

    fn run(&self, forces: &mut [T], energies: &mut [T]) {
        let m = self.m;
        let (n, f, r) = (self.species.len(), m.hidden, m.n_rbf);
        let (f3, h2, bw, nf) = (3 * f, f / 2, basis_width(r), n * f);
        let geo = Geometry {
            n_edges: self.centers.len(),
            n_rbf: r,
            cutoff: m.cutoff,
        };
        let mut basis = vec![T::zero(); geo.n_edges * bw];
        for ed in self.edges() {
            geo.basis(
                self.pos,
                self.off,
                ed,
                &mut basis[ed.2 * bw..(ed.2 + 1) * bw],
            );
        }
        let emb = &self.w[..m.elements * f];
        let atom_const = &self.w[m.elements * f..m.elements * (f + 1)];
        let ro_w = &self.w[m.elements * (f + 1)..];
        let (ro_b, ro_out) = (&ro_w[f * h2..], &ro_w[f * h2 + h2..]);
        let bo = m.block();
        let block_w = |b: usize| &ro_w[f * h2 + 2 * h2 + b * bo.len..];
        let phi_of_element = block_w(m.blocks);

        let mut s: Vec<T> = (self.species.iter())
            .flat_map(|&z| emb[z as usize * f..(z as usize + 1) * f].iter().copied())
            .collect();
        let mut v = vec![T::zero(); 3 * nf];
        let mut tape = Vec::with_capacity(m.blocks);
        for b in 0..m.blocks {
            let w = block_w(b);
            let (h1, phi) = match b {
                // The first block's φ from the element table, as the kernel takes it.
                0 => (
                    Vec::new(),
                    (self.species.iter())
                        .flat_map(|&z| &phi_of_element[z as usize * f3..(z as usize + 1) * f3])
                        .copied()
                        .collect(),
                ),
                _ => {
                    let h1 = linear(&s, f, &w[bo.w1..], f, Some(&w[bo.b1..]));
                    let act1: Vec<T> = h1.iter().map(|&z| silu(z)).collect();
                    let phi = linear(&act1, f, &w[bo.w2..], f3, Some(&w[bo.b2..]));
                    (h1, phi)
                }
            };
            let (mut ms, mut mv) = (s.clone(), v.clone());
            for (i, j, e) in self.edges() {
                let g = &basis[e * bw..(e + 1) * bw];
                let wf = self.filter(&w[bo.filter..], g);
                for t in 0..f {
                    let p = &phi[j * f3 + t..];
                    let (x0, x1, x2) = (p[0] * wf[t], p[f] * wf[f + t], p[2 * f] * wf[2 * f + t]);
                    ms[i * f + t] += x0;
                    for k in 0..3 {
                        mv[(i * 3 + k) * f + t] += x1 * g[r + 1 + k] + x2 * v[(j * 3 + k) * f + t];
                    }
                }
            }
            let mixed = linear(&mv, f, &w[bo.mix..], 2 * f, None);
            let mut nrm = vec![T::zero(); nf];
            let mut ctx = vec![T::zero(); 2 * nf];
            for a in 0..n {
                for t in 0..f {
                    let mut q = T::of(NORM_EPS);
                    for k in 0..3 {
                        let vv = mixed[(a * 3 + k) * 2 * f + f + t];
                        q += vv * vv;
                    }
                    nrm[a * f + t] = q.sqrt();
                    ctx[a * 2 * f + t] = ms[a * f + t];
                    ctx[a * 2 * f + f + t] = q.sqrt();
                }
            }
            let cpre = linear(&ctx, 2 * f, &w[bo.c1..], f, Some(&w[bo.cb1..]));
            let act2: Vec<T> = cpre.iter().map(|&z| silu(z)).collect();
            let act = linear(&act2, f, &w[bo.c2..], f3, Some(&w[bo.cb2..]));
            for a in 0..n {
                for t in 0..f {
                    let aa = &act[a * f3 + t..];
                    let mut dot = T::zero();
                    for k in 0..3 {
                        let mx = &mixed[(a * 3 + k) * 2 * f + t..];
                        dot += mx[0] * mx[f];
                        mv[(a * 3 + k) * f + t] += mx[0] * aa[f];
                    }
                    ms[a * f + t] += aa[0] + aa[2 * f] * dot;
                }
            }
            let v_in = std::mem::replace(&mut v, mv);
            s = ms;
            tape.push(BlockTape {
                v_in,
                h1,
                phi,
                mixed,
                nrm,
                cpre,
                act,
            });
        }

        // Readout and its adjoint.
        let ro = linear(&s, f, ro_w, h2, Some(ro_b));
        let mut g_ro = vec![T::zero(); n * h2];
        for a in 0..n {
            let mut en = atom_const[self.species[a] as usize];
            for o in 0..h2 {
                en += silu(ro[a * h2 + o]) * ro_out[o];
                g_ro[a * h2 + o] = ro_out[o] * silu_grad(ro[a * h2 + o]);
            }
            energies[a] = en;
        }
        let mut gs = linear_adjoint(&g_ro, h2, ro_w, f);
        let mut gv = vec![T::zero(); 3 * nf];
        let mut gbasis = vec![T::zero(); geo.n_edges * bw];
        for (b, t) in tape.iter().enumerate().rev() {
            let w = block_w(b);
            let mut g_act = vec![T::zero(); n * f3];
            let mut g_mixed = vec![T::zero(); 6 * nf];
            for a in 0..n {
                for c in 0..f {
                    let aa = &t.act[a * f3 + c..];
                    let g_s = gs[a * f + c];
                    let (mut dot, mut g_avv) = (T::zero(), T::zero());
                    for k in 0..3 {
                        let mx = &t.mixed[(a * 3 + k) * 2 * f + c..];
                        dot += mx[0] * mx[f];
                        g_avv += gv[(a * 3 + k) * f + c] * mx[0];
                    }
                    g_act[a * f3 + c] = g_s;
                    g_act[a * f3 + f + c] = g_avv;
                    g_act[a * f3 + 2 * f + c] = g_s * dot;
                    let g_dot = g_s * aa[2 * f];
                    for k in 0..3 {
                        let o = (a * 3 + k) * 2 * f + c;
                        g_mixed[o] = gv[(a * 3 + k) * f + c] * aa[f] + g_dot * t.mixed[o + f];
                        g_mixed[o + f] = g_dot * t.mixed[o];
                    }
                }
            }
            let mut g_cpre = linear_adjoint(&g_act, f3, &w[bo.c2..], f);
            for (g, &z) in g_cpre.iter_mut().zip(&t.cpre) {
                *g *= silu_grad(z);
            }
            let g_ctx = linear_adjoint(&g_cpre, f, &w[bo.c1..], 2 * f);
            for a in 0..n {
                for c in 0..f {
                    gs[a * f + c] += g_ctx[a * 2 * f + c];
                    let inv = g_ctx[a * 2 * f + f + c] / t.nrm[a * f + c];
                    for k in 0..3 {
                        let o = (a * 3 + k) * 2 * f + f + c;
                        g_mixed[o] += inv * t.mixed[o];
                    }
                }
            }
            for (g, d) in gv
                .iter_mut()
                .zip(linear_adjoint(&g_mixed, 2 * f, &w[bo.mix..], f))
            {
                *g += d;
            }
            let mut g_phi = vec![T::zero(); n * f3];
            let mut g_vj = vec![T::zero(); 3 * nf];
            let wfb = &w[bo.filter..];
            for (i, j, e) in self.edges() {
                let g = &basis[e * bw..(e + 1) * bw];
                let wf = self.filter(wfb, g);
                let ge = &mut gbasis[e * bw..(e + 1) * bw];
                for c in 0..f {
                    let p = &t.phi[j * f3 + c..];
                    let gvi: [T; 3] = std::array::from_fn(|k| gv[(i * 3 + k) * f + c]);
                    let vj: [T; 3] = std::array::from_fn(|k| t.v_in[(j * 3 + k) * f + c]);
                    let gx0 = gs[i * f + c];
                    let gx1 = (0..3).fold(T::zero(), |s, k| s + gvi[k] * g[r + 1 + k]);
                    let gx2 = (0..3).fold(T::zero(), |s, k| s + gvi[k] * vj[k]);
                    g_phi[j * f3 + c] += gx0 * wf[c];
                    g_phi[j * f3 + f + c] += gx1 * wf[f + c];
                    g_phi[j * f3 + 2 * f + c] += gx2 * wf[2 * f + c];
                    for k in 0..3 {
                        g_vj[(j * 3 + k) * f + c] += gvi[k] * p[2 * f] * wf[2 * f + c];
                        ge[r + 1 + k] += gvi[k] * p[f] * wf[f + c];
                    }
                    let gw = [gx0 * p[0], gx1 * p[f], gx2 * p[2 * f]];
                    for (k, gk) in ge[..=r].iter_mut().enumerate() {
                        let row = &wfb[k * f3..];
                        *gk += gw[0] * row[c] + gw[1] * row[f + c] + gw[2] * row[2 * f + c];
                    }
                }
            }
            for (g, d) in gv.iter_mut().zip(g_vj) {
                *g += d;
            }
            if b > 0 {
                let mut g_h = linear_adjoint(&g_phi, f3, &w[bo.w2..], f);
                for (g, &z) in g_h.iter_mut().zip(&t.h1) {
                    *g *= silu_grad(z);
                }
                for (g, d) in gs.iter_mut().zip(linear_adjoint(&g_h, f, &w[bo.w1..], f)) {
                    *g += d;
                }
            }
        }
        for (i, j, e) in self.edges() {
            let gr = geo.grad(self.pos, self.off, (i, j, e), &gbasis[e * bw..(e + 1) * bw]);
            for a in 0..3 {
                forces[3 * j + a] -= gr[a];
                forces[3 * i + a] += gr[a];
            }
        }
    }
}
