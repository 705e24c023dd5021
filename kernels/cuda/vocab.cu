// kernels/cuda/vocab.cu: the vocabulary-row ops on CUDA — softmax with temperature / top-k /
// top-p, argmax, top-k lists, entropy, Σ min(p, q), and the draft→target vocabulary scatter.
// Math, tie rules and shapes: ds/kernel_args.h; the CPU twins are kernels/ref/vocab_ref.c.
//
// Layout: one row = one distribution over V entries (V up to 201,088), rows packed (rows, V).
//
// Work split (every op but the scatter): ONE THREAD-BLOCK CLUSTER OF VCL = 8 BLOCKS PER ROW
// (sm_90 clusters; grid (VCL, rows), rows beyond 65,535 loop). A row is cut into VCL chunks by V
// alone (chunk c = [c·per, (c+1)·per), per = ceil(V / VCL) rounded up to 8); block c owns chunk
// c. Inside a chunk, 8-entry groups go to threads round-robin: thread i owns groups i, i + VT, ...
// (one 16-byte load per group for bf16, two for f32, VU groups in flight). Every pass over a row
// visits a thread's entries in increasing id, so each thread only ever reads back the entries it
// wrote itself (the staged softmax row needs no barrier). Block partials go through the fixed
// block trees of common.cuh, then through distributed shared memory: after a cluster barrier each
// block reads the VCL block partials in rank order, so every block holds the same row total.
// The chunking, the thread of each entry and every tree depend on V only: batch invariant, and
// the same bits whatever the other rows hold.
//
// Kernels (names <act>_<op>):
//   <a>_softmax        pass 1: z = x / temperature staged in the output row, cluster max;
//                      top-k: radix select of the k-th largest z (4 passes of 8-bit digits over
//                      the order-preserving key), entries below cut to −inf, ties at the cut-off
//                      kept by increasing id (tie counts per block → cluster prefix → an ordered
//                      block scan per window); Σ e^{z−m} in double; p = e^{z−m}/Σ; top-p: radix
//                      select of the cut-off by MASS — masses are 64-bit fixed point (p·2^62,
//                      exact for p >= 2^-40), so the histograms are exact and order-free — ties
//                      by increasing id, then renormalise in double.
//   <a>_argmax         per-thread best (NaN skipped, ties to the lower id), block and cluster
//                      reductions under the same total order: the result is order independent.
//   <a>_topk           radix select of the k-th largest key (NaN skipped), ordered tie scan, each
//                      block's winners (<= k) gathered by rank 0 and sorted by (value desc, id asc).
//   f32_entropy, f32_overlap   double sums, fixed block and cluster trees.
//   <a>_vocab_fill, <a>_vocab_scatter   two elementwise kernels (fill, then the mapped copy).
//
// Radix histograms: one private 256-bin histogram per warp; in each round the lanes holding the
// same digit elect a leader (match.any), which adds the group's count or mass to its warp's bin.
// Leaders of one round own distinct bins, so no atomics (a 64-bit shared atomic add is a
// compare-and-swap loop, which collapses when a whole row falls into a few exponent bins).
//
// Numerics against the reference: the staged z is bitwise the reference's (IEEE float division
// equals the reference's double division rounded to float); exponentials and sums are in double,
// so probabilities agree to an ulp or two (the sums differ only in summation order).
//
// Device-side maps (overlap, vocab_scatter) are trusted: an entry outside its range is skipped.
#include <cooperative_groups.h>

#include "common.cuh"
#include "ds/kernels_cuda.h"

namespace cg = cooperative_groups;

#define VCL 8                   // blocks (SMs) per row: a portable cluster size
#define VT 512                  // threads per block
#define VWARPS (VT / DS_WARP)
#define VG 8                    // entries per group
#define VU 4                    // groups in flight per thread
#define VMAX_GRID_ROWS 65535    // grid.y limit; more rows loop
#define RADIX_BINS 256
#define FP_ONE 0x1p62 // fixed-point scale of probability masses

// ---------------------------------------------------------------------------------------------
// Row chunks and group loads

// This block's chunk [lo, hi) of a row of V entries: ng groups, nw windows of VT groups.
struct vchunk {
    int lo, hi, ng, nw;
};

static __device__ __forceinline__ struct vchunk vchunk_of(int V) {
    const long long per = ((long long)V + VCL - 1) / VCL;
    const long long per8 = (per + VG - 1) / VG * VG;
    struct vchunk c;
    c.lo = (int)min((long long)V, (long long)blockIdx.x * per8);
    c.hi = (int)min((long long)V, (long long)c.lo + per8);
    c.ng = (c.hi - c.lo + VG - 1) / VG;
    c.nw = (c.ng + VT - 1) / VT;
    return c;
}

static __device__ __forceinline__ bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

