// draftscope run: the profiler end to end (DESIGN §5, §6, §9, §10).
//
// Loads the target and the draft, renders the dataset's requests with harmony, plans memory once
// for the largest batch size, replays the requests at every batch size of the sweep with the
// speculative loop (ds/replay.h, ds/spec.h), writes the run file (ds/record.h) and prints the
// summary (ds/summary.h). Inputs are checked before anything is written: a missing file, a
// mismatched pair, an unwritable or non-regular output path and bad flags each end with one line
// and exit status 1 (input) or 2 (usage), leaving no file behind. SIGINT/SIGTERM finish the step,
// flush and close the file (exit 130, with the command to resume); a failed write (full disk,
// file-size limit) stops the run with the file readable up to its last flush (exit 1).
//
// --synthetic-weights SPEC replaces --target/--draft with a target and draft of real shapes whose
// weights are generated on the device (ds/synthetic.h), for step times, tracing overhead and the
// baseline at the 20b/120b shapes without a checkpoint. The file says so: target_path and
// draft_path hold "synthetic:SOURCE:SEED:LAYERS" / "synthetic-draft:...", the config hashes are
// SHA-256 digests of that identity text (see synthetic_identity), and options_json carries a
// "synthetic_weights" object. Acceptance is meaningless there (the draft does not predict the
// target), and the run says so at start. It needs the cuda device unless --device cpu is given
// explicitly (the reference backend fills the same weights; practical for small configs only).
#include <cuda_runtime.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/backend.h"
#include "ds/cli.h"
#include "ds/dataset.h"
#include "ds/device.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/harmony.h"
#include "ds/kernels_cuda.h"
#include "ds/progress.h"
#include "ds/record.h"
#include "ds/replay.h"
#include "ds/sha256.h"
#include "ds/spec.h"
#include "ds/summary.h"
#include "ds/synthetic.h"
#include "ds/tokenizer.h"
#include "ds/trace.h"

// The subcommand's entry point (to be listed in ds/cli.h with the others).
int ds_cmd_run(int argc, char **argv);

#define MAX_BATCH_SIZES 64 // parse_batch_sizes's message says so
#define REPLY_ESTIMATE_EXTRA 32 // framing tokens around a generated reply (planning estimate)

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: draftscope run (--target DIR --draft DIR | --synthetic-weights SPEC)\n"
        "                      --dataset FILE --out RUN.h5 [options]\n"
        "\n"
        "Replays the dataset's conversations through the target with the EAGLE-3 draft at each\n"
        "batch size (continuous batching: B sequences in flight, a finished one replaced by the\n"
        "next request), records every drafted token and every (step, sequence) in RUN.h5 and\n"
        "prints the acceptance summary. docs/cli.md and docs/hdf5-schema.md have the details.\n"
        "\n"
        "inputs:\n"
        "  -t, --target DIR            gpt-oss checkpoint (Hugging Face layout)\n"
        "  -d, --draft DIR             EAGLE-3 draft checkpoint for that target\n"
        "      --synthetic-weights SPEC\n"
        "                              instead of --target and --draft: a target and an EAGLE-3\n"
        "                              draft of real shapes, weights generated on the GPU from\n"
        "                              a seed. SPEC: 20b|120b[:SEED[:LAYERS]] (LAYERS keeps the\n"
        "                              first layers) or a config.json or a directory with one.\n"
        "                              Needs --tokenizer and a GPU (--device cpu forces the\n"
        "                              cpu, for small configs). For step times, tracing\n"
        "                              overhead and --baseline at real shapes; acceptance is\n"
        "                              near zero (the draft does not predict the target). The\n"
        "                              file names the models synthetic:SOURCE:SEED:LAYERS\n"
        "  -D, --dataset FILE          ShareGPT JSON/JSONL or MT-Bench/Spec-Bench questions\n"
        "      --tokenizer FILE        tokenizer.json or o200k_base.tiktoken (default:\n"
        "                              TARGET/tokenizer.json)\n"
        "  -o, --out FILE              the run file to write (HDF5)\n"
        "speculation:\n"
        "  -b, --batch-sizes LIST      concurrencies to sweep, e.g. 1,8,32 (default 1)\n"
        "  -k, --draft-tokens K        draft tokens per step, 1..%d (default 3)\n"
        "  -r, --rule RULE             greedy (default), target-only (draft argmax accepted with\n"
        "                              probability p, as vLLM/SGLang at T > 0) or rejection\n"
        "                              (sampled draft, min(1, p/q), residual (p - q)+)\n"
        "      --temperature T         sampling temperature of the sampling rules, 1e-06..1e+06\n"
        "                              (default 1.0; greedy records p and q at 1.0)\n"
        "      --top-p P               nucleus threshold in (0, 1] (default 1.0 = off)\n"
        "      --seed S                seed of the counter-based generator (default 0)\n"
        "replay:\n"
        "  -n, --max-new-tokens N      tokens to generate per request at most (default 256)\n"
        "  -N, --num-conversations N   conversations to replay (default: all usable ones)\n"
        "      --shuffle               pick them by a seeded shuffle (--seed) instead of the first N\n"
        "      --turns first|all       first user turn only (default), or every turn\n"
        "      --on-bad skip|fail      a malformed record (bad JSON or UTF-8, wrong types) is\n"
        "                              skipped and counted, with one line on stderr and the\n"
        "                              counts in the run file (default), or stops the run\n"
        "                              before anything is written\n"
        "      --reasoning-effort E    low, medium (default) or high (harmony system message)\n"
        "      --max-context N         context limit in positions, and the KV cache's size\n"
        "                              (default: longest prompt + max-new-tokens + K + 2, at\n"
        "                              most the target's limit); a prompt that leaves no\n"
        "                              position to generate is skipped with a message\n"
        "      --prefill-chunk N       prompt rows per prefill pass (default 512)\n"
        "output:\n"
        "      --overwrite             replace an existing run file\n"
        "      --resume                continue an interrupted run in the same file (same\n"
        "                              models, dataset, seed, K, rule, temperature, top-p,\n"
        "                              max-new-tokens, turns, reasoning effort, shuffle,\n"
        "                              activations, tokenizer file, --max-context as given,\n"
        "                              aux boundaries, numerics and verify padding; -N may\n"
        "                              grow, batch sizes may be added)\n"
        "      --aux-convention C      read the draft's aux layer ids as output-of (SpecForge),\n"
        "                              capture-before (vLLM) or boundary ids, instead of the\n"
        "                              convention its config implies (docs/checkpoints.md): feed\n"
        "                              it the layers an engine would and compare acceptance\n"
        "      --device D              auto (default), cpu or cuda\n"
        "      --activations A         auto (default: the backend's own, f32 on the cpu, bf16 on\n"
        "                              cuda), f32 or bf16 (cuda only); f32 on cuda gives the\n"
        "                              cpu's records (same tool on either device)\n"
        "      --numerics N            invariant (default: a sequence's bits never depend on\n"
        "                              its batch) or batch-variant (cuda only: the attention\n"
        "                              splits a row's keys by the call's size, as flash-decoding\n"
        "                              engines do), to see how much acceptance moves across\n"
        "                              batch sizes with numerics alone (docs/cli.md)\n"
        "      --pad-to-graph-sizes L  pad each verify with dummy rows to the next size of L\n"
        "                              (verify rows, ascending, e.g. 1,2,4,8,16,32,64,128,256,\n"
        "                              512), as CUDA-graph engines do; compare with a run\n"
        "                              without it (draftscope.divergence): invariant numerics\n"
        "                              must give the same bits\n"
        "tracing (docs/tracing.md):\n"
        "      --trace LEVEL           off (default), phases (per-phase GPU times in the steps\n"
        "                              rows and /ranges) or kernels (also CUPTI kernel records\n"
        "                              in /kernels); its overhead against off is measured first\n"
        "                              and stored. Without a GPU: one line, and tracing is off\n"
        "      --baseline              time plain target decoding (no draft) at each batch size\n"
        "                              first; the summary then shows the predicted speedup\n"
        "  -q, --quiet                 no load or progress lines, no memory plan (skips, caps\n"
        "                              and dropped trace records are still said)\n"
        "  -j, --json                  print the summary as one JSON object\n"
        "  -h, --help                  this text\n"
        "\n"
        "exit status: 0 done, 1 a problem with the input or the output file (one line), 2 usage,\n"
        "130 interrupted (the file is closed cleanly; rerun with --resume to continue)\n",
        DS_SPEC_MAX_K);
}

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "draftscope run: %s%s%s\n", what, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "usage: draftscope run (--target DIR --draft DIR | --synthetic-weights SPEC) "
                    "--dataset FILE --out RUN.h5 [options]   (--help for more)\n");
    return 2;
}

