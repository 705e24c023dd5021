// kernels/cuda/vocab.cu: the vocabulary-row ops on CUDA — softmax with temperature / top-k /
// top-p, argmax, top-k lists, entropy, Σ min(p, q), and the draft→target vocabulary scatter.
// Math, tie rules and shapes: ds/kernel_args.h; the CPU twins are kernels/ref/vocab_ref.c.
//
// Layout: one row = one distribution over V entries (V up to 201,088), rows packed (rows, V).
// Every kernel runs ONE BLOCK PER ROW with a fixed block size (VOCAB_THREADS), so each row's
// reductions follow the same tree whatever the number of rows: batch invariant by construction.
//
// Kernels (names <act>_<op>):
//   <a>_softmax        pass 1 z = x / temperature staged in the output row, block max;
//                      top-k: radix select of the k-th largest z (4 passes of 8-bit digits with
//                      integer histograms), ties at the cut-off kept by increasing id (an ordered
//                      block scan), the rest set to −inf; Σ e^{z−m} in double; p = e^{z−m}/Σ;
//                      top-p: radix select of the cut-off by MASS — the masses are 64-bit fixed
//                      point (p·2^62, exact for p >= 2^-40), so the integer histograms are exact
//                      and order-free — ties by increasing id, then renormalise in double.
//   <a>_argmax         thread-strided best (NaN skipped, ties to the lower id), then a
//                      reduction with the same total order: the result is order independent.
//   <a>_topk           radix select of the k-th largest key (NaN skipped), ordered tie scan,
//                      the k winners sorted by (value desc, id asc) in shared memory.
//   f32_entropy, f32_overlap   double sums over the row, fixed block tree.
//   <a>_vocab_scatter  fill the row, then scatter the mapped entries (same block, after a
//                      barrier).
//
// Numerics against the reference: the staged z is bitwise the reference's (IEEE float division
// equals the reference's double division rounded to float); exponentials and sums are in double,
// so probabilities agree to an ulp or two (the sums differ only in summation order).
//
// Device-side maps (overlap, vocab_scatter) are trusted: an entry outside its range is skipped.
#include "common.cuh"
#include "ds/kernels_cuda.h"

#define VOCAB_THREADS 1024
#define RADIX_BINS 256
#define FP_ONE 0x1p62 // fixed-point scale of probability masses

// Shared state of one row's selection.
struct sel_shared {
    unsigned long long hist[RADIX_BINS]; // counts or fixed-point masses per digit
    unsigned long long above;            // weight strictly above the current prefix region
    unsigned long long eq;               // weight of the final bin (entries equal to the key)
    uint32_t digit;
    int none; // fewer than the target in the whole row
    double dscratch[33];
    float fscratch[33];
    unsigned long long uscratch[33];
    unsigned cscratch[33];
};

static __device__ __forceinline__ unsigned long long fp_mass(float p) {
    return p > 0.0f ? (unsigned long long)((double)p * FP_ONE) : 0ull;
}

// The largest key t such that the weight of entries with key >= t reaches `target` (weight = 1
// per entry, or the entry's fixed-point mass when MASS). Returns t; sh->above is then the weight
// strictly above t, sh->eq the weight at t, sh->none = 1 when the whole row weighs less than the
// target (t is then 0). NaN entries are ignored when skip_nan. Every thread must call it.
template <typename TV, bool MASS>
static __device__ uint32_t select_key(const TV *row, int V, unsigned long long target,
                                      bool skip_nan, struct sel_shared *sh) {
    const int lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    uint32_t prefix = 0, mask = 0;
    unsigned long long above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < RADIX_BINS; i += blockDim.x) sh->hist[i] = 0;
        __syncthreads();
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            const float f = ld_f(row, v);
            if (skip_nan && isnan(f)) continue;
            const uint32_t key = order_key(f);
            if ((key & mask) != prefix) continue;
            const unsigned long long w = MASS ? fp_mass(f) : 1ull;
            if (w) atomicAdd(&sh->hist[(key >> shift) & 0xffu], w); // integer: order-free
        }
        __syncthreads();
        if (warp == 0) {
            unsigned long long b[8], s = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) s += (b[j] = sh->hist[8 * lane + j]);
            unsigned long long suf = s; // weight of bins >= 8·lane
