// tests/model_naive.h: a naive double-precision gpt-oss target and EAGLE-3 draft, written
// straight from the spec (gpt-oss.md §3-§4, eagle3.md §3.4-§4) for the model tests.
//
// It shares no code with models/ or kernels/: tensors are read from the mmapped safetensors by
// name, bf16 by shifting the bits, MXFP4 by its own table, YaRN from the formula; every sum is a
// plain double loop; one sequence at positions 0..n-1 with full recomputation (no KV cache).
// Slow and simple on purpose; only for the tiny fixtures.
#ifndef DS_TEST_MODEL_NAIVE_H
#define DS_TEST_MODEL_NAIVE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/config.h"
#include "ds/safetensors.h"

static inline double nv_at(const struct ds_tensor_info *t, size_t i) {
    const unsigned char *p = t->data;
    if (t->dtype == DS_DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint32_t u = ((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8) << 16; // BF16
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline const struct ds_tensor_info *nv_get(const ds_safetensors_t *st, const char *fmt,
                                                  int l) {
    char name[160];
    snprintf(name, sizeof name, fmt, l);
    const struct ds_tensor_info *t = ds_safetensors_find(st, name);
    if (!t) {
        fprintf(stderr, "naive: missing tensor %s\n", name);
        abort();
    }
    return t;
}

// y[n] = Σ_k W[n][k] x[k] (+ b[n]).
static inline void nv_linear(const struct ds_tensor_info *w, const struct ds_tensor_info *b,
                             int out, int in, const double *x, double *y) {
    for (int n = 0; n < out; n++) {
        double s = b ? nv_at(b, (size_t)n) : 0.0;
        for (int k = 0; k < in; k++)
            s += nv_at(w, (size_t)n * in + k) * x[k];
        y[n] = s;
    }
}

static inline void nv_rmsnorm(const struct ds_tensor_info *w, int dim, double eps, const double *x,
                              double *y) {
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / dim + eps);
    for (int i = 0; i < dim; i++)
        y[i] = nv_at(w, (size_t)i) * x[i] * r;
}

// RoPE frequencies (gpt-oss.md §4.4) for a config's rope settings.
static inline void nv_rope_freqs(const struct ds_rope_config *rc, int D, double *inv_freq,
                                 double *conc) {
    const int half = D / 2;
    *conc = 1.0;
    for (int i = 0; i < half; i++)
        inv_freq[i] = 1.0 / pow(rc->theta, 2.0 * i / D);
    if (rc->type != DS_ROPE_YARN) return;
    const double L0 = (double)rc->original_max_position_embeddings, lt = log(rc->theta);
    double low = half * log(L0 / (rc->beta_fast * 2 * M_PI)) / lt;
    double high = half * log(L0 / (rc->beta_slow * 2 * M_PI)) / lt;
    if (rc->truncate) low = floor(low), high = ceil(high);
    if (low < 0) low = 0;
    if (high > D - 1) high = D - 1;
    if (high == low) high += 0.001;
    for (int i = 0; i < half; i++) {
        double r = (i - low) / (high - low);
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        double f = pow(rc->theta, 2.0 * i / D);
        inv_freq[i] = r / (rc->factor * f) + (1 - r) / f;
    }
    *conc = rc->attention_factor > 0 ? rc->attention_factor : 0.1 * log(rc->factor) + 1.0;
}

static inline void nv_rope(double *x, int heads, int D, int pos, const double *inv_freq,
                           double conc) {
    for (int h = 0; h < heads; h++) {
        double *v = x + (size_t)h * D;
        for (int i = 0; i < D / 2; i++) {
            double c = conc * cos(pos * inv_freq[i]), s = conc * sin(pos * inv_freq[i]);
            double a = v[i], b = v[i + D / 2];
            v[i] = a * c - b * s;
            v[i + D / 2] = b * c + a * s;
        }
    }
}

// Causal attention of n rows (positions 0..n-1): q (n, NH, D), k/v (n, NKV, D) → out (n, NH, D).
// window > 0 keeps the last `window` keys; sinks (NH) or NULL.
static inline void nv_attention(int n, int NH, int NKV, int D, const double *q, const double *k,
                                const double *v, int window, const struct ds_tensor_info *sinks,
                                double *out) {
    double *sc = malloc((size_t)n * sizeof *sc);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV), j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
            double m = sinks ? nv_at(sinks, (size_t)h) : -INFINITY;
            for (int j = j0; j <= i; j++) {
                double s = 0;
                for (int d = 0; d < D; d++)
                    s += q[((size_t)i * NH + h) * D + d] * k[((size_t)j * NKV + g) * D + d];
                sc[j] = s / sqrt((double)D);
                if (sc[j] > m) m = sc[j];
            }
            double den = sinks ? exp(nv_at(sinks, (size_t)h) - m) : 0.0;
            double *o = out + ((size_t)i * NH + h) * D;
            for (int d = 0; d < D; d++)
                o[d] = 0;
            for (int j = j0; j <= i; j++) {
                double e = exp(sc[j] - m);
                den += e;
                for (int d = 0; d < D; d++)
                    o[d] += e * v[((size_t)j * NKV + g) * D + d];
            }
            for (int d = 0; d < D; d++)
                o[d] /= den;
        }
    free(sc);
}

