// CUDA dense ops and RoPE against the CPU reference (ds_<op>_ref) on identical seeded inputs, over
// a shape matrix (1 row, partial tiles, the tiny test configs, the real gpt-oss / EAGLE-3 shapes),
// plus batch invariance: a row's bits alone and inside batches of 8, 32, 64, 256 and 300 rows;
// the same for the deferred RMSNorm fields (rms_of, norm_gain / norm_out of ds/kernel_args.h).
// Under DS_GPU_TEST_SMALL the matmuls of real weight shapes (K·N >= 2880², the smallest real
// layer) are skipped; every synthetic, partial-tile and row-op case still runs.
//
// Inputs are multiples of 1/64 (t_fill), exact in bf16, so the GPU's bf16 activations and the
// reference's f32 activations hold the same values. With such inputs every product is a multiple
// of 2^-12 and every partial sum stays far below 2^12 in magnitude, so fp32 accumulation is EXACT
// in any order: the f32 CUDA-core matmul must equal the reference bit for bit, and the bf16
// tensor-core matmul must equal the reference rounded to bf16 (allowed: 1 bf16 ulp, in case the
// tensor core's internal accumulation truncates; the message reports how many were exact).
// A separate "loose" case uses continuous random values with a tolerance derived below.
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"
#include "gpu_ops_common.h"

static const enum ds_elem dt[2] = {DS_ELEM_F32, DS_ELEM_BF16};
static const char *dt_name(enum ds_elem e) { return e == DS_ELEM_BF16 ? "bf16" : "f32"; }

// ---------------------------------------------------------------------------------------------

static void embed_case(int C);

// C = 2880: 16-byte group copies; C = 45: element copies (C % 8 != 0), same results.
static void embed_matches_reference_and_marks_bad_ids(void) {
    const int widths[2] = {2880, 45};
    for (int wi = 0; wi < 2; wi++) embed_case(widths[wi]);
}

static void embed_case(int C) {
    enum { V = 1000, T = 9 };
    float *table = t_alloc((size_t)V * C * sizeof(float));
    t_fill(table, (size_t)V * C, 11, 4.0f);
    int32_t ids[T] = {0, 999, 5, 5, 512, 1, 998, 0, 7};
    float *want = t_alloc((size_t)T * C * sizeof(float));
    struct ds_embed_args r = {.act = DS_ELEM_F32, .table_dtype = DS_ELEM_F32, .n_rows = T,
                              .vocab = V, .dim = C, .table = table, .ids = ids, .out = want};
    EXPECT_OK(ds_embed_ref(&r));
    int32_t *d_ids = g_upload(ids, sizeof ids);
    for (int ti = 0; ti < 2; ti++) {
        void *d_table = g_upload_as(table, (size_t)V * C, dt[ti]);
        for (int ai = 0; ai < 2; ai++) {
            void *d_out = g_alloc((size_t)T * C * 4);
            struct ds_embed_args a = {.act = dt[ai], .table_dtype = dt[ti], .n_rows = T,
                                      .vocab = V, .dim = C, .table = d_table, .ids = d_ids,
                                      .out = d_out};
            EXPECT_OK(ds_embed_cuda(&a, NULL));
            float *got = g_download_f(d_out, (size_t)T * C, dt[ai]);
            // A copy of exactly representable values: tolerance 0.
            char what[64];
            snprintf(what, sizeof what, "embed C=%d act %s table %s", C, dt_name(dt[ai]),
                     dt_name(dt[ti]));
            g_compare(what, got, want, (size_t)T * C, C, 0.0, 0.0);
            free(got);
            g_free(d_out);
        }
        g_free(d_table);
    }
    // A device-side id outside [0, V) never faults: its row becomes NaN, the others are intact.
    ids[3] = V;
    G_CHECK(cudaMemcpy(d_ids, ids, sizeof ids, cudaMemcpyHostToDevice));
    void *d_table = g_upload_as(table, (size_t)V * C, DS_ELEM_F32);
    void *d_out = g_alloc((size_t)T * C * 4);
    struct ds_embed_args a = {.act = DS_ELEM_F32, .table_dtype = DS_ELEM_F32, .n_rows = T,
                              .vocab = V, .dim = C, .table = d_table, .ids = d_ids, .out = d_out};
    EXPECT_OK(ds_embed_cuda(&a, NULL));
    float *got = g_download_f(d_out, (size_t)T * C, DS_ELEM_F32);
    EXPECT(isnan(got[3 * C]) && isnan(got[4 * C - 1]));
    EXPECT(t_same_bits(got + 4 * C, want + 4 * C, (size_t)(T - 4) * C));
    free(got);
    g_free(d_out);
    g_free(d_table);
    g_free(d_ids);
    // Host-side argument checks name the op and the problem.
    a.act = (enum ds_elem)7;
    EXPECT_STATUS(ds_embed_cuda(&a, NULL), DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("embed: activation dtype 7");
    free(table);
    free(want);
}

// ---------------------------------------------------------------------------------------------

static void rmsnorm_matches_reference(void) {
    // Fast path (C % 8 == 0, C <= 4096: registers, 16-byte loads): 64, 2880, 4096; element
    // loads: 45, 4104 (beyond the register budget).
    const int shapes[][2] = {{1, 64}, {5, 2880}, {37, 45}, {3, 4096}, {300, 64}, {2, 4104}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], C = shapes[s][1];
        const size_t n = (size_t)T * C;
        float *x = t_alloc(n * 4), *g = t_alloc((size_t)C * 4), *want = t_alloc(n * 4);
        t_fill(x, n, 100 + s, 8.0f);
        t_fill(g, C, 200 + s, 2.0f);
        struct ds_rmsnorm_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = T,
                                    .dim = C, .eps = 1e-5f, .x = x, .w = g, .out = want};
        EXPECT_OK(ds_rmsnorm_ref(&r));
        for (int wi = 0; wi < 2; wi++) {
            void *d_g = g_upload_as(g, C, dt[wi]);
            for (int ai = 0; ai < 2; ai++) {
                void *d_x = g_upload_as(x, n, dt[ai]);
                void *d_y = g_alloc(n * 4);
                struct ds_rmsnorm_args a = r;
                a.act = dt[ai], a.w_dtype = dt[wi], a.x = d_x, a.w = d_g, a.out = d_y;
                EXPECT_OK(ds_rmsnorm_cuda(&a, NULL));
                float *got = g_download_f(d_y, n, dt[ai]);
                char what[96];
                snprintf(what, sizeof what, "rmsnorm T=%d C=%d act %s gain %s", T, C,
                         dt_name(dt[ai]), dt_name(dt[wi]));
                // f32: both sides sum in double and scale in double; only the summation order
                // differs (~1e-16 relative), so at most one float rounding flips: 1 ulp = 1.2e-7.
                // bf16: the same value rounded once more to bf16: within 1 bf16 ulp.
                if (dt[ai] == DS_ELEM_F32) g_compare(what, got, want, n, C, 0.0, 1.2e-7);
                else g_compare_bf16(what, got, want, n, C, 1.0);
                // In place (out == x) gives the same bits.
                a.out = d_x;
                EXPECT_OK(ds_rmsnorm_cuda(&a, NULL));
                float *inplace = g_download_f(d_x, n, dt[ai]);
                EXPECT(t_same_bits(inplace, got, n));
                free(inplace);
                free(got);
                g_free(d_x);
                g_free(d_y);
            }
            g_free(d_g);
        }
        free(x), free(g), free(want);
    }
}

// ---------------------------------------------------------------------------------------------
// Matmul

struct mm_case {
    int T, K, N;
    int bias, residual; // 0/1
    const char *why;
};

// The shape matrix. Tensor-core tiles (features × tokens × K per stage) by T: with K % 8 == 0 and
// aligned buffers, T <= 8: the weight-streaming tile 16 × 8 × 256, T <= 16: 16 × 16 × 256, T <= 32
// (T <= 128 for N <= 65536): 16 × 32 × 256 over token tiles of 32; else T <= 8: 16 × 8 × 256
// (element loads), T <= 64: 32 × 64 × 128, larger: 64 × 128 × 64; k16 steps past K skipped, a
// partial last step zero-filled.
static const struct mm_case mm_cases[] = {
    {1, 64, 64, 0, 0, "one row, tiny config"},
    {1, 37, 13, 1, 1, "K not a multiple of 8 (scalar loads), partial feature tile"},
    {5, 130, 33, 1, 0, "partial K chunk and partial tiles"},
    {8, 64, 1, 0, 1, "one output feature"},
    {17, 200, 100, 1, 1, "partial token tile (stream tile of 32 tokens)"},
    {70, 96, 4100, 1, 0, "N >= 4096 tile, three 32-token stream tiles"},
    {3, 256, 16400, 0, 1, "N >= 16384 tile, partial feature block"},
    {300, 128, 48, 1, 1, "prefill: 64 x 128 tiles, three token blocks"},
    {4, 64, 192, 1, 0, "tiny gpt-oss qkv (hidden 64)"},
    {4, 2880, 5120, 1, 0, "gpt-oss qkv projection"},
    {4, 4096, 2880, 1, 1, "gpt-oss o_proj with fused residual"},
    {2, 2880, 201088, 0, 0, "gpt-oss lm_head"},
    {4, 8640, 2880, 0, 0, "EAGLE-3 fc (3 x hidden)"},
    {3, 2880, 17280, 0, 0, "EAGLE-3 MLP gate/up"},
    {3, 17280, 2880, 0, 1, "EAGLE-3 MLP down"},
    {2, 2880, 32000, 0, 0, "EAGLE-3 draft lm_head"},
    {9, 4096, 2880, 1, 1, "9 rows: 32 x 64 tiles, o_proj with fused residual"},
    {96, 2880, 5120, 1, 0, "96 rows: three 32-token stream tiles, gpt-oss qkv"},
    {128, 4096, 2880, 1, 1, "128 rows (a 32-sequence verify): four stream tiles, o_proj"},
    {200, 2880, 5120, 1, 0, "200 rows: 64 x 128 tiles, two token blocks, gpt-oss qkv"},
    {40, 256, 70000, 1, 0, "40 rows, N > 65536: 32 x 64 tiles"},
    {260, 2880, 5120, 1, 0, "260 rows: 64 x 128 tiles, three token blocks, gpt-oss qkv"},
    {129, 200, 70, 0, 1, "129 rows: two 128-token tiles, partial features, K % 16 = 8"},
    {40, 37, 50, 1, 1, "K not a multiple of 8 in the 32 x 64 tiles"},
    {5, 8, 19, 1, 1, "stream tile: K = 8, one chunk, the step's upper half zero-filled"},
    {3, 200, 37, 1, 1, "stream tile: K % 16 = 8, partial feature block"},
    {1, 4096, 4096, 1, 0, "stream tile: gpt-oss q projection at T = 1"},
    {1, 2880, 201088, 0, 0, "stream tile: gpt-oss lm_head at T = 1"},
    {12, 2880, 5120, 1, 0, "12 rows: stream tile of 16 tokens, gpt-oss qkv"},
    {16, 4096, 2880, 1, 1, "16 rows: stream tile of 16 tokens, o_proj with fused residual"},
    {11, 520, 33, 0, 1, "11 rows: stream tile of 16 tokens, partial K tile and features"},
    {32, 4096, 2880, 1, 1, "32 rows: stream tile of 32 tokens, o_proj with fused residual"},
    {25, 520, 33, 0, 1, "25 rows: stream tile of 32 tokens, partial K tile and features"},
};

