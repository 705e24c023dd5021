// draftscope bench --ops: times every CUDA op at the real gpt-oss / EAGLE-3 shapes on synthetic
// inputs and prints achieved bandwidth next to the H200's ~4.3 TB/s copy ceiling.
// draftscope bench --steps: times whole steps of a synthetic gpt-oss target and EAGLE-3 draft at
// the real shapes (models/synthetic.c), with and without CUDA graphs (see bench_steps below).
//
//   draftscope bench --ops [--shape 20b|120b] [--rows 1,4,32,256] [--iters N] [--kv L]
//                    [--device N] [--json]
//   draftscope bench --steps [--shape 20b|120b] [--batches 1,8,32,64] [--iters N] [--kv L]
//                    [--graphs on|off|both] [--layers N] [--seed S] [--device N] [--json]
//                    [--trace off,phases,kernels [--by-grid]]
//
// For each row count T every op gets freshly allocated buffers filled on the GPU from a seed
// (ds_cuda_fill_uniform / ds_cuda_fill_bytes: every input byte is defined), runs twice to warm
// up, then `iters` timed repetitions: an L2 flush (a memset of twice the L2 size, then its dirty
// lines dropped without write-back, ds_l2_discard_cuda; not timed; --l2 dirty keeps them, as
// builds before the option did), a cudaEvent pair around the op on the bench stream. Reported:
// median and minimum time, GB/s of the bytes the op must touch (weights once + activations in
// and out) for the median, that figure as a share of the copy bandwidth, and TFLOP/s for the
// matmul-like ops. --iters 0 runs each op once and only checks that it succeeds (the form ctest
// can run).
//
// Shapes (config.json of the public checkpoints): hidden 2880, 64 query heads and 8 KV heads of
// 64, vocab 201,088, experts 32 (20b) or 128 (120b) top-4 with intermediate 2880; the EAGLE-3
// draft: fc 3·2880 → 2880, MLP 17,280, draft vocab 32,000. Attention rows: T = 1 is one decoding
// sequence; larger T are T/4 sequences verifying 4 tokens (bonus + K = 3 drafts) at KV length L.
#include <cuda_runtime.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "ds/backend.h"
#include "ds/cli.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"
#include "ds/synthetic.h"
#include "ds/trace.h"

#define BENCH_CEIL_GBS 4300.0 // H200 copy bandwidth, used only when it cannot be measured
#define BENCH_MAX_ROWS_LIST 16
#define BENCH_MAX_BUFS 32

enum bench_kind {
    BK_EMBED, BK_RMSNORM, BK_MATMUL, BK_ADD, BK_SILU, BK_GATHER, BK_ROPE, BK_ATTN, BK_ROUTER,
    BK_MOE, BK_SOFTMAX, BK_ARGMAX, BK_TOPK, BK_ENTROPY, BK_OVERLAP, BK_SCATTER, BK_READ,
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
        struct {
            struct ds_read_args r[2]; // one or two launches (n)
            int n;
        } read;
    } a;
    void *bufs[BENCH_MAX_BUFS];
    int n_bufs;
    char why[200]; // why setting up failed, when not for lack of memory (empty otherwise)
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
    case BK_READ: {
        enum ds_status st = DS_OK;
        for (int i = 0; i < c->a.read.n && st == DS_OK; i++) st = ds_read_cuda(&c->a.read.r[i], s);
        return st;
    }
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

// The bench's routing: each row picks top_k distinct experts by a fixed hash, so the number of
// experts touched (and the weight bytes) grows with T as in real routing. Fills ids and weights
// (T·KE), marks used[e]; returns the experts touched.
static int bench_route(int T, int E, int KE, int32_t *ids, float *w, char *used) {
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
    return touched;
}

