// The trace tests' probe for the sanitizer pass. compute-sanitizer holds CUPTI itself, so a
// kernels-level trace cannot exist under it; in small mode (gpu_ops_common.h) those cases are then
// skipped rather than failed.
#ifndef DS_TESTS_CUPTI_HELD_H
#define DS_TESTS_CUPTI_HELD_H
#include <stdio.h>
#include <string.h>

#include "ds/status.h"
#include "ds/trace.h"
#include "gpu_ops_common.h" // g_small_only

// Small mode only: 1 (after one line saying so) when a kernels-level trace cannot exist because
// another tool holds CUPTI, as compute-sanitizer does. Any other failure, and every failure
// outside small mode, is left to the cases, where it fails.
static inline int g_cupti_held_by_tool(void) {
    if (!g_small_only()) return 0;
    ds_trace_t *t = NULL;
    enum ds_status st = ds_trace_create(DS_REC_TRACE_KERNELS, NULL, NULL, &t);
    ds_trace_release(t);
    int held = st == DS_ERR_UNSUPPORTED && strstr(ds_error_last(), "MULTIPLE_SUBSCRIBERS");
    ds_error_clear();
    if (held)
        printf("kernels-level cases skipped: CUPTI is held by another tool (a sanitizer or "
               "profiler); small mode only\n");
    fflush(stdout);
    return held;
}
#endif
