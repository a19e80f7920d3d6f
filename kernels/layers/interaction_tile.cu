// The PaiNN interaction with the filter formed in the kernel, tiled for many edges: the same
// maths as interaction_fwd (kernels/layers/interaction.cu, whose comments define it) without an
// [E, 3F] tensor, and the adjoint of interaction_rows_adj with the filter formed here instead of
// read from rows (it still writes dL/dw as rows, for the caller's product back to the basis;
// for the weights' gradient it sums dL/dW = Σ_e basis_e dL/dw_e itself, with no rows).
//
// A block of TILE_F threads owns TILE_F features (chunk blockIdx.y) and walks tiles of TILE_E
// consecutive edges (grid-stride over blockIdx.x). It stages its features' filter weights in
// shared memory once, [R + 1][3][TILE_F] (thread t reads column t: no bank conflicts), and each
// tile's basis transposed, [R + 4][TILE_E + 4] (a column of consecutive edges is one vector
// load, the same address for every thread). Each thread forms its feature's filters of TILE_G
// edges at once: per basis column two vector loads and three weight loads for 24 FMAs (the
// untiled kernel: one load per FMA). Edge lists are sorted by receiving atom, so the receiver's
// values are kept in registers over a run of edges (sums in the forward, output gradients in
// the adjoint) and touched once per run; any order is correct. For lists that hold every
// edge's reverse, tile_sym_adj computes each edge's terms on its reverse, so that the senders'
// gradients are sums over runs too.
// Mirrors src/ops/layers/interaction_tile.rs (the CPU twins are src/ops/layers/interaction.rs's).
#include "common.cuh"
#include "interaction.cuh"
#include "f16_split.cuh"
#include "tf32.cuh"

#define TILE_F 128
#define TILE_E 64
#define TILE_G 8
// Row stride of the transposed basis: 16-byte aligned rows that start on different banks.
#define TILE_SB (TILE_E + 4)
#define NO_ATOM 0xffffffffu

