// The EAGLE-3 draft: loading, the memory plan, extend / step (spec eagle3.md §3.4-§6), and the
// greedy chain round (§11).
//
// Dimension letters (this file): T rows of the call (<= max_rows), R logit rows, H draft hidden,
// Ht target hidden, W fc input width (n_aux · Ht), NH / NKV / D heads and head dim, I MLP width,
// Dv draft vocabulary, V target vocabulary, S slots, P positions per slot.
#include "ds/eagle3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/checkpoint.h"
#include "ds/kernels.h"
#include "weights.h"

struct ds_eagle3 {
    struct ds_draft_config cfg;
    ds_safetensors_t *st;
    char label[512];
    struct ds_backend *be;
    const ds_gptoss_t *target;
    struct ds_eagle3_plan plan;
    enum ds_elem act;
    size_t esz;
    int H, Ht, W, NH, NKV, D, I, Dv, V;

    struct ds_wt embed;                          // (V, H): the target's table, or the draft's own
    struct ds_wt fc, fc_bias;                    // (H, W), (H) or NULL
    struct ds_wt input_norm;                     // (W) when norm_before_fc
    struct ds_wt fc_norm[DS_AUX_COUNT];          // (Ht) each when fc_norm
    struct ds_wt hidden_norm, input_ln, post_ln; // (H)
    struct ds_wt q_w, k_w, v_w, o_w;             // (NH·D, 2H), (NKV·D, 2H) ×2, (H, NH·D)
    struct ds_wt gate_w, up_w, down_w;           // (I, H) ×2, (H, I)
    struct ds_wt final_norm;                     // (H)
    struct ds_wt lm_head;                        // (Dv, H): the draft's, or the target's for a
                                                 // full-vocabulary head without one
    void *weight_arena;
    bool qkv_fused;     // q_w, k_w, v_w back to back: one split matmul (ds_matmul_args)
    bool gate_up_fused; // gate_w, up_w back to back: one split matmul

    void *kv_arena;
    void *k_cache, *v_cache; // (S, P, NKV, D) act

    void *act_arena;
    void *e;         // (T, H) act: embeddings, then input_layernorm(e) in place
    void *a_in;      // (T, W) act: gathered target states
    void *tmp;       // (T, Ht) act: one aux state for fc_norm
    void *g;         // (T, H) act: the hidden input
    void *gn;        // (T, H) act: hidden_norm(g)
    void *u;         // (T, 2H) act: [input_layernorm(e) | hidden_norm(g)]
    void *q;         // (T, NH·D) act
    void *k, *v;     // (T, NKV·D) act
    void *attn;      // (T, NH·D) act
    void *h1;        // (T, H) act
    void *z;         // (T, H) act
    void *gate, *up; // (T, I) act
    void *h2;        // (T, H) act: pre-norm output
    void *n;         // (T, H) act: norm(h2)
    void *gathered;  // (R, H) act
    void *logits;    // (R, Dv) act
    void *full;      // (R, V) act, when plan.full_vocab
    void *attn_ws;   // ds_attention_workspace_bytes(T, NH, D, P): the CUDA split-key path
    size_t attn_ws_bytes;
    int32_t *argmax_ids;                         // (R)
    int32_t *map;                                // (Dv) draft id → target id
    float *rope_cos, *rope_sin;                  // (P, D/2)
    int32_t *d_tokens, *d_pos, *d_rows, *d_hidx; // (T), (T), (R), (T)
    struct ds_attn_seq *d_seqs;                  // (S)

    int32_t *h_map;             // (Dv) host copy of map
    int32_t *h_pos;             // (T) host scratch
    // The per-call tables (d_tokens, d_pos, d_rows, d_hidx, d_seqs) lie in one device block of
    // step_bytes, and h_step mirrors its layout: one upload per call, not five.
    unsigned char *h_step;
    size_t step_bytes;
    int32_t *h_rows;            // (T) host scratch (step: logit rows; identity hidden rows)
    struct ds_attn_seq *h_seqs; // (S) host scratch for step
    unsigned char *h_slot_used; // (S)
    int last_rows, last_logit_rows;
    struct ds_gptoss_memory mem;

    // The call being run (read by forward_ops).
    int cur_T, cur_seq, cur_R, cur_src_rows, cur_in;
    const void *cur_hidden;
    struct ds_graph_cache graphs; // CUDA graphs of draft steps
};

// ---------------------------------------------------------------------------------------------
// Plans and loading

enum ds_status ds_eagle3_aux_plan(const char *dir, const struct ds_target_config *target,
                                  const enum ds_aux_convention *convention,
                                  struct ds_aux_plan *plan_out) {
    memset(plan_out, 0, sizeof *plan_out);
    struct ds_draft_config cfg;
    enum ds_status s = ds_draft_config_load(dir, &cfg);
    if (s != DS_OK) return s;
    char label[4096]; // the ids are config.json's: name it, as the pair check does
    snprintf(label, sizeof label, "%s/config.json", dir);
    return ds_aux_plan(&cfg, target->num_hidden_layers, convention, label, plan_out);
}

void ds_gptoss_plan_aux(struct ds_gptoss_plan *tp, const struct ds_aux_plan *aux) {
    tp->n_aux = aux->n < DS_GPTOSS_MAX_AUX ? aux->n : DS_GPTOSS_MAX_AUX;
    for (int i = 0; i < tp->n_aux; i++)
        tp->aux_boundaries[i] = (int)aux->boundaries[i];
}

static enum ds_status bind(struct ds_weight_loader *wl, struct ds_wt *w, const char *name,
                           uint64_t numel, bool optional) {
    return ds_wl_bind(wl, w, name, numel, optional);
}

// Binds every tensor of the draft (one loader pass); names as in ds/checkpoint.h.
static enum ds_status bind_all(ds_eagle3_t *d, struct ds_weight_loader *wl) {
    const struct ds_draft_config *c = &d->cfg;
    const uint64_t H = (uint64_t)d->H, W = (uint64_t)d->W, I = (uint64_t)d->I,
                   QD = (uint64_t)d->NH * d->D, KD = (uint64_t)d->NKV * d->D;
    const char *p = ds_draft_names_prefix(c->layer_names);
    char n[160];
    enum ds_status s;
#define NAME(suffix) (snprintf(n, sizeof n, "%s%s", p, suffix), n)
    if (c->use_aux_hidden_state) {
        if ((s = bind(wl, &d->fc, "fc.weight", H * W, false))) return s;
        if (c->fc_bias && (s = bind(wl, &d->fc_bias, "fc.bias", H, false))) return s;
        if (c->norm_before_fc && (s = bind(wl, &d->input_norm, "input_norm.weight", W, false)))
            return s;
        for (int i = 0; c->fc_norm && i < DS_AUX_COUNT; i++) {
            char fn[64];
            snprintf(fn, sizeof fn, "fc_norm.%d.weight", i);
            if ((s = bind(wl, &d->fc_norm[i], fn, (uint64_t)d->Ht, false))) return s;
        }
    }
    if ((s = bind(wl, &d->hidden_norm, NAME("hidden_norm.weight"), H, false))) return s;
    if ((s = bind(wl, &d->input_ln, NAME("input_layernorm.weight"), H, false))) return s;
    if ((s = bind(wl, &d->post_ln, NAME("post_attention_layernorm.weight"), H, false))) return s;
    if ((s = bind(wl, &d->q_w, NAME("self_attn.q_proj.weight"), QD * 2 * H, false))) return s;
    if ((s = bind(wl, &d->k_w, NAME("self_attn.k_proj.weight"), KD * 2 * H, false))) return s;
    if ((s = bind(wl, &d->v_w, NAME("self_attn.v_proj.weight"), KD * 2 * H, false))) return s;
    if ((s = bind(wl, &d->o_w, NAME("self_attn.o_proj.weight"), H * QD, false))) return s;
    if ((s = bind(wl, &d->gate_w, NAME("mlp.gate_proj.weight"), I * H, false))) return s;
    if ((s = bind(wl, &d->up_w, NAME("mlp.up_proj.weight"), I * H, false))) return s;
    if ((s = bind(wl, &d->down_w, NAME("mlp.down_proj.weight"), H * I, false))) return s;
    if ((s = bind(wl, &d->final_norm, "norm.weight", H, false))) return s;
#undef NAME
    // Borrowed tables (not in the draft's weights); a measure has no target to borrow from.
    if (c->lm_head_from_target) {
        if (d->target) d->lm_head.p = ds_gptoss_lm_head(d->target, &d->lm_head.e);
    } else if ((s = bind(wl, &d->lm_head, "lm_head.weight", (uint64_t)d->Dv * H, false))) {
        return s;
    }
    if (d->plan.own_embed) {
        if ((s = bind(wl, &d->embed, "embed_tokens.weight", (uint64_t)d->V * H, false))) return s;
    } else if (d->target) {
        d->embed.p = ds_gptoss_embed_table(d->target, &d->embed.e);
    }
    return DS_OK;
}

