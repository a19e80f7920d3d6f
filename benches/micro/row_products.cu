// The atom-split kernel's dense layers alone (kernels/row_products.cuh): one pass of PaiNN's
// weights (3 interaction blocks, F = 128: the layer shapes and order of one adjoint pass,
// ~2.2 MB in f32) streamed through the weight ring (kernels/weight_stream.cuh) and applied to
// the rows of A atoms per block, by CUDA cores (rowdot, A = 1 or 2) and by tensor cores
// (rowdot_tf32, split TF32); also the stream alone (no products) and the products alone (no
// stream: every chunk the same stage, never waited for). µs per pass, GB/s per block, and the
// largest difference between the two products where both run. Stage sizes as
// src/ops/atom_split.rs gives them for A. Build and run on the device:
//   nvcc -arch=sm_90a -O3 -std=c++17 -I../../kernels row_products.cu -o rp && ./rp [cuda|tensor]
// (with an argument: that pass alone, one atom, one block, for Nsight Compute; `variants`: the
// CUDA-core products with other rows per lane group and sums per product).
#include <cstdio>
#include <vector>

#include "row_products.cuh"

constexpr int THREADS = 512, WARPS = THREADS / 32, F = 128, X_LEN = 48 * F, Y_LEN = 48 * 2 * F;
using Stream = weight_stream::Stream<float, WARPS>;
using Layer = weight_stream::Layer<float>;

// The adjoint pass's layers of one interaction block as [J, K] (J rows of K values).
constexpr int PER_BLOCK = 5, BLOCKS = 3, N_LAYERS = PER_BLOCK * BLOCKS;
__host__ __device__ inline int rows_of(int l) { return (int[]){F, 2 * F, F, F, F}[l % PER_BLOCK]; }
__host__ __device__ inline int width_of(int l) { return (int[]){3 * F, F, 2 * F, 3 * F, F}[l % PER_BLOCK]; }

// The products without the stream: every chunk is the first stage's contents, never waited for.
struct NoStream {
    static constexpr int kWarps = WARPS;
    const float* chunk;
    int cap;
    __device__ void begin_layer(int, int) {}
    __device__ int rows_per_chunk(int k) const { return cap / k; }
    __device__ const float* next() { return chunk; }
    __device__ void release() {}
};

// mode 0: CUDA cores with ROWS (1 or 2 atoms: 1/2 rows, the 2F x F layer 3/6), 1: tensor cores,
// 2: the stream alone (each chunk waited for and released, no products); 3, 4: modes 0 and 1
// without the stream (NoStream).
// One layer of J rows of K values from stream `s` on tensor or CUDA cores, K as a compile-time
// value, as the kernel has it.
template <int ROWS1, bool TENSOR, int RPL, int NPAR, typename S, typename Emit>
__device__ void layer(S& s, int J, int K, const float* x, int rows, Emit emit) {
    if constexpr (TENSOR) {
        if (K == F) row_products::rowdot_tf32<F>(s, J, x, K, rows, emit);
        else if (K == 2 * F) row_products::rowdot_tf32<2 * F>(s, J, x, K, rows, emit);
        else row_products::rowdot_tf32<3 * F>(s, J, x, K, rows, emit);
    } else if (K == F) {
        if (J == 2 * F) row_products::rowdot<3 * ROWS1, F, RPL, NPAR>(s, J, x, K, rows, emit);
        else row_products::rowdot<ROWS1, F, RPL, NPAR>(s, J, x, K, rows, emit);
    } else if (K == 2 * F) {
        row_products::rowdot<ROWS1, 2 * F, RPL, NPAR>(s, J, x, K, rows, emit);
    } else {
        row_products::rowdot<ROWS1, 3 * F, RPL, NPAR>(s, J, x, K, rows, emit);
    }
}

template <int ROWS1, int MODE, int RPL = 2, int NPAR = 2>
__global__ void __launch_bounds__(THREADS, 1) pass(const float* w, int cap, int atoms, float* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* ring = reinterpret_cast<float*>(smem);
    float* x = ring + weight_stream::STAGES * cap;  // X_LEN: [rows, K]
    float* y = x + X_LEN;                           // Y_LEN: the outputs, folded
    Layer* layers = reinterpret_cast<Layer*>(y + Y_LEN);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(layers + N_LAYERS);
    Stream ws(ring, layers, bars, N_LAYERS, cap);
    if (threadIdx.x == 0) {
        size_t at = 0;
        for (int l = 0; l < N_LAYERS; ++l) {
            layers[l] = Layer{w + at, rows_of(l), width_of(l)};
            at += (size_t)rows_of(l) * width_of(l);
        }
        ws.init();
    }
    for (int i = threadIdx.x; i < X_LEN; i += THREADS) x[i] = 0.01f * ((i * 37 + blockIdx.x) % 101) - 0.5f;
    for (int i = threadIdx.x; i < Y_LEN; i += THREADS) y[i] = 0.f;
    __syncthreads();
    ws.start();
    for (int l = 0; l < N_LAYERS; ++l) {
        const int J = rows_of(l), K = width_of(l);
        const int rows = (J == 2 * F ? 3 : 1) * atoms;  // the mixing layer: three rows per atom
        auto emit = [&](int r, int j, float v) { y[r * J + j] = v; };
        NoStream fixed{ring, cap};
        if constexpr (MODE == 2) {
            ws.begin_layer(J, K);
            for (int j0 = 0; j0 < J; j0 += ws.rows_per_chunk(K)) {
                ws.next();
                ws.release();
            }
            __syncthreads();
        } else if constexpr (MODE >= 3) {
            layer<ROWS1, MODE == 4, RPL, NPAR>(fixed, J, K, x, rows, emit);
        } else {
            layer<ROWS1, MODE == 1, RPL, NPAR>(ws, J, K, x, rows, emit);
        }
    }
    for (int i = threadIdx.x; i < Y_LEN; i += THREADS) out[(size_t)blockIdx.x * Y_LEN + i] = y[i];
}