namespace {

// v[0..8) = p[0..8), p 16-byte aligned in shared memory.
__device__ __forceinline__ void load8(const float* p, float v[8]) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
    v[7] = b.w;
}
__device__ __forceinline__ void load8(const double* p, double v[8]) {
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
        const double2 a = *reinterpret_cast<const double2*>(p + k);
        v[k] = a.x, v[k + 1] = a.y;
    }
}
// Shared memory of a block: transposed basis, weights, (adjoint) per-edge sums, (reducing
// adjoint) the block's dL/d(filter weights), then the tile's edge indices.
template <typename T>
struct Tile {
    T* sb;          // [bw][TILE_SB]
    T* sw;          // [nb][3][TILE_F]
    T* sg;          // [TILE_E][3], adjoint only: unit-vector columns of dL/d(basis)
    T* sw_grad;     // [nb][3][TILE_F], reducing adjoint only: column t is thread t's own
    unsigned* si;   // [TILE_E]
    unsigned* sj;   // [TILE_E]
    size_t c;       // this thread's feature
    bool active;    // c < F
    T bias[3];      // φ's last bias for c: s, d and v parts
    // Lays out the shared memory and stages the block's weights (features from
    // blockIdx.y TILE_F); loads the thread's bias; zeroes its column of the weights' gradient
    // where `reduce` (only this thread touches it: no barrier).
    __device__ Tile(const T* wt, const T* pb, size_t nb, size_t bw, size_t f, bool adjoint,
                    bool reduce = false) {
        extern __shared__ __align__(16) unsigned char tile_smem[];
        sb = reinterpret_cast<T*>(tile_smem);
        sw = sb + bw * TILE_SB;
        sg = sw + nb * 3 * TILE_F;
        sw_grad = sg + (adjoint ? TILE_E * 3 : 0);
        si = reinterpret_cast<unsigned*>(sw_grad + (reduce ? nb * 3 * TILE_F : 0));
        sj = si + TILE_E;
        if (reduce) {
            for (size_t rp = 0; rp < nb * 3; ++rp) sw_grad[rp * TILE_F + threadIdx.x] = T(0);
        }
        const size_t c0 = blockIdx.y * TILE_F;
        c = c0 + threadIdx.x;
        active = c < f;
#pragma unroll
        for (int p = 0; p < 3; ++p) bias[p] = active ? pb[p * f + c] : T(0);
        stage_weights(wt, nb, f, c0);
    }
    // This block's weight columns [c0, c0 + TILE_F) of wt [nb, 3F]; zero past F.
    __device__ void stage_weights(const T* wt, size_t nb, size_t f, size_t c0) {
        for (size_t k = threadIdx.x; k < nb * 3 * TILE_F; k += TILE_F) {
            const size_t t = k % TILE_F, rp = k / TILE_F, c = c0 + t;
            sw[k] = c < f ? wt[(rp / 3) * 3 * f + (rp % 3) * f + c] : T(0);
        }
    }
    // Edges [e0, e0 + cnt): basis columns transposed (zero past cnt) and indices.
    __device__ void stage_edges(const T* basis, const unsigned* ci, const unsigned* nj,
                                size_t e0, size_t cnt, size_t bw) {
        for (size_t k = threadIdx.x; k < TILE_E * bw; k += TILE_F) {
            const size_t m = k / bw, col = k - m * bw;
            sb[col * TILE_SB + m] = m < cnt ? basis[(e0 + m) * bw + col] : T(0);
        }
        for (size_t m = threadIdx.x; m < TILE_E; m += TILE_F) {
            si[m] = m < cnt ? ci[e0 + m] : NO_ATOM;
            sj[m] = m < cnt ? nj[e0 + m] : 0;
        }
    }
    // The adjoint's tile: staged edges and zeroed unit-vector sums, between two barriers.
    __device__ void begin_adjoint_tile(const T* basis, const unsigned* ci, const unsigned* nj,
                                       size_t e0, size_t cnt, size_t bw) {
        __syncthreads();  // the previous tile's sums are stored
        stage_edges(basis, ci, nj, e0, cnt, bw);
        for (size_t k = threadIdx.x; k < TILE_E * 3; k += TILE_F) sg[k] = T(0);
        __syncthreads();
    }
    // Adds this thread's share of staged edge m's unit-vector gradient (every lane calls it).
    __device__ __forceinline__ void add_unit_grads(const T gu[3], size_t m) {
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            const T x = warp_sum(gu[a]);
            if (threadIdx.x % 32 == 0) atomicAdd(sg + m * 3 + a, x);
        }
    }
    // Stores (one feature chunk) or adds (several) the tile's unit-vector sums to g_basis, and
    // where given the rows of `prev` (the later blocks' sum) to all its columns.
    __device__ void end_adjoint_tile(T* gb, const T* prev, size_t e0, size_t cnt, size_t nb,
                                     size_t bw) {
        __syncthreads();
        const bool alone = gridDim.y == 1;  // one feature chunk: this block's sums are final
        const T* before = prev && blockIdx.y == 0 ? prev + e0 * bw : nullptr;
        const size_t from = before ? 0 : nb;  // columns written
        for (size_t k = threadIdx.x; k < cnt * (bw - from); k += TILE_F) {
            const size_t m = k / (bw - from), col = from + k % (bw - from);
            T v = col >= nb ? sg[m * 3 + col - nb] : T(0);
            if (before) v += before[m * bw + col];
            T* to = gb + (e0 + m) * bw + col;
            if (alone) *to = v;
            else atomicAdd(to, v);
        }
    }
    __device__ T w(size_t r, int p) const { return sw[(r * 3 + p) * TILE_F + threadIdx.x]; }
    // Adds staged edges [g, g + TILE_G)'s dL/dw (this thread's feature; zero past the tile's
    // end, where the staged basis is zero too) times their basis rows to the block's dL/dW:
    // per basis row two vector loads and 24 FMAs, as the filters are formed.
    __device__ __forceinline__ void add_weight_grads(size_t g, size_t nb, const T gw[TILE_G][3]) {
        for (size_t r = 0; r < nb; ++r) {
            T b[TILE_G];
            load8(sb + r * TILE_SB + g, b);
            T sum[3] = {0, 0, 0};
#pragma unroll
            for (int k = 0; k < TILE_G; ++k) {
#pragma unroll
                for (int p = 0; p < 3; ++p) sum[p] += b[k] * gw[k][p];
            }
#pragma unroll
            for (int p = 0; p < 3; ++p) sw_grad[(r * 3 + p) * TILE_F + threadIdx.x] += sum[p];
        }
    }
    // Adds the block's dL/dW (this thread's feature) to gW [nb, 3F].
    __device__ void flush_weight_grads(T* gW, size_t nb, size_t f) const {
        if (!active) return;
        for (size_t r = 0; r < nb; ++r) {
#pragma unroll
            for (int p = 0; p < 3; ++p) {
                atomicAdd(gW + r * 3 * f + p * f + c, sw_grad[(r * 3 + p) * TILE_F + threadIdx.x]);
            }
        }
    }
    // This thread's feature of the filters (s, d, v parts) of staged edges [g, g + TILE_G).
    __device__ __forceinline__ void filters(size_t g, size_t nb, T fs[TILE_G], T fd[TILE_G],
                                            T fv[TILE_G]) const {
#pragma unroll
        for (int k = 0; k < TILE_G; ++k) fs[k] = fd[k] = fv[k] = T(0);
        for (size_t r = 0; r < nb; ++r) {
            T b[TILE_G];
            load8(sb + r * TILE_SB + g, b);
            const T w_s = w(r, 0), w_d = w(r, 1), w_v = w(r, 2);
#pragma unroll
            for (int k = 0; k < TILE_G; ++k) {
                fs[k] += b[k] * w_s;
                fd[k] += b[k] * w_d;
                fv[k] += b[k] * w_v;
            }
        }
    }
};

