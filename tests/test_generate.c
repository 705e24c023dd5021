// draftscope generate on the tiny fixture target (CPU): greedy ids against the naive
// double-precision model, the --logits-out file against the naive logits, the --json report,
// sampling at T > 0 against the counter-based generator applied to the naive distribution, the
// context limit, and bad input.
#include <fcntl.h>
#include <hdf5.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ds/cli.h"
#include "ds/device.h"
#include "ds/rng.h"
#include "ds/safetensors.h"
#include "harness.h"
#include "model_naive.h"
#include "run_util.h"

#define TARGET DS_SOURCE_DIR "/tests/fixtures/ckpt/target"
#define NAN_SRC DS_SOURCE_DIR "/tests/fixtures/golden/tiny-gptoss-a" // one safetensors file
#define LOGIT_RTOL 1e-5 // see test_gptoss.c: fp32 intermediates against all-double

static char out_json[256], out_h5[256];

// Runs the command with stdout captured into out_json; returns its exit code.
static int gen(int argc, const char **argv) {
    fflush(stdout);
    int saved = dup(1), fd = open(out_json, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    close(fd);
    int rc = ds_cmd_generate(argc, (char **)argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rc;
}

static json_t *report(void) {
    json_error_t err;
    json_t *r = json_load_file(out_json, 0, &err);
    if (!r) DS_FAILF("report is not JSON: %s", err.text);
    return r;
}

static int read_h5(const char *name, int rank, void *buf, hid_t type, hsize_t *dims) {
    hid_t f = H5Fopen(out_h5, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return -1;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), sp = H5Dget_space(d);
    int ok = H5Sget_simple_extent_ndims(sp) == rank;
    H5Sget_simple_extent_dims(sp, dims, NULL);
    if (ok && buf) ok = H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
    H5Sclose(sp), H5Dclose(d), H5Fclose(f);
    return ok ? 0 : -1;
}

// A scalar attribute of out_h5: a string (type H5T_C_S1) into buf of cap bytes, or a number.
static int read_h5_attr(const char *name, hid_t type, void *buf, size_t cap) {
    hid_t f = H5Fopen(out_h5, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return -1;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    int ok = a >= 0;
    if (ok && type == H5T_C_S1) {
        hid_t ft = H5Aget_type(a), mt = H5Tcopy(H5T_C_S1);
        const size_t n = H5Tget_size(ft);
        ok = H5Tget_class(ft) == H5T_STRING && n <= cap && H5Tset_size(mt, n) >= 0 &&
             H5Aread(a, mt, buf) >= 0;
        H5Tclose(mt), H5Tclose(ft);
    } else if (ok) {
        ok = H5Aread(a, type, buf) >= 0;
    }
    if (a >= 0) H5Aclose(a);
    H5Fclose(f);
    return ok ? 0 : -1;
}

static const char *const PROMPT = "5,17,300,42,7,99,256,3";

// Greedy: 6 tokens, each the naive argmax given everything before it; logits rows match.
static void greedy_matches_naive(void) {
    const char *argv[] = {"generate",         "--target", TARGET,     "--prompt-ids", PROMPT,
                          "--max-new-tokens", "6",        "--device", "cpu",          "--json",
                          "--logits-out",     out_h5};
    EXPECT_EQ_INT(gen(12, argv), 0);
    json_t *r = report();
    if (!r) return;
    json_t *ids = json_object_get(r, "ids");
    EXPECT_EQ_INT(json_array_size(ids), 6);
    EXPECT_EQ_STR(json_string_value(json_object_get(r, "stop")), "max_new_tokens");
    EXPECT(json_is_null(json_object_get(r, "text"))); // the fixture has no tokenizer

    int32_t seq[14] = {5, 17, 300, 42, 7, 99, 256, 3};
    for (int i = 0; i < 6; i++)
        seq[8 + i] = (int32_t)json_integer_value(json_array_get(ids, i));
    struct ds_target_config cfg;
    EXPECT_OK(ds_target_config_load(TARGET, &cfg));
    ds_safetensors_t *st = NULL;
    EXPECT_OK(ds_safetensors_open_dir(TARGET, &st));
    double *ref = malloc(sizeof(double) * 14 * 512);
    nv_target_run(st, &cfg, 14, seq, ref, NULL, NULL);
    for (int i = 0; i < 6; i++) {
        const double *row = ref + (size_t)(7 + i) * 512;
        int best = 0;
        for (int v = 1; v < 512; v++)
            if (row[v] > row[best]) best = v;
        EXPECT_EQ_INT(seq[8 + i], best);
    }
    float *logits = malloc(sizeof(float) * 6 * 512);
    int32_t h5ids[6], prompt[8];
    hsize_t dims[2];
    EXPECT(read_h5("logits", 2, logits, H5T_NATIVE_FLOAT, dims) == 0);
    EXPECT(dims[0] == 6 && dims[1] == 512);
    EXPECT(read_h5("ids", 1, h5ids, H5T_NATIVE_INT32, dims) == 0);
    EXPECT(read_h5("prompt_ids", 1, prompt, H5T_NATIVE_INT32, dims) == 0);
    EXPECT(!memcmp(h5ids, seq + 8, sizeof h5ids));
    EXPECT(!memcmp(prompt, seq, sizeof prompt));
    char stop[32] = "";
    EXPECT(read_h5_attr("stop", H5T_C_S1, stop, sizeof stop) == 0);
    EXPECT_EQ_STR(stop, "max_new_tokens");
    int64_t at = 0;
    EXPECT(read_h5_attr("nonfinite_position", H5T_NATIVE_INT64, &at, sizeof at) != 0); // none
    double scale, err = nv_max_err(logits, ref + 7 * 512, 6 * 512, &scale);
    EXPECT(err <= LOGIT_RTOL * scale);
    free(ref), free(logits);
    ds_safetensors_close(st);
    json_decref(r);
}

// T = 0.8: the token at position p is the inverse CDF of softmax(naive logits / T) at
// u = ds_rng_uniform(seed, 0, p, SAMPLE); a second run gives the same ids.
static void sampling_is_counter_based(void) {
    const char *argv[] = {
        "generate", "--target",      TARGET, "--prompt-ids", PROMPT, "--max-new-tokens",
        "5",        "--temperature", "0.8",  "--seed",       "1234", "--device",
        "cpu",      "--json"};
    EXPECT_EQ_INT(gen(14, argv), 0);
    json_t *r = report();
    if (!r) return;
    json_t *ids = json_object_get(r, "ids");
    int32_t seq[13] = {5, 17, 300, 42, 7, 99, 256, 3};
    for (int i = 0; i < 5; i++)
        seq[8 + i] = (int32_t)json_integer_value(json_array_get(ids, i));
    EXPECT_EQ_INT(gen(14, argv), 0);
    json_t *r2 = report();
    EXPECT(r2 && json_equal(json_object_get(r2, "ids"), ids));

    struct ds_target_config cfg;
    EXPECT_OK(ds_target_config_load(TARGET, &cfg));
    ds_safetensors_t *st = NULL;
    EXPECT_OK(ds_safetensors_open_dir(TARGET, &st));
    double *ref = malloc(sizeof(double) * 13 * 512);
    nv_target_run(st, &cfg, 13, seq, ref, NULL, NULL);
    for (int i = 0; i < 5; i++) {
        const double *row = ref + (size_t)(7 + i) * 512;
        double mx = row[0], z = 0, acc = 0, u = ds_rng_uniform(1234, 0, (uint64_t)(8 + i), 0);
        for (int v = 1; v < 512; v++)
            mx = fmax(mx, row[v]);
        for (int v = 0; v < 512; v++)
            z += exp((row[v] - mx) / 0.8);
        int want = 511;
        double gap = 1;
        for (int v = 0; v < 512; v++) {
            acc += exp((row[v] - mx) / 0.8) / z;
            if (u < acc) {
                want = v;
                gap = fmin(acc - u, u - (acc - exp((row[v] - mx) / 0.8) / z));
                break;
            }
        }
        // u within 1e-5 of a CDF step could flip with fp32 probabilities: say so, don't fail.
        if (gap < 1e-5)
            printf("  sample %d: u within %.2g of a CDF step\n", i, gap);
        else
            EXPECT_EQ_INT(seq[8 + i], want);
    }
    free(ref);
    ds_safetensors_close(st);
    json_decref(r);
    json_decref(r2);
}

// The splitmix64 reference outputs: first output from state 0 and from state 1234567.
static void rng_reference_values(void) {
    EXPECT(ds_rng_mix(0) == 0xe220a8397b1dcdafull);
    EXPECT(ds_rng_mix(1234567) == 6457827717110365317ull);
    double u = ds_rng_uniform(1, 2, 3, 4);
    EXPECT(u >= 0 && u < 1);
    EXPECT(ds_rng_u64(1, 2, 3, 4) != ds_rng_u64(1, 2, 3, 5));
    EXPECT(ds_rng_u64(1, 2, 3, 4) != ds_rng_u64(1, 3, 2, 4));
}

// With a tokenizer: --raw text is plain BPE ("hello world" is the merged tokens 260 and 265 of
// the tiny tokenizer, tests/data/README.md), --prompt is a harmony prompt that starts with
// <|start|> (300) and ends with <|start|>assistant, and the report carries the decoded text.
static void tokenizer_prompts(void) {
    const char *argv[] = {"generate",
                          "--target",
                          TARGET,
                          "--prompt",
                          "hello world",
                          "--raw",
                          "--tokenizer",
                          DS_SOURCE_DIR "/tests/data/tiny_tokenizer.json",
                          "--max-new-tokens",
                          "3",
                          "--device",
                          "cpu",
                          "--json"};
    EXPECT_EQ_INT(gen(13, argv), 0);
    json_t *r = report();
    if (!r) return;
    json_t *p = json_object_get(r, "prompt_ids");
    EXPECT_EQ_INT(json_array_size(p), 2);
    EXPECT_EQ_INT(json_integer_value(json_array_get(p, 0)), 260);
    EXPECT_EQ_INT(json_integer_value(json_array_get(p, 1)), 265);
    EXPECT(json_is_string(json_object_get(r, "text")));
    json_decref(r);
    // An empty --raw prompt has no last token to continue from: it ran at position -1 and
    // crashed (SIGSEGV), now it is refused.
    argv[4] = "";
    EXPECT_EQ_INT(gen(13, argv), 1);
    EXPECT_ERROR_HAS("--prompt encodes to 0 tokens");
    argv[4] = "hello world";
    argv[5] = "--json"; // drop --raw (the last --json repeats harmlessly)
    EXPECT_EQ_INT(gen(13, argv), 0);
    r = report();
    if (!r) return;
    p = json_object_get(r, "prompt_ids");
    size_t n = json_array_size(p);
    EXPECT(n > 10);
    EXPECT_EQ_INT(json_integer_value(json_array_get(p, 0)), 300);
    // "assistant" in the tiny tokenizer: bytes a s s i s t a n t (no merges apply).
    EXPECT_EQ_INT(json_integer_value(json_array_get(p, n - 10)), 300);
    EXPECT_EQ_INT(json_integer_value(json_array_get(p, n - 1)), 't');
    json_decref(r);
}

// A target path that is not UTF-8 is reported with U+FFFD for the bad byte; the key was missing
// from the --json report (json_string refuses invalid UTF-8).
static void json_target_not_utf8(void) {
    char link[512];
    snprintf(link, sizeof link, "%s/ds_gen_\xff_%d", DS_BINARY_DIR, (int)getpid());
    unlink(link);
    EXPECT(symlink(TARGET, link) == 0);
    const char *argv[] = {"generate", "--target", link,    "--prompt-ids", PROMPT,
                          "--max-new-tokens", "1", "--device", "cpu", "--json"};
    EXPECT_EQ_INT(gen(10, argv), 0);
    json_t *r = report();
    const char *t = r ? json_string_value(json_object_get(r, "target")) : NULL;
    EXPECT(t && strstr(t, "ds_gen_\xEF\xBF\xBD_"));
    json_decref(r);
    unlink(link);
}

// A --logits-out file that cannot be written whole (here a 4 KB file-size limit: 6 rows of 512
// floats need 12 KB) ends the command with exit 1 and is removed; it was left behind, cut short,
// and a failed close went unnoticed.
static void logits_out_cut_short_is_removed(void) {
    unlink(out_h5);
    // The binary in a fresh process: a forked copy of this one would inherit OpenMP's state
    // from the earlier cases and hang in its first parallel region.
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN); // the write fails with EFBIG instead (kept across exec)
        struct rlimit lim = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &lim);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 1);
        execl(DS_BINARY_DIR "/profiler/draftscope", "draftscope", "generate", "--target", TARGET,
              "--prompt-ids", PROMPT, "--max-new-tokens", "6", "--device", "cpu", "--logits-out",
              out_h5, (char *)NULL);
        _exit(127);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status));
    EXPECT_EQ_INT(WEXITSTATUS(status), 1);
    struct stat sb;
    EXPECT(stat(out_h5, &sb) != 0); // removed
}

