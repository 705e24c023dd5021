// Tensor-table checks of target and draft checkpoints against their configs, the draft-target
// pair check (vocabulary map, hidden sizes, aux ids) and parameter counts (ds/checkpoint.h).
//
// The expected table is built once per check as a sorted array of specs; the checkpoint's own
// table (sorted by name in ds_safetensors) is then walked once against it with bsearch, so a
// 687-tensor 120b table costs microseconds.
#include "ds/checkpoint.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Lines per kind of problem before the rest is summarised (a wrong directory would otherwise
// print every tensor it holds).
#define MAX_LINES_PER_KIND 32

// ---------------------------------------------------------------------------------------------
// Problems

enum ds_status ds_problems_add(struct ds_problems *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return DS_ERR_ARG;
    if (p->count == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        char **lines = realloc(p->lines, cap * sizeof *lines);
        if (!lines) return ds_error_set(DS_ERR_NOMEM, "out of memory for the problem list");
        p->lines = lines;
        p->cap = cap;
    }
    char *line = malloc((size_t)n + 1);
    if (!line) return ds_error_set(DS_ERR_NOMEM, "out of memory for the problem list");
    va_start(ap, fmt);
    vsnprintf(line, (size_t)n + 1, fmt, ap);
    va_end(ap);
    p->lines[p->count++] = line;
    return DS_OK;
}

void ds_problems_free(struct ds_problems *p) {
    for (size_t i = 0; i < p->count; i++) free(p->lines[i]);
    free(p->lines);
    memset(p, 0, sizeof *p);
}

enum ds_status ds_problems_error(enum ds_status s, const struct ds_problems *p, size_t from) {
    if (p->count <= from) return s;
    if (p->count - from == 1) return ds_error_set(s, "%s", p->lines[from]);
    return ds_error_set(s, "%s (and %zu more problems)", p->lines[from], p->count - from - 1);
}

// The status a check returns: DS_OK if it added nothing, else DS_ERR_MISMATCH with the first
// added line as the thread's error message.
static enum ds_status check_result(const struct ds_problems *p, size_t before) {
    if (p->count == before) return DS_OK;
    return ds_error_set(DS_ERR_MISMATCH, "%s", p->lines[before]);
}

// ---------------------------------------------------------------------------------------------
// Expected tables

struct spec_list {
    struct ds_tensor_spec *v;
    size_t n, cap;
    bool oom;
};

static void add_spec(struct spec_list *l, enum ds_dtype dtype, bool optional, int ndim,
                     const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void add_spec(struct spec_list *l, enum ds_dtype dtype, bool optional, int ndim,
                     const int64_t *shape, const char *fmt, ...) {
    if (l->oom) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct ds_tensor_spec *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    struct ds_tensor_spec *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->dtype = dtype;
    s->optional = optional;
    s->ndim = ndim;
    memcpy(s->shape, shape, (size_t)ndim * sizeof *shape);
}

// Shorthands: a required/optional tensor of 1..4 dims.
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define REQ(l, dt, name_fmt, ...) add_spec(l, dt, false, NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__), \
                                           "%s", name_fmt)

static int spec_cmp(const void *a, const void *b) {
    return strcmp(((const struct ds_tensor_spec *)a)->name,
                  ((const struct ds_tensor_spec *)b)->name);
}

static enum ds_status finish_specs(struct spec_list *l, struct ds_tensor_spec **specs_out,
                                   size_t *count_out) {
    if (l->oom) {
        free(l->v);
        return ds_error_set(DS_ERR_NOMEM, "out of memory for the expected tensor table");
    }
    qsort(l->v, l->n, sizeof *l->v, spec_cmp);
    *specs_out = l->v;
    *count_out = l->n;
    return DS_OK;
}

