// The metrics of a run file (ds/summary.h, docs/metrics.md) and `draftscope summary`.
//
// A small run is written through the recorder API (hand_run below): three finished requests and
// one unfinished one, K = 3, sweep batch sizes 1 and 2. Every expected value is worked out by hand
// in the comments from the rows listed there, and written as the fraction it is, so the summary
// must equal it exactly: the sums are of small integers and of binary fractions (0.25, 0.5, 0.75,
// 1), exact in double, and each metric is one division, so the only rounding is that of the
// division itself, the same as in the expected fraction (tolerance 0).
//
// Also: live files (writer still running), files of a killed writer (read as they are and never
// modified), and bad input (missing file, not HDF5, not a run file, another schema version, rows
// that break the schema), each refused with one line naming the file and the problem.
//
// `test_summary --write-sample PATH [--untraced]` writes a larger, realistic run (a seeded
// simulation of a sweep over batch sizes 1, 4, 8 with categories, turns, channels, timings,
// ranges and kernels; --untraced: no timings, no ranges, no kernels)
// for the Python package's tests, notebook and report; `test_summary --cmd summary RUN.h5 [...]`
// runs ds_cmd_summary on the arguments from "summary" on (the `draftscope summary` entry point)
// for tests that need the command before it is wired into the draftscope executable.
#include "harness.h"
#include "run_attr.h"

#include "ds/record.h"
#include "ds/summary.h"

#include <hdf5.h>
#include <jansson.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[512];

static const char *tmp_path(const char *name) {
    static char buf[4][600];
    static int which;
    char *p = buf[which++ % 4];
    snprintf(p, 600, "%s/%s", dir, name);
    unlink(p);
    return p;
}

static const uint32_t hand_batches[] = {1, 2};

static struct ds_run_meta hand_meta(void) {
    struct ds_run_meta m = {
        .command_line = "draftscope run --k 3 --batch-sizes 1,2",
        .gpu_name = "cpu",
        .rule = "greedy",
        .options_json = "{}",
        .seed = 7,
        .k = 3,
        .temperature = 1.0,
        .top_p = 1.0,
        .batch_sizes = hand_batches,
        .n_batch_sizes = 2,
        .trace_level = DS_REC_TRACE_OFF,
    };
    return m;
}

// ---- the hand-worked run ----
//
// Requests (finished; r3 is still running, so it has no /requests row):
//   r0: B 1, turn 0, "coding", generated_len 8 (1 prefill token + 7 emitted), steps 3
//   r1: B 2, turn 0, "math",   generated_len 8 (1 + 7), steps 2
//   r2: B 2, turn 1, "coding", generated_len 4 (1 + 3), steps 2
// Step rows (request, step batch_size, drafted, accepted, emitted):
//   r0: (1, 3, 3, 4) (1, 3, 1, 2) (1, 3, 0, 1)
//   r1: (2, 3, 2, 3) (2, 3, 3, 4)
//   r2: (2, 3, 0, 1) (1, 2, 2, 2)      <- second step: the sweep's tail (r1 done), only 2
//                                         drafted, a stop token cut the emitted tokens to 2
//   r3: (2, 3, 1, 2)                   <- dropped (unfinished request)
// Draft rows: one per drafted token, positions 1..drafted, accepted = position <= accepted.
//   expected_accept: r0 positions 1, 2, 3 -> 0.75, 0.5, 0.25; r1, r2, r3 -> 1.0, 0.5, 0.5
//   channel: r0 analysis; r1 final; r2 first step commentary, second final; r3 other.
struct hand_step {
    uint32_t request;
    uint16_t bs;
    uint8_t drafted, accepted, emitted, channel;
};

static const struct hand_step hand_steps[] = {
    {0, 1, 3, 3, 4, DS_REC_CHANNEL_ANALYSIS},   {0, 1, 3, 1, 2, DS_REC_CHANNEL_ANALYSIS},
    {0, 1, 3, 0, 1, DS_REC_CHANNEL_ANALYSIS},   {1, 2, 3, 2, 3, DS_REC_CHANNEL_FINAL},
    {2, 2, 3, 0, 1, DS_REC_CHANNEL_COMMENTARY}, {1, 2, 3, 3, 4, DS_REC_CHANNEL_FINAL},
    {2, 1, 2, 2, 2, DS_REC_CHANNEL_FINAL},      {3, 2, 3, 1, 2, DS_REC_CHANNEL_OTHER},
};
enum { N_HAND_STEPS = sizeof hand_steps / sizeof hand_steps[0] };

static float hand_expected(uint32_t request, unsigned pos) {
    static const float r0[] = {0, 0.75f, 0.5f, 0.25f}, rest[] = {0, 1.0f, 0.5f, 0.5f};
    return request == 0 ? r0[pos] : rest[pos];
}

static enum ds_status append_hand_rows(ds_recorder_t *rec, int with_requests) {
    enum ds_status st = DS_OK;
    uint32_t coding = 0, math = 0;
    if ((st = ds_recorder_intern(rec, "coding", &coding)) ||
        (st = ds_recorder_intern(rec, "math", &math)))
        return st;
    for (size_t i = 0; i < N_HAND_STEPS && !st; i++) {
        const struct hand_step *h = &hand_steps[i];
        struct ds_rec_step s;
        memset(&s, 0, sizeof s);
        s.step = 10 + i;
        s.request = h->request;
        s.batch_size = h->bs;
        s.turn = h->request == 2;
        s.drafted = h->drafted;
        s.accepted = h->accepted;
        s.emitted = h->emitted;
        s.context_len = (uint32_t)(100 + i);
        st = ds_recorder_append_steps(rec, &s, 1);
        for (unsigned pos = 1; pos <= h->drafted && !st; pos++) {
            struct ds_rec_draft d;
            memset(&d, 0, sizeof d);
            d.step = s.step;
            d.request = h->request;
            d.batch_size = h->bs;
            d.position = (uint8_t)pos;
            d.accepted = pos <= h->accepted;
            d.channel = h->channel;
            d.expected_accept = hand_expected(h->request, pos);
            d.q_draft = d.p_draft = 0.5f;
            st = ds_recorder_append_drafts(rec, &d, 1);
        }
    }
    if (st || !with_requests) return st;
    const struct ds_rec_request reqs[] = {
        {.request = 0, .category = coding, .generated_len = 8, .steps = 3, .batch_size = 1},
        {.request = 1, .category = math, .generated_len = 8, .steps = 2, .batch_size = 2},
        {.request = 2,
         .category = coding,
         .generated_len = 4,
         .steps = 2,
         .batch_size = 2,
         .turn = 1},
    };
    return ds_recorder_append_requests(rec, reqs, 3);
}

static enum ds_status write_hand_run(const char *path) {
    struct ds_run_meta meta = hand_meta();
    ds_recorder_t *rec = NULL;
    enum ds_status st = ds_recorder_create(path, &meta, 0, &rec);
    if (!st) st = append_hand_rows(rec, 1);
    enum ds_status cst = ds_recorder_close(rec);
    return st ? st : cst;
}

static const struct ds_summary_group *group_labelled(const struct ds_summary *s, const char *l) {
    for (size_t i = 0; i < s->n_groups; i++)
        if (!strcmp(s->groups[i].label, l)) return &s->groups[i];
    return NULL;
}

