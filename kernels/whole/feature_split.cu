// The whole PaiNN energy + forces of a feature split in one launch (src/ops/whole/feature_split.rs).
//
// A molecule-sized call is ~75 kernels of a few microseconds each, each bounded by latency
// rather than work. Here G thread blocks (launched cooperatively, so all are resident) run the
// forward and the explicit adjoint of model::fused as 10 phases per interaction block,
// separated by a barrier among the G blocks. Block c owns the features [c S, c S + S),
// S = F / G, of every atom: it computes those columns of every dense layer (staging the
// layer's whole input in shared memory after a barrier), and the message passing and update
// of its own features need no barrier at all, since PaiNN's interaction and gating never mix
// features; the block keeps its own features of every layer's φ, v and update in shared memory
// for the adjoint. The first block's φ comes from a per-element table (its input is the
// embedding), so its interaction needs no barrier.
// Per-edge sums over features (the basis gradient) are kept per block and added into the
// output in the last phase.
//
// Layouts: weights are packed as src/ops/whole/feature_split.rs writes them (every matrix input-major,
// [in, out]); vectors are [N, 3, F] (atom, component, feature); the output holds forces [N, 3],
// atom energies [N] and each edge's dE/dd, dE/du [E, 4] (zeroed in the first phase: the blocks
// add their shares), then the scratch (the tape the adjoint reads). The barrier counts in a
// separate [2] buffer that is zero at launch and left zero.
//
// With `step` set the launch is a whole MD step (src/ops/whole/md_step.rs): every block
// advances the f64 positions itself (kick, then drift or Langevin A O A, as md_advance) and
// runs the model on them, and the last block to finish adds the closing kick and writes the
// f64 state [x' | v' | f' (3N each) | energy | Σ, max of |x' - reference|²]: one launch a step
// instead of the force kernel and ~8 small ones around it.
#include "feature_split.cuh"

