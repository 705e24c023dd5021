// Safetensors checkpoints: mapping, header validation and sharded sets (ds/safetensors.h).
//
// A file is mapped whole (PROT_READ, MAP_PRIVATE) and only its header is parsed: tensor data is
// never read here, so opening a 60 GB checkpoint touches a few pages. A set holds one or more
// mapped files, one arena with every name and metadata string, and the tensor table sorted by
// name (lookup by binary search). Header rules follow the reference implementation where it is
// strict (duplicate keys, UTF-8, string-only metadata) and add the range checks a loader needs;
// gaps between tensors and unknown keys inside an entry are accepted, as the reference does.
#include "ds/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"

// The reference implementation refuses headers above 100 MB; a real 120b header is ~100 KB.
#define HEADER_MAX ((uint64_t)100 << 20)
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define SUFFIX ".safetensors"

struct entry {
    const char *name; // key inside the parsed header (lives as long as the json root)
    enum ds_dtype dtype;
    int ndim;
    int64_t shape[DS_MAX_DIMS];
    uint64_t numel, begin, end;
};

struct header {
    json_t *root;
    struct entry *e; // n entries, in header order
    size_t n;
    json_t *meta; // "__metadata__" object borrowed from root, or NULL
};

struct mapped {
    char *path; // as given by the caller (joined with the directory for shards)
    void *map;  // whole file, read-only
    size_t len;
    uint64_t data_start; // 8 + header length
};

struct ds_safetensors {
    struct mapped *files;
    int nfiles;
    struct ds_tensor_info *t; // n tensors, sorted by name
    size_t n;
    char *arena;       // every tensor name and metadata string, NUL-terminated
    const char **meta; // nmeta (key, value) pairs pointing into arena
    size_t nmeta;
    uint64_t tensor_bytes;
};

// Names come from the file: control bytes are replaced and long names cut so that a message
// stays one readable line.
#define SHOWN_CAP DS_SHOWN_CAP
const char *ds_safetensors_shown(const char *s, char *buf) {
    size_t i = 0;
    for (; s[i] && i < SHOWN_CAP - 4; i++)
        buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (s[i]) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}
#define SHOW(s) ds_safetensors_shown((s), (char[SHOWN_CAP]){0})

// The value's JSON type with its article, for "is an integer, not an object" messages.
static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static enum ds_status json_problem(const char *label, const char *what, const json_error_t *e) {
    switch (json_error_code(e)) {
    case json_error_invalid_utf8:
        return ds_error_set(DS_ERR_FORMAT, "%s: %s is not valid UTF-8 (byte %d)", label, what,
                            e->position);
    case json_error_duplicate_key: {
        // jansson says "duplicate object key near '"k"'"; keep the part that names the key.
        const char *near = strstr(e->text, "near ");
        return ds_error_set(DS_ERR_FORMAT, "%s: %s has a duplicate key %s (byte %d)", label, what,
                            near ? near : "", e->position);
    }
    case json_error_out_of_memory:
        return ds_error_set(DS_ERR_NOMEM, "%s: out of memory parsing the %s", label, what);
    default:
        return ds_error_set(DS_ERR_FORMAT, "%s: %s is not valid JSON: %s (byte %d)", label, what,
                            e->text, e->position);
    }
}

