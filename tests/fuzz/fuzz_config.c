// libFuzzer target: the config.json parsers (gpt-oss target and EAGLE-3 draft) over arbitrary
// bytes in memory, and the aux-id plan of every parsed draft under every convention.
//
// Build and run: tests/fuzz/build.sh fuzz_config models/config.c, then
//   build-fuzz/fuzz_config -max_total_time=600 <work-corpus> tests/fuzz/corpus/config
// Besides crashes and sanitizer reports, it traps on a broken invariant of a successful parse.
#include "ds/config.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                                                                                 \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static void check_target(const struct ds_target_config *t) {
    REQUIRE(t->num_hidden_layers >= 1 && t->num_hidden_layers <= DS_CONFIG_MAX_LAYERS);
    REQUIRE(t->num_key_value_heads >= 1 && t->num_attention_heads % t->num_key_value_heads == 0);
    REQUIRE(t->num_experts_per_tok >= 1 && t->num_experts_per_tok <= t->num_local_experts);
    REQUIRE(t->num_eos_token_ids >= 0 && t->num_eos_token_ids <= DS_CONFIG_MAX_EOS);
    REQUIRE(!t->mxfp4 || (t->hidden_size % 32 == 0 && t->intermediate_size % 32 == 0));
    for (int64_t l = 0; l < t->num_hidden_layers; l++)
        REQUIRE(t->layer_types[l] == DS_ATTN_SLIDING || t->layer_types[l] == DS_ATTN_FULL);
}

static void check_draft(const struct ds_draft_config *d, int64_t layers) {
    REQUIRE(d->draft_vocab_size >= 1 && d->draft_vocab_size <= d->vocab_size);
    REQUIRE(d->num_aux_ids >= 0 && d->num_aux_ids <= DS_AUX_MAX);
    REQUIRE(d->use_aux_hidden_state || d->num_aux_ids == 0);
    // c == DS_AUX_CONVENTION_COUNT: the default convention the format implies.
    for (int c = 0; c <= DS_AUX_CONVENTION_COUNT; c++) {
        enum ds_aux_convention conv = (enum ds_aux_convention)c;
        const enum ds_aux_convention *want = c < DS_AUX_CONVENTION_COUNT ? &conv : NULL;
        struct ds_aux_plan p;
        if (ds_aux_plan(d, layers, want, "fuzz/config.json", &p) != DS_OK) {
            REQUIRE(p.n == 0);
            continue;
        }
        for (int i = 0; i < p.n; i++) {
            REQUIRE(p.boundaries[i] >= 0 && p.boundaries[i] <= layers);
            REQUIRE(i == 0 || p.boundaries[i] > p.boundaries[i - 1]);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct ds_target_config t; // large (per-layer table): keep it off the stack
    struct ds_draft_config d;
    const char *json = (const char *)data;
    int64_t layers = 36;
    if (ds_target_config_parse(json, size, "fuzz/config.json", &t) == DS_OK) {
        check_target(&t);
        layers = t.num_hidden_layers;
    }
    if (ds_draft_config_parse(json, size, "fuzz/config.json", &d) == DS_OK) {
        check_draft(&d, layers);
        check_draft(&d, 4);
    }
    ds_error_clear();
    return 0;
}
