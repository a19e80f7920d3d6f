// How fast can a thread-block cluster run PaiNN's chain of dense layers for one small molecule?
// (CUDA-graph issue; BENCHMARKS.md, "Goals against their measured floors";
// docs/bench-log/44-cluster-chain.md.)
//
// The one kernel (kernels/whole/feature_split.cu) splits the features over 64 blocks and pays, per
// dense layer, a grid barrier and a stage of the layer's input from L2 (at least what
// barriers.cu measures, more inside the kernel), 30 times a call. Here C blocks of one
// cluster (C <= 16) split the features; each block computes its columns of a layer from the
// input in its own shared memory, with its weight slice streamed in ahead by bulk copies, and
// pushes its share of the next layer's input into every block's shared memory (distributed
// shared memory):
//   mode 0: one bulk copy per receiving block, counted against its mbarrier (no barrier at
//           all: a block waits only until its own next input has arrived);
//   mode 1: the same by st.async, 16 bytes a store;
//   mode 2: no communication (each block on its own stale buffers: products and weights);
//   mode 3: no cluster: each block writes its share to global memory, a grid barrier (a
//           counter, as kernels/whole/feature_split.cu), then every block stages the whole input
//           from L2 into its shared memory: the one kernel's way, for comparison.
// Inputs are double-buffered, so one synchronisation per layer suffices: a block can only
// write a peer's buffer two layers on after that peer has sent what it computed from it.
// The chain is the shipped model's (F = 128, three interaction blocks, aspirin's 21 atoms;
// 28 dependent dense layers, forward and adjoint), without the interactions and elementwise
// steps between them; the next layer's input is silu of this layer's output. Checked against
// the host; `compute 0` skips the products (the synchronisation and traffic only).
// Build (here, with ../shared/gpu's toolchain; carry the binary in .gpu/ and run it there):
//   nvcc -arch=sm_90a -O3 -std=c++17 cluster_chain.cu -o cluster_chain -L$CUDA_ROOT/lib -cudart shared
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/include/grid.cuh"  // the one kernel's grid barrier, last_block_out, global_ns

constexpr int THREADS = 512, MAX_LAYERS = 32, STAGES = 6;

struct Layer {
    int rows, K, M;    // input rows, input width, output width (all blocks together)
    long long w;       // offset of block 0's weight slice; block p's at w + p * slice
    int slice;         // floats in one block's slice: (M / C) x (K + 4)
};
__constant__ Layer c_layers[MAX_LAYERS];

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned peer_addr(unsigned local, unsigned peer) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(peer));
    return r;
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    asm volatile(
        "{\n .reg .pred p;\n WAIT:\n"
        " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra WAIT;\n}" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    mbar_expect(bar, bytes);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}
__device__ __forceinline__ void push_async(unsigned dst, float4 v, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                     dst),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void push_plain(unsigned dst, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w)
                 : "memory");
}
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// Layer inputs are slice-major: block p's `own` columns of all rows side by side,
// xs[p slice + r own + t] with slice = rows_pad own + 4 (the 4 shift the slices' banks), so
// that each block's share arrives as one contiguous bulk copy.
__host__ __device__ inline int slice_len(int rows, int own) { return ((rows + 3) & ~3) * own + 4; }

// Room for a block's output columns of a layer (ys) and for its share of the layer's input
// (the share of the next): rows times the wider of the two, over C blocks.
__host__ __device__ inline int own_rows_len(const Layer& L, int C) { return L.rows * (L.M > L.K ? L.M : L.K) / C; }

