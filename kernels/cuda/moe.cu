// kernels/cuda/moe.cu: the MXFP4 mixture-of-experts block of gpt-oss (gate_up + clamped SwiGLU,
// down, weighted combine) on CUDA; the router that picks the experts is in router.cu.
//
// Dtypes. Activations (x, residual, out) are f32 or bf16 (`act`, chosen at run time), expert
// weights MXFP4 (U8 blocks + E8M0 scales, ds/mxfp4.h), biases f32 or bf16. All arithmetic is fp32. Kernel names read <act>_<weight>w_<op>; `act_` means "f32 or bf16
// activations, fp32 math".
//
// Kernels, in launch order:
//   moe_group_by_expert            (only when T·KE > 32; below, every GEMV block finds its expert
//                                  and pairs from the ids itself: small_group) one block: counts per expert, exclusive offsets, the list of
//                                  experts in use (increasing id) and the pairs (row, slot) of each
//                                  expert in increasing pair index (a stable counting sort by warp
//                                  ballots). Invalid ids are dropped here.
//   act_mxfp4w_moe_gate_up_swiglu  grid (32-row tiles of W1, expert in use, 64-token chunk), 4
//                                  warps. Each warp owns 8 consecutive rows of W1 (4 gate/linear
//                                  pairs) and streams them once for every token tile of its chunk
//                                  (variants: 1; 2/1; wide 8/4/2/1 tokens at a time). Writes h[pair][unit] (f32) with the bias and
//                                  clamped SwiGLU fused.
//   f32_mxfp4w_moe_down            the same GEMV core over W2 with h as input: y[pair][c] (f32),
//                                  down bias added.
//   act_moe_combine                out[t] = residual[t] + Σ_s w_s·y[t·KE+s] (fp32, best first).
//   act_mxfp4w_moe_down_combine_1tok  T = 1, KE <= 4 (decode): the two above in one kernel; block
//                                  x owns 8 features, warp w the w-th expert in use (variant 0's
//                                  warp work), y stays in shared memory, then the combine's exact
//                                  per-feature operations.
//   bf16_mxfp4w_moe_gate_up_mma, bf16_mxfp4w_moe_down_mma, bf16_mxfp4w_moe_down_combine_1tok_mma
//                                  bf16 activations (every T): the same products on tensor cores
//                                  (mma.sync m16n8k16), see "bf16 activations" below; the
//                                  kernels above then serve f32 activations only.
//   bf16_mxfp4w_moe_gate_up_1tok_mma, bf16_mxfp4w_moe_down_1tok_mma
//                                  bf16, T = 1, KE <= 4 (decode): the same bits as the two grouped
//                                  products and the fused down + combine, one block per SM with
//                                  the work spread evenly (see "One token" below); the fused
//                                  kernel and gate_up_mma<1> remain their fallback.
//   bf16_mxfp4w_moe_gate_up_few_mma, bf16_mxfp4w_moe_down_few_mma
//                                  bf16, 2 <= T, T·KE <= 32 (verify): gate_up_mma<1>'s and
//                                  down_mma<1>'s bits laid out like the one-token kernels (items
//                                  over all warps, one block per SM); then the combine. The down
//                                  one while its staged h fits (else down_mma<1>).
// Every kernel starts with DS_GRID_DEPENDENCY() and is launched with programmatic dependent
// launch (ds_launch).
//   mxfp4_dequant_f32              test/inspection decode (ds_mxfp4_dequant_cuda).
//
// GEMV core. Lane l of a warp takes MXFP4 blocks l, l+32, ... of each of its 8 rows: one 16-byte
// load per row and block (32 codes) plus the block's scale byte, so a warp step streams 8 × 512
// contiguous bytes. In the 1-token and 2/1 variants each lane loads its next block before it
// decodes the current one (one step always in flight). Blocks only touched experts are launched (grid y = experts in use, bounded by
// min(E, T·KE) on the host), so a one-token step runs 90 × 4 gate_up blocks, not 90 × E.
//
// MXFP4 decode. A 16-entry E2M1 table in shared memory gives the code values (16 distinct words:
// conflict-free). A 4-byte word holds the 8 codes of 8 consecutive elements, element i in bits
// 4i..4i+3 (low nibble = even element); two shift-and-masks turn it into byte offsets into the
// table (4·code per byte) and a byte permute picks each, so a code costs about one permute and one
// shared load. The lane sums x·e2m1 over 8 elements, then adds that sum times the block scale with
// one fma (exact: 2^(s−127) is a power of two; s = 255, i.e. 2^128, is applied as the group sum
// times 2^64, then the fma with 2^64). ds_mxfp4_dequant_cuda decodes with the same table walk and
// mxfp4_apply_scale (= ds_mxfp4_scale), and the GPU test compares it with ds_mxfp4_dequant_ref
// bit for bit.
//
// Determinism and batch invariance. Every dot product (gate/up/down feature) is
// accumulated per (row, output) in one fixed order: per lane over its blocks in increasing k, 8
// elements at a time with explicit fmaf, then the xor butterfly. Token tiles of 8, 4, 2 or 1 (and
// both instantiations of the GEMV kernels) run the same sequence of operations per token, so the
// result of a row does not depend on how many rows share its expert, on which kernel variant the
// host picked, nor on the position of the row in the batch. The combine sums a row's k experts in
// the router's order. No atomics anywhere.
//
// Workspace (device, from the caller; ds_moe_cuda_workspace_bytes): h (T·KE·I f32), y (T·KE·C
// f32; 2·KE·C at T = 1), the grouping (E+1 offsets, E experts in use, their count: int32; at
// least C/16) and the grouped pair list (T·KE int32), each 256-byte aligned.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"
#include "ds/mxfp4.h"


#define MOE_THREADS 128
#define MOE_WARPS (MOE_THREADS / DS_WARP)
#define MOE_ROWS_PER_WARP 8                                // weight rows streamed together
#define MOE_ROWS_PER_BLOCK (MOE_WARPS * MOE_ROWS_PER_WARP) // 32
#define MOE_TOKEN_CHUNK 64                                 // tokens of one expert per block
#define MOE_TT_WIDE_AVG 3 // average tokens per expert from which the wide tiles pay off
#define MOE_SMALL_PAIRS 32 // T·KE up to which the GEMV blocks group the pairs themselves
#define MOE_MAX_EXPERTS 1024 // experts the grouping kernel counts in shared memory

// ---------------------------------------------------------------------------------------------
// Small device helpers

// v · 2^(s − 127), exactly ds_mxfp4_scale (2^128 for s = 255 applied as two exact halves).
static __device__ __forceinline__ float mxfp4_apply_scale(float v, uint8_t s) {
    if (s == 255) return __fmul_rn(__fmul_rn(v, 0x1p64f), 0x1p64f);
    return __fmul_rn(v, ds_e8m0_to_f32(s));
}

static __device__ __forceinline__ void lut_init(float *lut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = ds_e2m1_to_f32(threadIdx.x);
}

// The E2M1 values of the 8 codes of a packed word (element i = bits 4i..4i+3) from the table.
static __device__ __forceinline__ void e2m1_decode8(const float *lut, uint32_t word, float *w) {
    const uint32_t lo = (word << 2) & 0x3c3c3c3cu; // byte j: 4 · code of element 2j
    const uint32_t hi = (word >> 2) & 0x3c3c3c3cu; // byte j: 4 · code of element 2j + 1
    const char *base = (const char *)lut;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        w[2 * j] = *(const float *)(base + __byte_perm(lo, 0u, 0x4440u + j));
        w[2 * j + 1] = *(const float *)(base + __byte_perm(hi, 0u, 0x4440u + j));
    }
}

// gpt-oss SwiGLU: gate clamped from above only (NaN stays NaN), linear to ±limit, the +1.
static __device__ __forceinline__ float swiglu_clamped(float g, float l, float alpha, float limit) {
    g = g > limit ? limit : g;
    l = l > limit ? limit : (l < -limit ? -limit : l);
    float sig = 1.0f / (1.0f + expf(-alpha * g));
    return g * sig * (l + 1.0f);
}

// ---------------------------------------------------------------------------------------------
// Grouping the (row, slot) pairs by expert

// The grouping area of the workspace: offsets[E + 1], used[E] (the experts with at least one
// pair, increasing), n_used[1].
struct moe_groups {
    const int32_t *offsets, *used, *n_used;
};

static __device__ __forceinline__ struct moe_groups groups_of(const int32_t *g, int E) {
    return {g, g + E + 1, g + 2 * E + 1};
}

// One block of 1024 threads. Warp w handles experts w, w+32, ...; it scans the pairs 32 at a time
// and counts (pass 1) or places (pass 2) the pairs of its expert in increasing pair order.
__global__ void __launch_bounds__(1024)
moe_group_by_expert(const int32_t *ids, int n_pairs, int n_experts, int32_t *groups,
                    int32_t *pairs) {
    __shared__ unsigned count[MOE_MAX_EXPERTS];
    __shared__ unsigned scan_scratch[33];
    DS_GRID_DEPENDENCY();
    int32_t *offsets = groups, *used = groups + n_experts + 1, *n_used = groups + 2 * n_experts + 1;
    const int lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int n_warps = blockDim.x / DS_WARP;
    for (int e = warp; e < n_experts; e += n_warps) {
        unsigned n = 0;
#pragma unroll 4
        for (int p0 = 0; p0 < n_pairs; p0 += DS_WARP) {
            const int p = p0 + lane;
            const bool mine = p < n_pairs && __ldg(ids + p) == e;
            n += __popc(__ballot_sync(DS_FULL_MASK, mine));
        }
        if (lane == 0) count[e] = n;
    }
    __syncthreads();
    // Exclusive offsets and the used list: thread i takes a contiguous run of experts, then block
    // scans (integer sums: exact in any order).
    const int per = (n_experts + blockDim.x - 1) / blockDim.x;
    const int e0 = threadIdx.x * per;
    unsigned run = 0, run_used = 0;
    for (int e = e0; e < e0 + per && e < n_experts; e++) run += count[e], run_used += count[e] > 0;
    unsigned total, total_used;
    unsigned base = block_excl_scan_u(run, scan_scratch, &total);
    unsigned ubase = block_excl_scan_u(run_used, scan_scratch, &total_used);
    __syncthreads(); // every count[] read before it is overwritten with offsets
    for (int e = e0; e < e0 + per && e < n_experts; e++) {
        unsigned c = count[e];
        count[e] = base;
        offsets[e] = (int32_t)base;
        if (c) used[ubase++] = e;
        base += c;
    }
    if (threadIdx.x == 0) offsets[n_experts] = (int32_t)total, *n_used = (int32_t)total_used;
    __syncthreads();
    for (int e = warp; e < n_experts; e += n_warps) {
        unsigned at = count[e];
        for (int p0 = 0; p0 < n_pairs; p0 += DS_WARP) {
            const int p = p0 + lane;
            const bool mine = p < n_pairs && __ldg(ids + p) == e;
            const unsigned m = __ballot_sync(DS_FULL_MASK, mine);
            if (mine) pairs[at + __popc(m & ((1u << lane) - 1u))] = p;
            at += __popc(m);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// MXFP4 GEMV core

// One warp, MOE_ROWS_PER_WARP consecutive rows [r0, r0+8) of one expert's MXFP4 matrix (K inputs),
// TT input rows (xrows[t] of x, row stride K). acc[r][t] gets the warp-reduced dot products.
// Per (r, t) the order is fixed: lane blocks in increasing k; inside a block, 4 groups of 8
// elements, each Σ_i x·e2m1 for i = 0..7 from a product, then acc = fma(sum, scale, acc); finally
// the xor butterfly over the lanes.
//
// Cost per decoded code (TT = 1): a quarter of a mask, one permute, one shared load and one fma,
// plus an eighth of an fma for the scale. The 4 groups of a block are unrolled, so the 8 packed
// words of a row are indexed statically (no register rotation) and the scale of a (row, block)
// is formed once, not once per group. A block scale of 255 (2^128, not a float) takes the
// per-lane slow path: the group sum times 2^64 (exact), then fma with 2^64. For every other scale
// that path multiplies by 1 (exact), so both paths give the same bits.
template <int TT, bool BIG, bool XB>
static __device__ __forceinline__ void mxfp4_block_dot(const uint4 *wq_in, const float *sf,
                                                       const uint32_t *sb, int b, const void *x,
                                                       int K, const int *xrows, const float *lut,
                                                       float acc[MOE_ROWS_PER_WARP][TT]) {
    uint4 wq[MOE_ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++) wq[r] = wq_in[r];
    // Small tiles unroll the groups (the word rotation below becomes register renaming); wide
    // tiles keep one group of x in registers at a time.
#pragma unroll(TT <= 2 ? 4 : 1)
    for (int q = 0; q < 4; q++) {
        float xv[TT][8];
#pragma unroll
        for (int t = 0; t < TT; t++)
            ld8t<XB>(x, (size_t)xrows[t] * K + (size_t)b * DS_MXFP4_BLOCK + 8 * q, xv[t]);
#pragma unroll
        for (int r = 0; r < MOE_ROWS_PER_WARP; r++) {
            float w[8];
            e2m1_decode8(lut, wq[r].x, w);
            wq[r].x = wq[r].y, wq[r].y = wq[r].z, wq[r].z = wq[r].w;
            const float pre = BIG && sb[r] == 255 ? 0x1p64f : 1.0f;
#pragma unroll
            for (int t = 0; t < TT; t++) {
                float part = __fmul_rn(xv[t][0], w[0]);
#pragma unroll
                for (int i = 1; i < 8; i++) part = __fmaf_rn(xv[t][i], w[i], part);
                if (BIG) part = __fmul_rn(part, pre);
                acc[r][t] = __fmaf_rn(part, sf[r], acc[r][t]);
            }
        }
    }
}

// The 8 weight words and scale bytes of MXFP4 block b of the warp's rows.
static __device__ __forceinline__ void mxfp4_rows_load(const uint8_t *bp, const uint8_t *sp,
                                                       size_t row_b, size_t row_s, int b,
                                                       uint4 *wq, uint32_t *sb) {
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++)
        wq[r] = ld_stream_u4(bp + r * row_b + (size_t)b * DS_MXFP4_BLOCK_BYTES);
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++) sb[r] = __ldg(sp + r * row_s + b);
}

// XB: x is bf16 (else f32). PF (the 1-token and 2/1 variants, memory-bound): the loads of the
// lane's next block are issued before the current block is decoded (software pipelining: a warp
// keeps one step of weights in flight while it computes); the wide variant is compute-bound and
// keeps its registers for the tokens. Neither changes any arithmetic.
template <int TT, bool XB, bool PF>
static __device__ __forceinline__ void mxfp4_rows_dot(const uint8_t *blocks, const uint8_t *scales,
                                                      int K, int r0, const void *x,
                                                      const int *xrows, const float *lut,
                                                      float acc[MOE_ROWS_PER_WARP][TT]) {
    const int lane = threadIdx.x % DS_WARP, nb = K / DS_MXFP4_BLOCK;
    const size_t row_b = (size_t)K / 2, row_s = (size_t)nb;
    const uint8_t *bp = blocks + (size_t)r0 * row_b, *sp = scales + (size_t)r0 * row_s;
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++)
#pragma unroll
        for (int t = 0; t < TT; t++) acc[r][t] = 0.0f;
    uint4 nq[MOE_ROWS_PER_WARP];
    uint32_t ns[MOE_ROWS_PER_WARP];
    if (PF && lane < nb) mxfp4_rows_load(bp, sp, row_b, row_s, lane, nq, ns);
#pragma unroll 1
    for (int b = lane; b < nb; b += DS_WARP) {
        uint4 wq[MOE_ROWS_PER_WARP];
        uint32_t sb[MOE_ROWS_PER_WARP];
        if (PF) {
#pragma unroll
            for (int r = 0; r < MOE_ROWS_PER_WARP; r++) wq[r] = nq[r], sb[r] = ns[r];
            if (b + DS_WARP < nb) mxfp4_rows_load(bp, sp, row_b, row_s, b + DS_WARP, nq, ns);
        } else {
            mxfp4_rows_load(bp, sp, row_b, row_s, b, wq, sb);
        }
        float sf[MOE_ROWS_PER_WARP];
        bool big = false;
#pragma unroll
        for (int r = 0; r < MOE_ROWS_PER_WARP; r++) {
            big |= sb[r] == 255;
            sf[r] = sb[r] == 255 ? 0x1p64f : ds_e8m0_to_f32((uint8_t)sb[r]);
        }
        if (big) mxfp4_block_dot<TT, true, XB>(wq, sf, sb, b, x, K, xrows, lut, acc);
        else mxfp4_block_dot<TT, false, XB>(wq, sf, sb, b, x, K, xrows, lut, acc);
    }
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++)
#pragma unroll
        for (int t = 0; t < TT; t++) acc[r][t] = warp_sum_f(acc[r][t]);
}

