// kernels/cuda/dense.cu: the dense ops on CUDA — embedding lookup, RMSNorm, matmul (bias, fused
// residual), elementwise add, SiLU-gated product, row gather. Math and shapes: ds/kernel_args.h.
//
// Layouts: activations (T, C) row-major in act (bf16 or f32); weights W[N][K] row-major as in the
// checkpoint (y = x·Wᵀ). All math is fp32 or wider; bf16 is storage only (RNE rounding once per
// output element).
//
// Kernels (names read <act>_<weight>w_<op>):
//   <a>_<w>w_embed            one block per row; copies (and converts) the table row
//   <a>_<w>w_rmsnorm          one warp per row; Σx² and the scaling in double (as the reference)
//   bf16_bf16w_matmul_mma     the production matmul: bf16 tensor cores (mma.sync m16n8k16, fp32
//                             accumulation), weight streaming; used for every T when act and
//                             weights are bf16
//   <a>_<w>w_matmul_simt      fp32 CUDA-core matmul for the other dtype pairs (f32 activations:
//                             tests against the reference, fp32 runs)
//   <a>_add, <a>_silu_mul     elementwise, grid-stride (silu in double, as the reference)
//   <a>_gather_rows           one block per gathered row
//
// Batch invariance of the matmul (the property the profiler rests on). For one (N, K) matrix the
// reduction order of every output element is fixed by K alone:
//   - the K axis is cut into 32-wide chunks; chunk c belongs to warp-split ks = c mod KS; within a
//     chunk two mma.sync instructions accumulate 16 k-values each (lane quad q holds k = 8q..8q+7
//     of the chunk, the same permutation of k for x and W, so it is still the dot product);
//   - each split accumulates its chunks in increasing order into fp32 registers;
//   - the KS partial sums are added in the fixed order ((p0 + p1) + p2) + p3 ... in shared memory;
//   - then + bias, + residual, one rounding.
// A token's row sits in some n8 column of the mma; each column of D depends only on its own
// column of B, and the tile (MT, KS) is chosen from N only (never from T). Tokens beyond T are
// zero columns whose results are discarded. So a row gives the same bits alone or among 255 others,
// and the prefill path (many token blocks, grid.y > 1) is the very same kernel.
// The SIMT kernel: one warp per output feature, lane l sums k = l, l+32, ... in order, then a
// fixed xor butterfly; again independent of T.
//
// Device-side indices (embed ids, gather rows) are trusted, not checked on the host: an index
// outside its range yields a row of NaN (never a fault), which the NaN checks downstream report.
#include "common.cuh"
#include "ds/kernels_cuda.h"

// ---------------------------------------------------------------------------------------------
// Embedding

template <typename TA, typename TW>
static __device__ __forceinline__ void embed_body(const struct ds_embed_args &a) {
    const int t = blockIdx.x;
    const int32_t id = a.ids[t];
    const bool ok = id >= 0 && id < a.vocab;
    const TW *src = (const TW *)a.table + (size_t)(ok ? id : 0) * a.dim;
    TA *dst = (TA *)a.out + (size_t)t * a.dim;
    for (int c = threadIdx.x; c < a.dim; c += blockDim.x) st_f(dst, c, ok ? ld_f(src, c) : NAN);
}

#define EMBED_KERNEL(name, TA, TW)                                                                 \
    __global__ void name(const struct ds_embed_args a) { embed_body<TA, TW>(a); }
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
    const bool ob = a->act == DS_ELEM_BF16, tb = a->table_dtype == DS_ELEM_BF16;
    void (*k)(const struct ds_embed_args) = ob ? (tb ? bf16_bf16w_embed : bf16_f32w_embed)
                                               : (tb ? f32_bf16w_embed : f32_f32w_embed);
    k<<<a->n_rows, 256, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: one warp per row, 8 rows per block. The sum of squares runs in double in a fixed
// order (lane-strided, then the butterfly), so the result is within an ulp of the reference.

#define NORM_ROWS_PER_BLOCK 8

template <typename TA, typename TW>
static __device__ __forceinline__ void rmsnorm_body(const struct ds_rmsnorm_args &a) {
    const int lane = threadIdx.x % DS_WARP;
    const int t = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / DS_WARP;
    if (t >= a.n_rows) return;
    const int C = a.dim;
    const TA *x = (const TA *)a.x + (size_t)t * C;
    TA *y = (TA *)a.out + (size_t)t * C;
    const TW *w = (const TW *)a.w;
    double ss = 0.0;
    for (int c = lane; c < C; c += DS_WARP) {
        double v = ld_f(x, c);
        ss += v * v;
    }
    ss = warp_sum_d(ss);
    const double inv = 1.0 / sqrt(ss / C + (double)a.eps);
    // Each lane reads x[c] before writing y[c] for its own c only, so out == x is safe.
    for (int c = lane; c < C; c += DS_WARP)
        st_f(y, c, (float)((double)ld_f(w, c) * ((double)ld_f(x, c) * inv)));
}

