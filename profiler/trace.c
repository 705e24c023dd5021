// Kernel timings (ds/trace.h): NVTX phase ranges, CUDA-event phase times, CUPTI activity records
// tagged with (step, phase) through external correlation ids, the decode baseline and the
// overhead measurement.
//
// Data flow at level kernels:
//   launch thread: phase_begin → NVTX push, begin event, cuptiActivityPushExternalCorrelationId
//   CUPTI thread:  buffer_requested hands out 1 MiB buffers (by default) from a capped pool;
//                  buffer_completed only queues the filled buffer (a FIFO), adds CUPTI's
//                  dropped-record count and wakes the worker
//   worker thread: pops the FIFO in order; parses a buffer: external correlation records go into
//                  a correlation-id map, kernel records wait until their id resolves; resolved
//                  rows (raw CUPTI times) are published to `ready`. A marker in the FIFO (queued
//                  by the recorder's thread right after a forced flush) is an ageing point, or a
//                  discard; collect waits until the worker has passed its marker
//   poll/collect:  (recorder's thread) forced flush by policy → marker; takes `ready` with a
//                  pointer swap → rows in session time → recorder and sink (the recorder is
//                  single-threaded, so rows are only appended here)
// The correlation map is two fixed open-addressing tables (since the last forced flush, and the
// one before), swapped at each ageing marker: a CUDA graph launch has one correlation id for all
// its kernels, so entries are not removed on a match but age out after two forced flushes.
//
// Clocks: kernel records carry CUPTI timestamps (cuptiGetTimestamp's clock); the offset to the
// session clock is measured at create and whenever rows are taken from the worker (bracketed by
// two session-clock reads).
// Phase events are placed relative to an anchor event recorded on the idle stream at the end of
// each collect, whose session time is the midpoint of the host reads around its completion;
// durations come from elapsed(begin, end) directly (cudaEventElapsedTime: about 0.5 µs).
#include "ds/trace.h"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds/check.h"
#include "ds/device.h"

#define DEFAULT_BUFFER_BYTES ((size_t)1 << 20) // a few steps of a real model's records
#define DEFAULT_MAX_BUFFER_BYTES ((size_t)128 << 20)
#define DEFAULT_MAX_RANGES 8192
#define MAX_DEPTH 8
#define EXT_STEP_MAX ((UINT64_C(1) << 47) - 1)
#define EXT_TAG (UINT64_C(1) << 63)
#define CORR_BITS 18 // 262144 slots per table: hundreds of steps of a 120b model's launches
#define CORR_FLUSH_LOAD ((size_t)1 << (CORR_BITS - 1)) // poll forces a flush at half load
#define WAIT_FLUSH_LOAD ((size_t)1 << 18) // ... or when this many kernels wait for their id
#define WAIT_FLUSHES 2 // forced flushes a kernel record waits for its external correlation
#define MAX_MARKS 8 // ageing/discard markers queued and not yet passed by the worker
#define ANCHOR_PERIOD_NS UINT64_C(100000000) // poll re-anchors phase events every 100 ms at most

// The newest kernel record of the CUPTI we build against (same toolkit at run time).
#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 kernel_record;
#else
typedef CUpti_ActivityKernel9 kernel_record;
#endif

// Kinds by API records mode (enum ds_trace_api): the first two always, then the API kinds.
static const CUpti_ActivityKind cupti_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};
static const size_t n_kinds_of[] = {2, 2, 3, 4}; // UNSET NONE RUNTIME ALL


struct open_phase {
    uint64_t step;
    uint16_t batch;
    uint8_t phase, draft_step;
    int32_t slot; // index into pend/events, -1 when no event (level off, paused, ring full)
    bool pushed;  // an external correlation id was pushed for it
};

struct pend_range {
    struct ds_rec_range row; // times filled at collect
    bool closed;
    bool shared_begin; // begins at the end event of the range just before it (ds_trace_phase_next)
};

struct corr_entry {
    uint32_t corr; // 0 = empty (CUPTI correlation ids start at 1)
    uint64_t ext;
};

// A kernel record copied out of its buffer, waiting for its external correlation (worker), or
// resolved and waiting for the recorder's thread (ready/taken).
struct waiting_kernel {
    struct ds_rec_kernel row; // times in CUPTI ns until taken; step/phase once resolved
    const char *name;         // CUPTI's, shared by every record of the kernel
    int age;                  // forced flushes waited
};

enum { MARK_NONE = 0, MARK_AGE, MARK_DISCARD };

// An entry of the FIFO from CUPTI's thread (buffers) and the recorder's thread (markers).
struct done_buf {
    uint8_t *p; // NULL for a marker
    size_t valid;
    int mark;
};

#define NAME_CACHE 512 // CUPTI name pointer → interned id (direct-mapped)

struct ds_trace {
    enum ds_rec_trace_level level;
    ds_recorder_t *rec;
    struct ds_trace_options opt;
    bool paused;
    struct timespec t0; // session clock when rec is NULL

    // phases
    cudaStream_t stream;
    bool stream_set;
    struct open_phase stack[MAX_DEPTH];
    int depth;
    struct pend_range *pend; // (max_ranges) ranges opened since the last collect, in begin order
    cudaEvent_t *ev_begin, *ev_end; // (max_ranges) events of pend[i]
    size_t n_pend;
    cudaEvent_t anchor;
    uint64_t anchor_ns;
    char draft_names[256][16]; // NVTX messages "draft_step_<k>"

    // collect outputs
    struct ds_rec_range *ranges_out; // (max_ranges)
    size_t n_ranges_out;
    struct ds_trace_step_times *times; // (max_ranges)
    size_t n_times;
    struct ds_rec_kernel *kernels_out;
    size_t n_kernels_out, cap_kernels_out;

    // CUPTI (kernels level)
    bool cupti_on;
    uint8_t **free_bufs;
    size_t n_free;
    struct done_buf *done;            // FIFO ring (g_mu): buffers, then markers
    size_t done_head, n_done, done_cap; // done_cap = max_bufs + MAX_MARKS: never overflows
    size_t n_alloc, max_bufs;           // free_bufs holds at most max_bufs
    uint64_t dropped_cupti;             // guarded by g_mu
    uint64_t buffers_done;              // guarded by g_mu
    enum ds_trace_api api;

    // worker thread; fields under g_mu unless "worker only"
    pthread_t worker;
    bool worker_started, quit;
    pthread_cond_t wake, idle; // wake: FIFO entry or quit; idle: a marker passed
    bool conds_made;
    uint64_t marks_queued, marks_done;
    struct waiting_kernel *ready; // resolved rows published for the recorder's thread
    size_t n_ready, cap_ready;
    size_t corr_load_pub;               // corr_load as last published
    size_t waiting_pub;                 // n_waiting as last published
    uint64_t w_unattributed, w_drains, w_parse_ns, w_correlations, w_corr_lost;
    size_t w_nomem;                     // records the worker had no memory for (0: none)
    struct corr_entry *corr_cur, *corr_prev; // worker only
    size_t corr_load;                        // worker only: entries in corr_cur
    uint64_t corr_made;                      // worker only: entries made since create
    uint64_t corr_lost;                      // worker only: entries that did not fit (corr_put)
    struct waiting_kernel *waiting;          // worker only
    size_t n_waiting, cap_waiting;
    struct waiting_kernel *wout;             // worker only: rows resolved, not yet published
    size_t n_wout, cap_wout;

    // recorder's thread: rows taken from the worker
    struct waiting_kernel *taken;
    size_t cap_taken;
    struct {
        const char *p;
        uint32_t id;
    } names[NAME_CACHE];
    int64_t cupti_offset;   // session ns - CUPTI ns
    uint64_t last_flush;    // mono_ns of the last forced flush
    uint64_t flush_cost_ns; // host time of the last forced flush call
    uint64_t wait_cost_ns;  // host time the last collect waited for the worker
    uint64_t anchor_mono;   // mono_ns of the last anchor
    bool quiet;             // parse but write nothing (overhead measurement)
    ds_trace_kernel_sink sink;
    void *sink_user;

    struct ds_trace_stats st;
};

// CUPTI's activity callbacks carry no user pointer: the one kernels-level trace is global.
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ds_trace_t *g_active;
static bool g_callbacks_registered;

// ---------------------------------------------------------------------------------------------
// Names, ids, pure helpers

static const char *const level_names[DS_REC_TRACE_COUNT] = {"off", "phases", "kernels"};
static const char *const phase_names[DS_REC_PHASE_COUNT] = {
    "prefill", "draft_extend", "draft_step", "verify", "accept", "sample"};

const char *ds_trace_level_name(enum ds_rec_trace_level level) {
    return (unsigned)level < DS_REC_TRACE_COUNT ? level_names[level] : NULL;
}

const char *ds_trace_phase_name(enum ds_rec_phase phase) {
    return (unsigned)phase < DS_REC_PHASE_COUNT ? phase_names[phase] : NULL;
}

enum ds_status ds_trace_level_parse(const char *text, enum ds_rec_trace_level *level_out) {
    if (!text || !level_out) return ds_error_set(DS_ERR_ARG, "trace: NULL argument");
    for (int i = 0; i < DS_REC_TRACE_COUNT; i++) {
        if (!strcmp(text, level_names[i])) {
            *level_out = (enum ds_rec_trace_level)i;
            return DS_OK;
        }
    }
    return ds_error_set(DS_ERR_ARG, "--trace: unknown level \"%s\" (off, phases or kernels)", text);
}

static const char *const api_names[] = {NULL, "none", "runtime", "all"};

const char *ds_trace_api_name(enum ds_trace_api api) {
    return (unsigned)api <= DS_TRACE_API_ALL ? api_names[api] : NULL;
}

