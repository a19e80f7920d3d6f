// Per-edge maths of the edge basis (kernels/layers/edge_basis.cu), shared with the kernel that forms
// the basis and its derivative itself (kernels/whole/feature_split.cu). Included, not compiled on its
// own.
#pragma once
#include <cstddef>
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

// The cosine cutoff f_c(d) and its slope, with the Gaussians' spacing w = r_c / (R - 1) held
// as 1 / w: a column's z = (d - k w) / w = d / w - k and its slope are products (two IEEE
// divisions a column had taken the edge basis' adjoint to ~2,200 instructions an edge).
template <typename T>
struct Radial {
    T inv_w, fc, dfc;
    __device__ __forceinline__ Radial(T d, size_t n_rbf, T rc) {
        const T pi = T(3.14159265358979323846);
        const bool inside = d < rc;
        inv_w = T(n_rbf - 1) / rc;
        fc = inside ? T(0.5) * (cos(pi * d / rc) + T(1)) : T(0);
        dfc = inside ? T(-0.5) * pi / rc * sin(pi * d / rc) : T(0);
    }
    // Basis column k < R at d (Gaussian k times f_c), and its d-derivative.
    __device__ __forceinline__ void column(T d, unsigned k, T& value, T& slope) const {
        const T z = d * inv_w - T(k);
        const T rbf = exp(T(-0.5) * z * z);
        value = rbf * fc;
        slope = rbf * (dfc - z * inv_w * fc);
    }
};

// Basis of edge e into o[0 .. R + 4): Radial's columns, without the slopes (no sine).
template <typename T>
__device__ __forceinline__ void edge_basis_of(const T* pos, const T* off, const unsigned int* ci,
                                              const unsigned int* nj, size_t e, size_t n_rbf,
                                              T rc, T* o) {
    const T inv_w = T(n_rbf - 1) / rc, pi = T(3.14159265358979323846);
    T r[3];
    const T d = edge_vector(pos, off, ci, nj, e, r);
    const T fc = d < rc ? T(0.5) * (cos(pi * d / rc) + T(1)) : T(0);
    for (unsigned k = 0; k < n_rbf; ++k) {
        const T z = d * inv_w - T(k);  // as Radial::column
        o[k] = exp(T(-0.5) * z * z) * fc;
    }
    o[n_rbf] = fc;
#pragma unroll
    for (int a = 0; a < 3; ++a) o[n_rbf + 1 + a] = r[a] / d;
}

// dL/dr of an edge r (length d) from dL/dd and dL/d(r / d).
template <typename T>
__device__ __forceinline__ void grad_r(T gd, const T gu[3], const T r[3], T d, T gr[3]) {
    const T inv_d = T(1) / d;
    T u[3], gu_u = 0;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        u[a] = r[a] * inv_d;
        gu_u += gu[a] * u[a];
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) gr[a] = gd * u[a] + (gu[a] - gu_u * u[a]) * inv_d;
}

// dL/dr of edge e for its basis gradient ge (R + 4 values); r gets the edge's vector.
template <typename T>
__device__ __forceinline__ void edge_grad(const T* pos, const T* off, const T* ge,
                                          const unsigned int* ci, const unsigned int* nj,
                                          size_t e, size_t n_rbf, T rc, T gr[3], T r[3]) {
    const T d = edge_vector(pos, off, ci, nj, e, r);
    const Radial<T> radial(d, n_rbf, rc);
    T gd = ge[n_rbf] * radial.dfc;
    for (unsigned k = 0; k < n_rbf; ++k) {
        T value, slope;
        radial.column(d, k, value, slope);
        gd += ge[k] * slope;
    }
    grad_r(gd, ge + n_rbf + 1, r, d, gr);
}

// One thread per edge: grad(e, gr, r) gives edge e's dL/dr (and its vector r), added into atom
// j's gradient and taken from atom i's (gpos zeroed). Where a warp's edges have one centre
// (lists sorted by it: most warps), its share is summed over the warp first, one atomic add per
// component instead of 32 at one address. Whole warps walk the edges (the loop's bound is
// uniform), so that every lane reaches the warp's sums. Where wpos is given, each centre's
// virial Σ_e r_e ⊗ dL/dr_e (row-major 3x3, zeroed) is gathered the same way, for the stress.
template <typename T, typename Grad>
__device__ __forceinline__ void add_edge_grads(const unsigned int* ci, const unsigned int* nj,
                                               T* gpos, size_t n_edges, Grad grad,
                                               T* wpos = nullptr) {
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e0 = blockIdx.x * (size_t)blockDim.x; e0 < n_edges; e0 += step) {
        const size_t e = e0 + threadIdx.x;
        const bool in = e < n_edges;
        T gr[3] = {T(0), T(0), T(0)}, r[3] = {T(0), T(0), T(0)};
        unsigned i = 0xffffffffu;  // no centre: the lane is past the last edge
        if (in) {
            grad(e, gr, r);
            const size_t j = nj[e];
            i = ci[e];
#pragma unroll
            for (int a = 0; a < 3; ++a) atomicAdd(gpos + 3 * j + a, gr[a]);
        }
        const unsigned i0 = __shfl_sync(0xffffffffu, i, 0);
        if (__all_sync(0xffffffffu, i == i0 || !in)) {
            const bool lead = threadIdx.x % 32 == 0 && in;
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                const T sum = warp_sum(gr[a]);
                if (lead) atomicAdd(gpos + 3 * (size_t)i0 + a, -sum);
            }
            if (wpos) {
#pragma unroll
                for (int q = 0; q < 9; ++q) {
                    const T sum = warp_sum(r[q / 3] * gr[q % 3]);
                    if (lead) atomicAdd(wpos + 9 * (size_t)i0 + q, sum);
                }
            }
        } else if (in) {
#pragma unroll
            for (int a = 0; a < 3; ++a) atomicAdd(gpos + 3 * (size_t)i + a, -gr[a]);
            if (wpos) {
#pragma unroll
                for (int q = 0; q < 9; ++q) atomicAdd(wpos + 9 * (size_t)i + q, r[q / 3] * gr[q % 3]);
            }
        }
    }
}
