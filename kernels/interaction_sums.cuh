// The interaction's forward as sums per receiving atom, on tensor cores (f32). Included by
// kernels/interaction_tile.cu after interaction_tc.cuh; not compiled on its own.
//
// The filter is linear in the basis, w_p(r_ij)[f] = Σ_k β_k(r_ij) W_p[k, f] (β: the R + 1
// basis columns with the cutoff, W: the block's filter weights), so an atom's messages are
//   ds_i[f]    = Σ_k W_s[k, f] Y_s[k, f],         Y_s[k, f]    = Σ_j β_k x_s,j[f]
//   dv_i[a][f] = Σ_k W_v[k, f] Y_v[k, a, f]       Y_v[k, a, f] = Σ_j β_k x_v,j[f] v_j[a][f]
//              + Σ_k W_d[k, f] Y_d[k, a, f],      Y_d[k, a, f] = Σ_j β_k u_ij[a] x_d,j[f]
// (x_p = φ_p + bias, the sender's context). The Y are products over the atom's edges,
// [features, edges] x [edges, basis columns]: mma.m16n8k8 in split TF32 (three products per
// value pair, each value held to ~2^-20) with the gathered features (times v_j[a] or u_ij[a])
// as A and β as B, so that no per-edge, per-feature arithmetic is left but forming A; the
// weights are applied once per atom instead of once per edge.
//
// A block of RS_WARPS warps owns an equal range of edges and 128 features (blockIdx.y); warp w
// owns features [16 w, + 16) of that chunk (the mma's m rows: row g is feature g, row g + 8
// feature g + 8) and walks the range in steps of up to 8 edges of one receiver (the mma's k;
// lane (g, t) reads edges t and t + 4), issuing the next step's loads before a step's
// products. Receivers and senders come 32 edges at a time (a window, one edge per lane, the
// next window loaded ahead). At each change of receiver the sums become messages, added to
// out atomically: any order of edges is right, and runs of one receiver (lists sorted by it,
// as neighbour lists are) make it fast. Edges beyond the cutoff (padding) add nothing and are
// skipped where a step would start with them. The warps of a block read the same edges,
// which come from L1; one barrier, after the weights are staged. Offsets are 32-bit, as in
// interaction_tc.cuh (the host checks).
#pragma once

#define RS_WARPS 8
#define RS_THREADS (32 * RS_WARPS)
// Row stride of the staged weights, one row per basis row k: lanes (g, t) reading rows 2 t and
// features g hit 32 different banks.
#define RS_WS (3 * TILE_F + 4)

// Edges [w, w + 32) of the block's range, one per lane: receiver, sender, and whether the edge
// is inside the cutoff (its basis not all zero; edges beyond it, padding included, add
// nothing and are skipped where a step would start with them).
struct RsWindow {
    unsigned c, j;
    bool live;
    __device__ __forceinline__ void load(const unsigned* __restrict__ ci,
                                         const unsigned* __restrict__ nj,
                                         const float* __restrict__ basis, unsigned w,
                                         unsigned end, unsigned bw, unsigned nb,
                                         unsigned lane) {
        const unsigned e = w + lane;
        const bool in = e < end;
        c = in ? __ldg(ci + e) : NO_ATOM;
        j = in ? __ldg(nj + e) : 0;
        live = in && __ldg(basis + e * bw + nb - 1) != 0.f;  // the cutoff column
    }
};

// One mma k step: up to 8 consecutive edges of one receiving atom; lane (g, t) takes edges t
// and t + 4 (e0, e1; v0, v1: used). atom == NO_ATOM: the range is done.
struct RsStep {
    unsigned atom, e0, e1, j0, j1;
    bool v0, v1;
};

