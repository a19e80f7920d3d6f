// Filter rows w(r_e) = basis[e, 0..K] . W[K, C] for every edge, the product of the filter-rows
// path (src/model/fused.rs) for large systems. cuBLAS ran this K = R + 1 = 21 product at ~15
// TFLOP/s on an H100 (a poor GEMM shape); here each thread keeps two columns of W in
// registers and a block reads each edge's basis row once, from shared memory, so the
// product is bound by writing its [E, C] output. Mirrors src/ops/filter_rows.rs.
#include <cstddef>

// Largest K kept in registers (the host checks), and edges per shared-memory tile.
#define FR_MAX_K 32
#define FR_TILE 32

template <typename T>
__device__ void filter_rows(const T* basis, const T* w, T* out, size_t e, size_t kb, size_t k,
                            size_t c) {
    __shared__ T tile[FR_TILE * FR_MAX_K];
    const size_t col = 2 * (blockIdx.y * (size_t)blockDim.x + threadIdx.x);
    T w0[FR_MAX_K], w1[FR_MAX_K];
#pragma unroll
    for (int q = 0; q < FR_MAX_K; ++q) {
        w0[q] = (q < (int)k && col < c) ? w[q * c + col] : T(0);
        w1[q] = (q < (int)k && col + 1 < c) ? w[q * c + col + 1] : T(0);
    }
    for (size_t e0 = blockIdx.x * (size_t)FR_TILE; e0 < e; e0 += gridDim.x * (size_t)FR_TILE) {
        const size_t rows = min((size_t)FR_TILE, e - e0);
        __syncthreads();
        for (size_t t = threadIdx.x; t < rows * k; t += blockDim.x) {
            const size_t r = t / k, q = t - r * k;
            tile[r * FR_MAX_K + q] = basis[(e0 + r) * kb + q];
        }
        __syncthreads();
        if (col >= c) continue;
        for (size_t r = 0; r < rows; ++r) {
            T a0 = T(0), a1 = T(0);
#pragma unroll
            for (int q = 0; q < FR_MAX_K; ++q) {
                if (q < (int)k) {
                    const T b = tile[r * FR_MAX_K + q];
                    a0 += b * w0[q];
                    a1 += b * w1[q];
                }
            }
            T* o = out + (e0 + r) * c + col;
            o[0] = a0;
            if (col + 1 < c) o[1] = a1;
        }
    }
}

#define FILTER_ROWS(T, S)                                                                      \
    extern "C" __global__ void filter_rows_##S(const T* basis, const T* w, T* out, size_t e,   \
                                               size_t kb, size_t k, size_t c) {                \
        filter_rows(basis, w, out, e, kb, k, c);                                               \
    }
FILTER_ROWS(float, f32)
FILTER_ROWS(double, f64)
