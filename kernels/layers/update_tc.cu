// The PaiNN update block's forward in one launch on tensor cores (f32, F = 128, the context
// MLP's hidden width F), where the separate kernels took four: the mixing layer (dense_tc),
// the context (update.cu), the context MLP (mlp_tc_fwd) and the combination (update.cu), each
// writing its result to global memory for the next to read back. A block owns 16 atoms:
//   1. their vector rows (three row tiles, one per component) staged split, and
//      mixed = v W_mixᵀ = [Uv | Vv] on tensor cores, each warp taking all three components of
//      its columns, so that ‖Vv‖ and <Uv, Vv> are sums over one lane's fragments;
//   2. ctx = [s, ‖Vv‖] formed in shared memory and staged, never written out;
//   3. the context MLP, act = silu(ctx W1ᵀ + b1) W2ᵀ, as dense_tc's MLP;
//   4. its output's epilogue makes the new state: s' = s + a_ss + a_sv <Uv, Vv>,
//      v'_a = v_a + Uv_a a_vv (kernels/layers/update.cu's combine), with the biases added.
// The adjoint's tape is written as the separate kernels write it: mixed [3N, 2F], the MLP's
// pre-activation [N, F] and act before its bias [N, 3F].
// The adjoint (`adjoint`) likewise replaces four launches (update.cu's combine and context
// adjoints, mlp_tc_adj, dense_tc_add): per block of 16 atoms, dL/d(act) made from the tape and
// staged, the context MLP's adjoint into dL/d(ctx) in shared memory, then dL/d(mixed) made and
// staged, and its product with W_mix plus the vector rows' own gradient.
// Mirrors src/ops/update_tc.rs.
#include "dense_tc.cuh"

