// draftscope inspect: checks a gpt-oss target checkpoint (and optionally an EAGLE-3 draft against
// it) and prints what they contain.
//
// The report is built once as a JSON object (jansson); --json prints that object, the text form is
// printed from the same object, so both always say the same. Problems are collected, never
// fatal: every one is a line naming the file, the tensor or field, what was expected and what was
// found. Exit code: 0 = the pair is usable, 1 = problems found, 2 = usage.
//
// Nothing here reads tensor data except the draft's small d2t/t2d vectors, unless --scan-values
// asks for every float tensor and MXFP4 scale to be read for NaN and Inf (ds/values.h).
#include "ds/checkpoint.h"
#include "ds/cli.h"
#include "ds/config.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/safetensors.h"
#include "ds/values.h"

#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: draftscope inspect --target DIR [--draft DIR] [--scan-values] [--json]\n"
            "\n"
            "Checks a gpt-oss target checkpoint in the Hugging Face layout (config.json and\n"
            "model.safetensors.index.json + shards, or one model.safetensors) and, with --draft,\n"
            "an EAGLE-3 draft (SpecForge/lmsys, speculators or NVIDIA layout) against it.\n"
            "\n"
            "Target: architecture, layers and their attention type, experts, dims, parameters\n"
            "(total, and active per token excluding the embedding), bytes by dtype, MXFP4\n"
            "tensors; every tensor's presence, shape and dtype against config.json.\n"
            "Draft: the layout, hidden size against the target's, draft vocabulary, the d2t/t2d\n"
            "vocabulary map (every id inside the target vocabulary, t2d == d2t + arange), and the\n"
            "aux layer ids with the physical target boundaries (residual stream after b layers)\n"
            "they name under each convention: output-of (b = id+1), capture-before (b = id),\n"
            "boundary (b = id).\n"
            "Without --scan-values no tensor data is read but the draft's small d2t/t2d.\n"
            "\n"
            "options:\n"
            "  -t, --target DIR   the target checkpoint directory (required)\n"
            "  -d, --draft DIR    an EAGLE-3 draft checkpoint directory\n"
            "  -s, --scan-values  also read every float tensor (BF16, F16, F32, F64, F8) and\n"
            "                     every MXFP4 scale tensor of both checkpoints: any NaN or Inf,\n"
            "                     or an E8M0 scale of 0xFF (NaN), is a problem, one line per\n"
            "                     tensor (the MXFP4 codes hold no such value and are not\n"
            "                     read: 7.9 of gpt-oss-120b's 65.2 GB are; progress on stderr)\n"
            "  -j, --json         print the report as one JSON object\n"
            "  -h, --help         this text\n"
            "\n"
            "exit status: 0 the pair is usable, 1 problems were found (one line each), 2 usage\n");
}

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "draftscope inspect: %s%s%s\n", what, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "usage: draftscope inspect --target DIR [--draft DIR] [--scan-values] [--json]"
                    "   (--help for more)\n");
    return 2;
}

// ---------------------------------------------------------------------------------------------
// Report building

static json_t *int_array(const int64_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *rope_json(const struct ds_rope_config *r) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string(ds_rope_type_name(r->type)));
    json_object_set_new(o, "theta", json_real(r->theta));
    if (r->type == DS_ROPE_DEFAULT) return o;
    json_object_set_new(o, "factor", json_real(r->factor));
    if (r->type == DS_ROPE_YARN) {
        json_object_set_new(o, "beta_fast", json_real(r->beta_fast));
        json_object_set_new(o, "beta_slow", json_real(r->beta_slow));
        json_object_set_new(o, "truncate", json_boolean(r->truncate));
    }
    if (r->type != DS_ROPE_LINEAR)
        json_object_set_new(o, "original_max_position_embeddings",
                            json_integer(r->original_max_position_embeddings));
    return o;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static bool is_mxfp4(const struct ds_tensor_info *t) {
    return t->dtype == DS_DTYPE_U8 &&
           (ends_with(t->name, "_blocks") || ends_with(t->name, "_scales"));
}

// The name without "model.layers.<n>." so per-layer tensors collapse into one entry.
static const char *layer_suffix(const char *name) {
    const char *p = "model.layers.";
    if (strncmp(name, p, strlen(p))) return name;
    const char *dot = strchr(name + strlen(p), '.');
    return dot ? dot + 1 : name;
}

