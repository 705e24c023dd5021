// CPU/CUDA parity of `draftscope run` (greedy rule) on the golden tiny pair: the same replay
// (4 conversations, B = 1,4, K 3, 24 new tokens) once with --device cpu and once with
// --device cuda --activations f32 must give the same records, so the profiler is the same tool
// on either device. Checked per row of /drafts and /steps:
//   - integer fields exactly (step, request, position, draft token, target argmax, accepted,
//     channel, context length, batch size; steps: drafted, accepted, emitted, nonfinite,
//     distinct experts per layer): greedy decisions are argmaxes, which fp32 noise cannot flip
//     unless two logits tie within ~1e-5 (the margin is printed with a mismatch to show it);
//   - probabilities (q, p of the draft token, p of the target token, margin, expected
//     acceptance) within PROB_TOL absolute: both sides compute in fp32, only the summation
//     order differs, and the tiny goldens agree with the CPU to ~1e-5 (tests/gpu_models.c), so
//     1e-4 leaves a 10x margin while catching any real difference (a wrong row, a bf16 path);
//   - entropies within ENT_REL relative (plus ENT_ABS for entropies near 0): -sum p log p adds
//     up the vocabulary in a different order on each side; 1e-3 covers that, not a bug.
// The first mismatch of each table is printed with the neighbouring rows' context.
// Under DS_GPU_TEST_SMALL (the sanitizer pass, whose cost is per kernel launch) the replay is
// about 5x shorter: conversations a and d, B = 1,2, 8 new tokens (on the CPU: 24 steps rows, 72
// drafts, 4 of them accepted); the comparison is the same.
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/device.h"
#include "ds/record.h"
#include "gpu_ops_common.h" // g_small_only
#include "harness.h"
#include "run_attr.h"
#include "run_util.h"

int ds_cmd_run(int argc, char **argv);

#define DIR DS_BINARY_DIR "/gpu_replay_parity"
#define DATA DIR "/conv.jsonl"
#define OUT_CPU DIR "/cpu.h5"
#define OUT_CUDA DIR "/cuda.h5"
#define PROB_TOL 1e-4 // fp32 both sides, different summation order (see the header comment)
#define ENT_REL 1e-3  // relative, entropies (a vocabulary-long sum in another order)
#define ENT_ABS 1e-6  // entropies close to 0 (a near one-hot distribution)

// Prompts of a few lengths in the tiny tokenizer's alphabet (the ones tests/test_run.c uses,
// plus a longer one so a B = 4 step mixes context lengths).
#define CONV_A                                                                                     \
    "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"hello world\"}]}\n"
#define CONV_D                                                                                     \
    "{\"id\": \"d\", \"conversations\": [{\"from\": \"human\", \"value\": \"held world hello "    \
    "or hell\"}]}\n"
static const char CONVS[] =
    CONV_A
    "{\"id\": \"b\", \"conversations\": [{\"from\": \"human\", \"value\": \"hell or held\"}]}\n"
    "{\"id\": \"c\", \"conversations\": [{\"from\": \"human\", \"value\": \"world\"}]}\n"
    CONV_D;
// Small mode: the longest prompt stays, so a B = 2 step still mixes context lengths.
static const char CONVS_SMALL[] = CONV_A CONV_D;
static int small; // DS_GPU_TEST_SMALL: the shorter replay

static int run_device(const char *out, const char *device, const char *act, char *err,
                      size_t cap) {
    char *argv[] = {"run", "--target", RU_TARGET, "--draft", RU_DRAFT, "--tokenizer",
                    RU_TOKENIZER, "--dataset", DATA, "--out", (char *)out, "--quiet",
                    "--overwrite", "--rule", "greedy", "--batch-sizes", small ? "1,2" : "1,4",
                    "--draft-tokens", "3", "--max-new-tokens", small ? "8" : "24", "--device",
                    (char *)device, "--activations", (char *)act, NULL};
    return ru_capture(ds_cmd_run, (int)(sizeof argv / sizeof *argv) - 1, argv, err, cap);
}

// The same replay on CUDA (bf16, the default numerics) with extra options.
static int run_cuda_with(const char *out, const char *o1, const char *o2, char *err, size_t cap) {
    char *argv[] = {"run", "--target", RU_TARGET, "--draft", RU_DRAFT, "--tokenizer",
                    RU_TOKENIZER, "--dataset", DATA, "--out", (char *)out, "--quiet",
                    "--overwrite", "--rule", "greedy", "--batch-sizes", small ? "1,2" : "1,4",
                    "--draft-tokens", "3", "--max-new-tokens", small ? "8" : "24", "--device",
                    "cuda", (char *)o1, (char *)o2, NULL};
    return ru_capture(ds_cmd_run, (int)(sizeof argv / sizeof *argv) - 1 - !o1 - !o2, argv, err,
                      cap);
}