enum ds_status ds_target_expected_tensors(const struct ds_target_config *c,
                                          struct ds_tensor_spec **specs_out, size_t *count_out) {
    *specs_out = NULL;
    *count_out = 0;
    struct spec_list l = {0};
    const enum ds_dtype bf = DS_DTYPE_BF16, u8 = DS_DTYPE_U8;
    const int64_t H = c->hidden_size, I = c->intermediate_size, E = c->num_local_experts;
    const int64_t q = c->num_attention_heads * c->head_dim;
    const int64_t kv = c->num_key_value_heads * c->head_dim;
    char p[48];
    for (int64_t layer = 0; layer < c->num_hidden_layers; layer++) {
        snprintf(p, sizeof p, "model.layers.%" PRId64 ".", layer);
        add_spec(&l, bf, false, 1, SHAPE(H), "%sinput_layernorm.weight", p);
        add_spec(&l, bf, false, 2, SHAPE(q, H), "%sself_attn.q_proj.weight", p);
        add_spec(&l, bf, false, 2, SHAPE(kv, H), "%sself_attn.k_proj.weight", p);
        add_spec(&l, bf, false, 2, SHAPE(kv, H), "%sself_attn.v_proj.weight", p);
        add_spec(&l, bf, false, 2, SHAPE(H, q), "%sself_attn.o_proj.weight", p);
        // Always present: the config parser refuses attention_bias false (gptoss.c binds them).
        add_spec(&l, bf, false, 1, SHAPE(q), "%sself_attn.q_proj.bias", p);
        add_spec(&l, bf, false, 1, SHAPE(kv), "%sself_attn.k_proj.bias", p);
        add_spec(&l, bf, false, 1, SHAPE(kv), "%sself_attn.v_proj.bias", p);
        add_spec(&l, bf, false, 1, SHAPE(H), "%sself_attn.o_proj.bias", p);
        add_spec(&l, bf, false, 1, SHAPE(c->num_attention_heads), "%sself_attn.sinks", p);
        add_spec(&l, bf, false, 1, SHAPE(H), "%spost_attention_layernorm.weight", p);
        add_spec(&l, bf, false, 2, SHAPE(E, H), "%smlp.router.weight", p);
        add_spec(&l, bf, false, 1, SHAPE(E), "%smlp.router.bias", p);
        if (c->mxfp4) {
            // Blocks of 32 along the input dim: 16 bytes of codes + one E8M0 scale byte each.
            add_spec(&l, u8, false, 4, SHAPE(E, 2 * I, H / 32, 16),
                     "%smlp.experts.gate_up_proj_blocks", p);
            add_spec(&l, u8, false, 3, SHAPE(E, 2 * I, H / 32), "%smlp.experts.gate_up_proj_scales",
                     p);
            add_spec(&l, u8, false, 4, SHAPE(E, H, I / 32, 16), "%smlp.experts.down_proj_blocks",
                     p);
            add_spec(&l, u8, false, 3, SHAPE(E, H, I / 32), "%smlp.experts.down_proj_scales", p);
        } else {
            // transformers' dequantized layout: [E, in, out].
            add_spec(&l, bf, false, 3, SHAPE(E, H, 2 * I), "%smlp.experts.gate_up_proj", p);
            add_spec(&l, bf, false, 3, SHAPE(E, I, H), "%smlp.experts.down_proj", p);
        }
        add_spec(&l, bf, false, 2, SHAPE(E, 2 * I), "%smlp.experts.gate_up_proj_bias", p);
        add_spec(&l, bf, false, 2, SHAPE(E, H), "%smlp.experts.down_proj_bias", p);
    }
    REQ(&l, bf, "model.embed_tokens.weight", c->vocab_size, H);
    REQ(&l, bf, "model.norm.weight", H);
    REQ(&l, bf, "lm_head.weight", c->vocab_size, H); // tied embeddings are refused by the parser
    return finish_specs(&l, specs_out, count_out);
}

