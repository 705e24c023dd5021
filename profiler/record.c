// The HDF5 run file writer (ds/record.h): table layouts, SWMR append, resume, recovery.
//
// Layout: every table is a 1-D chunked dataset with an unlimited dimension at the root; its
// element type is a compound built from the record struct with HOFFSET, so memory and file layout
// are the same and writes need no conversion. Rows collect in per-table batches allocated once at
// open; a flush extends each table, writes the batch as one hyperslab and H5Dflush-es the table.
// /strings is flushed first so no row on disk names an id that is not on disk. /sessions holds one
// row per writer session, rewritten in place at every flush (SWMR allows modifying existing rows,
// not creating attributes, so end-of-run values live there).
//
// Concurrency guard: HDF5 drops its own file lock once SWMR writing starts, so the writer also
// holds an open-file-description write lock (F_OFD_SETLK) on the file for its lifetime; resume and
// recover refuse a file whose lock is held. The lock dies with the process, so a killed writer
// never blocks a resume.
#define _GNU_SOURCE // F_OFD_SETLK
#include "ds/record.h"

#include "ds/check.h"
#include "h5attr.h"
#include "summary_check.h"

#include <hdf5.h>
#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef DS_VERSION
#define DS_VERSION "unknown"
#endif
#ifndef DS_GIT_COMMIT
#define DS_GIT_COMMIT "unknown"
#endif

// ---------------------------------------------------------------------------------------------
// Table descriptions: one field list per record struct.

enum ftype {
    FT_U8,
    FT_U16,
    FT_U32,
    FT_U64,
    FT_I32,
    FT_F32,
    FT_F64,
    FT_EXPERTS, // u16[DS_RECORD_MAX_LAYERS]
    FT_TEXT,    // char[DS_RECORD_STRING_BYTES], NUL padded
    // u8 enums:
    FT_CHANNEL,
    FT_STOP,
    FT_PHASE,
    FT_STATUS,
    FT_TRACE,
};

struct field {
    const char *name;
    size_t offset;
    enum ftype type;
};

#define FIELD(st, m, t)                                                                            \
    { #m, HOFFSET(struct st, m), t }

static const struct field draft_fields[] = {
    FIELD(ds_rec_draft, step, FT_U64),
    FIELD(ds_rec_draft, request, FT_U32),
    FIELD(ds_rec_draft, draft_token, FT_I32),
    FIELD(ds_rec_draft, q_draft, FT_F32),
    FIELD(ds_rec_draft, p_draft, FT_F32),
    FIELD(ds_rec_draft, target_token, FT_I32),
    FIELD(ds_rec_draft, p_target, FT_F32),
    FIELD(ds_rec_draft, margin, FT_F32),
    FIELD(ds_rec_draft, expected_accept, FT_F32),
    FIELD(ds_rec_draft, entropy_target, FT_F32),
    FIELD(ds_rec_draft, entropy_draft, FT_F32),
    FIELD(ds_rec_draft, context_len, FT_U32),
    FIELD(ds_rec_draft, batch_size, FT_U16),
    FIELD(ds_rec_draft, position, FT_U8),
    FIELD(ds_rec_draft, accepted, FT_U8),
    FIELD(ds_rec_draft, channel, FT_CHANNEL),
};

static const struct field step_fields[] = {
    FIELD(ds_rec_step, step, FT_U64),        FIELD(ds_rec_step, draft_ns, FT_U64),
    FIELD(ds_rec_step, verify_ns, FT_U64),   FIELD(ds_rec_step, accept_ns, FT_U64),
    FIELD(ds_rec_step, total_ns, FT_U64),    FIELD(ds_rec_step, request, FT_U32),
    FIELD(ds_rec_step, context_len, FT_U32), FIELD(ds_rec_step, batch_size, FT_U16),
    FIELD(ds_rec_step, turn, FT_U16),        FIELD(ds_rec_step, drafted, FT_U8),
    FIELD(ds_rec_step, accepted, FT_U8),     FIELD(ds_rec_step, emitted, FT_U8),
    FIELD(ds_rec_step, nonfinite, FT_U8),    FIELD(ds_rec_step, distinct_experts, FT_EXPERTS),
};

static const struct field request_fields[] = {
    FIELD(ds_rec_request, start_ns, FT_U64),     FIELD(ds_rec_request, end_ns, FT_U64),
    FIELD(ds_rec_request, request, FT_U32),      FIELD(ds_rec_request, dataset_index, FT_U32),
    FIELD(ds_rec_request, category, FT_U32),     FIELD(ds_rec_request, conversation, FT_U32),
    FIELD(ds_rec_request, prompt_len, FT_U32),   FIELD(ds_rec_request, generated_len, FT_U32),
    FIELD(ds_rec_request, steps, FT_U32),        FIELD(ds_rec_request, batch_size, FT_U16),
    FIELD(ds_rec_request, turn, FT_U16),         FIELD(ds_rec_request, session, FT_U16),
    FIELD(ds_rec_request, stop_reason, FT_STOP),
};

static const struct field kernel_fields[] = {
    FIELD(ds_rec_kernel, step, FT_U64),        FIELD(ds_rec_kernel, start_ns, FT_U64),
    FIELD(ds_rec_kernel, end_ns, FT_U64),      FIELD(ds_rec_kernel, graph_node, FT_U64),
    FIELD(ds_rec_kernel, name, FT_U32),        FIELD(ds_rec_kernel, stream, FT_U32),
    FIELD(ds_rec_kernel, grid_x, FT_U32),      FIELD(ds_rec_kernel, grid_y, FT_U32),
    FIELD(ds_rec_kernel, grid_z, FT_U32),      FIELD(ds_rec_kernel, block_x, FT_U32),
    FIELD(ds_rec_kernel, block_y, FT_U32),     FIELD(ds_rec_kernel, block_z, FT_U32),
    FIELD(ds_rec_kernel, static_smem, FT_U32), FIELD(ds_rec_kernel, dynamic_smem, FT_U32),
    FIELD(ds_rec_kernel, correlation, FT_U32), FIELD(ds_rec_kernel, registers, FT_U16),
    FIELD(ds_rec_kernel, phase, FT_PHASE),     FIELD(ds_rec_kernel, draft_step, FT_U8),
};

static const struct field range_fields[] = {
    FIELD(ds_rec_range, step, FT_U64),    FIELD(ds_rec_range, start_ns, FT_U64),
    FIELD(ds_rec_range, end_ns, FT_U64),  FIELD(ds_rec_range, batch_size, FT_U16),
    FIELD(ds_rec_range, phase, FT_PHASE), FIELD(ds_rec_range, draft_step, FT_U8),
};

static const struct field string_fields[] = {
    FIELD(ds_rec_string, id, FT_U32),
    FIELD(ds_rec_string, length, FT_U32),
    FIELD(ds_rec_string, text, FT_TEXT),
};

static const struct field session_fields[] = {
    FIELD(ds_rec_session, start_unix_ns, FT_U64),  FIELD(ds_rec_session, end_unix_ns, FT_U64),
    FIELD(ds_rec_session, first_step, FT_U64),     FIELD(ds_rec_session, next_step, FT_U64),
    FIELD(ds_rec_session, trace_overhead, FT_F64), FIELD(ds_rec_session, trace_dropped, FT_U64),
    FIELD(ds_rec_session, command_line, FT_U32),   FIELD(ds_rec_session, session, FT_U16),
    FIELD(ds_rec_session, status, FT_STATUS),      FIELD(ds_rec_session, trace_level, FT_TRACE),
};

struct table_desc {
    const char *name;
    size_t size; // sizeof the record struct
    const struct field *fields;
    size_t nfields;
    hsize_t chunk; // rows per chunk: tens to hundreds of KiB
    size_t cap;    // rows per in-memory batch
    int step_at_0; // the struct starts with the u64 step id
};

#define DESC(nm, st, f, chunk, cap, s0)                                                            \
    { nm, sizeof(struct st), f, sizeof f / sizeof f[0], chunk, cap, s0 }

// Indexed by enum ds_rec_table.
static const struct table_desc tables[DS_REC_TABLE_COUNT] = {
    DESC("strings", ds_rec_string, string_fields, 64, 256, 0),
    DESC("requests", ds_rec_request, request_fields, 1024, 1024, 0),
    DESC("steps", ds_rec_step, step_fields, 2048, 4096, 1),
    DESC("drafts", ds_rec_draft, draft_fields, 8192, 16384, 1),
    DESC("kernels", ds_rec_kernel, kernel_fields, 8192, 16384, 1),
    DESC("ranges", ds_rec_range, range_fields, 8192, 8192, 1),
    DESC("sessions", ds_rec_session, session_fields, 16, 0, 0),
};

_Static_assert(sizeof(struct ds_rec_draft) == 64, "drafts layout changed: bump the schema");
_Static_assert(sizeof(struct ds_rec_step) == 184, "steps layout changed: bump the schema");
_Static_assert(sizeof(struct ds_rec_request) == 56, "requests layout changed: bump the schema");
_Static_assert(sizeof(struct ds_rec_kernel) == 80, "kernels layout changed: bump the schema");
_Static_assert(sizeof(struct ds_rec_range) == 32, "ranges layout changed: bump the schema");
_Static_assert(sizeof(struct ds_rec_string) == 1024, "strings layout changed: bump the schema");
_Static_assert(sizeof(struct ds_rec_session) == 56, "sessions layout changed: bump the schema");

static const char *const channel_names[] = {"header", "analysis", "commentary", "final", "other"};
static const char *const stop_names[] = {"return",         "call",          "endoftext",
                                         "max_new_tokens", "context_limit", "error"};
static const char *const phase_names[] = {"prefill", "draft_extend", "draft_step",
                                          "verify",  "accept",       "sample"};
static const char *const status_names[] = {"running", "closed", "interrupted", "failed"};
static const char *const trace_names[] = {"off", "phases", "kernels"};

_Static_assert(sizeof channel_names / sizeof *channel_names == DS_REC_CHANNEL_COUNT, "names");
_Static_assert(sizeof stop_names / sizeof *stop_names == DS_REC_STOP_COUNT, "names");
_Static_assert(sizeof phase_names / sizeof *phase_names == DS_REC_PHASE_COUNT, "names");
_Static_assert(sizeof status_names / sizeof *status_names == DS_REC_SESSION_COUNT, "names");
_Static_assert(sizeof trace_names / sizeof *trace_names == DS_REC_TRACE_COUNT, "names");

const char *ds_rec_stop_name(enum ds_rec_stop s) {
    return (int)s >= 0 && s < DS_REC_STOP_COUNT ? stop_names[s] : NULL;
}

const char *ds_rec_table_name(enum ds_rec_table t) {
    if ((int)t < 0 || t >= DS_REC_TABLE_COUNT) return NULL;
    return tables[t].name;
}

// ---------------------------------------------------------------------------------------------
// The recorder.

struct table {
    hid_t dset;
    hid_t type;         // the compound (memory = file type)
    uint64_t rows_file; // rows on disk
    size_t pending;     // rows in buf
    unsigned char *buf; // cap * size bytes, allocated once
};

struct str_entry {
    uint64_t hash;
    uint32_t off; // into the arena
    uint32_t len;
};

struct ds_recorder {
    char *path;
    hid_t file;
    int lock_fd;
    struct table t[DS_REC_TABLE_COUNT];

    // string interning: open addressing over ids (slot value = id + 1, 0 = empty)
    struct str_entry *entries;
    uint32_t n_entries, cap_entries;
    uint32_t *slots;
    uint32_t nslots; // power of two
    char *arena;
    size_t arena_len, arena_cap;

    struct ds_rec_session session;
    uint64_t session_row;
    uint64_t next_step;
    struct timespec t0;
    struct ds_rec_request *done; // resume: requests already in the file
    size_t n_done;

    enum ds_rec_session_status end_status; // what close writes (closed unless set_end said)
    enum ds_status failed;                 // sticky first write error
    char failed_msg[512];
    int hook_added;
};

// ---------------------------------------------------------------------------------------------
// HDF5 error reporting: the deepest message of the error stack, shortened to its OS reason when
// it carries one ("error message = 'File too large'").

static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *data) {
    (void)n;
    if (e->desc && *e->desc) snprintf(data, 384, "%s", e->desc);
    return 0;
}

