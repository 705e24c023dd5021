// kernels/cuda/attention.cu: attention over the per-slot KV cache on CUDA (ds_attention_args):
// per-head sinks, GQA, optional sliding window, any mix of prefill chunks, one-token decode rows
// and K+1-row verify sequences in one call.
//
// Layouts (ds/kernel_args.h): q (T, NH, D), k/v (T, NKV, D) in `act` (f32 or bf16); caches
// (S, P, NKV, D) in `cache_dtype` (f32 or bf16); sinks (NH) f32 or bf16; out (T, NH, D) act.
// All math in fp32 (products of bf16 operands are exact in fp32). Kernel names: `act_` = f32 or
// bf16 activations picked at run time, `bf16_` = bf16 only.
//
// The split of a row's keys (a function of the row's own position and the window only):
//   chunk c   = keys 32c .. 32c+31 (absolute positions); the row's chunks are c_first .. c_last;
//   split s   = chunks s·cps .. s·cps+cps−1, cps = 4·ceil(n/64) for a row of n chunks, so a row
//               has at most 16 splits (17 when its range starts mid-split) of >= 128 keys
//               (4096 keys: 16 splits of 256); with args.max_splits = m (1..16, batch-variant
//               numerics only) cps = 4·ceil(n/(4m)): at most m splits (m + 1);
//   in a split, chunk c belongs to warp c mod 4, which folds its chunks in increasing order into
//   an online softmax (m, l, acc per head);
//   the split's state = the 4 warp states merged in warp order;
//   the row's state  = the sink (m = S_h, l = 1) merged with the split states in split order
//                      (att_merge); out = acc / l.
// How a chunk is scored and folded differs between the two attention kernels below (FFMA per
// lane, or tensor-core MMA); a call uses exactly one of them, chosen by the dtypes and D alone.
//
// Kernels:
//   (append)                   every row's new k and v go to (slot, pos) of its sequence,
//                              converted to the cache dtype. In calls of few rows (any call, for
//                              the tensor-core kernel) with 16-byte aligned k and v this happens
//                              inside the attention kernel (block z = 0 of each (row, KV head)
//                              stores its row), and the attention blocks read keys at positions
//                              >= the sequence's pos0 from k/v rounded to the cache dtype
//                              instead of from the cache, so no block reads what another writes
//                              and a prefill row still sees the rows before it (fused). Otherwise
//   act_kv_cache_append        runs first as its own kernel (one block per row). Same bits.
//                              (Sequences must own distinct slots, as the reference checks.)
//   bf16_sdpa_sink_gqa_tc<D, SPLIT>
//                              bf16 activations and bf16 cache with D = 64 or 128 (gpt-oss):
//                              one block (4 warps) per (row, KV head, group of up to 8 query
//                              heads [, split]). Each warp copies its chunks' key and value rows
//                              to shared memory with cp.async (all of them at once in split mode
//                              up to 4 per warp, else the next one while this one is computed;
//                              keys outside the row's range zero-filled, never read) and scores
//                              and sums them with bf16 mma.m16n8k16 (fp32 accumulators): a few
//                              hundred instructions per warp and chunk. Details at the kernel.
//   act_sdpa_sink_gqa_d<D, HB, FUSED, SPLIT>
//                              every other dtype pair and D in {16, 32, 64, 128}: one block (4
//                              warps) per (row, KV head, group of up to HB query heads [, split]),
//                              lane j scores key 32c+j with FFMA, lanes own D/32 output dims. HB
//                              = 8 for calls of many rows; HB = 4 (twice the blocks, half the
//                              serial work per warp) while the grid stays about one wave; HB = 2
//                              or 1 while it stays about one block per SM sub-partition. Every
//                              per-head operation is the same whatever HB. Calls of many rows
//                              (>= 1024 row blocks) run <D, 8, false, false> after the append
//                              kernel: the fused key path costs registers that this FMA-bound
//                              case needs for occupancy.
//   Both attention kernels have the same two modes:
//   - SPLIT (flash-decoding): grid z = split; the block computes one split state and stores it to
//     the workspace, then counts itself in att_arrivals[(row, y)]; the last block to arrive
//     merges the row's states, sink first, in split order, writes out and resets the counter (no
//     combine launch). Its merge is spread over the block: the factors of each (split, head) are
//     formed once, in parallel, then every output element folds its accumulators with them: the
//     att_merge arithmetic, the same bits;
//   - whole row (workspace NULL or too small, enough rows to fill the GPU, or no row longer than
//     5 chunks, e.g. a 128-key window): the block walks the splits itself and merges them as it
//     goes, with the same att_merge arithmetic in the same order.
//
// All kernels are launched with ds_launch and begin with DS_GRID_DEPENDENCY().
//
// Batch invariance. The split boundaries, the owner warp of every chunk and every summation order
// depend only on the row's own key range [max(0, p − W + 1), p] and compile-time constants, never
// on T, n_seq, the other rows or the mode; each block reads only its own row's q, its slot of the
// cache and its position. Both modes of a kernel perform the same operations in the same order
// (explicit _rn intrinsics, no contraction; an MMA's result for one element depends only on that
// element's operands), and the kernel is chosen by the dtypes and D, never by T, so a row's output
// is bitwise the same alone, in a verify batch, inside a prefill chunk, with or without a
// workspace.
//
// Memory. Every key and value load serves the query heads of a GQA group. Keys of a chunk outside
// the row's range are masked and their values are neither copied nor read, so stale NaN/Inf
// entries of the cache are harmless. In act_sdpa_sink_gqa_d (D <= 64) the values of a chunk are
// copied to shared memory with cp.async (16 B per lane, coalesced) while the keys are scored.
//
// Workspace (split mode): per row, ds_attention_workspace_bytes(1, NH, D, P) / (NH·(D+2)·4)
// records (at most ATT_SLOTS = 17, what a row can use) of NH·D f32 accumulators followed by NH
// (m, l) pairs. The arrival counters live in static device memory (zero at module load, left at
// zero by every call): two split-mode calls on one device must not run at the same time (all ops
// of a backend share one stream).
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.cuh"
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"

#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * DS_WARP)
#define ATT_CHUNK 32                            // keys per chunk = lanes of a warp
#define ATT_HB 8                                // query heads per block, many-row calls
#define ATT_HB_SMALL 4                          // ... calls of few blocks (more, shorter blocks)
#define ATT_SMALL_MAX_BLOCKS 1088               // ATT_HB_SMALL while blocks stay <= ~1 wave
#define ATT_TINY_MAX_BLOCKS 544                 // 1 or 2 heads per block up to ~1 per SMSP
#define ATT_COUNTERS 8192                       // split mode: arrival counters, (row, y) pairs
#define ATT_BASE_CHUNKS ATT_WARPS               // chunks of the shortest split (128 keys)
#define ATT_MAX_SPLITS 16                       // splits of a range that starts on a split
#define ATT_SLOTS (ATT_MAX_SPLITS + 1)          // ... and of one that starts mid-split
#define ATT_SPLIT_MAX_BLOCKS 1024               // whole-row blocks that already fill the GPU
#define ATT_SPLIT_MIN_CHUNKS 6                  // shorter ranges always run whole-row

// Split mode: per (row, grid y) the number of split blocks that have stored their state. The last
// one to arrive merges the states and sets the counter back to 0, so every call starts from zero
// (static device memory is zero at module load). Calls of one device must not overlap in time:
// every caller issues its ops on one stream (the backend's), where they never do.
__device__ unsigned att_arrivals[ATT_COUNTERS];

// N consecutive elements at element index i of a buffer of run-time dtype, vectorised: the address
// must be aligned to N elements (N a power of two up to 32).
template <int N>
static __device__ __forceinline__ void ldn(const void *base, enum ds_elem dt, size_t i, float *o) {
    if (dt == DS_ELEM_BF16) {
        const ds_bf16 *p = (const ds_bf16 *)base + i;
        if constexpr (N >= 8) {
#pragma unroll
            for (int c = 0; c < N / 8; c++) {
                uint4 u = __ldg((const uint4 *)p + c);
                const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    o[8 * c + 2 * j] = __uint_as_float(w[j] << 16);
                    o[8 * c + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
                }
            }
        } else if constexpr (N == 4) {
            uint2 u = __ldg((const uint2 *)p);
            o[0] = __uint_as_float(u.x << 16), o[1] = __uint_as_float(u.x & 0xffff0000u);
            o[2] = __uint_as_float(u.y << 16), o[3] = __uint_as_float(u.y & 0xffff0000u);
        } else if constexpr (N == 2) {
            uint32_t u = __ldg((const uint32_t *)p);
            o[0] = __uint_as_float(u << 16), o[1] = __uint_as_float(u & 0xffff0000u);
        } else {
            o[0] = ds_bf16_to_f32(p[0]);
        }
    } else {
        const float *p = (const float *)base + i;
        if constexpr (N >= 4) {
#pragma unroll
            for (int c = 0; c < N / 4; c++) {
                float4 v = __ldg((const float4 *)p + c);
                o[4 * c] = v.x, o[4 * c + 1] = v.y, o[4 * c + 2] = v.z, o[4 * c + 3] = v.w;
            }
        } else if constexpr (N == 2) {
            float2 v = __ldg((const float2 *)p);
            o[0] = v.x, o[1] = v.y;
        } else {
            o[0] = p[0];
        }
    }
}

