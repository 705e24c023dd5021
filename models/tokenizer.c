// Byte-level BPE tokenizer: loading (tiktoken ranks, HF tokenizer.json), encoding, decoding.
//
// Layout: every id owns a byte string in one blob (tok_off/tok_len; tok_off = UNASSIGNED for gaps).
// A hash table (open addressing, linear probing, load <= 1/2) maps the bytes of every ordinary
// token to its id; special tokens are kept out of it, so text can never produce them. A
// tokenizer.json source also has a pair table (left id, right id) -> (merge rank, merged id).
//
// Encoding = pre-tokenize with PCRE2 (JIT when available), then per piece: the whole piece if it
// is a token (always for tiktoken; for tokenizer.json when model.ignore_merges is set), else BPE:
//   rank mode (tiktoken):   pair rank = rank (= id) of the two parts' concatenated bytes;
//   merge mode (HF):        pair rank = index of "left right" in model.merges.
// The lowest rank merges first, leftmost on ties (both references do the same). The parts array
// lives in the workspace and grows to the longest piece seen; nothing is allocated per piece.
#include "ds/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "files.h"

#define UNASSIGNED UINT32_MAX
#define NO_RANK UINT32_MAX

// The o200k pre-tokenizer (tiktoken's o200k_base pattern) with \s spelled out as Unicode White_Space, the
// meaning \s has in the Rust regex crate that tiktoken uses (PCRE2's \s differs on U+0085/U+180E).
#define WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
           "\\x{202F}\\x{205F}\\x{3000}"
static const char o200k_pattern[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

// GPT-2's pattern, used by a ByteLevel pre-tokenizer with use_regex = true.
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct slot {
    int32_t id; // -1 = empty
    uint32_t tag;
};

struct pair_slot {
    uint64_t key; // (left << 32 | right) + 1; 0 = empty
    uint32_t rank;
    int32_t merged;
};

struct part {
    uint32_t start; // byte offset of the part inside the piece
    int32_t id;     // the part's token id
    uint32_t rank;  // rank of merging this part with the next one, NO_RANK if none
    int32_t merged; // the id that merge produces
};

// A candidate merge of the part starting at `pos` with its right neighbour (long pieces).
struct heap_entry {
    uint32_t rank;
    uint32_t pos;
    uint32_t ver; // the part's version when pushed; stale entries are skipped
};

struct ds_tok_workspace {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    struct part *parts; // short pieces
    size_t parts_cap;
    // Long pieces: parts as a linked list over byte positions plus a min-heap of merges.
    uint32_t *nxt, *prv, *ver;
    int32_t *pid, *mrg;
    struct heap_entry *heap;
    size_t long_cap;
};

struct ds_tokenizer {
    enum ds_tok_source source;
    int32_t n_ids;
    uint32_t *tok_off; // (n_ids) offset into blob or UNASSIGNED
    uint32_t *tok_len; // (n_ids)
    uint8_t *special;  // (n_ids) 1 = special token
    struct ds_byte_vec blob;
    int32_t byte_id[256]; // the token of each single byte

    struct slot *slots; // bytes -> id
    uint32_t slot_mask;

    struct pair_slot *pairs; // merge mode only
    uint32_t pair_mask;
    int whole_piece_lookup; // emit a piece that is a token as is

    pcre2_code *re;
    int jit;
    ds_tok_workspace_t *own_ws;
};

// ---------------------------------------------------------------------------------------------
// vectors

enum ds_status ds_token_vec_reserve(struct ds_token_vec *v, size_t extra) {
    if (v->n + extra <= v->cap) return DS_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) cap *= 2;
    int32_t *p = realloc(v->ids, cap * sizeof *p);
    if (!p) return ds_error_set(DS_ERR_NOMEM, "token vector: out of memory (%zu ids)", cap);
    v->ids = p;
    v->cap = cap;
    return DS_OK;
}

enum ds_status ds_token_vec_push(struct ds_token_vec *v, int32_t id) {
    if (v->n == v->cap) {
        enum ds_status s = ds_token_vec_reserve(v, 1);
        if (s) return s;
    }
    v->ids[v->n++] = id;
    return DS_OK;
}

void ds_token_vec_free(struct ds_token_vec *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

enum ds_status ds_byte_vec_append(struct ds_byte_vec *v, const void *bytes, size_t len) {
    if (v->n + len + 1 > v->cap) {
        size_t cap = v->cap ? v->cap : 256;
        while (cap < v->n + len + 1) cap *= 2;
        char *p = realloc(v->data, cap);
        if (!p) return ds_error_set(DS_ERR_NOMEM, "byte vector: out of memory (%zu bytes)", cap);
        v->data = p;
        v->cap = cap;
    }
    if (len) memcpy(v->data + v->n, bytes, len);
    v->n += len;
    v->data[v->n] = '\0';
    return DS_OK;
}

void ds_byte_vec_free(struct ds_byte_vec *v) {
    free(v->data);
    v->data = NULL;
    v->n = v->cap = 0;
}

// ---------------------------------------------------------------------------------------------
// UTF-8

// Length of the valid UTF-8 character at s (n bytes available), 0 if invalid or incomplete;
// *incomplete is set when the bytes are a valid but unfinished prefix.
// *bad (optional) is set, for an invalid character, to the bytes to replace by one U+FFFD: the
// lead byte and the continuation bytes it accepted before the wrong one ("maximal subpart", as
// Python's errors="replace", which tiktoken's decode uses), at least 1.
static size_t utf8_char_bad(const unsigned char *s, size_t n, int *incomplete, size_t *bad) {
    *incomplete = 0;
    if (bad) *bad = 1;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *incomplete = 1;
            return 0;
        }
        unsigned b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) {
            if (bad) *bad = i;
            return 0;
        }
    }
    return need;
}

static size_t utf8_char(const unsigned char *s, size_t n, int *incomplete) {
    return utf8_char_bad(s, n, incomplete, NULL);
}

size_t ds_utf8_valid_prefix(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int inc;
        size_t k = utf8_char(p + i, len - i, &inc);
        if (!k) return i;
        i += k;
    }
    return len;
}