// --batch 5: the copies' prompts (7 rows each before the batched last token) go through packed
// prefill forwards of at most 8 rows (the plan: the 8-token prompt), so copies are cut across
// forwards; every copy still chooses the tokens a single copy chooses.
static void batch_copies_agree(void) {
    const char *argv[] = {"generate", "--target", TARGET, "--prompt-ids", PROMPT,
                          "--max-new-tokens", "6", "--device", "cpu", "--json", "--batch", "5"};
    EXPECT_EQ_INT(gen(10, argv), 0);
    json_t *one = report();
    EXPECT_EQ_INT(gen(12, argv), 0);
    json_t *five = report();
    if (one && five) {
        EXPECT_EQ_INT(json_integer_value(json_object_get(five, "batch")), 5);
        EXPECT(json_is_true(json_object_get(five, "batch_rows_agree")));
        EXPECT(json_equal(json_object_get(one, "ids"), json_object_get(five, "ids")));
        EXPECT_EQ_INT(json_array_size(json_object_get(five, "ids")), 6);
    }
    json_decref(one);
    json_decref(five);
}

static void context_limit(void) {
    // 8 prompt tokens, limit 11: tokens at positions 8, 9, 10, then the limit.
    const char *argv[] = {"generate", "--target",         TARGET, "--prompt-ids",
                          PROMPT,     "--max-new-tokens", "20",   "--max-context",
                          "11",       "--device",         "cpu",  "--json"};
    EXPECT_EQ_INT(gen(12, argv), 0);
    json_t *r = report();
    if (!r) return;
    EXPECT_EQ_INT(json_array_size(json_object_get(r, "ids")), 3);
    EXPECT_EQ_STR(json_string_value(json_object_get(r, "stop")), "context_limit");
    json_decref(r);
    argv[8] = "8"; // the prompt itself does not fit
    EXPECT_EQ_INT(gen(12, argv), 1);
    EXPECT_ERROR_HAS("prompt of 8 tokens does not fit the context limit of 8");
}

