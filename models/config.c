// config.json -> struct ds_target_config / struct ds_draft_config (ds/config.h), and the aux-id
// conventions.
//
// Fields are read through small typed getters that know where they are (`label`, the file, and
// `path`, the enclosing object such as "rope_scaling."), so every message names the file and the
// field. JSON null counts as absent everywhere (speculators writes "target_hidden_size": null).
#include "ds/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "files.h"

// Caps that keep every later product of dims inside int64 and reject absurd files early.
#define DIM_MAX ((int64_t)1 << 30)
#define SMALL_MAX ((int64_t)1 << 16)
#define CONFIG_MAX_BYTES (4u << 20)

// ---------------------------------------------------------------------------------------------
// Names

const char *ds_rope_type_name(enum ds_rope_type t) {
    switch (t) {
    case DS_ROPE_DEFAULT: return "default";
    case DS_ROPE_YARN: return "yarn";
    case DS_ROPE_LLAMA3: return "llama3";
    case DS_ROPE_LINEAR: return "linear";
    }
    return "?";
}

const char *ds_attn_type_name(enum ds_attn_type t) {
    return t == DS_ATTN_FULL ? "full_attention" : "sliding_attention";
}

static const char *const convention_names[DS_AUX_CONVENTION_COUNT] = {
    [DS_AUX_OUTPUT_OF] = "output-of",
    [DS_AUX_CAPTURE_BEFORE] = "capture-before",
    [DS_AUX_BOUNDARY] = "boundary",
};

const char *ds_aux_convention_name(enum ds_aux_convention c) {
    return (unsigned)c < DS_AUX_CONVENTION_COUNT ? convention_names[c] : "?";
}

enum ds_status ds_aux_convention_parse(const char *s, enum ds_aux_convention *out) {
    for (int i = 0; i < DS_AUX_CONVENTION_COUNT; i++) {
        if (s && !strcmp(s, convention_names[i])) {
            *out = (enum ds_aux_convention)i;
            return DS_OK;
        }
    }
    return ds_error_set(DS_ERR_ARG,
                        "unknown aux-id convention '%s' (output-of, capture-before or boundary)",
                        s ? s : "(null)");
}

const char *ds_draft_layout_name(enum ds_draft_layout l) {
    switch (l) {
    case DS_DRAFT_SPECFORGE: return "specforge";
    case DS_DRAFT_SPECULATORS: return "speculators";
    case DS_DRAFT_NVIDIA: return "nvidia";
    }
    return "?";
}

const char *ds_draft_names_prefix(enum ds_draft_names n) {
    return n == DS_DRAFT_NAMES_LAYERS0 ? "layers.0." : "midlayer.";
}

const char *ds_aux_source_name(enum ds_aux_source s) {
    switch (s) {
    case DS_AUX_SOURCE_NONE: return "none";
    case DS_AUX_SOURCE_EAGLE_CONFIG: return "eagle_config";
    case DS_AUX_SOURCE_TOP_LEVEL: return "top_level";
    }
    return "?";
}

// ---------------------------------------------------------------------------------------------
// Typed field access

// Where fields are read from: the file (for messages), the enclosing object and its dotted path.
struct src {
    const char *label;
    const char *path; // "" or "rope_scaling." etc.
    json_t *obj;      // may be NULL: every field is then absent
};

enum need { OPTIONAL = 0, REQUIRED = 1 };

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

// The value of key, or NULL when absent or null.
static json_t *field(const struct src *s, const char *key) {
    json_t *v = s->obj ? json_object_get(s->obj, key) : NULL;
    return (v && !json_is_null(v)) ? v : NULL;
}

static enum ds_status missing(const struct src *s, const char *key) {
    return ds_error_set(DS_ERR_FORMAT, "%s: missing required field '%s%s'", s->label, s->path, key);
}

// An integer in [lo, hi]; integral reals (2880.0) are accepted.
static enum ds_status json_to_int(const struct src *s, const char *key, const json_t *v,
                                  int64_t lo, int64_t hi, int64_t *out) {
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9.0e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' must be an integer, found %s",
                            s->label, s->path, key, json_kind(v));
    }
    if (x < lo || x > hi)
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' is %lld, expected %lld..%lld",
                            s->label, s->path, key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return DS_OK;
}

static enum ds_status get_int(const struct src *s, const char *key, enum need need, int64_t def,
                              int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = field(s, key);
    if (!v) {
        if (need == REQUIRED) return missing(s, key);
        *out = def;
        return DS_OK;
    }
    return json_to_int(s, key, v, lo, hi, out);
}

