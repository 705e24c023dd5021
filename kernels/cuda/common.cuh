// kernels/cuda/common.cuh: device helpers shared by the CUDA ops (kernels/cuda/*.cu).
//
// What is here:
// - element loads/stores for the two activation dtypes (ds_bf16 bits and float), by overload and
//   by run-time dtype; bf16 rounding is ds/bf16.h's round-to-nearest-even, so device and host
//   round identically;
// - warp and block reductions with a FIXED tree (xor butterfly inside a warp, then warp 0 over the
//   per-warp values): for a given block size the result is a pure function of the inputs, which is
//   what makes every reduction deterministic and batch invariant (never atomics on floats);
// - a streaming 16-byte load for weights that are read once (no L1 allocation);
// - the order-preserving integer key of a float used by the vocabulary selections;
// - host-side argument checks shared by the launchers ("<op>: <problem>" messages).
//
// Included by .cu files only (nvcc). The reductions assume blockDim.x is a multiple of 32 and at
// most 1024, and that every thread of the block calls them (they contain __syncthreads).
#ifndef DS_CUDA_COMMON_CUH
#define DS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "ds/bf16.h"
#include "ds/check.h"
#include "ds/kernel_args.h"
#include "ds/status.h"

#define DS_WARP 32
#define DS_FULL_MASK 0xffffffffu

// The void * stream of the public API as a cudaStream_t.
#define DS_STREAM(s) ((cudaStream_t)(s))

// ---------------------------------------------------------------------------------------------
// Element access

static __device__ __forceinline__ float ld_f(const float *p, size_t i) { return p[i]; }
static __device__ __forceinline__ float ld_f(const ds_bf16 *p, size_t i) {
    return ds_bf16_to_f32(p[i]);
}
static __device__ __forceinline__ void st_f(float *p, size_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st_f(ds_bf16 *p, size_t i, float v) {
    p[i] = ds_f32_to_bf16(v);
}

// Element i of a buffer whose dtype is known only at run time (small tensors: gains, biases).
static __device__ __forceinline__ float ld_elem(const void *p, enum ds_elem e, size_t i) {
    return e == DS_ELEM_BF16 ? ds_bf16_to_f32(((const ds_bf16 *)p)[i]) : ((const float *)p)[i];
}
static __device__ __forceinline__ void st_elem(void *p, enum ds_elem e, size_t i, float v) {
    if (e == DS_ELEM_BF16) ((ds_bf16 *)p)[i] = ds_f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

// 16 bytes of data read once (weights): bypasses L1 so activations stay cached there.
static __device__ __forceinline__ uint4 ld_stream_u4(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Integer image of a float that preserves order: a > b  <=>  key(a) > key(b) for non-NaN values
// (−0 sorts just below +0). Same definition as the CPU reference.
static __device__ __forceinline__ uint32_t order_key(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

// ---------------------------------------------------------------------------------------------
// Reductions (fixed trees)

static __device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DS_FULL_MASK, v, o);
    return v;
}
static __device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DS_FULL_MASK, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(DS_FULL_MASK, v, o));
    return v;
}

// Block-wide sum; every thread gets the result. scratch: >= 33 doubles of shared memory.
static __device__ double block_sum_d(double v, double *scratch) {
    const int lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int n_warps = blockDim.x / DS_WARP;
    v = warp_sum_d(v);
    __syncthreads(); // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double w = lane < n_warps ? scratch[lane] : 0.0;
        w = warp_sum_d(w);
        if (lane == 0) scratch[32] = w;
    }
    __syncthreads();
    return scratch[32];
}

// Block-wide max of floats (NaN-ignoring like fmaxf); every thread gets the result.
static __device__ float block_max_f(float v, float *scratch) {
    const int lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int n_warps = blockDim.x / DS_WARP;
    v = warp_max_f(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < n_warps ? scratch[lane] : -INFINITY;
        w = warp_max_f(w);
        if (lane == 0) scratch[32] = w;
    }
    __syncthreads();
    return scratch[32];
}

