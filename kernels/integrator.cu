// MD integrator steps as single kernels (f64): the kick v + f dt/2m, the step up to the force
// call (kick, then drift, or Langevin A O A), and the Verlet displacement check, instead of
// 2-9 and 6 candle ops each. Every product and sum is rounded on its own (no fused
// multiply-add), in the order of the candle ops they replace, so CPU and CUDA agree bit for bit.
// Mirrors src/ops/integrator.rs.
#include <cstddef>

#include "integrator.cuh"

#define FOR_ATOMS(i, n)                                                                \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);            \
         i += (size_t)gridDim.x * blockDim.x)

// out = v + f hk[atom]: [N, 3].
extern "C" __global__ void md_kick_f64(const double* v, const double* f, const double* hk,
                                       double* out, size_t n) {
    FOR_ATOMS(t, 3 * n) { out[t] = md_kick_one(v[t], f[t], hk[t / 3]); }
}

// out = [x' (3N) | v' (3N)]: v1 = v + f hk; NVE (langevin = 0): x' = x + v1 dt, v' = v1;
// Langevin: x1 = x + v1 dt/2, v' = c1 v1 + xi scale[atom], x' = x1 + v' dt/2.
extern "C" __global__ void md_advance_f64(const double* x, const double* v, const double* f,
                                          const double* hk, const double* xi,
                                          const double* scale, double* out, size_t n,
                                          size_t langevin, double dt, double c1) {
    FOR_ATOMS(t, 3 * n) {
        const size_t a = t / 3;
        md_advance_one(x[t], v[t], f[t], hk[a], langevin ? xi[t] : 0.0,
                       langevin ? scale[a] : 0.0, langevin != 0, dt, c1, out[t], out[3 * n + t]);
    }
}

// out = [sum, max] over atoms of |x - reference|² (one block; the sum carries a NaN that a
// max might skip).
extern "C" __global__ void md_displacement2_f64(const double* x, const double* r, double* out,
                                                size_t n) {
    __shared__ double sums[32], maxes[32];
    double s = 0.0, m = 0.0;
    for (size_t a = threadIdx.x; a < n; a += blockDim.x) {
        const double d2 = md_displacement2_one(x + 3 * a, r + 3 * a);
        s = __dadd_rn(s, d2);
        m = md_max_nan(m, d2);
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_down_sync(0xffffffffu, s, o);
        m = md_max_nan(m, __shfl_down_sync(0xffffffffu, m, o));
    }
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sums[warp] = s;
        maxes[warp] = m;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double ts = 0.0, tm = 0.0;
        for (unsigned w = 0; w < (blockDim.x >> 5); ++w) {
            ts += sums[w];
            tm = md_max_nan(tm, maxes[w]);
        }
        out[0] = ts;
        out[1] = tm;
    }
}

// The step after the force call, into one packed state [x (3N) | v (3N) | f (3N) | e (S)]:
// the positions and forces as given, the closing kick v + f hk, the energies (a replayed MD
// step writes its next state with this one launch instead of a kick and four copies).
extern "C" __global__ void md_finish_f64(const double* x, const double* v, const double* f,
                                         const double* hk, const double* e, double* out,
                                         size_t n, size_t s) {
    const size_t m = 3 * n;
    FOR_ATOMS(t, 3 * m + s) {
        if (t < m) {
            out[t] = x[t];
        } else if (t < 2 * m) {
            const size_t u = t - m;
            out[t] = md_kick_one(v[u], f[u], hk[u / 3]);
        } else if (t < 3 * m) {
            out[t] = f[t - 2 * m];
        } else {
            out[t] = e[t - 3 * m];
        }
    }
}
