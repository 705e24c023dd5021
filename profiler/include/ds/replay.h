// ds/replay.h: replay of a dataset with continuous batching (DESIGN §6), writing the run file.
//
// At concurrency B, B sequences are in flight: a finished one is replaced by the next request
// (a conversation turn), newcomers are prefilled in chunks (ds_spec_prefill), then every live
// sequence takes one speculative step (ds_spec_step) per iteration. --batch-sizes sweeps several
// B in one run and one file, each B replaying the same requests in the same order; with the
// counter-based generator keyed by the request's index in the selection (every selected turn,
// in order; not its dataset record: another -N, --shuffle or --turns draws differently) and
// batch-invariant numerics, a request's records are the same at every B (only step ids, request
// ids and batch sizes differ).
//
// Requests: every turn of the selected conversations (ds/dataset.h), rendered once with harmony.
// A question dataset records no replies: a later turn is rendered when the earlier turn of the
// same B has finished, with that turn's final-channel text as the assistant reply (empty when it
// produced none), and is admitted only then.
//
// Stops: <|return|>, <|call|>, <|endoftext|> (the stop token is counted as generated),
// max-new-tokens, the context limit (ds_spec_max_pos), non-finite verify logits ("error"). A prompt
// that does not fit the context limit (len >= max_pos) is skipped with one line on `log` and
// counted, never recorded.
//
// Records (ds/record.h): per (step, sequence) a /steps row and per drafted token a /drafts row,
// appended after each step; a /requests row when a request ends. The recorder is flushed about
// once a second. Resume: requests whose (batch_size, dataset_index, turn) are in the resume
// info's done list are skipped (a question conversation whose later turn must run reruns its
// done earlier turns without recording them, to regenerate the reply).
//
// Interruption: after every step the loop checks ds_recorder_stop_requested(); when set it
// returns DS_ERR_INTERRUPTED with everything appended (the caller closes the recorder).
// Allocation happens at create and at request boundaries (rendering a dependent turn, interning a
// new category), never inside a step.
#ifndef DS_REPLAY_H
#define DS_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ds/dataset.h"
#include "ds/harmony.h"
#include "ds/progress.h"
#include "ds/record.h"
#include "ds/spec.h"
#include "ds/status.h"
#include "ds/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

// One request of the run (a conversation turn), rendered once for all batch sizes.
struct ds_replay_request {
    size_t request_index;     // dataset request index (conversation-major): the rng key
    size_t conversation;      // index into the dataset's selection
    uint32_t dataset_index;   // record index in the dataset file
    uint16_t turn;            // 0-based
    const char *category;     // borrowed from the dataset ("" if none)
    const char *conv_id;      // borrowed from the dataset
    struct ds_token_vec prompt; // rendered prompt (empty while needs_reply)
    int est_len;              // prompt length, or an estimate when needs_reply
    bool needs_reply;         // rendered only when the previous turn has run
};

// The requests of a dataset, rendered (ds_replay_prepare).
struct ds_replay_work {
    struct ds_replay_request *req; // n entries, req[i].request_index == i
    size_t n;
    size_t max_messages; // most messages of any request (renderer scratch)
    int max_est_len;     // longest (estimated) prompt
};

// Renders every request of `ds` with `sys` (NULL: harmony defaults). Turns whose messages hold
// unrecorded replies get an estimate of their length: rendered with empty replies plus
// `reply_estimate` tokens per missing reply. Errors pass through from rendering (the message
// names the file and record); DS_ERR_NOMEM. *work is zeroed first; free with ds_replay_work_free.
enum ds_status ds_replay_prepare(const ds_dataset_t *ds, ds_harmony_t *h,
                                 const struct ds_harmony_system *sys, int reply_estimate,
                                 struct ds_replay_work *work);
void ds_replay_work_free(struct ds_replay_work *work);

// Called when a request ends (tests use it to see the generated tokens). tokens: the generated
// ids, stop token included.
typedef void (*ds_replay_finish_fn)(void *user, const struct ds_replay_request *req,
                                    uint32_t batch_size, const int32_t *tokens, size_t n,
                                    enum ds_rec_stop stop);

struct ds_replay_config {
    const uint32_t *batch_sizes; // the sweep, each <= ds_spec_max_slots
    size_t n_batch_sizes;
    int max_new_tokens;          // >= 1
    const struct ds_harmony_system *sys; // for dependent turns (NULL: defaults)
    FILE *log;                   // one-line notices (skipped prompts); NULL: none
    struct ds_progress *progress; // NULL: none
    ds_replay_finish_fn on_finish; // NULL: none
    void *user;
    ds_trace_t *trace; // phases of every prefill/step, collected after each step into the steps
                       // rows' phase times (NULL or level off: times 0); rec must be its recorder
};

// What a replay did (all batch sizes).
struct ds_replay_stats {
    uint64_t requests;      // requests finished and recorded
    uint64_t skipped;       // requests skipped: prompt beyond the context limit
    uint64_t errors;        // recorded requests that ended with error (non-finite logits)
    uint64_t nonfinite_q;   // recorded drafts without a finite draft probability (q_draft)
    uint64_t resumed;       // requests skipped because the file already holds them
    uint64_t tokens;        // generated tokens
    uint64_t steps;         // (step, sequence) rows
    uint64_t drafted_steps; // of them, rows that drafted and verified (the acceptance length's)
    uint64_t accepted;      // accepted drafts
    uint64_t next_step;     // one past the last step id used
};

// Replays `work` at every batch size. rec receives the records (never NULL); resume may be NULL
// (a fresh file: step and request ids start at 0). The spec engine's target and draft do the
// work; h labels channels and knows the stop tokens; tok decodes replies for dependent turns.
// Errors: DS_ERR_INTERRUPTED (SIGINT/SIGTERM; records appended so far are kept), DS_ERR_IO from
// the recorder, model errors; stats are filled in every case.
enum ds_status ds_replay_run(ds_spec_t *spec, ds_harmony_t *h, const ds_tokenizer_t *tok,
                             const ds_dataset_t *ds, struct ds_replay_work *work,
                             const struct ds_replay_config *cfg, ds_recorder_t *rec,
                             const struct ds_resume_info *resume, struct ds_replay_stats *stats);

#ifdef __cplusplus
}
#endif
#endif // DS_REPLAY_H
