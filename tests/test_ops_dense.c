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

// ---------------------------------------------------------------------------------------------
// Deferred RMSNorm (ds/kernel_args.h): out = s(rms_of)·(W·x) + b + r with x = g ⊙ rms_of, and the
// producers' norm_out = g ⊙ out.

// Hand-worked, K = N = 2, W = [[1, 1], [1, -1]], bias [0.5, 0.25], gain g = [1, 3], eps 0:
//   row 0: x0 = [2, 2]: mean(x0²) = 4, s = 1/2; x = g ⊙ x0 = [2, 6]; W·x = [8, -4];
//          s·W·x = [4, -2]; + bias = [4.5, -1.75]; + residual [1, -1] = [5.5, -2.75].
//          (rmsnorm first: x0·s ⊙ g = [1, 3], W·[1, 3] = [4, -2]: the same.)
//   row 1: x0 = [1, 7]: mean = 25, s = 1/5; x = [1, 21]; W·x = [22, -20]; s·W·x = [4.4, -4];
//          + bias = [4.9, -3.75]; + residual [2, 0] = [6.9, -3.75].
// norm_out with gain [2, 0.5]: row 0 [11, -1.375], row 1 [2·6.9f, -1.875].
// eps enters under the root: x0 = [1, 1], eps 3: mean + eps = 4, s = 1/2; x = [1, 3];
// W·x = [4, -2]; s·W·x + bias (no residual) = [2.5, -0.75].
static void matmul_rms_of_hand_case(void) {
    float w[4] = {1, 1, 1, -1}, b[2] = {0.5f, 0.25f}, gn[2] = {2, 0.5f};
    float x0[4] = {2, 2, 1, 7}, x[4] = {2, 6, 1, 21}, res[4] = {1, -1, 2, 0};
    float out[4], nout[4];
    struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = 2, .in_dim = 2, .out_dim = 2,
                               .x = x, .w = w, .bias = b, .residual = res, .out = out,
                               .rms_of = x0, .rms_eps = 0.0f, .norm_gain = gn,
                               .norm_gain_dtype = DS_ELEM_F32, .norm_out = nout};
    EXPECT_OK(ds_matmul_ref(&a));
    EXPECT(out[0] == 5.5f && out[1] == -2.75f);
    EXPECT(out[2] == 6.9f && out[3] == -3.75f);
    EXPECT(nout[0] == 11.0f && nout[1] == -1.375f && nout[2] == 2 * 6.9f && nout[3] == -1.875f);
    float x1[2] = {1, 1}, xg1[2] = {1, 3};
    struct ds_matmul_args e = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = 1, .in_dim = 2, .out_dim = 2,
                               .x = xg1, .w = w, .bias = b, .out = out, .rms_of = x1,
                               .rms_eps = 3.0f};
    EXPECT_OK(ds_matmul_ref(&e));
    EXPECT(out[0] == 2.5f && out[1] == -0.75f);
}

// n floats uniform in [lo, hi] (continuous: products and sums of them round).
static void fill_cont(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)((double)(t_next(&s) >> 11) * 0x1p-53);
}

