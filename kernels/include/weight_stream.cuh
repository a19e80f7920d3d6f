// A block's weights streamed from global memory through a ring of shared-memory stages ahead
// of the arithmetic that uses them (kernels/whole/atom_split.cu). Included, not compiled on its own.
//
// The weights a kernel reads, and their order, do not depend on the data, so their loads can
// start long before the layer that needs them. One thread copies each chunk with a bulk copy
// (TMA, cp.async.bulk) that signals the stage's `full` barrier when it lands; each warp waits
// on that barrier, uses the chunk and arrives on the stage's `empty` barrier; the copy of the
// chunk STAGES ahead into that stage waits for all warps' arrivals. Nothing waits for a load
// except the layer that consumes it, and no chunk needs a barrier of the whole block. (A
// layer-by-layer reading with plain loads waits for each layer's loads when it starts:
// BENCHMARKS.md, "Tried, not kept"; copies by every thread cost each warp tens of
// instructions per chunk: docs/bench-log/21-atom-split-second.md.)
#pragma once
#include <cstddef>

namespace weight_stream {

// Stages of the ring (src/ops/whole/atom_split.rs STAGES, which sizes them).
constexpr int STAGES = 2;

// A matrix of `rows` rows of `k` values, contiguous in global memory (16-byte aligned, rows of
// a multiple of 16 bytes), read row-major.
template <typename T>
struct Layer {
    const T* src;
    int rows, k;
};

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void barrier_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void barrier_wait(unsigned long long* bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(shared_address(bar)),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void barrier_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// Bulk copy of `bytes` from src (global) to dst (shared), completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            shared_address(dst)),
        "l"(src), "r"(bytes), "r"(shared_address(bar))
        : "memory");
}

// The stream of `n_layers` layers (a table in shared memory) through STAGES chunks of `cap`
// values each; a chunk holds whole rows of one layer (cap / k of them). Every thread of the
// block makes the same calls in the same order; thread 0 also issues the copies.
template <typename T, int WARPS>
struct Stream {
    static constexpr int kWarps = WARPS;  // the block's warps (each releases every chunk)
    T* ring;
    const Layer<T>* layers;
    unsigned long long* full;   // STAGES: the chunk landed
    unsigned long long* empty;  // STAGES: every warp is done with it
    int n_layers, cap;
    int issue_layer = 0, issue_row = 0, issued = 0;  // the next chunk to copy (thread 0)
    int use_layer = 0, used = 0;                     // the next layer and chunk to use

    __device__ Stream(T* ring_, const Layer<T>* layers_, unsigned long long* bars, int n_layers_, int cap_)
        : ring(ring_), layers(layers_), full(bars), empty(bars + STAGES), n_layers(n_layers_), cap(cap_) {}

    __device__ int rows_per_chunk(int k) const { return cap / k; }

    // The barriers, by thread 0 before a __syncthreads.
    __device__ void init() {
        for (int s = 0; s < STAGES; ++s) barrier_init(full + s, 1), barrier_init(empty + s, WARPS);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }

    // Thread 0: copies the next chunk into its stage once every warp is done with the chunk
    // there before (nothing past the last layer).
    __device__ void issue() {
        if (issue_layer >= n_layers) return;
        const int stage = issued % STAGES, round = issued / STAGES;
        if (round > 0) barrier_wait(empty + stage, (round - 1) & 1);
        const Layer<T> l = layers[issue_layer];
        const int rows = min(rows_per_chunk(l.k), l.rows - issue_row);
        bulk_copy(ring + (size_t)stage * cap, l.src + (size_t)issue_row * l.k, rows * l.k * (unsigned)sizeof(T),
                  full + stage);
        issue_row += rows;
        if (issue_row == l.rows) ++issue_layer, issue_row = 0;
        ++issued;
    }

    // The first STAGES chunks in flight (thread 0, after the table and barriers are visible).
    __device__ void start() {
        if (threadIdx.x == 0)
            for (int c = 0; c < STAGES; ++c) issue();
    }

    // Starts using the next layer, which must be `rows` x `k` (a mismatch is a bug in the
    // kernel's table: trap rather than read the wrong weights).
    __device__ void begin_layer(int rows, int k) {
        if (use_layer >= n_layers || layers[use_layer].rows != rows || layers[use_layer].k != k) __trap();
        ++use_layer;
    }

    // The next chunk, once it has landed (the calling warp waits for nothing else). Thread 0
    // first refills the stage of the chunk before, which every warp has released by then
    // or soon after.
    __device__ const T* next() {
        if (threadIdx.x == 0 && used > 0) issue();
        const int stage = used % STAGES;
        barrier_wait(full + stage, (used / STAGES) & 1);
        ++used;
        return ring + (size_t)stage * cap;
    }

    // The calling warp is done with the chunk `next` returned last (every warp must call it).
    __device__ void release() {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) barrier_arrive(empty + (used - 1) % STAGES);
    }
};

}  // namespace weight_stream