// Which projections run as one split-output matmul: q/k/v and gate/up when their matrices lie
// back to back (the same bits as separate calls).
static void find_fusions(ds_eagle3_t *d) {
    const uint64_t H = (uint64_t)d->H, I = (uint64_t)d->I, QD = (uint64_t)d->NH * d->D,
                   KD = (uint64_t)d->NKV * d->D;
    d->qkv_fused =
        ds_wt_follows(&d->q_w, QD * 2 * H, &d->k_w) && ds_wt_follows(&d->k_w, KD * 2 * H, &d->v_w);
    d->gate_up_fused = ds_wt_follows(&d->gate_w, I * H, &d->up_w);
}

enum ds_status ds_eagle3_check_config(const struct ds_draft_config *c, const char *label,
                                      struct ds_problems *p) {
    const size_t before = p->count;
    if (c->num_hidden_layers != 1)
        ds_problems_add(p, "%s: num_hidden_layers: expected 1 (one EAGLE-3 layer), found %lld",
                        label, (long long)c->num_hidden_layers);
    if (strcmp(c->hidden_act, "silu"))
        ds_problems_add(p, "%s: hidden_act: expected silu, found %s", label, c->hidden_act);
    if (c->head_dim > DS_MAX_HEAD_DIM || c->head_dim % 2)
        ds_problems_add(p, "%s: head_dim: expected an even value up to %d, found %lld", label,
                        DS_MAX_HEAD_DIM, (long long)c->head_dim);
    if (c->rope.type != DS_ROPE_DEFAULT && c->rope.type != DS_ROPE_YARN)
        ds_problems_add(p, "%s: rope type: expected default or yarn, found %s", label,
                        ds_rope_type_name(c->rope.type));
    // The parser refuses the pair already; a config built in code may not have been parsed.
    if (c->fc_norm && c->norm_before_fc)
        ds_problems_add(p, "%s: norm_before_fc and fc_norm: expected at most one, found both",
                        label);
    return p->count > before ? ds_problems_error(DS_ERR_UNSUPPORTED, p, before) : DS_OK;
}

// Reads and checks the draft in DIR (ds_eagle3_check_dir); *st_out is opened here and left to
// the caller, also on failure.
static enum ds_status open_checked(const char *dir, const struct ds_target_config *tc,
                                   struct ds_draft_config *cfg, ds_safetensors_t **st_out,
                                   struct ds_problems *problems) {
    char label[4096];
    snprintf(label, sizeof label, "%s/config.json", dir);
    struct ds_pair_report report;
    enum ds_status s = ds_draft_config_load(dir, cfg);
    if (s == DS_OK) s = ds_eagle3_check_config(cfg, label, problems);
    if (s == DS_OK) s = ds_safetensors_open_dir(dir, st_out);
    if (s != DS_OK) return s;
    s = ds_checkpoint_check_draft(cfg, *st_out, dir, problems);
    if (s == DS_OK) s = ds_checkpoint_check_pair(tc, cfg, *st_out, dir, &report, problems);
    return s == DS_OK ? s : ds_problems_error(s, problems, 0);
}

enum ds_status ds_eagle3_check_dir(const char *dir, const struct ds_target_config *target,
                                   struct ds_draft_config *cfg_out) {
    struct ds_problems problems = {0};
    ds_safetensors_t *st = NULL;
    enum ds_status s = open_checked(dir, target, cfg_out, &st, &problems);
    ds_safetensors_close(st);
    ds_problems_free(&problems);
    return s;
}

// What only a loaded pair can check: the backend's head dims, the sizes the draft takes from the
// target (gen drafts have no pair check), the plan's own embedding.
static enum ds_status check_config(ds_eagle3_t *d) {
    const struct ds_draft_config *c = &d->cfg;
    enum ds_status hs = ds_wl_check_head_dim(d->be, c->head_dim, d->label);
    if (hs) return hs;
    // Only fc reads target_hidden_size: a no-aux head's is not checked (nor by the pair check).
    if (c->use_aux_hidden_state && c->target_hidden_size != d->Ht)
        return ds_error_set(DS_ERR_MISMATCH, "%s: target_hidden_size %lld, target has %d", d->label,
                            (long long)c->target_hidden_size, d->Ht);
    if (!c->use_aux_hidden_state && d->Ht != d->H)
        return ds_error_set(DS_ERR_MISMATCH,
                            "%s: a no-aux head needs hidden_size %d equal to the target's %d",
                            d->label, d->H, d->Ht);
    if (d->plan.own_embed && !c->has_embed_tokens)
        return ds_error_set(DS_ERR_MISMATCH,
                            "%s: own embedding asked, but the checkpoint has no "
                            "embed_tokens.weight",
                            d->label);
    return DS_OK;
}

static void *carve(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += ds_align256(bytes ? bytes : 1);
    return p;
}

static size_t carve_activations(ds_eagle3_t *d, char *base) {
    const size_t T = (size_t)d->plan.max_rows, R = (size_t)d->plan.max_logit_rows, e = d->esz,
                 H = (size_t)d->H, QD = (size_t)d->NH * d->D, KD = (size_t)d->NKV * d->D;
    size_t off = 0;
    d->e = carve(base, &off, T * H * e);
    d->a_in = carve(base, &off, T * (size_t)d->W * e);
    d->tmp = carve(base, &off, T * (size_t)d->Ht * e);
    d->g = carve(base, &off, T * H * e);
    d->gn = carve(base, &off, T * H * e);
    d->u = carve(base, &off, T * 2 * H * e);
    d->q = carve(base, &off, T * QD * e);
    d->k = carve(base, &off, T * KD * e);
    d->v = carve(base, &off, T * KD * e);
    d->attn = carve(base, &off, T * QD * e);
    d->h1 = carve(base, &off, T * H * e);
    d->z = carve(base, &off, T * H * e);
    d->gate = carve(base, &off, T * (size_t)d->I * e);
    d->up = carve(base, &off, T * (size_t)d->I * e);
    d->h2 = carve(base, &off, T * H * e);
    d->n = carve(base, &off, T * H * e);
    d->gathered = carve(base, &off, R * H * e);
    d->logits = carve(base, &off, R * (size_t)d->Dv * e);
    d->full = d->plan.full_vocab ? carve(base, &off, R * (size_t)d->V * e) : NULL;
    d->attn_ws_bytes = ds_attention_workspace_bytes(d->plan.max_rows, d->NH, d->D, d->plan.max_pos);
    d->attn_ws = d->attn_ws_bytes ? carve(base, &off, d->attn_ws_bytes) : NULL;
    d->argmax_ids = carve(base, &off, R * sizeof(int32_t));
    d->map = carve(base, &off, (size_t)d->Dv * sizeof(int32_t));
    size_t rope = (size_t)d->plan.max_pos * (size_t)(d->D / 2) * sizeof(float);
    d->rope_cos = carve(base, &off, rope);
    d->rope_sin = carve(base, &off, rope);
    const size_t step0 = off; // the call tables: last, one block (see h_step)
    d->d_tokens = carve(base, &off, T * sizeof(int32_t));
    d->d_pos = carve(base, &off, T * sizeof(int32_t));
    d->d_rows = carve(base, &off, R * sizeof(int32_t));
    d->d_hidx = carve(base, &off, T * sizeof(int32_t));
    d->d_seqs = carve(base, &off, (size_t)d->plan.max_slots * sizeof(struct ds_attn_seq));
    d->step_bytes = off - step0;
    return off;
}

