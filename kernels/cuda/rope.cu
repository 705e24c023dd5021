// kernels/cuda/rope.cu: rotary position embedding on CUDA, NeoX half split, in place on q and k.
//
// Layout: q (T, NH, D), k (T, NKV, D) in act; cos/sin tables (table_len, D/2) f32, built once by
// ds_rope_table_fill (the YaRN concentration is already inside). Math: ds/kernel_args.h.
//
// Kernels: <act>_rope — one block per row; its threads walk the (head, pair) grid of q then k.
// Each pair is computed in double exactly like the CPU reference (the two products of floats are
// exact in double, one rounding to double, one to the output dtype), so with f32 activations the
// result equals the reference bit for bit. Rows are independent: batch invariant trivially.
//
// A device-side position outside [0, table_len) turns that row's q and k into NaN (never a fault).
#include "common.cuh"
#include "ds/kernels_cuda.h"

template <typename TA>
static __device__ __forceinline__ void rope_heads(TA *x, int n_heads, int D, const float *c,
                                                  const float *s, bool ok, int j0, int stride) {
    const int H = D / 2;
    for (int j = j0; j < n_heads * H; j += stride) {
        const int h = j / H, i = j % H;
        TA *v = x + (size_t)h * D;
        if (!ok) {
            st_f(v, i, NAN);
            st_f(v, i + H, NAN);
            continue;
        }
        const double x0 = ld_f(v, i), x1 = ld_f(v, i + H);
        const double ci = c[i], si = s[i];
        st_f(v, i, (float)(x0 * ci - x1 * si));
        st_f(v, i + H, (float)(x1 * ci + x0 * si));
    }
}

template <typename TA>
static __device__ __forceinline__ void rope_body(const struct ds_rope_args &a) {
    const int t = blockIdx.x;
    const int32_t p = a.positions[t];
    const bool ok = p >= 0 && p < a.table_len;
    const int H = a.head_dim / 2;
    const float *c = a.cos + (size_t)(ok ? p : 0) * H;
    const float *s = a.sin + (size_t)(ok ? p : 0) * H;
    rope_heads((TA *)a.q + (size_t)t * a.n_q_heads * a.head_dim, a.n_q_heads, a.head_dim, c, s,
               ok, threadIdx.x, blockDim.x);
    if (a.k)
        rope_heads((TA *)a.k + (size_t)t * a.n_k_heads * a.head_dim, a.n_k_heads, a.head_dim, c,
                   s, ok, threadIdx.x, blockDim.x);
}

__global__ void f32_rope(const struct ds_rope_args a) { rope_body<float>(a); }
__global__ void bf16_rope(const struct ds_rope_args a) { rope_body<ds_bf16>(a); }

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
    if (a->act == DS_ELEM_BF16) bf16_rope<<<a->n_rows, 256, 0, DS_STREAM(stream)>>>(*a);
    else f32_rope<<<a->n_rows, 256, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}
