// ds/summary.h: the acceptance metrics of a run file (docs/metrics.md), computed in C.
//
// ds_summary_compute reads a run file (ds/record.h, docs/hdf5-schema.md) read-only and sums, per
// group, the counts every metric of docs/metrics.md is a ratio of. The metric functions below turn
// one group's counts into numbers; `draftscope summary` (cmd_summary.c) prints them as text or
// JSON, and the Python package `draftscope` computes the same numbers from the same rows.
//
// What is read: /requests, /steps, /drafts, /sessions, the root attributes and the /strings rows
// that name categories. Rows of /steps and /drafts whose request has no /requests row belong to a
// request that is still running (a live file) or that a crash cut short; they are dropped and
// counted (dropped_steps, dropped_drafts), as the schema document prescribes.
//
// Reading never modifies the file: it is opened H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, so a file
// still being written and a file whose writer died (its "open for write" marks still set) are both
// read as they are. Tables are read in blocks of DS_SUMMARY_BLOCK_ROWS rows (memory stays bounded
// whatever the run's length); only the columns the metrics need are read.
//
// Grouping keys (enum ds_summary_by). "Request-level" keys are properties of a request (from its
// /requests row), so steps, drafts and requests all fall into groups; "row-level" keys are fields
// of a row, and the draft-only keys (position, channel) group /drafts rows only:
//   batch       requests.batch_size: the sweep's concurrency B the request ran in   (request-level)
//   turn        requests.turn                                                      (request-level)
//   category    requests.category (dataset category string; "" shown as "(none)")  (request-level)
//   step-batch  the row's own batch_size: sequences actually in the step            (row-level)
//   position    drafts.position (1..K)                                   (row-level, drafts only)
//   channel     drafts.channel (harmony channel)                         (row-level, drafts only)
// batch and step-batch differ at the tail of a sweep, where fewer than B sequences remain.
//
// Threads: no global state besides HDF5's own; one summary per thread at a time is safe where the
// HDF5 library is thread-safe (Debian's is not: call from one thread).
#ifndef DS_SUMMARY_H
#define DS_SUMMARY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ds/record.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_SUMMARY_BLOCK_ROWS 65536                         // rows read per HDF5 call
// Group label capacity: any stored string, and the ellipsis (3 bytes) that marks a cut one.
#define DS_SUMMARY_LABEL_BYTES (DS_RECORD_STRING_BYTES + 4)

enum ds_summary_by {
    DS_SUMMARY_BY_BATCH = 0,
    DS_SUMMARY_BY_TURN,
    DS_SUMMARY_BY_CATEGORY,
    DS_SUMMARY_BY_STEP_BATCH,
    DS_SUMMARY_BY_POSITION,
    DS_SUMMARY_BY_CHANNEL,
    DS_SUMMARY_BY_COUNT
};

// Name of a key as the command line spells it ("batch", "step-batch", ...); NULL if invalid.
const char *ds_summary_by_name(enum ds_summary_by by);
// Parses a key name. Errors: DS_ERR_ARG (the message lists the valid names).
enum ds_status ds_summary_by_parse(const char *name, enum ds_summary_by *by_out);
// 1 for batch, turn and category (keys taken from the request's /requests row), else 0.
int ds_summary_by_is_request_level(enum ds_summary_by by);
// 1 for position and channel (only /drafts rows have them), else 0.
int ds_summary_by_is_drafts_only(enum ds_summary_by by);