static inline double nv_mxfp4(const struct ds_tensor_info *blocks,
                              const struct ds_tensor_info *scales, size_t row, int K, int k) {
    static const double lut[16] = {0,    0.5,  1,  1.5,  2,  3,  4,  6,
                                   -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
    const unsigned char *b = blocks->data, *s = scales->data;
    size_t blk = row * (size_t)(K / 32) + (size_t)(k / 32);
    unsigned char byte = b[blk * 16 + (size_t)(k % 32) / 2];
    int code = k % 2 ? byte >> 4 : byte & 15;
    return ldexp(lut[code], (int)s[blk] - 127);
}

// Runs the target on tokens[0..n) from position 0. Outputs (each may be NULL):
// logits (n, V); bounds (n, L+1, H): the residual stream at every boundary; experts (L, n, KE).
static inline void nv_target_run(const ds_safetensors_t *st, const struct ds_target_config *c,
                                 int n, const int32_t *tokens, double *logits, double *bounds,
                                 int32_t *experts) {
    const int H = (int)c->hidden_size, NH = (int)c->num_attention_heads,
              NKV = (int)c->num_key_value_heads, D = (int)c->head_dim, V = (int)c->vocab_size,
              E = (int)c->num_local_experts, KE = (int)c->num_experts_per_tok,
              I = (int)c->intermediate_size, L = (int)c->num_hidden_layers;
    const double eps = c->rms_norm_eps, limit = c->swiglu_limit, alpha = c->swiglu_alpha;
    double inv_freq[128], conc;
    nv_rope_freqs(&c->rope, D, inv_freq, &conc);
    double *x = calloc((size_t)n * H, sizeof *x), *xn = malloc((size_t)H * sizeof *xn);
    double *q = malloc((size_t)n * NH * D * sizeof *q), *k = malloc((size_t)n * NKV * D * 8);
    double *v = malloc((size_t)n * NKV * D * 8), *at = malloc((size_t)n * NH * D * 8);
    double *u = malloc((size_t)2 * I * 8), *hh = malloc((size_t)I * 8), *y = malloc((size_t)H * 8);
    double *rl = malloc((size_t)E * 8), *tmp = malloc((size_t)H * 8);
    const struct ds_tensor_info *emb = nv_get(st, "model.embed_tokens.weight", 0);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < H; i++)
            x[(size_t)t * H + i] = nv_at(emb, (size_t)tokens[t] * H + i);
    for (int l = 0; l <= L; l++) {
        if (bounds)
            for (int t = 0; t < n; t++)
                memcpy(bounds + ((size_t)t * (L + 1) + l) * H, x + (size_t)t * H, H * 8);
        if (l == L) break;
#define T_(s) nv_get(st, "model.layers.%d." s, l)
        for (int t = 0; t < n; t++) {
            nv_rmsnorm(T_("input_layernorm.weight"), H, eps, x + (size_t)t * H, xn);
            nv_linear(T_("self_attn.q_proj.weight"), T_("self_attn.q_proj.bias"), NH * D, H, xn,
                      q + (size_t)t * NH * D);
            nv_linear(T_("self_attn.k_proj.weight"), T_("self_attn.k_proj.bias"), NKV * D, H, xn,
                      k + (size_t)t * NKV * D);
            nv_linear(T_("self_attn.v_proj.weight"), T_("self_attn.v_proj.bias"), NKV * D, H, xn,
                      v + (size_t)t * NKV * D);
            nv_rope(q + (size_t)t * NH * D, NH, D, t, inv_freq, conc);
            nv_rope(k + (size_t)t * NKV * D, NKV, D, t, inv_freq, conc);
        }
        int window = c->layer_types[l] == DS_ATTN_SLIDING ? (int)c->sliding_window : 0;
        nv_attention(n, NH, NKV, D, q, k, v, window, T_("self_attn.sinks"), at);
        for (int t = 0; t < n; t++) {
            nv_linear(T_("self_attn.o_proj.weight"), T_("self_attn.o_proj.bias"), H, NH * D,
                      at + (size_t)t * NH * D, y);
            for (int i = 0; i < H; i++)
                x[(size_t)t * H + i] += y[i];
            nv_rmsnorm(T_("post_attention_layernorm.weight"), H, eps, x + (size_t)t * H, xn);
            nv_linear(T_("mlp.router.weight"), T_("mlp.router.bias"), E, H, xn, rl);
            int sel[64];
            double sw[64], mx = -INFINITY, den = 0;
            for (int s = 0; s < KE; s++) { // top-k, ties to the lower expert index
                int best = -1;
                for (int e = 0; e < E; e++) {
                    int used = 0;
                    for (int r = 0; r < s; r++)
                        used |= sel[r] == e;
                    if (!used && (best < 0 || rl[e] > rl[best])) best = e;
                }
                sel[s] = best;
                if (rl[best] > mx) mx = rl[best];
            }
            for (int s = 0; s < KE; s++)
                den += sw[s] = exp(rl[sel[s]] - mx);
            for (int i = 0; i < H; i++)
                tmp[i] = 0;
            for (int s = 0; s < KE; s++) {
                int e = sel[s];
                if (experts) experts[((size_t)l * n + t) * KE + s] = e;
                const struct ds_tensor_info *gub = T_("mlp.experts.gate_up_proj_blocks"),
                                            *gus = T_("mlp.experts.gate_up_proj_scales"),
                                            *gbi = T_("mlp.experts.gate_up_proj_bias"),
                                            *db = T_("mlp.experts.down_proj_blocks"),
                                            *ds = T_("mlp.experts.down_proj_scales"),
                                            *dbi = T_("mlp.experts.down_proj_bias");
                for (int r = 0; r < 2 * I; r++) {
                    double a = nv_at(gbi, (size_t)e * 2 * I + r);
                    for (int kk = 0; kk < H; kk++)
                        a += nv_mxfp4(gub, gus, (size_t)e * 2 * I + r, H, kk) * xn[kk];
                    u[r] = a;
                }
                for (int j = 0; j < I; j++) {
                    double g = fmin(u[2 * j], limit), lin = fmax(-limit, fmin(u[2 * j + 1], limit));
                    hh[j] = g / (1 + exp(-alpha * g)) * (lin + 1);
                }
                for (int r = 0; r < H; r++) {
                    double a = nv_at(dbi, (size_t)e * H + r);
                    for (int j = 0; j < I; j++)
                        a += nv_mxfp4(db, ds, (size_t)e * H + r, I, j) * hh[j];
                    tmp[r] += sw[s] / den * a;
                }
            }
            for (int i = 0; i < H; i++)
                x[(size_t)t * H + i] += tmp[i];
        }
#undef T_
    }
    if (logits) {
        const struct ds_tensor_info *nw = nv_get(st, "model.norm.weight", 0),
                                    *lm = nv_get(st, "lm_head.weight", 0);
        for (int t = 0; t < n; t++) {
            nv_rmsnorm(nw, H, eps, x + (size_t)t * H, xn);
            nv_linear(lm, NULL, V, H, xn, logits + (size_t)t * V);
        }
    }
    free(x), free(xn), free(q), free(k), free(v), free(at), free(u), free(hh), free(y), free(rl);
    free(tmp);
}

