// CPU reference of attention over a paged-by-slot KV cache: per-head sinks, GQA, optional
// sliding window, any mix of prefill, decode and verify sequences in one call.
//
// Cache layout (S, P, NKV, D) f32, see ds_attention_args. Phase 1 writes every row's new k/v into
// its slot at its position; phase 2 computes each (row, head) output with an online softmax in
// double that starts from the sink (m = S_h, l = 1) like the Metal and Triton references, visiting
// keys in increasing position, so each output depends only on its own row's keys and query.
#include <math.h>
#include <string.h>

#include "ds/kernels.h"
#include "ref_common.h"

static enum ds_status check_seqs(const struct ds_attention_args *a) {
    static const char op[] = "attention";
    int next_row = 0;
    for (int s = 0; s < a->n_seq; s++) {
        const struct ds_attn_seq *q = &a->seqs[s];
        if (q->n_rows < 1 || q->row0 < next_row || q->row0 > a->n_rows - q->n_rows)
            return ds_error_set(DS_ERR_ARG,
                                "%s: sequence %d rows [%d, +%d) overlap an earlier sequence or "
                                "leave the %d rows of the call",
                                op, s, (int)q->row0, (int)q->n_rows, a->n_rows);
        next_row = q->row0 + q->n_rows;
        if (q->slot < 0 || q->slot >= a->n_slots)
            return ds_error_set(DS_ERR_RANGE, "%s: sequence %d uses slot %d of %d", op, s,
                                (int)q->slot, a->n_slots);
        if (q->pos0 < 0 || q->pos0 > a->max_pos - q->n_rows)
            return ds_error_set(DS_ERR_RANGE,
                                "%s: sequence %d positions [%d, %d) exceed the cache of %d", op, s,
                                (int)q->pos0, (int)(q->pos0 + q->n_rows), a->max_pos);
        for (int o = 0; o < s; o++)
            if (a->seqs[o].slot == q->slot)
                return ds_error_set(DS_ERR_ARG, "%s: sequences %d and %d share slot %d", op, o, s,
                                    (int)q->slot);
    }
    return DS_OK;
}

static enum ds_status check_args(const struct ds_attention_args *a) {
    static const char op[] = "attention";
    REF_TRY(check_act(op, a->act));
    if (a->cache_dtype != DS_ELEM_F32)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: the CPU reference keeps an f32 KV cache", op);
    if (a->sinks) REF_TRY(check_wdtype(op, "sinks", a->sinks_dtype));
    REF_TRY(check_dim(op, "n_rows", a->n_rows, 0));
    REF_TRY(check_dim(op, "n_seq", a->n_seq, 0));
    REF_TRY(check_dim(op, "n_heads", a->n_heads, 1));
    REF_TRY(check_dim(op, "n_kv_heads", a->n_kv_heads, 1));
    REF_TRY(check_dim(op, "head_dim", a->head_dim, 1));
    REF_TRY(check_dim(op, "n_slots", a->n_slots, 1));
    REF_TRY(check_dim(op, "max_pos", a->max_pos, 1));
    REF_TRY(check_dim(op, "window", a->window, 0));
    if (a->head_dim > DS_MAX_HEAD_DIM)
        return ds_error_set(DS_ERR_UNSUPPORTED, "%s: head_dim %d above %d", op, a->head_dim,
                            DS_MAX_HEAD_DIM);
    if (a->n_heads % a->n_kv_heads)
        return ds_error_set(DS_ERR_ARG, "%s: %d query heads not a multiple of %d KV heads", op,
                            a->n_heads, a->n_kv_heads);
    if (!(a->scale > 0.0f) || isinf(a->scale))
        return ds_error_set(DS_ERR_ARG, "%s: scale %g must be positive and finite", op, a->scale);
    if (a->n_rows == 0 || a->n_seq == 0) return DS_OK;
    REF_TRY(check_ptr(op, "seqs", a->seqs));
    REF_TRY(check_ptr(op, "q", a->q));
    REF_TRY(check_ptr(op, "k", a->k));
    REF_TRY(check_ptr(op, "v", a->v));
    REF_TRY(check_ptr(op, "k_cache", a->k_cache));
    REF_TRY(check_ptr(op, "v_cache", a->v_cache));
    REF_TRY(check_ptr(op, "out", a->out));
    return check_seqs(a);
}

