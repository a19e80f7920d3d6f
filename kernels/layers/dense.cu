// Small dense layers for molecule-sized inputs, where a cuBLAS call and a separate activation
// kernel cost more in launch overhead than the arithmetic:
//   dense:          y[n, o] = sum_k x[n, k] w[k, o]                       (w is [K, M])
//   dense_silu:     out = [pre | silu(pre + b)], pre = x w                ([2N, M])
//   dense_silu_adj: gx[n, i] = sum_o g[n, o] silu'(pre[n, o] + b[o]) w[o, i]   (w is [M, K];
//                   g has N rows, or one row standing for all when rows_g = 1)
// All three are out[r, j] = sum_l a[r, l] w[l, j] for some row a[r, :], launched as blocks of
// DENSE_ROWS rows x 32 output columns: the block stages its rows of a in shared memory (the
// adjoint forms g silu' there once per element, not once per output), each of its
// DENSE_SPLIT warps sums a slice of l with one lane per column (coalesced weight loads, a
// broadcast row), and the slices are added in shared memory. Short dependent chains: at
// molecule size these layers are latency-bound, not arithmetic-bound.
// Mirrors src/ops/layers/dense.rs (launch shape: dense_launch there).
#include "common.cuh"

constexpr int DENSE_ROWS = 4;
constexpr int DENSE_SPLIT = 8;  // warps per block

// d silu(z) / dz.
template <typename T>
__device__ __forceinline__ T silu_slope(T z) {
    const T s = sigmoid(z);
    return s * (T(1) + z * (T(1) - s));
}

// out[r, j] = sum_l a[r, l] w[l * J + j] for the block's rows and columns; `row(r, l)` gives
// a[r, l], `store(r, j, value)` writes a result.
template <typename T, class Row, class Store>
__device__ void rows_times_w(const T* w, size_t n, size_t L, size_t J, Row row, Store store) {
    extern __shared__ unsigned char dense_smem[];
    T* a = reinterpret_cast<T*>(dense_smem);  // [DENSE_ROWS][L]
    T* part = a + DENSE_ROWS * L;             // [DENSE_SPLIT][DENSE_ROWS][32]
    const size_t r0 = (size_t)blockIdx.x * DENSE_ROWS;
    for (size_t t = threadIdx.x; t < DENSE_ROWS * L; t += blockDim.x) {
        const size_t rr = t / L, l = t - rr * L;
        a[t] = r0 + rr < n ? row(r0 + rr, l) : T(0);
    }
    __syncthreads();
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t j = (size_t)blockIdx.y * 32 + lane;
    const size_t per = (L + DENSE_SPLIT - 1) / DENSE_SPLIT;
    const size_t l0 = warp * per, l1 = min(L, l0 + per);
    T acc[DENSE_ROWS];
#pragma unroll
    for (int rr = 0; rr < DENSE_ROWS; ++rr) acc[rr] = 0;
    if (j < J) {
#pragma unroll 4
        for (size_t l = l0; l < l1; ++l) {
            const T wv = w[l * J + j];
#pragma unroll
            for (int rr = 0; rr < DENSE_ROWS; ++rr) acc[rr] += a[rr * L + l] * wv;
        }
    }
#pragma unroll
    for (int rr = 0; rr < DENSE_ROWS; ++rr) part[(warp * DENSE_ROWS + rr) * 32 + lane] = acc[rr];
    __syncthreads();
    if (threadIdx.x < DENSE_ROWS * 32) {
        const unsigned rr = threadIdx.x / 32;
        const size_t r = r0 + rr, jj = (size_t)blockIdx.y * 32 + lane;
        T s = 0;
#pragma unroll
        for (int k = 0; k < DENSE_SPLIT; ++k) s += part[(k * DENSE_ROWS + rr) * 32 + lane];
        if (r < n && jj < J) store(r, jj, s);
    }
}

template <typename T>
struct InputRow {
    const T* x;
    size_t k;
    __device__ T operator()(size_t r, size_t l) const { return x[r * k + l]; }
};

// g silu'(pre + b) of row r, element o.
template <typename T>
struct SiluGradRow {
    const T *g, *pre, *b;
    size_t m, rows_g;
    __device__ T operator()(size_t r, size_t o) const {
        return g[rows_g == 1 ? o : r * m + o] * silu_slope(pre[r * m + o] + b[o]);
    }
};

template <typename T>
struct StorePlain {
    T* y;
    size_t width;
    __device__ void operator()(size_t r, size_t j, T v) const { y[r * width + j] = v; }
};

template <typename T>
struct StoreSilu {
    T* out;
    const T* b;
    size_t n, m;
    __device__ void operator()(size_t r, size_t o, T pre) const {
        const T z = pre + b[o];
        out[r * m + o] = pre;
        out[n * m + r * m + o] = z * sigmoid(z);
    }
};

#define DENSE(T, S)                                                                          \
    extern "C" __global__ void dense_##S(const T* x, const T* w, T* y, size_t n, size_t k,  \
                                         size_t m) {                                         \
        rows_times_w<T>(w, n, k, m, InputRow<T>{x, k}, StorePlain<T>{y, m});                \
    }                                                                                        \
    extern "C" __global__ void dense_silu_##S(const T* x, const T* w, const T* b, T* out,   \
                                              size_t n, size_t k, size_t m) {                \
        rows_times_w<T>(w, n, k, m, InputRow<T>{x, k}, StoreSilu<T>{out, b, n, m});         \
    }                                                                                        \
    extern "C" __global__ void dense_silu_adj_##S(const T* g, const T* pre, const T* b,     \
                                                  const T* w, T* gx, size_t n, size_t k,     \
                                                  size_t m, size_t rows_g) {                 \
        rows_times_w<T>(w, n, m, k, SiluGradRow<T>{g, pre, b, m, rows_g},                   \
                        StorePlain<T>{gx, k});                                               \
    }
DENSE(float, f32)
DENSE(double, f64)
