// Fused PaiNN message: for each edge e = (i <- j) and feature c < F,
//   xs, xd, xv = phi[j, c | F+c | 2F+c] * w[e, c | F+c | 2F+c]
//   out[i, c]           += xs
//   out[i, F + d*F + c] += xd * dir[e, d] + xv * v[j, d*F + c]     (d = x, y, z)
// One thread per (edge, feature) with atomicAdd into the zero-initialised [N, 4F] output; no
// [E, 3F] intermediate. edge rows are [w (3F) | dir (3)]. Mirrors src/ops/message.rs.
#include <cstddef>

template <typename T>
__device__ void message_rows(const T* phi, const T* v, const T* edge, const unsigned int* ci,
                             const unsigned int* nj, T* out, size_t n_edges, size_t f,
                             size_t n_atoms) {
    const size_t total = n_edges * f;
    const size_t ew = 3 * f + 3;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t e = k / f;
        const size_t c = k - e * f;
        const size_t i = ci[e];
        const size_t j = nj[e];
        if (i >= n_atoms || j >= n_atoms) continue;
        const T* w = edge + e * ew;
        const T* p = phi + j * 3 * f;
        const T* vj = v + j * 3 * f;
        T* o = out + i * 4 * f;
        const T xs = p[c] * w[c];
        const T xd = p[f + c] * w[f + c];
        const T xv = p[2 * f + c] * w[2 * f + c];
        atomicAdd(o + c, xs);
#pragma unroll
        for (int d = 0; d < 3; ++d) {
            atomicAdd(o + f + d * f + c, xd * w[3 * f + d] + xv * vj[d * f + c]);
        }
    }
}

extern "C" __global__ void message_f32(const float* phi, const float* v, const float* edge,
                                       const unsigned int* ci, const unsigned int* nj, float* out,
                                       size_t n_edges, size_t f, size_t n_atoms) {
    message_rows(phi, v, edge, ci, nj, out, n_edges, f, n_atoms);
}

extern "C" __global__ void message_f64(const double* phi, const double* v, const double* edge,
                                       const unsigned int* ci, const unsigned int* nj, double* out,
                                       size_t n_edges, size_t f, size_t n_atoms) {
    message_rows(phi, v, edge, ci, nj, out, n_edges, f, n_atoms);
}
