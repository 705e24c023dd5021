// Harmony rendering and the channel tracker. Expected values: the 64 ids and the rendered text of
// the harmony library's test data (test-data/test_simple_convo.txt), and message layouts written
// out by hand from its grammar (docs/format.md).
#include "harness.h"

#include "ds/harmony.h"

#define DATA DS_SOURCE_DIR "/tests/data/"

static ds_tokenizer_t *o200k, *tiny;
static ds_harmony_t *ho, *ht;

static const char spec_default_text[] =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, "
    "final. Channel must be included for every message.<|end|><|start|>user<|message|>What is "
    "2 + 2?<|end|><|start|>assistant";

static const int32_t spec_default_ids[64] = {
    200006, 17360, 200008, 3575,  553,    17554,  162016, 11,    261,   4410,  6439,   2359,
    22203,  656,   7788,   17527, 558,    87447,  100594, 25,    220,   1323,  19,     12,
    3218,   279,   30377,  289,   25,     14093,  279,    2,     13888, 18403, 25,     8450,
    11,     49159, 11,     1721,  13,     21030,  2804,   413,   7360,  395,   1753,   3176,
    13,     200007, 200006, 1428,  200008, 4827,  382,    220,   17,    659,   220,    17,
    30,     200007, 200006, 173781};

static struct ds_chat_message msg(enum ds_chat_role role, const char *text) {
    return (struct ds_chat_message){role, text, text ? strlen(text) : 0};
}

static void expect_text(const ds_tokenizer_t *tok, const struct ds_token_vec *v, const char *want) {
    struct ds_byte_vec b = {0};
    EXPECT_OK(ds_tokenizer_decode(tok, v->ids, v->n, &b));
    EXPECT_EQ_STR(b.data, want);
    ds_byte_vec_free(&b);
}

static void default_prompt_is_the_spec_64_ids(void) {
    struct ds_chat_message m = msg(DS_ROLE_USER, "What is 2 + 2?");
    struct ds_token_vec v = {0};
    EXPECT_OK(ds_harmony_render_prompt(ho, NULL, &m, 1, &v));
    EXPECT_EQ_INT(v.n, 64);
    for (size_t i = 0; i < 64 && i < v.n; i++)
        if (v.ids[i] != spec_default_ids[i]) {
            DS_FAILF("id %zu: %d, expected %d", i, v.ids[i], spec_default_ids[i]);
            break;
        }
    expect_text(o200k, &v, spec_default_text);
    ds_token_vec_free(&v);
}

// Date, effort, developer instructions, a system message in the list, an earlier reply.
static void full_conversation_layout(void) {
    struct ds_harmony_system sys;
    ds_harmony_system_default(&sys);
    sys.current_date = "2025-08-05";
    sys.reasoning = DS_REASONING_HIGH;
    sys.developer_instructions = "Answer in French.";
    struct ds_chat_message m[] = {
        msg(DS_ROLE_SYSTEM, "Be brief."),
        msg(DS_ROLE_USER, "Hi"),
        msg(DS_ROLE_ASSISTANT, "Bonjour"),
        msg(DS_ROLE_USER, "<|end|> is text"),
    };
    struct ds_token_vec v = {0};
    EXPECT_OK(ds_harmony_render_prompt(ho, &sys, m, 4, &v));
    expect_text(o200k, &v,
                "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
                "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\n"
                "Reasoning: high\n\n"
                "# Valid channels: analysis, commentary, final. Channel must be included for every "
                "message.<|end|>"
                "<|start|>developer<|message|># Instructions\n\nAnswer in French.<|end|>"
                "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
                "<|start|>user<|message|>Hi<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Bonjour<|end|>"
                "<|start|>user<|message|><|end|> is text<|end|>"
                "<|start|>assistant");
    // Six messages and the completion header: 7 <|start|> and 6 <|end|> tokens; the "<|end|>"
    // in the user's text is not one.
    int starts = 0, ends = 0;
    for (size_t i = 0; i < v.n; i++) {
        starts += v.ids[i] == 200006;
        ends += v.ids[i] == 200007;
    }
    EXPECT_EQ_INT(starts, 7);
    EXPECT_EQ_INT(ends, 6);
    // The assistant header is <|start|> assistant <|channel|> final <|message|> (ids of
    // harmony's test data).
    int found = 0;
    for (size_t i = 0; i + 4 < v.n; i++)
        found |= v.ids[i] == 200006 && v.ids[i + 1] == 173781 && v.ids[i + 2] == 200005 &&
                 v.ids[i + 3] == 17196 && v.ids[i + 4] == 200008;
    EXPECT(found);
    ds_token_vec_free(&v);
}

