// ds/eagle3.h: the EAGLE-3 draft forward pass over a backend table, and a greedy chain round.
//
// Math: spec eagle3.md §3.4 and §4 (docs/models.md walks through it). One Llama-style layer on a
// 2H-wide input:
//   g  = fc([input_norm](A))        A = the target's aux states [low | mid | high] (extend), or
//                                   the target's final post-norm hidden (no-aux heads, no fc), or
//   g  = the draft's own previous output (step: h2, or n with norm_output)
//   r  = g                          (norm_before_residual: r = hidden_norm(g))
//   u  = [input_layernorm(embed(token)) | hidden_norm(g)]
//   h1 = o_proj(attn(rope(q(u)), rope(k(u)), v(u))) + r      (plain causal, no sinks)
//   h2 = down(silu(gate(z)) · up(z)) + h1,  z = post_attention_layernorm(h1)
//   n  = norm(h2);  logits = lm_head(n) over the draft vocabulary, target id = map[draft id].
// Variants are fields of struct ds_draft_config (norm_before_fc, fc_norm, fc_bias,
// norm_before_residual, norm_output, use_aux_hidden_state, full-vocabulary heads, an lm_head taken
// from the target, midlayer.* / layers.0.* names, embed_tokens present or not); the code never
// asks which repository a draft came from.
//
// Positions (eagle3.md §6.1, §11): a draft row at position t carries the hidden state of the
// token at t and the embedding of the token at t+1, and writes the draft KV at t (overwriting
// whatever a previous round wrote there, §6.2).
//
// Memory is planned at create (weights, one KV-cache layer, activations for max_rows, logits);
// the forward entries allocate nothing. A draft is used by one thread at a time.
#ifndef DS_EAGLE3_H
#define DS_EAGLE3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/backend.h"
#include "ds/config.h"
#include "ds/gptoss.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_eagle3 ds_eagle3_t;

struct ds_eagle3_plan {
    int max_slots;      // KV slots (the same slot numbers as the target's), >= 1
    int max_pos;        // positions per slot (may exceed the draft's max_position_embeddings:
                        // acceptance beyond the trained context is something to measure)
    int max_rows;       // rows per call (an extend over a whole prompt is one call), >= 1
    int max_logit_rows; // rows that may ask for logits per call; 0 = max_rows
    bool own_embed;     // embed with the draft's own embed_tokens (must be present) instead of
                        // the target's table, which is what the engines do
    bool full_vocab;    // also plan a (max_logit_rows, V) buffer for ds_eagle3_scatter_logits
};

// The physical target boundaries a draft reads (its aux plan), from DIR/config.json and the
// target's config: the config's convention unless `convention` is non-NULL (a command-line
// override). Give the result's boundaries to the target's ds_gptoss_plan (ds_gptoss_plan_aux).
enum ds_status ds_eagle3_aux_plan(const char *dir, const struct ds_target_config *target,
                                  const enum ds_aux_convention *convention,
                                  struct ds_aux_plan *plan_out);

// Copies an aux plan's boundaries into a target plan (n_aux = plan->n; 0 for a no-aux head).
void ds_gptoss_plan_aux(struct ds_gptoss_plan *target_plan, const struct ds_aux_plan *aux);

// The config values the draft constructors refuse whatever the backend: a layer count other
// than 1, hidden_act other than silu, an odd head_dim or one above DS_MAX_HEAD_DIM, RoPE other
// than default or yarn, norm_before_fc together with fc_norm. As ds_gptoss_check_config: inspect
// runs it too, one line each naming `label` (the config file), DS_ERR_UNSUPPORTED when any.
enum ds_status ds_eagle3_check_config(const struct ds_draft_config *cfg, const char *label,
                                      struct ds_problems *problems);

