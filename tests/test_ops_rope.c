// RoPE: YaRN frequencies against the gpt-oss spec §4.4 test vector, the plain draft rope, the
// cos/sin table, and the NeoX half-split rotation (ds_rope_freqs_compute, ds_rope_table_fill,
// ds_rope_ref).
#include "ds/kernels.h"
#include "test_ops_common.h"

static const struct ds_rope_table_config gptoss_rope = {.kind = DS_ROPE_TABLE_YARN,
                                                        .head_dim = 64,
                                                        .theta = 150000.0,
                                                        .factor = 32.0,
                                                        .beta_fast = 32.0,
                                                        .beta_slow = 1.0,
                                                        .original_max_pos = 4096,
                                                        .truncate = false};

static const struct ds_rope_table_config draft_rope = {
    .kind = DS_ROPE_TABLE_PLAIN, .head_dim = 64, .theta = 10000.0};

// gpt-oss spec §4.4, "inv_freq test vector (float64)", 10 significant digits.
static const double spec_inv_freq[32] = {
    1.000000000e+00, 6.890443059e-01, 4.747820555e-01, 3.271458719e-01, 2.254180002e-01,
    1.553229895e-01, 1.070244215e-01, 7.374456821e-02, 5.081327482e-02, 3.170569618e-02,
    1.933500113e-02, 1.159204926e-02, 6.794959490e-03, 3.860359317e-03, 2.093792379e-03,
    1.052602101e-03, 4.564839192e-04, 1.293187012e-04, 3.830881237e-05, 2.639646903e-05,
    1.818833668e-05, 1.253256982e-05, 8.635495875e-06, 5.950239261e-06, 4.099978482e-06,
    2.825066827e-06, 1.946596211e-06, 1.341291035e-06, 9.242089502e-07, 6.368209146e-07,
    4.387978251e-07, 3.023511428e-07};

// Spec §4.4 ramp r_i for i = 9..17 (6 decimals).
static const double spec_ramp[9] = {0.097496, 0.204962, 0.312428, 0.419894, 0.527361,
                                    0.634827, 0.742293, 0.849760, 0.957226};

static void yarn_inv_freq_matches_the_spec_vector(void) {
    struct ds_rope_freqs f;
    EXPECT_OK(ds_rope_freqs_compute(&gptoss_rope, &f));
    EXPECT_EQ_INT(f.n_half, 32);
    // Tolerance: 1e-9 relative; the spec prints 10 significant digits (rounding <= 5e-10).
    for (int i = 0; i < 32; i++)
        if (!(fabs(f.inv_freq[i] - spec_inv_freq[i]) <= 1e-9 * spec_inv_freq[i]))
            DS_FAILF("inv_freq[%d] = %.12g, spec %.12g", i, f.inv_freq[i], spec_inv_freq[i]);
}

static void yarn_ramp_range_and_concentration(void) {
    struct ds_rope_freqs f;
    EXPECT_OK(ds_rope_freqs_compute(&gptoss_rope, &f));
    // Spec values printed with 16 significant digits: 1e-13 covers their rounding.
    EXPECT_NEAR(f.low, 8.092779115512402, 1e-13);
    EXPECT_NEAR(f.high, 17.39802450158856, 1e-13);
    EXPECT_NEAR(f.concentration, 1.3465735902799727, 1e-15);
    // Ramp printed with 6 decimals: 5e-7 plus a hair.
    for (int i = 9; i <= 17; i++) EXPECT_NEAR(f.ramp[i], spec_ramp[i - 9], 6e-7);
    for (int i = 0; i <= 8; i++) EXPECT(f.ramp[i] == 0.0); // pure original frequency
    for (int i = 18; i < 32; i++) EXPECT(f.ramp[i] == 1.0); // pure interpolated (÷32)
}

