// CUDA router (cluster path, and the many-block path of a call with a workspace) and MXFP4
// mixture of experts against the CPU reference (ds_router_ref, ds_moe_ref,
// ds_mxfp4_dequant_ref) on identical seeded inputs: the device MXFP4 decode bit for bit over all
// 16 codes × all 256 scale bytes; router ids exactly (ties included) and weights within fp32
// rounding; the expert block over a shape matrix (1 row, partial tiles, one expert above 64 tokens,
// the tiny configs, the real 20b and 120b shapes) in f32 and bf16; batch invariance (each row
// alone and inside batches of 8, 32, 64 with other neighbours, memcmp; a row alone runs the
// fused one-token down + combine kernel, the batches the separate kernels); in-place residual;
// an out-of-range expert id (also on the one-token path, with a repeated expert); host-side
// argument errors (these run without a GPU too).
//
// Inputs are multiples of 1/64 (t_fill), exact in bf16. Router logits are then exact in fp32: each
// product x·w is a multiple of 2^-11 and every partial sum stays below 2^13 in magnitude, so the
// GPU's fp32 logits equal the reference's double logits and the top-k ids must agree exactly.
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"
#include "ds/mxfp4.h"
#include "gpu_ops_common.h"

static const char *dt_name(enum ds_elem e) { return e == DS_ELEM_BF16 ? "bf16" : "f32"; }

// Reports an execution error of the queued work (an illegal address shows up here).
static void sync_ok(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) DS_FAILF("%s: %s", what, cudaGetErrorString(e));
}

// ---------------------------------------------------------------------------------------------
// MXFP4 decode

// Row r has scale byte r in block 0 and 255 − r in block 1; block 0 holds every code in both
// nibble positions, block 1 random bytes. Every (code, scale) pair appears, including the
// subnormal scale 2^-127 (s = 0) and 2^128 (s = 255, applied as two halves).
static void mxfp4_decode_is_bit_exact(void) {
    enum { R = 256, K = 64 };
    uint8_t blocks[R * K / 2], scales[R * K / 32];
    uint64_t s = 3;
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < 16; i++) blocks[r * 32 + i] = (uint8_t)(i | (15 - i) << 4);
        for (int i = 16; i < 32; i++) blocks[r * 32 + i] = (uint8_t)t_next(&s);
        scales[2 * r] = (uint8_t)r, scales[2 * r + 1] = (uint8_t)(255 - r);
    }
    float *want = t_alloc(sizeof(float) * R * K), *got = t_alloc(sizeof(float) * R * K);
    EXPECT_OK(ds_mxfp4_dequant_ref(blocks, scales, R, K, want));
    uint8_t *d_b = g_upload(blocks, sizeof blocks), *d_s = g_upload(scales, sizeof scales);
    float *d_out = g_alloc(sizeof(float) * R * K);
    EXPECT_OK(ds_mxfp4_dequant_cuda(d_b, d_s, R, K, d_out, NULL));
    g_download(got, d_out, sizeof(float) * R * K);
    g_same_bytes("mxfp4 decode (row = scale byte of block 0)", got, want, sizeof(float) * R * K,
                 sizeof(float));
    // Spot values from the spec table: code 7 (6.0) at scale 127 is 6, code 15 at 128 is -12.
    EXPECT(got[127 * K + 14] == 6.0f);  // byte 7 of row 127 = 0x87: low nibble 7 at element 14
    EXPECT(got[128 * K + 1] == -12.0f); // byte 0 = 0xF0: high nibble 15 at element 1
    g_free(d_b), g_free(d_s), g_free(d_out);
    free(want), free(got);
}

// ---------------------------------------------------------------------------------------------
// Router

struct rt_case {
    const char *name;
    int T, C, E, K;
    enum ds_elem act, w_dt, b_dt;
    int with_bias, ties;
    // Deferred norm (rms_of, row_scale): 0 none; 1 rms_of entries ±2 with eps 0, so s = 0.5 is
    // exact on both sides (see rms_s_rows) and every check stays exact; 2 multiples of 1/64 with
    // eps 1e-5: the GPU's fp32 s differs from the reference's double s by rounding.
    int rms;
};

// The RMSNorm scale of a row in double, as the reference computes it.
static double rms_s_of(const float *x, int C, double eps) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    return 1.0 / sqrt(ss / C + eps);
}