// ys[r][j] = sum_k x[r][k] ws[j][k] for r < rows, j < ncols (weights [j][K + 4]): 4 x 4
// outputs a thread, K split over P lanes (float4 steps), summed by shuffles.
__device__ void dense(const float* xs, const float* ws, float* ys, int rows, int K, int ncols, int own) {
    const int ld = K + 4, gr = (rows + 3) / 4, gc = ncols / 4, items = gr * gc, k4 = K / 4;
    const int sl = slice_len(rows, own), own4 = own / 4;
    int P = 1;
    while (P < 32 && items * P * 2 <= THREADS && P * 2 <= k4) P *= 2;
    for (int base = 0; base < items * P; base += THREADS) {
        const int t = base + threadIdx.x, item = t / P, part = t % P;
        const bool valid = item < items;
        const int r0 = valid ? (item / gc) * 4 : 0, j0 = valid ? (item % gc) * 4 : 0;
        float acc[4][4] = {};
        if (valid)
            for (int k = part; k < k4; k += P) {
                float4 x[4], w[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    x[q] = *reinterpret_cast<const float4*>(xs + (k / own4) * sl + (r0 + q) * own + (k % own4) * 4);
                    w[q] = reinterpret_cast<const float4*>(ws + (j0 + q) * ld)[k];
                }
#pragma unroll
                for (int a = 0; a < 4; ++a)
#pragma unroll
                    for (int b = 0; b < 4; ++b)
                        acc[a][b] += x[a].x * w[b].x + x[a].y * w[b].y + x[a].z * w[b].z + x[a].w * w[b].w;
            }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b)
                for (int o = P / 2; o > 0; o >>= 1) acc[a][b] += __shfl_xor_sync(0xffffffffu, acc[a][b], o);
        if (valid && part == 0)
            for (int a = 0; a < 4; ++a)
                if (r0 + a < rows)
                    for (int b = 0; b < 4; ++b) ys[(r0 + a) * ncols + j0 + b] = acc[a][b];
    }
}

