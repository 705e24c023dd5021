// The gpt-oss target: loading, the memory plan and the forward pass (spec gpt-oss.md §1-§4).
//
// Dimension letters (this file): T rows of the step (<= max_rows), R logit rows (<=
// max_logit_rows), H hidden, NH query heads, NKV KV heads, D head dim, V vocabulary, E experts, KE
// experts per token, I expert intermediate, L layers, S slots, P positions per slot, A aux
// boundaries.
//
// The forward pass reads like the spec: embed, then per layer an attention block and a MoE block,
// each a residual update of x, then the final norm and the lm_head over the rows that want logits.
// Every op goes through the backend table; this file never touches a device buffer itself.
#include "ds/gptoss.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/bf16.h"
#include "ds/checkpoint.h"
#include "ds/kernels.h"
#include "weights.h"

struct layer_weights {
    struct ds_wt attn_norm;          // (H) input_layernorm
    struct ds_wt q_w, q_b;           // (NH·D, H), (NH·D)
    struct ds_wt k_w, k_b, v_w, v_b; // (NKV·D, H), (NKV·D)
    struct ds_wt o_w, o_b;           // (H, NH·D), (H)
    bool qkv_fused;                  // q_w, k_w, v_w back to back: one split matmul
    struct ds_wt sinks;              // (NH)
    struct ds_wt mlp_norm;           // (H) post_attention_layernorm
    struct ds_wt router_w, router_b; // (E, H), (E)
    const uint8_t *gu_blocks;        // (E, 2I, H/32, 16) u8
    const uint8_t *gu_scales;        // (E, 2I, H/32) u8
    struct ds_wt gu_bias;            // (E, 2I)
    const uint8_t *down_blocks;      // (E, H, I/32, 16) u8
    const uint8_t *down_scales;      // (E, H, I/32) u8
    struct ds_wt down_bias;          // (E, H)
};

struct ds_gptoss {
    struct ds_target_config cfg;
    ds_safetensors_t *st_own; // opened by ds_gptoss_create, else NULL (borrowed)
    char label[512];
    struct ds_backend *be;
    struct ds_gptoss_plan plan;
    enum ds_elem act;
    size_t esz; // bytes per activation element
    int H, NH, NKV, D, V, E, KE, I, L;

    struct ds_wt embed, final_norm, lm_head; // (V, H), (H), (V, H)
    struct layer_weights *layers;            // (L)
    void *weight_arena;                      // uploaded weights (NULL on a mapping backend)

    void *kv_arena; // every layer's caches
    void **k_cache; // (L) → (S, P, NKV, D) act
    void **v_cache; // (L) → (S, P, NKV, D) act

    void *act_arena;
    void *x;             // (T, H) act, the residual stream
    void *xn;            // (T, H) act, g ⊙ x for the attention norm (deferred, see below); after
                         // the step: the final post-norm hidden
    void *xg;            // (T, H) act, g ⊙ x for the MLP norm (deferred)
    float *row_scale;    // (T) the MLP norm's 1/rms of each row, from the router to the MoE
    void *q;             // (T, NH·D) act
    void *k, *v;         // (T, NKV·D) act
    void *attn;          // (T, NH·D) act
    void *gathered;      // (R, H) act
    void *logits;        // (R, V) act
    void *aux;           // (T, A·H) act
    int32_t *expert_ids; // (L, T, KE)
    float *expert_w;     // (T, KE)
    void *moe_ws;        // ds_moe_workspace_bytes_v2(T, H, I, E, KE): any backend's need
    size_t moe_ws_bytes;
    void *attn_ws; // ds_attention_workspace_bytes(T, NH, D, P): the CUDA split-key path
    void *router_ws; // ds_router_workspace_bytes(T, E): the CUDA many-block path for few rows
    size_t router_ws_bytes;
    size_t attn_ws_bytes;
    float *rope_cos, *rope_sin; // (P, D/2)
    int32_t *d_tokens;          // (T)
    int32_t *d_pos;             // (T)
    int32_t *d_rows;            // (R)
    struct ds_attn_seq *d_seqs; // (S)

    int32_t *h_pos;             // (T) host scratch
    // The per-step tables (d_tokens, d_pos, d_rows, d_seqs) lie in one device block of
    // step_bytes, and h_step mirrors its layout on the host: one upload per step, not four (each
    // copy is a transfer of its own in front of the step's first kernel).
    unsigned char *h_step;
    size_t step_bytes;
    unsigned char *h_slot_used; // (S) host scratch
    int last_rows, last_logit_rows;
    struct ds_gptoss_memory mem;

    int cur_T, cur_seq, cur_R;    // the step being run (read by forward_ops)
    struct ds_graph_cache graphs; // CUDA graphs of step shapes
};

// ---------------------------------------------------------------------------------------------
// Loading

static enum ds_status bind(struct ds_weight_loader *wl, struct ds_wt *w, const char *name,
                           uint64_t numel) {
    return ds_wl_bind(wl, w, name, numel, false);
}

static enum ds_status bind_u8(struct ds_weight_loader *wl, const uint8_t **p, const char *name,
                              uint64_t numel) {
    const void *v = NULL;
    enum ds_status s = ds_wl_get(wl, name, DS_WL_U8, numel, false, &v, NULL);
    *p = v;
    return s;
}

