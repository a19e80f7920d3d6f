// The whole PaiNN energy + forces of a small system in one launch, its atoms split over the
// blocks (src/ops/whole/atom_split.rs).
//
// kernels/whole/feature_split.cu splits the features over its blocks, so every dense layer
// needs the whole layer input of every atom: a barrier per layer, 30 per call (their cost:
// BENCHMARKS.md, "Goals against their measured floors"). Here block c owns atoms [c A, c A + A) and
// computes every feature of them: a dense layer needs nothing from the other blocks, and each
// block streams every weight from L2 once per pass.
// The weights go through a ring of shared-memory stages a few chunks ahead of the layer that
// uses them (weight_stream.cuh): what they are and their order do not depend on the data.
// Barriers remain only where PaiNN mixes atoms: before interactions 1.. of the forward (the
// senders' φ and v; the first interaction's φ is a per-element table and its v zero), and after
// the adjoint of interactions 1.. (the senders' gradients, added by the receivers' blocks). The
// forward reads the weights output-major ([out, in], a second packed buffer) and the adjoint
// input-major ([in, out], the small-system layout), so both are row-times-vector products.
//
// Output: forces [N, 3] (zeroed by each atom's block, added by atomics), energies [N], then the
// scratch: φ and v of every atom before interactions 1.. (what the receivers read), the senders'
// gradients of those interactions (zeroed, added by atomics), each atom's tape (what the
// adjoint reads back, unless it is kept in shared memory) and each edge's gradient w.r.t. its
// basis and unit vector (written by its receiver's block only).
#include <type_traits>

#include "common.cuh"
#include "edge_basis.cuh"
#include "grid.cuh"
#include "packed_weights.cuh"
#include "row_products.cuh"
#include "weight_stream.cuh"

namespace {

constexpr int THREADS = 512, WARPS = THREADS / 32;
// Atoms a block owns at most (src/ops/whole/atom_split.rs MAX_ATOMS: the kernel is compiled for each
// count, so that a dense layer's rows, one or three per atom, are known at compile time).
constexpr int MAX_ATOMS = 2;
// Own edges whose geometry is formed at once (src/ops/whole/atom_split.rs CHUNK).
constexpr int CHUNK = 64;
// The own-edge list's lowest local-atom bit (5 bits for the local atom; the neighbour index
// below it: src/ops/whole/atom_split.rs MAX_SYSTEM_ATOMS).
constexpr unsigned LOCAL_BIT = 27;
static_assert(MAX_ATOMS <= 1 << (32 - LOCAL_BIT), "local atom bits");

template <typename T>
using WeightStream = weight_stream::Stream<T, WARPS>;
template <typename T>
using Layer = weight_stream::Layer<T>;

struct Dims {
    // cap: values per weight-stream stage; own_cap: own edges listed at once; tape_shared:
    // whether the tape lives in shared memory (else in the scratch); stamps: whether block 0
    // records phase times after the scratch (src/ops/whole/atom_split.rs phase_names); pb: atoms per
    // block (at most the function's PB).
    int n, e, r, blocks, n_el, cap, own_cap, tape_shared, stamps, pb;
};

// Appends to ids (edge) and nbr (sender | local receiver << LOCAL_BIT) the edges of [e0, E)
// whose receiver is in [lo, hi), a round of THREADS edges at a time while a round surely fits
// in cap; `count` the entries (every thread). Returns the first edge not scanned. `counts`
// holds WARPS ints.
__device__ __forceinline__ int collect_own(const unsigned int* ci, const unsigned int* nj, int e0, int E,
                                           int lo, int hi, int cap, unsigned int* ids, unsigned int* nbr,
                                           int* counts, int& count) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (; e0 < E && count + THREADS <= cap; e0 += THREADS) {
        const int e = e0 + threadIdx.x;
        const int i = e < E ? (int)__ldg(ci + e) : -1;
        const bool mine = i >= lo && i < hi;
        const unsigned int m = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) counts[warp] = __popc(m);
        __syncthreads();
        int before = count, round = 0;
        for (int w = 0; w < WARPS; ++w) {
            before += w < warp ? counts[w] : 0;
            round += counts[w];
        }
        if (mine) {
            const int at = before + __popc(m & ((1u << lane) - 1));
            ids[at] = e;
            nbr[at] = __ldg(nj + e) | ((unsigned)(i - lo) << LOCAL_BIT);
        }
        count += round;
        __syncthreads();
    }
    return e0;
}

}  // namespace

