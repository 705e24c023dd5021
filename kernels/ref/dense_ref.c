// CPU reference of the dense ops: embedding lookup, RMSNorm, matmul (bf16/f32 weights, bias,
// fused residual, deferred RMSNorm), elementwise add, SiLU-gated product, row gather.
//
// Layouts and math: ds/kernel_args.h. fp32 activations; every reduction runs in double through
// acc8 (ref_common.h) in an order fixed by the element index. OpenMP splits rows or output
// features, never one reduction. Kernel names follow <act>_<weight>w_<op>_ref.
#include <math.h>
#include <string.h>

#include "ds/kernels.h"
#include "ref_common.h"

enum ds_status ds_embed_ref(const struct ds_embed_args *a) {
    static const char op[] = "embed";
    REF_TRY(check_act(op, a->act));
    REF_TRY(check_wdtype(op, "table", a->table_dtype));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    REF_TRY(check_dim(op, "vocab", a->vocab, 1));
    REF_TRY(check_dim(op, "dim", a->dim, 1));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "table", a->table));
    REF_TRY(check_ptr(op, "ids", a->ids));
    REF_TRY(check_ptr(op, "out", a->out));
    REF_TRY(check_norm_out(op, a->norm_gain, a->norm_gain_dtype, a->norm_out, a->out, a->table));
    for (int t = 0; t < a->n_rows; t++)
        if (a->ids[t] < 0 || a->ids[t] >= a->vocab)
            return ds_error_set(DS_ERR_RANGE, "%s: row %d has token id %d outside [0, %d)", op, t,
                                (int)a->ids[t], a->vocab);
    const size_t C = (size_t)a->dim;
    float *out = (float *)a->out;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * (double)C > REF_PAR_MIN_WORK)
    for (int t = 0; t < a->n_rows; t++) {
        size_t row = (size_t)a->ids[t];
        if (a->table_dtype == DS_ELEM_BF16) {
            const ds_bf16 *src = (const ds_bf16 *)a->table + row * C;
            for (size_t c = 0; c < C; c++) out[t * C + c] = ds_bf16_to_f32(src[c]);
        } else {
            memcpy(out + t * C, (const float *)a->table + row * C, C * sizeof(float));
        }
        if (a->norm_gain)
            norm_gain_row(a->norm_gain, a->norm_gain_dtype, out + t * C,
                          (float *)a->norm_out + t * C, (int)C);
    }
    return DS_OK;
}

enum ds_status ds_rmsnorm_ref(const struct ds_rmsnorm_args *a) {
    static const char op[] = "rmsnorm";
    REF_TRY(check_act(op, a->act));
    REF_TRY(check_wdtype(op, "gain", a->w_dtype));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    REF_TRY(check_dim(op, "dim", a->dim, 1));
    if (!(a->eps >= 0.0f)) return ds_error_set(DS_ERR_ARG, "%s: eps %g is negative", op, a->eps);
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "x", a->x));
    REF_TRY(check_ptr(op, "gain", a->w));
    REF_TRY(check_ptr(op, "out", a->out));
    const int C = a->dim;
    const float *x = (const float *)a->x;
    float *out = (float *)a->out;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * C > REF_PAR_MIN_WORK)
    for (int t = 0; t < a->n_rows; t++) {
        const float *xr = x + (size_t)t * C;
        float *yr = out + (size_t)t * C;
        double inv = rms_scale(xr, C, (double)a->eps);
        // Reads x[c] before writing y[c], so out == x works.
        for (int c = 0; c < C; c++) yr[c] = (float)(load_elem(a->w, a->w_dtype, c) * (xr[c] * inv));
    }
    return DS_OK;
}

