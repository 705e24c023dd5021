// models/weights.h (private to models/): the weight loader and the RoPE-table helper shared by
// the gpt-oss target (gptoss.c) and the EAGLE-3 draft (eagle3.c).
//
// Loading runs the model's own "bind every tensor" function twice over one loader:
//   pass 1 (measure)  every ds_wl_get only checks the tensor and adds its size to the plan;
//   pass 2 (load)     on a backend with map_host the mmapped bytes are used in place; otherwise one
//                     arena of the measured size is allocated and every tensor uploaded into it,
//                     with the progress callback called after each tensor.
// So the weight memory is known before anything is allocated, and it is one allocation.
//
// Two variants of the load pass:
// - On a CUDA backend the mmapped bytes are streamed through two pinned staging buffers
//   (DS_WL_STAGE_BYTES each): while chunk i is copied by DMA (cudaMemcpyAsync on the backend's
//   stream) chunk i+1 is read from the page cache into the other buffer. Progress is reported per
//   chunk. ds_wl_finish waits for the last copy and frees the buffers.
// - With a generator (ds_wl_init_gen: synthetic weights, no checkpoint) every tensor gets its
//   expected shape (BF16 for float tensors, U8 for MXFP4 blocks/scales) and is filled in place by
//   the generator; optional tensors are absent.
#ifndef DS_MODELS_WEIGHTS_H
#define DS_MODELS_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/backend.h"
#include "ds/safetensors.h"
#include "ds/status.h"

struct ds_weight_gen;
struct ds_wl_stage;

struct ds_weight_loader {
    struct ds_backend *be;
    const ds_safetensors_t *st;
    const char *label; // the checkpoint directory, for messages
    bool loading;      // false: measure pass, true: load pass
    bool mapped;       // the backend maps host memory (no copies but the misaligned tensors)
    void *arena;       // the upload arena (mapped: of the misaligned copies), owned by the caller
    size_t bytes;      // measure: bytes planned so far; load: bytes placed so far
    size_t total;      // load pass: the arena size (for progress)
    size_t tensors;    // tensors bound
    // Mapped: a tensor whose data is not aligned to its element size (a header of odd length) is
    // copied into the arena rather than read in place through a misaligned pointer.
    size_t copy_bytes; // measure: arena bytes of those copies
    size_t copy_at;    // load: arena bytes placed so far
    // Upload progress (may be NULL): called after each uploaded tensor (or staged chunk).
    void (*progress_fn)(void *user, uint64_t bytes_done, uint64_t bytes_total);
    void *progress_user;
    const struct ds_weight_gen *gen; // generator instead of st (synthetic weights), or NULL
    struct ds_wl_stage *stage;       // pinned staging buffers of the CUDA streaming path, or NULL
};

// A weight generator: fills one tensor of `numel` elements of `dtype` (DS_DTYPE_BF16 or
// DS_DTYPE_U8) at `dst`, memory of `be`. Used for synthetic weights (ds/synthetic.h).
struct ds_weight_gen {
    enum ds_status (*fill)(void *user, struct ds_backend *be, const char *name, enum ds_dtype dtype,
                           uint64_t numel, void *dst);
    void *user;
    const int64_t *d2t; // draft only: (draft vocab) offsets, or NULL for an identity map
};

#define DS_WL_STAGE_BYTES ((size_t)64 << 20)

// Starts a loader in the measure pass. The safetensors set must outlive the model on a mapping
// backend (the weights are its pages).
void ds_wl_init(struct ds_weight_loader *wl, struct ds_backend *be, const ds_safetensors_t *st,
                const char *label, void (*progress_fn)(void *, uint64_t, uint64_t),
                void *progress_user);

// Starts a loader over a generator instead of a checkpoint (always an arena, never mapped).
void ds_wl_init_gen(struct ds_weight_loader *wl, struct ds_backend *be,
                    const struct ds_weight_gen *gen, const char *label,
                    void (*progress_fn)(void *, uint64_t, uint64_t), void *progress_user);

// Ends the load pass: waits for the staged copies and frees the staging buffers, or, with a
// generator, waits for the backend (its fills may be queued on a stream). Safe to call more than
// once and after a failure.
enum ds_status ds_wl_finish(struct ds_weight_loader *wl);