// MODE 0: bulk copies of each block's share (one per peer, each counted against the peer's
// mbarrier); 1: st.async of 16 bytes each, counted likewise; 2: no communication at all (each
// block runs the chain on its own stale buffers: the products' and the weight stream's time).
template <int MODE>
__global__ void __launch_bounds__(THREADS, 1)
    chain(const float* __restrict__ input, const float* __restrict__ wts, float* out, int n_layers, int buf_len,
          int compute, unsigned long long* stamps, float* gbuf, unsigned* counter) {
    unsigned target = 0;  // grid barriers passed (mode 3)
    extern __shared__ __align__(128) unsigned char smem[];
    const int C = gridDim.x;
    const unsigned me = MODE == 3 ? blockIdx.x : cluster_rank();
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem);  // [2] inputs, [STAGES] weights
    float* buf = reinterpret_cast<float*>(smem + 128);
    float* ring = buf + 2 * buf_len;
    int stage_len = 0, ys_len = 0;
    for (int l = 0; l < n_layers; ++l) {
        stage_len = max(stage_len, c_layers[l].slice);
        ys_len = max(ys_len, own_rows_len(c_layers[l], C));
    }
    float* ys = ring + STAGES * stage_len;
    float* share = ys + ys_len;  // this block's share of the next input
    if (threadIdx.x == 0) {
        for (int b = 0; b < 2 + STAGES; ++b) mbar_init(bars + b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    for (int i = threadIdx.x; i < 2 * buf_len; i += THREADS) buf[i] = 0.f;
    __syncthreads();
    // The first layer's input from global memory; the next input's bytes expected.
    const Layer l0 = c_layers[0];
    {
        const int own = l0.K / C, sl = slice_len(l0.rows, own);
        for (int i = threadIdx.x; i < l0.rows * l0.K; i += THREADS) {
            const int r = i / l0.K, k = i % l0.K;
            buf[(k / own) * sl + r * own + k % own] = input[i];
        }
    }
    if (threadIdx.x == 0) {
        for (int l = 0; l < min(STAGES - 1, n_layers); ++l)
            bulk_load(ring + l * stage_len, wts + c_layers[l].w + (long long)me * c_layers[l].slice,
                      4u * c_layers[l].slice, bars + 2 + l);
        if (MODE < 2 && n_layers > 1) mbar_expect(bars + 1, 4u * c_layers[1].rows * c_layers[1].K);
    }
    if (MODE == 3) __syncthreads();
    else cluster_sync();  // barriers initialised everywhere before any peer pushes
    for (int l = 0; l < n_layers; ++l) {
        const Layer L = c_layers[l];
        const float* xs = buf + (l & 1) * buf_len;
        if (MODE < 2 && l > 0) mbar_wait(bars + (l & 1), ((l - 1) >> 1) & 1);
        if (stamps && me == 0 && threadIdx.x == 0) stamps[l] = global_ns();
        if (threadIdx.x == 0) {
            if (l + STAGES - 1 < n_layers) {
                const Layer Ln = c_layers[l + STAGES - 1];
                bulk_load(ring + ((l + STAGES - 1) % STAGES) * stage_len, wts + Ln.w + (long long)me * Ln.slice,
                          4u * Ln.slice, bars + 2 + (l + STAGES - 1) % STAGES);
            }
            // This buffer's next use: the input of layer l + 2, which the peers send after l + 1.
            if (MODE < 2 && l + 2 < n_layers)
                mbar_expect(bars + (l & 1), 4u * c_layers[l + 2].rows * c_layers[l + 2].K);
        }
        mbar_wait(bars + 2 + l % STAGES, (l / STAGES) & 1);
        const int ncols = L.M / C, own_in = L.K / C;
        if (compute)
            dense(xs, ring + (l % STAGES) * stage_len, ys, L.rows, L.K, ncols, own_in);
        else
            for (int i = threadIdx.x; i < L.rows * ncols; i += THREADS)
                ys[i] = xs[(i / ncols) * own_in + i % min(ncols, own_in)];
        __syncthreads();
        if (l + 1 == n_layers) {
            for (int i = threadIdx.x; i < L.rows * ncols; i += THREADS)
                out[(i / ncols) * L.M + me * ncols + i % ncols] = ys[i];
            break;
        }
        // This block's share of the next input: (r, t) = silu(ys[r % rows][t % ncols]),
        // t < Kn / C (column me Kn / C + t), contiguous, sent to every block's slice `me`.
        const Layer Ln = c_layers[l + 1];
        const int own = Ln.K / C, sl = slice_len(Ln.rows, own);
        const unsigned dst0 = smem_u32(buf + ((l + 1) & 1) * buf_len + me * sl), bar0 = smem_u32(bars + ((l + 1) & 1));
        if (MODE == 0) {
            if (threadIdx.x < C) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            __syncthreads();  // the last layer's copies have read `share`
            for (int i = threadIdx.x; i < Ln.rows * own; i += THREADS)
                share[i] = silu(ys[(i / own % L.rows) * ncols + i % own % ncols]);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads();
            if (threadIdx.x < C) {
                const unsigned peer = threadIdx.x;
                asm volatile(
                    "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                    "cp.async.bulk.commit_group;" ::"r"(peer_addr(dst0, peer)),
                    "r"(smem_u32(share)), "r"(4u * Ln.rows * own), "r"(peer_addr(bar0, peer))
                    : "memory");
            }
        } else if (MODE == 3) {
            float* g = gbuf + ((l + 1) & 1) * buf_len;
            for (int i = threadIdx.x; i < Ln.rows * own; i += THREADS)
                g[me * sl + i] = silu(ys[(i / own % L.rows) * ncols + i % own % ncols]);
            grid_barrier(counter, target);
            float* dst = buf + ((l + 1) & 1) * buf_len;
            const int n4 = Ln.rows * own / 4;
            for (int i = threadIdx.x; i < C * n4; i += THREADS) {
                const int p = i / n4, q = (i % n4) * 4;
                *reinterpret_cast<float4*>(dst + p * sl + q) = __ldcg(reinterpret_cast<const float4*>(g + p * sl + q));
            }
        } else if (MODE == 1) {
            const int per_peer = Ln.rows * own / 4;
            for (int i = threadIdx.x; i < C * per_peer; i += THREADS) {
                const int peer = i / per_peer, q = (i % per_peer) * 4;
                float v[4];
                for (int u = 0; u < 4; ++u) v[u] = silu(ys[((q + u) / own % L.rows) * ncols + (q + u) % own % ncols]);
                push_async(peer_addr(dst0 + 4u * q, peer), make_float4(v[0], v[1], v[2], v[3]), peer_addr(bar0, peer));
            }
        }
        __syncthreads();  // ys is rewritten by the next layer
    }
    if (MODE == 0 && threadIdx.x < C) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    if (stamps && me == 0 && threadIdx.x == 0) stamps[n_layers] = global_ns();
    if (MODE == 3) {  // the last block out resets the counter for the next launch
        __shared__ int last;
        last_block_out(counter, &last);
    } else {
        cluster_sync();  // no block leaves while a peer may still write into it
    }
}

// The same chain on the host, in double.
static std::vector<double> reference(const std::vector<Layer>& layers, int C, const std::vector<float>& input,
                                     const std::vector<std::vector<float>>& W) {
    std::vector<double> x(input.begin(), input.end()), y;
    for (size_t l = 0; l < layers.size(); ++l) {
        const Layer L = layers[l];
        y.assign((size_t)L.rows * L.M, 0.0);
        for (int r = 0; r < L.rows; ++r)
            for (int j = 0; j < L.M; ++j) {
                double s = 0;
                for (int k = 0; k < L.K; ++k) s += x[(size_t)r * L.K + k] * W[l][(size_t)k * L.M + j];
                y[(size_t)r * L.M + j] = s;
            }
        if (l + 1 == layers.size()) break;
        const Layer Ln = layers[l + 1];
        const int own = Ln.K / C, ncols = L.M / C;
        x.assign((size_t)Ln.rows * Ln.K, 0.0);
        for (int r = 0; r < Ln.rows; ++r)
            for (int t = 0; t < Ln.K; ++t) {
                const int p = t / own, tt = t % own;
                const double v = y[(size_t)(r % L.rows) * L.M + p * ncols + tt % ncols];
                x[(size_t)r * Ln.K + t] = v / (1 + std::exp(-v));
            }
    }
    return y;
}

int main() {
    const int N = 21, F = 128;
    // (rows, K, M): the shipped model's dependent dense layers in call order.
    std::vector<Layer> chain_shape;
    auto add = [&](int rows, int K, int M) { chain_shape.push_back({rows, K, M, 0, 0}); };
    add(3 * N, F, 2 * F), add(N, 2 * F, F), add(N, F, 3 * F);  // block 0: mix, context
    for (int b = 1; b < 3; ++b)
        add(N, F, F), add(N, F, 3 * F), add(3 * N, F, 2 * F), add(N, 2 * F, F), add(N, F, 3 * F);
    add(N, F, F / 2);  // readout
    add(N, F / 2, F);  // its adjoint
    for (int b = 2; b >= 0; --b) {
        add(N, 3 * F, F), add(N, F, 2 * F), add(3 * N, 2 * F, F);  // context and mix adjoints
        if (b > 0) add(N, 3 * F, F), add(N, F, F);                 // phi adjoints
    }
    const int n_layers = (int)chain_shape.size();
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<float> input((size_t)chain_shape[0].rows * chain_shape[0].K);
    for (auto& v : input) v = uni(rng);
    std::vector<std::vector<float>> W(n_layers);
    for (int l = 0; l < n_layers; ++l) {
        W[l].resize((size_t)chain_shape[l].K * chain_shape[l].M);
        const float s = 1.7f / std::sqrt((float)chain_shape[l].K);
        for (auto& v : W[l]) v = s * uni(rng);
    }
    float *d_in, *d_out;
    cudaMalloc(&d_in, input.size() * 4);
    cudaMemcpy(d_in, input.data(), input.size() * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&d_out, (size_t)64 * F * 3 * 4);
    printf("%d dependent layers, %d atoms, F = %d\n", n_layers, N, F);
    printf("| sync | blocks | products | us per call | us per layer | max rel. error |\n|---|---:|---|---:|---:|---:|\n");
    const char* names[] = {"cluster, bulk copies", "cluster, st.async", "none", "grid barrier, L2"};
    // 16 blocks only: at 8 the ring of STAGES weight slices (twice as wide) no longer fits
    // beside the input buffers (an earlier version with 3 stages measured 8 close to 16:
    // docs/bench-log/44-cluster-chain.md).
    for (int C : {16}) {
        std::vector<Layer> layers = chain_shape;
        std::vector<float> packed;
        int buf_len = 0, stage_len = 0, ys_len = 0;
        for (int l = 0; l < n_layers; ++l) {
            Layer& L = layers[l];
            const int ncols = L.M / C, ld = L.K + 4;
            L.slice = ncols * ld;
            L.w = (long long)packed.size();
            for (int p = 0; p < C; ++p)
                for (int j = 0; j < ncols; ++j)
                    for (int k = 0; k < ld; ++k)
                        packed.push_back(k < L.K ? W[l][(size_t)k * L.M + p * ncols + j] : 0.f);
            buf_len = std::max(buf_len, C * slice_len(L.rows, L.K / C));
            stage_len = std::max(stage_len, L.slice);
            ys_len = std::max(ys_len, own_rows_len(L, C));
        }
        const std::vector<double> want = reference(layers, C, input, W);
        float* d_w;
        cudaMalloc(&d_w, packed.size() * 4);
        cudaMemcpy(d_w, packed.data(), packed.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpyToSymbol(c_layers, layers.data(), layers.size() * sizeof(Layer));
        const size_t smem = 128 + 4 * (size_t)(2 * buf_len + STAGES * stage_len + 2 * ys_len);
        float* d_g;
        unsigned* d_counter;
        cudaMalloc(&d_g, 8 * (size_t)buf_len);
        cudaMalloc(&d_counter, 8);
        cudaMemset(d_counter, 0, 8);
        for (int mode : {0, 1, 2, 3})
            for (int compute : {1, 0}) {
                auto kernel = mode == 0 ? chain<0> : mode == 1 ? chain<1> : mode == 2 ? chain<2> : chain<3>;
                cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(C);
                cfg.blockDim = dim3(THREADS);
                cfg.dynamicSmemBytes = smem;
                cudaLaunchAttribute attr[1];
                if (mode == 3) {
                    attr[0].id = cudaLaunchAttributeCooperative;
                    attr[0].val.cooperative = 1;
                } else {
                    attr[0].id = cudaLaunchAttributeClusterDimension;
                    attr[0].val.clusterDim.x = C, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
                }
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                unsigned long long* no_stamps = nullptr;
                auto go = [&]() { return cudaLaunchKernelEx(&cfg, kernel, d_in, d_w, d_out, n_layers, buf_len, compute, no_stamps, d_g, d_counter); };
                cudaMemset(d_out, 0, (size_t)64 * F * 3 * 4);
                cudaError_t err = go();
                if (err == cudaSuccess) err = cudaDeviceSynchronize();
                if (err != cudaSuccess) {
                    printf("| %s | %d | %s | error: %s | | |\n", names[mode], C,
                           compute ? "on" : "off", cudaGetErrorString(err));
                    return 1;
                }
                double worst = 0;
                if (compute && mode != 2) {
                    const Layer last = layers.back();
                    std::vector<float> got((size_t)last.rows * last.M);
                    cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost);
                    double scale = 0;
                    for (double v : want) scale = std::max(scale, std::fabs(v));
                    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
                }
                for (int i = 0; i < 20; ++i) go();
                cudaEvent_t a, b;
                cudaEventCreate(&a), cudaEventCreate(&b);
                const int reps = 200;
                cudaEventRecord(a);
                for (int i = 0; i < reps; ++i) go();
                cudaEventRecord(b);
                err = cudaEventSynchronize(b);
                if (err != cudaSuccess) {
                    printf("error %s\n", cudaGetErrorString(err));
                    return 1;
                }
                float ms;
                cudaEventElapsedTime(&ms, a, b);
                const float us = ms * 1000.f / reps;
                printf("| %s | %d | %s | %.1f | %.2f | %s%.1e |\n", names[mode], C,
                       compute ? "on" : "off", us, us / n_layers, compute && mode != 2 ? "" : "(not checked) ", worst);
                // Block 0's time from each layer's input arrival to the next's, mean of 50 calls.
                unsigned long long* d_st;
                cudaMalloc(&d_st, 8 * (MAX_LAYERS + 1));
                std::vector<double> mean(n_layers, 0.0);
                std::vector<unsigned long long> st(n_layers + 1);
                for (int i = 0; i < 50; ++i) {
                    cudaLaunchKernelEx(&cfg, kernel, d_in, d_w, d_out, n_layers, buf_len, compute, d_st, d_g, d_counter);
                    cudaMemcpy(st.data(), d_st, 8 * (n_layers + 1), cudaMemcpyDeviceToHost);
                    for (int l = 0; l < n_layers; ++l) mean[l] += (st[l + 1] - st[l]) / 50e3;
                }
                cudaFree(d_st);
                std::string line = "  layer us (input KB of the next):";
                for (int l = 0; l < n_layers; ++l) {
                    char b[48];
                    const double kb = l + 1 < n_layers ? 4.0 * layers[l + 1].rows * layers[l + 1].K / 1024 : 0;
                    snprintf(b, sizeof b, " %.2f(%.0f)", mean[l], kb);
                    line += b;
                }
                if (C == 16) printf("%s\n", line.c_str());
            }
        cudaFree(d_w);
    }
    return 0;
}
