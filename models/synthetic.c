// Synthetic weights of real shapes (ds/synthetic.h): the gpt-oss presets, the matching EAGLE-3
// draft config, and the weight generator handed to the models' loaders (weights.h).
//
// Every tensor is filled where it lives: on CUDA by the seeded device fills of ds/kernels_cuda.h
// queued on the backend's stream, on the CPU reference by the same formula on the host. The fill
// of a tensor depends only on (run seed, model kind, tensor name), never on the order of binding.
#include "ds/synthetic.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ds/bf16.h"
#include "ds/kernels_cuda.h"
#include "weights.h"

// gpt-oss-20b / -120b config.json (spec gpt-oss.md §1); layer_types default to the alternation
// sliding, full, ... of the hub files.
static const char preset_fmt[] =
    "{\"architectures\":[\"GptOssForCausalLM\"],\"model_type\":\"gpt_oss\","
    "\"vocab_size\":201088,\"hidden_size\":2880,\"intermediate_size\":2880,"
    "\"num_hidden_layers\":%d,\"num_attention_heads\":64,\"num_key_value_heads\":8,"
    "\"head_dim\":64,\"num_local_experts\":%d,\"num_experts_per_tok\":4,"
    "\"experts_per_token\":4,\"sliding_window\":128,\"rope_theta\":150000,"
    "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":32.0,\"beta_fast\":32.0,"
    "\"beta_slow\":1.0,\"original_max_position_embeddings\":4096,\"truncate\":false},"
    "\"initial_context_length\":4096,\"max_position_embeddings\":131072,"
    "\"rms_norm_eps\":1e-05,\"swiglu_limit\":7.0,\"attention_bias\":true,"
    "\"tie_word_embeddings\":false,\"eos_token_id\":200002,\"pad_token_id\":199999,"
    "\"quantization_config\":{\"quant_method\":\"mxfp4\",\"modules_to_not_convert\":"
    "[\"model.layers.*.self_attn\",\"model.layers.*.mlp.router\",\"model.embed_tokens\","
    "\"lm_head\"]}}";

// A SpecForge / lmsys EAGLE-3 config (spec eagle3.md §2.1).
static const char draft_fmt[] =
    "{\"architectures\":[\"LlamaForCausalLMEagle3\"],\"model_type\":\"llama\","
    "\"hidden_size\":%d,\"intermediate_size\":%d,\"num_attention_heads\":%d,"
    "\"num_key_value_heads\":%d,\"head_dim\":%d,\"num_hidden_layers\":1,\"hidden_act\":\"silu\","
    "\"rms_norm_eps\":1e-05,\"max_position_embeddings\":4096,\"vocab_size\":%d,"
    "\"draft_vocab_size\":%d,\"tie_word_embeddings\":false,\"pad_token_id\":0,"
    "\"torch_dtype\":\"bfloat16\","
    "\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[%d,%d,%d]}}";

enum { KIND_TARGET = 1, KIND_DRAFT = 2 };

// ---------------------------------------------------------------------------------------------
// Specs and configs

static bool all_digits(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return false;
    return true;
}

// Strips a trailing ":digits" from buf into *value; false when there is none.
static bool strip_number(char *buf, unsigned long long *value) {
    char *c = strrchr(buf, ':');
    if (!c || !all_digits(c + 1)) return false;
    errno = 0;
    unsigned long long v = strtoull(c + 1, NULL, 10);
    if (errno) return false;
    *value = v;
    *c = '\0';
    return true;
}

enum ds_status ds_synthetic_parse(const char *arg, struct ds_synthetic_spec *out) {
    memset(out, 0, sizeof *out);
    if (!arg || !*arg) return ds_error_set(DS_ERR_ARG, "--synthetic-weights: empty argument");
    if (strlen(arg) >= sizeof out->source)
        return ds_error_set(DS_ERR_ARG, "--synthetic-weights: argument too long");
    snprintf(out->source, sizeof out->source, "%s", arg);
    unsigned long long a = 0, b = 0;
    if (strip_number(out->source, &a)) {
        if (strip_number(out->source, &b)) {
            if (a < 1 || a > DS_CONFIG_MAX_LAYERS)
                return ds_error_set(DS_ERR_ARG, "--synthetic-weights %s: LAYERS must be 1..%d", arg,
                                    DS_CONFIG_MAX_LAYERS);
            out->seed = b;
            out->layers = (int)a;
        } else {
            out->seed = a;
        }
        // JSON (options_json, summary --json) has signed 64-bit integers.
        if (out->seed > (unsigned long long)INT64_MAX)
            return ds_error_set(DS_ERR_ARG, "--synthetic-weights %s: SEED must be 0..%lld", arg,
                                (long long)INT64_MAX);
    }
    if (!out->source[0])
        return ds_error_set(DS_ERR_ARG, "--synthetic-weights %s: no preset or config named", arg);
    return DS_OK;
}

