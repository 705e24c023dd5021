// kernels/cuda/backend_cuda.cu: the CUDA backend object (ds/backend.h table) and the seeded
// device fills used by GPU tests and `draftscope bench`.
//
// State: the device ordinal, one non-blocking stream that every entry queues on, and a table of
// live allocations (pointer, bytes) for the memory plan: live bytes, the high-water mark and the
// live count (ds_backend_cuda_memory). Allocation is cudaMalloc (256-byte aligned) and happens only
// while the model plans its memory, never inside a step, so a linear table is plenty.
//
// Errors: argument problems (NULL buffers, width beyond pitch, a pointer cudaMemcpy rejects) are a
// ds_status with a one-line message; an allocation that does not fit is DS_ERR_NOMEM; any other
// CUDA failure means a broken runtime or an earlier faulting kernel and is fatal (ds_fatal names
// the call). After every op the dispatcher checks the launch once more and names the op.
//
// upload returns when the host buffer may be reused: cudaMemcpyAsync from pageable memory has
// staged the bytes before it returns; from page-locked memory it is truly asynchronous, so upload
// then waits for the stream. download always waits.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "ds/device.h"
#include "ds/kernels_cuda.h"

struct cuda_alloc {
    void *ptr;
    size_t bytes;
};

struct cuda_ctx {
    int device;
    int sms;                   // streaming multiprocessors (the batch-variant split heuristic)
    enum ds_numerics numerics; // DS_NUMERICS_INVARIANT unless set
    cudaStream_t stream;
    struct cuda_alloc *allocs; // live allocations, unordered
    size_t n_allocs, cap_allocs;
    size_t live_bytes, peak_bytes;
};

static const char be_name[] = "cuda";

static struct cuda_ctx *ctx_of(const struct ds_backend *be) {
    return be && be->name == be_name ? (struct cuda_ctx *)be->ctx : NULL;
}

// Status of a CUDA runtime call that may fail because of its arguments; other failures are fatal.
static enum ds_status cuda_status(cudaError_t e, const char *what, const char *expr,
                                  const char *func, int line) {
    if (e == cudaSuccess) return DS_OK;
    if (e == cudaErrorInvalidValue || e == cudaErrorInvalidDevicePointer ||
        e == cudaErrorInvalidPitchValue || e == cudaErrorInvalidMemcpyDirection) {
        cudaGetLastError(); // these are not sticky; clear them so the next launch check is clean
        return ds_error_set(DS_ERR_ARG, "cuda: %s rejected: %s", what, cudaGetErrorString(e));
    }
    ds_fatal("CUDA call", expr, cudaGetErrorString(e), func, __FILE__, line);
}
#define CUDA_STATUS(what, expr) cuda_status((expr), what, #expr, __func__, __LINE__)

// ---------------------------------------------------------------------------------------------
// Memory

static enum ds_status cuda_alloc_fn(struct ds_backend *be, size_t bytes, void **buf_out) {
    struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
    *buf_out = NULL;
    if (bytes == 0) return ds_error_set(DS_ERR_ARG, "cuda: allocation of 0 bytes");
    if (c->n_allocs == c->cap_allocs) {
        size_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void *grown = realloc(c->allocs, cap * sizeof *c->allocs);
        if (!grown) return ds_error_set(DS_ERR_NOMEM, "cuda: out of host memory for the table");
        c->allocs = (struct cuda_alloc *)grown;
        c->cap_allocs = cap;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return ds_error_set(DS_ERR_NOMEM,
                            "cuda: cannot allocate %zu bytes on GPU %d (%s; %zu of %zu bytes free,"
                            " %zu allocated by this backend)",
                            bytes, c->device, cudaGetErrorString(e), free_b, total_b,
                            c->live_bytes);
    }
    c->allocs[c->n_allocs++] = (struct cuda_alloc){p, bytes};
    c->live_bytes += bytes;
    if (c->live_bytes > c->peak_bytes) c->peak_bytes = c->live_bytes;
    *buf_out = p;
    return DS_OK;
}

