// Split-TF32 products on tensor cores (mma.sync m16n8k8), shared by kernels/whole/row_products.cuh
// and kernels/interaction_tile.cu. Included, not compiled on its own.
#pragma once

// v = hi + lo: hi v cut to TF32 (its 10 high mantissa bits), lo what is left (exact in f32,
// below 2^-10 |v|; the tensor core reads its top 10 mantissa bits, so hi + lo holds v to
// ~2^-20). Two instructions (cvt.rna.tf32.f32 alone takes five on sm_90).
__device__ __forceinline__ void split_tf32(float v, unsigned& hi, unsigned& lo) {
    hi = __float_as_uint(v) & 0xffffe000u;
    lo = __float_as_uint(v - __uint_as_float(hi));
}

// d += a b for a 16 x 8 (row-major fragment) and b 8 x 8 (column-major) in TF32.
__device__ __forceinline__ void mma_tf32(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
