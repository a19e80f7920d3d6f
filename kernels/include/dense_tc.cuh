// Dense layers of the separate-kernel path on tensor cores, f32 only: one layer, or a whole
// two-layer MLP (its SiLU between) in one launch, where cuBLAS took two products and a
// bias+SiLU kernel. Products in split half precision (kernels/include/f16_split.cuh: each row of
// inputs and of weights scaled by a power of two, each value held to ~2^-22 as hi + lo halves,
// three mma.m16n8k16 per 16 values of the reduction), accumulated in f32.
//   dense_tc:    y = x Wᵀ                                                    [N, J]
//   mlp_tc_fwd:  pre = x W1ᵀ, y = silu(pre + b1) W2ᵀ      out = [pre (N H) | y (N J)]
//   mlp_tc_adj:  gx = (g W2 ⊙ silu'(pre + b1)) W1                            [N, K]
// Weights come output-major ([outputs, reduction]: a linear layer's own layout for the
// forward, its transpose for the adjoint), packed by the host (src/ops/layers/dense_tc.rs `tc_weights`):
// [Jp, K] u32 with the outputs padded by zero rows to Jp, a multiple of 128, each row scaled
// and split, then Jp f32 inverse row scales.
// A block owns BM rows (16, src/ops/layers/dense_tc.rs BLOCK_ROWS; the code takes 32 too): it stages
// them in shared memory scaled and split (`Staged`, `stage`); its 8 warps, BM / 16 by rows and
// 8 / (BM / 16) by columns, each make 16 rows x NT tiles of 8 columns of a chunk of 128 output
// columns per pass, the weights read from global memory a few steps ahead (`WeightStream`).
// The hidden layer of an MLP is written in f32 to shared memory, then staged (scaled and
// split) like the inputs.
// Reductions are multiples of 16 and outputs of 8 (the host checks).
// Mirrors src/ops/dense_tc.rs. Included by kernels/layers/dense_tc.cu (the layers' entries) and
// kernels/layers/update_tc.cu (the update block in one launch).
#pragma once
#include "common.cuh"
#include "f16_split.cuh"

