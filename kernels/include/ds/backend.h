// ds/backend.h: the backend table, the one interface between the model code and the kernels.
//
// The gpt-oss and EAGLE-3 forward passes (models/) are straight-line code over a struct ds_backend:
// they allocate every buffer through it once (weights, activations, KV caches, workspaces: memory
// is planned up front), upload inputs, call ops, and download results. They never dereference a
// buffer themselves, so the same model code runs on the CPU reference (host memory, OpenMP) and
// on CUDA (device memory, one stream, no host round trip inside a step).
//
// Conventions for every entry:
// - Buffers are opaque device pointers returned by alloc (or map_host). Byte offsets into them are
//   valid buffers too (`(char *)buf + off`), which is how an arena is carved into named tensors.
// - Every entry returns enum ds_status; failures record a one-line message (ds_error_last()).
// - Ops are queued in order on the backend's stream; download and sync wait for them. On the CPU
//   every call completes before it returns.
// - An entry documented "(optional)" may be NULL; check before calling.
// - Ops take the argument structs of ds/kernel_args.h; the documented math lives there.
// - Thread-safety: a backend object is used by one host thread at a time.
//
// Version: api_version == DS_BACKEND_API_VERSION of the headers the backend was built with.
// A caller built against another version must refuse the backend (ds_backend_check).
#ifndef DS_BACKEND_H
#define DS_BACKEND_H

#include <stddef.h>

#include "ds/kernel_args.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_BACKEND_API_VERSION 1

struct ds_backend {
    int api_version;  // DS_BACKEND_API_VERSION
    const char *name; // "cpu-ref", "cuda", ...
    void *ctx;        // the backend's own state

    // Default activation dtype of this backend's ops (DS_ELEM_F32 on the CPU reference,
    // DS_ELEM_BF16 on CUDA). The model allocates activations and fills `act` fields with it.
    enum ds_elem act;

    // ---- memory ----
    // Allocates `bytes` of device memory (contents undefined; aligned to at least 256 bytes).
    // bytes == 0 is DS_ERR_ARG. *buf_out is NULL on failure (DS_ERR_NOMEM).
    enum ds_status (*alloc)(struct ds_backend *be, size_t bytes, void **buf_out);
    // Frees a buffer from alloc; NULL is a no-op. Never pass a map_host buffer or an offset.
    void (*free)(struct ds_backend *be, void *buf);
    // (optional) Makes read-only host memory (e.g. an mmapped checkpoint tensor) usable as a
    // device buffer without a copy. The CPU reference returns the host pointer itself; backends
    // that cannot do this leave the entry NULL and the caller allocs + uploads. The host memory
    // must outlive every use; there is nothing to free.
    enum ds_status (*map_host)(struct ds_backend *be, const void *host, size_t bytes,
                               const void **buf_out);
    // Copies host → device / device → host. download waits for queued ops first.
    enum ds_status (*upload)(struct ds_backend *be, void *dst, const void *host_src, size_t bytes);
    enum ds_status (*download)(struct ds_backend *be, void *host_dst, const void *src,
                               size_t bytes);
    // Sets `bytes` bytes of dst to `value` (0..255).
    enum ds_status (*memset)(struct ds_backend *be, void *dst, int value, size_t bytes);
    // Device → device copy of `rows` rows of `width` bytes with independent pitches (bytes between
    // row starts), like cudaMemcpy2D: concatenations such as [norm(e) | norm(h)] and the aux-state
    // concat of EAGLE-3 are written with it. Source and destination must not overlap.
    enum ds_status (*copy_2d)(struct ds_backend *be, void *dst, size_t dst_pitch,
                              const void *src, size_t src_pitch, size_t width, size_t rows);
    // Waits until every queued op has finished (no-op on the CPU).
    enum ds_status (*sync)(struct ds_backend *be);

    // ---- ops (math, shapes and aliasing rules: ds/kernel_args.h) ----
    enum ds_status (*embed)(struct ds_backend *be, const struct ds_embed_args *a);
    enum ds_status (*rmsnorm)(struct ds_backend *be, const struct ds_rmsnorm_args *a);
    enum ds_status (*matmul)(struct ds_backend *be, const struct ds_matmul_args *a);
    enum ds_status (*add)(struct ds_backend *be, const struct ds_add_args *a);
    enum ds_status (*silu_mul)(struct ds_backend *be, const struct ds_silu_mul_args *a);
    enum ds_status (*gather_rows)(struct ds_backend *be, const struct ds_gather_rows_args *a);
    enum ds_status (*rope)(struct ds_backend *be, const struct ds_rope_args *a);
    enum ds_status (*attention)(struct ds_backend *be, const struct ds_attention_args *a);
    enum ds_status (*router)(struct ds_backend *be, const struct ds_router_args *a);
    enum ds_status (*moe)(struct ds_backend *be, const struct ds_moe_args *a);
    enum ds_status (*softmax)(struct ds_backend *be, const struct ds_softmax_args *a);
    enum ds_status (*argmax)(struct ds_backend *be, const struct ds_argmax_args *a);
    enum ds_status (*topk)(struct ds_backend *be, const struct ds_topk_args *a);
    enum ds_status (*entropy)(struct ds_backend *be, const struct ds_entropy_args *a);
    enum ds_status (*overlap)(struct ds_backend *be, const struct ds_overlap_args *a);
    enum ds_status (*vocab_scatter)(struct ds_backend *be, const struct ds_vocab_scatter_args *a);

    // Frees the backend object itself (not the buffers: free them first).
    void (*release)(struct ds_backend *be);
};

// Creates the CPU reference backend (host memory, OpenMP, fp32 activations). OpenMP uses its
// usual thread count (OMP_NUM_THREADS); results do not depend on it. *be_out is NULL on failure.
enum ds_status ds_backend_ref_create(struct ds_backend **be_out);

// DS_OK when be is non-NULL, has the api_version of these headers and every mandatory entry;
// DS_ERR_MISMATCH naming the backend and the problem otherwise.
enum ds_status ds_backend_check(const struct ds_backend *be);

// Calls be->release; NULL is a no-op.
void ds_backend_release(struct ds_backend *be);

// Bytes per element of a dtype (0 for an invalid value).
size_t ds_elem_size(enum ds_elem e);

#ifdef __cplusplus
}
#endif
#endif // DS_BACKEND_H