static void cuda_free_fn(struct ds_backend *be, void *buf) {
    struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
    if (!buf) return;
    for (size_t i = 0; i < c->n_allocs; i++) {
        if (c->allocs[i].ptr != buf) continue;
        // Queued ops may still read the buffer: cudaFree waits for the device.
        DS_CUDA_CHECK(cudaFree(buf));
        c->live_bytes -= c->allocs[i].bytes;
        c->allocs[i] = c->allocs[--c->n_allocs];
        return;
    }
    DS_ASSERT(!"cuda free of a pointer this backend did not allocate");
}

static enum ds_status cuda_upload(struct ds_backend *be, void *dst, const void *host_src,
                                  size_t bytes) {
    struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
    if (bytes == 0) return DS_OK;
    if (!dst || !host_src) return ds_error_set(DS_ERR_ARG, "cuda: upload with a NULL buffer");
    CU_TRY(CUDA_STATUS("upload",
                       cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream)));
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, host_src) == cudaSuccess && attr.type == cudaMemoryTypeHost)
        DS_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cudaGetLastError(); // pageable memory makes cudaPointerGetAttributes fail on old runtimes
    return DS_OK;
}

static enum ds_status cuda_download(struct ds_backend *be, void *host_dst, const void *src,
                                    size_t bytes) {
    struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
    if (bytes == 0) return DS_OK;
    if (!host_dst || !src) return ds_error_set(DS_ERR_ARG, "cuda: download with a NULL buffer");
    CU_TRY(CUDA_STATUS("download",
                       cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)));
    DS_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return DS_OK;
}

static enum ds_status cuda_memset_fn(struct ds_backend *be, void *dst, int value, size_t bytes) {
    struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
    if (bytes == 0) return DS_OK;
    if (!dst) return ds_error_set(DS_ERR_ARG, "cuda: memset of a NULL buffer");
    if (value < 0 || value > 255)
        return ds_error_set(DS_ERR_ARG, "cuda: memset value %d outside 0..255", value);
    return CUDA_STATUS("memset", cudaMemsetAsync(dst, value, bytes, c->stream));
}

static enum ds_status cuda_copy_2d(struct ds_backend *be, void *dst, size_t dst_pitch,
                                   const void *src, size_t src_pitch, size_t width, size_t rows) {
    struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
    if (width == 0 || rows == 0) return DS_OK;
    if (!dst || !src) return ds_error_set(DS_ERR_ARG, "cuda: copy_2d with a NULL buffer");
    if (width > dst_pitch || width > src_pitch)
        return ds_error_set(DS_ERR_ARG, "cuda: copy_2d width %zu exceeds pitch %zu / %zu", width,
                            dst_pitch, src_pitch);
    return CUDA_STATUS("copy_2d", cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                                    cudaMemcpyDeviceToDevice, c->stream));
}

