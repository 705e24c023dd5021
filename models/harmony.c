// Harmony chat rendering and the channel tracker (openai/harmony's docs/format.md; ds/harmony.h).
//
// Rendering builds each message from special-token ids (looked up by name once, in
// ds_harmony_create) and encoded texts; the system message content is one text, exactly as the
// harmony library renders it, so the default conversation reproduces the 64 ids of harmony's
// test-data/test_simple_convo.txt.
#include "ds/harmony.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ds_harmony {
    const ds_tokenizer_t *tok;
    ds_tok_workspace_t *ws;
    struct ds_harmony_ids ids;
    struct ds_byte_vec scratch; // the system / developer content being built
};

void ds_harmony_system_default(struct ds_harmony_system *sys) {
    sys->identity = "You are ChatGPT, a large language model trained by OpenAI.";
    sys->knowledge_cutoff = "2024-06";
    sys->current_date = NULL;
    sys->reasoning = DS_REASONING_MEDIUM;
    sys->developer_instructions = NULL;
}

static const char *const reasoning_names[] = {"low", "medium", "high"};

const char *ds_reasoning_name(enum ds_reasoning r) {
    return (unsigned)r < 3 ? reasoning_names[r] : "unknown";
}

enum ds_status ds_reasoning_parse(const char *s, enum ds_reasoning *out) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, reasoning_names[i])) {
            *out = (enum ds_reasoning)i;
            return DS_OK;
        }
    return ds_error_set(DS_ERR_ARG, "reasoning effort \"%s\": expected low, medium or high", s);
}

enum ds_status ds_harmony_create(const ds_tokenizer_t *tok, ds_harmony_t **h_out) {
    *h_out = NULL;
    ds_harmony_t *h = calloc(1, sizeof *h);
    if (!h) return ds_error_set(DS_ERR_NOMEM, "harmony: out of memory");
    h->tok = tok;
    const struct {
        const char *name;
        int32_t *id;
    } need[] = {
        {"<|start|>", &h->ids.start},         {"<|end|>", &h->ids.end},
        {"<|message|>", &h->ids.message},     {"<|channel|>", &h->ids.channel},
        {"<|return|>", &h->ids.ret},          {"<|call|>", &h->ids.call},
        {"<|constrain|>", &h->ids.constrain}, {"<|endoftext|>", &h->ids.endoftext},
    };
    enum ds_status s = DS_OK;
    for (size_t i = 0; i < sizeof need / sizeof need[0] && !s; i++)
        if (ds_tokenizer_special_id(tok, need[i].name, need[i].id))
            s = ds_error_set(DS_ERR_MISMATCH, "harmony: the tokenizer has no special token %s",
                             need[i].name);
    if (!s) s = ds_tok_workspace_create(tok, &h->ws);
    if (s) {
        ds_harmony_release(h);
        return s;
    }
    *h_out = h;
    return DS_OK;
}

void ds_harmony_release(ds_harmony_t *h) {
    if (!h) return;
    ds_tok_workspace_release(h->ws);
    ds_byte_vec_free(&h->scratch);
    free(h);
}

const struct ds_harmony_ids *ds_harmony_ids(const ds_harmony_t *h) {
    return &h->ids;
}

static enum ds_status text(ds_harmony_t *h, const char *s, size_t len, struct ds_token_vec *out) {
    return ds_tokenizer_encode(h->tok, h->ws, s, len, out);
}

enum ds_status ds_harmony_render_message(ds_harmony_t *h, const char *role, const char *channel,
                                         const char *content, size_t len,
                                         struct ds_token_vec *out) {
    enum ds_status s = ds_token_vec_push(out, h->ids.start);
    if (!s) s = text(h, role, strlen(role), out);
    if (!s && channel) s = ds_token_vec_push(out, h->ids.channel);
    if (!s && channel) s = text(h, channel, strlen(channel), out);
    if (!s) s = ds_token_vec_push(out, h->ids.message);
    if (!s) s = text(h, content, len, out);
    if (!s) s = ds_token_vec_push(out, h->ids.end);
    return s;
}

