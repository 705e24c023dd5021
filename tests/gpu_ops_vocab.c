// CUDA vocabulary-row ops against the CPU reference on identical seeded inputs: softmax with
// temperature / top-k / top-p, argmax, top-k lists, entropy, Σ min(p, q), vocab scatter; vocab
// sizes 7, 1000, 1001, 32000 (draft) and 201,088 (gpt-oss); and batch invariance (rows alone vs
// inside batches of 8, 32 and 64). Each row runs on a cluster of 8 blocks that split it into 8
// chunks of ceil(V / 8) rounded up to 8 entries: V = 7 leaves seven blocks empty, V = 1001 ends in
// a partial 8-entry group, and V = 7 or 1001 in f32 misaligns rows for the vector loads.
//
// Two kinds of logits: multiples of 1/8 in [-8, 8] (only 129 distinct values, so a 201,088-entry
// row has ~1,500-entry tie groups: every tie rule — lowest id first — is exercised at every cut)
// and continuous values rounded to bf16. Both are exact in bf16, so bf16 and f32 activations feed
// the same numbers.
//
// Under DS_GPU_TEST_SMALL the real vocabularies (32,000 and 201,088), the batch invariance at
// 201,088 and the 70,000-row case are skipped; softmax, argmax and top-k run at V = 7, 1000, 1001,
// entropy, overlap and scatter at V = 4099 (draft D = 300), which also runs in the normal mode.
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"
#include "gpu_ops_common.h"

static const enum ds_elem dt[2] = {DS_ELEM_F32, DS_ELEM_BF16};
static const char *dt_name(enum ds_elem e) { return e == DS_ELEM_BF16 ? "bf16" : "f32"; }

static const int vocabs[] = {7, 1000, 1001, 32000, 201088};
enum { N_VOCABS = 5, ROWS = 3 };

// 1 (after a log line) when vocabulary V is a real one to skip under DS_GPU_TEST_SMALL.
static int skip_real_vocab(const char *op, int V) {
    if (V < 32000) return 0;
    char name[64];
    snprintf(name, sizeof name, "%s V=%d", op, V);
    return g_small_skip(name);
}

// ROWS rows of logits: kind 0 = ties (k/8), kind 1 = continuous (bf16-rounded).
static float *make_logits(int V, int kind, uint64_t seed) {
    float *x = t_alloc((size_t)ROWS * V * 4);
    if (kind == 0) t_fill(x, (size_t)ROWS * V, seed, 8.0f);
    else {
        g_fill_cont(x, (size_t)ROWS * V, seed, -12.0f, 12.0f);
        g_round_bf16(x, (size_t)ROWS * V);
    }
    return x;
}

// Positions where exactly one of got / want is zero (the kept sets of top-k/top-p differ).
static void expect_same_support(const char *what, const float *got, const float *want, size_t n,
                                size_t V) {
    for (size_t i = 0; i < n; i++) {
        if ((got[i] == 0.0f) != (want[i] == 0.0f)) {
            DS_FAILF("%s: kept sets differ first at row %zu id %zu: got %.9g want %.9g", what,
                     i / V, i % V, (double)got[i], (double)want[i]);
            return;
        }
    }
}

static void softmax_matches_reference(void) {
    const struct {
        float temp;
        int top_k;
        float top_p;
    } cfg[] = {{1.0f, 0, 1.0f},   {0.7f, 0, 1.0f},    {1.0f, 50, 1.0f},   {1.0f, 1, 1.0f},
               {0.8f, 0, 0.9f},   {1.0f, 20, 0.5f},   {1.3f, 0, 0.999f},  {1.0f, 0, 1e-9f},
               {1.0f, 64, 0.95f}};
    const int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    for (int vi = 0; vi < N_VOCABS; vi++) {
        const int V = vocabs[vi];
        const size_t n = (size_t)ROWS * V;
        if (skip_real_vocab("softmax", V)) continue;
        for (int kind = 0; kind < 2; kind++) {
            float *x = make_logits(V, kind, 100 + vi * 2 + kind);
            float *want = t_alloc(n * 4);
            void *d_p = g_alloc(n * 4);
            for (int c = 0; c < n_cfg; c++) {
                struct ds_softmax_args r = {.act = DS_ELEM_F32, .n_rows = ROWS, .vocab = V,
                                            .temperature = cfg[c].temp, .top_k = cfg[c].top_k,
                                            .top_p = cfg[c].top_p, .logits = x, .probs = want};
                EXPECT_OK(ds_softmax_ref(&r));
                for (int ai = 0; ai < 2; ai++) {
                    void *d_x = g_upload_as(x, n, dt[ai]);
                    struct ds_softmax_args a = r;
                    a.act = dt[ai], a.logits = d_x, a.probs = (float *)d_p;
                    EXPECT_OK(ds_softmax_cuda(&a, NULL));
                    float *got = g_download_f(d_p, n, DS_ELEM_F32);
                    char what[128];
                    snprintf(what, sizeof what,
                             "softmax V=%d %s logits act %s T=%g top_k=%d top_p=%g", V,
                             kind ? "continuous" : "tied", dt_name(dt[ai]), cfg[c].temp,
                             cfg[c].top_k, cfg[c].top_p);
                    // The same z bits, exp and sums in double on both sides (only the summation
                    // order differs): one float rounding may flip (2^-23 relative), and a second
                    // one after the top-p renormalisation: 2.4e-7. The kept sets must be equal.
                    expect_same_support(what, got, want, n, V);
                    g_compare(what, got, want, n, V, 1e-37, 2.4e-7);
                    free(got);
                    g_free(d_x);
                }
            }
            g_free(d_p);
            free(x), free(want);
        }
    }
}

