// Small dense layers for molecule-sized inputs, where a cuBLAS call and a separate activation
// kernel cost more in launch overhead than the arithmetic; one thread per output element.
//   dense:          y[n, o] = sum_k x[n, k] w[k, o]                       (w is [K, M])
//   dense_silu:     out = [pre | silu(pre + b)], pre = x w                ([2N, M])
//   dense_silu_adj: gx[n, i] = sum_o g[n, o] silu'(pre[n, o] + b[o]) w[o, i]   (w is [M, K];
//                   g has N rows, or one row standing for all when rows_g = 1)
// Mirrors src/ops/dense.rs.
#include "common.cuh"

// Four partial sums, so that the loads of a thread's long dot product overlap instead of
// waiting on one accumulator.
template <typename T>
__device__ __forceinline__ T dot_column(const T* x, const T* w, size_t k, size_t m, size_t o) {
    T acc[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= k; i += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[u] += x[i + u] * w[(i + u) * m + o];
    }
    for (; i < k; ++i) acc[0] += x[i] * w[i * m + o];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// d silu(z) / dz.
template <typename T>
__device__ __forceinline__ T silu_slope(T z) {
    const T s = sigmoid(z);
    return s * (T(1) + z * (T(1) - s));
}

template <typename T>
__device__ void dense(const T* x, const T* w, T* y, size_t n, size_t k, size_t m) {
    FOR_EACH(t, n * m) {
        const size_t r = t / m, o = t - r * m;
        y[t] = dot_column(x + r * k, w, k, m, o);
    }
}

template <typename T>
__device__ void dense_silu(const T* x, const T* w, const T* b, T* out, size_t n, size_t k,
                           size_t m) {
    FOR_EACH(t, n * m) {
        const size_t r = t / m, o = t - r * m;
        const T pre = dot_column(x + r * k, w, k, m, o);
        const T z = pre + b[o];
        out[t] = pre;
        out[n * m + t] = z * sigmoid(z);
    }
}

template <typename T>
__device__ void dense_silu_adj(const T* g, const T* pre, const T* b, const T* w, T* gx, size_t n,
                               size_t k, size_t m, size_t rows_g) {
    FOR_EACH(t, n * k) {
        const size_t r = t / k, i = t - r * k;
        const T* gr = g + (rows_g == 1 ? 0 : r * m);
        const T* pr = pre + r * m;
        T even = 0, odd = 0;
        size_t o = 0;
        for (; o + 2 <= m; o += 2) {
            even += silu_slope(pr[o] + b[o]) * gr[o] * w[o * k + i];
            odd += silu_slope(pr[o + 1] + b[o + 1]) * gr[o + 1] * w[(o + 1) * k + i];
        }
        if (o < m) even += silu_slope(pr[o] + b[o]) * gr[o] * w[o * k + i];
        gx[t] = even + odd;
    }
}

#define DENSE(T, S)                                                                          \
    extern "C" __global__ void dense_##S(const T* x, const T* w, T* y, size_t n, size_t k,  \
                                         size_t m) {                                         \
        dense(x, w, y, n, k, m);                                                             \
    }                                                                                        \
    extern "C" __global__ void dense_silu_##S(const T* x, const T* w, const T* b, T* out,   \
                                              size_t n, size_t k, size_t m) {                \
        dense_silu(x, w, b, out, n, k, m);                                                   \
    }                                                                                        \
    extern "C" __global__ void dense_silu_adj_##S(const T* g, const T* pre, const T* b,     \
                                                  const T* w, T* gx, size_t n, size_t k,     \
                                                  size_t m, size_t rows_g) {                 \
        dense_silu_adj(g, pre, b, w, gx, n, k, m, rows_g);                                   \
    }
DENSE(float, f32)
DENSE(double, f64)