enum ds_status ds_bytes_escape(const char *bytes, size_t len, struct ds_byte_vec *out) {
    const unsigned char *p = (const unsigned char *)bytes;
    enum ds_status s = DS_OK;
    for (size_t i = 0; i < len && !s;) {
        int inc;
        size_t k = p[i] >= 0x80 ? utf8_char(p + i, len - i, &inc) : 1;
        char esc[8];
        const char *e = NULL;
        if (p[i] == '\n') e = "\\n";
        else if (p[i] == '\t') e = "\\t";
        else if (p[i] == '\r') e = "\\r";
        else if (p[i] == '\\') e = "\\\\";
        else if (p[i] < 0x20 || p[i] == 0x7F || k == 0) {
            snprintf(esc, sizeof esc, "\\x%02X", p[i]);
            e = esc;
        }
        s = e ? ds_byte_vec_append(out, e, strlen(e)) : ds_byte_vec_append(out, p + i, k);
        i += k ? k : 1;
    }
    return s ? s : ds_byte_vec_append(out, "", 0);
}

static const char replacement_char[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

enum ds_status ds_utf8_stream_feed(struct ds_utf8_stream *s, const char *bytes, size_t len,
                                   struct ds_byte_vec *out) {
    enum ds_status st = DS_OK;
    // Complete the pending character one byte at a time (at most 3 bytes are pending).
    while (s->n_pending > 0 && len > 0) {
        s->pending[s->n_pending++] = (unsigned char)*bytes++;
        len--;
        int inc;
        size_t bad, k = utf8_char_bad(s->pending, (size_t)s->n_pending, &inc, &bad);
        if (k) {
            st = ds_byte_vec_append(out, s->pending, k);
            s->n_pending = 0;
        } else if (!inc) {
            // Invalid: replace the bad bytes, re-feed the ones after them.
            unsigned char rest[4];
            int nr = s->n_pending - (int)bad;
            memcpy(rest, s->pending + bad, (size_t)nr);
            s->n_pending = 0;
            st = ds_byte_vec_append(out, replacement_char, 3);
            if (!st) st = ds_utf8_stream_feed(s, (const char *)rest, (size_t)nr, out);
        }
        if (st) return st;
    }
    const unsigned char *p = (const unsigned char *)bytes;
    size_t i = 0, run = 0; // run: start of the current span of valid bytes
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int inc;
        size_t bad, k = utf8_char_bad(p + i, len - i, &inc, &bad);
        if (k) {
            i += k;
            continue;
        }
        st = ds_byte_vec_append(out, p + run, i - run);
        if (st) return st;
        if (inc) { // keep the unfinished tail for the next call
            memcpy(s->pending, p + i, len - i);
            s->n_pending = (int)(len - i);
            return DS_OK;
        }
        st = ds_byte_vec_append(out, replacement_char, 3);
        if (st) return st;
        run = i += bad;
    }
    return ds_byte_vec_append(out, p + run, len - run);
}

enum ds_status ds_utf8_stream_finish(struct ds_utf8_stream *s, struct ds_byte_vec *out) {
    if (!s->n_pending) return DS_OK;
    s->n_pending = 0;
    return ds_byte_vec_append(out, replacement_char, 3);
}

// ---------------------------------------------------------------------------------------------
// hash tables

static inline uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

static inline int32_t lookup_bytes(const ds_tokenizer_t *t, const char *p, size_t n) {
    uint64_t h = hash_bytes((const unsigned char *)p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        const struct slot *s = &t->slots[i];
        if (s->id < 0) return -1;
        if (s->tag == tag && t->tok_len[s->id] == n &&
            !memcmp(t->blob.data + t->tok_off[s->id], p, n))
            return s->id;
    }
}

// Slots for n keys at load <= 1/2; 0 when that needs more than 2^31 (the masks are uint32_t).
static uint32_t table_size_for(size_t n) {
    uint64_t size = 1024;
    while (size < 2 * (uint64_t)n && size <= (1ull << 31)) size *= 2;
    return size > (1ull << 31) ? 0 : (uint32_t)size;
}

// Builds the bytes -> id table over every assigned ordinary token (first id wins on duplicates).
static enum ds_status build_byte_table(ds_tokenizer_t *t, const char *path) {
    size_t n_keys = 0; // only assigned ordinary tokens go in: ids may have gaps
    for (int32_t id = 0; id < t->n_ids; id++)
        n_keys += t->tok_off[id] != UNASSIGNED && !t->special[id];
    uint32_t size = table_size_for(n_keys);
    if (!size) return ds_error_set(DS_ERR_RANGE, "%s: too many tokens for the lookup table", path);
    t->slots = malloc((size_t)size * sizeof *t->slots);
    if (!t->slots) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for the vocabulary", path);
    t->slot_mask = size - 1;
    for (uint32_t i = 0; i < size; i++) t->slots[i].id = -1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (t->tok_off[id] == UNASSIGNED || t->special[id]) continue;
        const char *p = t->blob.data + t->tok_off[id];
        size_t n = t->tok_len[id];
        if (lookup_bytes(t, p, n) >= 0) continue;
        uint64_t h = hash_bytes((const unsigned char *)p, n);
        uint32_t i = (uint32_t)h & t->slot_mask;
        while (t->slots[i].id >= 0) i = (i + 1) & t->slot_mask;
        t->slots[i].id = id;
        t->slots[i].tag = (uint32_t)(h >> 32);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = lookup_bytes(t, &c, 1);
        if (t->byte_id[b] < 0)
            return ds_error_set(DS_ERR_FORMAT, "%s: no token for the single byte 0x%02X "
                                "(a byte-level BPE vocabulary needs all 256)", path, b);
    }
    return DS_OK;
}

static inline uint64_t pair_hash(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 29);
}

