// Row gather: out[e, :] = src[idx[e], :]. One thread per output element, grid-stride loop.
// Mirrors src/ops/gather.rs. Out-of-range indices write zeros (the host checks them first).
// initial_state is the same gather into the first n rows of the PaiNN state [4n, f], whose
// vector rows (zeroed by the host) stay zero.
#include "common.cuh"

template <typename T>
__device__ void gather_rows(const T* src, const unsigned int* idx, T* out, size_t n_idx,
                            size_t row, size_t n_src) {
    const size_t total = n_idx * row;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t e = k / row;
        const size_t c = k - e * row;
        const size_t j = idx[e];
        out[k] = j < n_src ? src[j * row + c] : T(0);
    }
}

extern "C" __global__ void gather_f32(const float* src, const unsigned int* idx, float* out,
                                      size_t n_idx, size_t row, size_t n_src) {
    gather_rows(src, idx, out, n_idx, row, n_src);
}

extern "C" __global__ void gather_f64(const double* src, const unsigned int* idx, double* out,
                                      size_t n_idx, size_t row, size_t n_src) {
    gather_rows(src, idx, out, n_idx, row, n_src);
}

#define INITIAL_STATE(T, S)                                                                   \
    extern "C" __global__ void initial_state_##S(const T* table, const unsigned int* species,  \
                                                 T* state, size_t n, size_t f, size_t n_src) { \
        wait_for_previous_kernel();                                                           \
        gather_rows(table, species, state, n, f, n_src);                                      \
    }
INITIAL_STATE(float, f32)
INITIAL_STATE(double, f64)