// The block's edge range as steps: runs of one receiver, cut at 8 edges and at window ends.
struct RsWalk {
    const unsigned *ci, *nj;
    const float* basis;
    unsigned w, end, s, bw, nb, lane;
    RsWindow cur, next;  // next: the window after cur, loaded ahead
    __device__ __forceinline__ RsWalk(const unsigned* ci_, const unsigned* nj_,
                                      const float* basis_, unsigned begin, unsigned end_,
                                      unsigned bw_, unsigned nb_, unsigned lane_)
        : ci(ci_), nj(nj_), basis(basis_), w(begin), end(end_), s(0), bw(bw_), nb(nb_),
          lane(lane_) {
        cur.load(ci, nj, basis, w, end, bw, nb, lane);
        next.load(ci, nj, basis, w + 32, end, bw, nb, lane);
    }
    __device__ __forceinline__ RsStep step() {
        const unsigned t = lane % 4;
        for (;;) {
            if (s >= 32) {
                w += 32;
                cur = next;
                next.load(ci, nj, basis, w + 32, end, bw, nb, lane);
                s = 0;
            }
            RsStep st;
            st.atom = NO_ATOM;
            if (w + s >= end) return st;
            const unsigned live = __ballot_sync(0xffffffffu, cur.live) & (0xffffffffu << s);
            if (!live) {
                s = 32;
                continue;
            }
            s = __ffs(live) - 1;
            const unsigned atom = __shfl_sync(0xffffffffu, cur.c, s);
            const unsigned from = __ballot_sync(0xffffffffu, cur.c == atom) >> s;
            const unsigned len = ~from ? __ffs(~from) - 1 : 32;
            const unsigned k = min(8u, len);
            const unsigned j_first = __shfl_sync(0xffffffffu, cur.j, s);
            const unsigned j0 = __shfl_sync(0xffffffffu, cur.j, min(s + t, 31u));
            const unsigned j1 = __shfl_sync(0xffffffffu, cur.j, min(s + t + 4, 31u));
            st.atom = atom;
            st.v0 = t < k;
            st.v1 = t + 4 < k;
            st.e0 = w + s + t;
            st.e1 = w + s + t + 4;
            st.j0 = st.v0 ? j0 : j_first;  // unused edges read a used one's sender
            st.j1 = st.v1 ? j1 : j_first;
            s += k;
            return st;
        }
    }
};

// A step's loads of one lane: β (zero for unused edges: they add nothing), unit vectors, and
// the senders' context and vector features of rows g and g + 8 (fragment order (row g, edge
// t), (g + 8, t), (g, t + 4), (g + 8, t + 4)).
template <int NK>
struct RsLoads {
    float b0[NK], b1[NK], u0[3], u1[3], x[3][4], vec[3][4];
};

template <int NK, int FC>
struct RsWarp {
    const float *phi_a, *vec_a;  // φ and the first vector row at feature row g
    float* sw;                   // staged weights [8 NK][RS_WS]
    unsigned f, n, nf, nb, bw, fl;
    int db;  // row g + 8's offset from row g (negative where g + 8 is past f: not stored)
    unsigned lane, g, t, fa;
    bool act_a, act_b;
    float bias[3][2];