// The sending atoms' context (φ_j + bias) and vector features, this thread's feature, for the
// staged edges [g, g + TILE_G): loaded before the filters are formed, so that the 48 gathers
// are in flight together and their latency hides behind that arithmetic. Edges past the tile's
// end read atom 0 (staged so) and are not used.
template <typename T>
struct Senders {
    T ctx[3][TILE_G], vec[3][TILE_G];
    __device__ __forceinline__ void load(const unsigned* sj, const T* __restrict__ phi,
                                         const T* __restrict__ sv, const T bias[3], size_t g,
                                         size_t n, size_t f, size_t c) {
#pragma unroll
        for (int k = 0; k < TILE_G; ++k) {
            const size_t j = sj[g + k];
#pragma unroll
            for (int p = 0; p < 3; ++p) {
                ctx[p][k] = __ldg(phi + j * 3 * f + p * f + c) + bias[p];
                vec[p][k] = __ldg(sv + ((1 + p) * n + j) * f + c);
            }
        }
    }
};

// The forward's sums for one receiving atom (a run of edges) and this thread's feature.
template <typename T>
struct Run {
    unsigned atom = NO_ATOM;
    T s = 0, v[3] = {0, 0, 0};
    // Adds the sums into the atom's outputs and zeroes them.
    __device__ __forceinline__ void flush(T* out, size_t n, size_t f, size_t c) {
        if (atom == NO_ATOM) return;
        atomicAdd(out + atom * f + c, s);
#pragma unroll
        for (int a = 0; a < 3; ++a) atomicAdd(out + ((1 + a) * n + atom) * f + c, v[a]);
        s = v[0] = v[1] = v[2] = T(0);
    }
};

// Adds staged edges [g, g + TILE_G) below cnt to the run's sums, flushing the run where the
// receiving atom changes: filter(k, p) is part p (s, d, v) of edge g + k's filter (this
// thread's feature), unit(m, a) staged edge m's unit vector.
template <typename T, typename From, typename Filter, typename Unit>
__device__ __forceinline__ void add_messages(const From& from, const unsigned* si, size_t g,
                                             size_t cnt, Filter filter, Unit unit, T* out,
                                             size_t n, size_t f, size_t c, Run<T>& run) {
#pragma unroll
    for (int k = 0; k < TILE_G; ++k) {
        const size_t m = g + k;
        if (m >= cnt) break;
        const unsigned i = si[m];
        if (i != run.atom) {
            run.flush(out, n, f, c);
            run.atom = i;
        }
        const T xd = from.ctx[1][k] * filter(k, 1), xv = from.ctx[2][k] * filter(k, 2);
        run.s += from.ctx[0][k] * filter(k, 0);
#pragma unroll
        for (int a = 0; a < 3; ++a) run.v[a] += xd * unit(m, a) + xv * from.vec[a][k];
    }
}

