// spec.c: the speculative step (ds/spec.h): chunked prefill of newcomers, draft extend, K-1 draft
// steps, one batched verify, the accept rules, commit and staging of the committed aux states.
//
// Shapes. S = planned slots, K = draft tokens per step, V = target vocabulary, Dv = draft
// vocabulary, W = width of a staged target state (n_aux·H for an aux-fed head, H otherwise).
// R = verify rows of a step = Σ_s (k_s + 1) <= S·(K+1); sequence s owns rows vrow0[s] ..
// vrow0[s] + k_s, and row vrow0[s] + i - 1 is the target's prediction for drafted token d_i.
//
// Per-token statistics stay on the backend: p = softmax(verify logits) (R, V); q of each draft
// call goes into q_steps[j·S + index in that call's subset], then one gather lines q up with the
// verify rows (the last row of each sequence reads the zero row K·S), so entropy, overlap and the
// two element gathers p(d), q(d) (gather_rows with a row width of 1 element) run once per step
// over all R rows. Only the per-row results come back (one download).
#include "ds/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ds/backend.h"
#include "ds/rng.h"

#define MAX_EXPERTS 256 // distinct-expert bitmaps (gpt-oss has 32 or 128)

// The per-row outputs, one device block downloaded at once: 11 words per verify row.
enum { O_ARG_ID, O_ARG_VAL, O_TOP_ID, O_TOP_VAL = O_TOP_ID + 2, O_ENT_P = O_TOP_VAL + 2, O_ENT_Q,
       O_OVL, O_PD, O_QD, O_WORDS };

struct ds_spec {
    ds_trace_t *trace; // phases of the next prefill/step (NULL: none)
    uint64_t tr_step;
    int tr_open; // phases this engine opened and has not closed
    ds_gptoss_t *target;
    ds_eagle3_t *draft;
    struct ds_backend *be;
    struct ds_spec_config cfg;
    enum ds_elem act;
    size_t esz;
    int S, P, K, V, Dv, W, L, E, KE, Rv; // Rv = S·(K+1), the most verify rows of a step
    int t_rows, d_rows;                  // plan rows of the target and the draft
    bool use_aux;
    const int32_t *map_host; // (Dv) draft id -> target id
    int32_t *inv_map;        // (V) target id -> draft id or -1
    float t_rec, p_rec;      // temperature and top-p the distributions are taken at

    // device
    float *p_dev;      // (Rv, V) f32
    float *q_steps;    // (K·S + 1, Dv) f32, the last row zero
    float *q_all;      // (Rv, Dv) f32
    float *out_dev;    // (O_WORDS, Rv) words: int32 or f32
    int32_t *idx_dev;  // (3, Rv) int32: q gather rows, p element ids, q element ids
    int32_t *dids_dev; // (S) int32 draft argmax
    void *stage;       // (S·(K+1), W) act
    size_t dev_bytes;

    // host scratch (all sized at create)
    float *out_host;     // (O_WORDS, Rv)
    int32_t *idx_host;   // (3, Rv)
    float *p_row;        // (V)
    float *q_host;       // (K·S, Dv) rejection rule: q rows of each draft call
    int32_t *experts;    // (L, t_rows, KE)
    int32_t *tokens;     // (t_rows) target forward tokens / draft extend tokens
    int32_t *rows;       // (t_rows) logit rows / hidden rows
    int32_t *rows2;      // (t_rows)
    struct ds_attn_seq *seqs; // (S)
    int32_t *k_eff, *vrow0, *xlast; // (S) per sequence of the step
    int32_t *sub, *sub_prev;        // (S) subsets of the draft calls (indices into the step)
    int32_t *s_tok, *s_pos, *s_slot, *s_prev, *dids; // (S) draft step scratch
    int32_t *d_draft, *d_target;    // (S, K) drafted ids: draft vocabulary and target vocabulary
    int32_t *q_row;                 // (S, K) q_steps row of each drafted token
    int32_t *pf_left, *pf_off;      // (S) prefill bookkeeping
};

static const char *const rule_names[DS_SPEC_RULE_COUNT] = {"greedy", "target-only", "rejection"};

const char *ds_spec_rule_name(enum ds_spec_rule r) {
    return (unsigned)r < DS_SPEC_RULE_COUNT ? rule_names[r] : NULL;
}

enum ds_status ds_spec_rule_parse(const char *s, enum ds_spec_rule *out) {
    for (int i = 0; s && i < DS_SPEC_RULE_COUNT; i++)
        if (!strcmp(s, rule_names[i])) {
            *out = (enum ds_spec_rule)i;
            return DS_OK;
        }
    return ds_error_set(DS_ERR_ARG, "unknown accept rule '%s' (greedy, target-only, rejection)",
                        s ? s : "(null)");
}

enum ds_status ds_spec_config_check(const struct ds_spec_config *c) {
    if (!c) return ds_error_set(DS_ERR_ARG, "spec: NULL config");
    if ((unsigned)c->rule >= DS_SPEC_RULE_COUNT)
        return ds_error_set(DS_ERR_ARG, "spec: unknown accept rule %d", (int)c->rule);
    if (c->k < 1 || c->k > DS_SPEC_MAX_K)
        return ds_error_set(DS_ERR_RANGE, "draft tokens K = %d outside 1..%d", c->k,
                            DS_SPEC_MAX_K);
    if (!(c->temperature >= DS_SPEC_TEMPERATURE_MIN && c->temperature <= DS_SPEC_TEMPERATURE_MAX))
        return ds_error_set(DS_ERR_RANGE, "temperature %g outside %g..%g", (double)c->temperature,
                            (double)DS_SPEC_TEMPERATURE_MIN, (double)DS_SPEC_TEMPERATURE_MAX);
    if (!(c->top_p > 0 && c->top_p <= 1))
        return ds_error_set(DS_ERR_RANGE, "top-p %g outside (0, 1]", (double)c->top_p);
    if (c->prefill_chunk < 1)
        return ds_error_set(DS_ERR_RANGE, "prefill chunk %d must be >= 1", c->prefill_chunk);
    if (c->n_pad_sizes < 0 || c->n_pad_sizes > DS_SPEC_MAX_PAD_SIZES)
        return ds_error_set(DS_ERR_RANGE, "%d verify pad sizes (0..%d)", c->n_pad_sizes,
                            DS_SPEC_MAX_PAD_SIZES);
    for (int i = 0; i < c->n_pad_sizes; i++)
        if (c->pad_sizes[i] < 1 || c->pad_sizes[i] > UINT16_MAX ||
            (i > 0 && c->pad_sizes[i] <= c->pad_sizes[i - 1]))
            return ds_error_set(DS_ERR_RANGE, "verify pad sizes must ascend within 1..65535 "
                                "(entry %d is %d)", i, (int)c->pad_sizes[i]);
    return DS_OK;
}

