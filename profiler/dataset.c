// Conversation datasets: ShareGPT and MT-Bench / Spec-Bench question files (ds/dataset.h).
//
// Open = map the file, find every record's byte range with a light scanner (JSON Lines: one line
// per record; JSON array: bracket matching that knows strings and escapes), then walk the records
// in selection order, parsing each one with jansson on its own byte range, until N usable
// conversations are found. Only those are kept, copied into an arena; the jansson tree of a
// record is freed as soon as it has been copied, so memory is the mapping plus the selection.
#include "ds/dataset.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct record {
    size_t off, len, line;
};

struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) char data[];
};

struct conv {
    struct ds_conversation pub;
    size_t *turn_end; // (n_turns) message count up to and including each turn's user message
};

struct ds_dataset {
    char *path;
    struct ds_dataset_stats stats;
    struct conv *convs;
    size_t n_convs, cap_convs;
    struct arena_block *arena;
};

void ds_dataset_options_default(struct ds_dataset_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->format = DS_DATASET_AUTO;
    opt->order = DS_ORDER_FILE;
    opt->turns = DS_TURNS_FIRST;
    opt->on_bad = DS_DATASET_SKIP_BAD;
}

const char *ds_dataset_format_name(enum ds_dataset_format f) {
    switch (f) {
    case DS_DATASET_SHAREGPT:
        return "sharegpt";
    case DS_DATASET_QUESTIONS:
        return "questions";
    default:
        return "auto";
    }
}

// ---------------------------------------------------------------------------------------------
// arena

static void *arena_alloc(ds_dataset_t *ds, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct arena_block *b = ds->arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = ds->arena;
        b->used = 0;
        b->cap = cap;
        ds->arena = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

static const char *arena_str(ds_dataset_t *ds, const char *s, size_t n) {
    char *p = arena_alloc(ds, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

// ---------------------------------------------------------------------------------------------
// scanning

struct scan {
    const char *path;
    const char *buf;
    size_t len;
    struct record *recs;
    size_t n, cap;
};

static enum ds_status push_record(struct scan *sc, size_t off, size_t len, size_t line) {
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? 2 * sc->cap : 1024;
        struct record *r = realloc(sc->recs, cap * sizeof *r);
        if (!r) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for the record index", sc->path);
        sc->recs = r;
        sc->cap = cap;
    }
    sc->recs[sc->n++] = (struct record){off, len, line};
    return DS_OK;
}

// Blanks between JSON tokens other than '\n'. Not strchr(" \t\r", c): that matches c == '\0',
// and the NUL bytes a zero-filled (truncated) file leaves are data to report, not blanks.
static int is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r';
}

static void skip_ws(const struct scan *sc, size_t *p, size_t *line) {
    while (*p < sc->len) {
        char c = sc->buf[*p];
        if (c == '\n')
            ++*line;
        else if (!is_blank(c))
            break;
        ++*p;
    }
}

// *p at an opening quote; moves past the closing one. 0 if the string never closes.
static int skip_string(const struct scan *sc, size_t *p) {
    size_t i = *p + 1;
    while (i < sc->len) {
        const char *q = memchr(sc->buf + i, '"', sc->len - i);
        if (!q) return 0;
        size_t j = (size_t)(q - sc->buf), k = j;
        while (sc->buf[k - 1] == '\\') k--; // the opening quote stops this walk
        if ((j - k) % 2 == 0) {
            *p = j + 1;
            return 1;
        }
        i = j + 1;
    }
    return 0;
}

// The first '}' or ']' in a value that closes the other kind of bracket (at = SIZE_MAX: none).
struct mismatch {
    size_t at, line;
    char opened;
};

// Nesting deeper than jansson's limit (2048) fails to parse anyway: deeper brackets are counted
// but their kinds are not checked.
#define SCAN_KINDS 2048

// *p at the start of a value; moves past it. 0 if the input ends inside it. It counts brackets
// (a value whose brackets do not match ends where the count says), noting the first mismatch.
static int skip_value(const struct scan *sc, size_t *p, size_t *line, struct mismatch *mm) {
    mm->at = SIZE_MAX;
    char c = sc->buf[*p];
    if (c == '"') return skip_string(sc, p);
    if (c != '{' && c != '[') { // a scalar: up to the next delimiter
        for (; *p < sc->len; ++*p) {
            c = sc->buf[*p];
            if (c == ',' || c == ']' || c == '}' || c == '\n' || is_blank(c)) break;
        }
        return 1;
    }
    char open[SCAN_KINDS]; // the kind of each open bracket
    size_t depth = 0;
    while (*p < sc->len) {
        c = sc->buf[*p];
        if (c == '"') {
            if (!skip_string(sc, p)) return 0;
            continue;
        }
        if (c == '{' || c == '[') {
            if (depth < SCAN_KINDS) open[depth] = c;
            depth++;
        } else if (c == '}' || c == ']') {
            const char want = c == '}' ? '{' : '[';
            if (--depth < SCAN_KINDS && open[depth] != want && mm->at == SIZE_MAX)
                *mm = (struct mismatch){*p, *line, open[depth]};
            if (depth == 0) {
                ++*p;
                return 1;
            }
        } else if (c == '\n') {
            ++*line;
        }
        ++*p;
    }
    return 0;
}

// After a record whose brackets do not match, the count found a wrong end for it: an array that
// does not close or junk after the record is this mismatch, not a truncated file.
static enum ds_status mismatch_error(const struct scan *sc, const struct mismatch *mm,
                                     size_t start, size_t rec) {
    return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): '%c' closes a '%c' in record %zu "
                        "(from byte %zu): where the record ends cannot be told", sc->path, mm->at,
                        mm->line, sc->buf[mm->at], mm->opened, rec, start);
}

