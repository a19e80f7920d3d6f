// The pieces of the feature-split kernel (kernels/whole/feature_split.cu) around its one
// function: the launch's dimensions, the MD step it may run, the barrier, the staged layer
// inputs and weights, the dense product and the scratch layout. Included by it alone.
#pragma once

#include "common.cuh"
#include "edge_basis.cuh"
#include "grid.cuh"
#include "integrator.cuh"
#include "packed_weights.cuh"

namespace {

struct Dims {
    int n, e, f, r, blocks, groups, n_el, xs_len, eb_edges, stamps, s, h2;
};

// The MD step around the force call (`on` unset: a plain energy + forces call, whose launch
// passes its float inputs in the unused slots).
struct MdStep {
    const double *x, *v, *f, *hk, *xi, *scale, *reference;
    double* out;
    double dt, c1;
    bool on, langevin;
    // Coordinate t after the step up to the force call.
    __device__ __forceinline__ void advance(int t, double& x1, double& v1) const {
        const int a = t / 3;
        md_advance_one(x[t], v[t], f[t], hk[a], langevin ? xi[t] : 0.0, langevin ? scale[a] : 0.0,
                       langevin, dt, c1, x1, v1);
    }
    // The last block's share: the closing kick with the new forces (type T, summed by every
    // block), the total energy, and the displacement of the advanced positions.
    template <typename T>
    __device__ void finish(const T* forces, const T* energies, int n) const {
        for (int t = threadIdx.x; t < 3 * n; t += blockDim.x) {
            double x1, v1;
            advance(t, x1, v1);
            const double ft = double(__ldcg(forces + t));
            out[t] = x1;
            out[3 * n + t] = md_kick_one(v1, ft, hk[t / 3]);
            out[6 * n + t] = ft;
        }
        if (threadIdx.x >= 32) return;
        double e = 0.0, sum = 0.0, most = 0.0;
        for (int a = threadIdx.x; a < n; a += 32) {
            e += double(__ldcg(energies + a));
            double xa[3], v1;
            for (int c = 0; c < 3; ++c) advance(3 * a + c, xa[c], v1);
            const double d2 = md_displacement2_one(xa, reference + 3 * a);
            sum = __dadd_rn(sum, d2);
            most = md_max_nan(most, d2);
        }
        for (int o = 16; o > 0; o >>= 1) {
            e += __shfl_down_sync(0xffffffffu, e, o);
            sum += __shfl_down_sync(0xffffffffu, sum, o);
            most = md_max_nan(most, __shfl_down_sync(0xffffffffu, most, o));
        }
        if (threadIdx.x == 0) {
            out[9 * n] = e;
            out[9 * n + 1] = sum;
            out[9 * n + 2] = most;
        }
    }
};

template <typename T>
__device__ __forceinline__ T ld(const T* p) {
    return __ldcg(p);  // written by other blocks of this launch: past L1
}

// Barrier among the launch's blocks (grid.cuh), then block 0's phase stamp.
__device__ __forceinline__ void group_sync(unsigned int* counter, unsigned int& target,
                                           Stamps& stamps) {
    grid_barrier(counter, target);
    stamps.mark();
}

// Threads per block (src/ops/whole/feature_split.rs launches exactly this many).
constexpr int THREADS = 512;

// Four consecutive values at p (16-byte aligned) from L2: written by other blocks.
template <typename T>
__device__ __forceinline__ void ld4(const T* p, T v[4]) {
    if constexpr (sizeof(T) == 4) {
        const float4 q = __ldcg(reinterpret_cast<const float4*>(p));
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        const double2 a = __ldcg(reinterpret_cast<const double2*>(p));
        const double2 b = __ldcg(reinterpret_cast<const double2*>(p) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    }
}

// Layer inputs in global memory: row r, columns [0, split) at base + r stride, columns
// [split, K) at base2 + r stride (two tensors side by side), SiLU applied when silu is set.
template <typename T>
struct Rows {
    const T* base;
    int stride;
    const T* base2 = nullptr;
    int split = 1 << 30;
    bool silu = false;
    __device__ const T* at(int r, int k) const {
        return k < split ? base + (size_t)r * stride + k : base2 + (size_t)r * stride + k - split;
    }
};

// xs[r][k] = in(r, k) for r < rows (zero rows up to a multiple of 4), leading dim K + 1
// (K a multiple of 4). Every load is issued before the first store. The next dense()
// synchronises before reading it.
template <typename T>
__device__ __forceinline__ void stage(T* xs, int rows, int K, Rows<T> in) {
    constexpr int U = 8;
    const int rows_pad = (rows + 3) & ~3, ld = K + 1, k4 = K / 4, total = rows_pad * k4;
    for (int base = threadIdx.x; base < total; base += U * THREADS) {
        T v[U][4];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int idx = base + u * THREADS, r = idx / k4;
            if (idx < total && r < rows)
                ld4(in.at(r, (idx - r * k4) * 4), v[u]);
            else
                v[u][0] = v[u][1] = v[u][2] = v[u][3] = T(0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int idx = base + u * THREADS, r = idx / k4;
            if (idx < total)
                for (int q = 0; q < 4; ++q)
                    xs[r * ld + (idx - r * k4) * 4 + q] = in.silu ? silu_of(v[u][q]) : v[u][q];
        }
    }
}

// Column j of a layer that a block computes: (j / width) stride + first + j % width, e.g. its
// own features in each F-wide chunk.
struct Cols {
    int width, stride, first;
    __device__ int operator()(int j) const { return (j / width) * stride + first + j % width; }
};

// ws[k][j] = W[k sk + col(j) sc]: this block's columns of a layer, for the next dense(), and
// after them its biases ws[K ncols + j] = bias[col(j)] when given. Weights depend on no other
// block, so callers start these copies before the barrier that precedes the layer, and they
// land while the block waits there (dense() waits for them).
template <typename T>
__device__ __forceinline__ void load_w(T* ws, int K, const T* __restrict__ W, int sk, int sc,
                                    int ncols, Cols col, const T* bias) {
    for (int idx = threadIdx.x; idx < K * ncols; idx += THREADS) {
        if (sk == 1) {  // adjoint: column j of the product is a contiguous row of W
            const int j = idx / K, k = idx - j * K;
            copy_async(ws + k * ncols + j, W + (size_t)col(j) * sc + k);
        } else {
            const int k = idx / ncols, j = idx - k * ncols;
            copy_async(ws + idx, W + (size_t)k * sk + (size_t)col(j) * sc);
        }
    }
    if (bias)
        for (int j = threadIdx.x; j < ncols; j += THREADS) copy_async(ws + K * ncols + j, bias + col(j));
}

// y[r][j] = sum_k xs[r][k] ws[k][j] for r < rows, j < ncols; emit(r, j, y). Threads take
// 4 rows x 1 column, splitting K over P lanes (up to a warp) when there are few outputs.
template <typename T, typename Emit>
__device__ __forceinline__ void dense(const T* xs, const T* ws, int rows, int K, int ncols, Emit emit) {
    wait_copies();
    __syncthreads();
    const int ld = K + 1, groups = (rows + 3) / 4, items = groups * ncols;
    int P = 1;
    while (P < 32 && items * P * 2 <= THREADS) P *= 2;
    const int part = threadIdx.x % P, per_pass = THREADS / P;
    for (int base = 0; base < items; base += per_pass) {
        const int item = base + threadIdx.x / P;
        const bool valid = item < items;
        T acc[4] = {T(0), T(0), T(0), T(0)};
        const int j = valid ? item % ncols : 0, r0 = valid ? (item / ncols) * 4 : 0;
        if (valid) {
            const T* x = xs + r0 * ld;
#pragma unroll 4
            for (int k = part; k < K; k += P) {
                const T wk = ws[k * ncols + j];
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[q] += x[q * ld + k] * wk;
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
            for (int o = P / 2; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
        if (valid && part == 0)
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (r0 + q < rows) emit(r0 + q, j, acc[q]);
    }
    __syncthreads();
}

template <typename T>
struct Scratch {
    T *state, *h1, *msg, *nrm, *cpre, *ro, *ga, *gcpre, *gmixed, *gphi, *gh, *end;
    __device__ Scratch(T* p, const Dims& d) {
        const size_t nf = (size_t)d.n * d.f, b = d.blocks;
        state = p;                          // B x s [N F]: each block's output (its own v stays)
        h1 = state + b * nf;                // (B - 1) x N F: blocks 1.. (block 0's φ is a table)
        msg = h1 + (b - 1) * nf;            // B x 4 N F
        nrm = msg + b * 4 * nf;             // B x N F
        cpre = nrm + b * nf;                // B x N F
        ro = cpre + b * nf;                 // N F/2
        ga = ro + (size_t)d.n * d.h2;
        gcpre = ga + 3 * nf;
        gmixed = gcpre + nf;
        gphi = gmixed + 6 * nf;
        gh = gphi + 3 * nf;
        end = gh + nf;
    }
};

}  // namespace