#pragma unroll
            for (int o = 1; o < DS_WARP; o <<= 1) {
                unsigned long long y = __shfl_down_sync(DS_FULL_MASK, suf, o);
                if (lane + o < DS_WARP) suf += y;
            }
            const unsigned ok = __ballot_sync(DS_FULL_MASK, above + suf >= target);
            if (ok == 0) {
                if (lane == 0) sh->none = 1, sh->digit = 0, sh->above = 0, sh->eq = 0;
            } else if (lane == 31 - __clz(ok)) {
                unsigned long long acc = above + suf - s; // weight of the bins of higher lanes
                int j = 7;
                for (; j > 0 && acc + b[j] < target; j--) acc += b[j];
                sh->none = 0, sh->digit = 8 * lane + j, sh->above = acc, sh->eq = b[j];
            }
        }
        __syncthreads();
        if (sh->none) return 0;
        above = sh->above;
        prefix |= sh->digit << shift;
        mask |= 0xffu << shift;
        __syncthreads(); // everyone has read sh before the next level clears it
    }
    return prefix;
}

// ---------------------------------------------------------------------------------------------
// Softmax

template <typename TA>
static __device__ void softmax_body(const struct ds_softmax_args &a, struct sel_shared *sh) {
    const int V = a.vocab;
    const TA *x = (const TA *)a.logits + (size_t)blockIdx.x * V;
    float *p = a.probs + (size_t)blockIdx.x * V;

    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        const float z = ld_f(x, v) / a.temperature;
        p[v] = z;
        m = fmaxf(m, z);
    }
    m = block_max_f(m, sh->fscratch); // barrier: the staged row is visible to the whole block

    if (a.top_k > 0 && a.top_k < V) {
        // The maximum always survives the cut, so m stays the max of the kept logits.
        const uint32_t t = select_key<float, false>(p, V, (unsigned long long)a.top_k, false, sh);
        const unsigned need = (unsigned)(a.top_k - (int)sh->above);
        if (sh->eq == need) {
            for (int v = threadIdx.x; v < V; v += blockDim.x)
                if (order_key(p[v]) < t) p[v] = -INFINITY;
        } else { // more ties than places: keep the lowest ids (ordered scan, chunk by chunk)
            unsigned carry = 0;
            for (int base = 0; base < V; base += blockDim.x) {
                const int v = base + threadIdx.x;
                const uint32_t key = v < V ? order_key(p[v]) : 0u;
                const unsigned tie = v < V && key == t;
                unsigned total;
                const unsigned before = block_excl_scan_u(tie, sh->cscratch, &total);
                if (v < V && (key < t || (tie && carry + before >= need))) p[v] = -INFINITY;
                carry += total;
            }
        }
        __syncthreads();
    }

    double sum = 0.0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += exp((double)p[v] - (double)m);
    sum = block_sum_d(sum, sh->dscratch);
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        p[v] = (float)(exp((double)p[v] - (double)m) / sum);
    __syncthreads();

    if (a.top_p < 1.0f) {
        // At least one unit, so a tiny top_p still keeps the most likely token (as the reference).
        unsigned long long tp = (unsigned long long)((double)a.top_p * FP_ONE);
        tp = tp ? tp : 1ull;
        // Key 0 is below every non-negative probability: this selects by the row's whole mass.
        const uint32_t t = select_key<float, true>(p, V, tp, false, sh);
        if (!sh->none) {
            const unsigned long long mass_above = sh->above;
            unsigned long long carry = 0;
            for (int base = 0; base < V; base += blockDim.x) {
                const int v = base + threadIdx.x;
                const float pv = v < V ? p[v] : 0.0f;
                const uint32_t key = order_key(pv);
                const bool tie = v < V && key == t;
                unsigned long long total;
                const unsigned long long before =
                    block_excl_scan_u64(tie ? fp_mass(pv) : 0ull, sh->uscratch, &total);
                // A tie joins while the mass before it is still short of top_p (id order).
                if (v < V && (key < t || (tie && mass_above + carry + before >= tp))) p[v] = 0.0f;
                carry += total;
            }
        }
        __syncthreads();
        double total = 0.0;
        for (int v = threadIdx.x; v < V; v += blockDim.x) total += p[v];
        total = block_sum_d(total, sh->dscratch);
        for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] = (float)(p[v] / total);
    }
}