#define RMSNORM_KERNEL(name, TA, TW)                                                               \
    __global__ void name(const struct ds_rmsnorm_args a) { rmsnorm_body<TA, TW>(a); }
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
    const bool ab = a->act == DS_ELEM_BF16, wb = a->w_dtype == DS_ELEM_BF16;
    void (*k)(const struct ds_rmsnorm_args) = ab ? (wb ? bf16_bf16w_rmsnorm : bf16_f32w_rmsnorm)
                                                 : (wb ? f32_bf16w_rmsnorm : f32_f32w_rmsnorm);
    k<<<cu_blocks(a->n_rows, NORM_ROWS_PER_BLOCK), NORM_ROWS_PER_BLOCK * DS_WARP, 0,
        DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Matmul, tensor-core path (bf16 activations × bf16 weights)
//
// Block = 8 warps = MT m-tiles (16 output features each) × KS K-splits, and MM_TOKENS tokens
// (grid.y covers T). Warp (mt, ks) streams rows f0+g and f0+g+8 of W (g = lane/4) with one
// 16-byte load per row per 32-wide chunk, and applies them to every token tile of the block.

#define MM_THREADS 256
#define MM_WARPS (MM_THREADS / DS_WARP)
#define MM_TOK_TILES 8                  // n8 token tiles per block
#define MM_TOKENS (MM_TOK_TILES * 8)    // tokens per block
#define MM_UNROLL 4                     // chunks whose weight loads are in flight together

// 8 consecutive bf16 of one row starting at k, zero beyond K or for an invalid row. `vec`: the
// row is 16-byte aligned and K % 8 == 0, so one vector load serves.
static __device__ __forceinline__ uint4 mm_load8(const ds_bf16 *row, int k, int K, bool valid,
                                                 bool vec, bool stream) {
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    if (!valid || k >= K) return r;
    if (vec) return stream ? ld_stream_u4(row + k) : *(const uint4 *)(row + k);
    uint32_t h[8];
#pragma unroll
    for (int j = 0; j < 8; j++) h[j] = k + j < K ? (uint32_t)row[k + j] : 0u;
    r.x = h[0] | h[1] << 16, r.y = h[2] | h[3] << 16;
    r.z = h[4] | h[5] << 16, r.w = h[6] | h[7] << 16;
    return r;
}

