// CPU reference of rotary position embedding: the frequency computation (plain and YaRN), the
// cos/sin table built once per model, and the NeoX half-split rotation of q and k.
//
// YaRN follows transformers' _compute_yarn_parameters with truncate=false for gpt-oss (no
// floor/ceil of the correction range) and the concentration 0.1·ln(factor) + 1 applied to both
// cos and sin. Frequencies and angles are computed in double and rounded once into the float
// table, which is closer to the exact values than the fp32 references (they agree to ~1e-7).
#include <math.h>

#include "ds/kernels.h"
#include "ref_common.h"

static const double two_pi = 6.283185307179586476925286766559;

// Dimension index whose wavelength makes `rotations` turns over the original context.
static double yarn_correction_dim(double rotations, int dim, double theta, int max_pos) {
    return (dim * log(max_pos / (rotations * two_pi))) / (2.0 * log(theta));
}

enum ds_status ds_rope_freqs_compute(const struct ds_rope_table_config *cfg,
                                     struct ds_rope_freqs *freqs_out) {
    static const char op[] = "rope";
    const int D = cfg->head_dim;
    if (D < 2 || D % 2 || D > DS_MAX_HEAD_DIM)
        return ds_error_set(DS_ERR_ARG, "%s: head_dim %d must be even and in [2, %d]", op, D,
                            DS_MAX_HEAD_DIM);
    if (!(cfg->theta > 1.0))
        return ds_error_set(DS_ERR_ARG, "%s: rope_theta %g must be > 1", op, cfg->theta);
    struct ds_rope_freqs f = {.n_half = D / 2, .concentration = 1.0};
    for (int i = 0; i < f.n_half; i++) f.inv_freq[i] = 1.0 / pow(cfg->theta, (2.0 * i) / D);
    if (cfg->kind == DS_ROPE_TABLE_YARN) {
        if (!(cfg->factor >= 1.0))
            return ds_error_set(DS_ERR_ARG, "%s: YaRN factor %g must be >= 1", op, cfg->factor);
        if (!(cfg->beta_fast > cfg->beta_slow && cfg->beta_slow > 0.0))
            return ds_error_set(DS_ERR_ARG, "%s: YaRN needs beta_fast %g > beta_slow %g > 0", op,
                                cfg->beta_fast, cfg->beta_slow);
        if (cfg->original_max_pos < 1)
            return ds_error_set(DS_ERR_ARG, "%s: YaRN original_max_position_embeddings %d < 1",
                                op, cfg->original_max_pos);
        double low = yarn_correction_dim(cfg->beta_fast, D, cfg->theta, cfg->original_max_pos);
        double high = yarn_correction_dim(cfg->beta_slow, D, cfg->theta, cfg->original_max_pos);
        if (cfg->truncate) low = floor(low), high = ceil(high);
        low = fmax(low, 0.0);
        high = fmin(high, D - 1.0);
        if (low == high) high += 0.001; // transformers' guard against a zero-width ramp
        f.low = low, f.high = high;
        for (int i = 0; i < f.n_half; i++) {
            double r = (i - low) / (high - low);
            r = r < 0.0 ? 0.0 : r > 1.0 ? 1.0 : r;
            // r = 1 is the interpolated (÷ factor) frequency, r = 0 the original one.
            f.ramp[i] = r;
            f.inv_freq[i] = r * (f.inv_freq[i] / cfg->factor) + (1.0 - r) * f.inv_freq[i];
        }
        f.concentration = cfg->attention_factor > 0.0 ? cfg->attention_factor
                          : cfg->factor > 1.0         ? 0.1 * log(cfg->factor) + 1.0
                                                      : 1.0;
    } else if (cfg->kind != DS_ROPE_TABLE_PLAIN) {
        return ds_error_set(DS_ERR_ARG, "%s: unknown rope kind %d", op, (int)cfg->kind);
    }
    *freqs_out = f;
    return DS_OK;
}

enum ds_status ds_rope_table_fill(const struct ds_rope_table_config *cfg, int n_pos, float *cos_out,
                                  float *sin_out) {
    struct ds_rope_freqs f;
    REF_TRY(ds_rope_freqs_compute(cfg, &f));
    REF_TRY(check_dim("rope", "table positions", n_pos, 1));
    REF_TRY(check_ptr("rope", "cos table", cos_out));
    REF_TRY(check_ptr("rope", "sin table", sin_out));
    const int H = f.n_half;
#pragma omp parallel for schedule(static) if ((double)n_pos * H > REF_PAR_MIN_WORK)
    for (int p = 0; p < n_pos; p++) {
        for (int i = 0; i < H; i++) {
            double ang = (double)p * f.inv_freq[i];
            cos_out[(size_t)p * H + i] = (float)(f.concentration * cos(ang));
            sin_out[(size_t)p * H + i] = (float)(f.concentration * sin(ang));
        }
    }
    return DS_OK;
}

// Rotates the n_heads heads of one row at table row p.
static void rotate_row(float *x, int n_heads, int D, const float *c, const float *s) {
    const int H = D / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * D;
        for (int i = 0; i < H; i++) {
            double x0 = v[i], x1 = v[i + H];
            v[i] = (float)(x0 * c[i] - x1 * s[i]);
            v[i + H] = (float)(x1 * c[i] + x0 * s[i]);
        }
    }
}

enum ds_status ds_rope_ref(const struct ds_rope_args *a) {
    static const char op[] = "rope";
    REF_TRY(check_act(op, a->act));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    if (a->head_dim < 2 || a->head_dim % 2)
        return ds_error_set(DS_ERR_ARG, "%s: head_dim %d must be even and >= 2", op, a->head_dim);
    REF_TRY(check_dim(op, "n_q_heads", a->n_q_heads, 1));
    if (a->k) REF_TRY(check_dim(op, "n_k_heads", a->n_k_heads, 1));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "q", a->q));
    REF_TRY(check_ptr(op, "positions", a->positions));
    REF_TRY(check_ptr(op, "cos table", a->cos));
    REF_TRY(check_ptr(op, "sin table", a->sin));
    for (int t = 0; t < a->n_rows; t++)
        if (a->positions[t] < 0 || a->positions[t] >= a->table_len)
            return ds_error_set(DS_ERR_RANGE, "%s: row %d at position %d outside the table of %d",
                                op, t, (int)a->positions[t], a->table_len);
    const int D = a->head_dim, H = D / 2;
    const size_t q_row = (size_t)a->n_q_heads * D, k_row = (size_t)a->n_k_heads * D;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * q_row > REF_PAR_MIN_WORK)
    for (int t = 0; t < a->n_rows; t++) {
        const float *c = a->cos + (size_t)a->positions[t] * H;
        const float *s = a->sin + (size_t)a->positions[t] * H;
        rotate_row((float *)a->q + t * q_row, a->n_q_heads, D, c, s);
        if (a->k) rotate_row((float *)a->k + t * k_row, a->n_k_heads, D, c, s);
    }
    return DS_OK;
}
