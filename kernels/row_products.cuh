// The dense layers of kernels/atom_split.cu: y[r, j] = Σ_k x[r, k] M[j, k] for the rows r of a
// block's atoms, M [J, K] the weight stream's next layer (a weight_stream::Stream, or anything
// with its calls and kWarps), x [rows, ldx] in shared memory. Included, not compiled on its own.
//
// rowdot: CUDA-core products, a compile-time ROWS >= rows (a warp reads each chunk row once, and
// x once per RPL rows); the faster at one or two atoms. (Both are held by each warp's instruction
// latency, not by the weight stream: BENCHMARKS.md, "up to 16 atoms per block".)
// rowdot_tf32 (f32): tensor cores in split TF32 (x = hi + lo, three products hi·hi + hi·lo +
// lo·hi, each value held to ~2^-20), any number of rows: the block's rows are the m
// dimension of mma.m16n8k8, so up to 16 atoms cost one tile where rowdot's arithmetic and
// shared-memory reads grow with every row.
#pragma once
#include "common.cuh"
#include "tf32.cuh"
#include "weight_stream.cuh"

namespace row_products {

// emit(r, j, y) for r < rows, j < J; x rows past `rows` (up to ROWS) are computed and dropped,
// so that the loops unroll. Each row of a chunk goes to a group of L lanes, each lane 4
// consecutive k of every 4 L: L = 8 up to K = 128 (a quarter warp reads 128 contiguous bytes
// of a row), 16 up to 384, else 32, so that a chunk's rows (about 8,000 / K of them) spread
// over the warps. A lane group takes RPL rows at once, each product in NPAR sums (by k step):
// a warp's products are latency-bound, and these are independent chains; the x values it reads
// serve all RPL rows. RPL = NPAR = 2 is the kernel's choice (RPL 4 measured 4-6% faster alone
// on an H100, benches/micro/row_products.cu `variants`, not taken). Synchronises after.
template <int ROWS, int K, int RPL = 2, int NPAR = 2, typename Stream, typename T, typename Emit>
__device__ __forceinline__ void rowdot(Stream& ws, int J, const T* x, int ldx, int rows, Emit emit) {
    constexpr int WARPS = Stream::kWarps;
    static_assert(K % 16 == 0, "rows of a multiple of 16 values");
    constexpr int L = K <= 128 ? 8 : K <= 384 ? 16 : 32, PER_WARP = 32 / L;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane % L;
    ws.begin_layer(J, K);
    const int per = ws.rows_per_chunk(K);
    for (int j0 = 0; j0 < J; j0 += per) {
        const T* M = ws.next();
        const int nr = min(per, J - j0);
        for (int jb = warp * PER_WARP * RPL; jb < nr; jb += WARPS * PER_WARP * RPL) {
            int jr[RPL];
            const T* row[RPL];
#pragma unroll
            for (int i = 0; i < RPL; ++i) {
                jr[i] = jb + i * PER_WARP + lane / L;
                row[i] = M + min(jr[i], nr - 1) * K;  // rows past the chunk's: read, dropped
            }
            T acc[RPL][ROWS][NPAR];
#pragma unroll
            for (int i = 0; i < RPL; ++i)
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int p = 0; p < NPAR; ++p) acc[i][r][p] = T(0);
#pragma unroll
            for (int k = 0; k < K; k += 4 * L) {
                if (K % (4 * L) != 0 && k + 4 * q >= K) break;  // K = 16 (F = 32's readout)
                const int par = (k / (4 * L)) % NPAR;
                T m[RPL][4];
#pragma unroll
                for (int i = 0; i < RPL; ++i) ld4_shared(row[i] + k + 4 * q, m[i]);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    T xv[4];
                    ld4_shared(x + r * ldx + k + 4 * q, xv);
#pragma unroll
                    for (int i = 0; i < RPL; ++i) {
                        T& a = acc[i][r][par];
                        a = fma(m[i][0], xv[0], a);
                        a = fma(m[i][1], xv[1], a);
                        a = fma(m[i][2], xv[2], a);
                        a = fma(m[i][3], xv[3], a);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < RPL; ++i)
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    T y = acc[i][r][0];
#pragma unroll
                    for (int p = 1; p < NPAR; ++p) y += acc[i][r][p];
#pragma unroll
                    for (int o = L / 2; o > 0; o >>= 1) y += __shfl_xor_sync(0xffffffffu, y, o);
                    if (q == r && r < rows && jr[i] < nr) emit(r, j0 + jr[i], y);
                }
        }
        ws.release();
    }
    __syncthreads();
}

