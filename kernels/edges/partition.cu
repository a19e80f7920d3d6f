// A stable partition of an edge list into classes: class(e) = how many of the ascending
// bounds t[0..7) are at most min(center, neighbour); each class keeps the list's order, and the
// classes follow one another. With atoms ordered by depth (a domain's shell call) every class
// prefix is a list that holds each of its edges' reverse. Three launches: counts per tile of
// PT_TILE edges and class, one block's exclusive scan of them (class-major), then each tile
// places its edges. Mirrors src/ops/edges/partition.rs (its CPU twin is there).
#include "common.cuh"

#define PT_TILE 1024
#define PT_CLASSES 8
#define PT_FULL 0xffffffffu

namespace {
__device__ __forceinline__ unsigned edge_class(unsigned c, unsigned n, const unsigned* t) {
    const unsigned m = c < n ? c : n;
    unsigned k = 0;
#pragma unroll
    for (int j = 0; j < PT_CLASSES - 1; ++j) k += m >= t[j] ? 1u : 0u;
    return k;
}
}  // namespace

// counts[k * tiles + tile] = edges of class k in the tile. One block of PT_TILE threads per
// tile.
extern "C" __global__ void __launch_bounds__(PT_TILE)
    partition_count_f64(const unsigned* ci, const unsigned* nj, unsigned* counts,
                        size_t n_edges, size_t tiles, unsigned t0, unsigned t1,
                        unsigned t2, unsigned t3, unsigned t4, unsigned t5, unsigned t6) {
    __shared__ unsigned sc[PT_CLASSES];
    const unsigned t[PT_CLASSES - 1] = {t0, t1, t2, t3, t4, t5, t6};
    if (threadIdx.x < PT_CLASSES) sc[threadIdx.x] = 0;
    __syncthreads();
    const size_t tile = blockIdx.x, e = tile * PT_TILE + threadIdx.x;
    if (e < n_edges) atomicAdd(&sc[edge_class(ci[e], nj[e], t)], 1u);
    __syncthreads();
    if (threadIdx.x < PT_CLASSES) counts[threadIdx.x * tiles + tile] = sc[threadIdx.x];
}

// In place, the exclusive scan of the PT_CLASSES x tiles counts (one block of PT_TILE threads,
// each a contiguous run of them); then totals[k], the edges of class k.
extern "C" __global__ void __launch_bounds__(PT_TILE)
    partition_scan_f64(unsigned* counts, unsigned* totals, size_t n_edges, size_t tiles) {
    __shared__ unsigned long long sums[PT_TILE];
    const size_t len = PT_CLASSES * tiles;
    const size_t per = (len + PT_TILE - 1) / PT_TILE, a = threadIdx.x * per;
    const size_t b = a + per < len ? a + per : len;
    unsigned long long own = 0;
    for (size_t i = a; i < b; ++i) own += counts[i];
    sums[threadIdx.x] = own;
    __syncthreads();
    // Inclusive scan of the block's sums (Hillis-Steele).
    for (unsigned o = 1; o < PT_TILE; o <<= 1) {
        const unsigned long long add = threadIdx.x >= o ? sums[threadIdx.x - o] : 0;
        __syncthreads();
        sums[threadIdx.x] += add;
        __syncthreads();
    }
    unsigned long long run = sums[threadIdx.x] - own;
    for (size_t i = a; i < b; ++i) {
        const unsigned v = counts[i];
        counts[i] = (unsigned)run;
        run += v;
    }
    __syncthreads();
    if (threadIdx.x < PT_CLASSES) {
        const size_t k = threadIdx.x;
        const size_t end = k + 1 < PT_CLASSES ? counts[(k + 1) * tiles] : n_edges;
        totals[k] = tiles ? (unsigned)(end - counts[k * tiles]) : 0u;
    }
}

// Places each edge of a tile at its class's start for the tile (starts: the scanned counts)
// plus its rank among the tile's earlier edges of that class: out = [centers | neighbours |
// list positions], n_edges each.
extern "C" __global__ void __launch_bounds__(PT_TILE)
    partition_fill_f64(const unsigned* ci, const unsigned* nj, const unsigned* starts,
                       unsigned* out, size_t n_edges, size_t tiles, unsigned t0, unsigned t1,
                       unsigned t2, unsigned t3, unsigned t4, unsigned t5, unsigned t6) {
    __shared__ unsigned before[PT_TILE / 32][PT_CLASSES];  // earlier warps' edges per class
    const unsigned t[PT_CLASSES - 1] = {t0, t1, t2, t3, t4, t5, t6};
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t tile = blockIdx.x, e = tile * PT_TILE + threadIdx.x;
    const bool valid = e < n_edges;
    const unsigned c = valid ? ci[e] : 0, n = valid ? nj[e] : 0;
    const unsigned k = valid ? edge_class(c, n, t) : PT_CLASSES;
    unsigned rank = 0;
#pragma unroll
    for (unsigned q = 0; q < PT_CLASSES; ++q) {
        const unsigned mask = __ballot_sync(PT_FULL, k == q);
        if (k == q) rank = __popc(mask & ((1u << lane) - 1u));
        if (lane == 0) before[warp][q] = __popc(mask);
    }
    __syncthreads();
    if (threadIdx.x < PT_CLASSES) {  // exclusive sums over the warps, class threadIdx.x
        unsigned run = 0;
        for (unsigned w = 0; w < PT_TILE / 32; ++w) {
            const unsigned v = before[w][threadIdx.x];
            before[w][threadIdx.x] = run;
            run += v;
        }
    }
    __syncthreads();
    if (!valid) return;
    const size_t at = starts[k * tiles + tile] + before[warp][k] + rank;
    out[at] = c;
    out[n_edges + at] = n;
    out[2 * n_edges + at] = (unsigned)e;
}
