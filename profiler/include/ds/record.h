// ds/record.h: the HDF5 run file: its schema (record structs) and the writer that fills it.
//
// Schema version DS_RECORD_SCHEMA_VERSION (docs/hdf5-schema.md documents every field).
//
// One file per run. Every table is a 1-D chunked dataset with an unlimited dimension at the file
// root, whose element is an HDF5 compound built from the C struct below with HOFFSET (the file
// keeps the struct's native little-endian layout, padding included):
//
//   /drafts    struct ds_rec_draft    one row per drafted token
//   /steps     struct ds_rec_step     one row per (step, sequence)
//   /requests  struct ds_rec_request  one row per finished request (one turn of a conversation)
//   /kernels   struct ds_rec_kernel   one row per traced GPU kernel (trace level "kernels")
//   /ranges    struct ds_rec_range    one row per traced phase range (trace level >= "phases")
//   /strings   struct ds_rec_string   interned strings; ids 0, 1, 2, ... in first-seen order
//   /sessions  struct ds_rec_session  one row per writer session (creation, then each resume);
//                                     holds the end-of-run values (status, trace overhead)
//
// Run metadata are attributes of the root group, all created (and written) before SWMR starts:
//   schema (string "draftscope-run"), schema_version (u32), tool_version, git_commit,
//   command_line, gpu_name, driver_version, cuda_version, target_path, target_config_sha256,
//   draft_path, draft_config_sha256, dataset_path, dataset_sha256, rule, trace_level,
//   options_json (strings, variable-length UTF-8), seed (u64), k (u32), temperature (f64),
//   top_p (f64), batch_sizes (u32[n]), created_unix_ns (u64).
// Values only known at the end of a session (status, measured trace overhead) live in /sessions:
// HDF5 forbids creating attributes in SWMR mode, and rewriting an existing attribute there,
// although HDF5 1.10.8 accepts it, is not an operation the SWMR protocol covers; rewriting a
// dataset row is.
//
// Conventions: times are ns; "ns since session start" is CLOCK_MONOTONIC measured from the start
// of the writer session that wrote the row (ds_recorder_elapsed_ns gives it); string-valued fields
// are u32 ids into /strings; enums are stored as HDF5 enum types over u8 (names below, lowercase);
// booleans are u8 0/1. Request ids join the tables: drafts.request = steps.request =
// requests.request. Rows whose request has no /requests row belong to a request that a crash cut
// short; readers drop them (a resumed run gives the rerun a new request id).
//
// Writing: the file is created with libver bounds (latest, latest), all tables and attributes are
// created, then SWMR write starts, so readers may open it while it grows
// (h5py.File(path, "r", libver="latest", swmr=True), then dset.refresh()). Appends go into
// fixed-capacity in-memory batches; ds_recorder_flush extends each table, writes, and H5Dflush-es
// it. A killed writer leaves every row up to its last successful flush. A file whose writer died
// keeps HDF5's "open for write" flags: SWMR readers open it as is; ds_recorder_recover clears the
// flags for plain readers (what `h5clear -s` does); ds_recorder_open_resume clears them itself.
//
// Threads: a recorder is used from one thread at a time. HDF5's automatic error printing is
// switched off by the recorder; its messages come back through ds_error_last().
#ifndef DS_RECORD_H
#define DS_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_RECORD_SCHEMA_VERSION 2u
#define DS_RECORD_SCHEMA_NAME "draftscope-run"
#define DS_RECORD_MAX_LAYERS 64     // steps.distinct_experts entries; unused layers hold 0
#define DS_RECORD_STRING_BYTES 1016 // strings.text capacity (bytes, NUL padded); longer is cut

// ---- enums stored as u8 (HDF5 enum types; the names in quotes are the HDF5 member names) ----

// Harmony channel of a drafted token.
enum ds_rec_channel {
    DS_REC_CHANNEL_HEADER = 0, // "header": role/channel/message framing tokens
    DS_REC_CHANNEL_ANALYSIS,   // "analysis": reasoning
    DS_REC_CHANNEL_COMMENTARY, // "commentary": tool-call preambles and calls
    DS_REC_CHANNEL_FINAL,      // "final": the answer
    DS_REC_CHANNEL_OTHER,      // "other": anything else
    DS_REC_CHANNEL_COUNT
};

