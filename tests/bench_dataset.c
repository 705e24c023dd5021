// bench_dataset: loading and sampling a file of ShareGPT V3's structure and conversation count
// (94,145; the synthetic file below is 649 MB, 649,418,518 bytes, docs/datasets.md); the goal is
// under 10 s and under 2 GB on a 2-core machine.
//
// usage: bench_dataset [--file F] [--synth F] [--conversations N]   (--help; bad options exit 2)
// Without --file, a synthetic file of that size and structure (a pretty-printed JSON array of
// {"id", "conversations": [{"from", "value"}]} with the real file's mix of turn counts, empty
// conversations, system messages, escapes and non-ASCII text) is generated at --synth (default
// /tmp/ds_sharegpt_v3_synth.json) unless it exists already. It is never written into the repo.
//
// Prints, for each step: wall time, the process's peak RSS so far (getrusage), records, selected
// and skipped counts. The steps run in one process, in order of growing memory: first 1000 in
// file order, a seeded shuffle of 1000, then every conversation with every turn.
#include "ds/cli.h"
#include "ds/dataset.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

// --conversations at most: a generated file holds about 7 kB a conversation.
#define BENCH_MAX_CONVERSATIONS 1000000

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; // KiB on Linux
}

static uint64_t rng_state = 0x1234567;
static uint64_t rnd(void) { // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static const char *const words[] = {
    "the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "for", "on", "with", "as",
    "function", "return", "data", "model", "user", "marketing", "strategy", "python", "example",
    "caf\xC3\xA9", "na\xC3\xAFve", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", "\\\"quoted\\\"",
    "x = 1;", "{key: value}", "1.", "2.", "**bold**", "`code`", "\xF0\x9F\x98\x80", "can't",
};

// Appends about `len` bytes of escaped JSON string content.
static void text(FILE *f, size_t len) {
    size_t n = 0;
    while (n < len) {
        const char *w = words[rnd() % (sizeof words / sizeof words[0])];
        fputs(w, f);
        n += strlen(w);
        uint64_t r = rnd() % 20;
        const char *sep = r == 0 ? "\\n\\n" : r == 1 ? ", " : r == 2 ? ". " : " ";
        fputs(sep, f);
        n += strlen(sep);
    }
}

// A length with a heavy tail around `mean`.
static size_t length(size_t mean) {
    uint64_t r = rnd() % 100;
    return r < 60 ? mean / 4 + rnd() % (mean / 2 + 1)
                  : r < 90 ? mean / 2 + rnd() % (mean + 1) : mean + rnd() % (4 * mean + 1);
}

static int generate(const char *path, size_t n_conv) {
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    setvbuf(f, NULL, _IOFBF, 1 << 22);
    fputs("[\n", f);
    for (size_t i = 0; i < n_conv; i++) {
        uint64_t r = rnd() % 1000;
        // Turn counts as in the public file: ~0.7% empty, ~0.8% one message, mostly 2..16.
        size_t msgs = r < 7 ? 0 : r < 15 ? 1 : 2 * (1 + rnd() % 8);
        fprintf(f, "  {\n    \"id\": \"synth%07zu_%d\",\n    \"conversations\": [", i,
                (int)(rnd() % 10));
        int system = rnd() % 500 == 0;
        for (size_t m = 0; m < msgs + (size_t)system; m++) {
            const char *from = system && m == 0 ? "system" : ((m - (size_t)system) % 2 ? "gpt"
                                                                                      : "human");
            fprintf(f, "%s\n      {\n        \"from\": \"%s\",\n        \"value\": \"",
                    m ? "," : "", from);
            text(f, !strcmp(from, "gpt") ? length(1350) : length(230));
            fputs("\"\n      }", f);
        }
        fprintf(f, "%s]\n  }%s\n", msgs ? "\n    " : "", i + 1 < n_conv ? "," : "");
    }
    fputs("]\n", f);
    return fclose(f) != 0;
}

static int step(const char *label, const char *path, const struct ds_dataset_options *opt) {
    double t0 = now();
    ds_dataset_t *ds = NULL;
    if (ds_dataset_open(path, opt, &ds)) {
        printf("%-26s failed after %.2f s: %s\n", label, now() - t0, ds_error_last());
        return 1;
    }
    double t = now() - t0;
    const struct ds_dataset_stats *st = ds_dataset_stats(ds);
    printf("%-26s %6.2f s  peak RSS %7.0f MB  records %zu, examined %zu, selected %zu, "
           "requests %zu, skipped %zu empty + %zu malformed\n", label, t, peak_rss_mb(),
           st->records, st->examined, st->selected, st->requests, st->skipped_empty,
           st->skipped_malformed);
    ds_dataset_release(ds);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_dataset [--file F] [--synth F] [--conversations N]\n\n"
               "  --file F           time loading F (a ShareGPT JSON or JSONL file) instead of\n"
               "                     the synthetic file\n"
               "  --synth F          where the synthetic file is, or is generated when missing\n"
               "                     (default /tmp/ds_sharegpt_v3_synth.json)\n"
               "  --conversations N  conversations of a generated file, 1..%d (default 94145;\n"
               "                     an existing --synth file is used as it is)\n",
            BENCH_MAX_CONVERSATIONS);
}

// A usage error: one line, then the usage text; exit status 2.
static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "bench_dataset: %s '%s'\n\n", what, arg);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    const char *file = NULL, *synth = "/tmp/ds_sharegpt_v3_synth.json";
    size_t n_conv = 94145;
    bool conv_given = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        }
        const bool known = !strcmp(o, "--file") || !strcmp(o, "--synth") ||
                           !strcmp(o, "--conversations");
        if (!known) return usage_error("unknown option", o);
        // A missing value was skipped before, and the benchmark ran on the defaults.
        if (i + 1 == argc) return usage_error("missing value for", o);
        const char *v = argv[++i];
        long long n;
        char msg[96];
        if (!strcmp(o, "--file")) {
            file = v;
        } else if (!strcmp(o, "--synth")) {
            synth = v;
        } else if (ds_cli_int_opt(o, v, 1, BENCH_MAX_CONVERSATIONS, &n, msg, sizeof msg)) {
            n_conv = (size_t)n;
            conv_given = true;
        } else { // atol took "abc" as 0 and wrote an empty file
            char what[128];
            snprintf(what, sizeof what, "%s, got", msg);
            return usage_error(what, v);
        }
    }
    struct stat st;
    if (!file) {
        file = synth;
        if (conv_given && !stat(file, &st)) // said, so a changed count is not silently ignored
            printf("--conversations %zu ignored: %s exists and is used as it is (remove it to "
                   "generate it again)\n", n_conv, file);
        if (stat(file, &st)) {
            double t0 = now();
            if (generate(file, n_conv)) {
                fprintf(stderr, "%s: cannot write the synthetic file\n", file);
                return 1;
            }
            printf("generated %s in %.1f s\n", file, now() - t0);
        }
    }
    if (stat(file, &st)) {
        fprintf(stderr, "%s: not found\n", file);
        return 1;
    }
    printf("file %s: %.1f MB\n", file, (double)st.st_size / 1e6);
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.num_conversations = 1000;
    int bad = step("first 1000 (file order)", file, &opt);
    opt.order = DS_ORDER_SHUFFLE;
    opt.seed = 0;
    bad |= step("shuffle 1000 (seed 0)", file, &opt);
    opt.order = DS_ORDER_FILE;
    opt.num_conversations = 0;
    opt.turns = DS_TURNS_ALL;
    bad |= step("all, every turn", file, &opt);
    return bad;
}