int ds_spec_padded_rows(const struct ds_spec_config *cfg, int rows) {
    for (int i = 0; i < cfg->n_pad_sizes; i++)
        if (cfg->pad_sizes[i] >= rows) return cfg->pad_sizes[i];
    return rows; // beyond the largest size: run as it is (an engine runs it eagerly)
}

int ds_spec_pad_slots(const struct ds_spec_config *cfg, int max_pos) {
    if (cfg->n_pad_sizes == 0 || max_pos < 1) return 0;
    const int most = cfg->pad_sizes[cfg->n_pad_sizes - 1] - 1; // dummy rows of one verify
    return (most + max_pos - 1) / max_pos;
}

void ds_spec_plan(const struct ds_spec_config *cfg, int max_slots, int max_pos,
                  struct ds_gptoss_plan *tp, struct ds_eagle3_plan *dp) {
    const int verify = max_slots * (cfg->k + 1), padded = ds_spec_padded_rows(cfg, verify);
    const int rows = verify > cfg->prefill_chunk ? verify : cfg->prefill_chunk;
    tp->max_slots = max_slots + ds_spec_pad_slots(cfg, max_pos);
    tp->max_pos = max_pos;
    tp->max_rows = padded > rows ? padded : rows;
    tp->max_logit_rows = verify; // prefill asks for at most one row per newcomer
    dp->max_slots = max_slots;
    dp->max_pos = max_pos;
    dp->max_rows = rows;
    dp->max_logit_rows = max_slots;
}

enum ds_status ds_spec_plan_check(const struct ds_spec_config *cfg, int max_slots,
                                  const struct ds_target_config *tc) {
    if (tc->num_local_experts > MAX_EXPERTS || tc->num_hidden_layers > DS_RECORD_MAX_LAYERS)
        return ds_error_set(DS_ERR_UNSUPPORTED, "spec: %lld experts / %lld layers exceed the "
                            "records' %d / %d", (long long)tc->num_local_experts,
                            (long long)tc->num_hidden_layers, MAX_EXPERTS, DS_RECORD_MAX_LAYERS);
    const long long rv = (long long)max_slots * (cfg->k + 1);
    if (rv * tc->vocab_size >= INT32_MAX)
        return ds_error_set(DS_ERR_RANGE,
                            "spec: batch size %d with K = %d gives %lld verify rows; x %lld "
                            "vocabulary entries that exceeds int32 element ids (at most %lld "
                            "rows: a smaller batch size or K)",
                            max_slots, cfg->k, rv, (long long)tc->vocab_size,
                            (long long)((INT32_MAX - 1) / tc->vocab_size));
    return DS_OK;
}

size_t ds_spec_device_bytes(const ds_spec_t *sp) {
    return sp ? sp->dev_bytes : 0;
}
int ds_spec_max_slots(const ds_spec_t *sp) {
    return sp->S;
}
int ds_spec_max_pos(const ds_spec_t *sp) {
    return sp->P;
}

void ds_spec_release(ds_spec_t *sp) {
    if (!sp) return;
    if (sp->be) {
        sp->be->free(sp->be, sp->p_dev);
        sp->be->free(sp->be, sp->q_steps);
        sp->be->free(sp->be, sp->q_all);
        sp->be->free(sp->be, sp->out_dev);
        sp->be->free(sp->be, sp->idx_dev);
        sp->be->free(sp->be, sp->dids_dev);
        sp->be->free(sp->be, sp->stage);
    }
    void *host[] = {sp->inv_map, sp->out_host, sp->idx_host, sp->p_row,    sp->q_host,
                    sp->experts, sp->tokens,   sp->rows,     sp->rows2,    sp->seqs,
                    sp->k_eff,   sp->vrow0,    sp->xlast,    sp->sub,      sp->sub_prev,
                    sp->s_tok,   sp->s_pos,    sp->s_slot,   sp->s_prev,   sp->dids,
                    sp->d_draft, sp->d_target, sp->q_row,    sp->pf_left,  sp->pf_off};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    free(sp);
}

static enum ds_status dev_alloc(ds_spec_t *sp, size_t bytes, void **out) {
    enum ds_status s = sp->be->alloc(sp->be, bytes, out);
    if (s == DS_OK) sp->dev_bytes += bytes;
    return s;
}

