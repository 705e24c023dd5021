// gpt-oss mixture of experts: the router (top-k THEN softmax, ties to the lower index) and the
// fused MXFP4 expert block (ds_moe_ref) against a naive double-precision computation written here
// from the gpt-oss spec §3 and §4.5-4.6, including the SwiGLU clamp corners and the +1.
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ds/kernels.h"
#include "test_ops_common.h"

static const float spec_e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f,
                                    -2, -3, -4, -6};

// Router logits are the bias alone (zero weights): [0.5, 3, -1, 3, 2, 0.25, 2].
// Top-4 = ids 1, 3 (tie at 3: lower first), 4, 6 (tie at 2); softmax over {3, 3, 2, 2} only.
static void router_takes_top4_then_softmax_with_ties_to_lower_index(void) {
    enum { E = 7, C = 4 };
    float x[C] = {1, -1, 0.5f, 2}, w[E * C] = {0}, b[E] = {0.5f, 3, -1, 3, 2, 0.25f, 2};
    uint16_t b16[E];
    t_to_bf16(b, b16, E);
    int32_t ids[4];
    float wt[4];
    struct ds_router_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_BF16, .n_rows = 1, .dim = C, .n_experts = E,
                               .top_k = 4, .x = x, .w = w, .bias = b16, .expert_ids = ids,
                               .expert_weights = wt};
    EXPECT_OK(ds_router_ref(&a));
    EXPECT(ids[0] == 1 && ids[1] == 3 && ids[2] == 4 && ids[3] == 6);
    double e = exp(1.0), den = 2 * e + 2; // softmax of (3, 3, 2, 2) = (e, e, 1, 1) / (2e + 2)
    // fp32 outputs of a double softmax: 1e-7 absolute.
    EXPECT_NEAR(wt[0], e / den, 1e-7);
    EXPECT_NEAR(wt[1], e / den, 1e-7);
    EXPECT_NEAR(wt[2], 1 / den, 1e-7);
    EXPECT_NEAR(wt[3], 1 / den, 1e-7);
    // All equal: the four lowest indices, equal weights.
    for (int i = 0; i < E; i++) b16[i] = 0x3f80;
    EXPECT_OK(ds_router_ref(&a));
    EXPECT(ids[0] == 0 && ids[1] == 1 && ids[2] == 2 && ids[3] == 3);
    EXPECT(wt[0] == 0.25f && wt[3] == 0.25f);
}

// The n best of E <= 256 logits in order (logit desc, index asc): the router's selection.
static void naive_top(const double *l, int E, int n, int *top) {
    int used[256] = {0};
    for (int s = 0; s < n; s++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!used[e] && (best < 0 || l[e] > l[best])) best = e;
        used[best] = 1, top[s] = best;
    }
}

// Random router rows against logits computed here, sorted by (logit desc, index asc).
static void router_matches_naive_and_is_batch_invariant(void) {
    enum { T = 8, E = 32, C = 40, K = 4 };
    float x[T * C], w[E * C], b[E];
    t_fill(x, T * C, 1, 1.0f), t_fill(w, E * C, 2, 1.0f), t_fill(b, E, 3, 1.0f);
    int32_t ids[T * K], ids1[K];
    float wt[T * K], wt1[K];
    struct ds_router_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .dim = C, .n_experts = E,
                               .top_k = K, .x = x, .w = w, .bias = b, .expert_ids = ids,
                               .expert_weights = wt};
    EXPECT_OK(ds_router_ref(&a));
    for (int t = 0; t < T; t++) {
        double l[E];
        for (int e = 0; e < E; e++) {
            l[e] = b[e];
            for (int c = 0; c < C; c++) l[e] += (double)x[t * C + c] * w[e * C + c];
        }
        int top[K];
        naive_top(l, E, K, top);
        double den = 0;
        for (int s = 0; s < K; s++) den += exp(l[top[s]] - l[top[0]]);
        for (int s = 0; s < K; s++) {
            EXPECT_EQ_INT(ids[t * K + s], top[s]);
            EXPECT_NEAR(wt[t * K + s], exp(l[top[s]] - l[top[0]]) / den, 1e-7);
        }
        struct ds_router_args one = a;
        one.n_rows = 1, one.x = x + t * C, one.expert_ids = ids1, one.expert_weights = wt1;
        EXPECT_OK(ds_router_ref(&one));
        EXPECT(memcmp(ids1, ids + t * K, sizeof ids1) == 0 && t_same_bits(wt1, wt + t * K, K));
    }
}