// Group gi of the chunk into v[0 .. n), returns n (0 when gi is past the chunk). `vec`: the row
// starts 16-byte aligned, so a full group is one (bf16) or two (f32) vector loads.
static __device__ __forceinline__ int vload(const float *row, const struct vchunk &c, int gi,
                                            bool vec, float v[VG]) {
    if (gi >= c.ng) return 0;
    const int e0 = c.lo + gi * VG, n = min(VG, c.hi - e0);
    if (vec && n == VG) {
        const float4 a = *(const float4 *)(row + e0), b = *(const float4 *)(row + e0 + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < VG; j++) v[j] = j < n ? row[e0 + j] : 0.0f;
    }
    return n;
}
static __device__ __forceinline__ int vload(const ds_bf16 *row, const struct vchunk &c, int gi,
                                            bool vec, float v[VG]) {
    if (gi >= c.ng) return 0;
    const int e0 = c.lo + gi * VG, n = min(VG, c.hi - e0);
    if (vec && n == VG) {
        const uint4 u = *(const uint4 *)(row + e0);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) { // little endian: the lower half is the lower id
            v[2 * j] = ds_bf16_to_f32((ds_bf16)(w[j] & 0xffffu));
            v[2 * j + 1] = ds_bf16_to_f32((ds_bf16)(w[j] >> 16));
        }
    } else {
#pragma unroll
        for (int j = 0; j < VG; j++) v[j] = j < n ? ds_bf16_to_f32(row[e0 + j]) : 0.0f;
    }
    return n;
}

static __device__ __forceinline__ void vstore(float *row, const struct vchunk &c, int gi,
                                              bool vec, const float v[VG], int n) {
    if (n <= 0) return;
    const int e0 = c.lo + gi * VG;
    if (vec && n == VG) {
        *(float4 *)(row + e0) = make_float4(v[0], v[1], v[2], v[3]);
        *(float4 *)(row + e0 + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int j = 0; j < VG; j++)
            if (j < n) row[e0 + j] = v[j];
    }
}

// Id of entry j of group gi.
static __device__ __forceinline__ int vid(const struct vchunk &c, int gi, int j) {
    return c.lo + gi * VG + j;
}

// Calls f(id, value) on this thread's entries of the chunk in increasing id, VU groups in flight.
template <typename TV, typename F>
static __device__ __forceinline__ void for_each_entry(const TV *row, const struct vchunk &c,
                                                      bool vec, F f) {
    for (int w0 = 0; w0 < c.nw; w0 += VU) {
        float v[VU][VG];
        int n[VU];
#pragma unroll
        for (int u = 0; u < VU; u++) n[u] = vload(row, c, (w0 + u) * VT + threadIdx.x, vec, v[u]);
#pragma unroll
        for (int u = 0; u < VU; u++)
#pragma unroll
            for (int j = 0; j < VG; j++)
                if (j < n[u]) f(vid(c, (w0 + u) * VT + threadIdx.x, j), v[u][j]);
    }
}

