// Edge basis of the filter network, one thread per edge e = (i <- j):
//   r = x[j] - x[i] + offset[e], d = |r|, f_c = (cos(pi d / r_c) + 1) / 2 for d < r_c else 0,
//   out[e] = [rbf_0(d) f_c, ..., rbf_{R-1}(d) f_c, f_c, r / d]          (R + 4 values)
// with Gaussians rbf_k(d) = exp(-(d - k w)^2 / 2w^2), w = r_c / (R - 1). The adjoint maps
// dL/d(out) to dL/dx with atomic adds. Mirrors src/ops/edge_basis.rs.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ T edge_vector(const T* pos, const T* off, const unsigned int* ci,
                                         const unsigned int* nj, size_t e, T r[3]) {
    const size_t i = ci[e], j = nj[e];
    T d2 = 0;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        r[a] = pos[3 * j + a] - pos[3 * i + a] + off[3 * e + a];
        d2 += r[a] * r[a];
    }
    return sqrt(d2);
}

template <typename T>
__device__ void basis_fwd(const T* pos, const T* off, const unsigned int* ci,
                          const unsigned int* nj, T* out, size_t n_edges, size_t n_rbf,
                          double cutoff) {
    const T rc = cutoff, w = rc / T(n_rbf - 1), pi = T(3.14159265358979323846);
    FOR_EACH(e, n_edges) {
        T r[3];
        const T d = edge_vector(pos, off, ci, nj, e, r);
        const T fc = d < rc ? T(0.5) * (cos(pi * d / rc) + T(1)) : T(0);
        T* o = out + e * (n_rbf + 4);
        for (size_t k = 0; k < n_rbf; ++k) {
            const T z = (d - T(k) * w) / w;
            o[k] = exp(T(-0.5) * z * z) * fc;
        }
        o[n_rbf] = fc;
#pragma unroll
        for (int a = 0; a < 3; ++a) o[n_rbf + 1 + a] = r[a] / d;
    }
}

// dL/dr of edge e for the basis gradient ge = g[e].
template <typename T>
__device__ __forceinline__ void edge_grad(const T* pos, const T* off, const T* g,
                                          const unsigned int* ci, const unsigned int* nj,
                                          size_t e, size_t n_rbf, T rc, T gr[3]) {
    const T w = rc / T(n_rbf - 1), pi = T(3.14159265358979323846);
    T r[3];
    const T d = edge_vector(pos, off, ci, nj, e, r);
    const bool inside = d < rc;
    const T fc = inside ? T(0.5) * (cos(pi * d / rc) + T(1)) : T(0);
    const T dfc = inside ? T(-0.5) * pi / rc * sin(pi * d / rc) : T(0);
    const T* ge = g + e * (n_rbf + 4);
    T gd = ge[n_rbf] * dfc;
    for (size_t k = 0; k < n_rbf; ++k) {
        const T z = (d - T(k) * w) / w;
        const T rbf = exp(T(-0.5) * z * z);
        gd += ge[k] * (rbf * dfc - rbf * z / w * fc);
    }
    T u[3], gu_u = 0;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        u[a] = r[a] / d;
        gu_u += ge[n_rbf + 1 + a] * u[a];
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) gr[a] = gd * u[a] + (ge[n_rbf + 1 + a] - gu_u * u[a]) / d;
}

// One thread per edge, atomic adds into the two atoms' gradients (gpos zeroed).
template <typename T>
__device__ void basis_adj(const T* pos, const T* off, const T* g, const unsigned int* ci,
                          const unsigned int* nj, T* gpos, size_t n_edges, size_t n_rbf,
                          double cutoff) {
    FOR_EACH(e, n_edges) {
        T gr[3];
        edge_grad(pos, off, g, ci, nj, e, n_rbf, T(cutoff), gr);
        const size_t i = ci[e], j = nj[e];
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            atomicAdd(gpos + 3 * j + a, gr[a]);
            atomicAdd(gpos + 3 * i + a, -gr[a]);
        }
    }
}

#define EDGE_BASIS(T, S)                                                                     \
    extern "C" __global__ void edge_basis_fwd_##S(const T* pos, const T* off,              \
                                                  const unsigned int* ci,                  \
                                                  const unsigned int* nj, T* out,          \
                                                  size_t n_edges, size_t n_rbf, double rc) { \
        basis_fwd(pos, off, ci, nj, out, n_edges, n_rbf, rc);                               \
    }                                                                                       \
    extern "C" __global__ void edge_basis_adj_##S(const T* pos, const T* off, const T* g,  \
                                                  const unsigned int* ci,                  \
                                                  const unsigned int* nj, T* gpos,         \
                                                  size_t n_edges, size_t n_rbf, double rc) { \
        basis_adj(pos, off, g, ci, nj, gpos, n_edges, n_rbf, rc);                           \
    }
EDGE_BASIS(float, f32)
EDGE_BASIS(double, f64)
