// kernels/cuda/dense.cu: the dense ops on CUDA — embedding lookup, RMSNorm, matmul (bias, fused
// residual, split outputs), elementwise add, SiLU-gated product, row gather. Math and shapes:
// ds/kernel_args.h.
//
// Layouts: activations (T, C) row-major in act (bf16 or f32); weights W[N][K] row-major as in the
// checkpoint (y = x·Wᵀ). All math is fp32 or wider; bf16 is storage only (RNE rounding once per
// output element).
//
// Kernels (names read <act>_<weight>w_<op>):
//   <a>_<w>w_embed            one thread per 8-element group of the output (16-byte copies)
//   <a>_<w>w_rmsnorm          one block of 256 threads per row; Σx² and the scaling in double
//                             (as the reference); the row held in registers when C <= 4096
//   bf16_bf16w_matmul_tc_stream<BT, STAGES>
//                             the small-T matmul (T <= 16): 16 features × BT tokens per block,
//                             256 threads whose cp.async roles are fixed for the whole k loop, a
//                             6-stage ring; two warps run the mma, six only copy
//   bf16_bf16w_matmul_tc<BN, BT, BK, WM, WT, WK, STAGES>
//                             the larger-T matmul: bf16 tensor cores (mma.sync m16n8k16, fp32
//                             accumulation) fed by a cp.async ring of shared memory; tile shape by
//                             T: 32 × 64 (T <= 64), 64 × 128 (features × tokens), and 16 × 8 for
//                             T <= 8 when K % 8 != 0 or a buffer is unaligned (element loads)
//   <a>_<w>w_matmul_simt      fp32 CUDA-core matmul for the other dtype pairs (f32 activations:
//                             tests against the reference, fp32 runs)
//   bf16_row_scale            the deferred norm's row scales of a wide-tile call, one warp per
//                             row, into module memory read by the tile launched after it
//
// Deferred norm (ds/kernel_args.h, rms_of / norm_gain): every matmul kernel scales a row's fp32
// sum by THE ROW SCALE before the bias (v = ((a0 + a1)·s + bias) + residual) and writes g ⊙ out
// from the stored value; the stream tile's copy warps form the scales of their call themselves.
//   <a>_add, <a>_silu_mul     elementwise, grid-stride (silu in double, as the reference)
//   <a>_gather_rows           one thread per 8-element group of the output (16-byte copies)
//
// Batch invariance of the matmul (the property the profiler rests on): the reduction order of
// every output element is fixed by K alone — k16 steps in increasing order, even steps into one
// fp32 accumulator and odd steps into another, (a0 + a1) + bias + residual, one rounding — and
// every tile shape performs exactly that sequence (THE REDUCTION ORDER below). A token's row sits
// in some n8 column of the mma; each column of D depends only on its own column of B; a feature
// always sits in row n mod 16 of its m16 tile. So a row gives the same bits alone or among 299
// others, whichever tile shape its call used. Split outputs (fused q/k/v) change only where an
// element is stored and which bias it adds, so a fused call writes the bits of separate calls.
// The SIMT kernel: one warp per output feature, lane l sums k = l, l+32, ... in order, then a
// fixed xor butterfly; again independent of T.
//
// Launch: every kernel here is launched with ds_launch (programmatic dependent launch) and calls
// DS_GRID_DEPENDENCY() before its first global access; the matmul kernels first issue an L2
// prefetch of their weight rows (a cache hint, see mm_prefetch_w), so that weights stream while
// the previous kernel finishes (only the head of each row: see MM_PREFETCH_BYTES). Every buffer
// must be aligned to its element size (checked).
//
// Device-side indices (embed ids, gather rows) are trusted, not checked on the host: an index
// outside its range yields a row of NaN (never a fault), which the NaN checks downstream report.
#include "common.cuh"
#include "ds/kernels_cuda.h"

// ---------------------------------------------------------------------------------------------
// Groups of 8 consecutive elements: the unit of the embed, rmsnorm and gather kernels. One 16-byte
// access per group for bf16, two for f32, when the row length is a multiple of 8 and the buffers
// are 16-byte aligned ("vec"); element accesses otherwise, in the same order.

static __device__ __forceinline__ void ld8(const float *p, float v[8]) {
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
    v[7] = b.w;
}
static __device__ __forceinline__ void ld8(const ds_bf16 *p, float v[8]) {
    const uint4 u = *(const uint4 *)p; // element 2i is the low half of word i (little-endian)
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}
static __device__ __forceinline__ void st8(float *p, const float v[8]) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
static __device__ __forceinline__ void st8(ds_bf16 *p, const float v[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = (uint32_t)ds_f32_to_bf16(v[2 * i]) | (uint32_t)ds_f32_to_bf16(v[2 * i + 1]) << 16;
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}

// Copies 8 elements: bit for bit when the dtypes agree, converted (RNE) when they differ.
static __device__ __forceinline__ void cp8(float *d, const float *s) {
    *(uint4 *)d = *(const uint4 *)s;
    *(uint4 *)(d + 4) = *(const uint4 *)(s + 4);
}
static __device__ __forceinline__ void cp8(ds_bf16 *d, const ds_bf16 *s) {
    *(uint4 *)d = *(const uint4 *)s;
}
template <typename TD, typename TS> static __device__ __forceinline__ void cp8(TD *d, const TS *s) {
    float v[8];
    ld8(s, v);
    st8(d, v);
}
static __device__ __forceinline__ void cp1(float *d, const float *s) { *d = *s; }
static __device__ __forceinline__ void cp1(ds_bf16 *d, const ds_bf16 *s) { *d = *s; }
template <typename TD, typename TS> static __device__ __forceinline__ void cp1(TD *d, const TS *s) {
    st_f(d, 0, ld_f(s, 0));
}

// Group gi of a row of C elements: src (NULL: the row is invalid, write NaN) into dst.
template <typename TD, typename TS>
static __device__ __forceinline__ void copy_group(TD *dst, const TS *src, int gi, int C, int vec) {
    dst += (size_t)gi * 8;
    if (src) src += (size_t)gi * 8;
    if (vec) {
        if (src) {
            cp8(dst, src);
        } else {
            const float nan8[8] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
            st8(dst, nan8);
        }
        return;
    }
    for (int e = 0; e < 8 && gi * 8 + e < C; e++) {
        if (src) cp1(dst + e, src + e);
        else st_f(dst, e, NAN);
    }
}

// Threads of the row kernels (embed, gather): one per group of 8 over all rows of the call, so a
// one-row call spreads over ceil(C / 8) threads, each with one load in flight.
#define ROWS_THREADS 256

static inline bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// Every buffer must be aligned to its element size (the element paths load whole elements); an
// f32 buffer 2 bytes off would fault on the device, so it is refused here with one line.
static enum ds_status check_align(const char *op, const char *what, const void *p, size_t elem,
                                  const char *dtype) {
    if (!p || (uintptr_t)p % elem == 0) return DS_OK;
    return ds_error_set(DS_ERR_ARG, "%s: %s is not aligned to its %zu-byte %s elements", op, what,
                        elem, dtype);
}
static enum ds_status check_align_e(const char *op, const char *what, const void *p,
                                    enum ds_elem e) {
    return e == DS_ELEM_BF16 ? check_align(op, what, p, 2, "bf16")
                             : check_align(op, what, p, 4, "f32");
}

// The deferred-norm output fields (ds/kernel_args.h): a dtype for the gain, a buffer for g ⊙ x.
static enum ds_status check_norm_out(const char *op, const void *gain, enum ds_elem gdt,
                                     const void *out, enum ds_elem act, const void *op_out) {
    if (!gain) return DS_OK;
    CU_TRY(cu_check_dtype(op, "norm gain", gdt));
    CU_TRY(cu_check_ptr(op, "norm_out", out));
    if (out == op_out) return ds_error_set(DS_ERR_ARG, "%s: norm_out must not alias out", op);
    CU_TRY(check_align_e(op, "norm gain", gain, gdt));
    return check_align_e(op, "norm_out", out, act);
}

// ---------------------------------------------------------------------------------------------
// Embedding

template <typename TA, typename TW>
static __device__ __forceinline__ void embed_body(const struct ds_embed_args &a, int vec) {
    const int C = a.dim, G = (C + 7) / 8;
    const size_t i = blockIdx.x * (size_t)ROWS_THREADS + threadIdx.x;
    if (i >= (size_t)a.n_rows * G) return;
    const int t = (int)(i / G), gi = (int)(i % G);
    const int32_t id = a.ids[t];
    const bool ok = id >= 0 && id < a.vocab;
    const TW *src = ok ? (const TW *)a.table + (size_t)id * C : NULL;
    TA *out = (TA *)a.out + (size_t)t * C;
    copy_group(out, src, gi, C, vec);
    if (a.norm_gain) // the deferred norm's g ⊙ x of the values just stored (this thread's own)
        for (int c = gi * 8; c < gi * 8 + 8 && c < C; c++)
            st_f((TA *)a.norm_out + (size_t)t * C, c,
                 ds_norm_gain_mul(a.norm_gain, a.norm_gain_dtype, c, ld_f(out, c)));
}

#define EMBED_KERNEL(name, TA, TW)                                                                 \
    __global__ void __launch_bounds__(ROWS_THREADS) name(const struct ds_embed_args a, int vec) {  \
        DS_GRID_DEPENDENCY();                                                                      \
        embed_body<TA, TW>(a, vec);                                                                \
    }
EMBED_KERNEL(f32_f32w_embed, float, float)
EMBED_KERNEL(f32_bf16w_embed, float, ds_bf16)
EMBED_KERNEL(bf16_f32w_embed, ds_bf16, float)
EMBED_KERNEL(bf16_bf16w_embed, ds_bf16, ds_bf16)

extern "C" enum ds_status ds_embed_cuda(const struct ds_embed_args *a, void *stream) {
    static const char op[] = "embed";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dtype(op, "table", a->table_dtype));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    CU_TRY(cu_check_dim(op, "dim", a->dim, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "table", a->table));
    CU_TRY(cu_check_ptr(op, "ids", a->ids));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    CU_TRY(check_align_e(op, "table", a->table, a->table_dtype));
    CU_TRY(check_align(op, "ids", a->ids, 4, "int32"));
    CU_TRY(check_align_e(op, "out", a->out, a->act));
    CU_TRY(check_norm_out(op, a->norm_gain, a->norm_gain_dtype, a->norm_out, a->act, a->out));
    const size_t groups = (size_t)a->n_rows * (size_t)((a->dim + 7) / 8);
    if ((groups + ROWS_THREADS - 1) / ROWS_THREADS > (size_t)INT32_MAX)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d rows of %d are too many", op, a->n_rows,
                            a->dim);
    const int vec = a->dim % 8 == 0 && aligned16(a->table) && aligned16(a->out);
    const bool ob = a->act == DS_ELEM_BF16, tb = a->table_dtype == DS_ELEM_BF16;
    void (*k)(const struct ds_embed_args, int) = ob ? (tb ? bf16_bf16w_embed : bf16_f32w_embed)
                                                    : (tb ? f32_bf16w_embed : f32_f32w_embed);
    ds_launch(k, cu_blocks(groups, ROWS_THREADS), ROWS_THREADS, 0, DS_STREAM(stream), *a, vec);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: one block of NORM_THREADS per row. THE ORDER OF Σx² (fixed by C alone): thread i takes