// N consecutive elements from shared memory holding cache-dtype values (N = 1 or 2, aligned).
template <int N>
static __device__ __forceinline__ void lds_n(const unsigned char *p, enum ds_elem dt, float *o) {
    if (dt == DS_ELEM_BF16) {
        if constexpr (N == 2) {
            const uint32_t u = *(const uint32_t *)p;
            o[0] = __uint_as_float(u << 16), o[1] = __uint_as_float(u & 0xffff0000u);
        } else {
            o[0] = __uint_as_float((uint32_t)(*(const uint16_t *)p) << 16);
        }
    } else {
        if constexpr (N == 2) {
            const float2 v = *(const float2 *)p;
            o[0] = v.x, o[1] = v.y;
        } else {
            o[0] = *(const float *)p;
        }
    }
}

// The sequence owning packed row t (sequences sorted by row0) to *s, or false for a padding row.
static __device__ bool seq_of_row(const struct ds_attn_seq *seqs, int n_seq, int t,
                                  struct ds_attn_seq *s) {
    int lo = 0, hi = n_seq - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (seqs[mid].row0 <= t) lo = mid;
        else hi = mid - 1;
    }
    if ((uintptr_t)seqs % 16 == 0) { // one 16-byte load: the four fields in one round trip
        const int4 v = __ldg((const int4 *)(seqs + lo));
        s->row0 = v.x, s->n_rows = v.y, s->pos0 = v.z, s->slot = v.w;
    } else {
        *s = seqs[lo];
    }
    return t >= s->row0 && t < s->row0 + s->n_rows;
}

// Row t's sequence (its first row and position) and absolute position, or false when the row is
// padding or its slot/position lies outside the cache (the device table is trusted, but never
// followed out of bounds).
static __device__ bool row_place(const struct ds_attention_args &a, int t, int *slot, int *pos,
                                 int *pos0, int *row0) {
    struct ds_attn_seq s;
    if (!seq_of_row(a.seqs, a.n_seq, t, &s)) return false;
    *slot = s.slot, *pos = s.pos0 + (t - s.row0), *pos0 = s.pos0, *row0 = s.row0;
    return s.slot >= 0 && s.slot < a.n_slots && *pos >= 0 && *pos < a.max_pos;
}

// The most splits of a range (header comment): max_splits when a batch-variant caller set it.
static __host__ __device__ __forceinline__ int att_cap(int max_splits) {
    return max_splits >= 1 && max_splits < ATT_MAX_SPLITS ? max_splits : ATT_MAX_SPLITS;
}

// The key range of a row and its split (see the header comment).
struct att_geom {
    int slot, p, first;     // cache slot, position, first key
    int c_first, c_last;    // chunks of the range
    int cps;                // chunks per split
    int s_first, s_last;    // splits of the range
    int call0, row0;        // keys j >= call0 come from k/v row row0 + (j − call0) (fused append)
    int pos0;               // the sequence's first position in this call: keys below it are in
                            // the cache since an earlier call, whatever `fused`
};

// fused: this call's keys are read from k/v (rounded to the cache dtype), not from the cache.
static __device__ bool att_geom_of(const struct ds_attention_args &a, int t, bool fused,
                                   struct att_geom *g) {
    if (!row_place(a, t, &g->slot, &g->p, &g->call0, &g->row0)) return false;
    g->pos0 = g->call0;
    if (!fused) g->call0 = INT_MAX;
    g->first = a.window > 0 ? max(0, g->p - a.window + 1) : 0;
    g->c_first = g->first / ATT_CHUNK, g->c_last = g->p / ATT_CHUNK;
    const int n = g->c_last - g->c_first + 1, per = ATT_BASE_CHUNKS * att_cap(a.max_splits);
    g->cps = ATT_BASE_CHUNKS * ((n + per - 1) / per);
    g->s_first = g->c_first / g->cps, g->s_last = g->c_last / g->cps;
    return true;
}

// The state a row starts from: the sink as a logit with weight 1, or nothing.
static __device__ __forceinline__ void att_init(const struct ds_attention_args &a, int h, float *m,
                                                float *l, float *acc) {
    if (a.sinks) *m = ld_elem(a.sinks, a.sinks_dtype, (size_t)h), *l = 1.0f;
    else *m = -INFINITY, *l = 0.0f;
    *acc = 0.0f;
}

// Merges the split state (ms, ls, as) into the running state (m, l, acc) of one output element.
// Both modes call exactly this, in the same split order.
static __device__ __forceinline__ void att_merge(float *m, float *l, float *acc, float ms, float ls,
                                                 float as) {
    const float mn = fmaxf(*m, ms);
    const float cr = *m == mn ? 1.0f : expf(*m - mn); // == also covers −∞ vs −∞
    const float cs = ms == mn ? 1.0f : expf(ms - mn);
    *l = __fmaf_rn(ls, cs, __fmul_rn(*l, cr));
    *acc = __fmaf_rn(as, cs, __fmul_rn(*acc, cr));
    *m = mn;
}

// Value e of this call's k or v as the cache holds it: rounded to bf16 when the cache is bf16 and
// the activations f32 (what st_elem stores), exact otherwise.
static __device__ __forceinline__ float as_cached(const struct ds_attention_args &a, float e) {
    return a.cache_dtype == DS_ELEM_BF16 && a.act == DS_ELEM_F32 ? ds_bf16_to_f32(ds_f32_to_bf16(e))
                                                                 : e;
}

// One 16-byte piece of a value row in the cache dtype (8 bf16 or 4 f32), made from the call's v
// (act) at element index i; i is aligned to the piece.
static __device__ __forceinline__ uint4 call_piece(const struct ds_attention_args &a, size_t i) {
    if (a.act == a.cache_dtype) return __ldg((const uint4 *)((const unsigned char *)a.v +
                                                             i * (a.act == DS_ELEM_BF16 ? 2 : 4)));
    if (a.cache_dtype == DS_ELEM_BF16) { // f32 activations: 8 floats rounded to bf16
        const float4 x = __ldg((const float4 *)a.v + i / 4), y = __ldg((const float4 *)a.v + i / 4 + 1);
        uint4 r;
        r.x = (uint32_t)ds_f32_to_bf16(x.x) | (uint32_t)ds_f32_to_bf16(x.y) << 16;
        r.y = (uint32_t)ds_f32_to_bf16(x.z) | (uint32_t)ds_f32_to_bf16(x.w) << 16;
        r.z = (uint32_t)ds_f32_to_bf16(y.x) | (uint32_t)ds_f32_to_bf16(y.y) << 16;
        r.w = (uint32_t)ds_f32_to_bf16(y.z) | (uint32_t)ds_f32_to_bf16(y.w) << 16;
        return r;
    }
    const uint2 u = __ldg((const uint2 *)((const ds_bf16 *)a.v + i)); // bf16 act, f32 cache
    return make_uint4(u.x << 16, u.x & 0xffff0000u, u.y << 16, u.y & 0xffff0000u);
}

__global__ void __launch_bounds__(128) act_kv_cache_append(const struct ds_attention_args a) {
    DS_GRID_DEPENDENCY();
    const int t = blockIdx.x;
    int slot, pos, pos0, row0;
    if (!row_place(a, t, &slot, &pos, &pos0, &row0)) return;
    const size_t n = (size_t)a.n_kv_heads * a.head_dim;
    const size_t dst = ((size_t)slot * a.max_pos + pos) * n, src = (size_t)t * n;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        st_elem(a.k_cache, a.cache_dtype, dst + i, ld_elem(a.k, a.act, src + i));
        st_elem(a.v_cache, a.cache_dtype, dst + i, ld_elem(a.v, a.act, src + i));
    }
}

