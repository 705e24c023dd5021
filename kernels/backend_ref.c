// The CPU reference backend: host memory from aligned_alloc, ops from kernels/ref/ (OpenMP,
// fp32 activations). Weights are used in place from host (mmapped) memory through map_host.
#include <stdlib.h>
#include <string.h>

#include "ds/backend.h"
#include "ds/kernels.h"

#define REF_ALIGN 256 // same guarantee as cudaMalloc, so models may assume it everywhere

static enum ds_status ref_alloc(struct ds_backend *be, size_t bytes, void **buf_out) {
    (void)be;
    *buf_out = NULL;
    if (bytes == 0) return ds_error_set(DS_ERR_ARG, "cpu-ref: allocation of 0 bytes");
    if (bytes > SIZE_MAX - REF_ALIGN)
        return ds_error_set(DS_ERR_NOMEM, "cpu-ref: allocation of %zu bytes", bytes);
    void *p = aligned_alloc(REF_ALIGN, (bytes + REF_ALIGN - 1) / REF_ALIGN * REF_ALIGN);
    if (!p) return ds_error_set(DS_ERR_NOMEM, "cpu-ref: out of memory allocating %zu bytes", bytes);
    *buf_out = p;
    return DS_OK;
}

static void ref_free(struct ds_backend *be, void *buf) {
    (void)be;
    free(buf);
}

static enum ds_status ref_map_host(struct ds_backend *be, const void *host, size_t bytes,
                                   const void **buf_out) {
    (void)be, (void)bytes;
    *buf_out = host;
    return host ? DS_OK : ds_error_set(DS_ERR_ARG, "cpu-ref: map_host of a NULL pointer");
}

static enum ds_status ref_copy(void *dst, const void *src, size_t bytes, const char *what) {
    if (bytes == 0) return DS_OK;
    if (!dst || !src) return ds_error_set(DS_ERR_ARG, "cpu-ref: %s with a NULL buffer", what);
    memcpy(dst, src, bytes);
    return DS_OK;
}

static enum ds_status ref_upload(struct ds_backend *be, void *dst, const void *host_src,
                                 size_t bytes) {
    (void)be;
    return ref_copy(dst, host_src, bytes, "upload");
}

static enum ds_status ref_download(struct ds_backend *be, void *host_dst, const void *src,
                                   size_t bytes) {
    (void)be;
    return ref_copy(host_dst, src, bytes, "download");
}

static enum ds_status ref_memset(struct ds_backend *be, void *dst, int value, size_t bytes) {
    (void)be;
    if (bytes == 0) return DS_OK;
    if (!dst) return ds_error_set(DS_ERR_ARG, "cpu-ref: memset of a NULL buffer");
    if (value < 0 || value > 255)
        return ds_error_set(DS_ERR_ARG, "cpu-ref: memset value %d outside 0..255", value);
    memset(dst, value, bytes);
    return DS_OK;
}

static enum ds_status ref_copy_2d(struct ds_backend *be, void *dst, size_t dst_pitch,
                                  const void *src, size_t src_pitch, size_t width, size_t rows) {
    (void)be;
    if (width == 0 || rows == 0) return DS_OK;
    if (!dst || !src) return ds_error_set(DS_ERR_ARG, "cpu-ref: copy_2d with a NULL buffer");
    if (width > dst_pitch || width > src_pitch)
        return ds_error_set(DS_ERR_ARG, "cpu-ref: copy_2d width %zu exceeds pitch %zu / %zu",
                            width, dst_pitch, src_pitch);
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
    return DS_OK;
}

static enum ds_status ref_sync(struct ds_backend *be) {
    (void)be;
    return DS_OK;
}

// Each op entry forwards to its reference function; the CPU needs no backend state.
#define REF_OP(op)                                                                                 \
    static enum ds_status ref_##op(struct ds_backend *be, const struct ds_##op##_args *a) {       \
        (void)be;                                                                                  \
        if (!a) return ds_error_set(DS_ERR_ARG, "cpu-ref: " #op " called without arguments");     \
        return ds_##op##_ref(a);                                                                   \
    }
REF_OP(embed)
REF_OP(rmsnorm)
REF_OP(matmul)
REF_OP(add)
REF_OP(silu_mul)
REF_OP(gather_rows)
REF_OP(rope)
REF_OP(attention)
REF_OP(router)
REF_OP(moe)
REF_OP(softmax)
REF_OP(argmax)
REF_OP(topk)
REF_OP(entropy)
REF_OP(overlap)
REF_OP(vocab_scatter)

static void ref_release(struct ds_backend *be) {
    free(be);
}

static const struct ds_backend ref_table = {
    .api_version = DS_BACKEND_API_VERSION,
    .name = "cpu-ref",
    .ctx = NULL,
    .act = DS_ELEM_F32,
    .alloc = ref_alloc,
    .free = ref_free,
    .map_host = ref_map_host,
    .upload = ref_upload,
    .download = ref_download,
    .memset = ref_memset,
    .copy_2d = ref_copy_2d,
    .sync = ref_sync,
    .embed = ref_embed,
    .rmsnorm = ref_rmsnorm,
    .matmul = ref_matmul,
    .add = ref_add,
    .silu_mul = ref_silu_mul,
    .gather_rows = ref_gather_rows,
    .rope = ref_rope,
    .attention = ref_attention,
    .router = ref_router,
    .moe = ref_moe,
    .softmax = ref_softmax,
    .argmax = ref_argmax,
    .topk = ref_topk,
    .entropy = ref_entropy,
    .overlap = ref_overlap,
    .vocab_scatter = ref_vocab_scatter,
    .release = ref_release,
};

enum ds_status ds_backend_ref_create(struct ds_backend **be_out) {
    *be_out = NULL;
    struct ds_backend *be = malloc(sizeof *be);
    if (!be) return ds_error_set(DS_ERR_NOMEM, "cpu-ref: out of memory creating the backend");
    *be = ref_table;
    *be_out = be;
    return DS_OK;
}
