// Dense ops of the CPU reference: embedding, RMSNorm, matmul, add, SiLU product, row gather.
// Inputs are multiples of 1/64 (exact in bf16), so dot products of a few dozen terms are exact in
// double and the reference must match the formula bit for bit after one rounding to float.
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ds/kernels.h"
#include "test_ops_common.h"

static void embed_copies_rows_of_either_dtype(void) {
    enum { V = 7, C = 5, T = 4 };
    float table[V * C], out[T * C];
    uint16_t table16[V * C];
    t_fill(table, V * C, 1, 4.0f);
    t_to_bf16(table, table16, V * C);
    int32_t ids[T] = {6, 0, 3, 6};
    struct ds_embed_args a = {.act = DS_ELEM_F32, .table_dtype = DS_ELEM_BF16, .n_rows = T,
                              .vocab = V, .dim = C, .table = table16, .ids = ids, .out = out};
    EXPECT_OK(ds_embed_ref(&a));
    for (int t = 0; t < T; t++) EXPECT(t_same_bits(out + t * C, table + ids[t] * C, C));
    memset(out, 0, sizeof out);
    a.table_dtype = DS_ELEM_F32, a.table = table;
    EXPECT_OK(ds_embed_ref(&a));
    for (int t = 0; t < T; t++) EXPECT(t_same_bits(out + t * C, table + ids[t] * C, C));
    ids[2] = V;
    EXPECT_STATUS(ds_embed_ref(&a), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("row 2 has token id 7 outside [0, 7)");
}

// Hand-worked: x = [3, 4], mean(x²) = 12.5, gain [1, 2]: [3, 8] / sqrt(12.5).
static void rmsnorm_hand_case_and_formula(void) {
    float x[2] = {3, 4}, w[2] = {1, 2}, out[2];
    struct ds_rmsnorm_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = 1, .dim = 2,
                                .eps = 0.0f, .x = x, .w = w, .out = out};
    EXPECT_OK(ds_rmsnorm_ref(&a));
    EXPECT(out[0] == (float)(3 / sqrt(12.5)) && out[1] == (float)(8 / sqrt(12.5)));

    enum { T = 3, C = 45 };
    float xs[T * C], g[C], y[T * C];
    uint16_t g16[C];
    t_fill(xs, T * C, 2, 8.0f);
    t_fill(g, C, 3, 2.0f);
    t_to_bf16(g, g16, C);
    struct ds_rmsnorm_args b = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_BF16, .n_rows = T,
                                .dim = C, .eps = 1e-5f, .x = xs, .w = g16, .out = y};
    EXPECT_OK(ds_rmsnorm_ref(&b));
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xs[t * C + c] * xs[t * C + c];
        double inv = 1.0 / sqrt(ss / C + (double)1e-5f);
        // Tolerance: one float rounding of the output (|y| < 20): 2e-6 absolute.
        for (int c = 0; c < C; c++) EXPECT_NEAR(y[t * C + c], g[c] * xs[t * C + c] * inv, 2e-6);
    }
    // In place gives the same bits.
    b.out = xs;
    EXPECT_OK(ds_rmsnorm_ref(&b));
    EXPECT(t_same_bits(xs, y, T * C));
}

// y = x·Wᵀ + b + r computed exactly in double (all terms are multiples of 2^-12), rounded once.
static void expect_matmul_exact(const float *x, const float *w, const float *bias,
                                const float *res, const float *got, int T, int K, int N) {
    for (int t = 0; t < T; t++) {
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)x[t * K + k] * w[n * K + k];
            if (bias) s += bias[n];
            if (res) s += res[t * N + n];
            if (got[t * N + n] != (float)s) {
                DS_FAILF("T=%d K=%d N=%d: out[%d][%d] = %.9g, want %.9g", T, K, N, t, n,
                         got[t * N + n], (float)s);
                return;
            }
        }
    }
}

