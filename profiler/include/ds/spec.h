// ds/spec.h: one speculative step over the live batch (DESIGN §5, eagle3.md §6, §7, §11).
//
// Per step, for every live sequence (C tokens in the target cache, the emitted token b at
// position C not yet in any cache):
//   1. draft extend over the rows committed last step (positions C-n..C-1, fed by the target's
//      aux states of those positions, staged right after the target pass that made them; input
//      tokens = the committed tokens one position later, ending with b); its last row gives d_1;
//   2. K-1 draft steps on the draft's own hidden state: d_{j+1} from the row of d_j at C+j-1;
//   3. one batched target verify over [b, d_1..d_K] at positions C..C+K;
//   4. the accept rule (below); emitted = accepted drafts + one correction/bonus token;
//   5. commit: C' = C + a + 1; the verify's aux states of rows 0..a are staged for the next
//      extend (so a prefill of newcomers between two steps cannot overwrite them).
//
// Accept rules (p, q: target and draft distributions after the run's temperature and top-p;
// q over the draft vocabulary, mapped into target ids through d2t):
//   greedy       d_i = argmax of the draft; accept while d_i == target argmax of the row before;
//                emit the target argmax at the first mismatch (or the bonus after K).
//   target-only  d_i = argmax of the draft (a point mass); accept with probability p(d_i);
//                on rejection sample from p with d_i removed; bonus after K from p.
//   rejection    d_i ~ q; accept with probability min(1, p(d_i)/q(d_i)); on rejection sample
//                from (p - q)+ normalised; bonus after K from p.
// A greedy run records p and q at temperature 1 (so expected acceptance keeps its meaning).
//
// Randomness: every draw is ds_rng_uniform(seed, key, position, lane) (ds/rng.h) with key the
// sequence's request key (its dataset request index, not a batch-dependent id) and position the
// absolute position the draw decides: the draft sample of d_i (lane DRAFT) and its accept coin
// (ACCEPT) at C+i, the correction token at C+i (RESIDUAL), the bonus at C+K+1 and the first token
// after a prompt of n tokens at n (SAMPLE). No draw depends on the batch a sequence sits in.
//
// Per-token statistics are computed on the backend where the logits live (softmax, argmax, top-2,
// entropy, overlap, element gathers); only per-row results come back, plus one probability row
// per sequence and step when a sampling rule has to sample from it.
//
// Context limit: a step drafts k = min(K, max_pos - 2 - C) tokens (fewer near the limit) so that
// every token it can emit sits at a position < max_pos; a sequence with C > max_pos - 2 cannot
// step (the caller stops it: "context_limit"), which is where plain decoding stops too.
//
// Memory: ds_spec_plan sizes the target and draft plans for max_slots sequences (rows per step =
// max(slots·(K+1), prefill chunk)); ds_spec_create allocates every buffer once; prefill and step
// allocate nothing. One thread at a time.
#ifndef DS_SPEC_H
#define DS_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/eagle3.h"
#include "ds/gptoss.h"
#include "ds/harmony.h"
#include "ds/record.h"
#include "ds/status.h"
#include "ds/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_SPEC_MAX_K 16 // draft tokens per step at most (also DS_CHAIN_MAX_K)

enum ds_spec_rule {
    DS_SPEC_GREEDY = 0,
    DS_SPEC_TARGET_ONLY = 1,
    DS_SPEC_REJECTION = 2,
    DS_SPEC_RULE_COUNT
};

// "greedy", "target-only", "rejection"; NULL for an invalid value.
const char *ds_spec_rule_name(enum ds_spec_rule r);
// Parses a rule name. DS_ERR_ARG (naming the value and listing the valid ones) otherwise.
enum ds_status ds_spec_rule_parse(const char *s, enum ds_spec_rule *out);

// Temperatures the sampling rules take. Below the minimum logits / T overflows fp32 (a float
// temperature of 1e-38 turned softmax into NaN); every T below ~1e-3 samples the argmax anyway.
#define DS_SPEC_TEMPERATURE_MIN 1e-6f // compared as the float a temperature is kept as
#define DS_SPEC_TEMPERATURE_MAX 1e6f

