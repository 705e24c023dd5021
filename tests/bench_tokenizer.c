// bench_tokenizer: encoding speed of the o200k tokenizer on conversation text, single-threaded.
//
// Corpus: every turn of the Spec-Bench questions (English, code, math, several languages),
// repeated until it holds --mb MB, each turn encoded by its own call (as the renderer does); or,
// with --text F, every line of F as one document. tests/ref/bench_tiktoken.py builds the same
// corpus and times tiktoken on it, so the two MB/s figures compare like with like.
//
// usage: bench_tokenizer [--ranks F] [--questions F] [--text F] [--mb N] [--reps N]
// Prints MB/s and tokens/s for the PCRE2 JIT and for the interpreter fallback.
#include "ds/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct doc {
    const char *text;
    size_t len;
};

struct corpus {
    struct doc *docs;
    size_t n, cap, bytes;
    struct ds_byte_vec store; // owns the texts of --text
};

static void add_doc(struct corpus *c, const char *text, size_t len) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1024;
        c->docs = realloc(c->docs, c->cap * sizeof *c->docs);
        if (!c->docs) exit(1);
    }
    c->docs[c->n++] = (struct doc){text, len};
    c->bytes += len;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(const char *label, const ds_tokenizer_t *tok, const struct corpus *c, int reps) {
    ds_tok_workspace_t *ws = NULL;
    if (ds_tok_workspace_create(tok, &ws)) return;
    struct ds_token_vec ids = {0};
    size_t tokens = 0;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        tokens = 0;
        double t0 = now();
        for (size_t i = 0; i < c->n; i++) {
            ids.n = 0;
            if (ds_tokenizer_encode(tok, ws, c->docs[i].text, c->docs[i].len, &ids)) {
                fprintf(stderr, "encode failed: %s\n", ds_error_last());
                exit(1);
            }
            tokens += ids.n;
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("draftscope %-16s %zu docs, %.2f MB, %zu tokens: best of %d %.3f s = %.2f MB/s, "
           "%.2f M tokens/s\n", label, c->n, (double)c->bytes / 1e6, tokens, reps, best,
           (double)c->bytes / 1e6 / best, (double)tokens / 1e6 / best);
    ds_token_vec_free(&ids);
    ds_tok_workspace_release(ws);
}

int main(int argc, char **argv) {
    const char *ranks = DS_SOURCE_DIR "/tests/data/o200k_base.tiktoken";
    const char *questions = DS_SOURCE_DIR "/tests/data/spec_bench_questions.jsonl";
    const char *text = NULL;
    double mb = 4.0;
    int reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ranks")) ranks = argv[i + 1];
        else if (!strcmp(argv[i], "--questions")) questions = argv[i + 1];
        else if (!strcmp(argv[i], "--text")) text = argv[i + 1];
        else if (!strcmp(argv[i], "--mb")) mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--ranks F] [--questions F] [--text F] [--mb N] "
                    "[--reps N]\n", argv[0]);
            return 2;
        }
    }
    struct corpus c = {0};
    json_t *all = json_array();
    if (text) {
        FILE *f = fopen(text, "rb");
        char buf[1 << 16];
        size_t n;
        while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) ds_byte_vec_append(&c.store, buf, n);
        if (!f) {
            fprintf(stderr, "%s: cannot open\n", text);
            return 1;
        }
        fclose(f);
        for (size_t a = 0; a < c.store.n;) {
            char *nl = memchr(c.store.data + a, '\n', c.store.n - a);
            size_t b = nl ? (size_t)(nl - c.store.data) : c.store.n;
            if (b > a) add_doc(&c, c.store.data + a, b - a);
            a = b + 1;
        }
    } else {
        FILE *f = fopen(questions, "rb");
        char line[1 << 16];
        while (f && fgets(line, sizeof line, f)) {
            json_error_t e;
            json_t *q = json_loads(line, 0, &e);
            json_t *turns = json_object_get(q, "turns");
            for (size_t i = 0; i < json_array_size(turns); i++)
                json_array_append(all, json_array_get(turns, i));
            json_decref(q);
        }
        if (!f) {
            fprintf(stderr, "%s: cannot open\n", questions);
            return 1;
        }
        fclose(f);
        while ((double)c.bytes < mb * 1e6 && json_array_size(all))
            for (size_t i = 0; i < json_array_size(all); i++) {
                json_t *s = json_array_get(all, i);
                add_doc(&c, json_string_value(s), json_string_length(s));
            }
    }
    ds_tokenizer_t *jit = NULL, *interp = NULL;
    double t0 = now();
    if (ds_tokenizer_load_tiktoken(ranks, DS_TOK_SPECIALS_O200K_HARMONY, &jit)) {
        fprintf(stderr, "%s\n", ds_error_last());
        return 1;
    }
    printf("draftscope load             %.3f s (%s)\n", now() - t0, ranks);
    setenv("DS_TOKENIZER_NO_JIT", "1", 1);
    if (ds_tokenizer_load_tiktoken(ranks, DS_TOK_SPECIALS_O200K_HARMONY, &interp)) return 1;
    run(ds_tokenizer_uses_jit(jit) ? "(PCRE2 JIT)" : "(no JIT here)", jit, &c, reps);
    run("(interpreter)", interp, &c, reps);
    ds_tokenizer_release(jit);
    ds_tokenizer_release(interp);
    json_decref(all);
    ds_byte_vec_free(&c.store);
    free(c.docs);
    return 0;
}