static void router_case(const struct rt_case *c, uint64_t seed) {
    const int T = c->T, C = c->C, E = c->E, K = c->K;
    if (C >= 2880 && g_small_skip(c->name)) return; // real shapes: the normal run covers them
    float *x = t_alloc(sizeof(float) * T * C), *w = t_alloc(sizeof(float) * E * C);
    float *b = t_alloc(sizeof(float) * E);
    t_fill(x, (size_t)T * C, seed, 2.0f);
    t_fill(w, (size_t)E * C, seed + 1, 1.0f);
    t_fill(b, (size_t)E, seed + 2, 1.0f);
    if (c->ties) // experts 2k and 2k+1 identical: every selection meets exact ties
        for (int e = 1; e < E; e += 2) {
            memcpy(w + (size_t)e * C, w + (size_t)(e - 1) * C, sizeof(float) * C);
            b[e] = b[e - 1];
        }
    int32_t *ids = t_alloc(sizeof(int32_t) * T * K), *got_ids = t_alloc(sizeof(int32_t) * T * K);
    float *wts = t_alloc(sizeof(float) * T * K), *got_w = t_alloc(sizeof(float) * T * K);
    // Deferred norm: rms_of rows x0, the reference's row scales rs, and per row the bound δ of
    // the GPU's logit error (rms = 2) and whether the row has a near tie (then ids and weights
    // of that row are not compared). The logits of the reference are recomputed here (exact dots,
    // double s). GPU: s within 3·2^-24 (exact sum of squares, four correctly rounded fp32
    // operations), then s·dot and + bias round once each: |Δl| <= 5·2^-24·(|s·dot| + |b|);
    // δ = 2^-20·max_e(|s·dot_e| + |b_e|) leaves a margin of 3. A near tie: two of the k + 1
    // largest logits closer than 2δ but not equal (equal dots and biases stay equal on the GPU:
    // same operations on the same values; the ties cases rely on that).
    float *x0 = t_alloc(sizeof(float) * T * C), *rs = t_alloc(sizeof(float) * T);
    float *got_rs = t_alloc(sizeof(float) * T), *first_rs = t_alloc(sizeof(float) * T);
    int32_t *first_ids = t_alloc(sizeof(int32_t) * T * K);
    double *delta = t_alloc(sizeof(double) * T);
    int *near_tie = t_alloc(sizeof(int) * T), n_near = 0;
    const double eps = c->rms == 1 ? 0.0 : 1e-5f;
    if (c->rms == 1) {
        uint64_t sr = seed + 3;
        for (int i = 0; i < T * C; i++) x0[i] = (t_next(&sr) & 1) ? 2.0f : -2.0f;
    } else {
        t_fill(x0, (size_t)T * C, seed + 3, 1.0f);
    }
    struct ds_router_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .dim = C, .n_experts = E,
                               .top_k = K, .x = x, .w = w, .bias = c->with_bias ? b : NULL,
                               .expert_ids = ids, .expert_weights = wts,
                               .rms_of = c->rms ? x0 : NULL, .rms_eps = (float)eps,
                               .row_scale = c->rms ? rs : NULL};
    EXPECT_OK(ds_router_ref(&r));
    if (c->rms == 2)
        for (int t = 0; t < T; t++) {
            const double st = rms_s_of(x0 + (size_t)t * C, C, eps);
            double *l = t_alloc(sizeof(double) * E), dm = 0;
            int *used = t_alloc(sizeof(int) * E);
            for (int e = 0; e < E; e++) {
                double d = 0;
                for (int k = 0; k < C; k++)
                    d += (double)x[(size_t)t * C + k] * w[(size_t)e * C + k];
                const double be = c->with_bias ? b[e] : 0.0;
                l[e] = st * d + be;
                dm = fmax(dm, fabs(st * d) + fabs(be));
            }
            delta[t] = 0x1p-20 * dm;
            double prev = 0;
            for (int s = 0; s <= K && s < E; s++) { // the k + 1 largest, in order
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!used[e] && (best < 0 || l[e] > l[best])) best = e;
                used[best] = 1;
                const double gap = prev - l[best];
                if (s > 0 && gap > 0 && gap <= 2 * delta[t]) near_tie[t] = 1;
                prev = l[best];
            }
            n_near += near_tie[t];
            free(l), free(used);
        }
    void *d_x = g_upload_as(x, (size_t)T * C, c->act), *d_w = g_upload_as(w, (size_t)E * C, c->w_dt);
    void *d_b = g_upload_as(b, (size_t)E, c->b_dt);
    int32_t *d_ids = g_alloc(sizeof(int32_t) * T * K);
    float *d_wts = g_alloc(sizeof(float) * T * K);
    const size_t ws_bytes = ds_router_workspace_bytes(T, E);
    void *d_ws = g_alloc(ws_bytes);
    float *first_w = t_alloc(sizeof(float) * T * K);
    void *d_x0 = g_upload_as(x0, (size_t)T * C, c->act);
    float *d_rs = g_alloc(sizeof(float) * T);
    // Pass 0 without a workspace (the cluster path), pass 1 with one (up to 8 rows: the
    // many-block path; above, the cluster path again). Both against the reference, and the two
    // weight vectors bitwise equal (same per-logit and selection operations).
    for (int ws = 0; ws < 2; ws++) {
        struct ds_router_args a = r;
        a.act = c->act, a.w_dtype = c->w_dt, a.bias_dtype = c->b_dt, a.x = d_x, a.w = d_w;
        a.bias = c->with_bias ? d_b : NULL, a.expert_ids = d_ids, a.expert_weights = d_wts;
        a.workspace = ws ? d_ws : NULL, a.workspace_bytes = ws ? ws_bytes : 0;
        a.rms_of = c->rms ? d_x0 : NULL, a.row_scale = c->rms ? d_rs : NULL;
        G_CHECK(cudaMemset(d_ids, 0xff, sizeof(int32_t) * T * K)); // no stale pass-0 results
        G_CHECK(cudaMemset(d_rs, 0xff, sizeof(float) * T));
        EXPECT_OK(ds_router_cuda(&a, NULL));
        sync_ok(c->name);
        g_download(got_ids, d_ids, sizeof(int32_t) * T * K);
        g_download(got_w, d_wts, sizeof(float) * T * K);
        const char *path = ws ? "workspace" : "no workspace";
        for (int i = 0; i < T * K; i++)
            if (got_ids[i] != ids[i] && !near_tie[i / K]) {
                DS_FAILF("%s (%s): row %d slot %d: expert %d, reference %d", c->name, path, i / K,
                         i % K, (int)got_ids[i], (int)ids[i]);
                break;
            }
        // fp32 softmax of exact logits vs the double one: expf (2 ulp), k-term sum and one
        // division, each within a few 2^-24 of weights <= 1. With a rounded row scale (rms = 2)
        // the logits differ by up to δ: Δw_i = w_i·(Δl_i − Σ_j w_j·Δl_j), within 2δ more.
        char what[160];
        snprintf(what, sizeof what, "%s (%s): weights", c->name, path);
        if (c->rms != 2) {
            g_compare(what, got_w, wts, (size_t)T * K, K, 1e-6, 0.0);
        } else {
            for (int t = 0; t < T; t++) {
                if (near_tie[t]) continue;
                snprintf(what, sizeof what, "%s (%s): weights of row %d", c->name, path, t);
                g_compare(what, got_w + (size_t)t * K, wts + (size_t)t * K, K, K,
                          1e-6 + 2 * delta[t], 0.0);
            }
        }
        if (c->rms) {
            // The GPU's s: exact (rms = 1: 0.5) or within 3·2^-24 of the double s (rms = 2),
            // checked at 1e-6 relative.
            g_download(got_rs, d_rs, sizeof(float) * T);
            snprintf(what, sizeof what, "%s (%s): row_scale", c->name, path);
            if (c->rms == 1) g_compare(what, got_rs, rs, T, T, 0.0, 0.0);
            else g_compare(what, got_rs, rs, T, T, 0.0, 1e-6);
        }
        if (!ws) {
            memcpy(first_w, got_w, sizeof(float) * T * K);
            memcpy(first_ids, got_ids, sizeof(int32_t) * T * K);
            memcpy(first_rs, got_rs, sizeof(float) * T);
        } else {
            snprintf(what, sizeof what, "%s: weights with vs without workspace", c->name);
            g_same_bytes(what, got_w, first_w, sizeof(float) * T * K, sizeof(float));
            // The same per-logit and selection operations (and THE ROW SCALE) on both paths.
            snprintf(what, sizeof what, "%s: ids with vs without workspace", c->name);
            g_same_bytes(what, got_ids, first_ids, sizeof(int32_t) * T * K, sizeof(int32_t));
            if (c->rms) {
                snprintf(what, sizeof what, "%s: row_scale with vs without workspace", c->name);
                g_same_bytes(what, got_rs, first_rs, sizeof(float) * T, sizeof(float));
            }
        }
    }
    if (n_near > T / 4) DS_FAILF("%s: %d of %d rows with near ties: too few compared", c->name,
                                 n_near, T);
    g_free(d_x0), g_free(d_rs);
    free(x0), free(rs), free(got_rs), free(first_rs), free(first_ids), free(delta), free(near_tie);
    g_free(d_x), g_free(d_w), g_free(d_b), g_free(d_ids), g_free(d_wts), g_free(d_ws);
    free(x), free(w), free(b), free(ids), free(got_ids), free(wts), free(got_w), free(first_w);
}