namespace dense_tc {

constexpr int THREADS = 256;
constexpr int CHUNK = 128;     // output columns per pass of the block
constexpr int MAX_WIDTH = 384;  // src/ops/layers/dense_tc.rs DENSE_TC_MAX_WIDTH

__device__ __forceinline__ uint4 ld4_global(const unsigned* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

// Words of a staged pair row of `width` values (as src/ops/layers/dense_tc.rs staged_stride): padded
// so that rows g and g + 1 start 64 bytes apart modulo 128, and a quarter warp's 16-byte
// fragment loads (two g, four t) hit all 32 banks once.
__host__ __device__ constexpr int staged_stride(int width) {
    return width + (width % 32 == 0 ? 16 : 0);
}

// A matrix of BM rows and `width` columns in shared memory, scaled and split into halves laid
// out as mma A fragments: row r = 16 G + g (g < 8) and r + 8 share a pair row G * 8 + g; its
// quad q (values 4q .. 4q + 3, step q / 4 and lane t = q % 4 of the mma) is one uint4 per plane,
// {row r (4q, 4q + 1), row r + 8 (4q, 4q + 1), row r (4q + 2, 4q + 3), row r + 8 (..)} as f16
// pairs: lane (g, t)'s A fragment of step s, its logical k (2t, 2t + 1, 2t + 8, 2t + 9) taken
// as physical 16 s + 4 t + (0, 1, 2, 3) (the weights' packing takes the same). A hi plane, then
// a lo plane; rinv holds each row's inverse scale.
struct Staged {
    unsigned* hi;
    float* rinv;  // [BM]
    int width;
    int pair_rows;  // BM / 2
    __device__ int stride() const { return staged_stride(width); }
    __device__ int plane() const { return pair_rows * stride(); }
    // Offset of the uint4 of (row group G, row g, quad q).
    __device__ int at(int G, int g, int q) const { return (G * 8 + g) * stride() + 4 * q; }
};

// Words of shared memory a Staged of BM rows and `width` values takes: two planes.
__host__ __device__ constexpr int staged_words(int bm, int width) {
    return bm * staged_stride(width);
}

// The power-of-two scale field of the rows whose largest magnitudes' bits `top` and `bottom`
// hold in each lane (warp reductions), with both rows' inverse scales put in s.rinv by lane 0.
struct PairScales {
    float top, bottom;
    __device__ PairScales(unsigned top_bits, unsigned bottom_bits, const Staged& s, int rt) {
        const unsigned ft = split_scale_field(__reduce_max_sync(0xffffffffu, top_bits));
        const unsigned fb = split_scale_field(__reduce_max_sync(0xffffffffu, bottom_bits));
        if ((threadIdx.x & 31) == 0) s.rinv[rt] = split_unscale(ft), s.rinv[rt + 8] = split_unscale(fb);
        top = split_scale(ft), bottom = split_scale(fb);
    }
};

// Quad q of rows 16 G + g (`a`) and + 8 (`b`) scaled, split and stored into s.
__device__ __forceinline__ void put_split(const Staged& s, int G, int g, int q, float4 a, float4 b,
                                          const PairScales& scale) {
    const float st = scale.top, sb = scale.bottom;
    uint4 h, l;
    split_f16x2(a.x * st, a.y * st, h.x, l.x);
    split_f16x2(b.x * sb, b.y * sb, h.y, l.y);
    split_f16x2(a.z * st, a.w * st, h.z, l.z);
    split_f16x2(b.z * sb, b.w * sb, h.w, l.w);
    const int o = s.at(G, g, q);
    *reinterpret_cast<uint4*>(s.hi + o) = h;
    *reinterpret_cast<uint4*>(s.hi + s.plane() + o) = l;
}

// Stages rows [0, BM) whose values `load` gives (load(r, q): values 4q .. 4q + 3 of row r as
// a float4, zero past the rows and the width) into s: each row scaled by the power of two of
// its largest magnitude, split, its inverse scale in s.rinv. One warp per pair row, each lane
// its quads q = lane + 32 i held in registers, so that a row's largest magnitude is one warp
// reduction and the values are made once. WIDTH: the width where known at compile time (a lane
// then holds only its row's quads), else 0. Synchronises after.
template <int BM, int WIDTH, class Load>
__device__ void stage_rows(Load load, const Staged& s) {
    constexpr int MAXQ = (WIDTH ? WIDTH : MAX_WIDTH) / 4 / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quads = s.width / 4;
    for (int pr = warp; pr < BM / 2; pr += THREADS / 32) {
        const int G = pr / 8, g = pr % 8, rt = 16 * G + g, rb = rt + 8;
        float4 top[MAXQ], bottom[MAXQ];
        unsigned mt = 0, mb = 0;
#pragma unroll
        for (int i = 0; i < MAXQ; ++i) {
            top[i] = load(rt, lane + 32 * i);
            bottom[i] = load(rb, lane + 32 * i);
            mt = max(mt, abs_max_bits(top[i]));
            mb = max(mb, abs_max_bits(bottom[i]));
        }
        const PairScales scale(mt, mb, s, rt);
#pragma unroll
        for (int i = 0; i < MAXQ; ++i) {
            const int q = lane + 32 * i;
            if (q >= quads) break;
            put_split(s, G, g, q, top[i], bottom[i], scale);
        }
    }
    __syncthreads();
}

// stage_rows of rows [0, BM) of `rows` (row r at rows + r ld, `valid` of them; zero past).
// GLOBAL: rows in global memory (read through the read-only path).
template <int BM, bool GLOBAL, int WIDTH>
__device__ void stage(const float* rows, int ld, int valid, const Staged& s) {
    const int quads = s.width / 4;
    auto load = [&](int r, int q) {
        if (r >= valid || q >= quads) return make_float4(0.f, 0.f, 0.f, 0.f);
        const float4* p = reinterpret_cast<const float4*>(rows + (size_t)r * ld) + q;
        return GLOBAL ? __ldg(p) : *p;
    };
    stage_rows<BM, WIDTH>(load, s);
}

// out[r, j] = Σ_k a[r, k] w[j, k] for the block's BM rows (a staged, K wide) and j < J; w the
// packed weights [Jp, K] (src/ops/layers/dense_tc.rs: per row and quad q one uint4 {hi (4q, 4q + 1),
// hi (4q + 2, 4q + 3), lo (..), lo (..)} as f16 pairs, the B fragment of lane t = q % 4 at
// step q / 4), then Jp f32 inverse row scales. KC is K where known at compile time (the
// model's 128, 256, 384: every weight offset then folds into the loads), else 0.
// emit(r, j, v, operands) takes outputs j, j + 1 of local rows r and r + 8 (an mma tile's
// fragment, v = (c0, c1, c2, c3), unscaled) with the operands emit.fetch(r, j) loaded at the
// chunk's first step (what the epilogue reads from global memory, requested early so that its
// wait can overlap the chunk's products). A warp walks its (chunk, 16-value step) pairs in one
// sequence and keeps the weights of the next P steps in flight in registers, across chunk ends
// too; the first P are requested when the stream is made, so that a kernel can make it before
// staging its rows. (With split TF32, more steps ahead measured the same as four:
// docs/bench-log/27-dense-half-bytes-overlap.md. A ring of weight slabs in shared memory,
// filled by bulk copies up to eight slabs ahead, was slower with split f16: BENCHMARKS.md,
// "Tried, not kept".)
#ifndef DENSE_TC_RING
#define DENSE_TC_RING 8  // a lane's uint4s of weights in flight
#endif
// The most steps ahead a ring of `most` can hold that divide a chunk's `steps` (0: any).
__host__ __device__ constexpr int ring_steps(int most, int steps) {
    int p = most;
    while (steps > 0 && p > 1 && steps % p != 0) --p;
    return p;
}

// MT: row tiles of 16 per warp, each taking the same weights (the update block's three vector
// components of 16 atoms, kernels/layers/update_tc.cu); the block's warps split BM / (16 MT) by rows.
template <int BM, int KC, int MT = 1>
struct WeightStream {
    static constexpr int WR = BM / (16 * MT), WC = 8 / WR, NT = CHUNK / 8 / WC;
    static_assert(WR * WC == 8 && WR * 16 * MT == BM, "warps tile the block's rows");
    // Steps fetched ahead; where the reduction is known, a divisor of a chunk's steps (so that
    // the ring's slots follow the unrolled steps).
    static constexpr int P = ring_steps(DENSE_TC_RING / NT, KC / 16);
    const unsigned* first;  // this lane's row of tile 0 at the first step
    const unsigned* next;   // the same at the next step to fetch
    const float* unscale;   // the rows' inverse scales [Jp]
    int k, J, steps, total, next_step = 0;  // steps: of a chunk
    uint4 ring[P][NT];

    __device__ __forceinline__ WeightStream(const unsigned* __restrict__ w, int K, int J_) : J(J_) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
        k = KC ? KC : K;
        steps = k / 16;
        const int chunks = (J + CHUNK - 1) / CHUNK;
        total = steps * chunks;
        unscale = reinterpret_cast<const float*>(w + (size_t)chunks * CHUNK * k);
        first = w + (size_t)(8 * (warp % WC) * NT + g) * k + 4 * t;
        next = first;
#pragma unroll
        for (int p = 0; p < P; ++p)
            if (p < total) load(ring[p]);
    }

    // The weights of the step whose tile-0 row starts at `at`.
    __device__ __forceinline__ void fetch(uint4 (&slot)[NT], const unsigned* at) const {
#pragma unroll
        for (int n = 0; n < NT; ++n) slot[n] = ld4_global(at + n * 8 * k);
    }

    // The next step's weights, then advanced 16 values, or to the next chunk's rows after the
    // last step.
    __device__ __forceinline__ void load(uint4 (&slot)[NT]) {
        fetch(slot, next);
        if (++next_step == steps) {
            next_step = 0;
            next += (size_t)CHUNK * k - 16 * (steps - 1);
        } else {
            next += 16;
        }
    }

    // Where this lane's warp works: its row group and tiles, and its rows' inverse scales.
    struct Place {
        int g, t, wr, wc;
        float top[MT], bottom[MT];  // rows row(m) and + 8
        __device__ Place(const Staged& a) {
            const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
            g = lane >> 2, t = lane & 3, wr = warp / WC, wc = warp % WC;
#pragma unroll
            for (int m = 0; m < MT; ++m) top[m] = a.rinv[row(m)], bottom[m] = a.rinv[row(m) + 8];
        }
        // The block's row of this lane's fragments (and + 8) in row tile m.
        __device__ int row(int m) const { return 16 * (wr * MT + m) + g; }
    };

    // Sums per tile: one per product order where registers allow (two chains of dependent mma
    // per tile instead of one).
    static constexpr int SUMS = NT <= 2 && MT == 1 ? 2 : 1;
    using Sums = float[SUMS][MT][NT][4];

    // Step s of a chunk: the products of the staged rows' 16 values with the weights in `slot`
    // (with two sums, hi·hi into the first and the cross terms into the second); row tile m's
    // values are `tile` words after the previous one's.
    __device__ __forceinline__ void step(Sums& acc, const unsigned* a_hi, const unsigned* a_lo,
                                         int tile, int s, const uint4 (&slot)[NT]) const {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const uint4 ah = *reinterpret_cast<const uint4*>(a_hi + m * tile + 16 * s);
            const uint4 al = *reinterpret_cast<const uint4*>(a_lo + m * tile + 16 * s);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const uint4& w = slot[n];
                float(&cross)[4] = acc[SUMS - 1][m][n];
                mma_f16(cross, al, w.x, w.y);
                mma_f16(cross, ah, w.z, w.w);
                mma_f16(acc[0][m][n], ah, w.x, w.y);
            }
        }
    }

    // A chunk's start: its sums zeroed, its epilogue's operands requested.
    template <class Emit>
    __device__ __forceinline__ void open_chunk(Sums& acc,
                                               typename Emit::Operands (&operands)[MT][NT],
                                               const Emit& emit, const Place& at, int c) const {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int col = c * CHUNK + 8 * (at.wc * NT + n);
                if (col < J) operands[m][n] = emit.fetch(at.row(m), col + 2 * at.t);
            }