// the 8-element groups g = i, i + 256, i + 512, ... in increasing g and adds x[c]² (in double) for
// c = 8g .. 8g + 7 in increasing c; then the fixed block tree (block_sum_d). The result is within
// an ulp of the reference (which sums in another order). Fast path (C % 8 == 0, C <= 4096,
// 16-byte aligned rows): every group is loaded once into registers with 16-byte loads, the gain
// too, before the reduction, and the scaled row is written from registers: one load latency and
// one reduction per row. Other shapes take the same order with element loads (same bits).

#define NORM_THREADS 256
#define NORM_G 2 // groups held in registers per thread on the fast path: C <= 8 · 256 · 2

template <typename TA, typename TW>
static __device__ __forceinline__ void rmsnorm_body(const struct ds_rmsnorm_args &a, int vec) {
    __shared__ double scratch[33];
    const int t = blockIdx.x, C = a.dim, G = (C + 7) / 8;
    const TA *x = (const TA *)a.x + (size_t)t * C;
    TA *y = (TA *)a.out + (size_t)t * C;
    const TW *w = (const TW *)a.w;
    double ss = 0.0;
    if (vec) {
        float v[NORM_G][8], g[NORM_G][8];
#pragma unroll
        for (int j = 0; j < NORM_G; j++) {
            const int gi = threadIdx.x + j * NORM_THREADS;
            if (gi < G) ld8(x + (size_t)gi * 8, v[j]), ld8(w + (size_t)gi * 8, g[j]);
        }
#pragma unroll
        for (int j = 0; j < NORM_G; j++)
            if (threadIdx.x + j * NORM_THREADS < G)
#pragma unroll
                for (int e = 0; e < 8; e++) ss += (double)v[j][e] * (double)v[j][e];
        ss = block_sum_d(ss, scratch); // its barriers order every read of x before any write
        const double inv = 1.0 / sqrt(ss / C + (double)a.eps);
#pragma unroll
        for (int j = 0; j < NORM_G; j++) {
            const int gi = threadIdx.x + j * NORM_THREADS;
            if (gi >= G) continue;
            float o[8];
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = (float)((double)g[j][e] * ((double)v[j][e] * inv));
            st8(y + (size_t)gi * 8, o);
        }
        return;
    }
    for (int gi = threadIdx.x; gi < G; gi += NORM_THREADS)
        for (int c = gi * 8; c < gi * 8 + 8 && c < C; c++) {
            const double v = ld_f(x, c);
            ss += v * v;
        }
    ss = block_sum_d(ss, scratch);
    const double inv = 1.0 / sqrt(ss / C + (double)a.eps);
    for (int c = threadIdx.x; c < C; c += NORM_THREADS)
        st_f(y, c, (float)((double)ld_f(w, c) * ((double)ld_f(x, c) * inv)));
}

// The gain is a weight (no kernel writes it): block 0 prefetches it into L2 before the grid
// dependency, so after the wait the gain and x (just written, in L2) both come from L2.
#define RMSNORM_KERNEL(name, TA, TW)                                                               \
    __global__ void __launch_bounds__(NORM_THREADS) name(const struct ds_rmsnorm_args a,           \
                                                         int vec) {                                \
        if (blockIdx.x == 0 && threadIdx.x == 0) ds_prefetch_l2(a.w, (size_t)a.dim * sizeof(TW)); \
        DS_GRID_DEPENDENCY();                                                                      \
        rmsnorm_body<TA, TW>(a, vec);                                                              \
    }
RMSNORM_KERNEL(f32_f32w_rmsnorm, float, float)
RMSNORM_KERNEL(f32_bf16w_rmsnorm, float, ds_bf16)
RMSNORM_KERNEL(bf16_f32w_rmsnorm, ds_bf16, float)
RMSNORM_KERNEL(bf16_bf16w_rmsnorm, ds_bf16, ds_bf16)

extern "C" enum ds_status ds_rmsnorm_cuda(const struct ds_rmsnorm_args *a, void *stream) {
    static const char op[] = "rmsnorm";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dtype(op, "gain", a->w_dtype));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "dim", a->dim, 1));
    if (!(a->eps >= 0.0f)) return ds_error_set(DS_ERR_ARG, "%s: eps %g is negative", op, a->eps);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "x", a->x));
    CU_TRY(cu_check_ptr(op, "gain", a->w));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    CU_TRY(check_align_e(op, "x", a->x, a->act));
    CU_TRY(check_align_e(op, "gain", a->w, a->w_dtype));
    CU_TRY(check_align_e(op, "out", a->out, a->act));
    // Row t starts at t·C elements: C % 8 == 0 keeps every row 16-byte aligned too.
    const int vec = a->dim % 8 == 0 && a->dim <= 8 * NORM_THREADS * NORM_G && aligned16(a->x) &&
                    aligned16(a->w) && aligned16(a->out);
    const bool ab = a->act == DS_ELEM_BF16, wb = a->w_dtype == DS_ELEM_BF16;
    void (*k)(const struct ds_rmsnorm_args, int) =
        ab ? (wb ? bf16_bf16w_rmsnorm : bf16_f32w_rmsnorm)
           : (wb ? f32_bf16w_rmsnorm : f32_f32w_rmsnorm);
    ds_launch(k, a->n_rows, NORM_THREADS, 0, DS_STREAM(stream), *a, vec);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Matmul, tensor-core path (bf16 activations × bf16 weights)
//
// One kernel template, bf16_bf16w_matmul_tc<BN, BT, BK, WM, WT, WK, STAGES>: a block computes BN
// output features × BT tokens. W[BN][BK] and x[BT][BK] tiles stream into a STAGES-deep ring of
// shared memory with cp.async (16-byte copies, zero fill beyond N, T and K), so the bytes in
// flight do not depend on registers; warps read mma fragments with ldmatrix (rows XOR-swizzled
// by 16-byte chunk: conflict-free) and run mma.sync.m16n8k16 (bf16 in, fp32 accumulate), features
// in the M slot and tokens in the N slot. Warp (wm, wt, wk) owns BN/WM features × BT/WT tokens.
//
// THE REDUCTION ORDER (the batch-invariance contract). For output (t, n), cut K into k16 steps
// s = 0 .. ceil(K/16) − 1 (the last one zero-padded). Two fp32 accumulators start at +0: a0 takes
// the even steps, a1 the odd ones, each one mma per step in increasing s; then
// v = ((a0 + a1) + bias[n]) + residual[t][n], rounded once to bf16. With WK = 2 two warps hold a0
// and a1 (added through shared memory); with WK = 1 one warp holds both. Every tile shape below
// performs exactly these operations for every element: feature n always sits in row n mod 16 of
// its m16 tile, a token's result depends only on its own column of the B operand, and steps past
// K are skipped, not zero-multiplied. So the tile may be chosen from T (small T: narrow tiles for
// many blocks; large T: wide tiles for operand reuse) without changing a single bit.

#define MM_THREADS 256 // the CUDA-core kernel below
#define MM_WARPS (MM_THREADS / DS_WARP)
#define MM_TOKENS 64

extern __shared__ __align__(128) unsigned char mm_smem[];

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global → shared, asynchronously; src_bytes < 16 zero-fills the rest (0: pure fill).
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x2(uint32_t r[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}
static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    ldsm_x4(r, smem_u32(p));
}
static __device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void *p) {
    ldsm_x2(r, smem_u32(p));
}

// d += A(16×16, rows: features) · B(16×8, columns: tokens), fp32 accumulation.
static __device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4],
                                                      uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk cc of tile row `row` (rows of BK bf16): the chunk index is XORed