static void router_matches_reference(void) {
    static const struct rt_case cases[] = {
        {"1 row, tiny E=8 k=2, f32", 1, 64, 8, 2, DS_ELEM_F32, DS_ELEM_F32, DS_ELEM_F32, 1, 0, 0},
        {"5 rows, E=16 k=4, bf16", 5, 64, 16, 4, DS_ELEM_BF16, DS_ELEM_BF16, DS_ELEM_BF16, 1, 0,
         0},
        {"C=40 (partial step), no bias", 6, 40, 8, 3, DS_ELEM_F32, DS_ELEM_BF16, DS_ELEM_F32, 0, 0,
         0},
        {"20b: C=2880 E=32 k=4, 37 rows", 37, 2880, 32, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 0},
        {"120b: C=2880 E=128 k=4, 9 rows", 9, 2880, 128, 4, DS_ELEM_F32, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 0},
        {"E=200 (two experts per cluster warp) k=8", 7, 64, 200, 8, DS_ELEM_BF16, DS_ELEM_F32,
         DS_ELEM_F32, 1, 0, 0},
        {"E=1024 (the maximum: 8 experts per cluster warp) k=4", 5, 64, 1024, 4, DS_ELEM_F32,
         DS_ELEM_BF16, DS_ELEM_BF16, 1, 0, 0},
        {"exact ties everywhere, k=4", 11, 64, 16, 4, DS_ELEM_F32, DS_ELEM_F32, DS_ELEM_F32, 1, 1,
         0},
        {"exact ties, k = E", 3, 32, 6, 6, DS_ELEM_BF16, DS_ELEM_BF16, DS_ELEM_BF16, 1, 1, 0},
        // Odd E: the last workspace block holds one expert and one idle half.
        {"odd E=45 k=5, 1 row", 1, 96, 45, 5, DS_ELEM_BF16, DS_ELEM_BF16, DS_ELEM_F32, 1, 0,
         0},
        {"odd E=45 k=5, 6 rows (two row tiles)", 6, 96, 45, 5, DS_ELEM_F32, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 0},
        // C > 4096: two rounds of loads in both paths (5 groups for some virtual lanes).
        {"C=4608 (two load rounds)", 2, 4608, 16, 4, DS_ELEM_BF16, DS_ELEM_BF16, DS_ELEM_BF16, 1,
         0, 0},
        // Deferred norm (rms_of, row_scale): exact s first, then rounded s; T <= 8 takes the
        // many-block path in the workspace pass, T > 8 the cluster path in both; C = 4096 is the
        // workspace path's largest rms_of row, C = 4608 runs the cluster path in both passes.
        {"rms_of exact s: 1 row, E=32 k=4, bf16", 1, 64, 32, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 1},
        {"rms_of exact s: 120b C=2880 E=128 k=4, 9 rows, f32", 9, 2880, 128, 4, DS_ELEM_F32,
         DS_ELEM_BF16, DS_ELEM_BF16, 1, 0, 1},
        {"rms_of exact s: exact ties everywhere, k=4", 11, 64, 16, 4, DS_ELEM_F32, DS_ELEM_F32,
         DS_ELEM_F32, 1, 1, 1},
        {"rms_of: 5 rows, E=16 k=4, bf16", 5, 64, 16, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 2},
        {"rms_of: 20b C=2880 E=32 k=4, 1 row", 1, 2880, 32, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 2},
        {"rms_of: 20b C=2880 E=32 k=4, 8 rows", 8, 2880, 32, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 2},
        {"rms_of: 120b C=2880 E=128 k=4, 1 row", 1, 2880, 128, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 2},
        {"rms_of: 120b C=2880 E=128 k=4, 4 rows", 4, 2880, 128, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 2},
        {"rms_of: 120b C=2880 E=128 k=4, 37 rows", 37, 2880, 128, 4, DS_ELEM_BF16, DS_ELEM_BF16,
         DS_ELEM_BF16, 1, 0, 2},
        {"rms_of: odd E=45 k=5, 6 rows, f32, no bias", 6, 96, 45, 5, DS_ELEM_F32, DS_ELEM_BF16,
         DS_ELEM_BF16, 0, 0, 2},
        {"rms_of: C=4096, 3 rows", 3, 4096, 16, 4, DS_ELEM_BF16, DS_ELEM_BF16, DS_ELEM_BF16, 1, 0,
         2},
        {"rms_of: C=4608, 2 rows", 2, 4608, 16, 4, DS_ELEM_BF16, DS_ELEM_BF16, DS_ELEM_BF16, 1, 0,
         2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) router_case(&cases[i], 100 + i);
}

// Timing (printed, not asserted): the 120b router at T = 1, 4 (one row per cluster) and 256 (4-row
// tiles); a 128 × 2880 bf16 matrix is 737 KB: a few µs at the H200's bandwidth.
static void router_timing(void) {
    enum { C = 2880, E = 128, K = 4 };
    static const int rows[] = {1, 4, 256, 1, 4};
    for (int ri = 0; ri < 5; ri++) {
        const int T = rows[ri], use_ws = ri >= 3; // the last two: the many-block workspace path
        struct ds_router_args a = {.act = DS_ELEM_BF16, .w_dtype = DS_ELEM_BF16,
                                   .bias_dtype = DS_ELEM_BF16, .n_rows = T, .dim = C,
                                   .n_experts = E, .top_k = K, .x = g_alloc(2 * (size_t)T * C),
                                   .w = g_alloc(2 * (size_t)E * C), .bias = g_alloc(2 * E),
                                   .expert_ids = g_alloc(sizeof(int32_t) * T * K),
                                   .expert_weights = g_alloc(sizeof(float) * T * K)};
        EXPECT_OK(ds_cuda_fill_uniform((void *)a.x, DS_ELEM_BF16, (size_t)T * C, 1, -1, 1, NULL));
        EXPECT_OK(ds_cuda_fill_uniform((void *)a.w, DS_ELEM_BF16, (size_t)E * C, 2, -0.1f, 0.1f,
                                       NULL));
        EXPECT_OK(ds_cuda_fill_uniform((void *)a.bias, DS_ELEM_BF16, E, 3, -0.1f, 0.1f, NULL));
        if (use_ws) {
            a.workspace_bytes = ds_router_workspace_bytes(T, E);
            a.workspace = g_alloc(a.workspace_bytes);
        }
        EXPECT_OK(ds_router_cuda(&a, NULL));
        cudaEvent_t e0, e1;
        G_CHECK(cudaEventCreate(&e0));
        G_CHECK(cudaEventCreate(&e1));
        G_CHECK(cudaEventRecord(e0, NULL));
        for (int it = 0; it < 20; it++) ds_router_cuda(&a, NULL);
        G_CHECK(cudaEventRecord(e1, NULL));
        G_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        G_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1000.0 / 20;
        printf("  router T=%d E=%d C=%d bf16%s: %.1f us/call, %.0f GB/s of router weights\n", T, E,
               C, use_ws ? " (workspace)" : "", us, 2.0 * E * C / (us * 1e3));
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        g_free((void *)a.x), g_free((void *)a.w), g_free((void *)a.bias);
        g_free(a.expert_ids), g_free(a.expert_weights);
        if (a.workspace) g_free(a.workspace);
    }
}

// Rows alone, then in batches of 8, 32 and 64 whose members come in another order (so each row
// has other neighbours and another position in its 4-row tile): ids and weights bitwise equal.
// rms = 1: with a deferred norm (rms_of rows permuted with x), the row_scale bits too.
static void router_batch_invariance(int rms) {
    enum { T = 64, C = 2880, E = 128, K = 4 };
    float *x = t_alloc(sizeof(float) * T * C), *w = t_alloc(sizeof(float) * E * C);
    float *b = t_alloc(sizeof(float) * E), *x0 = t_alloc(sizeof(float) * T * C);
    g_fill_cont(x, (size_t)T * C, 7, -3.0f, 3.0f); // continuous values: rounding does happen
    g_fill_cont(w, (size_t)E * C, 8, -0.05f, 0.05f);
    g_fill_cont(b, (size_t)E, 9, -1.0f, 1.0f);
    g_fill_cont(x0, (size_t)T * C, 10, -3.0f, 3.0f);
    for (int ai = 0; ai < 2; ai++) {
        const enum ds_elem act = ai ? DS_ELEM_BF16 : DS_ELEM_F32;
        const size_t es = act == DS_ELEM_BF16 ? 2 : 4;
        void *d_x = g_upload_as(x, (size_t)T * C, act), *d_w = g_upload_as(w, (size_t)E * C, DS_ELEM_BF16);
        void *d_b = g_upload_as(b, E, DS_ELEM_BF16);
        void *d_xp = g_alloc(es * T * C);
        void *d_x0 = g_upload_as(x0, (size_t)T * C, act), *d_x0p = g_alloc(es * T * C);
        float *d_rs = g_alloc(sizeof(float) * T);
        int32_t *d_ids = g_alloc(sizeof(int32_t) * T * K);
        float *d_wts = g_alloc(sizeof(float) * T * K);
        int32_t alone_ids[T * K], ids[T * K];
        float alone_w[T * K], wts[T * K], alone_rs[T], rs[T];
        // Every call gets a workspace: a row alone and the batch of 8 run the many-block path,
        // the batches of 32 and 64 the cluster path (4-row tiles). Alone, the cluster path (no
        // workspace) must give the same bits too.
        const size_t ws_bytes = ds_router_workspace_bytes(T, E);
        void *d_ws = g_alloc(ws_bytes);
        struct ds_router_args a = {.act = act, .w_dtype = DS_ELEM_BF16, .bias_dtype = DS_ELEM_BF16,
                                   .n_rows = 1, .dim = C, .n_experts = E, .top_k = K, .w = d_w,
                                   .bias = d_b, .expert_ids = d_ids, .expert_weights = d_wts,
                                   .workspace = d_ws, .workspace_bytes = ws_bytes,
                                   .rms_eps = 1e-5f, .row_scale = rms ? d_rs : NULL};
        for (int t = 0; t < T; t++) {
            int32_t cl_ids[K];
            float cl_w[K], cl_rs = 0;
            a.x = (const char *)d_x + es * t * C;
            a.rms_of = rms ? (const char *)d_x0 + es * t * C : NULL;
            a.workspace = NULL, a.workspace_bytes = 0;
            EXPECT_OK(ds_router_cuda(&a, NULL));
            g_download(cl_ids, d_ids, sizeof(int32_t) * K);
            g_download(cl_w, d_wts, sizeof(float) * K);
            if (rms) g_download(&cl_rs, d_rs, sizeof(float));
            a.workspace = d_ws, a.workspace_bytes = ws_bytes;
            EXPECT_OK(ds_router_cuda(&a, NULL));
            g_download(alone_ids + t * K, d_ids, sizeof(int32_t) * K);
            g_download(alone_w + t * K, d_wts, sizeof(float) * K);
            if (rms) {
                g_download(alone_rs + t, d_rs, sizeof(float));
                if (!t_same_bits(&cl_rs, alone_rs + t, 1))
                    DS_FAILF("router %s: row %d alone: row_scale %.9g (cluster path) != %.9g "
                             "(workspace path)", dt_name(act), t, (double)cl_rs,
                             (double)alone_rs[t]);
            }
            if (memcmp(cl_ids, alone_ids + t * K, sizeof cl_ids) ||
                memcmp(cl_w, alone_w + t * K, sizeof cl_w)) {
                DS_FAILF("router %s: row %d alone: cluster path (ids %d %d %d %d, w0 %.9g) != "
                         "workspace path (ids %d %d %d %d, w0 %.9g)",
                         dt_name(act), t, (int)cl_ids[0], (int)cl_ids[1], (int)cl_ids[2],
                         (int)cl_ids[3], (double)cl_w[0], (int)alone_ids[t * K],
                         (int)alone_ids[t * K + 1], (int)alone_ids[t * K + 2],
                         (int)alone_ids[t * K + 3], (double)alone_w[t * K]);
                break;
            }
        }
        static const int sizes[] = {4, 8, 32, 64};
        for (int si = 0; si < 4; si++) {
            const int n = sizes[si];
            for (int start = 0; start < T; start += n) {
                // Batch members: rows start..start+n-1, reversed and rotated by 3.
                int rows[T];
                for (int i = 0; i < n; i++) rows[i] = start + (n - 1 - (i + 3) % n);
                for (int i = 0; i < n; i++) {
                    G_CHECK(cudaMemcpy((char *)d_xp + es * i * C, (const char *)d_x + es * rows[i] * C,
                                       es * C, cudaMemcpyDeviceToDevice));
                    G_CHECK(cudaMemcpy((char *)d_x0p + es * i * C,
                                       (const char *)d_x0 + es * rows[i] * C, es * C,
                                       cudaMemcpyDeviceToDevice));
                }
                a.n_rows = n, a.x = d_xp, a.rms_of = rms ? d_x0p : NULL;
                EXPECT_OK(ds_router_cuda(&a, NULL));
                g_download(ids, d_ids, sizeof(int32_t) * n * K);
                g_download(wts, d_wts, sizeof(float) * n * K);
                if (rms) g_download(rs, d_rs, sizeof(float) * n);
                for (int i = 0; i < n; i++) {
                    const int t = rows[i];
                    if (memcmp(ids + i * K, alone_ids + t * K, sizeof(int32_t) * K) ||
                        memcmp(wts + i * K, alone_w + t * K, sizeof(float) * K) ||
                        (rms && !t_same_bits(rs + i, alone_rs + t, 1))) {
                        DS_FAILF("router %s: row %d differs alone vs at %d in a batch of %d",
                                 dt_name(act), t, i, n);
                        break;
                    }
                }
            }
        }
        g_free(d_x), g_free(d_w), g_free(d_b), g_free(d_xp), g_free(d_ids), g_free(d_wts);
        g_free(d_ws), g_free(d_x0), g_free(d_x0p), g_free(d_rs);
    }
    free(x), free(w), free(b), free(x0);
}

static void router_is_batch_invariant(void) {
    router_batch_invariance(0);
}

static void router_deferred_norm_is_batch_invariant(void) {
    router_batch_invariance(1);
}

// ---------------------------------------------------------------------------------------------
// Experts

struct moe_prob {
    int T, C, I, E, K;
    uint8_t *gu_b, *gu_s, *dn_b, *dn_s;
    float *gu_bias, *dn_bias, *x, *res, *wts;
    int32_t *ids;
};

// Weights fully random (codes and scales 2^-6..2^-2, so u sits around the clamp limit and every
// SwiGLU branch runs), K distinct experts per row: (first + 3k) mod E.
static struct moe_prob moe_random(int T, int C, int I, int E, int K, uint64_t seed) {
    struct moe_prob p = {.T = T, .C = C, .I = I, .E = E, .K = K};
    const size_t gu_rows = (size_t)E * 2 * I, dn_rows = (size_t)E * C;
    p.gu_b = t_alloc(gu_rows * C / 2), p.gu_s = t_alloc(gu_rows * C / 32);
    p.dn_b = t_alloc(dn_rows * I / 2), p.dn_s = t_alloc(dn_rows * I / 32);
    p.gu_bias = t_alloc(sizeof(float) * gu_rows), p.dn_bias = t_alloc(sizeof(float) * dn_rows);
    p.x = t_alloc(sizeof(float) * T * C), p.res = t_alloc(sizeof(float) * T * C);
    p.wts = t_alloc(sizeof(float) * T * K), p.ids = t_alloc(sizeof(int32_t) * T * K);
    uint64_t s = seed;
    for (size_t i = 0; i < gu_rows * C / 2; i += 8) {
        uint64_t r = t_next(&s);
        memcpy(p.gu_b + i, &r, 8);
    }
    for (size_t i = 0; i < dn_rows * I / 2; i += 8) {
        uint64_t r = t_next(&s);
        memcpy(p.dn_b + i, &r, 8);
    }
    for (size_t i = 0; i < gu_rows * C / 32; i++) p.gu_s[i] = (uint8_t)t_int(&s, 121, 125);
    for (size_t i = 0; i < dn_rows * I / 32; i++) p.dn_s[i] = (uint8_t)t_int(&s, 121, 125);
    t_fill(p.gu_bias, gu_rows, seed + 1, 4.0f);
    t_fill(p.dn_bias, dn_rows, seed + 2, 1.0f);
    t_fill(p.x, (size_t)T * C, seed + 3, 2.0f);
    t_fill(p.res, (size_t)T * C, seed + 4, 1.0f);
    for (int t = 0; t < T; t++) {
        const int first = t_int(&s, 0, E - 1);
        double sum = 0;
        for (int k = 0; k < K; k++) {
            p.ids[t * K + k] = (first + 3 * k) % E;
            p.wts[t * K + k] = (float)t_int(&s, 1, 9);
            sum += p.wts[t * K + k];
        }
        for (int k = 0; k < K; k++) p.wts[t * K + k] = (float)(p.wts[t * K + k] / sum);
    }
    return p;
}

static void moe_free(struct moe_prob *p) {
    free(p->gu_b), free(p->gu_s), free(p->dn_b), free(p->dn_s), free(p->gu_bias),
        free(p->dn_bias), free(p->x), free(p->res), free(p->wts), free(p->ids);
}

// Device copies of a problem's weights (shared by every run of the problem).
struct moe_dev {
    uint8_t *gu_b, *gu_s, *dn_b, *dn_s;
    void *gu_bias, *dn_bias;
    void *ws;
    size_t ws_bytes;
};

static struct moe_dev moe_upload(const struct moe_prob *p, enum ds_elem bias_dt, int max_rows) {
    struct moe_dev d;
    const size_t gu_rows = (size_t)p->E * 2 * p->I, dn_rows = (size_t)p->E * p->C;
    d.gu_b = g_upload(p->gu_b, gu_rows * p->C / 2), d.gu_s = g_upload(p->gu_s, gu_rows * p->C / 32);
    d.dn_b = g_upload(p->dn_b, dn_rows * p->I / 2), d.dn_s = g_upload(p->dn_s, dn_rows * p->I / 32);
    d.gu_bias = g_upload_as(p->gu_bias, gu_rows, bias_dt);
    d.dn_bias = g_upload_as(p->dn_bias, dn_rows, bias_dt);
    d.ws_bytes = ds_moe_workspace_bytes_v2(max_rows, p->C, p->I, p->E, p->K);
    d.ws = g_alloc(d.ws_bytes);
    return d;
}

static void moe_dev_free(struct moe_dev *d) {
    g_free(d->gu_b), g_free(d->gu_s), g_free(d->dn_b), g_free(d->dn_s), g_free(d->gu_bias),
        g_free(d->dn_bias), g_free(d->ws);
}

static struct ds_moe_args moe_dev_args(const struct moe_prob *p, const struct moe_dev *d,
                                       enum ds_elem act, enum ds_elem bias_dt, int T,
                                       const void *x, const int32_t *ids, const float *wts,
                                       const void *res, void *out) {
    return (struct ds_moe_args){
        .act = act, .bias_dtype = bias_dt, .n_rows = T, .dim = p->C, .inter = p->I,
        .n_experts = p->E, .top_k = p->K, .swiglu_alpha = 1.702f, .swiglu_limit = 7.0f, .x = x,
        .expert_ids = ids, .expert_weights = wts, .gate_up_blocks = d->gu_b,
        .gate_up_scales = d->gu_s, .gate_up_bias = d->gu_bias, .down_blocks = d->dn_b,
        .down_scales = d->dn_s, .down_bias = d->dn_bias, .residual = res, .out = out,
        .workspace = d->ws, .workspace_bytes = d->ws_bytes};
}

// The reference output of a problem (f32, double inside). With a deferred norm: the row scales
// rs (or NULL) and the gain g (f32, or NULL) whose g ⊙ out goes to nout.
static float *moe_reference_ext(const struct moe_prob *p, const float *rs, const float *g,
                                float *nout) {
    float *out = t_alloc(sizeof(float) * p->T * p->C);
    void *ws = t_alloc(ds_moe_workspace_bytes(p->T, p->I, p->K));
    struct ds_moe_args r = {
        .act = DS_ELEM_F32, .bias_dtype = DS_ELEM_F32, .n_rows = p->T, .dim = p->C,
        .inter = p->I, .n_experts = p->E, .top_k = p->K, .swiglu_alpha = 1.702f,
        .swiglu_limit = 7.0f, .x = p->x, .expert_ids = p->ids, .expert_weights = p->wts,
        .gate_up_blocks = p->gu_b, .gate_up_scales = p->gu_s, .gate_up_bias = p->gu_bias,
        .down_blocks = p->dn_b, .down_scales = p->dn_s, .down_bias = p->dn_bias,
        .residual = p->res, .out = out, .workspace = ws,
        .workspace_bytes = ds_moe_workspace_bytes(p->T, p->I, p->K), .row_scale = rs,
        .norm_gain = g, .norm_gain_dtype = DS_ELEM_F32, .norm_out = nout};
    EXPECT_OK(ds_moe_ref(&r));
    free(ws);
    return out;
}

static float *moe_reference(const struct moe_prob *p) {
    return moe_reference_ext(p, NULL, NULL, NULL);
}

// Per-row tolerance: |got − want| <= rtol·|want| + atol_rms·rms(want row). f32: the dots run over
// C (or I) fp32 terms whose relative rounding error is a few 2^-24 of the row's magnitude; 5e-5
// of the row RMS leaves a margin of >10× over that. bf16: the output is rounded once to bf16
// (2^-9 relative), checked with rtol 2^-8.
static size_t moe_compare(const char *what, const float *got, const float *want, int T, int C,
                          double rtol, double atol_rms) {
    size_t bad = 0;
    for (int t = 0; t < T && !bad; t++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)want[(size_t)t * C + c] * want[(size_t)t * C + c];
        const double atol = atol_rms * sqrt(ss / C);
        char row_what[160];
        snprintf(row_what, sizeof row_what, "%s row %d", what, t);
        bad += g_compare(row_what, got + (size_t)t * C, want + (size_t)t * C, C, C, atol, rtol);
    }
    return bad;
}