// Binds every tensor (one loader pass). Names: spec gpt-oss.md §2.
static enum ds_status bind_all(ds_gptoss_t *m, struct ds_weight_loader *wl) {
    const uint64_t H = (uint64_t)m->H, V = (uint64_t)m->V, E = (uint64_t)m->E, I = (uint64_t)m->I,
                   QD = (uint64_t)m->NH * m->D, KD = (uint64_t)m->NKV * m->D;
    enum ds_status s;
    if ((s = bind(wl, &m->embed, "model.embed_tokens.weight", V * H))) return s;
    if ((s = bind(wl, &m->final_norm, "model.norm.weight", H))) return s;
    if ((s = bind(wl, &m->lm_head, "lm_head.weight", V * H))) return s;
    char n[160];
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
    for (int l = 0; l < m->L; l++) {
        struct layer_weights *w = &m->layers[l];
        if ((s = bind(wl, &w->attn_norm, NAME("input_layernorm.weight"), H))) return s;
        // q, k, v weights bound one after the other: the loader places them back to back (their
        // sizes are multiples of 256 bytes for every real shape), so one matmul can run all three.
        if ((s = bind(wl, &w->q_w, NAME("self_attn.q_proj.weight"), QD * H))) return s;
        if ((s = bind(wl, &w->k_w, NAME("self_attn.k_proj.weight"), KD * H))) return s;
        if ((s = bind(wl, &w->v_w, NAME("self_attn.v_proj.weight"), KD * H))) return s;
        if ((s = bind(wl, &w->q_b, NAME("self_attn.q_proj.bias"), QD))) return s;
        if ((s = bind(wl, &w->k_b, NAME("self_attn.k_proj.bias"), KD))) return s;
        if ((s = bind(wl, &w->v_b, NAME("self_attn.v_proj.bias"), KD))) return s;
        if ((s = bind(wl, &w->o_w, NAME("self_attn.o_proj.weight"), H * QD))) return s;
        if ((s = bind(wl, &w->o_b, NAME("self_attn.o_proj.bias"), H))) return s;
        if ((s = bind(wl, &w->sinks, NAME("self_attn.sinks"), (uint64_t)m->NH))) return s;
        if ((s = bind(wl, &w->mlp_norm, NAME("post_attention_layernorm.weight"), H))) return s;
        if ((s = bind(wl, &w->router_w, NAME("mlp.router.weight"), E * H))) return s;
        if ((s = bind(wl, &w->router_b, NAME("mlp.router.bias"), E))) return s;
        if ((s = bind_u8(wl, &w->gu_blocks, NAME("mlp.experts.gate_up_proj_blocks"),
                         E * 2 * I * H / 2)))
            return s;
        if ((s = bind_u8(wl, &w->gu_scales, NAME("mlp.experts.gate_up_proj_scales"),
                         E * 2 * I * (H / 32))))
            return s;
        if ((s = bind(wl, &w->gu_bias, NAME("mlp.experts.gate_up_proj_bias"), E * 2 * I))) return s;
        if ((s = bind_u8(wl, &w->down_blocks, NAME("mlp.experts.down_proj_blocks"), E * H * I / 2)))
            return s;
        if ((s = bind_u8(wl, &w->down_scales, NAME("mlp.experts.down_proj_scales"),
                         E * H * (I / 32))))
            return s;
        if ((s = bind(wl, &w->down_bias, NAME("mlp.experts.down_proj_bias"), E * H))) return s;
        if (w->gu_bias.e != w->down_bias.e)
            return ds_error_set(DS_ERR_UNSUPPORTED,
                                "%s: layer %d expert biases have different dtypes", m->label, l);
    }
#undef NAME
    return DS_OK;
}

// Whether layer l's q, k and v weight matrices lie back to back in one dtype (biases may live
// anywhere, in one dtype): then one matmul with split outputs computes all three (the same bits
// as three calls). Checked once, after the load pass.
static bool qkv_contiguous(const ds_gptoss_t *m, const struct layer_weights *w) {
    if (w->k_b.e != w->q_b.e || w->v_b.e != w->q_b.e) return false; // one bias_dtype
    const uint64_t H = (uint64_t)m->H;
    return ds_wt_follows(&w->q_w, (uint64_t)m->NH * m->D * H, &w->k_w) &&
           ds_wt_follows(&w->k_w, (uint64_t)m->NKV * m->D * H, &w->v_w);
}

static enum ds_status check_plan(const ds_gptoss_t *m, const struct ds_gptoss_plan *p) {
    const struct ds_target_config *c = &m->cfg;
    if (p->max_slots < 1 || p->max_rows < 1 || p->max_pos < 1 || p->max_logit_rows < 0)
        return ds_error_set(DS_ERR_ARG,
                            "%s: plan needs max_slots, max_rows, max_pos >= 1 (got %d, %d, %d)",
                            m->label, p->max_slots, p->max_rows, p->max_pos);
    if (p->max_pos > c->max_position_embeddings)
        return ds_error_set(DS_ERR_RANGE,
                            "%s: context of %d positions is longer than the model allows (%lld)",
                            m->label, p->max_pos, (long long)c->max_position_embeddings);
    if (p->n_aux < 0 || p->n_aux > DS_GPTOSS_MAX_AUX)
        return ds_error_set(DS_ERR_ARG, "%s: %d aux boundaries requested, at most %d", m->label,
                            p->n_aux, DS_GPTOSS_MAX_AUX);
    for (int i = 0; i < p->n_aux; i++) {
        int b = p->aux_boundaries[i];
        if (b < 0 || b > m->L)
            return ds_error_set(DS_ERR_RANGE, "%s: aux boundary %d outside 0..%d", m->label, b,
                                m->L);
        if (i && b <= p->aux_boundaries[i - 1])
            return ds_error_set(DS_ERR_ARG, "%s: aux boundaries must be strictly ascending",
                                m->label);
    }
    return DS_OK;
}

