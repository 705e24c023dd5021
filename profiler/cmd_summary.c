// draftscope summary: the acceptance metrics of a run file (docs/metrics.md), as text or JSON.
//
// Reads the file read-only (SWMR), so it works on a run still being written and on the file of a
// crashed writer, and never changes it. The metrics come from ds/summary.h; the Python package
// computes the same numbers from the same rows (a test compares the two).
#include "ds/cli.h"
#include "ds/summary.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(
        f, "usage: draftscope summary RUN.h5 [--json] [--by KEY]\n"
           "\n"
           "Prints the acceptance metrics of a run file, one block per group:\n"
           "  requests and verify steps; mean acceptance length (vLLM/EAGLE tau, bonus token\n"
           "  included: 1 + accepted/steps) beside SGLang's accept length (completion\n"
           "  tokens/verify steps); draft acceptance rate (accepted/drafted); per position the\n"
           "  joint (vLLM: P(at least i accepted)) and conditional (EAGLE n-alpha) acceptance and\n"
           "  the mean expected acceptance sum_v min(p_v, q_v); the accepted-count histogram;\n"
           "  acceptance by harmony channel. docs/metrics.md defines each figure.\n"
           "Rows of requests that have not finished (a live or crashed run) are left out and\n"
           "counted. The file is opened read-only and never modified.\n"
           "\n"
           "options:\n"
           "  -b, --by KEY   group by: batch (the sweep's concurrency, default), turn, category,\n"
           "                 step-batch (sequences in the step), position, channel\n"
           "  -j, --json     print one JSON object (layout in docs/metrics.md)\n"
           "  -h, --help     this text\n"
           "\n"
           "exit status: 0 success, 1 the file could not be read (one line says why), 2 usage\n");
}

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "draftscope summary: %s%s%s\n", what, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "usage: draftscope summary RUN.h5 [--json] [--by KEY]   (--help for more)\n");
    return 2;
}

int ds_cmd_summary(int argc, char **argv) {
    static const struct option long_opts[] = {
        {"by", required_argument, NULL, 'b'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    enum ds_summary_by by = DS_SUMMARY_BY_BATCH;
    int as_json = 0;
    optind = 0; // full re-initialisation: the command may run more than once in one process
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "b:jh", long_opts, NULL)) != -1;) {
        switch (c) {
        case 'b':
            if (ds_summary_by_parse(optarg, &by)) return usage_error(ds_error_last(), NULL);
            break;
        case 'j':
            as_json = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return usage_error("unknown option or missing value", argv[optind - 1]);
        }
    }
    if (optind >= argc) return usage_error("no run file given", NULL);
    if (optind + 1 < argc) return usage_error("unexpected argument", argv[optind + 1]);

    struct ds_summary *s = NULL;
    if (ds_summary_compute(argv[optind], by, &s)) {
        fprintf(stderr, "draftscope summary: %s\n", ds_error_last());
        return 1;
    }
    enum ds_status st =
        as_json ? ds_summary_print_json(s, stdout) : ds_summary_print_text(s, stdout);
    ds_summary_free(s);
    if (st) {
        fprintf(stderr, "draftscope summary: %s\n", ds_error_last());
        return 1;
    }
    return 0;
}
