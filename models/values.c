// Value scan of a checkpoint's tensors (ds/values.h): NaN and Inf by bit pattern, so that no
// float conversion or compiler flag (-ffast-math's finite-math assumptions) can hide one.
#include "ds/values.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

// Elements per parallel chunk: large enough that a thread's share streams, small enough that the
// first bad element is found in order (chunks are combined by index, not by arrival).
#define VALUES_CHUNK ((uint64_t)1 << 20)

// An element's magnitude bits (the sign cleared) and where its dtype's specials start: at or
// above `inf` an element is Inf (equal) or NaN (above); E4M3 (fn) has no Inf, so its inf is the
// NaN pattern itself and equality counts as NaN there. Finite magnitudes order like the values.
struct fmt {
    uint64_t inf;
    int bytes, no_inf;
};

static struct fmt fmt_of(enum ds_dtype t, int e8m0) {
    switch (t) {
    case DS_DTYPE_BF16: return (struct fmt){0x7f80, 2, 0};
    case DS_DTYPE_F16: return (struct fmt){0x7c00, 2, 0};
    case DS_DTYPE_F32: return (struct fmt){0x7f800000u, 4, 0};
    case DS_DTYPE_F64: return (struct fmt){0x7ff0000000000000ull, 8, 0};
    case DS_DTYPE_F8_E4M3: return (struct fmt){0x7f, 1, 1}; // S.1111.111 is NaN, no Inf
    case DS_DTYPE_F8_E5M2: return (struct fmt){0x7c, 1, 0};
    case DS_DTYPE_U8: return (struct fmt){e8m0 ? 0xff : 0, e8m0 ? 1 : 0, 1}; // 0xFF: NaN scale
    default: return (struct fmt){0, 0, 0};
    }
}

static inline uint64_t magnitude(const unsigned char *p, uint64_t i, enum ds_dtype t) {
    switch (t) {
    case DS_DTYPE_BF16:
    case DS_DTYPE_F16: {
        uint16_t b;
        memcpy(&b, p + 2 * i, 2);
        return b & 0x7fffu;
    }
    case DS_DTYPE_F32: {
        uint32_t b;
        memcpy(&b, p + 4 * i, 4);
        return b & 0x7fffffffu;
    }
    case DS_DTYPE_F64: {
        uint64_t b;
        memcpy(&b, p + 8 * i, 8);
        return b & 0x7fffffffffffffffull;
    }
    case DS_DTYPE_F8_E4M3:
    case DS_DTYPE_F8_E5M2: return p[i] & 0x7fu;
    default: return p[i]; // an E8M0 scale byte: no sign
    }
}

