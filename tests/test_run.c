// `draftscope run` end to end (ds_cmd_run, in process, on the CPU reference with the golden tiny
// pair): a sweep writes a file the summary reads; bad flags, missing files, a mismatched pair, an
// unwritable or non-regular output path (/dev/full) each give one clear line and leave no file;
// a file-size limit (RLIMIT_FSIZE) stops the run with a readable file; SIGINT closes the file
// cleanly (exit 130) and --resume completes the sweep; after SIGKILL the file is readable and
// --resume completes it with exactly one /requests row per (batch size, request).
//
// --synthetic-weights: exclusive with --target/--draft, needs --tokenizer, bad specs are usage
// errors (a config file that exists but does not parse is an input error), no GPU is one line and
// exit 1 (on a machine with a GPU that case is skipped: it would build the 20b model), and on the
// cpu (forced with --device cpu) a synthetic model of the golden config runs end to end, the
// file naming it synthetic and --resume refusing another seed.
//
// Runs that must be signalled or limited execute in a child process started from this very
// binary (`test_run --run ARGS...`), never in a fork of a process that already used OpenMP.
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ds/device.h"
#include "ds/record.h"
#include "ds/safetensors.h"
#include "ds/sha256.h"
#include "ds/summary.h"
#include "harness.h"
#include "run_attr.h"
#include "run_util.h"

int ds_cmd_run(int argc, char **argv);

#define DIR DS_BINARY_DIR "/test_run"
#define DATA DIR "/conv.jsonl"

static const char CONVS[] =
    "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"hello world\"}]}\n"
    "{\"id\": \"b\", \"conversations\": [{\"from\": \"human\", \"value\": \"hell or held\"}]}\n"
    "{\"id\": \"c\", \"conversations\": [{\"from\": \"human\", \"value\": \"world\"}]}\n";

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

// argv for ds_cmd_run: the common inputs, then `extra` (NULL-terminated).
static int build_argv(char **argv, const char *out, const char *const *extra) {
    int n = 0;
    argv[n++] = "run";
    argv[n++] = "--target";
    argv[n++] = RU_TARGET;
    argv[n++] = "--draft";
    argv[n++] = RU_DRAFT;
    argv[n++] = "--tokenizer";
    argv[n++] = RU_TOKENIZER;
    argv[n++] = "--dataset";
    argv[n++] = DATA;
    argv[n++] = "--out";
    argv[n++] = (char *)out;
    argv[n++] = "--quiet";
    argv[n++] = "--device";
    argv[n++] = "cpu";
    for (; extra && *extra; extra++)
        argv[n++] = (char *)*extra;
    argv[n] = NULL;
    return n;
}

static int run_cli(const char *out, const char *const *extra, char *err, size_t cap) {
    char *argv[64];
    int argc = build_argv(argv, out, extra);
    return ru_capture(ds_cmd_run, argc, argv, err, cap);
}

// run_cli with argument `arg` of the common inputs replaced by `value` (2: the target, 4: the
// draft).
static int run_cli_with(const char *out, int arg, const char *value, const char *const *extra,
                        char *err, size_t cap) {
    char *argv[64];
    int argc = build_argv(argv, out, extra);
    argv[arg] = (char *)value;
    return ru_capture(ds_cmd_run, argc, argv, err, cap);
}

static void expect_same_file(const char *path, const unsigned char *want, size_t n_want) {
    size_t n = 0;
    unsigned char *got = ru_slurp(path, &n);
    EXPECT_EQ_INT((long long)n, (long long)n_want);
    EXPECT(got && want && n == n_want && memcmp(got, want, n) == 0);
    free(got);
}

static void test_bad_flags(void) {
    const char *out = DIR "/flags.h5";
    char err[4096];
    struct {
        const char *a, *b, *needle;
    } cases[] = {
        {"--rule", "typical", "--rule"},
        {"--draft-tokens", "0", "--draft-tokens"},
        {"--draft-tokens", "17", "--draft-tokens"},
        {"--batch-sizes", "", "--batch-sizes"},
        {"--batch-sizes", "1,,2", "--batch-sizes"},
        {"--batch-sizes", "0", "--batch-sizes"},
        {"--batch-sizes", "1,2,1", "lists a size twice"}, // rows are keyed by B
        {"--batch-sizes", "+1", "--batch-sizes"},
        {"--batch-sizes", "1,", "--batch-sizes"},
        {"--temperature", "-1", "--temperature"},
        {"--top-p", "1.5", "--top-p"},
        // Taken as floats: 1e-38 made softmax NaN and the accept step blame the draft
        // checkpoint; 1e-50 is a top-p of 0; both were refused only after the models loaded.
        {"--temperature", "1e-38", "--temperature wants a number in 1e-06..1e+06"},
        {"--temperature", "1e300", "--temperature wants a number in 1e-06..1e+06"},
        {"--top-p", "1e-50", "--top-p wants a number in (0, 1]"},
        {"--turns", "some", "--turns"},
        {"--aux-convention", "sideways", "--aux-convention wants output-of, capture-before or"},
        {"--numerics", "fast", "--numerics wants invariant or batch-variant"},
        {"--pad-to-graph-sizes", "8,4", "--pad-to-graph-sizes wants its sizes in ascending"},
        {"--pad-to-graph-sizes", "0,4", "--pad-to-graph-sizes wants a comma-separated list"},
        {"--pad-to-graph-sizes", "65536", "--pad-to-graph-sizes wants a comma-separated list"},
        // build_argv asks for the cpu, whose reference has one order
        {"--numerics", "batch-variant", "--numerics batch-variant needs --device cuda"},
        {"--bogus", "1", "unknown option"},
        // Too large is told the whole range, not "wants >= 1".
        {"--max-new-tokens", "99999999999", "--max-new-tokens wants an integer in 1..1073741823"},
        {"--max-new-tokens", "0", "--max-new-tokens wants an integer in 1..1073741823"},
        {"--num-conversations", "2147483648", "wants an integer in 1..2147483647"},
        {"--max-context", "1", "--max-context wants an integer in 2..2147483647"},
        {"--prefill-chunk", "1048577", "--prefill-chunk wants an integer in 1..1048576"},
        {"--draft-tokens", "17", "--draft-tokens wants an integer in 1..16"},
        {"--seed", "9223372036854775808", "--seed wants an integer in 0..9223372036854775807"},
        {"--seed", "-1", "--seed wants an integer in 0..9223372036854775807"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *extra[] = {cases[i].a, cases[i].b, NULL};
        int rc = run_cli(out, extra, err, sizeof err);
        EXPECT_EQ_INT(rc, 2);
        if (!strstr(err, cases[i].needle))
            DS_FAILF("%s %s: message lacks '%s': %s", cases[i].a, cases[i].b, cases[i].needle,
                     err);
    }
    // The largest seed is taken and recorded as given.
    const char *max_seed[] = {"--seed", "9223372036854775807", "--max-new-tokens", "2",
                              "--num-conversations", "1", NULL};
    EXPECT_EQ_INT(run_cli(out, max_seed, err, sizeof err), 0);
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) EXPECT(s->seed == (uint64_t)INT64_MAX);
    if (s) EXPECT_EQ_STR(s->numerics, "invariant"); // options_json.numerics, always written
    ds_summary_free(s);
    unlink(out);
    // --device auto that finds no GPU: batch-variant numerics is refused once the device is
    // known (exit 1, one line), before any file exists. (With a GPU auto resolves to it.)
    if (ds_cuda_device_count() == 0) {
        const char *auto_variant[] = {"--device", "auto", "--numerics", "batch-variant", NULL};
        EXPECT_EQ_INT(run_cli(out, auto_variant, err, sizeof err), 1);
        EXPECT(strstr(err, "--numerics batch-variant needs the cuda device (running on ") != NULL);
        EXPECT(!exists(out));
    }
    // A missing required option.
    char *argv[] = {"run", "--target", RU_TARGET, NULL};
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, 3, argv, err, sizeof err), 2);
    EXPECT(strstr(err, "--draft") != NULL);
    EXPECT(!exists(out));
}