// Rewrites this thread's entries of a float row in place: f(id, &value), in increasing id.
template <typename F>
static __device__ __forceinline__ void update_entries(float *row, const struct vchunk &c,
                                                      bool vec, F f) {
    for (int w0 = 0; w0 < c.nw; w0 += VU) {
        float v[VU][VG];
        int n[VU];
#pragma unroll
        for (int u = 0; u < VU; u++) n[u] = vload(row, c, (w0 + u) * VT + threadIdx.x, vec, v[u]);
#pragma unroll
        for (int u = 0; u < VU; u++) {
#pragma unroll
            for (int j = 0; j < VG; j++)
                if (j < n[u]) f(vid(c, (w0 + u) * VT + threadIdx.x, j), &v[u][j]);
            vstore(row, c, (w0 + u) * VT + threadIdx.x, vec, v[u], n[u]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster reductions. Each ends with a cluster barrier after its remote reads, so a block never
// leaves (or rewrites its slot) while another still reads it. Every thread must call them.

static __device__ __forceinline__ unsigned vrank(void) { return cg::this_cluster().block_rank(); }

// Row sum of per-thread doubles: block tree, then the VCL block sums in rank order.
static __device__ double cl_sum_d(double v, double *scratch, double *slot) {
    cg::cluster_group cl = cg::this_cluster();
    v = block_sum_d(v, scratch);
    if (threadIdx.x == 0) *slot = v;
    cl.sync();
    double s = 0.0;
#pragma unroll
    for (int r = 0; r < VCL; r++) s += *cl.map_shared_rank(slot, r);
    cl.sync();
    return s;
}

// Row max (NaN-ignoring like fmaxf).
static __device__ float cl_max_f(float v, float *scratch, float *slot) {
    cg::cluster_group cl = cg::this_cluster();
    v = block_max_f(v, scratch);
    if (threadIdx.x == 0) *slot = v;
    cl.sync();
    float m = -INFINITY;
#pragma unroll
    for (int r = 0; r < VCL; r++) m = fmaxf(m, *cl.map_shared_rank(slot, r));
    cl.sync();
    return m;
}

// Sum of `v` (the same value in every thread of a block: a block total) over the blocks of lower
// rank: where this block's chunk starts in an id-ordered count.
static __device__ unsigned long long cl_excl_u64(unsigned long long v, unsigned long long *slot) {
    cg::cluster_group cl = cg::this_cluster();
    if (threadIdx.x == 0) *slot = v;
    cl.sync();
    unsigned long long s = 0;
    const unsigned me = cl.block_rank();
    for (unsigned r = 0; r < me; r++) s += *cl.map_shared_rank(slot, r);
    cl.sync();
    return s;
}

// ---------------------------------------------------------------------------------------------
// Radix select over a row split across the cluster

// Shared state of one block for the selections (about 41 KB).
struct vsel {
    unsigned long long whist[VWARPS][RADIX_BINS]; // per-warp histograms (counts or masses)
    unsigned long long stage[VWARPS][DS_WARP];    // masses handed to the round's leaders
    unsigned long long hist[RADIX_BINS];          // this block's histogram (read by the cluster)
    unsigned long long merged[RADIX_BINS];        // the row's histogram
    unsigned long long above;                     // weight strictly above the chosen prefix
    unsigned long long eq;                        // weight of the final bin (entries == key)
    unsigned long long uslot;
    uint32_t digit;
    int none; // fewer than the target in the whole row
    double dslot;
    float fslot;
    double dscratch[33];
    float fscratch[33];
    unsigned long long uscratch[33];
};

#define VU_SEL 2 // groups in flight in a histogram pass (each costs 8 rounds of code)

static __device__ __forceinline__ unsigned long long fp_mass(float p) {
    return p > 0.0f ? (unsigned long long)((double)p * FP_ONE) : 0ull;
}

// One round of histogram adds by a warp (every lane calls it; `act` lanes add weight w to `bin`).
// Lanes with equal bins elect their lowest lane, which adds the group's weight to the warp's own
// histogram: leaders of a round own distinct bins, so plain adds are race free.
static __device__ __forceinline__ void whist_add(struct vsel *sh, int warp, int lane, bool act,
                                                 unsigned bin, unsigned long long w, bool mass) {
    const unsigned am = __ballot_sync(DS_FULL_MASK, act);
    if (am == 0) return; // warp-uniform
    if (act) {
        const unsigned peers = __match_any_sync(am, bin);
        const int leader = __ffs(peers) - 1;
        unsigned long long s = __popc(peers);
        if (mass) {
            sh->stage[warp][lane] = w;
            __syncwarp(am);
            s = 0;
            if (lane == leader)
                for (unsigned m = peers; m; m &= m - 1) s += sh->stage[warp][__ffs(m) - 1];
        }
        if (lane == leader) sh->whist[warp][bin] += s;
    }
    __syncwarp(); // the next round's leaders and stage writes come after these
}

// The largest key t such that the weight of the row's entries with key >= t reaches `target`
// (weight = 1 per entry, or the entry's fixed-point mass when MASS), over the whole row (all
// blocks of the cluster). Returns t; sh->above is then the weight strictly above t, sh->eq the
// weight at t, sh->none = 1 when the whole row weighs less than the target (t is then 0). NaN
// entries are ignored when skip_nan. Every thread of every block of the cluster must call it; all
// blocks get the same answer (they scan the same merged histograms).
template <bool MASS, typename TV>
static __device__ __noinline__ uint32_t cl_select_key(const TV *row, const struct vchunk &c, bool vec,
                                         unsigned long long target, bool skip_nan,
                                         struct vsel *sh) {
    cg::cluster_group cl = cg::this_cluster();
    const int lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    uint32_t prefix = 0, mask = 0;
    unsigned long long above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < VWARPS * RADIX_BINS; i += VT) (&sh->whist[0][0])[i] = 0;
        __syncthreads();
        for (int w0 = 0; w0 < c.nw; w0 += VU_SEL) {
            float v[VU_SEL][VG];
            int n[VU_SEL];
#pragma unroll
            for (int u = 0; u < VU_SEL; u++)
                n[u] = vload(row, c, (w0 + u) * VT + threadIdx.x, vec, v[u]);
#pragma unroll
            for (int u = 0; u < VU_SEL; u++) {
#pragma unroll
                for (int j = 0; j < VG; j++) {
                    const float f = v[u][j];
                    const uint32_t key = order_key(f);
                    const unsigned long long w = MASS ? fp_mass(f) : 1ull;
                    const bool act = j < n[u] && !(skip_nan && isnan(f)) &&
                                     (key & mask) == prefix && w != 0;
                    whist_add(sh, warp, lane, act, (key >> shift) & 0xffu, w, MASS);
                }
            }
        }
        __syncthreads();
        for (int b = threadIdx.x; b < RADIX_BINS; b += VT) {
            unsigned long long s = 0;
            for (int w = 0; w < VWARPS; w++) s += sh->whist[w][b];
            sh->hist[b] = s;
        }
        cl.sync(); // every block's histogram is complete
        for (int b = threadIdx.x; b < RADIX_BINS; b += VT) {
            unsigned long long s = 0;
            for (int r = 0; r < VCL; r++) s += cl.map_shared_rank(sh->hist, r)[b];
            sh->merged[b] = s; // integer sums: exact in any order
        }
        __syncthreads();
        if (warp == 0) {
            unsigned long long b[8], s = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) s += (b[j] = sh->merged[8 * lane + j]);
            unsigned long long suf = s; // weight of bins >= 8·lane
#pragma unroll
            for (int o = 1; o < DS_WARP; o <<= 1) {
                unsigned long long y = __shfl_down_sync(DS_FULL_MASK, suf, o);
                if (lane + o < DS_WARP) suf += y;
            }
            const unsigned ok = __ballot_sync(DS_FULL_MASK, above + suf >= target);
            if (ok == 0) {
                if (lane == 0) sh->none = 1, sh->digit = 0, sh->above = 0, sh->eq = 0;
            } else if (lane == 31 - __clz(ok)) {
                unsigned long long acc = above + suf - s; // weight of the bins of higher lanes
                int j = 7;
                for (; j > 0 && acc + b[j] < target; j--) acc += b[j];
                sh->none = 0, sh->digit = 8 * lane + j, sh->above = acc, sh->eq = b[j];
            }
        }
        __syncthreads();
        const int none = sh->none;
        const uint32_t digit = sh->digit;
        above = sh->above;
        cl.sync(); // every block has read the others' histograms before they are cleared
        if (none) return 0;
        prefix |= digit << shift;
        mask |= 0xffu << shift;
    }
    return prefix;
}

// Grid of a cluster-per-row kernel: (VCL, rows), rows beyond VMAX_GRID_ROWS loop.
static dim3 vgrid(int n_rows) {
    return dim3(VCL, (unsigned)(n_rows < VMAX_GRID_ROWS ? n_rows : VMAX_GRID_ROWS));
}

// ---------------------------------------------------------------------------------------------
// Softmax

// Entries of this thread's staged row whose key is below t, or ties at t beyond the first `need`
// of the row (by id), become `cut` (−inf for logits, 0 for probabilities). The tie weights are
// counts or fixed-point masses (MASS); a tie is cut when `base` + the weight of the ties before it
// reaches `need`. Windows go one at a time: each needs an ordered block scan of the tie weights.
template <bool MASS>
static __device__ __noinline__ void cut_row(float *p, const struct vchunk &c, bool vec, uint32_t t,
                               unsigned long long base, unsigned long long need, float cut,
                               struct vsel *sh) {
    // Ties in this block's chunk, then the ties of the lower-ranked chunks.
    unsigned long long mine = 0;
    for (int w = 0; w < c.nw; w++) {
        float v[VG];
        const int n = vload(p, c, w * VT + threadIdx.x, vec, v);
#pragma unroll
        for (int j = 0; j < VG; j++)
            if (j < n && order_key(v[j]) == t) mine += MASS ? fp_mass(v[j]) : 1ull;
    }
    unsigned long long block_ties;
    block_excl_scan_u64(mine, sh->uscratch, &block_ties);
    unsigned long long carry = base + cl_excl_u64(block_ties, &sh->uslot);
    for (int w = 0; w < c.nw; w++) {
        const int gi = w * VT + threadIdx.x;
        float v[VG];
        const int n = vload(p, c, gi, vec, v);
        unsigned long long ties = 0;
#pragma unroll
        for (int j = 0; j < VG; j++)
            if (j < n && order_key(v[j]) == t) ties += MASS ? fp_mass(v[j]) : 1ull;
        unsigned long long total;
        unsigned long long run = carry + block_excl_scan_u64(ties, sh->uscratch, &total);
        bool changed = false;
#pragma unroll
        for (int j = 0; j < VG; j++) {
            const uint32_t key = order_key(v[j]);
            if (j >= n) break;
            if (key == t) {
                const unsigned long long wj = MASS ? fp_mass(v[j]) : 1ull;
                if (run >= need) v[j] = cut, changed = true;
                run += wj;
            } else if (key < t) {
                v[j] = cut, changed = true;
            }
        }
        if (changed) vstore(p, c, gi, vec, v, n);
        carry += total;
    }
}

// The same cut when every tie is kept: a plain pass.
static __device__ void cut_below(float *p, const struct vchunk &c, bool vec, uint32_t t,
                                 float cut) {
    update_entries(p, c, vec, [&](int, float *z) {
        if (order_key(*z) < t) *z = cut;
    });
}

// The double-precision passes of the softmax: bound by the FP64 units, not by loads, so one
// entry at a time (scalar loads, L1 hits within a group) keeps one exp's registers live, not eight.
static __device__ double exp_sum(const float *p, const struct vchunk &c, float m) {
    const bool skip_inf = m > -INFINITY;
    double sum = 0.0;
    for (int gi = threadIdx.x; gi < c.ng; gi += VT) {
        const int e0 = c.lo + gi * VG, n = min(VG, c.hi - e0);
#pragma unroll 1
        for (int j = 0; j < n; j++) {
            const float z = p[e0 + j];
            if (!(skip_inf && z == -INFINITY)) sum += exp((double)z - (double)m);
        }
    }
    return sum;
}

static __device__ void exp_write(float *p, const struct vchunk &c, float m, double sum) {
    const bool skip_inf = m > -INFINITY;
    for (int gi = threadIdx.x; gi < c.ng; gi += VT) {
        const int e0 = c.lo + gi * VG, n = min(VG, c.hi - e0);
#pragma unroll 1
        for (int j = 0; j < n; j++) {
            const float z = p[e0 + j];
            p[e0 + j] = skip_inf && z == -INFINITY ? 0.0f : (float)(exp((double)z - (double)m) / sum);
        }
    }
}

static __device__ double row_sum(const float *p, const struct vchunk &c, bool vec) {
    double total = 0.0;
    for_each_entry(p, c, vec, [&](int, float v) { total += v; });
    return total;
}

static __device__ void row_scale(float *p, const struct vchunk &c, double total) {
    for (int gi = threadIdx.x; gi < c.ng; gi += VT) {
        const int e0 = c.lo + gi * VG, n = min(VG, c.hi - e0);
#pragma unroll 1
        for (int j = 0; j < n; j++) p[e0 + j] = (float)(p[e0 + j] / total);
    }
}

// Stages z = x / temperature in this thread's own entries of p; returns the thread's max z.
template <typename TA>
static __device__ float stage_z(const TA *x, float *p, const struct vchunk &c, bool xv, bool pv,
                                float temperature) {
    float m = -INFINITY;
    for (int w0 = 0; w0 < c.nw; w0 += VU) {
        float v[VU][VG];
        int n[VU];
#pragma unroll
        for (int u = 0; u < VU; u++) n[u] = vload(x, c, (w0 + u) * VT + threadIdx.x, xv, v[u]);
#pragma unroll
        for (int u = 0; u < VU; u++) {
#pragma unroll
            for (int j = 0; j < VG; j++) {
                v[u][j] = __fdiv_rn(v[u][j], temperature);
                if (j < n[u]) m = fmaxf(m, v[u][j]);
            }
            vstore(p, c, (w0 + u) * VT + threadIdx.x, pv, v[u], n[u]);
        }
    }
    return m;
}

template <typename TA>
static __device__ void softmax_row(const struct ds_softmax_args &a, int r, struct vsel *sh) {
    const int V = a.vocab;
    const TA *x = (const TA *)a.logits + (size_t)r * V;
    float *p = a.probs + (size_t)r * V;
    const struct vchunk c = vchunk_of(V);
    const bool xv = aligned16(x), pv = aligned16(p);

    // z = x / temperature, staged in this thread's own entries of p.
    float m = stage_z(x, p, c, xv, pv, a.temperature);
    m = cl_max_f(m, sh->fscratch, &sh->fslot);

    if (a.top_k > 0 && a.top_k < V) {
        // The maximum always survives the cut, so m stays the max of the kept logits.
        const uint32_t t = cl_select_key<false>(p, c, pv, (unsigned long long)a.top_k, false, sh);
        const unsigned long long need = (unsigned long long)a.top_k - sh->above;
        if (sh->eq == need) cut_below(p, c, pv, t, -INFINITY);
        else cut_row<false>(p, c, pv, t, 0, need, -INFINITY, sh); // keep the lowest-id ties
    }

    // Σ e^{z−m} in double; a cut entry adds exactly 0 (skipped unless m itself is −inf, where
    // the reference's −inf − −inf = NaN must show).
    const double sum = cl_sum_d(exp_sum(p, c, m), sh->dscratch, &sh->dslot);
    exp_write(p, c, m, sum);

    if (a.top_p < 1.0f) {
        // At least one unit, so a tiny top_p still keeps the most likely token (as the reference).
        unsigned long long tp = (unsigned long long)((double)a.top_p * FP_ONE);
        tp = tp ? tp : 1ull;
        // Key 0 is below every non-negative probability: this selects by the row's whole mass.
        const uint32_t t = cl_select_key<true>(p, c, pv, tp, false, sh);
        // A tie joins while the mass above it and before it (id order) is still short of top_p.
        if (!sh->none) cut_row<true>(p, c, pv, t, sh->above, tp, 0.0f, sh);
        const double total = cl_sum_d(row_sum(p, c, pv), sh->dscratch, &sh->dslot);
        row_scale(p, c, total);
    }
}

__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    f32_softmax(const struct ds_softmax_args a) {
    __shared__ struct vsel sh;
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) softmax_row<float>(a, r, &sh);
}
__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    bf16_softmax(const struct ds_softmax_args a) {
    __shared__ struct vsel sh;
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) softmax_row<ds_bf16>(a, r, &sh);
}

