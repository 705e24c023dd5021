// ds/harmony.h: the harmony chat format of gpt-oss (openai/harmony, docs/format.md).
//
// Rendering turns a conversation into the token ids of a completion prompt:
//
//   <|start|>system<|message|>{identity}\nKnowledge cutoff: {cutoff}[\nCurrent date: {date}]
//   \n\nReasoning: {effort}\n\n# Valid channels: analysis, commentary, final. Channel must be
//   included for every message.<|end|>
//   [<|start|>developer<|message|># Instructions\n\n{instructions}<|end|>]
//   <|start|>user<|message|>{text}<|end|>                                 (each user message)
//   <|start|>assistant<|channel|>final<|message|>{text}<|end|>             (each earlier reply)
//   <|start|>assistant                                                    (the turn to complete)
//
// There is no text between messages and no BOS. Special tokens are looked up BY NAME in the
// tokenizer when the renderer is created, so a small tokenizer with other ids works the same way.
// Role names, channel names and contents are encoded as separate texts (BPE never crosses a
// special token).
//
// The channel tracker labels each generated token (a small state machine, no allocation):
//   header      the formatting tokens and everything between <|start|> and <|message|>
//               (role, <|channel|>, channel name, " to=..." recipient, content type);
//   analysis / commentary / final
//               the content of a message in that channel;
//   other       content with no or an unknown channel, and anything outside a message.
// It reports the stop tokens <|return|>, <|call|> and <|endoftext|>; <|end|> is not a stop (the
// model emits it between its analysis and final messages and continues).
#ifndef DS_HARMONY_H
#define DS_HARMONY_H

#include <stddef.h>
#include <stdint.h>

#include "ds/status.h"
#include "ds/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ds_chat_role {
    DS_ROLE_SYSTEM = 0,    // rendered as a developer message "# Instructions\n\n{text}"
    DS_ROLE_DEVELOPER = 1, // likewise
    DS_ROLE_USER = 2,
    DS_ROLE_ASSISTANT = 3, // an earlier reply: rendered in the final channel
};

// One message. text is UTF-8 of len bytes (need not be NUL-terminated). text == NULL marks a reply
// the dataset does not record (the caller substitutes the reply it generated); rendering refuses
// it with DS_ERR_ARG.
struct ds_chat_message {
    enum ds_chat_role role;
    const char *text;
    size_t len;
};

enum ds_reasoning {
    DS_REASONING_LOW = 0,
    DS_REASONING_MEDIUM = 1, // harmony's default
    DS_REASONING_HIGH = 2,
};

// The system message settings plus optional developer instructions. Strings are NUL-terminated
// and borrowed for the duration of a call.
struct ds_harmony_system {
    // identity: "You are ChatGPT, a large language model trained by OpenAI."
    const char *identity;
    const char *knowledge_cutoff;       // "2024-06"
    const char *current_date;           // "YYYY-MM-DD" or NULL (harmony's default: no date line)
    enum ds_reasoning reasoning;        // DS_REASONING_MEDIUM
    const char *developer_instructions; // NULL or "": no developer message
};

// Fills *sys with harmony's defaults (openai/harmony chat.rs).
void ds_harmony_system_default(struct ds_harmony_system *sys);

// The settings every render checks (the current date as ds_harmony_date_check takes it, the
// reasoning effort one of the three): DS_ERR_ARG naming the value, so a command can refuse them
// before any file is read.
enum ds_status ds_harmony_system_check(const struct ds_harmony_system *sys);

// date is YYYY-MM-DD and a day of the Gregorian calendar (2024-02-29, not 2025-02-29, 2026-02-30
// or 2026-13-01): DS_OK. Otherwise DS_ERR_ARG, one line that starts with name (the option or
// field that gave the date, e.g. "--date") and says what is wrong.
enum ds_status ds_harmony_date_check(const char *name, const char *date);

// Parses "low" / "medium" / "high" (DS_ERR_ARG otherwise, naming the value).
enum ds_status ds_reasoning_parse(const char *s, enum ds_reasoning *out);
const char *ds_reasoning_name(enum ds_reasoning r);

// The renderer: the special-token ids of one tokenizer plus a workspace for encoding.
typedef struct ds_harmony ds_harmony_t;

// Looks up <|start|>, <|end|>, <|message|>, <|channel|>, <|return|>, <|call|>, <|constrain|> and
// <|endoftext|> by name. DS_ERR_MISMATCH naming the first missing token if the tokenizer lacks one.
// The tokenizer must outlive the renderer. A renderer is used by one thread at a time.
enum ds_status ds_harmony_create(const ds_tokenizer_t *tok, ds_harmony_t **h_out);
void ds_harmony_release(ds_harmony_t *h);

// The special-token ids (for callers that build sequences by hand or check a stop set).
struct ds_harmony_ids {
    int32_t start, end, message, channel, ret, call, constrain, endoftext;
};
const struct ds_harmony_ids *ds_harmony_ids(const ds_harmony_t *h);

// Appends the completion prompt for msgs[0..n) to *out: system, developer (from sys), then every
// message, then <|start|>assistant. sys NULL = defaults. DS_ERR_ARG for a NULL message text or
// a bad date; encoding errors (invalid UTF-8) pass through. *out keeps its length on failure.
enum ds_status ds_harmony_render_prompt(ds_harmony_t *h, const struct ds_harmony_system *sys,
                                        const struct ds_chat_message *msgs, size_t n,
                                        struct ds_token_vec *out);

// Appends one message `<|start|>{role}[<|channel|>{channel}]<|message|>{text}<|end|>`; channel
// NULL = none. The building block of render_prompt, for callers replaying generated turns.
enum ds_status ds_harmony_render_message(ds_harmony_t *h, const char *role, const char *channel,
                                         const char *text, size_t len, struct ds_token_vec *out);

// ---- channel tracker ----

enum ds_channel {
    DS_CHANNEL_HEADER = 0,
    DS_CHANNEL_ANALYSIS = 1,
    DS_CHANNEL_COMMENTARY = 2,
    DS_CHANNEL_FINAL = 3,
    DS_CHANNEL_OTHER = 4,
    DS_CHANNEL_COUNT
};
const char *ds_channel_name(enum ds_channel c);

enum ds_stop {
    DS_STOP_NONE = 0,
    DS_STOP_RETURN = 1,    // <|return|>: the final answer is complete
    DS_STOP_CALL = 2,      // <|call|>: a tool call is complete
    DS_STOP_ENDOFTEXT = 3, // <|endoftext|>
};

// Where a tracker starts.
enum ds_tracker_start {
    DS_TRACKER_AFTER_PROMPT = 0, // the prompt ended in <|start|>assistant: the header continues
    DS_TRACKER_OUTSIDE = 1,      // between messages
};

// Tracker state: plain data, one per sequence, caller-allocated (no allocation while feeding).
struct ds_channel_tracker {
    const ds_harmony_t *h;
    int state;              // internal
    enum ds_channel content; // the channel of the current message's content
    char name[16];          // the channel name being read
    int name_len;
    int name_done;
};

void ds_channel_tracker_init(struct ds_channel_tracker *t, const ds_harmony_t *h,
                             enum ds_tracker_start start);

// Labels one generated token and reports whether it stops generation (*stop_out).
enum ds_channel ds_channel_tracker_feed(struct ds_channel_tracker *t, int32_t id,
                                        enum ds_stop *stop_out);

#ifdef __cplusplus
}
#endif
#endif // DS_HARMONY_H