// truncate = true (older vLLM behaviour) rounds the range to floor/ceil: 8 and 18.
static void yarn_truncate_rounds_the_range(void) {
    struct ds_rope_table_config c = gptoss_rope;
    c.truncate = true;
    struct ds_rope_freqs f;
    EXPECT_OK(ds_rope_freqs_compute(&c, &f));
    EXPECT(f.low == 8.0 && f.high == 18.0);
    for (int i = 0; i < 32; i++) {
        double r = fmin(fmax((i - 8.0) / 10.0, 0.0), 1.0);
        double base = pow(150000.0, -2.0 * i / 64.0);
        EXPECT_NEAR(f.inv_freq[i], r * base / 32.0 + (1.0 - r) * base, 1e-15 * base + 1e-300);
    }
}

static void plain_rope_has_no_scaling(void) {
    struct ds_rope_freqs f;
    EXPECT_OK(ds_rope_freqs_compute(&draft_rope, &f));
    EXPECT(f.concentration == 1.0);
    for (int i = 0; i < 32; i++) {
        double want = 1.0 / pow(10000.0, 2.0 * i / 64.0);
        EXPECT_NEAR(f.inv_freq[i], want, 1e-15 * want);
    }
}

// YaRN inverse frequency straight from the spec formula (independent of the library).
static double spec_yarn_inv_freq(int i) {
    const double pi = 3.14159265358979323846, lnth = log(150000.0);
    double low = 32.0 * log(4096.0 / (32.0 * 2 * pi)) / lnth;
    double high = 32.0 * log(4096.0 / (1.0 * 2 * pi)) / lnth;
    double r = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
    double f = pow(150000.0, 2.0 * i / 64.0);
    return r / (32.0 * f) + (1.0 - r) / f;
}

static void table_carries_the_concentration_on_cos_and_sin(void) {
    enum { NPOS = 131072, H = 32 };
    float *c = t_alloc(sizeof(float) * NPOS * H), *s = t_alloc(sizeof(float) * NPOS * H);
    EXPECT_OK(ds_rope_table_fill(&gptoss_rope, NPOS, c, s));
    const double C = 0.1 * log(32.0) + 1.0;
    const int positions[] = {0, 1, 2, 127, 128, 4095, 4096, 70000, NPOS - 1};
    // Tolerance 2e-7: one float rounding of a value of magnitude <= 1.35 (half ulp 6e-8 at 1).
    for (size_t k = 0; k < sizeof positions / sizeof positions[0]; k++) {
        int p = positions[k];
        for (int i = 0; i < H; i++) {
            double ang = p * spec_yarn_inv_freq(i);
            EXPECT_NEAR(c[(size_t)p * H + i], C * cos(ang), 2e-7);
            EXPECT_NEAR(s[(size_t)p * H + i], C * sin(ang), 2e-7);
        }
    }
    EXPECT(c[0] == (float)C && s[0] == 0.0f); // position 0: cos = C, sin = 0
    free(c);
    free(s);
}

// Hand-worked: D = 4, pair 0 turned by 90°, pair 1 by 0°: [1,2,3,4] -> [-3, 2, 1, 4]. Shows the
// pairs are (i, i + D/2), not (2i, 2i + 1).
static void rotation_is_half_split(void) {
    float cos_t[2 * 2] = {1, 1, 0, 1}, sin_t[2 * 2] = {0, 0, 1, 0}; // row 1 = position 1
    float q[4] = {1, 2, 3, 4};
    int32_t pos[1] = {1};
    struct ds_rope_args a = {.act = DS_ELEM_F32, .n_rows = 1, .head_dim = 4, .n_q_heads = 1,
                             .q = q, .positions = pos, .cos = cos_t, .sin = sin_t, .table_len = 2};
    EXPECT_OK(ds_rope_ref(&a));
    EXPECT(q[0] == -3 && q[1] == 2 && q[2] == 1 && q[3] == 4);
}

