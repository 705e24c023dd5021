// ref_common.h: private helpers of the CPU reference ops (kernels/ref/*.c).
//
// acc4 is the one dot-product accumulator of the reference: four double lanes, element k goes to
// lane k % 4, lanes summed as (l0 + l1) + (l2 + l3). Products of two floats are exact in double,
// the lane loop vectorises at -O2, and the order depends only on k, never on the row count or the
// thread split, which is what makes every op batch invariant.
#ifndef DS_REF_COMMON_H
#define DS_REF_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "ds/bf16.h"
#include "ds/kernel_args.h"
#include "ds/status.h"

struct acc4 {
    double l[4];
};

static inline void acc4_zero(struct acc4 *a) {
    a->l[0] = a->l[1] = a->l[2] = a->l[3] = 0.0;
}

static inline double acc4_sum(const struct acc4 *a) {
    return (a->l[0] + a->l[1]) + (a->l[2] + a->l[3]);
}

// Adds Σ x[k]·w[k] for k < n; n must be a multiple of 4 (callers keep any tail for lane 0 via
// acc4_dot_f32, which handles all n).
static inline void acc4_add_f32_x4(struct acc4 *a, const float *x, const float *w, int n) {
    double l0 = a->l[0], l1 = a->l[1], l2 = a->l[2], l3 = a->l[3];
    for (int k = 0; k < n; k += 4) {
        l0 += (double)x[k] * (double)w[k];
        l1 += (double)x[k + 1] * (double)w[k + 1];
        l2 += (double)x[k + 2] * (double)w[k + 2];
        l3 += (double)x[k + 3] * (double)w[k + 3];
    }
    a->l[0] = l0, a->l[1] = l1, a->l[2] = l2, a->l[3] = l3;
}

static inline double dot_f32(const float *x, const float *w, int n) {
    struct acc4 a;
    acc4_zero(&a);
    int n4 = n & ~3;
    acc4_add_f32_x4(&a, x, w, n4);
    for (int k = n4; k < n; k++) a.l[k & 3] += (double)x[k] * (double)w[k];
    return acc4_sum(&a);
}

static inline double dot_f32_bf16(const float *x, const ds_bf16 *w, int n) {
    double l[4] = {0.0, 0.0, 0.0, 0.0};
    int n4 = n & ~3;
    for (int k = 0; k < n4; k += 4) {
        l[0] += (double)x[k] * (double)ds_bf16_to_f32(w[k]);
        l[1] += (double)x[k + 1] * (double)ds_bf16_to_f32(w[k + 1]);
        l[2] += (double)x[k + 2] * (double)ds_bf16_to_f32(w[k + 2]);
        l[3] += (double)x[k + 3] * (double)ds_bf16_to_f32(w[k + 3]);
    }
    for (int k = n4; k < n; k++) l[k & 3] += (double)x[k] * (double)ds_bf16_to_f32(w[k]);
    return (l[0] + l[1]) + (l[2] + l[3]);
}

// Σ x[k]·w[k] with w of either weight dtype.
static inline double dot_w(const float *x, const void *w, enum ds_elem wt, size_t row, int n) {
    if (wt == DS_ELEM_BF16) return dot_f32_bf16(x, (const ds_bf16 *)w + row * (size_t)n, n);
    return dot_f32(x, (const float *)w + row * (size_t)n, n);
}

// Element i of a small tensor (bias, gain, sink) of either dtype; 0 when p is NULL.
static inline double load_elem(const void *p, enum ds_elem e, size_t i) {
    if (!p) return 0.0;
    if (e == DS_ELEM_BF16) return (double)ds_bf16_to_f32(((const ds_bf16 *)p)[i]);
    return (double)((const float *)p)[i];
}

// Argument checks shared by the ops; each returns DS_OK or records "<op>: <problem>".
static inline enum ds_status check_act(const char *op, enum ds_elem act) {
    if (act == DS_ELEM_F32) return DS_OK;
    return ds_error_set(DS_ERR_UNSUPPORTED,
                        "%s: activation dtype %d not implemented by the CPU reference (f32 only)",
                        op, (int)act);
}

static inline enum ds_status check_wdtype(const char *op, const char *what, enum ds_elem e) {
    if (e == DS_ELEM_F32 || e == DS_ELEM_BF16) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: %s dtype %d is neither f32 nor bf16", op, what, (int)e);
}

static inline enum ds_status check_dim(const char *op, const char *what, long long v,
                                       long long min) {
    if (v >= min) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: %s is %lld, must be at least %lld", op, what, v, min);
}

static inline enum ds_status check_ptr(const char *op, const char *what, const void *p) {
    if (p) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: %s buffer is NULL", op, what);
}

// Evaluates a check and returns its status from the calling function when it fails.
#define REF_TRY(expr)                                                                              \
    do {                                                                                           \
        enum ds_status ref_s_ = (expr);                                                            \
        if (ref_s_ != DS_OK) return ref_s_;                                                        \
    } while (0)

// OpenMP threading pays off only above a few tens of thousands of multiply-adds.
#define REF_PAR_MIN_WORK 32768.0

#endif // DS_REF_COMMON_H