// The read instrument over the weight pieces the MoE op reads at T rows (the experts bench_route
// touches: gate_up blocks, scales, bias, then the same of down), in one launch or two (gate_up's
// pieces, then down's): the floor of a kernel design that must stream those bytes.
static int setup_moe_read(struct bench_case *c, int T, const struct bench_model *m, int launches,
                          cudaStream_t s) {
    const int E = m->n_experts, KE = m->top_k, I = m->inter, C = m->hidden;
    c->kind = BK_READ;
    int32_t *ids = malloc((size_t)T * KE * 4);
    float *w = malloc((size_t)T * KE * 4);
    char *used = calloc((size_t)E, 1);
    struct ds_read_piece *pc = malloc(sizeof *pc * 6 * (size_t)E);
    if (!ids || !w || !used || !pc) {
        free(ids), free(w), free(used), free(pc);
        return 0;
    }
    const int touched = bench_route(T, E, KE, ids, w, used);
    // Per expert: gate_up blocks, scales, bias; down blocks, scales, bias (bytes; bf16 biases).
    const uint64_t sz[6] = {(uint64_t)2 * I * C / 2, (uint64_t)2 * I * C / 32, (uint64_t)2 * I * 2,
                            (uint64_t)C * I / 2,     (uint64_t)C * I / 32,     (uint64_t)C * 2};
    // Whole arrays of E experts, as the MoE case allocates them, so the pieces lie as far apart.
    unsigned char *arr[6];
    int ok = 1, n[2] = {0, 0};
    for (int k = 0; k < 6 && ok; k++) ok = (arr[k] = buf_bytes(c, sz[k] * E, 0, 255, s)) != NULL;
    // gate_up's pieces first, then down's: launch 0 takes [0, n[0]), launch 1 the rest.
    for (int part = 0; part < 2 && ok; part++)
        for (int e = 0; e < E; e++)
            if (used[e])
                for (int k = 3 * part; k < 3 * part + 3; k++) {
                    pc[n[0] + n[1]] = (struct ds_read_piece){.p = arr[k] + sz[k] * e,
                                                             .bytes = sz[k]};
                    n[part]++;
                }
    snprintf(c->name, sizeof c->name, "moe read-only x%d", launches);
    snprintf(c->shape, sizeof c->shape, "T=%d, %d experts: the MoE's weight bytes, %d launch%s", T,
             touched, launches, launches > 1 ? "es" : "");
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    c->a.read.n = launches;
    for (int l = 0; l < launches && ok; l++) {
        // One launch: every piece; two: gate_up's, then down's. About 4 blocks per SM in each:
        // of 2, 4 and 8 per SM, 4 read fastest at 1 row in one launch and in two (H200).
        struct ds_read_piece *p = pc + (launches == 1 ? 0 : (l ? n[0] : 0));
        const int np = launches == 1 ? n[0] + n[1] : n[l];
        int nb = 0;
        if (ds_read_plan(p, np, 4 * (sms > 0 ? sms : 132), &nb) != DS_OK) {
            snprintf(c->why, sizeof c->why, "%s", ds_error_last());
            ok = 0;
            break;
        }
        ok = (c->a.read.r[l].pieces = buf_copy(c, p, sizeof *p * (size_t)np)) != NULL &&
             (c->a.read.r[l].out = buf_fill(c, DS_ELEM_F32, 4 * (size_t)nb, 0.0f, 0.0f, s));
        c->a.read.r[l].n_pieces = np, c->a.read.r[l].n_blocks = nb;
    }
    c->bytes = (double)touched * (double)(sz[0] + sz[1] + sz[2] + sz[3] + sz[4] + sz[5]);
    free(ids), free(w), free(used), free(pc);
    return ok;
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
        // The model's plan: the many-block path for few rows (ds_router_workspace_bytes).
        a->workspace_bytes = ds_router_workspace_bytes(T, m->n_experts);
        NEED(a->workspace = buf_fill(c, F, a->workspace_bytes / sizeof(float), 0.0f, 0.0f, s));
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
        const int touched = bench_route(T, E, KE, ids, w, used);
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
    case 17: return setup_moe_read(c, T, m, 1, s);
    case 18: return setup_moe_read(c, T, m, 2, s);
    case 19:
    case 20:
    case 21:
    case 22:
    case 23:
    case 24:
    case 25: {
        // Vocabulary rows over the target vocabulary (the draft's are smaller).
        const size_t n = (size_t)T * V;
        const int Dv = m->draft_vocab;
        if (idx <= 20) {
            c->kind = BK_SOFTMAX;
            struct ds_softmax_args *a = &c->a.softmax;
            *a = (struct ds_softmax_args){.act = B, .n_rows = T, .vocab = V, .temperature = 1.0f,
                                          .top_p = 1.0f};
            if (idx == 20) a->temperature = 0.8f, a->top_k = 50, a->top_p = 0.9f;
            snprintf(c->name, sizeof c->name, "softmax%s", idx == 20 ? " top-k50 top-p0.9" : "");
            NEED(a->logits = buf_fill(c, B, n, -10.0f, 10.0f, s));
            NEED(a->probs = buf_fill(c, F, n, 0.0f, 0.0f, s));
            c->bytes = (2.0 + 4.0) * n;
        } else if (idx == 21) {
            c->kind = BK_ARGMAX;
            snprintf(c->name, sizeof c->name, "argmax");
            struct ds_argmax_args *a = &c->a.argmax;
            *a = (struct ds_argmax_args){.act = B, .n_rows = T, .vocab = V};
            NEED(a->x = buf_fill(c, B, n, -10.0f, 10.0f, s));
            NEED(a->ids = buf_fill(c, F, (size_t)T, 0.0f, 0.0f, s));
            NEED(a->values = buf_fill(c, F, (size_t)T, 0.0f, 0.0f, s));
            c->bytes = 2.0 * n;
        } else if (idx == 22) {
            c->kind = BK_TOPK;
            snprintf(c->name, sizeof c->name, "topk k=20");
            struct ds_topk_args *a = &c->a.topk;
            *a = (struct ds_topk_args){.act = B, .n_rows = T, .vocab = V, .k = 20};
            NEED(a->x = buf_fill(c, B, n, -10.0f, 10.0f, s));
            NEED(a->ids = buf_fill(c, F, (size_t)T * 20, 0.0f, 0.0f, s));
            NEED(a->values = buf_fill(c, F, (size_t)T * 20, 0.0f, 0.0f, s));
            c->bytes = 2.0 * n;
        } else if (idx == 23) {
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
            if (idx == 24) {
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
               "                        [--kv L] [--l2 clean|dirty] [--device N] [--json]\n"
               "       draftscope bench --steps [--shape 20b|120b] [--batches 1,8,32,64]\n"
               "                        [--iters N] [--kv L] [--graphs on|off|both] [--layers N]\n"
               "                        [--seed S] [--device N] [--json]\n"
               "                        [--trace off,phases,kernels [--by-grid]]\n"
               "  --ops times every CUDA op at the real shapes on synthetic inputs; --iters 0\n"
               "  only checks that each op runs. The rows \"moe read-only x1 / x2\" stream the\n"
               "  weight bytes of the MoE row above them and do nothing else, in one launch and\n"
               "  in two (gate_up's, then down's): a floor for kernels that must read them.\n"
               "  Before each timed op a memset of twice the L2 size evicts the op's inputs;\n"
               "  --l2 clean (default) then drops its dirty lines, --l2 dirty leaves them for\n"
               "  the op to write back (up to ~50 MB on an H200: the figures before the option).\n"
               "  --steps times whole target decode / verify steps\n"
               "  and draft extend / step calls of a synthetic model (--layers N: the first N\n"
               "  layers only; 0, the default, keeps them all). A target step's weight GB\n"
               "  counts the distinct experts its rows were routed to: the mean over the timed\n"
               "  steps' inputs, replayed untimed after the timing.\n"
               "  Defaults: --shape 20b, --rows 1,4,32,256, --batches 1,8,32,64, --iters 20\n"
               "  (0..10000), --kv 4096 (1..131072; --steps needs 8 or more), --graphs both,\n"
               "  --seed 0, --device 0. Lists take up to 16 entries.\n"
               "  --trace (with --steps): times each step kind at each listed trace level in\n"
               "  alternating blocks (2 rounds of --iters steps per level), each step wrapped as\n"
               "  the run wraps it (one phase, then ds_trace_poll), and prints ms/step per level,\n"
               "  the tokens/s lost against off (mean step time), the launch calls', trace calls'\n"
               "  and GPU step times, and at level kernels a table of the CUPTI kernel records of\n"
               "  the timed steps (warm-up steps excluded; exclusive and raw times); --by-grid\n"
               "  gives each launch grid of a kernel its own row, \"name [x,y,z]\" (the q/k/v,\n"
               "  o_proj and lm_head launches of the matmul apart, say).\n"
               "  All levels share one process and one model: CUPTI is enabled before the\n"
               "  backend when kernels is listed, and paused (its kinds disabled) for the off and\n"
               "  phases blocks; the modules and graphs stay instrumented then, so off is "
               "slightly\n"
               "  slower than in a process without CUPTI. For a clean off figure run\n"
               "  --trace off,phases in a separate process. DS_TRACE_API_RECORDS picks the CUPTI\n"
               "  API records (docs/tracing.md).\n");
}

// ---------------------------------------------------------------------------------------------
// --steps: whole steps of a synthetic target + draft.
//
// Method. The synthetic target and draft of the preset (models/synthetic.c; --layers keeps a
// slice) are planned for the largest batch at context L (--kv) and their KV caches zeroed, so
// every sequence sits at position L without a prefill (attention reads L keys of zeros: the same
// work as real keys). For each batch size B and graph mode, each step kind runs twice (warm-up;
// with graphs the second run captures) and then `iters` times; each timed run is one host call
// plus a stream sync, timed on the host clock (so launch overhead counts, which is what graphs
// remove). Reported: the median ms per step, rows/s (rows processed: B for decode and draft
// steps, 4B for a verify, 2B for the 2-row extends; a verify emits B to 4B tokens, an extend B
// draft tokens), the weight bytes the step must read, the KV cache bytes its attention must read,
// their sum over the copy bandwidth measured at the start (a device-to-device cudaMemcpy of 1 GiB:
// 2 bytes moved per byte copied) as the floor, the achieved GB/s of that sum and its share of
// that bandwidth.
// Weight bytes of a target step: embedding rows, every layer's attention, norms and router, the
// distinct experts the step's rows touched (read back from the router's choices; the mean over
// the timed steps' inputs, each step replayed untimed afterwards: routing follows the tokens, so
// one step's count is not the figure of the median's steps), the final norm
// and the lm_head; of a draft extend: the draft's whole weight arena (its lm_head over 32,000 ids
// included) plus the target embedding rows it reads; of a draft step the same less the fc, which
// only an extend runs. KV bytes: K and V of the keys cached before the step's rows (all L on
// full layers, at most window - 1 on sliding ones), per sequence (ds_bench_kv_read_bytes).

struct step_row {
    const char *kind;
    int batch, rows;
    bool graphs;
    double ms, bytes;
};

double ds_bench_kv_read_bytes(int n_seq, int cached, int full_layers, int window_layers,
                              int window, int kv_dim, int elem_bytes) {
    const int in_window = window - 1 < cached ? window - 1 : cached; // the window holds the row
    const double keys = (double)full_layers * cached + (double)window_layers * in_window;
    return (double)n_seq * keys * 2.0 * kv_dim * elem_bytes; // K and V
}

double ds_bench_draft_weight_bytes(double arena, double fc_bytes, bool step, int rows, int hidden) {
    return arena - (step ? fc_bytes : 0.0) + 2.0 * rows * hidden; // + bf16 target embedding rows
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

// Median of n >= 1 sorted values (floats or doubles): the mean of the middle two when n is even.
#define MEDIAN_SORTED(v, n)                                                                       \
    ((n) % 2 ? (double)(v)[(n) / 2] : 0.5 * ((double)(v)[(n) / 2 - 1] + (double)(v)[(n) / 2]))

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Device copy bandwidth in GB/s (2 bytes moved per byte copied), median of 5.
static double copy_bandwidth(cudaStream_t st) {
    const size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    double t[5], gbs = 0;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) goto done;
    cudaMemsetAsync(a, 1, n, st);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st);
    cudaStreamSynchronize(st);
    for (int i = 0; i < 5; i++) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0, st);
        cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t[i] = ms;
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    qsort(t, 5, sizeof *t, cmp_double);
    gbs = 2.0 * (double)n / (t[2] * 1e-3) / 1e9;
done:
    cudaGetLastError();
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return gbs;
}

