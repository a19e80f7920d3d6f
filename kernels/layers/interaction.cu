// PaiNN interaction block with the filter computed in the kernel: no [E, 3F] tensor exists.
// For edge e = (i <- j) and feature c < F, with b = basis[e] (R + 1 values ending in f_c), u the
// unit vector (basis[e, R+1..R+4]) and Wt the block's filter weights [R + 1, 3F] (last row = bias):
//   w_s, w_d, w_v = b . Wt[:, c | F+c | 2F+c]
//   x_s, x_d, x_v = (phi[j] + phi_bias)[c | F+c | 2F+c] * (w_s, w_d, w_v)
//   ds[i, c] += x_s,  dv[a, i, c] += x_d u_a + x_v v[a, j, c]
// State tensors are component-major [4N, F]: rows 0..N hold s, rows (1+a)N + n hold v_a.
// Forward: one thread per (edge, feature); adjoint: one warp per edge. Mirrors
// src/ops/interaction.rs.
#include "common.cuh"
#include "interaction.cuh"

// Adds edge e's message for feature c to atom i: the filter (ws, wd, wv) times the context of
// atom j, along the unit vector u and j's vector features.
template <typename T>
__device__ __forceinline__ void add_message(T* out, const T* phi, const T* pb, const T* sv,
                                            const T* u, T ws, T wd, T wv, size_t n, size_t f,
                                            size_t i, size_t j, size_t c) {
    const T* p = phi + j * 3 * f;
    const T xd = (p[f + c] + pb[f + c]) * wd;
    const T xv = (p[2 * f + c] + pb[2 * f + c]) * wv;
    atomicAdd(out + i * f + c, (p[c] + pb[c]) * ws);
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        const size_t row = (1 + a) * n;
        atomicAdd(out + (row + i) * f + c, xd * u[a] + xv * sv[(row + j) * f + c]);
    }
}

// The gradient arriving at edge e's message for feature c: g_a = dL/d(dv_a[i]) (gve, the whole
// dL/dv [3N, F]), and its projections on u (gxd) and on v_j (gxv).
template <typename T>
__device__ __forceinline__ void message_grad(const T* gve, const T* sv, const T* u, size_t n,
                                             size_t f, size_t i, size_t j, size_t c, T g[3],
                                             T& gxd, T& gxv) {
    gxd = gxv = T(0);
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        g[a] = gve[(a * n + i) * f + c];
        gxd += g[a] * u[a];
        gxv += g[a] * sv[((1 + a) * n + j) * f + c];
    }
}

// Forward, one thread per (edge, feature); out holds a copy of the input state sv and the
// messages are added to it with atomic adds. (Keeping each feature's filter column in registers
// over many edges, blocks of (F, edges), measured slower:
// docs/bench-log/10-fused-kernels-force-pass.md.)
template <typename T>
__device__ void interaction_fwd(const T* phi, const T* pb, const T* wt, const T* basis,
                                const T* sv, const unsigned int* ci, const unsigned int* nj,
                                T* out, size_t n_edges, size_t f, size_t n, size_t n_rbf) {
    const size_t nb = n_rbf + 1, bw = n_rbf + 4;
    FOR_EACH(k, n_edges * f) {
        const size_t e = k / f, c = k - e * f, i = ci[e], j = nj[e];
        const T* b = basis + e * bw;
        T ws = 0, wd = 0, wv = 0;
        for (size_t r = 0; r < nb; ++r) {
            const T* w = wt + r * 3 * f;
            ws += b[r] * w[c];
            wd += b[r] * w[f + c];
            wv += b[r] * w[2 * f + c];
        }
        add_message(out, phi, pb, sv, b + nb, ws, wd, wv, n, f, i, j, c);
    }
}