enum ds_status ds_trace_api_parse(const char *text, enum ds_trace_api *api_out) {
    if (!text || !api_out) return ds_error_set(DS_ERR_ARG, "trace: NULL argument");
    for (int i = DS_TRACE_API_NONE; i <= DS_TRACE_API_ALL; i++) {
        if (!strcmp(text, api_names[i])) {
            *api_out = (enum ds_trace_api)i;
            return DS_OK;
        }
    }
    if (!strcmp(text, "0") || !strcmp(text, "1")) {
        *api_out = text[0] == '0' ? DS_TRACE_API_NONE : DS_TRACE_API_ALL;
        return DS_OK;
    }
    if (!strcmp(text, "launch"))
        return ds_error_set(DS_ERR_ARG,
                            "DS_TRACE_API_RECORDS: \"launch\" was removed (records of the launch "
                            "calls alone carry no external correlation); use runtime or all");
    return ds_error_set(DS_ERR_ARG,
                        "DS_TRACE_API_RECORDS: unknown value \"%s\" (none, runtime, all, 0 or 1)",
                        text);
}

uint64_t ds_trace_ext_id(uint64_t step, enum ds_rec_phase phase, unsigned draft_step) {
    return EXT_TAG | (step & EXT_STEP_MAX) << 16 | (uint64_t)((unsigned)phase & 0xff) << 8 |
           (draft_step & 0xff);
}

// The decode without a message (the worker thread joins with it).
static bool ext_decode(uint64_t id, uint64_t *step, enum ds_rec_phase *phase, unsigned *dstep) {
    unsigned ph = (unsigned)(id >> 8) & 0xff, ds = (unsigned)id & 0xff;
    if (!(id & EXT_TAG) || ph >= DS_REC_PHASE_COUNT ||
        (ph == DS_REC_PHASE_DRAFT_STEP) != (ds != 0))
        return false;
    *step = (id >> 16) & EXT_STEP_MAX;
    *phase = (enum ds_rec_phase)ph;
    *dstep = ds;
    return true;
}

enum ds_status ds_trace_ext_id_decode(uint64_t id, uint64_t *step_out,
                                      enum ds_rec_phase *phase_out, unsigned *draft_step_out) {
    if (!step_out || !phase_out || !draft_step_out)
        return ds_error_set(DS_ERR_ARG, "trace: NULL argument");
    if (!ext_decode(id, step_out, phase_out, draft_step_out))
        return ds_error_set(DS_ERR_RANGE, "trace: external correlation id %#llx is not ours",
                            (unsigned long long)id);
    return DS_OK;
}

// ---- short kernel names (a small subset of the Itanium C++ ABI mangling) ----

struct sn {
    const char *p;
    char *o;
    size_t n, cap;
    bool bad;
    bool cut; // a character did not fit: the output ends in "..."
};

static void sn_put(struct sn *s, const char *txt, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (s->n + 1 < s->cap) s->o[s->n++] = txt[i];
        else s->cut = true;
    }
    s->o[s->n] = 0;
}

static bool sn_source(struct sn *s) { // <len><identifier>
    if (*s->p < '1' || *s->p > '9') return false;
    char *end;
    long len = strtol(s->p, &end, 10);
    if ((long)strnlen(end, (size_t)len) < len) return false;
    sn_put(s, end, (size_t)len);
    s->p = end + len;
    return true;
}

static const char *sn_builtin(char c) {
    switch (c) {
    case 'v': return "void";
    case 'b': return "bool";
    case 'c': return "char";
    case 'a': return "signed char";
    case 'h': return "unsigned char";
    case 's': return "short";
    case 't': return "unsigned short";
    case 'i': return "int";
    case 'j': return "unsigned";
    case 'l': return "long";
    case 'm': return "unsigned long";
    case 'x': return "long long";
    case 'y': return "unsigned long long";
    case 'f': return "float";
    case 'd': return "double";
    default: return NULL;
    }
}

// One template argument: L<type><value>E, a builtin type, or a <len><name> type.
static void sn_arg(struct sn *s) {
    const char *b;
    if (*s->p == 'L') {
        s->p++;
        if (*s->p) s->p++; // the literal's type
        bool neg = *s->p == 'n';
        if (neg) s->p++, sn_put(s, "-", 1);
        const char *v = s->p;
        while (*s->p && *s->p != 'E') s->p++;
        sn_put(s, v, (size_t)(s->p - v));
        if (*s->p == 'E') s->p++;
        else s->bad = true;
    } else if ((b = sn_builtin(*s->p))) {
        sn_put(s, b, strlen(b));
        s->p++;
    } else if (!sn_source(s)) {
        sn_put(s, "?", 1);
        s->bad = true;
    }
}

char *ds_trace_short_name(const char *name, char *out, size_t cap) {
    if (!out || cap == 0) return out;
    out[0] = 0;
    if (!name) return out;
    struct sn s = {.p = name, .o = out, .cap = cap};
    if (strncmp(name, "_Z", 2) != 0) {
        sn_put(&s, name, strlen(name));
    } else {
        s.p += 2;
        if (*s.p == 'N') { // nested name: keep the last component
            s.p++;
            while (*s.p && *s.p != 'E' && *s.p != 'I') {
                const size_t n0 = s.n;
                const bool cut0 = s.cut;
                s.n = 0;
                s.cut = false;
                if (!sn_source(&s)) { // nothing written: out still holds the last component
                    s.bad = true;
                    s.n = n0, s.cut = cut0;
                    if (n0 == 0) { // not one component read (St, K...): the name as it is
                        sn_put(&s, name, strlen(name));
                        s.p = "";
                    }
                    break;
                }
            }
        } else if (!sn_source(&s)) {
            s.n = 0;
            s.cut = false;
            sn_put(&s, name, strlen(name)); // not a form we read: the name as it is
            s.p = "";
        }
        if (!s.bad && *s.p == 'I') {
            s.p++;
            sn_put(&s, "<", 1);
            for (int k = 0; *s.p && *s.p != 'E' && !s.bad; k++) {
                if (k) sn_put(&s, ",", 1);
                sn_arg(&s);
            }
            sn_put(&s, ">", 1);
        }
    }
    // Only a name cut short says so: one that fills out exactly is whole.
    if (s.cut && cap > 4) memcpy(out + cap - 4, "...", 4);
    return out;
}

void ds_trace_step_fill(const struct ds_trace_step_times *t, struct ds_rec_step *row) {
    if (!row) return;
    if (!t) {
        row->draft_ns = row->verify_ns = row->accept_ns = row->total_ns = 0;
        return;
    }
    row->draft_ns = t->phase_ns[DS_REC_PHASE_DRAFT_EXTEND] + t->phase_ns[DS_REC_PHASE_DRAFT_STEP];
    row->verify_ns = t->phase_ns[DS_REC_PHASE_VERIFY];
    row->accept_ns = t->phase_ns[DS_REC_PHASE_ACCEPT] + t->phase_ns[DS_REC_PHASE_SAMPLE];
    row->total_ns = t->end_ns > t->start_ns ? t->end_ns - t->start_ns : 0;
}

enum ds_status ds_trace_sum_ranges(const struct ds_rec_range *ranges, size_t n,
                                   struct ds_trace_step_times *out, size_t cap, size_t *n_out) {
    if (!n_out || (n && !ranges) || (cap && !out))
        return ds_error_set(DS_ERR_ARG, "trace: NULL argument");
    size_t m = 0;
    enum ds_status st = DS_OK;
    for (size_t i = 0; i < n; i++) {
        const struct ds_rec_range *r = &ranges[i];
        if (r->phase >= DS_REC_PHASE_COUNT) continue;
        // Steps arrive in order, so the step is nearly always the last one opened.
        size_t j = m;
        while (j > 0 && out[j - 1].step != r->step) j--;
        if (j == 0) {
            if (m == cap) {
                st = ds_error_set(DS_ERR_RANGE, "trace: more than %zu steps in one collect", cap);
                continue;
            }
            memset(&out[m], 0, sizeof out[m]);
            out[m].step = r->step;
            out[m].start_ns = r->start_ns;
            out[m].end_ns = r->end_ns;
            j = ++m;
        }
        struct ds_trace_step_times *t = &out[j - 1];
        if (r->start_ns < t->start_ns) t->start_ns = r->start_ns;
        if (r->end_ns > t->end_ns) t->end_ns = r->end_ns;
        t->phase_ns[r->phase] += r->end_ns > r->start_ns ? r->end_ns - r->start_ns : 0;
        t->ranges++;
    }
    *n_out = m;
    return st;
}

// ---------------------------------------------------------------------------------------------
// Clocks

static uint64_t session_ns(const ds_trace_t *t) {
    uint64_t ns = 0;
    if (t->rec && ds_recorder_elapsed_ns(t->rec, &ns) == DS_OK) return ns;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t d = (int64_t)(now.tv_sec - t->t0.tv_sec) * 1000000000 + (now.tv_nsec - t->t0.tv_nsec);
    return d > 0 ? (uint64_t)d : 0;
}

static uint64_t mono_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

// Offset from CUPTI's clock to the session clock: the tightest of three bracketed reads.
static void measure_cupti_offset(ds_trace_t *t) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t a = session_ns(t), c = 0;
        if (cuptiGetTimestamp(&c) != CUPTI_SUCCESS) return;
        uint64_t b = session_ns(t);
        if (b - a < best) {
            best = b - a;
            t->cupti_offset = (int64_t)(a + (b - a) / 2) - (int64_t)c;
        }
    }
}

static uint64_t from_cupti(const ds_trace_t *t, uint64_t ts) {
    int64_t v = (int64_t)ts + t->cupti_offset;
    return v > 0 ? (uint64_t)v : 0;
}

static enum ds_status cuda_fail(cudaError_t e, const char *what) {
    return ds_error_set(DS_ERR_NODEVICE, "trace: %s failed: %s", what, cudaGetErrorString(e));
}