// F_, S_, R_: compile-time feature width, features per block and Gaussians (0: the run-time
// value of d), so that the shipped model's sizes fold into shifts and fixed trip counts.
template <typename T, int F_, int S_, int R_>
__device__ __forceinline__ void feature_split(const T* pos_in, const T* __restrict__ off,
                             const T* __restrict__ wts, const unsigned int* __restrict__ species,
                             const unsigned int* __restrict__ ci,
                             const unsigned int* __restrict__ nj, const unsigned int* bar,
                             T* out, const Dims d,
                             double cutoff, const MdStep md) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int N = d.n, E = d.e;
    const int F = F_ ? F_ : d.f, R = R_ ? R_ : d.r, S = S_ ? S_ : d.s, H2 = F / 2;
    const int c = blockIdx.x, f0 = c * S, tid = threadIdx.x, nt = THREADS;
    const int F3 = 3 * F, NS = N * S;
    // Per edge of a chunk: basis [R + 1], its d-derivative [R + 1], unit vector [3], distance.
    const int ebw = 2 * R + 6, du = 2 * R + 2;
    const int edges_per_chunk = d.eb_edges;
    // All edges in one chunk: their geometry is formed once per call and stays.
    const bool edges_resident = E <= edges_per_chunk;
    // Shared memory: layer inputs, this block's weight columns and biases, filter columns,
    // own-feature rows of every block's phi and v (the forward makes them, the adjoint reads
    // them back), of s, dE/ds, dE/dv, the message accumulators, energies, per-edge dE/dd and
    // dE/du summed over this block's features, a chunk of edge geometry and atoms.
    T* xs = reinterpret_cast<T*>(smem_raw);
    T* ws = xs + d.xs_len;              // 3 F S + 3S
    // Filter columns [R + 1][S][4] (the 3 chunks of a feature side by side, one padding value),
    // 16-byte aligned, so that the edge loops read a feature's three filter weights at once.
    T* fw = ws + ((3 * F * S + 3 * S + 3) & ~3);
    T* phi_all = fw + (R + 1) * 4 * S;  // B x N x 3S
    T* v_all = phi_all + d.blocks * 3 * NS;  // B x N x 3 x S
    // Every block's own [U | V], activations, |V| and context pre-activations (the gated update
    // and the adjoint read them back): B x N x (6S + 3S + S + S).
    T* upd_all = v_all + d.blocks * 3 * NS;
    T* s_own = upd_all + d.blocks * 11 * NS;  // N x S
    T* gs_own = s_own + NS;             // N x S
    T* gv_own = gs_own + NS;            // N x 3 x S
    T* acc = gv_own + 3 * NS;           // 6 N S
    T* eacc = acc + 6 * NS;             // N
    T* gedge = eacc + N;                // E x 4
    T* eb = gedge + 4 * E;              // edges_per_chunk x ebw
    unsigned int* eij = reinterpret_cast<unsigned int*>(eb + edges_per_chunk * ebw);  // 2 per edge
    // An MD step's advanced positions, in the model's type [N, 3] (each block forms them).
    T* pos_step = reinterpret_cast<T*>(eij + 2 * edges_per_chunk);
    const T* pos = pos_in;
    // Barrier arrivals and finished blocks: a buffer of the device's that the last block to
    // finish sets back to zero, so that no launch needs a memset first.
    unsigned int* counter = const_cast<unsigned int*>(bar);
    unsigned int target = 0;
    T* forces = out;
    T* energies = forces + 3 * N;
    T* edge_grad = energies + N;  // E x 4: dE/dd, dE/du per edge, summed over the blocks
    const Scratch<T> sc(edge_grad + 4 * E, d);
    const size_t nf = (size_t)N * F;
    // Phase stamps after the scratch, at an 8-byte boundary of the output.
    const size_t stamp_at = ((sc.end - out) + 1) & ~(size_t)1;
    Stamps stamps{d.stamps ? reinterpret_cast<unsigned long long*>(out + stamp_at) : nullptr, 0};
    stamps.mark();

    // Packed weights: embedding [n_el, F], atom constants [n_el], readout R1 [F, F/2], r1,
    // w_out [F/2] (times the scale), then each block (BlockWeights).
    const T* emb = wts;
    const T* atom_const = emb + (size_t)d.n_el * F;
    const T* ro_w = atom_const + d.n_el;
    const T* ro_b = ro_w + (size_t)F * H2;
    const T* ro_out = ro_b + H2;
    const T* blocks_w = ro_out + H2;
    const BlockWeights bl(F, R);
    auto sync = [&]() { group_sync(counter, target, stamps); };
    auto plain = [](const T* base, int stride) { return Rows<T>{base, stride}; };
    auto silu_in = [](const T* base, int stride) { return Rows<T>{base, stride, nullptr, 1 << 30, true}; };

    // Columns owned by this block: chunk q of width F holds [q F + f0, q F + f0 + S).
    const Cols own{S, F, f0};
    // This block's filter columns (started before a barrier; the next dense() or
    // wait_copies() waits for them): fw[(k S + t) 4 + q] = W_filter[k][q F + f0 + t].
    auto load_filter = [&](const T* w) {
        for (int idx = tid; idx < (R + 1) * 4 * S; idx += nt) {
            const int k = idx / (4 * S), t = (idx / 4) % S, q = idx % 4;
            if (q < 3)
                copy_async(fw + idx, w + bl.filter + (size_t)k * F3 + q * F + f0 + t);
            else
                fw[idx] = T(0);
        }
    };
    // Geometry of edges [e0, e0 + count) into eb and eij: each block forms it for itself.
    auto form_edges = [&](int e0, int count) {
        for (int el = tid; el < count; el += nt) {
            const int e = e0 + el;
            T r[3];
            const T dist = edge_vector(pos, off, ci, nj, e, r);
            const Radial<T> radial(dist, R, T(cutoff));
            T* g = eb + el * ebw;
            for (int k = 0; k < R; ++k) radial.column(dist, k, g[k], g[R + 1 + k]);
            g[R] = radial.fc;
            g[2 * R + 1] = radial.dfc;
            for (int k = 0; k < 3; ++k) g[du + k] = r[k] / dist;
            g[du + 3] = dist;
            eij[2 * el] = ci[e];
            eij[2 * el + 1] = nj[e];
        }
    };
    auto stage_edges = [&](int e0, int count) {
        __syncthreads();
        if (edges_resident) return;  // formed once, before the first barrier
        form_edges(e0, count);
        __syncthreads();
    };
    // Phase 0: initial state (own features), the first block's φ of each atom's element (its
    // input is the embedding: a table, packed last), the edge geometry if it all fits, and the
    // first block's interaction, which needs nothing from the other blocks.
    const T* phi_of_element = blocks_w + (size_t)d.blocks * bl.stride;
    load_filter(blocks_w);
    if (md.on) {
        for (int t = tid; t < 3 * N; t += nt) {
            double x1, v1;
            md.advance(t, x1, v1);
            pos_step[t] = T(x1);
        }
        __syncthreads();
        pos = pos_step;
    }
    // Forces, energies and edge gradients, which the blocks add into after the first barrier.
    for (int idx = c * nt + tid; idx < 4 * N + 4 * E; idx += gridDim.x * nt) out[idx] = T(0);
    if (edges_resident) form_edges(0, E);
    // The last threads, which have no edge when there are fewer edges than threads, start the
    // per-atom loads while the first ones form the edges.
    for (int idx = nt - 1 - tid; idx < NS; idx += nt) {
        s_own[idx] = __ldg(emb + (size_t)species[idx / S] * F + f0 + idx % S);
    }
    for (int idx = nt - 1 - tid; idx < 3 * NS; idx += nt) {
        v_all[idx] = T(0);
        phi_all[idx] = __ldg(phi_of_element + (size_t)species[idx / (3 * S)] * F3 + own(idx % (3 * S)));
    }

    for (int b = 0; b < d.blocks; ++b) {
        const T* w = blocks_w + b * bl.stride;
        T* phi_own = phi_all + b * 3 * NS;
        T* v_own = v_all + b * 3 * NS;
        T* ms = sc.msg + b * 4 * nf;
        T* mv = ms + nf;
        T* nrm = sc.nrm + b * nf;
        T* cpre = sc.cpre + b * nf;
        T* mix_own = upd_all + b * 11 * NS;  // N x 3 x [U | V] (S each)
        T* act_own = mix_own + 6 * NS;       // N x 3S
        T* nrm_own = act_own + 3 * NS;       // N x S
        T* cpre_own = nrm_own + NS;          // N x S
        T* s_out = sc.state + b * nf;
        T* v_out = b + 1 < d.blocks ? v_all + (b + 1) * 3 * NS : nullptr;  // own features

        if (b == 0) {  // phi from the element table, filter columns started (phase 0)
            wait_copies();
        } else {
            // phi hidden: h1 = s W1 + b1 (own columns), s the previous block's output.
            const T* s_in = sc.state + (b - 1) * nf;
            T* h1 = sc.h1 + (b - 1) * nf;
            load_w(ws, F, w + bl.w1, F, 1, S, own, w + bl.b1);
            sync();
            stage(xs, N, F, plain(s_in, F));
            dense(xs, ws, N, F, S, [&](int a, int j, T y) {
                h1[(size_t)a * F + f0 + j] = y + ws[F * S + j];
            });
            // phi = silu(h1) W2 + b2 (own columns of its three chunks: all this block reads
            // next, kept in shared memory), and the filter columns.
            load_w(ws, F, w + bl.w2, F3, 1, 3 * S, own, w + bl.b2);
            load_filter(w);
            sync();
            stage(xs, N, F, silu_in(h1, F));
            dense(xs, ws, N, F, 3 * S, [&](int a, int j, T y) { phi_own[a * 3 * S + j] = y + ws[F * 3 * S + j]; });
        }

        // Interaction, own features: ds_i = sum_j phi_s W_s, dv_i = sum_j phi_d W_d u + phi_v W_v v_j.
        for (int idx = tid; idx < 4 * NS; idx += nt) acc[idx] = T(0);
        for (int e0 = 0; e0 < E; e0 += edges_per_chunk) {
            const int count = min(edges_per_chunk, E - e0);
            stage_edges(e0, count);
            // Each thread takes feature t of a run of consecutive edges and sums in registers
            // while the receiving atom stays the same (lists are sorted by it): one set of
            // atomic adds per atom and run instead of per edge.
            const int t = tid % S, runs = nt / S, len = (count + runs - 1) / runs;
            const int lo = (tid / S) * len, hi = min(count, lo + len);
            int cur = -1;
            T a[4] = {T(0), T(0), T(0), T(0)};
            auto flush = [&]() {
                if (cur < 0) return;
                atomicAdd(acc + cur * S + t, a[0]);
                for (int k = 0; k < 3; ++k) atomicAdd(acc + NS + (cur * 3 + k) * S + t, a[1 + k]);
            };
            for (int el = lo; el < hi; ++el) {
                const int i = eij[2 * el], j = eij[2 * el + 1];
                if (i != cur) {
                    flush();
                    cur = i;
                    a[0] = a[1] = a[2] = a[3] = T(0);
                }
                const T* g = eb + el * ebw;
                T w0 = 0, w1 = 0, w2 = 0;
                for (int k = 0; k <= R; ++k) {
                    T fk[4];
                    ld4_shared(fw + (k * S + t) * 4, fk);
                    w0 += g[k] * fk[0];
                    w1 += g[k] * fk[1];
                    w2 += g[k] * fk[2];
                }
                const T* pj = phi_own + j * 3 * S + t;
                const T x1 = pj[S] * w1, x2 = pj[2 * S] * w2;
                a[0] += pj[0] * w0;
                for (int k = 0; k < 3; ++k) a[1 + k] += x1 * g[du + k] + x2 * v_own[j * 3 * S + k * S + t];
            }
            flush();
        }
        __syncthreads();
        for (int idx = tid; idx < NS; idx += nt) ms[(size_t)(idx / S) * F + f0 + idx % S] = s_own[idx] + acc[idx];
        for (int idx = tid; idx < 3 * NS; idx += nt) {
            const int r = idx / S, t = idx - r * S;  // r = 3a + k
            mv[(size_t)r * F + f0 + t] = v_own[idx / (3 * S) * 3 * S + (r % 3) * S + t] + acc[NS + idx];
        }
        // Mixing: [U | V] = v W_mix over 3N rows (own columns of both halves), |V|.
        load_w(ws, F, w + bl.mix, 2 * F, 1, 2 * S, own, (const T*)nullptr);
        sync();
        stage(xs, 3 * N, F, plain(mv, F));
        dense(xs, ws, 3 * N, F, 2 * S, [&](int r, int j, T y) { mix_own[r * 2 * S + j] = y; });
        for (int idx = tid; idx < NS; idx += nt) {
            const int a = idx / S, t = idx % S;
            nrm[(size_t)a * F + f0 + t] = nrm_own[idx] = norm3_eps(mix_own + a * 3 * 2 * S + S + t, 2 * S);
        }

        // Context: cpre = [s | |V|] C1 + c1.
        load_w(ws, 2 * F, w + bl.c1, F, 1, S, own, w + bl.cb1);
        sync();
        stage(xs, N, 2 * F, Rows<T>{ms, F, nrm, F});
        dense(xs, ws, N, 2 * F, S, [&](int a, int j, T y) {
            cpre[(size_t)a * F + f0 + j] = cpre_own[a * S + j] = y + ws[2 * F * S + j];
        });
        // a = silu(cpre) C2 + c2, then the gated update of own features.
        load_w(ws, F, w + bl.c2, F3, 1, 3 * S, own, w + bl.cb2);
        sync();
        stage(xs, N, F, silu_in(cpre, F));
        dense(xs, ws, N, F, 3 * S, [&](int a, int j, T y) { act_own[a * 3 * S + j] = y + ws[F * 3 * S + j]; });
        // The message sums of own features are still in acc (the interaction above).
        for (int idx = tid; idx < NS; idx += nt) {
            const int a = idx / S, t = idx % S;
            const T* aa = act_own + a * 3 * S + t;
            T dot = 0;
            for (int k = 0; k < 3; ++k) {
                const T* m = mix_own + (a * 3 + k) * 2 * S + t;
                const T mvv = v_own[a * 3 * S + k * S + t] + acc[NS + (a * 3 + k) * S + t];
                dot += m[0] * m[S];
                if (v_out) v_out[(a * 3 + k) * S + t] = mvv + m[0] * aa[S];
            }
            s_out[(size_t)a * F + f0 + t] = s_own[idx] = s_own[idx] + acc[idx] + aa[0] + aa[2 * S] * dot;
        }
    }

    // Readout: ro = s R1 + r1 over this block's columns o = c, c + G, ...; partial energies,
    // and the first adjoint: dE/d(ro) = w_out silu'(ro).
    const T* s_last = sc.state + (d.blocks - 1) * nf;
    const int ro_cols = max(0, (H2 - c + d.groups - 1) / d.groups);
    const Cols ro_col{1, d.groups, c};
    load_w(ws, F, ro_w, H2, 1, ro_cols, ro_col, (const T*)nullptr);
    sync();
    stage(xs, N, F, plain(s_last, F));
    for (int a = tid; a < N; a += nt) eacc[a] = T(0);
    dense(xs, ws, N, F, ro_cols, [&](int a, int j, T y) {
        const int o = ro_col(j);
        const T z = y + ro_b[o];
        atomicAdd(eacc + a, silu_of(z) * ro_out[o]);
        sc.gh[(size_t)a * H2 + o] = ro_out[o] * silu_grad(z);
    });
    for (int a = tid; a < N; a += nt)
        atomicAdd(energies + a, eacc[a] + (c == 0 ? atom_const[species[a]] : T(0)));
    // dE/ds = g_ro R1^T (own features); dE/dv = 0. Both stay in shared memory from here on.
    load_w(ws, H2, ro_w, 1, H2, S, own, (const T*)nullptr);
    sync();
    stage(xs, N, H2, plain(sc.gh, H2));
    for (int idx = tid; idx < 3 * NS; idx += nt) gv_own[idx] = T(0);
    for (int idx = tid; idx < 4 * E; idx += nt) gedge[idx] = T(0);
    dense(xs, ws, N, H2, S, [&](int a, int j, T y) { gs_own[a * S + j] = y; });

    for (int b = d.blocks - 1; b >= 0; --b) {
        const T* w = blocks_w + b * bl.stride;
        const T* phi_own = phi_all + b * 3 * NS;
        const T* v_own = v_all + b * 3 * NS;
        const T* mix_own = upd_all + b * 11 * NS;
        const T* act_own = mix_own + 6 * NS;
        const T* nrm_own = act_own + 3 * NS;
        const T* cpre_own = nrm_own + NS;

        // Gated update, own features: gradients of a, of [U | V] (before |V|'s share).
        for (int idx = tid; idx < NS; idx += nt) {
            const int a = idx / S, t = idx - a * S, f = f0 + t;
            const T* aa = act_own + a * 3 * S + t;
            const T g_s = gs_own[idx];
            T dot = 0, g_avv = 0;
            for (int k = 0; k < 3; ++k) {
                const T* m = mix_own + (a * 3 + k) * 2 * S + t;
                dot += m[0] * m[S];
                g_avv += gv_own[(a * 3 + k) * S + t] * m[0];
            }
            T* g_a = sc.ga + (size_t)a * F3 + f;
            g_a[0] = g_s;
            g_a[F] = g_avv;
            g_a[2 * F] = g_s * dot;
            const T g_dot = g_s * aa[2 * S];
            for (int k = 0; k < 3; ++k) {
                const T* m = mix_own + (a * 3 + k) * 2 * S + t;
                T* gm = sc.gmixed + ((size_t)a * 3 + k) * 2 * F + f;
                gm[0] = gv_own[(a * 3 + k) * S + t] * aa[S] + g_dot * m[S];
                gm[F] = g_dot * m[0];
            }
        }
        // Context network, output layer: g_cpre = (g_a C2^T) silu'(cpre), own columns.
        load_w(ws, F3, w + bl.c2, 1, F3, S, own, (const T*)nullptr);
        sync();
        stage(xs, N, F3, plain(sc.ga, F3));
        dense(xs, ws, N, F3, S, [&](int a, int j, T y) {
            sc.gcpre[(size_t)a * F + f0 + j] = y * silu_grad(cpre_own[a * S + j]);
        });
        // Its input layer: gradients of s (own) and of |V|, which feeds V.
        load_w(ws, F, w + bl.c1, 1, F, 2 * S, own, (const T*)nullptr);
        sync();
        stage(xs, N, F, plain(sc.gcpre, F));
        dense(xs, ws, N, F, 2 * S, [&](int a, int j, T y) {
            if (j < S) {
                gs_own[a * S + j] += y;
                return;
            }
            const int t = j - S;
            const T inv = y / nrm_own[a * S + t];
            for (int k = 0; k < 3; ++k)
                sc.gmixed[((size_t)a * 3 + k) * 2 * F + F + f0 + t] += inv * mix_own[(a * 3 + k) * 2 * S + S + t];
        });
        // Mixing: g_v += g_[U|V] W_mix^T (own features), the U and V halves in turn so that
        // the staged input stays 3N x F.
        for (int h = 0; h < 2; ++h) {
            load_w(ws, F, w + bl.mix + h * F, 1, 2 * F, S, own, (const T*)nullptr);
            if (h == 0) {
                load_filter(w);
                sync();
            }
            stage(xs, 3 * N, F, plain(sc.gmixed + h * F, 2 * F));
            dense(xs, ws, 3 * N, F, S, [&](int r, int j, T y) { gv_own[r * S + j] += y; });
        }

        // Interaction adjoint, own features: gradients of phi_j and v_j (shared-memory
        // accumulators), and this block's share of each edge's dE/dd and dE/du.
        for (int idx = tid; idx < 6 * NS; idx += nt) acc[idx] = T(0);
        for (int e0 = 0; e0 < E; e0 += edges_per_chunk) {
            const int count = min(edges_per_chunk, E - e0);
            stage_edges(e0, count);
            for (int base = 0; base < count * S; base += nt) {  // uniform: lanes shuffle below
                const int item = base + tid;
                const bool valid = item < count * S;
                const int el = valid ? item / S : 0, t = tid % S;
                const int i = eij[2 * el], j = eij[2 * el + 1];
                const T* g = eb + el * ebw;
                T w0 = 0, w1 = 0, w2 = 0, dw0 = 0, dw1 = 0, dw2 = 0;
                for (int k = 0; k <= R; ++k) {
                    T fk[4];
                    ld4_shared(fw + (k * S + t) * 4, fk);
                    const T gk = g[k], dk = g[R + 1 + k];
                    w0 += gk * fk[0];
                    w1 += gk * fk[1];
                    w2 += gk * fk[2];
                    dw0 += dk * fk[0];
                    dw1 += dk * fk[1];
                    dw2 += dk * fk[2];
                }
                const T* pj = phi_own + j * 3 * S + t;
                const T p0 = pj[0], p1 = pj[S], p2 = pj[2 * S];
                T gvi[3], gx1 = 0, gx2 = 0;
                for (int k = 0; k < 3; ++k) {
                    gvi[k] = valid ? gv_own[(i * 3 + k) * S + t] : T(0);
                    gx1 += gvi[k] * g[du + k];
                    gx2 += gvi[k] * v_own[j * 3 * S + k * S + t];
                }
                const T gx0 = valid ? gs_own[i * S + t] : T(0);
                if (valid) {
                    atomicAdd(acc + (j * 3 + 0) * S + t, gx0 * w0);
                    atomicAdd(acc + (j * 3 + 1) * S + t, gx1 * w1);
                    atomicAdd(acc + (j * 3 + 2) * S + t, gx2 * w2);
                    for (int k = 0; k < 3; ++k)
                        atomicAdd(acc + 3 * NS + (j * 3 + k) * S + t, gvi[k] * p2 * w2);
                }
                // Sums over own features: dE/dd through the filter, dE/du = g_v_i phi_d W_d.
                const T x1 = p1 * w1;
                T v[4] = {gx0 * p0 * dw0 + gx1 * p1 * dw1 + gx2 * p2 * dw2, gvi[0] * x1,
                          gvi[1] * x1, gvi[2] * x1};
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    for (int o = S / 2; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
                if (valid && t == 0)
#pragma unroll
                    for (int k = 0; k < 4; ++k) gedge[(e0 + el) * 4 + k] += v[k];
            }
        }
        __syncthreads();
        for (int idx = tid; idx < 3 * NS; idx += nt) {
            const int a = idx / (3 * S), j = idx - a * 3 * S;  // j = k S + t
            sc.gphi[(size_t)a * F3 + own(j)] = acc[idx];
            gv_own[idx] += acc[3 * NS + idx];
        }
        if (b == 0) break;  // the first block's state is the embedding
        // phi network: g_h1 = (g_phi W2^T) silu'(h1), then g_s += g_h1 W1^T.
        const T* h1 = sc.h1 + (b - 1) * nf;
        load_w(ws, F3, w + bl.w2, 1, F3, S, own, (const T*)nullptr);
        sync();
        stage(xs, N, F3, plain(sc.gphi, F3));
        dense(xs, ws, N, F3, S, [&](int a, int j, T y) {
            const size_t o = (size_t)a * F + f0 + j;
            sc.gh[o] = y * silu_grad(h1[o]);
        });
        load_w(ws, F, w + bl.w1, 1, F, S, own, (const T*)nullptr);
        sync();
        stage(xs, N, F, plain(sc.gh, F));
        dense(xs, ws, N, F, S, [&](int a, int j, T y) { gs_own[a * S + j] += y; });
    }
    for (int idx = tid; idx < 4 * E; idx += nt) atomicAdd(edge_grad + idx, gedge[idx]);
    sync();

    // Forces = -dE/dx from each edge's dE/dd and dE/du.
    for (int e = c * nt + tid; e < E; e += d.groups * nt) {
        T g[4];
        for (int k = 0; k < 4; ++k) g[k] = ld(edge_grad + (size_t)e * 4 + k);
        T r[3], gr[3];
        const T dist = edge_vector(pos, off, ci, nj, e, r);
        grad_r(g[0], g + 1, r, dist, gr);
        const int i = ci[e], j = nj[e];
        for (int k = 0; k < 3; ++k) {
            atomicAdd(forces + 3 * j + k, -gr[k]);
            atomicAdd(forces + 3 * i + k, gr[k]);
        }
    }
    stamps.mark();
    // The last block out finishes an MD step (every block's forces added by then) and resets
    // the barrier for the next launch: every block has passed its last barrier by the time it
    // arrives here.
    if (last_block_out(counter, reinterpret_cast<int*>(smem_raw)) && md.on)
        md.finish(forces, energies, N);
}