extern "C" enum ds_status ds_softmax_cuda(const struct ds_softmax_args *a, void *stream) {
    static const char op[] = "softmax";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (!(a->temperature > 0.0f) || isinf(a->temperature))
        return ds_error_set(DS_ERR_ARG, "%s: temperature %g must be positive and finite", op,
                            a->temperature);
    CU_TRY(cu_check_dim(op, "top_k", a->top_k, 0));
    if (!(a->top_p > 0.0f))
        return ds_error_set(DS_ERR_ARG, "%s: top_p %g must be > 0", op, a->top_p);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "logits", a->logits));
    CU_TRY(cu_check_ptr(op, "probs", a->probs));
    if (a->act == DS_ELEM_BF16) bf16_softmax<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    else f32_softmax<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Argmax: (value, id) pairs under one total order — larger value first, then lower id; NaN loses
// to everything — so any reduction tree gives the same winner.

struct best {
    float v;
    int id; // -1: nothing yet (or only NaN)
};

static __device__ __forceinline__ struct best better(struct best a, struct best b) {
    if (b.id < 0) return a;
    if (a.id < 0) return b;
    if (a.v > b.v || (a.v == b.v && a.id < b.id)) return a;
    return b;
}

static __device__ __forceinline__ struct best warp_best(struct best b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        struct best c = {__shfl_xor_sync(DS_FULL_MASK, b.v, o),
                         __shfl_xor_sync(DS_FULL_MASK, b.id, o)};
        b = better(b, c);
    }
    return b;
}

