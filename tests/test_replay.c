// Replay with continuous batching (ds/replay.h) on the CPU reference with the golden tiny pair:
// a sweep over B = 1 and B = 3 in one file gives every request the same tokens and the same
// /drafts and /steps rows (batch invariance, step ids and batch sizes aside); the /requests rows
// agree with the /steps rows by their definitions; question datasets with --turns all render the
// second turn with the first turn's reply, the same at every B.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/backend.h"
#include "ds/dataset.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/harmony.h"
#include "ds/record.h"
#include "ds/replay.h"
#include "ds/spec.h"
#include "ds/summary.h"
#include "ds/tokenizer.h"
#include "harness.h"
#include "run_util.h"

#define MAX_NEW 12
#define MAX_REQ 16

static struct ds_backend *be;

// Tokens each request generated, per sweep index.
struct seen {
    int32_t tok[2][MAX_REQ][MAX_NEW];
    size_t n[2][MAX_REQ];
    enum ds_rec_stop stop[2][MAX_REQ];
    uint32_t first_b;
};

static void on_finish(void *user, const struct ds_replay_request *req, uint32_t b,
                      const int32_t *tokens, size_t n, enum ds_rec_stop stop) {
    struct seen *s = user;
    int sweep = b == s->first_b ? 0 : 1;
    if (req->request_index >= MAX_REQ || n > MAX_NEW) return;
    memcpy(s->tok[sweep][req->request_index], tokens, n * sizeof(int32_t));
    s->n[sweep][req->request_index] = n;
    s->stop[sweep][req->request_index] = stop;
}

struct setup {
    ds_tokenizer_t *tok;
    ds_harmony_t *h;
    ds_dataset_t *ds;
    struct ds_replay_work work;
    ds_gptoss_t *target;
    ds_eagle3_t *draft;
    ds_spec_t *spec;
    ds_recorder_t *rec;
};

static void teardown(struct setup *u) {
    if (u->rec) ds_recorder_close(u->rec);
    ds_spec_release(u->spec);
    ds_eagle3_release(u->draft);
    ds_gptoss_release(u->target);
    ds_replay_work_free(&u->work);
    ds_dataset_release(u->ds);
    ds_harmony_release(u->h);
    ds_tokenizer_release(u->tok);
}

// Everything a replay needs, planned for max_b slots and max_pos positions (0: what run plans,
// the longest prompt + max_new + K + 2).
static int setup_ctx(struct setup *u, const char *data, enum ds_dataset_turns turns, int max_b,
                     const struct ds_spec_config *cfg, const char *out, const uint32_t *bs,
                     size_t nb, int max_new, int max_pos) {
    memset(u, 0, sizeof *u);
    EXPECT_OK(ds_tokenizer_load(RU_TOKENIZER, &u->tok));
    if (!u->tok) return 0;
    EXPECT_OK(ds_harmony_create(u->tok, &u->h));
    struct ds_dataset_options o;
    ds_dataset_options_default(&o);
    o.turns = turns;
    EXPECT_OK(ds_dataset_open(data, &o, &u->ds));
    if (!u->ds) return 0;
    EXPECT_OK(ds_replay_prepare(u->ds, u->h, NULL, max_new + 32, &u->work));
    struct ds_target_config tc;
    struct ds_aux_plan aux;
    EXPECT_OK(ds_target_config_load(RU_TARGET, &tc));
    EXPECT_OK(ds_eagle3_aux_plan(RU_DRAFT, &tc, NULL, &aux));
    struct ds_gptoss_plan tp = {0};
    struct ds_eagle3_plan dp = {0};
    if (!max_pos) max_pos = u->work.max_est_len + max_new + cfg->k + 2;
    ds_spec_plan(cfg, max_b, max_pos, &tp, &dp);
    ds_gptoss_plan_aux(&tp, &aux);
    EXPECT_OK(ds_gptoss_create(RU_TARGET, be, &tp, NULL, &u->target));
    if (!u->target) return 0;
    EXPECT_OK(ds_eagle3_create(RU_DRAFT, u->target, be, &dp, NULL, &u->draft));
    if (!u->draft) return 0;
    EXPECT_OK(ds_spec_create(u->target, u->draft, cfg, &u->spec));
    struct ds_run_meta meta = {.rule = ds_spec_rule_name(cfg->rule),
                               .seed = cfg->seed,
                               .k = (uint32_t)cfg->k,
                               .temperature = cfg->temperature,
                               .top_p = cfg->top_p,
                               .batch_sizes = bs,
                               .n_batch_sizes = nb};
    EXPECT_OK(ds_recorder_create(out, &meta, DS_RECORDER_OVERWRITE, &u->rec));
    return u->spec && u->rec;
}

