// Dense layers of the separate-kernel path on tensor cores, f32 only: one layer, or a whole
// two-layer MLP (its SiLU between) in one launch, where cuBLAS took two products and a
// bias+SiLU kernel. Products in split TF32 (kernels/tf32.cuh: three mma per value pair, each
// value held to ~2^-20), accumulated in f32.
//   dense_tc:    y = x Wᵀ                                                    [N, J]
//   mlp_tc_fwd:  pre = x W1ᵀ, y = silu(pre + b1) W2ᵀ      out = [pre (N H) | y (N J)]
//   mlp_tc_adj:  gx = (g W2 ⊙ silu'(pre + b1)) W1                            [N, K]
// Weights come output-major ([outputs, reduction]: a linear layer's own layout for the
// forward, its transpose for the adjoint), [Jp, K] with the outputs padded by zero rows to Jp,
// a multiple of 128.
// A block owns BM rows (16 or 32): it stages them in shared memory split into hi and lo planes,
// laid out so that each mma's A fragment is one float4 per plane (`Staged`); its 8 warps, BM / 16
// by rows and 8 / (BM / 16) by columns, each make 16 rows x NT tiles of 8 columns of a chunk of
// 128 output columns per pass, the weights read from global memory a few steps ahead
// (`WeightStream`). The hidden layer of an MLP stays in shared memory in the same split layout.
// Reductions are multiples of 16 and outputs of 8 (the host checks).
// Mirrors src/ops/dense_tc.rs.
#include "common.cuh"
#include "tf32.cuh"

