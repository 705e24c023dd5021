// The CUDA backend object: creation and refusal, memory accounting, copies (upload, download,
// memset, copy_2d), seeded device fills, and a small forward chain run through the table
// (embed → rmsnorm → matmul → softmax → argmax) against the cpu-ref backend on the same inputs.
#include "ds/backend.h"
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"
#include "gpu_ops_common.h"

static void create_check_and_refuse(void) {
    struct ds_backend *be = (struct ds_backend *)1;
    EXPECT_STATUS(ds_backend_cuda_create(-1, &be), DS_ERR_NODEVICE);
    EXPECT(be == NULL);
    EXPECT_ERROR_HAS("no CUDA device -1: the runtime lists"); // ds_cuda_device_check's line
    EXPECT_STATUS(ds_backend_cuda_create(4096, &be), DS_ERR_NODEVICE);
    EXPECT(be == NULL);
    EXPECT_ERROR_HAS("no CUDA device 4096: the runtime lists");
    EXPECT_OK(ds_backend_cuda_create(0, &be));
    if (!be) return;
    EXPECT_OK(ds_backend_check(be));
    EXPECT_EQ_STR(be->name, "cuda");
    EXPECT_EQ_INT(be->act, DS_ELEM_BF16);
    EXPECT(be->map_host == NULL);
    EXPECT(ds_backend_cuda_stream(be) != NULL);
    ds_backend_release(be);

    // The accessors refuse a backend that is not CUDA.
    struct ds_backend *ref = NULL;
    EXPECT_OK(ds_backend_ref_create(&ref));
    EXPECT(ds_backend_cuda_stream(ref) == NULL);
    size_t live = 7;
    EXPECT_STATUS(ds_backend_cuda_memory(ref, &live, NULL, NULL), DS_ERR_ARG);
    EXPECT_EQ_INT(live, 7);
    ds_backend_release(ref);
}

static void memory_accounting(void) {
    struct ds_backend *be = NULL;
    EXPECT_OK(ds_backend_cuda_create(0, &be));
    if (!be) return;
    void *a = NULL, *b = NULL, *c = NULL;
    size_t live, peak, count;
    EXPECT_OK(be->alloc(be, 1000, &a));
    EXPECT_OK(be->alloc(be, 1 << 20, &b));
    EXPECT_OK(be->alloc(be, 300, &c));
    EXPECT((uintptr_t)a % 256 == 0 && (uintptr_t)b % 256 == 0 && (uintptr_t)c % 256 == 0);
    EXPECT_OK(ds_backend_cuda_memory(be, &live, &peak, &count));
    EXPECT_EQ_INT(live, 1000 + (1 << 20) + 300);
    EXPECT_EQ_INT(peak, live);
    EXPECT_EQ_INT(count, 3);
    be->free(be, b);
    EXPECT_OK(ds_backend_cuda_memory(be, &live, &peak, &count));
    EXPECT_EQ_INT(live, 1300);
    EXPECT_EQ_INT(peak, 1000 + (1 << 20) + 300);
    EXPECT_EQ_INT(count, 2);
    be->free(be, NULL); // no-op
    void *z = (void *)1;
    EXPECT_STATUS(be->alloc(be, 0, &z), DS_ERR_ARG);
    EXPECT(z == NULL);
    // Far beyond any GPU: a clear NOMEM, nothing counted.
    EXPECT_STATUS(be->alloc(be, (size_t)1 << 50, &z), DS_ERR_NOMEM);
    EXPECT_ERROR_HAS("cannot allocate");
    EXPECT_OK(ds_backend_cuda_memory(be, &live, NULL, &count));
    EXPECT_EQ_INT(live, 1300);
    EXPECT_EQ_INT(count, 2);
    be->free(be, a);
    be->free(be, c);
    EXPECT_OK(ds_backend_cuda_memory(be, &live, NULL, &count));
    EXPECT_EQ_INT(live, 0);
    EXPECT_EQ_INT(count, 0);
    ds_backend_release(be);
}

