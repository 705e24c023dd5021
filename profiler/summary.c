// The acceptance metrics of a run file (ds/summary.h, docs/metrics.md).
//
// One pass per table, in blocks of DS_SUMMARY_BLOCK_ROWS rows, reading only the needed columns:
// HDF5 converts a compound by member name, so a small memory compound naming a subset of the
// file's members reads just those. Order: attributes, /sessions, /requests (kept whole: one small
// row per finished request, sorted by id for the join), then /steps and /drafts, each row joined
// to its request by binary search and added to its group's sums. Groups appear as keys are first
// seen (the only allocations after the requests pass) and are sorted at the end.
//
// The file is opened read-only with SWMR_READ so that live files and files of a dead writer are
// read as they are, and nothing is ever written to it.
#include "ds/summary.h"

#include "ds/cli.h"
#include "ds/dataset.h"
#include "ds/tokenizer.h"
#include "h5attr.h"
#include "summary_check.h"

#include <hdf5.h>

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const by_names[DS_SUMMARY_BY_COUNT] = {
    "batch", "turn", "category", "step-batch", "position", "channel",
};

static const char *const channel_names[DS_REC_CHANNEL_COUNT] = {
    "header", "analysis", "commentary", "final", "other",
};

static const char *const session_names[DS_REC_SESSION_COUNT] = {
    "running",
    "closed",
    "interrupted",
    "failed",
};

const char *ds_summary_by_name(enum ds_summary_by by) {
    return (unsigned)by < DS_SUMMARY_BY_COUNT ? by_names[by] : NULL;
}

enum ds_status ds_summary_by_parse(const char *name, enum ds_summary_by *by_out) {
    if (by_out) *by_out = DS_SUMMARY_BY_BATCH;
    if (!name || !by_out) return ds_error_set(DS_ERR_ARG, "summary: no grouping key given");
    for (int i = 0; i < DS_SUMMARY_BY_COUNT; i++)
        if (!strcmp(name, by_names[i])) {
            *by_out = (enum ds_summary_by)i;
            return DS_OK;
        }
    return ds_error_set(DS_ERR_ARG,
                        "unknown grouping '%s' (batch, turn, category, step-batch, position, "
                        "channel)",
                        name);
}

int ds_summary_by_is_request_level(enum ds_summary_by by) {
    return by == DS_SUMMARY_BY_BATCH || by == DS_SUMMARY_BY_TURN || by == DS_SUMMARY_BY_CATEGORY;
}

int ds_summary_by_is_drafts_only(enum ds_summary_by by) {
    return by == DS_SUMMARY_BY_POSITION || by == DS_SUMMARY_BY_CHANNEL;
}

const char *ds_summary_channel_name(int channel) {
    return channel >= 0 && channel < DS_REC_CHANNEL_COUNT ? channel_names[channel] : NULL;
}

// ---------------------------------------------------------------------------------------------
// Metrics of one group.

static double ratio(double num, double den) {
    return den > 0 ? num / den : NAN;
}

double ds_summary_mean_acceptance_length(const struct ds_summary_group *g) {
    return g->steps ? 1.0 + (double)g->accepted / (double)g->steps : NAN;
}

double ds_summary_sglang_accept_length(const struct ds_summary_group *g) {
    return ratio((double)g->req_generated, (double)g->req_steps);
}

double ds_summary_emitted_per_step(const struct ds_summary_group *g) {
    return ratio((double)g->emitted, (double)g->steps);
}

double ds_summary_draft_acceptance_rate(const struct ds_summary_group *g) {
    return ratio((double)g->accepted, (double)g->drafted);
}

// Rows that accepted at least i drafts: the tail sum of the histogram.
static uint64_t at_least(const struct ds_summary_group *g, uint32_t k, uint32_t i) {
    uint64_t n = 0;
    for (uint32_t j = i; j <= k; j++)
        n += g->hist[j];
    return n;
}

double ds_summary_joint(const struct ds_summary_group *g, uint32_t k, uint32_t i) {
    if (i < 1 || i > k) return NAN;
    return ratio((double)at_least(g, k, i), (double)g->steps);
}

double ds_summary_conditional(const struct ds_summary_group *g, uint32_t k, uint32_t i) {
    if (i < 1 || i > k) return NAN;
    return ratio((double)at_least(g, k, i), (double)g->reached[i]);
}

double ds_summary_drafts_rate(const struct ds_summary_group *g) {
    return ratio((double)g->drafts_accepted, (double)g->drafts);
}

double ds_summary_expected(const struct ds_summary_group *g) {
    return ratio(g->drafts_expected, (double)g->drafts);
}

double ds_summary_expected_at(const struct ds_summary_group *g, uint32_t i) {
    return ratio(g->pos_expected[i], (double)g->pos_drafts[i]);
}

double ds_summary_mean_draft_ns(const struct ds_summary_group *g) {
    return ratio((double)g->draft_ns_sum, (double)g->timed_steps);
}

double ds_summary_mean_verify_ns(const struct ds_summary_group *g) {
    return ratio((double)g->verify_ns_sum, (double)g->timed_steps);
}

double ds_summary_predicted_speedup(const struct ds_summary_group *g) {
    double spec = ds_summary_mean_draft_ns(g) + ds_summary_mean_verify_ns(g);
    if (isnan(spec) || isnan(g->base_step_ns) || !(spec > 0)) return NAN;
    return ds_summary_mean_acceptance_length(g) * g->base_step_ns / spec;
}

double ds_summary_expected_channel(const struct ds_summary_group *g, int channel) {
    if (channel < 0 || channel >= DS_REC_CHANNEL_COUNT) return NAN;
    return ratio(g->ch_expected[channel], (double)g->ch_drafts[channel]);
}

// ---------------------------------------------------------------------------------------------
// Reading.

// Memory rows: only the columns the metrics use.
struct req_row {
    uint32_t request, category, generated_len, steps, dataset_index;
    uint16_t batch_size, turn;
    uint8_t stop_reason;
};
struct step_row {
    uint64_t step, draft_ns, verify_ns;
    uint32_t request;
    uint16_t batch_size;
    uint8_t drafted, accepted, emitted, nonfinite;
};
struct draft_row {
    uint64_t step;
    uint32_t request;
    int32_t draft_token, target_token;
    float expected_accept, q_draft, p_draft, p_target, margin, entropy_target, entropy_draft;
    uint16_t batch_size;
    uint8_t position, accepted, channel;
};
struct session_row {
    uint64_t trace_dropped;
    uint16_t session;
    uint8_t status;
};

// A column to read: its name, offset in the memory row, and native type. native 0 takes the
// file's own member type, which must be file_size bytes: for enums (u8 codes) and fixed strings
// (HDF5 never converts between string character sets, and ours are UTF-8).
struct col {
    const char *name;
    size_t offset;
    hid_t native;
    size_t file_size;
};

struct table {
    const char *name;
    hid_t dset, mtype;
    hsize_t rows;
};

// Request id -> index into the requests array, sorted by id.
struct req_index {
    uint32_t id, idx;
};

#define DIV_HASH_SEED 0xcbf29ce484222325ull // FNV-1a's offset basis (batch divergence)

struct ctx {
    const char *path;
    hid_t file;
    struct ds_summary *s;
    struct req_row *req;  // [rows_requests], file order
    struct req_index *ri; // [rows_requests], sorted by id
    size_t n_req;
    int32_t *req_group;       // request-level keys: group of each request (file order index)
    int32_t key_group[65536]; // row-level keys (all fit in u16): group of each key, -1 if none
    uint8_t **seen;           // row-level keys: per group, a bitmap over requests (distinct count)
    size_t n_seen, cap_groups;
    // Rows each finished request has in /steps and /drafts, and the drafts its steps announce:
    // checked against its /requests row once every table is read (check_request_rows).
    uint32_t *req_nsteps;
    uint64_t *req_ndrafts, *req_drafted;
    // Per finished request (file order), hashes of its kept drafts in file order: the fates
    // (draft and target token, acceptance) and those with every probability's bits (divergence).
    uint64_t *h_fate, *h_bits;
    int check_rows; // the resume check: a finished request missing rows is an error
    // (request, step) of the kept steps whose verify logits were not finite, sorted once the
    // steps are read: their /drafts rows are left out too (scan_drafts).
    struct nf_step {
        uint64_t step;
        uint32_t request;
    } *nf;
    size_t n_nf, cap_nf;
    // Opened past HDF5's "truncated file" check (open_file): the error to give instead when the
    // file turns out not to be a writer's that stopped on a failed write.
    char truncated_msg[1024];
};

// The innermost HDF5 error (walked upward, it comes first) is the most specific one.
static herr_t walk_first(unsigned n, const H5E_error2_t *err, void *data) {
    char *out = data;
    if (n == 0 && err->desc && err->desc[0]) snprintf(out, 200, "%s", err->desc);
    return 0;
}

// "<path>: <what>: <HDF5's innermost reason>", DS_ERR_IO.
__attribute__((format(printf, 2, 3))) static enum ds_status h5_fail(struct ctx *c, const char *fmt,
                                                                    ...) {
    char reason[200] = "", what[256];
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_first, reason);
    if (!reason[0]) snprintf(reason, sizeof reason, "HDF5 error");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ds_error_set(DS_ERR_IO, "%s: %s: %s", c->path, what, reason);
}

static void table_close(struct table *t) {
    if (t->mtype >= 0) H5Tclose(t->mtype);
    if (t->dset >= 0) H5Dclose(t->dset);
    t->mtype = t->dset = H5I_INVALID_HID;
}

