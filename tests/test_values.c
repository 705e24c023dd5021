// The value scan (ds/values.h, `inspect --scan-values`): NaN / Inf counts of every float dtype
// against an independent classification (the value converted to float or double and tested with
// isnan / isinf, or the formats' documented NaN bytes where C has no such type), over arrays that
// span several parallel chunks; the first bad element in index order; E8M0 scale bytes 0xFF;
// and whole checkpoints: the golden target as it is (clean) and copies with a NaN lm_head row or
// one NaN scale, through ds_values_scan and `draftscope inspect --scan-values`.
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/cli.h"
#include "ds/safetensors.h"
#include "ds/values.h"
#include "harness.h"

#define GOLD DS_SOURCE_DIR "/tests/fixtures/golden/tiny-gptoss-a"
#define N_BIG (3u * (1u << 20) + 12345u) // 3+ chunks of ds_values_count's parallel loop

static uint64_t rnd(uint64_t *s) { // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Random bit patterns, with every 997th element forced to an exponent of all ones so that NaN
// and Inf are frequent; then counted here through the C library.
static void bf16_f32_f64_against_libm(void) {
    uint64_t seed = 7;
    uint16_t *b = malloc(N_BIG * sizeof *b);
    uint32_t *f = malloc(N_BIG * sizeof *f);
    uint64_t *d = malloc(N_BIG * sizeof *d);
    if (!b || !f || !d) {
        DS_FAILF("out of memory");
        free(b), free(f), free(d);
        return;
    }
    uint64_t want[3][2] = {{0}}, zeros[3] = {0};
    int64_t first[3] = {-1, -1, -1};
    double top[3] = {0, 0, 0}; // the largest finite |x|, by libm
    for (uint64_t i = 0; i < N_BIG; i++) {
        uint64_t r = rnd(&seed);
        b[i] = (uint16_t)r;
        f[i] = (uint32_t)(r >> 16);
        d[i] = r;
        if (i % 997 == 500) {
            b[i] |= 0x7f80;
            f[i] |= 0x7f800000u;
            d[i] |= 0x7ff0000000000000ull;
            if (i % 3 == 0) // some exact infinities too
                b[i] &= 0xff80, f[i] &= 0xff800000u, d[i] &= 0xfff0000000000000ull;
        }
        uint32_t fb = (uint32_t)b[i] << 16;
        float xb, xf;
        double xd;
        memcpy(&xb, &fb, 4), memcpy(&xf, &f[i], 4), memcpy(&xd, &d[i], 8);
        const int bad[3] = {isnan(xb) ? 0 : isinf(xb) ? 1 : -1, isnan(xf) ? 0 : isinf(xf) ? 1 : -1,
                            isnan(xd) ? 0 : isinf(xd) ? 1 : -1};
        for (int k = 0; k < 3; k++)
            if (bad[k] >= 0) {
                want[k][bad[k]]++;
                if (first[k] < 0) first[k] = (int64_t)i;
            }
        const double x[3] = {xb, xf, xd};
        for (int k = 0; k < 3; k++)
            if (bad[k] < 0) top[k] = fmax(top[k], fabs(x[k])), zeros[k] += x[k] == 0.0;
    }
    const void *data[3] = {b, f, d};
    const enum ds_dtype types[3] = {DS_DTYPE_BF16, DS_DTYPE_F32, DS_DTYPE_F64};
    for (int k = 0; k < 3; k++) {
        struct ds_value_count c;
        EXPECT_EQ_INT(ds_values_count(data[k], N_BIG, types[k], 0, &c), 1);
        EXPECT_EQ_INT(c.nan, want[k][0]);
        EXPECT_EQ_INT(c.inf, want[k][1]);
        EXPECT_EQ_INT(c.first, first[k]);
        EXPECT(want[k][0] > 1000 && want[k][1] > 500); // the case tests something
        EXPECT_EQ_INT(c.finite, N_BIG - want[k][0] - want[k][1]);
        if (c.max_abs != top[k])
            DS_FAILF("dtype %d: max |x| %.17g, libm %.17g", k, c.max_abs, top[k]);
        EXPECT_EQ_INT(c.zeros, zeros[k]);
    }
    // The same random bits with every special made finite (the exponent's top bit cleared), so
    // that no chunk holds a NaN or Inf: the scan's fast path, against libm again.
    double top_f[2] = {0, 0};
    for (uint64_t i = 0; i < N_BIG; i++) {
        if (((b[i] >> 7) & 0xff) == 0xff) b[i] &= 0xbfff;
        if (((f[i] >> 23) & 0xff) == 0xff) f[i] &= 0xbfffffffu;
        const uint32_t fb = (uint32_t)b[i] << 16;
        float xb, xf;
        memcpy(&xb, &fb, 4), memcpy(&xf, &f[i], 4);
        top_f[0] = fmax(top_f[0], fabs(xb)), top_f[1] = fmax(top_f[1], fabs(xf));
    }
    for (int k = 0; k < 2; k++) {
        struct ds_value_count c;
        EXPECT_EQ_INT(ds_values_count(data[k], N_BIG, types[k], 0, &c), 1);
        EXPECT(c.nan == 0 && c.inf == 0 && c.first == -1 && c.finite == N_BIG);
        if (c.max_abs != top_f[k])
            DS_FAILF("dtype %d, all finite: max |x| %.17g, libm %.17g", k, c.max_abs, top_f[k]);
    }
    // A clean array: nothing, first -1; one bad element in the last chunk only: found there.
    for (uint64_t i = 0; i < N_BIG; i++)
        b[i] = 0x3f80; // 1.0
    struct ds_value_count c;
    EXPECT_EQ_INT(ds_values_count(b, N_BIG, DS_DTYPE_BF16, 0, &c), 1);
    EXPECT(c.nan == 0 && c.inf == 0 && c.first == -1);
    b[N_BIG - 2] = 0xff81; // a negative NaN
    b[N_BIG - 1] = 0xff80; // -Inf
    EXPECT_EQ_INT(ds_values_count(b, N_BIG, DS_DTYPE_BF16, 0, &c), 1);
    EXPECT(c.nan == 1 && c.inf == 1 && c.first == (int64_t)N_BIG - 2);
    EXPECT(c.max_abs == 1.0 && c.zeros == 0); // the specials are not values
    // All ±0 (0x8000 is -0): every element a zero, the largest |x| 0.
    for (uint64_t i = 0; i < N_BIG; i++)
        b[i] = i % 2 ? 0x8000 : 0;
    EXPECT_EQ_INT(ds_values_count(b, N_BIG, DS_DTYPE_BF16, 0, &c), 1);
    EXPECT(c.zeros == N_BIG && c.finite == N_BIG && c.max_abs == 0.0);
    free(b), free(f), free(d);
}

// Formats C has no type for: the documented special patterns, and neighbours that are finite.
static void f16_f8_e8m0_patterns(void) {
    // F16: 0x7c00 +Inf, 0xfc00 -Inf, 0x7e00 / 0x7c01 NaN; 0x7bff (65504) and 0x0001 finite.
    const uint16_t h[] = {0x7bff, 0x0001, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x3c00};
    struct ds_value_count c;
    EXPECT_EQ_INT(ds_values_count(h, 7, DS_DTYPE_F16, 0, &c), 1);
    EXPECT(c.nan == 2 && c.inf == 2 && c.first == 2);
    EXPECT(c.max_abs == 65504.0 && c.finite == 3); // IEEE 754 binary16's largest finite
    const uint16_t h_small[] = {0x8001, 0x0000}; // -2^-24, the smallest subnormal, and +0
    EXPECT_EQ_INT(ds_values_count(h_small, 2, DS_DTYPE_F16, 0, &c), 1);
    EXPECT(c.max_abs == 0x1p-24 && c.zeros == 1);
    // F8 E4M3 (fn): S.1111.111 is NaN (0x7f, 0xff), 0x7e (448) finite, no Inf exists.
    const uint8_t e4[] = {0x7e, 0xfe, 0x7f, 0xff, 0x78, 0x00};
    EXPECT_EQ_INT(ds_values_count(e4, 6, DS_DTYPE_F8_E4M3, 0, &c), 1);
    EXPECT(c.nan == 2 && c.inf == 0 && c.first == 2);
    EXPECT(c.max_abs == 448.0 && c.zeros == 1); // the OCP FP8 spec's E4M3 maximum
    const uint8_t e4_small[] = {0x81, 0x08}; // -2^-9 (smallest subnormal), 2^-6 (smallest normal)
    EXPECT_EQ_INT(ds_values_count(e4_small, 2, DS_DTYPE_F8_E4M3, 0, &c), 1);
    EXPECT(c.max_abs == 0x1p-6);
    EXPECT_EQ_INT(ds_values_count(e4_small, 1, DS_DTYPE_F8_E4M3, 0, &c), 1);
    EXPECT(c.max_abs == 0x1p-9);
    // F8 E5M2: 0x7c / 0xfc Inf, 0x7d..0x7f NaN, 0x7b (57344) finite.
    const uint8_t e5[] = {0x7b, 0x7c, 0xfc, 0x7d, 0x7e, 0xff, 0x01};
    EXPECT_EQ_INT(ds_values_count(e5, 7, DS_DTYPE_F8_E5M2, 0, &c), 1);
    EXPECT(c.nan == 3 && c.inf == 2 && c.first == 1);
    EXPECT(c.max_abs == 57344.0); // the OCP FP8 spec's E5M2 maximum
    EXPECT_EQ_INT(ds_values_count(e5 + 6, 1, DS_DTYPE_F8_E5M2, 0, &c), 1);
    EXPECT(c.max_abs == 0x1p-16); // 0x01: the smallest subnormal
    // U8: an E8M0 scale of 0xFF is NaN; 0xFE (2^127) is not. Codes (not scales) are not scanned.
    const uint8_t sc[] = {0x7f, 0xfe, 0xff, 0x00, 0xff};
    EXPECT_EQ_INT(ds_values_count(sc, 5, DS_DTYPE_U8, 1, &c), 1);
    EXPECT(c.nan == 2 && c.first == 2);
    EXPECT(c.scale_min == -127 && c.scale_max == 127 && c.zeros == 0 && c.max_abs == 0.0);
    EXPECT_EQ_INT(ds_values_count(sc + 4, 1, DS_DTYPE_U8, 1, &c), 1); // only a NaN scale
    EXPECT(c.scale_min == INT32_MIN && c.scale_max == INT32_MIN && c.finite == 0);
    EXPECT_EQ_INT(ds_values_count(sc, 5, DS_DTYPE_U8, 0, &c), 0);
    EXPECT(c.nan == 0 && c.first == -1);
    const int64_t ids[] = {-1, 0x7ff0000000000000ll};
    EXPECT_EQ_INT(ds_values_count(ids, 2, DS_DTYPE_I64, 0, &c), 0);
}

// Copies the golden target into dir with `n` bytes at `off` of its safetensors file replaced by
// `fill` (n = 0: unchanged). The tensor's offset comes from the original's table.
static int copy_target(const char *dir, const char *tensor, uint64_t at, uint64_t n, int fill) {
    char to[512];
    mkdir(dir, 0755);
    snprintf(to, sizeof to, "%s/config.json", dir);
    if (!ds_t_copy_with_nan(GOLD "/config.json", to, 0, 0)) return 0;
    snprintf(to, sizeof to, "%s/model.safetensors", dir);
    if (!ds_t_copy_with_nan(GOLD "/model.safetensors", to, 0, 0)) return 0;
    if (!n) return 1;
    ds_safetensors_t *st = NULL;
    if (ds_safetensors_open_file(GOLD "/model.safetensors", &st) != DS_OK) return 0;
    const struct ds_tensor_info *t = ds_safetensors_find(st, tensor);
    const uint64_t off = t ? t->file_offset + at : 0;
    ds_safetensors_close(st);
    if (!t) return 0;
    FILE *f = fopen(to, "r+b");
    int ok = f && fseek(f, (long)off, SEEK_SET) == 0;
    for (uint64_t i = 0; ok && i < n; i++)
        ok = fputc(fill, f) != EOF;
    if (f) ok = fclose(f) == 0 && ok;
    return ok;
}

static char dir_clean[512], dir_nan[512], dir_scale[512], dir_zero[512];

static void scan_checkpoints(void) {
    // The clean golden target: every float and scale tensor read, nothing found.
    ds_safetensors_t *st = NULL;
    struct ds_problems p = {0};
    struct ds_value_scan v;
    EXPECT_OK(ds_safetensors_open_dir(dir_clean, &st));
    if (!st) return;
    uint64_t want_tensors = 0, want_bytes = 0;
    struct ds_value_scan w = {.max_abs_tensor = -1, .first_zero_tensor = -1,
                              .scale_min = 255, .scale_max = -1};
    for (size_t i = 0; i < ds_safetensors_count(st); i++) {
        const struct ds_tensor_info *t = ds_safetensors_at(st, i);
        const size_t n = strlen(t->name);
        const int scales = n > 7 && !strcmp(t->name + n - 7, "_scales");
        if (t->dtype == DS_DTYPE_BF16 || (t->dtype == DS_DTYPE_U8 && scales))
            want_tensors++, want_bytes += t->nbytes;
        // The span, element by element: bf16 widened to float; scale bytes as they are.
        const unsigned char *d = t->data;
        int all_zero = 1;
        for (uint64_t e = 0; t->dtype == DS_DTYPE_BF16 && e < t->numel; e++) {
            uint16_t b;
            memcpy(&b, d + 2 * e, 2);
            const uint32_t u = (uint32_t)b << 16;
            float x;
            memcpy(&x, &u, 4);
            all_zero &= x == 0.0f;
            if (w.max_abs_tensor < 0 || fabsf(x) > w.max_abs)
                w.max_abs = fabsf(x), w.max_abs_tensor = (int64_t)i;
        }
        if (t->dtype == DS_DTYPE_BF16 && all_zero && !w.zero_tensors++)
            w.first_zero_tensor = (int64_t)i;
        for (uint64_t e = 0; t->dtype == DS_DTYPE_U8 && scales && e < t->numel; e++)
            if (d[e] != 0xff) {
                if (d[e] < w.scale_min) w.scale_min = d[e];
                if (d[e] > w.scale_max) w.scale_max = d[e];
            }
    }
    EXPECT_OK(ds_values_scan(st, &v, NULL, NULL, &p));
    EXPECT_EQ_INT(v.tensors, want_tensors);
    EXPECT_EQ_INT(v.bytes, want_bytes);
    EXPECT(v.bad_tensors == 0 && v.nan == 0 && v.inf == 0 && v.nan_scales == 0 && p.count == 0);
    EXPECT(w.max_abs > 0 && w.scale_max >= 0); // the fixture has values and scales
    EXPECT(v.max_abs == w.max_abs);
    EXPECT_EQ_INT(v.max_abs_tensor, w.max_abs_tensor);
    EXPECT_EQ_INT(v.zero_tensors, w.zero_tensors);
    EXPECT_EQ_INT(v.first_zero_tensor, w.first_zero_tensor);
    EXPECT_EQ_INT(v.scale_min, w.scale_min - 127);
    EXPECT_EQ_INT(v.scale_max, w.scale_max - 127);
    const uint64_t clean_zero = w.zero_tensors;
    ds_safetensors_close(st);

    // model.norm.weight set to zero: one all-zero tensor more, and the first one unless an
    // earlier tensor of the table was already all zero.
    EXPECT_OK(ds_safetensors_open_dir(dir_zero, &st));
    if (!st) return;
    EXPECT_OK(ds_values_scan(st, &v, NULL, NULL, &p));
    EXPECT_EQ_INT(v.zero_tensors, clean_zero + 1);
    const struct ds_tensor_info *zt =
        v.first_zero_tensor >= 0 ? ds_safetensors_at(st, (size_t)v.first_zero_tensor) : NULL;
    if (!clean_zero) EXPECT(zt && !strcmp(zt->name, "model.norm.weight"));
    ds_safetensors_close(st);

    // lm_head row 3 all NaN (bf16 0xFFFF: a NaN with the sign set): one line naming file and
    // tensor, the count, and the first element (3 rows in).
    EXPECT_OK(ds_safetensors_open_dir(dir_nan, &st));
    if (!st) return;
    const struct ds_tensor_info *lm = ds_safetensors_find(st, "lm_head.weight");
    EXPECT(lm != NULL);
    EXPECT_STATUS(ds_values_scan(st, &v, NULL, NULL, &p), DS_ERR_MISMATCH);
    EXPECT(v.bad_tensors == 1 && v.inf == 0 && p.count == 1);
    if (lm) {
        EXPECT_EQ_INT(v.nan, lm->shape[1]);
        char want[1024];
        snprintf(want, sizeof want,
                 "%s/model.safetensors: tensor lm_head.weight (BF16): %lld NaN and 0 Inf among "
                 "%llu values, the first at element %lld",
                 dir_nan, (long long)lm->shape[1], (unsigned long long)lm->numel,
                 (long long)(3 * lm->shape[1]));
        if (p.count) EXPECT_EQ_STR(p.lines[0], want);
    }
    ds_safetensors_close(st);
    ds_problems_free(&p);

    // One E8M0 scale byte 0xFF in layer 1's down_proj scales.
    memset(&p, 0, sizeof p);
    EXPECT_OK(ds_safetensors_open_dir(dir_scale, &st));
    if (!st) return;
    EXPECT_STATUS(ds_values_scan(st, &v, NULL, NULL, &p), DS_ERR_MISMATCH);
    EXPECT(v.bad_tensors == 1 && v.nan == 0 && v.nan_scales == 1 && p.count == 1);
    if (p.count)
        EXPECT(strstr(p.lines[0], "tensor model.layers.1.mlp.experts.down_proj_scales (E8M0 "
                                  "scales): 1 of ") != NULL &&
               strstr(p.lines[0], "scales are 0xFF, the NaN scale; the first at element 5"));
    ds_safetensors_close(st);
    ds_problems_free(&p);
}

// The command: exit 1 and the problem in the report with --scan-values, exit 0 without it (the
// data is not read) and for the clean copy; the values object in --json.
static int inspect(const char *dir, int scan, const char *out) {
    const char *argv[] = {"inspect", "--target", dir, "--json", scan ? "--scan-values" : NULL};
    fflush(stdout);
    const int saved = ds_t_redirect(1, out);
    const int rc = ds_cmd_inspect(scan ? 5 : 4, (char **)argv);
    ds_t_restore(1, saved);
    return rc;
}

static void inspect_scan_values(void) {
    char out[600];
    snprintf(out, sizeof out, "%s/inspect.json", DS_BINARY_DIR);
    EXPECT_EQ_INT(inspect(dir_nan, 0, out), 0);
    EXPECT_EQ_INT(inspect(dir_clean, 1, out), 0);
    json_t *r = json_load_file(out, 0, NULL);
    json_t *v = json_object_get(json_object_get(r, "target"), "values");
    EXPECT(v && json_integer_value(json_object_get(v, "tensors")) > 0 &&
           json_integer_value(json_object_get(v, "bad_tensors")) == 0);
    // The span's fields: a positive largest |x| with its tensor, scale exponents in E8M0's range.
    EXPECT(v && json_real_value(json_object_get(v, "max_abs")) > 0 &&
           json_is_string(json_object_get(v, "max_abs_tensor")) &&
           json_is_integer(json_object_get(v, "zero_tensors")));
    const json_int_t s_lo = json_integer_value(json_object_get(v, "scale_exponent_min")),
                     s_hi = json_integer_value(json_object_get(v, "scale_exponent_max"));
    EXPECT(s_lo >= -127 && s_lo <= s_hi && s_hi <= 127);
    json_decref(r);
    EXPECT_EQ_INT(inspect(dir_nan, 1, out), 1);
    r = json_load_file(out, 0, NULL);
    v = json_object_get(json_object_get(r, "target"), "values");
    EXPECT(v && json_integer_value(json_object_get(v, "bad_tensors")) == 1);
    const char *line = json_string_value(json_array_get(json_object_get(r, "problems"), 0));
    EXPECT(line && strstr(line, "tensor lm_head.weight (BF16): ") != NULL);
    EXPECT(json_is_false(json_object_get(r, "usable")));
    json_decref(r);
    unlink(out);
}

int main(void) {
    DS_RUN(bf16_f32_f64_against_libm);
    DS_RUN(f16_f8_e8m0_patterns);
    snprintf(dir_clean, sizeof dir_clean, "%s/test_values.%d.clean", DS_BINARY_DIR, (int)getpid());
    snprintf(dir_nan, sizeof dir_nan, "%s/test_values.%d.nan", DS_BINARY_DIR, (int)getpid());
    snprintf(dir_scale, sizeof dir_scale, "%s/test_values.%d.scale", DS_BINARY_DIR, (int)getpid());
    snprintf(dir_zero, sizeof dir_zero, "%s/test_values.%d.zero", DS_BINARY_DIR, (int)getpid());
    ds_safetensors_t *st = NULL;
    uint64_t row = 0, norm = 0;
    if (ds_safetensors_open_file(GOLD "/model.safetensors", &st) == DS_OK) {
        const struct ds_tensor_info *lm = ds_safetensors_find(st, "lm_head.weight");
        const struct ds_tensor_info *nw = ds_safetensors_find(st, "model.norm.weight");
        row = lm ? (uint64_t)lm->shape[1] * 2 : 0;
        norm = nw ? nw->nbytes : 0;
        ds_safetensors_close(st);
    }
    const int ok = row && copy_target(dir_clean, NULL, 0, 0, 0) &&
                   copy_target(dir_nan, "lm_head.weight", 3 * row, row, 0xff) &&
                   copy_target(dir_scale, "model.layers.1.mlp.experts.down_proj_scales", 5, 1,
                               0xff) &&
                   norm && copy_target(dir_zero, "model.norm.weight", 0, norm, 0);
    if (!ok) {
        fprintf(stderr, "cannot copy %s into %s\n", GOLD, DS_BINARY_DIR);
        return 1;
    }
    DS_RUN(scan_checkpoints);
    DS_RUN(inspect_scan_values);
    const char *dirs[] = {dir_clean, dir_nan, dir_scale, dir_zero};
    for (int i = 0; i < 4; i++) {
        char f[600];
        snprintf(f, sizeof f, "%s/config.json", dirs[i]);
        unlink(f);
        snprintf(f, sizeof f, "%s/model.safetensors", dirs[i]);
        unlink(f);
        rmdir(dirs[i]);
    }
    return ds_test_end();
}