// One (row, feature) value of the matmul with its bias and residual, rounded once. bias: the
// feature's bias (NULL: none); scale: the row's deferred-norm s, applied to the product only
// (before the bias, as ds/kernel_args.h orders it), NULL without rms_of.
static inline float matmul_elem(const struct ds_matmul_args *a, const float *xr, int t, int n,
                                const void *bias, size_t bias_i, const double *scale) {
    double acc = dot_w(xr, a->w, a->w_dtype, (size_t)n, a->in_dim);
    if (scale) acc *= scale[t];
    acc += load_elem(bias, a->bias_dtype, bias_i);
    if (a->residual) acc += ((const float *)a->residual)[(size_t)t * a->out_dim + n];
    return (float)acc;
}

// The split of the N features into destinations (ds_matmul_args): part j starts at feature
// first[j], has width dim[j], row stride dim[j] and its own bias. Without a split, one part.
struct mm_parts {
    float *out[3];
    const void *bias[3];
    int first[3], dim[3], n;
};

static void mm_parts_of(const struct ds_matmul_args *a, struct mm_parts *p) {
    if (a->part_dim[0] <= 0) {
        *p = (struct mm_parts){
            .out = {(float *)a->out}, .bias = {a->bias}, .dim = {a->out_dim}, .n = 1};
        return;
    }
    float *outs[3] = {(float *)a->out, (float *)a->out1, (float *)a->out2};
    const void *biases[3] = {a->bias, a->bias1, a->bias2};
    p->n = 0;
    for (int j = 0, first = 0; j < 3; first += a->part_dim[j], j++) {
        if (a->part_dim[j] == 0) continue;
        p->out[p->n] = outs[j], p->bias[p->n] = biases[j];
        p->first[p->n] = first, p->dim[p->n] = a->part_dim[j];
        p->n++;
    }
}

// The split's fields must describe parts that cover N exactly, each with a buffer that is not x
// (shared by the CUDA launcher: ds/kernel_args.h).
enum ds_status ds_matmul_check_split(const char *op, const struct ds_matmul_args *a) {
    const int *d = a->part_dim;
    if (d[0] == 0 && d[1] == 0 && d[2] == 0) return DS_OK;
    if (d[0] <= 0 || d[1] < 0 || d[2] < 0)
        return ds_error_set(DS_ERR_ARG, "%s: split widths %d, %d, %d (the first must be > 0, "
                            "none negative)", op, d[0], d[1], d[2]);
    if ((long long)d[0] + d[1] + d[2] != a->out_dim)
        return ds_error_set(DS_ERR_ARG, "%s: split widths %d + %d + %d do not sum to out_dim %d",
                            op, d[0], d[1], d[2], a->out_dim);
    if (a->residual) return ds_error_set(DS_ERR_ARG, "%s: a split output takes no residual", op);
    const void *outs[3] = {a->out, a->out1, a->out2};
    static const char *names[3] = {"out", "out1", "out2"};
    for (int j = 0; j < 3; j++) {
        if (!d[j]) continue;
        REF_TRY(check_ptr(op, names[j], outs[j]));
        if (outs[j] == a->x)
            return ds_error_set(DS_ERR_ARG, "%s: %s must not alias x", op, names[j]);
    }
    return DS_OK;
}

enum ds_status ds_matmul_check_rope(const char *op, const struct ds_matmul_args *a) {
    if (!a->rope_cos) return DS_OK;
    const int D = a->rope_head_dim, *d = a->part_dim;
    if (d[0] <= 0 || d[1] <= 0)
        return ds_error_set(DS_ERR_ARG, "%s: RoPE needs a split with q and k parts (widths %d, %d)",
                            op, d[0], d[1]);
    if (D < 2 || D % 2 || d[0] % D || d[1] % D)
        return ds_error_set(DS_ERR_ARG, "%s: RoPE head_dim %d must be even and divide the q and k "
                            "widths %d and %d", op, D, d[0], d[1]);
    REF_TRY(check_ptr(op, "rope sin table", a->rope_sin));
    REF_TRY(check_ptr(op, "rope positions", a->rope_positions));
    return check_dim(op, "rope table_len", a->rope_table_len, 1);
}