// Why a request stopped.
enum ds_rec_stop {
    DS_REC_STOP_RETURN = 0,     // "return": <|return|>
    DS_REC_STOP_CALL,           // "call": <|call|>
    DS_REC_STOP_ENDOFTEXT,      // "endoftext": <|endoftext|>
    DS_REC_STOP_MAX_NEW_TOKENS, // "max_new_tokens": the generation limit
    DS_REC_STOP_CONTEXT_LIMIT,  // "context_limit": the context window is full
    DS_REC_STOP_ERROR,          // "error": the request failed (e.g. non-finite logits)
    DS_REC_STOP_COUNT
};

// Phase of a traced kernel or range.
enum ds_rec_phase {
    DS_REC_PHASE_PREFILL = 0,  // "prefill"
    DS_REC_PHASE_DRAFT_EXTEND, // "draft_extend"
    DS_REC_PHASE_DRAFT_STEP,   // "draft_step" (draft_step field says which, 1..K-1)
    DS_REC_PHASE_VERIFY,       // "verify"
    DS_REC_PHASE_ACCEPT,       // "accept"
    DS_REC_PHASE_SAMPLE,       // "sample"
    DS_REC_PHASE_COUNT
};

// State of a writer session (sessions.status).
enum ds_rec_session_status {
    DS_REC_SESSION_RUNNING = 0, // "running": still writing, or the writer died (crash, SIGKILL)
    DS_REC_SESSION_CLOSED,      // "closed": closed normally
    DS_REC_SESSION_INTERRUPTED, // "interrupted": stopped early on request (SIGINT), closed cleanly
    DS_REC_SESSION_FAILED,      // "failed": a write failed, or the run stopped on another error
    DS_REC_SESSION_COUNT
};

// Trace level of a session.
enum ds_rec_trace_level {
    DS_REC_TRACE_OFF = 0, // "off"
    DS_REC_TRACE_PHASES,  // "phases": NVTX ranges and /ranges rows
    DS_REC_TRACE_KERNELS, // "kernels": also CUPTI kernel records in /kernels
    DS_REC_TRACE_COUNT
};

// ---- record structs (POD, explicit widths; field names are the HDF5 member names) ----

// /drafts: one drafted token. p and q are after the run's temperature and top-p (temperature 1
// for greedy runs); q is mapped into target ids through d2t.
struct ds_rec_draft {
    uint64_t step;         // global step id (unique across the whole run and all batch sizes)
    uint32_t request;      // request id (joins requests.request)
    int32_t draft_token;   // the drafted token (target vocabulary id)
    float q_draft;         // q(draft_token): draft probability of its own token
    float p_draft;         // p(draft_token): target probability of the draft token
    int32_t target_token;  // target argmax at this position
    float p_target;        // p(target_token): the target's top-1 probability
    float margin;          // target top-1 minus top-2 probability
    float expected_accept; // sum_v min(p_v, q_v) = 1 - TV(p, q)
    float entropy_target;  // entropy of p, nats
    float entropy_draft;   // entropy of q, nats
    uint32_t context_len;  // tokens preceding this drafted token in its sequence
    uint16_t batch_size;   // sequences in the step's verify batch
    uint8_t position;      // 1..K within the chain
    uint8_t accepted;      // 1 if accepted by the run's rule
    uint8_t channel;       // enum ds_rec_channel
};

// /steps: one (step, sequence).
struct ds_rec_step {
    uint64_t step;        // global step id
    uint64_t draft_ns;    // phase times of the whole step (same for every sequence in it), ns;
    uint64_t verify_ns;   //   0 when not traced
    uint64_t accept_ns;   //
    uint64_t total_ns;    //
    uint32_t request;     // request id
    uint32_t context_len; // tokens in the sequence before this step's verify input
    uint16_t batch_size;  // sequences in the step
    uint16_t turn;        // turn index of the request within its conversation (0-based)
    uint8_t drafted;      // draft tokens proposed for this sequence (K, or fewer near a limit)
    uint8_t accepted;     // draft tokens accepted (the accepted prefix)
    uint8_t emitted;      // tokens committed this step (accepted + the correction/bonus token,
                          //   fewer when a stop token or the limit cuts the step)
    uint8_t nonfinite;    // 1 if this sequence's verify logits had NaN or Inf
    // Per target layer: distinct experts selected by THIS sequence's verify rows in this step
    // (union over its K+1 rows of the top-k choices), 0 for layers beyond the model's depth.
    uint16_t distinct_experts[DS_RECORD_MAX_LAYERS];
};

