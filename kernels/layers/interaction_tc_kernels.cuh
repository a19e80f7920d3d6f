// The tensor-core interaction's kernels: the senders' and far atoms' rows of a tile, the forward
// and the symmetric adjoint, and their entries (the tile: kernels/layers/interaction_tc.cuh).
// Included by kernels/layers/interaction_tile.cu after the pieces it shares; not compiled on
// its own.
#pragma once

#include "interaction_tc.cuh"

// The sending atoms' context (φ_j + bias) and vector features of staged edges [g, g + TILE_G),
// this thread's feature: phi [N, 3F], v[q] the state's vector rows q ([N, F] each). Offsets are
// 32-bit element counts from the arrays' starts (an address is then two instructions from a
// uniform base, not four from a 64-bit offset; 4NF < 2^32), the context's three parts one
// offset with constant steps.
template <typename Tile>
struct TcSenders {
    float ctx[3][TILE_G], vec[3][TILE_G];
    __device__ __forceinline__ void load(const Tile& t, const float* __restrict__ phi,
                                         const float* const (&v)[3], unsigned g) {
        const unsigned fk = t.features();
#pragma unroll
        for (int k = 0; k < TILE_G; ++k) {
            const unsigned j = t.sj[g + k], o = j * fk + t.c;
            const float* p = phi + (3 * j * fk + t.c);
#pragma unroll
            for (int q = 0; q < 3; ++q) {
                ctx[q][k] = __ldg(p + q * fk) + t.bias[q];
                vec[q][k] = __ldg(v[q] + o);
            }
        }
    }
};

// The far atoms' output gradients of staged edges [g, g + TILE_G), this thread's feature:
// gs = dL/ds [N, F], gv[a] = dL/dv's rows a ([N, F] each, mixing term added); offsets as in
// TcSenders.
template <typename Tile>
struct TcOthers {
    float gs[TILE_G], g[3][TILE_G];
    __device__ __forceinline__ void load(const Tile& t, const float* __restrict__ gs_in,
                                         const float* const (&gv)[3], unsigned g0) {
        const unsigned fk = t.features();
#pragma unroll
        for (int k = 0; k < TILE_G; ++k) {
            const unsigned o = t.sj[g0 + k] * fk + t.c;
            gs[k] = __ldg(gs_in + o);
#pragma unroll
            for (int a = 0; a < 3; ++a) g[a][k] = __ldg(gv[a] + o);
        }
    }
};

// tile_fwd (same arguments and output) with the filters from tensor cores; blocks of
// TC_THREADS threads, chunks of CW features.
template <int FC, int CW = TILE_F, bool SWZ = false, int KS = 0>
__device__ void tc_fwd(const float* __restrict__ phi, const float* __restrict__ pb,
                       const float* __restrict__ wt, const float* __restrict__ basis,
                       const float* __restrict__ sv, const unsigned* __restrict__ ci,
                       const unsigned* __restrict__ nj, float* __restrict__ out, size_t n_edges,
                       size_t f, size_t n, size_t n_rbf) {
    using Tile = TcTile<FC, false, CW, SWZ, KS>;
    Tile t(wt, pb, n_rbf + 1, n_rbf + 4, f);  // the model's weights, staged
    wait_for_previous_kernel();
    const unsigned nf = n * t.features(), first = 16 * t.group;
    const float* const vec[3] = {sv + nf, sv + 2 * (size_t)nf, sv + 3 * (size_t)nf};
    Run<float> run;
    auto unit = [&](size_t m, int a) { return t.unit(m, a); };
    t.walk(basis, ci, nj, n_edges, [&](size_t, unsigned cnt) {
        t.form_filters();
        __syncwarp();
        if (!t.active) return;
        for (unsigned g = first; g < first + 16 && g < cnt; g += TILE_G) {
            TcSenders<Tile> from;
            from.load(t, phi, vec, g);
            auto filter = [&](int k, int p) { return *t.slot(g + k, p); };
            add_messages(from, t.si, g, cnt, filter, unit, out, n, f, t.c, run);
        }
    });
    if (t.active) run.flush(out, n, f, t.c);
}