static void argmax_and_topk_match_reference(void) {
    for (int vi = 0; vi < N_VOCABS; vi++) {
        const int V = vocabs[vi];
        const size_t n = (size_t)ROWS * V;
        if (skip_real_vocab("argmax/topk", V)) continue;
        for (int kind = 0; kind < 2; kind++) {
            float *x = make_logits(V, kind, 300 + vi * 2 + kind);
            // Row 1: NaNs sprinkled in, one at id 0; row 2 of the small vocab: all NaN.
            for (int v = 0; v < V; v += 3) x[(size_t)V + v] = NAN;
            if (V == 7)
                for (int v = 0; v < V; v++) x[2 * (size_t)V + v] = NAN;
            int32_t want_id[ROWS];
            float want_v[ROWS];
            struct ds_argmax_args r = {.act = DS_ELEM_F32, .n_rows = ROWS, .vocab = V, .x = x,
                                       .ids = want_id, .values = want_v};
            EXPECT_OK(ds_argmax_ref(&r));
            const int ks[] = {1, 5, 64};
            for (int ai = 0; ai < 2; ai++) {
                void *d_x = g_upload_as(x, n, dt[ai]);
                int32_t *d_id = g_alloc(ROWS * 64 * 4);
                float *d_v = g_alloc(ROWS * 64 * 4);
                struct ds_argmax_args a = {.act = dt[ai], .n_rows = ROWS, .vocab = V, .x = d_x,
                                           .ids = d_id, .values = d_v};
                EXPECT_OK(ds_argmax_cuda(&a, NULL));
                int32_t got_id[ROWS];
                float got_v[ROWS];
                g_download(got_id, d_id, sizeof got_id);
                g_download(got_v, d_v, sizeof got_v);
                for (int row = 0; row < ROWS; row++) {
                    // Exact: a selection, no arithmetic.
                    if (got_id[row] != want_id[row] ||
                        !(got_v[row] == want_v[row] || (isnan(got_v[row]) && isnan(want_v[row]))))
                        DS_FAILF("argmax V=%d kind %d act %s row %d: got id %d (%g), want %d (%g)",
                                 V, kind, dt_name(dt[ai]), row, got_id[row], (double)got_v[row],
                                 want_id[row], (double)want_v[row]);
                }
                for (int ki = 0; ki < 3; ki++) {
                    const int K = ks[ki];
                    if (K > V) continue;
                    int32_t *wid = t_alloc((size_t)ROWS * K * 4), *gid = t_alloc((size_t)ROWS * K * 4);
                    float *wv = t_alloc((size_t)ROWS * K * 4), *gv = t_alloc((size_t)ROWS * K * 4);
                    struct ds_topk_args tr = {.act = DS_ELEM_F32, .n_rows = ROWS, .vocab = V,
                                              .k = K, .x = x, .ids = wid, .values = wv};
                    EXPECT_OK(ds_topk_ref(&tr));
                    struct ds_topk_args tg = tr;
                    tg.act = dt[ai], tg.x = d_x, tg.ids = d_id, tg.values = d_v;
                    EXPECT_OK(ds_topk_cuda(&tg, NULL));
                    g_download(gid, d_id, (size_t)ROWS * K * 4);
                    g_download(gv, d_v, (size_t)ROWS * K * 4);
                    for (int i = 0; i < ROWS * K; i++) {
                        if (gid[i] != wid[i] || memcmp(&gv[i], &wv[i], 4)) {
                            DS_FAILF("topk V=%d k=%d kind %d act %s: row %d place %d: got id %d "
                                     "(%g), want %d (%g)",
                                     V, K, kind, dt_name(dt[ai]), i / K, i % K, gid[i],
                                     (double)gv[i], wid[i], (double)wv[i]);
                            break;
                        }
                    }
                    free(wid), free(gid), free(wv), free(gv);
                }
                g_free(d_x), g_free(d_id), g_free(d_v);
            }
            free(x);
        }
    }
}

