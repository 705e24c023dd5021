// ds/trace.h: kernel timings. CUPTI activity tracing, NVTX phase ranges, phase times per step,
// the decode baseline, and the overhead measurement.
//
// Levels (enum ds_rec_trace_level, `--trace off|phases|kernels`):
//   off     Nothing is registered with CUPTI and no CUDA event is recorded. Phase calls only
//           push/pop NVTX ranges, which are no-ops unless an NVTX injection library is loaded
//           (Nsight Systems provides one), so `nsys profile draftscope run --trace off` still
//           shows the phases. Steps rows carry no phase times.
//   phases  Each phase is bracketed by two CUDA events on the traced stream (GPU time, no
//           CUPTI). collect turns them into /ranges rows and per-step phase times.
//   kernels As phases, plus CUPTI activity records of kind CONCURRENT_KERNEL (never the
//           serializing KERNEL kind), tagged with (step, phase, draft step) through CUPTI
//           external correlation ids pushed around each phase: one /kernels row per kernel,
//           names interned, graph node ids kept for kernels launched from CUDA graphs.
//
// Order of calls (the run loop):
//   ds_trace_create(level, rec, NULL, &tr)   before any CUDA module loads: before
//                                            ds_backend_cuda_create and before any graph capture
//   ds_trace_set_stream(tr, ds_backend_cuda_stream(be))
//   per step:  ds_trace_phase_begin(tr, step, phase, draft_step, batch) ... ds_trace_phase_end(tr)
//              around each phase (prefill, draft_extend, draft_step k, verify, accept, sample);
//              ds_trace_phase_next between two phases that follow each other (one event for both)
//   between steps, on the recorder's thread: ds_trace_poll(tr, &times, &n)
//              then per steps row: ds_trace_step_fill(&times[i], &row)
//   ds_trace_collect (forced flush) after the last step, ds_trace_stats, ds_trace_release.
//
// Clocks: every time written is ns since the recorder's session start (ds_recorder_elapsed_ns).
// CUPTI timestamps are shifted by an offset measured against cuptiGetTimestamp whenever rows are
// taken from the worker; CUDA events are placed by an anchor event recorded at the end of each
// collect.
//
// Threads: phase calls, poll and collect come from the thread that owns the recorder. At level
// kernels the trace owns a worker thread: CUPTI's completion callback only queues a filled
// buffer and wakes the worker, which parses it and joins kernel records to their external
// correlation; the recorder's thread only takes the joined rows (a lock and a pointer swap),
// converts their times and appends them, so the launch path pays CUPTI's own per-kernel cost and
// the rare forced flush, not the parse. The sink is called on the recorder's thread.
// At most one trace of level kernels exists per process (CUPTI's activity API is process-wide).
//
// Cost: phase calls never allocate and never synchronize: NVTX push/pop and two cudaEventRecord
// per phase (one per boundary with ds_trace_phase_next), plus (level kernels only) the CUPTI
// external correlation push/pop. Between steps the run loop calls ds_trace_poll, which reads the
// finished phases' events (exact phase times every step) and takes the kernel rows the worker has
// joined so far; it forces a CUPTI flush only when the worker's join state needs an ageing point
// (correlation table half full, or too many kernel records waiting for their id), or every
// flush_ms when the caller asks for that; otherwise records arrive as CUPTI completes buffers.
// ds_trace_collect is the full form (a forced flush, then it waits for the worker to parse
// everything up to it): for the end of a run, the end of a timed block and tests.
// docs/tracing.md gives the measured overheads and the policy.
#ifndef DS_TRACE_H
#define DS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "ds/gptoss.h"
#include "ds/record.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_trace ds_trace_t;