size_t shared_bytes(int cap) {
    return (2 * (size_t)cap + X_LEN + Y_LEN) * 4 + N_LAYERS * sizeof(Layer) + 4 * 8;
}

template <int ROWS1, int MODE, int RPL = 2, int NPAR = 2>
double run(const float* w, int cap, int atoms, int blocks, float* out, double bytes) {
    auto k = pass<ROWS1, MODE, RPL, NPAR>;
    const size_t sh = shared_bytes(cap);
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh);
    k<<<blocks, THREADS, sh>>>(w, cap, atoms, out);  // once for the results
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    const int reps = 20;
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) k<<<blocks, THREADS, sh>>>(w, cap, atoms, out + (size_t)blocks * Y_LEN);
    cudaEventRecord(b);
    cudaError_t err = cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double us = 1e3 * ms / reps;
    printf("| %s | %d | %d | %d KB | %.1f | %.0f | %s\n", MODE == 2 ? "stream alone" : MODE == 3 ? "CUDA cores, no stream" : MODE == 4 ? "tensor cores, no stream" : MODE ? "tensor cores" : "CUDA cores", blocks, atoms,
           cap * 4 / 1024, us, bytes / us / 1e3, err ? cudaGetErrorString(err) : "");
    return us;
}

// The CUDA-core products of A atoms (mode 0, or 3 without the stream), one block, 64 KB stages,
// with each split: rows per lane group and sums per product (2 2, 2 4, 4 2, 4 4, 1 4).
template <int A, int MODE>
void splits(const float* w, float* out, double bytes) {
    run<A, MODE, 2, 2>(w, 16384, A, 1, out, bytes), run<A, MODE, 2, 4>(w, 16384, A, 1, out, bytes);
    run<A, MODE, 4, 2>(w, 16384, A, 1, out, bytes), run<A, MODE, 4, 4>(w, 16384, A, 1, out, bytes);
    run<A, MODE, 1, 4>(w, 16384, A, 1, out, bytes);
}

double max_diff(const float* a, const float* b, size_t n) {
    std::vector<float> ha(n), hb(n);
    cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost);
    double d = 0, m = 0;
    for (size_t i = 0; i < n; ++i) d = fmax(d, fabs(ha[i] - hb[i])), m = fmax(m, fabs(hb[i]));
    return d / fmax(m, 1e-30);
}

int main(int argc, char** argv) {
    size_t values = 0;
    for (int l = 0; l < N_LAYERS; ++l) values += (size_t)rows_of(l) * width_of(l);
    std::vector<float> h(values);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0.02f * ((i * 2654435761u) % 1000) / 1000.f - 0.01f;
    float *w, *out_c, *out_t;
    cudaMalloc(&w, values * 4);
    cudaMemcpy(w, h.data(), values * 4, cudaMemcpyHostToDevice);
    const size_t out_len = 2 * 132 * (size_t)Y_LEN;
    cudaMalloc(&out_c, out_len * 4), cudaMalloc(&out_t, out_len * 4);
    const double bytes = values * 4.0;
    printf("%.2f MB per pass\n\n| products | blocks | atoms per block | stage | µs per pass | GB/s per block | |\n|---|---:|---:|---:|---:|---:|---|\n",
           bytes / 1e6);
    if (argc > 1 && argv[1][0] == 'v') {  // `variants`: rows per lane group and sums per product
        printf("RPL 2 NPAR 2 / 2 4 / 4 2 / 4 4 / 1 4, one then two atoms, no stream then stream\n");
        splits<1, 3>(w, out_c, bytes), splits<2, 3>(w, out_c, bytes);
        splits<1, 0>(w, out_c, bytes), splits<2, 0>(w, out_c, bytes);
        return 0;
    }
    if (argc > 1) {  // `cuda` or `tensor`: that pass alone, one atom, one block, 64 KB stages (ncu)
        if (argv[1][0] == 'c') run<1, 0>(w, 16384, 1, 1, out_c, bytes);
        else run<1, 1>(w, 16384, 1, 1, out_t, bytes);
        return 0;
    }
    for (int blocks : {1, 112, 132}) {
        for (int cap : {16384, 10768, 4368}) {
            run<1, 2>(w, cap, 1, blocks, out_c, bytes);
            if (blocks == 1) {
                run<1, 3>(w, cap, 1, blocks, out_c, bytes);
                run<2, 3>(w, cap, 2, blocks, out_c, bytes);
                run<1, 4>(w, cap, 1, blocks, out_t, bytes);
                run<1, 4>(w, cap, 11, blocks, out_t, bytes);
            }
            run<1, 0>(w, cap, 1, blocks, out_c, bytes);
            run<1, 1>(w, cap, 1, blocks, out_t, bytes);
            if (blocks == 1 && cap == 16384)
                printf("rel. difference, 1 atom: %.2e\n", max_diff(out_t, out_c, Y_LEN));
            run<2, 0>(w, cap, 2, blocks, out_c, bytes);
            run<1, 1>(w, cap, 2, blocks, out_t, bytes);
            if (blocks == 1 && cap == 16384)
                printf("rel. difference, 2 atoms: %.2e\n", max_diff(out_t, out_c, Y_LEN));
            for (int atoms : {3, 8, 11, 16}) run<1, 1>(w, cap, atoms, blocks, out_t, bytes);
        }
    }
    return 0;
}