// Opens a table and builds the memory compound of `cols`; names a missing table or column.
static enum ds_status table_open(struct ctx *c, const char *name, const struct col *cols, int n,
                                 size_t row_size, struct table *t) {
    t->name = name;
    t->dset = t->mtype = H5I_INVALID_HID;
    t->rows = 0;
    enum ds_status st = DS_OK;
    hid_t ftype = H5I_INVALID_HID, space = H5I_INVALID_HID;
    if (H5Lexists(c->file, name, H5P_DEFAULT) <= 0) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: not a draftscope run file: no table /%s", c->path,
                          name);
        goto cleanup;
    }
    if ((t->dset = H5Dopen2(c->file, name, H5P_DEFAULT)) < 0 ||
        (ftype = H5Dget_type(t->dset)) < 0 || (space = H5Dget_space(t->dset)) < 0) {
        st = h5_fail(c, "cannot open table /%s", name);
        goto cleanup;
    }
    hsize_t dims[1] = {0};
    if (H5Tget_class(ftype) != H5T_COMPOUND || H5Sget_simple_extent_ndims(space) != 1 ||
        H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: table /%s is not a 1-D table of records", c->path,
                          name);
        goto cleanup;
    }
    t->rows = dims[0];
    if ((t->mtype = H5Tcreate(H5T_COMPOUND, row_size)) < 0) {
        st = h5_fail(c, "cannot build the row type of /%s", name);
        goto cleanup;
    }
    for (int i = 0; i < n; i++) {
        int idx = H5Tget_member_index(ftype, cols[i].name);
        if (idx < 0) {
            st = ds_error_set(DS_ERR_FORMAT, "%s: table /%s has no column %s", c->path, name,
                              cols[i].name);
            goto cleanup;
        }
        hid_t mt = cols[i].native;
        herr_t e;
        if (mt == 0) {
            // Read with the file's own type (no conversion).
            hid_t member = H5Tget_member_type(ftype, (unsigned)idx);
            if (member < 0) {
                st = h5_fail(c, "cannot read the type of /%s.%s", name, cols[i].name);
                goto cleanup;
            }
            if (H5Tget_size(member) != cols[i].file_size) {
                H5Tclose(member);
                st = ds_error_set(DS_ERR_FORMAT, "%s: /%s.%s is not %zu bytes wide", c->path, name,
                                  cols[i].name, cols[i].file_size);
                goto cleanup;
            }
            e = H5Tinsert(t->mtype, cols[i].name, cols[i].offset, member);
            H5Tclose(member);
        } else {
            e = H5Tinsert(t->mtype, cols[i].name, cols[i].offset, mt);
        }
        if (e < 0) {
            st = h5_fail(c, "cannot build the row type of /%s", name);
            goto cleanup;
        }
    }
cleanup:
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    if (st) table_close(t);
    return st;
}

static enum ds_status table_read(struct ctx *c, const struct table *t, hsize_t start, hsize_t n,
                                 void *buf) {
    hid_t fs = H5Dget_space(t->dset), ms = H5Screate_simple(1, &n, NULL);
    herr_t e = -1;
    enum ds_status st = DS_OK;
    if (fs >= 0 && ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &n, NULL) >= 0)
        e = H5Dread(t->dset, t->mtype, ms, fs, H5P_DEFAULT, buf);
    if (e < 0) // before any other HDF5 call: they clear the error stack that names the reason
        st = h5_fail(c, "cannot read rows %llu..%llu of /%s", (unsigned long long)start,
                     (unsigned long long)(start + n - 1), t->name);
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return st;
}

// options_json: trace_overhead and baseline (docs/tracing.md). Absent keys leave NaN / no
// baseline; keys of the wrong type are a format error naming the file.
static enum ds_status read_options(struct ctx *c) {
    struct ds_summary *s = c->s;
    s->trace_overhead = NAN;
    s->n_baseline = 0;
    s->has_dataset = 0;
    s->has_load = 0;
    s->n_pad_sizes = 0;
    snprintf(s->numerics, sizeof s->numerics, "invariant");
    char *text = ds_h5_attr_strdup(c->file, "options_json");
    if (!text || !text[0]) {
        free(text);
        return DS_OK;
    }
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    free(text);
    enum ds_status st = DS_OK;
    if (!o || !json_is_object(o)) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: options_json is not a JSON object (%s)", c->path,
                          o ? "another JSON value" : err.text);
        goto cleanup;
    }
    json_t *ov = json_object_get(o, "trace_overhead");
    if (ov && json_is_number(ov)) s->trace_overhead = json_number_value(ov);
    json_t *dj = json_object_get(o, "dataset");
    if (dj) {
        json_t *rd = json_object_get(dj, "records_read");
        json_t *se = json_object_get(dj, "skipped_empty");
        json_t *sm = json_object_get(dj, "skipped_malformed");
        if (!json_is_object(dj) || !json_is_integer(rd) || !json_is_integer(se) ||
            !json_is_integer(sm) || json_integer_value(rd) < 0 || json_integer_value(se) < 0 ||
            json_integer_value(sm) < 0 ||
            json_integer_value(se) + json_integer_value(sm) > json_integer_value(rd)) {
            st = ds_error_set(DS_ERR_FORMAT,
                              "%s: options_json.dataset needs records_read, skipped_empty and "
                              "skipped_malformed (counts, the skips at most the records read)",
                              c->path);
            goto cleanup;
        }
        s->has_dataset = 1;
        s->dataset_records_read = (uint64_t)json_integer_value(rd);
        s->dataset_skipped_empty = (uint64_t)json_integer_value(se);
        s->dataset_skipped_malformed = (uint64_t)json_integer_value(sm);
        const char *first = json_string_value(json_object_get(dj, "first_skip"));
        snprintf(s->dataset_first_skip, sizeof s->dataset_first_skip, "%s", first ? first : "");
    }
    json_t *nj = json_object_get(o, "numerics");
    if (nj) {
        const char *v = json_string_value(nj);
        if (!v || (strcmp(v, "invariant") && strcmp(v, "batch-variant"))) {
            st = ds_error_set(DS_ERR_FORMAT,
                              "%s: options_json.numerics is not \"invariant\" or \"batch-variant\"",
                              c->path);
            goto cleanup;
        }
        snprintf(s->numerics, sizeof s->numerics, "%s", v);
    }
    json_t *pj = json_object_get(o, "pad_to_graph_sizes");
    if (pj) {
        bool ok = json_is_array(pj) && json_array_size(pj) <= 64;
        for (size_t i = 0; ok && i < json_array_size(pj); i++) {
            json_t *e = json_array_get(pj, i);
            ok = json_is_integer(e) && json_integer_value(e) >= 1 &&
                 json_integer_value(e) <= UINT16_MAX;
            if (ok) s->pad_sizes[s->n_pad_sizes++] = (uint32_t)json_integer_value(e);
        }
        if (!ok) {
            st = ds_error_set(DS_ERR_FORMAT, "%s: options_json.pad_to_graph_sizes is not a list "
                              "of at most 64 row counts 1..65535", c->path);
            goto cleanup;
        }
    }
    json_t *lj = json_object_get(o, "load");
    if (lj) {
        static const char *const names[2] = {"target", "draft"};
        for (int i = 0; i < 2; i++) {
            json_t *e = json_object_get(lj, names[i]);
            json_t *b = json_object_get(e, "bytes"), *sec = json_object_get(e, "seconds");
            json_t *up = json_object_get(e, "uploaded");
            if (!json_is_object(lj) || !json_is_integer(b) || json_integer_value(b) < 0 ||
                !json_is_number(sec) || !(json_number_value(sec) >= 0) || !json_is_boolean(up)) {
                st = ds_error_set(DS_ERR_FORMAT,
                                  "%s: options_json.load.%s needs bytes (a count), seconds (a "
                                  "number >= 0) and uploaded (true or false)",
                                  c->path, names[i]);
                goto cleanup;
            }
            s->load_bytes[i] = (uint64_t)json_integer_value(b);
            s->load_seconds[i] = json_number_value(sec);
            s->load_uploaded[i] = json_is_true(up);
        }
        s->has_load = 1;
    }
    json_t *base = json_object_get(o, "baseline");
    if (!base) goto cleanup;
    if (!json_is_array(base) || json_array_size(base) > DS_SUMMARY_MAX_BASELINE) {
        st = ds_error_set(DS_ERR_FORMAT,
                          "%s: options_json.baseline is not a list of at most %d batch sizes",
                          c->path, DS_SUMMARY_MAX_BASELINE);
        goto cleanup;
    }
    for (size_t i = 0; i < json_array_size(base); i++) {
        json_t *e = json_array_get(base, i);
        json_t *b = json_object_get(e, "batch_size"), *n = json_object_get(e, "steps");
        json_t *med = json_object_get(e, "median_ns"), *mean = json_object_get(e, "mean_ns");
        json_t *min = json_object_get(e, "min_ns");
        if (!json_is_integer(b) || json_integer_value(b) < 1 ||
            json_integer_value(b) > UINT16_MAX || !json_is_number(med) ||
            !(json_number_value(med) > 0)) {
            st = ds_error_set(DS_ERR_FORMAT,
                              "%s: options_json.baseline[%zu] needs batch_size (1..65535) and a "
                              "positive median_ns",
                              c->path, i);
            goto cleanup;
        }
        s->baseline[s->n_baseline++] = (struct ds_summary_baseline){
            .batch_size = (uint32_t)json_integer_value(b),
            .steps = json_is_integer(n) ? (uint64_t)json_integer_value(n) : 0,
            .median_ns = json_number_value(med),
            .mean_ns = json_is_number(mean) ? json_number_value(mean) : NAN,
            .min_ns = json_is_number(min) ? json_number_value(min) : NAN,
        };
    }
cleanup:
    json_decref(o);
    return st;
}

