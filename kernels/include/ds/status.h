// ds/status.h: the one status enum for recoverable errors, shared by every module.
//
// Every public function that can fail for a reason outside the program (bad input, missing file,
// no GPU) returns enum ds_status. A failing call also records a one-line message through
// ds_error_set(); callers print it with ds_error_last(). Programming errors and failures of CUDA,
// CUPTI or HDF5 calls that must not happen are fatal instead: see ds/check.h.
#ifndef DS_STATUS_H
#define DS_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ds_status {
    DS_OK = 0,
    DS_ERR_ARG,         // invalid argument or command-line usage
    DS_ERR_IO,          // a file could not be opened, read, written or mapped
    DS_ERR_FORMAT,      // a file is malformed (bad JSON, bad header, truncated data)
    DS_ERR_MISMATCH,    // inputs are individually valid but do not fit together (shapes, vocab)
    DS_ERR_UNSUPPORTED, // a valid input this build does not handle
    DS_ERR_NOMEM,       // host or device allocation failed
    DS_ERR_NODEVICE,    // a GPU was required but none is usable
    DS_ERR_RANGE,       // a value is outside the allowed range (context too long, id out of vocab)
    DS_ERR_INTERRUPTED, // the user asked to stop (SIGINT)
    DS_STATUS_COUNT
};

// Short stable name of a status ("ok", "format", ...).
const char *ds_status_str(enum ds_status s);

// Records a formatted one-line message for the calling thread and returns s, so that a failing
// path reads `return ds_error_set(DS_ERR_FORMAT, "%s: header length %llu beyond file", ...)`.
enum ds_status ds_error_set(enum ds_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
enum ds_status ds_error_setv(enum ds_status s, const char *fmt, va_list ap);

// The calling thread's last message ("" if none). Valid until the next ds_error_set on the thread.
const char *ds_error_last(void);

// Clears the calling thread's message.
void ds_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif // DS_STATUS_H