// Block (t, y, z): row t, KV head g = y / n_sub, query heads h0 .. h0+nh−1 of that group (HB per
// block; the per-head arithmetic does not depend on HB, so neither do the bits).
// SPLIT: z is the split's index within the row's range; the block stores its split state to
// record z of the row (nspl records per row), and the last block of (t, y) to arrive merges the
// row's records into out, sink first, in split order. Otherwise (z = 0) the block walks the
// splits itself and merges them as it goes: the same att_merge calls in the same order.
// FUSED: the append happens here and this call's keys and values are read from k/v as cached.
template <int D, int HB, bool FUSED, bool SPLIT>
__global__ void __launch_bounds__(ATT_THREADS)
act_sdpa_sink_gqa_d(const struct ds_attention_args a, float *ws, int nspl) {
    DS_GRID_DEPENDENCY();
    static_assert(HB == 1 || HB == 2 || HB % 4 == 0, "probabilities are staged as 1, 2 or 4s");
    constexpr int DPL = D >= DS_WARP ? D / DS_WARP : 1; // output dims per lane
    constexpr int KP = D < DS_WARP ? D : DS_WARP;        // key elements loaded at once
    constexpr bool STAGE = D <= 64;                      // values through shared memory
    constexpr int VBYTES = STAGE ? ATT_CHUNK * D * 4 : 16; // one chunk of values, f32 worst case
    constexpr int NE = HB * D;                            // output elements of the block
    constexpr int EPT = (NE + ATT_THREADS - 1) / ATT_THREADS; // ... per thread
    __shared__ __align__(16) float qs[HB][D];
    __shared__ __align__(16) unsigned char vs[ATT_WARPS][VBYTES];
    __shared__ __align__(16) float ps[ATT_WARPS][ATT_CHUNK][HB];
    __shared__ float pm[ATT_WARPS][HB], pl[ATT_WARPS][HB];
    __shared__ __align__(16) float pacc[ATT_WARPS][HB][D];
    __shared__ int last_block;

    const int t = blockIdx.x, lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int NH = a.n_heads, NKV = a.n_kv_heads, G = NH / NKV;
    const int n_sub = (G + HB - 1) / HB;
    const int g = blockIdx.y / n_sub, sub = blockIdx.y % n_sub;
    const int h0 = g * G + sub * HB, nh = min(HB, G - sub * HB);
    // q and the sinks do not depend on the row's place: their loads are issued before the
    // sequence lookup so the two latencies overlap (row t < T is always readable).
    float qr[EPT];
    float rm[EPT], rl[EPT], racc[EPT]; // whole-row mode: the running state of EPT outputs
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int i = threadIdx.x + k * ATT_THREADS, h = i / D, d = i % D;
        qr[k] = i < NE && h < nh ? ld_elem(a.q, a.act, ((size_t)t * NH + h0 + h) * D + d) : 0.0f;
        if constexpr (!SPLIT) att_init(a, h0 + min(h, nh - 1), &rm[k], &rl[k], &racc[k]);
    }
    struct att_geom geo;
    if (!att_geom_of(a, t, FUSED, &geo)) return; // the whole block leaves: padding row
    const size_t pos_stride = (size_t)NKV * D;
    const size_t base = (size_t)geo.slot * a.max_pos * pos_stride + (size_t)g * D;
    if (FUSED && blockIdx.z == 0 && sub == 0 && threadIdx.x < D) {
        // The append: this row's k and v of KV head g go to the cache. No block of this call
        // reads these entries from the cache (keys >= call0 come from k/v), so no ordering.
        const size_t src = ((size_t)t * NKV + g) * D + threadIdx.x;
        const size_t dst = base + (size_t)geo.p * pos_stride + threadIdx.x;
        st_elem(a.k_cache, a.cache_dtype, dst, ld_elem(a.k, a.act, src));
        st_elem(a.v_cache, a.cache_dtype, dst, ld_elem(a.v, a.act, src));
    }
    int s_beg = geo.s_first, s_end = geo.s_last;
    if constexpr (SPLIT) {
        s_beg += blockIdx.z;
        if (s_beg > s_end) return; // the row has fewer splits
        s_end = s_beg;
    }
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int i = threadIdx.x + k * ATT_THREADS;
        if (i < NE) qs[i / D][i % D] = qr[k];
    }
    __syncthreads();
    const bool owns_dims = lane * DPL < D;
    const int es = a.cache_dtype == DS_ELEM_BF16 ? 2 : 4, row_bytes = D * es;
    // 16-byte pieces of a value row, 2^lp (a power of two): shifts, not run-time divisions.
    const int lp = __ffs(row_bytes / 16) - 1;
    unsigned char *vw = vs[warp];

    for (int s = s_beg; s <= s_end; s++) {
        float m[HB], l[HB], acc[HB][DPL];
#pragma unroll
        for (int h = 0; h < HB; h++) {
            m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[h][i] = 0.0f;
        }
        const int c_lo = max(s * geo.cps, geo.c_first);
        const int c_hi = min(s * geo.cps + geo.cps - 1, geo.c_last);
        int c = c_lo + (warp - c_lo % ATT_WARPS + ATT_WARPS) % ATT_WARPS; // first c ≡ warp
        for (; c <= c_hi; c += ATT_WARPS) {
            const int j = c * ATT_CHUNK + lane;
            const bool valid = j >= geo.first && j <= geo.p;
            const int k_lo = max(geo.first - c * ATT_CHUNK, 0);           // valid keys of the
            const int k_hi = min(geo.p - c * ATT_CHUNK, ATT_CHUNK - 1);   // chunk: k_lo .. k_hi
            if constexpr (STAGE) {
                // The chunk's values to shared memory, 16 B per lane per step, coalesced; they
                // land while the keys are scored.
                for (int q = lane; q < ATT_CHUNK << lp; q += DS_WARP) {
                    const int key = q >> lp, part = q & ((1 << lp) - 1), jk = c * ATT_CHUNK + key;
                    if (key < k_lo || key > k_hi) continue;
                    unsigned char *dst = vw + key * row_bytes + part * 16;
                    if (FUSED && jk >= geo.call0) { // this call's value, converted as cached
                        const size_t i = ((size_t)(geo.row0 + jk - geo.call0) * NKV + g) * D +
                                         part * (16 / es);
                        *(uint4 *)dst = call_piece(a, i);
                        continue;
                    }
                    const unsigned char *src =
                        (const unsigned char *)a.v_cache + (base + (size_t)jk * pos_stride) * es +
                        part * 16;
                    __pipeline_memcpy_async(dst, src, 16);
                }
                __pipeline_commit();
            }
            // Scores of key j for the block's heads: Σ_d q[h][d]·k[d] in increasing d.
            float sc[HB];
#pragma unroll
            for (int h = 0; h < HB; h++) sc[h] = 0.0f;
            if (valid) {
                const bool call = FUSED && j >= geo.call0; // this call's key: from k, as cached
                const size_t ko = call ? ((size_t)(geo.row0 + j - geo.call0) * NKV + g) * D
                                       : base + (size_t)j * pos_stride;
                // The dtype must stay warp-uniform for the vector loads: when act and cache
                // dtypes match, k and the cache are read alike; otherwise the per-element path.
                const bool same = a.act == a.cache_dtype;
                const void *kb = call && same ? a.k : a.k_cache;
#pragma unroll
                for (int d0 = 0; d0 < D; d0 += KP) {
                    float kr[KP];
                    if (same || !call) {
                        ldn<KP>(kb, a.cache_dtype, ko + d0, kr);
                    } else {
#pragma unroll
                        for (int e = 0; e < KP; e++)
                            kr[e] = as_cached(a, ld_elem(a.k, a.act, ko + d0 + e));
                    }
#pragma unroll
                    for (int h = 0; h < HB; h++)
#pragma unroll
                        for (int d = 0; d < KP; d += 4) {
                            const float4 qv = *(const float4 *)&qs[h][d0 + d];
                            sc[h] = __fmaf_rn(qv.x, kr[d], sc[h]);
                            sc[h] = __fmaf_rn(qv.y, kr[d + 1], sc[h]);
                            sc[h] = __fmaf_rn(qv.z, kr[d + 2], sc[h]);
                            sc[h] = __fmaf_rn(qv.w, kr[d + 3], sc[h]);
                        }
                }
            }
            // Online softmax per head over this chunk.
            float pv[HB];
#pragma unroll
            for (int h = 0; h < HB; h++) {
                const float x = valid ? __fmul_rn(sc[h], a.scale) : -INFINITY;
                const float mn = fmaxf(m[h], warp_max_f(x));
                const float corr = mn == -INFINITY ? 1.0f : expf(m[h] - mn);
                pv[h] = valid ? expf(x - mn) : 0.0f;
                l[h] = __fmaf_rn(l[h], corr, warp_sum_f(pv[h]));
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[h][i] = __fmul_rn(acc[h][i], corr);
                m[h] = mn;
            }
            if constexpr (HB % 4 == 0) {
#pragma unroll
                for (int h = 0; h < HB; h += 4)
                    *(float4 *)&ps[warp][lane][h] =
                            make_float4(pv[h], pv[h + 1], pv[h + 2], pv[h + 3]);
            } else if constexpr (HB == 2) {
                *(float2 *)&ps[warp][lane][0] = make_float2(pv[0], pv[1]);
            } else {
                ps[warp][lane][0] = pv[0];
            }
            if constexpr (STAGE) __pipeline_wait_prior(0);
            __syncwarp();
            // acc[h][d] += Σ_j p_j[h]·v_j[d] in increasing j; invalid keys are skipped, not read.
#pragma unroll 4
            for (int jj = k_lo; jj <= k_hi; jj++) {
                float vv[DPL];
                if (owns_dims) {
                    if constexpr (STAGE)
                        lds_n<DPL>(vw + jj * row_bytes + lane * DPL * es, a.cache_dtype, vv);
                    else if (FUSED && c * ATT_CHUNK + jj >= geo.call0) {
                        ldn<DPL>(a.v, a.act,
                                 ((size_t)(geo.row0 + c * ATT_CHUNK + jj - geo.call0) * NKV + g) *
                                         D + lane * DPL, vv);
#pragma unroll
                        for (int i = 0; i < DPL; i++) vv[i] = as_cached(a, vv[i]);
                    } else {
                        ldn<DPL>(a.v_cache, a.cache_dtype,
                                 base + (size_t)(c * ATT_CHUNK + jj) * pos_stride + lane * DPL,
                                 vv);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < DPL; i++) vv[i] = 0.0f;
                }
                float pj[HB];
                if constexpr (HB % 4 == 0) {
#pragma unroll
                    for (int h = 0; h < HB; h += 4) {
                        const float4 p4 = *(const float4 *)&ps[warp][jj][h];
                        pj[h] = p4.x, pj[h + 1] = p4.y, pj[h + 2] = p4.z, pj[h + 3] = p4.w;
                    }
                } else if constexpr (HB == 2) {
                    const float2 p2 = *(const float2 *)&ps[warp][jj][0];
                    pj[0] = p2.x, pj[HB - 1] = p2.y;
                } else {
                    pj[0] = ps[warp][jj][0];
                }
#pragma unroll
                for (int h = 0; h < HB; h++)
#pragma unroll
                    for (int i = 0; i < DPL; i++) acc[h][i] = __fmaf_rn(pj[h], vv[i], acc[h][i]);
            }
            __syncwarp(); // vs and ps are rewritten by the next chunk
        }

        // The split state: the warp states merged in warp order.
#pragma unroll
        for (int h = 0; h < HB; h++) {
            if (lane == 0) pm[warp][h] = m[h], pl[warp][h] = l[h];
            if (owns_dims)
#pragma unroll
                for (int i = 0; i < DPL; i++) pacc[warp][h][lane * DPL + i] = acc[h][i];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int i = threadIdx.x + k * ATT_THREADS, h = i / D, d = i % D;
            if (i >= NE) continue;
            float ms = -INFINITY;
            for (int w = 0; w < ATT_WARPS; w++)
                if (pl[w][h] > 0.0f) ms = fmaxf(ms, pm[w][h]);
            float ls = 0.0f, as = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++) {
                if (!(pl[w][h] > 0.0f)) continue; // a warp that owned no chunk of this split
                const float f = expf(pm[w][h] - ms);
                ls = __fmaf_rn(pl[w][h], f, ls);
                as = __fmaf_rn(pacc[w][h][d], f, as);
            }
            if constexpr (SPLIT) {
                if (h < nh) {
                    float *rec = ws + ((size_t)t * nspl + blockIdx.z) * NH * (D + 2);
                    rec[(size_t)(h0 + h) * D + d] = as;
                    if (d == 0) {
                        rec[(size_t)NH * D + 2 * (h0 + h)] = ms;
                        rec[(size_t)NH * D + 2 * (h0 + h) + 1] = ls;
                    }
                }
            } else {
                att_merge(&rm[k], &rl[k], &racc[k], ms, ls, as);
            }
        }
        if constexpr (!SPLIT) __syncthreads(); // pm, pl, pacc are rewritten by the next split
    }
    if constexpr (SPLIT) {
        // Arrival: the record must be visible device-wide before the counter says it is there.
        const int n = geo.s_last - geo.s_first + 1;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned *ctr = &att_arrivals[(size_t)t * gridDim.y + blockIdx.y];
            const unsigned before = atomicAdd(ctr, 1u);
            last_block = before == (unsigned)(n - 1);
            if (last_block) atomicExch(ctr, 0u); // every split has arrived: ready for next call
            __threadfence();
        }
        __syncthreads();
        if (!last_block) return;
        // The last block merges the row's split states, sink first, in split order: the
        // whole-row sequence of att_merge calls, with its work spread over the block. Within a
        // merge, the running max and the two factors (cr for the running state, cs for the split)
        // are the same for every dimension of a head, so each (split, head) pair forms them once,
        // in parallel: its thread folds the max over the sink and the earlier splits with the
        // same fmaxf sequence as att_merge, then the same two expf expressions. Every output
        // element then folds l and acc with the shared factors: __fmaf_rn(x, cs, __fmul_rn(y, cr))
        // as in att_merge, so the bits are those of whole-row mode. Records come from L2 (other
        // blocks wrote them); the first batch of accumulators is loaded before the factors.
        const size_t rs = (size_t)NH * (D + 2);
        const float *r0 = ws + (size_t)t * nspl * rs;
        constexpr int NF = (ATT_SLOTS * HB + ATT_THREADS - 1) / ATT_THREADS; // (split, head)s
        constexpr int MB = EPT >= 4 ? 32 / EPT : 16; // splits per batch of accumulator loads
        static_assert(3 * ATT_SLOTS <= ATT_WARPS * ATT_CHUNK, "merge factors fit in ps");
        // ps is free now (the chunk loop is over): (m, l) of split s, head h at [s·HB + h], then
        // cs, then cr over the m's.
        float *fm = &ps[0][0][0], *fl = fm + ATT_SLOTS * HB, *fcs = fl + ATT_SLOTS * HB;
        float mi[NF];