static inline const struct pair_slot *lookup_pair(const ds_tokenizer_t *t, int32_t a, int32_t b) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (uint32_t i = (uint32_t)pair_hash(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const struct pair_slot *s = &t->pairs[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
    }
}

// ---------------------------------------------------------------------------------------------
// token table

static enum ds_status alloc_ids(ds_tokenizer_t *t, int32_t n_ids, const char *path) {
    t->n_ids = n_ids;
    t->tok_off = malloc((size_t)n_ids * sizeof *t->tok_off);
    t->tok_len = calloc((size_t)n_ids, sizeof *t->tok_len);
    t->special = calloc((size_t)n_ids, 1);
    if (!t->tok_off || !t->tok_len || !t->special)
        return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for %d ids", path, n_ids);
    for (int32_t i = 0; i < n_ids; i++) t->tok_off[i] = UNASSIGNED;
    return DS_OK;
}

static enum ds_status set_token(ds_tokenizer_t *t, int32_t id, const void *bytes, size_t len,
                                int special) {
    if (t->blob.n + len >= UINT32_MAX)
        return ds_error_set(DS_ERR_RANGE, "tokenizer: vocabulary bytes exceed 4 GiB");
    t->tok_off[id] = (uint32_t)t->blob.n;
    t->tok_len[id] = (uint32_t)len;
    t->special[id] = (uint8_t)special;
    return ds_byte_vec_append(&t->blob, bytes, len);
}

// Rewrites \s and \S to the Unicode White_Space set (see WS) outside character classes and \s
// inside them, so that the pattern means what it means in the Rust and Python references.
static enum ds_status rewrite_ws(const char *pat, struct ds_byte_vec *out) {
    enum ds_status s = DS_OK;
    int in_class = 0;
    for (size_t i = 0; pat[i] && !s; i++) {
        char c = pat[i];
        if (c == '\\' && pat[i + 1]) {
            char e = pat[++i];
            if (e == 's')
                s = ds_byte_vec_append(out, in_class ? WS : "[" WS "]",
                                       strlen(WS) + (in_class ? 0 : 2));
            else if (e == 'S' && !in_class)
                s = ds_byte_vec_append(out, "[^" WS "]", strlen(WS) + 3);
            else
                s = ds_byte_vec_append(out, pat + i - 1, 2);
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            s = ds_byte_vec_append(out, &c, 1);
            // A ']' right after '[' or '[^' is a literal member.
            if (!s && pat[i + 1] == '^') s = ds_byte_vec_append(out, &pat[++i], 1);
            if (!s && pat[i + 1] == ']') s = ds_byte_vec_append(out, &pat[++i], 1);
            continue;
        }
        if (c == '[' && in_class && pat[i + 1] == ':') { // POSIX class [:alpha:]
            const char *end = strstr(pat + i, ":]");
            size_t n = end ? (size_t)(end - (pat + i)) + 2 : 1;
            s = ds_byte_vec_append(out, pat + i, n);
            i += n - 1;
            continue;
        }
        if (c == ']' && in_class) in_class = 0;
        s = ds_byte_vec_append(out, &c, 1);
    }
    return s;
}

static enum ds_status compile_pattern(ds_tokenizer_t *t, const char *pattern, int rewrite,
                                      const char *path) {
    // An empty Split regex matches nothing but empty strings: how it would split is not defined
    // by anything this tokenizer can be checked against, so it is refused (it failed as PCRE2's
    // "pattern passed as NULL" before).
    if (!*pattern)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: the pre-tokenizer's Split regex is empty",
                            path);
    struct ds_byte_vec pat = {0};
    enum ds_status s = rewrite ? rewrite_ws(pattern, &pat)
                               : ds_byte_vec_append(&pat, pattern, strlen(pattern));
    if (s) goto cleanup;
    int err;
    PCRE2_SIZE erroff;
    t->re = pcre2_compile((PCRE2_SPTR)pat.data, pat.n, PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        s = ds_error_set(DS_ERR_FORMAT, "%s: pre-tokenizer regex does not compile at offset %zu: %s",
                         path, (size_t)erroff, (const char *)msg);
        goto cleanup;
    }
    // JIT is a speed-up only: without it (no JIT support, W^X policies, or DS_TOKENIZER_NO_JIT set)
    // the interpreter gives the same pieces.
    const char *no_jit = getenv("DS_TOKENIZER_NO_JIT");
    t->jit = (!no_jit || !*no_jit || !strcmp(no_jit, "0")) &&
             pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
cleanup:
    ds_byte_vec_free(&pat);
    return s;
}

// ---------------------------------------------------------------------------------------------
// workspace

enum ds_status ds_tok_workspace_create(const ds_tokenizer_t *tok, ds_tok_workspace_t **ws_out) {
    *ws_out = NULL;
    ds_tok_workspace_t *ws = calloc(1, sizeof *ws);
    if (!ws) return ds_error_set(DS_ERR_NOMEM, "tokenizer workspace: out of memory");
    ws->md = pcre2_match_data_create(2, NULL);
    ws->mctx = pcre2_match_context_create(NULL);
    ws->parts_cap = 256;
    ws->parts = malloc(ws->parts_cap * sizeof *ws->parts);
    if (tok->jit) {
        // The default 32 KiB JIT stack is enough for this pattern; allow growth for odd input.
        ws->jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (ws->jit_stack) pcre2_jit_stack_assign(ws->mctx, NULL, ws->jit_stack);
    }
    if (!ws->md || !ws->mctx || !ws->parts || (tok->jit && !ws->jit_stack)) {
        ds_tok_workspace_release(ws);
        return ds_error_set(DS_ERR_NOMEM, "tokenizer workspace: out of memory");
    }
    *ws_out = ws;
    return DS_OK;
}

void ds_tok_workspace_release(ds_tok_workspace_t *ws) {
    if (!ws) return;
    pcre2_match_data_free(ws->md);
    pcre2_match_context_free(ws->mctx);
    pcre2_jit_stack_free(ws->jit_stack);
    free(ws->parts);
    free(ws->nxt);
    free(ws->prv);
    free(ws->ver);
    free(ws->pid);
    free(ws->mrg);
    free(ws->heap);
    free(ws);
}

// ---------------------------------------------------------------------------------------------
// loading: common

static ds_tokenizer_t *tokenizer_new(enum ds_tok_source source) {
    ds_tokenizer_t *t = calloc(1, sizeof *t);
    if (t) t->source = source;
    return t;
}

void ds_tokenizer_release(ds_tokenizer_t *tok) {
    if (!tok) return;
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->special);
    ds_byte_vec_free(&tok->blob);
    free(tok->slots);
    free(tok->pairs);
    pcre2_code_free(tok->re);
    ds_tok_workspace_release(tok->own_ws);
    free(tok);
}

// Reads a whole file into a NUL-terminated buffer.
static enum ds_status read_file(const char *path, char **data_out, size_t *len_out) {
    *data_out = NULL;
    *len_out = 0;
    FILE *f;
    enum ds_status s = ds_fopen_regular(path, &f);
    if (s) return s;
    struct ds_byte_vec v = {0};
    char buf[1 << 16];
    size_t n;
    while (!s && (n = fread(buf, 1, sizeof buf, f)) > 0) s = ds_byte_vec_append(&v, buf, n);
    if (!s && ferror(f)) s = ds_error_set(DS_ERR_IO, "%s: read error: %s", path, strerror(errno));
    if (!s && !v.data) s = ds_byte_vec_append(&v, "", 0);
    fclose(f);
    if (s) {
        ds_byte_vec_free(&v);
        return s;
    }
    *data_out = v.data;
    *len_out = v.n;
    return DS_OK;
}

