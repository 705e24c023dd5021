// ds/kernels_cuda.h: the CUDA ops and the CUDA backend object.
//
// Each ds_<op>_cuda takes the same argument struct as its CPU twin ds_<op>_ref (ds/kernel_args.h
// holds the shapes, the math and the aliasing rules) plus the cudaStream_t to queue on, passed as
// void * so that this header compiles as plain C without the CUDA headers. NULL is the legacy
// default stream. Every pointer in the struct is device memory (cudaMalloc'd, possibly offset).
//
// Contract shared by every op:
// - act may be DS_ELEM_BF16 (the CUDA default: bf16 storage, fp32 math) or DS_ELEM_F32 (for
//   comparisons against the CPU reference on identical inputs, and for fp32 runs).
// - Host-side argument checks (dtypes, dims, NULL pointers, limits) return DS_ERR_ARG or
//   DS_ERR_UNSUPPORTED with a one-line message naming the op, before anything is queued.
//   Device-side data (ids, positions, sequence tables, maps) is trusted: the ops never read
//   device memory back to validate it, so an out-of-range id clamps or is skipped as the op's
//   header comment in kernels/cuda/ says, it never faults.
// - Launch-configuration errors are fatal (DS_KERNEL_CHECK); execution errors surface at the next
//   synchronising call.
// - Deterministic and batch invariant: the reduction order of every output element is fixed and
//   does not depend on the number of rows, so a row's result is bitwise the same alone or inside
//   any batch. No atomics in reductions.
// - No allocation, no synchronous copy: workspaces come from the caller.
// - Thread-safety: the functions keep no host state; the stream serialises work.
#ifndef DS_KERNELS_CUDA_H
#define DS_KERNELS_CUDA_H

#include <stddef.h>

#include "ds/backend.h"
#include "ds/kernel_args.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// Ops (kernels/cuda/*.cu). `stream` is a cudaStream_t.

// dense.cu
enum ds_status ds_embed_cuda(const struct ds_embed_args *a, void *stream);
enum ds_status ds_rmsnorm_cuda(const struct ds_rmsnorm_args *a, void *stream);
enum ds_status ds_matmul_cuda(const struct ds_matmul_args *a, void *stream);
enum ds_status ds_add_cuda(const struct ds_add_args *a, void *stream);
enum ds_status ds_silu_mul_cuda(const struct ds_silu_mul_args *a, void *stream);
enum ds_status ds_gather_rows_cuda(const struct ds_gather_rows_args *a, void *stream);
// rope.cu
enum ds_status ds_rope_cuda(const struct ds_rope_args *a, void *stream);
// attention.cu
enum ds_status ds_attention_cuda(const struct ds_attention_args *a, void *stream);
// router / moe (MXFP4 experts)
enum ds_status ds_router_cuda(const struct ds_router_args *a, void *stream);
enum ds_status ds_moe_cuda(const struct ds_moe_args *a, void *stream);
// vocab.cu
enum ds_status ds_softmax_cuda(const struct ds_softmax_args *a, void *stream);
enum ds_status ds_argmax_cuda(const struct ds_argmax_args *a, void *stream);
enum ds_status ds_topk_cuda(const struct ds_topk_args *a, void *stream);
enum ds_status ds_entropy_cuda(const struct ds_entropy_args *a, void *stream);
enum ds_status ds_overlap_cuda(const struct ds_overlap_args *a, void *stream);
enum ds_status ds_vocab_scatter_cuda(const struct ds_vocab_scatter_args *a, void *stream);

// ---------------------------------------------------------------------------------------------
// Backend object (kernels/cuda/backend_cuda.cu)

// Creates the CUDA backend on `device` (a CUDA ordinal): its own non-blocking stream, act =
// DS_ELEM_BF16, map_host = NULL (weights are uploaded). alloc is cudaMalloc (256-byte aligned),
// upload/memset/copy_2d queue on the stream, download queues then waits. Returns DS_ERR_NODEVICE
// when the device cannot be used (message from the runtime), DS_ERR_NOMEM when host memory for the
// object is short. *be_out is NULL on failure. Release with ds_backend_release after freeing every
// buffer; buffers still allocated at release are freed then (and reported as a leak on stderr).
enum ds_status ds_backend_cuda_create(int device, struct ds_backend **be_out);

// The backend's cudaStream_t (as void *), for CUDA-graph capture and tracing; NULL when be is not
// a CUDA backend.
void *ds_backend_cuda_stream(const struct ds_backend *be);

// Device-memory accounting of a CUDA backend (the memory plan): bytes currently allocated through
// be->alloc, the high-water mark since creation, and the number of live allocations. Every
// out-param may be NULL. DS_ERR_ARG (outputs untouched) when be is not a CUDA backend.
enum ds_status ds_backend_cuda_memory(const struct ds_backend *be, size_t *live_bytes_out,
                                      size_t *peak_bytes_out, size_t *live_count_out);

#ifdef __cplusplus
}
#endif
#endif // DS_KERNELS_CUDA_H