#pragma unroll
        for (int u = 0; u < NF; u++) {
            const int i = threadIdx.x + u * ATT_THREADS, s = i / HB, h = i % HB;
            mi[u] = -INFINITY;
            if (i >= n * HB || h >= nh) continue;
            const float *r = r0 + (size_t)s * rs + (size_t)NH * D + 2 * (h0 + h);
            fm[i] = __ldcg(r), fl[i] = __ldcg(r + 1);
            float l0, a0;
            att_init(a, h0 + h, &mi[u], &l0, &a0);
        }
        float av[EPT][MB];
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int i = threadIdx.x + k * ATT_THREADS, h = i / D, d = i % D;
            const float *r = r0 + (size_t)(h0 + min(h, nh - 1)) * D + d;
#pragma unroll
            for (int b = 0; b < MB; b++)
                av[k][b] = i < NE && h < nh && b < n ? __ldcg(r + (size_t)b * rs) : 0.0f;
        }
        __syncthreads();
        float fcr[NF];
#pragma unroll
        for (int u = 0; u < NF; u++) {
            const int i = threadIdx.x + u * ATT_THREADS, s = i / HB, h = i % HB;
            fcr[u] = 1.0f;
            if (i >= n * HB || h >= nh) continue;
            float m = mi[u];
#pragma unroll 8
            for (int j = 0; j < s; j++) m = fmaxf(m, fm[j * HB + h]);
            const float ms = fm[i], mn = fmaxf(m, ms);
            fcr[u] = m == mn ? 1.0f : expf(m - mn);
            fcs[i] = ms == mn ? 1.0f : expf(ms - mn);
        }
        __syncthreads(); // every m has been read: cr replaces it
#pragma unroll
        for (int u = 0; u < NF; u++) {
            const int i = threadIdx.x + u * ATT_THREADS;
            if (i < n * HB && i % HB < nh) fm[i] = fcr[u];
        }
        __syncthreads();
        float l[EPT], acc[EPT];
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int i = threadIdx.x + k * ATT_THREADS, h = i / D;
            float m0;
            att_init(a, h0 + min(h, nh - 1), &m0, &l[k], &acc[k]);
        }
        for (int s0 = 0; s0 < n; s0 += MB) {
#pragma unroll
            for (int b = 0; b < MB; b++) {
                if (s0 + b >= n) break;
#pragma unroll
                for (int k = 0; k < EPT; k++) {
                    const int i = threadIdx.x + k * ATT_THREADS, h = min(i / D, HB - 1);
                    const int e = (s0 + b) * HB + h;
                    const float cr = fm[e], cs = fcs[e];
                    l[k] = __fmaf_rn(fl[e], cs, __fmul_rn(l[k], cr));
                    acc[k] = __fmaf_rn(av[k][b], cs, __fmul_rn(acc[k], cr));
                }
            }
            if (s0 + MB >= n) break;
#pragma unroll
            for (int k = 0; k < EPT; k++) { // the next batch
                const int i = threadIdx.x + k * ATT_THREADS, h = i / D, d = i % D;
                const float *r = r0 + (size_t)(h0 + min(h, nh - 1)) * D + d;
#pragma unroll
                for (int b = 0; b < MB; b++)
                    av[k][b] = i < NE && h < nh && s0 + MB + b < n
                                       ? __ldcg(r + (size_t)(s0 + MB + b) * rs)
                                       : 0.0f;
            }
        }
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int i = threadIdx.x + k * ATT_THREADS, h = i / D, d = i % D;
            if (i < NE && h < nh)
                st_elem(a.out, a.act, ((size_t)t * NH + h0 + h) * D + d, __fdiv_rn(acc[k], l[k]));
        }
    } else {
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int i = threadIdx.x + k * ATT_THREADS, h = i / D, d = i % D;
            if (i < NE && h < nh)
                st_elem(a.out, a.act, ((size_t)t * NH + h0 + h) * D + d,
                        __fdiv_rn(racc[k], rl[k]));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core path: bf16 activations and bf16 cache, D = 64 or 128 (gpt-oss: D = 64).
//
// One block (4 warps) per (row, KV head, group of up to 8 query heads [, split]). A warp owns the
// chunks c ≡ warp (mod 4) of the block's range, as in the kernel above, and copies each chunk's
// 32 key rows and 32 value rows (bf16, as cached) to its own shared-memory stage with cp.async
// (16 B per lane; ns stages per warp, chunk i in stage i % ns: the first ns chunks are issued
// right after the sequence lookup and q's loads, before anything waits on memory, each later one
// as soon as its stage is free; keys outside the row's range are zero-filled, never read).
// Per chunk:
//   scores   S[h][j] = q[h]·k[j] with mma.m16n8k16 (bf16 in, fp32 accumulate): rows 0..7 of the
//            A tile are the block's query heads (rows 8..15 zero), the 32 keys are 4 n-tiles of
//            8, the D dims D/16 k-steps chained through the accumulator in increasing order;
//   softmax  x = S·scale (masked keys −∞); the chunk max per head (fmaxf over the 8 values a lane
//            holds, then over the head's 4 lanes); mn = max(m, chunk max), corr = e^(m − mn),
//            p = e^(x − mn) (__expf: ex2.approx, a few ulp); l = l·corr + Σp (the 8 values of a
//            lane in a fixed tree, then the head's 4 lanes by xor 1, xor 2); acc ·= corr;
//   values   acc[h][d] += Σ_j p[h][j]·v[j][d] with the same MMA, p split into two bf16 terms
//            p = hi + lo (hi = bf16(p), lo = bf16(p − hi), |p − hi − lo| <= 2^-16·p) so the
//            weights keep 16 bits: per 16 keys, hi then lo, k-steps in increasing key order.
// Per warp and chunk (D = 64, SASS): about 430 instructions (16 + 32 MMA, 8 + 8 ldmatrix, 9
// exponentials; the rest masking, the softmax and operand moves) plus about 80 that issue the
// next chunk's 16 copies. Nsight Compute counted 0.86 M warp instructions for a 4096-key decode at
// the 120b shapes (the FFMA kernel: 4.26 M).
// The split's state is the 4 warp states merged in warp order (factors e^(m_w − m), __expf), the
// row's state the sink merged with the split states in split order (att_merge's arithmetic), as
// in the kernel above, and both modes (SPLIT: one split per block, the last block to arrive
// merges the records; whole row: the block walks the splits) run this same code, so their bits
// agree. The MMA is a pure function of the operands of each output element (no dependence on the
// other rows or columns of the tile), so a row's bits do not depend on its neighbours either.

#define ATT_TC_HEADS 8        // query heads per block: the used rows of the MMA's 16-row A tile
#define ATT_TC_SMALL_GRID 264 // grids up to ~2 blocks per SM get up to 4 stages per warp
// 1: the sequence lookup and the copies of cached chunks go out before the grid dependency (see
// the kernel); 0: after it. The bits do not depend on it.
#ifndef ATT_TC_EARLY
#define ATT_TC_EARLY 1
#endif
// Most stages per warp in split mode (the smem of a block, so how many fit beside the previous
// kernel's blocks). The bits do not depend on it.
#ifndef ATT_TC_STAGES_MAX
#define ATT_TC_STAGES_MAX 4
#endif

// 16 bytes global -> shared, asynchronous; nothing is read and zeros land when !valid.
static __device__ __forceinline__ void att_cp16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

static __device__ __forceinline__ void att_cp_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `pending` (0 .. 3) of this thread's copy groups are in flight.
static __device__ __forceinline__ void att_cp_wait(int pending) {
    switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    }
}

