// kernels/dense_tc.cu's tensor-core layers alone, and how far ahead their weight stream should
// read (each warp keeps the weights of DENSE_TC_RING / NT k-steps in flight in registers, NT:
// its 8-column tiles). The model's layers (F = 128) at one row block, 64 aspirins (1,344 atoms)
// and 10,000 atoms, each timed back to back (µs per launch, 200 launches after 20), on random
// inputs.
// Build and run on the device, once per ring depth:
//   nvcc -arch=sm_90a -O3 -std=c++17 -I ../../kernels -DDENSE_TC_RING=8 dense_layers.cu -o r8 && ./r8
// Each line ends with a checksum of the output (the same for copies that compute the same).
#include "dense_tc.cu"  // kernels/ by -I (or a copy of another version, to compare)

#include <cstdio>
#include <vector>

#define CHECK(x)                                                                       \
    do {                                                                               \
        cudaError_t e = (x);                                                           \
        if (e != cudaSuccess) {                                                        \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));           \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

static float* random_buffer(size_t n, unsigned seed) {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = ((seed >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.2f;
    }
    float* d = nullptr;
    cudaMalloc(&d, n * sizeof(float));
    cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    return d;
}

// Shared bytes of a launch (src/ops/dense_tc.rs, Dims::config).
static size_t smem(int bm, int k, int h) { return 4ul * bm * (2 * k + 4 + (h ? 2 * h + 4 : 0)); }

static float* g_out = nullptr;

// Σ|out| over the first `len` values.
static double checksum(size_t len) {
    std::vector<float> h(len);
    cudaMemcpy(h.data(), g_out, len * sizeof(float), cudaMemcpyDeviceToHost);
    double s = 0;
    for (float v : h) s += v < 0 ? -v : v;
    return s;
}

template <class Launch>
static float time_us(Launch launch) {
    for (int i = 0; i < 20; ++i) launch();
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    for (int i = 0; i < 200; ++i) launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms * 1000.f / 200.f;
}

int main() {
    const size_t big = 30000ul * 512;
    float *x = random_buffer(big, 1), *g = random_buffer(big, 2), *pre = random_buffer(big, 3);
    float *w1 = random_buffer(384 * 384, 4), *w2 = random_buffer(384 * 384, 5);
    float *b1 = random_buffer(384, 6), *out = random_buffer(2 * big, 7);
    g_out = out;
    printf("ring %d\n", DENSE_TC_RING);
    for (int n : {16, 1344, 10000}) {
        const int bm = n >= 4096 ? 32 : 16;
        // The context and φ MLP adjoints (dL/d(output) 384 wide → hidden 128 → 256 or 128).
        for (int k : {256, 128}) {
            const size_t sm = smem(16, 384, 128);
            cudaFuncSetAttribute(mlp_tc_adj_16_384_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
            const float t = time_us([&] {
                mlp_tc_adj_16_384_f32<<<(n + 15) / 16, 256, sm>>>(g, pre, b1, w2, w1, out, n, 384, 128, k);
            });
            printf("n %5d  mlp_tc_adj_16_384  k %3d  %7.2f us  %.6e\n", n, k, t, checksum((size_t)n * k));
        }
        if (n == 16) continue;  // one row block: the adjoint's chain alone
        // The context and φ MLP forwards (256 or 128 → 128 → 384), with the second layer split
        // over a block per output chunk (as below 132 row blocks) or not.
        for (int k : {256, 128}) {
            for (unsigned split : {1u, 3u}) {
                if (bm == 32 && split == 3) continue;
                auto f = bm == 32 ? (k == 256 ? mlp_tc_fwd_32_256_f32 : mlp_tc_fwd_32_128_f32)
                                  : (k == 256 ? mlp_tc_fwd_16_256_f32 : mlp_tc_fwd_16_128_f32);
                const size_t sm = smem(bm, k, 128);
                cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
                const float t = time_us([&] {
                    f<<<dim3((n + bm - 1) / bm, split), 256, sm>>>(x, w1, b1, w2, out, n, k, 128, 384);
                });
                printf("n %5d  mlp_tc_fwd_%d_%d  split %u  %7.2f us  %.6e\n", n, bm, k, split, t,
                       checksum((size_t)n * 512));
            }
        }
        // The mixing layer [3n, 128] → [3n, 256] and its adjoint with the add.
        const int rows = 3 * n, bmr = rows >= 4096 ? 32 : 16;
        {
            auto f = bmr == 32 ? dense_tc_32_128_f32 : dense_tc_16_128_f32;
            const float t = time_us([&] {
                f<<<(rows + bmr - 1) / bmr, 256, smem(bmr, 128, 0)>>>(x, w1, out, rows, 128, 256);
            });
            printf("n %5d  dense_tc_%d_128  %7.2f us  %.6e\n", n, bmr, t, checksum((size_t)rows * 256));
        }
        {
            auto f = bmr == 32 ? dense_tc_add_32_256_f32 : dense_tc_add_16_256_f32;
            cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem(bmr, 256, 0));
            const float t = time_us([&] {
                f<<<(rows + bmr - 1) / bmr, 256, smem(bmr, 256, 0)>>>(g, w2, x, out, rows, 256, 128);
            });
            printf("n %5d  dense_tc_add_%d_256  %7.2f us  %.6e\n", n, bmr, t, checksum((size_t)rows * 128));
        }
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    return 0;
}