// The sums of one group. Arrays indexed by position i run 0..k (index 0 unused except in hist).
struct ds_summary_group {
    uint64_t key;                       // batch size, turn, category string id, position, ...
    char label[DS_SUMMARY_LABEL_BYTES]; // the key as text ("8", "coding", "(none)", "analysis")
    // requests: request-level keys (and the "all" group) count /requests rows with this key;
    // row-level keys count distinct finished requests among the group's kept rows.
    uint64_t requests;
    uint64_t req_generated; // sum of requests.generated_len (request-level keys and "all" only)
    uint64_t req_steps;     // sum of requests.steps        (request-level keys and "all" only)
    // From /steps rows (zero for draft-only keys):
    uint64_t steps;     // (step, sequence) rows = verify steps
    uint64_t drafted;   // sum of steps.drafted
    uint64_t accepted;  // sum of steps.accepted
    uint64_t emitted;   // sum of steps.emitted
    uint64_t nonfinite; // rows with nonfinite = 1: not in steps nor in any sum here
    uint64_t *hist;     // [k + 1]: rows that accepted exactly j drafts
    uint64_t *reached;  // [k + 1]: rows where position i was drafted and every earlier one accepted
                        //   (drafted >= i and accepted >= i - 1)
    // From /drafts rows:
    uint64_t drafts;          // rows
    uint64_t drafts_accepted; // rows with accepted = 1
    double drafts_expected;   // sum of expected_accept (float32 values summed in double, in
                              //   file order)
    uint64_t *pos_drafts;     // [k + 1]: rows at position i
    uint64_t *pos_accepted;   // [k + 1]: accepted rows at position i
    double *pos_expected;     // [k + 1]: sum of expected_accept at position i
    uint64_t ch_drafts[DS_REC_CHANNEL_COUNT];
    uint64_t ch_accepted[DS_REC_CHANNEL_COUNT];
    double ch_expected[DS_REC_CHANNEL_COUNT];
    // Phase times from /steps (trace level phases or kernels), one row per step id: every sequence
    // of a step carries the step's times, so only the first row of each step id in the group is
    // counted (the rows of one step are contiguous in the file). Rows with draft_ns and verify_ns
    // both 0 were not timed and are skipped.
    uint64_t timed_steps;   // distinct step ids with phase times
    uint64_t draft_ns_sum;  // sum of steps.draft_ns over those steps
    uint64_t verify_ns_sum; // sum of steps.verify_ns over those steps
    uint64_t last_step;     // reading state: step id of the group's last timed row
    int has_last_step;      //   (0 before the first)
    double base_step_ns;    // the baseline's median decode step time at this batch size; NaN
                            //   if none (no baseline, or the key is not a batch size)
    // By batch only, for a batch size other than the run's smallest (div_base): its requests that
    // have a twin there (the same dataset_index and turn), and of them those whose kept drafts
    // equal the twin's bit for bit (tokens, acceptance and every probability), those with the
    // same tokens and acceptance but other probabilities, and those whose tokens part. Compared
    // through two 64-bit hashes of each request's drafts in file order.
    int has_div;
    uint32_t div_base;
    uint64_t div_requests, div_bits_equal, div_same_tokens, div_parted;
};

// One options_json.baseline entry: plain target decoding at one batch size.
struct ds_summary_baseline {
    uint32_t batch_size;
    uint64_t steps;
    double median_ns, mean_ns, min_ns;
};
#define DS_SUMMARY_MAX_BASELINE 64

// A run's summary: run settings, row counts, the groups sorted by key (category: by label) and
// the "all" group over every kept row.
struct ds_summary {
    char path[1024];
    enum ds_summary_by by;
    uint32_t schema_version;
    uint32_t k; // draft tokens per step (attribute k); per-position arrays have k + 1 entries
    char rule[32];
    double temperature, top_p;
    uint64_t seed;
    char tool_version[64];
    char git_commit[64];
    char gpu_name[128];
    // /sessions: how many, and the state of the last one ("running" means still being written,
    // or the writer died).
    uint32_t n_sessions;
    uint8_t last_session_status; // enum ds_rec_session_status
    // Rows in the file, and rows dropped because their request has no /requests row.
    uint64_t rows_steps, rows_drafts, rows_requests;
    uint64_t dropped_steps, dropped_drafts;
    // Step rows of finished requests that drafted nothing (a sequence one position short of the
    // context limit): not verify steps, so left out of every step metric (vLLM counts a draft
    // only when tokens were proposed), and counted here.
    uint64_t undrafted_steps;
    // Step rows of finished requests whose verify logits were not finite (steps.nonfinite; the
    // request ended with error), and the /drafts rows of those steps: the step verified nothing,
    // so both are left out of every metric and counted here (each group's `nonfinite` counts its
    // share of the steps).
    uint64_t nonfinite_steps, nonfinite_drafts;
    // /requests rows that ended with error (stop_reason: non-finite target logits), and of them
    // those with no step, whose prompt's last logits failed the check (docs/cli.md, "Stops").
    uint64_t error_requests, error_requests_at_prompt;
    // Kept /drafts rows whose q_draft is not a positive number (NaN or Inf in the draft's
    // logits): their expected acceptance is NaN; their acceptance is counted as it happened.
    uint64_t nonfinite_q_drafts;
    // /requests rows by stop_reason (enum ds_rec_stop; a code beyond it is in none).
    uint64_t stop_counts[DS_REC_STOP_COUNT];
    // options_json: the measured trace overhead (NaN when absent) and the decode baseline.
    double trace_overhead;
    // options_json.dataset: records the run read from its dataset and those it skipped (empty,
    // malformed), with the first skip's message; has_dataset = 0 in files written before it.
    int has_dataset;
    uint64_t dataset_records_read, dataset_skipped_empty, dataset_skipped_malformed;
    char dataset_first_skip[320];
    // options_json.numerics: "invariant" (also for files written before the option) or
    // "batch-variant" (the attention split chosen by each call's size; docs/cli.md).
    char numerics[16];
    // options_json.pad_to_graph_sizes: the verify padding sizes (none: n_pad_sizes 0).
    int n_pad_sizes;
    uint32_t pad_sizes[64];
    // options_json.load: the creating run's model loads (target, draft): weight bytes placed,
    // seconds of the create, and whether the bytes were copied (false: mapped in place by the
    // CPU reference); has_load = 0 in files written before it.
    int has_load;
    uint64_t load_bytes[2];
    double load_seconds[2];
    int load_uploaded[2];
    // /sessions: CUPTI records dropped, summed over the sessions (0 in schema-v1 files).
    uint64_t trace_dropped;
    size_t n_baseline;
    struct ds_summary_baseline baseline[DS_SUMMARY_MAX_BASELINE];
    size_t n_groups;
    struct ds_summary_group *groups;
    struct ds_summary_group all;
};