// One token through 8 rows (bp, sp: the rows' first block and scale), as mxfp4_rows_dot<1, XB,
// true> computes it (the same mxfp4_block_dot calls in the same order), for a warp that streams
// several row tiles in a row: nq/ns hold the loads of the lane's first block of these rows, issued
// earlier; the lane's last step issues those of the next rows (nbp, nsp; NULL: none), so the DRAM
// latency at a tile boundary overlaps this tile's last decode.
template <bool XB>
static __device__ __forceinline__ void mxfp4_rows_dot_stream(
    const uint8_t *bp, const uint8_t *sp, const uint8_t *nbp, const uint8_t *nsp, int K,
    const void *x, int xrow, const float *lut, uint4 nq[MOE_ROWS_PER_WARP],
    uint32_t ns[MOE_ROWS_PER_WARP], float acc[MOE_ROWS_PER_WARP][1]) {
    const int lane = threadIdx.x % DS_WARP, nb = K / DS_MXFP4_BLOCK;
    const size_t row_b = (size_t)K / 2, row_s = (size_t)nb;
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++) acc[r][0] = 0.0f;
#pragma unroll 1
    for (int b = lane; b < nb; b += DS_WARP) {
        uint4 wq[MOE_ROWS_PER_WARP];
        uint32_t sb[MOE_ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < MOE_ROWS_PER_WARP; r++) wq[r] = nq[r], sb[r] = ns[r];
        if (b + DS_WARP < nb) mxfp4_rows_load(bp, sp, row_b, row_s, b + DS_WARP, nq, ns);
        else if (nbp) mxfp4_rows_load(nbp, nsp, row_b, row_s, lane, nq, ns);
        float sf[MOE_ROWS_PER_WARP];
        bool big = false;
#pragma unroll
        for (int r = 0; r < MOE_ROWS_PER_WARP; r++) {
            big |= sb[r] == 255;
            sf[r] = sb[r] == 255 ? 0x1p64f : ds_e8m0_to_f32((uint8_t)sb[r]);
        }
        if (big) mxfp4_block_dot<1, true, XB>(wq, sf, sb, b, x, K, &xrow, lut, acc);
        else mxfp4_block_dot<1, false, XB>(wq, sf, sb, b, x, K, &xrow, lut, acc);
    }
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++) acc[r][0] = warp_sum_f(acc[r][0]);
}

// The deferred norm's row scale of token t (ds_moe_args.row_scale, from the router): the gate_up
// sums are multiplied by it before the bias. 1 without one (an exact multiply: same bits).
static __device__ __forceinline__ float moe_row_scale(const struct ds_moe_args &a, int t) {
    return a.row_scale ? a.row_scale[t] : 1.0f;
}
// out[i] = v rounded to act and, with a deferred-norm gain, norm_out[i] = act(g · the stored
// value): the next norm's g ⊙ x (ds/kernel_args.h). moe_store_out_g takes g = norm_gain[c]
// loaded by the caller (early, off the kernel's dependent path).
static __device__ __forceinline__ void moe_store_out_g(const struct ds_moe_args &a, size_t i,
                                                       float v, float g) {
    st_elem(a.out, a.act, i, v);
    if (a.norm_gain) {
        const float o = a.act == DS_ELEM_BF16 ? ds_bf16_to_f32(ds_f32_to_bf16(v)) : v;
        st_elem(a.norm_out, a.act, i, __fmul_rn(g, o)); // ds_norm_gain_mul's product
    }
}
static __device__ __forceinline__ float moe_gain(const struct ds_moe_args &a, int c) {
    return a.norm_gain ? ld_elem(a.norm_gain, a.norm_gain_dtype, (size_t)c) : 0.0f;
}
static __device__ __forceinline__ void moe_store_out(const struct ds_moe_args &a, size_t i, int c,
                                                     float v) {
    moe_store_out_g(a, i, v, moe_gain(a, c));
}

// The gate_up work of one warp at one token per pair (variant 0), streamed over row tiles
// rt = blockIdx.x, blockIdx.x + gridDim.x, ... of expert e (the host sizes grid x so the whole grid
// is about one wave) and, per tile, the pairs list[0..n) in order. Per (row, pair) the arithmetic
// is gate_up_tile<1>'s; only the order in which a warp visits its (tile, pair) items changes.
template <bool XB>
static __device__ __forceinline__ void gate_up_stream_1tok(const struct ds_moe_args &a, int e,
                                                           const int32_t *list, int n,
                                                           const float *lut, float *h) {
    const int C = a.dim, I = a.inter, KE = a.top_k, lane = threadIdx.x % DS_WARP;
    const int warp = threadIdx.x / DS_WARP, nb = C / DS_MXFP4_BLOCK;
    const int tiles = 2 * I / MOE_ROWS_PER_BLOCK; // 2I is a multiple of 64
    const size_t ex_rows = (size_t)e * 2 * I, row_b = (size_t)C / 2, row_s = (size_t)nb;
    const uint8_t *gb = a.gate_up_blocks + ex_rows * row_b;
    const uint8_t *gs = a.gate_up_scales + ex_rows * row_s;
    int rt = (int)blockIdx.x;
    if (rt >= tiles || n <= 0) return;
    uint4 nq[MOE_ROWS_PER_WARP];
    uint32_t ns[MOE_ROWS_PER_WARP];
    int r0 = rt * MOE_ROWS_PER_BLOCK + warp * MOE_ROWS_PER_WARP;
    if (lane < nb) mxfp4_rows_load(gb + r0 * row_b, gs + r0 * row_s, row_b, row_s, lane, nq, ns);
    for (;;) {
        const int nrt = rt + (int)gridDim.x;
        const int nr0 = nrt * MOE_ROWS_PER_BLOCK + warp * MOE_ROWS_PER_WARP;
        for (int i = 0; i < n; i++) {
            // The rows streamed after this item: the same rows for the next pair, else the next
            // tile's, else none.
            const int q0 = i + 1 < n ? r0 : nrt < tiles ? nr0 : -1;
            const uint8_t *nbp = q0 >= 0 ? gb + q0 * row_b : NULL;
            const uint8_t *nsp = q0 >= 0 ? gs + q0 * row_s : NULL;
            const int p = list[i];
            float acc[MOE_ROWS_PER_WARP][1];
            mxfp4_rows_dot_stream<XB>(gb + r0 * row_b, gs + r0 * row_s, nbp, nsp, C, a.x, p / KE,
                                      lut, nq, ns, acc);
#pragma unroll
            for (int q = 0; q < MOE_ROWS_PER_WARP / 2; q++) {
                if (lane != q) continue;
                const size_t row = ex_rows + r0 + 2 * q;
                const float bg = ld_elem(a.gate_up_bias, a.bias_dtype, row);
                const float bl = ld_elem(a.gate_up_bias, a.bias_dtype, row + 1);
                const float rs = moe_row_scale(a, p / KE);
                const float g = __fadd_rn(__fmul_rn(acc[2 * q][0], rs), bg),
                            l = __fadd_rn(__fmul_rn(acc[2 * q + 1][0], rs), bl);
                h[(size_t)p * I + r0 / 2 + q] = swiglu_clamped(g, l, a.swiglu_alpha, a.swiglu_limit);
            }
        }
        if (nrt >= tiles) break;
        rt = nrt, r0 = nr0;
    }
}

// TT tokens (pairs list[0..TT)) through the warp's 4 gate/linear row pairs: h = SwiGLU(W1·x + b1).
template <int TT, bool PF>
static __device__ __forceinline__ void gate_up_tile(const struct ds_moe_args &a, int e, int r0,
                                                    const int32_t *list, const float *lut,
                                                    float *h) {
    const int C = a.dim, I = a.inter, KE = a.top_k, lane = threadIdx.x % DS_WARP;
    int xrows[TT], pr[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) pr[t] = list[t], xrows[t] = pr[t] / KE;
    const size_t ex_rows = (size_t)e * 2 * I;
    float acc[MOE_ROWS_PER_WARP][TT];
    const uint8_t *gb = a.gate_up_blocks + ex_rows * (C / 2);
    const uint8_t *gs = a.gate_up_scales + ex_rows * (C / DS_MXFP4_BLOCK);
    if (a.act == DS_ELEM_BF16) mxfp4_rows_dot<TT, true, PF>(gb, gs, C, r0, a.x, xrows, lut, acc);
    else mxfp4_rows_dot<TT, false, PF>(gb, gs, C, r0, a.x, xrows, lut, acc);
#pragma unroll
    for (int q = 0; q < MOE_ROWS_PER_WARP / 2; q++) {
        const size_t row = ex_rows + r0 + 2 * q;
        const float bg = ld_elem(a.gate_up_bias, a.bias_dtype, row);
        const float bl = ld_elem(a.gate_up_bias, a.bias_dtype, row + 1);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (lane != (q * TT + t) % DS_WARP) continue;
            const float rs = moe_row_scale(a, xrows[t]);
            const float g = __fadd_rn(__fmul_rn(acc[2 * q][t], rs), bg),
                        l = __fadd_rn(__fmul_rn(acc[2 * q + 1][t], rs), bl);
            h[(size_t)pr[t] * I + r0 / 2 + q] =
                swiglu_clamped(g, l, a.swiglu_alpha, a.swiglu_limit);
        }
    }
}

// TT tokens through the warp's 8 down rows: y = W2·h + b2, stored at y[pair·ys + r0 − rb + r]
// (the workspace: ys = C, rb = 0; the fused combine's shared tile: ys = 8, rb = r0).
template <int TT, bool PF>
static __device__ __forceinline__ void down_tile(const struct ds_moe_args &a, int e, int r0,
                                                 const int32_t *list, const float *lut,
                                                 const float *h, float *y, size_t ys = 0,
                                                 int rb = 0) {
    const int C = a.dim, I = a.inter, lane = threadIdx.x % DS_WARP;
    int pr[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) pr[t] = list[t];
    const size_t ex_rows = (size_t)e * C;
    float acc[MOE_ROWS_PER_WARP][TT];
    mxfp4_rows_dot<TT, false, PF>(a.down_blocks + ex_rows * (I / 2),
                              a.down_scales + ex_rows * (I / DS_MXFP4_BLOCK), I, r0, h, pr, lut,
                              acc);
#pragma unroll
    for (int r = 0; r < MOE_ROWS_PER_WARP; r++) {
        const float b = ld_elem(a.down_bias, a.bias_dtype, ex_rows + r0 + r);
#pragma unroll
        for (int t = 0; t < TT; t++)
            if (lane == (r * TT + t) % DS_WARP)
                y[(size_t)pr[t] * (ys ? ys : (size_t)C) + (r0 - rb) + r] =
                    __fadd_rn(acc[r][t], b);
    }
}

// The expert of the pairs when T·KE <= 32 (decode and small verifies), found by warp 0 of every
// block from the ids themselves, so no grouping kernel runs: lane p holds pair p's id; the
// distinct valid ids ranked in increasing order give "the y-th expert in use" exactly as the
// grouping kernel's list does, and a ballot lists its pairs in increasing pair index (the
// grouping kernel's order). Returns the expert, or -1 when fewer than y + 1 experts are in use.
static __device__ __forceinline__ int small_group(const int32_t *ids, int n_pairs, int E, int y,
                                                  int32_t *list, int *n_out) {
    const int lane = threadIdx.x % DS_WARP;
    const int id = lane < n_pairs ? __ldg(ids + lane) : -1;
    const bool valid = id >= 0 && id < E;
    const unsigned same = __match_any_sync(DS_FULL_MASK, id);
    const bool first = valid && __ffs(same) - 1 == lane;
    const unsigned firsts = __ballot_sync(DS_FULL_MASK, first);
    int rank = 0; // distinct valid ids below mine
    for (unsigned m = firsts; m; m &= m - 1) {
        const int q = __ffs(m) - 1;
        rank += __shfl_sync(DS_FULL_MASK, id, q) < id;
    }
    const unsigned hit = __ballot_sync(DS_FULL_MASK, first && rank == y);
    if (!hit) return -1;
    const int e = __shfl_sync(DS_FULL_MASK, id, __ffs(hit) - 1);
    const unsigned mine = __ballot_sync(DS_FULL_MASK, valid && id == e);
    if (valid && id == e) list[__popc(mine & ((1u << lane) - 1u))] = lane;
    *n_out = __popc(mine);
    return e;
}

// A block's expert, its pairs list[beg, end) and (GEMV kernels) the warp's first weight row r0.
struct moe_block {
    int e, beg, end, r0;
    const int32_t *list;
};

// The expert in use number blockIdx.y and its pairs list[beg, end) in token chunk blockIdx.z of
// `chunk` pairs: from the grouping kernel's lists, or (groups == NULL: the small path, T·KE <= 32,
// one chunk) found by warp 0 with small_group into the block's shared s_list, followed by a
// barrier that every thread reaches. False when the block has nothing to do (block-uniform).
static __device__ __forceinline__ bool moe_block_pairs(const struct ds_moe_args &a,
                                                       const int32_t *groups, const int32_t *pairs,
                                                       int chunk, int32_t *s_list, int *s_info,
                                                       struct moe_block *k) {
    if (groups) {
        const struct moe_groups gr = groups_of(groups, a.n_experts);
        if ((int)blockIdx.y >= *gr.n_used) return false;
        k->e = gr.used[blockIdx.y];
        const int lo = gr.offsets[k->e], hi = gr.offsets[k->e + 1];
        k->beg = lo + (int)blockIdx.z * chunk;
        k->end = min(hi, k->beg + chunk);
        k->list = pairs;
        return k->beg < k->end;
    }
    if (threadIdx.x < DS_WARP) {
        int n = 0;
        const int e =
            small_group(a.expert_ids, a.n_rows * a.top_k, a.n_experts, (int)blockIdx.y, s_list, &n);
        if (threadIdx.x == 0) s_info[0] = e, s_info[1] = n;
    }
    __syncthreads(); // every thread reaches it: the exit below is block-uniform
    k->e = s_info[0], k->beg = 0, k->end = s_info[1], k->list = s_list;
    return k->e >= 0;
}

// Block set-up of both GEMV kernels: the block's pairs (moe_block_pairs), the E2M1 table, and
// the warp's first weight row r0 of n_w_rows. False when the block or the warp has nothing to do.
static __device__ __forceinline__ bool block_begin(const struct ds_moe_args &a,
                                                   const int32_t *groups, const int32_t *pairs,
                                                   int n_w_rows, float *lut, int32_t *s_list,
                                                   int *s_info, struct moe_block *k) {
    lut_init(lut); // before moe_block_pairs' barrier (small path) or the one below
    if (!moe_block_pairs(a, groups, pairs, MOE_TOKEN_CHUNK, s_list, s_info, k)) return false;
    if (groups) __syncthreads(); // the table
    k->r0 = blockIdx.x * MOE_ROWS_PER_BLOCK + (threadIdx.x / DS_WARP) * MOE_ROWS_PER_WARP;
    return k->r0 < n_w_rows;
}

// Three variants with the same operations per token (only the token tiles and the register
// budget differ): V = 0 (one token per pair: decode) tiles of 1, gate_up streamed over several row
// tiles per warp; V = 1 tiles of 2 (no prefetch) and 1 (prefetch); V = 2 (wide: several tokens per
// expert) tiles of 8, 4, 2, 1. V = 0 and V = 1 run 3 blocks per SM (168 registers): V = 1 at 2
// blocks per SM (217 registers, the 2-token tile with the prefetch) made the T = 4 verify slower.
#define MOE_MIN_BLOCKS(V) ((V) <= 1 ? 3 : 2)

template <int V>
__global__ void __launch_bounds__(MOE_THREADS, MOE_MIN_BLOCKS(V))
act_mxfp4w_moe_gate_up_swiglu(const struct ds_moe_args a, const int32_t *groups,
                              const int32_t *pairs, float *h) {
    __shared__ float lut[16];
    __shared__ int32_t s_list[DS_WARP];
    __shared__ int s_info[2];
    struct moe_block k;
    DS_GRID_DEPENDENCY();
    if (!block_begin(a, groups, pairs, 2 * a.inter, lut, s_list, s_info, &k)) return;
    int i = k.beg;
    const int e = k.e, end = k.end, r0 = k.r0;
    const int32_t *list = k.list;
    if constexpr (V == 0) {
        // Grid x may be smaller than the row tiles: each warp streams tiles blockIdx.x + j·gridDim.x.
        if (a.act == DS_ELEM_BF16) gate_up_stream_1tok<true>(a, e, list + i, end - i, lut, h);
        else gate_up_stream_1tok<false>(a, e, list + i, end - i, lut, h);
    } else {
        if constexpr (V == 2) {
            for (; end - i >= 8; i += 8) gate_up_tile<8, false>(a, e, r0, list + i, lut, h);
            if (end - i >= 4) gate_up_tile<4, false>(a, e, r0, list + i, lut, h), i += 4;
        }
        // V = 1: the 2-token tile without the prefetch keeps 3 blocks per SM (see MOE_MIN_BLOCKS).
        for (; end - i >= 2; i += 2) gate_up_tile<2, false>(a, e, r0, list + i, lut, h);
        for (; i < end; i++) gate_up_tile<1, (V < 2)>(a, e, r0, list + i, lut, h);
    }
}

template <int V>
__global__ void __launch_bounds__(MOE_THREADS, MOE_MIN_BLOCKS(V))
f32_mxfp4w_moe_down(const struct ds_moe_args a, const int32_t *groups, const int32_t *pairs,
                    const float *h, float *y) {
    __shared__ float lut[16];
    __shared__ int32_t s_list[DS_WARP];
    __shared__ int s_info[2];
    struct moe_block k;
    DS_GRID_DEPENDENCY();
    if (!block_begin(a, groups, pairs, a.dim, lut, s_list, s_info, &k)) return;
    int i = k.beg;
    const int e = k.e, end = k.end, r0 = k.r0;
    const int32_t *list = k.list;
    if constexpr (V == 2) {
        for (; end - i >= 8; i += 8) down_tile<8, (V < 2)>(a, e, r0, list + i, lut, h, y);
        if (end - i >= 4) down_tile<4, (V < 2)>(a, e, r0, list + i, lut, h, y), i += 4;
    }
    if constexpr (V >= 1)
        for (; end - i >= 2; i += 2) down_tile<2, false>(a, e, r0, list + i, lut, h, y);
    for (; i < end; i++) down_tile<1, (V < 2)>(a, e, r0, list + i, lut, h, y);
}