static void matmul_shape_matrix_bf16_and_f32_weights(void) {
    const int shapes[][3] = {{1, 37, 13}, {5, 37, 13}, {8, 64, 1}, {3, 1, 9}, {2, 130, 33}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int T = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        float *x = t_alloc(sizeof(float) * T * K), *w = t_alloc(sizeof(float) * N * K);
        float *b = t_alloc(sizeof(float) * N), *r = t_alloc(sizeof(float) * T * N);
        float *y = t_alloc(sizeof(float) * T * N);
        uint16_t *w16 = t_alloc(2 * (size_t)N * K), *b16 = t_alloc(2 * (size_t)N);
        t_fill(x, (size_t)T * K, 10 + si, 1.0f);
        t_fill(w, (size_t)N * K, 20 + si, 1.0f);
        t_fill(b, N, 30 + si, 1.0f);
        t_fill(r, (size_t)T * N, 40 + si, 1.0f);
        t_to_bf16(w, w16, (size_t)N * K);
        t_to_bf16(b, b16, N);
        struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_BF16,
                                   .bias_dtype = DS_ELEM_BF16, .n_rows = T, .in_dim = K,
                                   .out_dim = N, .x = x, .w = w16, .bias = b16, .out = y};
        EXPECT_OK(ds_matmul_ref(&a));
        expect_matmul_exact(x, w, b, NULL, y, T, K, N);
        a.w_dtype = DS_ELEM_F32, a.w = w, a.bias = NULL;
        EXPECT_OK(ds_matmul_ref(&a));
        expect_matmul_exact(x, w, NULL, NULL, y, T, K, N);
        // Fused residual, written in place over the residual.
        float *r0 = t_alloc(sizeof(float) * T * N);
        memcpy(r0, r, sizeof(float) * T * N);
        a.bias = b, a.bias_dtype = DS_ELEM_F32, a.residual = r, a.out = r;
        EXPECT_OK(ds_matmul_ref(&a));
        expect_matmul_exact(x, w, b, r0, r, T, K, N);
        free(x), free(w), free(b), free(r), free(r0), free(y), free(w16), free(b16);
    }
}

// Rows with non-exact sums (rounding order matters): a row alone, inside a batch of 8, and with
// one or two threads gives the same bits.
static void matmul_is_batch_and_thread_invariant(void) {
    enum { T = 8, K = 2880, N = 67 };
    float *x = t_alloc(sizeof(float) * T * K), *w = t_alloc(sizeof(float) * N * K);
    float *y = t_alloc(sizeof(float) * T * N), *y1 = t_alloc(sizeof(float) * N);
    uint64_t s = 99;
    for (int i = 0; i < T * K; i++) x[i] = (float)(t_next(&s) % 100003) / 7919.0f - 6.0f;
    for (int i = 0; i < N * K; i++) w[i] = (float)(t_next(&s) % 100019) / 104729.0f - 0.5f;
    struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = T,
                               .in_dim = K, .out_dim = N, .x = x, .w = w, .out = y};
    EXPECT_OK(ds_matmul_ref(&a));
    for (int t = 0; t < T; t++) {
        struct ds_matmul_args one = a;
        one.n_rows = 1, one.x = x + (size_t)t * K, one.out = y1;
        EXPECT_OK(ds_matmul_ref(&one));
        EXPECT(t_same_bits(y1, y + (size_t)t * N, N));
    }
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    float *y2 = t_alloc(sizeof(float) * T * N);
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        a.out = y2;
        EXPECT_OK(ds_matmul_ref(&a));
        EXPECT(t_same_bits(y2, y, (size_t)T * N));
    }
    omp_set_num_threads(saved);
    free(y2);
#endif
    free(x), free(w), free(y), free(y1);
}

static void matmul_rejects_bad_arguments(void) {
    float x[4] = {0}, w[4] = {0}, y[4];
    struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = 1,
                               .in_dim = 2, .out_dim = 2, .x = x, .w = w, .out = x};
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("alias");
    a.out = y, a.w = NULL;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("weight buffer is NULL");
    a.w = w, a.w_dtype = (enum ds_elem)9;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    a.w_dtype = DS_ELEM_F32, a.in_dim = 0;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("in_dim is 0");
}

