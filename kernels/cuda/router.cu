// kernels/cuda/router.cu: the gpt-oss router on CUDA (ds_router_args): logits = x·Wᵀ + b over the
// E experts, top-k by logit (ties to the lower index), softmax over the k chosen logits.
//
// Dtypes. x f32 or bf16 (`act`, chosen at run time), router weights and bias f32 or bf16. All
// arithmetic is fp32.
//
// Kernels:
//   act_anyw_router_topk_softmax  a thread-block cluster of 8 blocks (16 warps each) per tile of R
//                                  rows (R = 1 up to 8 rows, else 4): cluster warp w owns the experts e ≡ w (mod 128), each lane
//                                  8 consecutive inputs per 256-input step; logit = bias +
//                                  butterfly(Σ lane partials), kept in the owner block's shared
//                                  memory (R = 1 with bf16 x and weights: all of a lane's loads
//                                  in one round). Block 0 gathers the logits over distributed
//                                  shared memory and selects: top-k by repeated warp argmax of a
//                                  64-bit key (logit order, then lower index; taken experts are
//                                  register bits of their owner lane, no shared writes), softmax
//                                  over the k logits in fp32, summed best first.
//   act_anyw_router_topk_softmax_ws  up to 8 rows when the caller gives a workspace: grid
//                                  (E/4, T) plain blocks of 4 warps, one warp per (row, expert)
//                                  with the cluster path's per-logit operations, logits to the
//                                  workspace; the last block to arrive (a self-resetting counter)
//                                  runs the same selection for every row. Same bits as above.
//
// Both kernels start with DS_GRID_DEPENDENCY() and are launched with programmatic dependent launch.
//
// Determinism and batch invariance. Every logit is accumulated per (row, expert) in one fixed order
// (per lane over its 8-element steps in increasing k with explicit fmaf, then the xor butterfly),
// whatever the number of rows or the path; the selection depends on the row's logits only.
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

#define RT_ROWS 4        // router rows per cluster (wide variant)
#define RT_ROWS_ONE 8    // up to this many rows, one row per cluster
#define RT_THREADS 512   // warps per block = 16
#define RT_WARPS (RT_THREADS / DS_WARP)
#define RT_CLUSTER 8     // blocks per cluster (the portable maximum)
#define RT_CW (RT_CLUSTER * RT_WARPS) // warps per cluster = 128
#define RT_MAX_EXPERTS 1024
#define RT_STEP 256                     // inputs per warp step (32 lanes × 8)
#define RT_WS_WARPS 4    // workspace path: warps per block (one expert each)


// ---------------------------------------------------------------------------------------------
// Router

// NaN sorts below every number, so the selection order is total and the butterfly agrees.
static __device__ __forceinline__ float rank_value(float v) { return isnan(v) ? -INFINITY : v; }

// 8 consecutive elements as raw words (one 16-byte load for bf16, two for f32), unpacked at use
// exactly as ld8 does; keeping the raw words halves the registers a bf16 step holds in flight.
template <bool BF16> struct raw8 {
    uint4 v[BF16 ? 1 : 2];
};
template <bool BF16>
static __device__ __forceinline__ raw8<BF16> ld_raw8(const void *base, size_t i) {
    raw8<BF16> r;
    if (BF16) {
        r.v[0] = __ldg((const uint4 *)((const ds_bf16 *)base + i));
    } else {
        const uint4 *p = (const uint4 *)((const float *)base + i);
        r.v[0] = __ldg(p), r.v[BF16 ? 0 : 1] = __ldg(p + 1);
    }
    return r;
}
template <bool BF16>
static __device__ __forceinline__ void unpack8(const raw8<BF16> &r, float *o) {
    if (BF16) {
        const uint32_t w[4] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[2 * j] = __uint_as_float(w[j] << 16);
            o[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    } else {
        const uint4 u = r.v[0], v = r.v[BF16 ? 0 : 1];
        o[0] = __uint_as_float(u.x), o[1] = __uint_as_float(u.y);
        o[2] = __uint_as_float(u.z), o[3] = __uint_as_float(u.w);
        o[4] = __uint_as_float(v.x), o[5] = __uint_as_float(v.y);
        o[6] = __uint_as_float(v.z), o[7] = __uint_as_float(v.w);
    }
}

// The logits of warp cw (experts cw, cw + n_cw, ...) for rows t0 .. t0 + nr − 1 into
// logits[r·ls + e] (the cluster path: shared memory, ls = RT_MAX_EXPERTS; the workspace path:
// global memory, R = 1). The dtypes are template arguments so the loads of the unrolled steps
// are issued together.
template <int R, bool XB, bool WB>
static __device__ __forceinline__ void router_logits(const struct ds_router_args &a, int cw,
                                                     int n_cw, int t0, int nr, float *logits,
                                                     int ls) {
    const int lane = threadIdx.x % DS_WARP, C = a.dim, E = a.n_experts;
    // Steps of this lane (k0 = 8·lane + 256·j, j < n), in rounds of U whose loads are all issued
    // before the first fma (predicated, not behind a loop exit, so they can be in flight together).
    // R = 1 with bf16 x and weights (the CUDA model path): U = 12 covers all 11.25 steps of
    // C = 2880 in one round, i.e. one memory latency per logit instead of two.
    constexpr int U = R == 1 ? (XB && WB ? 12 : 6) : 4;
    const int n = 8 * lane < C ? (C - 8 * lane + RT_STEP - 1) / RT_STEP : 0;
    for (int e = cw; e < E; e += n_cw) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
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
                    if (R == 1) unpack8<XB>(xr[R == 1 ? u : 0], xv);
                    else ld8t<XB>(a.x, (size_t)(t0 + r) * C + k0, xv);
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[r] = __fmaf_rn(xv[i], wv[i], acc[r]);
                }
            }
        }
        const float b = a.bias ? ld_elem(a.bias, a.bias_dtype, (size_t)e) : 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float s = warp_sum_f(acc[r]);
            if (lane == 0 && r < nr) logits[(size_t)r * ls + e] = __fadd_rn(s, b);
        }
    }
}