template <typename TA>
static __device__ void argmax_row(const struct ds_argmax_args &a, int r, struct best *wbest,
                                  struct best *slot) {
    cg::cluster_group cl = cg::this_cluster();
    const int V = a.vocab, lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const TA *x = (const TA *)a.x + (size_t)r * V;
    const struct vchunk c = vchunk_of(V);
    const bool xv = aligned16(x);
    struct best b = {0.0f, -1};
    for_each_entry(x, c, xv, [&](int id, float f) { // ascending id: a strict > keeps the lowest
        if (!isnan(f) && (b.id < 0 || f > b.v)) b.v = f, b.id = id;
    });
    b = warp_best(b);
    __syncthreads(); // wbest of the previous row is no longer read
    if (lane == 0) wbest[warp] = b;
    __syncthreads();
    if (warp == 0) {
        const struct best none = {0.0f, -1};
        b = lane < VWARPS ? wbest[lane] : none;
        b = warp_best(b);
        if (lane == 0) *slot = b;
    }
    cl.sync();
    if (cl.block_rank() == 0 && threadIdx.x == 0) {
        struct best w = {0.0f, -1};
        for (int k = 0; k < VCL; k++) w = better(w, *cl.map_shared_rank(slot, k));
        a.ids[r] = w.id < 0 ? 0 : w.id;
        if (a.values) a.values[r] = w.id < 0 ? NAN : w.v;
    }
    cl.sync();
}

