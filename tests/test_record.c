// The HDF5 run file (ds/record.h): layout, round trip of every table, string interning, crash and
// concurrent-reader behaviour under SWMR, resume, full disk, overwrite refusal.
//
// Every read-back goes through the plain HDF5 C API, not the recorder, and every expected value
// is a closed-form function of the row index written here (make_* below), so a reader bug and a
// writer bug cannot cancel out. Floats are compared bit-for-bit: the file keeps the native layout
// and HDF5 performs no conversion, so any difference is a bug (tolerance 0).
#include "harness.h"
#include "run_attr.h"

#include "ds/check.h"
#include "ds/record.h"
#include "ds/summary.h"

#include <hdf5.h>

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[512];

static const char *tmp_path(const char *name) {
    static char buf[4][600];
    static int which;
    char *p = buf[which++ % 4];
    snprintf(p, 600, "%s/%s", dir, name);
    unlink(p);
    return p;
}

static const uint32_t batch_sizes[] = {1, 8, 32};

static struct ds_run_meta test_meta(void) {
    struct ds_run_meta m = {
        .command_line = "draftscope run --target t --draft d --k 3",
        .gpu_name = "NVIDIA H200",
        .driver_version = "550.54.15",
        .cuda_version = "12.4",
        .target_path = "/models/gpt-oss-20b",
        .target_config_sha256 = "aa11",
        .draft_path = "/models/eagle3",
        .draft_config_sha256 = "bb22",
        .dataset_path = "/data/sharegpt.json",
        .dataset_sha256 = "cc33",
        .rule = "greedy",
        .options_json = "{\"max_new_tokens\":256}",
        .seed = 1234,
        .k = 3,
        .temperature = 0.7,
        .top_p = 0.95,
        .batch_sizes = batch_sizes,
        .n_batch_sizes = 3,
        .trace_level = DS_REC_TRACE_PHASES,
    };
    return m;
}

// ---- deterministic rows: every field a distinct function of the index ----

static struct ds_rec_draft make_draft(uint64_t i) {
    struct ds_rec_draft d;
    memset(&d, 0, sizeof d);
    d.step = 1000 + i / 3;
    d.request = (uint32_t)(i % 7);
    d.draft_token = (int32_t)(i * 31 % 201088);
    d.q_draft = 1.0f / (float)(i + 2);
    d.p_draft = 0.5f / (float)(i + 3);
    d.target_token = -(int32_t)(i % 11);
    d.p_target = 0.25f + (float)(i % 13) / 64.0f;
    d.margin = (float)(i % 17) / 32.0f;
    d.expected_accept = (float)(i % 19) / 19.0f;
    d.entropy_target = 3.5f + (float)i;
    d.entropy_draft = -(float)i;
    d.context_len = (uint32_t)(i * 3 + 1);
    d.batch_size = (uint16_t)(1 + i % 64);
    d.position = (uint8_t)(1 + i % 3);
    d.accepted = (uint8_t)(i % 2);
    d.channel = (uint8_t)(i % DS_REC_CHANNEL_COUNT);
    return d;
}

static int same_draft(const struct ds_rec_draft *a, const struct ds_rec_draft *b) {
    return a->step == b->step && a->request == b->request && a->draft_token == b->draft_token &&
           !memcmp(&a->q_draft, &b->q_draft, 4) && !memcmp(&a->p_draft, &b->p_draft, 4) &&
           a->target_token == b->target_token && !memcmp(&a->p_target, &b->p_target, 4) &&
           !memcmp(&a->margin, &b->margin, 4) &&
           !memcmp(&a->expected_accept, &b->expected_accept, 4) &&
           !memcmp(&a->entropy_target, &b->entropy_target, 4) &&
           !memcmp(&a->entropy_draft, &b->entropy_draft, 4) && a->context_len == b->context_len &&
           a->batch_size == b->batch_size && a->position == b->position &&
           a->accepted == b->accepted && a->channel == b->channel;
}

static struct ds_rec_step make_step(uint64_t i) {
    struct ds_rec_step s;
    memset(&s, 0, sizeof s);
    s.step = 5000 + i;
    s.draft_ns = i * 10 + 1;
    s.verify_ns = i * 10 + 2;
    s.accept_ns = i * 10 + 3;
    s.total_ns = (uint64_t)1 << 40 | i;
    s.request = (uint32_t)(i % 9);
    s.context_len = (uint32_t)(i + 100);
    s.batch_size = (uint16_t)(1 + i % 33); // never 0: a row never written
    s.turn = (uint16_t)(i % 4);
    s.drafted = 3;
    s.accepted = (uint8_t)(i % 4);
    s.emitted = (uint8_t)(i % 4 + 1);
    s.nonfinite = (uint8_t)(i % 5 == 0);
    for (int l = 0; l < 36; l++)
        s.distinct_experts[l] = (uint16_t)((i + (uint64_t)l) % 129);
    return s;
}

static int same_step(const struct ds_rec_step *a, const struct ds_rec_step *b) {
    return a->step == b->step && a->draft_ns == b->draft_ns && a->verify_ns == b->verify_ns &&
           a->accept_ns == b->accept_ns && a->total_ns == b->total_ns && a->request == b->request &&
           a->context_len == b->context_len && a->batch_size == b->batch_size &&
           a->turn == b->turn && a->drafted == b->drafted && a->accepted == b->accepted &&
           a->emitted == b->emitted && a->nonfinite == b->nonfinite &&
           !memcmp(a->distinct_experts, b->distinct_experts, sizeof a->distinct_experts);
}

static struct ds_rec_request make_request(uint64_t i) {
    struct ds_rec_request r;
    memset(&r, 0, sizeof r);
    r.start_ns = i * 1000;
    r.end_ns = i * 1000 + 999;
    r.request = (uint32_t)i;
    r.dataset_index = (uint32_t)(i * 2);
    r.category = 0;
    r.conversation = 0;
    r.prompt_len = (uint32_t)(50 + i);
    r.generated_len = (uint32_t)(256 - i);
    r.steps = (uint32_t)(i + 3);
    r.batch_size = (uint16_t)(i % 2 ? 8 : 1);
    r.turn = (uint16_t)(i % 3);
    r.session = 77; // overwritten by the recorder with the session id
    r.stop_reason = (uint8_t)(i % DS_REC_STOP_COUNT);
    return r;
}

static int same_request(const struct ds_rec_request *a, const struct ds_rec_request *b) {
    return a->start_ns == b->start_ns && a->end_ns == b->end_ns && a->request == b->request &&
           a->dataset_index == b->dataset_index && a->category == b->category &&
           a->conversation == b->conversation && a->prompt_len == b->prompt_len &&
           a->generated_len == b->generated_len && a->steps == b->steps &&
           a->batch_size == b->batch_size && a->turn == b->turn && a->session == b->session &&
           a->stop_reason == b->stop_reason;
}

static struct ds_rec_kernel make_kernel(uint64_t i) {
    struct ds_rec_kernel k;
    memset(&k, 0, sizeof k);
    k.step = 7 + i / 10;
    k.start_ns = i * 100;
    k.end_ns = i * 100 + 42;
    k.graph_node = i ? (uint64_t)1 << 50 | i : 0;
    k.name = 0;
    k.stream = (uint32_t)(i % 3);
    k.grid_x = (uint32_t)i + 1;
    k.grid_y = 2;
    k.grid_z = 3;
    k.block_x = 128;
    k.block_y = (uint32_t)(i % 4 + 1);
    k.block_z = 1;
    k.static_smem = (uint32_t)(i * 16);
    k.dynamic_smem = (uint32_t)(i * 32);
    k.correlation = (uint32_t)(i + 9);
    k.registers = (uint16_t)(i % 255);
    k.phase = (uint8_t)(i % DS_REC_PHASE_COUNT);
    k.draft_step = (uint8_t)(i % 3);
    return k;
}

static int same_kernel(const struct ds_rec_kernel *a, const struct ds_rec_kernel *b) {
    return a->step == b->step && a->start_ns == b->start_ns && a->end_ns == b->end_ns &&
           a->graph_node == b->graph_node && a->name == b->name && a->stream == b->stream &&
           a->grid_x == b->grid_x && a->grid_y == b->grid_y && a->grid_z == b->grid_z &&
           a->block_x == b->block_x && a->block_y == b->block_y && a->block_z == b->block_z &&
           a->static_smem == b->static_smem && a->dynamic_smem == b->dynamic_smem &&
           a->correlation == b->correlation && a->registers == b->registers &&
           a->phase == b->phase && a->draft_step == b->draft_step;
}

static struct ds_rec_range make_range(uint64_t i) {
    struct ds_rec_range r;
    memset(&r, 0, sizeof r);
    r.step = 3 + i / 6;
    r.start_ns = i * 77;
    r.end_ns = i * 77 + 70;
    r.batch_size = (uint16_t)(i % 40);
    r.phase = (uint8_t)(i % DS_REC_PHASE_COUNT);
    r.draft_step = (uint8_t)(i % 2);
    return r;
}

static int same_range(const struct ds_rec_range *a, const struct ds_rec_range *b) {
    return a->step == b->step && a->start_ns == b->start_ns && a->end_ns == b->end_ns &&
           a->batch_size == b->batch_size && a->phase == b->phase && a->draft_step == b->draft_step;
}

// ---- reading back with the plain HDF5 API ----