// Selection key of (logit, expert): larger logit first, then lower index; NaN ranks lowest (as
// −∞) and −0 equals +0 (adding +0 turns −0 into +0), like the reference's comparisons. 0 means
// "none": every real key is larger (order_key(−∞) > 0).
static __device__ __forceinline__ unsigned long long sel_key(float v, int e) {
    return (unsigned long long)order_key(__fadd_rn(rank_value(v), 0.0f)) << 32 |
           (uint32_t)~(uint32_t)e;
}

// The top-k of one row's logits lg[0..E) (shared memory, or global memory written by other
// blocks of this grid: GMEM, read through L2) and their softmax, by one warp, to row t of the
// outputs: k rounds of argmax over the experts not yet taken. Lane l owns experts l + 32j; bit j
// of its register `taken` marks the ones already selected, so the selection writes no memory.
// Lane s % 32 keeps slot s's id and weight; every lane forms the same weights and the same sum
// (best first), so the outputs are written once at the end, coalesced, without reading them back.
template <bool GMEM>
static __device__ __forceinline__ void router_select(const struct ds_router_args &a,
                                                     const float *lg, int t) {
    const int lane = threadIdx.x % DS_WARP, E = a.n_experts, KE = a.top_k;
    uint32_t taken = 0;
    float best0 = 0.0f, sum = 0.0f, my_w[DS_MAX_TOPK / DS_WARP] = {};
    int my_id[DS_MAX_TOPK / DS_WARP] = {};
    for (int s = 0; s < KE; s++) {
        unsigned long long key = 0;
        for (int e = lane, j = 0; e < E; e += DS_WARP, j++)
            if (!(taken >> j & 1u)) {
                const unsigned long long k = sel_key(GMEM ? __ldcg(lg + e) : lg[e], e);
                key = k > key ? k : key;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long ok = __shfl_xor_sync(DS_FULL_MASK, key, o);
            key = ok > key ? ok : key;
        }
        const int be = (int)~(uint32_t)key; // every lane holds the same key now
        if (lane == be % DS_WARP) taken |= 1u << (be / DS_WARP);
        const float bv = rank_value(GMEM ? __ldcg(lg + be) : lg[be]);
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

// Launched in clusters of RT_CLUSTER blocks along x; cluster i serves rows R·i .. R·i + R − 1.
// R = 1 (small T: more clusters, every load of a warp's expert row in flight at once) or R = 4
// (rows share the weight loads). Per (row, expert) both run the same operations: lane partials
// over k0 = 8·lane + 256·j in increasing j, 8 fmaf each in element order, the xor butterfly, then
// the bias; so a row's logits do not depend on R, on the tile or on its neighbours.
template <int R>
__global__ void __launch_bounds__(RT_THREADS)
act_anyw_router_topk_softmax(const struct ds_router_args a) {
    __shared__ float logits[R][RT_MAX_EXPERTS];
    DS_GRID_DEPENDENCY();
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    const int warp = threadIdx.x / DS_WARP;
    const int cw = (int)rank * RT_WARPS + warp; // warp index within the cluster
    const int t0 = (int)(blockIdx.x / RT_CLUSTER) * R, E = a.n_experts;
    const int nr = min(R, a.n_rows - t0);

    const bool xb = a.act == DS_ELEM_BF16, wb = a.w_dtype == DS_ELEM_BF16;
    float *lg = &logits[0][0];
    if (xb && wb) router_logits<R, true, true>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    else if (xb) router_logits<R, true, false>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    else if (wb) router_logits<R, false, true>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    else router_logits<R, false, false>(a, cw, RT_CW, t0, nr, lg, RT_MAX_EXPERTS);
    cluster.sync(); // every block's logits are written
    if (rank == 0) {
        for (int i = threadIdx.x; i < R * E; i += RT_THREADS) {
            const int r = i / E, e = i % E, owner = (e % RT_CW) / RT_WARPS;
            if (owner != 0 && r < nr) logits[r][e] = *cluster.map_shared_rank(&logits[r][e], owner);
        }
    }
    cluster.sync(); // the gather is done (no block may leave while its memory is read)
    if (rank != 0) return;

    // Warp r selects for row r.
    if (warp < nr) router_select<false>(a, &logits[warp][0], t0 + warp);
}

// Small calls with a workspace: arrivals of the blocks of the current call. The last block to
// arrive selects and sets it back to 0, so every call starts from zero (static device memory is
// zero at module load). Calls must not overlap in time: every caller issues its ops on one stream.
__device__ unsigned rt_arrivals;

// Grid (ceil(E / RT_WS_WARPS), T), RT_WS_WARPS warps per block: warp w of block x computes the
// logit of expert RT_WS_WARPS·x + w for row blockIdx.y (router_logits<1>: the cluster path's
// exact per-logit operations) into the workspace (T, E). Every thread fences its stores before
// the block arrives; the last block to arrive reads the logits through L2 and selects for every
// row (router_select, the cluster path's selection). One launch, no cluster, E·T warps at once.
template <bool XB, bool WB>
__global__ void __launch_bounds__(RT_WS_WARPS *DS_WARP)
act_anyw_router_topk_softmax_ws(const struct ds_router_args a) {
    __shared__ bool s_last;
    DS_GRID_DEPENDENCY();
    const int warp = threadIdx.x / DS_WARP, E = a.n_experts, t = (int)blockIdx.y;
    float *lg = (float *)a.workspace;
    router_logits<1, XB, WB>(a, (int)blockIdx.x * RT_WS_WARPS + warp,
                             (int)gridDim.x * RT_WS_WARPS, t, 1, lg + (size_t)t * E, E);
    __threadfence(); // this thread's logits are visible device-wide before the block arrives
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(&rt_arrivals, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence(); // every other block's logits are seen after its arrival
    if (threadIdx.x == 0) rt_arrivals = 0;
    for (int r = warp; r < a.n_rows; r += RT_WS_WARPS) router_select<true>(a, lg + (size_t)r * E, r);
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
    if (((uintptr_t)a->x | (uintptr_t)a->w) % 16)
        return ds_error_set(DS_ERR_ARG, "%s: x and weight must be 16-byte aligned", op);
    if (cu_blocks((size_t)a->n_rows, RT_ROWS) > INT32_MAX / RT_CLUSTER)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d rows: too many", op, a->n_rows);
    // Up to RT_ROWS_ONE rows with a workspace: one warp per (row, expert) over many plain blocks,
    // the top-k by the last block (same logits and selection as the cluster path, same bits).
    if (a->n_rows <= RT_ROWS_ONE && a->workspace && ((uintptr_t)a->workspace % 16) == 0 &&
        a->workspace_bytes >= ds_router_workspace_bytes(a->n_rows, a->n_experts)) {
        const dim3 g(cu_blocks((size_t)a->n_experts, RT_WS_WARPS), (unsigned)a->n_rows);
        const dim3 b(RT_WS_WARPS * DS_WARP);
        cudaStream_t st = DS_STREAM(stream);
        const bool xb = a->act == DS_ELEM_BF16, wb = a->w_dtype == DS_ELEM_BF16;
        if (xb && wb) ds_launch(act_anyw_router_topk_softmax_ws<true, true>, g, b, 0, st, *a);
        else if (xb) ds_launch(act_anyw_router_topk_softmax_ws<true, false>, g, b, 0, st, *a);
        else if (wb) ds_launch(act_anyw_router_topk_softmax_ws<false, true>, g, b, 0, st, *a);
        else ds_launch(act_anyw_router_topk_softmax_ws<false, false>, g, b, 0, st, *a);
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
    if (one) DS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, act_anyw_router_topk_softmax<1>, *a));
    else DS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, act_anyw_router_topk_softmax<RT_ROWS>, *a));
    return DS_OK;
}