static enum ds_status read_attributes(struct ctx *c) {
    struct ds_summary *s = c->s;
    char schema[64];
    // A damaged root header fails the lookup itself: say so, not "not a run file".
    if (H5Aexists(c->file, "schema") < 0) return h5_fail(c, "cannot read the run attributes");
    if (ds_h5_attr_str(c->file, "schema", schema, sizeof schema) < 0 ||
        strcmp(schema, DS_RECORD_SCHEMA_NAME))
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: not a draftscope run file (no schema attribute \"%s\")", c->path,
                            DS_RECORD_SCHEMA_NAME);
    if (ds_h5_attr_num(c->file, "schema_version", H5T_NATIVE_UINT32, &s->schema_version) < 0)
        return ds_error_set(DS_ERR_FORMAT,
                            "%s: schema_version attribute missing or not one integer", c->path);
    // v1 differs only by lacking sessions.trace_dropped (read as 0).
    if (s->schema_version < 1 || s->schema_version > DS_RECORD_SCHEMA_VERSION)
        return ds_error_set(DS_ERR_UNSUPPORTED,
                            "%s: schema version %u, this build reads versions 1 to %u", c->path,
                            s->schema_version, DS_RECORD_SCHEMA_VERSION);
    if (ds_h5_attr_num(c->file, "k", H5T_NATIVE_UINT32, &s->k) < 0)
        return ds_error_set(DS_ERR_FORMAT, "%s: attribute k missing or not one integer", c->path);
    if (s->k < 1 || s->k > 255)
        return ds_error_set(DS_ERR_FORMAT, "%s: attribute k = %u outside 1..255", c->path, s->k);
    // Descriptive attributes: absent ones stay empty/NaN rather than failing the summary.
    s->temperature = s->top_p = NAN;
    ds_h5_attr_num(c->file, "temperature", H5T_NATIVE_DOUBLE, &s->temperature);
    ds_h5_attr_num(c->file, "top_p", H5T_NATIVE_DOUBLE, &s->top_p);
    ds_h5_attr_num(c->file, "seed", H5T_NATIVE_UINT64, &s->seed);
    ds_h5_attr_str(c->file, "rule", s->rule, sizeof s->rule);
    ds_h5_attr_str(c->file, "tool_version", s->tool_version, sizeof s->tool_version);
    ds_h5_attr_str(c->file, "git_commit", s->git_commit, sizeof s->git_commit);
    ds_h5_attr_str(c->file, "gpu_name", s->gpu_name, sizeof s->gpu_name);
    return read_options(c);
}

static enum ds_status read_sessions(struct ctx *c) {
    const struct col cols[] = {
        {"session", offsetof(struct session_row, session), H5T_NATIVE_UINT16, 0},
        {"status", offsetof(struct session_row, status), 0, 1},
        {"trace_dropped", offsetof(struct session_row, trace_dropped), H5T_NATIVE_UINT64, 0},
    };
    struct table t;
    int ncols = c->s->schema_version >= 2 ? 3 : 2; // v1 has no trace_dropped
    enum ds_status st = table_open(c, "sessions", cols, ncols, sizeof(struct session_row), &t);
    if (st) return st;
    c->s->n_sessions = (uint32_t)t.rows;
    c->s->last_session_status = DS_REC_SESSION_RUNNING;
    c->s->trace_dropped = 0;
    struct session_row r = {0};
    // Dropped records add up over the sessions (one row per writer session, a handful).
    for (hsize_t i = 0; i < t.rows && !st; i++)
        if (!(st = table_read(c, &t, i, 1, &r))) c->s->trace_dropped += r.trace_dropped;
    if (t.rows && !st) {
        c->s->last_session_status = r.status;
        if (r.status >= DS_REC_SESSION_COUNT)
            st = ds_error_set(DS_ERR_FORMAT, "%s: /sessions row %llu: status %u is not a status",
                              c->path, (unsigned long long)(t.rows - 1), r.status);
    }
    table_close(&t);
    return st;
}

static int cmp_req_index(const void *a, const void *b) {
    const struct req_index *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

// A row the writer never wrote: it writes batch sizes of 1 or more, and zeros stand where a file
// cut short, or copied while the run wrote it, lacks the rows its tables count (read as they
// are, a zero /requests row was a finished request 0 of batch size 0).
static enum ds_status check_written(struct ctx *c, const char *table, hsize_t row, uint16_t b) {
    if (b) return DS_OK;
    return ds_error_set(DS_ERR_FORMAT,
                        "%s: /%s row %llu has batch size 0: a row never written (past the last "
                        "flush: the file was cut short, or copied while the run wrote it)",
                        c->path, table, (unsigned long long)row);
}

static enum ds_status read_requests(struct ctx *c) {
    const struct col cols[] = {
        {"request", offsetof(struct req_row, request), H5T_NATIVE_UINT32, 0},
        {"category", offsetof(struct req_row, category), H5T_NATIVE_UINT32, 0},
        {"generated_len", offsetof(struct req_row, generated_len), H5T_NATIVE_UINT32, 0},
        {"steps", offsetof(struct req_row, steps), H5T_NATIVE_UINT32, 0},
        {"dataset_index", offsetof(struct req_row, dataset_index), H5T_NATIVE_UINT32, 0},
        {"batch_size", offsetof(struct req_row, batch_size), H5T_NATIVE_UINT16, 0},
        {"turn", offsetof(struct req_row, turn), H5T_NATIVE_UINT16, 0},
        {"stop_reason", offsetof(struct req_row, stop_reason), 0, 1},
    };
    struct table t;
    enum ds_status st = table_open(c, "requests", cols, 8, sizeof(struct req_row), &t);
    if (st) return st;
    c->s->rows_requests = t.rows;
    if (t.rows > (hsize_t)UINT32_MAX) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: /requests has %llu rows (ids are 32-bit)", c->path,
                          (unsigned long long)t.rows);
        goto cleanup;
    }
    c->n_req = (size_t)t.rows;
    if (c->n_req) {
        c->req = malloc(c->n_req * sizeof *c->req);
        c->ri = malloc(c->n_req * sizeof *c->ri);
        c->req_nsteps = calloc(c->n_req, sizeof *c->req_nsteps);
        c->req_ndrafts = calloc(c->n_req, sizeof *c->req_ndrafts);
        c->req_drafted = calloc(c->n_req, sizeof *c->req_drafted);
        c->h_fate = malloc(c->n_req * sizeof *c->h_fate);
        c->h_bits = malloc(c->n_req * sizeof *c->h_bits);
        if (!c->req || !c->ri || !c->req_nsteps || !c->req_ndrafts || !c->req_drafted ||
            !c->h_fate || !c->h_bits) {
            st = ds_error_set(DS_ERR_NOMEM, "%s: no memory for %zu requests", c->path, c->n_req);
            goto cleanup;
        }
        for (hsize_t at = 0; at < t.rows && !st; at += DS_SUMMARY_BLOCK_ROWS) {
            hsize_t n = t.rows - at < DS_SUMMARY_BLOCK_ROWS ? t.rows - at : DS_SUMMARY_BLOCK_ROWS;
            st = table_read(c, &t, at, n, c->req + at);
        }
        for (size_t i = 0; i < c->n_req && !st; i++)
            st = check_written(c, "requests", i, c->req[i].batch_size);
        if (st) goto cleanup;
        for (size_t i = 0; i < c->n_req; i++) {
            c->h_fate[i] = c->h_bits[i] = DIV_HASH_SEED;
            c->ri[i] = (struct req_index){c->req[i].request, (uint32_t)i};
            if (c->req[i].stop_reason < DS_REC_STOP_COUNT)
                c->s->stop_counts[c->req[i].stop_reason]++;
            if (c->req[i].stop_reason == DS_REC_STOP_ERROR) {
                c->s->error_requests++;
                c->s->error_requests_at_prompt += c->req[i].steps == 0;
            }
        }
        qsort(c->ri, c->n_req, sizeof *c->ri, cmp_req_index);
        for (size_t i = 1; i < c->n_req; i++)
            if (c->ri[i].id == c->ri[i - 1].id) {
                st = ds_error_set(DS_ERR_FORMAT,
                                  "%s: /requests rows %u and %u have the same request id %u",
                                  c->path, c->ri[i - 1].idx, c->ri[i].idx, c->ri[i].id);
                goto cleanup;
            }
    }
cleanup:
    table_close(&t);
    return st;
}