// Ends a load: hands the tokenizer out on success, releases it on failure.
static enum ds_status hand_out(ds_tokenizer_t *t, enum ds_status s, ds_tokenizer_t **tok_out) {
    if (s) {
        ds_tokenizer_release(t);
        return s;
    }
    *tok_out = t;
    return DS_OK;
}

// Finishes a tokenizer: the lookup table, the regex, the tokenizer's own workspace.
static enum ds_status finish(ds_tokenizer_t *t, const char *pattern, int rewrite,
                             const char *path) {
    enum ds_status s = build_byte_table(t, path);
    if (!s) s = compile_pattern(t, pattern, rewrite, path);
    if (!s) s = ds_tok_workspace_create(t, &t->own_ws);
    return s;
}

// ---------------------------------------------------------------------------------------------
// loading: tiktoken

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Decodes standard base64 (with '=' padding) into out; returns the length or -1.
static long b64_decode(const char *s, size_t n, unsigned char *out) {
    if (n == 0 || n % 4) return -1;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad || (v[k] = b64_value(c)) < 0) {
                return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        out[o++] = (unsigned char)(w >> 16);
        if (pad < 2) out[o++] = (unsigned char)(w >> 8);
        if (pad < 1) out[o++] = (unsigned char)w;
    }
    return o;
}

// Special tokens of o200k_harmony (openai/harmony public_encodings.rs); every other id in 199998..201087 is
// <|reserved_{id}|>.
static const struct {
    int32_t id;
    const char *name;
} harmony_specials[] = {
    {199998, "<|startoftext|>"}, {199999, "<|endoftext|>"}, {200002, "<|return|>"},
    {200003, "<|constrain|>"},   {200005, "<|channel|>"},   {200006, "<|start|>"},
    {200007, "<|end|>"},         {200008, "<|message|>"},   {200012, "<|call|>"},
};
#define HARMONY_FIRST_SPECIAL 199998
#define HARMONY_VOCAB 201088

static enum ds_status add_harmony_specials(ds_tokenizer_t *t, const char *path) {
    for (int32_t id = HARMONY_FIRST_SPECIAL; id < HARMONY_VOCAB; id++) {
        if (t->tok_off[id] != UNASSIGNED)
            return ds_error_set(DS_ERR_MISMATCH, "%s: rank %d collides with the o200k_harmony "
                                "special tokens (199998 and up)", path, id);
        char name[32];
        snprintf(name, sizeof name, "<|reserved_%d|>", id);
        const char *nm = name;
        for (size_t k = 0; k < sizeof harmony_specials / sizeof harmony_specials[0]; k++)
            if (harmony_specials[k].id == id) nm = harmony_specials[k].name;
        enum ds_status s = set_token(t, id, nm, strlen(nm), 1);
        if (s) return s;
    }
    return DS_OK;
}

enum ds_status ds_tokenizer_load_tiktoken(const char *path, enum ds_tok_specials specials,
                                          ds_tokenizer_t **tok_out) {
    *tok_out = NULL;
    char *data = NULL;
    size_t len = 0;
    unsigned char *tmp = NULL;
    ds_tokenizer_t *t = tokenizer_new(DS_TOK_SOURCE_TIKTOKEN);
    if (!t) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
    enum ds_status s = read_file(path, &data, &len);
    if (s) goto cleanup;

    // Pass 1: validate every line and find the highest rank.
    long max_rank = -1;
    size_t n_lines = 0, line_no = 0, longest = 0;
    for (char *p = data, *end = data + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        line_no++;
        if (le > p && le[-1] == '\r') le--;
        if (le == p) { // blank lines (a trailing one) are allowed
            p = nl ? nl + 1 : end;
            continue;
        }
        char *sp = memchr(p, ' ', (size_t)(le - p));
        char *num_end = NULL;
        long rank = sp ? strtol(sp + 1, &num_end, 10) : -1;
        if (!sp || sp == p || num_end != le || sp + 1 == le || rank < 0) {
            s = ds_error_set(DS_ERR_FORMAT, "%s: line %zu: expected \"<base64> <rank>\"", path,
                             line_no);
            goto cleanup;
        }
        // The same cap as tokenizer.json ids: the tables hold max rank + 1 entries.
        if (rank >= INT32_MAX / 2) {
            s = ds_error_set(DS_ERR_FORMAT, "%s: line %zu: rank %ld is too large (limit %d)", path,
                             line_no, rank, INT32_MAX / 2 - 1);
            goto cleanup;
        }
        if (rank > max_rank) max_rank = rank;
        if ((size_t)(sp - p) > longest) longest = (size_t)(sp - p);
        n_lines++;
        p = nl ? nl + 1 : end;
    }
    if (!n_lines) {
        s = ds_error_set(DS_ERR_FORMAT, "%s: no ranks in the file", path);
        goto cleanup;
    }
    int32_t n_ids = (int32_t)max_rank + 1;
    if (specials == DS_TOK_SPECIALS_O200K_HARMONY) {
        if (n_ids > HARMONY_FIRST_SPECIAL) {
            s = ds_error_set(DS_ERR_MISMATCH, "%s: highest rank %ld collides with the "
                             "o200k_harmony special tokens (199998 and up)", path, max_rank);
            goto cleanup;
        }
        n_ids = HARMONY_VOCAB;
    }
    s = alloc_ids(t, n_ids, path);
    if (s) goto cleanup;
    tmp = malloc(longest);
    if (!tmp) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }

    // Pass 2: decode.
    line_no = 0;
    for (char *p = data, *end = data + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        line_no++;
        if (le > p && le[-1] == '\r') le--;
        if (le > p) {
            char *sp = memchr(p, ' ', (size_t)(le - p));
            int32_t rank = (int32_t)strtol(sp + 1, NULL, 10);
            long n = b64_decode(p, (size_t)(sp - p), tmp);
            if (n < 0) {
                s = ds_error_set(DS_ERR_FORMAT, "%s: line %zu: invalid base64", path, line_no);
                goto cleanup;
            }
            if (t->tok_off[rank] != UNASSIGNED) {
                s = ds_error_set(DS_ERR_FORMAT, "%s: line %zu: rank %d appears twice", path,
                                 line_no, rank);
                goto cleanup;
            }
            s = set_token(t, rank, tmp, (size_t)n, 0);
            if (s) goto cleanup;
        }
        p = nl ? nl + 1 : end;
    }
    if (specials == DS_TOK_SPECIALS_O200K_HARMONY) s = add_harmony_specials(t, path);
    if (!s) s = finish(t, o200k_pattern, 0, path);
    if (!s) t->whole_piece_lookup = 1;