__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    f32_argmax(const struct ds_argmax_args a) {
    __shared__ struct best wbest[VWARPS], slot;
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) argmax_row<float>(a, r, wbest, &slot);
}
__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    bf16_argmax(const struct ds_argmax_args a) {
    __shared__ struct best wbest[VWARPS], slot;
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) argmax_row<ds_bf16>(a, r, wbest, &slot);
}

extern "C" enum ds_status ds_argmax_cuda(const struct ds_argmax_args *a, void *stream) {
    static const char op[] = "argmax";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "input", a->x));
    CU_TRY(cu_check_ptr(op, "ids", a->ids));
    if (a->act == DS_ELEM_BF16) bf16_argmax<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    else f32_argmax<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Top-k list

struct vtopk {
    float cv[DS_MAX_TOPK]; // this block's winners, in no particular order
    int cid[DS_MAX_TOPK];
    unsigned n_cand;
    float all_v[DS_MAX_TOPK]; // rank 0: the row's winners
    int all_id[DS_MAX_TOPK];
};

static __device__ __forceinline__ void topk_keep(struct vtopk *tk, float f, int id) {
    const unsigned slot = atomicAdd(&tk->n_cand, 1u); // slot order is irrelevant: sorted below
    if (slot < DS_MAX_TOPK) tk->cv[slot] = f, tk->cid[slot] = id; // <= k by construction
}

