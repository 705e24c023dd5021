// The EAGLE-3 draft on the CPU reference backend, against the naive double-precision draft of
// tests/model_naive.h fed by the naive target: the three fixture layouts (SpecForge/lmsys,
// speculators with norm_before_fc + norm_before_residual, NVIDIA v3 boundary ids with a
// full-vocabulary head), extend then steps on the draft's own hidden state, the d2t mapping, and
// the greedy chain round (its emitted tokens are exactly plain greedy decoding, its drafts are
// the naive draft's argmax at the positions of eagle3.md §11, and a batch gives each sequence
// what it gets alone).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/backend.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "harness.h"
#include "model_naive.h"

#define CKPT DS_SOURCE_DIR "/tests/fixtures/ckpt/"

// Same argument as test_gptoss.c: fp32 storage of every intermediate against all-double, over the
// target (which feeds the aux states) and the one draft layer; 1e-5 of the largest |logit| is
// ~10x what that rounding produces here, far below what any wiring mistake moves.
#define LOGIT_RTOL 1e-5

static struct ds_backend *be;

struct pair {
    ds_gptoss_t *target;
    ds_eagle3_t *draft;
    struct ds_aux_plan aux;
    ds_safetensors_t *tst, *dst;
    struct ds_draft_config dcfg;
};

static int open_pair(const char *draft_dir, int slots, int pos, int trows, int drows,
                     bool own_embed, struct pair *p) {
    memset(p, 0, sizeof *p);
    struct ds_target_config tc;
    EXPECT_OK(ds_target_config_load(CKPT "target", &tc));
    EXPECT_OK(ds_eagle3_aux_plan(draft_dir, &tc, NULL, &p->aux));
    struct ds_gptoss_plan tp = {.max_slots = slots, .max_pos = pos, .max_rows = trows};
    ds_gptoss_plan_aux(&tp, &p->aux);
    EXPECT_OK(ds_gptoss_create(CKPT "target", be, &tp, NULL, &p->target));
    struct ds_eagle3_plan dp = {.max_slots = slots,
                                .max_pos = pos,
                                .max_rows = drows,
                                .own_embed = own_embed,
                                .full_vocab = true};
    // What create places is what ds_eagle3_measure gives before any target exists (every pair
    // the tests open checks it: each draft layout, own or borrowed embedding).
    struct ds_gptoss_memory measured = {0};
    EXPECT_OK(ds_eagle3_measure(draft_dir, &tc, &tp, be, &dp, &measured));
    if (p->target) EXPECT_OK(ds_eagle3_create(draft_dir, p->target, be, &dp, NULL, &p->draft));
    if (p->draft) {
        struct ds_gptoss_memory placed;
        ds_eagle3_memory_plan(p->draft, &placed);
        EXPECT_EQ_INT(measured.weights, placed.weights);
        EXPECT_EQ_INT(measured.kv, placed.kv);
        EXPECT_EQ_INT(measured.activations, placed.activations);
        EXPECT(placed.weights > 0 && placed.kv > 0 && placed.activations > 0);
    }
    EXPECT_OK(ds_safetensors_open_dir(CKPT "target", &p->tst));
    EXPECT_OK(ds_safetensors_open_dir(draft_dir, &p->dst));
    if (p->draft) p->dcfg = *ds_eagle3_config(p->draft);
    return p->target && p->draft && p->tst && p->dst;
}

static void close_pair(struct pair *p) {
    ds_eagle3_release(p->draft);
    ds_gptoss_release(p->target);
    ds_safetensors_close(p->tst);
    ds_safetensors_close(p->dst);
}

