// `draftscope run --activations` on the CPU reference (golden tiny pair, in process): auto and
// f32 run and record "activations":"f32" in options_json (the CPU's own dtype); bf16 with
// --device cpu is a usage error (exit 2, one line naming the flag) and writes no file; an unknown
// value is a usage error. The CUDA side (f32 records equal to the CPU's) is gpu_replay_parity.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "run_attr.h"
#include "run_util.h"

int ds_cmd_run(int argc, char **argv);

#define DIR DS_BINARY_DIR "/test_run_activations"
#define DATA DIR "/conv.jsonl"
#define OUT DIR "/run.h5"

static int run_act(const char *act, char *err, size_t cap) {
    char *argv[] = {"run", "--target", RU_TARGET, "--draft", RU_DRAFT, "--tokenizer",
                    RU_TOKENIZER, "--dataset", DATA, "--out", OUT, "--quiet", "--overwrite",
                    "--max-new-tokens", "4", "--device", "cpu", "--activations", (char *)act,
                    NULL};
    return ru_capture(ds_cmd_run, (int)(sizeof argv / sizeof *argv) - 1, argv, err, cap);
}

static void test_cpu_dtypes(void) {
    const char *acts[] = {"auto", "f32"};
    char err[4096], opt[4096];
    for (size_t i = 0; i < 2; i++) {
        unlink(OUT);
        int rc = run_act(acts[i], err, sizeof err);
        if (rc) printf("  --activations %s: %s", acts[i], err);
        EXPECT_EQ_INT(rc, 0);
        ru_read_options(OUT, opt, sizeof opt);
        if (!strstr(opt, "\"activations\":\"f32\""))
            DS_FAILF("--activations %s: options_json lacks f32: %s", acts[i], opt);
    }
}

static void test_refused(void) {
    char err[4096];
    unlink(OUT);
    EXPECT_EQ_INT(run_act("bf16", err, sizeof err), 2);
    EXPECT(strstr(err, "--activations bf16") != NULL);
    EXPECT(strstr(err, "cuda") != NULL);
    EXPECT(access(OUT, F_OK) != 0);
    EXPECT_EQ_INT(run_act("fp16", err, sizeof err), 2);
    EXPECT(strstr(err, "--activations wants auto, f32 or bf16: fp16") != NULL);
    EXPECT(access(OUT, F_OK) != 0);
}

int main(void) {
    mkdir(DIR, 0755);
    if (!ru_write(DATA, "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": "
                        "\"hello world\"}]}\n"))
        DS_SKIP("cannot write %s", DATA);
    DS_RUN(test_cpu_dtypes);
    DS_RUN(test_refused);
    unlink(OUT);
    return ds_test_end();
}