struct step_ctx {
    ds_gptoss_t *t;
    ds_eagle3_t *d;
    struct ds_backend *be;
    int V, H, L, E, KE, I, QD, KD, max_b, kv;
    uint64_t seed;
    int32_t *tok, *rows, *hrows, *s_pos, *s_slot, *s_prev, *experts;
    struct ds_attn_seq *seqs;
};

// Weight bytes a target step over the last forward's rows reads (see the method above).
static double target_step_bytes(struct step_ctx *c, int T) {
    const double H = c->H, bf = 2.0;
    const double attn = bf * (H + (double)c->QD * H + c->QD + 2.0 * ((double)c->KD * H + c->KD) +
                              H * c->QD + H + 64.0 /* sinks */ + H /* mlp norm */) +
                        bf * ((double)c->E * H + c->E); // router
    const double expert = (double)2 * c->I * H / 2 + (double)2 * c->I * H / 32 + bf * 2 * c->I +
                          (double)H * c->I / 2 + (double)H * c->I / 32 + bf * H;
    double bytes = bf * T * H + bf * H + bf * (double)c->V * H; // embed rows, final norm, lm_head
    if (ds_gptoss_download_expert_ids(c->t, c->experts) != DS_OK) return 0;
    char *used = calloc((size_t)c->E, 1);
    if (!used) return 0;
    for (int l = 0; l < c->L; l++) {
        memset(used, 0, (size_t)c->E);
        int n = 0;
        for (int i = 0; i < T * c->KE; i++) {
            const int32_t e = c->experts[(size_t)l * T * c->KE + i];
            if (e >= 0 && e < c->E && !used[e]) used[e] = 1, n++;
        }
        bytes += attn + n * expert;
    }
    free(used);
    return bytes;
}

enum step_kind { SK_DECODE, SK_VERIFY, SK_EXTEND, SK_DSTEP };
static const char *const step_names[] = {"target decode", "target verify (4 rows)",
                                         "draft extend (2 rows)", "draft step"};

// One call of a step kind over B sequences.
static enum ds_status step_once(struct step_ctx *c, enum step_kind k, int B, int iter) {
    const int n = k == SK_VERIFY ? 4 : k == SK_EXTEND ? 2 : 1;
    for (int i = 0; i < B; i++) {
        c->seqs[i] = (struct ds_attn_seq){i * n, n, k == SK_EXTEND ? c->kv - 2 : c->kv, i};
        for (int r = 0; r < n; r++) {
            c->tok[i * n + r] =
                (int32_t)(ds_fill_hash(c->seed + 17, (uint64_t)(iter * 4096 + i * n + r)) %
                          (uint64_t)c->V);
            c->rows[i * n + r] = i * n + r;
            c->hrows[i * n + r] = i * 4 + r; // extend: the verify's first rows of sequence i
        }
        c->s_pos[i] = c->kv, c->s_slot[i] = i, c->s_prev[i] = i;
    }
    if (k == SK_DECODE || k == SK_VERIFY) {
        struct ds_batch b = {.n_rows = B * n,
                             .tokens = c->tok,
                             .n_seq = B,
                             .seqs = c->seqs,
                             .n_logit_rows = B * n,
                             .logit_rows = c->rows};
        return ds_gptoss_forward(c->t, &b);
    }
    if (k == SK_EXTEND) {
        for (int i = 0; i < B; i++)
            c->rows[i] = i * n + n - 1;
        struct ds_batch b = {.n_rows = B * n,
                             .tokens = c->tok,
                             .n_seq = B,
                             .seqs = c->seqs,
                             .n_logit_rows = B,
                             .logit_rows = c->rows};
        return ds_eagle3_extend(c->d, &b, ds_gptoss_aux(c->t), ds_gptoss_last_rows(c->t), c->hrows);
    }
    return ds_eagle3_step(c->d, B, c->tok, c->s_pos, c->s_slot, c->s_prev);
}

// Mean weight bytes of the timed target steps (their inputs are iterations 2 .. iters + 1; one
// when iters is 0): each replayed untimed, after the timing, with every trace paused. 0 on error.
static double target_step_bytes_mean(struct step_ctx *c, enum step_kind k, int B, int iters) {
    const int n = iters > 0 ? iters : 1, rows = B * (k == SK_VERIFY ? 4 : 1);
    double sum = 0;
    for (int it = 0; it < n; it++) {
        if (step_once(c, k, B, it + 2) != DS_OK || c->be->sync(c->be) != DS_OK) return 0;
        const double b = target_step_bytes(c, rows);
        if (b <= 0) return 0;
        sum += b;
    }
    return sum / n;
}

// Times `iters` calls of a step kind; *ms_out the median ms per call (host wall, call + sync).
static enum ds_status time_step(struct step_ctx *c, enum step_kind k, int B, int iters,
                                double *times, double *ms_out) {
    enum ds_status s = DS_OK;
    for (int w = 0; w < 2 && s == DS_OK; w++) // warm-up; the second call captures with graphs
        if ((s = step_once(c, k, B, w)) == DS_OK) s = c->be->sync(c->be);
    for (int it = 0; it < iters && s == DS_OK; it++) {
        const double t0 = now_ms();
        s = step_once(c, k, B, it + 2);
        if (s == DS_OK) s = c->be->sync(c->be);
        times[it] = now_ms() - t0;
    }
    if (s != DS_OK) return s;
    qsort(times, (size_t)iters, sizeof *times, cmp_double);
    *ms_out = iters ? times[iters / 2] : 0.0;
    return DS_OK;
}

static void load_dots(void *user, uint64_t done, uint64_t total) {
    (void)user;
    // A redrawn line only on a terminal; a log gets the final line alone.
    if (done < total && !isatty(STDERR_FILENO)) return;
    fprintf(stderr, "\rgenerating synthetic weights: %3.0f%%",
            total ? 100.0 * (double)done / (double)total : 100.0);
    if (done >= total) fputc('\n', stderr);
}

