// Edge basis of the filter network, one thread per edge e = (i <- j):
//   r = x[j] - x[i] + offset[e], d = |r|, f_c = (cos(pi d / r_c) + 1) / 2 for d < r_c else 0,
//   out[e] = [rbf_0(d) f_c, ..., rbf_{R-1}(d) f_c, f_c, r / d]          (R + 4 values)
// with Gaussians rbf_k(d) = exp(-(d - k w)^2 / 2w^2), w = r_c / (R - 1). The adjoint maps
// dL/d(out) to dL/dx with atomic adds. Mirrors src/ops/edge_basis.rs.
#include "common.cuh"
#include "edge_basis.cuh"

// A block forms its edges' rows in shared memory ([blockDim.x][R + 4]) and stores them as one
// contiguous run: a thread writing its own row left every store instruction of a warp spread
// over 32 rows, many times the arithmetic's time.
template <typename T>
__device__ void basis_fwd(const T* pos, const T* off, const unsigned int* ci,
                          const unsigned int* nj, T* out, size_t n_edges, size_t n_rbf,
                          double cutoff) {
    extern __shared__ __align__(16) unsigned char basis_rows[];
    T* rows = reinterpret_cast<T*>(basis_rows);
    const size_t bw = n_rbf + 4;
    for (size_t e0 = blockIdx.x * (size_t)blockDim.x; e0 < n_edges;
         e0 += (size_t)gridDim.x * blockDim.x) {
        const size_t e = e0 + threadIdx.x;
        if (e < n_edges) edge_basis_of(pos, off, ci, nj, e, n_rbf, T(cutoff), rows + threadIdx.x * bw);
        __syncthreads();
        const size_t len = min((size_t)blockDim.x, n_edges - e0) * bw;
        for (size_t k = threadIdx.x; k < len; k += blockDim.x) out[e0 * bw + k] = rows[k];
        __syncthreads();  // the rows are stored before the next edges overwrite them
    }
}

// dL/d(positions) (gpos zeroed) from dL/d(basis) rows g [E, R + 4]; where wpos is given,
// each centre's virial Σ_e r_e ⊗ dL/dr_e too (add_edge_grads).
template <typename T>
__device__ void basis_adj(const T* pos, const T* off, const T* g, const unsigned int* ci,
                          const unsigned int* nj, T* gpos, T* wpos, size_t n_edges,
                          size_t n_rbf, double cutoff) {
    add_edge_grads(
        ci, nj, gpos, n_edges,
        [&](size_t e, T gr[3], T r[3]) {
            edge_grad(pos, off, g + e * (n_rbf + 4), ci, nj, e, n_rbf, T(cutoff), gr, r);
        },
        wpos);
}

#define EDGE_BASIS(T, S)                                                                     \
    extern "C" __global__ void edge_basis_fwd_##S(const T* pos, const T* off,              \
                                                  const unsigned int* ci,                  \
                                                  const unsigned int* nj, T* out,          \
                                                  size_t n_edges, size_t n_rbf, double rc) { \
        wait_for_previous_kernel();                                                         \
        basis_fwd(pos, off, ci, nj, out, n_edges, n_rbf, rc);                               \
    }                                                                                       \
    extern "C" __global__ void edge_basis_adj_##S(const T* pos, const T* off, const T* g,  \
                                                  const unsigned int* ci,                  \
                                                  const unsigned int* nj, T* gpos,         \
                                                  size_t n_edges, size_t n_rbf, double rc) { \
        wait_for_previous_kernel();                                                         \
        basis_adj(pos, off, g, ci, nj, gpos, (T*)nullptr, n_edges, n_rbf, rc);              \
    }                                                                                       \
    /* out [4N, 3]: the atoms' gradients, then their virials (3 rows each). */              \
    extern "C" __global__ void edge_basis_virial_adj_##S(const T* pos, const T* off,         \
                                                       const T* g, const unsigned int* ci, \
                                                       const unsigned int* nj, T* out,     \
                                                       size_t n_edges, size_t n_rbf,       \
                                                       size_t n, double rc) {              \
        wait_for_previous_kernel();                                                         \
        basis_adj(pos, off, g, ci, nj, out, out + 3 * n, n_edges, n_rbf, rc);               \
    }
EDGE_BASIS(float, f32)
EDGE_BASIS(double, f64)
