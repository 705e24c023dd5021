// draftscope: the command-line entry point. Dispatches to one subcommand per file (cmd_*.c).
#include "ds/cli.h"
#include "ds/record.h"

#include <stdio.h>
#include <string.h>

struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct subcommand subcommands[] = {
    {"run", ds_cmd_run,
     "replay conversations with target + draft at chosen batch sizes and record every draft"},
    {"inspect", ds_cmd_inspect,
     "check a target checkpoint (and a draft) and print what they contain"},
    {"generate", ds_cmd_generate,
     "plain target decoding without a draft (ids, text, optional logits file)"},
    {"tokenize", ds_cmd_tokenize, "show the token ids of a text (and decode ids back to text)"},
    {"render", ds_cmd_render,
     "show a dataset conversation rendered in the harmony format, with its ids"},
    {"summary", ds_cmd_summary,
     "print the acceptance metrics of a run file, per batch size (also while it is written)"},
    {"bench", ds_cmd_bench, "time the CUDA ops at the real gpt-oss shapes (needs a GPU)"},
};

static void usage(FILE *f) {
    fprintf(f, "draftscope %s (%s): acceptance-rate profiler for EAGLE-3 drafts of gpt-oss\n\n"
               "usage: draftscope <command> [options]   (draftscope <command> --help for more)\n\n"
               "commands:\n",
            DS_VERSION, DS_GIT_COMMIT);
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(f, "  %-10s %s\n", "version", "print the version and the git commit");
}

int main(int argc, char **argv) {
    ds_recorder_library_init();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("draftscope %s (%s)\n", DS_VERSION, DS_GIT_COMMIT);
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(cmd, subcommands[i].name)) return subcommands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "draftscope: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
