// tests/gpu_ops_common.h: helpers of the GPU op tests (tests/gpu_ops_*.c, tests/gpu_backend.c),
// also used by the model-level GPU tests, and the small-shape switch (DS_GPU_TEST_SMALL) of every
// GPU test that has large cases.
//
// Device buffers come from cudaMalloc and are filled from host arrays that the CPU reference also
// reads, so both sides see identical inputs. Comparisons print enough to locate a failure from one
// run: the case name, the count of mismatches, max abs / rel error and the first mismatching
// (row, column) with both values.
#ifndef DS_GPU_OPS_COMMON_H
#define DS_GPU_OPS_COMMON_H

#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "ds/bf16.h"
#include "ds/device.h"
#include "ds/kernel_args.h" // enum ds_elem, for a test that includes no op header
#include "test_ops_common.h"

// Fatal on any CUDA error: a test cannot continue after one.
#define G_CHECK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t g_e_ = (expr);                                                                 \
        if (g_e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,                   \
                    cudaGetErrorString(g_e_));                                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline void *g_alloc(size_t bytes) {
    void *p = NULL;
    G_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static inline void *g_upload(const void *host, size_t bytes) {
    void *p = g_alloc(bytes);
    G_CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static inline void g_download(void *host, const void *dev, size_t bytes) {
    G_CHECK(cudaDeviceSynchronize());
    G_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

static inline void g_free(void *p) {
    if (p) G_CHECK(cudaFree(p));
}

// Host float array → bf16 bits (round to nearest even; exact for bf16-representable inputs).
static inline uint16_t *g_bf16_of(const float *x, size_t n) {
    uint16_t *h = (uint16_t *)t_alloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = ds_f32_to_bf16(x[i]);
    return h;
}

// Uploads x as f32 or as bf16.
static inline void *g_upload_as(const float *x, size_t n, enum ds_elem e) {
    if (e == DS_ELEM_F32) return g_upload(x, n * sizeof(float));
    uint16_t *h = g_bf16_of(x, n);
    void *d = g_upload(h, n * sizeof *h);
    free(h);
    return d;
}

// Downloads n elements of dtype e as floats.
static inline float *g_download_f(const void *dev, size_t n, enum ds_elem e) {
    float *out = (float *)t_alloc(n * sizeof(float));
    if (e == DS_ELEM_F32) {
        g_download(out, dev, n * sizeof(float));
    } else {
        uint16_t *h = (uint16_t *)t_alloc(n * sizeof *h);
        g_download(h, dev, n * sizeof *h);
        for (size_t i = 0; i < n; i++) out[i] = ds_bf16_to_f32(h[i]);
        free(h);
    }
    return out;
}

// n floats drawn uniformly from [lo, hi] (continuous values, not exact in bf16).
static inline void g_fill_cont(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)((double)(t_next(&s) >> 11) * 0x1p-53);
}

// Rounds every element to bf16 in place (so an f32 reference and a bf16 GPU run read the same
// values).
static inline void g_round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = ds_bf16_to_f32(ds_f32_to_bf16(x[i]));
}

// Compares got to want over n elements laid out in rows of `row_len`: |got − want| <= atol +
// rtol·|want|; NaN matches NaN, ±Inf must match exactly. Prints one summary line on failure.
// Returns the number of mismatches.
static inline size_t g_compare(const char *what, const float *got, const float *want, size_t n,
                               size_t row_len, double atol, double rtol) {
    size_t bad = 0, first = 0;
    double max_abs = 0.0, max_rel = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double g = got[i], w = want[i];
        int ok;
        if (isnan(w) || isnan(g)) ok = isnan(w) && isnan(g);
        else if (isinf(w) || isinf(g)) ok = g == w;
        else {
            const double d = fabs(g - w);
            if (d > max_abs) max_abs = d;
            if (w != 0.0 && d / fabs(w) > max_rel) max_rel = d / fabs(w);
            ok = d <= atol + rtol * fabs(w);
        }
        if (!ok && bad++ == 0) first = i;
    }
    if (bad) {
        const size_t r = row_len ? first / row_len : 0, c = row_len ? first % row_len : first;
        DS_FAILF("%s: %zu of %zu mismatch (atol %g rtol %g); max abs %.3g max rel %.3g; first at "
                 "row %zu col %zu: got %.9g want %.9g",
                 what, bad, n, atol, rtol, max_abs, max_rel, r, c, (double)got[first],
                 (double)want[first]);
    }
    return bad;
}