// Ends the measure pass: allocates the arena (when the backend cannot map host memory, or for the
// copies of misaligned tensors when it can) and switches to the load pass. *arena_out is the arena
// to free with be->free (NULL when nothing needs one).
enum ds_status ds_wl_begin_load(struct ds_weight_loader *wl, void **arena_out);

// Binds one tensor: checks its dtype (one of `want`, a bitmask of 1u << enum ds_dtype) and its
// element count, then returns its device pointer (load pass) or a placeholder (measure pass) and
// its element type. Missing tensor, wrong dtype or count: DS_ERR_MISMATCH naming the checkpoint
// and the tensor. optional: a missing tensor gives *ptr_out = NULL and DS_OK.
enum ds_status ds_wl_get(struct ds_weight_loader *wl, const char *name, unsigned want,
                         uint64_t numel, bool optional, const void **ptr_out,
                         enum ds_elem *elem_out);

#define DS_WL_FLOAT ((1u << DS_DTYPE_BF16) | (1u << DS_DTYPE_F32))
#define DS_WL_U8 (1u << DS_DTYPE_U8)

// A bound weight tensor and its element type.
struct ds_wt {
    const void *p;
    enum ds_elem e;
};

// True when b starts right where a (n_a elements) ends and both share one dtype: the two
// matrices are then one matrix with their rows stacked, which a split-output matmul
// (ds_matmul_args.part_dim) streams in one launch. An uploading loader places tensors in bind
// order; a mapped file keeps the checkpoint's order.
bool ds_wt_follows(const struct ds_wt *a, uint64_t n_a, const struct ds_wt *b);

// Binds a float tensor (BF16 or F32) into *w (ds_wl_get with DS_WL_FLOAT).
enum ds_status ds_wl_bind(struct ds_weight_loader *wl, struct ds_wt *w, const char *name,
                          uint64_t numel, bool optional);

// y = x·Wᵀ [+ bias] [+ residual] over T rows through the backend (bias may be NULL).
enum ds_status ds_op_matmul(struct ds_backend *be, enum ds_elem act, int T, int in, int out,
                            const void *x, const struct ds_wt *w, const struct ds_wt *bias,
                            const void *residual, void *y);
// y = rmsnorm(x) · w over T rows of `dim`.
enum ds_status ds_op_rmsnorm(struct ds_backend *be, enum ds_elem act, int T, int dim, double eps,
                             const void *x, const struct ds_wt *w, void *y);

// The limits a packed batch is checked against on the host (the CUDA ops trust device tables).
struct ds_rows_limits {
    int max_rows, max_slots, max_logit_rows, max_pos, vocab;
};

// Checks a packed batch (rows, sequences, logit rows) and fills pos_out[t] with each row's
// position. slot_used is max_slots bytes of scratch. Messages start with `label`: a position past
// max_pos is DS_ERR_RANGE "context limit", bad ids DS_ERR_RANGE, bad tables DS_ERR_ARG.
enum ds_status ds_rows_check(const char *label, const struct ds_rows_limits *lim, int n_rows,
                             const int32_t *tokens, int n_seq, const struct ds_attn_seq *seqs,
                             int n_logit_rows, const int32_t *logit_rows, unsigned char *slot_used,
                             int32_t *pos_out);

// RoPE parameters as plain values, filled from either config struct (ds/config.h) and turned into
// the kernels' struct ds_rope_table_config by ds_rope_upload.
struct ds_rope_spec {
    bool yarn; // false: plain rotary
    int head_dim;
    double theta, factor, beta_fast, beta_slow, attention_factor;
    int original_max_pos;
    bool truncate;
};

// Builds the cos/sin tables for positions 0..n_pos-1 on the host (one temporary buffer) and
// uploads them into cos_dev / sin_dev, each (n_pos, head_dim/2) f32 device memory.
enum ds_status ds_rope_upload(struct ds_backend *be, const struct ds_rope_spec *spec, int n_pos,
                              float *cos_dev, float *sin_dev);

// ---- CUDA graphs of fixed-shape steps (gptoss.c, eagle3.c) ----
//
// A step is split into the small host → device table uploads (always eager) and the op sequence,
// which depends on the host only through a few integers (rows, sequences, logit rows, ...): the
// key. On a CUDA backend with graphs enabled, the op sequence of a key runs eagerly the first time
// (warm-up), is captured into a CUDA graph the second time and replayed from then on, reading the
// tables from the same device buffers. Other backends, or graphs disabled, always run eagerly.
// Least recently used graphs are dropped beyond DS_GRAPH_MAX keys. A capture that the runtime
// refuses turns graphs off for that cache (with one line on stderr) and runs eagerly.
#define DS_GRAPH_KEY 6
#define DS_GRAPH_MAX 48

