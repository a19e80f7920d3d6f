// PaiNN update block, elementwise parts, one thread per (atom n, feature c). State tensors are
// component-major [4N, F] (s, then v_x, v_y, v_z); mixed = v W_mix^T is [3N, 2F] = [Uv | Vv];
// a = context MLP output before its bias, [N, 3F] = (a_ss | a_vv | a_sv).
//   context: ctx[n] = [s[n], sqrt(sum_a Vv_a^2 + eps)]                      [N, 2F]
//   combine: s' = s + a_ss + a_sv <Uv, Vv>,  v'_a = v_a + Uv_a a_vv
// Mirrors src/ops/update.rs.
#include "common.cuh"

// sqrt(sum_a Vv_a^2 + eps) of atom m, feature c.
template <typename T>
__device__ __forceinline__ T vv_norm(const T* mixed, size_t n, size_t f, size_t m, size_t c) {
    return norm3_eps(mixed + m * 2 * f + f + c, n * 2 * f);
}

template <typename T>
__device__ void context_fwd(const T* sv, const T* mixed, T* ctx, size_t n, size_t f) {
    FOR_EACH(k, n * f) {
        const size_t m = k / f, c = k - m * f;
        ctx[m * 2 * f + c] = sv[k];
        ctx[m * 2 * f + f + c] = vv_norm(mixed, n, f, m, c);
    }
}

template <typename T>
__device__ void combine_fwd(const T* sv, const T* mixed, const T* act, const T* ab, T* out,
                            size_t n, size_t f) {
    FOR_EACH(k, n * f) {
        const size_t m = k / f, c = k - m * f;
        const T* am = act + m * 3 * f;
        const T a_ss = am[c] + ab[c], a_vv = am[f + c] + ab[f + c];
        const T a_sv = am[2 * f + c] + ab[2 * f + c];
        T dot = 0;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            const T* row = mixed + (a * n + m) * 2 * f;
            dot += row[c] * row[f + c];
            const size_t o = ((1 + a) * n + m) * f + c;
            out[o] = sv[o] + row[c] * a_vv;
        }
        out[k] = sv[k] + a_ss + a_sv * dot;
    }
}

// Adjoint of combine. The gradient of the block output is gx (s part, [N, F]) plus, when
// has_next, [gm's s rows | gve + gvj] (gm [N, F] or more rows, gve and gvj [3N, F]) from the
// next block's kernels.
// out = [g_sv (4NF) | g_mixed (6NF) | g_a (3NF)], every element written.
template <typename T>
__device__ void combine_adj(const T* mixed, const T* act, const T* ab, const T* gx,
                            const T* gm, const T* gve, const T* gvj, T* out, size_t n,
                            size_t f, size_t has_next) {
    T* g_sv = out;
    T* g_mixed = out + 4 * n * f;
    T* g_act = out + 10 * n * f;
    FOR_EACH(k, n * f) {
        const size_t m = k / f, c = k - m * f;
        const T* am = act + m * 3 * f;
        const T a_vv = am[f + c] + ab[f + c], a_sv = am[2 * f + c] + ab[2 * f + c];
        const T gs = gx[k] + (has_next ? gm[k] : T(0));
        T dot = 0, g_avv = 0;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            const T* row = mixed + (a * n + m) * 2 * f;
            const T u = row[c], v = row[f + c];
            const size_t o = (a * n + m) * f + c;
            const T gv = has_next ? gve[o] + gvj[o] : T(0);
            dot += u * v;
            g_avv += gv * u;
            g_sv[o + n * f] = gv;
            g_mixed[(a * n + m) * 2 * f + c] = gs * a_sv * v + gv * a_vv;
            g_mixed[(a * n + m) * 2 * f + f + c] = gs * a_sv * u;
        }
        g_sv[k] = gs;
        g_act[m * 3 * f + c] = gs;
        g_act[m * 3 * f + f + c] = g_avv;
        g_act[m * 3 * f + 2 * f + c] = gs * dot;
    }
}

// Adjoint of context, added in place to combine's adjoint `out` = [g_sv (4NF) | g_mixed (6NF) |
// ...]: only its s rows and the Vv half of g_mixed change.
template <typename T>
__device__ void context_adj(const T* mixed, const T* g_ctx, T* out, size_t n, size_t f) {
    const size_t nf = n * f;
    FOR_EACH(k, nf) {
        const size_t m = k / f, c = k - m * f;
        const T g_norm = g_ctx[m * 2 * f + f + c] / vv_norm(mixed, n, f, m, c);
        out[k] += g_ctx[m * 2 * f + c];
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            const size_t v = (a * n + m) * 2 * f + f + c;
            out[4 * nf + v] += g_norm * mixed[v];
        }
    }
}

#define UPDATE(T, S)                                                                         \
    extern "C" __global__ void update_context_fwd_##S(const T* sv, const T* mixed, T* ctx,   \
                                                      size_t n, size_t f) {                  \
        wait_for_previous_kernel();                                                          \
        context_fwd(sv, mixed, ctx, n, f);                                                   \
    }                                                                                        \
    extern "C" __global__ void update_combine_fwd_##S(const T* sv, const T* mixed,           \
                                                      const T* act, const T* ab, T* out,     \
                                                      size_t n, size_t f) {                  \
        wait_for_previous_kernel();                                                          \
        combine_fwd(sv, mixed, act, ab, out, n, f);                                          \
    }                                                                                        \
    extern "C" __global__ void update_combine_adj_##S(                                       \
        const T* mixed, const T* act, const T* ab, const T* gx, const T* gm, const T* gve,   \
        const T* gvj, T* out, size_t n, size_t f, size_t has_next) {                         \
        wait_for_previous_kernel();                                                          \
        combine_adj(mixed, act, ab, gx, gm, gve, gvj, out, n, f, has_next);                  \
    }                                                                                        \
    extern "C" __global__ void update_context_adj_##S(const T* mixed, const T* g_ctx, T* out, \
                                                      size_t n, size_t f) {                  \
        wait_for_previous_kernel();                                                          \
        context_adj(mixed, g_ctx, out, n, f);                                                \
    }
UPDATE(float, f32)
UPDATE(double, f64)