// One (draft vocabulary D, target vocabulary V) pair; the names of the comparisons carry V.
static void entropy_overlap_scatter_case(int D, int V) {
    // A draft→target map: D increasing target ids (strided with jitter), as ds_d2t_to_map makes.
    int64_t *d2t = t_alloc((size_t)D * 8);
    int32_t *map = t_alloc((size_t)D * 4);
    uint64_t seed = 5;
    int64_t id = 0;
    for (int i = 0; i < D; i++) {
        id += 1 + t_int(&seed, 0, 8);
        d2t[i] = id - i;
    }
    EXPECT_OK(ds_d2t_to_map(d2t, D, V, map));
    float *lp = make_logits(V, 1, 41), *lq = make_logits(D, 1, 42);
    float *p = t_alloc((size_t)ROWS * V * 4), *q = t_alloc((size_t)ROWS * D * 4);
    struct ds_softmax_args sp = {.act = DS_ELEM_F32, .n_rows = ROWS, .vocab = V,
                                 .temperature = 1.0f, .top_p = 1.0f, .logits = lp, .probs = p};
    struct ds_softmax_args sq = {.act = DS_ELEM_F32, .n_rows = ROWS, .vocab = D,
                                 .temperature = 0.5f, .top_p = 1.0f, .logits = lq, .probs = q};
    EXPECT_OK(ds_softmax_ref(&sp));
    EXPECT_OK(ds_softmax_ref(&sq));
    float *d_p = g_upload(p, (size_t)ROWS * V * 4), *d_q = g_upload(q, (size_t)ROWS * D * 4);
    int32_t *d_map = g_upload(map, (size_t)D * 4);
    float *d_out = g_alloc(ROWS * 4);
    float want[ROWS], got[ROWS];

    // Entropy and overlap: double sums on both sides, only the order differs: 2 float ulps.
    struct ds_entropy_args er = {.n_rows = ROWS, .vocab = V, .probs = p, .out = want};
    EXPECT_OK(ds_entropy_ref(&er));
    struct ds_entropy_args eg = {.n_rows = ROWS, .vocab = V, .probs = d_p, .out = d_out};
    EXPECT_OK(ds_entropy_cuda(&eg, NULL));
    g_download(got, d_out, sizeof got);
    char name[64];
    snprintf(name, sizeof name, "entropy V=%d", V);
    g_compare(name, got, want, ROWS, 0, 0.0, 2.4e-7);

    struct ds_overlap_args orr = {.n_rows = ROWS, .vocab_p = V, .vocab_q = D, .p = p, .q = q,
                                  .q_to_p = map, .out = want};
    EXPECT_OK(ds_overlap_ref(&orr));
    struct ds_overlap_args og = {.n_rows = ROWS, .vocab_p = V, .vocab_q = D, .p = d_p, .q = d_q,
                                 .q_to_p = d_map, .out = d_out};
    EXPECT_OK(ds_overlap_cuda(&og, NULL));
    g_download(got, d_out, sizeof got);
    snprintf(name, sizeof name, "overlap mapped V=%d D=%d", V, D);
    g_compare(name, got, want, ROWS, 0, 0.0, 2.4e-7);
    orr.vocab_q = V, orr.q = p, orr.q_to_p = NULL; // identity: Σ min(p, p) = Σ p
    EXPECT_OK(ds_overlap_ref(&orr));
    og.vocab_q = V, og.q = d_p, og.q_to_p = NULL;
    EXPECT_OK(ds_overlap_cuda(&og, NULL));
    g_download(got, d_out, sizeof got);
    snprintf(name, sizeof name, "overlap identity V=%d", V);
    g_compare(name, got, want, ROWS, 0, 0.0, 2.4e-7);

    // A NaN in a row must reach its sums on both sides (a plain min or a p > 0 test drops it):
    // p's row 1 at the target id of draft entry D/2, q's row 2 at draft entry 0.
    p[(size_t)V + (size_t)map[D / 2]] = NAN;
    q[2 * (size_t)D] = NAN;
    g_free(d_p), g_free(d_q);
    d_p = g_upload(p, (size_t)ROWS * V * 4), d_q = g_upload(q, (size_t)ROWS * D * 4);
    er.probs = p, eg.probs = d_p;
    EXPECT_OK(ds_entropy_ref(&er));
    EXPECT(!isnan(want[0]) && isnan(want[1]) && !isnan(want[2]));
    EXPECT_OK(ds_entropy_cuda(&eg, NULL));
    g_download(got, d_out, sizeof got);
    snprintf(name, sizeof name, "entropy with NaN V=%d", V);
    g_compare(name, got, want, ROWS, 0, 0.0, 2.4e-7);
    orr.vocab_q = D, orr.q = q, orr.q_to_p = map;
    og.vocab_q = D, og.p = d_p, og.q = d_q, og.q_to_p = d_map;
    EXPECT_OK(ds_overlap_ref(&orr));
    EXPECT(!isnan(want[0]) && isnan(want[1]) && isnan(want[2]));
    EXPECT_OK(ds_overlap_cuda(&og, NULL));
    g_download(got, d_out, sizeof got);
    snprintf(name, sizeof name, "overlap with NaN V=%d D=%d", V, D);
    g_compare(name, got, want, ROWS, 0, 0.0, 2.4e-7);

    // Scatter: a copy plus a fill, bitwise, in both dtypes.
    for (int ai = 0; ai < 2; ai++) {
        float *wdst = t_alloc((size_t)ROWS * V * 4);
        struct ds_vocab_scatter_args vr = {.act = DS_ELEM_F32, .n_rows = ROWS, .src_vocab = D,
                                           .dst_vocab = V, .fill = -INFINITY, .src = lq,
                                           .map = map, .dst = wdst};
        EXPECT_OK(ds_vocab_scatter_ref(&vr));
        void *d_src = g_upload_as(lq, (size_t)ROWS * D, dt[ai]);
        void *d_dst = g_alloc((size_t)ROWS * V * 4);
        struct ds_vocab_scatter_args vg = vr;
        vg.act = dt[ai], vg.src = d_src, vg.map = d_map, vg.dst = d_dst;
        EXPECT_OK(ds_vocab_scatter_cuda(&vg, NULL));
        float *gdst = g_download_f(d_dst, (size_t)ROWS * V, dt[ai]);
        char what[64];
        snprintf(what, sizeof what, "vocab_scatter act %s V=%d", dt_name(dt[ai]), V);
        g_compare(what, gdst, wdst, (size_t)ROWS * V, V, 0.0, 0.0);
        free(gdst), free(wdst);
        g_free(d_src), g_free(d_dst);
    }
    g_free(d_p), g_free(d_q), g_free(d_map), g_free(d_out);
    free(d2t), free(map), free(lp), free(lq), free(p), free(q);
}