cleanup:
    free(data);
    free(tmp);
    return hand_out(t, s, tok_out);
}

// ---------------------------------------------------------------------------------------------
// loading: Hugging Face tokenizer.json

// GPT-2's byte <-> printable code point table: bytes 33..126, 161..172, 174..255 map to
// themselves, the other 68 bytes to 256, 257, ... in byte order.
static void byte_level_table(int32_t cp_to_byte[324]) {
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        cp_to_byte[printable ? b : next++] = b;
    }
}

// Maps a vocab string from the byte-level alphabet back to bytes; -1 if a character is outside.
static long byte_level_decode(const char *s, size_t n, const int32_t cp_to_byte[324],
                              unsigned char *out) {
    long o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)s[i];
        unsigned cp;
        if (c < 0x80) {
            cp = c;
            i++;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < n) {
            cp = (c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1;
        }
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[o++] = (unsigned char)cp_to_byte[cp];
    }
    return o;
}

// The pre-tokenizer regex of a tokenizer.json: a Split with a Regex pattern, or a ByteLevel with
// use_regex (GPT-2's pattern), alone or inside a Sequence. *pattern_out NULL = unsupported.
static enum ds_status hf_pattern(json_t *pre, const char *path, const char **pattern_out) {
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (!type) return ds_error_set(DS_ERR_FORMAT, "%s: pre_tokenizer without a type", path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pre, "pretokenizers");
        size_t i;
        json_t *item;
        if (!json_is_array(list))
            return ds_error_set(DS_ERR_FORMAT, "%s: Sequence pre_tokenizer without a list", path);
        json_array_foreach(list, i, item) {
            const char *pat = NULL;
            enum ds_status s = hf_pattern(item, path, &pat);
            if (s) return s;
            if (pat && *pattern_out)
                return ds_error_set(DS_ERR_UNSUPPORTED, "%s: more than one splitting "
                                    "pre-tokenizer in the Sequence", path);
            if (pat) *pattern_out = pat;
        }
        return DS_OK;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(pre, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *behavior = json_string_value(json_object_get(pre, "behavior"));
        if (!re)
            return ds_error_set(DS_ERR_UNSUPPORTED, "%s: Split pre-tokenizer needs a Regex "
                                "pattern", path);
        if (json_is_true(json_object_get(pre, "invert")) || (behavior && strcmp(behavior, "Isolated")))
            return ds_error_set(DS_ERR_UNSUPPORTED, "%s: Split pre-tokenizer must be Isolated and "
                                "not inverted", path);
        *pattern_out = re;
        return DS_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(pre, "add_prefix_space")))
            return ds_error_set(DS_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space is not "
                                "supported", path);
        json_t *use = json_object_get(pre, "use_regex");
        if (!use || json_is_true(use)) *pattern_out = gpt2_pattern;
        return DS_OK;
    }
    return ds_error_set(DS_ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported", path,
                        type);
}

// Splits one merges entry into its two halves ("a b" or ["a", "b"]).
static int merge_halves(json_t *m, const char **a, size_t *na, const char **b, size_t *nb) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return 0;
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return *na && *nb;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *na = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *nb = json_string_length(json_array_get(m, 1));
        return 1;
    }
    return 0;
}

static enum ds_status hf_merges(ds_tokenizer_t *t, json_t *merges, const int32_t cp_to_byte[324],
                                const char *path) {
    size_t n = json_array_size(merges);
    uint32_t size = table_size_for(n);
    if (!size) return ds_error_set(DS_ERR_RANGE, "%s: too many merges (%zu)", path, n);
    t->pairs = calloc(size, sizeof *t->pairs);
    if (!t->pairs) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for merges", path);
    t->pair_mask = size - 1;
    unsigned char buf[2048];
    for (size_t r = 0; r < n; r++) {
        const char *a, *b;
        size_t na, nb;
        json_t *m = json_array_get(merges, r);
        if (!merge_halves(m, &a, &na, &b, &nb))
            return ds_error_set(DS_ERR_FORMAT, "%s: merges[%zu] is not \"a b\" or [\"a\", \"b\"]",
                                path, r);
        if (na + nb > sizeof buf)
            return ds_error_set(DS_ERR_FORMAT, "%s: merges[%zu] is too long", path, r);
        long la = byte_level_decode(a, na, cp_to_byte, buf);
        long lb = la < 0 ? -1 : byte_level_decode(b, nb, cp_to_byte, buf + la);
        if (lb < 0)
            return ds_error_set(DS_ERR_FORMAT, "%s: merges[%zu] has a character outside the "
                                "byte-level alphabet", path, r);
        int32_t ia = lookup_bytes(t, (char *)buf, (size_t)la);
        int32_t ib = lookup_bytes(t, (char *)buf + la, (size_t)lb);
        int32_t im = lookup_bytes(t, (char *)buf, (size_t)(la + lb));
        if (ia < 0 || ib < 0 || im < 0)
            return ds_error_set(DS_ERR_FORMAT, "%s: merges[%zu] names a token that is not in the "
                                "vocab", path, r);
        uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
        uint32_t i = (uint32_t)pair_hash(key) & t->pair_mask;
        while (t->pairs[i].key && t->pairs[i].key != key) i = (i + 1) & t->pair_mask;
        if (t->pairs[i].key) continue; // a repeated merge keeps its first (best) rank
        t->pairs[i].key = key;
        t->pairs[i].rank = (uint32_t)r;
        t->pairs[i].merged = im;
    }
    return DS_OK;
}

// Steps over a UTF-8 byte order mark at the start of f: some editors write one before JSON.
static void skip_bom(FILE *f) {
    unsigned char b[3];
    if (fread(b, 1, 3, f) != 3 || memcmp(b, "\xEF\xBB\xBF", 3)) rewind(f);
}