enum ds_status ds_spec_create(ds_gptoss_t *target, ds_eagle3_t *draft,
                              const struct ds_spec_config *cfg, ds_spec_t **spec_out) {
    *spec_out = NULL;
    if (!target || !draft) return ds_error_set(DS_ERR_ARG, "spec: NULL target or draft");
    enum ds_status s = ds_spec_config_check(cfg);
    if (s != DS_OK) return s;
    const struct ds_gptoss_plan *tp = ds_gptoss_plan_of(target);
    const struct ds_target_config *tc = ds_gptoss_config(target);
    const struct ds_draft_config *dc = ds_eagle3_config(draft);
    struct ds_gptoss_plan need_t;
    struct ds_eagle3_plan need_d;
    // The sequences' slots: the target's less the scratch of a padded verify.
    const int n_slots = tp->max_slots - ds_spec_pad_slots(cfg, tp->max_pos);
    if (n_slots < 1)
        return ds_error_set(DS_ERR_MISMATCH, "spec: the target plan's %d slots leave none beside "
                            "the %d scratch slots of the verify padding", tp->max_slots,
                            ds_spec_pad_slots(cfg, tp->max_pos));
    ds_spec_plan(cfg, n_slots, tp->max_pos, &need_t, &need_d);
    // The draft's plan is not readable from outside; its calls fail with a clear message if it
    // is smaller than ds_spec_plan asked for.
    if (tp->max_rows < need_t.max_rows || tp->max_logit_rows < need_t.max_logit_rows)
        return ds_error_set(DS_ERR_MISMATCH,
                            "spec: the target plan has %d rows and %d logit rows, "
                            "%d slots at K = %d need %d and %d",
                            tp->max_rows, tp->max_logit_rows, tp->max_slots, cfg->k,
                            need_t.max_rows, need_t.max_logit_rows);
    if (dc->use_aux_hidden_state && tp->n_aux != DS_AUX_COUNT)
        return ds_error_set(DS_ERR_MISMATCH, "spec: the target captures %d aux states, the draft "
                            "reads %d", tp->n_aux, DS_AUX_COUNT);
    if ((s = ds_spec_plan_check(cfg, n_slots, tc)) != DS_OK) return s;
    const long long rv = (long long)n_slots * (cfg->k + 1);

    ds_spec_t *sp = calloc(1, sizeof *sp);
    if (!sp) return ds_error_set(DS_ERR_NOMEM, "spec: out of memory");
    sp->target = target;
    sp->draft = draft;
    sp->be = ds_gptoss_backend(target);
    sp->cfg = *cfg;
    sp->act = ds_gptoss_act(target);
    sp->esz = ds_elem_size(sp->act);
    sp->S = n_slots;
    sp->P = tp->max_pos;
    sp->K = cfg->k;
    sp->V = (int)tc->vocab_size;
    sp->Dv = ds_eagle3_draft_vocab(draft);
    sp->L = (int)tc->num_hidden_layers;
    sp->E = (int)tc->num_local_experts;
    sp->KE = (int)tc->num_experts_per_tok;
    sp->use_aux = dc->use_aux_hidden_state;
    sp->W = (sp->use_aux ? tp->n_aux : 1) * (int)tc->hidden_size;
    sp->Rv = (int)rv;
    sp->t_rows = tp->max_rows;
    sp->map_host = ds_eagle3_map_host(draft);
    sp->t_rec = cfg->rule == DS_SPEC_GREEDY ? 1.0f : cfg->temperature;
    sp->p_rec = cfg->top_p;
    const size_t S = (size_t)sp->S, K = (size_t)sp->K, V = (size_t)sp->V, Dv = (size_t)sp->Dv;
    const size_t Rv = (size_t)sp->Rv, TR = (size_t)sp->t_rows;

    sp->inv_map = malloc(V * sizeof(int32_t));
    sp->out_host = malloc(O_WORDS * Rv * sizeof(float));
    sp->idx_host = malloc(3 * Rv * sizeof(int32_t));
    sp->p_row = malloc(V * sizeof(float));
    sp->q_host = cfg->rule == DS_SPEC_REJECTION ? malloc(K * S * Dv * sizeof(float)) : NULL;
    sp->experts = malloc((size_t)sp->L * TR * (size_t)sp->KE * sizeof(int32_t));
    sp->tokens = malloc(TR * sizeof(int32_t));
    sp->rows = malloc(TR * sizeof(int32_t));
    sp->rows2 = malloc(TR * sizeof(int32_t));
    // the sequences, and the dummy sequences of a padded verify in their scratch slots
    sp->seqs = malloc((S + (size_t)ds_spec_pad_slots(cfg, sp->P)) * sizeof *sp->seqs);
    int32_t **per_slot[] = {&sp->k_eff, &sp->vrow0, &sp->xlast, &sp->sub,   &sp->sub_prev,
                            &sp->s_tok, &sp->s_pos, &sp->s_slot, &sp->s_prev, &sp->dids,
                            &sp->pf_left, &sp->pf_off};
    bool ok = sp->inv_map && sp->out_host && sp->idx_host && sp->p_row && sp->experts &&
              sp->tokens && sp->rows && sp->rows2 && sp->seqs &&
              (sp->q_host || cfg->rule != DS_SPEC_REJECTION);
    for (size_t i = 0; i < sizeof per_slot / sizeof per_slot[0]; i++)
        ok = (*per_slot[i] = malloc(S * sizeof(int32_t))) && ok;
    sp->d_draft = malloc(S * K * sizeof(int32_t));
    sp->d_target = malloc(S * K * sizeof(int32_t));
    sp->q_row = malloc(S * K * sizeof(int32_t));
    ok = ok && sp->d_draft && sp->d_target && sp->q_row;
    if (!ok) {
        ds_spec_release(sp);
        return ds_error_set(DS_ERR_NOMEM, "spec: out of memory");
    }
    for (size_t v = 0; v < V; v++)
        sp->inv_map[v] = -1;
    for (int i = 0; i < sp->Dv; i++)
        sp->inv_map[sp->map_host[i]] = i;

    if ((s = dev_alloc(sp, Rv * V * sizeof(float), (void **)&sp->p_dev)) ||
        (s = dev_alloc(sp, (K * S + 1) * Dv * sizeof(float), (void **)&sp->q_steps)) ||
        (s = dev_alloc(sp, Rv * Dv * sizeof(float), (void **)&sp->q_all)) ||
        (s = dev_alloc(sp, O_WORDS * Rv * sizeof(float), (void **)&sp->out_dev)) ||
        (s = dev_alloc(sp, 3 * Rv * sizeof(int32_t), (void **)&sp->idx_dev)) ||
        (s = dev_alloc(sp, S * sizeof(int32_t), (void **)&sp->dids_dev)) ||
        (s = dev_alloc(sp, Rv * (size_t)sp->W * sp->esz, &sp->stage)) ||
        // the zero q row that the last verify row of every sequence reads
        (s = sp->be->memset(sp->be, sp->q_steps + K * S * Dv, 0, Dv * sizeof(float)))) {
        ds_spec_release(sp);
        return s;
    }
    *spec_out = sp;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Accept rules (pure)

int32_t ds_spec_sample(const float *w, int n, double u) {
    double total = 0;
    for (int i = 0; i < n; i++)
        if (w[i] > 0) total += w[i];
    if (!(total > 0)) return -1;
    const double target = u * total;
    double acc = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (!(w[i] > 0)) continue;
        acc += w[i];
        last = i;
        if (target < acc) return i;
    }
    return last; // u·total beyond the rounded running sum: the last entry with mass
}