// Tuning; a NULL options pointer or a 0 field means the default in brackets.
struct ds_trace_options {
    size_t buffer_bytes;     // one CUPTI activity buffer [1 MiB]: a few steps of a real model's
                             //   records, so buffers complete (and rows flow) without flushes
    size_t max_buffer_bytes; // all CUPTI buffers together [128 MiB]; beyond it CUPTI drops
                             //   records, which are counted (stats.dropped_records)
    size_t max_ranges;       // phase ranges held between two collects [8192]; more are dropped
                             //   and counted (stats.dropped_ranges)
    unsigned flush_ms;       // ds_trace_poll also forces a CUPTI flush once this period has
                             //   passed [0: never by time, only when the join state needs it]
    int api_records;         // enum ds_trace_api; 0: the environment variable
                             //   DS_TRACE_API_RECORDS (none|runtime|all, or 0/1 for
                             //   none/all), else DS_TRACE_API_DEFAULT_MODE
};

// Which CUDA API activity records level kernels asks CUPTI for. External correlation records are
// emitted alongside API records, so a kernel gets its (step, phase) only if the API call that
// launched it is recorded. (A mode recording the launch calls alone, through
// cuptiActivityEnableRuntimeApi, was measured on the H200 to attribute no kernel at all: CUPTI
// emits no external correlation record for those; it was removed.)
enum ds_trace_api {
    DS_TRACE_API_UNSET = 0, // options: take the environment / the default
    DS_TRACE_API_NONE,      // no API records (kernel and external correlation kinds only):
                            //   attributes nothing; for experiments
    DS_TRACE_API_RUNTIME,   // every runtime API call (one API + one correlation record per call)
    DS_TRACE_API_ALL,       // every runtime and driver API call (two records of each per call)
};
#define DS_TRACE_API_DEFAULT_MODE DS_TRACE_API_RUNTIME

// Phase times of one step, from its ranges (GPU time between the phase's two events).
struct ds_trace_step_times {
    uint64_t step;
    uint64_t start_ns, end_ns; // first phase begin, last phase end; ns since session start
    uint64_t phase_ns[DS_REC_PHASE_COUNT]; // summed durations per phase (draft_step: all k)
    uint32_t ranges;                       // ranges that went into it
};

// Counters since create.
struct ds_trace_stats {
    uint64_t ranges;          // /ranges rows produced
    uint64_t kernels;         // /kernels rows produced
    uint64_t dropped_records; // CUPTI records lost (cuptiActivityGetNumDroppedRecords, and
                              //   records of buffers CUPTI could not get)
    uint64_t dropped_ranges;  // phase ranges lost: more than max_ranges between collects
    uint64_t unattributed;    // kernel records with no phase (launched outside every phase,
                              //   e.g. weight uploads, or their correlation dropped); not written
    uint64_t buffers;         // CUPTI buffers completed
    uint64_t flushes;         // forced CUPTI flushes (cuptiActivityFlushAll)
    uint64_t drains;          // CUPTI buffers parsed by the worker thread
    uint64_t flush_ns;        // recorder-thread time spent in forced flushes
    uint64_t parse_ns;        // worker-thread time spent parsing buffers and joining
                              //   correlations (off the launch path)
    uint64_t wait_ns;         // recorder-thread time collect/discard spent waiting for the
                              //   worker to catch up (the final drain)
    uint64_t calls_ns;        // recorder-thread time inside phase calls, poll and collect
                              //   (flush_ns and wait_ns included); 0 at level off
    uint64_t correlations;    // external correlation entries the worker has joined in (poll
                              //   forces a flush per 131,072 of them: ds_trace_flush_share)
    uint64_t dropped_correlations; // correlations that did not fit the table (more than 262,144
                                   //   launches between polls): their kernels are unattributed
};
// A kernel row handed to the sink set with ds_trace_set_kernel_sink, with its name (valid during
// the call only).
typedef void (*ds_trace_kernel_sink)(void *user, const struct ds_rec_kernel *row,
                                     const char *name);

// Parses "off", "phases" or "kernels" (DS_ERR_ARG naming the text otherwise).
enum ds_status ds_trace_level_parse(const char *text, enum ds_rec_trace_level *level_out);
// "off", "phases", "kernels"; NULL for an invalid value.
const char *ds_trace_level_name(enum ds_rec_trace_level level);
// Phase name as in NVTX ranges and the file's enum: "prefill", "draft_extend", "draft_step",
// "verify", "accept", "sample"; NULL for an invalid value.
const char *ds_trace_phase_name(enum ds_rec_phase phase);

