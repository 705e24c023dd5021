// kernels/cuda/router.cu: the gpt-oss router on CUDA (ds_router_args): logits = x·Wᵀ + b over the
// E experts, top-k by logit (ties to the lower index), softmax over the k chosen logits.
//
// Dtypes. x f32 or bf16 (`act`, chosen at run time), router weights and bias f32 or bf16. All
// arithmetic is fp32, with explicit _rn intrinsics so that the compiler contracts nothing.
//
// THE PER-LOGIT ORDER (both paths, every T). C = 8·G: the input is cut into G groups of 8. The
// groups are dealt to RT_VLANES = 128 virtual lanes, group g to virtual lane g mod 128. Virtual
// lane v sums its groups g = v, v + 128, v + 256, ... in increasing g, 8 __fmaf_rn each in
// element order, from +0: q_v. Lane l (0..31) forms p_l = (q_l + q_{l+32}) + (q_{l+64} + q_{l+96}),
// the xor butterfly sums the 32 p_l (warp_sum_f), and the bias is added last:
// logit = butterfly + b (b = 0 without a bias). The order depends on C only.
//
// Kernels:
//   act_anyw_router_topk_softmax     (T > 8, or no workspace) a thread-block cluster of 8 blocks
//       (16 warps each) per tile of R rows (R = 1 up to 8 rows, else 4): cluster warp w owns the
//       experts e ≡ w (mod 128) and computes each of their logits alone: lane l walks the groups
//       l + 32j in increasing j into four accumulators (accumulator j mod 4 is virtual lane
//       l + 32·(j mod 4)), all of a round's loads issued before its first fma (R = 1 with bf16 x
//       and weights: one round covers C = 2880). The raw sums (butterfly, no bias) stay in the
//       owner block's shared memory; block 0 gathers them over distributed shared memory,
//       finishes each logit (row scale, bias: logit_of) and selects (below).
//   act_anyw_router_topk_softmax_ws  (T <= 8 with a workspace) grid (ceil(E / 2), ceil(T / R)),
//       R = 1 for one row, else 4; a block of 8 warps holds 2 experts × 4 warps and computes
//       their logits for its R rows: warp s of an expert is virtual lanes 32s .. 32s + 31
//       (C = 2880: at most 3 groups per lane and row, all of the warp's loads issued at once).
//       The 4 warps meet in shared memory; warp s forms rows s, s + 4, ... of its expert (p_l,
//       butterfly, bias) and stores each logit with its "written" flag as one 8-byte word into
//       the module's slot array (rt_slots). Block (0, 0) then selects for every row: one warp per
//       row reads the row's slots until every word is flagged (no fence, no counter, no atomic),
//       sets them back to 0 for the next call and selects. The caller's workspace only selects
//       this path (ds_router_workspace_bytes is sized for 4-byte logits; the slots are 8 bytes).
//       Same per-logit operations and selection as the cluster path: same bits.
//
// Selection (both kernels, one warp per row): the lane that owns experts e ≡ lane (mod 32) keeps
// their 32-bit keys in registers (order_key of the logit with NaN as −∞ and −0 as +0: larger
// logit, larger key). k rounds: each lane's best key (the lower expert on equal keys), the warp's
// largest key (__reduce_max_sync), the lowest expert holding it (__reduce_min_sync), so ties go
// to the lower index; the taken expert's key becomes 0 (below every real key). The chosen logit
// is read back from the key (the same value up to the sign of a zero, which the softmax does not
// see); softmax over the k logits in fp32, exp(l_s − l_0) summed best first, one division each.
//
// Deferred norm (ds/kernel_args.h, rms_of): every logit is logit_of(raw sum, s, bias), s the row's
// THE ROW SCALE; the workspace path's first-expert warps sum the row's squares with their logit
// loads in flight, the cluster path's block 0 forms s before its logits; both write row_scale.
//
// Both kernels start with DS_GRID_DEPENDENCY() (after register and shared-memory set-up, in the
// cluster kernel's block 0 the biases into shared memory, and in the workspace kernel an L2
// prefetch of each expert's weight row: ds_prefetch_l2) and are launched with programmatic
// dependent launch. The workspace path's slots are module
// state, like the arrival counters of attention's split mode: calls must not overlap in time
// (every caller issues its ops on one stream).
//
// Determinism and batch invariance. Every logit follows THE PER-LOGIT ORDER above whatever the
// number of rows, the tile or the path; the selection depends on the row's logits only.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "kernels/cuda/router.cu: the router uses thread-block clusters (sm_90 or later)"
#endif