#define DS_SPEC_MAX_PAD_SIZES 64 // --pad-to-graph-sizes entries at most

struct ds_spec_config {
    enum ds_spec_rule rule;
    int k;             // draft tokens per step, 1..DS_SPEC_MAX_K
    float temperature; // [DS_SPEC_TEMPERATURE_MIN, _MAX]; the sampling rules sample at it, greedy
                       // records at 1 regardless
    float top_p;       // (0, 1]; 1 = off
    uint64_t seed;
    int prefill_chunk; // rows per prefill forward, >= 1
    // Verify padding, as CUDA-graph engines pad a batch to a captured size (DESIGN §8): a verify
    // of R rows runs as the smallest size >= R (R itself beyond the largest), the extra rows
    // dummy sequences in scratch KV slots whose results nobody reads. n_pad_sizes 0: none.
    // Ascending, 1..65535.
    int n_pad_sizes;
    int32_t pad_sizes[DS_SPEC_MAX_PAD_SIZES];
};

// Checks a config (DS_ERR_ARG / DS_ERR_RANGE with a message naming the field).
enum ds_status ds_spec_config_check(const struct ds_spec_config *cfg);

// Fills the row counts of both plans for max_slots sequences and max_pos positions (slots,
// positions, rows, logit rows; the caller adds the aux boundaries and draft options). With verify
// padding the target plan has ds_spec_pad_slots more slots (the dummy rows' scratch) and rows for
// the padded verify.
void ds_spec_plan(const struct ds_spec_config *cfg, int max_slots, int max_pos,
                  struct ds_gptoss_plan *target_plan, struct ds_eagle3_plan *draft_plan);

// What ds_spec_create will refuse of a target config and a plan for max_slots sequences, checked
// before any model is loaded: more experts or layers than the records hold, and max_slots·(K+1)
// verify rows × the vocabulary beyond the int32 element ids of the per-row gathers.
enum ds_status ds_spec_plan_check(const struct ds_spec_config *cfg, int max_slots,
                                  const struct ds_target_config *tc);

// Scratch KV slots the dummy rows of a padded verify take at max_pos positions each (0 without
// padding), and the rows a verify of `rows` rows runs as.
int ds_spec_pad_slots(const struct ds_spec_config *cfg, int max_pos);
int ds_spec_padded_rows(const struct ds_spec_config *cfg, int rows);

// One live sequence between steps: plain data owned by the caller (the replay), one per slot.
struct ds_spec_seq {
    int32_t slot;      // KV slot in the target and the draft, 0 .. max_slots-1
    uint64_t key;      // rng request key (ds/rng.h `request`)
    int32_t committed; // C: tokens whose target KV exists (positions 0..C-1)
    int32_t bonus;     // the emitted token at position C, not yet in any cache
    int32_t n_ext;     // staged rows for the next extend: positions C-n_ext .. C-1
    int32_t ext_tokens[DS_SPEC_MAX_K + 1]; // their input tokens (positions C-n_ext+1 .. C)
    uint8_t nonfinite; // set by prefill when the prompt's last logits held NaN/Inf: the
                       // argmax value is not finite, or p at the argmax is not a positive
                       // number (one NaN logit makes every p NaN; the argmax skips it)
    // Harmony channel tracker after every committed token, b included (the caller feeds it; the
    // step labels drafts on a copy). tracker.h == NULL labels every draft "other".
    struct ds_channel_tracker tracker;
};

// What one step did for one sequence. The draft rows carry every field of DESIGN §5 except the
// run's ids (step, request, batch_size), which the caller fills.
struct ds_spec_result {
    int drafted;                           // k of this sequence (K, fewer near the limit)
    int accepted;                          // a
    int n_emitted;                         // a + 1 (0 when nonfinite)
    int32_t emitted[DS_SPEC_MAX_K + 1];    // d_1..d_a, then the correction/bonus token
    uint8_t nonfinite;                     // the verify logits of this sequence held NaN/Inf
    uint32_t context_len;                  // C before the step
    uint16_t distinct_experts[DS_RECORD_MAX_LAYERS]; // per target layer, over its verify rows
    struct ds_rec_draft drafts[DS_SPEC_MAX_K];
};