// Output of one query head of one row at absolute position p of a sequence in slot `slot`.
static void attend_one(const struct ds_attention_args *a, const float *q, int slot, int p, int h,
                       float *out) {
    const int D = a->head_dim, NKV = a->n_kv_heads, g = h / (a->n_heads / NKV);
    const size_t pos_stride = (size_t)NKV * D;
    const float *kc = (const float *)a->k_cache + (size_t)slot * a->max_pos * pos_stride + g * D;
    const float *vc = (const float *)a->v_cache + (size_t)slot * a->max_pos * pos_stride + g * D;
    const int first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
    double acc[DS_MAX_HEAD_DIM];
    for (int d = 0; d < D; d++) acc[d] = 0.0;
    // Online softmax; the sink enters first as one term of weight e^{S−m} without a value.
    double m = -INFINITY, l = 0.0;
    if (a->sinks) m = load_elem(a->sinks, a->sinks_dtype, (size_t)h), l = 1.0;
    for (int j = first; j <= p; j++) {
        const float *kj = kc + (size_t)j * pos_stride, *vj = vc + (size_t)j * pos_stride;
        double s = (double)a->scale * dot_f32(q, kj, D);
        double w;
        if (s > m) {
            double corr = exp(m - s); // 0 when m is -inf
            l *= corr;
            for (int d = 0; d < D; d++) acc[d] *= corr;
            m = s, w = 1.0;
        } else {
            w = exp(s - m);
        }
        l += w;
        for (int d = 0; d < D; d++) acc[d] += w * (double)vj[d];
    }
    for (int d = 0; d < D; d++) out[d] = (float)(acc[d] / l);
}

// The sequence owning packed row t (sequences are sorted by row0), or NULL for a padding row.
static const struct ds_attn_seq *seq_of_row(const struct ds_attention_args *a, int t) {
    int lo = 0, hi = a->n_seq - 1;
    while (lo < hi) { // last sequence with row0 <= t
        int mid = lo + (hi - lo + 1) / 2;
        if (a->seqs[mid].row0 <= t) lo = mid;
        else hi = mid - 1;
    }
    const struct ds_attn_seq *sq = &a->seqs[lo];
    return t >= sq->row0 && t < sq->row0 + sq->n_rows ? sq : NULL;
}

enum ds_status ds_attention_ref(const struct ds_attention_args *a) {
    REF_TRY(check_args(a));
    if (a->n_rows == 0 || a->n_seq == 0) return DS_OK;
    const int D = a->head_dim, NH = a->n_heads;
    const size_t kv_row = (size_t)a->n_kv_heads * D, q_row = (size_t)NH * D;

    // Phase 1: the new keys and values land in the cache before any row reads it, so a prefill
    // row sees the earlier rows of its own call.
    for (int s = 0; s < a->n_seq; s++) {
        const struct ds_attn_seq *sq = &a->seqs[s];
        size_t dst = ((size_t)sq->slot * a->max_pos + sq->pos0) * kv_row;
        size_t src = (size_t)sq->row0 * kv_row, n = (size_t)sq->n_rows * kv_row;
        memcpy((float *)a->k_cache + dst, (const float *)a->k + src, n * sizeof(float));
        memcpy((float *)a->v_cache + dst, (const float *)a->v + src, n * sizeof(float));
    }

    // Phase 2: one task per (row, head) over the whole call, so many one-row decode sequences
    // spread over the threads as well as one long prefill does.
    const int T = a->n_rows;
    double work = (double)T * NH * D * 16.0; // at least a few keys per row
#pragma omp parallel for collapse(2) schedule(static) if (work > REF_PAR_MIN_WORK)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < NH; h++) {
            const struct ds_attn_seq *sq = seq_of_row(a, t);
            if (!sq) continue; // padding row: left unwritten
            attend_one(a, (const float *)a->q + (size_t)t * q_row + (size_t)h * D, sq->slot,
                       sq->pos0 + (t - sq->row0), h,
                       (float *)a->out + (size_t)t * q_row + (size_t)h * D);
        }
    }
    return DS_OK;
}
