// Offsets of one interaction block's weights in the packed buffer that src/ops/whole/feature_split.rs
// describes (ModelShape::packed_len), shared by kernels/whole/feature_split.cu and
// kernels/atom_split.cu. Included, not compiled on its own.
#pragma once
#include <cstddef>

// Offsets of one block's weights in the packed buffer.
struct BlockWeights {
    size_t filter, w1, b1, w2, b2, mix, c1, cb1, c2, cb2, stride;
    __device__ BlockWeights(int f, int r) {
        filter = 0;
        w1 = filter + (size_t)(r + 1) * 3 * f;
        b1 = w1 + (size_t)f * f;
        w2 = b1 + f;
        b2 = w2 + (size_t)f * 3 * f;
        mix = b2 + 3 * f;
        c1 = mix + (size_t)f * 2 * f;
        cb1 = c1 + (size_t)2 * f * f;
        c2 = cb1 + f;
        cb2 = c2 + (size_t)f * 3 * f;
        stride = cb2 + 3 * f;
    }
};