enum ds_status ds_gptoss_check_config(const struct ds_target_config *c, const char *label,
                                      struct ds_problems *p) {
    const size_t before = p->count;
    if (!c->mxfp4)
        ds_problems_add(p,
                        "%s: quantization_config: expected quant_method \"mxfp4\" (only MXFP4 "
                        "experts are supported), found none",
                        label);
    if (c->head_dim > DS_MAX_HEAD_DIM || c->head_dim % 2)
        ds_problems_add(p, "%s: head_dim: expected an even value up to %d, found %lld", label,
                        DS_MAX_HEAD_DIM, (long long)c->head_dim);
    // With MXFP4 the parser refuses these already; a config built in code may not have been parsed.
    if (c->hidden_size % 32 || c->intermediate_size % 32)
        ds_problems_add(p,
                        "%s: hidden_size and intermediate_size: expected multiples of 32 (MXFP4 "
                        "blocks), found %lld and %lld",
                        label, (long long)c->hidden_size, (long long)c->intermediate_size);
    if (c->num_experts_per_tok > DS_MAX_TOPK || c->num_experts_per_tok > c->num_local_experts)
        ds_problems_add(p,
                        "%s: num_experts_per_tok: expected at most %d and at most "
                        "num_local_experts %lld, found %lld",
                        label, DS_MAX_TOPK, (long long)c->num_local_experts,
                        (long long)c->num_experts_per_tok);
    // The ops take int dims: beyond these, their products with small factors could overflow.
    if (c->vocab_size > INT32_MAX / 2)
        ds_problems_add(p, "%s: vocab_size: expected at most %d, found %lld", label,
                        INT32_MAX / 2, (long long)c->vocab_size);
    if (c->hidden_size > INT32_MAX / 8)
        ds_problems_add(p, "%s: hidden_size: expected at most %d, found %lld", label,
                        INT32_MAX / 8, (long long)c->hidden_size);
    if (c->rope.type != DS_ROPE_YARN && c->rope.type != DS_ROPE_DEFAULT)
        ds_problems_add(p, "%s: rope type: expected default or yarn, found %s", label,
                        ds_rope_type_name(c->rope.type));
    return p->count > before ? ds_problems_error(DS_ERR_UNSUPPORTED, p, before) : DS_OK;
}

enum ds_status ds_gptoss_check_dir(const char *dir, struct ds_target_config *cfg_out) {
    enum ds_status s = ds_target_config_load(dir, cfg_out);
    if (s != DS_OK) return s;
    char label[4096];
    snprintf(label, sizeof label, "%s/config.json", dir);
    struct ds_problems problems = {0};
    ds_safetensors_t *st = NULL;
    s = ds_gptoss_check_config(cfg_out, label, &problems);
    if (s == DS_OK) s = ds_safetensors_open_dir(dir, &st);
    if (s == DS_OK && (s = ds_checkpoint_check_target(cfg_out, st, dir, &problems)) != DS_OK)
        ds_problems_error(s, &problems, 0);
    ds_safetensors_close(st);
    ds_problems_free(&problems);
    return s;
}

// Carves one arena: each call reserves `bytes` (256-aligned) and returns its offset pointer
// (a NULL base during the sizing pass).
static void *carve(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += ds_align256(bytes);
    return p;
}

static size_t carve_activations(ds_gptoss_t *m, char *base) {
    const size_t T = (size_t)m->plan.max_rows, R = (size_t)m->plan.max_logit_rows, e = m->esz,
                 H = (size_t)m->H, QD = (size_t)m->NH * m->D, KD = (size_t)m->NKV * m->D,
                 KE = (size_t)m->KE;
    size_t off = 0;
    m->x = carve(base, &off, T * H * e);
    m->xn = carve(base, &off, T * H * e);
    m->xg = carve(base, &off, T * H * e);
    m->row_scale = carve(base, &off, T * sizeof(float));
    m->q = carve(base, &off, T * QD * e);
    m->k = carve(base, &off, T * KD * e);
    m->v = carve(base, &off, T * KD * e);
    m->attn = carve(base, &off, T * QD * e);
    m->gathered = carve(base, &off, (R ? R : 1) * H * e);
    m->logits = carve(base, &off, (R ? R : 1) * (size_t)m->V * e);
    m->aux = carve(base, &off, T * (size_t)(m->plan.n_aux ? m->plan.n_aux : 1) * H * e);
    m->expert_ids = carve(base, &off, (size_t)m->L * T * KE * sizeof(int32_t));
    m->expert_w = carve(base, &off, T * KE * sizeof(float));
    m->moe_ws_bytes = ds_moe_workspace_bytes_v2(m->plan.max_rows, m->H, m->I, m->E, m->KE);
    m->moe_ws = carve(base, &off, m->moe_ws_bytes ? m->moe_ws_bytes : 1);
    m->attn_ws_bytes = ds_attention_workspace_bytes(m->plan.max_rows, m->NH, m->D, m->plan.max_pos);
    m->attn_ws = m->attn_ws_bytes ? carve(base, &off, m->attn_ws_bytes) : NULL;
    m->router_ws_bytes = ds_router_workspace_bytes(m->plan.max_rows, m->E);
    m->router_ws = m->router_ws_bytes ? carve(base, &off, m->router_ws_bytes) : NULL;
    size_t rope = (size_t)m->plan.max_pos * (size_t)(m->D / 2) * sizeof(float);
    m->rope_cos = carve(base, &off, rope);
    m->rope_sin = carve(base, &off, rope);
    const size_t step0 = off; // the step tables: last, one block (see h_step)
    m->d_tokens = carve(base, &off, T * sizeof(int32_t));
    m->d_pos = carve(base, &off, T * sizeof(int32_t));
    m->d_rows = carve(base, &off, (R ? R : 1) * sizeof(int32_t));
    m->d_seqs = carve(base, &off, (size_t)m->plan.max_slots * sizeof(struct ds_attn_seq));
    m->step_bytes = off - step0;
    return off;
}

