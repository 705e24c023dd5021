// The order of a model's allocations against its weight upload, on an uploading CPU backend (the
// reference with map_host removed, the way the CUDA backend loads): a plan whose KV cache does
// not fit is refused before a single weight byte is copied, for the target and for the draft, and
// a plan that fits loads weights that give the mapped model's logits.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/backend.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "harness.h"

#define CKPT DS_SOURCE_DIR "/tests/fixtures/ckpt/"
#define ALLOC_LIMIT ((size_t)16 << 20) // larger than any buffer of the fixture's small plans

static struct ds_backend *ref;
static size_t uploaded; // bytes through the wrapper's upload

static enum ds_status lim_alloc(struct ds_backend *be, size_t bytes, void **buf_out) {
    (void)be;
    if (bytes > ALLOC_LIMIT) {
        *buf_out = NULL;
        return ds_error_set(DS_ERR_NOMEM, "test backend: %zu bytes refused", bytes);
    }
    return ref->alloc(ref, bytes, buf_out);
}

static enum ds_status count_upload(struct ds_backend *be, void *dst, const void *src,
                                   size_t bytes) {
    (void)be;
    uploaded += bytes;
    return ref->upload(ref, dst, src, bytes);
}

// The reference table with uploads instead of mapping and a cap on one allocation.
static struct ds_backend uploading(void) {
    struct ds_backend b = *ref;
    b.map_host = NULL;
    b.alloc = lim_alloc;
    b.upload = count_upload;
    return b;
}

static void target_kv_refused_before_upload(void) {
    struct ds_backend up = uploading();
    // KV = 2 · 4 layers · 64 slots · 512 positions · 2 heads · 32 · 4 bytes = 64 MiB.
    struct ds_gptoss_plan p = {.max_slots = 64, .max_pos = 512, .max_rows = 8};
    ds_gptoss_t *m = NULL;
    uploaded = 0;
    EXPECT_STATUS(ds_gptoss_create(CKPT "target", &up, &p, NULL, &m), DS_ERR_NOMEM);
    EXPECT_ERROR_HAS("KV cache");
    EXPECT(m == NULL);
    EXPECT_EQ_INT(uploaded, 0);
}

static void draft_kv_refused_before_upload(void) {
    struct ds_backend up = uploading();
    struct ds_target_config tc;
    struct ds_aux_plan aux;
    EXPECT_OK(ds_target_config_load(CKPT "target", &tc));
    EXPECT_OK(ds_eagle3_aux_plan(CKPT "draft-lmsys", &tc, NULL, &aux));
    struct ds_gptoss_plan tp = {.max_slots = 2, .max_pos = 40, .max_rows = 8};
    ds_gptoss_plan_aux(&tp, &aux);
    ds_gptoss_t *t = NULL;
    EXPECT_OK(ds_gptoss_create(CKPT "target", &up, &tp, NULL, &t));
    if (!t) return;
    // The draft's one layer at 256 slots · 512 positions: 2 · 256 · 512 · 2 · 32 · 4 = 64 MiB.
    struct ds_eagle3_plan dp = {.max_slots = 256, .max_pos = 512, .max_rows = 8};
    ds_eagle3_t *d = NULL;
    uploaded = 0;
    EXPECT_STATUS(ds_eagle3_create(CKPT "draft-lmsys", t, &up, &dp, NULL, &d), DS_ERR_NOMEM);
    EXPECT_ERROR_HAS("KV cache");
    EXPECT(d == NULL);
    EXPECT_EQ_INT(uploaded, 0);
    dp.max_slots = 2, dp.max_pos = 40;
    EXPECT_OK(ds_eagle3_create(CKPT "draft-lmsys", t, &up, &dp, NULL, &d));
    EXPECT(uploaded > 0);
    ds_eagle3_release(d);
    ds_gptoss_release(t);
}

// Uploaded weights (bound after the KV and activation buffers) give the mapped model's logits.
static void uploaded_matches_mapped(void) {
    struct ds_backend up = uploading();
    struct ds_gptoss_plan p = {.max_slots = 2, .max_pos = 40, .max_rows = 8};
    ds_gptoss_t *a = NULL, *b = NULL;
    uploaded = 0;
    EXPECT_OK(ds_gptoss_create(CKPT "target", ref, &p, NULL, &a));
    EXPECT_OK(ds_gptoss_create(CKPT "target", &up, &p, NULL, &b));
    EXPECT(uploaded > 0);
    if (!a || !b) {
        ds_gptoss_release(a);
        ds_gptoss_release(b);
        return;
    }
    const int V = (int)ds_gptoss_config(a)->vocab_size;
    int32_t ids[5] = {1, 7, 3, 9, 4}, row = 4;
    struct ds_attn_seq q = {.row0 = 0, .n_rows = 5, .pos0 = 0, .slot = 1};
    struct ds_batch batch = {
        .n_rows = 5, .tokens = ids, .n_seq = 1, .seqs = &q, .n_logit_rows = 1, .logit_rows = &row};
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    EXPECT(la && lb);
    if (la && lb) {
        EXPECT_OK(ds_gptoss_forward(a, &batch));
        EXPECT_OK(ds_gptoss_download_logits(a, 1, la));
        EXPECT_OK(ds_gptoss_forward(b, &batch));
        EXPECT_OK(ds_gptoss_download_logits(b, 1, lb));
        EXPECT(memcmp(la, lb, sizeof(float) * (size_t)V) == 0);
    }
    free(la);
    free(lb);
    ds_gptoss_release(a);
    ds_gptoss_release(b);
}

int main(void) {
    if (ds_backend_ref_create(&ref) != DS_OK) {
        fprintf(stderr, "%s\n", ds_error_last());
        return 1;
    }
    DS_RUN(target_kv_refused_before_upload);
    DS_RUN(draft_kv_refused_before_upload);
    DS_RUN(uploaded_matches_mapped);
    ds_backend_release(ref);
    return ds_test_end();
}