static enum ds_status scan_array(struct scan *sc, size_t p, size_t line) {
    p++; // '['
    size_t comma = 0, comma_line = 0; // the last ',' between records
    struct mismatch mm = {SIZE_MAX, 0, 0};
    size_t start = 0; // of the last record
    for (;;) {
        skip_ws(sc, &p, &line);
        if (p >= sc->len) break;
        if (sc->buf[p] == ']' && sc->n == 0) {
            p++;
            goto closed;
        }
        // Not records: they were taken for empty ones and skipped as "invalid JSON".
        if (sc->buf[p] == ']')
            return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): a trailing comma after "
                                "record %zu (JSON allows none before ']')", sc->path, comma,
                                comma_line, sc->n - 1);
        if (sc->buf[p] == ',')
            return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): ',' where record %zu "
                                "should start (an empty entry)", sc->path, p, line, sc->n);
        // NULs (a zero-filled file) passed for a scalar record running on to the next comma,
        // so the error named a byte and a record number further on.
        if (sc->buf[p] == '\0')
            return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): a NUL byte where record "
                                "%zu should start (a zero-filled file?)", sc->path, p, line, sc->n);
        start = p;
        size_t start_line = line;
        if (!skip_value(sc, &p, &line, &mm)) {
            if (mm.at != SIZE_MAX) return mismatch_error(sc, &mm, start, sc->n);
            return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): record %zu never ends: "
                                "the JSON array is not closed (truncated file?)", sc->path, start,
                                start_line, sc->n);
        }
        enum ds_status s = push_record(sc, start, p - start, start_line);
        if (s) return s;
        skip_ws(sc, &p, &line);
        if (p >= sc->len) break;
        if (sc->buf[p] == ',') {
            comma = p++;
            comma_line = line;
            continue;
        }
        if (sc->buf[p] == ']') {
            p++;
            goto closed;
        }
        if (mm.at != SIZE_MAX) return mismatch_error(sc, &mm, start, sc->n - 1);
        return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): expected ',' or ']' after "
                            "record %zu", sc->path, p, line, sc->n - 1);
    }
    if (mm.at != SIZE_MAX) return mismatch_error(sc, &mm, start, sc->n - 1);
    return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): the JSON array is not closed "
                        "(truncated file?)", sc->path, sc->len, line);
