// The BPE tokenizer: o200k_harmony exactness against tiktoken (ids committed by
// tests/ref/make_tokenizer_golden.py) and against the ids of harmony's test data, the HF
// tokenizer.json loader on a hand-made vocabulary, decoding, UTF-8 streaming and bad input.
#include "harness.h"

#include "ds/tokenizer.h"

#include <jansson.h>
#include <stdint.h>
#include <unistd.h>

#define DATA DS_SOURCE_DIR "/tests/data/"

static ds_tokenizer_t *o200k;

static void encode_str(const ds_tokenizer_t *tok, const char *s, struct ds_token_vec *v) {
    v->n = 0;
    EXPECT_OK(ds_tokenizer_encode(tok, NULL, s, strlen(s), v));
}

// Expects `s` to encode to exactly want[0..n).
static void expect_ids(const ds_tokenizer_t *tok, const char *s, const int32_t *want, size_t n) {
    struct ds_token_vec v = {0};
    encode_str(tok, s, &v);
    int same = v.n == n;
    for (size_t i = 0; same && i < n; i++) same = v.ids[i] == want[i];
    if (!same) {
        DS_FAILF("\"%s\": %zu ids, wanted %zu", s, v.n, n);
        for (size_t i = 0; i < v.n && i < 16; i++) fprintf(stderr, " %d", v.ids[i]);
        fputc('\n', stderr);
    }
    ds_token_vec_free(&v);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / 4

static void o200k_loads_with_harmony_specials(void) {
    EXPECT_EQ_INT(ds_tokenizer_vocab_size(o200k), 201088);
    EXPECT_EQ_INT(ds_tokenizer_source(o200k), DS_TOK_SOURCE_TIKTOKEN);
    // openai/harmony's o200k_harmony table (public_encodings.rs).
    static const struct {
        const char *name;
        int32_t id;
    } table[] = {
        {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999},    {"<|reserved_200000|>", 200000},
        {"<|return|>", 200002},      {"<|constrain|>", 200003},    {"<|reserved_200004|>", 200004},
        {"<|channel|>", 200005},     {"<|start|>", 200006},        {"<|end|>", 200007},
        {"<|message|>", 200008},     {"<|call|>", 200012},         {"<|reserved_200013|>", 200013},
        {"<|reserved_201087|>", 201087},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        int32_t id;
        EXPECT_OK(ds_tokenizer_special_id(o200k, table[i].name, &id));
        EXPECT_EQ_INT(id, table[i].id);
        EXPECT(ds_tokenizer_is_special(o200k, table[i].id));
    }
    int32_t id;
    EXPECT_STATUS(ds_tokenizer_special_id(o200k, "<|refusal|>", &id), DS_ERR_RANGE);
    EXPECT_EQ_INT(id, -1);
    EXPECT_ERROR_HAS("<|refusal|>");
    EXPECT(!ds_tokenizer_is_special(o200k, 17360));
    size_t len;
    EXPECT(ds_tokenizer_token_bytes(o200k, 201088, &len) == NULL);
    EXPECT_EQ_INT(len, 0);
}

// Word ids that harmony's test data shows (test_simple_convo and the tool-call examples).
static void spec_word_ids(void) {
    expect_ids(o200k, "system", IDS(17360));
    expect_ids(o200k, "user", IDS(1428));
    expect_ids(o200k, "assistant", IDS(173781));
    expect_ids(o200k, "developer", IDS(77944));
    expect_ids(o200k, "analysis", IDS(35644));
    expect_ids(o200k, "final", IDS(17196));
    expect_ids(o200k, "commentary", IDS(12606, 815));
    expect_ids(o200k, "functions", IDS(44580));
    expect_ids(o200k, " to=functions.get_weather", IDS(316, 28, 44580, 775, 170154));
    expect_ids(o200k, " json", IDS(5701));
    expect_ids(o200k, "What is 2 + 2?", IDS(4827, 382, 220, 17, 659, 220, 17, 30));
}

// Special tokens are never produced from text: "<|end|>" is ordinary characters.
static void special_text_is_literal(void) {
    const char *s = "<|end|><|start|>assistant<|message|>";
    struct ds_token_vec v = {0};
    encode_str(o200k, s, &v);
    for (size_t i = 0; i < v.n; i++) EXPECT(!ds_tokenizer_is_special(o200k, v.ids[i]));
    struct ds_byte_vec b = {0};
    EXPECT_OK(ds_tokenizer_decode(o200k, v.ids, v.n, &b));
    EXPECT_EQ_STR(b.data, s);
    ds_byte_vec_free(&b);
    ds_token_vec_free(&v);
}

static char *read_text(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (p) p[n] = '\0';
    fclose(f);
    *len_out = (size_t)n;
    return p;
}

// Compares encode(text) with the reference ids and checks decode(encode(text)) == text.
// Returns 1 on a match.
static int check_text(const ds_tokenizer_t *tok, const char *text, size_t len, json_t *want,
                      const char *what) {
    struct ds_token_vec v = {0};
    struct ds_byte_vec b = {0};
    int ok = ds_tokenizer_encode(tok, NULL, text, len, &v) == DS_OK;
    ok = ok && v.n == json_array_size(want);
    size_t first_diff = 0;
    for (size_t i = 0; ok && i < v.n; i++) {
        ok = v.ids[i] == (int32_t)json_integer_value(json_array_get(want, i));
        first_diff = i;
    }
    if (!ok) DS_FAILF("%s: ids differ from tiktoken (got %zu ids, want %zu, at %zu)", what, v.n,
                      json_array_size(want), first_diff);
    if (ok && (ds_tokenizer_decode(tok, v.ids, v.n, &b) || b.n != len || memcmp(b.data, text, len))) {
        DS_FAILF("%s: decode(encode(x)) != x", what);
        ok = 0;
    }
    ds_byte_vec_free(&b);
    ds_token_vec_free(&v);
    return ok;
}

// All 560 turns of the 480 Spec-Bench questions, id for id against tiktoken.
static void spec_bench_matches_tiktoken_on(const ds_tokenizer_t *tok) {
    size_t qlen, ilen;
    char *qs = read_text(DATA "spec_bench_questions.jsonl", &qlen);
    char *is = read_text(DATA "spec_bench_ids.jsonl", &ilen);
    EXPECT(qs && is);
    if (!qs || !is) goto cleanup;
    int questions = 0, turns = 0, matched = 0;
    char *qsave, *isave;
    for (char *ql = strtok_r(qs, "\n", &qsave), *il = strtok_r(is, "\n", &isave); ql && il;
         ql = strtok_r(NULL, "\n", &qsave), il = strtok_r(NULL, "\n", &isave)) {
        json_error_t e;
        json_t *q = json_loads(ql, 0, &e), *ids = json_loads(il, 0, &e);
        EXPECT(q && ids);
        if (!q || !ids) break;
        EXPECT_EQ_INT(json_integer_value(json_object_get(q, "question_id")),
                      json_integer_value(json_object_get(ids, "question_id")));
        json_t *qt = json_object_get(q, "turns"), *it = json_object_get(ids, "turns");
        EXPECT_EQ_INT(json_array_size(qt), json_array_size(it));
        for (size_t t = 0; t < json_array_size(qt); t++) {
            char what[64];
            snprintf(what, sizeof what, "question %lld turn %zu",
                     (long long)json_integer_value(json_object_get(q, "question_id")), t + 1);
            json_t *text = json_array_get(qt, t);
            matched += check_text(tok, json_string_value(text), json_string_length(text),
                                  json_array_get(it, t), what);
            turns++;
        }
        questions++;
        json_decref(q);
        json_decref(ids);
    }
    EXPECT_EQ_INT(questions, 480);
    EXPECT_EQ_INT(turns, 560);
    EXPECT_EQ_INT(matched, 560);
cleanup:
    free(qs);
    free(is);
}

static void spec_bench_matches_tiktoken(void) {
    spec_bench_matches_tiktoken_on(o200k);
}

// Pre-tokenizer edge cases (kinds of white space, CR/LF runs, marks, scripts, long pieces).
static void edge_cases_match_tiktoken_on(const ds_tokenizer_t *tok) {
    size_t len;
    char *all = read_text(DATA "tokenizer_edge_ids.jsonl", &len);
    EXPECT(all != NULL);
    if (!all) return;
    int n = 0;
    char *save;
    for (char *l = strtok_r(all, "\n", &save); l; l = strtok_r(NULL, "\n", &save), n++) {
        json_error_t e;
        json_t *o = json_loads(l, 0, &e);
        json_t *text = json_object_get(o, "text");
        char what[32];
        snprintf(what, sizeof what, "edge case %d", n + 1);
        check_text(tok, json_string_value(text), json_string_length(text),
                   json_object_get(o, "ids"), what);
        json_decref(o);
    }
    EXPECT_EQ_INT(n, 32);
    free(all);
}

static void edge_cases_match_tiktoken(void) {
    edge_cases_match_tiktoken_on(o200k);
}

// The interpreter fallback gives the same pieces as the JIT.
static void interpreter_fallback_matches(void) {
    setenv("DS_TOKENIZER_NO_JIT", "1", 1);
    ds_tokenizer_t *tok = NULL;
    EXPECT_OK(ds_tokenizer_load_tiktoken(DATA "o200k_base.tiktoken", DS_TOK_SPECIALS_O200K_HARMONY,
                                         &tok));
    unsetenv("DS_TOKENIZER_NO_JIT");
    if (!tok) return;
    EXPECT_EQ_INT(ds_tokenizer_uses_jit(tok), 0);
    edge_cases_match_tiktoken_on(tok);
    spec_bench_matches_tiktoken_on(tok);
    ds_tokenizer_release(tok);
}

// Independent workspaces give the same ids (the thread-safe way to encode).
static void own_workspace_gives_same_ids(void) {
    ds_tok_workspace_t *ws = NULL;
    EXPECT_OK(ds_tok_workspace_create(o200k, &ws));
    struct ds_token_vec v = {0};
    const char *s = "What is 2 + 2?";
    EXPECT_OK(ds_tokenizer_encode(o200k, ws, s, strlen(s), &v));
    EXPECT_EQ_INT(v.n, 8);
    EXPECT_EQ_INT(v.ids[0], 4827);
    ds_token_vec_free(&v);
    ds_tok_workspace_release(ws);
}

static void invalid_utf8_is_rejected(void) {
    struct ds_token_vec v = {0};
    const char bad[] = "abc\xC3(def";
    EXPECT_STATUS(ds_tokenizer_encode(o200k, NULL, bad, strlen(bad), &v), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("invalid UTF-8 at byte offset 3");
    EXPECT_EQ_INT(v.n, 0);
    const char surrogate[] = "x\xED\xA0\x80";
    EXPECT_STATUS(ds_tokenizer_encode(o200k, NULL, surrogate, 4, &v), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("offset 1");
    ds_token_vec_free(&v);
}

static void decode_checks_ids(void) {
    struct ds_byte_vec b = {0};
    int32_t ids[] = {200006, 17360, 200008};
    EXPECT_OK(ds_tokenizer_decode(o200k, ids, 3, &b));
    EXPECT_EQ_STR(b.data, "<|start|>system<|message|>");
    int32_t bad[] = {17360, 201088};
    EXPECT_STATUS(ds_tokenizer_decode(o200k, bad, 2, &b), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("id 201088");
    EXPECT_EQ_STR(b.data, "<|start|>system<|message|>");
    int32_t neg[] = {-1};
    EXPECT_STATUS(ds_tokenizer_decode(o200k, neg, 1, &b), DS_ERR_RANGE);
    ds_byte_vec_free(&b);
}

// A character split across tokens is held until it completes; bad bytes become U+FFFD.
static void utf8_stream_handles_partial_characters(void) {
    struct ds_utf8_stream s = {0};
    struct ds_byte_vec out = {0};
    // U+1F600 = F0 9F 98 80, fed as "a\xF0\x9F" then "\x98\x80b".
    EXPECT_OK(ds_utf8_stream_feed(&s, "a\xF0\x9F", 3, &out));
    EXPECT_EQ_STR(out.data, "a");
    EXPECT_EQ_INT(s.n_pending, 2);
    EXPECT_OK(ds_utf8_stream_feed(&s, "\x98", 1, &out));
    EXPECT_EQ_STR(out.data, "a");
    EXPECT_OK(ds_utf8_stream_feed(&s, "\x80" "b", 2, &out));
    EXPECT_EQ_STR(out.data, "a\xF0\x9F\x98\x80" "b");
    // A lone continuation byte and a lead byte followed by ASCII are each one U+FFFD.
    out.n = 0;
    EXPECT_OK(ds_utf8_stream_feed(&s, "\x80x\xE2", 3, &out));
    EXPECT_OK(ds_utf8_stream_feed(&s, "y", 1, &out));
    EXPECT_EQ_STR(out.data, "\xEF\xBF\xBDx\xEF\xBF\xBDy");
    // An unfinished character at the end is flushed as U+FFFD.
    out.n = 0;
    EXPECT_OK(ds_utf8_stream_feed(&s, "\xE4\xB8", 2, &out));
    EXPECT_EQ_INT(out.n, 0);
    EXPECT_OK(ds_utf8_stream_finish(&s, &out));
    EXPECT_EQ_STR(out.data, "\xEF\xBF\xBD");
    // A character cut short by a byte that cannot continue it is one U+FFFD, as in Python's
    // b.decode("utf-8", "replace") (tiktoken's decode); expected strings from Python.
    static const struct {
        const char *in, *want;
    } cut[] = {
        {"\xE4\xB8" "A", "\xEF\xBF\xBD" "A"},
        {"\xF0\x9F\x98" "A", "\xEF\xBF\xBD" "A"},
        {"a\xF0\x9F" "b\x98\x80", "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF0\x9F\xE4\xB8\xAD", "\xEF\xBF\xBD\xE4\xB8\xAD"},
    };
    for (size_t c = 0; c < sizeof cut / sizeof cut[0]; c++) {
        for (size_t split = 0; split <= strlen(cut[c].in); split++) { // also across two feeds
            out.n = 0;
            EXPECT_OK(ds_utf8_stream_feed(&s, cut[c].in, split, &out));
            EXPECT_OK(ds_utf8_stream_feed(&s, cut[c].in + split, strlen(cut[c].in) - split,
                                          &out));
            EXPECT_OK(ds_utf8_stream_finish(&s, &out));
            EXPECT_EQ_STR(out.data, cut[c].want);
        }
    }
    ds_byte_vec_free(&out);
    EXPECT_EQ_INT(ds_utf8_valid_prefix("ok\xC0\x80", 4), 2); // overlong encoding
    EXPECT_EQ_INT(ds_utf8_valid_prefix("\xF4\x90\x80\x80", 4), 0); // above U+10FFFF
}

// Decoding token by token through the stream gives the text back even where tokens split
// characters (byte-level tokens of a CJK string).
static void token_by_token_decode_rebuilds_text(void) {
    const char *s = "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80!";
    struct ds_token_vec v = {0};
    encode_str(o200k, s, &v);
    struct ds_utf8_stream st = {0};
    struct ds_byte_vec out = {0};
    for (size_t i = 0; i < v.n; i++) {
        size_t len;
        const char *b = ds_tokenizer_token_bytes(o200k, v.ids[i], &len);
        EXPECT_OK(ds_utf8_stream_feed(&st, b, len, &out));
    }
    EXPECT_OK(ds_utf8_stream_finish(&st, &out));
    EXPECT_EQ_STR(out.data, s);
    ds_byte_vec_free(&out);
    ds_token_vec_free(&v);
}

// Long runs: a 100k-space run and a 20k-letter piece must neither fail nor lose bytes.
static void long_pieces_round_trip(void) {
    size_t n = 120000;
    char *s = malloc(n + 1);
    memset(s, ' ', 100000);
    memset(s + 100000, 'q', 20000);
    s[n] = '\0';
    struct ds_token_vec v = {0};
    EXPECT_OK(ds_tokenizer_encode(o200k, NULL, s, n, &v));
    struct ds_byte_vec b = {0};
    EXPECT_OK(ds_tokenizer_decode(o200k, v.ids, v.n, &b));
    EXPECT(b.n == n && !memcmp(b.data, s, n));
    ds_byte_vec_free(&b);
    ds_token_vec_free(&v);
    free(s);
}

static void write_file(const char *path, const char *content) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(content, f);
        fclose(f);
    }
}

static void bad_tiktoken_files(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/tok_bad_%d.tiktoken", DS_BINARY_DIR, (int)getpid());
    ds_tokenizer_t *tok = (ds_tokenizer_t *)1;
    write_file(path, "YQ== 0\nYg== x\n");
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("line 2");
    EXPECT(tok == NULL);
    write_file(path, "YQ== 0\nY!== 1\n");
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("line 2: invalid base64");
    write_file(path, "YQ== 0\nYg== 0\n");
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("rank 0 appears twice");
    // Ranks without all 256 bytes cannot encode arbitrary text.
    write_file(path, "YQ== 0\nYg== 1\n");
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("single byte 0x00");
    write_file(path, "");
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("no ranks");
    // One rank past 2^30 once made the lookup table's size wrap to 0 (an endless loop).
    write_file(path, "QQ== 1073741824\n");
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("line 1: rank 1073741824 is too large");
    unlink(path);
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_IO);
    EXPECT_ERROR_HAS(path);
}

// ---- the hand-made tokenizer.json (tests/data/tiny_tokenizer.json) ----
// Vocab: the 256 byte-level characters (id = byte), then ll 256, el 257, he 258, hell 259,
// hello 260, Ġw 261, or 262, Ġwor 263, ld 264, Ġworld 265 (Ġ = the space byte).
// Merges in this order: "h e", "l l", "he ll", "hell o", "e l", "Ġ w", "o r", "Ġw or", "l d",
// "Ġwor ld". Specials 300..307: <|start|> <|end|> <|message|> <|channel|> <|return|> <|call|>
// <|constrain|> <|endoftext|>. Pre-tokenizer: Split on GPT-2's pattern, then ByteLevel.
static void check_tiny(const ds_tokenizer_t *tok) {
    EXPECT_EQ_INT(ds_tokenizer_vocab_size(tok), 308);
    EXPECT_EQ_INT(ds_tokenizer_source(tok), DS_TOK_SOURCE_HF_JSON);
    // "hello": h e -> he (rank 0), l l -> ll (1), he ll -> hell (2), hell o -> hello (3).
    expect_ids(tok, "hello", IDS(260));
    // " world": Ġ w (5), o r (6), Ġw or (7), l d (8), Ġwor ld (9).
    expect_ids(tok, "hello world", IDS(260, 265));
    // "hel": "h e" (rank 0) beats "e l" (rank 4) although el has the lower id: merge order
    // rules, not ids. -> he, l.
    expect_ids(tok, "hel", IDS(258, 'l'));
    // "ell": l l (1) before e l (4) -> e, ll.
    expect_ids(tok, "ell", IDS('e', 256));
    // "hellollo": he, ll (leftmost first), ll, hell, hello -> hello, ll, o.
    expect_ids(tok, "hellollo", IDS(260, 256, 'o'));
    // Bytes outside the merges stay single bytes; "é" is C3 A9.
    expect_ids(tok, "\xC3\xA9!", IDS(0xC3, 0xA9, '!'));
    expect_ids(tok, "<|end|>", IDS('<', '|', 'e', 'n', 'd', '|', '>'));
    int32_t id;
    EXPECT_OK(ds_tokenizer_special_id(tok, "<|end|>", &id));
    EXPECT_EQ_INT(id, 301);
    EXPECT_OK(ds_tokenizer_special_id(tok, "<|endoftext|>", &id));
    EXPECT_EQ_INT(id, 307);
    struct ds_byte_vec b = {0};
    int32_t ids[] = {300, 260, 265, 301};
    EXPECT_OK(ds_tokenizer_decode(tok, ids, 4, &b));
    EXPECT_EQ_STR(b.data, "<|start|>hello world<|end|>");
    ds_byte_vec_free(&b);
}

static void hf_json_string_merges(void) {
    ds_tokenizer_t *tok = NULL;
    EXPECT_OK(ds_tokenizer_load(DATA "tiny_tokenizer.json", &tok));
    if (tok) check_tiny(tok);
    ds_tokenizer_release(tok);
}

// Writes a variant of the tiny tokenizer after `edit` changes its JSON; returns the path.
static const char *tiny_variant(void (*edit)(json_t *root), char *path, size_t cap) {
    json_error_t e;
    json_t *root = json_load_file(DATA "tiny_tokenizer.json", 0, &e);
    edit(root);
    snprintf(path, cap, "%s/tok_tiny_%d.json", DS_BINARY_DIR, (int)getpid());
    json_dump_file(root, path, 0);
    json_decref(root);
    return path;
}

static void to_pairs(json_t *root) {
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const char *m = json_string_value(json_array_get(merges, i));
        const char *sp = strchr(m, ' ');
        json_t *pair = json_pack("[s#s]", m, (int)(sp - m), sp + 1);
        json_array_set_new(merges, i, pair);
    }
}