static int setup(struct setup *u, const char *data, enum ds_dataset_turns turns, int max_b,
                 const struct ds_spec_config *cfg, const char *out, const uint32_t *bs, size_t nb,
                 int max_new) {
    return setup_ctx(u, data, turns, max_b, cfg, out, bs, nb, max_new, 0);
}

static const char SHAREGPT[] =
    "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"hello world\"}]}\n"
    "{\"id\": \"b\", \"conversations\": [{\"from\": \"human\", \"value\": \"hello\"}, "
    "{\"from\": \"gpt\", \"value\": \"world\"}, {\"from\": \"human\", \"value\": \"or\"}]}\n"
    "{\"id\": \"c\", \"conversations\": [{\"from\": \"human\", \"value\": \"hell or held\"}]}\n"
    "{\"id\": \"d\", \"conversations\": [{\"from\": \"human\", \"value\": \"low world hello\"}]}\n";

// Draft rows of one request, in file order, with the run-specific ids cleared.
static size_t rows_of(const struct ds_rec_draft *all, size_t n, uint32_t req,
                      struct ds_rec_draft *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (all[i].request == req) {
            out[k] = all[i];
            out[k].step = 0;
            out[k].request = 0;
            out[k].batch_size = 0;
            k++;
        }
    return k;
}

