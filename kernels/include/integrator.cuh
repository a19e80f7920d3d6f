// One atom coordinate of the MD steps (kernels/integrator.cu, and the MD step around the force
// call in kernels/whole/feature_split.cu): every product and sum rounded on its own (no fused
// multiply-add), in the order of the candle ops they replace, so CPU and CUDA agree bit for bit.
#pragma once

// The kick v + f hk.
__device__ __forceinline__ double md_kick_one(double v, double f, double hk) {
    return __dadd_rn(v, __dmul_rn(f, hk));
}

// The step up to the force call for one coordinate: v1 = v + f hk; NVE (langevin false):
// x' = x + v1 dt, v' = v1; Langevin: x1 = x + v1 dt/2, v' = c1 v1 + xi scale, x' = x1 + v' dt/2.
__device__ __forceinline__ void md_advance_one(double x, double v, double f, double hk,
                                               double xi, double scale, bool langevin,
                                               double dt, double c1, double& x_out,
                                               double& v_out) {
    const double v1 = md_kick_one(v, f, hk);
    if (!langevin) {
        x_out = __dadd_rn(x, __dmul_rn(v1, dt));
        v_out = v1;
        return;
    }
    const double half = 0.5 * dt;
    const double x1 = __dadd_rn(x, __dmul_rn(v1, half));
    v_out = __dadd_rn(__dmul_rn(v1, c1), __dmul_rn(xi, scale));
    x_out = __dadd_rn(x1, __dmul_rn(v_out, half));
}

// |x - r|² of one atom (3 coordinates each).
__device__ __forceinline__ double md_displacement2_one(const double* x, const double* r) {
    double d2 = 0.0;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        const double d = x[c] - r[c];
        d2 = __dadd_rn(d2, __dmul_rn(d, d));
    }
    return d2;
}

// The larger of two squared displacements, NaN winning (a max may otherwise skip it).
__device__ __forceinline__ double md_max_nan(double a, double b) {
    return b > a || b != b ? b : a;
}
