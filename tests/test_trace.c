// Tracing on the CPU: level parsing, the "no GPU: tracing is off" answer on a machine without a
// GPU, level off (nothing registered, nothing written), misuse of the phase calls, the external
// correlation id layout, and the summing of ranges into steps rows. The expected numbers are
// worked by hand in each case. The GPU behaviour is tests/gpu_trace.c.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
#include "ds/device.h"
#include "ds/record.h"
#include "ds/trace.h"

static void levels_parse_and_name(void) {
    enum ds_rec_trace_level l = DS_REC_TRACE_KERNELS;
    EXPECT_OK(ds_trace_level_parse("off", &l));
    EXPECT_EQ_INT(l, DS_REC_TRACE_OFF);
    EXPECT_OK(ds_trace_level_parse("phases", &l));
    EXPECT_EQ_INT(l, DS_REC_TRACE_PHASES);
    EXPECT_OK(ds_trace_level_parse("kernels", &l));
    EXPECT_EQ_INT(l, DS_REC_TRACE_KERNELS);
    EXPECT_STATUS(ds_trace_level_parse("kernel", &l), DS_ERR_ARG);
    EXPECT_ERROR_HAS("\"kernel\"");
    EXPECT_STATUS(ds_trace_level_parse(NULL, &l), DS_ERR_ARG);
    EXPECT_EQ_STR(ds_trace_level_name(DS_REC_TRACE_PHASES), "phases");
    EXPECT(ds_trace_level_name((enum ds_rec_trace_level)3) == NULL);
    // The names of the file's phase enum (docs/hdf5-schema.md).
    EXPECT_EQ_STR(ds_trace_phase_name(DS_REC_PHASE_DRAFT_EXTEND), "draft_extend");
    EXPECT_EQ_STR(ds_trace_phase_name(DS_REC_PHASE_SAMPLE), "sample");
    EXPECT(ds_trace_phase_name(DS_REC_PHASE_COUNT) == NULL);
}

static void without_gpu_tracing_says_it_is_off(void) {
    if (ds_cuda_device_count() > 0) {
        printf("  (a GPU is present: the no-GPU answer is not checked here)\n");
        return;
    }
    ds_trace_t *t = (ds_trace_t *)(uintptr_t)1;
    EXPECT_STATUS(ds_trace_create(DS_REC_TRACE_PHASES, NULL, NULL, &t), DS_ERR_NODEVICE);
    printf("  message: %s\n", ds_error_last());
    EXPECT_ERROR_HAS("no GPU: tracing is off");
    EXPECT_ERROR_HAS("phases");
    EXPECT(t == NULL);
    t = (ds_trace_t *)(uintptr_t)1;
    EXPECT_STATUS(ds_trace_create(DS_REC_TRACE_KERNELS, NULL, NULL, &t), DS_ERR_NODEVICE);
    EXPECT_ERROR_HAS("no GPU: tracing is off");
    EXPECT(t == NULL);
    // A refused trace registered nothing with CUPTI.
    EXPECT_EQ_INT(ds_trace_cupti_registered(), 0);
}

static void level_off_records_nothing(void) {
    char path[] = "/tmp/ds_test_trace_XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    if (fd < 0) return;
    close(fd);
    static const uint32_t bs[] = {1};
    struct ds_run_meta meta = {.command_line = "test_trace", .rule = "greedy", .k = 3,
                               .temperature = 1.0, .top_p = 1.0, .batch_sizes = bs,
                               .n_batch_sizes = 1, .trace_level = DS_REC_TRACE_OFF};
    ds_recorder_t *rec = NULL;
    EXPECT_OK(ds_recorder_create(path, &meta, DS_RECORDER_OVERWRITE, &rec));
    ds_trace_t *t = NULL;
    EXPECT_OK(ds_trace_create(DS_REC_TRACE_OFF, rec, NULL, &t));
    EXPECT(t != NULL);
    EXPECT_EQ_INT(ds_trace_level(t), DS_REC_TRACE_OFF);
    EXPECT_OK(ds_trace_set_stream(t, NULL));
    for (uint64_t step = 0; step < 3; step++) {
        EXPECT_OK(ds_trace_phase_begin(t, step, DS_REC_PHASE_DRAFT_EXTEND, 0, 4));
        EXPECT_OK(ds_trace_phase_end(t));
        for (unsigned k = 1; k <= 2; k++) {
            EXPECT_OK(ds_trace_phase_begin(t, step, DS_REC_PHASE_DRAFT_STEP, k, 4));
            EXPECT_OK(ds_trace_phase_end(t));
        }
        EXPECT_OK(ds_trace_phase_begin(t, step, DS_REC_PHASE_VERIFY, 0, 4));
        EXPECT_OK(ds_trace_phase_next(t, step, DS_REC_PHASE_SAMPLE, 0, 4));
        EXPECT_OK(ds_trace_phase_next(t, step, DS_REC_PHASE_ACCEPT, 0, 4));
        EXPECT_OK(ds_trace_phase_end(t));
        const struct ds_trace_step_times *times = (const void *)1;
        size_t n = 99;
        EXPECT_OK(ds_trace_collect(t, &times, &n));
        EXPECT_EQ_INT(n, 0);
        EXPECT(times == NULL);
    }
    struct ds_trace_stats s;
    ds_trace_stats(t, &s);
    EXPECT_EQ_INT(s.ranges + s.kernels + s.dropped_records + s.dropped_ranges + s.buffers, 0);
    const struct ds_rec_kernel *k = NULL;
    const struct ds_rec_range *r = NULL;
    size_t nk = 9, nr = 9;
    EXPECT_OK(ds_trace_last_rows(t, &k, &nk, &r, &nr));
    EXPECT_EQ_INT(nk, 0);
    EXPECT_EQ_INT(nr, 0);
    ds_trace_release(t);
    uint64_t rows = 1;
    EXPECT_OK(ds_recorder_rows(rec, DS_REC_KERNELS, &rows));
    EXPECT_EQ_INT(rows, 0);
    EXPECT_OK(ds_recorder_rows(rec, DS_REC_RANGES, &rows));
    EXPECT_EQ_INT(rows, 0);
    EXPECT_OK(ds_recorder_close(rec));
    unlink(path);
    EXPECT_EQ_INT(ds_trace_cupti_registered(), 0);
}

