// The tiled interaction in f32 with the filters from tensor cores: the tile. Included through
// kernels/layers/interaction_tc_kernels.cuh (its kernels) by kernels/layers/interaction_tile.cu
// after the pieces it shares (Run, add_messages, flush_own); not compiled on its own.
//
// A tile's filters are a product, [E edges, R + 1] basis x [R + 1, 3 CW] weights: tc_fwd
// and tc_sym_adj form it with mma.m16n8k8 in split TF32 (three products per value pair, each
// value held to ~2^-20, as f32 arithmetic) into shared memory (the fragment forward,
// kernels/layers/interaction_frag.cuh, with mma.m16n8k16 in split f16, each edge's row and the
// weights scaled by powers of two: kernels/include/f16_split.cuh), where the CUDA-core kernels spend
// ~63 FMAs per edge and feature. tc_sym_adj then overwrites the filters with dL/dw and sums
// dL/d(basis) by a second such product, instead of writing E x 3F rows for a product outside
// the kernel (at the shipped shape both products in split f16: TcTile<.., HALF>). A block owns
// a chunk of CW features (TILE_F, or 64 where F <= 64, so that a small model does not form 128
// features' filters): its 8 warps are CW / 32 "quarters" across
// the features times 8 / (CW / 32) groups across the edges (TcShape). Warp w owns edges
// [16 group, + 16) of a tile and features [32 quarter, + 32) of the chunk: it forms exactly the
// filters its own threads use, so a warp barrier orders them. The next tile's basis and indices
// are loaded into registers before a tile's work, so that staging them waits for nothing. FC
// is the feature count where it is CW (offsets then fold into the loads), else 0 (f at run
// time). Offsets are 32-bit: the host keeps N x 4F and E x (R + 4) below 2^32.
#pragma once

#include "interaction_tc_shape.cuh"

// FRAG: the fragment kernels' tile (kernels/layers/interaction_frag.cuh): weight columns staged in
// frag_feature's order as split f16 B fragments (stage_weights_f16; its filters then take
// basis_fragments_f16 and filter_columns_f16), and no filters staged (sf null). Else weight
// columns in feature order, f32. (Weights staged split into TF32 hi and lo, one float4 per
// fragment instead of a float2 and four instructions, took the fragment forward longer: twice
// the shared-memory wavefronts, where L1 was its busiest unit. Split f16 holds hi and lo in
// the bytes of one f32 and needs half the products: docs/bench-log/40-forward-split-f16.md.)
// SWZ: stride 32 (more than 24 basis rows or columns), each staged row's blocks of 8 values
// XOR-ed with the row's low two bits instead of the rows padded to 40 (at): the fragment loads
// stay free of bank conflicts in a fifth less shared memory, and the adjoint keeps its partial
// sums in the filters' space (partial_row), so that it runs two blocks a multiprocessor (at
// stride 40 one: docs/bench-log/38-other-shapes.md). Compile-time, so that the other
// shapes' code is what it was.
// HALF (the symmetric adjoint at up to 24 basis rows; the host's stride, 24 there, sizes the
// staged weights): the weights staged as split f16 rows instead, hi then lo, [3 CW][24] halves
// each (in the f32 weights' 3 CW x 24 words), the matrix scaled as stage_weights_f16 does;
// both of the adjoint's products read them by ldmatrix, the filters' B fragments as stored and
// dL/d(basis)'s transposed (stage_weight_rows_f16).
template <int FC, bool FRAG = false, int CW = TILE_F, bool SWZ = false, int KS = 0,
          bool HALF = false>
struct TcTile {
    using Shape = TcShape<CW>;
    static constexpr unsigned QUARTERS = Shape::QUARTERS, E = Shape::E, SF = Shape::SF;
    using Stage = TcStage<Shape::STAGE_LOADS>;
    float* sw;     // [3 CW][stride]: weight column (s, d, v part, feature) by basis row
    float* sb;     // [E][stride]: edge by basis column, zero past the basis width
    float* sf;     // [E][SF]: the tile's filters (then dL/dw), edge by (part, feature)
    unsigned* si;  // [E]
    unsigned* sj;  // [E]
    unsigned f, stride, ksteps, nb, bw;
    int group, quarter, lane;
    unsigned cl, c;  // this thread's feature in the chunk and overall
    bool active;
    float bias[3];
    unsigned plan[Shape::STAGE_LOADS];  // this thread's staging slots: m << 6 | r, or TC_NO_SLOT
    float wunscale;  // FRAG: the staged weights' inverse scale (stage_weights_f16)