namespace cg = cooperative_groups;

#define RT_ROWS 4      // router rows per cluster (wide variant)
#define RT_ROWS_ONE 8  // up to this many rows, one row per cluster
#define RT_THREADS 512 // warps per block = 16
#define RT_WARPS (RT_THREADS / DS_WARP)
#define RT_CLUSTER 8                  // blocks per cluster (the portable maximum)
#define RT_CW (RT_CLUSTER * RT_WARPS) // warps per cluster = 128
#define RT_MAX_EXPERTS 1024
#define RT_STEP 256                     // inputs per warp step (32 lanes × 8)
#define RT_SLICES 4                     // accumulators per lane = warps per logit (workspace path)
#define RT_VLANES (RT_SLICES * DS_WARP) // virtual lanes of THE PER-LOGIT ORDER
#define RT_WS_EB 2                      // workspace path: experts per block (8 warps)
#define RT_WS_WARPS (RT_WS_EB * RT_SLICES)
#define RT_WS_ROWS 4 // workspace path: rows per block above one row
static_assert(RT_SLICES == 4, "logit_finish adds exactly 4 virtual-lane sums per lane");

// NaN sorts below every number, so the selection order is total.
static __device__ __forceinline__ float rank_value(float v) {
    return isnan(v) ? -INFINITY : v;
}

// One group of THE PER-LOGIT ORDER: 8 fmaf in element order.
static __device__ __forceinline__ float dot8(const float *xv, const float *wv, float acc) {
#pragma unroll
    for (int i = 0; i < 8; i++)
        acc = __fmaf_rn(xv[i], wv[i], acc);
    return acc;
}

// p_l of THE PER-LOGIT ORDER from the lane's 4 virtual-lane sums, then the butterfly: the raw sum.
static __device__ __forceinline__ float logit_sum(float q0, float q1, float q2, float q3) {
    return warp_sum_f(__fadd_rn(__fadd_rn(q0, q1), __fadd_rn(q2, q3)));
}
// The logit from its raw sum: the row scale of a deferred norm (sc: 1 without one, an exact
// multiply), then the bias. Both paths end every logit with these two operations.
static __device__ __forceinline__ float logit_of(float sum, float sc, float b) {
    return __fadd_rn(__fmul_rn(sum, sc), b);
}
static __device__ __forceinline__ float logit_finish(float q0, float q1, float q2, float q3,
                                                     float b, float sc) {
    return logit_of(logit_sum(q0, q1, q2, q3), sc, b);
}