static void sweep(enum ds_spec_rule rule) {
    const char *data = DS_BINARY_DIR "/test_replay_sharegpt.jsonl";
    char out[256];
    snprintf(out, sizeof out, DS_BINARY_DIR "/test_replay_%s.h5", ds_spec_rule_name(rule));
    EXPECT(ru_write(data, SHAREGPT));
    const uint32_t bs[2] = {1, 3};
    struct ds_spec_config cfg = {.rule = rule, .k = 3, .temperature = 0.9f, .top_p = 0.9f,
                                 .seed = 5, .prefill_chunk = 64};
    struct setup u;
    if (!setup(&u, data, DS_TURNS_ALL, 3, &cfg, out, bs, 2, MAX_NEW)) {
        teardown(&u);
        return;
    }
    struct seen seen;
    memset(&seen, 0, sizeof seen);
    seen.first_b = 1;
    struct ds_replay_config rc = {.batch_sizes = bs,
                                  .n_batch_sizes = 2,
                                  .max_new_tokens = MAX_NEW,
                                  .on_finish = on_finish,
                                  .user = &seen};
    struct ds_replay_stats st;
    EXPECT_OK(ds_replay_run(u.spec, u.h, u.tok, u.ds, &u.work, &rc, u.rec, NULL, &st));
    EXPECT_OK(ds_recorder_close(u.rec));
    u.rec = NULL;
    const size_t nreq = u.work.n;
    EXPECT_EQ_INT(nreq, 5); // four conversations, one with two user turns
    EXPECT_EQ_INT(st.requests, 2 * nreq);
    EXPECT_EQ_INT(st.skipped, 0);
    // Same tokens at B = 1 and B = 3.
    for (size_t r = 0; r < nreq; r++) {
        EXPECT(seen.n[0][r] > 0);
        EXPECT_EQ_INT(seen.n[0][r], seen.n[1][r]);
        EXPECT(memcmp(seen.tok[0][r], seen.tok[1][r], seen.n[0][r] * sizeof(int32_t)) == 0);
        EXPECT_EQ_INT(seen.stop[0][r], seen.stop[1][r]);
    }

    size_t nd, ns, nq;
    struct ds_rec_draft *dr = ru_read_table(out, "drafts", sizeof *dr, &nd);
    struct ds_rec_step *sr = ru_read_table(out, "steps", sizeof *sr, &ns);
    struct ds_rec_request *rq = ru_read_table(out, "requests", sizeof *rq, &nq);
    EXPECT(dr && sr && rq);
    EXPECT_EQ_INT(nq, 2 * nreq);
    if (!dr || !sr || !rq) goto done;
    struct ds_rec_draft *a = malloc(nd * sizeof *a), *b = malloc(nd * sizeof *b);
    uint64_t accepted = 0;
    for (size_t i = 0; i < nq; i++) {
        const struct ds_rec_request *q = &rq[i];
        // /requests against /steps by definition: steps = rows of the request; generated =
        // 1 (the prefill's token) + sum of emitted; emitted = accepted + 1 unless cut at the end.
        uint32_t steps = 0, emitted = 0;
        for (size_t j = 0; j < ns; j++)
            if (sr[j].request == q->request) {
                steps++;
                emitted += sr[j].emitted;
                accepted += sr[j].accepted;
                EXPECT(sr[j].emitted <= sr[j].accepted + 1);
                EXPECT_EQ_INT(sr[j].turn, q->turn);
                EXPECT(sr[j].batch_size >= 1 && sr[j].batch_size <= q->batch_size);
            }
        EXPECT_EQ_INT(q->steps, steps);
        EXPECT_EQ_INT(q->generated_len, 1 + emitted);
        EXPECT(q->generated_len <= MAX_NEW);
        if (q->stop_reason == DS_REC_STOP_MAX_NEW_TOKENS) EXPECT_EQ_INT(q->generated_len, MAX_NEW);
        if (q->batch_size != 1) continue;
        // The same request at B = 3: identical draft rows and step rows.
        const struct ds_rec_request *q4 = NULL;
        for (size_t j = 0; j < nq; j++)
            if (rq[j].batch_size == 3 && rq[j].dataset_index == q->dataset_index &&
                rq[j].turn == q->turn)
                q4 = &rq[j];
        EXPECT(q4 != NULL);
        if (!q4) continue;
        EXPECT_EQ_INT(q4->generated_len, q->generated_len);
        EXPECT_EQ_INT(q4->prompt_len, q->prompt_len);
        size_t na = rows_of(dr, nd, q->request, a), nb = rows_of(dr, nd, q4->request, b);
        EXPECT_EQ_INT(na, nb);
        if (na == nb && memcmp(a, b, na * sizeof *a) != 0)
            DS_FAILF("rule %s: request %u (dataset %u turn %u): draft rows differ at B=1 and B=3",
                     ds_spec_rule_name(rule), q->request, q->dataset_index, q->turn);
        // Step rows: same drafted/accepted/emitted/context/experts sequence.
        size_t j4 = 0;
        for (size_t j = 0; j < ns; j++) {
            if (sr[j].request != q->request) continue;
            while (j4 < ns && sr[j4].request != q4->request)
                j4++;
            if (j4 >= ns) {
                DS_FAILF("fewer step rows at B=3");
                break;
            }
            struct ds_rec_step x = sr[j], y = sr[j4++];
            x.step = y.step = 0;
            x.request = y.request = 0;
            x.batch_size = y.batch_size = 0;
            EXPECT(memcmp(&x, &y, sizeof x) == 0);
        }
    }
    printf("  %s: %zu draft rows, %zu step rows, %llu accepted\n", ds_spec_rule_name(rule), nd,
           ns, (unsigned long long)accepted);
    free(a);
    free(b);
    // The summary reads the file: every row kept.
    struct ds_summary *sum = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &sum));
    if (sum) {
        EXPECT_EQ_INT(sum->all.requests, 2 * nreq);
        EXPECT_EQ_INT(sum->dropped_steps, 0);
        EXPECT_EQ_INT(sum->all.steps, ns);
        EXPECT_EQ_INT(sum->all.accepted, accepted);
        EXPECT_EQ_INT(sum->n_groups, 2);
    }
    ds_summary_free(sum);
done:
    free(dr);
    free(sr);
    free(rq);
    teardown(&u);
}

static void test_sweep_greedy(void) {
    sweep(DS_SPEC_GREEDY);
}
static void test_sweep_rejection(void) {
    sweep(DS_SPEC_REJECTION);
}

