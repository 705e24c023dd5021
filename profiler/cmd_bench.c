// draftscope bench --ops: times every CUDA op at the real gpt-oss / EAGLE-3 shapes on synthetic
// inputs and prints achieved bandwidth next to the H200's ~4.3 TB/s copy ceiling.
//
//   draftscope bench --ops [--shape 20b|120b] [--rows 1,4,32,256] [--iters N] [--kv L]
//                    [--device N] [--json]
//
// For each row count T every op gets freshly allocated buffers filled on the GPU from a seed
// (ds_cuda_fill_uniform / ds_cuda_fill_bytes: every input byte is defined), runs twice to warm
// up, then `iters` timed repetitions: an L2 flush (a memset of twice the L2 size, not timed), a
// cudaEvent pair around the op on the bench stream. Reported: median and minimum time, GB/s of the
// bytes the op must touch (weights once + activations in and out) for the median, that figure as
// a share of 4.3 TB/s, and TFLOP/s for the matmul-like ops. --iters 0 runs each op once and only
// checks that it succeeds (the form ctest can run).
//
// Shapes (config.json of the public checkpoints): hidden 2880, 64 query heads and 8 KV heads of
// 64, vocab 201,088, experts 32 (20b) or 128 (120b) top-4 with intermediate 2880; the EAGLE-3
// draft: fc 3·2880 → 2880, MLP 17,280, draft vocab 32,000. Attention rows: T = 1 is one decoding
// sequence; larger T are T/4 sequences verifying 4 tokens (bonus + K = 3 drafts) at KV length L.
#include <cuda_runtime.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/cli.h"
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"

#define BENCH_CEIL_GBS 4300.0 // H200 measured copy bandwidth
#define BENCH_MAX_ROWS_LIST 16
#define BENCH_MAX_BUFS 32

enum bench_kind {
    BK_EMBED, BK_RMSNORM, BK_MATMUL, BK_ADD, BK_SILU, BK_GATHER, BK_ROPE, BK_ATTN, BK_ROUTER,
    BK_MOE, BK_SOFTMAX, BK_ARGMAX, BK_TOPK, BK_ENTROPY, BK_OVERLAP, BK_SCATTER,
};

struct bench_case {
    enum bench_kind kind;
    char name[48];
    char shape[96];
    double bytes, flops;
    union {
        struct ds_embed_args embed;
        struct ds_rmsnorm_args rmsnorm;
        struct ds_matmul_args matmul;
        struct ds_add_args add;
        struct ds_silu_mul_args silu;
        struct ds_gather_rows_args gather;
        struct ds_rope_args rope;
        struct ds_attention_args attn;
        struct ds_router_args router;
        struct ds_moe_args moe;
        struct ds_softmax_args softmax;
        struct ds_argmax_args argmax;
        struct ds_topk_args topk;
        struct ds_entropy_args entropy;
        struct ds_overlap_args overlap;
        struct ds_vocab_scatter_args scatter;
    } a;
    void *bufs[BENCH_MAX_BUFS];
    int n_bufs;
};

struct bench_model {
    int hidden, n_heads, n_kv, head_dim, vocab, n_experts, top_k, inter;
    int draft_inter, draft_vocab;
};

static enum ds_status run_case(const struct bench_case *c, cudaStream_t s) {
    switch (c->kind) {
    case BK_EMBED: return ds_embed_cuda(&c->a.embed, s);
    case BK_RMSNORM: return ds_rmsnorm_cuda(&c->a.rmsnorm, s);
    case BK_MATMUL: return ds_matmul_cuda(&c->a.matmul, s);
    case BK_ADD: return ds_add_cuda(&c->a.add, s);
    case BK_SILU: return ds_silu_mul_cuda(&c->a.silu, s);
    case BK_GATHER: return ds_gather_rows_cuda(&c->a.gather, s);
    case BK_ROPE: return ds_rope_cuda(&c->a.rope, s);
    case BK_ATTN: return ds_attention_cuda(&c->a.attn, s);
    case BK_ROUTER: return ds_router_cuda(&c->a.router, s);
    case BK_MOE: return ds_moe_cuda(&c->a.moe, s);
    case BK_SOFTMAX: return ds_softmax_cuda(&c->a.softmax, s);
    case BK_ARGMAX: return ds_argmax_cuda(&c->a.argmax, s);
    case BK_TOPK: return ds_topk_cuda(&c->a.topk, s);
    case BK_ENTROPY: return ds_entropy_cuda(&c->a.entropy, s);
    case BK_OVERLAP: return ds_overlap_cuda(&c->a.overlap, s);
    case BK_SCATTER: return ds_vocab_scatter_cuda(&c->a.scatter, s);
    }
    return ds_error_set(DS_ERR_ARG, "bench: unknown op kind %d", (int)c->kind);
}