// Four 8x8 b16 matrices from shared memory (lane l gives a row address of matrix l / 8).
static __device__ __forceinline__ void att_ldsm4(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
static __device__ __forceinline__ void att_ldsm4_t(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += A·B, m16n8k16, bf16 operands, fp32 accumulators. A rows 8..15 are zero here, so only
// a0 (row lane/4, k 2(lane%4) + 0, 1) and a2 (the same row, k + 8) are passed.
static __device__ __forceinline__ void att_mma(float d[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                               uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (to nearest even), x in the low half.
static __device__ __forceinline__ uint32_t att_bf16x2(float x, float y) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(y), "f"(x));
    return r;
}

// Where a warp's chunk of keys and values comes from: the cache, or k/v for this call's rows.
struct att_tc_src {
    const ds_bf16 *kc, *vc, *k, *v; // caches and this call's k, v
    size_t base, pos_stride;        // cache element of (slot, position 0, KV head g); positions
    int first, p, call0, row0, g, nkv;
};

// Copies chunk c's 32 key rows and 32 value rows to a stage (keys at kdst, values CB bytes on).
// Row r's 16-byte piece pc lands at r·RB + (pc ^ (r & 7))·16: the 8 rows an ldmatrix reads hit
// 8 different bank groups.
template <int D>
static __device__ __forceinline__ void att_tc_issue(const struct att_tc_src &s, int c,
                                                    uint32_t kdst, int lane) {
    constexpr int PR = D / 8, RB = D * 2, CB = ATT_CHUNK * RB, RS = DS_WARP / PR;
    const int j0 = c * ATT_CHUNK, r0 = lane / PR, pc = lane % PR; // rows r0 + RS·i
    if (j0 >= s.first && j0 + ATT_CHUNK - 1 <= s.p && j0 + ATT_CHUNK - 1 < s.call0) {
        // The common case: every key of the chunk in range and in the cache.
        const size_t e = s.base + (size_t)(j0 + r0) * s.pos_stride + pc * 8;
#pragma unroll
        for (int i = 0; i < PR; i++) {
            const int r = r0 + RS * i;
            const uint32_t at = kdst + r * RB + ((pc ^ (r & 7)) << 4);
            att_cp16(at, s.kc + e + (size_t)(RS * i) * s.pos_stride, true);
            att_cp16(at + CB, s.vc + e + (size_t)(RS * i) * s.pos_stride, true);
        }
    } else {
#pragma unroll
        for (int i = 0; i < PR; i++) {
            const int r = r0 + RS * i, j = j0 + r;
            const bool valid = j >= s.first && j <= s.p, call = j >= s.call0;
            size_t e = call ? ((size_t)(s.row0 + j - s.call0) * s.nkv + s.g) * D
                            : s.base + (size_t)j * s.pos_stride;
            e = valid ? e + pc * 8 : 0; // an address inside the buffer; nothing is read
            const uint32_t at = kdst + r * RB + ((pc ^ (r & 7)) << 4);
            att_cp16(at, (valid && call ? s.k : s.kc) + e, valid);
            att_cp16(at + CB, (valid && call ? s.v : s.vc) + e, valid);
        }
    }
    att_cp_commit();
}

template <int D, bool SPLIT>
__global__ void __launch_bounds__(ATT_THREADS)
bf16_sdpa_sink_gqa_tc(const struct ds_attention_args a, float *ws, int nspl, int fused,
                      int ns) {
    constexpr int HB = ATT_TC_HEADS, RB = D * 2, CB = ATT_CHUNK * RB, KS = D / 16, NT = D / 8;
    constexpr int TPH = ATT_THREADS / HB; // merge threads per head
    constexpr int EPT = D / TPH;          // ... each owning EPT consecutive dims
    constexpr int DP = D + 8;             // pacc row stride in floats (conflict-free float2 stores)
    static_assert(EPT % 4 == 0, "merge threads own whole float4s");
    extern __shared__ __align__(128) unsigned char att_smem[];
    __shared__ float pm[ATT_WARPS][HB], pl[ATT_WARPS][HB];
    __shared__ int last_block;
    float *pacc = (float *)(att_smem + (size_t)ATT_WARPS * ns * 2 * CB); // [warp][head][DP]

    const int t = blockIdx.x, lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int NH = a.n_heads, NKV = a.n_kv_heads, G = NH / NKV;
    const int n_sub = (G + HB - 1) / HB, g = blockIdx.y / n_sub, sub = blockIdx.y % n_sub;
    const int h0 = g * G + sub * HB, nh = min(HB, G - sub * HB);
    const int hq = lane / 4, kq = 2 * (lane % 4); // MMA fragment row (head) and column pair
    // Merge threads: head th, dims td .. td + EPT − 1.
    const int th = threadIdx.x / TPH, td = (threadIdx.x % TPH) * EPT;
    // Before the grid dependency (ATT_TC_EARLY): the sequence lookup (the call's table is written
    // before the step's first kernel) and, when the caller vouches for it (cache_settled), the
    // copies of the chunks whose keys all lie below the sequence's first position in this call:
    // cache entries that earlier calls wrote (this call's append, fused or not, writes positions
    // >= pos0 only). So those copies are in flight while the q/k/v product still runs. After the
    // dependency: q's loads, the append, the remaining copies.
    if constexpr (!ATT_TC_EARLY) DS_GRID_DEPENDENCY();
    struct att_geom geo;
    if (!att_geom_of(a, t, fused != 0, &geo)) return; // the whole block leaves: padding row
    struct att_tc_src src;
    src.kc = (const ds_bf16 *)a.k_cache, src.vc = (const ds_bf16 *)a.v_cache;
    src.k = (const ds_bf16 *)a.k, src.v = (const ds_bf16 *)a.v;
    src.pos_stride = (size_t)NKV * D;
    src.base = (size_t)geo.slot * a.max_pos * src.pos_stride + (size_t)g * D;
    src.first = geo.first, src.p = geo.p, src.call0 = geo.call0, src.row0 = geo.row0;
    src.g = g, src.nkv = NKV;
    int s_beg = geo.s_first, s_end = geo.s_last;
    if constexpr (SPLIT) s_beg += blockIdx.z, s_end = s_beg; // past the row's splits: no chunks
    const int c_beg = max(s_beg * geo.cps, geo.c_first);
    const int c_end = min(s_end * geo.cps + geo.cps - 1, geo.c_last);
    // This warp's chunks: c ≡ warp (mod 4) in c_beg .. c_end, increasing; the warp's chunk
    // number i lives in stage st = i mod ns. Every issue commits a group (an empty one past the
    // end), so before chunk i at most ns − 1 newer groups are pending; the early copies are the
    // first groups, in the same order.
    const uint32_t stage0 = (uint32_t)__cvta_generic_to_shared(att_smem) + warp * ns * 2 * CB;
    int c = c_beg + (warp - c_beg % ATT_WARPS + ATT_WARPS) % ATT_WARPS, next = c, st = 0, k0 = 0;
    if constexpr (ATT_TC_EARLY) {
        const int early = a.cache_settled ? geo.pos0 : 0;
        for (; k0 < ns && next <= c_end && next * ATT_CHUNK + ATT_CHUNK - 1 < early;
             k0++, next += ATT_WARPS)
            att_tc_issue<D>(src, next, stage0 + k0 * 2 * CB, lane);
        DS_GRID_DEPENDENCY();
    }
    // q as the A operand (rows 8..15 zero): k-step kk holds dims 16kk + kq + 0, 1 (qa[kk][0]) and
    // + 8 (qa[kk][1]).
    uint32_t qa[KS][2];
    {
        const ds_bf16 *qp = (const ds_bf16 *)a.q + ((size_t)t * NH + h0 + min(hq, nh - 1)) * D + kq;
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const ds_bf16 *e = qp + 16 * kk + 8 * u;
                qa[kk][u] = hq < nh ? (uint32_t)e[0] | (uint32_t)e[1] << 16 : 0u;
            }
    }
    if (fused && blockIdx.z == 0 && sub == 0 && threadIdx.x < D / 4) {
        // The append: this row's k and v of KV head g go to the cache, 16 B per thread. No block
        // of this call reads these entries from the cache (keys >= call0 come from k/v).
        const int pc = threadIdx.x % (D / 8);
        const bool isv = threadIdx.x >= D / 8;
        const size_t from = ((size_t)t * NKV + g) * D + pc * 8;
        const size_t to = src.base + (size_t)geo.p * src.pos_stride + pc * 8;
        *(uint4 *)((ds_bf16 *)(isv ? a.v_cache : a.k_cache) + to) =
                *(const uint4 *)((isv ? src.v : src.k) + from);
    }
    for (int k = k0; k < ns; k++, next += ATT_WARPS) {
        if (next <= c_end) att_tc_issue<D>(src, next, stage0 + k * 2 * CB, lane);
        else att_cp_commit();
    }
    if (SPLIT && s_beg > geo.s_last) return; // the row has fewer splits (block z = 0 never)
    float rm, rl, racc[EPT]; // whole-row mode: the running state of those outputs
    if constexpr (!SPLIT) {
        att_init(a, h0 + min(th, nh - 1), &rm, &rl, &racc[0]);
#pragma unroll
        for (int e = 1; e < EPT; e++) racc[e] = racc[0];
    }

    for (int s = s_beg; s <= s_end; s++) {
        float m = -INFINITY, l = 0.0f, o[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        const int c_hi = min(s * geo.cps + geo.cps - 1, c_end);
        for (; c <= c_hi; c += ATT_WARPS, st = st + 1 == ns ? 0 : st + 1) {
            const uint32_t kb = stage0 + st * 2 * CB, vb = kb + CB;
            att_cp_wait(ns - 1);
            __syncwarp(); // every lane's copies of this chunk have landed
            // Scores: n-tile t4 = keys 8·t4 .. +7; ldmatrix gives the B operand of two k-steps.
            float sc[4][4];
#pragma unroll
            for (int t4 = 0; t4 < 4; t4++) {
                sc[t4][0] = sc[t4][1] = sc[t4][2] = sc[t4][3] = 0.0f;
#pragma unroll
                for (int kp = 0; kp < KS / 2; kp++) {
                    uint32_t kf[4];
                    const int r = 8 * t4 + (lane & 7), pc = 4 * kp + (lane >> 3);
                    att_ldsm4(kb + r * RB + ((pc ^ (lane & 7)) << 4), kf);
                    att_mma(sc[t4], qa[2 * kp][0], qa[2 * kp][1], kf[0], kf[1]);
                    att_mma(sc[t4], qa[2 * kp + 1][0], qa[2 * kp + 1][1], kf[2], kf[3]);
                }
            }
            // Online softmax of head hq over the chunk: this lane holds keys 8·t4 + kq + e.
            float x[4][2], mc = -INFINITY;
            bool ok[4][2];
#pragma unroll
            for (int t4 = 0; t4 < 4; t4++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = c * ATT_CHUNK + 8 * t4 + kq + e;
                    ok[t4][e] = j >= geo.first && j <= geo.p;
                    x[t4][e] = ok[t4][e] ? __fmul_rn(sc[t4][e], a.scale) : -INFINITY;
                    mc = fmaxf(mc, x[t4][e]);
                }
            mc = fmaxf(mc, __shfl_xor_sync(DS_FULL_MASK, mc, 1));
            mc = fmaxf(mc, __shfl_xor_sync(DS_FULL_MASK, mc, 2));
            const float mn = fmaxf(m, mc);
            const float corr = mn == -INFINITY ? 1.0f : __expf(m - mn);
            float p[4][2];
#pragma unroll
            for (int t4 = 0; t4 < 4; t4++)
#pragma unroll
                for (int e = 0; e < 2; e++) p[t4][e] = ok[t4][e] ? __expf(x[t4][e] - mn) : 0.0f;
            float ls = __fadd_rn(
                    __fadd_rn(__fadd_rn(p[0][0], p[0][1]), __fadd_rn(p[1][0], p[1][1])),
                    __fadd_rn(__fadd_rn(p[2][0], p[2][1]), __fadd_rn(p[3][0], p[3][1])));
            ls = __fadd_rn(ls, __shfl_xor_sync(DS_FULL_MASK, ls, 1));
            ls = __fadd_rn(ls, __shfl_xor_sync(DS_FULL_MASK, ls, 2));
            l = __fmaf_rn(l, corr, ls);
            m = mn;
#pragma unroll
            for (int n = 0; n < NT; n++)
                o[n][0] = __fmul_rn(o[n][0], corr), o[n][1] = __fmul_rn(o[n][1], corr);
            // Values: k-step u = keys 16u .. 16u + 15 (n-tiles 2u, 2u + 1 of the scores); the
            // transposing ldmatrix gives the B operand of two 8-dim n-tiles.
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const uint32_t h_a = att_bf16x2(p[2 * u][0], p[2 * u][1]);
                const uint32_t h_b = att_bf16x2(p[2 * u + 1][0], p[2 * u + 1][1]);
                const uint32_t l_a =
                        att_bf16x2(__fsub_rn(p[2 * u][0], __uint_as_float(h_a << 16)),
                                   __fsub_rn(p[2 * u][1], __uint_as_float(h_a & 0xffff0000u)));
                const uint32_t l_b =
                        att_bf16x2(__fsub_rn(p[2 * u + 1][0], __uint_as_float(h_b << 16)),
                                   __fsub_rn(p[2 * u + 1][1], __uint_as_float(h_b & 0xffff0000u)));
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t vf[4];
                    const int r = 16 * u + (lane & 8) + (lane & 7), pc = 2 * np + (lane >> 4);
                    att_ldsm4_t(vb + r * RB + ((pc ^ (lane & 7)) << 4), vf);
                    att_mma(o[2 * np], h_a, h_b, vf[0], vf[1]);
                    att_mma(o[2 * np], l_a, l_b, vf[0], vf[1]);
                    att_mma(o[2 * np + 1], h_a, h_b, vf[2], vf[3]);
                    att_mma(o[2 * np + 1], l_a, l_b, vf[2], vf[3]);
                }
            }
            __syncwarp(); // every lane has read the stage: it may be refilled
            if (next <= c_end) att_tc_issue<D>(src, next, kb, lane);
            else att_cp_commit();
            next += ATT_WARPS;
        }

        // The split state: the warp states merged in warp order (a warp without a chunk in this
        // split has l = 0 and is skipped).
        if (lane % 4 == 0) pm[warp][hq] = m, pl[warp][hq] = l;
#pragma unroll
        for (int n = 0; n < NT; n++)
            *(float2 *)&pacc[(warp * HB + hq) * DP + 8 * n + kq] = make_float2(o[n][0], o[n][1]);
        __syncthreads();
        float ms = -INFINITY, ls = 0.0f, as[EPT];
#pragma unroll
        for (int e = 0; e < EPT; e++) as[e] = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (pl[w][th] > 0.0f) ms = fmaxf(ms, pm[w][th]);
        for (int w = 0; w < ATT_WARPS; w++) {
            if (!(pl[w][th] > 0.0f)) continue;
            const float f = __expf(pm[w][th] - ms);
            ls = __fmaf_rn(pl[w][th], f, ls);
#pragma unroll
            for (int e = 0; e < EPT; e += 4) {
                const float4 v4 = *(const float4 *)&pacc[(w * HB + th) * DP + td + e];
                as[e] = __fmaf_rn(v4.x, f, as[e]);
                as[e + 1] = __fmaf_rn(v4.y, f, as[e + 1]);
                as[e + 2] = __fmaf_rn(v4.z, f, as[e + 2]);
                as[e + 3] = __fmaf_rn(v4.w, f, as[e + 3]);
            }
        }
        if constexpr (SPLIT) {
            if (th < nh) {
                float *rec = ws + ((size_t)t * nspl + blockIdx.z) * NH * (D + 2);
#pragma unroll
                for (int e = 0; e < EPT; e += 4)
                    *(float4 *)&rec[(size_t)(h0 + th) * D + td + e] =
                            make_float4(as[e], as[e + 1], as[e + 2], as[e + 3]);
                if (td == 0) *(float2 *)&rec[(size_t)NH * D + 2 * (h0 + th)] = make_float2(ms, ls);
            }
        } else {
            // att_merge per output element; the factors are those of the head, formed once.
            const float mn = fmaxf(rm, ms);
            const float cr = rm == mn ? 1.0f : expf(rm - mn), cs = ms == mn ? 1.0f : expf(ms - mn);
            rl = __fmaf_rn(ls, cs, __fmul_rn(rl, cr));
#pragma unroll
            for (int e = 0; e < EPT; e++) racc[e] = __fmaf_rn(as[e], cs, __fmul_rn(racc[e], cr));
            rm = mn;
            __syncthreads(); // pm, pl, pacc are rewritten by the next split
        }
    }
    if constexpr (!SPLIT) {
        if (th < nh)
#pragma unroll
            for (int e = 0; e < EPT; e++)
                st_elem(a.out, DS_ELEM_BF16, ((size_t)t * NH + h0 + th) * D + td + e,
                        __fdiv_rn(racc[e], rl));
        return;
    }
    // Arrival: the barrier orders every thread's record stores before thread 0's count, whose
    // release makes them (cumulatively) visible to the block that sees the final count, and whose
    // acquire makes every other block's records visible to this one (then to all its threads
    // through the next barrier).
    const int n = geo.s_last - geo.s_first + 1;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *ctr = &att_arrivals[(size_t)t * gridDim.y + blockIdx.y], before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n"
                     : "=r"(before)
                     : "l"(ctr)
                     : "memory");
        last_block = before == (unsigned)(n - 1);
        if (last_block) *ctr = 0u; // every split has arrived: ready for the next call
    }
    __syncthreads();
    if (!last_block) return;
    // The last block merges the row's records, sink first, in split order, with att_merge's
    // arithmetic: thread (s, h) of the first n·HB folds the running max over the sink and the
    // earlier splits (the fmaxf sequence of att_merge) and forms the factors cr and cs of that
    // merge; then every output element folds l and acc with them in split order.
    const size_t rs = (size_t)NH * (D + 2);
    const float *r0 = ws + (size_t)t * nspl * rs;
    float *fm = pacc, *fl = fm + ATT_SLOTS * HB, *fcr = fl + ATT_SLOTS * HB;
    float *fcs = fcr + ATT_SLOTS * HB; // (split, head) at [s·HB + h]; pacc is free now
    static_assert(4 * ATT_SLOTS * HB <= ATT_WARPS * HB * DP, "merge factors fit in pacc");
    constexpr int NF = (ATT_SLOTS * HB + ATT_THREADS - 1) / ATT_THREADS;
    constexpr int MB = 64 / EPT; // splits per batch of accumulator loads (all, for D = 64)