// Anchors event time to session time on an idle stream, where the event completes at once. A busy
// stream keeps the old anchor, unless `wait` (set_stream, once): then it waits for the stream.
static enum ds_status anchor(ds_trace_t *t, bool wait) {
    cudaError_t e = cudaStreamQuery(t->stream);
    if (e == cudaErrorNotReady && !wait) return DS_OK;
    if (e == cudaErrorNotReady) e = cudaStreamSynchronize(t->stream);
    if (e != cudaSuccess) return cuda_fail(e, "stream");
    uint64_t a = session_ns(t);
    e = cudaEventRecord(t->anchor, t->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(t->anchor);
    if (e != cudaSuccess) return cuda_fail(e, "anchor event");
    uint64_t b = session_ns(t);
    t->anchor_ns = a + (b - a) / 2;
    t->anchor_mono = mono_ns();
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// CUPTI callbacks (CUPTI's thread, or ours inside cuptiActivityFlushAll)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = NULL;
    *size = 0;
    *max_records = 0;
    pthread_mutex_lock(&g_mu);
    ds_trace_t *t = g_active;
    if (t) {
        if (t->n_free) {
            *buffer = t->free_bufs[--t->n_free];
        } else if (t->n_alloc < t->max_bufs) {
            *buffer = aligned_alloc(8, t->opt.buffer_bytes);
            if (*buffer) t->n_alloc++;
        }
        if (*buffer) *size = t->opt.buffer_bytes;
    }
    pthread_mutex_unlock(&g_mu);
    // No buffer: CUPTI drops the records and counts them (cuptiActivityGetNumDroppedRecords).
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer,
                                      size_t size, size_t valid) {
    (void)size;
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) != CUPTI_SUCCESS) dropped = 0;
    pthread_mutex_lock(&g_mu);
    ds_trace_t *t = g_active;
    if (t && buffer) {
        // The ring has room for every buffer ever allocated plus MAX_MARKS markers.
        t->done[(t->done_head + t->n_done++) % t->done_cap] =
            (struct done_buf){.p = buffer, .valid = valid};
        t->buffers_done++;
        t->dropped_cupti += dropped;
        buffer = NULL;
        pthread_cond_signal(&t->wake);
    }
    pthread_mutex_unlock(&g_mu);
    free(buffer); // a buffer completed after release
}

static enum ds_status cupti_fail(CUptiResult r, const char *what) {
    const char *msg = "unknown CUPTI error";
    cuptiGetResultString(r, &msg);
    const char *hint = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                           ? " (another profiler, e.g. Nsight Systems, holds CUPTI: use --trace "
                             "phases under it)"
                           : "";
    return ds_error_set(DS_ERR_UNSUPPORTED, "trace: %s failed: %s%s", what, msg, hint);
}

static enum ds_status cupti_enable(const ds_trace_t *t, bool on) {
    const size_t n = n_kinds_of[t->api];
    for (size_t i = 0; i < n; i++) {
        CUptiResult r = on ? cuptiActivityEnable(cupti_kinds[i]) : cuptiActivityDisable(cupti_kinds[i]);
        if (r != CUPTI_SUCCESS && on) {
            for (size_t j = 0; j < i; j++) (void)cuptiActivityDisable(cupti_kinds[j]);
            return cupti_fail(r, "cuptiActivityEnable");
        }
    }
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Correlation map

static uint32_t corr_hash(uint32_t c) { return (c * 2654435761u) >> (32 - CORR_BITS); }

// 1: a new entry, 0: an existing one updated, -1: probe run too long (table too full: the kernel
// stays unattributed).
static int corr_put(struct corr_entry *m, uint32_t corr, uint64_t ext) {
    uint32_t mask = (1u << CORR_BITS) - 1;
    for (uint32_t i = corr_hash(corr), n = 0; n < 64; i = (i + 1) & mask, n++) {
        if (m[i].corr == 0 || m[i].corr == corr) {
            int fresh = m[i].corr == 0;
            m[i].corr = corr;
            m[i].ext = ext;
            return fresh;
        }
    }
    return -1;
}

static bool corr_get(const struct corr_entry *m, uint32_t corr, uint64_t *ext) {
    uint32_t mask = (1u << CORR_BITS) - 1;
    for (uint32_t i = corr_hash(corr), n = 0; n < 64 && m[i].corr; i = (i + 1) & mask, n++) {
        if (m[i].corr == corr) {
            *ext = m[i].ext;
            return true;
        }
    }
    return false;
}

// ---------------------------------------------------------------------------------------------
// Create / release

static void *worker_main(void *arg);
static void stop_worker(ds_trace_t *t);

static void free_trace(ds_trace_t *t) {
    if (!t) return;
    stop_worker(t);
    if (t->pend) {
        for (size_t i = 0; i < t->opt.max_ranges; i++) {
            if (t->ev_begin && t->ev_begin[i]) cudaEventDestroy(t->ev_begin[i]);
            if (t->ev_end && t->ev_end[i]) cudaEventDestroy(t->ev_end[i]);
        }
    }
    if (t->anchor) cudaEventDestroy(t->anchor);
    for (size_t i = 0; i < t->n_free; i++) free(t->free_bufs[i]);
    for (size_t i = 0; i < t->n_done; i++) free(t->done[(t->done_head + i) % t->done_cap].p);
    if (t->conds_made) {
        pthread_cond_destroy(&t->wake);
        pthread_cond_destroy(&t->idle);
    }
    free(t->free_bufs);
    free(t->done);
    free(t->corr_cur);
    free(t->corr_prev);
    free(t->waiting);
    free(t->wout);
    free(t->ready);
    free(t->taken);
    free(t->pend);
    free(t->ev_begin);
    free(t->ev_end);
    free(t->ranges_out);
    free(t->times);
    free(t->kernels_out);
    memset(t, 0, sizeof *t);
    free(t);
}

static enum ds_status cupti_start(ds_trace_t *t) {
    enum ds_status st = DS_OK;
    pthread_mutex_lock(&g_mu);
    if (g_active) {
        pthread_mutex_unlock(&g_mu);
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "trace: a kernels-level trace already exists in this process");
    }
    g_active = t;
    pthread_mutex_unlock(&g_mu);
    CUptiResult r = CUPTI_SUCCESS;
    if (!g_callbacks_registered) {
        r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
        if (r != CUPTI_SUCCESS) {
            st = cupti_fail(r, "cuptiActivityRegisterCallbacks");
            goto cleanup;
        }
        g_callbacks_registered = true;
    }
    if ((st = cupti_enable(t, true))) goto cleanup;
    t->cupti_on = true;
    t->last_flush = mono_ns();
    measure_cupti_offset(t);
cleanup:
    if (st) {
        pthread_mutex_lock(&g_mu);
        g_active = NULL;
        pthread_mutex_unlock(&g_mu);
    }
    return st;
}

