// Attention over the KV cache (ds_attention_ref) against a direct softmax over (keys ∪ sink) in
// double written here from the gpt-oss spec §4.3: sinks, GQA, sliding window, mixed
// prefill/decode/verify sequences in one call, padding rows, overwrite of earlier positions, and
// batch invariance.
#include "ds/kernels.h"
#include "test_ops_common.h"

// One test problem: shapes, the cache before the call, and this call's inputs.
struct prob {
    int T, NH, NKV, D, S, P, window, n_seq;
    struct ds_attn_seq seqs[8];
    float *q, *k, *v, *kc0, *vc0, *sinks; // kc0/vc0: cache contents before the call
};

static size_t cache_elems(const struct prob *p) {
    return (size_t)p->S * p->P * p->NKV * p->D;
}

static void prob_fill(struct prob *p, uint64_t seed, int with_sinks) {
    p->q = t_alloc(sizeof(float) * p->T * p->NH * p->D);
    p->k = t_alloc(sizeof(float) * p->T * p->NKV * p->D);
    p->v = t_alloc(sizeof(float) * p->T * p->NKV * p->D);
    p->kc0 = t_alloc(sizeof(float) * cache_elems(p));
    p->vc0 = t_alloc(sizeof(float) * cache_elems(p));
    p->sinks = with_sinks ? t_alloc(sizeof(float) * p->NH) : NULL;
    t_fill(p->q, (size_t)p->T * p->NH * p->D, seed, 2.0f);
    t_fill(p->k, (size_t)p->T * p->NKV * p->D, seed + 1, 2.0f);
    t_fill(p->v, (size_t)p->T * p->NKV * p->D, seed + 2, 1.0f);
    t_fill(p->kc0, cache_elems(p), seed + 3, 2.0f);
    t_fill(p->vc0, cache_elems(p), seed + 4, 1.0f);
    if (p->sinks) t_fill(p->sinks, p->NH, seed + 5, 4.0f);
}

static void prob_free(struct prob *p) {
    free(p->q), free(p->k), free(p->v), free(p->kc0), free(p->vc0), free(p->sinks);
}

// Key (or value) vector of position j for sequence s as the call must see it: this call's row if
// j is one of its positions, else the cache content from before the call.
static const float *kv_at(const struct prob *p, const struct ds_attn_seq *s, const float *mine,
                          const float *cache, int j, int g) {
    if (j >= s->pos0 && j < s->pos0 + s->n_rows)
        return mine + ((size_t)(s->row0 + j - s->pos0) * p->NKV + g) * p->D;
    return cache + (((size_t)s->slot * p->P + j) * p->NKV + g) * p->D;
}

// Direct formula in double: softmax over the allowed keys plus the raw sink logit, sink dropped.
static void reference(const struct prob *p, double *want /* (T, NH, D) */) {
    const double scale = 1.0 / sqrt((double)p->D);
    for (int si = 0; si < p->n_seq; si++) {
        const struct ds_attn_seq *s = &p->seqs[si];
        for (int i = 0; i < s->n_rows; i++) {
            const int t = s->row0 + i, pos = s->pos0 + i;
            const int lo = p->window > 0 ? (pos - p->window + 1 > 0 ? pos - p->window + 1 : 0) : 0;
            for (int h = 0; h < p->NH; h++) {
                const int g = h / (p->NH / p->NKV);
                const float *q = p->q + ((size_t)t * p->NH + h) * p->D;
                double logit[512], m = p->sinks ? p->sinks[h] : -INFINITY;
                for (int j = lo; j <= pos; j++) {
                    const float *kj = kv_at(p, s, p->k, p->kc0, j, g);
                    double d = 0;
                    for (int e = 0; e < p->D; e++) d += (double)q[e] * kj[e];
                    logit[j - lo] = d * scale;
                    m = fmax(m, logit[j - lo]);
                }
                double den = p->sinks ? exp(p->sinks[h] - m) : 0.0;
                double *o = want + ((size_t)t * p->NH + h) * p->D;
                for (int e = 0; e < p->D; e++) o[e] = 0;
                for (int j = lo; j <= pos; j++) {
                    double w = exp(logit[j - lo] - m);
                    den += w;
                    const float *vj = kv_at(p, s, p->v, p->vc0, j, g);
                    for (int e = 0; e < p->D; e++) o[e] += w * vj[e];
                }
                for (int e = 0; e < p->D; e++) o[e] /= den;
            }
        }
    }
}