// Plain calls pass float inputs for the MD slots, which they leave unread. The shipped
// model's shapes (F = 128 with 8 or 2 features a block, 20 basis functions) and F = 64 with
// one feature a block have entries of their own, so that ptxas allocates each one's registers
// alone (the one entry that held all three spilled 1,176 bytes a thread in f32; the 8-feature
// instantiation alone spills 324, the F = 64 one 152 against the generic one's 260).
#define SMALL_SYSTEM(T, NAME, F_, S_, R_)                                                      \
    extern "C" __global__ void __launch_bounds__(512) NAME(                                    \
        const T* pos, const T* off, const T* wts, const double* md_x, const double* md_v,     \
        const double* md_f, const double* md_hk, const double* md_xi, const double* md_scale, \
        const double* md_reference, double* md_out, const unsigned int* sp,                    \
        const unsigned int* ci, const unsigned int* nj, const unsigned int* bar, T* out,       \
        size_t n, size_t e, size_t f, size_t r, size_t blocks, size_t groups, size_t n_el,     \
        size_t xs_len, size_t eb_edges, size_t stamps, size_t step, size_t langevin,           \
        double cutoff, double dt, double c1) {                                                 \
        const Dims d{(int)n,        (int)e,      (int)f,           (int)r,                     \
                     (int)blocks,   (int)groups, (int)n_el,        (int)xs_len,                \
                     (int)eb_edges, (int)stamps, (int)(f / groups), (int)(f / 2)};             \
        const MdStep md{md_x,   md_v, md_f, md_hk,     md_xi,         md_scale, md_reference,  \
                        md_out, dt,   c1,   step != 0, langevin != 0};                         \
        feature_split<T, F_, S_, R_>(pos, off, wts, sp, ci, nj, bar, out, d, cutoff, md);       \
    }
SMALL_SYSTEM(float, feature_split_f32, 0, 0, 0)
SMALL_SYSTEM(float, feature_split_128x8_f32, 128, 8, 20)
SMALL_SYSTEM(float, feature_split_128x2_f32, 128, 2, 20)
SMALL_SYSTEM(float, feature_split_64x1_f32, 64, 1, 20)
SMALL_SYSTEM(double, feature_split_f64, 0, 0, 0)
SMALL_SYSTEM(double, feature_split_128x8_f64, 128, 8, 20)
SMALL_SYSTEM(double, feature_split_128x2_f64, 128, 2, 20)
SMALL_SYSTEM(double, feature_split_64x1_f64, 64, 1, 20)