    __device__ __forceinline__ void issue(RsLoads<NK>& l, const RsStep& st,
                                          const float* __restrict__ basis) const {
#pragma unroll
        for (int q = 0; q < NK; ++q) {
            const unsigned col = 8 * q + g;
            l.b0[q] = st.v0 && col < nb ? __ldg(basis + st.e0 * bw + col) : 0.f;
            l.b1[q] = st.v1 && col < nb ? __ldg(basis + st.e1 * bw + col) : 0.f;
        }
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            l.u0[a] = st.v0 ? __ldg(basis + st.e0 * bw + nb + a) : 0.f;
            l.u1[a] = st.v1 ? __ldg(basis + st.e1 * bw + nb + a) : 0.f;
        }
        const float *p0 = phi_a + st.j0 * 3 * f, *p1 = phi_a + st.j1 * 3 * f;
#pragma unroll
        for (int p = 0; p < 3; ++p) fragment(p0, p1, p * f, l.x[p]);
        const float *q0 = vec_a + st.j0 * f, *q1 = vec_a + st.j1 * f;
#pragma unroll
        for (int a = 0; a < 3; ++a) fragment(q0, q1, a * nf, l.vec[a]);
    }
    // Rows g and g + 8 at offset o of the two edges' sender rows r0, r1, in fragment order.
    __device__ __forceinline__ void fragment(const float* r0, const float* r1, unsigned o,
                                             float v[4]) const {
        v[0] = __ldg(r0 + o);
        v[1] = __ldg(r0 + o + db);
        v[2] = __ldg(r1 + o);
        v[3] = __ldg(r1 + o + db);
    }

    // acc[0, NK): Y_s; [NK (1 + a), + NK): Y_v[a]; [NK (4 + a), + NK): Y_d[a].
    __device__ __forceinline__ void accumulate(float acc[][4], const RsLoads<NK>& l) const {
        unsigned bh[NK][2], bl[NK][2], ah[4], al[4];
#pragma unroll
        for (int q = 0; q < NK; ++q) {
            split_tf32(l.b0[q], bh[q][0], bl[q][0]);
            split_tf32(l.b1[q], bh[q][1], bl[q][1]);
        }
        auto add = [&](const float a[4], int first) {
#pragma unroll
            for (int r = 0; r < 4; ++r) split_tf32(a[r], ah[r], al[r]);
            // Products outer: NK independent accumulators between dependent mma.
#pragma unroll
            for (int q = 0; q < NK; ++q) mma_tf32(acc[first + q], al, bh[q]);
#pragma unroll
            for (int q = 0; q < NK; ++q) mma_tf32(acc[first + q], ah, bl[q]);
#pragma unroll
            for (int q = 0; q < NK; ++q) mma_tf32(acc[first + q], ah, bh[q]);
        };
        float a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = l.x[0][r] + bias[0][r % 2];
        add(a, 0);
#pragma unroll
        for (int d = 0; d < 3; ++d) {
#pragma unroll
            for (int r = 0; r < 4; ++r) a[r] = (l.x[2][r] + bias[2][r % 2]) * l.vec[d][r];
            add(a, NK * (1 + d));
        }
#pragma unroll
        for (int d = 0; d < 3; ++d) {
#pragma unroll
            for (int r = 0; r < 4; ++r)
                a[r] = (l.x[1][r] + bias[1][r % 2]) * (r < 2 ? l.u0[d] : l.u1[d]);
            add(a, NK * (4 + d));
        }
    }

    // The atom's messages from its sums: the weights once (lane (g, t) holds basis rows
    // 8 q + 2 t and + 1 of feature rows g and g + 8), summed over the 4 lanes of a row and
    // added to out; the sums are zeroed.
    __device__ __forceinline__ void finish(float acc[][4], float* __restrict__ out,
                                           unsigned atom) const {
        float m[2][4] = {};  // [row][s, v_x, v_y, v_z]
#pragma unroll
        for (int q = 0; q < NK; ++q) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float* w = sw + (8 * q + 2 * t + h) * RS_WS + fl;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float ws = w[8 * r], wd = w[TILE_F + 8 * r], wv = w[2 * TILE_F + 8 * r];
                    const int o = 2 * r + h;  // the accumulator slot of (row, column)
                    m[r][0] += ws * acc[q][o];
#pragma unroll
                    for (int d = 0; d < 3; ++d)
                        m[r][1 + d] += wv * acc[NK * (1 + d) + q][o] + wd * acc[NK * (4 + d) + q][o];
                }
            }
        }
#pragma unroll
        for (int q = 0; q < 7 * NK; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int o = 0; o < 4; ++o) {
                m[r][o] += __shfl_xor_sync(0xffffffffu, m[r][o], 1);
                m[r][o] += __shfl_xor_sync(0xffffffffu, m[r][o], 2);
            }
        // Lane t adds output row t (s, v_x, v_y, v_z) of both features: the atom's edges may
        // be split over blocks (and runs), so added atomically.
        const float sa = t == 0 ? m[0][0] : t == 1 ? m[0][1] : t == 2 ? m[0][2] : m[0][3];
        const float sb = t == 0 ? m[1][0] : t == 1 ? m[1][1] : t == 2 ? m[1][2] : m[1][3];
        float* o = out + (t * n + atom) * f + fa;
        if (act_a) atomicAdd(o, sa);
        if (act_b) atomicAdd(o + db, sb);
    }
};