// Questions record no replies: turn 2 is rendered with turn 1's final-channel text, at each B.
static void test_question_turns(void) {
    const char *data = DS_BINARY_DIR "/test_replay_questions.jsonl";
    const char *out = DS_BINARY_DIR "/test_replay_questions.h5";
    EXPECT(ru_write(data, "{\"question_id\": 1, \"category\": \"writing\", \"turns\": "
                          "[\"hello\", \"world\"]}\n"));
    const uint32_t bs[2] = {1, 2};
    struct ds_spec_config cfg = {.rule = DS_SPEC_GREEDY, .k = 2, .temperature = 1.0f,
                                 .top_p = 1.0f, .seed = 0, .prefill_chunk = 32};
    struct setup u;
    if (!setup(&u, data, DS_TURNS_ALL, 2, &cfg, out, bs, 2, MAX_NEW)) {
        teardown(&u);
        return;
    }
    EXPECT_EQ_INT(u.work.n, 2);
    EXPECT(u.work.req[1].needs_reply);
    EXPECT(!u.work.req[0].needs_reply);
    struct seen seen;
    memset(&seen, 0, sizeof seen);
    seen.first_b = 1;
    struct ds_replay_config rc = {.batch_sizes = bs,
                                  .n_batch_sizes = 2,
                                  .max_new_tokens = MAX_NEW,
                                  .on_finish = on_finish,
                                  .user = &seen};
    struct ds_replay_stats st;
    EXPECT_OK(ds_replay_run(u.spec, u.h, u.tok, u.ds, &u.work, &rc, u.rec, NULL, &st));
    EXPECT_EQ_INT(st.requests, 4);
    for (int r = 0; r < 2; r++) {
        EXPECT_EQ_INT(seen.n[0][r], seen.n[1][r]);
        EXPECT(memcmp(seen.tok[0][r], seen.tok[1][r], seen.n[0][r] * sizeof(int32_t)) == 0);
    }
    // Turn 2's prompt holds turn 1's prompt (harmony renders the history first).
    EXPECT(u.work.req[1].prompt.n > u.work.req[0].prompt.n);
    teardown(&u);
}

// Prompts and generated tokens of each request, per sweep index (test_empty_questions).
struct prompts {
    int32_t ids[2][4][512], gen[2][4][64];
    size_t n[2][4], n_gen[2][4];
    uint32_t first_b;
};

static void on_finish_prompt(void *user, const struct ds_replay_request *req, uint32_t b,
                             const int32_t *tokens, size_t n, enum ds_rec_stop stop) {
    (void)stop;
    struct prompts *p = user;
    const int sweep = b == p->first_b ? 0 : 1;
    const size_t i = req->request_index;
    if (i >= 4 || req->prompt.n > 512 || n > 64) return;
    memcpy(p->ids[sweep][i], req->prompt.ids, req->prompt.n * sizeof(int32_t));
    p->n[sweep][i] = req->prompt.n;
    memcpy(p->gen[sweep][i], tokens, n * sizeof(int32_t));
    p->n_gen[sweep][i] = n;
}

// The prompt a second turn must have: question 1, the final-channel text of the tokens its
// first turn generated (what replay.c substitutes), question 2.
static void second_turn_prompt(const struct setup *u, const char *q1, const int32_t *gen,
                               size_t n_gen, const char *q2, struct ds_token_vec *out) {
    struct ds_channel_tracker tr;
    ds_channel_tracker_init(&tr, u->h, DS_TRACKER_AFTER_PROMPT);
    int32_t fin[64];
    size_t n_fin = 0;
    for (size_t i = 0; i < n_gen; i++) {
        enum ds_stop stop = DS_STOP_NONE;
        if (ds_channel_tracker_feed(&tr, gen[i], &stop) == DS_CHANNEL_FINAL &&
            stop == DS_STOP_NONE && !ds_tokenizer_is_special(u->tok, gen[i]))
            fin[n_fin++] = gen[i];
    }
    struct ds_byte_vec reply = {0};
    EXPECT_OK(ds_tokenizer_decode(u->tok, fin, n_fin, &reply));
    const struct ds_chat_message m[3] = {{DS_ROLE_USER, q1, strlen(q1)},
                                         {DS_ROLE_ASSISTANT, reply.n ? reply.data : "", reply.n},
                                         {DS_ROLE_USER, q2, strlen(q2)}};
    out->n = 0; // render_prompt appends
    EXPECT_OK(ds_harmony_render_prompt(u->h, NULL, m, 3, out));
    ds_byte_vec_free(&reply);
}