// The draft → target map from d2t (or identity for a full-vocabulary head); gen_d2t replaces
// the checkpoint's tensor for generated drafts.
static enum ds_status build_map(ds_eagle3_t *d, const struct ds_weight_gen *gen) {
    if (gen) {
        if (!gen->d2t && d->Dv != d->V)
            return ds_error_set(DS_ERR_MISMATCH, "%s: draft vocabulary %d without d2t", d->label,
                                d->Dv);
        if (!gen->d2t) {
            for (int i = 0; i < d->Dv; i++)
                d->h_map[i] = i;
            return DS_OK;
        }
        enum ds_status s = ds_d2t_to_map(gen->d2t, d->Dv, d->V, d->h_map);
        if (s != DS_OK) ds_error_set(s, "%s: %s", d->label, ds_error_last());
        return s;
    }
    const struct ds_tensor_info *t = ds_safetensors_find(d->st, "d2t");
    if (!t) {
        if (d->Dv != d->V)
            return ds_error_set(DS_ERR_MISMATCH, "%s: draft vocabulary %d without d2t", d->label,
                                d->Dv);
        for (int i = 0; i < d->Dv; i++)
            d->h_map[i] = i;
        return DS_OK;
    }
    if (t->dtype != DS_DTYPE_I64 || t->numel != (uint64_t)d->Dv)
        return ds_error_set(DS_ERR_MISMATCH, "%s: d2t must be I64 [%d]", d->label, d->Dv);
    int64_t *d2t = malloc((size_t)d->Dv * sizeof *d2t);
    if (!d2t) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", d->label);
    memcpy(d2t, t->data, (size_t)d->Dv * sizeof *d2t); // the mapping may be unaligned
    enum ds_status s = ds_d2t_to_map(d2t, d->Dv, d->V, d->h_map);
    free(d2t);
    if (s != DS_OK) ds_error_set(s, "%s: %s", d->label, ds_error_last());
    return s;
}

// What a draft takes from its target: the model (NULL when only measuring), its config, its
// activation dtype and whether it runs CUDA graphs.
struct target_view {
    const ds_gptoss_t *model;
    const struct ds_target_config *cfg;
    enum ds_elem act;
    bool graphs;
};

// Creates a draft from DIR (gen NULL: config.json + safetensors) or from a config and a weight
// generator (dir is then only the label). With `measure` (draft_out NULL, tv->model NULL) it
// stops after the checks and the measure pass: *measure is what create would allocate.
static enum ds_status create_impl(const char *dir, const struct ds_draft_config *gen_cfg,
                                  const struct ds_weight_gen *gen, const struct target_view *tv,
                                  struct ds_backend *be, const struct ds_eagle3_plan *plan,
                                  const struct ds_load_progress *progress,
                                  ds_eagle3_t **draft_out, struct ds_gptoss_memory *measure) {
    enum ds_status s = ds_backend_check(be);
    if (s != DS_OK) return s;
    if (tv->model && be != ds_gptoss_backend(tv->model))
        return ds_error_set(DS_ERR_ARG, "%s: the draft must use the target's backend", dir);
    if (plan->max_slots < 1 || plan->max_pos < 1 || plan->max_rows < 1 || plan->max_logit_rows < 0)
        return ds_error_set(DS_ERR_ARG, "%s: plan needs max_slots, max_pos, max_rows >= 1", dir);
    const ds_gptoss_t *target = tv->model;
    const struct ds_target_config *tc = tv->cfg;

    ds_eagle3_t *d = calloc(1, sizeof *d);
    if (!d) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", dir);
    struct ds_problems problems = {0};
    struct ds_weight_loader wl = {0};
    snprintf(d->label, sizeof d->label, "%s", dir);
    d->be = be;
    d->target = target;
    d->plan = *plan;
    if (!d->plan.max_logit_rows) d->plan.max_logit_rows = d->plan.max_rows;
    // The draft reads the target's aux states and shares its numerics: the target's act.
    d->act = tv->act;
    d->esz = ds_elem_size(d->act);
    ds_graph_init(&d->graphs, be);
    d->graphs.enabled = tv->graphs;

    if (gen) {
        d->cfg = *gen_cfg;
        s = ds_eagle3_check_config(&d->cfg, dir, &problems);
    } else {
        s = open_checked(dir, tc, &d->cfg, &d->st, &problems);
    }
    if (s != DS_OK) goto fail;
    const struct ds_draft_config *c = &d->cfg;
    d->H = (int)c->hidden_size;
    d->Ht = (int)tc->hidden_size;
    d->W = DS_AUX_COUNT * d->Ht;
    d->NH = (int)c->num_attention_heads;
    d->NKV = (int)c->num_key_value_heads;
    d->D = (int)c->head_dim;
    d->I = (int)c->intermediate_size;
    d->V = (int)tc->vocab_size;
    d->Dv = (int)c->draft_vocab_size;
    if ((s = check_config(d)) != DS_OK) goto fail;

    d->h_map = calloc((size_t)d->Dv, sizeof *d->h_map);
    d->h_pos = calloc((size_t)d->plan.max_rows, sizeof *d->h_pos);
    d->h_rows = calloc((size_t)d->plan.max_rows, sizeof *d->h_rows);
    d->h_seqs = calloc((size_t)d->plan.max_slots, sizeof *d->h_seqs);
    d->h_slot_used = calloc((size_t)d->plan.max_slots, 1);
    if (!d->h_map || !d->h_pos || !d->h_rows || !d->h_seqs || !d->h_slot_used) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    if ((s = build_map(d, gen)) != DS_OK) goto fail;

    if (gen)
        ds_wl_init_gen(&wl, be, gen, d->label, progress ? progress->fn : NULL,
                       progress ? progress->user : NULL);
    else
        ds_wl_init(&wl, be, d->st, d->label, progress ? progress->fn : NULL,
                   progress ? progress->user : NULL);
    // Weights measured and their arena allocated, then every other buffer of the plan (a plan
    // that does not fit is refused before the upload or generation), then the load pass.
    if ((s = bind_all(d, &wl)) != DS_OK) goto fail;
    size_t per = ds_align256((size_t)d->plan.max_slots * (size_t)d->plan.max_pos * (size_t)d->NKV *
                             (size_t)d->D * d->esz);
    d->mem.kv = 2 * per;
    if (measure) { // the plan only: the bytes the passes below would allocate and place
        *measure = (struct ds_gptoss_memory){.weights = wl.bytes,
                                             .kv = d->mem.kv,
                                             .activations = carve_activations(d, NULL)};
        goto fail; // s is DS_OK: the shared cleanup
    }
    if ((s = ds_wl_begin_load(&wl, &d->weight_arena)) != DS_OK) goto fail;
    if ((s = be->alloc(be, d->mem.kv, &d->kv_arena)) != DS_OK) {
        ds_error_set(s, "%s: cannot allocate %zu bytes of KV cache (%d slots x %d positions): %s",
                     d->label, d->mem.kv, d->plan.max_slots, d->plan.max_pos, ds_error_last());
        goto fail;
    }
    d->k_cache = d->kv_arena;
    d->v_cache = (char *)d->kv_arena + per;

    d->mem.activations = carve_activations(d, NULL);
    if ((s = be->alloc(be, d->mem.activations, &d->act_arena)) != DS_OK) {
        ds_error_set(s, "%s: cannot allocate %zu bytes of activations: %s", d->label,
                     d->mem.activations, ds_error_last());
        goto fail;
    }
    carve_activations(d, d->act_arena);
    d->h_step = calloc(d->step_bytes, 1);
    if (!d->h_step) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", d->label);
        goto fail;
    }

    if ((s = bind_all(d, &wl)) != DS_OK) goto fail;
    if ((s = ds_wl_finish(&wl)) != DS_OK) goto fail;
    d->mem.weights = wl.bytes;
    find_fusions(d);
    if ((s = be->upload(be, d->map, d->h_map, (size_t)d->Dv * sizeof(int32_t)))) goto fail;

    struct ds_rope_spec rs = {
        .yarn = c->rope.type == DS_ROPE_YARN,
        .head_dim = d->D,
        .theta = c->rope.theta,
        .factor = c->rope.factor,
        .beta_fast = c->rope.beta_fast,
        .beta_slow = c->rope.beta_slow,
        .attention_factor = c->rope.attention_factor,
        .original_max_pos = (int)c->rope.original_max_position_embeddings,
        .truncate = c->rope.truncate,
    };
    if ((s = ds_rope_upload(be, &rs, d->plan.max_pos, d->rope_cos, d->rope_sin)) != DS_OK)
        goto fail;
    ds_problems_free(&problems);
    *draft_out = d;
    return DS_OK;

