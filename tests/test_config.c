// config.json parsing (target and draft) and the aux-id conventions.
//
// Expected values come from the published configs (the gpt-oss hub config.json, SpecForge's
// gpt-oss EAGLE-3 configs, the speculators and ModelOpt layouts) and from the conventions' defining
// rules (output-of: boundary = id + 1; capture-before and boundary: boundary = id), worked by hand
// in each case. Comparisons of doubles are exact: each value is the nearest double to a decimal
// literal in both the JSON and the test.
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#include "ds/config.h"

#define LT2 "\"sliding_attention\", \"full_attention\""
#define LT6 LT2 ", " LT2 ", " LT2
#define LAYER_TYPES_36 LT6 ", " LT6 ", " LT6 ", " LT6 ", " LT6 ", " LT6
// The layer fields of a small draft.
#define DIMS                                                                                       \
    "\"hidden_size\": 64, \"intermediate_size\": 64, \"num_attention_heads\": 4, "                \
    "\"vocab_size\": 512"

// The gpt-oss-120b hub config.json (its 20b twin differs in num_hidden_layers 24, experts 32).
static const char *cfg_120b =
    "{\"architectures\": [\"GptOssForCausalLM\"], \"attention_bias\": true,"
    " \"attention_dropout\": 0.0, \"eos_token_id\": 200002, \"experts_per_token\": 4,"
    " \"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2880,"
    " \"initial_context_length\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 2880, \"layer_types\": [" LAYER_TYPES_36 "],"
    " \"max_position_embeddings\": 131072, \"model_type\": \"gpt_oss\","
    " \"num_attention_heads\": 64, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 36,"
    " \"num_key_value_heads\": 8, \"num_local_experts\": 128, \"output_router_logits\": false,"
    " \"pad_token_id\": 199999, \"quantization_config\": {\"modules_to_not_convert\":"
    " [\"model.layers.*.self_attn\", \"model.layers.*.mlp.router\", \"model.embed_tokens\","
    " \"lm_head\"], \"quant_method\": \"mxfp4\"}, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 32.0,"
    " \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false},"
    " \"rope_theta\": 150000, \"router_aux_loss_coef\": 0.9, \"sliding_window\": 128,"
    " \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false,"
    " \"transformers_version\": \"4.55.0.dev0\", \"use_cache\": true, \"vocab_size\": 201088}";

// The smallest target config: only the required fields.
static const char *cfg_min =
    "{\"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 32, \"num_local_experts\": 8, \"num_experts_per_tok\": 4}";

static enum ds_status parse_t(const char *json, struct ds_target_config *c) {
    return ds_target_config_parse(json, strlen(json), "x/config.json", c);
}

static enum ds_status parse_d(const char *json, struct ds_draft_config *c) {
    return ds_draft_config_parse(json, strlen(json), "d/config.json", c);
}

static void target_120b_every_field(void) {
    struct ds_target_config c;
    EXPECT_OK(parse_t(cfg_120b, &c));
    EXPECT_EQ_STR(c.architecture, "GptOssForCausalLM");
    EXPECT_EQ_STR(c.model_type, "gpt_oss");
    EXPECT_EQ_INT(c.vocab_size, 201088);
    EXPECT_EQ_INT(c.hidden_size, 2880);
    EXPECT_EQ_INT(c.intermediate_size, 2880);
    EXPECT_EQ_INT(c.num_hidden_layers, 36);
    EXPECT_EQ_INT(c.num_attention_heads, 64);
    EXPECT_EQ_INT(c.num_key_value_heads, 8);
    EXPECT_EQ_INT(c.head_dim, 64);
    EXPECT_EQ_INT(c.num_local_experts, 128);
    EXPECT_EQ_INT(c.num_experts_per_tok, 4);
    EXPECT_EQ_INT(c.sliding_window, 128);
    for (int l = 0; l < 36; l++)
        EXPECT_EQ_INT(c.layer_types[l], l % 2 ? DS_ATTN_FULL : DS_ATTN_SLIDING);
    EXPECT_EQ_INT(c.rope.type, DS_ROPE_YARN);
    EXPECT(c.rope.theta == 150000.0);
    EXPECT(c.rope.factor == 32.0);
    EXPECT(c.rope.beta_fast == 32.0);
    EXPECT(c.rope.beta_slow == 1.0);
    EXPECT_EQ_INT(c.rope.original_max_position_embeddings, 4096);
    EXPECT(!c.rope.truncate);
    EXPECT_EQ_INT(c.max_position_embeddings, 131072);
    EXPECT_EQ_INT(c.initial_context_length, 4096);
    EXPECT(c.rms_norm_eps == 1e-5);
    EXPECT(c.swiglu_limit == 7.0);
    EXPECT(c.swiglu_alpha == 1.702); // absent in the file: the hard-coded reference value
    EXPECT_EQ_INT(c.num_eos_token_ids, 1);
    EXPECT_EQ_INT(c.eos_token_ids[0], 200002);
    EXPECT_EQ_INT(c.pad_token_id, 199999);
    EXPECT_EQ_INT(c.bos_token_id, -1);
    EXPECT(c.attention_bias);
    EXPECT(!c.tie_word_embeddings);
    EXPECT(c.mxfp4);
}

