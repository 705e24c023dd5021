// Vocabulary-row ops: softmax with temperature / top-k / top-p, argmax, top-k lists, entropy,
// Σ min(p, q), the draft→target scatter and the d2t map. Expected values are hand-worked or come
// from a sort-based implementation written here.
#include "ds/kernels.h"
#include "test_ops_common.h"

static void softmax_rows(const float *logits, float *probs, int rows, int V, float temp, int k,
                         float top_p) {
    struct ds_softmax_args a = {.act = DS_ELEM_F32, .n_rows = rows, .vocab = V,
                                .temperature = temp, .top_k = k, .top_p = top_p,
                                .logits = logits, .probs = probs};
    EXPECT_OK(ds_softmax_ref(&a));
}

static void softmax_with_temperature_matches_formula(void) {
    enum { R = 3, V = 1001 };
    float *x = t_alloc(sizeof(float) * R * V), *p = t_alloc(sizeof(float) * R * V);
    t_fill(x, (size_t)R * V, 7, 16.0f);
    softmax_rows(x, p, R, V, 0.7f, 0, 1.0f);
    for (int r = 0; r < R; r++) {
        double m = -INFINITY, sum = 0, want[V];
        for (int v = 0; v < V; v++) m = fmax(m, x[r * V + v] / (double)0.7f);
        for (int v = 0; v < V; v++) sum += want[v] = exp(x[r * V + v] / (double)0.7f - m);
        for (int v = 0; v < V; v++) want[v] /= sum;
        // The reference stages x/T as a float: relative error ~1e-7 per exponent argument of
        // magnitude < 25, so 5e-6 relative on p.
        EXPECT_CLOSE_ARRAY(p + r * V, want, V, 1e-12, 5e-6);
    }
    free(x), free(p);
}

static void top_k_keeps_k_with_ties_to_lower_ids(void) {
    float x[8] = {1, 5, 3, 5, 2, 0, 5, 4}, p[8];
    softmax_rows(x, p, 1, 8, 1.0f, 2, 1.0f);
    EXPECT(p[1] == 0.5f && p[3] == 0.5f); // ids 1 and 3 of the three 5s
    EXPECT(p[6] == 0.0f && p[0] == 0.0f && p[7] == 0.0f);
    softmax_rows(x, p, 1, 8, 1.0f, 4, 1.0f); // 5, 5, 5, 4
    double den = 3 * exp(1.0) + 1;
    EXPECT_NEAR(p[7], 1 / den, 1e-7);
    EXPECT_NEAR(p[6], exp(1.0) / den, 1e-7);
    EXPECT(p[2] == 0.0f);
}

// logits ln(0.4, 0.3, 0.2, 0.1): top_p 0.6 keeps {0.4, 0.3}; 0.75 keeps three; 0.3 keeps one.
static void top_p_keeps_the_smallest_prefix_reaching_p(void) {
    float x[4] = {(float)log(0.4), (float)log(0.3), (float)log(0.2), (float)log(0.1)}, p[4];
    softmax_rows(x, p, 1, 4, 1.0f, 0, 0.6f);
    // Float logits move the probabilities by ~1e-8.
    EXPECT_NEAR(p[0], 4.0 / 7, 1e-6);
    EXPECT_NEAR(p[1], 3.0 / 7, 1e-6);
    EXPECT(p[2] == 0.0f && p[3] == 0.0f);
    softmax_rows(x, p, 1, 4, 1.0f, 0, 0.75f);
    EXPECT_NEAR(p[2], 2.0 / 9, 1e-6);
    EXPECT(p[3] == 0.0f);
    softmax_rows(x, p, 1, 4, 1.0f, 0, 0.3f);
    EXPECT(p[0] == 1.0f && p[1] == 0.0f);
    // Four equal tokens, top_p 0.5: the two lowest ids reach it exactly.
    float u[4] = {2, 2, 2, 2};
    softmax_rows(u, p, 1, 4, 1.0f, 0, 0.5f);
    EXPECT(p[0] == 0.5f && p[1] == 0.5f && p[2] == 0.0f && p[3] == 0.0f);
}

struct pv {
    float p;
    int id;
};