// ---------------------------------------------------------------------------------------------
// --steps --trace: the cost of each trace level, and where a step's time goes.
//
// Per step kind, after the usual two warm-up calls (outside every phase: their kernels stay
// unattributed and out of the table), ROUNDS rounds run `iters` steps at each listed level in
// turn: off (no trace call; the kernels trace paused), phases (the phases trace: begin, call,
// sync, end, poll) and kernels (the same on the kernels trace). A level's figure is the mean host
// time per step (what tokens/s sees) and the median; the kernels blocks also pay their final
// collect (every record they produced parsed; the forced flush charged for the share of one that
// the run's poll policy gives the block: ds_trace_flush_share). Beside each level: the host time
// of the launch calls, the recorder thread's time in the trace's calls (phase calls and polls,
// stats.calls_ns) and the GPU step time (the phase's event pair), so that a level's cost splits
// into launch, recorder and GPU parts. Each kernel row the sink receives whose step belongs to a
// timed kernels block goes into the table: launches per step, µs per step exclusive (from
// max(start, the end of the kernels before it on its stream) to end: under PDL kernels start
// before their predecessor ends) and raw (CUPTI start..end), and the share of the step: summed
// kernel time / summed GPU step time (the phase's event pair of the same steps). The kernels
// trace numbers its steps apart (consecutive ids), and the table (ds_trace_ktab) counts only
// rows of this kind's timed steps and phase, read after the block's collect has drained the
// worker; any other row is counted apart and printed.

#define TRACE_ROUNDS 2

struct trace_bench {
    ds_trace_t *phases, *kernels; // NULL when the level is not listed
    unsigned mask;                // 1 << level
    uint64_t step_id;             // next step id of the phases trace
    uint64_t kstep;               // next step id of the kernels trace (consecutive per table)
    ds_trace_ktab_t *tab;
};

static enum ds_rec_phase phase_of(enum step_kind k) {
    return k == SK_EXTEND ? DS_REC_PHASE_DRAFT_EXTEND
                          : k == SK_DSTEP ? DS_REC_PHASE_DRAFT_STEP : DS_REC_PHASE_VERIFY;
}

// One traced step as the run does it: phase, the call, the sync, end, poll. *gpu_ns: the
// phase's GPU time (0 when the poll gave none); *launch_ms: host time of the call alone (the
// launches, before the sync).
static enum ds_status traced_step(struct step_ctx *c, ds_trace_t *t, uint64_t step,
                                  enum step_kind k, int B, int iter, uint64_t *gpu_ns,
                                  double *launch_ms) {
    *gpu_ns = 0;
    enum ds_status s = ds_trace_phase_begin(t, step, phase_of(k), k == SK_DSTEP ? 1 : 0,
                                            (unsigned)B);
    if (s) return s;
    const double l0 = now_ms();
    s = step_once(c, k, B, iter);
    *launch_ms = now_ms() - l0;
    if (!s) s = c->be->sync(c->be);
    enum ds_status e = ds_trace_phase_end(t);
    if (!s) s = e;
    const struct ds_trace_step_times *tt = NULL;
    size_t n = 0;
    if (!s) s = ds_trace_poll(t, &tt, &n);
    for (size_t i = 0; i < n; i++) *gpu_ns += tt[i].end_ns - tt[i].start_ns;
    return s;
}

struct level_result {
    double mean_ms, median_ms;
    double launch_ms;                // summed host time of the step calls alone (launches)
    uint64_t gpu_ns, steps;          // phases/kernels: GPU step time summed (phase events), steps
    uint64_t calls_ns;               // phases/kernels: the recorder thread's time in the trace's
                                     //   phase calls and polls during the steps
    uint64_t step_flushes;           // forced flushes the polls made during the steps
    uint64_t dropped;                // kernels level: CUPTI records lost
    uint64_t parse_ns, flush_ns;     // kernels level: worker parse time, forced flushes' time
    uint64_t collect_ns;             // kernels level: the closing collects as charged
};

// Times a step kind at every listed level; res[level]. times holds TRACE_ROUNDS * iters doubles
// per level (3 levels).
static enum ds_status time_step_levels(struct step_ctx *c, struct trace_bench *tb,
                                       enum step_kind k, int B, int iters, double *times,
                                       struct level_result *res) {
    enum ds_status s = DS_OK;
    memset(res, 0, 3 * sizeof *res);
    double sum[3] = {0};
    int n[3] = {0};
    // Warm-up (the second call captures with graphs): with CUPTI on, outside every phase.
    if (tb->kernels) s = ds_trace_resume(tb->kernels);
    for (int w = 0; w < 2 && s == DS_OK; w++)
        if ((s = step_once(c, k, B, w)) == DS_OK) s = c->be->sync(c->be);
    const struct ds_trace_step_times *tt = NULL;
    size_t nt = 0;
    if (!s && tb->kernels) s = ds_trace_collect(tb->kernels, &tt, &nt); // warm-up records out
    struct ds_trace_stats st0 = {0}, st1 = {0};
    if (tb->kernels) ds_trace_stats(tb->kernels, &st0);
    ds_trace_ktab_reset(tb->tab, tb->kstep, tb->kstep, phase_of(k), k == SK_DSTEP ? 1 : 0);
    for (int r = 0; r < TRACE_ROUNDS && !s; r++) {
        for (int lv = 0; lv < 3 && !s; lv++) {
            if (!(tb->mask & (1u << lv))) continue;
            ds_trace_t *t = lv == DS_REC_TRACE_PHASES ? tb->phases
                            : lv == DS_REC_TRACE_KERNELS ? tb->kernels : NULL;
            if (tb->kernels) s = lv == DS_REC_TRACE_KERNELS ? ds_trace_resume(tb->kernels)
                                                            : ds_trace_pause(tb->kernels);
            double block = 0;
            struct ds_trace_stats b0 = {0}, b1 = {0};
            if (t) ds_trace_stats(t, &b0);
            for (int it = 0; it < iters && !s; it++) {
                const double t0 = now_ms();
                uint64_t g = 0;
                double launch = 0;
                if (!t) {
                    s = step_once(c, k, B, it + 2);
                    launch = now_ms() - t0;
                    if (!s) s = c->be->sync(c->be);
                } else if (lv == DS_REC_TRACE_KERNELS) {
                    ds_trace_ktab_set_end(tb->tab, tb->kstep + 1); // before its rows can come
                    s = traced_step(c, t, tb->kstep++, k, B, it + 2, &g, &launch);
                } else {
                    s = traced_step(c, t, tb->step_id++, k, B, it + 2, &g, &launch);
                }
                const double ms = now_ms() - t0;
                times[lv * TRACE_ROUNDS * iters + n[lv]++] = ms;
                block += ms;
                res[lv].launch_ms += launch;
                res[lv].gpu_ns += g, res[lv].steps++;
            }
            if (t) {
                ds_trace_stats(t, &b1);
                res[lv].calls_ns += b1.calls_ns - b0.calls_ns;
                res[lv].step_flushes += b1.flushes - b0.flushes;
            }
            if (!s && lv == DS_REC_TRACE_KERNELS) {
                // Every record of the block drained now (the table needs them). Charged: the
                // rows' conversion and sink, and the forced flush for the share of one that the
                // run's poll policy gives the block (ds_trace_flush_share: its correlation
                // entries over the table's flush load); not the wait for the worker, whose parse
                // ran beside the steps.
                const double t0 = now_ms();
                s = ds_trace_collect(t, &tt, &nt);
                const double total = now_ms() - t0;
                ds_trace_stats(t, &st1);
                double flush = (double)(st1.flush_ns - b1.flush_ns) * 1e-6;
                double wait = (double)(st1.wait_ns - b1.wait_ns) * 1e-6;
                if (flush > total) flush = total;
                if (wait > total - flush) wait = total - flush;
                const double share =
                    ds_trace_flush_share(t, &b0, &st1, (uint64_t)(block * 1e6));
                const double charged = total - flush - wait + flush * share;
                sum[lv] += charged;
                res[lv].collect_ns += (uint64_t)(charged * 1e6);
            }
            sum[lv] += block;
        }
    }
    if (tb->kernels) {
        if (!s) s = ds_trace_pause(tb->kernels);
        ds_trace_stats(tb->kernels, &st1);
        res[DS_REC_TRACE_KERNELS].dropped = st1.dropped_records - st0.dropped_records;
        res[DS_REC_TRACE_KERNELS].parse_ns = st1.parse_ns - st0.parse_ns;
        res[DS_REC_TRACE_KERNELS].flush_ns = st1.flush_ns - st0.flush_ns;
    }
    if (s) return s;
    for (int lv = 0; lv < 3; lv++) {
        if (!n[lv]) continue;
        double *v = times + lv * TRACE_ROUNDS * iters;
        qsort(v, (size_t)n[lv], sizeof *v, cmp_double);
        res[lv].median_ms = MEDIAN_SORTED(v, n[lv]);
        res[lv].mean_ms = sum[lv] / n[lv];
    }
    return DS_OK;
}