// p with entry d removed, sampled without a copy.
static int32_t sample_without(const float *p, int V, int32_t d, double u) {
    double total = 0;
    for (int i = 0; i < V; i++)
        if (i != d && p[i] > 0) total += p[i];
    if (!(total > 0)) return ds_spec_sample(p, V, u);
    const double target = u * total;
    double acc = 0;
    int32_t last = -1;
    for (int i = 0; i < V; i++) {
        if (i == d || !(p[i] > 0)) continue;
        acc += p[i];
        last = i;
        if (target < acc) return i;
    }
    return last;
}

void ds_spec_accept_target_only(const float *p, int V, int32_t d, double u_accept,
                                double u_resample, int *accepted_out, int32_t *token_out) {
    const double pd = d >= 0 && d < V ? p[d] : 0;
    if (u_accept < pd) {
        *accepted_out = 1;
        *token_out = d;
        return;
    }
    *accepted_out = 0;
    *token_out = sample_without(p, V, d, u_resample);
}

static double q_at(const float *q, const int32_t *inv_map, int v) {
    if (!inv_map) return q[v];
    return inv_map[v] >= 0 ? q[inv_map[v]] : 0.0;
}

void ds_spec_accept_rejection(const float *p, int V, const float *q, int Dv,
                              const int32_t *inv_map, int32_t d, float q_d, double u_accept,
                              double u_resample, int *accepted_out, int32_t *token_out) {
    (void)Dv;
    const double pd = d >= 0 && d < V ? p[d] : 0;
    // u < min(1, p/q)  <=>  u·q < p for q > 0 (a drafted token always has q > 0)
    if (u_accept * (double)q_d < pd) {
        *accepted_out = 1;
        *token_out = d;
        return;
    }
    *accepted_out = 0;
    double total = 0;
    for (int v = 0; v < V; v++) {
        const double r = (double)p[v] - q_at(q, inv_map, v);
        if (r > 0) total += r;
    }
    if (!(total > 0)) {
        *token_out = ds_spec_sample(p, V, u_resample);
        return;
    }
    const double target = u_resample * total;
    double acc = 0;
    int32_t last = -1;
    for (int v = 0; v < V; v++) {
        const double r = (double)p[v] - q_at(q, inv_map, v);
        if (!(r > 0)) continue;
        acc += r;
        last = v;
        if (target < acc) {
            *token_out = v;
            return;
        }
    }
    *token_out = last;
}

// ---------------------------------------------------------------------------------------------
// Backend helpers

static enum ds_status softmax_rows(ds_spec_t *sp, enum ds_elem act, int rows, int vocab,
                                   const void *logits, float *probs) {
    struct ds_softmax_args a = {.act = act,
                                .n_rows = rows,
                                .vocab = vocab,
                                .temperature = sp->t_rec,
                                .top_k = 0,
                                .top_p = sp->p_rec,
                                .logits = logits,
                                .probs = probs};
    return sp->be->softmax(sp->be, &a);
}

// One probability row of p_dev to the host.
static enum ds_status p_row_get(ds_spec_t *sp, int row) {
    return sp->be->download(sp->be, sp->p_row, sp->p_dev + (size_t)row * (size_t)sp->V,
                            (size_t)sp->V * sizeof(float));
}

static double draw(const ds_spec_t *sp, const struct ds_spec_seq *q, int64_t pos,
                   enum ds_rng_lane lane) {
    return ds_rng_uniform(sp->cfg.seed, q->key, (uint64_t)pos, (uint32_t)lane);
}

// Stages `rows` target states starting at row `src_row` of the last target forward into the
// slot's staging rows 0..rows-1.
static enum ds_status stage_rows(ds_spec_t *sp, int slot, int src_row, int rows) {
    const size_t pitch = (size_t)sp->W * sp->esz;
    const void *src = sp->use_aux ? ds_gptoss_aux(sp->target) : ds_gptoss_final_hidden(sp->target);
    char *dst = (char *)sp->stage + (size_t)slot * (size_t)(sp->K + 1) * pitch;
    return sp->be->copy_2d(sp->be, dst, pitch, (const char *)src + (size_t)src_row * pitch, pitch,
                           pitch, (size_t)rows);
}

// ---------------------------------------------------------------------------------------------
// Prefill

void ds_spec_set_trace(ds_spec_t *sp, ds_trace_t *trace, uint64_t step) {
    if (!sp) return;
    sp->trace = trace;
    sp->tr_step = step;
}

// Phase brackets; a begin that fails (only on a bug: bad phase, nesting) opens nothing.
static void ph_begin(ds_spec_t *sp, enum ds_rec_phase phase, int k, int batch) {
    if (sp->trace &&
        ds_trace_phase_begin(sp->trace, sp->tr_step, phase, (unsigned)k, (unsigned)batch) == DS_OK)
        sp->tr_open++;
}

static void ph_end(ds_spec_t *sp) {
    if (sp->tr_open > 0) {
        ds_trace_phase_end(sp->trace);
        sp->tr_open--;
    }
}

static enum ds_status prefill_impl(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                                   const int32_t *const *prompts, const int *lens);

enum ds_status ds_spec_prefill(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                               const int32_t *const *prompts, const int *lens) {
    if (!sp) return ds_error_set(DS_ERR_ARG, "spec: prefill with a NULL engine");
    ph_begin(sp, DS_REC_PHASE_PREFILL, 0, n);
    enum ds_status s = prefill_impl(sp, n, seqs, prompts, lens);
    while (sp->tr_open > 0) ph_end(sp); // an error path leaves its phase open
    return s;
}

