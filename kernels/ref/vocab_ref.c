// CPU reference of the vocabulary-row ops used by the speculative loop and its records: softmax
// with temperature / top-k / top-p, argmax, top-k lists, entropy, Σ min(p, q), the draft→target
// vocabulary scatter, and the d2t map.
//
// Every op works on one row at a time, in place of a sort: top-k and top-p find their cut-off
// value by bisection on the order-preserving integer image of the float (32 passes over the
// row), then keep the equal-valued tokens by increasing id. That gives the exact tie rule of a
// stable sort without any workspace, and sums run in double in id order.
#include <math.h>

#include "ds/kernels.h"
#include "ref_common.h"

// Integer image of a float that preserves order (−0 sorts just below +0; NaN is not expected).
static inline uint32_t order_key(float f) {
    uint32_t u = ds_f32_bits(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

// Largest key t such that at least `k` entries of z have key >= t (the k-th largest key).
static uint32_t kth_largest_key(const float *z, int n, int k) {
    uint32_t lo = 0, hi = UINT32_MAX;
    while (lo < hi) {
        uint32_t mid = lo + (uint32_t)((hi - lo) / 2 + (hi - lo) % 2);
        int count = 0;
        for (int v = 0; v < n; v++) count += order_key(z[v]) >= mid;
        if (count >= k) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Σ p[v] over entries with key >= t, in double, in id order.
static double mass_at_or_above(const float *p, int n, uint32_t t) {
    double m = 0.0;
    for (int v = 0; v < n; v++)
        if (order_key(p[v]) >= t) m += p[v];
    return m;
}

// Keeps the k largest entries of z (ties at the cut-off value by increasing id) and sets the
// others to -inf, so the softmax that follows gives them exactly 0.
static void cut_row_topk(float *z, int n, int k) {
    uint32_t t = kth_largest_key(z, n, k);
    int kept = 0;
    for (int v = 0; v < n; v++) kept += order_key(z[v]) > t;
    for (int v = 0; v < n; v++) {
        uint32_t key = order_key(z[v]);
        if (key > t) continue;
        if (key == t && kept < k) kept++;
        else z[v] = -INFINITY;
    }
}

// p: normalised probabilities. Keeps the smallest mass-ordered prefix reaching top_p, renormalises.
static void cut_row_topp(float *p, int n, double top_p) {
    if (mass_at_or_above(p, n, 0) >= top_p) {
        uint32_t lo = 0, hi = UINT32_MAX; // largest t whose mass at or above reaches top_p
        while (lo < hi) {
            uint32_t mid = lo + (uint32_t)((hi - lo) / 2 + (hi - lo) % 2);
            if (mass_at_or_above(p, n, mid) >= top_p) lo = mid;
            else hi = mid - 1;
        }
        double mass = lo < UINT32_MAX ? mass_at_or_above(p, n, lo + 1) : 0.0;
        for (int v = 0; v < n; v++) {
            uint32_t key = order_key(p[v]);
            if (key > lo) continue;
            if (key == lo && mass < top_p) mass += p[v]; // ties join by id until the mass is met
            else p[v] = 0.0f;
        }
    }
    double total = 0.0;
    for (int v = 0; v < n; v++) total += p[v];
    for (int v = 0; v < n; v++) p[v] = (float)(p[v] / total);
}

enum ds_status ds_softmax_ref(const struct ds_softmax_args *a) {
    static const char op[] = "softmax";
    REF_TRY(check_act(op, a->act));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    REF_TRY(check_dim(op, "vocab", a->vocab, 1));
    if (!(a->temperature > 0.0f) || isinf(a->temperature))
        return ds_error_set(DS_ERR_ARG, "%s: temperature %g must be positive and finite", op,
                            a->temperature);
    REF_TRY(check_dim(op, "top_k", a->top_k, 0));
    if (!(a->top_p > 0.0f))
        return ds_error_set(DS_ERR_ARG, "%s: top_p %g must be > 0", op, a->top_p);
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "logits", a->logits));
    REF_TRY(check_ptr(op, "probs", a->probs));
    const int V = a->vocab;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * V > REF_PAR_MIN_WORK)
    for (int r = 0; r < a->n_rows; r++) {
        const float *x = (const float *)a->logits + (size_t)r * V;
        float *p = a->probs + (size_t)r * V;
        // The scaled logits are staged in the output row; the cut-offs then work in place.
        for (int v = 0; v < V; v++) p[v] = (float)((double)x[v] / a->temperature);
        if (a->top_k > 0 && a->top_k < V) cut_row_topk(p, V, a->top_k);
        double m = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) m = p[v] > m ? p[v] : m;
        for (int v = 0; v < V; v++) sum += exp((double)p[v] - m);
        for (int v = 0; v < V; v++) p[v] = (float)(exp((double)p[v] - m) / sum);
        if (a->top_p < 1.0f) cut_row_topp(p, V, a->top_p);
    }
    return DS_OK;
}