fail:
    ds_wl_finish(&wl);
    ds_problems_free(&problems);
    ds_eagle3_release(d);
    return s;
}

enum ds_status ds_eagle3_create(const char *dir, const ds_gptoss_t *target, struct ds_backend *be,
                                const struct ds_eagle3_plan *plan,
                                const struct ds_load_progress *progress, ds_eagle3_t **draft_out) {
    if (draft_out) *draft_out = NULL;
    if (!dir || !target || !plan || !draft_out)
        return ds_error_set(DS_ERR_ARG, "eagle3: create with a NULL argument");
    const struct target_view tv = {target, ds_gptoss_config(target), ds_gptoss_act(target),
                                   ds_gptoss_plan_of(target)->graphs};
    return create_impl(dir, NULL, NULL, &tv, be, plan, progress, draft_out, NULL);
}

// The view of a target that is not loaded yet: its config and the dtype its plan resolves to.
static enum ds_status view_of_plan(const struct ds_target_config *tc,
                                   const struct ds_gptoss_plan *target_plan, struct ds_backend *be,
                                   const char *label, struct target_view *tv) {
    *tv = (struct target_view){.cfg = tc, .graphs = target_plan->graphs};
    enum ds_status s = ds_backend_check(be);
    return s != DS_OK ? s : ds_act_resolve(be, (int)target_plan->act, label, &tv->act);
}

enum ds_status ds_eagle3_measure(const char *dir, const struct ds_target_config *target_cfg,
                                 const struct ds_gptoss_plan *target_plan, struct ds_backend *be,
                                 const struct ds_eagle3_plan *plan, struct ds_gptoss_memory *out) {
    if (!dir || !target_cfg || !target_plan || !plan || !out)
        return ds_error_set(DS_ERR_ARG, "eagle3: measure with a NULL argument");
    struct target_view tv;
    enum ds_status s = view_of_plan(target_cfg, target_plan, be, dir, &tv);
    return s != DS_OK ? s : create_impl(dir, NULL, NULL, &tv, be, plan, NULL, NULL, out);
}

enum ds_status ds_eagle3_create_gen(const struct ds_draft_config *cfg,
                                    const struct ds_weight_gen *gen, const char *label,
                                    const ds_gptoss_t *target, struct ds_backend *be,
                                    const struct ds_eagle3_plan *plan,
                                    const struct ds_load_progress *progress,
                                    ds_eagle3_t **draft_out) {
    if (draft_out) *draft_out = NULL;
    if (!cfg || !gen || !target || !plan || !draft_out)
        return ds_error_set(DS_ERR_ARG, "eagle3: create with a NULL argument");
    if (plan->own_embed)
        return ds_error_set(DS_ERR_ARG, "%s: generated drafts use the target's embedding",
                            label ? label : "synthetic draft");
    const struct target_view tv = {target, ds_gptoss_config(target), ds_gptoss_act(target),
                                   ds_gptoss_plan_of(target)->graphs};
    return create_impl(label ? label : "synthetic draft", cfg, gen, &tv, be, plan, progress,
                       draft_out, NULL);
}

enum ds_status ds_eagle3_measure_gen(const struct ds_draft_config *cfg,
                                     const struct ds_weight_gen *gen, const char *label,
                                     const struct ds_target_config *target_cfg,
                                     const struct ds_gptoss_plan *target_plan,
                                     struct ds_backend *be, const struct ds_eagle3_plan *plan,
                                     struct ds_gptoss_memory *out) {
    if (!cfg || !gen || !target_cfg || !target_plan || !plan || !out)
        return ds_error_set(DS_ERR_ARG, "eagle3: measure with a NULL argument");
    if (!label) label = "synthetic draft";
    struct target_view tv;
    enum ds_status s = view_of_plan(target_cfg, target_plan, be, label, &tv);
    return s != DS_OK ? s : create_impl(label, cfg, gen, &tv, be, plan, NULL, NULL, out);
}

void ds_eagle3_release(ds_eagle3_t *d) {
    if (!d) return;
    ds_graph_clear(&d->graphs);
    if (d->be) {
        d->be->free(d->be, d->act_arena);
        d->be->free(d->be, d->kv_arena);
        d->be->free(d->be, d->weight_arena);
    }
    free(d->h_map);
    free(d->h_pos);
    free(d->h_step);
    free(d->h_rows);
    free(d->h_seqs);
    free(d->h_slot_used);
    ds_safetensors_close(d->st);
    free(d);
}

// ---------------------------------------------------------------------------------------------
// Forward

static enum ds_status check_rows(ds_eagle3_t *d, const struct ds_batch *b) {
    if (!b) return ds_error_set(DS_ERR_ARG, "%s: draft call with a NULL batch", d->label);
    const struct ds_rows_limits lim = {
        .max_rows = d->plan.max_rows,
        .max_slots = d->plan.max_slots,
        .max_logit_rows = d->plan.max_logit_rows,
        .max_pos = d->plan.max_pos,
        .vocab = d->V,
    };
    return ds_rows_check(d->label, &lim, b->n_rows, b->tokens, b->n_seq, b->seqs, b->n_logit_rows,
                         b->logit_rows, d->h_slot_used, d->h_pos);
}

static enum ds_status rmsnorm(ds_eagle3_t *d, int T, int dim, const void *x, const struct ds_wt *w,
                              void *y) {
    return ds_op_rmsnorm(d->be, d->act, T, dim, d->cfg.rms_norm_eps, x, w, y);
}

static enum ds_status matmul(ds_eagle3_t *d, int T, int in, int out, const void *x,
                             const struct ds_wt *w, const struct ds_wt *bias, const void *residual,
                             void *y) {
    return ds_op_matmul(d->be, d->act, T, in, out, x, w, bias, residual, y);
}

static enum ds_status gather(ds_eagle3_t *d, int T, int src_rows, int dim, const void *src,
                             const int32_t *rows, void *out) {
    struct ds_gather_rows_args g = {
        .act = d->act,
        .n_rows = T,
        .src_rows = src_rows,
        .dim = dim,
        .x = src,
        .rows = rows,
        .out = out,
    };
    return d->be->gather_rows(d->be, &g);
}