static enum ds_status prefill_impl(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                                   const int32_t *const *prompts, const int *lens) {
    if (!sp || n < 0 || n > sp->S || (n > 0 && (!seqs || !prompts || !lens)))
        return ds_error_set(DS_ERR_ARG, "spec: prefill of %d sequences (plan %d)", n,
                            sp ? sp->S : 0);
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1 || lens[i] > sp->P - 1)
            return ds_error_set(DS_ERR_RANGE,
                                "spec: prompt of %d tokens outside 1..%d (context limit)",
                                lens[i], sp->P - 1);
        sp->pf_left[i] = lens[i];
        sp->pf_off[i] = 0;
    }
    struct ds_backend *be = sp->be;
    const int chunk = sp->cfg.prefill_chunk < sp->t_rows ? sp->cfg.prefill_chunk : sp->t_rows;
    enum ds_status s = DS_OK;
    for (int first = 0; first < n;) {
        // Pack the remaining prompt rows of newcomers first.. into one forward of <= chunk rows.
        int rows = 0, n_seq = 0, n_done = 0;
        int32_t *done_seq = sp->sub; // (newcomer index) of those whose prompt ends here
        for (int i = first; i < n && rows < chunk; i++) {
            int take = sp->pf_left[i] < chunk - rows ? sp->pf_left[i] : chunk - rows;
            sp->seqs[n_seq++] = (struct ds_attn_seq){
                .row0 = rows, .n_rows = take, .pos0 = sp->pf_off[i], .slot = seqs[i]->slot};
            memcpy(sp->tokens + rows, prompts[i] + sp->pf_off[i], (size_t)take * sizeof(int32_t));
            rows += take;
            if (take == sp->pf_left[i]) {
                sp->rows[n_done] = rows - 1; // logit row: the prompt's last row
                done_seq[n_done++] = i;
            }
        }
        struct ds_batch tb = {.n_rows = rows,
                              .tokens = sp->tokens,
                              .n_seq = n_seq,
                              .seqs = sp->seqs,
                              .n_logit_rows = n_done,
                              .logit_rows = sp->rows};
        if ((s = ds_gptoss_forward(sp->target, &tb))) return s;

        // First token of each completed prompt: argmax (greedy) or a draw from p at position n.
        if (n_done > 0) {
            struct ds_argmax_args am = {.act = sp->act,
                                        .n_rows = n_done,
                                        .vocab = sp->V,
                                        .x = ds_gptoss_logits(sp->target),
                                        .ids = (int32_t *)sp->out_dev,
                                        .values = sp->out_dev + sp->Rv};
            if ((s = be->argmax(be, &am)) ||
                (s = be->download(be, sp->out_host, sp->out_dev, 2 * (size_t)sp->Rv * 4)))
                return s;
            // p for every rule: one NaN logit makes every p of the row NaN, which the argmax
            // skips, so p at the argmax must be a positive number too (as in the verify).
            if ((s = softmax_rows(sp, sp->act, n_done, sp->V, ds_gptoss_logits(sp->target),
                                  sp->p_dev)))
                return s;
            for (int j = 0; j < n_done; j++) {
                struct ds_spec_seq *q = seqs[done_seq[j]];
                int32_t tok;
                memcpy(&tok, &sp->out_host[j], sizeof tok);
                const float val = sp->out_host[sp->Rv + j];
                q->nonfinite = !isfinite(val) || tok < 0 || tok >= sp->V;
                const int len = lens[done_seq[j]];
                float p_top = 0.0f;
                if (!q->nonfinite && sp->cfg.rule != DS_SPEC_GREEDY) {
                    if ((s = p_row_get(sp, j))) return s;
                    p_top = sp->p_row[tok];
                } else if (!q->nonfinite &&
                           (s = sp->be->download(sp->be, &p_top,
                                                 sp->p_dev + (size_t)j * (size_t)sp->V + tok,
                                                 sizeof p_top))) {
                    return s;
                }
                q->nonfinite = q->nonfinite || !(p_top > 0.0f) || !isfinite(p_top);
                if (sp->cfg.rule != DS_SPEC_GREEDY && !q->nonfinite) {
                    const int32_t t =
                        ds_spec_sample(sp->p_row, sp->V, draw(sp, q, len, DS_RNG_LANE_SAMPLE));
                    if (t >= 0) tok = t;
                }
                q->committed = len;
                q->bonus = tok;
                q->n_ext = 1;
                q->ext_tokens[0] = tok;
            }
        }

        // Draft KV of every prompt row whose next token is a prompt token (all but the last
        // row of a completed prompt, which the first extend writes with the first token). The
        // seqs table is rebuilt in place: entry xseq <= k was consumed already.
        int xrows = 0, xseq = 0;
        for (int k = 0; k < n_seq; k++) {
            const struct ds_attn_seq t = sp->seqs[k];
            const int i = first + k;
            const int m = t.n_rows == sp->pf_left[i] ? t.n_rows - 1 : t.n_rows;
            for (int r = 0; r < m; r++) {
                sp->rows2[xrows + r] = t.row0 + r; // the row's target state
                sp->tokens[xrows + r] = prompts[i][t.pos0 + r + 1];
            }
            if (m > 0)
                sp->seqs[xseq++] =
                    (struct ds_attn_seq){.row0 = xrows, .n_rows = m, .pos0 = t.pos0, .slot = t.slot};
            xrows += m;
            sp->pf_left[i] -= t.n_rows;
            sp->pf_off[i] += t.n_rows;
        }
        // Stage the last prompt row of every completed prompt before the next forward.
        for (int j = 0; j < n_done; j++)
            if ((s = stage_rows(sp, seqs[done_seq[j]]->slot, sp->rows[j], 1))) return s;
        if (xrows > 0) {
            struct ds_batch xb = {.n_rows = xrows,
                                  .tokens = sp->tokens,
                                  .n_seq = xseq,
                                  .seqs = sp->seqs,
                                  .n_logit_rows = 0,
                                  .logit_rows = NULL};
            const void *hidden =
                sp->use_aux ? ds_gptoss_aux(sp->target) : ds_gptoss_final_hidden(sp->target);
            if ((s = ds_eagle3_extend(sp->draft, &xb, hidden, rows, sp->rows2))) return s;
        }
        while (first < n && sp->pf_left[first] == 0)
            first++;
    }
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Step

