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

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/backend.h"
#include "ds/hd.h"
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
// Whether the attention kernels are built for this head size (16, 32, 64 or 128): 1 or 0.
int ds_attention_cuda_head_dim_ok(int head_dim);
// router / moe (MXFP4 experts)
enum ds_status ds_router_cuda(const struct ds_router_args *a, void *stream);
enum ds_status ds_moe_cuda(const struct ds_moe_args *a, void *stream);
// Bytes of device workspace ds_moe_cuda needs for n_rows rows (plan it once for the largest step;
// larger than the reference's ds_moe_workspace_bytes). 0 for a non-positive argument.
size_t ds_moe_cuda_workspace_bytes(int n_rows, int dim, int inter, int n_experts, int top_k);
// Decodes n_rows MXFP4 rows of k_dim elements to f32 on the device, bit-exact with
// ds_mxfp4_dequant_ref (tests, inspection).
enum ds_status ds_mxfp4_dequant_cuda(const uint8_t *blocks, const uint8_t *scales, int n_rows,
                                     int k_dim, float *out, void *stream);
// vocab.cu
enum ds_status ds_softmax_cuda(const struct ds_softmax_args *a, void *stream);
enum ds_status ds_argmax_cuda(const struct ds_argmax_args *a, void *stream);
enum ds_status ds_topk_cuda(const struct ds_topk_args *a, void *stream);
enum ds_status ds_entropy_cuda(const struct ds_entropy_args *a, void *stream);
enum ds_status ds_overlap_cuda(const struct ds_overlap_args *a, void *stream);
enum ds_status ds_vocab_scatter_cuda(const struct ds_vocab_scatter_args *a, void *stream);
// read.cu: the bench's read instrument. a->pieces is a device copy of a table that ds_read_plan
// filled (the op trusts it), a->n_blocks its total. It reads the table and the pieces before its
// grid dependency: neither may be written by the two kernels before it on the stream.
enum ds_status ds_read_cuda(const struct ds_read_args *a, void *stream);
// Drops the L2 lines of the whole 128-byte lines inside [p, p + bytes) without writing them back:
// their contents become undefined. For the bench's L2 flush buffer only (read.cu).
enum ds_status ds_l2_discard_cuda(void *p, size_t bytes, void *stream);

// ---------------------------------------------------------------------------------------------
// Backend object (kernels/cuda/backend_cuda.cu)

// Creates the CUDA backend on `device` (a CUDA ordinal): its own non-blocking stream, act =
// DS_ELEM_BF16, map_host = NULL (weights are uploaded). alloc is cudaMalloc (256-byte aligned),
// upload/memset/copy_2d queue on the stream, download queues then waits. Returns DS_ERR_NODEVICE
// when the device cannot be used (ds_cuda_device_check's message: the runtime's reason),
// DS_ERR_NOMEM when host memory for the object is short. *be_out is NULL on failure. Release with
// ds_backend_release after freeing every buffer; buffers still allocated at release are freed then
// (and reported as a leak on stderr).
enum ds_status ds_backend_cuda_create(int device, struct ds_backend **be_out);

// Numerics of a CUDA backend. INVARIANT (the default, the tool's premise): every op's bits
// depend only on a row's own inputs, never on the call's size. BATCH_VARIANT lets an op choose
// its reduction by the call's size, as serving engines do, to measure how much acceptance moves
// with numerics alone: today the attention's split of a row's keys (flash-decoding's choice,
// ds_attention_variant_splits); the dense products and the MoE keep their invariant order.
enum ds_numerics {
    DS_NUMERICS_INVARIANT = 0,
    DS_NUMERICS_BATCH_VARIANT = 1,
};
// DS_ERR_ARG when be is not a CUDA backend or the mode is not one of the above.
enum ds_status ds_backend_cuda_set_numerics(struct ds_backend *be, enum ds_numerics numerics);
// The batch-variant attention split (ds_attention_args.max_splits) of a call of n_rows rows and
// n_kv_heads KV heads on a GPU of `sms` SMs: 1 when the call's n_rows·n_kv_heads blocks fill at
// least 80% of the SMs, else ceil(sms / blocks) up to 16 (H200, 132 SMs, 8 KV heads: 16 at 1
// row, 5 at 4 rows, 1 from 14 rows on).
int ds_attention_variant_splits(int n_rows, int n_kv_heads, int sms);

// The backend's cudaStream_t (as void *), for CUDA-graph capture and tracing; NULL when be is not
// a CUDA backend.
void *ds_backend_cuda_stream(const struct ds_backend *be);

// Device-memory accounting of a CUDA backend (the memory plan): bytes currently allocated through
// be->alloc, the high-water mark since creation, and the number of live allocations. Every
// out-param may be NULL. DS_ERR_ARG (outputs untouched) when be is not a CUDA backend.
enum ds_status ds_backend_cuda_memory(const struct ds_backend *be, size_t *live_bytes_out,
                                      size_t *peak_bytes_out, size_t *live_count_out);

// ---------------------------------------------------------------------------------------------
// Seeded device fills (GPU tests and `draftscope bench`: every input byte is filled from a seed)

// Counter-based hash of (seed, i): splitmix64 of the pair. Host and device give the same bits.
DS_HD uint64_t ds_fill_hash(uint64_t seed, uint64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Element i of ds_cuda_fill_uniform(seed, lo, hi) before rounding to the buffer's dtype: a float
// in [lo, hi] (24 random bits, one fused multiply-add, identical on host and device).
DS_HD float ds_fill_value(uint64_t seed, uint64_t i, float lo, float hi) {
    float u = (float)(ds_fill_hash(seed, i) >> 40) * 0x1p-24f;
    return fmaf(hi - lo, u, lo);
}

// Fills n elements of buf (f32, or bf16 rounded to nearest even) with ds_fill_value(seed, i, lo,
// hi), queued on `stream`. DS_ERR_ARG for a NULL buffer, a bad dtype or lo > hi.
enum ds_status ds_cuda_fill_uniform(void *buf, enum ds_elem dtype, size_t n, uint64_t seed,
                                    float lo, float hi, void *stream);

// Fills n bytes with lo + ds_fill_hash(seed, i) % (hi − lo + 1), 0 <= lo <= hi <= 255 (MXFP4
// codes and scales for benchmarks), queued on `stream`.
enum ds_status ds_cuda_fill_bytes(uint8_t *buf, size_t n, uint64_t seed, int lo, int hi,
                                  void *stream);

#ifdef __cplusplus
}
#endif
#endif // DS_KERNELS_CUDA_H