enum ds_status ds_draft_expected_tensors(const struct ds_draft_config *c,
                                         struct ds_tensor_spec **specs_out, size_t *count_out) {
    *specs_out = NULL;
    *count_out = 0;
    struct spec_list l = {0};
    const enum ds_dtype w = c->weight_dtype;
    const int64_t H = c->hidden_size, I = c->intermediate_size, Ht = c->target_hidden_size;
    const int64_t q = c->num_attention_heads * c->head_dim;
    const int64_t kv = c->num_key_value_heads * c->head_dim;
    const char *p = ds_draft_names_prefix(c->layer_names);

    if (c->use_aux_hidden_state) {
        REQ(&l, w, "fc.weight", H, DS_AUX_COUNT * Ht);
        if (c->fc_bias) REQ(&l, w, "fc.bias", H);
        if (c->norm_before_fc) REQ(&l, w, "input_norm.weight", DS_AUX_COUNT * Ht);
        for (int i = 0; c->fc_norm && i < DS_AUX_COUNT; i++)
            add_spec(&l, w, false, 1, SHAPE(Ht), "fc_norm.%d.weight", i);
    }
    add_spec(&l, w, false, 1, SHAPE(H), "%shidden_norm.weight", p);
    add_spec(&l, w, false, 1, SHAPE(H), "%sinput_layernorm.weight", p);
    add_spec(&l, w, false, 1, SHAPE(H), "%spost_attention_layernorm.weight", p);
    // The attention input is [norm(embed) | norm(hidden)], 2H wide.
    add_spec(&l, w, false, 2, SHAPE(q, 2 * H), "%sself_attn.q_proj.weight", p);
    add_spec(&l, w, false, 2, SHAPE(kv, 2 * H), "%sself_attn.k_proj.weight", p);
    add_spec(&l, w, false, 2, SHAPE(kv, 2 * H), "%sself_attn.v_proj.weight", p);
    add_spec(&l, w, false, 2, SHAPE(H, q), "%sself_attn.o_proj.weight", p);
    add_spec(&l, w, false, 2, SHAPE(I, H), "%smlp.gate_proj.weight", p);
    add_spec(&l, w, false, 2, SHAPE(I, H), "%smlp.up_proj.weight", p);
    add_spec(&l, w, false, 2, SHAPE(H, I), "%smlp.down_proj.weight", p);
    REQ(&l, w, "norm.weight", H);
    add_spec(&l, w, c->full_vocab_head, 2, SHAPE(c->draft_vocab_size, H), "lm_head.weight");
    add_spec(&l, DS_DTYPE_I64, c->full_vocab_head, 1, SHAPE(c->draft_vocab_size), "d2t");
    add_spec(&l, DS_DTYPE_BOOL, c->full_vocab_head, 1, SHAPE(c->vocab_size), "t2d");
    add_spec(&l, w, true, 2, SHAPE(c->vocab_size, H), "embed_tokens.weight");
    return finish_specs(&l, specs_out, count_out);
}

// ---------------------------------------------------------------------------------------------
// Table check

// "[a, b, c]" into buf.
static const char *fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

static const char *tensor_file(const ds_safetensors_t *st, const struct ds_tensor_info *t) {
    const char *f = ds_safetensors_file_path(st, t->file);
    return f ? f : "?";
}

static bool same_shape(const struct ds_tensor_spec *s, const struct ds_tensor_info *t) {
    if (s->ndim != t->ndim) return false;
    for (int i = 0; i < s->ndim; i++)
        if (s->shape[i] != t->shape[i]) return false;
    return true;
}

// Adds a line unless this kind already has its quota; counts what it holds back.
static void add_limited(struct ds_problems *p, int *shown, int *held, const char *line) {
    if (*shown < MAX_LINES_PER_KIND) {
        ds_problems_add(p, "%s", line);
        (*shown)++;
    } else {
        (*held)++;
    }
}