// The real pair (32,000 → 201,088) and a small one that the sanitizer runs can afford: V = 4099
// ends in a partial 8-entry group and misaligns f32 rows for vector loads; the map's strides
// (1..9) keep its 300 ids below V.
static void entropy_overlap_scatter_match_reference(void) { entropy_overlap_scatter_case(32000, 201088); }
static void entropy_overlap_scatter_small(void) { entropy_overlap_scatter_case(300, 4099); }

// Rows alone vs inside batches of 8, 32 and 64 (the row at a different position each time, with
// different neighbours): softmax with every cut, argmax and topk must give the same bits.
static void vocab_ops_are_batch_invariant(void) {
    enum { V = 201088, POOL = 64, K = 20 };
    float *pool = t_alloc((size_t)POOL * V * 4);
    g_fill_cont(pool, (size_t)POOL * V, 8, -10.0f, 10.0f);
    for (size_t i = 0; i < (size_t)POOL * V; i += 7) pool[i] = (float)(int)pool[i]; // some ties
    void *d_pool = g_upload_as(pool, (size_t)POOL * V, DS_ELEM_BF16);
    void *d_x = g_alloc((size_t)POOL * V * 2);
    float *d_p = g_alloc((size_t)POOL * V * 4), *d_v = g_alloc((size_t)POOL * K * 4);
    int32_t *d_id = g_alloc((size_t)POOL * K * 4);
    float *alone = t_alloc((size_t)V * 4), *in = t_alloc((size_t)V * 4);
    int32_t ida[K], idb[K];
    float va[K], vb[K];
    const int batches[] = {8, 32, 64};
    for (int r = 0; r < POOL; r += 21) {
        struct ds_softmax_args s = {.act = DS_ELEM_BF16, .n_rows = 1, .vocab = V,
                                    .temperature = 0.8f, .top_k = 40, .top_p = 0.9f,
                                    .logits = (char *)d_pool + (size_t)r * V * 2, .probs = d_p};
        struct ds_argmax_args am = {.act = DS_ELEM_BF16, .n_rows = 1, .vocab = V, .x = s.logits,
                                    .ids = d_id, .values = d_v};
        struct ds_topk_args tk = {.act = DS_ELEM_BF16, .n_rows = 1, .vocab = V, .k = K,
                                  .x = s.logits, .ids = d_id, .values = d_v};
        EXPECT_OK(ds_softmax_cuda(&s, NULL));
        g_download(alone, d_p, (size_t)V * 4);
        EXPECT_OK(ds_topk_cuda(&tk, NULL));
        g_download(ida, d_id, sizeof ida);
        g_download(va, d_v, sizeof va);
        EXPECT_OK(ds_argmax_cuda(&am, NULL));
        int32_t am_id;
        g_download(&am_id, d_id, 4);
        for (int bi = 0; bi < 3; bi++) {
            const int B = batches[bi], at = (r * 5 + 3) % B;
            for (int j = 0; j < B; j++) {
                const int src = j == at ? r : (r + 1 + j * 11) % POOL;
                G_CHECK(cudaMemcpy((char *)d_x + (size_t)j * V * 2,
                                   (char *)d_pool + (size_t)src * V * 2, (size_t)V * 2,
                                   cudaMemcpyDeviceToDevice));
            }
            s.n_rows = am.n_rows = tk.n_rows = B;
            s.logits = am.x = tk.x = d_x;
            char what[96];
            EXPECT_OK(ds_softmax_cuda(&s, NULL));
            g_download(in, d_p + (size_t)at * V, (size_t)V * 4);
            snprintf(what, sizeof what, "softmax row %d alone vs at %d of %d", r, at, B);
            g_same_bytes(what, alone, in, (size_t)V * 4, 4);
            EXPECT_OK(ds_topk_cuda(&tk, NULL));
            g_download(idb, d_id + (size_t)at * K, sizeof idb);
            g_download(vb, d_v + (size_t)at * K, sizeof vb);
            snprintf(what, sizeof what, "topk row %d alone vs at %d of %d", r, at, B);
            g_same_bytes(what, ida, idb, sizeof ida, 4);
            g_same_bytes(what, va, vb, sizeof va, 4);
            EXPECT_OK(ds_argmax_cuda(&am, NULL));
            int32_t b_id;
            g_download(&b_id, d_id + at, 4);
            EXPECT_EQ_INT(b_id, am_id);
            s.n_rows = am.n_rows = tk.n_rows = 1;
            s.logits = am.x = tk.x = (char *)d_pool + (size_t)r * V * 2;
        }
    }
    free(pool), free(alone), free(in);
    g_free(d_pool), g_free(d_x), g_free(d_p), g_free(d_v), g_free(d_id);
}

