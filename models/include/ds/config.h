// ds/config.h: config.json of a gpt-oss target and of an EAGLE-3 draft, as typed structs.
//
// Target: the Hugging Face config.json of openai/gpt-oss-20b / -120b (GptOssForCausalLM). Both
// spellings of the RoPE settings are accepted: `rope_scaling` + top-level `rope_theta` (the hub
// files) and `rope_parameters` with `rope_theta` inside (newer transformers).
//
// Draft: the three EAGLE-3 layouts in use for gpt-oss.
//   specforge    SpecForge / lmsys LlamaForCausalLMEagle3: Llama fields at the top level, aux ids
//                in `eagle_config.eagle_aux_hidden_state_layer_ids`, tensors `midlayer.*`.
//   speculators  vLLM speculators Eagle3Speculator: Llama fields in `transformer_layer_config`,
//                flags and aux ids at the top level, tensors `layers.0.*`.
//   nvidia       NVIDIA Model-Optimizer exports: Llama fields at the top level, ModelOpt keys
//                (and, for v3, `norm_before_fc`) inside `eagle_config`.
// The layout only decides where fields are read from and which aux-id convention is the default;
// every behavioural difference is its own field of struct ds_draft_config, so the model code never
// asks which layout a checkpoint came from.
//
// Aux hidden states. A target with N layers has N+1 residual-stream BOUNDARIES: boundary b is the
// residual stream after b layers (b = 0: the embeddings, b = N: after the last layer, before the
// final norm). Configs name the three captured states with ids in one of three conventions:
//   output-of       (SpecForge, ModelOpt <= v2)  id = layer whose OUTPUT is taken    b = id + 1
//   capture-before  (vLLM, speculators)          id = layer the stream is taken before  b = id
//   boundary        (NVIDIA v3)                  id = boundary index                     b = id
// The ids are stored as written together with their default convention; ds_aux_plan() turns them
// into boundaries for a given target (or the engine defaults when a config names none).
//
// Parsing never touches tensor data and allocates nothing that outlives the call: the structs are
// plain values. Errors are one line naming the file (the `label`) and the field.
#ifndef DS_CONFIG_H
#define DS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/safetensors.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_CONFIG_MAX_LAYERS 256 // more target layers than this is DS_ERR_UNSUPPORTED
#define DS_CONFIG_MAX_EOS 8      // eos_token_id may be a list
#define DS_AUX_MAX 8             // aux ids kept per draft (EAGLE-3 uses 3)
#define DS_AUX_COUNT 3           // what an aux-fed EAGLE-3 head must name

// ---------------------------------------------------------------------------------------------
// RoPE

enum ds_rope_type {
    DS_ROPE_DEFAULT = 0, // plain rotary, inv_freq_i = theta^(-2i/d)
    DS_ROPE_YARN,        // "yarn" (gpt-oss): NTK-by-parts + attention concentration
    DS_ROPE_LLAMA3,      // "llama3": wavelength-banded scaling (NVIDIA long-context drafts)
    DS_ROPE_LINEAR,      // "linear": positions divided by factor
};

struct ds_rope_config {
    enum ds_rope_type type;
    double theta;                             // base; rope_theta
    double factor;                            // scaling factor; 1 when type is DEFAULT
    double beta_fast, beta_slow;              // yarn ramp bounds (defaults 32, 1)
    double attention_factor;                  // yarn concentration; 0 = derive 0.1*ln(factor)+1
    int64_t original_max_position_embeddings; // yarn/llama3 pre-scaling context; 0 when absent
    bool truncate;                            // yarn: floor/ceil the ramp bounds (HF default true
                                              // when the key is absent; gpt-oss writes false)
    double low_freq_factor, high_freq_factor; // llama3 bands (defaults 1, 4)
};

const char *ds_rope_type_name(enum ds_rope_type t); // "default", "yarn", "llama3", "linear"

// ---------------------------------------------------------------------------------------------
// Target (gpt-oss)

enum ds_attn_type {
    DS_ATTN_SLIDING = 0, // "sliding_attention": causal, last sliding_window keys incl. the current
    DS_ATTN_FULL,        // "full_attention": causal only
};

const char *ds_attn_type_name(enum ds_attn_type t); // the config.json spelling

// Every field of config.json the engines read. Defaults, where a field may be absent, are those
// of transformers' GptOssConfig (the 120b values) and are written beside each field; the fields
// marked "required" make the parse fail when absent.
struct ds_target_config {
    char architecture[64]; // architectures[0]; default "GptOssForCausalLM"
    char model_type[32];   // default "gpt_oss"

    int64_t vocab_size;          // V, required (201088)
    int64_t hidden_size;         // H, required (2880)
    int64_t intermediate_size;   // I per expert, required (2880)
    int64_t num_hidden_layers;   // L, required (24 / 36)
    int64_t num_attention_heads; // required (64)
    int64_t num_key_value_heads; // required (8); divides num_attention_heads
    int64_t head_dim;            // required (64; heads*head_dim != hidden in gpt-oss)
    int64_t num_local_experts;   // E, required (32 / 128)
    int64_t num_experts_per_tok; // k, required; also spelled experts_per_token (4)

