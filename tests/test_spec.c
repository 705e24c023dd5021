// The speculative step (ds/spec.h): the accept rules as pure functions against hand-worked cases
// and chi-square tests on tiny vocabularies; the step engine on the CPU reference with the fixture
// target and lmsys draft: lossless greedy (every sequence's tokens equal plain greedy decoding of
// the target alone, at several batch sizes, K and prefill chunk sizes, up to the context limit),
// batch invariance of the per-token records, and record fields checked against their definitions.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/backend.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/rng.h"
#include "ds/safetensors.h"
#include "ds/spec.h"
#include "harness.h"

#define CKPT DS_SOURCE_DIR "/tests/fixtures/ckpt/"
#define GOLD DS_SOURCE_DIR "/tests/fixtures/golden/"

// The pair under test: the golden pair (tests/ref/eagle3_ref.py builds its draft so that it agrees
// with the target sometimes, which exercises the accept paths) or the plain fixture pair.
static const char *T_DIR = GOLD "tiny-gptoss-a", *D_DIR = GOLD "tiny-eagle3-a-lmsys";

// Chi-square critical value at significance 1e-3 for 5 degrees of freedom (V = 6 categories):
// chi2.ppf(0.999, 5) = 20.515 (standard tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4). The
// draws use a fixed seed, so each test is deterministic; a correct sampler fails it with
// probability 1e-3 over seeds.
#define CHI2_CRIT_DF5 20.515
#define N_DRAWS 200000

static struct ds_backend *be;

// ---------------------------------------------------------------------------------------------
// Pure functions

static void test_sample_hand(void) {
    // Inverse CDF: w = {0, 1, 3}, total 4: u = 0.2 -> 0.8 falls in entry 1 (running sum 1);
    // u = 0.3 -> 1.2 falls in entry 2 (running sum 4); u = 0 -> entry 1 (first with mass).
    const float w[3] = {0, 1, 3};
    EXPECT_EQ_INT(ds_spec_sample(w, 3, 0.2), 1);
    EXPECT_EQ_INT(ds_spec_sample(w, 3, 0.3), 2);
    EXPECT_EQ_INT(ds_spec_sample(w, 3, 0.0), 1);
    EXPECT_EQ_INT(ds_spec_sample(w, 3, 0.999999), 2);
    const float z[2] = {0, 0};
    EXPECT_EQ_INT(ds_spec_sample(z, 2, 0.5), -1);
}

static void test_accept_edges(void) {
    const float p[4] = {0.5f, 0.5f, 0.0f, 0.0f};
    int ok;
    int32_t tok;
    // p(d) = 0: never accepted; the correction comes from p without d (here p itself).
    ds_spec_accept_target_only(p, 4, 2, 0.0, 0.75, &ok, &tok);
    EXPECT_EQ_INT(ok, 0);
    EXPECT_EQ_INT(tok, 1); // 0.75 of the mass {0.5, 0.5} lands in entry 1
    // p(d) = 0.5: u = 0.49 accepts, u = 0.5 rejects and then only entry 1 is left.
    ds_spec_accept_target_only(p, 4, 0, 0.49, 0.1, &ok, &tok);
    EXPECT_EQ_INT(ok, 1);
    EXPECT_EQ_INT(tok, 0);
    ds_spec_accept_target_only(p, 4, 0, 0.5, 0.1, &ok, &tok);
    EXPECT_EQ_INT(ok, 0);
    EXPECT_EQ_INT(tok, 1);
    // rejection with q = p: always accepted (u·q < p for every u < 1).
    ds_spec_accept_rejection(p, 4, p, 4, NULL, 1, 0.5f, 0.999, 0.3, &ok, &tok);
    EXPECT_EQ_INT(ok, 1);
    // rejection: p = {0.5,0.5,0,0}, q = {0,0,1,0} (d = 2, p(d) = 0): rejected, residual = p.
    const float q[4] = {0, 0, 1, 0};
    ds_spec_accept_rejection(p, 4, q, 4, NULL, 2, 1.0f, 0.0, 0.25, &ok, &tok);
    EXPECT_EQ_INT(ok, 0);
    EXPECT_EQ_INT(tok, 0);
    // Residual (p - q)+ with p = {0.5,0.5,0,0}, q = {0.4,0.1,0.5,0}: {0.1, 0.4, 0, 0}; d = 2 is
    // rejected at any u (p(d) = 0); u_res = 0.1 -> 0.05 of 0.5 falls in entry 0, 0.5 -> entry 1.
    const float q2[4] = {0.4f, 0.1f, 0.5f, 0};
    ds_spec_accept_rejection(p, 4, q2, 4, NULL, 2, 0.5f, 0.0, 0.1, &ok, &tok);
    EXPECT_EQ_INT(tok, 0);
    ds_spec_accept_rejection(p, 4, q2, 4, NULL, 2, 0.5f, 0.0, 0.5, &ok, &tok);
    EXPECT_EQ_INT(tok, 1);
}