static void run_matmul_case(const struct mm_case *c) {
    const int T = c->T, K = c->K, N = c->N;
    float *x = t_alloc((size_t)T * K * 4), *w = t_alloc((size_t)N * K * 4);
    float *b = t_alloc((size_t)N * 4), *res = t_alloc((size_t)T * N * 4);
    float *want = t_alloc((size_t)T * N * 4);
    t_fill(x, (size_t)T * K, 1000 + T, 1.0f);
    t_fill(w, (size_t)N * K, 2000 + N, 1.0f);
    t_fill(b, N, 3000 + N, 1.0f);
    t_fill(res, (size_t)T * N, 4000 + T, 4.0f);
    struct ds_matmul_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .out_dim = N,
                               .x = x, .w = w, .bias = c->bias ? b : NULL,
                               .residual = c->residual ? res : NULL, .out = want};
    EXPECT_OK(ds_matmul_ref(&r));

    // act × weight dtype pairs; the bias in the other dtype to cover both loads.
    const enum ds_elem pairs[4][2] = {{DS_ELEM_F32, DS_ELEM_BF16}, {DS_ELEM_BF16, DS_ELEM_BF16},
                                      {DS_ELEM_F32, DS_ELEM_F32}, {DS_ELEM_BF16, DS_ELEM_F32}};
    for (int p = 0; p < 4; p++) {
        const enum ds_elem act = pairs[p][0], wt = pairs[p][1];
        if (N * (size_t)K > 100000000 && p >= 2) continue; // f32 weights of lm_head: skip (size)
        void *d_x = g_upload_as(x, (size_t)T * K, act), *d_w = g_upload_as(w, (size_t)N * K, wt);
        const enum ds_elem bt = wt == DS_ELEM_BF16 ? DS_ELEM_F32 : DS_ELEM_BF16;
        void *d_b = g_upload_as(b, N, bt);
        // The residual buffer doubles as the output when present (the fused in-place form).
        void *d_res = c->residual ? g_upload_as(res, (size_t)T * N, act) : NULL;
        void *d_out = c->residual ? d_res : g_alloc((size_t)T * N * 4);
        struct ds_matmul_args a = {.act = act, .w_dtype = wt, .bias_dtype = bt, .n_rows = T,
                                   .in_dim = K, .out_dim = N, .x = d_x, .w = d_w,
                                   .bias = c->bias ? d_b : NULL, .residual = d_res, .out = d_out};
        EXPECT_OK(ds_matmul_cuda(&a, NULL));
        float *got = g_download_f(d_out, (size_t)T * N, act);
        char what[160];
        snprintf(what, sizeof what, "matmul T=%d K=%d N=%d (%s) act %s w %s", T, K, N, c->why,
                 dt_name(act), dt_name(wt));
        // Exact inputs: f32 accumulation is exact (see the file comment), so the f32 output must
        // equal the reference; a bf16 output is the reference rounded once (1 bf16 ulp allowed).
        if (act == DS_ELEM_F32) g_compare(what, got, want, (size_t)T * N, N, 0.0, 0.0);
        else g_compare_bf16(what, got, want, (size_t)T * N, N, 1.0);
        free(got);
        if (!c->residual) g_free(d_out);
        g_free(d_res), g_free(d_b), g_free(d_w), g_free(d_x);
    }
    free(x), free(w), free(b), free(res), free(want);
}

// A weight of real-model size: K·N >= 2880² (the largest synthetic case, 256 · 16400, is half).
static int mm_is_real(int K, int N) {
    return (size_t)K * N >= (size_t)2880 * 2880;
}

static void matmul_shape_matrix_matches_reference(void) {
    for (size_t i = 0; i < sizeof mm_cases / sizeof mm_cases[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "matmul case %zu (%s)", i, mm_cases[i].why);
        if (mm_is_real(mm_cases[i].K, mm_cases[i].N) && g_small_skip(name)) continue;
        run_matmul_case(&mm_cases[i]);
        printf("  matmul case %zu (%s) done\n", i, mm_cases[i].why);
        fflush(stdout);
    }
}

// Continuous values rounded to bf16 (inputs identical on both sides), real qkv and lm_head-like
// shapes. The reference is exact to ~1e-16; the GPU sums in fp32 (error <= ~K·2^-24·Σ|x·w|, and
// Σ|x·w| <= K·0.25 here) and rounds to bf16 (2^-9 relative): tolerance 2^-8·|ref| + 2^-20·K.
static void matmul_bf16_continuous_values_loose(void) {
    const int shapes[][3] = {{7, 2880, 5120}, {64, 2880, 20000}, {1, 4096, 2880}};
    for (int s = 0; s < 3; s++) {
        const int T = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        float *x = t_alloc((size_t)T * K * 4), *w = t_alloc((size_t)N * K * 4);
        float *want = t_alloc((size_t)T * N * 4);
        g_fill_cont(x, (size_t)T * K, 77 + s, -1.0f, 1.0f);
        g_fill_cont(w, (size_t)N * K, 88 + s, -0.5f, 0.5f);
        g_round_bf16(x, (size_t)T * K);
        g_round_bf16(w, (size_t)N * K);
        struct ds_matmul_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = T,
                                   .in_dim = K, .out_dim = N, .x = x, .w = w, .out = want};
        EXPECT_OK(ds_matmul_ref(&r));
        void *d_x = g_upload_as(x, (size_t)T * K, DS_ELEM_BF16);
        void *d_w = g_upload_as(w, (size_t)N * K, DS_ELEM_BF16);
        void *d_out = g_alloc((size_t)T * N * 2);
        struct ds_matmul_args a = r;
        a.act = DS_ELEM_BF16, a.w_dtype = DS_ELEM_BF16, a.x = d_x, a.w = d_w, a.out = d_out;
        EXPECT_OK(ds_matmul_cuda(&a, NULL));
        float *got = g_download_f(d_out, (size_t)T * N, DS_ELEM_BF16);
        char what[96];
        snprintf(what, sizeof what, "matmul continuous bf16 T=%d K=%d N=%d", T, K, N);
        g_compare(what, got, want, (size_t)T * N, N, ldexp(1.0, -20) * K, ldexp(1.0, -8));
        free(got);
        g_free(d_x), g_free(d_w), g_free(d_out);
        free(x), free(w), free(want);
    }
}

// A row's output bits must not depend on the batch: row r computed alone, then inside batches of
// B rows at different positions with different neighbours. Covers every tensor-core tile shape
// (a row alone and B = 8: the 16 × 8 stream tile; B = 12, 16: the 16 × 16 stream tile; B = 32, 64:
// the 16 × 32 stream tile, one and two token tiles, or 32 × 64 at B = 64 for N > 65536; B = 256,
// 300: 64 × 128; K = 130 (K % 8 != 0): the 16 × 8 tile with element loads), which must all follow
// the same reduction order, and the CUDA-core f32 kernel.
static void matmul_is_batch_invariant(void) {
    const int shapes[][2] = {{2880, 2880}, {2880, 5120}, {2880, 32000}, {256, 66000}, {130, 40}};
    const int batches[] = {8, 12, 16, 32, 64, 256, 300};
    enum { NB = sizeof batches / sizeof batches[0] };
    enum { POOL = 300 };
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        const int K = shapes[s][0], N = shapes[s][1];
        char name[96];
        snprintf(name, sizeof name, "matmul batch invariance K=%d N=%d", K, N);
        if (mm_is_real(K, N) && g_small_skip(name)) continue;
        for (int ai = 0; ai < 2; ai++) {
            const enum ds_elem act = dt[ai];
            const size_t es = act == DS_ELEM_BF16 ? 2 : 4;
            float *pool = t_alloc((size_t)POOL * K * 4), *w = t_alloc((size_t)N * K * 4);
            g_fill_cont(pool, (size_t)POOL * K, 5 + s, -2.0f, 2.0f);
            g_fill_cont(w, (size_t)N * K, 6 + s, -0.1f, 0.1f);
            void *d_pool = g_upload_as(pool, (size_t)POOL * K, act);
            void *d_w = g_upload_as(w, (size_t)N * K, DS_ELEM_BF16);
            void *d_x = g_alloc((size_t)POOL * K * es), *d_out = g_alloc((size_t)POOL * N * es);
            unsigned char *alone = t_alloc((size_t)N * es), *in = t_alloc((size_t)N * es);
            const int probe[] = {0, 7, 63, 64, 299};
            for (int pi = 0; pi < 5; pi++) {
                const int r = probe[pi];
                struct ds_matmul_args a = {.act = act, .w_dtype = DS_ELEM_BF16, .n_rows = 1,
                                           .in_dim = K, .out_dim = N,
                                           .x = (char *)d_pool + (size_t)r * K * es, .w = d_w,
                                           .out = d_out};
                EXPECT_OK(ds_matmul_cuda(&a, NULL));
                g_download(alone, d_out, (size_t)N * es);
                for (int bi = 0; bi < NB; bi++) {
                    const int B = batches[bi];
                    // Batch rows: pool rows in a rotated order; row r lands at position (r·7) % B.
                    const int at = (r * 7) % B;
                    for (int j = 0; j < B; j++) {
                        const int src = j == at ? r : (r + 1 + j * 13) % POOL;
                        G_CHECK(cudaMemcpy((char *)d_x + (size_t)j * K * es,
                                           (char *)d_pool + (size_t)src * K * es, (size_t)K * es,
                                           cudaMemcpyDeviceToDevice));
                    }
                    a.n_rows = B, a.x = d_x;
                    EXPECT_OK(ds_matmul_cuda(&a, NULL));
                    g_download(in, (char *)d_out + (size_t)at * N * es, (size_t)N * es);
                    char what[128];
                    snprintf(what, sizeof what, "matmul K=%d N=%d act %s: row %d alone vs at %d "
                             "of %d", K, N, dt_name(act), r, at, B);
                    g_same_bytes(what, alone, in, (size_t)N * es, es);
                }
            }
            free(alone), free(in), free(pool), free(w);
            g_free(d_pool), g_free(d_w), g_free(d_x), g_free(d_out);
        }
    }
}

// Fused q/k/v: one call over [W0; W1; W2] (back to back) with split outputs and a bias per part
// must write exactly the bits of separate calls over W0, W1, W2 (each element's reduction depends
// on K only, whatever tile its call picks), and match the CPU reference's split call (exact
// inputs: f32 bit for bit, bf16 the reference rounded once, 1 ulp allowed as in the matrix).
// Shapes: gpt-oss qkv (2880 -> 4096 + 512 + 512) at T = 1, 4 (stream 16 × 8), 13 (stream 16 × 16),
// 40 (32 × 64), 100 (64 × 128); the tiny config (256 -> 256 + 64 + 64); odd widths with an
// absent middle part and K % 8 != 0 (element loads in the fused call, and separate calls whose
// weight offsets are not 16-byte aligned).
struct split_case {
    int T, K, d[3], bias;
};