static void test_bad_inputs(void) {
    char err[4096];
    const char *out = DIR "/bad.h5";
    // Missing target directory: one line naming it, exit 1, no file.
    char *argv[64];
    int argc = build_argv(argv, out, NULL);
    argv[2] = DIR "/no-such-target";
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    EXPECT(strstr(err, "no-such-target") != NULL);
    EXPECT(!exists(out));
    // Missing dataset.
    argc = build_argv(argv, out, NULL);
    argv[8] = DIR "/no-such-data.jsonl";
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    EXPECT(strstr(err, "no-such-data.jsonl") != NULL);
    EXPECT(!exists(out));
    // A mismatched pair: the draft's config claims another hidden size than the target's.
    const char *bad = DIR "/draft-mismatch";
    mkdir(bad, 0755);
    FILE *f = fopen(RU_DRAFT "/config.json", "r");
    char cfg[8192] = "";
    size_t n = f ? fread(cfg, 1, sizeof cfg - 1, f) : 0;
    if (f) fclose(f);
    cfg[n] = 0;
    char *hs = strstr(cfg, "\"hidden_size\": 64");
    EXPECT(hs != NULL);
    if (hs) memcpy(hs, "\"hidden_size\": 32", 17);
    EXPECT(ru_write(DIR "/draft-mismatch/config.json", cfg));
    unlink(DIR "/draft-mismatch/model.safetensors");
    EXPECT(symlink(RU_DRAFT "/model.safetensors", DIR "/draft-mismatch/model.safetensors") == 0);
    argc = build_argv(argv, out, NULL);
    argv[4] = (char *)bad;
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    printf("  mismatched pair: %s", err);
    EXPECT(strstr(err, "draft-mismatch") != NULL);
    EXPECT(strchr(err, '\n') == strrchr(err, '\n')); // one line
    EXPECT(!exists(out));
    // A tokenizer that does not exist.
    argc = build_argv(argv, out, NULL);
    argv[6] = DIR "/no-tokenizer.json";
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    EXPECT(strstr(err, "no-tokenizer.json") != NULL);
    EXPECT(!exists(out));
}

// Writes DIR/<name>/ with the fixture checkpoint `src`'s tensors (a link) and its config.json
// with `from` replaced by `to` (the same length); returns the directory.
static const char *edited_checkpoint(const char *name, const char *src, const char *from,
                                     const char *to) {
    static char dir[512];
    char path[600], cfg[8192] = "";
    snprintf(dir, sizeof dir, "%s/%s", DIR, name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", src);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(cfg, 1, sizeof cfg - 1, f) : 0;
    if (f) fclose(f);
    cfg[n] = 0;
    char *at = strstr(cfg, from);
    EXPECT(at != NULL && strlen(from) == strlen(to));
    if (at) memcpy(at, to, strlen(to));
    snprintf(path, sizeof path, "%s/config.json", dir);
    EXPECT(ru_write(path, cfg));
    char tensors[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tensors, sizeof tensors, "%s/model.safetensors", src);
    unlink(path);
    EXPECT(symlink(tensors, path) == 0);
    return dir;
}

// Runs with `target` and `draft` for the pair, a dataset that does not exist and `extra`;
// returns the exit code, with stderr in err.
static int run_without_data(const char *out, const char *target, const char *draft,
                            const char *const *extra, char *err, size_t cap) {
    char *argv[64];
    int argc = build_argv(argv, out, extra);
    argv[2] = (char *)target;
    argv[4] = (char *)draft;
    argv[8] = DIR "/no-such-data.jsonl";
    return ru_capture(ds_cmd_run, argc, argv, err, cap);
}

// Checkpoints a loader would refuse are refused before the tokenizer, the dataset, the backend
// and the models (here the dataset does not exist, and that was the error; the draft's config was
// refused only after the target had loaded): one line naming config.json, exit 1, and no run
// file, an earlier one kept byte for byte even with --overwrite.
static void test_refused_checkpoints(void) {
    char err[4096], want[1024];
    const char *out = DIR "/refused.h5";
    const char *ow[] = {"--overwrite", NULL};
    unlink(out);
    // A vocab_size the embedding and lm_head disagree with: config.json, the file, both numbers.
    const char *tgt = edited_checkpoint("vocab-target", RU_TARGET, "\"vocab_size\": 512",
                                        "\"vocab_size\": 600");
    snprintf(want, sizeof want,
             "draftscope run: %s/config.json: vocab_size is 600, but tensor "
             "model.embed_tokens.weight in %s/model.safetensors has 512 rows (and 1 more "
             "problems)\n",
             tgt, tgt);
    EXPECT_EQ_INT(run_without_data(out, tgt, RU_DRAFT, NULL, err, sizeof err), 1);
    EXPECT_EQ_STR(err, want);
    EXPECT(!exists(out));
    EXPECT(ru_write(out, "an earlier file\n"));
    EXPECT_EQ_INT(run_without_data(out, tgt, RU_DRAFT, ow, err, sizeof err), 1);
    EXPECT_EQ_STR(err, want);
    expect_same_file(out, (const unsigned char *)"an earlier file\n", 16);
    // A draft the draft loader refuses for its config alone.
    const char *dr = edited_checkpoint("gelu-draft", RU_DRAFT, "\"hidden_act\": \"silu\"",
                                       "\"hidden_act\": \"gelu\"");
    snprintf(want, sizeof want,
             "draftscope run: %s/config.json: hidden_act: expected silu, found gelu\n", dr);
    EXPECT_EQ_INT(run_without_data(out, RU_TARGET, dr, ow, err, sizeof err), 1);
    EXPECT_EQ_STR(err, want);
    expect_same_file(out, (const unsigned char *)"an earlier file\n", 16);
    unlink(out);
}

static void test_bad_output(void) {
    char err[4096];
    // An empty path passed the checks (stat("") fails, dirname("") is ".") and failed after the
    // models loaded as "recorder: NULL path or metadata".
    EXPECT_EQ_INT(run_cli("", NULL, err, sizeof err), 1);
    EXPECT(strstr(err, "--out: an empty path") != NULL);
    // A directory that does not exist.
    EXPECT_EQ_INT(run_cli(DIR "/no-dir/run.h5", NULL, err, sizeof err), 1);
    EXPECT(strstr(err, "no-dir") != NULL);
    // /dev/full and a directory: not regular files; refused before anything is written (the
    // device node must survive: a cleanup that unlinks a half-created file must never reach it).
    const char *ow[] = {"--overwrite", NULL};
    EXPECT_EQ_INT(run_cli("/dev/full", ow, err, sizeof err), 1);
    EXPECT(strstr(err, "/dev/full: not a regular file") != NULL);
    struct stat sb;
    EXPECT(stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode));
    EXPECT_EQ_INT(run_cli(DIR, ow, err, sizeof err), 1);
    EXPECT(strstr(err, "not a regular file") != NULL);
    // An existing file is kept unless --overwrite or --resume.
    EXPECT(ru_write(DIR "/keep.h5", "not a run file\n"));
    EXPECT_EQ_INT(run_cli(DIR "/keep.h5", NULL, err, sizeof err), 1);
    EXPECT(strstr(err, "file exists") != NULL);
    // --resume of a file that is no run file: a format error, the file untouched.
    const char *rs[] = {"--resume", NULL};
    EXPECT_EQ_INT(run_cli(DIR "/keep.h5", rs, err, sizeof err), 1);
    FILE *f = fopen(DIR "/keep.h5", "r");
    char buf[32] = "";
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    EXPECT_EQ_STR(buf, "not a run file\n");
    // An input is never replaced, --overwrite or not, also through a link: the dataset, and a
    // file of the target (a scratch copy of the fixture, so that a failure cannot harm it).
    size_t n0 = 0;
    unsigned char *data = ru_slurp(DATA, &n0);
    EXPECT_EQ_INT(run_cli(DATA, ow, err, sizeof err), 1);
    EXPECT(strstr(err, "conv.jsonl: is the dataset; --out must name another file") != NULL);
    unlink(DIR "/link.h5");
    EXPECT(symlink(DATA, DIR "/link.h5") == 0);
    EXPECT_EQ_INT(run_cli(DIR "/link.h5", ow, err, sizeof err), 1);
    EXPECT(strstr(err, "link.h5: is the dataset") != NULL);
    expect_same_file(DATA, data, n0);
    free(data);
    const char *tgt = DIR "/target-copy";
    mkdir(tgt, 0755);
    EXPECT(ru_copy(RU_TARGET "/config.json", DIR "/target-copy/config.json"));
    EXPECT(ru_copy(RU_TARGET "/model.safetensors", DIR "/target-copy/model.safetensors"));
    unsigned char *cfg = ru_slurp(DIR "/target-copy/config.json", &n0);
    char *argv[64];
    int argc = build_argv(argv, DIR "/target-copy/config.json", ow);
    argv[2] = (char *)tgt;
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    EXPECT(strstr(err, "config.json: is a file of the target") != NULL);
    expect_same_file(DIR "/target-copy/config.json", cfg, n0);
    // The config of --synthetic-weights is an input too, as the file or as its directory: with
    // --overwrite the run file replaced it.
    const char *specs[] = {DIR "/target-copy/config.json", DIR "/target-copy:0:3"};
    for (int i = 0; i < 2; i++) {
        char *sargv[] = {"run",          "--synthetic-weights", (char *)specs[i],
                         "--tokenizer",  RU_TOKENIZER,          "--dataset",
                         DATA,           "--out",               DIR "/target-copy/config.json",
                         "--overwrite",  "--quiet",             "--device",
                         "cpu",          NULL};
        EXPECT_EQ_INT(ru_capture(ds_cmd_run, 13, sargv, err, sizeof err), 1);
        EXPECT(strstr(err, "config.json: is a file of the target") != NULL);
        expect_same_file(DIR "/target-copy/config.json", cfg, n0);
    }
    free(cfg);
}

