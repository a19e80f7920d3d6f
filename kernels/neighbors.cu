// Neighbour lists built on the device, padded to a fixed capacity, for cells where each pair
// has at most one image within the cutoff (minimum image). Mirrors src/neighbors/device.rs,
// whose CPU twin does the same arithmetic in the same order: every product and sum below is
// rounded on its own (__dmul_rn/__dadd_rn, no fused multiply-add), as Rust computes them, so
// an edge is listed iff the host's cell list lists it (its test |x_j - x_i + S·cell|² < c²).
//
// `geom` holds 30 doubles: reciprocal rows recip[k][d] (0..9), the wrapping basis rows
// (9..18), the caller's cell rows for image vectors (18..27), and 1/0 per periodic axis
// (27..30).
#include <cstddef>

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ double dot3(double a0, double a1, double a2, const double* b) {
    return __dadd_rn(__dadd_rn(__dmul_rn(a0, b[0]), __dmul_rn(a1, b[1])), __dmul_rn(a2, b[2]));
}

// Image shift S of pair i <- j (rounded fractional difference along periodic axes) and
// whether the pair is an edge.
__device__ __forceinline__ bool pair_edge(const double* x, size_t i, size_t j, const double* g,
                                          bool periodic, double cut2, int s[3]) {
    const double d0 = __dsub_rn(x[3 * j], x[3 * i]);
    const double d1 = __dsub_rn(x[3 * j + 1], x[3 * i + 1]);
    const double d2 = __dsub_rn(x[3 * j + 2], x[3 * i + 2]);
    s[0] = s[1] = s[2] = 0;
    if (periodic) {
#pragma unroll
        for (int k = 0; k < 3; ++k) {
            if (g[27 + k] != 0.0) s[k] = -(int)round(dot3(d0, d1, d2, g + 3 * k));
        }
    }
    if (i == j && s[0] == 0 && s[1] == 0 && s[2] == 0) return false;
    double v[3] = {d0, d1, d2};
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        if (s[k] != 0) {
            const double f = (double)s[k];
#pragma unroll
            for (int c = 0; c < 3; ++c) v[c] = __dadd_rn(v[c], __dmul_rn(f, g[18 + 3 * k + c]));
        }
    }
    const double r2 = __dadd_rn(__dadd_rn(__dmul_rn(v[0], v[0]), __dmul_rn(v[1], v[1])),
                                __dmul_rn(v[2], v[2]));
    return r2 < cut2;
}

// Cartesian image offset S·cell, component c, summed in the host's order.
__device__ __forceinline__ double image_offset(const int s[3], const double* g, int c) {
    if (s[0] == 0 && s[1] == 0 && s[2] == 0) return 0.0;
    double o = 0.0;
#pragma unroll
    for (int k = 0; k < 3; ++k) o = __dadd_rn(o, __dmul_rn((double)s[k], g[18 + 3 * k + c]));
    return o;
}

// Positions wrapped into the cell along periodic axes (fractional coordinates in [0, 1)), as
// src/neighbors/mod.rs wrap_positions: one thread per atom.
extern "C" __global__ void nl_wrap_f64(const double* x, const double* g, double* out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const double x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];
        double f[3];
#pragma unroll
        for (int k = 0; k < 3; ++k) {
            f[k] = dot3(x0, x1, x2, g + 3 * k);
            if (g[27 + k] != 0.0) f[k] = __dsub_rn(f[k], floor(f[k]));
        }
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            double o = 0.0;
#pragma unroll
            for (int k = 0; k < 3; ++k) o = __dadd_rn(o, __dmul_rn(f[k], g[9 + 3 * k + c]));
            out[3 * i + c] = o;
        }
    }
}

// Atom i's candidate neighbours j in [lo, hi): all atoms, or (a batch of independent systems)
// the atoms of its own system, span[2i] .. span[2i + 1].
__device__ __forceinline__ void span_of(const unsigned int* span, size_t i, size_t n, size_t* lo,
                                        size_t* hi) {
    *lo = span ? span[2 * i] : 0;
    *hi = span ? span[2 * i + 1] : n;
}