static void run_split_case(const struct split_case *c, enum ds_elem act) {
    const int T = c->T, K = c->K, N = c->d[0] + c->d[1] + c->d[2];
    const size_t es = act == DS_ELEM_BF16 ? 2 : 4;
    float *x = t_alloc((size_t)T * K * 4), *w = t_alloc((size_t)N * K * 4);
    float *b = t_alloc((size_t)N * 4);
    t_fill(x, (size_t)T * K, 700 + T, 1.0f);
    t_fill(w, (size_t)N * K, 800 + N, 1.0f);
    t_fill(b, N, 900 + N, 1.0f);
    void *d_x = g_upload_as(x, (size_t)T * K, act), *d_w = g_upload_as(w, (size_t)N * K,
                                                                        DS_ELEM_BF16);
    void *d_b = g_upload_as(b, N, DS_ELEM_F32);
    void *fused[3], *sep[3];
    float *want[3];
    int first[3];
    for (int j = 0, f = 0; j < 3; f += c->d[j], j++) {
        first[j] = f;
        fused[j] = c->d[j] ? g_alloc((size_t)T * c->d[j] * es) : NULL;
        sep[j] = c->d[j] ? g_alloc((size_t)T * c->d[j] * es) : NULL;
        want[j] = c->d[j] ? t_alloc((size_t)T * c->d[j] * 4) : NULL;
    }
    // The CPU reference's split call on the same values.
    struct ds_matmul_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .out_dim = N,
                               .x = x, .w = w, .bias = c->bias ? b : NULL, .out = want[0],
                               .part_dim = {c->d[0], c->d[1], c->d[2]}, .out1 = want[1],
                               .out2 = want[2], .bias1 = c->bias ? b + first[1] : NULL,
                               .bias2 = c->bias ? b + first[2] : NULL};
    EXPECT_OK(ds_matmul_ref(&r));
    struct ds_matmul_args a = {.act = act, .w_dtype = DS_ELEM_BF16, .bias_dtype = DS_ELEM_F32,
                               .n_rows = T, .in_dim = K, .out_dim = N, .x = d_x, .w = d_w,
                               .bias = c->bias ? d_b : NULL, .out = fused[0],
                               .part_dim = {c->d[0], c->d[1], c->d[2]}, .out1 = fused[1],
                               .out2 = fused[2]};
    if (c->bias) a.bias1 = (float *)d_b + first[1], a.bias2 = (float *)d_b + first[2];
    EXPECT_OK(ds_matmul_cuda(&a, NULL));
    for (int j = 0; j < 3; j++) {
        if (!c->d[j]) continue;
        const int D = c->d[j];
        struct ds_matmul_args p = {.act = act, .w_dtype = DS_ELEM_BF16, .bias_dtype = DS_ELEM_F32,
                                   .n_rows = T, .in_dim = K, .out_dim = D, .x = d_x,
                                   .w = (uint16_t *)d_w + (size_t)first[j] * K,
                                   .bias = c->bias ? (float *)d_b + first[j] : NULL,
                                   .out = sep[j]};
        EXPECT_OK(ds_matmul_cuda(&p, NULL));
        const size_t bytes = (size_t)T * D * es;
        unsigned char *hf = t_alloc(bytes), *hs = t_alloc(bytes);
        g_download(hf, fused[j], bytes);
        g_download(hs, sep[j], bytes);
        char what[160];
        snprintf(what, sizeof what, "split matmul T=%d K=%d parts %d/%d/%d act %s: part %d fused "
                 "vs its own call", T, K, c->d[0], c->d[1], c->d[2], dt_name(act), j);
        g_same_bytes(what, hf, hs, bytes, es);
        float *got = g_download_f(fused[j], (size_t)T * D, act);
        snprintf(what, sizeof what, "split matmul T=%d K=%d parts %d/%d/%d act %s: part %d vs "
                 "reference", T, K, c->d[0], c->d[1], c->d[2], dt_name(act), j);
        if (act == DS_ELEM_F32) g_compare(what, got, want[j], (size_t)T * D, D, 0.0, 0.0);
        else g_compare_bf16(what, got, want[j], (size_t)T * D, D, 1.0);
        free(got), free(hf), free(hs);
    }
    for (int j = 0; j < 3; j++) g_free(fused[j]), g_free(sep[j]), free(want[j]);
    g_free(d_x), g_free(d_w), g_free(d_b);
    free(x), free(w), free(b);
}

static void matmul_split_outputs_equal_separate_calls(void) {
    static const struct split_case cases[] = {
        {1, 2880, {4096, 512, 512}, 1},  {4, 2880, {4096, 512, 512}, 1},
        {13, 2880, {4096, 512, 512}, 1}, {24, 2880, {4096, 512, 512}, 1},
        {40, 2880, {4096, 512, 512}, 1},
        {100, 2880, {4096, 512, 512}, 1}, {1, 256, {256, 64, 64}, 1},
        {7, 256, {256, 64, 64}, 0},       {300, 256, {256, 64, 64}, 1},
        {3, 72, {20, 0, 13}, 1},          {5, 37, {9, 7, 3}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct split_case *c = &cases[i];
        char name[96];
        snprintf(name, sizeof name, "split matmul T=%d K=%d parts %d/%d/%d", c->T, c->K, c->d[0],
                 c->d[1], c->d[2]);
        if (mm_is_real(c->K, c->d[0] + c->d[1] + c->d[2]) && g_small_skip(name)) continue;
        for (int ai = 0; ai < 2; ai++)
            run_split_case(c, dt[ai]);
    }
    // Host checks of the split fields name the problem.
    struct ds_matmul_args a = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16, .n_rows = 1,
                               .in_dim = 8, .out_dim = 8, .x = (void *)16, .w = (void *)32,
                               .out = (void *)64, .part_dim = {4, 2, 1}, .out1 = (void *)128,
                               .out2 = (void *)256};
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: split widths 4 + 2 + 1 do not sum to out_dim 8");
    a.part_dim[2] = 2, a.out1 = (void *)16;
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: out1 must not alias x");
}

// Fused RoPE (ds_matmul_args rope fields): one split call must write exactly the bits of the same
// call without them followed by ds_rope_cuda on its q and k parts. bf16 calls of up to 8 rows with
// D % 16 == 0 rotate inside the stream tile (tiles of 8 pairs, ds_rope_pair in registers); the
// others run the two ops. Cases: gpt-oss qkv (2880 -> 4096 + 512 + 512, D = 64, YaRN table) at T =
// 1, 3, 8 (fused) and 9 (two ops), the tiny config (256 -> 256 + 64 + 64, D = 32, plain) at T = 1,
// 5, D = 8 at T = 2 (two ops), f32 activations at T = 2 (two ops). Row 1 of every call with T > 2
// sits past the table: NaN in both. Each case also checks that the rotation changed q.
struct rope_case {
    int T, K, d[3], D, yarn;
    enum ds_elem act;
};

static void run_rope_case(const struct rope_case *c) {
    enum { P = 4096 };
    const int T = c->T, K = c->K, N = c->d[0] + c->d[1] + c->d[2], D = c->D, H = D / 2;
    const size_t es = c->act == DS_ELEM_BF16 ? 2 : 4;
    const struct ds_rope_table_config yarn = {.kind = DS_ROPE_TABLE_YARN, .head_dim = D,
                                              .theta = 150000.0, .factor = 32.0,
                                              .beta_fast = 32.0, .beta_slow = 1.0,
                                              .original_max_pos = 4096};
    const struct ds_rope_table_config plain = {.kind = DS_ROPE_TABLE_PLAIN, .head_dim = D,
                                               .theta = 10000.0};
    float *cs = t_alloc((size_t)P * H * 4), *sn = t_alloc((size_t)P * H * 4);
    EXPECT_OK(ds_rope_table_fill(c->yarn ? &yarn : &plain, P, cs, sn));
    float *x = t_alloc((size_t)T * K * 4), *w = t_alloc((size_t)N * K * 4);
    float *b = t_alloc((size_t)N * 4);
    t_fill(x, (size_t)T * K, 710 + T, 1.0f);
    t_fill(w, (size_t)N * K, 810 + N, 1.0f);
    t_fill(b, N, 910 + N, 1.0f);
    int32_t *pos = t_alloc((size_t)T * 4);
    uint64_t seed = 31 + T;
    for (int t = 0; t < T; t++) pos[t] = t_int(&seed, 1, P - 1);
    if (T > 2) pos[1] = P; // past the table
    void *d_x = g_upload_as(x, (size_t)T * K, c->act);
    void *d_w = g_upload_as(w, (size_t)N * K, DS_ELEM_BF16), *d_b = g_upload_as(b, N, DS_ELEM_F32);
    void *d_cs = g_upload(cs, (size_t)P * H * 4), *d_sn = g_upload(sn, (size_t)P * H * 4);
    int32_t *d_pos = g_upload(pos, (size_t)T * 4);
    void *fused[3], *two[3];
    for (int j = 0; j < 3; j++) {
        fused[j] = g_alloc((size_t)T * c->d[j] * es);
        two[j] = g_alloc((size_t)T * c->d[j] * es);
    }
    struct ds_matmul_args a = {.act = c->act, .w_dtype = DS_ELEM_BF16, .bias_dtype = DS_ELEM_F32,
                               .n_rows = T, .in_dim = K, .out_dim = N, .x = d_x, .w = d_w,
                               .bias = d_b, .out = two[0],
                               .part_dim = {c->d[0], c->d[1], c->d[2]}, .out1 = two[1],
                               .out2 = two[2], .bias1 = (float *)d_b + c->d[0],
                               .bias2 = (float *)d_b + c->d[0] + c->d[1]};
    EXPECT_OK(ds_matmul_cuda(&a, NULL)); // the product alone
    const size_t qb = (size_t)T * c->d[0] * es;
    unsigned char *plain_q = t_alloc(qb);
    g_download(plain_q, two[0], qb);
    struct ds_rope_args r = {.act = c->act, .n_rows = T, .head_dim = D,
                             .n_q_heads = c->d[0] / D, .n_k_heads = c->d[1] / D, .q = two[0],
                             .k = two[1], .positions = d_pos, .cos = (const float *)d_cs,
                             .sin = (const float *)d_sn, .table_len = P};
    EXPECT_OK(ds_rope_cuda(&r, NULL)); // then the rope op
    a.out = fused[0], a.out1 = fused[1], a.out2 = fused[2];
    a.rope_head_dim = D, a.rope_positions = d_pos, a.rope_cos = (const float *)d_cs;
    a.rope_sin = (const float *)d_sn, a.rope_table_len = P;
    EXPECT_OK(ds_matmul_cuda(&a, NULL)); // one call
    for (int j = 0; j < 3; j++) {
        const size_t bytes = (size_t)T * c->d[j] * es;
        unsigned char *hf = t_alloc(bytes), *ht = t_alloc(bytes);
        g_download(hf, fused[j], bytes);
        g_download(ht, two[j], bytes);
        char what[160];
        snprintf(what, sizeof what, "fused rope T=%d K=%d parts %d/%d/%d D=%d act %s: part %d "
                 "vs matmul then rope", T, K, c->d[0], c->d[1], c->d[2], D, dt_name(c->act), j);
        g_same_bytes(what, hf, ht, bytes, es);
        if (j == 0) EXPECT(memcmp(ht, plain_q, bytes) != 0); // the rotation changed q
        free(hf), free(ht);
    }
    for (int j = 0; j < 3; j++) g_free(fused[j]), g_free(two[j]);
    g_free(d_x), g_free(d_w), g_free(d_b), g_free(d_cs), g_free(d_sn), g_free(d_pos);
    free(cs), free(sn), free(x), free(w), free(b), free(pos), free(plain_q);
}

