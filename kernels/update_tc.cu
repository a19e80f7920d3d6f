// The update block's context MLP on tensor cores with the block's elementwise parts in the
// same launch, f32, F = H = 128 (the shipped model's widths); the same maths as
// kernels/update.cu, whose comments define it, and the MLPs of kernels/dense_tc.cuh:
//   update_tc_fwd: stages ctx = [s, |Vv|] (update_context_fwd) as the MLP's input, and in the
//     output layer's epilogue stores act and the next state (update_combine_fwd).
//     out = [pre (N H) | act (N 3F) | next (4NF)]
//   update_tc_adj: stages dL/d(act) (update_combine_adj) as the MLP adjoint's input, and in its
//     last layer's epilogue forms dL/d(messaged) and dL/d(mixed) (update_context_adj).
//     out = [g_messaged (4NF) | g_mixed (6NF)]
// Each saves two launches and the [N, 2F] and [N, 3F] tensors between them (64 aspirins: ~8
// and ~14 µs of small kernels per block on an H100). The output layer's chunks of 128 columns
// are the parts (ss, vv, sv) of the context: a thread holds the same feature of every part
// (`dense_tc::layer` walks the chunks with the same columns per lane), so the next state's s
// row, written in part ss, is read back by the thread that wrote it in part sv.
// Mirrors src/ops/update_tc.rs.
#include "dense_tc.cuh"

namespace update_tc {

using dense_tc::HiddenAdj;
using dense_tc::HiddenFwd;
using dense_tc::Staged;
using dense_tc::Store;
using dense_tc::THREADS;

constexpr int F = 128;

// The block's state [4N, F] (s, then v_x, v_y, v_z) and mixed = [Uv | Vv] [3N, 2F].
struct State {
    const float* sv;
    const float* mixed;
    int n;
    __device__ size_t row(int a, int m) const { return (size_t)(a * n + m); }
    __device__ float s(int m, int c) const { return sv[(size_t)m * F + c]; }
    __device__ float v(int a, int m, int c) const { return sv[row(1 + a, m) * F + c]; }
    __device__ float u_mix(int a, int m, int c) const { return mixed[row(a, m) * 2 * F + c]; }
    __device__ float v_mix(int a, int m, int c) const {
        return mixed[row(a, m) * 2 * F + F + c];
    }
    __device__ float norm(int m, int c) const {
        return norm3_eps(mixed + (size_t)m * 2 * F + F + c, (size_t)n * 2 * F);
    }
    __device__ float dot(int m, int c) const {
        float d = 0.f;
#pragma unroll
        for (int a = 0; a < 3; ++a) d += u_mix(a, m, c) * v_mix(a, m, c);
        return d;
    }
};

// Stages columns (2q, 2q + 1) of rows (top, top + 8) of the block's BM rows for each of `parts`
// parts of F columns: value(m, col) for rows below n, zero past it. value(m, c, out[parts])
// gives every part's value of atom m, feature c at once.
template <int BM, int PARTS, class Value>
__device__ void stage_parts(const Staged& s, int n, int r0, Value value) {
    for (int item = threadIdx.x; item < BM / 2 * (F / 2); item += THREADS) {
        const int row = item / (F / 2), q = item % (F / 2);
        const int G = row / 8, g = row % 8, top = r0 + 16 * G + g, bottom = top + 8;
        float x[2][2][PARTS] = {};  // [row top / bottom][column 2q / 2q + 1][part]
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = h ? bottom : top;
            if (m >= n) continue;
#pragma unroll
            for (int d = 0; d < 2; ++d) value(m, 2 * q + d, x[h][d]);
        }
#pragma unroll
        for (int p = 0; p < PARTS; ++p)
            s.put(G, g, p * (F / 2) + q,
                  make_float4(x[0][0][p], x[1][0][p], x[0][1][p], x[1][1][p]));
    }
    __syncthreads();
}