// After draft call j (extend j = 0, step j >= 1) over subset sub[0..m): q rows into
// q_steps[j·S ..], the drafted token of each sequence of the subset (position C + j + 1).
static enum ds_status choose_drafts(ds_spec_t *sp, int j, int m, struct ds_spec_seq *const *seqs) {
    struct ds_backend *be = sp->be;
    const size_t Dv = (size_t)sp->Dv;
    float *q = sp->q_steps + (size_t)j * (size_t)sp->S * Dv;
    enum ds_status s = softmax_rows(sp, sp->act, m, sp->Dv, ds_eagle3_logits(sp->draft), q);
    if (s) return s;
    if (sp->cfg.rule == DS_SPEC_REJECTION) {
        float *qh = sp->q_host + (size_t)j * (size_t)sp->S * Dv;
        if ((s = be->download(be, qh, q, (size_t)m * Dv * sizeof(float)))) return s;
        for (int x = 0; x < m; x++) {
            const int i = sp->sub[x];
            const struct ds_spec_seq *sq = seqs[i];
            int32_t id = ds_spec_sample(qh + (size_t)x * Dv, sp->Dv,
                                        draw(sp, sq, (int64_t)sq->committed + j + 1,
                                             DS_RNG_LANE_DRAFT));
            sp->dids[x] = id < 0 ? 0 : id;
        }
    } else {
        struct ds_argmax_args a = {.act = sp->act,
                                   .n_rows = m,
                                   .vocab = sp->Dv,
                                   .x = ds_eagle3_logits(sp->draft),
                                   .ids = sp->dids_dev,
                                   .values = NULL};
        if ((s = be->argmax(be, &a)) ||
            (s = be->download(be, sp->dids, sp->dids_dev, (size_t)m * sizeof(int32_t))))
            return s;
    }
    for (int x = 0; x < m; x++) {
        const int i = sp->sub[x];
        sp->d_draft[i * sp->K + j] = sp->dids[x];
        sp->d_target[i * sp->K + j] = sp->map_host[sp->dids[x]];
        sp->q_row[i * sp->K + j] = j * sp->S + x;
    }
    return DS_OK;
}

static int popcount_bits(const uint64_t *b, int words) {
    int n = 0;
    for (int w = 0; w < words; w++)
        n += __builtin_popcountll(b[w]);
    return n;
}

static enum ds_status step_impl(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                                struct ds_spec_result *res);

enum ds_status ds_spec_step(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                            struct ds_spec_result *res) {
    enum ds_status s = step_impl(sp, n, seqs, res);
    while (sp && sp->tr_open > 0) ph_end(sp); // an error path leaves its phase open
    return s;
}

// Phases: draft_extend (extend + first choice), draft_step j, verify (the target forward), sample
// (statistics of the verify rows on the backend and their download), accept (the rules, commit).
static enum ds_status step_impl(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                                struct ds_spec_result *res) {
    if (!sp || n < 1 || n > sp->S || !seqs || !res)
        return ds_error_set(DS_ERR_ARG, "spec: step over %d sequences (plan %d)", n,
                            sp ? sp->S : 0);
    struct ds_backend *be = sp->be;
    const int K = sp->K, S = sp->S, V = sp->V, Dv = sp->Dv;
    enum ds_status s;

    // Layout: k per sequence, verify rows, extend rows.
    int R = 0, xrows = 0;
    for (int i = 0; i < n; i++) {
        const struct ds_spec_seq *q = seqs[i];
        if (q->committed > sp->P - 2 || q->committed < 1)
            return ds_error_set(DS_ERR_RANGE,
                                "spec: sequence %d at %d tokens cannot step (context limit %d)",
                                i, q->committed, sp->P);
        if (q->n_ext < 1 || q->n_ext > K + 1 || q->n_ext > q->committed)
            return ds_error_set(DS_ERR_ARG, "spec: sequence %d has no staged extend rows", i);
        const int room = sp->P - 2 - q->committed;
        sp->k_eff[i] = room < K ? room : K;
        sp->vrow0[i] = R;
        R += sp->k_eff[i] + 1;
        xrows += q->n_ext;
    }

    // 1. Extend over the staged rows; logits of the last row of sequences that draft at all.
    int m = 0, xr = 0;
    for (int i = 0; i < n; i++) {
        const struct ds_spec_seq *q = seqs[i];
        sp->seqs[i] = (struct ds_attn_seq){.row0 = xr,
                                           .n_rows = q->n_ext,
                                           .pos0 = q->committed - q->n_ext,
                                           .slot = q->slot};
        for (int r = 0; r < q->n_ext; r++) {
            sp->tokens[xr + r] = q->ext_tokens[r];
            sp->rows2[xr + r] = q->slot * (K + 1) + r;
        }
        xr += q->n_ext;
        if (sp->k_eff[i] >= 1) {
            sp->rows[m] = xr - 1;
            sp->sub[m++] = i;
        }
    }
    struct ds_batch xb = {.n_rows = xrows,
                          .tokens = sp->tokens,
                          .n_seq = n,
                          .seqs = sp->seqs,
                          .n_logit_rows = m,
                          .logit_rows = sp->rows};
    ph_begin(sp, DS_REC_PHASE_DRAFT_EXTEND, 0, n);
    if ((s = ds_eagle3_extend(sp->draft, &xb, sp->stage, S * (K + 1), sp->rows2))) return s;
    if (m > 0 && (s = choose_drafts(sp, 0, m, seqs))) return s;
    ph_end(sp);

    // 2. Draft steps j = 1..K-1 over the sequences that draft more than j tokens (a subset of
    //    the previous call's, in the same order); the hidden state of each one's previous row.
    for (int j = 1; j < K && m > 0; j++) {
        int m2 = 0;
        for (int x = 0; x < m; x++) {
            const int i = sp->sub[x];
            if (sp->k_eff[i] <= j) continue;
            sp->sub_prev[m2] = i;
            sp->s_tok[m2] = sp->d_target[i * K + j - 1];
            sp->s_pos[m2] = seqs[i]->committed + j - 1;
            sp->s_slot[m2] = seqs[i]->slot;
            sp->s_prev[m2] = j == 1 ? sp->rows[x] : x;
            m2++;
        }
        if (m2 == 0) break;
        memcpy(sp->sub, sp->sub_prev, (size_t)m2 * sizeof(int32_t));
        m = m2;
        ph_begin(sp, DS_REC_PHASE_DRAFT_STEP, j, n);
        if ((s = ds_eagle3_step(sp->draft, m, sp->s_tok, sp->s_pos, sp->s_slot, sp->s_prev)) ||
            (s = choose_drafts(sp, j, m, seqs)))
            return s;
        ph_end(sp);
    }