// Creates a model over a checkpoint (st) or a weight generator (gen, synthetic weights).
// `label` names the checkpoint, `cfg_label` the config (DIR/config.json when read from DIR).
// With `measure` (and out NULL) it stops after the checks and the measure pass: *measure is the
// memory plan that create would allocate, and nothing is allocated on the backend.
static enum ds_status create_impl(const struct ds_target_config *cfg, const ds_safetensors_t *st,
                                  const struct ds_weight_gen *gen, const char *label,
                                  const char *cfg_label, struct ds_backend *be,
                                  const struct ds_gptoss_plan *plan,
                                  const struct ds_load_progress *progress, ds_gptoss_t **out,
                                  struct ds_gptoss_memory *measure) {
    if (out) *out = NULL;
    enum ds_status s = ds_backend_check(be);
    if (s != DS_OK) return s;
    if (!plan) return ds_error_set(DS_ERR_ARG, "%s: no memory plan given", label);
    ds_gptoss_t *m = calloc(1, sizeof *m);
    if (!m) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", label);
    m->cfg = *cfg;
    m->be = be;
    snprintf(m->label, sizeof m->label, "%s", label);
    ds_graph_init(&m->graphs, be);
    m->graphs.enabled = plan->graphs;
    s = ds_act_resolve(be, (int)plan->act, m->label, &m->act);
    if (s != DS_OK) {
        free(m);
        return s;
    }
    m->esz = ds_elem_size(m->act);
    m->H = (int)cfg->hidden_size;
    m->NH = (int)cfg->num_attention_heads;
    m->NKV = (int)cfg->num_key_value_heads;
    m->D = (int)cfg->head_dim;
    m->V = (int)cfg->vocab_size;
    m->E = (int)cfg->num_local_experts;
    m->KE = (int)cfg->num_experts_per_tok;
    m->I = (int)cfg->intermediate_size;
    m->L = (int)cfg->num_hidden_layers;
    m->plan = *plan;
    if (m->plan.max_logit_rows == 0) m->plan.max_logit_rows = m->plan.max_rows;

    struct ds_problems problems = {0};
    struct ds_weight_loader wl = {0};
    // The config (what inspect refuses too), the backend's head dims, the plan, then the table.
    if ((s = ds_gptoss_check_config(&m->cfg, cfg_label, &problems)) != DS_OK ||
        (s = ds_wl_check_head_dim(be, cfg->head_dim, m->label)) != DS_OK ||
        (s = check_plan(m, &m->plan)) != DS_OK)
        goto fail;
    if (st && (s = ds_checkpoint_check_target(&m->cfg, st, label, &problems)) != DS_OK) {
        ds_problems_error(s, &problems, 0); // the first problem, and how many there were
        goto fail;
    }
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    m->k_cache = calloc((size_t)m->L, sizeof *m->k_cache);
    m->v_cache = calloc((size_t)m->L, sizeof *m->v_cache);
    m->h_pos = calloc((size_t)m->plan.max_rows, sizeof *m->h_pos);
    m->h_slot_used = calloc((size_t)m->plan.max_slots, 1);
    if (!m->layers || !m->k_cache || !m->v_cache || !m->h_pos || !m->h_slot_used) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", label);
        goto fail;
    }

    // Weights: measure, allocate (when uploading); then every other buffer of the plan, so that
    // a plan that does not fit is refused before the long upload or generation; then load.
    if (gen)
        ds_wl_init_gen(&wl, be, gen, m->label, progress ? progress->fn : NULL,
                       progress ? progress->user : NULL);
    else
        ds_wl_init(&wl, be, st, m->label, progress ? progress->fn : NULL,
                   progress ? progress->user : NULL);
    if ((s = bind_all(m, &wl)) != DS_OK) goto fail;
    // KV caches: (S, P, NKV, D) per layer for K and for V, in the activation dtype.
    size_t per = (size_t)m->plan.max_slots * (size_t)m->plan.max_pos * (size_t)m->NKV *
                 (size_t)m->D * m->esz;
    size_t per_al = ds_align256(per);
    m->mem.kv = 2 * per_al * (size_t)m->L;
    if (measure) { // the plan only: the bytes the passes below would allocate and place
        *measure = (struct ds_gptoss_memory){.weights = wl.bytes,
                                             .kv = m->mem.kv,
                                             .activations = carve_activations(m, NULL)};
        goto fail; // s is DS_OK: the shared cleanup
    }
    if ((s = ds_wl_begin_load(&wl, &m->weight_arena)) != DS_OK) goto fail;
    s = be->alloc(be, m->mem.kv, &m->kv_arena);
    if (s != DS_OK) {
        ds_error_set(s, "%s: cannot allocate %zu bytes of KV cache (%d slots x %d positions): %s",
                     label, m->mem.kv, m->plan.max_slots, m->plan.max_pos, ds_error_last());
        goto fail;
    }
    for (int l = 0; l < m->L; l++) {
        m->k_cache[l] = (char *)m->kv_arena + (size_t)(2 * l) * per_al;
        m->v_cache[l] = (char *)m->kv_arena + (size_t)(2 * l + 1) * per_al;
    }

    m->mem.activations = carve_activations(m, NULL);
    s = be->alloc(be, m->mem.activations, &m->act_arena);
    if (s != DS_OK) {
        ds_error_set(s, "%s: cannot allocate %zu bytes of activations: %s", label,
                     m->mem.activations, ds_error_last());
        goto fail;
    }
    carve_activations(m, m->act_arena);
    m->h_step = calloc(m->step_bytes, 1);
    if (!m->h_step) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", label);
        goto fail;
    }

    if ((s = bind_all(m, &wl)) != DS_OK) goto fail;
    if ((s = ds_wl_finish(&wl)) != DS_OK) goto fail;
    m->mem.weights = wl.bytes;
    for (int l = 0; l < m->L; l++) m->layers[l].qkv_fused = qkv_contiguous(m, &m->layers[l]);

    struct ds_rope_spec rs = {
        .yarn = cfg->rope.type == DS_ROPE_YARN,
        .head_dim = m->D,
        .theta = cfg->rope.theta,
        .factor = cfg->rope.factor,
        .beta_fast = cfg->rope.beta_fast,
        .beta_slow = cfg->rope.beta_slow,
        .attention_factor = cfg->rope.attention_factor,
        .original_max_pos = (int)cfg->rope.original_max_position_embeddings,
        .truncate = cfg->rope.truncate,
    };
    if ((s = ds_rope_upload(be, &rs, m->plan.max_pos, m->rope_cos, m->rope_sin)) != DS_OK) {
        ds_error_set(s, "%s: rope: %s", label, ds_error_last());
        goto fail;
    }
    ds_problems_free(&problems);
    *out = m;
    return DS_OK;