// Creates a trace. level off always succeeds (rec may then be NULL). phases and kernels need a
// CUDA device: without one DS_ERR_NODEVICE, message "no GPU: tracing is off (...)". rec receives
// the /ranges and /kernels rows and interns kernel names; it may be NULL (times only, nothing
// written). kernels: registers the CUPTI buffer callbacks and enables CONCURRENT_KERNEL,
// EXTERNAL_CORRELATION and the API records of opt->api_records (external correlation records
// follow API records; see enum ds_trace_api). Call it before any CUDA module loads, or CUPTI instruments the modules lazily (seconds
// at the first launch) and the first kernels are lost.
// Errors: DS_ERR_ARG (bad level or options), DS_ERR_NODEVICE, DS_ERR_UNSUPPORTED (a kernels trace
// already exists, or CUPTI refused: its message is quoted), DS_ERR_NOMEM. *trace_out is NULL on
// failure; nothing stays registered.
enum ds_status ds_trace_create(enum ds_rec_trace_level level, ds_recorder_t *rec,
                               const struct ds_trace_options *opt, ds_trace_t **trace_out);

// Gives the trace its recorder when the file is created after the trace (the run creates the
// trace before the models, and the file after the baseline). Call it between collects, outside
// any phase; then ds_trace_discard, so that no row mixes the two clocks. Errors: DS_ERR_ARG (NULL
// trace, or a phase open).
enum ds_status ds_trace_set_recorder(ds_trace_t *trace, ds_recorder_t *rec);

// The stream whose work the phases bracket (a cudaStream_t; the CUDA backend's stream). Needed at
// levels phases/kernels before the first phase (phases before it get no events, no ranges);
// waits for the stream once and records an anchor event. No-op at level off.
// Errors: DS_ERR_ARG (NULL trace), DS_ERR_NODEVICE (the CUDA runtime failed; its message).
enum ds_status ds_trace_set_stream(ds_trace_t *trace, void *stream);

// Opens a phase of `step`: NVTX range "<phase>" ("draft_step_<k>" for draft steps) with the step
// as payload, and at levels phases/kernels a begin event and the external correlation id of
// (step, phase, draft_step). Phases may nest up to 8 deep (each gets its own range); normally they
// follow one another. draft_step is 1..255 for DS_REC_PHASE_DRAFT_STEP and 0 otherwise; batch is
// the step's batch size (ranges.batch_size). NULL trace: no-op (DS_OK).
// Errors: DS_ERR_ARG (bad phase, draft_step, step beyond 2^47 - 1, nesting deeper than 8),
// nothing pushed then.
enum ds_status ds_trace_phase_begin(ds_trace_t *trace, uint64_t step, enum ds_rec_phase phase,
                                    unsigned draft_step, unsigned batch);
// Closes the innermost open phase. NULL trace: no-op. Errors: DS_ERR_ARG (no open phase).
enum ds_status ds_trace_phase_end(ds_trace_t *trace);
// Closes the innermost open phase and opens the next one in its place, for phases that follow
// each other: one CUDA event is both the closing phase's end and the next one's begin (ranges
// rows: its end_ns == the next one's start_ns), where end + begin would record two. Whatever the
// caller does between the two phases (host work, no stream work) counts to the phase it calls
// this in. Same NVTX ranges and external ids as end + begin. NULL trace: no-op. Errors: as
// ds_trace_phase_begin, and DS_ERR_ARG when no phase is open (nothing changed then).
enum ds_status ds_trace_phase_next(ds_trace_t *trace, uint64_t step, enum ds_rec_phase phase,
                                   unsigned draft_step, unsigned batch);