// Values k0 + 4 t .. + 3 and k0 + 16 + 4 t .. + 3 of a row in shared memory (16-byte aligned)
// as v[0..3] and v[4..7].
__device__ __forceinline__ void ld8_halves(const float* row, int k0, int t, float v[8]) {
    const float4 p = *reinterpret_cast<const float4*>(row + k0 + 4 * t);
    const float4 q = *reinterpret_cast<const float4*>(row + k0 + 16 + 4 * t);
    v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w;
    v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
}

// rowdot by tensor cores (K a multiple of 32, ldx of 4; any rows): y^T = M x^T as
// mma.m16n8k8 with 16 rows of x as the m dimension and 8 chunk rows of M as n, so that a chunk
// of 128 rows makes 16 tiles (one per warp) and up to 16 atoms take one x tile (three for the
// mixing layer's three rows per atom). The k of each 32-value block are taken in the order that
// lets every lane read its fragment values as float4s: mma step m (of four) pairs logical k = c
// with physical k0 + 4c + m (c < 4) and k0 + 16 + 4(c - 4) + m (c >= 4), the same order for M
// and x. Rows past x's or the chunk's read their last row and are dropped. Each mma step has its
// own sums of hi·hi and of the cross terms (eight mma chains). Synchronises after.
template <int K, typename Stream, typename Emit>
__device__ __forceinline__ void rowdot_tf32(Stream& ws, int J, const float* x, int ldx, int rows, Emit emit) {
    constexpr int WARPS = Stream::kWarps;
    static_assert(K % 32 == 0, "rows of a multiple of 32 values");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = lane >> 2, t = lane & 3;
    const int mt = (rows + 15) / 16;
    if (ldx % 4 != 0) __trap();  // the kernel's calls only
    ws.begin_layer(J, K);
    const int per = ws.rows_per_chunk(K);
    for (int j0 = 0; j0 < J; j0 += per) {
        const float* M = ws.next();
        const int nr = min(per, J - j0), tiles = (nr + 7) / 8;
        for (int item = warp; item < tiles * mt; item += WARPS) {
            const int tile = item % tiles, m = item / tiles;
            const float* w_row = M + min(8 * tile + group, nr - 1) * K;
            const float* x_lo = x + min(16 * m + group, rows - 1) * ldx;
            const float* x_hi = x + min(16 * m + group + 8, rows - 1) * ldx;
            float d[4][2][4] = {};  // [mma step][hi·hi | cross terms][fragment]
#pragma unroll
            for (int k0 = 0; k0 < K; k0 += 32) {
                float wv[8], xa[8], xb[8];
                ld8_halves(w_row, k0, t, wv);
                ld8_halves(x_lo, k0, t, xa);
                ld8_halves(x_hi, k0, t, xb);
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    unsigned ah[4], al[4], bh[2], bl[2];
                    split_tf32(xa[s], ah[0], al[0]);
                    split_tf32(xb[s], ah[1], al[1]);
                    split_tf32(xa[s + 4], ah[2], al[2]);
                    split_tf32(xb[s + 4], ah[3], al[3]);
                    split_tf32(wv[s], bh[0], bl[0]);
                    split_tf32(wv[s + 4], bh[1], bl[1]);
                    mma_tf32(d[s][0], ah, bh);
                    mma_tf32(d[s][1], ah, bl);
                    mma_tf32(d[s][1], al, bh);
                }
            }
            // Fragment i: x row 16 m + group (+ 8 for i >= 2), chunk row 8 tile + 2 t + i % 2.
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = 16 * m + group + (i >> 1) * 8, j = 8 * tile + 2 * t + (i & 1);
                float cross = 0.f, main = 0.f;
#pragma unroll
                for (int s = 0; s < 4; ++s) cross += d[s][1][i], main += d[s][0][i];
                if (r < rows && j < nr) emit(r, j0 + j, main + cross);
            }
        }
        ws.release();
    }
    __syncthreads();
}

}  // namespace row_products