// out[t][c] = residual[t][c] + Σ_s w_s·y[t·KE+s][c], s in the router's order; a slot whose expert
// id is out of range contributes nothing (it was never grouped, so its y is stale).
// KE <= 4 (gpt-oss): the ids, weights, residual and gain are loaded before the grid dependency
// (the kernels of this op write none of them: the router's outputs are three launches back at
// least, the residual older, the gain a weight) and the y values together after it, so the
// kernel's dependent part is one round trip; the same operations in the same order.
__global__ void act_moe_combine(const struct ds_moe_args a, const float *y) {
    const int t = blockIdx.x, C = a.dim, KE = a.top_k;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (KE <= 4) {
        float w[4], r = 0.0f, g = 0.0f, yv[4];
        unsigned valid = 0;
        if (c < C) {
#pragma unroll
            for (int s = 0; s < 4; s++) {
                w[s] = 0.0f;
                if (s < KE) {
                    const size_t p = (size_t)t * KE + s;
                    const int e = __ldg(a.expert_ids + p);
                    if (e >= 0 && e < a.n_experts) valid |= 1u << s, w[s] = __ldg(a.expert_weights + p);
                }
            }
            if (a.residual) r = ld_elem(a.residual, a.act, (size_t)t * C + c);
            g = moe_gain(a, c);
        }
        DS_GRID_DEPENDENCY();
        if (c >= C) return;
#pragma unroll
        for (int s = 0; s < 4; s++)
            yv[s] = valid >> s & 1u ? y[((size_t)t * KE + s) * C + c] : 0.0f;
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < 4; s++)
            if (valid >> s & 1u) acc = __fmaf_rn(w[s], yv[s], acc);
        if (a.residual) acc = __fadd_rn(acc, r);
        moe_store_out_g(a, (size_t)t * C + c, acc, g);
        return;
    }
    DS_GRID_DEPENDENCY();
    if (c >= C) return;
    float acc = 0.0f;
    for (int s = 0; s < KE; s++) {
        const size_t p = (size_t)t * KE + s;
        const int e = a.expert_ids[p];
        if (e < 0 || e >= a.n_experts) continue;
        acc = __fmaf_rn(a.expert_weights[p], y[p * C + c], acc);
    }
    if (a.residual) acc = __fadd_rn(acc, ld_elem(a.residual, a.act, (size_t)t * C + c));
    moe_store_out(a, (size_t)t * C + c, c, acc);
}

// Feature c of the one token: residual + Σ_s w_s·y_s in the router's order (act_moe_combine's
// operations); y_s = ys[s·stride] (shared memory), invalid slots skipped.
static __device__ __forceinline__ void combine_1tok(const struct ds_moe_args &a, int c,
                                                    const float *ys, int stride) {
    float acc = 0.0f;
    for (int s = 0; s < a.top_k; s++) {
        const int ee = a.expert_ids[s];
        if (ee < 0 || ee >= a.n_experts) continue;
        acc = __fmaf_rn(a.expert_weights[s], ys[s * stride], acc);
    }
    if (a.residual) acc = __fadd_rn(acc, ld_elem(a.residual, a.act, (size_t)c));
    moe_store_out(a, (size_t)c, c, acc);
}

// One token (T = 1, KE <= 4: decode), down and combine in one kernel: block x owns features
// [8x, 8x + 8), its warp w the w-th expert in use (small_group) for those 8 rows, i.e. the down
// variant 0's warp work (down_tile<1>) with the y values kept in shared memory; then the block
// combines them exactly as act_moe_combine does (s in the router's order, fmaf, + residual), so
// its bits equal those of the down + combine pair. Saves the combine launch and the y round trip.
__global__ void __launch_bounds__(MOE_THREADS, MOE_MIN_BLOCKS(0))
act_mxfp4w_moe_down_combine_1tok(const struct ds_moe_args a, const float *h) {
    __shared__ float lut[16];
    __shared__ int32_t s_list[MOE_WARPS][DS_WARP];
    __shared__ float ys[MOE_WARPS][MOE_ROWS_PER_WARP]; // [pair][row]; pairs < KE <= 4
    DS_GRID_DEPENDENCY();
    const int warp = threadIdx.x / DS_WARP, KE = a.top_k;
    const int r0 = blockIdx.x * MOE_ROWS_PER_WARP;
    lut_init(lut);
    int n = 0;
    const int e = small_group(a.expert_ids, KE, a.n_experts, warp, s_list[warp], &n);
    __syncthreads(); // the table and every warp's list
    if (e >= 0)
        for (int i = 0; i < n; i++)
            down_tile<1, true>(a, e, r0, s_list[warp] + i, lut, h, &ys[0][0], MOE_ROWS_PER_WARP,
                               r0);
    __syncthreads();
    if (threadIdx.x < MOE_ROWS_PER_WARP)
        combine_1tok(a, r0 + (int)threadIdx.x, &ys[0][0] + threadIdx.x, MOE_ROWS_PER_WARP);
}

// ---------------------------------------------------------------------------------------------
// Workspace plan

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

struct moe_ws {
    float *h;
    float *y;
    int32_t *groups;
    int32_t *pairs;
    size_t bytes;
};

// Byte offsets of the four areas; base == NULL only sizes the plan.
static struct moe_ws moe_ws_plan(void *base, int T, int C, int I, int E, int KE) {
    const size_t np = (size_t)T * KE;
    // One token (T = 1): y holds the down kernel's 2·KE·C partial sums and the grouping area its
    // C/16 arrival counters (bf16_mxfp4w_moe_down_1tok_mma; T >= 2 needs at least as much).
    const size_t ny = (size_t)(T > 1 ? T : 2) * KE * C;
    const size_t ng = 2 * (size_t)E + 2 > (size_t)C / 16 ? 2 * (size_t)E + 2 : (size_t)C / 16;
    const size_t o_h = 0, o_y = o_h + align256(np * I * sizeof(float));
    const size_t o_grp = o_y + align256(ny * sizeof(float));
    const size_t o_pairs = o_grp + align256(ng * sizeof(int32_t));
    struct moe_ws w = {NULL, NULL, NULL, NULL, o_pairs + align256(np * sizeof(int32_t))};
    if (base) {
        char *b = (char *)base;
        w.h = (float *)(b + o_h), w.y = (float *)(b + o_y);
        w.groups = (int32_t *)(b + o_grp), w.pairs = (int32_t *)(b + o_pairs);
    }
    return w;
}

extern "C" size_t ds_moe_cuda_workspace_bytes(int n_rows, int dim, int inter, int n_experts,
                                              int top_k) {
    if (n_rows <= 0 || dim <= 0 || inter <= 0 || n_experts <= 0 || top_k <= 0) return 0;
    return moe_ws_plan(NULL, n_rows, dim, inter, n_experts, top_k).bytes;
}

// Declared in ds/kernels.h: one size for both backends.
extern "C" size_t ds_moe_workspace_bytes_v2(int n_rows, int dim, int inter, int n_experts,
                                            int top_k) {
    const size_t ref = ds_moe_workspace_bytes(n_rows, inter, top_k);
    const size_t cuda = ds_moe_cuda_workspace_bytes(n_rows, dim, inter, n_experts, top_k);
    return ref > cuda ? ref : cuda;
}

// SMs of the current device (cached; 132 on an H200 if the query fails).
static int moe_sm_count(void) {
    static int n = 0;
    if (n > 0) return n;
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
        cudaGetLastError();
        return 132;
    }
    return n = v;
}

// Grid x of the variant-0 gate_up (its warps stream row tiles blockIdx.x + j·gridDim.x): the
// fewest waves of resident blocks that cover tiles × n_used, with the tiles spread evenly over
// them (120b, one token: 180 tiles × 4 experts on 132 SMs × 3 blocks -> 90 × 4 blocks of 2 tiles,
// one wave, instead of 720 blocks in 1.8 waves).
static unsigned moe_v0_grid_x(unsigned tiles, unsigned n_used) {
    const unsigned slots = (unsigned)moe_sm_count() * MOE_MIN_BLOCKS(0);
    const unsigned long long total = (unsigned long long)tiles * n_used;
    const unsigned waves = (unsigned)((total + slots - 1) / slots);
    return (tiles + waves - 1) / waves;
}

// ---------------------------------------------------------------------------------------------
// bf16 activations: the MXFP4 expert GEMMs on tensor cores
//
// With bf16 activations every expert product (gate_up and down, every T) runs on mma.sync
// m16n8k16 (bf16 in, fp32 accumulate) instead of the CUDA-core GEMV above: the GEMV spends ~5
// instructions per decoded code and its verify-sized tiles are FMA-bound; here a code costs
// about one ALU instruction and half a shared-memory load, and wide tiles run on tensor cores.
//
// Warp tile: 16 weight rows (mma rows g and g + 8 of lane (g, t) = weight rows 2g and 2g + 1,
// adjacent, so a gate row and its linear row land in the same lane) × 8 tokens per n-tile
// (column g = the g-th pair of the tile), NT n-tiles. K step ("chunk"): 4 MXFP4 blocks; lane t
// copies block 4c + t of both its rows (16 bytes each, cp.async into its warp's stage ring, see
// mm_issue_w) and loads the same block of its token's activations (64 bytes, one chunk ahead at
// NT = 1). Two accumulators per tile (even and odd m) are added at the end. Byte j of a block holds
// elements 2j (low nibble) and 2j + 1; mma m of the chunk takes, from lane t, bytes 2m and 2m + 1
// of its block as k-slots (2t, 2t+1) and (2t+8, 2t+9), and activation words 2m and 2m + 1 for the
// same slots: the k order is permuted, the same way for every row and token.
//
// Decode: a 256-entry table (byte -> the two codes as a bf16x2 pair, exact) in shared memory,
// one copy per lane (entry e at byte 256e, lane l at +4l: conflict-free), addressed by a single
// byte permute of the weight word (byte j to bits 8..15, the lane's 4l below it); then one bf16x2
// multiply by the block scale 2^(s−127). Bytes 128..255 of each 256-byte table row hold the
// weight stages (see mm_slot), so every kernel takes the same 64 KB. The product is exact for s <= 252 (e2m1 has at most two significant bits, bf16 the
// fp32 exponent range); s >= 253 overflows to ±Inf where the fp32 path stays finite for small
// codes (no real checkpoint has such scales; the f32 path handles them exactly). Since the scale
// is applied per element, one mma may mix the 4 blocks of a chunk.
//
// The down projection's input h (SwiGLU output, fp32) is written by gate_up as two bf16 terms,
// hi = bf16(h) and lo = bf16(h − hi) (|h − hi − lo| <= 2^-17 |h|), and down runs both through
// the mma (hi then lo), so h keeps ~16 significant bits.
//
// Determinism and batch invariance: a token's column of D = A·B depends only on that column of
// B and on A; every call, every NT and every position of the token in its tile issues the same
// mma sequence (chunks in increasing k, m = 0..7 into the even / odd accumulator, hi before lo;
// down: the two K halves added first half first), so the bits of a row's result do
// not depend on its neighbours. The order differs from the CPU reference's (tensor-core sums of
// 16 products), within the op test's tolerance.

#define MM_THREADS 128
#define MM_WARPS (MM_THREADS / DS_WARP)
#define MM_ROWS 16                         // weight rows per warp (the mma M)
#define MM_BLOCK_ROWS (MM_WARPS * MM_ROWS) // 64
#define MM_LUT_BYTES (256 * 256)           // 256 rows of 256 bytes: entry slots, then stage holes
#define MM_STAGES 32                       // the 256 holes of 128 bytes hold 32 stages of 1 KB
#define MM_STAGE_STRIDE 2048               // a stage (32 lanes × 2 rows × 16 bytes) = 8 holes
// Dynamic shared memory of every kernel: the table, every warp's ring of stages in its holes,
// then every warp's scale area (mm_smem_bytes).
// Chunks in flight per warp (1 KB each): few, as in the one-token kernels below (a smaller
// opening burst); 8 / 4 / 4 read 6.34 - 6.36 ms per 120b verify step, 3 / 2 / 2 6.12 - 6.15.
#ifndef MM_GU_DEPTH1
#define MM_GU_DEPTH1 3 // gate_up with one token tile
#endif
#ifndef MM_GU_DEPTH2
#define MM_GU_DEPTH2 2 // gate_up with 2 or 4 tiles
#endif
#define MM_GU_DEPTH(NT) ((NT) == 1 ? MM_GU_DEPTH1 : MM_GU_DEPTH2)
#ifndef MM_DN_DEPTH
#define MM_DN_DEPTH 2
#endif
// The fused one-token down + combine (the fallback of the one-token kernels below) keeps 4: at 2
// its 128 registers spill 16 bytes.
#define MM_FUSED_DN_DEPTH 4
static_assert(MM_WARPS * MM_GU_DEPTH(1) <= MM_STAGES && MM_WARPS * MM_GU_DEPTH(2) <= MM_STAGES &&
                  MM_WARPS * MM_DN_DEPTH <= MM_STAGES && 8 * MM_FUSED_DN_DEPTH <= MM_STAGES,
              "the rings of a block's warps must fit the table's holes");

// bf16 bits of the E2M1 code c (exact: at most two significant bits).
static __device__ __forceinline__ uint32_t e2m1_bf16_bits(unsigned c) {
    return __float_as_uint(ds_e2m1_to_f32(c)) >> 16;
}

// The decode table: entry e (a packed byte) = bf16x2(e2m1(e & 15), e2m1(e >> 4)) in the first 32
// words of 256-byte row e. Needs no input, so it is filled before the grid dependency.
static __device__ __forceinline__ void mm_lut_fill(uint4 *lut) {
    for (int i = threadIdx.x; i < 256 * 8; i += blockDim.x) {
        const unsigned e = (unsigned)i / 8;
        const uint32_t v = e2m1_bf16_bits(e & 15u) | e2m1_bf16_bits(e >> 4) << 16;
        lut[e * 16 + (i % 8)] = make_uint4(v, v, v, v);
    }
}

// bf16x2 of the scale 2^(s−127) in both halves: s << 7 in each (one multiply), and for s = 0
// the subnormal 2^-127 (0x0040), the only value below 0x0080; 255 gives +Inf.
static __device__ __forceinline__ uint32_t mm_scale2(uint32_t s) {
    return max(s * 0x00800080u, 0x00400040u);
}

static __device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Byte j (0..3) of word w decoded and scaled: table row byte·256 plus this lane's slot 4·lane,
// in one byte permute (result bytes: lane4, byte j of w, 0, 0).
static __device__ __forceinline__ uint32_t mm_pair(const char *lut, uint32_t w, int j,
                                                   uint32_t lane4, uint32_t sc) {
    const uint32_t off = __byte_perm(w, lane4, 0x5504u | (uint32_t)j << 4);
    return bf16x2_mul(*(const uint32_t *)(lut + off), sc);
}

static __device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The weights stream through shared memory with cp.async (16 bytes per lane and row, L2 only):
// the copies of DEPTH chunks stay in flight without holding registers, and without the L1's
// bound on outstanding misses (streaming them through registers reached only ~1.4 TB/s). Each
// lane reads back only what it copied itself, so a wait_group is the whole synchronisation.
// Stage layout (mm_slot): 8 table holes of 128 bytes; row 2g's 16 bytes of lane l in hole l / 8
// at (l % 8)·16, row 2g + 1's four holes later (+1024): each quarter warp reads 128 contiguous
// bytes, conflict-free.
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0)
                 : "memory"); // src size 0: the 16 bytes are zero-filled (code 0 = +0)
}
// 16 bytes of shared memory at a shared-space address (a cp.async stage, read back by the lane
// that copied it; volatile: after the wait_group before it).
static __device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a));
    return v;
}
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Chunk c of the lane's weights into stage `st` (shared address): p = row 2g's bytes at block t
// (row 2g + 1 at + row_b); chunk c adds 64 bytes. Always one commit group per chunk.
static __device__ __forceinline__ void mm_issue_w(uint32_t st, const uint8_t *p, size_t row_b,
                                                  int c, bool ok) {
    const uint8_t *src = ok ? p + (size_t)c * 64 : p;
    cp_async16(st, src, ok);
    cp_async16(st + 1024, ok ? src + row_b : p, ok);
    cp_async_commit();
}

// Bytes of a warp's scale area: the 16 rows × K/32 scale bytes of its row tile, 16-aligned.
static __host__ __device__ __forceinline__ int mm_scale_area(int K) {
    return (16 * (K / DS_MXFP4_BLOCK) + 15) & ~15;
}

static __device__ __forceinline__ uint32_t u4_word(const uint4 *v, int k) {
    const uint4 q = v[k / 4];
    return (k & 3) == 0 ? q.x : (k & 3) == 1 ? q.y : (k & 3) == 2 ? q.z : q.w;
}

// The A fragment of mma m of a chunk: bytes 2m and 2m + 1 of the lane's block, both rows.
static __device__ __forceinline__ void mm_decode_a(const char *lut, const uint32_t w0[4],
                                                   const uint32_t w1[4], int m, uint32_t lane4,
                                                   uint32_t sc0, uint32_t sc1, uint32_t A[4]) {
    const int wi = m / 2, j = 2 * (m & 1);
    A[0] = mm_pair(lut, w0[wi], j, lane4, sc0);
    A[1] = mm_pair(lut, w1[wi], j, lane4, sc1);
    A[2] = mm_pair(lut, w0[wi], j + 1, lane4, sc0);
    A[3] = mm_pair(lut, w1[wi], j + 1, lane4, sc1);
}