// Runs the op on fresh copies of the cache; returns its status. out is pre-filled with 1e30 so
// unwritten (padding) rows are visible.
static enum ds_status run(const struct prob *p, float *out, float *kc, float *vc) {
    memcpy(kc, p->kc0, sizeof(float) * cache_elems(p));
    memcpy(vc, p->vc0, sizeof(float) * cache_elems(p));
    for (size_t i = 0; i < (size_t)p->T * p->NH * p->D; i++) out[i] = 1e30f;
    struct ds_attention_args a = {
        .act = DS_ELEM_F32, .cache_dtype = DS_ELEM_F32, .sinks_dtype = DS_ELEM_F32,
        .n_rows = p->T, .n_heads = p->NH, .n_kv_heads = p->NKV, .head_dim = p->D,
        .n_seq = p->n_seq, .seqs = p->seqs, .q = p->q, .k = p->k, .v = p->v, .k_cache = kc,
        .v_cache = vc, .n_slots = p->S, .max_pos = p->P, .window = p->window,
        .scale = (float)(1.0 / sqrt((double)p->D)), .sinks = p->sinks, .out = out};
    return ds_attention_ref(&a);
}

static int row_in_a_seq(const struct prob *p, int t) {
    for (int s = 0; s < p->n_seq; s++)
        if (t >= p->seqs[s].row0 && t < p->seqs[s].row0 + p->seqs[s].n_rows) return 1;
    return 0;
}

static void check_against_reference(struct prob *p) {
    const size_t n = (size_t)p->T * p->NH * p->D;
    float *out = t_alloc(sizeof(float) * n);
    float *kc = t_alloc(sizeof(float) * cache_elems(p)), *vc = t_alloc(sizeof(float) * cache_elems(p));
    double *want = t_alloc(sizeof(double) * n);
    EXPECT_OK(run(p, out, kc, vc));
    reference(p, want);
    const size_t row = (size_t)p->NH * p->D;
    for (int t = 0; t < p->T; t++) {
        if (!row_in_a_seq(p, t)) {
            for (size_t e = 0; e < row; e++) EXPECT(out[t * row + e] == 1e30f); // padding row
            continue;
        }
        // Tolerance: outputs are convex combinations of values |v| <= 1, computed in double and
        // rounded once to float: 1e-6 absolute covers the rounding and exp() differences.
        EXPECT_CLOSE_ARRAY(out + t * row, want + t * row, row, 1e-6, 0.0);
    }
    // The call's k/v rows are now in the cache at their positions.
    for (int s = 0; s < p->n_seq; s++) {
        const struct ds_attn_seq *sq = &p->seqs[s];
        size_t kv_row = (size_t)p->NKV * p->D;
        size_t at = ((size_t)sq->slot * p->P + sq->pos0) * kv_row;
        EXPECT(t_same_bits(kc + at, p->k + sq->row0 * kv_row, sq->n_rows * kv_row));
        EXPECT(t_same_bits(vc + at, p->v + sq->row0 * kv_row, sq->n_rows * kv_row));
    }
    free(out), free(kc), free(vc), free(want);
}