// Between steps, on the recorder's thread: waits for the phases' end events, flushes CUPTI
// (cuptiActivityFlushAll, forced), waits until the worker has parsed every buffer that flush
// delivered, converts records to session time, appends /ranges and /kernels rows to the recorder,
// and gives the phase times of the steps whose ranges closed since the last collect, in step
// order (*times_out points into the trace, valid until the next collect; NULL with *n_out = 0 at
// level off). After it, every kernel of work finished before the call has its row (earlier or
// now), except records whose external correlation has not arrived (they wait for the next
// collect). Open phases stay open. NULL trace: *n_out = 0, DS_OK.
// Errors: DS_ERR_ARG (a NULL out pointer), DS_ERR_NODEVICE (a CUDA event failed: the runtime's message), DS_ERR_NOMEM, and the recorder's
// errors (DS_ERR_IO ...) passed through.
enum ds_status ds_trace_collect(ds_trace_t *trace, const struct ds_trace_step_times **times_out,
                                size_t *n_out);

// The cheap form of collect, for every step of a run: phase ranges and step times exactly as
// collect gives them (it waits for the closed phases' end events), and the kernel rows the worker
// has joined so far (it never waits for the worker). CUPTI is flushed (forced) only when the
// correlation table is half full or 262,144 kernel records wait for their id (or flush_ms have
// passed, when set); otherwise records arrive as CUPTI completes buffers on its own. Kernel rows therefore reach the recorder
// some steps late; call ds_trace_collect once at the end so that none is left behind. The phase
// events are re-anchored to the session clock at most every 100 ms. Errors: as collect.
enum ds_status ds_trace_poll(ds_trace_t *trace, const struct ds_trace_step_times **times_out,
                             size_t *n_out);

// Every attributed kernel row (the ones appended to the recorder) is also handed to sink, on the
// recorder's thread inside poll/collect, with CUPTI's name for it (the same pointer for every
// record of one kernel; the recorder may be NULL then). NULL sink: none. Errors: DS_ERR_ARG
// (NULL trace).
enum ds_status ds_trace_set_kernel_sink(ds_trace_t *trace, ds_trace_kernel_sink sink, void *user);

// The API records mode of a kernels-level trace (DS_TRACE_API_UNSET for other levels and NULL),
// and its name: "none", "runtime", "all" (NULL for UNSET or an invalid value).
enum ds_trace_api ds_trace_api_records(const ds_trace_t *trace);
const char *ds_trace_api_name(enum ds_trace_api api);
// Parses a DS_TRACE_API_RECORDS value (none|runtime|all, 0 = none, 1 = all). Errors: DS_ERR_ARG
// naming the text ("launch" too, with the reason it was removed).
enum ds_status ds_trace_api_parse(const char *text, enum ds_trace_api *api_out);

// A short readable kernel name from CUPTI's (an Itanium-mangled C++ name, or a plain C name):
// the function's name and its template arguments, e.g. "_Z9matmul_tcILi16ELi8EEvPKv" gives
// "matmul_tc<16,8>"; integer literals print as numbers, builtin and named types by name, anything
// else as "?". Plain names are copied. Always NUL-terminated within cap (cut with "..."). Returns
// out.
char *ds_trace_short_name(const char *name, char *out, size_t cap);

// The /kernels and /ranges rows the last collect appended (valid until the next collect); for
// tests and for callers without a recorder. Errors: DS_ERR_ARG.
enum ds_status ds_trace_last_rows(const ds_trace_t *trace, const struct ds_rec_kernel **kernels_out,
                                  size_t *n_kernels_out, const struct ds_rec_range **ranges_out,
                                  size_t *n_ranges_out);

// Fills a steps row's draft_ns (draft_extend + every draft_step), verify_ns, accept_ns (accept +
// sample) and total_ns (end_ns - start_ns: the whole step, prefill included) from t. Other fields
// are untouched. t NULL: the four fields become 0 (not traced).
void ds_trace_step_fill(const struct ds_trace_step_times *t, struct ds_rec_step *row);

// Sums ranges into per-step times (what collect does with its ranges; pure, for tests): ranges
// grouped by step in order of first appearance; out holds up to cap steps. Errors: DS_ERR_ARG
// (NULL pointers with n > 0), DS_ERR_RANGE (more than cap distinct steps; out holds the first cap).
enum ds_status ds_trace_sum_ranges(const struct ds_rec_range *ranges, size_t n,
                                   struct ds_trace_step_times *out, size_t cap, size_t *n_out);