// 64 bytes of activations of chunk c at bp (the lane's token row, block t), or zeros.
static __device__ __forceinline__ void mm_load_act(const uint16_t *bp, int c, bool ok, uint4 o[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
        o[i] = ok && bp ? __ldg((const uint4 *)(bp + (size_t)c * 128) + i) : make_uint4(0, 0, 0, 0);
}

// Chunks [c_lo, c_hi) of the warp's 16 rows (rows 2g and 2g + 1 of lane (g, t) start at wb /
// ws) times NT tiles of 8 tokens. NB activation matrices (bf16, row stride K) are summed (gate_up:
// x; down: h hi and lo); brow[nt] is the row of this lane's token (column g of tile nt) in them,
// or -1. Two accumulators per tile, for even and odd m (so 2, not 8 or 16, mma's depend on each
// other per chunk); out[nt] = acc_even + acc_odd. DEPTH chunks of weights stay in flight.
// The tile's scale bytes (16 rows × K/32, contiguous) go to the warp's scale area sc (shared
// memory, mm_scale_area(K) bytes) with the first chunk's copies, so the chunk loop reads them from
// shared memory: the activations' are the only global loads left in it.
// out0 = acc_even + acc_odd (what mm_rows returns for the chunks so far), then both restart at 0.
template <int NT>
static __device__ __forceinline__ void mm_bank(float acc[2][NT][4], float (*out0)[4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out0[nt][i] = __fadd_rn(acc[0][nt][i], acc[1][nt][i]);
            acc[0][nt][i] = acc[1][nt][i] = 0.0f;
        }
}

// SPLIT: the range is two sums, [c_lo, c_split) into out0 and [c_split, c_hi) into out, each
// exactly what a call over its own range returns (the down projection's K halves in one warp),
// with one weight stream over both.
template <int NT, int NB, int DEPTH, bool SPLIT = false>
static __device__ __forceinline__ void
mm_rows(const char *lut, uint32_t ring_sm, uint8_t *sc, const uint8_t *wb, const uint8_t *ws, int K,
        int c_lo, int c_hi, const uint16_t *const bm[NB], const int brow[NT], float out[NT][4],
        int c_split = 0, float (*out0)[4] = nullptr) {
    const int lane = threadIdx.x % DS_WARP, t = lane & 3, g = lane >> 2, nb = K / DS_MXFP4_BLOCK;
    const size_t row_b = (size_t)K / 2;
    const uint32_t lane4 = (uint32_t)lane * 4u;
    const uint8_t *p = wb + 16 * t;
    // A previous call on this warp's scale area (another column group or work item) is read by
    // every lane before the copies below overwrite it: each lane reads other lanes' bytes.
    __syncwarp();
    {
        // The scale copy joins chunk c_lo's commit group (issued below before its commit).
        const uint8_t *tile = ws - (size_t)2 * g * nb; // row 0 of the tile
        if ((((uintptr_t)tile | (uintptr_t)sc) & 15) == 0) { // 16 · nb bytes: nb pieces
            const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sc);
            for (int i = lane; i < nb; i += DS_WARP) cp_async16(dst + 16 * i, tile + 16 * i, true);
        } else { // a scales buffer off 16-byte alignment: byte loads (they wait here once)
            for (int i = lane; i < 16 * nb; i += DS_WARP) sc[i] = __ldg(tile + i);
        }
    }
    const uint8_t *s_row0 = sc + 2 * g * nb + t, *s_row1 = s_row0 + nb; // + 4c: chunk c
    const uint16_t *bp[NB][NT];
#pragma unroll
    for (int s = 0; s < NB; s++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            bp[s][nt] = brow[nt] >= 0 ? bm[s] + (size_t)brow[nt] * K + 32 * t : NULL;
    int nt_used = 0; // tiles with at least one token (warp-uniform)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        if (__any_sync(DS_FULL_MASK, brow[nt] >= 0)) nt_used = nt + 1;
    float acc[2][NT][4];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[h][nt][i] = 0.0f;
    // ring_sm: this lane's slot in stage 0 of its warp's ring (mm_slot).
    const uint32_t my = ring_sm;
#pragma unroll
    for (int d = 0; d < DEPTH; d++)
        mm_issue_w(my + d * MM_STAGE_STRIDE, p, row_b, c_lo + d,
                   c_lo + d < c_hi && 4 * (c_lo + d) + t < nb);
    uint4 bnext[NT == 1 ? NB : 1][4]; // NT = 1: the next chunk's activations
    if (NT == 1)
#pragma unroll
        for (int s = 0; s < NB; s++)
            mm_load_act(bp[s][0], c_lo, c_lo < c_hi && 4 * c_lo + t < nb,
                            bnext[NT == 1 ? s : 0]);
#pragma unroll 1
    for (int c0 = c_lo; c0 < c_hi; c0 += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            const int c = c0 + d;
            if (c >= c_hi) break;
            const bool bok = 4 * c + t < nb;
            if (SPLIT && c == c_split) mm_bank<NT>(acc, out0); // the first sum is complete
            cp_async_wait<DEPTH - 1>(); // chunk c (the oldest group) has landed
            if (c == c_lo) __syncwarp(); // ... and with it every lane's scale copies
            const uint4 v0 = lds128(my + d * MM_STAGE_STRIDE);
            const uint4 v1 = lds128(my + d * MM_STAGE_STRIDE + 1024);
            // Scale bytes of block 4c + t of both rows (127, i.e. 1.0, past the row: zero codes).
            const uint32_t sc0 = mm_scale2(bok ? s_row0[4 * c] : 127u);
            const uint32_t sc1 = mm_scale2(bok ? s_row1[4 * c] : 127u);
            const uint32_t w0[4] = {v0.x, v0.y, v0.z, v0.w};
            const uint32_t w1[4] = {v1.x, v1.y, v1.z, v1.w};
            if constexpr (NT == 1) {
                // Decode: this chunk's activations were loaded one chunk ahead (L2 latency off
                // the critical path); the next chunk's go out now, then the 8 A fragments
                // (their shared loads issued together), then the mma's.
                uint4 bv[NB][4];
#pragma unroll
                for (int s = 0; s < NB; s++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        bv[s][i] = bnext[s][i];
#pragma unroll
                for (int s = 0; s < NB; s++)
                    mm_load_act(bp[s][0], c + 1, c + 1 < c_hi && 4 * (c + 1) + t < nb,
                                    bnext[s]);
                // One B set (gate_up): the 8 A fragments first, their table loads issued
                // together. Two (down: hi, lo) hold 64 activation registers, so each fragment is
                // decoded just before its mma's (the 32 registers of all 8 made the fused
                // one-token kernel spill a just-loaded scale byte, a stall per chunk). Same mma
                // sequence either way.
                uint32_t A[NB == 1 ? 8 : 1][4];
                if constexpr (NB == 1)
#pragma unroll
                    for (int m = 0; m < 8; m++)
                        mm_decode_a(lut, w0, w1, m, lane4, sc0, sc1, A[m]);
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    if constexpr (NB != 1) mm_decode_a(lut, w0, w1, m, lane4, sc0, sc1, A[0]);
#pragma unroll
                    for (int s = 0; s < NB; s++)
                        mma_bf16(acc[m & 1][0], A[NB == 1 ? m : 0], u4_word(bv[s], 2 * m),
                                 u4_word(bv[s], 2 * m + 1));
                }
            } else {
                // Several tiles: the 8 A fragments once, then tile by tile (per column the same
                // mma sequence as above: m = 0..7, each B set in order).
                uint32_t A[8][4];
#pragma unroll
                for (int m = 0; m < 8; m++)
                    mm_decode_a(lut, w0, w1, m, lane4, sc0, sc1, A[m]);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    if (nt >= nt_used) break;
                    uint4 bv[NB][4];
#pragma unroll
                    for (int s = 0; s < NB; s++)
                        mm_load_act(bp[s][nt], c, bok, bv[s]);
#pragma unroll
                    for (int m = 0; m < 8; m++)
#pragma unroll
                        for (int s = 0; s < NB; s++)
                            mma_bf16(acc[m & 1][nt], A[m], u4_word(bv[s], 2 * m),
                                     u4_word(bv[s], 2 * m + 1));
                }
            }
            // Refill this stage with chunk c + DEPTH only now: its words were decoded above
            // (the registers hold them), so the copy cannot overwrite unread data.
            const int cn = c + DEPTH;
            mm_issue_w(my + d * MM_STAGE_STRIDE, p, row_b, cn, cn < c_hi && 4 * cn + t < nb);
        }
    }
    cp_async_wait<0>(); // nothing of this warp stays in flight into the stages
    if (SPLIT && c_split >= c_hi) mm_bank<NT>(acc, out0); // an empty second range sums to +0
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            out[nt][i] = __fadd_rn(acc[0][nt][i], acc[1][nt][i]);
}

// Pairs of one expert per block, in groups of 8·NT (each group streams the expert's weights
// once). Grid z covers T / MM_TOKEN_CHUNK chunks (an expert holds at most T pairs): at 32, a
// 128-row verify launched 4 chunks per (row tile, expert) of which ~3 had no pair.
#ifndef MM_TOKEN_CHUNK
#define MM_TOKEN_CHUNK 256
#endif
// Blocks (in launch order) that fill the decode table before the grid dependency: about the
// first wave (3 blocks on each of up to 170 SMs), whose fill then overlaps the previous kernel.
// The later ones fill it once they know they have pairs: grid y covers min(E, T·KE) experts, and
// a block of an unused one exits without writing 64 KB of shared memory.
#ifndef MM_EARLY_LUT_BLOCKS
#define MM_EARLY_LUT_BLOCKS 512
#endif
#ifndef MM_NT_BY_AVG
#define MM_NT_BY_AVG 1 // 0: the grouped path always runs 4 tiles (32 columns) per weight pass
#endif

// K steps of 4 MXFP4 blocks over K inputs.
static __device__ __forceinline__ int mm_chunks(int K) { return (K / DS_MXFP4_BLOCK + 3) / 4; }

// Shared address of this lane's slot in stage 0 of warp w's ring of `depth` stages (row 2g;
// row 2g + 1 at + 1024, stage d at + d·MM_STAGE_STRIDE): stage s = w·depth + d is the holes
// 8s .. 8s + 7 of the table (bytes 128..255 of rows 8s ..), lane l in hole l / 8 at (l % 8)·16.
static __device__ __forceinline__ uint32_t mm_slot(const uint4 *lut, int w, int depth) {
    const uint32_t lane = threadIdx.x % DS_WARP;
    return (uint32_t)__cvta_generic_to_shared(lut) + 128u + (lane & 7u) * 16u +
           (lane >> 3) * 256u + (uint32_t)(w * depth) * MM_STAGE_STRIDE;
}

// Rows of this lane's tokens: brow[nt] = pair / div for column g of tile nt, or -1.
template <int NT>
static __device__ __forceinline__ void mm_token_rows(const int32_t *list, int beg, int end, int div,
                                                     int brow[NT], int pr[NT]) {
    const int g = (threadIdx.x % DS_WARP) >> 2;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int i = beg + 8 * nt + g;
        pr[nt] = i < end ? list[i] : -1;
        brow[nt] = pr[nt] >= 0 ? pr[nt] / div : -1;
    }
}

// The down projection splits K in two halves of chunks, [0, h) and [h, nch), run by two warps
// and added in that order (every down kernel: same bits), so a one-token step has twice the warps
// streaming (4 experts × 180 row tiles is only ~5 warps per SM).
static __device__ __forceinline__ int mm_half(int K) {
    return (mm_chunks(K) + 1) / 2;
}

// Dynamic shared memory of the tensor-core kernels: the table (with the rings in its holes), then
// one scale area per warp. 120b: 64 KB + 4 × 1440 bytes for 4 warps, so 3 blocks still fit an SM.
static __host__ __device__ __forceinline__ int mm_smem_bytes(int warps, int K) {
    return MM_LUT_BYTES + warps * mm_scale_area(K);
}

// The set-up of the grouped tensor-core kernels (gate_up, down): the decode table (needs no input:
// before the grid dependency in the first wave, see MM_EARLY_LUT_BLOCKS), the block's expert and
// pairs (moe_block_pairs), and the barrier after which every warp may read the table. False when
// the block has nothing to do (then it has not waited on that barrier: block-uniform).
static __device__ __forceinline__ bool mm_block_setup(uint4 *lut, const struct ds_moe_args &a,
                                                      const int32_t *groups, const int32_t *pairs,
                                                      int32_t *s_list, int *s_info,
                                                      struct moe_block *k) {
    const bool early =
            blockIdx.z == 0 && blockIdx.y * gridDim.x + blockIdx.x < MM_EARLY_LUT_BLOCKS;
    if (early) mm_lut_fill(lut);
    DS_GRID_DEPENDENCY();
    if (!moe_block_pairs(a, groups, pairs, MM_TOKEN_CHUNK, s_list, s_info, k))
        return false; // block-uniform
    if (!early) mm_lut_fill(lut);
    __syncthreads(); // the table
    return true;
}

// The grouped kernels as work items (MM_PERSIST, the grouping kernel's path): a grid of about 3
// blocks per SM instead of one block per (row block, expert slot, chunk). A block fills the decode
// table once, then takes items it = blockIdx.x, + gridDim.x, ... of (row block bx, expert in use
// by, chunk bz), bx fastest, up to the device-side count of experts in use: no block of an unused
// expert slot is launched, and the table and the set-up are paid once per block. An item is the
// work of one block of the other grid (the same bits). The next item's expert and pairs are read
// while the current one runs. Chosen at launch (the kernels' `items` argument) only where an expert
// in use holds at most MM_PERSIST_AVG pairs on average: there most expert slots of the other grid
// are idle (120b decode at 32 rows, 1 pair per expert: -0.8 ms per step against the full grids),
// while with more pairs per expert the capped grid was slower (120b verify at 128 rows, 4 per
// expert: +1.5 ms; docs/performance.md §4, "Batch 32, second round").
#ifndef MM_PERSIST
#define MM_PERSIST 1
#endif
#ifndef MM_PERSIST_AVG
#define MM_PERSIST_AVG 2
#endif
static __device__ __forceinline__ struct moe_block mm_item_of(const struct moe_groups &gr,
                                                              const int32_t *pairs, long long it,
                                                              int nx, int n_used) {
    const long long r = it / nx;
    struct moe_block k;
    k.e = gr.used[(int)(r % n_used)];
    const int lo = gr.offsets[k.e], hi = gr.offsets[k.e + 1];
    k.beg = lo + (int)(r / n_used) * MM_TOKEN_CHUNK;
    k.end = min(hi, k.beg + MM_TOKEN_CHUNK);
    k.list = pairs;
    k.r0 = (int)(it % nx); // here: the item's row block
    return k;
}
template <typename F>
static __device__ __forceinline__ void mm_items(uint4 *lut, const struct ds_moe_args &a,
                                                const int32_t *groups, const int32_t *pairs, int nx,
                                                F item) {
    mm_lut_fill(lut);
    DS_GRID_DEPENDENCY();
    const struct moe_groups gr = groups_of(groups, a.n_experts);
    const int n_used = *gr.n_used;
    const long long n_items =
            (long long)n_used * nx * ((a.n_rows + MM_TOKEN_CHUNK - 1) / MM_TOKEN_CHUNK);
    __syncthreads(); // the table
    if ((long long)blockIdx.x >= n_items) return;
    struct moe_block k = mm_item_of(gr, pairs, blockIdx.x, nx, n_used);
    for (long long it = blockIdx.x; it < n_items; it += gridDim.x) {
        const long long nit = it + gridDim.x;
        const struct moe_block kn = nit < n_items ? mm_item_of(gr, pairs, nit, nx, n_used) : k;
        if (k.beg < k.end) item(k.r0, k); // block-uniform
        k = kn;
    }
}

// gate_up + clamped SwiGLU: grid (2I / 64, experts in use, chunks of MM_TOKEN_CHUNK pairs).
// Writes h of unit r0/2 + g for the lane's columns 2t, 2t+1 as hi / lo bf16 (hh[pair·I + unit],
// hh + np·I).
// One block's work (row block bx of expert k.e, pairs k.beg .. k.end): see the kernel below.
template <int NT>
static __device__ __forceinline__ void gate_up_item(const struct ds_moe_args &a, uint16_t *hh,
                                                    uint4 *mm_lut, int bx,
                                                    const struct moe_block &k) {
    const int e = k.e, beg = k.beg, end = k.end;
    const int32_t *list = k.list;
    const int C = a.dim, I = a.inter, KE = a.top_k, lane = threadIdx.x % DS_WARP;
    const int r0 = bx * MM_BLOCK_ROWS + (threadIdx.x / DS_WARP) * MM_ROWS;
    if (r0 >= 2 * I) return;
    const int g = lane >> 2, t = lane & 3;
    const size_t ex_rows = (size_t)e * 2 * I, row_b = (size_t)C / 2, row_s = (size_t)C / 32;
    const size_t wr = ex_rows + r0 + 2 * g; // this lane's gate row; wr + 1 its linear row
    const uint16_t *bm[1] = {(const uint16_t *)a.x};
    // The biases and the row scales of the lane's tokens (row g of each tile) before the loop:
    // their latency then hides behind it.
    const float bg = ld_elem(a.gate_up_bias, a.bias_dtype, wr);
    const float bl = ld_elem(a.gate_up_bias, a.bias_dtype, wr + 1);
    // The block's pairs in groups of 8·NT columns (one group unless NT < 4 and the expert has
    // more pairs than that in this chunk: each group streams the weights again; the host picks
    // NT from the pairs per expert it expects). A column's bits do not depend on its group.
    for (int cb = beg; cb < end; cb += 8 * NT) {
        int brow[NT], pr[NT];
        mm_token_rows<NT>(list, cb, end, KE, brow, pr);
        float rsv[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            rsv[nt] = brow[nt] >= 0 ? moe_row_scale(a, brow[nt]) : 1.0f;
        const int warp = threadIdx.x / DS_WARP;
        float acc[NT][4];
        mm_rows<NT, 1, MM_GU_DEPTH(NT)>(
                (const char *)mm_lut, mm_slot(mm_lut, warp, MM_GU_DEPTH(NT)),
                (uint8_t *)mm_lut + MM_LUT_BYTES + warp * mm_scale_area(C),
                a.gate_up_blocks + wr * row_b, a.gate_up_scales + wr * row_s, C, 0, mm_chunks(C),
                bm, brow, acc);
        const size_t np = (size_t)a.n_rows * KE;
        const int unit = r0 / 2 + g;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                // Column 2t + q of tile nt: its pair is held by lane (2t + q) * 4 (row 2t + q).
                const int p = __shfl_sync(DS_FULL_MASK, pr[nt], (2 * t + q) * 4);
                const float rs = __shfl_sync(DS_FULL_MASK, rsv[nt], (2 * t + q) * 4);
                if (p < 0) continue;
                const float gg = __fadd_rn(__fmul_rn(acc[nt][q], rs), bg),
                            ll = __fadd_rn(__fmul_rn(acc[nt][2 + q], rs), bl);
                const float h = swiglu_clamped(gg, ll, a.swiglu_alpha, a.swiglu_limit);
                const ds_bf16 hi = ds_f32_to_bf16(h);
                const ds_bf16 lo = ds_f32_to_bf16(__fsub_rn(h, ds_bf16_to_f32(hi)));
                hh[(size_t)p * I + unit] = hi;
                hh[np * I + (size_t)p * I + unit] = lo;
            }
    }
}

