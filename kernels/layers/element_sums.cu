// The first interaction block by sums per sending element. Its context φ_j + b depends only on
// atom j's element z and its vector features are zero, so its messages are
//   ds_i   = Σ_z ctx_z^s ⊙ (S_iz · W^s),   S_iz   = Σ_{j ∈ N(i), Z_j = z} b_ij        (R + 1)
//   dv_i,a = Σ_z ctx_z^d ⊙ (U_iza · W^d),  U_iza  = Σ_{j ∈ N(i), Z_j = z} b_ij u_ij,a
// with b the edge's basis row (rbf f_c, f_c) and u its unit vector (the basis's last three
// columns): sums of basis rows per receiving atom and element (the forward kernel), then one
// product with the weights times each element's context (the caller). The adjoint maps the
// product's gradient G = dL/d[S | U] back to each edge's basis row,
//   dL/db_ij = G^S_{i z} + Σ_a u_a G^U_{i z a},   dL/du_ij,a = b_ij · G^U_{i z a}   (z = Z_j),
// and on to the positions in the same kernel. The forward's warp walks chunks of 32
// consecutive edges, lane r holding basis column r; it keeps the run's sums (one receiving
// atom) per element in shared memory, [z][part][lane], and adds them into the output when the
// receiver changes (lists sorted by receiver: once per atom; any order is correct). Mirrors
// src/ops/element_sums.rs.
#include "common.cuh"
#include "edge_basis.cuh"

#define ES_NO_ATOM 0xffffffffu

// Edge m (< 32) of the warp's chunk: its receiver and its sender's element, loaded by lane m.
struct ChunkEdges {
    unsigned i = ES_NO_ATOM, z = 0;
    __device__ void load(const unsigned* ci, const unsigned* nj, const unsigned* species,
                         size_t e, bool in) {
        if (in) i = ci[e], z = species[nj[e]];
    }
    __device__ unsigned receiver(unsigned m) const { return __shfl_sync(0xffffffffu, i, m); }
    __device__ unsigned element(unsigned m) const { return __shfl_sync(0xffffffffu, z, m); }
};

// out [4N, nz (R + 2)] (zeroed): row p N + i holds atom i's sums of part p (S, U_x, U_y,
// U_z), column z (R + 1) + r basis column r of the senders of element z; the plain row's last nz
// columns are atom i's own element, one-hot (so that the product adds its embedding too).
// Blocks of whole warps, shared memory nz 4 32 values a warp. A warp loads its chunk's 32 basis
// rows at once (lane r: column r of each), then takes the edges in turn.
template <typename T>
__device__ void sums_fwd(const T* basis, const unsigned* ci, const unsigned* nj,
                         const unsigned* species, T* out, size_t n_edges, size_t n, size_t nz,
                         size_t n_rbf) {
    extern __shared__ __align__(16) unsigned char element_sums_smem[];
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const unsigned nb = n_rbf + 1, bw = n_rbf + 4;
    const size_t k = nz * (nb + 1);
    T* acc = reinterpret_cast<T*>(element_sums_smem) + warp * nz * 4 * 32 + lane;
    for (unsigned q = 0; q < nz * 4; ++q) acc[q * 32] = T(0);
    wait_for_previous_kernel();
    FOR_EACH(i, n) out[i * k + nz * nb + species[i]] = T(1);
    unsigned cur = ES_NO_ATOM, touched = 0;  // the run's atom; its elements seen (bit z)
    // Adds the run's sums into its atom's rows and zeroes them.
    auto flush = [&]() {
        for (unsigned z = 0; touched; ++z, touched >>= 1) {
            if (!(touched & 1)) continue;
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                T& a = acc[(z * 4 + p) * 32];
                if (lane < nb) atomicAdd(out + (p * n + cur) * k + z * nb + lane, a);
                a = T(0);
            }
        }
    };
    const size_t stride = (size_t)gridDim.x * warps * 32;
    for (size_t e0 = (blockIdx.x * (size_t)warps + warp) * 32; e0 < n_edges; e0 += stride) {
        const unsigned cnt = min((size_t)32, n_edges - e0);
        ChunkEdges edges;
        edges.load(ci, nj, species, e0 + lane, lane < cnt);
        T rows[32];
#pragma unroll
        for (unsigned m = 0; m < 32; ++m)
            rows[m] = m < cnt && lane < bw ? basis[(e0 + m) * bw + lane] : T(0);
#pragma unroll
        for (unsigned m = 0; m < 32; ++m) {
            if (m >= cnt) break;
            const unsigned i = edges.receiver(m), z = edges.element(m);
            const T b = rows[m];
            if (i != cur) {
                flush();
                cur = i;
            }
            touched |= 1u << z;
            // (Lanes from nb add values never flushed.)
            T* a = acc + z * 4 * 32;
            a[0] += b;
#pragma unroll
            for (int p = 0; p < 3; ++p) a[(p + 1) * 32] += b * __shfl_sync(0xffffffffu, b, nb + p);
        }
    }
    flush();
}