template <typename TA>
static __device__ void topk_row(const struct ds_topk_args &a, int r, struct vsel *sh,
                                struct vtopk *tk) {
    cg::cluster_group cl = cg::this_cluster();
    const int V = a.vocab, K = a.k;
    const TA *x = (const TA *)a.x + (size_t)r * V;
    const struct vchunk c = vchunk_of(V);
    const bool xv = aligned16(x);
    if (threadIdx.x == 0) tk->n_cand = 0; // ordered before any keep by the selection's barriers
    const uint32_t t = cl_select_key<false>(x, c, xv, (unsigned long long)K, true, sh);
    // Everything valid fits when the row has fewer than k non-NaN entries (sh->none).
    const bool all = sh->none;
    const unsigned long long need = all ? 0ull : (unsigned long long)K - sh->above;
    if (all || sh->eq == need) {
        for_each_entry(x, c, xv, [&](int id, float f) {
            if (!isnan(f) && (all || order_key(f) >= t)) topk_keep(tk, f, id);
        });
    } else { // more ties than places: the lowest ids among them (tie count, then ordered scan)
        unsigned long long mine = 0;
        for (int w = 0; w < c.nw; w++) {
            float v[VG];
            const int n = vload(x, c, w * VT + threadIdx.x, xv, v);
#pragma unroll
            for (int j = 0; j < VG; j++) mine += j < n && !isnan(v[j]) && order_key(v[j]) == t;
        }
        unsigned long long block_ties;
        block_excl_scan_u64(mine, sh->uscratch, &block_ties);
        unsigned long long carry = cl_excl_u64(block_ties, &sh->uslot);
        for (int w = 0; w < c.nw; w++) {
            const int gi = w * VT + threadIdx.x;
            float v[VG];
            const int n = vload(x, c, gi, xv, v);
            unsigned long long ties = 0;
#pragma unroll
            for (int j = 0; j < VG; j++) ties += j < n && !isnan(v[j]) && order_key(v[j]) == t;
            unsigned long long total;
            unsigned long long run = carry + block_excl_scan_u64(ties, sh->uscratch, &total);
#pragma unroll
            for (int j = 0; j < VG; j++) {
                if (j >= n || isnan(v[j])) continue;
                const uint32_t key = order_key(v[j]);
                if (key > t || (key == t && run < need)) topk_keep(tk, v[j], vid(c, gi, j));
                if (key == t) run++;
            }
            carry += total;
        }
    }
    __syncthreads();
    cl.sync(); // every block's winners are in place
    if (cl.block_rank() == 0 && threadIdx.x == 0) {
        int n = 0;
        for (int k = 0; k < VCL; k++) {
            const struct vtopk *o = cl.map_shared_rank(tk, k);
            const int m = min((int)o->n_cand, DS_MAX_TOPK);
            for (int i = 0; i < m && n < DS_MAX_TOPK; i++, n++)
                tk->all_v[n] = o->cv[i], tk->all_id[n] = o->cid[i];
        }
        // At most 64 entries: an insertion sort by (value desc, id asc).
        for (int i = 1; i < n; i++) {
            const float f = tk->all_v[i];
            const int id = tk->all_id[i];
            int j = i;
            for (; j > 0 && (tk->all_v[j - 1] < f || (tk->all_v[j - 1] == f && tk->all_id[j - 1] > id));
                 j--)
                tk->all_v[j] = tk->all_v[j - 1], tk->all_id[j] = tk->all_id[j - 1];
            tk->all_v[j] = f, tk->all_id[j] = id;
        }
        int32_t *ids = a.ids + (size_t)r * K;
        float *vals = a.values + (size_t)r * K;
        for (int i = 0; i < K; i++) {
            ids[i] = i < n ? tk->all_id[i] : -1;
            vals[i] = i < n ? tk->all_v[i] : -INFINITY;
        }
    }
    cl.sync(); // rank 0 has read every list before the next row resets them
}

__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    f32_topk(const struct ds_topk_args a) {
    __shared__ struct vsel sh;
    __shared__ struct vtopk tk;
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) topk_row<float>(a, r, &sh, &tk);
}
__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    bf16_topk(const struct ds_topk_args a) {
    __shared__ struct vsel sh;
    __shared__ struct vtopk tk;
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) topk_row<ds_bf16>(a, r, &sh, &tk);
}

extern "C" enum ds_status ds_topk_cuda(const struct ds_topk_args *a, void *stream) {
    static const char op[] = "topk";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (a->k < 1 || a->k > a->vocab || a->k > DS_MAX_TOPK)
        return ds_error_set(DS_ERR_ARG, "%s: k %d outside [1, min(%d, %d)]", op, a->k, a->vocab,
                            DS_MAX_TOPK);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "input", a->x));
    CU_TRY(cu_check_ptr(op, "ids", a->ids));
    CU_TRY(cu_check_ptr(op, "values", a->values));
    if (a->act == DS_ELEM_BF16) bf16_topk<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    else f32_topk<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Entropy and overlap

struct vsum {
    double scratch[33];
    double slot;
};

__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    f32_entropy(const struct ds_entropy_args a) {
    __shared__ struct vsum sh;
    const struct vchunk c = vchunk_of(a.vocab);
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) {
        const float *p = a.probs + (size_t)r * a.vocab;
        const bool pv = aligned16(p);
        double h = 0.0;
        for_each_entry(p, c, pv, [&](int, float v) {
            if (!(v <= 0.0f)) h -= (double)v * log((double)v); // NaN not skipped, as the ref
        });
        h = cl_sum_d(h, sh.scratch, &sh.slot);
        if (vrank() == 0 && threadIdx.x == 0) a.out[r] = (float)h;
    }
}