static void test_run_and_summary(void) {
    char err[4096];
    const char *out = DIR "/ok.h5";
    unlink(out);
    const char *extra[] = {"--batch-sizes", "1,2", "--max-new-tokens", "10", "--draft-tokens",
                           "3", NULL};
    int rc = run_cli(out, extra, err, sizeof err);
    EXPECT_EQ_INT(rc, 0);
    if (rc) printf("  %s", err);
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->all.requests, 6); // 3 conversations x 2 batch sizes
        EXPECT_EQ_INT(s->n_groups, 2);
        EXPECT_EQ_INT(s->k, 3);
        EXPECT_EQ_STR(s->rule, "greedy");
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_CLOSED);
        EXPECT(s->all.steps > 0);
        EXPECT_EQ_INT(s->dropped_steps, 0);
    }
    ds_summary_free(s);
    // The file records which target boundaries fed the draft and under which reading of its aux
    // ids: the config's (output-of for this SpecForge draft) or --aux-convention's, which here
    // names each boundary one lower (an output-of id i is boundary i + 1).
    char opts[8192], opts_b[8192];
    ru_read_attr_str(out, "options_json", opts, sizeof opts);
    const char *conv_b[] = {"--aux-convention", "boundary", "--max-new-tokens", "2",
                            "--overwrite", NULL};
    EXPECT_EQ_INT(run_cli(DIR "/aux.h5", conv_b, err, sizeof err), 0);
    ru_read_attr_str(DIR "/aux.h5", "options_json", opts_b, sizeof opts_b);
    EXPECT(strstr(opts, "\"aux_convention\":\"output-of\"") != NULL);
    EXPECT(strstr(opts_b, "\"aux_convention\":\"boundary\"") != NULL);
    int b[2][3] = {{0}};
    const char *ab[2] = {strstr(opts, "\"aux_boundaries\":["),
                         strstr(opts_b, "\"aux_boundaries\":[")};
    for (int i = 0; i < 2; i++)
        EXPECT(ab[i] && sscanf(ab[i], "\"aux_boundaries\":[%d,%d,%d]", &b[i][0], &b[i][1],
                               &b[i][2]) == 3);
    for (int j = 0; j < 3; j++)
        EXPECT_EQ_INT(b[1][j], b[0][j] - 1);
    // A prompt beyond --max-context is skipped with a message, not a failure: the prompts are
    // 219, 223 and 220 tokens (render --ids), so 222 positions skip conversation b at both batch
    // sizes. The count is said even with --quiet (it was not: the file alone does not show what
    // was left out).
    const char *some[] = {"--max-context", "222",        "--overwrite",      "--batch-sizes",
                          "1,2",           "--max-new-tokens", "2",  NULL};
    EXPECT_EQ_INT(run_cli(out, some, err, sizeof err), 0);
    EXPECT(strstr(err, "2 requests skipped (prompt beyond the context limit of 222)") != NULL);
    s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) EXPECT_EQ_INT(s->all.requests, 4); // a and c at both batch sizes
    ds_summary_free(s);
    // When every prompt is skipped nothing is recorded, and the run fails saying so (it exited
    // 0 with an empty file).
    const char *small[] = {"--max-context", "8", "--overwrite", NULL};
    char *argv[64];
    int argc = build_argv(argv, out, small);
    argv[11] = "--json"; // in place of --quiet, so that the per-conversation notice is printed
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    EXPECT(strstr(err, "does not fit the context limit of 8 positions; skipped") != NULL);
    EXPECT(strstr(err, "ok.h5: no request recorded: every prompt is beyond the context limit "
                       "of 8 positions") != NULL);
}

// 1 when the summary's text holds `needle`.
static int summary_says(const struct ds_summary *s, const char *needle) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return 0;
    const int ok = ds_summary_print_text(s, f) == DS_OK;
    fclose(f);
    const int found = ok && text && strstr(text, needle) != NULL;
    free(text);
    return found;
}

// Copies the checkpoint in src (config.json, model.safetensors) to dst with lm_head row 7 set to
// bf16 NaN: every logit row of the copy holds one NaN. 1 on success.
static int nan_lm_head_copy(const char *src, const char *dst) {
    char from[512], to[512];
    snprintf(from, sizeof from, "%s/model.safetensors", src);
    ds_safetensors_t *st = NULL;
    EXPECT_OK(ds_safetensors_open_file(from, &st));
    const struct ds_tensor_info *lm = st ? ds_safetensors_find(st, "lm_head.weight") : NULL;
    int ok = lm && lm->dtype == DS_DTYPE_BF16 && lm->ndim == 2;
    EXPECT(ok);
    mkdir(dst, 0755);
    if (ok) {
        const uint64_t row = (uint64_t)lm->shape[1] * 2;
        snprintf(to, sizeof to, "%s/model.safetensors", dst);
        ok = ds_t_copy_with_nan(from, to, lm->file_offset + 7 * row, row);
        snprintf(from, sizeof from, "%s/config.json", src);
        snprintf(to, sizeof to, "%s/config.json", dst);
        ok = ok && ds_t_copy_with_nan(from, to, 0, 0);
    }
    ds_safetensors_close(st);
    EXPECT(ok);
    return ok;
}

