// The tiled tensor-core interaction with each warp's filters kept in the mma's C fragments
// (registers) instead of shared memory, formed in split f16 (TcTile<.., FRAG = true>).
// Included by kernels/layers/interaction_tile.cu after kernels/layers/interaction_tc_kernels.cuh
// (the tile of kernels/layers/interaction_tc.cuh, whose staging it shares); F = TILE_F only.
//
// Lane (g, t) of warp (group, quarter) owns the tile's edges 16 group + g and + 8 (its rows r =
// 0, 1) and 8 features of the warp's 32 (32 quarter + 4 t + [0, 4) and + 16: index k, see
// frag_feature): the weights are staged in frag_feature's column order, so that a part's four
// n-tiles leave lane (g, t) exactly these. Its gathers are then two 16-byte loads per edge and
// quantity (the CUDA-core layout: one 4-byte load per edge, quantity and thread), nothing is
// staged per edge but the basis, and each edge's messages are summed over the warp's rows of
// the same receiving atom by shuffles (a reduce-scatter over the 8 lanes of a feature group)
// before one atomic add per lane and receiver.
#pragma once

// A lane's 8 features from global memory (frag_feature): v[0..4) = p[0..4), v[4..8) =
// p[16..20), p 16-byte aligned.
__device__ __forceinline__ void load8_global(const float* p, float v[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p + 16));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
    v[7] = b.w;
}

// The warp's rows as lane (g, t) holds them: receiving atoms (NO_ATOM past the tile's end)
// and the other atoms; the least and the greatest receiving atom of the warp's rows.
struct FragRows {
    unsigned i[2], j[2], lo, hi;
    __device__ __forceinline__ FragRows(const unsigned* si, const unsigned* sj, unsigned first,
                                        unsigned g) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            i[r] = si[first + g + 8 * r];
            j[r] = sj[first + g + 8 * r];
        }
        lo = __reduce_min_sync(0xffffffffu, min(i[0], i[1]));
        const unsigned h0 = i[0] == NO_ATOM ? 0 : i[0], h1 = i[1] == NO_ATOM ? 0 : i[1];
        hi = __reduce_max_sync(0xffffffffu, max(h0, h1));
    }
    // Adds v[r][k] into out[i[r] row_stride + k] (out at this lane's first feature; rows past
    // the tile's end hold zeros): each receiving atom's rows are summed by a reduce-scatter
    // over the lanes that hold the same features (lane (g, t) is left with feature k = g's
    // sum), then one atomic add per lane and atom. Any order of rows is right; lists sorted by
    // receiver leave one or two atoms per warp. Every lane calls it (the loop is uniform).
    __device__ __forceinline__ void add(const float v[2][8], float* out, unsigned row_stride,
                                        unsigned lane) const {
        float x[8];
        if (lo == hi) {  // every row is atom lo's (rows past the tile's end hold zeros)
#pragma unroll
            for (int k = 0; k < 8; ++k) x[k] = v[0][k] + v[1][k];
            add_group_sums(x, out + lo * row_stride, lane);
            return;
        }
        for (unsigned atom = lo;;) {
#pragma unroll
            for (int k = 0; k < 8; ++k)
                x[k] = (i[0] == atom ? v[0][k] : 0.f) + (i[1] == atom ? v[1][k] : 0.f);
            add_group_sums(x, out + atom * row_stride, lane);
            if (atom == hi) break;
            const unsigned n0 = i[0] > atom ? i[0] : NO_ATOM, n1 = i[1] > atom ? i[1] : NO_ATOM;
            atom = __reduce_min_sync(0xffffffffu, min(n0, n1));
        }
    }
    // Sums x[k] over the 8 lanes g of each lane group t by a reduce-scatter (lane (g, t) is
    // left with k = g's sum) and adds it to its feature of out (load8_global's layout).
    __device__ __forceinline__ static void add_group_sums(float x[8], float* out, unsigned lane) {
        reduce_scatter_step<4, 16>(x, lane);
        reduce_scatter_step<2, 8>(x, lane);
        reduce_scatter_step<1, 4>(x, lane);
        const unsigned k = lane / 4;  // the lane's value index: feature k or 12 + k (load8_global)
        atomicAdd(out + (k < 4 ? k : 12 + k), x[0]);
    }
};

// Part p (s, d, v) of the warp's filters, this lane's rows and features: w[r][2 q + b] is
// column 2 t + b of n-tile q, row g + 8 r (split f16: TcTile::basis_fragments_f16).
template <typename Tile>
__device__ __forceinline__ void frag_filters(const Tile& t, const uint4 ah[2], const uint4 al[2],
                                             const float unscale[2], int p, float w[2][8]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        float d[4];
        t.filter_columns_f16(ah, al, p * TILE_F + 32 * t.quarter + 8 * q, d);
        w[0][2 * q] = d[0] * unscale[0], w[0][2 * q + 1] = d[1] * unscale[0];
        w[1][2 * q] = d[2] * unscale[1], w[1][2 * q + 1] = d[3] * unscale[1];
    }
}