// The cluster path's logits: warp cw computes experts cw, cw + n_cw, ... for rows t0 .. t0 + nr − 1
// into logits[r·ls + e] (shared memory). Lane l walks the groups l + 32j (k0 = 8·lane + 256·j) in
// increasing j into acc[j mod 4], i.e. virtual lane l + 32·(j mod 4) of THE PER-LOGIT ORDER, in
// rounds of U steps whose loads are all issued before the first fma (predicated, not behind a
// loop exit, so they can be in flight together). R = 1 with bf16 x and weights: U = 12 covers
// all 11.25 steps of C = 2880, one memory latency per logit. U is a multiple of 4, so a step's
// accumulator is a compile-time index.
template <int R, bool XB, bool WB>
static __device__ __forceinline__ void router_logits(const struct ds_router_args &a, int cw,
                                                     int n_cw, int t0, int nr, float *logits,
                                                     int ls) {
    const int lane = threadIdx.x % DS_WARP, C = a.dim, E = a.n_experts;
    constexpr int U = R == 1 ? (XB && WB ? 12 : XB || WB ? 8 : 4) : 4;
    static_assert(U % RT_SLICES == 0, "a round must cover whole cycles of the 4 accumulators");
    const int n = 8 * lane < C ? (C - 8 * lane + RT_STEP - 1) / RT_STEP : 0;
    for (int e = cw; e < E; e += n_cw) {
        float acc[R][RT_SLICES];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int s = 0; s < RT_SLICES; s++)
                acc[r][s] = 0.0f;
        for (int j0 = 0; j0 < n; j0 += U) {
            raw8<WB> wr[U];
            raw8<XB> xr[R == 1 ? U : 1];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const size_t k0 = 8 * (size_t)lane + (size_t)RT_STEP * (j0 + u);
                if (j0 + u < n) {
                    wr[u] = ld_raw8<WB>(a.w, (size_t)e * C + k0);
                    if (R == 1) xr[R == 1 ? u : 0] = ld_raw8<XB>(a.x, (size_t)t0 * C + k0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (j0 + u >= n) break;
                const size_t k0 = 8 * (size_t)lane + (size_t)RT_STEP * (j0 + u);
                float wv[8];
                unpack8<WB>(wr[u], wv);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r >= nr) break;
                    float xv[8];
                    if (R == 1)
                        unpack8<XB>(xr[R == 1 ? u : 0], xv);
                    else
                        ld8t<XB>(a.x, (size_t)(t0 + r) * C + k0, xv);
                    acc[r][u % RT_SLICES] = dot8(xv, wv, acc[r][u % RT_SLICES]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float v = logit_sum(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            if (lane == 0 && r < nr) logits[(size_t)r * ls + e] = v;
        }
    }
}

// The workspace path's lane sums: q[r] = q_v of THE PER-LOGIT ORDER for expert e, virtual lane v
// and rows t0 .. t0 + nr − 1 (groups g = v + 128m in increasing m). C ≤ 4096 takes one round:
// the warp's weight and activation loads are all issued before its first fma.
template <int R, bool XB, bool WB>
static __device__ __forceinline__ void ws_lane_sums(const struct ds_router_args &a, int e, int v,
                                                    int t0, int nr, float *q) {
    const int C = a.dim, G = C / 8;
    constexpr int U = 4; // C <= 4096: one round (f32 rows at R = 4: 198 registers, no spill)
    const int n = v < G ? (G - v + RT_VLANES - 1) / RT_VLANES : 0;
#pragma unroll
    for (int r = 0; r < R; r++)
        q[r] = 0.0f;
    for (int m0 = 0; m0 < n; m0 += U) {
        raw8<WB> wr[U];
        raw8<XB> xr[U][R];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t k0 = 8 * ((size_t)v + (size_t)RT_VLANES * (m0 + u));
            if (m0 + u < n) {
                wr[u] = ld_raw8<WB>(a.w, (size_t)e * C + k0);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < nr) xr[u][r] = ld_raw8<XB>(a.x, (size_t)(t0 + r) * C + k0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (m0 + u >= n) break;
            float wv[8];
            unpack8<WB>(wr[u], wv);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r >= nr) break;
                float xv[8];
                unpack8<XB>(xr[u][r], xv);
                q[r] = dot8(xv, wv, q[r]);
            }
        }
    }
}

// 32-bit selection key of a logit: larger logit, larger key; NaN ranks lowest (as −∞) and −0
// equals +0 (adding +0 turns −0 into +0), like the reference's comparisons. 0 means "none": every
// real key is larger (order_key(−∞) = 0x007fffff).
static __device__ __forceinline__ uint32_t sel_key(float v) {
    return order_key(__fadd_rn(rank_value(v), 0.0f));
}
// The logit a key was made of (rank_value(v) + 0, the inverse of order_key).
static __device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

// The top-k of one row and its softmax, by one warp, to row t of the outputs, from the keys of
// the row's logits (sel_key; 0 for lanes past E): lane l holds key[j] of expert l + 32j, j < NK.
// k rounds: each lane's best key (the lowest j on equal keys), the warp's largest key
// (__reduce_max_sync), the lowest expert holding it (__reduce_min_sync); the taken expert's key
// becomes 0. Lane s % 32 keeps slot s's id and weight; every lane forms the same weights and the
// same sum (best first), so the outputs are written once at the end, coalesced.
template <int NK>
static __device__ __forceinline__ void router_select(const struct ds_router_args &a, uint32_t *key,
                                                     int t) {
    const int lane = threadIdx.x % DS_WARP, KE = a.top_k;
    float best0 = 0.0f, sum = 0.0f, my_w[DS_MAX_TOPK / DS_WARP] = {};
    int my_id[DS_MAX_TOPK / DS_WARP] = {};
    for (int s = 0; s < KE; s++) {
        uint32_t k = 0, id = 0xffffffffu;
#pragma unroll
        for (int j = 0; j < NK; j++)
            if (key[j] > k) k = key[j], id = (uint32_t)(lane + DS_WARP * j);
        // k <= E, so some expert is left and best > 0: a lane with none (k = 0) never matches.
        const uint32_t best = __reduce_max_sync(DS_FULL_MASK, k);
        const int be = (int)__reduce_min_sync(DS_FULL_MASK, k == best ? id : 0xffffffffu);
#pragma unroll
        for (int j = 0; j < NK; j++)
            if (lane + DS_WARP * j == be) key[j] = 0u;
        const float bv = key_value(best);
        if (s == 0) best0 = bv;
        // exp(l_s − l_0) in fp32; the weights are normalised below, best first.
        const float w = expf(bv - best0);
        sum += w;
#pragma unroll
        for (int h = 0; h < DS_MAX_TOPK / DS_WARP; h++)
            if (s == h * DS_WARP + lane) my_w[h] = w, my_id[h] = be;
    }
#pragma unroll
    for (int h = 0; h < DS_MAX_TOPK / DS_WARP; h++) {
        const int s = h * DS_WARP + lane;
        if (s < KE) {
            a.expert_ids[(size_t)t * KE + s] = my_id[h];
            a.expert_weights[(size_t)t * KE + s] = my_w[h] / sum;
        }
    }
}