typedef struct ds_spec ds_spec_t;

// A step engine over a target and its draft (created with plans from ds_spec_plan or larger; the
// target must capture the draft's aux boundaries). Both must outlive the engine. Errors: DS_ERR_ARG
// (bad config), DS_ERR_MISMATCH (plans too small, aux width), DS_ERR_NOMEM.
enum ds_status ds_spec_create(ds_gptoss_t *target, ds_eagle3_t *draft,
                              const struct ds_spec_config *cfg, ds_spec_t **spec_out);
void ds_spec_release(ds_spec_t *sp); // NULL is a no-op

// Bytes the engine itself allocated on the device (probability rows, staging, outputs).
size_t ds_spec_device_bytes(const ds_spec_t *sp);
// Slots and positions of the plans (the context limit is max_pos).
int ds_spec_max_slots(const ds_spec_t *sp);
int ds_spec_max_pos(const ds_spec_t *sp);

// Tracing (ds/trace.h): the next prefill and step bracket their phases (prefill; draft_extend,
// draft_step 1..K-1, verify, sample, accept) with ds_trace_phase_begin/end under step id `step`.
// trace NULL: no phases. The engine never collects; the caller does, between steps.
void ds_spec_set_trace(ds_spec_t *sp, ds_trace_t *trace, uint64_t step);

// Prefills newcomers: seqs[i] (slot and key set, distinct slots) gets prompts[i][0..lens[i]) in
// forwards of at most prefill_chunk rows; the draft KV of every prompt position but the last is
// written on the way (input = the next prompt token); the first token (argmax, or sampled at
// position lens[i]) becomes the bonus, and the last row is staged for the first extend. Sets
// committed, bonus, n_ext, ext_tokens, nonfinite; leaves tracker alone. A prompt must satisfy
// 1 <= len <= max_pos - 1 (DS_ERR_RANGE otherwise).
enum ds_status ds_spec_prefill(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                               const int32_t *const *prompts, const int *lens);

// One step over n live sequences (distinct slots, each with committed <= max_pos - 2; prefilled
// or stepped before). Updates every sequence (except a nonfinite one, left as it was) and fills
// results[0..n). Errors from the models pass through; DS_ERR_RANGE for a sequence at the limit.
enum ds_status ds_spec_step(ds_spec_t *sp, int n, struct ds_spec_seq *const *seqs,
                            struct ds_spec_result *results);

// ---- the accept rules as pure functions (host memory; tests drive them on tiny vocabularies) ----

// Inverse-CDF sample from the unnormalised weights w[0..n) (negatives count as 0) with u in
// [0, 1): the first index whose running sum exceeds u·Σw. Returns -1 when Σw is 0.
int32_t ds_spec_sample(const float *w, int n, double u);

// target-only at one position: accept d with probability p[d] (u_accept < p[d]); else sample
// from p with d removed (u_resample). *accepted_out = 1/0; *token_out = d or the correction.
// p has V entries summing to 1. When p without d has no mass, p itself is sampled.
void ds_spec_accept_target_only(const float *p, int V, int32_t d, double u_accept,
                                double u_resample, int *accepted_out, int32_t *token_out);

// rejection (Leviathan) at one position: d ~ q was drafted; accept with probability
// min(1, p[d]/q_d) (u_accept·q_d < p[d]); else sample from (p - q)+ (u_resample). q is over the
// draft vocabulary: q[i] is the probability of target id map[i] (map NULL: identity, Dv == V);
// q_d = q of d. When the residual has no mass (only by rounding), p itself is sampled.
// inv_map (V entries: the draft index of a target id or -1; NULL with map NULL) avoids a search.
void ds_spec_accept_rejection(const float *p, int V, const float *q, int Dv,
                              const int32_t *inv_map, int32_t d, float q_d, double u_accept,
                              double u_resample, int *accepted_out, int32_t *token_out);

#ifdef __cplusplus
}
#endif
#endif // DS_SPEC_H
