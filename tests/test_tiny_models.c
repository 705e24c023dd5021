// The bundled tiny pair (models/tiny): the target and the draft load, `draftscope inspect` finds
// no problem, the tokenizer loads with the harmony specials and round-trips the sample
// conversations, and the renderer builds harmony's default prompt from it.
//
// Expected values are the design of the pair written in models/tiny/README.md and
// scripts/tiny/make_tiny.py (TARGET, DRAFT): hidden 256, 6 layers alternating sliding (window
// 32, layer 0 sliding) and full, 8 experts top-4, 8 query heads x 32 with 2 KV heads, YaRN
// factor 4 over 256 positions, MXFP4 experts; the draft in the SpecForge layout with output-of
// aux ids [1, 2, 4] and a draft vocabulary of half the target's (1952 of 3904). The prompt text is harmony's default system
// message (openai/harmony test-data/test_simple_convo.txt).
#include "harness.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "ds/cli.h"
#include "ds/config.h"
#include "ds/harmony.h"
#include "ds/tokenizer.h"

#define TINY DS_SOURCE_DIR "/models/tiny"

static const char *const harmony_names[] = {
    "<|start|>",   "<|end|>",       "<|message|>",     "<|channel|>",    "<|return|>",
    "<|call|>",    "<|constrain|>", "<|endoftext|>",   "<|startoftext|>", "<|endofprompt|>",
};
#define N_HARMONY (sizeof harmony_names / sizeof harmony_names[0])

static void target_config_has_the_gpt_oss_structure(void) {
    struct ds_target_config c;
    EXPECT_OK(ds_target_config_load(TINY "/target", &c));
    EXPECT_EQ_STR(c.architecture, "GptOssForCausalLM");
    EXPECT_EQ_INT(c.hidden_size, 256);
    EXPECT_EQ_INT(c.intermediate_size, 256);
    EXPECT_EQ_INT(c.num_hidden_layers, 6);
    EXPECT_EQ_INT(c.num_attention_heads, 8);
    EXPECT_EQ_INT(c.num_key_value_heads, 2);
    EXPECT_EQ_INT(c.head_dim, 32);
    EXPECT_EQ_INT(c.num_local_experts, 8);
    EXPECT_EQ_INT(c.num_experts_per_tok, 4);
    EXPECT_EQ_INT(c.sliding_window, 32);
    for (int l = 0; l < 6; l++)
        EXPECT_EQ_INT(c.layer_types[l], l % 2 == 0 ? DS_ATTN_SLIDING : DS_ATTN_FULL);
    EXPECT_EQ_INT(c.rope.type, DS_ROPE_YARN);
    EXPECT_NEAR(c.rope.theta, 150000.0, 0.0);
    EXPECT_NEAR(c.rope.factor, 4.0, 0.0);
    EXPECT_EQ_INT(c.rope.original_max_position_embeddings, 256);
    EXPECT(!c.rope.truncate);
    EXPECT_EQ_INT(c.max_position_embeddings, 1024);
    EXPECT(c.attention_bias);
    EXPECT(!c.tie_word_embeddings);
    EXPECT(c.mxfp4);
    EXPECT_NEAR(c.swiglu_limit, 7.0, 0.0);
    EXPECT_EQ_INT(c.vocab_size % 64, 0); // padded like gpt-oss's 201088 rows
}

static void draft_config_is_specforge_with_three_aux_layers(void) {
    struct ds_draft_config d;
    struct ds_target_config c;
    EXPECT_OK(ds_target_config_load(TINY "/target", &c));
    EXPECT_OK(ds_draft_config_load(TINY "/draft", &d));
    EXPECT_EQ_INT(d.layout, DS_DRAFT_SPECFORGE);
    EXPECT_EQ_STR(d.architecture, "LlamaForCausalLMEagle3");
    EXPECT_EQ_INT(d.hidden_size, 256);
    EXPECT_EQ_INT(d.vocab_size, c.vocab_size);
    // make_tiny caps the draft vocabulary at half the target vocabulary (3904 / 2 = 1952).
    EXPECT_EQ_INT(d.draft_vocab_size, c.vocab_size / 2);
    EXPECT(d.draft_vocab_size < d.vocab_size);
    EXPECT_EQ_INT(d.aux_source, DS_AUX_SOURCE_EAGLE_CONFIG);
    EXPECT_EQ_INT(d.num_aux_ids, 3);
    if (d.num_aux_ids == 3) {
        EXPECT_EQ_INT(d.aux_ids[0], 1);
        EXPECT_EQ_INT(d.aux_ids[1], 2);
        EXPECT_EQ_INT(d.aux_ids[2], 4);
    }
    // Output-of ids: the residual stream after layers 1, 2 and 4 = boundaries 2, 3, 5.
    struct ds_aux_plan plan;
    EXPECT_OK(ds_aux_plan(&d, c.num_hidden_layers, NULL, "tiny draft", &plan));
    EXPECT_EQ_INT(plan.convention, DS_AUX_OUTPUT_OF);
    EXPECT_EQ_INT(plan.n, 3);
    EXPECT_EQ_INT(plan.boundaries[0], 2);
    EXPECT_EQ_INT(plan.boundaries[1], 3);
    EXPECT_EQ_INT(plan.boundaries[2], 5);
}

static void inspect_finds_no_problem(void) {
    char *argv[] = {"inspect", "--target", TINY "/target", "--draft", TINY "/draft", NULL};
    fflush(stdout);
    EXPECT_EQ_INT(ds_cmd_inspect(5, argv), 0);
}