// A device buffer of n elements owned by the case, filled from the seed (bf16/f32 in [lo, hi]).
static void *buf_fill(struct bench_case *c, enum ds_elem e, size_t n, float lo, float hi,
                      cudaStream_t s) {
    void *p = NULL;
    if (c->n_bufs == BENCH_MAX_BUFS || cudaMalloc(&p, n * ds_elem_size(e)) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    c->bufs[c->n_bufs++] = p;
    if (ds_cuda_fill_uniform(p, e, n, 1000u + (uint64_t)c->n_bufs, lo, hi, s) != DS_OK) return NULL;
    return p;
}

// A device copy of host bytes owned by the case (index tables).
static void *buf_copy(struct bench_case *c, const void *host, size_t bytes) {
    void *p = NULL;
    if (c->n_bufs == BENCH_MAX_BUFS || cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    c->bufs[c->n_bufs++] = p;
    return cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? p : NULL;
}

static void *buf_bytes(struct bench_case *c, size_t n, int lo, int hi, cudaStream_t s) {
    void *p = NULL;
    if (c->n_bufs == BENCH_MAX_BUFS || cudaMalloc(&p, n) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    c->bufs[c->n_bufs++] = p;
    return ds_cuda_fill_bytes((uint8_t *)p, n, 2000u + (uint64_t)c->n_bufs, lo, hi, s) == DS_OK
               ? p
               : NULL;
}

static void case_free(struct bench_case *c) {
    for (int i = 0; i < c->n_bufs; i++) cudaFree(c->bufs[i]);
    c->n_bufs = 0;
}

#define NEED(p)                                                                                    \
    do {                                                                                           \
        if (!(p)) return 0;                                                                        \
    } while (0)

static int setup_matmul(struct bench_case *c, const char *name, int T, int K, int N, int bias,
                        int residual, cudaStream_t s) {
    const enum ds_elem B = DS_ELEM_BF16;
    c->kind = BK_MATMUL;
    snprintf(c->name, sizeof c->name, "matmul %s", name);
    snprintf(c->shape, sizeof c->shape, "T=%d K=%d N=%d%s%s", T, K, N, bias ? " +bias" : "",
             residual ? " +residual" : "");
    struct ds_matmul_args *a = &c->a.matmul;
    *a = (struct ds_matmul_args){.act = B, .w_dtype = B, .bias_dtype = B, .n_rows = T,
                                 .in_dim = K, .out_dim = N};
    NEED(a->x = buf_fill(c, B, (size_t)T * K, -1.0f, 1.0f, s));
    NEED(a->w = buf_fill(c, B, (size_t)N * K, -0.05f, 0.05f, s));
    if (bias) NEED(a->bias = buf_fill(c, B, (size_t)N, -0.1f, 0.1f, s));
    NEED(a->out = buf_fill(c, B, (size_t)T * N, -1.0f, 1.0f, s));
    if (residual) a->residual = a->out;
    c->bytes = 2.0 * ((double)N * K + (double)T * K + (double)T * N * (residual ? 2 : 1) +
                      (bias ? N : 0));
    c->flops = 2.0 * T * (double)N * K;
    return 1;
}

// Builds case `idx` for T rows; returns 1 when built, 0 on an allocation failure, -1 past the end.
static int setup_case(struct bench_case *c, int idx, int T, const struct bench_model *m, int kv,
                      cudaStream_t s) {
    const enum ds_elem B = DS_ELEM_BF16, F = DS_ELEM_F32;
    const int C = m->hidden, V = m->vocab, D = m->head_dim;
    memset(c, 0, sizeof *c);
    switch (idx) {
    case 0: {
        c->kind = BK_EMBED;
        snprintf(c->name, sizeof c->name, "embed");
        snprintf(c->shape, sizeof c->shape, "T=%d V=%d C=%d", T, V, C);
        struct ds_embed_args *a = &c->a.embed;
        *a = (struct ds_embed_args){.act = B, .table_dtype = B, .n_rows = T, .vocab = V, .dim = C};
        int32_t *ids = malloc((size_t)T * 4);
        NEED(ids);
        for (int t = 0; t < T; t++) ids[t] = (int32_t)(((uint64_t)t * 2654435761u) % (unsigned)V);
        a->ids = buf_copy(c, ids, (size_t)T * 4);
        free(ids);
        NEED(a->ids);
        NEED(a->table = buf_fill(c, B, (size_t)V * C, -1.0f, 1.0f, s));
        NEED(a->out = buf_fill(c, B, (size_t)T * C, 0.0f, 0.0f, s));
        c->bytes = 2.0 * 2.0 * T * C;
        return 1;
    }
    case 1: {
        c->kind = BK_RMSNORM;
        snprintf(c->name, sizeof c->name, "rmsnorm");
        snprintf(c->shape, sizeof c->shape, "T=%d C=%d", T, C);
        struct ds_rmsnorm_args *a = &c->a.rmsnorm;
        *a = (struct ds_rmsnorm_args){.act = B, .w_dtype = B, .n_rows = T, .dim = C, .eps = 1e-5f};
        NEED(a->x = buf_fill(c, B, (size_t)T * C, -2.0f, 2.0f, s));
        NEED(a->w = buf_fill(c, B, (size_t)C, 0.5f, 1.5f, s));
        NEED(a->out = buf_fill(c, B, (size_t)T * C, 0.0f, 0.0f, s));
        c->bytes = 2.0 * (2.0 * T * C + C);
        return 1;
    }
    case 2: return setup_matmul(c, "qkv", T, C, (m->n_heads + 2 * m->n_kv) * D, 1, 0, s);
    case 3: return setup_matmul(c, "o_proj", T, m->n_heads * D, C, 1, 1, s);
    case 4: return setup_matmul(c, "lm_head", T, C, V, 0, 0, s);
    case 5: return setup_matmul(c, "draft fc", T, 3 * C, C, 0, 0, s);
    case 6: return setup_matmul(c, "draft gate", T, C, m->draft_inter, 0, 0, s);
    case 7: return setup_matmul(c, "draft down", T, m->draft_inter, C, 0, 1, s);
    case 8: return setup_matmul(c, "draft lm_head", T, C, m->draft_vocab, 0, 0, s);
    case 9: {
        c->kind = BK_ADD;
        snprintf(c->name, sizeof c->name, "add");
        snprintf(c->shape, sizeof c->shape, "T=%d C=%d", T, C);
        struct ds_add_args *a = &c->a.add;
        *a = (struct ds_add_args){.act = B, .n_rows = T, .dim = C};
        NEED(a->a = buf_fill(c, B, (size_t)T * C, -1.0f, 1.0f, s));
        NEED(a->b = buf_fill(c, B, (size_t)T * C, -1.0f, 1.0f, s));
        a->out = (void *)a->a;
        c->bytes = 2.0 * 3.0 * T * C;
        return 1;
    }
    case 10: {
        c->kind = BK_SILU;
        snprintf(c->name, sizeof c->name, "silu_mul");
        snprintf(c->shape, sizeof c->shape, "T=%d I=%d", T, m->draft_inter);
        struct ds_silu_mul_args *a = &c->a.silu;
        *a = (struct ds_silu_mul_args){.act = B, .n_rows = T, .dim = m->draft_inter};
        NEED(a->gate = buf_fill(c, B, (size_t)T * m->draft_inter, -4.0f, 4.0f, s));
        NEED(a->up = buf_fill(c, B, (size_t)T * m->draft_inter, -1.0f, 1.0f, s));
        NEED(a->out = buf_fill(c, B, (size_t)T * m->draft_inter, 0.0f, 0.0f, s));
        c->bytes = 2.0 * 3.0 * T * m->draft_inter;
        return 1;
    }
    case 11: {
        c->kind = BK_GATHER;
        snprintf(c->name, sizeof c->name, "gather_rows");
        snprintf(c->shape, sizeof c->shape, "%d of %d rows, C=%d", T, 4 * T, C);
        struct ds_gather_rows_args *a = &c->a.gather;
        *a = (struct ds_gather_rows_args){.act = B, .n_rows = T, .src_rows = 4 * T, .dim = C};
        int32_t *rows = malloc((size_t)T * 4);
        NEED(rows);
        for (int t = 0; t < T; t++) rows[t] = 4 * t + 3; // the last row of each sequence
        a->rows = buf_copy(c, rows, (size_t)T * 4);
        free(rows);
        NEED(a->rows);
        NEED(a->x = buf_fill(c, B, (size_t)4 * T * C, -1.0f, 1.0f, s));
        NEED(a->out = buf_fill(c, B, (size_t)T * C, 0.0f, 0.0f, s));
        c->bytes = 2.0 * 2.0 * T * C;
        return 1;
    }
    case 12: {
        c->kind = BK_ROPE;
        snprintf(c->name, sizeof c->name, "rope");
        snprintf(c->shape, sizeof c->shape, "T=%d heads %d+%d D=%d", T, m->n_heads, m->n_kv, D);
        const int P = kv + 64;
        struct ds_rope_args *a = &c->a.rope;
        *a = (struct ds_rope_args){.act = B, .n_rows = T, .head_dim = D, .n_q_heads = m->n_heads,
                                   .n_k_heads = m->n_kv, .table_len = P};
        int32_t *pos = malloc((size_t)T * 4);
        NEED(pos);
        for (int t = 0; t < T; t++) pos[t] = kv + t % 4;
        a->positions = buf_copy(c, pos, (size_t)T * 4);
        free(pos);
        NEED(a->positions);
        NEED(a->q = buf_fill(c, B, (size_t)T * m->n_heads * D, -1.0f, 1.0f, s));
        NEED(a->k = buf_fill(c, B, (size_t)T * m->n_kv * D, -1.0f, 1.0f, s));
        NEED(a->cos = buf_fill(c, F, (size_t)P * D / 2, -1.0f, 1.0f, s));
        NEED(a->sin = buf_fill(c, F, (size_t)P * D / 2, -1.0f, 1.0f, s));
        c->bytes = 2.0 * 2.0 * T * (m->n_heads + m->n_kv) * D + 2.0 * 4.0 * T * D / 2;
        return 1;
    }
    case 13:
    case 14: {
        // Attention: T = 1 decodes one sequence; otherwise T/4 sequences verify 4 tokens each.
        const int window = idx == 13 ? 0 : 128;
        const int rows_per_seq = T >= 4 ? 4 : T, n_seq = T / rows_per_seq;
        const int P = kv + rows_per_seq;
        c->kind = BK_ATTN;
        snprintf(c->name, sizeof c->name, "attention %s", window ? "window128" : "full");
        snprintf(c->shape, sizeof c->shape, "%d seq x %d rows at KV %d, %d/%d heads D=%d", n_seq,
                 rows_per_seq, kv, m->n_heads, m->n_kv, D);
        struct ds_attn_seq *seqs = malloc((size_t)n_seq * sizeof *seqs);
        NEED(seqs);
        for (int i = 0; i < n_seq; i++)
            seqs[i] = (struct ds_attn_seq){i * rows_per_seq, rows_per_seq, kv, i};
        struct ds_attention_args *a = &c->a.attn;
        *a = (struct ds_attention_args){.act = B, .cache_dtype = B, .sinks_dtype = B,
                                        .n_rows = n_seq * rows_per_seq, .n_heads = m->n_heads,
                                        .n_kv_heads = m->n_kv, .head_dim = D, .n_seq = n_seq,
                                        .n_slots = n_seq, .max_pos = P, .window = window,
                                        .scale = 1.0f / sqrtf((float)D)};
        a->seqs = buf_copy(c, seqs, (size_t)n_seq * sizeof *seqs);
        free(seqs);
        NEED(a->seqs);
        const size_t rows = (size_t)a->n_rows, cache = (size_t)n_seq * P * m->n_kv * D;
        NEED(a->q = buf_fill(c, B, rows * m->n_heads * D, -1.0f, 1.0f, s));
        NEED(a->k = buf_fill(c, B, rows * m->n_kv * D, -1.0f, 1.0f, s));
        NEED(a->v = buf_fill(c, B, rows * m->n_kv * D, -1.0f, 1.0f, s));
        NEED(a->k_cache = buf_fill(c, B, cache, -1.0f, 1.0f, s));
        NEED(a->v_cache = buf_fill(c, B, cache, -1.0f, 1.0f, s));
        NEED(a->sinks = buf_fill(c, B, (size_t)m->n_heads, -1.0f, 1.0f, s));
        NEED(a->out = buf_fill(c, B, rows * m->n_heads * D, 0.0f, 0.0f, s));
        // The split-key path needs its workspace; without one the op walks each row in one block.
        a->workspace_bytes = ds_attention_workspace_bytes(a->n_rows, m->n_heads, D, P);
        NEED(a->workspace = buf_fill(c, B, a->workspace_bytes / 2, 0.0f, 0.0f, s));
        const double keys = window ? (kv + 1 < window ? kv + 1 : window) : kv + rows_per_seq;
        c->bytes = 2.0 * (2.0 * n_seq * keys * m->n_kv * D + 2.0 * rows * m->n_heads * D +
                          2.0 * rows * m->n_kv * D);
        c->flops = 4.0 * rows * m->n_heads * keys * D;
        return 1;
    }
    case 15: {
        c->kind = BK_ROUTER;
        snprintf(c->name, sizeof c->name, "router");
        snprintf(c->shape, sizeof c->shape, "T=%d E=%d top-%d C=%d", T, m->n_experts, m->top_k, C);
        struct ds_router_args *a = &c->a.router;
        *a = (struct ds_router_args){.act = B, .w_dtype = B, .bias_dtype = B, .n_rows = T,
                                     .dim = C, .n_experts = m->n_experts, .top_k = m->top_k};
        NEED(a->x = buf_fill(c, B, (size_t)T * C, -1.0f, 1.0f, s));
        NEED(a->w = buf_fill(c, B, (size_t)m->n_experts * C, -0.1f, 0.1f, s));
        NEED(a->bias = buf_fill(c, B, (size_t)m->n_experts, -0.1f, 0.1f, s));
        NEED(a->expert_ids = buf_fill(c, F, (size_t)T * m->top_k, 0.0f, 0.0f, s));
        NEED(a->expert_weights = buf_fill(c, F, (size_t)T * m->top_k, 0.0f, 0.0f, s));
        c->bytes = 2.0 * ((double)m->n_experts * C + (double)T * C) + 8.0 * T * m->top_k;
        c->flops = 2.0 * T * (double)m->n_experts * C;
        return 1;
    }
    case 16: {
        // Experts: each row picks top_k distinct experts by a fixed hash, so the number of experts
        // touched (and the weight bytes) grows with T as in real routing.
        const int E = m->n_experts, KE = m->top_k, I = m->inter;
        c->kind = BK_MOE;
        int32_t *ids = malloc((size_t)T * KE * 4);
        float *w = malloc((size_t)T * KE * 4);
        char *used = calloc((size_t)E, 1);
        if (!ids || !w || !used) {
            free(ids), free(w), free(used);
            return 0;
        }
        int touched = 0;
        for (int t = 0; t < T; t++) {
            uint64_t h = ds_fill_hash(77, (uint64_t)t);
            for (int j = 0; j < KE; j++) {
                int e = (int)((h >> (8 * j)) % (uint64_t)E);
                for (int q = 0; q < j; q++)
                    if (ids[t * KE + q] == e) e = (e + 1) % E, q = -1; // keep the ids distinct
                ids[t * KE + j] = e;
                w[t * KE + j] = 1.0f / KE;
                touched += !used[e];
                used[e] = 1;
            }
        }
        snprintf(c->name, sizeof c->name, "moe mxfp4");
        snprintf(c->shape, sizeof c->shape, "T=%d E=%d top-%d C=%d I=%d, %d experts touched", T,
                 E, KE, C, I, touched);
        struct ds_moe_args *a = &c->a.moe;
        *a = (struct ds_moe_args){.act = B, .bias_dtype = B, .n_rows = T, .dim = C, .inter = I,
                                  .n_experts = E, .top_k = KE, .swiglu_alpha = 1.702f,
                                  .swiglu_limit = 7.0f};
        a->expert_ids = buf_copy(c, ids, (size_t)T * KE * 4);
        a->expert_weights = buf_copy(c, w, (size_t)T * KE * 4);
        free(ids), free(w), free(used);
        NEED(a->expert_ids && a->expert_weights);
        // Codes anywhere, scales 2^-9 .. 2^-5: values of a realistic size, no overflow.
        NEED(a->gate_up_blocks = buf_bytes(c, (size_t)E * 2 * I * C / 2, 0, 255, s));
        NEED(a->gate_up_scales = buf_bytes(c, (size_t)E * 2 * I * C / 32, 118, 122, s));
        NEED(a->gate_up_bias = buf_fill(c, B, (size_t)E * 2 * I, -0.1f, 0.1f, s));
        NEED(a->down_blocks = buf_bytes(c, (size_t)E * C * I / 2, 0, 255, s));
        NEED(a->down_scales = buf_bytes(c, (size_t)E * C * I / 32, 118, 122, s));
        NEED(a->down_bias = buf_fill(c, B, (size_t)E * C, -0.1f, 0.1f, s));
        NEED(a->x = buf_fill(c, B, (size_t)T * C, -1.0f, 1.0f, s));
        NEED(a->out = buf_fill(c, B, (size_t)T * C, -1.0f, 1.0f, s));
        a->residual = a->out;
        a->workspace_bytes = ds_moe_cuda_workspace_bytes(T, C, I, E, KE);
        NEED(a->workspace = buf_fill(c, B, a->workspace_bytes / 2, 0.0f, 0.0f, s));
        const double per_expert = (double)2 * I * C / 2 + (double)2 * I * C / 32 + 2.0 * 2 * I +
                                  (double)C * I / 2 + (double)C * I / 32 + 2.0 * C;
        c->bytes = touched * per_expert + 2.0 * 3.0 * T * C + 8.0 * T * KE;
        c->flops = 2.0 * T * KE * (3.0 * I * C);
        return 1;
    }
    case 17:
    case 18:
    case 19:
    case 20:
    case 21:
    case 22:
    case 23: {
        // Vocabulary rows over the target vocabulary (the draft's are smaller).
        const size_t n = (size_t)T * V;
        const int Dv = m->draft_vocab;
        if (idx <= 18) {
            c->kind = BK_SOFTMAX;
            struct ds_softmax_args *a = &c->a.softmax;
            *a = (struct ds_softmax_args){.act = B, .n_rows = T, .vocab = V, .temperature = 1.0f,
                                          .top_p = 1.0f};
            if (idx == 18) a->temperature = 0.8f, a->top_k = 50, a->top_p = 0.9f;
            snprintf(c->name, sizeof c->name, "softmax%s", idx == 18 ? " top-k50 top-p0.9" : "");
            NEED(a->logits = buf_fill(c, B, n, -10.0f, 10.0f, s));
            NEED(a->probs = buf_fill(c, F, n, 0.0f, 0.0f, s));
            c->bytes = (2.0 + 4.0) * n;
        } else if (idx == 19) {
            c->kind = BK_ARGMAX;
            snprintf(c->name, sizeof c->name, "argmax");
            struct ds_argmax_args *a = &c->a.argmax;
            *a = (struct ds_argmax_args){.act = B, .n_rows = T, .vocab = V};
            NEED(a->x = buf_fill(c, B, n, -10.0f, 10.0f, s));
            NEED(a->ids = buf_fill(c, F, (size_t)T, 0.0f, 0.0f, s));
            NEED(a->values = buf_fill(c, F, (size_t)T, 0.0f, 0.0f, s));
            c->bytes = 2.0 * n;
        } else if (idx == 20) {
            c->kind = BK_TOPK;
            snprintf(c->name, sizeof c->name, "topk k=20");
            struct ds_topk_args *a = &c->a.topk;
            *a = (struct ds_topk_args){.act = B, .n_rows = T, .vocab = V, .k = 20};
            NEED(a->x = buf_fill(c, B, n, -10.0f, 10.0f, s));
            NEED(a->ids = buf_fill(c, F, (size_t)T * 20, 0.0f, 0.0f, s));
            NEED(a->values = buf_fill(c, F, (size_t)T * 20, 0.0f, 0.0f, s));
            c->bytes = 2.0 * n;
        } else if (idx == 21) {
            c->kind = BK_ENTROPY;
            snprintf(c->name, sizeof c->name, "entropy");
            struct ds_entropy_args *a = &c->a.entropy;
            *a = (struct ds_entropy_args){.n_rows = T, .vocab = V};
            NEED(a->probs = buf_fill(c, F, n, 0.0f, 1e-5f, s));
            NEED(a->out = buf_fill(c, F, (size_t)T, 0.0f, 0.0f, s));
            c->bytes = 4.0 * n;
        } else {
            int32_t *map = malloc((size_t)Dv * 4);
            NEED(map);
            for (int i = 0; i < Dv; i++) map[i] = (int32_t)((int64_t)i * V / Dv);
            void *d_map = buf_copy(c, map, (size_t)Dv * 4);
            free(map);
            NEED(d_map);
            if (idx == 22) {
                c->kind = BK_OVERLAP;
                snprintf(c->name, sizeof c->name, "overlap (draft map)");
                struct ds_overlap_args *a = &c->a.overlap;
                *a = (struct ds_overlap_args){.n_rows = T, .vocab_p = V, .vocab_q = Dv,
                                              .q_to_p = d_map};
                NEED(a->p = buf_fill(c, F, n, 0.0f, 1e-5f, s));
                NEED(a->q = buf_fill(c, F, (size_t)T * Dv, 0.0f, 6e-5f, s));
                NEED(a->out = buf_fill(c, F, (size_t)T, 0.0f, 0.0f, s));
                c->bytes = 4.0 * 2.0 * T * Dv + 4.0 * Dv;
            } else {
                c->kind = BK_SCATTER;
                snprintf(c->name, sizeof c->name, "vocab_scatter");
                struct ds_vocab_scatter_args *a = &c->a.scatter;
                *a = (struct ds_vocab_scatter_args){.act = B, .n_rows = T, .src_vocab = Dv,
                                                    .dst_vocab = V, .fill = -INFINITY,
                                                    .map = d_map};
                NEED(a->src = buf_fill(c, B, (size_t)T * Dv, -10.0f, 10.0f, s));
                NEED(a->dst = buf_fill(c, B, n, 0.0f, 0.0f, s));
                c->bytes = 2.0 * (T * (double)Dv + n) + 4.0 * Dv;
            }
        }
        if (!c->shape[0]) snprintf(c->shape, sizeof c->shape, "T=%d V=%d", T, V);
        return 1;
    }
    default: return -1;
    }
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f) {
    fprintf(f, "usage: draftscope bench --ops [--shape 20b|120b] [--rows 1,4,32,256] [--iters N]\n"
               "                        [--kv L] [--device N] [--json]\n"
               "  times every CUDA op at the real shapes on synthetic inputs; --iters 0 only\n"
               "  checks that each op runs\n");
}

int ds_cmd_bench(int argc, char **argv) {
    int ops = 0, json = 0, iters = 20, kv = 4096, device = 0;
    int rows[BENCH_MAX_ROWS_LIST] = {1, 4, 32, 256}, n_rows = 4;
    const char *shape = "20b";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--ops")) {
            ops = 1;
        } else if (!strcmp(o, "--json")) {
            json = 1;
        } else if (v && !strcmp(o, "--shape")) {
            shape = v, i++;
        } else if (v && !strcmp(o, "--iters")) {
            iters = atoi(v), i++;
        } else if (v && !strcmp(o, "--kv")) {
            kv = atoi(v), i++;
        } else if (v && !strcmp(o, "--device")) {
            device = atoi(v), i++;
        } else if (v && !strcmp(o, "--rows")) {
            n_rows = 0;
            for (const char *p = v; *p && n_rows < BENCH_MAX_ROWS_LIST;) {
                char *end;
                long r = strtol(p, &end, 10);
                if (end == p || r < 1 || r > 65536) {
                    fprintf(stderr, "draftscope bench: --rows: bad entry in '%s'\n", v);
                    return 2;
                }
                rows[n_rows++] = (int)r;
                p = *end == ',' ? end + 1 : end;
            }
            i++;
        } else {
            fprintf(stderr, "draftscope bench: unknown or incomplete option '%s'\n", o);
            usage(stderr);
            return 2;
        }
    }
    if (!ops) {
        fprintf(stderr, "draftscope bench: say what to time (--ops)\n");
        usage(stderr);
        return 2;
    }
    struct bench_model m = {.hidden = 2880, .n_heads = 64, .n_kv = 8, .head_dim = 64,
                            .vocab = 201088, .n_experts = 32, .top_k = 4, .inter = 2880,
                            .draft_inter = 17280, .draft_vocab = 32000};
    if (!strcmp(shape, "120b")) m.n_experts = 128;
    else if (strcmp(shape, "20b")) {
        fprintf(stderr, "draftscope bench: --shape must be 20b or 120b, got '%s'\n", shape);
        return 2;
    }
    if (iters < 0 || iters > 10000 || kv < 1) {
        fprintf(stderr, "draftscope bench: --iters must be in [0, 10000] and --kv >= 1\n");
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || device < 0 || device >= n_dev) {
        cudaGetLastError();
        fprintf(stderr, "draftscope bench: no CUDA device %d (%d present)\n", device, n_dev);
        return 1;
    }
    struct cudaDeviceProp prop;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        fprintf(stderr, "draftscope bench: cannot use GPU %d\n", device);
        return 1;
    }
    cudaStream_t s = NULL;
    cudaEvent_t ev0 = NULL, ev1 = NULL;
    void *flush = NULL;
    const size_t flush_bytes = 2 * (size_t)(prop.l2CacheSize > 0 ? prop.l2CacheSize : 64 << 20);
    float *times = malloc(sizeof(float) * (size_t)(iters > 0 ? iters : 1));
    json_t *out = json_array();
    int rc = 0;
    if (!times || !out || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&ev0) != cudaSuccess || cudaEventCreate(&ev1) != cudaSuccess ||
        cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
        fprintf(stderr, "draftscope bench: cannot set up the GPU %d (%s)\n", device,
                cudaGetErrorString(cudaGetLastError()));
        rc = 1;
        goto cleanup;
    }
    if (!json)
        printf("draftscope bench on %s (gpt-oss-%s shapes, KV %d, %d iterations, ceiling %.0f "
               "GB/s)\n%-22s %-52s %10s %10s %9s %6s %8s\n",
               prop.name, shape, kv, iters, BENCH_CEIL_GBS, "op", "shape", "median_us", "min_us",
               "GB/s", "%ceil", "TFLOP/s");
    for (int ri = 0; ri < n_rows && !rc; ri++) {
        for (int idx = 0;; idx++) {
            struct bench_case c;
            int built = setup_case(&c, idx, rows[ri], &m, kv, s);
            if (built < 0) break;
            if (!built) {
                fprintf(stderr, "draftscope bench: %s T=%d: out of GPU memory setting up\n",
                        c.name, rows[ri]);
                case_free(&c);
                continue;
            }
            enum ds_status st = DS_OK;
            for (int w = 0; w < (iters ? 2 : 1) && st == DS_OK; w++) st = run_case(&c, s);
            for (int it = 0; it < iters && st == DS_OK; it++) {
                cudaMemsetAsync(flush, it & 0xff, flush_bytes, s); // evict the inputs from L2
                cudaEventRecord(ev0, s);
                st = run_case(&c, s);
                cudaEventRecord(ev1, s);
                cudaEventSynchronize(ev1);
                cudaEventElapsedTime(&times[it], ev0, ev1);
            }
            cudaError_t ce = cudaStreamSynchronize(s);
            if (st != DS_OK || ce != cudaSuccess) {
                fprintf(stderr, "draftscope bench: %s (%s): %s\n", c.name, c.shape,
                        st != DS_OK ? ds_error_last() : cudaGetErrorString(ce));
                rc = 1;
                case_free(&c);
                break;
            }
            double med = 0, mn = 0, gbs = 0, tfl = 0;
            if (iters) {
                qsort(times, (size_t)iters, sizeof *times, cmp_float);
                med = times[iters / 2] * 1e3, mn = times[0] * 1e3; // µs
                gbs = c.bytes / (med * 1e-6) / 1e9;
                tfl = c.flops > 0 ? c.flops / (med * 1e-6) / 1e12 : 0.0;
            }
            if (json) {
                json_array_append_new(
                    out, json_pack("{s:s, s:s, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f}", "op",
                                   c.name, "shape", c.shape, "rows", rows[ri], "model", shape,
                                   "median_us", med, "min_us", mn, "bytes", c.bytes, "gb_s", gbs,
                                   "ceiling_share", gbs / BENCH_CEIL_GBS, "tflop_s", tfl));
            } else {
                printf("%-22s %-52s %10.1f %10.1f %9.0f %5.0f%% ", c.name, c.shape, med, mn, gbs,
                       100.0 * gbs / BENCH_CEIL_GBS);
                if (c.flops > 0) printf("%8.1f\n", tfl);
                else printf("%8s\n", "-");
                fflush(stdout);
            }
            case_free(&c);
        }
    }
    if (json && !rc) {
        char *text = json_dumps(out, JSON_INDENT(2));
        if (text) puts(text);
        free(text);
    }
cleanup:
    json_decref(out);
    free(times);
    if (flush) cudaFree(flush);
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    if (s) cudaStreamDestroy(s);
    return rc;
}
