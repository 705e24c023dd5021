// ds/check.h: the fatal-error macro family.
//
// For conditions that mean a bug or a broken runtime, never bad user input (that returns a
// ds_status). Each macro evaluates its argument once, prints the expression, the library's
// message, function and file:line to stderr, runs the registered abort hooks (the profiler flushes
// its HDF5 file there) and aborts so a core or backtrace is left.
//
// The macros expand at the use site, so DS_CUDA_CHECK needs <cuda_runtime.h>, DS_CUPTI_CHECK
// <cupti.h> and DS_H5_CHECK nothing (HDF5 reports failure as a negative return) where they are used.
#ifndef DS_CHECK_H
#define DS_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif

// Prints "draftscope: fatal: <what> failed: <expr> (<detail>) at func file:line", runs the abort
// hooks once, then abort(). Never returns.
void ds_fatal(const char *what, const char *expr, const char *detail, const char *func,
              const char *file, int line) __attribute__((noreturn));

// Registers a hook run by ds_fatal before aborting (at most 8; later ones are ignored with a
// warning). Hooks must be async-signal-tolerant: they may run after a partial failure.
typedef void (*ds_abort_hook)(void *user);
void ds_abort_hook_add(ds_abort_hook hook, void *user);
void ds_abort_hook_remove(ds_abort_hook hook, void *user);
// Runs (and clears) every registered hook; used by ds_fatal and by signal handlers.
void ds_abort_hooks_run(void);

#define DS_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) ds_fatal("assertion", #cond, "", __func__, __FILE__, __LINE__);               \
    } while (0)

#ifdef DS_DEBUG_ASSERTIONS
#define DS_DEBUG_ASSERT(cond) DS_ASSERT(cond)
#else
#define DS_DEBUG_ASSERT(cond) ((void)0)
#endif

#define DS_CUDA_CHECK(expr)                                                                        \
    do {                                                                                           \
        cudaError_t ds_e_ = (expr);                                                                \
        if (ds_e_ != cudaSuccess)                                                                  \
            ds_fatal("CUDA call", #expr, cudaGetErrorString(ds_e_), __func__, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: launch-configuration errors now, execution errors at the next sync.
#define DS_KERNEL_CHECK() DS_CUDA_CHECK(cudaGetLastError())

#define DS_CUPTI_CHECK(expr)                                                                       \
    do {                                                                                           \
        CUptiResult ds_r_ = (expr);                                                                \
        if (ds_r_ != CUPTI_SUCCESS) {                                                              \
            const char *ds_m_ = "unknown CUPTI error";                                             \
            cuptiGetResultString(ds_r_, &ds_m_);                                                   \
            ds_fatal("CUPTI call", #expr, ds_m_, __func__, __FILE__, __LINE__);                    \
        }                                                                                          \
    } while (0)

#define DS_H5_CHECK(expr)                                                                          \
    do {                                                                                           \
        if ((long long)(expr) < 0)                                                                 \
            ds_fatal("HDF5 call", #expr, "negative return", __func__, __FILE__, __LINE__);         \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif // DS_CHECK_H