static double chi2(const long *counts, const double *p, int V, long n) {
    double x = 0;
    for (int v = 0; v < V; v++) {
        const double e = p[v] * (double)n;
        x += ((double)counts[v] - e) * ((double)counts[v] - e) / e;
    }
    return x;
}

// Target distribution of the chi-square tests (V = 6) and a draft distribution unlike it.
static const float P6[6] = {0.30f, 0.25f, 0.20f, 0.15f, 0.07f, 0.03f};
static const float Q6[6] = {0.05f, 0.10f, 0.40f, 0.20f, 0.15f, 0.10f};

static void test_chi2_target_only(void) {
    double p[6];
    for (int v = 0; v < 6; v++)
        p[v] = P6[v];
    // The draft is a point mass on argmax q = token 2; emitted tokens must follow p.
    long counts[6] = {0}, acc = 0;
    for (long n = 0; n < N_DRAWS; n++) {
        int ok;
        int32_t tok;
        ds_spec_accept_target_only(P6, 6, 2, ds_rng_uniform(11, 0, (uint64_t)n, DS_RNG_LANE_ACCEPT),
                                   ds_rng_uniform(11, 0, (uint64_t)n, DS_RNG_LANE_RESIDUAL), &ok,
                                   &tok);
        counts[tok]++;
        acc += ok;
    }
    const double x = chi2(counts, p, 6, N_DRAWS);
    printf("  target-only: chi2 = %.2f (critical %.3f), acceptance %.4f\n", x, CHI2_CRIT_DF5,
           (double)acc / N_DRAWS);
    EXPECT(x < CHI2_CRIT_DF5);
    // Acceptance = p(2) = 0.20; binomial sd = sqrt(0.2·0.8/2e5) = 8.9e-4, 5 sd = 4.5e-3.
    EXPECT_NEAR((double)acc / N_DRAWS, 0.20, 4.5e-3);
}

static void test_chi2_rejection(void) {
    double p[6];
    for (int v = 0; v < 6; v++)
        p[v] = P6[v];
    // Identity vocabulary: d ~ q, accept min(1, p/q), residual (p - q)+.
    long counts[6] = {0}, acc = 0;
    for (long n = 0; n < N_DRAWS; n++) {
        int ok;
        int32_t tok;
        int32_t d = ds_spec_sample(Q6, 6, ds_rng_uniform(12, 0, (uint64_t)n, DS_RNG_LANE_DRAFT));
        ds_spec_accept_rejection(P6, 6, Q6, 6, NULL, d, Q6[d],
                                 ds_rng_uniform(12, 0, (uint64_t)n, DS_RNG_LANE_ACCEPT),
                                 ds_rng_uniform(12, 0, (uint64_t)n, DS_RNG_LANE_RESIDUAL), &ok,
                                 &tok);
        counts[tok]++;
        acc += ok;
    }
    double x = chi2(counts, p, 6, N_DRAWS);
    printf("  rejection: chi2 = %.2f (critical %.3f), acceptance %.4f\n", x, CHI2_CRIT_DF5,
           (double)acc / N_DRAWS);
    EXPECT(x < CHI2_CRIT_DF5);
    // Acceptance = Σ min(p, q) = .05 + .10 + .20 + .15 + .07 + .03 = 0.60 (hand sum);
    // sd = sqrt(0.6·0.4/2e5) = 1.1e-3, 5 sd = 5.5e-3.
    EXPECT_NEAR((double)acc / N_DRAWS, 0.60, 5.5e-3);

    // A draft vocabulary of 4 mapped into the 6 target ids (d2t): map = {5, 0, 2, 3}.
    const int32_t map[4] = {5, 0, 2, 3};
    const float qd[4] = {0.40f, 0.10f, 0.30f, 0.20f}; // q over target ids: {.1,0,.3,.2,0,.4}
    int32_t inv[6];
    for (int v = 0; v < 6; v++)
        inv[v] = -1;
    for (int i = 0; i < 4; i++)
        inv[map[i]] = i;
    memset(counts, 0, sizeof counts);
    acc = 0;
    for (long n = 0; n < N_DRAWS; n++) {
        int ok;
        int32_t tok;
        int32_t di = ds_spec_sample(qd, 4, ds_rng_uniform(13, 0, (uint64_t)n, DS_RNG_LANE_DRAFT));
        ds_spec_accept_rejection(P6, 6, qd, 4, inv, map[di], qd[di],
                                 ds_rng_uniform(13, 0, (uint64_t)n, DS_RNG_LANE_ACCEPT),
                                 ds_rng_uniform(13, 0, (uint64_t)n, DS_RNG_LANE_RESIDUAL), &ok,
                                 &tok);
        counts[tok]++;
        acc += ok;
    }
    x = chi2(counts, p, 6, N_DRAWS);
    printf("  rejection with d2t: chi2 = %.2f, acceptance %.4f\n", x, (double)acc / N_DRAWS);
    EXPECT(x < CHI2_CRIT_DF5);
    // Σ min(p, q) with q = {.1, 0, .3, .2, 0, .4} over target ids: .1+0+.2+.15+0+.03 = 0.48.
    EXPECT_NEAR((double)acc / N_DRAWS, 0.48, 5.6e-3);
}

