// The tensor-core interaction's launch shape and staging helpers (kernels/layers/interaction_tc.cuh
// holds the tile that uses them). Included through it; not compiled on its own.
#pragma once

#define TC_THREADS 256
#define TC_MAX_KSTEPS 4  // basis rows R + 1 <= 32 (MAX_BASIS)
#define TC_NO_SLOT 0xffffffffu
// The basis functions of the shipped models: with the feature count (TILE_F) the kernels'
// basis layout is known at compile time for them (strides and k steps fold into the
// instructions).
#define TC_RBF 20

// *p from shared memory as its own 32-bit load.
__device__ __forceinline__ float load_shared_volatile(const float* p) {
    float v;
    asm volatile("ld.volatile.shared.f32 %0, [%1];"
                 : "=f"(v)
                 : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))));
    return v;
}

// Row stride of the staged basis (one row per edge) and of the staged weights (one row per
// filter column): the basis width and the mma's k rows at least, rounded to an odd multiple of
// 8 so that a half warp's 64-bit fragment loads hit every bank once; beyond 24, 32 with the
// rows' 8-value blocks swizzled instead (TcTile<.., SWZ = true>::at). As in
// src/ops/interaction_tile.rs.
__device__ __forceinline__ unsigned tc_stride(unsigned nb, unsigned bw) {
    const unsigned rows = max(bw, (nb + 7) / 8 * 8);
    const unsigned s = (rows + 7) / 8 * 8;
    return (s / 8) % 2 || s == 32 ? s : s + 8;
}

// A block's shape for chunks of CW features (TILE_F or 64). As in src/ops/interaction_tile.rs.
template <int CW>
struct TcShape {
    static_assert(CW == 128 || CW == 64, "chunks of 128 or 64 features");
    static constexpr unsigned QUARTERS = CW / 32;                  // warps across the features
    static constexpr unsigned E = TC_THREADS / 32 / QUARTERS * 16;  // edges of a tile
    // Row stride of the staged filters: a warp's 64-bit stores of mma outputs hit every bank
    // once per half warp.
    static constexpr unsigned SF = 3 * CW + 8;
    // E x 40 / TC_THREADS: more than the largest stride, 32, needs (40 was the largest before
    // stride 32 replaced it; the unused slots are planned out).
    static constexpr unsigned STAGE_LOADS = E * 40 / TC_THREADS;
};

// The k (0..15) of value i (0..3) of lane t's pairs in an m16n8k16 fragment: (2t, 2t + 1) in
// its first register of a row (A) or column (B), (2t + 8, 2t + 9) in its second.
__device__ __forceinline__ unsigned f16_fragment_k(unsigned t, unsigned i) {
    return 2 * t + i % 2 + i / 2 * 8;
}

// The next tile's basis values and indices of one thread, loaded ahead.
template <unsigned LOADS>
struct TcStage {
    float b[LOADS];
    unsigned i, j;
};

// The feature of staged weight column x of a chunk for the fragment kernels
// (kernels/layers/interaction_frag.cuh): within each 32, n-tile q's column 2 t + b is value
// k = 2 q + b of lane (g, t), feature 4 t + k for k < 4 and 12 + 4 t + k above, so that a
// lane's 8 features are two runs of 4 and a quarter warp's 16-byte gathers of a row fill
// whole 32-byte sectors (runs of 8 per lane had filled half of twice as many, through L1).
__device__ __forceinline__ unsigned frag_feature(unsigned x) {
    const unsigned k = 2 * (x % 32 / 8) + x % 2;
    return x / 32 * 32 + 4 * (x % 8 / 2) + k + (k >= 4 ? 12 : 0);
}