// A target whose lm_head row 7 is NaN: every prompt's last logits hold one NaN, so every p of
// the row is NaN while the argmax (which skips NaN) is a number. Each request ends with error at
// its prompt, before any step; the file says so (summary error_requests), and with no request
// left to measure the run fails with one line naming the file (it exited 0 and printed empty
// metrics). The file itself is complete: its session closed, every request recorded.
static void test_nan_target(void) {
    char err[4096];
    const char *dir = DIR "/nan-target", *out = DIR "/nan.h5";
    unlink(out);
    if (!nan_lm_head_copy(RU_TARGET, dir)) return;
    const char *extra[] = {"--batch-sizes", "1,2", "--max-new-tokens", "4", NULL};
    EXPECT_EQ_INT(run_cli_with(out, 2, dir, extra, err, sizeof err), 1); // --target dir
    EXPECT(strstr(err, "6 requests ended with error: non-finite target logits") != NULL);
    EXPECT(strstr(err, "nan.h5: every request (6) ended with non-finite target logits") != NULL);
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->rows_requests, 6); // 3 conversations x 2 batch sizes
        EXPECT_EQ_INT(s->rows_steps, 0);
        EXPECT_EQ_INT(s->error_requests, 6);
        EXPECT_EQ_INT(s->error_requests_at_prompt, 6);
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_CLOSED);
        EXPECT(summary_says(s, "6 requests ended with error (non-finite target logits), 6 of "
                               "them at the prompt's last logits, before any step"));
    }
    ds_summary_free(s);
    // The same pair with the real target: no request ends with error, and the summary says
    // nothing of errors.
    unlink(out);
    const char *fine[] = {"--batch-sizes", "1", "--max-new-tokens", "4", NULL};
    EXPECT_EQ_INT(run_cli(out, fine, err, sizeof err), 0);
    EXPECT(strstr(err, "ended with error") == NULL);
    s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) EXPECT_EQ_INT(s->error_requests, 0);
    ds_summary_free(s);
}

// A draft whose lm_head row 7 is NaN: every row of q is NaN, while the argmax (which skips NaN)
// still drafts tokens. Under greedy acceptance the run completes and its acceptance is what
// happened, but the run says how many drafted tokens had no finite probability, every such row
// stores q_draft, expected_accept and entropy_draft as NaN (entropy_draft read 0: a sum over
// q > 0), and the summary counts them (nonfinite_q_drafts) and says so.
static void test_nan_draft(void) {
    char err[4096];
    const char *dir = DIR "/nan-draft", *out = DIR "/nan-draft.h5";
    unlink(out);
    if (!nan_lm_head_copy(RU_DRAFT, dir)) return;
    const char *extra[] = {"--batch-sizes", "1", "--max-new-tokens", "6", NULL};
    EXPECT_EQ_INT(run_cli_with(out, 4, dir, extra, err, sizeof err), 0); // --draft dir
    size_t nd = 0;
    struct ds_rec_draft *d = ru_read_table(out, "drafts", sizeof *d, &nd);
    EXPECT(nd > 0);
    size_t bad = 0;
    for (size_t i = 0; i < nd; i++) {
        bad += isnan(d[i].q_draft);
        EXPECT(isnan(d[i].q_draft) && isnan(d[i].expected_accept) && isnan(d[i].entropy_draft));
    }
    free(d);
    char want[160];
    snprintf(want, sizeof want, "%zu drafted tokens had no finite draft probability", bad);
    EXPECT(strstr(err, want) != NULL);
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->nonfinite_q_drafts, nd);
        EXPECT_EQ_INT(s->all.drafts, nd); // in the metrics as they happened
        EXPECT(isnan(ds_summary_expected(&s->all)));
        snprintf(want, sizeof want, "%zu drafted tokens had no finite draft probability", nd);
        EXPECT(summary_says(s, want));
    }
    ds_summary_free(s);
    // The real draft: none, and nothing said.
    unlink(out);
    EXPECT_EQ_INT(run_cli(out, extra, err, sizeof err), 0);
    EXPECT(strstr(err, "no finite draft probability") == NULL);
    s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) EXPECT_EQ_INT(s->nonfinite_q_drafts, 0);
    ds_summary_free(s);
}

// A finished run of the three conversations at B = 1 written to path: the file's bytes.
static unsigned char *small_run(const char *path, size_t *n) {
    char err[4096];
    unlink(path);
    const char *extra[] = {"--batch-sizes", "1", "--max-new-tokens", "10", NULL};
    EXPECT_EQ_INT(run_cli(path, extra, err, sizeof err), 0);
    return ru_slurp(path, n);
}

// A --resume refused before it writes (here: files cut short) leaves the file byte for byte as
// it was; opening one to check it used to grow it to the end its superblock records.
static void test_refused_resume_keeps_file(void) {
    char err[4096];
    const char *out = DIR "/whole.h5", *cut = DIR "/cut.h5";
    size_t n = 0;
    unsigned char *whole = small_run(out, &n);
    EXPECT(whole && n > 65536);
    const struct {
        size_t len;
        const char *msg;
    } cases[] = {{4096, "cut.h5: cannot resume: truncated file: 4096 bytes of the "},
                 {30000, "cut.h5: cannot resume: truncated file: 30000 bytes of the "}};
    for (size_t i = 0; whole && i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(cut, "wb");
        EXPECT(f && fwrite(whole, 1, cases[i].len, f) == cases[i].len);
        if (f) fclose(f);
        const char *resume[] = {"--batch-sizes", "1", "--max-new-tokens", "10", "--resume", NULL};
        EXPECT_EQ_INT(run_cli(cut, resume, err, sizeof err), 1);
        EXPECT(strstr(err, cases[i].msg) != NULL);
        if (!strstr(err, cases[i].msg)) printf("  %s", err);
        expect_same_file(cut, whole, cases[i].len);
    }
    // Options that shape a request's records must match too (here the reply length and the
    // harmony reasoning effort); a refusal leaves the whole file as it was.
    // Another tokenizer file (here the same JSON with one more newline: a different file) was
    // accepted and tokenized the new requests' prompts differently.
    size_t tn = 0;
    unsigned char *tok = ru_slurp(RU_TOKENIZER, &tn);
    FILE *tf = tok ? fopen(DIR "/tok-copy.json", "wb") : NULL;
    EXPECT(tf && fwrite(tok, 1, tn, tf) == tn && fputc('\n', tf) == '\n');
    if (tf) fclose(tf);
    free(tok);
    const struct {
        const char *flag, *value, *msg;
    } shape[] = {
        {"--max-new-tokens", "5", "cannot resume: max_new_tokens differs (file 10, now 5)"},
        {"--reasoning-effort", "high", "reasoning_effort differs (file \"medium\""},
        {"--tokenizer", DIR "/tok-copy.json", "cannot resume: tokenizer_sha256 differs"},
        // The file has no --max-context; one given now changes where requests stop.
        {"--max-context", "230", "cannot resume: max_context_given differs (file 0, now 230)"},
        // Another reading of the draft's aux ids feeds it other target layers.
        {"--aux-convention", "boundary", "cannot resume: aux_boundaries differs"},
        // Padded verifies (the file has none).
        {"--pad-to-graph-sizes", "8,16", "cannot resume: pad_to_graph_sizes differs (file [], "
                                         "now [8,16])"},
    };
    for (size_t i = 0; whole && i < sizeof shape / sizeof shape[0]; i++) {
        const char *resume[] = {"--batch-sizes", "1",         "--max-new-tokens", "10",
                                "--resume",      shape[i].flag, shape[i].value,    NULL};
        EXPECT_EQ_INT(run_cli(out, resume, err, sizeof err), 1);
        if (!strstr(err, shape[i].msg)) DS_FAILF("%s: message lacks '%s': %s", shape[i].flag,
                                                 shape[i].msg, err);
        expect_same_file(out, whole, n);
    }
    free(whole);
}