static int fail(const char *msg) {
    fprintf(stderr, "draftscope run: %s\n", msg);
    return 1;
}

struct run_opts {
    const char *target, *draft, *dataset, *tokenizer, *out;
    const char *synthetic;             // --synthetic-weights as given; NULL for checkpoints
    struct ds_synthetic_spec synth;    // its parse (check_synthetic)
    uint32_t batch_sizes[MAX_BATCH_SIZES];
    size_t n_batch;
    struct ds_spec_config spec;
    long long max_new, num_conv, max_context;
    bool shuffle, overwrite, resume, quiet, json;
    enum ds_dataset_turns turns;
    enum ds_dataset_on_bad on_bad;
    enum ds_reasoning reasoning;
    enum ds_device_kind device;
    enum ds_act_choice act; // DS_ACT_DEFAULT = auto
    bool batch_variant;     // --numerics batch-variant
    enum ds_rec_trace_level trace;
    bool baseline;
    bool aux_set;                     // --aux-convention given
    enum ds_aux_convention aux_conv; // its value: how the draft's aux ids name target layers
};

// Resolves --synthetic-weights before any work (0 when usable, else the exit status; see
// ds_cli_synthetic).
static int check_synthetic(struct run_opts *o) {
    struct ds_target_config tc;
    const int rc = ds_cli_synthetic(o->synthetic, true, &o->synth, &tc);
    return rc == 2 ? usage_error(ds_error_last(), NULL) : rc ? fail(ds_error_last()) : 0;
}

// NULL when s is a valid list, else what is wrong with it. Each B is one pass over the requests
// and its rows are keyed by B (docs/hdf5-schema.md), so a size listed twice is refused.
static const char *parse_batch_sizes(const char *s, struct run_opts *o) {
    long long v[MAX_BATCH_SIZES];
    int n = 0;
    const int rc = ds_cli_parse_list(s, 1, UINT16_MAX, v, MAX_BATCH_SIZES, &n);
    if (rc == -2) return "--batch-sizes takes at most 64 sizes";
    if (rc) return "--batch-sizes wants a comma-separated list of sizes 1..65535";
    o->n_batch = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (v[j] == v[i]) return "--batch-sizes lists a size twice (a run's rows are keyed by B)";
        o->batch_sizes[o->n_batch++] = (uint32_t)v[i];
    }
    return NULL;
}

// NULL when s is a valid --pad-to-graph-sizes list (into cfg), else what is wrong with it.
static const char *parse_pad_sizes(const char *s, struct ds_spec_config *cfg) {
    long long v[DS_SPEC_MAX_PAD_SIZES];
    int n = 0;
    const int rc = ds_cli_parse_list(s, 1, UINT16_MAX, v, DS_SPEC_MAX_PAD_SIZES, &n);
    if (rc == -2) return "--pad-to-graph-sizes takes at most 64 sizes";
    if (rc) return "--pad-to-graph-sizes wants a comma-separated list of row counts 1..65535";
    for (int i = 1; i < n; i++)
        if (v[i] <= v[i - 1]) return "--pad-to-graph-sizes wants its sizes in ascending order";
    cfg->n_pad_sizes = n;
    for (int i = 0; i < n; i++)
        cfg->pad_sizes[i] = (int32_t)v[i];
    return NULL;
}

// The command line, shell-quoted ('...' around words with other than safe characters).
static char *quote_command(int argc, char **argv) {
    size_t cap = 32;
    for (int i = 0; i < argc; i++)
        cap += 4 * strlen(argv[i]) + 3;
    char *s = malloc(cap), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "draftscope");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool safe = *a != 0;
        for (const char *c = a; *c; c++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,:+@",
                        *c))
                safe = false;
        *p++ = ' ';
        if (safe) {
            p += sprintf(p, "%s", a);
            continue;
        }
        *p++ = '\'';
        for (const char *c = a; *c; c++) {
            if (*c == '\'') p += sprintf(p, "'\\''");
            else *p++ = *c;
        }
        *p++ = '\'';
        *p = 0;
    }
    return s;
}

// Checks the output path before anything slow happens: a regular file or nothing, in a writable
// directory; exists only with --overwrite or --resume; --resume needs it; never one of the run's
// inputs (--overwrite on the dataset, or on a link to it, would have replaced it).
static enum ds_status check_out(const struct run_opts *o) {
    bool exists;
    // With --synthetic-weights the model input is its config (a file or directory), if any.
    const bool preset = o->synthetic && ds_synthetic_is_preset(&o->synth);
    enum ds_status st = ds_cli_check_output(
        o->out, "--out", o->dataset, o->tokenizer,
        o->synthetic ? (preset ? NULL : o->synth.source) : o->target,
        o->synthetic ? NULL : o->draft, o->resume, &exists);
    if (st) return st;
    if (o->resume && !exists)
        return ds_error_set(DS_ERR_IO, "%s: no such run file to resume", o->out);
    if (exists && !o->resume && !o->overwrite)
        return ds_error_set(DS_ERR_IO,
                            "%s: file exists; use --resume to continue it or --overwrite to "
                            "replace it",
                            o->out);
    return DS_OK;
}

struct run_state {
    ds_tokenizer_t *tok;
    ds_harmony_t *h;
    ds_dataset_t *ds;
    struct ds_replay_work work;
    struct ds_backend *be;
    ds_gptoss_t *target;
    ds_eagle3_t *draft;
    ds_spec_t *spec;
    ds_recorder_t *rec;
    ds_trace_t *trace;
    char *cmdline, *options;
};