#pragma unroll
    for (int u = 0; u < NF; u++) {
        const int q = threadIdx.x + u * ATT_THREADS, s = q / HB, h = q % HB;
        if (q < n * HB && h < nh) {
            const float2 ml = __ldcg((const float2 *)(r0 + s * rs + (size_t)NH * D + 2 * (h0 + h)));
            fm[q] = ml.x, fl[q] = ml.y;
        }
    }
    const float *ra = r0 + (size_t)(h0 + min(th, nh - 1)) * D + td;
    float4 av[MB][EPT / 4];
#pragma unroll
    for (int b = 0; b < MB; b++)
#pragma unroll
        for (int e = 0; e < EPT / 4; e++)
            av[b][e] = b < n && th < nh ? __ldcg((const float4 *)(ra + b * rs) + e)
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < NF; u++) {
        const int q = threadIdx.x + u * ATT_THREADS, s = q / HB, h = q % HB;
        if (q < n * HB && h < nh) {
            float mr, l0, a0;
            att_init(a, h0 + h, &mr, &l0, &a0);
            for (int j = 0; j < s; j++) mr = fmaxf(mr, fm[j * HB + h]);
            const float ms = fm[q], mn = fmaxf(mr, ms);
            fcr[q] = mr == mn ? 1.0f : expf(mr - mn);
            fcs[q] = ms == mn ? 1.0f : expf(ms - mn);
        }
    }
    __syncthreads();
    float ml, l, acc[EPT];
    att_init(a, h0 + min(th, nh - 1), &ml, &l, &acc[0]);