struct ds_graph_entry {
    long long key[DS_GRAPH_KEY];
    int seen;           // times the key ran
    unsigned long used; // clock of the last use (LRU)
    void *exec;         // cudaGraphExec_t once captured
};

struct ds_graph_cache {
    void *stream; // the backend's cudaStream_t, NULL: no graphs possible
    bool enabled;
    bool broken; // a capture failed: eager from then on
    int n;
    unsigned long clock;
    long long launches, captures; // statistics (tests, bench)
    struct ds_graph_entry e[DS_GRAPH_MAX];
};

// Sets the cache up for `be` (graphs possible only on CUDA), disabled.
void ds_graph_init(struct ds_graph_cache *g, struct ds_backend *be);

// A head size the backend's attention cannot run, refused when the model is created: on CUDA
// only 16, 32, 64 and 128 are built (it failed at the first forward, after the whole load).
// DS_ERR_UNSUPPORTED naming the checkpoint (label).
enum ds_status ds_wl_check_head_dim(struct ds_backend *be, long long head_dim, const char *label);
// Destroys every captured graph.
void ds_graph_clear(struct ds_graph_cache *g);
// Runs ops(user) for `key` as described above.
enum ds_status ds_graph_run(struct ds_graph_cache *g, const long long key[DS_GRAPH_KEY],
                            enum ds_status (*ops)(void *user), void *user);

// Activation dtype of a plan choice against the backend's default; DS_ERR_UNSUPPORTED when a
// reference (f32-only) backend is asked for bf16. `label` names the model in messages.
enum ds_status ds_act_resolve(struct ds_backend *be, int choice, const char *label,
                              enum ds_elem *act_out);

// ---- constructors over a weight generator (models/synthetic.c) ----

struct ds_gptoss;
struct ds_eagle3;
struct ds_target_config;
struct ds_draft_config;
struct ds_gptoss_plan;
struct ds_eagle3_plan;
struct ds_load_progress;

// ds_gptoss_create_from with generated weights instead of a checkpoint (no tensor-table check:
// the generator makes every tensor in the shape the config implies).
enum ds_status ds_gptoss_create_gen(const struct ds_target_config *cfg,
                                    const struct ds_weight_gen *gen, const char *label,
                                    struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                    const struct ds_load_progress *progress,
                                    struct ds_gptoss **model_out);
// ds_eagle3_create with a config and generated weights (SpecForge names, the target's embedding,
// its own draft-vocabulary lm_head, gen->d2t as the vocabulary map).
enum ds_status ds_eagle3_create_gen(const struct ds_draft_config *cfg,
                                    const struct ds_weight_gen *gen, const char *label,
                                    const struct ds_gptoss *target, struct ds_backend *be,
                                    const struct ds_eagle3_plan *plan,
                                    const struct ds_load_progress *progress,
                                    struct ds_eagle3 **draft_out);

// The memory plans those two would allocate, without allocating (ds_gptoss_measure,
// ds_eagle3_measure).
struct ds_gptoss_memory;
enum ds_status ds_gptoss_measure_gen(const struct ds_target_config *cfg,
                                     const struct ds_weight_gen *gen, const char *label,
                                     struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                     struct ds_gptoss_memory *out);
enum ds_status ds_eagle3_measure_gen(const struct ds_draft_config *cfg,
                                     const struct ds_weight_gen *gen, const char *label,
                                     const struct ds_target_config *target_cfg,
                                     const struct ds_gptoss_plan *target_plan,
                                     struct ds_backend *be, const struct ds_eagle3_plan *plan,
                                     struct ds_gptoss_memory *out);

// Element type of a safetensors dtype for the ops (BF16 / F32), DS_ELEM_COUNT otherwise.
enum ds_elem ds_elem_of_dtype(enum ds_dtype t);

// Rounds a byte count up to the 256-byte alignment every carved buffer keeps.
static inline size_t ds_align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

#endif // DS_MODELS_WEIGHTS_H