// Prefill (5 rows from position 0), one-token decode, a K+1 = 4 verify straddling the 128-key
// window, and a padding row, all in one call; gpt-oss-like GQA 8:2 and sinks.
static struct prob mixed_problem(int window, int sinks) {
    struct prob p = {.T = 11, .NH = 8, .NKV = 2, .D = 16, .S = 4, .P = 200, .window = window,
                     .n_seq = 3};
    p.seqs[0] = (struct ds_attn_seq){.row0 = 0, .n_rows = 5, .pos0 = 0, .slot = 2};
    p.seqs[1] = (struct ds_attn_seq){.row0 = 5, .n_rows = 1, .pos0 = 9, .slot = 0};
    p.seqs[2] = (struct ds_attn_seq){.row0 = 7, .n_rows = 4, .pos0 = 126, .slot = 3}; // row 6 pads
    prob_fill(&p, 1000 + window + sinks, sinks);
    return p;
}

static void mixed_call_sliding_window_with_sinks(void) {
    struct prob p = mixed_problem(128, 1);
    check_against_reference(&p);
    prob_free(&p);
}

static void mixed_call_full_attention_without_sinks(void) {
    struct prob p = mixed_problem(0, 0);
    check_against_reference(&p);
    prob_free(&p);
}

static void small_window_and_odd_shapes(void) {
    struct prob p = {.T = 7, .NH = 3, .NKV = 1, .D = 5, .S = 2, .P = 40, .window = 3, .n_seq = 2};
    p.seqs[0] = (struct ds_attn_seq){.row0 = 0, .n_rows = 6, .pos0 = 1, .slot = 1};
    p.seqs[1] = (struct ds_attn_seq){.row0 = 6, .n_rows = 1, .pos0 = 0, .slot = 0};
    prob_fill(&p, 77, 1);
    check_against_reference(&p);
    prob_free(&p);
}

// Hand-worked window boundary: all logits equal (q = 0), value of position j = j, W = 4, the
// query at position 10: exactly keys 7..10, mean 8.5. Full attention: mean of 0..10 = 5.
static void window_keeps_exactly_w_keys_including_current(void) {
    enum { P = 16, D = 2 };
    float kc[P * D] = {0}, vc[P * D], q[D] = {0}, k[D] = {0}, v[D] = {10, 10}, out[D];
    for (int j = 0; j < P; j++) vc[j * D] = vc[j * D + 1] = (float)j;
    struct ds_attn_seq seq = {.row0 = 0, .n_rows = 1, .pos0 = 10, .slot = 0};
    struct ds_attention_args a = {.act = DS_ELEM_F32, .cache_dtype = DS_ELEM_F32, .n_rows = 1,
                                  .n_heads = 1, .n_kv_heads = 1, .head_dim = D, .n_seq = 1,
                                  .seqs = &seq, .q = q, .k = k, .v = v, .k_cache = kc,
                                  .v_cache = vc, .n_slots = 1, .max_pos = P, .window = 4,
                                  .scale = 1.0f, .out = out};
    EXPECT_OK(ds_attention_ref(&a));
    EXPECT_NEAR(out[0], 8.5, 1e-6); // (7 + 8 + 9 + 10) / 4; equal weights, exact up to rounding
    a.window = 0;
    EXPECT_OK(ds_attention_ref(&a));
    EXPECT_NEAR(out[0], 5.0, 1e-6);
    a.window = 1; // only the current token
    EXPECT_OK(ds_attention_ref(&a));
    EXPECT_NEAR(out[0], 10.0, 1e-6);
}