static void h5_reason(char *out, size_t n) {
    char deepest[384] = "";
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, deepest);
    const char *os = strstr(deepest, "error message = '");
    if (os) {
        os += strlen("error message = '");
        const char *end = strchr(os, '\'');
        int len = end ? (int)(end - os) : (int)strlen(os);
        snprintf(out, n, "%.*s", len, os);
    } else {
        snprintf(out, n, "%s", *deepest ? deepest : "unknown HDF5 error");
    }
}

// Records "<path>: <what>: <HDF5 reason>" as the calling thread's error and returns DS_ERR_IO.
__attribute__((format(printf, 2, 3))) static enum ds_status h5_fail_path(const char *path,
                                                                         const char *fmt, ...) {
    char reason[256], what[256];
    h5_reason(reason, sizeof reason);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ds_error_set(DS_ERR_IO, "%s: %s: %s", path, what, reason);
}

// A write-path failure: the recorder keeps the first one and refuses further writes.
static enum ds_status mark_failed(ds_recorder_t *rec) {
    if (!rec->failed) {
        rec->failed = DS_ERR_IO;
        snprintf(rec->failed_msg, sizeof rec->failed_msg, "%s", ds_error_last());
        rec->session.status = DS_REC_SESSION_FAILED;
    }
    return rec->failed;
}

static enum ds_status sticky(const ds_recorder_t *rec) {
    return ds_error_set(rec->failed, "%s", rec->failed_msg);
}