// Random q and k heads against the rotation formula in double, then batch invariance.
static void rotation_matches_formula_and_is_row_independent(void) {
    enum { T = 8, NH = 3, NKV = 1, D = 64, NPOS = 300 };
    float *c = t_alloc(sizeof(float) * NPOS * D / 2), *s = t_alloc(sizeof(float) * NPOS * D / 2);
    EXPECT_OK(ds_rope_table_fill(&gptoss_rope, NPOS, c, s));
    float q[T * NH * D], k[T * NKV * D], q0[T * NH * D], k0[T * NKV * D];
    t_fill(q0, T * NH * D, 11, 2.0f);
    t_fill(k0, T * NKV * D, 12, 2.0f);
    int32_t pos[T] = {0, 5, 299, 128, 7, 7, 42, 1};
    memcpy(q, q0, sizeof q);
    memcpy(k, k0, sizeof k);
    struct ds_rope_args a = {.act = DS_ELEM_F32, .n_rows = T, .head_dim = D, .n_q_heads = NH,
                             .n_k_heads = NKV, .q = q, .k = k, .positions = pos, .cos = c,
                             .sin = s, .table_len = NPOS};
    EXPECT_OK(ds_rope_ref(&a));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < NH; h++) {
            const float *x = q0 + (t * NH + h) * D, *y = q + (t * NH + h) * D;
            for (int i = 0; i < D / 2; i++) {
                double ci = c[pos[t] * D / 2 + i], si = s[pos[t] * D / 2 + i];
                // One float rounding of |value| <= ~6: 1e-6 absolute.
                EXPECT_NEAR(y[i], x[i] * ci - x[i + D / 2] * si, 1e-6);
                EXPECT_NEAR(y[i + D / 2], x[i + D / 2] * ci + x[i] * si, 1e-6);
            }
        }
    }
    // Each row alone gives bitwise the batch's result.
    for (int t = 0; t < T; t++) {
        float q1[NH * D], k1[NKV * D];
        memcpy(q1, q0 + t * NH * D, sizeof q1);
        memcpy(k1, k0 + t * NKV * D, sizeof k1);
        struct ds_rope_args one = a;
        one.n_rows = 1, one.q = q1, one.k = k1, one.positions = &pos[t];
        EXPECT_OK(ds_rope_ref(&one));
        EXPECT(t_same_bits(q1, q + t * NH * D, NH * D));
        EXPECT(t_same_bits(k1, k + t * NKV * D, NKV * D));
    }
    free(c);
    free(s);
}

static void bad_arguments_are_reported(void) {
    struct ds_rope_table_config odd = draft_rope;
    odd.head_dim = 63;
    struct ds_rope_freqs f;
    EXPECT_STATUS(ds_rope_freqs_compute(&odd, &f), DS_ERR_ARG);
    EXPECT_ERROR_HAS("head_dim 63");
    struct ds_rope_table_config bad = gptoss_rope;
    bad.beta_fast = 0.5;
    EXPECT_STATUS(ds_rope_freqs_compute(&bad, &f), DS_ERR_ARG);
    EXPECT_ERROR_HAS("beta_fast");
    float c[4] = {1, 1, 1, 1}, s[4] = {0}, q[4] = {0};
    int32_t pos[1] = {2};
    struct ds_rope_args a = {.act = DS_ELEM_F32, .n_rows = 1, .head_dim = 4, .n_q_heads = 1,
                             .q = q, .positions = pos, .cos = c, .sin = s, .table_len = 2};
    EXPECT_STATUS(ds_rope_ref(&a), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("position 2 outside the table of 2");
    a.act = DS_ELEM_BF16;
    EXPECT_STATUS(ds_rope_ref(&a), DS_ERR_UNSUPPORTED);
}

int main(void) {
    DS_RUN(yarn_inv_freq_matches_the_spec_vector);
    DS_RUN(yarn_ramp_range_and_concentration);
    DS_RUN(yarn_truncate_rounds_the_range);
    DS_RUN(plain_rope_has_no_scaling);
    DS_RUN(table_carries_the_concentration_on_cos_and_sin);
    DS_RUN(rotation_is_half_split);
    DS_RUN(rotation_matches_formula_and_is_row_independent);
    DS_RUN(bad_arguments_are_reported);
    return ds_test_end();
}