closed:
    skip_ws(sc, &p, &line);
    if (p < sc->len)
        return ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): unexpected data after the "
                            "JSON array", sc->path, p, line);
    return DS_OK;
}

static enum ds_status scan_lines(struct scan *sc, size_t p, size_t line) {
    while (p < sc->len) {
        const char *nl = memchr(sc->buf + p, '\n', sc->len - p);
        size_t end = nl ? (size_t)(nl - sc->buf) : sc->len;
        size_t a = p, b = end;
        while (a < b && is_blank(sc->buf[a])) a++;
        while (b > a && is_blank(sc->buf[b - 1])) b--;
        if (b > a) {
            enum ds_status s = push_record(sc, a, b - a, line);
            if (s) return s;
        }
        p = end + 1;
        line++;
    }
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// records

enum verdict { KEEP, EMPTY, BAD };

struct problem {
    char text[256];
};

// Drops a UTF-8 character that a byte cut (snprintf's) left incomplete at the end of s: messages
// go into run files as JSON strings, which jansson refuses (NULL) when they are not UTF-8.
static void utf8_trim(char *s) {
    size_t n = strlen(s), i = n;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--; // continuation bytes
    if (i == 0) return;
    const unsigned char lead = (unsigned char)s[i - 1];
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (n - (i - 1) < need) s[i - 1] = '\0';
}

static enum verdict bad(struct problem *pr, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static enum verdict bad(struct problem *pr, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pr->text, sizeof pr->text, fmt, ap);
    va_end(ap);
    utf8_trim(pr->text);
    return BAD;
}

// ShareGPT speakers seen in the wild, compared without case.
static const char *const user_names[] = {"human", "user", "person", "prompter", "customer", NULL};
static const char *const assistant_names[] = {"gpt", "chatgpt", "assistant", "bard", "bing",
                                              "model", "bot", "ai", "claude", "gpt4", "gpt-4",
                                              NULL};

static int role_of(const char *from, enum ds_chat_role *role) {
    for (int i = 0; user_names[i]; i++)
        if (!strcasecmp(from, user_names[i])) return *role = DS_ROLE_USER, 1;
    for (int i = 0; assistant_names[i]; i++)
        if (!strcasecmp(from, assistant_names[i])) return *role = DS_ROLE_ASSISTANT, 1;
    if (!strcasecmp(from, "system")) return *role = DS_ROLE_SYSTEM, 1;
    return 0;
}

static json_t *first_of(json_t *obj, const char *a, const char *b, const char *c,
                        const char **which) {
    const char *names[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        json_t *v = names[i] ? json_object_get(obj, names[i]) : NULL;
        if (v) {
            *which = names[i];
            return v;
        }
    }
    return NULL;
}

static const char *id_text(ds_dataset_t *ds, json_t *v) {
    char num[32];
    if (json_is_string(v)) return arena_str(ds, json_string_value(v), json_string_length(v));
    if (json_is_integer(v)) {
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
        return arena_str(ds, num, strlen(num));
    }
    if (json_is_real(v)) { // 1.5 -> "1.5": the fewest digits that read back as the same number
        const double x = json_real_value(v);
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(num, sizeof num, "%.*g", digits, x);
            if (strtod(num, NULL) == x) break;
        }
        return arena_str(ds, num, strlen(num));
    }
    return arena_str(ds, "", 0); // absent, or not a name: messages use the record number
}

