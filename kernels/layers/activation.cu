// y = silu(x + b) for x [M, K], b [K], and its adjoint g * silu'(x + b), where g has M rows or
// one row broadcast to all (rows_g = 1). Mirrors src/ops/activation.rs.
#include "common.cuh"

template <typename T>
__device__ void bias_silu_fwd(const T* x, const T* b, T* y, size_t m, size_t k) {
    FOR_EACH(t, m * k) {
        const T z = x[t] + b[t % k];
        y[t] = z * sigmoid(z);
    }
}

template <typename T>
__device__ void bias_silu_adj(const T* x, const T* b, const T* g, T* gx, size_t m, size_t k,
                              size_t rows_g) {
    FOR_EACH(t, m * k) {
        const size_t c = t % k;
        const T z = x[t] + b[c];
        const T s = sigmoid(z);
        gx[t] = g[rows_g == 1 ? c : t] * s * (T(1) + z * (T(1) - s));
    }
}

#define ACTIVATION(T, S)                                                                    \
    extern "C" __global__ void bias_silu_fwd_##S(const T* x, const T* b, T* y, size_t m,    \
                                                 size_t k) {                                \
        bias_silu_fwd(x, b, y, m, k);                                                       \
    }                                                                                       \
    extern "C" __global__ void bias_silu_adj_##S(const T* x, const T* b, const T* g, T* gx, \
                                                 size_t m, size_t k, size_t rows_g) {       \
        bias_silu_adj(x, b, g, gx, m, k, rows_g);                                           \
    }
ACTIVATION(float, f32)
ACTIVATION(double, f64)