// Exclusive prefix sum of an unsigned count over the block, in thread order; *total_out gets the
// block total. scratch: >= 33 unsigned of shared memory. Integer sums: exact in any order.
static __device__ unsigned block_excl_scan_u(unsigned v, unsigned *scratch, unsigned *total_out) {
    const int lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int n_warps = blockDim.x / DS_WARP;
    unsigned incl = v;
#pragma unroll
    for (int o = 1; o < DS_WARP; o <<= 1) {
        unsigned y = __shfl_up_sync(DS_FULL_MASK, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == DS_WARP - 1) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        unsigned w = lane < n_warps ? scratch[lane] : 0u, wi = w;
#pragma unroll
        for (int o = 1; o < DS_WARP; o <<= 1) {
            unsigned y = __shfl_up_sync(DS_FULL_MASK, wi, o);
            if (lane >= o) wi += y;
        }
        if (lane < n_warps) scratch[lane] = wi - w; // exclusive warp offsets
        if (lane == DS_WARP - 1) scratch[32] = wi;
    }
    __syncthreads();
    *total_out = scratch[32];
    return scratch[warp] + incl - v;
}

// Same for 64-bit fixed-point masses (exact integer sums, so the order never matters).
static __device__ unsigned long long block_excl_scan_u64(unsigned long long v,
                                                         unsigned long long *scratch,
                                                         unsigned long long *total_out) {
    const int lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const int n_warps = blockDim.x / DS_WARP;
    unsigned long long incl = v;
#pragma unroll
    for (int o = 1; o < DS_WARP; o <<= 1) {
        unsigned long long y = __shfl_up_sync(DS_FULL_MASK, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == DS_WARP - 1) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        unsigned long long w = lane < n_warps ? scratch[lane] : 0ull, wi = w;
#pragma unroll
        for (int o = 1; o < DS_WARP; o <<= 1) {
            unsigned long long y = __shfl_up_sync(DS_FULL_MASK, wi, o);
            if (lane >= o) wi += y;
        }
        if (lane < n_warps) scratch[lane] = wi - w;
        if (lane == DS_WARP - 1) scratch[32] = wi;
    }
    __syncthreads();
    *total_out = scratch[32];
    return scratch[warp] + incl - v;
}

// ---------------------------------------------------------------------------------------------
// Host-side argument checks of the launchers; each returns DS_OK or records "<op>: <problem>".

static inline enum ds_status cu_check_act(const char *op, enum ds_elem act) {
    if (act == DS_ELEM_F32 || act == DS_ELEM_BF16) return DS_OK;
    return ds_error_set(DS_ERR_UNSUPPORTED, "%s: activation dtype %d is neither f32 nor bf16", op,
                        (int)act);
}

static inline enum ds_status cu_check_dtype(const char *op, const char *what, enum ds_elem e) {
    if (e == DS_ELEM_F32 || e == DS_ELEM_BF16) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: %s dtype %d is neither f32 nor bf16", op, what, (int)e);
}

static inline enum ds_status cu_check_dim(const char *op, const char *what, long long v,
                                          long long min) {
    if (v >= min) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: %s is %lld, must be at least %lld", op, what, v, min);
}

static inline enum ds_status cu_check_ptr(const char *op, const char *what, const void *p) {
    if (p) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: %s buffer is NULL", op, what);
}

#define CU_TRY(expr)                                                                               \
    do {                                                                                           \
        enum ds_status cu_s_ = (expr);                                                             \
        if (cu_s_ != DS_OK) return cu_s_;                                                          \
    } while (0)

// Grid of ceil(n / per_block) blocks, at least 1.
static inline unsigned cu_blocks(size_t n, size_t per_block) {
    size_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b ? b : 1);
}

// One RoPE pair (x[i], x[i + D/2]) at cos c, sin s, in double like the CPU reference (the
// products of floats are exact in double, one rounding to double, one to float). The rope kernel
// and the matmul's fused RoPE both call this, so they give the same bits.
static __device__ __forceinline__ void ds_rope_pair(float x0, float x1, float c, float s,
                                                    float *r0, float *r1) {
    const double d0 = x0, d1 = x1, ci = c, si = s;
    *r0 = (float)(d0 * ci - d1 * si);
    *r1 = (float)(d1 * ci + d0 * si);
}