// The naive draft's inputs for a virtual sequence of n rows over the token sequence `seq`:
// rows < n_target are fed the target state of their position, later rows their previous row.
// Returns logits (n, Dv).
static double *naive_draft(struct pair *p, const int32_t *seq, int n, int n_target) {
    const struct ds_target_config *tc = ds_gptoss_config(p->target);
    const int H = (int)tc->hidden_size, L = (int)tc->num_hidden_layers, V = (int)tc->vocab_size;
    const int Dv = (int)p->dcfg.draft_vocab_size;
    const int width = p->aux.n ? p->aux.n * H : H;
    double *bounds = malloc(sizeof(double) * (size_t)(n + 1) * (L + 1) * H);
    double *final_logits = NULL;
    nv_target_run(p->tst, tc, n_target, seq, final_logits, bounds, NULL);
    double *aux = calloc((size_t)n * width, sizeof *aux);
    int *from_prev = calloc((size_t)n, sizeof *from_prev);
    for (int t = 0; t < n; t++) {
        from_prev[t] = t >= n_target;
        if (from_prev[t]) continue;
        if (p->aux.n) {
            for (int j = 0; j < p->aux.n; j++)
                memcpy(aux + ((size_t)t * p->aux.n + j) * H,
                       bounds + ((size_t)t * (L + 1) + p->aux.boundaries[j]) * H,
                       sizeof(double) * H);
        } else { // no-aux head: final post-norm hidden
            nv_rmsnorm(nv_get(p->tst, "model.norm.weight", 0), H, tc->rms_norm_eps,
                       bounds + ((size_t)t * (L + 1) + L) * H, aux + (size_t)t * H);
        }
    }
    const struct ds_tensor_info *lm = ds_safetensors_find(p->dst, "lm_head.weight");
    if (!lm) lm = ds_safetensors_find(p->tst, "lm_head.weight");
    double *logits = malloc(sizeof(double) * (size_t)n * Dv);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++)
        toks[t] = seq[t + 1];
    nv_draft_run(p->dst, &p->dcfg, nv_get(p->tst, "model.embed_tokens.weight", 0), lm, H, n, toks,
                 aux, from_prev, logits);
    (void)V;
    free(bounds), free(aux), free(from_prev), free(toks);
    return logits;
}

// Extend over a 40-token prefix (target states) then two steps on the draft's own hidden state.
static void draft_matches_naive(const char *dir, bool own_embed) {
    enum { N = 40, STEPS = 2 };
    struct pair p;
    if (!open_pair(dir, 1, 64, N, N, own_embed, &p)) {
        close_pair(&p);
        return;
    }
    const int Dv = ds_eagle3_draft_vocab(p.draft);
    int32_t seq[N + STEPS + 1], rows[N];
    nv_tokens(N + STEPS + 1, seq, 3);
    for (int i = 0; i < N; i++)
        rows[i] = i;
    struct ds_attn_seq q = {.row0 = 0, .n_rows = N, .pos0 = 0, .slot = 0};
    struct ds_batch tb = {.n_rows = N, .tokens = seq, .n_seq = 1, .seqs = &q};
    EXPECT_OK(ds_gptoss_forward(p.target, &tb));
    // Row t carries the target state at t and the token at t+1.
    struct ds_batch xb = {.n_rows = N,
                          .tokens = seq + 1,
                          .n_seq = 1,
                          .seqs = &q,
                          .n_logit_rows = N,
                          .logit_rows = rows};
    const void *hidden = p.aux.n ? ds_gptoss_aux(p.target) : ds_gptoss_final_hidden(p.target);
    EXPECT_OK(ds_eagle3_extend(p.draft, &xb, hidden, N, NULL));
    double *ref = naive_draft(&p, seq, N + STEPS, N);
    float *got = malloc(sizeof(float) * (size_t)N * Dv);
    EXPECT_OK(ds_eagle3_download_logits(p.draft, N, got));
    double scale, err = nv_max_err(got, ref, (size_t)N * Dv, &scale);
    printf("  %s extend: max |err| %.3g, logit scale %.3g\n", dir + strlen(CKPT), err, scale);
    EXPECT(err <= LOGIT_RTOL * scale);

    // Greedy ids go through d2t: target id = i + d2t[i] (read here from the tensor).
    int32_t ids[N];
    EXPECT_OK(ds_eagle3_greedy(p.draft, ids));
    const struct ds_tensor_info *d2t = ds_safetensors_find(p.dst, "d2t");
    for (int t = 0; t < N; t++) {
        int best = 0;
        for (int i = 1; i < Dv; i++)
            if (got[(size_t)t * Dv + i] > got[(size_t)t * Dv + best]) best = i;
        int64_t off = 0;
        if (d2t) memcpy(&off, (const char *)d2t->data + 8 * (size_t)best, 8);
        EXPECT_EQ_INT(ids[t], best + off);
    }

    // Steps: positions N, N+1, fed the previous row's output.
    int32_t prev = N - 1;
    for (int s = 0; s < STEPS; s++) {
        int32_t pos = N + s, slot = 0, tok = seq[N + s + 1];
        EXPECT_OK(ds_eagle3_step(p.draft, 1, &tok, &pos, &slot, &prev));
        EXPECT_OK(ds_eagle3_download_logits(p.draft, 1, got));
        err = nv_max_err(got, ref + (size_t)(N + s) * Dv, (size_t)Dv, &scale);
        printf("  %s step %d: max |err| %.3g, logit scale %.3g\n", dir + strlen(CKPT), s + 1, err,
               scale);
        EXPECT(err <= LOGIT_RTOL * scale);
        prev = 0;
    }
    // The full-vocabulary view: the draft's logits at their target ids, -inf elsewhere.
    const void *full = NULL;
    EXPECT_OK(ds_eagle3_scatter_logits(p.draft, &full));
    if (full) {
        const int V = 512;
        const int32_t *map = ds_eagle3_map_host(p.draft);
        int finite = 0;
        for (int v = 0; v < V; v++)
            finite += isfinite(((const float *)full)[v]);
        EXPECT_EQ_INT(finite, Dv);
        EXPECT(((const float *)full)[map[Dv - 1]] == got[Dv - 1]);
    }
    free(ref), free(got);
    close_pair(&p);
}

