// Synthetic weights (ds/synthetic.h) on the CPU reference: spec parsing, the presets against the
// public config values of spec gpt-oss.md §1 / eagle3.md §2.1, the draft's aux plan, and a small
// synthetic pair built from the fixture config: deterministic per seed, different across seeds,
// finite, and the greedy chain runs on it. (The same generator at real shapes runs in
// tests/gpu_models.c and tests/gpu_invariance.c.)
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/backend.h"
#include "ds/synthetic.h"
#include "harness.h"

#define FIXTURE DS_SOURCE_DIR "/tests/fixtures/ckpt/target"

static struct ds_backend *be;

static void parse_specs(void) {
    struct ds_synthetic_spec s;
    EXPECT_OK(ds_synthetic_parse("120b", &s));
    EXPECT_EQ_STR(s.source, "120b");
    EXPECT_EQ_INT(s.seed, 0);
    EXPECT_EQ_INT(s.layers, 0);
    EXPECT_OK(ds_synthetic_parse("20b:7", &s));
    EXPECT_EQ_STR(s.source, "20b");
    EXPECT_EQ_INT(s.seed, 7);
    EXPECT_OK(ds_synthetic_parse("120b:3:4", &s));
    EXPECT_EQ_INT(s.seed, 3);
    EXPECT_EQ_INT(s.layers, 4);
    EXPECT_OK(ds_synthetic_parse("/some/dir:with:colon/config.json:9", &s));
    EXPECT_EQ_STR(s.source, "/some/dir:with:colon/config.json");
    EXPECT_EQ_INT(s.seed, 9);
    EXPECT_STATUS(ds_synthetic_parse("", &s), DS_ERR_ARG);
    EXPECT_STATUS(ds_synthetic_parse(":5", &s), DS_ERR_ARG);
    EXPECT_ERROR_HAS("no preset");
    EXPECT_STATUS(ds_synthetic_parse("120b:1:0", &s), DS_ERR_ARG);
    EXPECT_ERROR_HAS("LAYERS");
    // Seeds stop at 2^63 - 1, as everywhere (the run file's JSON has signed integers).
    EXPECT_OK(ds_synthetic_parse("120b:9223372036854775807:4", &s));
    EXPECT(s.seed == 9223372036854775807ull);
    EXPECT_STATUS(ds_synthetic_parse("120b:9223372036854775808", &s), DS_ERR_ARG);
    EXPECT_ERROR_HAS("SEED must be 0..9223372036854775807");
    EXPECT_STATUS(ds_synthetic_parse("20b:18446744073709551615:4", &s), DS_ERR_ARG);
    struct ds_target_config c;
    EXPECT_OK(ds_synthetic_parse("nope-77b", &s));
    EXPECT_STATUS(ds_synthetic_target_config(&s, &c), DS_ERR_IO);
    EXPECT_ERROR_HAS("nope-77b");
    EXPECT_OK(ds_synthetic_parse("20b:1:25", &s));
    EXPECT_STATUS(ds_synthetic_target_config(&s, &c), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("25 layers");
}

// The presets carry the hub values (spec gpt-oss.md §1 table), and the draft the lmsys ones
// (eagle3.md §2.1: aux ids [1, 17, 33] for 120b, [1, 11, 21] for 20b, output-of convention, so
// boundaries id + 1).
static void presets(void) {
    struct ds_synthetic_spec s;
    struct ds_target_config c;
    EXPECT_OK(ds_synthetic_parse("120b", &s));
    EXPECT_OK(ds_synthetic_target_config(&s, &c));
    EXPECT_EQ_INT(c.num_hidden_layers, 36);
    EXPECT_EQ_INT(c.num_local_experts, 128);
    EXPECT_EQ_INT(c.num_experts_per_tok, 4);
    EXPECT_EQ_INT(c.hidden_size, 2880);
    EXPECT_EQ_INT(c.intermediate_size, 2880);
    EXPECT_EQ_INT(c.num_attention_heads, 64);
    EXPECT_EQ_INT(c.num_key_value_heads, 8);
    EXPECT_EQ_INT(c.head_dim, 64);
    EXPECT_EQ_INT(c.vocab_size, 201088);
    EXPECT_EQ_INT(c.sliding_window, 128);
    EXPECT_EQ_INT(c.max_position_embeddings, 131072);
    EXPECT(c.mxfp4);
    EXPECT_EQ_INT(c.layer_types[0], DS_ATTN_SLIDING);
    EXPECT_EQ_INT(c.layer_types[35], DS_ATTN_FULL);
    EXPECT(fabs(c.rope.theta - 150000.0) < 1e-9 && fabs(c.rope.factor - 32.0) < 1e-9);
    EXPECT(!c.rope.truncate);
    struct ds_draft_config d;
    EXPECT_OK(ds_synthetic_draft_config(&c, &d));
    EXPECT_EQ_INT(d.intermediate_size, 17280);
    EXPECT_EQ_INT(d.draft_vocab_size, 32000);
    EXPECT_EQ_INT(d.num_aux_ids, 3);
    EXPECT_EQ_INT(d.aux_ids[0], 1);
    EXPECT_EQ_INT(d.aux_ids[1], 17);
    EXPECT_EQ_INT(d.aux_ids[2], 33);
    struct ds_aux_plan aux;
    EXPECT_OK(ds_synthetic_aux_plan(&c, &aux));
    EXPECT_EQ_INT(aux.n, 3);
    EXPECT_EQ_INT(aux.boundaries[0], 2);
    EXPECT_EQ_INT(aux.boundaries[1], 18);
    EXPECT_EQ_INT(aux.boundaries[2], 34);

    EXPECT_OK(ds_synthetic_parse("20b", &s));
    EXPECT_OK(ds_synthetic_target_config(&s, &c));
    EXPECT_EQ_INT(c.num_hidden_layers, 24);
    EXPECT_EQ_INT(c.num_local_experts, 32);
    EXPECT_OK(ds_synthetic_draft_config(&c, &d));
    EXPECT_EQ_INT(d.aux_ids[0], 1);
    EXPECT_EQ_INT(d.aux_ids[1], 11);
    EXPECT_EQ_INT(d.aux_ids[2], 21);

    // A 4-layer slice: small-slice ids {0, 1, 3} → boundaries {1, 2, 4}; 2 layers cannot feed 3.
    EXPECT_OK(ds_synthetic_parse("120b:0:4", &s));
    EXPECT_OK(ds_synthetic_target_config(&s, &c));
    EXPECT_EQ_INT(c.num_hidden_layers, 4);
    EXPECT_OK(ds_synthetic_aux_plan(&c, &aux));
    EXPECT_EQ_INT(aux.boundaries[0], 1);
    EXPECT_EQ_INT(aux.boundaries[1], 2);
    EXPECT_EQ_INT(aux.boundaries[2], 4);
    c.num_hidden_layers = 2;
    EXPECT_STATUS(ds_synthetic_aux_plan(&c, &aux), DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("at least 3");

    // A config hidden size whose 6x draft intermediate size the draft config cannot take is
    // blamed on the target's hidden_size (it overflowed int, or named the draft's own field).
    c.num_hidden_layers = 4;
    c.hidden_size = (int64_t)1 << 28; // 6 x 2^28 > 2^30
    EXPECT_STATUS(ds_synthetic_draft_config(&c, &d), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("the target's hidden_size 268435456 is too large");
    c.hidden_size = ((int64_t)1 << 30) / 6; // the largest that fits
    EXPECT_OK(ds_synthetic_draft_config(&c, &d));
    EXPECT_EQ_INT(d.intermediate_size, 6 * (((int64_t)1 << 30) / 6));
}

// Logits of a fixed 12-token prompt on a synthetic target of the fixture config.
static int run_prompt(uint64_t seed, float *logits, int *vocab_out) {
    struct ds_synthetic_spec s;
    char arg[600];
    snprintf(arg, sizeof arg, "%s:%llu", FIXTURE, (unsigned long long)seed);
    EXPECT_OK(ds_synthetic_parse(arg, &s));
    struct ds_gptoss_plan p = {.max_slots = 1, .max_pos = 32, .max_rows = 12};
    ds_gptoss_t *m = NULL;
    EXPECT_OK(ds_synthetic_target_create(&s, be, &p, NULL, &m));
    if (!m) return 0;
    const int V = (int)ds_gptoss_config(m)->vocab_size;
    int32_t ids[12], rows[12];
    for (int i = 0; i < 12; i++)
        ids[i] = (int32_t)((i * 37 + 5) % V), rows[i] = i;
    struct ds_attn_seq q = {.row0 = 0, .n_rows = 12, .pos0 = 0, .slot = 0};
    struct ds_batch b = {.n_rows = 12,
                         .tokens = ids,
                         .n_seq = 1,
                         .seqs = &q,
                         .n_logit_rows = 12,
                         .logit_rows = rows};
    EXPECT_OK(ds_gptoss_forward(m, &b));
    EXPECT_OK(ds_gptoss_download_logits(m, 12, logits));
    struct ds_gptoss_memory mem;
    ds_gptoss_memory_plan(m, &mem);
    EXPECT(mem.weights > 0);
    *vocab_out = V;
    ds_gptoss_release(m);
    return 1;
}

static void target_deterministic(void) {
    int V = 0;
    float *a = malloc(sizeof(float) * 12 * 512), *b = malloc(sizeof(float) * 12 * 512),
          *c = malloc(sizeof(float) * 12 * 512);
    if (run_prompt(5, a, &V) && run_prompt(5, b, &V) && run_prompt(6, c, &V)) {
        EXPECT_EQ_INT(V, 512);
        EXPECT(!memcmp(a, b, sizeof(float) * 12 * 512));
        EXPECT(memcmp(a, c, sizeof(float) * 12 * 512) != 0);
        // Finite and of order one: unit-rms layers keep logits far from overflow (|x| < 100 is
        // a loose bound; a mis-scaled generator gives 1e3+ or NaN within 4 layers).
        double mx = 0, ss = 0;
        int finite = 1;
        for (int i = 0; i < 12 * V; i++) {
            finite &= isfinite(a[i]) != 0;
            mx = fmax(mx, fabs(a[i]));
            ss += (double)a[i] * a[i];
        }
        printf("  synthetic logits: max |x| %.3g, rms %.3g\n", mx, sqrt(ss / (12.0 * V)));
        EXPECT(finite);
        EXPECT(mx < 100.0 && mx > 1e-3);
    }
    free(a), free(b), free(c);
}

// A synthetic draft over the synthetic target: the greedy chain runs and is reproducible.
static void pair_chain(void) {
    struct ds_synthetic_spec s;
    EXPECT_OK(ds_synthetic_parse(FIXTURE ":11", &s));
    struct ds_target_config tc;
    EXPECT_OK(ds_synthetic_target_config(&s, &tc));
    struct ds_aux_plan aux;
    EXPECT_OK(ds_synthetic_aux_plan(&tc, &aux));
    struct ds_gptoss_plan tp = {.max_slots = 2, .max_pos = 64, .max_rows = 32};
    ds_gptoss_plan_aux(&tp, &aux);
    struct ds_eagle3_plan dp = {.max_slots = 2, .max_pos = 64, .max_rows = 32};
    int32_t acc[2][4];
    for (int run = 0; run < 2; run++) {
        ds_gptoss_t *t = NULL;
        ds_eagle3_t *d = NULL;
        ds_chain_t *c = NULL;
        EXPECT_OK(ds_synthetic_target_create(&s, be, &tp, NULL, &t));
        if (t) EXPECT_OK(ds_synthetic_draft_create(&s, t, be, &dp, NULL, &d));
        if (d) EXPECT_OK(ds_chain_create(t, d, 3, &c));
        if (run == 0 && t && d) { // the measures give what the creates placed
            struct ds_gptoss_memory mt, md, pt, pd;
            EXPECT_OK(ds_synthetic_target_measure(&s, be, &tp, &mt));
            EXPECT_OK(ds_synthetic_draft_measure(&s, &tc, &tp, be, &dp, &md));
            ds_gptoss_memory_plan(t, &pt);
            ds_eagle3_memory_plan(d, &pd);
            EXPECT(!memcmp(&mt, &pt, sizeof mt) && !memcmp(&md, &pd, sizeof md));
            EXPECT(pt.weights > 0 && pd.weights > 0);
        }
        if (c) {
            EXPECT_EQ_INT(ds_eagle3_draft_vocab(d), 512); // V < 32000: a full-vocabulary head
            int32_t prompt[10];
            for (int i = 0; i < 10; i++)
                prompt[i] = (int32_t)(i * 11 + 3);
            const int32_t *pp = prompt;
            int n = 10;
            struct ds_chain_seq st = {.slot = 1};
            EXPECT_OK(ds_chain_prefill(c, 1, &pp, &n, &st));
            for (int r = 0; r < 4; r++) {
                struct ds_chain_result res;
                EXPECT_OK(ds_chain_round(c, 1, &st, &res));
                acc[run][r] = res.accepted;
                EXPECT(res.accepted >= 0 && res.accepted <= 3);
            }
        }
        ds_chain_release(c);
        ds_eagle3_release(d);
        ds_gptoss_release(t);
    }
    EXPECT(!memcmp(acc[0], acc[1], sizeof acc[0]));
}

// Plan options on the reference backend: bf16 activations are refused at create (it computes in
// f32 only); graphs are accepted and ignored (no capture, no launch).
static void cpu_plan_options(void) {
    struct ds_synthetic_spec s;
    EXPECT_OK(ds_synthetic_parse(FIXTURE, &s));
    struct ds_gptoss_plan p = {.max_slots = 1, .max_pos = 8, .max_rows = 4, .act = DS_ACT_BF16};
    ds_gptoss_t *m = NULL;
    EXPECT_STATUS(ds_synthetic_target_create(&s, be, &p, NULL, &m), DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("bf16 activations");
    EXPECT(m == NULL);
    p.act = DS_ACT_F32;
    p.graphs = true;
    EXPECT_OK(ds_synthetic_target_create(&s, be, &p, NULL, &m));
    if (!m) return;
    EXPECT_EQ_INT(ds_gptoss_act(m), DS_ELEM_F32);
    int32_t ids[2] = {3, 4}, row = 1;
    struct ds_attn_seq q = {.row0 = 0, .n_rows = 2, .pos0 = 0, .slot = 0};
    struct ds_batch b = {
        .n_rows = 2, .tokens = ids, .n_seq = 1, .seqs = &q, .n_logit_rows = 1, .logit_rows = &row};
    for (int i = 0; i < 3; i++)
        EXPECT_OK(ds_gptoss_forward(m, &b));
    long long captures = -1, launches = -1;
    ds_gptoss_graph_stats(m, &captures, &launches);
    EXPECT_EQ_INT(captures, 0);
    EXPECT_EQ_INT(launches, 0);
    EXPECT_OK(ds_gptoss_clear_kv(m));
    ds_gptoss_release(m);
}

// A config given as a FIFO is refused as not a regular file; it was opened (blocking until a
// writer came) and would have been read as malformed JSON.
static void config_fifo_refused(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ds_synth_fifo_%d.json", DS_BINARY_DIR, (int)getpid());
    unlink(path);
    EXPECT(mkfifo(path, 0600) == 0);
    struct ds_synthetic_spec spec;
    EXPECT_OK(ds_synthetic_parse(path, &spec));
    struct ds_target_config cfg;
    alarm(20); // a hang becomes a failure
    EXPECT_STATUS(ds_synthetic_target_config(&spec, &cfg), DS_ERR_IO);
    alarm(0);
    EXPECT_ERROR_HAS("not a regular file");
    unlink(path);
}

// A config file far larger than any config.json is refused from its size: it was allocated and
// read whole (a 20 GB sparse file ran for more than a minute).
static void config_too_large_refused(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ds_synth_big_%d.json", DS_BINARY_DIR, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    EXPECT(fd >= 0);
    EXPECT(ftruncate(fd, (off_t)1 << 30) == 0); // 1 GiB, sparse
    close(fd);
    struct ds_synthetic_spec spec;
    EXPECT_OK(ds_synthetic_parse(path, &spec));
    struct ds_target_config cfg;
    alarm(20); // a read of the whole file becomes a failure
    EXPECT_STATUS(ds_synthetic_target_config(&spec, &cfg), DS_ERR_FORMAT);
    alarm(0);
    EXPECT_ERROR_HAS(path);
    EXPECT_ERROR_HAS("larger than any config.json");
    unlink(path);
}

// The generated weights are the backend's work (queued on its stream on CUDA): the load ends
// with a wait for the backend after the last fill, so load time and progress are the fills' own.
static char load_events[256]; // 'F' a fill reported by the progress callback, 'S' a sync
static size_t n_load_events;

static void load_event(char c) {
    if (n_load_events + 1 < sizeof load_events) load_events[n_load_events++] = c;
}
static void on_progress(void *user, uint64_t done, uint64_t total) {
    (void)user, (void)done, (void)total;
    load_event('F');
}
static enum ds_status counting_sync(struct ds_backend *b) {
    (void)b;
    load_event('S');
    return be->sync(be);
}

static void load_waits_for_fills(void) {
    struct ds_backend w = *be;
    w.sync = counting_sync;
    struct ds_synthetic_spec s;
    EXPECT_OK(ds_synthetic_parse(FIXTURE, &s));
    struct ds_gptoss_plan p = {.max_slots = 1, .max_pos = 8, .max_rows = 4};
    struct ds_load_progress prog = {on_progress, NULL};
    ds_gptoss_t *m = NULL;
    n_load_events = 0;
    EXPECT_OK(ds_synthetic_target_create(&s, &w, &p, &prog, &m));
    load_events[n_load_events] = '\0';
    const char *last_fill = strrchr(load_events, 'F');
    EXPECT(last_fill != NULL);
    EXPECT(last_fill && strchr(last_fill, 'S') != NULL);
    ds_gptoss_release(m);
}

int main(void) {
    if (ds_backend_ref_create(&be) != DS_OK) {
        fprintf(stderr, "%s\n", ds_error_last());
        return 1;
    }
    DS_RUN(parse_specs);
    DS_RUN(presets);
    DS_RUN(target_deterministic);
    DS_RUN(pair_chain);
    DS_RUN(cpu_plan_options);
    DS_RUN(config_fifo_refused);
    DS_RUN(config_too_large_refused);
    DS_RUN(load_waits_for_fills);
    ds_backend_release(be);
    return ds_test_end();
}
