// The backend table (ds/backend.h) filled by the CPU reference: version and completeness checks,
// the memory entries, and a small forward chain driven only through the table.
#include <stdint.h>

#include "ds/backend.h"
#include "ds/kernels.h"
#include "test_ops_common.h"

static void ref_backend_is_complete_and_versioned(void) {
    struct ds_backend *be = NULL;
    EXPECT_OK(ds_backend_ref_create(&be));
    EXPECT_OK(ds_backend_check(be));
    EXPECT_EQ_STR(be->name, "cpu-ref");
    EXPECT_EQ_INT(be->act, DS_ELEM_F32);
    struct ds_backend copy = *be;
    copy.api_version = DS_BACKEND_API_VERSION + 1;
    EXPECT_STATUS(ds_backend_check(&copy), DS_ERR_MISMATCH);
    EXPECT_ERROR_HAS("cpu-ref: API version");
    copy = *be;
    copy.moe = NULL;
    EXPECT_STATUS(ds_backend_check(&copy), DS_ERR_MISMATCH);
    EXPECT_ERROR_HAS("missing entry moe");
    copy = *be;
    copy.map_host = NULL; // optional
    EXPECT_OK(ds_backend_check(&copy));
    EXPECT_STATUS(ds_backend_check(NULL), DS_ERR_ARG);
    ds_backend_release(be);
    ds_backend_release(NULL);
}

static void memory_entries(void) {
    struct ds_backend *be = NULL;
    EXPECT_OK(ds_backend_ref_create(&be));
    void *buf = NULL;
    EXPECT_STATUS(be->alloc(be, 0, &buf), DS_ERR_ARG);
    EXPECT_OK(be->alloc(be, 1000, &buf));
    EXPECT(((uintptr_t)buf % 256) == 0);
    float host[6] = {1, 2, 3, 4, 5, 6}, back[6] = {0};
    EXPECT_OK(be->upload(be, buf, host, sizeof host));
    EXPECT_OK(be->download(be, back, buf, sizeof back));
    EXPECT(t_same_bits(back, host, 6));
    EXPECT_OK(be->memset(be, buf, 0, sizeof host));
    EXPECT_OK(be->download(be, back, buf, sizeof back));
    EXPECT(back[0] == 0 && back[5] == 0);
    EXPECT_STATUS(be->memset(be, buf, 300, 4), DS_ERR_ARG);
    // copy_2d: rows of 2 floats from a and of 1 float from b into 3-float rows: [a | b].
    float a[2 * 2] = {1, 2, 3, 4}, b[2] = {9, 8}, cat[2 * 3];
    float *dev = (float *)buf;
    EXPECT_OK(be->upload(be, dev + 100, a, sizeof a));
    EXPECT_OK(be->upload(be, dev + 110, b, sizeof b));
    EXPECT_OK(be->copy_2d(be, dev, 3 * sizeof(float), dev + 100, 2 * sizeof(float),
                          2 * sizeof(float), 2));
    EXPECT_OK(be->copy_2d(be, dev + 2, 3 * sizeof(float), dev + 110, sizeof(float),
                          sizeof(float), 2));
    EXPECT_OK(be->sync(be));
    EXPECT_OK(be->download(be, cat, dev, sizeof cat));
    EXPECT(cat[0] == 1 && cat[1] == 2 && cat[2] == 9 && cat[3] == 3 && cat[4] == 4 && cat[5] == 8);
    EXPECT_STATUS(be->copy_2d(be, dev, 4, dev + 100, 8, 8, 1), DS_ERR_ARG);
    const void *mapped = NULL;
    EXPECT_OK(be->map_host(be, host, sizeof host, &mapped));
    EXPECT(mapped == (const void *)host);
    be->free(be, buf);
    be->free(be, NULL);
    ds_backend_release(be);
}