static void matmul_fused_rope_equals_two_ops(void) {
    static const struct rope_case cases[] = {
        {1, 2880, {4096, 512, 512}, 64, 1, DS_ELEM_BF16}, {3, 2880, {4096, 512, 512}, 64, 1, DS_ELEM_BF16},
        {8, 2880, {4096, 512, 512}, 64, 1, DS_ELEM_BF16}, {9, 2880, {4096, 512, 512}, 64, 1, DS_ELEM_BF16},
        {1, 256, {256, 64, 64}, 32, 0, DS_ELEM_BF16},     {5, 256, {256, 64, 64}, 32, 0, DS_ELEM_BF16},
        {2, 72, {16, 8, 8}, 8, 0, DS_ELEM_BF16},          {2, 256, {256, 64, 64}, 32, 0, DS_ELEM_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct rope_case *c = &cases[i];
        char name[96];
        snprintf(name, sizeof name, "fused rope T=%d K=%d parts %d/%d/%d", c->T, c->K, c->d[0],
                 c->d[1], c->d[2]);
        if (mm_is_real(c->K, c->d[0] + c->d[1] + c->d[2]) && g_small_skip(name)) continue;
        run_rope_case(c);
    }
    // Host checks of the RoPE fields name the problem (the reference's check).
    struct ds_matmul_args a = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16, .n_rows = 1,
                               .in_dim = 8, .out_dim = 8, .x = (void *)16, .w = (void *)32,
                               .out = (void *)64, .part_dim = {4, 2, 2}, .out1 = (void *)128,
                               .out2 = (void *)256, .rope_head_dim = 4,
                               .rope_positions = (const int32_t *)512,
                               .rope_cos = (const float *)1024, .rope_sin = (const float *)2048,
                               .rope_table_len = 8};
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: RoPE head_dim 4 must be even and divide the q and k widths 4 and 2");
}

static void matmul_rejects_bad_arguments(void) {
    struct ds_matmul_args a = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16, .n_rows = 2,
                               .in_dim = 8, .out_dim = 8, .x = (void *)16, .w = (void *)32,
                               .out = (void *)16};
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: out must not alias x");
    a.out = (void *)64, a.in_dim = 0;
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: in_dim is 0");
    a.in_dim = 8, a.n_rows = 0; // nothing to do, nothing launched
    EXPECT_OK(ds_matmul_cuda(&a, NULL));
}

// ---------------------------------------------------------------------------------------------
// Deferred RMSNorm (ds/kernel_args.h): the matmul's rms_of (THE ROW SCALE s times the product)
// and norm_gain / norm_out (g ⊙ the stored out), embed's norm_out.

// rms_of rows. exact_s = 1: entries ±2 (random signs), used with eps 0: Σx² = 4K, and ss / K = 4,
// sqrt, reciprocal are exact, so s = 0.5 on both sides and s·acc stays exact: the file's exact
// tolerances apply unchanged. exact_s = 0: multiples of 1/64 in [-1, 1] (t_fill) with eps 1e-5:
// the fp32 s of the GPU and the double s of the reference differ by rounding (rms_compare).
static void rms_rows(float *x0, size_t n, uint64_t seed, int exact_s) {
    if (!exact_s) {
        t_fill(x0, n, seed, 1.0f);
        return;
    }
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) x0[i] = (t_next(&s) & 1) ? 2.0f : -2.0f;
}

// The allowed error of a GPU output against the reference when s is not exact. The sum of squares
// is exact for these inputs (multiples of 2^-12 below 2^12), so the GPU's s (four correctly
// rounded fp32 operations) is within 3·2^-24 of the reference's double s; s·acc, + bias and
// + residual round once each: before its final rounding the GPU's value lies within 6·2^-24·mag
// of the reference's, mag = |s·acc| + |bias| + |residual|. Rounding is monotone, so a bf16 output
// is within 1 bf16 ulp of the reference rounded to bf16 plus that distance, an f32 output within
// one f32 rounding (2^-23·|want|) plus it; both checked with the distance doubled: 2^-20·mag.
static double rms_allowed(float want, double mag, enum ds_elem act) {
    if (act == DS_ELEM_BF16)
        return g_bf16_ulp(ds_bf16_to_f32(ds_f32_to_bf16(want))) + 0x1p-20 * mag;
    return 0x1p-23 * fabs((double)want) + 0x1p-20 * mag;
}

// got against want within rms_allowed (bf16: against want rounded to bf16); one line on failure.
static size_t rms_compare(const char *what, const float *got, const float *want, const double *mag,
                          size_t n, size_t row_len, enum ds_elem act) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const double w = act == DS_ELEM_BF16 ? ds_bf16_to_f32(ds_f32_to_bf16(want[i])) : want[i];
        if (!(fabs((double)got[i] - w) <= rms_allowed(want[i], mag[i], act)) && bad++ == 0)
            first = i;
    }
    if (bad)
        DS_FAILF("%s: %zu of %zu beyond the row-scale bound; first at row %zu col %zu: got %.9g "
                 "want %.9g (allowed %.3g)", what, bad, n, first / row_len, first % row_len,
                 (double)got[first], (double)want[first],
                 rms_allowed(want[first], mag[first], act));
    return bad;
}

// norm_out must be act(g ⊙ out) of the GPU's own stored out: one fp32 multiply (exact for a bf16
// gain and bf16 out, one rounding for f32 out), then the rounding to act. Recomputed here, bitwise.
static void expect_norm_out(const char *what, const float *nout, const float *out, const float *g,
                            size_t n, size_t C, enum ds_elem act) {
    for (size_t i = 0; i < n; i++) {
        float w = g[i % C] * out[i];
        if (act == DS_ELEM_BF16) w = ds_bf16_to_f32(ds_f32_to_bf16(w));
        if (!t_same_bits(&nout[i], &w, 1)) {
            DS_FAILF("%s: norm_out at row %zu col %zu = %.9g, g·out = %.9g (out %.9g)", what,
                     i / C, i % C, (double)nout[i], (double)w, (double)out[i]);
            return;
        }
    }
}

struct rms_case {
    int K, N;
    int bias, residual, rms, norm; // 0/1: which fields the call sets
    const char *why;
};

// K % 8 == 0 everywhere (THE ROW SCALE reads 16-byte groups of each row of rms_of).
static const struct rms_case rms_cases[] = {
    {64, 64, 1, 1, 1, 1, "tiny config, every field"},
    {200, 100, 1, 1, 1, 1, "partial K chunk (K % 16 = 8), partial feature tiles"},
    {8, 19, 1, 1, 1, 1, "K = 8: one group per row of rms_of"},
    {520, 33, 0, 1, 1, 1, "partial K tile and features, no bias"},
    {2880, 5120, 1, 0, 1, 0, "gpt-oss q/k/v as one output on a deferred norm"},
    {4096, 2880, 1, 1, 0, 1, "gpt-oss o_proj: residual in place, the next norm's g ⊙ x"},
    {2880, 2880, 1, 1, 1, 1, "C x C: rms_of, residual and norm_out together"},
};

static const int rms_Ts[] = {1, 3, 8, 16, 24, 33, 64, 100, 256, 300};

// One case at T rows: the reference (f32, double inside) once, then the GPU in bf16 and f32
// activations (bf16 weights, f32 bias, bf16 gain; the residual, when present, is also the output).
static void run_rms_case(const struct rms_case *c, int T, int exact_s) {
    const int K = c->K, N = c->N;
    const double eps = exact_s ? 0.0 : 1e-5f;
    float *x = t_alloc((size_t)T * K * 4), *x0 = t_alloc((size_t)T * K * 4);
    float *w = t_alloc((size_t)N * K * 4), *b = t_alloc((size_t)N * 4), *g = t_alloc((size_t)N * 4);
    float *res = t_alloc((size_t)T * N * 4), *want = t_alloc((size_t)T * N * 4);
    float *want_n = t_alloc((size_t)T * N * 4), *sacc = t_alloc((size_t)T * N * 4);
    double *mag = t_alloc((size_t)T * N * sizeof(double));
    t_fill(x, (size_t)T * K, 5000 + T, 1.0f);
    rms_rows(x0, (size_t)T * K, 5100 + T, exact_s);
    t_fill(w, (size_t)N * K, 5200 + N, 1.0f);
    t_fill(b, N, 5300 + N, 1.0f);
    t_fill(g, N, 5400 + N, 2.0f);
    t_fill(res, (size_t)T * N, 5500 + T, 4.0f);
    struct ds_matmul_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .out_dim = N,
                               .x = x, .w = w, .bias = c->bias ? b : NULL,
                               .residual = c->residual ? res : NULL, .out = want,
                               .rms_of = c->rms ? x0 : NULL, .rms_eps = (float)eps,
                               .norm_gain = c->norm ? g : NULL, .norm_gain_dtype = DS_ELEM_F32,
                               .norm_out = want_n};
    EXPECT_OK(ds_matmul_ref(&r));
    struct ds_matmul_args rs = r; // s·acc alone, for mag
    rs.bias = NULL, rs.residual = NULL, rs.norm_gain = NULL, rs.out = sacc;
    EXPECT_OK(ds_matmul_ref(&rs));
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++)
            mag[(size_t)t * N + n] = fabs(sacc[(size_t)t * N + n]) + (c->bias ? fabs(b[n]) : 0) +
                                     (c->residual ? fabs(res[(size_t)t * N + n]) : 0);
    void *d_w = g_upload_as(w, (size_t)N * K, DS_ELEM_BF16), *d_b = g_upload_as(b, N, DS_ELEM_F32);
    void *d_g = g_upload_as(g, N, DS_ELEM_BF16);
    for (int ai = 0; ai < 2; ai++) {
        const enum ds_elem act = dt[ai];
        void *d_x = g_upload_as(x, (size_t)T * K, act), *d_x0 = g_upload_as(x0, (size_t)T * K, act);
        void *d_res = g_upload_as(res, (size_t)T * N, act), *d_n = g_alloc((size_t)T * N * 4);
        void *d_out = c->residual ? d_res : g_alloc((size_t)T * N * 4);
        struct ds_matmul_args a = {.act = act, .w_dtype = DS_ELEM_BF16, .bias_dtype = DS_ELEM_F32,
                                   .n_rows = T, .in_dim = K, .out_dim = N, .x = d_x, .w = d_w,
                                   .bias = c->bias ? d_b : NULL,
                                   .residual = c->residual ? d_res : NULL, .out = d_out,
                                   .rms_of = c->rms ? d_x0 : NULL, .rms_eps = (float)eps,
                                   .norm_gain = c->norm ? d_g : NULL,
                                   .norm_gain_dtype = DS_ELEM_BF16, .norm_out = d_n};
        EXPECT_OK(ds_matmul_cuda(&a, NULL));
        float *got = g_download_f(d_out, (size_t)T * N, act);
        char what[192];
        snprintf(what, sizeof what, "deferred-norm matmul T=%d K=%d N=%d (%s) act %s, %s s", T, K,
                 N, c->why, dt_name(act), exact_s ? "exact" : "rounded");
        if (exact_s || !c->rms) { // exact inputs, exact s: the plain matrix's tolerances
            if (act == DS_ELEM_F32) g_compare(what, got, want, (size_t)T * N, N, 0.0, 0.0);
            else g_compare_bf16(what, got, want, (size_t)T * N, N, 1.0);
        } else {
            rms_compare(what, got, want, mag, (size_t)T * N, N, act);
        }
        if (c->norm) {
            float *gn = g_download_f(d_n, (size_t)T * N, act);
            expect_norm_out(what, gn, got, g, (size_t)T * N, N, act);
            free(gn);
        }
        free(got);
        if (!c->residual) g_free(d_out);
        g_free(d_x), g_free(d_x0), g_free(d_res), g_free(d_n);
    }
    g_free(d_w), g_free(d_b), g_free(d_g);
    free(x), free(x0), free(w), free(b), free(g), free(res), free(want), free(want_n), free(sacc);
    free(mag);
}