static void shape_str(const struct entry *e, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < e->ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", e->shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

// A non-negative JSON integer (jansson already refuses integers beyond 64 bits).
static int get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static enum ds_status parse_entry(const char *name, const json_t *v, uint64_t data_len,
                                  const char *label, struct entry *e) {
    const char *nm = SHOW(name);
    if (!json_is_object(v))
        return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' entry is %s, not an object", label, nm,
                            json_kind(v));
    e->name = name;

    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' has no \"dtype\" string", label, nm);
    if (ds_dtype_parse(json_string_value(dt), &e->dtype) != DS_OK)
        return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", label, nm,
                            SHOW(json_string_value(dt)));

    const json_t *sh = json_object_get(v, "shape");
    if (!json_is_array(sh))
        return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' has no \"shape\" array", label, nm);
    if (json_array_size(sh) > DS_MAX_DIMS)
        return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' has %zu dims, more than %d", label, nm,
                            json_array_size(sh), DS_MAX_DIMS);
    e->ndim = (int)json_array_size(sh);
    e->numel = 1;
    for (int i = 0; i < e->ndim; i++) {
        const json_t *dim = json_array_get(sh, (size_t)i);
        if (!json_is_integer(dim))
            return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' shape[%d] is %s, not an integer",
                                label, nm, i, json_kind(dim));
        if (json_integer_value(dim) < 0)
            return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' shape[%d] = %lld is negative",
                                label, nm, i, (long long)json_integer_value(dim));
        uint64_t d = (uint64_t)json_integer_value(dim);
        if (d && e->numel > UINT64_MAX / d)
            return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' shape product overflows 64 bits",
                                label, nm);
        e->shape[i] = (int64_t)d;
        e->numel *= d;
    }
    size_t esize = ds_dtype_size(e->dtype);
    if (e->numel > UINT64_MAX / esize)
        return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' byte size overflows 64 bits", label,
                            nm);
    uint64_t nbytes = e->numel * esize;

    const json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !get_u64(json_array_get(off, 0), &e->begin) || !get_u64(json_array_get(off, 1), &e->end))
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: tensor '%s' data_offsets is not [begin, end] of non-negative "
                            "integers",
                            label, nm);
    if (e->begin > e->end)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                            "] begin after end",
                            label, nm, e->begin, e->end);
    if (e->end > data_len)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                            "] end beyond data region of %" PRIu64 " bytes",
                            label, nm, e->begin, e->end, data_len);
    if (e->end - e->begin != nbytes) {
        char shp[DS_MAX_DIMS * 22 + 4];
        shape_str(e, shp, sizeof shp);
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                            " bytes but shape %s of %s needs %" PRIu64,
                            label, nm, e->begin, e->end, e->end - e->begin, shp,
                            ds_dtype_name(e->dtype), nbytes);
    }
    return DS_OK;
}

static int by_begin(const void *a, const void *b) {
    const struct entry *x = *(const struct entry *const *)a, *y = *(const struct entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

// Zero-size tensors occupy no bytes, so they may share offsets with anything.
static enum ds_status check_overlaps(const struct header *h, const char *label) {
    if (h->n < 2) return DS_OK;
    const struct entry **s = malloc(h->n * sizeof *s);
    if (!s) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory checking ranges", label);
    size_t m = 0;
    for (size_t i = 0; i < h->n; i++)
        if (h->e[i].end > h->e[i].begin) s[m++] = &h->e[i];
    qsort(s, m, sizeof *s, by_begin);
    enum ds_status st = DS_OK;
    // Sorted by begin and disjoint so far means the previous end is the largest end so far.
    for (size_t i = 1; i < m && st == DS_OK; i++) {
        if (s[i]->begin < s[i - 1]->end)
            st = ds_error_set(DS_ERR_FORMAT,
                              "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64
                              ", %" PRIu64 "] overlap",
                              label, SHOW(s[i - 1]->name), s[i - 1]->begin, s[i - 1]->end,
                              SHOW(s[i]->name), s[i]->begin, s[i]->end);
    }
    free(s);
    return st;
}

static void header_free(struct header *h) {
    free(h->e);
    json_decref(h->root);
    memset(h, 0, sizeof *h);
}

static enum ds_status parse_header(const char *json, size_t len, uint64_t data_len,
                                   const char *label, struct header *h) {
    memset(h, 0, sizeof *h);
    json_error_t jerr;
    h->root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!h->root) return json_problem(label, "header", &jerr);
    enum ds_status st = DS_OK;
    if (!json_is_object(h->root)) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: header is %s, not a JSON object", label,
                          json_kind(h->root));
        goto cleanup;
    }
    h->e = calloc(json_object_size(h->root) + 1, sizeof *h->e);
    if (!h->e) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory reading the header", label);
        goto cleanup;
    }
    const char *key;
    json_t *val;
    json_object_foreach(h->root, key, val) {
        if (strcmp(key, "__metadata__") != 0) {
            st = parse_entry(key, val, data_len, label, &h->e[h->n]);
            if (st != DS_OK) goto cleanup;
            h->n++;
            continue;
        }
        if (!json_is_object(val)) {
            st = ds_error_set(DS_ERR_FORMAT, "%s: \"__metadata__\" is %s, not an object", label,
                              json_kind(val));
            goto cleanup;
        }
        const char *mk;
        json_t *mv;
        json_object_foreach(val, mk, mv) {
            if (!json_is_string(mv)) {
                st = ds_error_set(DS_ERR_FORMAT,
                                  "%s: \"__metadata__\" value of '%s' is %s, not a string", label,
                                  SHOW(mk), json_kind(mv));
                goto cleanup;
            }
        }
        h->meta = val;
    }
    st = check_overlaps(h, label);