namespace dense_tc {

constexpr int THREADS = 256;
constexpr int CHUNK = 128;  // output columns per pass of the block

__device__ __forceinline__ float4 ld4_global(const float* p) {
    return __ldg(reinterpret_cast<const float4*>(p));
}

// A matrix of BM rows and `width` columns in shared memory as mma A fragments: for row group G
// (16 rows), row g < 8 of it and column pair c, the float4 (row g, 2c), (row g + 8, 2c),
// (row g, 2c + 1), (row g + 8, 2c + 1), in a hi plane and a lo plane. Lane (g, t) of a warp
// then reads its fragment for logical k (t, t + 4) = physical (2c, 2c + 1) as one float4 per
// plane. Each (G, g) row of pairs is 2 width + 4 floats long, so that a quarter warp's float4s
// (two g, four t at 8-float steps) hit all 32 banks once.
struct Staged {
    float* hi;  // the lo plane follows it
    int width;
    int pair_rows;  // BM / 2
    __device__ int row_stride() const { return 2 * width + 4; }
    __device__ int plane() const { return pair_rows * row_stride(); }
    // Offset of the float4 of (row group G, row g, column pair c).
    __device__ int at(int G, int g, int c) const { return (G * 8 + g) * row_stride() + 4 * c; }
    // Stores (row g, 2c), (g + 8, 2c), (g, 2c + 1), (g + 8, 2c + 1) of group G, split.
    __device__ void put(int G, int g, int c, float4 v) const {
        unsigned h[4], l[4];
        split_tf32(v.x, h[0], l[0]);
        split_tf32(v.y, h[1], l[1]);
        split_tf32(v.z, h[2], l[2]);
        split_tf32(v.w, h[3], l[3]);
        const int o = at(G, g, c);
        *reinterpret_cast<uint4*>(hi + o) = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4*>(hi + plane() + o) = make_uint4(l[0], l[1], l[2], l[3]);
    }
};

template <int BM>
__device__ Staged staged(float* base, int width) {
    return Staged{base, width, BM / 2};
}

// Rows [r0, r0 + BM) of x [n, width] into `s` (zero past n). Synchronises after. A thread
// issues the loads of up to AHEAD items before it splits and stores any of them (the compiler
// had taken them two at a time: three round trips in a row at width 384; alone this measured
// neither faster nor slower).
template <int BM>
__device__ void stage_rows(const float* __restrict__ x, int n, int width, int r0, const Staged& s) {
    constexpr int AHEAD = 8;
    const int pairs = width / 2, items = BM / 2 * pairs;
    for (int first = threadIdx.x; first < items; first += AHEAD * THREADS) {
        float2 top[AHEAD], bottom[AHEAD];
#pragma unroll
        for (int u = 0; u < AHEAD; ++u) {
            const int item = first + u * THREADS;
            const int row = item / pairs, c = item - row * pairs;  // row: G * 8 + g
            const int r = r0 + 16 * (row / 8) + row % 8;
            const float* at = x + (size_t)r * width + 2 * c;
            const bool in = item < items;
            top[u] = in && r < n ? *reinterpret_cast<const float2*>(at) : make_float2(0.f, 0.f);
            bottom[u] = in && r + 8 < n ? *reinterpret_cast<const float2*>(at + 8 * (size_t)width)
                                        : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < AHEAD; ++u) {
            const int item = first + u * THREADS;
            if (item >= items) break;
            const int row = item / pairs, c = item - row * pairs;
            s.put(row / 8, row % 8, c, make_float4(top[u].x, bottom[u].x, top[u].y, bottom[u].y));
        }
    }
    __syncthreads();
}

// out[r, j] = Σ_k a[r, k] w[j, k] for the block's BM rows (a staged, K wide) and j < J; w the
// weights [Jp, K] in f32 (Jp = J rounded up to CHUNK, zero rows past J), split into TF32 hi and
// lo as they are used (reading split planes took twice the bytes: the dense layers 10% slower
// at 64 aspirins). KC is K where known at compile time (the model's 128, 256, 384: every weight
// offset then folds into the loads), else 0.
// emit(r, j, v, operands) takes outputs j, j + 1 of local rows r and r + 8 (an mma tile's
// fragment, v = (c0, c1, c2, c3)) with the operands emit.fetch(r, j) loaded at the chunk's first
// step (what the epilogue reads from global memory, requested early so that its wait can overlap
// the chunk's products; alone this measured neither faster nor slower). A warp walks its (chunk,
// 16-value step) pairs in one sequence and keeps the weights of the next P steps in flight in
// registers, across chunk ends too (six or eight steps ahead measured the same as four,
// benches/micro/dense_layers.cu); the first P are requested when the stream is made, so that a
// kernel can make it before staging its rows.
// mma m of step s pairs logical k (t, t + 4) with physical 16 s + 4t + 2m + (0, 1), the same
// for a and w, so that every fragment is one float4 (a) or one half of one (w).
#ifndef DENSE_TC_RING
#define DENSE_TC_RING 8  // a lane's float4s of weights in flight (benches/micro/dense_layers.cu)
#endif
// The most steps ahead a ring of `most` can hold that divide a chunk's `steps` (0: any).
__host__ __device__ constexpr int ring_steps(int most, int steps) {
    int p = most;
    while (steps > 0 && p > 1 && steps % p != 0) --p;
    return p;
}

template <int BM, int KC>
struct WeightStream {
    static constexpr int WR = BM / 16, WC = 8 / WR, NT = CHUNK / 8 / WC;
    // Steps fetched ahead; where the reduction is known, a divisor of a chunk's steps (so that
    // the ring's slots follow the unrolled steps).
    static constexpr int P = ring_steps(DENSE_TC_RING / NT, KC / 16);
    // Sums per tile: one per mma of a step where registers allow (two chains of dependent mma
    // per tile instead of one).
    static constexpr int SUMS = NT <= 2 ? 2 : 1;
    const float* first;  // this lane's row of tile 0 at the first step
    const float* next;   // the same at the next step to fetch
    int k, J, steps, total, next_step = 0;  // steps: of a chunk
    float4 ring[P][NT];

    __device__ __forceinline__ WeightStream(const float* __restrict__ w, int K, int J_) : J(J_) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
        k = KC ? KC : K;
        steps = k / 16;
        total = steps * ((J + CHUNK - 1) / CHUNK);
        first = w + (size_t)(8 * (warp % WC) * NT + g) * k + 4 * t;
        next = first;
#pragma unroll
        for (int p = 0; p < P; ++p)
            if (p < total) load(ring[p]);
    }

    // The weights of the step whose tile-0 row starts at `at`.
    __device__ __forceinline__ void fetch(float4 (&slot)[NT], const float* at) const {
#pragma unroll
        for (int n = 0; n < NT; ++n) slot[n] = ld4_global(at + n * 8 * k);
    }

    // The next step's weights, then advanced 16 values, or to the next chunk's rows after the
    // last step.
    __device__ __forceinline__ void load(float4 (&slot)[NT]) {
        fetch(slot, next);
        if (++next_step == steps) {
            next_step = 0;
            next += (size_t)CHUNK * k - 16 * (steps - 1);
        } else {
            next += 16;
        }
    }

