// draftscope generate: plain target decoding without a draft, one prompt.
//
// The prompt is a harmony-rendered user message (--prompt), raw ids (--prompt-ids), or the first
// turn of a dataset conversation rendered with harmony (--dataset F --index I). Greedy at
// temperature 0; at T > 0 the token at position p is drawn from softmax(logits / T) by inverse
// CDF with u = ds_rng_uniform(seed, 0, p, DS_RNG_LANE_SAMPLE), so a run is reproducible and does
// not depend on anything but (seed, position). Stops on <|return|>, <|call|>, <|endoftext|> (the
// config's eos ids when there is no tokenizer), after --max-new-tokens, or at the context limit.
// --logits-out writes every generated position's logits to HDF5: `logits` [n, V] f32, `ids` [n]
// i32 (the token chosen from each row), `prompt_ids` and the `stop` attribute; a stop at
// non-finite logits keeps the file, with that row last (id -1) and `nonfinite_position`.
//
// --synthetic-weights 20b|120b[:SEED[:LAYERS]] (or a config.json) runs a model of real shapes with
// weights generated on the device (ds/synthetic.h) instead of --target; without a prompt option it
// decodes from a fixed 16-token prompt. --batch B decodes B copies of the prompt in lockstep in
// one batch (KV slots for B sequences) and reports whether every copy chose the same tokens (they
// must: the numerics are batch invariant). The memory plan (weights, KV, activations, and the
// device's free memory after planning) is printed before decoding. On CUDA the decode steps run as
// CUDA graphs unless --no-graphs.
#include <errno.h>
#include <getopt.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "ds/backend.h"
#include "ds/cli.h"
#include "ds/dataset.h"
#include "ds/device.h"
#include "ds/gptoss.h"
#include "ds/harmony.h"
#include "ds/kernels_cuda.h"
#include "ds/rng.h"
#include "ds/spec.h"
#include "ds/synthetic.h"
#include "ds/tokenizer.h"
#include <cuda_runtime.h>

#define PREFILL_CHUNK 512 // rows per prefill step: bounds the activation memory

static void usage(FILE *f) {
    fprintf(f,
            "usage: draftscope generate (--target DIR | --synthetic-weights SPEC)\n"
            "                           (--prompt TEXT | --prompt-ids 1,2,3 |\n"
            "                           --dataset FILE --index I) [options]\n"
            "\n"
            "Plain decoding with the target (no draft): prints the prompt and generated ids and\n"
            "the generated text. --prompt is rendered as a harmony user message (--raw: encoded\n"
            "as it is); --dataset renders conversation I's first turn with harmony. A checkpoint\n"
            "directory without tokenizer.json needs --tokenizer FILE for text.\n"
            "\n"
            "options:\n"
            "  -t, --target DIR          the gpt-oss checkpoint\n"
            "      --synthetic-weights S 20b|120b[:SEED[:LAYERS]] or a config.json: weights of\n"
            "                            real shapes generated on the GPU (--device cpu: on\n"
            "                            the host, for small configs); text needs --tokenizer;\n"
            "                            no prompt option: a fixed 16-token prompt\n"
            "      --batch B             decode B copies of the prompt in one batch (default 1)\n"
            "      --no-graphs           launch every op eagerly (no CUDA graphs)\n"
            "  -p, --prompt TEXT         a user message\n"
            "  -i, --prompt-ids LIST     comma-separated token ids\n"
            "      --dataset FILE        ShareGPT or question JSON/JSONL\n"
            "      --index I             conversation index in the dataset (0-based)\n"
            "      --raw                 encode --prompt without the harmony chat format\n"
            "      --tokenizer FILE      tokenizer.json or o200k_base.tiktoken\n"
            "  -n, --max-new-tokens N    tokens to generate at most (default 64)\n"
            "      --temperature T       0 = greedy (default); 1e-06..1e+06 samples\n"
            "      --seed S              sampling seed (default 0)\n"
            "      --max-context N       context limit in positions (default: the config's\n"
            "                            max_position_embeddings); given, it also sizes the\n"
            "                            KV cache (else sized for prompt + max-new-tokens)\n"
            "      --logits-out FILE     write every generated position's logits (HDF5); an\n"
            "                            existing FILE only with --overwrite, never an input\n"
            "      --overwrite           replace an existing --logits-out FILE\n"
            "  -j, --json                print one JSON object\n"
            "      --device D            auto (default), cpu or cuda\n"
            "  -h, --help                this text\n"
            "\n"
            "exit status: 0 done, 1 a problem with the input (one line), 2 usage\n");
}

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "draftscope generate: %s%s%s\n", what, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "usage: draftscope generate --target DIR (--prompt TEXT | --prompt-ids LIST |"
                    " --dataset F --index I) [options]   (--help for more)\n");
    return 2;
}

struct gen_opts {
    const char *target, *prompt, *prompt_ids, *dataset, *tokenizer, *logits_out, *synthetic;
    long long batch;
    bool no_graphs;
    long long index;
    bool raw, json, overwrite;
    long long max_new, max_context;
    double temperature;
    unsigned long long seed;
    enum ds_device_kind device;
};

// ---- HDF5 output: extendible datasets appended one row at a time ----

struct logits_file {
    hid_t file, logits, ids;
    hsize_t rows;
    int vocab;
    bool created; // the file was created (truncated): a failure removes it
};

