// ds/gptoss.h: the gpt-oss target forward pass over a backend table.
//
// Math: spec gpt-oss.md §4 (docs/models.md walks through it). Per step the model runs one
// straight-line pass over a packed batch of rows from several sequences:
//   embed → per layer l: x += o_proj(attn(rope(qkv(rmsnorm(x)))))  (sinks; window on the layers
//   whose layer_types entry is sliding_attention)
//                        x += moe(router(rmsnorm(x)))              (top-k then softmax, MXFP4)
//   → final rmsnorm → gather the rows that want logits → lm_head.
// Aux states (the EAGLE-3 inputs) are captured by physical boundary b: the residual stream after
// b layers (b = 0 the embeddings, b = N after the last layer, before the final norm).
//
// Memory is planned once at create (struct ds_gptoss_plan): weights, the KV caches of every layer
// (slot × position × kv head × head dim, the backend's activation dtype), activations for the
// largest step, RoPE tables up to the context limit, the MoE workspace, logits and aux outputs.
// ds_gptoss_forward allocates nothing.
//
// Backends: the code never asks which backend runs it. Activations (and the KV cache) use
// backend->act (fp32 on the CPU reference, bf16 on CUDA). Weights stay bf16 as stored: on a
// backend with map_host they are used in place from the mmapped checkpoint, otherwise uploaded
// once into one arena, reporting progress.
//
// Thread-safety: a model is used by one thread at a time (like its backend).
#ifndef DS_GPTOSS_H
#define DS_GPTOSS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/backend.h"
#include "ds/config.h"
#include "ds/kernel_args.h"
#include "ds/safetensors.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_GPTOSS_MAX_AUX 3 // aux boundaries captured per step (EAGLE-3 uses 3)

typedef struct ds_gptoss ds_gptoss_t;

// Progress of a weight upload (called after each tensor; never on a mapping backend, where the
// weights are not copied). bytes_done reaches bytes_total at the end.
struct ds_load_progress {
    void (*fn)(void *user, uint64_t bytes_done, uint64_t bytes_total);
    void *user;
};

// Activation dtype of a model (and of its KV cache): the backend's default (f32 on the CPU
// reference, bf16 on CUDA) or an override. The CUDA ops also take f32 activations, so DS_ACT_F32
// on CUDA runs the same math as the CPU reference on identical inputs (the GPU model tests);
// DS_ACT_BF16 on the f32-only reference backend is DS_ERR_UNSUPPORTED at create.
enum ds_act_choice { DS_ACT_DEFAULT = 0, DS_ACT_F32, DS_ACT_BF16 };

// What to plan for. Every field is checked at create (DS_ERR_ARG / DS_ERR_RANGE).
struct ds_gptoss_plan {
    int max_slots;      // sequences in flight (KV-cache slots), >= 1
    int max_pos;        // context positions per slot, 1 .. config max_position_embeddings
    int max_rows;       // rows per forward (all sequences of a step together), >= 1
    int max_logit_rows; // rows that may ask for logits per step; 0 = max_rows
    int n_aux;          // aux boundaries to capture, 0 .. DS_GPTOSS_MAX_AUX
    int aux_boundaries[DS_GPTOSS_MAX_AUX]; // ascending, each in 0 .. num_hidden_layers
    enum ds_act_choice act;                // activation dtype (default: the backend's)
    // CUDA graphs (CUDA backend only; ignored elsewhere): the op sequence of a step shape (rows,
    // sequences, logit rows) runs eagerly once, is captured the second time and replayed after,
    // the per-step tables uploaded into the same device buffers. Bitwise the same results as
    // eager launches (tests/gpu_invariance.c). false = always eager (debugging).
    bool graphs;
};

// The memory plan in bytes (device memory on CUDA, host memory on the CPU reference).
struct ds_gptoss_memory {
    size_t weights;     // mapped in place (CPU) or uploaded (CUDA)
    size_t kv;          // every layer's K and V cache
    size_t activations; // step buffers, RoPE tables, MoE workspace, logits, aux, expert ids
};

// One forward step. Rows of all sequences are packed: sequence i owns rows seqs[i].row0 ..
// row0 + n_rows - 1 at positions pos0 .. pos0 + n_rows - 1 of KV slot seqs[i].slot (sorted by
// row0, no overlap, distinct slots). A prefill chunk, a decode row and a K+1-row verify are all
// sequences with different n_rows. Every array is host memory; the model uploads it.
struct ds_batch {
    int n_rows;                     // T, 1 .. plan.max_rows
    const int32_t *tokens;          // (T) token id per row
    int n_seq;                      // sequences, 1 .. min(T, plan.max_slots)
    const struct ds_attn_seq *seqs; // (n_seq)
    int n_logit_rows;               // rows whose logits are computed, 0 .. plan.max_logit_rows
    const int32_t *logit_rows;      // (n_logit_rows) packed row indices; logits row i is row
                                    // logit_rows[i]
};

// Loads DIR (config.json + safetensors, sharded or not), refuses what ds_gptoss_check_config
// refuses, checks the tensor table against the config (every problem is reported; the first is
// in ds_error_last()), and plans memory.
// progress may be NULL. *model_out is NULL on failure. The backend must outlive the model.
enum ds_status ds_gptoss_create(const char *dir, struct ds_backend *be,
                                const struct ds_gptoss_plan *plan,
                                const struct ds_load_progress *progress, ds_gptoss_t **model_out);

// The same over an already opened checkpoint: cfg and st are borrowed and must outlive the model
// (the weights may be the mmapped pages of st). `label` names the checkpoint in messages.
enum ds_status ds_gptoss_create_from(const struct ds_target_config *cfg, const ds_safetensors_t *st,
                                     const char *label, struct ds_backend *be,
                                     const struct ds_gptoss_plan *plan,
                                     const struct ds_load_progress *progress,
                                     ds_gptoss_t **model_out);

