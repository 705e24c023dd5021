// kernels/cuda/rope.cu: rotary position embedding on CUDA, NeoX half split, in place on q and k.
//
// Layout: q (T, NH, D), k (T, NKV, D) in act; cos/sin tables (table_len, D/2) f32, built once by
// ds_rope_table_fill (the YaRN concentration is already inside). Math: ds/kernel_args.h.
//
// Kernels: <act>_rope_v4 and <act>_rope — one thread per group of VP consecutive pairs (i .. i+VP−1, i+H ..
// i+H+VP−1) of one head, q heads then k heads; grid (groups of a row / 128, rows). VP = 4 (16- or
// 8-byte loads of x, 16-byte loads of cos and sin) when H % 4 == 0 and every base is 16-byte
// aligned (_v4), else VP = 1. The first version ran one block per row whose threads walked ~9 pairs
// each in turn, every step waiting on its loads (8 µs for one 120b decode row); now every thread
// issues all its loads at once and a decode row spreads over several blocks.
//
// Each pair is computed in double exactly like the CPU reference (the two products of floats are
// exact in double, one rounding to double, one to the output dtype), so with f32 activations the
// result equals the reference bit for bit, whatever VP. Rows are independent: batch invariant.
//
// A device-side position outside [0, table_len) turns that row's q and k into NaN (never a fault).
// Launched with ds_launch (programmatic dependent launch): every kernel begins with
// DS_GRID_DEPENDENCY(), so its launch overlaps the previous kernel of the stream.
#include <stdint.h>

#include "common.cuh"
#include "ds/kernels_cuda.h"

#define ROPE_THREADS 128
#define ROPE_MAX_GRID_Y 65535

// VP consecutive elements of x at i (aligned to VP elements when VP = 4).
template <int VP>
static __device__ __forceinline__ void rope_ld(const float *x, float *o) {
    if constexpr (VP == 4) {
        const float4 v = *(const float4 *)x;
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    } else {
        o[0] = x[0];
    }
}
template <int VP>
static __device__ __forceinline__ void rope_ld(const ds_bf16 *x, float *o) {
    if constexpr (VP == 4) {
        const uint2 u = *(const uint2 *)x;
        o[0] = __uint_as_float(u.x << 16), o[1] = __uint_as_float(u.x & 0xffff0000u);
        o[2] = __uint_as_float(u.y << 16), o[3] = __uint_as_float(u.y & 0xffff0000u);
    } else {
        o[0] = ds_bf16_to_f32(x[0]);
    }
}
template <int VP>
static __device__ __forceinline__ void rope_st(float *x, const float *v) {
    if constexpr (VP == 4) *(float4 *)x = make_float4(v[0], v[1], v[2], v[3]);
    else x[0] = v[0];
}
template <int VP>
static __device__ __forceinline__ void rope_st(ds_bf16 *x, const float *v) {
    if constexpr (VP == 4) {
        uint2 u;
        u.x = (uint32_t)ds_f32_to_bf16(v[0]) | (uint32_t)ds_f32_to_bf16(v[1]) << 16;
        u.y = (uint32_t)ds_f32_to_bf16(v[2]) | (uint32_t)ds_f32_to_bf16(v[3]) << 16;
        *(uint2 *)x = u;
    } else {
        x[0] = ds_f32_to_bf16(v[0]);
    }
}
template <int VP>
static __device__ __forceinline__ void rope_ld_table(const float *p, float *o) {
    if constexpr (VP == 4) {
        const float4 v = __ldg((const float4 *)p);
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    } else {
        o[0] = __ldg(p);
    }
}

