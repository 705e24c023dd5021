// tests/harness.h: the small test harness every C test uses.
//
// One executable per test file; main() calls DS_RUN(fn) for each case and returns ds_test_end().
// A case fails when any EXPECT in it fails; every failure prints file:line and both values. The
// last line is "N passed, N failed" for the case count. Exit 0 = all passed, 1 = a failure,
// 77 = skipped (ctest SKIP_RETURN_CODE), e.g. a GPU test on a machine without a GPU.
#ifndef DS_TEST_HARNESS_H
#define DS_TEST_HARNESS_H

#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ds/status.h"

static int ds_t_cases_passed, ds_t_cases_failed, ds_t_case_failures;
static const char *ds_t_case_name = "";

#define DS_FAILF(...)                                                                              \
    do {                                                                                           \
        ds_t_case_failures++;                                                                      \
        fprintf(stderr, "  FAIL %s (%s:%d): ", ds_t_case_name, __FILE__, __LINE__);               \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
    } while (0)

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) DS_FAILF("expected %s", #cond);                                               \
    } while (0)

#define EXPECT_EQ_INT(a, b)                                                                        \
    do {                                                                                           \
        long long ds_a_ = (long long)(a), ds_b_ = (long long)(b);                                  \
        if (ds_a_ != ds_b_) DS_FAILF("%s == %s: %lld != %lld", #a, #b, ds_a_, ds_b_);              \
    } while (0)

#define EXPECT_EQ_STR(a, b)                                                                        \
    do {                                                                                           \
        const char *ds_a_ = (a), *ds_b_ = (b);                                                     \
        if (!ds_a_ || !ds_b_ || strcmp(ds_a_, ds_b_))                                              \
            DS_FAILF("%s == %s: \"%s\" != \"%s\"", #a, #b, ds_a_ ? ds_a_ : "(null)",               \
                     ds_b_ ? ds_b_ : "(null)");                                                    \
    } while (0)

// |a - b| <= tol; NaN never passes.
#define EXPECT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double ds_a_ = (double)(a), ds_b_ = (double)(b);                                           \
        if (!(fabs(ds_a_ - ds_b_) <= (tol)))                                                       \
            DS_FAILF("%s ~ %s: %.10g vs %.10g (tol %g)", #a, #b, ds_a_, ds_b_, (double)(tol));     \
    } while (0)

// Expects a ds_status; on mismatch prints the recorded error message too.
#define EXPECT_STATUS(expr, want)                                                                  \
    do {                                                                                           \
        enum ds_status ds_s_ = (expr);                                                             \
        if (ds_s_ != (want))                                                                       \
            DS_FAILF("%s: status %s, wanted %s (%s)", #expr, ds_status_str(ds_s_),                 \
                     ds_status_str(want), ds_error_last());                                        \
    } while (0)

#define EXPECT_OK(expr) EXPECT_STATUS(expr, DS_OK)

// The recorded error message contains `needle` (errors must name the file and the problem).
#define EXPECT_ERROR_HAS(needle)                                                                   \
    do {                                                                                           \
        if (!strstr(ds_error_last(), (needle)))                                                    \
            DS_FAILF("error \"%s\" lacks \"%s\"", ds_error_last(), (needle));                      \
    } while (0)

#define DS_RUN(fn)                                                                                 \
    do {                                                                                           \
        ds_t_case_name = #fn;                                                                      \
        ds_t_case_failures = 0;                                                                    \
        ds_error_clear();                                                                          \
        fn();                                                                                      \
        if (ds_t_case_failures) {                                                                  \
            ds_t_cases_failed++;                                                                   \
            fprintf(stderr, "not ok %s\n", #fn);                                                   \
        } else {                                                                                   \
            ds_t_cases_passed++;                                                                   \
            printf("ok %s\n", #fn);                                                                \
        }                                                                                          \
    } while (0)

// Sends file descriptor fd (1 stdout, 2 stderr) to the file at path (created or truncated) until
// ds_t_restore(fd, the returned descriptor); the stdio buffers are flushed either side.
static inline int ds_t_redirect(int fd, const char *path) {
    fflush(stdout), fflush(stderr);
    const int saved = dup(fd), f = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(f, fd);
    close(f);
    return saved;
}
static inline void ds_t_restore(int fd, int saved) {
    fflush(stdout), fflush(stderr);
    dup2(saved, fd);
    close(saved);
}

// Copies src to dst with `n` bytes at `off` set to the bf16 NaN 0x7fc0 (n = 0: a plain copy): a
// checkpoint with a NaN tensor (or a row of one), for the non-finite paths. 1 on success.
static inline int ds_t_copy_with_nan(const char *src, const char *dst, uint64_t off, uint64_t n) {
    FILE *f = fopen(src, "rb");
    if (!f) return 0;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char *b = len >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)len + 1) : NULL;
    int ok = b && fread(b, 1, (size_t)len, f) == (size_t)len && off + n <= (uint64_t)len;
    fclose(f);
    for (uint64_t i = 0; ok && i + 1 < n; i += 2)
        b[off + i] = 0xc0, b[off + i + 1] = 0x7f; // little-endian 0x7fc0
    f = ok ? fopen(dst, "wb") : NULL;
    ok = f && fwrite(b, 1, (size_t)len, f) == (size_t)len;
    if (f) ok = fclose(f) == 0 && ok;
    free(b);
    return ok;
}

// Makes a fresh directory `dir` under `base` holding an empty directory `name` (path in `sub`):
// a directory where a loader expects a file. 0 when it cannot; remove with rmdir(sub), rmdir(dir).
static inline int ds_t_dir_in_place_of(const char *base, const char *name, char *dir, char *sub,
                                       size_t cap) {
    if (snprintf(dir, cap, "%s/ds_t_XXXXXX", base) >= (int)cap || !mkdtemp(dir)) return 0;
    return snprintf(sub, cap, "%s/%s", dir, name) < (int)cap && mkdir(sub, 0700) == 0;
}

// Runs fn in a forked child that ends with _exit, its failures counted in the current case. For
// paths on which a library leaks by itself, out of the sanitizer build's leak check: HDF5 1.10
// leaks the object header that fails its checksum (an open, H5Aexists and a close of such a file
// leak 424 bytes with no call of ours in between).
static inline void ds_t_in_child(void (*fn)(void)) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        ds_t_case_failures = 0;
        fn();
        fflush(stdout);
        fflush(stderr);
        _exit(ds_t_case_failures ? 1 : 0);
    }
    int status = -1;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        DS_FAILF("the case's child failed (wait status %d)", status);
}

static inline int ds_test_end(void) {
    printf("%d passed, %d failed\n", ds_t_cases_passed, ds_t_cases_failed);
    return ds_t_cases_failed ? 1 : 0;
}

// Ends the test program as skipped (77), saying why.
#define DS_SKIP(...)                                                                               \
    do {                                                                                           \
        printf("skipped: ");                                                                       \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        exit(77);                                                                                  \
    } while (0)

#endif // DS_TEST_HARNESS_H