// A finite number in [lo, hi].
static enum ds_status get_real(const struct src *s, const char *key, enum need need, double def,
                               double lo, double hi, double *out) {
    json_t *v = field(s, key);
    if (!v) {
        if (need == REQUIRED) return missing(s, key);
        *out = def;
        return DS_OK;
    }
    if (!json_is_number(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' must be a number, found %s",
                            s->label, s->path, key, json_kind(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' is %g, expected %g..%g", s->label,
                            s->path, key, x, lo, hi);
    *out = x;
    return DS_OK;
}

static enum ds_status get_bool(const struct src *s, const char *key, bool def, bool *out) {
    json_t *v = field(s, key);
    if (!v) {
        *out = def;
        return DS_OK;
    }
    if (!json_is_boolean(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' must be true or false, found %s",
                            s->label, s->path, key, json_kind(v));
    *out = json_is_true(v);
    return DS_OK;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

// A string into a fixed buffer (truncated to fit; these are names for display and matching).
static enum ds_status get_str(const struct src *s, const char *key, const char *def, char *out,
                              size_t cap) {
    json_t *v = field(s, key);
    if (!v) {
        copy_str(out, cap, def);
        return DS_OK;
    }
    if (!json_is_string(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' must be a string, found %s",
                            s->label, s->path, key, json_kind(v));
    copy_str(out, cap, json_string_value(v));
    return DS_OK;
}

// architectures[0] (a list of strings in every HF config).
static enum ds_status get_architecture(const struct src *s, const char *def, char *out,
                                       size_t cap) {
    json_t *v = field(s, "architectures");
    copy_str(out, cap, def);
    if (!v) return DS_OK;
    if (!json_is_array(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%sarchitectures' must be a list, found %s",
                            s->label, s->path, json_kind(v));
    if (json_array_size(v) == 0) return DS_OK;
    json_t *a = json_array_get(v, 0);
    if (!json_is_string(a))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%sarchitectures[0]' must be a string",
                            s->label, s->path);
    copy_str(out, cap, json_string_value(a));
    return DS_OK;
}

// An object-valued field, or NULL when absent/null; anything else is an error.
static enum ds_status get_object(const struct src *s, const char *key, json_t **out) {
    json_t *v = field(s, key);
    *out = NULL;
    if (!v) return DS_OK;
    if (!json_is_object(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' must be an object, found %s",
                            s->label, s->path, key, json_kind(v));
    *out = v;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// RoPE

// The RoPE tables refuse a base of at most 1 (ln(theta) divides); refused here, naming the field,
// rather than when the tables are built after the whole weight load.
static enum ds_status check_theta(const struct src *s, double theta) {
    if (theta > 1.0) return DS_OK;
    return ds_error_set(DS_ERR_FORMAT, "%s: field '%srope_theta' is %g, expected more than 1",
                        s->label, s->path, theta);
}

// Reads the rope settings: `rope_parameters` (theta inside) or `rope_scaling` plus top-level
// `rope_theta`. With neither, *out keeps the caller's defaults except theta.
static enum ds_status parse_rope(const struct src *top, int64_t max_pos, double def_theta,
                                 struct ds_rope_config *out) {
    enum ds_status st;
    json_t *params = NULL, *scaling = NULL;
    if ((st = get_object(top, "rope_parameters", &params))) return st;
    if ((st = get_object(top, "rope_scaling", &scaling))) return st;

    struct src s = {top->label, "rope_parameters.", params};
    if (params) {
        // The top-level rope_theta, when also present, is the fallback for the nested one.
        double theta;
        if ((st = get_real(top, "rope_theta", OPTIONAL, def_theta, 1e-9, 1e30, &theta))) return st;
        if ((st = get_real(&s, "rope_theta", OPTIONAL, theta, 1e-9, 1e30, &out->theta))) return st;
        if ((st = check_theta(field(&s, "rope_theta") ? &s : top, out->theta))) return st;
    } else {
        if ((st = get_real(top, "rope_theta", OPTIONAL, def_theta, 1e-9, 1e30, &out->theta)))
            return st;
        if ((st = check_theta(top, out->theta))) return st;
        if (!scaling) return DS_OK;
        s.path = "rope_scaling.";
        s.obj = scaling;
    }

    // "rope_type" is the current key, "type" the older one.
    char type[32];
    const char *type_key = field(&s, "rope_type") ? "rope_type" : "type";
    if ((st = get_str(&s, type_key, "default", type, sizeof type))) return st;
    struct ds_rope_config r = {.type = DS_ROPE_DEFAULT, .theta = out->theta, .factor = 1.0};
    if (!strcmp(type, "default")) {
        *out = r;
        return DS_OK;
    } else if (!strcmp(type, "yarn")) {
        r.type = DS_ROPE_YARN;
    } else if (!strcmp(type, "llama3")) {
        r.type = DS_ROPE_LLAMA3;
    } else if (!strcmp(type, "linear")) {
        r.type = DS_ROPE_LINEAR;
    } else {
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "%s: field '%s%s' is \"%s\"; supported: default, yarn, llama3, linear",
                            s.label, s.path, type_key, type);
    }
    if ((st = get_real(&s, "factor", REQUIRED, 1.0, 1e-6, 1e6, &r.factor))) return st;
    if (r.type == DS_ROPE_LINEAR) {
        *out = r;
        return DS_OK;
    }
    if ((st = get_int(&s, "original_max_position_embeddings", OPTIONAL, max_pos, 1, DIM_MAX,
                      &r.original_max_position_embeddings)))
        return st;
    if (r.type == DS_ROPE_YARN) {
        if ((st = get_real(&s, "beta_fast", OPTIONAL, 32.0, 1e-6, 1e6, &r.beta_fast))) return st;
        if ((st = get_real(&s, "beta_slow", OPTIONAL, 1.0, 1e-6, 1e6, &r.beta_slow))) return st;
        if ((st = get_real(&s, "attention_factor", OPTIONAL, 0.0, 0.0, 1e6, &r.attention_factor)))
            return st;
        // transformers: truncate defaults to true when the key is absent.
        if ((st = get_bool(&s, "truncate", true, &r.truncate))) return st;
        // What the YaRN tables need (they refuse anything else, after the weight load).
        if (r.factor < 1.0)
            return ds_error_set(DS_ERR_FORMAT, "%s: field '%sfactor' is %g, expected at least 1 "
                                "for yarn", s.label, s.path, r.factor);
        if (r.beta_fast <= r.beta_slow)
            return ds_error_set(DS_ERR_FORMAT, "%s: field '%sbeta_fast' is %g, expected more "
                                "than beta_slow %g for yarn", s.label, s.path, r.beta_fast,
                                r.beta_slow);
    } else {
        if ((st = get_real(&s, "low_freq_factor", OPTIONAL, 1.0, 1e-6, 1e6, &r.low_freq_factor)))
            return st;
        if ((st = get_real(&s, "high_freq_factor", OPTIONAL, 4.0, 1e-6, 1e6,
                           &r.high_freq_factor)))
            return st;
    }
    *out = r;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Target

static json_t *load_root(const char *json, size_t len, const char *label) {
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        ds_error_set(DS_ERR_FORMAT, "%s: malformed JSON at line %d column %d: %s", label,
                     err.line, err.column, err.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        ds_error_set(DS_ERR_FORMAT, "%s: expected a JSON object at the top, found %s", label,
                     json_kind(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

typedef enum ds_status (*parse_fn)(const struct src *s, void *cfg);

// Parses the text into a zeroed *cfg (size bytes) with fn; zeroes it again on failure.
static enum ds_status parse_json(const char *json, size_t len, const char *label, void *cfg,
                                 size_t size, parse_fn fn) {
    memset(cfg, 0, size);
    json_t *root = load_root(json, len, label);
    if (!root) return DS_ERR_FORMAT;
    struct src s = {label, "", root};
    enum ds_status st = fn(&s, cfg);
    if (st) memset(cfg, 0, size);
    json_decref(root);
    return st;
}

static enum ds_status parse_layer_types(const struct src *s, struct ds_target_config *c) {
    json_t *v = field(s, "layer_types");
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        c->layer_types[l] = (l % 2 == 0) ? DS_ATTN_SLIDING : DS_ATTN_FULL;
    if (!v) return DS_OK;
    if (!json_is_array(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: field 'layer_types' must be a list, found %s",
                            s->label, json_kind(v));
    if ((int64_t)json_array_size(v) != c->num_hidden_layers)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: field 'layer_types' has %zu entries, expected num_hidden_layers "
                            "= %lld",
                            s->label, json_array_size(v), (long long)c->num_hidden_layers);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *t = json_string_value(json_array_get(v, i));
        if (t && !strcmp(t, "sliding_attention")) {
            c->layer_types[i] = DS_ATTN_SLIDING;
        } else if (t && !strcmp(t, "full_attention")) {
            c->layer_types[i] = DS_ATTN_FULL;
        } else {
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: field 'layer_types[%zu]' must be \"sliding_attention\" or "
                                "\"full_attention\"",
                                s->label, i);
        }
    }
    return DS_OK;
}

// eos_token_id: an integer or a list of them.
static enum ds_status parse_eos(const struct src *s, struct ds_target_config *c) {
    json_t *v = field(s, "eos_token_id");
    if (!v) return DS_OK;
    if (!json_is_array(v)) {
        c->num_eos_token_ids = 1;
        return json_to_int(s, "eos_token_id", v, 0, DIM_MAX, &c->eos_token_ids[0]);
    }
    if (json_array_size(v) > DS_CONFIG_MAX_EOS)
        return ds_error_set(DS_ERR_FORMAT, "%s: field 'eos_token_id' lists %zu ids, at most %d",
                            s->label, json_array_size(v), DS_CONFIG_MAX_EOS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        enum ds_status st = json_to_int(s, "eos_token_id", json_array_get(v, i), 0, DIM_MAX,
                                        &c->eos_token_ids[i]);
        if (st) return st;
    }
    c->num_eos_token_ids = (int)json_array_size(v);
    return DS_OK;
}

static enum ds_status parse_target(const struct src *s, void *out) {
    struct ds_target_config *c = out;
    enum ds_status st;
    if ((st = get_architecture(s, "GptOssForCausalLM", c->architecture, sizeof c->architecture)))
        return st;
    if ((st = get_str(s, "model_type", "gpt_oss", c->model_type, sizeof c->model_type))) return st;
    if (strcmp(c->model_type, "gpt_oss"))
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "%s: field 'model_type' is \"%s\", expected \"gpt_oss\" (a gpt-oss "
                            "target)",
                            s->label, c->model_type);

    // Required dims.
    if ((st = get_int(s, "vocab_size", REQUIRED, 0, 1, DIM_MAX, &c->vocab_size))) return st;
    if ((st = get_int(s, "hidden_size", REQUIRED, 0, 1, DIM_MAX, &c->hidden_size))) return st;
    if ((st = get_int(s, "intermediate_size", REQUIRED, 0, 1, DIM_MAX, &c->intermediate_size)))
        return st;
    if ((st = get_int(s, "num_hidden_layers", REQUIRED, 0, 1, DS_CONFIG_MAX_LAYERS,
                      &c->num_hidden_layers)))
        return st;
    if ((st = get_int(s, "num_attention_heads", REQUIRED, 0, 1, SMALL_MAX,
                      &c->num_attention_heads)))
        return st;
    if ((st = get_int(s, "num_key_value_heads", REQUIRED, 0, 1, c->num_attention_heads,
                      &c->num_key_value_heads)))
        return st;
    if (c->num_attention_heads % c->num_key_value_heads)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: num_attention_heads %lld is not a multiple of "
                            "num_key_value_heads %lld",
                            s->label, (long long)c->num_attention_heads,
                            (long long)c->num_key_value_heads);
    if ((st = get_int(s, "head_dim", REQUIRED, 0, 1, SMALL_MAX, &c->head_dim))) return st;
    if ((st = get_int(s, "num_local_experts", REQUIRED, 0, 1, SMALL_MAX, &c->num_local_experts)))
        return st;
    // Older configs spell it experts_per_token (the original/ format's name).
    const char *k_key = field(s, "num_experts_per_tok") || !field(s, "experts_per_token")
                            ? "num_experts_per_tok"
                            : "experts_per_token";
    if ((st = get_int(s, k_key, REQUIRED, 0, 1, c->num_local_experts, &c->num_experts_per_tok)))
        return st;

    // Optional, with GptOssConfig's defaults.
    if ((st = get_int(s, "sliding_window", OPTIONAL, 128, 1, DIM_MAX, &c->sliding_window)))
        return st;
    if ((st = parse_layer_types(s, c))) return st;
    if ((st = get_int(s, "max_position_embeddings", OPTIONAL, 131072, 1, DIM_MAX,
                      &c->max_position_embeddings)))
        return st;
    if ((st = get_int(s, "initial_context_length", OPTIONAL, 0, 0, DIM_MAX,
                      &c->initial_context_length)))
        return st;
    c->rope = (struct ds_rope_config){
        .type = DS_ROPE_YARN,
        .theta = 150000.0,
        .factor = 32.0,
        .beta_fast = 32.0,
        .beta_slow = 1.0,
        .original_max_position_embeddings = 4096,
        .truncate = false,
    };
    if ((st = parse_rope(s, c->max_position_embeddings, 150000.0, &c->rope))) return st;
    if ((st = get_real(s, "rms_norm_eps", OPTIONAL, 1e-5, 0.0, 1.0, &c->rms_norm_eps))) return st;
    if ((st = get_real(s, "swiglu_limit", OPTIONAL, 7.0, 0.0, 1e30, &c->swiglu_limit))) return st;
    if ((st = get_real(s, "swiglu_alpha", OPTIONAL, 1.702, 0.0, 1e30, &c->swiglu_alpha)))
        return st;
    if ((st = parse_eos(s, c))) return st;
    if ((st = get_int(s, "pad_token_id", OPTIONAL, -1, 0, DIM_MAX, &c->pad_token_id))) return st;
    if ((st = get_int(s, "bos_token_id", OPTIONAL, -1, 0, DIM_MAX, &c->bos_token_id))) return st;
    if ((st = get_bool(s, "attention_bias", true, &c->attention_bias))) return st;
    if ((st = get_bool(s, "tie_word_embeddings", false, &c->tie_word_embeddings))) return st;
    // gpt-oss always has attention biases and its own lm_head; the model binds both.
    if (!c->attention_bias)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: field 'attention_bias' is false, expected "
                            "true (gpt-oss attention without biases is not supported)", s->label);
    if (c->tie_word_embeddings)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: field 'tie_word_embeddings' is true, "
                            "expected false (a gpt-oss lm_head tied to the embedding is not "
                            "supported)", s->label);

    json_t *quant = NULL;
    if ((st = get_object(s, "quantization_config", &quant))) return st;
    if (quant) {
        struct src q = {s->label, "quantization_config.", quant};
        char method[32];
        if ((st = get_str(&q, "quant_method", "", method, sizeof method))) return st;
        if (strcmp(method, "mxfp4"))
            return ds_error_set(DS_ERR_UNSUPPORTED,
                                "%s: field 'quantization_config.quant_method' is \"%s\", expected "
                                "\"mxfp4\" (or no quantization_config for BF16 experts)",
                                s->label, method);
        c->mxfp4 = true;
        // MXFP4 blocks are 32 elements along each expert matrix's input dim (H and I).
        if (c->hidden_size % 32 || c->intermediate_size % 32)
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: hidden_size %lld and intermediate_size %lld must be "
                                "multiples of 32 for MXFP4 experts",
                                s->label, (long long)c->hidden_size,
                                (long long)c->intermediate_size);
    }
    return DS_OK;
}

enum ds_status ds_target_config_parse(const char *json, size_t len, const char *label,
                                      struct ds_target_config *cfg_out) {
    return parse_json(json, len, label, cfg_out, sizeof *cfg_out, parse_target);
}

// ---------------------------------------------------------------------------------------------
// Draft

// ModelOpt keys that only an NVIDIA export carries inside eagle_config.
static const char *const modelopt_keys[] = {
    "use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm",
    "next_layer_regular", "parallel_draft_step", "norm_before_fc", "use_aux_hidden_state",
};

// A flag that may live at the top level or inside eagle_config; the top level wins.
static enum ds_status get_flag2(const struct src *top, const struct src *ec, const char *key,
                                bool def, bool *out, bool *in_ec_out) {
    if (in_ec_out) *in_ec_out = false;
    if (field(top, key)) return get_bool(top, key, def, out);
    if (field(ec, key)) {
        if (in_ec_out) *in_ec_out = true;
        return get_bool(ec, key, def, out);
    }
    *out = def;
    return DS_OK;
}

static enum ds_status parse_dtype(const struct src *s, const struct src *alt, enum ds_dtype *out) {
    char t[32];
    enum ds_status st;
    *out = DS_DTYPE_BF16;
    const struct src *from = field(s, "torch_dtype") ? s : alt;
    if ((st = get_str(from, "torch_dtype", "bfloat16", t, sizeof t))) return st;
    // float16 is refused here: the loader and the ops read bf16 and f32 weights only, so such a
    // draft passed inspect and then failed at load.
    if (!strcmp(t, "bfloat16")) {
        *out = DS_DTYPE_BF16;
    } else if (!strcmp(t, "float32")) {
        *out = DS_DTYPE_F32;
    } else {
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "%s: field '%storch_dtype' is \"%s\"; supported: bfloat16, float32",
                            from->label, from->path, t);
    }
    return DS_OK;
}

static enum ds_aux_convention config_convention(const struct ds_draft_config *d);

static enum ds_status parse_aux_ids(const struct src *s, const char *key, struct ds_draft_config *c,
                                    enum ds_aux_source source) {
    json_t *v = field(s, key);
    if (!v) return DS_OK;
    if (!json_is_array(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' must be a list, found %s", s->label,
                            s->path, key, json_kind(v));
    size_t n = json_array_size(v);
    if (n == 0) return DS_OK; // ModelOpt writes [] for "use the defaults"
    if (n > DS_AUX_MAX)
        return ds_error_set(DS_ERR_FORMAT, "%s: field '%s%s' lists %zu ids, at most %d", s->label,
                            s->path, key, n, DS_AUX_MAX);
    for (size_t i = 0; i < n; i++) {
        enum ds_status st =
            json_to_int(s, key, json_array_get(v, i), 0, DS_CONFIG_MAX_LAYERS, &c->aux_ids[i]);
        if (st) return st;
        if (i > 0 && c->aux_ids[i] <= c->aux_ids[i - 1])
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: field '%s%s' must be strictly ascending, found %lld after "
                                "%lld",
                                s->label, s->path, key, (long long)c->aux_ids[i],
                                (long long)c->aux_ids[i - 1]);
    }
    c->num_aux_ids = (int)n;
    c->aux_source = source;
    return DS_OK;
}

static enum ds_status parse_draft(const struct src *top, void *out) {
    struct ds_draft_config *c = out;
    enum ds_status st;
    json_t *ec_obj = NULL, *tlc = NULL;
    if ((st = get_object(top, "eagle_config", &ec_obj))) return st;
    if ((st = get_object(top, "transformer_layer_config", &tlc))) return st;
    struct src ec = {top->label, "eagle_config.", ec_obj};

    // Layout: decides where the layer fields live and the defaults below, nothing else.
    json_t *spec_type = field(top, "speculators_model_type");
    c->layout = DS_DRAFT_SPECFORGE;
    if (spec_type || tlc) {
        c->layout = DS_DRAFT_SPECULATORS;
        if (spec_type && (!json_is_string(spec_type) ||
                          strcmp(json_string_value(spec_type), "eagle3")))
            return ds_error_set(DS_ERR_UNSUPPORTED,
                                "%s: field 'speculators_model_type' must be \"eagle3\"",
                                top->label);
        if (!tlc) return missing(top, "transformer_layer_config");
    } else if (ec_obj) {
        for (size_t i = 0; i < sizeof modelopt_keys / sizeof modelopt_keys[0]; i++)
            if (field(&ec, modelopt_keys[i])) c->layout = DS_DRAFT_NVIDIA;
    }
    c->layer_names = c->layout == DS_DRAFT_SPECULATORS ? DS_DRAFT_NAMES_LAYERS0
                                                       : DS_DRAFT_NAMES_MIDLAYER;

    // The decoder layer's fields: the top level, or transformer_layer_config for speculators.
    struct src l = *top;
    if (c->layout == DS_DRAFT_SPECULATORS) {
        l.path = "transformer_layer_config.";
        l.obj = tlc;
    }
    if ((st = get_architecture(top, "LlamaForCausalLMEagle3", c->architecture,
                               sizeof c->architecture)))
        return st;
    if ((st = get_str(&l, "model_type", "llama", c->model_type, sizeof c->model_type))) return st;
    if ((st = get_int(&l, "hidden_size", REQUIRED, 0, 1, DIM_MAX, &c->hidden_size))) return st;
    if ((st = get_int(&l, "intermediate_size", REQUIRED, 0, 1, DIM_MAX, &c->intermediate_size)))
        return st;
    if ((st = get_int(&l, "num_attention_heads", REQUIRED, 0, 1, SMALL_MAX,
                      &c->num_attention_heads)))
        return st;
    if ((st = get_int(&l, "num_key_value_heads", OPTIONAL, c->num_attention_heads, 1,
                      c->num_attention_heads, &c->num_key_value_heads)))
        return st;
    if (c->num_attention_heads % c->num_key_value_heads)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: num_attention_heads %lld is not a multiple of "
                            "num_key_value_heads %lld",
                            top->label, (long long)c->num_attention_heads,
                            (long long)c->num_key_value_heads);
    if ((st = get_int(&l, "head_dim", OPTIONAL, c->hidden_size / c->num_attention_heads, 1,
                      SMALL_MAX, &c->head_dim)))
        return st;
    if (c->head_dim < 1)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: no head_dim and hidden_size %lld < num_attention_heads %lld",
                            top->label, (long long)c->hidden_size,
                            (long long)c->num_attention_heads);
    if ((st = get_int(&l, "num_hidden_layers", OPTIONAL, 1, 1, SMALL_MAX, &c->num_hidden_layers)))
        return st;
    if ((st = get_str(&l, "hidden_act", "silu", c->hidden_act, sizeof c->hidden_act))) return st;
    if ((st = get_real(&l, "rms_norm_eps", OPTIONAL, 1e-6, 0.0, 1.0, &c->rms_norm_eps))) return st;
    if ((st = get_int(&l, "max_position_embeddings", OPTIONAL, 2048, 1, DIM_MAX,
                      &c->max_position_embeddings)))
        return st;
    c->rope = (struct ds_rope_config){.type = DS_ROPE_DEFAULT, .theta = 10000.0, .factor = 1.0};
    if ((st = parse_rope(&l, c->max_position_embeddings, 10000.0, &c->rope))) return st;
    if ((st = get_bool(&l, "tie_word_embeddings", false, &c->tie_word_embeddings))) return st;
    if ((st = get_int(&l, "pad_token_id", OPTIONAL, -1, 0, DIM_MAX, &c->pad_token_id))) return st;
    if ((st = parse_dtype(top, &l, &c->weight_dtype))) return st;

    // Vocabulary: vocab_size is the target's; draft_vocab_size at the top level (both layouts).
    if ((st = get_int(&l, "vocab_size", REQUIRED, 0, 1, DIM_MAX, &c->vocab_size))) return st;
    const struct src *dv = field(top, "draft_vocab_size") ? top : &l;
    if ((st = get_int(dv, "draft_vocab_size", OPTIONAL, c->vocab_size, 1, c->vocab_size,
                      &c->draft_vocab_size)))
        return st;
    c->full_vocab_head = c->draft_vocab_size == c->vocab_size;

    // Input side and variant flags.
    const struct src *th = field(top, "target_hidden_size") ? top : &l;
    if ((st = get_int(th, "target_hidden_size", OPTIONAL, c->hidden_size, 1, DIM_MAX,
                      &c->target_hidden_size)))
        return st;
    if ((st = get_flag2(top, &ec, "use_aux_hidden_state", true, &c->use_aux_hidden_state, NULL)))
        return st;
    if ((st = get_flag2(top, &ec, "norm_before_fc", false, &c->norm_before_fc,
                        &c->norm_before_fc_in_eagle_config)))
        return st;
    if ((st = get_flag2(top, &ec, "fc_norm", false, &c->fc_norm, NULL))) return st;
    if ((st = get_flag2(top, &ec, "bias", false, &c->fc_bias, NULL))) return st;
    // vLLM reads a speculators config with norm_before_residual defaulting to true
    // (eagle3.md §2.4); SpecForge and ModelOpt heads default to the raw residual.
    if ((st = get_flag2(top, &ec, "norm_before_residual", c->layout == DS_DRAFT_SPECULATORS,
                        &c->norm_before_residual, NULL)))
        return st;
    if ((st = get_flag2(top, &ec, "norm_output", false, &c->norm_output, NULL))) return st;
    if (c->norm_before_fc && c->fc_norm)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: norm_before_fc and fc_norm are both true; they exclude each other",
                            top->label);

    // Aux ids: vLLM reads the top level first, then eagle_config; so do we.
    if ((st = parse_aux_ids(top, "eagle_aux_hidden_state_layer_ids", c, DS_AUX_SOURCE_TOP_LEVEL)))
        return st;
    if (!c->num_aux_ids &&
        (st = parse_aux_ids(&ec, "eagle_aux_hidden_state_layer_ids", c,
                            DS_AUX_SOURCE_EAGLE_CONFIG)))
        return st;
    c->aux_convention = config_convention(c);
    const char *ids_field = c->aux_source == DS_AUX_SOURCE_TOP_LEVEL
                                ? "eagle_aux_hidden_state_layer_ids"
                                : "eagle_config.eagle_aux_hidden_state_layer_ids";
    if (c->use_aux_hidden_state) {
        if (c->num_aux_ids && c->num_aux_ids != DS_AUX_COUNT)
            return ds_error_set(DS_ERR_FORMAT, "%s: field '%s' lists %d ids, expected %d",
                                top->label, ids_field, c->num_aux_ids, DS_AUX_COUNT);
    } else {
        if (c->num_aux_ids)
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: field '%s' lists %d ids, but use_aux_hidden_state is false "
                                "(a no-aux head takes none)",
                                top->label, ids_field, c->num_aux_ids);
        if (c->norm_before_fc || c->fc_norm)
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: norm_before_fc/fc_norm set, but use_aux_hidden_state is "
                                "false (a no-aux head has no fc)",
                                top->label);
    }
    return DS_OK;
}