// The checks of the hand run grouped by batch; used for closed, live and killed files alike.
static void expect_hand_by_batch(const struct ds_summary *s) {
    EXPECT_EQ_INT(s->k, 3);
    EXPECT_EQ_INT(s->rows_steps, 8);
    EXPECT_EQ_INT(s->rows_drafts, 23);
    EXPECT_EQ_INT(s->rows_requests, 3);
    EXPECT_EQ_INT(s->dropped_steps, 1); // r3's step and its 3 drafts
    EXPECT_EQ_INT(s->dropped_drafts, 3);
    EXPECT_EQ_INT(s->n_groups, 2);
    if (s->n_groups != 2) return;
    const struct ds_summary_group *b1 = &s->groups[0], *b2 = &s->groups[1], *all = &s->all;
    EXPECT_EQ_STR(b1->label, "1");
    EXPECT_EQ_STR(b2->label, "2");

    // B = 1 (r0): rows (3,3,4) (3,1,2) (3,0,1): steps 3, drafted 9, accepted 4, emitted 7.
    EXPECT_EQ_INT(b1->requests, 1);
    EXPECT_EQ_INT(b1->steps, 3);
    EXPECT_EQ_INT(b1->drafted, 9);
    EXPECT_EQ_INT(b1->accepted, 4);
    EXPECT_EQ_INT(b1->emitted, 7);
    EXPECT_NEAR(ds_summary_mean_acceptance_length(b1), 1.0 + 4.0 / 3.0, 0); // tau = 1 + 4/3
    EXPECT_NEAR(ds_summary_sglang_accept_length(b1), 8.0 / 3.0, 0);         // 8 tokens / 3 steps
    EXPECT_NEAR(ds_summary_emitted_per_step(b1), 7.0 / 3.0, 0);
    EXPECT_NEAR(ds_summary_draft_acceptance_rate(b1), 4.0 / 9.0, 0);
    // Histogram of accepted 3, 1, 0: H = [1, 1, 0, 1].
    EXPECT_EQ_INT(b1->hist[0], 1);
    EXPECT_EQ_INT(b1->hist[1], 1);
    EXPECT_EQ_INT(b1->hist[2], 0);
    EXPECT_EQ_INT(b1->hist[3], 1);
    // Joint: accepted >= 1 in 2 of 3 rows, >= 2 in 1, >= 3 in 1.
    EXPECT_NEAR(ds_summary_joint(b1, 3, 1), 2.0 / 3.0, 0);
    EXPECT_NEAR(ds_summary_joint(b1, 3, 2), 1.0 / 3.0, 0);
    EXPECT_NEAR(ds_summary_joint(b1, 3, 3), 1.0 / 3.0, 0);
    // Reached: position 1 in all 3 rows; position 2 where accepted >= 1 (2 rows); position 3
    // where accepted >= 2 (1 row). Conditional = 2/3, 1/2, 1/1.
    EXPECT_EQ_INT(b1->reached[1], 3);
    EXPECT_EQ_INT(b1->reached[2], 2);
    EXPECT_EQ_INT(b1->reached[3], 1);
    EXPECT_NEAR(ds_summary_conditional(b1, 3, 1), 2.0 / 3.0, 0);
    EXPECT_NEAR(ds_summary_conditional(b1, 3, 2), 1.0 / 2.0, 0);
    EXPECT_NEAR(ds_summary_conditional(b1, 3, 3), 1.0, 0);
    // Expected acceptance: r0's drafts are 0.75, 0.5, 0.25 at positions 1, 2, 3, three each.
    EXPECT_NEAR(ds_summary_expected_at(b1, 1), 0.75, 0);
    EXPECT_NEAR(ds_summary_expected_at(b1, 2), 0.5, 0);
    EXPECT_NEAR(ds_summary_expected_at(b1, 3), 0.25, 0);
    EXPECT_NEAR(ds_summary_expected(b1), 4.5 / 9.0, 0);
    EXPECT_EQ_INT(b1->ch_drafts[DS_REC_CHANNEL_ANALYSIS], 9);
    EXPECT_EQ_INT(b1->ch_accepted[DS_REC_CHANNEL_ANALYSIS], 4);

    // B = 2 (r1, r2): rows (3,2,3) (3,3,4) (3,0,1) (2,2,2): steps 4, drafted 11, accepted 7,
    // emitted 10; requests generated 8 + 4 = 12 tokens in 2 + 2 = 4 steps.
    EXPECT_EQ_INT(b2->requests, 2);
    EXPECT_EQ_INT(b2->steps, 4);
    EXPECT_EQ_INT(b2->drafted, 11);
    EXPECT_EQ_INT(b2->accepted, 7);
    EXPECT_NEAR(ds_summary_mean_acceptance_length(b2), 2.75, 0); // 1 + 7/4
    EXPECT_NEAR(ds_summary_sglang_accept_length(b2), 3.0, 0);    // 12/4
    EXPECT_NEAR(ds_summary_emitted_per_step(b2), 2.5, 0);        // 10/4
    EXPECT_NEAR(ds_summary_draft_acceptance_rate(b2), 7.0 / 11.0, 0);
    // Accepted 2, 3, 0, 2: H = [1, 0, 2, 1].
    EXPECT_EQ_INT(b2->hist[0], 1);
    EXPECT_EQ_INT(b2->hist[1], 0);
    EXPECT_EQ_INT(b2->hist[2], 2);
    EXPECT_EQ_INT(b2->hist[3], 1);
    EXPECT_NEAR(ds_summary_joint(b2, 3, 1), 3.0 / 4.0, 0);
    EXPECT_NEAR(ds_summary_joint(b2, 3, 2), 3.0 / 4.0, 0);
    EXPECT_NEAR(ds_summary_joint(b2, 3, 3), 1.0 / 4.0, 0);
    // Reached 1: all 4; reached 2: accepted >= 1 and drafted >= 2: 3 rows; reached 3: accepted
    // >= 2 and drafted >= 3: (3,2) and (3,3) only, the (2,2) row drafted no third token: 2.
    EXPECT_EQ_INT(b2->reached[1], 4);
    EXPECT_EQ_INT(b2->reached[2], 3);
    EXPECT_EQ_INT(b2->reached[3], 2);
    EXPECT_NEAR(ds_summary_conditional(b2, 3, 1), 3.0 / 4.0, 0);
    EXPECT_NEAR(ds_summary_conditional(b2, 3, 2), 1.0, 0);
    EXPECT_NEAR(ds_summary_conditional(b2, 3, 3), 1.0 / 2.0, 0);
    // Drafts at positions 1, 2, 3: 4, 4, 3 rows of 1.0, 0.5, 0.5.
    EXPECT_EQ_INT(b2->pos_drafts[1], 4);
    EXPECT_EQ_INT(b2->pos_drafts[2], 4);
    EXPECT_EQ_INT(b2->pos_drafts[3], 3);
    EXPECT_NEAR(ds_summary_expected_at(b2, 1), 1.0, 0);
    EXPECT_NEAR(ds_summary_expected_at(b2, 2), 0.5, 0);
    EXPECT_NEAR(ds_summary_expected_at(b2, 3), 0.5, 0);

    // All kept rows: 7 steps, 20 drafted, 11 accepted, 17 emitted; 3 requests, 20 tokens in 7
    // request steps.
    EXPECT_EQ_INT(all->requests, 3);
    EXPECT_EQ_INT(all->steps, 7);
    EXPECT_EQ_INT(all->drafts, 20);
    EXPECT_EQ_INT(all->drafts_accepted, 11);
    EXPECT_NEAR(ds_summary_mean_acceptance_length(all), 1.0 + 11.0 / 7.0, 0);
    EXPECT_NEAR(ds_summary_sglang_accept_length(all), 20.0 / 7.0, 0);
    EXPECT_NEAR(ds_summary_draft_acceptance_rate(all), 11.0 / 20.0, 0);
    EXPECT_NEAR(ds_summary_drafts_rate(all), 11.0 / 20.0, 0);
    // Expected sums: r0 3 * (0.75 + 0.5 + 0.25) = 4.5; B2 4 * 1 + 4 * 0.5 + 3 * 0.5 = 7.5.
    EXPECT_NEAR(ds_summary_expected(all), 12.0 / 20.0, 0);
    EXPECT_NEAR(ds_summary_expected_at(all, 1), 6.25 / 7.0, 0); // 3 * 0.75 + 4 * 1
    EXPECT_NEAR(ds_summary_expected_at(all, 3), 2.25 / 6.0, 0); // 3 * 0.25 + 3 * 0.5
    // Channels: analysis = r0 (9 drafts, 4 accepted, expected 4.5); final = r1's 6 (5 accepted,
    // expected 2 * 2.0) + r2's last 2 (2 accepted, 1.0 + 0.5); commentary = r2's first 3 (none
    // accepted, 1.0 + 0.5 + 0.5); other = r3 only, dropped.
    EXPECT_EQ_INT(all->ch_drafts[DS_REC_CHANNEL_ANALYSIS], 9);
    EXPECT_EQ_INT(all->ch_drafts[DS_REC_CHANNEL_FINAL], 8);
    EXPECT_EQ_INT(all->ch_accepted[DS_REC_CHANNEL_FINAL], 7);
    EXPECT_EQ_INT(all->ch_drafts[DS_REC_CHANNEL_COMMENTARY], 3);
    EXPECT_EQ_INT(all->ch_accepted[DS_REC_CHANNEL_COMMENTARY], 0);
    EXPECT_EQ_INT(all->ch_drafts[DS_REC_CHANNEL_OTHER], 0);
    EXPECT_NEAR(ds_summary_expected_channel(all, DS_REC_CHANNEL_ANALYSIS), 0.5, 0);
    EXPECT_NEAR(ds_summary_expected_channel(all, DS_REC_CHANNEL_FINAL), 5.5 / 8.0, 0);
    EXPECT_NEAR(ds_summary_expected_channel(all, DS_REC_CHANNEL_COMMENTARY), 2.0 / 3.0, 0);
    EXPECT(isnan(ds_summary_expected_channel(all, DS_REC_CHANNEL_OTHER))); // nothing to average
}

static void hand_run_by_batch(void) {
    const char *path = tmp_path("hand.h5");
    EXPECT_OK(write_hand_run(path));
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (!s) return;
    EXPECT_EQ_STR(s->rule, "greedy");
    EXPECT_EQ_INT(s->n_sessions, 1);
    EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_CLOSED);
    expect_hand_by_batch(s);
    ds_summary_free(s);
}