    int64_t sliding_window;                            // default 128
    enum ds_attn_type layer_types[DS_CONFIG_MAX_LAYERS]; // default: even layers sliding, odd full

    struct ds_rope_config rope;      // default yarn theta 150000 factor 32 beta 32/1 orig 4096
    int64_t max_position_embeddings; // default 131072
    int64_t initial_context_length;  // leftover of the original config; 0 when absent

    double rms_norm_eps;  // default 1e-5
    double swiglu_limit;  // default 7.0
    double swiglu_alpha;  // default 1.702 (hard-coded in the references, absent in hub files)

    int64_t eos_token_ids[DS_CONFIG_MAX_EOS]; // eos_token_id, int or list
    int num_eos_token_ids;                     // 0 when absent
    int64_t pad_token_id;                      // -1 when absent
    int64_t bos_token_id;                      // -1 when absent (hub config.json has none)

    bool attention_bias;      // default true; false is refused (unsupported)
    bool tie_word_embeddings; // default false; true is refused (unsupported)
    bool mxfp4;               // quantization_config.quant_method == "mxfp4" (expert tensors are
                              // _blocks/_scales); false means plain BF16 expert weights
};

// Parses config.json text (len bytes, need not be NUL-terminated); `label` names the file in
// messages. On failure *cfg_out is zeroed and the message names the label and the field.
enum ds_status ds_target_config_parse(const char *json, size_t len, const char *label,
                                      struct ds_target_config *cfg_out);

// Reads DIR/config.json and parses it.
enum ds_status ds_target_config_load(const char *dir, struct ds_target_config *cfg_out);

// Reads the config file at `path` and parses it. As ds_target_config_load, a file of more than
// 4 MiB or one that is not a regular file is refused before anything is read.
enum ds_status ds_target_config_load_file(const char *path, struct ds_target_config *cfg_out);

// ---------------------------------------------------------------------------------------------
// Aux-id conventions

enum ds_aux_convention {
    DS_AUX_OUTPUT_OF = 0,  // boundary = id + 1
    DS_AUX_CAPTURE_BEFORE, // boundary = id
    DS_AUX_BOUNDARY,       // boundary = id
    DS_AUX_CONVENTION_COUNT
};

// "output-of", "capture-before", "boundary"; parse accepts those spellings (DS_ERR_ARG otherwise).
const char *ds_aux_convention_name(enum ds_aux_convention c);
enum ds_status ds_aux_convention_parse(const char *s, enum ds_aux_convention *out);

// Boundary named by one id under a convention (no range check).
int64_t ds_aux_boundary(int64_t id, enum ds_aux_convention c);

// Translates n ids to boundaries of a target with num_layers layers and checks them: every
// boundary within 0..num_layers, strictly ascending. `label` and `field` name the config and the
// field in messages. DS_ERR_RANGE / DS_ERR_FORMAT on failure (boundaries_out then unspecified).
enum ds_status ds_aux_to_boundaries(const int64_t *ids, int n, enum ds_aux_convention c,
                                    int64_t num_layers, const char *label, const char *field,
                                    int64_t *boundaries_out);

// The ids vLLM and SGLang use when a draft config names none: capture before layers
// {2, N/2, N-3} (the same physical states as the SpecForge/ModelOpt output-of defaults
// {1, N/2-1, N-4}). Writes DS_AUX_COUNT ids in capture-before convention.
void ds_aux_engine_default_ids(int64_t num_layers, int64_t ids_out[DS_AUX_COUNT]);

// ---------------------------------------------------------------------------------------------
// Draft (EAGLE-3)

enum ds_draft_layout {
    DS_DRAFT_SPECFORGE = 0, // SpecForge / lmsys
    DS_DRAFT_SPECULATORS,   // vLLM speculators
    DS_DRAFT_NVIDIA,        // NVIDIA Model-Optimizer
};
const char *ds_draft_layout_name(enum ds_draft_layout l); // "specforge", "speculators", "nvidia"

// Which family the decoder-layer tensors are named in.
enum ds_draft_names {
    DS_DRAFT_NAMES_MIDLAYER = 0, // midlayer.*
    DS_DRAFT_NAMES_LAYERS0,      // layers.0.*
};
const char *ds_draft_names_prefix(enum ds_draft_names n); // "midlayer." or "layers.0."

// Where the aux ids were found.
enum ds_aux_source {
    DS_AUX_SOURCE_NONE = 0,     // not in the config: engine defaults apply
    DS_AUX_SOURCE_EAGLE_CONFIG, // eagle_config.eagle_aux_hidden_state_layer_ids
    DS_AUX_SOURCE_TOP_LEVEL,    // eagle_aux_hidden_state_layer_ids at the top level
};
const char *ds_aux_source_name(enum ds_aux_source s); // "none", "eagle_config", "top_level"

