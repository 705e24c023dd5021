// ref_common.h: private helpers of the CPU reference ops (kernels/ref/*.c).
//
// acc8 is the one dot-product accumulator of the reference: eight double lanes, element k goes
// to lane k % 8, lanes summed as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). Products of two
// floats are exact in double, the fixed-width lane loops vectorise at -O2, and the order depends
// only on k, never on the row count or the thread split, which is what makes every op batch
// invariant.
#ifndef DS_REF_COMMON_H
#define DS_REF_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ds/bf16.h"
#include "ds/kernel_args.h"
#include "ds/status.h"

#define ACC_LANES 8

struct acc8 {
    double l[ACC_LANES];
};

static inline void acc8_zero(struct acc8 *a) {
    for (int j = 0; j < ACC_LANES; j++) a->l[j] = 0.0;
}

static inline double acc8_sum(const struct acc8 *a) {
    const double *l = a->l;
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Adds Σ x[k]·w[k] for k < n; n must be a multiple of 8 (so lanes stay aligned with k % 8).
static inline void acc8_add_f32(struct acc8 *a, const float *x, const float *w, int n) {
    double l[ACC_LANES];
    memcpy(l, a->l, sizeof l);
    for (int k = 0; k < n; k += ACC_LANES)
        for (int j = 0; j < ACC_LANES; j++) l[j] += (double)x[k + j] * (double)w[k + j];
    memcpy(a->l, l, sizeof l);
}

// The same with bf16 weights, widened 8 at a time by shifting (the form GCC vectorises).
static inline void acc8_add_bf16(struct acc8 *a, const float *x, const ds_bf16 *w, int n) {
    double l[ACC_LANES];
    memcpy(l, a->l, sizeof l);
    for (int k = 0; k < n; k += ACC_LANES) {
        uint32_t u[ACC_LANES];
        float f[ACC_LANES];
        for (int j = 0; j < ACC_LANES; j++) u[j] = (uint32_t)w[k + j] << 16;
        memcpy(f, u, sizeof f);
        for (int j = 0; j < ACC_LANES; j++) l[j] += (double)x[k + j] * (double)f[j];
    }
    memcpy(a->l, l, sizeof l);
}

static inline double dot_f32(const float *x, const float *w, int n) {
    struct acc8 a;
    acc8_zero(&a);
    int n8 = n & ~(ACC_LANES - 1);
    acc8_add_f32(&a, x, w, n8);
    for (int k = n8; k < n; k++) a.l[k % ACC_LANES] += (double)x[k] * (double)w[k];
    return acc8_sum(&a);
}

static inline double dot_f32_bf16(const float *x, const ds_bf16 *w, int n) {
    struct acc8 a;
    acc8_zero(&a);
    int n8 = n & ~(ACC_LANES - 1);
    acc8_add_bf16(&a, x, w, n8);
    for (int k = n8; k < n; k++) a.l[k % ACC_LANES] += (double)x[k] * (double)ds_bf16_to_f32(w[k]);
    return acc8_sum(&a);
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

// The RMSNorm scale of a row, s = 1/sqrt(mean(x²) + eps), in double: ds_rmsnorm_ref and the
// deferred norm (ds/kernel_args.h, Deferred RMSNorm) share it, so both see the same s.
static inline double rms_scale(const float *x, int n, double eps) {
    return 1.0 / sqrt(dot_f32(x, x, n) / n + eps);
}

// A producer's deferred-norm output of one row: y[c] = gain[c]·out[c] with out as stored. The
// product of two floats is exact in double, so this is one rounding, as a float multiply gives.
static inline void norm_gain_row(const void *gain, enum ds_elem gdt, const float *out, float *y,
                                 int n) {
    for (int c = 0; c < n; c++) y[c] = (float)(load_elem(gain, gdt, (size_t)c) * (double)out[c]);
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

// The deferred-norm output fields (norm_gain, norm_out): nothing to check without a gain; with
// one, its dtype and a norm_out buffer that is none of the op's other buffers.
static inline enum ds_status check_norm_out(const char *op, const void *gain, enum ds_elem gdt,
                                            const void *norm_out, const void *out, const void *x) {
    if (!gain) return DS_OK;
    enum ds_status s = check_wdtype(op, "norm gain", gdt);
    if (s == DS_OK) s = check_ptr(op, "norm_out", norm_out);
    if (s == DS_OK && (norm_out == out || norm_out == x))
        s = ds_error_set(DS_ERR_ARG, "%s: norm_out must not alias %s", op,
                         norm_out == out ? "out" : "x");
    return s;
}

// The deferred norm's eps (rms_of): the same rule as ds_rmsnorm_ref's.
static inline enum ds_status check_rms_eps(const char *op, float eps) {
    if (eps >= 0.0f) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: rms_eps %g is negative", op, eps);
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