// /requests: one finished request (a turn of a conversation), written when it ends.
struct ds_rec_request {
    uint64_t start_ns;      // ns since session start: request admitted
    uint64_t end_ns;        // ns since session start: request finished
    uint32_t request;       // request id (unique in the file)
    uint32_t dataset_index; // index of the conversation in the dataset file
    uint32_t category;      // string id (dataset category; "" when none)
    uint32_t conversation;  // string id (the dataset's conversation/question id)
    uint32_t prompt_len;    // prompt tokens
    uint32_t generated_len; // generated tokens
    uint32_t steps;         // speculative steps it took
    uint16_t batch_size;    // concurrency B of the sweep it ran in
    uint16_t turn;          // turn index (0-based)
    uint16_t session;       // writer session (sessions.session); set by the recorder
    uint8_t stop_reason;    // enum ds_rec_stop
};

// /kernels: one GPU kernel from CUPTI (CONCURRENT_KERNEL activity records).
struct ds_rec_kernel {
    uint64_t step;       // global step id (prefill kernels: the step that admitted it)
    uint64_t start_ns;   // ns since session start
    uint64_t end_ns;     // ns since session start
    uint64_t graph_node; // CUDA graph node id (0 when not launched from a graph)
    uint32_t name;       // string id of the kernel name (as CUPTI reports it)
    uint32_t stream;     // CUDA stream id
    uint32_t grid_x, grid_y, grid_z;
    uint32_t block_x, block_y, block_z;
    uint32_t static_smem;  // static shared memory per block, bytes
    uint32_t dynamic_smem; // dynamic shared memory per block, bytes
    uint32_t correlation;  // CUPTI correlation id
    uint16_t registers;    // registers per thread
    uint8_t phase;         // enum ds_rec_phase
    uint8_t draft_step;    // draft step index for DS_REC_PHASE_DRAFT_STEP, else 0
};

// /ranges: one phase range (NVTX push/pop pair) of a step.
struct ds_rec_range {
    uint64_t step;       // global step id
    uint64_t start_ns;   // ns since session start
    uint64_t end_ns;     // ns since session start
    uint16_t batch_size; // sequences in the step (prefill: the sequences it prefilled)
    uint8_t phase;       // enum ds_rec_phase
    uint8_t draft_step;  // draft step index for DS_REC_PHASE_DRAFT_STEP, else 0
};

// /strings: one interned string. Id 0 is always "".
struct ds_rec_string {
    uint32_t id;                       // = row index
    uint32_t length;                   // full length in bytes (> DS_RECORD_STRING_BYTES - 1
                                       //   means text holds only a prefix)
    char text[DS_RECORD_STRING_BYTES]; // UTF-8, NUL padded
};

// /sessions: one writer session. Written when the session starts (status "running") and
// rewritten in place at close.
struct ds_rec_session {
    uint64_t start_unix_ns; // wall clock (CLOCK_REALTIME) at session start
    uint64_t end_unix_ns;   // wall clock at close; 0 while running or after a crash
    uint64_t first_step;    // first step id this session may write
    uint64_t next_step;     // one past the highest step id written so far (updated per flush)
    double trace_overhead;  // measured relative slowdown of the trace level (0.03 = 3%); NaN if
                            //   not measured
    uint64_t trace_dropped; // CUPTI activity records dropped in this session; 0 when not traced
                            //   (schema v2; v1 files lack the column, readers take 0)
    uint32_t command_line;  // string id of this session's command line
    uint16_t session;       // 0 for the creating session, then 1, 2, ... per resume
    uint8_t status;         // enum ds_rec_session_status
    uint8_t trace_level;    // enum ds_rec_trace_level
};

// The tables, in the order they are flushed (strings first: rows may only name flushed ids).
enum ds_rec_table {
    DS_REC_STRINGS = 0,
    DS_REC_REQUESTS,
    DS_REC_STEPS,
    DS_REC_DRAFTS,
    DS_REC_KERNELS,
    DS_REC_RANGES,
    DS_REC_SESSIONS,
    DS_REC_TABLE_COUNT
};

// Dataset name of a table ("drafts", ...); NULL for an invalid value.
const char *ds_rec_table_name(enum ds_rec_table t);
// The file's name of a stop reason ("max_new_tokens", ...); NULL for an invalid value.
const char *ds_rec_stop_name(enum ds_rec_stop s);

// ---- run metadata ----

