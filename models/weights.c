// The weight loader and the RoPE-table helper shared by the target and the draft (weights.h).
//
// A weight is bound by name in two passes (measure, then load), so the memory plan is known before
// the one arena is allocated. On a backend with map_host (the CPU reference) the mmapped
// checkpoint pages are used in place and nothing is copied. On CUDA the pages are streamed to the
// device through two pinned staging buffers; with a generator (synthetic weights) each tensor is
// filled in place. The CUDA-graph cache of fixed-shape steps lives here too (weights.h).
#include "weights.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/gptoss.h"
#include "ds/kernels.h"
#include "ds/kernels_cuda.h"

// Pinned double buffer of the CUDA streaming upload.
struct ds_wl_stage {
    cudaStream_t stream;
    void *buf[2];
    cudaEvent_t done[2]; // the copy out of buf[i] has finished
    bool pending[2];
    int next;
};

void ds_wl_init(struct ds_weight_loader *wl, struct ds_backend *be, const ds_safetensors_t *st,
                const char *label, void (*progress_fn)(void *, uint64_t, uint64_t),
                void *progress_user) {
    *wl = (struct ds_weight_loader){0};
    wl->be = be;
    wl->st = st;
    wl->label = label;
    wl->mapped = be->map_host != NULL;
    wl->progress_fn = progress_fn;
    wl->progress_user = progress_user;
}

void ds_wl_init_gen(struct ds_weight_loader *wl, struct ds_backend *be,
                    const struct ds_weight_gen *gen, const char *label,
                    void (*progress_fn)(void *, uint64_t, uint64_t), void *progress_user) {
    ds_wl_init(wl, be, NULL, label, progress_fn, progress_user);
    wl->gen = gen;
    wl->mapped = false; // generated weights need memory of their own, even on the CPU
}

static void stage_free(struct ds_wl_stage *g) {
    for (int i = 0; i < 2; i++) {
        if (g->done[i]) cudaEventDestroy(g->done[i]);
        if (g->buf[i]) cudaFreeHost(g->buf[i]);
    }
    free(g);
}