// ---------------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90)
//
// A decode step is ~500 small kernels; between two of them the GPU idles for the launch latency
// (~1 us inside a CUDA graph). A kernel launched with ds_launch may be scheduled while the
// previous kernel of the stream is still running, so that latency overlaps the previous kernel.
// The contract: such a kernel calls DS_GRID_DEPENDENCY() before its first global memory access
// (read or write); griddepcontrol.wait returns once every earlier kernel of the stream has
// completed and its writes are visible, so the kernel's semantics stay exactly stream-ordered;
// only the launch and the block set-up overlap. The same macro then lets the next kernel start
// its own launch. Kernels that do not start with the macro must be launched with <<<>>>.
// The one exception: memory that no kernel of the two before it on the stream writes may be
// read before the macro (the previous kernel has passed its own wait, so the one before that is
// done): weights (the small-T matmul's first stages, TS_EARLY; the one-token MoE down kernel's,
// D1_EARLY), the expert ids in that kernel (the router wrote them before the MoE op's first
// kernel began) and its combine's operands (the router's weights, the residual, the biases and
// the norm gain), the same operands in the MoE's combine kernel, the call's sequence table, and
// the attention cache below each sequence's pos0 when the caller says so (cache_settled).
// DS_PDL=0 in the environment turns the overlap off (for measuring what it gains).

#define DS_GRID_DEPENDENCY()                                                                       \
    do {                                                                                           \
        ds_grid_wait();                                                                            \
        ds_grid_launch_dependents();                                                               \
    } while (0)

static __device__ __forceinline__ void ds_grid_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void ds_grid_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 1 unless DS_PDL=0 (read once).
int ds_pdl_enabled(void);

// k<<<grid, block, smem, s>>>(args...) with programmatic stream serialization allowed.
template <typename... P, typename... A>
static inline void ds_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                             A... args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = ds_pdl_enabled();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    DS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, args...));
}

// Opt-in to a kernel's dynamic shared memory beyond the default 48 KB: only when a call needs more
// than the most set so far for that kernel (*set: one static int per kernel, from 0), so the host
// pays the attribute call once per kernel and size, not at every launch.
template <typename K> static inline void ds_smem_attr(K k, int *set, int bytes) {
    if (bytes <= *set) return;
    DS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    *set = bytes;
}

// L2 prefetch of the bytes [p, p + n), trimmed to whole aligned 16-byte units (one bulk request).
// A cache hint: it observes no value and cannot change a result, so a kernel may issue it for
// memory no earlier kernel writes (weights) before DS_GRID_DEPENDENCY(), to pull its weights
// while the previous kernel still runs. sm_90 (a no-op below).
// ds_prefetch_l2_aligned: the request itself, for a 16-byte aligned p and n a multiple of 16.
static __device__ __forceinline__ void ds_prefetch_l2_aligned(const void *p, unsigned n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                     (size_t)__cvta_generic_to_global(p)),
                 "r"(n)
                 : "memory");
#else
    (void)p, (void)n;
#endif
}
static __device__ __forceinline__ void ds_prefetch_l2(const void *p, size_t n) {
    const size_t a = (size_t)p, lo = (a + 15) & ~(size_t)15, hi = (a + n) & ~(size_t)15;
    if (hi > lo) ds_prefetch_l2_aligned((const void *)lo, (unsigned)(hi - lo));
}