// Split outputs: [q; k; v] weights back to back, one call writes three buffers. Each part must
// equal the exact formula (hand computed in double, as expect_matmul_exact) at row stride = its
// width, with its own bias (a NULL bias adds nothing), and equal three plain calls bit for bit.
static void matmul_split_outputs_match_separate_calls(void) {
    enum { T = 3, K = 24, D0 = 5, D1 = 2, D2 = 3, N = D0 + D1 + D2 };
    float x[T * K], w[N * K], b0[D0], b2[D2];
    t_fill(x, T * K, 50, 1.0f);
    t_fill(w, N * K, 51, 1.0f);
    t_fill(b0, D0, 52, 1.0f);
    t_fill(b2, D2, 53, 1.0f);
    float q[T * D0], k[T * D1], v[T * D2];
    struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .out_dim = N,
                               .x = x, .w = w, .bias = b0, .out = q, .part_dim = {D0, D1, D2},
                               .out1 = k, .out2 = v, .bias1 = NULL, .bias2 = b2};
    EXPECT_OK(ds_matmul_ref(&a));
    expect_matmul_exact(x, w, b0, NULL, q, T, K, D0);
    expect_matmul_exact(x, w + D0 * K, NULL, NULL, k, T, K, D1);
    expect_matmul_exact(x, w + (D0 + D1) * K, b2, NULL, v, T, K, D2);
    // The same parts from three plain calls: bitwise equal.
    float q1[T * D0], k1[T * D1], v1[T * D2];
    struct ds_matmul_args p = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .x = x};
    p.out_dim = D0, p.w = w, p.bias = b0, p.out = q1;
    EXPECT_OK(ds_matmul_ref(&p));
    p.out_dim = D1, p.w = w + D0 * K, p.bias = NULL, p.out = k1;
    EXPECT_OK(ds_matmul_ref(&p));
    p.out_dim = D2, p.w = w + (D0 + D1) * K, p.bias = b2, p.out = v1;
    EXPECT_OK(ds_matmul_ref(&p));
    EXPECT(t_same_bits(q, q1, T * D0) && t_same_bits(k, k1, T * D1) && t_same_bits(v, v1, T * D2));
    // A zero-width middle part is absent: [0, D0) to out, [D0, N) to out2.
    float v2[T * (N - D0)];
    a.part_dim[1] = 0, a.part_dim[2] = N - D0, a.out1 = NULL, a.out2 = v2, a.bias2 = NULL;
    EXPECT_OK(ds_matmul_ref(&a));
    expect_matmul_exact(x, w + D0 * K, NULL, NULL, v2, T, K, N - D0);
    // Bad splits are refused with the reason.
    a.part_dim[2] = 1;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("split widths 5 + 0 + 1 do not sum to out_dim 10");
    a.part_dim[0] = 0, a.part_dim[2] = N;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("the first must be > 0");
    a.part_dim[0] = D0, a.part_dim[1] = D1, a.part_dim[2] = D2, a.out1 = k, a.out2 = NULL;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("out2 buffer is NULL");
    a.out2 = x;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("out2 must not alias x");
    a.out2 = v, a.residual = q;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("a split output takes no residual");
}