// What ds_eagle3_create refuses of DIR against a target's config without a backend or a plan, in
// the same order: config.json (parse, ds_eagle3_check_config), the tensor table, the pair
// (ds_checkpoint_check_pair, which reads the small d2t/t2d). For commands that want a bad draft
// refused before the target loads; the message is the first problem and how many more there
// are. *cfg_out is the draft's config, completed from the table.
enum ds_status ds_eagle3_check_dir(const char *dir, const struct ds_target_config *target,
                                   struct ds_draft_config *cfg_out);

// Loads the draft in DIR against `target` (which lends its embedding table, and its lm_head to a
// full-vocabulary head without one; it must outlive the draft and use the same backend). Checks
// the config (ds_eagle3_check_config), the tensor table and the pair (vocabulary sizes, hidden
// sizes, the d2t map); every problem is one line, the first in ds_error_last(). *draft_out is
// NULL on failure.
enum ds_status ds_eagle3_create(const char *dir, const ds_gptoss_t *target, struct ds_backend *be,
                                const struct ds_eagle3_plan *plan,
                                const struct ds_load_progress *progress, ds_eagle3_t **draft_out);
void ds_eagle3_release(ds_eagle3_t *draft); // NULL is a no-op

// The memory plan ds_eagle3_create would allocate for DIR (weights, KV, activations), measured
// against the target's config and plan before the target exists (the activation dtype is the
// one target_plan resolves to on `be`); nothing is allocated or loaded.
enum ds_status ds_eagle3_measure(const char *dir, const struct ds_target_config *target_cfg,
                                 const struct ds_gptoss_plan *target_plan, struct ds_backend *be,
                                 const struct ds_eagle3_plan *plan, struct ds_gptoss_memory *out);

// Extend: rows fed from target states. `rows` packs sequences exactly like a target batch
// (tokens = the input token of each row, i.e. the token one position after the hidden state's
// token; seqs give slot and position; logit_rows the rows whose logits are wanted). `hidden` is a
// device buffer of hidden_src_rows rows of target states: the aux concat (ds_gptoss_aux, n·Ht
// wide) for an aux-fed head, the final post-norm hidden (ds_gptoss_final_hidden, Ht wide) for a
// no-aux head. hidden_rows (host, n_rows entries) picks each row's source row; NULL = row i
// reads source row i.
enum ds_status ds_eagle3_extend(ds_eagle3_t *draft, const struct ds_batch *rows, const void *hidden,
                                int hidden_src_rows, const int32_t *hidden_rows);

// Step: one row per sequence, fed the draft's own output of the previous call (extend or step):
// sequence i has input token tokens[i] at position positions[i] in slot slots[i] and takes the
// hidden state of row prev_rows[i] of that previous call. Logits are computed for every row.
enum ds_status ds_eagle3_step(ds_eagle3_t *draft, int n_seq, const int32_t *tokens,
                              const int32_t *positions, const int32_t *slots,
                              const int32_t *prev_rows);

// ---- results of the last call (device buffers unless "download") ----

// (n_logit_rows, Dv) act: draft-vocabulary logits.
const void *ds_eagle3_logits(const ds_eagle3_t *draft);
// (T, H) act: the hidden state each row feeds to a later step (h2, or n with norm_output).
const void *ds_eagle3_hidden_out(const ds_eagle3_t *draft);
// (Dv) int32: draft id → target id (identity for a full-vocabulary head); device and host copies.
const int32_t *ds_eagle3_map(const ds_eagle3_t *draft);
const int32_t *ds_eagle3_map_host(const ds_eagle3_t *draft);
int ds_eagle3_draft_vocab(const ds_eagle3_t *draft);
int ds_eagle3_last_logit_rows(const ds_eagle3_t *draft);

// Scatters the last logits into the target vocabulary (−inf where the draft cannot propose) into
// the planned (n_logit_rows, V) buffer (plan.full_vocab) and returns it in *full_out.
enum ds_status ds_eagle3_scatter_logits(ds_eagle3_t *draft, const void **full_out);

// Downloads `rows` rows of the last draft-vocabulary logits as float (rows <= n_logit_rows).
enum ds_status ds_eagle3_download_logits(ds_eagle3_t *draft, int rows, float *host_out);