// Index of request `id` in c->req, or -1 when it has no /requests row (unfinished).
static int64_t find_request(const struct ctx *c, uint32_t id) {
    size_t lo = 0, hi = c->n_req;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->ri[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->n_req && c->ri[lo].id == id ? (int64_t)c->ri[lo].idx : -1;
}

// ---------------------------------------------------------------------------------------------
// Groups.

static enum ds_status group_init(struct ctx *c, struct ds_summary_group *g, uint64_t key) {
    size_t n = (size_t)c->s->k + 1;
    memset(g, 0, sizeof *g);
    g->key = key;
    g->base_step_ns = NAN;
    g->hist = calloc(4 * n, sizeof *g->hist);
    g->pos_expected = calloc(n, sizeof *g->pos_expected);
    if (!g->hist || !g->pos_expected) {
        free(g->hist);
        free(g->pos_expected);
        g->hist = NULL;
        g->pos_expected = NULL;
        return ds_error_set(DS_ERR_NOMEM, "%s: no memory for a summary group", c->path);
    }
    g->reached = g->hist + n;
    g->pos_drafts = g->hist + 2 * n;
    g->pos_accepted = g->hist + 3 * n;
    return DS_OK;
}

static void group_free(struct ds_summary_group *g) {
    free(g->hist);
    free(g->pos_expected);
    g->hist = g->reached = g->pos_drafts = g->pos_accepted = NULL;
    g->pos_expected = NULL;
}

// Index of the group with `key`, created if new (linear search: only called for request-level
// keys, once per request, and for row-level keys on the first sight of a key).
static enum ds_status group_get(struct ctx *c, uint64_t key, int32_t *idx_out) {
    struct ds_summary *s = c->s;
    for (size_t i = 0; i < s->n_groups; i++)
        if (s->groups[i].key == key) {
            *idx_out = (int32_t)i;
            return DS_OK;
        }
    if (s->n_groups == c->cap_groups) {
        size_t cap = c->cap_groups ? 2 * c->cap_groups : 16;
        struct ds_summary_group *g = realloc(s->groups, cap * sizeof *g);
        uint8_t **seen = realloc(c->seen, cap * sizeof *seen);
        if (g) s->groups = g;
        if (seen) c->seen = seen;
        if (!g || !seen) return ds_error_set(DS_ERR_NOMEM, "%s: no memory for groups", c->path);
        c->cap_groups = cap;
    }
    enum ds_status st = group_init(c, &s->groups[s->n_groups], key);
    if (st) return st;
    c->seen[s->n_groups] = NULL;
    c->n_seen = s->n_groups + 1;
    if (!ds_summary_by_is_request_level(s->by) && c->n_req) {
        c->seen[s->n_groups] = calloc((c->n_req + 7) / 8, 1);
        if (!c->seen[s->n_groups]) {
            group_free(&s->groups[s->n_groups]);
            return ds_error_set(DS_ERR_NOMEM, "%s: no memory for groups", c->path);
        }
    }
    *idx_out = (int32_t)s->n_groups++;
    return DS_OK;
}

static enum ds_status group_of_row_key(struct ctx *c, uint16_t key, int32_t *idx_out) {
    if (c->key_group[key] < 0) {
        enum ds_status st = group_get(c, key, &c->key_group[key]);
        if (st) return st;
    }
    *idx_out = c->key_group[key];
    return DS_OK;
}

static uint64_t request_key(enum ds_summary_by by, const struct req_row *r) {
    switch (by) {
    case DS_SUMMARY_BY_TURN:
        return r->turn;
    case DS_SUMMARY_BY_CATEGORY:
        return r->category;
    default:
        return r->batch_size;
    }
}

static void add_request(struct ds_summary_group *g, const struct req_row *r) {
    g->requests++;
    g->req_generated += r->generated_len;
    g->req_steps += r->steps;
}

// Request-level keys: every request's group, and the request sums of every group and of "all".
static enum ds_status assign_requests(struct ctx *c) {
    struct ds_summary *s = c->s;
    for (size_t i = 0; i < c->n_req; i++)
        add_request(&s->all, &c->req[i]);
    if (!ds_summary_by_is_request_level(s->by) || !c->n_req) return DS_OK;
    c->req_group = malloc(c->n_req * sizeof *c->req_group);
    if (!c->req_group) return ds_error_set(DS_ERR_NOMEM, "%s: no memory", c->path);
    for (size_t i = 0; i < c->n_req; i++) {
        enum ds_status st = group_get(c, request_key(s->by, &c->req[i]), &c->req_group[i]);
        if (st) return st;
        add_request(&s->groups[c->req_group[i]], &c->req[i]);
    }
    return DS_OK;
}

static void mark_seen(struct ctx *c, int32_t gi, int64_t ri) {
    uint8_t *bits = c->seen[gi];
    uint8_t bit = (uint8_t)(1u << (ri & 7));
    if (!(bits[ri >> 3] & bit)) {
        bits[ri >> 3] |= bit;
        c->s->groups[gi].requests++;
    }
}

static void add_step(struct ds_summary_group *g, const struct step_row *r) {
    // Phase times once per step id (every sequence of the step repeats them).
    if ((r->draft_ns || r->verify_ns) && !(g->has_last_step && g->last_step == r->step)) {
        g->timed_steps++;
        g->draft_ns_sum += r->draft_ns;
        g->verify_ns_sum += r->verify_ns;
        g->last_step = r->step;
        g->has_last_step = 1;
    }
    g->steps++;
    g->drafted += r->drafted;
    g->accepted += r->accepted;
    g->emitted += r->emitted;
    g->hist[r->accepted]++;
    // Position i was reached when it was drafted and every earlier draft was accepted.
    uint32_t top = r->accepted + 1u < r->drafted ? r->accepted + 1u : r->drafted;
    for (uint32_t i = 1; i <= top; i++)
        g->reached[i]++;
}

static void add_draft(struct ds_summary_group *g, const struct draft_row *r) {
    double e = (double)r->expected_accept;
    g->drafts++;
    g->drafts_accepted += r->accepted;
    g->drafts_expected += e;
    g->pos_drafts[r->position]++;
    g->pos_accepted[r->position] += r->accepted;
    g->pos_expected[r->position] += e;
    g->ch_drafts[r->channel]++;
    g->ch_accepted[r->channel] += r->accepted;
    g->ch_expected[r->channel] += e;
}

static enum ds_status nf_add(struct ctx *c, uint32_t request, uint64_t step) {
    if (c->n_nf == c->cap_nf) {
        size_t cap = c->cap_nf ? 2 * c->cap_nf : 16;
        struct nf_step *p = realloc(c->nf, cap * sizeof *p);
        if (!p) return ds_error_set(DS_ERR_NOMEM, "%s: no memory", c->path);
        c->nf = p;
        c->cap_nf = cap;
    }
    c->nf[c->n_nf++] = (struct nf_step){.step = step, .request = request};
    return DS_OK;
}

static int cmp_nf(const void *a, const void *b) {
    const struct nf_step *x = a, *y = b;
    if (x->request != y->request) return x->request < y->request ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

static int nf_has(const struct ctx *c, uint32_t request, uint64_t step) {
    const struct nf_step key = {.step = step, .request = request};
    return bsearch(&key, c->nf, c->n_nf, sizeof key, cmp_nf) != NULL;
}

static enum ds_status scan_steps(struct ctx *c, void *buf) {
    const struct col cols[] = {
        {"request", offsetof(struct step_row, request), H5T_NATIVE_UINT32, 0},
        {"step", offsetof(struct step_row, step), H5T_NATIVE_UINT64, 0},
        {"draft_ns", offsetof(struct step_row, draft_ns), H5T_NATIVE_UINT64, 0},
        {"verify_ns", offsetof(struct step_row, verify_ns), H5T_NATIVE_UINT64, 0},
        {"batch_size", offsetof(struct step_row, batch_size), H5T_NATIVE_UINT16, 0},
        {"drafted", offsetof(struct step_row, drafted), H5T_NATIVE_UINT8, 0},
        {"accepted", offsetof(struct step_row, accepted), H5T_NATIVE_UINT8, 0},
        {"emitted", offsetof(struct step_row, emitted), H5T_NATIVE_UINT8, 0},
        {"nonfinite", offsetof(struct step_row, nonfinite), H5T_NATIVE_UINT8, 0},
    };
    struct ds_summary *s = c->s;
    struct table t;
    enum ds_status st = table_open(c, "steps", cols, 9, sizeof(struct step_row), &t);
    if (st) return st;
    s->rows_steps = t.rows;
    struct step_row *rows = buf;
    for (hsize_t at = 0; at < t.rows && !st; at += DS_SUMMARY_BLOCK_ROWS) {
        hsize_t n = t.rows - at < DS_SUMMARY_BLOCK_ROWS ? t.rows - at : DS_SUMMARY_BLOCK_ROWS;
        if ((st = table_read(c, &t, at, n, rows))) break;
        for (hsize_t j = 0; j < n; j++) {
            const struct step_row *r = &rows[j];
            unsigned long long row = (unsigned long long)(at + j);
            if ((st = check_written(c, "steps", row, r->batch_size))) break;
            if (r->drafted > s->k || r->accepted > r->drafted || r->emitted > r->accepted + 1u) {
                st = ds_error_set(DS_ERR_FORMAT,
                                  "%s: /steps row %llu: drafted %u, accepted %u, emitted %u break "
                                  "accepted <= drafted <= k (%u), emitted <= accepted + 1",
                                  c->path, row, r->drafted, r->accepted, r->emitted, s->k);
                break;
            }
            int64_t ri = find_request(c, r->request);
            if (ri < 0) {
                s->dropped_steps++;
                continue;
            }
            c->req_nsteps[ri]++;
            c->req_drafted[ri] += r->drafted;
            if (r->drafted == 0) { // no draft, so no verify step: counted apart (docs/metrics.md)
                s->undrafted_steps++;
                continue;
            }
            // Non-finite verify logits: the step verified nothing (its drafts were not judged,
            // and its request ended with error), so it is counted apart, as a drafted-nothing
            // step is, and not as a step that accepted 0 (docs/metrics.md).
            const int nf = r->nonfinite != 0;
            if (nf) {
                if ((st = nf_add(c, r->request, r->step))) break;
                s->nonfinite_steps++;
                s->all.nonfinite++;
            } else {
                add_step(&s->all, r);
            }
            if (ds_summary_by_is_drafts_only(s->by)) continue;
            int32_t gi;
            if (ds_summary_by_is_request_level(s->by)) {
                gi = c->req_group[ri];
            } else {
                if ((st = group_of_row_key(c, r->batch_size, &gi))) break;
                mark_seen(c, gi, ri);
            }
            if (nf)
                s->groups[gi].nonfinite++;
            else
                add_step(&s->groups[gi], r);
        }
    }
    table_close(&t);
    if (c->n_nf > 1) qsort(c->nf, c->n_nf, sizeof *c->nf, cmp_nf);
    return st;
}

// One 32-bit word into a running hash, FNV-1a's step on whole words: for a given word each step
// is a bijection of h (the prime is odd), so two equal-length sequences that differ in a single
// word always hash apart; more differences collide with a chance of about 2^-64.
static uint64_t div_mix(uint64_t h, uint32_t w) {
    return (h ^ w) * 0x100000001b3ull;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

// A kept draft into its request's two hashes (batch divergence, ds_summary_group.has_div).
static void div_hash_draft(struct ctx *c, size_t ri, const struct draft_row *r) {
    const uint32_t fate[3] = {(uint32_t)r->draft_token, (uint32_t)r->target_token, r->accepted};
    const float p[7] = {r->q_draft, r->p_draft, r->p_target, r->margin, r->expected_accept,
                        r->entropy_target, r->entropy_draft};
    for (int i = 0; i < 3; i++) {
        c->h_fate[ri] = div_mix(c->h_fate[ri], fate[i]);
        c->h_bits[ri] = div_mix(c->h_bits[ri], fate[i]);
    }
    for (int i = 0; i < 7; i++)
        c->h_bits[ri] = div_mix(c->h_bits[ri], f32_bits(p[i]));
}

struct div_key {
    uint32_t dataset_index, idx; // idx: the request's file-order index
    uint16_t turn;
};

static int cmp_div_key(const void *a, const void *b) {
    const struct div_key *x = a, *y = b;
    if (x->dataset_index != y->dataset_index) return x->dataset_index < y->dataset_index ? -1 : 1;
    if (x->turn != y->turn) return x->turn < y->turn ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

// By batch: every request at another batch size than the smallest against its twin there (the
// same dataset_index and turn; the first in file order when there are several).
static enum ds_status batch_divergence(struct ctx *c) {
    struct ds_summary *s = c->s;
    if (s->by != DS_SUMMARY_BY_BATCH || c->n_req == 0) return DS_OK;
    uint32_t base = UINT32_MAX;
    for (size_t i = 0; i < c->n_req; i++)
        if (c->req[i].batch_size < base) base = c->req[i].batch_size;
    size_t n = 0;
    struct div_key *keys = malloc(c->n_req * sizeof *keys);
    if (!keys) return ds_error_set(DS_ERR_NOMEM, "%s: no memory for %zu requests", c->path,
                                   c->n_req);
    for (size_t i = 0; i < c->n_req; i++)
        if (c->req[i].batch_size == base)
            keys[n++] = (struct div_key){c->req[i].dataset_index, (uint32_t)i, c->req[i].turn};
    qsort(keys, n, sizeof *keys, cmp_div_key);
    for (size_t g = 0; g < s->n_groups; g++)
        if (s->groups[g].key != base) s->groups[g].has_div = 1, s->groups[g].div_base = base;
    for (size_t i = 0; i < c->n_req; i++) {
        if (c->req[i].batch_size == base) continue;
        size_t lo = 0, hi = n; // the first base key >= (dataset_index, turn)
        while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            const struct div_key *k = &keys[mid];
            if (k->dataset_index < c->req[i].dataset_index ||
                (k->dataset_index == c->req[i].dataset_index && k->turn < c->req[i].turn))
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == n || keys[lo].dataset_index != c->req[i].dataset_index ||
            keys[lo].turn != c->req[i].turn)
            continue;
        const size_t t = keys[lo].idx;
        struct ds_summary_group *gr = &s->groups[c->req_group[i]];
        gr->div_requests++;
        if (c->h_bits[i] == c->h_bits[t]) gr->div_bits_equal++;
        else if (c->h_fate[i] == c->h_fate[t]) gr->div_same_tokens++;
        else gr->div_parted++;
    }
    free(keys);
    return DS_OK;
}

static enum ds_status scan_drafts(struct ctx *c, void *buf) {
    const struct col cols[] = {
        {"step", offsetof(struct draft_row, step), H5T_NATIVE_UINT64, 0},
        {"request", offsetof(struct draft_row, request), H5T_NATIVE_UINT32, 0},
        {"expected_accept", offsetof(struct draft_row, expected_accept), H5T_NATIVE_FLOAT, 0},
        {"q_draft", offsetof(struct draft_row, q_draft), H5T_NATIVE_FLOAT, 0},
        {"batch_size", offsetof(struct draft_row, batch_size), H5T_NATIVE_UINT16, 0},
        {"position", offsetof(struct draft_row, position), H5T_NATIVE_UINT8, 0},
        {"accepted", offsetof(struct draft_row, accepted), H5T_NATIVE_UINT8, 0},
        {"channel", offsetof(struct draft_row, channel), 0, 1},
        // by batch only: the rest of what the batch divergence hashes
        {"draft_token", offsetof(struct draft_row, draft_token), H5T_NATIVE_INT32, 0},
        {"target_token", offsetof(struct draft_row, target_token), H5T_NATIVE_INT32, 0},
        {"p_draft", offsetof(struct draft_row, p_draft), H5T_NATIVE_FLOAT, 0},
        {"p_target", offsetof(struct draft_row, p_target), H5T_NATIVE_FLOAT, 0},
        {"margin", offsetof(struct draft_row, margin), H5T_NATIVE_FLOAT, 0},
        {"entropy_target", offsetof(struct draft_row, entropy_target), H5T_NATIVE_FLOAT, 0},
        {"entropy_draft", offsetof(struct draft_row, entropy_draft), H5T_NATIVE_FLOAT, 0},
    };
    struct ds_summary *s = c->s;
    const bool div = s->by == DS_SUMMARY_BY_BATCH;
    struct table t;
    enum ds_status st =
        table_open(c, "drafts", cols, div ? 15 : 8, sizeof(struct draft_row), &t);
    if (st) return st;
    s->rows_drafts = t.rows;
    struct draft_row *rows = buf;
    for (hsize_t at = 0; at < t.rows && !st; at += DS_SUMMARY_BLOCK_ROWS) {
        hsize_t n = t.rows - at < DS_SUMMARY_BLOCK_ROWS ? t.rows - at : DS_SUMMARY_BLOCK_ROWS;
        if ((st = table_read(c, &t, at, n, rows))) break;
        for (hsize_t j = 0; j < n; j++) {
            const struct draft_row *r = &rows[j];
            unsigned long long row = (unsigned long long)(at + j);
            if ((st = check_written(c, "drafts", row, r->batch_size))) break;
            if (r->position < 1 || r->position > s->k || r->accepted > 1 ||
                r->channel >= DS_REC_CHANNEL_COUNT) {
                st = ds_error_set(DS_ERR_FORMAT,
                                  "%s: /drafts row %llu: position %u (1..%u), accepted %u (0/1), "
                                  "channel %u (0..%d) out of range",
                                  c->path, row, r->position, s->k, r->accepted, r->channel,
                                  DS_REC_CHANNEL_COUNT - 1);
                break;
            }
            int64_t ri = find_request(c, r->request);
            if (ri < 0) {
                s->dropped_drafts++;
                continue;
            }
            c->req_ndrafts[ri]++;
            if (c->n_nf && nf_has(c, r->request, r->step)) { // a step that verified nothing
                s->nonfinite_drafts++;
                continue;
            }
            // The draft's own numbers failed (its logits held NaN or Inf): counted and said;
            // the draft's acceptance stays what happened (no metric leaves it out).
            s->nonfinite_q_drafts += !(isfinite(r->q_draft) && r->q_draft > 0.0f);
            if (div) div_hash_draft(c, (size_t)ri, r);
            add_draft(&s->all, r);
            int32_t gi;
            if (ds_summary_by_is_request_level(s->by)) {
                gi = c->req_group[ri];
            } else {
                uint16_t key = s->by == DS_SUMMARY_BY_POSITION  ? r->position
                               : s->by == DS_SUMMARY_BY_CHANNEL ? r->channel
                                                                : r->batch_size;
                if ((st = group_of_row_key(c, key, &gi))) break;
                mark_seen(c, gi, ri);
            }
            add_draft(&s->groups[gi], r);
        }
    }
    table_close(&t);
    return st;
}

// A finished request's /requests row is written after all of its /steps and /drafts rows, so it
// has exactly its `steps` step rows and one /drafts row per draft they announce. Other counts mean
// rows were lost (a file cut short, or one written before the tables were flushed in that order)
// and a resumed run would add to a file whose rates are off. Only the resume check refuses this:
// a summary still reads such a file (and files made by other tools) as they are.
static enum ds_status check_request_rows(struct ctx *c) {
    if (!c->check_rows) return DS_OK;
    for (size_t i = 0; i < c->n_req; i++) {
        const struct req_row *q = &c->req[i];
        if (c->req_nsteps[i] != q->steps)
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: request %u is recorded finished after %u steps, but /steps "
                                "holds %u of its rows (rows lost)",
                                c->path, q->request, q->steps, c->req_nsteps[i]);
        if (c->req_ndrafts[i] != c->req_drafted[i])
            return ds_error_set(DS_ERR_FORMAT,
                                "%s: request %u: its /steps rows draft %llu tokens, but /drafts "
                                "holds %llu of its rows (rows lost)",
                                c->path, q->request, (unsigned long long)c->req_drafted[i],
                                (unsigned long long)c->req_ndrafts[i]);
    }
    return DS_OK;
}

// Labels: numbers as decimal, channels by name, categories from /strings ("" -> "(none)").
static enum ds_status label_groups(struct ctx *c) {
    struct ds_summary *s = c->s;
    struct table t = {.dset = H5I_INVALID_HID, .mtype = H5I_INVALID_HID};
    enum ds_status st = DS_OK;
    snprintf(s->all.label, sizeof s->all.label, "all");
    // The strings table: text (fixed-size, NUL padded, UTF-8) and the full length, which tells a
    // text the writer cut (docs/hdf5-schema.md): such a label ends with an ellipsis.
    struct str_row {
        char text[DS_RECORD_STRING_BYTES];
        uint32_t length;
    } row;
    if (s->by == DS_SUMMARY_BY_CATEGORY && s->n_groups) {
        const struct col cols[] = {{"text", offsetof(struct str_row, text), 0,
                                    DS_RECORD_STRING_BYTES},
                                   {"length", offsetof(struct str_row, length), H5T_NATIVE_UINT32,
                                    0}};
        st = table_open(c, "strings", cols, 2, sizeof row, &t);
        if (st) return st;
    }
    for (size_t i = 0; i < s->n_groups && !st; i++) {
        struct ds_summary_group *g = &s->groups[i];
        if (s->by == DS_SUMMARY_BY_CHANNEL) {
            snprintf(g->label, sizeof g->label, "%s", channel_names[g->key]);
        } else if (s->by == DS_SUMMARY_BY_CATEGORY) {
            if (g->key >= t.rows) {
                st = ds_error_set(DS_ERR_FORMAT,
                                  "%s: /requests names category string %llu beyond /strings "
                                  "(%llu rows)",
                                  c->path, (unsigned long long)g->key, (unsigned long long)t.rows);
                break;
            }
            memset(&row, 0, sizeof row);
            if ((st = table_read(c, &t, g->key, 1, &row))) break;
            const size_t n = strnlen(row.text, sizeof row.text);
            if (!n && !row.length)
                snprintf(g->label, sizeof g->label, "(none)");
            else
                snprintf(g->label, sizeof g->label, "%.*s%s", (int)n, row.text,
                         row.length > n ? "\xe2\x80\xa6" : ""); // U+2026
        } else {
            snprintf(g->label, sizeof g->label, "%llu", (unsigned long long)g->key);
        }
    }
    table_close(&t);
    return st;
}

static int cmp_key(const void *a, const void *b) {
    const struct ds_summary_group *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

static int cmp_label(const void *a, const void *b) {
    const struct ds_summary_group *x = a, *y = b;
    int d = strcmp(x->label, y->label);
    return d ? d : cmp_key(a, b);
}

// The baseline's median step time for groups keyed by a batch size (batch, step-batch); "all"
// gets it when it is that one group.
static void attach_baseline(struct ds_summary *s) {
    if (s->by != DS_SUMMARY_BY_BATCH && s->by != DS_SUMMARY_BY_STEP_BATCH) return;
    for (size_t i = 0; i < s->n_groups; i++)
        for (size_t j = 0; j < s->n_baseline; j++)
            if (s->baseline[j].batch_size == s->groups[i].key)
                s->groups[i].base_step_ns = s->baseline[j].median_ns;
    if (s->n_groups == 1) s->all.base_step_ns = s->groups[0].base_step_ns;
}

// Metadata read attempts in SWMR mode. A reader retries a metadata block whose checksum fails,
// with growing sleeps, in case the writer was in the middle of writing it; HDF5's default of 100
// turns a corrupted file into a wait of many minutes. A few attempts cover a concurrent flush.
#define SWMR_READ_ATTEMPTS 5

static herr_t walk_truncated(unsigned n, const H5E_error2_t *err, void *data) {
    (void)n;
    if (err->min_num == H5E_TRUNCATED) *(int *)data = 1;
    return 0;
}

static hid_t open_file(struct ctx *c) {
    // SWMR_READ reads a file being written and one whose writer died; a file written without
    // the latest format (not ours, or converted) only opens without it.
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && H5Pset_metadata_read_attempts(fapl, SWMR_READ_ATTEMPTS) < 0) {
        H5Pclose(fapl);
        fapl = H5I_INVALID_HID;
    }
    hid_t f = H5Fopen(c->path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl >= 0 ? fapl : H5P_DEFAULT);
    int truncated = 0;
    if (f < 0) H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_truncated, &truncated);
    if (f < 0 && truncated) {
        // A write stopped by a file-size limit leaves a superblock whose end of file lies past
        // the bytes on disk, and the writer cannot extend the file under that limit. Read it as
        // the extension would give it (HDF5 reads bytes past the end as zeros), without
        // changing it; compute() accepts this only for a session that failed (truncated_msg).
        // The message first: any other HDF5 call clears the error stack it comes from.
        h5_fail(c, "cannot open the run file");
        uint64_t size = 0;
        const uint64_t missing = ds_rec_bytes_missing(c->path, &size);
        if (missing) // in bytes, not HDF5's "eof = ..., stored_eof = ..."
            ds_error_set(DS_ERR_IO,
                         "%s: truncated file: %llu bytes of the %llu its superblock records (a "
                         "copy cut short, or taken while the run wrote it)",
                         c->path, (unsigned long long)size, (unsigned long long)(size + missing));
        snprintf(c->truncated_msg, sizeof c->truncated_msg, "%s", ds_error_last());
    }
    if (c->truncated_msg[0] && H5Pexist(fapl, "skip_eof_check") > 0) {
        hbool_t on = 1;
        if (H5Pset(fapl, "skip_eof_check", &on) >= 0)
            f = H5Fopen(c->path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl);
        if (f < 0) c->truncated_msg[0] = '\0';
    }
    if (f < 0) f = H5Fopen(c->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    // H5Pclose clears the error stack: keep the failed open's for h5_fail (a truncated file's
    // reason, for one, was reported as a bare "HDF5 error").
    const hid_t es = f < 0 ? H5Eget_current_stack() : H5I_INVALID_HID;
    if (fapl >= 0) H5Pclose(fapl);
    if (es >= 0) H5Eset_current_stack(es); // restores it and closes es
    return f;
}

// The summary of an open run file: shared by ds_summary_compute and the recorder's resume check.
static enum ds_status compute(struct ctx *c, struct ds_summary *s) {
    enum ds_status st = read_attributes(c);
    if (!st && !(st = group_init(c, &s->all, 0))) st = read_sessions(c);
    // Only a failed write explains a file shorter than it records; a copy cut short does not
    // (the missing bytes, read as zeros, would pass for rows, or fail as damage).
    if (c->truncated_msg[0] && (st || s->last_session_status != DS_REC_SESSION_FAILED))
        return ds_error_set(DS_ERR_IO, "%s", c->truncated_msg);
    if (st || (st = read_requests(c)) || (st = assign_requests(c))) return st;
    size_t row = sizeof(struct step_row) > sizeof(struct draft_row) ? sizeof(struct step_row)
                                                                    : sizeof(struct draft_row);
    void *buf = malloc(row * DS_SUMMARY_BLOCK_ROWS);
    if (!buf) return ds_error_set(DS_ERR_NOMEM, "%s: no memory", c->path);
    if (!(st = scan_steps(c, buf)) && !(st = scan_drafts(c, buf)) &&
        !(st = check_request_rows(c)) && !(st = label_groups(c)) &&
        !(st = batch_divergence(c))) { // before the sort: req_group indexes the groups
        if (s->n_groups)
            qsort(s->groups, s->n_groups, sizeof *s->groups,
                  s->by == DS_SUMMARY_BY_CATEGORY ? cmp_label : cmp_key);
        if (!ds_summary_by_is_request_level(s->by)) s->all.requests = c->n_req;
        attach_baseline(s);
    }
    free(buf);
    return st;
}

static enum ds_status ctx_new(const char *path, enum ds_summary_by by, struct ctx **c_out,
                              struct ds_summary **s_out) {
    struct ctx *c = *c_out = calloc(1, sizeof *c);
    struct ds_summary *s = *s_out = calloc(1, sizeof *s);
    if (!c || !s) return ds_error_set(DS_ERR_NOMEM, "%s: no memory", path);
    c->path = path;
    c->s = s;
    c->file = H5I_INVALID_HID;
    for (size_t i = 0; i < 65536; i++)
        c->key_group[i] = -1;
    snprintf(s->path, sizeof s->path, "%s", path);
    s->by = by;
    return DS_OK;
}

// Frees the context; the file is closed only when the summary opened it.
static void ctx_free(struct ctx *c, int close_file) {
    if (!c) return;
    if (close_file && c->file >= 0) H5Fclose(c->file);
    for (size_t i = 0; i < c->n_seen; i++)
        free(c->seen[i]);
    free(c->seen);
    free(c->req);
    free(c->ri);
    free(c->req_group);
    free(c->req_nsteps);
    free(c->req_ndrafts);
    free(c->req_drafted);
    free(c->h_fate);
    free(c->h_bits);
    free(c->nf);
    free(c);
}

enum ds_status ds_summary_compute(const char *path, enum ds_summary_by by,
                                  struct ds_summary **summary_out) {
    if (summary_out) *summary_out = NULL;
    if (!path || !summary_out || (unsigned)by >= DS_SUMMARY_BY_COUNT)
        return ds_error_set(DS_ERR_ARG, "summary: invalid argument");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); // failures are reported as one line, below
    struct ctx *c = NULL;
    struct ds_summary *s = NULL;
    enum ds_status st = ctx_new(path, by, &c, &s);
    if (st) goto cleanup;
    struct stat sb;
    if (stat(path, &sb) < 0) {
        st = ds_error_set(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto cleanup;
    }
    if (S_ISDIR(sb.st_mode) || sb.st_size == 0) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: %s, not a run file", path,
                          S_ISDIR(sb.st_mode) ? "a directory" : "an empty file");
        goto cleanup;
    }
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_h5 = H5Fis_accessible(path, H5P_DEFAULT);
#else
    htri_t is_h5 = H5Fis_hdf5(path);
#endif
    if (is_h5 <= 0) {
        st = ds_error_set(DS_ERR_FORMAT, "%s: not an HDF5 file", path);
        goto cleanup;
    }
    if ((c->file = open_file(c)) < 0) {
        st = h5_fail(c, "cannot open the run file");
        goto cleanup;
    }
    if ((st = compute(c, s))) goto cleanup;
    *summary_out = s;
    s = NULL;
cleanup:
    ctx_free(c, 1);
    ds_summary_free(s);
    return st;
}