// One EAGLE-3 draft: every field of the Llama-style layer, the variant flags and the
// vocabulary. Defaults are LlamaConfig's unless noted.
struct ds_draft_config {
    enum ds_draft_layout layout;
    char architecture[64]; // architectures[0], e.g. "LlamaForCausalLMEagle3", "Eagle3Speculator"
    char model_type[32];   // of the layer config ("llama")

    // The decoder layer (top level; speculators: transformer_layer_config).
    int64_t hidden_size;             // Hd, required
    int64_t intermediate_size;       // required
    int64_t num_attention_heads;     // required
    int64_t num_key_value_heads;     // default num_attention_heads
    int64_t head_dim;                // default hidden_size / num_attention_heads
    int64_t num_hidden_layers;       // default 1; only 1 is supported by the tensor check
    char hidden_act[16];             // default "silu"
    double rms_norm_eps;             // default 1e-6
    int64_t max_position_embeddings; // default 2048 (the gpt-oss drafts say 4096)
    struct ds_rope_config rope;      // default: theta 10000, no scaling
    bool tie_word_embeddings;        // default false
    int64_t pad_token_id;            // -1 when absent
    enum ds_dtype weight_dtype;      // from torch_dtype: BF16 (default) or F32

    // Vocabulary.
    int64_t vocab_size;       // V, required: the TARGET vocabulary (t2d length, embed rows)
    int64_t draft_vocab_size; // Dv, default V; lm_head rows and d2t length
    bool full_vocab_head;     // Dv == V: no d2t/t2d needed, identity mapping

    // Input side.
    int64_t target_hidden_size; // Ht, default hidden_size; fc input is DS_AUX_COUNT * Ht
    bool use_aux_hidden_state;  // default true; false = no fc, input is the target's final
                                // post-norm hidden (NVIDIA short-context / v2 heads)
    bool norm_before_fc;        // RMSNorm(input_norm.weight) over the concatenated aux states
                                // before fc (speculators: top level; NVIDIA v3: eagle_config)
    bool norm_before_fc_in_eagle_config; // the NVIDIA v3 placement (decides the id convention)
    bool fc_norm;               // per-state RMSNorm (fc_norm.<i>.weight) before fc (EAGLE-3.1)
    bool fc_bias;               // fc has a bias ("bias" key, SGLang)
    bool norm_before_residual;  // residual = hidden_norm(g) instead of the raw g
    bool norm_output;           // feed the post-norm hidden back (EAGLE-3.1); default false

    // Aux ids exactly as written, and their convention.
    int num_aux_ids;              // 0 when absent
    int64_t aux_ids[DS_AUX_MAX];  // strictly ascending, >= 0 (checked at parse time)
    enum ds_aux_source aux_source;
    enum ds_aux_convention aux_convention; // as far as the config alone tells (see
                                           // ds_draft_default_convention for the full rule)

    // What the tensor table tells (filled by ds_checkpoint_check_draft; parse sets the layout's
    // usual choice and false).
    enum ds_draft_names layer_names;
    bool has_embed_tokens;     // the draft ships embed_tokens.weight (else the target's is used)
    bool lm_head_from_target;  // full-vocabulary head without its own lm_head.weight
};

// Parses a draft config.json (len bytes); as ds_target_config_parse.
enum ds_status ds_draft_config_parse(const char *json, size_t len, const char *label,
                                     struct ds_draft_config *cfg_out);

// Reads DIR/config.json and parses it.
enum ds_status ds_draft_config_load(const char *dir, struct ds_draft_config *cfg_out);

// The default convention of a draft's ids, chosen from its format: ids at the top level
// (speculators) -> capture-before; ids in eagle_config with norm_before_fc also there, or with an
// id equal to the target's layer count (NVIDIA v3) -> boundary; other eagle_config ids
// (SpecForge/lmsys, ModelOpt <= v2) -> output-of; no ids -> capture-before (the engine defaults).
// This is d->aux_convention refined by the "id == N" rule; num_target_layers may be 0 when
// unknown (the rule is then skipped).
enum ds_aux_convention ds_draft_default_convention(const struct ds_draft_config *d,
                                                   int64_t num_target_layers);

// The physical states a draft is fed from one target.
struct ds_aux_plan {
    int n;                            // DS_AUX_COUNT, or 0 for a no-aux head
    int64_t ids[DS_AUX_MAX];          // the ids used (the config's, or the engine defaults)
    bool ids_from_engine_default;     // the config named none
    enum ds_aux_convention convention; // the convention applied
    int64_t boundaries[DS_AUX_MAX];   // physical boundaries, ascending, in 0..num_target_layers
};

// Resolves a draft's aux ids against a target with num_target_layers layers, under
// `*convention` when given (a command-line override), else the default convention. A config
// without ids gets the engine defaults, always in capture-before convention. A no-aux head
// gives n = 0. DS_ERR_RANGE naming the config, the field, the id and the allowed range when a
// boundary falls outside the target; *plan_out is zeroed on failure.
enum ds_status ds_aux_plan(const struct ds_draft_config *d, int64_t num_target_layers,
                           const enum ds_aux_convention *convention, const char *label,
                           struct ds_aux_plan *plan_out);

#ifdef __cplusplus
}
#endif
#endif // DS_CONFIG_H