template <typename T>
__device__ void tile_fwd(const T* __restrict__ phi, const T* __restrict__ pb,
                         const T* __restrict__ wt, const T* __restrict__ basis,
                         const T* __restrict__ sv, const unsigned* __restrict__ ci,
                         const unsigned* __restrict__ nj, T* __restrict__ out, size_t n_edges,
                         size_t f, size_t n, size_t n_rbf) {
    const size_t nb = n_rbf + 1, bw = n_rbf + 4;
    Tile<T> t(wt, pb, nb, bw, f, false);
    const size_t c = t.c;
    Run<T> run;
    for (size_t e0 = blockIdx.x * (size_t)TILE_E; e0 < n_edges; e0 += gridDim.x * (size_t)TILE_E) {
        const size_t cnt = min((size_t)TILE_E, n_edges - e0);
        __syncthreads();  // the previous tile is done with the staged edges
        t.stage_edges(basis, ci, nj, e0, cnt, bw);
        __syncthreads();
        if (!t.active) continue;
        for (size_t g = 0; g < cnt; g += TILE_G) {
            Senders<T> from;
            from.load(t.sj, phi, sv, t.bias, g, n, f, c);
            T fs[TILE_G], fd[TILE_G], fv[TILE_G];
            t.filters(g, nb, fs, fd, fv);
            auto filter = [&](int k, int p) { return p == 0 ? fs[k] : p == 1 ? fd[k] : fv[k]; };
            auto unit = [&](size_t m, int a) { return t.sb[(nb + a) * TILE_SB + m]; };
            add_messages(from, t.si, g, cnt, filter, unit, out, n, f, c, run);
        }
    }
    if (t.active) run.flush(out, n, f, c);
}

// The adjoints' output [g_v (3NF) | g_phi (3NF) | g_basis (E (R + 4)) | g_w], g_w the rows
// dL/dw (E 3F) or, reducing, dL/dW (nb 3F) summed over the edges.
template <typename T>
struct AdjointOut {
    T *gv, *gphi, *gb, *gw;
    __device__ AdjointOut(T* out, size_t n, size_t f, size_t n_edges, size_t bw)
        : gv(out), gphi(out + 3 * n * f), gb(out + 6 * n * f),
          gw(out + 6 * n * f + n_edges * bw) {}
};

// Walks the block's tiles of edges for an adjoint: stages each tile; per TILE_G edges calls
// gather(g0) (which issues the edges' loads) before forming their filters, then, for each edge
// m of the tile (edge e of the list), edge(pre, k, m, e, fs, fd, fv, gu, gw) on the active
// threads, and sums the unit-vector gradients gu over the block into g_basis. The edges' dL/dw
// gw go to their rows of o.gw, or (reduce) times their basis rows into the block's dL/dW. The
// loop over k stops at the same edge for the whole block (cnt is uniform), so every lane
// reaches the warp sums.
template <typename T, typename Gather, typename Edge>
__device__ __forceinline__ void walk_adjoint(Tile<T>& t, const T* basis, const unsigned* ci,
                                             const unsigned* nj, size_t n_edges, size_t nb,
                                             size_t bw, size_t f, const AdjointOut<T>& o,
                                             const T* gb_prev, bool reduce, Gather gather,
                                             Edge edge) {
    for (size_t e0 = blockIdx.x * (size_t)TILE_E; e0 < n_edges; e0 += gridDim.x * (size_t)TILE_E) {
        const size_t cnt = min((size_t)TILE_E, n_edges - e0);
        t.begin_adjoint_tile(basis, ci, nj, e0, cnt, bw);
        for (size_t g0 = 0; g0 < cnt; g0 += TILE_G) {
            const auto pre = gather(g0);
            T fs[TILE_G], fd[TILE_G], fv[TILE_G];
            t.filters(g0, nb, fs, fd, fv);
            T gw[TILE_G][3];
#pragma unroll
            for (int k = 0; k < TILE_G; ++k) gw[k][0] = gw[k][1] = gw[k][2] = T(0);
#pragma unroll
            for (int k = 0; k < TILE_G; ++k) {
                const size_t m = g0 + k;
                if (m >= cnt) break;
                T gu[3] = {0, 0, 0};
                if (t.active) {
                    edge(pre, k, m, e0 + m, fs[k], fd[k], fv[k], gu, gw[k]);
                    if (!reduce) {
                        store_filter_grads(o.gw + (e0 + m) * 3 * f, f, t.c, gw[k][0], gw[k][1],
                                           gw[k][2]);
                    }
                }
                t.add_unit_grads(gu, m);
            }
            if (reduce && t.active) t.add_weight_grads(g0, nb, gw);
        }
        t.end_adjoint_tile(o.gb, gb_prev, e0, cnt, nb, bw);
    }
    if (reduce) t.flush_weight_grads(o.gw, nb, f);
}