// g = fc([input_norm | fc_norm](A)) from gathered target states (eagle3.md §3.4).
static enum ds_status project_target(ds_eagle3_t *d, int T) {
    struct ds_backend *be = d->be;
    const struct ds_draft_config *c = &d->cfg;
    enum ds_status s;
    if (c->norm_before_fc && (s = rmsnorm(d, T, d->W, d->a_in, &d->input_norm, d->a_in))) return s;
    if (c->fc_norm) {
        const size_t row = (size_t)d->Ht * d->esz, pitch = (size_t)d->W * d->esz;
        for (int i = 0; i < DS_AUX_COUNT; i++) {
            char *col = (char *)d->a_in + (size_t)i * row;
            if ((s = be->copy_2d(be, d->tmp, row, col, pitch, row, (size_t)T))) return s;
            if ((s = rmsnorm(d, T, d->Ht, d->tmp, &d->fc_norm[i], d->tmp))) return s;
            if ((s = be->copy_2d(be, col, pitch, d->tmp, row, row, (size_t)T))) return s;
        }
    }
    return matmul(d, T, d->W, d->H, d->a_in, &d->fc, c->fc_bias ? &d->fc_bias : NULL, NULL, d->g);
}

enum draft_input { FROM_TARGET, FROM_DRAFT };

// The one draft layer over T rows whose hidden input g is prepared by the caller's mode
// (eagle3.md §4 steps 1-9).
// The op sequence of one call over the tables already on the device; depends on the host only
// through cur_* (the CUDA-graph key).
static enum ds_status forward_ops(void *user) {
    ds_eagle3_t *d = user;
    struct ds_backend *be = d->be;
    const struct ds_draft_config *c = &d->cfg;
    const int T = d->cur_T, H = d->H, QD = d->NH * d->D, KD = d->NKV * d->D, R = d->cur_R;
    const int hidden_src_rows = d->cur_src_rows;
    const void *hidden = d->cur_hidden;
    enum ds_status s;

    // The hidden input g.
    if (d->cur_in == FROM_DRAFT) {
        // The previous call's output (h2, or n with norm_output) becomes this call's input.
        const void *prev = c->norm_output ? d->n : d->h2;
        if ((s = gather(d, T, hidden_src_rows, H, prev, d->d_hidx, d->g))) return s;
    } else if (c->use_aux_hidden_state) {
        if ((s = gather(d, T, hidden_src_rows, d->W, hidden, d->d_hidx, d->a_in))) return s;
        if ((s = project_target(d, T))) return s;
    } else {
        // No-aux head: the target's final post-norm hidden, no fc.
        if ((s = gather(d, T, hidden_src_rows, H, hidden, d->d_hidx, d->g))) return s;
    }

    // u = [input_layernorm(embed(token)) | hidden_norm(g)], embedding first.
    struct ds_embed_args e = {
        .act = d->act,
        .table_dtype = d->embed.e,
        .n_rows = T,
        .vocab = d->V,
        .dim = H,
        .table = d->embed.p,
        .ids = d->d_tokens,
        .out = d->e,
    };
    if ((s = be->embed(be, &e))) return s;
    if ((s = rmsnorm(d, T, H, d->e, &d->input_ln, d->e))) return s;
    if ((s = rmsnorm(d, T, H, d->g, &d->hidden_norm, d->gn))) return s;
    const size_t row = (size_t)H * d->esz;
    if ((s = be->copy_2d(be, d->u, 2 * row, d->e, row, row, (size_t)T))) return s;
    if ((s = be->copy_2d(be, (char *)d->u + row, 2 * row, d->gn, row, row, (size_t)T))) return s;

    // Attention over the draft's KV cache: plain causal, no sinks, no window.
    struct ds_rope_args r = {
        .act = d->act,
        .n_rows = T,
        .head_dim = d->D,
        .n_q_heads = d->NH,
        .n_k_heads = d->NKV,
        .q = d->q,
        .k = d->k,
        .positions = d->d_pos,
        .cos = d->rope_cos,
        .sin = d->rope_sin,
        .table_len = d->plan.max_pos,
    };
    if (d->qkv_fused) {
        // One launch streams [q_w; k_w; v_w] (bitwise the three calls: split outputs) and rotates
        // q and k (its RoPE fields: the bits of the rope op after it; on CUDA inside the small-T
        // product, one launch fewer).
        struct ds_matmul_args qkv = {
            .act = d->act,
            .w_dtype = d->q_w.e,
            .bias_dtype = DS_ELEM_F32, // no biases
            .n_rows = T,
            .in_dim = 2 * H,
            .out_dim = QD + 2 * KD,
            .x = d->u,
            .w = d->q_w.p,
            .out = d->q,
            .part_dim = {QD, KD, KD},
            .out1 = d->k,
            .out2 = d->v,
            .rope_head_dim = r.head_dim,
            .rope_positions = r.positions,
            .rope_cos = r.cos,
            .rope_sin = r.sin,
            .rope_table_len = r.table_len,
        };
        if ((s = be->matmul(be, &qkv))) return s;
    } else {
        if ((s = matmul(d, T, 2 * H, QD, d->u, &d->q_w, NULL, NULL, d->q))) return s;
        if ((s = matmul(d, T, 2 * H, KD, d->u, &d->k_w, NULL, NULL, d->k))) return s;
        if ((s = matmul(d, T, 2 * H, KD, d->u, &d->v_w, NULL, NULL, d->v))) return s;
        if ((s = be->rope(be, &r))) return s;
    }
    struct ds_attention_args a = {
        .act = d->act,
        .cache_dtype = d->act,
        .sinks_dtype = DS_ELEM_F32,
        .n_rows = T,
        .n_heads = d->NH,
        .n_kv_heads = d->NKV,
        .head_dim = d->D,
        .n_seq = d->cur_seq,
        .seqs = d->d_seqs,
        .q = d->q,
        .k = d->k,
        .v = d->v,
        .k_cache = d->k_cache,
        .v_cache = d->v_cache,
        .n_slots = d->plan.max_slots,
        .max_pos = d->plan.max_pos,
        .window = 0,
        .scale = 1.0f / sqrtf((float)d->D),
        .sinks = NULL,
        .out = d->attn,
        .workspace = d->attn_ws,
        .workspace_bytes = d->attn_ws_bytes,
        // The cache below pos0 was written by an earlier call of this layer, with the q/k/v
        // product (at least) between it and this call.
        .cache_settled = 1,
    };
    if ((s = be->attention(be, &a))) return s;
    // h1 = o + r, r = g (raw) or hidden_norm(g) with norm_before_residual.
    const void *resid = c->norm_before_residual ? d->gn : d->g;
    if ((s = matmul(d, T, QD, H, d->attn, &d->o_w, NULL, resid, d->h1))) return s;

    // h2 = down(silu(gate(z)) · up(z)) + h1.
    if ((s = rmsnorm(d, T, H, d->h1, &d->post_ln, d->z))) return s;
    if (d->gate_up_fused) {
        // One launch streams [gate_w; up_w] into gate and up (split outputs, same bits).
        struct ds_matmul_args gu = {
            .act = d->act,
            .w_dtype = d->gate_w.e,
            .bias_dtype = DS_ELEM_F32, // no biases
            .n_rows = T,
            .in_dim = H,
            .out_dim = 2 * d->I,
            .x = d->z,
            .w = d->gate_w.p,
            .out = d->gate,
            .part_dim = {d->I, d->I, 0},
            .out1 = d->up,
        };
        if ((s = be->matmul(be, &gu))) return s;
    } else {
        if ((s = matmul(d, T, H, d->I, d->z, &d->gate_w, NULL, NULL, d->gate))) return s;
        if ((s = matmul(d, T, H, d->I, d->z, &d->up_w, NULL, NULL, d->up))) return s;
    }
    struct ds_silu_mul_args sm = {
        .act = d->act,
        .n_rows = T,
        .dim = d->I,
        .gate = d->gate,
        .up = d->up,
        .out = d->gate,
    };
    if ((s = be->silu_mul(be, &sm))) return s;
    if ((s = matmul(d, T, d->I, H, d->gate, &d->down_w, NULL, d->h1, d->h2))) return s;