#pragma unroll
        for (int u = 0; u < SUMS; ++u)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[u][m][n][i] = 0.f;
    }

    // A chunk's end: its sums unscaled (the rows' and the weight rows' inverse scales) and
    // emitted, row tiles in order for each column tile.
    template <class Emit>
    __device__ __forceinline__ void close_chunk(const Sums& acc,
                                                const typename Emit::Operands (&operands)[MT][NT],
                                                const Emit& emit, const Place& at, int c) const {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int col = c * CHUNK + 8 * (at.wc * NT + n) + 2 * at.t;
            const float2 w = *reinterpret_cast<const float2*>(unscale + col);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                float v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float sum = SUMS == 2 ? acc[0][m][n][i] + acc[SUMS - 1][m][n][i]
                                                : acc[0][m][n][i];
                    v[i] = sum * (i < 2 ? at.top[m] : at.bottom[m]) * (i % 2 ? w.y : w.x);
                }
                if (col - 2 * at.t < J) emit(at.row(m), col, v, operands[m][n]);
            }
        }
    }

    template <class Emit>
    __device__ __forceinline__ void run(const Staged& a, Emit emit) {
        const Place at(a);
        const unsigned* a_hi = a.hi + a.at(at.wr * MT, at.g, at.t);
        const unsigned* a_lo = a_hi + a.plane();
        const int tile = a.at(1, 0, 0);  // words from one row tile to the next
        Sums acc;
        typename Emit::Operands operands[MT][NT];
        if constexpr (KC > 0) {
            // The reduction known: every step of a chunk unrolled, its weights at fixed offsets
            // from the chunk's (the generic loop below spent most of its instructions on
            // counters, branches and pointer steps: docs/bench-log/30-dense-unrolled.md).
            constexpr int STEPS = KC / 16;
            static_assert(STEPS % P == 0, "a chunk's steps fill the ring a whole number of times");
            const int chunks = (J + CHUNK - 1) / CHUNK;
            const unsigned* chunk_w = first;  // the constructor fetched its steps 0..P-1
            for (int c = 0; c < chunks; ++c, chunk_w += (size_t)CHUNK * KC) {
                open_chunk(acc, operands, emit, at, c);
#pragma unroll
                for (int s = 0; s < STEPS; ++s) {
                    step(acc, a_hi, a_lo, tile, s, ring[s % P]);
                    if (s + P < STEPS) fetch(ring[s % P], chunk_w + 16 * (s + P));
                    else if (c + 1 < chunks)
                        fetch(ring[s % P], chunk_w + (size_t)CHUNK * KC + 16 * (s + P - STEPS));
                }
                close_chunk(acc, operands, emit, at, c);
            }
            return;
        }
        int c = 0, s = 0;  // the step being computed
        for (int q0 = 0; q0 < total; q0 += P) {
#pragma unroll
            for (int p = 0; p < P; ++p) {
                if (q0 + p >= total) break;
                if (s == 0) open_chunk(acc, operands, emit, at, c);
                step(acc, a_hi, a_lo, tile, s, ring[p]);
                if (q0 + p + P < total) load(ring[p]);
                if (s == steps - 1) close_chunk(acc, operands, emit, at, c);
                if (++s == steps) s = 0, ++c;
            }
        }
    }
};