// with row mod 8, so the 8 rows an ldmatrix reads hit 8 different bank groups.
template <int BK> static __device__ __forceinline__ int mm_off(int row, int cc) {
    return row * (BK * 2) + ((cc ^ (row & 7)) << 4);
}

// Loads k-tile kt (k = kt·BK ..) of W rows f0.. and x rows t0.. into one stage. `vec`: K % 8 == 0
// and both bases 16-byte aligned (cp.async); otherwise element loads and plain shared stores.
template <int BN, int BT, int BK, int NT>
static __device__ __forceinline__ void mm_load_stage(unsigned char *st, const ds_bf16 *W,
                                                     const ds_bf16 *X, int f0, int t0, int kt,
                                                     int N, int T, int K, bool vec) {
    constexpr int CPR = BK / 8; // 16-byte chunks per tile row
    constexpr int CHUNKS = (BN + BT) * CPR;
#pragma unroll 4
    for (int i = threadIdx.x; i < CHUNKS; i += NT) {
        const int row = i / CPR, cc = i % CPR, k = kt * BK + cc * 8;
        const bool isw = row < BN;
        const int r = isw ? f0 + row : t0 + row - BN;
        const bool ok = r < (isw ? N : T);
        const ds_bf16 *src = (isw ? W : X) + (size_t)(ok ? r : 0) * K;
        unsigned char *dst = st + mm_off<BK>(row, cc);
        if (vec) {
            const bool in = ok && k < K;
            cp_async16(dst, in ? src + k : src, in ? 16 : 0);
        } else {
            uint32_t h[8];
#pragma unroll
            for (int j = 0; j < 8; j++) h[j] = ok && k + j < K ? (uint32_t)src[k + j] : 0u;
            *(uint4 *)dst = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16,
                                       h[6] | h[7] << 16);
        }
    }
}

// L2 prefetch of weights ahead of the grid dependency. A matmul's weights are never written by
// the kernels before it, so its blocks may start pulling them into L2 while the previous kernel
// still runs (programmatic dependent launch): thread r < rows of the block issues one bulk
// prefetch of the first bytes of W row f0 + r. A prefetch is a cache hint — it observes no value
// and cannot change a result (L2 is the device's point of coherence) — so it is the one global
// access allowed before DS_GRID_DEPENDENCY(). The bytes per row are a function of N and K only:
// at most MM_PREFETCH_BYTES over all N rows, none when that leaves under 512 bytes a row (the
// lm_head streams as before). The budget is small on purpose: the prefetch runs while the
// previous kernel (attention, a norm) waits on its own loads, and a large one queues ahead of
// them in DRAM. Measured on the 120b decode step (H200, graphs on): 24 MB (the whole o_proj)
// 3.19-3.21 ms, 12 MB 3.11, 4 MB 3.01, none 3.03; with 24 MB the attention kernels took 40%
// longer and the matmuls gained nothing. Needs 16-byte aligned rows (K % 8 == 0, aligned W) and
// sm_90. A build may set another budget with -DMM_PREFETCH_BYTES=<bytes>u.
#ifndef MM_PREFETCH_BYTES
#define MM_PREFETCH_BYTES (4u << 20)
#endif

static __device__ __forceinline__ void mm_prefetch_w(const ds_bf16 *W, int f0, int rows, int N,
                                                     int K) {
    const size_t row_bytes = (size_t)K * 2, budget = (MM_PREFETCH_BYTES / (unsigned)N) & ~15u;
    const unsigned per_row = (unsigned)(row_bytes < budget ? row_bytes : budget);
    const int r = f0 + (int)threadIdx.x;
    if (per_row < 512 || (int)threadIdx.x >= rows || r >= N) return;
    ds_prefetch_l2_aligned(W + (size_t)r * K, per_row);
}

// Where output (t, n) goes and which bias it takes: out (row stride N) and bias[n] without a
// split; with one (ds_matmul_args part_dim), the part that holds feature n, at row stride = the
// part's width, and that part's bias.
struct mm_dst {
    void *p;
    size_t o; // element offset in p
    const void *bias;
    int bi; // element of bias
};
static __device__ __forceinline__ mm_dst mm_dst_of(const struct ds_matmul_args &a, int t, int n) {
    const int d0 = a.part_dim[0], d1 = a.part_dim[1];
    if (d0 <= 0) return {a.out, (size_t)t * a.out_dim + n, a.bias, n};
    if (n < d0) return {a.out, (size_t)t * d0 + n, a.bias, n};
    if (n < d0 + d1) return {a.out1, (size_t)t * d1 + (n - d0), a.bias1, n - d0};
    return {a.out2, (size_t)t * a.part_dim[2] + (n - d0 - d1), a.bias2, n - d0 - d1};
}

// The last operations of THE REDUCTION ORDER for output (t, n): v = a0 + a1 from the caller, then
// · s (the row scale of a deferred norm, rms_of; none without it), + bias, + residual (read before
// the write: out may be residual), one rounding to bf16; then the deferred-norm output g ⊙ out of
// the stored value (norm_gain). Explicit _rn operations: nothing may be contracted into an fma.
// mm_addends loads the bias (b), residual (r) and norm gain (g) of (t, n), 0 where there is none;
// the stream tile loads them before its k loop so that their latency hides behind it.
struct mm_add {
    float b, r, g;
};
// DN: the deferred-norm fields the caller may use (DN_SCALE: rms_of, DN_GAIN: norm_gain; the
// stream tile compiles one kernel per combination so that a plain product keeps its code).
#define DN_SCALE 1
#define DN_GAIN 2
template <int DN = DN_SCALE | DN_GAIN>
static __device__ __forceinline__ mm_add mm_addends(const struct ds_matmul_args &a, int t, int n) {
    const mm_dst d = mm_dst_of(a, t, n);
    return {d.bias ? ld_elem(d.bias, a.bias_dtype, d.bi) : 0.0f,
            a.residual ? ds_bf16_to_f32(((const ds_bf16 *)a.residual)[(size_t)t * a.out_dim + n])
                       : 0.0f,
            (DN & DN_GAIN) && a.norm_gain ? ld_elem(a.norm_gain, a.norm_gain_dtype, (size_t)n)
                                          : 0.0f};
}
template <int DN = DN_SCALE | DN_GAIN>
static __device__ __forceinline__ void mm_finish_add(const struct ds_matmul_args &a, int t, int n,
                                                     float v, mm_add ad, float s) {
    const mm_dst d = mm_dst_of(a, t, n);
    if ((DN & DN_SCALE) && a.rms_of) v = __fmul_rn(v, s);
    if (d.bias) v = __fadd_rn(v, ad.b);
    if (a.residual) v = __fadd_rn(v, ad.r);
    const ds_bf16 o = ds_f32_to_bf16(v);
    ((ds_bf16 *)d.p)[d.o] = o;
    if ((DN & DN_GAIN) && a.norm_gain) // no split here (checked): (t, n) is element t·N + n
        ((ds_bf16 *)a.norm_out)[(size_t)t * a.out_dim + n] =
            ds_f32_to_bf16(__fmul_rn(ad.g, ds_bf16_to_f32(o)));
}
static __device__ __forceinline__ void mm_finish_bf16(const struct ds_matmul_args &a, int t, int n,
                                                      float v, float s) {
    mm_finish_add(a, t, n, v, mm_addends(a, t, n), s);
}

// The row scales of a wide-tile call, formed by bf16_row_scale (below) just before it.
#define MM_RS_MAX 65536 // rows; more take the in-kernel path
#define MM_RS_WARPS 8
__device__ float mm_rs_buf[MM_RS_MAX];

// THE ROW SCALE of rows t0 .. t0 + nt − 1 into s_out[0 .. nt − 1] (shared memory), warps w0 ..
// w0 + nw − 1 of the block taking rows in turn; 1 for every row without rms_of. The caller
// synchronises before reading them.
template <bool BF16>
static __device__ __forceinline__ void mm_row_scales(const struct ds_matmul_args &a, int t0, int nt,
                                                     int w0, int nw, float *s_out) {
    const int warp = threadIdx.x / DS_WARP - w0, lane = threadIdx.x % DS_WARP;
    if (warp < 0 || warp >= nw) return;
    for (int r = warp; r < nt; r += nw) {
        float sc = 1.0f;
        if (a.rms_of)
            sc = ds_row_scale_warp<BF16>((const char *)a.rms_of +
                                             (size_t)(t0 + r) * a.in_dim * (BF16 ? 2 : 4),
                                         a.in_dim, a.rms_eps);
        if (lane == 0) s_out[r] = sc;
    }
}