cleanup:
    if (st != DS_OK) header_free(h);
    return st;
}

enum ds_status ds_safetensors_check_header(const char *json, size_t len, uint64_t data_len,
                                           const char *label, size_t *count_out) {
    if (count_out) *count_out = 0;
    if (!label) label = "(header)";
    if (!json) return ds_error_set(DS_ERR_ARG, "%s: no header text", label);
    struct header h;
    enum ds_status st = parse_header(json, len, data_len, label, &h);
    if (st != DS_OK) return st;
    if (count_out) *count_out = h.n;
    header_free(&h);
    return DS_OK;
}

// The u64 little-endian header length and its bounds; the file's size is `size`.
static enum ds_status check_prefix(const unsigned char *p, uint64_t size, const char *label,
                                   uint64_t *n_out) {
    if (size < 8)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: file is %" PRIu64 " bytes, too short for the 8-byte header "
                            "length",
                            label, size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    if (n > HEADER_MAX)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: header length %" PRIu64 " is absurd (limit %" PRIu64 " bytes)",
                            label, n, HEADER_MAX);
    if (n < 2)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: header length %" PRIu64 " is too short for a JSON object", label,
                            n);
    if (n > size - 8)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: header length %" PRIu64 " beyond the file of %" PRIu64 " bytes",
                            label, n, size);
    *n_out = n;
    return DS_OK;
}

enum ds_status ds_safetensors_check_bytes(const void *bytes, size_t len, const char *label,
                                          size_t *count_out) {
    if (count_out) *count_out = 0;
    if (!label) label = "(file)";
    if (!bytes && len) return ds_error_set(DS_ERR_ARG, "%s: no bytes", label);
    uint64_t n;
    enum ds_status st = check_prefix(bytes, len, label, &n);
    if (st != DS_OK) return st;
    return ds_safetensors_check_header((const char *)bytes + 8, (size_t)n, len - 8 - n, label,
                                       count_out);
}

// Maps `path` whole and parses its header into *h; m->path takes a copy of path.
static enum ds_status map_file(const char *path, struct mapped *m, struct header *h) {
    memset(h, 0, sizeof *h);
    enum ds_status st = DS_OK;
    // Non-blocking: opening a FIFO would otherwise wait for a writer forever; it is refused below
    // as not a regular file. mmap ignores the flag.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return ds_error_set(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = ds_error_set(DS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ds_error_set(DS_ERR_IO, "%s: not a regular file", path);
        goto cleanup;
    }
    m->path = strdup(path);
    if (!m->path) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char small[8] = {0};
    if (size < 8) { // mmap of an empty file fails; report the real problem instead
        st = check_prefix(small, size, path, &(uint64_t){0});
        goto cleanup;
    }
    if (size > SIZE_MAX) {
        st = ds_error_set(DS_ERR_UNSUPPORTED, "%s: file too large to map", path);
        goto cleanup;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = ds_error_set(DS_ERR_IO, "%s: cannot map %" PRIu64 " bytes: %s", path, size,
                          strerror(errno));
        goto cleanup;
    }
    m->map = map;
    m->len = (size_t)size;
    uint64_t n;
    st = check_prefix(map, size, path, &n);
    if (st != DS_OK) goto cleanup;
    m->data_start = 8 + n;
    st = parse_header((const char *)map + 8, (size_t)n, size - 8 - n, path, h);
cleanup:
    close(fd);
    return st;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const struct ds_tensor_info *)a)->name,
                  ((const struct ds_tensor_info *)b)->name);
}