static enum ds_status check_row_op(const char *op, enum ds_elem act, int n_rows, int vocab,
                                   const void *x) {
    REF_TRY(check_act(op, act));
    REF_TRY(check_dim(op, "n_rows", n_rows, 0));
    REF_TRY(check_dim(op, "vocab", vocab, 1));
    return n_rows ? check_ptr(op, "input", x) : DS_OK;
}

enum ds_status ds_argmax_ref(const struct ds_argmax_args *a) {
    static const char op[] = "argmax";
    REF_TRY(check_row_op(op, a->act, a->n_rows, a->vocab, a->x));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "ids", a->ids));
    const int V = a->vocab;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * V > REF_PAR_MIN_WORK)
    for (int r = 0; r < a->n_rows; r++) {
        const float *x = (const float *)a->x + (size_t)r * V;
        int best = -1;
        for (int v = 0; v < V; v++)
            if (!isnan(x[v]) && (best < 0 || x[v] > x[best])) best = v; // strict: lowest id wins
        a->ids[r] = best < 0 ? 0 : best;
        if (a->values) a->values[r] = best < 0 ? NAN : x[best];
    }
    return DS_OK;
}

enum ds_status ds_topk_ref(const struct ds_topk_args *a) {
    static const char op[] = "topk";
    REF_TRY(check_row_op(op, a->act, a->n_rows, a->vocab, a->x));
    if (a->k < 1 || a->k > a->vocab || a->k > DS_MAX_TOPK)
        return ds_error_set(DS_ERR_ARG, "%s: k %d outside [1, min(%d, %d)]", op, a->k, a->vocab,
                            DS_MAX_TOPK);
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "ids", a->ids));
    REF_TRY(check_ptr(op, "values", a->values));
    const int V = a->vocab, K = a->k;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * V > REF_PAR_MIN_WORK)
    for (int r = 0; r < a->n_rows; r++) {
        const float *x = (const float *)a->x + (size_t)r * V;
        int32_t *ids = a->ids + (size_t)r * K;
        float *vals = a->values + (size_t)r * K;
        int n = 0;
        for (int v = 0; v < V; v++) {
            float f = x[v];
            if (isnan(f) || (n == K && !(f > vals[K - 1]))) continue;
            int pos = n < K ? n++ : K - 1;
            while (pos > 0 && f > vals[pos - 1]) { // strict: equal values keep the lower id first
                vals[pos] = vals[pos - 1], ids[pos] = ids[pos - 1];
                pos--;
            }
            vals[pos] = f, ids[pos] = v;
        }
        for (; n < K; n++) ids[n] = -1, vals[n] = -INFINITY; // fewer than k non-NaN entries
    }
    return DS_OK;
}

enum ds_status ds_entropy_ref(const struct ds_entropy_args *a) {
    static const char op[] = "entropy";
    REF_TRY(check_row_op(op, DS_ELEM_F32, a->n_rows, a->vocab, a->probs));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "out", a->out));
    const int V = a->vocab;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * V > REF_PAR_MIN_WORK)
    for (int r = 0; r < a->n_rows; r++) {
        const float *p = a->probs + (size_t)r * V;
        double h = 0.0;
        // 0·log 0 = 0 skips the zeros; a NaN entry is not skipped, so the row's NaN shows.
        for (int v = 0; v < V; v++)
            if (!(p[v] <= 0.0f)) h -= (double)p[v] * log((double)p[v]);
        a->out[r] = (float)h;
    }
    return DS_OK;
}