// More rows than the grid's 65,535 clusters: the kernels loop over rows. Every op against the
// reference on 70,000 rows of 9 logits (ties included), with the tolerances of the tests above.
static void vocab_ops_loop_over_rows_beyond_grid(void) {
    enum { R = 70000, V = 9, K = 2 };
    const size_t n = (size_t)R * V;
    float *x = t_alloc(n * 4), *want = t_alloc(n * 4);
    t_fill(x, n, 71, 8.0f);
    void *d_x = g_upload_as(x, n, DS_ELEM_F32);
    float *d_p = g_alloc(n * 4), *d_v = g_alloc((size_t)R * K * 4);
    int32_t *d_id = g_alloc((size_t)R * K * 4);
    struct ds_softmax_args sr = {.act = DS_ELEM_F32, .n_rows = R, .vocab = V, .temperature = 0.9f,
                                 .top_k = 5, .top_p = 0.8f, .logits = x, .probs = want};
    EXPECT_OK(ds_softmax_ref(&sr));
    struct ds_softmax_args sg = sr;
    sg.logits = d_x, sg.probs = d_p;
    EXPECT_OK(ds_softmax_cuda(&sg, NULL));
    float *got = g_download_f(d_p, n, DS_ELEM_F32);
    expect_same_support("softmax 70000 rows", got, want, n, V);
    g_compare("softmax 70000 rows", got, want, n, V, 1e-37, 2.4e-7); // as softmax_matches_reference
    free(got);

    int32_t *wid = t_alloc((size_t)R * K * 4), *gid = t_alloc((size_t)R * K * 4);
    float *wv = t_alloc((size_t)R * K * 4), *gv = t_alloc((size_t)R * K * 4);
    struct ds_topk_args tr = {.act = DS_ELEM_F32, .n_rows = R, .vocab = V, .k = K, .x = x,
                              .ids = wid, .values = wv};
    EXPECT_OK(ds_topk_ref(&tr));
    struct ds_topk_args tg = tr;
    tg.x = d_x, tg.ids = d_id, tg.values = d_v;
    EXPECT_OK(ds_topk_cuda(&tg, NULL));
    g_download(gid, d_id, (size_t)R * K * 4);
    g_download(gv, d_v, (size_t)R * K * 4);
    g_same_bytes("topk 70000 rows: ids", gid, wid, (size_t)R * K * 4, 4); // a selection: exact
    g_same_bytes("topk 70000 rows: values", gv, wv, (size_t)R * K * 4, 4);

    struct ds_argmax_args ar = {.act = DS_ELEM_F32, .n_rows = R, .vocab = V, .x = x, .ids = wid,
                                .values = wv};
    EXPECT_OK(ds_argmax_ref(&ar));
    struct ds_argmax_args ag = ar;
    ag.x = d_x, ag.ids = d_id, ag.values = d_v;
    EXPECT_OK(ds_argmax_cuda(&ag, NULL));
    g_download(gid, d_id, (size_t)R * 4);
    g_same_bytes("argmax 70000 rows", gid, wid, (size_t)R * 4, 4);

    struct ds_entropy_args er = {.n_rows = R, .vocab = V, .probs = want, .out = wv};
    EXPECT_OK(ds_entropy_ref(&er));
    float *d_want = g_upload(want, n * 4);
    struct ds_entropy_args eg = {.n_rows = R, .vocab = V, .probs = d_want, .out = d_v};
    EXPECT_OK(ds_entropy_cuda(&eg, NULL));
    g_download(gv, d_v, (size_t)R * 4);
    g_compare("entropy 70000 rows", gv, wv, R, 0, 0.0, 2.4e-7); // double sums, order differs
    free(wid), free(gid), free(wv), free(gv), free(x), free(want);
    g_free(d_x), g_free(d_p), g_free(d_v), g_free(d_id), g_free(d_want);
}