namespace update_tc {

using namespace dense_tc;

constexpr int F = 128;
constexpr int ATOMS = 16;           // per block: one row tile
constexpr int VROWS = 3 * ATOMS;    // their vector rows, a row tile per component
constexpr int ROW_LD = F + 8;       // f32 rows of F in shared memory (Hidden's padding)
constexpr int CTX_LD = 2 * F + 8;   // f32 context rows

// A row tile of a Staged matrix as a Staged of its own (rows 16 m .. 16 m + 15).
__device__ __forceinline__ Staged row_tile(const Staged& s, int m) {
    return Staged{s.hi + s.at(m, 0, 0), s.rinv + 16 * m, s.width, s.pair_rows};
}

// Shared memory (src/ops/layers/update_tc.rs `smem_words`):
//   staged  the vector rows split (48 x F); after the mixing, the context rows (16 x 2F) and
//           then the hidden layer (16 x F), split
//   ctx     context rows in f32 [16][2F + 8]; after they are staged, the hidden layer in f32,
//           and after that s + a_ss [16][F + 8]
//   uv      Uv of the 48 vector rows [48][F + 8]
//   dot     <Uv, Vv> [16][F + 8]
//   rinv    inverse row scales: vector rows, context rows, hidden rows
struct Smem {
    Staged v, ctx_s, hidden_s;
    float *ctx, *uv, *dot;
    Hidden hidden;
    __device__ static Smem make() {
        extern __shared__ __align__(16) unsigned update_tc_smem[];
        unsigned* p = update_tc_smem;
        Smem m;
        constexpr int staged = staged_words(VROWS, F) > staged_words(ATOMS, 2 * F) + staged_words(ATOMS, F)
                                   ? staged_words(VROWS, F)
                                   : staged_words(ATOMS, 2 * F) + staged_words(ATOMS, F);
        float* rinv = reinterpret_cast<float*>(p + staged + ATOMS * CTX_LD + (VROWS + ATOMS) * ROW_LD);
        m.v = Staged{p, rinv, F, VROWS / 2};
        m.ctx_s = Staged{p, rinv + VROWS, 2 * F, ATOMS / 2};
        m.hidden_s = Staged{p + staged_words(ATOMS, 2 * F), rinv + VROWS + ATOMS, F, ATOMS / 2};
        m.ctx = reinterpret_cast<float*>(p + staged);
        m.hidden = Hidden{m.ctx, F};
        m.uv = m.ctx + ATOMS * CTX_LD;
        m.dot = m.uv + VROWS * ROW_LD;
        return m;
    }
};

// The mixing layer's epilogue: mixed stored; Uv kept; from the Vv fragments, per atom and
// feature, ‖Vv‖ (into the context rows) and <Uv, Vv> (into `dot`), summed over the components
// in order (close_chunk gives one lane a column's three row tiles in turn).
struct Mixing {
    float *mixed, *uv, *dot, *ctx;
    int n, a0;
    using Operands = NoOperands;
    __device__ Operands fetch(int, int) const { return {}; }
    __device__ void operator()(int r, int j, const float (&v)[4], Operands) const {
        const int comp = r / ATOMS;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int atom = r % ATOMS + 8 * h, row = comp * ATOMS + atom;
            const float2 x = make_float2(v[2 * h], v[2 * h + 1]);
            if (a0 + atom < n)
                *reinterpret_cast<float2*>(mixed + ((size_t)comp * n + a0 + atom) * 2 * F + j) = x;
            if (j < F) {
                *reinterpret_cast<float2*>(uv + row * ROW_LD + j) = x;
                continue;
            }
            const int c = j - F;
            const float2 u = *reinterpret_cast<const float2*>(uv + row * ROW_LD + c);
            float2* sq = reinterpret_cast<float2*>(ctx + atom * CTX_LD + F + c);
            float2* d = reinterpret_cast<float2*>(dot + atom * ROW_LD + c);
            // As update.cu: sq = eps + Σ Vv², dot = Σ Uv Vv, in component order.
            const float2 sq0 = comp == 0 ? make_float2((float)NORM_EPS, (float)NORM_EPS) : *sq;
            const float2 d0 = comp == 0 ? make_float2(0.f, 0.f) : *d;
            float2 s2 = make_float2(fmaf(x.x, x.x, sq0.x), fmaf(x.y, x.y, sq0.y));
            if (comp == 2) s2 = make_float2(sqrtf(s2.x), sqrtf(s2.y));
            *sq = s2;
            *d = make_float2(fmaf(u.x, x.x, d0.x), fmaf(u.y, x.y, d0.y));
        }
    }
};

// The context MLP's output layer's epilogue (outputs a_ss | a_vv | a_sv, F each): act stored
// before its bias; the new state from the biased outputs. Chunk p of the output is part p,
// and a lane holds the same features of every part.
struct Combine {
    const float *state, *ab, *uv, *dot;
    float *next, *act, *s_part;
    int n, a0;
    struct Operands {
        float2 top, bottom, bias;  // part 0: s of rows r and r + 8
    };
    __device__ Operands fetch(int r, int j) const {
        const int c = j % F;
        const float2 bias = *reinterpret_cast<const float2*>(ab + j);
        if (j >= F) return {{}, {}, bias};
        return {pair_at(state, n, F, a0, r, c), pair_at(state, n, F, a0, r + 8, c), bias};
    }
    __device__ void operator()(int r, int j, const float (&v)[4], const Operands& o) const {
        Store{act, n, 3 * F, a0}(r, j, v);
        const int part = j / F, c = j % F;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int atom = r + 8 * h;
            const float2 a = make_float2(v[2 * h] + o.bias.x, v[2 * h + 1] + o.bias.y);
            float2* sp = reinterpret_cast<float2*>(s_part + atom * ROW_LD + c);
            const bool valid = a0 + atom < n;
            if (part == 0) {
                const float2 s = h ? o.bottom : o.top;
                *sp = make_float2(s.x + a.x, s.y + a.y);
            } else if (part == 1) {
#pragma unroll
                for (int comp = 0; comp < 3; ++comp) {
                    const float2 u = *reinterpret_cast<const float2*>(uv + (comp * ATOMS + atom) * ROW_LD + c);
                    const float2 x = pair_at(state + (size_t)(1 + comp) * n * F, n, F, a0, atom, c);
                    if (valid)
                        *reinterpret_cast<float2*>(next + ((size_t)(1 + comp) * n + a0 + atom) * F + c) =
                            make_float2(fmaf(u.x, a.x, x.x), fmaf(u.y, a.y, x.y));
                }
            } else if (valid) {
                const float2 d = *reinterpret_cast<const float2*>(dot + atom * ROW_LD + c);
                const float2 s = *sp;
                *reinterpret_cast<float2*>(next + (size_t)(a0 + atom) * F + c) =
                    make_float2(fmaf(a.x, d.x, s.x), fmaf(a.y, d.y, s.y));
            }
        }
    }
};

