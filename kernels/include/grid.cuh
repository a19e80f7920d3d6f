// Barriers among the blocks of a cooperative launch (kernels/whole/feature_split.cu,
// kernels/whole/atom_split.cu), and block 0's phase stamps. Included, not compiled on its own. `counter` is a device buffer of
// two u32 (arrivals, finished blocks), zero at launch and left zero by the launch's last block
// (last_block_out), so that no launch needs a memset first.
#pragma once

// Barrier among the launch's blocks: the arrival counter only grows during a launch;
// `target` counts the barriers passed times the grid size.
__device__ __forceinline__ void grid_barrier(unsigned int* counter, unsigned int& target) {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) {
        // Release: this block's writes (ordered before by __syncthreads) before the arrival;
        // acquire: the other blocks' writes before anything after the wait.
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        unsigned int seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

// Whether this block is the last of the launch to get here (every other block has finished
// its writes, which it may then read); that block sets the counters back to zero. Every block
// must call it once, past its last barrier; `flag` is one int of shared memory.
__device__ __forceinline__ bool last_block_out(unsigned int* counter, int* flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *flag = atomicAdd(counter + 1, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!*flag) return false;
    __threadfence();
    if (threadIdx.x == 0) {
        atomicExch(counter, 0u);
        atomicExch(counter + 1, 0u);
    }
    return true;
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// With stamps (`at` not null), block 0's first thread records the GPU's global timer at each
// mark: where a one-launch call spends its time (src/ops/whole/stamps.rs; read through the
// crate's `profiling` feature). The marks stay compiled in: built without them the feature
// split ran slower (BENCHMARKS.md, "Tried, not kept").
struct Stamps {
    unsigned long long* at;
    int count;
    __device__ void mark() {
        if (at && blockIdx.x == 0 && threadIdx.x == 0) at[count] = global_ns();
        ++count;
    }
};