// The value of a finite magnitude (E8M0: the scale's exponent is in the byte, not converted here).
static double value_of(uint64_t m, enum ds_dtype t) {
    switch (t) {
    case DS_DTYPE_BF16: {
        const uint32_t u = (uint32_t)m << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case DS_DTYPE_F32: {
        const uint32_t u = (uint32_t)m;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case DS_DTYPE_F64: {
        double d;
        memcpy(&d, &m, 8);
        return d;
    }
    case DS_DTYPE_F16: { // 5 exponent bits (bias 15), 10 mantissa bits
        const int e = (int)(m >> 10), f = (int)(m & 0x3ff);
        return e ? ldexp(1024 + f, e - 25) : ldexp(f, -24);
    }
    case DS_DTYPE_F8_E4M3: { // 4 exponent bits (bias 7), 3 mantissa bits
        const int e = (int)(m >> 3), f = (int)(m & 7);
        return e ? ldexp(8 + f, e - 10) : ldexp(f, -9);
    }
    case DS_DTYPE_F8_E5M2: { // 5 exponent bits (bias 15), 2 mantissa bits
        const int e = (int)(m >> 2), f = (int)(m & 3);
        return e ? ldexp(4 + f, e - 17) : ldexp(f, -16);
    }
    default: return 0.0;
    }
}

// One chunk's figures. The fast pass is branch-free over one element width (so that it
// vectorises): the largest and smallest magnitude, the zeros and the elements at or above `inf`.
// Only a chunk that holds such specials takes the exact pass, which tells NaN from Inf, finds the
// first, and leaves the specials out of the largest and smallest magnitude.
struct part {
    uint64_t nan, inf, zeros, top, low;
    int64_t first;
};

#define DEFINE_FAST(NAME, T)                                                                   \
    static void NAME(const unsigned char *p, uint64_t lo, uint64_t hi, T mask, T inf,          \
                     struct part *o) {                                                         \
        T top = 0, low = (T)~(T)0;                                                             \
        uint64_t zeros = 0, specials = 0;                                                      \
        for (uint64_t i = lo; i < hi; i++) {                                                   \
            T b;                                                                               \
            memcpy(&b, p + sizeof(T) * i, sizeof(T));                                          \
            const T m = b & mask;                                                              \
            top = m > top ? m : top;                                                           \
            low = m < low ? m : low;                                                           \
            zeros += m == 0;                                                                   \
            specials += m >= inf;                                                              \
        }                                                                                      \
        o->top = top, o->low = low, o->zeros = zeros, o->nan = specials;                       \
    }
DEFINE_FAST(fast8, uint8_t)
DEFINE_FAST(fast16, uint16_t)
DEFINE_FAST(fast32, uint32_t)
DEFINE_FAST(fast64, uint64_t)

static void exact_pass(const unsigned char *p, uint64_t lo, uint64_t hi, enum ds_dtype dtype,
                       struct fmt fm, struct part *o) {
    uint64_t top = 0, low = UINT64_MAX;
    o->nan = o->inf = 0;
    o->first = INT64_MAX;
    for (uint64_t i = lo; i < hi; i++) {
        const uint64_t m = magnitude(p, i, dtype);
        if (m >= fm.inf) {
            const int is_inf = m == fm.inf && !fm.no_inf;
            o->nan += !is_inf, o->inf += is_inf;
            if (o->first == INT64_MAX) o->first = (int64_t)i;
            continue;
        }
        top = m > top ? m : top;
        low = m < low ? m : low;
    }
    o->top = top, o->low = low;
}

static void chunk(const unsigned char *p, uint64_t lo, uint64_t hi, enum ds_dtype dtype,
                  struct fmt fm, struct part *o) {
    const uint64_t sign = (uint64_t)1 << (8 * fm.bytes - 1);
    const uint64_t mask = dtype == DS_DTYPE_U8 ? 0xff : sign - 1; // E8M0 has no sign bit
    switch (fm.bytes) {
    case 1: fast8(p, lo, hi, (uint8_t)mask, (uint8_t)fm.inf, o); break;
    case 2: fast16(p, lo, hi, (uint16_t)mask, (uint16_t)fm.inf, o); break;
    case 4: fast32(p, lo, hi, (uint32_t)mask, (uint32_t)fm.inf, o); break;
    default: fast64(p, lo, hi, mask, fm.inf, o); break;
    }
    o->first = INT64_MAX;
    if (o->nan) { // specials here (counted in nan by the fast pass): the exact pass
        const uint64_t zeros = o->zeros;
        exact_pass(p, lo, hi, dtype, fm, o);
        o->zeros = zeros;
    } else {
        o->inf = 0;
    }
}

int ds_values_count(const void *data, uint64_t numel, enum ds_dtype dtype, int e8m0,
                    struct ds_value_count *out) {
    memset(out, 0, sizeof *out);
    out->first = -1;
    out->scale_min = out->scale_max = INT32_MIN;
    const struct fmt fm = fmt_of(dtype, e8m0);
    if (!fm.bytes) return 0;
    const unsigned char *p = data;
    const uint64_t n_chunks = (numel + VALUES_CHUNK - 1) / VALUES_CHUNK;
    uint64_t n_nan = 0, n_inf = 0, zeros = 0, top = 0, low = UINT64_MAX;
    int64_t first = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(+ : n_nan, n_inf, zeros) \
    reduction(min : first, low) reduction(max : top) if (n_chunks > 1)
    for (uint64_t c = 0; c < n_chunks; c++) {
        const uint64_t lo = c * VALUES_CHUNK;
        const uint64_t hi = lo + VALUES_CHUNK < numel ? lo + VALUES_CHUNK : numel;
        struct part o;
        chunk(p, lo, hi, dtype, fm, &o);
        n_nan += o.nan, n_inf += o.inf, zeros += o.zeros;
        const int any = hi - lo > o.nan + o.inf; // a finite element in this chunk
        top = any && o.top > top ? o.top : top;
        low = any && o.low < low ? o.low : low;
        first = o.first < first ? o.first : first;
    }
    out->nan = n_nan;
    out->inf = n_inf;
    out->first = first == INT64_MAX ? -1 : first;
    const uint64_t finite = numel - n_nan - n_inf;
    if (e8m0) {
        out->zeros = 0; // byte 0 is 2^-127, not zero
        if (finite) out->scale_min = (int)low - 127, out->scale_max = (int)top - 127;
    } else {
        out->zeros = zeros;
        out->max_abs = finite ? value_of(top, dtype) : 0.0;
    }
    out->finite = finite;
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
    out->max_abs_tensor = out->first_zero_tensor = -1;
    out->scale_min = out->scale_max = INT32_MIN;
    const size_t n = ds_safetensors_count(st), before = problems->count;
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n; i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        if (fmt_of(t->dtype, ends_with(t->name, "_scales")).bytes) total += t->nbytes;
    }
    for (size_t i = 0; i < n; i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        const int e8m0 = t->dtype == DS_DTYPE_U8 && ends_with(t->name, "_scales");
        struct ds_value_count c;
        if (!ds_values_count(t->data, t->numel, t->dtype, e8m0, &c)) continue;
        out->tensors++;
        out->bytes += t->nbytes;
        done += t->nbytes;
        if (e8m0 && c.finite) {
            if (out->scale_min == INT32_MIN || c.scale_min < out->scale_min)
                out->scale_min = c.scale_min;
            if (out->scale_max == INT32_MIN || c.scale_max > out->scale_max)
                out->scale_max = c.scale_max;
        } else if (!e8m0) {
            if (c.finite && (out->max_abs_tensor < 0 || c.max_abs > out->max_abs))
                out->max_abs = c.max_abs, out->max_abs_tensor = (int64_t)i;
            if (t->numel && c.zeros == t->numel && !out->zero_tensors++)
                out->first_zero_tensor = (int64_t)i;
        }
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