struct ds_rope_args ds_matmul_rope_args(const struct ds_matmul_args *a) {
    const int D = a->rope_head_dim;
    return (struct ds_rope_args){.act = a->act,
                                 .n_rows = a->n_rows,
                                 .head_dim = D,
                                 .n_q_heads = a->part_dim[0] / D,
                                 .n_k_heads = a->part_dim[1] / D,
                                 .q = a->out,
                                 .k = a->out1,
                                 .positions = a->rope_positions,
                                 .cos = a->rope_cos,
                                 .sin = a->rope_sin,
                                 .table_len = a->rope_table_len};
}

// f32 activations × {bf16, f32} weights. Parallel over output features: each weight row is read
// once and used for every row of the call. scale: the rows' deferred-norm s, or NULL.
static void f32_anyw_matmul_ref(const struct ds_matmul_args *a, const double *scale) {
    const float *x = (const float *)a->x;
    const int T = a->n_rows, K = a->in_dim;
    struct mm_parts p;
    mm_parts_of(a, &p);
    for (int j = 0; j < p.n; j++) {
        const int first = p.first[j], D = p.dim[j];
        float *out = p.out[j];
        const void *bias = p.bias[j];
#pragma omp parallel for schedule(static) if ((double)T * D * K > REF_PAR_MIN_WORK)
        for (int n = 0; n < D; n++)
            for (int t = 0; t < T; t++)
                out[(size_t)t * D + n] =
                    matmul_elem(a, x + (size_t)t * K, t, first + n, bias, (size_t)n, scale);
    }
}

enum ds_status ds_matmul_ref(const struct ds_matmul_args *a) {
    static const char op[] = "matmul";
    REF_TRY(check_act(op, a->act));
    REF_TRY(check_wdtype(op, "weight", a->w_dtype));
    if (a->bias || a->bias1 || a->bias2) REF_TRY(check_wdtype(op, "bias", a->bias_dtype));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    REF_TRY(check_dim(op, "in_dim", a->in_dim, 1));
    REF_TRY(check_dim(op, "out_dim", a->out_dim, 1));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "x", a->x));
    REF_TRY(check_ptr(op, "weight", a->w));
    REF_TRY(check_ptr(op, "out", a->out));
    if (a->out == a->x) return ds_error_set(DS_ERR_ARG, "%s: out must not alias x", op);
    REF_TRY(ds_matmul_check_split(op, a));
    REF_TRY(ds_matmul_check_rope(op, a));
    if (a->rms_of) {
        REF_TRY(check_rms_eps(op, a->rms_eps));
        // out is written while rms_of rows are still being read (on CUDA, by other blocks).
        if (a->rms_of == a->out)
            return ds_error_set(DS_ERR_ARG, "%s: rms_of must not alias out", op);
    }
    // norm_out mirrors out element for element, which a split's several buffers do not have.
    if (a->norm_gain && a->part_dim[0] > 0)
        return ds_error_set(DS_ERR_ARG, "%s: a split output takes no norm_gain", op);
    REF_TRY(check_norm_out(op, a->norm_gain, a->norm_gain_dtype, a->norm_out, a->out, a->x));
    if (a->norm_gain && a->norm_out == a->residual)
        return ds_error_set(DS_ERR_ARG, "%s: norm_out must not alias residual", op);
    if (!a->rms_of) {
        f32_anyw_matmul_ref(a, NULL);
    } else {
        // Each row's s once, not once per output feature, in chunks of rows on the stack (no
        // allocation per call); a chunk is the same call over fewer rows.
        enum { CHUNK = 256 };
        double scale[CHUNK];
        const int T = a->n_rows, K = a->in_dim, N = a->out_dim, *d = a->part_dim;
        for (int t0 = 0; t0 < T; t0 += CHUNK) {
            const int nt = T - t0 < CHUNK ? T - t0 : CHUNK;
            for (int t = 0; t < nt; t++)
                scale[t] = rms_scale((const float *)a->rms_of + (size_t)(t0 + t) * K, K,
                                     (double)a->rms_eps);
            struct ds_matmul_args c = *a;
            c.n_rows = nt;
            c.x = (const float *)a->x + (size_t)t0 * K;
            c.out = (float *)a->out + (size_t)t0 * (d[0] > 0 ? d[0] : N);
            if (d[0] > 0 && d[1] > 0) c.out1 = (float *)a->out1 + (size_t)t0 * d[1];
            if (d[0] > 0 && d[2] > 0) c.out2 = (float *)a->out2 + (size_t)t0 * d[2];
            if (a->residual) c.residual = (const float *)a->residual + (size_t)t0 * N;
            f32_anyw_matmul_ref(&c, scale);
        }
    }
    if (a->norm_gain) // from out as stored (no split: row stride N)
        for (int t = 0; t < a->n_rows; t++)
            norm_gain_row(a->norm_gain, a->norm_gain_dtype,
                          (const float *)a->out + (size_t)t * a->out_dim,
                          (float *)a->norm_out + (size_t)t * a->out_dim, a->out_dim);
    if (a->rope_cos) { // the two ops in sequence: what the fused call stands for
        const struct ds_rope_args r = ds_matmul_rope_args(a);
        return ds_rope_ref(&r);
    }
    return DS_OK;
}