static void hf_json_pair_merges(void) {
    char path[256];
    ds_tokenizer_t *tok = NULL;
    EXPECT_OK(ds_tokenizer_load_hf(tiny_variant(to_pairs, path, sizeof path), &tok));
    if (tok) check_tiny(tok);
    ds_tokenizer_release(tok);
    unlink(path);
}

// An empty Split regex once failed with PCRE2's "pattern passed as NULL": now refused by name
// (no reference defines how it splits).
static void empty_split_regex(json_t *root) {
    json_t *seq = json_object_get(json_object_get(root, "pre_tokenizer"), "pretokenizers");
    json_object_set_new(json_object_get(json_array_get(seq, 0), "pattern"), "Regex",
                        json_string(""));
}

// A tokenizer.json that starts with a UTF-8 byte order mark is still JSON (it was once read as a
// tiktoken file: "line 1: expected <base64> <rank>").
static void hf_json_with_bom(void) {
    char path[256];
    FILE *in = fopen(DATA "tiny_tokenizer.json", "rb");
    snprintf(path, sizeof path, "%s/tok_bom_%d.json", DS_BINARY_DIR, (int)getpid());
    FILE *out = fopen(path, "wb");
    if (!in || !out) {
        DS_FAILF("cannot copy the tiny tokenizer to %s", path);
        if (in) fclose(in);
        if (out) fclose(out);
        return;
    }
    fputs("\xEF\xBB\xBF", out);
    for (int c; (c = fgetc(in)) != EOF;) fputc(c, out);
    fclose(in);
    fclose(out);
    ds_tokenizer_t *tok = NULL;
    EXPECT_OK(ds_tokenizer_load(path, &tok));
    if (tok) check_tiny(tok);
    ds_tokenizer_release(tok);
    unlink(path);
}