static void lmsys_matches_naive(void) {
    draft_matches_naive(CKPT "draft-lmsys", false);
}
static void speculators_matches_naive(void) {
    draft_matches_naive(CKPT "draft-speculators", false);
}
static void nvidia_v3_matches_naive(void) {
    draft_matches_naive(CKPT "draft-nvidia-v3", false);
}
// The lmsys fixture ships a copy of the target's embedding: its own table gives the same result.
static void lmsys_own_embed(void) {
    draft_matches_naive(CKPT "draft-lmsys", true);
}

static void bad_input(void) {
    struct pair p;
    if (!open_pair(CKPT "draft-lmsys", 2, 16, 8, 8, false, &p)) {
        close_pair(&p);
        return;
    }
    int32_t tok = 3, pos = 0, slot = 0, prev = 0;
    EXPECT_STATUS(ds_eagle3_step(p.draft, 1, &tok, &pos, &slot, &prev), DS_ERR_ARG);
    EXPECT_ERROR_HAS("before any extend");
    int32_t toks[4] = {1, 2, 3, 4};
    struct ds_attn_seq q = {.row0 = 0, .n_rows = 4, .pos0 = 13, .slot = 1};
    struct ds_batch xb = {.n_rows = 4, .tokens = toks, .n_seq = 1, .seqs = &q};
    EXPECT_STATUS(ds_eagle3_extend(p.draft, &xb, ds_gptoss_aux(p.target), 8, NULL), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("context limit");
    q.pos0 = 0;
    int32_t hrows[4] = {0, 1, 2, 8};
    EXPECT_STATUS(ds_eagle3_extend(p.draft, &xb, ds_gptoss_aux(p.target), 8, hrows), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("hidden row 8");
    struct ds_eagle3_plan dp = {.max_slots = 1, .max_pos = 8, .max_rows = 4, .own_embed = true};
    ds_eagle3_t *d = NULL;
    EXPECT_STATUS(ds_eagle3_create(CKPT "draft-speculators", p.target, be, &dp, NULL, &d),
                  DS_ERR_MISMATCH);
    EXPECT_ERROR_HAS("embed_tokens");
    EXPECT(d == NULL);
    close_pair(&p);
}

// ---- the greedy chain ----

enum { PROMPT = 12, ROUNDS = 4, K = 3, MAXLEN = PROMPT + 1 + ROUNDS * (K + 1) };

struct chain_run {
    int len; // tokens in seq (prompt + generated)
    int32_t seq[MAXLEN];
    int committed[ROUNDS]; // C before each round
    struct ds_chain_result res[ROUNDS];
};

// Runs ROUNDS rounds for n sequences in one batch (slots 0..n-1).
static void run_chain(struct pair *p, int n, const uint32_t *seeds, struct chain_run *out) {
    ds_chain_t *c = NULL;
    EXPECT_OK(ds_chain_create(p->target, p->draft, K, &c));
    if (!c) return;
    const int32_t *prompts[4];
    int lens[4];
    struct ds_chain_seq st[4];
    for (int i = 0; i < n; i++) {
        nv_tokens(PROMPT, out[i].seq, seeds[i]);
        prompts[i] = out[i].seq;
        lens[i] = PROMPT;
        st[i].slot = i;
    }
    EXPECT_OK(ds_chain_prefill(c, n, prompts, lens, st));
    for (int i = 0; i < n; i++) {
        out[i].seq[PROMPT] = st[i].bonus;
        out[i].len = PROMPT + 1;
    }
    for (int r = 0; r < ROUNDS; r++) {
        struct ds_chain_result res[4];
        for (int i = 0; i < n; i++)
            out[i].committed[r] = st[i].committed;
        EXPECT_OK(ds_chain_round(c, n, st, res));
        for (int i = 0; i < n; i++) {
            out[i].res[r] = res[i];
            for (int j = 0; j < res[i].n_emitted; j++)
                out[i].seq[out[i].len++] = res[i].emitted[j];
            EXPECT_EQ_INT(st[i].committed, out[i].len - 1);
            EXPECT_EQ_INT(st[i].bonus, out[i].seq[out[i].len - 1]);
        }
    }
    ds_chain_release(c);
}

// Index of the largest value and its margin over the runner-up.
static int argmax_margin(const double *x, int n, double *margin) {
    int best = 0, second = -1;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[best])
            second = best, best = i;
        else if (second < 0 || x[i] > x[second])
            second = i;
    }
    *margin = x[best] - x[second];
    return best;
}