// Newer transformers writes rope_parameters with rope_theta inside; same meaning.
static void target_rope_parameters_spelling(void) {
    const char *j =
        "{\"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 64,"
        " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"head_dim\": 32, \"num_local_experts\": 8, \"num_experts_per_tok\": 4,"
        " \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0,"
        " \"factor\": 32.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0,"
        " \"original_max_position_embeddings\": 4096, \"truncate\": false}}";
    struct ds_target_config c;
    EXPECT_OK(parse_t(j, &c));
    EXPECT_EQ_INT(c.rope.type, DS_ROPE_YARN);
    EXPECT(c.rope.theta == 150000.0);
    EXPECT(c.rope.factor == 32.0);
    EXPECT_EQ_INT(c.rope.original_max_position_embeddings, 4096);
    EXPECT(!c.rope.truncate);
    // An older file with "type" instead of "rope_type" and no truncate: HF defaults it to true.
    const char *old =
        "{\"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 64,"
        " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"head_dim\": 32, \"num_local_experts\": 8, \"num_experts_per_tok\": 4,"
        " \"rope_theta\": 50000, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8}}";
    EXPECT_OK(parse_t(old, &c));
    EXPECT(c.rope.theta == 50000.0);
    EXPECT(c.rope.factor == 8.0);
    EXPECT(c.rope.truncate);
    EXPECT_EQ_INT(c.rope.original_max_position_embeddings, 131072); // max_position_embeddings
}

// Absent optional fields take GptOssConfig's defaults (the 120b values).
static void target_defaults(void) {
    struct ds_target_config c;
    EXPECT_OK(parse_t(cfg_min, &c));
    EXPECT_EQ_INT(c.sliding_window, 128);
    EXPECT_EQ_INT(c.layer_types[0], DS_ATTN_SLIDING);
    EXPECT_EQ_INT(c.layer_types[1], DS_ATTN_FULL);
    EXPECT_EQ_INT(c.layer_types[3], DS_ATTN_FULL);
    EXPECT_EQ_INT(c.rope.type, DS_ROPE_YARN);
    EXPECT(c.rope.theta == 150000.0);
    EXPECT(c.rope.factor == 32.0);
    EXPECT_EQ_INT(c.max_position_embeddings, 131072);
    EXPECT(c.rms_norm_eps == 1e-5);
    EXPECT(c.swiglu_limit == 7.0);
    EXPECT(c.swiglu_alpha == 1.702);
    EXPECT(c.attention_bias);
    EXPECT(!c.mxfp4); // no quantization_config: BF16 experts
    EXPECT_EQ_INT(c.num_eos_token_ids, 0);
    EXPECT_EQ_INT(c.pad_token_id, -1);
}

static void target_aliases_and_lists(void) {
    const char *j =
        "{\"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 64,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"head_dim\": 32, \"num_local_experts\": 8, \"experts_per_token\": 2,"
        " \"eos_token_id\": [200002, 199999, 200012], \"hidden_size_note\": null,"
        " \"swiglu_alpha\": 1.5, \"layer_types\": [\"full_attention\", \"full_attention\"]}";
    struct ds_target_config c;
    EXPECT_OK(parse_t(j, &c));
    EXPECT_EQ_INT(c.num_experts_per_tok, 2);
    EXPECT_EQ_INT(c.num_eos_token_ids, 3);
    EXPECT_EQ_INT(c.eos_token_ids[2], 200012);
    EXPECT(c.swiglu_alpha == 1.5);
    EXPECT_EQ_INT(c.layer_types[0], DS_ATTN_FULL);
}