enum ds_status ds_draft_config_parse(const char *json, size_t len, const char *label,
                                     struct ds_draft_config *cfg_out) {
    return parse_json(json, len, label, cfg_out, sizeof *cfg_out, parse_draft);
}

// ---------------------------------------------------------------------------------------------
// Files

static enum ds_status read_text_file(const char *path, char **buf_out, size_t *len_out) {
    *buf_out = NULL;
    *len_out = 0;
    enum ds_status st = DS_OK;
    char *buf = NULL;
    FILE *f;
    if ((st = ds_fopen_regular(path, &f))) return st;
    if (fseek(f, 0, SEEK_END) || ftell(f) < 0) {
        st = ds_error_set(DS_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        goto cleanup;
    }
    long size = ftell(f);
    if ((unsigned long)size > CONFIG_MAX_BYTES) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: %ld bytes, larger than any config.json (%u max)",
                          path, size, CONFIG_MAX_BYTES);
        goto cleanup;
    }
    rewind(f);
    buf = malloc((size_t)size + 1);
    if (!buf) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        st = ds_error_set(DS_ERR_IO, "%s: short read", path);
        goto cleanup;
    }
    buf[size] = '\0';
    *buf_out = buf;
    *len_out = (size_t)size;
    buf = NULL;
cleanup:
    free(buf);
    fclose(f);
    return st;
}