// hot: every row's first slot picks expert 0 (the others stay spread), so one expert holds T
// pairs while the average over the experts in use stays small.
static void moe_case_routed(const char *name, int T, int C, int I, int E, int K, uint64_t seed,
                            int timed, int hot) {
    if (C >= 2880 && g_small_skip(name)) return; // real shapes: the normal run covers them
    struct moe_prob p = moe_random(T, C, I, E, K, seed);
    if (hot)
        for (int t = 0; t < T; t++) {
            const int first = p.ids[t * K]; // moe_random's slots: (first + 3k) % E
            for (int k = 0; k < K; k++) // 0, then distinct experts in [1, E) (E - 1 > 3(K - 1))
                p.ids[t * K + k] = k ? 1 + (first + 3 * k) % (E - 1) : 0;
        }
    float *want = moe_reference(&p);
    int32_t *d_ids = g_upload(p.ids, sizeof(int32_t) * T * K);
    float *d_wts = g_upload(p.wts, sizeof(float) * T * K);
    for (int ai = 0; ai < 2; ai++) {
        const enum ds_elem act = ai ? DS_ELEM_BF16 : DS_ELEM_F32, bdt = ai ? DS_ELEM_BF16 : DS_ELEM_F32;
        struct moe_dev d = moe_upload(&p, bdt, T);
        void *d_x = g_upload_as(p.x, (size_t)T * C, act), *d_res = g_upload_as(p.res, (size_t)T * C, act);
        void *d_out = g_alloc(sizeof(float) * T * C);
        struct ds_moe_args a = moe_dev_args(&p, &d, act, bdt, T, d_x, d_ids, d_wts, d_res, d_out);
        EXPECT_OK(ds_moe_cuda(&a, NULL));
        sync_ok(name);
        float *got = g_download_f(d_out, (size_t)T * C, act);
        char what[160];
        snprintf(what, sizeof what, "moe %s act %s", name, dt_name(act));
        if (act == DS_ELEM_F32) moe_compare(what, got, want, T, C, 1e-5, 5e-5);
        else moe_compare(what, got, want, T, C, 0x1p-8, 5e-5);
        // In place over the residual: the same bits.
        a.out = d_res;
        EXPECT_OK(ds_moe_cuda(&a, NULL));
        float *again = g_download_f(d_res, (size_t)T * C, act);
        EXPECT(t_same_bits(again, got, (size_t)T * C));
        if (timed && act == DS_ELEM_BF16) {
            // Distinct experts touched: each streams 2I·C/2 + C·I/2 code bytes plus scales.
            int used[1024] = {0}, n_used = 0;
            for (int i = 0; i < T * K; i++) n_used += !used[p.ids[i]]++;
            const double bytes = (double)n_used * ((double)3 * I * C / 2 + (double)3 * I * C / 32);
            cudaEvent_t e0, e1;
            G_CHECK(cudaEventCreate(&e0));
            G_CHECK(cudaEventCreate(&e1));
            a.out = d_out;
            G_CHECK(cudaEventRecord(e0, NULL));
            for (int it = 0; it < 20; it++) ds_moe_cuda(&a, NULL);
            G_CHECK(cudaEventRecord(e1, NULL));
            G_CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            G_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = ms * 1000.0 / 20;
            printf("  moe %s bf16: %.1f us/call, %d experts, %.0f GB/s of expert weights "
                   "(H200 copy ~4300 GB/s; weights may sit in L2 across iterations)\n",
                   name, us, n_used, bytes / (us * 1e3));
            cudaEventDestroy(e0), cudaEventDestroy(e1);
        }
        free(got), free(again);
        g_free(d_x), g_free(d_res), g_free(d_out);
        moe_dev_free(&d);
    }
    g_free(d_ids), g_free(d_wts);
    free(want);
    moe_free(&p);
}