// The tiny tokenizer has other special ids (300..307) and no merged "system": the same text.
static void small_tokenizer_renders_by_name(void) {
    struct ds_chat_message m = msg(DS_ROLE_USER, "What is 2 + 2?");
    struct ds_token_vec v = {0};
    EXPECT_OK(ds_harmony_render_prompt(ht, NULL, &m, 1, &v));
    expect_text(tiny, &v, spec_default_text);
    EXPECT_EQ_INT(v.ids[0], 300);                          // <|start|>
    EXPECT_EQ_INT(v.ids[1], 's');                          // "system", byte by byte
    EXPECT_EQ_INT(v.ids[7], 302);                          // <|message|>
    EXPECT_EQ_INT(v.ids[v.n - 10], 300);                   // <|start|> before "assistant"
    EXPECT_EQ_INT(v.ids[v.n - 11], 301);                   // <|end|>
    const struct ds_harmony_ids *ids = ds_harmony_ids(ht);
    EXPECT_EQ_INT(ids->channel, 303);
    EXPECT_EQ_INT(ids->ret, 304);
    EXPECT_EQ_INT(ids->endoftext, 307);
    ds_token_vec_free(&v);
}

static void bad_requests(void) {
    struct ds_token_vec v = {0};
    struct ds_chat_message m[] = {msg(DS_ROLE_USER, "a"), msg(DS_ROLE_ASSISTANT, NULL),
                                  msg(DS_ROLE_USER, "b")};
    EXPECT_STATUS(ds_harmony_render_prompt(ho, NULL, m, 3, &v), DS_ERR_ARG);
    EXPECT_ERROR_HAS("message 1 (assistant) has no text");
    EXPECT_EQ_INT(v.n, 0);
    struct ds_harmony_system sys;
    ds_harmony_system_default(&sys);
    sys.current_date = "Aug 5";
    EXPECT_STATUS(ds_harmony_render_prompt(ho, &sys, m, 1, &v), DS_ERR_ARG);
    EXPECT_ERROR_HAS("Aug 5");
    struct ds_chat_message bad_utf8 = {DS_ROLE_USER, "\xFF", 1};
    EXPECT_STATUS(ds_harmony_render_prompt(ho, NULL, &bad_utf8, 1, &v), DS_ERR_FORMAT);
    EXPECT_EQ_INT(v.n, 0);
    enum ds_reasoning r;
    EXPECT_OK(ds_reasoning_parse("low", &r));
    EXPECT_EQ_INT(r, DS_REASONING_LOW);
    EXPECT_STATUS(ds_reasoning_parse("max", &r), DS_ERR_ARG);
    EXPECT_ERROR_HAS("max");
    ds_token_vec_free(&v);
}