    // n = norm(h2) for every row (fed back with norm_output), logits for the chosen rows.
    if ((s = rmsnorm(d, T, H, d->h2, &d->final_norm, d->n))) return s;
    if (R > 0) {
        if ((s = gather(d, R, T, H, d->n, d->d_rows, d->gathered))) return s;
        if ((s = matmul(d, R, H, d->Dv, d->gathered, &d->lm_head, NULL, NULL, d->logits))) return s;
    }
    return DS_OK;
}

// Uploads the call's tables, then runs the ops: draft steps (fed by the draft itself) through
// the CUDA-graph cache, extends (whose row counts vary from round to round) eagerly.
static enum ds_status forward(ds_eagle3_t *d, const struct ds_batch *b, enum draft_input in,
                              const void *hidden, int hidden_src_rows, const int32_t *hidden_rows) {
    struct ds_backend *be = d->be;
    const int T = b->n_rows;
    d->last_rows = d->last_logit_rows = 0;
    enum ds_status s;
    // The tables staged at their device offsets in h_step, then one upload of the block up to
    // the end of the sequence table.
    unsigned char *const d0 = (unsigned char *)d->d_tokens;
    memcpy(d->h_step, b->tokens, (size_t)T * sizeof(int32_t));
    memcpy(d->h_step + ((unsigned char *)d->d_pos - d0), d->h_pos, (size_t)T * sizeof(int32_t));
    if (b->n_logit_rows > 0)
        memcpy(d->h_step + ((unsigned char *)d->d_rows - d0), b->logit_rows,
               (size_t)b->n_logit_rows * sizeof(int32_t));
    memcpy(d->h_step + ((unsigned char *)d->d_hidx - d0), hidden_rows, (size_t)T * sizeof(int32_t));
    const size_t seq_off = (size_t)((unsigned char *)d->d_seqs - d0);
    memcpy(d->h_step + seq_off, b->seqs, (size_t)b->n_seq * sizeof *b->seqs);
    if ((s = be->upload(be, d0, d->h_step, seq_off + (size_t)b->n_seq * sizeof *b->seqs)))
        return s;
    d->cur_T = T;
    d->cur_seq = b->n_seq;
    d->cur_R = b->n_logit_rows;
    d->cur_in = (int)in;
    d->cur_hidden = hidden;
    // A step reads rows of the draft's own buffers (checked on the host against the last call):
    // bounding the gather by the planned rows keeps the step's ops independent of that count.
    d->cur_src_rows = in == FROM_DRAFT ? d->plan.max_rows : hidden_src_rows;
    if (in == FROM_DRAFT) {
        const long long key[DS_GRAPH_KEY] = {T, b->n_seq, b->n_logit_rows, 0, 0, 0};
        s = ds_graph_run(&d->graphs, key, forward_ops, d);
    } else {
        s = forward_ops(d);
    }
    if (s != DS_OK) return s;
    d->last_rows = T;
    d->last_logit_rows = b->n_logit_rows;
    return DS_OK;
}

enum ds_status ds_eagle3_extend(ds_eagle3_t *d, const struct ds_batch *rows, const void *hidden,
                                int hidden_src_rows, const int32_t *hidden_rows) {
    if (!d || !hidden) return ds_error_set(DS_ERR_ARG, "eagle3: extend with a NULL argument");
    enum ds_status s = check_rows(d, rows);
    if (s != DS_OK) return s;
    if (hidden_src_rows < 1)
        return ds_error_set(DS_ERR_ARG, "%s: extend from %d hidden rows", d->label,
                            hidden_src_rows);
    for (int t = 0; t < rows->n_rows; t++) {
        int src = hidden_rows ? hidden_rows[t] : t;
        if (src < 0 || src >= hidden_src_rows)
            return ds_error_set(DS_ERR_RANGE, "%s: draft row %d reads hidden row %d of %d",
                                d->label, t, src, hidden_src_rows);
        d->h_rows[t] = src;
    }
    return forward(d, rows, FROM_TARGET, hidden, hidden_src_rows, d->h_rows);
}

enum ds_status ds_eagle3_step(ds_eagle3_t *d, int n_seq, const int32_t *tokens,
                              const int32_t *positions, const int32_t *slots,
                              const int32_t *prev_rows) {
    if (!d || !tokens || !positions || !slots || !prev_rows)
        return ds_error_set(DS_ERR_ARG, "eagle3: step with a NULL argument");
    if (n_seq < 1 || n_seq > d->plan.max_slots || n_seq > d->plan.max_logit_rows)
        return ds_error_set(DS_ERR_RANGE, "%s: step over %d sequences, plan allows 1..%d", d->label,
                            n_seq, d->plan.max_slots);
    const int prev = d->last_rows;
    if (prev < 1) return ds_error_set(DS_ERR_ARG, "%s: step before any extend", d->label);
    for (int i = 0; i < n_seq; i++) {
        if (prev_rows[i] < 0 || prev_rows[i] >= prev)
            return ds_error_set(DS_ERR_RANGE,
                                "%s: step sequence %d reads row %d of the last "
                                "call's %d",
                                d->label, i, prev_rows[i], prev);
        d->h_seqs[i] =
            (struct ds_attn_seq){.row0 = i, .n_rows = 1, .pos0 = positions[i], .slot = slots[i]};
    }
    for (int i = 0; i < n_seq; i++)
        d->h_rows[i] = i;
    struct ds_batch b = {
        .n_rows = n_seq,
        .tokens = tokens,
        .n_seq = n_seq,
        .seqs = d->h_seqs,
        .n_logit_rows = n_seq,
        .logit_rows = d->h_rows,
    };
    enum ds_status s = check_rows(d, &b);
    if (s != DS_OK) return s;
    return forward(d, &b, FROM_DRAFT, NULL, prev, prev_rows);
}

// ---------------------------------------------------------------------------------------------
// Results

const void *ds_eagle3_logits(const ds_eagle3_t *d) {
    return d->logits;
}
const void *ds_eagle3_hidden_out(const ds_eagle3_t *d) {
    return d->cfg.norm_output ? d->n : d->h2;
}
const int32_t *ds_eagle3_map(const ds_eagle3_t *d) {
    return d->map;
}
const int32_t *ds_eagle3_map_host(const ds_eagle3_t *d) {
    return d->h_map;
}
int ds_eagle3_draft_vocab(const ds_eagle3_t *d) {
    return d->Dv;
}
int ds_eagle3_last_logit_rows(const ds_eagle3_t *d) {
    return d->last_logit_rows;
}
const struct ds_draft_config *ds_eagle3_config(const ds_eagle3_t *d) {
    return &d->cfg;
}
void ds_eagle3_memory_plan(const ds_eagle3_t *d, struct ds_gptoss_memory *out) {
    *out = d->mem;
}

void ds_eagle3_set_graphs(ds_eagle3_t *d, bool on) {
    if (!on) ds_graph_clear(&d->graphs);
    d->graphs.enabled = on;
}

void ds_eagle3_graph_stats(const ds_eagle3_t *d, long long *captures_out, long long *launches_out) {
    if (captures_out) *captures_out = d->graphs.captures;
    if (launches_out) *launches_out = d->graphs.launches;
}

enum ds_status ds_eagle3_clear_kv(ds_eagle3_t *d) {
    return d->be->memset(d->be, d->kv_arena, 0, d->mem.kv);
}

enum ds_elem ds_eagle3_act(const ds_eagle3_t *d) {
    return d->act;
}