// d += A(16×16, rows: features) · B(16×8, columns: tokens), fp32 accumulation.
static __device__ __forceinline__ void mma_bf16_16816(float d[4], uint32_t a0, uint32_t a1,
                                                      uint32_t a2, uint32_t a3, uint32_t b0,
                                                      uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int MT, int KS>
__global__ void __launch_bounds__(MM_THREADS)
    bf16_bf16w_matmul_mma(const struct ds_matmul_args a, int vec) {
    static_assert(MT * KS == MM_WARPS, "a block is MT x KS warps");
    __shared__ float part[KS > 1 ? (KS - 1) * MT * MM_TOK_TILES * 4 * DS_WARP : 1];
    const int warp = threadIdx.x / DS_WARP, lane = threadIdx.x % DS_WARP;
    const int g = lane >> 2, q = lane & 3;
    const int mt = warp % MT, ks = warp / MT;
    const int N = a.out_dim, K = a.in_dim, T = a.n_rows;
    const int f0 = (blockIdx.x * MT + mt) * 16;
    const int t0 = blockIdx.y * MM_TOKENS;
    const int n_tt = min(MM_TOK_TILES, (T - t0 + 7) / 8);
    const ds_bf16 *W = (const ds_bf16 *)a.w, *X = (const ds_bf16 *)a.x;
    const bool va = f0 + g < N, vb = f0 + g + 8 < N;
    const ds_bf16 *wa = W + (size_t)(va ? f0 + g : 0) * K;
    const ds_bf16 *wb = W + (size_t)(vb ? f0 + g + 8 : 0) * K;
    // The x row this lane feeds as column g of each token tile (clamped; masked by tv[]).
    const ds_bf16 *xr[MM_TOK_TILES];
    bool tv[MM_TOK_TILES];
#pragma unroll
    for (int tt = 0; tt < MM_TOK_TILES; tt++) {
        const int t = t0 + tt * 8 + g;
        tv[tt] = t < T;
        xr[tt] = X + (size_t)(t < T ? t : 0) * K;
    }

    float acc[MM_TOK_TILES][4];
#pragma unroll
    for (int tt = 0; tt < MM_TOK_TILES; tt++) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.f;

    const int n_chunks = (K + 31) / 32;
    for (int c0 = ks; c0 < n_chunks; c0 += KS * MM_UNROLL) {
        uint4 wa4[MM_UNROLL], wb4[MM_UNROLL];
#pragma unroll
        for (int u = 0; u < MM_UNROLL; u++) { // issue every weight load before the first mma
            const int k = (c0 + u * KS) * 32 + q * 8;
            const bool in = c0 + u * KS < n_chunks;
            wa4[u] = mm_load8(wa, k, K, va && in, vec, true);
            wb4[u] = mm_load8(wb, k, K, vb && in, vec, true);
        }
#pragma unroll
        for (int u = 0; u < MM_UNROLL; u++) {
            if (c0 + u * KS >= n_chunks) break;
            const int k = (c0 + u * KS) * 32 + q * 8;
#pragma unroll
            for (int tt = 0; tt < MM_TOK_TILES; tt++) {
                if (tt < n_tt) {
                    const uint4 b = mm_load8(xr[tt], k, K, tv[tt], vec, false);
                    // k 8q+0..3 of the chunk feed the first mma, 8q+4..7 the second (the same
                    // slots in A and B, so each mma sums true products x[t][k]·w[n][k]).
                    mma_bf16_16816(acc[tt], wa4[u].x, wb4[u].x, wa4[u].y, wb4[u].y, b.x, b.y);
                    mma_bf16_16816(acc[tt], wa4[u].z, wb4[u].z, wa4[u].w, wb4[u].w, b.z, b.w);
                }
            }
        }
    }

    // Fixed-order combination of the K splits: split 0 adds 1, then 2, ... .
    if (KS > 1) {
        if (ks > 0) {
            float *p = part + ((size_t)((ks - 1) * MT + mt) * MM_TOK_TILES) * 4 * DS_WARP;
#pragma unroll
            for (int tt = 0; tt < MM_TOK_TILES; tt++)
#pragma unroll
                for (int r = 0; r < 4; r++) p[(tt * 4 + r) * DS_WARP + lane] = acc[tt][r];
        }
        __syncthreads();
        if (ks > 0) return;
#pragma unroll
        for (int s = 1; s < KS; s++) {
            const float *p = part + ((size_t)((s - 1) * MT + mt) * MM_TOK_TILES) * 4 * DS_WARP;
#pragma unroll
            for (int tt = 0; tt < MM_TOK_TILES; tt++)
#pragma unroll
                for (int r = 0; r < 4; r++) acc[tt][r] += p[(tt * 4 + r) * DS_WARP + lane];
        }
    }

    ds_bf16 *out = (ds_bf16 *)a.out;
    const ds_bf16 *res = (const ds_bf16 *)a.residual;
#pragma unroll
    for (int tt = 0; tt < MM_TOK_TILES; tt++) {
        if (tt >= n_tt) break;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int n = f0 + g + (r >> 1) * 8;
            const int t = t0 + tt * 8 + 2 * q + (r & 1);
            if (n >= N || t >= T) continue;
            float v = acc[tt][r];
            if (a.bias) v += ld_elem(a.bias, a.bias_dtype, n);
            const size_t o = (size_t)t * N + n;
            if (res) v += ds_bf16_to_f32(res[o]); // read before the write: out may be residual
            out[o] = ds_f32_to_bf16(v);
        }
    }
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
        if (lane < SIMT_GROUP && t0 + lane < t_end) {
            const int t = t0 + lane;
            float v = s[0];
#pragma unroll
            for (int j = 1; j < SIMT_GROUP; j++) v = lane == j ? s[j] : v;
            if (a.bias) v += ld_elem(a.bias, a.bias_dtype, n);
            const size_t o = (size_t)t * N + n;
            if (a.residual) v += ld_f((const TA *)a.residual, o);
            st_f((TA *)a.out, o, v);
        }
    }
}