static void target_missing_field(void) {
    const char *j =
        "{\"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 64,"
        " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"head_dim\": 32, \"num_experts_per_tok\": 4}";
    struct ds_target_config c;
    EXPECT_STATUS(parse_t(j, &c), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("x/config.json");
    EXPECT_ERROR_HAS("missing required field 'num_local_experts'");
    EXPECT_EQ_INT(c.hidden_size, 0); // zeroed on failure
}

static void target_malformed(void) {
    struct ds_target_config c;
    EXPECT_STATUS(parse_t("{\"vocab_size\": 512,", &c), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("x/config.json: malformed JSON");
    EXPECT_STATUS(parse_t("[1, 2]", &c), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("expected a JSON object");
    // Duplicate keys are ambiguous: rejected.
    EXPECT_STATUS(parse_t("{\"vocab_size\": 1, \"vocab_size\": 2}", &c), DS_ERR_FORMAT);
    EXPECT_STATUS(ds_target_config_parse("", 0, "x/config.json", &c), DS_ERR_FORMAT);
}

static void target_bad_values(void) {
    struct ds_target_config c;
    char j[2048];
    // Each replacement of a field in the minimal config and the words its message must carry.
    static const struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"\"hidden_size\": 64", "\"hidden_size\": \"64\"", "'hidden_size' must be an integer"},
        {"\"hidden_size\": 64", "\"hidden_size\": -64", "'hidden_size' is -64"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "not a multiple"},
        {"\"num_experts_per_tok\": 4", "\"num_experts_per_tok\": 9", "'num_experts_per_tok' is 9"},
        {"\"head_dim\": 32", "\"head_dim\": 32.5", "'head_dim' must be an integer"},
        {"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 4, \"layer_types\": []",
         "'layer_types' has 0 entries"},
        {"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 100000", "'num_hidden_layers'"},
        {"\"head_dim\": 32", "\"head_dim\": 32, \"rope_scaling\": {\"rope_type\": \"dynamic\"}",
         "'rope_scaling.rope_type' is \"dynamic\""},
        {"\"head_dim\": 32", "\"head_dim\": 32, \"model_type\": \"llama\"", "expected \"gpt_oss\""},
        {"\"head_dim\": 32",
         "\"head_dim\": 32, \"quantization_config\": {\"quant_method\": \"mxfp4\"}, \"x\": 0",
         NULL},
        {"\"hidden_size\": 64", "\"hidden_size\": 48, \"quantization_config\": {\"quant_method\":"
                                " \"mxfp4\"}",
         "multiples of 32"},
        {"\"head_dim\": 32",
         "\"head_dim\": 32, \"quantization_config\": {\"quant_method\": \"gptq\"}",
         "expected \"mxfp4\""},
        {"\"head_dim\": 32", "\"head_dim\": 32, \"attention_bias\": 1",
         "'attention_bias' must be true or false"},
        // The model binds the attention biases and lm_head: configs without them are refused.
        {"\"head_dim\": 32", "\"head_dim\": 32, \"attention_bias\": false",
         "'attention_bias' is false, expected true"},
        {"\"head_dim\": 32", "\"head_dim\": 32, \"tie_word_embeddings\": true",
         "'tie_word_embeddings' is true, expected false"},
        // RoPE settings the tables refuse: once only found after the whole weight load, with a
        // message that named neither config.json nor the field.
        {"\"head_dim\": 32", "\"head_dim\": 32, \"rope_theta\": 1",
         "'rope_theta' is 1, expected more than 1"},
        {"\"head_dim\": 32",
         "\"head_dim\": 32, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 0.5}",
         "'rope_parameters.rope_theta' is 0.5"},
        {"\"head_dim\": 32",
         "\"head_dim\": 32, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 0.5}",
         "'rope_scaling.factor' is 0.5, expected at least 1"},
        {"\"head_dim\": 32",
         "\"head_dim\": 32, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4,"
         " \"beta_fast\": 1, \"beta_slow\": 32}",
         "'rope_scaling.beta_fast' is 1, expected more than beta_slow 32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *at = strstr(cfg_min, cases[i].from);
        snprintf(j, sizeof j, "%.*s%s%s", (int)(at - cfg_min), cfg_min, cases[i].to,
                 at + strlen(cases[i].from));
        enum ds_status s = parse_t(j, &c);
        if (!cases[i].msg) {
            EXPECT_OK(s);
            continue;
        }
        if (s == DS_OK) DS_FAILF("case %zu (%s) parsed", i, cases[i].to);
        EXPECT_ERROR_HAS("x/config.json");
        EXPECT_ERROR_HAS(cases[i].msg);
    }
}

// SpecForge's configs/gpt-oss-120B-eagle3.json (what lmsys/EAGLE3-gpt-oss-120b-bf16 carries).
static const char *cfg_specforge_120b =
    "{\"architectures\": [\"LlamaForCausalLMEagle3\"],"
    " \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [1, 17, 33]},"
    " \"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2880,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 17280,"
    " \"max_position_embeddings\": 4096, \"model_type\": \"llama\", \"num_attention_heads\": 64,"
    " \"num_key_value_heads\": 8, \"num_hidden_layers\": 1, \"pad_token_id\": 0,"
    " \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.55.0\", \"use_cache\": true, \"vocab_size\": 201088,"
    " \"draft_vocab_size\": 32000}";

static void draft_specforge(void) {
    struct ds_draft_config d;
    EXPECT_OK(parse_d(cfg_specforge_120b, &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_SPECFORGE);
    EXPECT_EQ_STR(d.architecture, "LlamaForCausalLMEagle3");
    EXPECT_EQ_INT(d.hidden_size, 2880);
    EXPECT_EQ_INT(d.intermediate_size, 17280);
    EXPECT_EQ_INT(d.num_attention_heads, 64);
    EXPECT_EQ_INT(d.num_key_value_heads, 8);
    EXPECT_EQ_INT(d.head_dim, 64);
    EXPECT_EQ_INT(d.num_hidden_layers, 1);
    EXPECT_EQ_STR(d.hidden_act, "silu");
    EXPECT(d.rms_norm_eps == 1e-5);
    EXPECT_EQ_INT(d.max_position_embeddings, 4096);
    EXPECT_EQ_INT(d.rope.type, DS_ROPE_DEFAULT);
    EXPECT(d.rope.theta == 10000.0); // absent: LlamaConfig's default
    EXPECT_EQ_INT(d.vocab_size, 201088);
    EXPECT_EQ_INT(d.draft_vocab_size, 32000);
    EXPECT(!d.full_vocab_head);
    EXPECT_EQ_INT(d.target_hidden_size, 2880); // absent: equals hidden_size
    EXPECT_EQ_INT(d.pad_token_id, 0);
    EXPECT_EQ_INT(d.weight_dtype, DS_DTYPE_BF16);
    EXPECT(d.use_aux_hidden_state);
    EXPECT(!d.norm_before_fc && !d.fc_norm && !d.norm_before_residual && !d.norm_output);
    EXPECT_EQ_INT(d.layer_names, DS_DRAFT_NAMES_MIDLAYER);
    EXPECT_EQ_INT(d.num_aux_ids, 3);
    EXPECT_EQ_INT(d.aux_ids[2], 33);
    EXPECT_EQ_INT(d.aux_source, DS_AUX_SOURCE_EAGLE_CONFIG);

    // SpecForge ids are outputs of layers: boundaries id + 1 = 2, 18, 34 of the 36-layer 120b.
    EXPECT_EQ_INT(ds_draft_default_convention(&d, 36), DS_AUX_OUTPUT_OF);
    struct ds_aux_plan p;
    EXPECT_OK(ds_aux_plan(&d, 36, NULL, "d/config.json", &p));
    EXPECT_EQ_INT(p.n, 3);
    EXPECT_EQ_INT(p.boundaries[0], 2);
    EXPECT_EQ_INT(p.boundaries[1], 18);
    EXPECT_EQ_INT(p.boundaries[2], 34);
    EXPECT(!p.ids_from_engine_default);
    // The same ids read raw by vLLM (capture-before) name boundaries 1, 17, 33 instead.
    enum ds_aux_convention cb = DS_AUX_CAPTURE_BEFORE;
    EXPECT_OK(ds_aux_plan(&d, 36, &cb, "d/config.json", &p));
    EXPECT_EQ_INT(p.boundaries[0], 1);
    EXPECT_EQ_INT(p.boundaries[2], 33);
}

static void draft_speculators(void) {
    const char *j =
        "{\"architectures\": [\"Eagle3Speculator\"], \"draft_vocab_size\": 32000,"
        " \"eagle_aux_hidden_state_layer_ids\": [2, 18, 33], \"fc_norm\": false,"
        " \"norm_before_fc\": true, \"norm_before_residual\": true, \"norm_output\": false,"
        " \"speculators_model_type\": \"eagle3\", \"target_hidden_size\": null,"
        " \"speculators_config\": {\"algorithm\": \"eagle3\"},"
        " \"transformer_layer_config\": {\"model_type\": \"llama\", \"hidden_size\": 2880,"
        " \"intermediate_size\": 17280, \"num_attention_heads\": 64, \"num_key_value_heads\": 8,"
        " \"head_dim\": 64, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"
        " \"rope_theta\": 150000.0, \"vocab_size\": 201088, \"torch_dtype\": \"bfloat16\"}}";
    struct ds_draft_config d;
    EXPECT_OK(parse_d(j, &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_SPECULATORS);
    EXPECT_EQ_STR(d.architecture, "Eagle3Speculator");
    EXPECT_EQ_INT(d.hidden_size, 2880);
    EXPECT_EQ_INT(d.intermediate_size, 17280);
    EXPECT_EQ_INT(d.vocab_size, 201088);
    EXPECT_EQ_INT(d.draft_vocab_size, 32000);
    EXPECT_EQ_INT(d.target_hidden_size, 2880); // null = absent
    EXPECT(d.rope.theta == 150000.0);
    EXPECT_EQ_INT(d.max_position_embeddings, 131072);
    EXPECT(d.norm_before_fc);
    EXPECT(!d.norm_before_fc_in_eagle_config);
    EXPECT(d.norm_before_residual);
    EXPECT_EQ_INT(d.layer_names, DS_DRAFT_NAMES_LAYERS0);
    EXPECT_EQ_INT(d.aux_source, DS_AUX_SOURCE_TOP_LEVEL);
    EXPECT_EQ_INT(d.aux_convention, DS_AUX_CAPTURE_BEFORE);
    // vLLM ids: captured before layer id, boundary = id: 2, 18, 33.
    struct ds_aux_plan p;
    EXPECT_OK(ds_aux_plan(&d, 36, NULL, "d/config.json", &p));
    EXPECT_EQ_INT(p.convention, DS_AUX_CAPTURE_BEFORE);
    EXPECT_EQ_INT(p.boundaries[0], 2);
    EXPECT_EQ_INT(p.boundaries[1], 18);
    EXPECT_EQ_INT(p.boundaries[2], 33);

    // Without the key, a speculators config means norm_before_residual = true (vLLM's speculators
    // loader: config_dict.get("norm_before_residual", True)); an explicit false is kept.
    const char *layer = "\"transformer_layer_config\": {\"hidden_size\": 64, \"intermediate_size\":"
                        " 128, \"num_attention_heads\": 4, \"vocab_size\": 512}";
    char j2[512];
    snprintf(j2, sizeof j2, "{\"speculators_model_type\": \"eagle3\", %s}", layer);
    EXPECT_OK(parse_d(j2, &d));
    EXPECT(d.norm_before_residual);
    snprintf(j2, sizeof j2,
             "{\"speculators_model_type\": \"eagle3\", \"norm_before_residual\": false, %s}",
             layer);
    EXPECT_OK(parse_d(j2, &d));
    EXPECT(!d.norm_before_residual);

    // A speculators field missing from transformer_layer_config is named with its path.
    const char *bad = "{\"speculators_model_type\": \"eagle3\", \"transformer_layer_config\":"
                      " {\"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 512}}";
    EXPECT_STATUS(parse_d(bad, &d), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("d/config.json: missing required field "
                     "'transformer_layer_config.intermediate_size'");
    EXPECT_STATUS(parse_d("{\"speculators_model_type\": \"eagle3\"}", &d), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("'transformer_layer_config'");
}

// NVIDIA v3: boundary ids [24, 30, 36] (36 = after the last of 36 layers) with norm_before_fc
// inside eagle_config; no draft_vocab_size (full vocabulary).
static void draft_nvidia_v3(void) {
    const char *j =
        "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"eagle_config\":"
        " {\"eagle_aux_hidden_state_layer_ids\": [24, 30, 36], \"norm_before_fc\": true,"
        " \"use_aux_hidden_state\": true, \"use_last_layernorm\": true},"
        " \"hidden_size\": 2880, \"intermediate_size\": 17280, \"num_attention_heads\": 64,"
        " \"num_key_value_heads\": 8, \"head_dim\": 64, \"vocab_size\": 201088,"
        " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
        " \"original_max_position_embeddings\": 8192}}";
    struct ds_draft_config d;
    EXPECT_OK(parse_d(j, &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_NVIDIA);
    EXPECT(d.norm_before_fc);
    EXPECT(d.norm_before_fc_in_eagle_config);
    EXPECT(d.full_vocab_head);
    EXPECT_EQ_INT(d.draft_vocab_size, 201088);
    EXPECT_EQ_INT(d.rope.type, DS_ROPE_LLAMA3);
    EXPECT(d.rope.factor == 8.0);
    EXPECT(d.rope.low_freq_factor == 1.0 && d.rope.high_freq_factor == 4.0);
    EXPECT_EQ_INT(d.rope.original_max_position_embeddings, 8192);
    EXPECT_EQ_INT(d.aux_convention, DS_AUX_BOUNDARY);
    EXPECT_EQ_INT(ds_draft_default_convention(&d, 36), DS_AUX_BOUNDARY);
    struct ds_aux_plan p;
    EXPECT_OK(ds_aux_plan(&d, 36, NULL, "d/config.json", &p));
    EXPECT_EQ_INT(p.boundaries[0], 24);
    EXPECT_EQ_INT(p.boundaries[2], 36);
    // Under output-of the last id would name boundary 37 of a 36-layer target.
    enum ds_aux_convention oo = DS_AUX_OUTPUT_OF;
    EXPECT_STATUS(ds_aux_plan(&d, 36, &oo, "d/config.json", &p), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("d/config.json: eagle_config.eagle_aux_hidden_state_layer_ids: id 36 names "
                     "boundary 37 under the output-of convention, outside 0..36");
    EXPECT_EQ_INT(p.n, 0);
}

// ModelOpt before v3 (long-context head): ModelOpt keys in eagle_config, output-of ids; an id
// equal to N alone, without norm_before_fc, also marks boundary ids.
static void draft_nvidia_output_of_and_id_n(void) {
    const char *j =
        "{\"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [1, 17, 32],"
        " \"use_aux_hidden_state\": true, \"use_input_layernorm_in_first_layer\": true},"
        " \"hidden_size\": 2880, \"intermediate_size\": 17280, \"num_attention_heads\": 64,"
        " \"head_dim\": 64, \"vocab_size\": 201088}";
    struct ds_draft_config d;
    EXPECT_OK(parse_d(j, &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_NVIDIA);
    EXPECT_EQ_INT(d.num_key_value_heads, 64); // absent: LlamaConfig uses the head count
    struct ds_aux_plan p;
    EXPECT_OK(ds_aux_plan(&d, 36, NULL, "d/config.json", &p));
    EXPECT_EQ_INT(p.convention, DS_AUX_OUTPUT_OF);
    EXPECT_EQ_INT(p.boundaries[0], 2);
    EXPECT_EQ_INT(p.boundaries[1], 18);
    EXPECT_EQ_INT(p.boundaries[2], 33);
    // [4, 12, 24] against a 24-layer target: 24 cannot be a 0-based layer, so boundary.
    EXPECT_EQ_INT(d.aux_convention, DS_AUX_OUTPUT_OF);
    d.aux_ids[0] = 4;
    d.aux_ids[1] = 12;
    d.aux_ids[2] = 24;
    EXPECT_EQ_INT(ds_draft_default_convention(&d, 24), DS_AUX_BOUNDARY);
    EXPECT_EQ_INT(ds_draft_default_convention(&d, 36), DS_AUX_OUTPUT_OF);
}

static void draft_no_aux_head(void) {
    const char *j = "{\"eagle_config\": {\"use_aux_hidden_state\": false},"
                    " \"hidden_size\": 2880, \"intermediate_size\": 17280,"
                    " \"num_attention_heads\": 64, \"head_dim\": 64, \"vocab_size\": 201088}";
    struct ds_draft_config d;
    EXPECT_OK(parse_d(j, &d));
    EXPECT(!d.use_aux_hidden_state);
    struct ds_aux_plan p;
    EXPECT_OK(ds_aux_plan(&d, 36, NULL, "d/config.json", &p));
    EXPECT_EQ_INT(p.n, 0);
    // Ids given to a head that takes none, or norm_before_fc without an fc: contradictions.
    const char *ids = "{\"eagle_config\": {\"use_aux_hidden_state\": false,"
                      " \"eagle_aux_hidden_state_layer_ids\": [1, 2, 3]}, \"hidden_size\": 64,"
                      " \"intermediate_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 9}";
    EXPECT_STATUS(parse_d(ids, &d), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("use_aux_hidden_state is false");
}

// No ids anywhere: the engines' defaults, capture before {2, N/2, N-3}.
static void draft_engine_defaults(void) {
    const char *j = "{\"hidden_size\": 2880, \"intermediate_size\": 17280,"
                    " \"num_attention_heads\": 64, \"head_dim\": 64, \"vocab_size\": 201088,"
                    " \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": []}}";
    struct ds_draft_config d;
    EXPECT_OK(parse_d(j, &d));
    EXPECT_EQ_INT(d.num_aux_ids, 0);
    EXPECT_EQ_INT(d.aux_source, DS_AUX_SOURCE_NONE);
    struct ds_aux_plan p;
    EXPECT_OK(ds_aux_plan(&d, 36, NULL, "d/config.json", &p));
    EXPECT(p.ids_from_engine_default);
    EXPECT_EQ_INT(p.convention, DS_AUX_CAPTURE_BEFORE);
    EXPECT_EQ_INT(p.boundaries[0], 2); // 120b: 2, 18, 33
    EXPECT_EQ_INT(p.boundaries[1], 18);
    EXPECT_EQ_INT(p.boundaries[2], 33);
    // An override does not shift the engines' own defaults.
    enum ds_aux_convention oo = DS_AUX_OUTPUT_OF;
    EXPECT_OK(ds_aux_plan(&d, 24, &oo, "d/config.json", &p));
    EXPECT_EQ_INT(p.boundaries[0], 2); // 20b: 2, 12, 21
    EXPECT_EQ_INT(p.boundaries[1], 12);
    EXPECT_EQ_INT(p.boundaries[2], 21);
    // A 4-layer target has no valid defaults ({2, 2, 1} is not ascending).
    EXPECT_STATUS(ds_aux_plan(&d, 4, NULL, "d/config.json", &p), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("engine default aux ids");
}

static void draft_bad_ids_and_fields(void) {
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{\"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [1, 17]}, " DIMS "}",
         "lists 2 ids, expected 3"},
        {"{\"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [17, 1, 33]}, " DIMS "}",
         "strictly ascending, found 1 after 17"},
        {"{\"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [1, 1, 33]}, " DIMS "}",
         "strictly ascending"},
        {"{\"eagle_aux_hidden_state_layer_ids\": [-1, 2, 3], " DIMS "}",
         "'eagle_aux_hidden_state_layer_ids' is -1"},
        {"{\"eagle_aux_hidden_state_layer_ids\": 3, " DIMS "}", "must be a list"},
        {"{\"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 512}",
         "missing required field 'intermediate_size'"},
        {"{" DIMS ", \"draft_vocab_size\": 600}", "'draft_vocab_size' is 600, expected 1..512"},
        {"{" DIMS ", \"norm_before_fc\": true, \"fc_norm\": true}", "exclude each other"},
        {"{" DIMS ", \"torch_dtype\": \"int8\"}", "'torch_dtype' is \"int8\""},
        // The ops read no float16 weights: such a draft passed inspect, then failed at load.
        {"{" DIMS ", \"torch_dtype\": \"float16\"}",
         "'torch_dtype' is \"float16\"; supported: bfloat16, float32"},
        {"{" DIMS ", \"eagle_config\": [1]}", "'eagle_config' must be an object"},
        {"{\"speculators_model_type\": \"eagle\", \"transformer_layer_config\": {}}",
         "must be \"eagle3\""},
        {"{" DIMS ", \"rope_theta\": 0.5}", "'rope_theta' is 0.5, expected more than 1"},
        {"{" DIMS ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2,"
         " \"beta_fast\": 1, \"beta_slow\": 2}}",
         "'rope_scaling.beta_fast' is 1, expected more than beta_slow 2"},
    };
    struct ds_draft_config d;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (parse_d(cases[i].json, &d) == DS_OK) DS_FAILF("case %zu parsed", i);
        EXPECT_ERROR_HAS("d/config.json");
        EXPECT_ERROR_HAS(cases[i].msg);
    }
}

static void aux_conventions_by_hand(void) {
    // ids [1, 17, 33] of a 36-layer target: output-of -> 2, 18, 34; the other two -> as written.
    const int64_t ids[3] = {1, 17, 33};
    int64_t b[3];
    EXPECT_OK(ds_aux_to_boundaries(ids, 3, DS_AUX_OUTPUT_OF, 36, "c", "f", b));
    EXPECT_EQ_INT(b[0], 2);
    EXPECT_EQ_INT(b[2], 34);
    EXPECT_OK(ds_aux_to_boundaries(ids, 3, DS_AUX_BOUNDARY, 36, "c", "f", b));
    EXPECT_EQ_INT(b[2], 33);
    // Boundary 0 (the embeddings) and N (after the last layer) are both real states.
    const int64_t edge[3] = {0, 1, 4};
    EXPECT_OK(ds_aux_to_boundaries(edge, 3, DS_AUX_CAPTURE_BEFORE, 4, "c", "f", b));
    EXPECT_STATUS(ds_aux_to_boundaries(edge, 3, DS_AUX_OUTPUT_OF, 4, "c", "f", b), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("c: f: id 4 names boundary 5 under the output-of convention");
    enum ds_aux_convention c;
    EXPECT_OK(ds_aux_convention_parse("capture-before", &c));
    EXPECT_EQ_INT(c, DS_AUX_CAPTURE_BEFORE);
    EXPECT_STATUS(ds_aux_convention_parse("vllm", &c), DS_ERR_ARG);
    int64_t dflt[3];
    ds_aux_engine_default_ids(36, dflt);
    EXPECT_EQ_INT(dflt[1], 18);
    EXPECT_EQ_INT(dflt[2], 33);
}

// The committed fixtures, read from disk.
static void load_fixture_configs(void) {
    struct ds_target_config t;
    struct ds_draft_config d;
    EXPECT_OK(ds_target_config_load(DS_SOURCE_DIR "/tests/fixtures/ckpt/target", &t));
    EXPECT_EQ_INT(t.hidden_size, 64);
    EXPECT_EQ_INT(t.num_attention_heads * t.head_dim, 128); // != hidden, as in gpt-oss
    EXPECT_EQ_INT(t.num_local_experts, 8);
    EXPECT(t.mxfp4);
    EXPECT_OK(ds_draft_config_load(DS_SOURCE_DIR "/tests/fixtures/ckpt/draft-lmsys", &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_SPECFORGE);
    EXPECT_EQ_INT(d.draft_vocab_size, 128);
    EXPECT_OK(ds_draft_config_load(DS_SOURCE_DIR "/tests/fixtures/ckpt/draft-speculators", &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_SPECULATORS);
    EXPECT(d.norm_before_fc && d.norm_before_residual);
    EXPECT_OK(ds_draft_config_load(DS_SOURCE_DIR "/tests/fixtures/ckpt/draft-nvidia-v3", &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_NVIDIA);
    EXPECT_EQ_INT(ds_draft_default_convention(&d, 4), DS_AUX_BOUNDARY);
    EXPECT_STATUS(ds_target_config_load(DS_BINARY_DIR "/no-such-dir", &t), DS_ERR_IO);
    EXPECT_ERROR_HAS("no-such-dir/config.json: cannot open");
}

// A config.json that is a directory once read as "9223372036854775807 bytes, larger than any
// config.json".
static void config_json_not_a_regular_file(void) {
    char dir[1024], sub[1024];
    EXPECT(ds_t_dir_in_place_of(DS_BINARY_DIR, "config.json", dir, sub, sizeof dir));
    struct ds_target_config t;
    EXPECT_STATUS(ds_target_config_load(dir, &t), DS_ERR_IO);
    EXPECT_ERROR_HAS(sub);
    EXPECT_ERROR_HAS("not a regular file");
    rmdir(sub);
    rmdir(dir);
    // A FIFO config.json is refused at once: the open blocked until a writer came (alarm turns
    // a hang into a failure).
    EXPECT(ds_t_dir_in_place_of(DS_BINARY_DIR, "unused", dir, sub, sizeof dir));
    rmdir(sub);
    EXPECT(snprintf(sub, sizeof sub, "%.1000s/config.json", dir) < (int)sizeof sub);
    EXPECT(mkfifo(sub, 0600) == 0);
    alarm(20);
    EXPECT_STATUS(ds_target_config_load(dir, &t), DS_ERR_IO);
    alarm(0);
    EXPECT_ERROR_HAS("config.json: not a regular file");
    unlink(sub);
    rmdir(dir);
    // A file given where the checkpoint directory goes (its config.json): named as that, for the
    // target and the draft (it was "DIR/config.json/config.json: ... Not a directory").
    const char *file = DS_SOURCE_DIR "/tests/fixtures/ckpt/target/config.json";
    EXPECT_STATUS(ds_target_config_load(file, &t), DS_ERR_IO);
    EXPECT_ERROR_HAS("target/config.json: not a directory (a checkpoint is the directory");
    struct ds_draft_config d;
    EXPECT_STATUS(ds_draft_config_load(file, &d), DS_ERR_IO);
    EXPECT_ERROR_HAS("target/config.json: not a directory (a checkpoint is the directory");
}

int main(void) {
    DS_RUN(target_120b_every_field);
    DS_RUN(target_rope_parameters_spelling);
    DS_RUN(target_defaults);
    DS_RUN(target_aliases_and_lists);
    DS_RUN(target_missing_field);
    DS_RUN(target_malformed);
    DS_RUN(target_bad_values);
    DS_RUN(draft_specforge);
    DS_RUN(draft_speculators);
    DS_RUN(draft_nvidia_v3);
    DS_RUN(draft_nvidia_output_of_and_id_n);
    DS_RUN(draft_no_aux_head);
    DS_RUN(draft_engine_defaults);
    DS_RUN(draft_bad_ids_and_fields);
    DS_RUN(aux_conventions_by_hand);
    DS_RUN(load_fixture_configs);
    DS_RUN(config_json_not_a_regular_file);
    return ds_test_end();
}