// Loads the file at `path` through `fn` (target or draft).
static enum ds_status load_file(const char *path, void *cfg, size_t size, parse_fn fn) {
    memset(cfg, 0, size);
    char *text = NULL;
    size_t len = 0;
    enum ds_status st = read_text_file(path, &text, &len);
    if (!st) st = parse_json(text, len, path, cfg, size, fn);
    free(text);
    return st;
}

// Loads DIR/config.json through `fn` (target or draft).
static enum ds_status load_config(const char *dir, void *cfg, size_t size, parse_fn fn) {
    memset(cfg, 0, size);
    // A file given for the directory (its config.json, say): said as that, not as
    // "DIR/config.json: Not a directory".
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return ds_error_set(DS_ERR_IO,
                            "%s: not a directory (a checkpoint is the directory holding its "
                            "config.json and safetensors files)",
                            dir);
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = malloc(n);
    if (!path) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(path, n, "%s/config.json", dir);
    enum ds_status st = load_file(path, cfg, size, fn);
    free(path);
    return st;
}

enum ds_status ds_target_config_load(const char *dir, struct ds_target_config *cfg_out) {
    return load_config(dir, cfg_out, sizeof *cfg_out, parse_target);
}

enum ds_status ds_target_config_load_file(const char *path, struct ds_target_config *cfg_out) {
    return load_file(path, cfg_out, sizeof *cfg_out, parse_target);
}