static void moe_case(const char *name, int T, int C, int I, int E, int K, uint64_t seed,
                     int timed) {
    moe_case_routed(name, T, C, I, E, K, seed, timed, 0);
}

// The GEMV kernels come in three variants: one row (token tiles of 1), tiles of 2 and 1, and the
// wide one (8, 4, 2, 1) when T·k >= 3·E; up to T·k = 32 pairs the blocks group the pairs
// themselves, above a grouping kernel does. The names say which runs.
static void moe_matches_reference_over_a_shape_matrix(void) {
    moe_case("T=1 C=32 I=32 E=1 k=1 (1-token variant, self-grouped)", 1, 32, 32, 1, 1, 1, 0);
    moe_case("T=3 C=64 I=96 E=5 k=2 (tiles 2+1, self-grouped)", 3, 64, 96, 5, 2, 2, 0);
    moe_case("T=6 C=96 I=64 E=7 k=4 (wide variant, self-grouped)", 6, 96, 64, 7, 4, 3, 0);
    moe_case("T=8 C=64 I=64 E=4 k=4 (32 pairs: the largest self-grouped call, wide)", 8, 64, 64,
             4, 4, 11, 0);
    moe_case("T=9 C=64 I=64 E=40 k=4 (36 pairs: grouping kernel, tiles 2+1)", 9, 64, 64, 40, 4,
             12, 0);
    moe_case("T=15 E=4 k=4 (wide: tiles 8+4+2+1, grouping kernel)", 15, 64, 64, 4, 4, 4, 0);
    moe_case("T=150 E=2 k=2 (150 tokens per expert: 3 chunks of 64 (f32), groups of 32 (bf16))",
             150, 32, 32, 2, 2, 5, 0);
    moe_case("T=300 E=2 k=2 (300 tokens per expert: bf16 chunks of 256 and 44)", 300, 32, 32, 2, 2,
             15, 0);
    // 600 pairs over 512 experts (2 per expert in use: the bf16 work items), expert 0 holding
    // all 300 rows' first slot: its items of chunks 0 and 1, every other expert's empty chunk 1.
    moe_case_routed("T=300 E=512 k=2, expert 0 hot (work items over two chunks)", 300, 32, 32, 512,
                    2, 16, 0, 1);
    // One token with more row tiles than the one-block-per-SM kernels take (2·I/16 · k = 4096
    // tiles > 16 warps × SMs up to 256): the grouped gate_up and the fused down + combine run.
    moe_case("T=1 C=64 I=8192 E=4 k=4 (one token, fallback kernels)", 1, 64, 8192, 4, 4, 14, 0);
    moe_case("20b T=1 C=I=2880 E=32 k=4", 1, 2880, 2880, 32, 4, 8, 1);
    moe_case("20b T=4 C=I=2880 E=32 k=4", 4, 2880, 2880, 32, 4, 6, 1);
    moe_case("120b T=1 C=I=2880 E=128 k=4", 1, 2880, 2880, 128, 4, 9, 1);
    moe_case("120b T=4 C=I=2880 E=128 k=4 (a K = 3 verify)", 4, 2880, 2880, 128, 4, 13, 1);
    moe_case("120b T=8 C=I=2880 E=128 k=4", 8, 2880, 2880, 128, 4, 7, 1);
    moe_case("20b T=64 C=I=2880 E=32 k=4 (wide: ~8 tokens per expert)", 64, 2880, 2880, 32, 4, 10,
             1);
}