// One deferred-norm matmul problem: rms_of x0 (T, K), gain g (K, bf16-exact), x = f32(g ⊙ x0)
// computed here, w (N, K), bias, residual. exact = 1: every input a multiple of 1/64 (t_fill), so
// g ⊙ x0 is exact in f32 and every sum below is exact in double; else x0 is continuous.
static void check_rms_of_problem(int T, int K, int N, int exact, uint64_t seed) {
    const double eps = 1e-5f;
    float *x0 = t_alloc(sizeof(float) * T * K), *x = t_alloc(sizeof(float) * T * K);
    float *g = t_alloc(sizeof(float) * K), *w = t_alloc(sizeof(float) * N * K);
    float *b = t_alloc(sizeof(float) * N), *r = t_alloc(sizeof(float) * T * N);
    float *y = t_alloc(sizeof(float) * T * N), *y2 = t_alloc(sizeof(float) * T * N);
    float *xn = t_alloc(sizeof(float) * T * K), *r2 = t_alloc(sizeof(float) * T * N);
    uint16_t *g16 = t_alloc(2 * (size_t)K);
    if (exact) t_fill(x0, (size_t)T * K, seed, 1.0f);
    else fill_cont(x0, (size_t)T * K, seed, -3.0f, 3.0f);
    t_fill(g, K, seed + 1, 2.0f);
    t_fill(w, (size_t)N * K, seed + 2, 1.0f);
    t_fill(b, N, seed + 3, 1.0f);
    t_fill(r, (size_t)T * N, seed + 4, 4.0f);
    t_to_bf16(g, g16, K);
    for (int i = 0; i < T * K; i++) x[i] = g[i % K] * x0[i]; // the producer's norm_out
    struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .out_dim = N,
                               .x = x, .w = w, .bias = b, .residual = r, .out = y, .rms_of = x0,
                               .rms_eps = (float)eps};
    EXPECT_OK(ds_matmul_ref(&a));

    // (1) Exact inputs: the formula of ds/kernel_args.h evaluated here in double. Every sum is
    // exact, and s, s·Σ, + b, + r are the same double operations, so the bits must agree.
    if (exact)
        for (int t = 0; t < T; t++) {
            double ss = 0;
            for (int k = 0; k < K; k++) ss += (double)x0[t * K + k] * x0[t * K + k];
            const double st = 1.0 / sqrt(ss / K + eps);
            for (int n = 0; n < N; n++) {
                double d = 0;
                for (int k = 0; k < K; k++) d += (double)x[t * K + k] * w[n * K + k];
                const float want = (float)(d * st + b[n] + r[t * N + n]);
                if (y[t * N + n] != want) {
                    DS_FAILF("T=%d K=%d N=%d: out[%d][%d] = %.9g, formula %.9g", T, K, N, t, n,
                             y[t * N + n], want);
                    t = T;
                    break;
                }
            }
        }

    // (2) rmsnorm(x0) with gain g, then the plain matmul: equal up to rounding. The deferred path
    // rounds g ⊙ x0 to f32 (exact when exact = 1), the other g ⊙ x0 · s (2^-24 relative each), so
    // the products differ by at most 2^-24·Σ_k |xn_k·w_k| per rounded input path, and each output
    // is rounded once on each side (2^-24·|y| each). Tolerance per element, twice that bound:
    // 2^-22·(Σ_k |xn_k·w_k| + |y|).
    struct ds_rmsnorm_args nm = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_BF16, .n_rows = T,
                                 .dim = K, .eps = (float)eps, .x = x0, .w = g16, .out = xn};
    EXPECT_OK(ds_rmsnorm_ref(&nm));
    struct ds_matmul_args p = a;
    p.x = xn, p.rms_of = NULL, p.out = y2;
    EXPECT_OK(ds_matmul_ref(&p));
    // Also the row-relative size: the roundings have random signs, so the differences grow like
    // sqrt(K)·2^-24 of a term rather than the bound's K·2^-24; measured here (K up to 2880) at
    // most 1.1e-7 of the row's largest |y|, checked against 1e-6.
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double ymax = 0;
        for (int n = 0; n < N; n++) ymax = fmax(ymax, fabs(y2[t * N + n]));
        for (int n = 0; n < N; n++) {
            double mag = 0;
            for (int k = 0; k < K; k++) mag += fabs((double)xn[t * K + k] * w[n * K + k]);
            const double d = fabs((double)y[t * N + n] - y2[t * N + n]);
            worst = fmax(worst, d / ymax);
            if (!(d <= 0x1p-22 * (mag + fabs(y2[t * N + n])))) {
                DS_FAILF("T=%d K=%d N=%d exact=%d: deferred out[%d][%d] = %.9g, rmsnorm then "
                         "matmul %.9g (bound %.3g)", T, K, N, exact, t, n, y[t * N + n],
                         y2[t * N + n], 0x1p-22 * (mag + fabs(y2[t * N + n])));
                t = T;
                break;
            }
        }
    }
    if (worst > 1e-6) DS_FAILF("T=%d K=%d N=%d: worst error %.3g of the row's largest |out|", T, K,
                               N, worst);

    // (3) In place over the residual, and each row alone: the same bits.
    memcpy(r2, r, sizeof(float) * T * N);
    a.residual = r2, a.out = r2;
    EXPECT_OK(ds_matmul_ref(&a));
    EXPECT(t_same_bits(r2, y, (size_t)T * N));
    a.residual = r;
    for (int t = 0; t < T; t++) {
        struct ds_matmul_args one = a;
        one.n_rows = 1, one.x = x + (size_t)t * K, one.rms_of = x0 + (size_t)t * K;
        one.residual = r + (size_t)t * N, one.out = y2;
        EXPECT_OK(ds_matmul_ref(&one));
        EXPECT(t_same_bits(y2, y + (size_t)t * N, N));
    }
    free(x0), free(x), free(g), free(w), free(b), free(r), free(y), free(y2), free(xn), free(r2);
    free(g16);
}

