// tests/test_ops_common.h: helpers shared by the op tests (tests/test_ops_*.c).
//
// Inputs come from a seeded generator and are chosen exactly representable in bf16 (multiples of
// 1/64 with at most 8 significant bits), so one value can feed a bf16 weight, an f32 activation
// and the double-precision reference of a test without any rounding between them. The bf16 bits
// are made here by truncation, independently of ds/bf16.h.
#ifndef DS_TEST_OPS_COMMON_H
#define DS_TEST_OPS_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

// splitmix64: a tiny, well-mixed, seedable generator.
static inline uint64_t t_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform integer in [lo, hi].
static inline int t_int(uint64_t *s, int lo, int hi) {
    return lo + (int)(t_next(s) % (uint64_t)(hi - lo + 1));
}

// n values k/64·scale, k in [-64, 64]: exact in bf16 when scale is a power of two.
static inline void t_fill(float *x, size_t n, uint64_t seed, float scale) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) x[i] = (float)t_int(&s, -64, 64) / 64.0f * scale;
}

// bf16 bits of a float that is exactly representable in bf16 (the low 16 bits are zero).
static inline uint16_t t_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static inline void t_to_bf16(const float *x, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = t_bf16_bits(x[i]);
}

// Bitwise float equality (so -0 != +0 and NaN == NaN of the same payload).
static inline int t_same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

// |got - want| <= atol + rtol·|want| for every element; reports the first failure.
#define EXPECT_CLOSE_ARRAY(got, want, n, atol, rtol)                                               \
    do {                                                                                           \
        for (size_t ds_i_ = 0; ds_i_ < (size_t)(n); ds_i_++) {                                     \
            double ds_g_ = (double)(got)[ds_i_], ds_w_ = (double)(want)[ds_i_];                    \
            if (!(fabs(ds_g_ - ds_w_) <= (atol) + (rtol)*fabs(ds_w_))) {                           \
                DS_FAILF("%s[%zu] = %.9g, want %.9g", #got, ds_i_, ds_g_, ds_w_);                  \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static inline void *t_alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(1);
    }
    return p;
}

#endif // DS_TEST_OPS_COMMON_H