// dL/d(positions) (gpos zeroed) through the sums and, where given, the later blocks' dL/d(basis)
// rows g [E, R + 4]: gs [N, nz (R + 1)] = dL/dS, gv [3N, nz (R + 1)] = dL/dU (row a N + i). Each
// edge's basis row is formed again (kernels/include/edge_basis.cuh), its gradient row completed with
// the sums' terms in registers and taken to the two atoms, so that no row is written. With
// wpos, each centre's virial Σ_e r_e ⊗ dL/dr_e too (add_edge_grads), for the stress.
template <typename T>
__device__ void sums_position_adj(const T* pos, const T* off, const T* g, const T* gs,
                                  const T* gv, const unsigned* ci, const unsigned* nj,
                                  const unsigned* species, T* gpos, T* wpos, size_t n_edges,
                                  size_t n, size_t nz, size_t n_rbf, double cutoff) {
    const unsigned nb = n_rbf + 1;
    const size_t k = nz * nb;
    wait_for_previous_kernel();
    auto grad = [&](size_t e, T gr[3], T r[3]) {
        const T d = edge_vector(pos, off, ci, nj, e, r);
        const Radial<T> radial(d, n_rbf, T(cutoff));
        const size_t i = ci[e], col = species[nj[e]] * (size_t)nb;
        const T* later = g ? g + e * (n_rbf + 4) : nullptr;
        const T* plain = gs + i * k + col;
        T u[3], gu[3];
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            u[a] = r[a] / d;
            gu[a] = later ? later[nb + a] : T(0);
        }
        T gd = T(0);
        for (unsigned c = 0; c < nb; ++c) {
            T value = radial.fc, slope = radial.dfc;  // column R: f_c
            if (c < n_rbf) radial.column(d, c, value, slope);
            T ge = plain[c] + (later ? later[c] : T(0));
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                const T x = gv[(a * n + i) * k + col + c];
                ge += u[a] * x;
                gu[a] += value * x;
            }
            gd += ge * slope;
        }
        grad_r(gd, gu, r, d, gr);
    };
    add_edge_grads(ci, nj, gpos, n_edges, grad, wpos);
}

#define ELEMENT_SUMS(T, S)                                                                     \
    extern "C" __global__ void element_sums_fwd_##S(                                          \
        const T* basis, const unsigned int* ci, const unsigned int* nj,                       \
        const unsigned int* species, T* out, size_t n_edges, size_t n, size_t nz,             \
        size_t n_rbf) {                                                                        \
        sums_fwd(basis, ci, nj, species, out, n_edges, n, nz, n_rbf);                          \
    }                                                                                          \
    extern "C" __global__ void element_sums_position_adj_##S(                                 \
        const T* pos, const T* off, const T* gs, const T* gv, const unsigned int* ci,         \
        const unsigned int* nj, const unsigned int* species, T* gpos, size_t n_edges,         \
        size_t n, size_t nz, size_t n_rbf, double cutoff) {                                    \
        sums_position_adj(pos, off, (const T*)nullptr, gs, gv, ci, nj, species, gpos,         \
                          (T*)nullptr, n_edges, n, nz, n_rbf, cutoff);                         \
    }                                                                                          \
    extern "C" __global__ void element_sums_position_adj_acc_##S(                             \
        const T* pos, const T* off, const T* g, const T* gs, const T* gv,                     \
        const unsigned int* ci, const unsigned int* nj, const unsigned int* species, T* gpos, \
        size_t n_edges, size_t n, size_t nz, size_t n_rbf, double cutoff) {                    \
        sums_position_adj(pos, off, g, gs, gv, ci, nj, species, gpos, (T*)nullptr, n_edges,   \
                          n, nz, n_rbf, cutoff);                                               \
    }                                                                                          \
    /* out [4N, 3]: the atoms' gradients, then their virials (3 rows each). */                 \
    extern "C" __global__ void element_sums_virial_adj_##S(                                     \
        const T* pos, const T* off, const T* gs, const T* gv, const unsigned int* ci,         \
        const unsigned int* nj, const unsigned int* species, T* out, size_t n_edges,          \
        size_t n, size_t nz, size_t n_rbf, double cutoff) {                                    \
        sums_position_adj(pos, off, (const T*)nullptr, gs, gv, ci, nj, species, out,          \
                          out + 3 * n, n_edges, n, nz, n_rbf, cutoff);                         \
    }                                                                                          \
    extern "C" __global__ void element_sums_virial_adj_acc_##S(                                 \
        const T* pos, const T* off, const T* g, const T* gs, const T* gv,                     \
        const unsigned int* ci, const unsigned int* nj, const unsigned int* species, T* out,  \
        size_t n_edges, size_t n, size_t nz, size_t n_rbf, double cutoff) {                    \
        sums_position_adj(pos, off, g, gs, gv, ci, nj, species, out, out + 3 * n, n_edges, n, \
                          nz, n_rbf, cutoff);                                                  \
    }
ELEMENT_SUMS(float, f32)
ELEMENT_SUMS(double, f64)