// Builds the tensor table and the arena from the parsed headers of st->files (same order).
static enum ds_status assemble(ds_safetensors_t *st, const struct header *hs) {
    size_t n = 0, bytes = 0, nmeta = 0;
    for (int f = 0; f < st->nfiles; f++) {
        n += hs[f].n;
        for (size_t i = 0; i < hs[f].n; i++)
            bytes += strlen(hs[f].e[i].name) + 1;
    }
    const char *key;
    json_t *val;
    if (hs[0].meta) {
        json_object_foreach(hs[0].meta, key, val) {
            bytes += strlen(key) + strlen(json_string_value(val)) + 2;
            nmeta++;
        }
    }
    st->t = calloc(n + 1, sizeof *st->t);
    st->arena = malloc(bytes + 1);
    st->meta = calloc(2 * nmeta + 1, sizeof *st->meta);
    if (!st->t || !st->arena || !st->meta)
        return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for %zu tensors", st->files[0].path,
                            n);
    char *a = st->arena;
#define ARENA_PUT(dst, s)                                                                          \
    do {                                                                                           \
        size_t l_ = strlen(s) + 1;                                                                 \
        memcpy(a, (s), l_);                                                                        \
        (dst) = a;                                                                                 \
        a += l_;                                                                                   \
    } while (0)
    if (hs[0].meta) {
        json_object_foreach(hs[0].meta, key, val) {
            ARENA_PUT(st->meta[2 * st->nmeta], key);
            ARENA_PUT(st->meta[2 * st->nmeta + 1], json_string_value(val));
            st->nmeta++;
        }
    }
    for (int f = 0; f < st->nfiles; f++) {
        for (size_t i = 0; i < hs[f].n; i++) {
            const struct entry *e = &hs[f].e[i];
            struct ds_tensor_info *t = &st->t[st->n++];
            ARENA_PUT(t->name, e->name);
            t->dtype = e->dtype;
            t->ndim = e->ndim;
            memcpy(t->shape, e->shape, sizeof t->shape);
            t->numel = e->numel;
            t->nbytes = e->end - e->begin;
            t->file = f;
            t->file_offset = st->files[f].data_start + e->begin;
            t->data = (const char *)st->files[f].map + t->file_offset;
            st->tensor_bytes += t->nbytes;
        }
    }
#undef ARENA_PUT
    qsort(st->t, st->n, sizeof *st->t, by_name);
    for (size_t i = 1; i < st->n; i++) {
        if (!strcmp(st->t[i - 1].name, st->t[i].name)) {
            const struct ds_tensor_info *x = &st->t[i - 1], *y = &st->t[i];
            return ds_error_set(DS_ERR_FORMAT, "%s: tensor '%s' is also in %s",
                                st->files[y->file].path, SHOW(y->name), st->files[x->file].path);
        }
    }
    return DS_OK;
}

enum ds_status ds_safetensors_open_file(const char *path, ds_safetensors_t **out) {
    if (!out) return ds_error_set(DS_ERR_ARG, "ds_safetensors_open_file: no output pointer");
    *out = NULL;
    if (!path) return ds_error_set(DS_ERR_ARG, "ds_safetensors_open_file: no path");
    struct header h = {0};
    enum ds_status st = DS_OK;
    ds_safetensors_t *s = calloc(1, sizeof *s);
    if (!s || !(s->files = calloc(1, sizeof *s->files))) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    s->nfiles = 1;
    st = map_file(path, &s->files[0], &h);
    if (st == DS_OK) st = assemble(s, &h);
cleanup:
    header_free(&h);
    if (st != DS_OK) {
        ds_safetensors_close(s);
        s = NULL;
    }
    *out = s;
    return st;
}