// Edges per atom: one warp per atom i, its lanes over j.
extern "C" __global__ void nl_count_f64(const double* x, const double* g, unsigned int* counts,
                                        size_t n, unsigned int periodic, double cut2,
                                        const unsigned int* span) {
    const unsigned lane = threadIdx.x & 31;
    const size_t warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; i < n; i += warps) {
        unsigned int c = 0;
        size_t lo, hi;
        span_of(span, i, n, &lo, &hi);
        for (size_t j0 = lo; j0 < hi; j0 += 32) {
            const size_t j = j0 + lane;
            int s[3];
            const bool e = j < hi && pair_edge(x, i, j, g, periodic != 0, cut2, s);
            c += __popc(__ballot_sync(FULL_MASK, e));
        }
        if (lane == 0) counts[i] = c;
    }
}

// Exclusive prefix sum of the counts in one block of 1024 threads: out[0..n] the first slot of
// each atom's edges, out[n] the number of edges (saturated at 2^32 - 1), out[n + 1] 1 when they
// do not fit `capacity` (the overflow flag), else 0.
extern "C" __global__ void nl_scan_f64(const unsigned int* counts, unsigned int* out, size_t n,
                                       size_t capacity) {
    __shared__ unsigned long long warp_total[32];
    __shared__ unsigned long long carry;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (size_t base = 0; base < n; base += blockDim.x) {
        const size_t i = base + threadIdx.x;
        const unsigned long long v = i < n ? counts[i] : 0;
        unsigned long long inc = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long u = __shfl_up_sync(FULL_MASK, inc, o);
            if (lane >= (unsigned)o) inc += u;
        }
        if (lane == 31) warp_total[warp] = inc;
        __syncthreads();
        if (warp == 0) {
            unsigned long long t = lane < (blockDim.x >> 5) ? warp_total[lane] : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long u = __shfl_up_sync(FULL_MASK, t, o);
                if (lane >= (unsigned)o) t += u;
            }
            warp_total[lane] = t;  // inclusive over warps
        }
        __syncthreads();
        const unsigned long long before = carry + (warp > 0 ? warp_total[warp - 1] : 0);
        if (i < n) out[i] = (unsigned int)(before + inc - v);
        __syncthreads();
        if (threadIdx.x == 0) carry += warp_total[(blockDim.x >> 5) - 1];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[n] = carry > 0xffffffffull ? 0xffffffffu : (unsigned int)carry;
        out[n + 1] = carry > capacity ? 1u : 0u;
    }
}

// Padding after the `total` edges: atom k mod n to itself in every slot up to `capacity`.
__device__ __forceinline__ void pad_slots(unsigned int* out, size_t total, size_t capacity,
                                          size_t n, size_t thread, size_t threads) {
    for (size_t k = total + thread; k < capacity; k += threads) {
        const unsigned int a = (unsigned int)((k - total) % n);
        out[k] = a;
        out[capacity + k] = a;
    }
}

// Centers (out[0..capacity]) and neighbours (out[capacity..2 capacity]) of every slot: each
// atom's edges at its first slot, neighbours in increasing order (the host list's order), then
// padding: atom k mod n to itself (its image offset, written by nl_offsets, lies beyond the
// cutoff). An overflowed list is padding only.
extern "C" __global__ void nl_fill_f64(const double* x, const double* g, const unsigned int* scan,
                                       unsigned int* out, size_t n, size_t capacity,
                                       unsigned int periodic, double cut2,
                                       const unsigned int* span) {
    const bool overflow = scan[n + 1] != 0;
    const size_t total = overflow ? 0 : scan[n];
    const unsigned lane = threadIdx.x & 31;
    const size_t thread = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t threads = (size_t)gridDim.x * blockDim.x;
    if (!overflow) {
        for (size_t i = thread >> 5; i < n; i += threads >> 5) {
            size_t slot = scan[i];
            size_t lo, hi;
            span_of(span, i, n, &lo, &hi);
            for (size_t j0 = lo; j0 < hi; j0 += 32) {
                const size_t j = j0 + lane;
                int s[3];
                const bool e = j < hi && pair_edge(x, i, j, g, periodic != 0, cut2, s);
                const unsigned mask = __ballot_sync(FULL_MASK, e);
                if (e) {
                    const size_t k = slot + __popc(mask & ((1u << lane) - 1u));
                    out[k] = (unsigned int)i;
                    out[capacity + k] = (unsigned int)j;
                }
                slot += __popc(mask);
            }
        }
    }
    pad_slots(out, total, capacity, n, thread, threads);
}