template <int BN, int BT, int BK, int WM, int WT, int WK, int STAGES>
__global__ void __launch_bounds__(WM *WT *WK *DS_WARP)
    bf16_bf16w_matmul_tc(const struct ds_matmul_args a, int vec, int rs) {
    // The first token tile of each feature tile prefetches its weight rows (see mm_prefetch_w).
    if (vec && blockIdx.x == 0)
        mm_prefetch_w((const ds_bf16 *)a.w, blockIdx.y * BN, BN, a.out_dim, a.in_dim);
    DS_GRID_DEPENDENCY();
    constexpr int NT = WM * WT * WK * DS_WARP;
    constexpr int MI = BN / WM / 16, NI = BT / WT / 8; // m16 / n8 tiles per warp
    constexpr int NA = 2 / WK;                          // accumulator sets per warp
    constexpr int KSTEPS = BK / 16;
    constexpr int STAGE_BYTES = (BN + BT) * BK * 2;
    static_assert(WK == 1 || WK == 2, "two accumulators: in one warp or in two");
    static_assert(MI >= 1 && NI >= 1 && BN % (16 * WM) == 0 && BT % (8 * WT) == 0, "tile");
    static_assert(BK % 64 == 0 && STAGES >= 2, "swizzle needs 8 chunks per row");

    const int warp = threadIdx.x / DS_WARP, lane = threadIdx.x % DS_WARP;
    const int wm = warp % WM, wt = (warp / WM) % WT, wk = warp / (WM * WT);
    const int N = a.out_dim, K = a.in_dim, T = a.n_rows;
    const int t0 = blockIdx.x * BT, f0 = blockIdx.y * BN;
    const ds_bf16 *W = (const ds_bf16 *)a.w, *X = (const ds_bf16 *)a.x;
    const int KT = (K + BK - 1) / BK, n_steps = (K + 15) / 16;

    float acc[NA][MI][NI][4];
#pragma unroll
    for (int s = 0; s < NA; s++)
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < NI; j++) acc[s][i][j][0] = acc[s][i][j][1] = acc[s][i][j][2] =
                acc[s][i][j][3] = 0.0f;

    // ldmatrix lane roles: A (x4) — matrix lane/8: rows +8 for odd matrices, k +8 for 2 and 3;
    // B (x4 = two n8 tiles) — tokens +8 for matrices 2 and 3, k +8 for odd matrices.
    const int mat = lane >> 3, r8 = lane & 7;
    const int a_row = wm * (BN / WM) + r8 + (mat & 1) * 8, a_kc = mat >> 1;
    const int b_row = BN + wt * (BT / WT) + r8 + (mat >> 1) * 8, b_kc = mat & 1;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < KT) mm_load_stage<BN, BT, BK, NT>(mm_smem + s * STAGE_BYTES, W, X, f0, t0, s, N, T, K,
                                                  vec);
        cp_async_commit();
    }
    // The tile's row scales (deferred norm), after the ring; the k loop's barriers publish them.
    float *s_row = (float *)(mm_smem + STAGES * STAGE_BYTES);
    // rs: the scales were formed by bf16_row_scale just before (many rows: one warp per row over
    // the whole GPU instead of BT rows in turn per block).
    if (a.rms_of && rs) {
        for (int r = threadIdx.x; r < min(BT, T - t0); r += NT) s_row[r] = mm_rs_buf[t0 + r];
    } else if (a.rms_of) {
        mm_row_scales<true>(a, t0, min(BT, T - t0), 0, NT / DS_WARP, s_row);
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<STAGES - 2>(); // this thread's copies of k-tile kt have landed
        __syncthreads();             // everyone's have, and k-tile kt-1 is no longer read
        const int nk = kt + STAGES - 1;
        if (nk < KT)
            mm_load_stage<BN, BT, BK, NT>(mm_smem + (nk % STAGES) * STAGE_BYTES, W, X, f0, t0, nk,
                                          N, T, K, vec);
        cp_async_commit(); // possibly empty: keeps the group count of the wait above exact
        const unsigned char *st = mm_smem + (kt % STAGES) * STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < KSTEPS; i++) {
            if (WK == 2 && (i & 1) != wk) continue; // KSTEPS is even: step parity = i parity
            if ((kt * KSTEPS + i) >= n_steps) break;
            const int set = WK == 2 ? 0 : (i & 1);
            uint32_t af[MI][4], bf[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldmatrix_x4(af[mi], st + mm_off<BK>(a_row + mi * 16, i * 2 + a_kc));
#pragma unroll
            for (int ni = 0; ni + 1 < NI; ni += 2) {
                uint32_t r[4];
                ldmatrix_x4(r, st + mm_off<BK>(b_row + ni * 8, i * 2 + b_kc));
                bf[ni][0] = r[0], bf[ni][1] = r[1], bf[ni + 1][0] = r[2], bf[ni + 1][1] = r[3];
            }
            if (NI & 1) // lanes 0-15 address the last tile's two k halves
                ldmatrix_x2(bf[NI - 1], st + mm_off<BK>(b_row - (mat >> 1) * 8 + (NI - 1) * 8,
                                                        i * 2 + b_kc));
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
                    mma_bf16_16816(acc[set][mi][ni], af[mi], bf[ni][0], bf[ni][1]);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); // the ring is free: reuse it for the a1 hand-over

    float *xch = (float *)mm_smem + (size_t)(wt * WM + wm) * (MI * NI * 4) * DS_WARP;
    if (WK == 2) {
        if (wk == 1) {
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        xch[((mi * NI + ni) * 4 + r) * DS_WARP + lane] = acc[0][mi][ni][r];
        }
        __syncthreads();
        if (wk == 1) return;
    }

    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int n = f0 + wm * (BN / WM) + mi * 16 + g + (r >> 1) * 8;
                const int t = t0 + wt * (BT / WT) + ni * 8 + 2 * q + (r & 1);
                const float a1 = WK == 2 ? xch[((mi * NI + ni) * 4 + r) * DS_WARP + lane]
                                         : acc[NA - 1][mi][ni][r];
                if (n >= N || t >= T) continue;
                mm_finish_bf16(a, t, n, acc[0][mi][ni][r] + a1, a.rms_of ? s_row[t - t0] : 1.0f);
            }
}

// ---------------------------------------------------------------------------------------------
// The weight-streaming tile for small T: bf16_bf16w_matmul_tc_stream<BT, STAGES> (T <= BT for BT 8
// or 16; BT 32: grid x over token tiles of 32; K % 8 == 0 and 16-byte aligned x and w). A block
// of 256 threads computes 16 features × BT tokens: N/16 blocks per token tile (180 for N = 2880,
// 12,568 for the lm_head), each streaming its 16 weight rows through a ring of STAGES stages of
// 16 × 256 (8 KB of W) + BT × 256 (x) bf16.
//
// Built to be memory bound rather than instruction bound:
// - every thread's copies are fixed for the whole k loop: warp w copies W rows w and w + 8 and x
//   rows w, w + 8 (those < T), lane l the 16-byte chunk l of each, so the source pointers and
//   the swizzled shared offsets are computed once; a stage costs each thread 2-4 cp.async, one
//   compare for the K tail and its address increments;
// - x rows >= T are never copied: they are zeroed once in every stage at kernel start;
// - W rows >= N read row N - 1 (valid memory; those accumulator rows are never stored);
// - warps 0 and 1 own the two accumulators (a0: even k16 steps, a1: odd ones, in increasing
//   order, exactly THE REDUCTION ORDER of the tile kernel above) and run ldmatrix + mma; the other
//   six warps only copy. a1 meets a0 in shared memory, then (a0 + a1) + bias + residual.
// With 6 stages of BT = 8 (72 KB, 3 blocks per SM) a block keeps 5 stages = 40 KB of weights in
// flight. More stages do not make a block faster: 9 stages (8 in flight) for the 180-block o_proj
// measured the same as 6 in the 120b decode step (H200: 13.2 vs 13.1 µs per call, and 10.3 vs
// 10.1 with the mma warps' fragments in flight ahead, below).

#define TS_BN 16  // features per block: one m16 tile
#define TS_BK 256 // K per stage: 32 chunks of 16 bytes per row
#define TS_THREADS 256
#define TS_ROW_BYTES (TS_BK * 2)
#ifndef TS_STAGES8
#define TS_STAGES8 6 // ring stages of the 8-token tile (decode): 5 × 8 KB of W in flight
#endif
// 1: the W halves of the first STAGES − 1 stages are copied before the grid dependency (weights:
// no kernel writes them), the x halves after it, so a block's weight stream starts while the
// previous kernel still runs; 0: whole stages after the dependency (with the L2 prefetch of the
// rows' heads instead). The bits do not depend on it.
#ifndef TS_EARLY
#define TS_EARLY 1
#endif

// The 32-token stream tile (16 < T <= 32: a 32-row decode step, an 8-sequence verify): 4
// stages of 16 × 256 W + 32 × 256 x (24 KB each), two blocks per SM. TS_32_RS: its deferred-norm
// row scales come from bf16_row_scale (one warp per row over the GPU) instead of each block's
// copy warps reading 32 rows before the k loop.
#ifndef TS_32
#define TS_32 1
#endif
#ifndef TS_STAGES32
#define TS_STAGES32 4
#endif
#ifndef TS_32_RS
#define TS_32_RS 1
#endif
// Rows up to which the 32-token stream tile runs, in token tiles of 32 (grid x: the blocks of a
// feature tile run side by side, so its weights come from DRAM about once), for products of at
// most TS_32_MAX_N features. Every block re-reads its 32 rows of x from L2 (x traffic = T/16 × the
// weight bytes): for the 120b verify's q/k/v and o_proj (45 - 80 wide tiles: a third of the GPU
// idle) that is the cheaper cost, 55.7 µs per o_proj call against 116; for the 201,088-feature
// lm_head, whose wide tiles fill the GPU anyway, it was not (1973 µs at 128 rows against 895 for
// the 64 × 128 tiles and 1837 for 32 × 64).
#ifndef TS_32_MAX_T
#define TS_32_MAX_T 128
#endif
#ifndef TS_32_MAX_N
#define TS_32_MAX_N 65536
#endif
// The wide-tile shapes by T (see ds_matmul_cuda): 32 × 64 tiles up to MM_MID_T rows, 16 × 64
// instead with MM_NARROW64. (256 took the 128-row lm_head from 895 to 1837 µs.)
#ifndef MM_MID_T
#define MM_MID_T 64
#endif
#ifndef MM_NARROW64
#define MM_NARROW64 0
#endif