static void null_trace_is_a_no_op(void) {
    EXPECT_OK(ds_trace_phase_begin(NULL, 1, DS_REC_PHASE_VERIFY, 0, 1));
    EXPECT_OK(ds_trace_phase_end(NULL));
    EXPECT_OK(ds_trace_phase_next(NULL, 1, DS_REC_PHASE_ACCEPT, 0, 1));
    EXPECT(ds_trace_flush_share(NULL, NULL, NULL, 1000) == 0.0);
    const struct ds_trace_step_times *times = NULL;
    size_t n = 5;
    EXPECT_OK(ds_trace_collect(NULL, &times, &n));
    EXPECT_EQ_INT(n, 0);
    EXPECT_STATUS(ds_trace_collect(NULL, NULL, &n), DS_ERR_ARG);
    struct ds_trace_stats s = {.ranges = 7};
    ds_trace_stats(NULL, &s);
    EXPECT_EQ_INT(s.ranges, 0);
    EXPECT_EQ_INT(ds_trace_level(NULL), DS_REC_TRACE_OFF);
    ds_trace_release(NULL);
    EXPECT_STATUS(ds_trace_pause(NULL), DS_ERR_ARG);
    double ov = 1;
    EXPECT_STATUS(ds_trace_measure_overhead(NULL, NULL, 1, 0, 0, &ov), DS_ERR_ARG);
    uint32_t b = 1;
    struct ds_trace_baseline out;
    EXPECT_STATUS(ds_trace_baseline_run(NULL, &b, 1, NULL, &out), DS_ERR_ARG);
}

static void bad_arguments_are_refused(void) {
    ds_trace_t *t = NULL;
    EXPECT_STATUS(ds_trace_create((enum ds_rec_trace_level)7, NULL, NULL, &t), DS_ERR_ARG);
    EXPECT_ERROR_HAS("invalid level 7");
    struct ds_trace_options o = {.buffer_bytes = 100};
    EXPECT_STATUS(ds_trace_create(DS_REC_TRACE_OFF, NULL, &o, &t), DS_ERR_ARG);
    EXPECT_ERROR_HAS("buffer 100 bytes");
    EXPECT(t == NULL);
    EXPECT_STATUS(ds_trace_create(DS_REC_TRACE_OFF, NULL, NULL, NULL), DS_ERR_ARG);

    EXPECT_OK(ds_trace_create(DS_REC_TRACE_OFF, NULL, NULL, &t));
    EXPECT_STATUS(ds_trace_phase_end(t), DS_ERR_ARG);
    EXPECT_ERROR_HAS("without a phase begin");
    // draft_step is 1..255 for draft steps and 0 for every other phase.
    EXPECT_STATUS(ds_trace_phase_begin(t, 1, DS_REC_PHASE_VERIFY, 2, 1), DS_ERR_ARG);
    EXPECT_STATUS(ds_trace_phase_begin(t, 1, DS_REC_PHASE_DRAFT_STEP, 0, 1), DS_ERR_ARG);
    EXPECT_STATUS(ds_trace_phase_begin(t, 1, DS_REC_PHASE_DRAFT_STEP, 256, 1), DS_ERR_ARG);
    EXPECT_STATUS(ds_trace_phase_begin(t, 1, DS_REC_PHASE_COUNT, 0, 1), DS_ERR_ARG);
    // Steps need 47 bits of the external id.
    EXPECT_STATUS(ds_trace_phase_begin(t, UINT64_C(1) << 47, DS_REC_PHASE_VERIFY, 0, 1),
                  DS_ERR_ARG);
    EXPECT_OK(ds_trace_phase_begin(t, (UINT64_C(1) << 47) - 1, DS_REC_PHASE_VERIFY, 0, 1));
    EXPECT_OK(ds_trace_phase_end(t));
    // Nesting: 8 levels open, the 9th refused, then all 8 close and a 9th end is refused.
    for (int i = 0; i < 8; i++) EXPECT_OK(ds_trace_phase_begin(t, 2, DS_REC_PHASE_ACCEPT, 0, 1));
    EXPECT_STATUS(ds_trace_phase_begin(t, 2, DS_REC_PHASE_ACCEPT, 0, 1), DS_ERR_ARG);
    EXPECT_ERROR_HAS("deeper than 8");
    EXPECT_STATUS(ds_trace_pause(t), DS_ERR_ARG); // a phase is open
    for (int i = 0; i < 8; i++) EXPECT_OK(ds_trace_phase_end(t));
    EXPECT_STATUS(ds_trace_phase_end(t), DS_ERR_ARG);
    // phase_next needs an open phase, and checks the next phase's arguments before it closes
    // anything: after the refusal the phase is still open (one end closes it, a second fails).
    EXPECT_STATUS(ds_trace_phase_next(t, 3, DS_REC_PHASE_ACCEPT, 0, 1), DS_ERR_ARG);
    EXPECT_ERROR_HAS("without an open phase");
    EXPECT_OK(ds_trace_phase_begin(t, 3, DS_REC_PHASE_VERIFY, 0, 1));
    EXPECT_STATUS(ds_trace_phase_next(t, 3, DS_REC_PHASE_DRAFT_STEP, 0, 1), DS_ERR_ARG);
    EXPECT_OK(ds_trace_phase_next(t, 3, DS_REC_PHASE_SAMPLE, 0, 1));
    EXPECT_OK(ds_trace_phase_end(t));
    EXPECT_STATUS(ds_trace_phase_end(t), DS_ERR_ARG);
    EXPECT_OK(ds_trace_pause(t));
    EXPECT_OK(ds_trace_resume(t));
    double ov = -1;
    EXPECT_OK(ds_trace_measure_overhead(t, (ds_gptoss_t *)(uintptr_t)1, 1, 0, 0, &ov));
    EXPECT_NEAR(ov, 0.0, 0.0); // level off costs nothing by definition; the model is not touched
    ds_trace_release(t);
}