// Disables the kinds, flushes what CUPTI holds into the queue (freed with the trace) and detaches.
static void cupti_stop(ds_trace_t *t) {
    if (!t->cupti_on) return;
    (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    (void)cupti_enable(t, false);
    (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&g_mu);
    if (g_active == t) g_active = NULL;
    pthread_mutex_unlock(&g_mu);
    t->cupti_on = false;
}

enum ds_status ds_trace_set_recorder(ds_trace_t *t, ds_recorder_t *rec) {
    if (!t || t->depth)
        return ds_error_set(DS_ERR_ARG, "trace: set recorder with %s",
                            t ? "a phase open" : "a NULL trace");
    t->rec = rec;
    memset(t->names, 0, sizeof t->names); // ids belong to the recorder
    return DS_OK;
}

enum ds_status ds_trace_create(enum ds_rec_trace_level level, ds_recorder_t *rec,
                               const struct ds_trace_options *opt, ds_trace_t **trace_out) {
    if (!trace_out) return ds_error_set(DS_ERR_ARG, "trace: NULL argument");
    *trace_out = NULL;
    if ((unsigned)level >= DS_REC_TRACE_COUNT)
        return ds_error_set(DS_ERR_ARG, "trace: invalid level %d", (int)level);
    struct ds_trace_options o = opt ? *opt : (struct ds_trace_options){0};
    if (!o.buffer_bytes) o.buffer_bytes = DEFAULT_BUFFER_BYTES;
    if (!o.max_buffer_bytes) o.max_buffer_bytes = DEFAULT_MAX_BUFFER_BYTES;
    if (!o.max_ranges) o.max_ranges = DEFAULT_MAX_RANGES;
    if (o.buffer_bytes % 8 || o.buffer_bytes < 4096 || o.max_buffer_bytes < o.buffer_bytes ||
        o.max_ranges > ((size_t)1 << 24) || o.api_records < DS_TRACE_API_UNSET ||
        o.api_records > DS_TRACE_API_ALL)
        return ds_error_set(DS_ERR_ARG,
                            "trace: options out of range (buffer %zu bytes, multiple of 8 and >= "
                            "4096; total %zu >= buffer; ranges %zu <= 2^24; api records %d in "
                            "0..%d)",
                            o.buffer_bytes, o.max_buffer_bytes, o.max_ranges, o.api_records,
                            (int)DS_TRACE_API_ALL);
    enum ds_trace_api api = (enum ds_trace_api)o.api_records;
    if (level == DS_REC_TRACE_KERNELS && api == DS_TRACE_API_UNSET) {
        const char *env = getenv("DS_TRACE_API_RECORDS");
        api = DS_TRACE_API_DEFAULT_MODE;
        if (env && *env && ds_trace_api_parse(env, &api) != DS_OK) return DS_ERR_ARG;
    }
    if (level != DS_REC_TRACE_OFF && ds_cuda_device_count() == 0) {
        struct ds_device_info info;
        char why[256] = "no device";
        if (ds_device_resolve(DS_DEVICE_CUDA, &info) != DS_OK)
            snprintf(why, sizeof why, "%s", ds_error_last()); // a copy: the next call reuses it
        return ds_error_set(DS_ERR_NODEVICE,
                            "no GPU: tracing is off (--trace %s needs a CUDA device: %s)",
                            level_names[level], why);
    }

    enum ds_status st = DS_OK;
    ds_trace_t *t = calloc(1, sizeof *t);
    if (!t) return ds_error_set(DS_ERR_NOMEM, "trace: out of memory");
    t->level = level;
    t->rec = rec;
    t->opt = o;
    t->api = level == DS_REC_TRACE_KERNELS ? api : DS_TRACE_API_UNSET;
    clock_gettime(CLOCK_MONOTONIC, &t->t0);
    for (int k = 1; k < 256; k++) snprintf(t->draft_names[k], sizeof t->draft_names[k],
                                           "draft_step_%d", k);
    if (level == DS_REC_TRACE_OFF) goto done;

    size_t n = o.max_ranges;
    t->pend = calloc(n, sizeof *t->pend);
    t->ev_begin = calloc(n, sizeof *t->ev_begin);
    t->ev_end = calloc(n, sizeof *t->ev_end);
    t->ranges_out = calloc(n, sizeof *t->ranges_out);
    t->times = calloc(n, sizeof *t->times);
    if (!t->pend || !t->ev_begin || !t->ev_end || !t->ranges_out || !t->times) {
        st = ds_error_set(DS_ERR_NOMEM, "trace: out of memory for %zu ranges", n);
        goto cleanup;
    }
    // CUPTI first: creating events starts the CUDA context, which may load modules.
    if (level == DS_REC_TRACE_KERNELS) {
        t->max_bufs = o.max_buffer_bytes / o.buffer_bytes;
        t->done_cap = t->max_bufs + MAX_MARKS;
        t->free_bufs = calloc(t->max_bufs, sizeof *t->free_bufs);
        t->done = calloc(t->done_cap, sizeof *t->done);
        t->corr_cur = calloc((size_t)1 << CORR_BITS, sizeof *t->corr_cur);
        t->corr_prev = calloc((size_t)1 << CORR_BITS, sizeof *t->corr_prev);
        if (!t->free_bufs || !t->done || !t->corr_cur || !t->corr_prev) {
            st = ds_error_set(DS_ERR_NOMEM, "trace: out of memory for the CUPTI tables");
            goto cleanup;
        }
        if (pthread_cond_init(&t->wake, NULL) != 0) {
            st = ds_error_set(DS_ERR_NOMEM, "trace: cannot make a condition variable");
            goto cleanup;
        }
        if (pthread_cond_init(&t->idle, NULL) != 0) {
            pthread_cond_destroy(&t->wake);
            st = ds_error_set(DS_ERR_NOMEM, "trace: cannot make a condition variable");
            goto cleanup;
        }
        t->conds_made = true;
        // The worker exists before CUPTI can complete a buffer.
        if (pthread_create(&t->worker, NULL, worker_main, t) != 0) {
            st = ds_error_set(DS_ERR_NOMEM, "trace: cannot start the CUPTI worker thread");
            goto cleanup;
        }
        t->worker_started = true;
        if ((st = cupti_start(t))) goto cleanup;
    }

    // Events are made here, once: phase calls only record them.
    cudaError_t e = cudaEventCreate(&t->anchor);
    for (size_t i = 0; i < n && e == cudaSuccess; i++) {
        e = cudaEventCreate(&t->ev_begin[i]);
        if (e == cudaSuccess) e = cudaEventCreate(&t->ev_end[i]);
    }
    if (e != cudaSuccess) {
        st = cuda_fail(e, "cudaEventCreate");
        goto cleanup;
    }

done:
    *trace_out = t;
    return DS_OK;
cleanup:
    cupti_stop(t);
    free_trace(t);
    return st;
}

void ds_trace_release(ds_trace_t *t) {
    if (!t) return;
    // Phases still open are closed so that CUPTI's id stack and an nsys timeline stay balanced.
    for (; t->depth > 0; t->depth--) {
        uint64_t id = 0;
        if (t->stack[t->depth - 1].pushed)
            (void)cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id);
        nvtxRangePop();
    }
    cupti_stop(t);
    free_trace(t);
}

void ds_trace_stats_since(struct ds_trace_stats *now, const struct ds_trace_stats *before) {
    now->ranges -= before->ranges;
    now->kernels -= before->kernels;
    now->dropped_records -= before->dropped_records;
    now->dropped_ranges -= before->dropped_ranges;
    now->unattributed -= before->unattributed;
    now->buffers -= before->buffers;
    now->flushes -= before->flushes;
    now->drains -= before->drains;
    now->flush_ns -= before->flush_ns;
    now->parse_ns -= before->parse_ns;
    now->wait_ns -= before->wait_ns;
    now->calls_ns -= before->calls_ns;
    now->correlations -= before->correlations;
    now->dropped_correlations -= before->dropped_correlations;
}

int ds_trace_cupti_registered(void) { return g_callbacks_registered ? 1 : 0; }

enum ds_rec_trace_level ds_trace_level(const ds_trace_t *t) {
    return t ? t->level : DS_REC_TRACE_OFF;
}

void ds_trace_stats(const ds_trace_t *t, struct ds_trace_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!t) return;
    *out = t->st;
    pthread_mutex_lock(&g_mu);
    out->dropped_records += t->dropped_cupti;
    out->buffers = t->buffers_done;
    out->unattributed += t->w_unattributed;
    out->drains = t->w_drains;
    out->parse_ns = t->w_parse_ns;
    out->correlations = t->w_correlations;
    out->dropped_correlations = t->w_corr_lost;
    pthread_mutex_unlock(&g_mu);
}

double ds_trace_flush_share(const ds_trace_t *t, const struct ds_trace_stats *before,
                            const struct ds_trace_stats *after, uint64_t elapsed_ns) {
    if (!t || !before || !after || t->level != DS_REC_TRACE_KERNELS) return 0.0;
    // Poll's policy: one forced flush per CORR_FLUSH_LOAD correlation entries (and per flush_ms
    // when set); the final collect of a run is one flush for the whole run, about nothing a step.
    double share = after->correlations > before->correlations
                       ? (double)(after->correlations - before->correlations) / CORR_FLUSH_LOAD
                       : 0.0;
    if (t->opt.flush_ms) {
        const double p = (double)elapsed_ns / ((double)t->opt.flush_ms * 1e6);
        if (p > share) share = p;
    }
    return share < 1.0 ? share : 1.0;
}

enum ds_status ds_trace_set_stream(ds_trace_t *t, void *stream) {
    if (!t) return ds_error_set(DS_ERR_ARG, "trace: NULL trace");
    if (t->level == DS_REC_TRACE_OFF) return DS_OK;
    t->stream = (cudaStream_t)stream;
    t->stream_set = true;
    return anchor(t, true);
}

// ---------------------------------------------------------------------------------------------
// Phases (hot path: no allocation, no synchronization)

static bool recording(const ds_trace_t *t) {
    return t->level != DS_REC_TRACE_OFF && !t->paused && t->stream_set;
}

static bool correlating(const ds_trace_t *t) { return t->cupti_on && !t->paused; }

static bool phase_args_ok(uint64_t step, enum ds_rec_phase phase, unsigned draft_step) {
    return (unsigned)phase < DS_REC_PHASE_COUNT && draft_step <= 255 &&
           (phase == DS_REC_PHASE_DRAFT_STEP) == (draft_step != 0) && step <= EXT_STEP_MAX;
}

static enum ds_status bad_phase(uint64_t step, enum ds_rec_phase phase, unsigned draft_step) {
    return ds_error_set(DS_ERR_ARG, "trace: bad phase %d / draft step %u / step %llu", (int)phase,
                        draft_step, (unsigned long long)step);
}

// Pushes a phase (arguments checked, depth < MAX_DEPTH): NVTX, external id, and a pending range
// whose begin event is recorded here, or, when `shared_from` >= 0, is the end event just
// recorded for the range in that slot (the last one), so nothing more is recorded.
static void push_phase(ds_trace_t *t, uint64_t step, enum ds_rec_phase phase, unsigned draft_step,
                       unsigned batch, int32_t shared_from) {
    struct open_phase *p = &t->stack[t->depth++];
    p->step = step;
    p->batch = batch > UINT16_MAX ? UINT16_MAX : (uint16_t)batch;
    p->phase = (uint8_t)phase;
    p->draft_step = (uint8_t)draft_step;
    p->slot = -1;
    p->pushed = false;

    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = draft_step ? t->draft_names[draft_step] : phase_names[phase];
    a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
    a.payload.ullValue = step;
    nvtxRangePushEx(&a);

    if (correlating(t)) {
        DS_CUPTI_CHECK(cuptiActivityPushExternalCorrelationId(
            CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, ds_trace_ext_id(step, phase, draft_step)));
        p->pushed = true;
    }
    if (!recording(t)) return;
    if (t->n_pend == t->opt.max_ranges) {
        t->st.dropped_ranges++;
        return;
    }
    p->slot = (int32_t)t->n_pend++;
    struct pend_range *r = &t->pend[p->slot];
    memset(r, 0, sizeof *r);
    r->row.step = step;
    r->row.batch_size = p->batch;
    r->row.phase = p->phase;
    r->row.draft_step = p->draft_step;
    r->shared_begin = shared_from >= 0 && shared_from == p->slot - 1;
    if (!r->shared_begin) DS_CUDA_CHECK(cudaEventRecord(t->ev_begin[p->slot], t->stream));
}

