// Value scan of a checkpoint's tensors (ds/values.h): NaN and Inf by bit pattern, so that no
// float conversion or compiler flag (-ffast-math's finite-math assumptions) can hide one.
#include "ds/values.h"

#include <string.h>

// Elements per parallel chunk: large enough that a thread's share streams, small enough that the
// first bad element is found in order (chunks are combined by index, not by arrival).
#define VALUES_CHUNK ((uint64_t)1 << 20)

// 0 finite, 1 NaN, 2 Inf: one element of a float dtype (e8m0: the byte is a scale).
static inline int classify(const unsigned char *p, uint64_t i, enum ds_dtype t, int e8m0) {
    switch (t) {
    case DS_DTYPE_BF16: {
        uint16_t b;
        memcpy(&b, p + 2 * i, 2);
        return ((b >> 7) & 0xff) != 0xff ? 0 : (b & 0x7f) ? 1 : 2;
    }
    case DS_DTYPE_F16: {
        uint16_t b;
        memcpy(&b, p + 2 * i, 2);
        return ((b >> 10) & 0x1f) != 0x1f ? 0 : (b & 0x3ff) ? 1 : 2;
    }
    case DS_DTYPE_F32: {
        uint32_t b;
        memcpy(&b, p + 4 * i, 4);
        return ((b >> 23) & 0xff) != 0xff ? 0 : (b & 0x7fffff) ? 1 : 2;
    }
    case DS_DTYPE_F64: {
        uint64_t b;
        memcpy(&b, p + 8 * i, 8);
        return ((b >> 52) & 0x7ff) != 0x7ff ? 0 : (b & 0xfffffffffffffull) ? 1 : 2;
    }
    case DS_DTYPE_F8_E4M3: // float8_e4m3fn: S.1111.111 is NaN, there is no Inf
        return (p[i] & 0x7f) == 0x7f;
    case DS_DTYPE_F8_E5M2:
        return ((p[i] >> 2) & 0x1f) != 0x1f ? 0 : (p[i] & 3) ? 1 : 2;
    case DS_DTYPE_U8: // an E8M0 scale: 0xFF is NaN (OCP MX), every other byte a power of two
        return e8m0 && p[i] == 0xff;
    default:
        return 0;
    }
}

static int scanned(enum ds_dtype t, int e8m0) {
    switch (t) {
    case DS_DTYPE_BF16:
    case DS_DTYPE_F16:
    case DS_DTYPE_F32:
    case DS_DTYPE_F64:
    case DS_DTYPE_F8_E4M3:
    case DS_DTYPE_F8_E5M2:
        return 1;
    case DS_DTYPE_U8:
        return e8m0;
    default:
        return 0;
    }
}

int ds_values_count(const void *data, uint64_t numel, enum ds_dtype dtype, int e8m0,
                    struct ds_value_count *out) {
    memset(out, 0, sizeof *out);
    out->first = -1;
    if (!scanned(dtype, e8m0)) return 0;
    const unsigned char *p = data;
    const uint64_t n_chunks = (numel + VALUES_CHUNK - 1) / VALUES_CHUNK;
    uint64_t nan = 0, inf = 0;
    int64_t first = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(+ : nan, inf) reduction(min : first) \
    if (n_chunks > 1)
    for (uint64_t c = 0; c < n_chunks; c++) {
        const uint64_t lo = c * VALUES_CHUNK;
        const uint64_t hi = lo + VALUES_CHUNK < numel ? lo + VALUES_CHUNK : numel;
        uint64_t cn = 0, ci = 0;
        for (uint64_t i = lo; i < hi; i++) {
            const int k = classify(p, i, dtype, e8m0);
            cn += k == 1;
            ci += k == 2;
            if (k && (int64_t)i < first) first = (int64_t)i;
        }
        nan += cn;
        inf += ci;
    }
    out->nan = nan;
    out->inf = inf;
    out->first = first == INT64_MAX ? -1 : first;
    return 1;
}

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

enum ds_status ds_values_scan(const ds_safetensors_t *st, struct ds_value_scan *out,
                              void (*progress)(void *user, uint64_t done, uint64_t total),
                              void *user, struct ds_problems *problems) {
    memset(out, 0, sizeof *out);
    const size_t n = ds_safetensors_count(st), before = problems->count;
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n; i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        if (scanned(t->dtype, ends_with(t->name, "_scales"))) total += t->nbytes;
    }
    for (size_t i = 0; i < n; i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        const int e8m0 = t->dtype == DS_DTYPE_U8 && ends_with(t->name, "_scales");
        struct ds_value_count c;
        if (!ds_values_count(t->data, t->numel, t->dtype, e8m0, &c)) continue;
        out->tensors++;
        out->bytes += t->nbytes;
        done += t->nbytes;
        if (c.first >= 0) {
            out->bad_tensors++;
            const char *file = ds_safetensors_file_path(st, t->file);
            char shown[DS_SHOWN_CAP];
            enum ds_status s;
            if (e8m0) {
                out->nan_scales += c.nan;
                s = ds_problems_add(problems,
                                    "%s: tensor %s (E8M0 scales): %llu of %llu scales are 0xFF, "
                                    "the NaN scale; the first at element %lld",
                                    file, ds_safetensors_shown(t->name, shown),
                                    (unsigned long long)c.nan, (unsigned long long)t->numel,
                                    (long long)c.first);
            } else {
                out->nan += c.nan;
                out->inf += c.inf;
                s = ds_problems_add(problems,
                                    "%s: tensor %s (%s): %llu NaN and %llu Inf among %llu values, "
                                    "the first at element %lld",
                                    file, ds_safetensors_shown(t->name, shown),
                                    ds_dtype_name(t->dtype), (unsigned long long)c.nan,
                                    (unsigned long long)c.inf, (unsigned long long)t->numel,
                                    (long long)c.first);
            }
            if (s) return s;
        }
        if (progress) progress(user, done, total);
    }
    if (progress && total == 0) progress(user, 0, 0);
    if (problems->count == before) return DS_OK;
    return ds_error_set(DS_ERR_MISMATCH, "%s", problems->lines[before]);
}
