// ds/tokenizer.h: byte-level BPE tokenizer (o200k_harmony and Hugging Face tokenizer.json).
//
// Two sources are accepted:
//   - a tiktoken ranks file ("base64(bytes) rank" per line, e.g. o200k_base.tiktoken) plus a named
//     set of special tokens (DS_TOK_SPECIALS_O200K_HARMONY: openai/harmony's table);
//   - a Hugging Face tokenizer.json with model.type "BPE" (GPT-2 byte-level alphabet in the vocab,
//     merges as "a b" strings or ["a", "b"] pairs, the pre-tokenizer Split regex or a ByteLevel
//     pre-tokenizer with use_regex, added_tokens).
//
// Encoding: the text is split into pieces by the pre-tokenizer regex (PCRE2, UTF + UCP, JIT when
// available, the interpreter otherwise); each piece is looked up whole, then merged by BPE. A
// tiktoken source merges the adjacent pair whose concatenated bytes have the lowest rank; a
// tokenizer.json source merges the pair listed first in "merges". Special tokens are never
// produced from text: "<|end|>" in user text is tokenized as ordinary characters. Special tokens
// enter a sequence only by id (the harmony renderer looks them up by name).
//
// Decoding: ids map to their exact bytes (a special token to its name). A token may end in the
// middle of a UTF-8 character; struct ds_utf8_stream turns a byte stream into whole characters.
//
// Thread safety: a loaded ds_tokenizer_t is read-only and may be shared by threads, provided each
// thread encodes with its own ds_tok_workspace_t. Passing ws = NULL uses a workspace owned by the
// tokenizer: such calls must not run concurrently on one tokenizer.
#ifndef DS_TOKENIZER_H
#define DS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_tokenizer ds_tokenizer_t;
typedef struct ds_tok_workspace ds_tok_workspace_t;

// A growable array of token ids. Zero-initialize it ({0}); ds_token_vec_free releases it.
struct ds_token_vec {
    int32_t *ids;
    size_t n;
    size_t cap;
};

// A growable byte string, always NUL-terminated after a successful append (data may hold NULs).
struct ds_byte_vec {
    char *data;
    size_t n;
    size_t cap;
};

// Which special tokens a tiktoken ranks file is completed with.
enum ds_tok_specials {
    DS_TOK_SPECIALS_NONE = 0,          // ranks only; vocabulary size = highest rank + 1
    DS_TOK_SPECIALS_O200K_HARMONY = 1, // harmony's table: 199998..201087, vocab 201088
};

// Where the tokenizer came from (ds_tokenizer_source).
enum ds_tok_source {
    DS_TOK_SOURCE_TIKTOKEN = 0, // ranks by concatenated bytes
    DS_TOK_SOURCE_HF_JSON = 1,  // ranks by merge order
};

// Loads a tiktoken ranks file. Errors name the file and line: bad base64, bad or duplicate rank
// (DS_ERR_FORMAT), unreadable file (DS_ERR_IO). *tok_out is NULL on failure.
enum ds_status ds_tokenizer_load_tiktoken(const char *path, enum ds_tok_specials specials,
                                          ds_tokenizer_t **tok_out);

// Loads a Hugging Face tokenizer.json. Unsupported features (a normalizer, a non-BPE model,
// add_prefix_space, byte_fallback) give DS_ERR_UNSUPPORTED; malformed JSON gives DS_ERR_FORMAT
// with the line and column. *tok_out is NULL on failure.
enum ds_status ds_tokenizer_load_hf(const char *path, ds_tokenizer_t **tok_out);

// Loads whatever `path` is: a directory (its tokenizer.json), a JSON file (tokenizer.json) or a
// tiktoken ranks file (completed with the o200k_harmony specials).
enum ds_status ds_tokenizer_load(const char *path, ds_tokenizer_t **tok_out);

// Releases a tokenizer and its own workspace. NULL is a no-op.
void ds_tokenizer_release(ds_tokenizer_t *tok);

// Number of ids (highest id + 1). Ids inside that range may be unassigned (gaps in a ranks file).
int32_t ds_tokenizer_vocab_size(const ds_tokenizer_t *tok);

enum ds_tok_source ds_tokenizer_source(const ds_tokenizer_t *tok);

