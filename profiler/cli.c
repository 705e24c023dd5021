// Shared by the subcommands' option parsers (ds/cli.h): number parsing, and the check of an output
// path (never one of the inputs).
#include "ds/cli.h"
#include "ds/gptoss.h"
#include "ds/status.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

int ds_cli_synthetic(const char *arg, bool with_draft, struct ds_synthetic_spec *spec,
                     struct ds_target_config *tc) {
    if (ds_synthetic_parse(arg, spec)) return 2;
    struct ds_draft_config dc;
    struct stat sb;
    const bool preset = ds_synthetic_is_preset(spec);
    const bool exists = stat(spec->source, &sb) == 0;
    enum ds_status s = ds_synthetic_target_config(spec, tc);
    if (s == DS_OK && with_draft) s = ds_synthetic_draft_config(tc, &dc);
    if (s == DS_OK) return 0;
    return preset || !exists || s == DS_ERR_RANGE || s == DS_ERR_UNSUPPORTED ? 2 : 1;
}

enum ds_status ds_cli_synthetic_device(const char *arg, enum ds_device_kind want,
                                       const struct ds_device_info *info) {
    if (info->kind == DS_DEVICE_CUDA || want == DS_DEVICE_CPU) return DS_OK;
    return ds_error_set(DS_ERR_NODEVICE,
                        "--synthetic-weights %s needs the cuda device: its weights are generated "
                        "on the GPU (no GPU here: %s; --device cpu forces the reference backend, "
                        "practical for small configs only)",
                        arg, info->why_cpu[0] ? info->why_cpu : "no usable CUDA device");
}

int ds_cli_cuda_device(const char *cmd, int device) {
    if (ds_cuda_device_check(device) == DS_OK) return 0;
    fprintf(stderr, "draftscope %s: %s\n", cmd, ds_error_last());
    return 1;
}