static enum ds_status lf_open(struct logits_file *lf, const char *path, int vocab,
                              const struct ds_token_vec *prompt, const char *target) {
    memset(lf, 0, sizeof *lf);
    lf->file = lf->logits = lf->ids = H5I_INVALID_HID;
    lf->vocab = vocab;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); // our one-line messages instead of HDF5's stack
    lf->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (lf->file < 0) return ds_error_set(DS_ERR_IO, "%s: cannot create the HDF5 file", path);
    lf->created = true;
    hsize_t dims[2] = {0, (hsize_t)vocab}, maxd[2] = {H5S_UNLIMITED, (hsize_t)vocab};
    hsize_t chunk[2] = {1, (hsize_t)vocab};
    hid_t sp = H5Screate_simple(2, dims, maxd), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 2, chunk);
    lf->logits = H5Dcreate2(lf->file, "logits", H5T_NATIVE_FLOAT, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Sclose(sp);
    H5Pclose(pl);
    hsize_t d1 = 0, m1 = H5S_UNLIMITED, c1 = 256;
    sp = H5Screate_simple(1, &d1, &m1);
    pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 1, &c1);
    lf->ids = H5Dcreate2(lf->file, "ids", H5T_NATIVE_INT32, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Sclose(sp);
    H5Pclose(pl);
    hsize_t np = prompt->n;
    sp = H5Screate_simple(1, &np, NULL);
    hid_t pd = H5Dcreate2(lf->file, "prompt_ids", H5T_NATIVE_INT32, sp, H5P_DEFAULT, H5P_DEFAULT,
                          H5P_DEFAULT);
    herr_t w =
        pd >= 0 ? H5Dwrite(pd, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, prompt->ids) : -1;
    if (pd >= 0) H5Dclose(pd);
    H5Sclose(sp);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, strlen(target) + 1);
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t at = H5Acreate2(lf->file, "target", st, as, H5P_DEFAULT, H5P_DEFAULT);
    if (at >= 0) H5Awrite(at, st, target), H5Aclose(at);
    H5Sclose(as);
    H5Tclose(st);
    if (lf->logits < 0 || lf->ids < 0 || w < 0)
        return ds_error_set(DS_ERR_IO, "%s: cannot create the datasets", path);
    return DS_OK;
}

static enum ds_status lf_append(struct logits_file *lf, const float *row, int32_t id,
                                const char *path) {
    hsize_t n = lf->rows + 1, dims[2] = {n, (hsize_t)lf->vocab};
    hsize_t start[2] = {lf->rows, 0}, count[2] = {1, (hsize_t)lf->vocab};
    herr_t e = H5Dset_extent(lf->logits, dims);
    hid_t fs = H5Dget_space(lf->logits), ms = H5Screate_simple(2, count, NULL);
    e |= H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
    e |= H5Dwrite(lf->logits, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, row);
    H5Sclose(fs), H5Sclose(ms);
    hsize_t one = 1;
    e |= H5Dset_extent(lf->ids, &n);
    fs = H5Dget_space(lf->ids);
    ms = H5Screate_simple(1, &one, NULL);
    e |= H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start[0], NULL, &one, NULL);
    e |= H5Dwrite(lf->ids, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, &id);
    H5Sclose(fs), H5Sclose(ms);
    if (e < 0)
        return ds_error_set(DS_ERR_IO, "%s: cannot append row %llu", path,
                            (unsigned long long)lf->rows);
    lf->rows = n;
    return DS_OK;
}