static void external_ids_have_the_documented_layout(void) {
    // 1 << 63 | 5 << 16 | 3 << 8 | 0 (verify is phase 3), worked by hand.
    EXPECT(ds_trace_ext_id(5, DS_REC_PHASE_VERIFY, 0) == UINT64_C(0x8000000000050300));
    // 1 << 63 | 0x1234 << 16 | 2 << 8 | 7 (draft_step is phase 2).
    EXPECT(ds_trace_ext_id(0x1234, DS_REC_PHASE_DRAFT_STEP, 7) == UINT64_C(0x8000000012340207));
    uint64_t step = 0;
    enum ds_rec_phase phase = DS_REC_PHASE_PREFILL;
    unsigned ds = 0;
    uint64_t big = (UINT64_C(1) << 47) - 1;
    EXPECT_OK(ds_trace_ext_id_decode(ds_trace_ext_id(big, DS_REC_PHASE_DRAFT_STEP, 255), &step,
                                     &phase, &ds));
    EXPECT(step == big);
    EXPECT_EQ_INT(phase, DS_REC_PHASE_DRAFT_STEP);
    EXPECT_EQ_INT(ds, 255);
    EXPECT_OK(ds_trace_ext_id_decode(ds_trace_ext_id(0, DS_REC_PHASE_PREFILL, 0), &step, &phase,
                                     &ds));
    EXPECT(step == 0);
    EXPECT_EQ_INT(phase, DS_REC_PHASE_PREFILL);
    EXPECT_EQ_INT(ds, 0);
    // Ids no encode makes: no tag bit, phase 9, a draft step on verify, draft_step phase with 0.
    EXPECT_STATUS(ds_trace_ext_id_decode(0x50300, &step, &phase, &ds), DS_ERR_RANGE);
    EXPECT_STATUS(ds_trace_ext_id_decode(UINT64_C(0x8000000000050900), &step, &phase, &ds),
                  DS_ERR_RANGE);
    EXPECT_STATUS(ds_trace_ext_id_decode(UINT64_C(0x8000000000050301), &step, &phase, &ds),
                  DS_ERR_RANGE);
    EXPECT_STATUS(ds_trace_ext_id_decode(UINT64_C(0x8000000000050200), &step, &phase, &ds),
                  DS_ERR_RANGE);
    EXPECT_ERROR_HAS("not ours");
}

static struct ds_rec_range rg(uint64_t step, enum ds_rec_phase p, unsigned k, uint64_t a,
                              uint64_t b) {
    return (struct ds_rec_range){.step = step, .start_ns = a, .end_ns = b, .batch_size = 4,
                                 .phase = (uint8_t)p, .draft_step = (uint8_t)k};
}

static void ranges_sum_into_steps_rows(void) {
    const struct ds_rec_range r[] = {
        rg(7, DS_REC_PHASE_PREFILL, 0, 100, 200),     rg(7, DS_REC_PHASE_DRAFT_EXTEND, 0, 200, 260),
        rg(7, DS_REC_PHASE_DRAFT_STEP, 1, 260, 300),  rg(7, DS_REC_PHASE_DRAFT_STEP, 2, 300, 350),
        rg(7, DS_REC_PHASE_VERIFY, 0, 350, 500),      rg(7, DS_REC_PHASE_ACCEPT, 0, 500, 520),
        rg(7, DS_REC_PHASE_SAMPLE, 0, 520, 530),      rg(8, DS_REC_PHASE_DRAFT_EXTEND, 0, 600, 650),
        rg(8, DS_REC_PHASE_VERIFY, 0, 650, 700),
    };
    struct ds_trace_step_times out[4];
    size_t n = 0;
    EXPECT_OK(ds_trace_sum_ranges(r, 9, out, 4, &n));
    EXPECT_EQ_INT(n, 2);
    EXPECT_EQ_INT(out[0].step, 7);
    EXPECT_EQ_INT(out[0].ranges, 7);
    EXPECT_EQ_INT(out[0].start_ns, 100);
    EXPECT_EQ_INT(out[0].end_ns, 530);
    EXPECT_EQ_INT(out[0].phase_ns[DS_REC_PHASE_PREFILL], 100);
    EXPECT_EQ_INT(out[0].phase_ns[DS_REC_PHASE_DRAFT_STEP], 40 + 50);
    EXPECT_EQ_INT(out[0].phase_ns[DS_REC_PHASE_VERIFY], 150);

    struct ds_rec_step row = {.request = 3, .accepted = 2};
    ds_trace_step_fill(&out[0], &row);
    EXPECT_EQ_INT(row.draft_ns, 60 + 40 + 50); // extend + both draft steps
    EXPECT_EQ_INT(row.verify_ns, 150);
    EXPECT_EQ_INT(row.accept_ns, 20 + 10); // accept + sample
    EXPECT_EQ_INT(row.total_ns, 530 - 100);
    EXPECT_EQ_INT(row.request, 3); // untouched
    EXPECT_EQ_INT(row.accepted, 2);
    ds_trace_step_fill(&out[1], &row);
    EXPECT_EQ_INT(row.draft_ns, 50);
    EXPECT_EQ_INT(row.verify_ns, 50);
    EXPECT_EQ_INT(row.accept_ns, 0);
    EXPECT_EQ_INT(row.total_ns, 100);
    ds_trace_step_fill(NULL, &row);
    EXPECT_EQ_INT(row.draft_ns + row.verify_ns + row.accept_ns + row.total_ns, 0);

    // More steps than room: the first cap are kept and the call says so.
    EXPECT_STATUS(ds_trace_sum_ranges(r, 9, out, 1, &n), DS_ERR_RANGE);
    EXPECT_EQ_INT(n, 1);
    EXPECT_EQ_INT(out[0].step, 7);
    EXPECT_OK(ds_trace_sum_ranges(NULL, 0, NULL, 0, &n));
    EXPECT_EQ_INT(n, 0);
    EXPECT_STATUS(ds_trace_sum_ranges(NULL, 3, out, 4, &n), DS_ERR_ARG);
}

