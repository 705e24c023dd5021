// Status names, per-thread error messages and the fatal path (ds/status.h, ds/check.h).
#include "ds/check.h"
#include "ds/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[DS_STATUS_COUNT] = {
    "ok", "argument", "io", "format", "mismatch", "unsupported", "nomem", "nodevice", "range",
    "interrupted",
};

const char *ds_status_str(enum ds_status s) {
    if ((int)s < 0 || s >= DS_STATUS_COUNT) return "unknown";
    return status_names[s];
}

static _Thread_local char last_error[1024];

enum ds_status ds_error_setv(enum ds_status s, const char *fmt, va_list ap) {
    // Formatted aside first: callers prefix the last message with ds_error_last() as an
    // argument, and vsnprintf into the buffer it reads from garbles it.
    char text[sizeof last_error];
    vsnprintf(text, sizeof text, fmt, ap);
    memcpy(last_error, text, sizeof last_error);
    return s;
}

enum ds_status ds_error_set(enum ds_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ds_error_setv(s, fmt, ap);
    va_end(ap);
    return s;
}

const char *ds_error_last(void) {
    return last_error;
}

void ds_error_clear(void) {
    last_error[0] = '\0';
}

#define MAX_HOOKS 8
static struct {
    ds_abort_hook fn;
    void *user;
} hooks[MAX_HOOKS];

void ds_abort_hook_add(ds_abort_hook hook, void *user) {
    for (int i = 0; i < MAX_HOOKS; i++) {
        if (!hooks[i].fn) {
            hooks[i].fn = hook;
            hooks[i].user = user;
            return;
        }
    }
    fprintf(stderr, "draftscope: warning: more than %d abort hooks; one ignored\n", MAX_HOOKS);
}

void ds_abort_hook_remove(ds_abort_hook hook, void *user) {
    for (int i = 0; i < MAX_HOOKS; i++)
        if (hooks[i].fn == hook && hooks[i].user == user) hooks[i].fn = NULL;
}

void ds_abort_hooks_run(void) {
    // Clear each hook before running it so a hook that fails fatally cannot recurse.
    for (int i = 0; i < MAX_HOOKS; i++) {
        ds_abort_hook fn = hooks[i].fn;
        hooks[i].fn = NULL;
        if (fn) fn(hooks[i].user);
    }
}

void ds_fatal(const char *what, const char *expr, const char *detail, const char *func,
              const char *file, int line) {
    fprintf(stderr, "draftscope: fatal: %s failed: %s%s%s%s in %s at %s:%d\n", what, expr,
            detail && *detail ? " (" : "", detail ? detail : "", detail && *detail ? ")" : "",
            func, file, line);
    fflush(stderr);
    ds_abort_hooks_run();
    abort();
}