static void vocab_ops_reject_bad_arguments(void) {
    struct ds_softmax_args s = {.act = DS_ELEM_F32, .n_rows = 1, .vocab = 10,
                                .temperature = 0.0f, .top_p = 1.0f, .logits = (void *)16,
                                .probs = (float *)16};
    EXPECT_STATUS(ds_softmax_cuda(&s, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("softmax: temperature 0 must be positive");
    struct ds_topk_args t = {.act = DS_ELEM_F32, .n_rows = 1, .vocab = 10, .k = 65,
                             .x = (void *)16, .ids = (int32_t *)16, .values = (float *)16};
    EXPECT_STATUS(ds_topk_cuda(&t, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("topk: k 65 outside");
    struct ds_overlap_args o = {.n_rows = 1, .vocab_p = 10, .vocab_q = 9, .p = (float *)16,
                                .q = (float *)16, .out = (float *)16};
    EXPECT_STATUS(ds_overlap_cuda(&o, NULL), DS_ERR_MISMATCH);
}

int main(void) {
    G_REQUIRE_GPU();
    DS_RUN(vocab_ops_reject_bad_arguments);
    DS_RUN(softmax_matches_reference);
    DS_RUN(argmax_and_topk_match_reference);
    G_RUN_LARGE(entropy_overlap_scatter_match_reference); // V = 201,088 and 32,000
    DS_RUN(entropy_overlap_scatter_small);                // V = 4099, D = 300
    G_RUN_LARGE(vocab_ops_are_batch_invariant);           // 64 rows of 201,088
    G_RUN_LARGE(vocab_ops_loop_over_rows_beyond_grid);    // 70,000 rows
    return ds_test_end();
}