// Image offsets S·cell of every slot ([capacity, 3]); padding slots get (pad, 0, 0).
template <typename T>
__device__ void offsets(const double* x, const double* g, const unsigned int* scan,
                        const unsigned int* edges, T* out, size_t n, size_t capacity,
                        unsigned int periodic, double cut2, double pad) {
    const size_t total = scan[n + 1] != 0 ? 0 : scan[n];
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < capacity;
         k += (size_t)gridDim.x * blockDim.x) {
        double o[3] = {pad, 0.0, 0.0};
        if (k < total) {
            int s[3];
            pair_edge(x, edges[k], edges[capacity + k], g, periodic != 0, cut2, s);
#pragma unroll
            for (int c = 0; c < 3; ++c) o[c] = image_offset(s, g, c);
        }
#pragma unroll
        for (int c = 0; c < 3; ++c) out[3 * k + c] = (T)o[c];
    }
}

extern "C" __global__ void nl_offsets_f32(const double* x, const double* g,
                                          const unsigned int* scan, const unsigned int* edges,
                                          float* out, size_t n, size_t capacity,
                                          unsigned int periodic, double cut2, double pad) {
    offsets(x, g, scan, edges, out, n, capacity, periodic, cut2, pad);
}

extern "C" __global__ void nl_offsets_f64(const double* x, const double* g,
                                          const unsigned int* scan, const unsigned int* edges,
                                          double* out, size_t n, size_t capacity,
                                          unsigned int periodic, double cut2, double pad) {
    offsets(x, g, scan, edges, out, n, capacity, periodic, cut2, pad);
}

// Pruning a built list to the pairs within a (smaller) cutoff at the current positions, for
// the model: a Verlet list's skin adds edges that contribute exactly zero but cost as much as
// any other. Atom i's edges are slots scan[i]..scan[i + 1] of the list (the build's scan).
template <typename T>
__device__ __forceinline__ bool still_within(const double* x, size_t i, size_t j, const T* off,
                                             size_t k, double cut2) {
    double v[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        v[c] = __dadd_rn(__dsub_rn(x[3 * j + c], x[3 * i + c]), (double)off[3 * k + c]);
    }
    return __dadd_rn(__dadd_rn(__dmul_rn(v[0], v[0]), __dmul_rn(v[1], v[1])),
                     __dmul_rn(v[2], v[2])) < cut2;
}

// Kept edges per atom: one warp per atom, its lanes over the atom's slots.
template <typename T>
__device__ void within_count(const double* x, const unsigned int* scan,
                             const unsigned int* neighbors, const T* off, unsigned int* counts,
                             size_t n, double cut2) {
    const unsigned lane = threadIdx.x & 31;
    const size_t warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; i < n; i += warps) {
        unsigned int c = 0;
        for (size_t k0 = scan[i]; k0 < scan[i + 1]; k0 += 32) {
            const size_t k = k0 + lane;
            const bool e = k < scan[i + 1] && still_within(x, i, neighbors[k], off, k, cut2);
            c += __popc(__ballot_sync(FULL_MASK, e));
        }
        if (lane == 0) counts[i] = c;
    }
}

// The kept edges in list order: out = [centers | neighbours | slot in the old list], each
// `edges` long (the old list's edge count; the kept ones come first).
template <typename T>
__device__ void within_fill(const double* x, const unsigned int* scan,
                            const unsigned int* neighbors, const T* off,
                            const unsigned int* kept_scan, unsigned int* out, size_t n,
                            size_t edges, double cut2) {
    const unsigned lane = threadIdx.x & 31;
    const size_t warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; i < n; i += warps) {
        size_t slot = kept_scan[i];
        for (size_t k0 = scan[i]; k0 < scan[i + 1]; k0 += 32) {
            const size_t k = k0 + lane;
            const unsigned j = k < scan[i + 1] ? neighbors[k] : 0;
            const bool e = k < scan[i + 1] && still_within(x, i, j, off, k, cut2);
            const unsigned mask = __ballot_sync(FULL_MASK, e);
            if (e) {
                const size_t s = slot + __popc(mask & ((1u << lane) - 1u));
                out[s] = (unsigned int)i;
                out[edges + s] = j;
                out[2 * edges + s] = (unsigned int)k;
            }
            slot += __popc(mask);
        }
    }
}

