// CPU reference of the gpt-oss mixture of experts: the top-k-then-softmax router and the fused
// MXFP4 expert block (gate_up matmul + interleaved clamped SwiGLU + down matmul + weighted sum).
//
// MXFP4 rows are decoded exactly (ds/mxfp4.h) 32 elements at a time into a stack buffer and fed
// to the same acc8 lanes a dense f32 row would use, so the fused dot equals "dequantize the row,
// then dot" bit for bit. Phase 1 computes h = SwiGLU(W1·x + b1) for every (row, slot, unit) into
// the workspace; phase 2 computes out = residual + Σ_s w_s·(W2·h + b2) for every (row, feature).
// Both phases parallelise over independent outputs only. With a deferred RMSNorm
// (ds/kernel_args.h) the router scales each row's logits by s(rms_of) and hands s on as
// row_scale, which the expert block applies to the gate_up products; the expert block also
// writes the next norm's g ⊙ out.
#include <math.h>

#include "ds/kernels.h"
#include "ds/mxfp4.h"
#include "ref_common.h"

static const float e2m1_lut[16] = DS_E2M1_VALUES;

// Decodes 32 elements of block b of a packed row (exact: code value × power of two).
static inline void decode_block(const uint8_t *row_blocks, const uint8_t *row_scales, int b,
                                float w[DS_MXFP4_BLOCK]) {
    const uint8_t *bytes = row_blocks + (size_t)b * DS_MXFP4_BLOCK_BYTES;
    const uint8_t s = row_scales[b];
    if (s == 255) { // 2^128 is not a float: the rare exact slow path
        for (int i = 0; i < DS_MXFP4_BLOCK_BYTES; i++) {
            w[2 * i] = ds_mxfp4_scale(e2m1_lut[bytes[i] & 0x0f], s);
            w[2 * i + 1] = ds_mxfp4_scale(e2m1_lut[bytes[i] >> 4], s);
        }
        return;
    }
    const float scale = ds_e8m0_to_f32(s);
    for (int i = 0; i < DS_MXFP4_BLOCK_BYTES; i++) {
        w[2 * i] = e2m1_lut[bytes[i] & 0x0f] * scale; // low nibble = even element
        w[2 * i + 1] = e2m1_lut[bytes[i] >> 4] * scale;
    }
}

// Σ_k x[k]·W[n][k] over one MXFP4 row of K (multiple of 32) elements.
static double dot_mxfp4(const float *x, const uint8_t *row_blocks, const uint8_t *row_scales,
                        int K) {
    struct acc8 acc;
    acc8_zero(&acc);
    float w[DS_MXFP4_BLOCK];
    for (int b = 0; b < K / DS_MXFP4_BLOCK; b++) {
        decode_block(row_blocks, row_scales, b, w);
        acc8_add_f32(&acc, x + (size_t)b * DS_MXFP4_BLOCK, w, DS_MXFP4_BLOCK);
    }
    return acc8_sum(&acc);
}

enum ds_status ds_mxfp4_dequant_ref(const uint8_t *blocks, const uint8_t *scales, int n_rows,
                                    int k_dim, float *out) {
    static const char op[] = "mxfp4_dequant";
    REF_TRY(check_dim(op, "n_rows", n_rows, 0));
    REF_TRY(check_dim(op, "k_dim", k_dim, DS_MXFP4_BLOCK));
    if (k_dim % DS_MXFP4_BLOCK)
        return ds_error_set(DS_ERR_ARG, "%s: k_dim %d is not a multiple of %d", op, k_dim,
                            DS_MXFP4_BLOCK);
    if (n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "blocks", blocks));
    REF_TRY(check_ptr(op, "scales", scales));
    REF_TRY(check_ptr(op, "out", out));
    const int nb = k_dim / DS_MXFP4_BLOCK;
    for (int n = 0; n < n_rows; n++)
        for (int b = 0; b < nb; b++)
            decode_block(blocks + (size_t)n * nb * DS_MXFP4_BLOCK_BYTES, scales + (size_t)n * nb, b,
                         out + (size_t)n * k_dim + (size_t)b * DS_MXFP4_BLOCK);
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Router