    // Where this lane's warp works: its row group and tiles.
    struct Place {
        int g, t, wr, wc;
        __device__ Place() {
            const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
            g = lane >> 2, t = lane & 3, wr = warp / WC, wc = warp % WC;
        }
    };

    // Step s of a chunk: the products of the staged rows' 16 values with the weights in `slot`.
    __device__ __forceinline__ void step(float (&acc)[SUMS][NT][4], const float* a_hi,
                                         const float* a_lo, int s, const float4 (&slot)[NT]) const {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const uint4 ah4 = *reinterpret_cast<const uint4*>(a_hi + 32 * s + 4 * m);
            const uint4 al4 = *reinterpret_cast<const uint4*>(a_lo + 32 * s + 4 * m);
            const unsigned ah[4] = {ah4.x, ah4.y, ah4.z, ah4.w};
            const unsigned al[4] = {al4.x, al4.y, al4.z, al4.w};
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const float4& w4 = slot[n];
                unsigned bh[2], bl[2];
                split_tf32(m ? w4.z : w4.x, bh[0], bl[0]);
                split_tf32(m ? w4.w : w4.y, bh[1], bl[1]);
                float(&sum)[4] = acc[m % SUMS][n];
                mma_tf32(sum, al, bh);
                mma_tf32(sum, ah, bl);
                mma_tf32(sum, ah, bh);
            }
        }
    }

    // A chunk's start: its sums zeroed, its epilogue's operands requested.
    template <class Emit>
    __device__ __forceinline__ void open_chunk(float (&acc)[SUMS][NT][4],
                                               typename Emit::Operands (&operands)[NT],
                                               const Emit& emit, const Place& at, int c) const {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int col = c * CHUNK + 8 * (at.wc * NT + n);
            if (col < J) operands[n] = emit.fetch(16 * at.wr + at.g, col + 2 * at.t);
        }