// The draft over one virtual sequence of n rows at positions 0..n-1 (eagle3.md §4). Row r has
// input token tokens[r] and hidden input: aux[r] (width_in wide: n_aux·Ht through
// [input_norm] fc, or Ht for a no-aux head) when from_prev[r] == 0, else the previous row's fed-
// back output (h2, or n with norm_output). embed: the (V, H) table. Outputs logits (n, Dv).
static inline void nv_draft_run(const ds_safetensors_t *st, const struct ds_draft_config *c,
                                const struct ds_tensor_info *embed,
                                const struct ds_tensor_info *lm_head, int Ht, int n,
                                const int32_t *tokens, const double *aux, const int *from_prev,
                                double *logits) {
    const int H = (int)c->hidden_size, NH = (int)c->num_attention_heads,
              NKV = (int)c->num_key_value_heads, D = (int)c->head_dim,
              I = (int)c->intermediate_size, Dv = (int)c->draft_vocab_size, W = 3 * Ht;
    const double eps = c->rms_norm_eps;
    const char *p = ds_draft_names_prefix(c->layer_names);
    char nm[160];
#define DT(s) (snprintf(nm, sizeof nm, "%s%s", p, s), nv_get(st, nm, 0))
    double inv_freq[128], conc;
    nv_rope_freqs(&c->rope, D, inv_freq, &conc);
    const int win = c->use_aux_hidden_state ? W : Ht;
    double *a = malloc((size_t)win * 8), *g = malloc((size_t)H * 8), *gn = malloc((size_t)H * 8);
    double *uu = malloc((size_t)2 * H * 8), *r = malloc((size_t)H * 8);
    double *q = malloc((size_t)n * NH * D * 8), *k = malloc((size_t)n * NKV * D * 8);
    double *v = malloc((size_t)n * NKV * D * 8), *at = malloc((size_t)n * NH * D * 8);
    double *resid = malloc((size_t)n * H * 8), *fb = malloc((size_t)H * 8);
    double *h1 = malloc((size_t)H * 8), *z = malloc((size_t)H * 8), *o = malloc((size_t)H * 8);
    double *gt = malloc((size_t)I * 8), *up = malloc((size_t)I * 8), *nn = malloc((size_t)H * 8);
    // Rows are sequential: row r's hidden may be row r-1's output, so the layer runs row by row
    // with attention over the rows so far (causal).
    for (int t = 0; t < n; t++) {
        if (from_prev[t]) {
            memcpy(g, fb, (size_t)H * 8);
        } else if (c->use_aux_hidden_state) {
            memcpy(a, aux + (size_t)t * win, (size_t)win * 8);
            if (c->norm_before_fc) nv_rmsnorm(nv_get(st, "input_norm.weight", 0), W, eps, a, a);
            nv_linear(nv_get(st, "fc.weight", 0), NULL, H, W, a, g);
        } else {
            memcpy(g, aux + (size_t)t * win, (size_t)H * 8);
        }
        nv_rmsnorm(DT("hidden_norm.weight"), H, eps, g, gn);
        for (int i = 0; i < H; i++)
            r[i] = nv_at(embed, (size_t)tokens[t] * H + i);
        nv_rmsnorm(DT("input_layernorm.weight"), H, eps, r, uu);
        memcpy(uu + H, gn, (size_t)H * 8);
        memcpy(resid + (size_t)t * H, c->norm_before_residual ? gn : g, (size_t)H * 8);
        nv_linear(DT("self_attn.q_proj.weight"), NULL, NH * D, 2 * H, uu, q + (size_t)t * NH * D);
        nv_linear(DT("self_attn.k_proj.weight"), NULL, NKV * D, 2 * H, uu, k + (size_t)t * NKV * D);
        nv_linear(DT("self_attn.v_proj.weight"), NULL, NKV * D, 2 * H, uu, v + (size_t)t * NKV * D);
        nv_rope(q + (size_t)t * NH * D, NH, D, t, inv_freq, conc);
        nv_rope(k + (size_t)t * NKV * D, NKV, D, t, inv_freq, conc);
        nv_attention(t + 1, NH, NKV, D, q, k, v, 0, NULL, at); // rows 0..t; row t is the last
        nv_linear(DT("self_attn.o_proj.weight"), NULL, H, NH * D, at + (size_t)t * NH * D, o);
        for (int i = 0; i < H; i++)
            h1[i] = o[i] + resid[(size_t)t * H + i];
        nv_rmsnorm(DT("post_attention_layernorm.weight"), H, eps, h1, z);
        nv_linear(DT("mlp.gate_proj.weight"), NULL, I, H, z, gt);
        nv_linear(DT("mlp.up_proj.weight"), NULL, I, H, z, up);
        for (int j = 0; j < I; j++)
            gt[j] = gt[j] / (1 + exp(-gt[j])) * up[j];
        nv_linear(DT("mlp.down_proj.weight"), NULL, H, I, gt, o);
        for (int i = 0; i < H; i++)
            o[i] += h1[i]; // h2
        nv_rmsnorm(nv_get(st, "norm.weight", 0), H, eps, o, nn);
        memcpy(fb, c->norm_output ? nn : o, (size_t)H * 8);
        nv_linear(lm_head, NULL, Dv, H, nn, logits + (size_t)t * Dv);
    }
#undef DT
    free(a), free(g), free(gn), free(uu), free(r), free(q), free(k), free(v), free(at);
    free(resid), free(fb), free(h1), free(z), free(o), free(gt), free(up), free(nn);
}

// n pseudo-random token ids in 0..511 (the fixtures' vocabulary) from a seed (an LCG).
static inline void nv_tokens(int n, int32_t *ids, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)((seed >> 8) % 512);
    }
}

// max |a - b| over n entries, and max |b| (the scale the error is judged against).
static inline double nv_max_err(const float *a, const double *b, size_t n, double *scale_out) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d; // NaN propagates as a failure
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    if (scale_out) *scale_out = s;
    return e;
}

// Element i of an I64 tensor (golden files), and max |a - b| over two float arrays.
static inline int64_t nv_i64(const struct ds_tensor_info *t, size_t i) {
    int64_t v;
    memcpy(&v, (const char *)t->data + 8 * i, 8);
    return v;
}

static inline double nv_max_diff_f32(const float *a, const float *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= e)) e = d;
    }
    return e;
}

#endif // DS_TEST_MODEL_NAIVE_H