// Prints (or adds to the JSON row) the level figures and the kernel table.
static void report_levels(const struct trace_bench *tb, const struct level_result *res,
                          json_t *row, const char *kind, int B, bool g) {
    const double off = (tb->mask & 1u) ? res[0].mean_ms : 0;
    json_t *levels = row ? json_array() : NULL;
    for (int lv = 0; lv < 3; lv++) {
        if (!(tb->mask & (1u << lv))) continue;
        const struct level_result *r = &res[lv];
        const double over = off > 0 ? r->mean_ms / off - 1.0 : 0.0;
        const double steps = r->steps ? (double)r->steps : 1.0;
        const double launch_us = r->launch_ms * 1e3 / steps, calls_us = r->calls_ns / steps / 1e3;
        const double gpu_us = r->gpu_ns / steps / 1e3;
        if (levels) {
            json_t *o = json_pack("{s:s, s:f, s:f, s:f}", "trace", ds_trace_level_name(lv), "ms",
                                  r->mean_ms, "median_ms", r->median_ms, "launch_us", launch_us);
            if (off > 0) json_object_set_new(o, "overhead", json_real(over));
            if (lv) {
                json_object_set_new(o, "trace_calls_us", json_real(calls_us));
                json_object_set_new(o, "gpu_us", json_real(gpu_us));
                json_object_set_new(o, "step_flushes", json_integer((json_int_t)r->step_flushes));
            }
            json_array_append_new(levels, o);
        } else {
            printf("  %-24s B %-3d graphs %-3s trace %-7s %9.3f ms/step (median %.3f)", kind, B,
                   g ? "on" : "off", ds_trace_level_name(lv), r->mean_ms, r->median_ms);
            if (off > 0 && lv) printf("  %+.2f%% vs off", 100.0 * over);
            // Where a step's time goes: the host's launch calls, the recorder thread's own
            // trace calls (phase calls + poll), and the GPU's step (the phase's event pair).
            printf("\n      launch calls %.1f us/step", launch_us);
            if (lv)
                printf(", trace calls (recorder thread) %.1f us/step, GPU step %.1f us, forced "
                       "flushes in steps %llu",
                       calls_us, gpu_us, (unsigned long long)r->step_flushes);
            if (lv == DS_REC_TRACE_KERNELS)
                printf(", closing collects charged %.1f us/step", r->collect_ns / steps / 1e3);
            putchar('\n');
        }
    }
    if (row) json_object_set_new(row, "trace", levels);
    if (!(tb->mask & (1u << DS_REC_TRACE_KERNELS))) return;
    const struct level_result *r = &res[DS_REC_TRACE_KERNELS];
    size_t n = 0;
    uint64_t other = 0, launches = 0;
    int full = 0;
    const struct ds_trace_ktab_entry *e = ds_trace_ktab_entries(tb->tab, &n, &other, &full);
    const double steps = r->steps ? (double)r->steps : 1.0;
    uint64_t kern_ns = 0, excl_ns = 0;
    for (size_t i = 0; i < n; i++)
        kern_ns += e[i].ns, excl_ns += e[i].excl_ns, launches += e[i].launches;
    const double gpu_us = (double)r->gpu_ns / steps / 1e3;
    json_t *arr = row ? json_array() : NULL;
    // With programmatic dependent launch a kernel's CUPTI start is when its blocks launched,
    // which can be before its predecessor ended (they wait at the grid dependency): raw
    // durations overlap and their sum exceeds the step. "excl" counts a kernel from
    // max(start, end of every earlier kernel on its stream) to its end: the exclusive times tile
    // the stream's busy time and their sum never exceeds the GPU step.
    if (!row)
        printf("    kernels of %llu timed steps (API records %s): GPU step %.1f us, %.2f launches, "
               "kernels %.1f us exclusive (%.1f%%), %.1f us raw (%.1f%%), %llu CUPTI records "
               "dropped, %llu rows of other steps ignored; worker parse %.1f us/step (other "
               "thread), forced flushes %.1f us/step (closing collects included, charged above "
               "by share)%s%s\n"
               "    excl = from max(start, previous kernel's end on its stream) to end (under PDL "
               "a kernel starts, and waits, before its predecessor ends); raw = CUPTI start to "
               "end\n"
               "    %-60s %9s %10s %7s %10s %7s\n",
               (unsigned long long)r->steps,
               ds_trace_api_name(ds_trace_api_records(tb->kernels)), gpu_us,
               (double)launches / steps, (double)excl_ns / steps / 1e3,
               r->gpu_ns ? 100.0 * excl_ns / r->gpu_ns : 0.0, (double)kern_ns / steps / 1e3,
               r->gpu_ns ? 100.0 * kern_ns / r->gpu_ns : 0.0, (unsigned long long)r->dropped,
               (unsigned long long)other, (double)r->parse_ns / steps / 1e3,
               (double)r->flush_ns / steps / 1e3,
               (full & 1) ? " (table full: rest in the last row)" : "",
               (full & 2) ? " (out of memory: exclusive times partial)" : "", "kernel",
               "launches", "excl us", "share", "raw us", "share");
    for (size_t i = 0; i < n; i++) {
        const double lps = (double)e[i].launches / steps, us = (double)e[i].ns / steps / 1e3;
        const double xus = (double)e[i].excl_ns / steps / 1e3;
        const double share = r->gpu_ns ? (double)e[i].ns / (double)r->gpu_ns : 0.0;
        const double xshare = r->gpu_ns ? (double)e[i].excl_ns / (double)r->gpu_ns : 0.0;
        if (arr)
            json_array_append_new(arr, json_pack("{s:s, s:f, s:f, s:f, s:f, s:f}", "kernel",
                                                 e[i].name, "launches_per_step", lps,
                                                 "excl_us_per_step", xus, "excl_share", xshare,
                                                 "us_per_step", us, "share", share));
        else
            printf("    %-60s %9.2f %10.2f %6.1f%% %10.2f %6.1f%%\n", e[i].name, lps, xus,
                   100.0 * xshare, us, 100.0 * share);
    }
    if (row) {
        json_t *o = json_pack(
            "{s:s, s:I, s:f, s:f, s:f, s:f, s:I, s:I, s:f, s:f, s:o}", "api_records",
            ds_trace_api_name(ds_trace_api_records(tb->kernels)), "steps", (json_int_t)r->steps,
            "gpu_us_per_step", gpu_us, "launches_per_step", (double)launches / steps,
            "kernel_excl_us_per_step", (double)excl_ns / steps / 1e3, "kernel_us_per_step",
            (double)kern_ns / steps / 1e3, "dropped_records", (json_int_t)r->dropped,
            "other_rows", (json_int_t)other, "parse_us_per_step",
            (double)r->parse_ns / steps / 1e3, "flush_us_per_step",
            (double)r->flush_ns / steps / 1e3, "kernels", arr);
        json_object_set_new(row, "kernel_table", o);
    }
    fflush(stdout);
}