__global__ void __launch_bounds__(VOCAB_THREADS) f32_softmax(const struct ds_softmax_args a) {
    __shared__ struct sel_shared sh;
    softmax_body<float>(a, &sh);
}
__global__ void __launch_bounds__(VOCAB_THREADS) bf16_softmax(const struct ds_softmax_args a) {
    __shared__ struct sel_shared sh;
    softmax_body<ds_bf16>(a, &sh);
}

extern "C" enum ds_status ds_softmax_cuda(const struct ds_softmax_args *a, void *stream) {
    static const char op[] = "softmax";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (!(a->temperature > 0.0f) || isinf(a->temperature))
        return ds_error_set(DS_ERR_ARG, "%s: temperature %g must be positive and finite", op,
                            a->temperature);
    CU_TRY(cu_check_dim(op, "top_k", a->top_k, 0));
    if (!(a->top_p > 0.0f))
        return ds_error_set(DS_ERR_ARG, "%s: top_p %g must be > 0", op, a->top_p);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "logits", a->logits));
    CU_TRY(cu_check_ptr(op, "probs", a->probs));
    if (a->act == DS_ELEM_BF16) bf16_softmax<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    else f32_softmax<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Argmax: (value, id) pairs under one total order — larger value first, then lower id; NaN loses
// to everything — so any reduction tree gives the same winner.

struct best {
    float v;
    int id; // -1: nothing yet (or only NaN)
};

static __device__ __forceinline__ struct best better(struct best a, struct best b) {
    if (b.id < 0) return a;
    if (a.id < 0) return b;
    if (a.v > b.v || (a.v == b.v && a.id < b.id)) return a;
    return b;
}

template <typename TA>
static __device__ void argmax_body(const struct ds_argmax_args &a) {
    __shared__ struct best wbest[VOCAB_THREADS / DS_WARP];
    const int V = a.vocab, lane = threadIdx.x % DS_WARP, warp = threadIdx.x / DS_WARP;
    const TA *x = (const TA *)a.x + (size_t)blockIdx.x * V;
    struct best b = {0.0f, -1};
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        const float f = ld_f(x, v);
        if (!isnan(f) && (b.id < 0 || f > b.v)) b.v = f, b.id = v; // ascending v: keeps lowest id
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        struct best c = {__shfl_xor_sync(DS_FULL_MASK, b.v, o), __shfl_xor_sync(DS_FULL_MASK, b.id, o)};
        b = better(b, c);
    }
    if (lane == 0) wbest[warp] = b;
    __syncthreads();
    if (warp == 0) {
        if (lane >= (int)(blockDim.x / DS_WARP)) b.v = 0.0f, b.id = -1;
        else b = wbest[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            struct best c = {__shfl_xor_sync(DS_FULL_MASK, b.v, o),
                             __shfl_xor_sync(DS_FULL_MASK, b.id, o)};
            b = better(b, c);
        }
        if (lane == 0) {
            a.ids[blockIdx.x] = b.id < 0 ? 0 : b.id;
            if (a.values) a.values[blockIdx.x] = b.id < 0 ? NAN : b.v;
        }
    }
}

__global__ void __launch_bounds__(VOCAB_THREADS) f32_argmax(const struct ds_argmax_args a) {
    argmax_body<float>(a);
}
__global__ void __launch_bounds__(VOCAB_THREADS) bf16_argmax(const struct ds_argmax_args a) {
    argmax_body<ds_bf16>(a);
}

extern "C" enum ds_status ds_argmax_cuda(const struct ds_argmax_args *a, void *stream) {
    static const char op[] = "argmax";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "input", a->x));
    CU_TRY(cu_check_ptr(op, "ids", a->ids));
    if (a->act == DS_ELEM_BF16) bf16_argmax<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    else f32_argmax<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Top-k list