static char *join(const char *dir, const char *name) {
    size_t ld = strlen(dir);
    int slash = ld == 0 || dir[ld - 1] != '/';
    char *p = malloc(ld + (size_t)slash + strlen(name) + 1);
    if (p) sprintf(p, "%s%s%s", dir, slash ? "/" : "", name);
    return p;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int by_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// total_size is an integer in files written by transformers; some tools write it as a real.
static int get_total_size(const json_t *v, uint64_t *out) {
    if (get_u64(v, out)) return 1;
    if (!json_is_real(v)) return 0;
    double d = json_real_value(v);
    if (!(d >= 0 && d < 18446744073709551616.0) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

// Opens the shards named by the index at `ipath` (in `dir`) and checks them against it.
static enum ds_status open_index(const char *dir, const char *ipath, ds_safetensors_t **out) {
    enum ds_status st = DS_OK;
    ds_safetensors_t *s = NULL;
    struct header *hs = NULL;
    const char **shards = NULL;
    char *spath = NULL;
    int nshards = 0;
    json_error_t jerr;
    FILE *fi;
    if ((st = ds_fopen_regular(ipath, &fi))) return st;
    json_t *idx = json_loadf(fi, JSON_REJECT_DUPLICATES, &jerr);
    fclose(fi);
    if (!idx) return json_problem(ipath, "index", &jerr);
    const json_t *wm = json_object_get(idx, "weight_map");
    const json_t *meta = json_object_get(idx, "metadata");
    if (!json_is_object(idx) || !json_is_object(wm) || json_object_size(wm) == 0) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: no \"weight_map\" object naming the tensors", ipath);
        goto cleanup;
    }
    if (meta && !json_is_object(meta) && !json_is_null(meta)) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: \"metadata\" is %s, not an object", ipath,
                          json_kind(meta));
        goto cleanup;
    }
    // Shard names are whatever the index says (the 20b has three files "-of-00002").
    shards = calloc(json_object_size(wm), sizeof *shards);
    if (!shards) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", ipath);
        goto cleanup;
    }
    const char *key;
    const json_t *val;
    size_t nnames = 0;
    json_object_foreach((json_t *)wm, key, val) {
        if (!json_is_string(val) || !*json_string_value(val)) {
            st = ds_error_set(DS_ERR_FORMAT,
                              "%s: weight_map entry for '%s' is not a shard file name", ipath,
                              SHOW(key));
            goto cleanup;
        }
        shards[nnames++] = json_string_value(val);
    }
    qsort(shards, nnames, sizeof *shards, by_str);
    for (size_t i = 0; i < nnames; i++)
        if (i == 0 || strcmp(shards[i], shards[nshards - 1])) shards[nshards++] = shards[i];

    s = calloc(1, sizeof *s);
    hs = calloc((size_t)nshards, sizeof *hs);
    if (!s || !hs || !(s->files = calloc((size_t)nshards, sizeof *s->files))) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", ipath);
        goto cleanup;
    }
    for (int f = 0; f < nshards; f++) {
        spath = join(dir, shards[f]);
        if (!spath) {
            st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", ipath);
            goto cleanup;
        }
        if (!exists(spath)) {
            st = ds_error_set(DS_ERR_IO, "%s: shard '%s' named by the index is missing (%s)", ipath,
                              SHOW(shards[f]), strerror(errno));
            goto cleanup;
        }
        s->nfiles = f + 1; // so that close() unmaps what was mapped so far
        st = map_file(spath, &s->files[f], &hs[f]);
        if (st != DS_OK) goto cleanup;
        free(spath);
        spath = NULL;
    }
    st = assemble(s, hs);
    if (st != DS_OK) goto cleanup;

    json_object_foreach((json_t *)wm, key, val) {
        const struct ds_tensor_info *t = ds_safetensors_find(s, key);
        const char *want = json_string_value(val);
        if (!t) {
            st = ds_error_set(DS_ERR_MISMATCH,
                              "%s: tensor '%s' is not in shard '%s' where the index puts it", ipath,
                              SHOW(key), SHOW(want));
            goto cleanup;
        }
        const char *have = shards[t->file];
        if (strcmp(have, want)) {
            st = ds_error_set(DS_ERR_MISMATCH,
                              "%s: tensor '%s' is in shard '%s', but the index puts it in '%s'",
                              ipath, SHOW(key), SHOW(have), SHOW(want));
            goto cleanup;
        }
    }
    for (size_t i = 0; i < s->n; i++) {
        if (!json_object_get(wm, s->t[i].name)) {
            st = ds_error_set(DS_ERR_MISMATCH,
                              "%s: tensor '%s' is missing from the weight_map of %s",
                              s->files[s->t[i].file].path, SHOW(s->t[i].name), ipath);
            goto cleanup;
        }
    }
    const json_t *ts = json_is_object(meta) ? json_object_get(meta, "total_size") : NULL;
    if (ts) {
        uint64_t total;
        if (!get_total_size(ts, &total)) {
            st = ds_error_set(DS_ERR_FORMAT,
                              "%s: metadata.total_size is %s, not a non-negative integer", ipath,
                              json_kind(ts));
            goto cleanup;
        }
        if (total != s->tensor_bytes) {
            st = ds_error_set(DS_ERR_MISMATCH,
                              "%s: metadata.total_size %" PRIu64 " differs from the %" PRIu64
                              " tensor bytes of the shards",
                              ipath, total, s->tensor_bytes);
            goto cleanup;
        }
    }