template <typename TA, int VP>
static __device__ __forceinline__ void rope_body(const struct ds_rope_args &a) {
    DS_GRID_DEPENDENCY(); // launched with ds_launch: nothing global is touched before this
    const int D = a.head_dim, H = D / 2, gph = H / VP; // groups per head
    const int nq = a.n_q_heads * gph, nk = a.k ? a.n_k_heads * gph : 0;
    const int u = blockIdx.x * ROPE_THREADS + threadIdx.x;
    if (u >= nq + nk) return;
    const bool is_q = u < nq;
    const int uh = is_q ? u : u - nq, h = uh / gph, i = (uh % gph) * VP;
    const int heads = is_q ? a.n_q_heads : a.n_k_heads;
    TA *base = (TA *)(is_q ? a.q : a.k);
    for (int t = blockIdx.y; t < a.n_rows; t += gridDim.y) {
        TA *v = base + ((size_t)t * heads + h) * D + i;
        const int32_t p = a.positions[t];
        float r0[VP], r1[VP];
        if (p < 0 || p >= a.table_len) {
#pragma unroll
            for (int e = 0; e < VP; e++) r0[e] = r1[e] = NAN;
        } else {
            float x0[VP], x1[VP], c[VP], s[VP];
            rope_ld<VP>(v, x0);
            rope_ld<VP>(v + H, x1);
            rope_ld_table<VP>(a.cos + (size_t)p * H + i, c);
            rope_ld_table<VP>(a.sin + (size_t)p * H + i, s);
#pragma unroll
            for (int e = 0; e < VP; e++) ds_rope_pair(x0[e], x1[e], c[e], s[e], &r0[e], &r1[e]);
        }
        rope_st<VP>(v, r0);
        rope_st<VP>(v + H, r1);
    }
}

__global__ void __launch_bounds__(ROPE_THREADS) f32_rope(const struct ds_rope_args a) {
    rope_body<float, 1>(a);
}
__global__ void __launch_bounds__(ROPE_THREADS) bf16_rope(const struct ds_rope_args a) {
    rope_body<ds_bf16, 1>(a);
}
__global__ void __launch_bounds__(ROPE_THREADS) f32_rope_v4(const struct ds_rope_args a) {
    rope_body<float, 4>(a);
}
__global__ void __launch_bounds__(ROPE_THREADS) bf16_rope_v4(const struct ds_rope_args a) {
    rope_body<ds_bf16, 4>(a);
}

// Grid: groups of a row over x, rows over y (rows past 65,535 loop).
static dim3 rope_grid(const struct ds_rope_args *a, int VP) {
    const int gph = a->head_dim / 2 / VP;
    const long long units = (long long)(a->n_q_heads + (a->k ? a->n_k_heads : 0)) * gph;
    return dim3(cu_blocks((size_t)units, ROPE_THREADS),
                (unsigned)(a->n_rows < ROPE_MAX_GRID_Y ? a->n_rows : ROPE_MAX_GRID_Y));
}

extern "C" enum ds_status ds_rope_cuda(const struct ds_rope_args *a, void *stream) {
    static const char op[] = "rope";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    if (a->head_dim < 2 || a->head_dim % 2)
        return ds_error_set(DS_ERR_ARG, "%s: head_dim %d must be even and >= 2", op, a->head_dim);
    CU_TRY(cu_check_dim(op, "n_q_heads", a->n_q_heads, 1));
    if (a->k) CU_TRY(cu_check_dim(op, "n_k_heads", a->n_k_heads, 1));
    CU_TRY(cu_check_dim(op, "table_len", a->table_len, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "q", a->q));
    CU_TRY(cu_check_ptr(op, "positions", a->positions));
    CU_TRY(cu_check_ptr(op, "cos table", a->cos));
    CU_TRY(cu_check_ptr(op, "sin table", a->sin));
    // Vector groups need H % 4 == 0 and aligned bases (then every row and head offset is aligned
    // too: D is a multiple of 8 elements).
    const uintptr_t bases = (uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->cos |
                            (uintptr_t)a->sin;
    const bool vec = (a->head_dim / 2) % 4 == 0 && bases % 16 == 0;
    cudaStream_t st = DS_STREAM(stream);
    const dim3 grid = rope_grid(a, vec ? 4 : 1);
    if (a->act == DS_ELEM_BF16) {
        ds_launch(vec ? bf16_rope_v4 : bf16_rope, grid, dim3(ROPE_THREADS), 0, st, *a);
    } else {
        ds_launch(vec ? f32_rope_v4 : f32_rope, grid, dim3(ROPE_THREADS), 0, st, *a);
    }
    return DS_OK;
}
