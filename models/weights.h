// models/weights.h (private to models/): the weight loader and the RoPE-table helper shared by
// the gpt-oss target (gptoss.c) and the EAGLE-3 draft (eagle3.c).
//
// Loading runs the model's own "bind every tensor" function twice over one loader:
//   pass 1 (measure)  every ds_wl_get only checks the tensor and adds its size to the plan;
//   pass 2 (load)     on a backend with map_host the mmapped bytes are used in place; otherwise one
//                     arena of the measured size is allocated and every tensor uploaded into it,
//                     with the progress callback called after each tensor.
// So the weight memory is known before anything is allocated, and it is one allocation.
#ifndef DS_MODELS_WEIGHTS_H
#define DS_MODELS_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/backend.h"
#include "ds/safetensors.h"
#include "ds/status.h"

struct ds_weight_loader {
    struct ds_backend *be;
    const ds_safetensors_t *st;
    const char *label; // the checkpoint directory, for messages
    bool loading;      // false: measure pass, true: load pass
    bool mapped;       // the backend maps host memory (no arena, no copies)
    void *arena;       // (bytes) the upload arena when !mapped, owned by the caller
    size_t bytes;      // measure: bytes planned so far; load: bytes placed so far
    size_t total;      // load pass: the arena size (for progress)
    size_t tensors;    // tensors bound
    // Upload progress (may be NULL): called after each uploaded tensor.
    void (*progress_fn)(void *user, uint64_t bytes_done, uint64_t bytes_total);
    void *progress_user;
};

// Starts a loader in the measure pass. The safetensors set must outlive the model on a mapping
// backend (the weights are its pages).
void ds_wl_init(struct ds_weight_loader *wl, struct ds_backend *be, const ds_safetensors_t *st,
                const char *label, void (*progress_fn)(void *, uint64_t, uint64_t),
                void *progress_user);

// Ends the measure pass: allocates the arena (when the backend cannot map host memory) and
// switches to the load pass. *arena_out is the arena to free with be->free (NULL when mapped).
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

// Element type of a safetensors dtype for the ops (BF16 / F32), DS_ELEM_COUNT otherwise.
enum ds_elem ds_elem_of_dtype(enum ds_dtype t);

// Rounds a byte count up to the 256-byte alignment every carved buffer keeps.
static inline size_t ds_align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

#endif // DS_MODELS_WEIGHTS_H