static hid_t open_ro(const char *path, int swmr) {
    return H5Fopen(path, swmr ? H5F_ACC_RDONLY | H5F_ACC_SWMR_READ : H5F_ACC_RDONLY, H5P_DEFAULT);
}

static hsize_t table_rows(hid_t f, const char *name) {
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return (hsize_t)-1;
    hid_t s = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(s, &n, NULL);
    H5Sclose(s);
    H5Dclose(d);
    return n;
}

// Reads a whole table into a malloc'd array of `size`-byte records, with the file's own type as
// the memory type (layout_matches_compound checks that type against the C struct).
static void *read_table(hid_t f, const char *name, size_t size, hsize_t *n_out) {
    *n_out = 0;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return NULL;
    hid_t t = H5Dget_type(d), s = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(s, &n, NULL);
    void *buf = calloc(n ? n : 1, size);
    if (H5Tget_size(t) != size || H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        free(buf);
        buf = NULL;
    }
    H5Sclose(s);
    H5Tclose(t);
    H5Dclose(d);
    *n_out = n;
    return buf;
}

// Reads table `name` and expects exactly n_want rows equal to make(0..n_want-1), after `fixup`
// (a statement that may adjust `want`, the expected row).
#define EXPECT_TABLE(f, name, type, n_want, make, same, fixup)                                     \
    do {                                                                                           \
        hsize_t n_;                                                                                \
        type *rows_ = read_table(f, name, sizeof(type), &n_);                                      \
        EXPECT(rows_ != NULL);                                                                     \
        EXPECT_EQ_INT(n_, n_want);                                                                 \
        int bad_ = 0;                                                                              \
        for (hsize_t i_ = 0; rows_ && i_ < n_; i_++) {                                             \
            type want = make(i_);                                                                  \
            fixup;                                                                                 \
            bad_ += !same(&rows_[i_], &want);                                                      \
        }                                                                                          \
        EXPECT_EQ_INT(bad_, 0);                                                                    \
        free(rows_);                                                                               \
    } while (0)

static int count_bad_drafts(const struct ds_rec_draft *rows, hsize_t n, uint64_t first) {
    int bad = 0;
    for (hsize_t i = 0; i < n; i++) {
        struct ds_rec_draft want = make_draft(first + i);
        if (!same_draft(&rows[i], &want)) {
            if (!bad) fprintf(stderr, "  first bad draft row %llu\n", (unsigned long long)i);
            bad++;
        }
    }
    return bad;
}

static void read_str_attr(hid_t f, const char *name, char *buf, size_t n) {
    buf[0] = '\0';
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    if (a < 0) return;
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8); // HDF5 does not convert between character sets
    char *p = NULL;
    if (H5Aread(a, t, &p) >= 0 && p) {
        snprintf(buf, n, "%s", p);
        H5free_memory(p);
    }
    H5Tclose(t);
    H5Aclose(a);
}

static uint8_t session_status(hid_t f, hsize_t row) {
    hsize_t n;
    struct ds_rec_session *s = read_table(f, "sessions", sizeof *s, &n);
    uint8_t st = s && row < n ? s[row].status : 255;
    free(s);
    return st;
}

// ---- cases ----