// ---------------------------------------------------------------------------------------------
// The engine on the fixtures

struct pair {
    ds_gptoss_t *target;
    ds_eagle3_t *draft;
    ds_spec_t *spec;
};

static int open_pair(const struct ds_spec_config *cfg, int slots, int pos, struct pair *p) {
    memset(p, 0, sizeof *p);
    struct ds_target_config tc;
    struct ds_aux_plan aux;
    EXPECT_OK(ds_target_config_load(T_DIR, &tc));
    EXPECT_OK(ds_eagle3_aux_plan(D_DIR, &tc, NULL, &aux));
    struct ds_gptoss_plan tp = {0};
    struct ds_eagle3_plan dp = {0};
    ds_spec_plan(cfg, slots, pos, &tp, &dp);
    ds_gptoss_plan_aux(&tp, &aux);
    EXPECT_OK(ds_gptoss_create(T_DIR, be, &tp, NULL, &p->target));
    if (p->target)
        EXPECT_OK(ds_eagle3_create(D_DIR, p->target, be, &dp, NULL, &p->draft));
    if (p->draft) EXPECT_OK(ds_spec_create(p->target, p->draft, cfg, &p->spec));
    return p->spec != NULL;
}

static void close_pair(struct pair *p) {
    ds_spec_release(p->spec);
    ds_eagle3_release(p->draft);
    ds_gptoss_release(p->target);
}

// Plain greedy decoding of the target alone (one slot): up to n tokens after the prompt, stopping
// where a token would sit at or past max_pos. Returns the count.
static int plain_greedy(const int32_t *prompt, int len, int n, int max_pos, int32_t *out) {
    ds_gptoss_t *m = NULL;
    struct ds_gptoss_plan tp = {.max_slots = 1, .max_pos = max_pos, .max_rows = len,
                                .max_logit_rows = 1};
    EXPECT_OK(ds_gptoss_create(T_DIR, be, &tp, NULL, &m));
    if (!m) return 0;
    const int V = (int)ds_gptoss_config(m)->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int count = 0;
    int32_t tok = 0, last = len - 1;
    struct ds_attn_seq q = {.row0 = 0, .n_rows = len, .pos0 = 0, .slot = 0};
    struct ds_batch b = {.n_rows = len, .tokens = prompt, .n_seq = 1, .seqs = &q,
                         .n_logit_rows = 1, .logit_rows = &last};
    for (int pos = len; count < n && pos < max_pos; pos++) {
        if (ds_gptoss_forward(m, &b) != DS_OK) break;
        ds_gptoss_download_logits(m, 1, logits);
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v; // ties: lower id, as the argmax op
        out[count++] = tok = best;
        q = (struct ds_attn_seq){.row0 = 0, .n_rows = 1, .pos0 = pos, .slot = 0};
        b.n_rows = 1;
        b.tokens = &tok;
        last = 0;
    }
    free(logits);
    ds_gptoss_release(m);
    return count;
}

#define NSEQ 5
#define GEN 20