// What the run is. NULL strings are stored as "". Strings are copied; nothing is kept.
struct ds_run_meta {
    const char *tool_version;         // NULL: this build's DS_VERSION
    const char *git_commit;           // NULL: this build's DS_GIT_COMMIT
    const char *command_line;         // the full command line, shell-quoted
    const char *gpu_name;             // e.g. "NVIDIA H200"; "cpu" for the reference backend
    const char *driver_version;       // e.g. "550.54.15"
    const char *cuda_version;         // runtime version, e.g. "12.4"
    const char *target_path;          // target checkpoint directory
    const char *target_config_sha256; // hex sha256 of the target's config.json (ds/sha256.h)
    const char *draft_path;           // draft checkpoint directory
    const char *draft_config_sha256;  // hex sha256 of the draft's config.json
    const char *dataset_path;         // dataset file
    const char *dataset_sha256;       // hex sha256 of the dataset file
    const char *rule;                 // accept rule: "greedy", "target-only" or "rejection"
    const char *options_json;         // every other option, as a JSON object (free form)
    // Keys of options_json that a resume must find equal in the file (NULL-terminated; NULL:
    // none): the options that shape a request's records. A key the file lacks is not checked,
    // unless resume_defaults (a JSON object, or NULL) gives the value such a file implies.
    const char *const *resume_options;
    const char *resume_defaults;
    uint64_t seed;
    uint32_t k; // draft tokens per step
    double temperature;
    double top_p;
    const uint32_t *batch_sizes; // the sweep's concurrencies, n_batch_sizes of them
    size_t n_batch_sizes;
    enum ds_rec_trace_level trace_level;
};

// ---- the writer ----

typedef struct ds_recorder ds_recorder_t;

enum ds_recorder_flags {
    DS_RECORDER_OVERWRITE = 1u << 0, // replace an existing file (default: refuse)
};

// What an existing file already holds, from ds_recorder_open_resume. `done` points into the
// recorder and stays valid until ds_recorder_close.
struct ds_resume_info {
    uint16_t session;                  // the id of the new session
    uint64_t next_step;                // 1 + the highest step id in any table (0 if none)
    uint32_t next_request;             // 1 + the highest request id in any table (0 if none)
    uint64_t rows[DS_REC_TABLE_COUNT]; // rows per table, before this session
    const struct ds_rec_request *done; // the finished requests (their (batch_size,
    size_t n_done;                     //   dataset_index, turn) need not run again)
};

// Creates the run file at `path`: every table and attribute, then SWMR write mode, then the
// session row (flushed). Refuses an existing file unless flags has DS_RECORDER_OVERWRITE.
// Registers an abort hook (ds/check.h) that flushes on a fatal error.
// Errors: DS_ERR_ARG (bad meta: NULL path, k == 0, more batch sizes than fit), DS_ERR_IO (exists,
// cannot create, HDF5 failure; the message names the file and HDF5's reason), DS_ERR_NOMEM.
// *rec_out is NULL on failure; a half-created file is removed.
enum ds_status ds_recorder_create(const char *path, const struct ds_run_meta *meta, unsigned flags,
                                  ds_recorder_t **rec_out);

// Reopens an existing run file to append a new session. Checks that the schema version matches and
// that the run is the same one (target and draft config hashes, dataset hash, seed, k, rule,
// temperature, top_p, and the options_json keys named in meta->resume_options); reloads the string
// table so ids continue; clears the "open for write" flags a crashed writer left; refuses if
// another process is writing the file. Fills *info_out (see struct ds_resume_info), appends a
// session row and continues in SWMR mode. Errors: DS_ERR_IO (cannot open, locked by another
// writer, HDF5 failure), DS_ERR_FORMAT (not a draftscope run file, schema version differs, a table
// is missing or has another layout), DS_ERR_MISMATCH (a metadata field differs: the message names
// the field and both values). Outputs are zeroed/NULL on failure; a failure before the new
// session's first write leaves the file byte for byte as it was (its write flags, end of
// allocation and length put back).
enum ds_status ds_recorder_open_resume(const char *path, const struct ds_run_meta *meta,
                                       struct ds_resume_info *info_out, ds_recorder_t **rec_out);

// Appends n rows to a table's in-memory batch. Never allocates; when the batch fills, it flushes
// (so a write error can surface here). requests rows get their session field set here.
// Errors: DS_ERR_ARG (NULL rec or rows with n > 0), DS_ERR_IO from an implicit flush or a previous
// failure (the recorder stays failed: every later call returns the first error).
enum ds_status ds_recorder_append_drafts(ds_recorder_t *rec, const struct ds_rec_draft *rows,
                                         size_t n);
enum ds_status ds_recorder_append_steps(ds_recorder_t *rec, const struct ds_rec_step *rows,
                                        size_t n);
enum ds_status ds_recorder_append_requests(ds_recorder_t *rec, const struct ds_rec_request *rows,
                                           size_t n);