extern "C" enum ds_status ds_entropy_cuda(const struct ds_entropy_args *a, void *stream) {
    static const char op[] = "entropy";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "probs", a->probs));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    f32_entropy<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// Chunks follow q's entries; p is gathered through the map.
__global__ void __cluster_dims__(VCL, 1, 1) __launch_bounds__(VT)
    f32_overlap(const struct ds_overlap_args a) {
    __shared__ struct vsum sh;
    const struct vchunk c = vchunk_of(a.vocab_q);
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) {
        const float *p = a.p + (size_t)r * a.vocab_p;
        const float *q = a.q + (size_t)r * a.vocab_q;
        const bool qv = aligned16(q);
        double s = 0.0;
        for_each_entry(q, c, qv, [&](int i, float qi) {
            const int j = a.q_to_p ? a.q_to_p[i] : i;
            if (j < 0 || j >= a.vocab_p) return;
            const float pj = p[j];
            s += pj < qi || isnan(pj) ? pj : qi; // a NaN on either side reaches the sum
        });
        s = cl_sum_d(s, sh.scratch, &sh.slot);
        if (vrank() == 0 && threadIdx.x == 0) a.out[r] = (float)s;
    }
}

extern "C" enum ds_status ds_overlap_cuda(const struct ds_overlap_args *a, void *stream) {
    static const char op[] = "overlap";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab_p", a->vocab_p, 1));
    CU_TRY(cu_check_dim(op, "vocab_q", a->vocab_q, 1));
    if (!a->q_to_p && a->vocab_q != a->vocab_p)
        return ds_error_set(DS_ERR_MISMATCH, "%s: q has %d entries, p %d, and no map", op,
                            a->vocab_q, a->vocab_p);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "p", a->p));
    CU_TRY(cu_check_ptr(op, "q", a->q));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    f32_overlap<<<vgrid(a->n_rows), VT, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Vocabulary scatter: two elementwise kernels on the stream — every dst entry gets the fill, then
// every mapped entry its source value (a copy: bitwise in either dtype). No reduction, so any
// split of the work gives the same bits.

template <typename TA>
static __device__ __forceinline__ void vocab_fill_body(const struct ds_vocab_scatter_args &a) {
    const size_t n = (size_t)a.n_rows * a.dst_vocab;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_f((TA *)a.dst, i, a.fill);
}
template <typename TA>
static __device__ __forceinline__ void vocab_scatter_body(const struct ds_vocab_scatter_args &a) {
    const size_t n = (size_t)a.n_rows * a.src_vocab;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)a.src_vocab, e = i % (size_t)a.src_vocab;
        const int j = a.map[e];
        if (j >= 0 && j < a.dst_vocab)
            ((TA *)a.dst)[r * a.dst_vocab + j] = ((const TA *)a.src)[i];
    }
}
__global__ void f32_vocab_fill(const struct ds_vocab_scatter_args a) { vocab_fill_body<float>(a); }
__global__ void bf16_vocab_fill(const struct ds_vocab_scatter_args a) {
    vocab_fill_body<ds_bf16>(a);
}
__global__ void f32_vocab_scatter(const struct ds_vocab_scatter_args a) {
    vocab_scatter_body<float>(a);
}
__global__ void bf16_vocab_scatter(const struct ds_vocab_scatter_args a) {
    vocab_scatter_body<ds_bf16>(a);
}

// Enough 256-thread blocks to fill the GPU several times over; a grid-stride loop does the rest.
static unsigned vs_blocks(size_t n) {
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 2048 ? (b ? b : 1) : 2048);
}

extern "C" enum ds_status ds_vocab_scatter_cuda(const struct ds_vocab_scatter_args *a,
                                                void *stream) {
    static const char op[] = "vocab_scatter";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "src_vocab", a->src_vocab, 1));
    CU_TRY(cu_check_dim(op, "dst_vocab", a->dst_vocab, a->src_vocab));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "src", a->src));
    CU_TRY(cu_check_ptr(op, "map", a->map));
    CU_TRY(cu_check_ptr(op, "dst", a->dst));
    cudaStream_t s = DS_STREAM(stream);
    const unsigned nf = vs_blocks((size_t)a->n_rows * a->dst_vocab);
    const unsigned ns = vs_blocks((size_t)a->n_rows * a->src_vocab);
    if (a->act == DS_ELEM_BF16) {
        bf16_vocab_fill<<<nf, 256, 0, s>>>(*a);
        bf16_vocab_scatter<<<ns, 256, 0, s>>>(*a);
    } else {
        f32_vocab_fill<<<nf, 256, 0, s>>>(*a);
        f32_vocab_scatter<<<ns, 256, 0, s>>>(*a);
    }
    DS_KERNEL_CHECK();
    return DS_OK;
}