// Tensor count, bytes, bytes by dtype, files; parameters; MXFP4 tensors.
static void table_json(json_t *o, const ds_safetensors_t *st, int64_t experts, int64_t k) {
    uint64_t by_dtype[DS_DTYPE_COUNT] = {0}, mx_bytes = 0;
    int64_t mx_count = 0;
    json_t *mx_names = json_array();
    for (size_t i = 0; i < ds_safetensors_count(st); i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        if ((unsigned)t->dtype < DS_DTYPE_COUNT) by_dtype[t->dtype] += t->nbytes;
        if (!is_mxfp4(t)) continue;
        mx_count++;
        mx_bytes += t->nbytes;
        const char *suffix = layer_suffix(t->name);
        bool seen = false;
        for (size_t j = 0; j < json_array_size(mx_names); j++)
            seen = seen || !strcmp(json_string_value(json_array_get(mx_names, j)), suffix);
        if (!seen) json_array_append_new(mx_names, json_string(suffix));
    }
    json_object_set_new(o, "files", json_integer(ds_safetensors_file_count(st)));
    json_object_set_new(o, "tensors", json_integer((json_int_t)ds_safetensors_count(st)));
    json_object_set_new(o, "tensor_bytes",
                        json_integer((json_int_t)ds_safetensors_tensor_bytes(st)));
    json_t *bd = json_object();
    for (int d = 0; d < DS_DTYPE_COUNT; d++)
        if (by_dtype[d])
            json_object_set_new(bd, ds_dtype_name((enum ds_dtype)d),
                                json_integer((json_int_t)by_dtype[d]));
    json_object_set_new(o, "bytes_by_dtype", bd);

    struct ds_param_count pc;
    ds_param_count(st, experts, k, &pc);
    json_object_set_new(o, "parameters",
                        json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)pc.total,
                                  "active_per_token", (json_int_t)pc.active, "embedding",
                                  (json_int_t)pc.embedding, "expert", (json_int_t)pc.expert));
    if (mx_count)
        json_object_set_new(o, "mxfp4",
                            json_pack("{s:I, s:I, s:o}", "tensors", (json_int_t)mx_count, "bytes",
                                      (json_int_t)mx_bytes, "names", mx_names));
    else
        json_decref(mx_names);
}

static json_t *target_config_json(const struct ds_target_config *c) {
    json_t *o = json_object();
    json_object_set_new(o, "architecture", ds_cli_json_text(c->architecture));
    json_object_set_new(o, "model_type", ds_cli_json_text(c->model_type));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_t *lt = json_array();
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        json_array_append_new(lt, json_string(ds_attn_type_name(c->layer_types[l])));
    json_object_set_new(o, "layer_types", lt);
    json_object_set_new(o, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(o, "num_local_experts", json_integer(c->num_local_experts));
    json_object_set_new(o, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "rope", rope_json(&c->rope));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "swiglu_limit", json_real(c->swiglu_limit));
    json_object_set_new(o, "swiglu_alpha", json_real(c->swiglu_alpha));
    json_object_set_new(o, "experts_format", json_string(c->mxfp4 ? "mxfp4" : "bf16"));
    return o;
}

// The aux ids and, for every convention, the boundaries they name (or why they cannot).
static json_t *aux_json(const struct ds_draft_config *d, const struct ds_target_config *t,
                        const struct ds_pair_report *r, const char *label) {
    json_t *o = json_object();
    json_object_set_new(o, "use_aux_hidden_state", json_boolean(d->use_aux_hidden_state));
    if (!d->use_aux_hidden_state) return o;
    json_object_set_new(o, "ids", int_array(d->aux_ids, d->num_aux_ids));
    json_object_set_new(o, "source", json_string(ds_aux_source_name(d->aux_source)));
    if (!t) return o;
    json_object_set_new(o, "default_convention",
                        json_string(ds_aux_convention_name(
                            ds_draft_default_convention(d, t->num_hidden_layers))));
    json_object_set_new(o, "target_layers", json_integer(t->num_hidden_layers));
    if (r->aux_ok) {
        json_object_set_new(o, "ids_used", int_array(r->aux.ids, r->aux.n));
        json_object_set_new(o, "ids_from_engine_default",
                            json_boolean(r->aux.ids_from_engine_default));
        json_object_set_new(o, "boundaries", int_array(r->aux.boundaries, r->aux.n));
    }
    json_t *by = json_object();
    for (int c = 0; c < DS_AUX_CONVENTION_COUNT; c++) {
        enum ds_aux_convention conv = (enum ds_aux_convention)c;
        struct ds_aux_plan p;
        if (ds_aux_plan(d, t->num_hidden_layers, &conv, label, &p) == DS_OK)
            json_object_set_new(by, ds_aux_convention_name(conv), int_array(p.boundaries, p.n));
        else
            json_object_set_new(by, ds_aux_convention_name(conv),
                                ds_cli_json_text(ds_error_last()));
    }
    ds_error_clear();
    json_object_set_new(o, "boundaries_by_convention", by);
    return o;
}