// router_select over a row of logits in shared memory (the cluster path), NK = 4 up to 128
// experts, else 32 (RT_MAX_EXPERTS = 32 · 32).
template <int NK>
static __device__ __forceinline__ void router_select_smem(const struct ds_router_args &a,
                                                          const float *lg, int t) {
    const int lane = threadIdx.x % DS_WARP;
    uint32_t key[NK];
#pragma unroll
    for (int j = 0; j < NK; j++) {
        const int e = lane + DS_WARP * j;
        key[j] = e < a.n_experts ? sel_key(lg[e]) : 0u;
    }
    router_select<NK>(a, key, t);
}

// Launched in clusters of RT_CLUSTER blocks along x; cluster i serves rows R·i .. R·i + R − 1.
// R = 1 (small T: more clusters, every load of a warp's expert row in flight at once) or R = 4
// (rows share the weight loads). Both follow THE PER-LOGIT ORDER, so a row's logits do not depend
// on R, on the tile or on its neighbours.
template <int R>
__global__ void __launch_bounds__(RT_THREADS)
    act_anyw_router_topk_softmax(const struct ds_router_args a) {
    __shared__ float logits[R][RT_MAX_EXPERTS];
    __shared__ float s_sc[R];
    __shared__ float s_b[RT_MAX_EXPERTS];
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    const int warp = threadIdx.x / DS_WARP, lane = threadIdx.x % DS_WARP;
    const int cw = (int)rank * RT_WARPS + warp; // warp index within the cluster
    const int t0 = (int)(blockIdx.x / RT_CLUSTER) * R, E = a.n_experts;
    const int nr = min(R, a.n_rows - t0);
    // The block that finishes the logits holds the biases (weights: read before the dependency).
    if (rank == 0)
        for (int e = threadIdx.x; e < E; e += RT_THREADS)
            s_b[e] = a.bias ? ld_elem(a.bias, a.bias_dtype, (size_t)e) : 0.0f;
    DS_GRID_DEPENDENCY();

    const bool xb = a.act == DS_ELEM_BF16, wb = a.w_dtype == DS_ELEM_BF16;
    // THE ROW SCALE of each row (deferred norm; 1 without one) in the finishing block, warp r for
    // row r, before its logits (the other blocks only sum).
    if (rank == 0 && warp < nr) {
        float sc = 1.0f;
        if (a.rms_of) {
            const size_t o = (size_t)(t0 + warp) * a.dim;
            sc = xb ? ds_row_scale_warp<true>((const ds_bf16 *)a.rms_of + o, a.dim, a.rms_eps)
                    : ds_row_scale_warp<false>((const float *)a.rms_of + o, a.dim, a.rms_eps);
            if (lane == 0 && a.row_scale) a.row_scale[t0 + warp] = sc;
        }
        if (lane == 0) s_sc[warp] = sc;
    }
    float *lg = &logits[0][0];
    if (xb && wb)
        router_logits<R, true, true>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    else if (xb)
        router_logits<R, true, false>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    else if (wb)
        router_logits<R, false, true>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    else
        router_logits<R, false, false>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    cluster.sync(); // every block's sums are written
    if (rank == 0) {
        // Gather the sums and finish each logit (logit_of: the workspace path's operations).
        for (int i = threadIdx.x; i < R * E; i += RT_THREADS) {
            const int r = i / E, e = i % E, owner = (e % RT_CW) / RT_WARPS;
            if (r >= nr) continue;
            const float v = owner != 0 ? *cluster.map_shared_rank(&logits[r][e], owner)
                                       : logits[r][e];
            logits[r][e] = logit_of(v, s_sc[r], s_b[e]);
        }
    }
    cluster.sync(); // the gather is done (no block may leave while its memory is read)
    if (rank != 0) return;

    // Warp r selects for row r.
    if (warp < nr) {
        if (E <= 4 * DS_WARP)
            router_select_smem<4>(a, &logits[warp][0], t0 + warp);
        else
            router_select_smem<RT_MAX_EXPERTS / DS_WARP>(a, &logits[warp][0], t0 + warp);
    }
}