// Hand-worked sink: one key with logit 0 and a sink logit ln 3 gives weight 1/(1 + 3) = 0.25 on
// the value. The sink is a raw logit: the scale (0.125 here) must not touch it.
static void sink_is_a_raw_unscaled_logit(void) {
    enum { D = 4 };
    float kc[D], vc[D], q[D] = {0}, k[D] = {1, 2, 3, 4}, v[D] = {4, 8, -4, 2}, out[D];
    float sink[1] = {(float)log(3.0)};
    struct ds_attn_seq seq = {.row0 = 0, .n_rows = 1, .pos0 = 0, .slot = 0};
    struct ds_attention_args a = {.act = DS_ELEM_F32, .cache_dtype = DS_ELEM_F32,
                                  .sinks_dtype = DS_ELEM_F32, .n_rows = 1, .n_heads = 1,
                                  .n_kv_heads = 1, .head_dim = D, .n_seq = 1, .seqs = &seq,
                                  .q = q, .k = k, .v = v, .k_cache = kc, .v_cache = vc,
                                  .n_slots = 1, .max_pos = 1, .scale = 0.125f, .sinks = sink,
                                  .out = out};
    EXPECT_OK(ds_attention_ref(&a));
    // ln 3 rounded to float moves the weight by ~1e-8.
    for (int e = 0; e < D; e++) EXPECT_NEAR(out[e], 0.25 * v[e], 1e-6);
    // bf16 sinks are read as stored: 0x3f80 = 1.0 → weight 1/(1 + e).
    uint16_t sink16[1] = {0x3f80};
    a.sinks = sink16, a.sinks_dtype = DS_ELEM_BF16;
    EXPECT_OK(ds_attention_ref(&a));
    for (int e = 0; e < D; e++) EXPECT_NEAR(out[e], v[e] / (1.0 + exp(1.0)), 1e-6);
}

// GQA: query head h reads KV head h / (NH / NKV): heads 0,1 → 0 and heads 2,3 → 1 (not h % NKV).
static void gqa_maps_consecutive_heads_to_one_kv_head(void) {
    enum { NH = 4, NKV = 2, D = 2 };
    float q[NH * D] = {0}, k[NKV * D] = {0}, v[NKV * D] = {1, 1, 2, 2}, kc[NKV * D],
          vc[NKV * D], out[NH * D];
    struct ds_attn_seq seq = {.row0 = 0, .n_rows = 1, .pos0 = 0, .slot = 0};
    struct ds_attention_args a = {.act = DS_ELEM_F32, .cache_dtype = DS_ELEM_F32, .n_rows = 1,
                                  .n_heads = NH, .n_kv_heads = NKV, .head_dim = D, .n_seq = 1,
                                  .seqs = &seq, .q = q, .k = k, .v = v, .k_cache = kc,
                                  .v_cache = vc, .n_slots = 1, .max_pos = 1, .scale = 1.0f,
                                  .out = out};
    EXPECT_OK(ds_attention_ref(&a));
    EXPECT(out[0] == 1 && out[2] == 1 && out[4] == 2 && out[6] == 2);
}

// A second call at earlier positions overwrites them (the draft's KV rule) and ignores the stale
// entries after its own position.
static void rewriting_earlier_positions_replaces_them(void) {
    struct prob p = {.T = 6, .NH = 2, .NKV = 1, .D = 8, .S = 1, .P = 10, .window = 0, .n_seq = 1};
    p.seqs[0] = (struct ds_attn_seq){.row0 = 0, .n_rows = 6, .pos0 = 0, .slot = 0};
    prob_fill(&p, 5, 0);
    float out[6 * 2 * 8], *kc = t_alloc(sizeof(float) * cache_elems(&p)),
                          *vc = t_alloc(sizeof(float) * cache_elems(&p));
    EXPECT_OK(run(&p, out, kc, vc));
    // Now the cache holds positions 0..5; rewrite position 3 with new rows and attend from it.
    struct prob p2 = p;
    p2.T = 1, p2.n_seq = 1;
    p2.seqs[0] = (struct ds_attn_seq){.row0 = 0, .n_rows = 1, .pos0 = 3, .slot = 0};
    float q2[2 * 8], k2[8], v2[8];
    t_fill(q2, 16, 50, 2.0f), t_fill(k2, 8, 51, 2.0f), t_fill(v2, 8, 52, 1.0f);
    p2.q = q2, p2.k = k2, p2.v = v2, p2.kc0 = kc, p2.vc0 = vc; // the cache after the first call
    check_against_reference(&p2); // reference sees positions 0..2 old, 3 new, 4..5 ignored
    free(kc), free(vc);
    prob_free(&p);
}