// Pops the innermost phase; `record_end`: its end event is recorded (else the caller did).
static void pop_phase(ds_trace_t *t, bool record_end) {
    struct open_phase *p = &t->stack[--t->depth];
    if (p->slot >= 0) {
        if (record_end) DS_CUDA_CHECK(cudaEventRecord(t->ev_end[p->slot], t->stream));
        t->pend[p->slot].closed = true;
    }
    if (p->pushed) {
        uint64_t id = 0;
        DS_CUPTI_CHECK(
            cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id));
    }
    nvtxRangePop();
}

enum ds_status ds_trace_phase_begin(ds_trace_t *t, uint64_t step, enum ds_rec_phase phase,
                                    unsigned draft_step, unsigned batch) {
    if (!t) return DS_OK;
    if (!phase_args_ok(step, phase, draft_step)) return bad_phase(step, phase, draft_step);
    if (t->depth == MAX_DEPTH)
        return ds_error_set(DS_ERR_ARG, "trace: phases nested deeper than %d", MAX_DEPTH);
    const uint64_t a = t->level != DS_REC_TRACE_OFF ? mono_ns() : 0; // off: nothing to count
    push_phase(t, step, phase, draft_step, batch, -1);
    if (a) t->st.calls_ns += mono_ns() - a;
    return DS_OK;
}

enum ds_status ds_trace_phase_end(ds_trace_t *t) {
    if (!t) return DS_OK;
    if (t->depth == 0) return ds_error_set(DS_ERR_ARG, "trace: phase end without a phase begin");
    const uint64_t a = t->level != DS_REC_TRACE_OFF ? mono_ns() : 0;
    pop_phase(t, true);
    if (a) t->st.calls_ns += mono_ns() - a;
    return DS_OK;
}

enum ds_status ds_trace_phase_next(ds_trace_t *t, uint64_t step, enum ds_rec_phase phase,
                                   unsigned draft_step, unsigned batch) {
    if (!t) return DS_OK;
    if (!phase_args_ok(step, phase, draft_step)) return bad_phase(step, phase, draft_step);
    if (t->depth == 0) return ds_error_set(DS_ERR_ARG, "trace: phase next without an open phase");
    const uint64_t a = t->level != DS_REC_TRACE_OFF ? mono_ns() : 0;
    // One event is both the closing phase's end and the next one's begin, when the closing
    // phase's range is the last one pending (the next range then directly follows it).
    const int32_t slot = t->stack[t->depth - 1].slot;
    const bool share = slot >= 0 && (size_t)slot + 1 == t->n_pend && recording(t) &&
                       t->n_pend < t->opt.max_ranges;
    if (slot >= 0) DS_CUDA_CHECK(cudaEventRecord(t->ev_end[slot], t->stream));
    pop_phase(t, false);
    push_phase(t, step, phase, draft_step, batch, share ? slot : -1);
    if (a) t->st.calls_ns += mono_ns() - a;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Collect

// Doubling growth; false when out of memory (the worker reports through the recorder's thread).
static bool grow_to(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static enum ds_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    return grow_to(p, cap, need, elem)
               ? DS_OK
               : ds_error_set(DS_ERR_NOMEM, "trace: out of memory for %zu records", need);
}

// Closed ranges → rows (session time); open ones move to the front with their events. A range
// that begins at its predecessor's end event (shared_begin) sits right after it: both closed, the
// predecessor's row is the previous one and its end is this range's start; an open one takes the
// shared event as its own begin event before it moves (the predecessor, closed, is done with).
static enum ds_status collect_ranges(ds_trace_t *t) {
    t->n_ranges_out = 0;
    size_t keep = 0;
    for (size_t i = 0; i < t->n_pend; i++) {
        if (!t->pend[i].closed && t->pend[i].shared_begin) {
            DS_ASSERT(i > 0 && t->pend[i - 1].closed);
            cudaEvent_t b = t->ev_begin[i];
            t->ev_begin[i] = t->ev_end[i - 1];
            t->ev_end[i - 1] = b;
            t->pend[i].shared_begin = false;
        }
        if (!t->pend[i].closed) {
            // An open phase: keep it (and its slot on the stack) for the next collect.
            if (keep != i) {
                struct pend_range r = t->pend[keep];
                cudaEvent_t b = t->ev_begin[keep], e = t->ev_end[keep];
                t->pend[keep] = t->pend[i];
                t->ev_begin[keep] = t->ev_begin[i];
                t->ev_end[keep] = t->ev_end[i];
                t->pend[i] = r;
                t->ev_begin[i] = b;
                t->ev_end[i] = e;
                for (int d = 0; d < t->depth; d++)
                    if (t->stack[d].slot == (int32_t)i) t->stack[d].slot = (int32_t)keep;
            }
            keep++;
            continue;
        }
        // The predecessor of a shared range is closed, so it was the previous row made here.
        const bool shared = t->pend[i].shared_begin;
        DS_ASSERT(!shared || (i > 0 && t->pend[i - 1].closed && t->n_ranges_out > 0));
        cudaEvent_t begin = shared ? t->ev_end[i - 1] : t->ev_begin[i];
        float begin_ms = 0, dur_ms = 0;
        cudaError_t e = cudaEventSynchronize(t->ev_end[i]);
        if (e == cudaSuccess && !shared) e = cudaEventElapsedTime(&begin_ms, t->anchor, begin);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&dur_ms, begin, t->ev_end[i]);
        if (e != cudaSuccess) return cuda_fail(e, "phase event");
        struct ds_rec_range *row = &t->ranges_out[t->n_ranges_out++];
        *row = t->pend[i].row;
        if (shared) {
            row->start_ns = row[-1].end_ns;
        } else {
            int64_t start = (int64_t)t->anchor_ns + (int64_t)((double)begin_ms * 1e6);
            row->start_ns = start > 0 ? (uint64_t)start : 0;
        }
        row->end_ns = row->start_ns + (uint64_t)((double)(dur_ms > 0 ? dur_ms : 0) * 1e6);
    }
    t->n_pend = keep;
    return DS_OK;
}

// ---- worker thread (level kernels): parse and join off the recorder's thread ----

// Copies one kernel record into the waiting list, CUPTI times as they are (worker only).
static bool take_kernel(ds_trace_t *t, const kernel_record *k) {
    if (!grow_to((void **)&t->waiting, &t->cap_waiting, t->n_waiting + 1, sizeof *t->waiting))
        return false;
    struct waiting_kernel *w = &t->waiting[t->n_waiting++];
    memset(w, 0, sizeof *w);
    struct ds_rec_kernel *r = &w->row;
    r->start_ns = k->start;
    r->end_ns = k->end;
    r->graph_node = k->graphNodeId;
    r->stream = k->streamId;
    r->grid_x = (uint32_t)k->gridX;
    r->grid_y = (uint32_t)k->gridY;
    r->grid_z = (uint32_t)k->gridZ;
    r->block_x = (uint32_t)k->blockX;
    r->block_y = (uint32_t)k->blockY;
    r->block_z = (uint32_t)k->blockZ;
    r->static_smem = (uint32_t)k->staticSharedMemory;
    r->dynamic_smem = (uint32_t)k->dynamicSharedMemory;
    r->correlation = k->correlationId;
    r->registers = k->registersPerThread;
    w->name = k->name;
    return true;
}

// Kernel records into the waiting list, external correlations into the map. Returns the records
// lost for want of memory (worker only).
static size_t parse_buffer(ds_trace_t *t, const struct done_buf *b) {
    size_t lost = 0;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(b->p, b->valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            if (!take_kernel(t, (const kernel_record *)rec)) lost++;
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
            const CUpti_ActivityExternalCorrelation *x =
                (const CUpti_ActivityExternalCorrelation *)rec;
            if (x->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
                // A correlation that does not fit leaves its kernel unattributed: counted apart,
                // so that it is not mistaken for a launch outside every phase.
                const int put = corr_put(t->corr_cur, x->correlationId, x->externalId);
                if (put == 1) t->corr_load++, t->corr_made++;
                if (put < 0) t->corr_lost++;
            }
        }
    }
    return lost;
}

// Waiting kernels whose external correlation is known → wout; the others wait. Ageing happens
// only at ageing markers (`aged`), which follow forced flushes: a forced flush delivers every
// record of finished work, so a kernel whose correlation has not come after two of them never
// will (launched outside every phase), and a correlation entry older than two forced flushes has
// no kernel left to come. Returns the records left waiting for want of memory (worker only).
static size_t resolve_kernels(ds_trace_t *t, bool aged, uint64_t *unattributed) {
    if (!grow_to((void **)&t->wout, &t->cap_wout, t->n_wout + t->n_waiting, sizeof *t->wout))
        return t->n_waiting; // they keep waiting; the recorder's thread reports the failure
    size_t keep = 0;
    for (size_t i = 0; i < t->n_waiting; i++) {
        struct waiting_kernel *w = &t->waiting[i];
        uint64_t ext = 0, step = 0;
        enum ds_rec_phase phase = DS_REC_PHASE_PREFILL; // written by the decode on success
        unsigned dstep = 0;
        bool found = corr_get(t->corr_cur, w->row.correlation, &ext) ||
                     corr_get(t->corr_prev, w->row.correlation, &ext);
        if (found && ext_decode(ext, &step, &phase, &dstep)) {
            struct waiting_kernel *r = &t->wout[t->n_wout++];
            *r = *w;
            r->row.step = step;
            r->row.phase = (uint8_t)phase;
            r->row.draft_step = (uint8_t)dstep;
        } else if (aged && ++w->age >= WAIT_FLUSHES) {
            (*unattributed)++;
        } else {
            t->waiting[keep++] = *w;
        }
    }
    t->n_waiting = keep;
    if (aged) {
        // Age the correlation tables: entries live for two forced flushes.
        struct corr_entry *old = t->corr_prev;
        t->corr_prev = t->corr_cur;
        t->corr_cur = old;
        memset(t->corr_cur, 0, ((size_t)1 << CORR_BITS) * sizeof *t->corr_cur);
        t->corr_load = 0;
    }
    return 0;
}