// Loads shared by the router and the MoE GEMV (both read x as f32 or bf16).
// 8 consecutive elements starting at element i (i a multiple of 8, the buffer 16-byte aligned).
static __device__ __forceinline__ void ld8(const void *base, enum ds_elem dt, size_t i, float *o) {
    if (dt == DS_ELEM_BF16) {
        uint4 u = __ldg((const uint4 *)((const ds_bf16 *)base + i));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[2 * j] = __uint_as_float(w[j] << 16);
            o[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    } else {
        const float4 *p = (const float4 *)((const float *)base + i);
        float4 a = __ldg(p), b = __ldg(p + 1);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
        o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    }
}

// 8 consecutive elements of a buffer whose dtype is a template argument (see ld8).
template <bool BF16>
static __device__ __forceinline__ void ld8t(const void *base, size_t i, float *o) {
    ld8(base, BF16 ? DS_ELEM_BF16 : DS_ELEM_F32, i, o);
}

// 8 consecutive elements as raw words (one 16-byte load for bf16, two for f32), unpacked at use
// exactly as ld8 does; keeping the raw words halves the registers a bf16 step holds in flight.
template <bool BF16> struct raw8 { uint4 v[BF16 ? 1 : 2]; };
template <bool BF16>
static __device__ __forceinline__ raw8<BF16> ld_raw8(const void *base, size_t i) {
    raw8<BF16> r;
    if (BF16) {
        r.v[0] = __ldg((const uint4 *)((const ds_bf16 *)base + i));
    } else {
        const uint4 *p = (const uint4 *)((const float *)base + i);
        r.v[0] = __ldg(p), r.v[BF16 ? 0 : 1] = __ldg(p + 1);
    }
    return r;
}
template <bool BF16> static __device__ __forceinline__ void unpack8(const raw8<BF16> &r, float *o) {
    if (BF16) {
        const uint32_t w[4] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[2 * j] = __uint_as_float(w[j] << 16);
            o[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    } else {
        const uint4 u = r.v[0], v = r.v[BF16 ? 0 : 1];
        o[0] = __uint_as_float(u.x), o[1] = __uint_as_float(u.y);
        o[2] = __uint_as_float(u.z), o[3] = __uint_as_float(u.w);
        o[4] = __uint_as_float(v.x), o[5] = __uint_as_float(v.y);
        o[6] = __uint_as_float(v.z), o[7] = __uint_as_float(v.w);
    }
}

// ---------------------------------------------------------------------------------------------
// Deferred RMSNorm (ds/kernel_args.h): THE ROW SCALE and the producers' g ⊙ x.

// s from lane l's four virtual-lane sums q_{l}, q_{l+32}, q_{l+64}, q_{l+96}: (q0 + q1) + (q2 +
// q3), the xor butterfly, then 1 / sqrt(ss / C + eps), one rounding per operation. Every lane of
// the warp gets the same s (fp32 addition commutes, so both partners of a butterfly step agree).
static __device__ __forceinline__ float ds_row_scale_finish(float q0, float q1, float q2, float q3,
                                                            int C, float eps) {
    const float p = __fadd_rn(__fadd_rn(q0, q1), __fadd_rn(q2, q3));
    const float ss = warp_sum_f(p);
    return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)C), eps)));
}

// THE ROW SCALE of one row by one warp (every lane gets s). Lane l sums the groups l + 32j in
// increasing j into q[j mod 4], i.e. virtual lanes l, l + 32, l + 64, l + 96; by default 12 groups
// per lane (C <= 3072 in bf16) have their loads issued together, one memory latency per row.
// U: groups per lane whose loads are in flight together (fewer registers for smaller U; any U
// gives the same bits).
template <bool BF16, int U = BF16 ? 12 : 4>
static __device__ __forceinline__ float ds_row_scale_warp(const void *row, int C, float eps) {
    static_assert(U % 4 == 0, "a round covers whole cycles of the 4 virtual lanes");
    const int lane = threadIdx.x % DS_WARP, G = C / 8;
    const int n = lane < G ? (G - lane + DS_WARP - 1) / DS_WARP : 0; // groups of this lane
    float q[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // Raw 16-byte words in flight (unpacked at use): 48 registers for the 12 bf16 groups.
    for (int j0 = 0; j0 < n; j0 += U) {
        raw8<BF16> raw[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (j0 + u < n) raw[u] = ld_raw8<BF16>(row, (size_t)(lane + DS_WARP * (j0 + u)) * 8);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (j0 + u >= n) break;
            float xv[8];
            unpack8<BF16>(raw[u], xv);
#pragma unroll
            for (int i = 0; i < 8; i++) q[u % 4] = __fmaf_rn(xv[i], xv[i], q[u % 4]);
        }
    }
    return ds_row_scale_finish(q[0], q[1], q[2], q[3], C, eps);
}

// A producer's deferred-norm element: act(g[c] · v), v the value as stored (already rounded).
static __device__ __forceinline__ float ds_norm_gain_mul(const void *gain, enum ds_elem gdt,
                                                         size_t c, float v) {
    return __fmul_rn(ld_elem(gain, gdt, c), v);
}

#endif // DS_CUDA_COMMON_CUH