// The forward's output layer epilogue: act stored, and the next state (combine_fwd).
struct Combine {
    State st;
    const float* ab;
    float* act;   // [N, 3F]
    float* next;  // [4N, F]
    int r0;
    __device__ void one(int m, int j, float a) const {
        const int p = j / F, c = j % F;
        const float x = a + ab[j];
        float* s_next = next + (size_t)m * F + c;
        if (p == 0) {
            *s_next = st.s(m, c) + x;
        } else if (p == 1) {
#pragma unroll
            for (int k = 0; k < 3; ++k)
                next[st.row(1 + k, m) * F + c] = st.v(k, m, c) + st.u_mix(k, m, c) * x;
        } else {
            *s_next += x * st.dot(m, c);  // written by this thread in part 0
        }
    }
    __device__ void operator()(int r, int j, const float (&v)[4]) const {
        const int m = r0 + r;
        if (m < st.n) {
            *reinterpret_cast<float2*>(act + (size_t)m * 3 * F + j) = make_float2(v[0], v[1]);
            one(m, j, v[0]);
            one(m, j + 1, v[1]);
        }
        if (m + 8 < st.n) {
            *reinterpret_cast<float2*>(act + (size_t)(m + 8) * 3 * F + j) =
                make_float2(v[2], v[3]);
            one(m + 8, j, v[2]);
            one(m + 8, j + 1, v[3]);
        }
    }
};

template <int BM>
__device__ void fwd(const float* sv, const float* mixed, const float* w1, const float* b1,
                    const float* w2, const float* ab, float* out, int n) {
    extern __shared__ __align__(16) float update_tc_smem[];
    const int r0 = blockIdx.x * BM;
    const Staged xs = dense_tc::staged<BM>(update_tc_smem, 2 * F);
    const Staged hs = dense_tc::staged<BM>(update_tc_smem + 2 * xs.plane(), F);
    const State st{sv, mixed, n};
    stage_parts<BM, 2>(xs, n, r0, [&](int m, int c, float (&x)[2]) {
        x[0] = st.s(m, c);
        x[1] = st.norm(m, c);
    });
    float* pre = out;
    dense_tc::layer<BM, 2 * F>(xs, 2 * F, w1, F, HiddenFwd{Store{pre, n, F, r0}, b1, hs});
    __syncthreads();
    float* act = pre + (size_t)n * F;
    const Combine combine{st, ab, act, act + (size_t)n * 3 * F, r0};
    dense_tc::layer<BM, F>(hs, F, w2, 3 * F, combine);
}

// The gradient of the block's output (combine_adj's inputs): dL/ds = gx (+ gm's s rows) and
// dL/dv = gm's v rows + gve + gvj where a next block exists, else zero.
struct OutGrad {
    const float *gx, *gm, *gve, *gvj;
    int n;
    bool has_next;
    __device__ float gs(int m, int c) const {
        const size_t k = (size_t)m * F + c;
        return gx[k] + (has_next ? gm[k] : 0.f);
    }
    __device__ float gv(int a, int m, int c) const {
        if (!has_next) return 0.f;
        const size_t o = (size_t)(a * n + m) * F + c;
        return gm[o + (size_t)n * F] + gve[o] + gvj[o];
    }
};

