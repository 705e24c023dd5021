// ds/synthetic.h: gpt-oss targets and EAGLE-3 drafts of real shapes with synthetic weights built
// from a seed on the backend itself (no checkpoint files), for performance work and for tests at
// real scale (`--synthetic-weights 20b|120b[:SEED[:LAYERS]]` or a config.json).
//
// Configs. The presets are the public config.json values of openai/gpt-oss-20b and -120b (spec
// gpt-oss.md §1: hidden 2880, 64/8 heads of 64, vocab 201,088, 24 layers × 32 experts or 36 × 128,
// top-4, intermediate 2880, YaRN ×32, window 128 on even layers, MXFP4 experts). LAYERS keeps only
// the first layers (a slice: every layer runs the same ops, so a 4-layer slice of 120b exercises
// all of them at a fraction of the memory). The draft is a SpecForge/lmsys-layout EAGLE-3 head of
// the target's width (spec eagle3.md §2.1-§2.2: intermediate 6·H, the target's heads, draft vocab
// 32,000 mapped by a d2t of evenly spread ids, aux ids {1, L/2−1, L−3} in output-of convention,
// which are the lmsys values [1,17,33] / [1,11,21]; small slices use {0, (L−1)/2, L−1}).
//
// Values. Tensor i of a model gets its own seed (a hash of the run seed and its name); element j
// is ds_fill_value(tensor seed, j, lo, hi) rounded to bf16, or a byte lo + hash % span (the seeded
// fills of ds/kernels_cuda.h, on the device; the CPU reference fills host memory with the same
// formula, so both backends get identical weights). Ranges keep every activation of order one
// through all layers:
//   linear weights  uniform ±sqrt(3 / fan_in)  (output rms = input rms)
//   norm gains      [0.8, 1.2];  biases ±0.05;  sinks [−1, 1];  embeddings ±1
//   MXFP4 codes     any byte (two E2M1 codes, rms 2.93 over the 16 codes)
//   MXFP4 scales    bytes 119..120 (2^−8 .. 2^−7): a 2880-wide expert row then has rms
//                   2.93 · 2^−7.5 · sqrt(2880) ≈ 0.9 on a unit-rms input, so experts neither
//                   vanish nor explode (the clamped SwiGLU bounds them further).
#ifndef DS_SYNTHETIC_H
#define DS_SYNTHETIC_H

#include <stdint.h>

#include "ds/backend.h"
#include "ds/config.h"
#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_SYNTHETIC_DRAFT_VOCAB 32000 // the SpecForge draft vocabulary (capped at the target's)

struct ds_synthetic_spec {
    char source[1024]; // "20b", "120b", or a config.json file / a directory holding one
    uint64_t seed;     // default 0; at most 2^63 - 1 (JSON has signed integers)
    int layers;        // keep the first `layers` layers; 0 = all of the config's
};

// Whether the spec names a preset ("20b", "120b") rather than a config file or directory.
bool ds_synthetic_is_preset(const struct ds_synthetic_spec *spec);

// Parses "SOURCE[:SEED[:LAYERS]]" (SOURCE a preset name or a path). DS_ERR_ARG naming the
// argument for an empty source or a bad number; a source that is neither a preset nor an existing
// path is reported when the config is read.
enum ds_status ds_synthetic_parse(const char *arg, struct ds_synthetic_spec *spec_out);

// The target config of a spec (preset values or the file, then the layer slice). DS_ERR_RANGE
// for LAYERS beyond the config's; the file's own errors otherwise.
enum ds_status ds_synthetic_target_config(const struct ds_synthetic_spec *spec,
                                          struct ds_target_config *cfg_out);

// The synthetic draft config for a target config (see above). DS_ERR_UNSUPPORTED for a target
// with fewer than 3 layers (three distinct aux boundaries are needed).
enum ds_status ds_synthetic_draft_config(const struct ds_target_config *target,
                                         struct ds_draft_config *cfg_out);

// The physical aux boundaries that draft reads (give them to the target's plan with
// ds_gptoss_plan_aux before creating the target).
enum ds_status ds_synthetic_aux_plan(const struct ds_target_config *target,
                                     struct ds_aux_plan *plan_out);

// Builds the target of `spec` on `be` (weights generated in place, one arena, the memory plan as
// for a checkpoint). progress may be NULL. *model_out is NULL on failure.
enum ds_status ds_synthetic_target_create(const struct ds_synthetic_spec *spec,
                                          struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                          const struct ds_load_progress *progress,
                                          ds_gptoss_t **model_out);

// Builds the synthetic draft for `target` (created by ds_synthetic_target_create or from a
// checkpoint) with weights from spec->seed (a stream distinct from the target's). The target's
// plan must capture ds_synthetic_aux_plan's boundaries for ds_chain / extend to be meaningful.
enum ds_status ds_synthetic_draft_create(const struct ds_synthetic_spec *spec,
                                         const ds_gptoss_t *target, struct ds_backend *be,
                                         const struct ds_eagle3_plan *plan,
                                         const struct ds_load_progress *progress,
                                         ds_eagle3_t **draft_out);

// The memory plans the two creates above would allocate (ds_gptoss_measure): nothing is
// generated or allocated. The draft is measured against the target's config and plan (its
// activation dtype follows the plan's), so both fit checks can run before the target exists.
enum ds_status ds_synthetic_target_measure(const struct ds_synthetic_spec *spec,
                                           struct ds_backend *be, const struct ds_gptoss_plan *plan,
                                           struct ds_gptoss_memory *out);
enum ds_status ds_synthetic_draft_measure(const struct ds_synthetic_spec *spec,
                                          const struct ds_target_config *target_cfg,
                                          const struct ds_gptoss_plan *target_plan,
                                          struct ds_backend *be, const struct ds_eagle3_plan *plan,
                                          struct ds_gptoss_memory *out);

#ifdef __cplusplus
}
#endif
#endif // DS_SYNTHETIC_H
