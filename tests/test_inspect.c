// Tensor-table checks, the draft-target pair check and `draftscope inspect`, on the committed
// fixture checkpoints and on broken copies of them written by this test.
//
// Every broken checkpoint starts from a fixture: its tensors are copied (names, shapes, dtypes,
// bytes) into one model.safetensors in a scratch directory with one edit, and its config.json
// with one edit. Expected figures are worked by hand from the fixture dims (hidden 64,
// intermediate 64, 4 heads x 32, 2 KV heads, 4 layers, 8 experts top-4, vocab 512, draft vocab
// 128) and the fixture design (docs/checkpoints.md), never read back from the code.
#define _XOPEN_SOURCE 700 // nftw
#include "harness.h"

#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/backend.h"
#include "ds/checkpoint.h"
#include "ds/cli.h"
#include "ds/config.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/safetensors.h"

#define FIX DS_SOURCE_DIR "/tests/fixtures/ckpt"

static char scratch[1024]; // this run's scratch directory under the build tree

// ---------------------------------------------------------------------------------------------
// Writing checkpoints

struct wt {
    char name[96];
    enum ds_dtype dtype;
    int ndim;
    int64_t shape[DS_MAX_DIMS];
    const void *data; // NULL: zeros
};

static uint64_t wt_bytes(const struct wt *t) {
    uint64_t n = ds_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

// A safetensors file: u64 LE header length, JSON header padded with spaces to 8, the data.
static void write_st(const char *path, const struct wt *t, size_t n) {
    json_t *h = json_object();
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        uint64_t nb = wt_bytes(&t[i]);
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", ds_dtype_name(t[i].dtype),
                                      "shape", shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + nb)));
        off += nb;
    }
    char *text = json_dumps(h, JSON_COMPACT);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f || !text) {
        DS_FAILF("cannot write %s", path);
        free(text);
        json_decref(h);
        if (f) fclose(f);
        return;
    }
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(text, 1, len, f);
    for (size_t i = len; i < padded; i++) fputc(' ', f);
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = wt_bytes(&t[i]);
        if (t[i].data)
            fwrite(t[i].data, 1, nb, f);
        else
            for (uint64_t b = 0; b < nb; b++) fputc(0, f);
    }
    fclose(f);
    free(text);
    json_decref(h);
}

// Edits one tensor in place; returns false to drop it.
typedef bool (*edit_fn)(struct wt *t, void *user);
// Edits the config.json object.
typedef void (*config_fn)(json_t *cfg);

// Copies fixture `src` into scratch/<name>/ (config.json + one model.safetensors) through the
// edits, adding `extra` tensors; returns the new directory.
static const char *rewrite(const char *name, const char *src, edit_fn edit, void *user,
                           const struct wt *extra, size_t n_extra, config_fn cfg_edit) {
    static char dir[1200];
    char path[1400];
    snprintf(dir, sizeof dir, "%s/%s", scratch, name);
    mkdir(dir, 0755);

    ds_safetensors_t *st = NULL;
    if (ds_safetensors_open_dir(src, &st) != DS_OK) {
        DS_FAILF("cannot open fixture %s: %s", src, ds_error_last());
        return dir;
    }
    size_t n = ds_safetensors_count(st), k = 0;
    struct wt *t = calloc(n + n_extra, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        const struct ds_tensor_info *info = ds_safetensors_at(st, i);
        struct wt w = {.dtype = info->dtype, .ndim = info->ndim, .data = info->data};
        snprintf(w.name, sizeof w.name, "%s", info->name);
        memcpy(w.shape, info->shape, sizeof w.shape);
        if (!edit || edit(&w, user)) t[k++] = w;
    }
    for (size_t i = 0; i < n_extra; i++) t[k++] = extra[i];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, t, k);
    free(t);
    ds_safetensors_close(st);

    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (cfg_edit) cfg_edit(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
    return dir;
}

// ---------------------------------------------------------------------------------------------
// Running the command