// Eight sequences computed together and each alone give the same bits.
static void batch_of_eight_equals_each_alone(void) {
    struct prob p = {.T = 0, .NH = 8, .NKV = 2, .D = 16, .S = 8, .P = 160, .window = 128,
                     .n_seq = 8};
    const int rows[8] = {1, 4, 1, 7, 2, 1, 4, 3}, pos0[8] = {0, 20, 140, 3, 129, 64, 155, 0};
    for (int s = 0; s < 8; s++) {
        p.seqs[s] = (struct ds_attn_seq){.row0 = p.T, .n_rows = rows[s], .pos0 = pos0[s],
                                         .slot = 7 - s};
        p.T += rows[s];
    }
    prob_fill(&p, 4242, 1);
    const size_t row = (size_t)p.NH * p.D, n = (size_t)p.T * row;
    float *all = t_alloc(sizeof(float) * n), *one = t_alloc(sizeof(float) * n);
    float *kc = t_alloc(sizeof(float) * cache_elems(&p)), *vc = t_alloc(sizeof(float) * cache_elems(&p));
    EXPECT_OK(run(&p, all, kc, vc));
    for (int s = 0; s < 8; s++) {
        struct prob alone = p;
        alone.n_seq = 1;
        alone.seqs[0] = p.seqs[s];
        EXPECT_OK(run(&alone, one, kc, vc));
        size_t r0 = (size_t)p.seqs[s].row0 * row;
        EXPECT(t_same_bits(one + r0, all + r0, rows[s] * row));
    }
    free(all), free(one), free(kc), free(vc);
    prob_free(&p);
}

static void bad_sequence_tables_are_reported(void) {
    struct prob p = mixed_problem(128, 1);
    const size_t n = (size_t)p.T * p.NH * p.D;
    float *out = t_alloc(sizeof(float) * n), *kc = t_alloc(sizeof(float) * cache_elems(&p)),
          *vc = t_alloc(sizeof(float) * cache_elems(&p));
    struct prob b = p;
    b.seqs[1].row0 = 3; // overlaps sequence 0
    EXPECT_STATUS(run(&b, out, kc, vc), DS_ERR_ARG);
    EXPECT_ERROR_HAS("sequence 1 rows [3, +1) overlap");
    b = p, b.seqs[2].slot = 2;
    EXPECT_STATUS(run(&b, out, kc, vc), DS_ERR_ARG);
    EXPECT_ERROR_HAS("sequences 0 and 2 share slot 2");
    b = p, b.seqs[1].slot = 4;
    EXPECT_STATUS(run(&b, out, kc, vc), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("uses slot 4 of 4");
    b = p, b.seqs[2].pos0 = 197;
    EXPECT_STATUS(run(&b, out, kc, vc), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("exceed the cache of 200");
    b = p, b.NH = 7; // q is sized for 8 heads, so 7 stays inside it
    EXPECT_STATUS(run(&b, out, kc, vc), DS_ERR_ARG);
    EXPECT_ERROR_HAS("not a multiple");
    free(out), free(kc), free(vc);
    prob_free(&p);
}

int main(void) {
    DS_RUN(mixed_call_sliding_window_with_sinks);
    DS_RUN(mixed_call_full_attention_without_sinks);
    DS_RUN(small_window_and_odd_shapes);
    DS_RUN(window_keeps_exactly_w_keys_including_current);
    DS_RUN(sink_is_a_raw_unscaled_logit);
    DS_RUN(gqa_maps_consecutive_heads_to_one_kv_head);
    DS_RUN(rewriting_earlier_positions_replaces_them);
    DS_RUN(batch_of_eight_equals_each_alone);
    DS_RUN(bad_sequence_tables_are_reported);
    return ds_test_end();
}