enum ds_status ds_draft_config_load(const char *dir, struct ds_draft_config *cfg_out) {
    return load_config(dir, cfg_out, sizeof *cfg_out, parse_draft);
}

// ---------------------------------------------------------------------------------------------
// Aux ids -> boundaries

int64_t ds_aux_boundary(int64_t id, enum ds_aux_convention c) {
    return c == DS_AUX_OUTPUT_OF ? id + 1 : id;
}

enum ds_status ds_aux_to_boundaries(const int64_t *ids, int n, enum ds_aux_convention c,
                                    int64_t num_layers, const char *label, const char *field_name,
                                    int64_t *boundaries_out) {
    for (int i = 0; i < n; i++) {
        int64_t b = ds_aux_boundary(ids[i], c);
        if (ids[i] < 0 || b < 0 || b > num_layers)
            return ds_error_set(DS_ERR_RANGE,
                                "%s: %s: id %lld names boundary %lld under the %s convention, "
                                "outside 0..%lld of the %lld-layer target",
                                label, field_name, (long long)ids[i], (long long)b,
                                ds_aux_convention_name(c), (long long)num_layers,
                                (long long)num_layers);
        if (i > 0 && b <= boundaries_out[i - 1])
            return ds_error_set(DS_ERR_RANGE,
                                "%s: %s: boundaries must be strictly ascending, found %lld after "
                                "%lld",
                                label, field_name, (long long)b,
                                (long long)boundaries_out[i - 1]);
        boundaries_out[i] = b;
    }
    return DS_OK;
}