// Moves wout to ready (g_mu held): a pointer swap when ready is empty (the usual case), else an
// append; with no memory the rows stay in wout for the next try.
static void publish(ds_trace_t *t) {
    if (!t->n_wout) return;
    if (!t->n_ready) {
        struct waiting_kernel *p = t->ready;
        size_t c = t->cap_ready;
        t->ready = t->wout, t->cap_ready = t->cap_wout, t->n_ready = t->n_wout;
        t->wout = p, t->cap_wout = c, t->n_wout = 0;
    } else if (grow_to((void **)&t->ready, &t->cap_ready, t->n_ready + t->n_wout,
                       sizeof *t->ready)) {
        memcpy(t->ready + t->n_ready, t->wout, t->n_wout * sizeof *t->wout);
        t->n_ready += t->n_wout;
        t->n_wout = 0;
    }
}

static void *worker_main(void *arg) {
    ds_trace_t *t = arg;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!t->quit && t->n_done == 0) pthread_cond_wait(&t->wake, &g_mu);
        if (t->n_done == 0) break; // quit, and nothing left
        struct done_buf b = t->done[t->done_head];
        t->done_head = (t->done_head + 1) % t->done_cap;
        t->n_done--;
        const bool quit = t->quit;
        pthread_mutex_unlock(&g_mu);

        const uint64_t a = mono_ns();
        size_t lost = 0;
        uint64_t unattributed = 0;
        if (quit) {
            // Release: nothing will be taken any more.
        } else if (b.mark == MARK_DISCARD) {
            t->n_waiting = t->n_wout = 0;
            memset(t->corr_cur, 0, ((size_t)1 << CORR_BITS) * sizeof *t->corr_cur);
            memset(t->corr_prev, 0, ((size_t)1 << CORR_BITS) * sizeof *t->corr_prev);
            t->corr_load = 0;
        } else {
            if (b.p) lost = parse_buffer(t, &b);
            lost += resolve_kernels(t, b.mark == MARK_AGE, &unattributed);
        }
        const uint64_t dt = mono_ns() - a;

        pthread_mutex_lock(&g_mu);
        if (b.p) {
            t->free_bufs[t->n_free++] = b.p;
            t->w_drains++;
        }
        if (b.mark == MARK_DISCARD) t->n_ready = 0;
        else publish(t);
        t->w_nomem += lost;
        t->w_unattributed += unattributed;
        t->w_parse_ns += dt;
        t->corr_load_pub = t->corr_load;
        t->waiting_pub = t->n_waiting;
        t->w_correlations = t->corr_made;
        t->w_corr_lost = t->corr_lost;
        if (b.mark) {
            t->marks_done++;
            pthread_cond_broadcast(&t->idle);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static void stop_worker(ds_trace_t *t) {
    if (!t->worker_started) return;
    pthread_mutex_lock(&g_mu);
    t->quit = true;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&g_mu);
    pthread_join(t->worker, NULL);
    t->worker_started = false;
}

// ---- the recorder's thread ----

// Forced flush (timed: the overhead measurement charges it), then counted.
static enum ds_status force_flush(ds_trace_t *t) {
    uint64_t a = mono_ns();
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    t->last_flush = mono_ns();
    t->flush_cost_ns = t->last_flush - a;
    t->st.flushes++;
    t->st.flush_ns += t->flush_cost_ns;
    return r == CUPTI_SUCCESS ? DS_OK : cupti_fail(r, "cuptiActivityFlushAll");
}

// A forced flush, then a marker behind the buffers it delivered; `wait`: until the worker has
// passed the marker (every record of finished work parsed, joined and published).
static enum ds_status flush_mark(ds_trace_t *t, int mark, bool wait) {
    const uint64_t a = mono_ns();
    pthread_mutex_lock(&g_mu);
    while (t->marks_queued - t->marks_done >= MAX_MARKS) pthread_cond_wait(&t->idle, &g_mu);
    pthread_mutex_unlock(&g_mu);
    uint64_t waited = mono_ns() - a;
    enum ds_status st = force_flush(t);
    if (st) return st;
    pthread_mutex_lock(&g_mu);
    t->done[(t->done_head + t->n_done++) % t->done_cap] = (struct done_buf){.mark = mark};
    const uint64_t seq = ++t->marks_queued;
    pthread_cond_signal(&t->wake);
    const uint64_t b = mono_ns();
    while (wait && t->marks_done < seq) pthread_cond_wait(&t->idle, &g_mu);
    pthread_mutex_unlock(&g_mu);
    waited += mono_ns() - b;
    t->wait_cost_ns = waited;
    t->st.wait_ns += waited;
    return DS_OK;
}

// The interned id of a CUPTI kernel name: CUPTI gives every record of a kernel the same pointer,
// so a pointer cache spares the string hash per row.
static enum ds_status intern_name(ds_trace_t *t, const char *name, uint32_t *id) {
    const size_t h = (size_t)(((uintptr_t)name >> 4) * 2654435761u) % NAME_CACHE;
    if (t->names[h].p == name) {
        *id = t->names[h].id;
        return DS_OK;
    }
    enum ds_status st = ds_recorder_intern(t->rec, name, id);
    if (!st) t->names[h].p = name, t->names[h].id = *id;
    return st;
}

// Takes the rows the worker published (a pointer swap under the lock), then converts their times
// to the session clock, interns names and hands them to the sink.
static enum ds_status take_rows(ds_trace_t *t) {
    t->n_kernels_out = 0;
    pthread_mutex_lock(&g_mu);
    struct waiting_kernel *rows = t->ready;
    const size_t n = t->n_ready, cap = t->cap_ready, nomem = t->w_nomem;
    t->ready = t->taken, t->cap_ready = t->cap_taken, t->n_ready = 0;
    t->taken = rows, t->cap_taken = cap;
    t->w_nomem = 0;
    pthread_mutex_unlock(&g_mu);
    if (nomem)
        return ds_error_set(DS_ERR_NOMEM, "trace: out of memory for %zu kernel records", nomem);
    if (!n) return DS_OK;
    enum ds_status st = grow((void **)&t->kernels_out, &t->cap_kernels_out, n,
                             sizeof *t->kernels_out);
    if (st) return st;
    measure_cupti_offset(t);
    for (size_t i = 0; i < n; i++) {
        struct ds_rec_kernel *r = &t->kernels_out[i];
        *r = rows[i].row;
        r->start_ns = from_cupti(t, r->start_ns);
        r->end_ns = from_cupti(t, r->end_ns);
        r->name = 0;
        if (t->rec && rows[i].name && (st = intern_name(t, rows[i].name, &r->name))) return st;
        if (t->sink && !t->quiet) t->sink(t->sink_user, r, rows[i].name ? rows[i].name : "?");
    }
    t->n_kernels_out = n;
    return DS_OK;
}

// Kernel rows: a forced flush (and a wait for the worker) when `force`. Poll never waits, and
// forces a flush only when the worker's join state needs an ageing point: the correlation table
// half full, or too many kernel records waiting for their id (kernels launched outside every
// phase never get one); or, when the caller set flush_ms, once that period has passed. Otherwise
// rows arrive as CUPTI completes buffers on its own (a forced flush costs the recorder's thread
// milliseconds; a completed buffer costs it nothing).
static enum ds_status gather_kernels(ds_trace_t *t, bool force) {
    t->n_kernels_out = 0;
    if (!t->cupti_on) return DS_OK;
    bool flush = force;
    if (!flush) {
        pthread_mutex_lock(&g_mu);
        const uint64_t pending = t->marks_queued - t->marks_done;
        const bool full = (t->corr_load_pub >= CORR_FLUSH_LOAD ||
                           t->waiting_pub >= WAIT_FLUSH_LOAD) && pending == 0;
        pthread_mutex_unlock(&g_mu);
        const bool period = t->opt.flush_ms &&
                            mono_ns() - t->last_flush >= (uint64_t)t->opt.flush_ms * 1000000u;
        flush = pending < MAX_MARKS - 1 && (full || period);
    }
    enum ds_status st = flush ? flush_mark(t, MARK_AGE, force) : DS_OK;
    return st ? st : take_rows(t);
}

// collect (force) and poll: ranges always, kernel records by policy, rows out.
static enum ds_status gather(ds_trace_t *t, bool force, const struct ds_trace_step_times **times_out,
                             size_t *n_out) {
    if (times_out) *times_out = NULL;
    if (n_out) *n_out = 0;
    if (!times_out || !n_out) return ds_error_set(DS_ERR_ARG, "trace: NULL argument");
    if (!t || t->level == DS_REC_TRACE_OFF) return DS_OK;
    enum ds_status st = collect_ranges(t);
    if (!st) st = gather_kernels(t, force);
    if (st) return st;
    t->n_times = 0;
    if ((st = ds_trace_sum_ranges(t->ranges_out, t->n_ranges_out, t->times, t->opt.max_ranges,
                                  &t->n_times)))
        return st;
    if (t->rec && !t->quiet) {
        if ((st = ds_recorder_append_ranges(t->rec, t->ranges_out, t->n_ranges_out)) ||
            (st = ds_recorder_append_kernels(t->rec, t->kernels_out, t->n_kernels_out)))
            return st;
    }
    if (!t->quiet) { // rows of the overhead measurement are not produced for the file
        t->st.ranges += t->n_ranges_out;
        t->st.kernels += t->n_kernels_out;
    }
    // The anchor needs an idle stream and a round trip to the GPU: every collect, but at most
    // every ANCHOR_PERIOD_NS from poll (clock drift over that is far below the event resolution).
    if (t->depth == 0 && (force || mono_ns() - t->anchor_mono >= ANCHOR_PERIOD_NS) &&
        (st = anchor(t, false)))
        return st;
    *times_out = t->n_times ? t->times : NULL;
    *n_out = t->n_times;
    return DS_OK;
}

