// tests/run_util.h: helpers shared by the replay and run tests: fixture paths, writing a small
// dataset, reading a run file's tables, running `draftscope run` in process with stderr captured.
#ifndef DS_TEST_RUN_UTIL_H
#define DS_TEST_RUN_UTIL_H

#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds/record.h"

// The golden pair: its draft agrees with the target sometimes (tests/ref/eagle3_ref.py), and
// the tiny hand-written tokenizer (ids < 308, inside the pair's 512-token vocabulary).
#define RU_TARGET DS_SOURCE_DIR "/tests/fixtures/golden/tiny-gptoss-a"
#define RU_DRAFT DS_SOURCE_DIR "/tests/fixtures/golden/tiny-eagle3-a-lmsys"
#define RU_TOKENIZER DS_SOURCE_DIR "/tests/data/tiny_tokenizer.json"

static inline int ru_write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

// The whole file, malloc'd (NULL and *n = 0 when it cannot be read).
static inline unsigned char *ru_slurp(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        if (len >= 0 && (b = malloc((size_t)len + 1)) && fseek(f, 0, SEEK_SET) == 0 &&
            fread(b, 1, (size_t)len, f) == (size_t)len)
            *n = (size_t)len;
    }
    fclose(f);
    return b;
}

// Copies a file (a fixture into a scratch directory, so that a test that fails cannot harm it).
static inline int ru_copy(const char *from, const char *to) {
    size_t n = 0;
    unsigned char *b = ru_slurp(from, &n);
    FILE *f = b ? fopen(to, "wb") : NULL;
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f) ok &= fclose(f) == 0;
    free(b);
    return ok;
}

// Reads a whole table into a malloc'd array of `size`-byte records with the file's own type as
// the memory type (the file keeps the C struct's native layout; test_record checks that).
static inline void *ru_read_table(const char *path, const char *name, size_t size, size_t *n_out) {
    *n_out = 0;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
    if (f < 0) return NULL;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    void *buf = NULL;
    if (d >= 0) {
        hid_t t = H5Dget_type(d), s = H5Dget_space(d);
        hsize_t n = 0;
        H5Sget_simple_extent_dims(s, &n, NULL);
        buf = calloc(n ? n : 1, size);
        if (H5Tget_size(t) != size || H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
            free(buf);
            buf = NULL;
        }
        *n_out = (size_t)n;
        H5Sclose(s);
        H5Tclose(t);
        H5Dclose(d);
    }
    H5Fclose(f);
    return buf;
}

// Runs fn(argc, argv) with stdout and stderr sent to files; the stderr text (up to cap bytes) is
// returned in err. The exit code is returned.
static inline int ru_capture(int (*fn)(int, char **), int argc, char **argv, char *err,
                             size_t cap) {
    fflush(stdout);
    fflush(stderr);
    char epath[] = "/tmp/ds_run_errXXXXXX", opath[] = "/tmp/ds_run_outXXXXXX";
    int efd = mkstemp(epath), ofd = mkstemp(opath);
    int save_e = dup(2), save_o = dup(1);
    dup2(efd, 2);
    dup2(ofd, 1);
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(save_e, 2);
    dup2(save_o, 1);
    close(save_e);
    close(save_o);
    lseek(efd, 0, SEEK_SET);
    ssize_t n = read(efd, err, cap - 1);
    err[n > 0 ? n : 0] = 0;
    close(efd);
    close(ofd);
    unlink(epath);
    unlink(opath);
    return rc;
}

#endif // DS_TEST_RUN_UTIL_H