static void h5_quiet(void) {
    // The recorder reports HDF5 failures itself (one line through ds_error_set).
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

// ---------------------------------------------------------------------------------------------
// Types.

static hid_t make_enum(const char *const *names, int n) {
    hid_t t = H5Tenum_create(H5T_NATIVE_UINT8);
    if (t < 0) return t;
    for (int i = 0; i < n; i++) {
        uint8_t v = (uint8_t)i;
        if (H5Tenum_insert(t, names[i], &v) < 0) {
            H5Tclose(t);
            return -1;
        }
    }
    return t;
}

static hid_t make_field_type(enum ftype ft) {
    switch (ft) {
    case FT_U8:
        return H5Tcopy(H5T_NATIVE_UINT8);
    case FT_U16:
        return H5Tcopy(H5T_NATIVE_UINT16);
    case FT_U32:
        return H5Tcopy(H5T_NATIVE_UINT32);
    case FT_U64:
        return H5Tcopy(H5T_NATIVE_UINT64);
    case FT_I32:
        return H5Tcopy(H5T_NATIVE_INT32);
    case FT_F32:
        return H5Tcopy(H5T_NATIVE_FLOAT);
    case FT_F64:
        return H5Tcopy(H5T_NATIVE_DOUBLE);
    case FT_EXPERTS: {
        hsize_t dim = DS_RECORD_MAX_LAYERS;
        return H5Tarray_create2(H5T_NATIVE_UINT16, 1, &dim);
    }
    case FT_TEXT: {
        hid_t t = H5Tcopy(H5T_C_S1);
        if (t < 0) return t;
        if (H5Tset_size(t, DS_RECORD_STRING_BYTES) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0 ||
            H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
            H5Tclose(t);
            return -1;
        }
        return t;
    }
    case FT_CHANNEL:
        return make_enum(channel_names, DS_REC_CHANNEL_COUNT);
    case FT_STOP:
        return make_enum(stop_names, DS_REC_STOP_COUNT);
    case FT_PHASE:
        return make_enum(phase_names, DS_REC_PHASE_COUNT);
    case FT_STATUS:
        return make_enum(status_names, DS_REC_SESSION_COUNT);
    case FT_TRACE:
        return make_enum(trace_names, DS_REC_TRACE_COUNT);
    }
    return -1;
}

static hid_t make_compound(const struct table_desc *d) {
    hid_t c = H5Tcreate(H5T_COMPOUND, d->size);
    if (c < 0) return c;
    for (size_t i = 0; i < d->nfields; i++) {
        hid_t ft = make_field_type(d->fields[i].type);
        herr_t e = ft < 0 ? -1 : H5Tinsert(c, d->fields[i].name, d->fields[i].offset, ft);
        if (ft >= 0) H5Tclose(ft);
        if (e < 0) {
            H5Tclose(c);
            return -1;
        }
    }
    return c;
}

// A compound holding one named member at offset 0 (to read a single column).
static hid_t make_column(const char *name, hid_t native) {
    hid_t c = H5Tcreate(H5T_COMPOUND, H5Tget_size(native));
    if (c < 0) return c;
    if (H5Tinsert(c, name, 0, native) < 0) {
        H5Tclose(c);
        return -1;
    }
    return c;
}

// ---------------------------------------------------------------------------------------------
// Small helpers.

static uint64_t unix_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *nz(const char *s) {
    return s ? s : "";
}

// Takes the writer lock (see the file comment). *fd_out = -1 when the filesystem has no OFD locks
// (nothing to guard with; proceed).
static enum ds_status lock_file(const char *path, int *fd_out) {
    *fd_out = -1;
#ifndef F_OFD_SETLK
    (void)path; // no open-file-description locks on this platform: nothing to guard with
    return DS_OK;
#else
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return ds_error_set(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
        int e = errno;
        if (e == EAGAIN || e == EACCES) {
            close(fd);
            return ds_error_set(DS_ERR_IO, "%s: another process is writing this file", path);
        }
        close(fd); // EINVAL/ENOLCK: no OFD locks here
        return DS_OK;
    }
    *fd_out = fd;
    return DS_OK;
#endif
}

static hid_t make_fapl(int clear_flags) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fapl;
    // SWMR needs the latest format; STRONG closes anything still open when the file closes.
    if (H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0 ||
        H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    if (clear_flags && H5Pexist(fapl, "clear_status_flags") > 0) {
        // The property h5clear -s uses: drops the "open for write" marks a dead writer left.
        hbool_t on = 1;
        if (H5Pset(fapl, "clear_status_flags", &on) < 0) {
            H5Pclose(fapl);
            return -1;
        }
    }
    return fapl;
}

// After a writer dies, the superblock's end-of-allocation lags the data SWMR flushes put beyond
// it: reads past it fail ("addr overflow") and new allocations would overwrite flushed chunks. As
// `h5clear -i` does, move it past the end of the file, with a margin for space the dead writer
// had allocated but not yet written (a few chunks per table).
static herr_t fix_eoa(hid_t f, const char *path) {
    haddr_t eoa = 0;
    struct stat sb;
    if (H5Fget_eoa(f, &eoa) < 0 || stat(path, &sb) < 0) return -1;
    if ((haddr_t)sb.st_size <= eoa) return 0; // closed cleanly: nothing to do
    return H5Fincrement_filesize(f, (hsize_t)8 << 20);
}

// When a write fails for lack of space, HDF5 still records in the superblock the end of file it
// had allocated, beyond the bytes that reached the disk; it then refuses to open the file
// ("truncated file"). Extending the file (sparse, so it needs no free blocks) to that address makes
// it open again; every row flushed before the failure lies below the old end. Reads the end-of-file
// address from a version 2/3 superblock at offset 0 (what libver "latest" writes); 0 = not found.
static uint64_t stored_eof(int fd) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char sb[48];
    if (pread(fd, sb, sizeof sb, 0) != (ssize_t)sizeof sb || memcmp(sb, sig, 8)) return 0;
    if ((sb[8] != 2 && sb[8] != 3) || sb[9] != 8) return 0;
    uint64_t eof = 0; // base address, extension address, then end-of-file address (little endian)
    for (int i = 7; i >= 0; i--)
        eof = eof << 8 | sb[12 + 16 + i];
    return eof;
}

// Bytes between the file's end and the end its superblock records (0: none, or not known).
static uint64_t bytes_missing(int fd, uint64_t *size_out) {
    struct stat st;
    uint64_t eof = stored_eof(fd);
    *size_out = 0;
    if (!eof || fstat(fd, &st) < 0) return 0;
    *size_out = (uint64_t)st.st_size;
    return eof > *size_out ? eof - *size_out : 0;
}

uint64_t ds_rec_bytes_missing(const char *path, uint64_t *size_out) {
    *size_out = 0;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    const uint64_t missing = bytes_missing(fd, size_out);
    close(fd);
    return missing;
}

static int extend_to_stored_eof(int fd) {
    uint64_t size = 0;
    const uint64_t missing = bytes_missing(fd, &size);
    if (!missing || size + missing > (uint64_t)INT64_MAX) return 0;
    return ftruncate(fd, (off_t)(size + missing));
}

// ---------------------------------------------------------------------------------------------
// String interning.

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static enum ds_status str_grow_slots(ds_recorder_t *rec) {
    uint32_t n = rec->nslots ? rec->nslots * 2 : 1024;
    uint32_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for the string table", rec->path);
    for (uint32_t id = 0; id < rec->n_entries; id++) {
        if (rec->entries[id].len == UINT32_MAX) continue; // a cut prefix: never matched
        uint32_t i = (uint32_t)rec->entries[id].hash & (n - 1);
        while (slots[i])
            i = (i + 1) & (n - 1);
        slots[i] = id + 1;
    }
    free(rec->slots);
    rec->slots = slots;
    rec->nslots = n;
    return DS_OK;
}

// Adds an entry (no lookup) with id = n_entries. match = 0 keeps it out of the hash (a string the
// file holds only as a prefix).
static enum ds_status str_add(ds_recorder_t *rec, const char *s, size_t len, uint64_t h,
                              int match) {
    if (rec->n_entries == UINT32_MAX - 1 || len >= UINT32_MAX)
        return ds_error_set(DS_ERR_RANGE, "%s: string table full", rec->path);
    if (rec->n_entries == rec->cap_entries) {
        uint32_t n = rec->cap_entries ? rec->cap_entries * 2 : 512;
        struct str_entry *e = realloc(rec->entries, (size_t)n * sizeof *e);
        if (!e)
            return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for the string table", rec->path);
        rec->entries = e;
        rec->cap_entries = n;
    }
    if (rec->arena_len + len + 1 > rec->arena_cap) {
        size_t n = rec->arena_cap ? rec->arena_cap : 65536;
        while (n < rec->arena_len + len + 1)
            n *= 2;
        char *a = realloc(rec->arena, n);
        if (!a)
            return ds_error_set(DS_ERR_NOMEM, "%s: out of memory for the string table", rec->path);
        rec->arena = a;
        rec->arena_cap = n;
    }
    if ((uint64_t)(rec->n_entries + 1) * 2 > rec->nslots) {
        enum ds_status st = str_grow_slots(rec);
        if (st) return st;
    }
    memcpy(rec->arena + rec->arena_len, s, len);
    rec->arena[rec->arena_len + len] = '\0';
    uint32_t id = rec->n_entries++;
    rec->entries[id] =
        (struct str_entry){h, (uint32_t)rec->arena_len, match ? (uint32_t)len : UINT32_MAX};
    rec->arena_len += len + 1;
    if (match) {
        uint32_t i = (uint32_t)h & (rec->nslots - 1);
        while (rec->slots[i])
            i = (i + 1) & (rec->nslots - 1);
        rec->slots[i] = id + 1;
    }
    return DS_OK;
}

static int str_find(const ds_recorder_t *rec, const char *s, size_t len, uint64_t h,
                    uint32_t *id_out) {
    if (!rec->nslots) return 0;
    for (uint32_t i = (uint32_t)h & (rec->nslots - 1);; i = (i + 1) & (rec->nslots - 1)) {
        uint32_t v = rec->slots[i];
        if (!v) return 0;
        const struct str_entry *e = &rec->entries[v - 1];
        if (e->hash == h && e->len == len && !memcmp(rec->arena + e->off, s, len)) {
            *id_out = v - 1;
            return 1;
        }
    }
}