// NK: basis k tiles of 8 (R + 1 <= 8 NK). FC: features (TILE_F at compile time, else 0).
// out = the state, the messages added. Blocks own equal ranges of edges; an atom whose edges
// span ranges gets each range's share.
template <int NK, int FC>
__device__ void rs_fwd(const float* __restrict__ phi, const float* __restrict__ pb,
                       const float* __restrict__ wt, const float* __restrict__ basis,
                       const float* __restrict__ sv, const unsigned* __restrict__ ci,
                       const unsigned* __restrict__ nj, float* __restrict__ out,
                       unsigned n_edges, unsigned f_, unsigned n, unsigned nb) {
    extern __shared__ __align__(16) unsigned char sums_smem[];
    RsWarp<NK, FC> wp;
    wp.sw = reinterpret_cast<float*>(sums_smem);
    wp.f = FC ? FC : f_;
    const unsigned f = wp.f, cb = blockIdx.y * TILE_F;
    // The block's weights, [8 NK][3 TILE_F] (zero past nb and f).
    for (unsigned k = threadIdx.x; k < 8 * NK * 3 * TILE_F; k += RS_THREADS) {
        const unsigned r = k / (3 * TILE_F), col = k % (3 * TILE_F);
        const unsigned p = col / TILE_F, c = cb + col % TILE_F;
        wp.sw[r * RS_WS + col] = r < nb && c < f ? wt[r * 3 * f + p * f + c] : 0.f;
    }
    __syncthreads();
    wp.lane = threadIdx.x % 32;
    wp.g = wp.lane / 4;
    wp.t = wp.lane % 4;
    const unsigned c0 = cb + (threadIdx.x / 32) * 16;
    if (c0 >= f) return;
    wp.n = n;
    wp.nf = n * f;
    wp.nb = nb;
    wp.bw = nb + 3;
    wp.fa = c0 + wp.g;
    wp.fl = c0 - cb + wp.g;
    wp.act_a = wp.fa < f;
    wp.act_b = wp.fa + 8 < f;
    // Inactive rows read feature c0 (in range) and are never stored.
    const unsigned ra = wp.act_a ? wp.fa : c0, rb = wp.act_b ? wp.fa + 8 : c0;
    wp.db = FC ? 8 : (int)rb - (int)ra;
    wp.phi_a = phi + ra;
    wp.vec_a = sv + wp.nf + ra;
#pragma unroll
    for (int p = 0; p < 3; ++p) wp.bias[p][0] = pb[p * f + ra], wp.bias[p][1] = pb[p * f + rb];
    const unsigned per = (n_edges + gridDim.x - 1) / gridDim.x;
    const unsigned begin = min(n_edges, blockIdx.x * per), end = min(n_edges, begin + per);
    RsWalk walk(ci, nj, basis, begin, end, wp.bw, nb, wp.lane);
    float acc[7 * NK][4];
#pragma unroll
    for (int q = 0; q < 7 * NK; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
    unsigned atom = NO_ATOM;  // whose sums acc holds
    RsStep st = walk.step();
    RsLoads<NK> cur;
    if (st.atom != NO_ATOM) wp.issue(cur, st, basis);
    while (st.atom != NO_ATOM) {
        // The next step's loads go out before this step's products.
        const RsStep nx = walk.step();
        RsLoads<NK> ahead;
        if (nx.atom != NO_ATOM) wp.issue(ahead, nx, basis);
        if (st.atom != atom) {
            if (atom != NO_ATOM) wp.finish(acc, out, atom);
            atom = st.atom;
        }
        wp.accumulate(acc, cur);
        st = nx;
        cur = ahead;
    }
    if (atom != NO_ATOM) wp.finish(acc, out, atom);
}

// interaction_tile_fwd's arguments and output; blocks of RS_THREADS threads with the weights
// of their 128 features in shared memory (8 NK rows of RS_WS).
extern "C" __global__ void __launch_bounds__(RS_THREADS, 1) interaction_sums_fwd_f32(
    const float* phi, const float* pb, const float* w, const float* basis, const float* sv,
    const unsigned int* ci, const unsigned int* nj, float* out, size_t n_edges, size_t f,
    size_t n, size_t n_rbf) {
    const unsigned nb = n_rbf + 1;
#define RS_CASE(K)                                                                            \
    if (f == TILE_F)                                                                          \
        rs_fwd<K, TILE_F>(phi, pb, w, basis, sv, ci, nj, out, n_edges, f, n, nb);             \
    else                                                                                      \
        rs_fwd<K, 0>(phi, pb, w, basis, sv, ci, nj, out, n_edges, f, n, nb);
    if (nb <= 8) {
        RS_CASE(1)
    } else if (nb <= 16) {
        RS_CASE(2)
    } else {
        RS_CASE(3)
    }
#undef RS_CASE
}