// tile_sym_adj (same inputs) with the filters from tensor cores and dL/d(basis) summed here:
// each thread overwrites its filters of a tile in shared memory with its dL/dw, and the second
// product gives the tile's dL/d(basis) rows (plus gb_prev's where given). out = [g_v (3NF) |
// g_phi (3NF) | g_basis (E (R + 4))], zeroed.
template <int FC, int CW = TILE_F, bool SWZ = false, int KS = 0, bool HALF = false>
__device__ void tc_sym_adj(const float* __restrict__ phi, const float* __restrict__ pb,
                           const float* __restrict__ wt, const float* __restrict__ basis,
                           const float* __restrict__ sv, const float* __restrict__ gm,
                           const float* __restrict__ gve, const float* __restrict__ gb_prev,
                           const unsigned* __restrict__ ci, const unsigned* __restrict__ nj,
                           float* __restrict__ out, size_t n_edges, size_t f, size_t n,
                           size_t n_rbf) {
    static_assert(!HALF || (FC == CW && !SWZ), "split-f16 rows: one chunk, unswizzled");
    using Tile = TcTile<FC, false, CW, SWZ, KS, HALF>;
    Tile t(wt, pb, n_rbf + 1, n_rbf + 4, f);  // the model's weights, staged
    wait_for_previous_kernel();
    const unsigned fk = t.features(), nf = n * fk, first = 16 * t.group;
    // HALF: the bits of the largest magnitude of each of the warp's 16 edges' dL/dw over its
    // columns (basis_grads_h). Rows past the tile's end keep older values: their dL/dw are 0.
    // (Kept here by one lane rather than by the two lanes of each edge's fragment rows in
    // registers: fewer instructions in the entry, and shorter launches.)
    unsigned* dw_largest = nullptr;
    if constexpr (HALF) {
        __shared__ unsigned largest[TC_THREADS / 32][16];
        dw_largest = largest[threadIdx.x / 32];
    }
    float *gphi = out + 3 * (size_t)nf, *gb = out + 6 * (size_t)nf;
    const float* const gv[3] = {gve, gve + nf, gve + 2 * (size_t)nf};
    // The run's atom j: its context and vectors, and its gradients' sums.
    unsigned cur = NO_ATOM;
    float ctx[3] = {0, 0, 0}, vec[3] = {0, 0, 0}, sum_phi[3] = {0, 0, 0}, sum_v[3] = {0, 0, 0};
    // j becomes the run's atom: the previous run's sums added, j's values loaded.
    auto own = [&](unsigned j) {
        if (j == cur) return;
        flush_own(gphi, out, n, f, cur, t.c, sum_phi, sum_v);
        cur = j;
#pragma unroll
        for (int p = 0; p < 3; ++p) {
            ctx[p] = phi[j * 3 * fk + p * fk + t.c] + t.bias[p];
            vec[p] = sv[(1 + p) * nf + j * fk + t.c];
        }
    };
    // Staged edge m's terms (k of its group) for the run's atom.
    auto terms = [&](const TcOthers<Tile>& far, int k, unsigned m, float gu[3][TILE_G]) {
        float *ws = t.slot(m, 0), *wd = t.slot(m, 1), *wv = t.slot(m, 2);
        float gxd = 0, gxv = 0;  // with the reverse edge's unit vector, -u
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            gxd -= far.g[a][k] * t.unit(m, a);
            gxv += far.g[a][k] * vec[a];
        }
        sum_phi[0] += far.gs[k] * *ws;
        sum_phi[1] += gxd * *wd;
        sum_phi[2] += gxv * *wv;
        const float xv = ctx[2] * *wv, xd = ctx[1] * *wd;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            sum_v[a] += far.g[a][k] * xv;
            gu[a][k] = -far.g[a][k] * xd;
        }
        *ws = far.gs[k] * ctx[0];  // the filter's slot now holds dL/dw
        *wd = gxd * ctx[1];
        *wv = gxv * ctx[2];
        if constexpr (HALF) {  // (every lane is here: one chunk, all active)
            const float own = fmaxf(fmaxf(fabsf(far.gs[k] * ctx[0]), fabsf(gxd * ctx[1])),
                                    fabsf(gxv * ctx[2]));
            const unsigned big = __reduce_max_sync(0xffffffffu, __float_as_uint(own));
            if (t.lane == 0) dw_largest[m - first] = big;
        }
    };
    t.walk(basis, ci, nj, n_edges, [&](size_t e0, unsigned cnt) {
        t.fetch_prev(gb_prev, e0, cnt);
        if constexpr (HALF) t.form_filters_h();
        else t.form_filters();
        __syncwarp();
        // Where a group's edges have one atom (sorted lists: most groups), it takes a path
        // without a branch per edge, so that the compiler can interleave its edges. (Asked of
        // each group of 8 rather than of the warp's 16 edges: at liquid densities over a
        // quarter of the warps had taken the per-edge path.)
        for (unsigned g = first; g < first + 16 && g < cnt; g += TILE_G) {
            const unsigned run = t.group_atom(g, cnt);
            TcOthers<Tile> far;
            if (t.active) far.load(t, gm, gv, g);
            float gu[3][TILE_G] = {};  // the unit-vector gradients' terms of this feature
            if (run != NO_ATOM && t.active) {
                own(run);
#pragma unroll
                for (int k = 0; k < TILE_G; ++k) terms(far, k, g + k, gu);
            } else {
#pragma unroll
                for (int k = 0; k < TILE_G; ++k) {
                    const unsigned m = g + k;
                    if (m >= cnt) break;
                    if (t.active) {
                        own(t.si[m]);
                        terms(far, k, m, gu);
                    }
                }
            }
            t.add_unit_grads(gu, g);
        }
        __syncwarp();
        if constexpr (HALF) t.basis_grads_h(dw_largest);
        else t.basis_grads();
        wait_copies();
        __syncthreads();
        t.store_basis_grads(gb, gb_prev, e0, cnt);
    });
    if (t.active) flush_own(gphi, out, n, f, cur, t.c, sum_phi, sum_v);
}