static void matmul_deferred_norm_matches_reference(void) {
    for (size_t i = 0; i < sizeof rms_cases / sizeof rms_cases[0]; i++) {
        const struct rms_case *c = &rms_cases[i];
        char name[160];
        snprintf(name, sizeof name, "deferred-norm matmul K=%d N=%d (%s)", c->K, c->N, c->why);
        if (mm_is_real(c->K, c->N) && g_small_skip(name)) continue;
        for (size_t ti = 0; ti < sizeof rms_Ts / sizeof rms_Ts[0]; ti++)
            for (int exact_s = 1; exact_s >= (c->rms ? 0 : 1); exact_s--)
                run_rms_case(c, rms_Ts[ti], exact_s);
        printf("  %s done\n", name);
        fflush(stdout);
    }
}

// A row's out and norm_out bits alone and inside batches of 8, 12, 16, 32, 64, 256 and 300 rows
// (the 16 × 8, 16 × 16 and 16 × 32 stream tiles, 64 × 128; the CUDA-core kernel for f32), at other
// positions with other neighbours: THE ROW SCALE must have the same bits in every kernel and tile.
// Continuous values (the sums and s do round); the residual is the output.
static void matmul_deferred_norm_is_batch_invariant(void) {
    static const struct rms_case shapes[] = {
        {2880, 2880, 1, 1, 1, 1, "C x C, every field"},
        {4096, 2880, 1, 1, 0, 1, "o_proj: residual and norm_out"},
        {2880, 5120, 1, 0, 1, 0, "q/k/v: rms_of"},
        {128, 40, 1, 1, 1, 1, "small, every field"},
    };
    const int batches[] = {8, 12, 16, 32, 64, 256, 300};
    enum { NB = sizeof batches / sizeof batches[0], POOL = 300 };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct rms_case *c = &shapes[si];
        const int K = c->K, N = c->N;
        char name[128];
        snprintf(name, sizeof name, "deferred-norm batch invariance K=%d N=%d (%s)", K, N, c->why);
        if (mm_is_real(K, N) && g_small_skip(name)) continue;
        float *px = t_alloc((size_t)POOL * K * 4), *px0 = t_alloc((size_t)POOL * K * 4);
        float *pr = t_alloc((size_t)POOL * N * 4), *w = t_alloc((size_t)N * K * 4);
        float *b = t_alloc((size_t)N * 4), *g = t_alloc((size_t)N * 4);
        g_fill_cont(px, (size_t)POOL * K, 60 + si, -2.0f, 2.0f);
        g_fill_cont(px0, (size_t)POOL * K, 61 + si, -3.0f, 3.0f);
        g_fill_cont(pr, (size_t)POOL * N, 62 + si, -4.0f, 4.0f);
        g_fill_cont(w, (size_t)N * K, 63 + si, -0.1f, 0.1f);
        g_fill_cont(b, N, 64 + si, -1.0f, 1.0f);
        g_fill_cont(g, N, 65 + si, 0.5f, 1.5f);
        void *d_w = g_upload_as(w, (size_t)N * K, DS_ELEM_BF16);
        void *d_b = g_upload_as(b, N, DS_ELEM_F32), *d_g = g_upload_as(g, N, DS_ELEM_BF16);
        for (int ai = 0; ai < 2; ai++) {
            const enum ds_elem act = dt[ai];
            const size_t es = act == DS_ELEM_BF16 ? 2 : 4, xr = (size_t)K * es;
            const size_t orow = (size_t)N * es;
            char *d_px = g_upload_as(px, (size_t)POOL * K, act);
            char *d_px0 = g_upload_as(px0, (size_t)POOL * K, act);
            char *d_pr = g_upload_as(pr, (size_t)POOL * N, act);
            char *d_x = g_alloc(POOL * xr), *d_x0 = g_alloc(POOL * xr);
            char *d_out = g_alloc(POOL * orow), *d_n = g_alloc(POOL * orow);
            unsigned char *alone = t_alloc(orow), *alone_n = t_alloc(orow), *in = t_alloc(orow),
                          *in_n = t_alloc(orow);
            struct ds_matmul_args a = {.act = act, .w_dtype = DS_ELEM_BF16,
                                       .bias_dtype = DS_ELEM_F32, .in_dim = K, .out_dim = N,
                                       .x = d_x, .w = d_w, .bias = c->bias ? d_b : NULL,
                                       .residual = c->residual ? d_out : NULL, .out = d_out,
                                       .rms_of = c->rms ? d_x0 : NULL, .rms_eps = 1e-5f,
                                       .norm_gain = c->norm ? d_g : NULL,
                                       .norm_gain_dtype = DS_ELEM_BF16, .norm_out = d_n};
            const int probe[] = {0, 7, 63, 64, 255};
            for (int pi = 0; pi < 5; pi++) {
                const int r = probe[pi];
                for (int bi = -1; bi < NB; bi++) {
                    const int B = bi < 0 ? 1 : batches[bi], at = bi < 0 ? 0 : (r * 7) % B;
                    for (int j = 0; j < B; j++) { // row r at `at`, others rotated from the pool
                        const int src = j == at ? r : (r + 1 + j * 13) % POOL;
                        G_CHECK(cudaMemcpy(d_x + j * xr, d_px + src * xr, xr,
                                           cudaMemcpyDeviceToDevice));
                        G_CHECK(cudaMemcpy(d_x0 + j * xr, d_px0 + src * xr, xr,
                                           cudaMemcpyDeviceToDevice));
                        G_CHECK(cudaMemcpy(d_out + j * orow, d_pr + src * orow, orow,
                                           cudaMemcpyDeviceToDevice));
                    }
                    a.n_rows = B;
                    EXPECT_OK(ds_matmul_cuda(&a, NULL));
                    g_download(bi < 0 ? alone : in, d_out + at * orow, orow);
                    g_download(bi < 0 ? alone_n : in_n, d_n + at * orow, orow);
                    if (bi < 0) continue;
                    char what[192];
                    snprintf(what, sizeof what, "%s act %s: row %d alone vs at %d of %d: out",
                             name, dt_name(act), r, at, B);
                    g_same_bytes(what, alone, in, orow, es);
                    if (c->norm) {
                        snprintf(what, sizeof what, "%s act %s: row %d alone vs at %d of %d: "
                                 "norm_out", name, dt_name(act), r, at, B);
                        g_same_bytes(what, alone_n, in_n, orow, es);
                    }
                }
            }
            free(alone), free(alone_n), free(in), free(in_n);
            g_free(d_px), g_free(d_px0), g_free(d_pr), g_free(d_x), g_free(d_x0), g_free(d_out);
            g_free(d_n);
        }
        g_free(d_w), g_free(d_b), g_free(d_g);
        free(px), free(px0), free(pr), free(w), free(b), free(g);
    }
}