// A date must be a day of the calendar, not only YYYY-MM-DD: 2026-02-30 went into the prompt.
static void dates_are_calendar_days(void) {
    static const char *const good[] = {"2024-02-29", "2000-02-29", "2026-01-31", "2026-12-31",
                                       "2026-04-30", "0001-01-01"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (ds_harmony_date_check("--date", good[i]) != DS_OK)
            DS_FAILF("%s refused: %s", good[i], ds_error_last());
    static const char *const bad[][2] = {
        {"2026-02-30", "--date \"2026-02-30\" is not a date: 2026-02 has days 01..28"},
        {"2025-02-29", "--date \"2025-02-29\" is not a date: 2025-02 has days 01..28"},
        {"1900-02-29", "--date \"1900-02-29\" is not a date: 1900-02 has days 01..28"},
        {"2026-04-31", "--date \"2026-04-31\" is not a date: 2026-04 has days 01..30"},
        {"2026-01-00", "--date \"2026-01-00\" is not a date: 2026-01 has days 01..31"},
        {"2026-13-01", "--date \"2026-13-01\" is not a date: month 13 is not 01..12"},
        {"2026-00-10", "--date \"2026-00-10\" is not a date: month 00 is not 01..12"},
        {"2026-2-3", "--date \"2026-2-3\" is not YYYY-MM-DD"},
        {"2026-02-3x", "--date \"2026-02-3x\" is not YYYY-MM-DD"},
        {"", "--date \"\" is not YYYY-MM-DD"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_STATUS(ds_harmony_date_check("--date", bad[i][0]), DS_ERR_ARG);
        EXPECT_EQ_STR(ds_error_last(), bad[i][1]);
    }
    // Rendering checks it too, naming the field.
    struct ds_harmony_system sys;
    ds_harmony_system_default(&sys);
    sys.current_date = "2026-02-30";
    EXPECT_STATUS(ds_harmony_system_check(&sys), DS_ERR_ARG);
    EXPECT_ERROR_HAS("harmony: current date \"2026-02-30\" is not a date");
    sys.current_date = "2024-02-29";
    EXPECT_OK(ds_harmony_system_check(&sys));
}

static void tokenizer_without_harmony_tokens_is_refused(void) {
    ds_tokenizer_t *plain = NULL;
    EXPECT_OK(ds_tokenizer_load_tiktoken(DATA "o200k_base.tiktoken", DS_TOK_SPECIALS_NONE, &plain));
    ds_harmony_t *h = (ds_harmony_t *)1;
    EXPECT_STATUS(ds_harmony_create(plain, &h), DS_ERR_MISMATCH);
    EXPECT_ERROR_HAS("<|start|>");
    EXPECT(h == NULL);
    ds_tokenizer_release(plain);
}

// ---- channel tracker ----

struct labelled {
    struct ds_token_vec ids;
    enum ds_channel want[256];
    enum ds_stop stop[256];
};

// Appends a special token with its expected label and stop.
static void add_special(struct labelled *l, int32_t id, enum ds_channel want, enum ds_stop stop) {
    l->want[l->ids.n] = want;
    l->stop[l->ids.n] = stop;
    ds_token_vec_push(&l->ids, id);
}

// Appends encoded text whose tokens all carry `want`.
static void add_text(struct labelled *l, ds_harmony_t *h, const ds_tokenizer_t *tok, const char *s,
                     enum ds_channel want) {
    size_t n0 = l->ids.n;
    EXPECT_OK(ds_tokenizer_encode(tok, NULL, s, strlen(s), &l->ids));
    for (size_t i = n0; i < l->ids.n; i++) {
        l->want[i] = want;
        l->stop[i] = DS_STOP_NONE;
    }
}

static void run_tracker(ds_harmony_t *h, struct labelled *l, enum ds_tracker_start start) {
    struct ds_channel_tracker t;
    ds_channel_tracker_init(&t, h, start);
    for (size_t i = 0; i < l->ids.n; i++) {
        enum ds_stop stop;
        enum ds_channel c = ds_channel_tracker_feed(&t, l->ids.ids[i], &stop);
        if (c != l->want[i] || stop != l->stop[i])
            DS_FAILF("token %zu (id %d): %s stop %d, wanted %s stop %d", i, l->ids.ids[i],
                     ds_channel_name(c), stop, ds_channel_name(l->want[i]), l->stop[i]);
    }
    ds_token_vec_free(&l->ids);
}

// <|channel|>analysis<|message|>...<|end|>
// <|start|>assistant<|channel|>final<|message|>...<|return|>
static void typical_answer(ds_harmony_t *h, const ds_tokenizer_t *tok) {
    const struct ds_harmony_ids *id = ds_harmony_ids(h);
    struct labelled l = {0};
    add_special(&l, id->channel, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, h, tok, "analysis", DS_CHANNEL_HEADER);
    add_special(&l, id->message, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, h, tok, "User asks 2+2. Easy.", DS_CHANNEL_ANALYSIS);
    add_special(&l, id->end, DS_CHANNEL_HEADER, DS_STOP_NONE); // <|end|> is not a stop
    add_special(&l, id->start, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, h, tok, "assistant", DS_CHANNEL_HEADER);
    add_special(&l, id->channel, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, h, tok, "final", DS_CHANNEL_HEADER);
    add_special(&l, id->message, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, h, tok, "2 + 2 = 4.", DS_CHANNEL_FINAL);
    add_special(&l, id->ret, DS_CHANNEL_HEADER, DS_STOP_RETURN);
    run_tracker(h, &l, DS_TRACKER_AFTER_PROMPT);
}

static void tracker_labels_analysis_then_final(void) {
    typical_answer(ho, o200k);
    typical_answer(ht, tiny); // channel names arrive one byte per token here
}

// A tool call: recipient after the channel, a constrained content type, <|call|> stops.
static void tracker_tool_call(void) {
    const struct ds_harmony_ids *id = ds_harmony_ids(ho);
    struct labelled l = {0};
    add_special(&l, id->channel, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "commentary to=functions.get_weather ", DS_CHANNEL_HEADER);
    add_special(&l, id->constrain, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "json", DS_CHANNEL_HEADER);
    add_special(&l, id->message, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "{\"location\":\"Tokyo\"}", DS_CHANNEL_COMMENTARY);
    add_special(&l, id->call, DS_CHANNEL_HEADER, DS_STOP_CALL);
    run_tracker(ho, &l, DS_TRACKER_AFTER_PROMPT);

    // Recipient before the channel.
    add_text(&l, ho, o200k, " to=functions.f", DS_CHANNEL_HEADER);
    add_special(&l, id->channel, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "commentary json", DS_CHANNEL_HEADER);
    add_special(&l, id->message, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "{}", DS_CHANNEL_COMMENTARY);
    add_special(&l, id->call, DS_CHANNEL_HEADER, DS_STOP_CALL);
    run_tracker(ho, &l, DS_TRACKER_AFTER_PROMPT);
}

// No channel, an unknown channel, text between messages, <|endoftext|>.
static void tracker_other_cases(void) {
    const struct ds_harmony_ids *id = ds_harmony_ids(ho);
    struct labelled l = {0};
    add_special(&l, id->message, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "no channel", DS_CHANNEL_OTHER);
    add_special(&l, id->end, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "stray", DS_CHANNEL_OTHER);
    add_special(&l, id->start, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "assistant", DS_CHANNEL_HEADER);
    add_special(&l, id->channel, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "finality", DS_CHANNEL_HEADER);
    add_special(&l, id->message, DS_CHANNEL_HEADER, DS_STOP_NONE);
    add_text(&l, ho, o200k, "x", DS_CHANNEL_OTHER);
    add_special(&l, id->endoftext, DS_CHANNEL_OTHER, DS_STOP_ENDOFTEXT);
    run_tracker(ho, &l, DS_TRACKER_AFTER_PROMPT);

    add_text(&l, ho, o200k, "outside", DS_CHANNEL_OTHER);
    add_special(&l, id->start, DS_CHANNEL_HEADER, DS_STOP_NONE);
    run_tracker(ho, &l, DS_TRACKER_OUTSIDE);
}

// A reply cut inside a character (max-new-tokens) becomes a later turn's assistant message. Its
// raw bytes are not UTF-8 and the render refuses them; as text (ds_tokenizer_decode_text, what
// replay.c feeds back) the cut character is one U+FFFD and the turn renders. The expected text is
// the raw bytes' valid prefix plus U+FFFD (the dangling tail is one maximal subpart).
static void cut_reply_renders_as_text(void) {
    const char full[] = "Answer: \xF0\x9D\x94\x98"; // U+1D518, four bytes
    struct ds_token_vec ids = {0}, out = {0};
    struct ds_byte_vec raw = {0}, text = {0}, want = {0};
    EXPECT_OK(ds_tokenizer_encode(o200k, NULL, full, strlen(full), &ids));
    EXPECT(ids.n >= 2);
    if (ids.n < 2) return;
    EXPECT_OK(ds_tokenizer_decode(o200k, ids.ids, ids.n - 1, &raw));
    const size_t ok = ds_utf8_valid_prefix(raw.data, raw.n);
    EXPECT(ok < raw.n); // the last id held the end of the character only
    EXPECT_OK(ds_byte_vec_append(&want, raw.data, ok));
    EXPECT_OK(ds_byte_vec_append(&want, "\xEF\xBF\xBD", 3));
    EXPECT_OK(ds_tokenizer_decode_text(o200k, ids.ids, ids.n - 1, &text));
    EXPECT_EQ_STR(text.data, want.data);
    struct ds_chat_message m[3] = {msg(DS_ROLE_USER, "q1"), msg(DS_ROLE_ASSISTANT, raw.data),
                                   msg(DS_ROLE_USER, "q2")};
    m[1].len = raw.n;
    EXPECT(ds_harmony_render_prompt(ho, NULL, m, 3, &out) != DS_OK);
    out.n = 0;
    m[1] = msg(DS_ROLE_ASSISTANT, text.data);
    EXPECT_OK(ds_harmony_render_prompt(ho, NULL, m, 3, &out));
    // An id outside the vocabulary is refused as by ds_tokenizer_decode, *out as it was.
    const int32_t bad[2] = {ids.ids[0], 1 << 30};
    const size_t n0 = text.n;
    EXPECT(ds_tokenizer_decode_text(o200k, bad, 2, &text) == DS_ERR_RANGE);
    EXPECT_EQ_INT(text.n, n0);
    ds_token_vec_free(&ids);
    ds_token_vec_free(&out);
    ds_byte_vec_free(&raw);
    ds_byte_vec_free(&text);
    ds_byte_vec_free(&want);
}

int main(void) {
    if (ds_tokenizer_load_tiktoken(DATA "o200k_base.tiktoken", DS_TOK_SPECIALS_O200K_HARMONY,
                                   &o200k) ||
        ds_tokenizer_load_hf(DATA "tiny_tokenizer.json", &tiny) || ds_harmony_create(o200k, &ho) ||
        ds_harmony_create(tiny, &ht)) {
        fprintf(stderr, "setup: %s\n", ds_error_last());
        return 1;
    }
    DS_RUN(default_prompt_is_the_spec_64_ids);
    DS_RUN(full_conversation_layout);
    DS_RUN(small_tokenizer_renders_by_name);
    DS_RUN(bad_requests);
    DS_RUN(dates_are_calendar_days);
    DS_RUN(tokenizer_without_harmony_tokens_is_refused);
    DS_RUN(tracker_labels_analysis_then_final);
    DS_RUN(tracker_tool_call);
    DS_RUN(tracker_other_cases);
    DS_RUN(cut_reply_renders_as_text);
    ds_harmony_release(ho);
    ds_harmony_release(ht);
    ds_tokenizer_release(o200k);
    ds_tokenizer_release(tiny);
    return ds_test_end();
}
