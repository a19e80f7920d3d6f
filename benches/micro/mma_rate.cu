// The raw rate of warp-level tensor-core instructions (mma.sync) on this GPU: each warp runs
// CHAINS independent accumulator chains of an mma in a loop, operands in registers; cycles per
// mma per SM sub-partition (4 per SM), for TF32 m16n8k8 (what kernels/whole/row_products.cuh's
// split-TF32 products issue) and BF16 m16n8k16, at 4 to 16 warps per block, one block per SM.
// Build and run on the device:
//   nvcc -arch=sm_90a -O3 -std=c++17 mma_rate.cu -o mr && ./mr
#include <cstdio>

constexpr int ITERS = 4096;

template <int CHAINS, bool BF16>
__global__ void rate(float* out, unsigned seed, long long* cycles) {
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = (seed * (threadIdx.x + i)) & 0x3f803f80u;
    for (int i = 0; i < 2; ++i) b[i] = (seed * (threadIdx.x + 7 * i)) & 0x3f803f80u;
    float d[CHAINS][4] = {};
    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < ITERS; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            if constexpr (BF16)
                asm volatile(
                    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                    "{%0,%1,%2,%3};"
                    : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
            else
                asm volatile(
                    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                    "{%0,%1,%2,%3};"
                    : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
        }
    }
    __syncthreads();
    const long long t1 = clock64();
    float s = 0;
    for (int c = 0; c < CHAINS; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int CHAINS, bool BF16>
void run(int warps, float* out, long long* cycles) {
    rate<CHAINS, BF16><<<132, 32 * warps>>>(out, 12345u, cycles);
    long long c = 0;
    cudaMemcpy(&c, cycles, 8, cudaMemcpyDeviceToHost);
    const double per_smsp = (double)warps * CHAINS * ITERS / 4.0;  // mma per sub-partition
    const double macs = BF16 ? 16 * 8 * 16 : 16 * 8 * 8;
    printf("| %s | %d | %d | %.1f | %.0f | %s\n", BF16 ? "bf16 m16n8k16" : "tf32 m16n8k8", warps, CHAINS,
           c / per_smsp, macs * per_smsp * 4 / c, cudaGetErrorString(cudaGetLastError()));
}

int main() {
    float* out;
    long long* cycles;
    cudaMalloc(&out, 132 * 1024 * 4);
    cudaMalloc(&cycles, 132 * 8);
    printf("| mma | warps per block | chains per warp | cycles per mma per sub-partition | MAC per cycle per SM | |\n|---|---:|---:|---:|---:|---|\n");
    for (int warps : {4, 8, 16}) {
        run<1, false>(warps, out, cycles);
        run<4, false>(warps, out, cycles);
        run<8, false>(warps, out, cycles);
        run<4, true>(warps, out, cycles);
        run<8, true>(warps, out, cycles);
    }
    return 0;
}