static int32_t prompt_token(int s, int i) {
    return (int32_t)((s * 131 + i * 37 + 11) % 300); // inside the fixture's 512-token vocabulary
}
static const int LENS[NSEQ] = {9, 20, 3, 13, 30};

// Runs the engine over NSEQ prompts at batch size B (B live sequences, later ones admitted as
// earlier ones end after GEN tokens) and checks every sequence's tokens against plain greedy.
static void check_lossless(int B, int K, int chunk, int max_pos, long *accepted_out) {
    struct ds_spec_config cfg = {.rule = DS_SPEC_GREEDY, .k = K, .temperature = 1.0f,
                                 .top_p = 1.0f, .seed = 0, .prefill_chunk = chunk};
    struct pair p;
    if (!open_pair(&cfg, B, max_pos, &p)) return;
    static int32_t want[NSEQ][GEN];
    static int n_want[NSEQ], want_pos;
    static const char *want_dir;
    int32_t prompts[NSEQ][32], got[NSEQ][GEN + 32];
    int n_got[NSEQ] = {0};
    for (int s = 0; s < NSEQ; s++)
        for (int i = 0; i < LENS[s]; i++)
            prompts[s][i] = prompt_token(s, i);
    if (want_pos != max_pos || want_dir != T_DIR) { // plain greedy once per context and target
        for (int s = 0; s < NSEQ; s++)
            n_want[s] = plain_greedy(prompts[s], LENS[s], GEN, max_pos, want[s]);
        want_pos = max_pos;
        want_dir = T_DIR;
    }
    struct ds_spec_seq seq[NSEQ];
    int slot_seq[64], next = 0;
    for (int i = 0; i < B; i++)
        slot_seq[i] = -1;
    struct ds_spec_result res[64];
    struct ds_spec_seq *live[64], *newp[64];
    const int32_t *pp[64];
    int lens[64];
    long accepted = 0;
    for (int iter = 0; iter < 1000; iter++) {
        int n_new = 0;
        for (int slot = 0; slot < B && next < NSEQ; slot++) {
            if (slot_seq[slot] >= 0) continue;
            memset(&seq[next], 0, sizeof seq[next]);
            seq[next].slot = slot;
            seq[next].key = (uint64_t)next;
            slot_seq[slot] = next;
            newp[n_new] = &seq[next];
            pp[n_new] = prompts[next];
            lens[n_new++] = LENS[next];
            next++;
        }
        if (n_new) EXPECT_OK(ds_spec_prefill(p.spec, n_new, newp, pp, lens));
        for (int j = 0; j < n_new; j++) {
            int s = (int)(newp[j] - seq);
            EXPECT(!seq[s].nonfinite); // finite logits: the prefill's check must not fire
            got[s][n_got[s]++] = seq[s].bonus;
        }
        int n = 0;
        for (int slot = 0; slot < B; slot++) {
            int s = slot_seq[slot];
            if (s < 0) continue;
            if (n_got[s] >= GEN || seq[s].committed > max_pos - 2) {
                slot_seq[slot] = -1; // done: the slot takes the next prompt
                continue;
            }
            live[n++] = &seq[s];
        }
        if (n == 0) {
            if (next >= NSEQ) break;
            continue;
        }
        if (ds_spec_step(p.spec, n, live, res) != DS_OK) {
            DS_FAILF("step: %s", ds_error_last());
            break;
        }
        for (int i = 0; i < n; i++) {
            int s = (int)(live[i] - seq);
            EXPECT(!res[i].nonfinite);
            EXPECT_EQ_INT(res[i].n_emitted, res[i].accepted + 1);
            EXPECT(res[i].drafted <= K);
            accepted += res[i].accepted;
            for (int j = 0; j < res[i].n_emitted; j++)
                got[s][n_got[s]++] = res[i].emitted[j];
        }
    }
    for (int s = 0; s < NSEQ; s++) {
        int n = n_got[s] < n_want[s] ? n_got[s] : n_want[s];
        if (n_got[s] > GEN) n = GEN; // the last step may overshoot GEN: compare the first GEN
        EXPECT(n_got[s] >= n_want[s]);
        for (int i = 0; i < n && i < n_want[s]; i++)
            if (got[s][i] != want[s][i]) {
                DS_FAILF("B=%d K=%d chunk=%d seq %d token %d: spec %d, plain greedy %d", B, K,
                         chunk, s, i, got[s][i], want[s][i]);
                break;
            }
    }
    *accepted_out += accepted;
    close_pair(&p);
}