static int by_prob_then_id(const void *a, const void *b) {
    const struct pv *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

// Random rows: top-k then top-p against a sort-based filter written here.
static void top_k_and_top_p_match_a_sorting_implementation(void) {
    enum { R = 4, V = 777 };
    float *x = t_alloc(sizeof(float) * R * V), *p = t_alloc(sizeof(float) * R * V);
    float *full = t_alloc(sizeof(float) * V);
    struct pv *s = t_alloc(sizeof(struct pv) * V);
    t_fill(x, (size_t)R * V, 31, 8.0f); // many exact ties: multiples of 1/8
    const int ks[R] = {0, 50, 5, 300};
    const float ps[R] = {0.9f, 0.8f, 1.0f, 0.35f};
    for (int r = 0; r < R; r++) {
        softmax_rows(x + r * V, p + r * V, 1, V, 1.3f, ks[r], ps[r]);
        // Independent: sort logits, keep top k, softmax, sort probs, keep the prefix.
        for (int v = 0; v < V; v++) s[v] = (struct pv){(float)(x[r * V + v] / (double)1.3f), v};
        qsort(s, V, sizeof *s, by_prob_then_id);
        int keep = ks[r] ? ks[r] : V;
        double sum = 0;
        for (int i = 0; i < keep; i++) sum += exp((double)s[i].p - s[0].p);
        for (int v = 0; v < V; v++) full[v] = 0;
        for (int i = 0; i < keep; i++) full[s[i].id] = (float)(exp((double)s[i].p - s[0].p) / sum);
        if (ps[r] < 1.0f) {
            for (int v = 0; v < V; v++) s[v] = (struct pv){full[v], v};
            qsort(s, V, sizeof *s, by_prob_then_id);
            double cum = 0;
            int n = 0;
            while (n < V && cum < ps[r]) cum += s[n++].p;
            for (int i = n; i < V; i++) full[s[i].id] = 0;
            for (int v = 0; v < V; v++) full[v] = (float)(full[v] / cum);
        }
        for (int v = 0; v < V; v++)
            if ((full[v] == 0) != (p[r * V + v] == 0)) {
                DS_FAILF("row %d id %d: kept %d, sorting kept %d", r, v, p[r * V + v] != 0,
                         full[v] != 0);
                break;
            }
        // Renormalised floats of a double computation: 1e-6 relative.
        EXPECT_CLOSE_ARRAY(p + r * V, full, V, 1e-12, 1e-6);
    }
    free(x), free(p), free(full), free(s);
}

static void softmax_rows_are_batch_invariant(void) {
    enum { R = 8, V = 513 };
    float *x = t_alloc(sizeof(float) * R * V), *p = t_alloc(sizeof(float) * R * V),
          *one = t_alloc(sizeof(float) * V);
    t_fill(x, (size_t)R * V, 77, 6.0f);
    softmax_rows(x, p, R, V, 0.9f, 40, 0.85f);
    for (int r = 0; r < R; r++) {
        softmax_rows(x + r * V, one, 1, V, 0.9f, 40, 0.85f);
        EXPECT(t_same_bits(one, p + r * V, V));
    }
    free(x), free(p), free(one);
}

static void softmax_rejects_bad_parameters(void) {
    float x[2] = {0}, p[2];
    struct ds_softmax_args a = {.act = DS_ELEM_F32, .n_rows = 1, .vocab = 2, .temperature = 0.0f,
                                .top_p = 1.0f, .logits = x, .probs = p};
    EXPECT_STATUS(ds_softmax_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("temperature 0");
    a.temperature = 1.0f, a.top_p = 0.0f;
    EXPECT_STATUS(ds_softmax_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("top_p");
}

static void argmax_and_topk_ties_go_to_lowest_id(void) {
    float x[3 * 5] = {1, 3, 3, 2, -1, NAN, 1, NAN, 1, 0, NAN, NAN, NAN, NAN, NAN};
    int32_t ids[3];
    float vals[3];
    struct ds_argmax_args a = {.act = DS_ELEM_F32, .n_rows = 3, .vocab = 5, .x = x, .ids = ids,
                               .values = vals};
    EXPECT_OK(ds_argmax_ref(&a));
    EXPECT(ids[0] == 1 && vals[0] == 3);
    EXPECT(ids[1] == 1 && vals[1] == 1); // NaN skipped, tie 1 at ids 1 and 3
    EXPECT(ids[2] == 0 && isnan(vals[2]));
    float y[6] = {1, 3, 3, 2, 5, 3};
    int32_t tid[4];
    float tv[4];
    struct ds_topk_args t = {.act = DS_ELEM_F32, .n_rows = 1, .vocab = 6, .k = 4, .x = y,
                             .ids = tid, .values = tv};
    EXPECT_OK(ds_topk_ref(&t));
    EXPECT(tid[0] == 4 && tid[1] == 1 && tid[2] == 2 && tid[3] == 5);
    EXPECT(tv[0] == 5 && tv[1] == 3 && tv[3] == 3);
    t.k = 7;
    EXPECT_STATUS(ds_topk_ref(&t), DS_ERR_ARG);
}

static void entropy_and_overlap(void) {
    float p[2 * 4] = {0.25f, 0.25f, 0.25f, 0.25f, 0.5f, 0.5f, 0, 0}, h[2];
    struct ds_entropy_args e = {.n_rows = 2, .vocab = 4, .probs = p, .out = h};
    EXPECT_OK(ds_entropy_ref(&e));
    EXPECT_NEAR(h[0], log(4.0), 1e-7); // float output of a double sum
    EXPECT_NEAR(h[1], log(2.0), 1e-7); // 0·log 0 = 0
    float tp[3] = {0.5f, 0.3f, 0.2f}, tq[3] = {0.2f, 0.3f, 0.5f}, dq[2] = {0.6f, 0.4f}, o;
    struct ds_overlap_args ov = {.n_rows = 1, .vocab_p = 3, .vocab_q = 3, .p = tp, .q = tq,
                                 .out = &o};
    EXPECT_OK(ds_overlap_ref(&ov));
    EXPECT_NEAR(o, 0.2 + 0.3 + 0.2, 1e-7);
    int32_t map[2] = {0, 2}; // draft id 0 -> target 0, draft id 1 -> target 2
    ov.vocab_q = 2, ov.q = dq, ov.q_to_p = map;
    EXPECT_OK(ds_overlap_ref(&ov));
    EXPECT_NEAR(o, 0.5 + 0.2, 1e-7);
    ov.q_to_p = NULL;
    EXPECT_STATUS(ds_overlap_ref(&ov), DS_ERR_MISMATCH);

    // A NaN entry is not a zero: it reaches the sum, whichever side holds it.
    p[2] = NAN;
    EXPECT_OK(ds_entropy_ref(&e));
    EXPECT(isnan(h[0]));
    EXPECT_NEAR(h[1], log(2.0), 1e-7);
    ov.vocab_q = 3, ov.q = tq;
    tp[1] = NAN;
    EXPECT_OK(ds_overlap_ref(&ov));
    EXPECT(isnan(o));
    tp[1] = 0.3f, tq[2] = NAN;
    EXPECT_OK(ds_overlap_ref(&ov));
    EXPECT(isnan(o));
}

// d2t offsets [0, 0, 2, 5] → target ids [0, 1, 4, 8] (spec eagle3 §5: target = draft + d2t).
static void d2t_map_and_vocab_scatter(void) {
    int64_t d2t[4] = {0, 0, 2, 5};
    int32_t map[4];
    EXPECT_OK(ds_d2t_to_map(d2t, 4, 9, map));
    EXPECT(map[0] == 0 && map[1] == 1 && map[2] == 4 && map[3] == 8);
    EXPECT_STATUS(ds_d2t_to_map(d2t, 4, 8, map), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("entry 3 is 5: target id 3 + 5 is outside [0, 8)");
    int64_t huge[2] = {0, INT64_MAX}; // 1 + INT64_MAX once overflowed (undefined behaviour)
    EXPECT_STATUS(ds_d2t_to_map(huge, 2, 9, map), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("entry 1 is 9223372036854775807: target id 1 + 9223372036854775807 is "
                     "outside [0, 9)");
    int64_t bad[3] = {0, 1, 0}; // ids 0, 2, 2: not increasing
    EXPECT_STATUS(ds_d2t_to_map(bad, 3, 9, map), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("entry 2");
    EXPECT_OK(ds_d2t_to_map(NULL, 4, 4, map));
    EXPECT(map[3] == 3);
    EXPECT_STATUS(ds_d2t_to_map(NULL, 4, 9, map), DS_ERR_MISMATCH);

    EXPECT_OK(ds_d2t_to_map(d2t, 4, 9, map));
    float src[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[2 * 9];
    struct ds_vocab_scatter_args s = {.act = DS_ELEM_F32, .n_rows = 2, .src_vocab = 4,
                                      .dst_vocab = 9, .fill = -INFINITY, .src = src, .map = map,
                                      .dst = dst};
    EXPECT_OK(ds_vocab_scatter_ref(&s));
    EXPECT(dst[0] == 1 && dst[1] == 2 && dst[4] == 3 && dst[8] == 4);
    EXPECT(dst[9 + 0] == 5 && dst[9 + 8] == 8);
    EXPECT(isinf(dst[2]) && dst[2] < 0 && isinf(dst[9 + 7]));
    // Argmax over the scattered row lands on the mapped target id.
    int32_t id;
    struct ds_argmax_args am = {.act = DS_ELEM_F32, .n_rows = 1, .vocab = 9, .x = dst, .ids = &id};
    EXPECT_OK(ds_argmax_ref(&am));
    EXPECT_EQ_INT(id, 8);
}

int main(void) {
    DS_RUN(softmax_with_temperature_matches_formula);
    DS_RUN(top_k_keeps_k_with_ties_to_lower_ids);
    DS_RUN(top_p_keeps_the_smallest_prefix_reaching_p);
    DS_RUN(top_k_and_top_p_match_a_sorting_implementation);
    DS_RUN(softmax_rows_are_batch_invariant);
    DS_RUN(softmax_rejects_bad_parameters);
    DS_RUN(argmax_and_topk_ties_go_to_lowest_id);
    DS_RUN(entropy_and_overlap);
    DS_RUN(d2t_map_and_vocab_scatter);
    return ds_test_end();
}