// embed → rmsnorm → matmul (lm_head) → argmax through the table equals the direct reference.
static void forward_chain_through_the_table(void) {
    enum { V = 11, C = 8, T = 3 };
    struct ds_backend *be = NULL;
    EXPECT_OK(ds_backend_ref_create(&be));
    float table[V * C], gain[C], head[V * C];
    uint16_t table16[V * C], gain16[C], head16[V * C];
    t_fill(table, V * C, 1, 2.0f), t_fill(gain, C, 2, 1.0f), t_fill(head, V * C, 3, 1.0f);
    t_to_bf16(table, table16, V * C), t_to_bf16(gain, gain16, C), t_to_bf16(head, head16, V * C);
    const void *w_table, *w_gain, *w_head;
    EXPECT_OK(be->map_host(be, table16, sizeof table16, &w_table));
    EXPECT_OK(be->map_host(be, gain16, sizeof gain16, &w_gain));
    EXPECT_OK(be->map_host(be, head16, sizeof head16, &w_head));
    int32_t ids_h[T] = {4, 0, 10};
    void *ids, *x, *logits, *best;
    EXPECT_OK(be->alloc(be, sizeof ids_h, &ids));
    EXPECT_OK(be->alloc(be, sizeof(float) * T * C, &x));
    EXPECT_OK(be->alloc(be, sizeof(float) * T * V, &logits));
    EXPECT_OK(be->alloc(be, sizeof(int32_t) * T, &best));
    EXPECT_OK(be->upload(be, ids, ids_h, sizeof ids_h));
    struct ds_embed_args ea = {.act = be->act, .table_dtype = DS_ELEM_BF16, .n_rows = T,
                               .vocab = V, .dim = C, .table = w_table, .ids = ids, .out = x};
    struct ds_rmsnorm_args na = {.act = be->act, .w_dtype = DS_ELEM_BF16, .n_rows = T, .dim = C,
                                 .eps = 1e-5f, .x = x, .w = w_gain, .out = x};
    struct ds_matmul_args ma = {.act = be->act, .w_dtype = DS_ELEM_BF16, .n_rows = T,
                                .in_dim = C, .out_dim = V, .x = x, .w = w_head, .out = logits};
    struct ds_argmax_args aa = {.act = be->act, .n_rows = T, .vocab = V, .x = logits, .ids = best};
    EXPECT_OK(be->embed(be, &ea));
    EXPECT_OK(be->rmsnorm(be, &na));
    EXPECT_OK(be->matmul(be, &ma));
    EXPECT_OK(be->argmax(be, &aa));
    float got[T * V];
    int32_t got_ids[T];
    EXPECT_OK(be->download(be, got, logits, sizeof got));
    EXPECT_OK(be->download(be, got_ids, best, sizeof got_ids));
    // Independent chain in double: row of the table, RMS-normalised, times the head.
    for (int t = 0; t < T; t++) {
        const float *e = table + ids_h[t] * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)e[c] * e[c];
        double inv = 1 / sqrt(ss / C + (double)1e-5f), bestv = -INFINITY;
        int bi = -1;
        for (int v = 0; v < V; v++) {
            double l = 0;
            for (int c = 0; c < C; c++) l += (double)(float)(gain[c] * e[c] * inv) * head[v * C + c];
            // The normed row is rounded to float before the matmul: 1e-6 covers it.
            EXPECT_NEAR(got[t * V + v], l, 1e-6);
            if (l > bestv) bestv = l, bi = v;
        }
        EXPECT_EQ_INT(got_ids[t], bi);
    }
    EXPECT_STATUS(be->matmul(be, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("matmul called without arguments");
    be->free(be, ids), be->free(be, x), be->free(be, logits), be->free(be, best);
    ds_backend_release(be);
}

int main(void) {
    DS_RUN(ref_backend_is_complete_and_versioned);
    DS_RUN(memory_entries);
    DS_RUN(forward_chain_through_the_table);
    return ds_test_end();
}