// --pad-to-graph-sizes 8,32 (B 1: 4 verify rows run as 8; B 4: 16 as 32, with dummy rows in
// scratch slots) on CUDA with bf16 activations: the drafts and steps tables are those of the
// unpadded replay byte for byte, the property the check in docs/cli.md relies on.
static void test_padding_changes_nothing(void) {
    char err[8192];
    EXPECT_EQ_INT(run_cuda_with(OUT_CPU, NULL, NULL, err, sizeof err), 0);
    EXPECT_EQ_INT(run_cuda_with(OUT_CUDA, "--pad-to-graph-sizes", "8,32", err, sizeof err), 0);
    if (ds_t_case_failures) {
        printf("# %s", err);
        return;
    }
    char opt[4096];
    ru_read_options(OUT_CUDA, opt, sizeof opt);
    EXPECT(strstr(opt, "\"pad_to_graph_sizes\":[8,32]") != NULL);
    static const struct {
        const char *name;
        size_t size;
    } tables[] = {{"drafts", sizeof(struct ds_rec_draft)}, {"steps", sizeof(struct ds_rec_step)}};
    for (int t = 0; t < 2; t++) {
        size_t na = 0, nb = 0;
        void *a = ru_read_table(OUT_CPU, tables[t].name, tables[t].size, &na);
        void *b = ru_read_table(OUT_CUDA, tables[t].name, tables[t].size, &nb);
        printf("# %s: %zu rows plain, %zu padded\n", tables[t].name, na, nb);
        EXPECT(a && b && na > 0 && na == nb);
        if (a && b && na == nb && memcmp(a, b, na * tables[t].size))
            DS_FAILF("%s of the padded replay differ from the plain one", tables[t].name);
        free(a), free(b);
    }
}

static int near_abs(float a, float b) { return fabs((double)a - (double)b) <= PROB_TOL; }

static int near_rel(float a, float b) {
    double d = fabs((double)a - (double)b);
    return d <= ENT_ABS || d <= ENT_REL * fmax(fabs((double)a), fabs((double)b));
}

static void print_draft(const char *side, size_t i, const struct ds_rec_draft *r) {
    printf("#   %-4s drafts[%zu]: step %llu req %u pos %u B %u ctx %u tok %d target %d acc %u "
           "ch %u q %.7f p %.7f p_top %.7f margin %.7f exp %.7f H_t %.7f H_d %.7f\n",
           side, i, (unsigned long long)r->step, r->request, r->position, r->batch_size,
           r->context_len, r->draft_token, r->target_token, r->accepted, r->channel, r->q_draft,
           r->p_draft, r->p_target, r->margin, r->expected_accept, r->entropy_target,
           r->entropy_draft);
}

static void print_step(const char *side, size_t i, const struct ds_rec_step *r) {
    printf("#   %-4s steps[%zu]: step %llu req %u B %u turn %u ctx %u drafted %u accepted %u "
           "emitted %u nonfinite %u experts[0..1] %u %u\n",
           side, i, (unsigned long long)r->step, r->request, r->batch_size, r->turn,
           r->context_len, r->drafted, r->accepted, r->emitted, r->nonfinite,
           r->distinct_experts[0], r->distinct_experts[1]);
}

// Which field of a drafts row differs ("" when none).
static const char *draft_diff(const struct ds_rec_draft *a, const struct ds_rec_draft *b) {
    if (a->step != b->step) return "step";
    if (a->request != b->request) return "request";
    if (a->position != b->position) return "position";
    if (a->batch_size != b->batch_size) return "batch_size";
    if (a->context_len != b->context_len) return "context_len";
    if (a->draft_token != b->draft_token) return "draft_token";
    if (a->target_token != b->target_token) return "target_token";
    if (a->accepted != b->accepted) return "accepted";
    if (a->channel != b->channel) return "channel";
    if (!near_abs(a->q_draft, b->q_draft)) return "q_draft";
    if (!near_abs(a->p_draft, b->p_draft)) return "p_draft";
    if (!near_abs(a->p_target, b->p_target)) return "p_target";
    if (!near_abs(a->margin, b->margin)) return "margin";
    if (!near_abs(a->expected_accept, b->expected_accept)) return "expected_accept";
    if (!near_rel(a->entropy_target, b->entropy_target)) return "entropy_target";
    if (!near_rel(a->entropy_draft, b->entropy_draft)) return "entropy_draft";
    return "";
}

static const char *step_diff(const struct ds_rec_step *a, const struct ds_rec_step *b) {
    if (a->step != b->step) return "step";
    if (a->request != b->request) return "request";
    if (a->batch_size != b->batch_size) return "batch_size";
    if (a->turn != b->turn) return "turn";
    if (a->context_len != b->context_len) return "context_len";
    if (a->drafted != b->drafted) return "drafted";
    if (a->accepted != b->accepted) return "accepted";
    if (a->emitted != b->emitted) return "emitted";
    if (a->nonfinite != b->nonfinite) return "nonfinite";
    for (int l = 0; l < DS_RECORD_MAX_LAYERS; l++)
        if (a->distinct_experts[l] != b->distinct_experts[l]) return "distinct_experts";
    return "";
}