// x[r] = rows[j[r] row_stride + (0..8)]: this lane's features of its two rows' atoms.
__device__ __forceinline__ void load_rows(const float* __restrict__ rows, const unsigned j[2],
                                          unsigned row_stride, float x[2][8]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) load8_global(rows + j[r] * row_stride, x[r]);
}

// x[r][k] = (x[r][k] + bias[k]) * w[r][k]: a sender's context times the filter.
__device__ __forceinline__ void times_filters(const float* __restrict__ bias, const float w[2][8],
                                              float x[2][8]) {
    float b[8];
    load8_global(bias, b);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int k = 0; k < 8; ++k) x[r][k] = (x[r][k] + b[k]) * w[r][k];
}

// tc_fwd (same arguments and output) at F = TILE_F with the filters in fragments.
template <int NRBF, bool SWZ = false, int KS = 0>
__device__ void frag_fwd(const float* __restrict__ phi, const float* __restrict__ pb,
                         const float* __restrict__ wt, const float* __restrict__ basis,
                         const float* __restrict__ sv, const unsigned* __restrict__ ci,
                         const unsigned* __restrict__ nj, float* __restrict__ out,
                         size_t n_edges, size_t n, size_t n_rbf) {
    TcTile<TILE_F, true, TILE_F, SWZ, KS> t(wt, pb, NRBF ? NRBF + 1 : n_rbf + 1,
                                            NRBF ? NRBF + 4 : n_rbf + 4, TILE_F);
    wait_for_previous_kernel();
    const unsigned nf = n * TILE_F, first = 16 * t.group, g = t.lane / 4;
    const unsigned cf = 32 * t.quarter + 4 * (t.lane % 4);  // the lane's first feature
    t.walk(basis, ci, nj, n_edges, [&](size_t, unsigned cnt) {
        if (first >= cnt) return;  // the whole warp's rows are past the tile's end
        // Each part's gathers are issued before its filters are formed, so that the products
        // hide their latency.
        const FragRows rows(t.si, t.sj, first, g);
        const float* ctx = phi + cf;  // φ_j's parts at 3 j F + p F
        float w[2][8], x[2][8];
        load_rows(ctx, rows.j, 3 * TILE_F, x);
        uint4 ah[2], al[2];
        float unscale[2];
        t.basis_fragments_f16(ah, al, unscale);
        frag_filters(t, ah, al, unscale, 0, w);
        times_filters(pb + cf, w, x);
        rows.add(x, out + cf, TILE_F, t.lane);
        float xd[2][8], xv[2][8];
        load_rows(ctx + TILE_F, rows.j, 3 * TILE_F, xd);
        load_rows(ctx + 2 * TILE_F, rows.j, 3 * TILE_F, xv);
        frag_filters(t, ah, al, unscale, 1, w);
        times_filters(pb + TILE_F + cf, w, xd);
        frag_filters(t, ah, al, unscale, 2, w);
        times_filters(pb + 2 * TILE_F + cf, w, xv);
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            const float* va = sv + (1 + a) * (size_t)nf + cf;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float u = t.unit(first + g + 8 * r, a);
                load8_global(va + rows.j[r] * TILE_F, x[r]);  // v_j's row a
#pragma unroll
                for (int k = 0; k < 8; ++k) x[r][k] = xd[r][k] * u + xv[r][k] * x[r][k];
            }
            rows.add(x, out + (1 + a) * (size_t)nf + cf, TILE_F, t.lane);
        }
    });
}

// The shipped basis (TC_RBF functions) has its own entry, so that ptxas allocates its
// registers alone: in one entry with the generic instantiation both spilled. The others: a
// family of (SWZ, KS) entries (TC_KS_FAMILY in kernels/layers/interaction_tc_kernels.cuh).
#define FRAG_FWD(NAME, NRBF, SWZ, KS)                                                           \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME(                         \
        const float* phi, const float* pb, const float* w, const float* basis,                \
        const float* sv, const unsigned int* ci, const unsigned int* nj, float* out,          \
        size_t n_edges, size_t f, size_t n, size_t n_rbf) {                                   \
        frag_fwd<NRBF, SWZ, KS>(phi, pb, w, basis, sv, ci, nj, out, n_edges, n, n_rbf);       \
    }
FRAG_FWD(interaction_frag_fwd_20_f32, TC_RBF, false, 0)
TC_KS_FAMILY(FRAG_FWD, interaction_frag_fwd, 0)