#pragma unroll
        for (int u = 0; u < SUMS; ++u)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[u][n][i] = 0.f;
    }

    // A chunk's end: its sums emitted.
    template <class Emit>
    __device__ __forceinline__ void close_chunk(const float (&acc)[SUMS][NT][4],
                                                const typename Emit::Operands (&operands)[NT],
                                                const Emit& emit, const Place& at, int c) const {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                v[i] = SUMS == 2 ? acc[0][n][i] + acc[SUMS - 1][n][i] : acc[0][n][i];
            const int col = c * CHUNK + 8 * (at.wc * NT + n);
            if (col < J) emit(16 * at.wr + at.g, col + 2 * at.t, v, operands[n]);
        }
    }

    template <class Emit>
    __device__ __forceinline__ void run(const Staged& a, Emit emit) {
        const Place at;
        const float* a_hi = a.hi + a.at(at.wr, at.g, 2 * at.t);
        const float* a_lo = a_hi + a.plane();
        float acc[SUMS][NT][4];
        typename Emit::Operands operands[NT];
        if constexpr (KC > 0) {
            // The reduction known: every step of a chunk unrolled, its weights at fixed offsets
            // from the chunk's (the generic loop below spent ~60% of its instructions on
            // counters, branches and pointer steps).
            constexpr int STEPS = KC / 16;
            static_assert(STEPS % P == 0, "a chunk's steps fill the ring a whole number of times");
            const int chunks = (J + CHUNK - 1) / CHUNK;
            const float* chunk_w = first;  // the constructor fetched its steps 0..P-1
            for (int c = 0; c < chunks; ++c, chunk_w += (size_t)CHUNK * KC) {
                open_chunk(acc, operands, emit, at, c);
#pragma unroll
                for (int s = 0; s < STEPS; ++s) {
                    step(acc, a_hi, a_lo, s, ring[s % P]);
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
                step(acc, a_hi, a_lo, s, ring[p]);
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

// The forward's hidden layer: pre stored, silu(pre + b) staged for the second layer.
struct HiddenFwd {
    Store pre;
    const float* b;
    Staged hidden;
    using Operands = float2;
    __device__ Operands fetch(int, int j) const { return *reinterpret_cast<const float2*>(b + j); }
    __device__ void operator()(int r, int j, const float (&v)[4], Operands bias) const {
        pre(r, j, v);
        const float b0 = bias.x, b1 = bias.y;
        hidden.put(r / 16, r % 16, j / 2,
                   make_float4(silu_of(v[0] + b0), silu_of(v[2] + b0), silu_of(v[1] + b1),
                               silu_of(v[3] + b1)));
    }
};

// The adjoint's hidden layer: dL/d(pre) = dL/d(activation) silu'(pre + b), staged.
struct HiddenAdj {
    const float* pre;
    const float* b;
    Staged hidden;
    int n, width, r0;
    using Operands = RowPairs;
    __device__ Operands fetch(int r, int j) const {
        return {pair_at(pre, n, width, r0, r, j), pair_at(pre, n, width, r0, r + 8, j),
                *reinterpret_cast<const float2*>(b + j)};
    }
    __device__ void operator()(int r, int j, const float (&v)[4], const Operands& o) const {
        const float2 p = o.top, q = o.bottom;
        const float b0 = o.shared.x, b1 = o.shared.y;
        hidden.put(r / 16, r % 16, j / 2,
                   make_float4(v[0] * silu_grad(p.x + b0), v[2] * silu_grad(q.x + b0),
                               v[1] * silu_grad(p.y + b1), v[3] * silu_grad(q.y + b1)));
    }
};

// The readout's hidden layer: its share of each row's energy, Σ_j silu(pre + b1)_j w_j, summed
// in `energy` (shared, one per row), and the forces' seed −w ⊙ silu'(pre + b1) staged for the
// layer back to the inputs.
struct ReadoutHidden {
    const float* b1;
    const float* w;
    Staged hidden;
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
        hidden.put(r / 16, r % 16, j / 2,
                   make_float4(-w0 * silu_grad(p0), -w0 * silu_grad(p2), -w1 * silu_grad(p1),
                               -w1 * silu_grad(p3)));
    }
};

// y = x Wᵀ, plus `add` [n, j] where given.
template <int BM, int KC>
__device__ void dense(const float* x, const float* w, const float* add, float* y, int n, int k,
                      int j) {
    extern __shared__ __align__(16) float dense_tc_smem[];
    const int r0 = blockIdx.x * BM;
    const Staged xs = staged<BM>(dense_tc_smem, k);
    WeightStream<BM, KC> weights(w, k, j);
    wait_for_previous_kernel();  // the weights above are the model's
    stage_rows<BM>(x, n, k, r0, xs);
    const Store store{y, n, j, r0};
    if (add) weights.run(xs, StoreAdding{store, add});
    else weights.run(xs, store);
}

// The readout and the start of the forces' adjoint in one launch (the readout's gradient
// depends on nothing downstream): for rows x [n, k], w1 [h, k] (split), b1 [h], the output
// weights w [h] and w1 transposed [k, h] (split), per-element constants and element indices,
//   out = [gx = (−w ⊙ silu'(x W1ᵀ + b1)) W1  (n k) | energy = silu(x W1ᵀ + b1) w + constant (n)].
template <int BM, int KC>
__device__ void readout(const float* x, const float* w1, const float* b1, const float* w,
                        const float* w1t, const float* constant, const unsigned* species,
                        float* out, int n, int k, int h) {
    extern __shared__ __align__(16) float dense_tc_smem[];
    const int r0 = blockIdx.x * BM;
    const Staged xs = staged<BM>(dense_tc_smem, k);
    const Staged hs = staged<BM>(dense_tc_smem + 2 * xs.plane(), h);
    float* energy = dense_tc_smem + 2 * xs.plane() + 2 * hs.plane();
    if (threadIdx.x < BM) energy[threadIdx.x] = 0.f;
    WeightStream<BM, KC> hidden(w1, k, h);
    wait_for_previous_kernel();  // the weights above are the model's
    stage_rows<BM>(x, n, k, r0, xs);  // its barrier orders the zeros too
    hidden.run(xs, ReadoutHidden{b1, w, hs, energy});
    WeightStream<BM, 0> back(w1t, h, k);
    __syncthreads();
    const int r = r0 + threadIdx.x;
    if (threadIdx.x < BM && r < n)
        out[(size_t)n * k + r] = energy[threadIdx.x] + constant[species[r]];
    back.run(hs, Store{out, n, k, r0});
}

// Two layers, x [n, k] → hidden [h] → [j]; `ADJ` selects the hidden layer's epilogue. The
// forward's output holds pre [n, h] and then y [n, j]. KC and HC: k and h where known at
// compile time, else 0. (Splitting the second layer over a block per output chunk where the
// row blocks leave multiprocessors idle, each with its own copy of the hidden layer, was
// faster while a step cost ~75 instructions; with the widths unrolled it was not: BENCHMARKS.md.)
template <int BM, int KC, int HC, bool ADJ>
__device__ void mlp(const float* x, const float* w1, const float* b1, const float* pre,
                    const float* w2, float* out, int n, int k, int h, int j) {
    extern __shared__ __align__(16) float dense_tc_smem[];
    const int r0 = blockIdx.x * BM;
    const Staged xs = staged<BM>(dense_tc_smem, k);
    const Staged hs = staged<BM>(dense_tc_smem + 2 * xs.plane(), h);
    WeightStream<BM, KC> first(w1, k, h);
    wait_for_previous_kernel();  // the weights above are the model's
    stage_rows<BM>(x, n, k, r0, xs);
    if constexpr (ADJ) {
        first.run(xs, HiddenAdj{pre, b1, hs, n, h, r0});
    } else {
        first.run(xs, HiddenFwd{Store{out, n, h, r0}, b1, hs});
        out += (size_t)n * h;
    }
    WeightStream<BM, HC> second(w2, h, j);  // its first loads overlap the barrier
    __syncthreads();
    second.run(hs, Store{out, n, j, r0});
}

}  // namespace dense_tc

#define READOUT_TC(BM, KC)                                                                 \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        readout_tc_##BM##_##KC##_f32(const float* x, const float* w1, const float* b1,     \
                                     const float* w, const float* w1t,                     \
                                     const float* constant, const unsigned int* species,   \
                                     float* out, size_t n, size_t k, size_t h) {           \
        dense_tc::readout<BM, KC>(x, w1, b1, w, w1t, constant, species, out, (int)n,       \
                                  (int)k, (int)h);                                         \
    }
// One instantiation per block height BM (16, 32: the host picks by row count) and widths: KC
// (and HC) the model's, or 0 for any (`dense_tc_16_0_f32`, `mlp_tc_fwd_16_128_f32`, ...).
#define DENSE_TC(BM, KC)                                                                   \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        dense_tc_##BM##_##KC##_f32(const float* x, const float* w, float* y, size_t n,     \
                                   size_t k, size_t j) {                                   \
        dense_tc::dense<BM, KC>(x, w, nullptr, y, (int)n, (int)k, (int)j);                 \
    }