// The external correlation id of (step < 2^47, phase, draft_step): step << 16 | phase << 8 |
// draft_step | 1 << 63 (never 0, and tells our ids from others). decode returns DS_ERR_RANGE for
// an id that no encode makes.
uint64_t ds_trace_ext_id(uint64_t step, enum ds_rec_phase phase, unsigned draft_step);
enum ds_status ds_trace_ext_id_decode(uint64_t id, uint64_t *step_out, enum ds_rec_phase *phase_out,
                                      unsigned *draft_step_out);

// Counters since create (zeros for NULL).
void ds_trace_stats(const ds_trace_t *trace, struct ds_trace_stats *stats_out);
// The counters of *now since the snapshot *before (now -= before, field by field): what one
// window produced, e.g. a run's session without the warm-up and overhead windows before it.
void ds_trace_stats_since(struct ds_trace_stats *now, const struct ds_trace_stats *before);
// The share of one forced flush (0..1) that the work between two stats snapshots (elapsed_ns of
// host time) costs a run under poll's policy: the correlation entries it made over the table's
// flush load, or elapsed over flush_ms when that is set, whichever is larger. For charging a
// timed block's closing collect as a run pays it. 0 for NULL arguments and levels below kernels.
double ds_trace_flush_share(const ds_trace_t *trace, const struct ds_trace_stats *before,
                            const struct ds_trace_stats *after, uint64_t elapsed_ns);
enum ds_rec_trace_level ds_trace_level(const ds_trace_t *trace); // DS_REC_TRACE_OFF for NULL

// Pauses/resumes tracing: while paused, phase calls only do NVTX and CUPTI's kinds are disabled,
// so the work runs as at level off (modules stay instrumented). For overhead measurement.
// Errors: DS_ERR_ARG (NULL, or a phase open), DS_ERR_UNSUPPORTED (CUPTI refused).
enum ds_status ds_trace_pause(ds_trace_t *trace);
enum ds_status ds_trace_resume(ds_trace_t *trace);

// Flushes and throws away everything recorded since the last collect (warm-up windows, overhead
// measurement); waits for the worker, so that no row of before the call comes later. Errors: as
// collect, less the recorder's.
enum ds_status ds_trace_discard(ds_trace_t *trace);

// Disables this trace's CUPTI kinds, flushes and frees. Rows not yet collected are lost (collect
// first). NULL: no-op.
void ds_trace_release(ds_trace_t *trace);

// 1 once this process has registered CUPTI activity callbacks (any kernels-level trace), else 0.
// Level off and level phases never do.
int ds_trace_cupti_registered(void);

// ---- per-kernel table (bench --steps --trace kernels) ----
//
// A kernel sink that sums the rows of one step kind by short kernel name: only rows whose step
// lies in [step_lo, step_hi) and whose (phase, draft step) is the table's are counted; any other
// row is counted apart (`other`), so rows of another block or kind can never leak in. Callers give
// the timed steps consecutive ids, then (after a collect, which drains the worker) read the
// entries: launches per step = launches / (step_hi - step_lo).

struct ds_trace_ktab_entry {
    char name[96];     // ds_trace_short_name of the kernel ("(other kernels)" when full), with
                       //   " [x,y,z]" (its grid) when the table is keyed by grid
    uint64_t launches; // rows counted
    uint64_t ns;       // summed end - start (raw CUPTI duration)
    uint64_t excl_ns;  // summed exclusive time: from max(start, the end of every kernel that
                       //   started before it on its stream) to end. Under programmatic dependent
                       //   launch a kernel's blocks start, and wait, before its predecessor ends,
                       //   so raw durations overlap; exclusive times tile the stream's busy time
};

typedef struct ds_trace_ktab ds_trace_ktab_t;

// Errors: DS_ERR_ARG (NULL), DS_ERR_NOMEM.
enum ds_status ds_trace_ktab_create(ds_trace_ktab_t **ktab_out);
void ds_trace_ktab_release(ds_trace_ktab_t *ktab);
// Empties the table and sets what it counts: steps in [step_lo, step_hi), phase, draft_step.
void ds_trace_ktab_reset(ds_trace_ktab_t *ktab, uint64_t step_lo, uint64_t step_hi,
                         enum ds_rec_phase phase, unsigned draft_step);