// ds_trace_poll is collect's per-step form: the same answers for a NULL or level-off trace.
static void poll_and_sink_without_a_trace(void) {
    const struct ds_trace_step_times *times = NULL;
    size_t n = 5;
    EXPECT_OK(ds_trace_poll(NULL, &times, &n));
    EXPECT_EQ_INT(n, 0);
    EXPECT(times == NULL);
    EXPECT_STATUS(ds_trace_poll(NULL, &times, NULL), DS_ERR_ARG);
    EXPECT_STATUS(ds_trace_set_kernel_sink(NULL, NULL, NULL), DS_ERR_ARG);
    ds_trace_t *t = NULL;
    EXPECT_OK(ds_trace_create(DS_REC_TRACE_OFF, NULL, NULL, &t));
    EXPECT_OK(ds_trace_set_kernel_sink(t, NULL, NULL));
    EXPECT_OK(ds_trace_phase_begin(t, 3, DS_REC_PHASE_VERIFY, 0, 1));
    EXPECT_OK(ds_trace_phase_end(t));
    n = 5;
    EXPECT_OK(ds_trace_poll(t, &times, &n));
    EXPECT_EQ_INT(n, 0);
    // API records are a kernels-level notion.
    EXPECT_EQ_INT(ds_trace_api_records(t), DS_TRACE_API_UNSET);
    EXPECT_EQ_INT(ds_trace_api_records(NULL), DS_TRACE_API_UNSET);
    struct ds_trace_stats st = {.flushes = 9};
    ds_trace_stats(t, &st);
    EXPECT_EQ_INT(st.flushes + st.drains + st.flush_ns, 0);
    ds_trace_release(t);
}

