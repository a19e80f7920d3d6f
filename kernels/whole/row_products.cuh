// The dense layers of kernels/whole/atom_split.cu: y[r, j] = Σ_k x[r, k] M[j, k] for the rows r of a
// block's atoms, M [J, K] the weight stream's next layer (a weight_stream::Stream, or anything
// with its calls and kWarps), x [rows, ldx] in shared memory. Included, not compiled on its own.
//
// rowdot: CUDA-core products, a compile-time ROWS >= rows (a warp reads each chunk row once, and
// x once per RPL rows). It is held by each warp's instruction latency, not by the weight
// stream.
#pragma once
#include "common.cuh"
#include "weight_stream.cuh"

namespace row_products {

// emit(r, j, y) for r < rows, j < J; x rows past `rows` (up to ROWS) are computed and dropped,
// so that the loops unroll. Each row of a chunk goes to a group of L lanes, each lane 4
// consecutive k of every 4 L: L = 8 up to K = 128 (a quarter warp reads 128 contiguous bytes
// of a row), 16 up to 384, else 32, so that a chunk's rows (about 8,000 / K of them) spread
// over the warps. A lane group takes RPL rows at once, each product in NPAR sums (by k step):
// a warp's products are latency-bound, and these are independent chains; the x values it reads
// serve all RPL rows. RPL = NPAR = 2 is the kernel's choice. Synchronises after.
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

}  // namespace row_products