// Moves the end of the counted step range (steps are added as they are timed).
void ds_trace_ktab_set_end(ds_trace_ktab_t *ktab, uint64_t step_hi);
// on != 0: one entry per kernel and launch grid, named "name [x,y,z]" (e.g. the q/k/v, o_proj and
// lm_head launches of one matmul kernel apart); kept across resets. Default: one per name.
void ds_trace_ktab_set_by_grid(ds_trace_ktab_t *ktab, int on);
// The sink (user: the table): pass it to ds_trace_set_kernel_sink.
void ds_trace_ktab_sink(void *user, const struct ds_rec_kernel *row, const char *name);
// The entries sorted by exclusive time (largest first, then raw time, then name), valid until the
// next reset or sink call; *other_out: rows not counted (another step or phase); *full_out: bit 1
// when more names came than the table holds (the last entry took the rest), bit 2 when memory for
// the rows ran out (exclusive times then cover the rows held). Only counted rows take part in the
// exclusive times. NULL outs are skipped.
const struct ds_trace_ktab_entry *ds_trace_ktab_entries(ds_trace_ktab_t *ktab, size_t *n_out,
                                                        uint64_t *other_out, int *full_out);

// ---- decode baseline and overhead ----

// Plain target decoding (no draft) at one batch size.
struct ds_trace_baseline {
    uint32_t batch_size;
    uint32_t steps;     // timed steps
    uint64_t median_ns; // per decode step (forward of batch_size rows with logits, then sync)
    uint64_t mean_ns;
    uint64_t min_ns;
};

// What to time. 0 fields take the default in brackets.
struct ds_trace_baseline_options {
    int context_len; // position of every sequence's decode row [512, capped at max_pos - 1]
    int warmup;      // untimed steps first [3]
    int steps;       // timed steps [20]
};

// Times plain decode steps of `target` at each batch size: batch_size sequences in KV slots
// 0..B-1, one row each at position context_len, every row asking for logits; each step is
// ds_gptoss_forward then the backend's sync, timed on the host clock (what a decode loop pays per
// token, launches included). The KV cache below context_len is whatever it holds: timing only,
// the logits mean nothing. Needs plan max_slots, max_rows and max_logit_rows >= B.
// out[i] for batch_sizes[i]. Errors: DS_ERR_ARG (NULL, n == 0, B == 0), DS_ERR_RANGE (B beyond
// the plan, naming it), DS_ERR_NOMEM, the model's errors.
enum ds_status ds_trace_baseline_run(ds_gptoss_t *target, const uint32_t *batch_sizes, size_t n,
                                     const struct ds_trace_baseline_options *opt,
                                     struct ds_trace_baseline *out);

// Measures the slowdown of trace's level on decode steps of `target` at batch_size: `rounds`
// alternating blocks of `steps` steps, paused (what level off pays) and traced (each step inside
// a verify phase, then ds_trace_poll: the run's collection policy), and gives
// sum(traced) / sum(paused) - 1 in *overhead_out, i.e. the tokens/s lost (store it with
// ds_recorder_set_end's trace_overhead). The traced total also carries the final collect of the
// records the traced steps produced (rows converted, timed) and the forced flush's cost scaled by
// ds_trace_flush_share (the share of one that poll's policy gives those steps, as a run pays
// it); not the wait for the
// worker thread, whose parse runs beside the steps. Nothing is written to the
// recorder or the sink. Level off: 0. rounds/steps 0: 4 and 10. Call it right after a collect and
// outside any phase: it discards whatever the trace holds uncollected.
// Errors: as ds_trace_baseline_run and ds_trace_pause; DS_ERR_ARG for a NULL trace.
enum ds_status ds_trace_measure_overhead(ds_trace_t *trace, ds_gptoss_t *target,
                                         uint32_t batch_size, int rounds, int steps,
                                         double *overhead_out);

#ifdef __cplusplus
}
#endif
#endif // DS_TRACE_H