// Expected member list per table, written out by hand (names, classes and sizes from the schema;
// offsets from the C compiler's layout of the struct).
struct member {
    const char *name;
    size_t offset;
    H5T_class_t cls;
    size_t size;
};
#define M(st, m, cls, size)                                                                        \
    { #m, offsetof(struct st, m), cls, size }

static void check_layout(hid_t f, const char *table, size_t size, const struct member *m, int nm) {
    hid_t d = H5Dopen2(f, table, H5P_DEFAULT);
    EXPECT(d >= 0);
    if (d < 0) return;
    hid_t t = H5Dget_type(d);
    EXPECT_EQ_INT(H5Tget_class(t), H5T_COMPOUND);
    EXPECT_EQ_INT(H5Tget_size(t), size);
    EXPECT_EQ_INT(H5Tget_nmembers(t), nm);
    for (int i = 0; i < nm && i < H5Tget_nmembers(t); i++) {
        char *name = H5Tget_member_name(t, (unsigned)i);
        hid_t mt = H5Tget_member_type(t, (unsigned)i);
        EXPECT_EQ_STR(name, m[i].name);
        EXPECT_EQ_INT(H5Tget_member_offset(t, (unsigned)i), m[i].offset);
        EXPECT_EQ_INT(H5Tget_member_class(t, (unsigned)i), m[i].cls);
        EXPECT_EQ_INT(H5Tget_size(mt), m[i].size);
        H5Tclose(mt);
        H5free_memory(name);
    }
    // A chunked 1-D table with an unlimited dimension.
    hid_t s = H5Dget_space(d), p = H5Dget_create_plist(d);
    hsize_t cur, max;
    EXPECT_EQ_INT(H5Sget_simple_extent_dims(s, &cur, &max), 1);
    EXPECT(max == H5S_UNLIMITED);
    EXPECT_EQ_INT(H5Pget_layout(p), H5D_CHUNKED);
    H5Pclose(p);
    H5Sclose(s);
    H5Tclose(t);
    H5Dclose(d);
}

static void layout_matches_compound(void) {
    const char *path = tmp_path("layout.h5");
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    EXPECT_OK(ds_recorder_close(rec));
    hid_t f = open_ro(path, 0);
    EXPECT(f >= 0);
    if (f < 0) return;
    // The sizes are the schema's (hand-added field widths plus alignment padding).
    EXPECT_EQ_INT(sizeof(struct ds_rec_draft), 64);
    const struct member drafts[] = {
        M(ds_rec_draft, step, H5T_INTEGER, 8),
        M(ds_rec_draft, request, H5T_INTEGER, 4),
        M(ds_rec_draft, draft_token, H5T_INTEGER, 4),
        M(ds_rec_draft, q_draft, H5T_FLOAT, 4),
        M(ds_rec_draft, p_draft, H5T_FLOAT, 4),
        M(ds_rec_draft, target_token, H5T_INTEGER, 4),
        M(ds_rec_draft, p_target, H5T_FLOAT, 4),
        M(ds_rec_draft, margin, H5T_FLOAT, 4),
        M(ds_rec_draft, expected_accept, H5T_FLOAT, 4),
        M(ds_rec_draft, entropy_target, H5T_FLOAT, 4),
        M(ds_rec_draft, entropy_draft, H5T_FLOAT, 4),
        M(ds_rec_draft, context_len, H5T_INTEGER, 4),
        M(ds_rec_draft, batch_size, H5T_INTEGER, 2),
        M(ds_rec_draft, position, H5T_INTEGER, 1),
        M(ds_rec_draft, accepted, H5T_INTEGER, 1),
        M(ds_rec_draft, channel, H5T_ENUM, 1),
    };
    check_layout(f, "drafts", 64, drafts, 16);
    EXPECT_EQ_INT(sizeof(struct ds_rec_step), 184);
    const struct member steps[] = {
        M(ds_rec_step, step, H5T_INTEGER, 8),
        M(ds_rec_step, draft_ns, H5T_INTEGER, 8),
        M(ds_rec_step, verify_ns, H5T_INTEGER, 8),
        M(ds_rec_step, accept_ns, H5T_INTEGER, 8),
        M(ds_rec_step, total_ns, H5T_INTEGER, 8),
        M(ds_rec_step, request, H5T_INTEGER, 4),
        M(ds_rec_step, context_len, H5T_INTEGER, 4),
        M(ds_rec_step, batch_size, H5T_INTEGER, 2),
        M(ds_rec_step, turn, H5T_INTEGER, 2),
        M(ds_rec_step, drafted, H5T_INTEGER, 1),
        M(ds_rec_step, accepted, H5T_INTEGER, 1),
        M(ds_rec_step, emitted, H5T_INTEGER, 1),
        M(ds_rec_step, nonfinite, H5T_INTEGER, 1),
        M(ds_rec_step, distinct_experts, H5T_ARRAY, 128),
    };
    check_layout(f, "steps", 184, steps, 14);
    const struct member requests[] = {
        M(ds_rec_request, start_ns, H5T_INTEGER, 8),
        M(ds_rec_request, end_ns, H5T_INTEGER, 8),
        M(ds_rec_request, request, H5T_INTEGER, 4),
        M(ds_rec_request, dataset_index, H5T_INTEGER, 4),
        M(ds_rec_request, category, H5T_INTEGER, 4),
        M(ds_rec_request, conversation, H5T_INTEGER, 4),
        M(ds_rec_request, prompt_len, H5T_INTEGER, 4),
        M(ds_rec_request, generated_len, H5T_INTEGER, 4),
        M(ds_rec_request, steps, H5T_INTEGER, 4),
        M(ds_rec_request, batch_size, H5T_INTEGER, 2),
        M(ds_rec_request, turn, H5T_INTEGER, 2),
        M(ds_rec_request, session, H5T_INTEGER, 2),
        M(ds_rec_request, stop_reason, H5T_ENUM, 1),
    };
    check_layout(f, "requests", 56, requests, 13);
    const struct member kernels[] = {
        M(ds_rec_kernel, step, H5T_INTEGER, 8),
        M(ds_rec_kernel, start_ns, H5T_INTEGER, 8),
        M(ds_rec_kernel, end_ns, H5T_INTEGER, 8),
        M(ds_rec_kernel, graph_node, H5T_INTEGER, 8),
        M(ds_rec_kernel, name, H5T_INTEGER, 4),
        M(ds_rec_kernel, stream, H5T_INTEGER, 4),
        M(ds_rec_kernel, grid_x, H5T_INTEGER, 4),
        M(ds_rec_kernel, grid_y, H5T_INTEGER, 4),
        M(ds_rec_kernel, grid_z, H5T_INTEGER, 4),
        M(ds_rec_kernel, block_x, H5T_INTEGER, 4),
        M(ds_rec_kernel, block_y, H5T_INTEGER, 4),
        M(ds_rec_kernel, block_z, H5T_INTEGER, 4),
        M(ds_rec_kernel, static_smem, H5T_INTEGER, 4),
        M(ds_rec_kernel, dynamic_smem, H5T_INTEGER, 4),
        M(ds_rec_kernel, correlation, H5T_INTEGER, 4),
        M(ds_rec_kernel, registers, H5T_INTEGER, 2),
        M(ds_rec_kernel, phase, H5T_ENUM, 1),
        M(ds_rec_kernel, draft_step, H5T_INTEGER, 1),
    };
    check_layout(f, "kernels", 80, kernels, 18);
    const struct member ranges[] = {
        M(ds_rec_range, step, H5T_INTEGER, 8),   M(ds_rec_range, start_ns, H5T_INTEGER, 8),
        M(ds_rec_range, end_ns, H5T_INTEGER, 8), M(ds_rec_range, batch_size, H5T_INTEGER, 2),
        M(ds_rec_range, phase, H5T_ENUM, 1),     M(ds_rec_range, draft_step, H5T_INTEGER, 1),
    };
    check_layout(f, "ranges", 32, ranges, 6);
    const struct member strings[] = {
        M(ds_rec_string, id, H5T_INTEGER, 4),
        M(ds_rec_string, length, H5T_INTEGER, 4),
        M(ds_rec_string, text, H5T_STRING, DS_RECORD_STRING_BYTES),
    };
    check_layout(f, "strings", 1024, strings, 3);
    const struct member sessions[] = {
        M(ds_rec_session, start_unix_ns, H5T_INTEGER, 8),
        M(ds_rec_session, end_unix_ns, H5T_INTEGER, 8),
        M(ds_rec_session, first_step, H5T_INTEGER, 8),
        M(ds_rec_session, next_step, H5T_INTEGER, 8),
        M(ds_rec_session, trace_overhead, H5T_FLOAT, 8),
        M(ds_rec_session, trace_dropped, H5T_INTEGER, 8),
        M(ds_rec_session, command_line, H5T_INTEGER, 4),
        M(ds_rec_session, session, H5T_INTEGER, 2),
        M(ds_rec_session, status, H5T_ENUM, 1),
        M(ds_rec_session, trace_level, H5T_ENUM, 1),
    };
    check_layout(f, "sessions", 56, sessions, 10);

    // Enum members: the names docs/hdf5-schema.md promises, in value order.
    hid_t d = H5Dopen2(f, "drafts", H5P_DEFAULT), t = H5Dget_type(d);
    int ci = H5Tget_member_index(t, "channel");
    hid_t et = H5Tget_member_type(t, (unsigned)ci);
    const char *want[] = {"header", "analysis", "commentary", "final", "other"};
    EXPECT_EQ_INT(H5Tget_nmembers(et), 5);
    for (uint8_t v = 0; v < 5; v++) {
        char name[32] = "";
        H5Tenum_nameof(et, &v, name, sizeof name);
        EXPECT_EQ_STR(name, want[v]);
    }
    H5Tclose(et);
    H5Tclose(t);
    H5Dclose(d);
    d = H5Dopen2(f, "requests", H5P_DEFAULT);
    t = H5Dget_type(d);
    et = H5Tget_member_type(t, (unsigned)H5Tget_member_index(t, "stop_reason"));
    const char *stops[] = {"return",         "call",          "endoftext",
                           "max_new_tokens", "context_limit", "error"};
    for (uint8_t v = 0; v < 6; v++) {
        char name[32] = "";
        H5Tenum_nameof(et, &v, name, sizeof name);
        EXPECT_EQ_STR(name, stops[v]);
    }
    H5Tclose(et);
    H5Tclose(t);
    H5Dclose(d);
    H5Fclose(f);
}

enum { N_DRAFTS = 40000, N_STEPS = 9000, N_REQUESTS = 1500, N_KERNELS = 20000, N_RANGES = 9000 };

static void every_table_round_trips(void) {
    const char *path = tmp_path("round.h5");
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    if (!rec) return;
    // Appended in uneven pieces, more rows than one batch holds, so implicit flushes happen.
    for (uint64_t i = 0; i < N_DRAFTS;) {
        struct ds_rec_draft piece[997];
        size_t n = 0;
        for (; n < 997 && i < N_DRAFTS; n++, i++)
            piece[n] = make_draft(i);
        EXPECT_OK(ds_recorder_append_drafts(rec, piece, n));
    }
    for (uint64_t i = 0; i < N_STEPS; i++) {
        struct ds_rec_step s = make_step(i);
        EXPECT_OK(ds_recorder_append_steps(rec, &s, 1));
    }
    for (uint64_t i = 0; i < N_REQUESTS; i++) {
        struct ds_rec_request r = make_request(i);
        EXPECT_OK(ds_recorder_append_requests(rec, &r, 1));
    }
    for (uint64_t i = 0; i < N_KERNELS; i++) {
        struct ds_rec_kernel k = make_kernel(i);
        EXPECT_OK(ds_recorder_append_kernels(rec, &k, 1));
    }
    EXPECT_OK(ds_recorder_flush(rec));
    for (uint64_t i = 0; i < N_RANGES; i++) {
        struct ds_rec_range r = make_range(i);
        EXPECT_OK(ds_recorder_append_ranges(rec, &r, 1));
    }
    uint64_t rows = 0;
    EXPECT_OK(ds_recorder_rows(rec, DS_REC_DRAFTS, &rows));
    EXPECT_EQ_INT(rows, N_DRAFTS);
    EXPECT_OK(
        ds_recorder_set_end(rec, &(struct ds_run_end){DS_REC_SESSION_INTERRUPTED, 0.125, 7}));
    EXPECT_OK(ds_recorder_close(rec));

    hid_t f = open_ro(path, 0);
    EXPECT(f >= 0);
    if (f < 0) return;
    hsize_t n;
    EXPECT_TABLE(f, "drafts", struct ds_rec_draft, N_DRAFTS, make_draft, same_draft, );
    EXPECT_TABLE(f, "steps", struct ds_rec_step, N_STEPS, make_step, same_step, );
    EXPECT_TABLE(f, "requests", struct ds_rec_request, N_REQUESTS, make_request, same_request,
                 want.session = 0); // the creating session
    EXPECT_TABLE(f, "kernels", struct ds_rec_kernel, N_KERNELS, make_kernel, same_kernel, );
    EXPECT_TABLE(f, "ranges", struct ds_rec_range, N_RANGES, make_range, same_range, );

    // The session row: interrupted, overhead kept, next_step = 1 + the highest step appended.
    struct ds_rec_session *ss = read_table(f, "sessions", sizeof *ss, &n);
    EXPECT_EQ_INT(n, 1);
    if (ss && n == 1) {
        EXPECT_EQ_INT(ss[0].session, 0);
        EXPECT_EQ_INT(ss[0].status, DS_REC_SESSION_INTERRUPTED);
        EXPECT_EQ_INT(ss[0].trace_level, DS_REC_TRACE_PHASES);
        EXPECT(ss[0].trace_overhead == 0.125);
        EXPECT_EQ_INT(ss[0].trace_dropped, 7); // as passed to set_end
        EXPECT_EQ_INT(ss[0].first_step, 0);
        // The highest step id of all: drafts' 1000 + (N_DRAFTS - 1) / 3 (steps reach only
        // 5000 + N_STEPS - 1 = 13999).
        EXPECT_EQ_INT(ss[0].next_step, 1000 + (N_DRAFTS - 1) / 3 + 1);
        EXPECT(ss[0].end_unix_ns >= ss[0].start_unix_ns && ss[0].start_unix_ns > 0);
    }
    free(ss);

    // Run metadata.
    char s[256];
    read_str_attr(f, "schema", s, sizeof s);
    EXPECT_EQ_STR(s, "draftscope-run");
    read_str_attr(f, "rule", s, sizeof s);
    EXPECT_EQ_STR(s, "greedy");
    read_str_attr(f, "dataset_sha256", s, sizeof s);
    EXPECT_EQ_STR(s, "cc33");
    read_str_attr(f, "gpu_name", s, sizeof s);
    EXPECT_EQ_STR(s, "NVIDIA H200");
    read_str_attr(f, "trace_level", s, sizeof s);
    EXPECT_EQ_STR(s, "phases");
    read_str_attr(f, "git_commit", s, sizeof s);
    EXPECT_EQ_STR(s, DS_GIT_COMMIT);
    read_str_attr(f, "command_line", s, sizeof s);
    EXPECT_EQ_STR(s, meta.command_line);
    uint32_t u32 = 0, bs[3] = {0};
    uint64_t u64 = 0;
    double dbl = 0;
    hid_t a = H5Aopen(f, "schema_version", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_UINT32, &u32);
    H5Aclose(a);
    EXPECT_EQ_INT(u32, 2); // v2: sessions.trace_dropped
    a = H5Aopen(f, "seed", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_UINT64, &u64);
    H5Aclose(a);
    EXPECT_EQ_INT(u64, 1234);
    a = H5Aopen(f, "k", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_UINT32, &u32);
    H5Aclose(a);
    EXPECT_EQ_INT(u32, 3);
    a = H5Aopen(f, "top_p", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_DOUBLE, &dbl);
    H5Aclose(a);
    EXPECT(dbl == 0.95);
    a = H5Aopen(f, "batch_sizes", H5P_DEFAULT);
    hid_t sp = H5Aget_space(a);
    EXPECT_EQ_INT(H5Sget_simple_extent_npoints(sp), 3);
    H5Sclose(sp);
    H5Aread(a, H5T_NATIVE_UINT32, bs);
    H5Aclose(a);
    EXPECT(bs[0] == 1 && bs[1] == 8 && bs[2] == 32);
    H5Fclose(f);
}

static void strings_are_interned_once(void) {
    const char *path = tmp_path("strings.h5");
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    if (!rec) return;
    // Ids: 0 is "", 1 the command line (interned at creation), then first-seen order.
    char longtext[3000];
    memset(longtext, 'k', sizeof longtext - 1);
    longtext[sizeof longtext - 1] = '\0';
    const char *texts[] = {"coding", "writing", "coding", "", longtext, "writing", "math"};
    const uint32_t want[] = {2, 3, 2, 0, 4, 3, 5};
    for (int i = 0; i < 7; i++) {
        uint32_t id = 99;
        EXPECT_OK(ds_recorder_intern(rec, texts[i], &id));
        EXPECT_EQ_INT(id, want[i]);
    }
    // Many distinct names (more than one batch of pending strings and the initial hash size),
    // each interned twice: the second time must give the same id and add no row.
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 3000; i++) {
            char name[64];
            snprintf(name, sizeof name, "kernel_%d_v%d", i, i % 7);
            uint32_t id = 0;
            EXPECT_OK(ds_recorder_intern(rec, name, &id));
            if (id != 6u + (uint32_t)i) {
                DS_FAILF("%s got id %u, wanted %d", name, id, 6 + i);
                break;
            }
        }
    }
    // Long texts of 2- and 3-byte characters: the 1015-byte cut would split a character (byte
    // 1015 of 1500 x U+00E9 is the second byte of one; of "ab" + 1000 x U+20AC the third), so
    // the row keeps 1014 and 1013 bytes, whole characters only.
    char eacute[3001], euro[3003];
    for (int i = 0; i < 1500; i++)
        memcpy(eacute + 2 * i, "\xc3\xa9", 2);
    eacute[3000] = '\0';
    memcpy(euro, "ab", 2);
    for (int i = 0; i < 1000; i++)
        memcpy(euro + 2 + 3 * i, "\xe2\x82\xac", 3);
    euro[3002] = '\0';
    uint32_t id_e = 0, id_euro = 0;
    EXPECT_OK(ds_recorder_intern(rec, eacute, &id_e));
    EXPECT_OK(ds_recorder_intern(rec, euro, &id_euro));
    EXPECT_EQ_INT(id_e, 3006);
    EXPECT_EQ_INT(id_euro, 3007);
    uint64_t rows = 0;
    EXPECT_OK(ds_recorder_rows(rec, DS_REC_STRINGS, &rows));
    EXPECT_EQ_INT(rows, 6 + 3000 + 2);
    EXPECT_OK(ds_recorder_close(rec));

    hid_t f = open_ro(path, 0);
    hsize_t n;
    struct ds_rec_string *s = read_table(f, "strings", sizeof *s, &n);
    EXPECT_EQ_INT(n, 3008);
    if (s && n == 3008) {
        EXPECT_EQ_INT(s[3006].length, 3000);
        EXPECT_EQ_INT(strnlen(s[3006].text, DS_RECORD_STRING_BYTES), 1014);
        EXPECT(memcmp(s[3006].text, eacute, 1014) == 0);
        EXPECT_EQ_INT(s[3007].length, 3002);
        EXPECT_EQ_INT(strnlen(s[3007].text, DS_RECORD_STRING_BYTES), 1013);
        EXPECT(memcmp(s[3007].text, euro, 1013) == 0);
        EXPECT_EQ_STR(s[0].text, "");
        EXPECT_EQ_STR(s[1].text, meta.command_line);
        EXPECT_EQ_STR(s[2].text, "coding");
        EXPECT_EQ_STR(s[3].text, "writing");
        EXPECT_EQ_INT(s[4].length, 2999);
        EXPECT_EQ_INT(strnlen(s[4].text, DS_RECORD_STRING_BYTES), DS_RECORD_STRING_BYTES - 1);
        EXPECT_EQ_STR(s[5].text, "math");
        EXPECT_EQ_STR(s[6].text, "kernel_0_v0");
        EXPECT_EQ_STR(s[3005].text, "kernel_2999_v3");
        int bad = 0;
        for (hsize_t i = 0; i < n; i++)
            bad += s[i].id != i;
        EXPECT_EQ_INT(bad, 0);
    }
    free(s);
    H5Fclose(f);
}