// The staging buffers, created at the first upload; NULL (plain uploads) when the backend is not
// CUDA or pinned memory is short.
static struct ds_wl_stage *stage_get(struct ds_weight_loader *wl) {
    if (wl->stage) return wl->stage;
    void *stream = ds_backend_cuda_stream(wl->be);
    if (!stream) return NULL;
    struct ds_wl_stage *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->stream = (cudaStream_t)stream;
    for (int i = 0; i < 2; i++) {
        if (cudaHostAlloc(&g->buf[i], DS_WL_STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&g->done[i], cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            stage_free(g);
            return NULL;
        }
    }
    wl->stage = g;
    return g;
}

enum ds_status ds_wl_finish(struct ds_weight_loader *wl) {
    struct ds_wl_stage *g = wl->stage;
    // Generated weights: the fills are queued on the backend's stream (CUDA); the load ends when
    // they are done, not when the last one is queued (load time, the first step's time).
    if (!g && wl->gen && wl->arena) return wl->be->sync(wl->be);
    if (!g) return DS_OK;
    wl->stage = NULL;
    cudaError_t e = cudaStreamSynchronize(g->stream);
    stage_free(g);
    if (e != cudaSuccess)
        return ds_error_set(DS_ERR_IO, "%s: weight upload failed: %s", wl->label,
                            cudaGetErrorString(e));
    return DS_OK;
}

// The copy out of the mapping, in pieces over the OpenMP threads: one thread's memcpy (with the
// page faults that read the file) moved gpt-oss-120b's 65 GB at 4.8 GB/s from the page cache on
// the H200's host, a tenth of what the DMA takes; 16 threads 43-45 GB/s (docs/performance.md).
#define DS_WL_PIECE ((size_t)2 << 20)
static void copy_pieces(char *dst, const char *src, size_t n) {
    const long pieces = (long)((n + DS_WL_PIECE - 1) / DS_WL_PIECE);
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (long k = 0; k < pieces; k++) {
        const size_t off = (size_t)k * DS_WL_PIECE;
        memcpy(dst + off, src + off, n - off < DS_WL_PIECE ? n - off : DS_WL_PIECE);
    }
}

// Copies one tensor host → device through the staging buffers: the copy into buffer i (which
// reads the mmapped file) overlaps the DMA out of the other buffer.
static enum ds_status stage_upload(struct ds_weight_loader *wl, struct ds_wl_stage *g, char *dst,
                                   const char *src, size_t bytes, size_t done_before) {
    for (size_t off = 0; off < bytes;) {
        const size_t n = bytes - off < DS_WL_STAGE_BYTES ? bytes - off : DS_WL_STAGE_BYTES;
        const int i = g->next;
        g->next ^= 1;
        if (g->pending[i] && cudaEventSynchronize(g->done[i]) != cudaSuccess)
            return ds_error_set(DS_ERR_IO, "%s: staged copy failed: %s", wl->label,
                                cudaGetErrorString(cudaGetLastError()));
        copy_pieces(g->buf[i], src + off, n);
        if (cudaMemcpyAsync(dst + off, g->buf[i], n, cudaMemcpyHostToDevice, g->stream) !=
                cudaSuccess ||
            cudaEventRecord(g->done[i], g->stream) != cudaSuccess)
            return ds_error_set(DS_ERR_IO, "%s: staged copy failed: %s", wl->label,
                                cudaGetErrorString(cudaGetLastError()));
        g->pending[i] = true;
        off += n;
        if (wl->progress_fn) wl->progress_fn(wl->progress_user, done_before + off, wl->total);
    }
    return DS_OK;
}

// Binds one tensor of a generator: the shape the model expects, filled in the load pass.
static enum ds_status gen_get(struct ds_weight_loader *wl, const char *name, unsigned want,
                              uint64_t numel, bool optional, const void **ptr_out,
                              enum ds_elem *elem_out) {
    if (optional) return DS_OK; // variants the generator does not build
    const enum ds_dtype dt = (want & (1u << DS_DTYPE_BF16)) ? DS_DTYPE_BF16 : DS_DTYPE_U8;
    const size_t bytes = (size_t)numel * ds_dtype_size(dt);
    if (elem_out) *elem_out = dt == DS_DTYPE_BF16 ? DS_ELEM_BF16 : DS_ELEM_COUNT;
    wl->tensors++;
    if (!wl->loading) {
        *ptr_out = (const void *)(uintptr_t)1; // placeholder, replaced in the load pass
        wl->bytes += ds_align256(bytes);
        return DS_OK;
    }
    char *dst = (char *)wl->arena + wl->bytes;
    enum ds_status s = wl->gen->fill(wl->gen->user, wl->be, name, dt, numel, dst);
    if (s != DS_OK)
        return ds_error_set(s, "%s: generating %s: %s", wl->label, name, ds_error_last());
    wl->bytes += ds_align256(bytes);
    *ptr_out = dst;
    if (wl->progress_fn) wl->progress_fn(wl->progress_user, wl->bytes, wl->total);
    return DS_OK;
}

enum ds_status ds_wl_begin_load(struct ds_weight_loader *wl, void **arena_out) {
    *arena_out = NULL;
    size_t total = wl->bytes;
    wl->loading = true;
    wl->bytes = 0;
    wl->tensors = 0;
    wl->arena = NULL;
    wl->copy_at = 0;
    if (wl->mapped) total = wl->copy_bytes;
    if (total == 0) return DS_OK;
    enum ds_status s = wl->be->alloc(wl->be, total, &wl->arena);
    if (s != DS_OK)
        return ds_error_set(s, "%s: cannot allocate %zu bytes of weights on %s (%s)", wl->label,
                            total, wl->be->name, ds_error_last());
    *arena_out = wl->arena;
    wl->total = total;
    return DS_OK;
}

enum ds_elem ds_elem_of_dtype(enum ds_dtype t) {
    switch (t) {
    case DS_DTYPE_BF16:
        return DS_ELEM_BF16;
    case DS_DTYPE_F32:
        return DS_ELEM_F32;
    default:
        return DS_ELEM_COUNT;
    }
}

enum ds_status ds_wl_get(struct ds_weight_loader *wl, const char *name, unsigned want,
                         uint64_t numel, bool optional, const void **ptr_out,
                         enum ds_elem *elem_out) {
    *ptr_out = NULL;
    if (elem_out) *elem_out = DS_ELEM_COUNT;
    if (wl->gen) return gen_get(wl, name, want, numel, optional, ptr_out, elem_out);
    const struct ds_tensor_info *t = ds_safetensors_find(wl->st, name);
    if (!t) {
        if (optional) return DS_OK;
        return ds_error_set(DS_ERR_MISMATCH, "%s: tensor %s is missing", wl->label, name);
    }
    if (!(want & (1u << t->dtype)))
        return ds_error_set(DS_ERR_MISMATCH, "%s: tensor %s has dtype %s, not one the model reads",
                            wl->label, name, ds_dtype_name(t->dtype));
    if (t->numel != numel)
        return ds_error_set(DS_ERR_MISMATCH, "%s: tensor %s has %llu elements, expected %llu",
                            wl->label, name, (unsigned long long)t->numel,
                            (unsigned long long)numel);
    if (elem_out) *elem_out = ds_elem_of_dtype(t->dtype);
    size_t bytes = (size_t)t->nbytes;
    wl->tensors++;
    // Mapped data must be aligned for its element type: reading it in place otherwise is
    // undefined behaviour in C, and the ops assume aligned pointers.
    const bool copy = wl->mapped && (uintptr_t)t->data % ds_dtype_size(t->dtype) != 0;
    if (!wl->loading) {
        // Placeholder: never dereferenced; the load pass replaces every pointer.
        *ptr_out = t->data;
        if (!wl->mapped) {
            wl->bytes += ds_align256(bytes);
        } else {
            wl->bytes += bytes;
            if (copy) wl->copy_bytes += ds_align256(bytes);
        }
        return DS_OK;
    }
    if (copy) {
        char *dst = (char *)wl->arena + wl->copy_at;
        enum ds_status s = wl->be->upload(wl->be, dst, t->data, bytes);
        if (s != DS_OK)
            return ds_error_set(s, "%s: copying %s: %s", wl->label, name, ds_error_last());
        wl->copy_at += ds_align256(bytes);
        wl->bytes += bytes;
        *ptr_out = dst;
        return DS_OK;
    }
    if (wl->mapped) {
        enum ds_status s = wl->be->map_host(wl->be, t->data, bytes, ptr_out);
        if (s != DS_OK) return s;
        wl->bytes += bytes;
        return DS_OK;
    }
    char *dst = (char *)wl->arena + wl->bytes;
    struct ds_wl_stage *g = stage_get(wl);
    enum ds_status s = g ? stage_upload(wl, g, dst, t->data, bytes, wl->bytes)
                         : wl->be->upload(wl->be, dst, t->data, bytes);
    if (s != DS_OK)
        return ds_error_set(s, "%s: uploading %s: %s", wl->label, name, ds_error_last());
    wl->bytes += ds_align256(bytes);
    *ptr_out = dst;
    // After each tensor (staged copies also report per chunk): the aligned total, so the last
    // tensor brings the bar to the arena size even when its own size is not a multiple of 256.
    if (wl->progress_fn) wl->progress_fn(wl->progress_user, wl->bytes, wl->total);
    return DS_OK;
}

enum ds_status ds_rope_upload(struct ds_backend *be, const struct ds_rope_spec *spec, int n_pos,
                              float *cos_dev, float *sin_dev) {
    struct ds_rope_table_config rc = {
        .kind = spec->yarn ? DS_ROPE_TABLE_YARN : DS_ROPE_TABLE_PLAIN,
        .head_dim = spec->head_dim,
        .theta = spec->theta,
        .factor = spec->factor,
        .beta_fast = spec->beta_fast,
        .beta_slow = spec->beta_slow,
        .original_max_pos = spec->original_max_pos,
        .truncate = spec->truncate,
        .attention_factor = spec->attention_factor,
    };
    size_t n = (size_t)n_pos * (size_t)(spec->head_dim / 2);
    float *host = malloc(2 * n * sizeof *host);
    if (!host) return ds_error_set(DS_ERR_NOMEM, "rope: out of memory for %d positions", n_pos);
    enum ds_status s = ds_rope_table_fill(&rc, n_pos, host, host + n);
    if (s == DS_OK) s = be->upload(be, cos_dev, host, n * sizeof *host);
    if (s == DS_OK) s = be->upload(be, sin_dev, host + n, n * sizeof *host);
    free(host);
    return s;
}

bool ds_wt_follows(const struct ds_wt *a, uint64_t n_a, const struct ds_wt *b) {
    const size_t es = a->e == DS_ELEM_BF16 ? 2 : 4;
    return a->p && b->p && a->e == b->e && (const char *)b->p == (const char *)a->p + n_a * es;
}

enum ds_status ds_wl_bind(struct ds_weight_loader *wl, struct ds_wt *w, const char *name,
                          uint64_t numel, bool optional) {
    return ds_wl_get(wl, name, DS_WL_FLOAT, numel, optional, &w->p, &w->e);
}

enum ds_status ds_op_matmul(struct ds_backend *be, enum ds_elem act, int T, int in, int out,
                            const void *x, const struct ds_wt *w, const struct ds_wt *bias,
                            const void *residual, void *y) {
    struct ds_matmul_args a = {
        .act = act,
        .w_dtype = w->e,
        .bias_dtype = bias ? bias->e : DS_ELEM_F32,
        .n_rows = T,
        .in_dim = in,
        .out_dim = out,
        .x = x,
        .w = w->p,
        .bias = bias ? bias->p : NULL,
        .residual = residual,
        .out = y,
    };
    return be->matmul(be, &a);
}

enum ds_status ds_op_rmsnorm(struct ds_backend *be, enum ds_elem act, int T, int dim, double eps,
                             const void *x, const struct ds_wt *w, void *y) {
    struct ds_rmsnorm_args a = {
        .act = act,
        .w_dtype = w->e,
        .n_rows = T,
        .dim = dim,
        .eps = (float)eps,
        .x = x,
        .w = w->p,
        .out = y,
    };
    return be->rmsnorm(be, &a);
}

enum ds_status ds_rows_check(const char *label, const struct ds_rows_limits *lim, int n_rows,
                             const int32_t *tokens, int n_seq, const struct ds_attn_seq *seqs,
                             int n_logit_rows, const int32_t *logit_rows, unsigned char *slot_used,
                             int32_t *pos_out) {
    if (!tokens || !seqs || (n_logit_rows > 0 && !logit_rows))
        return ds_error_set(DS_ERR_ARG, "%s: batch with a NULL array", label);
    if (n_rows < 1 || n_rows > lim->max_rows)
        return ds_error_set(DS_ERR_RANGE, "%s: batch of %d rows, plan allows 1..%d", label, n_rows,
                            lim->max_rows);
    if (n_seq < 1 || n_seq > lim->max_slots)
        return ds_error_set(DS_ERR_RANGE, "%s: batch of %d sequences, plan allows 1..%d", label,
                            n_seq, lim->max_slots);
    if (n_logit_rows < 0 || n_logit_rows > lim->max_logit_rows)
        return ds_error_set(DS_ERR_RANGE, "%s: %d logit rows, plan allows 0..%d", label,
                            n_logit_rows, lim->max_logit_rows);
    for (int t = 0; t < n_rows; t++) {
        if (tokens[t] < 0 || tokens[t] >= lim->vocab)
            return ds_error_set(DS_ERR_RANGE, "%s: row %d has token id %d outside 0..%d", label, t,
                                tokens[t], lim->vocab - 1);
        pos_out[t] = 0;
    }
    memset(slot_used, 0, (size_t)lim->max_slots);
    int next_row = 0;
    for (int i = 0; i < n_seq; i++) {
        const struct ds_attn_seq *q = &seqs[i];
        if (q->n_rows < 1 || q->row0 < next_row || q->row0 > n_rows - q->n_rows)
            return ds_error_set(DS_ERR_ARG,
                                "%s: sequence %d (rows %d..%d) overlaps another or lies outside "
                                "the %d rows",
                                label, i, q->row0, q->row0 + q->n_rows - 1, n_rows);
        if (q->slot < 0 || q->slot >= lim->max_slots || slot_used[q->slot])
            return ds_error_set(DS_ERR_ARG, "%s: sequence %d uses slot %d (%s)", label, i, q->slot,
                                q->slot >= 0 && q->slot < lim->max_slots
                                    ? "already used in this batch"
                                    : "outside the plan");
        if (q->pos0 < 0 || q->pos0 > lim->max_pos - q->n_rows)
            return ds_error_set(DS_ERR_RANGE,
                                "%s: sequence %d reaches position %d: context limit is %d "
                                "positions",
                                label, i, q->pos0 + q->n_rows - 1, lim->max_pos);
        slot_used[q->slot] = 1;
        for (int r = 0; r < q->n_rows; r++)
            pos_out[q->row0 + r] = q->pos0 + r;
        next_row = q->row0 + q->n_rows;
    }
    for (int i = 0; i < n_logit_rows; i++)
        if (logit_rows[i] < 0 || logit_rows[i] >= n_rows)
            return ds_error_set(DS_ERR_RANGE, "%s: logit row %d is %d, outside 0..%d", label, i,
                                logit_rows[i], n_rows - 1);
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Activation dtype

enum ds_status ds_act_resolve(struct ds_backend *be, int choice, const char *label,
                              enum ds_elem *act_out) {
    switch (choice) {
    case DS_ACT_DEFAULT:
        *act_out = be->act;
        return DS_OK;
    case DS_ACT_F32:
        *act_out = DS_ELEM_F32;
        return DS_OK;
    case DS_ACT_BF16:
        // A backend whose default is f32 is the reference, which implements f32 only.
        if (be->act == DS_ELEM_F32)
            return ds_error_set(DS_ERR_UNSUPPORTED,
                                "%s: bf16 activations asked, backend %s computes in f32 only",
                                label, be->name);
        *act_out = DS_ELEM_BF16;
        return DS_OK;
    default:
        return ds_error_set(DS_ERR_ARG, "%s: activation choice %d is not a ds_act_choice", label,
                            choice);
    }
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs

void ds_graph_init(struct ds_graph_cache *g, struct ds_backend *be) {
    memset(g, 0, sizeof *g);
    g->stream = ds_backend_cuda_stream(be);
}

static void graph_drop(struct ds_graph_entry *e) {
    if (e->exec) cudaGraphExecDestroy((cudaGraphExec_t)e->exec);
    e->exec = NULL;
}

void ds_graph_clear(struct ds_graph_cache *g) {
    for (int i = 0; i < g->n; i++)
        graph_drop(&g->e[i]);
    g->n = 0;
}

static struct ds_graph_entry *graph_find(struct ds_graph_cache *g,
                                         const long long key[DS_GRAPH_KEY]) {
    for (int i = 0; i < g->n; i++)
        if (!memcmp(g->e[i].key, key, sizeof g->e[i].key)) return &g->e[i];
    if (g->n < DS_GRAPH_MAX) {
        struct ds_graph_entry *e = &g->e[g->n++];
        memset(e, 0, sizeof *e);
        memcpy(e->key, key, sizeof e->key);
        return e;
    }
    int lru = 0;
    for (int i = 1; i < g->n; i++)
        if (g->e[i].used < g->e[lru].used) lru = i;
    struct ds_graph_entry *e = &g->e[lru];
    graph_drop(e);
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, sizeof e->key);
    return e;
}

// Captures ops(user) on the stream into e->exec. DS_OK with e->exec NULL when the runtime refused
// the capture (the ops then did not run: the caller runs them eagerly).
static enum ds_status graph_capture(struct ds_graph_cache *g, struct ds_graph_entry *e,
                                    enum ds_status (*ops)(void *), void *user) {
    cudaStream_t st = (cudaStream_t)g->stream;
    cudaError_t ce = cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "draftscope: CUDA graph capture unavailable (%s); running eagerly\n",
                cudaGetErrorString(ce));
        g->broken = true;
        return DS_OK;
    }
    enum ds_status s = ops(user);
    cudaGraph_t graph = NULL;
    ce = cudaStreamEndCapture(st, &graph);
    if (s != DS_OK) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        return s;
    }
    cudaGraphExec_t exec = NULL;
    if (ce == cudaSuccess) ce = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "draftscope: CUDA graph capture failed (%s); running eagerly\n",
                cudaGetErrorString(ce));
        g->broken = true;
        return DS_OK;
    }
    e->exec = exec;
    g->captures++;
    return DS_OK;
}