    __device__ unsigned features() const { return FC ? FC : f; }
    // The mma's k steps: KS where known at compile time (so that the fragment arrays and
    // loops are only as long as they need be), else ksteps.
    __device__ __forceinline__ unsigned ks() const { return KS ? KS : ksteps; }
    // Offset of value k of staged row `row` (of the weights a column, of the basis an edge).
    __device__ __forceinline__ unsigned at(unsigned row, unsigned k) const {
        return row * stride + (SWZ ? k ^ row % 4 * 8 : k);
    }

    // Lays out the shared memory, stages the block's weights (features from blockIdx.y CW,
    // zero past f and nb) and plans the thread's staging slots.
    __device__ TcTile(const float* wt, const float* pb, unsigned nb_, unsigned bw_, unsigned f_)
        : f(f_), stride(tc_stride(nb_, bw_)), ksteps((nb_ + 7) / 8), nb(nb_), bw(bw_) {
        extern __shared__ __align__(16) unsigned char tile_smem[];
        sw = reinterpret_cast<float*>(tile_smem);
        sb = sw + (FRAG ? 3 * CW * 32 : 3 * CW * stride);  // (stride <= 32)
        sf = FRAG ? nullptr : sb + E * stride;
        si = reinterpret_cast<unsigned*>(sb + E * stride + (FRAG ? 0 : E * SF));
        sj = si + E;
        const int warp = threadIdx.x / 32;
        lane = threadIdx.x % 32;
        group = warp / QUARTERS;
        quarter = warp % QUARTERS;
        const unsigned fk = features(), c0 = blockIdx.y * CW;
        cl = 32 * quarter + lane;
        c = c0 + cl;
        active = c < fk;
#pragma unroll
        for (int p = 0; p < 3; ++p) bias[p] = active ? pb[p * fk + c] : 0.f;
        if constexpr (FRAG) {
            stage_weights_f16(wt, fk, c0);
        } else if constexpr (HALF) {
            stage_weight_rows_f16(wt, fk, c0);
        } else {
            const unsigned cols = 3 * CW;
            for (unsigned k = threadIdx.x; k < stride * cols; k += TC_THREADS) {
                const unsigned r = k / cols, col = k % cols;
                const unsigned cc = c0 + col % CW;
                sw[at(col, r)] = r < nb && cc < fk ? wt[r * 3 * fk + col / CW * fk + cc] : 0.f;
            }
        }
#pragma unroll
        for (int q = 0; q < Shape::STAGE_LOADS; ++q) {
            const unsigned k = threadIdx.x + q * TC_THREADS;
            plan[q] = k < E * stride ? (k / stride) << 6 | (k % stride) : TC_NO_SLOT;
        }
    }
    // The split-f16 scale field (f16_split.cuh) of the weights [nb][3 fk]: their largest
    // magnitude found by the whole block.
    __device__ unsigned weights_scale_field(const float* wt, unsigned fk) const {
        __shared__ unsigned largest;
        if (threadIdx.x == 0) largest = 0;
        __syncthreads();
        unsigned m = 0;
        for (unsigned k = threadIdx.x; k < nb * 3 * fk; k += TC_THREADS)
            m = max(m, __float_as_uint(wt[k]) & 0x7fffffffu);
        m = __reduce_max_sync(0xffffffffu, m);
        if (lane == 0) atomicMax(&largest, m);
        __syncthreads();
        return split_scale_field(largest);
    }
    // HALF: halves per staged weight row, and the lo rows' offset in bytes from the hi rows'.
    static constexpr unsigned HALF_ROW = 24, HALF_LO = 3 * CW * HALF_ROW * 2;
    // HALF: weight column x's basis rows r, r + 1 as hi and lo pairs at word x HALF_ROW / 2 +
    // r / 2 of the hi and the lo rows (value r in the low half); rows from nb zero.
    __device__ void stage_weight_rows_f16(const float* wt, unsigned fk, unsigned c0) {
        const unsigned field = weights_scale_field(wt, fk);
        const float scale = split_scale(field);
        wunscale = split_unscale(field);
        const unsigned cols = 3 * CW, pairs = HALF_ROW / 2;
        unsigned* hi = reinterpret_cast<unsigned*>(sw);
        unsigned* lo = hi + cols * pairs;
        for (unsigned item = threadIdx.x; item < cols * pairs; item += TC_THREADS) {
            const unsigned x = item % cols, r = 2 * (item / cols);  // a warp reads along a row
            const unsigned cc = c0 + x % CW, part = x / CW;
            float v[2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                v[i] = r + i < nb && cc < fk ? wt[(r + i) * 3 * fk + part * fk + cc] * scale : 0.f;
            split_f16x2(v[0], v[1], hi[x * pairs + r / 2], lo[x * pairs + r / 2]);
        }
    }
    // The mma.m16n8k16 steps of 16 basis rows (FRAG).
    __device__ __forceinline__ unsigned ks16() const { return (ks() + 1) / 2; }
    // FRAG: the weights scaled by the power of two that takes the matrix's largest magnitude
    // into [2^14, 2^15) and split into f16 hi and lo (kernels/include/f16_split.cuh), as B fragments of
    // mma.m16n8k16: for step s (basis rows 16 s ..) and staged column x (frag_feature's
    // order), lane t's uint4 {hi (rows 16 s + 2t, + 1), hi (+ 8, + 9), lo (..), lo (..)} at
    // uint4 (s 3 CW + x) 4 + t (a quarter warp's loads, two columns by four lanes, hit every
    // bank once); rows from nb zero. Two steps (basis rows <= 32) in 3 CW x 32 words.
    __device__ void stage_weights_f16(const float* wt, unsigned fk, unsigned c0) {
        const unsigned field = weights_scale_field(wt, fk);
        const float scale = split_scale(field);
        wunscale = split_unscale(field);
        const unsigned cols = 3 * CW;
        uint4* out = reinterpret_cast<uint4*>(sw);
        for (unsigned item = threadIdx.x; item < 2 * cols * 4; item += TC_THREADS) {
            const unsigned t = item % 4, x = item / 4 % cols, s = item / 4 / cols;
            const unsigned cc = c0 + frag_feature(x % CW), part = x / CW;
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned r = 16 * s + f16_fragment_k(t, i);
                v[i] = r < nb && cc < fk ? wt[r * 3 * fk + part * fk + cc] * scale : 0.f;
            }
            uint4 o;
            split_f16x2(v[0], v[1], o.x, o.z);
            split_f16x2(v[2], v[3], o.y, o.w);
            out[item] = o;
        }
    }
    // FRAG: this warp's basis rows (its 16 edges) as split-f16 A fragments of mma.m16n8k16 for
    // steps s < ks16(): lane (g, t)'s rows 16 group + g and + 8 at basis rows 16 s + 2t, + 1,
    // + 8, + 9 (zero from nb: the staged rows hold the unit vectors after the basis), each edge's
    // row scaled by the power of two of its largest magnitude (its four lanes share it by
    // shuffles); unscale[r]: the rows' inverse scales times the weights'.
    __device__ __forceinline__ void basis_fragments_f16(uint4 ah[2], uint4 al[2],
                                                        float unscale[2]) const {
        const unsigned g = lane / 4, t = lane % 4;
        float v[2][2][4];  // [row][step][value]
        unsigned m[2] = {0, 0};
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const unsigned k = 16 * s + f16_fragment_k(t, i);
                    const float x = s < ks16() && k < nb ? sb[at(16 * group + g + 8 * r, k)] : 0.f;
                    v[r][s][i] = x;
                    m[r] = max(m[r], __float_as_uint(x) & 0x7fffffffu);
                }
        float scale[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m[r] = max(m[r], __shfl_xor_sync(0xffffffffu, m[r], 1));
            m[r] = max(m[r], __shfl_xor_sync(0xffffffffu, m[r], 2));
            const unsigned field = split_scale_field(m[r]);
            scale[r] = split_scale(field);
            unscale[r] = split_unscale(field) * wunscale;
        }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            split_f16x2(v[0][s][0] * scale[0], v[0][s][1] * scale[0], ah[s].x, al[s].x);
            split_f16x2(v[1][s][0] * scale[1], v[1][s][1] * scale[1], ah[s].y, al[s].y);
            split_f16x2(v[0][s][2] * scale[0], v[0][s][3] * scale[0], ah[s].z, al[s].z);
            split_f16x2(v[1][s][2] * scale[1], v[1][s][3] * scale[1], ah[s].w, al[s].w);
        }
    }
    // FRAG: the warp's filters of staged weight columns [col, col + 8) into the C fragment d
    // (lane (g, t): edges g and g + 8, columns 2 t and 2 t + 1), scaled (basis_fragments_f16's
    // unscale undoes it).
    __device__ __forceinline__ void filter_columns_f16(const uint4 ah[2], const uint4 al[2],
                                                       unsigned col, float d[4]) const {
        const uint4* b = reinterpret_cast<const uint4*>(sw) + (col + lane / 4) * 4 + lane % 4;
        d[0] = d[1] = d[2] = d[3] = 0.f;
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            if (s >= ks16()) break;
            const uint4 w = b[s * 3 * CW * 4];
            mma_f16(d, al[s], w.x, w.y);
            mma_f16(d, ah[s], w.z, w.w);
            mma_f16(d, ah[s], w.x, w.y);
        }
    }
    // Loads tile e0's basis rows (zero past the edges and the basis width) and indices.
    __device__ void load_edges(Stage& st, const float* basis, const unsigned* ci,
                               const unsigned* nj, size_t e0, size_t n_edges) const {
        const unsigned cnt = min((size_t)E, n_edges - e0);
        const float* rows = basis + e0 * bw;
#pragma unroll
        for (int q = 0; q < Shape::STAGE_LOADS; ++q) {
            const unsigned m = plan[q] >> 6, r = plan[q] & 63;
            const bool used = plan[q] != TC_NO_SLOT && m < cnt && r < bw;
            st.b[q] = used ? __ldg(rows + m * bw + r) : 0.f;
        }
        if (threadIdx.x < E) {
            const bool used = threadIdx.x < cnt;
            st.i = used ? ci[e0 + threadIdx.x] : NO_ATOM;
            st.j = used ? nj[e0 + threadIdx.x] : 0;
        }
    }
    __device__ void store_edges(const Stage& st) const {
#pragma unroll
        for (int q = 0; q < Shape::STAGE_LOADS; ++q)
            if (plan[q] != TC_NO_SLOT) {
                const unsigned k = threadIdx.x + q * TC_THREADS;  // plan[q]'s row and value
                sb[SWZ ? at(plan[q] >> 6, plan[q] & 63) : k] = st.b[q];
            }
        if (threadIdx.x < E) {
            si[threadIdx.x] = st.i;
            sj[threadIdx.x] = st.j;
        }
    }
    // Walks the block's tiles of edges (grid-stride over blockIdx.x): stages each between two
    // block barriers (the first: the previous tile is done with the staged edges, and its sums
    // are stored), loads the next one's basis and indices into registers, then calls
    // tile(e0, cnt) for edges [e0, e0 + cnt).
    template <typename Tile>
    __device__ __forceinline__ void walk(const float* basis, const unsigned* ci,
                                         const unsigned* nj, size_t n_edges, Tile tile) const {
        const size_t step = gridDim.x * (size_t)E;
        size_t e0 = blockIdx.x * (size_t)E;
        Stage st;
        if (e0 < n_edges) load_edges(st, basis, ci, nj, e0, n_edges);
        for (; e0 < n_edges; e0 += step) {
            const unsigned cnt = min((size_t)E, n_edges - e0);
            __syncthreads();
            store_edges(st);
            __syncthreads();
            if (e0 + step < n_edges) load_edges(st, basis, ci, nj, e0 + step, n_edges);
            tile(e0, cnt);
        }
    }
    // This warp's basis rows (its 16 edges) as split A fragments of the filters' product. The
    // mma's k slots t and t + 4 of lane (g, t) take basis rows 8 s + 2 t and 8 s + 2 t + 1.
    // Loaded one value at a time in the operand's register order (volatile, so that ptxas
    // does not pair them into 64-bit loads): it takes the values themselves as the high parts
    // (the tensor cores read their TF32 bits only), and values loaded in pairs would need four
    // register moves into the operand quad of every mma.
    __device__ __forceinline__ void basis_fragments(unsigned ah[TC_MAX_KSTEPS][4],
                                                    unsigned al[TC_MAX_KSTEPS][4]) const {
        const unsigned g = lane / 4, t = lane % 4;
        const float* a0 = sb + (16 * group + g) * stride + 2 * t;
        const float* a1 = a0 + 8 * stride;
#pragma unroll
        for (int s = 0; s < TC_MAX_KSTEPS; ++s) {
            if (s >= ks()) break;
            // Rows 16 group + g and + 8 share a swizzle.
            const unsigned k = SWZ ? (8 * s) ^ (g % 4 * 8) : 8 * s;
            split_tf32(load_shared_volatile(a0 + k), ah[s][0], al[s][0]);
            split_tf32(load_shared_volatile(a1 + k), ah[s][1], al[s][1]);
            split_tf32(load_shared_volatile(a0 + k + 1), ah[s][2], al[s][2]);
            split_tf32(load_shared_volatile(a1 + k + 1), ah[s][3], al[s][3]);
        }
    }
    // The warp's filters of staged weight columns [col, col + 8) into the C fragment d (lane
    // (g, t): edges g and g + 8, columns 2 t and 2 t + 1). CROSS_APART: the cross products
    // accumulate apart from hi x hi, two chains of dependent mma instead of one (faster for the
    // symmetric adjoint, slower for the fragment forward, as measured:
    // docs/bench-log/29-fragment-forward.md).
    template <bool CROSS_APART = false>
    __device__ __forceinline__ void filter_columns(const unsigned ah[TC_MAX_KSTEPS][4],
                                                   const unsigned al[TC_MAX_KSTEPS][4],
                                                   unsigned col, float d[4]) const {
        const float* b = sw + (col + lane / 4) * stride + 2 * (lane % 4);
        float e[4] = {0.f, 0.f, 0.f, 0.f};
        d[0] = d[1] = d[2] = d[3] = 0.f;
#pragma unroll
        for (int s = 0; s < TC_MAX_KSTEPS; ++s) {
            if (s >= ks()) break;
            // (col is a multiple of 8: row col + g swizzles by g.)
            const unsigned k = SWZ ? (8 * s) ^ (lane / 4 % 4 * 8) : 8 * s;
            const float2 w = *reinterpret_cast<const float2*>(b + k);
            unsigned bh[2], bl[2];
            split_tf32(w.x, bh[0], bl[0]);
            split_tf32(w.y, bh[1], bl[1]);
            if (CROSS_APART) {
                mma_tf32(e, al[s], bh);
                mma_tf32(d, ah[s], bh);
                mma_tf32(e, ah[s], bl);
            } else {
                mma_tf32(d, al[s], bh);
                mma_tf32(d, ah[s], bl);
                mma_tf32(d, ah[s], bh);
            }
        }
        if (CROSS_APART) {
#pragma unroll
            for (int k = 0; k < 4; ++k) d[k] += e[k];
        }
    }
    // This warp's filters (its 16 edges, its 32 features, three parts) into sf.
    __device__ void form_filters() const {
        const unsigned g = lane / 4, t = lane % 4;
        unsigned ah[TC_MAX_KSTEPS][4], al[TC_MAX_KSTEPS][4];
        basis_fragments(ah, al);
#pragma unroll 4
        for (int n = 0; n < 12; ++n) {  // 8 columns each: part n / 4, features 8 (n % 4) + ..
            const unsigned col = (n / 4) * CW + 32 * quarter + 8 * (n % 4);
            float d[4];
            filter_columns<true>(ah, al, col, d);
            float* o = sf + (16 * group + g) * SF + col + 2 * t;
            *reinterpret_cast<float2*>(o) = make_float2(d[0], d[1]);
            *reinterpret_cast<float2*>(o + 8 * SF) = make_float2(d[2], d[3]);
        }
    }
    // HALF: shared-memory address of this lane's row of an ldmatrix in the staged weights: x4
    // with TRANS of columns col + lane % 16 (matrices hi, hi + 8 columns, lo, lo + 8) at basis
    // rows 8 s (add 16 s); else of column col + lane % 8 (hi rows 0..7, 8..15, lo 0..7,
    // 8..15), or with K8 of column col + lane % 8 + 8 (lane / 16) (hi rows 16..23, lo 16..23,
    // then the same of the next 8 columns).
    template <bool TRANS, bool K8 = false>
    __device__ __forceinline__ unsigned half_rows(unsigned col) const {
        const unsigned rows = static_cast<unsigned>(__cvta_generic_to_shared(sw));
        const unsigned x = TRANS ? lane % 16 : K8 ? lane % 8 + lane / 16 * 8 : lane % 8;
        const unsigned lo = (K8 ? lane / 8 % 2 : lane / 16) * HALF_LO;
        const unsigned k = TRANS ? 0 : K8 ? 32 : lane / 8 % 2 * 16;
        return rows + lo + (col + x) * HALF_ROW * 2 + k;
    }
    // HALF: form_filters from the split-f16 rows, per 8 columns an m16n8k16 step (basis rows
    // 0..15) and an m16n8k8 step (16..23) of three products each; the A fragments as
    // basis_fragments_f16 forms them (its second step's first two registers are the k8 step's).
    // Two n-tiles at a time, their loads first and their products interleaved: one tile's six
    // products are a chain of dependent mma, and ptxas keeps the volatile ldmatrix after the
    // previous tile's stores (one tile at a time, the whole loop was one chain, a NOP after
    // every mma; two tiles were measurably faster at 10,000 atoms, and each tile's cross
    // products apart from hi x hi gained nothing more: docs/bench-log/41-adjoint-split-f16.md).
    __device__ void form_filters_h() const {
        const unsigned g = lane / 4, t = lane % 4;
        uint4 ah[2], al[2];
        float unscale[2];
        basis_fragments_f16(ah, al, unscale);
#pragma unroll 3
        for (int n = 0; n < 12; n += 2) {
            const unsigned col = (n / 4) * CW + 32 * quarter + 8 * (n % 4);  // and col + 8
            unsigned b[2][4], c[4];
            load_matrices_x4(half_rows<false>(col), b[0]);
            load_matrices_x4(half_rows<false>(col + 8), b[1]);
            load_matrices_x4(half_rows<false, true>(col), c);
            float d[2][4] = {};
#pragma unroll
            for (int q = 0; q < 2; ++q) mma_f16(d[q], ah[0], b[q][0], b[q][1]);
#pragma unroll
            for (int q = 0; q < 2; ++q) mma_f16(d[q], al[0], b[q][0], b[q][1]);
#pragma unroll
            for (int q = 0; q < 2; ++q) mma_f16_k8(d[q], ah[1].x, ah[1].y, c[2 * q]);
#pragma unroll
            for (int q = 0; q < 2; ++q) mma_f16(d[q], ah[0], b[q][2], b[q][3]);
#pragma unroll
            for (int q = 0; q < 2; ++q) mma_f16_k8(d[q], al[1].x, al[1].y, c[2 * q]);
#pragma unroll
            for (int q = 0; q < 2; ++q) mma_f16_k8(d[q], ah[1].x, ah[1].y, c[2 * q + 1]);
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                float* o = sf + (16 * group + g) * SF + col + 8 * q + 2 * t;
                *reinterpret_cast<float2*>(o) =
                    make_float2(d[q][0] * unscale[0], d[q][1] * unscale[0]);
                *reinterpret_cast<float2*>(o + 8 * SF) =
                    make_float2(d[q][2] * unscale[1], d[q][3] * unscale[1]);
            }
        }
    }
    // The one receiving atom of the TILE_G staged edges from `first`, or NO_ATOM where they
    // have several or the tile ends before them (every lane calls it).
    __device__ __forceinline__ unsigned group_atom(unsigned first, unsigned cnt) const {
        if (first + TILE_G > cnt) return NO_ATOM;
        const unsigned atom = si[first];
        return __all_sync(0xffffffffu, si[first + lane % TILE_G] == atom) ? atom : NO_ATOM;
    }
    // This thread's slot of part p (s, d, v) of staged edge m's filter (or dL/dw).
    __device__ __forceinline__ float* slot(unsigned m, int p) const {
        return sf + m * SF + p * CW + cl;
    }
    __device__ __forceinline__ float unit(unsigned m, int a) const {
        return sb[at(m, nb + a)];
    }

    // The adjoint's shared memory after the indices: the quarters' sums of the unit-vector
    // gradients [QUARTERS][E][3] and of dL/d(basis) [QUARTERS][E][8 ksteps] (none with SWZ:
    // partial_row), and the later blocks' dL/d(basis) rows of the tile [E][bw].
    __device__ float* unit_sums() const { return reinterpret_cast<float*>(sj + E); }
    __device__ float* partials() const { return unit_sums() + QUARTERS * E * 3; }
    __device__ float* prev_rows() const {
        return partials() + (SWZ ? 0 : QUARTERS * E * 8 * ks());
    }
    // Quarter q's partial dL/d(basis) row of staged edge m, and (partial_step) the step to
    // edge m + 1: with SWZ the quarter's first 32 filter columns of the edge, the warp's own,
    // read by its product before it stores (16 KB less at 32 basis rows).
    __device__ float* partial_row(unsigned q, unsigned m) const {
        return SWZ ? sf + m * SF + 32 * q : partials() + (q * E + m) * 8 * ks();
    }
    __device__ unsigned partial_step() const { return SWZ ? SF : 8 * ks(); }
    // Whether this block adds `prev` (the later blocks' dL/d(basis), where given): the first
    // feature chunk's blocks.
    __device__ bool adds_prev(const float* prev) const { return prev && blockIdx.y == 0; }
    // Starts copying tile e0's rows of `prev` where this block adds them into prev_rows()
    // (cp.async: they land by the next wait_copies(), so that their latency hides behind the
    // tile's products; read after them, they had made the accumulating launches measurably
    // longer than the first: docs/bench-log/32-symmetric-adjoint-h200.md).
    __device__ void fetch_prev(const float* __restrict__ prev, size_t e0, unsigned cnt) const {
        if (!adds_prev(prev)) return;
        for (unsigned k = threadIdx.x; k < cnt * bw; k += TC_THREADS)
            copy_async(prev_rows() + k, prev + e0 * bw + k);
    }
    // Sums the unit-vector gradients gu[a][k] of staged edges [g, g + TILE_G) over the warp's
    // features into unit_sums()[quarter] (every lane calls it): a reduce-scatter leaves lane l
    // edge l % 8's sum over its 8-lane group (7 shuffles for 8 values), two more shuffles sum
    // the groups; 27 shuffles per 8 edges where a sum per edge and component takes 120.
    __device__ __forceinline__ void add_unit_grads(float gu[3][TILE_G], unsigned g) const {
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            reduce_scatter_step<4>(gu[a], lane);
            reduce_scatter_step<2>(gu[a], lane);
            reduce_scatter_step<1>(gu[a], lane);
            float x = gu[a][0];
            x += __shfl_xor_sync(0xffffffffu, x, 8);
            x += __shfl_xor_sync(0xffffffffu, x, 16);
            if (lane < TILE_G) unit_sums()[(quarter * E + g + lane) * 3 + a] = x;
        }
    }
    // Adds one group of 8 staged weight columns [col, col + 8) to a warp's dL/d(basis) d (its
    // 16 edges, the basis rows by n-tile): dw is the edges' dL/dw of those columns as the A
    // fragment of the product with the weights transposed (lane (g, t): edges g and g + 8,
    // columns t and t + 4 in the mma's k slots t and t + 4). Lane (g, t) then reads weight
    // row 8 s + g of columns t and t + 4, (col + t) stride + 8 s + g: banks 24 t + g apart at
    // the shipped stride, all 32 distinct (columns 2 t and 2 t + 1, as the C fragment holds
    // them, had put lanes t and t + 2 on one bank: a fifth of the kernel's shared-memory
    // wavefronts were these conflicts' replays: docs/bench-log/36-adjoint-bank-conflicts.md).
    __device__ __forceinline__ void add_basis_grads(const float dw[4], unsigned col,
                                                    float d[TC_MAX_KSTEPS][4]) const {
        const unsigned g = lane / 4, ct = col + lane % 4;  // column t of the group
        unsigned ah[4], al[4];
        split_tf32(dw[0], ah[0], al[0]);
        split_tf32(dw[2], ah[1], al[1]);
        split_tf32(dw[1], ah[2], al[2]);
        split_tf32(dw[3], ah[3], al[3]);
#pragma unroll
        for (int s = 0; s < TC_MAX_KSTEPS; ++s) {
            if (s >= ks()) break;
            unsigned bh[2], bl[2];
            split_tf32(sw[at(ct, 8 * s + g)], bh[0], bl[0]);
            split_tf32(sw[at(ct + 4, 8 * s + g)], bh[1], bl[1]);
            mma_tf32(d[s], al, bh);
            mma_tf32(d[s], ah, bl);
            mma_tf32(d[s], ah, bh);
        }
    }
    // A warp's dL/d(basis) (add_basis_grads) into partial_row(quarter, its edges).
    __device__ __forceinline__ void store_partials(const float d[TC_MAX_KSTEPS][4]) const {
        // (Unswizzled, the offsets are written as before SWZ, which keeps the shipped entries'
        // machine code as it was; partial_row's form changed it.)
        const unsigned kr = SWZ ? partial_step() : 8 * ks();
        float* p = SWZ ? partial_row(quarter, 16 * group + lane / 4) + 2 * (lane % 4)
                       : partials() + (quarter * E + 16 * group + lane / 4) * kr + 2 * (lane % 4);
        if (SWZ) __syncwarp();  // every lane has read its dL/dw there
#pragma unroll
        for (int s = 0; s < TC_MAX_KSTEPS; ++s) {
            if (s >= ks()) break;
            p[8 * s] = d[s][0];
            p[8 * s + 1] = d[s][1];
            p[8 * kr + 8 * s] = d[s][2];
            p[8 * kr + 8 * s + 1] = d[s][3];
        }
    }
    // This warp's share of the tile's dL/d(basis): its 16 edges' dL/dw over its 96 columns
    // (in sf) times the weights transposed, into partial_row(quarter, its edges).
    __device__ void basis_grads() const {
        const unsigned g = lane / 4, t = lane % 4;
        float d[TC_MAX_KSTEPS][4] = {};
#pragma unroll 2
        for (int kk = 0; kk < 12; ++kk) {
            const unsigned col = (kk / 4) * CW + 32 * quarter + 8 * (kk % 4);
            const float* a0 = sf + (16 * group + g) * SF + col + t;
            const float* a1 = a0 + 8 * SF;
            const float dw[4] = {load_shared_volatile(a0), load_shared_volatile(a0 + 4),
                                 load_shared_volatile(a1), load_shared_volatile(a1 + 4)};
            add_basis_grads(dw, col, d);
        }
        store_partials(d);
    }
    // HALF: basis_grads from the split-f16 rows, per 16 of the warp's 96 columns an
    // m16n8k16 step for each 8 basis rows: the A fragments the edges' dL/dw, each edge's scaled
    // by the power of two of its largest over the warp's columns (largest[m]: the bits of the
    // warp's edge m's), the B fragments the weight rows transposed by ldmatrix.
    __device__ void basis_grads_h(const unsigned largest[16]) const {
        const unsigned g = lane / 4, t = lane % 4;
        float scale[2], unscale[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned field = split_scale_field(largest[g + 8 * r]);
            scale[r] = split_scale(field);
            unscale[r] = split_unscale(field) * wunscale;
        }
        float d[TC_MAX_KSTEPS][4] = {};
#pragma unroll 2
        for (int kk = 0; kk < 6; ++kk) {
            const unsigned col = (kk / 2) * CW + 32 * quarter + 16 * (kk % 2);
            const float* a0 = sf + (16 * group + g) * SF + col + 2 * t;
            const float* a1 = a0 + 8 * SF;
            const float2 x0 = *reinterpret_cast<const float2*>(a0);
            const float2 x1 = *reinterpret_cast<const float2*>(a1);
            const float2 x2 = *reinterpret_cast<const float2*>(a0 + 8);
            const float2 x3 = *reinterpret_cast<const float2*>(a1 + 8);
            uint4 ah, al;
            split_f16x2(x0.x * scale[0], x0.y * scale[0], ah.x, al.x);
            split_f16x2(x1.x * scale[1], x1.y * scale[1], ah.y, al.y);
            split_f16x2(x2.x * scale[0], x2.y * scale[0], ah.z, al.z);
            split_f16x2(x3.x * scale[1], x3.y * scale[1], ah.w, al.w);
            const unsigned rows = half_rows<true>(col);
#pragma unroll
            for (int s = 0; s < 3; ++s) {
                unsigned b[4];
                load_matrices_x4<true>(rows + 16 * s, b);
                mma_f16(d[s], al, b[0], b[1]);
                mma_f16(d[s], ah, b[2], b[3]);
                mma_f16(d[s], ah, b[0], b[1]);
            }
        }
#pragma unroll
        for (int s = 0; s < 3; ++s) {
            d[s][0] *= unscale[0], d[s][1] *= unscale[0];
            d[s][2] *= unscale[1], d[s][3] *= unscale[1];
        }
        store_partials(d);
    }
    // The tile's dL/d(basis) rows into gb (stored where this block holds every feature, added
    // where the features are split over blocks): the quarters' sums, then the unit-vector sums,
    // plus the rows of `prev` (the later blocks' sum, fetched: fetch_prev) where given.
    __device__ void store_basis_grads(float* gb, const float* prev, size_t e0,
                                      unsigned cnt) const {
        const bool alone = gridDim.y == 1;
        const unsigned kr = 8 * ks();
        float* rows = gb + e0 * bw;
        const float* before = adds_prev(prev) ? prev_rows() : nullptr;
        for (unsigned k = threadIdx.x; k < cnt * bw; k += TC_THREADS) {
            const unsigned m = k / bw, r = k % bw;
            float v;
            if (r < nb) {
                const float* p = SWZ ? partial_row(0, m) + r : partials() + m * kr + r;
                const unsigned apart = SWZ ? 32 : E * kr;  // quarter to quarter
                v = p[0] + p[apart];
                if (QUARTERS == 4) v = v + p[2 * apart] + p[3 * apart];
            } else {
                const float* u = unit_sums() + m * 3 + r - nb;
                v = u[0] + u[E * 3];
                if (QUARTERS == 4) v = v + u[2 * E * 3] + u[3 * E * 3];
            }
            if (before) v += before[k];
            if (alone) rows[k] = v;
            else atomicAdd(rows + k, v);
        }
    }
};