template <int NT>
__global__ void __launch_bounds__(MM_THREADS, 3)
    bf16_mxfp4w_moe_gate_up_mma(const struct ds_moe_args a, const int32_t *groups,
                                const int32_t *pairs, uint16_t *hh, int items) {
    extern __shared__ uint4 mm_lut[];
    if (MM_PERSIST && items) { // work items (mm_items; items implies groups)
        mm_items(mm_lut, a, groups, pairs, (2 * a.inter + MM_BLOCK_ROWS - 1) / MM_BLOCK_ROWS,
                 [&](int bx, const struct moe_block &k) { gate_up_item<NT>(a, hh, mm_lut, bx, k); });
        return;
    }
    __shared__ int32_t s_list[DS_WARP];
    __shared__ int s_info[2];
    struct moe_block k;
    if (!mm_block_setup(mm_lut, a, groups, pairs, s_list, s_info, &k)) return;
    gate_up_item<NT>(a, hh, mm_lut, blockIdx.x, k);
}

// down: y[pair][row] = (first + second) + b2 (f32) for rows r0 + 2g, r0 + 2g + 1, first and
// second the sums over the K halves [0, mm_half) and [mm_half, mm_chunks). MM_DN_FULLK (1): grid
// (C / 64, experts in use, chunks), warp w streams row tile w of the block's 64 rows over both
// halves (mm_rows SPLIT), twice the stream per warp and no exchange. 0: grid (C / 32, ...), warp w
// row tile w & 1 of the block's 32 rows over half w >> 1; the second half's sums go through shared
// memory to the first half's warp. The same bits either way.
#ifndef MM_DN_FULLK
#define MM_DN_FULLK 1
#endif
// The down epilogue: y[p][r0 + 2g (+1)] = (first + second) + bias for each pair column of the
// warp's tile (pr: the column's pair, < 0 for none). Both down layouts end here, so they keep the
// same bits whichever way the second half's sums arrived.
template <int NT>
static __device__ __forceinline__ void down_store(float *y, int C, int r0, int lane,
                                                  const int (&pr)[NT], const float (&first)[NT][4],
                                                  const float (&second)[NT][4], float b0,
                                                  float b1) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int p = __shfl_sync(DS_FULL_MASK, pr[nt], (2 * t + q) * 4);
            if (p < 0) continue;
            const float v0 = __fadd_rn(first[nt][q], second[nt][q]);
            const float v1 = __fadd_rn(first[nt][2 + q], second[nt][2 + q]);
            y[(size_t)p * C + r0 + 2 * g] = __fadd_rn(v0, b0);
            y[(size_t)p * C + r0 + 2 * g + 1] = __fadd_rn(v1, b1);
        }
}

// One block's work of the MM_DN_FULLK layout (row block bx of expert k.e): see the kernel below.
template <int NT>
static __device__ __forceinline__ void down_item(const struct ds_moe_args &a, const uint16_t *hh,
                                                 float *y, uint4 *mm_lut, int bx,
                                                 const struct moe_block &k) {
    const int e = k.e, beg = k.beg, end = k.end;
    const int32_t *list = k.list;
    const int C = a.dim, I = a.inter, lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    {
        const int r0 = bx * MM_BLOCK_ROWS + warp * MM_ROWS;
        if (r0 >= C) return; // warp-uniform; no block barrier follows
        const int g = lane >> 2;
        const size_t wr = (size_t)e * C + r0 + 2 * g, row_b = (size_t)I / 2, row_s = (size_t)I / 32;
        const size_t np = (size_t)a.n_rows * a.top_k;
        const uint16_t *bm[2] = {hh, hh + np * I};
        const float b0 = ld_elem(a.down_bias, a.bias_dtype, wr);
        const float b1 = ld_elem(a.down_bias, a.bias_dtype, wr + 1);
        for (int cb = beg; cb < end; cb += 8 * NT) {
            int brow[NT], pr[NT];
            mm_token_rows<NT>(list, cb, end, 1, brow, pr);
            float first[NT][4], second[NT][4];
            mm_rows<NT, 2, MM_DN_DEPTH, true>(
                    (const char *)mm_lut, mm_slot(mm_lut, warp, MM_DN_DEPTH),
                    (uint8_t *)mm_lut + MM_LUT_BYTES + warp * mm_scale_area(I),
                    a.down_blocks + wr * row_b, a.down_scales + wr * row_s, I, 0, mm_chunks(I), bm,
                    brow, second, mm_half(I), first);
            down_store<NT>(y, C, r0, lane, pr, first, second, b0, b1);
        }
    }
}

template <int NT>
__global__ void __launch_bounds__(MM_THREADS, 3)
    bf16_mxfp4w_moe_down_mma(const struct ds_moe_args a, const int32_t *groups,
                             const int32_t *pairs, const uint16_t *hh, float *y, int items) {
    extern __shared__ uint4 mm_lut[];
    if (MM_DN_FULLK && MM_PERSIST && items) {
        mm_items(mm_lut, a, groups, pairs, (a.dim + MM_BLOCK_ROWS - 1) / MM_BLOCK_ROWS,
                 [&](int bx, const struct moe_block &k) { down_item<NT>(a, hh, y, mm_lut, bx, k); });
        return;
    }
    __shared__ int32_t s_list[DS_WARP];
    __shared__ int s_info[2];
    __shared__ float part[2][NT * 4][DS_WARP];
    struct moe_block k;
    if (!mm_block_setup(mm_lut, a, groups, pairs, s_list, s_info, &k)) return; // block-uniform
    if constexpr (MM_DN_FULLK) {
        down_item<NT>(a, hh, y, mm_lut, blockIdx.x, k);
        return;
    }
    const int e = k.e, beg = k.beg, end = k.end;
    const int32_t *list = k.list;
    const int C = a.dim, I = a.inter, lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int tile = warp & 1, half = warp >> 1;
    const int r0 = blockIdx.x * 2 * MM_ROWS + tile * MM_ROWS;
    const int g = lane >> 2;
    const size_t ex_rows = (size_t)e * C, row_b = (size_t)I / 2, row_s = (size_t)I / 32;
    const size_t wr = ex_rows + r0 + 2 * g;
    const size_t np = (size_t)a.n_rows * a.top_k;
    const uint16_t *bm[2] = {hh, hh + np * I};
    const int hc = mm_half(I), nch = mm_chunks(I);
    // The biases before the loop (the first half's warps use them): their latency hides there.
    const bool fin = !half && r0 < C;
    const float b0 = fin ? ld_elem(a.down_bias, a.bias_dtype, wr) : 0.0f;
    const float b1 = fin ? ld_elem(a.down_bias, a.bias_dtype, wr + 1) : 0.0f;
    // Column groups of 8·NT pairs, as in gate_up_mma (block-uniform: every warp reaches the
    // barriers of every group).
    for (int cb = beg; cb < end; cb += 8 * NT) {
        int brow[NT], pr[NT];
        mm_token_rows<NT>(list, cb, end, 1, brow, pr);
        float acc[NT][4];
        if (r0 < C)
            mm_rows<NT, 2, MM_DN_DEPTH>(
                    (const char *)mm_lut, mm_slot(mm_lut, warp, MM_DN_DEPTH),
                    (uint8_t *)mm_lut + MM_LUT_BYTES + warp * mm_scale_area(I),
                    a.down_blocks + wr * row_b, a.down_scales + wr * row_s, I, half ? hc : 0,
                    half ? nch : hc, bm, brow, acc);
        if (half && r0 < C)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    part[tile][nt * 4 + i][lane] = acc[nt][i];
        __syncthreads();
        if (fin) {
            float second[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    second[nt][i] = part[tile][nt * 4 + i][lane];
            down_store<NT>(y, C, r0, lane, pr, acc, second, b0, b1);
        }
        if (cb + 8 * NT < end) __syncthreads(); // part is rewritten by the next group
    }
}

// One token (T = 1, KE <= 4): down and combine in one kernel, 8 warps. Block x owns features
// [16x, 16x + 16); warp w runs the (w & 3)-th expert in use (small_group) over K half w >> 2, as
// bf16_mxfp4w_moe_down_mma<1> does (same bits); the y values stay in shared memory, then 16
// threads combine them exactly as act_moe_combine does.
#define MM_FUSED_THREADS 256
__global__ void __launch_bounds__(MM_FUSED_THREADS, 2)
    bf16_mxfp4w_moe_down_combine_1tok_mma(const struct ds_moe_args a, const uint16_t *hh) {
    extern __shared__ uint4 mm_lut[];
    __shared__ int32_t s_list[8][DS_WARP];
    __shared__ float part[4][4][DS_WARP];
    __shared__ float ys[4][MM_ROWS]; // [pair][row]; pairs < KE <= 4
    mm_lut_fill(mm_lut);
    DS_GRID_DEPENDENCY();
    const int warp = threadIdx.x / DS_WARP, KE = a.top_k, C = a.dim, I = a.inter;
    const int slot = warp & 3, half = warp >> 2;
    const int lane = threadIdx.x % DS_WARP, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * MM_ROWS;
    int n = 0;
    const int e =
        slot < KE ? small_group(a.expert_ids, KE, a.n_experts, slot, s_list[warp], &n) : -1;
    __syncthreads(); // the table and every warp's list
    int brow[1], pr[1];
    float acc[1][4];
    const size_t wr = (size_t)(e >= 0 ? e : 0) * C + r0 + 2 * g;
    // The biases before the loop (the first half's warps use them): their latency hides there.
    const bool fin = e >= 0 && !half;
    const float b0 = fin ? ld_elem(a.down_bias, a.bias_dtype, wr) : 0.0f;
    const float b1 = fin ? ld_elem(a.down_bias, a.bias_dtype, wr + 1) : 0.0f;
    if (e >= 0) {
        mm_token_rows<1>(s_list[warp], 0, n, 1, brow, pr);
        const size_t row_b = (size_t)I / 2, row_s = (size_t)I / 32;
        const uint16_t *bm[2] = {hh, hh + (size_t)KE * I};
        const int hc = mm_half(I), nch = mm_chunks(I);
        mm_rows<1, 2, MM_FUSED_DN_DEPTH>((const char *)mm_lut,
                                         mm_slot(mm_lut, warp, MM_FUSED_DN_DEPTH),
                                   (uint8_t *)mm_lut + MM_LUT_BYTES + warp * mm_scale_area(I),
                                   a.down_blocks + wr * row_b, a.down_scales + wr * row_s, I,
                                   half ? hc : 0, half ? nch : hc, bm, brow, acc);
        if (half)
#pragma unroll
            for (int i = 0; i < 4; i++)
                part[slot][i][lane] = acc[0][i];
    }
    __syncthreads();
    if (fin) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int p = __shfl_sync(DS_FULL_MASK, pr[0], (2 * t + q) * 4);
            if (p < 0) continue;
            const float v0 = __fadd_rn(acc[0][q], part[slot][q][lane]);
            const float v1 = __fadd_rn(acc[0][2 + q], part[slot][2 + q][lane]);
            ys[p][2 * g] = __fadd_rn(v0, b0);
            ys[p][2 * g + 1] = __fadd_rn(v1, b1);
        }
    }
    __syncthreads();
    if (threadIdx.x < MM_ROWS)
        combine_1tok(a, r0 + (int)threadIdx.x, &ys[0][0] + threadIdx.x, MM_ROWS);
}

// One token (T = 1, decode): gate_up + SwiGLU with the bits of bf16_mxfp4w_moe_gate_up_mma<1>
// (the same A fragments, the same mma sequence per row tile, the same epilogue), laid out for
// the decode step, where that kernel was bound by its per-chunk instruction stream and by an
// uneven spread of its 3-blocks-per-SM grid:
// - one block per SM: warp w of block b owns row tile b·W + w of the KE × 2I/16 (slot, tile)
//   pairs, W = ceil(tiles / SMs), so every SM streams the same number of tiles;
// - the token's x is staged once per block in shared memory (G1 layout below) and the lanes of
//   B column 0 (g = 0) read their B words from there, so the chunk loop has no global loads for
//   the activations; lanes g != 0 take zeros (G1_BLOAD): their columns are discarded, and a
//   column of D depends only on its own column of B;
// - the weight ring of each warp is contiguous (row 2g's 16 bytes of lane l at 16l, row 2g + 1's
//   at 512 + 16l): the table's holes hold only 4 warps' rings.
// A slot with an expert id outside [0, E) writes nothing (the grouped kernels drop it too); a
// repeated expert is computed once per slot (same bits as its column in the grouped tile).
#ifndef G1_DEPTH
#define G1_DEPTH 3 // chunks (1 KB per warp each) in flight per warp: fewer in flight, sooner first
                   // chunks (decode ms at 8, 6, 5, 4, 3: 2.63, 2.58, 2.56, 2.57, 2.545)
#endif
// G1_BLOAD 1: in the one- and few-token kernels only the lanes of used B columns (the token's,
// or the pairs') load activations from shared memory; 0: every lane does (discarded columns
// read a real row). The bits do not depend on it.
#ifndef G1_BLOAD
#define G1_BLOAD 1
#endif
#define G1_STAGE 1024       // one stage of a warp's ring
#define G1_MAX_WARPS 16

// x of the token in shared memory, padded with zeros to whole chunks: the 16 bytes that lane t
// loads as its i-th B word quad of chunk c (block 4c + t, elements 8i .. 8i + 7) at
// 256c + 64i + 16t, so the four t of one load are four different bank quads.
static __host__ __device__ __forceinline__ int g1_x_bytes(int K) {
    return (K / DS_MXFP4_BLOCK + 3) / 4 * 256; // mm_chunks(K) chunks
}

static __host__ __device__ __forceinline__ int g1_smem_bytes(int warps, int K) {
    return MM_LUT_BYTES + warps * (G1_DEPTH * G1_STAGE + mm_scale_area(K)) + g1_x_bytes(K);
}

// Piece q (16 bytes: elements 8q .. 8q + 7) of a bf16 row of K elements into its G1 place.
static __device__ __forceinline__ void g1_x_put(char *xs, int q, uint4 v) {
    const int blk = q >> 2, i = q & 3;
    *(uint4 *)(xs + 256 * (blk >> 2) + 64 * i + 16 * (blk & 3)) = v;
}

// n_rows bf16 rows of len elements (row r at src(r), 16-byte aligned, len % 8 == 0) into their
// G1 places xs + r·xb, zero-padded to per pieces a row: each thread's first PIECES pieces are
// loaded together (one round trip), any further ones one by one.
template <int PIECES, typename F>
static __device__ __forceinline__ void g1_stage_rows(char *xs, int xb, int n_rows, int per,
                                                     int len, F src) {
    const int n_pieces = n_rows * per;
    uint4 v[PIECES];
#pragma unroll
    for (int j = 0; j < PIECES; j++) {
        const int q = (int)threadIdx.x + j * (int)blockDim.x, r = q / per, qq = q % per;
        v[j] = q < n_pieces && qq * 8 < len ? __ldg(src(r) + qq) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < PIECES; j++) {
        const int q = (int)threadIdx.x + j * (int)blockDim.x;
        if (q < n_pieces) g1_x_put(xs + q / per * xb, q % per, v[j]);
    }
    for (int q = (int)threadIdx.x + PIECES * (int)blockDim.x; q < n_pieces;
         q += (int)blockDim.x) {
        const int r = q / per, qq = q % per;
        g1_x_put(xs + r * xb, qq, qq * 8 < len ? __ldg(src(r) + qq) : make_uint4(0, 0, 0, 0));
    }
}

// The start of a warp's stream over chunks [c_lo, c_hi) of its 16 rows (p: row 2g's bytes at
// block t, row 2g + 1 at + row_b; tile_s: the tile's 16 rows of scales): the scale bytes join
// the first chunk's commit group, then the first DEPTH chunks go into the ring at my. A ring is
// contiguous (stage d at my + d·G1_STAGE, row 2g + 1 at + 512: SS, RO defaults) or in the table's
// holes (mm_slot: SS = MM_STAGE_STRIDE, RO = 1024).
template <int DEPTH, int SS = G1_STAGE, int RO = 512>
static __device__ __forceinline__ void g1_start(uint32_t my, uint8_t *sc, const uint8_t *tile_s,
                                                const uint8_t *p, size_t row_b, int nb, int c_lo,
                                                int c_hi) {
    const int lane = threadIdx.x % DS_WARP, t = lane & 3;
    if ((((uintptr_t)tile_s | (uintptr_t)sc) & 15) == 0) {
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sc);
        for (int i = lane; i < nb; i += DS_WARP) cp_async16(dst + 16 * i, tile_s + 16 * i, true);
    } else {
        for (int i = lane; i < 16 * nb; i += DS_WARP) sc[i] = __ldg(tile_s + i);
    }
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
        const int c = c_lo + d;
        const bool ok = c < c_hi && 4 * c + t < nb;
        cp_async16(my + d * SS, ok ? p + 64 * c : p, ok);
        cp_async16(my + d * SS + RO, ok ? p + 64 * c + row_b : p, ok);
        cp_async_commit();
    }
}