enum ds_status ds_eagle3_scatter_logits(ds_eagle3_t *d, const void **full_out) {
    *full_out = NULL;
    if (!d->full)
        return ds_error_set(DS_ERR_ARG, "%s: full-vocabulary logits were not planned", d->label);
    struct ds_vocab_scatter_args a = {
        .act = d->act,
        .n_rows = d->last_logit_rows,
        .src_vocab = d->Dv,
        .dst_vocab = d->V,
        .fill = -INFINITY,
        .src = d->logits,
        .map = d->map,
        .dst = d->full,
    };
    if (a.n_rows == 0) return ds_error_set(DS_ERR_ARG, "%s: no logits to scatter", d->label);
    enum ds_status s = d->be->vocab_scatter(d->be, &a);
    if (s == DS_OK) *full_out = d->full;
    return s;
}

enum ds_status ds_eagle3_download_logits(ds_eagle3_t *d, int rows, float *host_out) {
    if (rows < 0 || rows > d->last_logit_rows)
        return ds_error_set(DS_ERR_RANGE, "%s: %d logit rows asked, the last call has %d", d->label,
                            rows, d->last_logit_rows);
    size_t n = (size_t)rows * (size_t)d->Dv;
    enum ds_status s = d->be->download(d->be, host_out, d->logits, n * d->esz);
    if (s == DS_OK) ds_act_to_float(d->act, host_out, n, host_out);
    return s;
}

enum ds_status ds_eagle3_greedy(ds_eagle3_t *d, int32_t *target_ids_out) {
    const int R = d->last_logit_rows;
    if (R == 0) return DS_OK;
    struct ds_argmax_args a = {
        .act = d->act,
        .n_rows = R,
        .vocab = d->Dv,
        .x = d->logits,
        .ids = d->argmax_ids,
        .values = NULL,
    };
    enum ds_status s = d->be->argmax(d->be, &a);
    if (s == DS_OK)
        s = d->be->download(d->be, target_ids_out, d->argmax_ids, (size_t)R * sizeof(int32_t));
    if (s != DS_OK) return s;
    for (int i = 0; i < R; i++)
        target_ids_out[i] = d->h_map[target_ids_out[i]];
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Greedy chain (eagle3.md §11)

struct ds_chain {
    ds_gptoss_t *target;
    ds_eagle3_t *draft;
    struct ds_backend *be;
    int K;
    int t_rows;                            // rows of the target's last forward
    int32_t *t_tokens;                     // (target max_rows) that forward's input tokens
    int32_t *t_argmax_dev;                 // (target max_logit_rows) device
    int32_t *t_argmax;                     // (target max_logit_rows) host
    int32_t *x_tokens, *x_hrows, *x_lrows; // (draft max_rows) extend scratch
    int32_t *v_tokens, *v_lrows;           // (target max_rows) verify scratch
    struct ds_attn_seq *seqs;              // (max slots)
    int32_t *s_tok, *s_pos, *s_slot, *s_prev, *s_out; // (max slots) step scratch
    int32_t *drafted;                                 // (max slots, K)
};

void ds_chain_release(ds_chain_t *c) {
    if (!c) return;
    if (c->be) c->be->free(c->be, c->t_argmax_dev);
    free(c->t_tokens);
    free(c->t_argmax);
    free(c->x_tokens);
    free(c->x_hrows);
    free(c->x_lrows);
    free(c->v_tokens);
    free(c->v_lrows);
    free(c->seqs);
    free(c->s_tok);
    free(c->s_pos);
    free(c->s_slot);
    free(c->s_prev);
    free(c->s_out);
    free(c->drafted);
    free(c);
}

enum ds_status ds_chain_create(ds_gptoss_t *target, ds_eagle3_t *draft, int k,
                               ds_chain_t **chain_out) {
    *chain_out = NULL;
    if (!target || !draft) return ds_error_set(DS_ERR_ARG, "chain: NULL target or draft");
    if (k < 1 || k > DS_CHAIN_MAX_K)
        return ds_error_set(DS_ERR_ARG, "chain: K = %d outside 1..%d", k, DS_CHAIN_MAX_K);
    const struct ds_gptoss_plan *tp = ds_gptoss_plan_of(target);
    int S = tp->max_slots < draft->plan.max_slots ? tp->max_slots : draft->plan.max_slots;
    if (tp->max_rows < k + 1 || tp->max_logit_rows < k + 1)
        return ds_error_set(DS_ERR_ARG,
                            "chain: the target plan needs at least K+1 = %d rows and "
                            "logit rows",
                            k + 1);
    if (draft->cfg.use_aux_hidden_state && tp->n_aux != DS_AUX_COUNT)
        return ds_error_set(DS_ERR_MISMATCH,
                            "chain: the target captures %d aux states, the "
                            "draft reads %d",
                            tp->n_aux, DS_AUX_COUNT);
    ds_chain_t *c = calloc(1, sizeof *c);
    if (!c) return ds_error_set(DS_ERR_NOMEM, "chain: out of memory");
    c->target = target;
    c->draft = draft;
    c->be = ds_gptoss_backend(target);
    c->K = k;
    size_t TR = (size_t)tp->max_rows, TL = (size_t)tp->max_logit_rows,
           DR = (size_t)draft->plan.max_rows, SS = (size_t)(S > tp->max_slots ? S : tp->max_slots);
    c->t_tokens = calloc(TR, sizeof(int32_t));
    c->t_argmax = calloc(TL, sizeof(int32_t));
    c->x_tokens = calloc(DR, sizeof(int32_t));
    c->x_hrows = calloc(DR, sizeof(int32_t));
    c->x_lrows = calloc(DR, sizeof(int32_t));
    c->v_tokens = calloc(TR, sizeof(int32_t));
    c->v_lrows = calloc(TR, sizeof(int32_t));
    c->seqs = calloc(SS, sizeof *c->seqs);
    c->s_tok = calloc(SS, sizeof(int32_t));
    c->s_pos = calloc(SS, sizeof(int32_t));
    c->s_slot = calloc(SS, sizeof(int32_t));
    c->s_prev = calloc(SS, sizeof(int32_t));
    c->s_out = calloc(SS, sizeof(int32_t));
    c->drafted = calloc(SS * (size_t)k, sizeof(int32_t));
    enum ds_status s = DS_OK;
    if (!c->t_tokens || !c->t_argmax || !c->x_tokens || !c->x_hrows || !c->x_lrows ||
        !c->v_tokens || !c->v_lrows || !c->seqs || !c->s_tok || !c->s_pos || !c->s_slot ||
        !c->s_prev || !c->s_out || !c->drafted)
        s = ds_error_set(DS_ERR_NOMEM, "chain: out of memory");
    if (s == DS_OK) s = c->be->alloc(c->be, TL * sizeof(int32_t), (void **)&c->t_argmax_dev);
    if (s != DS_OK) {
        ds_chain_release(c);
        return s;
    }
    *chain_out = c;
    return DS_OK;
}

// Greedy target tokens of the last forward's logit rows.
static enum ds_status target_argmax(ds_chain_t *c, int rows) {
    struct ds_argmax_args a = {
        .act = ds_gptoss_act(c->target),
        .n_rows = rows,
        .vocab = (int)ds_gptoss_config(c->target)->vocab_size,
        .x = ds_gptoss_logits(c->target),
        .ids = c->t_argmax_dev,
        .values = NULL,
    };
    enum ds_status s = c->be->argmax(c->be, &a);
    if (s == DS_OK)
        s = c->be->download(c->be, c->t_argmax, c->t_argmax_dev, (size_t)rows * sizeof(int32_t));
    return s;
}

enum ds_status ds_chain_prefill(ds_chain_t *c, int n_seq, const int32_t *const *prompts,
                                const int *lens, struct ds_chain_seq *seqs) {
    const struct ds_gptoss_plan *tp = ds_gptoss_plan_of(c->target);
    if (n_seq < 1 || n_seq > tp->max_slots || n_seq > tp->max_logit_rows)
        return ds_error_set(DS_ERR_RANGE, "chain: prefill of %d sequences", n_seq);
    int rows = 0;
    for (int i = 0; i < n_seq; i++) {
        if (lens[i] < 1 || lens[i] > tp->max_rows - rows)
            return ds_error_set(DS_ERR_RANGE,
                                "chain: prompts of %d+ tokens exceed the %d rows "
                                "of one step",
                                rows + lens[i], tp->max_rows);
        memcpy(c->t_tokens + rows, prompts[i], (size_t)lens[i] * sizeof(int32_t));
        c->seqs[i] =
            (struct ds_attn_seq){.row0 = rows, .n_rows = lens[i], .pos0 = 0, .slot = seqs[i].slot};
        c->v_lrows[i] = rows + lens[i] - 1;
        rows += lens[i];
    }
    struct ds_batch b = {
        .n_rows = rows,
        .tokens = c->t_tokens,
        .n_seq = n_seq,
        .seqs = c->seqs,
        .n_logit_rows = n_seq,
        .logit_rows = c->v_lrows,
    };
    enum ds_status s = ds_gptoss_forward(c->target, &b);
    if (s == DS_OK) s = target_argmax(c, n_seq);
    if (s != DS_OK) return s;
    c->t_rows = rows;
    for (int i = 0; i < n_seq; i++) {
        seqs[i].committed = lens[i];
        seqs[i].bonus = c->t_argmax[i];
        seqs[i].n_ext = lens[i];
        seqs[i].ext_row0 = c->seqs[i].row0;
    }
    return DS_OK;
}

enum ds_status ds_chain_round(ds_chain_t *c, int n_seq, struct ds_chain_seq *seqs,
                              struct ds_chain_result *res) {
    const int K = c->K;
    ds_eagle3_t *d = c->draft;
    const struct ds_gptoss_plan *tp = ds_gptoss_plan_of(c->target);
    if (n_seq < 1 || n_seq > tp->max_slots || n_seq > d->plan.max_slots ||
        n_seq * (K + 1) > tp->max_rows || n_seq * (K + 1) > tp->max_logit_rows)
        return ds_error_set(DS_ERR_RANGE, "chain: round over %d sequences does not fit the plans",
                            n_seq);
    int xrows = 0;
    for (int i = 0; i < n_seq; i++) {
        const struct ds_chain_seq *q = &seqs[i];
        if (q->committed + K >= tp->max_pos || q->committed + K > d->plan.max_pos)
            return ds_error_set(DS_ERR_RANGE,
                                "chain: sequence %d at %d tokens: context limit "
                                "of %d positions",
                                i, q->committed, tp->max_pos);
        if (q->n_ext < 1 || q->n_ext > q->committed || q->ext_row0 < 0 ||
            q->ext_row0 + q->n_ext > c->t_rows)
            return ds_error_set(DS_ERR_ARG, "chain: sequence %d has a stale extend state", i);
        xrows += q->n_ext;
    }
    if (xrows > d->plan.max_rows)
        return ds_error_set(DS_ERR_RANGE, "chain: extend of %d rows, the draft plan allows %d",
                            xrows, d->plan.max_rows);