enum ds_status ds_recorder_intern(ds_recorder_t *rec, const char *text, uint32_t *id_out) {
    if (id_out) *id_out = 0;
    if (!rec || !text || !id_out) return ds_error_set(DS_ERR_ARG, "recorder: NULL argument");
    if (rec->failed) return sticky(rec);
    size_t len = strlen(text);
    uint64_t h = fnv1a(text, len);
    uint32_t id;
    if (str_find(rec, text, len, h, &id)) {
        *id_out = id;
        return DS_OK;
    }
    struct table *t = &rec->t[DS_REC_STRINGS];
    if (t->pending == tables[DS_REC_STRINGS].cap) {
        enum ds_status st = ds_recorder_flush(rec);
        if (st) return st;
    }
    enum ds_status st = str_add(rec, text, len, h, 1);
    if (st) return st;
    id = rec->n_entries - 1;
    struct ds_rec_string *row = (struct ds_rec_string *)t->buf + t->pending++;
    memset(row, 0, sizeof *row);
    row->id = id;
    row->length = (uint32_t)len;
    // A text too long for the row keeps its whole characters only: the cut never splits a UTF-8
    // sequence (its continuation bytes are 10xxxxxx), so every stored text stays valid UTF-8.
    size_t keep = len < DS_RECORD_STRING_BYTES - 1 ? len : DS_RECORD_STRING_BYTES - 1;
    if (keep < len)
        while (keep > 0 && ((unsigned char)text[keep] & 0xC0) == 0x80)
            keep--;
    memcpy(row->text, text, keep);
    *id_out = id;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Writing rows.

// Writes n rows at [start, start + n), extending the table if needed, then flushes it. On failure
// tries to put the extent back so the file does not claim rows that never reached it.
static enum ds_status write_rows(ds_recorder_t *rec, enum ds_rec_table ti, uint64_t start, size_t n,
                                 const void *data) {
    struct table *t = &rec->t[ti];
    const char *name = tables[ti].name;
    hid_t fs = H5I_INVALID_HID, ms = H5I_INVALID_HID;
    enum ds_status st = DS_OK;
    hsize_t old = t->rows_file, end = start + n, hstart = start, hn = n;
    int extended = 0;
    if (end > old) {
        if (H5Dset_extent(t->dset, &end) < 0) {
            st = h5_fail_path(rec->path, "cannot extend table %s", name);
            goto cleanup;
        }
        extended = 1;
    }
    if ((fs = H5Dget_space(t->dset)) < 0 ||
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, &hstart, NULL, &hn, NULL) < 0 ||
        (ms = H5Screate_simple(1, &hn, NULL)) < 0) {
        st = h5_fail_path(rec->path, "cannot select rows of table %s", name);
        goto cleanup;
    }
    if (H5Dwrite(t->dset, t->type, ms, fs, H5P_DEFAULT, data) < 0) {
        st = h5_fail_path(rec->path, "cannot write table %s", name);
        goto cleanup;
    }
    if (H5Dflush(t->dset) < 0) {
        st = h5_fail_path(rec->path, "cannot flush table %s", name);
        goto cleanup;
    }
    if (end > t->rows_file) t->rows_file = end;
cleanup:
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    if (st && extended) {
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", ds_error_last());
        H5Dset_extent(t->dset, &old); // best effort; the error already recorded is the one shown
        ds_error_set(st, "%s", keep);
    }
    return st;
}

static enum ds_status write_session_row(ds_recorder_t *rec) {
    rec->session.next_step = rec->next_step;
    return write_rows(rec, DS_REC_SESSIONS, rec->session_row, 1, &rec->session);
}

// The path still names the file being written. Deleted or replaced (another file moved over it)
// during the run, every row written goes where no reader will look, and the run's summary would
// read the other file: said at the next flush instead.
static enum ds_status check_same_file(ds_recorder_t *rec) {
    struct stat have, named;
    if (rec->lock_fd < 0 || fstat(rec->lock_fd, &have) != 0) return DS_OK; // nothing to compare
    if (have.st_nlink == 0 || stat(rec->path, &named) != 0 || named.st_dev != have.st_dev ||
        named.st_ino != have.st_ino)
        return ds_error_set(DS_ERR_IO,
                            "%s: the run file was deleted or replaced while this run wrote it; "
                            "its rows are not in the file the path names",
                            rec->path);
    return DS_OK;
}

enum ds_status ds_recorder_flush(ds_recorder_t *rec) {
    if (!rec) return ds_error_set(DS_ERR_ARG, "recorder: NULL argument");
    if (rec->failed) return sticky(rec);
    if (check_same_file(rec)) return mark_failed(rec);
    int wrote = 0;
    // /requests last: a request's row says it is done (--resume skips it), so it goes to the
    // file only after the rows it closes, and not at all when one of those writes failed.
    static const int order[] = {DS_REC_STRINGS, DS_REC_STEPS,  DS_REC_DRAFTS,
                                DS_REC_KERNELS, DS_REC_RANGES, DS_REC_REQUESTS};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const int ti = order[i];
        struct table *t = &rec->t[ti];
        if (!t->pending) continue;
        if (write_rows(rec, ti, t->rows_file, t->pending, t->buf)) return mark_failed(rec);
        t->pending = 0;
        wrote = 1;
    }
    if (wrote && write_session_row(rec)) return mark_failed(rec);
    return DS_OK;
}

static enum ds_status append(ds_recorder_t *rec, enum ds_rec_table ti, const void *rows, size_t n) {
    if (!rec || (!rows && n)) return ds_error_set(DS_ERR_ARG, "recorder: NULL argument");
    if (rec->failed) return sticky(rec);
    const struct table_desc *d = &tables[ti];
    struct table *t = &rec->t[ti];
    const unsigned char *src = rows;
    while (n > 0) {
        if (t->pending == d->cap) {
            enum ds_status st = ds_recorder_flush(rec);
            if (st) return st;
        }
        size_t take = d->cap - t->pending < n ? d->cap - t->pending : n;
        unsigned char *dst = t->buf + t->pending * d->size;
        memcpy(dst, src, take * d->size);
        for (size_t i = 0; i < take; i++) {
            unsigned char *row = dst + i * d->size;
            if (d->step_at_0) {
                uint64_t step;
                memcpy(&step, row, sizeof step);
                if (step >= rec->next_step) rec->next_step = step + 1;
            }
            if (ti == DS_REC_REQUESTS)
                ((struct ds_rec_request *)row)->session = rec->session.session;
        }
        t->pending += take;
        src += take * d->size;
        n -= take;
    }
    return DS_OK;
}

enum ds_status ds_recorder_append_drafts(ds_recorder_t *rec, const struct ds_rec_draft *rows,
                                         size_t n) {
    return append(rec, DS_REC_DRAFTS, rows, n);
}
enum ds_status ds_recorder_append_steps(ds_recorder_t *rec, const struct ds_rec_step *rows,
                                        size_t n) {
    return append(rec, DS_REC_STEPS, rows, n);
}
enum ds_status ds_recorder_append_requests(ds_recorder_t *rec, const struct ds_rec_request *rows,
                                           size_t n) {
    return append(rec, DS_REC_REQUESTS, rows, n);
}
enum ds_status ds_recorder_append_kernels(ds_recorder_t *rec, const struct ds_rec_kernel *rows,
                                          size_t n) {
    return append(rec, DS_REC_KERNELS, rows, n);
}
enum ds_status ds_recorder_append_ranges(ds_recorder_t *rec, const struct ds_rec_range *rows,
                                         size_t n) {
    return append(rec, DS_REC_RANGES, rows, n);
}

enum ds_status ds_recorder_rows(const ds_recorder_t *rec, enum ds_rec_table t, uint64_t *rows_out) {
    if (rows_out) *rows_out = 0;
    if (!rec || !rows_out || (int)t < 0 || t >= DS_REC_TABLE_COUNT)
        return ds_error_set(DS_ERR_ARG, "recorder: bad argument to ds_recorder_rows");
    *rows_out = rec->t[t].rows_file + rec->t[t].pending;
    return DS_OK;
}

enum ds_status ds_recorder_elapsed_ns(const ds_recorder_t *rec, uint64_t *ns_out) {
    if (ns_out) *ns_out = 0;
    if (!rec || !ns_out) return ds_error_set(DS_ERR_ARG, "recorder: NULL argument");
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t ns =
        (int64_t)(now.tv_sec - rec->t0.tv_sec) * 1000000000 + (now.tv_nsec - rec->t0.tv_nsec);
    *ns_out = ns > 0 ? (uint64_t)ns : 0;
    return DS_OK;
}

enum ds_status ds_recorder_set_end(ds_recorder_t *rec, const struct ds_run_end *end) {
    if (!rec || !end ||
        (end->status != DS_REC_SESSION_CLOSED && end->status != DS_REC_SESSION_INTERRUPTED &&
         end->status != DS_REC_SESSION_FAILED))
        return ds_error_set(DS_ERR_ARG,
                            "recorder: set_end needs status closed, interrupted or failed");
    rec->session.trace_overhead = end->trace_overhead;
    rec->session.trace_dropped = end->trace_dropped;
    rec->end_status = end->status;
    return DS_OK;
}

// ---------------------------------------------------------------------------------------------
// Attributes (all written before SWMR starts).

static herr_t attr_write(hid_t loc, const char *name, hid_t type, hid_t space, const void *v) {
    hid_t a = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return -1;
    herr_t e = H5Awrite(a, type, v);
    // SWMR cannot start while an attribute is open: close each at once.
    if (H5Aclose(a) < 0) e = -1;
    return e;
}

