// ds/dataset.h: conversation datasets to replay (ShareGPT, MT-Bench / Spec-Bench questions).
//
// Accepted files (docs/datasets.md has the details), detected from content:
//   layout  a JSON array of records ('[' first) or JSON Lines, one record per line ('{' first);
//   records ShareGPT: {"id", "conversations": [{"from", "value"}, ...]} ("messages" and
//           "role"/"content" are accepted too); from = human/user/... (user),
//           gpt/chatgpt/assistant/bard/bing/... (assistant), system;
//           questions: {"question_id", "category", "turns": ["...", ...]}.
//
// Usage: open (scan + select) -> conversations in selection order -> per turn, the messages up to
// and including that turn's user message -> render with harmony (ds_dataset_render).
//
// Selection: the first N usable conversations in file order (what serving benchmarks do), or the
// first N of a seeded shuffle of the records. Turns: the first user turn only, or every user turn
// with the recorded replies before it as context. Empty conversations (no messages, no user text)
// and malformed ones (a record that is not valid JSON, invalid UTF-8, wrong types, an unknown role)
// are skipped and counted in the stats, never silently; with DS_DATASET_FAIL_ON_BAD the first
// malformed record is an error instead.
//
// Errors name the file and where: "line L" for JSON Lines, "byte B (line L)" for a JSON array.
// A file that is not JSON at all, or whose array is not closed (a truncated file), is an error
// whatever the policy.
//
// Memory: the file is mapped and scanned without building a JSON tree; only the records examined
// for the selection are parsed (one at a time), and only the selected conversations' texts are
// kept. The mapping is released before ds_dataset_open returns.
//
// Thread safety: a dataset is read-only after ds_dataset_open; concurrent readers are fine.
#ifndef DS_DATASET_H
#define DS_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "ds/harmony.h"
#include "ds/status.h"
#include "ds/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_dataset ds_dataset_t;

enum ds_dataset_format {
    DS_DATASET_AUTO = 0,      // decided by the first valid record
    DS_DATASET_SHAREGPT = 1,  // recorded conversations
    DS_DATASET_QUESTIONS = 2, // MT-Bench / Spec-Bench question lists
};

enum ds_dataset_layout {
    DS_LAYOUT_JSON_ARRAY = 0,
    DS_LAYOUT_JSONL = 1,
};

enum ds_dataset_order {
    DS_ORDER_FILE = 0,    // the first N usable records in file order
    DS_ORDER_SHUFFLE = 1, // the first N usable records of a seeded shuffle
};

enum ds_dataset_turns {
    DS_TURNS_FIRST = 0, // the first user turn of each conversation
    DS_TURNS_ALL = 1,   // every user turn, with everything before it as context
};

enum ds_dataset_on_bad {
    DS_DATASET_SKIP_BAD = 0,    // skip and count malformed records
    DS_DATASET_FAIL_ON_BAD = 1, // the first malformed record is an error
};

struct ds_dataset_options {
    enum ds_dataset_format format; // DS_DATASET_AUTO
    enum ds_dataset_order order;   // DS_ORDER_FILE
    uint64_t seed;                 // for DS_ORDER_SHUFFLE
    size_t num_conversations;      // 0 = every usable record
    enum ds_dataset_turns turns;   // DS_TURNS_FIRST
    enum ds_dataset_on_bad on_bad; // DS_DATASET_SKIP_BAD
};

void ds_dataset_options_default(struct ds_dataset_options *opt);

struct ds_dataset_stats {
    enum ds_dataset_format format; // as detected
    enum ds_dataset_layout layout;
    size_t records;           // records in the file
    size_t examined;          // records parsed to fill the selection
    size_t selected;          // conversations kept
    size_t requests;          // turns to replay over the selection
    size_t skipped_empty;     // no messages or no user text
    size_t skipped_malformed; // invalid JSON or UTF-8, wrong types, unknown role
    char first_skip[320];     // the first skipped record's message ("" if none)
};