static int bench_steps(const char *shape, const int *batches, int n_batches, int iters, int kv,
                       int graphs_mode, int layers, uint64_t seed, int device, int json,
                       unsigned trace_mask, int by_grid) {
    int rc = 1, max_b = 1;
    for (int i = 0; i < n_batches; i++)
        if (batches[i] > max_b) max_b = batches[i];
    struct ds_backend *be = NULL;
    struct step_ctx c = {.max_b = max_b, .kv = kv, .seed = seed};
    struct step_row *out = NULL;
    double *times = malloc(sizeof(double) * 3 * TRACE_ROUNDS * (size_t)(iters > 0 ? iters : 1));
    json_t *js = json_array();
    struct trace_bench tb = {.mask = trace_mask};
    if (trace_mask && ds_trace_ktab_create(&tb.tab) != DS_OK) {
        fprintf(stderr, "draftscope bench: %s\n", ds_error_last());
        goto cleanup;
    }
    ds_trace_ktab_set_by_grid(tb.tab, by_grid);
    char arg[64];
    if (layers > 0)
        snprintf(arg, sizeof arg, "%s:%llu:%d", shape, (unsigned long long)seed, layers);
    else
        snprintf(arg, sizeof arg, "%s:%llu", shape, (unsigned long long)seed);
    struct ds_synthetic_spec spec;
    struct ds_target_config tc;
    struct ds_aux_plan aux;
    // The preset and the layer slice (--layers) are the command line's: a usage error (2), said
    // before tracing or the GPU is touched. The spec is built here, so the message names the
    // options the user gave rather than the spec text.
    if (ds_synthetic_parse(arg, &spec) != DS_OK ||
        ds_synthetic_target_config(&spec, &tc) != DS_OK ||
        ds_synthetic_aux_plan(&tc, &aux) != DS_OK) {
        fprintf(stderr, "draftscope bench: --shape %s --layers %d (the synthetic model of the "
                        "steps): %s\n",
                shape, layers, ds_error_last());
        rc = 2;
        goto cleanup;
    }
    // The device before CUPTI: without one, the runtime's reason, not a tracing error.
    const int no_device = ds_cli_cuda_device("bench", device);
    if (no_device) {
        rc = no_device;
        goto cleanup;
    }
    // CUPTI before the backend: before any module loads or graph is captured.
    if ((trace_mask & (1u << DS_REC_TRACE_KERNELS)) &&
        (ds_trace_create(DS_REC_TRACE_KERNELS, NULL, NULL, &tb.kernels) != DS_OK ||
         ds_trace_set_kernel_sink(tb.kernels, ds_trace_ktab_sink, tb.tab) != DS_OK)) {
        fprintf(stderr, "draftscope bench: %s\n", ds_error_last());
        goto cleanup;
    }
    if (ds_backend_cuda_create(device, &be) != DS_OK) {
        fprintf(stderr, "draftscope bench: %s\n", ds_error_last());
        goto cleanup;
    }
    c.be = be;
    if (((trace_mask & (1u << DS_REC_TRACE_PHASES)) &&
         (ds_trace_create(DS_REC_TRACE_PHASES, NULL, NULL, &tb.phases) != DS_OK ||
          ds_trace_set_stream(tb.phases, ds_backend_cuda_stream(be)) != DS_OK)) ||
        (tb.kernels && ds_trace_set_stream(tb.kernels, ds_backend_cuda_stream(be)) != DS_OK)) {
        fprintf(stderr, "draftscope bench: %s\n", ds_error_last());
        goto cleanup;
    }
    // Without a measured copy bandwidth the floors would be infinite: assume the H200's, say so.
    double copy_gbs = copy_bandwidth((cudaStream_t)ds_backend_cuda_stream(be));
    const bool copy_measured = copy_gbs > 0.0;
    if (!copy_measured) copy_gbs = BENCH_CEIL_GBS;
    struct ds_gptoss_plan tp = {.max_slots = max_b,
                                .max_pos = kv + 8,
                                .max_rows = 4 * max_b,
                                .max_logit_rows = 4 * max_b,
                                .graphs = graphs_mode != 0};
    ds_gptoss_plan_aux(&tp, &aux);
    struct ds_eagle3_plan dp = {
        .max_slots = max_b, .max_pos = kv + 8, .max_rows = 2 * max_b, .max_logit_rows = max_b};
    struct ds_load_progress prog = {load_dots, NULL};
    if (ds_synthetic_target_create(&spec, be, &tp, json ? NULL : &prog, &c.t) != DS_OK ||
        ds_synthetic_draft_create(&spec, c.t, be, &dp, NULL, &c.d) != DS_OK ||
        ds_gptoss_clear_kv(c.t) != DS_OK || ds_eagle3_clear_kv(c.d) != DS_OK) {
        fprintf(stderr, "draftscope bench: %s\n", ds_error_last());
        goto cleanup;
    }
    c.V = (int)tc.vocab_size, c.H = (int)tc.hidden_size, c.L = (int)tc.num_hidden_layers;
    c.E = (int)tc.num_local_experts, c.KE = (int)tc.num_experts_per_tok;
    c.I = (int)tc.intermediate_size, c.QD = (int)(tc.num_attention_heads * tc.head_dim);
    c.KD = (int)(tc.num_key_value_heads * tc.head_dim);
    const size_t R = 4 * (size_t)max_b;
    c.tok = malloc(R * sizeof(int32_t)), c.rows = malloc(R * sizeof(int32_t));
    c.hrows = malloc(R * sizeof(int32_t)), c.s_pos = malloc(R * sizeof(int32_t));
    c.s_slot = malloc(R * sizeof(int32_t)), c.s_prev = malloc(R * sizeof(int32_t));
    c.seqs = malloc((size_t)max_b * sizeof *c.seqs);
    c.experts = malloc((size_t)c.L * R * (size_t)c.KE * sizeof(int32_t));
    out = calloc((size_t)n_batches * 8, sizeof *out);
    if (!times || !js || !c.tok || !c.rows || !c.hrows || !c.s_pos || !c.s_slot || !c.s_prev ||
        !c.seqs || !c.experts || !out) {
        fprintf(stderr, "draftscope bench: out of memory\n");
        goto cleanup;
    }
    struct ds_gptoss_memory tm, dm;
    ds_gptoss_memory_plan(c.t, &tm);
    ds_eagle3_memory_plan(c.d, &dm);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const double draft_bytes = (double)dm.weights;
    // KV reads: the target's full and sliding layers, the draft's one full layer (bf16 caches).
    const struct ds_draft_config *dc = ds_eagle3_config(c.d);
    const double fc_bytes = 2.0 * dc->hidden_size * (double)aux.n * dc->target_hidden_size;
    const int d_kd = (int)(dc->num_key_value_heads * dc->head_dim);
    int n_win = 0;
    for (int l = 0; l < c.L; l++)
        n_win += tc.layer_types[l] == DS_ATTN_SLIDING;
    if (!json)
        printf("draftscope bench --steps: synthetic gpt-oss-%s (%d layers, %d experts), seed %llu,"
               " context %d\n"
               "memory: target weights %.2f GB, KV %.2f GB, activations %.2f GB; draft weights "
               "%.2f GB, KV %.2f GB, activations %.2f GB; free %.2f of %.2f GB\n"
               "copy bandwidth %s: %.0f GB/s\n"
               "%-24s %5s %5s %6s %9s %10s %9s %6s %9s %8s %6s\n",
               shape, c.L, c.E, (unsigned long long)seed, kv, tm.weights / 1e9, tm.kv / 1e9,
               tm.activations / 1e9, dm.weights / 1e9, dm.kv / 1e9, dm.activations / 1e9,
               free_b / 1e9, total_b / 1e9,
               copy_measured ? "measured" : "assumed (not measured)", copy_gbs, "step", "B",
               "rows", "graphs", "ms/step",
               "rows/s", "weight GB", "KV GB", "floor ms", "GB/s", "%copy");
    int n_out = 0;
    for (int bi = 0; bi < n_batches; bi++) {
        const int B = batches[bi];
        for (int gm = 0; gm < 2; gm++) {
            const bool g = gm == 1;
            if ((graphs_mode == 0 && g) || (graphs_mode == 1 && !g)) continue;
            ds_gptoss_set_graphs(c.t, g);
            ds_eagle3_set_graphs(c.d, g);
            for (int k = SK_DECODE; k <= SK_DSTEP; k++) {
                if (k == SK_EXTEND && g) continue; // extends always run eagerly
                if (k == SK_DSTEP) {               // steps follow an extend (their hidden source)
                    if (step_once(&c, SK_VERIFY, B, 0) != DS_OK ||
                        step_once(&c, SK_EXTEND, B, 0) != DS_OK) {
                        fprintf(stderr, "draftscope bench: %s\n", ds_error_last());
                        goto cleanup;
                    }
                }
                double ms = 0;
                struct level_result lres[3];
                enum ds_status ts =
                    trace_mask ? time_step_levels(&c, &tb, (enum step_kind)k, B, iters, times, lres)
                               : time_step(&c, (enum step_kind)k, B, iters, times, &ms);
                if (ts != DS_OK) {
                    fprintf(stderr, "draftscope bench: %s B=%d: %s\n", step_names[k], B,
                            ds_error_last());
                    goto cleanup;
                }
                if (trace_mask) // the row shows the lowest level listed (off when it is)
                    for (int lv = 2; lv >= 0; lv--)
                        if (trace_mask & (1u << lv)) ms = lres[lv].median_ms;
                const int rows = B * (k == SK_VERIFY ? 4 : k == SK_EXTEND ? 2 : 1);
                const bool dstep = k == SK_DSTEP;
                double bytes = k <= SK_VERIFY ? target_step_bytes_mean(&c, (enum step_kind)k, B,
                                                                       iters)
                                              : ds_bench_draft_weight_bytes(draft_bytes, fc_bytes,
                                                                            dstep, rows, c.H);
                if (bytes <= 0) {
                    fprintf(stderr, "draftscope bench: %s B=%d: weight bytes: %s\n",
                            step_names[k], B, ds_error_last());
                    goto cleanup;
                }
                // Keys cached before the rows: --kv for target and draft steps, --kv - 2 for
                // the extends (step_once's positions).
                const double kvb =
                    k <= SK_VERIFY ? ds_bench_kv_read_bytes(B, kv, c.L - n_win, n_win,
                                                            (int)tc.sliding_window, c.KD, 2)
                                   : ds_bench_kv_read_bytes(B, k == SK_EXTEND ? kv - 2 : kv, 1, 0,
                                                            0, d_kd, 2);
                struct step_row *r = &out[n_out++];
                *r = (struct step_row){step_names[k], B, rows, g, ms, bytes};
                const double floor_ms = (bytes + kvb) / (copy_gbs * 1e9) * 1e3;
                const double gbs = ms > 0 ? (bytes + kvb) / (ms * 1e-3) / 1e9 : 0;
                if (json) {
                    json_t *jr =
                        json_pack("{s:s, s:i, s:i, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b}",
                                  "step", r->kind, "batch", B, "rows", rows, "graphs", g, "ms",
                                  ms, "rows_s", ms > 0 ? rows / (ms * 1e-3) : 0.0, "weight_bytes",
                                  bytes, "kv_bytes", kvb, "floor_ms", floor_ms, "gb_s", gbs,
                                  "copy_gb_s", copy_gbs, "copy_measured", copy_measured);
                    if (trace_mask) report_levels(&tb, lres, jr, r->kind, B, g);
                    json_array_append_new(js, jr);
                } else {
                    printf("%-24s %5d %5d %6s %9.3f %10.0f %9.3f %6.3f %9.3f %8.0f %5.0f%%\n",
                           r->kind, B, rows, g ? "on" : "off", ms,
                           ms > 0 ? rows / (ms * 1e-3) : 0.0, bytes / 1e9, kvb / 1e9, floor_ms,
                           gbs, copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0);
                    if (trace_mask) report_levels(&tb, lres, NULL, r->kind, B, g);
                    fflush(stdout);
                }
            }
        }
    }
    if (json) {
        char *text = json_dumps(js, JSON_INDENT(2));
        if (text) puts(text);
        free(text);
    }
    rc = 0;
cleanup:
    ds_eagle3_release(c.d);
    ds_gptoss_release(c.t);
    ds_backend_release(be);
    ds_trace_release(tb.phases); // after the backend, as the run does
    ds_trace_release(tb.kernels);
    ds_trace_ktab_release(tb.tab);
    free(c.tok), free(c.rows), free(c.hrows), free(c.s_pos), free(c.s_slot), free(c.s_prev);
    free(c.seqs), free(c.experts), free(out), free(times);
    json_decref(js);
    return rc;
}