static void tokenizer_has_the_harmony_specials(void) {
    ds_tokenizer_t *tok = NULL;
    EXPECT_OK(ds_tokenizer_load(TINY "/target", &tok));
    if (!tok) return;
    struct ds_target_config c;
    EXPECT_OK(ds_target_config_load(TINY "/target", &c));
    EXPECT(ds_tokenizer_vocab_size(tok) <= c.vocab_size);
    EXPECT_EQ_INT(ds_tokenizer_source(tok), DS_TOK_SOURCE_HF_JSON);
    int32_t ids[N_HARMONY];
    for (size_t i = 0; i < N_HARMONY; i++) {
        EXPECT_OK(ds_tokenizer_special_id(tok, harmony_names[i], &ids[i]));
        EXPECT(ds_tokenizer_is_special(tok, ids[i]));
        for (size_t j = 0; j < i; j++) EXPECT(ids[i] != ids[j]);
    }
    // The config's eos is <|return|> and its pad <|endoftext|>, as in gpt-oss.
    int32_t ret = -1, eot = -1;
    EXPECT_OK(ds_tokenizer_special_id(tok, "<|return|>", &ret));
    EXPECT_OK(ds_tokenizer_special_id(tok, "<|endoftext|>", &eot));
    EXPECT(c.num_eos_token_ids >= 1 && c.eos_token_ids[0] == ret);
    EXPECT_EQ_INT(c.pad_token_id, eot);
    ds_tokenizer_release(tok);
}

// decode(encode(text)) == text, and no special token comes out of text.
static int round_trips(const ds_tokenizer_t *tok, const char *text) {
    struct ds_token_vec v = {0};
    struct ds_byte_vec b = {0};
    int ok = ds_tokenizer_encode(tok, NULL, text, strlen(text), &v) == DS_OK &&
             ds_tokenizer_decode(tok, v.ids, v.n, &b) == DS_OK && b.n == strlen(text) &&
             !memcmp(b.data, text, b.n);
    for (size_t i = 0; ok && i < v.n; i++) ok = !ds_tokenizer_is_special(tok, v.ids[i]);
    ds_token_vec_free(&v);
    ds_byte_vec_free(&b);
    return ok;
}

static void tokenizer_round_trips_the_samples(void) {
    ds_tokenizer_t *tok = NULL;
    EXPECT_OK(ds_tokenizer_load(TINY "/target", &tok));
    if (!tok) return;
    FILE *f = fopen(TINY "/sample_conversations.jsonl", "r");
    EXPECT(f != NULL);
    int convs = 0, texts = 0;
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *rec = json_loads(line, 0, &err);
        if (!rec) {
            DS_FAILF("sample_conversations.jsonl line %d: %s", convs + 1, err.text);
            break;
        }
        convs++;
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(rec, "conversations"), i, m) {
            const char *v = json_string_value(json_object_get(m, "value"));
            EXPECT(v != NULL);
            if (v && !round_trips(tok, v)) DS_FAILF("sample %d: \"%s\" does not round-trip",
                                                    convs, v);
            texts++;
        }
        json_decref(rec);
    }
    if (f) fclose(f);
    EXPECT(convs >= 24); // "a few dozen" held-out conversations
    EXPECT(texts >= 2 * convs);
    // Text outside the corpus: bytes it never saw, and special-token names as plain text.
    EXPECT(round_trips(tok, "Zürich, 東京 and <|end|> stay text: \t\r\n 12345!"));
    ds_tokenizer_release(tok);
}

static void renderer_builds_the_default_prompt(void) {
    ds_tokenizer_t *tok = NULL;
    ds_harmony_t *h = NULL;
    EXPECT_OK(ds_tokenizer_load(TINY "/target", &tok));
    if (!tok) return;
    EXPECT_OK(ds_harmony_create(tok, &h));
    if (h) {
        struct ds_chat_message msg = {DS_ROLE_USER, "What is 2 + 2?", 14};
        struct ds_token_vec v = {0};
        struct ds_byte_vec b = {0};
        EXPECT_OK(ds_harmony_render_prompt(h, NULL, &msg, 1, &v));
        EXPECT_OK(ds_tokenizer_decode(tok, v.ids, v.n, &b));
        const char *want =
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
            "OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: "
            "analysis, commentary, final. Channel must be included for every message.<|end|>"
            "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant";
        EXPECT(b.data && !strcmp(b.data, want));
        // The tiny BPE learned the system message: far fewer tokens than its 248 bytes.
        EXPECT(v.n < 80);
        ds_token_vec_free(&v);
        ds_byte_vec_free(&b);
    }
    ds_harmony_release(h);
    ds_tokenizer_release(tok);
}

int main(void) {
    FILE *f = fopen(TINY "/target/config.json", "r");
    if (!f) DS_SKIP("%s/target is not there (scripts/tiny/make_tiny.py makes it)", TINY);
    fclose(f);
    DS_RUN(target_config_has_the_gpt_oss_structure);
    DS_RUN(draft_config_is_specforge_with_three_aux_layers);
    DS_RUN(inspect_finds_no_problem);
    DS_RUN(tokenizer_has_the_harmony_specials);
    DS_RUN(tokenizer_round_trips_the_samples);
    DS_RUN(renderer_builds_the_default_prompt);
    return ds_test_end();
}