// state [4N, F] after the messages → out = [next state (4NF) | mixed (6NF) | the context MLP's
// pre-activation (NF) | act (3NF)].
__device__ void forward(const float* state, const float* b1, const float* ab, const unsigned* w_mix,
                        const unsigned* w1, const unsigned* w2, float* out, int n) {
    const int a0 = blockIdx.x * ATOMS;
    const Smem m = Smem::make();
    float* next = out;
    float* mixed = next + (size_t)4 * n * F;
    float* pre = mixed + (size_t)6 * n * F;
    float* act = pre + (size_t)n * F;
    WeightStream<VROWS, F, 3> mixing(w_mix, F, 2 * F);
    wait_for_previous_kernel();  // the weights above are the model's
    // The context rows' s half, while the vector rows are staged.
    for (int i = threadIdx.x; i < ATOMS * F / 4; i += THREADS) {
        const int r = i / (F / 4), q = i % (F / 4);
        const float4 s = a0 + r < n ? __ldg(reinterpret_cast<const float4*>(state + (size_t)(a0 + r) * F) + q)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(m.ctx + r * CTX_LD + 4 * q) = s;
    }
#pragma unroll
    for (int a = 0; a < 3; ++a)
        stage<ATOMS, true, F>(state + ((size_t)(1 + a) * n + a0) * F, F, n - a0, row_tile(m.v, a));
    mixing.run(m.v, Mixing{mixed, m.uv, m.dot, m.ctx, n, a0});
    WeightStream<ATOMS, 2 * F> first(w1, 2 * F, F);
    __syncthreads();
    stage<ATOMS, false, 2 * F>(m.ctx, CTX_LD, ATOMS, m.ctx_s);
    first.run(m.ctx_s, HiddenFwd{Store{pre, n, F, a0}, b1, m.hidden});
    WeightStream<ATOMS, F> second(w2, F, 3 * F);
    __syncthreads();
    stage<ATOMS, false, F>(m.hidden.x, m.hidden.ld(), ATOMS, m.hidden_s);
    // s + a_ss goes where the hidden layer was (staged by now).
    second.run(m.hidden_s, Combine{state, ab, m.uv, m.dot, next, act, m.hidden.x, n, a0});
}