// Reads a config.json file, or DIR/config.json.
static enum ds_status config_from_path(const char *path, struct ds_target_config *cfg) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ds_error_set(DS_ERR_IO,
                            "--synthetic-weights: %s is neither 20b, 120b nor an existing "
                            "config.json or directory",
                            path);
    if (S_ISDIR(sb.st_mode)) return ds_target_config_load(path, cfg);
    // Size-capped and regular files only: a FIFO or device is refused, not read, and a large
    // file named by mistake is not read whole into memory.
    return ds_target_config_load_file(path, cfg);
}

bool ds_synthetic_is_preset(const struct ds_synthetic_spec *spec) {
    return !strcmp(spec->source, "20b") || !strcmp(spec->source, "120b");
}

enum ds_status ds_synthetic_target_config(const struct ds_synthetic_spec *spec,
                                          struct ds_target_config *cfg) {
    enum ds_status s;
    const bool is20 = !strcmp(spec->source, "20b"), is120 = !strcmp(spec->source, "120b");
    if (is20 || is120) {
        char json[sizeof preset_fmt + 32];
        int n = snprintf(json, sizeof json, preset_fmt, is20 ? 24 : 36, is20 ? 32 : 128);
        const char *label = is20 ? "gpt-oss-20b preset" : "gpt-oss-120b preset";
        s = ds_target_config_parse(json, (size_t)n, label, cfg);
    } else {
        s = config_from_path(spec->source, cfg);
    }
    if (s != DS_OK) return s;
    if (spec->layers < 0 || spec->layers > cfg->num_hidden_layers)
        return ds_error_set(DS_ERR_RANGE,
                            "--synthetic-weights %s: %d layers asked, the config has "
                            "%lld",
                            spec->source, spec->layers, (long long)cfg->num_hidden_layers);
    if (spec->layers) cfg->num_hidden_layers = spec->layers; // layer_types keeps its prefix
    return DS_OK;
}

// Output-of ids of the three aux states for a target of L layers.
static bool draft_ids(int L, int ids[3]) {
    ids[0] = 1, ids[1] = L / 2 - 1, ids[2] = L - 3; // lmsys: 36 → 1,17,33; 24 → 1,11,21
    if (ids[0] < ids[1] && ids[1] < ids[2]) return true;
    ids[0] = 0, ids[1] = (L - 1) / 2, ids[2] = L - 1; // small slices
    return L >= 3 && ids[0] < ids[1] && ids[1] < ids[2];
}

enum ds_status ds_synthetic_draft_config(const struct ds_target_config *t,
                                         struct ds_draft_config *cfg) {
    // The draft's intermediate size is 6·H, which the draft config caps at 2^30 (config.c): a
    // larger H overflowed int and was reported as the draft's own 'intermediate_size'.
    const int64_t h_max = ((int64_t)1 << 30) / 6;
    if (t->hidden_size > h_max) // a problem of the config file (exit 1), not of the usage
        return ds_error_set(DS_ERR_FORMAT,
                            "synthetic draft: the target's hidden_size %lld is too large for a "
                            "draft of intermediate size 6 x hidden_size (at most %lld)",
                            (long long)t->hidden_size, (long long)h_max);
    const int L = (int)t->num_hidden_layers, H = (int)t->hidden_size, V = (int)t->vocab_size;
    int ids[3];
    if (!draft_ids(L, ids))
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "synthetic draft: the target has %d layers; three distinct aux "
                            "states need at least 3",
                            L);
    const int Dv = V < DS_SYNTHETIC_DRAFT_VOCAB ? V : DS_SYNTHETIC_DRAFT_VOCAB;
    char json[sizeof draft_fmt + 160];
    int n = snprintf(json, sizeof json, draft_fmt, H, 6 * H, (int)t->num_attention_heads,
                     (int)t->num_key_value_heads, (int)t->head_dim, V, Dv, ids[0], ids[1], ids[2]);
    enum ds_status s = ds_draft_config_parse(json, (size_t)n, "synthetic draft", cfg);
    if (s != DS_OK) return s;
    // What a checkpoint's tensor table would tell: SpecForge names, no embedding, own lm_head.
    cfg->layer_names = DS_DRAFT_NAMES_MIDLAYER;
    cfg->has_embed_tokens = false;
    cfg->lm_head_from_target = false;
    return DS_OK;
}