// The RMSNorm scale of a row, computed here: 1/sqrt(mean(x²) + eps) in double.
static double row_rms_scale(const float *x, int C, double eps) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    return 1.0 / sqrt(ss / C + eps);
}

// Deferred norm in the router (ds/kernel_args.h): logit = s(rms_of)·(w·x) + bias with x = g ⊙ x0.
// (1) Exact inputs (multiples of 1/64: g ⊙ x0 exact in f32, every sum exact in double): ids equal
//     the top-k of logits computed here with the same double operations, weights within 1e-7
//     (fp32 outputs of a double softmax), row_scale within one f32 rounding of s (1.2e-7
//     relative; the GPU's fp32 s is held to 1e-6 in tests/gpu_ops_moe.c).
// (2) The router on rmsnorm(x0) (ds_rmsnorm_ref) picks the same experts: the two logit vectors
//     differ by rounding only, |Δl| <= δ = 2^-23·max_e Σ_c |xn_c·w_ec| (xn = rmsnorm(x0) rounded
//     to f32, 2^-24 relative per element, doubled for margin). Rows where two of the top k + 1
//     logits lie within 2δ but not exactly equal are skipped (a near tie may fall either way);
//     at least 3/4 of the rows must be checked. Weights: Δw_i = w_i·(Δl_i − Σ_j w_j·Δl_j) to
//     first order, so |Δw_i| <= 2δ; checked within 2δ + 1e-7 (the f32 rounding).
// (3) Each row alone gives the bits of the batch (ids, weights, row_scale); no row_scale is fine.
static void router_rms_of_equals_formula_and_router_on_rmsnorm(void) {
    enum { T = 16, E = 32, C = 64, K = 4 };
    const double eps = 1e-5f;
    float x0[T * C], g[C], x[T * C], w[E * C], b[E], xn[T * C], rs[T], rs1[1];
    t_fill(x0, T * C, 11, 2.0f), t_fill(g, C, 12, 2.0f), t_fill(w, E * C, 13, 1.0f);
    t_fill(b, E, 14, 1.0f);
    for (int i = 0; i < T * C; i++) x[i] = g[i % C] * x0[i];
    int32_t ids[T * K], ids2[T * K], ids1[K];
    float wt[T * K], wt2[T * K], wt1[K];
    struct ds_router_args a = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32,
                               .bias_dtype = DS_ELEM_F32, .n_rows = T, .dim = C, .n_experts = E,
                               .top_k = K, .x = x, .w = w, .bias = b, .expert_ids = ids,
                               .expert_weights = wt, .rms_of = x0, .rms_eps = (float)eps,
                               .row_scale = rs};
    EXPECT_OK(ds_router_ref(&a));
    struct ds_rmsnorm_args nm = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = T,
                                 .dim = C, .eps = (float)eps, .x = x0, .w = g, .out = xn};
    EXPECT_OK(ds_rmsnorm_ref(&nm));
    struct ds_router_args p = a;
    p.x = xn, p.rms_of = NULL, p.row_scale = NULL, p.expert_ids = ids2, p.expert_weights = wt2;
    EXPECT_OK(ds_router_ref(&p));
    int checked = 0;
    for (int t = 0; t < T; t++) {
        const double st = row_rms_scale(x0 + t * C, C, eps);
        EXPECT_NEAR(rs[t], st, 1.2e-7 * st);
        double l[E], delta = 0;
        int top[K + 1];
        for (int e = 0; e < E; e++) {
            double d = 0, m = 0;
            for (int c = 0; c < C; c++) {
                d += (double)x[t * C + c] * w[e * C + c];
                m += fabs((double)xn[t * C + c] * w[e * C + c]);
            }
            l[e] = d * st + b[e];
            delta = fmax(delta, 0x1p-23 * m);
        }
        naive_top(l, E, K + 1, top); // K + 1: the gap after the last chosen one
        double den = 0;
        for (int s = 0; s < K; s++) den += exp(l[top[s]] - l[top[0]]);
        int near_tie = 0;
        for (int s = 0; s < K; s++) {
            EXPECT_EQ_INT(ids[t * K + s], top[s]);
            EXPECT_NEAR(wt[t * K + s], exp(l[top[s]] - l[top[0]]) / den, 1e-7);
            const double gap = l[top[s]] - l[top[s + 1]];
            near_tie |= gap > 0 && gap <= 2 * delta;
        }
        if (!near_tie) {
            checked++;
            for (int s = 0; s < K; s++) {
                EXPECT_EQ_INT(ids2[t * K + s], ids[t * K + s]);
                EXPECT_NEAR(wt2[t * K + s], wt[t * K + s], 2 * delta + 1e-7);
            }
        }
        struct ds_router_args one = a;
        one.n_rows = 1, one.x = x + t * C, one.rms_of = x0 + t * C, one.expert_ids = ids1;
        one.expert_weights = wt1, one.row_scale = rs1;
        EXPECT_OK(ds_router_ref(&one));
        EXPECT(memcmp(ids1, ids + t * K, sizeof ids1) == 0 && t_same_bits(wt1, wt + t * K, K));
        EXPECT(t_same_bits(rs1, rs + t, 1));
        one.row_scale = NULL;
        EXPECT_OK(ds_router_ref(&one));
        EXPECT(memcmp(ids1, ids + t * K, sizeof ids1) == 0 && t_same_bits(wt1, wt + t * K, K));
    }
    EXPECT(checked >= T * 3 / 4);
    a.rms_eps = -1.0f;
    EXPECT_STATUS(ds_router_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("router: rms_eps -1 is negative");
}