static void check_table(const struct ds_tensor_spec *specs, size_t n, const ds_safetensors_t *st,
                        const char *dir, struct ds_problems *p) {
    char line[512], a[96], b[96];
    int shown[3] = {0}, held[3] = {0}; // missing, mismatched, unexpected
    for (size_t i = 0; i < n; i++) {
        const struct ds_tensor_spec *s = &specs[i];
        const struct ds_tensor_info *t = ds_safetensors_find(st, s->name);
        if (!t) {
            if (s->optional) continue;
            snprintf(line, sizeof line, "%s: missing tensor %s (expected %s %s)", dir, s->name,
                     ds_dtype_name(s->dtype), fmt_shape(a, sizeof a, s->ndim, s->shape));
            add_limited(p, &shown[0], &held[0], line);
            continue;
        }
        if (!same_shape(s, t)) {
            snprintf(line, sizeof line, "%s: tensor %s: expected shape %s, found %s",
                     tensor_file(st, t), s->name, fmt_shape(a, sizeof a, s->ndim, s->shape),
                     fmt_shape(b, sizeof b, t->ndim, t->shape));
            add_limited(p, &shown[1], &held[1], line);
        }
        if (s->dtype != t->dtype) {
            snprintf(line, sizeof line, "%s: tensor %s: expected dtype %s, found %s",
                     tensor_file(st, t), s->name, ds_dtype_name(s->dtype),
                     ds_dtype_name(t->dtype));
            add_limited(p, &shown[1], &held[1], line);
        }
    }
    for (size_t i = 0; i < ds_safetensors_count(st); i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        struct ds_tensor_spec key;
        snprintf(key.name, sizeof key.name, "%s", t->name);
        // A name longer than any spec cannot be expected; the truncated copy must not match.
        bool known = strlen(t->name) < sizeof key.name &&
                     bsearch(&key, specs, n, sizeof *specs, spec_cmp);
        if (known) continue;
        // The name is the file's: a newline or escape in it must not break the one-line message.
        char name[DS_SHOWN_CAP];
        snprintf(line, sizeof line, "%s: unexpected tensor %s (%s %s)", tensor_file(st, t),
                 ds_safetensors_shown(t->name, name), ds_dtype_name(t->dtype),
                 fmt_shape(a, sizeof a, t->ndim, t->shape));
        add_limited(p, &shown[2], &held[2], line);
    }
    static const char *const kinds[3] = {"missing tensors", "shape/dtype mismatches",
                                          "unexpected tensors"};
    for (int k = 0; k < 3; k++)
        if (held[k]) ds_problems_add(p, "%s: ... and %d more %s", dir, held[k], kinds[k]);
}

// A vocab_size the embedding or lm_head disagrees with is said as that, naming config.json, the
// tensor's file and both numbers, rather than as a bare shape mismatch; the spec then takes the
// tensor's row count, so that the table check does not say it again.
static void check_vocab_rows(const struct ds_target_config *cfg, const ds_safetensors_t *st,
                             const char *dir, struct ds_tensor_spec *specs, size_t n,
                             struct ds_problems *p) {
    static const char *const names[] = {"model.embed_tokens.weight", "lm_head.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const struct ds_tensor_info *t = ds_safetensors_find(st, names[i]);
        if (!t || t->ndim != 2 || t->shape[0] == cfg->vocab_size) continue;
        ds_problems_add(p,
                        "%s/config.json: vocab_size is %" PRId64 ", but tensor %s in %s has %"
                        PRId64 " rows",
                        dir, cfg->vocab_size, names[i], tensor_file(st, t), t->shape[0]);
        struct ds_tensor_spec key;
        snprintf(key.name, sizeof key.name, "%s", names[i]);
        struct ds_tensor_spec *s = bsearch(&key, specs, n, sizeof *specs, spec_cmp);
        if (s) s->shape[0] = t->shape[0];
    }
}

enum ds_status ds_checkpoint_check_target(const struct ds_target_config *cfg,
                                          const ds_safetensors_t *st, const char *dir,
                                          struct ds_problems *problems) {
    struct ds_tensor_spec *specs;
    size_t n, before = problems->count;
    enum ds_status s = ds_target_expected_tensors(cfg, &specs, &n);
    if (s) return s;
    check_vocab_rows(cfg, st, dir, specs, n, problems);
    check_table(specs, n, st, dir, problems);
    free(specs);
    return check_result(problems, before);
}

static bool has_prefix_tensor(const ds_safetensors_t *st, const char *prefix) {
    size_t len = strlen(prefix);
    for (size_t i = 0; i < ds_safetensors_count(st); i++)
        if (!strncmp(ds_safetensors_at(st, i)->name, prefix, len)) return true;
    return false;
}