// Rows `rows` of problem p run as one call of ds_moe_cuda; returns the out rows as bytes. With a
// deferred norm: row scales rs (of all of p's rows, or NULL) and a device bf16 gain d_gain (or
// NULL) whose norm_out rows go to nout_host.
static void moe_rows_run_ext(const struct moe_prob *p, const struct moe_dev *d, enum ds_elem act,
                             const int *rows, int n, const float *rs, const void *d_gain,
                             void *out_host, void *nout_host) {
    const size_t es = act == DS_ELEM_BF16 ? 2 : 4, C = (size_t)p->C, K = (size_t)p->K;
    float *x = t_alloc(sizeof(float) * n * C), *res = t_alloc(sizeof(float) * n * C);
    float *wts = t_alloc(sizeof(float) * n * K);
    int32_t *ids = t_alloc(sizeof(int32_t) * n * K);
    for (int i = 0; i < n; i++) {
        memcpy(x + i * C, p->x + rows[i] * C, sizeof(float) * C);
        memcpy(res + i * C, p->res + rows[i] * C, sizeof(float) * C);
        memcpy(wts + i * K, p->wts + rows[i] * K, sizeof(float) * K);
        memcpy(ids + i * K, p->ids + rows[i] * K, sizeof(int32_t) * K);
    }
    void *d_x = g_upload_as(x, n * C, act), *d_res = g_upload_as(res, n * C, act);
    int32_t *d_ids = g_upload(ids, sizeof(int32_t) * n * K);
    float *d_wts = g_upload(wts, sizeof(float) * n * K);
    void *d_out = g_alloc(es * n * C), *d_n = g_alloc(es * n * C);
    float *r = t_alloc(sizeof(float) * n), *d_r = NULL;
    if (rs) {
        for (int i = 0; i < n; i++) r[i] = rs[rows[i]];
        d_r = g_upload(r, sizeof(float) * n);
    }
    struct ds_moe_args a = moe_dev_args(p, d, act, act, n, d_x, d_ids, d_wts, d_res, d_out);
    a.row_scale = d_r, a.norm_gain = d_gain, a.norm_gain_dtype = DS_ELEM_BF16, a.norm_out = d_n;
    EXPECT_OK(ds_moe_cuda(&a, NULL));
    g_download(out_host, d_out, es * n * C);
    if (d_gain) g_download(nout_host, d_n, es * n * C);
    g_free(d_x), g_free(d_res), g_free(d_ids), g_free(d_wts), g_free(d_out), g_free(d_n);
    g_free(d_r);
    free(x), free(res), free(wts), free(ids), free(r);
}

static void moe_rows_run(const struct moe_prob *p, const struct moe_dev *d, enum ds_elem act,
                         const int *rows, int n, void *out_host) {
    moe_rows_run_ext(p, d, act, rows, n, NULL, NULL, out_host, NULL);
}

// Each row alone (every expert sees 1 token: the 1-token tile of the decode variant) and in
// batches of 4, 8, 32, 64 built from other rows in other orders (4 and 8: the few-token kernels
// of the small path, a verify's rows; 32 and 64: experts see up to ~32 tokens, 8-, 4-, 2-token
// tiles, mostly of the wide variant): same bits.
static void moe_batch_invariance_case(int C, int I, int E, uint64_t seed) {
    enum { T = 64, K = 4 };
    struct moe_prob p = moe_random(T, C, I, E, K, seed);
    for (int ai = 0; ai < 2; ai++) {
        const enum ds_elem act = ai ? DS_ELEM_BF16 : DS_ELEM_F32;
        const size_t es = act == DS_ELEM_BF16 ? 2 : 4, row = es * C;
        struct moe_dev d = moe_upload(&p, act, T);
        unsigned char *alone = t_alloc(row * T), *batch = t_alloc(row * T);
        for (int t = 0; t < T; t++) moe_rows_run(&p, &d, act, &t, 1, alone + row * t);
        static const int sizes[] = {8, 32, 64};
        for (int si = 0; si < 3; si++) {
            const int n = sizes[si];
            for (int start = 0; start < T; start += n) {
                int rows[T];
                // Members: a stride-5 walk through all rows (other neighbours than start..+n).
                for (int i = 0; i < n; i++) rows[i] = (start * 5 + i * 5 + i / 13) % T;
                moe_rows_run(&p, &d, act, rows, n, batch);
                for (int i = 0; i < n; i++)
                    if (memcmp(batch + row * i, alone + row * rows[i], row)) {
                        DS_FAILF("moe C=%d E=%d %s: row %d differs alone vs at %d in a batch of %d",
                                 C, E, dt_name(act), rows[i], i, n);
                        break;
                    }
            }
        }
        free(alone), free(batch);
        moe_dev_free(&d);
    }
    moe_free(&p);
}

static void moe_is_batch_invariant(void) {
    moe_batch_invariance_case(64, 96, 8, 31);      // tiny: ~32 tokens per expert in a batch of 64
    // 120b's expert count: in batches of 32 and 64 about 1 and 2 pairs per expert in use, where
    // the grouped kernels run as work items (MM_PERSIST_AVG); 20b's (below) runs the full grids.
    moe_batch_invariance_case(128, 64, 128, 33);
    if (!g_small_skip("moe batch invariance at the 20b shapes"))
        moe_batch_invariance_case(2880, 2880, 32, 32); // 20b shapes
}

// A device-side expert id outside [0, E) never faults: that slot adds nothing, other rows are
// bitwise unchanged. f32 (CUDA-core GEMV) and bf16 (tensor-core path) activations.
static void moe_skips_an_out_of_range_expert_as(enum ds_elem act) {
    enum { T = 5, C = 64, I = 64, E = 6, K = 2 };
    struct moe_prob p = moe_random(T, C, I, E, K, 41);
    struct moe_dev d = moe_upload(&p, act, T);
    int32_t *d_ids = g_upload(p.ids, sizeof(int32_t) * T * K);
    float *d_wts = g_upload(p.wts, sizeof(float) * T * K);
    void *d_x = g_upload_as(p.x, (size_t)T * C, act), *d_res = g_upload_as(p.res, (size_t)T * C, act);
    void *d_out = g_alloc(sizeof(float) * T * C);
    struct ds_moe_args a = moe_dev_args(&p, &d, act, act, T, d_x, d_ids, d_wts, d_res, d_out);
    EXPECT_OK(ds_moe_cuda(&a, NULL));
    sync_ok("out-of-range expert");
    float *good = g_download_f(d_out, (size_t)T * C, act);
    int32_t ids[T * K];
    memcpy(ids, p.ids, sizeof ids);
    ids[2 * K + 1] = E, ids[3 * K] = -7;
    G_CHECK(cudaMemcpy(d_ids, ids, sizeof ids, cudaMemcpyHostToDevice));
    EXPECT_OK(ds_moe_cuda(&a, NULL));
    sync_ok("out-of-range expert");
    float *bad = g_download_f(d_out, (size_t)T * C, act);
    EXPECT(t_same_bits(bad, good, 2 * C));
    EXPECT(t_same_bits(bad + 4 * C, good + 4 * C, C));
    for (int i = 2 * C; i < 4 * C; i++) EXPECT(isfinite(bad[i]));
    free(good), free(bad);
    g_free(d_ids), g_free(d_wts), g_free(d_x), g_free(d_res), g_free(d_out);
    moe_dev_free(&d);
    moe_free(&p);
}