// Nothing to fetch for an epilogue.
struct NoOperands {};

// Stores a fragment ((c0, c1): row r, columns j, j + 1; (c2, c3): row r + 8) into y [n, width]
// from row r0.
struct Store {
    float* y;
    int n, width, r0;
    using Operands = NoOperands;
    __device__ Operands fetch(int, int) const { return {}; }
    __device__ void operator()(int r, int j, const float (&v)[4], Operands = {}) const {
        if (r0 + r < n)
            *reinterpret_cast<float2*>(y + (size_t)(r0 + r) * width + j) = make_float2(v[0], v[1]);
        if (r0 + r + 8 < n)
            *reinterpret_cast<float2*>(y + (size_t)(r0 + r + 8) * width + j) =
                make_float2(v[2], v[3]);
    }
};

// A pair of values of rows r and r + 8 and one pair shared by both (a bias).
struct RowPairs {
    float2 top, bottom, shared;
};

// (x[r, j], x[r, j + 1]) of [n, width] from row r0, zero past n.
__device__ __forceinline__ float2 pair_at(const float* x, int n, int width, int r0, int r, int j) {
    if (r0 + r >= n) return make_float2(0.f, 0.f);
    return *reinterpret_cast<const float2*>(x + (size_t)(r0 + r) * width + j);
}