enum ds_status ds_harmony_date_check(const char *name, const char *date) {
    // It is printed into the prompt as given: only a date the model could be told is accepted.
    bool digits = strlen(date) == 10 && date[4] == '-' && date[7] == '-';
    for (int i = 0; i < 10 && digits; i++)
        digits = i == 4 || i == 7 || (date[i] >= '0' && date[i] <= '9');
    if (!digits) return ds_error_set(DS_ERR_ARG, "%s \"%s\" is not YYYY-MM-DD", name, date);
    const int y = atoi(date), m = atoi(date + 5), d = atoi(date + 8);
    if (m < 1 || m > 12)
        return ds_error_set(DS_ERR_ARG, "%s \"%s\" is not a date: month %02d is not 01..12", name,
                            date, m);
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; // Gregorian
    const int last = days[m - 1] + (m == 2 && leap);
    if (d < 1 || d > last)
        return ds_error_set(DS_ERR_ARG, "%s \"%s\" is not a date: %.7s has days 01..%d", name,
                            date, date, last);
    return DS_OK;
}

static enum ds_status append_str(struct ds_byte_vec *v, const char *s) {
    return ds_byte_vec_append(v, s, strlen(s));
}

enum ds_status ds_harmony_system_check(const struct ds_harmony_system *sys) {
    if (sys->current_date && ds_harmony_date_check("harmony: current date", sys->current_date))
        return DS_ERR_ARG;
    if ((unsigned)sys->reasoning > DS_REASONING_HIGH)
        return ds_error_set(DS_ERR_ARG, "harmony: reasoning effort %d out of range",
                            (int)sys->reasoning);
    return DS_OK;
}

static enum ds_status render_system(ds_harmony_t *h, const struct ds_harmony_system *sys,
                                    struct ds_token_vec *out) {
    enum ds_status s = ds_harmony_system_check(sys);
    if (s) return s;
    struct ds_byte_vec *c = &h->scratch;
    c->n = 0;
    s = append_str(c, sys->identity ? sys->identity : "");
    if (!s) s = append_str(c, "\nKnowledge cutoff: ");
    if (!s) s = append_str(c, sys->knowledge_cutoff ? sys->knowledge_cutoff : "");
    if (!s && sys->current_date) s = append_str(c, "\nCurrent date: ");
    if (!s && sys->current_date) s = append_str(c, sys->current_date);
    if (!s) s = append_str(c, "\n\nReasoning: ");
    if (!s) s = append_str(c, reasoning_names[sys->reasoning]);
    if (!s)
        s = append_str(c, "\n\n# Valid channels: analysis, commentary, final. Channel must be "
                          "included for every message.");
    if (!s) s = ds_harmony_render_message(h, "system", NULL, c->data, c->n, out);
    return s;
}

static enum ds_status render_developer(ds_harmony_t *h, const char *instr, size_t len,
                                       struct ds_token_vec *out) {
    struct ds_byte_vec *c = &h->scratch;
    c->n = 0;
    enum ds_status s = append_str(c, "# Instructions\n\n");
    if (!s) s = ds_byte_vec_append(c, instr, len);
    if (!s) s = ds_harmony_render_message(h, "developer", NULL, c->data, c->n, out);
    return s;
}

enum ds_status ds_harmony_render_prompt(ds_harmony_t *h, const struct ds_harmony_system *sys,
                                        const struct ds_chat_message *msgs, size_t n,
                                        struct ds_token_vec *out) {
    struct ds_harmony_system def;
    if (!sys) {
        ds_harmony_system_default(&def);
        sys = &def;
    }
    size_t n0 = out->n;
    enum ds_status s = render_system(h, sys, out);
    if (!s && sys->developer_instructions && *sys->developer_instructions)
        s = render_developer(h, sys->developer_instructions, strlen(sys->developer_instructions),
                             out);
    for (size_t i = 0; i < n && !s; i++) {
        const struct ds_chat_message *m = &msgs[i];
        if (!m->text) {
            s = ds_error_set(DS_ERR_ARG, "harmony: message %zu (%s) has no text: the reply was "
                             "not recorded and must be supplied by the caller", i,
                             m->role == DS_ROLE_ASSISTANT ? "assistant" : "user");
            break;
        }
        switch (m->role) {
        case DS_ROLE_SYSTEM:
        case DS_ROLE_DEVELOPER:
            s = render_developer(h, m->text, m->len, out);
            break;
        case DS_ROLE_USER:
            s = ds_harmony_render_message(h, "user", NULL, m->text, m->len, out);
            break;
        case DS_ROLE_ASSISTANT:
            s = ds_harmony_render_message(h, "assistant", "final", m->text, m->len, out);
            break;
        default:
            s = ds_error_set(DS_ERR_ARG, "harmony: message %zu has an unknown role %d", i,
                             (int)m->role);
        }
    }
    if (!s) s = ds_token_vec_push(out, h->ids.start);
    if (!s) s = text(h, "assistant", strlen("assistant"), out);
    if (s) out->n = n0;
    return s;
}