void ds_aux_engine_default_ids(int64_t num_layers, int64_t ids_out[DS_AUX_COUNT]) {
    ids_out[0] = 2;
    ids_out[1] = num_layers / 2;
    ids_out[2] = num_layers - 3;
}

// The convention the config alone implies (stored as aux_convention when parsing).
static enum ds_aux_convention config_convention(const struct ds_draft_config *d) {
    if (d->num_aux_ids == 0 || d->aux_source == DS_AUX_SOURCE_TOP_LEVEL)
        return DS_AUX_CAPTURE_BEFORE;
    return d->norm_before_fc_in_eagle_config ? DS_AUX_BOUNDARY : DS_AUX_OUTPUT_OF;
}

enum ds_aux_convention ds_draft_default_convention(const struct ds_draft_config *d,
                                                   int64_t num_target_layers) {
    if (d->aux_convention != DS_AUX_OUTPUT_OF) return d->aux_convention;
    // An id equal to N cannot be a 0-based layer of an N-layer target: it is a boundary index.
    for (int i = 0; i < d->num_aux_ids; i++)
        if (num_target_layers > 0 && d->aux_ids[i] == num_target_layers) return DS_AUX_BOUNDARY;
    return DS_AUX_OUTPUT_OF;
}

enum ds_status ds_aux_plan(const struct ds_draft_config *d, int64_t num_target_layers,
                           const enum ds_aux_convention *convention, const char *label,
                           struct ds_aux_plan *plan_out) {
    memset(plan_out, 0, sizeof *plan_out);
    if (!d->use_aux_hidden_state) return DS_OK;
    struct ds_aux_plan p = {.n = DS_AUX_COUNT};
    const char *field_name;
    if (d->num_aux_ids) {
        p.n = d->num_aux_ids;
        memcpy(p.ids, d->aux_ids, sizeof p.ids);
        field_name = d->aux_source == DS_AUX_SOURCE_TOP_LEVEL
                         ? "eagle_aux_hidden_state_layer_ids"
                         : "eagle_config.eagle_aux_hidden_state_layer_ids";
    } else {
        ds_aux_engine_default_ids(num_target_layers, p.ids);
        p.ids_from_engine_default = true;
        field_name = "engine default aux ids {2, N/2, N-3}";
    }
    // Engines apply their defaults as capture-before ids whatever convention a user asks for.
    p.convention = convention && !p.ids_from_engine_default
                       ? *convention
                       : ds_draft_default_convention(d, num_target_layers);
    enum ds_status st = ds_aux_to_boundaries(p.ids, p.n, p.convention, num_target_layers, label,
                                             field_name, p.boundaries);
    if (st) return st;
    *plan_out = p;
    return DS_OK;
}