static void copies_and_fills(void) {
    struct ds_backend *be = NULL;
    EXPECT_OK(ds_backend_cuda_create(0, &be));
    if (!be) return;
    enum { ROWS = 5, W = 24, SP = 40, DP = 64 };
    unsigned char host[ROWS * SP], back[ROWS * DP], want[ROWS * DP];
    for (int i = 0; i < ROWS * SP; i++) host[i] = (unsigned char)(i * 7 + 3);
    void *src = NULL, *dst = NULL;
    EXPECT_OK(be->alloc(be, sizeof host, &src));
    EXPECT_OK(be->alloc(be, sizeof back, &dst));
    EXPECT_OK(be->upload(be, src, host, sizeof host));
    EXPECT_OK(be->memset(be, dst, 0xab, sizeof back));
    // Rows of W bytes from pitch SP into pitch DP at byte 8 of each row; the rest stays 0xab.
    EXPECT_OK(be->copy_2d(be, (char *)dst + 8, DP, src, SP, W, ROWS));
    EXPECT_OK(be->download(be, back, dst, sizeof back));
    memset(want, 0xab, sizeof want);
    for (int r = 0; r < ROWS; r++) memcpy(want + r * DP + 8, host + r * SP, W);
    EXPECT(memcmp(back, want, sizeof want) == 0);
    EXPECT_STATUS(be->copy_2d(be, dst, 16, src, SP, W, ROWS), DS_ERR_ARG);
    EXPECT_ERROR_HAS("width 24 exceeds pitch 16");
    EXPECT_STATUS(be->memset(be, dst, 256, 4), DS_ERR_ARG);
    EXPECT_STATUS(be->upload(be, NULL, host, 4), DS_ERR_ARG);
    EXPECT_OK(be->upload(be, dst, host, 0)); // zero bytes: nothing to do
    EXPECT_OK(be->sync(be));

    // Seeded fills equal the host formula (f32 bitwise; bf16 = the value rounded to nearest even).
    enum { N = 100003 };
    float *f = NULL;
    uint16_t *h = NULL;
    uint8_t *u = NULL;
    EXPECT_OK(be->alloc(be, N * 4, (void **)&f));
    EXPECT_OK(be->alloc(be, N * 2, (void **)&h));
    EXPECT_OK(be->alloc(be, N, (void **)&u));
    void *s = ds_backend_cuda_stream(be);
    EXPECT_OK(ds_cuda_fill_uniform(f, DS_ELEM_F32, N, 42, -3.0f, 5.0f, s));
    EXPECT_OK(ds_cuda_fill_uniform(h, DS_ELEM_BF16, N, 43, -1.0f, 1.0f, s));
    EXPECT_OK(ds_cuda_fill_bytes(u, N, 44, 100, 140, s));
    float *fh = t_alloc(N * 4);
    uint16_t *hh = t_alloc(N * 2);
    uint8_t *uh = t_alloc(N);
    EXPECT_OK(be->download(be, fh, f, N * 4));
    EXPECT_OK(be->download(be, hh, h, N * 2));
    EXPECT_OK(be->download(be, uh, u, N));
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) {
        float v = ds_fill_value(42, i, -3.0f, 5.0f);
        bad += memcmp(&v, &fh[i], 4) != 0 || !(v >= -3.0f && v <= 5.0f);
        bad += hh[i] != ds_f32_to_bf16(ds_fill_value(43, i, -1.0f, 1.0f));
        bad += uh[i] != 100 + ds_fill_hash(44, i) % 41;
    }
    EXPECT_EQ_INT(bad, 0);
    EXPECT_STATUS(ds_cuda_fill_bytes(u, N, 1, 10, 300, s), DS_ERR_ARG);
    free(fh), free(hh), free(uh);
    be->free(be, f), be->free(be, h), be->free(be, u);
    be->free(be, src), be->free(be, dst);
    ds_backend_release(be);
}