// ---------------------------------------------------------------------------------------------
// Experts

struct moe_prob {
    int T, C, I, E, K;
    uint8_t *gu_b, *gu_s, *dn_b, *dn_s;
    float *gu_bias, *dn_bias, *x, *res, *wts;
    int32_t *ids;
};

// Naive element of an MXFP4 matrix straight from the spec layout (independent of ds/mxfp4.h).
static double spec_w(const uint8_t *blocks, const uint8_t *scales, int n, int k, int K) {
    uint8_t byte = blocks[(size_t)n * (K / 32) * 16 + (k / 32) * 16 + (k % 32) / 2];
    unsigned code = (k % 2 == 0) ? (byte & 15u) : (byte >> 4);
    return ldexp(spec_e2m1[code], (int)scales[(size_t)n * (K / 32) + k / 32] - 127);
}

static double spec_swiglu(double g, double l, double alpha, double limit) {
    if (g > limit) g = limit; // gate: from above only
    if (l > limit) l = limit; // linear: both sides
    if (l < -limit) l = -limit;
    return g * (1.0 / (1.0 + exp(-alpha * g))) * (l + 1.0);
}

// want[t][c] and a magnitude bound mag[t][c] = Σ |terms| for the tolerance. row_scale: the
// deferred norm's r_t multiplying the gate_up products before their bias (NULL: none).
static void moe_naive(const struct moe_prob *p, const float *row_scale, double *want,
                      double *mag) {
    const int C = p->C, I = p->I;
    double *h = t_alloc(sizeof(double) * I), *ha = t_alloc(sizeof(double) * I);
    for (int t = 0; t < p->T; t++) {
        for (int c = 0; c < C; c++) want[t * C + c] = p->res ? p->res[t * C + c] : 0.0;
        for (int c = 0; c < C; c++) mag[t * C + c] = fabs(want[t * C + c]);
        for (int s = 0; s < p->K; s++) {
            int e = p->ids[t * p->K + s];
            double ws = p->wts[t * p->K + s];
            for (int j = 0; j < I; j++) {
                double u[2];
                for (int r = 0; r < 2; r++) {
                    int row = e * 2 * I + 2 * j + r; // gate/up interleaved rows
                    double d = 0;
                    for (int k = 0; k < C; k++)
                        d += p->x[t * C + k] * spec_w(p->gu_b, p->gu_s, row, k, C);
                    u[r] = (row_scale ? row_scale[t] * d : d) + p->gu_bias[row];
                }
                h[j] = spec_swiglu(u[0], u[1], 1.702, 7.0);
                ha[j] = fabs(h[j]);
            }
            for (int c = 0; c < C; c++) {
                int row = e * C + c;
                double y = p->dn_bias[row], ya = fabs(y);
                for (int i = 0; i < I; i++) {
                    double wv = spec_w(p->dn_b, p->dn_s, row, i, I);
                    y += h[i] * wv;
                    ya += ha[i] * fabs(wv);
                }
                want[t * C + c] += ws * y; // the down bias is inside the weighted sum
                mag[t * C + c] += ws * ya;
            }
        }
    }
    free(h), free(ha);
}