static void test_lossless_greedy(void) {
    long accepted = 0;
    // Batch sizes 1, 2 and 5 (all five prompts in flight), K = 1, 3, 5, prefill chunks that
    // split prompts (7) or not (512).
    check_lossless(1, 3, 512, 256, &accepted);
    check_lossless(2, 1, 7, 256, &accepted);
    check_lossless(5, 5, 7, 256, &accepted);
    // Near the context limit (max_pos 40: the 30-token prompt has 9 positions left, fewer than
    // GEN): the engine drafts fewer tokens and stops exactly where plain decoding stops.
    check_lossless(2, 3, 8, 40, &accepted);
    printf("  accepted drafts over the golden-pair runs: %ld\n", accepted);
    EXPECT(accepted > 0); // the accept path ran, not only corrections
    // The plain fixture pair (another aux convention, a draft that never agrees).
    T_DIR = CKPT "target";
    D_DIR = CKPT "draft-lmsys";
    check_lossless(3, 3, 512, 256, &accepted);
    T_DIR = GOLD "tiny-gptoss-a";
    D_DIR = GOLD "tiny-eagle3-a-lmsys";
}

// The records of one sequence are the same alone (B = 1) and inside a batch of 4, for the
// sampling rules (keyed draws) and greedy.
static void check_invariance(enum ds_spec_rule rule) {
    struct ds_spec_config cfg = {.rule = rule, .k = 3, .temperature = 0.8f, .top_p = 0.95f,
                                 .seed = 7, .prefill_chunk = 16};
    struct pair p1, p4;
    if (!open_pair(&cfg, 1, 128, &p1)) return;
    if (!open_pair(&cfg, 4, 128, &p4)) {
        close_pair(&p1);
        return;
    }
    int32_t prompts[4][32];
    const int32_t *pp[4];
    int lens[4] = {12, 20, 5, 17};
    struct ds_spec_seq a = {.slot = 0, .key = 42}, b[4];
    struct ds_spec_seq *ap = &a, *bp[4];
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < lens[s]; i++)
            prompts[s][i] = prompt_token(s + 7, i);
        memset(&b[s], 0, sizeof b[s]);
        b[s].slot = 3 - s; // other slots than alone
        b[s].key = s == 2 ? 42 : (uint64_t)(100 + s);
        bp[s] = &b[s];
        pp[s] = prompts[s];
    }
    EXPECT_OK(ds_spec_prefill(p1.spec, 1, &ap, &pp[2], &lens[2]));
    EXPECT_OK(ds_spec_prefill(p4.spec, 4, bp, pp, lens));
    EXPECT_EQ_INT(a.bonus, b[2].bonus);
    struct ds_spec_result r1, r4[4];
    for (int step = 0; step < 6; step++) {
        EXPECT_OK(ds_spec_step(p1.spec, 1, &ap, &r1));
        EXPECT_OK(ds_spec_step(p4.spec, 4, bp, r4));
        EXPECT_EQ_INT(r1.drafted, r4[2].drafted);
        EXPECT_EQ_INT(r1.accepted, r4[2].accepted);
        EXPECT(memcmp(r1.emitted, r4[2].emitted, sizeof r1.emitted) == 0);
        EXPECT(memcmp(r1.distinct_experts, r4[2].distinct_experts,
                      sizeof r1.distinct_experts) == 0);
        if (memcmp(r1.drafts, r4[2].drafts, sizeof r1.drafts) != 0)
            DS_FAILF("rule %s step %d: draft records differ alone and in a batch of 4",
                     ds_spec_rule_name(rule), step);
        // Fields against their definitions.
        for (int j = 0; j < r1.drafted; j++) {
            const struct ds_rec_draft *d = &r1.drafts[j];
            EXPECT_EQ_INT(d->position, j + 1);
            EXPECT_EQ_INT(d->context_len, r1.context_len + (uint32_t)j + 1);
            EXPECT_EQ_INT(d->accepted, j < r1.accepted);
            EXPECT(d->p_draft >= 0 && d->p_draft <= 1 && d->q_draft > 0 && d->q_draft <= 1);
            EXPECT(d->p_target >= d->p_draft);        // the target's top-1 bounds every p
            EXPECT(d->margin >= 0 && d->margin <= d->p_target);
            EXPECT(d->expected_accept >= 0 && d->expected_accept <= 1.0001f);
            EXPECT(d->entropy_target >= 0 && d->entropy_draft >= 0);
            EXPECT_EQ_INT(d->channel, DS_REC_CHANNEL_OTHER); // no tracker attached
            if (rule == DS_SPEC_GREEDY)
                EXPECT_EQ_INT(d->accepted, d->draft_token == d->target_token && j < r1.accepted);
        }
        for (int l = 0; l < 4; l++) // 4 layers, top-4 of 8 experts over K+1 rows: 4..8
            EXPECT(r1.distinct_experts[l] >= 4 && r1.distinct_experts[l] <= 8);
        EXPECT_EQ_INT(r1.distinct_experts[4], 0);
    }
    close_pair(&p1);
    close_pair(&p4);
}

