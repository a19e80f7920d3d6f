// Per-edge pieces shared by the interaction kernels (kernels/layers/interaction.cu,
// kernels/layers/interaction_tile.cu). Included, not compiled on its own.
#pragma once
#include <cstddef>

// Adds edge e's gradients for feature c to its sending atom j: dL/dφ_j and, through
// x_v = φ_v w_v (xv), dL/dv_j.
template <typename T>
__device__ __forceinline__ void add_sender_grads(T* gphi, T* gv, const T g[3], T gs, T gxd,
                                                 T gxv, T ws, T wd, T wv, T xv, size_t n,
                                                 size_t f, size_t j, size_t c) {
    atomicAdd(gphi + j * 3 * f + c, gs * ws);
    atomicAdd(gphi + j * 3 * f + f + c, gxd * wd);
    atomicAdd(gphi + j * 3 * f + 2 * f + c, gxv * wv);
#pragma unroll
    for (int a = 0; a < 3; ++a) atomicAdd(gv + (a * n + j) * f + c, g[a] * xv);
}

// Edge e's dL/dw for feature c, its row gwe = g_w + e 3F: the s, d and v parts.
template <typename T>
__device__ __forceinline__ void store_filter_grads(T* gwe, size_t f, size_t c, T gws, T gwd,
                                                   T gwv) {
    gwe[c] = gws;
    gwe[f + c] = gwd;
    gwe[2 * f + c] = gwv;
}