enum ds_status ds_tokenizer_load_hf(const char *path, ds_tokenizer_t **tok_out) {
    *tok_out = NULL;
    json_error_t jerr;
    unsigned char *buf = NULL;
    ds_tokenizer_t *t = tokenizer_new(DS_TOK_SOURCE_HF_JSON);
    json_t *root = NULL;
    FILE *f = NULL;
    enum ds_status s = DS_OK;
    if (!t) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    if ((s = ds_fopen_regular(path, &f))) goto cleanup;
    skip_bom(f);
    root = json_loadf(f, 0, &jerr);
    if (!root) {
        s = ds_error_set(DS_ERR_FORMAT, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                         jerr.text);
        goto cleanup;
    }
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    json_t *pre = json_object_get(root, "pre_tokenizer");
    json_t *norm = json_object_get(root, "normalizer");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || !json_is_object(vocab) || !json_is_array(merges)) {
        s = ds_error_set(DS_ERR_FORMAT, "%s: expected model.vocab (object) and model.merges "
                         "(array)", path);
        goto cleanup;
    }
    if (type && strcmp(type, "BPE")) {
        s = ds_error_set(DS_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (BPE only)",
                         path, type);
        goto cleanup;
    }
    if (norm && !json_is_null(norm)) {
        s = ds_error_set(DS_ERR_UNSUPPORTED, "%s: a normalizer is not supported", path);
        goto cleanup;
    }
    if (json_is_true(json_object_get(model, "byte_fallback"))) {
        s = ds_error_set(DS_ERR_UNSUPPORTED, "%s: byte_fallback is not supported", path);
        goto cleanup;
    }
    if (added && !json_is_array(added)) {
        s = ds_error_set(DS_ERR_FORMAT, "%s: added_tokens must be an array", path);
        goto cleanup;
    }
    const char *pattern = NULL;
    if (!pre || json_is_null(pre)) {
        s = ds_error_set(DS_ERR_UNSUPPORTED, "%s: no pre_tokenizer (a byte-level BPE needs one)",
                         path);
        goto cleanup;
    }
    s = hf_pattern(pre, path, &pattern);
    if (s) goto cleanup;
    if (!pattern) {
        s = ds_error_set(DS_ERR_UNSUPPORTED, "%s: the pre_tokenizer has no splitting regex", path);
        goto cleanup;
    }

    // Highest id over vocab and added tokens.
    long max_id = -1;
    const char *key;
    json_t *val;
    size_t i;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= INT32_MAX / 2) {
            s = ds_error_set(DS_ERR_FORMAT, "%s: vocab entry \"%s\" has no valid id", path, key);
            goto cleanup;
        }
        if (json_integer_value(val) > max_id) max_id = (long)json_integer_value(val);
    }
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX / 2 ||
            !json_is_string(json_object_get(val, "content"))) {
            s = ds_error_set(DS_ERR_FORMAT, "%s: added_tokens[%zu] needs an id and a content",
                             path, i);
            goto cleanup;
        }
        if (json_integer_value(id) > max_id) max_id = (long)json_integer_value(id);
    }
    // The id tables are dense (max id + 1 entries): one stray huge id would cost gigabytes.
    size_t n_entries = json_object_size(vocab) + json_array_size(added);
    if (max_id >= (long)(2 * n_entries + 65536)) {
        s = ds_error_set(DS_ERR_FORMAT, "%s: token id %ld is far beyond the %zu vocab and added "
                         "tokens (ids must be nearly dense)", path, max_id, n_entries);
        goto cleanup;
    }
    s = alloc_ids(t, (int32_t)(max_id + 1), path);
    if (s) goto cleanup;
    int32_t cp_to_byte[324];
    byte_level_table(cp_to_byte);
    size_t buf_cap = 1024;
    buf = malloc(buf_cap);
    if (!buf) {
        s = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    json_object_foreach(vocab, key, val) {
        size_t kn = strlen(key);
        if (kn > buf_cap) {
            s = ds_error_set(DS_ERR_FORMAT, "%s: vocab entry of %zu bytes is too long", path, kn);
            goto cleanup;
        }
        long n = byte_level_decode(key, kn, cp_to_byte, buf);
        int32_t id = (int32_t)json_integer_value(val);
        if (n < 0) {
            s = ds_error_set(DS_ERR_FORMAT, "%s: vocab entry \"%s\" (id %d) has a character "
                             "outside the byte-level alphabet", path, key, id);
            goto cleanup;
        }
        if (t->tok_off[id] != UNASSIGNED) {
            s = ds_error_set(DS_ERR_FORMAT, "%s: vocab id %d appears twice", path, id);
            goto cleanup;
        }
        s = set_token(t, id, buf, (size_t)n, 0);
        if (s) goto cleanup;
    }
    // Added tokens are placed by id only: the special ones take their name as bytes; an ordinary
    // added token that is not in the vocab is stored as its UTF-8 text.
    json_array_foreach(added, i, val) {
        int32_t id = (int32_t)json_integer_value(json_object_get(val, "id"));
        json_t *content = json_object_get(val, "content");
        int special = json_is_true(json_object_get(val, "special"));
        if (t->tok_off[id] != UNASSIGNED && !special) continue;
        s = set_token(t, id, json_string_value(content), json_string_length(content), special);
        if (s) goto cleanup;
    }
    s = build_byte_table(t, path);
    if (!s) s = hf_merges(t, merges, cp_to_byte, path);
    if (!s) s = compile_pattern(t, pattern, 1, path);
    if (!s) s = ds_tok_workspace_create(t, &t->own_ws);
    t->whole_piece_lookup = json_is_true(json_object_get(model, "ignore_merges"));

cleanup:
    if (f) fclose(f);
    json_decref(root);
    free(buf);
    return hand_out(t, s, tok_out);
}

enum ds_status ds_tokenizer_load(const char *path, ds_tokenizer_t **tok_out) {
    *tok_out = NULL;
    struct stat st;
    if (stat(path, &st)) return ds_error_set(DS_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char p[4096];
        if (snprintf(p, sizeof p, "%s/tokenizer.json", path) >= (int)sizeof p)
            return ds_error_set(DS_ERR_ARG, "%s: path too long", path);
        return ds_tokenizer_load_hf(p, tok_out);
    }
    FILE *f;
    enum ds_status s = ds_fopen_regular(path, &f);
    if (s) return s;
    skip_bom(f);
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\r' || c == '\t') {
    }
    fclose(f);
    if (c == '{') return ds_tokenizer_load_hf(path, tok_out);
    return ds_tokenizer_load_tiktoken(path, DS_TOK_SPECIALS_O200K_HARMONY, tok_out);
}