static void chain_is_greedy_decoding(void) {
    struct pair p;
    if (!open_pair(CKPT "draft-lmsys", 4, 64, 4 * (K + 1) * 4, 64, false, &p)) {
        close_pair(&p);
        return;
    }
    const uint32_t seeds[3] = {21, 22, 23};
    struct chain_run one, many[3];
    run_chain(&p, 1, seeds, &one);
    const int V = 512, Dv = ds_eagle3_draft_vocab(p.draft);
    const int32_t *map = ds_eagle3_map_host(p.draft);

    // 1. The emitted tokens are plain greedy decoding of the naive target. A near-tie (margin
    //    under 1e-4 of the scale) could legitimately differ; report it instead of failing.
    double *logits = malloc(sizeof(double) * MAXLEN * V);
    nv_target_run(p.tst, ds_gptoss_config(p.target), one.len, one.seq, logits, NULL, NULL);
    for (int t = PROMPT; t < one.len; t++) {
        double margin;
        int best = argmax_margin(logits + (size_t)(t - 1) * V, V, &margin);
        if (margin < 1e-4)
            printf("  near-tie at %d (margin %.3g)\n", t, margin);
        else
            EXPECT_EQ_INT(one.seq[t], best);
    }
    // 2. Each round's drafts are the naive draft's greedy tokens: rows 0..C-1 fed by the target
    //    (row C-1 carries the bonus as its token), then rows C.. fed by the previous row.
    int total_accepted = 0;
    for (int r = 0; r < ROUNDS; r++) {
        const int C = one.committed[r];
        int32_t vs[MAXLEN + K];
        memcpy(vs, one.seq, sizeof(int32_t) * (size_t)(C + 1)); // ..., bonus at C
        for (int j = 0; j < K; j++)
            vs[C + 1 + j] = one.res[r].drafted[j];
        double *dl = naive_draft(&p, vs, C + K - 1, C);
        for (int j = 0; j < K; j++) {
            double margin;
            int best = argmax_margin(dl + (size_t)(C - 1 + j) * Dv, Dv, &margin);
            if (margin < 1e-4)
                printf("  draft near-tie round %d d%d\n", r, j + 1);
            else
                EXPECT_EQ_INT(one.res[r].drafted[j], map[best]);
        }
        free(dl);
        EXPECT_EQ_INT(one.res[r].n_emitted, one.res[r].accepted + 1);
        total_accepted += one.res[r].accepted;
    }
    printf("  %d rounds, %d drafts accepted, %d tokens generated\n", ROUNDS, total_accepted,
           one.len - PROMPT);
    free(logits);

    // 3. Three sequences in one batch: the first gets exactly what it got alone.
    run_chain(&p, 3, seeds, many);
    EXPECT_EQ_INT(many[0].len, one.len);
    EXPECT(!memcmp(many[0].seq, one.seq, sizeof(int32_t) * (size_t)one.len));
    for (int r = 0; r < ROUNDS; r++)
        EXPECT(!memcmp(&many[0].res[r], &one.res[r], sizeof one.res[r]));
    close_pair(&p);
}

// ---- transformers / reference goldens (docs/references.md) ----

#define GOLDEN DS_SOURCE_DIR "/tests/fixtures/golden/"
// docs/references.md: fp32 against fp32, summation order only (each ~6e-6 from fp64 here);
// 2e-4 on logits, 1e-4 on h2, >= 100x below the smallest bookkeeping mistake (0.028).
#define GOLDEN_LOGIT_ATOL 2e-4
#define GOLDEN_HIDDEN_ATOL 1e-4