// --kv at most: gpt-oss's context length (max_position_embeddings).
#define BENCH_MAX_KV 131072

// An integer option's value in [lo, hi] (a usage error, printed, when not).
static bool bench_int(const char *opt, const char *v, int lo, int hi, int *out) {
    long long x;
    char msg[96];
    if (!ds_cli_int_opt(opt, v, lo, hi, &x, msg, sizeof msg)) {
        fprintf(stderr, "draftscope bench: %s, got '%s'\n", msg, v);
        return false;
    }
    *out = (int)x;
    return true;
}

// A comma-separated list of 1 .. BENCH_MAX_ROWS_LIST integers in [1, hi].
static bool bench_list(const char *opt, const char *v, int hi, int *out, int *n) {
    long long x[BENCH_MAX_ROWS_LIST];
    int k = 0;
    const int rc = ds_cli_parse_list(v, 1, hi, x, BENCH_MAX_ROWS_LIST, &k);
    if (rc == -2) {
        fprintf(stderr, "draftscope bench: %s takes at most %d entries, got '%s'\n", opt,
                BENCH_MAX_ROWS_LIST, v);
        return false;
    }
    if (rc) {
        fprintf(stderr,
                "draftscope bench: %s wants a comma-separated list of integers in 1..%d, "
                "got '%s'\n",
                opt, hi, v);
        return false;
    }
    for (int i = 0; i < k; i++)
        out[i] = (int)x[i];
    *n = k;
    return true;
}