enum ds_status ds_summary_check_open(hid_t file, const char *path) {
    struct ctx *c = NULL;
    struct ds_summary *s = NULL;
    enum ds_status st = ctx_new(path, DS_SUMMARY_BY_BATCH, &c, &s);
    if (!st) {
        c->file = file;
        c->check_rows = 1;
        st = compute(c, s);
    }
    ctx_free(c, 0);
    ds_summary_free(s);
    return st;
}

void ds_summary_free(struct ds_summary *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_groups; i++)
        group_free(&s->groups[i]);
    free(s->groups);
    group_free(&s->all);
    free(s);
}

// ---------------------------------------------------------------------------------------------
// Output.

static const char *session_name(uint8_t st) {
    return st < DS_REC_SESSION_COUNT ? session_names[st] : "?";
}

// A number, or "-" for NaN (a ratio with nothing to count).
static const char *num(char *buf, size_t n, double v, int prec) {
    if (isnan(v))
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%.*f", prec, v);
    return buf;
}

// Step times and the predicted speedup (docs/metrics.md).
static void print_step_times(const struct ds_summary *s, const struct ds_summary_group *g,
                             FILE *f) {
    char a[32], b[32], d[32];
    if (!s->all.timed_steps) {
        fprintf(f, "  step times: not measured (run with --trace phases or kernels)\n");
        return;
    }
    fprintf(f, "  step time per step      (draft + verify, %" PRIu64 " timed steps)  %s + %s ms\n",
            g->timed_steps, num(a, sizeof a, ds_summary_mean_draft_ns(g) / 1e6, 4),
            num(b, sizeof b, ds_summary_mean_verify_ns(g) / 1e6, 4));
    if (!isnan(g->base_step_ns))
        fprintf(f,
                "  predicted speedup       (tau x base step / (draft + verify))      %s  (base "
                "decode step %s ms)\n",
                num(a, sizeof a, ds_summary_predicted_speedup(g), 3),
                num(d, sizeof d, g->base_step_ns / 1e6, 4));
    else if (s->n_baseline && g == &s->all)
        fprintf(f, "  predicted speedup: per batch size only (see each batch group)\n");
    else if (s->n_baseline && s->by != DS_SUMMARY_BY_BATCH && s->by != DS_SUMMARY_BY_STEP_BATCH)
        fprintf(f, "  predicted speedup: per batch size only (summary --by batch)\n");
    else
        fprintf(f, "  predicted speedup: no baseline for this batch size (run with --baseline)\n");
}