// ---------------------------------------------------------------------------------------------
// queries

int32_t ds_tokenizer_vocab_size(const ds_tokenizer_t *tok) {
    return tok->n_ids;
}

enum ds_tok_source ds_tokenizer_source(const ds_tokenizer_t *tok) {
    return tok->source;
}

int ds_tokenizer_uses_jit(const ds_tokenizer_t *tok) {
    return tok->jit;
}

enum ds_status ds_tokenizer_special_id(const ds_tokenizer_t *tok, const char *name,
                                       int32_t *id_out) {
    *id_out = -1;
    size_t n = strlen(name);
    for (int32_t id = 0; id < tok->n_ids; id++)
        if (tok->special[id] && tok->tok_len[id] == n &&
            !memcmp(tok->blob.data + tok->tok_off[id], name, n)) {
            *id_out = id;
            return DS_OK;
        }
    return ds_error_set(DS_ERR_RANGE, "tokenizer: no special token %s", name);
}

int ds_tokenizer_is_special(const ds_tokenizer_t *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && tok->special[id];
}

const char *ds_tokenizer_token_bytes(const ds_tokenizer_t *tok, int32_t id, size_t *len_out) {
    *len_out = 0;
    if (id < 0 || id >= tok->n_ids || tok->tok_off[id] == UNASSIGNED) return NULL;
    *len_out = tok->tok_len[id];
    return tok->blob.data + tok->tok_off[id];
}

// ---------------------------------------------------------------------------------------------
// encoding

static inline void pair_rank(const ds_tokenizer_t *t, const char *piece, struct part *parts,
                             size_t m, size_t i) {
    if (i + 1 >= m) {
        parts[i].rank = NO_RANK;
        return;
    }
    if (t->pairs) {
        const struct pair_slot *ps = lookup_pair(t, parts[i].id, parts[i + 1].id);
        parts[i].rank = ps ? ps->rank : NO_RANK;
        parts[i].merged = ps ? ps->merged : -1;
    } else {
        uint32_t end = i + 2 < m ? parts[i + 2].start : parts[m].start;
        int32_t id = lookup_bytes(t, piece + parts[i].start, end - parts[i].start);
        parts[i].rank = id < 0 ? NO_RANK : (uint32_t)id;
        parts[i].merged = id;
    }
}

// Pieces longer than this use the heap: the scan below is O(n^2) and a 20 kB run of letters
// would take seconds. Both give the same merges (lowest rank, then leftmost).
#define LONG_PIECE 256