static const struct ds_tensor_info *gget(const ds_safetensors_t *g, const char *fmt, int i) {
    char name[96];
    snprintf(name, sizeof name, fmt, i);
    const struct ds_tensor_info *t = ds_safetensors_find(g, name);
    if (!t) DS_FAILF("golden tensor %s missing", name);
    return t;
}

static const struct ds_tensor_info *round_t(const ds_safetensors_t *g, int r, const char *what) {
    char name[96];
    snprintf(name, sizeof name, "chain.round%d.%s", r, what);
    return ds_safetensors_find(g, name);
}

// Draft logits and h2 for the given aux states (one extend per prompt), the aux boundaries the
// config names, and the 4-round K = 3 chain token for token.
static void golden_draft(const char *name) {
    char ddir[512], file[512];
    snprintf(ddir, sizeof ddir, GOLDEN "%s", name);
    snprintf(file, sizeof file, GOLDEN "%s.golden.safetensors", name);
    ds_safetensors_t *g = NULL;
    if (ds_safetensors_open_file(file, &g) != DS_OK) {
        printf("  skipped: %s not present\n", file);
        return;
    }
    const char *tdir = GOLDEN "tiny-gptoss-a";
    struct ds_target_config tc;
    EXPECT_OK(ds_target_config_load(tdir, &tc));
    struct ds_aux_plan aux;
    EXPECT_OK(ds_eagle3_aux_plan(ddir, &tc, NULL, &aux));
    char bounds[64];
    snprintf(bounds, sizeof bounds, "%lld,%lld,%lld", (long long)aux.boundaries[0],
             (long long)aux.boundaries[1], (long long)aux.boundaries[2]);
    EXPECT_EQ_STR(bounds, ds_safetensors_metadata(g, "aux_boundaries"));

    struct ds_gptoss_plan tp = {.max_slots = 1, .max_pos = 128, .max_rows = 64};
    ds_gptoss_plan_aux(&tp, &aux);
    ds_gptoss_t *t = NULL;
    ds_eagle3_t *d = NULL;
    EXPECT_OK(ds_gptoss_create(tdir, be, &tp, NULL, &t));
    struct ds_eagle3_plan dp = {.max_slots = 1, .max_pos = 128, .max_rows = 64};
    if (t) EXPECT_OK(ds_eagle3_create(ddir, t, be, &dp, NULL, &d));
    if (!d) {
        ds_gptoss_release(t);
        ds_safetensors_close(g);
        return;
    }
    const int H = (int)tc.hidden_size, Dv = ds_eagle3_draft_vocab(d);
    void *aux_dev = NULL;
    EXPECT_OK(be->alloc(be, sizeof(float) * 64 * 3 * (size_t)H, &aux_dev));
    float *got = malloc(sizeof(float) * 64 * (size_t)(Dv > H ? Dv : H));
    for (int p = 0; p < 3; p++) {
        const struct ds_tensor_info *ga = gget(g, "prompt%d.aux", p),
                                    *gids = gget(g, "prompt%d.input_ids", p),
                                    *gl = gget(g, "prompt%d.logits", p),
                                    *gh = gget(g, "prompt%d.hidden", p),
                                    *gam = gget(g, "prompt%d.argmax_target_ids", p);
        if (!ga || !gids || !gl || !gh || !gam) break;
        const int n = (int)gids->numel;
        int32_t toks[64], rows[64], am[64];
        for (int i = 0; i < n; i++)
            toks[i] = (int32_t)nv_i64(gids, (size_t)i), rows[i] = i;
        EXPECT_OK(be->upload(be, aux_dev, ga->data, ga->nbytes)); // f32 rows: the CPU's act
        struct ds_attn_seq q = {.row0 = 0, .n_rows = n, .pos0 = 0, .slot = 0};
        struct ds_batch xb = {.n_rows = n,
                              .tokens = toks,
                              .n_seq = 1,
                              .seqs = &q,
                              .n_logit_rows = n,
                              .logit_rows = rows};
        EXPECT_OK(ds_eagle3_extend(d, &xb, aux_dev, n, NULL));
        EXPECT_OK(ds_eagle3_download_logits(d, n, got));
        double err = nv_max_diff_f32(got, gl->data, (size_t)n * Dv);
        printf("  %s prompt %d: draft logits max |err| %.3g\n", name, p, err);
        EXPECT(err <= GOLDEN_LOGIT_ATOL);
        // Argmax through d2t where the golden's own margin is clear of the tolerance.
        EXPECT_OK(ds_eagle3_greedy(d, am));
        for (int r = 0; r < n; r++) {
            const float *row = (const float *)gl->data + (size_t)r * Dv;
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int v = 0; v < Dv; v++) {
                if (row[v] > b1)
                    b2 = b1, b1 = row[v];
                else if (row[v] > b2)
                    b2 = row[v];
            }
            if (b1 - b2 > 2 * GOLDEN_LOGIT_ATOL) EXPECT_EQ_INT(am[r], nv_i64(gam, (size_t)r));
        }
        EXPECT_OK(be->download(be, got, ds_eagle3_hidden_out(d), sizeof(float) * (size_t)n * H));
        EXPECT(nv_max_diff_f32(got, gh->data, (size_t)n * H) <= GOLDEN_HIDDEN_ATOL);
    }
    free(got);
    be->free(be, aux_dev);

    // The chain on the recorded prompt.
    const struct ds_tensor_info *cp = gget(g, "chain.prompt_ids", 0),
                                *ce = gget(g, "chain.emitted", 0);
    ds_chain_t *c = NULL;
    EXPECT_OK(ds_chain_create(t, d, 3, &c));
    if (cp && ce && c) {
        int32_t prompt[64];
        int n = (int)cp->numel;
        for (int i = 0; i < n; i++)
            prompt[i] = (int32_t)nv_i64(cp, (size_t)i);
        const int32_t *pp = prompt;
        struct ds_chain_seq st = {.slot = 0};
        EXPECT_OK(ds_chain_prefill(c, 1, &pp, &n, &st));
        int32_t stream[64];
        int ns = 0;
        stream[ns++] = st.bonus;
        char acc[32] = "";
        for (int r = 0; r < 4; r++) {
            const struct ds_tensor_info *gc = round_t(g, r, "committed"),
                                        *gpos = round_t(g, r, "extend_positions"),
                                        *gd = round_t(g, r, "draft_tokens"),
                                        *ga = round_t(g, r, "accepted"),
                                        *gem = round_t(g, r, "emitted");
            if (!gc || !gpos || !gd || !ga || !gem) {
                DS_FAILF("golden round %d incomplete", r);
                break;
            }
            EXPECT_EQ_INT(st.committed, nv_i64(gc, 0));
            EXPECT_EQ_INT(st.n_ext, gpos->numel);
            EXPECT_EQ_INT(st.committed - st.n_ext, nv_i64(gpos, 0));
            struct ds_chain_result res;
            EXPECT_OK(ds_chain_round(c, 1, &st, &res));
            for (int j = 0; j < 3; j++)
                EXPECT_EQ_INT(res.drafted[j], nv_i64(gd, (size_t)j));
            EXPECT_EQ_INT(res.accepted, nv_i64(ga, 0));
            EXPECT_EQ_INT(res.n_emitted, gem->numel);
            for (int j = 0; j < res.n_emitted && j < (int)gem->numel; j++)
                EXPECT_EQ_INT(res.emitted[j], nv_i64(gem, (size_t)j));
            for (int j = 0; j < res.n_emitted; j++)
                stream[ns++] = res.emitted[j];
            snprintf(acc + strlen(acc), sizeof acc - strlen(acc), "%s%d", r ? "," : "",
                     res.accepted);
        }
        printf("  %s chain: accepted %s\n", name, acc);
        EXPECT_EQ_STR(acc, ds_safetensors_metadata(g, "chain_accepted"));
        EXPECT_EQ_INT(ns, ce->numel);
        for (int i = 0; i < ns && i < (int)ce->numel; i++)
            EXPECT_EQ_INT(stream[i], nv_i64(ce, (size_t)i));
    }
    ds_chain_release(c);
    ds_eagle3_release(d);
    ds_gptoss_release(t);
    ds_safetensors_close(g);
}

static void golden_lmsys(void) {
    golden_draft("tiny-eagle3-a-lmsys");
}
static void golden_speculators(void) {
    golden_draft("tiny-eagle3-a-speculators");
}

int main(void) {
    if (ds_backend_ref_create(&be) != DS_OK) {
        fprintf(stderr, "%s\n", ds_error_last());
        return 1;
    }
    DS_RUN(lmsys_matches_naive);
    DS_RUN(speculators_matches_naive);
    DS_RUN(nvidia_v3_matches_naive);
    DS_RUN(lmsys_own_embed);
    DS_RUN(bad_input);
    DS_RUN(chain_is_greedy_decoding);
    DS_RUN(golden_lmsys);
    DS_RUN(golden_speculators);
    ds_backend_release(be);
    return ds_test_end();
}