static __device__ __forceinline__ void cp_async16_s(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// Issues this thread's copies of the stage at shared address st for k = k0 .. k0 + TS_BK − 1:
// its W half (ts_load_w) and its x half (ts_load_x). w0, w1, x[j]: this lane's chunk of its W
// rows and x rows at k = 0; nx of the x rows exist. A chunk at or past K is zero-filled (only
// read when K % 16 == 8, as the last step's upper half).
static __device__ __forceinline__ void ts_load_w(uint32_t st, uint32_t w_off, const ds_bf16 *w0,
                                                 const ds_bf16 *w1, int k0, int k_lane, int K) {
    const bool in = k0 + k_lane < K;
    const int k = in ? k0 : 0, nb = in ? 16 : 0;
    cp_async16_s(st + w_off, w0 + k, nb);
    cp_async16_s(st + w_off + 8 * TS_ROW_BYTES, w1 + k, nb);
}
template <int NX>
static __device__ __forceinline__ void ts_load_x(uint32_t st, uint32_t x_off,
                                                 const ds_bf16 *const x[NX], int nx, int k0,
                                                 int k_lane, int K) {
    const bool in = k0 + k_lane < K;
    const int k = in ? k0 : 0, nb = in ? 16 : 0;
#pragma unroll
    for (int j = 0; j < NX; j++)
        if (j < nx) cp_async16_s(st + x_off + j * 8 * TS_ROW_BYTES, x[j] + k, nb);
}
template <int NX>
static __device__ __forceinline__ void ts_load_stage(uint32_t st, uint32_t w_off, uint32_t x_off,
                                                     const ds_bf16 *w0, const ds_bf16 *w1,
                                                     const ds_bf16 *const x[NX], int nx, int k0,
                                                     int k_lane, int K) {
    ts_load_w(st, w_off, w0, w1, k0, k_lane, K);
    ts_load_x<NX>(st, x_off, x, nx, k0, k_lane, K);
}

// Shared offsets of an mma warp's fragments in a stage. Warp w runs steps i = 2ii + w (ii = 0..7)
// of a k-tile, whose 16-byte chunk in a tile row is 2i + kc = 4ii + c0 (c0 = 2w + kc < 4).
// mm_off XORs the chunk with row & 7, which flips the lowest bit of ii when bit 2 of the row is
// set: the offset of step ii is pe + 64·ii for even ii and po + 64·ii for odd ii, so every
// ldmatrix of the loop takes a register and an immediate.
struct ts_frag {
    uint32_t pe, po;
};
static __device__ __forceinline__ ts_frag ts_frag_of(int row, int c0) {
    const uint32_t base = (uint32_t)(row * TS_ROW_BYTES + (((c0 ^ row) & 3) << 4));
    const uint32_t h = 64u * (uint32_t)((row >> 2) & 1);
    return {base + h, base - h};
}

// The A and B fragments of step ii (a compile-time constant in the unrolled loop) of the stage at
// shared address s; B as in the step loop below (NI = 1: lanes 0-15 address the two k halves).
template <int NI>
static __device__ __forceinline__ void ts_frags(uint32_t s, int ii, ts_frag fa, ts_frag fb,
                                                uint32_t af[4], uint32_t bf[NI][2]) {
    const uint32_t o = 64u * (uint32_t)ii;
    ldsm_x4(af, s + (ii & 1 ? fa.po : fa.pe) + o);
    if (NI == 1) {
        ldsm_x2(bf[0], s + (ii & 1 ? fb.po : fb.pe) + o);
    } else {
#pragma unroll
        for (int ni = 0; ni + 1 < NI; ni += 2) {
            uint32_t r[4];
            ldsm_x4(r, s + (ii & 1 ? fb.po : fb.pe) + o + (uint32_t)(ni * 8 * TS_ROW_BYTES));
            bf[ni][0] = r[0], bf[ni][1] = r[1], bf[ni + 1][0] = r[2], bf[ni + 1][1] = r[3];
        }
    }
}

// The fused RoPE (ROPE: ds_matmul_args.rope_cos, T <= 8, D % 16 == 0). A tile of parts 0 and 1
// (q, k) holds 8 RoPE pairs instead of 16 consecutive features: tile rows r and r + 8 are
// features i and i + D/2 of one head (i = i0 + r, i0 = 8 · the tile's place in its head), so
// warp 0's lane (g, q) ends up with both elements of pair g for its tokens and rotates them in
// registers: ds_rope_pair on the bf16 values the product would store, the rope kernel's
// arithmetic, hence the bits of the product then ds_rope. The tiles of part 2 (v) keep
// consecutive features. (The L2 prefetch still takes rows f0 .. f0 + 15: over the grid the same
// rows.)
static __device__ __forceinline__ int ts_feature(const struct ds_matmul_args &a, bool rope, int f0,
                                                 int r) {
    if (!rope) return f0 + r;
    const int D = a.rope_head_dim, hb = f0 / D * D, i0 = f0 % D / 16 * 8;
    return hb + i0 + (r & 7) + (r >> 3) * (D / 2);
}

template <int BT, int STAGES, bool ROPE, int DN>
__global__ void __launch_bounds__(TS_THREADS)
    bf16_bf16w_matmul_tc_stream(const struct ds_matmul_args a, int rs_pre) {
    constexpr int NI = BT / 8; // n8 token tiles; also x rows copied per warp
    constexpr int STAGE_BYTES = (TS_BN + BT) * TS_ROW_BYTES;
    constexpr int KSTEPS = TS_BK / 16;
    static_assert(TS_THREADS == 8 * DS_WARP && TS_BK == 8 * DS_WARP, "copy roles: 8 warps");
    static_assert((NI == 1 || NI % 2 == 0) && STAGES >= 2, "tile");
    static_assert(!ROPE || NI == 1, "the fused RoPE: up to 8 rows");

    const int warp = threadIdx.x / DS_WARP, lane = threadIdx.x % DS_WARP;
    // Block (x, y): the call's rows t0 .. t0 + T − 1 (token tile x) × features f0 .. f0 + 15.
    // The 8- and 16-token tiles run one token tile (T <= BT: the decode kernels keep their code).
    constexpr bool TILES = BT == 32;
    const int N = a.out_dim, K = a.in_dim, t0 = TILES ? blockIdx.x * BT : 0;
    const int T = TILES ? min(a.n_rows - t0, BT) : a.n_rows;
    const int f0 = blockIdx.y * TS_BN;
    const int KT = (K + TS_BK - 1) / TS_BK, n_steps = (K + 15) / 16;
    const bool rt = ROPE && f0 < a.part_dim[0] + a.part_dim[1]; // a tile of RoPE pairs

    // Copy roles (see above). Tile row r of a stage holds W row ts_feature(r) (r < 16: f0 + r
    // unless a RoPE tile) or x row r − 16; chunk c of row r sits at mm_off<TS_BK>(r, c), and
    // (16 + w + 8j) & 7 == w & 7 == w.
    const ds_bf16 *W = (const ds_bf16 *)a.w, *X = (const ds_bf16 *)a.x + (size_t)t0 * K;
    const ds_bf16 *w0 = W + (size_t)min(ts_feature(a, rt, f0, warp), N - 1) * K + lane * 8;
    const ds_bf16 *w1 = W + (size_t)min(ts_feature(a, rt, f0, warp + 8), N - 1) * K + lane * 8;
    const ds_bf16 *xr[NI];
    int nx = 0;
#pragma unroll
    for (int j = 0; j < NI; j++) {
        const int r = warp + 8 * j;
        xr[j] = X + (size_t)(r < T ? r : 0) * K + lane * 8;
        nx += r < T;
    }
    const uint32_t w_off = mm_off<TS_BK>(warp, lane);
    const uint32_t x_off = mm_off<TS_BK>(TS_BN + warp, lane);
    const uint32_t ring = smem_u32(mm_smem);

    // x rows T .. BT − 1 are never copied: zero them in every stage, once.
#pragma unroll
    for (int j = 0; j < NI; j++)
        if (j >= nx)
            for (int s = 0; s < STAGES; s++)
                *(uint4 *)(mm_smem + s * STAGE_BYTES + x_off + j * 8 * TS_ROW_BYTES) =
                    make_uint4(0u, 0u, 0u, 0u);

    // Everything above is registers and shared memory. TS_EARLY: the first stages' weights, one
    // group per stage, then (after the previous kernel) their x rows in one more group; the k
    // loop's first wait takes them all. Otherwise the L2 prefetch (a cache hint, see
    // mm_prefetch_w), then whole stages once the previous kernel is done.
    if constexpr (TS_EARLY) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < KT) ts_load_w(ring + s * STAGE_BYTES, w_off, w0, w1, s * TS_BK, lane * 8, K);
            cp_async_commit();
        }
        DS_GRID_DEPENDENCY();
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++)
            if (s < KT) ts_load_x<NI>(ring + s * STAGE_BYTES, x_off, xr, nx, s * TS_BK, lane * 8, K);
        cp_async_commit();
    } else {
        if (blockIdx.x == 0) mm_prefetch_w(W, f0, TS_BN, N, K);
        DS_GRID_DEPENDENCY();
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < KT)
                ts_load_stage<NI>(ring + s * STAGE_BYTES, w_off, x_off, w0, w1, xr, nx, s * TS_BK,
                                  lane * 8, K);
            cp_async_commit();
        }
    }

    // The row scales of a deferred norm (after the ring): the copy warps 2 .. 7, whose x copies
    // are in flight, read the rows of rms_of now, or (rs_pre) the scales bf16_row_scale formed
    // just before; the k loop's barriers publish them to warp 0's epilogue.
    float *s_row = (float *)(mm_smem + STAGES * STAGE_BYTES);
    if ((DN & DN_SCALE) && a.rms_of) {
        if (rs_pre) {
            for (int r = (int)threadIdx.x - 2 * DS_WARP; r >= 0 && r < T; r += 6 * DS_WARP)
                s_row[r] = mm_rs_buf[t0 + r];
        } else {
            mm_row_scales<true>(a, t0, T, 2, 6, s_row);
        }
    }

    float acc[NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ni++) acc[ni][0] = acc[ni][1] = acc[ni][2] = acc[ni][3] = 0.0f;
    // ldmatrix lane roles as in the tile kernel (WM = WT = 1).
    const int mat = lane >> 3, r8 = lane & 7;
    const int a_row = r8 + (mat & 1) * 8, a_kc = mat >> 1;
    const int b_row = TS_BN + r8 + (mat >> 1) * 8, b_kc = mat & 1;
    const ts_frag fa = ts_frag_of(a_row, 2 * warp + a_kc);
    const ts_frag fb = ts_frag_of(NI == 1 ? TS_BN + r8 : b_row, 2 * warp + b_kc);
    // Warp 0's outputs: their bias and residual go out now and arrive during the k loop (Nsight
    // Compute put the loads of the old epilogue among the kernel's top stalls). Up to 16 tokens:
    // the 32-token tile would hold 48 more registers through the loop (it spilled), so it loads
    // them in the epilogue.
    constexpr bool PRE = NI <= 2;
    const int g = lane >> 2, q = lane & 3;
    mm_add ad[PRE ? NI : 1][4];
    if constexpr (PRE)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int n = ts_feature(a, rt, f0, g + (r >> 1) * 8), t = ni * 8 + 2 * q + (r & 1);
                ad[ni][r] = warp == 0 && n < N && t < T ? mm_addends<DN>(a, t0 + t, n)
                                                        : mm_add{0.f, 0.f, 0.f};
            }
    // RoPE tile: the cos and sin of pair g at tokens 2q, 2q + 1 (positions first: a chain of two
    // loads, issued here so that it ends during the k loop); ok[e]: the position is in the table.
    float rc[2] = {0.f, 0.f}, rs[2] = {0.f, 0.f};
    bool rok[2] = {false, false};
    if (ROPE && rt && warp == 0)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int t = 2 * q + e, H = a.rope_head_dim / 2;
            if (t >= T) continue;
            const int32_t p = a.rope_positions[t0 + t];
            rok[e] = p >= 0 && p < a.rope_table_len;
            const size_t ti = (size_t)(rok[e] ? p : 0) * H + f0 % a.rope_head_dim / 16 * 8 + g;
            rc[e] = __ldg(a.rope_cos + ti), rs[e] = __ldg(a.rope_sin + ti);
        }

    for (int kt = 0; kt < KT; kt++) {
        // This thread's copies of k-tile kt have landed (TS_EARLY: the prologue has one group
        // more, the x rows of its stages, and the first wait takes all of its groups).
        if (TS_EARLY && kt == 0) cp_async_wait<0>();
        else cp_async_wait<STAGES - 2>();
        __syncthreads(); // everyone's have, and k-tile kt − 1 is no longer read
        const int nk = kt + STAGES - 1;
        if (nk < KT)
            ts_load_stage<NI>(ring + (nk % STAGES) * STAGE_BYTES, w_off, x_off, w0, w1, xr, nx,
                              nk * TS_BK, lane * 8, K);
        cp_async_commit(); // possibly empty: keeps the group count of the wait above exact
        if (warp >= 2) continue;
        // Warp 0: the even steps (a0), warp 1: the odd ones (a1); KSTEPS is even, so the parity
        // of the step within the k-tile is the parity of the global step.
        if ((kt + 1) * KSTEPS <= n_steps) {
            // A whole k-tile: the fragments of 4 steps are in flight ahead of the mma's (a ring
            // of 4 register sets), so each step waits on the previous mma only, not on its own
            // shared loads. Same mma's in the same order as the step loop below.
            const uint32_t s0 = ring + (uint32_t)((kt % STAGES) * STAGE_BYTES);
            uint32_t af[4][4], bf[4][NI][2];
#pragma unroll
            for (int j = 0; j < 4; j++) ts_frags<NI>(s0, j, fa, fb, af[j], bf[j]);
#pragma unroll
            for (int ii = 0; ii < KSTEPS / 2; ii++) {
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
                    mma_bf16_16816(acc[ni], af[ii & 3], bf[ii & 3][ni][0], bf[ii & 3][ni][1]);
                if (ii + 4 < KSTEPS / 2) ts_frags<NI>(s0, ii + 4, fa, fb, af[ii & 3], bf[ii & 3]);
            }
            continue;
        }
        // The last, partial k-tile: step by step, up to the last step of K.
        const unsigned char *st = mm_smem + (kt % STAGES) * STAGE_BYTES;
#pragma unroll
        for (int ii = 0; ii < KSTEPS / 2; ii++) {
            const int i = 2 * ii + warp;
            if (kt * KSTEPS + i >= n_steps) break;
            uint32_t af[4], bf[NI][2];
            ldmatrix_x4(af, st + mm_off<TS_BK>(a_row, i * 2 + a_kc));
            if (NI == 1) { // lanes 0-15 address the tile's two k halves
                ldmatrix_x2(bf[0], st + mm_off<TS_BK>(b_row - (mat >> 1) * 8, i * 2 + b_kc));
            } else {
#pragma unroll
                for (int ni = 0; ni + 1 < NI; ni += 2) {
                    uint32_t r[4];
                    ldmatrix_x4(r, st + mm_off<TS_BK>(b_row + ni * 8, i * 2 + b_kc));
                    bf[ni][0] = r[0], bf[ni][1] = r[1], bf[ni + 1][0] = r[2], bf[ni + 1][1] = r[3];
                }
            }
#pragma unroll
            for (int ni = 0; ni < NI; ni++) mma_bf16_16816(acc[ni], af, bf[ni][0], bf[ni][1]);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); // the ring is free: reuse it for the a1 hand-over

    float *xch = (float *)mm_smem;
    if (warp == 1)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++) xch[(ni * 4 + r) * DS_WARP + lane] = acc[ni][r];
    __syncthreads();
    if (warp != 0) return;
    if (ROPE && rt) {
        // Pair g at token 2q + e: the product's two outputs as it would store them ((a0 + a1) +
        // bias, one rounding to bf16; a split has no residual), then the rotation.
        const int n0 = ts_feature(a, true, f0, g), n1 = n0 + a.rope_head_dim / 2;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int t = 2 * q + e;
            if (t >= T) continue;
            const mm_dst d0 = mm_dst_of(a, t0 + t, n0), d1 = mm_dst_of(a, t0 + t, n1);
            float v0 = acc[0][e] + xch[e * DS_WARP + lane];
            float v1 = acc[0][2 + e] + xch[(2 + e) * DS_WARP + lane];
            if ((DN & DN_SCALE) && a.rms_of)
                v0 = __fmul_rn(v0, s_row[t]), v1 = __fmul_rn(v1, s_row[t]);
            if (d0.bias) v0 = __fadd_rn(v0, ad[0][e].b);
            if (d1.bias) v1 = __fadd_rn(v1, ad[0][2 + e].b);
            float r0 = NAN, r1 = NAN;
            if (rok[e])
                ds_rope_pair(ds_bf16_to_f32(ds_f32_to_bf16(v0)), ds_bf16_to_f32(ds_f32_to_bf16(v1)),
                             rc[e], rs[e], &r0, &r1);
            ((ds_bf16 *)d0.p)[d0.o] = ds_f32_to_bf16(r0);
            ((ds_bf16 *)d1.p)[d1.o] = ds_f32_to_bf16(r1);
        }
        return;
    }
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int n = f0 + g + (r >> 1) * 8, t = ni * 8 + 2 * q + (r & 1);
            if (n >= N || t >= T) continue;
            mm_finish_add<DN>(a, t0 + t, n, acc[ni][r] + xch[(ni * 4 + r) * DS_WARP + lane],
                              PRE ? ad[PRE ? ni : 0][r] : mm_addends<DN>(a, t0 + t, n),
                              (DN & DN_SCALE) && a.rms_of ? s_row[t] : 1.0f);
        }
}

