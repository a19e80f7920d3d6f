// Per-multiprocessor L2 streaming rate (the atom split's floor: BENCHMARKS.md, "Goals against
// their measured floors"; docs/bench-log/20-atom-split-first.md): B blocks each read
// the same 4.5 MB of weights (f32, resident in L2; zeros, then pseudo-random values, in case
// the memory system treats zeros specially) once per launch, (a) by plain 16-byte loads,
// 8 in flight per thread, (b) by bulk copies (TMA, cp.async.bulk) into a ring of shared-memory
// stages that the block then reads. µs per launch and GB/s per block.
// Build and run on the device: nvcc -arch=sm_90a -O3 -std=c++17 stream.cu -o stream && ./stream
#include <cstdio>

constexpr int THREADS = 512;

__global__ void __launch_bounds__(THREADS) plain(const float4* __restrict__ w, size_t n4, float* out) {
    float s = 0;
    constexpr int U = 8;
    for (size_t base = threadIdx.x; base < n4; base += U * THREADS) {
        float4 q[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const size_t i = base + u * THREADS;
            q[u] = i < n4 ? __ldcg(w + i) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) s += q[u].x + q[u].y + q[u].z + q[u].w;
    }
    if (s == 12345.f) out[blockIdx.x] = s;
}

constexpr int STAGE = 32768, STAGES = 4;

__device__ __forceinline__ void mbar_init(unsigned long long* b, int count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_copy(unsigned long long* b, void* dst, const void* src, int bytes) {
    const unsigned bar = (unsigned)__cvta_generic_to_shared(b), to = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(to), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned phase) {
    const unsigned bar = (unsigned)__cvta_generic_to_shared(b);
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(phase) : "memory");
}

__global__ void __launch_bounds__(THREADS) bulk(const float* __restrict__ w, size_t n, float* out) {
    extern __shared__ __align__(128) unsigned char raw[];
    float* ring = reinterpret_cast<float*>(raw);
    __shared__ unsigned long long bars[STAGES];
    const int per = STAGE / 4, chunks = (int)(n / per);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&bars[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int c = 0; c < STAGES && c < chunks; ++c) mbar_expect_copy(&bars[c], ring + c * per, w + (size_t)c * per, STAGE);
    float s = 0;
    for (int c = 0; c < chunks; ++c) {
        const int st = c % STAGES;
        mbar_wait(&bars[st], (c / STAGES) & 1);
        const float4* q = reinterpret_cast<const float4*>(ring + st * per);
        for (int i = threadIdx.x; i < per / 4; i += THREADS) s += q[i].x + q[i].y + q[i].z + q[i].w;
        __syncthreads();
        if (threadIdx.x == 0 && c + STAGES < chunks)
            mbar_expect_copy(&bars[st], ring + st * per, w + (size_t)(c + STAGES) * per, STAGE);
    }
    if (s == 12345.f) out[blockIdx.x] = s;
}

// Pseudo-random floats in [-1, 1) (an integer hash of the index).
__global__ void fill_random(float* w, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        w[i] = (h & 0xffffff) / float(1 << 23) - 1.0f;
    }
}

int main() {
    const size_t n = 34 * 2 * 128 * 128;  // 4.46 MB of f32
    float *w, *out;
    cudaMalloc(&w, n * 4);
    cudaMemset(w, 0, n * 4);
    cudaMalloc(&out, 1024 * 4);
    cudaFuncSetAttribute(bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGE * STAGES);
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    printf("| data | kind | blocks | µs per launch | GB/s per block | GB/s all |\n|---|---|---:|---:|---:|---:|\n");
    for (int data = 0; data < 2; ++data)
    for (int kind = 0; kind < 2; ++kind)
        for (int blocks : {1, 8, 21, 32, 64, 132}) {
            if (data == 1 && kind == 0 && blocks == 1) fill_random<<<264, 256>>>(w, n);
            auto go = [&] {
                if (kind == 0) plain<<<blocks, THREADS>>>(reinterpret_cast<const float4*>(w), n / 4, out);
                else bulk<<<blocks, THREADS, STAGE * STAGES>>>(w, n, out);
            };
            for (int i = 0; i < 3; ++i) go();
            const int reps = 50;
            cudaEventRecord(a);
            for (int i = 0; i < reps; ++i) go();
            cudaEventRecord(b);
            cudaError_t err = cudaEventSynchronize(b);
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            const double us = 1e3 * ms / reps;
            printf("| %s | %s | %d | %.1f | %.0f | %.0f | %s\n", data ? "random" : "zeros",
                   kind ? "bulk (TMA)" : "16-byte loads", blocks, us,
                   n * 4 / us / 1e3, n * 4.0 * blocks / us / 1e3, err ? cudaGetErrorString(err) : "");
        }
    return 0;
}