static void add_normalizer(json_t *root) {
    json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
}
static void bad_merge(json_t *root) {
    json_array_append_new(json_object_get(json_object_get(root, "model"), "merges"),
                          json_string("q z"));
}
static void wordpiece(json_t *root) {
    json_object_set_new(json_object_get(root, "model"), "type", json_string("WordPiece"));
}

// One stray huge id once sized every id table by it (gigabytes for a 300-token vocabulary).
static void sparse_added_id(json_t *root) {
    json_array_append_new(json_object_get(root, "added_tokens"),
                          json_pack("{s:i, s:s, s:b}", "id", 1000000, "content", "<|far|>",
                                    "special", 1));
}

static void hf_json_bad_input(void) {
    char path[256];
    ds_tokenizer_t *tok = NULL;
    EXPECT_STATUS(ds_tokenizer_load_hf(tiny_variant(add_normalizer, path, sizeof path), &tok),
                  DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("normalizer");
    EXPECT_STATUS(ds_tokenizer_load_hf(tiny_variant(bad_merge, path, sizeof path), &tok),
                  DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("merges[10] names a token that is not in the vocab");
    EXPECT_STATUS(ds_tokenizer_load_hf(tiny_variant(wordpiece, path, sizeof path), &tok),
                  DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("WordPiece");
    EXPECT_STATUS(ds_tokenizer_load_hf(tiny_variant(sparse_added_id, path, sizeof path), &tok),
                  DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("token id 1000000 is far beyond");
    EXPECT_ERROR_HAS(path);
    EXPECT_STATUS(ds_tokenizer_load_hf(tiny_variant(empty_split_regex, path, sizeof path), &tok),
                  DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("the pre-tokenizer's Split regex is empty");
    write_file(path, "{\"model\": {\"vocab\": {}\n, \"merges\": [}\n");
    EXPECT_STATUS(ds_tokenizer_load_hf(path, &tok), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("line 2");
    EXPECT_ERROR_HAS(path);
    EXPECT(tok == NULL);
    unlink(path);
}

// A tokenizer.json that is a directory once gave "'[' or '{' expected near end of file".
static void tokenizer_file_not_a_regular_file(void) {
    char dir[1024], sub[1024];
    ds_tokenizer_t *tok = NULL;
    EXPECT(ds_t_dir_in_place_of(DS_BINARY_DIR, "tokenizer.json", dir, sub, sizeof dir));
    EXPECT_STATUS(ds_tokenizer_load(dir, &tok), DS_ERR_IO);
    EXPECT_ERROR_HAS(sub);
    EXPECT_ERROR_HAS("not a regular file");
    EXPECT_STATUS(ds_tokenizer_load_tiktoken(sub, DS_TOK_SPECIALS_NONE, &tok), DS_ERR_IO);
    EXPECT_ERROR_HAS("not a regular file");
    EXPECT(tok == NULL);
    rmdir(sub);
    rmdir(dir);
}

int main(void) {
    if (ds_tokenizer_load_tiktoken(DATA "o200k_base.tiktoken", DS_TOK_SPECIALS_O200K_HARMONY,
                                   &o200k)) {
        fprintf(stderr, "cannot load o200k: %s\n", ds_error_last());
        return 1;
    }
    printf("o200k loaded (pre-tokenizer on %s)\n",
           ds_tokenizer_uses_jit(o200k) ? "PCRE2 JIT" : "the PCRE2 interpreter");
    DS_RUN(o200k_loads_with_harmony_specials);
    DS_RUN(spec_word_ids);
    DS_RUN(special_text_is_literal);
    DS_RUN(spec_bench_matches_tiktoken);
    DS_RUN(edge_cases_match_tiktoken);
    DS_RUN(interpreter_fallback_matches);
    DS_RUN(own_workspace_gives_same_ids);
    DS_RUN(invalid_utf8_is_rejected);
    DS_RUN(decode_checks_ids);
    DS_RUN(utf8_stream_handles_partial_characters);
    DS_RUN(token_by_token_decode_rebuilds_text);
    DS_RUN(long_pieces_round_trip);
    DS_RUN(bad_tiktoken_files);
    DS_RUN(hf_json_string_merges);
    DS_RUN(hf_json_pair_merges);
    DS_RUN(hf_json_with_bom);
    DS_RUN(hf_json_bad_input);
    DS_RUN(tokenizer_file_not_a_regular_file);
    ds_tokenizer_release(o200k);
    return ds_test_end();
}