static hid_t vlen_str_type(void) {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return t;
    if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

static herr_t attr_str(hid_t loc, const char *name, const char *v) {
    hid_t t = vlen_str_type(), sp = H5Screate(H5S_SCALAR);
    const char *p = nz(v);
    herr_t e = (t < 0 || sp < 0) ? -1 : attr_write(loc, name, t, sp, &p);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    return e;
}

static herr_t attr_scalar(hid_t loc, const char *name, hid_t native, const void *v) {
    hid_t sp = H5Screate(H5S_SCALAR);
    herr_t e = sp < 0 ? -1 : attr_write(loc, name, native, sp, v);
    if (sp >= 0) H5Sclose(sp);
    return e;
}

static herr_t attr_u32s(hid_t loc, const char *name, const uint32_t *v, size_t n) {
    hsize_t dim = n;
    uint32_t none = 0;
    hid_t sp = H5Screate_simple(1, &dim, NULL);
    herr_t e = sp < 0 ? -1 : attr_write(loc, name, H5T_NATIVE_UINT32, sp, n ? v : &none);
    if (sp >= 0) H5Sclose(sp);
    return e;
}

static enum ds_status write_meta(ds_recorder_t *rec, const struct ds_run_meta *m) {
    hid_t f = rec->file;
    uint32_t version = DS_RECORD_SCHEMA_VERSION, k = m->k;
    uint64_t seed = m->seed, created = rec->session.start_unix_ns;
    const char *trace = trace_names[m->trace_level];
    struct {
        const char *name, *value;
    } strs[] = {
        {"schema", DS_RECORD_SCHEMA_NAME},
        {"tool_version", m->tool_version ? m->tool_version : DS_VERSION},
        {"git_commit", m->git_commit ? m->git_commit : DS_GIT_COMMIT},
        {"command_line", m->command_line},
        {"gpu_name", m->gpu_name},
        {"driver_version", m->driver_version},
        {"cuda_version", m->cuda_version},
        {"target_path", m->target_path},
        {"target_config_sha256", m->target_config_sha256},
        {"draft_path", m->draft_path},
        {"draft_config_sha256", m->draft_config_sha256},
        {"dataset_path", m->dataset_path},
        {"dataset_sha256", m->dataset_sha256},
        {"rule", m->rule},
        {"trace_level", trace},
        {"options_json", m->options_json},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (attr_str(f, strs[i].name, strs[i].value) < 0)
            return h5_fail_path(rec->path, "cannot write attribute %s", strs[i].name);
    if (attr_scalar(f, "schema_version", H5T_NATIVE_UINT32, &version) < 0 ||
        attr_scalar(f, "seed", H5T_NATIVE_UINT64, &seed) < 0 ||
        attr_scalar(f, "k", H5T_NATIVE_UINT32, &k) < 0 ||
        attr_scalar(f, "temperature", H5T_NATIVE_DOUBLE, &m->temperature) < 0 ||
        attr_scalar(f, "top_p", H5T_NATIVE_DOUBLE, &m->top_p) < 0 ||
        attr_scalar(f, "created_unix_ns", H5T_NATIVE_UINT64, &created) < 0 ||
        attr_u32s(f, "batch_sizes", m->batch_sizes, m->n_batch_sizes) < 0)
        return h5_fail_path(rec->path, "cannot write the run attributes");
    return DS_OK;
}

// Reads a string attribute into buf (cut to n - 1 bytes). Returns 0, or -1 if absent/not a string.
// A variable-length string attribute (what the writer makes), malloc'd; NULL if absent.
// The options_json keys of m->resume_options: equal in the file and now, or a mismatch naming
// the key and both values. Keys the file lacks (an older writer) are not checked.
static enum ds_status check_resume_options(ds_recorder_t *rec, const struct ds_run_meta *m) {
    if (!m->resume_options || !m->options_json) return DS_OK;
    char *text = ds_h5_attr_strdup(rec->file, "options_json");
    json_t *file = text ? json_loads(text, 0, NULL) : NULL;
    json_t *now = json_loads(m->options_json, 0, NULL);
    json_t *defaults = m->resume_defaults ? json_loads(m->resume_defaults, 0, NULL) : NULL;
    free(text);
    enum ds_status st = DS_OK;
    for (const char *const *k = m->resume_options; *k && !st && json_is_object(file); k++) {
        json_t *fv = json_object_get(file, *k), *nv = json_object_get(now, *k);
        if (!fv) fv = json_object_get(defaults, *k); // what a file without the key implies
        if (!fv || json_equal(fv, nv)) continue;
        char *fs = json_dumps(fv, JSON_ENCODE_ANY | JSON_COMPACT);
        char *ns = nv ? json_dumps(nv, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        st = ds_error_set(DS_ERR_MISMATCH, "%s: cannot resume: %s differs (file %s, now %s)",
                          rec->path, *k, fs ? fs : "?", ns ? ns : "absent");
        free(fs);
        free(ns);
    }
    json_decref(file);
    json_decref(now);
    json_decref(defaults);
    return st;
}

// Checks that the file's run is the one `m` describes; the message names the first field differing.
static enum ds_status check_meta(ds_recorder_t *rec, const struct ds_run_meta *m) {
    hid_t f = rec->file;
    char got[1024];
    // A damaged root header fails the lookup itself: say so, not "not a run file".
    if (H5Aexists(f, "schema") < 0)
        return h5_fail_path(rec->path, "cannot read the run attributes");
    if (ds_h5_attr_str(f, "schema", got, sizeof got) < 0 || strcmp(got, DS_RECORD_SCHEMA_NAME))
        return ds_error_set(DS_ERR_FORMAT, "%s: not a draftscope run file (no schema attribute)",
                            rec->path);
    uint32_t version = 0;
    if (ds_h5_attr_num(f, "schema_version", H5T_NATIVE_UINT32, &version) < 0)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: schema_version attribute missing or not one integer", rec->path);
    if (version != DS_RECORD_SCHEMA_VERSION)
        return ds_error_set(
            DS_ERR_FORMAT, "%s: cannot resume: schema version %u in the file, this build writes %u",
            rec->path, version, DS_RECORD_SCHEMA_VERSION);
    struct {
        const char *name, *want;
    } strs[] = {
        {"target_config_sha256", m->target_config_sha256},
        {"draft_config_sha256", m->draft_config_sha256},
        {"dataset_sha256", m->dataset_sha256},
        {"rule", m->rule},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        if (ds_h5_attr_str(f, strs[i].name, got, sizeof got) < 0)
            return ds_error_set(DS_ERR_FORMAT, "%s: attribute %s missing or not one string",
                                rec->path, strs[i].name);
        if (strcmp(got, nz(strs[i].want)))
            return ds_error_set(DS_ERR_MISMATCH,
                                "%s: cannot resume: %s differs (file \"%s\", now \"%s\")",
                                rec->path, strs[i].name, got, nz(strs[i].want));
    }
    uint64_t seed = 0;
    uint32_t k = 0;
    double temperature = 0, top_p = 0;
    if (ds_h5_attr_num(f, "seed", H5T_NATIVE_UINT64, &seed) < 0 ||
        ds_h5_attr_num(f, "k", H5T_NATIVE_UINT32, &k) < 0 ||
        ds_h5_attr_num(f, "temperature", H5T_NATIVE_DOUBLE, &temperature) < 0 ||
        ds_h5_attr_num(f, "top_p", H5T_NATIVE_DOUBLE, &top_p) < 0)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: a run attribute (seed, k, temperature, top_p) is "
                            "missing or not one number (seed and k: integers)",
                            rec->path);
    if (seed != m->seed)
        return ds_error_set(DS_ERR_MISMATCH,
                            "%s: cannot resume: seed differs (file %llu, now %llu)", rec->path,
                            (unsigned long long)seed, (unsigned long long)m->seed);
    if (k != m->k)
        return ds_error_set(DS_ERR_MISMATCH, "%s: cannot resume: k differs (file %u, now %u)",
                            rec->path, k, m->k);
    // Exact comparison: both come from the same command-line text parsed the same way.
    if (temperature != m->temperature)
        return ds_error_set(DS_ERR_MISMATCH,
                            "%s: cannot resume: temperature differs (file %.17g, now %.17g)",
                            rec->path, temperature, m->temperature);
    if (top_p != m->top_p)
        return ds_error_set(DS_ERR_MISMATCH,
                            "%s: cannot resume: top_p differs (file %.17g, now %.17g)", rec->path,
                            top_p, m->top_p);
    return check_resume_options(rec, m);
}

// ---------------------------------------------------------------------------------------------
// Open / create / close.

static void abort_flush(void *user) {
    ds_recorder_t *rec = user;
    if (!rec->failed) (void)ds_recorder_flush(rec);
}

static enum ds_status rec_alloc(const char *path, ds_recorder_t **rec_out) {
    *rec_out = NULL;
    ds_recorder_t *rec = calloc(1, sizeof *rec);
    if (!rec) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
    rec->file = H5I_INVALID_HID;
    rec->lock_fd = -1;
    rec->end_status = DS_REC_SESSION_CLOSED;
    rec->session.trace_overhead = NAN;
    clock_gettime(CLOCK_MONOTONIC, &rec->t0);
    rec->session.start_unix_ns = unix_ns();
    for (int i = 0; i < DS_REC_TABLE_COUNT; i++) {
        rec->t[i].dset = H5I_INVALID_HID;
        rec->t[i].type = H5I_INVALID_HID;
    }
    *rec_out = rec;
    rec->path = strdup(path);
    if (!rec->path) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < DS_REC_TABLE_COUNT; i++) {
        if (!tables[i].cap) continue;
        rec->t[i].buf = malloc(tables[i].cap * tables[i].size);
        if (!rec->t[i].buf) return ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
    }
    return DS_OK;
}

// Closes every handle (reverse order of opening) and frees; returns the first close error.
static enum ds_status rec_free(ds_recorder_t *rec) {
    enum ds_status st = DS_OK;
    if (!rec) return st;
    if (rec->hook_added) ds_abort_hook_remove(abort_flush, rec);
    for (int i = DS_REC_TABLE_COUNT - 1; i >= 0; i--) {
        if (rec->t[i].dset >= 0 && H5Dclose(rec->t[i].dset) < 0 && !st)
            st = h5_fail_path(rec->path, "cannot close table %s", tables[i].name);
        if (rec->t[i].type >= 0) H5Tclose(rec->t[i].type);
        free(rec->t[i].buf);
    }
    if (rec->file >= 0 && H5Fclose(rec->file) < 0 && !st)
        st = h5_fail_path(rec->path, "cannot close the file");
    // After a failed write, make the file openable at once if the filesystem lets us.
    if (rec->failed && rec->lock_fd >= 0) (void)extend_to_stored_eof(rec->lock_fd);
    if (rec->lock_fd >= 0) close(rec->lock_fd);
    free(rec->done);
    free(rec->entries);
    free(rec->slots);
    free(rec->arena);
    free(rec->path);
    free(rec);
    return st;
}

static enum ds_status create_tables(ds_recorder_t *rec) {
    enum ds_status st = DS_OK;
    hid_t sp = H5I_INVALID_HID, dcpl = H5I_INVALID_HID;
    for (int i = 0; i < DS_REC_TABLE_COUNT; i++) {
        const struct table_desc *d = &tables[i];
        hsize_t zero = 0, unlimited = H5S_UNLIMITED;
        if ((rec->t[i].type = make_compound(d)) < 0 ||
            (sp = H5Screate_simple(1, &zero, &unlimited)) < 0 ||
            (dcpl = H5Pcreate(H5P_DATASET_CREATE)) < 0 || H5Pset_chunk(dcpl, 1, &d->chunk) < 0 ||
            (rec->t[i].dset = H5Dcreate2(rec->file, d->name, rec->t[i].type, sp, H5P_DEFAULT, dcpl,
                                         H5P_DEFAULT)) < 0) {
            st = h5_fail_path(rec->path, "cannot create table %s", d->name);
            goto cleanup;
        }
        H5Pclose(dcpl);
        dcpl = H5I_INVALID_HID;
        H5Sclose(sp);
        sp = H5I_INVALID_HID;
    }
cleanup:
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

static enum ds_status check_meta_args(const char *path, const struct ds_run_meta *meta) {
    if (!path || !*path || !meta)
        return ds_error_set(DS_ERR_ARG, "recorder: NULL path or metadata");
    if (meta->k == 0 || meta->k > 255)
        return ds_error_set(DS_ERR_ARG, "%s: k = %u out of range 1..255", path, meta->k);
    if (meta->n_batch_sizes && !meta->batch_sizes)
        return ds_error_set(DS_ERR_ARG, "%s: batch_sizes is NULL", path);
    if ((unsigned)meta->trace_level >= DS_REC_TRACE_COUNT)
        return ds_error_set(DS_ERR_ARG, "%s: bad trace level %d", path, (int)meta->trace_level);
    return DS_OK;
}

// Starts SWMR, appends this session's row, flushes and registers the abort hook.
static enum ds_status start_session(ds_recorder_t *rec, const struct ds_run_meta *meta) {
    if (H5Fstart_swmr_write(rec->file) < 0)
        return h5_fail_path(rec->path, "cannot start SWMR writing");
    rec->session.first_step = rec->next_step;
    rec->session.status = DS_REC_SESSION_RUNNING;
    rec->session.trace_level = (uint8_t)meta->trace_level;
    enum ds_status st = ds_recorder_intern(rec, nz(meta->command_line), &rec->session.command_line);
    if (st) return st;
    rec->session_row = rec->t[DS_REC_SESSIONS].rows_file;
    if ((st = ds_recorder_flush(rec)) || (st = write_session_row(rec))) return st;
    ds_abort_hook_add(abort_flush, rec);
    rec->hook_added = 1;
    return DS_OK;
}

enum ds_status ds_recorder_create(const char *path, const struct ds_run_meta *meta, unsigned flags,
                                  ds_recorder_t **rec_out) {
    if (rec_out) *rec_out = NULL;
    if (!rec_out) return ds_error_set(DS_ERR_ARG, "recorder: NULL output");
    enum ds_status st = check_meta_args(path, meta);
    if (st) return st;
    h5_quiet();
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    if (exists && !(flags & DS_RECORDER_OVERWRITE))
        return ds_error_set(DS_ERR_IO, "%s: file exists; refusing to overwrite it", path);
    ds_recorder_t *rec = NULL;
    hid_t fapl = H5I_INVALID_HID;
    int created = 0;
    if ((st = rec_alloc(path, &rec))) goto cleanup;
    if (exists && (st = lock_file(path, &rec->lock_fd))) goto cleanup; // a live writer keeps it
    if ((fapl = make_fapl(0)) < 0) {
        st = h5_fail_path(path, "cannot set up file access");
        goto cleanup;
    }
    rec->file = H5Fcreate(path, exists ? H5F_ACC_TRUNC : H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    if (rec->file < 0) {
        st = h5_fail_path(path, "cannot create");
        goto cleanup;
    }
    created = 1;
    if (rec->lock_fd < 0 && (st = lock_file(path, &rec->lock_fd))) goto cleanup;
    // Id 0 is "" so that zero-initialised string fields read as empty.
    uint32_t id0;
    if ((st = create_tables(rec)) || (st = write_meta(rec, meta)) ||
        (st = ds_recorder_intern(rec, "", &id0)) || (st = start_session(rec, meta)))
        goto cleanup;
cleanup:
    if (fapl >= 0) H5Pclose(fapl);
    if (st) {
        rec_free(rec);
        if (created) unlink(path);
        return st;
    }
    *rec_out = rec;
    return DS_OK;
}

// Reads one u64/u32 column of a table in blocks and keeps its maximum + 1 in *next.
static enum ds_status scan_next(ds_recorder_t *rec, int ti, const char *col, int is64,
                                uint64_t *next) {
    enum ds_status st = DS_OK;
    uint64_t rows = rec->t[ti].rows_file;
    if (!rows) return DS_OK;
    enum { BLOCK = 65536 };
    hid_t mt = make_column(col, is64 ? H5T_NATIVE_UINT64 : H5T_NATIVE_UINT32);
    hid_t fs = H5I_INVALID_HID, ms = H5I_INVALID_HID;
    void *buf = malloc(BLOCK * sizeof(uint64_t));
    if (!buf) {
        st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", rec->path);
        goto cleanup;
    }
    if (mt < 0 || (fs = H5Dget_space(rec->t[ti].dset)) < 0) {
        st = h5_fail_path(rec->path, "cannot read table %s", tables[ti].name);
        goto cleanup;
    }
    for (hsize_t start = 0; start < rows; start += BLOCK) {
        hsize_t n = rows - start < BLOCK ? rows - start : BLOCK;
        if (H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &n, NULL) < 0 ||
            (ms = H5Screate_simple(1, &n, NULL)) < 0 ||
            H5Dread(rec->t[ti].dset, mt, ms, fs, H5P_DEFAULT, buf) < 0) {
            st = h5_fail_path(rec->path, "cannot read column %s of table %s", col, tables[ti].name);
            goto cleanup;
        }
        H5Sclose(ms);
        ms = H5I_INVALID_HID;
        for (hsize_t i = 0; i < n; i++) {
            uint64_t v = is64 ? ((uint64_t *)buf)[i] : ((uint32_t *)buf)[i];
            if (v >= *next) *next = v + 1;
        }
    }
cleanup:
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    if (mt >= 0) H5Tclose(mt);
    free(buf);
    return st;
}

// Reads rows [start, start + n) of a table with its full type into buf.
static enum ds_status read_rows(ds_recorder_t *rec, int ti, hsize_t start, hsize_t n, void *buf) {
    hid_t fs = H5Dget_space(rec->t[ti].dset), ms = H5I_INVALID_HID;
    enum ds_status st = DS_OK;
    if (fs < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &n, NULL) < 0 ||
        (ms = H5Screate_simple(1, &n, NULL)) < 0 ||
        H5Dread(rec->t[ti].dset, rec->t[ti].type, ms, fs, H5P_DEFAULT, buf) < 0)
        st = h5_fail_path(rec->path, "cannot read table %s", tables[ti].name);
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return st;
}

// Opens every table of an existing file, checks its layout and reads its row count.
static enum ds_status open_tables(ds_recorder_t *rec) {
    for (int i = 0; i < DS_REC_TABLE_COUNT; i++) {
        const char *name = tables[i].name;
        if ((rec->t[i].type = make_compound(&tables[i])) < 0)
            return h5_fail_path(rec->path, "cannot build the type of table %s", name);
        if (H5Lexists(rec->file, name, H5P_DEFAULT) <= 0)
            return ds_error_set(DS_ERR_FORMAT, "%s: table %s missing", rec->path, name);
        if ((rec->t[i].dset = H5Dopen2(rec->file, name, H5P_DEFAULT)) < 0)
            return h5_fail_path(rec->path, "cannot open table %s", name);
        hid_t ft = H5Dget_type(rec->t[i].dset), sp = H5Dget_space(rec->t[i].dset);
        hsize_t rows = 0;
        int ok = ft >= 0 && sp >= 0 && H5Tequal(ft, rec->t[i].type) > 0 &&
                 H5Sget_simple_extent_ndims(sp) == 1 &&
                 H5Sget_simple_extent_dims(sp, &rows, NULL) == 1;
        if (ft >= 0) H5Tclose(ft);
        if (sp >= 0) H5Sclose(sp);
        if (!ok)
            return ds_error_set(DS_ERR_FORMAT, "%s: table %s does not have the layout of schema %u",
                                rec->path, name, DS_RECORD_SCHEMA_VERSION);
        rec->t[i].rows_file = rows;
    }
    return DS_OK;
}

// Rebuilds the string table from /strings (ids must be 0, 1, 2, ... in row order).
static enum ds_status load_strings(ds_recorder_t *rec) {
    struct table *t = &rec->t[DS_REC_STRINGS];
    size_t cap = tables[DS_REC_STRINGS].cap;
    for (uint64_t start = 0; start < t->rows_file; start += cap) {
        hsize_t n = t->rows_file - start < cap ? t->rows_file - start : cap;
        enum ds_status st = read_rows(rec, DS_REC_STRINGS, start, n, t->buf);
        if (st) return st;
        for (hsize_t i = 0; i < n; i++) {
            const struct ds_rec_string *row = (const struct ds_rec_string *)t->buf + i;
            if (row->id != start + i) // a zero row: one never written (a file cut short)
                return ds_error_set(DS_ERR_FORMAT,
                                    "%s: cannot resume: /strings row %llu has id %u, not its row "
                                    "index (a row never written, or damaged)",
                                    rec->path, (unsigned long long)(start + i), row->id);
            size_t len = strnlen(row->text, DS_RECORD_STRING_BYTES);
            int whole = row->length == len;
            if ((st = str_add(rec, row->text, len, fnv1a(row->text, len), whole))) return st;
        }
    }
    return DS_OK;
}

// What a refused resume puts back. Until the new session's first write, opening a file for
// resume changes only its superblock (the first 48 bytes: HDF5's "open for write" flags, the end of
// allocation fix_eoa moves) and its length (extend_to_stored_eof, and HDF5 growing the file to the
// moved end when it closes), so restoring those leaves a refused file byte for byte as it was: a
// dead writer's file, refused for another seed, stays recoverable by the right command.
#define SNAP_HEAD 4096
struct file_snap {
    int fd; // -1: nothing taken
    off_t size;
    size_t n;
    unsigned char head[SNAP_HEAD];
};

static void snap_take(const char *path, struct file_snap *s) {
    struct stat st;
    s->fd = open(path, O_RDWR | O_CLOEXEC);
    if (s->fd < 0) return;
    ssize_t n = fstat(s->fd, &st) == 0 ? pread(s->fd, s->head, SNAP_HEAD, 0) : -1;
    if (n < 0) {
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->size = st.st_size;
    s->n = (size_t)n;
}

// Puts the file back when `restore` (best effort); always closes the descriptor.
static void snap_restore(struct file_snap *s, int restore) {
    if (s->fd < 0) return;
    struct stat st;
    if (restore && fstat(s->fd, &st) == 0) {
        int ok = pwrite(s->fd, s->head, s->n, 0) == (ssize_t)s->n;
        if (st.st_size != s->size) ok &= ftruncate(s->fd, s->size) == 0;
        (void)ok; // the refusal's own error is what the caller reports
    }
    close(s->fd);
    s->fd = -1;
}

// Whether the last /sessions row says its writer stopped on an error (`failed`): 0 when it says
// otherwise or cannot be read.
static int last_session_failed(ds_recorder_t *rec) {
    const struct table_desc *d = &tables[DS_REC_SESSIONS];
    struct ds_rec_session row = {0};
    hid_t ds = H5Dopen2(rec->file, d->name, H5P_DEFAULT), t = make_compound(d);
    hid_t fs = ds >= 0 ? H5Dget_space(ds) : H5I_INVALID_HID, ms = H5I_INVALID_HID;
    hsize_t rows = 0, one = 1;
    int ok = fs >= 0 && t >= 0 && H5Sget_simple_extent_dims(fs, &rows, NULL) == 1 && rows > 0;
    hsize_t last = rows - 1;
    ok = ok && H5Sselect_hyperslab(fs, H5S_SELECT_SET, &last, NULL, &one, NULL) >= 0 &&
         (ms = H5Screate_simple(1, &one, NULL)) >= 0 &&
         H5Dread(ds, t, ms, fs, H5P_DEFAULT, &row) >= 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    if (t >= 0) H5Tclose(t);
    if (ds >= 0) H5Dclose(ds);
    return ok && row.status == DS_REC_SESSION_FAILED;
}

// A file shorter than the end its superblock records. A write that failed for want of space
// leaves one (its session `failed`, every row below the cut); a copy cut short or taken while the
// run wrote it leaves one whose missing bytes read as zeros, as rows that were never written.
// As the summary does, only the first is read (and resumed).
static enum ds_status cut_short(const char *path, uint64_t size, uint64_t missing) {
    return ds_error_set(DS_ERR_FORMAT,
                        "%s: cannot resume: truncated file: %llu bytes of the %llu its superblock "
                        "records, and no failed write of the run explains it (a copy cut short, "
                        "or taken while the run wrote it)",
                        path, (unsigned long long)size, (unsigned long long)(size + missing));
}

// The summary's checks name the file first: say after it that they stop the resume.
static enum ds_status refuse_resume(const char *path, enum ds_status st) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", ds_error_last());
    size_t n = strlen(path);
    if (strncmp(keep, path, n) || strncmp(keep + n, ": ", 2)) return ds_error_set(st, "%s", keep);
    return ds_error_set(st, "%s: cannot resume: %s", path, keep + n + 2);
}

// Every string id a /requests row names is in /strings: a resume adds strings after the last
// one, so an id beyond it (rows of /strings lost) would come to name another text.
static enum ds_status check_string_ids(const ds_recorder_t *rec) {
    for (size_t i = 0; i < rec->n_done; i++) {
        const struct ds_rec_request *q = &rec->done[i];
        const uint32_t ids[] = {q->category, q->conversation};
        for (size_t j = 0; j < sizeof ids / sizeof ids[0]; j++)
            if (ids[j] >= rec->n_entries)
                return ds_error_set(DS_ERR_FORMAT,
                                    "%s: cannot resume: /requests row %zu (request %u) names "
                                    "string %u, beyond the %u rows of /strings (rows lost)",
                                    rec->path, i, q->request, ids[j], rec->n_entries);
    }
    return DS_OK;
}

enum ds_status ds_recorder_open_resume(const char *path, const struct ds_run_meta *meta,
                                       struct ds_resume_info *info_out, ds_recorder_t **rec_out) {
    if (rec_out) *rec_out = NULL;
    if (info_out) memset(info_out, 0, sizeof *info_out);
    if (!rec_out || !info_out) return ds_error_set(DS_ERR_ARG, "recorder: NULL output");
    enum ds_status st = check_meta_args(path, meta);
    if (st) return st;
    h5_quiet();
    ds_recorder_t *rec = NULL;
    hid_t fapl = H5I_INVALID_HID;
    struct file_snap snap = {.fd = -1};
    int wrote = 0; // set just before the new session first writes: then nothing is put back
    if ((st = rec_alloc(path, &rec)) || (st = lock_file(path, &rec->lock_fd))) goto cleanup;
    snap_take(path, &snap);
    uint64_t size = 0, missing = rec->lock_fd >= 0 ? bytes_missing(rec->lock_fd, &size) : 0;
    if (rec->lock_fd >= 0 && extend_to_stored_eof(rec->lock_fd) < 0) {
        st = ds_error_set(DS_ERR_IO, "%s: cannot extend to its recorded end: %s", path,
                          strerror(errno));
        goto cleanup;
    }
    if ((fapl = make_fapl(1)) < 0) {
        st = h5_fail_path(path, "cannot set up file access");
        goto cleanup;
    }
    if ((rec->file = H5Fopen(path, H5F_ACC_RDWR, fapl)) < 0) {
        st = missing ? cut_short(path, size, missing)
                     : h5_fail_path(path, "cannot open for resuming");
        goto cleanup;
    }
    if (fix_eoa(rec->file, path) < 0) {
        st = h5_fail_path(path, "cannot repair the end of allocation a dead writer left");
        goto cleanup;
    }
    // Before anything reads the zeros the extension put where the missing bytes were.
    if (missing && !last_session_failed(rec)) {
        st = cut_short(path, size, missing);
        goto cleanup;
    }
    if ((st = check_meta(rec, meta)) || (st = open_tables(rec)) || (st = load_strings(rec)))
        goto cleanup;
    uint64_t next_step = 0, next_request = 0;
    static const struct {
        int table;
        const char *col;
        int is64;
        int step;
    } cols[] = {
        {DS_REC_STEPS, "step", 1, 1},       {DS_REC_DRAFTS, "step", 1, 1},
        {DS_REC_KERNELS, "step", 1, 1},     {DS_REC_RANGES, "step", 1, 1},
        {DS_REC_STEPS, "request", 0, 0},    {DS_REC_DRAFTS, "request", 0, 0},
        {DS_REC_REQUESTS, "request", 0, 0},
    };
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        if ((st = scan_next(rec, cols[i].table, cols[i].col, cols[i].is64,
                            cols[i].step ? &next_step : &next_request)))
            goto cleanup;
    if (next_request > UINT32_MAX) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: request ids exhausted", path);
        goto cleanup;
    }
    uint64_t n_done = rec->t[DS_REC_REQUESTS].rows_file;
    if (n_done) {
        if (!(rec->done = malloc(n_done * sizeof *rec->done))) {
            st = ds_error_set(DS_ERR_NOMEM, "%s: out of memory", path);
            goto cleanup;
        }
        if ((st = read_rows(rec, DS_REC_REQUESTS, 0, n_done, rec->done))) goto cleanup;
        rec->n_done = n_done;
    }
    if ((st = check_string_ids(rec))) goto cleanup;
    uint64_t sessions = rec->t[DS_REC_SESSIONS].rows_file;
    if (sessions >= UINT16_MAX) {
        st = ds_error_set(DS_ERR_RANGE, "%s: too many sessions (%llu)", path,
                          (unsigned long long)sessions);
        goto cleanup;
    }
    // Every row the summary will read, checked now: a file that lost rows is refused before
    // this session is added to it (the final summary would fail only after the whole run).
    if ((st = ds_summary_check_open(rec->file, path))) {
        st = refuse_resume(path, st);
        goto cleanup;
    }
    rec->next_step = next_step;
    rec->session.session = (uint16_t)sessions;
    for (int i = 0; i < DS_REC_TABLE_COUNT; i++)
        info_out->rows[i] = rec->t[i].rows_file;
    wrote = 1;
    if ((st = start_session(rec, meta))) goto cleanup;
    info_out->session = rec->session.session;
    info_out->next_step = next_step;
    info_out->next_request = (uint32_t)next_request;
    info_out->done = rec->done;
    info_out->n_done = rec->n_done;
cleanup:
    if (fapl >= 0) H5Pclose(fapl);
    if (st) {
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", ds_error_last());
        // Put the file back after HDF5 has closed it, still under the lock.
        int lock_fd = rec ? rec->lock_fd : -1;
        if (rec) rec->lock_fd = -1;
        rec_free(rec);
        snap_restore(&snap, !wrote);
        if (lock_fd >= 0) close(lock_fd);
        memset(info_out, 0, sizeof *info_out);
        return ds_error_set(st, "%s", keep);
    }
    snap_restore(&snap, 0);
    *rec_out = rec;
    return DS_OK;
}