// The stream itself, after g1_start and a barrier that published the table and the staged
// activations xs[s] (G1 layout): for each chunk, the A fragments of mm_rows' decode times NB
// activation rows, in mm_rows' mma sequence (m = 0..7 into the even / odd accumulator, the B sets
// in order), so out (= acc_even + acc_odd, lane t = 0 holding column 0) has mm_rows' bits.
// Running pointers and counters (4c + t - nb < 0: block 4c + t of the row exists) keep index
// arithmetic out of the chunk.
// SPLIT (c_lo < split < c_hi): the sums of chunks [c_lo, split) go to first (acc_even + acc_odd,
// as a stream over that range alone gives them), the accumulators restart at zero, and out gets
// those of [split, c_hi): two K halves in one stream, without a second ramp.
template <int NB, int DEPTH, int SS = G1_STAGE, int RO = 512, bool SPLIT = false>
static __device__ __forceinline__ void g1_stream(const char *lut, uint32_t my, const uint8_t *sc,
                                                 const uint8_t *p, size_t row_b, int nb, int c_lo,
                                                 int c_hi, const char *const xs[NB], float out[4],
                                                 int split = -1, float *first = nullptr,
                                                 bool bload = true) {
    const int lane = threadIdx.x % DS_WARP, g = lane >> 2, t = lane & 3;
    const uint32_t lane4 = (uint32_t)lane * 4u;
    const uint8_t *s0p = sc + 2 * g * nb + t + 4 * c_lo;
    const uint4 *xl[NB];
#pragma unroll
    for (int s = 0; s < NB; s++) xl[s] = (const uint4 *)(xs[s] + 16 * t + 256 * c_lo);
    const uint8_t *pn = p + 64 * (c_lo + DEPTH);
    // Refill of chunk cn: cn < c_hi and 4cn + t < nb, i.e. 4cn < lim.
    const int lim = min(nb - t, 4 * c_hi);
    int kb = 4 * c_lo + t - nb, kn = 4 * (c_lo + DEPTH) - lim;
    float acc[2][4];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[h][i] = 0.0f;
#pragma unroll 1
    for (int c0 = c_lo; c0 < c_hi; c0 += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            if (c0 + d >= c_hi) break;
            if (SPLIT && c0 + d == split) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    first[i] = __fadd_rn(acc[0][i], acc[1][i]);
                    acc[0][i] = acc[1][i] = 0.0f;
                }
            }
            cp_async_wait<DEPTH - 1>();     // chunk c0 + d (the oldest group) has landed
            if (c0 + d == c_lo) __syncwarp(); // ... and with it every lane's scale copies
            const uint4 v0 = lds128(my + d * SS), v1 = lds128(my + d * SS + RO);
            // Past the row (the last chunk when nb % 4 != 0) the scale is 127 (the codes there
            // are zeros) and nothing is read: row 15's s0p[nb] would lie in the next warp's area,
            // which that warp's copies may be writing.
            const bool bok = kb < 0;
            const uint32_t sc0 = mm_scale2(bok ? s0p[0] : 127u);
            const uint32_t sc1 = mm_scale2(bok ? s0p[nb] : 127u);
            const uint32_t w0[4] = {v0.x, v0.y, v0.z, v0.w};
            const uint32_t w1[4] = {v1.x, v1.y, v1.z, v1.w};
            // Lanes whose B column is discarded (!bload) take zeros instead of loading: fewer
            // shared-memory wavefronts, and a column of D depends only on its own column of B.
            uint4 bv[NB][4];
#pragma unroll
            for (int s = 0; s < NB; s++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    bv[s][i] = bload ? xl[s][4 * i] : make_uint4(0u, 0u, 0u, 0u);
            // One B set: the 8 fragments first (their table loads issued together); two: each
            // just before its mma's (registers), as mm_rows does. Same mma sequence.
            uint32_t A[NB == 1 ? 8 : 1][4];
            if constexpr (NB == 1)
#pragma unroll
                for (int m = 0; m < 8; m++) mm_decode_a(lut, w0, w1, m, lane4, sc0, sc1, A[m]);
#pragma unroll
            for (int m = 0; m < 8; m++) {
                if constexpr (NB != 1) mm_decode_a(lut, w0, w1, m, lane4, sc0, sc1, A[0]);
#pragma unroll
                for (int s = 0; s < NB; s++)
                    mma_bf16(acc[m & 1], A[NB == 1 ? m : 0], u4_word(bv[s], 2 * m),
                             u4_word(bv[s], 2 * m + 1));
            }
            // Refill this stage with chunk c + DEPTH (its words are in registers now).
            const bool ok = kn < 0;
            cp_async16(my + d * SS, ok ? pn : p, ok);
            cp_async16(my + d * SS + RO, ok ? pn + row_b : p, ok);
            cp_async_commit();
            pn += 64, kn += 4, kb += 4, s0p += 4;
#pragma unroll
            for (int s = 0; s < NB; s++) xl[s] += 16;
        }
    }
    cp_async_wait<0>(); // nothing of this warp stays in flight into its ring
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = __fadd_rn(acc[0][i], acc[1][i]);
}

__global__ void __launch_bounds__(G1_MAX_WARPS *DS_WARP, 1)
    bf16_mxfp4w_moe_gate_up_1tok_mma(const struct ds_moe_args a, uint16_t *hh, int32_t *cnt) {
    extern __shared__ uint4 mm_lut[];
    const int W = blockDim.x / DS_WARP, warp = threadIdx.x / DS_WARP;
    const int lane = threadIdx.x % DS_WARP, g = lane >> 2, t = lane & 3;
    const int C = a.dim, I = a.inter, KE = a.top_k, nb = C / DS_MXFP4_BLOCK, nch = mm_chunks(C);
    const int tpe = 2 * I / MM_ROWS; // row tiles per expert
    char *const sm = (char *)mm_lut;
    const uint32_t my = (uint32_t)__cvta_generic_to_shared(sm + MM_LUT_BYTES) +
                        (uint32_t)(warp * G1_DEPTH * G1_STAGE) + 16u * (uint32_t)lane;
    uint8_t *const sc = (uint8_t *)sm + MM_LUT_BYTES + W * G1_DEPTH * G1_STAGE +
                        warp * mm_scale_area(C);
    char *const xs = sm + MM_LUT_BYTES + W * (G1_DEPTH * G1_STAGE + mm_scale_area(C));
    mm_lut_fill(mm_lut);
    DS_GRID_DEPENDENCY();
    // The down kernel's arrival counters start at zero (it runs next; see d1).
    if (cnt && blockIdx.x == 0)
        for (int i = threadIdx.x; i < C / MM_ROWS; i += blockDim.x) cnt[i] = 0;
    // The token's x pieces (16 bytes, 8 elements) of this thread, loaded before the expert id so
    // both round trips overlap; stored below, after the weight copies are on their way.
    const int n_pieces = nch * 16;
    uint4 xq[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int q = (int)threadIdx.x + j * (int)blockDim.x;
        xq[j] = q < n_pieces && q * 8 < C ? __ldg((const uint4 *)a.x + q) : make_uint4(0, 0, 0, 0);
    }
    const int tile = (int)blockIdx.x * W + warp, slot = tile / tpe;
    int e = -1;
    if (slot < KE) {
        e = __ldg(a.expert_ids + slot);
        if (e >= a.n_experts) e = -1;
    }
    const int r0 = (tile % tpe) * MM_ROWS;
    const size_t row_b = (size_t)C / 2, row_s = (size_t)C / 32;
    const size_t wr = (size_t)(e >= 0 ? e : 0) * 2 * I + r0 + 2 * g; // gate row; wr + 1 linear
    const uint8_t *p = a.gate_up_blocks + wr * row_b + 16 * t;
    if (e >= 0)
        g1_start<G1_DEPTH>(my, sc, a.gate_up_scales + (wr - 2 * g) * row_s, p, row_b, nb, 0, nch);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int q = (int)threadIdx.x + j * (int)blockDim.x;
        if (q < n_pieces) g1_x_put(xs, q, xq[j]);
    }
    for (int q = (int)threadIdx.x + 2 * (int)blockDim.x; q < n_pieces; q += (int)blockDim.x)
        g1_x_put(xs, q, q * 8 < C ? __ldg((const uint4 *)a.x + q) : make_uint4(0, 0, 0, 0));
    __syncthreads(); // the table and x
    if (e < 0) return;
    const float bg = ld_elem(a.gate_up_bias, a.bias_dtype, wr);
    const float bl = ld_elem(a.gate_up_bias, a.bias_dtype, wr + 1);
    const float rs = moe_row_scale(a, 0); // with the biases: its latency hides behind the loop
    const char *const xsv[1] = {xs};
    float acc[4];
    g1_stream<1, G1_DEPTH>((const char *)mm_lut, my, sc, p, row_b, nb, 0, nch, xsv, acc, -1,
                           nullptr, G1_BLOAD ? g == 0 : true);
    if (t != 0) return; // column 0 (the token) lives in lanes t = 0: rows 2g (acc[0]), 2g + 1
    const float gg = __fadd_rn(__fmul_rn(acc[0], rs), bg), ll = __fadd_rn(__fmul_rn(acc[2], rs), bl);
    const float h = swiglu_clamped(gg, ll, a.swiglu_alpha, a.swiglu_limit);
    const ds_bf16 hi = ds_f32_to_bf16(h);
    const ds_bf16 lo = ds_f32_to_bf16(__fsub_rn(h, ds_bf16_to_f32(hi)));
    const int unit = r0 / 2 + g;
    hh[(size_t)slot * I + unit] = hi;
    hh[(size_t)KE * I + (size_t)slot * I + unit] = lo;
}

// One token (T = 1, KE <= 4): down + combine with the bits of bf16_mxfp4w_moe_down_combine_1tok_mma
// (each (slot, 16-feature tile, K half) streamed as that kernel's warp does, the halves added
// first half first, the bias, then combine_1tok's operations), spread like the gate_up above:
// warp w of block b owns unit u = b·W + w (slot u / (2C/16), 16-feature tile, K half), one
// block per SM, the h (hi and lo) of the block's slots staged in shared memory. A unit leaves its
// 16 sums in part[u] (global), then counts itself in cnt[tile] (zeroed by the gate_up kernel);
// the warp that completes a tile's 2·KE units combines its 16 features from part (in L2) in the
// fixed order, so which warp does it does not change a bit.
// 1: the one-token down kernel looks up its experts and issues its first weight copies before
// the grid dependency (see the kernel); 0: after it. The bits do not depend on it.
#ifndef D1_EARLY
#define D1_EARLY 1
#endif
#ifndef D1_DEPTH
#define D1_DEPTH 2 // (4, 3, 2, 1 with G1_DEPTH 8, 6, 5, 4 above: 2.63, 2.58, 2.56, 2.69 ms)
#endif

// Slots whose h a block stages: its W consecutive units span at most this many (units are
// slot-major, 2·C/16 per slot).
static __host__ __device__ __forceinline__ int d1_slots(int warps, int C, int KE) {
    const int n = (warps - 1) / (2 * (C / MM_ROWS)) + 2;
    return n < KE ? n : KE;
}

// D1_HOLES 1: the warps' rings lie in the decode table's holes (mm_slot, as in the grouped
// kernels; at most MM_STAGES stages), so the block takes ~22 KB less shared memory and fits on an
// SM beside a one-token gate_up block: launched under programmatic dependent launch, its blocks
// then become resident while gate_up runs and do their set-up, expert lookup and first weight
// copies there. 0: contiguous rings after the table. The bits do not depend on it.
#ifndef D1_HOLES
#define D1_HOLES 1
#endif
static __host__ __device__ __forceinline__ int d1_ring_bytes(int warps) {
    return D1_HOLES ? 0 : warps * D1_DEPTH * G1_STAGE;
}
static __host__ __device__ __forceinline__ int d1_smem_bytes(int warps, int C, int I, int KE) {
    return MM_LUT_BYTES + d1_ring_bytes(warps) + warps * mm_scale_area(I) +
           2 * d1_slots(warps, C, KE) * g1_x_bytes(I);
}

#define D1_PIECES 6 // staged h pieces a thread loads at once (one round trip for ~2 slots at 11 warps)

// 1: a unit counts itself with one acquire-release atomic; 0: a sequentially consistent fence,
// a relaxed atomic and (the last) a second fence. The bits do not depend on it.
#ifndef D1_ACQREL
#define D1_ACQREL 1
#endif

// Lane 0's arrival at a tile counter that completes at n: true for the unit that completes it.
// The warp's sums are ordered before it (a __syncwarp before the call) and, for the last unit,
// every other unit's sums after it (a __syncwarp after, before the other lanes read them).
static __device__ __forceinline__ bool d1_arrive(int32_t *cnt, int n) {
#if D1_ACQREL
    int32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(cnt) : "memory");
    return old == n - 1;
#else
    __threadfence();
    const bool last = atomicAdd(cnt, 1) == n - 1;
    if (last) __threadfence();
    return last;
#endif
}

