// Row scatter-add: out[idx[e], :] += src[e, :], out zero-initialised by the host.
// One thread per source element with atomicAdd, so every index is processed in parallel
// (candle's own CUDA index_add loops over the indices serially). Mirrors src/ops/scatter_add.rs.
#include <cstddef>

template <typename T>
__device__ void scatter_add_rows(const T* src, const unsigned int* idx, T* out, size_t n_idx,
                                 size_t row, size_t n_out) {
    const size_t total = n_idx * row;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t e = k / row;
        const size_t c = k - e * row;
        const size_t i = idx[e];
        if (i < n_out) atomicAdd(out + i * row + c, src[k]);
    }
}

extern "C" __global__ void scatter_add_f32(const float* src, const unsigned int* idx, float* out,
                                           size_t n_idx, size_t row, size_t n_out) {
    scatter_add_rows(src, idx, out, n_idx, row, n_out);
}

extern "C" __global__ void scatter_add_f64(const double* src, const unsigned int* idx,
                                           double* out, size_t n_idx, size_t row, size_t n_out) {
    scatter_add_rows(src, idx, out, n_idx, row, n_out);
}