// q/k/v of a deferred norm: one split call with rms_of and the RoPE fields. (1) The product
// without RoPE against the reference's split call with rms_of (rms_compare); (2) the fused call
// bitwise equal to that product followed by ds_rope_cuda (as for the plain fused RoPE); (3) the
// fused call against the reference's own fused call (product with the scale, then ds_rope_ref).
// For (3) the GPU rounds the product to act before rotating (bf16: 2^-9 relative), the reference
// to f32; a rotation by a table entry (|cos|, |sin| <= the YaRN concentration, 1.35 for gpt-oss)
// carries each input's error into the result: allowed = 1 ulp of the result + 2^-8·(|a| + |b|) +
// 2^-19·(mag_a + mag_b), (a, b) the pair's unrotated reference values (2^-8 and 2^-19: the 2^-9
// rounding and rms_allowed's 2^-20, each doubled for the concentration). Cases: gpt-oss qkv (2880
// -> 4096 + 512 + 512, D = 64, YaRN) at T = 1 .. 8 (rotation inside the stream tile), 9 and 33
// (two ops); the tiny config (256 -> 256 + 64 + 64, D = 32) at T = 1, 5, 16; f32 at T = 2.
static void run_rms_rope_case(int T, int K, const int d[3], int D, int yarn, enum ds_elem act) {
    enum { P = 4096 };
    const int N = d[0] + d[1] + d[2], H = D / 2;
    const size_t es = act == DS_ELEM_BF16 ? 2 : 4;
    const struct ds_rope_table_config ycfg = {.kind = DS_ROPE_TABLE_YARN, .head_dim = D,
                                              .theta = 150000.0, .factor = 32.0,
                                              .beta_fast = 32.0, .beta_slow = 1.0,
                                              .original_max_pos = 4096};
    const struct ds_rope_table_config pcfg = {.kind = DS_ROPE_TABLE_PLAIN, .head_dim = D,
                                              .theta = 10000.0};
    float *cs = t_alloc((size_t)P * H * 4), *sn = t_alloc((size_t)P * H * 4);
    EXPECT_OK(ds_rope_table_fill(yarn ? &ycfg : &pcfg, P, cs, sn));
    float *x = t_alloc((size_t)T * K * 4), *x0 = t_alloc((size_t)T * K * 4);
    float *w = t_alloc((size_t)N * K * 4), *b = t_alloc((size_t)N * 4);
    t_fill(x, (size_t)T * K, 720 + T, 1.0f);
    rms_rows(x0, (size_t)T * K, 730 + T, 0);
    t_fill(w, (size_t)N * K, 820 + N, 1.0f);
    t_fill(b, N, 920 + N, 1.0f);
    int32_t *pos = t_alloc((size_t)T * 4);
    uint64_t seed = 41 + T;
    for (int t = 0; t < T; t++) pos[t] = t_int(&seed, 0, P - 1);
    float *pre[3], *sacc[3], *want[3];
    void *two[3], *fused[3];
    int first[3];
    for (int j = 0, f = 0; j < 3; f += d[j], j++) {
        first[j] = f;
        pre[j] = t_alloc((size_t)T * d[j] * 4), sacc[j] = t_alloc((size_t)T * d[j] * 4);
        want[j] = t_alloc((size_t)T * d[j] * 4);
        two[j] = g_alloc((size_t)T * d[j] * es), fused[j] = g_alloc((size_t)T * d[j] * es);
    }
    struct ds_matmul_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = K, .out_dim = N,
                               .x = x, .w = w, .bias = b, .out = pre[0],
                               .part_dim = {d[0], d[1], d[2]}, .out1 = pre[1], .out2 = pre[2],
                               .bias1 = b + first[1], .bias2 = b + first[2], .rms_of = x0,
                               .rms_eps = 1e-5f};
    EXPECT_OK(ds_matmul_ref(&r)); // the product
    struct ds_matmul_args rs = r;
    rs.bias = rs.bias1 = rs.bias2 = NULL, rs.out = sacc[0], rs.out1 = sacc[1], rs.out2 = sacc[2];
    EXPECT_OK(ds_matmul_ref(&rs)); // s·acc, for mag
    struct ds_matmul_args rr = r;
    rr.out = want[0], rr.out1 = want[1], rr.out2 = want[2], rr.rope_head_dim = D;
    rr.rope_positions = pos, rr.rope_cos = cs, rr.rope_sin = sn, rr.rope_table_len = P;
    EXPECT_OK(ds_matmul_ref(&rr)); // the fused call of the reference
    void *d_x = g_upload_as(x, (size_t)T * K, act), *d_x0 = g_upload_as(x0, (size_t)T * K, act);
    void *d_w = g_upload_as(w, (size_t)N * K, DS_ELEM_BF16), *d_b = g_upload_as(b, N, DS_ELEM_F32);
    void *d_cs = g_upload(cs, (size_t)P * H * 4), *d_sn = g_upload(sn, (size_t)P * H * 4);
    int32_t *d_pos = g_upload(pos, (size_t)T * 4);
    struct ds_matmul_args a = {.act = act, .w_dtype = DS_ELEM_BF16, .bias_dtype = DS_ELEM_F32,
                               .n_rows = T, .in_dim = K, .out_dim = N, .x = d_x, .w = d_w,
                               .bias = d_b, .out = two[0], .part_dim = {d[0], d[1], d[2]},
                               .out1 = two[1], .out2 = two[2], .bias1 = (float *)d_b + first[1],
                               .bias2 = (float *)d_b + first[2], .rms_of = d_x0, .rms_eps = 1e-5f};
    EXPECT_OK(ds_matmul_cuda(&a, NULL)); // (1) the product alone
    char what[192];
    for (int j = 0; j < 3; j++) {
        const size_t n = (size_t)T * d[j];
        float *got = g_download_f(two[j], n, act);
        double *mag = t_alloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) mag[i] = fabs(sacc[j][i]) + fabs(b[first[j] + i % d[j]]);
        snprintf(what, sizeof what, "deferred-norm q/k/v T=%d K=%d D=%d act %s: part %d product vs "
                 "reference", T, K, D, dt_name(act), j);
        rms_compare(what, got, pre[j], mag, n, d[j], act);
        free(got), free(mag);
    }
    struct ds_rope_args ro = {.act = act, .n_rows = T, .head_dim = D, .n_q_heads = d[0] / D,
                              .n_k_heads = d[1] / D, .q = two[0], .k = two[1], .positions = d_pos,
                              .cos = (const float *)d_cs, .sin = (const float *)d_sn,
                              .table_len = P};
    EXPECT_OK(ds_rope_cuda(&ro, NULL));
    a.out = fused[0], a.out1 = fused[1], a.out2 = fused[2], a.rope_head_dim = D;
    a.rope_positions = d_pos, a.rope_cos = (const float *)d_cs, a.rope_sin = (const float *)d_sn;
    a.rope_table_len = P;
    EXPECT_OK(ds_matmul_cuda(&a, NULL)); // one call
    for (int j = 0; j < 3; j++) {
        const size_t n = (size_t)T * d[j], bytes = n * es;
        unsigned char *hf = t_alloc(bytes), *ht = t_alloc(bytes);
        g_download(hf, fused[j], bytes);
        g_download(ht, two[j], bytes);
        snprintf(what, sizeof what, "deferred-norm q/k/v T=%d K=%d D=%d act %s: part %d fused vs "
                 "product then rope", T, K, D, dt_name(act), j);
        g_same_bytes(what, hf, ht, bytes, es); // (2)
        free(hf), free(ht);
        float *got = g_download_f(fused[j], n, act);
        size_t bad = 0, fi = 0;
        double fa = 0;
        for (size_t i = 0; i < n; i++) { // (3)
            const size_t c = i % d[j], h0 = i - c % D, ci = c % D;
            const size_t pi = h0 + (ci < (size_t)H ? ci + H : ci - H); // the rotation partner
            const double wr = act == DS_ELEM_BF16 ? ds_bf16_to_f32(ds_f32_to_bf16(want[j][i]))
                                                  : want[j][i];
            double al = rms_allowed(want[j][i], 0.0, act);
            if (j < 2) {
                const size_t c2 = pi % d[j];
                al += 0x1p-8 * (fabs(pre[j][i]) + fabs(pre[j][pi])) +
                      0x1p-19 * (fabs(sacc[j][i]) + fabs(b[first[j] + c]) + fabs(sacc[j][pi]) +
                                 fabs(b[first[j] + c2]));
            } else {
                al = rms_allowed(want[j][i], fabs(sacc[j][i]) + fabs(b[first[j] + c]), act);
            }
            if (!(fabs((double)got[i] - wr) <= al) && bad++ == 0) fi = i, fa = al;
        }
        if (bad)
            DS_FAILF("deferred-norm q/k/v T=%d K=%d D=%d act %s: part %d fused vs the reference's "
                     "fused call: %zu of %zu beyond the bound; first at row %zu col %zu: got %.9g "
                     "want %.9g (allowed %.3g)", T, K, D, dt_name(act), j, bad, n, fi / d[j],
                     fi % d[j], (double)got[fi], (double)want[j][fi], fa);
        free(got);
    }
    for (int j = 0; j < 3; j++) {
        free(pre[j]), free(sacc[j]), free(want[j]);
        g_free(two[j]), g_free(fused[j]);
    }
    g_free(d_x), g_free(d_x0), g_free(d_w), g_free(d_b), g_free(d_cs), g_free(d_sn), g_free(d_pos);
    free(cs), free(sn), free(x), free(x0), free(w), free(b), free(pos);
}

static void matmul_deferred_norm_qkv_with_rope(void) {
    static const int qkv[3] = {4096, 512, 512}, tiny[3] = {256, 64, 64};
    if (!g_small_skip("deferred-norm q/k/v at the gpt-oss shapes")) {
        for (int T = 1; T <= 9; T++) run_rms_rope_case(T, 2880, qkv, 64, 1, DS_ELEM_BF16);
        run_rms_rope_case(33, 2880, qkv, 64, 1, DS_ELEM_BF16);
    }
    run_rms_rope_case(1, 256, tiny, 32, 0, DS_ELEM_BF16);
    run_rms_rope_case(5, 256, tiny, 32, 0, DS_ELEM_BF16);
    run_rms_rope_case(16, 256, tiny, 32, 0, DS_ELEM_BF16);
    run_rms_rope_case(2, 256, tiny, 32, 0, DS_ELEM_F32);
}

// embed's norm_out against the reference: table values (multiples of 1/16) times a bf16 gain
// (multiples of 1/32) are exact in fp32, so f32 must match bitwise and bf16 must be the reference
// rounded once (0 ulp). C = 2880: 16-byte groups; C = 45: element copies.
static void embed_norm_out_matches_reference(void) {
    enum { V = 1000, T = 9 };
    const int widths[2] = {2880, 45};
    for (int wi = 0; wi < 2; wi++) {
        const int C = widths[wi];
        float *table = t_alloc((size_t)V * C * 4), *g = t_alloc((size_t)C * 4);
        float *want = t_alloc((size_t)T * C * 4), *want_n = t_alloc((size_t)T * C * 4);
        t_fill(table, (size_t)V * C, 21, 4.0f);
        t_fill(g, C, 22, 2.0f);
        int32_t ids[T] = {0, 999, 5, 5, 512, 1, 998, 0, 7};
        struct ds_embed_args r = {.act = DS_ELEM_F32, .table_dtype = DS_ELEM_F32, .n_rows = T,
                                  .vocab = V, .dim = C, .table = table, .ids = ids, .out = want,
                                  .norm_gain = g, .norm_gain_dtype = DS_ELEM_F32,
                                  .norm_out = want_n};
        EXPECT_OK(ds_embed_ref(&r));
        int32_t *d_ids = g_upload(ids, sizeof ids);
        void *d_g = g_upload_as(g, C, DS_ELEM_BF16);
        for (int ti = 0; ti < 2; ti++) {
            void *d_table = g_upload_as(table, (size_t)V * C, dt[ti]);
            for (int ai = 0; ai < 2; ai++) {
                void *d_out = g_alloc((size_t)T * C * 4), *d_n = g_alloc((size_t)T * C * 4);
                struct ds_embed_args a = {.act = dt[ai], .table_dtype = dt[ti], .n_rows = T,
                                          .vocab = V, .dim = C, .table = d_table, .ids = d_ids,
                                          .out = d_out, .norm_gain = d_g,
                                          .norm_gain_dtype = DS_ELEM_BF16, .norm_out = d_n};
                EXPECT_OK(ds_embed_cuda(&a, NULL));
                float *got = g_download_f(d_out, (size_t)T * C, dt[ai]);
                float *gn = g_download_f(d_n, (size_t)T * C, dt[ai]);
                char what[96];
                snprintf(what, sizeof what, "embed norm_out C=%d act %s table %s", C,
                         dt_name(dt[ai]), dt_name(dt[ti]));
                g_compare(what, got, want, (size_t)T * C, C, 0.0, 0.0);
                if (dt[ai] == DS_ELEM_F32) g_compare(what, gn, want_n, (size_t)T * C, C, 0.0, 0.0);
                else g_compare_bf16(what, gn, want_n, (size_t)T * C, C, 0.0);
                free(got), free(gn);
                g_free(d_out), g_free(d_n);
            }
            g_free(d_table);
        }
        g_free(d_ids), g_free(d_g);
        free(table), free(g), free(want), free(want_n);
    }
}

