// tests/run_attr.h: reads a run file's string attribute (target_path, options_json, ...) through
// the plain HDF5 C API, for the tests of `draftscope run --synthetic-weights` (CPU and GPU).
#ifndef DS_TEST_RUN_ATTR_H
#define DS_TEST_RUN_ATTR_H

#include <hdf5.h>
#include <stdio.h>

// buf gets the attribute's text (cut to n - 1 bytes), or "" when the file or attribute is missing.
static inline void ru_read_attr_str(const char *path, const char *name, char *buf, size_t n) {
    buf[0] = 0;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
    if (f < 0) return;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8); // HDF5 does not convert between character sets
    char *p = NULL;
    if (a >= 0 && H5Aread(a, t, &p) >= 0 && p) {
        snprintf(buf, n, "%s", p);
        H5free_memory(p);
    }
    H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    H5Fclose(f);
}

// The root attribute options_json (what `draftscope run` recorded of its options).
static inline void ru_read_options(const char *path, char *buf, size_t n) {
    ru_read_attr_str(path, "options_json", buf, n);
}

#endif // DS_TEST_RUN_ATTR_H