enum ds_status ds_checkpoint_check_draft(struct ds_draft_config *cfg, const ds_safetensors_t *st,
                                         const char *dir, struct ds_problems *problems) {
    size_t before = problems->count;
    // Either name family is fine; the table decides which one this checkpoint uses.
    bool mid = has_prefix_tensor(st, "midlayer."), l0 = has_prefix_tensor(st, "layers.0.");
    if (mid != l0) cfg->layer_names = l0 ? DS_DRAFT_NAMES_LAYERS0 : DS_DRAFT_NAMES_MIDLAYER;
    cfg->has_embed_tokens = ds_safetensors_find(st, "embed_tokens.weight") != NULL;
    cfg->lm_head_from_target =
        cfg->full_vocab_head && !ds_safetensors_find(st, "lm_head.weight");

    struct ds_tensor_spec *specs;
    size_t n;
    enum ds_status s = ds_draft_expected_tensors(cfg, &specs, &n);
    if (s) return s;
    check_table(specs, n, st, dir, problems);
    free(specs);
    return check_result(problems, before);
}

// ---------------------------------------------------------------------------------------------
// Pair check

// A usable 1-D tensor of the given dtype and length, or NULL.
static const struct ds_tensor_info *vector_tensor(const ds_safetensors_t *st, const char *name,
                                                  enum ds_dtype dtype, int64_t len) {
    const struct ds_tensor_info *t = ds_safetensors_find(st, name);
    if (!t || t->dtype != dtype || t->ndim != 1 || t->shape[0] != len || !t->data) return NULL;
    return t;
}

static int64_t load_i64(const unsigned char *p) {
    // safetensors data is little-endian and not necessarily 8-byte aligned.
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return (int64_t)v;
}

// i + d for a draft id i >= 0 in decimal, or spelled "i + d" when the sum overflows int64.
static const char *target_id_text(char buf[48], int64_t i, int64_t d) {
    if (d > INT64_MAX - i) snprintf(buf, 48, "%" PRId64 " + %" PRId64, i, d);
    else snprintf(buf, 48, "%" PRId64, i + d);
    return buf;
}

static void check_vocab_map(const struct ds_target_config *t, const struct ds_draft_config *d,
                            const ds_safetensors_t *st, struct ds_pair_report *r,
                            struct ds_problems *p) {
    const int64_t V = t->vocab_size, Dv = d->draft_vocab_size;
    const struct ds_tensor_info *d2t = vector_tensor(st, "d2t", DS_DTYPE_I64, Dv);
    const struct ds_tensor_info *t2d = vector_tensor(st, "t2d", DS_DTYPE_BOOL, d->vocab_size);
    if (!d2t || !t2d) return; // absent (full-vocabulary head) or already reported by the table
    r->vocab_map_checked = true;
    const unsigned char *dp = d2t->data, *tp = t2d->data;

    char buf[48];
    int64_t first_bad = -1, first_value = 0;
    for (int64_t i = 0; i < Dv; i++) {
        int64_t off = load_i64(dp + 8 * i);
        if (off < -i || off >= V - i) { // i + off outside 0..V-1, tested without adding (overflow)
            if (first_bad < 0) {
                first_bad = i;
                first_value = off;
            }
            r->d2t_out_of_range++;
        }
    }
    if (r->d2t_out_of_range)
        ds_problems_add(p,
                        "%s: tensor d2t: entry %" PRId64 " is %" PRId64 ", which maps draft id %"
                        PRId64 " to target id %s, expected 0..%" PRId64
                        " (the target vocabulary); %" PRId64 " entries out of range",
                        tensor_file(st, d2t), first_bad, first_value, first_bad,
                        target_id_text(buf, first_bad, first_value), V - 1, r->d2t_out_of_range);

    // The k-th set entry of t2d must be the target id draft id k maps to.
    int64_t k = 0, mismatch_k = -1, mismatch_at = 0;
    for (int64_t v = 0; v < d->vocab_size; v++) {
        if (!tp[v]) continue;
        if (mismatch_k < 0 && (k >= Dv || v - k != load_i64(dp + 8 * k))) { // v - k: no overflow
            mismatch_k = k;
            mismatch_at = v;
        }
        k++;
    }
    r->t2d_set = k;
    r->t2d_consistent = mismatch_k < 0 && k == Dv;
    if (k != Dv)
        ds_problems_add(p,
                        "%s: tensor t2d: expected %" PRId64 " set entries (draft_vocab_size), "
                        "found %" PRId64,
                        tensor_file(st, t2d), Dv, k);
    else if (mismatch_k >= 0)
        ds_problems_add(p,
                        "%s: tensor t2d: set entry #%" PRId64 " is target id %" PRId64
                        ", expected %s = %" PRId64 " + d2t[%" PRId64
                        "] (t2d must mark exactly the ids d2t maps to)",
                        tensor_file(st, t2d), mismatch_k, mismatch_at,
                        target_id_text(buf, mismatch_k, load_i64(dp + 8 * mismatch_k)),
                        mismatch_k, mismatch_k);
}