// The memory plan ds_gptoss_create would allocate for DIR on `be` under `plan` (the same
// checks, in the same order, and the same sizes), without allocating or loading anything: so a
// command can check that the target and the draft both fit before either loads.
enum ds_status ds_gptoss_measure(const char *dir, struct ds_backend *be,
                                 const struct ds_gptoss_plan *plan, struct ds_gptoss_memory *out);

struct ds_problems; // ds/checkpoint.h

// The config values the constructors refuse whatever the backend: experts other than MXFP4, an
// odd head_dim or one above DS_MAX_HEAD_DIM, hidden or intermediate sizes that are not multiples
// of 32, more than DS_MAX_TOPK experts per token, dimensions beyond int32 indexing, RoPE other
// than default or yarn. `draftscope inspect` runs the same function, so it reports exactly what a
// load would refuse. One line each in *problems, naming `label` (the config file). DS_OK when
// none, else DS_ERR_UNSUPPORTED with the lines as the message (ds_problems_error). The backend's
// own limit (the head dims the CUDA attention is built for) is checked at create only.
enum ds_status ds_gptoss_check_config(const struct ds_target_config *cfg, const char *label,
                                      struct ds_problems *problems);

// What ds_gptoss_create refuses of DIR without a backend or a plan, in the same order: its
// config.json (parse, ds_gptoss_check_config), then the tensor table against it. Reads the
// tensor headers only, so commands call it before any heavy work; the message is the first
// problem and how many more there are. *cfg_out is the parsed config.
enum ds_status ds_gptoss_check_dir(const char *dir, struct ds_target_config *cfg_out);

// Frees every buffer (and the checkpoint when create opened it). NULL is a no-op.
void ds_gptoss_release(ds_gptoss_t *model);

// Runs one step. Checks the batch against the plan (DS_ERR_ARG / DS_ERR_RANGE naming the row or
// sequence: a position at or beyond plan.max_pos is "context limit"; a token outside the
// vocabulary is DS_ERR_RANGE). On success the logits, aux states, final hidden states and router
// expert ids of this step are in the device buffers below until the next forward.
enum ds_status ds_gptoss_forward(ds_gptoss_t *model, const struct ds_batch *batch);

// ---- results of the last forward (device buffers of the model's backend) ----

// (n_logit_rows, V) in ds_gptoss_act(model): lm_head outputs of the rows asked for.
const void *ds_gptoss_logits(const ds_gptoss_t *model);
// (T, n_aux · H) act: the captured boundaries concatenated in ascending order, [low | mid | high].
const void *ds_gptoss_aux(const ds_gptoss_t *model);
// (T, H) act: the final post-norm hidden state of every row (what a no-aux EAGLE head is fed).
const void *ds_gptoss_final_hidden(const ds_gptoss_t *model);
// (L, plan.max_rows, k) int32: layer l's router choices for row t at (l·max_rows + t)·k, best
// first. Only the first T rows of each layer block belong to the last step.
const int32_t *ds_gptoss_expert_ids(const ds_gptoss_t *model);

// Download helpers (wait for the step). Logits and hidden states are converted to float.
// rows: how many leading rows to copy (<= the last step's count, else DS_ERR_RANGE).
enum ds_status ds_gptoss_download_logits(ds_gptoss_t *model, int rows, float *host_out);
enum ds_status ds_gptoss_download_aux(ds_gptoss_t *model, int rows, float *host_out);
enum ds_status ds_gptoss_download_expert_ids(ds_gptoss_t *model, int32_t *host_out); // (L, T, k)

// ---- shape, plan and shared tensors ----

const struct ds_target_config *ds_gptoss_config(const ds_gptoss_t *model);
const struct ds_gptoss_plan *ds_gptoss_plan_of(const ds_gptoss_t *model);
void ds_gptoss_memory_plan(const ds_gptoss_t *model, struct ds_gptoss_memory *out);
struct ds_backend *ds_gptoss_backend(const ds_gptoss_t *model);
enum ds_elem ds_gptoss_act(const ds_gptoss_t *model);
int ds_gptoss_last_rows(const ds_gptoss_t *model);       // T of the last forward
int ds_gptoss_last_logit_rows(const ds_gptoss_t *model); // n_logit_rows of the last forward

// The embedding table and the lm_head (device pointers, (V, H), *dtype_out their dtype), which
// an EAGLE-3 draft borrows.
const void *ds_gptoss_embed_table(const ds_gptoss_t *model, enum ds_elem *dtype_out);
const void *ds_gptoss_lm_head(const ds_gptoss_t *model, enum ds_elem *dtype_out);

// Turns CUDA graphs on or off after create (see ds_gptoss_plan.graphs); turning them off drops
// the captured graphs. No-op on backends without graphs.
void ds_gptoss_set_graphs(ds_gptoss_t *model, bool on);
// Graphs captured and graph launches so far (both 0 when graphs never ran). Out-params may be NULL.
void ds_gptoss_graph_stats(const ds_gptoss_t *model, long long *captures_out,
                           long long *launches_out);

// Sets every KV-cache entry to zero (a defined state for benchmarks that start at a position
// without a prefill). Queued on the backend like an op.
enum ds_status ds_gptoss_clear_kv(ds_gptoss_t *model);

// Converts n elements of dtype `src_elem` (host memory, a downloaded act buffer) to float.
void ds_act_to_float(enum ds_elem src_elem, const void *src, size_t n, float *out);

#ifdef __cplusplus
}
#endif
#endif // DS_GPTOSS_H