enum ds_status ds_recorder_append_kernels(ds_recorder_t *rec, const struct ds_rec_kernel *rows,
                                          size_t n);
enum ds_status ds_recorder_append_ranges(ds_recorder_t *rec, const struct ds_rec_range *rows,
                                         size_t n);

// Interns `text` (NUL-terminated) and gives its id: the same text always gives the same id, new
// texts get the next id and a /strings row. O(1) expected; allocates only when a text is new and
// the table must grow. Texts longer than DS_RECORD_STRING_BYTES - 1 bytes keep their own id but
// the file holds only their prefix. Errors: DS_ERR_ARG, DS_ERR_NOMEM, DS_ERR_RANGE (2^32 - 1
// strings), DS_ERR_IO (implicit flush or an earlier failure).
enum ds_status ds_recorder_intern(ds_recorder_t *rec, const char *text, uint32_t *id_out);

// Writes every pending batch (strings first), then H5Dflush-es each table written. A crash loses
// only what was appended since the last successful call. Each flush rewrites the partly filled
// last chunk of every table it touches (up to ~640 KiB each), so call it about once a second or
// every few hundred steps, not after every step.
// Errors: DS_ERR_IO naming the file, the table and HDF5's reason (e.g. "File too large" or "No
// space left on device"); the recorder is then failed for good, and the file holds every row up
// to the last successful flush.
enum ds_status ds_recorder_flush(ds_recorder_t *rec);

// Rows of a table: flushed plus pending, this session's and earlier ones'. Errors: DS_ERR_ARG.
enum ds_status ds_recorder_rows(const ds_recorder_t *rec, enum ds_rec_table t, uint64_t *rows_out);

// ns since this session started (CLOCK_MONOTONIC): the clock of requests/kernels/ranges times.
enum ds_status ds_recorder_elapsed_ns(const ds_recorder_t *rec, uint64_t *ns_out);

// End-of-session values, written into this session's /sessions row at close (the row is also
// rewritten at every flush with the steps written so far). status: DS_REC_SESSION_CLOSED (the
// default at close), DS_REC_SESSION_INTERRUPTED, or DS_REC_SESSION_FAILED for a run that stopped
// on an error other than a write (a failed write marks the session failed itself);
// trace_overhead, trace_dropped: see struct ds_rec_session (NaN: not measured). Errors:
// DS_ERR_ARG (NULL, or another status).
struct ds_run_end {
    enum ds_rec_session_status status;
    double trace_overhead;
    uint64_t trace_dropped; // CUPTI records dropped (ds_trace_stats); 0 when not traced
};
enum ds_status ds_recorder_set_end(ds_recorder_t *rec, const struct ds_run_end *end);

// Flushes, rewrites the session row, closes every handle in reverse order and frees the recorder.
// NULL is a no-op (DS_OK). Always frees; returns the first error (including an earlier failure).
enum ds_status ds_recorder_close(ds_recorder_t *rec);

// Clears the "open for write" flags that a writer killed mid-run leaves in the file, so readers
// that do not use SWMR can open it (like `h5clear -s`). Refuses if a writer is alive.
// Errors: DS_ERR_IO.
enum ds_status ds_recorder_recover(const char *path);

// Call once at program start, before any HDF5 call: keeps HDF5 from closing files at exit. After
// a failed write (a full disk) HDF5 1.10 can crash while closing the damaged file in its exit
// handler; the recorder closes what it can itself, and the file stays as of its last good flush.
void ds_recorder_library_init(void);

// ---- signals (pattern for the run loop) ----
//
//   ds_recorder_catch_signals();            // once, before the loop
//   while (work && !ds_recorder_stop_requested()) { ...append...; every N steps: flush }
//   if (ds_recorder_stop_requested()) set_end(status = DS_REC_SESSION_INTERRUPTED)
//   ds_recorder_close(rec);                 // flushes: everything appended is kept
//
// SIGINT and SIGTERM set a flag (a second SIGINT kills the process the default way); SIGXFSZ is
// ignored so that exceeding a file-size limit becomes a write error, not a kill. SIGKILL cannot be
// caught: the file then holds everything up to the last flush. Errors: DS_ERR_IO (sigaction).
enum ds_status ds_recorder_catch_signals(void);
// Nonzero once SIGINT or SIGTERM arrived (after ds_recorder_catch_signals).
int ds_recorder_stop_requested(void);

#ifdef __cplusplus
}
#endif
#endif // DS_RECORD_H