// Malformed records (docs/datasets.md, "Bad input"): skipped and counted by default, with one
// line on stderr naming the first even under --quiet, and the summary counts only the good ones;
// --on-bad fail stops at the first before the run file exists; a file of nothing but bad records
// is an error that says why.
static void test_bad_records(void) {
    char err[4096];
    const char *mixed = DIR "/mixed.jsonl", *all_bad = DIR "/all-bad.jsonl";
    // Line 2: not JSON; line 4: a byte that is not UTF-8 (0xff) inside a string.
    const char text[] =
        "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"hello world\"}]}\n"
        "{\"id\": \"x\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}\n"
        "{\"id\": \"b\", \"conversations\": [{\"from\": \"human\", \"value\": \"world\"}]}\n"
        "{\"id\": \"y\", \"conversations\": [{\"from\": \"human\", \"value\": \"\xff\"}]}\n";
    EXPECT(ru_write(mixed, text));
    EXPECT(ru_write(all_bad, "{\"conversations\": [\n"));
    const char *out = DIR "/bad-records.h5";
    unlink(out);
    const char *extra[] = {"--max-new-tokens", "4", NULL};
    char *argv[64];
    int argc = build_argv(argv, out, extra);
    argv[8] = (char *)mixed;
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 0);
    EXPECT(strstr(err, "2 of the 4 records read were skipped (0 empty, 2 malformed)") != NULL);
    EXPECT(strstr(err, "line 2: record 1: invalid JSON") != NULL);
    EXPECT(strchr(err, '\n') == strrchr(err, '\n')); // one line
    // The run file keeps what stderr said (options_json.dataset), and summary prints it.
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->all.requests, 2);
        EXPECT(s->has_dataset);
        EXPECT_EQ_INT(s->dataset_records_read, 4);
        EXPECT_EQ_INT(s->dataset_skipped_empty, 0);
        EXPECT_EQ_INT(s->dataset_skipped_malformed, 2);
        EXPECT(strstr(s->dataset_first_skip, "line 2: record 1: invalid JSON") != NULL);
        // options_json.load: the CPU reference maps the target in place, every tensor of its one
        // file: the file's data section (its size less the 8-byte length and the header).
        EXPECT(s->has_load);
        EXPECT(!s->load_uploaded[0] && !s->load_uploaded[1]);
        EXPECT(s->load_seconds[0] >= 0 && s->load_seconds[1] >= 0);
        EXPECT(s->load_bytes[1] > 0);
        FILE *tf = fopen(RU_TARGET "/model.safetensors", "rb");
        uint8_t len8[8] = {0};
        EXPECT(tf && fread(len8, 1, 8, tf) == 8);
        if (tf) {
            uint64_t header = 0;
            for (int i = 7; i >= 0; i--) header = header << 8 | len8[i]; // little-endian
            fseek(tf, 0, SEEK_END);
            EXPECT_EQ_INT(s->load_bytes[0], (uint64_t)ftell(tf) - 8 - header);
            fclose(tf);
        }
        char *printed = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&printed, &len);
        EXPECT(mf && ds_summary_print_text(s, mf) == DS_OK);
        if (mf) fclose(mf);
        EXPECT(printed && strstr(printed, "  dataset: 2 of the 4 records read were skipped (0 "
                                          "empty, 2 malformed); the first: ") != NULL);
        free(printed);
    }
    ds_summary_free(s);
    unlink(out);
    const char *fail_extra[] = {"--on-bad", "fail", NULL};
    argc = build_argv(argv, out, fail_extra);
    argv[8] = (char *)mixed;
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    EXPECT(strstr(err, "mixed.jsonl: line 2: record 1: invalid JSON") != NULL);
    EXPECT(!exists(out));
    argc = build_argv(argv, out, NULL);
    argv[8] = (char *)all_bad;
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 1);
    EXPECT(strstr(err, "no usable conversation; 1 of the 1 records read was skipped") != NULL);
    EXPECT(!exists(out));
    const char *bad_flag[] = {"--on-bad", "repair", NULL};
    argc = build_argv(argv, out, bad_flag);
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 2);
    EXPECT(strstr(err, "--on-bad") != NULL);
    // A clean file says nothing about skips, on stderr or in the summary (the counts are 0).
    argc = build_argv(argv, out, extra);
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 0);
    EXPECT(strstr(err, "skipped") == NULL);
    EXPECT(strstr(err, "--max-context") == NULL);
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT(s->has_dataset);
        EXPECT_EQ_INT(s->dataset_records_read, 3);
        EXPECT_EQ_INT(s->dataset_skipped_empty + s->dataset_skipped_malformed, 0);
        EXPECT_EQ_STR(s->dataset_first_skip, "");
    }
    ds_summary_free(s);
    unlink(out);
    // A --max-context beyond the target's own limit is capped with one line, not silently.
    const char *big[] = {"--max-new-tokens", "4", "--max-context", "999999", NULL};
    argc = build_argv(argv, out, big);
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 0);
    EXPECT(strstr(err, "--max-context 999999 is beyond the target's") != NULL);
    EXPECT(strstr(err, "--num-conversations") == NULL);
    unlink(out);
    // More conversations asked for than the file holds: one line, then all of them.
    const char *many[] = {"--max-new-tokens", "4", "--num-conversations", "5", NULL};
    argc = build_argv(argv, out, many);
    argv[8] = (char *)mixed;
    EXPECT_EQ_INT(ru_capture(ds_cmd_run, argc, argv, err, sizeof err), 0);
    EXPECT(strstr(err, "--num-conversations 5, the file has 2 usable; replaying those") != NULL);
    unlink(out);
}

// --trace kernels without a GPU: one line saying tracing is off, then a plain run: no /kernels
// or /ranges rows, every steps row's phase times 0 (docs/tracing.md). --baseline runs on the CPU.
static void test_trace_on_cpu(void) {
    char err[4096];
    const char *out = DIR "/trace_cpu.h5";
    unlink(out);
    const char *extra[] = {"--max-new-tokens", "6", "--trace", "kernels", "--baseline", NULL};
    int rc = run_cli(out, extra, err, sizeof err);
    EXPECT_EQ_INT(rc, 0);
    if (rc) printf("  %s", err);
    EXPECT(strstr(err, "no GPU: tracing is off (--trace kernels") != NULL);
    size_t n = 99;
    void *k = ru_read_table(out, "kernels", sizeof(struct ds_rec_kernel), &n);
    EXPECT_EQ_INT(n, 0);
    free(k);
    n = 99;
    void *rg = ru_read_table(out, "ranges", sizeof(struct ds_rec_range), &n);
    EXPECT_EQ_INT(n, 0);
    free(rg);
    struct ds_rec_step *st = ru_read_table(out, "steps", sizeof *st, &n);
    EXPECT(st != NULL && n > 0);
    for (size_t i = 0; st && i < n; i++) {
        if (st[i].draft_ns || st[i].verify_ns || st[i].accept_ns || st[i].total_ns) {
            EXPECT(!"phase times must be 0 when not traced");
            break;
        }
    }
    free(st);
    const char *bad[] = {"--trace", "everything", NULL};
    EXPECT_EQ_INT(run_cli(out, bad, err, sizeof err), 2);
    EXPECT(strstr(err, "--trace wants off, phases or kernels") != NULL);
}