#define WITHIN(S, T)                                                                          \
    extern "C" __global__ void nl_within_count_##S(const double* x, const unsigned int* scan, \
                                                   const unsigned int* neighbors, const T* off, \
                                                   unsigned int* counts, size_t n,            \
                                                   double cut2) {                             \
        within_count(x, scan, neighbors, off, counts, n, cut2);                               \
    }                                                                                         \
    extern "C" __global__ void nl_within_fill_##S(                                            \
        const double* x, const unsigned int* scan, const unsigned int* neighbors, const T* off, \
        const unsigned int* kept_scan, unsigned int* out, size_t n, size_t edges, double cut2) { \
        within_fill(x, scan, neighbors, off, kept_scan, out, n, edges, cut2);                 \
    }
WITHIN(f32, float)
WITHIN(f64, double)

// Binned builds: atoms sorted into bins at least one cutoff wide along every axis, so that an
// atom's candidates are the atoms of its own and the adjacent bins (O(N) pair tests, where the
// kernels above test all pairs). `grid` holds 9 doubles: bins per axis nb[k] (0..3), then
// lo[k] (3..6) and inv[k] (6..9): along axis k the bin of u_k = x·recip[k] (the fractional
// coordinate, wrapped into [0, 1) along a periodic axis, where lo = 0) is floor((u_k - lo[k])
// * inv[k]), clamped into [0, nb[k]). Edges come out as the all-pairs kernels list them:
// the same test, each atom's neighbours in increasing order.
__device__ __forceinline__ unsigned int bin_axis(const double* x, size_t i, const double* g,
                                                 const double* grid, int k) {
    double u = dot3(x[3 * i], x[3 * i + 1], x[3 * i + 2], g + 3 * k);
    if (g[27 + k] != 0.0) u = __dsub_rn(u, floor(u));
    double t = floor(__dmul_rn(__dsub_rn(u, grid[3 + k]), grid[6 + k]));
    const double top = grid[k] - 1.0;
    if (!(t >= 0.0)) t = 0.0;  // NaN too
    if (t > top) t = top;
    return (unsigned int)t;
}

// Each atom's bin, flattened (b0 nb1 + b1) nb2 + b2: one thread per atom.
extern "C" __global__ void nl_bin_of_f64(const double* x, const double* g, const double* grid,
                                         unsigned int* out, size_t n) {
    const unsigned int nb1 = (unsigned int)grid[1], nb2 = (unsigned int)grid[2];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = (bin_axis(x, i, g, grid, 0) * nb1 + bin_axis(x, i, g, grid, 1)) * nb2 +
                 bin_axis(x, i, g, grid, 2);
    }
}

// Atoms per bin (`counts` zeroed before the launch).
extern "C" __global__ void nl_bin_count_f64(const unsigned int* bin, unsigned int* counts,
                                            size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        atomicAdd(&counts[bin[i]], 1u);
    }
}

// The atoms of every bin at the bin's slots (`bscan`, nl_scan of the counts): out[0..n] the
// atoms, in any order within a bin; out[n..n + bins] the cursors (zeroed before the launch).
extern "C" __global__ void nl_bin_place_f64(const unsigned int* bin, const unsigned int* bscan,
                                            unsigned int* out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const unsigned int b = bin[i];
        out[bscan[b] + atomicAdd(&out[n + b], 1u)] = (unsigned int)i;
    }
}

// The bin `d` (-1, 0, 1) away from `b` along axis k, or false: past the end of a non-periodic
// axis, or (a periodic axis of one or two bins) a bin an earlier `d` already gave.
__device__ __forceinline__ bool next_bin(unsigned int b, int d, unsigned int nb, bool periodic,
                                         unsigned int* out) {
    const int t = (int)b + d;
    if (periodic) {
        if ((nb == 1 && d != 0) || (nb == 2 && d == 1)) return false;
        *out = (unsigned int)((t + (int)nb) % (int)nb);
        return true;
    }
    if (t < 0 || t >= (int)nb) return false;
    *out = (unsigned int)t;
    return true;
}