static void moe_skips_an_out_of_range_expert(void) {
    moe_skips_an_out_of_range_expert_as(DS_ELEM_F32);
    moe_skips_an_out_of_range_expert_as(DS_ELEM_BF16);
}

// The one-token path (T = 1, k <= 4: down and combine fused in one kernel) with a repeated expert
// (one warp owns two slots) and then an out-of-range id. Expected values come from the CPU
// reference: the repeated expert is an ordinary input there; an invalid slot adds nothing, which
// is the reference run with that slot's weight set to 0 (fma(0, y, acc) == acc for finite y).
// Tolerances of moe_compare (reasons there) for each activation dtype.
static void moe_one_token_repeats_and_skips_as(enum ds_elem act) {
    enum { T = 1, C = 64, I = 96, E = 6, K = 4 };
    const double rtol = act == DS_ELEM_F32 ? 1e-5 : 0x1p-8;
    struct moe_prob p = moe_random(T, C, I, E, K, 43);
    p.ids[0] = 2, p.ids[1] = 5, p.ids[2] = 2, p.ids[3] = 0; // expert 2 in slots 0 and 2
    struct moe_dev d = moe_upload(&p, act, T);
    void *d_x = g_upload_as(p.x, C, act), *d_res = g_upload_as(p.res, C, act);
    void *d_out = g_alloc(sizeof(float) * C);
    int32_t *d_ids = g_upload(p.ids, sizeof(int32_t) * K);
    float *d_wts = g_upload(p.wts, sizeof(float) * K);
    struct ds_moe_args a = moe_dev_args(&p, &d, act, act, T, d_x, d_ids, d_wts, d_res, d_out);
    char what[120];
    float *want = moe_reference(&p);
    EXPECT_OK(ds_moe_cuda(&a, NULL));
    sync_ok("one token, repeated expert");
    float *got = g_download_f(d_out, C, act);
    snprintf(what, sizeof what, "moe 1 token %s, expert 2 in slots 0 and 2", dt_name(act));
    moe_compare(what, got, want, T, C, rtol, 5e-5);
    free(want), free(got);

    int32_t bad_ids[K] = {2, E, 2, 0}; // slot 1 out of range
    G_CHECK(cudaMemcpy(d_ids, bad_ids, sizeof bad_ids, cudaMemcpyHostToDevice));
    EXPECT_OK(ds_moe_cuda(&a, NULL));
    sync_ok("one token, out-of-range slot");
    got = g_download_f(d_out, C, act);
    p.wts[1] = 0.0f; // the reference: slot 1 (valid id 5) with weight 0
    want = moe_reference(&p);
    snprintf(what, sizeof what, "moe 1 token %s, slot 1 out of range", dt_name(act));
    moe_compare(what, got, want, T, C, rtol, 5e-5);
    free(want), free(got);
    g_free(d_x), g_free(d_res), g_free(d_out), g_free(d_ids), g_free(d_wts);
    moe_dev_free(&d);
    moe_free(&p);
}

static void moe_one_token_repeats_and_skips(void) {
    moe_one_token_repeats_and_skips_as(DS_ELEM_F32);
    moe_one_token_repeats_and_skips_as(DS_ELEM_BF16);
}

// ---------------------------------------------------------------------------------------------
// Deferred RMSNorm in the expert block (ds/kernel_args.h): row_scale (the router's s, multiplying
// the gate_up sums before their bias) and norm_gain / norm_out (g ⊙ the stored out).

// Against the reference over the GEMV variants (one token, its fallback, tiles 2 + 1, wide,
// the grouping kernel) and the real shapes. Row scales continuous in [0.5, 2] (both sides read
// the same floats), gain multiples of 1/32 (t_fill, exact in bf16). out: moe_compare's
// tolerances (reasons there); the GPU's one extra fp32 rounding of r·(W1·x) (2^-24 relative) is
// far inside them. norm_out: act(g ⊙ the GPU's own stored out), recomputed here, bitwise (a bf16
// gain times a bf16 out is exact in fp32; times an f32 out, one fp32 rounding, as here). Then in
// place over the residual: out and norm_out with the same bits.
static void moe_deferred_case(const char *name, int T, int C, int I, int E, int K,
                              uint64_t seed) {
    if (C >= 2880 && g_small_skip(name)) return; // real shapes: the normal run covers them
    struct moe_prob p = moe_random(T, C, I, E, K, seed);
    float *rs = t_alloc(sizeof(float) * T), *g = t_alloc(sizeof(float) * C);
    float *want_n = t_alloc(sizeof(float) * T * C);
    g_fill_cont(rs, T, seed + 10, 0.5f, 2.0f);
    t_fill(g, C, seed + 11, 2.0f);
    float *want = moe_reference_ext(&p, rs, g, want_n);
    float *plain = moe_reference(&p);
    EXPECT(!t_same_bits(plain, want, (size_t)T * C)); // the row scale is not a no-op
    free(plain);
    int32_t *d_ids = g_upload(p.ids, sizeof(int32_t) * T * K);
    float *d_wts = g_upload(p.wts, sizeof(float) * T * K), *d_rs = g_upload(rs, sizeof(float) * T);
    void *d_g = g_upload_as(g, C, DS_ELEM_BF16);
    for (int ai = 0; ai < 2; ai++) {
        const enum ds_elem act = ai ? DS_ELEM_BF16 : DS_ELEM_F32;
        struct moe_dev d = moe_upload(&p, act, T);
        void *d_x = g_upload_as(p.x, (size_t)T * C, act);
        void *d_res = g_upload_as(p.res, (size_t)T * C, act);
        void *d_out = g_alloc(sizeof(float) * T * C), *d_n = g_alloc(sizeof(float) * T * C);
        struct ds_moe_args a = moe_dev_args(&p, &d, act, act, T, d_x, d_ids, d_wts, d_res, d_out);
        a.row_scale = d_rs, a.norm_gain = d_g, a.norm_gain_dtype = DS_ELEM_BF16, a.norm_out = d_n;
        EXPECT_OK(ds_moe_cuda(&a, NULL));
        sync_ok(name);
        float *got = g_download_f(d_out, (size_t)T * C, act);
        float *gn = g_download_f(d_n, (size_t)T * C, act);
        char what[192];
        snprintf(what, sizeof what, "moe deferred norm %s act %s", name, dt_name(act));
        if (act == DS_ELEM_F32) moe_compare(what, got, want, T, C, 1e-5, 5e-5);
        else moe_compare(what, got, want, T, C, 0x1p-8, 5e-5);
        for (size_t i = 0; i < (size_t)T * C; i++) {
            float nw = g[i % C] * got[i];
            if (act == DS_ELEM_BF16) nw = ds_bf16_to_f32(ds_f32_to_bf16(nw));
            if (!t_same_bits(&gn[i], &nw, 1)) {
                DS_FAILF("%s: norm_out at row %zu col %zu = %.9g, g·out = %.9g", what, i / C,
                         i % C, (double)gn[i], (double)nw);
                break;
            }
        }
        a.out = d_res; // in place over the residual
        EXPECT_OK(ds_moe_cuda(&a, NULL));
        float *again = g_download_f(d_res, (size_t)T * C, act);
        float *again_n = g_download_f(d_n, (size_t)T * C, act);
        EXPECT(t_same_bits(again, got, (size_t)T * C) && t_same_bits(again_n, gn, (size_t)T * C));
        free(got), free(gn), free(again), free(again_n);
        g_free(d_x), g_free(d_res), g_free(d_out), g_free(d_n);
        moe_dev_free(&d);
    }
    g_free(d_ids), g_free(d_wts), g_free(d_rs), g_free(d_g);
    free(rs), free(g), free(want_n), free(want);
    moe_free(&p);
}

