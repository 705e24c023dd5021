// kernels/cuda/attention.cu: attention over the per-slot KV cache on CUDA (ds_attention_args):
// per-head sinks, GQA, optional sliding window, any mix of prefill chunks, one-token decode rows and
// K+1-row verify sequences in one call.
//
// Layouts (ds/kernel_args.h): q (T, NH, D), k/v (T, NKV, D) in `act` (f32 or bf16); caches
// (S, P, NKV, D) in `cache_dtype` (f32 or bf16); sinks (NH) f32 or bf16; out (T, NH, D) act.
// All math in fp32. Kernel names: `act_` = f32 or bf16 activations picked at run time.
//
// Kernels:
//   act_kv_cache_append       one block per row: its new k and v go to (slot, pos) of its sequence,
//                             converted to the cache dtype. Runs first, so a prefill row sees the
//                             rows before it in the same call.
//   act_sdpa_sink_gqa_d<D>    one block per (row, KV head, group of up to 8 query heads), D in
//                             {16, 32, 64, 128}. The block's 8 warps split the row's keys into
//                             32-key chunks aligned to absolute positions (chunk c = keys 32c ..
//                             32c+31); chunk c belongs to warp c mod 8, which folds its chunks in
//                             increasing order into an online softmax (m, l, acc per head; lane j
//                             scores key 32c+j, lanes own D/32 output dims). The 8 warp states are
//                             then merged in warp order, starting from the sink (m = S_h, l = 1).
//
// Batch invariance. A row's chunks, their owner warps and every summation order depend only on the
// row's own key range [max(0, p − W + 1), p] and on compile-time constants, never on T, n_seq or the
// other rows; each block reads only its own row's q, its slot of the cache and its position. So a
// row's output is bitwise the same alone, in a verify batch or inside a prefill chunk.
//
// Decode and verify are memory-bound over the cache: the GQA group's 8 query heads share every key
// and value load. Keys of a chunk outside the row's range are masked (their values are never read,
// so stale NaN/Inf entries of the cache are harmless). No workspace: the split of a row's keys
// stays inside one block (8 warps, i.e. 8-way parallel over the keys).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "ds/kernels_cuda.h"

#define ATT_WARPS 8
#define ATT_THREADS (ATT_WARPS * DS_WARP)
#define ATT_CHUNK 32 // keys per chunk = lanes of a warp
#define ATT_HB 8     // query heads per block (one GQA group of gpt-oss)

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

// The sequence owning packed row t (sequences sorted by row0), or -1 for a padding row.
static __device__ int seq_of_row(const struct ds_attn_seq *seqs, int n_seq, int t) {
    int lo = 0, hi = n_seq - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (seqs[mid].row0 <= t) lo = mid;
        else hi = mid - 1;
    }
    const struct ds_attn_seq s = seqs[lo];
    return t >= s.row0 && t < s.row0 + s.n_rows ? lo : -1;
}

// Row t's sequence and absolute position, or false when the row is padding or its slot/position
// lies outside the cache (the device table is trusted, but never followed out of bounds).
static __device__ bool row_place(const struct ds_attention_args &a, int t, int *slot, int *pos) {
    const int si = seq_of_row(a.seqs, a.n_seq, t);
    if (si < 0) return false;
    const struct ds_attn_seq s = a.seqs[si];
    *slot = s.slot, *pos = s.pos0 + (t - s.row0);
    return s.slot >= 0 && s.slot < a.n_slots && *pos >= 0 && *pos < a.max_pos;
}

__global__ void act_kv_cache_append(const struct ds_attention_args a) {
    const int t = blockIdx.x;
    int slot, pos;
    if (!row_place(a, t, &slot, &pos)) return;
    const size_t n = (size_t)a.n_kv_heads * a.head_dim;
    const size_t dst = ((size_t)slot * a.max_pos + pos) * n, src = (size_t)t * n;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        st_elem(a.k_cache, a.cache_dtype, dst + i, ld_elem(a.k, a.act, src + i));
        st_elem(a.v_cache, a.cache_dtype, dst + i, ld_elem(a.v, a.act, src + i));
    }
}

