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

// Rows [r0, r0 + BM) of x [n, width] into `s` (zero past n). Synchronises after.
template <int BM>
__device__ void stage_rows(const float* __restrict__ x, int n, int width, int r0, const Staged& s) {
    const int pairs = width / 2;
    for (int item = threadIdx.x; item < BM / 2 * pairs; item += THREADS) {
        const int row = item / pairs, c = item - row * pairs;  // row: G * 8 + g
        const int G = row / 8, g = row % 8, top = r0 + 16 * G + g, bottom = top + 8;
        const float2 zero = make_float2(0.f, 0.f);
        const float2 a =
            top < n ? *reinterpret_cast<const float2*>(x + (size_t)top * width + 2 * c) : zero;
        const float2 b = bottom < n
                             ? *reinterpret_cast<const float2*>(x + (size_t)bottom * width + 2 * c)
                             : zero;
        s.put(G, g, c, make_float4(a.x, b.x, a.y, b.y));
    }
    __syncthreads();
}

// out[r, j] = Σ_k a[r, k] w[j, k] for the block's BM rows (a staged, K wide) and j < J; w the
// weights [Jp, K] in f32 (Jp = J rounded up to CHUNK, zero rows past J), split into TF32 hi and
// lo as they are used (reading split planes took twice the bytes: the dense layers 10% slower
// at 64 aspirins). KC is K where known at compile time (the model's 128, 256, 384: every weight
// offset then folds into the loads), else 0.
// emit(r, j, c0, c1, c2, c3) takes outputs j, j + 1 of local rows r and r + 8 (an mma tile's
// fragment). A warp walks its (chunk, 16-value step) pairs in one sequence and keeps the
// weights of the next P steps in flight in registers, across chunk ends too (eight steps ahead
// measured the same as four with 1.7x the code); the first P are requested when the stream is
// made, so that a kernel can make it before staging its rows.
// mma m of step s pairs logical k (t, t + 4) with physical 16 s + 4t + 2m + (0, 1), the same
// for a and w, so that every fragment is one float4 (a) or one half of one (w).
template <int BM, int KC>
struct WeightStream {
    static constexpr int WR = BM / 16, WC = 8 / WR, NT = CHUNK / 8 / WC, P = 8 / NT;
    // Sums per tile: one per mma of a step where registers allow (two chains of dependent mma
    // per tile instead of one).
    static constexpr int SUMS = NT <= 2 ? 2 : 1;
    const float* next;  // this lane's row of tile 0 at the next step to fetch
    int k, J, steps, total, next_step = 0;
    float4 ring[P][NT];

    __device__ __forceinline__ WeightStream(const float* __restrict__ w, int K, int J_) : J(J_) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
        k = KC ? KC : K;
        steps = k / 16;
        total = steps * ((J + CHUNK - 1) / CHUNK);
        next = w + (size_t)(8 * (warp % WC) * NT + g) * k + 4 * t;
#pragma unroll
        for (int p = 0; p < P; ++p)
            if (p < total) load(ring[p]);
    }

    // The next step's weights, then advanced 16 values, or to the next chunk's rows after the
    // last step.
    __device__ __forceinline__ void load(float4 (&slot)[NT]) {
#pragma unroll
        for (int n = 0; n < NT; ++n) slot[n] = ld4_global(next + n * 8 * k);
        if (++next_step == steps) {
            next_step = 0;
            next += (size_t)CHUNK * k - 16 * (steps - 1);
        } else {
            next += 16;
        }
    }

    template <class Emit>
    __device__ __forceinline__ void run(const Staged& a, Emit emit) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
        const int wr = warp / WC, wc = warp % WC;
        const float* a_hi = a.hi + a.at(wr, g, 2 * t);
        const float* a_lo = a_hi + a.plane();
        float acc[SUMS][NT][4];
        int c = 0, s = 0;  // the step being computed
        for (int q0 = 0; q0 < total; q0 += P) {
#pragma unroll
            for (int p = 0; p < P; ++p) {
                if (q0 + p >= total) break;
                if (s == 0) {
#pragma unroll
                    for (int u = 0; u < SUMS; ++u)
#pragma unroll
                        for (int n = 0; n < NT; ++n)
#pragma unroll
                            for (int i = 0; i < 4; ++i) acc[u][n][i] = 0.f;
                }
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    const uint4 ah4 = *reinterpret_cast<const uint4*>(a_hi + 32 * s + 4 * m);
                    const uint4 al4 = *reinterpret_cast<const uint4*>(a_lo + 32 * s + 4 * m);
                    const unsigned ah[4] = {ah4.x, ah4.y, ah4.z, ah4.w};
                    const unsigned al[4] = {al4.x, al4.y, al4.z, al4.w};
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        const float4& w4 = ring[p][n];
                        unsigned bh[2], bl[2];
                        split_tf32(m ? w4.z : w4.x, bh[0], bl[0]);
                        split_tf32(m ? w4.w : w4.y, bh[1], bl[1]);
                        float(&sum)[4] = acc[m % SUMS][n];
                        mma_tf32(sum, al, bh);
                        mma_tf32(sum, ah, bl);
                        mma_tf32(sum, ah, bh);
                    }
                }
                if (q0 + p + P < total) load(ring[p]);
                if (s == steps - 1) {
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        const int col = c * CHUNK + 8 * (wc * NT + n);
                        float v[4];
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            v[i] = SUMS == 2 ? acc[0][n][i] + acc[SUMS - 1][n][i] : acc[0][n][i];
                        if (col < J) emit(16 * wr + g, col + 2 * t, v);
                    }
                }
                if (++s == steps) s = 0, ++c;
            }
        }
    }
};