// gather, its time on the recorder's thread counted (stats.calls_ns).
static enum ds_status gather_timed(ds_trace_t *t, bool force,
                                   const struct ds_trace_step_times **times_out, size_t *n_out) {
    const bool timed = t && t->level != DS_REC_TRACE_OFF;
    const uint64_t a = timed ? mono_ns() : 0;
    enum ds_status st = gather(t, force, times_out, n_out);
    if (timed) t->st.calls_ns += mono_ns() - a;
    return st;
}

enum ds_status ds_trace_collect(ds_trace_t *t, const struct ds_trace_step_times **times_out,
                                size_t *n_out) {
    return gather_timed(t, true, times_out, n_out);
}

enum ds_status ds_trace_poll(ds_trace_t *t, const struct ds_trace_step_times **times_out,
                             size_t *n_out) {
    return gather_timed(t, false, times_out, n_out);
}

enum ds_status ds_trace_set_kernel_sink(ds_trace_t *t, ds_trace_kernel_sink sink, void *user) {
    if (!t) return ds_error_set(DS_ERR_ARG, "trace: NULL trace");
    t->sink = sink;
    t->sink_user = user;
    return DS_OK;
}

enum ds_trace_api ds_trace_api_records(const ds_trace_t *t) {
    return t ? t->api : DS_TRACE_API_UNSET;
}

enum ds_status ds_trace_last_rows(const ds_trace_t *t, const struct ds_rec_kernel **kernels_out,
                                  size_t *n_kernels_out, const struct ds_rec_range **ranges_out,
                                  size_t *n_ranges_out) {
    if (!t || !kernels_out || !n_kernels_out || !ranges_out || !n_ranges_out)
        return ds_error_set(DS_ERR_ARG, "trace: NULL argument");
    *kernels_out = t->kernels_out;
    *n_kernels_out = t->n_kernels_out;
    *ranges_out = t->ranges_out;
    *n_ranges_out = t->n_ranges_out;
    return DS_OK;
}

enum ds_status ds_trace_discard(ds_trace_t *t) {
    if (!t) return ds_error_set(DS_ERR_ARG, "trace: NULL trace");
    if (t->level == DS_REC_TRACE_OFF) return DS_OK;
    enum ds_status st = collect_ranges(t);
    if (!st && t->cupti_on && !(st = flush_mark(t, MARK_DISCARD, true))) {
        // The worker emptied its tables and `ready` at the marker; a memory failure before it
        // concerned rows now thrown away.
        pthread_mutex_lock(&g_mu);
        t->n_ready = 0;
        t->w_nomem = 0;
        pthread_mutex_unlock(&g_mu);
    }
    t->n_ranges_out = t->n_kernels_out = t->n_times = 0;
    if (!st && t->depth == 0) st = anchor(t, false);
    return st;
}

enum ds_status ds_trace_pause(ds_trace_t *t) {
    if (!t || t->depth) return ds_error_set(DS_ERR_ARG, "trace: pause with %s",
                                            t ? "a phase open" : "a NULL trace");
    if (t->paused) return DS_OK;
    if (t->cupti_on) (void)cupti_enable(t, false);
    t->paused = true;
    return DS_OK;
}