#define MATMUL_SIMT_KERNEL(name, TA, TW)                                                           \
    __global__ void __launch_bounds__(MM_THREADS) name(const struct ds_matmul_args a) {           \
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
    if (a->bias) CU_TRY(cu_check_dtype(op, "bias", a->bias_dtype));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "in_dim", a->in_dim, 1));
    CU_TRY(cu_check_dim(op, "out_dim", a->out_dim, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "x", a->x));
    CU_TRY(cu_check_ptr(op, "weight", a->w));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    if (a->out == a->x) return ds_error_set(DS_ERR_ARG, "%s: out must not alias x", op);
    if ((unsigned)(a->n_rows + MM_TOKENS - 1) / MM_TOKENS > 65535u)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: %d rows in one call (at most %d)", op,
                            a->n_rows, 65535 * MM_TOKENS);
    cudaStream_t s = DS_STREAM(stream);
    const unsigned gy = cu_blocks(a->n_rows, MM_TOKENS);
    if (a->act == DS_ELEM_BF16 && a->w_dtype == DS_ELEM_BF16) {
        const int vec = a->in_dim % 8 == 0 && (uintptr_t)a->x % 16 == 0 && (uintptr_t)a->w % 16 == 0;
        // The tile shape depends on N only (never on T): small N splits K across the warps so
        // that enough blocks stream weights, large N gives each warp its own features.
        const int N = a->out_dim;
        if (N < 4096) {
            bf16_bf16w_matmul_mma<1, 8><<<dim3(cu_blocks(N, 16), gy), MM_THREADS, 0, s>>>(*a, vec);
        } else if (N < 16384) {
            bf16_bf16w_matmul_mma<2, 4><<<dim3(cu_blocks(N, 32), gy), MM_THREADS, 0, s>>>(*a, vec);
        } else {
            bf16_bf16w_matmul_mma<8, 1><<<dim3(cu_blocks(N, 128), gy), MM_THREADS, 0, s>>>(*a,
                                                                                          vec);
        }
    } else {
        void (*k)(const struct ds_matmul_args) =
            a->act == DS_ELEM_F32 ? (a->w_dtype == DS_ELEM_BF16 ? f32_bf16w_matmul_simt
                                                                : f32_f32w_matmul_simt)
                                  : bf16_f32w_matmul_simt;
        k<<<dim3(cu_blocks(a->out_dim, MM_WARPS), gy), MM_THREADS, 0, s>>>(*a);
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
__global__ void f32_add(const struct ds_add_args a) { add_body<float>(a); }
__global__ void bf16_add(const struct ds_add_args a) { add_body<ds_bf16>(a); }

template <typename TA>
static __device__ __forceinline__ void silu_mul_body(const struct ds_silu_mul_args &a) {
    const size_t n = (size_t)a.n_rows * a.dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const double g = ld_f((const TA *)a.gate, i);
        st_f((TA *)a.out, i, (float)(g / (1.0 + exp(-g)) * (double)ld_f((const TA *)a.up, i)));
    }
}
__global__ void f32_silu_mul(const struct ds_silu_mul_args a) { silu_mul_body<float>(a); }
__global__ void bf16_silu_mul(const struct ds_silu_mul_args a) { silu_mul_body<ds_bf16>(a); }

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
    const unsigned nb = ew_blocks((size_t)a->n_rows * a->dim);
    if (a->act == DS_ELEM_BF16) bf16_add<<<nb, 256, 0, DS_STREAM(stream)>>>(*a);
    else f32_add<<<nb, 256, 0, DS_STREAM(stream)>>>(*a);
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
    const unsigned nb = ew_blocks((size_t)a->n_rows * a->dim);
    if (a->act == DS_ELEM_BF16) bf16_silu_mul<<<nb, 256, 0, DS_STREAM(stream)>>>(*a);
    else f32_silu_mul<<<nb, 256, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Row gather

template <typename TA>
static __device__ __forceinline__ void gather_rows_body(const struct ds_gather_rows_args &a) {
    const int i = blockIdx.x;
    const int32_t r = a.rows[i];
    const bool ok = r >= 0 && r < a.src_rows;
    const TA *src = (const TA *)a.x + (size_t)(ok ? r : 0) * a.dim;
    TA *dst = (TA *)a.out + (size_t)i * a.dim;
    for (int c = threadIdx.x; c < a.dim; c += blockDim.x) {
        if (ok) dst[c] = src[c]; // a copy: bitwise, whatever the dtype
        else st_f(dst, c, NAN);
    }
}
__global__ void f32_gather_rows(const struct ds_gather_rows_args a) { gather_rows_body<float>(a); }
__global__ void bf16_gather_rows(const struct ds_gather_rows_args a) {
    gather_rows_body<ds_bf16>(a);
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
    if (a->act == DS_ELEM_BF16) bf16_gather_rows<<<a->n_rows, 256, 0, DS_STREAM(stream)>>>(*a);
    else f32_gather_rows<<<a->n_rows, 256, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}