__global__ void __launch_bounds__(G1_MAX_WARPS *DS_WARP, 1)
    bf16_mxfp4w_moe_down_1tok_mma(const struct ds_moe_args a, const uint16_t *hh, float *part,
                                  int32_t *cnt, int W) {
    // W: the working warps; any further warps of the block only help fill the table and stage h
    // (they exist to size the block's registers, see the launch).
    extern __shared__ uint4 mm_lut[];
    const int warp = threadIdx.x / DS_WARP;
    const int lane = threadIdx.x % DS_WARP, g = lane >> 2, t = lane & 3;
    const int C = a.dim, I = a.inter, KE = a.top_k, nb = I / DS_MXFP4_BLOCK, nch = mm_chunks(I);
    char *const sm = (char *)mm_lut;
    constexpr int SS = D1_HOLES ? MM_STAGE_STRIDE : G1_STAGE, RO = D1_HOLES ? 1024 : 512;
    const uint32_t my = D1_HOLES ? mm_slot(mm_lut, warp, D1_DEPTH)
                                 : (uint32_t)__cvta_generic_to_shared(sm + MM_LUT_BYTES) +
                                           (uint32_t)(warp * D1_DEPTH * G1_STAGE) +
                                           16u * (uint32_t)lane;
    uint8_t *const sc = (uint8_t *)sm + MM_LUT_BYTES + d1_ring_bytes(W) + warp * mm_scale_area(I);
    char *const xs = sm + MM_LUT_BYTES + d1_ring_bytes(W) + W * mm_scale_area(I);
    const int xb = g1_x_bytes(I); // one staged row
    mm_lut_fill(mm_lut);
    // D1_EARLY: the expert lookup and the first chunks' copies go out before the grid
    // dependency: the router wrote expert_ids before gate_up (this op's first kernel) began, and
    // the weights no kernel writes; h (gate_up's output) and the counters only after it.
    if constexpr (!D1_EARLY) DS_GRID_DEPENDENCY();
    // Unit u = (slot, tile, half), slot-major: neighbouring warps stream neighbouring row tiles
    // of one expert, and a block needs the h of one or two slots only.
    const int per_slot = 2 * (C / MM_ROWS), n_units = per_slot * KE;
    const int u = warp < W ? (int)blockIdx.x * W + warp : n_units;
    const int slot = u / per_slot, tile = u % per_slot / 2, half = u % 2;
    int e = -1;
    if (u < n_units) {
        e = __ldg(a.expert_ids + slot);
        if (e >= a.n_experts) e = -1;
    }
    const int r0 = tile * MM_ROWS, hc = mm_half(I);
    const int c_lo = half ? hc : 0, c_hi = half ? nch : hc;
    const size_t row_b = (size_t)I / 2, row_s = (size_t)I / 32;
    const size_t wr = (size_t)(e >= 0 ? e : 0) * C + r0 + 2 * g;
    const uint8_t *p = a.down_blocks + wr * row_b + 16 * t;
    if (e >= 0)
        g1_start<D1_DEPTH, SS, RO>(my, sc, a.down_scales + (wr - 2 * g) * row_s, p, row_b, nb,
                                   c_lo, c_hi);
    // The combine's operands for feature r0 + lane, loaded now by every unit, so that the unit
    // that completes the tile waits only for the other units' sums: the router's ids and
    // weights, the down biases, the residual and the next norm's gain. None of them is written
    // by this op's kernels (the ids' reasoning above holds for all of them), and the loads are
    // in flight during the chunk loop. Bit j of cvalid: slot j's expert is valid (KE <= 4).
    float cw[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float cres = 0.0f, cgain = 0.0f;
    unsigned cvalid = 0;
    if (u < n_units && lane < MM_ROWS) {
        const size_t c = (size_t)r0 + lane;
#pragma unroll
        for (int s = 0; s < 4; s++) {
            if (s < KE) {
                const int ee = __ldg(a.expert_ids + s);
                if (ee >= 0 && ee < a.n_experts) {
                    cvalid |= 1u << s;
                    cw[s] = __ldg(a.expert_weights + s);
                    cb[s] = ld_elem(a.down_bias, a.bias_dtype, (size_t)ee * C + c);
                }
            }
        }
        if (a.residual) cres = ld_elem(a.residual, a.act, c);
        cgain = moe_gain(a, (int)c);
    }
    if constexpr (D1_EARLY) DS_GRID_DEPENDENCY();
    // The block's slots s0 .. s1: staged row 2(s - s0) + lo holds hi (hh + s·I) or lo
    // (hh + (KE + s)·I), zero-padded to whole chunks. The loads go out together (one round trip).
    const int s0 = (int)blockIdx.x * W / per_slot;
    const int s1 = min(KE - 1, ((int)blockIdx.x * W + W - 1) / per_slot);
    g1_stage_rows<D1_PIECES>(xs, xb, 2 * (s1 - s0 + 1), nch * 16, I, [&](int r) {
        return (const uint4 *)(hh + (size_t)((r & 1) * KE + s0 + (r >> 1)) * I);
    });
    __syncthreads(); // the table and h
    if (u >= n_units) return;
    if (e >= 0) {
        const char *const xsv[2] = {xs + 2 * (slot - s0) * xb, xs + (2 * (slot - s0) + 1) * xb};
        float acc[4];
        g1_stream<2, D1_DEPTH, SS, RO>((const char *)mm_lut, my, sc, p, row_b, nb, c_lo, c_hi, xsv,
                                       acc, -1, nullptr, G1_BLOAD ? g == 0 : true);
        if (t == 0) { // column 0: rows 2g, 2g + 1
            part[(size_t)u * MM_ROWS + 2 * g] = acc[0];
            part[(size_t)u * MM_ROWS + 2 * g + 1] = acc[2];
        }
    }
    // Arrival (an invalid slot's units arrive with nothing written: the combine skips them).
    __syncwarp(); // this warp's sums before its count
    int last = 0;
    if (lane == 0) last = d1_arrive(cnt + tile, 2 * KE);
    if (!__shfl_sync(DS_FULL_MASK, last, 0)) return;
    __syncwarp(); // lane 0's acquire before the other lanes' reads
    if (lane >= MM_ROWS) return;
    // Feature r0 + lane: y_s = (half 0 + half 1) + b2, then combine_1tok's sum, in the router's
    // order; every unit's sums are loaded at once (one round trip).
    const int c = r0 + lane;
    float p0[4], p1[4];
#pragma unroll
    for (int s = 0; s < 4; s++) {
        p0[s] = p1[s] = 0.0f;
        if (cvalid >> s & 1u) {
            const size_t u0 = (size_t)s * per_slot + 2 * tile;
            p0[s] = __ldcg(part + u0 * MM_ROWS + lane);
            p1[s] = __ldcg(part + (u0 + 1) * MM_ROWS + lane);
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < 4; s++)
        if (cvalid >> s & 1u)
            sum = __fmaf_rn(cw[s], __fadd_rn(__fadd_rn(p0[s], p1[s]), cb[s]), sum);
    if (a.residual) sum = __fadd_rn(sum, cres);
    moe_store_out_g(a, (size_t)c, sum, cgain);
}

// A few tokens (2 <= T, T·KE <= 32: the verify step's rows, the small path): gate_up + SwiGLU
// with the bits of bf16_mxfp4w_moe_gate_up_mma<1> (per (expert, row tile) the same A fragments
// and mma sequence, the expert's pairs as the columns in small_group's order, the same epilogue),
// laid out like the one-token kernel: one block per SM, the T tokens' x staged once per block in
// shared memory (G1 layout, one row per token), and the (expert in use, row tile) items dealt to
// the warps of all blocks round by round, a round's consecutive items to consecutive blocks
// (warp (b, w) takes items j·G·W + w·G + b), so that every SM streams about the same bytes.
// Replaces the grouped kernel's 3.6 waves of 4-warp blocks, each starting its stream cold, and
// its activation loads from global memory inside the chunk loop.
#define G2_MAX_WARPS 16
#define G2_PIECES 6 // staged x pieces a thread loads at once (8 tokens of 2880 at 16 warps)

static __host__ __device__ __forceinline__ int g2_smem_bytes(int warps, int C, int T) {
    return MM_LUT_BYTES + warps * (G1_DEPTH * G1_STAGE + mm_scale_area(C)) + T * g1_x_bytes(C);
}

__global__ void __launch_bounds__(G2_MAX_WARPS *DS_WARP, 1)
    bf16_mxfp4w_moe_gate_up_few_mma(const struct ds_moe_args a, uint16_t *hh) {
    extern __shared__ uint4 mm_lut[];
    __shared__ int32_t s_list[G2_MAX_WARPS][DS_WARP];
    const int W = blockDim.x / DS_WARP, warp = threadIdx.x / DS_WARP;
    const int lane = threadIdx.x % DS_WARP, g = lane >> 2, t = lane & 3;
    const int T = a.n_rows, C = a.dim, I = a.inter, KE = a.top_k, np = T * KE;
    const int nb = C / DS_MXFP4_BLOCK, nch = mm_chunks(C), tpe = 2 * I / MM_ROWS;
    char *const sm = (char *)mm_lut;
    const uint32_t my = (uint32_t)__cvta_generic_to_shared(sm + MM_LUT_BYTES) +
                        (uint32_t)(warp * G1_DEPTH * G1_STAGE) + 16u * (uint32_t)lane;
    uint8_t *const sc = (uint8_t *)sm + MM_LUT_BYTES + W * G1_DEPTH * G1_STAGE +
                        warp * mm_scale_area(C);
    char *const xs = sm + MM_LUT_BYTES + W * (G1_DEPTH * G1_STAGE + mm_scale_area(C));
    const int xb = g1_x_bytes(C);
    mm_lut_fill(mm_lut);
    DS_GRID_DEPENDENCY();
    // x of token r at xs + r·xb (C % 8 == 0: the host checks).
    g1_stage_rows<G2_PIECES>(xs, xb, T, nch * 16, C,
                             [&](int r) { return (const uint4 *)a.x + (size_t)r * (C / 8); });
    __syncthreads(); // the table and x
    const size_t row_b = (size_t)C / 2, row_s = (size_t)C / 32;
    int32_t *const list = s_list[warp];
    int cy = -1, e = -1, n = 0;
    for (int item = warp * (int)gridDim.x + (int)blockIdx.x;; item += W * (int)gridDim.x) {
        const int y = item / tpe;
        __syncwarp(); // every lane is done with the previous item's list and scales
        if (y != cy) { // the y-th expert in use and its pairs (items only grow: once per expert)
            e = small_group(a.expert_ids, np, a.n_experts, y, list, &n);
            cy = y;
            __syncwarp(); // list[] written by the lanes of the matching pairs
        }
        if (e < 0) break; // fewer than y + 1 experts in use: no later item has work either
        const int r0 = item % tpe * MM_ROWS;
        const size_t wr = (size_t)e * 2 * I + r0 + 2 * g; // gate row; wr + 1 linear
        const uint8_t *p = a.gate_up_blocks + wr * row_b + 16 * t;
        g1_start<G1_DEPTH>(my, sc, a.gate_up_scales + (wr - 2 * g) * row_s, p, row_b, nb, 0, nch);
        // Column g' of D is pair list[g'] (g' < n); this lane's B column is g's token (a
        // discarded column, g >= n, reads nothing under G1_BLOAD: a column of D depends only on
        // its own column of B).
        const int tok = g < n ? list[g] / KE : 0;
        int pq[2];
        float rs[2];
#pragma unroll
        for (int q = 0; q < 2; q++) {
            pq[q] = 2 * t + q < n ? list[2 * t + q] : -1;
            rs[q] = pq[q] >= 0 ? moe_row_scale(a, pq[q] / KE) : 1.0f;
        }
        const float bg = ld_elem(a.gate_up_bias, a.bias_dtype, wr);
        const float bl = ld_elem(a.gate_up_bias, a.bias_dtype, wr + 1);
        const char *const xsv[1] = {xs + tok * xb};
        float acc[4];
        g1_stream<1, G1_DEPTH>((const char *)mm_lut, my, sc, p, row_b, nb, 0, nch, xsv, acc, -1,
                               nullptr, G1_BLOAD ? g < n : true);
        // gate_up_mma's epilogue: rows 2g (acc[q]) and 2g + 1 (acc[2 + q]), column 2t + q.
        const int unit = r0 / 2 + g;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            if (pq[q] < 0) continue;
            const float gg = __fadd_rn(__fmul_rn(acc[q], rs[q]), bg),
                        ll = __fadd_rn(__fmul_rn(acc[2 + q], rs[q]), bl);
            const float h = swiglu_clamped(gg, ll, a.swiglu_alpha, a.swiglu_limit);
            const ds_bf16 hi = ds_f32_to_bf16(h);
            const ds_bf16 lo = ds_f32_to_bf16(__fsub_rn(h, ds_bf16_to_f32(hi)));
            hh[(size_t)pq[q] * I + unit] = hi;
            hh[(size_t)np * I + (size_t)pq[q] * I + unit] = lo;
        }
    }
}

// A few tokens (the small path, 2 <= T): down with the bits of bf16_mxfp4w_moe_down_mma<1> (per
// (expert, 16-row tile) and pair: the two K halves, each summed from zero, added first half
// first, then the bias; y[pair][row] in f32 for the combine kernel), laid out like the
// few-token gate_up: one block per SM, block b a contiguous range of the (expert in use, row
// tile) items (at most two experts: the host keeps a range within C/16 items), whose pairs' h
// (hi and lo) it stages in shared memory; warp w takes the range's items w, w + W, ... and
// streams both halves of an item through one ring (g1_stream's split). An expert holds at most
// T pairs (a row selects it once); beyond T (or 8) its pairs are left out, as the grouped kernel
// leaves out those beyond 8, and nothing outside the staged rows is touched.
#define G3_EXPERTS 2
#define G3_PIECES 8 // staged h pieces a thread loads at once (8 rows of 2880 at 11 warps)
#ifndef G3
#define G3 1 // 0: the few-token steps keep the grouped down kernel
#endif

static __host__ __device__ __forceinline__ int g3_rows(int T) { // staged h rows at most
    return 2 * G3_EXPERTS * (T < 8 ? T : 8);
}
static __host__ __device__ __forceinline__ int g3_smem_bytes(int warps, int I, int T) {
    return MM_LUT_BYTES + warps * mm_scale_area(I) + g3_rows(T) * g1_x_bytes(I);
}

__global__ void __launch_bounds__(G2_MAX_WARPS *DS_WARP, 1)
    bf16_mxfp4w_moe_down_few_mma(const struct ds_moe_args a, const uint16_t *hh, float *yo) {
    extern __shared__ uint4 mm_lut[];
    __shared__ int32_t s_list[G3_EXPERTS][DS_WARP];
    __shared__ int s_e[G3_EXPERTS], s_n[G3_EXPERTS];
    __shared__ int32_t s_src[2 * G3_EXPERTS * 8]; // staged row r: the h row it holds
    const int W = blockDim.x / DS_WARP, warp = threadIdx.x / DS_WARP;
    const int lane = threadIdx.x % DS_WARP, g = lane >> 2, t = lane & 3;
    const int T = a.n_rows, C = a.dim, I = a.inter, KE = a.top_k, np = T * KE;
    const int nb = I / DS_MXFP4_BLOCK, nch = mm_chunks(I), hc = mm_half(I), tpe = C / MM_ROWS;
    const int ncol = T < 8 ? T : 8; // columns an expert can have (see above)
    char *const sm = (char *)mm_lut;
    const uint32_t my = mm_slot(mm_lut, warp, D1_DEPTH); // rings in the table's holes
    uint8_t *const sc = (uint8_t *)sm + MM_LUT_BYTES + warp * mm_scale_area(I);
    char *const xs = sm + MM_LUT_BYTES + W * mm_scale_area(I);
    const int xb = g1_x_bytes(I);
    mm_lut_fill(mm_lut);
    DS_GRID_DEPENDENCY();
    // The number of experts in use (each warp counts it; the same everywhere), the block's range.
    const int id = lane < np ? __ldg(a.expert_ids + lane) : -1;
    const bool valid = id >= 0 && id < a.n_experts;
    const unsigned same = __match_any_sync(DS_FULL_MASK, id);
    const int n_used = __popc(__ballot_sync(DS_FULL_MASK, valid && __ffs(same) - 1 == lane));
    const int n_items = n_used * tpe, per = (n_items + (int)gridDim.x - 1) / (int)gridDim.x;
    const int i_lo = (int)blockIdx.x * per, i_hi = min(n_items, i_lo + per);
    if (i_lo >= i_hi) return; // block-uniform
    const int y_lo = i_lo / tpe, ny = (i_hi - 1) / tpe - y_lo + 1; // <= G3_EXPERTS
    for (int k = warp; k < ny; k += W) { // expert in use y_lo + k and its pairs
        int n = 0;
        const int e = small_group(a.expert_ids, np, a.n_experts, y_lo + k, s_list[k], &n);
        if (lane == 0) s_e[k] = e, s_n[k] = min(n, ncol);
    }
    __syncthreads();
    // Expert k's column c: staged rows 2(off_k + c) (hi) and 2(off_k + c) + 1 (lo).
    const int n0 = s_n[0], nrows = 2 * (n0 + (ny > 1 ? s_n[1] : 0));
    if ((int)threadIdx.x < nrows) {
        const int c = (int)threadIdx.x / 2, k = c >= n0;
        s_src[threadIdx.x] = (int)(threadIdx.x & 1) * np + s_list[k][c - (k ? n0 : 0)];
    }
    __syncthreads();
    g1_stage_rows<G3_PIECES>(xs, xb, nrows, nch * 16, I,
                             [&](int r) { return (const uint4 *)(hh + (size_t)s_src[r] * I); });
    __syncthreads(); // the table and h
    const size_t row_b = (size_t)I / 2, row_s = (size_t)I / 32;
    for (int item = i_lo + warp; item < i_hi; item += W) {
        const int k = item / tpe - y_lo, e = s_e[k], n = s_n[k], off = k ? n0 : 0;
        const int r0 = item % tpe * MM_ROWS;
        const size_t wr = (size_t)e * C + r0 + 2 * g;
        const uint8_t *p = a.down_blocks + wr * row_b + 16 * t;
        __syncwarp(); // every lane is done with the previous item's scales
        g1_start<D1_DEPTH, MM_STAGE_STRIDE, 1024>(my, sc, a.down_scales + (wr - 2 * g) * row_s, p,
                                                  row_b, nb, 0, nch);
        const float b0 = ld_elem(a.down_bias, a.bias_dtype, wr);
        const float b1 = ld_elem(a.down_bias, a.bias_dtype, wr + 1);
        // This lane's B column g: its pair's staged hi and lo (a discarded column, g >= n, reads
        // nothing under G1_BLOAD; row 0's address keeps the pointer inside the staged rows).
        const int rb = g < n ? 2 * (off + g) : 0;
        const char *const xsv[2] = {xs + rb * xb, xs + (rb + 1) * xb};
        float h0[4], h1[4];
        g1_stream<2, D1_DEPTH, MM_STAGE_STRIDE, 1024, true>((const char *)mm_lut, my, sc, p, row_b,
                                                            nb, 0, nch, xsv, h1, hc, h0,
                                                            G1_BLOAD ? g < n : true);
        // down_mma's epilogue: column 2t + q, rows 2g (h[q]) and 2g + 1 (h[2 + q]).
#pragma unroll
        for (int q = 0; q < 2; q++) {
            if (2 * t + q >= n) continue;
            const size_t pr = (size_t)s_list[k][2 * t + q];
            yo[pr * C + r0 + 2 * g] = __fadd_rn(__fadd_rn(h0[q], h1[q]), b0);
            yo[pr * C + r0 + 2 * g + 1] = __fadd_rn(__fadd_rn(h0[2 + q], h1[2 + q]), b1);
        }
    }
}

// Registers of one warp of kernel k as the SM allocates them (256-register units).
template <typename K> static int warp_regs(K k) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, k) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (fa.numRegs * DS_WARP + 255) / 256 * 256;
}

// Idle warps added to a one-token down block of wd working warps. Under PDL the down blocks
// become resident while gate_up (one block of wg warps per SM, 131 blocks at the 120b shapes)
// still runs: one fits beside each gate_up block (D1_HOLES), but on the SM without a gate_up
// block two down blocks fit as well, and the scheduler then leaves a gate_up SM without one; that
// SM's doubled share lengthened every down call by ~6 us (measured: 497 -> 711 us per decode
// step). Shared memory cannot forbid the pair (two down blocks take less than one of each), so
// the block's registers do: idle warps make two down blocks exceed the register file while one
// still fits beside a gate_up block. 0 when no count does (the pair is then left possible).
#ifndef D1_PAD
#define D1_PAD 1 // 0: no idle warps (for measuring what they prevent)
#endif
static int d1_pad_warps(int wg, int wd) {
    static int rg = -1, rd = -1;
    if (rg < 0) {
        rg = warp_regs(bf16_mxfp4w_moe_gate_up_1tok_mma);
        rd = warp_regs(bf16_mxfp4w_moe_down_1tok_mma);
    }
    const int file = 65536;
    if (rg <= 0 || rd <= 0) return 0;
    for (int pad = 0; wd + pad <= G1_MAX_WARPS; pad++) {
        const int blk = (wd + pad) * rd;
        if (2 * blk > file && blk + wg * rg <= file) return pad;
    }
    return 0;
}

// The SM's split of its on-chip memory between L1 and shared memory is set when a block is placed
// on an idle SM, from the kernel's preference; by default the driver picks a split just large
// enough for the one-token gate_up block (118 KiB at the 120b shapes), which leaves no room for a
// down block beside it, so PDL could not place the down blocks until gate_up's blocks left (H200,
// %globaltimer per block: down's blocks entered at 14.3 us of a 30 us op, with gate_up's exits).
// Both kernels ask for the largest shared split. A placement hint: the bits do not depend on it.
// MOE_CARVEOUT 0: the driver's choice (for measuring what it costs).
#ifndef MOE_CARVEOUT
#define MOE_CARVEOUT 1
#endif
template <typename K> static void moe_carveout_max(K k, int *set) {
    if (!MOE_CARVEOUT || *set) return;
    DS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       (int)cudaSharedmemCarveoutMaxShared));
    *set = 1;
}