static void hand_run_other_keys(void) {
    const char *path = tmp_path("hand_keys.h5");
    EXPECT_OK(write_hand_run(path));
    struct ds_summary *s = NULL;

    // Turn: turn 0 = r0 + r1 (5 steps, accepted 4 + 5 = 9); turn 1 = r2 (2 steps, accepted 2).
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_TURN, &s));
    if (s) {
        EXPECT_EQ_INT(s->n_groups, 2);
        const struct ds_summary_group *t0 = group_labelled(s, "0"), *t1 = group_labelled(s, "1");
        EXPECT(t0 && t1);
        if (t0 && t1) {
            EXPECT_EQ_INT(t0->requests, 2);
            EXPECT_NEAR(ds_summary_mean_acceptance_length(t0), 1.0 + 9.0 / 5.0, 0);
            EXPECT_NEAR(ds_summary_sglang_accept_length(t0), 16.0 / 5.0, 0); // (8 + 8) / (3 + 2)
            EXPECT_NEAR(ds_summary_mean_acceptance_length(t1), 2.0, 0);      // 1 + 2/2
        }
        ds_summary_free(s);
    }

    // Category, sorted by label: coding = r0 + r2 (5 steps, accepted 4 + 2), math = r1.
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_CATEGORY, &s));
    if (s) {
        EXPECT_EQ_INT(s->n_groups, 2);
        if (s->n_groups == 2) {
            EXPECT_EQ_STR(s->groups[0].label, "coding");
            EXPECT_EQ_STR(s->groups[1].label, "math");
            EXPECT_EQ_INT(s->groups[0].requests, 2);
            EXPECT_NEAR(ds_summary_mean_acceptance_length(&s->groups[0]), 1.0 + 6.0 / 5.0, 0);
            EXPECT_NEAR(ds_summary_mean_acceptance_length(&s->groups[1]), 1.0 + 5.0 / 2.0, 0);
        }
        ds_summary_free(s);
    }

    // Step batch: size 1 = r0's three rows + r2's tail row (accepted 3+1+0+2 = 6 over 4 steps,
    // requests r0, r2); size 2 = (3,2) (3,3) (3,0) (accepted 5 over 3 steps, requests r1, r2).
    // No SGLang figure for a row-level key.
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_STEP_BATCH, &s));
    if (s) {
        const struct ds_summary_group *g1 = group_labelled(s, "1"), *g2 = group_labelled(s, "2");
        EXPECT(g1 && g2);
        if (g1 && g2) {
            EXPECT_EQ_INT(g1->requests, 2);
            EXPECT_EQ_INT(g1->steps, 4);
            EXPECT_NEAR(ds_summary_mean_acceptance_length(g1), 2.5, 0);
            EXPECT_EQ_INT(g2->requests, 2);
            EXPECT_NEAR(ds_summary_mean_acceptance_length(g2), 1.0 + 5.0 / 3.0, 0);
            EXPECT(isnan(ds_summary_sglang_accept_length(g1)));
        }
        EXPECT_EQ_INT(s->all.requests, 3);
        ds_summary_free(s);
    }

    // Position: drafted tokens at 1, 2, 3: 7, 7, 6; accepted where accepted >= position: rows
    // with accepted >= 1: 5; >= 2: 4; >= 3: 2. Steps do not belong to a position group.
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_POSITION, &s));
    if (s) {
        EXPECT_EQ_INT(s->n_groups, 3);
        if (s->n_groups == 3) {
            EXPECT_EQ_INT(s->groups[0].drafts, 7);
            EXPECT_EQ_INT(s->groups[0].drafts_accepted, 5);
            EXPECT_EQ_INT(s->groups[0].requests, 3);
            EXPECT_EQ_INT(s->groups[1].drafts, 7);
            EXPECT_EQ_INT(s->groups[1].drafts_accepted, 4);
            EXPECT_EQ_INT(s->groups[2].drafts, 6);
            EXPECT_EQ_INT(s->groups[2].drafts_accepted, 2);
            EXPECT_EQ_INT(s->groups[2].steps, 0);
            EXPECT_NEAR(ds_summary_expected(&s->groups[0]), 6.25 / 7.0, 0);
        }
        EXPECT_EQ_INT(s->all.steps, 7);
        ds_summary_free(s);
    }

    // Channel: only channels that occur, by code: analysis (1), commentary (2), final (3).
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_CHANNEL, &s));
    if (s) {
        EXPECT_EQ_INT(s->n_groups, 3);
        if (s->n_groups == 3) {
            EXPECT_EQ_STR(s->groups[0].label, "analysis");
            EXPECT_EQ_STR(s->groups[1].label, "commentary");
            EXPECT_EQ_STR(s->groups[2].label, "final");
            EXPECT_EQ_INT(s->groups[2].drafts, 8);
            EXPECT_EQ_INT(s->groups[2].requests, 2); // r1 and r2
            EXPECT_NEAR(ds_summary_drafts_rate(&s->groups[2]), 7.0 / 8.0, 0);
        }
        ds_summary_free(s);
    }
}

// The JSON form carries the same numbers (checked on a few, parsed back with jansson).
// Replaces the root attribute `name` of the file at path with n elements (n = 0: a scalar) of
// type t from data; the tests use it to damage hand runs the way another tool might write them.
static void rewrite_attr(const char *path, const char *name, hid_t t, hsize_t n,
                         const void *data) {
    hid_t h = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT(h >= 0);
    if (h < 0) return;
    hid_t sp = n ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
    EXPECT(H5Adelete(h, name) >= 0);
    hid_t a = H5Acreate2(h, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT(a >= 0 && H5Awrite(a, t, data) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Fclose(h);
}

static void json_output(void) {
    const char *path = tmp_path("hand_json.h5");
    const char *out = tmp_path("hand.json");
    EXPECT_OK(write_hand_run(path));
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (!s) return;
    FILE *f = fopen(out, "w");
    EXPECT(f != NULL);
    if (f) {
        EXPECT_OK(ds_summary_print_json(s, f));
        fclose(f);
    }
    ds_summary_free(s);
    json_error_t err;
    json_t *j = json_load_file(out, 0, &err);
    EXPECT(j != NULL);
    if (!j) return;
    json_t *g = json_array_get(json_object_get(j, "groups"), 1);
    EXPECT_EQ_STR(json_string_value(json_object_get(j, "by")), "batch");
    EXPECT_EQ_STR(json_string_value(json_object_get(g, "label")), "2");
    EXPECT_NEAR(json_real_value(json_object_get(g, "mean_acceptance_length")), 2.75, 0);
    EXPECT_NEAR(json_real_value(json_object_get(g, "sglang_accept_length")), 3.0, 0);
    json_t *p3 = json_array_get(json_object_get(g, "positions"), 2);
    EXPECT_NEAR(json_real_value(json_object_get(p3, "conditional")), 0.5, 0);
    EXPECT_EQ_INT(json_integer_value(json_array_get(json_object_get(g, "histogram"), 2)), 2);
    json_t *other = json_array_get(json_object_get(json_object_get(j, "all"), "channels"), 4);
    EXPECT(json_is_null(json_object_get(other, "rate"))); // 0/0 is null, never NaN in JSON
    EXPECT_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "rows"), "dropped_drafts")),
                  3);
    json_decref(j);

    // A gpu_name longer than the summary keeps (127 bytes) is cut inside a character: the JSON
    // keeps the text and marks the cut with one U+FFFD (every non-ASCII byte became '?').
    char name[451] = "";
    for (int i = 0; i < 50; i++)
        strcat(name, "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"); // 日本語, 9 bytes
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    const char *pn = name;
    rewrite_attr(path, "gpu_name", t, 0, &pn);
    H5Tclose(t);
    s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (!s) return;
    f = fopen(out, "w");
    EXPECT(f != NULL);
    if (f) {
        EXPECT_OK(ds_summary_print_json(s, f));
        fclose(f);
    }
    ds_summary_free(s);
    j = json_load_file(out, 0, &err);
    EXPECT(j != NULL);
    if (!j) return;
    const char *gpu = json_string_value(json_object_get(json_object_get(j, "run"), "gpu_name"));
    EXPECT(gpu != NULL);
    if (gpu) {
        // 127 bytes: 14 whole characters of 9 bytes (126), then one byte of the next.
        char want[160];
        memcpy(want, name, 126);
        memcpy(want + 126, "\xEF\xBF\xBD", 4);
        EXPECT_EQ_STR(gpu, want);
    }
    json_decref(j);
}

// ---- live and killed files ----

static int read_whole(const char *path, char **buf_out, size_t *n_out) {
    *buf_out = NULL;
    *n_out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
            }
            buf = bigger;
        }
    }
    fclose(f);
    if (!buf) return -1;
    *buf_out = buf;
    *n_out = n;
    return 0;
}

// A writer in a child process flushes the hand run and waits; the summary reads it while it is
// open for writing, then again after the writer is killed (its "open for write" marks remain):
// same numbers both times, and the file's bytes are unchanged by reading.
static void live_and_killed_files(void) {
    const char *path = tmp_path("live.h5");
    int pipefd[2];
    EXPECT(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        struct ds_run_meta meta = hand_meta();
        ds_recorder_t *rec = NULL;
        if (ds_recorder_create(path, &meta, 0, &rec) || append_hand_rows(rec, 1) ||
            ds_recorder_flush(rec))
            _exit(92);
        char b = 1;
        if (write(pipefd[1], &b, 1) != 1) _exit(93);
        for (;;)
            pause();
    }
    close(pipefd[1]);
    char b = 0;
    EXPECT(read(pipefd[0], &b, 1) == 1);
    close(pipefd[0]);

    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_RUNNING);
        expect_hand_by_batch(s);
        ds_summary_free(s);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    char *before = NULL, *after = NULL;
    size_t n_before = 0, n_after = 0;
    EXPECT(read_whole(path, &before, &n_before) == 0);
    s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_RUNNING); // the writer died
        expect_hand_by_batch(s);
        ds_summary_free(s);
    }
    EXPECT(read_whole(path, &after, &n_after) == 0);
    EXPECT(before && after && n_before == n_after && !memcmp(before, after, n_before));
    free(before);
    free(after);
}