// Empty questions are no turns: A's later turn is rendered with A's own first reply only, never
// with B's, so its prompt is the same at B = 1 (B has not run yet) and B = 2 (B has finished).
// Before, A kept a reply slot per empty question (and the empty questions themselves), and its
// third slot read request 2: B's first turn.
static void test_empty_questions(void) {
    const char *data = DS_BINARY_DIR "/test_replay_empty_questions.jsonl";
    const char *out = DS_BINARY_DIR "/test_replay_empty_questions.h5";
    EXPECT(ru_write(data, "{\"question_id\": \"A\", \"turns\": [\"hello world\", \"\", \"\", "
                          "\"or held\"]}\n"
                          "{\"question_id\": \"B\", \"turns\": [\"hello world\", \"low\"]}\n"));
    const uint32_t bs[2] = {1, 2};
    struct ds_spec_config cfg = {.rule = DS_SPEC_GREEDY, .k = 2, .temperature = 1.0f,
                                 .top_p = 1.0f, .seed = 0, .prefill_chunk = 32};
    struct setup u;
    if (!setup(&u, data, DS_TURNS_ALL, 2, &cfg, out, bs, 2, 64)) {
        teardown(&u);
        return;
    }
    EXPECT_EQ_INT(u.work.n, 4); // A: 2 turns, B: 2 turns
    struct prompts p;
    memset(&p, 0, sizeof p);
    p.first_b = 1;
    struct ds_replay_config rc = {.batch_sizes = bs,
                                  .n_batch_sizes = 2,
                                  .max_new_tokens = 64,
                                  .on_finish = on_finish_prompt,
                                  .user = &p};
    struct ds_replay_stats st;
    EXPECT_OK(ds_replay_run(u.spec, u.h, u.tok, u.ds, &u.work, &rc, u.rec, NULL, &st));
    EXPECT_EQ_INT(st.requests, 8);
    struct ds_token_vec want = {0};
    for (int b = 0; b < 2; b++) {
        second_turn_prompt(&u, "hello world", p.gen[b][0], p.n_gen[b][0], "or held", &want);
        EXPECT_EQ_INT(p.n[b][1], want.n);
        EXPECT(p.n[b][1] == want.n && !memcmp(p.ids[b][1], want.ids, want.n * sizeof(int32_t)));
        second_turn_prompt(&u, "hello world", p.gen[b][2], p.n_gen[b][2], "low", &want);
        EXPECT_EQ_INT(p.n[b][3], want.n);
        EXPECT(p.n[b][3] == want.n && !memcmp(p.ids[b][3], want.ids, want.n * sizeof(int32_t)));
    }
    for (int r = 0; r < 4; r++) {
        EXPECT(p.n[0][r] > 0);
        EXPECT_EQ_INT(p.n[0][r], p.n[1][r]);
        EXPECT(memcmp(p.ids[0][r], p.ids[1][r], p.n[0][r] * sizeof(int32_t)) == 0);
    }
    ds_token_vec_free(&want);
    teardown(&u);
}