static inline int heap_less(const struct heap_entry *a, const struct heap_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct heap_entry *h, size_t *n, struct heap_entry e) {
    size_t i = (*n)++;
    while (i > 0 && heap_less(&e, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static struct heap_entry heap_pop(struct heap_entry *h, size_t *n) {
    struct heap_entry top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

// Pushes the merge of the part at pos with its right neighbour, if the vocabulary has one.
static void push_merge(const ds_tokenizer_t *t, ds_tok_workspace_t *ws, const char *piece,
                       uint32_t n, uint32_t pos, size_t *hn) {
    uint32_t r = ws->nxt[pos];
    if (r >= n) return;
    uint32_t rank;
    int32_t merged;
    if (t->pairs) {
        const struct pair_slot *ps = lookup_pair(t, ws->pid[pos], ws->pid[r]);
        rank = ps ? ps->rank : NO_RANK;
        merged = ps ? ps->merged : -1;
    } else {
        merged = lookup_bytes(t, piece + pos, ws->nxt[r] - pos);
        rank = merged < 0 ? NO_RANK : (uint32_t)merged;
    }
    if (rank == NO_RANK) return;
    ws->mrg[pos] = merged;
    heap_push(ws->heap, hn, (struct heap_entry){rank, pos, ws->ver[pos]});
}

static enum ds_status bpe_long(const ds_tokenizer_t *t, ds_tok_workspace_t *ws, const char *piece,
                               size_t len, struct ds_token_vec *out) {
    if (len >= UINT32_MAX / 4)
        return ds_error_set(DS_ERR_RANGE, "tokenizer: a %zu-byte piece is too long", len);
    if (len > ws->long_cap) {
        size_t cap = ws->long_cap ? ws->long_cap : 1024;
        while (cap < len) cap *= 2;
        free(ws->nxt);
        free(ws->prv);
        free(ws->ver);
        free(ws->pid);
        free(ws->mrg);
        free(ws->heap);
        ws->nxt = malloc(cap * sizeof *ws->nxt);
        ws->prv = malloc(cap * sizeof *ws->prv);
        ws->ver = malloc(cap * sizeof *ws->ver);
        ws->pid = malloc(cap * sizeof *ws->pid);
        ws->mrg = malloc(cap * sizeof *ws->mrg);
        ws->heap = malloc(3 * cap * sizeof *ws->heap); // n - 1 initial + 2 per merge
        ws->long_cap = cap;
        if (!ws->nxt || !ws->prv || !ws->ver || !ws->pid || !ws->mrg || !ws->heap) {
            ws->long_cap = 0;
            return ds_error_set(DS_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte piece",
                                len);
        }
    }
    uint32_t n = (uint32_t)len;
    for (uint32_t i = 0; i < n; i++) {
        ws->nxt[i] = i + 1;
        ws->prv[i] = i - 1; // wraps for i = 0, never read there
        ws->ver[i] = 0;
        ws->pid[i] = t->byte_id[(unsigned char)piece[i]];
    }
    size_t hn = 0;
    for (uint32_t i = 0; i + 1 < n; i++) push_merge(t, ws, piece, n, i, &hn);
    while (hn) {
        struct heap_entry e = heap_pop(ws->heap, &hn);
        uint32_t i = e.pos;
        if (ws->pid[i] < 0 || ws->ver[i] != e.ver) continue; // stale
        uint32_t r = ws->nxt[i];
        ws->pid[i] = ws->mrg[i];
        ws->nxt[i] = ws->nxt[r];
        if (ws->nxt[r] < n) ws->prv[ws->nxt[r]] = i;
        ws->pid[r] = -1;
        ws->ver[i]++;
        push_merge(t, ws, piece, n, i, &hn);
        if (i > 0) { // the left neighbour's pair changed too
            uint32_t p = ws->prv[i];
            ws->ver[p]++;
            push_merge(t, ws, piece, n, p, &hn);
        }
    }
    size_t m = 0;
    for (uint32_t i = 0; i < n; i = ws->nxt[i]) m++;
    enum ds_status s = ds_token_vec_reserve(out, m);
    if (s) return s;
    for (uint32_t i = 0; i < n; i = ws->nxt[i]) out->ids[out->n++] = ws->pid[i];
    return DS_OK;
}

// BPE over one piece; appends its ids. parts has room for n + 1 entries.
static enum ds_status bpe_piece(const ds_tokenizer_t *t, ds_tok_workspace_t *ws, const char *piece,
                                size_t n, struct ds_token_vec *out) {
    if (t->whole_piece_lookup) {
        int32_t id = lookup_bytes(t, piece, n);
        if (id >= 0) return ds_token_vec_push(out, id);
    }
    if (n == 1) return ds_token_vec_push(out, t->byte_id[(unsigned char)piece[0]]);
    if (n > LONG_PIECE) return bpe_long(t, ws, piece, n, out);
    if (n + 1 > ws->parts_cap) {
        size_t cap = ws->parts_cap;
        while (cap < n + 1) cap *= 2;
        struct part *p = realloc(ws->parts, cap * sizeof *p);
        if (!p) return ds_error_set(DS_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte piece",
                                    n);
        ws->parts = p;
        ws->parts_cap = cap;
    }
    struct part *parts = ws->parts;
    size_t m = n; // parts[m].start = n is the end sentinel
    for (size_t i = 0; i <= n; i++) {
        parts[i].start = (uint32_t)i;
        parts[i].id = i < n ? t->byte_id[(unsigned char)piece[i]] : -1;
    }
    for (size_t i = 0; i < m; i++) pair_rank(t, piece, parts, m, i);
    for (;;) {
        uint32_t best = NO_RANK;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (parts[i].rank < best) {
                best = parts[i].rank;
                bi = i;
            }
        if (best == NO_RANK) break;
        parts[bi].id = parts[bi].merged;
        memmove(&parts[bi + 1], &parts[bi + 2], (m - bi - 1) * sizeof *parts);
        m--;
        pair_rank(t, piece, parts, m, bi);
        if (bi > 0) pair_rank(t, piece, parts, m, bi - 1);
    }
    enum ds_status s = ds_token_vec_reserve(out, m);
    if (s) return s;
    for (size_t i = 0; i < m; i++) out->ids[out->n++] = parts[i].id;
    return DS_OK;
}

enum ds_status ds_tokenizer_encode(const ds_tokenizer_t *tok, ds_tok_workspace_t *ws,
                                   const char *text, size_t len, struct ds_token_vec *out) {
    if (!ws) ws = tok->own_ws;
    size_t valid = ds_utf8_valid_prefix(text, len);
    if (valid != len)
        return ds_error_set(DS_ERR_FORMAT, "tokenizer: invalid UTF-8 at byte offset %zu of the "
                            "text (text must be valid UTF-8)", valid);
    size_t n0 = out->n;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ws->md);
    size_t off = 0;
    enum ds_status s = DS_OK;
    while (off < len && !s) {
        int rc;
        if (tok->jit) {
            rc = pcre2_jit_match(tok->re, (PCRE2_SPTR)text, len, off, 0, ws->md, ws->mctx);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) // retry this match in the interpreter
                rc = pcre2_match(tok->re, (PCRE2_SPTR)text, len, off,
                                 PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, ws->md, ws->mctx);
        } else {
            rc = pcre2_match(tok->re, (PCRE2_SPTR)text, len, off, PCRE2_NO_UTF_CHECK, ws->md,
                             ws->mctx);
        }
        size_t ms, me;
        if (rc == PCRE2_ERROR_NOMATCH) {
            ms = me = len;
        } else if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            s = ds_error_set(DS_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer failed at byte %zu: %s",
                             off, (const char *)msg);
            break;
        } else {
            ms = ov[0];
            me = ov[1];
        }
        // Text the pattern skips (impossible with o200k's pattern, which covers every character)
        // is still encoded, so that decode(encode(x)) == x always holds.
        if (ms > off) s = bpe_piece(tok, ws, text + off, ms - off, out);
        if (!s && me > ms) s = bpe_piece(tok, ws, text + ms, me - ms, out);
        if (me == ms && ms < len) { // an empty match: step over one character
            int inc;
            size_t k = utf8_char((const unsigned char *)text + ms, len - ms, &inc);
            me = ms + (k ? k : 1);
            if (!s) s = bpe_piece(tok, ws, text + ms, me - ms, out);
        }
        off = me;
    }
    if (s) out->n = n0;
    return s;
}

// ---------------------------------------------------------------------------------------------
// decoding

// Appends the bytes of ids[0..n) to *out, as they are (us NULL) or as whole UTF-8 characters
// with invalid sequences replaced (through *us).
static enum ds_status decode_ids(const ds_tokenizer_t *tok, const int32_t *ids, size_t n,
                                 struct ds_utf8_stream *us, struct ds_byte_vec *out) {
    size_t n0 = out->n;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *b = ds_tokenizer_token_bytes(tok, ids[i], &len);
        if (!b) {
            out->n = n0;
            if (out->data) out->data[n0] = '\0';
            return ds_error_set(DS_ERR_RANGE, "tokenizer: id %d at position %zu is not in the "
                                "vocabulary (size %d)", ids[i], i, tok->n_ids);
        }
        enum ds_status s = us ? ds_utf8_stream_feed(us, b, len, out)
                              : ds_byte_vec_append(out, b, len);
        if (s) return s;
    }
    enum ds_status s = us ? ds_utf8_stream_finish(us, out) : DS_OK;
    return s ? s : ds_byte_vec_append(out, "", 0);
}

enum ds_status ds_tokenizer_decode(const ds_tokenizer_t *tok, const int32_t *ids, size_t n,
                                   struct ds_byte_vec *out) {
    return decode_ids(tok, ids, n, NULL, out);
}

enum ds_status ds_tokenizer_decode_text(const ds_tokenizer_t *tok, const int32_t *ids, size_t n,
                                        struct ds_byte_vec *out) {
    struct ds_utf8_stream us = {0};
    return decode_ids(tok, ids, n, &us, out);
}