// Calls visit(j, edge) for every candidate j of atom i (the atoms of the bins around its own),
// 32 at a time, lane by lane: warp-uniform, every lane of the warp calls it.
template <typename Visit>
__device__ __forceinline__ void binned_candidates(const double* x, const double* g,
                                                  const double* grid, const unsigned int* bin,
                                                  const unsigned int* bscan,
                                                  const unsigned int* batoms, size_t i,
                                                  bool periodic, double cut2, Visit visit) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned int nb[3] = {(unsigned int)grid[0], (unsigned int)grid[1],
                                (unsigned int)grid[2]};
    const unsigned int own = bin[i];
    const unsigned int b[3] = {own / (nb[1] * nb[2]), (own / nb[2]) % nb[1], own % nb[2]};
    for (int d0 = -1; d0 <= 1; ++d0) {
        unsigned int c0;
        if (!next_bin(b[0], d0, nb[0], g[27] != 0.0, &c0)) continue;
        for (int d1 = -1; d1 <= 1; ++d1) {
            unsigned int c1;
            if (!next_bin(b[1], d1, nb[1], g[28] != 0.0, &c1)) continue;
            for (int d2 = -1; d2 <= 1; ++d2) {
                unsigned int c2;
                if (!next_bin(b[2], d2, nb[2], g[29] != 0.0, &c2)) continue;
                const unsigned int c = (c0 * nb[1] + c1) * nb[2] + c2;
                const size_t lo = bscan[c], hi = bscan[c + 1];
                for (size_t k0 = lo; k0 < hi; k0 += 32) {
                    const size_t k = k0 + lane;
                    const size_t j = k < hi ? batoms[k] : 0;
                    int s[3];
                    const bool e = k < hi && pair_edge(x, i, j, g, periodic, cut2, s);
                    visit(j, e);
                }
            }
        }
    }
}

// Edges per atom, binned: one warp per atom.
extern "C" __global__ void nl_count_binned_f64(const double* x, const double* g,
                                               const double* grid, const unsigned int* bin,
                                               const unsigned int* bscan,
                                               const unsigned int* batoms, unsigned int* counts,
                                               size_t n, unsigned int periodic, double cut2) {
    const unsigned lane = threadIdx.x & 31;
    const size_t warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; i < n; i += warps) {
        unsigned int c = 0;
        binned_candidates(x, g, grid, bin, bscan, batoms, i, periodic != 0, cut2,
                          [&](size_t, bool e) { c += __popc(__ballot_sync(FULL_MASK, e)); });
        if (lane == 0) counts[i] = c;
    }
}

// nl_fill, binned: each atom's edges at its slots in bin order, then put in increasing order
// of neighbour by rank (the centers' slots hold the unsorted copy meanwhile; neighbours of one
// atom are distinct).
extern "C" __global__ void nl_fill_binned_f64(const double* x, const double* g,
                                              const double* grid, const unsigned int* bin,
                                              const unsigned int* bscan,
                                              const unsigned int* batoms,
                                              const unsigned int* scan, unsigned int* out,
                                              size_t n, size_t capacity, unsigned int periodic,
                                              double cut2) {
    const bool overflow = scan[n + 1] != 0;
    const size_t total = overflow ? 0 : scan[n];
    const unsigned lane = threadIdx.x & 31;
    const size_t thread = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t threads = (size_t)gridDim.x * blockDim.x;
    if (!overflow) {
        for (size_t i = thread >> 5; i < n; i += threads >> 5) {
            const size_t first = scan[i];
            size_t slot = first;
            binned_candidates(x, g, grid, bin, bscan, batoms, i, periodic != 0, cut2,
                              [&](size_t j, bool e) {
                                  const unsigned mask = __ballot_sync(FULL_MASK, e);
                                  if (e) out[slot + __popc(mask & ((1u << lane) - 1u))] =
                                      (unsigned int)j;
                                  slot += __popc(mask);
                              });
            __syncwarp();
            const size_t len = slot - first;
            for (size_t t = lane; t < len; t += 32) {
                const unsigned int v = out[first + t];
                unsigned int r = 0;
                for (size_t u = 0; u < len; ++u) r += out[first + u] < v;
                out[capacity + first + r] = v;
            }
            __syncwarp();
            for (size_t t = lane; t < len; t += 32) out[first + t] = (unsigned int)i;
            __syncwarp();
        }
    }
    pad_slots(out, total, capacity, n, thread, threads);
}