// Adjoint, one warp per (edge, `cpw` chunks of 32 features): lane l handles feature 32 q + l
// of each of its chunks q and its share of the edge's basis gradient in registers; a
// reduce-scatter over the warp (31 shuffles) then gives the sums, added to the edge's basis
// gradient (a store when one warp has all features). The sending atom's gradients use atomic
// adds.
// The host takes one chunk per warp for few edges (a molecule's few hundred edges as one warp
// each left most SMs idle) and all chunks per warp for many (fewer reductions and atomics),
// from the tuning's adjoint_warp_per_edge_from_edges.
// gm = dL/ds of the output [N, F], gve = its whole dL/dv [3N, F]. out is zeroed and
// packed [g_v (3NF) | g_phi (3NF) | g_basis (E (R+4))]: g_v = dL/dv[j] through the messages
// only (the identity part is added by the caller's next kernel).
template <typename T>
__device__ void interaction_adj(const T* phi, const T* pb, const T* wt, const T* basis,
                                const T* sv, const T* gm, const T* gve, const unsigned int* ci,
                                const unsigned int* nj, T* out, size_t n_edges, size_t f,
                                size_t n, size_t n_rbf, size_t cpw) {
    const size_t nb = n_rbf + 1, bw = n_rbf + 4, chunks = (f + 31) / 32;
    const size_t groups = (chunks + cpw - 1) / cpw;
    T* gv = out;
    T* gphi = out + 3 * n * f;
    T* gb = out + 6 * n * f;
    FOR_EACH(k, n_edges * groups * 32) {
        const size_t e = k / (groups * 32), lane = k % 32, i = ci[e], j = nj[e];
        const size_t q0 = (k / 32) % groups * cpw, q1 = min(chunks, q0 + cpw);
        const T* b = basis + e * bw;
        T acc[MAX_BASIS];
#pragma unroll
        for (int r = 0; r < MAX_BASIS; ++r) acc[r] = T(0);
        // Lanes past F add nothing but take part in the shuffles below.
        for (size_t c = q0 * 32 + lane; c < q1 * 32; c += 32) {
            if (c >= f) break;
            const T* p = phi + j * 3 * f;
            const T ps = p[c] + pb[c], pd = p[f + c] + pb[f + c];
            const T pv = p[2 * f + c] + pb[2 * f + c];
            const T gs = gm[i * f + c];
            T g[3], gxd, gxv;
            message_grad(gve, sv, b + nb, n, f, i, j, c, g, gxd, gxv);
            // dL/dw does not depend on w: one pass over the weights forms the filter and the
            // basis gradient together.
            const T gws = gs * ps, gwd = gxd * pd, gwv = gxv * pv;
            T ws = 0, wd = 0, wv = 0;
#pragma unroll
            for (int r = 0; r < MAX_BASIS; ++r) {
                if (r < (int)nb) {
                    const T* w = wt + r * 3 * f;
                    const T w_s = w[c], w_d = w[f + c], w_v = w[2 * f + c];
                    ws += b[r] * w_s;
                    wd += b[r] * w_d;
                    wv += b[r] * w_v;
                    acc[r] += gws * w_s + gwd * w_d + gwv * w_v;
                }
            }
            add_sender_grads(gphi, gv, g, gs, gxd, gxv, ws, wd, wv, pv * wv, n, f, j, c);
            const T xd = pd * wd;
#pragma unroll
            for (int r = 0; r < MAX_BASIS; ++r) {
                const int a = r - (int)nb;  // selected without indexing: g stays in registers
                if (a >= 0 && a < 3) acc[r] += (a == 0 ? g[0] : a == 1 ? g[1] : g[2]) * xd;
            }
        }
        // Reduce-scatter over the warp: after the step for bit b each lane keeps half of its
        // values (the upper half when its bit b is set) summed with its partner's, so lane l
        // ends with the sum of value l: 31 shuffles for 32 values instead of 5 per value.
        reduce_scatter_step<16>(acc, lane);
        reduce_scatter_step<8>(acc, lane);
        reduce_scatter_step<4>(acc, lane);
        reduce_scatter_step<2>(acc, lane);
        reduce_scatter_step<1>(acc, lane);
        // A warp holding all of the edge's features is its only writer.
        if (lane < bw) {
            if (groups == 1) gb[e * bw + lane] = acc[0];
            else atomicAdd(gb + e * bw + lane, acc[0]);
        }
    }
}

// The same two kernels with the filter rows precomputed, w = basis . Wt (cuBLAS, [E, 3F]), for
// large edge counts: no 21-term dot products per thread. The adjoint writes dL/dw [E, 3F] for
// the caller's product back to the basis, and only the unit-vector columns of dL/d(basis).
// out = [g_v (3NF) | g_phi (3NF) | g_basis (E (R+4), zeroed) | g_w (E 3F)].
// Consecutive edges one forward thread of the filter-rows kernel takes, for one feature. The
// edge lists are sorted by receiving atom, so a thread sums its edges' messages to the same
// atom in registers and adds them with one atomic per atom instead of one per edge.
#define ROWS_EDGES_PER_THREAD 8

template <typename T>
__device__ __forceinline__ void flush_message(T* out, size_t n, size_t f, size_t i, size_t c,
                                              T s, const T v[3]) {
    atomicAdd(out + i * f + c, s);
#pragma unroll
    for (int a = 0; a < 3; ++a) atomicAdd(out + ((1 + a) * n + i) * f + c, v[a]);
}