static void api_records_modes_parse(void) {
    enum ds_trace_api a = DS_TRACE_API_UNSET;
    static const char *const names[] = {"none", "runtime", "all"};
    for (int i = 0; i < 3; i++) {
        EXPECT_OK(ds_trace_api_parse(names[i], &a));
        EXPECT_EQ_INT(a, DS_TRACE_API_NONE + i);
        EXPECT_EQ_STR(ds_trace_api_name(a), names[i]);
    }
    EXPECT_OK(ds_trace_api_parse("0", &a)); // the DS_TRACE_API_RECORDS=0/1
    EXPECT_EQ_INT(a, DS_TRACE_API_NONE);
    EXPECT_OK(ds_trace_api_parse("1", &a));
    EXPECT_EQ_INT(a, DS_TRACE_API_ALL);
    EXPECT_STATUS(ds_trace_api_parse("drivers", &a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("DS_TRACE_API_RECORDS");
    EXPECT_ERROR_HAS("\"drivers\"");
    // The launch-calls-only mode is gone (it attributed nothing on the H200): refused, with why.
    EXPECT_STATUS(ds_trace_api_parse("launch", &a), DS_ERR_ARG);
    EXPECT_ERROR_HAS("\"launch\" was removed");
    EXPECT_ERROR_HAS("use runtime");
    EXPECT(ds_trace_api_name(DS_TRACE_API_UNSET) == NULL);
    EXPECT(ds_trace_api_name((enum ds_trace_api)9) == NULL);
    // The default is the mode gpu_trace measured to attribute every kernel with the fewest
    // records: runtime.
    EXPECT_EQ_INT(DS_TRACE_API_DEFAULT_MODE, DS_TRACE_API_RUNTIME);

    // Options: a mode out of range is refused; a bad environment value is refused at create
    // (before the device is looked for), naming the variable; other levels ignore it.
    ds_trace_t *t = NULL;
    struct ds_trace_options o = {.api_records = 7};
    EXPECT_STATUS(ds_trace_create(DS_REC_TRACE_OFF, NULL, &o, &t), DS_ERR_ARG);
    EXPECT_ERROR_HAS("api records 7");
    EXPECT(t == NULL);
    EXPECT(setenv("DS_TRACE_API_RECORDS", "bogus", 1) == 0);
    EXPECT_STATUS(ds_trace_create(DS_REC_TRACE_KERNELS, NULL, NULL, &t), DS_ERR_ARG);
    EXPECT_ERROR_HAS("DS_TRACE_API_RECORDS: unknown value \"bogus\"");
    EXPECT(t == NULL);
    EXPECT_OK(ds_trace_create(DS_REC_TRACE_OFF, NULL, NULL, &t));
    ds_trace_release(t);
    unsetenv("DS_TRACE_API_RECORDS");
    EXPECT_EQ_INT(ds_trace_cupti_registered(), 0);
}

// Mangled names written by hand from the Itanium C++ ABI (<len><identifier>, N..E nested names,
// I..E template arguments, L<type><value>E literals, n for a minus sign, builtin type codes).
static void kernel_names_shorten(void) {
    char out[96];
    EXPECT_EQ_STR(ds_trace_short_name("_Z9matmul_tcILi16ELi8ELi256ELi1ELi1ELi2ELi4EEvPKvS1_Pv",
                                      out, sizeof out),
                  "matmul_tc<16,8,256,1,1,2,4>");
    EXPECT_EQ_STR(ds_trace_short_name("_ZN2ds6kernel4stepILb1EEEvv", out, sizeof out),
                  "step<1>");
    EXPECT_EQ_STR(ds_trace_short_name("_Z8sdpa_gqaIfLi64EEvPKf", out, sizeof out),
                  "sdpa_gqa<float,64>");
    EXPECT_EQ_STR(ds_trace_short_name("_Z7convertI13__nv_bfloat16Evv", out, sizeof out),
                  "convert<__nv_bfloat16>");
    EXPECT_EQ_STR(ds_trace_short_name("_Z4biasILin3EEvv", out, sizeof out), "bias<-3>");
    EXPECT_EQ_STR(ds_trace_short_name("_Z12rmsnorm_bf16PKvPv", out, sizeof out), "rmsnorm_bf16");
    EXPECT_EQ_STR(ds_trace_short_name("ds_probe_spin", out, sizeof out), "ds_probe_spin");
    // A form it does not read stays as it is; a long name is cut with "..." inside cap.
    EXPECT_EQ_STR(ds_trace_short_name("_ZZ3fooE3bar", out, sizeof out), "_ZZ3fooE3bar");
    // So does a nested name whose first component it cannot read (it came out empty); one it
    // stops in keeps the last component read.
    EXPECT_EQ_STR(ds_trace_short_name("_ZNSt6vectorIiE4sizeEv", out, sizeof out),
                  "_ZNSt6vectorIiE4sizeEv");
    EXPECT_EQ_STR(ds_trace_short_name("_ZNK3foo3barEv", out, sizeof out), "_ZNK3foo3barEv");
    EXPECT_EQ_STR(ds_trace_short_name("_ZN3foo3barB5cxx11Ev", out, sizeof out), "bar");
    EXPECT_EQ_STR(ds_trace_short_name("abcdefghijkl", out, 8), "abcd...");
    // One that fills cap exactly is whole: no "..." (it lost its last 3 characters to one).
    EXPECT_EQ_STR(ds_trace_short_name("abcdefg", out, 8), "abcdefg");
    EXPECT_EQ_STR(ds_trace_short_name("_Z6kernelILi1EEvv", out, 10), "kernel<1>");
    EXPECT_EQ_STR(ds_trace_short_name("_Z6kernelILi12EEvv", out, 10), "kernel...");
    // A long namespace cut does not mark the short last component.
    EXPECT_EQ_STR(ds_trace_short_name("_ZN21a_long_namespace_name1kEv", out, 8), "k");
    // A length running past the end is not read past it.
    EXPECT_EQ_STR(ds_trace_short_name("_Z40short", out, sizeof out), "_Z40short");
    EXPECT_EQ_STR(ds_trace_short_name(NULL, out, sizeof out), "");
}

// A kernel row of (step, phase, draft step) lasting ns, after every row made before it (one
// stream, no overlap: each row's exclusive time is its duration).
static struct ds_rec_kernel krow(uint64_t step, enum ds_rec_phase phase, unsigned dstep,
                                 uint64_t ns) {
    static uint64_t clock = 1000;
    const uint64_t start = clock;
    clock += ns + 1;
    return (struct ds_rec_kernel){.step = step, .phase = (uint8_t)phase,
                                  .draft_step = (uint8_t)dstep, .start_ns = start,
                                  .end_ns = start + ns};
}

// The bench's per-kernel table: rows of two step kinds fed one after the other through the same
// table, as the bench does. Expected counts are worked by hand from the rows fed below.
static void kernel_table_counts_its_own_steps(void) {
    ds_trace_ktab_t *k = NULL;
    EXPECT_STATUS(ds_trace_ktab_create(NULL), DS_ERR_ARG);
    EXPECT_OK(ds_trace_ktab_create(&k));
    if (!k) return;
    // Two distinct name pointers with the same text count as one kernel (names by text).
    static const char n_mm[] = "_Z9matmul_tcILi16ELi8EEvPKv", n_mm2[] = "_Z9matmul_tcILi16ELi8EEvPKv";
    static const char n_emb[] = "embed_bf16", n_norm[] = "rmsnorm_bf16";

    // Kind 1 (verify, steps 10..11): per step 3 matmul (10 ns each), 1 rmsnorm (4 ns).
    ds_trace_ktab_reset(k, 10, 10, DS_REC_PHASE_VERIFY, 0);
    for (uint64_t step = 10; step < 12; step++) {
        ds_trace_ktab_set_end(k, step + 1);
        struct ds_rec_kernel r = krow(step, DS_REC_PHASE_VERIFY, 0, 10);
        ds_trace_ktab_sink(k, &r, n_mm);
        r = krow(step, DS_REC_PHASE_VERIFY, 0, 10);
        ds_trace_ktab_sink(k, &r, n_mm2);
        r = krow(step, DS_REC_PHASE_VERIFY, 0, 10);
        ds_trace_ktab_sink(k, &r, n_mm);
        r = krow(step, DS_REC_PHASE_VERIFY, 0, 4);
        ds_trace_ktab_sink(k, &r, n_norm);
    }
    // Rows that are not the table's: a later step, an earlier one, another phase, another draft
    // step: 4 rows counted apart.
    struct ds_rec_kernel late = krow(12, DS_REC_PHASE_VERIFY, 0, 50);
    struct ds_rec_kernel early = krow(9, DS_REC_PHASE_VERIFY, 0, 50);
    struct ds_rec_kernel phase = krow(10, DS_REC_PHASE_PREFILL, 0, 50);
    struct ds_rec_kernel dstep = krow(10, DS_REC_PHASE_VERIFY, 1, 50);
    ds_trace_ktab_sink(k, &late, n_emb);
    ds_trace_ktab_sink(k, &early, n_emb);
    ds_trace_ktab_sink(k, &phase, n_emb);
    ds_trace_ktab_sink(k, &dstep, n_emb);
    size_t n = 0;
    uint64_t other = 0;
    int full = 1;
    const struct ds_trace_ktab_entry *e = ds_trace_ktab_entries(k, &n, &other, &full);
    EXPECT_EQ_INT(n, 2);
    EXPECT_EQ_INT(other, 4);
    EXPECT_EQ_INT(full, 0);
    if (n == 2) {
        // Sorted by time: matmul 2 steps x 3 x 10 ns = 60 ns, rmsnorm 2 x 4 = 8 ns.
        EXPECT_EQ_STR(e[0].name, "matmul_tc<16,8>");
        EXPECT_EQ_INT(e[0].launches, 6);
        EXPECT_EQ_INT(e[0].ns, 60);
        EXPECT_EQ_INT(e[0].excl_ns, 60); // rows one after another: exclusive = raw
        EXPECT_EQ_STR(e[1].name, "rmsnorm_bf16");
        EXPECT_EQ_INT(e[1].launches, 2);
        EXPECT_EQ_INT(e[1].ns, 8);
        EXPECT_EQ_INT(e[1].excl_ns, 8);
    }

    // Kind 2 (draft step 1, steps 12..14): per step 1 embed (7 ns), 1 matmul (10 ns). A new name
    // in the first place must not inherit kind 1's counts (the round-1 table showed embed with
    // the previous kind's top entry's launches).
    ds_trace_ktab_reset(k, 12, 12, DS_REC_PHASE_DRAFT_STEP, 1);
    e = ds_trace_ktab_entries(k, &n, &other, &full);
    EXPECT_EQ_INT(n + other, 0);
    for (uint64_t step = 12; step < 15; step++) {
        ds_trace_ktab_set_end(k, step + 1);
        struct ds_rec_kernel r = krow(step, DS_REC_PHASE_DRAFT_STEP, 1, 7);
        ds_trace_ktab_sink(k, &r, n_emb);
        r = krow(step, DS_REC_PHASE_DRAFT_STEP, 1, 10);
        ds_trace_ktab_sink(k, &r, n_mm);
    }
    // A late row of kind 1 (step 11, verify) arriving now is not counted.
    struct ds_rec_kernel stale = krow(11, DS_REC_PHASE_VERIFY, 0, 10);
    ds_trace_ktab_sink(k, &stale, n_mm);
    e = ds_trace_ktab_entries(k, &n, &other, NULL);
    EXPECT_EQ_INT(n, 2);
    EXPECT_EQ_INT(other, 1);
    if (n == 2) {
        EXPECT_EQ_STR(e[0].name, "matmul_tc<16,8>"); // 3 x 10 = 30 ns
        EXPECT_EQ_INT(e[0].launches, 3);
        EXPECT_EQ_INT(e[0].ns, 30);
        EXPECT_EQ_STR(e[1].name, "embed_bf16"); // 3 x 7 = 21 ns
        EXPECT_EQ_INT(e[1].launches, 3);
        EXPECT_EQ_INT(e[1].ns, 21);
    }
    // Reading the entries does not disturb later counting (a sorted copy is returned).
    struct ds_rec_kernel r = krow(14, DS_REC_PHASE_DRAFT_STEP, 1, 7);
    ds_trace_ktab_sink(k, &r, n_emb);
    e = ds_trace_ktab_entries(k, &n, NULL, NULL);
    EXPECT(n == 2 && e[1].launches == 4 && e[1].ns == 28);
    // NULL table and row are ignored.
    ds_trace_ktab_sink(NULL, &r, n_emb);
    ds_trace_ktab_sink(k, NULL, n_emb);
    EXPECT(ds_trace_ktab_entries(NULL, &n, &other, &full) == NULL);
    EXPECT_EQ_INT(n + other + (uint64_t)full, 0);
    ds_trace_ktab_release(k);
    ds_trace_ktab_release(NULL);
}

// Keyed by grid (bench --by-grid): one kernel launched with two grids gives two entries named
// "short name [x,y,z]"; the setting survives a reset; off (the default), the same rows merge.
// Counts worked by hand from the rows fed below.
static void kernel_table_by_grid(void) {
    ds_trace_ktab_t *k = NULL;
    EXPECT_OK(ds_trace_ktab_create(&k));
    if (!k) return;
    static const char n_mm[] = "_Z9matmul_tcILi16ELi8EEvPKv", n_mm2[] = "_Z9matmul_tcILi16ELi8EEvPKv";
    ds_trace_ktab_set_by_grid(k, 1);
    ds_trace_ktab_reset(k, 5, 7, DS_REC_PHASE_VERIFY, 0);
    // Per step: the matmul over grid 320x1x1 (9 ns) and 180x1x1 (6 ns) twice each, then over
    // 320x1x1 once more from another name pointer with the same text (3 ns).
    for (uint64_t step = 5; step < 7; step++) {
        for (int j = 0; j < 2; j++) {
            struct ds_rec_kernel r = krow(step, DS_REC_PHASE_VERIFY, 0, 9);
            r.grid_x = 320, r.grid_y = 1, r.grid_z = 1;
            ds_trace_ktab_sink(k, &r, n_mm);
            r = krow(step, DS_REC_PHASE_VERIFY, 0, 6);
            r.grid_x = 180, r.grid_y = 1, r.grid_z = 1;
            ds_trace_ktab_sink(k, &r, n_mm);
        }
        struct ds_rec_kernel r = krow(step, DS_REC_PHASE_VERIFY, 0, 3);
        r.grid_x = 320, r.grid_y = 1, r.grid_z = 1;
        ds_trace_ktab_sink(k, &r, n_mm2);
    }
    size_t n = 0;
    const struct ds_trace_ktab_entry *e = ds_trace_ktab_entries(k, &n, NULL, NULL);
    EXPECT_EQ_INT(n, 2);
    // 320: 2 steps x (2 x 9 + 3) = 42 ns, 6 launches; 180: 2 x 2 x 6 = 24 ns, 4 launches.
    static const struct {
        const char *name;
        uint64_t launches, ns;
    } want[2] = {{"matmul_tc<16,8> [320,1,1]", 6, 42}, {"matmul_tc<16,8> [180,1,1]", 4, 24}};
    for (size_t i = 0; i < 2 && n == 2; i++) {
        EXPECT_EQ_STR(e[i].name, want[i].name);
        EXPECT(e[i].launches == want[i].launches && e[i].ns == want[i].ns);
    }
    // Kept across a reset; turned off, the grids no longer split the rows.
    ds_trace_ktab_reset(k, 7, 8, DS_REC_PHASE_VERIFY, 0);
    struct ds_rec_kernel r = krow(7, DS_REC_PHASE_VERIFY, 0, 5);
    r.grid_x = 2;
    ds_trace_ktab_sink(k, &r, n_mm);
    e = ds_trace_ktab_entries(k, &n, NULL, NULL);
    EXPECT(n == 1 && !strcmp(e[0].name, "matmul_tc<16,8> [2,0,0]"));
    // A name cut to make room for its grid says so: 95 - 8 bytes of room, the last 3 "...".
    static char n_long[100];
    memset(n_long, 'x', 90);
    ds_trace_ktab_reset(k, 7, 8, DS_REC_PHASE_VERIFY, 0);
    r = krow(7, DS_REC_PHASE_VERIFY, 0, 5);
    r.grid_x = 1, r.grid_y = 1, r.grid_z = 1;
    ds_trace_ktab_sink(k, &r, n_long);
    e = ds_trace_ktab_entries(k, &n, NULL, NULL);
    char want_long[96];
    snprintf(want_long, sizeof want_long, "%.84s... [1,1,1]", n_long);
    EXPECT(n == 1);
    if (n == 1) EXPECT_EQ_STR(e[0].name, want_long);
    ds_trace_ktab_set_by_grid(k, 0);
    ds_trace_ktab_reset(k, 7, 8, DS_REC_PHASE_VERIFY, 0);
    for (uint32_t gx = 1; gx <= 3; gx++) {
        r = krow(7, DS_REC_PHASE_VERIFY, 0, 5);
        r.grid_x = gx;
        ds_trace_ktab_sink(k, &r, n_mm);
    }
    e = ds_trace_ktab_entries(k, &n, NULL, NULL);
    EXPECT(n == 1 && !strcmp(e[0].name, "matmul_tc<16,8>") && e[0].launches == 3);
    ds_trace_ktab_set_by_grid(NULL, 1); // a NULL table is ignored
    ds_trace_ktab_release(k);
}

// Exclusive times under programmatic dependent launch: kernels that start before their
// predecessor on the stream ends. Rows (ns), fed out of order, all of step 3, verify:
//   stream 7: A a [100,200]  B b [150,260]  C c [170,300]  D a [400,450]  E b [420,440]
//   stream 9: F c [120,220]
//   and a row of another phase over [0,1000] on stream 7 (counted apart, no part in the times).
// Worked by hand, per stream in start order, each row from max(start, latest end so far) to end:
//   A 100..200 = 100, B 200..260 = 60, C 260..300 = 40, D 400..450 = 50, E inside D = 0; F 100.
//   a: raw 100 + 50 = 150, excl 150; b: raw 110 + 20 = 130, excl 60; c: raw 130 + 100 = 230,
//   excl 40 + 100 = 140. Stream 7's exclusive sum 250 = its busy time [100,300] + [400,450].
static void kernel_table_exclusive_times(void) {
    ds_trace_ktab_t *k = NULL;
    EXPECT_OK(ds_trace_ktab_create(&k));
    if (!k) return;
    ds_trace_ktab_reset(k, 3, 4, DS_REC_PHASE_VERIFY, 0);
    static const char na[] = "a", nb[] = "b", nc[] = "c";
    struct {
        uint32_t stream;
        uint64_t start, end;
        const char *name;
    } rows[] = {{7, 170, 300, nc}, {7, 100, 200, na}, {9, 120, 220, nc},
                {7, 420, 440, nb}, {7, 150, 260, nb}, {7, 400, 450, na}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct ds_rec_kernel r = {.step = 3, .phase = DS_REC_PHASE_VERIFY, .stream = rows[i].stream,
                                  .start_ns = rows[i].start, .end_ns = rows[i].end};
        ds_trace_ktab_sink(k, &r, rows[i].name);
    }
    struct ds_rec_kernel apart = {.step = 3, .phase = DS_REC_PHASE_PREFILL, .stream = 7,
                                  .start_ns = 0, .end_ns = 1000};
    ds_trace_ktab_sink(k, &apart, na);
    size_t n = 0;
    uint64_t other = 0;
    int full = 1;
    const struct ds_trace_ktab_entry *e = ds_trace_ktab_entries(k, &n, &other, &full);
    EXPECT_EQ_INT(n, 3);
    EXPECT_EQ_INT(other, 1);
    EXPECT_EQ_INT(full, 0);
    if (n == 3) { // sorted by exclusive time
        EXPECT_EQ_STR(e[0].name, "a");
        EXPECT_EQ_INT(e[0].ns, 150);
        EXPECT_EQ_INT(e[0].excl_ns, 150);
        EXPECT_EQ_STR(e[1].name, "c");
        EXPECT_EQ_INT(e[1].ns, 230);
        EXPECT_EQ_INT(e[1].excl_ns, 140);
        EXPECT_EQ_STR(e[2].name, "b");
        EXPECT_EQ_INT(e[2].ns, 130);
        EXPECT_EQ_INT(e[2].excl_ns, 60);
        EXPECT_EQ_INT(e[0].launches + e[1].launches + e[2].launches, 6);
    }
    // Read twice: the same figures (the times are recomputed, not added up again).
    e = ds_trace_ktab_entries(k, &n, NULL, NULL);
    EXPECT(n == 3 && e[0].excl_ns == 150 && e[1].excl_ns == 140 && e[2].excl_ns == 60);
    // A reset forgets the rows: one new row alone is all exclusive.
    ds_trace_ktab_reset(k, 3, 4, DS_REC_PHASE_VERIFY, 0);
    struct ds_rec_kernel one = {.step = 3, .phase = DS_REC_PHASE_VERIFY, .stream = 7,
                                .start_ns = 500, .end_ns = 530};
    ds_trace_ktab_sink(k, &one, nb);
    e = ds_trace_ktab_entries(k, &n, NULL, NULL);
    EXPECT(n == 1 && e[0].ns == 30 && e[0].excl_ns == 30);
    ds_trace_ktab_release(k);
}

// More distinct names than the table holds: the last entry takes the rest, and says so.
static void kernel_table_full_keeps_counting(void) {
    ds_trace_ktab_t *k = NULL;
    EXPECT_OK(ds_trace_ktab_create(&k));
    if (!k) return;
    ds_trace_ktab_reset(k, 0, 1, DS_REC_PHASE_VERIFY, 0);
    static char names[600][16];
    struct ds_rec_kernel r = krow(0, DS_REC_PHASE_VERIFY, 0, 1);
    for (int i = 0; i < 600; i++) {
        snprintf(names[i], sizeof names[i], "k%d", i);
        ds_trace_ktab_sink(k, &r, names[i]);
    }
    size_t n = 0;
    int full = 0;
    const struct ds_trace_ktab_entry *e = ds_trace_ktab_entries(k, &n, NULL, &full);
    EXPECT_EQ_INT(full, 1);
    EXPECT_EQ_INT(n, 512);
    uint64_t launches = 0;
    for (size_t i = 0; i < n; i++) launches += e[i].launches;
    EXPECT_EQ_INT(launches, 600); // none lost
    ds_trace_ktab_release(k);
}

// Every counter is subtracted: the run's end line and sessions.trace_dropped count the session
// alone (they counted the baseline and overhead windows before it too). A field added to the
// struct fails the size check until ds_trace_stats_since subtracts it.
static void stats_since_subtracts_every_counter(void) {
    enum { N = sizeof(struct ds_trace_stats) / sizeof(uint64_t) };
    EXPECT_EQ_INT(sizeof(struct ds_trace_stats), 14 * sizeof(uint64_t));
    uint64_t a[N], b[N];
    for (size_t i = 0; i < N; i++)
        a[i] = 1000 + 7 * i, b[i] = 3 * i + 1;
    struct ds_trace_stats now, before;
    memcpy(&now, a, sizeof now);
    memcpy(&before, b, sizeof before);
    ds_trace_stats_since(&now, &before);
    memcpy(a, &now, sizeof now);
    for (size_t i = 0; i < N; i++)
        if (a[i] != 1000 + 7 * i - (3 * i + 1)) DS_FAILF("counter %zu not subtracted", i);
}

int main(void) {
    DS_RUN(levels_parse_and_name);
    DS_RUN(poll_and_sink_without_a_trace);
    DS_RUN(api_records_modes_parse);
    DS_RUN(kernel_names_shorten);
    DS_RUN(kernel_table_counts_its_own_steps);
    DS_RUN(kernel_table_full_keeps_counting);
    DS_RUN(kernel_table_exclusive_times);
    DS_RUN(kernel_table_by_grid);
    DS_RUN(without_gpu_tracing_says_it_is_off);
    DS_RUN(level_off_records_nothing);
    DS_RUN(stats_since_subtracts_every_counter);
    DS_RUN(null_trace_is_a_no_op);
    DS_RUN(bad_arguments_are_refused);
    DS_RUN(external_ids_have_the_documented_layout);
    DS_RUN(ranges_sum_into_steps_rows);
    return ds_test_end();
}