enum ds_status ds_router_ref(const struct ds_router_args *a) {
    static const char op[] = "router";
    REF_TRY(check_act(op, a->act));
    REF_TRY(check_wdtype(op, "weight", a->w_dtype));
    if (a->bias) REF_TRY(check_wdtype(op, "bias", a->bias_dtype));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    REF_TRY(check_dim(op, "dim", a->dim, 1));
    REF_TRY(check_dim(op, "n_experts", a->n_experts, 1));
    if (a->top_k < 1 || a->top_k > a->n_experts || a->top_k > DS_MAX_TOPK)
        return ds_error_set(DS_ERR_ARG, "%s: top_k %d outside [1, min(%d experts, %d)]", op,
                            a->top_k, a->n_experts, DS_MAX_TOPK);
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "x", a->x));
    REF_TRY(check_ptr(op, "weight", a->w));
    REF_TRY(check_ptr(op, "expert_ids", a->expert_ids));
    REF_TRY(check_ptr(op, "expert_weights", a->expert_weights));
    if (a->rms_of) REF_TRY(check_rms_eps(op, a->rms_eps));
    const int C = a->dim, E = a->n_experts, KE = a->top_k;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * E * C > REF_PAR_MIN_WORK)
    for (int t = 0; t < a->n_rows; t++) {
        const float *x = (const float *)a->x + (size_t)t * C;
        // Deferred norm: s scales the product, not the bias; row_scale is only defined with it.
        double rs = 1.0;
        if (a->rms_of) {
            rs = rms_scale((const float *)a->rms_of + (size_t)t * C, C, (double)a->rms_eps);
            if (a->row_scale) a->row_scale[t] = (float)rs;
        }
        double best[DS_MAX_TOPK];
        int ids[DS_MAX_TOPK], n = 0;
        for (int e = 0; e < E; e++) {
            double d = dot_w(x, a->w, a->w_dtype, (size_t)e, C);
            if (a->rms_of) d *= rs;
            double l = d + load_elem(a->bias, a->bias_dtype, e);
            // Strictly greater to enter or move up: an equal logit stays behind the lower index.
            if (n == KE && !(l > best[KE - 1])) continue;
            int pos = n < KE ? n++ : KE - 1;
            while (pos > 0 && l > best[pos - 1]) {
                best[pos] = best[pos - 1], ids[pos] = ids[pos - 1];
                pos--;
            }
            best[pos] = l, ids[pos] = e;
        }
        double sum = 0.0, w[DS_MAX_TOPK];
        for (int s = 0; s < KE; s++) sum += w[s] = exp(best[s] - best[0]);
        for (int s = 0; s < KE; s++) {
            a->expert_ids[(size_t)t * KE + s] = ids[s];
            a->expert_weights[(size_t)t * KE + s] = (float)(w[s] / sum);
        }
    }
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Experts

size_t ds_moe_workspace_bytes(int n_rows, int inter, int top_k) {
    if (n_rows <= 0 || inter <= 0 || top_k <= 0) return 0;
    return (size_t)n_rows * (size_t)top_k * (size_t)inter * sizeof(float);
}

static enum ds_status check_moe(const struct ds_moe_args *a) {
    static const char op[] = "moe";
    REF_TRY(check_act(op, a->act));
    REF_TRY(check_wdtype(op, "bias", a->bias_dtype));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    REF_TRY(check_dim(op, "dim", a->dim, DS_MXFP4_BLOCK));
    REF_TRY(check_dim(op, "inter", a->inter, DS_MXFP4_BLOCK));
    REF_TRY(check_dim(op, "n_experts", a->n_experts, 1));
    if (a->dim % DS_MXFP4_BLOCK || a->inter % DS_MXFP4_BLOCK)
        return ds_error_set(DS_ERR_ARG, "%s: dim %d and inter %d must be multiples of %d", op,
                            a->dim, a->inter, DS_MXFP4_BLOCK);
    if (a->top_k < 1 || a->top_k > a->n_experts)
        return ds_error_set(DS_ERR_ARG, "%s: top_k %d outside [1, %d]", op, a->top_k,
                            a->n_experts);
    if (!(a->swiglu_limit > 0.0f) || !(a->swiglu_alpha > 0.0f))
        return ds_error_set(DS_ERR_ARG, "%s: swiglu alpha %g and limit %g must be positive", op,
                            a->swiglu_alpha, a->swiglu_limit);
    if (a->n_rows == 0) return DS_OK;
    const void *need[] = {a->x,           a->expert_ids,  a->expert_weights, a->gate_up_blocks,
                          a->gate_up_scales, a->gate_up_bias, a->down_blocks, a->down_scales,
                          a->down_bias,   a->out,         a->workspace};
    static const char *const names[] = {"x", "expert_ids", "expert_weights", "gate_up_blocks",
                                        "gate_up_scales", "gate_up_bias", "down_blocks",
                                        "down_scales", "down_bias", "out", "workspace"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) REF_TRY(check_ptr(op, names[i], need[i]));
    if (a->out == a->x) return ds_error_set(DS_ERR_ARG, "%s: out must not alias x", op);
    REF_TRY(check_norm_out(op, a->norm_gain, a->norm_gain_dtype, a->norm_out, a->out, a->x));
    if (a->norm_gain && a->norm_out == a->residual)
        return ds_error_set(DS_ERR_ARG, "%s: norm_out must not alias residual", op);
    size_t ws = ds_moe_workspace_bytes(a->n_rows, a->inter, a->top_k);
    if (a->workspace_bytes < ws)
        return ds_error_set(DS_ERR_ARG, "%s: workspace of %zu bytes, %zu needed for %d rows", op,
                            a->workspace_bytes, ws, a->n_rows);
    for (size_t i = 0; i < (size_t)a->n_rows * a->top_k; i++)
        if (a->expert_ids[i] < 0 || a->expert_ids[i] >= a->n_experts)
            return ds_error_set(DS_ERR_RANGE, "%s: row %zu selects expert %d of %d", op,
                                i / a->top_k, (int)a->expert_ids[i], a->n_experts);
    return DS_OK;
}