enum ds_status ds_recorder_close(ds_recorder_t *rec) {
    if (!rec) return DS_OK;
    enum ds_status st = ds_recorder_flush(rec);
    if (!st) {
        rec->session.status = (uint8_t)rec->end_status;
        rec->session.end_unix_ns = unix_ns();
        if (write_session_row(rec)) st = mark_failed(rec);
    } else if (rec->file >= 0) {
        // Best effort: mark the session failed; the row already exists, so no new space is needed.
        rec->session.status = DS_REC_SESSION_FAILED;
        (void)write_session_row(rec);
    }
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", st ? rec->failed_msg : "");
    enum ds_status cst = rec_free(rec);
    if (st) return ds_error_set(st, "%s", keep);
    return cst;
}

void ds_recorder_library_init(void) {
    H5dont_atexit();
}

enum ds_status ds_recorder_recover(const char *path) {
    if (!path) return ds_error_set(DS_ERR_ARG, "recorder: NULL path");
    h5_quiet();
    int fd = -1;
    enum ds_status st = lock_file(path, &fd);
    if (st) return st;
    if (fd >= 0 && extend_to_stored_eof(fd) < 0) {
        close(fd);
        return ds_error_set(DS_ERR_IO, "%s: cannot extend to its recorded end: %s", path,
                            strerror(errno));
    }
    hid_t fapl = make_fapl(1), f = H5I_INVALID_HID;
    if (fapl < 0 || (f = H5Fopen(path, H5F_ACC_RDWR, fapl)) < 0)
        st = h5_fail_path(path, "cannot open to clear its write flags");
    else if (fix_eoa(f, path) < 0)
        st = h5_fail_path(path, "cannot repair the end of allocation a dead writer left");
    if (f >= 0 && H5Fclose(f) < 0 && !st)
        st = h5_fail_path(path, "cannot close after clearing its write flags");
    if (fapl >= 0) H5Pclose(fapl);
    if (fd >= 0) close(fd);
    return st;
}

// ---------------------------------------------------------------------------------------------
// Signals.

static volatile sig_atomic_t stop_flag;

static void on_stop(int sig) {
    stop_flag = 1;
    // A second SIGINT means "now": fall back to the default action.
    if (sig == SIGINT) signal(SIGINT, SIG_DFL);
}

enum ds_status ds_recorder_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0 ||
        sigaction(SIGXFSZ, &ign, NULL) < 0)
        return ds_error_set(DS_ERR_IO, "cannot install signal handlers: %s", strerror(errno));
    return DS_OK;
}

int ds_recorder_stop_requested(void) {
    return stop_flag != 0;
}