// Stores a fragment ((c0, c1): row r, columns j, j + 1; (c2, c3): row r + 8) into y [n, width]
// from row r0.
struct Store {
    float* y;
    int n, width, r0;
    __device__ void operator()(int r, int j, const float (&v)[4]) const {
        if (r0 + r < n)
            *reinterpret_cast<float2*>(y + (size_t)(r0 + r) * width + j) = make_float2(v[0], v[1]);
        if (r0 + r + 8 < n)
            *reinterpret_cast<float2*>(y + (size_t)(r0 + r + 8) * width + j) =
                make_float2(v[2], v[3]);
    }
};

// Store with `add` [n, width] added: y = x Wᵀ + add.
struct StoreAdding {
    Store y;
    const float* add;
    __device__ float2 add_at(int r, int j) const {
        if (y.r0 + r >= y.n) return make_float2(0.f, 0.f);
        return *reinterpret_cast<const float2*>(add + (size_t)(y.r0 + r) * y.width + j);
    }
    __device__ void operator()(int r, int j, const float (&v)[4]) const {
        const float2 a = add_at(r, j), b = add_at(r + 8, j);
        y(r, j, {v[0] + a.x, v[1] + a.y, v[2] + b.x, v[3] + b.y});
    }
};

// The forward's hidden layer: pre stored (where pre.y is given), silu(pre + b) staged for the
// second layer.
struct HiddenFwd {
    Store pre;
    const float* b;
    Staged hidden;
    __device__ void operator()(int r, int j, const float (&v)[4]) const {
        if (pre.y) pre(r, j, v);
        const float b0 = b[j], b1 = b[j + 1];
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
    __device__ float2 pre_at(int r, int j) const {
        if (r0 + r >= n) return make_float2(0.f, 0.f);
        return *reinterpret_cast<const float2*>(pre + (size_t)(r0 + r) * width + j);
    }
    __device__ void operator()(int r, int j, const float (&v)[4]) const {
        const float2 p = pre_at(r, j), q = pre_at(r + 8, j);
        const float b0 = b[j], b1 = b[j + 1];
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
    __device__ void operator()(int r, int j, const float (&v)[4]) const {
        const float b0 = b1[j], bb = b1[j + 1], w0 = w[j], w1 = w[j + 1];
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
// compile time, else 0. A grid of several blocks in y splits the second layer's outputs by
// chunks (where the row blocks alone leave multiprocessors idle: the hidden layer is made once
// per chunk instead of once per row block, and each block's chain of dependent steps is that
// much shorter).
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
    // Block y of a grid split by columns makes the second layer's chunk y only (its own copy of
    // the hidden layer; y = 0 stores the pre-activation).
    const int c0 = blockIdx.y * CHUNK, jb = gridDim.y > 1 ? min(CHUNK, j - c0) : j;
    if constexpr (ADJ) {
        first.run(xs, HiddenAdj{pre, b1, hs, n, h, r0});
    } else {
        first.run(xs, HiddenFwd{Store{blockIdx.y ? nullptr : out, n, h, r0}, b1, hs});
        out += (size_t)n * h;
    }
    WeightStream<BM, HC> second(w2 + (size_t)c0 * h, h, jb);  // its first loads overlap the barrier
    __syncthreads();
    second.run(hs, Store{out + c0, n, j, r0});
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