static void matmul_rms_of_equals_formula_and_rmsnorm_then_matmul(void) {
    check_rms_of_problem(1, 64, 13, 1, 70);
    check_rms_of_problem(5, 72, 33, 1, 71);
    check_rms_of_problem(3, 37, 9, 1, 72); // K % 8 != 0 (the reference has no such limit)
    check_rms_of_problem(4, 2880, 24, 1, 73);
    check_rms_of_problem(5, 72, 33, 0, 74);
    check_rms_of_problem(3, 2880, 24, 0, 75);
}

// norm_out is g ⊙ out with out as stored: each element one f32 multiply of the stored output
// (recomputed here), bitwise, for f32 and bf16 gains, with a residual written in place, with and
// without rms_of (continuous values, so the products do round); the rows' out is unchanged by it.
static void matmul_norm_out_is_gain_times_stored_out(void) {
    enum { T = 4, K = 40, N = 24 };
    float x[T * K], x0[T * K], w[N * K], b[N], r[T * N], r0[T * N], y[T * N], ny[T * N], g[N];
    uint16_t g16[N];
    fill_cont(x, T * K, 80, -2.0f, 2.0f);
    fill_cont(x0, T * K, 81, -2.0f, 2.0f);
    fill_cont(w, N * K, 82, -0.5f, 0.5f);
    fill_cont(b, N, 83, -1.0f, 1.0f);
    fill_cont(r0, T * N, 84, -4.0f, 4.0f);
    t_fill(g, N, 85, 2.0f);
    t_to_bf16(g, g16, N);
    for (int rms = 0; rms < 2; rms++)
        for (int gi = 0; gi < 2; gi++) {
            float plain[T * N];
            memcpy(r, r0, sizeof r);
            struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                                       .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K,
                                       .out_dim = N, .x = x, .w = w, .bias = b, .residual = r0,
                                       .out = plain, .rms_of = rms ? x0 : NULL, .rms_eps = 1e-5f};
            EXPECT_OK(ds_matmul_ref(&a));
            a.residual = r, a.out = r, a.norm_gain = gi ? (const void *)g16 : (const void *)g;
            a.norm_gain_dtype = gi ? DS_ELEM_BF16 : DS_ELEM_F32, a.norm_out = ny;
            EXPECT_OK(ds_matmul_ref(&a));
            EXPECT(t_same_bits(r, plain, T * N));
            memcpy(y, r, sizeof y);
            for (int i = 0; i < T * N; i++) {
                const float want = g[i % N] * y[i];
                if (!t_same_bits(&ny[i], &want, 1)) {
                    DS_FAILF("rms_of %d gain %s: norm_out[%d] = %.9g, g·out = %.9g", rms,
                             gi ? "bf16" : "f32", i, ny[i], want);
                    break;
                }
            }
        }
}