// ---------------------------------------------------------------------------------------------
// channel tracker

enum { ST_OUTSIDE, ST_HEADER, ST_CHANNEL_NAME, ST_CONTENT };

static const char *const channel_names[DS_CHANNEL_COUNT] = {"header", "analysis", "commentary",
                                                            "final", "other"};

const char *ds_channel_name(enum ds_channel c) {
    return (unsigned)c < DS_CHANNEL_COUNT ? channel_names[c] : "unknown";
}

void ds_channel_tracker_init(struct ds_channel_tracker *t, const ds_harmony_t *h,
                             enum ds_tracker_start start) {
    memset(t, 0, sizeof *t);
    t->h = h;
    t->state = start == DS_TRACKER_AFTER_PROMPT ? ST_HEADER : ST_OUTSIDE;
    t->content = DS_CHANNEL_OTHER;
}

static enum ds_channel channel_from_name(const struct ds_channel_tracker *t) {
    for (int c = DS_CHANNEL_ANALYSIS; c <= DS_CHANNEL_FINAL; c++)
        if ((size_t)t->name_len == strlen(channel_names[c]) &&
            !memcmp(t->name, channel_names[c], (size_t)t->name_len))
            return (enum ds_channel)c;
    return DS_CHANNEL_OTHER;
}

// Collects the channel name: the text after <|channel|> up to the first space (a recipient or a
// content type may follow it). A name longer than the buffer is no known channel.
static void collect_name(struct ds_channel_tracker *t, int32_t id) {
    size_t len;
    const char *b = ds_tokenizer_token_bytes(t->h->tok, id, &len);
    for (size_t i = 0; i < len && !t->name_done; i++) {
        if (b[i] == ' ') {
            t->name_done = t->name_len > 0;
            continue;
        }
        if (t->name_len == (int)sizeof t->name) {
            t->name_len = 0;
            t->name_done = 1;
            t->name[0] = '\0';
            return;
        }
        t->name[t->name_len++] = b[i];
    }
}

enum ds_channel ds_channel_tracker_feed(struct ds_channel_tracker *t, int32_t id,
                                        enum ds_stop *stop_out) {
    const struct ds_harmony_ids *ids = &t->h->ids;
    *stop_out = DS_STOP_NONE;
    if (id == ids->endoftext) {
        *stop_out = DS_STOP_ENDOFTEXT;
        t->state = ST_OUTSIDE;
        return DS_CHANNEL_OTHER;
    }
    if (id == ids->ret || id == ids->call || id == ids->end) {
        if (id != ids->end) *stop_out = id == ids->ret ? DS_STOP_RETURN : DS_STOP_CALL;
        t->state = ST_OUTSIDE;
        return DS_CHANNEL_HEADER;
    }
    if (id == ids->start) {
        t->state = ST_HEADER;
        t->content = DS_CHANNEL_OTHER;
        t->name_len = 0;
        return DS_CHANNEL_HEADER;
    }
    if (id == ids->channel) {
        t->state = ST_CHANNEL_NAME;
        t->name_len = 0;
        t->name_done = 0;
        return DS_CHANNEL_HEADER;
    }
    if (id == ids->message) {
        t->content = t->state == ST_CHANNEL_NAME ? channel_from_name(t) : DS_CHANNEL_OTHER;
        t->state = ST_CONTENT;
        return DS_CHANNEL_HEADER;
    }
    switch (t->state) {
    case ST_CHANNEL_NAME:
        collect_name(t, id);
        return DS_CHANNEL_HEADER;
    case ST_HEADER:
        return DS_CHANNEL_HEADER; // role, recipient, <|constrain|>, content type
    case ST_CONTENT:
        return t->content;
    default:
        return DS_CHANNEL_OTHER;
    }
}