template <int NT>
static void mm_launch(const struct ds_moe_args *a, dim3 g1, dim3 g2, cudaStream_t st,
                      const int32_t *groups, const struct moe_ws &w, long long avg) {
    static int set_gu = 0, set_dn = 0;
    const int s1 = mm_smem_bytes(MM_WARPS, a->dim), s2 = mm_smem_bytes(MM_WARPS, a->inter);
    const int items = MM_PERSIST && groups && avg <= MM_PERSIST_AVG;
    if (items) { // work items (see mm_items): 3 blocks per SM at most
        const unsigned long long cap = 3ull * (unsigned)moe_sm_count();
        const unsigned long long n1 = (unsigned long long)g1.x * g1.y * g1.z;
        const unsigned long long n2 = (unsigned long long)g2.x * g2.y * g2.z;
        g1 = dim3((unsigned)(n1 < cap ? n1 : cap));
        if (MM_DN_FULLK) g2 = dim3((unsigned)(n2 < cap ? n2 : cap));
    }
    ds_smem_attr(bf16_mxfp4w_moe_gate_up_mma<NT>, &set_gu, s1);
    ds_smem_attr(bf16_mxfp4w_moe_down_mma<NT>, &set_dn, s2);
    ds_launch(bf16_mxfp4w_moe_gate_up_mma<NT>, g1, dim3(MM_THREADS), s1, st, *a, groups,
              (const int32_t *)w.pairs, (uint16_t *)w.h, items);
    ds_launch(bf16_mxfp4w_moe_down_mma<NT>, g2, dim3(MM_THREADS), s2, st, *a, groups,
              (const int32_t *)w.pairs, (const uint16_t *)w.h, w.y, items);
}

// gate_up then down of one variant.
template <int V>
static void moe_gemv_launch(const struct ds_moe_args *a, dim3 g1, dim3 g2, cudaStream_t st,
                            const int32_t *groups, const struct moe_ws &w) {
    ds_launch(act_mxfp4w_moe_gate_up_swiglu<V>, g1, dim3(MOE_THREADS), 0, st, *a, groups,
              (const int32_t *)w.pairs, w.h);
    ds_launch(f32_mxfp4w_moe_down<V>, g2, dim3(MOE_THREADS), 0, st, *a, groups,
              (const int32_t *)w.pairs, (const float *)w.h, w.y);
}

extern "C" enum ds_status ds_moe_cuda(const struct ds_moe_args *a, void *stream) {
    static const char op[] = "moe (cuda)";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dtype(op, "bias", a->bias_dtype));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "dim", a->dim, DS_MXFP4_BLOCK));
    CU_TRY(cu_check_dim(op, "inter", a->inter, DS_MXFP4_BLOCK));
    CU_TRY(cu_check_dim(op, "n_experts", a->n_experts, 1));
    if (a->dim % DS_MXFP4_BLOCK || a->inter % DS_MXFP4_BLOCK)
        return ds_error_set(DS_ERR_ARG, "%s: dim %d and inter %d must be multiples of %d", op,
                            a->dim, a->inter, DS_MXFP4_BLOCK);
    if (a->top_k < 1 || a->top_k > a->n_experts)
        return ds_error_set(DS_ERR_ARG, "%s: top_k %d outside [1, %d]", op, a->top_k,
                            a->n_experts);
    if (a->n_experts > MOE_MAX_EXPERTS || a->n_experts > 65535)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d experts, at most %d", op, a->n_experts,
                            MOE_MAX_EXPERTS);
    if (!(a->swiglu_limit > 0.0f) || !(a->swiglu_alpha > 0.0f))
        return ds_error_set(DS_ERR_ARG, "%s: swiglu alpha %g and limit %g must be positive", op,
                            a->swiglu_alpha, a->swiglu_limit);
    if (a->n_rows == 0) return DS_OK;
    const void *need[] = {a->x,           a->expert_ids,     a->expert_weights, a->gate_up_blocks,
                          a->gate_up_scales, a->gate_up_bias, a->down_blocks,    a->down_scales,
                          a->down_bias,   a->out,            a->workspace};
    static const char *const names[] = {"x", "expert_ids", "expert_weights", "gate_up_blocks",
                                        "gate_up_scales", "gate_up_bias", "down_blocks",
                                        "down_scales", "down_bias", "out", "workspace"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        CU_TRY(cu_check_ptr(op, names[i], need[i]));
    if (a->out == a->x) return ds_error_set(DS_ERR_ARG, "%s: out must not alias x", op);
    if (a->norm_gain) { // the deferred-norm output (ds/kernel_args.h)
        CU_TRY(cu_check_dtype(op, "norm gain", a->norm_gain_dtype));
        CU_TRY(cu_check_ptr(op, "norm_out", a->norm_out));
        const void *in[3] = {a->out, a->x, a->residual};
        static const char *const nm[3] = {"out", "x", "residual"};
        for (int i = 0; i < 3; i++) // the reference's checks, the same words
            if (in[i] && a->norm_out == in[i])
                return ds_error_set(DS_ERR_ARG, "%s: norm_out must not alias %s", op, nm[i]);
    }
    if (((uintptr_t)a->x | (uintptr_t)a->gate_up_blocks | (uintptr_t)a->down_blocks |
         (uintptr_t)a->workspace) % 16)
        return ds_error_set(DS_ERR_ARG,
                            "%s: x, the expert blocks and the workspace must be 16-byte aligned",
                            op);
    const int T = a->n_rows, C = a->dim, I = a->inter, E = a->n_experts, KE = a->top_k;
    if ((long long)T * KE > INT32_MAX / 2)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d rows × %d experts too many", op, T, KE);
    const size_t need_ws = ds_moe_cuda_workspace_bytes(T, C, I, E, KE);
    if (a->workspace_bytes < need_ws)
        return ds_error_set(DS_ERR_ARG,
                            "%s: workspace of %zu bytes, %zu needed for %d rows "
                            "(ds_moe_workspace_bytes_v2)",
                            op, a->workspace_bytes, need_ws, T);
    const struct moe_ws w = moe_ws_plan(a->workspace, T, C, I, E, KE);
    cudaStream_t st = DS_STREAM(stream);

    // Up to 32 pairs the GEMV blocks find their expert and pairs themselves (small_group); above,
    // one grouping kernel lists them in the workspace.
    const bool small = (long long)T * KE <= MOE_SMALL_PAIRS;
    if (!small) {
        ds_launch(moe_group_by_expert, dim3(1), dim3(1024), 0, st, a->expert_ids, T * KE, E,
                  w.groups, w.pairs);
    }
    // Grid y: experts in use, at most min(E, T·KE); blocks past the device-side count exit at
    // once. An expert holds at most T pairs (a row selects it once), so T/64 chunks cover any
    // count (one chunk on the small path: T <= 32). Variant by the average tokens per expert in
    // use: one row (decode) runs the 1-token variant, >= 3 on average the wide one.
    const unsigned n_used_max = (unsigned)((long long)T * KE < E ? (long long)T * KE : E);
    const unsigned chunks = cu_blocks((size_t)T, MOE_TOKEN_CHUNK);
    const int variant = (long long)T * KE >= (long long)MOE_TT_WIDE_AVG * E ? 2 : T == 1 ? 0 : 1;
    dim3 g1(cu_blocks((size_t)2 * I, MOE_ROWS_PER_BLOCK), n_used_max, chunks);
    if (variant == 0) g1.x = moe_v0_grid_x(g1.x, n_used_max);
    const dim3 g2(cu_blocks((size_t)C, MOE_ROWS_PER_BLOCK), n_used_max, chunks);
    const int32_t *groups = small ? NULL : w.groups;
    if (a->act == DS_ELEM_BF16) {
        // Tensor cores (every T; see "bf16 activations" above). Tiles of 8 pairs per expert: up
        // to T on the small path (an expert holds at most one pair per row); on the grouped one
        // NT tiles per weight pass, over the block's chunk of MM_TOKEN_CHUNK pairs.

        if (mm_smem_bytes(8, I) > 227 * 1024 || mm_smem_bytes(MM_WARPS, C) > 227 * 1024)
            return ds_error_set(DS_ERR_UNSUPPORTED,
                                "%s: dim %d / inter %d need more shared memory than a block has",
                                op, C, I);
        const unsigned mch = cu_blocks((size_t)T, MM_TOKEN_CHUNK);
        const dim3 m1(cu_blocks((size_t)2 * I, MM_BLOCK_ROWS), n_used_max, mch);
        const dim3 m2(cu_blocks((size_t)C, MM_DN_FULLK ? MM_BLOCK_ROWS : 2 * MM_ROWS), n_used_max,
                      mch);
        if (T == 1 && KE <= 4) {
            static int set_gu = 0, set_dn = 0;
            const int s1 = mm_smem_bytes(MM_WARPS, C), s2 = mm_smem_bytes(8, I);
            // One block per SM for both products, their work spread evenly over the SMs (gate_up:
            // (slot, row tile) pairs; down: (tile, slot, K half) units), when their shared memory
            // fits; the down kernel needs the gate_up kernel's zeroed counters.
            static int set_g1 = 0, set_d1 = 0, co_g1 = 0, co_d1 = 0;
            const int sms = moe_sm_count();
            const int tiles = KE * (2 * I / MM_ROWS), units = C / MM_ROWS * 2 * KE;
            const int wg = (tiles + sms - 1) / sms, wd = (units + sms - 1) / sms;
            const bool g1 = wg <= G1_MAX_WARPS && g1_smem_bytes(wg, C) <= 227 * 1024;
            const bool d1 = g1 && wd <= G1_MAX_WARPS && (!D1_HOLES || wd * D1_DEPTH <= MM_STAGES) &&
                            d1_smem_bytes(wd, C, I, KE) <= 227 * 1024;
            int32_t *cnt = d1 ? w.groups : NULL;
            if (g1) {
                const int s0 = g1_smem_bytes(wg, C);
                ds_smem_attr(bf16_mxfp4w_moe_gate_up_1tok_mma, &set_g1, s0);
                moe_carveout_max(bf16_mxfp4w_moe_gate_up_1tok_mma, &co_g1);
                ds_launch(bf16_mxfp4w_moe_gate_up_1tok_mma, dim3((unsigned)((tiles + wg - 1) / wg)),
                          dim3((unsigned)(wg * DS_WARP)), s0, st, *a, (uint16_t *)w.h, cnt);
            } else {
                ds_smem_attr(bf16_mxfp4w_moe_gate_up_mma<1>, &set_gu, s1);
                ds_launch(bf16_mxfp4w_moe_gate_up_mma<1>, m1, dim3(MM_THREADS), s1, st, *a,
                          (const int32_t *)NULL, (const int32_t *)w.pairs, (uint16_t *)w.h, 0);
            }
            if (d1) {
                const int s3 = d1_smem_bytes(wd, C, I, KE);
                ds_smem_attr(bf16_mxfp4w_moe_down_1tok_mma, &set_d1, s3);
                moe_carveout_max(bf16_mxfp4w_moe_down_1tok_mma, &co_d1);
                const int pad = g1 && D1_PAD ? d1_pad_warps(wg, wd) : 0;
                ds_launch(bf16_mxfp4w_moe_down_1tok_mma, dim3((unsigned)((units + wd - 1) / wd)),
                          dim3((unsigned)((wd + pad) * DS_WARP)), s3, st, *a,
                          (const uint16_t *)w.h, w.y, cnt, wd);
                return DS_OK;
            }
            ds_smem_attr(bf16_mxfp4w_moe_down_combine_1tok_mma, &set_dn, s2);
            ds_launch(bf16_mxfp4w_moe_down_combine_1tok_mma, dim3((unsigned)(C / MM_ROWS)),
                      dim3(MM_FUSED_THREADS), s2, st, *a, (const uint16_t *)w.h);
            return DS_OK;
        }
        // Tiles of 8 pairs per weight pass: on the small path up to T (an expert holds at most
        // one pair per row); above it from the pairs an expert in use holds on average (the
        // mma's, activation loads and accumulators of unused tiles are wasted work, while an
        // expert with more pairs than 8·NT in a block's chunk streams its weights once per group).
        const long long avg = ((long long)T * KE + n_used_max - 1) / n_used_max;
        const int nt = small ? (T <= 8 ? 1 : T <= 16 ? 2 : 4)
                             : MM_NT_BY_AVG ? (avg <= 4 ? 1 : avg <= 12 ? 2 : 4) : 4;
        if (small && nt == 1 && C % 8 == 0) { // small_group lists at most 32 pairs
            // A few tokens (the small path): the one-block-per-SM gate_up, whose warps take
            // about the same number k of (expert, row tile) items each, then the few-token down
            // where its staged h fits (else the grouped down), then the combine.
            const int sms = moe_sm_count();
            const int per_sm = (int)(((long long)n_used_max * (2 * I / MM_ROWS) + sms - 1) / sms);
            const int k = (per_sm + G2_MAX_WARPS - 1) / G2_MAX_WARPS;
            const int wf = (per_sm + k - 1) / k, sf = g2_smem_bytes(wf, C, T);
            if (sf <= 227 * 1024) {
                static int set_g2 = 0, set_g3 = 0, set_dn = 0;
                ds_smem_attr(bf16_mxfp4w_moe_gate_up_few_mma, &set_g2, sf);
                ds_launch(bf16_mxfp4w_moe_gate_up_few_mma, dim3((unsigned)sms),
                          dim3((unsigned)(wf * DS_WARP)), sf, st, *a, (uint16_t *)w.h);
                // down: (expert, row tile) items, both K halves each; a block's range of about
                // n_used·C/16 / SMs items spans at most two experts (sms >= n_used_max).
                const int dper = (int)(((long long)n_used_max * (C / MM_ROWS) + sms - 1) / sms);
                const int kd = (dper + G2_MAX_WARPS - 1) / G2_MAX_WARPS;
                const int wd = (dper + kd - 1) / kd, sd = g3_smem_bytes(wd, I, T);
                if (G3 && sms >= (int)n_used_max && dper <= C / MM_ROWS &&
                    wd * D1_DEPTH <= MM_STAGES && sd <= 227 * 1024) {
                    ds_smem_attr(bf16_mxfp4w_moe_down_few_mma, &set_g3, sd);
                    ds_launch(bf16_mxfp4w_moe_down_few_mma, dim3((unsigned)sms),
                              dim3((unsigned)(wd * DS_WARP)), sd, st, *a, (const uint16_t *)w.h,
                              w.y);
                } else {
                    const int s2 = mm_smem_bytes(MM_WARPS, I);
                    ds_smem_attr(bf16_mxfp4w_moe_down_mma<1>, &set_dn, s2);
                    ds_launch(bf16_mxfp4w_moe_down_mma<1>, m2, dim3(MM_THREADS), s2, st, *a,
                              groups, (const int32_t *)w.pairs, (const uint16_t *)w.h, w.y, 0);
                }
                ds_launch(act_moe_combine, dim3((unsigned)T, cu_blocks((size_t)C, 256)), dim3(256),
                          0, st, *a, (const float *)w.y);
                return DS_OK;
            }
        }
        if (nt == 1)
            mm_launch<1>(a, m1, m2, st, groups, w, avg);
        else if (nt == 2)
            mm_launch<2>(a, m1, m2, st, groups, w, avg);
        else
            mm_launch<4>(a, m1, m2, st, groups, w, avg);
        ds_launch(act_moe_combine, dim3((unsigned)T, cu_blocks((size_t)C, 256)), dim3(256), 0, st,
                  *a, (const float *)w.y);
        return DS_OK;
    }
    if (T == 1 && KE <= MOE_WARPS) { // variant 0 (T == 1)
        // Decode: gate_up, then down and combine fused (KE warps per 8 output features).
        ds_launch(act_mxfp4w_moe_gate_up_swiglu<0>, g1, dim3(MOE_THREADS), 0, st, *a,
                  (const int32_t *)NULL, (const int32_t *)w.pairs, w.h);
        ds_launch(act_mxfp4w_moe_down_combine_1tok, dim3((unsigned)(C / MOE_ROWS_PER_WARP)),
                  dim3((unsigned)(DS_WARP * KE)), 0, st, *a, (const float *)w.h);
        return DS_OK;
    }
    if (variant == 0) moe_gemv_launch<0>(a, g1, g2, st, groups, w);
    else if (variant == 1) moe_gemv_launch<1>(a, g1, g2, st, groups, w);
    else moe_gemv_launch<2>(a, g1, g2, st, groups, w);
    dim3 g3((unsigned)T, cu_blocks((size_t)C, 256));
    ds_launch(act_moe_combine, g3, dim3(256), 0, st, *a, (const float *)w.y);
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Standalone decode (tests, inspection)

__global__ void mxfp4_dequant_f32(const uint8_t *blocks, const uint8_t *scales, size_t n_words,
                                  float *out) {
    __shared__ float lut[16];
    lut_init(lut);
    __syncthreads();
    // One thread per 4-byte word = 8 elements; a word never straddles a 32-element block. The
    // table walk is the GEMV core's (e2m1_decode8).
    for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < n_words;
         q += (size_t)gridDim.x * blockDim.x) {
        const uint32_t word = ((const uint32_t *)blocks)[q];
        const uint8_t s = scales[q / 4];
        float w[8];
        e2m1_decode8(lut, word, w);
#pragma unroll
        for (int i = 0; i < 8; i++) out[q * 8 + i] = mxfp4_apply_scale(w[i], s);
    }
}

extern "C" enum ds_status ds_mxfp4_dequant_cuda(const uint8_t *blocks, const uint8_t *scales,
                                                int n_rows, int k_dim, float *out, void *stream) {
    static const char op[] = "mxfp4_dequant (cuda)";
    CU_TRY(cu_check_dim(op, "n_rows", n_rows, 0));
    CU_TRY(cu_check_dim(op, "k_dim", k_dim, DS_MXFP4_BLOCK));
    if (k_dim % DS_MXFP4_BLOCK)
        return ds_error_set(DS_ERR_ARG, "%s: k_dim %d is not a multiple of %d", op, k_dim,
                            DS_MXFP4_BLOCK);
    if (n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "blocks", blocks));
    CU_TRY(cu_check_ptr(op, "scales", scales));
    CU_TRY(cu_check_ptr(op, "out", out));
    if ((uintptr_t)blocks % 4)
        return ds_error_set(DS_ERR_ARG, "%s: blocks must be 4-byte aligned", op);
    const size_t n_words = (size_t)n_rows * k_dim / 8;
    unsigned grid = cu_blocks(n_words, 256);
    if (grid > 65535) grid = 65535;
    mxfp4_dequant_f32<<<grid, 256, 0, DS_STREAM(stream)>>>(blocks, scales, n_words, out);
    DS_KERNEL_CHECK();
    return DS_OK;
}