// Fills c->pub.messages and the turn ends from a ShareGPT record or a question record.
static enum verdict build(ds_dataset_t *ds, json_t *rec, enum ds_dataset_format *fmt,
                          enum ds_dataset_turns turns, struct conv *c, struct problem *pr) {
    if (!json_is_object(rec)) return bad(pr, "the record is not a JSON object");
    const char *key = NULL;
    json_t *qturns = json_object_get(rec, "turns");
    json_t *msgs = first_of(rec, "conversations", "conversation", "messages", &key);
    // "turns" makes a question only as a list: ShareGPT records may carry a count under that
    // name. With two lists the file's kind decides (questions until one is known).
    enum ds_dataset_format kind = DS_DATASET_AUTO;
    if (json_is_array(qturns) && json_is_array(msgs))
        kind = *fmt == DS_DATASET_SHAREGPT ? DS_DATASET_SHAREGPT : DS_DATASET_QUESTIONS;
    else if (json_is_array(qturns) || (qturns && !msgs))
        kind = DS_DATASET_QUESTIONS;
    else if (msgs)
        kind = DS_DATASET_SHAREGPT;
    if (kind == DS_DATASET_AUTO)
        return bad(pr, "neither a ShareGPT record (\"conversations\") nor a question "
                       "(\"turns\")");
    if (*fmt != DS_DATASET_AUTO && *fmt != kind)
        return bad(pr, "a %s record in a %s file", ds_dataset_format_name(kind),
                   ds_dataset_format_name(*fmt));
    json_t *list = kind == DS_DATASET_QUESTIONS ? qturns : msgs;
    if (kind == DS_DATASET_QUESTIONS) key = "turns";
    if (!json_is_array(list)) return bad(pr, "\"%s\" is not an array", key);
    size_t n = json_array_size(list);
    size_t max_msgs = kind == DS_DATASET_QUESTIONS ? (n ? 2 * n - 1 : 0) : n;
    struct ds_chat_message *m = arena_alloc(ds, (max_msgs + 1) * sizeof *m);
    size_t *ends = arena_alloc(ds, (n + 1) * sizeof *ends);
    if (!m || !ends) return bad(pr, "out of memory");
    size_t n_turns = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(list, i);
        json_t *text;
        enum ds_chat_role role = DS_ROLE_USER;
        if (kind == DS_DATASET_QUESTIONS) {
            text = item;
            if (!json_is_string(text)) return bad(pr, "turns[%zu] is not a string", i);
            // An empty question is no turn: dropped with its reply, so that the k-th reply to
            // fill (text == NULL) is always the reply of turn k (replay.c relies on it).
            if (!json_string_length(text)) continue;
            if (at > 0) m[at++] = (struct ds_chat_message){DS_ROLE_ASSISTANT, NULL, 0};
        } else {
            const char *fk, *vk;
            json_t *from = first_of(item, "from", "role", NULL, &fk);
            text = first_of(item, "value", "content", "text", &vk);
            if (!json_is_object(item)) return bad(pr, "%s[%zu] is not an object", key, i);
            if (!json_is_string(from))
                return bad(pr, "%s[%zu] has no \"from\" (or \"role\") string", key, i);
            if (!json_is_string(text))
                return bad(pr, "%s[%zu] has no \"value\" (or \"content\") string", key, i);
            if (!role_of(json_string_value(from), &role)) {
                char name[41]; // the first 40 bytes, whole characters only
                snprintf(name, sizeof name, "%s", json_string_value(from));
                utf8_trim(name);
                return bad(pr, "%s[%zu]: unknown speaker \"%s\"", key, i, name);
            }
        }
        const char *s = arena_str(ds, json_string_value(text), json_string_length(text));
        if (!s) return bad(pr, "out of memory");
        m[at++] = (struct ds_chat_message){role, s, json_string_length(text)};
        if (role == DS_ROLE_USER && json_string_length(text) > 0) ends[n_turns++] = at;
    }
    if (!n_turns) return EMPTY;
    *fmt = kind;
    json_t *id = kind == DS_DATASET_QUESTIONS ? json_object_get(rec, "question_id")
                                              : json_object_get(rec, "id");
    json_t *cat = json_object_get(rec, "category");
    c->pub.id = id_text(ds, id);
    c->pub.category = json_is_string(cat) ? arena_str(ds, json_string_value(cat),
                                                      json_string_length(cat))
                                          : arena_str(ds, "", 0);
    if (!c->pub.id || !c->pub.category) return bad(pr, "out of memory");
    c->pub.messages = m;
    c->pub.n_messages = at;
    c->pub.n_turns = turns == DS_TURNS_FIRST ? 1 : n_turns;
    c->turn_end = ends;
    return KEEP;
}