    // 3. Verify [b, d_1..d_k] at positions C..C+k.
    for (int i = 0; i < n; i++) {
        const struct ds_spec_seq *q = seqs[i];
        const int r0 = sp->vrow0[i], k = sp->k_eff[i];
        sp->seqs[i] = (struct ds_attn_seq){
            .row0 = r0, .n_rows = k + 1, .pos0 = q->committed, .slot = q->slot};
        sp->tokens[r0] = q->bonus;
        for (int j = 0; j < k; j++)
            sp->tokens[r0 + 1 + j] = sp->d_target[i * K + j];
        for (int j = 0; j <= k; j++)
            sp->rows[r0 + j] = r0 + j;
    }
    // Padding (cfg.pad_sizes): dummy rows up to the captured size, token 0 from position 0 in
    // scratch slots S.. (at most P rows each); no logits are asked of them.
    int VR = R, nv = n;
    for (int left = ds_spec_padded_rows(&sp->cfg, R) - R, j = 0; left > 0; j++) {
        const int take = left < sp->P ? left : sp->P;
        sp->seqs[nv++] = (struct ds_attn_seq){.row0 = VR, .n_rows = take, .pos0 = 0,
                                              .slot = sp->S + j};
        memset(sp->tokens + VR, 0, (size_t)take * sizeof(int32_t));
        VR += take;
        left -= take;
    }
    struct ds_batch vb = {.n_rows = VR,
                          .tokens = sp->tokens,
                          .n_seq = nv,
                          .seqs = sp->seqs,
                          .n_logit_rows = R,
                          .logit_rows = sp->rows};
    ph_begin(sp, DS_REC_PHASE_VERIFY, 0, n);
    if ((s = ds_gptoss_forward(sp->target, &vb))) return s;
    ph_end(sp);

    // 4. Statistics of every verify row on the backend, then one download.
    ph_begin(sp, DS_REC_PHASE_SAMPLE, 0, n);
    const size_t Rv = (size_t)sp->Rv;
    int32_t *qsrc = sp->idx_host, *pidx = sp->idx_host + Rv, *qidx = sp->idx_host + 2 * Rv;
    for (int i = 0; i < n; i++) {
        const int r0 = sp->vrow0[i], k = sp->k_eff[i];
        for (int j = 0; j <= k; j++) {
            const int r = r0 + j;
            const bool has = j < k; // row r predicts d_{j+1}
            qsrc[r] = has ? sp->q_row[i * K + j] : K * S;
            pidx[r] = r * V + (has ? sp->d_target[i * K + j] : 0);
            qidx[r] = r * Dv + (has ? sp->d_draft[i * K + j] : 0);
        }
    }
    const void *logits = ds_gptoss_logits(sp->target);
    float *o = sp->out_dev;
    struct ds_argmax_args am = {.act = sp->act,
                                .n_rows = R,
                                .vocab = V,
                                .x = logits,
                                .ids = (int32_t *)(o + O_ARG_ID * Rv),
                                .values = o + O_ARG_VAL * Rv};
    struct ds_topk_args tk = {.act = DS_ELEM_F32,
                              .n_rows = R,
                              .vocab = V,
                              .k = V >= 2 ? 2 : 1,
                              .x = sp->p_dev,
                              .ids = (int32_t *)(o + O_TOP_ID * Rv),
                              .values = o + O_TOP_VAL * Rv};
    struct ds_entropy_args ep = {.n_rows = R, .vocab = V, .probs = sp->p_dev,
                                 .out = o + O_ENT_P * Rv};
    struct ds_gather_rows_args gq = {.act = DS_ELEM_F32,
                                     .n_rows = R,
                                     .src_rows = K * S + 1,
                                     .dim = Dv,
                                     .x = sp->q_steps,
                                     .rows = sp->idx_dev,
                                     .out = sp->q_all};
    struct ds_entropy_args eq = {.n_rows = R, .vocab = Dv, .probs = sp->q_all,
                                 .out = o + O_ENT_Q * Rv};
    struct ds_overlap_args ov = {.n_rows = R,
                                 .vocab_p = V,
                                 .vocab_q = Dv,
                                 .p = sp->p_dev,
                                 .q = sp->q_all,
                                 .q_to_p = ds_eagle3_map(sp->draft),
                                 .out = o + O_OVL * Rv};
    struct ds_gather_rows_args gp1 = {.act = DS_ELEM_F32,
                                      .n_rows = R,
                                      .src_rows = R * V,
                                      .dim = 1,
                                      .x = sp->p_dev,
                                      .rows = sp->idx_dev + Rv,
                                      .out = o + O_PD * Rv};
    struct ds_gather_rows_args gq1 = {.act = DS_ELEM_F32,
                                      .n_rows = R,
                                      .src_rows = R * Dv,
                                      .dim = 1,
                                      .x = sp->q_all,
                                      .rows = sp->idx_dev + 2 * Rv,
                                      .out = o + O_QD * Rv};
    if ((s = be->upload(be, sp->idx_dev, sp->idx_host, 3 * Rv * sizeof(int32_t))) ||
        (s = softmax_rows(sp, sp->act, R, V, logits, sp->p_dev)) || (s = be->argmax(be, &am)) ||
        (s = be->topk(be, &tk)) || (s = be->entropy(be, &ep)) || (s = be->gather_rows(be, &gq)) ||
        (s = be->entropy(be, &eq)) || (s = be->overlap(be, &ov)) ||
        (s = be->gather_rows(be, &gp1)) || (s = be->gather_rows(be, &gq1)) ||
        (s = be->download(be, sp->out_host, o, O_WORDS * Rv * sizeof(float))) ||
        (s = ds_gptoss_download_expert_ids(sp->target, sp->experts)))
        return s;
    ph_end(sp);
    const float *oh = sp->out_host;
    const int32_t *arg_id = (const int32_t *)(oh + O_ARG_ID * Rv);
    const float *arg_val = oh + O_ARG_VAL * Rv, *top_val = oh + O_TOP_VAL * Rv;
    const float *ent_p = oh + O_ENT_P * Rv, *ent_q = oh + O_ENT_Q * Rv, *ovl = oh + O_OVL * Rv;
    const float *pd = oh + O_PD * Rv, *qd = oh + O_QD * Rv;