// Four consecutive values of a row in global memory (16-byte aligned).
__device__ __forceinline__ float4 ld4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 operator+(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float4 operator*(float4 a, float4 b) {
    return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}
__device__ __forceinline__ float4 zero4() { return make_float4(0.f, 0.f, 0.f, 0.f); }

// What the adjoint reads of one block's atoms, four features at a time (c a multiple of 4;
// atom a block-local index): the tape, the gradient arriving at the block's output (gx on s
// and, from the block above, gm on s and gve + gvj on v), and dL/d(ctx) once the MLP's
// adjoint has made it. As update.cu's combine_adj and context_adj.
struct AdjointRows {
    const float *mixed, *act, *ab, *gx, *gm, *gve, *gvj;
    const float* g_ctx;  // shared [ATOMS][CTX_LD]
    int n, a0;
    bool has_next;
    __device__ size_t row(int a) const { return (size_t)(a0 + a); }
    // dL/ds' (gx + gm).
    __device__ float4 gs(int a, int c) const {
        const float4 g = ld4(gx + row(a) * F + c);
        return has_next ? g + ld4(gm + row(a) * F + c) : g;
    }
    // dL/dv'_k (gve + gvj).
    __device__ float4 gv(int k, int a, int c) const {
        if (!has_next) return zero4();
        const size_t o = ((size_t)k * n + row(a)) * F + c;
        return ld4(gve + o) + ld4(gvj + o);
    }
    // Uv_k (half 0) or Vv_k (half 1).
    __device__ float4 uv(int k, int a, int c, int half) const {
        return ld4(mixed + ((size_t)k * n + row(a)) * 2 * F + half * F + c);
    }
    // a_vv (part 1) or a_sv (part 2), biased.
    __device__ float4 part(int p, int a, int c) const {
        return ld4(act + row(a) * 3 * F + p * F + c) + ld4(ab + p * F + c);
    }
};

// Both stagers below give each warp atoms g = warp and g + 8 (pair row g of each row tile)
// and each lane the features c = 4 lane of every part of a row, so that what a lane reads per
// atom is read once for all of the atom's values (made per value from global memory, they
// held the adjoint's warps waiting on loads for much of its time:
// docs/bench-log/42-update-one-launch.md).

static_assert(THREADS / 32 == ATOMS / 2 && 4 * 32 == F, "a warp per pair of atoms, a lane per 4 features");

// dL/d(act) staged (16 rows of 3F): [gs | Σ_k gv_k Uv_k | gs <Uv, Vv>], as update.cu.
__device__ void stage_g_act(const AdjointRows& src, const Staged& s) {
    const int g = threadIdx.x >> 5, c = 4 * (threadIdx.x & 31);
    float4 part[2][3];
    unsigned largest[2] = {0, 0};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int a = g + 8 * h;
        float4 gs = zero4(), avv = zero4(), dot = zero4();
        if (src.a0 + a < src.n) {
            gs = src.gs(a, c);
#pragma unroll
            for (int k = 0; k < 3; ++k) {
                const float4 u = src.uv(k, a, c, 0);
                avv = avv + src.gv(k, a, c) * u;
                dot = dot + src.uv(k, a, c, 1) * u;
            }
        }
        part[h][0] = gs, part[h][1] = avv, part[h][2] = gs * dot;
#pragma unroll
        for (int p = 0; p < 3; ++p) largest[h] = max(largest[h], abs_max_bits(part[h][p]));
    }
    const PairScales scale(largest[0], largest[1], s, g);
#pragma unroll
    for (int p = 0; p < 3; ++p) put_split(s, 0, g, p * F / 4 + c / 4, part[0][p], part[1][p], scale);
    __syncthreads();
}