// A target whose lm_head row 7 is NaN: every logit row holds one NaN, so p is NaN everywhere
// while the argmax (which skips NaN) is a number and the sampler found no mass (it took id 0).
// Greedy and sampled generation both stop at the first position with "error" and exit 1, the
// token unused; the same pair's real target generates on.
static void nonfinite_logits_stop(void) {
    char dir[300], cfg[400], st_path[400];
    snprintf(dir, sizeof dir, "%s/test_generate.%d.nan", DS_BINARY_DIR, (int)getpid());
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    mkdir(dir, 0755);
    ds_safetensors_t *st = NULL;
    EXPECT_OK(ds_safetensors_open_file(NAN_SRC "/model.safetensors", &st));
    const struct ds_tensor_info *lm = st ? ds_safetensors_find(st, "lm_head.weight") : NULL;
    int ok = lm && lm->dtype == DS_DTYPE_BF16 && lm->ndim == 2;
    EXPECT(ok);
    if (ok) {
        const uint64_t row = (uint64_t)lm->shape[1] * 2;
        ok = ds_t_copy_with_nan(NAN_SRC "/config.json", cfg, 0, 0) &&
             ds_t_copy_with_nan(NAN_SRC "/model.safetensors", st_path,
                                lm->file_offset + 7 * row, row);
        EXPECT(ok);
    }
    ds_safetensors_close(st);
    const char *argv[] = {"generate", "--target",         dir,   "--prompt-ids",
                          PROMPT,     "--max-new-tokens", "4",   "--device",
                          "cpu",      "--json",           "--temperature", "0.8",
                          "--logits-out", out_h5, "--overwrite"};
    for (int sampled = 0; ok && sampled < 2; sampled++) {
        // Greedy with --logits-out (argv up to --json, then the last three), sampled without.
        const char *a[16];
        int n = 0;
        for (int i = 0; i < (sampled ? 12 : 10); i++)
            a[n++] = argv[i];
        for (int i = 12; !sampled && i < 15; i++)
            a[n++] = argv[i];
        unlink(out_h5);
        // stderr's last line (the stdout report goes to the same place here: not read)
        char err[2048];
        EXPECT_EQ_INT(ru_capture(ds_cmd_generate, n, (char **)a, err, sizeof err), 1);
        EXPECT(strstr(err, sampled ? "generation stopped there\n"
                                   : "generation stopped there (") != NULL);
        if (!sampled)
            EXPECT(strstr(err, "keeps the rows up to it, its own last, id -1)\n") != NULL);
        unlink(out_h5);
        EXPECT_EQ_INT(gen(n, a), 1);
        json_t *r = report();
        if (!r) continue;
        EXPECT_EQ_STR(json_string_value(json_object_get(r, "stop")), "error");
        EXPECT_EQ_INT(json_integer_value(json_object_get(r, "nonfinite_position")), 8);
        EXPECT_EQ_INT(json_array_size(json_object_get(r, "ids")), 0);
        json_decref(r);
        if (sampled) continue;
        // The logits file is kept: the non-finite row (position 8) with id -1, NaN at id 7
        // (the NaN lm_head row) and finite elsewhere, and the stop attributes.
        float row[512];
        int32_t id = 0;
        hsize_t dims[2] = {0, 0};
        EXPECT(read_h5("logits", 2, row, H5T_NATIVE_FLOAT, dims) == 0);
        EXPECT(dims[0] == 1 && dims[1] == 512);
        EXPECT(read_h5("ids", 1, &id, H5T_NATIVE_INT32, dims) == 0);
        EXPECT_EQ_INT(id, -1);
        EXPECT(isnan(row[7]) && isfinite(row[6]) && isfinite(row[8]));
        char stop[16] = "";
        int64_t at = -1;
        EXPECT(read_h5_attr("stop", H5T_C_S1, stop, sizeof stop) == 0);
        EXPECT_EQ_STR(stop, "error");
        EXPECT(read_h5_attr("nonfinite_position", H5T_NATIVE_INT64, &at, sizeof at) == 0);
        EXPECT_EQ_INT(at, 8);
    }
    argv[2] = NAN_SRC;
    EXPECT_EQ_INT(gen(10, argv), 0);
    json_t *r = report();
    if (r) {
        EXPECT_EQ_STR(json_string_value(json_object_get(r, "stop")), "max_new_tokens");
        EXPECT(json_object_get(r, "nonfinite_position") == NULL);
        EXPECT_EQ_INT(json_array_size(json_object_get(r, "ids")), 4);
    }
    json_decref(r);
    unlink(cfg);
    unlink(st_path);
    rmdir(dir);
}