// One selected conversation. Strings are NUL-terminated and owned by the dataset.
struct ds_conversation {
    size_t dataset_index;  // 0-based index of the record in the file
    size_t line;           // 1-based line where the record starts
    size_t offset;         // byte offset where the record starts
    const char *id;        // "id" or "question_id" as text, numbers in digits ("" if absent)
    const char *category;  // "category" ("" if absent, always for ShareGPT)
    const struct ds_chat_message *messages;
    size_t n_messages;
    size_t n_turns;        // user turns to replay (1 with DS_TURNS_FIRST)
    size_t first_request;  // request index of turn 1
};

// One request: a conversation's turn. A question file records no replies: the assistant messages
// between its turns have text == NULL, and the caller substitutes its own generated replies.
// Empty questions are dropped with their reply, so the k-th NULL reply is the reply of turn k.
struct ds_dataset_turn {
    size_t request_index; // position in the run's request sequence (conversation-major)
    size_t conversation;  // index into the selection
    size_t turn;          // 1-based
    const struct ds_conversation *conv;
    const struct ds_chat_message *messages; // up to and including this turn's user message
    size_t n_messages;
};

// Scans and selects. *ds_out is NULL on failure. Errors: DS_ERR_IO (cannot open), DS_ERR_FORMAT
// (not JSON, truncated array, or a malformed record with DS_DATASET_FAIL_ON_BAD), DS_ERR_ARG.
enum ds_status ds_dataset_open(const char *path, const struct ds_dataset_options *opt,
                               ds_dataset_t **ds_out);
void ds_dataset_release(ds_dataset_t *ds);

const struct ds_dataset_stats *ds_dataset_stats(const ds_dataset_t *ds);
// Writes "S of the R records read were skipped (E empty, M malformed); the first: <its message>"
// into buf (always NUL-terminated; "" when nothing was skipped) and returns S, so that a command
// can say what it left out.
size_t ds_dataset_skip_note(const ds_dataset_t *ds, char *buf, size_t cap);
// The same words from counts (a run file's options_json.dataset): "; the first: ..." only when
// `first` is not empty.
size_t ds_dataset_skip_text(char *buf, size_t cap, size_t read, size_t empty, size_t malformed,
                            const char *first);
const char *ds_dataset_path(const ds_dataset_t *ds);
const char *ds_dataset_format_name(enum ds_dataset_format f);

size_t ds_dataset_num_conversations(const ds_dataset_t *ds);
// NULL when i is out of range.
const struct ds_conversation *ds_dataset_conversation(const ds_dataset_t *ds, size_t i);
size_t ds_dataset_num_requests(const ds_dataset_t *ds);

// How messages name a conversation: `conversation "ID"`, or `conversation (record N, no id)` when
// its id is absent or not a string or number. Cut to cap on a character boundary; returns buf.
#define DS_CONVERSATION_NAME_CAP 128
const char *ds_conversation_name(const struct ds_conversation *c, char *buf, size_t cap);

// Turn `turn` (1-based) of selected conversation `conv`. DS_ERR_RANGE when out of range.
enum ds_status ds_dataset_turn(const ds_dataset_t *ds, size_t conv, size_t turn,
                               struct ds_dataset_turn *out);
// The request with the given index (0-based, conversation-major). DS_ERR_RANGE when out of range.
enum ds_status ds_dataset_request(const ds_dataset_t *ds, size_t request,
                                  struct ds_dataset_turn *out);

// Renders a turn as a completion prompt (ds_harmony_render_prompt) and replaces *ids_out with it.
// max_context > 0: a prompt of that many tokens or more (no position left to generate, as run
// plans a context) is DS_ERR_RANGE, with a message naming the file,
// the record's line, the conversation id, the turn and both lengths. Unrecorded replies give
// DS_ERR_ARG (see struct ds_dataset_turn).
enum ds_status ds_dataset_render(const ds_dataset_t *ds, ds_harmony_t *h,
                                 const struct ds_harmony_system *sys,
                                 const struct ds_dataset_turn *turn, size_t max_context,
                                 struct ds_token_vec *ids_out);

#ifdef __cplusplus
}
#endif
#endif // DS_DATASET_H