// Reads the run file at `path` and fills *summary_out (free with ds_summary_free).
// Errors: DS_ERR_ARG (NULL argument, invalid key), DS_ERR_IO (cannot open or read; the message
// names the file and HDF5's reason), DS_ERR_FORMAT (not a draftscope run file, a table or column
// missing, a row breaking the schema such as accepted > drafted or a position outside 1..k: the
// message names the file, the table and the row), DS_ERR_UNSUPPORTED (another schema version),
// DS_ERR_NOMEM. *summary_out is NULL on failure. The file is never modified.
enum ds_status ds_summary_compute(const char *path, enum ds_summary_by by,
                                  struct ds_summary **summary_out);

// Frees a summary; NULL is a no-op.
void ds_summary_free(struct ds_summary *s);

// ---- metrics of one group (docs/metrics.md); NaN when the denominator is 0 ----

// Mean acceptance length tau = 1 + accepted / steps (bonus included): vLLM "Mean acceptance
// length", EAGLE tau, SGLang's scheduler "accept len".
double ds_summary_mean_acceptance_length(const struct ds_summary_group *g);
// SGLang benchmark accept length = sum completion tokens / sum verify steps over finished requests
// (requests.generated_len / requests.steps; counts the prefill token). NaN for row-level keys.
double ds_summary_sglang_accept_length(const struct ds_summary_group *g);
// Tokens committed per verify step = emitted / steps.
double ds_summary_emitted_per_step(const struct ds_summary_group *g);
// Draft acceptance rate = accepted / drafted (from /steps): vLLM, SGLang spec_accept_rate.
double ds_summary_draft_acceptance_rate(const struct ds_summary_group *g);
// Joint acceptance at position i (1..k) = rows with accepted >= i / rows: vLLM per-position rate.
double ds_summary_joint(const struct ds_summary_group *g, uint32_t k, uint32_t i);
// Conditional acceptance at position i (1..k) = rows with accepted >= i / reached[i]: EAGLE
// n-alpha.
double ds_summary_conditional(const struct ds_summary_group *g, uint32_t k, uint32_t i);
// Acceptance rate of /drafts rows = drafts_accepted / drafts.
double ds_summary_drafts_rate(const struct ds_summary_group *g);
// Mean expected acceptance sum_v min(p_v, q_v) over /drafts rows; per position; per channel.
double ds_summary_expected(const struct ds_summary_group *g);
double ds_summary_expected_at(const struct ds_summary_group *g, uint32_t i);
double ds_summary_expected_channel(const struct ds_summary_group *g, int channel);

// Step times (docs/metrics.md "Step times and predicted speedup"): mean draft_ns and verify_ns
// per timed step; NaN when no step was timed.
double ds_summary_mean_draft_ns(const struct ds_summary_group *g);
double ds_summary_mean_verify_ns(const struct ds_summary_group *g);
// Predicted speedup over plain decoding = tau x base step time / (mean draft + mean verify), with
// tau the mean acceptance length; NaN without timed steps or without a baseline for the group.
double ds_summary_predicted_speedup(const struct ds_summary_group *g);

// Harmony channel name ("header", "analysis", ...), NULL if out of range.
const char *ds_summary_channel_name(int channel);

// Writes the summary as text (one block per group, then "all") or as one JSON object (jansson;
// the layout is documented in docs/metrics.md). Errors: DS_ERR_ARG, DS_ERR_NOMEM, DS_ERR_IO (a
// write to f failed).
enum ds_status ds_summary_print_text(const struct ds_summary *s, FILE *f);
enum ds_status ds_summary_print_json(const struct ds_summary *s, FILE *f);

// `draftscope summary RUN.h5 [--json] [--by KEY]` (cmd_summary.c): prints the summary; returns the
// exit code (0 success, 1 the file could not be read, 2 usage). Belongs in ds/cli.h beside the
// other subcommands; declared here until main.c lists it.
int ds_cmd_summary(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif // DS_SUMMARY_H