static enum ds_status cuda_sync(struct ds_backend *be) {
    DS_CUDA_CHECK(cudaStreamSynchronize(((struct cuda_ctx *)be->ctx)->stream));
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Ops: each entry forwards to ds_<op>_cuda on the backend's stream, then checks the launch once
// more naming the op (conventions: one check per op in the dispatcher).

static void op_check(const char *op) {
    cudaError_t e = cudaPeekAtLastError();
    if (e != cudaSuccess) ds_fatal("CUDA op", op, cudaGetErrorString(e), __func__, __FILE__, __LINE__);
}

#define CUDA_OP(op)                                                                                \
    static enum ds_status cuda_##op(struct ds_backend *be, const struct ds_##op##_args *a) {      \
        if (!a) return ds_error_set(DS_ERR_ARG, "cuda: " #op " called without arguments");        \
        enum ds_status s = ds_##op##_cuda(a, ((struct cuda_ctx *)be->ctx)->stream);              \
        op_check(#op);                                                                             \
        return s;                                                                                  \
    }
CUDA_OP(embed)
CUDA_OP(rmsnorm)
CUDA_OP(matmul)
CUDA_OP(add)
CUDA_OP(silu_mul)
CUDA_OP(gather_rows)
CUDA_OP(rope)

// Attention under the backend's numerics: batch-variant sets the split of a call's rows from
// the call's size (ds_attention_variant_splits) where the caller left it to the backend.
static enum ds_status cuda_attention(struct ds_backend *be, const struct ds_attention_args *a) {
    if (!a) return ds_error_set(DS_ERR_ARG, "cuda: attention called without arguments");
    const struct cuda_ctx *c = (const struct cuda_ctx *)be->ctx;
    struct ds_attention_args v = *a;
    if (c->numerics == DS_NUMERICS_BATCH_VARIANT && v.max_splits == 0)
        v.max_splits = ds_attention_variant_splits(v.n_rows, v.n_kv_heads, c->sms);
    enum ds_status s = ds_attention_cuda(&v, c->stream);
    op_check("attention");
    return s;
}
CUDA_OP(router)
CUDA_OP(moe)
CUDA_OP(softmax)
CUDA_OP(argmax)
CUDA_OP(topk)
CUDA_OP(entropy)
CUDA_OP(overlap)
CUDA_OP(vocab_scatter)

static void cuda_release(struct ds_backend *be) {
    struct cuda_ctx *c = ctx_of(be);
    if (c) {
        cudaStreamSynchronize(c->stream);
        if (c->n_allocs)
            fprintf(stderr, "draftscope: cuda backend released with %zu buffers (%zu bytes) still"
                            " allocated; freeing them\n",
                    c->n_allocs, c->live_bytes);
        for (size_t i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i].ptr);
        cudaStreamDestroy(c->stream);
        free(c->allocs);
        memset(c, 0, sizeof *c);
        free(c);
    }
    memset(be, 0, sizeof *be);
    free(be);
}

static const struct ds_backend cuda_table = {
    DS_BACKEND_API_VERSION, // api_version
    be_name,                // name
    NULL,                   // ctx
    DS_ELEM_BF16,           // act
    cuda_alloc_fn,          // alloc
    cuda_free_fn,           // free
    NULL,                   // map_host: weights are uploaded
    cuda_upload,            // upload
    cuda_download,          // download
    cuda_memset_fn,         // memset
    cuda_copy_2d,           // copy_2d
    cuda_sync,              // sync
    cuda_embed,             // embed
    cuda_rmsnorm,           // rmsnorm
    cuda_matmul,            // matmul
    cuda_add,               // add
    cuda_silu_mul,          // silu_mul
    cuda_gather_rows,       // gather_rows
    cuda_rope,              // rope
    cuda_attention,         // attention
    cuda_router,            // router
    cuda_moe,               // moe
    cuda_softmax,           // softmax
    cuda_argmax,            // argmax
    cuda_topk,              // topk
    cuda_entropy,           // entropy
    cuda_overlap,           // overlap
    cuda_vocab_scatter,     // vocab_scatter
    cuda_release,           // release
};

__global__ void fill_bytes_kernel(uint8_t *buf, size_t n, uint64_t seed, int lo, int hi);

extern "C" enum ds_status ds_backend_cuda_create(int device, struct ds_backend **be_out) {
    *be_out = NULL;
    const enum ds_status st = ds_cuda_device_check(device);
    if (st != DS_OK) return st;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ds_error_set(DS_ERR_NODEVICE, "cuda: cannot use GPU %d (%s)", device,
                            cudaGetErrorString(e));
    }
    // A GPU this build has no kernel image for (it is built for sm_90) is refused here; it
    // failed fatally at the first kernel, after the whole weight upload.
    cudaFuncAttributes fa;
    e = cudaFuncGetAttributes(&fa, fill_bytes_kernel);
    if (e != cudaSuccess) {
        cudaGetLastError();
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        cudaGetLastError();
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "cuda: GPU %d (compute capability %d.%d) cannot run this build's "
                            "kernels (%s)",
                            device, major, minor, cudaGetErrorString(e));
    }
    struct ds_backend *be = (struct ds_backend *)malloc(sizeof *be);
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return ds_error_set(DS_ERR_NOMEM, "cuda: out of host memory creating the backend");
    }
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        free(be);
        free(c);
        return ds_error_set(DS_ERR_NODEVICE, "cuda: cannot create a stream on GPU %d (%s)",
                            device, cudaGetErrorString(e));
    }
    c->device = device;
    c->numerics = DS_NUMERICS_INVARIANT;
    if (cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        cudaGetLastError(), c->sms = 1;
    *be = cuda_table;
    be->ctx = c;
    *be_out = be;
    return DS_OK;
}