// "line L" for JSON Lines, "byte B (line L)" for an array.
static void where(enum ds_dataset_layout layout, size_t off, size_t line, char *buf, size_t cap) {
    if (layout == DS_LAYOUT_JSONL)
        snprintf(buf, cap, "line %zu", line);
    else
        snprintf(buf, cap, "byte %zu (line %zu)", off, line);
}

// Parses and judges one record; a kept conversation is appended to ds->convs.
static enum ds_status examine(ds_dataset_t *ds, const struct scan *sc, size_t idx,
                              const struct ds_dataset_options *opt, enum ds_dataset_format *fmt) {
    const struct record *r = &sc->recs[idx];
    struct problem pr = {{0}};
    char loc[64];
    json_error_t err;
    enum verdict v;
    struct conv c = {{0}, NULL};
    // jansson words a stray NUL as "end of file expected": say what it is.
    const char *nul = memchr(sc->buf + r->off, '\0', r->len);
    json_t *rec = nul ? NULL : json_loadb(sc->buf + r->off, r->len, 0, &err);
    size_t err_off = r->off, err_line = r->line;
    if (nul) {
        err_off = (size_t)(nul - sc->buf);
        v = bad(&pr, "a NUL byte at byte %zu of the record: not JSON text (a zero-filled, "
                "truncated file?)", (size_t)(nul - sc->buf) - r->off);
    } else if (!rec) {
        err_off = r->off + (size_t)(err.position > 0 ? err.position - 1 : 0);
        err_line = r->line + (size_t)(err.line > 1 ? err.line - 1 : 0);
        if (json_error_code(&err) == json_error_invalid_utf8)
            v = bad(&pr, "invalid UTF-8 (such records are skipped, never repaired): %s", err.text);
        else
            v = bad(&pr, "invalid JSON: %s", err.text);
    } else {
        v = build(ds, rec, fmt, opt->turns, &c, &pr);
        json_decref(rec);
    }
    ds->stats.examined++;
    if (v == KEEP) {
        if (ds->n_convs == ds->cap_convs) {
            size_t cap = ds->cap_convs ? 2 * ds->cap_convs : 256;
            struct conv *p = realloc(ds->convs, cap * sizeof *p);
            if (!p) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", ds->path);
            ds->convs = p;
            ds->cap_convs = cap;
        }
        c.pub.dataset_index = idx;
        c.pub.line = r->line;
        c.pub.offset = r->off;
        c.pub.first_request = ds->stats.requests;
        ds->stats.requests += c.pub.n_turns;
        ds->convs[ds->n_convs++] = c;
        return DS_OK;
    }
    where(ds->stats.layout, err_off, err_line, loc, sizeof loc);
    if (v == EMPTY) {
        ds->stats.skipped_empty++;
        snprintf(pr.text, sizeof pr.text, "empty conversation (no user text)");
    } else {
        ds->stats.skipped_malformed++;
    }
    if (!ds->stats.first_skip[0]) {
        // Cut to the field on purpose (utf8_trim then drops a split character); the return
        // value is taken so that GCC's -Wformat-truncation knows the cut is expected.
        const int full = snprintf(ds->stats.first_skip, sizeof ds->stats.first_skip,
                                  "%s: %s: record %zu: %s", ds->path, loc, idx, pr.text);
        (void)full;
        utf8_trim(ds->stats.first_skip);
    }
    if (v == BAD && opt->on_bad == DS_DATASET_FAIL_ON_BAD)
        return ds_error_set(DS_ERR_FORMAT, "%s: %s: record %zu: %s", ds->path, loc, idx, pr.text);
    return DS_OK;
}

// splitmix64: a seeded, platform-independent shuffle.
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