// gpt-oss SwiGLU of one (gate, linear) pair: gate clamped from above only, linear to ±limit, +1.
static inline double swiglu_clamped(double g, double l, double alpha, double limit) {
    g = g > limit ? limit : g; // keeps NaN visible, unlike fmin
    l = l > limit ? limit : l < -limit ? -limit : l;
    return g / (1.0 + exp(-alpha * g)) * (l + 1.0);
}

// f32 activations, MXFP4 weights, bf16/f32 biases.
static void f32_mxfp4w_moe_matmul_swiglu_ref(const struct ds_moe_args *a) {
    const int T = a->n_rows, KE = a->top_k, C = a->dim, I = a->inter;
    const size_t up_row_b = (size_t)C / 2, up_row_s = (size_t)C / DS_MXFP4_BLOCK;
    const size_t dn_row_b = (size_t)I / 2, dn_row_s = (size_t)I / DS_MXFP4_BLOCK;
    float *h = (float *)a->workspace; // (T, KE, I)
    const float *x = (const float *)a->x;
    const int pairs = T * KE;
    const double alpha = a->swiglu_alpha, limit = a->swiglu_limit;

#pragma omp parallel for collapse(2) schedule(static) if ((double)pairs * I * C > REF_PAR_MIN_WORK)
    for (int p = 0; p < pairs; p++) {
        for (int j = 0; j < I; j++) {
            const size_t e = (size_t)a->expert_ids[p];
            const float *xr = x + (size_t)(p / KE) * C;
            const size_t gate_row = e * 2 * I + 2 * (size_t)j; // even row = gate, odd = linear
            double g = dot_mxfp4(xr, a->gate_up_blocks + gate_row * up_row_b,
                                 a->gate_up_scales + gate_row * up_row_s, C);
            double l = dot_mxfp4(xr, a->gate_up_blocks + (gate_row + 1) * up_row_b,
                                 a->gate_up_scales + (gate_row + 1) * up_row_s, C);
            if (a->row_scale) { // deferred norm: x is g ⊙ x, the router's s finishes the norm
                const double r = a->row_scale[p / KE];
                g *= r, l *= r;
            }
            g += load_elem(a->gate_up_bias, a->bias_dtype, gate_row);
            l += load_elem(a->gate_up_bias, a->bias_dtype, gate_row + 1);
            h[(size_t)p * I + j] = (float)swiglu_clamped(g, l, alpha, limit);
        }
    }

    float *out = (float *)a->out;
#pragma omp parallel for collapse(2) schedule(static) if ((double)pairs * I * C > REF_PAR_MIN_WORK)
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < C; c++) {
            double acc = 0.0;
            for (int s = 0; s < KE; s++) {
                const size_t p = (size_t)t * KE + s, e = (size_t)a->expert_ids[p];
                const size_t row = e * C + c;
                double y = dot_mxfp4(h + p * I, a->down_blocks + row * dn_row_b,
                                     a->down_scales + row * dn_row_s, I) +
                           load_elem(a->down_bias, a->bias_dtype, row);
                acc += (double)a->expert_weights[p] * y; // the bias is inside the weighted sum
            }
            if (a->residual) acc += ((const float *)a->residual)[(size_t)t * C + c];
            const float o = (float)acc;
            out[(size_t)t * C + c] = o;
            if (a->norm_gain) // of the value as stored (ds/kernel_args.h)
                ((float *)a->norm_out)[(size_t)t * C + c] =
                    (float)(load_elem(a->norm_gain, a->norm_gain_dtype, (size_t)c) * (double)o);
        }
    }
}

enum ds_status ds_moe_ref(const struct ds_moe_args *a) {
    REF_TRY(check_moe(a));
    if (a->n_rows == 0) return DS_OK;
    f32_mxfp4w_moe_matmul_swiglu_ref(a);
    return DS_OK;
}
