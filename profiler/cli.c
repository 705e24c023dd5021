// Shared by the subcommands' option parsers (ds/cli.h): number parsing, and which input an output
// path would replace.
#include "ds/cli.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

bool ds_cli_parse_ll(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    // strtoll skips blanks and takes a '+': an optional '-', then digits only.
    const char *d = *s == '-' ? s + 1 : s;
    if (*d < '0' || *d > '9') return false;
    const long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool ds_cli_int_opt(const char *opt, const char *s, long long lo, long long hi, long long *out,
                    char *msg, size_t cap) {
    if (ds_cli_parse_ll(s, lo, hi, out)) return true;
    // The whole range, so that a value refused for being too large is not told "wants >= 1".
    snprintf(msg, cap, "%s wants an integer in %lld..%lld", opt, lo, hi);
    return false;
}

bool ds_cli_parse_ull(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    // strtoull accepts a sign (and wraps "-1"): digits only.
    if (*s < '0' || *s > '9') return false;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

int ds_cli_parse_list(const char *s, long long lo, long long hi, long long *out, int cap, int *n) {
    int k = 0;
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        long long v;
        if (len >= sizeof item) return -1; // an empty entry fails the parse below
        memcpy(item, p, len), item[len] = 0;
        if (!ds_cli_parse_ll(item, lo, hi, &v)) return -1;
        if (k == cap) return -2;
        out[k++] = v;
        if (!comma) break;
        p = comma + 1;
    }
    *n = k;
    return 0;
}

static bool same_file(const struct stat *a, const char *path) {
    struct stat b;
    return path && stat(path, &b) == 0 && a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

// A file directly in dir (a checkpoint's config, shards, tokenizer) that is *sb.
static bool dir_holds(const char *dir, const struct stat *sb) {
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return false;
    bool found = false;
    char path[PATH_MAX];
    for (struct dirent *e; !found && (e = readdir(d));)
        found = snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path &&
                same_file(sb, path);
    closedir(d);
    return found;
}

const char *ds_cli_input_name(const char *out, const char *dataset, const char *tokenizer,
                              const char *target, const char *draft) {
    struct stat sb;
    if (!out || stat(out, &sb) != 0) return NULL; // a new file replaces nothing
    if (same_file(&sb, dataset)) return "the dataset";
    if (same_file(&sb, tokenizer)) return "the tokenizer";
    if (dir_holds(target, &sb)) return "a file of the target";
    if (dir_holds(draft, &sb)) return "a file of the draft";
    return NULL;
}