// Bitwise comparison of two byte ranges; prints the first differing byte's element.
static inline int g_same_bytes(const char *what, const void *a, const void *b, size_t bytes,
                               size_t elem_size) {
    if (!memcmp(a, b, bytes)) return 1;
    size_t i = 0;
    while (((const unsigned char *)a)[i] == ((const unsigned char *)b)[i]) i++;
    DS_FAILF("%s: not bitwise equal; first difference in element %zu", what, i / elem_size);
    return 0;
}

// One bf16 unit in the last place at the magnitude of w (for "within 1 bf16 ulp" checks).
static inline double g_bf16_ulp(double w) {
    int e;
    if (w == 0.0) return 0x1p-133;
    frexp(w, &e);
    return ldexp(1.0, e - 8);
}

// got (bf16 values) within `ulps` bf16 ulps of want rounded to bf16.
static inline size_t g_compare_bf16(const char *what, const float *got, const float *want,
                                    size_t n, size_t row_len, double ulps) {
    size_t bad = 0, first = 0, exact = 0;
    double max_ulps = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float wr = ds_bf16_to_f32(ds_f32_to_bf16(want[i]));
        if (isnan(wr) || isnan(got[i])) {
            if (!(isnan(wr) && isnan(got[i])) && bad++ == 0) first = i;
            continue;
        }
        const double u = fabs((double)got[i] - wr) / g_bf16_ulp(wr);
        exact += got[i] == wr;
        if (u > max_ulps) max_ulps = u;
        if (!(u <= ulps) && bad++ == 0) first = i;
    }
    if (bad) {
        const size_t r = row_len ? first / row_len : 0, c = row_len ? first % row_len : first;
        DS_FAILF("%s: %zu of %zu beyond %g bf16 ulp (%zu exact, max %.2f ulp); first at row %zu "
                 "col %zu: got %.9g want %.9g (bf16 %.9g)",
                 what, bad, n, ulps, exact, max_ulps, r, c, (double)got[first],
                 (double)want[first], (double)ds_bf16_to_f32(ds_f32_to_bf16(want[first])));
    }
    return bad;
}

// DS_GPU_TEST_SMALL set to anything but "" or "0": only the small-shape cases run. The sanitizer
// pass of scripts/gpu-tests.sh sets it (racecheck never finishes the real gpt-oss shapes); the
// normal run covers those.
static inline int g_small_only(void) {
    const char *v = getenv("DS_GPU_TEST_SMALL");
    return v && *v && strcmp(v, "0") != 0;
}

// 1 when the large case `name` is to be skipped, after one log line saying so (the log then shows
// what did not run).
static inline int g_small_skip(const char *name) {
    if (!g_small_only()) return 0;
    printf("skipped under DS_GPU_TEST_SMALL: %s\n", name);
    fflush(stdout);
    return 1;
}

// DS_RUN for a case of real (or otherwise large) shapes: not run, and not counted, in small mode.
#define G_RUN_LARGE(fn)                                                                            \
    do {                                                                                           \
        if (!g_small_skip(#fn)) DS_RUN(fn);                                                        \
    } while (0)

#define G_REQUIRE_GPU()                                                                            \
    do {                                                                                           \
        if (ds_cuda_device_count() == 0) DS_SKIP("no CUDA device");                                \
    } while (0)

#endif // DS_GPU_OPS_COMMON_H