enum ds_status ds_dataset_open(const char *path, const struct ds_dataset_options *opt,
                               ds_dataset_t **ds_out) {
    *ds_out = NULL;
    struct ds_dataset_options def;
    if (!opt) {
        ds_dataset_options_default(&def);
        opt = &def;
    }
    struct scan sc = {.path = path};
    size_t *order = NULL;
    void *map = MAP_FAILED;
    size_t map_len = 0;
    enum ds_status s = DS_OK;
    ds_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds || !(ds->path = strdup(path))) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        s = ds_error_set(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto cleanup;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        s = ds_error_set(DS_ERR_IO, "%s: not a regular file", path);
        goto cleanup;
    }
    map_len = (size_t)st.st_size;
    if (map_len) map = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map_len && map == MAP_FAILED) {
        s = ds_error_set(DS_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        goto cleanup;
    }
    if (map_len) madvise(map, map_len, MADV_SEQUENTIAL);
    sc.buf = map_len ? map : "";
    sc.len = map_len;

    size_t p = 0, line = 1;
    if (sc.len >= 3 && !memcmp(sc.buf, "\xEF\xBB\xBF", 3)) p = 3; // UTF-8 byte order mark
    skip_ws(&sc, &p, &line);
    if (p >= sc.len) {
        s = ds_error_set(DS_ERR_FORMAT, "%s: the file is empty", path);
        goto cleanup;
    }
    if (sc.buf[p] == '[') {
        ds->stats.layout = DS_LAYOUT_JSON_ARRAY;
        s = scan_array(&sc, p, line);
    } else if (sc.buf[p] == '{') {
        ds->stats.layout = DS_LAYOUT_JSONL;
        s = scan_lines(&sc, p, line);
    } else {
        s = ds_error_set(DS_ERR_FORMAT, "%s: byte %zu (line %zu): not JSON: expected '[' (a JSON "
                         "array) or '{' (JSON Lines)", path, p, line);
    }
    if (s) goto cleanup;
    ds->stats.records = sc.n;

    order = malloc((sc.n + 1) * sizeof *order);
    if (!order) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    for (size_t i = 0; i < sc.n; i++) order[i] = i;
    if (opt->order == DS_ORDER_SHUFFLE) {
        uint64_t x = opt->seed;
        for (size_t i = sc.n; i > 1; i--) { // Fisher-Yates
            size_t j = (size_t)(splitmix64(&x) % i);
            size_t t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
    }
    enum ds_dataset_format fmt = opt->format;
    for (size_t k = 0; k < sc.n && !s; k++) {
        if (opt->num_conversations && ds->n_convs == opt->num_conversations) break;
        s = examine(ds, &sc, order[k], opt, &fmt);
    }
    if (s) goto cleanup;
    ds->stats.format = fmt;
    ds->stats.selected = ds->n_convs;

cleanup:
    if (map != MAP_FAILED) munmap(map, map_len);
    free(sc.recs);
    free(order);
    if (s) {
        ds_dataset_release(ds);
        return s;
    }
    *ds_out = ds;
    return DS_OK;
}

void ds_dataset_release(ds_dataset_t *ds) {
    if (!ds) return;
    for (struct arena_block *b = ds->arena, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(ds->convs);
    free(ds->path);
    free(ds);
}

const struct ds_dataset_stats *ds_dataset_stats(const ds_dataset_t *ds) {
    return &ds->stats;
}

size_t ds_dataset_skip_text(char *buf, size_t cap, size_t read, size_t empty, size_t malformed,
                            const char *first) {
    const size_t n = empty + malformed;
    if (cap) buf[0] = 0;
    if (n && cap)
        snprintf(buf, cap, "%zu of the %zu records read %s skipped (%zu empty, %zu malformed)%s%s",
                 n, read, n == 1 ? "was" : "were", empty, malformed,
                 first && first[0] ? "; the first: " : "", first ? first : "");
    return n;
}

size_t ds_dataset_skip_note(const ds_dataset_t *ds, char *buf, size_t cap) {
    const struct ds_dataset_stats *st = &ds->stats;
    return ds_dataset_skip_text(buf, cap, st->examined, st->skipped_empty, st->skipped_malformed,
                                st->first_skip);
}

const char *ds_dataset_path(const ds_dataset_t *ds) {
    return ds->path;
}

size_t ds_dataset_num_conversations(const ds_dataset_t *ds) {
    return ds->n_convs;
}

const struct ds_conversation *ds_dataset_conversation(const ds_dataset_t *ds, size_t i) {
    return i < ds->n_convs ? &ds->convs[i].pub : NULL;
}

size_t ds_dataset_num_requests(const ds_dataset_t *ds) {
    return ds->stats.requests;
}

const char *ds_conversation_name(const struct ds_conversation *c, char *buf, size_t cap) {
    if (c->id[0])
        snprintf(buf, cap, "conversation \"%s\"", c->id);
    else
        snprintf(buf, cap, "conversation (record %zu, no id)", c->dataset_index);
    utf8_trim(buf);
    return buf;
}

enum ds_status ds_dataset_turn(const ds_dataset_t *ds, size_t conv, size_t turn,
                               struct ds_dataset_turn *out) {
    memset(out, 0, sizeof *out);
    if (conv >= ds->n_convs)
        return ds_error_set(DS_ERR_RANGE, "%s: conversation %zu of %zu", ds->path, conv,
                            ds->n_convs);
    const struct conv *c = &ds->convs[conv];
    char name[DS_CONVERSATION_NAME_CAP];
    if (turn < 1 || turn > c->pub.n_turns)
        return ds_error_set(DS_ERR_RANGE, "%s: %s has %zu turn(s), not %zu", ds->path,
                            ds_conversation_name(&c->pub, name, sizeof name), c->pub.n_turns, turn);
    out->request_index = c->pub.first_request + turn - 1;
    out->conversation = conv;
    out->turn = turn;
    out->conv = &c->pub;
    out->messages = c->pub.messages;
    out->n_messages = c->turn_end[turn - 1];
    return DS_OK;
}

enum ds_status ds_dataset_request(const ds_dataset_t *ds, size_t request,
                                  struct ds_dataset_turn *out) {
    if (request >= ds->stats.requests) {
        memset(out, 0, sizeof *out);
        return ds_error_set(DS_ERR_RANGE, "%s: request %zu of %zu", ds->path, request,
                            ds->stats.requests);
    }
    size_t lo = 0, hi = ds->n_convs; // the last conversation whose first request <= request
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (ds->convs[mid].pub.first_request <= request)
            lo = mid;
        else
            hi = mid;
    }
    return ds_dataset_turn(ds, lo, request - ds->convs[lo].pub.first_request + 1, out);
}

enum ds_status ds_dataset_render(const ds_dataset_t *ds, ds_harmony_t *h,
                                 const struct ds_harmony_system *sys,
                                 const struct ds_dataset_turn *turn, size_t max_context,
                                 struct ds_token_vec *ids_out) {
    ids_out->n = 0;
    enum ds_status s = ds_harmony_render_prompt(h, sys, turn->messages, turn->n_messages, ids_out);
    char loc[64], why[256], name[DS_CONVERSATION_NAME_CAP];
    where(ds->stats.layout, turn->conv->offset, turn->conv->line, loc, sizeof loc);
    ds_conversation_name(turn->conv, name, sizeof name);
    if (s) {
        snprintf(why, sizeof why, "%s", ds_error_last()); // the message buffer is reused below
        return ds_error_set(s, "%s: %s: %s turn %zu: %s", ds->path, loc, name, turn->turn, why);
    }
    // As run plans it: a prompt must leave at least one position to generate.
    if (max_context && ids_out->n >= max_context) {
        const char *how = ids_out->n > max_context ? "over" : "leaving no position to generate at";
        return ds_error_set(DS_ERR_RANGE, "%s: %s: %s turn %zu renders to %zu tokens, %s the "
                            "context limit of %zu", ds->path, loc, name, turn->turn, ids_out->n,
                            how, max_context);
    }
    return DS_OK;
}