static void print_group(const struct ds_summary *s, const struct ds_summary_group *g, FILE *f) {
    char a[32], b[32], d[32], e[32];
    int drafts_only = ds_summary_by_is_drafts_only(s->by) && g != &s->all;
    const char *what = g == &s->all ? "all" : by_names[s->by];
    if (g == &s->all)
        fprintf(f, "\n== all rows: ");
    else
        fprintf(f, "\n== %s %s: ", what, g->label);
    if (drafts_only)
        fprintf(f, "%" PRIu64 " requests, %" PRIu64 " drafts\n", g->requests, g->drafts);
    else
        fprintf(f, "%" PRIu64 " requests, %" PRIu64 " steps, %" PRIu64 " drafts\n", g->requests,
                g->steps, g->drafts);
    if (!drafts_only) {
        fprintf(f, "  mean acceptance length  (vLLM/EAGLE: 1 + accepted/steps)          %s\n",
                num(a, sizeof a, ds_summary_mean_acceptance_length(g), 4));
        fprintf(f, "  SGLang accept length    (completion tokens/verify steps)          %s\n",
                num(a, sizeof a, ds_summary_sglang_accept_length(g), 4));
        fprintf(f, "  tokens emitted per step (emitted/steps)                           %s\n",
                num(a, sizeof a, ds_summary_emitted_per_step(g), 4));
        fprintf(f,
                "  draft acceptance rate   (accepted/drafted)                        %s  (%" PRIu64
                "/%" PRIu64 ")\n",
                num(a, sizeof a, ds_summary_draft_acceptance_rate(g), 4), g->accepted, g->drafted);
        if (g->nonfinite)
            fprintf(f, "  steps with non-finite verify logits (not in the figures): %" PRIu64 "\n",
                    g->nonfinite);
        if (g->has_div) // each request against its twin at the smallest batch size
            fprintf(f,
                    "  against B %u (the same conversation turns): %" PRIu64 " requests, %" PRIu64
                    " bit for bit equal, %" PRIu64 " with the same tokens but other "
                    "probabilities, %" PRIu64 " whose tokens part\n",
                    g->div_base, g->div_requests, g->div_bits_equal, g->div_same_tokens,
                    g->div_parted);
        fprintf(
            f, "  pos  joint P(acc>=i)  conditional  drafts  drafts rate  expected sum min(p,q)\n");
        for (uint32_t i = 1; i <= s->k; i++)
            fprintf(
                f, "  %3u  %15s  %11s  %6" PRIu64 "  %11s  %21s\n", i,
                num(a, sizeof a, ds_summary_joint(g, s->k, i), 4),
                num(b, sizeof b, ds_summary_conditional(g, s->k, i), 4), g->pos_drafts[i],
                num(d, sizeof d, ratio((double)g->pos_accepted[i], (double)g->pos_drafts[i]), 4),
                num(e, sizeof e, ds_summary_expected_at(g, i), 4));
        fprintf(f, "  accepted-count histogram (steps accepting exactly j):");
        for (uint32_t j = 0; j <= s->k; j++)
            fprintf(f, " %u:%" PRIu64, j, g->hist[j]);
        fputc('\n', f);
        print_step_times(s, g, f);
    } else {
        fprintf(f,
                "  acceptance of drafted tokens (accepted/drafts)                    %s  (%" PRIu64
                "/%" PRIu64 ")\n",
                num(a, sizeof a, ds_summary_drafts_rate(g), 4), g->drafts_accepted, g->drafts);
        fprintf(f, "  expected acceptance     (mean sum min(p,q))                       %s\n",
                num(a, sizeof a, ds_summary_expected(g), 4));
    }
    fprintf(f, "  channel     drafts  accepted  rate    expected\n");
    for (int ch = 0; ch < DS_REC_CHANNEL_COUNT; ch++) {
        if (!g->ch_drafts[ch]) continue;
        fprintf(f, "  %-10s  %6" PRIu64 "  %8" PRIu64 "  %6s  %8s\n", channel_names[ch],
                g->ch_drafts[ch], g->ch_accepted[ch],
                num(a, sizeof a, ratio((double)g->ch_accepted[ch], (double)g->ch_drafts[ch]), 4),
                num(b, sizeof b, ds_summary_expected_channel(g, ch), 4));
    }
}