enum ds_status ds_graph_run(struct ds_graph_cache *g, const long long key[DS_GRAPH_KEY],
                            enum ds_status (*ops)(void *user), void *user) {
    if (!g->stream || !g->enabled || g->broken) return ops(user);
    struct ds_graph_entry *e = graph_find(g, key);
    e->used = ++g->clock;
    if (!e->exec && e->seen++ >= 1) {
        enum ds_status s = graph_capture(g, e, ops, user);
        if (s != DS_OK) return s;
    }
    if (!e->exec) return ops(user); // warm-up run, or the capture was refused
    cudaError_t ce = cudaGraphLaunch((cudaGraphExec_t)e->exec, (cudaStream_t)g->stream);
    if (ce != cudaSuccess)
        return ds_error_set(DS_ERR_IO, "cuda graph launch failed: %s", cudaGetErrorString(ce));
    g->launches++;
    return DS_OK;
}

enum ds_status ds_wl_check_head_dim(struct ds_backend *be, long long head_dim, const char *label) {
    const bool cuda = ds_backend_cuda_stream(be) != NULL;
    if (cuda && (head_dim > 128 || !ds_attention_cuda_head_dim_ok((int)head_dim)))
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "%s: head_dim %lld: the CUDA attention kernels are built for 16, 32, "
                            "64 and 128",
                            label, head_dim);
    return DS_OK;
}