static void moe_deferred_norm_matches_reference(void) {
    moe_deferred_case("T=1 C=64 I=96 E=6 k=4 (one-token kernels)", 1, 64, 96, 6, 4, 51);
    moe_deferred_case("T=1 C=64 I=8192 E=4 k=4 (one token, fallback kernels)", 1, 64, 8192, 4, 4,
                      52);
    moe_deferred_case("T=3 C=64 I=96 E=5 k=2 (tiles 2+1, self-grouped)", 3, 64, 96, 5, 2, 53);
    moe_deferred_case("T=4 C=64 I=64 E=4 k=4 (wide, self-grouped)", 4, 64, 64, 4, 4, 54);
    moe_deferred_case("T=9 C=64 I=64 E=40 k=4 (grouping kernel)", 9, 64, 64, 40, 4, 55);
    moe_deferred_case("T=64 C=64 I=64 E=8 k=4 (wide, grouping kernel)", 64, 64, 64, 8, 4, 56);
    moe_deferred_case("20b T=1 C=I=2880 E=32 k=4", 1, 2880, 2880, 32, 4, 57);
    moe_deferred_case("20b T=4 C=I=2880 E=32 k=4", 4, 2880, 2880, 32, 4, 58);
    moe_deferred_case("120b T=1 C=I=2880 E=128 k=4", 1, 2880, 2880, 128, 4, 59);
    moe_deferred_case("120b T=4 C=I=2880 E=128 k=4", 4, 2880, 2880, 128, 4, 60);
    moe_deferred_case("20b T=64 C=I=2880 E=32 k=4", 64, 2880, 2880, 32, 4, 61);
}

// As moe_batch_invariance_case, with row scales and norm_out: each row alone and in batches of
// 8, 32, 64 of other rows in other orders, out and norm_out with the same bits.
static void moe_deferred_batch_invariance_case(int C, int I, int E, uint64_t seed) {
    enum { T = 64, K = 4 };
    struct moe_prob p = moe_random(T, C, I, E, K, seed);
    float rs[T], *g = t_alloc(sizeof(float) * C);
    g_fill_cont(rs, T, seed + 10, 0.5f, 2.0f);
    t_fill(g, C, seed + 11, 2.0f);
    void *d_g = g_upload_as(g, C, DS_ELEM_BF16);
    for (int ai = 0; ai < 2; ai++) {
        const enum ds_elem act = ai ? DS_ELEM_BF16 : DS_ELEM_F32;
        const size_t es = act == DS_ELEM_BF16 ? 2 : 4, row = es * C;
        struct moe_dev d = moe_upload(&p, act, T);
        unsigned char *alone = t_alloc(row * T), *alone_n = t_alloc(row * T);
        unsigned char *batch = t_alloc(row * T), *batch_n = t_alloc(row * T);
        for (int t = 0; t < T; t++)
            moe_rows_run_ext(&p, &d, act, &t, 1, rs, d_g, alone + row * t, alone_n + row * t);
        static const int sizes[] = {8, 32, 64};
        for (int si = 0; si < 3; si++) {
            const int n = sizes[si];
            for (int start = 0; start < T; start += n) {
                int rows[T];
                for (int i = 0; i < n; i++) rows[i] = (start * 5 + i * 5 + i / 13) % T;
                moe_rows_run_ext(&p, &d, act, rows, n, rs, d_g, batch, batch_n);
                for (int i = 0; i < n; i++)
                    if (memcmp(batch + row * i, alone + row * rows[i], row) ||
                        memcmp(batch_n + row * i, alone_n + row * rows[i], row)) {
                        DS_FAILF("moe deferred norm C=%d E=%d %s: row %d (out or norm_out) "
                                 "differs alone vs at %d in a batch of %d",
                                 C, E, dt_name(act), rows[i], i, n);
                        break;
                    }
            }
        }
        free(alone), free(alone_n), free(batch), free(batch_n);
        moe_dev_free(&d);
    }
    g_free(d_g);
    free(g);
    moe_free(&p);
}

static void moe_deferred_norm_is_batch_invariant(void) {
    moe_deferred_batch_invariance_case(64, 96, 8, 33);
    if (!g_small_skip("moe deferred-norm batch invariance at the 20b shapes"))
        moe_deferred_batch_invariance_case(2880, 2880, 32, 34);
}

// ---------------------------------------------------------------------------------------------
// Host-side argument checks (no device memory is touched: these run on any machine)

static void router_and_moe_reject_bad_arguments(void) {
    static float dummy[64] __attribute__((aligned(16)));
    int32_t ids[4];
    struct ds_router_args r = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_BF16,
                               .bias_dtype = DS_ELEM_BF16, .n_rows = 1, .dim = 64, .n_experts = 4,
                               .top_k = 5, .x = dummy, .w = dummy, .expert_ids = ids,
                               .expert_weights = dummy};
    EXPECT_STATUS(ds_router_cuda(&r, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("top_k 5 outside");
    r.top_k = 2, r.dim = 12;
    EXPECT_STATUS(ds_router_cuda(&r, NULL), DS_ERR_UNSUPPORTED);
    EXPECT_ERROR_HAS("dim 12");
    r.dim = 64, r.act = DS_ELEM_COUNT;
    EXPECT_STATUS(ds_router_cuda(&r, NULL), DS_ERR_UNSUPPORTED);
    r.act = DS_ELEM_F32, r.x = NULL;
    EXPECT_STATUS(ds_router_cuda(&r, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("x buffer is NULL");

    struct ds_moe_args m = {.act = DS_ELEM_BF16, .bias_dtype = DS_ELEM_BF16, .n_rows = 2,
                            .dim = 64, .inter = 64, .n_experts = 4, .top_k = 2,
                            .swiglu_alpha = 1.702f, .swiglu_limit = 7.0f, .x = dummy,
                            .expert_ids = ids, .expert_weights = dummy,
                            .gate_up_blocks = (const uint8_t *)dummy,
                            .gate_up_scales = (const uint8_t *)dummy, .gate_up_bias = dummy,
                            .down_blocks = (const uint8_t *)dummy,
                            .down_scales = (const uint8_t *)dummy, .down_bias = dummy,
                            .out = dummy + 16, .workspace = dummy, .workspace_bytes = 16};
    EXPECT_STATUS(ds_moe_cuda(&m, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("workspace of 16 bytes");
    EXPECT(ds_moe_cuda_workspace_bytes(2, 64, 64, 4, 2) > ds_moe_workspace_bytes(2, 64, 2));
    // v2 covers both backends: here the CUDA plan, h (2·2·64 f32 = 1 KB), y (1 KB), the grouping
    // (2·4 + 2 int32) and the pairs (4 int32), each rounded up to 256 bytes: 2560 bytes.
    EXPECT(ds_moe_workspace_bytes_v2(2, 64, 64, 4, 2) == 2560);
    EXPECT(ds_moe_workspace_bytes_v2(2, 64, 64, 4, 2) >= ds_moe_workspace_bytes(2, 64, 2));
    EXPECT(ds_moe_workspace_bytes_v2(0, 64, 64, 4, 2) == 0);
    m.dim = 48;
    EXPECT_STATUS(ds_moe_cuda(&m, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("multiples of 32");
    m.dim = 64, m.top_k = 5;
    EXPECT_STATUS(ds_moe_cuda(&m, NULL), DS_ERR_ARG);
    m.top_k = 2, m.out = dummy;
    EXPECT_STATUS(ds_moe_cuda(&m, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("alias");
    m.out = dummy + 16, m.swiglu_limit = 0.0f;
    EXPECT_STATUS(ds_moe_cuda(&m, NULL), DS_ERR_ARG);
    m.swiglu_limit = 7.0f, m.n_rows = 0; // nothing to do: OK without touching anything
    EXPECT_OK(ds_moe_cuda(&m, NULL));
    EXPECT_STATUS(ds_mxfp4_dequant_cuda((const uint8_t *)dummy, (const uint8_t *)dummy, 1, 40,
                                        dummy, NULL),
                  DS_ERR_ARG);
}

int main(void) {
    DS_RUN(router_and_moe_reject_bad_arguments);
    if (ds_cuda_device_count() == 0) {
        if (ds_test_end()) return 1; // a host-side failure counts even without a GPU
        DS_SKIP("no CUDA device (host-side argument checks passed)");
    }
    DS_RUN(mxfp4_decode_is_bit_exact);
    DS_RUN(router_matches_reference);
    DS_RUN(router_is_batch_invariant);
    DS_RUN(router_deferred_norm_is_batch_invariant);
    G_RUN_LARGE(router_timing);
    DS_RUN(moe_matches_reference_over_a_shape_matrix);
    DS_RUN(moe_is_batch_invariant);
    DS_RUN(moe_skips_an_out_of_range_expert);
    DS_RUN(moe_one_token_repeats_and_skips);
    DS_RUN(moe_deferred_norm_matches_reference);
    DS_RUN(moe_deferred_norm_is_batch_invariant);
    return ds_test_end();
}