// Adjoint; out = [g_v (3NF) | g_phi (3NF) | g_basis (E (R + 4)) | g_w (E 3F)] with the first
// three zeroed, as interaction_rows_adj writes it: the filter is formed here (TILE_G edges at
// once, as in the forward) instead of read from rows, dL/dw is written as rows for the caller's
// product back to the basis (a matrix product does that reduction over 3F far faster than
// per-edge sums over the features, as a version doing it here with a reduce-scatter per warp
// measured: docs/bench-log/16-tiled-interaction.md), and of dL/d(basis)
// only the unit-vector columns are summed here (over the block's warps in shared memory).
template <typename T>
__device__ void tile_adj(const T* __restrict__ phi, const T* __restrict__ pb,
                         const T* __restrict__ wt, const T* __restrict__ basis,
                         const T* __restrict__ sv, const T* __restrict__ gm,
                         const T* __restrict__ gve, const unsigned* __restrict__ ci,
                         const unsigned* __restrict__ nj, T* __restrict__ out, size_t n_edges,
                         size_t f, size_t n, size_t n_rbf,
                         size_t /* cpw: not used by the tiled kernel */, bool reduce) {
    const size_t nb = n_rbf + 1, bw = n_rbf + 4;
    Tile<T> t(wt, pb, nb, bw, f, true, reduce);
    const size_t c = t.c;
    const AdjointOut<T> o(out, n, f, n_edges, bw);
    // The receiving atom's output gradients: dL/ds_i and dL/dv_i (with the mixing term).
    unsigned cur = NO_ATOM;
    T gs = 0, g[3] = {0, 0, 0};
    auto gather = [&](size_t g0) {
        Senders<T> from;
        if (t.active) from.load(t.sj, phi, sv, t.bias, g0, n, f, c);
        return from;
    };
    auto edge = [&](const Senders<T>& from, int k, size_t m, size_t, T ws, T wd, T wv, T gu[3],
                    T gw[3]) {
        const unsigned i = t.si[m];
        const size_t j = t.sj[m];
        if (i != cur) {
            cur = i;
            gs = gm[i * f + c];
#pragma unroll
            for (int a = 0; a < 3; ++a) g[a] = gve[(a * n + i) * f + c];
        }
        const T ps = from.ctx[0][k], pd = from.ctx[1][k], pv = from.ctx[2][k];
        T gxd = 0, gxv = 0;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            gxd += g[a] * t.sb[(nb + a) * TILE_SB + m];
            gxv += g[a] * from.vec[a][k];
        }
        add_sender_grads(o.gphi, o.gv, g, gs, gxd, gxv, ws, wd, wv, pv * wv, n, f, j, c);
        gw[0] = gs * ps;
        gw[1] = gxd * pd;
        gw[2] = gxv * pv;
#pragma unroll
        for (int a = 0; a < 3; ++a) gu[a] = g[a] * (pd * wd);
    };
    walk_adjoint(t, basis, ci, nj, n_edges, nb, bw, f, o, (const T*)nullptr, reduce, gather,
                 edge);
}