// Store with `add` [n, width] added: y = x Wᵀ + add.
struct StoreAdding {
    Store y;
    const float* add;
    using Operands = RowPairs;
    __device__ Operands fetch(int r, int j) const {
        return {pair_at(add, y.n, y.width, y.r0, r, j), pair_at(add, y.n, y.width, y.r0, r + 8, j),
                {}};
    }
    __device__ void operator()(int r, int j, const float (&v)[4], const Operands& a) const {
        y(r, j, {v[0] + a.top.x, v[1] + a.top.y, v[2] + a.bottom.x, v[3] + a.bottom.y});
    }
};

// A hidden layer in f32 in shared memory, [BM][width + 8] (row stride 8 banks apart modulo 32:
// a half warp's float2 stores of a fragment, four rows by four column pairs, hit every bank
// once), until it is staged for the next layer.
struct Hidden {
    float* x;
    int width;
    __device__ int ld() const { return width + 8; }
    // Rows r and r + 8, columns j, j + 1.
    __device__ void put(int r, int j, float2 top, float2 bottom) const {
        *reinterpret_cast<float2*>(x + r * ld() + j) = top;
        *reinterpret_cast<float2*>(x + (r + 8) * ld() + j) = bottom;
    }
};

// Words of shared memory a Hidden of BM rows takes.
__host__ __device__ constexpr int hidden_words(int bm, int width) { return bm * (width + 8); }