#pragma unroll
    for (int e = 1; e < EPT; e++) acc[e] = acc[0];
    for (int s0 = 0; s0 < n; s0 += MB) {
#pragma unroll
        for (int b = 0; b < MB; b++) {
            if (s0 + b >= n) break;
            const int q = (s0 + b) * HB + th;
            const float cr = fcr[q], cs = fcs[q];
            l = __fmaf_rn(fl[q], cs, __fmul_rn(l, cr));
#pragma unroll
            for (int e = 0; e < EPT / 4; e++) {
                acc[4 * e] = __fmaf_rn(av[b][e].x, cs, __fmul_rn(acc[4 * e], cr));
                acc[4 * e + 1] = __fmaf_rn(av[b][e].y, cs, __fmul_rn(acc[4 * e + 1], cr));
                acc[4 * e + 2] = __fmaf_rn(av[b][e].z, cs, __fmul_rn(acc[4 * e + 2], cr));
                acc[4 * e + 3] = __fmaf_rn(av[b][e].w, cs, __fmul_rn(acc[4 * e + 3], cr));
            }
        }
        if (s0 + MB >= n) break;
#pragma unroll
        for (int b = 0; b < MB; b++) // the next batch
#pragma unroll
            for (int e = 0; e < EPT / 4; e++)
                av[b][e] = s0 + MB + b < n && th < nh
                                   ? __ldcg((const float4 *)(ra + (s0 + MB + b) * rs) + e)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (th < nh)
#pragma unroll
        for (int e = 0; e < EPT; e++)
            st_elem(a.out, DS_ELEM_BF16, ((size_t)t * NH + h0 + th) * D + td + e,
                    __fdiv_rn(acc[e], l));
}

typedef void (*att_tc_kernel)(const struct ds_attention_args, float *, int, int, int);

// Dynamic shared memory of the tensor-core kernel: ns stages of a chunk's keys and values per
// warp, then the warp states' accumulators.
static size_t att_tc_smem(int D, int ns) {
    return (size_t)ATT_WARPS * ns * 2 * ATT_CHUNK * D * 2 +
           (size_t)ATT_WARPS * ATT_TC_HEADS * (D + 8) * sizeof(float);
}

// Stages that fit the shared memory of a block (227 KB): 4 for D = 64, 3 for D = 128.
static int att_tc_max_stages(int D) { return D == 64 ? 4 : 3; }

template <int D>
static void att_tc_launch(const struct ds_attention_args *a, float *ws, int nspl, bool fused,
                          int ns, dim3 grid, cudaStream_t st) {
    static int set_split = 0, set_row = 0; // both opted in to the most any call needs
    const int bytes = (int)att_tc_smem(D, att_tc_max_stages(D));
    ds_smem_attr(bf16_sdpa_sink_gqa_tc<D, true>, &set_split, bytes);
    ds_smem_attr(bf16_sdpa_sink_gqa_tc<D, false>, &set_row, bytes);
    const att_tc_kernel k = ws ? bf16_sdpa_sink_gqa_tc<D, true> : bf16_sdpa_sink_gqa_tc<D, false>;
    ds_launch(k, grid, dim3(ATT_THREADS), att_tc_smem(D, ns), st, *a, ws, nspl, fused ? 1 : 0, ns);
}

// Upper bound of the splits any row of a call can span (grid z of split mode).
// Chunks of the longest key range a row of a call can have.
static int att_max_chunks(int max_pos, int window) {
    int n = (max_pos + ATT_CHUNK - 1) / ATT_CHUNK;
    if (window > 0) n = min(n, (window + ATT_CHUNK - 1) / ATT_CHUNK + 1);
    return n;
}

static int att_slots_needed(int max_pos, int window, int cap) {
    const int n = att_max_chunks(max_pos, window);
    if (n > ATT_BASE_CHUNKS * cap) return cap + 1;
    return min(cap + 1, (n + ATT_BASE_CHUNKS - 1) / ATT_BASE_CHUNKS + 1);
}

// Split mode is possible: the row blocks of 8 heads (row_blocks) would not fill the GPU, a row
// can be long enough for the merge to pay off, and the workspace is 16-byte aligned and holds
// *nspl >= slots records for every row. (The caller checks the arrival counters.)
static bool att_split_ok(const struct ds_attention_args *a, int slots, long long row_blocks,
                         int *nspl) {
    if (!a->workspace || slots <= 1 || row_blocks >= ATT_SPLIT_MAX_BLOCKS ||
        att_max_chunks(a->max_pos, a->window) < ATT_SPLIT_MIN_CHUNKS ||
        (uintptr_t)a->workspace % 16)
        return false;
    const size_t rec = (size_t)a->n_heads * (a->head_dim + 2) * sizeof(float);
    const size_t per_row = ds_attention_workspace_bytes(1, a->n_heads, a->head_dim, a->max_pos);
    *nspl = (int)(per_row / rec);
    return *nspl >= slots && a->workspace_bytes / per_row >= (size_t)a->n_rows;
}

// Blocks up to which calls run 1 or 2 query heads per block: ATT_TINY_MAX_BLOCKS, or
// DS_ATT_TINY_BLOCKS from the environment (read once; for measuring the choice: the bits do not
// depend on it).
static int att_tiny_blocks(void) {
    static const int v = [] {
        const char *e = getenv("DS_ATT_TINY_BLOCKS");
        const long x = e && *e ? strtol(e, NULL, 10) : ATT_TINY_MAX_BLOCKS;
        return (int)(x < 0 ? 0 : x > INT_MAX ? INT_MAX : x);
    }();
    return v;
}