int ds_cmd_bench(int argc, char **argv) {
    int ops = 0, steps = 0, json = 0, iters = 20, kv = 4096, device = 0, graphs = 2, layers = 0;
    unsigned trace_mask = 0;
    int by_grid = 0, dirty = 0;
    unsigned long long seed = 0;
    int rows[BENCH_MAX_ROWS_LIST] = {1, 4, 32, 256}, n_rows = 4;
    int batches[BENCH_MAX_ROWS_LIST] = {1, 8, 32, 64}, n_batches = 4;
    const char *shape = "20b";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--ops")) {
            ops = 1;
        } else if (!strcmp(o, "--steps")) {
            steps = 1;
        } else if (v && !strcmp(o, "--graphs")) {
            graphs = !strcmp(v, "off")    ? 0
                     : !strcmp(v, "on")   ? 1
                     : !strcmp(v, "both") ? 2
                                          : -1,
            i++;
            if (graphs < 0) {
                fprintf(stderr, "draftscope bench: --graphs wants on, off or both, got '%s'\n", v);
                return 2;
            }
        } else if (v && !strcmp(o, "--layers")) {
            if (!bench_int(o, v, 0, 256, &layers)) return 2;
            i++;
        } else if (v && !strcmp(o, "--trace")) {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                enum ds_rec_trace_level lv;
                if (ds_trace_level_parse(tok, &lv) != DS_OK) {
                    fprintf(stderr, "draftscope bench: %s\n", ds_error_last());
                    return 2;
                }
                trace_mask |= 1u << lv;
            }
            if (!trace_mask) {
                fprintf(stderr, "draftscope bench: --trace wants a list of off, phases, kernels\n");
                return 2;
            }
            i++;
        } else if (v && !strcmp(o, "--seed")) {
            // At most 2^63 - 1, as for run's seeds (JSON has signed integers).
            long long sv;
            char msg[96];
            if (!ds_cli_int_opt(o, v, 0, INT64_MAX, &sv, msg, sizeof msg)) {
                fprintf(stderr, "draftscope bench: %s, got '%s'\n", msg, v);
                return 2;
            }
            seed = (unsigned long long)sv;
            i++;
        } else if (v && !strcmp(o, "--batches")) {
            if (!bench_list(o, v, 256, batches, &n_batches)) return 2;
            i++;
        } else if (!strcmp(o, "--json")) {
            json = 1;
        } else if (!strcmp(o, "--by-grid")) {
            by_grid = 1;
        } else if (v && !strcmp(o, "--l2")) {
            dirty = !strcmp(v, "dirty") ? 1 : !strcmp(v, "clean") ? 0 : -1, i++;
            if (dirty < 0) {
                fprintf(stderr, "draftscope bench: --l2 wants clean or dirty, got '%s'\n", v);
                return 2;
            }
        } else if (v && !strcmp(o, "--shape")) {
            shape = v, i++;
        } else if (v && !strcmp(o, "--iters")) {
            if (!bench_int(o, v, 0, 10000, &iters)) return 2;
            i++;
        } else if (v && !strcmp(o, "--kv")) {
            if (!bench_int(o, v, 1, BENCH_MAX_KV, &kv)) return 2;
            i++;
        } else if (v && !strcmp(o, "--device")) {
            if (!bench_int(o, v, 0, 1023, &device)) return 2;
            i++;
        } else if (v && !strcmp(o, "--rows")) {
            if (!bench_list(o, v, 65536, rows, &n_rows)) return 2;
            i++;
        } else {
            fprintf(stderr, "draftscope bench: unknown or incomplete option '%s'\n", o);
            usage(stderr);
            return 2;
        }
    }
    if (trace_mask && !steps) {
        fprintf(stderr, "draftscope bench: --trace goes with --steps\n");
        return 2;
    }
    if (by_grid && !(trace_mask & (1u << DS_REC_TRACE_KERNELS))) {
        fprintf(stderr, "draftscope bench: --by-grid goes with --trace ...,kernels\n");
        return 2;
    }
    if (ops == steps) {
        fprintf(stderr, "draftscope bench: say what to time (--ops or --steps)\n");
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
    if (steps) {
        if (kv < 8) {
            fprintf(stderr, "draftscope bench: --steps needs --kv >= 8\n");
            return 2;
        }
        return bench_steps(shape, batches, n_batches, iters, kv, graphs, layers, seed, device,
                           json, trace_mask, by_grid);
    }
    const int no_device = ds_cli_cuda_device("bench", device);
    if (no_device) return no_device;
    struct cudaDeviceProp prop;
    cudaError_t de = cudaSetDevice(device);
    if (de == cudaSuccess) de = cudaGetDeviceProperties(&prop, device);
    if (de != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "draftscope bench: cannot use GPU %d (%s)\n", device,
                cudaGetErrorString(de));
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
    // The ratio column is against the copy bandwidth measured here, in the same process.
    double ceil_gbs = iters ? copy_bandwidth(s) : 0.0;
    const bool measured = ceil_gbs > 0.0;
    if (!measured) ceil_gbs = BENCH_CEIL_GBS;
    if (!json)
        printf("draftscope bench on %s (gpt-oss-%s shapes, KV %d, %d iterations, L2 %s, copy "
               "bandwidth %.0f GB/s %s)\n%-22s %-52s %10s %10s %9s %6s %8s\n",
               prop.name, shape, kv, iters, dirty ? "dirty" : "clean", ceil_gbs,
               measured ? "measured in this run" : "assumed (not measured)", "op", "shape",
               "median_us", "min_us", "GB/s", "%copy", "TFLOP/s");
    for (int ri = 0; ri < n_rows && !rc; ri++) {
        for (int idx = 0;; idx++) {
            struct bench_case c;
            int built = setup_case(&c, idx, rows[ri], &m, kv, s);
            if (built < 0) break;
            if (!built) {
                fprintf(stderr, "draftscope bench: %s T=%d: %s\n", c.name, rows[ri],
                        c.why[0] ? c.why : "out of GPU memory setting up");
                case_free(&c);
                continue;
            }
            // The index tables went up by cudaMemcpy on the legacy stream, whose DMA a kernel on
            // the non-blocking bench stream is not ordered after: wait for every stream first.
            const cudaError_t up = cudaDeviceSynchronize();
            enum ds_status st = DS_OK;
            for (int w = 0; w < (iters ? 2 : 1) && st == DS_OK && !up; w++) st = run_case(&c, s);
            for (int it = 0; it < iters && st == DS_OK && !up; it++) {
                // Evict the inputs from L2 (a memset of twice its size), then drop the memset's
                // dirty lines: otherwise the op pays for writing them back (docs/performance.md).
                cudaMemsetAsync(flush, it & 0xff, flush_bytes, s);
                if (!dirty && (st = ds_l2_discard_cuda(flush, flush_bytes, s)) != DS_OK) break;
                cudaEventRecord(ev0, s);
                st = run_case(&c, s);
                cudaEventRecord(ev1, s);
                cudaEventSynchronize(ev1);
                cudaEventElapsedTime(&times[it], ev0, ev1);
            }
            cudaError_t ce = up != cudaSuccess ? up : cudaStreamSynchronize(s);
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
                med = MEDIAN_SORTED(times, iters) * 1e3, mn = times[0] * 1e3; // µs
                gbs = c.bytes / (med * 1e-6) / 1e9;
                tfl = c.flops > 0 ? c.flops / (med * 1e-6) / 1e12 : 0.0;
            }
            if (json) {
                json_array_append_new(
                    out, json_pack("{s:s, s:s, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s,"
                                   " s:b}",
                                   "op", c.name, "shape", c.shape, "rows", rows[ri], "model", shape,
                                   "median_us", med, "min_us", mn, "bytes", c.bytes, "gb_s", gbs,
                                   "copy_gb_s", ceil_gbs, "copy_share", gbs / ceil_gbs, "tflop_s",
                                   tfl, "l2", dirty ? "dirty" : "clean", "copy_measured",
                                   measured));
            } else {
                printf("%-22s %-52s %10.1f %10.1f %9.0f %5.0f%% ", c.name, c.shape, med, mn, gbs,
                       100.0 * gbs / ceil_gbs);
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