// The kernel with the deferred-norm paths of this call compiled in (DN), so that a plain
// product (the lm_head, the draft) keeps its registers and code.
template <int BT, int STAGES, bool ROPE = false>
static enum ds_status ts_launch(const struct ds_matmul_args *a, cudaStream_t s, int rs = 0) {
    static void (*const ks[4])(const struct ds_matmul_args, int) = {
        bf16_bf16w_matmul_tc_stream<BT, STAGES, ROPE, 0>,
        bf16_bf16w_matmul_tc_stream<BT, STAGES, ROPE, DN_SCALE>,
        bf16_bf16w_matmul_tc_stream<BT, STAGES, ROPE, DN_GAIN>,
        bf16_bf16w_matmul_tc_stream<BT, STAGES, ROPE, DN_SCALE | DN_GAIN>};
    const int dn = (a->rms_of ? DN_SCALE : 0) | (a->norm_gain ? DN_GAIN : 0);
    void (*k)(const struct ds_matmul_args, int) = ks[dn];
    const int smem = STAGES * (TS_BN + BT) * TS_ROW_BYTES + BT * (int)sizeof(float); // + scales
    static int set[4] = {0, 0, 0, 0};
    ds_smem_attr(k, &set[dn], smem);
    const unsigned gy = cu_blocks(a->out_dim, TS_BN);
    if (gy > 65535u)
        return ds_error_set(DS_ERR_UNSUPPORTED, "matmul: %d output features (at most %d)",
                            a->out_dim, 65535 * TS_BN);
    ds_launch(k, dim3(BT == 32 ? cu_blocks(a->n_rows, BT) : 1u, gy), TS_THREADS, smem, s, *a, rs);
    return DS_OK;
}

