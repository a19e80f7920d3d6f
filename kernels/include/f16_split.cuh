// Products of f32 values on tensor cores in split half precision (mma.sync m16n8k16), for
// kernels/layers/dense_tc.cu and the tiled interaction (interaction_tc.cuh, interaction_frag.cuh).
// Included, not compiled on its own; mirrors src/ops/layers/dense_tc.rs's packing.
//
// A row of values (a row of a layer's inputs, or of a weight matrix) is first scaled by the
// power of two that takes its largest magnitude into [2^14, 2^15) (exact; f16 holds up to
// 65504), then each value v becomes hi + lo: hi = v rounded to f16, lo = v - hi (exact in f32,
// at most 2^-11 |v|) rounded to f16. A value is then held to ~2^-22 of itself, and below
// f16's normal range (2^-14, i.e. 2^-29 of the row's largest for hi, 2^-18 for lo) to 2^-25
// absolute, ~2^-39 of the row's largest; split TF32 holds a value to ~2^-20. A product is
// lo·hi + hi·lo + hi·hi in f32. Against split TF32 (kernels/include/tf32.cuh, three m16n8k8 per 8
// values of k): three m16n8k16 per 16, and the split done once where values are staged
// instead of at each use.
#pragma once

// The exponent field (of an f32) of the power of two that takes a row whose largest magnitude
// has the f32 bits `max_bits` (sign cleared) into [2^14, 2^15): 2^(14 - e) for a largest
// magnitude in [2^e, 2^(e + 1)), kept within [2^-126, 2^126] (a row of zeros takes 2^126, and
// its inverse stays a normal number). As split_scale_field in src/ops/dense_tc.rs.
__device__ __forceinline__ unsigned split_scale_field(unsigned max_bits) {
    return (unsigned)min(max(268 - (int)(max_bits >> 23), 1), 253);
}
__device__ __forceinline__ float split_scale(unsigned field) { return __uint_as_float(field << 23); }
__device__ __forceinline__ float split_unscale(unsigned field) {
    return __uint_as_float((254u - field) << 23);
}

// The largest magnitude's bits of four values (NaN above every number).
__device__ __forceinline__ unsigned abs_max_bits(float4 v) {
    const unsigned m = 0x7fffffffu;
    return max(max(__float_as_uint(v.x) & m, __float_as_uint(v.y) & m),
               max(__float_as_uint(v.z) & m, __float_as_uint(v.w) & m));
}

// Scaled values (x, y) as two f16 pairs, hi and lo (x in the low halves).
__device__ __forceinline__ void split_f16x2(float x, float y, unsigned& hi, unsigned& lo) {
    unsigned h, l;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(y), "f"(x));
    float hx, hy;
    asm("{.reg .f16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;}"
        : "=f"(hx), "=f"(hy)
        : "r"(h));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(l) : "f"(y - hy), "f"(x - hx));
    hi = h, lo = l;
}

// d += a b for a 16 x 16 (row-major fragment: a0a1 row g k 2t.., a2a3 row g + 8, a4a5 row g
// k 2t + 8.., a6a7 row g + 8) and b 16 x 8 (b0b1 k 2t.., b2b3 k 2t + 8.., column g) in f16.
__device__ __forceinline__ void mma_f16(float d[4], const uint4& a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// d += a b for a 16 x 8 (a0 row g k 2t.., a1 row g + 8) and b 8 x 8 (k 2t.., column g) in f16.
__device__ __forceinline__ void mma_f16_k8(float d[4], unsigned a0, unsigned a1, unsigned b0) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// Four 8 x 8 matrices of 16-bit values from shared memory (ldmatrix: lanes 8 m .. 8 m + 7 give
// the addresses of matrix m's rows, 16 bytes each): lane (g, t) gets value pair (2 t, 2 t + 1)
// of row g of each, or with TRANS values g of rows 2 t and 2 t + 1 (the matrix transposed).
template <bool TRANS = false>
__device__ __forceinline__ void load_matrices_x4(unsigned addr, unsigned r[4]) {
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}