static void test_batch_invariance(void) {
    check_invariance(DS_SPEC_GREEDY);
    check_invariance(DS_SPEC_TARGET_ONLY);
    check_invariance(DS_SPEC_REJECTION);
}

// Verify padding (cfg.pad_sizes): 4 sequences at K = 3 verify 16 rows, run as 32 (sizes 2, 8,
// 32) or as 100 (one size: 84 dummy rows over scratch slots of 48 positions, so 2 dummy
// sequences in 3 slots); the records are those of the unpadded engine bit for bit, the target
// really ran the padded count, and the engine still has 4 slots for sequences.
static void check_padding(enum ds_spec_rule rule, const int32_t *sizes, int n_sizes,
                          int want_rows) {
    struct ds_spec_config cfg = {.rule = rule, .k = 3, .temperature = 0.8f, .top_p = 0.95f,
                                 .seed = 7, .prefill_chunk = 16};
    struct ds_spec_config padded = cfg;
    padded.n_pad_sizes = n_sizes;
    memcpy(padded.pad_sizes, sizes, sizeof(int32_t) * (size_t)n_sizes);
    struct pair a, b;
    if (!open_pair(&cfg, 4, 48, &a)) return;
    if (!open_pair(&padded, 4, 48, &b)) {
        close_pair(&a);
        return;
    }
    EXPECT_EQ_INT(ds_spec_max_slots(b.spec), 4);
    EXPECT_EQ_INT(ds_gptoss_plan_of(b.target)->max_slots, 4 + ds_spec_pad_slots(&padded, 48));
    int32_t prompts[4][20];
    const int32_t *pp[4];
    int lens[4] = {12, 20, 5, 17};
    struct ds_spec_seq qa[4], qb[4], *pa[4], *pb[4];
    for (int i = 0; i < 4; i++) {
        for (int t = 0; t < lens[i]; t++)
            prompts[i][t] = prompt_token(i + 3, t);
        pp[i] = prompts[i];
        qa[i] = (struct ds_spec_seq){.slot = i, .key = (uint64_t)(10 + i)};
        qb[i] = qa[i];
        pa[i] = &qa[i], pb[i] = &qb[i];
    }
    EXPECT_OK(ds_spec_prefill(a.spec, 4, pa, pp, lens));
    EXPECT_OK(ds_spec_prefill(b.spec, 4, pb, pp, lens));
    struct ds_spec_result ra[4], rb[4];
    for (int step = 0; step < 5; step++) {
        EXPECT_OK(ds_spec_step(a.spec, 4, pa, ra));
        EXPECT_OK(ds_spec_step(b.spec, 4, pb, rb));
        int rows = 0;
        for (int i = 0; i < 4; i++)
            rows += ra[i].drafted + 1;
        EXPECT_EQ_INT(ds_gptoss_last_rows(a.target), rows);
        EXPECT_EQ_INT(ds_gptoss_last_rows(b.target), ds_spec_padded_rows(&padded, rows));
        if (step == 0) EXPECT_EQ_INT(ds_gptoss_last_rows(b.target), want_rows);
        if (memcmp(ra, rb, sizeof ra) != 0)
            DS_FAILF("rule %s, %d pad sizes, step %d: the padded verify's records differ",
                     ds_spec_rule_name(rule), n_sizes, step);
    }
    close_pair(&a);
    close_pair(&b);
}

