// Helpers shared by the fused kernels (included, not compiled on its own).
#pragma once
#include <cstddef>

// Added under the square root of |V| in the update block (src/ops/layers/update.rs NORM_EPS).
#define NORM_EPS 1e-8

// |V| of the update block: sqrt(NORM_EPS + Σ_k p[k stride]^2) over the three components.
template <typename T>
__device__ __forceinline__ T norm3_eps(const T* p, size_t stride) {
    T sq = T(NORM_EPS);
#pragma unroll
    for (int k = 0; k < 3; ++k) sq += p[k * stride] * p[k * stride];
    return sqrt(sq);
}

// Programmatic dependent launch (src/ops/launch/overlap.rs): a kernel launched to overlap the previous
// kernel on its stream waits here until that kernel has finished and its writes are visible,
// before it reads anything another kernel wrote and before it writes anything (what it does
// before, such as loading a model's weights, overlaps the previous kernel); then it lets the
// next kernel begin launching. A plain launch passes straight through.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

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

template <typename T>
__device__ __forceinline__ T silu_of(T z) {
    return z * sigmoid(z);
}

// d silu(z) / dz.
template <typename T>
__device__ __forceinline__ T silu_grad(T z) {
    const T sg = sigmoid(z);
    return sg * (T(1) + z * (T(1) - sg));
}

// One step of a warp reduce-scatter of 2 * BIT values with the lanes MASK apart: lanes with
// MASK set keep the upper half.
template <int BIT, int MASK = BIT, typename T>
__device__ __forceinline__ void reduce_scatter_step(T* v, size_t lane) {
    const bool upper = lane & MASK;
#pragma unroll
    for (int r = 0; r < BIT; ++r) {
        const T lo = v[r], hi = v[r + BIT];
        v[r] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, MASK);
    }
}

// Basis columns the adjoint keeps per lane in registers, one per lane of a warp for the final
// reduction (n_rbf + 4 <= MAX_BASIS; the host checks).
#define MAX_BASIS 32

// Four consecutive values at p in shared memory (16-byte aligned).
template <typename T>
__device__ __forceinline__ void ld4_shared(const T* p, T v[4]) {
    if constexpr (sizeof(T) == 4) {
        const float4 q = *reinterpret_cast<const float4*>(p);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        const double2 a = reinterpret_cast<const double2*>(p)[0];
        const double2 b = reinterpret_cast<const double2*>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    }
}

// *dst = *src without waiting for it (cp.async): the copy lands by the next wait_copies().
template <typename T>
__device__ __forceinline__ void copy_async(T* dst, const T* src) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (sizeof(T) == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(to), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(to), "l"(src) : "memory");
}

// Waits for this thread's copy_async()s; a __syncthreads() after it publishes them all.
__device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}
