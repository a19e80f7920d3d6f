// What one phase of the one-kernel feature split costs at its floor (BENCHMARKS.md, "Goals
// against their measured floors"; docs/bench-log/18-one-kernel-floor.md):
// a barrier among the launch's blocks, then the next layer's input (N x F, written by the
// other blocks before the barrier) staged in shared memory. Grid barrier (a counter in global
// memory, as kernels/whole/feature_split.cu) against the hardware cluster barrier (sm_90), and layer
// inputs read from L2 against reads of the other blocks' shared memory (DSMEM).
// Build and run on the device: nvcc -arch=sm_90a -O3 -std=c++17 barriers.cu -o barriers && ./barriers
#include <cooperative_groups.h>
#include <cstdio>
#include <vector>
namespace cg = cooperative_groups;

constexpr int THREADS = 512, N = 21, F = 128, PHASES = 64;

__device__ void grid_barrier(unsigned* counter, unsigned& target) {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

__device__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// mode 0: barrier only; 1: barrier + stage N x F from L2 (each block wrote its S columns of
// the previous phase's buffer); 2 (clusters): barrier + stage from the peers' shared memory.
template <bool CLUSTER>
__global__ void __launch_bounds__(THREADS) phases(unsigned* counter, float* buf, int mode, float* sink) {
    __shared__ float xs[N * (F + 1)];
    __shared__ float own[N * F];  // this block's columns (mode 2 uses N x S of it)
    const int G = gridDim.x, S = F / G, c = blockIdx.x;
    unsigned target = 0;
    float acc = 0;
    for (int p = 0; p < PHASES; ++p) {
        float* cur = buf + (p & 1) * N * F;
        // this block's columns of the next input
        for (int idx = threadIdx.x; idx < N * S; idx += THREADS) {
            const int a = idx / S, t = idx % S;
            const float v = acc + a + t + p;
            if (mode == 1) cur[a * F + c * S + t] = v;
            own[idx] = v;
        }
        if constexpr (CLUSTER) { __syncthreads(); cluster_barrier(); }
        else grid_barrier(counter, target);
        if (mode == 1) {
            for (int idx = threadIdx.x; idx < N * F; idx += THREADS)
                xs[(idx / F) * (F + 1) + idx % F] = __ldcg(cur + idx);
        } else if (mode == 2) {
            if constexpr (CLUSTER) {
                cg::cluster_group cl = cg::this_cluster();
                for (int idx = threadIdx.x; idx < N * F; idx += THREADS) {
                    const int a = idx / F, f = idx % F, peer = f / S;
                    const float* src = cl.map_shared_rank(own, peer);
                    xs[a * (F + 1) + f] = src[a * S + f % S];
                }
            }
        }
        __syncthreads();
        acc += xs[(threadIdx.x % N) * (F + 1) + threadIdx.x % F];
        if constexpr (CLUSTER) cluster_barrier();  // peers done reading own before it changes
        else __syncthreads();
    }
    if (acc == 12345.f) sink[threadIdx.x] = acc;
    if constexpr (!CLUSTER) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) { atomicExch(counter, 0u); atomicExch(counter + 1, 0u); }
        }
    }
}

template <bool CLUSTER>
float time_us(int blocks, int mode, unsigned* counter, float* buf, float* sink) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(THREADS);
    cudaLaunchAttribute attr[1];
    if (CLUSTER) {
        cudaFuncSetAttribute(phases<true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = blocks, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    } else {
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    auto go = [&]() { return cudaLaunchKernelEx(&cfg, phases<CLUSTER>, counter, buf, mode, sink); };
    for (int i = 0; i < 5; ++i) go();
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    const int reps = 50;
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) go();
    cudaEventRecord(b);
    cudaError_t err = cudaEventSynchronize(b);
    if (err != cudaSuccess || cudaGetLastError() != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return -1; }
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    return ms * 1000.f / reps;
}

int main() {
    unsigned* counter;
    float *buf, *sink;
    cudaMalloc(&counter, 8), cudaMemset(counter, 0, 8);
    cudaMalloc(&buf, 2 * N * F * 4), cudaMalloc(&sink, 4096);
    printf("| barrier | blocks | phase | launch us (%d phases) | us per phase |\n|---|---:|---|---:|---:|\n", PHASES);
    const char* what[] = {"barrier only", "+ stage N x F from L2", "+ stage N x F from peers' shared memory"};
    for (int blocks : {8, 16}) for (int mode : {0, 2}) {
        const float t = time_us<true>(blocks, mode, counter, buf, sink);
        printf("| cluster | %d | %s | %.1f | %.2f |\n", blocks, what[mode], t, t / PHASES);
    }
    for (int blocks : {16, 64}) for (int mode : {0, 1}) {
        const float t = time_us<false>(blocks, mode, counter, buf, sink);
        printf("| grid | %d | %s | %.1f | %.2f |\n", blocks, what[mode], t, t / PHASES);
    }
    return 0;
}