// Greedy proposal of each logit row: argmax over the draft vocabulary (ties: lower draft id),
// mapped to target ids. target_ids_out has n_logit_rows entries.
enum ds_status ds_eagle3_greedy(ds_eagle3_t *draft, int32_t *target_ids_out);

const struct ds_draft_config *ds_eagle3_config(const ds_eagle3_t *draft);
// Bytes planned: weights (the target's borrowed tables not counted), KV, activations.
void ds_eagle3_memory_plan(const ds_eagle3_t *draft, struct ds_gptoss_memory *out);

// The activation dtype: always the target's (ds_gptoss_act), whose aux states the draft reads.
enum ds_elem ds_eagle3_act(const ds_eagle3_t *draft);

// CUDA graphs of draft steps (ds_eagle3_step: one row per sequence, a fixed shape per batch size);
// extends run eagerly. Initially on when the target's plan has graphs on. No-op elsewhere.
void ds_eagle3_set_graphs(ds_eagle3_t *draft, bool on);
void ds_eagle3_graph_stats(const ds_eagle3_t *draft, long long *captures_out,
                           long long *launches_out);

// Zeroes the draft's KV cache (see ds_gptoss_clear_kv).
enum ds_status ds_eagle3_clear_kv(ds_eagle3_t *draft);

// ---------------------------------------------------------------------------------------------
// Greedy chain speculation (eagle3.md §11; DESIGN §5 `greedy`): the bookkeeping the profiler's
// loop runs per step, for a batch of sequences, with topk = 1 and K drafts.

#define DS_CHAIN_MAX_K 16

// One sequence's state between rounds.
struct ds_chain_seq {
    int32_t slot;      // KV slot (target and draft)
    int32_t committed; // C: tokens whose target KV exists (positions 0..C-1)
    int32_t bonus;     // the token at position C: emitted, not yet in any cache
    // The next extend: rows at positions C-n_ext .. C-1, fed by target rows ext_row0.. of the
    // target's last forward; their input tokens are that forward's tokens shifted by one, then
    // the bonus.
    int32_t n_ext;
    int32_t ext_row0;
};

// What one round did for a sequence.
struct ds_chain_result {
    int n_drafted;                             // K
    int32_t drafted[DS_CHAIN_MAX_K];           // d_1..d_K (target ids)
    int32_t target_argmax[DS_CHAIN_MAX_K + 1]; // t_0..t_K of the verify rows
    int accepted;                              // a: drafts equal to the target's argmax, in order
    int n_emitted;                             // a + 1
    int32_t emitted[DS_CHAIN_MAX_K + 1];       // d_1..d_a then the bonus t_a
};

typedef struct ds_chain ds_chain_t;

// A chain over a target and a draft sharing slots. The target's plan must have max_rows >=
// max_slots·(K+1) and max_logit_rows likewise; the draft's plan max_rows >= its extend rows.
enum ds_status ds_chain_create(ds_gptoss_t *target, ds_eagle3_t *draft, int k,
                               ds_chain_t **chain_out);
void ds_chain_release(ds_chain_t *chain);

// Prefill: one target pass over every prompt (sequence i: prompts[i][0..lens[i]) into
// seqs[i].slot from position 0), greedy first token = the bonus. Fills seqs[i] (slot must be set
// by the caller). The prompts together must fit the target's max_rows.
enum ds_status ds_chain_prefill(ds_chain_t *chain, int n_seq, const int32_t *const *prompts,
                                const int *lens, struct ds_chain_seq *seqs);

// One round for every sequence: extend, K-1 draft steps, one verify of [bonus, d_1..d_K], greedy
// acceptance; updates seqs and fills results (n_seq entries). DS_ERR_RANGE ("context limit")
// when a verify would pass a plan's max_pos.
enum ds_status ds_chain_round(ds_chain_t *chain, int n_seq, struct ds_chain_seq *seqs,
                              struct ds_chain_result *results);

#ifdef __cplusplus
}
#endif
#endif // DS_EAGLE3_H
