// Entry points of the dense layers on tensor cores (kernels/dense_tc.cuh, which says what they
// compute). Mirrors src/ops/dense_tc.rs.
#include "dense_tc.cuh"

// One instantiation per block height BM (16, 32: the host picks by row count) and widths: KC
// (and HC) the model's, or 0 for any (`dense_tc_16_0_f32`, `mlp_tc_fwd_16_128_f32`, ...).
#define DENSE_TC(BM, KC)                                                                   \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        dense_tc_##BM##_##KC##_f32(const float* x, const float* w, float* y, size_t n,     \
                                   size_t k, size_t j) {                                   \
        dense_tc::dense<BM, KC>(x, w, y, (int)n, (int)k, (int)j);                          \
    }
#define MLP_TC_FWD(BM, KC, HC)                                                             \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        mlp_tc_fwd_##BM##_##KC##_f32(const float* x, const float* w1, const float* b1,     \
                                     const float* w2, float* out, size_t n, size_t k,      \
                                     size_t h, size_t j) {                                 \
        dense_tc::mlp<BM, KC, HC, false>(x, w1, b1, nullptr, w2, out, (int)n, (int)k,      \
                                         (int)h, (int)j);                                  \
    }
// The adjoint's first layer reduces over the MLP's outputs (JC), its second over h (HC).
#define MLP_TC_ADJ(BM, JC, HC)                                                             \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        mlp_tc_adj_##BM##_##JC##_f32(const float* g, const float* pre, const float* b1,    \
                                     const float* w2, const float* w1, float* gx,          \
                                     size_t n, size_t j, size_t h, size_t k) {             \
        dense_tc::mlp<BM, JC, HC, true>(g, w2, b1, pre, w1, gx, (int)n, (int)j, (int)h,    \
                                        (int)k);                                           \
    }
#define DENSE_TC_ALL(BM)                                                                   \
    DENSE_TC(BM, 0)                                                                        \
    DENSE_TC(BM, 128)                                                                      \
    DENSE_TC(BM, 256)                                                                      \
    MLP_TC_FWD(BM, 0, 0)                                                                   \
    MLP_TC_FWD(BM, 128, 128)                                                               \
    MLP_TC_FWD(BM, 256, 128)                                                               \
    MLP_TC_ADJ(BM, 0, 0)                                                                   \
    MLP_TC_ADJ(BM, 384, 128)
DENSE_TC_ALL(16)
DENSE_TC_ALL(32)