enum ds_status ds_summary_print_text(const struct ds_summary *s, FILE *f) {
    if (!s || !f) return ds_error_set(DS_ERR_ARG, "summary: invalid argument");
    fprintf(f, "draftscope summary: %s\n", s->path);
    fprintf(f, "  schema v%u, rule %s, K %u, temperature %g, top-p %g, seed %" PRIu64 "\n",
            s->schema_version, s->rule[0] ? s->rule : "?", s->k, s->temperature, s->top_p, s->seed);
    if (strcmp(s->numerics, "invariant")) // said only when the batch may move the numbers
        fprintf(f, "  numerics: %s (each call's attention split follows its size, as in "
                   "flash-decoding engines: acceptance may differ between batch sizes)\n",
                s->numerics);
    fprintf(f, "  %u writer session%s, the last %s%s\n", s->n_sessions,
            s->n_sessions == 1 ? "" : "s", session_name(s->last_session_status),
            s->last_session_status == DS_REC_SESSION_RUNNING
                ? " (still being written, or its writer died)"
                : "");
    fprintf(f,
            "  rows: %" PRIu64 " steps, %" PRIu64 " drafts, %" PRIu64 " requests; dropped "
            "(request unfinished): %" PRIu64 " steps, %" PRIu64 " drafts\n",
            s->rows_steps, s->rows_drafts, s->rows_requests, s->dropped_steps, s->dropped_drafts);
    if (s->rows_requests) { // how the finished requests ended, the reasons that occur
        fprintf(f, "  requests by stop reason:");
        for (int i = 0; i < DS_REC_STOP_COUNT; i++)
            if (s->stop_counts[i])
                fprintf(f, " %s %" PRIu64, ds_rec_stop_name((enum ds_rec_stop)i),
                        s->stop_counts[i]);
        fputc('\n', f);
    }
    if (s->undrafted_steps)
        fprintf(f, "  %" PRIu64 " steps drafted nothing (one position short of the context "
                   "limit) and are left out of the step metrics\n",
                s->undrafted_steps);
    if (s->nonfinite_steps)
        fprintf(f, "  %" PRIu64 " step%s had non-finite verify logits (the request%s ended with "
                   "error): %s and %s %" PRIu64 " drafts are left out of every metric\n",
                s->nonfinite_steps, s->nonfinite_steps == 1 ? "" : "s",
                s->nonfinite_steps == 1 ? "" : "s", s->nonfinite_steps == 1 ? "it" : "they",
                s->nonfinite_steps == 1 ? "its" : "their", s->nonfinite_drafts);
    if (s->nonfinite_q_drafts)
        fprintf(f, "  %" PRIu64 " drafted token%s had no finite draft probability (q_draft "
                   "NaN, Inf or 0: the draft's logits held NaN or Inf); %s expected acceptance "
                   "is undefined (the expected columns show -), %s acceptance is counted\n",
                s->nonfinite_q_drafts, s->nonfinite_q_drafts == 1 ? "" : "s",
                s->nonfinite_q_drafts == 1 ? "its" : "their",
                s->nonfinite_q_drafts == 1 ? "its" : "their");
    if (s->error_requests)
        fprintf(f,
                "  %" PRIu64 " request%s ended with error (non-finite target logits), %" PRIu64
                " of them at the prompt's last logits, before any step\n",
                s->error_requests, s->error_requests == 1 ? "" : "s",
                s->error_requests_at_prompt);
    if (!isnan(s->trace_overhead))
        fprintf(f, "  trace overhead: %.2f%% (tokens/s lost to tracing, measured in the run against "
                   "tracing paused)\n",
                100.0 * s->trace_overhead);
    if (!isnan(s->trace_overhead) || s->trace_dropped)
        fprintf(f, "  trace records dropped by CUPTI: %" PRIu64 "\n", s->trace_dropped);
    if (s->n_pad_sizes) {
        fprintf(f, "  verify padded to graph sizes");
        for (int i = 0; i < s->n_pad_sizes; i++)
            fprintf(f, "%s%u", i ? ", " : " ", s->pad_sizes[i]);
        fprintf(f, " (rows, as CUDA-graph engines pad)\n");
    }
    if (s->has_load) {
        fprintf(f, "  weights:");
        for (int i = 0; i < 2; i++) {
            fprintf(f, "%s %s %.3f GB ", i ? ";" : "", i ? "draft" : "target",
                    (double)s->load_bytes[i] / 1e9);
            // Seconds to 3 significant digits: a generated or cached load takes milliseconds.
            if (!s->load_uploaded[i]) // mapped in place: the time is the checks', not a copy's
                fprintf(f, "mapped in place (%.3g s)", s->load_seconds[i]);
            else if (s->load_seconds[i] > 0)
                fprintf(f, "in %.3g s (%.2f GB/s)", s->load_seconds[i],
                        (double)s->load_bytes[i] / 1e9 / s->load_seconds[i]);
            else
                fprintf(f, "in %.3g s", s->load_seconds[i]);
        }
        fprintf(f, " (the creating run's load)\n");
    }
    char note[512];
    if (s->has_dataset &&
        ds_dataset_skip_text(note, sizeof note, s->dataset_records_read, s->dataset_skipped_empty,
                             s->dataset_skipped_malformed, s->dataset_first_skip))
        fprintf(f, "  dataset: %s\n", note);
    for (size_t i = 0; i < s->n_groups; i++)
        print_group(s, &s->groups[i], f);
    print_group(s, &s->all, f);
    fflush(f);
    if (ferror(f)) return ds_error_set(DS_ERR_IO, "summary: cannot write the output");
    return DS_OK;
}

static json_t *real_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *u64(uint64_t v) {
    return json_integer((json_int_t)v);
}