static json_t *draft_config_json(const struct ds_draft_config *d) {
    json_t *o = json_object();
    json_object_set_new(o, "layout", json_string(ds_draft_layout_name(d->layout)));
    json_object_set_new(o, "architecture", ds_cli_json_text(d->architecture));
    json_object_set_new(o, "hidden_size", json_integer(d->hidden_size));
    json_object_set_new(o, "target_hidden_size", json_integer(d->target_hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(d->intermediate_size));
    json_object_set_new(o, "num_attention_heads", json_integer(d->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(d->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(d->head_dim));
    json_object_set_new(o, "vocab_size", json_integer(d->vocab_size));
    json_object_set_new(o, "draft_vocab_size", json_integer(d->draft_vocab_size));
    json_object_set_new(o, "full_vocab_head", json_boolean(d->full_vocab_head));
    json_object_set_new(o, "max_position_embeddings", json_integer(d->max_position_embeddings));
    json_object_set_new(o, "rope", rope_json(&d->rope));
    json_object_set_new(o, "norm_before_fc", json_boolean(d->norm_before_fc));
    json_object_set_new(o, "fc_norm", json_boolean(d->fc_norm));
    json_object_set_new(o, "norm_before_residual", json_boolean(d->norm_before_residual));
    json_object_set_new(o, "norm_output", json_boolean(d->norm_output));
    return o;
}

struct inspect {
    const char *target_dir, *draft_dir;
    struct ds_target_config target;
    struct ds_draft_config draft;
    bool target_cfg_ok, draft_cfg_ok;
    ds_safetensors_t *target_st, *draft_st;
    struct ds_problems problems;
    bool scan;
};

// --scan-values over one checkpoint: its problems join the report's, its counts go to o.values.
static void scan_values(struct inspect *in, json_t *o, const ds_safetensors_t *st,
                        const char *what) {
    struct ds_value_scan v;
    char label[64];
    snprintf(label, sizeof label, "scanning the %s's values", what);
    struct ds_cli_bytes_progress p = {.label = label, .t0 = ds_cli_now_s()};
    const enum ds_status s = ds_values_scan(st, &v, ds_cli_bytes_progress, &p, &in->problems);
    ds_cli_bytes_progress_end(&p);
    if (s != DS_OK && s != DS_ERR_MISMATCH) ds_problems_add(&in->problems, "%s", ds_error_last());
    const double secs = ds_cli_now_s() - p.t0;
    json_object_set_new(o, "values",
                        json_pack("{s:I, s:I, s:f, s:I, s:I, s:I, s:I}", "tensors",
                                  (json_int_t)v.tensors, "bytes", (json_int_t)v.bytes, "seconds",
                                  secs, "bad_tensors", (json_int_t)v.bad_tensors, "nan",
                                  (json_int_t)v.nan, "inf", (json_int_t)v.inf, "nan_scales",
                                  (json_int_t)v.nan_scales));
    // What the finite values span (null where there is nothing to say).
    json_t *vo = json_object_get(o, "values");
    const struct ds_tensor_info *mt =
        v.max_abs_tensor >= 0 ? ds_safetensors_at(st, (size_t)v.max_abs_tensor) : NULL;
    const struct ds_tensor_info *zt =
        v.first_zero_tensor >= 0 ? ds_safetensors_at(st, (size_t)v.first_zero_tensor) : NULL;
    json_object_set_new(vo, "max_abs", mt ? json_real(v.max_abs) : json_null());
    json_object_set_new(vo, "max_abs_tensor", mt ? ds_cli_json_text(mt->name) : json_null());
    json_object_set_new(vo, "zero_tensors", json_integer((json_int_t)v.zero_tensors));
    json_object_set_new(vo, "first_zero_tensor", zt ? ds_cli_json_text(zt->name) : json_null());
    const bool sc = v.scale_min != INT32_MIN;
    json_object_set_new(vo, "scale_exponent_min", sc ? json_integer(v.scale_min) : json_null());
    json_object_set_new(vo, "scale_exponent_max", sc ? json_integer(v.scale_max) : json_null());
}

static json_t *inspect_target(struct inspect *in) {
    json_t *o = json_object();
    char label[4096];
    snprintf(label, sizeof label, "%s/config.json", in->target_dir);
    json_object_set_new(o, "dir", ds_cli_json_text(in->target_dir));
    if (ds_target_config_load(in->target_dir, &in->target) == DS_OK) {
        in->target_cfg_ok = true;
        json_object_update_new(o, target_config_json(&in->target));
        // The loader's own refusals, so that "usable" means it loads.
        ds_gptoss_check_config(&in->target, label, &in->problems);
    } else {
        ds_problems_add(&in->problems, "%s", ds_error_last());
    }
    if (ds_safetensors_open_dir(in->target_dir, &in->target_st) != DS_OK) {
        ds_problems_add(&in->problems, "%s", ds_error_last());
        return o;
    }
    table_json(o, in->target_st, in->target.num_local_experts, in->target.num_experts_per_tok);
    if (in->target_cfg_ok)
        ds_checkpoint_check_target(&in->target, in->target_st, in->target_dir, &in->problems);
    if (in->scan) scan_values(in, o, in->target_st, "target");
    return o;
}

static json_t *inspect_draft(struct inspect *in) {
    json_t *o = json_object();
    char label[4096];
    snprintf(label, sizeof label, "%s/config.json", in->draft_dir);
    json_object_set_new(o, "dir", ds_cli_json_text(in->draft_dir));
    if (ds_draft_config_load(in->draft_dir, &in->draft) == DS_OK) {
        in->draft_cfg_ok = true;
        ds_eagle3_check_config(&in->draft, label, &in->problems);
    } else {
        ds_problems_add(&in->problems, "%s", ds_error_last());
    }
    if (ds_safetensors_open_dir(in->draft_dir, &in->draft_st) != DS_OK)
        ds_problems_add(&in->problems, "%s", ds_error_last());
    if (in->scan && in->draft_st) scan_values(in, o, in->draft_st, "draft");
    if (!in->draft_cfg_ok) return o;

    if (in->draft_st) {
        ds_checkpoint_check_draft(&in->draft, in->draft_st, in->draft_dir, &in->problems);
        table_json(o, in->draft_st, 0, 0);
    }
    json_object_update_missing_new(o, draft_config_json(&in->draft));
    json_object_set_new(o, "layer_names",
                        json_string(ds_draft_names_prefix(in->draft.layer_names)));
    json_object_set_new(o, "embed_tokens", json_boolean(in->draft.has_embed_tokens));
    json_object_set_new(o, "lm_head_from_target", json_boolean(in->draft.lm_head_from_target));

    struct ds_pair_report r = {0};
    const struct ds_target_config *t = in->target_cfg_ok ? &in->target : NULL;
    if (t && in->draft_st) {
        ds_checkpoint_check_pair(t, &in->draft, in->draft_st, in->draft_dir, &r, &in->problems);
        json_object_set_new(o, "target_hidden_size_expected", json_integer(t->hidden_size));
        json_object_set_new(o, "vocab_map",
                            json_pack("{s:b, s:I, s:I, s:b}", "checked", r.vocab_map_checked,
                                      "d2t_out_of_range", (json_int_t)r.d2t_out_of_range,
                                      "t2d_set", (json_int_t)r.t2d_set, "t2d_consistent",
                                      r.t2d_consistent));
    }
    json_object_set_new(o, "aux", aux_json(&in->draft, t, &r, label));
    return o;
}

// ---------------------------------------------------------------------------------------------
// Text output (from the JSON report)

static long long jint(const json_t *o, const char *key) {
    return (long long)json_integer_value(json_object_get(o, key));
}

static const char *jstr(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

static const char *yes_no(const json_t *o, const char *key) {
    return json_is_true(json_object_get(o, key)) ? "yes" : "no";
}

static void print_ints(FILE *f, const json_t *a) {
    fputc('[', f);
    for (size_t i = 0; i < json_array_size(a); i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)json_integer_value(json_array_get(a, i)));
    fputc(']', f);
}

static void print_rope(FILE *f, const json_t *r) {
    fprintf(f, "%s theta %g", jstr(r, "type"), json_number_value(json_object_get(r, "theta")));
    if (json_object_get(r, "factor"))
        fprintf(f, " factor %g", json_number_value(json_object_get(r, "factor")));
    if (json_object_get(r, "beta_fast"))
        fprintf(f, " beta %g/%g truncate %s", json_number_value(json_object_get(r, "beta_fast")),
                json_number_value(json_object_get(r, "beta_slow")), yes_no(r, "truncate"));
    if (json_object_get(r, "original_max_position_embeddings"))
        fprintf(f, " original context %lld", jint(r, "original_max_position_embeddings"));
}

// "116.8 B", "307.6 M", "86.5 K": one decimal, as model cards write parameter counts.
static const char *human(char *buf, size_t cap, long long n) {
    static const struct {
        double scale;
        const char *unit;
    } units[] = {{1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if ((double)n >= units[i].scale) {
            snprintf(buf, cap, "%.1f %s", (double)n / units[i].scale, units[i].unit);
            return buf;
        }
    }
    snprintf(buf, cap, "%lld", n);
    return buf;
}

static void print_table(FILE *f, const json_t *o) {
    if (!json_object_get(o, "tensors")) return;
    const json_t *p = json_object_get(o, "parameters");
    char h[32];
    fprintf(f, "  %-16s %s total (%lld)", "parameters", human(h, sizeof h, jint(p, "total")),
            jint(p, "total"));
    if (jint(p, "expert"))
        fprintf(f, "; %s active per token excluding the embedding (%lld)",
                human(h, sizeof h, jint(p, "active_per_token")), jint(p, "active_per_token"));
    fprintf(f, "\n  %-16s %lld in %lld file(s), %lld bytes:", "tensors", jint(o, "tensors"),
            jint(o, "files"), jint(o, "tensor_bytes"));
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(o, "bytes_by_dtype"), key, v)
        fprintf(f, " %s %lld", key, (long long)json_integer_value(v));
    fputc('\n', f);
    const json_t *mx = json_object_get(o, "mxfp4");
    if (mx) {
        fprintf(f, "  %-16s %lld tensors, %lld bytes:", "MXFP4", jint(mx, "tensors"),
                jint(mx, "bytes"));
        const json_t *names = json_object_get(mx, "names");
        for (size_t i = 0; i < json_array_size(names); i++)
            fprintf(f, " %s", json_string_value(json_array_get(names, i)));
        fprintf(f, " (per layer)\n");
    }
    const json_t *vals = json_object_get(o, "values");
    if (vals) {
        const double secs = json_real_value(json_object_get(vals, "seconds"));
        fprintf(f, "  %-16s %lld tensors, %lld bytes read in %.1f s (%.2f GB/s): ", "values",
                jint(vals, "tensors"), jint(vals, "bytes"), secs,
                secs > 0 ? (double)jint(vals, "bytes") / 1e9 / secs : 0.0);
        if (jint(vals, "bad_tensors"))
            fprintf(f, "%lld tensors hold %lld NaN, %lld Inf, %lld NaN scales\n",
                    jint(vals, "bad_tensors"), jint(vals, "nan"), jint(vals, "inf"),
                    jint(vals, "nan_scales"));
        else
            fprintf(f, "no NaN, no Inf, no NaN scale\n");
        const json_t *mx_t = json_object_get(vals, "max_abs_tensor");
        fprintf(f, "  %-16s ", "value range");
        if (json_is_string(mx_t))
            fprintf(f, "largest |x| %.4g (%s)",
                    json_real_value(json_object_get(vals, "max_abs")), json_string_value(mx_t));
        else
            fprintf(f, "no finite float value");
        if (json_is_integer(json_object_get(vals, "scale_exponent_min")))
            fprintf(f, "; MXFP4 scales 2^%lld .. 2^%lld", jint(vals, "scale_exponent_min"),
                    jint(vals, "scale_exponent_max"));
        const long long nz = jint(vals, "zero_tensors");
        if (nz)
            fprintf(f, "; %lld all-zero tensor%s (the first: %s)\n", nz, nz == 1 ? "" : "s",
                    json_string_value(json_object_get(vals, "first_zero_tensor")));
        else
            fprintf(f, "; no all-zero tensor\n");
    }
}

static void print_target(FILE *f, const json_t *t) {
    fprintf(f, "target %s\n", jstr(t, "dir"));
    if (json_object_get(t, "architecture")) {
        fprintf(f, "  %-16s %s (%s), %s experts\n", "architecture", jstr(t, "architecture"),
                jstr(t, "model_type"), jstr(t, "experts_format"));
        const json_t *lt = json_object_get(t, "layer_types");
        size_t n_sliding = 0;
        for (size_t i = 0; i < json_array_size(lt); i++)
            n_sliding += !strcmp(json_string_value(json_array_get(lt, i)), "sliding_attention");
        fprintf(f, "  %-16s %lld: %zu sliding (window %lld), %zu full; ", "layers",
                jint(t, "num_hidden_layers"), n_sliding, jint(t, "sliding_window"),
                json_array_size(lt) - n_sliding);
        for (size_t i = 0; i < json_array_size(lt); i++)
            fputc(json_string_value(json_array_get(lt, i))[0] == 's' ? 'S' : 'F', f);
        fprintf(f, "\n  %-16s %lld, %lld per token\n", "experts", jint(t, "num_local_experts"),
                jint(t, "num_experts_per_tok"));
        fprintf(f,
                "  %-16s hidden %lld, intermediate %lld, heads %lld (kv %lld) x head_dim %lld, "
                "vocab %lld\n",
                "dims", jint(t, "hidden_size"), jint(t, "intermediate_size"),
                jint(t, "num_attention_heads"), jint(t, "num_key_value_heads"),
                jint(t, "head_dim"), jint(t, "vocab_size"));
        fprintf(f, "  %-16s ", "rope");
        print_rope(f, json_object_get(t, "rope"));
        fprintf(f, "; max positions %lld\n", jint(t, "max_position_embeddings"));
    }
    print_table(f, t);
}

static void print_draft(FILE *f, const json_t *d) {
    fprintf(f, "draft %s\n", jstr(d, "dir"));
    if (!json_object_get(d, "layout")) return;
    fprintf(f, "  %-16s %s (%s), layer tensors %s*, embed_tokens %s, lm_head %s\n", "layout",
            jstr(d, "layout"), jstr(d, "architecture"), jstr(d, "layer_names"),
            json_is_true(json_object_get(d, "embed_tokens")) ? "own" : "the target's",
            json_is_true(json_object_get(d, "lm_head_from_target")) ? "the target's" : "own");
    fprintf(f, "  %-16s %lld", "hidden", jint(d, "hidden_size"));
    if (json_object_get(d, "target_hidden_size_expected"))
        fprintf(f, " (target %lld)", jint(d, "target_hidden_size_expected"));
    fprintf(f, "; fc input %d x target_hidden_size %lld\n", DS_AUX_COUNT,
            jint(d, "target_hidden_size"));
    fprintf(f, "  %-16s draft %lld of target %lld%s", "vocabulary", jint(d, "draft_vocab_size"),
            jint(d, "vocab_size"),
            json_is_true(json_object_get(d, "full_vocab_head")) ? " (full vocabulary)" : "");
    const json_t *vm = json_object_get(d, "vocab_map");
    if (vm && json_is_true(json_object_get(vm, "checked")))
        fprintf(f, "; d2t: %lld ids outside the target vocabulary; t2d: %lld set, %s",
                jint(vm, "d2t_out_of_range"), jint(vm, "t2d_set"),
                json_is_true(json_object_get(vm, "t2d_consistent")) ? "consistent with d2t"
                                                                    : "INCONSISTENT with d2t");
    fprintf(f, "\n  %-16s norm_before_fc %s, fc_norm %s, norm_before_residual %s, "
               "norm_output %s\n",
            "variants", yes_no(d, "norm_before_fc"), yes_no(d, "fc_norm"),
            yes_no(d, "norm_before_residual"), yes_no(d, "norm_output"));
    fprintf(f, "  %-16s ", "rope");
    print_rope(f, json_object_get(d, "rope"));
    fprintf(f, "; max positions %lld\n", jint(d, "max_position_embeddings"));
    print_table(f, d);

    const json_t *a = json_object_get(d, "aux");
    if (!json_is_true(json_object_get(a, "use_aux_hidden_state"))) {
        fprintf(f, "  %-16s none: fed the target's final post-norm hidden state (no fc)\n",
                "aux states");
        return;
    }
    fprintf(f, "  %-16s ", "aux ids");
    print_ints(f, json_object_get(a, "ids"));
    fprintf(f, " from %s", jstr(a, "source"));
    if (json_is_true(json_object_get(a, "ids_from_engine_default"))) {
        fprintf(f, "; engine defaults ");
        print_ints(f, json_object_get(a, "ids_used"));
    }
    if (json_object_get(a, "default_convention"))
        fprintf(f, "; default convention %s", jstr(a, "default_convention"));
    fputc('\n', f);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(a, "boundaries_by_convention"), key, v) {
        fprintf(f, "  %-16s %-15s -> ", "", key);
        if (json_is_array(v)) {
            fprintf(f, "boundaries ");
            print_ints(f, v);
            if (!strcmp(key, jstr(a, "default_convention"))) fprintf(f, "   <- default");
        } else {
            fprintf(f, "out of range");
        }
        fputc('\n', f);
    }
}

static void print_text(FILE *f, const json_t *report) {
    print_target(f, json_object_get(report, "target"));
    if (json_object_get(report, "draft")) print_draft(f, json_object_get(report, "draft"));
    const json_t *p = json_object_get(report, "problems");
    if (json_array_size(p)) {
        fprintf(f, "problems (%zu):\n", json_array_size(p));
        for (size_t i = 0; i < json_array_size(p); i++)
            fprintf(f, "  %s\n", json_string_value(json_array_get(p, i)));
    }
    fprintf(f, "%s\n", json_is_true(json_object_get(report, "usable"))
                           ? "ok: no problems found"
                           : "NOT USABLE: problems found");
}

// ---------------------------------------------------------------------------------------------

int ds_cmd_inspect(int argc, char **argv) {
    static const struct option long_opts[] = {
        {"target", required_argument, NULL, 't'},
        {"draft", required_argument, NULL, 'd'},
        {"json", no_argument, NULL, 'j'},
        {"scan-values", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct inspect in = {0};
    bool as_json = false;
    optind = 0; // full re-initialisation: the command may run more than once in one process
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "t:d:jsh", long_opts, NULL)) != -1;) {
        switch (c) {
        case 't': in.target_dir = optarg; break;
        case 'd': in.draft_dir = optarg; break;
        case 'j': as_json = true; break;
        case 's': in.scan = true; break;
        case 'h': usage(stdout); return 0;
        default:
            return usage_error("unknown option or missing value", argv[optind - 1]);
        }
    }
    if (optind < argc) return usage_error("unexpected argument", argv[optind]);
    if (!in.target_dir) return usage_error("--target DIR is required", NULL);

    json_t *report = json_object();
    json_object_set_new(report, "target", inspect_target(&in));
    if (in.draft_dir) json_object_set_new(report, "draft", inspect_draft(&in));
    json_t *problems = json_array();
    for (size_t i = 0; i < in.problems.count; i++)
        json_array_append_new(problems, ds_cli_json_text(in.problems.lines[i]));
    json_object_set_new(report, "problems", problems);
    json_object_set_new(report, "usable", json_boolean(in.problems.count == 0));

    if (as_json) {
        json_dumpf(report, stdout, JSON_INDENT(2) | JSON_ENSURE_ASCII);
        fputc('\n', stdout);
    } else {
        print_text(stdout, report);
    }
    fflush(stdout);
    int rc = in.problems.count ? 1 : 0;
    json_decref(report);
    ds_problems_free(&in.problems);
    ds_safetensors_close(in.target_st);
    ds_safetensors_close(in.draft_st);
    return rc;
}