template <typename TA>
static __device__ void topk_body(const struct ds_topk_args &a, struct sel_shared *sh) {
    __shared__ float cv[DS_MAX_TOPK];
    __shared__ int cid[DS_MAX_TOPK];
    __shared__ unsigned n_cand;
    const int V = a.vocab, K = a.k;
    const TA *x = (const TA *)a.x + (size_t)blockIdx.x * V;
    if (threadIdx.x == 0) n_cand = 0;
    const uint32_t t = select_key<TA, false>(x, V, (unsigned long long)K, true, sh);
    // Everything valid fits when the row has fewer than k non-NaN entries (sh->none).
    const bool all = sh->none;
    const unsigned need = all ? 0u : (unsigned)(K - (int)sh->above);
    if (all || sh->eq == need) {
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            const float f = ld_f(x, v);
            if (isnan(f) || (!all && order_key(f) < t)) continue;
            const unsigned slot = atomicAdd(&n_cand, 1u); // slot order is irrelevant: sorted below
            cv[slot] = f, cid[slot] = v;
        }
    } else {
        unsigned carry = 0;
        for (int base = 0; base < V; base += blockDim.x) {
            const int v = base + threadIdx.x;
            const float f = v < V ? ld_f(x, v) : NAN;
            const uint32_t key = order_key(f);
            const unsigned tie = !isnan(f) && key == t;
            unsigned total;
            const unsigned before = block_excl_scan_u(tie, sh->cscratch, &total);
            if (!isnan(f) && (key > t || (tie && carry + before < need))) {
                const unsigned slot = atomicAdd(&n_cand, 1u);
                cv[slot] = f, cid[slot] = v;
            }
            carry += total;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) { // at most 64 entries: an insertion sort by (value desc, id asc)
        const int n = (int)n_cand;
        for (int i = 1; i < n; i++) {
            const float f = cv[i];
            const int id = cid[i];
            int j = i;
            for (; j > 0 && (cv[j - 1] < f || (cv[j - 1] == f && cid[j - 1] > id)); j--)
                cv[j] = cv[j - 1], cid[j] = cid[j - 1];
            cv[j] = f, cid[j] = id;
        }
        int32_t *ids = a.ids + (size_t)blockIdx.x * K;
        float *vals = a.values + (size_t)blockIdx.x * K;
        for (int i = 0; i < K; i++) {
            ids[i] = i < n ? cid[i] : -1;
            vals[i] = i < n ? cv[i] : -INFINITY;
        }
    }
}

__global__ void __launch_bounds__(VOCAB_THREADS) f32_topk(const struct ds_topk_args a) {
    __shared__ struct sel_shared sh;
    topk_body<float>(a, &sh);
}
__global__ void __launch_bounds__(VOCAB_THREADS) bf16_topk(const struct ds_topk_args a) {
    __shared__ struct sel_shared sh;
    topk_body<ds_bf16>(a, &sh);
}

extern "C" enum ds_status ds_topk_cuda(const struct ds_topk_args *a, void *stream) {
    static const char op[] = "topk";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (a->k < 1 || a->k > a->vocab || a->k > DS_MAX_TOPK)
        return ds_error_set(DS_ERR_ARG, "%s: k %d outside [1, min(%d, %d)]", op, a->k, a->vocab,
                            DS_MAX_TOPK);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "input", a->x));
    CU_TRY(cu_check_ptr(op, "ids", a->ids));
    CU_TRY(cu_check_ptr(op, "values", a->values));
    if (a->act == DS_ELEM_BF16) bf16_topk<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    else f32_topk<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Entropy and overlap

__global__ void __launch_bounds__(VOCAB_THREADS) f32_entropy(const struct ds_entropy_args a) {
    __shared__ double scratch[33];
    const float *p = a.probs + (size_t)blockIdx.x * a.vocab;
    double h = 0.0;
    for (int v = threadIdx.x; v < a.vocab; v += blockDim.x)
        if (p[v] > 0.0f) h -= (double)p[v] * log((double)p[v]);
    h = block_sum_d(h, scratch);
    if (threadIdx.x == 0) a.out[blockIdx.x] = (float)h;
}