static void test_parity(void) {
    mkdir(DIR, 0755);
    EXPECT(ru_write(DATA, small ? CONVS_SMALL : CONVS));
    char err[8192];
    int rc = run_device(OUT_CPU, "cpu", "auto", err, sizeof err);
    if (rc != 0) printf("# cpu run: %s", err);
    EXPECT_EQ_INT(rc, 0);
    rc = run_device(OUT_CUDA, "cuda", "f32", err, sizeof err);
    if (rc != 0) printf("# cuda run: %s", err);
    EXPECT_EQ_INT(rc, 0);
    if (ds_t_case_failures) return;

    // Both files say which dtype ran (auto resolves to f32 on the CPU).
    char opt[4096];
    ru_read_options(OUT_CPU, opt, sizeof opt);
    EXPECT(strstr(opt, "\"activations\":\"f32\"") != NULL);
    ru_read_options(OUT_CUDA, opt, sizeof opt);
    EXPECT(strstr(opt, "\"activations\":\"f32\"") != NULL);

    size_t nd_c = 0, nd_g = 0, ns_c = 0, ns_g = 0;
    struct ds_rec_draft *dc = ru_read_table(OUT_CPU, "drafts", sizeof *dc, &nd_c);
    struct ds_rec_draft *dg = ru_read_table(OUT_CUDA, "drafts", sizeof *dg, &nd_g);
    struct ds_rec_step *sc = ru_read_table(OUT_CPU, "steps", sizeof *sc, &ns_c);
    struct ds_rec_step *sg = ru_read_table(OUT_CUDA, "steps", sizeof *sg, &ns_g);
    printf("# rows: drafts cpu %zu cuda %zu, steps cpu %zu cuda %zu\n", nd_c, nd_g, ns_c, ns_g);
    EXPECT(dc && dg && sc && sg);
    EXPECT(nd_c > 0 && ns_c > 0);
    EXPECT_EQ_INT(nd_c, nd_g);
    EXPECT_EQ_INT(ns_c, ns_g);
    if (!dc || !dg || !sc || !sg) goto cleanup;

    // Compared over the common prefix so a count mismatch still shows where they part.
    size_t n = nd_c < nd_g ? nd_c : nd_g, bad = 0, accepted = 0;
    double max_p = 0, max_h = 0;
    for (size_t i = 0; i < n; i++) {
        accepted += dc[i].accepted;
        max_p = fmax(max_p, fabs((double)dc[i].p_draft - dg[i].p_draft));
        max_p = fmax(max_p, fabs((double)dc[i].q_draft - dg[i].q_draft));
        max_h = fmax(max_h, fabs((double)dc[i].entropy_target - dg[i].entropy_target));
        const char *what = draft_diff(&dc[i], &dg[i]);
        if (!*what) continue;
        if (bad++ == 0) {
            printf("# first drafts mismatch at row %zu: %s\n", i, what);
            for (size_t j = i > 2 ? i - 2 : 0; j <= i; j++) {
                print_draft("cpu", j, &dc[j]);
                print_draft("cuda", j, &dg[j]);
            }
        }
    }
    printf("# drafts: %zu rows compared, %zu accepted, %zu mismatched; max |dp|,|dq| %.3g, "
           "max |dH_target| %.3g\n", n, accepted, bad, max_p, max_h);
    EXPECT_EQ_INT(bad, 0);
    EXPECT(accepted > 0); // the pair agrees sometimes, so accept decisions are exercised

    n = ns_c < ns_g ? ns_c : ns_g;
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        const char *what = step_diff(&sc[i], &sg[i]);
        if (!*what) continue;
        if (bad++ == 0) {
            printf("# first steps mismatch at row %zu: %s\n", i, what);
            for (size_t j = i > 2 ? i - 2 : 0; j <= i; j++) {
                print_step("cpu", j, &sc[j]);
                print_step("cuda", j, &sg[j]);
            }
        }
    }
    printf("# steps: %zu rows compared, %zu mismatched\n", n, bad);
    EXPECT_EQ_INT(bad, 0);

cleanup:
    free(dc);
    free(dg);
    free(sc);
    free(sg);
}

int main(void) {
    if (ds_cuda_device_count() == 0) DS_SKIP("no CUDA device");
    small = g_small_only();
    if (small)
        printf("small mode (DS_GPU_TEST_SMALL) shortened the replay to conversations a and d, "
               "B = 1,2, 8 new tokens (full: 4 conversations, B = 1,4, 24 new tokens)\n");
    DS_RUN(test_parity);
    DS_RUN(test_padding_changes_nothing);
    unlink(OUT_CPU);
    unlink(OUT_CUDA);
    return ds_test_end();
}