template <int D>
__global__ void __launch_bounds__(ATT_THREADS) act_sdpa_sink_gqa_d(const struct ds_attention_args a) {
    constexpr int DPL = D >= DS_WARP ? D / DS_WARP : 1; // output dims per lane
    constexpr int KP = D < DS_WARP ? D : DS_WARP;        // key elements loaded at once
    __shared__ __align__(16) float qs[ATT_HB][D];
    __shared__ __align__(16) float ps[ATT_WARPS][ATT_HB][ATT_CHUNK];
    __shared__ float pm[ATT_WARPS][ATT_HB], pl[ATT_WARPS][ATT_HB];
    __shared__ __align__(16) float pacc[ATT_WARPS][ATT_HB][D];

    const int t = blockIdx.x, lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int NH = a.n_heads, NKV = a.n_kv_heads, G = NH / NKV;
    const int n_sub = (G + ATT_HB - 1) / ATT_HB;
    const int g = blockIdx.y / n_sub, sub = blockIdx.y % n_sub;
    const int h0 = g * G + sub * ATT_HB, nh = min(ATT_HB, G - sub * ATT_HB);
    int slot, p;
    if (!row_place(a, t, &slot, &p)) return; // the whole block leaves: padding row
    const int first = a.window > 0 ? max(0, p - a.window + 1) : 0;

    for (int i = threadIdx.x; i < ATT_HB * D; i += ATT_THREADS) {
        const int h = i / D, d = i % D;
        qs[h][d] = h < nh ? ld_elem(a.q, a.act, ((size_t)t * NH + h0 + h) * D + d) : 0.0f;
    }
    __syncthreads();

    const size_t pos_stride = (size_t)NKV * D;
    const size_t base = (size_t)slot * a.max_pos * pos_stride + (size_t)g * D;
    float m[ATT_HB], l[ATT_HB], acc[ATT_HB][DPL];
#pragma unroll
    for (int h = 0; h < ATT_HB; h++) {
        m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[h][i] = 0.0f;
    }
    const bool owns_dims = lane * DPL < D;
    const int c_first = first / ATT_CHUNK, c_last = p / ATT_CHUNK;
    int c = c_first + (warp - c_first % ATT_WARPS + ATT_WARPS) % ATT_WARPS; // first c ≡ warp
    for (; c <= c_last; c += ATT_WARPS) {
        const int j = c * ATT_CHUNK + lane;
        const bool valid = j >= first && j <= p;
        // Scores of key j for the 8 heads: Σ_d q[h][d]·k[d] in increasing d.
        float s[ATT_HB];
#pragma unroll
        for (int h = 0; h < ATT_HB; h++) s[h] = 0.0f;
        if (valid) {
#pragma unroll
            for (int d0 = 0; d0 < D; d0 += KP) {
                float kr[KP];
                ldn<KP>(a.k_cache, a.cache_dtype, base + (size_t)j * pos_stride + d0, kr);
#pragma unroll
                for (int h = 0; h < ATT_HB; h++)
#pragma unroll
                    for (int d = 0; d < KP; d += 4) {
                        const float4 qv = *(const float4 *)&qs[h][d0 + d];
                        s[h] = __fmaf_rn(qv.x, kr[d], s[h]);
                        s[h] = __fmaf_rn(qv.y, kr[d + 1], s[h]);
                        s[h] = __fmaf_rn(qv.z, kr[d + 2], s[h]);
                        s[h] = __fmaf_rn(qv.w, kr[d + 3], s[h]);
                    }
            }
        }
        // Online softmax per head over this chunk.
#pragma unroll
        for (int h = 0; h < ATT_HB; h++) {
            const float sc = valid ? __fmul_rn(s[h], a.scale) : -INFINITY;
            const float mn = fmaxf(m[h], warp_max_f(sc));
            const float corr = mn == -INFINITY ? 1.0f : expf(m[h] - mn);
            const float pv = valid ? expf(sc - mn) : 0.0f;
            l[h] = __fmaf_rn(l[h], corr, warp_sum_f(pv));
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[h][i] = __fmul_rn(acc[h][i], corr);
            m[h] = mn;
            ps[warp][h][lane] = pv;
        }
        __syncwarp();
        // acc[h][d] += Σ_j p_j[h]·v_j[d] in increasing j; invalid keys are skipped, not read.
#pragma unroll 4
        for (int jj = 0; jj < ATT_CHUNK; jj++) {
            const int jk = c * ATT_CHUNK + jj;
            if (jk < first || jk > p) continue; // uniform over the warp
            float vv[DPL];
            if (owns_dims) {
                ldn<DPL>(a.v_cache, a.cache_dtype, base + (size_t)jk * pos_stride + lane * DPL,
                         vv);
            } else {
#pragma unroll
                for (int i = 0; i < DPL; i++) vv[i] = 0.0f;
            }
#pragma unroll
            for (int h = 0; h < ATT_HB; h++) {
                const float pj = ps[warp][h][jj];
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[h][i] = __fmaf_rn(pj, vv[i], acc[h][i]);
            }
        }
        __syncwarp();
    }

    // Merge the warp states in warp order, the sink first.
#pragma unroll
    for (int h = 0; h < ATT_HB; h++) {
        if (lane == 0) pm[warp][h] = m[h], pl[warp][h] = l[h];
        if (owns_dims)
#pragma unroll
            for (int i = 0; i < DPL; i++) pacc[warp][h][lane * DPL + i] = acc[h][i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * D; i += ATT_THREADS) {
        const int h = i / D, d = i % D;
        const float sink = a.sinks ? ld_elem(a.sinks, a.sinks_dtype, (size_t)(h0 + h)) : -INFINITY;
        float M = sink;
        for (int w = 0; w < ATT_WARPS; w++)
            if (pl[w][h] > 0.0f) M = fmaxf(M, pm[w][h]);
        float L = a.sinks ? expf(sink - M) : 0.0f, A = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            if (!(pl[w][h] > 0.0f)) continue; // a warp that owned no chunk
            const float f = expf(pm[w][h] - M);
            L = __fmaf_rn(pl[w][h], f, L);
            A = __fmaf_rn(pacc[w][h][d], f, A);
        }
        st_elem(a.out, a.act, ((size_t)t * NH + h0 + h) * D + d, A / L);
    }
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
    if (D != 16 && D != 32 && D != 64 && D != 128)
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
    const int G = a->n_heads / a->n_kv_heads, n_sub = (G + ATT_HB - 1) / ATT_HB;
    if ((long long)a->n_kv_heads * n_sub > 65535)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d heads over %d KV heads: too many", op,
                            a->n_heads, a->n_kv_heads);
    cudaStream_t st = DS_STREAM(stream);

    act_kv_cache_append<<<(unsigned)a->n_rows, 128, 0, st>>>(*a);
    DS_KERNEL_CHECK();
    const dim3 grid((unsigned)a->n_rows, (unsigned)(a->n_kv_heads * n_sub));
    switch (D) {
    case 16: act_sdpa_sink_gqa_d<16><<<grid, ATT_THREADS, 0, st>>>(*a); break;
    case 32: act_sdpa_sink_gqa_d<32><<<grid, ATT_THREADS, 0, st>>>(*a); break;
    case 64: act_sdpa_sink_gqa_d<64><<<grid, ATT_THREADS, 0, st>>>(*a); break;
    default: act_sdpa_sink_gqa_d<128><<<grid, ATT_THREADS, 0, st>>>(*a); break;
    }
    DS_KERNEL_CHECK();
    return DS_OK;
}