// The file's end: `stop` (how the generation ended, as --json says) and, after a non-finite
// stop, `nonfinite_position` (the last row is that position's logits, its id -1).
static enum ds_status lf_set_stop(struct logits_file *lf, const char *stop,
                                  long long nonfinite_at, const char *path) {
    hid_t st = H5Tcopy(H5T_C_S1), as = H5Screate(H5S_SCALAR);
    H5Tset_size(st, strlen(stop) + 1);
    hid_t at = H5Acreate2(lf->file, "stop", st, as, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = at >= 0 ? H5Awrite(at, st, stop) : -1;
    if (at >= 0) H5Aclose(at);
    if (nonfinite_at >= 0) {
        const int64_t v = nonfinite_at;
        at = H5Acreate2(lf->file, "nonfinite_position", H5T_STD_I64LE, as, H5P_DEFAULT,
                        H5P_DEFAULT);
        e |= at >= 0 ? H5Awrite(at, H5T_NATIVE_INT64, &v) : -1;
        if (at >= 0) H5Aclose(at);
    }
    H5Sclose(as);
    H5Tclose(st);
    return e < 0 ? ds_error_set(DS_ERR_IO, "%s: cannot write the stop attributes", path) : DS_OK;
}

// Closes the file; DS_ERR_IO when HDF5 could not write what it still held (a full disk).
static enum ds_status lf_close(struct logits_file *lf, const char *path) {
    int bad = 0;
    if (lf->logits >= 0) bad |= H5Dclose(lf->logits) < 0;
    if (lf->ids >= 0) bad |= H5Dclose(lf->ids) < 0;
    if (lf->file >= 0) bad |= H5Fclose(lf->file) < 0;
    lf->file = lf->logits = lf->ids = H5I_INVALID_HID;
    return bad ? ds_error_set(DS_ERR_IO, "%s: cannot write the file out", path) : DS_OK;
}

// Draws the token at `position` from softmax(logits / T) computed on the device (probs: V f32).
static int32_t sample(const float *probs, int vocab, unsigned long long seed, int position) {
    double u = ds_rng_uniform(seed, 0, (uint64_t)position, DS_RNG_LANE_SAMPLE), acc = 0;
    int last = 0;
    for (int v = 0; v < vocab; v++) {
        if (!(probs[v] > 0)) continue; // NaN (from NaN logits) carries no mass either
        acc += probs[v];
        last = v;
        if (u < acc) return v;
    }
    return last; // u beyond the rounded total mass: the last token with mass
}

// ---- the command ----

struct gen_state {
    struct ds_backend *be;
    ds_tokenizer_t *tok;
    ds_harmony_t *h;
    ds_dataset_t *ds;
    ds_gptoss_t *m;
    struct ds_token_vec prompt, out;
    struct logits_file lf;
    bool lf_open;
    bool lf_whole; // every row and the stop attributes written (kept even when the exit is 1)
    float *row;        // (V) host
    float *probs_host; // (B, V) host
    void *probs_dev;   // (B, V) f32 device
    int32_t *id_dev;   // (B) device
    int32_t *ids, *rows;      // (B) host: the copies' tokens, logit rows
    struct ds_attn_seq *seqs; // (B)
    int32_t *pre_tok;         // (plan rows) host: the tokens of one packed prefill forward
    long long disagree_at;    // first step where the copies chose different tokens, or -1
    size_t free_bytes;        // device memory free after planning (0 on the CPU)
};

static int fail(const char *msg) {
    fprintf(stderr, "draftscope generate: %s\n", msg);
    return 1;
}

// DS_ERR_RANGE when a copy's logits are not finite: p at its chosen token (g->ids) is not a
// positive number. With sampling p is on the host already; greedy computes it at T = 1 and reads
// the one entry per copy. Other statuses are backend failures.
static enum ds_status check_finite(struct gen_state *g, const struct gen_opts *o,
                                   enum ds_elem act, int B, int V) {
    enum ds_status s = DS_OK;
    if (!(o->temperature > 0)) {
        struct ds_softmax_args sm = {.act = act,
                                     .n_rows = B,
                                     .vocab = V,
                                     .temperature = 1.0f,
                                     .top_k = 0,
                                     .top_p = 1.0f,
                                     .logits = ds_gptoss_logits(g->m),
                                     .probs = g->probs_dev};
        if ((s = g->be->softmax(g->be, &sm))) return s;
    }
    for (int c = 0; c < B; c++) {
        const size_t at = (size_t)c * (size_t)V + (size_t)g->ids[c];
        float p = 0.0f;
        if (g->ids[c] < 0 || g->ids[c] >= V) return DS_ERR_RANGE;
        if (o->temperature > 0)
            p = g->probs_host[at];
        else if ((s = g->be->download(g->be, &p, (const float *)g->probs_dev + at, sizeof p)))
            return s;
        if (!(p > 0.0f) || !isfinite(p)) return DS_ERR_RANGE;
    }
    return DS_OK;
}

static enum ds_status load_prompt(struct gen_state *g, const struct gen_opts *o,
                                  const struct ds_target_config *cfg) {
    if (o->prompt_ids)
        return ds_cli_parse_ids("--prompt-ids", o->prompt_ids, cfg->vocab_size, &g->prompt);
    if (!g->tok)
        return ds_error_set(DS_ERR_ARG,
                            "%s: no tokenizer.json: --prompt and --dataset need "
                            "--tokenizer FILE",
                            o->target);
    if (o->prompt && o->raw)
        return ds_tokenizer_encode(g->tok, NULL, o->prompt, strlen(o->prompt), &g->prompt);
    if (o->prompt) {
        struct ds_chat_message msg = {DS_ROLE_USER, o->prompt, strlen(o->prompt)};
        return ds_harmony_render_prompt(g->h, NULL, &msg, 1, &g->prompt);
    }
    struct ds_dataset_options dopt;
    ds_dataset_options_default(&dopt);
    enum ds_status s = ds_dataset_open(o->dataset, &dopt, &g->ds);
    if (s != DS_OK) return s;
    struct ds_dataset_turn turn;
    char note[512];
    const size_t skipped = ds_dataset_skip_note(g->ds, note, sizeof note);
    if (o->index < 0 || (size_t)o->index >= ds_dataset_num_conversations(g->ds))
        return ds_error_set(DS_ERR_RANGE,
                            "%s: --index %lld, the file has %zu usable "
                            "conversations%s%s",
                            o->dataset, o->index, ds_dataset_num_conversations(g->ds),
                            skipped ? "; " : "", note);
    // --index counts usable conversations only: say which records it passed over.
    if (skipped) fprintf(stderr, "draftscope generate: %s: %s\n", o->dataset, note);
    if ((s = ds_dataset_turn(g->ds, (size_t)o->index, 1, &turn)) != DS_OK) return s;
    return ds_dataset_render(g->ds, g->h, NULL, &turn, 0, &g->prompt);
}

static enum ds_status open_backend(const struct gen_opts *o, struct ds_backend **be_out,
                                   struct ds_device_info *info) {
    enum ds_status s = ds_device_resolve(o->device, info);
    if (s != DS_OK) return s;
    // As in run: auto falling back to the cpu would fill a 20b or 120b model on the host.
    if (o->synthetic && (s = ds_cli_synthetic_device(o->synthetic, o->device, info))) return s;
    if (info->kind == DS_DEVICE_CUDA) return ds_backend_cuda_create(info->cuda_device, be_out);
    return ds_backend_ref_create(be_out);
}

static bool file_exists(const char *dir, const char *name, char *buf, size_t cap) {
    struct stat sb;
    snprintf(buf, cap, "%s/%s", dir, name);
    return stat(buf, &sb) == 0 && S_ISREG(sb.st_mode);
}

// One decode row for each of the B copies (slots 0..B-1, all at `pos`), logits for every row.
static enum ds_status step_batch(ds_gptoss_t *m, const int32_t *ids, int B, int pos,
                                 struct ds_attn_seq *seqs, int32_t *rows) {
    for (int i = 0; i < B; i++) {
        seqs[i] = (struct ds_attn_seq){.row0 = i, .n_rows = 1, .pos0 = pos, .slot = i};
        rows[i] = i;
    }
    struct ds_batch b = {.n_rows = B,
                         .tokens = ids,
                         .n_seq = B,
                         .seqs = seqs,
                         .n_logit_rows = B,
                         .logit_rows = rows};
    return ds_gptoss_forward(m, &b);
}

// The fixed prompt of a synthetic run without a prompt option.
static enum ds_status synthetic_prompt(int64_t vocab, struct ds_token_vec *out) {
    for (int i = 0; i < 16; i++) {
        enum ds_status s =
            ds_token_vec_push(out, (int32_t)(ds_fill_hash(2024, (uint64_t)i) % (uint64_t)vocab));
        if (s != DS_OK) return s;
    }
    return DS_OK;
}

static const char *stop_name(int32_t id, const int32_t *stops, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (stops[i] == id) return names[i];
    return NULL;
}

// The --logits-out path before anything slow happens (ds_cli_check_output): an existing file is
// replaced only with --overwrite.
static int check_logits_out(const struct gen_opts *o) {
    bool exists;
    if (!o->logits_out) return 0;
    // With --synthetic-weights the model input is its config (a file or directory), if any; a
    // spec that does not parse is said later, as it is without --logits-out.
    struct ds_synthetic_spec spec;
    const char *model = o->target;
    if (o->synthetic && ds_synthetic_parse(o->synthetic, &spec) == DS_OK &&
        !ds_synthetic_is_preset(&spec))
        model = spec.source;
    if (ds_cli_check_output(o->logits_out, "--logits-out", o->dataset, o->tokenizer, model, NULL,
                            false, &exists))
        return fail(ds_error_last());
    if (exists && !o->overwrite) {
        ds_error_set(DS_ERR_IO, "%s: file exists; use --overwrite to replace it", o->logits_out);
        return fail(ds_error_last());
    }
    return 0;
}

static int run(struct gen_state *g, const struct gen_opts *o) {
    enum ds_status s;
    int rc = check_logits_out(o);
    if (rc) return rc;
    struct ds_target_config cfg;
    struct ds_synthetic_spec spec;
    const char *model = o->target ? o->target : o->synthetic; // names the model in messages
    if (o->synthetic) { // a bad spec is a usage error, as in run (ds_cli_synthetic)
        const int src = ds_cli_synthetic(o->synthetic, false, &spec, &cfg);
        if (src) return src == 2 ? usage_error(ds_error_last(), NULL) : fail(ds_error_last());
    } else if ((s = ds_gptoss_check_dir(o->target, &cfg)) != DS_OK) {
        // Config and tensor table as the loader checks them, before the tokenizer and the
        // backend, and before --logits-out is created.
        return fail(ds_error_last());
    }
    char path[4096];
    const char *tok_path = o->tokenizer;
    if (!tok_path && o->target && file_exists(o->target, "tokenizer.json", path, sizeof path))
        tok_path = path;
    if (tok_path) {
        if ((s = ds_tokenizer_load(tok_path, &g->tok)) != DS_OK) return fail(ds_error_last());
        if ((s = ds_harmony_create(g->tok, &g->h)) != DS_OK) return fail(ds_error_last());
    }
    if (o->synthetic && !o->prompt && !o->prompt_ids && !o->dataset)
        s = synthetic_prompt(cfg.vocab_size, &g->prompt);
    else
        s = load_prompt(g, o, &cfg);
    if (s != DS_OK) return fail(ds_error_last());
    if (!g->prompt.n) { // an empty --raw prompt: decoding needs a last prompt token to start from
        ds_error_set(DS_ERR_ARG, "--prompt encodes to 0 tokens: nothing to continue from");
        return fail(ds_error_last());
    }
    const int V = (int)cfg.vocab_size, B = (int)o->batch;
    for (size_t i = 0; i < g->prompt.n; i++)
        if (g->prompt.ids[i] >= V) {
            ds_error_set(DS_ERR_MISMATCH,
                         "%s: prompt token %d outside the model's vocabulary "
                         "of %d (tokenizer and model do not match)",
                         model, g->prompt.ids[i], V);
            return fail(ds_error_last());
        }

    // Context: the prompt must fit; generation stops at the limit. An explicit --max-context
    // sizes the KV cache for that many positions (the memory plan of a serving configuration).
    long long limit = cfg.max_position_embeddings;
    if (o->max_context > 0 && o->max_context < limit) limit = o->max_context;
    if (o->max_context > limit) // beyond the model's own limit: capped there, and said
        fprintf(stderr, "draftscope generate: --max-context %lld is beyond the target's %lld "
                        "positions; using %lld\n", o->max_context, limit, limit);
    const long long np = (long long)g->prompt.n;
    if (np >= limit) {
        ds_error_set(DS_ERR_RANGE,
                     "%s: prompt of %lld tokens does not fit the context limit of "
                     "%lld positions",
                     o->dataset ? o->dataset : model, np, limit);
        return fail(ds_error_last());
    }
    long long max_pos = np + o->max_new < limit ? np + o->max_new : limit;
    if (o->max_context > 0) max_pos = limit;

    struct ds_device_info info;
    if ((s = open_backend(o, &g->be, &info)) != DS_OK) return fail(ds_error_last());
    double t_load = ds_cli_now_s();
    struct ds_cli_bytes_progress bar = {
        .label = o->synthetic ? "making synthetic weights" : "loading weights", .t0 = t_load};
    struct ds_load_progress prog = {ds_cli_bytes_progress, &bar};
    const int chunk = np < PREFILL_CHUNK ? (int)np : PREFILL_CHUNK;
    struct ds_gptoss_plan plan = {
        .max_slots = B,
        .max_pos = (int)max_pos,
        .max_rows = chunk > B ? chunk : B,
        .max_logit_rows = B,
        .graphs = !o->no_graphs,
    };
    if (o->synthetic)
        s = ds_synthetic_target_create(&spec, g->be, &plan, o->json ? NULL : &prog, &g->m);
    else
        s = ds_gptoss_create(o->target, g->be, &plan, o->json ? NULL : &prog, &g->m);
    if (s != DS_OK) return ds_cli_bytes_progress_end(&bar), fail(ds_error_last());
    t_load = ds_cli_now_s() - t_load;
    const size_t BV = (size_t)B * (size_t)V;
    g->row = malloc(sizeof(float) * (size_t)V);
    g->probs_host = malloc(sizeof(float) * BV);
    g->ids = malloc(sizeof(int32_t) * (size_t)B);
    g->rows = malloc(sizeof(int32_t) * (size_t)B);
    g->seqs = malloc(sizeof(struct ds_attn_seq) * (size_t)B);
    g->pre_tok = malloc(sizeof(int32_t) * (size_t)plan.max_rows);
    if (!g->row || !g->probs_host || !g->ids || !g->rows || !g->seqs || !g->pre_tok)
        return fail("out of memory");
    if ((s = g->be->alloc(g->be, sizeof(float) * BV, &g->probs_dev)) != DS_OK ||
        (s = g->be->alloc(g->be, sizeof(int32_t) * (size_t)B, (void **)&g->id_dev)) != DS_OK)
        return fail(ds_error_last());
    if (o->logits_out) {
        g->lf_open = true; // from here a failure removes the file (main)
        if ((s = lf_open(&g->lf, o->logits_out, V, &g->prompt, model)) != DS_OK)
            return fail(ds_error_last());
    }

    // The memory plan, before anything runs.
    struct ds_gptoss_memory mem;
    ds_gptoss_memory_plan(g->m, &mem);
    size_t free_b = 0, total_b = 0;
    if (info.kind == DS_DEVICE_CUDA && cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        cudaGetLastError();
    g->free_bytes = free_b;
    if (!o->json) {
        printf("memory plan on %s: weights %.2f GB, KV %.2f GB (%s, %d slots x %lld positions, "
               "every layer full length), activations %.2f GB",
               info.name, (double)mem.weights / 1e9, (double)mem.kv / 1e9,
               ds_gptoss_act(g->m) == DS_ELEM_BF16 ? "bf16" : "f32", B, max_pos,
               (double)mem.activations / 1e9);
        if (total_b) printf("; free %.2f of %.2f GB", (double)free_b / 1e9, (double)total_b / 1e9);
        printf("\n");
        fflush(stdout);
    }

    // Stop set: harmony's by name when there is a tokenizer, else the config's eos ids.
    int32_t stops[DS_CONFIG_MAX_EOS + 3];
    const char *stop_names[DS_CONFIG_MAX_EOS + 3];
    int n_stops = 0;
    if (g->h) {
        const struct ds_harmony_ids *hi = ds_harmony_ids(g->h);
        stops[n_stops] = hi->ret, stop_names[n_stops++] = "return";
        stops[n_stops] = hi->call, stop_names[n_stops++] = "call";
        stops[n_stops] = hi->endoftext, stop_names[n_stops++] = "endoftext";
    } else {
        for (int i = 0; i < cfg.num_eos_token_ids; i++)
            stops[n_stops] = (int32_t)cfg.eos_token_ids[i], stop_names[n_stops++] = "eos";
    }

    // Prefill: every copy's prompt but its last token in its slot, the copies' pieces packed into
    // forwards of at most the plan's rows (batch invariance makes the packing invisible), then
    // the last token of all copies as one batched step that gives the first logits of each.
    double t0 = ds_cli_now_s();
    // On a terminal a line counts the prefilled tokens (a long prompt, or --batch copies, on the
    // CPU take minutes); a log gets the prefill time in the summary line instead.
    struct ds_cli_bytes_progress pre = {.label = "prefill", .t0 = t0, .unit = "tokens"};
    const bool show = !o->json && isatty(STDERR_FILENO);
    const uint64_t pre_total = (uint64_t)B * (uint64_t)np; // the last tokens come in one step
    const int cap = ds_gptoss_plan_of(g->m)->max_rows;
    int rows = 0, n_seq = 0;
    uint64_t done = 0;
    for (int c = 0; c < B; c++)
        for (long long p = 0; p < np - 1;) {
            const int take = np - 1 - p < cap - rows ? (int)(np - 1 - p) : cap - rows;
            g->seqs[n_seq++] = (struct ds_attn_seq){
                .row0 = rows, .n_rows = take, .pos0 = (int)p, .slot = c};
            memcpy(g->pre_tok + rows, g->prompt.ids + p, sizeof(int32_t) * (size_t)take);
            rows += take;
            p += take;
            // Full, or the last piece: one forward (each copy at most once in it).
            if (rows == cap || (c == B - 1 && p == np - 1)) {
                struct ds_batch b = {.n_rows = rows, .tokens = g->pre_tok, .n_seq = n_seq,
                                     .seqs = g->seqs, .n_logit_rows = 0, .logit_rows = g->rows};
                if ((s = ds_gptoss_forward(g->m, &b)) != DS_OK)
                    return ds_cli_bytes_progress_end(&pre), fail(ds_error_last());
                done += (uint64_t)rows;
                if (show) ds_cli_bytes_progress(&pre, done, pre_total);
                rows = n_seq = 0;
            }
        }
    for (int c = 0; c < B; c++)
        g->ids[c] = g->prompt.ids[np - 1];
    s = step_batch(g->m, g->ids, B, (int)np - 1, g->seqs, g->rows);
    if (show && s == DS_OK) ds_cli_bytes_progress(&pre, pre_total, pre_total);
    ds_cli_bytes_progress_end(&pre);
    if (s != DS_OK) return fail(ds_error_last());
    double t_prefill = ds_cli_now_s() - t0;
    const char *stop = "max_new_tokens";
    long long nonfinite_at = -1; // the position whose logits were not finite
    const enum ds_elem act = ds_gptoss_act(g->m);
    for (long long i = 0; i < o->max_new; i++) {
        const long long pos = np + i; // the position of the token being chosen
        if (o->temperature > 0) {
            struct ds_softmax_args sm = {
                .act = act,
                .n_rows = B,
                .vocab = V,
                .temperature = (float)o->temperature,
                .top_k = 0,
                .top_p = 1.0f,
                .logits = ds_gptoss_logits(g->m),
                .probs = g->probs_dev,
            };
            if ((s = g->be->softmax(g->be, &sm)) == DS_OK)
                s = g->be->download(g->be, g->probs_host, g->probs_dev, sizeof(float) * BV);
            if (s != DS_OK) return fail(ds_error_last());
            for (int c = 0; c < B; c++)
                g->ids[c] = sample(g->probs_host + (size_t)c * V, V, o->seed, (int)pos);
        } else {
            struct ds_argmax_args am = {
                .act = act,
                .n_rows = B,
                .vocab = V,
                .x = ds_gptoss_logits(g->m),
                .ids = g->id_dev,
            };
            if ((s = g->be->argmax(g->be, &am)) == DS_OK)
                s = g->be->download(g->be, g->ids, g->id_dev, sizeof(int32_t) * (size_t)B);
            if (s != DS_OK) return fail(ds_error_last());
        }
        // Non-finite logits (NaN or Inf) end the generation with "error", the token unused: one
        // NaN makes every p of the row NaN, which the argmax skips and the sampler reads as no
        // mass, so p at the chosen token must be a positive number (as in run's steps).
        if ((s = check_finite(g, o, act, B, V)) != DS_OK) {
            if (s != DS_ERR_RANGE) return fail(ds_error_last());
            stop = "error";
            nonfinite_at = pos;
            // The row that failed goes into --logits-out too (id -1: no token was chosen), so
            // the file shows where the NaN or Inf is; the file is kept (docs/cli.md).
            if (g->lf_open &&
                ((s = ds_gptoss_download_logits(g->m, 1, g->row)) != DS_OK ||
                 (s = lf_append(&g->lf, g->row, -1, o->logits_out)) != DS_OK))
                return fail(ds_error_last());
            break;
        }
        const int32_t id = g->ids[0];
        for (int c = 1; c < B; c++)
            if (g->ids[c] != id && g->disagree_at < 0) g->disagree_at = i;
        if (g->lf_open) {
            if ((s = ds_gptoss_download_logits(g->m, 1, g->row)) != DS_OK ||
                (s = lf_append(&g->lf, g->row, id, o->logits_out)) != DS_OK)
                return fail(ds_error_last());
        }
        if ((s = ds_token_vec_push(&g->out, id)) != DS_OK) return fail(ds_error_last());
        const char *sn = stop_name(id, stops, stop_names, n_stops);
        if (sn) {
            stop = sn;
            break;
        }
        if (i + 1 == o->max_new) break;
        if (pos + 1 >= max_pos) { // the next token would sit past the context limit
            stop = "context_limit";
            break;
        }
        for (int c = 0; c < B; c++) // every copy continues with copy 0's token
            g->ids[c] = id;
        if ((s = step_batch(g->m, g->ids, B, (int)pos, g->seqs, g->rows)) != DS_OK)
            return fail(ds_error_last());
    }
    double t_decode = ds_cli_now_s() - t0 - t_prefill;
    if (g->lf_open) { // every row is in: the file is whole, a non-finite stop included
        if ((s = lf_set_stop(&g->lf, stop, nonfinite_at, o->logits_out)) != DS_OK)
            return fail(ds_error_last());
        g->lf_whole = true;
    }

    // Output.
    struct ds_byte_vec text = {0}, esc = {0};
    struct ds_utf8_stream us = {0};
    struct ds_byte_vec raw = {0};
    if (g->tok && ds_tokenizer_decode(g->tok, g->out.ids, g->out.n, &raw) == DS_OK) {
        ds_utf8_stream_feed(&us, raw.data, raw.n, &text);
        ds_utf8_stream_finish(&us, &text);
    }
    if (o->json) {
        json_t *r = json_object(), *pi = json_array(), *gi = json_array();
        for (size_t i = 0; i < g->prompt.n; i++)
            json_array_append_new(pi, json_integer(g->prompt.ids[i]));
        for (size_t i = 0; i < g->out.n; i++)
            json_array_append_new(gi, json_integer(g->out.ids[i]));
        json_object_set_new(r, "target", ds_cli_json_text(model));
        json_object_set_new(r, "synthetic", json_boolean(o->synthetic != NULL));
        json_object_set_new(r, "batch", json_integer(B));
        json_object_set_new(r, "batch_rows_agree", json_boolean(g->disagree_at < 0));
        json_object_set_new(r, "device", json_string(info.name));
        json_object_set_new(r, "prompt_ids", pi);
        json_object_set_new(r, "ids", gi);
        json_object_set_new(
            r, "text", g->tok ? json_stringn(text.data ? text.data : "", text.n) : json_null());
        json_object_set_new(r, "stop", json_string(stop));
        if (nonfinite_at >= 0)
            json_object_set_new(r, "nonfinite_position", json_integer(nonfinite_at));
        json_object_set_new(r, "temperature", json_real(o->temperature));
        json_object_set_new(r, "seed", json_integer((json_int_t)o->seed));
        json_object_set_new(r, "context_limit", json_integer(max_pos));
        json_t *mj = json_object();
        json_object_set_new(mj, "weights", json_integer((json_int_t)mem.weights));
        json_object_set_new(mj, "kv", json_integer((json_int_t)mem.kv));
        json_object_set_new(mj, "activations", json_integer((json_int_t)mem.activations));
        json_object_set_new(mj, "free", json_integer((json_int_t)g->free_bytes));
        json_object_set_new(r, "memory_bytes", mj);
        json_object_set_new(r, "load_seconds", json_real(t_load));
        json_object_set_new(r, "prefill_seconds", json_real(t_prefill));
        json_object_set_new(r, "decode_seconds", json_real(t_decode));
        json_dumpf(r, stdout, JSON_INDENT(2) | JSON_ENSURE_ASCII);
        fputc('\n', stdout);
        json_decref(r);
    } else {
        printf("target %s on %s: weights %.3f GB, KV %.3f GB, activations %.3f GB\n", model,
               info.name, (double)mem.weights / 1e9, (double)mem.kv / 1e9,
               (double)mem.activations / 1e9);
        printf("prompt (%zu ids):", g->prompt.n);
        for (size_t i = 0; i < g->prompt.n; i++)
            printf(" %d", g->prompt.ids[i]);
        printf("\ngenerated (%zu ids):", g->out.n);
        for (size_t i = 0; i < g->out.n; i++)
            printf(" %d", g->out.ids[i]);
        printf("\n");
        if (g->tok && raw.data) {
            ds_bytes_escape(raw.data, raw.n, &esc);
            printf("text: %s\n", esc.data ? esc.data : "");
        }
        printf("stop: %s", stop);
        if (!strcmp(stop, "context_limit")) printf(" (%lld positions)", max_pos);
        if (nonfinite_at >= 0) printf(" (non-finite logits for position %lld)", nonfinite_at);
        printf("; prefill %.3f s, %.1f tokens/s decode\n", t_prefill,
               t_decode > 0 ? (double)g->out.n * B / t_decode : 0.0);
        if (B > 1) {
            if (g->disagree_at < 0)
                printf("batch: all %d copies chose the same tokens\n", B);
            else
                printf("batch: the %d copies chose different tokens from step %lld on\n", B,
                       g->disagree_at);
        }
    }
    ds_byte_vec_free(&text);
    ds_byte_vec_free(&esc);
    ds_byte_vec_free(&raw);
    if (nonfinite_at >= 0) {
        fprintf(stderr, "draftscope generate: %s: non-finite logits (NaN or Inf) for position "
                        "%lld; generation stopped there%s%s%s\n", model, nonfinite_at,
                o->logits_out ? " (" : "", o->logits_out ? o->logits_out : "",
                o->logits_out ? " keeps the rows up to it, its own last, id -1)" : "");
        return 1;
    }
    return 0;
}

int ds_cmd_generate(int argc, char **argv) {
    enum {
        O_DATASET = 256,
        O_INDEX,
        O_RAW,
        O_TOKENIZER,
        O_TEMP,
        O_SEED,
        O_MAXCTX,
        O_LOGITS,
        O_DEVICE,
        O_SYNTH,
        O_BATCH,
        O_NOGRAPHS,
        O_OVERWRITE
    };
    static const struct option long_opts[] = {
        {"target", required_argument, NULL, 't'},
        {"prompt", required_argument, NULL, 'p'},
        {"prompt-ids", required_argument, NULL, 'i'},
        {"dataset", required_argument, NULL, O_DATASET},
        {"index", required_argument, NULL, O_INDEX},
        {"raw", no_argument, NULL, O_RAW},
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"max-new-tokens", required_argument, NULL, 'n'},
        {"temperature", required_argument, NULL, O_TEMP},
        {"seed", required_argument, NULL, O_SEED},
        {"max-context", required_argument, NULL, O_MAXCTX},
        {"logits-out", required_argument, NULL, O_LOGITS},
        {"overwrite", no_argument, NULL, O_OVERWRITE},
        {"json", no_argument, NULL, 'j'},
        {"device", required_argument, NULL, O_DEVICE},
        {"synthetic-weights", required_argument, NULL, O_SYNTH},
        {"batch", required_argument, NULL, O_BATCH},
        {"no-graphs", no_argument, NULL, O_NOGRAPHS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct gen_opts o = {.index = -1, .max_new = 64, .device = DS_DEVICE_AUTO, .batch = 1};
    long long ll;
    char msg[96]; // an integer option's usage error (ds_cli_int_opt)
    optind = 0;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "t:p:i:n:jh", long_opts, NULL)) != -1;) {
        switch (c) {
        case 't':
            o.target = optarg;
            break;
        case 'p':
            o.prompt = optarg;
            break;
        case 'i':
            o.prompt_ids = optarg;
            break;
        case O_DATASET:
            o.dataset = optarg;
            break;
        case O_INDEX:
            if (!ds_cli_int_opt("--index", optarg, 0, INT32_MAX, &o.index, msg, sizeof msg))
                return usage_error(msg, optarg);
            break;
        case O_RAW:
            o.raw = true;
            break;
        case O_TOKENIZER:
            o.tokenizer = optarg;
            break;
        case 'n':
            if (!ds_cli_int_opt("--max-new-tokens", optarg, 1, INT32_MAX, &o.max_new, msg,
                                sizeof msg))
                return usage_error(msg, optarg);
            break;
        case O_TEMP: {
            char *end;
            o.temperature = strtod(optarg, &end);
            if (end == optarg || *end ||
                !(o.temperature == 0 || ((float)o.temperature >= DS_SPEC_TEMPERATURE_MIN &&
                                         (float)o.temperature <= DS_SPEC_TEMPERATURE_MAX)))
                return usage_error("--temperature wants 0 (greedy) or a number in 1e-06..1e+06",
                                   optarg);
            break;
        }
        case O_SEED:
            // Seeds stop at 2^63 - 1: the --json output has signed integers.
            if (!ds_cli_int_opt("--seed", optarg, 0, INT64_MAX, &ll, msg, sizeof msg))
                return usage_error(msg, optarg);
            o.seed = (unsigned long long)ll;
            break;
        case O_MAXCTX:
            if (!ds_cli_int_opt("--max-context", optarg, 1, INT32_MAX, &o.max_context, msg,
                                sizeof msg))
                return usage_error(msg, optarg);
            break;
        case O_LOGITS:
            o.logits_out = optarg;
            break;
        case O_OVERWRITE:
            o.overwrite = true;
            break;
        case 'j':
            o.json = true;
            break;
        case O_DEVICE:
            if (ds_device_parse(optarg, &o.device) != DS_OK)
                return usage_error("--device wants auto, cpu or cuda", optarg);
            break;
        case O_SYNTH:
            o.synthetic = optarg;
            break;
        case O_BATCH:
            if (!ds_cli_int_opt("--batch", optarg, 1, 1024, &o.batch, msg, sizeof msg))
                return usage_error(msg, optarg);
            break;
        case O_NOGRAPHS:
            o.no_graphs = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return usage_error("unknown option or missing value", argv[optind - 1]);
        }
    }
    if (optind < argc) return usage_error("unexpected argument", argv[optind]);
    if (!o.target == !o.synthetic)
        return usage_error("give exactly one of --target DIR and --synthetic-weights SPEC", NULL);
    int sources = (o.prompt != NULL) + (o.prompt_ids != NULL) + (o.dataset != NULL);
    if (sources > 1 || (sources == 0 && !o.synthetic))
        return usage_error("give exactly one of --prompt, --prompt-ids, --dataset", NULL);
    if (o.dataset && o.index < 0) return usage_error("--dataset needs --index I", NULL);
    if (!o.dataset && o.index >= 0) return usage_error("--index needs --dataset", NULL);
    if (o.raw && !o.prompt) return usage_error("--raw applies to --prompt only", NULL);
    if (o.overwrite && !o.logits_out)
        return usage_error("--overwrite applies to --logits-out", NULL);
    // Text needs a tokenizer, and a synthetic model has no checkpoint to take one from (the
    // message of a target without tokenizer.json named a NULL target here).
    if (o.synthetic && (o.prompt || o.dataset) && !o.tokenizer)
        return usage_error("--prompt and --dataset need --tokenizer FILE with --synthetic-weights: "
                           "there is no checkpoint to take it from", NULL);

    struct gen_state g = {.disagree_at = -1};
    int rc = run(&g, &o);
    fflush(stdout);
    if (g.lf_open) {
        // A file cut short by a failure is removed rather than left looking whole; one that
        // ends at non-finite logits is whole (its stop attribute says so) and is kept.
        const bool closed = lf_close(&g.lf, o.logits_out) == DS_OK;
        if (!closed && rc == 0) rc = fail(ds_error_last());
        if ((!closed || (rc != 0 && !g.lf_whole)) && g.lf.created && unlink(o.logits_out) == 0)
            fprintf(stderr, "draftscope generate: %s removed (incomplete)\n", o.logits_out);
    }
    if (g.be) {
        g.be->free(g.be, g.probs_dev);
        g.be->free(g.be, g.id_dev);
    }
    ds_gptoss_release(g.m);
    ds_backend_release(g.be);
    ds_dataset_release(g.ds);
    ds_harmony_release(g.h);
    ds_tokenizer_release(g.tok);
    ds_token_vec_free(&g.prompt);
    ds_token_vec_free(&g.out);
    free(g.row);
    free(g.probs_host);
    free(g.ids);
    free(g.rows);
    free(g.seqs);
    free(g.pre_tok);
    return rc;
}