// A dense layer of a block's rows (one per atom, R1 = 1, or three, R1 = 3; at most R1 PB) by
// CUDA cores.
template <int R1, int K, int PB, typename T, typename Emit>
__device__ __forceinline__ void dense(WeightStream<T>& ws, int J, const T* x, int ldx, int rows, Emit emit) {
    row_products::rowdot<R1 * PB, K>(ws, J, x, ldx, rows, emit);
}

template <typename T, int F, int PB>
__device__ __forceinline__ void atom_split(const T* pos, const T* off, const T* __restrict__ w_in,
                                           const T* __restrict__ w_out,
                                           const unsigned int* __restrict__ species,
                                           const unsigned int* __restrict__ ci,
                                           const unsigned int* __restrict__ nj,
                                           const unsigned int* bar, T* out, const Dims d,
                                           double cutoff) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int F3 = 3 * F, H2 = F / 2, G = THREADS / F;
    const int N = d.n, E = d.e, R = d.r, NB = d.blocks;
    static_assert(PB >= 1 && PB <= MAX_ATOMS, "atoms per block");
    const int pb = min(d.pb, PB), tid = threadIdx.x, a0 = blockIdx.x * pb;
    const int A = max(0, min(pb, N - a0)), AF = A * F, PF = pb * F;
    // Feature groups for the edge loops: group g of F threads takes every G-th own edge.
    const int g = tid / F, t = tid % F;
    const int RB = R + 5, RG = R + 4;  // per-edge geometry: basis R + 1, unit vector, distance
    const size_t tape_w = 12 * (size_t)F;
    const T rc = T(cutoff);

    // Shared memory (src/ops/whole/atom_split.rs AtomSplitPlan::shared_bytes; every part of the
    // reals a multiple of 4 values), sized for per_block atoms.
    T* ring = reinterpret_cast<T*>(smem_raw);                // STAGES x cap: weight stream
    T* s = ring + weight_stream::STAGES * (size_t)d.cap;     // A x F: scalar features
    T* v = s + PF;                                           // A x 3 x F: vector features
    T* gs = s;                                               // dE/ds (s is dead by then)
    T* gv = v;                                               // dE/dv
    T* xin = v + 3 * PF;                                     // 3 A F: dense-layer inputs
    T* x2 = xin + 3 * PF;                                    // 3 A F
    T* yo = x2 + 3 * PF;                                     // 6 A F: [U | V] and its gradient
    T* filt = yo + 6 * PF;                                   // (R + 1) x 3F: the block's filter
    T* geo = filt + (R + 1) * F3;                            // CHUNK x (R + 5)
    T* gedge = geo + CHUNK * RB;                             // CHUNK x (R + 4): edge gradients
    T* bias = gedge + CHUNK * RG;                            // NB x 8F, then 2 x H2
    T* tape_s = bias + NB * 8 * F + 2 * H2;                  // NB x A x 12F where kept here
    Layer<T>* layers = reinterpret_cast<Layer<T>*>(tape_s + (d.tape_shared ? NB * PF * 12 : 0));
    unsigned long long* stream_bars = reinterpret_cast<unsigned long long*>(layers + 12 * NB - 2);
    unsigned int* ids = reinterpret_cast<unsigned int*>(stream_bars + 2 * weight_stream::STAGES);  // own_cap
    unsigned int* nbr = ids + d.own_cap;                                          // own_cap
    int* counts = reinterpret_cast<int*>(nbr + d.own_cap);                        // WARPS

    // Output and scratch.
    T* forces = out;
    T* energies = forces + 3 * N;
    const size_t nf3 = (size_t)N * F3;
    T* phi_g = energies + N;                        // (NB - 1) x N x 3F
    T* vin_g = phi_g + (NB - 1) * nf3;              // (NB - 1) x N x 3F
    T* gphi_g = vin_g + (NB - 1) * nf3;             // (NB - 1) x N x 3F, added into
    T* gvj_g = gphi_g + (NB - 1) * nf3;             // (NB - 1) x N x 3F, added into
    T* tape_g = gvj_g + (NB - 1) * nf3;             // NB x N x 12F: h1 | [U | V] | |V| | cpre | act
    T* edge_g = tape_g + NB * (size_t)N * tape_w;   // E x (R + 4)
    const size_t stamp_at = ((edge_g + (size_t)E * RG - out) + 1) & ~(size_t)1;
    Stamps stamps{d.stamps ? reinterpret_cast<unsigned long long*>(out + stamp_at) : nullptr, 0};
    stamps.mark();
    unsigned int* counter = const_cast<unsigned int*>(bar);
    unsigned int target = 0;

    // Packed weights (src/ops/whole/feature_split.rs ModelShape::packed_len): embedding,
    // atom constants, readout hidden layer and bias, readout output, the blocks, φ table.
    const size_t ro_at = (size_t)d.n_el * (F + 1), blocks_at = ro_at + (size_t)F * H2 + 2 * H2;
    const T* emb = w_in;
    const T* atom_const = w_in + (size_t)d.n_el * F;
    const BlockWeights bl(F, R);
    const T* phi_table = w_in + blocks_at + NB * bl.stride;
    const T* ro_b = bias + NB * 8 * F;  // readout hidden bias, then the output weights
    const T* ro_out = ro_b + H2;
    auto tape = [&](int b, int a) {
        return d.tape_shared ? tape_s + ((size_t)b * pb + a) * tape_w
                             : tape_g + ((size_t)b * N + a0 + a) * tape_w;
    };
    auto block_bias = [&](int b) { return bias + b * 8 * F; };  // b1 F | b2 3F | cb1 F | cb2 3F

    // The weight stream, in the order the passes below use it: six layers per interaction
    // block and direction (filter, φ's two, the update's three; the first block has no φ),
    // and the readout's two.
    const int n_layers = 12 * NB - 2;
    WeightStream<T> ws(ring, layers, stream_bars, n_layers, d.cap);
    if (tid == 0) {
        int nl = 0;
        auto add = [&](const T* p, int rows, int k) {
            if (reinterpret_cast<size_t>(p) & 15) __trap();  // bulk copies: the host checks
            layers[nl++] = Layer<T>{p, rows, k};
        };
        for (int b = 0; b < NB; ++b) {
            const T* wi = w_in + blocks_at + b * bl.stride;
            const T* wo = w_out + blocks_at + b * bl.stride;
            add(wi + bl.filter, R + 1, F3);
            if (b > 0) add(wo + bl.w1, F, F), add(wo + bl.w2, F3, F);
            add(wo + bl.mix, 2 * F, F), add(wo + bl.c1, F, 2 * F), add(wo + bl.c2, F3, F);
        }
        add(w_out + ro_at, H2, F), add(w_in + ro_at, F, H2);
        for (int b = NB - 1; b >= 0; --b) {
            const T* wi = w_in + blocks_at + b * bl.stride;
            add(wi + bl.filter, R + 1, F3);
            add(wi + bl.c2, F, F3), add(wi + bl.c1, 2 * F, F), add(wi + bl.mix, F, 2 * F);
            if (b > 0) add(wi + bl.w2, F, F3), add(wi + bl.w1, F, F);
        }
        if (nl != n_layers) __trap();
        ws.init();
    }
    __syncthreads();
    ws.start();

    // Initial state, the biases; what other blocks add into, zeroed before the first barrier.
    for (int idx = tid; idx < AF; idx += THREADS)
        s[idx] = __ldg(emb + (size_t)species[a0 + idx / F] * F + idx % F);
    for (int idx = tid; idx < 3 * AF; idx += THREADS) v[idx] = T(0);
    for (int b = 0; b < NB; ++b) {
        const T* wi = w_in + blocks_at + b * bl.stride;
        T* bb = bias + b * 8 * F;
        for (int idx = tid; idx < F; idx += THREADS) bb[idx] = __ldg(wi + bl.b1 + idx), bb[4 * F + idx] = __ldg(wi + bl.cb1 + idx);
        for (int idx = tid; idx < F3; idx += THREADS) bb[F + idx] = __ldg(wi + bl.b2 + idx), bb[5 * F + idx] = __ldg(wi + bl.cb2 + idx);
    }
    for (int idx = tid; idx < 2 * H2; idx += THREADS) bias[NB * 8 * F + idx] = __ldg(w_in + ro_at + (size_t)F * H2 + idx);
    for (int idx = tid; idx < 3 * A; idx += THREADS) forces[3 * a0 + idx] = T(0);
    for (int b = 0; b + 1 < NB; ++b)
        for (int idx = tid; idx < A * F3; idx += THREADS) {
            gphi_g[(b * (size_t)N + a0) * F3 + idx] = T(0);
            gvj_g[(b * (size_t)N + a0) * F3 + idx] = T(0);
        }

    // The own edges: listed once for the whole call where they fit (always, unless a block
    // owns more than own_cap - THREADS edges), and their geometry formed once where they also
    // fit one chunk.
    int own = 0;
    const bool all_listed = collect_own(ci, nj, 0, E, a0, a0 + A, d.own_cap, ids, nbr, counts, own) >= E;
    const bool keep_geometry = all_listed && own <= CHUNK;
    bool geometry_formed = false;
    // Calls body(count) for every list of own edges ids/nbr[0, count).
    auto for_own_lists = [&](auto body) {
        if (all_listed) return body(own);
        for (int e0 = 0; e0 < E;) {
            int count = 0;
            e0 = collect_own(ci, nj, e0, E, a0, a0 + A, d.own_cap, ids, nbr, counts, count);
            body(count);
        }
    };
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
        for_own_lists([&](int listed) {
            for (int c0 = 0; c0 < listed; c0 += CHUNK) {
                const int len = min(CHUNK, listed - c0);
                if (!(keep_geometry && geometry_formed)) form_geometry(c0, len);
                geometry_formed = true;
                body(c0, len);
                __syncthreads();
            }
        });
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
    const unsigned sender_mask = (1u << LOCAL_BIT) - 1;
    // Calls each(el, a, j, p, vj) for the group's own edges of a chunk (the adjoint), the next
    // edge's sender loaded before the current one is used (its loads in flight meanwhile).
    auto for_group_edges = [&](int b, int c0, int count, auto each) {
        T p[3], vj[3];
        if (g < count) sender(b, nbr[c0 + g] & sender_mask, p, vj);
        for (int el = g; el < count; el += G) {
            T pn[3], vn[3];
            if (el + G < count) sender(b, nbr[c0 + el + G] & sender_mask, pn, vn);
            each(el, (int)(nbr[c0 + el] >> LOCAL_BIT), (int)(nbr[c0 + el] & sender_mask), p, vj);
            for (int q = 0; q < 3; ++q) p[q] = pn[q], vj[q] = vn[q];
        }
    };
    // The block's filter from the stream into filt.
    auto load_filter = [&]() {
        ws.begin_layer(R + 1, F3);
        const int per = ws.rows_per_chunk(F3);
        for (int j0 = 0; j0 <= R; j0 += per) {
            const T* chunk = ws.next();
            const int n = min(per, R + 1 - j0) * F3;
            for (int idx = tid; idx < n; idx += THREADS) filt[j0 * F3 + idx] = chunk[idx];
            ws.release();
        }
        __syncthreads();
    };

    for (int b = 0; b < NB; ++b) {
        const T* bb = block_bias(b);
        load_filter();
        if (b > 0) {
            // φ = silu(s W1 + b1) W2 + b2 of own atoms, and v, for the receivers.
            dense<1, F, PB>(ws, F, s, F, A, [&](int a, int j, T y) {
                y += bb[j];
                tape(b, a)[j] = y;
                xin[a * F + j] = silu_of(y);
            });
            dense<1, F, PB>(ws, F3, xin, F, A, [&](int a, int j, T y) {
                phi_g[((b - 1) * (size_t)N + a0 + a) * F3 + j] = y + bb[F + j];
            });
            for (int idx = tid; idx < A * F3; idx += THREADS)
                vin_g[((b - 1) * (size_t)N + a0) * F3 + idx] = v[idx];
            grid_barrier(counter, target);
        }
        stamps.mark();  // filter; φ layers and the barrier

        // Interaction: s_i += Σ_j φs_j Ws, v_i += Σ_j φd_j Wd u_ij + φv_j Wv v_j (s and v are
        // not read meanwhile).
        for_own_edges([&](int c0, int count) {
            if (g >= G) return;
            // The sums of one receiver at a time, added into s and v when the next edge has
            // another (a list holds a receiver's edges together, as neighbour lists give them).
            int cur = -1;
            T sum[4] = {T(0), T(0), T(0), T(0)};
            auto flush = [&]() {
                if (cur < 0) return;
                atomicAdd(s + cur * F + t, sum[0]);
                for (int q = 0; q < 3; ++q) atomicAdd(v + (cur * 3 + q) * F + t, sum[q + 1]);
            };
            auto add_to = [&](int a, const T add[4]) {
                if (a != cur) {
                    flush();
                    cur = a;
#pragma unroll
                    for (int q = 0; q < 4; ++q) sum[q] = T(0);
                }
#pragma unroll
                for (int q = 0; q < 4; ++q) sum[q] += add[q];
            };
            // Two edges at a time (el and el + G): their filters share the filter rows' loads,
            // and the next two edges' senders load meanwhile.
            auto load_senders = [&](int el, T p[2][3], T vj[2][3]) {
                for (int e2 = 0; e2 < 2; ++e2)
                    sender(b, nbr[c0 + min(el + e2 * G, count - 1)] & sender_mask, p[e2], vj[e2]);
            };
            T p[2][3], vj[2][3];
            if (g < count) load_senders(g, p, vj);
            for (int el = g; el < count; el += 2 * G) {
                T pn[2][3], vn[2][3];
                if (el + 2 * G < count) load_senders(el + 2 * G, pn, vn);
                const int second = min(el + G, count - 1);
                const T* q0 = geo + el * RB;
                const T* q1 = geo + second * RB;
                T w[2][3] = {};
#pragma unroll 4
                for (int k = 0; k <= R; ++k) {
                    const T* row = filt + k * F3 + t;
                    const T f0 = row[0], f1 = row[F], f2 = row[2 * F], b0 = q0[k], b1 = q1[k];
                    w[0][0] = fma(b0, f0, w[0][0]), w[0][1] = fma(b0, f1, w[0][1]), w[0][2] = fma(b0, f2, w[0][2]);
                    w[1][0] = fma(b1, f0, w[1][0]), w[1][1] = fma(b1, f1, w[1][1]), w[1][2] = fma(b1, f2, w[1][2]);
                }
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2) {
                    const int en = e2 == 0 ? el : second;
                    if (e2 == 1 && el + G >= count) break;
                    const T* u = geo + en * RB + R + 1;
                    const T x1 = p[e2][1] * w[e2][1], x2v = p[e2][2] * w[e2][2];
                    const T add[4] = {p[e2][0] * w[e2][0], x1 * u[0] + x2v * vj[e2][0],
                                      x1 * u[1] + x2v * vj[e2][1], x1 * u[2] + x2v * vj[e2][2]};
                    add_to((int)(nbr[c0 + en] >> LOCAL_BIT), add);
                }
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2)
#pragma unroll
                    for (int q = 0; q < 3; ++q) p[e2][q] = pn[e2][q], vj[e2][q] = vn[e2][q];
            }
            flush();
        });
        stamps.mark();  // interaction

        // Update: [U | V] = v W_mix, |V|, context MLP on [s | |V|], gated update.
        dense<3, F, PB>(ws, 2 * F, v, F, 3 * A, [&](int r, int j, T y) {
            yo[r * 2 * F + j] = y;
            tape(b, r / 3)[F + (r % 3) * 2 * F + j] = y;
        });
        for (int idx = tid; idx < AF; idx += THREADS) {
            const int a = idx / F, f = idx % F;
            const T nrm = norm3_eps(yo + a * 3 * 2 * F + F + f, 2 * F);
            tape(b, a)[7 * F + f] = nrm;
            xin[a * 2 * F + f] = s[idx];
            xin[a * 2 * F + F + f] = nrm;
        }
        __syncthreads();
        dense<1, 2 * F, PB>(ws, F, xin, 2 * F, A, [&](int a, int j, T y) {
            y += bb[4 * F + j];
            tape(b, a)[8 * F + j] = y;
            x2[a * F + j] = silu_of(y);
        });
        dense<1, F, PB>(ws, F3, x2, F, A, [&](int a, int j, T y) {
            y += bb[5 * F + j];
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
        stamps.mark();  // update
    }

    // Readout: E_a = const + silu(s R1 + r1) · w_out, and dE/ds.
    dense<1, F, PB>(ws, H2, s, F, A, [&](int a, int j, T y) { x2[a * H2 + j] = y + ro_b[j]; });
    {
        const int lane = tid & 31, warp = tid >> 5;
        for (int a = warp; a < A; a += WARPS) {
            T e = T(0);
            for (int o = lane; o < H2; o += 32) e += silu_of(x2[a * H2 + o]) * ro_out[o];
            e = warp_sum(e);
            if (lane == 0) energies[a0 + a] = __ldg(atom_const + species[a0 + a]) + e;
        }
        for (int idx = tid; idx < A * H2; idx += THREADS) xin[idx] = ro_out[idx % H2] * silu_grad(x2[idx]);
        for (int idx = tid; idx < 3 * AF; idx += THREADS) gv[idx] = T(0);
        __syncthreads();
    }
    dense<1, H2, PB>(ws, F, xin, H2, A, [&](int a, int j, T y) { gs[a * F + j] = y; });
    stamps.mark();  // readout and its gradient

    // The adjoint, block by block.
    for (int b = NB - 1; b >= 0; --b) {
        load_filter();
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
        dense<1, F3, PB>(ws, F, x2, F3, A, [&](int a, int j, T y) {
            xin[a * F + j] = y * silu_grad(tape(b, a)[8 * F + j]);
        });
        dense<1, F, PB>(ws, 2 * F, xin, F, A, [&](int a, int j, T y) {
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
        dense<3, 2 * F, PB>(ws, F, yo, 2 * F, 3 * A, [&](int r, int j, T y) { gv[r * F + j] += y; });
        stamps.mark();  // filter; update adjoint

        // Interaction: the senders' gradients (added into gphi_g, gvj_g; the first block's
        // senders need none) and each own edge's basis and unit-vector gradient.
        for (int idx = tid; idx < CHUNK * RG; idx += THREADS) gedge[idx] = T(0);
        __syncthreads();
        for_own_edges([&](int c0, int count) {
            if (g < G) {
                const int lane = tid & 31;
                for_group_edges(b, c0, count, [&](int el, int a, int j, const T p[3], const T vj[3]) {
                    const T* q = geo + el * RB;
                    const T* u = q + R + 1;
                    const T gx0 = gs[a * F + t];
                    T gvi[3], gx1 = T(0), gx2 = T(0);
                    for (int k = 0; k < 3; ++k) {
                        gvi[k] = gv[(a * 3 + k) * F + t];
                        gx1 += gvi[k] * u[k];
                        gx2 += gvi[k] * vj[k];
                    }
                    // The filter and the per-edge sums over the features of each basis
                    // column k <= R in one pass over the filter rows, then the unit vector's
                    // columns; reduce-scattered below so that lane l holds column l.
                    const T gw0 = gx0 * p[0], gw1 = gx1 * p[1], gw2 = gx2 * p[2];
                    T w[3] = {T(0), T(0), T(0)}, col[MAX_BASIS];
#pragma unroll
                    for (int k = 0; k < MAX_BASIS; ++k) {
                        col[k] = T(0);
                        if (k <= R) {
                            const T* row = filt + k * F3 + t;
                            const T f0 = row[0], f1 = row[F], f2 = row[2 * F], qk = q[k];
                            w[0] = fma(qk, f0, w[0]), w[1] = fma(qk, f1, w[1]), w[2] = fma(qk, f2, w[2]);
                            col[k] = gw0 * f0 + gw1 * f1 + gw2 * f2;
                        }
                    }
                    const T pw = p[1] * w[1];
#pragma unroll
                    for (int k = 1; k < MAX_BASIS; ++k) {
                        const int m = k - R - 1;
                        if (m >= 0 && m < 3) col[k] = (m == 0 ? gvi[0] : m == 1 ? gvi[1] : gvi[2]) * pw;
                    }
                    if (b > 0) {
                        T* gp = gphi_g + ((b - 1) * (size_t)N + j) * F3 + t;
                        T* gq = gvj_g + ((b - 1) * (size_t)N + j) * F3 + t;
                        atomicAdd(gp, gx0 * w[0]);
                        atomicAdd(gp + F, gx1 * w[1]);
                        atomicAdd(gp + 2 * F, gx2 * w[2]);
                        for (int k = 0; k < 3; ++k) atomicAdd(gq + k * F, gvi[k] * p[2] * w[2]);
                    }
                    reduce_scatter_step<16>(col, lane);
                    reduce_scatter_step<8>(col, lane);
                    reduce_scatter_step<4>(col, lane);
                    reduce_scatter_step<2>(col, lane);
                    reduce_scatter_step<1>(col, lane);
                    if (lane < RG) atomicAdd(gedge + el * RG + lane, col[0]);
                });
            }
            __syncthreads();
            for (int idx = tid; idx < count * RG; idx += THREADS) {
                T* dst = edge_g + (size_t)ids[c0 + idx / RG] * RG + idx % RG;
                *dst = (b == NB - 1 ? T(0) : *dst) + gedge[idx];
                gedge[idx] = T(0);
            }
        });
        stamps.mark();  // interaction adjoint
        if (b == 0) break;  // the first block's input is the embedding
        grid_barrier(counter, target);
        // φ network of own atoms: dE/dv += the senders' share; dE/dh1 into x2, then dE/ds.
        for (int idx = tid; idx < A * F3; idx += THREADS) {
            const size_t at = ((b - 1) * (size_t)N + a0) * F3 + idx;
            xin[idx] = __ldcg(gphi_g + at);
            gv[idx] += __ldcg(gvj_g + at);
        }
        __syncthreads();
        dense<1, F3, PB>(ws, F, xin, F3, A, [&](int a, int j, T y) {
            x2[a * F + j] = y * silu_grad(tape(b, a)[j]);
        });
        dense<1, F, PB>(ws, F, x2, F, A, [&](int a, int j, T y) { gs[a * F + j] += y; });
        stamps.mark();  // the barrier; φ layers' adjoint
    }

    // Forces from each own edge's gradient (every block's forces zeroed before a barrier).
    if (NB < 2) grid_barrier(counter, target);
    for_own_lists([&](int listed) {
        for (int el = tid; el < listed; el += THREADS) {
            const int e = ids[el];
            T gr[3], r[3];
            edge_grad(pos, off, edge_g + (size_t)e * RG, ci, nj, e, R, rc, gr, r);
            const int i = ci[e], j = nj[e];
            for (int k = 0; k < 3; ++k) {
                atomicAdd(forces + 3 * j + k, -gr[k]);
                atomicAdd(forces + 3 * i + k, gr[k]);
            }
        }
        __syncthreads();
    });
    stamps.mark();  // forces
    last_block_out(counter, counts);
}

// One entry per feature count F (src/ops/whole/atom_split.rs FEATURES), atoms per block (1 or
// MAX_ATOMS) and real.
#define ATOM_SPLIT(F, PB, T, SUF)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) atom_split_##F##x##PB##_##SUF(        \
        const T* pos, const T* off, const T* w_in, const T* w_out, const unsigned int* sp,         \
        const unsigned int* ci, const unsigned int* nj, const unsigned int* bar, T* out, size_t n, \
        size_t e, size_t r, size_t blocks, size_t n_el, size_t cap, size_t own_cap,               \
        size_t tape_shared, size_t stamps, size_t pb, double cutoff) {                             \
        const Dims d{(int)n,       (int)e,       (int)r,           (int)blocks, (int)n_el,        \
                     (int)cap,     (int)own_cap, (int)tape_shared, (int)stamps, (int)pb};         \
        atom_split<T, F, PB>(pos, off, w_in, w_out, sp, ci, nj, bar, out, d, cutoff);              \
    }
#define ATOM_SPLIT_CUDA_CORES(F)                                 \
    ATOM_SPLIT(F, 1, float, f32) ATOM_SPLIT(F, 2, float, f32) \
    ATOM_SPLIT(F, 1, double, f64) ATOM_SPLIT(F, 2, double, f64)
ATOM_SPLIT_CUDA_CORES(32)
ATOM_SPLIT_CUDA_CORES(128)