template <typename T>
__device__ void interaction_rows_fwd(const T* phi, const T* pb, const T* w, const T* basis,
                                     const T* sv, const unsigned int* ci,
                                     const unsigned int* nj, T* out, size_t n_edges, size_t f,
                                     size_t n, size_t n_rbf) {
    const size_t nb = n_rbf + 1, bw = n_rbf + 4;
    const size_t chunks = (n_edges + ROWS_EDGES_PER_THREAD - 1) / ROWS_EDGES_PER_THREAD;
    FOR_EACH(k, chunks * f) {
        const size_t q = k / f, c = k - q * f, e0 = q * ROWS_EDGES_PER_THREAD;
        const size_t e1 = min(n_edges, e0 + ROWS_EDGES_PER_THREAD);
        const T bs = pb[c], bd = pb[f + c], bv = pb[2 * f + c];
        size_t cur = ci[e0];
        T s = 0, v[3] = {0, 0, 0};
        for (size_t e = e0; e < e1; ++e) {
            const size_t i = ci[e], j = nj[e];
            if (i != cur) {
                flush_message(out, n, f, cur, c, s, v);
                cur = i;
                s = v[0] = v[1] = v[2] = 0;
            }
            const T* u = basis + e * bw + nb;
            const T* we = w + e * 3 * f;
            const T* p = phi + j * 3 * f;
            const T xd = (p[f + c] + bd) * we[f + c];
            const T xv = (p[2 * f + c] + bv) * we[2 * f + c];
            s += (p[c] + bs) * we[c];
#pragma unroll
            for (int a = 0; a < 3; ++a) v[a] += xd * u[a] + xv * sv[((1 + a) * n + j) * f + c];
        }
        flush_message(out, n, f, cur, c, s, v);
    }
}

template <typename T>
__device__ void interaction_rows_adj(const T* phi, const T* pb, const T* w, const T* basis,
                                     const T* sv, const T* gm, const T* gve,
                                     const unsigned int* ci, const unsigned int* nj, T* out,
                                     size_t n_edges, size_t f, size_t n, size_t n_rbf,
                                     size_t /* cpw: one thread per (edge, feature) here */) {
    const size_t nb = n_rbf + 1, bw = n_rbf + 4;
    T* gv = out;
    T* gphi = out + 3 * n * f;
    T* gb = out + 6 * n * f;
    T* gw = gb + n_edges * bw;
    // With F a multiple of 32 a warp holds features of one edge: per-edge sums by shuffles.
    const bool warp_edges = f % 32 == 0;
    FOR_EACH(k, n_edges * f) {
        const size_t e = k / f, c = k - e * f, i = ci[e], j = nj[e];
        const T* b = basis + e * bw;
        const T* we = w + e * 3 * f;
        const T* p = phi + j * 3 * f;
        const T ps = p[c] + pb[c], pd = p[f + c] + pb[f + c], pv = p[2 * f + c] + pb[2 * f + c];
        const T ws = we[c], wd = we[f + c], wv = we[2 * f + c];
        const T gs = gm[i * f + c];
        T g[3], gxd, gxv;
        message_grad(gve, sv, b + nb, n, f, i, j, c, g, gxd, gxv);
        add_sender_grads(gphi, gv, g, gs, gxd, gxv, ws, wd, wv, pv * wv, n, f, j, c);
        const T xd = pd * wd;
        store_filter_grads(gw + e * 3 * f, f, c, gs * ps, gxd * pd, gxv * pv);
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            T x = g[a] * xd;
            if (warp_edges) {
                x = warp_sum(x);
                if ((threadIdx.x & 31) == 0) atomicAdd(gb + e * bw + nb + a, x);
            } else {
                atomicAdd(gb + e * bw + nb + a, x);
            }
        }
    }
}

// extern "C" entry points {stem}_fwd_{f32,f64} and {stem}_adj_{f32,f64}; w is the filter
// weights [R + 1, 3F] or rows [E, 3F].
#define INTERACTION(T, S, stem)                                                              \
    extern "C" __global__ void stem##_fwd_##S(                                               \
        const T* phi, const T* pb, const T* w, const T* basis, const T* sv,                  \
        const unsigned int* ci, const unsigned int* nj, T* out, size_t n_edges, size_t f,    \
        size_t n, size_t n_rbf) {                                                            \
        stem##_fwd(phi, pb, w, basis, sv, ci, nj, out, n_edges, f, n, n_rbf);                \
    }                                                                                        \
    extern "C" __global__ void stem##_adj_##S(                                               \
        const T* phi, const T* pb, const T* w, const T* basis, const T* sv, const T* gm,     \
        const T* gve, const unsigned int* ci, const unsigned int* nj, T* out,                \
        size_t n_edges, size_t f, size_t n, size_t n_rbf, size_t cpw) {                      \
        stem##_adj(phi, pb, w, basis, sv, gm, gve, ci, nj, out, n_edges, f, n, n_rbf, cpw);  \
    }
INTERACTION(float, f32, interaction)
INTERACTION(double, f64, interaction)
INTERACTION(float, f32, interaction_rows)
INTERACTION(double, f64, interaction_rows)