// The same plus `add` [n, j] (the mixing layer's adjoint adds the vector rows' gradient).
#define DENSE_TC_ADD(BM, KC)                                                               \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        dense_tc_add_##BM##_##KC##_f32(const float* x, const float* w, const float* add,   \
                                       float* y, size_t n, size_t k, size_t j) {           \
        dense_tc::dense<BM, KC>(x, w, add, y, (int)n, (int)k, (int)j);                     \
    }
#define MLP_TC_FWD(BM, KC, HC)                                                             \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        mlp_tc_fwd_##BM##_##KC##_f32(const float* x, const float* w1, const float* b1,     \
                                     const float* w2, float* out, size_t n, size_t k,      \
                                     size_t h, size_t j) {                                 \
        dense_tc::mlp<BM, KC, HC, false>(x, w1, b1, nullptr, w2, out, (int)n, (int)k,      \
                                         (int)h, (int)j);                                  \
    }
// The adjoint's first layer reduces over the MLP's outputs (JC), its second over h (HC).
#define MLP_TC_ADJ(BM, JC, HC)                                                             \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        mlp_tc_adj_##BM##_##JC##_f32(const float* g, const float* pre, const float* b1,    \
                                     const float* w2, const float* w1, float* gx,          \
                                     size_t n, size_t j, size_t h, size_t k) {             \
        dense_tc::mlp<BM, JC, HC, true>(g, w2, b1, pre, w1, gx, (int)n, (int)j, (int)h,    \
                                        (int)k);                                           \
    }
#define DENSE_TC_ALL(BM)                                                                   \
    DENSE_TC(BM, 0)                                                                        \
    DENSE_TC(BM, 128)                                                                      \
    DENSE_TC(BM, 256)                                                                      \
    DENSE_TC_ADD(BM, 0)                                                                    \
    DENSE_TC_ADD(BM, 256)                                                                  \
    READOUT_TC(BM, 0)                                                                      \
    READOUT_TC(BM, 128)                                                                    \
    MLP_TC_FWD(BM, 0, 0)                                                                   \
    MLP_TC_FWD(BM, 128, 128)                                                               \
    MLP_TC_FWD(BM, 256, 128)                                                               \
    MLP_TC_ADJ(BM, 0, 0)                                                                   \
    MLP_TC_ADJ(BM, 384, 128)
DENSE_TC_ALL(16)
DENSE_TC_ALL(32)