// The forward's hidden layer: pre stored, silu(pre + b) kept for the second layer.
struct HiddenFwd {
    Store pre;
    const float* b;
    Hidden hidden;
    using Operands = float2;
    __device__ Operands fetch(int, int j) const { return *reinterpret_cast<const float2*>(b + j); }
    __device__ void operator()(int r, int j, const float (&v)[4], Operands bias) const {
        pre(r, j, v);
        const float b0 = bias.x, b1 = bias.y;
        hidden.put(r, j, make_float2(silu_of(v[0] + b0), silu_of(v[1] + b1)),
                   make_float2(silu_of(v[2] + b0), silu_of(v[3] + b1)));
    }
};

// The adjoint's hidden layer: dL/d(pre) = dL/d(activation) silu'(pre + b), kept.
struct HiddenAdj {
    const float* pre;
    const float* b;
    Hidden hidden;
    int n, width, r0;
    using Operands = RowPairs;
    __device__ Operands fetch(int r, int j) const {
        return {pair_at(pre, n, width, r0, r, j), pair_at(pre, n, width, r0, r + 8, j),
                *reinterpret_cast<const float2*>(b + j)};
    }
    __device__ void operator()(int r, int j, const float (&v)[4], const Operands& o) const {
        const float2 p = o.top, q = o.bottom;
        const float b0 = o.shared.x, b1 = o.shared.y;
        hidden.put(r, j, make_float2(v[0] * silu_grad(p.x + b0), v[1] * silu_grad(p.y + b1)),
                   make_float2(v[2] * silu_grad(q.x + b0), v[3] * silu_grad(q.y + b1)));
    }
};

// The readout's hidden layer: its share of each row's energy, Σ_j silu(pre + b1)_j w_j, summed
// in `energy` (shared, one per row), and the forces' seed −w ⊙ silu'(pre + b1) kept for the
// layer back to the inputs.
struct ReadoutHidden {
    const float* b1;
    const float* w;
    Hidden hidden;
    float* energy;
    using Operands = float4;  // b1[j], b1[j + 1], w[j], w[j + 1]
    __device__ Operands fetch(int, int j) const {
        const float2 b = *reinterpret_cast<const float2*>(b1 + j);
        const float2 o = *reinterpret_cast<const float2*>(w + j);
        return make_float4(b.x, b.y, o.x, o.y);
    }
    __device__ void operator()(int r, int j, const float (&v)[4], const Operands& o) const {
        const float b0 = o.x, bb = o.y, w0 = o.z, w1 = o.w;
        const float p0 = v[0] + b0, p1 = v[1] + bb, p2 = v[2] + b0, p3 = v[3] + bb;
        atomicAdd(energy + r, silu_of(p0) * w0 + silu_of(p1) * w1);
        atomicAdd(energy + r + 8, silu_of(p2) * w0 + silu_of(p3) * w1);
        hidden.put(r, j, make_float2(-w0 * silu_grad(p0), -w1 * silu_grad(p1)),
                   make_float2(-w0 * silu_grad(p2), -w1 * silu_grad(p3)));
    }
};

// A block's shared memory (src/ops/layers/dense_tc.rs `Dims::config` sizes it): the staged inputs
// (k wide), then where h > 0 the hidden layer staged and in f32, then the rows' inverse scales
// (inputs, hidden), then `extra` words (the readout's energies).
struct Smem {
    Staged xs, hs;
    Hidden hidden;
    float* extra;
    template <int BM>
    __device__ static Smem make(int k, int h) {
        extern __shared__ __align__(16) unsigned dense_tc_smem[];
        unsigned* p = dense_tc_smem;
        Smem m;
        m.xs = Staged{p, nullptr, k, BM / 2};
        p += staged_words(BM, k);
        m.hs = Staged{p, nullptr, h, BM / 2};
        p += h ? staged_words(BM, h) : 0;
        m.hidden = Hidden{reinterpret_cast<float*>(p), h};
        p += h ? hidden_words(BM, h) : 0;
        m.xs.rinv = reinterpret_cast<float*>(p);
        m.hs.rinv = m.xs.rinv + BM;
        m.extra = m.hs.rinv + (h ? BM : 0);
        return m;
    }
};