fail:
    ds_wl_finish(&wl);
    ds_problems_free(&problems);
    ds_gptoss_release(m);
    return s;
}

enum ds_status ds_gptoss_create_from(const struct ds_target_config *cfg, const ds_safetensors_t *st,
                                     const char *label, struct ds_backend *be,
                                     const struct ds_gptoss_plan *plan,
                                     const struct ds_load_progress *progress,
                                     ds_gptoss_t **model_out) {
    if (model_out) *model_out = NULL;
    if (!cfg || !st || !model_out)
        return ds_error_set(DS_ERR_ARG, "gptoss: create with a NULL config, checkpoint or out");
    if (!label) label = "target";
    return create_impl(cfg, st, NULL, label, label, be, plan, progress, model_out, NULL);
}

// DIR opened (config.json, safetensors) and created or measured; a created model owns the set.
static enum ds_status from_dir(const char *dir, struct ds_backend *be,
                               const struct ds_gptoss_plan *plan,
                               const struct ds_load_progress *progress, ds_gptoss_t **model_out,
                               struct ds_gptoss_memory *measure) {
    struct ds_target_config cfg;
    enum ds_status s = ds_target_config_load(dir, &cfg);
    if (s != DS_OK) return s;
    ds_safetensors_t *st = NULL;
    if ((s = ds_safetensors_open_dir(dir, &st)) != DS_OK) return s;
    char cfg_label[4096];
    snprintf(cfg_label, sizeof cfg_label, "%s/config.json", dir);
    s = create_impl(&cfg, st, NULL, dir, cfg_label, be, plan, progress, model_out, measure);
    if (s != DS_OK || measure) {
        ds_safetensors_close(st);
        return s;
    }
    (*model_out)->st_own = st;
    return DS_OK;
}

enum ds_status ds_gptoss_create(const char *dir, struct ds_backend *be,
                                const struct ds_gptoss_plan *plan,
                                const struct ds_load_progress *progress, ds_gptoss_t **model_out) {
    if (model_out) *model_out = NULL;
    if (!dir || !model_out) return ds_error_set(DS_ERR_ARG, "gptoss: create with a NULL argument");
    return from_dir(dir, be, plan, progress, model_out, NULL);
}

enum ds_status ds_gptoss_create_gen(const struct ds_target_config *cfg,
                                    const struct ds_weight_gen *gen, const char *label,
                                    struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                    const struct ds_load_progress *progress,
                                    ds_gptoss_t **model_out) {
    if (model_out) *model_out = NULL;
    if (!cfg || !gen || !model_out)
        return ds_error_set(DS_ERR_ARG, "gptoss: create with a NULL config, generator or out");
    if (!label) label = "synthetic target";
    return create_impl(cfg, NULL, gen, label, label, be, plan, progress, model_out, NULL);
}

enum ds_status ds_gptoss_measure(const char *dir, struct ds_backend *be,
                                 const struct ds_gptoss_plan *plan, struct ds_gptoss_memory *out) {
    if (!dir || !out) return ds_error_set(DS_ERR_ARG, "gptoss: measure with a NULL argument");
    return from_dir(dir, be, plan, NULL, NULL, out);
}

enum ds_status ds_gptoss_measure_gen(const struct ds_target_config *cfg,
                                     const struct ds_weight_gen *gen, const char *label,
                                     struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                     struct ds_gptoss_memory *out) {
    if (!cfg || !gen || !out)
        return ds_error_set(DS_ERR_ARG, "gptoss: measure with a NULL config, generator or out");
    if (!label) label = "synthetic target";
    return create_impl(cfg, NULL, gen, label, label, be, plan, NULL, NULL, out);
}

void ds_gptoss_release(ds_gptoss_t *m) {
    if (!m) return;
    ds_graph_clear(&m->graphs);
    if (m->be) {
        m->be->free(m->be, m->act_arena);
        m->be->free(m->be, m->kv_arena);
        m->be->free(m->be, m->weight_arena);
    }
    free(m->layers);
    free(m->k_cache);
    free(m->v_cache);
    free(m->h_pos);
    free(m->h_step);
    free(m->h_slot_used);
    ds_safetensors_close(m->st_own);
    free(m);
}

// ---------------------------------------------------------------------------------------------
// Forward

static enum ds_status check_batch(ds_gptoss_t *m, const struct ds_batch *b) {
    if (!b) return ds_error_set(DS_ERR_ARG, "%s: forward with a NULL batch", m->label);
    const struct ds_rows_limits lim = {
        .max_rows = m->plan.max_rows,
        .max_slots = m->plan.max_slots,
        .max_logit_rows = m->plan.max_logit_rows,
        .max_pos = m->plan.max_pos,
        .vocab = m->V,
    };
    return ds_rows_check(m->label, &lim, b->n_rows, b->tokens, b->n_seq, b->seqs, b->n_logit_rows,
                         b->logit_rows, m->h_slot_used, m->h_pos);
}