static void test_verify_padding(void) {
    static const int32_t three[] = {2, 8, 32}, one[] = {100};
    EXPECT_EQ_INT(ds_spec_pad_slots(&(struct ds_spec_config){.n_pad_sizes = 1,
                                                              .pad_sizes = {100}}, 48), 3);
    check_padding(DS_SPEC_GREEDY, three, 3, 32);
    check_padding(DS_SPEC_REJECTION, three, 3, 32);
    check_padding(DS_SPEC_GREEDY, one, 1, 100);
    // Beyond the largest size a verify runs as it is; sizes must ascend.
    struct ds_spec_config c = {.rule = DS_SPEC_GREEDY, .k = 3, .temperature = 1, .top_p = 1,
                               .prefill_chunk = 16, .n_pad_sizes = 2, .pad_sizes = {4, 8}};
    EXPECT_EQ_INT(ds_spec_padded_rows(&c, 9), 9);
    EXPECT_EQ_INT(ds_spec_padded_rows(&c, 5), 8);
    EXPECT_OK(ds_spec_config_check(&c));
    c.pad_sizes[1] = 4;
    EXPECT_STATUS(ds_spec_config_check(&c), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("verify pad sizes must ascend within 1..65535 (entry 1 is 4)");
}


// A target whose lm_head row 7 is NaN: every logit row holds one NaN logit, so every p of the
// row is NaN (the softmax sum is). The prefill (its first token) and the step must each report
// the sequence nonfinite (docs/cli.md, "Stops") for every rule, not take a token or accept drafts
// against NaN probabilities.
static void test_nan_logit(void) {
    char dir[512], cfg_dst[600], st_dst[600];
    if (snprintf(dir, sizeof dir, "%s/ds_t_XXXXXX", DS_BINARY_DIR) >= (int)sizeof dir ||
        !mkdtemp(dir)) {
        DS_FAILF("cannot make a directory under %s", DS_BINARY_DIR);
        return;
    }
    snprintf(cfg_dst, sizeof cfg_dst, "%s/config.json", dir);
    snprintf(st_dst, sizeof st_dst, "%s/model.safetensors", dir);
    ds_safetensors_t *st = NULL;
    EXPECT_OK(ds_safetensors_open_file(GOLD "tiny-gptoss-a/model.safetensors", &st));
    const struct ds_tensor_info *lm = st ? ds_safetensors_find(st, "lm_head.weight") : NULL;
    EXPECT(lm && lm->dtype == DS_DTYPE_BF16 && lm->ndim == 2);
    if (lm && lm->dtype == DS_DTYPE_BF16 && lm->ndim == 2) {
        const uint64_t row = (uint64_t)lm->shape[1] * 2;
        EXPECT(ds_t_copy_with_nan(GOLD "tiny-gptoss-a/config.json", cfg_dst, 0, 0));
        EXPECT(ds_t_copy_with_nan(GOLD "tiny-gptoss-a/model.safetensors", st_dst,
                             lm->file_offset + 7 * row, row));
    }
    ds_safetensors_close(st);
    const char *saved = T_DIR;
    T_DIR = dir;
    for (int rule = 0; rule < DS_SPEC_RULE_COUNT; rule++) {
        struct ds_spec_config cfg = {.rule = (enum ds_spec_rule)rule, .k = 3, .temperature = 1.0f,
                                     .top_p = 1.0f, .seed = 3, .prefill_chunk = 16};
        struct pair p;
        if (!open_pair(&cfg, 1, 64, &p)) {
            close_pair(&p);
            break;
        }
        int32_t prompt[10];
        for (int i = 0; i < 10; i++)
            prompt[i] = prompt_token(1, i);
        const int32_t *pp = prompt;
        int len = 10;
        struct ds_spec_seq s = {.slot = 0, .key = 5}, *sp = &s;
        struct ds_spec_result res;
        EXPECT_OK(ds_spec_prefill(p.spec, 1, &sp, &pp, &len));
        // The prompt's last logit row holds the NaN too: the argmax skips it, p does not.
        if (!s.nonfinite)
            DS_FAILF("rule %s: a NaN logit in the prompt's last row, but the prefill does not "
                     "mark the sequence nonfinite (first token %d)",
                     ds_spec_rule_name((enum ds_spec_rule)rule), s.bonus);
        s.nonfinite = 0; // the step's own check, as if the prefill had missed it
        EXPECT_OK(ds_spec_step(p.spec, 1, &sp, &res));
        if (!res.nonfinite)
            DS_FAILF("rule %s: a NaN logit in every verify row, but the step is not nonfinite "
                     "(accepted %d)", ds_spec_rule_name((enum ds_spec_rule)rule), res.accepted);
        EXPECT_EQ_INT(res.n_emitted, 0);
        EXPECT_EQ_INT(s.committed, 10); // left as it was
        // The drafts are recorded as they happened; their p-side figures must read NaN, not
        // the 0 a sum that skips NaN entries would give.
        for (int j = 0; j < res.drafted; j++)
            if (!isnan(res.drafts[j].entropy_target) || !isnan(res.drafts[j].expected_accept) ||
                !isnan(res.drafts[j].p_target) || !isnan(res.drafts[j].margin))
                DS_FAILF("rule %s: draft %d of a NaN row records entropy_target %g, "
                         "expected_accept %g, p_target %g, margin %g (want NaN)",
                         ds_spec_rule_name((enum ds_spec_rule)rule), j,
                         res.drafts[j].entropy_target, res.drafts[j].expected_accept,
                         res.drafts[j].p_target, res.drafts[j].margin);
        close_pair(&p);
    }
    T_DIR = saved;
    unlink(cfg_dst);
    unlink(st_dst);
    rmdir(dir);
}

static void test_bad_input(void) {
    struct ds_spec_config cfg = {.rule = DS_SPEC_GREEDY, .k = 0, .temperature = 1.0f,
                                 .top_p = 1.0f, .prefill_chunk = 8};
    EXPECT_STATUS(ds_spec_config_check(&cfg), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("K = 0");
    cfg.k = 3;
    cfg.top_p = 0;
    EXPECT_STATUS(ds_spec_config_check(&cfg), DS_ERR_RANGE);
    enum ds_spec_rule r;
    EXPECT_STATUS(ds_spec_rule_parse("typical", &r), DS_ERR_ARG);
    EXPECT_ERROR_HAS("typical");
    EXPECT_OK(ds_spec_rule_parse("target-only", &r));
    EXPECT_EQ_INT(r, DS_SPEC_TARGET_ONLY);
    // The plan check run before any model loads: gpt-oss's vocabulary of 201088 leaves room
    // for 10679 verify rows of int32 element ids (64 sequences at K = 16 fit, 1024 do not).
    struct ds_target_config tc = {
        .vocab_size = 201088, .num_local_experts = 128, .num_hidden_layers = 36};
    cfg.top_p = 1;
    cfg.k = 16;
    EXPECT_OK(ds_spec_plan_check(&cfg, 64, &tc));
    EXPECT_STATUS(ds_spec_plan_check(&cfg, 1024, &tc), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("batch size 1024 with K = 16 gives 17408 verify rows");
    EXPECT_ERROR_HAS("at most 10679 rows"); // 10679 · 201088 < 2^31 - 1 < 10680 · 201088
    EXPECT_OK(ds_spec_plan_check(&cfg, 628, &tc));                      // 10676 rows
    EXPECT_STATUS(ds_spec_plan_check(&cfg, 629, &tc), DS_ERR_RANGE); // 10693 rows
    tc.num_local_experts = 512;
    EXPECT_STATUS(ds_spec_plan_check(&cfg, 1, &tc), DS_ERR_UNSUPPORTED);
    cfg.k = 3;
    // A prompt that leaves no room for a token, and a sequence at the limit.
    cfg.top_p = 1;
    struct pair p;
    if (!open_pair(&cfg, 1, 16, &p)) return;
    int32_t prompt[16] = {0};
    const int32_t *pp = prompt;
    int len = 16;
    struct ds_spec_seq s = {.slot = 0}, *sp = &s;
    EXPECT_STATUS(ds_spec_prefill(p.spec, 1, &sp, &pp, &len), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("context limit");
    len = 15;
    EXPECT_OK(ds_spec_prefill(p.spec, 1, &sp, &pp, &len));
    struct ds_spec_result res;
    EXPECT_STATUS(ds_spec_step(p.spec, 1, &sp, &res), DS_ERR_RANGE);
    close_pair(&p);
}

int main(void) {
    if (ds_backend_ref_create(&be) != DS_OK) {
        fprintf(stderr, "cpu backend: %s\n", ds_error_last());
        return 1;
    }
    DS_RUN(test_sample_hand);
    DS_RUN(test_accept_edges);
    DS_RUN(test_chi2_target_only);
    DS_RUN(test_chi2_rejection);
    DS_RUN(test_lossless_greedy);
    DS_RUN(test_batch_invariance);
    DS_RUN(test_verify_padding);
    DS_RUN(test_bad_input);
    DS_RUN(test_nan_logit);
    ds_backend_release(be);
    return ds_test_end();
}
