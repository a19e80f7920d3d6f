// The entries of the dense layers on tensor cores (kernels/include/dense_tc.cuh holds the kernels).
// Mirrors src/ops/dense_tc.rs.
#include "dense_tc.cuh"

// Float inputs first, then the packed weights (u32) and indices, then the output, then sizes
// (src/ops/launch/mod.rs's launch order).
#define READOUT_TC(BM, KC)                                                                  \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                      \
        readout_tc_##BM##_##KC##_f32(const float* x, const float* b1, const float* w,       \
                                     const float* constant, const unsigned int* w1,         \
                                     const unsigned int* w1t, const unsigned int* species,  \
                                     float* out, size_t n, size_t k, size_t h) {            \
        dense_tc::readout<BM, KC>(x, b1, w, constant, w1, w1t, species, out, (int)n, (int)k, \
                                  (int)h);                                                  \
    }
// One instantiation per block height BM (16, the host's) and widths: KC
// (and HC) the model's, or 0 for any (`dense_tc_16_0_f32`, `mlp_tc_fwd_16_128_f32`, ...).
#define DENSE_TC(BM, KC)                                                                   \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        dense_tc_##BM##_##KC##_f32(const float* x, const unsigned int* w, float* y,        \
                                   size_t n, size_t k, size_t j) {                         \
        dense_tc::dense<BM, KC>(x, nullptr, w, y, (int)n, (int)k, (int)j);                 \
    }
// The same plus `add` [n, j] (the mixing layer's adjoint adds the vector rows' gradient).
#define DENSE_TC_ADD(BM, KC)                                                               \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        dense_tc_add_##BM##_##KC##_f32(const float* x, const float* add,                   \
                                       const unsigned int* w, float* y, size_t n,          \
                                       size_t k, size_t j) {                               \
        dense_tc::dense<BM, KC>(x, add, w, y, (int)n, (int)k, (int)j);                     \
    }
#define MLP_TC_FWD(BM, KC, HC)                                                             \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        mlp_tc_fwd_##BM##_##KC##_f32(const float* x, const float* b1,                      \
                                     const unsigned int* w1, const unsigned int* w2,       \
                                     float* out, size_t n, size_t k, size_t h, size_t j) { \
        dense_tc::mlp<BM, KC, HC, false>(x, b1, nullptr, w1, w2, out, (int)n, (int)k,      \
                                         (int)h, (int)j);                                  \
    }
// The adjoint's first layer reduces over the MLP's outputs (JC), its second over h (HC).
#define MLP_TC_ADJ(BM, JC, HC)                                                             \
    extern "C" __global__ void __launch_bounds__(dense_tc::THREADS, 2)                     \
        mlp_tc_adj_##BM##_##JC##_f32(const float* g, const float* pre, const float* b1,    \
                                     const unsigned int* w2, const unsigned int* w1,       \
                                     float* gx, size_t n, size_t j, size_t h, size_t k) {  \
        dense_tc::mlp<BM, JC, HC, true>(g, b1, pre, w2, w1, gx, (int)n, (int)j, (int)h,    \
                                        (int)k);                                           \
    }
#define DENSE_TC_ALL(BM)                                                                   \
    DENSE_TC(BM, 0)                                                                        \
    DENSE_TC(BM, 128)                                                                      \
    DENSE_TC(BM, 256)                                                                      \
    DENSE_TC_ADD(BM, 0)                                                                    \
    DENSE_TC_ADD(BM, 256)                                                                  \
    READOUT_TC(BM, 0)                                                                      \
    READOUT_TC(BM, 128)                                                                    \
    MLP_TC_FWD(BM, 0, 0)                                                                   \
    MLP_TC_FWD(BM, 128, 128)                                                               \
    MLP_TC_FWD(BM, 256, 128)                                                               \
    MLP_TC_ADJ(BM, 0, 0)                                                                   \
    MLP_TC_ADJ(BM, 384, 128)
DENSE_TC_ALL(16)