// Copies the residual stream into aux column block j (the EAGLE-3 concat order is ascending).
static enum ds_status capture_aux(ds_gptoss_t *m, int boundary, int T) {
    struct ds_backend *be = m->be;
    const size_t row = (size_t)m->H * m->esz;
    for (int j = 0; j < m->plan.n_aux; j++)
        if (m->plan.aux_boundaries[j] == boundary)
            return be->copy_2d(be, (char *)m->aux + (size_t)j * row, row * (size_t)m->plan.n_aux,
                               m->x, row, row, (size_t)T);
    return DS_OK;
}

static enum ds_status matmul(ds_gptoss_t *m, int T, int in, int out, const void *x,
                             const struct ds_wt *w, const struct ds_wt *bias, const void *residual,
                             void *y) {
    return ds_op_matmul(m->be, m->act, T, in, out, x, w, bias, residual, y);
}

static enum ds_status rmsnorm(ds_gptoss_t *m, int T, const void *x, const struct ds_wt *w,
                              void *y) {
    return ds_op_rmsnorm(m->be, m->act, T, m->H, m->cfg.rms_norm_eps, x, w, y);
}

// x += o_proj(attention(rope(q, k), v)) for layer l (spec §4.3).
//
// The two norms of a layer are deferred (ds/kernel_args.h, Deferred RMSNorm): the op that writes
// x also writes g ⊙ x for the next norm (the embedding and each MoE: xn for the attention norm;
// o_proj: xg for the MLP norm), and q/k/v and the router read g ⊙ x and scale each row's sums by
// 1/rms(x) before their bias; the MoE takes that scale from the router (row_scale). No norm op
// runs between a producer and its consumers. Only the final norm is a plain ds_rmsnorm (its
// output is the post-norm hidden state the drafts read).
static enum ds_status attention_block(ds_gptoss_t *m, int l, int T, int n_seq) {
    const struct layer_weights *w = &m->layers[l];
    struct ds_backend *be = m->be;
    const int QD = m->NH * m->D, KD = m->NKV * m->D;
    const float eps = m->cfg.rms_norm_eps;
    enum ds_status s;
    struct ds_rope_args r = {
        .act = m->act,
        .n_rows = T,
        .head_dim = m->D,
        .n_q_heads = m->NH,
        .n_k_heads = m->NKV,
        .q = m->q,
        .k = m->k,
        .positions = m->d_pos,
        .cos = m->rope_cos,
        .sin = m->rope_sin,
        .table_len = m->plan.max_pos,
    };
    if (w->qkv_fused) {
        // One call streams [q_w; k_w; v_w], writes q, k and v (ds_matmul_args split) and rotates
        // q and k (its RoPE fields: the bits of the rope op after it; on CUDA the rotation
        // happens inside the small-T product, one launch fewer per layer).
        struct ds_matmul_args qkv = {
            .act = m->act,
            .w_dtype = w->q_w.e,
            .bias_dtype = w->q_b.e,
            .n_rows = T,
            .in_dim = m->H,
            .out_dim = QD + 2 * KD,
            .x = m->xn,
            .w = w->q_w.p,
            .bias = w->q_b.p,
            .out = m->q,
            .part_dim = {QD, KD, KD},
            .out1 = m->k,
            .out2 = m->v,
            .bias1 = w->k_b.p,
            .bias2 = w->v_b.p,
            .rope_head_dim = r.head_dim,
            .rope_positions = r.positions,
            .rope_cos = r.cos,
            .rope_sin = r.sin,
            .rope_table_len = r.table_len,
            .rms_of = m->x,
            .rms_eps = eps,
        };
        if ((s = be->matmul(be, &qkv))) return s;
    } else {
        const struct ds_wt *pw[3] = {&w->q_w, &w->k_w, &w->v_w}, *pb[3] = {&w->q_b, &w->k_b, &w->v_b};
        void *po[3] = {m->q, m->k, m->v};
        for (int j = 0; j < 3; j++) {
            struct ds_matmul_args p = {
                .act = m->act,
                .w_dtype = pw[j]->e,
                .bias_dtype = pb[j]->e,
                .n_rows = T,
                .in_dim = m->H,
                .out_dim = j ? KD : QD,
                .x = m->xn,
                .w = pw[j]->p,
                .bias = pb[j]->p,
                .out = po[j],
                .rms_of = m->x,
                .rms_eps = eps,
            };
            if ((s = be->matmul(be, &p))) return s;
        }
        if ((s = be->rope(be, &r))) return s;
    }
    struct ds_attention_args a = {
        .act = m->act,
        .cache_dtype = m->act,
        .sinks_dtype = w->sinks.e,
        .n_rows = T,
        .n_heads = m->NH,
        .n_kv_heads = m->NKV,
        .head_dim = m->D,
        .n_seq = n_seq,
        .seqs = m->d_seqs,
        .q = m->q,
        .k = m->k,
        .v = m->v,
        .k_cache = m->k_cache[l],
        .v_cache = m->v_cache[l],
        .n_slots = m->plan.max_slots,
        .max_pos = m->plan.max_pos,
        .window = m->cfg.layer_types[l] == DS_ATTN_SLIDING ? (int)m->cfg.sliding_window : 0,
        .scale = 1.0f / sqrtf((float)m->D),
        .sinks = w->sinks.p,
        .out = m->attn,
        .workspace = m->attn_ws,
        .workspace_bytes = m->attn_ws_bytes,
        // The cache below pos0 was written by an earlier call of this layer, with the q/k/v
        // product (at least) between it and this call.
        .cache_settled = 1,
    };
    if ((s = be->attention(be, &a))) return s;
    // x += o_proj(attn), and xg = g ⊙ x for the MLP norm.
    struct ds_matmul_args o = {
        .act = m->act,
        .w_dtype = w->o_w.e,
        .bias_dtype = w->o_b.e,
        .n_rows = T,
        .in_dim = QD,
        .out_dim = m->H,
        .x = m->attn,
        .w = w->o_w.p,
        .bias = w->o_b.p,
        .residual = m->x,
        .out = m->x,
        .norm_gain = w->mlp_norm.p,
        .norm_gain_dtype = w->mlp_norm.e,
        .norm_out = m->xg,
    };
    return be->matmul(be, &o);
}