// y = x Wᵀ, plus `add` [n, j] where given.
template <int BM, int KC>
__device__ void dense(const float* x, const float* add, const unsigned* w, float* y, int n, int k,
                      int j) {
    const int r0 = blockIdx.x * BM;
    const Smem m = Smem::make<BM>(k, 0);
    WeightStream<BM, KC> weights(w, k, j);
    wait_for_previous_kernel();  // the weights above are the model's
    stage<BM, true, KC>(x + (size_t)r0 * k, k, n - r0, m.xs);
    const Store store{y, n, j, r0};
    if (add) weights.run(m.xs, StoreAdding{store, add});
    else weights.run(m.xs, store);
}

// The readout and the start of the forces' adjoint in one launch (the readout's gradient
// depends on nothing downstream): for rows x [n, k], b1 [h], the output weights w [h],
// per-element constants, w1 [h, k] and w1 transposed [k, h] (packed) and element indices,
//   out = [gx = (−w ⊙ silu'(x W1ᵀ + b1)) W1  (n k) | energy = silu(x W1ᵀ + b1) w + constant (n)].
template <int BM, int KC>
__device__ void readout(const float* x, const float* b1, const float* w, const float* constant,
                        const unsigned* w1, const unsigned* w1t, const unsigned* species,
                        float* out, int n, int k, int h) {
    const int r0 = blockIdx.x * BM;
    const Smem m = Smem::make<BM>(k, h);
    float* energy = m.extra;
    if (threadIdx.x < BM) energy[threadIdx.x] = 0.f;
    WeightStream<BM, KC> hidden(w1, k, h);
    wait_for_previous_kernel();  // the weights above are the model's
    stage<BM, true, KC>(x + (size_t)r0 * k, k, n - r0, m.xs);  // its barrier orders the zeros too
    hidden.run(m.xs, ReadoutHidden{b1, w, m.hidden, energy});
    WeightStream<BM, 0> back(w1t, h, k);
    __syncthreads();
    const int r = r0 + threadIdx.x;
    if (threadIdx.x < BM && r < n)
        out[(size_t)n * k + r] = energy[threadIdx.x] + constant[species[r]];
    stage<BM, false, 0>(m.hidden.x, m.hidden.ld(), BM, m.hs);
    back.run(m.hs, Store{out, n, k, r0});
}

// Two layers, x [n, k] → hidden [h] → [j]; `ADJ` selects the hidden layer's epilogue. The
// forward's output holds pre [n, h] and then y [n, j]. KC and HC: k and h where known at
// compile time, else 0. (Splitting the second layer over a block per output chunk where the
// row blocks leave multiprocessors idle, each with its own copy of the hidden layer, was
// faster while a step cost ~75 instructions; with the widths unrolled it was not:
// docs/bench-log/28-compile-time-basis.md and docs/bench-log/30-dense-unrolled.md.)
template <int BM, int KC, int HC, bool ADJ>
__device__ void mlp(const float* x, const float* b1, const float* pre, const unsigned* w1,
                    const unsigned* w2, float* out, int n, int k, int h, int j) {
    const int r0 = blockIdx.x * BM;
    const Smem m = Smem::make<BM>(k, h);
    WeightStream<BM, KC> first(w1, k, h);
    wait_for_previous_kernel();  // the weights above are the model's
    stage<BM, true, KC>(x + (size_t)r0 * k, k, n - r0, m.xs);
    if constexpr (ADJ) {
        first.run(m.xs, HiddenAdj{pre, b1, m.hidden, n, h, r0});
    } else {
        first.run(m.xs, HiddenFwd{Store{out, n, h, r0}, b1, m.hidden});
        out += (size_t)n * h;
    }
    WeightStream<BM, HC> second(w2, h, j);  // its first loads overlap the barrier and staging
    __syncthreads();
    stage<BM, false, HC>(m.hidden.x, m.hidden.ld(), BM, m.hs);
    second.run(m.hs, Store{out, n, j, r0});
}

}  // namespace dense_tc