// THE ROW SCALE of every row of a wide-tile call (deferred norm, T > 16 or unaligned rows), one
// warp per row, into the module's buffer, which the tile kernel launched next on the stream reads
// after its grid dependency. Module state, like the router's slots: calls with rms_of on the
// tile path must not overlap in time (every caller issues its ops on one stream); a call's
// kernel writes only after the previous call's tile has ended (its grid dependency).

__global__ void __launch_bounds__(MM_RS_WARPS *DS_WARP)
    bf16_row_scale(const struct ds_matmul_args a) {
    DS_GRID_DEPENDENCY();
    const int t = (int)blockIdx.x * MM_RS_WARPS + (int)threadIdx.x / DS_WARP;
    if (t >= a.n_rows) return;
    const float sc = ds_row_scale_warp<true>((const ds_bf16 *)a.rms_of + (size_t)t * a.in_dim,
                                             a.in_dim, a.rms_eps);
    if (threadIdx.x % DS_WARP == 0) mm_rs_buf[t] = sc;
}

// Launches bf16_row_scale for a's rows: 1, or 0 without rms_of or with too many rows (the tile
// then forms the scales itself).
static int mm_row_scales_launch(const struct ds_matmul_args *a, cudaStream_t s) {
    if (!a->rms_of || a->n_rows > MM_RS_MAX) return 0;
    ds_launch(bf16_row_scale, cu_blocks(a->n_rows, MM_RS_WARPS), MM_RS_WARPS * DS_WARP, 0, s, *a);
    return 1;
}

// Launches one tile shape: grid.x over token tiles (the blocks sharing a weight tile run side by
// side, so W is read from DRAM about once), grid.y over feature tiles.
template <int BN, int BT, int BK, int WM, int WT, int WK, int STAGES>
static enum ds_status mm_launch(const struct ds_matmul_args *a, int vec, cudaStream_t s, int rs) {
    void (*k)(const struct ds_matmul_args, int, int) =
        bf16_bf16w_matmul_tc<BN, BT, BK, WM, WT, WK, STAGES>;
    const int smem = STAGES * (BN + BT) * BK * 2 + BT * (int)sizeof(float); // ring, row scales
    const unsigned gy = cu_blocks(a->out_dim, BN);
    if (gy > 65535u)
        return ds_error_set(DS_ERR_UNSUPPORTED, "matmul: %d output features (at most %d)",
                            a->out_dim, 65535 * BN);
    static int set = 0;
    ds_smem_attr(k, &set, smem);
    ds_launch(k, dim3(cu_blocks(a->n_rows, BT), gy), WM * WT * WK * DS_WARP, smem, s, *a, vec, rs);
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Matmul, CUDA-core path (any dtype pair): one warp per output feature, MM_TOKENS tokens per block
// in groups of 4 that share each weight load.

#define SIMT_GROUP 4

template <typename TA, typename TW>
static __device__ __forceinline__ void matmul_simt_body(const struct ds_matmul_args &a) {
    const int lane = threadIdx.x % DS_WARP;
    const int n = blockIdx.x * MM_WARPS + threadIdx.x / DS_WARP;
    if (n >= a.out_dim) return;
    const int K = a.in_dim, N = a.out_dim;
    const int t_end = min(a.n_rows, (int)(blockIdx.y + 1) * MM_TOKENS);
    const TW *w = (const TW *)a.w + (size_t)n * K;
    const TA *x = (const TA *)a.x;
    for (int t0 = blockIdx.y * MM_TOKENS; t0 < t_end; t0 += SIMT_GROUP) {
        float s[SIMT_GROUP] = {0.f, 0.f, 0.f, 0.f};
        for (int k = lane; k < K; k += DS_WARP) {
            const float wk = ld_f(w, k);
#pragma unroll
            for (int j = 0; j < SIMT_GROUP; j++)
                if (t0 + j < t_end) s[j] = fmaf(ld_f(x, (size_t)(t0 + j) * K + k), wk, s[j]);
        }
#pragma unroll
        for (int j = 0; j < SIMT_GROUP; j++) s[j] = warp_sum_f(s[j]);
        // THE ROW SCALE of the group's rows (deferred norm), by this warp: every warp of every
        // path forms the same bits for a row.
        float sc[SIMT_GROUP] = {1.f, 1.f, 1.f, 1.f};
        if (a.rms_of)
#pragma unroll
            for (int j = 0; j < SIMT_GROUP; j++)
                if (t0 + j < t_end)
                    sc[j] = ds_row_scale_warp<sizeof(TA) == 2>(
                            (const TA *)a.rms_of + (size_t)(t0 + j) * K, K, a.rms_eps);
        if (lane < SIMT_GROUP && t0 + lane < t_end) {
            const int t = t0 + lane;
            float v = s[0], c = sc[0];
#pragma unroll
            for (int j = 1; j < SIMT_GROUP; j++) v = lane == j ? s[j] : v, c = lane == j ? sc[j] : c;
            const mm_dst d = mm_dst_of(a, t, n);
            if (a.rms_of) v = __fmul_rn(v, c);
            if (d.bias) v = __fadd_rn(v, ld_elem(d.bias, a.bias_dtype, d.bi));
            if (a.residual) v = __fadd_rn(v, ld_f((const TA *)a.residual, (size_t)t * N + n));
            st_f((TA *)d.p, d.o, v);
            if (a.norm_gain)
                st_f((TA *)a.norm_out, (size_t)t * N + n,
                     ds_norm_gain_mul(a.norm_gain, a.norm_gain_dtype, (size_t)n,
                                      ld_f((const TA *)d.p, d.o)));
        }
    }
}

#define MATMUL_SIMT_KERNEL(name, TA, TW)                                                           \
    __global__ void __launch_bounds__(MM_THREADS) name(const struct ds_matmul_args a) {           \
        DS_GRID_DEPENDENCY();                                                                      \
        matmul_simt_body<TA, TW>(a);                                                               \
    }
MATMUL_SIMT_KERNEL(f32_f32w_matmul_simt, float, float)
MATMUL_SIMT_KERNEL(f32_bf16w_matmul_simt, float, ds_bf16)
MATMUL_SIMT_KERNEL(bf16_f32w_matmul_simt, ds_bf16, float)

extern "C" enum ds_status ds_matmul_cuda(const struct ds_matmul_args *a, void *stream) {
    static const char op[] = "matmul";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dtype(op, "weight", a->w_dtype));
    if (a->bias || a->bias1 || a->bias2) CU_TRY(cu_check_dtype(op, "bias", a->bias_dtype));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "in_dim", a->in_dim, 1));
    CU_TRY(cu_check_dim(op, "out_dim", a->out_dim, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "x", a->x));
    CU_TRY(cu_check_ptr(op, "weight", a->w));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    if (a->out == a->x) return ds_error_set(DS_ERR_ARG, "%s: out must not alias x", op);
    CU_TRY(ds_matmul_check_split(op, a)); // the reference's checks
    CU_TRY(ds_matmul_check_rope(op, a));
    CU_TRY(check_align_e(op, "x", a->x, a->act));
    CU_TRY(check_align_e(op, "weight", a->w, a->w_dtype));
    CU_TRY(check_align_e(op, "residual", a->residual, a->act));
    CU_TRY(check_align_e(op, "out", a->out, a->act));
    if (a->part_dim[0] > 0) {
        if (a->part_dim[1] > 0) CU_TRY(check_align_e(op, "out1", a->out1, a->act));
        if (a->part_dim[2] > 0) CU_TRY(check_align_e(op, "out2", a->out2, a->act));
        CU_TRY(check_align_e(op, "bias1", a->bias1, a->bias_dtype));
        CU_TRY(check_align_e(op, "bias2", a->bias2, a->bias_dtype));
    }
    CU_TRY(check_align_e(op, "bias", a->bias, a->bias_dtype));
    if (a->rms_of) { // THE ROW SCALE reads whole 16-byte groups of each row
        if (a->in_dim % 8 || !aligned16(a->rms_of))
            return ds_error_set(DS_ERR_UNSUPPORTED, "%s: a deferred norm needs in_dim %% 8 == 0 "
                                "(%d) and a 16-byte aligned rms_of", op, a->in_dim);
        if (!(a->rms_eps >= 0.0f))
            return ds_error_set(DS_ERR_ARG, "%s: rms_eps %g is negative", op, a->rms_eps);
    }
    if (a->norm_gain && a->part_dim[0] > 0)
        return ds_error_set(DS_ERR_ARG, "%s: a split output takes no norm_gain", op);
    if (a->rms_of && a->rms_of == a->out)
        return ds_error_set(DS_ERR_ARG, "%s: rms_of must not alias out", op);
    if (a->norm_gain) {
        const void *in[3] = {a->out, a->x, a->residual};
        static const char *const nm[3] = {"out", "x", "residual"};
        for (int i = 0; i < 3; i++) // the reference's checks, the same words
            if (in[i] && a->norm_out == in[i])
                return ds_error_set(DS_ERR_ARG, "%s: norm_out must not alias %s", op, nm[i]);
    }
    CU_TRY(check_norm_out(op, a->norm_gain, a->norm_gain_dtype, a->norm_out, a->act, a->out));
    cudaStream_t s = DS_STREAM(stream);
    if (a->rope_cos) {
        // The fused RoPE inside the stream tile (bf16, up to 8 rows, D % 16 == 0: tiles of 8
        // pairs); otherwise the product, then the rope kernel on its q and k parts. The same bits
        // either way (ds_rope_pair).
        if (a->act == DS_ELEM_BF16 && a->w_dtype == DS_ELEM_BF16 && a->in_dim % 8 == 0 &&
            aligned16(a->x) && aligned16(a->w) && a->n_rows <= 8 && a->rope_head_dim % 16 == 0) {
            CU_TRY((ts_launch<8, TS_STAGES8, true>(a, s)));
            DS_KERNEL_CHECK();
            return DS_OK;
        }
        struct ds_matmul_args b = *a;
        b.rope_cos = NULL;
        CU_TRY(ds_matmul_cuda(&b, stream));
        const struct ds_rope_args r = ds_matmul_rope_args(a);
        return ds_rope_cuda(&r, stream);
    }
    if (a->act == DS_ELEM_BF16 && a->w_dtype == DS_ELEM_BF16) {
        const int vec = a->in_dim % 8 == 0 && aligned16(a->x) && aligned16(a->w);
        // The tile follows T (see THE REDUCTION ORDER: every shape gives the same bits).
        // With 16-byte copies, T <= 32, or T <= TS_32_MAX_T for N <= TS_32_MAX_N (decode, verify):
        // the weight-streaming tile, 16 features per block (N / 16 blocks per token tile of 8, 16
        // or 32 rows). Otherwise T <= 8: the 16 × 8 tile (element loads); T <= MM_MID_T: 32 × 64
        // tiles (or 16 × 64 with MM_NARROW64); larger T (prefill): 64 × 128.
        const int T = a->n_rows;
        if (vec && T <= 8) CU_TRY((ts_launch<8, TS_STAGES8>(a, s)));
        else if (vec && T <= 16) CU_TRY((ts_launch<16, 6>(a, s)));
        else if (vec && TS_32 && (T <= 32 || (T <= TS_32_MAX_T && a->out_dim <= TS_32_MAX_N))) {
            const int rs = TS_32_RS ? mm_row_scales_launch(a, s) : 0;
            CU_TRY((ts_launch<32, TS_STAGES32>(a, s, rs)));
        } else {
            const int rs = mm_row_scales_launch(a, s);
            if (T <= 8) CU_TRY((mm_launch<16, 8, 256, 1, 1, 2, 4>(a, vec, s, rs)));
            else if (T <= MM_MID_T && MM_NARROW64)
                CU_TRY((mm_launch<16, 64, 128, 1, 2, 2, 4>(a, vec, s, rs)));
            else if (T <= MM_MID_T) CU_TRY((mm_launch<32, 64, 128, 2, 2, 2, 4>(a, vec, s, rs)));
            else CU_TRY((mm_launch<64, 128, 64, 2, 4, 1, 4>(a, vec, s, rs)));
        }
    } else {
        if ((unsigned)(a->n_rows + MM_TOKENS - 1) / MM_TOKENS > 65535u)
            return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d rows in one call (at most %d)", op,
                                a->n_rows, 65535 * MM_TOKENS);
        const unsigned gy = cu_blocks(a->n_rows, MM_TOKENS);
        void (*k)(const struct ds_matmul_args) =
            a->act == DS_ELEM_F32 ? (a->w_dtype == DS_ELEM_BF16 ? f32_bf16w_matmul_simt
                                                                : f32_f32w_matmul_simt)
                                  : bf16_f32w_matmul_simt;
        ds_launch(k, dim3(cu_blocks(a->out_dim, MM_WARPS), gy), MM_THREADS, 0, s, *a);
    }
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Elementwise ops