    // 1. Extend over the rows committed last round: row r of sequence i sits at position
    //    C - n_ext + r, carries the target state of that position and the next token.
    int row = 0;
    for (int i = 0; i < n_seq; i++) {
        const struct ds_chain_seq *q = &seqs[i];
        c->seqs[i] = (struct ds_attn_seq){
            .row0 = row, .n_rows = q->n_ext, .pos0 = q->committed - q->n_ext, .slot = q->slot};
        for (int r = 0; r < q->n_ext; r++) {
            c->x_tokens[row + r] = r + 1 < q->n_ext ? c->t_tokens[q->ext_row0 + r + 1] : q->bonus;
            c->x_hrows[row + r] = q->ext_row0 + r;
        }
        row += q->n_ext;
        c->x_lrows[i] = row - 1;
    }
    struct ds_batch xb = {
        .n_rows = xrows,
        .tokens = c->x_tokens,
        .n_seq = n_seq,
        .seqs = c->seqs,
        .n_logit_rows = n_seq,
        .logit_rows = c->x_lrows,
    };
    const void *hidden =
        d->cfg.use_aux_hidden_state ? ds_gptoss_aux(c->target) : ds_gptoss_final_hidden(c->target);
    enum ds_status s = ds_eagle3_extend(d, &xb, hidden, c->t_rows, c->x_hrows);
    if (s == DS_OK) s = ds_eagle3_greedy(d, c->s_out);
    if (s != DS_OK) return s;
    for (int i = 0; i < n_seq; i++)
        c->drafted[i * K] = c->s_out[i];

    // 2. K-1 draft steps on the draft's own hidden state, one position further each.
    for (int j = 1; j < K; j++) {
        for (int i = 0; i < n_seq; i++) {
            c->s_tok[i] = c->drafted[i * K + j - 1];
            c->s_pos[i] = seqs[i].committed + j - 1;
            c->s_slot[i] = seqs[i].slot;
            c->s_prev[i] = j == 1 ? c->x_lrows[i] : i;
        }
        s = ds_eagle3_step(d, n_seq, c->s_tok, c->s_pos, c->s_slot, c->s_prev);
        if (s == DS_OK) s = ds_eagle3_greedy(d, c->s_out);
        if (s != DS_OK) return s;
        for (int i = 0; i < n_seq; i++)
            c->drafted[i * K + j] = c->s_out[i];
    }

    // 3. Verify [bonus, d_1..d_K] at positions C..C+K.
    row = 0;
    for (int i = 0; i < n_seq; i++) {
        c->seqs[i] = (struct ds_attn_seq){
            .row0 = row, .n_rows = K + 1, .pos0 = seqs[i].committed, .slot = seqs[i].slot};
        c->v_tokens[row] = seqs[i].bonus;
        for (int j = 0; j < K; j++)
            c->v_tokens[row + 1 + j] = c->drafted[i * K + j];
        for (int j = 0; j <= K; j++)
            c->v_lrows[row + j] = row + j;
        row += K + 1;
    }
    struct ds_batch vb = {
        .n_rows = row,
        .tokens = c->v_tokens,
        .n_seq = n_seq,
        .seqs = c->seqs,
        .n_logit_rows = row,
        .logit_rows = c->v_lrows,
    };
    s = ds_gptoss_forward(c->target, &vb);
    if (s == DS_OK) s = target_argmax(c, row);
    if (s != DS_OK) return s;
    memcpy(c->t_tokens, c->v_tokens, (size_t)row * sizeof(int32_t));
    c->t_rows = row;

    // 4. Greedy acceptance: accept d_i while it equals the target's argmax after the row before.
    for (int i = 0; i < n_seq; i++) {
        struct ds_chain_result *r = &res[i];
        const int32_t *t = c->t_argmax + i * (K + 1);
        memset(r, 0, sizeof *r);
        r->n_drafted = K;
        for (int j = 0; j < K; j++)
            r->drafted[j] = c->drafted[i * K + j];
        for (int j = 0; j <= K; j++)
            r->target_argmax[j] = t[j];
        int a = 0;
        while (a < K && r->drafted[a] == t[a])
            a++;
        r->accepted = a;
        r->n_emitted = a + 1;
        for (int j = 0; j < a; j++)
            r->emitted[j] = r->drafted[j];
        r->emitted[a] = t[a];
        struct ds_chain_seq *q = &seqs[i];
        q->ext_row0 = c->seqs[i].row0;
        q->n_ext = a + 1;
        q->committed += a + 1;
        q->bonus = t[a];
    }
    return DS_OK;
}