static void free_state(struct run_state *g) {
    ds_spec_release(g->spec);
    ds_eagle3_release(g->draft);
    ds_gptoss_release(g->target);
    ds_backend_release(g->be);
    ds_trace_release(g->trace); // after the backend: CUPTI flushes its last buffers on release
    ds_replay_work_free(&g->work);
    ds_dataset_release(g->ds);
    ds_harmony_release(g->h);
    ds_tokenizer_release(g->tok);
    free(g->cmdline);
    free(g->options);
}

static bool file_exists(const char *dir, const char *name, char *buf, size_t cap) {
    struct stat sb;
    snprintf(buf, cap, "%s/%s", dir, name);
    return stat(buf, &sb) == 0 && S_ISREG(sb.st_mode);
}

// The tokenizer file's digest (a directory's tokenizer.json, as ds_tokenizer_load reads it).
static enum ds_status tokenizer_hash(const char *path, char hex[DS_SHA256_HEX_BYTES]) {
    struct stat sb;
    char buf[PATH_MAX];
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (snprintf(buf, sizeof buf, "%s/tokenizer.json", path) >= (int)sizeof buf)
            return ds_error_set(DS_ERR_ARG, "%s: path too long", path);
        path = buf;
    }
    return ds_sha256_file(path, hex);
}

static enum ds_status config_hash(const char *dir, char hex[DS_SHA256_HEX_BYTES]) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return ds_sha256_file(path, hex);
}

// The identity of a synthetic model in the run file, in place of a checkpoint's path and config
// hash: id_out = "synthetic:SOURCE:SEED:LAYERS" (the target) or "synthetic-draft:..." (its draft;
// the draft config and d2t follow from the target's config), and hex_out = the SHA-256 of that
// text, followed by the config file's own digest when SOURCE is a file or directory, so that
// --resume refuses another preset, seed, slice or an edited config.
static enum ds_status synthetic_identity(const struct ds_synthetic_spec *spec, int layers,
                                         bool draft, char *id_out, size_t cap,
                                         char hex_out[DS_SHA256_HEX_BYTES]) {
    snprintf(id_out, cap, "%s:%s:%llu:%d", draft ? "synthetic-draft" : "synthetic", spec->source,
             (unsigned long long)spec->seed, layers);
    struct ds_sha256 h;
    ds_sha256_init(&h);
    ds_sha256_update(&h, id_out, strlen(id_out));
    if (!ds_synthetic_is_preset(spec)) {
        char path[PATH_MAX], file_hex[DS_SHA256_HEX_BYTES];
        struct stat sb;
        const bool dir = stat(spec->source, &sb) == 0 && S_ISDIR(sb.st_mode);
        snprintf(path, sizeof path, "%s%s", spec->source, dir ? "/config.json" : "");
        enum ds_status s = ds_sha256_file(path, file_hex);
        if (s != DS_OK) return s;
        ds_sha256_update(&h, "\n", 1);
        ds_sha256_update(&h, file_hex, strlen(file_hex));
    }
    ds_sha256_final_hex(&h, hex_out);
    return DS_OK;
}