enum ds_status ds_cli_parse_ids(const char *opt, const char *s, long long limit,
                                struct ds_token_vec *out) {
    const char *p = s;
    while (*p == ' ') p++;
    if (!*p) return ds_error_set(DS_ERR_ARG, "%s: the list of ids is empty", opt);
    for (;;) {
        if (*p < '0' || *p > '9') { // strtoll would skip blanks and take signs
            const char *what = *p == ',' || !*p ? "an empty entry"
                               : *p == '-'      ? "a negative id"
                                                : "not a digit";
            return ds_error_set(DS_ERR_ARG, "%s: \"%s\" is not a list of ids (%s at offset %d)",
                                opt, s, what, (int)(p - s));
        }
        char *end;
        errno = 0;
        const long long v = strtoll(p, &end, 10);
        if (errno || v >= limit)
            return ds_error_set(DS_ERR_RANGE, "%s: id %.*s outside 0..%lld", opt, (int)(end - p),
                                p, limit - 1);
        enum ds_status st = ds_token_vec_push(out, (int32_t)v);
        if (st != DS_OK) return st;
        p = end;
        while (*p == ' ') p++;
        if (!*p) return DS_OK;
        if (*p == ',') {
            p++;
            while (*p == ' ') p++;
        }
    }
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

// Which input of the command the existing file *sb is, through any link, or NULL.
static const char *input_name(const struct stat *sb, const char *dataset, const char *tokenizer,
                              const char *target, const char *draft) {
    if (same_file(sb, dataset)) return "the dataset";
    if (same_file(sb, tokenizer)) return "the tokenizer";
    // A model is a checkpoint directory, or (--synthetic-weights) a config.json file itself.
    if (same_file(sb, target) || dir_holds(target, sb)) return "a file of the target";
    if (same_file(sb, draft) || dir_holds(draft, sb)) return "a file of the draft";
    return NULL;
}

enum ds_status ds_cli_check_output(const char *path, const char *opt, const char *dataset,
                                   const char *tokenizer, const char *target, const char *draft,
                                   bool in_place, bool *exists) {
    struct stat sb;
    *exists = false;
    if (!*path) // stat("") fails and dirname("") is ".": it would pass as a new file in "."
        return ds_error_set(DS_ERR_IO, "%s: an empty path; give a file path", opt);
    *exists = stat(path, &sb) == 0;
    if (*exists && !S_ISREG(sb.st_mode))
        return ds_error_set(DS_ERR_IO, "%s: not a regular file; give a file path for %s", path,
                            opt);
    const char *input = *exists ? input_name(&sb, dataset, tokenizer, target, draft) : NULL;
    if (input)
        return ds_error_set(DS_ERR_IO, "%s: is %s; %s must name another file", path, input, opt);
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    const char *dir = dirname(buf);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ds_error_set(DS_ERR_IO, "%s: directory %s does not exist", path, dir);
    // A file written in place (--resume) needs only itself writable; a new or replaced one (its
    // removal when the run fails) needs the directory.
    if ((!(*exists && in_place) && access(dir, W_OK) != 0) || (*exists && access(path, W_OK) != 0))
        return ds_error_set(DS_ERR_IO, "%s: not writable (%s)", path, strerror(EACCES));
    return DS_OK;
}

json_t *ds_cli_json_text(const char *t) {
    if (!t) t = "";
    json_t *j = json_string(t);
    if (j) return j;
    const size_t n = strlen(t);
    struct ds_byte_vec v = {0};
    enum ds_status st = DS_OK;
    for (size_t i = 0; i < n && !st;) {
        const size_t k = ds_utf8_valid_prefix(t + i, n - i);
        st = ds_byte_vec_append(&v, t + i, k);
        if ((i += k) >= n || st) break;
        st = ds_byte_vec_append(&v, "\xEF\xBF\xBD", 3);
        i++; // the bad byte, then the continuation bytes that follow it
        while (i < n && ((unsigned char)t[i] & 0xC0) == 0x80) i++;
    }
    j = st ? NULL : json_stringn(v.data ? v.data : "", v.n);
    ds_byte_vec_free(&v);
    return j ? j : json_string("?");
}

double ds_cli_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void ds_cli_bytes_progress(void *user, uint64_t done, uint64_t total) {
    struct ds_cli_bytes_progress *p = user;
    const double now = ds_cli_now_s(), dt = now - p->t0;
    if (p->ended) return; // the final line is written once (a loader may report the total twice)
    if (done < total && (!isatty(STDERR_FILENO) || now - p->last < 0.1)) return;
    p->last = now;
    const double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    if (p->unit)
        fprintf(stderr, "\r%s: %3.0f%% (%llu of %llu %s, %.1f %s/s)", p->label, pct,
                (unsigned long long)done, (unsigned long long)total, p->unit,
                dt > 0 ? (double)done / dt : 0.0, p->unit);
    else
        fprintf(stderr, "\r%s: %3.0f%% (%.2f of %.2f GB, %.2f GB/s)", p->label, pct,
                (double)done / 1e9, (double)total / 1e9, dt > 0 ? (double)done / 1e9 / dt : 0.0);
    p->open = done < total;
    p->ended = !p->open;
    if (p->ended) fputc('\n', stderr);
}

void ds_cli_bytes_progress_end(struct ds_cli_bytes_progress *p) {
    if (p->open) fputc('\n', stderr);
    p->open = 0;
}

enum ds_status ds_cli_plan_fits(const char *device, const struct ds_gptoss_memory *t,
                                const struct ds_gptoss_memory *d, size_t free_bytes) {
    const size_t tb = t->weights + t->kv + t->activations, db = d->weights + d->kv + d->activations;
    if (tb + db <= free_bytes) return DS_OK;
    return ds_error_set(DS_ERR_NOMEM,
                        "%s: the plan does not fit: the target needs %.3f GB (weights %.3f, KV "
                        "%.3f, activations %.3f) and the draft %.3f GB, %.3f GB in all, and %.3f "
                        "GB is free; a lower --max-context or a smaller largest batch size "
                        "shrinks the KV caches (%.3f GB of it)",
                        device, (double)tb / 1e9, (double)t->weights / 1e9, (double)t->kv / 1e9,
                        (double)t->activations / 1e9, (double)db / 1e9, (double)(tb + db) / 1e9,
                        (double)free_bytes / 1e9, (double)(t->kv + d->kv) / 1e9);
}