// x += Σ_s w_s · expert_s(rmsnorm(x)) over the router's top-k (spec §4.5-§4.6).
static enum ds_status moe_block(ds_gptoss_t *m, int l, int T) {
    const struct layer_weights *w = &m->layers[l];
    struct ds_backend *be = m->be;
    int32_t *ids = m->expert_ids + (size_t)l * (size_t)m->plan.max_rows * (size_t)m->KE;
    enum ds_status s;
    struct ds_router_args r = {
        .act = m->act,
        .w_dtype = w->router_w.e,
        .bias_dtype = w->router_b.e,
        .n_rows = T,
        .dim = m->H,
        .n_experts = m->E,
        .top_k = m->KE,
        .x = m->xg,
        .w = w->router_w.p,
        .bias = w->router_b.p,
        .expert_ids = ids,
        .expert_weights = m->expert_w,
        .workspace = m->router_ws,
        .workspace_bytes = m->router_ws_bytes,
        .rms_of = m->x,
        .rms_eps = m->cfg.rms_norm_eps,
        .row_scale = m->row_scale,
    };
    if ((s = be->router(be, &r))) return s;
    struct ds_moe_args a = {
        .act = m->act,
        .bias_dtype = w->gu_bias.e,
        .n_rows = T,
        .dim = m->H,
        .inter = m->I,
        .n_experts = m->E,
        .top_k = m->KE,
        .swiglu_alpha = (float)m->cfg.swiglu_alpha,
        .swiglu_limit = (float)m->cfg.swiglu_limit,
        .x = m->xg,
        .expert_ids = ids,
        .expert_weights = m->expert_w,
        .gate_up_blocks = w->gu_blocks,
        .gate_up_scales = w->gu_scales,
        .gate_up_bias = w->gu_bias.p,
        .down_blocks = w->down_blocks,
        .down_scales = w->down_scales,
        .down_bias = w->down_bias.p,
        .residual = m->x,
        .out = m->x,
        .workspace = m->moe_ws,
        .workspace_bytes = m->moe_ws_bytes,
        .row_scale = m->row_scale,
    };
    if (l + 1 < m->L) { // the next layer's attention norm input (the final norm is a plain op)
        a.norm_gain = m->layers[l + 1].attn_norm.p;
        a.norm_gain_dtype = m->layers[l + 1].attn_norm.e;
        a.norm_out = m->xn;
    }
    return be->moe(be, &a);
}

// The op sequence of one step over the tables already on the device: depends on the host only
// through (cur_T, cur_seq, cur_R), the CUDA-graph key.
static enum ds_status forward_ops(void *user) {
    ds_gptoss_t *m = user;
    struct ds_backend *be = m->be;
    const int T = m->cur_T, R = m->cur_R;
    enum ds_status s;

    // x = embed_tokens[token] (no scaling, spec §4.1).
    struct ds_embed_args e = {
        .act = m->act,
        .table_dtype = m->embed.e,
        .n_rows = T,
        .vocab = m->V,
        .dim = m->H,
        .table = m->embed.p,
        .ids = m->d_tokens,
        .out = m->x,
        .norm_gain = m->layers[0].attn_norm.p, // layer 0's attention norm input (deferred)
        .norm_gain_dtype = m->layers[0].attn_norm.e,
        .norm_out = m->xn,
    };
    if ((s = be->embed(be, &e))) return s;
    if ((s = capture_aux(m, 0, T))) return s;

    for (int l = 0; l < m->L; l++) {
        if ((s = attention_block(m, l, T, m->cur_seq))) return s;
        if ((s = moe_block(m, l, T))) return s;
        if ((s = capture_aux(m, l + 1, T))) return s;
    }

    // Final norm over every row (no-aux drafts read it), then the lm_head on the chosen rows.
    if ((s = rmsnorm(m, T, m->x, &m->final_norm, m->xn))) return s;
    if (R > 0) {
        struct ds_gather_rows_args g = {
            .act = m->act,
            .n_rows = R,
            .src_rows = T,
            .dim = m->H,
            .x = m->xn,
            .rows = m->d_rows,
            .out = m->gathered,
        };
        if ((s = be->gather_rows(be, &g))) return s;
        if ((s = matmul(m, R, m->H, m->V, m->gathered, &m->lm_head, NULL, NULL, m->logits)))
            return s;
    }
    return DS_OK;
}

enum ds_status ds_gptoss_forward(ds_gptoss_t *m, const struct ds_batch *b) {
    if (!m) return ds_error_set(DS_ERR_ARG, "gptoss: forward on a NULL model");
    m->last_rows = m->last_logit_rows = 0;
    enum ds_status s = check_batch(m, b);
    if (s != DS_OK) return s;
    struct ds_backend *be = m->be;
    const int T = b->n_rows;

