// The whole PaiNN energy + forces of a small system in one launch, its atoms split over the
// blocks (src/ops/atom_split.rs).
//
// kernels/small_system.cu splits the features over its blocks, so every dense layer needs the
// whole layer input of every atom: a barrier per layer, 30 per call, ~1.9 µs each at least
// (BENCHMARKS.md). Here block c owns atoms [c A, c A + A) and computes every feature of them:
// a dense layer needs nothing from the other blocks, and each block streams every weight from
// L2 once per pass (~4.5 MB per call in f32, ~120-140 GB/s per multiprocessor on an H100).
// Barriers remain only where PaiNN mixes atoms: before interactions 1.. of the forward (the
// senders' φ and v; the first interaction's φ is a per-element table and its v zero), and after
// the adjoint of interactions 1.. (the senders' gradients, added by the receivers' blocks). The
// forward reads the weights output-major ([out, in], a second packed buffer) and the adjoint
// input-major ([in, out], the small-system layout), so both are row-times-vector products
// whose rows a warp reads in order.
//
// Output: forces [N, 3] (zeroed by each atom's block, added by atomics), energies [N], then the
// scratch: φ and v of every atom before interactions 1.. (what the receivers read), the senders'
// gradients of those interactions (zeroed, added by atomics), each atom's tape (what the
// adjoint reads back) and each edge's gradient w.r.t. its basis and unit vector (written by its
// receiver's block only).
#include "common.cuh"
#include "edge_basis.cuh"
#include "grid.cuh"
#include "packed_weights.cuh"

namespace {

constexpr int THREADS = 512, WARPS = THREADS / 32;
// Atoms a block owns at most (src/ops/atom_split.rs MAX_ATOMS): a dense layer has up to three
// rows per atom (the vector features' components).
constexpr int MAX_ATOMS = 2, MAX_ROWS = 3 * MAX_ATOMS;
// Edges scanned at once for the block's own (receiver in its atoms), and own edges whose
// geometry is formed at once.
constexpr int WINDOW = 2048, CHUNK = 128;

struct Dims {
    int n, e, f, r, blocks, n_el, per_block;
};

// Four consecutive values at p: one or two 16-byte loads where p allows (the packed buffers'
// matrices start at multiples of 4 elements unless the element count is odd).
template <typename T>
__device__ __forceinline__ void ld4_global(const T* p, T v[4]) {
    if ((reinterpret_cast<size_t>(p) & 15) == 0) {
        if constexpr (sizeof(T) == 4) {
            const float4 q = __ldg(reinterpret_cast<const float4*>(p));
            v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        } else {
            const double2 a = __ldg(reinterpret_cast<const double2*>(p));
            const double2 b = __ldg(reinterpret_cast<const double2*>(p) + 1);
            v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
        }
    } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = __ldg(p + q);
    }
}

template <typename T>
__device__ __forceinline__ T warp_allsum(T x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// emit(r, j, y) with y = Σ_k x[r ldx + k] M[j K + k], for r < rows, j < J: M [J, K] row-major
// in global memory, read once; x in shared memory (ldx and K multiples of 4). A warp takes U
// consecutive rows of M at a time (U loads in flight per lane: the stream's rate is set by
// the loads in flight), each lane 4 consecutive k of every 128. Synchronises after.
template <typename T, typename Emit>
__device__ __forceinline__ void rowdot(const T* __restrict__ M, int J, int K, const T* x, int ldx,
                                       int rows, Emit emit) {
    constexpr int U = 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j0 = warp * U; j0 < J; j0 += WARPS * U) {
        T acc[U][MAX_ROWS];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < MAX_ROWS; ++r) acc[u][r] = T(0);
        for (int k = lane * 4; k < K; k += 128) {
            T m[U][4];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (j0 + u < J)
                    ld4_global(M + (size_t)(j0 + u) * K + k, m[u]);
                else
                    m[u][0] = m[u][1] = m[u][2] = m[u][3] = T(0);
            }
#pragma unroll
            for (int r = 0; r < MAX_ROWS; ++r) {
                if (r < rows) {
                    T xv[4];
                    ld4_shared(x + r * ldx + k, xv);
#pragma unroll
                    for (int u = 0; u < U; ++u)
                        acc[u][r] += m[u][0] * xv[0] + m[u][1] * xv[1] + m[u][2] * xv[2] + m[u][3] * xv[3];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < MAX_ROWS; ++r)
                if (r < rows) {
                    const T y = warp_allsum(acc[u][r]);
                    if (lane == (u * MAX_ROWS + r) % 32 && j0 + u < J) emit(r, j0 + u, y);
                }
    }
    __syncthreads();
}