static int run(struct run_state *g, const struct run_opts *o, int argc, char **argv) {
    enum ds_status s;
    if ((s = check_out(o))) return fail(ds_error_last());

    // The device first: synthetic weights are generated on it, so a run of them without a GPU
    // stops here, before the tokenizer and the dataset are read.
    struct ds_device_info info;
    if ((s = ds_device_resolve(o->device, &info))) return fail(ds_error_last());
    if (o->synthetic && (s = ds_cli_synthetic_device(o->synthetic, o->device, &info)))
        return fail(ds_error_last());
    // Checked here, not at model create: auto may have resolved to the cpu, and the message
    // should name the flag rather than the op that lacks bf16.
    if (o->batch_variant && info.kind != DS_DEVICE_CUDA) {
        ds_error_set(DS_ERR_UNSUPPORTED, "--numerics batch-variant needs the cuda device "
                     "(running on %s, whose reference ops have one order)", info.name);
        return fail(ds_error_last());
    }
    if (o->act == DS_ACT_BF16 && info.kind != DS_DEVICE_CUDA) {
        ds_error_set(DS_ERR_UNSUPPORTED, "--activations bf16 needs the cuda device (running on "
                     "%s, whose reference ops are f32 only)", info.name);
        return fail(ds_error_last());
    }

    // Inputs: configs, tokenizer, dataset (all before any model memory).
    struct ds_target_config tc;
    struct ds_aux_plan aux;
    if (o->synthetic) {
        if ((s = ds_synthetic_target_config(&o->synth, &tc)) ||
            (s = ds_synthetic_aux_plan(&tc, &aux)))
            return fail(ds_error_last());
        fprintf(stderr,
                "draftscope run: synthetic weights (%s, seed %llu, %lld layers): the draft does "
                "not predict the target, so acceptance will be near zero; this run measures "
                "step times, tracing overhead and the baseline\n",
                o->synth.source, (unsigned long long)o->synth.seed,
                (long long)tc.num_hidden_layers);
    } else {
        // Both checkpoints as their loaders would refuse them (configs, tensor tables, the pair),
        // from the headers alone: a bad one stops here, before the tokenizer, the dataset, the
        // backend and the target's weights, and long before the file exists.
        struct ds_draft_config dc;
        if ((s = ds_gptoss_check_dir(o->target, &tc)) ||
            (s = ds_eagle3_check_dir(o->draft, &tc, &dc)) ||
            (s = ds_eagle3_aux_plan(o->draft, &tc, o->aux_set ? &o->aux_conv : NULL, &aux)))
            return fail(ds_error_last());
    }
    char path[PATH_MAX];
    const char *tok_path = o->tokenizer;
    if (!tok_path && o->target && file_exists(o->target, "tokenizer.json", path, sizeof path))
        tok_path = path;
    if (!tok_path) {
        ds_error_set(DS_ERR_ARG, "%s: no tokenizer.json; give --tokenizer FILE", o->target);
        return fail(ds_error_last());
    }
    if ((s = ds_tokenizer_load(tok_path, &g->tok)) || (s = ds_harmony_create(g->tok, &g->h)))
        return fail(ds_error_last());
    if (ds_tokenizer_vocab_size(g->tok) > tc.vocab_size) {
        ds_error_set(DS_ERR_MISMATCH, "%s: tokenizer has %d ids, the target's vocabulary %lld",
                     tok_path, ds_tokenizer_vocab_size(g->tok), (long long)tc.vocab_size);
        return fail(ds_error_last());
    }
    struct ds_dataset_options dopt;
    ds_dataset_options_default(&dopt);
    dopt.order = o->shuffle ? DS_ORDER_SHUFFLE : DS_ORDER_FILE;
    dopt.seed = o->spec.seed;
    dopt.num_conversations = (size_t)o->num_conv;
    dopt.turns = o->turns;
    dopt.on_bad = o->on_bad;
    if ((s = ds_dataset_open(o->dataset, &dopt, &g->ds))) return fail(ds_error_last());
    // Skipped records are said, even with --quiet: they are input the run leaves out.
    char note[512];
    const size_t skipped = ds_dataset_skip_note(g->ds, note, sizeof note);
    if (ds_dataset_num_requests(g->ds) == 0) {
        ds_error_set(DS_ERR_FORMAT, "%s: no usable conversation%s%s", o->dataset,
                     skipped ? "; " : "", note);
        return fail(ds_error_last());
    }
    if (skipped) fprintf(stderr, "draftscope run: %s: %s\n", o->dataset, note);
    const size_t n_conv = ds_dataset_num_conversations(g->ds);
    if (o->num_conv > 0 && n_conv < (size_t)o->num_conv)
        fprintf(stderr, "draftscope run: %s: --num-conversations %lld, the file has %zu usable; "
                        "replaying those\n", o->dataset, o->num_conv, n_conv);
    struct ds_harmony_system sys;
    ds_harmony_system_default(&sys);
    sys.reasoning = o->reasoning;
    const int reply_est = (int)o->max_new + REPLY_ESTIMATE_EXTRA;
    if ((s = ds_replay_prepare(g->ds, g->h, &sys, reply_est, &g->work)))
        return fail(ds_error_last());

    // Context: the planned positions per slot (also the limit prompts are checked against).
    long long limit = tc.max_position_embeddings;
    if (o->max_context > 0 && o->max_context < limit) limit = o->max_context;
    if (o->max_context > limit) // beyond the model's own limit: capped there, and said
        fprintf(stderr, "draftscope run: --max-context %lld is beyond the target's %lld "
                        "positions; using %lld\n", o->max_context, limit, limit);
    long long P = o->max_context > 0 ? limit
                                     : (long long)g->work.max_est_len + o->max_new + o->spec.k + 2;
    if (P > limit) P = limit;
    if (P < 2) P = 2;
    uint32_t max_b = 0;
    for (size_t i = 0; i < o->n_batch; i++)
        if (o->batch_sizes[i] > max_b) max_b = o->batch_sizes[i];
    // What the step engine would refuse of this plan, said before any weight is loaded.
    if ((s = ds_spec_plan_check(&o->spec, (int)max_b, &tc))) return fail(ds_error_last());

    // Models and the step engine, planned once for the largest batch size.
    // The trace before the backend: CUPTI must be enabled before any CUDA module loads.
    enum ds_rec_trace_level level = info.kind == DS_DEVICE_CUDA ? o->trace : DS_REC_TRACE_OFF;
    if (o->trace != DS_REC_TRACE_OFF && info.kind != DS_DEVICE_CUDA)
        fprintf(stderr, "draftscope run: no GPU: tracing is off (--trace %s needs the cuda "
                        "device; running on %s)\n", ds_trace_level_name(o->trace), info.name);
    s = ds_trace_create(level, NULL, NULL, &g->trace);
    if (s == DS_ERR_NODEVICE) {
        fprintf(stderr, "draftscope run: %s\n", ds_error_last());
        level = DS_REC_TRACE_OFF;
        s = ds_trace_create(level, NULL, NULL, &g->trace);
    }
    if (s) return fail(ds_error_last());
    s = info.kind == DS_DEVICE_CUDA ? ds_backend_cuda_create(info.cuda_device, &g->be)
                                    : ds_backend_ref_create(&g->be);
    if (!s && o->batch_variant) s = ds_backend_cuda_set_numerics(g->be, DS_NUMERICS_BATCH_VARIANT);
    if (s) return fail(ds_error_last());
    struct ds_gptoss_plan tp = {0};
    struct ds_eagle3_plan dp = {0};
    ds_spec_plan(&o->spec, (int)max_b, (int)P, &tp, &dp);
    ds_gptoss_plan_aux(&tp, &aux);
    tp.act = o->act; // the draft follows the target's activation dtype

    // Both models' memory plans, measured (the creates' own checks and sizes) before either
    // loads: a plan the device cannot hold is refused now, not after the target's upload.
    struct ds_gptoss_memory tm, dm;
    s = o->synthetic ? ds_synthetic_target_measure(&o->synth, g->be, &tp, &tm)
                     : ds_gptoss_measure(o->target, g->be, &tp, &tm);
    if (!s)
        s = o->synthetic ? ds_synthetic_draft_measure(&o->synth, &tc, &tp, g->be, &dp, &dm)
                         : ds_eagle3_measure(o->draft, &tc, &tp, g->be, &dp, &dm);
    if (s) return fail(ds_error_last());
    FILE *info_f = o->json ? stderr : stdout;
    if (!o->quiet) {
        fprintf(info_f,
                "draftscope run on %s: %zu requests x %zu batch sizes (max B %u), K %d, rule %s, "
                "context %lld positions\n",
                info.name, g->work.n, o->n_batch, max_b, o->spec.k,
                ds_spec_rule_name(o->spec.rule), P);
        fprintf(info_f,
                "memory: target weights %.3f GB, KV %.3f GB, activations %.3f GB; draft weights "
                "%.3f GB, KV %.3f GB, activations %.3f GB\n",
                (double)tm.weights / 1e9, (double)tm.kv / 1e9, (double)tm.activations / 1e9,
                (double)dm.weights / 1e9, (double)dm.kv / 1e9, (double)dm.activations / 1e9);
        fflush(info_f);
    }
    size_t free_b = 0, total_b = 0;
    if (info.kind == DS_DEVICE_CUDA) {
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
            cudaGetLastError(); // no figure: the creates' allocations are the check
        else if ((s = ds_cli_plan_fits(info.name, &tm, &dm, free_b)))
            return fail(ds_error_last());
    }
    // One progress line per model on stderr; its last state is the load rate (kept in a log).
    const char *what = o->synthetic ? "making synthetic" : "loading";
    char tlabel[48], dlabel[48];
    snprintf(tlabel, sizeof tlabel, "%s target weights", what);
    snprintf(dlabel, sizeof dlabel, "%s draft weights", what);
    struct ds_cli_bytes_progress tbar = {.label = tlabel, .t0 = ds_cli_now_s()},
                                 dbar = {.label = dlabel};
    const struct ds_load_progress tprog = {ds_cli_bytes_progress, &tbar},
                                  dprog = {ds_cli_bytes_progress, &dbar};
    const struct ds_load_progress *tpp = o->quiet ? NULL : &tprog, *dpp = o->quiet ? NULL : &dprog;
    // Each model's create (open, check, allocate, upload or generate), timed for options_json.load.
    double load_s[2];
    s = o->synthetic ? ds_synthetic_target_create(&o->synth, g->be, &tp, tpp, &g->target)
                     : ds_gptoss_create(o->target, g->be, &tp, tpp, &g->target);
    load_s[0] = ds_cli_now_s() - tbar.t0;
    ds_cli_bytes_progress_end(&tbar);
    if (s) return fail(ds_error_last());
    dbar.t0 = ds_cli_now_s();
    s = o->synthetic
            ? ds_synthetic_draft_create(&o->synth, g->target, g->be, &dp, dpp, &g->draft)
            : ds_eagle3_create(o->draft, g->target, g->be, &dp, dpp, &g->draft);
    load_s[1] = ds_cli_now_s() - dbar.t0;
    ds_cli_bytes_progress_end(&dbar);
    if (s) return fail(ds_error_last());
    if ((s = ds_spec_create(g->target, g->draft, &o->spec, &g->spec)))
        return fail(ds_error_last());
    if (info.kind == DS_DEVICE_CUDA &&
        (s = ds_trace_set_stream(g->trace, ds_backend_cuda_stream(g->be))))
        return fail(ds_error_last());

    // Baseline and trace overhead before the replay (they double as its warm-up), so both go
    // into the file's options_json, written at creation.
    struct ds_trace_baseline base[MAX_BATCH_SIZES];
    if (o->baseline) {
        if ((s = ds_trace_baseline_run(g->target, o->batch_sizes, o->n_batch, NULL, base)))
            return fail(ds_error_last());
        if (!o->quiet)
            for (size_t i = 0; i < o->n_batch; i++)
                fprintf(o->json ? stderr : stdout,
                        "baseline: B %u, plain decode step %.3f ms (median of %u)\n",
                        base[i].batch_size, (double)base[i].median_ns / 1e6, base[i].steps);
    }
    double overhead = NAN;
    if (level != DS_REC_TRACE_OFF) {
        if ((s = ds_trace_measure_overhead(g->trace, g->target, o->batch_sizes[0], 0, 0,
                                           &overhead)) ||
            (s = ds_trace_discard(g->trace)))
            return fail(ds_error_last());
        // At level kernels "off" is CUPTI paused in this process: the cost of having attached
        // CUPTI at all is not in the figure (docs/tracing.md gives it as measured).
        fprintf(o->json ? stderr : stdout, "trace %s: overhead %+.2f%% (decode tokens/s against "
                "%s, B %u)\n", ds_trace_level_name(level), 100.0 * overhead,
                level == DS_REC_TRACE_KERNELS ? "CUPTI paused in this process" : "off",
                o->batch_sizes[0]);
    }

    // What the models placed (the same as measured: test_gptoss, test_eagle3 and gpu_models
    // check that each measure equals its create).
    ds_gptoss_memory_plan(g->target, &tm);
    ds_eagle3_memory_plan(g->draft, &dm);
    if (!o->quiet) {
        // What the plan leaves on the device (everything is allocated by now).
        fprintf(info_f, "speculation buffers: %.3f GB\n",
                (double)ds_spec_device_bytes(g->spec) / 1e9);
        if (info.kind == DS_DEVICE_CUDA && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            fprintf(info_f, "device memory: %.3f GB free of %.3f GB after the plan\n",
                    (double)free_b / 1e9, (double)total_b / 1e9);
        else if (info.kind == DS_DEVICE_CUDA)
            cudaGetLastError();
        if (info.why_cpu[0]) // --device auto found no usable GPU: say why, once
            fprintf(info_f, "device auto: the CPU reference (no usable GPU: %s)\n", info.why_cpu);
        fflush(info_f);
    }

    // Run metadata and the file.
    char t_hash[DS_SHA256_HEX_BYTES], d_hash[DS_SHA256_HEX_BYTES], ds_hash[DS_SHA256_HEX_BYTES];
    char t_id[sizeof o->synth.source + 64], d_id[sizeof o->synth.source + 64];
    const int n_layers = (int)tc.num_hidden_layers;
    if (o->synthetic)
        s = synthetic_identity(&o->synth, n_layers, false, t_id, sizeof t_id, t_hash);
    else
        s = config_hash(o->target, t_hash);
    if (!s)
        s = o->synthetic ? synthetic_identity(&o->synth, n_layers, true, d_id, sizeof d_id, d_hash)
                         : config_hash(o->draft, d_hash);
    char tok_hash[DS_SHA256_HEX_BYTES];
    if (s || (s = ds_sha256_file(o->dataset, ds_hash)) || (s = tokenizer_hash(tok_path, tok_hash)))
        return fail(ds_error_last());
    g->cmdline = quote_command(argc, argv);
    json_t *opt = json_object();
    json_object_set_new(opt, "max_new_tokens", json_integer(o->max_new));
    json_object_set_new(opt, "num_conversations", json_integer(o->num_conv));
    json_object_set_new(opt, "shuffle", json_boolean(o->shuffle));
    json_object_set_new(opt, "turns", json_string(o->turns == DS_TURNS_ALL ? "all" : "first"));
    json_object_set_new(opt, "reasoning_effort", json_string(ds_reasoning_name(o->reasoning)));
    json_object_set_new(opt, "max_context", json_integer(P));
    json_object_set_new(opt, "prefill_chunk", json_integer(o->spec.prefill_chunk));
    json_object_set_new(opt, "tokenizer", ds_cli_json_text(tok_path));
    json_object_set_new(opt, "tokenizer_sha256", json_string(tok_hash));
    { // The target boundaries the draft read, and under which convention (given or implied).
        json_t *ab = json_array();
        for (int i = 0; i < aux.n; i++)
            json_array_append_new(ab, json_integer(aux.boundaries[i]));
        json_object_set_new(opt, "aux_boundaries", ab);
        json_object_set_new(opt, "aux_convention",
                            json_string(ds_aux_convention_name(aux.convention)));
    }
    // The limit given on the command line, 0 for none (the default follows the conversations
    // selected, which --resume may extend, so max_context itself is not compared).
    json_object_set_new(opt, "max_context_given",
                        json_integer(o->max_context > 0 ? o->max_context : 0));
    json_object_set_new(opt, "device", json_string(info.name));
    // The dtype actually used (auto resolved), so cpu/cuda files can be told apart.
    json_object_set_new(opt, "activations",
                        json_string(ds_gptoss_act(g->target) == DS_ELEM_F32 ? "f32" : "bf16"));
    json_object_set_new(opt, "trace", json_string(ds_trace_level_name(level)));
    json_object_set_new(opt, "numerics",
                        json_string(o->batch_variant ? "batch-variant" : "invariant"));
    { // the verify's padding sizes ([] without padding)
        json_t *ps = json_array();
        for (int i = 0; i < o->spec.n_pad_sizes; i++)
            json_array_append_new(ps, json_integer(o->spec.pad_sizes[i]));
        json_object_set_new(opt, "pad_to_graph_sizes", ps);
    }
    if (!isnan(overhead)) json_object_set_new(opt, "trace_overhead", json_real(overhead));
    { // What the run read of its dataset and what it left out (the stderr line, kept).
        const struct ds_dataset_stats *dst = ds_dataset_stats(g->ds);
        json_t *dj = json_object();
        json_object_set_new(dj, "format", json_string(ds_dataset_format_name(dst->format)));
        json_object_set_new(dj, "records_read", json_integer((json_int_t)dst->examined));
        json_object_set_new(dj, "conversations", json_integer((json_int_t)dst->selected));
        json_object_set_new(dj, "requests", json_integer((json_int_t)dst->requests));
        json_object_set_new(dj, "skipped_empty", json_integer((json_int_t)dst->skipped_empty));
        json_object_set_new(dj, "skipped_malformed",
                            json_integer((json_int_t)dst->skipped_malformed));
        if (dst->first_skip[0])
            json_object_set_new(dj, "first_skip", ds_cli_json_text(dst->first_skip));
        json_object_set_new(opt, "dataset", dj);
    }
    if (o->synthetic) { // the weights' provenance (the attributes hold no checkpoint paths)
        json_t *sw = json_object();
        json_object_set_new(sw, "source", ds_cli_json_text(o->synth.source));
        json_object_set_new(sw, "seed", json_integer((json_int_t)o->synth.seed));
        json_object_set_new(sw, "layers", json_integer(n_layers));
        json_object_set_new(opt, "synthetic_weights", sw);
    }
    { // What loading took (the progress lines' last state, kept): bytes placed and seconds.
        json_t *lj = json_object();
        const size_t bytes[2] = {tm.weights, dm.weights};
        for (int i = 0; i < 2; i++) {
            json_t *e = json_object();
            json_object_set_new(e, "bytes", json_integer((json_int_t)bytes[i]));
            json_object_set_new(e, "seconds", json_real(load_s[i]));
            // The CPU reference maps a checkpoint in place: no copy, so no rate to speak of.
            json_object_set_new(e, "uploaded",
                                json_boolean(o->synthetic || info.kind == DS_DEVICE_CUDA));
            json_object_set_new(lj, i ? "draft" : "target", e);
        }
        json_object_set_new(opt, "load", lj);
    }
    if (o->baseline) {
        json_t *arr = json_array();
        for (size_t i = 0; i < o->n_batch; i++) {
            json_t *b = json_object();
            json_object_set_new(b, "batch_size", json_integer(base[i].batch_size));
            json_object_set_new(b, "steps", json_integer(base[i].steps));
            json_object_set_new(b, "median_ns", json_integer((json_int_t)base[i].median_ns));
            json_object_set_new(b, "mean_ns", json_integer((json_int_t)base[i].mean_ns));
            json_object_set_new(b, "min_ns", json_integer((json_int_t)base[i].min_ns));
            json_array_append_new(arr, b);
        }
        json_object_set_new(opt, "baseline", arr);
    }
    g->options = json_dumps(opt, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(opt);
    if (!g->cmdline || !g->options) return fail("out of memory");
    char drv[32] = "", rt[32] = "";
    if (info.driver_version)
        snprintf(drv, sizeof drv, "%d.%d", info.driver_version / 1000,
                 info.driver_version % 1000 / 10);
    if (info.runtime_version)
        snprintf(rt, sizeof rt, "%d.%d", info.runtime_version / 1000,
                 info.runtime_version % 1000 / 10);
    // What a resumed session must share with the file beyond the attributes: the options that
    // shape a request's records (its prompt, its length, the numerics). --num-conversations may
    // grow (the first N of the same order), --batch-sizes may add sizes, tracing may change.
    static const char *const resume_options[] = {
        "max_new_tokens", "turns",           "reasoning_effort", "shuffle",
        "activations",    "tokenizer_sha256", "max_context_given", "aux_boundaries",
        "numerics",       "pad_to_graph_sizes", NULL};
    struct ds_run_meta meta = {
        .resume_options = resume_options,
        // what files written before these options imply
        .resume_defaults = "{\"numerics\":\"invariant\",\"pad_to_graph_sizes\":[]}",
        .command_line = g->cmdline,
        .gpu_name = info.name,
        .driver_version = drv,
        .cuda_version = rt,
        .target_path = o->synthetic ? t_id : o->target,
        .target_config_sha256 = t_hash,
        .draft_path = o->synthetic ? d_id : o->draft,
        .draft_config_sha256 = d_hash,
        .dataset_path = o->dataset,
        .dataset_sha256 = ds_hash,
        .rule = ds_spec_rule_name(o->spec.rule),
        .options_json = g->options,
        .seed = o->spec.seed,
        .k = (uint32_t)o->spec.k,
        .temperature = o->spec.temperature,
        .top_p = o->spec.top_p,
        .batch_sizes = o->batch_sizes,
        .n_batch_sizes = o->n_batch,
        .trace_level = level,
    };
    // Signals before the file exists: SIGXFSZ must already be ignored when a file-size limit
    // hits the first write, and SIGINT must never kill the writer mid-flush.
    if ((s = ds_recorder_catch_signals())) return fail(ds_error_last());
    struct ds_resume_info ri;
    if (o->resume) s = ds_recorder_open_resume(o->out, &meta, &ri, &g->rec);
    else s = ds_recorder_create(o->out, &meta, o->overwrite ? DS_RECORDER_OVERWRITE : 0, &g->rec);
    if (s) return fail(ds_error_last());
    // The trace writes its rows into the file from here on (its clock becomes the session's).
    if ((s = ds_trace_set_recorder(g->trace, g->rec)) || (s = ds_trace_discard(g->trace)))
        return fail(ds_error_last());
    // The session's counts start here: records dropped while the baseline or the overhead was
    // measured are not this session's (sessions.trace_dropped).
    struct ds_trace_stats ts0;
    ds_trace_stats(g->trace, &ts0);
    if (o->resume && !o->quiet)
        fprintf(info_f, "resuming %s: session %u, %zu requests already recorded\n", o->out,
                ri.session, ri.n_done);

    // The replay.
    struct ds_progress prog;
    ds_progress_init(&prog, stderr, o->quiet ? DS_PROGRESS_QUIET : DS_PROGRESS_AUTO, 0);
    struct ds_replay_config rc = {.batch_sizes = o->batch_sizes,
                                  .n_batch_sizes = o->n_batch,
                                  .max_new_tokens = (int)o->max_new,
                                  .sys = &sys,
                                  .log = o->quiet ? NULL : stderr,
                                  .progress = &prog,
                                  .trace = level != DS_REC_TRACE_OFF ? g->trace : NULL};
    struct ds_replay_stats st;
    s = ds_replay_run(g->spec, g->h, g->tok, g->ds, &g->work, &rc, g->rec, o->resume ? &ri : NULL,
                      &st);
    char err[1024] = "";
    uint64_t dropped = 0; // CUPTI records lost, stored in sessions.trace_dropped
    if (s != DS_OK && s != DS_ERR_INTERRUPTED) snprintf(err, sizeof err, "%s", ds_error_last());
    // The last ranges and kernels (a request's final prefill may follow the last step).
    if (level != DS_REC_TRACE_OFF && (s == DS_OK || s == DS_ERR_INTERRUPTED)) {
        const struct ds_trace_step_times *tt;
        size_t nt;
        enum ds_status ts = ds_trace_collect(g->trace, &tt, &nt);
        if (ts != DS_OK) {
            s = ts;
            snprintf(err, sizeof err, "%s", ds_error_last());
        }
        struct ds_trace_stats ts_st;
        ds_trace_stats(g->trace, &ts_st);
        ds_trace_stats_since(&ts_st, &ts0);
        dropped = ts_st.dropped_records;
        if (!o->quiet || ts_st.dropped_records || ts_st.dropped_ranges ||
            ts_st.dropped_correlations)
            fprintf(info_f, "trace %s: %llu ranges, %llu kernels, %llu CUPTI records dropped, "
                            "%llu ranges dropped, %llu kernels unattributed (%llu of them for a "
                            "full correlation table); recorder thread %.1f ms in trace calls "
                            "(%llu forced flushes, %.1f ms), worker parse %.1f ms\n",
                    ds_trace_level_name(level), (unsigned long long)ts_st.ranges,
                    (unsigned long long)ts_st.kernels, (unsigned long long)ts_st.dropped_records,
                    (unsigned long long)ts_st.dropped_ranges,
                    (unsigned long long)ts_st.unattributed,
                    (unsigned long long)ts_st.dropped_correlations, ts_st.calls_ns / 1e6,
                    (unsigned long long)ts_st.flushes, ts_st.flush_ns / 1e6,
                    ts_st.parse_ns / 1e6);
    }
    {
        // A run stopped by an error is "failed" whatever the error (it was recorded "closed"
        // unless a write had failed); the trace figures measured are kept either way.
        struct ds_run_end end = {.status = s == DS_OK                ? DS_REC_SESSION_CLOSED
                                           : s == DS_ERR_INTERRUPTED ? DS_REC_SESSION_INTERRUPTED
                                                                     : DS_REC_SESSION_FAILED,
                                 .trace_overhead = overhead,
                                 .trace_dropped = dropped};
        ds_recorder_set_end(g->rec, &end);
    }
    enum ds_status cs = ds_recorder_close(g->rec);
    g->rec = NULL;
    // An interrupt whose last flush failed (a full disk) is that failure, not a clean close.
    if (s == DS_ERR_INTERRUPTED && cs != DS_OK) return fail(ds_error_last());
    if (s == DS_ERR_INTERRUPTED) {
        fprintf(stderr,
                "draftscope run: interrupted; %s is closed with %llu requests recorded in this "
                "session. Continue with the same command and --resume\n",
                o->out, (unsigned long long)st.requests);
        return 130;
    }
    if (s != DS_OK) return fail(err);
    if (cs != DS_OK) return fail(ds_error_last());
    if (st.skipped) // said even with --quiet: those conversations are not in the file
        fprintf(o->quiet ? stderr : info_f,
                "%llu requests skipped (prompt beyond the context limit of %lld)\n",
                (unsigned long long)st.skipped, P);
    if (st.nonfinite_q) // said even with --quiet: a draft checkpoint's numbers are broken
        fprintf(o->quiet ? stderr : info_f,
                "%llu drafted tokens had no finite draft probability: the draft's logits held "
                "NaN or Inf (q_draft NaN in the file; the summary counts them; draftscope "
                "inspect --scan-values checks the weights)\n",
                (unsigned long long)st.nonfinite_q);
    if (st.errors) // said even with --quiet: the file holds them, but with no metrics
        fprintf(o->quiet ? stderr : info_f,
                "%llu requests ended with error: non-finite target logits (NaN or Inf; the "
                "summary counts them)\n",
                (unsigned long long)st.errors);
    if (st.errors && st.errors == st.requests && (!o->resume || ri.n_done == 0)) {
        fprintf(stderr,
                "draftscope run: %s: every request (%llu) ended with non-finite target logits "
                "(NaN or Inf): no acceptance to measure; check the target's weights "
                "(draftscope inspect --scan-values)\n",
                o->out, (unsigned long long)st.errors);
        return 1;
    }
    if (st.skipped && st.requests == 0 && (!o->resume || ri.n_done == 0)) {
        fprintf(stderr,
                "draftscope run: %s: no request recorded: every prompt is beyond the context "
                "limit of %lld positions (--max-context, or shorter conversations)\n",
                o->out, P);
        return 1;
    }

    // The summary of the file just written.
    struct ds_summary *sum = NULL;
    if ((s = ds_summary_compute(o->out, DS_SUMMARY_BY_BATCH, &sum))) return fail(ds_error_last());
    s = o->json ? ds_summary_print_json(sum, stdout) : ds_summary_print_text(sum, stdout);
    ds_summary_free(sum);
    if (s) return fail(ds_error_last());
    return 0;
}

int ds_cmd_run(int argc, char **argv) {
    ds_recorder_library_init(); // before any HDF5 call (ds/record.h says why)
    enum {
        O_TOKENIZER = 256,
        O_TEMP,
        O_TOPP,
        O_SEED,
        O_SHUFFLE,
        O_TURNS,
        O_ON_BAD,
        O_REASON,
        O_MAXCTX,
        O_CHUNK,
        O_OVERWRITE,
        O_RESUME,
        O_DEVICE,
        O_ACT,
        O_TRACE,
        O_BASELINE,
        O_SYNTH,
        O_AUXCONV,
        O_NUMERICS,
        O_PAD
    };
    static const struct option long_opts[] = {
        {"target", required_argument, NULL, 't'},
        {"draft", required_argument, NULL, 'd'},
        {"synthetic-weights", required_argument, NULL, O_SYNTH},
        {"aux-convention", required_argument, NULL, O_AUXCONV},
        {"dataset", required_argument, NULL, 'D'},
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"out", required_argument, NULL, 'o'},
        {"batch-sizes", required_argument, NULL, 'b'},
        {"draft-tokens", required_argument, NULL, 'k'},
        {"rule", required_argument, NULL, 'r'},
        {"temperature", required_argument, NULL, O_TEMP},
        {"top-p", required_argument, NULL, O_TOPP},
        {"seed", required_argument, NULL, O_SEED},
        {"max-new-tokens", required_argument, NULL, 'n'},
        {"num-conversations", required_argument, NULL, 'N'},
        {"shuffle", no_argument, NULL, O_SHUFFLE},
        {"turns", required_argument, NULL, O_TURNS},
        {"on-bad", required_argument, NULL, O_ON_BAD},
        {"reasoning-effort", required_argument, NULL, O_REASON},
        {"max-context", required_argument, NULL, O_MAXCTX},
        {"prefill-chunk", required_argument, NULL, O_CHUNK},
        {"overwrite", no_argument, NULL, O_OVERWRITE},
        {"resume", no_argument, NULL, O_RESUME},
        {"device", required_argument, NULL, O_DEVICE},
        {"activations", required_argument, NULL, O_ACT},
        {"numerics", required_argument, NULL, O_NUMERICS},
        {"pad-to-graph-sizes", required_argument, NULL, O_PAD},
        {"trace", required_argument, NULL, O_TRACE},
        {"baseline", no_argument, NULL, O_BASELINE},
        {"quiet", no_argument, NULL, 'q'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct run_opts o = {.n_batch = 1,
                         .batch_sizes = {1},
                         .spec = {.rule = DS_SPEC_GREEDY,
                                  .k = 3,
                                  .temperature = 1.0f,
                                  .top_p = 1.0f,
                                  .seed = 0,
                                  .prefill_chunk = 512},
                         .max_new = 256,
                         .turns = DS_TURNS_FIRST,
                         .on_bad = DS_DATASET_SKIP_BAD,
                         .reasoning = DS_REASONING_MEDIUM,
                         .device = DS_DEVICE_AUTO};
    long long ll;
    char msg[96]; // an integer option's usage error (ds_cli_int_opt)
    char *end;
    double dv;
    optind = 0; // full re-initialisation: the command may run more than once in one process
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "t:d:D:o:b:k:r:n:N:qjh", long_opts, NULL)) != -1;) {
        switch (c) {
        case 't': o.target = optarg; break;
        case 'd': o.draft = optarg; break;
        case O_SYNTH: o.synthetic = optarg; break;
        case 'D': o.dataset = optarg; break;
        case O_TOKENIZER: o.tokenizer = optarg; break;
        case 'o': o.out = optarg; break;
        case 'b': {
            const char *why = parse_batch_sizes(optarg, &o);
            if (why) return usage_error(why, optarg);
            break;
        }
        case 'k':
            if (!ds_cli_int_opt("--draft-tokens", optarg, 1, DS_SPEC_MAX_K, &ll, msg, sizeof msg))
                return usage_error(msg, optarg);
            o.spec.k = (int)ll;
            break;
        case 'r':
            if (ds_spec_rule_parse(optarg, &o.spec.rule))
                return usage_error("--rule wants greedy, target-only or rejection", optarg);
            break;
        case O_TEMP:
            dv = strtod(optarg, &end);
            if (end == optarg || *end ||
                !((float)dv >= DS_SPEC_TEMPERATURE_MIN && (float)dv <= DS_SPEC_TEMPERATURE_MAX))
                return usage_error("--temperature wants a number in 1e-06..1e+06", optarg);
            o.spec.temperature = (float)dv;
            break;
        case O_TOPP:
            dv = strtod(optarg, &end);
            // Checked as the float it is stored as: 1e-50 is 0 there.
            if (end == optarg || *end || !((float)dv > 0 && dv <= 1))
                return usage_error("--top-p wants a number in (0, 1]", optarg);
            o.spec.top_p = (float)dv;
            break;
        case O_SEED:
            // Seeds stop at 2^63 - 1: JSON (options_json, summary --json) has signed integers.
            if (!ds_cli_int_opt("--seed", optarg, 0, INT64_MAX, &ll, msg, sizeof msg))
                return usage_error(msg, optarg);
            o.spec.seed = (uint64_t)ll;
            break;
        case 'n':
            if (!ds_cli_int_opt("--max-new-tokens", optarg, 1, INT32_MAX / 2, &o.max_new, msg,
                                sizeof msg))
                return usage_error(msg, optarg);
            break;
        case 'N':
            if (!ds_cli_int_opt("--num-conversations", optarg, 1, INT32_MAX, &o.num_conv, msg,
                                sizeof msg))
                return usage_error(msg, optarg);
            break;
        case O_SHUFFLE: o.shuffle = true; break;
        case O_TURNS:
            if (!strcmp(optarg, "first")) o.turns = DS_TURNS_FIRST;
            else if (!strcmp(optarg, "all")) o.turns = DS_TURNS_ALL;
            else return usage_error("--turns wants first or all", optarg);
            break;
        case O_ON_BAD:
            if (!strcmp(optarg, "skip")) o.on_bad = DS_DATASET_SKIP_BAD;
            else if (!strcmp(optarg, "fail")) o.on_bad = DS_DATASET_FAIL_ON_BAD;
            else return usage_error("--on-bad wants skip or fail", optarg);
            break;
        case O_REASON:
            if (ds_reasoning_parse(optarg, &o.reasoning))
                return usage_error("--reasoning-effort wants low, medium or high", optarg);
            break;
        case O_MAXCTX:
            if (!ds_cli_int_opt("--max-context", optarg, 2, INT32_MAX, &o.max_context, msg,
                                sizeof msg))
                return usage_error(msg, optarg);
            break;
        case O_CHUNK:
            if (!ds_cli_int_opt("--prefill-chunk", optarg, 1, 1 << 20, &ll, msg, sizeof msg))
                return usage_error(msg, optarg);
            o.spec.prefill_chunk = (int)ll;
            break;
        case O_OVERWRITE: o.overwrite = true; break;
        case O_RESUME: o.resume = true; break;
        case O_DEVICE:
            if (ds_device_parse(optarg, &o.device) != DS_OK)
                return usage_error("--device wants auto, cpu or cuda", optarg);
            break;
        case O_ACT:
            if (!strcmp(optarg, "auto")) o.act = DS_ACT_DEFAULT;
            else if (!strcmp(optarg, "f32")) o.act = DS_ACT_F32;
            else if (!strcmp(optarg, "bf16")) o.act = DS_ACT_BF16;
            else return usage_error("--activations wants auto, f32 or bf16", optarg);
            break;
        case O_PAD: {
            const char *why = parse_pad_sizes(optarg, &o.spec);
            if (why) return usage_error(why, optarg);
            break;
        }
        case O_NUMERICS:
            if (!strcmp(optarg, "invariant")) o.batch_variant = false;
            else if (!strcmp(optarg, "batch-variant")) o.batch_variant = true;
            else return usage_error("--numerics wants invariant or batch-variant", optarg);
            break;
        case O_TRACE:
            if (ds_trace_level_parse(optarg, &o.trace) != DS_OK)
                return usage_error("--trace wants off, phases or kernels", optarg);
            break;
        case O_BASELINE: o.baseline = true; break;
        case O_AUXCONV:
            if (ds_aux_convention_parse(optarg, &o.aux_conv) != DS_OK)
                return usage_error("--aux-convention wants output-of, capture-before or boundary",
                                   optarg);
            o.aux_set = true;
            break;
        case 'q': o.quiet = true; break;
        case 'j': o.json = true; break;
        case 'h': usage(stdout); return 0;
        default: return usage_error("unknown option or missing value", argv[optind - 1]);
        }
    }
    if (optind < argc) return usage_error("unexpected argument", argv[optind]);
    if (o.synthetic && (o.target || o.draft))
        return usage_error("--synthetic-weights replaces --target and --draft; give either it or "
                           "both of them", NULL);
    if (!o.synthetic && !o.target)
        return usage_error("--target DIR is required (or --synthetic-weights SPEC)", NULL);
    if (!o.synthetic && !o.draft) return usage_error("--draft DIR is required", NULL);
    if (o.synthetic && o.aux_set)
        return usage_error("--aux-convention applies to a checkpoint draft's aux ids; the "
                           "synthetic draft has none", NULL);
    if (o.synthetic && !o.tokenizer)
        return usage_error("--synthetic-weights needs --tokenizer FILE (o200k_base.tiktoken or a "
                           "gpt-oss tokenizer.json): there is no checkpoint to take it from", NULL);
    if (!o.dataset) return usage_error("--dataset FILE is required", NULL);
    if (!o.out) return usage_error("--out FILE is required", NULL);
    if (o.resume && o.overwrite) return usage_error("--resume and --overwrite exclude each other",
                                                    NULL);
    if (o.act == DS_ACT_BF16 && o.device == DS_DEVICE_CPU)
        return usage_error("--activations bf16 needs --device cuda (the cpu reference is f32 "
                           "only)", NULL);
    if (o.batch_variant && o.device == DS_DEVICE_CPU)
        return usage_error("--numerics batch-variant needs --device cuda (the cpu reference has "
                           "one order)", NULL);
    if (o.synthetic) {
        const int src = check_synthetic(&o);
        if (src) return src;
    }

    struct run_state g = {0};
    int rc = run(&g, &o, argc, argv);
    fflush(stdout);
    if (g.rec) ds_recorder_close(g.rec);
    free_state(&g);
    return rc;
}