// dL/d(mixed) staged (48 rows of 2F, a row tile per component k):
// dL/dUv_k = gs a_sv Vv_k + gv_k a_vv, dL/dVv_k = gs a_sv Uv_k + dL/d‖Vv‖ Vv_k / ‖Vv‖.
__device__ void stage_g_mixed(const AdjointRows& src, const Staged& s) {
    const int g = threadIdx.x >> 5, c = 4 * (threadIdx.x & 31);
    float4 gsa[2], avv[2], gn[2];  // per atom: gs a_sv, a_vv, dL/d‖Vv‖ / ‖Vv‖
    bool valid[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int a = g + 8 * h;
        valid[h] = src.a0 + a < src.n;
        gsa[h] = avv[h] = gn[h] = zero4();
        if (!valid[h]) continue;
        gsa[h] = src.gs(a, c) * src.part(2, a, c);
        avv[h] = src.part(1, a, c);
        float4 sq = make_float4((float)NORM_EPS, (float)NORM_EPS, (float)NORM_EPS, (float)NORM_EPS);
#pragma unroll
        for (int k = 0; k < 3; ++k) sq = sq + src.uv(k, a, c, 1) * src.uv(k, a, c, 1);
        const float4 d = *reinterpret_cast<const float4*>(src.g_ctx + a * CTX_LD + F + c);
        gn[h] = make_float4(d.x / sqrtf(sq.x), d.y / sqrtf(sq.y), d.z / sqrtf(sq.z), d.w / sqrtf(sq.w));
    }
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        float4 du[2], dv[2];
        unsigned largest[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int a = g + 8 * h;
            du[h] = dv[h] = zero4();
            if (valid[h]) {
                const float4 u = src.uv(k, a, c, 0), v = src.uv(k, a, c, 1);
                du[h] = gsa[h] * v + src.gv(k, a, c) * avv[h];
                dv[h] = gsa[h] * u + gn[h] * v;
            }
            largest[h] = max(abs_max_bits(du[h]), abs_max_bits(dv[h]));
        }
        const PairScales scale(largest[0], largest[1], s, 16 * k + g);
        put_split(s, k, g, c / 4, du[0], du[1], scale);
        put_split(s, k, g, F / 4 + c / 4, dv[0], dv[1], scale);
    }
    __syncthreads();
}

// Shared memory of the adjoint (src/ops/layers/update_tc.rs `adjoint_smem_words`):
//   staged  dL/d(act) (16 x 3F) and the hidden layer's gradient (16 x F), split; after the
//           MLP's adjoint, dL/d(mixed) (48 x 2F) split
//   g_ctx   dL/d(ctx) in f32 [16][2F + 8]
//   hidden  the hidden layer's gradient in f32 [16][F + 8]
//   rinv    inverse row scales: dL/d(act), hidden, dL/d(mixed)
struct AdjointSmem {
    Staged g_act, hidden_s, g_mixed;
    float* g_ctx;
    Hidden hidden;
    __device__ static AdjointSmem make() {
        extern __shared__ __align__(16) unsigned update_tc_smem[];
        unsigned* p = update_tc_smem;
        AdjointSmem m;
        constexpr int mlp = staged_words(ATOMS, 3 * F) + staged_words(ATOMS, F);
        constexpr int staged = mlp > staged_words(VROWS, 2 * F) ? mlp : staged_words(VROWS, 2 * F);
        m.g_ctx = reinterpret_cast<float*>(p + staged);
        m.hidden = Hidden{m.g_ctx + ATOMS * CTX_LD, F};
        float* rinv = m.hidden.x + ATOMS * ROW_LD;
        m.g_act = Staged{p, rinv, 3 * F, ATOMS / 2};
        m.hidden_s = Staged{p + staged_words(ATOMS, 3 * F), rinv + ATOMS, F, ATOMS / 2};
        m.g_mixed = Staged{p, rinv + 2 * ATOMS, 2 * F, VROWS / 2};
        return m;
    }
};

// The MLP adjoint's output layer: dL/d(ctx) kept in shared memory.
struct ToShared {
    Hidden rows;
    using Operands = NoOperands;
    __device__ Operands fetch(int, int) const { return {}; }
    __device__ void operator()(int r, int j, const float (&v)[4], Operands) const {
        rows.put(r, j, make_float2(v[0], v[1]), make_float2(v[2], v[3]));
    }
};

// The mixing adjoint's epilogue: dL/dv_k = dL/d(mixed) W_mix + the vector rows' own gradient.
struct VectorGrads {
    const AdjointRows* src;
    float* g_v;  // [3N, F]
    using Operands = NoOperands;
    __device__ Operands fetch(int, int) const { return {}; }
    __device__ void operator()(int r, int j, const float (&v)[4], Operands) const {
        const int k = r / ATOMS;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int a = r % ATOMS + 8 * h;
            if (src->a0 + a >= src->n) continue;
            const size_t o = ((size_t)k * src->n + src->row(a)) * F + j;
            float2 y = make_float2(v[2 * h], v[2 * h + 1]);
            if (src->has_next) {
                const float2 e = *reinterpret_cast<const float2*>(src->gve + o);
                const float2 i = *reinterpret_cast<const float2*>(src->gvj + o);
                y = make_float2(y.x + (e.x + i.x), y.y + (e.y + i.y));
            }
            *reinterpret_cast<float2*>(g_v + o) = y;
        }
    }
};