static void bad_input(void) {
    const char *a1[] = {"generate", "--target", TARGET, "--prompt", "hello", "--device", "cpu"};
    EXPECT_EQ_INT(gen(7, a1), 1);
    EXPECT_ERROR_HAS("--tokenizer");
    const char *a2[] = {"generate", "--target", TARGET, "--prompt-ids", "1,512", "--device", "cpu"};
    EXPECT_EQ_INT(gen(7, a2), 1);
    EXPECT_ERROR_HAS("id 512");
    const char *a3[] = {"generate", "--target", TARGET, "--prompt-ids", "1,x"};
    EXPECT_EQ_INT(gen(5, a3), 1);
    EXPECT_ERROR_HAS("--prompt-ids");
    // An empty entry was accepted ("1,,2" ran as 1,2; "1," as 1): the list parser is tokenize's.
    const char *a3e[] = {"generate", "--target", TARGET, "--prompt-ids", "1,,2"};
    EXPECT_EQ_INT(gen(5, a3e), 1);
    EXPECT_ERROR_HAS("--prompt-ids: \"1,,2\" is not a list of ids (an empty entry at offset 2)");
    const char *a3t[] = {"generate", "--target", TARGET, "--prompt-ids", "1,"};
    EXPECT_EQ_INT(gen(5, a3t), 1);
    EXPECT_ERROR_HAS("an empty entry");
    const char *a4[] = {"generate", "--target", TARGET};
    EXPECT_EQ_INT(gen(3, a4), 2);
    const char *a5[] = {"generate", "--target", TARGET, "--prompt-ids", "1", "--temperature", "-1"};
    EXPECT_EQ_INT(gen(7, a5), 2);
    // A temperature whose float is subnormal made every probability NaN (and sampling then
    // took the last id); too large ones were inf as floats.
    const char *temps[] = {"1e-40", "1e-7", "1e300"};
    for (int i = 0; i < 3; i++) {
        a5[6] = temps[i];
        EXPECT_EQ_INT(gen(7, a5), 2);
    }
    // A bad --synthetic-weights spec is a usage error, as in run (it was exit 1 here).
    const char *bad_specs[] = {"", "120b:abc", "20b:-1", "20b:1:99999", DS_BINARY_DIR "/none"};
    for (int i = 0; i < 5; i++) {
        const char *as[] = {"generate", "--synthetic-weights", bad_specs[i], "--device", "cpu"};
        EXPECT_EQ_INT(gen(5, as), 2);
    }
    const char *a6[] = {"generate", "--target", DS_SOURCE_DIR "/tests/fixtures/none",
                        "--prompt-ids", "1"};
    EXPECT_EQ_INT(gen(5, a6), 1);
    EXPECT_ERROR_HAS("none");
    // --index counts usable conversations: the error says what the file's bad records were.
    char data[256];
    snprintf(data, sizeof data, "%s/test_generate.%d.jsonl", DS_BINARY_DIR, (int)getpid());
    FILE *f = fopen(data, "w");
    EXPECT(f != NULL);
    if (!f) return;
    fputs("{\"conversations\": [{\"from\": \"human\", \"value\": \"hello\"}]}\n"
          "{\"conversations\": 7}\n",
          f);
    fclose(f);
    const char *a7[] = {"generate", "--target", TARGET, "--dataset", data, "--index", "1",
                        "--tokenizer", DS_SOURCE_DIR "/tests/data/tiny_tokenizer.json",
                        "--device", "cpu"};
    EXPECT_EQ_INT(gen(11, a7), 1);
    EXPECT_ERROR_HAS("--index 1, the file has 1 usable conversations; 1 of the 2 records read "
                     "was skipped (0 empty, 1 malformed); the first: ");
    EXPECT_ERROR_HAS("line 2: record 1:");
    // --logits-out: an existing file only with --overwrite, and never an input (here the
    // dataset, and a file of a scratch copy of the target, so that a failure cannot harm the
    // fixture); the inputs keep their bytes.
    size_t n0 = 0;
    unsigned char *before = ru_slurp(data, &n0);
    const char *a8[] = {"generate", "--target", TARGET, "--dataset", data, "--index", "0",
                        "--tokenizer", DS_SOURCE_DIR "/tests/data/tiny_tokenizer.json",
                        "--device", "cpu", "--logits-out", data, "--overwrite"};
    EXPECT_EQ_INT(gen(14, a8), 1);
    EXPECT_ERROR_HAS("is the dataset; --logits-out must name another file");
    size_t n1 = 0;
    unsigned char *after = ru_slurp(data, &n1);
    EXPECT(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before), free(after);
    char tgt[300], cfg[340];
    snprintf(tgt, sizeof tgt, "%s/test_generate.%d.ckpt", DS_BINARY_DIR, (int)getpid());
    snprintf(cfg, sizeof cfg, "%s/config.json", tgt);
    mkdir(tgt, 0755);
    EXPECT(ru_copy(TARGET "/config.json", cfg));
    const char *a9[] = {"generate", "--target", tgt, "--prompt-ids", "1", "--device", "cpu",
                        "--logits-out", cfg, "--overwrite"};
    EXPECT_EQ_INT(gen(10, a9), 1);
    EXPECT_ERROR_HAS("config.json: is a file of the target");
    before = ru_slurp(TARGET "/config.json", &n0), after = ru_slurp(cfg, &n1);
    EXPECT(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(after);
    // The config of --synthetic-weights is an input too, given as the file or its directory
    // (with --overwrite it was replaced by the logits file).
    char spec_dir[360];
    snprintf(spec_dir, sizeof spec_dir, "%s:0:2", tgt);
    const char *specs[] = {cfg, spec_dir};
    for (int i = 0; i < 2; i++) {
        const char *a9s[] = {"generate", "--synthetic-weights", specs[i], "--device", "cpu",
                             "--max-new-tokens", "1", "--logits-out", cfg, "--overwrite"};
        EXPECT_EQ_INT(gen(10, a9s), 1);
        EXPECT_ERROR_HAS("config.json: is a file of the target");
        after = ru_slurp(cfg, &n1);
        EXPECT(after && n0 == n1 && memcmp(before, after, n0) == 0);
        free(after);
    }
    free(before);
    remove(cfg), rmdir(tgt);
    // An earlier logits file: refused without --overwrite (kept), replaced with it.
    EXPECT(ru_write(out_h5, "an earlier file\n"));
    const char *a10[] = {"generate", "--target", TARGET, "--prompt-ids", "1", "--device", "cpu",
                         "--max-new-tokens", "1", "--logits-out", out_h5, "--overwrite"};
    EXPECT_EQ_INT(gen(11, a10), 1);
    EXPECT_ERROR_HAS("file exists; use --overwrite to replace it");
    after = ru_slurp(out_h5, &n1);
    EXPECT(after && n1 == 16 && !memcmp(after, "an earlier file\n", 16));
    free(after);
    EXPECT_EQ_INT(gen(12, a10), 0);
    EXPECT(read_h5("ids", 1, NULL, H5T_NATIVE_INT32, NULL) == 0);
    const char *a11[] = {"generate", "--target", TARGET, "--prompt-ids", "1", "--overwrite"};
    EXPECT_EQ_INT(gen(6, a11), 2);
    // A logits file in a directory that does not exist: said at once, by name.
    const char *a12[] = {"generate", "--target", TARGET, "--prompt-ids", "1", "--device", "cpu",
                         "--logits-out", DS_BINARY_DIR "/no-such-dir/l.h5"};
    EXPECT_EQ_INT(gen(9, a12), 1);
    EXPECT_ERROR_HAS("l.h5: directory " DS_BINARY_DIR "/no-such-dir does not exist");
    remove(data);
}

// A config.json whose vocab_size the embedding and lm_head disagree with is refused before the
// tokenizer is read or the backend opened (here the tokenizer does not exist, and that was the
// error): one line naming config.json, the tensor's file and both numbers, exit 1, and no
// --logits-out file, an earlier one kept byte for byte even with --overwrite.
static void vocab_disagrees_with_tensors(void) {
    static const char *const files[] = {"model.safetensors.index.json",
                                        "model-00000-of-00002.safetensors",
                                        "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "config.json"};
    char dir[300], path[400], from[400];
    snprintf(dir, sizeof dir, "%s/test_generate.%d.vocab", DS_BINARY_DIR, (int)getpid());
    mkdir(dir, 0755);
    for (int i = 0; i < 4; i++) { // the tensors are the fixture's
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        snprintf(from, sizeof from, "%s/%s", TARGET, files[i]);
        unlink(path);
        EXPECT(symlink(from, path) == 0);
    }
    json_t *cfg = json_load_file(TARGET "/config.json", 0, NULL);
    EXPECT(cfg != NULL);
    if (!cfg) return;
    json_object_set_new(cfg, "vocab_size", json_integer(600));
    snprintf(path, sizeof path, "%s/config.json", dir);
    EXPECT(json_dump_file(cfg, path, JSON_INDENT(2)) == 0);
    json_decref(cfg);

    unlink(out_h5);
    const char *argv[] = {"generate",     "--target",    dir,
                          "--prompt-ids", "1,2",         "--tokenizer",
                          DS_BINARY_DIR "/no-such-tokenizer.json",
                          "--device",     "cpu",         "--logits-out",
                          out_h5,         "--overwrite"};
    char want[1024];
    snprintf(want, sizeof want,
             "%s/config.json: vocab_size is 600, but tensor model.embed_tokens.weight in "
             "%s/model-00002-of-00002.safetensors has 512 rows (and 1 more problems)",
             dir, dir);
    EXPECT_EQ_INT(gen(11, argv), 1);
    EXPECT_EQ_STR(ds_error_last(), want);
    struct stat sb;
    EXPECT(stat(out_h5, &sb) != 0);
    EXPECT(ru_write(out_h5, "an earlier file\n"));
    EXPECT_EQ_INT(gen(12, argv), 1);
    EXPECT_EQ_STR(ds_error_last(), want);
    size_t n = 0;
    unsigned char *after = ru_slurp(out_h5, &n);
    EXPECT(after && n == 16 && !memcmp(after, "an earlier file\n", 16));
    free(after);
    unlink(out_h5);
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

// --synthetic-weights as in run: text prompts need --tokenizer (a usage error; it was exit 1
// with a message naming "(null)"), and the weights want the GPU: auto falling back to the cpu is
// refused (it filled the model on the host), --device cpu asks for the reference backend.
static void synthetic_tokenizer_and_device(void) {
    const char *spec = TARGET ":0:3";
    const char *a1[] = {"generate", "--synthetic-weights", spec, "--prompt", "hi",
                        "--device", "cpu", "--max-new-tokens", "1"};
    EXPECT_EQ_INT(gen(9, a1), 2);
    const char *a2[] = {"generate",          "--synthetic-weights", spec,
                        "--dataset",         TARGET "/config.json", "--index",
                        "0",                 "--device",            "cpu"};
    EXPECT_EQ_INT(gen(9, a2), 2);
    const char *a3[] = {"generate", "--synthetic-weights", spec, "--max-new-tokens", "1",
                        "--device", "cpu"};
    EXPECT_EQ_INT(gen(7, a3), 0);
    if (ds_cuda_device_count() > 0) return; // auto is the GPU there
    EXPECT_EQ_INT(gen(5, a3), 1);
    EXPECT_ERROR_HAS("needs the cuda device");
    EXPECT_ERROR_HAS("--device cpu forces the reference backend");
}

int main(void) {
    snprintf(out_json, sizeof out_json, "%s/test_generate.%d.json", DS_BINARY_DIR, (int)getpid());
    snprintf(out_h5, sizeof out_h5, "%s/test_generate.%d.h5", DS_BINARY_DIR, (int)getpid());
    DS_RUN(rng_reference_values);
    DS_RUN(greedy_matches_naive);
    DS_RUN(sampling_is_counter_based);
    DS_RUN(tokenizer_prompts);
    DS_RUN(context_limit);
    DS_RUN(batch_copies_agree);
    DS_RUN(nonfinite_logits_stop);
    DS_RUN(logits_out_cut_short_is_removed);
    DS_RUN(json_target_not_utf8);
    DS_RUN(bad_input);
    DS_RUN(vocab_disagrees_with_tensors);
    DS_RUN(synthetic_tokenizer_and_device);
    remove(out_json);
    remove(out_h5);
    return ds_test_end();
}
