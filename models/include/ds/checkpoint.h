// ds/checkpoint.h: checks a checkpoint's tensor table against its config, and a draft against
// its target.
//
// Target (the gpt-oss Hugging Face layout; docs/checkpoints.md), per layer l, prefix
// model.layers.<l>.:
//   input_layernorm.weight [H]                post_attention_layernorm.weight [H]
//   self_attn.q_proj.weight [nh*d, H]         self_attn.k_proj / v_proj.weight [nkv*d, H]
//   self_attn.o_proj.weight [H, nh*d]         (each with a .bias)   self_attn.sinks [nh]
//   mlp.router.weight [E, H], mlp.router.bias [E]
//   MXFP4 experts: mlp.experts.gate_up_proj_blocks [E, 2I, H/32, 16] U8, _scales [E, 2I, H/32] U8,
//                  gate_up_proj_bias [E, 2I]; down_proj_blocks [E, H, I/32, 16] U8,
//                  down_proj_scales [E, H, I/32] U8, down_proj_bias [E, H]
//   BF16 experts (no quantization_config): mlp.experts.gate_up_proj [E, H, 2I],
//                  down_proj [E, I, H] and the same biases
// and model.embed_tokens.weight [V, H], model.norm.weight [H], lm_head.weight [V, H]. Everything
// that is not U8 is BF16; every bias always exists (attention_bias false is refused).
//
// Draft (EAGLE-3; docs/checkpoints.md), P = "midlayer." or "layers.0." (either family):
//   fc.weight [H, 3*Ht] (absent for a no-aux head; fc.bias [H] when `bias`),
//   input_norm.weight [3*Ht] when norm_before_fc, fc_norm.<i>.weight [Ht] when fc_norm,
//   P{hidden_norm,input_layernorm,post_attention_layernorm}.weight [H],
//   P self_attn.q_proj.weight [nh*d, 2H], k_proj/v_proj [nkv*d, 2H], o_proj [H, nh*d],
//   P mlp.gate_proj/up_proj.weight [I, H], down_proj [H, I], norm.weight [H],
//   lm_head.weight [Dv, H] (optional for a full-vocabulary head: the target's is used),
//   d2t [Dv] I64 and t2d [V] BOOL (optional for a full-vocabulary head),
//   embed_tokens.weight [V, H] optional. Weights have the config's torch_dtype (BF16).
//
// Every problem is one line naming the file, the tensor or field, what was expected and what was
// found; the checks collect all of them instead of stopping at the first.
#ifndef DS_CHECKPOINT_H
#define DS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/config.h"
#include "ds/safetensors.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// A growing list of one-line problems. Zero-initialise; free with ds_problems_free.
struct ds_problems {
    size_t count;
    size_t cap;
    char **lines;
};

// Appends one formatted line. DS_ERR_NOMEM if it cannot (the line is then lost).
enum ds_status ds_problems_add(struct ds_problems *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ds_problems_free(struct ds_problems *p);

// Makes the lines from index `from` on the thread's error, for a caller that stops at the first
// failing check: the first line, then "(and N more problems)" when there are more. Returns s;
// with no such line the error is left as it is (a DS_ERR_NOMEM, say).
enum ds_status ds_problems_error(enum ds_status s, const struct ds_problems *p, size_t from);

// One tensor a config expects.
struct ds_tensor_spec {
    char name[96];
    enum ds_dtype dtype;
    int ndim;
    int64_t shape[DS_MAX_DIMS];
    bool optional; // absence is fine; presence must match
};

// The expected tensor table of a target / draft, sorted by name, malloc'd (caller frees).
// The draft's uses cfg->layer_names for the layer prefix.
enum ds_status ds_target_expected_tensors(const struct ds_target_config *cfg,
                                          struct ds_tensor_spec **specs_out, size_t *count_out);
enum ds_status ds_draft_expected_tensors(const struct ds_draft_config *cfg,
                                         struct ds_tensor_spec **specs_out, size_t *count_out);

// Checks a target's tensors against its config: every expected tensor present with the expected
// shape and dtype, every other tensor reported as unexpected; an embedding or lm_head whose rows
// are not vocab_size is said as that, naming DIR/config.json. `dir` names the checkpoint in
// messages about absent tensors. Returns DS_OK when nothing was found, DS_ERR_MISMATCH when this
// call added problems (ds_error_last() then holds the first), DS_ERR_NOMEM.
enum ds_status ds_checkpoint_check_target(const struct ds_target_config *cfg,
                                          const ds_safetensors_t *st, const char *dir,
                                          struct ds_problems *problems);

// The same for a draft. First completes the fields of *cfg only the table tells: layer_names
// (midlayer.* or layers.0.*), has_embed_tokens, lm_head_from_target.
enum ds_status ds_checkpoint_check_draft(struct ds_draft_config *cfg, const ds_safetensors_t *st,
                                         const char *dir, struct ds_problems *problems);

// What the pair check found, for reports.
struct ds_pair_report {
    bool vocab_map_checked;   // d2t and t2d were present with usable shapes and were read
    int64_t d2t_out_of_range; // d2t entries mapping outside the target vocabulary
    int64_t t2d_set;          // entries of t2d that are set
    bool t2d_consistent;      // ascending set indices of t2d == d2t + arange(Dv)
    bool aux_ok;              // the aux plan resolved under the default convention
    struct ds_aux_plan aux;   // that plan (n = 0 when !aux_ok or for a no-aux head)
};

// Checks that a draft fits a target (run ds_checkpoint_check_draft first): vocabulary sizes,
// the draft's target_hidden_size against the target's hidden size, the hidden size where the
// target's embedding or lm_head is borrowed, the aux ids against the target's layer count, and
// the vocabulary map (docs/checkpoints.md) (every d2t entry maps inside the target vocabulary;
// t2d's set indices == d2t + arange), which reads the small d2t/t2d tensors. `draft_dir` names
// the draft in messages. Returns as ds_checkpoint_check_target; *report_out is always filled.
enum ds_status ds_checkpoint_check_pair(const struct ds_target_config *target,
                                        const struct ds_draft_config *draft,
                                        const ds_safetensors_t *draft_st, const char *draft_dir,
                                        struct ds_pair_report *report_out,
                                        struct ds_problems *problems);

// Parameter counts from a tensor table (the model card's way of counting): MXFP4 blocks count two
// parameters per byte, their scales none; `active` = everything but the embedding and the
// experts, plus k/E of the expert parameters.
struct ds_param_count {
    uint64_t total;     // every parameter, the embedding included
    uint64_t embedding; // model.embed_tokens.weight (or embed_tokens.weight)
    uint64_t expert;    // tensors under .mlp.experts.
    uint64_t active;    // per token, excluding the embedding
};
void ds_param_count(const ds_safetensors_t *st, int64_t experts, int64_t experts_per_tok,
                    struct ds_param_count *out);

#ifdef __cplusplus
}
#endif
#endif // DS_CHECKPOINT_H
