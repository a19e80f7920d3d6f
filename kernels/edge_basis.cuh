// Per-edge maths of the edge basis (kernels/edge_basis.cu), shared with the kernels that form
// the basis themselves (kernels/small_system.cu). Included, not compiled on its own.
#pragma once
#include <cstddef>

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

// Basis of edge e into o[0 .. R + 4).
template <typename T>
__device__ __forceinline__ void edge_basis_of(const T* pos, const T* off, const unsigned int* ci,
                                              const unsigned int* nj, size_t e, size_t n_rbf,
                                              T rc, T* o) {
    const T w = rc / T(n_rbf - 1), pi = T(3.14159265358979323846);
    T r[3];
    const T d = edge_vector(pos, off, ci, nj, e, r);
    const T fc = d < rc ? T(0.5) * (cos(pi * d / rc) + T(1)) : T(0);
    for (size_t k = 0; k < n_rbf; ++k) {
        const T z = (d - T(k) * w) / w;
        o[k] = exp(T(-0.5) * z * z) * fc;
    }
    o[n_rbf] = fc;
#pragma unroll
    for (int a = 0; a < 3; ++a) o[n_rbf + 1 + a] = r[a] / d;
}

// dL/dr of edge e for its basis gradient ge (R + 4 values).
template <typename T>
__device__ __forceinline__ void edge_grad(const T* pos, const T* off, const T* ge,
                                          const unsigned int* ci, const unsigned int* nj,
                                          size_t e, size_t n_rbf, T rc, T gr[3]) {
    const T w = rc / T(n_rbf - 1), pi = T(3.14159265358979323846);
    T r[3];
    const T d = edge_vector(pos, off, ci, nj, e, r);
    const bool inside = d < rc;
    const T fc = inside ? T(0.5) * (cos(pi * d / rc) + T(1)) : T(0);
    const T dfc = inside ? T(-0.5) * pi / rc * sin(pi * d / rc) : T(0);
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