// Whether the pre-tokenizer runs on PCRE2's JIT (1) or its interpreter (0).
int ds_tokenizer_uses_jit(const ds_tokenizer_t *tok);

// The id of a special token by its exact name ("<|start|>"). DS_ERR_RANGE (with a message naming
// the token) when the tokenizer has no such special token; *id_out is -1 then.
enum ds_status ds_tokenizer_special_id(const ds_tokenizer_t *tok, const char *name,
                                       int32_t *id_out);

// Whether `id` is a special token (1) or not / out of range (0).
int ds_tokenizer_is_special(const ds_tokenizer_t *tok, int32_t id);

// The bytes of one token (a special token's name), not NUL-terminated; NULL with *len_out = 0 for
// an id out of range or unassigned. The pointer lives as long as the tokenizer.
const char *ds_tokenizer_token_bytes(const ds_tokenizer_t *tok, int32_t id, size_t *len_out);

// A workspace holds the regex match state and the BPE buffers of one encoding thread. It grows
// to the longest piece seen and is otherwise reused: encoding allocates nothing per piece.
enum ds_status ds_tok_workspace_create(const ds_tokenizer_t *tok, ds_tok_workspace_t **ws_out);
void ds_tok_workspace_release(ds_tok_workspace_t *ws);

// Encodes `len` bytes of UTF-8 text and appends the ids to *out. Text must be valid UTF-8
// (DS_ERR_FORMAT naming the byte offset otherwise; nothing is appended then). ws may be NULL
// (see thread safety above). On failure *out keeps its previous length.
enum ds_status ds_tokenizer_encode(const ds_tokenizer_t *tok, ds_tok_workspace_t *ws,
                                   const char *text, size_t len, struct ds_token_vec *out);

// Appends the bytes of ids[0..n) to *out (special tokens as their names). DS_ERR_RANGE for an id
// outside the vocabulary or unassigned; *out keeps its previous length then.
enum ds_status ds_tokenizer_decode(const ds_tokenizer_t *tok, const int32_t *ids, size_t n,
                                   struct ds_byte_vec *out);
// The same as text: every invalid UTF-8 sequence (a character that a token boundary or the end
// cut short included) becomes U+FFFD, as tiktoken's decode(errors="replace"). What a client of
// an engine receives as a reply, and what a later turn's prompt is rendered from.
enum ds_status ds_tokenizer_decode_text(const ds_tokenizer_t *tok, const int32_t *ids, size_t n,
                                        struct ds_byte_vec *out);

// Turns a byte stream into whole UTF-8 characters: bytes of a character split across tokens are
// held until the character completes. Invalid sequences become U+FFFD (as tiktoken's
// errors="replace"). Zero-initialize it.
struct ds_utf8_stream {
    unsigned char pending[4];
    int n_pending;
};

// Appends the complete characters of (pending + bytes) to *out and keeps an incomplete tail.
enum ds_status ds_utf8_stream_feed(struct ds_utf8_stream *s, const char *bytes, size_t len,
                                   struct ds_byte_vec *out);
// Flushes a dangling incomplete tail as U+FFFD.
enum ds_status ds_utf8_stream_finish(struct ds_utf8_stream *s, struct ds_byte_vec *out);

// Length of the longest valid UTF-8 prefix of s[0..len); equals len when s is valid.
size_t ds_utf8_valid_prefix(const char *s, size_t len);

// Appends bytes in a readable form for terminals: valid UTF-8 characters as they are; newline,
// tab, carriage return and backslash as \n \t \r \\; other control bytes and bytes that are not
// part of a valid character (a token ending inside a character) as \xNN.
enum ds_status ds_bytes_escape(const char *bytes, size_t len, struct ds_byte_vec *out);

// Vector helpers. They return DS_ERR_NOMEM when growth fails (the vector is unchanged then).
enum ds_status ds_token_vec_push(struct ds_token_vec *v, int32_t id);
enum ds_status ds_token_vec_reserve(struct ds_token_vec *v, size_t extra);
void ds_token_vec_free(struct ds_token_vec *v);
enum ds_status ds_byte_vec_append(struct ds_byte_vec *v, const void *bytes, size_t len);
void ds_byte_vec_free(struct ds_byte_vec *v);

#ifdef __cplusplus
}
#endif
#endif // DS_TOKENIZER_H