template <typename TA>
static __device__ __forceinline__ void add_body(const struct ds_add_args &a) {
    const size_t n = (size_t)a.n_rows * a.dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_f((TA *)a.out, i, ld_f((const TA *)a.a, i) + ld_f((const TA *)a.b, i));
}
__global__ void f32_add(const struct ds_add_args a) {
    DS_GRID_DEPENDENCY();
    add_body<float>(a);
}
__global__ void bf16_add(const struct ds_add_args a) {
    DS_GRID_DEPENDENCY();
    add_body<ds_bf16>(a);
}

template <typename TA>
static __device__ __forceinline__ void silu_mul_body(const struct ds_silu_mul_args &a) {
    const size_t n = (size_t)a.n_rows * a.dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const double g = ld_f((const TA *)a.gate, i);
        st_f((TA *)a.out, i, (float)(g / (1.0 + exp(-g)) * (double)ld_f((const TA *)a.up, i)));
    }
}
__global__ void f32_silu_mul(const struct ds_silu_mul_args a) {
    DS_GRID_DEPENDENCY();
    silu_mul_body<float>(a);
}
__global__ void bf16_silu_mul(const struct ds_silu_mul_args a) {
    DS_GRID_DEPENDENCY();
    silu_mul_body<ds_bf16>(a);
}

// Grid of an elementwise kernel: enough blocks to fill the GPU several times over, then the
// grid-stride loop covers the rest. Elementwise results do not depend on the split.
static unsigned ew_blocks(size_t n) {
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

extern "C" enum ds_status ds_add_cuda(const struct ds_add_args *a, void *stream) {
    static const char op[] = "add";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "dim", a->dim, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "a", a->a));
    CU_TRY(cu_check_ptr(op, "b", a->b));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    CU_TRY(check_align_e(op, "a", a->a, a->act));
    CU_TRY(check_align_e(op, "b", a->b, a->act));
    CU_TRY(check_align_e(op, "out", a->out, a->act));
    const unsigned nb = ew_blocks((size_t)a->n_rows * a->dim);
    ds_launch(a->act == DS_ELEM_BF16 ? bf16_add : f32_add, nb, 256, 0, DS_STREAM(stream), *a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

extern "C" enum ds_status ds_silu_mul_cuda(const struct ds_silu_mul_args *a, void *stream) {
    static const char op[] = "silu_mul";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "dim", a->dim, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "gate", a->gate));
    CU_TRY(cu_check_ptr(op, "up", a->up));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    CU_TRY(check_align_e(op, "gate", a->gate, a->act));
    CU_TRY(check_align_e(op, "up", a->up, a->act));
    CU_TRY(check_align_e(op, "out", a->out, a->act));
    const unsigned nb = ew_blocks((size_t)a->n_rows * a->dim);
    ds_launch(a->act == DS_ELEM_BF16 ? bf16_silu_mul : f32_silu_mul, nb, 256, 0,
              DS_STREAM(stream), *a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Row gather: one thread per 8-element group of the output, like embed (a copy: bitwise).

template <typename TA>
static __device__ __forceinline__ void gather_rows_body(const struct ds_gather_rows_args &a,
                                                        int vec) {
    const int C = a.dim, G = (C + 7) / 8;
    const size_t i = blockIdx.x * (size_t)ROWS_THREADS + threadIdx.x;
    if (i >= (size_t)a.n_rows * G) return;
    const int t = (int)(i / G), gi = (int)(i % G);
    const int32_t r = a.rows[t];
    const TA *src = r >= 0 && r < a.src_rows ? (const TA *)a.x + (size_t)r * C : NULL;
    copy_group((TA *)a.out + (size_t)t * C, src, gi, C, vec);
}
__global__ void __launch_bounds__(ROWS_THREADS)
    f32_gather_rows(const struct ds_gather_rows_args a, int vec) {
    DS_GRID_DEPENDENCY();
    gather_rows_body<float>(a, vec);
}
__global__ void __launch_bounds__(ROWS_THREADS)
    bf16_gather_rows(const struct ds_gather_rows_args a, int vec) {
    DS_GRID_DEPENDENCY();
    gather_rows_body<ds_bf16>(a, vec);
}

extern "C" enum ds_status ds_gather_rows_cuda(const struct ds_gather_rows_args *a, void *stream) {
    static const char op[] = "gather_rows";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "dim", a->dim, 1));
    CU_TRY(cu_check_dim(op, "src_rows", a->src_rows, 0));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "x", a->x));
    CU_TRY(cu_check_ptr(op, "rows", a->rows));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    CU_TRY(check_align_e(op, "x", a->x, a->act));
    CU_TRY(check_align(op, "rows", a->rows, 4, "int32"));
    CU_TRY(check_align_e(op, "out", a->out, a->act));
    const size_t groups = (size_t)a->n_rows * (size_t)((a->dim + 7) / 8);
    if ((groups + ROWS_THREADS - 1) / ROWS_THREADS > (size_t)INT32_MAX)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d rows of %d are too many", op, a->n_rows,
                            a->dim);
    const int vec = a->dim % 8 == 0 && aligned16(a->x) && aligned16(a->out);
    ds_launch(a->act == DS_ELEM_BF16 ? bf16_gather_rows : f32_gather_rows,
              cu_blocks(groups, ROWS_THREADS), ROWS_THREADS, 0, DS_STREAM(stream), *a, vec);
    DS_KERNEL_CHECK();
    return DS_OK;
}