// Each instantiation has its own entry, so that ptxas allocates its registers alone (the
// shipped shape, F = TILE_F with TC_RBF basis functions, in one entry with the others spilled
// ~560 bytes a thread in the adjoint's loop; F = TILE_F at any basis with any F 540 bytes, 48
// and 40 apart), and the mma's k steps (KS) and the staging's swizzle (SWZ) are known at
// compile time in each: with them as run-time values F = 128 at 22 basis functions spilled 56
// (adjoint) and 136 bytes (forward) a thread, none with them known. A family of entries is the
// five reachable pairs: "_k1", "_k2", "_k3" at stride 8 or 24, "_sw_k3", "_sw_k4" at stride 32
// (tc_stride). Forward: any F in chunks of TILE_F; F = 64 and F < 64 in one chunk of 64; F =
// TILE_F (run only with the fragment forward turned off) with both at run time. The symmetric
// adjoint: the same shapes, F = TILE_F and the shipped shape; accumulate: gb_prev is added to
// g_basis (else it is not read).
#define TC_FWD_ENTRY(NAME, FC, CW, SWZ, KS)                                                    \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME(                          \
        const float* phi, const float* pb, const float* w, const float* basis, const float* sv, \
        const unsigned int* ci, const unsigned int* nj, float* out, size_t n_edges, size_t f,  \
        size_t n, size_t n_rbf) {                                                               \
        tc_fwd<FC, CW, SWZ, KS>(phi, pb, w, basis, sv, ci, nj, out, n_edges, f, n, n_rbf);     \
    }
#define TC_SYM_ADJ_NRBF_ENTRY(NAME, FC, CW, SWZ, KS, NRBF, HALF)                               \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME(                          \
        const float* phi, const float* pb, const float* w, const float* basis, const float* sv, \
        const float* gm, const float* gve, const float* gb_prev, const unsigned int* ci,       \
        const unsigned int* nj, float* out, size_t n_edges, size_t f, size_t n, size_t n_rbf,  \
        size_t accumulate) {                                                                    \
        const float* prev = accumulate ? gb_prev : nullptr;                                     \
        tc_sym_adj<FC, CW, SWZ, KS, HALF>(phi, pb, w, basis, sv, gm, gve, prev, ci, nj, out,    \
                                          n_edges, f, n, NRBF ? NRBF : n_rbf);                  \
    }
#define TC_SYM_ADJ_ENTRY(NAME, FC, CW, SWZ, KS) \
    TC_SYM_ADJ_NRBF_ENTRY(NAME, FC, CW, SWZ, KS, 0, false)
// The five (SWZ, KS) entries of one shape: ENTRY(NAME_..._f32, SHAPE..., SWZ, KS).
#define TC_KS_FAMILY(ENTRY, NAME, ...)           \
    ENTRY(NAME##_k1_f32, __VA_ARGS__, false, 1)   \
    ENTRY(NAME##_k2_f32, __VA_ARGS__, false, 2)   \
    ENTRY(NAME##_k3_f32, __VA_ARGS__, false, 3)   \
    ENTRY(NAME##_sw_k3_f32, __VA_ARGS__, true, 3) \
    ENTRY(NAME##_sw_k4_f32, __VA_ARGS__, true, 4)
TC_KS_FAMILY(TC_FWD_ENTRY, interaction_tile_fwd, 0, TILE_F)
TC_KS_FAMILY(TC_FWD_ENTRY, interaction_tile_fwd_64, 64, 64)
TC_KS_FAMILY(TC_FWD_ENTRY, interaction_tile_fwd_under64, 0, 64)
TC_FWD_ENTRY(interaction_tile_fwd_128_f32, TILE_F, TILE_F, false, 0)
TC_KS_FAMILY(TC_SYM_ADJ_ENTRY, interaction_tile_sym_adj, 0, TILE_F)
TC_KS_FAMILY(TC_SYM_ADJ_ENTRY, interaction_tile_sym_adj_128, TILE_F, TILE_F)
TC_KS_FAMILY(TC_SYM_ADJ_ENTRY, interaction_tile_sym_adj_64, 64, 64)
TC_KS_FAMILY(TC_SYM_ADJ_ENTRY, interaction_tile_sym_adj_under64, 0, 64)
TC_SYM_ADJ_NRBF_ENTRY(interaction_tile_sym_adj_128_20_f32, TILE_F, TILE_F, false, 0, TC_RBF,
                      true)