enum ds_status ds_synthetic_aux_plan(const struct ds_target_config *target,
                                     struct ds_aux_plan *plan_out) {
    struct ds_draft_config d;
    enum ds_status s = ds_synthetic_draft_config(target, &d);
    if (s != DS_OK) return s;
    return ds_aux_plan(&d, target->num_hidden_layers, NULL, "synthetic draft", plan_out);
}

// ---------------------------------------------------------------------------------------------
// The generator

struct synth {
    int kind;        // KIND_TARGET / KIND_DRAFT
    uint64_t seed;   // run seed
    int H, QD, I, W; // hidden, heads·head_dim, intermediate (draft MLP), fc input width
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

// The tensor's own seed: the run seed, the model kind and an FNV-1a hash of the name.
static uint64_t tensor_seed(const struct synth *g, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return ds_fill_hash(g->seed * 4 + (uint64_t)g->kind, h);
}

// Fan-in of a linear weight by its name (ds/synthetic.h: uniform ±sqrt(3 / fan_in)).
static int fan_in(const struct synth *g, const char *name) {
    if (strstr(name, "o_proj")) return g->QD;
    if (strstr(name, "down_proj")) return g->I;
    if (!strcmp(name, "fc.weight")) return g->W;
    if (g->kind == KIND_DRAFT &&
        (strstr(name, "q_proj") || strstr(name, "k_proj") || strstr(name, "v_proj")))
        return 2 * g->H; // the draft's attention reads [embedding | hidden]
    return g->H;         // q/k/v of the target, router, gate/up, lm_head
}

static enum ds_status synth_fill(void *user, struct ds_backend *be, const char *name,
                                 enum ds_dtype dtype, uint64_t numel, void *dst) {
    const struct synth *g = user;
    const uint64_t seed = tensor_seed(g, name);
    void *stream = ds_backend_cuda_stream(be);
    if (dtype == DS_DTYPE_U8) {
        // MXFP4: codes anywhere; scales 2^-8..2^-7 (ds/synthetic.h).
        const int lo = ends_with(name, "_scales") ? 119 : 0,
                  hi = ends_with(name, "_scales") ? 120 : 255;
        if (stream) return ds_cuda_fill_bytes(dst, (size_t)numel, seed, lo, hi, stream);
        uint8_t *b = dst;
        for (uint64_t i = 0; i < numel; i++)
            b[i] = (uint8_t)(lo + (int)(ds_fill_hash(seed, i) % (uint64_t)(hi - lo + 1)));
        return DS_OK;
    }
    float lo, hi;
    if (strstr(name, "norm")) { // every RMSNorm gain (layernorms, hidden/input/fc/final norms)
        lo = 0.8f, hi = 1.2f;
    } else if (ends_with(name, "bias")) {
        lo = -0.05f, hi = 0.05f;
    } else if (ends_with(name, "sinks") || strstr(name, "embed_tokens")) {
        lo = -1.0f, hi = 1.0f;
    } else {
        hi = sqrtf(3.0f / (float)fan_in(g, name));
        lo = -hi;
    }
    if (stream) return ds_cuda_fill_uniform(dst, DS_ELEM_BF16, (size_t)numel, seed, lo, hi, stream);
    ds_bf16 *w = dst;
    for (uint64_t i = 0; i < numel; i++)
        w[i] = ds_f32_to_bf16(ds_fill_value(seed, i, lo, hi));
    return DS_OK;
}

// The target of `spec`: created (model_out) or only measured (measure, model_out NULL).
static enum ds_status target_build(const struct ds_synthetic_spec *spec, struct ds_backend *be,
                                   const struct ds_gptoss_plan *plan,
                                   const struct ds_load_progress *progress,
                                   ds_gptoss_t **model_out, struct ds_gptoss_memory *measure) {
    struct ds_target_config cfg;
    enum ds_status s = ds_synthetic_target_config(spec, &cfg);
    if (s != DS_OK) return s;
    struct synth g = {
        .kind = KIND_TARGET,
        .seed = spec->seed,
        .H = (int)cfg.hidden_size,
        .QD = (int)(cfg.num_attention_heads * cfg.head_dim),
        .I = (int)cfg.intermediate_size,
        .W = DS_AUX_COUNT * (int)cfg.hidden_size,
    };
    struct ds_weight_gen gen = {.fill = synth_fill, .user = &g, .d2t = NULL};
    char label[1100];
    snprintf(label, sizeof label, "synthetic %s (seed %llu)", spec->source,
             (unsigned long long)spec->seed);
    return measure ? ds_gptoss_measure_gen(&cfg, &gen, label, be, plan, measure)
                   : ds_gptoss_create_gen(&cfg, &gen, label, be, plan, progress, model_out);
}

enum ds_status ds_synthetic_target_create(const struct ds_synthetic_spec *spec,
                                          struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                          const struct ds_load_progress *progress,
                                          ds_gptoss_t **model_out) {
    *model_out = NULL;
    return target_build(spec, be, plan, progress, model_out, NULL);
}

enum ds_status ds_synthetic_target_measure(const struct ds_synthetic_spec *spec,
                                           struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                           struct ds_gptoss_memory *out) {
    return target_build(spec, be, plan, NULL, NULL, out);
}

// The draft of `spec` for a target: created for `target` (draft_out), or only measured against
// the target's config and plan (measure; target and draft_out NULL).
static enum ds_status draft_build(const struct ds_synthetic_spec *spec, const ds_gptoss_t *target,
                                  const struct ds_target_config *tc,
                                  const struct ds_gptoss_plan *target_plan, struct ds_backend *be,
                                  const struct ds_eagle3_plan *plan,
                                  const struct ds_load_progress *progress,
                                  ds_eagle3_t **draft_out, struct ds_gptoss_memory *measure) {
    struct ds_draft_config cfg;
    enum ds_status s = ds_synthetic_draft_config(tc, &cfg);
    if (s != DS_OK) return s;
    const int Dv = (int)cfg.draft_vocab_size, V = (int)cfg.vocab_size;
    int64_t *d2t = NULL;
    if (Dv != V) {
        // Evenly spread target ids (strictly increasing, as SpecForge's sorted map is).
        d2t = malloc((size_t)Dv * sizeof *d2t);
        if (!d2t) return ds_error_set(DS_ERR_NOMEM, "synthetic draft: out of memory");
        for (int i = 0; i < Dv; i++)
            d2t[i] = (int64_t)i * V / Dv - i;
    }
    struct synth g = {
        .kind = KIND_DRAFT,
        .seed = spec->seed,
        .H = (int)cfg.hidden_size,
        .QD = (int)(cfg.num_attention_heads * cfg.head_dim),
        .I = (int)cfg.intermediate_size,
        .W = DS_AUX_COUNT * (int)tc->hidden_size,
    };
    struct ds_weight_gen gen = {.fill = synth_fill, .user = &g, .d2t = d2t};
    char label[1100];
    snprintf(label, sizeof label, "synthetic draft for %s (seed %llu)", spec->source,
             (unsigned long long)spec->seed);
    s = measure ? ds_eagle3_measure_gen(&cfg, &gen, label, tc, target_plan, be, plan, measure)
                : ds_eagle3_create_gen(&cfg, &gen, label, target, be, plan, progress, draft_out);
    free(d2t);
    return s;
}

enum ds_status ds_synthetic_draft_create(const struct ds_synthetic_spec *spec,
                                         const ds_gptoss_t *target, struct ds_backend *be,
                                         const struct ds_eagle3_plan *plan,
                                         const struct ds_load_progress *progress,
                                         ds_eagle3_t **draft_out) {
    *draft_out = NULL;
    return draft_build(spec, target, ds_gptoss_config(target), ds_gptoss_plan_of(target), be,
                       plan, progress, draft_out, NULL);
}

enum ds_status ds_synthetic_draft_measure(const struct ds_synthetic_spec *spec,
                                          const struct ds_target_config *target_cfg,
                                          const struct ds_gptoss_plan *target_plan,
                                          struct ds_backend *be, const struct ds_eagle3_plan *plan,
                                          struct ds_gptoss_memory *out) {
    return draft_build(spec, NULL, target_cfg, target_plan, be, plan, NULL, NULL, out);
}