// The output gradients of the atoms at the far end of staged edges [g, g + TILE_G), this
// thread's feature: dL/ds (gs [N, F]) and dL/dv with the mixing term (gv [3N, F], summed by the
// caller), gathered before the filters are formed (as Senders).
template <typename T>
struct Others {
    T gs[TILE_G], g[3][TILE_G];
    __device__ __forceinline__ void load(const unsigned* sj, const T* __restrict__ gs_in,
                                         const T* __restrict__ gv, size_t g0, size_t n,
                                         size_t f, size_t c) {
#pragma unroll
        for (int k = 0; k < TILE_G; ++k) {
            const size_t i = sj[g0 + k];
            gs[k] = __ldg(gs_in + i * f + c);
#pragma unroll
            for (int a = 0; a < 3; ++a) g[a][k] = __ldg(gv + (a * n + i) * f + c);
        }
    }
};

// Adds a run's sums to its atom j's gradients dL/dφ_j and dL/dv_j, and zeroes them.
template <typename T>
__device__ __forceinline__ void flush_own(T* gphi, T* gv, size_t n, size_t f, unsigned j,
                                          size_t c, T sum_phi[3], T sum_v[3]) {
    if (j == NO_ATOM) return;
#pragma unroll
    for (int p = 0; p < 3; ++p) {
        atomicAdd(gphi + j * 3 * f + p * f + c, sum_phi[p]);
        atomicAdd(gv + (p * n + j) * f + c, sum_v[p]);
        sum_phi[p] = sum_v[p] = T(0);
    }
}

// Adjoint for symmetric edge lists (every edge i <- j with offset o has its reverse j <- i with
// offset -o, as neighbour lists hold them), same out as tile_adj: edge j <- i computes the terms
// of its reverse i <- j, whose sender j is its own receiving atom. j's gradients dL/dφ_j, dL/dv_j
// are then sums over j's run of edges, kept in registers and added once per run, instead of six
// atomic adds per edge and feature; the far atom i's output gradients are gathered instead. The
// reverse edge has the same length, hence the same filter: its dL/dw goes to this edge's row,
// and its dL/du (its u is minus this edge's) with the sign flipped to this edge's unit-vector
// columns, so edge_basis_adjoint gives the standard adjoint's position gradients. Here gm is
// dL/ds only [N, F] and gve the whole dL/dv [3N, F] (src/ops/layers/interaction.rs AdjointMode).
template <typename T>
__device__ void tile_sym_adj(const T* __restrict__ phi, const T* __restrict__ pb,
                             const T* __restrict__ wt, const T* __restrict__ basis,
                             const T* __restrict__ sv, const T* __restrict__ gm,
                             const T* __restrict__ gve, const T* __restrict__ gb_prev,
                             const unsigned* __restrict__ ci, const unsigned* __restrict__ nj,
                             T* __restrict__ out, size_t n_edges, size_t f, size_t n,
                             size_t n_rbf, bool reduce) {
    const size_t nb = n_rbf + 1, bw = n_rbf + 4;
    Tile<T> t(wt, pb, nb, bw, f, true, reduce);
    const size_t c = t.c;
    const AdjointOut<T> o(out, n, f, n_edges, bw);
    // The run's atom j: its context and vectors, and its gradients' sums.
    unsigned cur = NO_ATOM;
    T ctx[3] = {0, 0, 0}, vec[3] = {0, 0, 0}, sum_phi[3] = {0, 0, 0}, sum_v[3] = {0, 0, 0};
    auto gather = [&](size_t g0) {
        Others<T> far;
        if (t.active) far.load(t.sj, gm, gve, g0, n, f, c);
        return far;
    };
    auto edge = [&](const Others<T>& far, int k, size_t m, size_t, T ws, T wd, T wv, T gu[3],
                    T gw[3]) {
        const unsigned j = t.si[m];
        if (j != cur) {
            flush_own(o.gphi, o.gv, n, f, cur, c, sum_phi, sum_v);
            cur = j;
#pragma unroll
            for (int p = 0; p < 3; ++p) {
                ctx[p] = phi[j * 3 * f + p * f + c] + t.bias[p];
                vec[p] = sv[((1 + p) * n + j) * f + c];
            }
        }
        T gxd = 0, gxv = 0;  // with the reverse edge's unit vector, -u
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            gxd -= far.g[a][k] * t.sb[(nb + a) * TILE_SB + m];
            gxv += far.g[a][k] * vec[a];
        }
        sum_phi[0] += far.gs[k] * ws;
        sum_phi[1] += gxd * wd;
        sum_phi[2] += gxv * wv;
        const T xv = ctx[2] * wv, xd = ctx[1] * wd;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            sum_v[a] += far.g[a][k] * xv;
            gu[a] = -far.g[a][k] * xd;
        }
        gw[0] = far.gs[k] * ctx[0];
        gw[1] = gxd * ctx[1];
        gw[2] = gxv * ctx[2];
    };
    walk_adjoint(t, basis, ci, nj, n_edges, nb, bw, f, o, gb_prev, reduce, gather, edge);
    if (t.active) flush_own(o.gphi, o.gv, n, f, cur, c, sum_phi, sum_v);
}

}  // namespace