// A request that reaches the context limit frees its slot for the next one before the next step:
// while requests wait, every step holds B sequences. Before, a sequence left at the limit by a
// step (or by its prefill) was ended only at the start of the next step, after admission, so
// that step ran with B - 1 sequences. Every request here stops at the limit within a few steps.
static void test_context_limit_refill(void) {
    const char *data = DS_BINARY_DIR "/test_replay_context.jsonl";
    const char *out = DS_BINARY_DIR "/test_replay_context.h5";
    static const char *const q[] = {"hello world", "low world hello", "hell or held",
                                    "hello", "world or low hello held", "or held",
                                    "held low", "hello hello world"};
    const size_t nq = sizeof q / sizeof q[0];
    char text[2048];
    size_t at = 0;
    for (size_t i = 0; i < nq; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "{\"id\": \"c%zu\", \"conversations\": "
                               "[{\"from\": \"human\", \"value\": \"%s\"}]}\n", i, q[i]);
    EXPECT(ru_write(data, text));
    const uint32_t bs[1] = {3};
    struct ds_spec_config cfg = {.rule = DS_SPEC_GREEDY, .k = 3, .temperature = 1.0f,
                                 .top_p = 1.0f, .seed = 0, .prefill_chunk = 32};
    // Probe the prompt lengths, then plan one position past the longest prompt plus a few: the
    // longest ends at its first token, the others within a few steps.
    struct setup u;
    if (!setup(&u, data, DS_TURNS_FIRST, 3, &cfg, out, bs, 1, 64)) {
        teardown(&u);
        return;
    }
    const int longest = u.work.max_est_len;
    teardown(&u);
    if (!setup_ctx(&u, data, DS_TURNS_FIRST, 3, &cfg, out, bs, 1, 64, longest + 1)) {
        teardown(&u);
        return;
    }
    struct ds_progress prog;
    ds_progress_init(&prog, stderr, DS_PROGRESS_QUIET, nq);
    struct ds_replay_config rc = {.batch_sizes = bs, .n_batch_sizes = 1, .max_new_tokens = 64,
                                  .progress = &prog};
    struct ds_replay_stats st;
    EXPECT_OK(ds_replay_run(u.spec, u.h, u.tok, u.ds, &u.work, &rc, u.rec, NULL, &st));
    EXPECT_OK(ds_recorder_close(u.rec));
    u.rec = NULL;
    EXPECT_EQ_INT(st.requests, nq);
    size_t ns = 0, nr = 0;
    struct ds_rec_step *sr = ru_read_table(out, "steps", sizeof *sr, &ns);
    struct ds_rec_request *rq = ru_read_table(out, "requests", sizeof *rq, &nr);
    EXPECT(sr && rq);
    EXPECT_EQ_INT(nr, nq);
    if (sr) {
        // The progress line's acceptance length counts the steps that drafted, as the summary
        // does (docs/metrics.md): the rows at the limit that drafted nothing are left out.
        uint64_t drafted = 0, accepted = 0;
        for (size_t j = 0; j < ns; j++)
            drafted += sr[j].drafted > 0, accepted += sr[j].accepted;
        EXPECT(drafted < ns); // the case holds undrafted rows
        EXPECT_EQ_INT(st.steps, ns);
        EXPECT_EQ_INT(st.drafted_steps, drafted);
        EXPECT_EQ_INT(prog.steps, drafted);
        EXPECT_EQ_INT(prog.accepted, accepted);
    }
    if (sr && rq) {
        // The last request admitted is the last in dataset order (one turn each); until its first
        // step, every step holds B sequences.
        uint32_t last_req = 0;
        for (size_t i = 0; i < nr; i++) {
            EXPECT_EQ_INT(rq[i].stop_reason, DS_REC_STOP_CONTEXT_LIMIT);
            if (rq[i].dataset_index == nq - 1) last_req = rq[i].request;
        }
        uint64_t last_admit = UINT64_MAX;
        for (size_t j = 0; j < ns; j++)
            if (sr[j].request == last_req && sr[j].step < last_admit) last_admit = sr[j].step;
        EXPECT(last_admit != UINT64_MAX);
        size_t short_steps = 0;
        for (size_t j = 0; j < ns; j++)
            short_steps += sr[j].step < last_admit && sr[j].batch_size < bs[0];
        EXPECT_EQ_INT(short_steps, 0);
    }
    free(sr);
    free(rq);
    teardown(&u);
}

int main(void) {
    if (ds_backend_ref_create(&be) != DS_OK) {
        fprintf(stderr, "cpu backend: %s\n", ds_error_last());
        return 1;
    }
    DS_RUN(test_sweep_greedy);
    DS_RUN(test_sweep_rejection);
    DS_RUN(test_question_turns);
    DS_RUN(test_empty_questions);
    DS_RUN(test_context_limit_refill);
    ds_backend_release(be);
    return ds_test_end();
}