static struct moe_prob moe_random(int T, int C, int I, int E, int K, uint64_t seed) {
    struct moe_prob p = {.T = T, .C = C, .I = I, .E = E, .K = K};
    size_t gu_rows = (size_t)E * 2 * I, dn_rows = (size_t)E * C;
    p.gu_b = t_alloc(gu_rows * C / 2), p.gu_s = t_alloc(gu_rows * C / 32);
    p.dn_b = t_alloc(dn_rows * I / 2), p.dn_s = t_alloc(dn_rows * I / 32);
    p.gu_bias = t_alloc(sizeof(float) * gu_rows), p.dn_bias = t_alloc(sizeof(float) * dn_rows);
    p.x = t_alloc(sizeof(float) * T * C), p.res = t_alloc(sizeof(float) * T * C);
    p.wts = t_alloc(sizeof(float) * T * K), p.ids = t_alloc(sizeof(int32_t) * T * K);
    uint64_t s = seed;
    for (size_t i = 0; i < gu_rows * C / 2; i++) p.gu_b[i] = (uint8_t)t_next(&s);
    for (size_t i = 0; i < dn_rows * I / 2; i++) p.dn_b[i] = (uint8_t)t_next(&s);
    // Scales 2^-6 .. 2^-2 keep u around the clamp limit so every SwiGLU branch is exercised.
    for (size_t i = 0; i < gu_rows * C / 32; i++) p.gu_s[i] = (uint8_t)t_int(&s, 121, 125);
    for (size_t i = 0; i < dn_rows * I / 32; i++) p.dn_s[i] = (uint8_t)t_int(&s, 121, 125);
    t_fill(p.gu_bias, gu_rows, seed + 1, 4.0f);
    t_fill(p.dn_bias, dn_rows, seed + 2, 1.0f);
    t_fill(p.x, (size_t)T * C, seed + 3, 2.0f);
    t_fill(p.res, (size_t)T * C, seed + 4, 1.0f);
    for (int t = 0; t < T; t++) { // K distinct experts per row, weights summing to 1
        int first = t_int(&s, 0, E - 1);
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

static struct ds_moe_args moe_args(const struct moe_prob *p, float *out, void *ws) {
    return (struct ds_moe_args){
        .act = DS_ELEM_F32, .bias_dtype = DS_ELEM_F32, .n_rows = p->T, .dim = p->C,
        .inter = p->I, .n_experts = p->E, .top_k = p->K, .swiglu_alpha = 1.702f,
        .swiglu_limit = 7.0f, .x = p->x, .expert_ids = p->ids, .expert_weights = p->wts,
        .gate_up_blocks = p->gu_b, .gate_up_scales = p->gu_s, .gate_up_bias = p->gu_bias,
        .down_blocks = p->dn_b, .down_scales = p->dn_s, .down_bias = p->dn_bias,
        .residual = p->res, .out = out, .workspace = ws,
        .workspace_bytes = ds_moe_workspace_bytes(p->T, p->I, p->K)};
}

static void check_moe_problem(int T, int C, int I, int E, int K, uint64_t seed) {
    struct moe_prob p = moe_random(T, C, I, E, K, seed);
    float *out = t_alloc(sizeof(float) * T * C);
    void *ws = t_alloc(ds_moe_workspace_bytes(T, I, K));
    double *want = t_alloc(sizeof(double) * T * C), *mag = t_alloc(sizeof(double) * T * C);
    struct ds_moe_args a = moe_args(&p, out, ws);
    EXPECT_OK(ds_moe_ref(&a));
    moe_naive(&p, NULL, want, mag);
    // Tolerance 1e-6·Σ|terms|: the reference rounds h to float (6e-8 relative) and the output
    // once more; everything else is exact or double.
    for (int i = 0; i < T * C; i++)
        if (!(fabs(out[i] - want[i]) <= 1e-6 * mag[i] + 1e-12)) {
            DS_FAILF("T=%d C=%d I=%d K=%d: out[%d] = %.9g, want %.9g", T, C, I, K, i, out[i],
                     want[i]);
            break;
        }
    // Written in place over the residual: same bits.
    float *res0 = t_alloc(sizeof(float) * T * C);
    memcpy(res0, p.res, sizeof(float) * T * C);
    a.out = p.res;
    EXPECT_OK(ds_moe_ref(&a));
    EXPECT(t_same_bits(p.res, out, (size_t)T * C));
    free(out), free(ws), free(want), free(mag), free(res0);
    moe_free(&p);
}

static void moe_matches_naive_over_a_shape_matrix(void) {
    check_moe_problem(1, 32, 32, 1, 1, 1);  // one row, one expert
    check_moe_problem(3, 64, 96, 5, 2, 2);  // I not a multiple of 64
    check_moe_problem(6, 96, 64, 7, 4, 3);  // top-4 as gpt-oss
}

// Zero weights (code 0) make u the bias; the down matrix is the identity (code 2 = 1.0 on the
// diagonal), zero down bias, one expert of weight 1: out[c] = h_c exactly the SwiGLU of the bias
// pair (2c, 2c+1). Corners: gate above the limit, gate far below (no lower clamp), linear above
// and below ±limit, linear = -1 (the +1 makes h 0), gate 0.
static void swiglu_clamp_corners(void) {
    enum { C = 32, I = 32 };
    static const float pairs[][2] = {{10, 0},  {-10, 0.5f}, {1, 10}, {2, -10},
                                     {3, -1},  {0, 3},      {7, 7},  {-0.5f, -7.5f}};
    const int np = sizeof pairs / sizeof pairs[0];
    struct moe_prob p = moe_random(1, C, I, 1, 1, 9);
    memset(p.gu_b, 0, (size_t)2 * I * C / 2);
    memset(p.dn_b, 0, (size_t)C * I / 2);
    memset(p.gu_s, 127, (size_t)2 * I * C / 32);
    memset(p.dn_s, 127, (size_t)C * I / 32);
    for (int c = 0; c < C; c++) // code 2 (1.0) at column c of row c: low nibble when c is even
        p.dn_b[(size_t)c * I / 2 + c / 2] = (uint8_t)(c % 2 ? 0x20 : 0x02);
    for (int j = 0; j < I; j++) {
        p.gu_bias[2 * j] = pairs[j % np][0];
        p.gu_bias[2 * j + 1] = pairs[j % np][1];
    }
    memset(p.dn_bias, 0, sizeof(float) * C);
    p.wts[0] = 1.0f, p.ids[0] = 0;
    uint16_t gu16[2 * I], dn16[C];
    t_to_bf16(p.gu_bias, gu16, 2 * I);
    t_to_bf16(p.dn_bias, dn16, C);
    float out[C];
    void *ws = t_alloc(ds_moe_workspace_bytes(1, I, 1));
    struct ds_moe_args a = moe_args(&p, out, ws);
    a.residual = NULL, a.bias_dtype = DS_ELEM_BF16, a.gate_up_bias = gu16, a.down_bias = dn16;
    EXPECT_OK(ds_moe_ref(&a));
    for (int c = 0; c < np; c++) {
        double g = pairs[c][0], l = pairs[c][1];
        double gc = g > 7 ? 7 : g, lc = l > 7 ? 7 : l < -7 ? -7 : l;
        double want = gc / (1 + exp(-1.702 * gc)) * (lc + 1);
        EXPECT_NEAR(out[c], want, 1e-6 * (1 + fabs(want))); // one float rounding of h
    }
    EXPECT(out[4] == 0.0f);                 // linear -1: the +1 cancels it
    EXPECT(out[0] > 6.99 && out[0] < 7.0);  // gate 10 clamped to 7: 7·σ(11.9)
    EXPECT(out[1] < 0 && out[1] > -1e-6);   // gate -10 not clamped: -10·σ(-17)·1.5, tiny
    EXPECT_NEAR(out[2], 1 / (1 + exp(-1.702)) * 8, 1e-6);  // linear 10 -> 7, (7 + 1)
    EXPECT_NEAR(out[3], 2 / (1 + exp(-3.404)) * -6, 1e-6); // linear -10 -> -7, (-7 + 1)
    free(ws);
    moe_free(&p);
}

// Each row alone, inside the batch, and with 1..3 threads: the same bits.
static void moe_is_batch_and_thread_invariant(void) {
    enum { T = 8, C = 64, I = 64, E = 6, K = 4 };
    struct moe_prob p = moe_random(T, C, I, E, K, 21);
    float *all = t_alloc(sizeof(float) * T * C), *one = t_alloc(sizeof(float) * C);
    void *ws = t_alloc(ds_moe_workspace_bytes(T, I, K));
    struct ds_moe_args a = moe_args(&p, all, ws);
    EXPECT_OK(ds_moe_ref(&a));
    for (int t = 0; t < T; t++) {
        struct ds_moe_args b = a;
        b.n_rows = 1, b.x = p.x + t * C, b.expert_ids = p.ids + t * K,
        b.expert_weights = p.wts + t * K, b.residual = p.res + t * C, b.out = one;
        b.workspace_bytes = ds_moe_workspace_bytes(1, I, K);
        EXPECT_OK(ds_moe_ref(&b));
        EXPECT(t_same_bits(one, all + t * C, C));
    }
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    float *again = t_alloc(sizeof(float) * T * C);
    for (int n = 1; n <= 3; n++) {
        omp_set_num_threads(n);
        a.out = again;
        EXPECT_OK(ds_moe_ref(&a));
        EXPECT(t_same_bits(again, all, (size_t)T * C));
    }
    omp_set_num_threads(saved);
    free(again);
#endif
    free(all), free(one), free(ws);
    moe_free(&p);
}

// Deferred norm in the expert block: u = r_t·(W1·x) + b1 with x = g ⊙ x0 and r_t = s(x0) (the
// router's row_scale), and norm_out = g2 ⊙ out.
// (1) Against moe_naive with the row scale: tolerance 1e-6·Σ|terms| as in check_moe_problem.
// (2) Against the expert block on rmsnorm(x0) (ds_rmsnorm_ref, no row scale): the same up to
//     rounding. Here g ⊙ x0 is exact (multiples of 1/64), r_t is s rounded to f32 and xn =
//     rmsnorm(x0) is rounded to f32 (2^-24 relative each), so each gate_up value differs by
//     Δu <= 2·2^-24·Σ_k |xn_k·W1_k|. SwiGLU moves by at most 8.8·|Δu_gate| + 7·|Δu_lin| (the
//     SiLU slope is below 1.1 times |lin + 1| <= 8; |gate·σ(α·gate)| < 7; the clamps are
//     1-Lipschitz), h is rounded once per path (2·2^-24·|h|), and so is the output (2·2^-24·|out|):
//     Δout_c <= Σ_s w_s·Σ_j Δh_j·|W2_cj| + 2^-23·|out_c|, computed here; checked at twice that.
// (3) norm_out is g2 ⊙ out as stored (one f32 multiply, recomputed here), bitwise, also with out
//     written in place over the residual.
// (4) Each row alone gives the bits of the batch (out and norm_out).
static void moe_row_scale_equals_formula_and_moe_on_rmsnorm(void) {
    enum { T = 6, C = 64, I = 64, E = 7, K = 4 };
    const double eps = 1e-5f;
    struct moe_prob p = moe_random(T, C, I, E, K, 61);
    float *x0 = t_alloc(sizeof(float) * T * C), *xn = t_alloc(sizeof(float) * T * C);
    float g[C], g2[C], r[T];
    uint16_t g2_16[C];
    memcpy(x0, p.x, sizeof(float) * T * C);
    t_fill(g, C, 62, 2.0f);
    t_fill(g2, C, 63, 2.0f);
    t_to_bf16(g2, g2_16, C);
    for (int i = 0; i < T * C; i++) p.x[i] = g[i % C] * x0[i]; // exact: 7-bit × 7-bit
    for (int t = 0; t < T; t++) r[t] = (float)row_rms_scale(x0 + t * C, C, eps);
    float *out = t_alloc(sizeof(float) * T * C), *nout = t_alloc(sizeof(float) * T * C);
    float *out2 = t_alloc(sizeof(float) * T * C);
    void *ws = t_alloc(ds_moe_workspace_bytes(T, I, K));
    struct ds_moe_args a = moe_args(&p, out, ws);
    a.row_scale = r, a.norm_gain = g2_16, a.norm_gain_dtype = DS_ELEM_BF16, a.norm_out = nout;
    EXPECT_OK(ds_moe_ref(&a));

    double *want = t_alloc(sizeof(double) * T * C), *mag = t_alloc(sizeof(double) * T * C);
    moe_naive(&p, r, want, mag);
    for (int i = 0; i < T * C; i++)
        if (!(fabs(out[i] - want[i]) <= 1e-6 * mag[i] + 1e-12)) {
            DS_FAILF("row scale: out[%d] = %.9g, want %.9g", i, out[i], want[i]);
            break;
        }

    struct ds_rmsnorm_args nm = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = T,
                                 .dim = C, .eps = (float)eps, .x = x0, .w = g, .out = xn};
    EXPECT_OK(ds_rmsnorm_ref(&nm));
    struct ds_moe_args b = moe_args(&p, out2, ws);
    b.x = xn;
    EXPECT_OK(ds_moe_ref(&b));
    double *dh = t_alloc(sizeof(double) * I);
    for (int t = 0; t < T; t++) {
        double bound[C];
        for (int c = 0; c < C; c++) bound[c] = 0x1p-23 * fabs(out2[t * C + c]);
        for (int s = 0; s < K; s++) {
            const int e = p.ids[t * K + s];
            for (int j = 0; j < I; j++) {
                double u[2], du[2];
                for (int q = 0; q < 2; q++) {
                    const int row = e * 2 * I + 2 * j + q;
                    double d = 0, m = 0;
                    for (int k = 0; k < C; k++) {
                        const double wv = spec_w(p.gu_b, p.gu_s, row, k, C);
                        d += xn[t * C + k] * wv;
                        m += fabs(xn[t * C + k] * wv);
                    }
                    u[q] = d + p.gu_bias[row];
                    du[q] = 0x1p-23 * m;
                }
                dh[j] = 8.8 * du[0] + 7 * du[1] +
                        0x1p-23 * fabs(spec_swiglu(u[0], u[1], 1.702, 7.0));
            }
            for (int c = 0; c < C; c++) {
                double acc = 0;
                for (int j = 0; j < I; j++)
                    acc += dh[j] * fabs(spec_w(p.dn_b, p.dn_s, e * C + c, j, I));
                bound[c] += p.wts[t * K + s] * acc;
            }
        }
        for (int c = 0; c < C; c++)
            if (!(fabs((double)out[t * C + c] - out2[t * C + c]) <= 2 * bound[c])) {
                DS_FAILF("row %d col %d: deferred %.9g, moe on rmsnorm %.9g (bound %.3g)", t, c,
                         out[t * C + c], out2[t * C + c], 2 * bound[c]);
                t = T;
                break;
            }
    }
    // Not vacuous: the row scale matters (without it the outputs move far beyond the bound).
    b.x = p.x;
    EXPECT_OK(ds_moe_ref(&b));
    EXPECT(!t_same_bits(out2, out, (size_t)T * C));

    for (int i = 0; i < T * C; i++) {
        const float nw = g2[i % C] * out[i];
        if (!t_same_bits(&nout[i], &nw, 1)) {
            DS_FAILF("norm_out[%d] = %.9g, g·out = %.9g", i, nout[i], nw);
            break;
        }
    }
    float *res0 = t_alloc(sizeof(float) * T * C), *nout2 = t_alloc(sizeof(float) * T * C);
    memcpy(res0, p.res, sizeof(float) * T * C);
    a.out = p.res, a.norm_out = nout2;
    EXPECT_OK(ds_moe_ref(&a));
    EXPECT(t_same_bits(p.res, out, (size_t)T * C) && t_same_bits(nout2, nout, (size_t)T * C));
    memcpy(p.res, res0, sizeof(float) * T * C);

    float one[C], none[C];
    for (int t = 0; t < T; t++) {
        struct ds_moe_args o = a;
        o.n_rows = 1, o.x = p.x + t * C, o.expert_ids = p.ids + t * K;
        o.expert_weights = p.wts + t * K, o.residual = p.res + t * C, o.out = one;
        o.row_scale = r + t, o.norm_out = none;
        o.workspace_bytes = ds_moe_workspace_bytes(1, I, K);
        EXPECT_OK(ds_moe_ref(&o));
        EXPECT(t_same_bits(one, out + t * C, C) && t_same_bits(none, nout + t * C, C));
    }

    a.out = out, a.norm_out = NULL;
    EXPECT_STATUS(ds_moe_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("moe: norm_out buffer is NULL");
    a.norm_out = out;
    EXPECT_STATUS(ds_moe_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("moe: norm_out must not alias out");
    free(x0), free(xn), free(out), free(nout), free(out2), free(ws), free(want), free(mag);
    free(dh), free(res0), free(nout2);
    moe_free(&p);
}

static void moe_rejects_bad_arguments(void) {
    struct moe_prob p = moe_random(2, 32, 32, 3, 2, 5);
    float out[64];
    void *ws = t_alloc(ds_moe_workspace_bytes(2, 32, 2));
    struct ds_moe_args a = moe_args(&p, out, ws);
    p.ids[3] = 3;
    EXPECT_STATUS(ds_moe_ref(&a), DS_ERR_RANGE);
    EXPECT_ERROR_HAS("row 1 selects expert 3 of 3");
    p.ids[3] = 0;
    a.workspace_bytes = 16;
    EXPECT_STATUS(ds_moe_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("workspace of 16 bytes");
    a = moe_args(&p, out, ws);
    a.dim = 48;
    EXPECT_STATUS(ds_moe_ref(&a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("multiples of 32");
    a = moe_args(&p, out, ws);
    a.top_k = 4;
    EXPECT_STATUS(ds_moe_ref(&a), DS_ERR_ARG);
    free(ws);
    moe_free(&p);
}

int main(void) {
    DS_RUN(router_takes_top4_then_softmax_with_ties_to_lower_index);
    DS_RUN(router_matches_naive_and_is_batch_invariant);
    DS_RUN(router_rms_of_equals_formula_and_router_on_rmsnorm);
    DS_RUN(moe_matches_naive_over_a_shape_matrix);
    DS_RUN(swiglu_clamp_corners);
    DS_RUN(moe_is_batch_and_thread_invariant);
    DS_RUN(moe_row_scale_equals_formula_and_moe_on_rmsnorm);
    DS_RUN(moe_rejects_bad_arguments);
    return ds_test_end();
}
