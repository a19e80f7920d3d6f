// Helpers shared by the fused kernels (included, not compiled on its own).
#pragma once
#include <cstddef>

// Added under the square root of |V| in the update block (src/ops/update.rs NORM_EPS).
#define NORM_EPS 1e-8

// Grid-stride loop over `total` work items; the host launches blocks of 256 threads.
#define FOR_EACH(k, total)                                                             \
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < (total);        \
         k += (size_t)gridDim.x * blockDim.x)

// Sum over the 32 lanes of a warp; every lane must take part.
template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    return x;
}

template <typename T>
__device__ __forceinline__ T sigmoid(T z) {
    return T(1) / (T(1) + exp(-z));
}

// One step of a warp reduce-scatter of 2 * BIT values: lanes with BIT set keep the upper half.
template <int BIT, typename T>
__device__ __forceinline__ void reduce_scatter_step(T* v, size_t lane) {
    const bool upper = lane & BIT;
#pragma unroll
    for (int r = 0; r < BIT; ++r) {
        const T lo = v[r], hi = v[r + BIT];
        v[r] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, BIT);
    }
}

// Basis columns the adjoint keeps per lane in registers, one per lane of a warp for the final
// reduction (n_rbf + 4 <= MAX_BASIS; the host checks).
#define MAX_BASIS 32