// The workspace path's logits: slot t·E + e holds (1 << 32) | the bits of logit (t, e) once a
// block of the current call has stored it, 0 otherwise. Each word is written once per call with
// one 8-byte store and read with 8-byte loads (single-copy atomic, .relaxed.gpu: coherent in L2),
// so a word read as written holds its logit: no fence and no counter. The selecting block sets
// every word it read back to 0, so every call starts from zero (static device memory is zero at
// module load). Calls must not overlap in time: every caller issues its ops on one stream.
__device__ unsigned long long rt_slots[RT_ROWS_ONE * RT_MAX_EXPERTS];

static __device__ __forceinline__ void slot_store(unsigned long long *p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ unsigned long long slot_load(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// router_select for row t from the slots, by one warp: reads the row's E words, reads again those
// not yet written until every one is, resets them to 0 and selects.
template <int NK>
static __device__ __forceinline__ void router_select_slots(const struct ds_router_args &a, int t) {
    const int lane = threadIdx.x % DS_WARP, E = a.n_experts;
    unsigned long long *row = rt_slots + (size_t)t * E;
    unsigned long long v[NK];
#pragma unroll
    for (int j = 0; j < NK; j++) // experts past E count as written
        v[j] = lane + DS_WARP * j < E ? slot_load(row + lane + DS_WARP * j) : 1ull << 32;
    for (;;) {
        bool ok = true;
#pragma unroll
        for (int j = 0; j < NK; j++)
            ok = ok && (v[j] >> 32) != 0;
        if (__all_sync(DS_FULL_MASK, ok)) break;
#pragma unroll
        for (int j = 0; j < NK; j++)
            if (!(v[j] >> 32)) v[j] = slot_load(row + lane + DS_WARP * j);
    }
    uint32_t key[NK];
#pragma unroll
    for (int j = 0; j < NK; j++) {
        const int e = lane + DS_WARP * j;
        key[j] = e < E ? sel_key(__uint_as_float((uint32_t)v[j])) : 0u;
        if (e < E) slot_store(row + e, 0ull);
    }
    router_select<NK>(a, key, t);
}

// Grid (ceil(E / RT_WS_EB), ceil(T / R)), RT_WS_WARPS warps per block: warp w is slice
// s = w mod 4 of expert RT_WS_EB·blockIdx.x + w / 4 (virtual lanes 32s .. 32s + 31) for rows
// R·blockIdx.y .. R·blockIdx.y + R − 1. The lane sums meet in shared memory; warp s finishes rows
// s, s + 4, ... of its expert (logit_finish) into their slots (rt_slots). Block (0, 0), the first
// one dispatched, then selects: its warps take rows w, w + RT_WS_WARPS, ... and wait on the
// slots (router_select_slots). The blocks it waits for need nothing it holds but one block slot,
// so they run as the GPU frees room. One launch, no cluster, no atomics, 4·E·ceil(T / R) warps.
template <int R, bool XB, bool WB>
__global__ void __launch_bounds__(RT_WS_WARPS *DS_WARP)
    act_anyw_router_topk_softmax_ws(const struct ds_router_args a) {
    __shared__ float s_q[RT_WS_EB][RT_SLICES][R][DS_WARP];
    __shared__ float s_xx[RT_SLICES][R][DS_WARP]; // THE ROW SCALE's virtual-lane sums
    const int warp = threadIdx.x / DS_WARP, lane = threadIdx.x % DS_WARP;
    const int eb = warp / RT_SLICES, s = warp % RT_SLICES;
    const int E = a.n_experts, T = a.n_rows, e = (int)blockIdx.x * RT_WS_EB + eb;
    const int t0 = (int)blockIdx.y * R, nr = min(R, T - t0);
    // The expert's weight row into L2 while the previous kernel runs (weights: never written).
    if (blockIdx.y == 0 && s == 0 && lane == 0 && e < E)
        ds_prefetch_l2((const char *)a.w + (size_t)e * a.dim * (WB ? 2 : 4),
                       (size_t)a.dim * (WB ? 2 : 4));
    DS_GRID_DEPENDENCY();
    // Issued with the loads below; only the warps that finish rows use it.
    const float b = a.bias && e < E ? ld_elem(a.bias, a.bias_dtype, (size_t)e) : 0.0f;
    // Deferred norm: THE ROW SCALE's virtual-lane sums of the block's rows of rms_of, item
    // i = warp + 8j being (row i / 4, slice i % 4 = virtual lanes 32·slice .. + 31; one row: the
    // first expert's 4 warps). bf16: the raw words are loaded before the logit's loads, so both
    // are in flight together; f32 (more registers per group) loads and sums them first.
    const int v = s * DS_WARP + lane, G = a.dim / 8;
    constexpr int NI = R == 1 ? 1 : 2; // items per warp: 4R items over 8 warps
    raw8<XB> pre[NI][4];               // <= 4 groups per virtual lane: C <= 4096
    int it_r[NI], it_n[NI];
#pragma unroll
    for (int j = 0; j < NI; j++) {
        const int it = warp + RT_WS_WARPS * j, vv = (it % RT_SLICES) * DS_WARP + lane;
        it_r[j] = it / RT_SLICES;
        it_n[j] = a.rms_of && it_r[j] < nr && vv < G ? (G - vv + RT_VLANES - 1) / RT_VLANES : 0;
#pragma unroll
        for (int m = 0; m < 4; m++)
            if (m < it_n[j])
                pre[j][m] = ld_raw8<XB>(a.rms_of, (size_t)(t0 + it_r[j]) * a.dim +
                                                      8 * ((size_t)vv + (size_t)RT_VLANES * m));
    }
    auto row_sums = [&]() {
#pragma unroll
        for (int j = 0; j < NI; j++) {
            // A virtual lane without groups (C < 1024) still owns its slot: it sums to +0.
            if (!a.rms_of || it_r[j] >= nr) continue;
            float xx = 0.0f;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                if (m >= it_n[j]) break;
                float xv[8];
                unpack8<XB>(pre[j][m], xv);
#pragma unroll
                for (int k = 0; k < 8; k++) xx = __fmaf_rn(xv[k], xv[k], xx);
            }
            s_xx[(warp + RT_WS_WARPS * j) % RT_SLICES][it_r[j]][lane] = xx;
        }
    };
    if (!XB) row_sums();
    float q[R];
    if (e < E) ws_lane_sums<R, XB, WB>(a, e, v, t0, nr, q);
#pragma unroll
    for (int r = 0; r < R; r++)
        s_q[eb][s][r][lane] = e < E ? q[r] : 0.0f;
    if (XB) row_sums();
    __syncthreads();
    if (e < E)
#pragma unroll
        for (int i = 0; i < (R + RT_SLICES - 1) / RT_SLICES; i++)
            if (s + RT_SLICES * i < nr) {
                const int r = s + RT_SLICES * i;
                const float sc = a.rms_of ? ds_row_scale_finish(s_xx[0][r][lane], s_xx[1][r][lane],
                                                                s_xx[2][r][lane], s_xx[3][r][lane],
                                                                a.dim, a.rms_eps)
                                          : 1.0f;
                if (a.rms_of && a.row_scale && blockIdx.x == 0 && eb == 0 && lane == 0)
                    a.row_scale[t0 + r] = sc;
                const float lv = logit_finish(s_q[eb][0][r][lane], s_q[eb][1][r][lane],
                                              s_q[eb][2][r][lane], s_q[eb][3][r][lane], b, sc);
                if (lane == 0)
                    slot_store(rt_slots + (size_t)(t0 + r) * E + e,
                               1ull << 32 | __float_as_uint(lv));
            }
    if (blockIdx.x != 0 || blockIdx.y != 0) return;
    for (int r = warp; r < T; r += RT_WS_WARPS) {
        if (E <= 4 * DS_WARP)
            router_select_slots<4>(a, r);
        else
            router_select_slots<RT_MAX_EXPERTS / DS_WARP>(a, r);
    }
}

// The workspace kernel for R rows per block, by dtype pair.
template <int R> static void launch_ws(const struct ds_router_args *a, cudaStream_t st) {
    const dim3 g(cu_blocks((size_t)a->n_experts, RT_WS_EB), cu_blocks((size_t)a->n_rows, R));
    const dim3 b(RT_WS_WARPS * DS_WARP);
    const bool xb = a->act == DS_ELEM_BF16, wb = a->w_dtype == DS_ELEM_BF16;
    if (xb && wb)
        ds_launch(act_anyw_router_topk_softmax_ws<R, true, true>, g, b, 0, st, *a);
    else if (xb)
        ds_launch(act_anyw_router_topk_softmax_ws<R, true, false>, g, b, 0, st, *a);
    else if (wb)
        ds_launch(act_anyw_router_topk_softmax_ws<R, false, true>, g, b, 0, st, *a);
    else
        ds_launch(act_anyw_router_topk_softmax_ws<R, false, false>, g, b, 0, st, *a);
}

extern "C" enum ds_status ds_router_cuda(const struct ds_router_args *a, void *stream) {
    static const char op[] = "router (cuda)";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dtype(op, "weight", a->w_dtype));
    if (a->bias) CU_TRY(cu_check_dtype(op, "bias", a->bias_dtype));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "dim", a->dim, 1));
    CU_TRY(cu_check_dim(op, "n_experts", a->n_experts, 1));
    if (a->top_k < 1 || a->top_k > a->n_experts || a->top_k > DS_MAX_TOPK)
        return ds_error_set(DS_ERR_ARG, "%s: top_k %d outside [1, min(%d experts, %d)]", op,
                            a->top_k, a->n_experts, DS_MAX_TOPK);
    if (a->n_experts > RT_MAX_EXPERTS)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d experts, at most %d", op, a->n_experts,
                            RT_MAX_EXPERTS);
    if (a->dim % 8)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: dim %d is not a multiple of 8", op, a->dim);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "x", a->x));
    CU_TRY(cu_check_ptr(op, "weight", a->w));
    CU_TRY(cu_check_ptr(op, "expert_ids", a->expert_ids));
    CU_TRY(cu_check_ptr(op, "expert_weights", a->expert_weights));
    if (((uintptr_t)a->x | (uintptr_t)a->w | (uintptr_t)a->rms_of) % 16)
        return ds_error_set(DS_ERR_ARG, "%s: x, weight and rms_of must be 16-byte aligned", op);
    if (a->rms_of && !(a->rms_eps >= 0.0f))
        return ds_error_set(DS_ERR_ARG, "%s: rms_eps %g is negative", op, a->rms_eps);

    if (cu_blocks((size_t)a->n_rows, RT_ROWS) > INT32_MAX / RT_CLUSTER)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d rows: too many", op, a->n_rows);
    // Up to RT_ROWS_ONE rows with a workspace: 4 warps per (expert, row tile) over many plain
    // blocks, the top-k by block (0, 0) (same logits and selection as the cluster path).
    // (Its deferred-norm sums hold at most 4 groups per virtual lane: C <= 4096.)
    if (a->n_rows <= RT_ROWS_ONE && a->workspace && ((uintptr_t)a->workspace % 16) == 0 &&
        (!a->rms_of || a->dim <= 4096) &&
        a->workspace_bytes >= ds_router_workspace_bytes(a->n_rows, a->n_experts)) {
        if (a->n_rows == 1)
            launch_ws<1>(a, DS_STREAM(stream));
        else
            launch_ws<RT_WS_ROWS>(a, DS_STREAM(stream));
        return DS_OK;
    }
    // One row per cluster up to RT_ROWS_ONE rows (the weights come from L2 after the first
    // cluster), RT_ROWS rows per cluster above.
    const bool one = a->n_rows <= RT_ROWS_ONE;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cu_blocks((size_t)a->n_rows, one ? 1 : RT_ROWS) * RT_CLUSTER);
    cfg.blockDim = dim3(RT_THREADS);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = DS_STREAM(stream);
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = RT_CLUSTER;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    // Programmatic dependent launch (the kernel starts with DS_GRID_DEPENDENCY), as ds_launch.
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = ds_pdl_enabled();
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    if (one)
        DS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, act_anyw_router_topk_softmax<1>, *a));
    else
        DS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, act_anyw_router_topk_softmax<RT_ROWS>, *a));
    return DS_OK;
}