enum ds_status ds_overlap_ref(const struct ds_overlap_args *a) {
    static const char op[] = "overlap";
    REF_TRY(check_row_op(op, DS_ELEM_F32, a->n_rows, a->vocab_p, a->p));
    REF_TRY(check_dim(op, "vocab_q", a->vocab_q, 1));
    if (!a->q_to_p && a->vocab_q != a->vocab_p)
        return ds_error_set(DS_ERR_MISMATCH, "%s: q has %d entries, p %d, and no map", op,
                            a->vocab_q, a->vocab_p);
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "q", a->q));
    REF_TRY(check_ptr(op, "out", a->out));
    for (int i = 0; a->q_to_p && i < a->vocab_q; i++)
        if (a->q_to_p[i] < 0 || a->q_to_p[i] >= a->vocab_p)
            return ds_error_set(DS_ERR_RANGE, "%s: map entry %d is %d, outside [0, %d)", op, i,
                                (int)a->q_to_p[i], a->vocab_p);
    const int VP = a->vocab_p, VQ = a->vocab_q;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * VQ > REF_PAR_MIN_WORK)
    for (int r = 0; r < a->n_rows; r++) {
        const float *p = a->p + (size_t)r * VP, *q = a->q + (size_t)r * VQ;
        double s = 0.0;
        for (int i = 0; i < VQ; i++) {
            float pv = p[a->q_to_p ? a->q_to_p[i] : i];
            s += pv < q[i] || isnan(pv) ? pv : q[i]; // a NaN on either side reaches the sum
        }
        a->out[r] = (float)s;
    }
    return DS_OK;
}

enum ds_status ds_vocab_scatter_ref(const struct ds_vocab_scatter_args *a) {
    static const char op[] = "vocab_scatter";
    REF_TRY(check_row_op(op, a->act, a->n_rows, a->src_vocab, a->src));
    REF_TRY(check_dim(op, "dst_vocab", a->dst_vocab, a->src_vocab));
    if (a->n_rows == 0) return DS_OK;
    REF_TRY(check_ptr(op, "map", a->map));
    REF_TRY(check_ptr(op, "dst", a->dst));
    for (int i = 0; i < a->src_vocab; i++)
        if (a->map[i] < 0 || a->map[i] >= a->dst_vocab)
            return ds_error_set(DS_ERR_RANGE, "%s: map entry %d is %d, outside [0, %d)", op, i,
                                (int)a->map[i], a->dst_vocab);
    const int D = a->src_vocab, V = a->dst_vocab;
#pragma omp parallel for schedule(static) if ((double)a->n_rows * V > REF_PAR_MIN_WORK)
    for (int r = 0; r < a->n_rows; r++) {
        float *dst = (float *)a->dst + (size_t)r * V;
        const float *src = (const float *)a->src + (size_t)r * D;
        for (int v = 0; v < V; v++) dst[v] = a->fill;
        for (int i = 0; i < D; i++) dst[a->map[i]] = src[i];
    }
    return DS_OK;
}

enum ds_status ds_d2t_to_map(const int64_t *d2t, int draft_vocab, int target_vocab,
                             int32_t *map_out) {
    static const char op[] = "d2t";
    REF_TRY(check_dim(op, "draft vocab", draft_vocab, 1));
    REF_TRY(check_dim(op, "target vocab", target_vocab, draft_vocab));
    REF_TRY(check_ptr(op, "map", map_out));
    if (!d2t && draft_vocab != target_vocab)
        return ds_error_set(DS_ERR_MISMATCH,
                            "%s: no d2t table but draft vocab %d differs from target vocab %d", op,
                            draft_vocab, target_vocab);
    int64_t prev = -1;
    for (int i = 0; i < draft_vocab; i++) {
        int64_t off = d2t ? d2t[i] : 0;
        // Range-checked before adding: i + off overflows for a hostile off near INT64_MAX.
        if (off < -(int64_t)i || off >= (int64_t)target_vocab - i)
            return ds_error_set(DS_ERR_FORMAT, "%s: entry %d is %lld: target id %d + %lld is "
                                "outside [0, %d)", op, i, (long long)off, i, (long long)off,
                                target_vocab);
        int64_t id = i + off;
        if (id <= prev)
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: entry %d maps to target id %lld, not above entry %d's %lld",
                                op, i, (long long)id, i - 1, (long long)prev);
        map_out[i] = (int32_t)id;
        prev = id;
    }
    return DS_OK;
}
