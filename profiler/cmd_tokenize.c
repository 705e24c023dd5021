// draftscope tokenize: shows how a text is tokenized (ids and the bytes of each token), or decodes
// ids, for people checking a tokenizer or their data. Special tokens are shown by name.
#include "ds/cli.h"
#include "ds/tokenizer.h"

#include <errno.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: draftscope tokenize --tokenizer PATH [--text TEXT | --file F] [--ids]\n"
            "       draftscope tokenize --tokenizer PATH --decode ID[,ID...]\n\n"
            "  --tokenizer PATH  a checkpoint directory (its tokenizer.json), a tokenizer.json,\n"
            "                    or a tiktoken ranks file (o200k_harmony specials added);\n"
            "                    default: $DS_TOKENIZER\n"
            "  --text TEXT       the text to encode (default: standard input)\n"
            "  --file F          encode the contents of F\n"
            "  --ids             print only the ids, one line, space-separated\n"
            "  --decode IDS      print the text of comma- or space-separated ids\n");
}

static int read_stream(FILE *in, struct ds_byte_vec *out) {
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (ds_byte_vec_append(out, buf, n)) return 1;
    if (ferror(in)) return 1; // a directory reads as EISDIR: not an empty text
    return ds_byte_vec_append(out, "", 0) != DS_OK;
}

static int decode_ids(const ds_tokenizer_t *tok, const char *list) {
    struct ds_token_vec ids = {0};
    struct ds_byte_vec text = {0};
    int rc = 0;
    enum ds_status st = ds_cli_parse_ids("--decode", list, (long long)INT32_MAX + 1, &ids);
    if (st != DS_OK) { // a malformed or out-of-range list is a usage error
        fprintf(stderr, "draftscope tokenize: %s\n", ds_error_last());
        rc = st == DS_ERR_NOMEM ? 1 : 2;
        goto cleanup;
    }
    if (ds_tokenizer_decode(tok, ids.ids, ids.n, &text)) {
        fprintf(stderr, "draftscope tokenize: %s\n", ds_error_last());
        rc = 1;
        goto cleanup;
    }
    fwrite(text.data, 1, text.n, stdout);
    fputc('\n', stdout);
cleanup:
    ds_token_vec_free(&ids);
    ds_byte_vec_free(&text);
    return rc;
}

int ds_cmd_tokenize(int argc, char **argv) {
    const char *tok_path = getenv("DS_TOKENIZER"), *text = NULL, *file = NULL, *decode = NULL;
    int ids_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **target = !strcmp(a, "--tokenizer") ? &tok_path
                              : !strcmp(a, "--text")    ? &text
                              : !strcmp(a, "--file")    ? &file
                              : !strcmp(a, "--decode")  ? &decode
                                                        : NULL;
        if (target && i + 1 < argc) {
            *target = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            ids_only = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            // The argument as typed, its bytes escaped (a text argument may be any bytes).
            struct ds_byte_vec shown = {0};
            ds_bytes_escape(a, strlen(a), &shown);
            const bool stray = !target && a[0] != '-';
            const char *what = target  ? "missing value for"
                               : stray ? "unexpected argument"
                                       : "unknown option";
            fprintf(stderr, "draftscope tokenize: %s '%s'%s\n\n", what,
                    shown.data ? shown.data : "",
                    stray ? " (give the text with --text or --file, or on standard input)" : "");
            ds_byte_vec_free(&shown);
            usage(stderr);
            return 2;
        }
    }
    if (!tok_path || (text && file)) {
        fprintf(stderr, "draftscope tokenize: %s\n\n",
                !tok_path ? "--tokenizer is required" : "--text and --file exclude each other");
        usage(stderr);
        return 2;
    }
    ds_tokenizer_t *tok = NULL;
    struct ds_byte_vec input = {0};
    struct ds_token_vec ids = {0};
    struct ds_byte_vec shown = {0};
    int rc = 0;
    if (ds_tokenizer_load(tok_path, &tok)) {
        fprintf(stderr, "draftscope tokenize: %s\n", ds_error_last());
        return 1;
    }
    if (decode) {
        rc = decode_ids(tok, decode);
        goto cleanup;
    }
    if (text) {
        ds_byte_vec_append(&input, text, strlen(text));
    } else {
        FILE *in = file ? fopen(file, "rb") : stdin;
        if (!in) {
            fprintf(stderr, "draftscope tokenize: %s: cannot open\n", file);
            rc = 1;
            goto cleanup;
        }
        errno = 0;
        int bad = read_stream(in, &input);
        const int err = errno;
        if (file) fclose(in);
        if (bad) {
            fprintf(stderr, "draftscope tokenize: %s: read error: %s\n", file ? file : "stdin",
                    err ? strerror(err) : "out of memory");
            rc = 1;
            goto cleanup;
        }
    }
    if (ds_tokenizer_encode(tok, NULL, input.data ? input.data : "", input.n, &ids)) {
        fprintf(stderr, "draftscope tokenize: %s: %s\n", file ? file : text ? "--text" : "stdin",
                ds_error_last());
        rc = 1;
        goto cleanup;
    }
    for (size_t i = 0; i < ids.n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", ids.ids[i]);
            continue;
        }
        size_t len;
        const char *b = ds_tokenizer_token_bytes(tok, ids.ids[i], &len);
        shown.n = 0;
        ds_bytes_escape(b, len, &shown);
        printf("%6zu %7d  %s\n", i, ids.ids[i], shown.data ? shown.data : "");
    }
    if (ids_only)
        putchar('\n');
    else
        printf("%zu tokens, %zu bytes\n", ids.n, input.n);
cleanup:
    ds_byte_vec_free(&input);
    ds_byte_vec_free(&shown);
    ds_token_vec_free(&ids);
    ds_tokenizer_release(tok);
    return rc;
}