// argv for a synthetic run: --synthetic-weights SPEC (skipped when NULL), dataset, out, quiet,
// then `extra` (NULL-terminated).
static int synth_argv(char **argv, const char *spec, const char *out, const char *const *extra) {
    int n = 0;
    argv[n++] = "run";
    if (spec) {
        argv[n++] = "--synthetic-weights";
        argv[n++] = (char *)spec;
    }
    argv[n++] = "--dataset";
    argv[n++] = DATA;
    argv[n++] = "--out";
    argv[n++] = (char *)out;
    argv[n++] = "--quiet";
    for (; extra && *extra; extra++)
        argv[n++] = (char *)*extra;
    argv[n] = NULL;
    return n;
}

static int synth_cli(const char *spec, const char *out, const char *const *extra, char *err,
                     size_t cap) {
    char *argv[64];
    int argc = synth_argv(argv, spec, out, extra);
    return ru_capture(ds_cmd_run, argc, argv, err, cap);
}

static int one_line(const char *s) {
    const char *nl = strchr(s, '\n');
    return nl && nl == strrchr(s, '\n');
}

static void test_synthetic_flags(void) {
    const char *out = DIR "/synth-flags.h5";
    char err[4096];
    unlink(out);
    // Exclusive with --target and with --draft.
    const char *with_t[] = {"--target", RU_TARGET, "--tokenizer", RU_TOKENIZER, NULL};
    EXPECT_EQ_INT(synth_cli("20b", out, with_t, err, sizeof err), 2);
    EXPECT(strstr(err, "--synthetic-weights replaces --target and --draft") != NULL);
    const char *with_d[] = {"--draft", RU_DRAFT, "--tokenizer", RU_TOKENIZER, NULL};
    EXPECT_EQ_INT(synth_cli("20b", out, with_d, err, sizeof err), 2);
    EXPECT(strstr(err, "--synthetic-weights replaces --target and --draft") != NULL);
    // Neither models nor synthetic weights.
    const char *tok[] = {"--tokenizer", RU_TOKENIZER, NULL};
    EXPECT_EQ_INT(synth_cli(NULL, out, tok, err, sizeof err), 2);
    EXPECT(strstr(err, "--target DIR is required (or --synthetic-weights SPEC)") != NULL);
    // No checkpoint to take the tokenizer from.
    EXPECT_EQ_INT(synth_cli("120b", out, NULL, err, sizeof err), 2);
    EXPECT(strstr(err, "--synthetic-weights needs --tokenizer FILE") != NULL);
    // Bad specs: usage errors naming the problem. gpt-oss-120b has 36 layers (spec gpt-oss.md
    // §1); a 2-layer slice cannot feed three distinct aux states to the draft.
    struct {
        const char *spec, *needle;
    } bad[] = {
        {"", "empty argument"},
        {"70b", "70b is neither 20b, 120b nor an existing config.json or directory"},
        {"20b:x", "is neither 20b, 120b"},
        {"120b:0:40", "40 layers asked, the config has 36"},
        {"20b:0:0", "LAYERS must be"},
        {"20b:1:2", "at least 3"},
        {DIR "/no-such-config.json", "no-such-config.json is neither"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = synth_cli(bad[i].spec, out, tok, err, sizeof err);
        EXPECT_EQ_INT(rc, 2);
        if (!strstr(err, bad[i].needle))
            DS_FAILF("--synthetic-weights '%s': message lacks '%s': %s", bad[i].spec,
                     bad[i].needle, err);
    }
    // A config file that exists but is no config: an input error (exit 1), one line naming it.
    EXPECT(ru_write(DIR "/broken-config.json", "{\"hidden_size\": \n"));
    EXPECT_EQ_INT(synth_cli(DIR "/broken-config.json", out, tok, err, sizeof err), 1);
    EXPECT(strstr(err, "broken-config.json") != NULL);
    EXPECT(one_line(err));
    EXPECT(!exists(out));
}

// No GPU: one line saying the synthetic weights need it, exit 1, no file; --device cuda likewise.
static void test_synthetic_no_gpu(void) {
    if (ds_cuda_device_count() > 0) {
        printf("  a GPU is present: the no-GPU path is not reachable here (gpu_run_synthetic "
               "runs the synthetic models on it)\n");
        return;
    }
    const char *out = DIR "/synth-nogpu.h5";
    char err[4096];
    unlink(out);
    const char *tok[] = {"--tokenizer", RU_TOKENIZER, NULL};
    EXPECT_EQ_INT(synth_cli("20b", out, tok, err, sizeof err), 1);
    printf("  no GPU: %s", err);
    EXPECT(strstr(err, "--synthetic-weights 20b needs the cuda device") != NULL);
    EXPECT(strstr(err, "--device cpu") != NULL);
    EXPECT(one_line(err));
    EXPECT(!exists(out));
    const char *cuda[] = {"--tokenizer", RU_TOKENIZER, "--device", "cuda", NULL};
    EXPECT_EQ_INT(synth_cli("120b:0:4", out, cuda, err, sizeof err), 1);
    EXPECT(one_line(err));
    EXPECT(!exists(out));
}

// The golden target's config with synthetic weights, on the cpu: the file names the models by
// their synthetic identity (target_path, draft_path, the digests of docs/cli.md's recipe),
// options_json says synthetic, tracing falls back to off and the baseline runs; --resume with
// another seed is refused.
static void test_synthetic_cpu_run(void) {
    const char *out = DIR "/synth.h5";
    char err[4096], got[4096], want[4096];
    unlink(out);
    const char *extra[] = {"--tokenizer", RU_TOKENIZER, "--device", "cpu", "--batch-sizes", "1,2",
                           "--max-new-tokens", "6", "--trace", "phases", "--baseline", NULL};
    int rc = synth_cli(RU_TARGET ":7", out, extra, err, sizeof err);
    EXPECT_EQ_INT(rc, 0);
    if (rc) printf("  %s", err);
    EXPECT(strstr(err, "synthetic weights (" RU_TARGET ", seed 7, 4 layers): the draft does not "
                       "predict the target, so acceptance will be near zero") != NULL);
    EXPECT(strstr(err, "no GPU: tracing is off (--trace phases") != NULL);
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->all.requests, 6); // 3 conversations x 2 batch sizes
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_CLOSED);
        EXPECT(s->all.steps > 0);
    }
    ds_summary_free(s);
    // The identity: the golden config has 4 layers; the digests follow docs/cli.md: SHA-256 of
    // the identity text, then a newline and the config.json digest for a path source.
    ru_read_attr_str(out, "target_path", got, sizeof got);
    EXPECT_EQ_STR(got, "synthetic:" RU_TARGET ":7:4");
    ru_read_attr_str(out, "draft_path", got, sizeof got);
    EXPECT_EQ_STR(got, "synthetic-draft:" RU_TARGET ":7:4");
    char cfg_hex[DS_SHA256_HEX_BYTES], hex[DS_SHA256_HEX_BYTES];
    EXPECT_OK(ds_sha256_file(RU_TARGET "/config.json", cfg_hex));
    snprintf(want, sizeof want, "synthetic:%s:7:4\n%s", RU_TARGET, cfg_hex);
    ds_sha256_hex(want, strlen(want), hex);
    ru_read_attr_str(out, "target_config_sha256", got, sizeof got);
    EXPECT_EQ_STR(got, hex);
    snprintf(want, sizeof want, "synthetic-draft:%s:7:4\n%s", RU_TARGET, cfg_hex);
    ds_sha256_hex(want, strlen(want), hex);
    ru_read_attr_str(out, "draft_config_sha256", got, sizeof got);
    EXPECT_EQ_STR(got, hex);
    ru_read_attr_str(out, "options_json", got, sizeof got);
    if (!strstr(got, "\"synthetic_weights\":{\"layers\":4,\"seed\":7,\"source\":\"" RU_TARGET
                     "\"}"))
        DS_FAILF("options_json lacks the synthetic_weights object: %s", got);
    EXPECT(strstr(got, "\"baseline\":[") != NULL);
    // Another seed is another model: --resume refuses it and names the field.
    const char *rs[] = {"--tokenizer", RU_TOKENIZER, "--device", "cpu", "--batch-sizes", "1,2",
                        "--max-new-tokens", "6", "--resume", NULL};
    EXPECT_EQ_INT(synth_cli(RU_TARGET ":8", out, rs, err, sizeof err), 1);
    EXPECT(strstr(err, "cannot resume: target_config_sha256 differs") != NULL);
    // The same spec resumes: every (batch size, request) is already done.
    EXPECT_EQ_INT(synth_cli(RU_TARGET ":7", out, rs, err, sizeof err), 0);
}