// Runs `draftscope inspect` with stdout sent to scratch/out.txt; returns the exit code.
static int run_inspect(const char *target, const char *draft, bool json) {
    char a0[] = "inspect", a1[] = "--target", a3[] = "--draft", a5[] = "--json";
    char *argv[8];
    int argc = 0;
    argv[argc++] = a0;
    argv[argc++] = a1;
    argv[argc++] = (char *)target;
    if (draft) {
        argv[argc++] = a3;
        argv[argc++] = (char *)draft;
    }
    if (json) argv[argc++] = a5;
    argv[argc] = NULL;
    char path[1100];
    snprintf(path, sizeof path, "%s/out.txt", scratch);
    fflush(stdout);
    int saved = dup(1);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    close(fd);
    int rc = ds_cmd_inspect(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rc;
}

static json_t *inspect_json(const char *target, const char *draft, int want_rc) {
    int rc = run_inspect(target, draft, true);
    EXPECT_EQ_INT(rc, want_rc);
    char path[1100];
    json_error_t err;
    snprintf(path, sizeof path, "%s/out.txt", scratch);
    json_t *r = json_load_file(path, 0, &err);
    if (!r) DS_FAILF("inspect --json printed no JSON: %s", err.text);
    return r;
}

static char *read_output(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/out.txt", scratch);
    FILE *f = fopen(path, "rb");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
    return buf;
}

// The report lists a problem containing `needle`.
static bool has_problem(const json_t *r, const char *needle) {
    const json_t *p = json_object_get(r, "problems");
    for (size_t i = 0; i < json_array_size(p); i++)
        if (strstr(json_string_value(json_array_get(p, i)), needle)) return true;
    return false;
}

#define EXPECT_PROBLEM(r, needle)                                                                  \
    do {                                                                                           \
        if (!has_problem((r), (needle))) {                                                         \
            char *ds_d_ = json_dumps(json_object_get((r), "problems"), JSON_INDENT(1));            \
            DS_FAILF("no problem contains \"%s\"; problems: %s", (needle), ds_d_);                 \
            free(ds_d_);                                                                           \
        }                                                                                          \
    } while (0)

static long long jpath_int(const json_t *r, const char *a, const char *b, const char *c) {
    const json_t *v = json_object_get(json_object_get(r, a), b);
    if (c) v = json_object_get(v, c);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -999;
}

static void expect_ints(const json_t *a, const long long *want, size_t n) {
    if (json_array_size(a) != n) {
        DS_FAILF("array of %zu, expected %zu", json_array_size(a), n);
        return;
    }
    for (size_t i = 0; i < n; i++) EXPECT_EQ_INT(json_integer_value(json_array_get(a, i)), want[i]);
}

// ---------------------------------------------------------------------------------------------
// The fixtures as committed

// Tiny target, per layer: norms 2x64, q 128x64+128, k and v 64x64+64 each, o 64x128+64,
// sinks 4, router 8x64+8, gate_up 8x128x64 codes + 8x128 bias, down 8x64x64 + 8x64 bias
// = 125,388 (experts 99,840 of it); x4 layers = 501,552; embed and lm_head 2x512x64 + norm 64
// = 65,600. Total 567,152. Active = 567,152 - embed 32,768 - experts 399,360 + 399,360 x 4/8
// = 334,704.
static void fixtures_usable(void) {
    json_t *r = inspect_json(FIX "/target", FIX "/draft-lmsys", 0);
    EXPECT_EQ_INT(jpath_int(r, "target", "parameters", "total"), 567152);
    EXPECT_EQ_INT(jpath_int(r, "target", "parameters", "active_per_token"), 334704);
    EXPECT_EQ_INT(jpath_int(r, "target", "tensors", NULL), 4 * 19 + 3);
    EXPECT_EQ_INT(jpath_int(r, "target", "files", NULL), 3);
    // MXFP4 bytes: per layer 8x128x2x16 + 8x128x2 + 8x64x2x16 + 8x64x2 = 52,224; x4.
    EXPECT_EQ_INT(jpath_int(r, "target", "mxfp4", "bytes"), 4 * 52224);
    EXPECT_EQ_INT(json_array_size(json_object_get(r, "problems")), 0);
    const json_t *d = json_object_get(r, "draft");
    EXPECT_EQ_STR(json_string_value(json_object_get(d, "layout")), "specforge");
    EXPECT_EQ_STR(json_string_value(json_object_get(d, "layer_names")), "midlayer.");
    EXPECT(json_is_true(json_object_get(d, "embed_tokens")));
    const json_t *vm = json_object_get(d, "vocab_map");
    EXPECT(json_is_true(json_object_get(vm, "checked")));
    EXPECT(json_is_true(json_object_get(vm, "t2d_consistent")));
    EXPECT_EQ_INT(json_integer_value(json_object_get(vm, "t2d_set")), 128);
    const json_t *aux = json_object_get(d, "aux");
    EXPECT_EQ_STR(json_string_value(json_object_get(aux, "default_convention")), "output-of");
    // lmsys ids [0, 1, 2] are layer outputs: boundaries 1, 2, 3; read raw (capture-before or
    // boundary) they would be 0, 1, 2.
    expect_ints(json_object_get(aux, "boundaries"), (const long long[]){1, 2, 3}, 3);
    const json_t *by = json_object_get(aux, "boundaries_by_convention");
    expect_ints(json_object_get(by, "capture-before"), (const long long[]){0, 1, 2}, 3);
    json_decref(r);

    r = inspect_json(FIX "/target", FIX "/draft-speculators", 0);
    d = json_object_get(r, "draft");
    EXPECT_EQ_STR(json_string_value(json_object_get(d, "layout")), "speculators");
    EXPECT_EQ_STR(json_string_value(json_object_get(d, "layer_names")), "layers.0.");
    EXPECT(!json_is_true(json_object_get(d, "embed_tokens")));
    aux = json_object_get(d, "aux");
    EXPECT_EQ_STR(json_string_value(json_object_get(aux, "default_convention")), "capture-before");
    expect_ints(json_object_get(aux, "boundaries"), (const long long[]){1, 2, 3}, 3);
    json_decref(r);

    r = inspect_json(FIX "/target", FIX "/draft-nvidia-v3", 0);
    d = json_object_get(r, "draft");
    EXPECT_EQ_STR(json_string_value(json_object_get(d, "layout")), "nvidia");
    EXPECT(json_is_true(json_object_get(d, "full_vocab_head")));
    EXPECT(!json_is_true(json_object_get(json_object_get(d, "vocab_map"), "checked")));
    aux = json_object_get(d, "aux");
    EXPECT_EQ_STR(json_string_value(json_object_get(aux, "default_convention")), "boundary");
    expect_ints(json_object_get(aux, "boundaries"), (const long long[]){2, 3, 4}, 3);
    // As output-of ids, 4 would name boundary 5 of a 4-layer target: reported, not a problem.
    by = json_object_get(aux, "boundaries_by_convention");
    EXPECT(json_is_string(json_object_get(by, "output-of")));
    json_decref(r);
}

static void text_output(void) {
    EXPECT_EQ_INT(run_inspect(FIX "/target", FIX "/draft-speculators", false), 0);
    const char *out = read_output();
    EXPECT(strstr(out, "capture-before  -> boundaries [1, 2, 3]   <- default"));
    EXPECT(strstr(out, "layers           4: 2 sliding (window 128), 2 full; SFSF"));
    EXPECT(strstr(out, "567.2 K total (567152)"));
    EXPECT(strstr(out, "ok: no problems found"));
}

static void usage_errors(void) {
    char a0[] = "inspect", help[] = "--help", bogus[] = "--bogus", t[] = "--target",
         dir[] = FIX "/target", extra[] = "extra";
    char *none[] = {a0, NULL};
    EXPECT_EQ_INT(ds_cmd_inspect(1, none), 2);
    char *h[] = {a0, help, NULL};
    fflush(stdout);
    EXPECT_EQ_INT(run_inspect(FIX "/target", NULL, false), 0); // keeps stdout tidy below
    int saved = dup(1), fd = open("/dev/null", O_WRONLY);
    dup2(fd, 1);
    close(fd);
    int rc_help = ds_cmd_inspect(2, h);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    EXPECT_EQ_INT(rc_help, 0);
    char *b[] = {a0, bogus, NULL};
    EXPECT_EQ_INT(ds_cmd_inspect(2, b), 2);
    char *e[] = {a0, t, dir, extra, NULL};
    EXPECT_EQ_INT(ds_cmd_inspect(4, e), 2);
    char *m[] = {a0, t, NULL}; // --target without its value
    EXPECT_EQ_INT(ds_cmd_inspect(2, m), 2);
}

// ---------------------------------------------------------------------------------------------
// Broken targets

struct name_edit {
    const char *name;
};

static bool drop_named(struct wt *t, void *user) {
    return strcmp(t->name, ((struct name_edit *)user)->name) != 0;
}

// Opens a rewritten target and runs the table check; returns the problems.
static enum ds_status check_target_dir(const char *dir, struct ds_problems *p) {
    struct ds_target_config cfg;
    ds_safetensors_t *st = NULL;
    enum ds_status s = ds_target_config_load(dir, &cfg);
    if (s == DS_OK) s = ds_safetensors_open_dir(dir, &st);
    if (s != DS_OK) {
        DS_FAILF("%s does not open: %s", dir, ds_error_last());
        return s;
    }
    s = ds_checkpoint_check_target(&cfg, st, dir, p);
    ds_safetensors_close(st);
    return s;
}

static void target_missing_tensor(void) {
    struct name_edit e = {"model.layers.2.mlp.router.bias"};
    const char *dir = rewrite("missing", FIX "/target", drop_named, &e, NULL, 0, NULL);
    struct ds_problems p = {0};
    EXPECT_STATUS(check_target_dir(dir, &p), DS_ERR_MISMATCH);
    EXPECT_EQ_INT(p.count, 1);
    EXPECT_ERROR_HAS("/missing: missing tensor model.layers.2.mlp.router.bias (expected BF16 [8])");
    ds_problems_free(&p);
    json_t *r = inspect_json(dir, NULL, 1);
    EXPECT_PROBLEM(r, "missing tensor model.layers.2.mlp.router.bias");
    EXPECT(!json_is_true(json_object_get(r, "usable")));
    json_decref(r);
}

static bool shrink_q_proj(struct wt *t, void *user) {
    if (!strcmp(t->name, "model.layers.1.self_attn.q_proj.weight")) {
        t->shape[1] = 32;
        t->data = NULL;
    }
    return true;
}

static void target_wrong_shape(void) {
    const char *dir = rewrite("shape", FIX "/target", shrink_q_proj, NULL, NULL, 0, NULL);
    struct ds_problems p = {0};
    EXPECT_STATUS(check_target_dir(dir, &p), DS_ERR_MISMATCH);
    EXPECT_EQ_INT(p.count, 1);
    // q_proj is [heads*head_dim, hidden] = [128, 64].
    EXPECT_ERROR_HAS("shape/model.safetensors: tensor model.layers.1.self_attn.q_proj.weight: "
                     "expected shape [128, 64], found [128, 32]");
    ds_problems_free(&p);
}

static bool norm_to_f32(struct wt *t, void *user) {
    if (!strcmp(t->name, "model.norm.weight")) {
        t->dtype = DS_DTYPE_F32;
        t->data = NULL;
    }
    return true;
}

static void target_wrong_dtype(void) {
    const char *dir = rewrite("dtype", FIX "/target", norm_to_f32, NULL, NULL, 0, NULL);
    struct ds_problems p = {0};
    EXPECT_STATUS(check_target_dir(dir, &p), DS_ERR_MISMATCH);
    EXPECT_EQ_INT(p.count, 1);
    EXPECT_ERROR_HAS("tensor model.norm.weight: expected dtype BF16, found F32");
    ds_problems_free(&p);
}

static void target_unexpected_tensor(void) {
    struct wt extra = {"model.layers.0.mlp.experts.gate_up_proj", DS_DTYPE_BF16, 3, {8, 64, 128},
                       NULL};
    const char *dir = rewrite("unexpected", FIX "/target", NULL, NULL, &extra, 1, NULL);
    struct ds_problems p = {0};
    EXPECT_STATUS(check_target_dir(dir, &p), DS_ERR_MISMATCH);
    EXPECT_EQ_INT(p.count, 1);
    EXPECT_ERROR_HAS("unexpected/model.safetensors: unexpected tensor "
                     "model.layers.0.mlp.experts.gate_up_proj (BF16 [8, 64, 128])");
    ds_problems_free(&p);

    // Forty strays: 32 lines, then one line for the other 8.
    struct wt many[40];
    for (int i = 0; i < 40; i++) {
        many[i] = (struct wt){.dtype = DS_DTYPE_U8, .ndim = 1, .shape = {1}};
        snprintf(many[i].name, sizeof many[i].name, "stray.%02d", i);
    }
    dir = rewrite("strays", FIX "/target", NULL, NULL, many, 40, NULL);
    EXPECT_STATUS(check_target_dir(dir, &p), DS_ERR_MISMATCH);
    EXPECT_EQ_INT(p.count, 33);
    if (p.count == 33) EXPECT(strstr(p.lines[32], "... and 8 more unexpected tensors"));
    ds_problems_free(&p);

    // A name with a newline and an escape (legal in the JSON header) stays on one line, with
    // '?' for each control byte; it once split the message and reached the terminal raw.
    struct wt odd = {"stray\nname\x1b[31m", DS_DTYPE_U8, 1, {1}, NULL};
    dir = rewrite("control", FIX "/target", NULL, NULL, &odd, 1, NULL);
    EXPECT_STATUS(check_target_dir(dir, &p), DS_ERR_MISMATCH);
    EXPECT_EQ_INT(p.count, 1);
    EXPECT_ERROR_HAS("control/model.safetensors: unexpected tensor stray?name?[31m (U8 [1])");
    EXPECT(strpbrk(ds_error_last(), "\n\x1b") == NULL);
    ds_problems_free(&p);
}

static void drop_experts_field(json_t *cfg) {
    json_object_del(cfg, "num_local_experts");
}

static void target_missing_config_field(void) {
    const char *dir = rewrite("nofield", FIX "/target", NULL, NULL, NULL, 0, drop_experts_field);
    json_t *r = inspect_json(dir, FIX "/draft-lmsys", 1);
    EXPECT_PROBLEM(r, "nofield/config.json: missing required field 'num_local_experts'");
    json_decref(r);
}

static void target_malformed_config(void) {
    const char *dir = rewrite("malformed", FIX "/target", NULL, NULL, NULL, 0, NULL);
    char path[1400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"vocab_size\": 512, \"hidden_size\": ", f);
    fclose(f);
    json_t *r = inspect_json(dir, NULL, 1);
    EXPECT_PROBLEM(r, "malformed/config.json: malformed JSON at line 1");
    // The tensor table is still summarised.
    EXPECT_EQ_INT(jpath_int(r, "target", "tensors", NULL), 79);
    json_decref(r);
}

static void no_attention_bias(json_t *cfg) {
    json_object_set_new(cfg, "attention_bias", json_false());
}
static void tied_embeddings(json_t *cfg) {
    json_object_set_new(cfg, "tie_word_embeddings", json_true());
}
static bool drop_attention_biases(struct wt *t, void *user) {
    return !(strstr(t->name, ".self_attn.") && strstr(t->name, "_proj.bias"));
}

// Checkpoints the loader cannot load (it binds every bias and lm_head) were once called usable.
static void target_unsupported_config(void) {
    const char *dir = rewrite("nobias", FIX "/target", drop_attention_biases, NULL, NULL, 0,
                              no_attention_bias);
    json_t *r = inspect_json(dir, NULL, 1);
    EXPECT_PROBLEM(r, "nobias/config.json: field 'attention_bias' is false, expected true");
    json_decref(r);
    struct name_edit e = {"lm_head.weight"};
    dir = rewrite("tied", FIX "/target", drop_named, &e, NULL, 0, tied_embeddings);
    r = inspect_json(dir, NULL, 1);
    EXPECT_PROBLEM(r, "tied/config.json: field 'tie_word_embeddings' is true, expected false");
    json_decref(r);
}

// ---------------------------------------------------------------------------------------------
// Refusals inspect shares with the loaders: each checkpoint below has one problem, and inspect's
// line for it is the loader's error, word for word (they once disagreed: inspect called
// checkpoints usable that the loaders refused, or said it otherwise).

static struct ds_backend *be; // the CPU reference, for the loaders
static void set_vocab_600(json_t *cfg);

static const struct ds_gptoss_plan TARGET_PLAN = {.max_slots = 1, .max_pos = 16, .max_rows = 4};
static const struct ds_eagle3_plan DRAFT_PLAN = {.max_slots = 1, .max_pos = 16, .max_rows = 4};

// inspect refuses the target (and the draft, when given) with 1 + `more` problem lines, the first
// containing `needle`; the loader, and the early check of run and generate, refuse it with that
// first line as their error, followed by "(and N more problems)" when there are more.
static void expect_refused_alike(const char *target, const char *draft, const char *needle,
                                 size_t more) {
    json_t *r = inspect_json(target, draft, 1);
    if (!r) return;
    const json_t *p = json_object_get(r, "problems");
    EXPECT_EQ_INT(json_array_size(p), 1 + more);
    const char *line = json_string_value(json_array_get(p, 0));
    char want[1024];
    snprintf(want, sizeof want, "%s", line ? line : "");
    json_decref(r);
    if (!strstr(want, needle)) DS_FAILF("inspect said \"%s\", wanted \"%s\"", want, needle);
    if (more) {
        size_t n = strlen(want);
        snprintf(want + n, sizeof want - n, " (and %zu more problems)", more);
    }

    ds_gptoss_t *m = NULL;
    ds_eagle3_t *d = NULL;
    if (!draft) {
        EXPECT(ds_gptoss_create(target, be, &TARGET_PLAN, NULL, &m) != DS_OK);
    } else {
        EXPECT_OK(ds_gptoss_create(target, be, &TARGET_PLAN, NULL, &m));
        if (m) EXPECT(ds_eagle3_create(draft, m, be, &DRAFT_PLAN, NULL, &d) != DS_OK);
    }
    EXPECT_EQ_STR(ds_error_last(), want);
    // The early check of run and generate says the same.
    struct ds_target_config tc;
    struct ds_draft_config dc;
    if (!draft) {
        EXPECT(ds_gptoss_check_dir(target, &tc) != DS_OK);
    } else {
        EXPECT_OK(ds_gptoss_check_dir(target, &tc));
        EXPECT(ds_eagle3_check_dir(draft, &tc, &dc) != DS_OK);
    }
    EXPECT_EQ_STR(ds_error_last(), want);
    ds_eagle3_release(d);
    ds_gptoss_release(m);
}

// BF16 experts: transformers' dequantized layout, which the table check accepts and the model
// does not run.
static void no_quantization(json_t *cfg) {
    json_object_del(cfg, "quantization_config");
}

static bool mxfp4_to_bf16(struct wt *t, void *user) {
    return !strstr(t->name, "_blocks") && !strstr(t->name, "_scales");
}

static void target_bf16_experts_refused(void) {
    struct wt extra[8];
    for (int l = 0; l < 4; l++) { // [E, H, 2I] and [E, I, H]
        extra[2 * l] = (struct wt){.dtype = DS_DTYPE_BF16, .ndim = 3, .shape = {8, 64, 128}};
        snprintf(extra[2 * l].name, sizeof extra[2 * l].name,
                 "model.layers.%d.mlp.experts.gate_up_proj", l);
        extra[2 * l + 1] = (struct wt){.dtype = DS_DTYPE_BF16, .ndim = 3, .shape = {8, 64, 64}};
        snprintf(extra[2 * l + 1].name, sizeof extra[2 * l + 1].name,
                 "model.layers.%d.mlp.experts.down_proj", l);
    }
    const char *dir =
        rewrite("bf16-experts", FIX "/target", mxfp4_to_bf16, NULL, extra, 8, no_quantization);
    expect_refused_alike(dir, NULL,
                         "bf16-experts/config.json: quantization_config: expected quant_method "
                         "\"mxfp4\" (only MXFP4 experts are supported), found none",
                         0);
}

// head_dim 33 with tensors of that head size: q 4 x 33 = 132 rows, k and v 2 x 33 = 66.
static void head_dim_33(json_t *cfg) {
    json_object_set_new(cfg, "head_dim", json_integer(33));
}

static bool resize_heads_33(struct wt *t, void *user) {
    const bool q = strstr(t->name, "q_proj") != NULL,
               kv = strstr(t->name, "k_proj") || strstr(t->name, "v_proj");
    if (q || kv) t->shape[0] = q ? 132 : 66;
    if (strstr(t->name, "o_proj.weight")) t->shape[1] = 132;
    if (q || kv || strstr(t->name, "o_proj.weight")) t->data = NULL;
    return true;
}

static void llama3_rope(json_t *cfg) {
    json_object_set_new(cfg, "rope_scaling",
                        json_pack("{s:s, s:f}", "rope_type", "llama3", "factor", 8.0));
}

static void target_config_refused_alike(void) {
    const char *dir = rewrite("hd33", FIX "/target", resize_heads_33, NULL, NULL, 0, head_dim_33);
    expect_refused_alike(dir, NULL,
                         "hd33/config.json: head_dim: expected an even value up to 256, found 33",
                         0);
    dir = rewrite("llama3", FIX "/target", NULL, NULL, NULL, 0, llama3_rope);
    expect_refused_alike(dir, NULL, "llama3/config.json: rope type: expected default or yarn, "
                                    "found llama3", 0);
}

// A config vocab_size the embedding and lm_head disagree with: one line per table, naming
// config.json, the tensor's file and both numbers (it was two bare shape mismatches).
static void target_vocab_disagrees(void) {
    const char *dir = rewrite("vocab600", FIX "/target", NULL, NULL, NULL, 0, set_vocab_600);
    char want[1400];
    snprintf(want, sizeof want,
             "vocab600/config.json: vocab_size is 600, but tensor model.embed_tokens.weight in "
             "%s/model.safetensors has 512 rows",
             dir);
    expect_refused_alike(dir, NULL, want, 1);
    json_t *r = inspect_json(dir, NULL, 1);
    EXPECT_PROBLEM(r, "config.json: vocab_size is 600, but tensor lm_head.weight in ");
    EXPECT(!has_problem(r, "expected shape"));
    json_decref(r);
}

static void gelu(json_t *cfg) {
    json_object_set_new(cfg, "hidden_act", json_string("gelu"));
}
static void two_layers(json_t *cfg) {
    json_object_set_new(cfg, "num_hidden_layers", json_integer(2));
}
static void linear_rope(json_t *cfg) {
    json_object_set_new(cfg, "rope_scaling",
                        json_pack("{s:s, s:f}", "rope_type", "linear", "factor", 2.0));
}

static void draft_config_refused_alike(void) {
    const char *dir = rewrite("gelu", FIX "/draft-lmsys", NULL, NULL, NULL, 0, gelu);
    expect_refused_alike(FIX "/target", dir, "gelu/config.json: hidden_act: expected silu, "
                                             "found gelu", 0);
    dir = rewrite("layers2", FIX "/draft-lmsys", NULL, NULL, NULL, 0, two_layers);
    expect_refused_alike(FIX "/target", dir, "layers2/config.json: num_hidden_layers: expected 1 "
                                             "(one EAGLE-3 layer), found 2", 0);
    dir = rewrite("linear", FIX "/draft-lmsys", NULL, NULL, NULL, 0, linear_rope);
    expect_refused_alike(FIX "/target", dir, "linear/config.json: rope type: expected default or "
                                             "yarn, found linear", 0);
}

// ---------------------------------------------------------------------------------------------
// Broken drafts

static void set_target_hidden_96(json_t *cfg) {
    json_object_set_new(cfg, "target_hidden_size", json_integer(96));
}

static void draft_hidden_mismatch(void) {
    const char *dir =
        rewrite("thidden", FIX "/draft-lmsys", NULL, NULL, NULL, 0, set_target_hidden_96);
    json_t *r = inspect_json(FIX "/target", dir, 1);
    EXPECT_PROBLEM(r, "thidden/config.json: target_hidden_size: expected the target's "
                      "hidden_size 64 (fc takes 3 x that), found 96");
    // fc is [hidden, 3 x target_hidden] = [64, 288] by that config; the file has [64, 192].
    EXPECT_PROBLEM(r, "tensor fc.weight: expected shape [64, 288], found [64, 192]");
    json_decref(r);

    // A draft without embed_tokens borrows the target's [V, 64] table: its hidden must be 64.
    struct ds_target_config t;
    struct ds_draft_config d;
    ds_safetensors_t *st = NULL;
    EXPECT_OK(ds_target_config_load(FIX "/target", &t));
    EXPECT_OK(ds_draft_config_load(FIX "/draft-speculators", &d));
    EXPECT_OK(ds_safetensors_open_dir(FIX "/draft-speculators", &st));
    struct ds_problems p = {0};
    EXPECT_OK(ds_checkpoint_check_draft(&d, st, "spec", &p));
    d.hidden_size = 96;
    struct ds_pair_report rep;
    EXPECT_STATUS(ds_checkpoint_check_pair(&t, &d, st, "spec", &rep, &p), DS_ERR_MISMATCH);
    EXPECT_ERROR_HAS("spec/config.json: hidden_size: expected the target's 64 (the draft has no "
                     "embed_tokens and borrows the target's), found 96");
    ds_problems_free(&p);
    ds_safetensors_close(st);
}

static void set_vocab_600(json_t *cfg) {
    json_object_set_new(cfg, "vocab_size", json_integer(600));
}

static void draft_vocab_mismatch(void) {
    const char *dir = rewrite("vocab", FIX "/draft-lmsys", NULL, NULL, NULL, 0, set_vocab_600);
    json_t *r = inspect_json(FIX "/target", dir, 1);
    EXPECT_PROBLEM(r, "vocab/config.json: vocab_size: expected the target's 512, found 600");
    EXPECT_PROBLEM(r, "tensor t2d: expected shape [600], found [512]");
    json_decref(r);
}

// Copies of the fixture's d2t / t2d with one change each.
static int64_t d2t_copy[128];
static unsigned char t2d_copy[512];

// Sets d2t[set[0]] = set[1].
static bool edit_d2t(struct wt *t, void *user) {
    const int64_t *set = user;
    if (!strcmp(t->name, "d2t")) {
        memcpy(d2t_copy, t->data, sizeof d2t_copy);
        d2t_copy[set[0]] = set[1];
        t->data = d2t_copy;
    }
    return true;
}

static void check_pair_dir(const char *dir, struct ds_pair_report *rep, struct ds_problems *p) {
    struct ds_target_config t;
    struct ds_draft_config d;
    ds_safetensors_t *st = NULL;
    EXPECT_OK(ds_target_config_load(FIX "/target", &t));
    EXPECT_OK(ds_draft_config_load(dir, &d));
    EXPECT_OK(ds_safetensors_open_dir(dir, &st));
    EXPECT_OK(ds_checkpoint_check_draft(&d, st, dir, p));
    EXPECT_STATUS(ds_checkpoint_check_pair(&t, &d, st, dir, rep, p), DS_ERR_MISMATCH);
    ds_safetensors_close(st);
}

static void draft_d2t_out_of_range(void) {
    int64_t set[2] = {127, 1000}; // draft id 127 -> target id 1127, outside 0..511
    const char *dir = rewrite("d2t", FIX "/draft-lmsys", edit_d2t, set, NULL, 0, NULL);
    struct ds_pair_report rep;
    struct ds_problems p = {0};
    check_pair_dir(dir, &rep, &p);
    EXPECT(rep.vocab_map_checked);
    EXPECT_EQ_INT(rep.d2t_out_of_range, 1);
    EXPECT_ERROR_HAS("d2t/model.safetensors: tensor d2t: entry 127 is 1000, which maps draft id "
                     "127 to target id 1127, expected 0..511");
    EXPECT(!rep.t2d_consistent); // t2d still marks the old id 127 + d2t[127]
    ds_problems_free(&p);

    // 1 + INT64_MAX once overflowed (undefined) and was reported as target id -2^63.
    set[0] = 1;
    set[1] = INT64_MAX;
    dir = rewrite("d2t-max", FIX "/draft-lmsys", edit_d2t, set, NULL, 0, NULL);
    check_pair_dir(dir, &rep, &p);
    EXPECT_EQ_INT(rep.d2t_out_of_range, 1);
    EXPECT_ERROR_HAS("tensor d2t: entry 1 is 9223372036854775807, which maps draft id 1 to "
                     "target id 1 + 9223372036854775807, expected 0..511");
    EXPECT(p.count == 2 && strstr(p.lines[1], "expected 1 + 9223372036854775807 = 1 + d2t[1]"));
    ds_problems_free(&p);
}

// Moves the first set entry of t2d to the first unset one (the count stays 128).
static int64_t moved_from, moved_to;
static bool edit_t2d(struct wt *t, void *user) {
    if (!strcmp(t->name, "t2d")) {
        memcpy(t2d_copy, t->data, sizeof t2d_copy);
        moved_from = moved_to = -1;
        for (int v = 0; v < 512; v++) {
            if (t2d_copy[v] && moved_from < 0) moved_from = v;
            if (!t2d_copy[v] && moved_to < 0) moved_to = v;
        }
        t2d_copy[moved_from] = 0;
        if (user) t2d_copy[moved_to] = 1; // NULL user: only clear (count becomes 127)
        t->data = t2d_copy;
    }
    return true;
}

static void draft_t2d_inconsistent(void) {
    int move = 1;
    const char *dir = rewrite("t2d", FIX "/draft-lmsys", edit_t2d, &move, NULL, 0, NULL);
    struct ds_pair_report rep;
    struct ds_problems p = {0};
    check_pair_dir(dir, &rep, &p);
    EXPECT_EQ_INT(rep.d2t_out_of_range, 0);
    EXPECT_EQ_INT(rep.t2d_set, 128);
    EXPECT(!rep.t2d_consistent);
    // Draft id 0 maps to the lowest kept id, moved_from (d2t[0] = moved_from); entry #0 of the
    // edited t2d is no longer that id.
    char want[128];
    snprintf(want, sizeof want, "expected %lld = 0 + d2t[0]", (long long)moved_from);
    EXPECT_ERROR_HAS("tensor t2d: set entry #0 is target id");
    EXPECT_ERROR_HAS(want);
    ds_problems_free(&p);

    dir = rewrite("t2d-count", FIX "/draft-lmsys", edit_t2d, NULL, NULL, 0, NULL);
    check_pair_dir(dir, &rep, &p);
    EXPECT_ERROR_HAS("tensor t2d: expected 128 set entries (draft_vocab_size), found 127");
    ds_problems_free(&p);
}

static void ids_0_1_5(json_t *cfg) {
    json_object_set_new(json_object_get(cfg, "eagle_config"), "eagle_aux_hidden_state_layer_ids",
                        json_pack("[i, i, i]", 0, 1, 5));
}

static void draft_aux_out_of_range(void) {
    const char *dir = rewrite("aux", FIX "/draft-lmsys", NULL, NULL, NULL, 0, ids_0_1_5);
    json_t *r = inspect_json(FIX "/target", dir, 1);
    // Output-of id 5 is the output of layer 5: boundary 6, past the 4-layer target's last (4).
    // (An id of exactly 4 would mark the ids as boundary ids, the NVIDIA v3 rule.)
    EXPECT_PROBLEM(r, "aux/config.json: eagle_config.eagle_aux_hidden_state_layer_ids: id 5 "
                      "names boundary 6 under the output-of convention, outside 0..4");
    EXPECT_EQ_INT(json_array_size(json_object_get(r, "problems")), 1);
    json_decref(r);
}

// Variants that must pass: a no-aux head, layers.0.* names in a SpecForge config, a
// full-vocabulary head sharing the target's lm_head.
static bool drop_fc(struct wt *t, void *user) {
    return strcmp(t->name, "fc.weight") != 0;
}

static void no_aux(json_t *cfg) {
    json_object_set_new(cfg, "eagle_config", json_pack("{s:b}", "use_aux_hidden_state", 0));
}

static bool rename_midlayer(struct wt *t, void *user) {
    if (!strncmp(t->name, "midlayer.", 9)) {
        // "midlayer." and "layers.0." are both 9 bytes: the rename fits in place.
        memcpy(t->name, "layers.0.", 9);
    }
    return true;
}

static void draft_variants_usable(void) {
    const char *dir = rewrite("noaux", FIX "/draft-lmsys", drop_fc, NULL, NULL, 0, no_aux);
    json_t *r = inspect_json(FIX "/target", dir, 0);
    const json_t *aux = json_object_get(json_object_get(r, "draft"), "aux");
    EXPECT(json_is_false(json_object_get(aux, "use_aux_hidden_state")));
    json_decref(r);

    dir = rewrite("layers0", FIX "/draft-lmsys", rename_midlayer, NULL, NULL, 0, NULL);
    r = inspect_json(FIX "/target", dir, 0);
    EXPECT_EQ_STR(json_string_value(json_object_get(json_object_get(r, "draft"), "layer_names")),
                  "layers.0.");
    json_decref(r);

    struct name_edit e = {"lm_head.weight"};
    dir = rewrite("shared-head", FIX "/draft-nvidia-v3", drop_named, &e, NULL, 0, NULL);
    r = inspect_json(FIX "/target", dir, 0);
    EXPECT(json_is_true(json_object_get(json_object_get(r, "draft"), "lm_head_from_target")));
    json_decref(r);

    // But a draft with tensors of a head it does not configure lists them.
    dir = rewrite("noaux-fc", FIX "/draft-lmsys", NULL, NULL, NULL, 0, no_aux);
    r = inspect_json(FIX "/target", dir, 1);
    EXPECT_PROBLEM(r, "unexpected tensor fc.weight (BF16 [64, 192])");
    json_decref(r);
}

static void no_aux_target_hidden_96(json_t *cfg) {
    no_aux(cfg);
    set_target_hidden_96(cfg);
}

// A no-aux head has no fc, so its target_hidden_size reads nothing: inspect let it pass, and the
// loader refused it ("target_hidden_size 96, target has 64"); both take it now.
static void no_aux_target_hidden_unused(void) {
    const char *dir =
        rewrite("noaux-th96", FIX "/draft-lmsys", drop_fc, NULL, NULL, 0, no_aux_target_hidden_96);
    json_t *r = inspect_json(FIX "/target", dir, 0);
    json_decref(r);
    ds_gptoss_t *m = NULL;
    ds_eagle3_t *d = NULL;
    EXPECT_OK(ds_gptoss_create(FIX "/target", be, &TARGET_PLAN, NULL, &m));
    if (m) EXPECT_OK(ds_eagle3_create(dir, m, be, &DRAFT_PLAN, NULL, &d));
    ds_eagle3_release(d);
    ds_gptoss_release(m);
}

static void missing_draft_dir(void) {
    json_t *r = inspect_json(FIX "/target", DS_BINARY_DIR "/no-such-draft", 1);
    EXPECT_PROBLEM(r, "no-such-draft/config.json: cannot open");
    json_decref(r);
}

// ---------------------------------------------------------------------------------------------

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

int main(void) {
    snprintf(scratch, sizeof scratch, "%s/test_inspect.XXXXXX", DS_BINARY_DIR);
    if (!mkdtemp(scratch)) {
        perror(scratch);
        return 1;
    }
    if (ds_backend_ref_create(&be) != DS_OK) {
        fprintf(stderr, "%s\n", ds_error_last());
        return 1;
    }
    DS_RUN(fixtures_usable);
    DS_RUN(text_output);
    DS_RUN(usage_errors);
    DS_RUN(target_missing_tensor);
    DS_RUN(target_wrong_shape);
    DS_RUN(target_wrong_dtype);
    DS_RUN(target_unexpected_tensor);
    DS_RUN(target_missing_config_field);
    DS_RUN(target_malformed_config);
    DS_RUN(target_unsupported_config);
    DS_RUN(target_bf16_experts_refused);
    DS_RUN(target_config_refused_alike);
    DS_RUN(target_vocab_disagrees);
    DS_RUN(draft_config_refused_alike);
    DS_RUN(draft_hidden_mismatch);
    DS_RUN(draft_vocab_mismatch);
    DS_RUN(draft_d2t_out_of_range);
    DS_RUN(draft_t2d_inconsistent);
    DS_RUN(draft_aux_out_of_range);
    DS_RUN(draft_variants_usable);
    DS_RUN(no_aux_target_hidden_unused);
    DS_RUN(missing_draft_dir);
    ds_backend_release(be);
    int rc = ds_test_end();
    if (rc == 0) nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS); // keep it on failure
    return rc;
}