// ids[0, count) = the edges of [e0, e0 + WINDOW) whose receiver is in [lo, hi), in edge order;
// returns count (every thread). `counts` holds WARPS ints.
__device__ __forceinline__ int own_edges(const unsigned int* ci, int e0, int E, int lo, int hi,
                                         unsigned int* ids, int* counts) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, len = min(WINDOW, E - e0);
    int total = 0;
    for (int base = 0; base < len; base += THREADS) {
        const int el = base + threadIdx.x;
        const int i = el < len ? (int)__ldg(ci + e0 + el) : -1;
        const bool mine = i >= lo && i < hi;
        const unsigned int m = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) counts[warp] = __popc(m);
        __syncthreads();
        int before = total, round = 0;
        for (int w = 0; w < WARPS; ++w) {
            before += w < warp ? counts[w] : 0;
            round += counts[w];
        }
        if (mine) ids[before + __popc(m & ((1u << lane) - 1))] = e0 + el;
        total += round;
        __syncthreads();
    }
    return total;
}

}  // namespace

template <typename T>
__device__ __forceinline__ void atom_split(const T* pos, const T* off, const T* __restrict__ w_in,
                                           const T* __restrict__ w_out,
                                           const unsigned int* __restrict__ species,
                                           const unsigned int* __restrict__ ci,
                                           const unsigned int* __restrict__ nj,
                                           const unsigned int* bar, T* out, const Dims d,
                                           double cutoff) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int N = d.n, E = d.e, F = d.f, R = d.r, NB = d.blocks, F3 = 3 * F, H2 = F / 2;
    const int tid = threadIdx.x, a0 = blockIdx.x * d.per_block;
    const int A = max(0, min(d.per_block, N - a0)), AF = A * F;
    // Feature groups for the edge loops: group g of F threads takes every G-th own edge.
    const int G = THREADS / F, g = tid / F, t = tid % F;
    const int RB = R + 5, RG = R + 4;  // per-edge geometry: basis R + 1, unit vector, distance
    const T rc = T(cutoff);

    // Shared memory (every part a multiple of 4 elements).
    T* s = reinterpret_cast<T*>(smem_raw);  // A x F: scalar features
    T* v = s + AF;                          // A x 3 x F: vector features
    T* gs = v + 3 * AF;                     // dE/ds
    T* gv = gs + AF;                        // dE/dv
    T* xin = gv + 3 * AF;                   // 3 A F: dense-layer inputs
    T* x2 = xin + 3 * AF;                   // 3 A F
    T* yo = x2 + 3 * AF;                    // 6 A F: [U | V] and its gradient
    T* acc = yo + 6 * AF;                   // G x A x 4 x F: the interaction's partial sums
    T* filt = acc + G * 4 * AF;             // (R + 1) x 3F: the block's filter
    T* geo = filt + (R + 1) * F3;           // CHUNK x (R + 5)
    T* gedge = geo + CHUNK * RB;            // CHUNK x (R + 4): per-edge gradient sums
    unsigned int* ids = reinterpret_cast<unsigned int*>(gedge + CHUNK * RG);  // WINDOW
    int* counts = reinterpret_cast<int*>(ids + WINDOW);                        // WARPS

    // Output and scratch.
    T* forces = out;
    T* energies = forces + 3 * N;
    const size_t nf3 = (size_t)N * F3, tape_w = 12 * (size_t)F;
    T* phi_g = energies + N;                        // (NB - 1) x N x 3F
    T* vin_g = phi_g + (NB - 1) * nf3;              // (NB - 1) x N x 3F
    T* gphi_g = vin_g + (NB - 1) * nf3;             // (NB - 1) x N x 3F, added into
    T* gvj_g = gphi_g + (NB - 1) * nf3;             // (NB - 1) x N x 3F, added into
    T* tape_g = gvj_g + (NB - 1) * nf3;             // NB x N x 12F: h1 | [U | V] | |V| | cpre | act
    T* edge_g = tape_g + NB * (size_t)N * tape_w;   // E x (R + 4)
    unsigned int* counter = const_cast<unsigned int*>(bar);
    unsigned int target = 0;

    // Packed weights (src/ops/small_system.rs SmallSystemModel::packed_len): embedding,
    // atom constants, readout hidden layer and bias, readout output, the blocks, φ table.
    const size_t ro_at = (size_t)d.n_el * (F + 1), blocks_at = ro_at + (size_t)F * H2 + 2 * H2;
    const T* emb = w_in;
    const T* atom_const = w_in + (size_t)d.n_el * F;
    const T* ro_b = w_in + ro_at + (size_t)F * H2;
    const T* ro_out = ro_b + H2;
    const BlockWeights bl(F, R);
    const T* phi_table = w_in + blocks_at + NB * bl.stride;
    auto tape = [&](int b, int a) { return tape_g + ((size_t)b * N + a0 + a) * tape_w; };

    // Initial state; what other blocks add into, zeroed before the first barrier.
    for (int idx = tid; idx < AF; idx += THREADS)
        s[idx] = __ldg(emb + (size_t)species[a0 + idx / F] * F + idx % F);
    for (int idx = tid; idx < 3 * AF; idx += THREADS) v[idx] = T(0);
    for (int idx = tid; idx < 3 * A; idx += THREADS) forces[3 * a0 + idx] = T(0);
    for (int b = 0; b + 1 < NB; ++b)
        for (int idx = tid; idx < A * F3; idx += THREADS) {
            gphi_g[(b * (size_t)N + a0) * F3 + idx] = T(0);
            gvj_g[(b * (size_t)N + a0) * F3 + idx] = T(0);
        }

    // The geometry of own edges ids[c0, c0 + count) into geo.
    auto form_geometry = [&](int c0, int count) {
        for (int el = tid; el < count; el += THREADS) {
            const int e = ids[c0 + el];
            T r[3];
            const T dist = edge_vector(pos, off, ci, nj, e, r);
            const Radial<T> radial(dist, R, rc);
            T* q = geo + el * RB;
            for (int k = 0; k < R; ++k) {
                T slope;
                radial.column(dist, k, q[k], slope);
            }
            q[R] = radial.fc;
            for (int k = 0; k < 3; ++k) q[R + 1 + k] = r[k] / dist;
            q[R + 4] = dist;
        }
        __syncthreads();
    };
    // Calls body(c0, count) for every chunk of own edges, their geometry formed.
    auto for_own_edges = [&](auto body) {
        for (int e0 = 0; e0 < E; e0 += WINDOW) {
            const int count = own_edges(ci, e0, E, a0, a0 + A, ids, counts);
            for (int c0 = 0; c0 < count; c0 += CHUNK) {
                const int len = min(CHUNK, count - c0);
                form_geometry(c0, len);
                body(c0, len);
                __syncthreads();
            }
        }
    };
    // Filter feature t of edge slot el (3 values: s, vector-direction and vector-vector parts).
    auto filter_of = [&](int el, T w[3]) {
        const T* q = geo + el * RB;
        w[0] = w[1] = w[2] = T(0);
        for (int k = 0; k <= R; ++k) {
            const T* row = filt + k * F3 + t;
            w[0] += q[k] * row[0];
            w[1] += q[k] * row[F];
            w[2] += q[k] * row[2 * F];
        }
    };
    // Sender j's φ (3 values at feature t) and v (3 components) before interaction b.
    auto sender = [&](int b, int j, T p[3], T vj[3]) {
        if (b == 0) {
            const T* row = phi_table + (size_t)species[j] * F3 + t;
            for (int q = 0; q < 3; ++q) p[q] = __ldg(row + q * F), vj[q] = T(0);
        } else {
            const T* row = phi_g + ((b - 1) * (size_t)N + j) * F3 + t;
            const T* vr = vin_g + ((b - 1) * (size_t)N + j) * F3 + t;
            for (int q = 0; q < 3; ++q) p[q] = __ldcg(row + q * F), vj[q] = __ldcg(vr + q * F);
        }
    };
    auto load_filter = [&](const T* w) {
        for (int idx = tid; idx < (R + 1) * F3; idx += THREADS) filt[idx] = __ldg(w + bl.filter + idx);
    };

    for (int b = 0; b < NB; ++b) {
        const T* wi = w_in + blocks_at + b * bl.stride;
        const T* wo = w_out + blocks_at + b * bl.stride;
        load_filter(wi);
        if (b > 0) {
            // φ = silu(s W1 + b1) W2 + b2 of own atoms, and v, for the receivers.
            rowdot(wo + bl.w1, F, F, s, F, A, [&](int a, int j, T y) {
                y += __ldg(wi + bl.b1 + j);
                tape(b, a)[j] = y;
                xin[a * F + j] = silu_of(y);
            });
            rowdot(wo + bl.w2, F3, F, xin, F, A, [&](int a, int j, T y) {
                phi_g[((b - 1) * (size_t)N + a0 + a) * F3 + j] = y + __ldg(wi + bl.b2 + j);
            });
            for (int idx = tid; idx < A * F3; idx += THREADS)
                vin_g[((b - 1) * (size_t)N + a0) * F3 + idx] = v[idx];
            grid_barrier(counter, target);
        }

        // Interaction: s_i += Σ_j φs_j Ws, v_i += Σ_j φd_j Wd u_ij + φv_j Wv v_j.
        for (int idx = tid; idx < G * 4 * AF; idx += THREADS) acc[idx] = T(0);
        __syncthreads();
        for_own_edges([&](int c0, int count) {
            if (g >= G) return;
            int cur = -1;
            T sum[4] = {T(0), T(0), T(0), T(0)};
            auto flush = [&]() {
                if (cur < 0) return;
                for (int q = 0; q < 4; ++q) acc[((g * A + cur) * 4 + q) * F + t] += sum[q];
            };
            for (int el = g; el < count; el += G) {
                const int e = ids[c0 + el], a = (int)ci[e] - a0, j = nj[e];
                if (a != cur) {
                    flush();
                    cur = a;
                    sum[0] = sum[1] = sum[2] = sum[3] = T(0);
                }
                T w[3], p[3], vj[3];
                filter_of(el, w);
                sender(b, j, p, vj);
                const T* u = geo + el * RB + R + 1;
                const T x1 = p[1] * w[1], x2v = p[2] * w[2];
                sum[0] += p[0] * w[0];
                for (int k = 0; k < 3; ++k) sum[1 + k] += x1 * u[k] + x2v * vj[k];
            }
            flush();
        });
        for (int idx = tid; idx < AF; idx += THREADS) {
            const int a = idx / F, f = idx % F;
            for (int q = 0; q < 4; ++q) {
                T total = T(0);
                for (int gg = 0; gg < G; ++gg) total += acc[((gg * A + a) * 4 + q) * F + f];
                if (q == 0)
                    s[idx] += total;
                else
                    v[(a * 3 + q - 1) * F + f] += total;
            }
        }
        __syncthreads();

        // Update: [U | V] = v W_mix, |V|, context MLP on [s | |V|], gated update.
        rowdot(wo + bl.mix, 2 * F, F, v, F, 3 * A, [&](int r, int j, T y) {
            yo[r * 2 * F + j] = y;
            tape(b, r / 3)[F + (r % 3) * 2 * F + j] = y;
        });
        for (int idx = tid; idx < AF; idx += THREADS) {
            const int a = idx / F, f = idx % F;
            T sq = T(NORM_EPS);
            for (int k = 0; k < 3; ++k) {
                const T vv = yo[(a * 3 + k) * 2 * F + F + f];
                sq += vv * vv;
            }
            const T nrm = sqrt(sq);
            tape(b, a)[7 * F + f] = nrm;
            xin[a * 2 * F + f] = s[idx];
            xin[a * 2 * F + F + f] = nrm;
        }
        __syncthreads();
        rowdot(wo + bl.c1, F, 2 * F, xin, 2 * F, A, [&](int a, int j, T y) {
            y += __ldg(wi + bl.cb1 + j);
            tape(b, a)[8 * F + j] = y;
            x2[a * F + j] = silu_of(y);
        });
        rowdot(wo + bl.c2, F3, F, x2, F, A, [&](int a, int j, T y) {
            y += __ldg(wi + bl.cb2 + j);
            tape(b, a)[9 * F + j] = y;
            xin[a * F3 + j] = y;
        });
        for (int idx = tid; idx < AF; idx += THREADS) {
            const int a = idx / F, f = idx % F;
            const T* act = xin + a * F3;
            T dot = T(0);
            for (int k = 0; k < 3; ++k) {
                const T* mx = yo + (a * 3 + k) * 2 * F;
                dot += mx[f] * mx[F + f];
                v[(a * 3 + k) * F + f] += mx[f] * act[F + f];
            }
            s[idx] += act[f] + act[2 * F + f] * dot;
        }
        __syncthreads();
    }

    // Readout: E_a = const + silu(s R1 + r1) · w_out, and dE/ds.
    rowdot(w_out + ro_at, H2, F, s, F, A, [&](int a, int j, T y) { x2[a * H2 + j] = y + __ldg(ro_b + j); });
    {
        const int lane = tid & 31, warp = tid >> 5;
        for (int a = warp; a < A; a += WARPS) {
            T e = T(0);
            for (int o = lane; o < H2; o += 32) e += silu_of(x2[a * H2 + o]) * __ldg(ro_out + o);
            e = warp_allsum(e);
            if (lane == 0) energies[a0 + a] = __ldg(atom_const + species[a0 + a]) + e;
        }
        for (int idx = tid; idx < A * H2; idx += THREADS)
            xin[idx] = __ldg(ro_out + idx % H2) * silu_grad(x2[idx]);
        for (int idx = tid; idx < 3 * AF; idx += THREADS) gv[idx] = T(0);
        __syncthreads();
    }
    rowdot(w_in + ro_at, F, H2, xin, H2, A, [&](int a, int j, T y) { gs[a * F + j] = y; });

    // The adjoint, block by block.
    for (int b = NB - 1; b >= 0; --b) {
        const T* wi = w_in + blocks_at + b * bl.stride;
        load_filter(wi);
        // Gated update: dE/d act into x2, dE/d[U | V] into yo.
        for (int idx = tid; idx < AF; idx += THREADS) {
            const int a = idx / F, f = idx % F;
            const T* tp = tape(b, a);
            const T* act = tp + 9 * F;
            const T g_s = gs[idx];
            T dot = T(0), g_avv = T(0);
            for (int k = 0; k < 3; ++k) {
                const T* mx = tp + F + k * 2 * F;
                dot += mx[f] * mx[F + f];
                g_avv += gv[(a * 3 + k) * F + f] * mx[f];
            }
            x2[a * F3 + f] = g_s;
            x2[a * F3 + F + f] = g_avv;
            x2[a * F3 + 2 * F + f] = g_s * dot;
            const T g_dot = g_s * act[2 * F + f];
            for (int k = 0; k < 3; ++k) {
                const T* mx = tp + F + k * 2 * F;
                T* gm = yo + (a * 3 + k) * 2 * F;
                gm[f] = gv[(a * 3 + k) * F + f] * act[F + f] + g_dot * mx[F + f];
                gm[F + f] = g_dot * mx[f];
            }
        }
        __syncthreads();
        // Context MLP: dE/d cpre into xin, then dE/ds and dE/d|V| (divided by |V|, into x2).
        rowdot(wi + bl.c2, F, F3, x2, F3, A, [&](int a, int j, T y) {
            xin[a * F + j] = y * silu_grad(tape(b, a)[8 * F + j]);
        });
        rowdot(wi + bl.c1, 2 * F, F, xin, F, A, [&](int a, int j, T y) {
            if (j < F)
                gs[a * F + j] += y;
            else
                x2[a * F + j - F] = y / tape(b, a)[7 * F + j - F];
        });
        for (int idx = tid; idx < 3 * AF; idx += THREADS) {
            const int r = idx / F, f = idx % F;  // r = 3a + k
            yo[r * 2 * F + F + f] += x2[(r / 3) * F + f] * tape(b, r / 3)[F + (r % 3) * 2 * F + F + f];
        }
        __syncthreads();
        rowdot(wi + bl.mix, F, 2 * F, yo, 2 * F, 3 * A, [&](int r, int j, T y) { gv[r * F + j] += y; });

        // Interaction: the senders' gradients (added into gphi_g, gvj_g; the first block's
        // senders need none) and each own edge's basis and unit-vector gradient.
        for (int idx = tid; idx < CHUNK * RG; idx += THREADS) gedge[idx] = T(0);
        __syncthreads();
        for_own_edges([&](int c0, int count) {
            if (g < G) {
                const int lane = tid & 31;
                for (int el = g; el < count; el += G) {
                    const int e = ids[c0 + el], a = (int)ci[e] - a0, j = nj[e];
                    T w[3], p[3], vj[3];
                    filter_of(el, w);
                    sender(b, j, p, vj);
                    const T* u = geo + el * RB + R + 1;
                    const T gx0 = gs[a * F + t];
                    T gvi[3], gx1 = T(0), gx2 = T(0);
                    for (int k = 0; k < 3; ++k) {
                        gvi[k] = gv[(a * 3 + k) * F + t];
                        gx1 += gvi[k] * u[k];
                        gx2 += gvi[k] * vj[k];
                    }
                    if (b > 0) {
                        T* gp = gphi_g + ((b - 1) * (size_t)N + j) * F3 + t;
                        T* gq = gvj_g + ((b - 1) * (size_t)N + j) * F3 + t;
                        atomicAdd(gp, gx0 * w[0]);
                        atomicAdd(gp + F, gx1 * w[1]);
                        atomicAdd(gp + 2 * F, gx2 * w[2]);
                        for (int k = 0; k < 3; ++k) atomicAdd(gq + k * F, gvi[k] * p[2] * w[2]);
                    }
                    // Per-edge sums over the features: column k <= R of the basis, then the
                    // unit vector; reduce-scattered so that lane l holds column l.
                    const T gw0 = gx0 * p[0], gw1 = gx1 * p[1], gw2 = gx2 * p[2];
                    T col[MAX_BASIS];
#pragma unroll
                    for (int k = 0; k < MAX_BASIS; ++k) {
                        const T* row = filt + k * F3 + t;
                        col[k] = k <= R ? gw0 * row[0] + gw1 * row[F] + gw2 * row[2 * F]
                                 : k < RG ? gvi[k - R - 1] * p[1] * w[1]
                                          : T(0);
                    }
                    reduce_scatter_step<16>(col, lane);
                    reduce_scatter_step<8>(col, lane);
                    reduce_scatter_step<4>(col, lane);
                    reduce_scatter_step<2>(col, lane);
                    reduce_scatter_step<1>(col, lane);
                    if (lane < RG) atomicAdd(gedge + el * RG + lane, col[0]);
                }
            }
            __syncthreads();
            for (int idx = tid; idx < count * RG; idx += THREADS) {
                T* dst = edge_g + (size_t)ids[c0 + idx / RG] * RG + idx % RG;
                *dst = (b == NB - 1 ? T(0) : *dst) + gedge[idx];
                gedge[idx] = T(0);
            }
        });
        if (b == 0) break;  // the first block's input is the embedding
        grid_barrier(counter, target);
        // φ network of own atoms: dE/dv += the senders' share; dE/dh1 into x2, then dE/ds.
        for (int idx = tid; idx < A * F3; idx += THREADS) {
            const size_t at = ((b - 1) * (size_t)N + a0) * F3 + idx;
            xin[idx] = __ldcg(gphi_g + at);
            gv[idx] += __ldcg(gvj_g + at);
        }
        __syncthreads();
        rowdot(wi + bl.w2, F, F3, xin, F3, A, [&](int a, int j, T y) {
            x2[a * F + j] = y * silu_grad(tape(b, a)[j]);
        });
        rowdot(wi + bl.w1, F, F, x2, F, A, [&](int a, int j, T y) { gs[a * F + j] += y; });
    }

    // Forces from each own edge's gradient (every block's forces zeroed before a barrier).
    if (NB < 2) grid_barrier(counter, target);
    for (int e0 = 0; e0 < E; e0 += WINDOW) {
        const int count = own_edges(ci, e0, E, a0, a0 + A, ids, counts);
        for (int el = tid; el < count; el += THREADS) {
            const int e = ids[el];
            T gr[3];
            edge_grad(pos, off, edge_g + (size_t)e * RG, ci, nj, e, R, rc, gr);
            const int i = ci[e], j = nj[e];
            for (int k = 0; k < 3; ++k) {
                atomicAdd(forces + 3 * j + k, -gr[k]);
                atomicAdd(forces + 3 * i + k, gr[k]);
            }
        }
        __syncthreads();
    }
    last_block_out(counter, counts);
}

#define ATOM_SPLIT(T, SUF)                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) atom_split_##SUF(                \
        const T* pos, const T* off, const T* w_in, const T* w_out, const unsigned int* sp,    \
        const unsigned int* ci, const unsigned int* nj, const unsigned int* bar, T* out,      \
        size_t n, size_t e, size_t f, size_t r, size_t blocks, size_t n_el, size_t per_block, \
        double cutoff) {                                                                      \
        const Dims d{(int)n, (int)e, (int)f, (int)r, (int)blocks, (int)n_el, (int)per_block}; \
        atom_split<T>(pos, off, w_in, w_out, sp, ci, nj, bar, out, d, cutoff);                \
    }
ATOM_SPLIT(float, f32)
ATOM_SPLIT(double, f64)