enum ds_status ds_checkpoint_check_pair(const struct ds_target_config *t,
                                        const struct ds_draft_config *d,
                                        const ds_safetensors_t *draft_st, const char *draft_dir,
                                        struct ds_pair_report *report_out,
                                        struct ds_problems *p) {
    size_t before = p->count;
    memset(report_out, 0, sizeof *report_out);
    if (d->vocab_size != t->vocab_size)
        ds_problems_add(p,
                        "%s/config.json: vocab_size: expected the target's %" PRId64
                        ", found %" PRId64,
                        draft_dir, t->vocab_size, d->vocab_size);
    if (d->use_aux_hidden_state && d->target_hidden_size != t->hidden_size)
        ds_problems_add(p,
                        "%s/config.json: target_hidden_size: expected the target's hidden_size "
                        "%" PRId64 " (fc takes %d x that), found %" PRId64,
                        draft_dir, t->hidden_size, DS_AUX_COUNT, d->target_hidden_size);
    if (!d->use_aux_hidden_state && d->hidden_size != t->hidden_size)
        ds_problems_add(p,
                        "%s/config.json: hidden_size: expected the target's %" PRId64
                        " (a no-aux head reads the target's final hidden state), found %" PRId64,
                        draft_dir, t->hidden_size, d->hidden_size);
    else if (!d->has_embed_tokens && d->hidden_size != t->hidden_size)
        ds_problems_add(p,
                        "%s/config.json: hidden_size: expected the target's %" PRId64
                        " (the draft has no embed_tokens and borrows the target's), found "
                        "%" PRId64,
                        draft_dir, t->hidden_size, d->hidden_size);
    else if (d->lm_head_from_target && d->hidden_size != t->hidden_size)
        ds_problems_add(p,
                        "%s/config.json: hidden_size: expected the target's %" PRId64
                        " (the draft has no lm_head and borrows the target's), found %" PRId64,
                        draft_dir, t->hidden_size, d->hidden_size);

    char label[4096];
    snprintf(label, sizeof label, "%s/config.json", draft_dir);
    if (ds_aux_plan(d, t->num_hidden_layers, NULL, label, &report_out->aux) == DS_OK)
        report_out->aux_ok = true;
    else
        ds_problems_add(p, "%s", ds_error_last());

    if (d->vocab_size == t->vocab_size) check_vocab_map(t, d, draft_st, report_out, p);
    return check_result(p, before);
}

// ---------------------------------------------------------------------------------------------
// Parameter counts

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

void ds_param_count(const ds_safetensors_t *st, int64_t experts, int64_t experts_per_tok,
                    struct ds_param_count *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < ds_safetensors_count(st); i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        uint64_t n = t->numel;
        if (t->dtype == DS_DTYPE_U8 && ends_with(t->name, "_blocks")) n *= 2; // two FP4 per byte
        if (t->dtype == DS_DTYPE_U8 && ends_with(t->name, "_scales")) n = 0;  // block exponents
        if (!strcmp(t->name, "d2t") || !strcmp(t->name, "t2d")) n = 0;        // index buffers
        out->total += n;
        if (strstr(t->name, ".mlp.experts.")) out->expert += n;
        bool embed = !strcmp(t->name, "model.embed_tokens.weight") ||
                     !strcmp(t->name, "embed_tokens.weight");
        if (embed) out->embedding += n;
    }
    out->active = out->total - out->embedding - out->expert;
    if (experts > 0)
        out->active += (uint64_t)llround((double)out->expert * (double)experts_per_tok /
                                         (double)experts);
}