// The same little chain on both backends with f32 activations (the CUDA ops accept f32 so the
// comparison is on identical inputs): logits must match to fp32 accumulation error; the argmax
// and the kept sets of top-k/top-p must agree (with 300 seeded logits no two candidates lie
// within that error of each other or of a cut-off).
static void forward_chain_matches_cpu_backend(void) {
    enum { V = 300, C = 128, T = 6 };
    struct ds_backend *bes[2] = {NULL, NULL};
    EXPECT_OK(ds_backend_ref_create(&bes[0]));
    EXPECT_OK(ds_backend_cuda_create(0, &bes[1]));
    if (!bes[0] || !bes[1]) return;
    float *emb = t_alloc((size_t)V * C * 4), *gain = t_alloc(C * 4), *head = t_alloc((size_t)V * C * 4);
    t_fill(emb, (size_t)V * C, 1, 1.0f);
    t_fill(gain, C, 2, 2.0f);
    t_fill(head, (size_t)V * C, 3, 0.5f);
    int32_t ids[T] = {0, 299, 17, 17, 150, 3};
    float logits[2][T * V], probs[2][T * V];
    int32_t best[2][T];
    for (int bi = 0; bi < 2; bi++) {
        struct ds_backend *be = bes[bi];
        void *d_emb, *d_gain, *d_head, *d_ids, *d_h, *d_n, *d_lg, *d_p, *d_best;
        EXPECT_OK(be->alloc(be, (size_t)V * C * 4, &d_emb));
        EXPECT_OK(be->alloc(be, C * 4, &d_gain));
        EXPECT_OK(be->alloc(be, (size_t)V * C * 4, &d_head));
        EXPECT_OK(be->alloc(be, sizeof ids, &d_ids));
        EXPECT_OK(be->alloc(be, (size_t)T * C * 4, &d_h));
        EXPECT_OK(be->alloc(be, (size_t)T * C * 4, &d_n));
        EXPECT_OK(be->alloc(be, (size_t)T * V * 4, &d_lg));
        EXPECT_OK(be->alloc(be, (size_t)T * V * 4, &d_p));
        EXPECT_OK(be->alloc(be, T * 4, &d_best));
        EXPECT_OK(be->upload(be, d_emb, emb, (size_t)V * C * 4));
        EXPECT_OK(be->upload(be, d_gain, gain, C * 4));
        EXPECT_OK(be->upload(be, d_head, head, (size_t)V * C * 4));
        EXPECT_OK(be->upload(be, d_ids, ids, sizeof ids));
        struct ds_embed_args e = {.act = DS_ELEM_F32, .table_dtype = DS_ELEM_F32, .n_rows = T,
                                  .vocab = V, .dim = C, .table = d_emb, .ids = d_ids, .out = d_h};
        struct ds_rmsnorm_args n = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = T,
                                    .dim = C, .eps = 1e-5f, .x = d_h, .w = d_gain, .out = d_n};
        struct ds_matmul_args m = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = T,
                                   .in_dim = C, .out_dim = V, .x = d_n, .w = d_head, .out = d_lg};
        struct ds_softmax_args s = {.act = DS_ELEM_F32, .n_rows = T, .vocab = V,
                                    .temperature = 1.0f, .top_k = 10, .top_p = 0.8f,
                                    .logits = d_lg, .probs = d_p};
        struct ds_argmax_args a = {.act = DS_ELEM_F32, .n_rows = T, .vocab = V, .x = d_lg,
                                   .ids = d_best};
        EXPECT_OK(be->embed(be, &e));
        EXPECT_OK(be->rmsnorm(be, &n));
        EXPECT_OK(be->matmul(be, &m));
        EXPECT_OK(be->softmax(be, &s));
        EXPECT_OK(be->argmax(be, &a));
        EXPECT_OK(be->download(be, logits[bi], d_lg, sizeof logits[bi]));
        EXPECT_OK(be->download(be, probs[bi], d_p, sizeof probs[bi]));
        EXPECT_OK(be->download(be, best[bi], d_best, sizeof best[bi]));
        void *bufs[] = {d_emb, d_gain, d_head, d_ids, d_h, d_n, d_lg, d_p, d_best};
        for (int i = 0; i < 9; i++) be->free(be, bufs[i]);
    }
    // The normed rows are not exact (1/sqrt): logits differ by fp32-vs-double accumulation of
    // C = 128 terms of size <= 4·0.5: 1e-5 absolute is ~50x that bound. Probabilities: 1e-5.
    g_compare("chain logits", logits[1], logits[0], (size_t)T * V, V, 1e-5, 1e-6);
    g_compare("chain probs", probs[1], probs[0], (size_t)T * V, V, 1e-5, 1e-5);
    for (int t = 0; t < T; t++) EXPECT_EQ_INT(best[1][t], best[0][t]);
    // An op error through the table is a status, not a crash.
    struct ds_matmul_args bad = {.act = DS_ELEM_F32, .w_dtype = DS_ELEM_F32, .n_rows = 1,
                                 .in_dim = 0, .out_dim = 1};
    EXPECT_STATUS(bes[1]->matmul(bes[1], &bad), DS_ERR_ARG);
    EXPECT_STATUS(bes[1]->matmul(bes[1], NULL), DS_ERR_ARG);
    free(emb), free(gain), free(head);
    ds_backend_release(bes[0]);
    ds_backend_release(bes[1]);
}

int main(void) {
    G_REQUIRE_GPU();
    DS_RUN(create_check_and_refuse);
    DS_RUN(memory_accounting);
    DS_RUN(copies_and_fills);
    DS_RUN(forward_chain_matches_cpu_backend);
    return ds_test_end();
}
