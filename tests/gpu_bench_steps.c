// `draftscope bench --steps` end to end on the GPU, run as its own process (as a user runs it:
// a traced bench must enable CUPTI before any CUDA module loads, which an in-process call after
// another bench could not): a 3-layer slice of the 20b shapes (the fewest the synthetic draft
// takes: three distinct aux states) with --json, graphs off and on.
//   - every step kind at B = 1 and 2 reports a positive time, floor and GB/s;
//   - the weight bytes of a target step are recounted here from the checkpoint's tensor list
//     (spec gpt-oss.md §2: per-layer attention, norms, router; per expert gate_up and down
//     blocks, scales and biases; embedding rows, final norm, lm_head), which leaves the distinct
//     experts per layer as the one unknown: exactly 4 at one decode row (top-4 picks 4 distinct
//     experts), between 4 and min(4·rows, 32) otherwise, and a multiple of 1 / (layers · iters)
//     (the bytes decompose into whole experts per layer and step). That form holds for one
//     step's count as well: this test does not tell the mean over the timed steps from the last
//     step's count (its device run printed 13.2222 = 119 / 9 for the batch-1 verify, a mean);
//   - the same with --trace off,phases,kernels (the trace path replays the timed inputs too, with
//     its traces paused), whose decode B = 1 bytes equal the untraced run's.
// Both cases are large for the sanitizer pass (DS_GPU_TEST_SMALL: exit 77): the kernels they
// launch are each sanitized by their own op tests.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/device.h"
#include "gpu_ops_common.h"
#include "harness.h"

#define BIN DS_BINARY_DIR "/profiler/draftscope"
#define OUT_JSON "/tmp/ds_gpu_bench_steps.json"
#define OUT_ERR "/tmp/ds_gpu_bench_steps.err"
#define LAYERS 3
#define ITERS 3

// gpt-oss-20b (spec gpt-oss.md §1, §2).
enum { H = 2880, QD = 64 * 64, KD = 8 * 64, HEADS = 64, E = 32, TOPK = 4, I = 2880, V = 201088 };

// Bytes of one layer without its experts, of one expert, and of a step's other reads (T rows).
static double layer_bytes(void) {
    const double bf = 2;
    return bf * H                                 // input_layernorm
           + bf * ((double)QD * H + QD)           // q_proj weight, bias
           + 2 * bf * ((double)KD * H + KD)       // k_proj, v_proj
           + bf * ((double)H * QD + H)            // o_proj
           + bf * HEADS                           // sinks
           + bf * H                               // post_attention_layernorm
           + bf * ((double)E * H + E);            // router weight, bias
}
static double expert_bytes(void) {
    return (double)2 * I * (H / 32) * 16          // gate_up_proj_blocks [2I, H/32, 16]
           + (double)2 * I * (H / 32)             // gate_up_proj_scales
           + 2.0 * 2 * I                          // gate_up_proj_bias (bf16)
           + (double)H * (I / 32) * 16            // down_proj_blocks [H, I/32, 16]
           + (double)H * (I / 32)                 // down_proj_scales
           + 2.0 * H;                             // down_proj_bias
}
static double other_bytes(int rows) {
    return 2.0 * rows * H + 2.0 * H + 2.0 * (double)V * H; // embedding rows, norm, lm_head
}

// Runs the binary with `args`, stdout into OUT_JSON; returns the parsed JSON array (NULL when the
// run failed or printed no JSON; the error text is shown).
static json_t *bench(const char *args) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' bench --steps --shape 20b --layers %d --iters %d --json %s "
             "> %s 2> %s", BIN, LAYERS, ITERS, args, OUT_JSON, OUT_ERR);
    const int rc = system(cmd);
    if (rc != 0) {
        DS_FAILF("%s: exit status %d", cmd, rc);
        FILE *f = fopen(OUT_ERR, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            fprintf(stderr, "    %s", line);
        if (f) fclose(f);
        return NULL;
    }
    json_error_t e;
    json_t *j = json_load_file(OUT_JSON, 0, &e);
    if (!j || !json_is_array(j)) {
        DS_FAILF("%s: not a JSON array: %s (line %d)", OUT_JSON, e.text, e.line);
        json_decref(j);
        return NULL;
    }
    return j;
}

static double num(json_t *row, const char *key) {
    json_t *v = json_object_get(row, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

// Checks every row; returns the decode B = 1 weight bytes (NAN when absent).
static double check_rows(json_t *rows) {
    double decode1 = NAN;
    size_t i, seen = 0;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const char *step = json_string_value(json_object_get(r, "step"));
        const int B = (int)num(r, "batch"), n_rows = (int)num(r, "rows");
        if (!step) {
            DS_FAILF("row %zu has no step name", i);
            continue;
        }
        seen++;
        EXPECT(num(r, "ms") > 0);
        EXPECT(num(r, "floor_ms") > 0);
        EXPECT(num(r, "gb_s") > 0);
        EXPECT(num(r, "weight_bytes") > 0);
        if (strncmp(step, "target", 6)) continue;
        const double per_layer =
            (num(r, "weight_bytes") - other_bytes(n_rows) - LAYERS * layer_bytes()) /
            (LAYERS * expert_bytes());
        const double lo = TOPK, hi = fmin(TOPK * n_rows, E);
        // The count is a mean of LAYERS · ITERS integers: within 1e-6 of a multiple of that
        // (the bytes are exact in double; the division leaves ~1e-15 relative).
        const double q = per_layer * LAYERS * ITERS;
        printf("  %-24s B=%d rows=%d: %.4f distinct experts per layer\n", step, B, n_rows,
               per_layer);
        if (!(per_layer >= lo - 1e-9 && per_layer <= hi + 1e-9))
            DS_FAILF("%s B=%d: %.6f experts per layer outside [%g, %g]", step, B, per_layer, lo,
                     hi);
        EXPECT_NEAR(q, round(q), 1e-6);
        if (n_rows == 1) {
            EXPECT_NEAR(per_layer, TOPK, 1e-9);
            decode1 = num(r, "weight_bytes");
        }
    }
    // B = 1 and 2, graphs off (4 kinds) and on (3: extends always run eagerly, listed once).
    EXPECT_EQ_INT(seen, 14);
    return decode1;
}

static double g_decode1 = NAN;

static void steps_report_true_weight_bytes(void) {
    json_t *rows = bench("--batches 1,2 --graphs both");
    if (!rows) return;
    g_decode1 = check_rows(rows);
    EXPECT(!isnan(g_decode1));
    json_decref(rows);
}

static void traced_steps_report_the_same_bytes(void) {
    json_t *rows = bench("--batches 1,2 --graphs both --trace off,phases,kernels");
    if (!rows) return;
    const double d1 = check_rows(rows);
    if (!isnan(g_decode1)) EXPECT_NEAR(d1, g_decode1, 0.0);
    json_decref(rows);
}

int main(void) {
    G_REQUIRE_GPU();
    // No case of small shape to keep: skipped (77), not a pass that checked nothing.
    if (g_small_skip("bench_steps")) return 77;
    DS_RUN(steps_report_true_weight_bytes);
    DS_RUN(traced_steps_report_the_same_bytes);
    remove(OUT_JSON);
    remove(OUT_ERR);
    return ds_test_end();
}