typedef void (*att_kernel)(const struct ds_attention_args, float *, int);

// The kernel variant for (hb, fused, split); hb < ATT_HB only with fused.
template <int D>
static void att_launch(const struct ds_attention_args *a, float *ws, int nspl, int hb, bool fused,
                       dim3 grid, cudaStream_t st) {
    att_kernel k;
    if (hb == 1)
        k = ws ? act_sdpa_sink_gqa_d<D, 1, true, true> : act_sdpa_sink_gqa_d<D, 1, true, false>;
    else if (hb == 2)
        k = ws ? act_sdpa_sink_gqa_d<D, 2, true, true> : act_sdpa_sink_gqa_d<D, 2, true, false>;
    else if (hb == ATT_HB_SMALL)
        k = ws ? act_sdpa_sink_gqa_d<D, ATT_HB_SMALL, true, true>
               : act_sdpa_sink_gqa_d<D, ATT_HB_SMALL, true, false>;
    else if (fused)
        k = ws ? act_sdpa_sink_gqa_d<D, ATT_HB, true, true>
               : act_sdpa_sink_gqa_d<D, ATT_HB, true, false>;
    else
        k = ws ? act_sdpa_sink_gqa_d<D, ATT_HB, false, true>
               : act_sdpa_sink_gqa_d<D, ATT_HB, false, false>;
    ds_launch(k, grid, dim3(ATT_THREADS), 0, st, *a, ws, nspl);
}

extern "C" int ds_attention_cuda_head_dim_ok(int D) {
    return D == 16 || D == 32 || D == 64 || D == 128; // the instantiations of att_launch below
}

extern "C" enum ds_status ds_attention_cuda(const struct ds_attention_args *a, void *stream) {
    static const char op[] = "attention (cuda)";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dtype(op, "cache", a->cache_dtype));
    if (a->sinks) CU_TRY(cu_check_dtype(op, "sinks", a->sinks_dtype));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "n_seq", a->n_seq, 0));
    CU_TRY(cu_check_dim(op, "n_heads", a->n_heads, 1));
    CU_TRY(cu_check_dim(op, "n_kv_heads", a->n_kv_heads, 1));
    CU_TRY(cu_check_dim(op, "head_dim", a->head_dim, 1));
    CU_TRY(cu_check_dim(op, "n_slots", a->n_slots, 1));
    CU_TRY(cu_check_dim(op, "max_pos", a->max_pos, 1));
    CU_TRY(cu_check_dim(op, "window", a->window, 0));
    const int D = a->head_dim;
    if (!ds_attention_cuda_head_dim_ok(D))
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: head_dim %d (built for 16, 32, 64, 128)", op,
                            D);
    if (a->n_heads % a->n_kv_heads)
        return ds_error_set(DS_ERR_ARG, "%s: %d query heads not a multiple of %d KV heads", op,
                            a->n_heads, a->n_kv_heads);
    if (!(a->scale > 0.0f) || isinf(a->scale))
        return ds_error_set(DS_ERR_ARG, "%s: scale %g must be positive and finite", op, a->scale);
    if (a->n_rows == 0 || a->n_seq == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "seqs", a->seqs));
    CU_TRY(cu_check_ptr(op, "q", a->q));
    CU_TRY(cu_check_ptr(op, "k", a->k));
    CU_TRY(cu_check_ptr(op, "v", a->v));
    CU_TRY(cu_check_ptr(op, "k_cache", a->k_cache));
    CU_TRY(cu_check_ptr(op, "v_cache", a->v_cache));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    if (((uintptr_t)a->k_cache | (uintptr_t)a->v_cache) % 16)
        return ds_error_set(DS_ERR_ARG, "%s: k_cache and v_cache must be 16-byte aligned", op);
    const int G = a->n_heads / a->n_kv_heads, n_sub8 = (G + ATT_HB - 1) / ATT_HB;
    const int n_sub4 = (G + ATT_HB_SMALL - 1) / ATT_HB_SMALL;
    if ((long long)a->n_kv_heads * n_sub8 > 65535)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d heads over %d KV heads: too many", op,
                            a->n_heads, a->n_kv_heads);
    cudaStream_t st = DS_STREAM(stream);

    // bf16 activations and cache with D = 64 or 128: the tensor-core kernel, 8 query heads per
    // block, the append fused whenever k and v are 16-byte aligned (its key path costs nothing
    // more), split mode on the same conditions as below.
    if (a->act == DS_ELEM_BF16 && a->cache_dtype == DS_ELEM_BF16 && (D == 64 || D == 128)) {
        const long long row_blocks = (long long)a->n_rows * a->n_kv_heads * n_sub8;
        float *ws = NULL;
        int nspl = 0;
        const int slots = att_slots_needed(a->max_pos, a->window, att_cap(a->max_splits));
        if (row_blocks <= ATT_COUNTERS && att_split_ok(a, slots, row_blocks, &nspl))
            ws = (float *)a->workspace;
        const bool fused = ((uintptr_t)a->k | (uintptr_t)a->v) % 16 == 0;
        if (!fused)
            ds_launch(act_kv_cache_append, dim3((unsigned)a->n_rows), dim3(128), 0, st, *a);
        // Stages per warp (the bits do not depend on them): in split mode, every chunk a warp
        // owns in its split at once (up to 4) while the grid is small, at most 2 otherwise (more
        // blocks per SM); whole-row mode 2: the next chunk loads while this one is computed.
        const dim3 grid((unsigned)a->n_rows, (unsigned)(a->n_kv_heads * n_sub8), ws ? slots : 1);
        const int per = ATT_BASE_CHUNKS * att_cap(a->max_splits);
        const int cpw = (att_max_chunks(a->max_pos, a->window) + per - 1) / per; // per warp
        const long long blocks = (long long)grid.x * grid.y * grid.z;
        const int ns_max = min(att_tc_max_stages(D), ATT_TC_STAGES_MAX);
        const int ns = ws ? max(1, min(cpw, blocks <= ATT_TC_SMALL_GRID ? ns_max : 2)) : 2;
        if (D == 64) att_tc_launch<64>(a, ws, nspl, fused, ns, grid, st);
        else att_tc_launch<128>(a, ws, nspl, fused, ns, grid, st);
        return DS_OK;
    }

    // Split mode when the row blocks alone would leave SMs idle, a row can be long enough for the
    // split merge to pay off (a 128-key window spans <= 5 chunks in <= 2 splits: whole-row
    // mode walks them in one pass) and the workspace holds every row's split states; both
    // modes give the same bits, so this choice is free.
    const long long row_blocks = (long long)a->n_rows * a->n_kv_heads * n_sub8;
    const int slots = att_slots_needed(a->max_pos, a->window, att_cap(a->max_splits));
    float *ws = NULL;
    int nspl = 0;
    if ((long long)a->n_rows * a->n_kv_heads * n_sub4 <= ATT_COUNTERS &&
        att_split_ok(a, slots, row_blocks, &nspl))
        ws = (float *)a->workspace;

    // The append runs inside the attention kernel (its blocks read this call's keys from k/v)
    // when k and v allow the 16-byte loads of that path and the call is small; a call of many
    // rows (FMA-bound, occupancy-limited) runs the leaner kernel after a separate append, as
    // does a call with misaligned k or v. Same bits either way.
    const bool fused = ((uintptr_t)a->k | (uintptr_t)a->v) % 16 == 0 &&
                       row_blocks < ATT_SPLIT_MAX_BLOCKS;
    // Fewer query heads per block (more, shorter blocks) while the grid stays small: 1 or 2
    // heads while it stays about one block per SM sub-partition (a 128-key window decode: 64
    // blocks of one head), 4 while it stays about one wave (the 4096-key split decode: 528).
    int hb = ATT_HB;
    if (fused) {
        const long long per_sub = (long long)a->n_rows * a->n_kv_heads * (ws ? slots : 1);
        static const int hbs[3] = {1, 2, ATT_HB_SMALL};
        for (int i = 0; i < 3; i++) {
            const long long n_sub = (G + hbs[i] - 1) / hbs[i];
            const long long cap = hbs[i] < ATT_HB_SMALL ? att_tiny_blocks() : ATT_SMALL_MAX_BLOCKS;
            if ((long long)a->n_kv_heads * n_sub <= 65535 && per_sub * n_sub <= cap &&
                (!ws || (long long)a->n_rows * a->n_kv_heads * n_sub <= ATT_COUNTERS)) {
                hb = hbs[i];
                break;
            }
        }
    }
    if (!fused) {
        ds_launch(act_kv_cache_append, dim3((unsigned)a->n_rows), dim3(128), 0, st, *a);
    }
    const dim3 grid((unsigned)a->n_rows, (unsigned)(a->n_kv_heads * ((G + hb - 1) / hb)),
                    ws ? slots : 1);
    switch (D) {
    case 16: att_launch<16>(a, ws, nspl, hb, fused, grid, st); break;
    case 32: att_launch<32>(a, ws, nspl, hb, fused, grid, st); break;
    case 64: att_launch<64>(a, ws, nspl, hb, fused, grid, st); break;
    default: att_launch<128>(a, ws, nspl, hb, fused, grid, st); break;
    }
    return DS_OK;
}