    // Small per-step tables: staged at their device offsets in h_step, then one upload of the
    // block up to the end of the sequence table.
    unsigned char *const d0 = (unsigned char *)m->d_tokens;
    memcpy(m->h_step, b->tokens, (size_t)T * sizeof(int32_t));
    memcpy(m->h_step + ((unsigned char *)m->d_pos - d0), m->h_pos, (size_t)T * sizeof(int32_t));
    if (b->n_logit_rows > 0)
        memcpy(m->h_step + ((unsigned char *)m->d_rows - d0), b->logit_rows,
               (size_t)b->n_logit_rows * sizeof(int32_t));
    const size_t seq_off = (size_t)((unsigned char *)m->d_seqs - d0);
    memcpy(m->h_step + seq_off, b->seqs, (size_t)b->n_seq * sizeof *b->seqs);
    if ((s = be->upload(be, d0, m->h_step, seq_off + (size_t)b->n_seq * sizeof *b->seqs)))
        return s;

    m->cur_T = T;
    m->cur_seq = b->n_seq;
    m->cur_R = b->n_logit_rows;
    const long long key[DS_GRAPH_KEY] = {T, b->n_seq, b->n_logit_rows, 0, 0, 0};
    if ((s = ds_graph_run(&m->graphs, key, forward_ops, m))) return s;
    m->last_rows = T;
    m->last_logit_rows = b->n_logit_rows;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Results and accessors

void ds_act_to_float(enum ds_elem src_elem, const void *src, size_t n, float *out) {
    if (src_elem == DS_ELEM_F32) {
        if ((const void *)out != src) memmove(out, src, n * sizeof(float));
        return;
    }
    // bf16 → f32 from the end, so the conversion may run in place (src == out): entry i is read
    // before out[i] overwrites bf16 entries 2i and 2i+1, which are >= i.
    const ds_bf16 *h = src;
    for (size_t i = n; i-- > 0;) {
        float f = ds_bf16_to_f32(h[i]);
        out[i] = f;
    }
}

static enum ds_status download_act(ds_gptoss_t *m, const void *src, size_t n, float *out) {
    enum ds_status s = m->be->download(m->be, out, src, n * m->esz);
    if (s != DS_OK) return s;
    ds_act_to_float(m->act, out, n, out);
    return DS_OK;
}

enum ds_status ds_gptoss_download_logits(ds_gptoss_t *m, int rows, float *host_out) {
    if (rows < 0 || rows > m->last_logit_rows)
        return ds_error_set(DS_ERR_RANGE, "%s: %d logit rows asked, the last step has %d", m->label,
                            rows, m->last_logit_rows);
    return download_act(m, m->logits, (size_t)rows * (size_t)m->V, host_out);
}

enum ds_status ds_gptoss_download_aux(ds_gptoss_t *m, int rows, float *host_out) {
    if (rows < 0 || rows > m->last_rows)
        return ds_error_set(DS_ERR_RANGE, "%s: %d aux rows asked, the last step has %d", m->label,
                            rows, m->last_rows);
    return download_act(m, m->aux, (size_t)rows * (size_t)m->plan.n_aux * (size_t)m->H, host_out);
}

enum ds_status ds_gptoss_download_expert_ids(ds_gptoss_t *m, int32_t *host_out) {
    const size_t row = (size_t)m->last_rows * (size_t)m->KE * sizeof(int32_t);
    for (int l = 0; l < m->L; l++) {
        const int32_t *src = m->expert_ids + (size_t)l * (size_t)m->plan.max_rows * (size_t)m->KE;
        enum ds_status s = m->be->download(m->be, (char *)host_out + (size_t)l * row, src, row);
        if (s != DS_OK) return s;
    }
    return DS_OK;
}

const void *ds_gptoss_logits(const ds_gptoss_t *m) {
    return m->logits;
}
const void *ds_gptoss_aux(const ds_gptoss_t *m) {
    return m->aux;
}
const void *ds_gptoss_final_hidden(const ds_gptoss_t *m) {
    return m->xn;
}
const int32_t *ds_gptoss_expert_ids(const ds_gptoss_t *m) {
    return m->expert_ids;
}
const struct ds_target_config *ds_gptoss_config(const ds_gptoss_t *m) {
    return &m->cfg;
}
const struct ds_gptoss_plan *ds_gptoss_plan_of(const ds_gptoss_t *m) {
    return &m->plan;
}
void ds_gptoss_memory_plan(const ds_gptoss_t *m, struct ds_gptoss_memory *out) {
    *out = m->mem;
}
struct ds_backend *ds_gptoss_backend(const ds_gptoss_t *m) {
    return m->be;
}
enum ds_elem ds_gptoss_act(const ds_gptoss_t *m) {
    return m->act;
}
int ds_gptoss_last_rows(const ds_gptoss_t *m) {
    return m->last_rows;
}
int ds_gptoss_last_logit_rows(const ds_gptoss_t *m) {
    return m->last_logit_rows;
}

const void *ds_gptoss_embed_table(const ds_gptoss_t *m, enum ds_elem *dtype_out) {
    if (dtype_out) *dtype_out = m->embed.e;
    return m->embed.p;
}

void ds_gptoss_set_graphs(ds_gptoss_t *m, bool on) {
    if (!on) ds_graph_clear(&m->graphs);
    m->graphs.enabled = on;
    m->plan.graphs = on;
}

void ds_gptoss_graph_stats(const ds_gptoss_t *m, long long *captures_out, long long *launches_out) {
    if (captures_out) *captures_out = m->graphs.captures;
    if (launches_out) *launches_out = m->graphs.launches;
}

enum ds_status ds_gptoss_clear_kv(ds_gptoss_t *m) {
    return m->be->memset(m->be, m->kv_arena, 0, m->mem.kv);
}

const void *ds_gptoss_lm_head(const ds_gptoss_t *m, enum ds_elem *dtype_out) {
    if (dtype_out) *dtype_out = m->lm_head.e;
    return m->lm_head.p;
}
