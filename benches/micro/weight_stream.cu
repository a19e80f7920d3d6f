// Floor of an atom-split one kernel (BENCHMARKS.md, "Goals against their measured floors";
// docs/bench-log/20-atom-split-first.md): every block streams all of PaiNN's dense
// weights (3 interaction blocks, H = 128: ~2.2 MB in f32 per pass) from L2 and applies them to
// the few atoms it owns. How fast can B blocks at once do that? A chain of 128 x 128 matrices
// y = x W applied to A atoms per block; µs per launch and GB/s per block.
// Build and run on the device: nvcc -arch=sm_90a -O3 -std=c++17 weight_stream.cu -o ws && ./ws
#include <cstdio>
#include <vector>

constexpr int THREADS = 512, F = 128, WARPS = THREADS / 32, ROWS = F / WARPS;

template <int A>
__global__ void __launch_bounds__(THREADS) chain(const float* __restrict__ w, int layers, float* out) {
    __shared__ __align__(16) float x[A][F];
    __shared__ __align__(16) float xn[A][F];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int i = threadIdx.x; i < A * F; i += THREADS) {
        x[i / F][i % F] = 0.01f * (i % 7 + blockIdx.x);
        xn[i / F][i % F] = 0.f;
    }
    __syncthreads();
    for (int l = 0; l < layers; ++l) {
        const float* wl = w + (size_t)l * F * F;
        float4 q[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            q[r] = __ldg(reinterpret_cast<const float4*>(wl + (size_t)(warp + r * WARPS) * F) + lane);
        float acc[A][4] = {};
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int k = warp + r * WARPS;
#pragma unroll
            for (int a = 0; a < A; ++a) {
                const float xk = x[a][k];
                acc[a][0] += xk * q[r].x, acc[a][1] += xk * q[r].y;
                acc[a][2] += xk * q[r].z, acc[a][3] += xk * q[r].w;
            }
        }
#pragma unroll
        for (int a = 0; a < A; ++a)
            for (int c = 0; c < 4; ++c) atomicAdd(&xn[a][lane * 4 + c], acc[a][c]);
        __syncthreads();
        for (int i = threadIdx.x; i < A * F; i += THREADS) {
            x[i / F][i % F] = tanhf(xn[i / F][i % F]);
            xn[i / F][i % F] = 0.f;
        }
        __syncthreads();
    }
    if (threadIdx.x < A) out[blockIdx.x * A + threadIdx.x] = x[threadIdx.x][0];
}

template <int A>
void run(const float* w, int layers, float* out, int blocks) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int i = 0; i < 3; ++i) chain<A><<<blocks, THREADS>>>(w, layers, out);
    const int reps = 50;
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) chain<A><<<blocks, THREADS>>>(w, layers, out);
    cudaEventRecord(b);
    cudaError_t err = cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double us = 1e3 * ms / reps, bytes = (double)layers * F * F * 4;
    printf("| %d | %d | %.1f | %.0f | %.0f | %s\n", blocks, A, us, bytes / us / 1e3,
           bytes * blocks / us / 1e3, err ? cudaGetErrorString(err) : "");
}

int main() {
    // 2 x 2.2 MB: the forward and the adjoint of a call read every weight once each.
    const int layers = 2 * 34;
    float *w, *out;
    cudaMalloc(&w, (size_t)layers * F * F * 4);
    cudaMalloc(&out, 132 * 16 * 4);
    std::vector<float> h((size_t)layers * F * F);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0.02f * ((i * 2654435761u) % 1000) / 1000.f - 0.01f;
    cudaMemcpy(w, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    printf("| blocks | atoms per block | µs per launch (4.5 MB per block) | GB/s per block | GB/s all |\n|---|---:|---:|---:|---:|\n");
    for (int blocks : {1, 8, 16, 21, 32, 64, 132}) {
        run<1>(w, layers, out, blocks);
        run<4>(w, layers, out, blocks);
        run<8>(w, layers, out, blocks);
        run<16>(w, layers, out, blocks);
    }
    return 0;
}