// RoPE fields: a split call with rope_cos set rotates out (q) and out1 (k) in place and must give
// the bits of the same call without them followed by ds_rope (the CUDA launcher fuses the two, its
// test compares against this order); v is untouched. Bad RoPE fields are refused with the reason.
static void matmul_rope_fields_equal_matmul_then_rope(void) {
    enum { T = 3, K = 24, D = 8, NQ = 2, NK = 1, P = 16 };
    enum { D0 = NQ * D, D1 = NK * D, D2 = 5, N = D0 + D1 + D2 };
    float x[T * K], w[N * K], b[N], cs[P * D / 2], sn[P * D / 2];
    t_fill(x, T * K, 60, 1.0f);
    t_fill(w, N * K, 61, 1.0f);
    t_fill(b, N, 62, 1.0f);
    const struct ds_rope_table_config cfg = {.kind = DS_ROPE_TABLE_PLAIN, .head_dim = D,
                                             .theta = 10000.0};
    EXPECT_OK(ds_rope_table_fill(&cfg, P, cs, sn));
    int32_t pos[T] = {0, 7, P - 1};
    float q[T * D0], k[T * D1], v[T * D2], q2[T * D0], k2[T * D1], v2[T * D2];
    struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .out_dim = N,
                               .x = x, .w = w, .bias = b, .out = q2, .part_dim = {D0, D1, D2},
                               .out1 = k2, .out2 = v2, .bias1 = b + D0, .bias2 = b + D0 + D1};
    EXPECT_OK(ds_matmul_ref(&a)); // the product alone, then the rope op
    struct ds_rope_args r = {.act = DS_ELEM_F32, .n_rows = T, .head_dim = D, .n_q_heads = NQ,
                             .n_k_heads = NK, .q = q2, .k = k2, .positions = pos, .cos = cs,
                             .sin = sn, .table_len = P};
    EXPECT_OK(ds_rope_ref(&r));
    a.out = q, a.out1 = k, a.out2 = v, a.rope_head_dim = D, a.rope_positions = pos;
    a.rope_cos = cs, a.rope_sin = sn, a.rope_table_len = P;
    EXPECT_OK(ds_matmul_ref(&a));
    EXPECT(t_same_bits(q, q2, T * D0) && t_same_bits(k, k2, T * D1) && t_same_bits(v, v2, T * D2));
    // Not a no-op: row 1 (position 7) differs from the unrotated product.
    a.rope_cos = NULL, a.out = q2;
    EXPECT_OK(ds_matmul_ref(&a));
    EXPECT(!t_same_bits(q + D0, q2 + D0, D0));
    a.rope_cos = cs;
    // Bad fields name the problem.
    a.rope_head_dim = 3;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("RoPE head_dim 3 must be even and divide the q and k widths 16 and 8");
    a.rope_head_dim = D, a.rope_sin = NULL;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("rope sin table buffer is NULL");
    a.rope_sin = sn, a.part_dim[1] = 0, a.part_dim[2] = D1 + D2, a.out1 = NULL;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("RoPE needs a split with q and k parts (widths 16, 0)");
    // A position past the table is the rope op's range error.
    a.part_dim[1] = D1, a.part_dim[2] = D2, a.out1 = k, pos[1] = P;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_RANGE);
}

static void add_silu_mul_and_gather(void) {
    enum { T = 3, C = 11 };
    float a[T * C], b[T * C], y[T * C];
    t_fill(a, T * C, 5, 8.0f);
    t_fill(b, T * C, 6, 8.0f);
    struct ds_add_args ad = {.act = DS_ELEM_F32, .n_rows = T, .dim = C, .a = a, .b = b, .out = y};
    EXPECT_OK(ds_add_ref(&ad));
    for (int i = 0; i < T * C; i++) EXPECT(y[i] == a[i] + b[i]); // exact: multiples of 1/8
    struct ds_silu_mul_args sm = {.act = DS_ELEM_F32, .n_rows = T, .dim = C, .gate = a, .up = b,
                                  .out = y};
    EXPECT_OK(ds_silu_mul_ref(&sm));
    // One float rounding of |value| <= 64: 1e-5 absolute.
    for (int i = 0; i < T * C; i++)
        EXPECT_NEAR(y[i], a[i] / (1.0 + exp(-(double)a[i])) * b[i], 1e-5);
    int32_t rows[4] = {2, 0, 2, 1};
    float g[4 * C];
    struct ds_gather_rows_args ga = {.act = DS_ELEM_F32, .n_rows = 4, .src_rows = T, .dim = C,
                                     .x = a, .rows = rows, .out = g};
    EXPECT_OK(ds_gather_rows_ref(&ga));
    for (int i = 0; i < 4; i++) EXPECT(t_same_bits(g + i * C, a + rows[i] * C, C));
    rows[3] = 3;
    EXPECT_STATUS(ds_gather_rows_ref(&ga), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("picks row 3 of 3");
}

int main(void) {
    DS_RUN(embed_copies_rows_of_either_dtype);
    DS_RUN(rmsnorm_hand_case_and_formula);
    DS_RUN(matmul_shape_matrix_bf16_and_f32_weights);
    DS_RUN(matmul_is_batch_and_thread_invariant);
    DS_RUN(matmul_rejects_bad_arguments);
    DS_RUN(matmul_split_outputs_match_separate_calls);
    DS_RUN(matmul_rope_fields_equal_matmul_then_rope);
    DS_RUN(add_silu_mul_and_gather);
    return ds_test_end();
}
