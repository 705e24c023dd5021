// ds/cli.h: the draftscope subcommands. Each takes the arguments after its name (argv[0] is the
// subcommand name) and returns the process exit code: 0 success, 1 a problem with the input
// (printed as one line naming the file and the problem), 2 usage error.
#ifndef DS_CLI_H
#define DS_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/device.h"
#include "ds/status.h"
#include "ds/synthetic.h"
#include "ds/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

int ds_cmd_run(int argc, char **argv);
int ds_cmd_inspect(int argc, char **argv);
int ds_cmd_generate(int argc, char **argv);
int ds_cmd_tokenize(int argc, char **argv);
int ds_cmd_render(int argc, char **argv);
int ds_cmd_bench(int argc, char **argv);
int ds_cmd_summary(int argc, char **argv);

// bench --steps: the KV cache bytes a step's attention must read over n_seq sequences whose
// caches hold `cached` keys before the step's rows: every key on full_layers layers, at most
// window - 1 of them on window_layers sliding layers (the window holds the current row), K and
// V of kv_dim elements of elem_bytes each per key.
double ds_bench_kv_read_bytes(int n_seq, int cached, int full_layers, int window_layers,
                              int window, int kv_dim, int elem_bytes);
// bench --steps: the weight bytes a draft call reads: its weight arena (arena bytes), less the
// fc (fc_bytes) for a step, which is fed by the draft's own hidden state and runs no fc, plus
// the bf16 target embedding rows of its rows.
double ds_bench_draft_weight_bytes(double arena, double fc_bytes, bool step, int rows, int hidden);

// s is a whole decimal integer in [lo, hi] (an optional '-', then digits only: no blank, no '+',
// no trailing characters, no overflow): *out, true.
bool ds_cli_parse_ll(const char *s, long long lo, long long hi, long long *out);
// The value s of option opt as ds_cli_parse_ll takes it: *out, true. Otherwise false, with
// "OPT wants an integer in LO..HI" in msg[cap] for a usage error.
bool ds_cli_int_opt(const char *opt, const char *s, long long lo, long long hi, long long *out,
                    char *msg, size_t cap);
// s is a whole unsigned decimal integer (digits only) that fits 64 bits: *out, true.
bool ds_cli_parse_ull(const char *s, unsigned long long *out);
// An output path before any slow work: a regular file or nothing, in an existing writable
// directory, and never one of the command's inputs, through any link (the dataset, the tokenizer,
// a file directly in the target or draft directory, or the target itself when it is a file: a
// --synthetic-weights config; NULL arguments are skipped), --overwrite or
// not. in_place: an existing file is to be extended where it is (--resume), so only the file, not
// its directory, must be writable. *exists tells whether the file is there, for the caller's own
// rule (--overwrite, --resume). opt names the option in messages. Errors: DS_ERR_IO, one line
// naming the path.
enum ds_status ds_cli_check_output(const char *path, const char *opt, const char *dataset,
                                   const char *tokenizer, const char *target, const char *draft,
                                   bool in_place, bool *exists);
// s is a comma-separated list of 1 .. cap integers, each as ds_cli_parse_ll takes it in [lo, hi]:
// out[0 .. *n), 0. -1: an empty or bad entry; -2: more than cap entries (*n untouched either way).
int ds_cli_parse_list(const char *s, long long lo, long long hi, long long *out, int cap, int *n);
// --synthetic-weights ARG resolved before any work: 0 with *spec and *tc (and, when with_draft,
// the synthetic draft's config checked too); else the exit status with the message in
// ds_error_last(): 2 (usage) for a malformed spec, an unknown preset or a missing config, or a
// layer slice the target or draft cannot have; 1 for a config file that exists but does not parse.
int ds_cli_synthetic(const char *arg, bool with_draft, struct ds_synthetic_spec *spec,
                     struct ds_target_config *tc);
// --synthetic-weights ARG on the device `want` resolved to (info): the weights are generated on
// the GPU, so auto falling back to the cpu is DS_ERR_NODEVICE (one line that says why and names
// --device cpu, which asks for the reference backend explicitly); DS_OK otherwise.
enum ds_status ds_cli_synthetic_device(const char *arg, enum ds_device_kind want,
                                       const struct ds_device_info *info);
// The two models' measured memory plans (ds_gptoss_measure, ds_eagle3_measure) against the
// device's free bytes: DS_OK when they fit, else DS_ERR_NOMEM with one line naming the device,
// what the plan needs, what is free and how to shrink the KV caches. Only what the models will
// certainly allocate is counted (the step engine's buffers and CUDA's own come on top), so a
// refusal is never wrong; a plan within a few hundred MB of the limit may still fail at create.
struct ds_gptoss_memory;
enum ds_status ds_cli_plan_fits(const char *device, const struct ds_gptoss_memory *target,
                                const struct ds_gptoss_memory *draft, size_t free_bytes);
// A command that needs CUDA device `device` (bench): 0 when ds_cuda_device_check finds it (no
// context is made yet). Otherwise "draftscope CMD: <its message>" on stderr, the runtime's reason
// included, and 1, the exit status for a problem outside the command line.
int ds_cli_cuda_device(const char *cmd, int device);
// s is a list of token ids in [0, limit), separated by one comma or by spaces ("1,2", "1, 2",
// "1 2"): appended to *out. An empty entry ("1,,2", ",1", "1,"), an empty list, a sign or any
// other character is DS_ERR_ARG, an id out of range DS_ERR_RANGE; the message starts with opt.
enum ds_status ds_cli_parse_ids(const char *opt, const char *s, long long limit,
                                struct ds_token_vec *out);

// A JSON string of text that may not be UTF-8 (a path, a string cut at its field's size): the text
// itself when valid, else each invalid sequence replaced by one U+FFFD, much as Python's
// decode(errors="replace") reads it (exactly so for a character cut at the end). Never NULL
// (json_string's NULL for invalid UTF-8 made keys silently disappear from objects).
json_t *ds_cli_json_text(const char *t);

// A byte-count progress line on stderr ("LABEL: 42% (1.20 of 2.86 GB, 3.10 GB/s)"), for a
// ds_load_progress-style callback: redrawn on a terminal at most every 0.1 s, and only the final
// line when stderr is a log. Set label and t0 (ds_cli_now_s()) before the first call. With
// `unit` set it counts that unit instead ("LABEL: 42% (420 of 1000 tokens, 35.0 tokens/s)").
struct ds_cli_bytes_progress {
    const char *label;
    double t0, last;
    int open;         // a partial line is on the terminal (no newline yet)
    int ended;        // the final line is written: later calls print nothing
    const char *unit; // NULL: bytes, shown in GB; else counts of this unit
};
void ds_cli_bytes_progress(void *user, uint64_t done, uint64_t total);
// Ends a partial line (a load or scan that failed part way), so that the error starts a line.
void ds_cli_bytes_progress_end(struct ds_cli_bytes_progress *p);
// CLOCK_MONOTONIC in seconds.
double ds_cli_now_s(void);

#ifdef __cplusplus
}
#endif
#endif // DS_CLI_H