// embed's norm_out: g ⊙ (the copied row), bitwise, both table dtypes, f32 and bf16 gains.
static void embed_norm_out_is_gain_times_row(void) {
    enum { V = 7, C = 21, T = 5 };
    float table[V * C], out[T * C], nout[T * C], g[C], gc[C];
    uint16_t table16[V * C], g16[C];
    t_fill(table, V * C, 90, 4.0f);
    t_to_bf16(table, table16, V * C);
    t_fill(g, C, 91, 2.0f);
    t_to_bf16(g, g16, C);
    fill_cont(gc, C, 92, 0.5f, 1.5f);
    int32_t ids[T] = {3, 0, 6, 3, 1};
    for (int ti = 0; ti < 2; ti++)
        for (int gi = 0; gi < 2; gi++) {
            const float *gv = gi ? g : gc;
            struct ds_embed_args a = {.act = DS_ELEM_F32,
                                      .table_dtype = ti ? DS_ELEM_BF16 : DS_ELEM_F32, .n_rows = T,
                                      .vocab = V, .dim = C,
                                      .table = ti ? (const void *)table16 : (const void *)table,
                                      .ids = ids, .out = out,
                                      .norm_gain = gi ? (const void *)g16 : (const void *)gc,
                                      .norm_gain_dtype = gi ? DS_ELEM_BF16 : DS_ELEM_F32,
                                      .norm_out = nout};
            EXPECT_OK(ds_embed_ref(&a));
            for (int t = 0; t < T; t++) {
                EXPECT(t_same_bits(out + t * C, table + ids[t] * C, C));
                float want[C];
                for (int c = 0; c < C; c++) want[c] = gv[c] * table[ids[t] * C + c];
                EXPECT(t_same_bits(nout + t * C, want, C));
            }
        }
}

// Argument errors of the deferred-norm fields, each named.
static void deferred_norm_rejects_bad_arguments(void) {
    float x[16] = {0}, x0[16], w[64] = {0}, g[8] = {1}, y[16], y1[16], ny[16];
    for (int i = 0; i < 16; i++) x0[i] = 1.0f;
    struct ds_matmul_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = 2,
                               .in_dim = 8, .out_dim = 8, .x = x, .w = w, .out = y,
                               .part_dim = {4, 4, 0}, .out1 = y1, .norm_gain = g,
                               .norm_gain_dtype = DS_ELEM_F32, .norm_out = ny};
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: a split output takes no norm_gain");
    a.part_dim[0] = a.part_dim[1] = 0, a.out1 = NULL, a.norm_out = NULL;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: norm_out buffer is NULL");
    a.norm_out = y;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: norm_out must not alias out");
    a.norm_out = ny, a.norm_gain_dtype = (enum ds_elem)9;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("norm gain dtype 9");
    a.norm_gain_dtype = DS_ELEM_F32, a.rms_of = y;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: rms_of must not alias out");
    a.rms_of = x0, a.rms_eps = -1.0f;
    EXPECT_STATUS(ds_matmul_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: rms_eps -1 is negative");
    a.rms_eps = 0.0f;
    EXPECT_OK(ds_matmul_ref(&a));
    // The split with rms_of alone is fine (q/k/v of a deferred norm).
    a.norm_gain = NULL, a.part_dim[0] = a.part_dim[1] = 4, a.out1 = y1;
    EXPECT_OK(ds_matmul_ref(&a));
    int32_t ids[2] = {0, 1};
    struct ds_embed_args e = {.act = DS_ELEM_F32, .table_dtype = DS_ELEM_F32, .n_rows = 2,
                              .vocab = 2, .dim = 8, .table = x, .ids = ids, .out = y,
                              .norm_gain = g, .norm_gain_dtype = DS_ELEM_F32};
    EXPECT_STATUS(ds_embed_ref(&e), DS_ERR_ARG);
    EXPECT_ERROR_HAS("embed: norm_out buffer is NULL");
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
    DS_RUN(matmul_rms_of_hand_case);
    DS_RUN(matmul_rms_of_equals_formula_and_rmsnorm_then_matmul);
    DS_RUN(matmul_norm_out_is_gain_times_stored_out);
    DS_RUN(embed_norm_out_is_gain_times_row);
    DS_RUN(deferred_norm_rejects_bad_arguments);
    DS_RUN(add_silu_mul_and_gather);
    return ds_test_end();
}