static void refuses_to_overwrite(void) {
    const char *path = tmp_path("exists.h5");
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    struct ds_rec_draft d = make_draft(0);
    EXPECT_OK(ds_recorder_append_drafts(rec, &d, 1));
    EXPECT_OK(ds_recorder_close(rec));
    rec = NULL;
    EXPECT_STATUS(ds_recorder_create(path, &meta, 0, &rec), DS_ERR_IO);
    EXPECT(rec == NULL);
    EXPECT_ERROR_HAS(path);
    EXPECT_ERROR_HAS("exists");
    // The old file is untouched.
    hid_t f = open_ro(path, 0);
    EXPECT_EQ_INT(table_rows(f, "drafts"), 1);
    H5Fclose(f);
    EXPECT_OK(ds_recorder_create(path, &meta, DS_RECORDER_OVERWRITE, &rec));
    EXPECT_OK(ds_recorder_close(rec));
    f = open_ro(path, 0);
    EXPECT_EQ_INT(table_rows(f, "drafts"), 0);
    H5Fclose(f);
    // Bad arguments and an unwritable place: clear errors, no crash.
    EXPECT_STATUS(ds_recorder_create(NULL, &meta, 0, &rec), DS_ERR_ARG);
    struct ds_run_meta bad = meta;
    bad.k = 0;
    EXPECT_STATUS(ds_recorder_create(tmp_path("k0.h5"), &bad, 0, &rec), DS_ERR_ARG);
    EXPECT_STATUS(ds_recorder_create("/nonexistent-dir/x.h5", &meta, 0, &rec), DS_ERR_IO);
    EXPECT_ERROR_HAS("/nonexistent-dir/x.h5");
    EXPECT_ERROR_HAS("No such file or directory");
    EXPECT_OK(ds_recorder_close(NULL));
}

// ---- multi-process cases ----

static void write_byte(int fd) {
    char c = 1;
    if (write(fd, &c, 1) != 1) _exit(90);
}

static int read_byte(int fd) {
    char c;
    return read(fd, &c, 1) == 1;
}

static void append_drafts_range(ds_recorder_t *rec, uint64_t first, uint64_t n) {
    for (uint64_t i = first; i < first + n; i++) {
        struct ds_rec_draft d = make_draft(i);
        if (ds_recorder_append_drafts(rec, &d, 1)) _exit(91);
    }
}

enum { KILL_BATCH = 1000, KILL_BATCHES = 3 };

static void sigkill_keeps_flushed_rows(void) {
    const char *path = tmp_path("killed.h5");
    int pipefd[2];
    EXPECT_EQ_INT(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        struct ds_run_meta meta = test_meta();
        ds_recorder_t *rec = NULL;
        if (ds_recorder_create(path, &meta, 0, &rec)) _exit(92);
        for (int b = 0; b < KILL_BATCHES; b++) {
            append_drafts_range(rec, (uint64_t)b * KILL_BATCH, KILL_BATCH);
            struct ds_rec_step s = make_step((uint64_t)b);
            if (ds_recorder_append_steps(rec, &s, 1) || ds_recorder_flush(rec)) _exit(93);
        }
        // Appended but never flushed: must not appear in the file.
        append_drafts_range(rec, KILL_BATCHES * KILL_BATCH, 500);
        write_byte(pipefd[1]);
        for (;;)
            pause();
    }
    close(pipefd[1]);
    EXPECT(read_byte(pipefd[0]));
    close(pipefd[0]);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    // A SWMR reader opens the file as the writer left it.
    hid_t f = open_ro(path, 1);
    EXPECT(f >= 0);
    if (f >= 0) {
        hsize_t n;
        struct ds_rec_draft *dr = read_table(f, "drafts", sizeof *dr, &n);
        EXPECT_EQ_INT(n, KILL_BATCHES * KILL_BATCH);
        if (dr) EXPECT_EQ_INT(count_bad_drafts(dr, n, 0), 0);
        free(dr);
        EXPECT_EQ_INT(table_rows(f, "steps"), KILL_BATCHES);
        EXPECT_EQ_INT(session_status(f, 0), DS_REC_SESSION_RUNNING); // it never closed
        H5Fclose(f);
    }
    // A plain reader needs the dead writer's flags cleared first (HDF5 refuses otherwise).
    EXPECT_OK(ds_recorder_recover(path));
    f = open_ro(path, 0);
    EXPECT(f >= 0);
    if (f >= 0) {
        hsize_t n;
        struct ds_rec_draft *dr = read_table(f, "drafts", sizeof *dr, &n);
        EXPECT_EQ_INT(n, KILL_BATCHES * KILL_BATCH);
        if (dr) EXPECT_EQ_INT(count_bad_drafts(dr, n, 0), 0);
        free(dr);
        struct ds_rec_string *s = read_table(f, "strings", sizeof *s, &n);
        EXPECT(s != NULL);
        EXPECT_EQ_INT(n, 2);
        if (s && n == 2) EXPECT_EQ_STR(s[1].text, test_meta().command_line);
        free(s);
        H5Fclose(f);
    }
}