enum ds_status ds_trace_resume(ds_trace_t *t) {
    if (!t || t->depth) return ds_error_set(DS_ERR_ARG, "trace: resume with %s",
                                            t ? "a phase open" : "a NULL trace");
    if (!t->paused) return DS_OK;
    if (t->cupti_on) {
        enum ds_status st = cupti_enable(t, true);
        if (st) return st;
    }
    t->paused = false;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Per-kernel table

#define KTAB_MAX 512
#define KTAB_CACHE 1024             // CUPTI name pointer → entry (direct-mapped)
#define KTAB_ROWS0 ((size_t)1 << 16) // rows held for the exclusive times before growing

// A counted row, kept for the exclusive times (computed when the entries are read).
struct ktab_row {
    uint64_t start, end;
    uint32_t stream, idx;
};

struct ds_trace_ktab {
    struct ds_trace_ktab_entry e[KTAB_MAX];
    struct ds_trace_ktab_entry sorted[KTAB_MAX];
    size_t n;
    int full; // 1: names beyond KTAB_MAX; 2: rows lost for want of memory
    uint64_t lo, hi, other;
    unsigned phase, dstep;
    struct {
        const char *p;
        uint32_t gx, gy, gz; // the grid too when by_grid
        size_t idx;
    } cache[KTAB_CACHE];
    struct ktab_row *rows; // kept across resets, as by_grid
    size_t n_rows, cap_rows;
    int by_grid; // one entry per (name, grid) instead of per name
};

enum ds_status ds_trace_ktab_create(ds_trace_ktab_t **out) {
    if (!out) return ds_error_set(DS_ERR_ARG, "kernel table: NULL argument");
    ds_trace_ktab_t *k = calloc(1, sizeof *k);
    if (k) k->rows = malloc(KTAB_ROWS0 * sizeof *k->rows);
    if (!k || !k->rows) {
        free(k);
        *out = NULL;
        return ds_error_set(DS_ERR_NOMEM, "kernel table: out of memory");
    }
    k->cap_rows = KTAB_ROWS0;
    *out = k;
    return DS_OK;
}

void ds_trace_ktab_release(ds_trace_ktab_t *k) {
    if (!k) return;
    free(k->rows);
    free(k);
}

void ds_trace_ktab_reset(ds_trace_ktab_t *k, uint64_t step_lo, uint64_t step_hi,
                         enum ds_rec_phase phase, unsigned draft_step) {
    if (!k) return;
    // Every entry and the name cache go: an entry made later starts from zero counts.
    struct ktab_row *rows = k->rows;
    const size_t cap = k->cap_rows;
    const int by_grid = k->by_grid;
    memset(k, 0, sizeof *k);
    k->rows = rows;
    k->cap_rows = cap;
    k->by_grid = by_grid;
    k->lo = step_lo;
    k->hi = step_hi;
    k->phase = (unsigned)phase;
    k->dstep = draft_step;
}

void ds_trace_ktab_set_end(ds_trace_ktab_t *k, uint64_t step_hi) {
    if (k) k->hi = step_hi;
}

void ds_trace_ktab_set_by_grid(ds_trace_ktab_t *k, int on) {
    if (k) k->by_grid = on != 0;
}

void ds_trace_ktab_sink(void *user, const struct ds_rec_kernel *row, const char *name) {
    ds_trace_ktab_t *k = user;
    if (!k || !row) return;
    if (row->step < k->lo || row->step >= k->hi || row->phase != k->phase ||
        row->draft_step != k->dstep) {
        k->other++;
        return;
    }
    // Grid fields count only when the table is keyed by grid (zero otherwise).
    const uint32_t gx = k->by_grid ? row->grid_x : 0, gy = k->by_grid ? row->grid_y : 0,
                   gz = k->by_grid ? row->grid_z : 0;
    const size_t h =
        (size_t)((((uintptr_t)name >> 4) ^ (gx * 73856093u) ^ (gy * 19349663u) ^ (gz * 83492791u)) *
                 2654435761u) %
        KTAB_CACHE;
    size_t i;
    if (name && k->cache[h].p == name && k->cache[h].gx == gx && k->cache[h].gy == gy &&
        k->cache[h].gz == gz) {
        i = k->cache[h].idx;
    } else {
        char shortn[sizeof k->e[0].name];
        ds_trace_short_name(name ? name : "?", shortn, sizeof shortn);
        if (k->by_grid) {
            // "name [x,y,z]": the grid kept whole, the name cut to make room (with "...").
            char grid[40];
            const int gl = snprintf(grid, sizeof grid, " [%u,%u,%u]", gx, gy, gz);
            const size_t room = sizeof shortn - 1 - (size_t)gl;
            if (strlen(shortn) > room) memcpy(shortn + room - 3, "...", 4);
            strcat(shortn, grid);
        }
        for (i = 0; i < k->n && strcmp(k->e[i].name, shortn); i++) {
        }
        if (i == k->n) {
            if (k->n == KTAB_MAX) {
                k->full |= 1;
                i = KTAB_MAX - 1; // the last entry takes the rest
                snprintf(k->e[i].name, sizeof k->e[i].name, "(other kernels)");
            } else {
                memset(&k->e[i], 0, sizeof k->e[i]);
                snprintf(k->e[i].name, sizeof k->e[i].name, "%s", shortn);
                k->n++;
            }
        }
        if (name) {
            k->cache[h].p = name, k->cache[h].idx = i;
            k->cache[h].gx = gx, k->cache[h].gy = gy, k->cache[h].gz = gz;
        }
    }
    k->e[i].launches++;
    k->e[i].ns += row->end_ns > row->start_ns ? row->end_ns - row->start_ns : 0;
    // Growth is rare (doubling) and happens between steps, in a poll.
    if (grow_to((void **)&k->rows, &k->cap_rows, k->n_rows + 1, sizeof *k->rows))
        k->rows[k->n_rows++] = (struct ktab_row){row->start_ns, row->end_ns, row->stream,
                                                 (uint32_t)i};
    else
        k->full |= 2;
}

static int ktab_row_cmp(const void *a, const void *b) {
    const struct ktab_row *x = a, *y = b;
    if (x->stream != y->stream) return x->stream < y->stream ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int ktab_cmp(const void *a, const void *b) {
    const struct ds_trace_ktab_entry *x = a, *y = b;
    if (x->excl_ns != y->excl_ns) return x->excl_ns < y->excl_ns ? 1 : -1;
    return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : strcmp(x->name, y->name);
}

// Exclusive time: per stream in start order, the part of [start, end] after every earlier
// kernel's end. Under programmatic dependent launch a kernel's blocks start (and wait) before
// its predecessor ends; this counts each instant of the stream's busy time once.
static void ktab_exclusive(ds_trace_ktab_t *k) {
    for (size_t i = 0; i < k->n; i++) k->e[i].excl_ns = 0;
    qsort(k->rows, k->n_rows, sizeof *k->rows, ktab_row_cmp);
    uint64_t busy_to = 0;
    for (size_t i = 0; i < k->n_rows; i++) {
        const struct ktab_row *r = &k->rows[i];
        if (i == 0 || r->stream != k->rows[i - 1].stream) busy_to = 0;
        const uint64_t from = r->start > busy_to ? r->start : busy_to;
        if (r->end > from) k->e[r->idx].excl_ns += r->end - from;
        if (r->end > busy_to) busy_to = r->end;
    }
}

const struct ds_trace_ktab_entry *ds_trace_ktab_entries(ds_trace_ktab_t *k, size_t *n_out,
                                                        uint64_t *other_out, int *full_out) {
    if (n_out) *n_out = 0;
    if (other_out) *other_out = 0;
    if (full_out) *full_out = 0;
    if (!k) return NULL;
    ktab_exclusive(k);
    // A sorted copy: the entries keep their places for the name cache.
    memcpy(k->sorted, k->e, k->n * sizeof k->e[0]);
    qsort(k->sorted, k->n, sizeof k->sorted[0], ktab_cmp);
    if (n_out) *n_out = k->n;
    if (other_out) *other_out = k->other;
    if (full_out) *full_out = k->full;
    return k->sorted;
}

// ---------------------------------------------------------------------------------------------
// Decode baseline and overhead

struct decode_batch {
    int32_t *tokens, *logit_rows;
    struct ds_attn_seq *seqs;
    struct ds_batch b;
};

static void decode_batch_free(struct decode_batch *d) {
    free(d->tokens);
    free(d->logit_rows);
    free(d->seqs);
    memset(d, 0, sizeof *d);
}

// B sequences in slots 0..B-1, one row each at position pos, all with logits.
static enum ds_status decode_batch_make(ds_gptoss_t *m, uint32_t batch, int pos,
                                        struct decode_batch *d) {
    memset(d, 0, sizeof *d);
    const struct ds_gptoss_plan *plan = ds_gptoss_plan_of(m);
    int max_logit = plan->max_logit_rows ? plan->max_logit_rows : plan->max_rows;
    if (batch == 0 || (int64_t)batch > plan->max_slots || (int64_t)batch > plan->max_rows ||
        (int64_t)batch > max_logit)
        return ds_error_set(DS_ERR_RANGE,
                            "baseline: batch size %u outside the target's plan (slots %d, rows "
                            "%d, logit rows %d)",
                            batch, plan->max_slots, plan->max_rows, max_logit);
    d->tokens = calloc(batch, sizeof *d->tokens);
    d->logit_rows = calloc(batch, sizeof *d->logit_rows);
    d->seqs = calloc(batch, sizeof *d->seqs);
    if (!d->tokens || !d->logit_rows || !d->seqs) {
        decode_batch_free(d);
        return ds_error_set(DS_ERR_NOMEM, "baseline: out of memory");
    }
    int64_t vocab = ds_gptoss_config(m)->vocab_size;
    for (uint32_t i = 0; i < batch; i++) {
        d->tokens[i] = (int32_t)((i * 7919u + 11u) % (uint64_t)(vocab > 0 ? vocab : 1));
        d->logit_rows[i] = (int32_t)i;
        d->seqs[i] = (struct ds_attn_seq){.row0 = (int32_t)i, .n_rows = 1, .pos0 = pos,
                                          .slot = (int32_t)i};
    }
    d->b = (struct ds_batch){.n_rows = (int)batch, .tokens = d->tokens, .n_seq = (int)batch,
                             .seqs = d->seqs, .n_logit_rows = (int)batch,
                             .logit_rows = d->logit_rows};
    return DS_OK;
}

static enum ds_status decode_step(ds_gptoss_t *m, const struct decode_batch *d, uint64_t *ns_out) {
    struct ds_backend *be = ds_gptoss_backend(m);
    uint64_t a = mono_ns();
    enum ds_status st = ds_gptoss_forward(m, &d->b);
    if (!st) st = be->sync(be);
    *ns_out = mono_ns() - a;
    return st;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t median_u64(uint64_t *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_u64);
    return n % 2 ? v[n / 2] : v[n / 2 - 1] / 2 + v[n / 2] / 2;
}

static int baseline_pos(ds_gptoss_t *m, int want) {
    int max_pos = ds_gptoss_plan_of(m)->max_pos;
    int pos = want > 0 ? want : 512;
    return pos > max_pos - 1 ? max_pos - 1 : pos;
}

enum ds_status ds_trace_baseline_run(ds_gptoss_t *target, const uint32_t *batch_sizes, size_t n,
                                     const struct ds_trace_baseline_options *opt,
                                     struct ds_trace_baseline *out) {
    if (!target || !batch_sizes || !out || n == 0)
        return ds_error_set(DS_ERR_ARG, "baseline: NULL argument or no batch sizes");
    struct ds_trace_baseline_options o = opt ? *opt : (struct ds_trace_baseline_options){0};
    int warmup = o.warmup > 0 ? o.warmup : 3, steps = o.steps > 0 ? o.steps : 20;
    int pos = baseline_pos(target, o.context_len);
    uint64_t *ns = calloc((size_t)steps, sizeof *ns);
    if (!ns) return ds_error_set(DS_ERR_NOMEM, "baseline: out of memory");
    enum ds_status st = DS_OK;
    struct decode_batch d = {0};
    for (size_t i = 0; i < n && !st; i++) {
        if ((st = decode_batch_make(target, batch_sizes[i], pos, &d))) break;
        uint64_t sum = 0, min = UINT64_MAX, x = 0;
        for (int s = 0; s < warmup && !st; s++) st = decode_step(target, &d, &x);
        for (int s = 0; s < steps && !st; s++) {
            st = decode_step(target, &d, &ns[s]);
            sum += ns[s];
            if (ns[s] < min) min = ns[s];
        }
        decode_batch_free(&d);
        if (st) break;
        out[i] = (struct ds_trace_baseline){.batch_size = batch_sizes[i],
                                            .steps = (uint32_t)steps,
                                            .median_ns = median_u64(ns, (size_t)steps),
                                            .mean_ns = sum / (uint64_t)steps,
                                            .min_ns = min};
    }
    free(ns);
    return st;
}

enum ds_status ds_trace_measure_overhead(ds_trace_t *t, ds_gptoss_t *target, uint32_t batch_size,
                                         int rounds, int steps, double *overhead_out) {
    if (!t || !target || !overhead_out)
        return ds_error_set(DS_ERR_ARG, "overhead: NULL argument");
    *overhead_out = 0;
    if (t->level == DS_REC_TRACE_OFF) return DS_OK;
    if (t->depth) return ds_error_set(DS_ERR_ARG, "overhead: a phase is open");
    rounds = rounds > 0 ? rounds : 4;
    steps = steps > 0 ? steps : 10;
    struct decode_batch d = {0};
    enum ds_status st = DS_OK;
    const bool was_quiet = t->quiet;
    t->quiet = true; // measurement steps write no row
    uint64_t on = 0, off = 0, x = 0;
    if ((st = decode_batch_make(target, batch_size, baseline_pos(target, 0), &d))) goto cleanup;
    for (int s = 0; s < 2 && !st; s++) st = decode_step(target, &d, &x); // warm-up
    const struct ds_trace_step_times *times = NULL;
    size_t nt = 0;
    // Start from an empty trace so the final drain holds only the traced steps' records.
    if (!st) st = gather(t, true, &times, &nt);
    struct ds_trace_stats s0;
    ds_trace_stats(t, &s0);
    for (int r = 0; r < rounds && !st; r++) {
        // Paused block, then traced block: alternating blocks cancel slow drifts (clocks, heat).
        if ((st = ds_trace_pause(t))) break;
        for (int s = 0; s < steps && !st; s++) {
            st = decode_step(target, &d, &x);
            off += x;
        }
        enum ds_status rs = ds_trace_resume(t);
        if (!st) st = rs;
        for (int s = 0; s < steps && !st; s++) {
            // What a run pays per step: the phase calls around the work, then a poll.
            uint64_t a = mono_ns();
            if ((st = ds_trace_phase_begin(t, 0, DS_REC_PHASE_VERIFY, 0, batch_size))) break;
            st = decode_step(target, &d, &x);
            enum ds_status es = ds_trace_phase_end(t);
            if (!st) st = es;
            if (!st) st = gather(t, false, &times, &nt);
            on += mono_ns() - a;
        }
    }
    if (!st && t->cupti_on) {
        // The final collect: the forced flush is charged for the share of one that poll's policy
        // gives the traced steps (ds_trace_flush_share), the rows' conversion in full; the wait
        // for the worker is not (its parse runs beside the steps; a worker that fell behind
        // would show as dropped records).
        uint64_t a = mono_ns();
        st = gather(t, true, &times, &nt);
        uint64_t total = mono_ns() - a, flush = t->flush_cost_ns < total ? t->flush_cost_ns : total;
        uint64_t wait = t->wait_cost_ns < total - flush ? t->wait_cost_ns : total - flush;
        struct ds_trace_stats s1;
        ds_trace_stats(t, &s1);
        const double share = ds_trace_flush_share(t, &s0, &s1, on);
        on += total - flush - wait + (uint64_t)((double)flush * share);
    }
    if (!st) *overhead_out = off ? (double)on / (double)off - 1.0 : 0.0;
cleanup:
    t->quiet = was_quiet;
    decode_batch_free(&d);
    return st;
}