extern "C" enum ds_status ds_entropy_cuda(const struct ds_entropy_args *a, void *stream) {
    static const char op[] = "entropy";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab", a->vocab, 1));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "probs", a->probs));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    f32_entropy<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

__global__ void __launch_bounds__(VOCAB_THREADS) f32_overlap(const struct ds_overlap_args a) {
    __shared__ double scratch[33];
    const float *p = a.p + (size_t)blockIdx.x * a.vocab_p;
    const float *q = a.q + (size_t)blockIdx.x * a.vocab_q;
    double s = 0.0;
    for (int i = threadIdx.x; i < a.vocab_q; i += blockDim.x) {
        const int j = a.q_to_p ? a.q_to_p[i] : i;
        if (j < 0 || j >= a.vocab_p) continue;
        const float pv = p[j];
        s += pv < q[i] ? pv : q[i];
    }
    s = block_sum_d(s, scratch);
    if (threadIdx.x == 0) a.out[blockIdx.x] = (float)s;
}

extern "C" enum ds_status ds_overlap_cuda(const struct ds_overlap_args *a, void *stream) {
    static const char op[] = "overlap";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "vocab_p", a->vocab_p, 1));
    CU_TRY(cu_check_dim(op, "vocab_q", a->vocab_q, 1));
    if (!a->q_to_p && a->vocab_q != a->vocab_p)
        return ds_error_set(DS_ERR_MISMATCH, "%s: q has %d entries, p %d, and no map", op,
                            a->vocab_q, a->vocab_p);
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "p", a->p));
    CU_TRY(cu_check_ptr(op, "q", a->q));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    f32_overlap<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Vocabulary scatter

template <typename TA>
static __device__ void vocab_scatter_body(const struct ds_vocab_scatter_args &a) {
    const TA *src = (const TA *)a.src + (size_t)blockIdx.x * a.src_vocab;
    TA *dst = (TA *)a.dst + (size_t)blockIdx.x * a.dst_vocab;
    for (int v = threadIdx.x; v < a.dst_vocab; v += blockDim.x) st_f(dst, v, a.fill);
    __syncthreads(); // the fill lands before the scatter overwrites mapped entries
    for (int i = threadIdx.x; i < a.src_vocab; i += blockDim.x) {
        const int j = a.map[i];
        if (j >= 0 && j < a.dst_vocab) dst[j] = src[i]; // a copy: bitwise in either dtype
    }
}

__global__ void __launch_bounds__(VOCAB_THREADS)
    f32_vocab_scatter(const struct ds_vocab_scatter_args a) {
    vocab_scatter_body<float>(a);
}
__global__ void __launch_bounds__(VOCAB_THREADS)
    bf16_vocab_scatter(const struct ds_vocab_scatter_args a) {
    vocab_scatter_body<ds_bf16>(a);
}

extern "C" enum ds_status ds_vocab_scatter_cuda(const struct ds_vocab_scatter_args *a,
                                                void *stream) {
    static const char op[] = "vocab_scatter";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_act(op, a->act));
    CU_TRY(cu_check_dim(op, "n_rows", a->n_rows, 0));
    CU_TRY(cu_check_dim(op, "src_vocab", a->src_vocab, 1));
    CU_TRY(cu_check_dim(op, "dst_vocab", a->dst_vocab, a->src_vocab));
    if (a->n_rows == 0) return DS_OK;
    CU_TRY(cu_check_ptr(op, "src", a->src));
    CU_TRY(cu_check_ptr(op, "map", a->map));
    CU_TRY(cu_check_ptr(op, "dst", a->dst));
    if (a->act == DS_ELEM_BF16)
        bf16_vocab_scatter<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    else f32_vocab_scatter<<<a->n_rows, VOCAB_THREADS, 0, DS_STREAM(stream)>>>(*a);
    DS_KERNEL_CHECK();
    return DS_OK;
}