cleanup:
    for (int f = 0; hs && f < nshards; f++)
        header_free(&hs[f]);
    free(hs);
    free(spath);
    free(shards);
    json_decref(idx);
    if (st != DS_OK) {
        ds_safetensors_close(s);
        s = NULL;
    }
    *out = s;
    return st;
}

// No index and no model.safetensors: the directory's only *.safetensors file.
static enum ds_status open_only_file(const char *dir, ds_safetensors_t **out) {
    DIR *d = opendir(dir);
    if (!d) return ds_error_set(DS_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    char first[2][SHOWN_CAP];
    char *found = NULL;
    int count = 0;
    const size_t ls = strlen(SUFFIX);
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l <= ls || strcmp(de->d_name + l - ls, SUFFIX)) continue;
        if (count < 2) ds_safetensors_shown(de->d_name, first[count]);
        if (count++ == 0) found = join(dir, de->d_name);
    }
    closedir(d);
    enum ds_status st;
    if (count == 0) {
        st = ds_error_set(DS_ERR_IO,
                          "%s: no " INDEX_NAME ", no " SINGLE_NAME " and no other *" SUFFIX " file",
                          dir);
    } else if (count > 1) {
        st = ds_error_set(DS_ERR_FORMAT,
                          "%s: %d *" SUFFIX " files ('%s', '%s'%s) and no " INDEX_NAME
                          " to say which to load",
                          dir, count, first[0], first[1], count > 2 ? ", ..." : "");
    } else if (!found) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", dir);
    } else {
        st = ds_safetensors_open_file(found, out);
    }
    free(found);
    return st;
}

enum ds_status ds_safetensors_open_dir(const char *dir, ds_safetensors_t **out) {
    if (!out) return ds_error_set(DS_ERR_ARG, "ds_safetensors_open_dir: no output pointer");
    *out = NULL;
    if (!dir) return ds_error_set(DS_ERR_ARG, "ds_safetensors_open_dir: no directory");
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return ds_error_set(DS_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ds_error_set(DS_ERR_IO, "%s: not a directory", dir);
    char *ipath = join(dir, INDEX_NAME), *single = join(dir, SINGLE_NAME);
    enum ds_status st;
    if (!ipath || !single)
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", dir);
    else if (exists(ipath))
        st = open_index(dir, ipath, out);
    else if (exists(single))
        st = ds_safetensors_open_file(single, out);
    else
        st = open_only_file(dir, out);
    free(ipath);
    free(single);
    return st;
}

void ds_safetensors_close(ds_safetensors_t *st) {
    if (!st) return;
    for (int f = 0; st->files && f < st->nfiles; f++) {
        if (st->files[f].map) munmap(st->files[f].map, st->files[f].len);
        free(st->files[f].path);
    }
    free(st->files);
    free(st->t);
    free(st->arena);
    free(st->meta);
    free(st);
}

size_t ds_safetensors_count(const ds_safetensors_t *st) {
    return st ? st->n : 0;
}

const struct ds_tensor_info *ds_safetensors_at(const ds_safetensors_t *st, size_t i) {
    return st && i < st->n ? &st->t[i] : NULL;
}

const struct ds_tensor_info *ds_safetensors_find(const ds_safetensors_t *st, const char *name) {
    if (!st || !name) return NULL;
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->t[mid].name);
        if (c == 0) return &st->t[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

int ds_safetensors_file_count(const ds_safetensors_t *st) {
    return st ? st->nfiles : 0;
}

const char *ds_safetensors_file_path(const ds_safetensors_t *st, int file) {
    return st && file >= 0 && file < st->nfiles ? st->files[file].path : NULL;
}

uint64_t ds_safetensors_tensor_bytes(const ds_safetensors_t *st) {
    return st ? st->tensor_bytes : 0;
}

const char *ds_safetensors_metadata(const ds_safetensors_t *st, const char *key) {
    if (!st || !key) return NULL;
    for (size_t i = 0; i < st->nmeta; i++)
        if (!strcmp(st->meta[2 * i], key)) return st->meta[2 * i + 1];
    return NULL;
}