// out = [dL/ds (NF) | dL/dv (3NF)] of the messaged state, for the gradient at the block's
// output; w2t [F, 3F] and w1t [2F, F] the context MLP's weights transposed, w_mix_t [F, 2F].
__device__ void adjoint(AdjointRows src, const float* pre, const float* b1, const unsigned* w2t,
                        const unsigned* w1t, const unsigned* w_mix_t, float* out) {
    const int n = src.n, a0 = src.a0;
    const AdjointSmem m = AdjointSmem::make();
    src.g_ctx = m.g_ctx;
    WeightStream<ATOMS, 3 * F> first(w2t, 3 * F, F);
    wait_for_previous_kernel();  // the weights above are the model's
    stage_g_act(src, m.g_act);
    first.run(m.g_act, HiddenAdj{pre, b1, m.hidden, n, F, a0});
    WeightStream<ATOMS, F> second(w1t, F, 2 * F);
    __syncthreads();
    stage<ATOMS, false, F>(m.hidden.x, m.hidden.ld(), ATOMS, m.hidden_s);
    second.run(m.hidden_s, ToShared{Hidden{m.g_ctx, 2 * F}});
    WeightStream<VROWS, 2 * F, 3> mixing(w_mix_t, 2 * F, F);
    __syncthreads();
    // dL/ds = gs + dL/d(ctx)'s s half.
    for (int i = threadIdx.x; i < ATOMS * F / 4; i += THREADS) {
        const int a = i / (F / 4), c = 4 * (i % (F / 4));
        if (a0 + a >= n) continue;
        const float4 g = src.gs(a, c) + *reinterpret_cast<const float4*>(m.g_ctx + a * CTX_LD + c);
        *reinterpret_cast<float4*>(out + src.row(a) * F + c) = g;
    }
    stage_g_mixed(src, m.g_mixed);
    mixing.run(m.g_mixed, VectorGrads{&src, out + (size_t)n * F});
}

}  // namespace update_tc

// Float inputs, the packed weights, the output, the sizes (src/ops/launch/mod.rs's launch order).
extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)
    update_tc_fwd_128_f32(const float* state, const float* b1, const float* ab, const unsigned int* w_mix,
                          const unsigned int* w1, const unsigned int* w2, float* out, size_t n, size_t f) {
    if (f != update_tc::F) __trap();  // the host launches F = 128 only
    update_tc::forward(state, b1, ab, w_mix, w1, w2, out, (int)n);
}

// Float inputs (mixed, act, act bias, gx, gm, gve, gvj, the MLP's pre-activation and hidden
// bias), the packed weights, the output, the sizes.
extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)
    update_tc_adj_128_f32(const float* mixed, const float* act, const float* ab, const float* gx, const float* gm,
                          const float* gve, const float* gvj, const float* pre, const float* b1,
                          const unsigned int* w2t, const unsigned int* w1t, const unsigned int* w_mix_t, float* out,
                          size_t n, size_t f, size_t has_next) {
    if (f != update_tc::F) __trap();  // the host launches F = 128 only
    // (dL/d(ctx) is the adjoint's own, in shared memory.)
    const update_tc::AdjointRows src{mixed, act, ab, gx, gm, gve, gvj, nullptr, (int)n,
                                     (int)(blockIdx.x * update_tc::ATOMS), has_next != 0};
    update_tc::adjoint(src, pre, b1, w2t, w1t, w_mix_t, out);
}