// The adjoint's last layer epilogue: dL/d(ctx) = v → [g_messaged | g_mixed] (context_adj
// added to combine_adj's other outputs).
struct ContextGrad {
    State st;
    OutGrad g;
    const float *act, *ab;
    float* out;
    int r0;
    __device__ void one(int m, int j, float g_ctx) const {
        const int q = j / F, c = j % F, n = st.n;
        const size_t nf = (size_t)n * F;
        const float* am = act + (size_t)m * 3 * F;
        const float gs = g.gs(m, c), a_sv = am[2 * F + c] + ab[2 * F + c];
        float* g_mixed = out + 4 * nf;
        if (q == 0) {
            const float a_vv = am[F + c] + ab[F + c];
            out[(size_t)m * F + c] = gs + g_ctx;
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                const float gv = g.gv(a, m, c);
                out[st.row(1 + a, m) * F + c] = gv;
                g_mixed[st.row(a, m) * 2 * F + c] = gs * a_sv * st.v_mix(a, m, c) + gv * a_vv;
            }
        } else {
            const float g_norm = g_ctx / st.norm(m, c);
#pragma unroll
            for (int a = 0; a < 3; ++a)
                g_mixed[st.row(a, m) * 2 * F + F + c] =
                    gs * a_sv * st.u_mix(a, m, c) + g_norm * st.v_mix(a, m, c);
        }
    }
    __device__ void operator()(int r, int j, const float (&v)[4]) const {
        const int m = r0 + r;
        if (m < st.n) one(m, j, v[0]), one(m, j + 1, v[1]);
        if (m + 8 < st.n) one(m + 8, j, v[2]), one(m + 8, j + 1, v[3]);
    }
};

template <int BM>
__device__ void adj(const float* mixed, const float* act, const float* ab, const float* gx,
                    const float* gm, const float* gve, const float* gvj, const float* pre,
                    const float* b1, const float* w2t, const float* w1t, float* out, int n,
                    bool has_next) {
    extern __shared__ __align__(16) float update_tc_smem[];
    const int r0 = blockIdx.x * BM;
    const Staged gs_ = dense_tc::staged<BM>(update_tc_smem, 3 * F);
    const Staged hs = dense_tc::staged<BM>(update_tc_smem + 2 * gs_.plane(), F);
    const State st{nullptr, mixed, n};
    const OutGrad g{gx, gm, gve, gvj, n, has_next};
    // dL/d(act) = [gs, Σ_a gv_a Uv_a, gs <Uv, Vv>] (combine_adj).
    stage_parts<BM, 3>(gs_, n, r0, [&](int m, int c, float (&x)[3]) {
        const float gs = g.gs(m, c);
        float dot = 0.f, g_avv = 0.f;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            const float u = st.u_mix(a, m, c);
            dot += u * st.v_mix(a, m, c);
            g_avv += g.gv(a, m, c) * u;
        }
        x[0] = gs;
        x[1] = g_avv;
        x[2] = gs * dot;
    });
    dense_tc::layer<BM, 3 * F>(gs_, 3 * F, w2t, F, HiddenAdj{pre, b1, hs, n, F, r0});
    __syncthreads();
    dense_tc::layer<BM, F>(hs, F, w1t, 2 * F, ContextGrad{st, g, act, ab, out, r0});
}

}  // namespace update_tc

// One instantiation per block height (16, 32: as the MLPs, src/ops/dense_tc.rs).
#define UPDATE_TC(BM)                                                                        \
    extern "C" __global__ void __launch_bounds__(update_tc::THREADS, 2)                      \
        update_tc_fwd_##BM##_f32(const float* sv, const float* mixed, const float* w1,       \
                                 const float* b1, const float* w2, const float* ab,          \
                                 float* out, size_t n) {                                     \
        update_tc::fwd<BM>(sv, mixed, w1, b1, w2, ab, out, (int)n);                          \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(update_tc::THREADS, 2)                      \
        update_tc_adj_##BM##_f32(const float* mixed, const float* act, const float* ab,      \
                                 const float* gx, const float* gm, const float* gve,         \
                                 const float* gvj, const float* pre, const float* b1,        \
                                 const float* w2t, const float* w1t, float* out, size_t n,   \
                                 size_t has_next) {                                          \
        update_tc::adj<BM>(mixed, act, ab, gx, gm, gve, gvj, pre, b1, w2t, w1t, out, (int)n, \
                           has_next != 0);                                                   \
    }
UPDATE_TC(16)
UPDATE_TC(32)