    // 5. Accept, record, commit.
    ph_begin(sp, DS_REC_PHASE_ACCEPT, 0, n);
    for (int i = 0; i < n; i++) {
        struct ds_spec_seq *q = seqs[i];
        struct ds_spec_result *r = &res[i];
        const int r0 = sp->vrow0[i], k = sp->k_eff[i];
        const int64_t C = q->committed;
        memset(r, 0, sizeof *r);
        r->drafted = k;
        r->context_len = (uint32_t)C;
        // One NaN logit makes every p of the row NaN, which the argmax skips: p's top-1 must be
        // a positive number too, and the entropy (NaN for a NaN p) finite.
        for (int j = 0; j <= k; j++)
            if (!isfinite(arg_val[r0 + j]) || !isfinite(ent_p[r0 + j]) ||
                !(top_val[2 * (r0 + j)] > 0.0f))
                r->nonfinite = 1;

        // Distinct experts per layer over this sequence's rows.
        for (int l = 0; l < sp->L; l++) {
            uint64_t bits[MAX_EXPERTS / 64] = {0};
            const int32_t *e = sp->experts + ((size_t)l * (size_t)VR + (size_t)r0) * sp->KE;
            for (int x = 0; x < (k + 1) * sp->KE; x++)
                if (e[x] >= 0 && e[x] < MAX_EXPERTS) bits[e[x] / 64] |= 1ull << (e[x] % 64);
            r->distinct_experts[l] = (uint16_t)popcount_bits(bits, MAX_EXPERTS / 64);
        }

        int a = 0;
        int32_t last = -1;
        if (!r->nonfinite) {
            for (; a < k; a++) {
                const int row = r0 + a;
                const int32_t d = sp->d_target[i * K + a];
                const int64_t pos = C + a + 1; // the position d_{a+1} would take
                if (sp->cfg.rule == DS_SPEC_GREEDY) {
                    if (d == arg_id[row]) continue;
                    last = arg_id[row];
                    break;
                }
                int ok;
                int32_t tok;
                const double ua = draw(sp, q, pos, DS_RNG_LANE_ACCEPT);
                const double ur = draw(sp, q, pos, DS_RNG_LANE_RESIDUAL);
                if (sp->cfg.rule == DS_SPEC_TARGET_ONLY) {
                    if (ua < pd[row]) continue; // accepted: no row needed
                    if ((s = p_row_get(sp, row))) return s;
                    ds_spec_accept_target_only(sp->p_row, V, d, ua, ur, &ok, &tok);
                } else {
                    if (ua * (double)qd[row] < pd[row]) continue;
                    if ((s = p_row_get(sp, row))) return s;
                    const int x = sp->q_row[i * K + a];
                    const float *qrow = sp->q_host + (size_t)x * (size_t)Dv;
                    ds_spec_accept_rejection(sp->p_row, V, qrow, Dv, sp->inv_map, d, qd[row], ua,
                                             ur, &ok, &tok);
                }
                if (ok) continue; // the host re-check agrees with the device one unless rounding
                last = tok >= 0 ? tok : arg_id[row]; // no mass left to sample: as at the bonus
                break;
            }
            if (a == k) { // every draft accepted: the bonus from the last row
                const int row = r0 + k;
                if (sp->cfg.rule == DS_SPEC_GREEDY) {
                    last = arg_id[row];
                } else {
                    if ((s = p_row_get(sp, row))) return s;
                    last = ds_spec_sample(sp->p_row, V, draw(sp, q, C + k + 1, DS_RNG_LANE_SAMPLE));
                    if (last < 0) last = arg_id[row];
                }
            }
        }

        // Draft records: fields of DESIGN §5; the channel from a copy of the tracker fed the
        // chain in order (the channel at the draft's position after the committed tokens).
        struct ds_channel_tracker tr = q->tracker;
        for (int j = 0; j < k; j++) {
            const int row = r0 + j;
            struct ds_rec_draft *d = &r->drafts[j];
            d->draft_token = sp->d_target[i * K + j];
            d->q_draft = qd[row];
            d->p_draft = pd[row];
            d->target_token = arg_id[row];
            d->p_target = top_val[2 * row];
            d->margin = top_val[2 * row] - (V >= 2 ? top_val[2 * row + 1] : 0.0f);
            if (!(d->p_target >= 0.0f)) // a row of NaN p: top-k found no entry (its -Inf fill)
                d->p_target = d->margin = NAN;
            d->expected_accept = ovl[row];
            d->entropy_target = ent_p[row];
            // No q for the drafted token (NaN or not positive): no draft entropy either.
            d->entropy_draft = qd[row] > 0.0f && isfinite(qd[row]) ? ent_q[row] : NAN;
            d->context_len = (uint32_t)(C + j + 1);
            d->position = (uint8_t)(j + 1);
            d->accepted = !r->nonfinite && j < a;
            enum ds_stop stop;
            d->channel = tr.h ? (uint8_t)ds_channel_tracker_feed(&tr, d->draft_token, &stop)
                              : DS_REC_CHANNEL_OTHER;
        }
        if (r->nonfinite) continue; // the caller ends the request; state left as it was

        r->accepted = a;
        r->n_emitted = a + 1;
        for (int j = 0; j < a; j++)
            r->emitted[j] = sp->d_target[i * K + j];
        r->emitted[a] = last;
        // Commit: verify rows 0..a feed the next extend (inputs d_1..d_a, then the new bonus).
        if ((s = stage_rows(sp, q->slot, r0, a + 1))) return s;
        q->committed = (int32_t)(C + a + 1);
        q->bonus = last;
        q->n_ext = a + 1;
        memcpy(q->ext_tokens, r->emitted, (size_t)(a + 1) * sizeof(int32_t));
    }
    ph_end(sp);
    return DS_OK;
}