// Host checks of the deferred-norm fields (each call is refused before any launch).
static void matmul_deferred_norm_rejects_bad_arguments(void) {
    struct ds_matmul_args a = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16, .n_rows = 1,
                               .in_dim = 8, .out_dim = 8, .x = (void *)16, .w = (void *)32,
                               .out = (void *)64, .part_dim = {4, 4, 0}, .out1 = (void *)128,
                               .norm_gain = (void *)256, .norm_gain_dtype = DS_ELEM_BF16,
                               .norm_out = (void *)512};
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul: a split output takes no norm_gain");
    a.part_dim[0] = a.part_dim[1] = 0, a.out1 = NULL, a.norm_out = NULL;
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("norm_out");
    a.norm_gain = NULL, a.rms_of = (void *)1024, a.rms_eps = -1.0f;
    EXPECT_STATUS(ds_matmul_cuda(&a, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("rms_eps");
    a.rms_eps = 1e-5f, a.in_dim = 12; // THE ROW SCALE needs K % 8 == 0
    EXPECT(ds_matmul_cuda(&a, NULL) != DS_OK);
}

// ---------------------------------------------------------------------------------------------
// Elementwise ops and gather

static void add_silu_gather_match_reference(void) {
    enum { T = 37, C = 2883, R = 5 };
    const size_t n = (size_t)T * C;
    float *a = t_alloc(n * 4), *b = t_alloc(n * 4), *want = t_alloc(n * 4);
    t_fill(a, n, 31, 8.0f);
    t_fill(b, n, 32, 2.0f);
    for (int ai = 0; ai < 2; ai++) {
        const enum ds_elem act = dt[ai];
        void *d_a = g_upload_as(a, n, act), *d_b = g_upload_as(b, n, act), *d_o = g_alloc(n * 4);
        // add: the sum of two multiples of 1/64 below 10 in magnitude is exact in f32, so f32
        // must match bitwise and bf16 must be exactly that sum rounded once (0 ulp).
        struct ds_add_args ar = {.act = DS_ELEM_F32, .n_rows = T, .dim = C, .a = a, .b = b,
                                 .out = want};
        EXPECT_OK(ds_add_ref(&ar));
        struct ds_add_args ag = {.act = act, .n_rows = T, .dim = C, .a = d_a, .b = d_b, .out = d_o};
        EXPECT_OK(ds_add_cuda(&ag, NULL));
        float *got = g_download_f(d_o, n, act);
        if (act == DS_ELEM_F32) g_compare("add f32", got, want, n, C, 0.0, 0.0);
        else g_compare_bf16("add bf16", got, want, n, C, 0.0);
        free(got);
        // silu_mul in double on both sides: equal up to exp()'s last-bit differences between libm
        // and CUDA (<= 1 ulp of double), so the float results agree to 1 float ulp.
        struct ds_silu_mul_args sr = {.act = DS_ELEM_F32, .n_rows = T, .dim = C, .gate = a,
                                      .up = b, .out = want};
        EXPECT_OK(ds_silu_mul_ref(&sr));
        struct ds_silu_mul_args sg = {.act = act, .n_rows = T, .dim = C, .gate = d_a, .up = d_b,
                                      .out = d_a}; // out == gate is allowed
        EXPECT_OK(ds_silu_mul_cuda(&sg, NULL));
        got = g_download_f(d_a, n, act);
        if (act == DS_ELEM_F32) g_compare("silu_mul f32", got, want, n, C, 1e-30, 1.2e-7);
        else g_compare_bf16("silu_mul bf16", got, want, n, C, 1.0);
        free(got);
        // gather: a copy, bitwise.
        int32_t rows[R] = {36, 0, 5, 5, 20};
        int32_t *d_rows = g_upload(rows, sizeof rows);
        void *d_src = g_upload_as(b, n, act);
        struct ds_gather_rows_args gg = {.act = act, .n_rows = R, .src_rows = T, .dim = C,
                                         .x = d_src, .rows = d_rows, .out = d_o};
        EXPECT_OK(ds_gather_rows_cuda(&gg, NULL));
        got = g_download_f(d_o, (size_t)R * C, act);
        for (int i = 0; i < R; i++) EXPECT(t_same_bits(got + (size_t)i * C, b + (size_t)rows[i] * C, C));
        free(got);
        // An out-of-range row index gives a NaN row, never a fault.
        rows[2] = T;
        G_CHECK(cudaMemcpy(d_rows, rows, sizeof rows, cudaMemcpyHostToDevice));
        EXPECT_OK(ds_gather_rows_cuda(&gg, NULL));
        got = g_download_f(d_o, (size_t)R * C, act);
        EXPECT(isnan(got[2 * C]) && t_same_bits(got, b + (size_t)36 * C, C));
        free(got);
        g_free(d_rows), g_free(d_src), g_free(d_a), g_free(d_b), g_free(d_o);
    }
    free(a), free(b), free(want);
}

// ---------------------------------------------------------------------------------------------
// RoPE

static void rope_matches_reference(void) {
    // gpt-oss (YaRN, D 64, 64 q heads, 8 kv heads) and a tiny plain config (D 32, 4/2 heads).
    struct ds_rope_table_config yarn = {.kind = DS_ROPE_TABLE_YARN,
                                        .head_dim = 64,
                                        .theta = 150000.0,
                                        .factor = 32.0,
                                        .beta_fast = 32.0,
                                        .beta_slow = 1.0,
                                        .original_max_pos = 4096};
    struct ds_rope_table_config plain = {
        .kind = DS_ROPE_TABLE_PLAIN, .head_dim = 32, .theta = 10000.0};
    struct {
        const struct ds_rope_table_config *cfg;
        int nh, nkv, T, with_k;
    } cases[] = {{&yarn, 64, 8, 5, 1}, {&plain, 4, 2, 3, 1}, {&plain, 4, 2, 1, 0},
                 {&yarn, 64, 8, 260, 1}};
    enum { P = 131072 };
    for (int ci = 0; ci < 4; ci++) {
        const int D = cases[ci].cfg->head_dim, H = D / 2, T = cases[ci].T;
        const size_t nq = (size_t)T * cases[ci].nh * D, nk = (size_t)T * cases[ci].nkv * D;
        float *cs = t_alloc((size_t)P * H * 4), *sn = t_alloc((size_t)P * H * 4);
        EXPECT_OK(ds_rope_table_fill(cases[ci].cfg, P, cs, sn));
        float *q = t_alloc(nq * 4), *k = t_alloc(nk * 4), *wq = t_alloc(nq * 4),
              *wk = t_alloc(nk * 4);
        int32_t *pos = t_alloc((size_t)T * 4);
        uint64_t seed = 9 + ci;
        for (int t = 0; t < T; t++) pos[t] = t_int(&seed, 0, P - 1);
        pos[0] = 0, pos[T - 1] = P - 1;
        t_fill(q, nq, 50 + ci, 4.0f);
        t_fill(k, nk, 60 + ci, 4.0f);
        memcpy(wq, q, nq * 4), memcpy(wk, k, nk * 4);
        struct ds_rope_args r = {.act = DS_ELEM_F32, .n_rows = T, .head_dim = D,
                                 .n_q_heads = cases[ci].nh, .n_k_heads = cases[ci].nkv, .q = wq,
                                 .k = cases[ci].with_k ? wk : NULL, .positions = pos, .cos = cs,
                                 .sin = sn, .table_len = P};
        EXPECT_OK(ds_rope_ref(&r));
        void *d_cs = g_upload(cs, (size_t)P * H * 4), *d_sn = g_upload(sn, (size_t)P * H * 4);
        int32_t *d_pos = g_upload(pos, (size_t)T * 4);
        for (int ai = 0; ai < 2; ai++) {
            void *d_q = g_upload_as(q, nq, dt[ai]), *d_k = g_upload_as(k, nk, dt[ai]);
            struct ds_rope_args a = r;
            a.act = dt[ai], a.q = d_q, a.k = cases[ci].with_k ? d_k : NULL, a.positions = d_pos;
            a.cos = d_cs, a.sin = d_sn;
            EXPECT_OK(ds_rope_cuda(&a, NULL));
            float *gq = g_download_f(d_q, nq, dt[ai]), *gk = g_download_f(d_k, nk, dt[ai]);
            char what[96];
            snprintf(what, sizeof what, "rope case %d T=%d D=%d act %s q", ci, T, D,
                     dt_name(dt[ai]));
            // The same double arithmetic as the reference: f32 bitwise; bf16 the reference
            // rounded once more (<= 1 bf16 ulp from the double rounding).
            if (dt[ai] == DS_ELEM_F32) {
                g_compare(what, gq, wq, nq, (size_t)cases[ci].nh * D, 0.0, 0.0);
                what[strlen(what) - 1] = 'k';
                g_compare(what, gk, cases[ci].with_k ? wk : k, nk, (size_t)cases[ci].nkv * D,
                          0.0, 0.0);
            } else {
                g_compare_bf16(what, gq, wq, nq, (size_t)cases[ci].nh * D, 1.0);
                what[strlen(what) - 1] = 'k';
                g_compare_bf16(what, gk, cases[ci].with_k ? wk : k, nk,
                               (size_t)cases[ci].nkv * D, 1.0);
            }
            free(gq), free(gk);
            g_free(d_q), g_free(d_k);
        }
        // A position beyond the table turns that row into NaN and leaves the others alone.
        pos[0] = P;
        G_CHECK(cudaMemcpy(d_pos, pos, (size_t)T * 4, cudaMemcpyHostToDevice));
        void *d_q = g_upload_as(q, nq, DS_ELEM_F32);
        struct ds_rope_args a = r;
        a.q = d_q, a.k = NULL, a.positions = d_pos, a.cos = d_cs, a.sin = d_sn;
        EXPECT_OK(ds_rope_cuda(&a, NULL));
        float *gq = g_download_f(d_q, nq, DS_ELEM_F32);
        EXPECT(isnan(gq[0]));
        if (T > 1) EXPECT(t_same_bits(gq + (size_t)cases[ci].nh * D, wq + (size_t)cases[ci].nh * D,
                                      nq - (size_t)cases[ci].nh * D));
        free(gq);
        g_free(d_q), g_free(d_cs), g_free(d_sn), g_free(d_pos);
        free(cs), free(sn), free(q), free(k), free(wq), free(wk), free(pos);
    }
}

// The fast path (16-byte loads, C <= 4096) and the element path follow one summation order, so
// the same row gives the same bits through either: rows moved one element off 16-byte alignment
// (2 bytes for bf16, 4 for f32: still naturally aligned) take the element path (bf16 and f32
// activations, C = 2880 and 64). A buffer that is not aligned to its element size is refused on
// the host (an f32 row 2 bytes off would fault on the device).
static void rmsnorm_paths_agree_bitwise(void) {
    const int widths[2] = {2880, 64};
    enum { T = 5 };
    for (int ci = 0; ci < 2; ci++)
        for (int ai = 0; ai < 2; ai++) {
            const int C = widths[ci];
            const enum ds_elem act = dt[ai];
            const size_t es = act == DS_ELEM_BF16 ? 2 : 4, n = (size_t)T * C, bytes = n * es;
            float *x = t_alloc(n * 4), *g = t_alloc((size_t)C * 4);
            g_fill_cont(x, n, 40 + ci, -3.0f, 3.0f);
            g_fill_cont(g, C, 41 + ci, 0.5f, 1.5f);
            void *d_g = g_upload_as(g, C, DS_ELEM_BF16), *d_x = g_upload_as(x, n, act);
            char *d_xu = g_alloc(bytes + 16), *d_yu = g_alloc(bytes + 16);
            void *d_y = g_alloc(bytes);
            G_CHECK(cudaMemcpy(d_xu + es, d_x, bytes, cudaMemcpyDeviceToDevice));
            struct ds_rmsnorm_args a = {.act = act, .w_dtype = DS_ELEM_BF16, .n_rows = T,
                                        .dim = C, .eps = 1e-5f, .x = d_x, .w = d_g, .out = d_y};
            EXPECT_OK(ds_rmsnorm_cuda(&a, NULL));
            a.x = d_xu + es, a.out = d_yu + es;
            EXPECT_OK(ds_rmsnorm_cuda(&a, NULL));
            unsigned char *fast = t_alloc(bytes), *slow = t_alloc(bytes);
            g_download(fast, d_y, bytes);
            g_download(slow, d_yu + es, bytes);
            char what[96];
            snprintf(what, sizeof what, "rmsnorm C=%d act %s: 16-byte path vs element path", C,
                     dt_name(act));
            g_same_bytes(what, fast, slow, bytes, es);
            if (act == DS_ELEM_F32) { // 2 bytes off: not a float address, refused before launch
                a.x = d_xu + 2;
                EXPECT_STATUS(ds_rmsnorm_cuda(&a, NULL), DS_ERR_ARG);
                EXPECT_ERROR_HAS("rmsnorm: x is not aligned to its 4-byte f32 elements");
            }
            free(fast), free(slow), free(x), free(g);
            g_free(d_g), g_free(d_x), g_free(d_xu), g_free(d_yu), g_free(d_y);
        }
}

// RMSNorm rows alone vs in a batch (one block per row: trivially invariant, checked anyway).
static void rmsnorm_is_batch_invariant(void) {
    enum { C = 2880, B = 64 };
    float *x = t_alloc((size_t)B * C * 4), *g = t_alloc(C * 4);
    g_fill_cont(x, (size_t)B * C, 3, -3.0f, 3.0f);
    g_fill_cont(g, C, 4, 0.5f, 1.5f);
    void *d_x = g_upload_as(x, (size_t)B * C, DS_ELEM_BF16), *d_g = g_upload_as(g, C, DS_ELEM_BF16);
    void *d_all = g_alloc((size_t)B * C * 2), *d_one = g_alloc((size_t)C * 2);
    struct ds_rmsnorm_args a = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16, .n_rows = B,
                                .dim = C, .eps = 1e-5f, .x = d_x, .w = d_g, .out = d_all};
    EXPECT_OK(ds_rmsnorm_cuda(&a, NULL));
    uint16_t *all = t_alloc((size_t)B * C * 2), *one = t_alloc((size_t)C * 2);
    g_download(all, d_all, (size_t)B * C * 2);
    for (int r = 0; r < B; r += 9) {
        a.n_rows = 1, a.x = (char *)d_x + (size_t)r * C * 2, a.out = d_one;
        EXPECT_OK(ds_rmsnorm_cuda(&a, NULL));
        g_download(one, d_one, (size_t)C * 2);
        g_same_bytes("rmsnorm row alone vs in 64", one, all + (size_t)r * C, (size_t)C * 2, 2);
    }
    free(x), free(g), free(all), free(one);
    g_free(d_x), g_free(d_g), g_free(d_all), g_free(d_one);
}