// ---- child processes ----

static pid_t spawn(const char *self, const char *out, const char *const *extra, long fsize) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    char *argv[64];
    argv[0] = (char *)self;
    argv[1] = "--run";
    int n = build_argv(argv + 2, out, extra);
    argv[n + 2] = NULL;
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    if (fsize > 0) {
        struct rlimit rl = {(rlim_t)fsize, (rlim_t)fsize};
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(94);
    }
    execv("/proc/self/exe", argv);
    _exit(95);
}

static int wait_rc(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

// Exactly one /requests row per (batch size, dataset index, turn), n_want of them.
static void expect_complete(const char *path, size_t n_want) {
    size_t n = 0;
    struct ds_rec_request *rq = ru_read_table(path, "requests", sizeof *rq, &n);
    EXPECT(rq != NULL);
    EXPECT_EQ_INT(n, n_want);
    for (size_t i = 0; rq && i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (rq[i].batch_size == rq[j].batch_size &&
                rq[i].dataset_index == rq[j].dataset_index && rq[i].turn == rq[j].turn)
                DS_FAILF("request (B %u, index %u, turn %u) recorded twice", rq[i].batch_size,
                         rq[i].dataset_index, rq[i].turn);
    free(rq);
}

static const char *LONG_RUN[] = {"--batch-sizes", "1,2", "--max-new-tokens", "60", NULL};

static void test_sigint_resume(const char *self) {
    const char *out = DIR "/sigint.h5";
    unlink(out);
    pid_t pid = spawn(self, out, LONG_RUN, 0);
    for (int i = 0; i < 12000 && !exists(out); i++)
        sleep_ms(5);
    sleep_ms(300);
    kill(pid, SIGINT);
    int rc = wait_rc(pid);
    EXPECT_EQ_INT(rc, 130);
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_INTERRUPTED);
        printf("  interrupted with %llu of 6 requests recorded\n",
               (unsigned long long)s->all.requests);
        EXPECT(s->all.requests < 6);
    }
    ds_summary_free(s);
    char err[4096];
    const char *resume[] = {"--batch-sizes", "1,2", "--max-new-tokens", "60", "--resume", NULL};
    rc = run_cli(out, resume, err, sizeof err);
    EXPECT_EQ_INT(rc, 0);
    if (rc) printf("  %s", err);
    expect_complete(out, 6);
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->n_sessions, 2);
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_CLOSED);
    }
    ds_summary_free(s);
}

static void test_sigkill_resume(const char *self) {
    const char *out = DIR "/sigkill.h5";
    unlink(out);
    pid_t pid = spawn(self, out, LONG_RUN, 0);
    // Wait until at least one request is flushed (the writer flushes about once a second).
    uint64_t seen = 0;
    for (int i = 0; i < 600 && seen == 0; i++) {
        sleep_ms(50);
        struct ds_summary *s = NULL;
        if (exists(out) && ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s) == DS_OK)
            seen = s->rows_requests;
        ds_summary_free(s);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            pid = -1;
            break;
        }
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        EXPECT_EQ_INT(wait_rc(pid), 128 + SIGKILL);
    } else {
        DS_FAILF("the run ended before it could be killed");
    }
    // Readable as it is (SWMR), and by plain readers after recovery.
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_RUNNING);
        EXPECT(s->all.requests >= 1 && s->all.requests < 6);
    }
    ds_summary_free(s);
    // A resume refused for another seed leaves the dead writer's file as it found it (its write
    // flags, end of allocation and length), so the right command still recovers it below.
    char err[4096];
    size_t n0 = 0;
    unsigned char *before = ru_slurp(out, &n0);
    const char *other[] = {"--batch-sizes", "1,2", "--max-new-tokens", "60", "--resume", "--seed",
                           "5", NULL};
    EXPECT_EQ_INT(run_cli(out, other, err, sizeof err), 1);
    EXPECT(strstr(err, "cannot resume: seed differs") != NULL);
    expect_same_file(out, before, n0);
    free(before);
    EXPECT_OK(ds_recorder_recover(out));
    const char *resume[] = {"--batch-sizes", "1,2", "--max-new-tokens", "60", "--resume", NULL};
    int rc = run_cli(out, resume, err, sizeof err);
    EXPECT_EQ_INT(rc, 0);
    if (rc) printf("  %s", err);
    expect_complete(out, 6);
}

static void test_file_size_limit(const char *self) {
    const char *out = DIR "/fsize.h5";
    unlink(out);
    // 96 KiB: room for the created file, not for the first flushed chunks of the tables.
    pid_t pid = spawn(self, out, LONG_RUN, 96 * 1024);
    int rc = wait_rc(pid);
    EXPECT_EQ_INT(rc, 1);
    EXPECT(exists(out));
    if (exists(out)) { // whatever was flushed stays readable
        // The writer could not extend the file to the end its superblock records (the limit
        // forbids it): summary refused it as a "truncated file". It reads it as it is now,
        // a session that failed, and leaves it so.
        unsigned char sb[36] = {0};
        FILE *f = fopen(out, "rb");
        EXPECT(f && fread(sb, 1, sizeof sb, f) == sizeof sb);
        if (f) fclose(f);
        uint64_t recorded = 0;
        for (int i = 7; i >= 0; i--)
            recorded = recorded << 8 | sb[28 + i];
        struct stat before, after;
        EXPECT(stat(out, &before) == 0 && (uint64_t)before.st_size < recorded);
        struct ds_summary *s = NULL;
        EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
        if (s) EXPECT_EQ_INT(s->last_session_status, DS_REC_SESSION_FAILED);
        ds_summary_free(s);
        EXPECT(stat(out, &after) == 0 && after.st_size == before.st_size);
        EXPECT_OK(ds_recorder_recover(out));
        s = NULL;
        EXPECT_OK(ds_summary_compute(out, DS_SUMMARY_BY_BATCH, &s));
        ds_summary_free(s);
    }
}

// Sets the row count of a table of a closed run file (rows past the old count read as zeros);
// 0 when it cannot.
static int set_rows(const char *path, const char *table, hsize_t rows) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = f >= 0 ? H5Dopen2(f, table, H5P_DEFAULT) : H5I_INVALID_HID;
    int ok = d >= 0 && H5Dset_extent(d, &rows) >= 0;
    if (d >= 0) ok &= H5Dclose(d) >= 0;
    if (f >= 0) ok &= H5Fclose(f) >= 0;
    return ok;
}