static void concurrent_reader_sees_growth(void) {
    const char *path = tmp_path("live.h5");
    int to_parent[2], to_child[2];
    EXPECT_EQ_INT(pipe(to_parent), 0);
    EXPECT_EQ_INT(pipe(to_child), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(to_parent[0]);
        close(to_child[1]);
        struct ds_run_meta meta = test_meta();
        ds_recorder_t *rec = NULL;
        if (ds_recorder_create(path, &meta, 0, &rec)) _exit(92);
        append_drafts_range(rec, 0, 1200);
        if (ds_recorder_flush(rec)) _exit(93);
        write_byte(to_parent[1]);
        if (!read_byte(to_child[0])) _exit(94);
        append_drafts_range(rec, 1200, 2500);
        if (ds_recorder_flush(rec)) _exit(93);
        write_byte(to_parent[1]);
        if (!read_byte(to_child[0])) _exit(94);
        _exit(ds_recorder_close(rec) ? 95 : 0);
    }
    close(to_parent[1]);
    close(to_child[0]);
    EXPECT(read_byte(to_parent[0]));
    hid_t f = open_ro(path, 1);
    EXPECT(f >= 0);
    hid_t d = f >= 0 ? H5Dopen2(f, "drafts", H5P_DEFAULT) : -1;
    EXPECT(d >= 0);
    hsize_t n1 = 0, n2 = 0;
    if (d >= 0) {
        hid_t s = H5Dget_space(d);
        H5Sget_simple_extent_dims(s, &n1, NULL);
        H5Sclose(s);
    }
    EXPECT_EQ_INT(n1, 1200);
    // While the writer lives, nobody else may take the file over.
    struct ds_run_meta meta = test_meta();
    struct ds_resume_info info;
    ds_recorder_t *other = NULL;
    EXPECT_STATUS(ds_recorder_open_resume(path, &meta, &info, &other), DS_ERR_IO);
    EXPECT_ERROR_HAS("another process is writing");
    EXPECT_STATUS(ds_recorder_recover(path), DS_ERR_IO);
    write_byte(to_child[1]);
    EXPECT(read_byte(to_parent[0]));
    if (d >= 0) {
        EXPECT(H5Drefresh(d) >= 0);
        hid_t s = H5Dget_space(d);
        H5Sget_simple_extent_dims(s, &n2, NULL);
        H5Sclose(s);
        EXPECT_EQ_INT(n2, 3700);
        struct ds_rec_draft *rows = calloc(n2, sizeof *rows);
        hid_t t = H5Dget_type(d);
        EXPECT(H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0);
        EXPECT_EQ_INT(count_bad_drafts(rows, n2, 0), 0);
        H5Tclose(t);
        free(rows);
        H5Dclose(d);
    }
    if (f >= 0) H5Fclose(f);
    write_byte(to_child[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(to_parent[0]);
    close(to_child[1]);
}

static void resume_appends_and_checks_metadata(void) {
    const char *path = tmp_path("resume.h5");
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    if (!rec) return;
    uint32_t cat = 0;
    EXPECT_OK(ds_recorder_intern(rec, "coding", &cat));
    // Steps 0..9 for requests 0 and 1 (finished, 5 steps each, no drafts), then drafts of
    // request 2 that never finished.
    for (uint64_t i = 0; i < 10; i++) {
        struct ds_rec_step s = make_step(0);
        s.step = i;
        s.request = (uint32_t)(i % 2);
        s.drafted = s.accepted = 0;
        EXPECT_OK(ds_recorder_append_steps(rec, &s, 1));
    }
    for (uint64_t i = 0; i < 2; i++) {
        struct ds_rec_request r = make_request(i);
        r.category = cat;
        r.steps = 5;
        EXPECT_OK(ds_recorder_append_requests(rec, &r, 1));
    }
    struct ds_rec_draft d = make_draft(0);
    d.step = 10;
    d.request = 2;
    EXPECT_OK(ds_recorder_append_drafts(rec, &d, 1));
    EXPECT_OK(ds_recorder_close(rec));

    // Each field that makes it a different run is refused, by name.
    struct {
        const char *field;
        struct ds_run_meta m;
    } bad[6];
    for (int i = 0; i < 6; i++)
        bad[i].m = meta;
    bad[0].field = "seed";
    bad[0].m.seed = 99;
    bad[1].field = "dataset_sha256";
    bad[1].m.dataset_sha256 = "dd44";
    bad[2].field = "target_config_sha256";
    bad[2].m.target_config_sha256 = "ff";
    bad[3].field = "k";
    bad[3].m.k = 4;
    bad[4].field = "rule";
    bad[4].m.rule = "rejection";
    bad[5].field = "draft_config_sha256";
    bad[5].m.draft_config_sha256 = NULL;
    for (int i = 0; i < 6; i++) {
        struct ds_resume_info info;
        rec = NULL;
        EXPECT_STATUS(ds_recorder_open_resume(path, &bad[i].m, &info, &rec), DS_ERR_MISMATCH);
        EXPECT(rec == NULL);
        EXPECT_ERROR_HAS(path);
        EXPECT_ERROR_HAS(bad[i].field);
    }
    // The options_json keys named in resume_options: equal, or refused with both values; a key
    // the file lacks is not checked; keys not named may differ.
    static const char *const keys[] = {"max_new_tokens", "turns", NULL};
    struct ds_run_meta o = meta;
    o.resume_options = keys;
    o.options_json = "{\"max_new_tokens\":128}";
    rec = NULL;
    struct ds_resume_info info;
    EXPECT_STATUS(ds_recorder_open_resume(path, &o, &info, &rec), DS_ERR_MISMATCH);
    EXPECT(rec == NULL);
    EXPECT_ERROR_HAS("cannot resume: max_new_tokens differs (file 256, now 128)");
    o.options_json = "{}";
    EXPECT_STATUS(ds_recorder_open_resume(path, &o, &info, &rec), DS_ERR_MISMATCH);
    EXPECT_ERROR_HAS("max_new_tokens differs (file 256, now absent)");
    // A key the file lacks, read as resume_defaults says such a file implies: refused when now
    // differs from that value (the file predates the option, e.g. numerics).
    static const char *const with_numerics[] = {"max_new_tokens", "numerics", NULL};
    o.resume_options = with_numerics;
    o.resume_defaults = "{\"numerics\":\"invariant\"}";
    o.options_json = "{\"max_new_tokens\":256,\"numerics\":\"batch-variant\"}";
    EXPECT_STATUS(ds_recorder_open_resume(path, &o, &info, &rec), DS_ERR_MISMATCH);
    EXPECT(rec == NULL);
    EXPECT_ERROR_HAS("cannot resume: numerics differs (file \"invariant\", now "
                     "\"batch-variant\")");
    o.resume_options = keys;
    o.resume_defaults = NULL;
    EXPECT_STATUS(ds_recorder_open_resume(tmp_path("absent.h5"), &meta, &info, &rec), DS_ERR_IO);
    EXPECT_ERROR_HAS("absent.h5");

    // A matching resume sees what is there (its options: the named key equal, "turns" absent
    // from the file, "trace" not named, "numerics" absent and its default the same).
    rec = NULL;
    o.resume_options = with_numerics;
    o.resume_defaults = "{\"numerics\":\"invariant\"}";
    o.options_json = "{\"max_new_tokens\":256,\"turns\":\"all\",\"trace\":\"kernels\","
                     "\"numerics\":\"invariant\"}";
    EXPECT_OK(ds_recorder_open_resume(path, &o, &info, &rec));
    if (!rec) return;
    EXPECT_EQ_INT(info.session, 1);
    EXPECT_EQ_INT(info.next_step, 11);   // drafts reached step 10
    EXPECT_EQ_INT(info.next_request, 3); // the unfinished request 2 keeps its id burnt
    EXPECT_EQ_INT(info.rows[DS_REC_STEPS], 10);
    EXPECT_EQ_INT(info.rows[DS_REC_DRAFTS], 1);
    EXPECT_EQ_INT(info.rows[DS_REC_SESSIONS], 1);
    EXPECT_EQ_INT(info.n_done, 2);
    if (info.n_done == 2) {
        EXPECT_EQ_INT(info.done[1].request, 1);
        EXPECT_EQ_INT(info.done[1].dataset_index, 2);
        EXPECT_EQ_INT(info.done[1].batch_size, 8);
        EXPECT_EQ_INT(info.done[0].category, cat);
    }
    // Strings continue: known texts keep their ids, new ones follow.
    uint32_t id = 0;
    EXPECT_OK(ds_recorder_intern(rec, "coding", &id));
    EXPECT_EQ_INT(id, cat);
    EXPECT_OK(ds_recorder_intern(rec, "math", &id));
    EXPECT_EQ_INT(id, cat + 1);
    for (uint64_t i = 0; i < 5; i++) {
        struct ds_rec_step s = make_step(0);
        s.step = info.next_step + i;
        s.request = info.next_request;
        EXPECT_OK(ds_recorder_append_steps(rec, &s, 1));
    }
    struct ds_rec_request r = make_request(info.next_request);
    EXPECT_OK(ds_recorder_append_requests(rec, &r, 1));
    EXPECT_OK(ds_recorder_close(rec));

    hid_t f = open_ro(path, 0);
    EXPECT(f >= 0);
    EXPECT_EQ_INT(table_rows(f, "steps"), 15);
    EXPECT_EQ_INT(table_rows(f, "requests"), 3);
    EXPECT_EQ_INT(table_rows(f, "strings"), 4); // "", command line, coding, math
    hsize_t n;
    struct ds_rec_request *rq = read_table(f, "requests", sizeof *rq, &n);
    if (rq && n == 3) {
        EXPECT_EQ_INT(rq[0].session, 0);
        EXPECT_EQ_INT(rq[2].session, 1);
        EXPECT_EQ_INT(rq[2].request, 3);
    }
    free(rq);
    struct ds_rec_session *ss = read_table(f, "sessions", sizeof *ss, &n);
    EXPECT_EQ_INT(n, 2);
    if (ss && n == 2) {
        EXPECT_EQ_INT(ss[0].status, DS_REC_SESSION_CLOSED);
        EXPECT_EQ_INT(ss[1].status, DS_REC_SESSION_CLOSED);
        EXPECT_EQ_INT(ss[1].session, 1);
        EXPECT_EQ_INT(ss[1].first_step, 11);
        EXPECT_EQ_INT(ss[1].next_step, 16);
        EXPECT(isnan(ss[1].trace_overhead)); // never measured
    }
    free(ss);
    H5Fclose(f);

    // Not a run file at all.
    const char *other = tmp_path("other.h5");
    hid_t g = H5Fcreate(other, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(g);
    EXPECT_STATUS(ds_recorder_open_resume(other, &meta, &info, &rec), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("not a draftscope run file");
}

// A closed run file of test_meta() at path, reopened read-write for a test to damage
// (H5I_INVALID_HID on failure).
static hid_t closed_run_rdwr(const char *path) {
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    if (!rec) return H5I_INVALID_HID;
    EXPECT_OK(ds_recorder_close(rec));
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT(f >= 0);
    return f;
}

// Replaces the root attribute `name` with a 1-D array of n elements of type t from data.
static void rewrite_as_array(hid_t f, const char *name, hid_t t, hsize_t n, const void *data) {
    hid_t sp = H5Screate_simple(1, &n, NULL);
    EXPECT(H5Adelete(f, name) >= 0);
    hid_t a = H5Acreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT(a >= 0 && H5Awrite(a, t, data) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
}

// A run file whose scalar attributes were rewritten as arrays (a file from another tool, or a
// damaged one): resume refuses it by name. The recorder read such an attribute straight into one
// variable, so a 16-element seed wrote 128 bytes over an 8-byte one and the resume went on.
// The last case is k as a float (3.0, the run's k): HDF5 would convert it to 3 and resume.
static void resume_refuses_array_attributes(void) {
    const struct ds_run_meta meta = test_meta();
    static const char *const names[] = {"seed", "schema_version", "k", "rule", "k"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *path = tmp_path("array_attr.h5");
        hid_t f = closed_run_rdwr(path);
        if (f < 0) return;
        if (i < 3) {
            uint64_t values[16];
            for (int j = 0; j < 16; j++)
                values[j] = meta.seed;
            rewrite_as_array(f, names[i], H5T_NATIVE_UINT64, 16, values);
        } else if (i == 3) { // four fixed-length strings, each the right value
            hid_t t = H5Tcopy(H5T_C_S1);
            H5Tset_size(t, 8);
            rewrite_as_array(f, names[i], t, 4, "greedy\0\0greedy\0\0greedy\0\0greedy\0\0");
            H5Tclose(t);
        } else {
            const double k = meta.k;
            rewrite_as_array(f, names[i], H5T_NATIVE_DOUBLE, 1, &k);
        }
        H5Fclose(f);
        struct ds_resume_info info;
        ds_recorder_t *rec = NULL;
        EXPECT_STATUS(ds_recorder_open_resume(path, &meta, &info, &rec), DS_ERR_FORMAT);
        EXPECT(rec == NULL);
        if (rec) ds_recorder_close(rec);
        EXPECT_ERROR_HAS(names[i]);
        EXPECT_ERROR_HAS(i == 1 ? "not one integer" : i == 3 ? "not one string" : "not one number");
    }
}

// A damaged root object header fails the attribute lookup: --resume said "not a draftscope run
// file" of it; the refusal gives HDF5's reason, and the file stays as it was.
static void resume_names_damaged_attributes_child(void) {
    const struct ds_run_meta meta = test_meta();
    const char *path = tmp_path("damaged_root.h5");
    hid_t f = closed_run_rdwr(path);
    if (f < 0) return;
    H5Fclose(f);
    EXPECT(ru_damage_root_header(path) == 0);
    struct ds_resume_info info;
    ds_recorder_t *rec = NULL;
    EXPECT_STATUS(ds_recorder_open_resume(path, &meta, &info, &rec), DS_ERR_IO);
    EXPECT(rec == NULL);
    if (rec) ds_recorder_close(rec);
    EXPECT_ERROR_HAS("damaged_root.h5: cannot read the run attributes: ");
    EXPECT(!strstr(ds_error_last(), "not a draftscope run file"));
}

// In a child: HDF5 itself leaks the damaged header on this path (tests/harness.h).
static void resume_names_damaged_attributes(void) {
    ds_t_in_child(resume_names_damaged_attributes_child);
}

// A run that stops on an error other than a write (a kernel failure, say) ends its session
// "failed": set_end takes that status (the run used to leave such a session "closed"); "running"
// is refused.
static void session_ends_failed(void) {
    const char *path = tmp_path("ended_failed.h5");
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
    if (!rec) return;
    EXPECT_STATUS(
        ds_recorder_set_end(rec, &(struct ds_run_end){DS_REC_SESSION_RUNNING, 0.5, 3}),
        DS_ERR_ARG);
    EXPECT_OK(ds_recorder_set_end(rec, &(struct ds_run_end){DS_REC_SESSION_FAILED, 0.5, 3}));
    EXPECT_OK(ds_recorder_close(rec));
    hid_t f = open_ro(path, 0);
    EXPECT(f >= 0);
    if (f < 0) return;
    hsize_t n = 0;
    struct ds_rec_session *ss = read_table(f, "sessions", sizeof *ss, &n);
    H5Fclose(f);
    EXPECT_EQ_INT(n, 1);
    if (ss && n == 1) {
        EXPECT_EQ_INT(ss[0].status, DS_REC_SESSION_FAILED);
        EXPECT(ss[0].trace_overhead == 0.5);
        EXPECT_EQ_INT(ss[0].trace_dropped, 3);
    }
    free(ss);
    unlink(path);
}

static unsigned char *file_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    long len = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (b = malloc((size_t)len + 1)) && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    if (f) fclose(f);
    *n = b ? (size_t)len : 0;
    return b;
}

// A finished request whose rows do not add up (rows lost: a file cut short, or written before
// /requests went last) is refused before the new session touches the file, which stays byte for
// byte as it was. Resume used to go ahead, and a cut file failed only at the run's final summary.
static void resume_refuses_lost_rows(void) {
    const struct ds_run_meta meta = test_meta();
    for (int lose_drafts = 0; lose_drafts < 2; lose_drafts++) {
        const char *path = tmp_path("lost_rows.h5");
        unlink(path);
        ds_recorder_t *rec = NULL;
        EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
        if (!rec) return;
        // Request 0: 2 steps of 3 drafts each; its /requests row says 3 steps, or its last
        // step's drafts are missing.
        for (uint64_t i = 0; i < 2; i++) {
            struct ds_rec_step s = make_step(0);
            s.step = i;
            s.request = 0;
            EXPECT_OK(ds_recorder_append_steps(rec, &s, 1));
            for (int j = 0; j < (lose_drafts && i == 1 ? 1 : 3); j++) {
                struct ds_rec_draft d = make_draft(j);
                d.step = i;
                d.request = 0;
                d.position = (uint8_t)(j + 1);
                EXPECT_OK(ds_recorder_append_drafts(rec, &d, 1));
            }
        }
        struct ds_rec_request r = make_request(0);
        r.steps = lose_drafts ? 2 : 3;
        EXPECT_OK(ds_recorder_append_requests(rec, &r, 1));
        EXPECT_OK(ds_recorder_close(rec));
        size_t n0 = 0, n1 = 0;
        unsigned char *before = file_bytes(path, &n0);
        struct ds_resume_info info;
        rec = NULL;
        EXPECT_STATUS(ds_recorder_open_resume(path, &meta, &info, &rec), DS_ERR_FORMAT);
        EXPECT(rec == NULL);
        if (rec) ds_recorder_close(rec);
        EXPECT_ERROR_HAS("lost_rows.h5: cannot resume: request 0");
        EXPECT_ERROR_HAS(lose_drafts ? "draft 6 tokens, but /drafts holds 4 of its rows"
                                     : "after 3 steps, but /steps holds 2 of its rows");
        unsigned char *after = file_bytes(path, &n1);
        EXPECT(before && after && n0 == n1 && !memcmp(before, after, n0));
        free(before);
        free(after);
    }
}

// Creates path in a forked writer, appends fill's rows, flushes, and kills the writer (SIGKILL):
// the file a dead writer leaves, its "open for write" flags set.
static void killed_writer(const char *path, void (*fill)(ds_recorder_t *)) {
    int pipefd[2];
    EXPECT_EQ_INT(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        struct ds_run_meta meta = test_meta();
        ds_recorder_t *rec = NULL;
        if (ds_recorder_create(path, &meta, 0, &rec)) _exit(92);
        fill(rec);
        if (ds_recorder_flush(rec)) _exit(93);
        write_byte(pipefd[1]);
        for (;;)
            pause();
    }
    close(pipefd[1]);
    EXPECT(read_byte(pipefd[0]));
    close(pipefd[0]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void fill_700_drafts(ds_recorder_t *rec) {
    append_drafts_range(rec, 0, 700);
}

static void resume_after_sigkill(void) {
    // The file sigkill_keeps_flushed_rows left (flags cleared by recover there); kill another
    // writer to leave fresh flags, and resume straight away.
    const char *path = tmp_path("killed2.h5");
    killed_writer(path, fill_700_drafts);
    struct ds_run_meta meta = test_meta();
    struct ds_resume_info info;
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_open_resume(path, &meta, &info, &rec));
    EXPECT_EQ_INT(info.rows[DS_REC_DRAFTS], 700);
    EXPECT_EQ_INT(info.next_step, make_draft(699).step + 1);
    EXPECT_EQ_INT(info.session, 1);
    append_drafts_range(rec, 700, 300);
    EXPECT_OK(ds_recorder_close(rec));
    hid_t f = open_ro(path, 0);
    EXPECT(f >= 0);
    hsize_t n;
    struct ds_rec_draft *dr = read_table(f, "drafts", sizeof *dr, &n);
    EXPECT_EQ_INT(n, 1000);
    if (dr) EXPECT_EQ_INT(count_bad_drafts(dr, n, 0), 0);
    free(dr);
    EXPECT_EQ_INT(session_status(f, 0), DS_REC_SESSION_RUNNING); // the killed session
    EXPECT_EQ_INT(session_status(f, 1), DS_REC_SESSION_CLOSED);
    H5Fclose(f);
}

// Where the n bytes `what` first occur in b (len bytes), or -1.
static long find_bytes(const unsigned char *b, size_t len, const void *what, size_t n) {
    for (size_t at = 0; at + n <= len; at++)
        if (!memcmp(b + at, what, n)) return (long)at;
    return -1;
}

static void fill_finished_request(ds_recorder_t *rec) {
    for (uint64_t i = 0; i < 2; i++) { // request 7: 2 steps of 3 drafts, finished
        struct ds_rec_step s = make_step(0);
        s.step = i;
        s.request = 7;
        if (ds_recorder_append_steps(rec, &s, 1)) _exit(93);
        for (int j = 0; j < 3; j++) {
            struct ds_rec_draft d = make_draft((uint64_t)j);
            d.step = i;
            d.request = 7;
            d.position = (uint8_t)(j + 1);
            if (ds_recorder_append_drafts(rec, &d, 1)) _exit(93);
        }
    }
    struct ds_rec_request r = make_request(7);
    r.steps = 2;
    if (ds_recorder_append_requests(rec, &r, 1)) _exit(93);
}

// A copy of a killed writer's file cut off inside /requests, as a copy taken while the run wrote
// it can be. The superblock of such a file records an end far below its data (the writer never
// rewrote it), so nothing calls it truncated, and the /requests row past the cut reads as zeros:
// the summary counted a finished request 0 of batch size 0, and resume refused the file for the
// rows it said request 0 had lost. Both name the row never written now, and the refused file
// stays byte for byte as it was; the whole file resumes.
static void resume_refuses_cut_copy_of_killed_writer(void) {
    const char *path = tmp_path("killed3.h5"), *cut = tmp_path("killed3_cut.h5");
    const struct ds_run_meta meta = test_meta();
    killed_writer(path, fill_finished_request);
    // The cut: at the bytes of the one /requests row.
    hsize_t rows = 0;
    hid_t f = open_ro(path, 1);
    struct ds_rec_request *rq = f >= 0 ? read_table(f, "requests", sizeof *rq, &rows) : NULL;
    if (f >= 0) H5Fclose(f);
    size_t n = 0;
    unsigned char *whole = file_bytes(path, &n);
    long at = rq && rows == 1 && whole ? find_bytes(whole, n, rq, sizeof *rq) : -1;
    free(rq);
    EXPECT(at > 0);
    uint64_t recorded = 0; // the end the superblock records: below the cut, so not "truncated"
    for (int i = 7; at > 36 && i >= 0; i--)
        recorded = recorded << 8 | whole[28 + i];
    EXPECT(recorded > 0 && recorded < (uint64_t)at);
    FILE *out = at > 0 ? fopen(cut, "wb") : NULL;
    EXPECT(out && fwrite(whole, 1, (size_t)at, out) == (size_t)at);
    if (out) fclose(out);
    free(whole);
    if (at <= 0) return;
    struct ds_summary *sum = NULL;
    EXPECT_STATUS(ds_summary_compute(cut, DS_SUMMARY_BY_BATCH, &sum), DS_ERR_FORMAT);
    EXPECT_ERROR_HAS("killed3_cut.h5: /requests row 0 has batch size 0: a row never written");
    ds_summary_free(sum);
    size_t n0 = 0, n1 = 0;
    unsigned char *before = file_bytes(cut, &n0);
    struct ds_resume_info info;
    ds_recorder_t *rec = NULL;
    EXPECT_STATUS(ds_recorder_open_resume(cut, &meta, &info, &rec), DS_ERR_FORMAT);
    EXPECT(rec == NULL);
    if (rec) ds_recorder_close(rec);
    EXPECT_ERROR_HAS("killed3_cut.h5: cannot resume: /requests row 0 has batch size 0");
    unsigned char *after = file_bytes(cut, &n1);
    EXPECT(before && after && n0 == n1 && !memcmp(before, after, n0));
    free(before);
    free(after);
    rec = NULL;
    EXPECT_OK(ds_recorder_open_resume(path, &meta, &info, &rec));
    EXPECT_EQ_INT(info.n_done, 1);
    if (rec) EXPECT_OK(ds_recorder_close(rec));
}

enum { DISK_GOOD = 2000 };

// In a forked writer: files may grow only `extra` bytes past path's size (a full disk); exceeding
// the limit must become a write error, not a kill (exits 94 when the limit cannot be set).
static void limit_file_size(const char *path, off_t extra) {
    signal(SIGXFSZ, SIG_IGN);
    struct stat sb;
    if (stat(path, &sb)) _exit(94);
    struct rlimit rl = {(rlim_t)(sb.st_size + extra), (rlim_t)(sb.st_size + extra)};
    if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(94);
}

static void full_disk_gives_clean_error(void) {
    const char *path = tmp_path("full.h5");
    int pipefd[2];
    EXPECT_EQ_INT(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        struct ds_run_meta meta = test_meta();
        ds_recorder_t *rec = NULL;
        if (ds_recorder_create(path, &meta, 0, &rec)) _exit(92);
        append_drafts_range(rec, 0, DISK_GOOD);
        if (ds_recorder_flush(rec)) _exit(93);
        limit_file_size(path, 100000);
        enum ds_status st = DS_OK;
        uint64_t next = DISK_GOOD;
        for (int i = 0; i < 200 && st == DS_OK; i++) {
            for (int j = 0; j < 4000 && st == DS_OK; j++) {
                struct ds_rec_draft d = make_draft(next++);
                st = ds_recorder_append_drafts(rec, &d, 1);
            }
            if (st == DS_OK) st = ds_recorder_flush(rec);
        }
        char msg[1024];
        snprintf(msg, sizeof msg, "%d %s", (int)st, ds_error_last());
        // Later calls keep failing with the same message; close frees everything and reports.
        struct ds_rec_draft d = make_draft(0);
        enum ds_status again = ds_recorder_append_drafts(rec, &d, 1);
        enum ds_status closed = ds_recorder_close(rec);
        if (write(pipefd[1], msg, strlen(msg) + 1) < 0) _exit(96);
        _exit(again == st && closed == st ? 0 : 97);
    }
    close(pipefd[1]);
    char msg[1024] = "";
    ssize_t got = read(pipefd[0], msg, sizeof msg - 1);
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(got > 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("  full-disk error line: %s\n", msg);
    char want[64];
    snprintf(want, sizeof want, "%d ", (int)DS_ERR_IO);
    EXPECT(!strncmp(msg, want, strlen(want)));
    EXPECT(strstr(msg, path) != NULL);
    EXPECT(strstr(msg, "File too large") != NULL);

    // The file opens and holds every row of the good flushes, each one intact.
    hid_t f = open_ro(path, 1);
    if (f < 0) {
        // The child could not extend the file past its own size limit; recover does it.
        printf("  SWMR open refused (truncated file); recovering\n");
        EXPECT_OK(ds_recorder_recover(path));
        f = open_ro(path, 0);
    }
    EXPECT(f >= 0);
    if (f >= 0) {
        hsize_t n;
        struct ds_rec_draft *dr = read_table(f, "drafts", sizeof *dr, &n);
        EXPECT(dr != NULL);
        EXPECT(n >= DISK_GOOD);
        printf("  rows readable after the failure: %llu\n", (unsigned long long)n);
        if (dr) EXPECT_EQ_INT(count_bad_drafts(dr, n, 0), 0);
        free(dr);
        H5Fclose(f);
    }
}

// A request's /requests row goes to the file only with the rows it closes. Each round appends
// a request's drafts and then its /requests row and flushes, until the file size limit makes a
// write fail. The flush wrote /requests before /drafts, so the failing round left a request
// recorded as done with none of its drafts (and --resume never reran it).
enum { ORDER_DRAFTS = 20000 };
static void failed_flush_keeps_requests_last(void) {
    const char *path = tmp_path("order.h5");
    pid_t pid = fork();
    if (pid == 0) {
        struct ds_run_meta meta = test_meta();
        ds_recorder_t *rec = NULL;
        if (ds_recorder_create(path, &meta, 0, &rec)) _exit(92);
        if (ds_recorder_flush(rec)) _exit(93);
        limit_file_size(path, 4000000);
        enum ds_status st = DS_OK;
        for (uint32_t req = 0; req < 200 && st == DS_OK; req++) {
            for (int j = 0; j < ORDER_DRAFTS && st == DS_OK; j++) {
                struct ds_rec_draft d = make_draft(j);
                d.request = req;
                st = ds_recorder_append_drafts(rec, &d, 1);
            }
            struct ds_rec_request r = make_request(req);
            if (st == DS_OK) st = ds_recorder_append_requests(rec, &r, 1);
            if (st == DS_OK) st = ds_recorder_flush(rec);
        }
        ds_recorder_close(rec);
        _exit(st == DS_ERR_IO ? 0 : 95);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    hid_t f = open_ro(path, 1);
    if (f < 0) {
        EXPECT_OK(ds_recorder_recover(path));
        f = open_ro(path, 0);
    }
    EXPECT(f >= 0);
    if (f < 0) return;
    hsize_t nr = 0, nd = 0;
    struct ds_rec_request *rq = read_table(f, "requests", sizeof *rq, &nr);
    struct ds_rec_draft *dr = read_table(f, "drafts", sizeof *dr, &nd);
    H5Fclose(f);
    EXPECT(nr > 0); // some rounds fit
    printf("  requests on disk: %llu, drafts: %llu\n", (unsigned long long)nr,
           (unsigned long long)nd);
    for (hsize_t i = 0; rq && dr && i < nr; i++) {
        hsize_t have = 0;
        for (hsize_t j = 0; j < nd; j++)
            have += dr[j].request == rq[i].request;
        if (have != ORDER_DRAFTS)
            DS_FAILF("request %u is on disk with %llu of its %d drafts", rq[i].request,
                     (unsigned long long)have, ORDER_DRAFTS);
    }
    free(rq);
    free(dr);
}

// A run file deleted, or replaced by another moved over its name, while it is written: the next
// flush says so (the rows went to the unlinked file and the run exited 0, its summary read from
// the replacement).
static void flush_sees_the_file_replaced(void) {
    for (int replace = 0; replace < 2; replace++) {
        const char *path = tmp_path("moved.h5"), *other = tmp_path("other.h5");
        struct ds_run_meta meta = test_meta();
        ds_recorder_t *rec = NULL;
        EXPECT_OK(ds_recorder_create(path, &meta, 0, &rec));
        if (!rec) return;
        append_drafts_range(rec, 0, 10);
        EXPECT_OK(ds_recorder_flush(rec));
        if (replace) {
            FILE *f = fopen(other, "w");
            if (f) fclose(f);
            EXPECT(rename(other, path) == 0);
        } else {
            EXPECT(unlink(path) == 0);
        }
        append_drafts_range(rec, 10, 10);
        EXPECT_STATUS(ds_recorder_flush(rec), DS_ERR_IO);
        EXPECT_ERROR_HAS("moved.h5: the run file was deleted or replaced while this run wrote it");
        EXPECT_STATUS(ds_recorder_close(rec), DS_ERR_IO);
        unlink(path);
    }
}

static void abort_hook_flushes(void) {
    // A fatal error (DS_ASSERT) in the writer runs the recorder's abort hook, which flushes what
    // was appended, before abort() kills the process.
    const char *path = tmp_path("aborted.h5");
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        struct ds_run_meta meta = test_meta();
        ds_recorder_t *rec = NULL;
        if (ds_recorder_create(path, &meta, 0, &rec)) _exit(92);
        append_drafts_range(rec, 0, 321);
        int broken = 1;
        DS_ASSERT(!broken);
        _exit(93);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    hid_t f = open_ro(path, 1);
    EXPECT(f >= 0);
    if (f >= 0) {
        hsize_t n;
        struct ds_rec_draft *dr = read_table(f, "drafts", sizeof *dr, &n);
        EXPECT_EQ_INT(n, 321);
        if (dr) EXPECT_EQ_INT(count_bad_drafts(dr, n, 0), 0);
        free(dr);
        H5Fclose(f);
    }
}

static void signal_flag(void) {
    EXPECT_OK(ds_recorder_catch_signals());
    EXPECT(!ds_recorder_stop_requested());
    raise(SIGTERM);
    EXPECT(ds_recorder_stop_requested());
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
}

// `test_record --write-samples DIR`: writes DIR/sample_closed.h5 (N_SAMPLE rows of every table,
// closed normally) and DIR/sample_killed.h5 (N_SAMPLE drafts flushed, more appended, writer
// killed) for tests/data/check_run_file_h5py.py, which reads them with h5py.
enum { N_SAMPLE = 100 };

static int write_samples(const char *out_dir) {
    snprintf(dir, sizeof dir, "%s", out_dir);
    struct ds_run_meta meta = test_meta();
    ds_recorder_t *rec = NULL;
    uint32_t id;
    if (ds_recorder_create(tmp_path("sample_closed.h5"), &meta, 0, &rec) ||
        ds_recorder_intern(rec, "coding", &id))
        goto fail;
    for (uint64_t i = 0; i < N_SAMPLE; i++) {
        struct ds_rec_draft d = make_draft(i);
        struct ds_rec_step st = make_step(i);
        struct ds_rec_request r = make_request(i);
        struct ds_rec_kernel k = make_kernel(i);
        struct ds_rec_range g = make_range(i);
        if (ds_recorder_append_drafts(rec, &d, 1) || ds_recorder_append_steps(rec, &st, 1) ||
            ds_recorder_append_requests(rec, &r, 1) || ds_recorder_append_kernels(rec, &k, 1) ||
            ds_recorder_append_ranges(rec, &g, 1))
            goto fail;
    }
    enum ds_status cst = ds_recorder_close(rec);
    rec = NULL;
    if (cst) goto fail;
    const char *killed = tmp_path("sample_killed.h5");
    int pipefd[2];
    if (pipe(pipefd)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        if (ds_recorder_create(killed, &meta, 0, &rec)) _exit(92);
        append_drafts_range(rec, 0, N_SAMPLE);
        if (ds_recorder_flush(rec)) _exit(93);
        append_drafts_range(rec, N_SAMPLE, 50);
        write_byte(pipefd[1]);
        for (;;)
            pause();
    }
    close(pipefd[1]);
    int ok = read_byte(pipefd[0]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return ok ? 0 : 1;
fail:
    fprintf(stderr, "write-samples: %s\n", ds_error_last());
    ds_recorder_close(rec);
    return 1;
}

int main(int argc, char **argv) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (argc == 3 && !strcmp(argv[1], "--write-samples")) return write_samples(argv[2]);
    snprintf(dir, sizeof dir, "%s/test_record.%d", DS_BINARY_DIR, (int)getpid());
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "cannot create %s\n", dir);
        return 1;
    }
    DS_RUN(layout_matches_compound);
    DS_RUN(every_table_round_trips);
    DS_RUN(strings_are_interned_once);
    DS_RUN(refuses_to_overwrite);
    DS_RUN(sigkill_keeps_flushed_rows);
    DS_RUN(concurrent_reader_sees_growth);
    DS_RUN(resume_appends_and_checks_metadata);
    DS_RUN(resume_refuses_array_attributes);
    DS_RUN(resume_names_damaged_attributes);
    DS_RUN(resume_refuses_lost_rows);
    DS_RUN(session_ends_failed);
    DS_RUN(resume_after_sigkill);
    DS_RUN(resume_refuses_cut_copy_of_killed_writer);
    DS_RUN(full_disk_gives_clean_error);
    DS_RUN(failed_flush_keeps_requests_last);
    DS_RUN(flush_sees_the_file_replaced);
    DS_RUN(abort_hook_flushes);
    DS_RUN(signal_flag);
    int rc = ds_test_end();
    if (rc == 0) {
        // Keep the files of a failing run for inspection; remove them otherwise.
        const char *names[] = {"layout.h5",  "round.h5", "strings.h5", "exists.h5",
                               "killed.h5",  "live.h5",  "resume.h5",  "other.h5",
                               "killed2.h5", "full.h5",  "killed3.h5", "killed3_cut.h5"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            unlink(tmp_path(names[i]));
        rmdir(dir);
    }
    return rc;
}