// The elementwise ops run over n_rows × dim values; the shared checks live here.
static enum ds_status check_rows(const char *op, enum ds_elem act, int n_rows, int dim) {
    REF_TRY(check_act(op, act));
    REF_TRY(check_dim(op, "n_rows", n_rows, 0));
    return check_dim(op, "dim", dim, 1);
}

enum ds_status ds_add_ref(const struct ds_add_args *a) {
    static const char op[] = "add";
    REF_TRY(check_rows(op, a->act, a->n_rows, a->dim));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "a", a->a));
    REF_TRY(check_ptr(op, "b", a->b));
    REF_TRY(check_ptr(op, "out", a->out));
    const size_t n = (size_t)a->n_rows * (size_t)a->dim;
    const float *x = (const float *)a->a, *y = (const float *)a->b;
    float *out = (float *)a->out;
    for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
    return DS_OK;
}

enum ds_status ds_silu_mul_ref(const struct ds_silu_mul_args *a) {
    static const char op[] = "silu_mul";
    REF_TRY(check_rows(op, a->act, a->n_rows, a->dim));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "gate", a->gate));
    REF_TRY(check_ptr(op, "up", a->up));
    REF_TRY(check_ptr(op, "out", a->out));
    const size_t n = (size_t)a->n_rows * (size_t)a->dim;
    const float *g = (const float *)a->gate, *u = (const float *)a->up;
    float *out = (float *)a->out;
#pragma omp parallel for schedule(static) if ((double)n > REF_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) {
        double gi = g[i];
        out[i] = (float)(gi / (1.0 + exp(-gi)) * (double)u[i]);
    }
    return DS_OK;
}

enum ds_status ds_gather_rows_ref(const struct ds_gather_rows_args *a) {
    static const char op[] = "gather_rows";
    REF_TRY(check_rows(op, a->act, a->n_rows, a->dim));
    REF_TRY(check_dim(op, "src_rows", a->src_rows, 0));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "x", a->x));
    REF_TRY(check_ptr(op, "rows", a->rows));
    REF_TRY(check_ptr(op, "out", a->out));
    for (int i = 0; i < a->n_rows; i++)
        if (a->rows[i] < 0 || a->rows[i] >= a->src_rows)
            return ds_error_set(DS_ERR_RANGE, "%s: entry %d picks row %d of %d", op, i,
                                (int)a->rows[i], a->src_rows);
    const size_t C = (size_t)a->dim;
    for (int i = 0; i < a->n_rows; i++)
        memcpy((float *)a->out + i * C, (const float *)a->x + (size_t)a->rows[i] * C,
               C * sizeof(float));
    return DS_OK;
}
