// The optimiser step over flat parameter buffers in one launch: gradient clipping (the norm
// read on the device from the gradient's sum of squares, so nothing is read back between the
// backward pass and the update), AdamW, and the EMA of the weights. Each element's arithmetic
// follows the candle ops it replaces, rounded the same way in the CPU twin.
// Mirrors src/ops/optimizer.rs.
#include <cstddef>

#define FOR_ELEMENTS(i, n)                                                             \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);            \
         i += (size_t)gridDim.x * blockDim.x)

// out = [m' | v' | theta' | ema'] (4 n). sq[0] = |g|²; step = [lr, c1, c2, decay], the values
// that change from step to step, read from the device so that a captured step replays with
// new ones; clip = 0: no clipping; decay = 0: the EMA is the weights. A gradient that is not
// finite (sq[0] is not) leaves all four unchanged: a captured step's loss is read only after
// its update, and a failed step must not spoil the weights.
#define ADAMW_EMA(T, SUFFIX)                                                                 \
    extern "C" __global__ void adamw_ema_##SUFFIX(                                          \
        const T* g, const T* m, const T* v, const T* theta, const T* ema, const T* sq,      \
        const T* step, T* out, size_t n, double b1, double b2, double eps, double wd,        \
        double clip) {                                                                      \
        const double lr = (double)step[0], c1 = (double)step[1], c2 = (double)step[2];      \
        const double decay = (double)step[3];                                               \
        const double norm = sqrt((double)sq[0]);                                            \
        const T scale = (T)((clip > 0.0 && norm > clip) ? clip / norm : 1.0);               \
        if (!isfinite(norm)) {                                                              \
            FOR_ELEMENTS(t, n) {                                                            \
                out[t] = m[t];                                                              \
                out[n + t] = v[t];                                                          \
                out[2 * n + t] = theta[t];                                                  \
                out[3 * n + t] = ema[t];                                                    \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        FOR_ELEMENTS(t, n) {                                                                \
            const T gs = g[t] * scale;                                                      \
            const T m1 = m[t] * (T)b1 + gs * (T)(1.0 - b1);                                 \
            const T v1 = v[t] * (T)b2 + (gs * gs) * (T)(1.0 - b2);                          \
            const T update = (m1 / (T)c1) / (sqrt(v1 / (T)c2) + (T)eps);                    \
            const T th = theta[t] * (T)(1.0 - lr * wd) - update * (T)lr;                    \
            out[t] = m1;                                                                    \
            out[n + t] = v1;                                                                \
            out[2 * n + t] = th;                                                            \
            out[3 * n + t] = decay == 0.0 ? th : ema[t] * (T)decay + th * (T)(1.0 - decay); \
        }                                                                                   \
    }

ADAMW_EMA(float, f32)
ADAMW_EMA(double, f64)