// Programmatic dependent launch: every dense kernel waits for the previous kernel of its stream
// before touching global memory (the matmul only prefetches weights into L2 before that). A chain
// of dependent ops on one stream with no host sync between them (rmsnorm -> matmul with the
// residual in place -> rmsnorm -> split matmul -> add -> silu_mul -> gather, each reading what
// the previous one wrote) must give the bytes of the same chain with a stream sync after every op.
// A kernel that read its input early would race; repeated 20 times, T = 1 and 4 (stream tile),
// 40 (32 x 64 tile), bf16 activations.
static enum ds_status dense_chain(cudaStream_t st, int sync, int T, void *x, void *xn, void *y,
                                  void *y1, const void *w, const void *g, const int32_t *rows,
                                  void *out) {
    enum { C = 2880 };
    void *sp = (void *)st;
    enum ds_status s = DS_OK;
#define CHAIN(call)                                                                                \
    do {                                                                                           \
        if ((s = (call)) != DS_OK) return s;                                                       \
        if (sync) G_CHECK(cudaStreamSynchronize(st));                                              \
    } while (0)
    struct ds_rmsnorm_args n = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16, .n_rows = T,
                                .dim = C, .eps = 1e-5f, .x = x, .w = g, .out = xn};
    struct ds_matmul_args m = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = C, .out_dim = C,
                               .x = xn, .w = w, .residual = x, .out = x};
    CHAIN(ds_rmsnorm_cuda(&n, sp));
    CHAIN(ds_matmul_cuda(&m, sp));
    CHAIN(ds_rmsnorm_cuda(&n, sp));
    struct ds_matmul_args sm = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16,
                                .bias_dtype = DS_ELEM_F32, .n_rows = T, .in_dim = C,
                                .out_dim = C, .x = xn, .w = w, .out = y,
                                .part_dim = {C / 2, C / 2, 0}, .out1 = y1};
    CHAIN(ds_matmul_cuda(&sm, sp));
    struct ds_add_args ad = {.act = DS_ELEM_BF16, .n_rows = T, .dim = C / 2, .a = y, .b = y1,
                             .out = y};
    CHAIN(ds_add_cuda(&ad, sp));
    struct ds_silu_mul_args sl = {.act = DS_ELEM_BF16, .n_rows = T, .dim = C / 2, .gate = y,
                                  .up = y1, .out = y};
    CHAIN(ds_silu_mul_cuda(&sl, sp));
    struct ds_gather_rows_args ga = {.act = DS_ELEM_BF16, .n_rows = T, .src_rows = T,
                                     .dim = C / 2, .x = y, .rows = rows, .out = out};
    CHAIN(ds_gather_rows_cuda(&ga, sp));
#undef CHAIN
    return s;
}

static void dense_chain_with_dependent_launches_equals_synced_chain(void) {
    enum { C = 2880, TMAX = 40, REPS = 20 };
    const int Ts[3] = {1, 4, 40};
    float *hx = t_alloc((size_t)TMAX * C * 4), *hw = t_alloc((size_t)C * C * 4);
    float *hg = t_alloc((size_t)C * 4);
    g_fill_cont(hx, (size_t)TMAX * C, 91, -2.0f, 2.0f);
    g_fill_cont(hw, (size_t)C * C, 92, -0.05f, 0.05f);
    g_fill_cont(hg, C, 93, 0.5f, 1.5f);
    int32_t hrows[TMAX];
    void *d_x0 = g_upload_as(hx, (size_t)TMAX * C, DS_ELEM_BF16);
    void *d_w = g_upload_as(hw, (size_t)C * C, DS_ELEM_BF16);
    void *d_g = g_upload_as(hg, C, DS_ELEM_BF16);
    int32_t *d_rows = g_alloc(sizeof hrows);
    const size_t xb = (size_t)TMAX * C * 2, hb = (size_t)TMAX * (C / 2) * 2;
    void *d_x = g_alloc(xb), *d_xn = g_alloc(xb), *d_y = g_alloc(hb), *d_y1 = g_alloc(hb);
    void *d_out = g_alloc(hb);
    unsigned char *want_o = t_alloc(hb), *want_x = t_alloc(xb), *got_o = t_alloc(hb),
                  *got_x = t_alloc(xb);
    cudaStream_t st;
    G_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int ti = 0; ti < 3; ti++) {
        const int T = Ts[ti];
        for (int i = 0; i < T; i++) hrows[i] = T - 1 - i; // reversed rows
        // Every copy on st: st is a non-blocking stream, which a legacy-stream cudaMemcpy or
        // cudaMemset does not order against (device-side copies and memsets may return before
        // they are done), so a chain could read a half-reset x.
        G_CHECK(cudaMemcpyAsync(d_rows, hrows, (size_t)T * 4, cudaMemcpyHostToDevice, st));
        for (int rep = 0; rep <= REPS; rep++) {
            const int sync = rep == 0; // the first run is the stepwise reference
            G_CHECK(cudaMemcpyAsync(d_x, d_x0, xb, cudaMemcpyDeviceToDevice, st));
            G_CHECK(cudaMemsetAsync(d_out, 0xff, hb, st));
            EXPECT_OK(dense_chain(st, sync, T, d_x, d_xn, d_y, d_y1, d_w, d_g, d_rows, d_out));
            G_CHECK(cudaStreamSynchronize(st));
            g_download(sync ? want_o : got_o, d_out, (size_t)T * (C / 2) * 2);
            g_download(sync ? want_x : got_x, d_x, (size_t)T * C * 2);
            if (sync) continue;
            char what[96];
            snprintf(what, sizeof what, "dense chain T=%d run %d: gathered output", T, rep);
            int ok = g_same_bytes(what, got_o, want_o, (size_t)T * (C / 2) * 2, 2);
            snprintf(what, sizeof what, "dense chain T=%d run %d: residual stream", T, rep);
            ok &= g_same_bytes(what, got_x, want_x, (size_t)T * C * 2, 2);
            if (!ok) break; // one report per shape
        }
    }
    G_CHECK(cudaStreamDestroy(st));
    free(hx), free(hw), free(hg), free(want_o), free(want_x), free(got_o), free(got_x);
    g_free(d_x0), g_free(d_w), g_free(d_g), g_free(d_rows), g_free(d_x), g_free(d_xn);
    g_free(d_y), g_free(d_y1), g_free(d_out);
}

int main(void) {
    G_REQUIRE_GPU();
    DS_RUN(embed_matches_reference_and_marks_bad_ids);
    DS_RUN(rmsnorm_matches_reference);
    DS_RUN(rmsnorm_paths_agree_bitwise);
    DS_RUN(rmsnorm_is_batch_invariant);
    DS_RUN(matmul_rejects_bad_arguments);
    DS_RUN(matmul_shape_matrix_matches_reference);
    G_RUN_LARGE(matmul_bf16_continuous_values_loose); // real qkv / lm_head-like shapes only
    DS_RUN(matmul_is_batch_invariant);
    DS_RUN(matmul_split_outputs_equal_separate_calls);
    DS_RUN(matmul_fused_rope_equals_two_ops);
    DS_RUN(matmul_deferred_norm_rejects_bad_arguments);
    DS_RUN(matmul_deferred_norm_matches_reference);
    DS_RUN(matmul_deferred_norm_is_batch_invariant);
    DS_RUN(matmul_deferred_norm_qkv_with_rope);
    DS_RUN(embed_norm_out_matches_reference);
    DS_RUN(add_silu_gather_match_reference);
    DS_RUN(rope_matches_reference);
    G_RUN_LARGE(dense_chain_with_dependent_launches_equals_synced_chain); // 2880² weight, 63 runs
    return ds_test_end();
}