// Writes the first n bytes of whole to path.
static void write_prefix(const char *path, const unsigned char *whole, size_t n) {
    FILE *f = fopen(path, "wb");
    EXPECT(f && fwrite(whole, 1, n, f) == n);
    if (f) fclose(f);
}

static const char *RESUME_1[] = {"--batch-sizes", "1", "--max-new-tokens", "10", "--resume", NULL};

// --resume of path is refused (exit 1) with a line holding resume_msg and leaves the file byte
// for byte as it was; the summary refuses it too, with a line holding summary_msg.
static void expect_refused(const char *path, const char *resume_msg, const char *summary_msg) {
    char err[4096];
    size_t n = 0;
    unsigned char *before = ru_slurp(path, &n);
    EXPECT_EQ_INT(run_cli(path, RESUME_1, err, sizeof err), 1);
    if (!strstr(err, resume_msg)) DS_FAILF("resume: message lacks '%s': %s", resume_msg, err);
    EXPECT(one_line(err));
    expect_same_file(path, before, n);
    free(before);
    struct ds_summary *s = NULL;
    EXPECT(ds_summary_compute(path, DS_SUMMARY_BY_BATCH, &s) != DS_OK);
    ds_summary_free(s);
    if (!strstr(ds_error_last(), summary_msg))
        DS_FAILF("summary: message lacks '%s': %s", summary_msg, ds_error_last());
}

// Cut copies of a finished run file (3 requests at B = 1). Cut short (a copy stopped early),
// its missing bytes were read as zeros: --resume said "/requests rows 0 and 1 have the same
// request id 0" of a cut inside /requests, and resumed a file cut in the unused end of its last
// chunk (it extended it), where the summary calls both truncated. Rows counted past the data
// (the tables' row counts raised, as a copy taken while the run wrote it can have them) were
// refused as duplicate ids, rows lost or a draft position out of range, or read by the summary
// as a finished request of batch size 0; /strings cut below the ids /requests names was resumed,
// new strings taking those ids. Each is refused now, by name, the file left as it was. /requests
// cut by a row is what a crash leaves: that request's rows are dropped and it is run again.
static void test_resume_cut_copies(void) {
    char err[4096];
    const char *out = DIR "/cutsrc.h5", *cut = DIR "/cutcopy.h5";
    size_t n = 0, nq = 0;
    unsigned char *whole = small_run(out, &n);
    struct ds_rec_request *rq = ru_read_table(out, "requests", sizeof *rq, &nq);
    EXPECT(whole && rq && nq == 3);
    if (!whole || !rq || nq != 3) {
        free(whole);
        free(rq);
        return;
    }
    // Cut short inside /requests (after its first row), and in the unused end of the file.
    long at = -1;
    for (size_t i = 0; at < 0 && i + sizeof *rq <= n; i++)
        if (!memcmp(whole + i, &rq[1], sizeof *rq)) at = (long)i;
    EXPECT(at > 0);
    const size_t cuts[] = {at > 0 ? (size_t)at : 4096, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_prefix(cut, whole, cuts[i]);
        char msg[128];
        snprintf(msg, sizeof msg, "cutcopy.h5: cannot resume: truncated file: %zu bytes of the %zu",
                 cuts[i], n);
        char sum_msg[160];
        snprintf(sum_msg, sizeof sum_msg,
                 "cutcopy.h5: truncated file: %zu bytes of the %zu its superblock records", cuts[i],
                 n);
        expect_refused(cut, msg, sum_msg);
    }
    // Row counts raised past the rows written.
    uint32_t max_string = 0;
    for (size_t i = 0; i < nq; i++)
        if (rq[i].conversation > max_string) max_string = rq[i].conversation;
    size_t ns = 0, nd = 0;
    free(ru_read_table(out, "steps", sizeof(struct ds_rec_step), &ns));
    free(ru_read_table(out, "drafts", sizeof(struct ds_rec_draft), &nd));
    const struct {
        const char *table;
        hsize_t rows;
        const char *msg;
    } grown[] = {
        {"requests", nq + 2, "/requests row 3 has batch size 0: a row never written"},
        {"steps", ns + 1, "/steps row %zu has batch size 0: a row never written"},
        {"drafts", nd + 1, "/drafts row %zu has batch size 0: a row never written"},
    };
    for (size_t i = 0; i < sizeof grown / sizeof grown[0]; i++) {
        char msg[160], rmsg[200];
        snprintf(msg, sizeof msg, grown[i].msg, i == 1 ? ns : nd);
        EXPECT(ru_copy(out, cut) && set_rows(cut, grown[i].table, grown[i].rows));
        snprintf(rmsg, sizeof rmsg, "cutcopy.h5: cannot resume: %s", msg);
        expect_refused(cut, rmsg, msg);
    }
    // /strings without the last string a /requests row names.
    EXPECT(ru_copy(out, cut) && set_rows(cut, "strings", max_string));
    char sizes[128];
    snprintf(sizes, sizeof sizes, "names string %u, beyond the %u rows of /strings", max_string,
             max_string);
    size_t n0 = 0;
    unsigned char *before = ru_slurp(cut, &n0);
    EXPECT_EQ_INT(run_cli(cut, RESUME_1, err, sizeof err), 1);
    if (!strstr(err, sizes)) DS_FAILF("message lacks '%s': %s", sizes, err);
    expect_same_file(cut, before, n0);
    free(before);
    // The last request's /requests row lost: its /steps and /drafts rows are dropped, and the
    // resume runs it again under a new id.
    EXPECT(ru_copy(out, cut) && set_rows(cut, "requests", nq - 1));
    EXPECT_EQ_INT(run_cli(cut, RESUME_1, err, sizeof err), 0);
    expect_complete(cut, 3);
    struct ds_summary *s = NULL;
    EXPECT_OK(ds_summary_compute(cut, DS_SUMMARY_BY_BATCH, &s));
    if (s) {
        EXPECT_EQ_INT(s->all.requests, 3);
        EXPECT_EQ_INT(s->n_sessions, 2);
        EXPECT(s->dropped_steps > 0);
    }
    ds_summary_free(s);
    free(whole);
    free(rq);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--run")) return ds_cmd_run(argc - 2, argv + 2);
    mkdir(DIR, 0755);
    if (!ru_write(DATA, CONVS)) {
        fprintf(stderr, "cannot write %s\n", DATA);
        return 1;
    }
    DS_RUN(test_bad_flags);
    DS_RUN(test_bad_inputs);
    DS_RUN(test_refused_checkpoints);
    DS_RUN(test_bad_output);
    DS_RUN(test_run_and_summary);
    DS_RUN(test_nan_target);
    DS_RUN(test_nan_draft);
    DS_RUN(test_refused_resume_keeps_file);
    DS_RUN(test_resume_cut_copies);
    DS_RUN(test_bad_records);
    DS_RUN(test_trace_on_cpu);
    DS_RUN(test_synthetic_flags);
    DS_RUN(test_synthetic_no_gpu);
    DS_RUN(test_synthetic_cpu_run);
#define RUN_SELF(fn)                                                                               \
    do {                                                                                           \
        ds_t_case_name = #fn;                                                                      \
        ds_t_case_failures = 0;                                                                    \
        fn(argv[0]);                                                                               \
        if (ds_t_case_failures) ds_t_cases_failed++, fprintf(stderr, "not ok %s\n", #fn);          \
        else ds_t_cases_passed++, printf("ok %s\n", #fn);                                          \
    } while (0)
    RUN_SELF(test_sigint_resume);
    RUN_SELF(test_sigkill_resume);
    RUN_SELF(test_file_size_limit);
    return ds_test_end();
}