#include "interaction_tc_kernels.cuh"
#include "interaction_frag.cuh"

// The CUDA-core forward, interaction_tile_cc_fwd: f64, and f32 where the tensor-core kernels
// do not run (src/ops/layers/interaction_tile.rs); interaction_tile_fwd_f32 is tc_fwd.
#define TILE_FWD(NAME, T)                                                                    \
    extern "C" __global__ void __launch_bounds__(TILE_F) NAME(                               \
        const T* phi, const T* pb, const T* w, const T* basis, const T* sv,                  \
        const unsigned int* ci, const unsigned int* nj, T* out, size_t n_edges, size_t f,    \
        size_t n, size_t n_rbf) {                                                            \
        wait_for_previous_kernel();                                                          \
        tile_fwd(phi, pb, w, basis, sv, ci, nj, out, n_edges, f, n, n_rbf);                  \
    }
TILE_FWD(interaction_tile_cc_fwd_f64, double)
TILE_FWD(interaction_tile_cc_fwd_f32, float)
// The CUDA-core symmetric adjoint (dL/dw as rows, or reduce: dL/dW summed in the kernel),
// interaction_tile_cc_sym_adj: f64, and f32 where the tensor-core kernels do not run or the
// weights' gradient is asked for; interaction_tile_sym_adj_f32 is tc_sym_adj.
// accumulate: gb_prev is added to g_basis (else it is not read).
#define TILE_SYM_ADJ(NAME, T)                                                                \
    extern "C" __global__ void __launch_bounds__(TILE_F) NAME(                               \
        const T* phi, const T* pb, const T* w, const T* basis, const T* sv, const T* gm,     \
        const T* gve, const T* gb_prev, const unsigned int* ci, const unsigned int* nj,      \
        T* out, size_t n_edges, size_t f, size_t n, size_t n_rbf, size_t accumulate,         \
        size_t reduce) {                                                                     \
        wait_for_previous_kernel();                                                           \
        tile_sym_adj(phi, pb, w, basis, sv, gm, gve, accumulate ? gb_prev : nullptr, ci, nj,  \
                     out, n_edges, f, n, n_rbf, reduce != 0);                                \
    }
TILE_SYM_ADJ(interaction_tile_cc_sym_adj_f64, double)
TILE_SYM_ADJ(interaction_tile_cc_sym_adj_f32, float)

#define INTERACTION_TILE(T, S)                                                               \
    extern "C" __global__ void __launch_bounds__(TILE_F) interaction_tile_adj_##S(            \
        const T* phi, const T* pb, const T* w, const T* basis, const T* sv, const T* gm,     \
        const T* gve, const unsigned int* ci, const unsigned int* nj, T* out,                \
        size_t n_edges, size_t f, size_t n, size_t n_rbf, size_t cpw, size_t reduce) {       \
        wait_for_previous_kernel();                                                          \
        tile_adj(phi, pb, w, basis, sv, gm, gve, ci, nj, out, n_edges, f, n, n_rbf, cpw,     \
                 reduce != 0);                                                               \
    }
INTERACTION_TILE(float, f32)
INTERACTION_TILE(double, f64)