extern "C" int ds_attention_variant_splits(int n_rows, int n_kv_heads, int sms) {
    // One block per (row, KV head) without a split, as the attention launches at 8 query heads
    // per block: a call that already fills 80% of the SMs gets none, a smaller one as many as
    // fill them once, up to the 16 of the invariant split.
    const long long blocks =
        (long long)(n_rows > 0 ? n_rows : 1) * (n_kv_heads > 0 ? n_kv_heads : 1);
    if (sms < 1 || blocks * 5 >= (long long)sms * 4) return 1;
    const long long n = ((long long)sms + blocks - 1) / blocks;
    return n > 16 ? 16 : (int)n;
}

extern "C" enum ds_status ds_backend_cuda_set_numerics(struct ds_backend *be,
                                                       enum ds_numerics numerics) {
    struct cuda_ctx *c = ctx_of(be);
    if (!c) return ds_error_set(DS_ERR_ARG, "cuda: numerics set on a backend that is not CUDA");
    if (numerics != DS_NUMERICS_INVARIANT && numerics != DS_NUMERICS_BATCH_VARIANT)
        return ds_error_set(DS_ERR_ARG, "cuda: numerics %d is not a mode", (int)numerics);
    c->numerics = numerics;
    return DS_OK;
}

extern "C" void *ds_backend_cuda_stream(const struct ds_backend *be) {
    struct cuda_ctx *c = ctx_of(be);
    return c ? (void *)c->stream : NULL;
}

extern "C" enum ds_status ds_backend_cuda_memory(const struct ds_backend *be,
                                                 size_t *live_bytes_out, size_t *peak_bytes_out,
                                                 size_t *live_count_out) {
    struct cuda_ctx *c = ctx_of(be);
    if (!c) return ds_error_set(DS_ERR_ARG, "cuda: memory query on a backend that is not CUDA");
    if (live_bytes_out) *live_bytes_out = c->live_bytes;
    if (peak_bytes_out) *peak_bytes_out = c->peak_bytes;
    if (live_count_out) *live_count_out = c->n_allocs;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Seeded fills: element i gets a value from a counter-based hash of (seed, i), so the contents do
// not depend on the launch shape and a test can recompute any element on the host
// (ds_fill_value in ds/kernels_cuda.h).

__global__ void fill_uniform_kernel(void *buf, enum ds_elem dtype, size_t n, uint64_t seed,
                                    float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_elem(buf, dtype, i, ds_fill_value(seed, i, lo, hi));
}

__global__ void fill_bytes_kernel(uint8_t *buf, size_t n, uint64_t seed, int lo, int hi) {
    const uint32_t span = (uint32_t)(hi - lo + 1);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        buf[i] = (uint8_t)(lo + (int)(ds_fill_hash(seed, i) % span));
}

extern "C" enum ds_status ds_cuda_fill_uniform(void *buf, enum ds_elem dtype, size_t n,
                                               uint64_t seed, float lo, float hi, void *stream) {
    if (n == 0) return DS_OK;
    if (!buf) return ds_error_set(DS_ERR_ARG, "fill: NULL buffer");
    CU_TRY(cu_check_dtype("fill", "buffer", dtype));
    if (!(lo <= hi)) return ds_error_set(DS_ERR_ARG, "fill: range [%g, %g] is empty", lo, hi);
    fill_uniform_kernel<<<cu_blocks(n < 1u << 24 ? n : 1u << 24, 256), 256, 0,
                          DS_STREAM(stream)>>>(buf, dtype, n, seed, lo, hi);
    DS_KERNEL_CHECK();
    return DS_OK;
}

extern "C" enum ds_status ds_cuda_fill_bytes(uint8_t *buf, size_t n, uint64_t seed, int lo, int hi,
                                             void *stream) {
    if (n == 0) return DS_OK;
    if (!buf) return ds_error_set(DS_ERR_ARG, "fill: NULL buffer");
    if (lo < 0 || hi > 255 || lo > hi)
        return ds_error_set(DS_ERR_ARG, "fill: byte range [%d, %d] not inside [0, 255]", lo, hi);
    fill_bytes_kernel<<<cu_blocks(n < 1u << 24 ? n : 1u << 24, 256), 256, 0,
                        DS_STREAM(stream)>>>(buf, n, seed, lo, hi);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// Programmatic dependent launch switch of ds_launch (common.cuh): on unless DS_PDL=0.
int ds_pdl_enabled(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *e = getenv("DS_PDL");
        cached = !(e && e[0] == '0' && e[1] == 0);
    }
    return cached;
}