// ---- bad input ----

// A damaged root object header: the file opens, the attribute lookup fails. That was reported as
// "not a draftscope run file"; HDF5's reason is what went wrong.
static void damaged_root_header_is_named(void) {
    struct ds_summary *s = NULL;
    const char *hdr = tmp_path("damaged_root.h5");
    EXPECT_OK(write_hand_run(hdr));
    EXPECT(ru_damage_root_header(hdr) == 0);
    EXPECT_STATUS(ds_summary_compute(hdr, DS_SUMMARY_BY_BATCH, &s), DS_ERR_IO);
    EXPECT_ERROR_HAS("damaged_root.h5: cannot read the run attributes: ");
    EXPECT(!strstr(ds_error_last(), "not a draftscope run file"));
    EXPECT(s == NULL);
}

static void refuses_bad_files(void) {
    struct ds_summary *s = NULL;
    const char *missing = tmp_path("missing.h5");
    EXPECT_STATUS(ds_summary_compute(missing, DS_SUMMARY_BY_BATCH, &s), DS_ERR_IO);
    EXPECT_ERROR_HAS("missing.h5: cannot open");
    EXPECT(s == NULL);

    const char *text = tmp_path("text.h5");
    FILE *f = fopen(text, "w");
    if (f) {
        fputs("not an hdf5 file\n", f);
        fclose(f);
    }
    EXPECT_STATUS(ds_summary_compute(text, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("text.h5: not an HDF5 file");
    // An empty file and a directory are said as what they are.
    const char *empty = tmp_path("empty.h5");
    f = fopen(empty, "w");
    if (f) fclose(f);
    EXPECT_STATUS(ds_summary_compute(empty, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("empty.h5: an empty file, not a run file");
    unlink(empty);
    const char *subdir = tmp_path("dir.h5");
    mkdir(subdir, 0755);
    EXPECT_STATUS(ds_summary_compute(subdir, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("dir.h5: a directory, not a run file");
    rmdir(subdir);

    const char *plain = tmp_path("plain.h5");
    hid_t h = H5Fcreate(plain, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT(h >= 0);
    if (h >= 0) H5Fclose(h);
    EXPECT_STATUS(ds_summary_compute(plain, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("plain.h5: not a draftscope run file");

    // A run file cut short (a copy interrupted, a disk that filled): the reason in bytes (it was
    // a bare "HDF5 error" once, then HDF5's "truncated file: eof = 4096, ..., stored_eof = N").
    const char *cut = tmp_path("cut.h5");
    EXPECT_OK(write_hand_run(cut));
    struct stat sb;
    EXPECT(stat(cut, &sb) == 0 && sb.st_size > 4096);
    char want[512];
    snprintf(want, sizeof want,
             "cut.h5: truncated file: 4096 bytes of the %lld its superblock records (a copy cut "
             "short, or taken while the run wrote it)",
             (long long)sb.st_size);
    EXPECT(truncate(cut, 4096) == 0);
    EXPECT_STATUS(ds_summary_compute(cut, DS_SUMMARY_BY_BATCH, &s), DS_ERR_IO);
    EXPECT_ERROR_HAS(want);
    EXPECT(s == NULL);

    // A damaged root object header (in a child: HDF5 itself leaks on that path).
    ds_t_in_child(damaged_root_header_is_named);

    // Another schema version: a closed run file whose schema_version is rewritten to 3 (newer than this build).
    const char *v2 = tmp_path("v3.h5");
    EXPECT_OK(write_hand_run(v2));
    h = H5Fopen(v2, H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT(h >= 0);
    if (h >= 0) {
        uint32_t three = 3;
        hid_t a = H5Aopen(h, "schema_version", H5P_DEFAULT);
        EXPECT(a >= 0 && H5Awrite(a, H5T_NATIVE_UINT32, &three) >= 0);
        if (a >= 0) H5Aclose(a);
        H5Fclose(h);
    }
    EXPECT_STATUS(ds_summary_compute(v2, DS_SUMMARY_BY_BATCH, &s), DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("v3.h5: schema version 3, this build reads versions 1 to 2");

    // String attributes written as arrays of fixed-length strings (another tool's file): an
    // attribute is read only when it holds one element. Read whole, 4 strings of 8 bytes went into
    // a 9-byte buffer. The descriptive rule is then left empty; a schema so written is refused.
    for (int which = 0; which < 2; which++) {
        const char *arr = tmp_path("array_attr.h5");
        EXPECT_OK(write_hand_run(arr));
        char vals[4][16];
        for (int i = 0; i < 4; i++)
            snprintf(vals[i], sizeof vals[i], "%s", which ? DS_RECORD_SCHEMA_NAME : "greedy");
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, 16);
        rewrite_attr(arr, which ? "schema" : "rule", t, 4, vals);
        H5Tclose(t);
        s = NULL;
        if (which) {
            EXPECT_STATUS(ds_summary_compute(arr, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
            EXPECT_ERROR_HAS("array_attr.h5: not a draftscope run file");
        } else {
            EXPECT_OK(ds_summary_compute(arr, DS_SUMMARY_BY_BATCH, &s));
            if (s) EXPECT_EQ_STR(s->rule, "");
        }
        ds_summary_free(s);
        s = NULL;
    }

    // k stored as a float: 3.5 was converted to 3 and summarised as K = 3.
    const char *kf = tmp_path("k_float.h5");
    EXPECT_OK(write_hand_run(kf));
    const double k_half = 3.5;
    rewrite_attr(kf, "k", H5T_NATIVE_DOUBLE, 0, &k_half);
    s = NULL;
    EXPECT_STATUS(ds_summary_compute(kf, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("k_float.h5: attribute k missing or not one integer");
    EXPECT(s == NULL);

    EXPECT_STATUS(ds_summary_compute(NULL, DS_SUMMARY_BY_BATCH, &s), DS_ERR_ARG);
    enum ds_summary_by by;
    EXPECT_STATUS(ds_summary_by_parse("colour", &by), DS_ERR_ARG);
    EXPECT_ERROR_HAS("unknown grouping 'colour'");
    EXPECT_OK(ds_summary_by_parse("step-batch", &by));
    EXPECT_EQ_INT(by, DS_SUMMARY_BY_STEP_BATCH);
}

static void refuses_rows_breaking_the_schema(void) {
    struct ds_run_meta meta = hand_meta();
    struct ds_summary *s = NULL;
    ds_recorder_t *rec = NULL;
    const struct ds_rec_request req = {.request = 0, .batch_size = 1, .steps = 1};

    // accepted > drafted in the second step row.
    const char *path = tmp_path("bad_step.h5");
    struct ds_rec_step st[2];
    memset(st, 0, sizeof st);
    st[0].batch_size = st[1].batch_size = 1;
    st[0].drafted = 3;
    st[0].accepted = 1;
    st[0].emitted = 2;
    st[1].drafted = 2;
    st[1].accepted = 3;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    EXPECT_OK(ds_recorder_append_requests(rec, &req, 1));
    EXPECT_OK(ds_recorder_append_steps(rec, st, 2));
    EXPECT_OK(ds_recorder_close(rec));
    EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("bad_step.h5: /steps row 1: drafted 2, accepted 3");

    // A draft at position 4 with K = 3.
    path = tmp_path("bad_draft.h5");
    struct ds_rec_draft d;
    memset(&d, 0, sizeof d);
    d.batch_size = 1;
    d.position = 4;
    rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    EXPECT_OK(ds_recorder_append_requests(rec, &req, 1));
    EXPECT_OK(ds_recorder_append_drafts(rec, &d, 1));
    EXPECT_OK(ds_recorder_close(rec));
    EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("bad_draft.h5: /drafts row 0: position 4 (1..3)");

    // An empty run (no rows at all) is fine: no groups, every ratio NaN.
    path = tmp_path("empty.h5");
    rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    EXPECT_OK(ds_recorder_close(rec));
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->n_groups, 0);
        EXPECT(isnan(ds_summary_mean_acceptance_length(&s->all)));
        ds_summary_free(s);
    }
}

// A step that drafted nothing (a sequence one position short of the context limit) is no verify
// step: vLLM counts a draft only when tokens were proposed. Request 0: a step drafting 3 with 2
// accepted, then one drafting nothing. tau = 1 + 2/1 = 3 (it was 1 + 2/2 = 2), joint(1) = 1,
// emitted per step 3; the SGLang figure (from /requests: 5 tokens / 2 steps) is unchanged.
static void undrafted_steps_left_out(void) {
    struct ds_run_meta meta = hand_meta();
    const char *path = tmp_path("undrafted.h5");
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    if (!rec) return;
    struct ds_rec_step st[2];
    memset(st, 0, sizeof st);
    st[0].step = 0, st[0].batch_size = 1, st[0].drafted = 3, st[0].accepted = 2;
    st[0].emitted = 3;
    st[1].step = 1, st[1].batch_size = 1, st[1].emitted = 1;
    EXPECT_OK(ds_recorder_append_steps(rec, st, 2));
    for (int pos = 1; pos <= 3; pos++) {
        struct ds_rec_draft d;
        memset(&d, 0, sizeof d);
        d.batch_size = 1, d.position = (uint8_t)pos, d.accepted = pos <= 2;
        EXPECT_OK(ds_recorder_append_drafts(rec, &d, 1));
    }
    const struct ds_rec_request req = {
        .request = 0, .batch_size = 1, .steps = 2, .generated_len = 5};
    EXPECT_OK(ds_recorder_append_requests(rec, &req, 1));
    EXPECT_OK(ds_recorder_close(rec));
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (!s) return;
    EXPECT_EQ_INT(s->undrafted_steps, 1);
    EXPECT_EQ_INT(s->rows_steps, 2);
    EXPECT_EQ_INT(s->all.steps, 1);
    EXPECT_NEAR(ds_summary_mean_acceptance_length(&s->all), 3.0, 1e-12);
    EXPECT_NEAR(ds_summary_joint(&s->all, 3, 1), 1.0, 1e-12);
    EXPECT_NEAR(ds_summary_emitted_per_step(&s->all), 3.0, 1e-12);
    EXPECT_NEAR(ds_summary_sglang_accept_length(&s->all), 2.5, 1e-12);
    ds_summary_free(s);
}

// A step whose verify logits were not finite verified nothing: it and its drafts are left out of
// every metric and counted apart (docs/metrics.md). Sweep B 2, K 3. Request 0: step 0 (step-batch
// 2) drafts 3, accepts 2 (drafts 1 1 0); step 1 (step-batch 1) is non-finite: drafts 3, accepts 0,
// emits 0, its 3 drafts accepted 0 with expected 0.75. Request 1: step 2 (step-batch 2) drafts 3,
// accepts 1 (drafts 1 0 0). Kept: 2 steps, accepted 3, so tau = 1 + 3/2 = 2.5 (counted as an
// ordinary step it was 1 + 3/3 = 2), joint(1) = 2/2, draft rate 3/6 (was 3/9), drafts rate 3/6,
// expected 0.5 over the 6 kept drafts (each 0.5). By step-batch, group 1 holds only the
// non-finite row: no steps, 1 request, nonfinite 1.
static void nonfinite_steps_left_out(void) {
    struct ds_run_meta meta = hand_meta();
    const char *path = tmp_path("nonfinite.h5");
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    if (!rec) return;
    struct ds_rec_step st[3];
    memset(st, 0, sizeof st);
    st[0].step = 0, st[0].request = 0, st[0].batch_size = 2, st[0].drafted = 3;
    st[0].accepted = 2, st[0].emitted = 3;
    st[1].step = 1, st[1].request = 0, st[1].batch_size = 1, st[1].drafted = 3;
    st[1].nonfinite = 1;
    st[2].step = 2, st[2].request = 1, st[2].batch_size = 2, st[2].drafted = 3;
    st[2].accepted = 1, st[2].emitted = 2;
    EXPECT_OK(ds_recorder_append_steps(rec, st, 3));
    for (int i = 0; i < 3; i++)
        for (int pos = 1; pos <= 3; pos++) {
            struct ds_rec_draft d;
            memset(&d, 0, sizeof d);
            d.step = st[i].step, d.request = st[i].request, d.batch_size = st[i].batch_size;
            d.position = (uint8_t)pos;
            d.accepted = pos <= st[i].accepted;
            d.expected_accept = st[i].nonfinite ? 0.75f : 0.5f;
            EXPECT_OK(ds_recorder_append_drafts(rec, &d, 1));
        }
    const struct ds_rec_request req[2] = {
        {.request = 0, .batch_size = 2, .steps = 2, .generated_len = 4,
         .stop_reason = DS_REC_STOP_ERROR},
        {.request = 1, .batch_size = 2, .steps = 1, .generated_len = 3}};
    EXPECT_OK(ds_recorder_append_requests(rec, req, 2));
    EXPECT_OK(ds_recorder_close(rec));

    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (!s) return;
    EXPECT_EQ_INT(s->rows_steps, 3);
    EXPECT_EQ_INT(s->rows_drafts, 9);
    EXPECT_EQ_INT(s->nonfinite_steps, 1);
    EXPECT_EQ_INT(s->nonfinite_drafts, 3);
    EXPECT_EQ_INT(s->stop_counts[DS_REC_STOP_RETURN], 1); // request 1's zero stop_reason
    EXPECT_EQ_INT(s->stop_counts[DS_REC_STOP_ERROR], 1);
    EXPECT_EQ_INT(s->error_requests, 1);
    EXPECT_EQ_INT(s->error_requests_at_prompt, 0);
    EXPECT_EQ_INT(s->all.steps, 2);
    EXPECT_EQ_INT(s->all.nonfinite, 1);
    EXPECT_EQ_INT(s->all.drafts, 6);
    EXPECT_NEAR(ds_summary_mean_acceptance_length(&s->all), 2.5, 0);
    EXPECT_NEAR(ds_summary_joint(&s->all, 3, 1), 1.0, 0);
    EXPECT_NEAR(ds_summary_draft_acceptance_rate(&s->all), 0.5, 0);
    EXPECT_NEAR(ds_summary_drafts_rate(&s->all), 0.5, 0);
    EXPECT_NEAR(ds_summary_expected(&s->all), 0.5, 0);
    EXPECT_NEAR(ds_summary_sglang_accept_length(&s->all), 7.0 / 3.0, 0); // /requests unchanged
    EXPECT_EQ_INT(s->n_groups, 1);
    if (s->n_groups == 1) {
        EXPECT_EQ_INT(s->groups[0].steps, 2);
        EXPECT_EQ_INT(s->groups[0].nonfinite, 1);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    EXPECT(f != NULL);
    if (f) {
        EXPECT_OK(ds_summary_print_text(s, f));
        fclose(f);
        EXPECT(strstr(text, "1 step had non-finite verify logits") != NULL);
        EXPECT(strstr(text, "  requests by stop reason: return 1 error 1\n") != NULL);
        EXPECT(strstr(text, "it and its 3 drafts are left out of every metric") != NULL);
        free(text);
    }
    ds_summary_free(s);

    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_STEP_BATCH, &s));
    if (!s) return;
    EXPECT_EQ_INT(s->n_groups, 2);
    if (s->n_groups == 2) {
        EXPECT_EQ_INT(s->groups[0].key, 1);
        EXPECT_EQ_INT(s->groups[0].steps, 0);
        EXPECT_EQ_INT(s->groups[0].nonfinite, 1);
        EXPECT_EQ_INT(s->groups[0].requests, 1);
        EXPECT(isnan(ds_summary_mean_acceptance_length(&s->groups[0])));
        EXPECT_EQ_INT(s->groups[1].steps, 2);
        EXPECT_EQ_INT(s->groups[1].nonfinite, 0);
        EXPECT_EQ_INT(s->groups[1].requests, 2);
    }
    ds_summary_free(s);

    // By position: the non-finite step's drafts are in no position's counts.
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_POSITION, &s));
    if (!s) return;
    EXPECT_EQ_INT(s->n_groups, 3);
    for (size_t i = 0; i < s->n_groups; i++)
        EXPECT_EQ_INT(s->groups[i].drafts, 2);
    ds_summary_free(s);
}

// The command's exit codes: 0 for a good file (text and JSON), 1 for a bad file, 2 for usage.
// ---- step times and predicted speedup ----
//
// K 3, sweep batch sizes 1 and 2; options_json holds a baseline for B 1 only (median 2.0 ms) and a
// trace overhead of 0.025. Step rows (step id, request, B, accepted, draft_ns, verify_ns):
//   step 0: r0 B1 acc 3, 400000, 1000000
//   step 1: r0 B1 acc 1, 600000, 1200000
//   step 2: r1 B2 acc 2 and r2 B2 acc 0, both 500000, 1500000      <- one step, two sequences
//   step 3: r1 B2 acc 3 and r2 B2 acc 1, both 700000, 1700000
//   step 4: r1 B2 acc 1, 0, 0                                      <- not timed
// By hand:
//   B 1: tau = 1 + 4/2 = 3; draft (0.4 + 0.6)/2 = 0.5 ms, verify (1.0 + 1.2)/2 = 1.1 ms;
//        speedup = 3 x 2.0 / (0.5 + 1.1) = 3.75
//   B 2: tau = 1 + 7/5 = 2.4; 2 timed steps: draft 0.6 ms, verify 1.6 ms; no baseline
//   all: 4 timed steps: draft (0.4+0.6+0.5+0.7)/4 = 0.55 ms, verify (1.0+1.2+1.5+1.7)/4 = 1.35 ms;
//        two batch sizes, so no single base step: no speedup
static enum ds_status write_timed_run(const char *path, const char *options_json) {
    static const struct {
        uint64_t step;
        uint32_t request;
        uint16_t bs;
        uint8_t accepted;
        uint64_t draft_ns, verify_ns;
    } rows[] = {
        {0, 0, 1, 3, 400000, 1000000},
        {1, 0, 1, 1, 600000, 1200000},
        {2, 1, 2, 2, 500000, 1500000},
        {2, 2, 2, 0, 500000, 1500000},
        {3, 1, 2, 3, 700000, 1700000},
        {3, 2, 2, 1, 700000, 1700000},
        {4, 1, 2, 1, 0, 0},
    };
    struct ds_run_meta meta = hand_meta();
    meta.options_json = options_json;
    meta.trace_level = DS_REC_TRACE_PHASES;
    ds_recorder_t *rec = NULL;
    enum ds_status st = ds_recorder_create(path, &meta, 0, &rec);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0] && !st; i++) {
        struct ds_rec_step s;
        memset(&s, 0, sizeof s);
        s.step = rows[i].step;
        s.request = rows[i].request;
        s.batch_size = rows[i].bs;
        s.drafted = 3;
        s.accepted = rows[i].accepted;
        s.emitted = (uint8_t)(rows[i].accepted + 1);
        s.draft_ns = rows[i].draft_ns;
        s.verify_ns = rows[i].verify_ns;
        s.total_ns = rows[i].draft_ns + rows[i].verify_ns;
        st = ds_recorder_append_steps(rec, &s, 1);
    }
    const struct ds_rec_request reqs[] = {
        {.request = 0, .generated_len = 7, .steps = 2, .batch_size = 1},
        {.request = 1, .generated_len = 10, .steps = 3, .batch_size = 2},
        {.request = 2, .generated_len = 4, .steps = 2, .batch_size = 2},
    };
    if (!st) st = ds_recorder_append_requests(rec, reqs, 3);
    // 7 CUPTI records dropped: the summary reads it back from /sessions (schema v2).
    struct ds_run_end end = {.status = DS_REC_SESSION_CLOSED, .trace_overhead = NAN,
                             .trace_dropped = 7};
    if (!st) st = ds_recorder_set_end(rec, &end);
    enum ds_status cst = ds_recorder_close(rec);
    return st ? st : cst;
}

static const char *timed_options = "{\"baseline\":[{\"batch_size\":1,\"mean_ns\":2100000,"
                                   "\"median_ns\":2000000,\"min_ns\":1900000,\"steps\":20}],"
                                   "\"trace\":\"phases\",\"trace_overhead\":0.025,"
                                   "\"numerics\":\"batch-variant\","
                                   "\"load\":{\"target\":{\"bytes\":6000000000,\"seconds\":2.5,"
                                   "\"uploaded\":true},\"draft\":{\"bytes\":500000000,"
                                   "\"seconds\":0,\"uploaded\":false}}}";

static void step_times_and_speedup(void) {
    const char *path = tmp_path("timed.h5"), *out = tmp_path("timed.txt");
    EXPECT_OK(write_timed_run(path, timed_options));
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    if (!s) return;
    // Exact: sums of integers divided once; the speedup's three doubles are within 1 ulp.
    const struct ds_summary_group *b1 = group_labelled(s, "1"), *b2 = group_labelled(s, "2");
    EXPECT(b1 && b2);
    if (b1 && b2) {
        EXPECT_EQ_INT(b1->timed_steps, 2);
        EXPECT_NEAR(ds_summary_mean_draft_ns(b1), 500000, 0);
        EXPECT_NEAR(ds_summary_mean_verify_ns(b1), 1100000, 0);
        EXPECT_NEAR(ds_summary_predicted_speedup(b1), 3.75, 1e-12);
        EXPECT_EQ_INT(b2->timed_steps, 2);
        EXPECT_NEAR(ds_summary_mean_draft_ns(b2), 600000, 0);
        EXPECT_NEAR(ds_summary_mean_verify_ns(b2), 1600000, 0);
        EXPECT(isnan(ds_summary_predicted_speedup(b2)));
    }
    EXPECT_EQ_INT(s->all.timed_steps, 4);
    EXPECT_NEAR(ds_summary_mean_draft_ns(&s->all), 550000, 0);
    EXPECT_NEAR(ds_summary_mean_verify_ns(&s->all), 1350000, 0);
    EXPECT(isnan(ds_summary_predicted_speedup(&s->all)));
    EXPECT_NEAR(s->trace_overhead, 0.025, 0);
    EXPECT_EQ_INT(s->trace_dropped, 7); // written by write_timed_run's set_end
    EXPECT(s->has_load);
    EXPECT_EQ_INT(s->load_bytes[0], 6000000000);
    EXPECT_NEAR(s->load_seconds[0], 2.5, 0);
    EXPECT(s->load_uploaded[0] && !s->load_uploaded[1]);
    FILE *f = fopen(out, "w");
    EXPECT(f != NULL);
    if (f) {
        EXPECT_OK(ds_summary_print_text(s, f));
        fclose(f);
    }
    char *text = NULL;
    size_t n = 0;
    EXPECT(read_whole(out, &text, &n) == 0);
    if (text) {
        text[n ? n - 1 : 0] = '\0';
        EXPECT(strstr(text, "trace overhead: 2.50%") != NULL);
        EXPECT(strstr(text, "trace records dropped by CUPTI: 7\n") != NULL);
        EXPECT(strstr(text, "  numerics: batch-variant (each call's attention split follows "
                            "its size") != NULL);
        // 6 GB in 2.5 s; the draft mapped in place has no rate.
        EXPECT(strstr(text, "weights: target 6.000 GB in 2.5 s (2.40 GB/s); draft 0.500 GB "
                            "mapped in place (0 s)") != NULL);
        EXPECT(strstr(text, "(draft + verify, 2 timed steps)  0.5000 + 1.1000 ms") != NULL);
        EXPECT(strstr(text, "3.750  (base decode step 2.0000 ms)") != NULL);
        EXPECT(strstr(text, "no baseline for this batch size (run with --baseline)") != NULL);
        free(text);
    }
    f = fopen(out, "w");
    if (f) {
        EXPECT_OK(ds_summary_print_json(s, f));
        fclose(f);
    }
    ds_summary_free(s);
    json_error_t err;
    json_t *j = json_load_file(out, 0, &err);
    EXPECT(j != NULL);
    if (j) {
        json_t *g0 = json_array_get(json_object_get(j, "groups"), 0);
        json_t *g1 = json_array_get(json_object_get(j, "groups"), 1);
        EXPECT_NEAR(json_real_value(json_object_get(g0, "predicted_speedup")), 3.75, 1e-12);
        EXPECT_NEAR(json_real_value(json_object_get(g0, "base_step_ns")), 2000000, 0);
        EXPECT_NEAR(json_real_value(json_object_get(g1, "mean_verify_ns")), 1600000, 0);
        EXPECT(json_is_null(json_object_get(g1, "predicted_speedup")));
        json_t *run = json_object_get(j, "run");
        EXPECT_NEAR(json_real_value(json_object_get(run, "trace_overhead")), 0.025, 0);
        EXPECT(json_is_integer(json_object_get(run, "trace_dropped")));
        EXPECT_EQ_INT(json_integer_value(json_object_get(run, "trace_dropped")), 7);
        EXPECT_EQ_INT(json_array_size(json_object_get(run, "baseline")), 1);
        EXPECT_EQ_STR(json_string_value(json_object_get(run, "numerics")), "batch-variant");
        json_t *lt = json_object_get(json_object_get(run, "load"), "target");
        EXPECT_EQ_INT(json_integer_value(json_object_get(lt, "bytes")), 6000000000);
        EXPECT(json_is_true(json_object_get(lt, "uploaded")));
        json_decref(j);
    }
    // Untimed file: the text says how to get step times.
    path = tmp_path("timed.h5"); // removes the previous file
    EXPECT_OK(write_hand_run(path));
    EXPECT_OK(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s));
    f = fopen(out, "w");
    if (s && f) EXPECT_OK(ds_summary_print_text(s, f));
    if (f) fclose(f);
    ds_summary_free(s);
    EXPECT(read_whole(out, &text, &n) == 0);
    if (text) {
        text[n ? n - 1 : 0] = '\0';
        EXPECT(strstr(text, "step times: not measured (run with --trace phases or kernels)"));
        EXPECT(!strstr(text, "speedup"));
        free(text);
    }
    // A baseline entry without a usable batch size is refused with a line naming it.
    path = tmp_path("timed.h5"); // removes the previous file
    EXPECT_OK(write_timed_run(path, "{\"baseline\":[{\"batch_size\":0,\"median_ns\":5}]}"));
    EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("timed.h5: options_json.baseline[0]");
    // options_json.dataset (what the run skipped of its dataset) with counts that cannot be.
    static const char *bad_dataset[] = {
        "{\"dataset\":[3]}",
        "{\"dataset\":{\"records_read\":3,\"skipped_empty\":0}}",
        "{\"dataset\":{\"records_read\":3,\"skipped_empty\":2,\"skipped_malformed\":2}}",
        "{\"dataset\":{\"records_read\":3,\"skipped_empty\":-1,\"skipped_malformed\":0}}",
    };
    for (size_t i = 0; i < sizeof bad_dataset / sizeof bad_dataset[0]; i++) {
        path = tmp_path("timed.h5"); // removes the previous file
        EXPECT_OK(write_timed_run(path, bad_dataset[i]));
        EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
        EXPECT_ERROR_HAS("timed.h5: options_json.dataset needs records_read");
    }
    // options_json.load (the creating run's loads) with a field missing or of the wrong type.
    static const char *bad_load[] = {
        "{\"load\":[1]}",
        "{\"load\":{\"target\":{\"bytes\":1,\"seconds\":1,\"uploaded\":true}}}",
        "{\"load\":{\"target\":{\"bytes\":1,\"seconds\":-1,\"uploaded\":true},"
        "\"draft\":{\"bytes\":1,\"seconds\":1,\"uploaded\":true}}}",
        "{\"load\":{\"target\":{\"bytes\":1.5,\"seconds\":1,\"uploaded\":true},"
        "\"draft\":{\"bytes\":1,\"seconds\":1,\"uploaded\":true}}}",
        "{\"load\":{\"target\":{\"bytes\":1,\"seconds\":1,\"uploaded\":1},"
        "\"draft\":{\"bytes\":1,\"seconds\":1,\"uploaded\":true}}}",
    };
    path = tmp_path("timed.h5"); // removes the previous file
    EXPECT_OK(write_timed_run(path, "{\"pad_to_graph_sizes\":[4,0]}"));
    EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("timed.h5: options_json.pad_to_graph_sizes is not a list");
    path = tmp_path("timed.h5"); // removes the previous file
    EXPECT_OK(write_timed_run(path, "{\"numerics\":\"fast\"}"));
    EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("timed.h5: options_json.numerics is not \"invariant\" or");
    for (size_t i = 0; i < sizeof bad_load / sizeof bad_load[0]; i++) {
        path = tmp_path("timed.h5"); // removes the previous file
        EXPECT_OK(write_timed_run(path, bad_load[i]));
        EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
        EXPECT_ERROR_HAS(i == 1 ? "timed.h5: options_json.load.draft needs bytes"
                                : "timed.h5: options_json.load.target needs bytes");
    }
    path = tmp_path("timed.h5"); // removes the previous file
    EXPECT_OK(write_timed_run(path, "[1,2]"));
    EXPECT_STATUS(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("timed.h5: options_json is not a JSON object");
}

static void command_exit_codes(void) {
    const char *path = tmp_path("cmd.h5");
    EXPECT_OK(write_hand_run(path));
    char p[600];
    snprintf(p, sizeof p, "%s", path);
    // The command prints to stdout; send it to /dev/null for this test and restore it after.
    fflush(stdout);
    int saved = dup(1);
    FILE *null = freopen("/dev/null", "w", stdout);
    EXPECT(null != NULL);
    char *a1[] = {"summary", p, NULL};
    char *a2[] = {"summary", p, "--json", "--by", "category", NULL};
    char *a3[] = {"summary", p, "--by", "colour", NULL};
    char *a4[] = {"summary", NULL};
    char missing[] = "/nonexistent/run.h5";
    char *a5[] = {"summary", missing, NULL};
    int r1 = ds_cmd_summary(2, a1), r2 = ds_cmd_summary(5, a2), r3 = ds_cmd_summary(4, a3),
        r4 = ds_cmd_summary(1, a4), r5 = ds_cmd_summary(2, a5);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    EXPECT_EQ_INT(r1, 0);
    EXPECT_EQ_INT(r2, 0);
    EXPECT_EQ_INT(r3, 2);
    EXPECT_EQ_INT(r4, 2);
    EXPECT_EQ_INT(r5, 1);
}

// ---- the realistic sample for the Python tests ----

static uint64_t rng_state;

static double rnd(void) { // splitmix64 -> [0, 1)
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

enum { SAMPLE_CONVS = 10, SAMPLE_K = 3 };

struct seq {
    int conv, turn, live;
    uint32_t request, generated, steps, ctx, prompt;
    uint64_t start_ns;
};

// One simulated sweep at concurrency B: B sequences in flight, each conversation's turns run one
// after the other; acceptance falls with position and is lower in the analysis channel; timings
// grow with the batch. Request r_unfinished (the last of the largest B) gets rows but no
// /requests row, as a crash would leave it.
static enum ds_status simulate(ds_recorder_t *rec, uint16_t B, uint64_t *step_id,
                               uint32_t *next_request, const uint32_t *cats, uint32_t kname[3],
                               int leave_unfinished, int traced) {
    static const int turns_of[SAMPLE_CONVS] = {1, 2, 1, 1, 2, 1, 1, 2, 1, 1};
    struct seq seqs[16];
    int next_conv = 0;
    enum ds_status st = DS_OK;
    uint64_t clock_ns = (uint64_t)B * 1000000000ull;
    memset(seqs, 0, sizeof seqs);
    for (;;) {
        int live = 0;
        for (int i = 0; i < B; i++) {
            if (!seqs[i].live && next_conv < SAMPLE_CONVS) {
                seqs[i] = (struct seq){.conv = next_conv++, .turn = 0, .live = 1};
                seqs[i].request = (*next_request)++;
                seqs[i].prompt = seqs[i].ctx = 40 + (uint32_t)(rnd() * 200);
                seqs[i].generated = 1; // the prefill's token
                seqs[i].start_ns = clock_ns;
            }
            live += seqs[i].live;
        }
        if (!live) break;
        uint64_t draft_ns = traced ? 300000 + 20000ull * (uint64_t)live : 0;
        uint64_t verify_ns = traced ? 900000 + 60000ull * (uint64_t)live : 0;
        uint64_t accept_ns = traced ? 50000 : 0;
        uint64_t sid = (*step_id)++;
        for (int i = 0; i < B && !st; i++) {
            struct seq *q = &seqs[i];
            if (!q->live) continue;
            int channel = q->steps < 6   ? DS_REC_CHANNEL_ANALYSIS
                          : q->steps < 8 ? DS_REC_CHANNEL_HEADER
                                         : DS_REC_CHANNEL_FINAL;
            double base = channel == DS_REC_CHANNEL_ANALYSIS ? 0.55 : 0.8;
            uint8_t accepted = 0, rejected = 0;
            // Conversation 3 ends one position short of a context limit: its last step drafts
            // nothing (no /drafts rows, drafted 0), which the metrics leave out. The random draws
            // are made all the same, so every other row is as it was.
            const int undrafted =
                q->conv == 3 && q->steps + 1 >= 10 + (uint32_t)(q->conv % 4) * 3;
            // Conversation 6's last step has non-finite verify logits: its drafts are written
            // (none accepted), the step accepts and emits nothing and the request ends with
            // error; the metrics leave the step and its drafts out. Same draws again.
            const int nonfinite =
                q->conv == 6 && q->steps + 1 >= 10 + (uint32_t)(q->conv % 4) * 3;
            for (int pos = 1; pos <= SAMPLE_K && !st; pos++) {
                double alpha = base - 0.1 * (pos - 1) - (q->ctx > 300 ? 0.1 : 0.0);
                double expected = alpha + 0.1 * (rnd() - 0.5);
                int acc = !rejected && rnd() < alpha;
                if (!acc) rejected = 1;
                accepted += (uint8_t)(acc && !nonfinite);
                struct ds_rec_draft d;
                memset(&d, 0, sizeof d);
                d.step = sid;
                d.request = q->request;
                d.draft_token = (int32_t)(rnd() * 200000);
                d.target_token = acc ? d.draft_token : (int32_t)(rnd() * 200000);
                d.q_draft = (float)(0.3 + 0.6 * rnd());
                d.p_draft = (float)(acc ? 0.5 + 0.5 * rnd() : 0.3 * rnd());
                d.p_target = (float)(0.4 + 0.6 * rnd());
                d.margin = (float)(0.5 * rnd());
                d.expected_accept = (float)(expected < 0 ? 0 : expected > 1 ? 1 : expected);
                d.entropy_target = (float)(2.0 * rnd());
                d.entropy_draft = (float)(2.5 * rnd());
                d.context_len = q->ctx + (uint32_t)pos - 1;
                d.batch_size = (uint16_t)live;
                d.position = (uint8_t)pos;
                d.accepted = (uint8_t)(acc && !nonfinite);
                d.channel = (uint8_t)channel;
                if (!undrafted) st = ds_recorder_append_drafts(rec, &d, 1);
            }
            if (undrafted) accepted = 0;
            struct ds_rec_step s;
            memset(&s, 0, sizeof s);
            s.step = sid;
            s.draft_ns = draft_ns;
            s.verify_ns = verify_ns;
            s.accept_ns = accept_ns;
            s.total_ns = draft_ns + verify_ns + accept_ns;
            s.request = q->request;
            s.context_len = q->ctx;
            s.batch_size = (uint16_t)live;
            s.turn = (uint16_t)q->turn;
            s.drafted = undrafted ? 0 : SAMPLE_K;
            s.accepted = accepted;
            s.emitted = (uint8_t)(nonfinite ? 0 : accepted + 1);
            s.nonfinite = (uint8_t)nonfinite;
            for (int l = 0; l < 24; l++)
                s.distinct_experts[l] = (uint16_t)(4 + rnd() * 12);
            if (!st) st = ds_recorder_append_steps(rec, &s, 1);
            q->steps++;
            q->generated += s.emitted;
            q->ctx += s.emitted;
            if (q->steps >= 10 + (uint32_t)(q->conv % 4) * 3) {
                int unfinished = leave_unfinished && next_conv == SAMPLE_CONVS && q->turn == 0 &&
                                 q->conv == SAMPLE_CONVS - 1;
                struct ds_rec_request r;
                memset(&r, 0, sizeof r);
                r.start_ns = q->start_ns;
                r.end_ns = clock_ns + s.total_ns;
                r.request = q->request;
                r.dataset_index = (uint32_t)q->conv;
                r.category = cats[q->conv % 3];
                r.conversation = cats[3 + q->conv];
                r.prompt_len = q->prompt;
                r.generated_len = q->generated;
                r.steps = q->steps;
                r.batch_size = B;
                r.turn = (uint16_t)q->turn;
                r.stop_reason = q->conv % 5 == 0 ? DS_REC_STOP_MAX_NEW_TOKENS
                                : nonfinite      ? DS_REC_STOP_ERROR
                                                 : DS_REC_STOP_RETURN;
                if (!unfinished && !st) st = ds_recorder_append_requests(rec, &r, 1);
                if (q->turn + 1 < turns_of[q->conv]) {
                    q->turn++;
                    q->request = (*next_request)++;
                    q->prompt = q->ctx += 20;
                    q->generated = 1;
                    q->steps = 0;
                    q->start_ns = clock_ns;
                } else {
                    q->live = 0;
                }
            }
        }
        // Phase ranges and a few kernels per step.
        static const uint8_t phases[] = {DS_REC_PHASE_DRAFT_EXTEND, DS_REC_PHASE_DRAFT_STEP,
                                         DS_REC_PHASE_DRAFT_STEP, DS_REC_PHASE_VERIFY,
                                         DS_REC_PHASE_ACCEPT};
        uint64_t dur[] = {draft_ns / 3, draft_ns / 3, draft_ns - 2 * (draft_ns / 3), verify_ns,
                          accept_ns};
        uint64_t t = clock_ns;
        for (int p = 0; p < 5 && !st && traced; p++) {
            struct ds_rec_range g = {.step = sid,
                                     .start_ns = t,
                                     .end_ns = t + dur[p],
                                     .batch_size = (uint16_t)live,
                                     .phase = phases[p],
                                     .draft_step = (uint8_t)(p == 1   ? 1
                                                             : p == 2 ? 2
                                                                      : 0)};
            struct ds_rec_kernel k;
            memset(&k, 0, sizeof k);
            k.step = sid;
            k.start_ns = t + 1000;
            k.end_ns = t + dur[p] - 1000;
            k.name = kname[p == 3 ? 1 : p == 4 ? 2 : 0];
            k.grid_x = 132;
            k.block_x = 256;
            k.correlation = (uint32_t)(sid * 8 + (uint64_t)p);
            k.registers = 64;
            k.phase = phases[p];
            k.draft_step = g.draft_step;
            st = ds_recorder_append_ranges(rec, &g, 1);
            if (!st) st = ds_recorder_append_kernels(rec, &k, 1);
            t += dur[p];
        }
        clock_ns = t + 10000;
    }
    return st;
}

static int write_sample(const char *path, int traced) {
    static const uint32_t batches[] = {1, 4, 8};
    struct ds_run_meta meta = hand_meta();
    meta.command_line = "draftscope run --target tiny-target --draft tiny-draft --k 3 "
                        "--batch-sizes 1,4,8 --trace kernels";
    meta.target_path = "models/tiny/target";
    meta.draft_path = "models/tiny/draft";
    meta.dataset_path = "tests/data/spec_bench_questions.jsonl";
    meta.batch_sizes = batches;
    meta.n_batch_sizes = 3;
    meta.trace_level = traced ? DS_REC_TRACE_KERNELS : DS_REC_TRACE_OFF;
    // A baseline for B 1 and 4 only, so that B 8 shows "no baseline", dataset skips and the
    // model loads (as cmd_run.c writes them).
    if (traced)
        meta.options_json = "{\"baseline\":[{\"batch_size\":1,\"mean_ns\":1010000,"
                            "\"median_ns\":1000000,\"min_ns\":990000,\"steps\":50},"
                            "{\"batch_size\":4,\"mean_ns\":1230000,\"median_ns\":1200000,"
                            "\"min_ns\":1150000,\"steps\":50}],\"trace\":\"kernels\","
                            "\"trace_overhead\":0.031,\"dataset\":{\"format\":\"question\","
                            "\"records_read\":40,\"conversations\":37,\"requests\":37,"
                            "\"skipped_empty\":1,\"skipped_malformed\":2,\"first_skip\":"
                            "\"questions.jsonl: line 7: record 6: invalid JSON: ']' expected\"},"
                            "\"load\":{\"target\":{\"bytes\":65250000000,\"seconds\":1.5,"
                            "\"uploaded\":true},\"draft\":{\"bytes\":1930000000,"
                            "\"seconds\":0.125,\"uploaded\":true}}}";
    ds_recorder_t *rec = NULL;
    uint32_t cats[3 + SAMPLE_CONVS], kname[3];
    static const char *cat_names[3] = {"coding", "math", "writing"};
    rng_state = 12345;
    unlink(path);
    enum ds_status st = ds_recorder_create(path, &meta, 0, &rec);
    for (int i = 0; i < 3 && !st; i++)
        st = ds_recorder_intern(rec, cat_names[i], &cats[i]);
    for (int i = 0; i < SAMPLE_CONVS && !st; i++) {
        char id[32];
        snprintf(id, sizeof id, "q%03d", 81 + i);
        st = ds_recorder_intern(rec, id, &cats[3 + i]);
    }
    static const char *kernels[3] = {"bf16_gemv_draft", "f32_mxfp4w_moe_matmul_swiglu",
                                     "f32_topk_softmax_e32_k4"};
    for (int i = 0; i < 3 && !st; i++)
        st = ds_recorder_intern(rec, kernels[i], &kname[i]);
    uint64_t step_id = 0;
    uint32_t next_request = 0;
    for (int b = 0; b < 3 && !st; b++)
        st = simulate(rec, (uint16_t)batches[b], &step_id, &next_request, cats, kname, b == 2,
                      traced);
    struct ds_run_end end = {.status = DS_REC_SESSION_CLOSED,
                             .trace_overhead = traced ? 0.031 : NAN,
                             .trace_dropped = traced ? 7 : 0};
    if (!st) st = ds_recorder_set_end(rec, &end);
    enum ds_status cst = ds_recorder_close(rec);
    if (st || cst) {
        fprintf(stderr, "write-sample: %s\n", ds_error_last());
        return 1;
    }
    return 0;
}

// `test_summary --write-live PATH`: a writer that a reader can watch grow. Writes and flushes the
// hand run without its /requests rows and prints "ready"; at each line read from stdin, appends
// and flushes the next part (first the requests, then again a copy of every step and draft row)
// and prints "ready" again; closes at the end of input.
static int write_live(const char *path) {
    struct ds_run_meta meta = hand_meta();
    ds_recorder_t *rec = NULL;
    char line[64];
    const struct ds_rec_request reqs[] = {
        {.request = 0, .generated_len = 8, .steps = 3, .batch_size = 1},
        {.request = 1, .generated_len = 8, .steps = 2, .batch_size = 2},
        {.request = 2, .generated_len = 4, .steps = 2, .batch_size = 2, .turn = 1},
    };
    unlink(path);
    enum ds_status st = ds_recorder_create(path, &meta, 0, &rec);
    if (!st) st = append_hand_rows(rec, 0);
    if (!st) st = ds_recorder_flush(rec);
    for (int part = 0; !st; part++) {
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) break;
        if (part == 0)
            st = ds_recorder_append_requests(rec, reqs, 3);
        else
            st = append_hand_rows(rec, 0);
        if (!st) st = ds_recorder_flush(rec);
    }
    enum ds_status cst = ds_recorder_close(rec);
    if (st || cst) {
        fprintf(stderr, "write-live: %s\n", ds_error_last());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (argc >= 3 && !strcmp(argv[1], "--write-sample"))
        return write_sample(argv[2], !(argc == 4 && !strcmp(argv[3], "--untraced")));
    if (argc == 3 && !strcmp(argv[1], "--write-live")) return write_live(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "--cmd")) return ds_cmd_summary(argc - 2, argv + 2);
    snprintf(dir, sizeof dir, "%s/test_summary.%d", DS_BINARY_DIR, (int)getpid());
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "cannot create %s\n", dir);
        return 1;
    }
    DS_RUN(hand_run_by_batch);
    DS_RUN(hand_run_other_keys);
    DS_RUN(json_output);
    DS_RUN(live_and_killed_files);
    DS_RUN(refuses_bad_files);
    DS_RUN(refuses_rows_breaking_the_schema);
    DS_RUN(undrafted_steps_left_out);
    DS_RUN(nonfinite_steps_left_out);
    DS_RUN(step_times_and_speedup);
    DS_RUN(command_exit_codes);
    int rc = ds_test_end();
    if (rc == 0) {
        // Keep the files of a failing run for inspection; remove them otherwise.
        const char *names[] = {"hand.h5",     "hand_keys.h5", "hand_json.h5", "hand.json",
                               "live.h5",     "text.h5",      "plain.h5",     "v2.h5",
                               "bad_step.h5", "bad_draft.h5", "empty.h5",     "cmd.h5",
                               "timed.h5",    "timed.txt"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            unlink(tmp_path(names[i]));
        rmdir(dir);
    }
    return rc;
}