static json_t *group_json(const struct ds_summary *s, const struct ds_summary_group *g) {
    json_t *o = json_object();
    json_object_set_new(o, "key", g == &s->all ? json_null() : u64(g->key));
    json_object_set_new(o, "label", ds_cli_json_text(g->label));
    json_object_set_new(o, "requests", u64(g->requests));
    json_object_set_new(o, "steps", u64(g->steps));
    json_object_set_new(o, "drafted", u64(g->drafted));
    json_object_set_new(o, "accepted", u64(g->accepted));
    json_object_set_new(o, "emitted", u64(g->emitted));
    json_object_set_new(o, "nonfinite", u64(g->nonfinite));
    json_object_set_new(o, "completion_tokens", u64(g->req_generated));
    json_object_set_new(o, "request_steps", u64(g->req_steps));
    json_object_set_new(o, "mean_acceptance_length",
                        real_or_null(ds_summary_mean_acceptance_length(g)));
    json_object_set_new(o, "sglang_accept_length",
                        real_or_null(ds_summary_sglang_accept_length(g)));
    json_object_set_new(o, "emitted_per_step", real_or_null(ds_summary_emitted_per_step(g)));
    json_object_set_new(o, "draft_acceptance_rate",
                        real_or_null(ds_summary_draft_acceptance_rate(g)));
    json_t *hist = json_array();
    for (uint32_t j = 0; j <= s->k; j++)
        json_array_append_new(hist, u64(g->hist[j]));
    json_object_set_new(o, "histogram", hist);
    json_t *pos = json_array();
    for (uint32_t i = 1; i <= s->k; i++) {
        json_t *p = json_object();
        json_object_set_new(p, "position", json_integer(i));
        json_object_set_new(p, "joint", real_or_null(ds_summary_joint(g, s->k, i)));
        json_object_set_new(p, "conditional", real_or_null(ds_summary_conditional(g, s->k, i)));
        json_object_set_new(p, "reached", u64(g->reached[i]));
        json_object_set_new(p, "drafts", u64(g->pos_drafts[i]));
        json_object_set_new(p, "drafts_accepted", u64(g->pos_accepted[i]));
        json_object_set_new(
            p, "drafts_rate",
            real_or_null(ratio((double)g->pos_accepted[i], (double)g->pos_drafts[i])));
        json_object_set_new(p, "expected", real_or_null(ds_summary_expected_at(g, i)));
        json_array_append_new(pos, p);
    }
    json_object_set_new(o, "positions", pos);
    json_object_set_new(o, "timed_steps", u64(g->timed_steps));
    json_object_set_new(o, "mean_draft_ns", real_or_null(ds_summary_mean_draft_ns(g)));
    json_object_set_new(o, "mean_verify_ns", real_or_null(ds_summary_mean_verify_ns(g)));
    json_object_set_new(o, "base_step_ns", real_or_null(g->base_step_ns));
    json_object_set_new(o, "predicted_speedup", real_or_null(ds_summary_predicted_speedup(g)));
    if (g->has_div) {
        json_t *dv = json_object();
        json_object_set_new(dv, "base", json_integer(g->div_base));
        json_object_set_new(dv, "requests", u64(g->div_requests));
        json_object_set_new(dv, "bits_equal", u64(g->div_bits_equal));
        json_object_set_new(dv, "same_tokens", u64(g->div_same_tokens));
        json_object_set_new(dv, "parted", u64(g->div_parted));
        json_object_set_new(o, "divergence", dv);
    } else {
        json_object_set_new(o, "divergence", json_null());
    }
    json_t *d = json_object();
    json_object_set_new(d, "rows", u64(g->drafts));
    json_object_set_new(d, "accepted", u64(g->drafts_accepted));
    json_object_set_new(d, "rate", real_or_null(ds_summary_drafts_rate(g)));
    json_object_set_new(d, "expected", real_or_null(ds_summary_expected(g)));
    json_object_set_new(o, "drafts", d);
    json_t *chs = json_array();
    for (int ch = 0; ch < DS_REC_CHANNEL_COUNT; ch++) {
        json_t *c = json_object();
        json_object_set_new(c, "channel", json_string(channel_names[ch]));
        json_object_set_new(c, "drafts", u64(g->ch_drafts[ch]));
        json_object_set_new(c, "accepted", u64(g->ch_accepted[ch]));
        json_object_set_new(
            c, "rate", real_or_null(ratio((double)g->ch_accepted[ch], (double)g->ch_drafts[ch])));
        json_object_set_new(c, "expected", real_or_null(ds_summary_expected_channel(g, ch)));
        json_array_append_new(chs, c);
    }
    json_object_set_new(o, "channels", chs);
    return o;
}

enum ds_status ds_summary_print_json(const struct ds_summary *s, FILE *f) {
    if (!s || !f) return ds_error_set(DS_ERR_ARG, "summary: invalid argument");
    json_t *o = json_object();
    if (!o) return ds_error_set(DS_ERR_NOMEM, "summary: no memory");
    json_object_set_new(o, "file", ds_cli_json_text(s->path));
    json_object_set_new(o, "schema_version", json_integer(s->schema_version));
    json_object_set_new(o, "by", json_string(by_names[s->by]));
    json_t *run = json_object();
    json_object_set_new(run, "rule", ds_cli_json_text(s->rule));
    json_object_set_new(run, "k", json_integer(s->k));
    json_object_set_new(run, "temperature", real_or_null(s->temperature));
    json_object_set_new(run, "top_p", real_or_null(s->top_p));
    json_object_set_new(run, "seed", u64(s->seed));
    json_object_set_new(run, "tool_version", ds_cli_json_text(s->tool_version));
    json_object_set_new(run, "git_commit", ds_cli_json_text(s->git_commit));
    json_object_set_new(run, "gpu_name", ds_cli_json_text(s->gpu_name));
    json_object_set_new(run, "sessions", json_integer(s->n_sessions));
    json_object_set_new(run, "last_session_status",
                        json_string(session_name(s->last_session_status)));
    json_object_set_new(run, "trace_overhead", real_or_null(s->trace_overhead));
    json_object_set_new(run, "trace_dropped", u64(s->trace_dropped));
    json_object_set_new(run, "numerics", json_string(s->numerics));
    json_t *pads = json_array();
    for (int i = 0; i < s->n_pad_sizes; i++)
        json_array_append_new(pads, json_integer(s->pad_sizes[i]));
    json_object_set_new(run, "pad_to_graph_sizes", pads);
    if (s->has_dataset) {
        json_t *dj = json_object();
        json_object_set_new(dj, "records_read", u64(s->dataset_records_read));
        json_object_set_new(dj, "skipped_empty", u64(s->dataset_skipped_empty));
        json_object_set_new(dj, "skipped_malformed", u64(s->dataset_skipped_malformed));
        json_object_set_new(dj, "first_skip", s->dataset_first_skip[0]
                                                  ? ds_cli_json_text(s->dataset_first_skip)
                                                  : json_null());
        json_object_set_new(run, "dataset", dj);
    } else {
        json_object_set_new(run, "dataset", json_null());
    }
    if (s->has_load) {
        json_t *lj = json_object();
        for (int i = 0; i < 2; i++) {
            json_t *e = json_object();
            json_object_set_new(e, "bytes", u64(s->load_bytes[i]));
            json_object_set_new(e, "seconds", real_or_null(s->load_seconds[i]));
            json_object_set_new(e, "uploaded", json_boolean(s->load_uploaded[i]));
            json_object_set_new(lj, i ? "draft" : "target", e);
        }
        json_object_set_new(run, "load", lj);
    } else {
        json_object_set_new(run, "load", json_null());
    }
    json_t *base = json_array();
    for (size_t i = 0; i < s->n_baseline; i++) {
        const struct ds_summary_baseline *b = &s->baseline[i];
        json_t *e = json_object();
        json_object_set_new(e, "batch_size", json_integer(b->batch_size));
        json_object_set_new(e, "steps", u64(b->steps));
        json_object_set_new(e, "median_ns", real_or_null(b->median_ns));
        json_object_set_new(e, "mean_ns", real_or_null(b->mean_ns));
        json_object_set_new(e, "min_ns", real_or_null(b->min_ns));
        json_array_append_new(base, e);
    }
    json_object_set_new(run, "baseline", base);
    json_object_set_new(o, "run", run);
    json_t *rows = json_object();
    json_object_set_new(rows, "steps", u64(s->rows_steps));
    json_object_set_new(rows, "drafts", u64(s->rows_drafts));
    json_object_set_new(rows, "requests", u64(s->rows_requests));
    json_object_set_new(rows, "dropped_steps", u64(s->dropped_steps));
    json_object_set_new(rows, "undrafted_steps", u64(s->undrafted_steps));
    json_object_set_new(rows, "dropped_drafts", u64(s->dropped_drafts));
    json_object_set_new(rows, "nonfinite_steps", u64(s->nonfinite_steps));
    json_object_set_new(rows, "nonfinite_drafts", u64(s->nonfinite_drafts));
    json_object_set_new(rows, "nonfinite_q_drafts", u64(s->nonfinite_q_drafts));
    json_t *stops = json_object();
    for (int i = 0; i < DS_REC_STOP_COUNT; i++)
        json_object_set_new(stops, ds_rec_stop_name((enum ds_rec_stop)i), u64(s->stop_counts[i]));
    json_object_set_new(rows, "stop_reasons", stops);
    json_object_set_new(rows, "error_requests", u64(s->error_requests));
    json_object_set_new(rows, "error_requests_at_prompt", u64(s->error_requests_at_prompt));
    json_object_set_new(o, "rows", rows);
    json_t *groups = json_array();
    for (size_t i = 0; i < s->n_groups; i++) {
        json_array_append_new(groups, group_json(s, &s->groups[i]));
    }
    json_object_set_new(o, "groups", groups);
    json_object_set_new(o, "all", group_json(s, &s->all));
    int e = json_dumpf(o, f, JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (e == 0) fputc('\n', f);
    fflush(f);
    if (e < 0 || ferror(f)) return ds_error_set(DS_ERR_IO, "summary: cannot write the output");
    return DS_OK;
}
