// tests/run_attr.h: reads a run file's root attribute options_json (the tests that check what
// `draftscope run` recorded there, e.g. the activation dtype).
#ifndef DS_TEST_RUN_ATTR_H
#define DS_TEST_RUN_ATTR_H

#include <hdf5.h>
#include <stdio.h>

// The root attribute options_json (a variable-length string) into buf; "" when unreadable.
static inline void ru_read_options(const char *path, char *buf, size_t cap) {
    buf[0] = 0;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return;
    hid_t a = H5Aopen(f, "options_json", H5P_DEFAULT);
    if (a >= 0) {
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, H5T_VARIABLE);
        H5Tset_cset(t, H5T_CSET_UTF8);
        char *s = NULL;
        if (H5Aread(a, t, &s) >= 0 && s) {
            snprintf(buf, cap, "%s", s);
            H5free_memory(s);
        }
        H5Tclose(t);
        H5Aclose(a);
    }
    H5Fclose(f);
}

#endif // DS_TEST_RUN_ATTR_H
