// tests/run_attr.h: reads a run file's string attribute (target_path, options_json, ...) through
// the plain HDF5 C API, for the tests of `draftscope run --synthetic-weights` (CPU and GPU).
#ifndef DS_TEST_RUN_ATTR_H
#define DS_TEST_RUN_ATTR_H

#include <hdf5.h>
#include <stdint.h>
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

// Overwrites 8 bytes inside the root group's object header, whose address is at byte 36 of the
// version 2/3 superblock the writer makes: the file still opens, but reading its attributes fails
// HDF5's checksum. Returns 0, or -1 when the file could not be damaged so.
static inline int ru_damage_root_header(const char *path) {
    FILE *f = fopen(path, "r+b");
    unsigned char sb[44];
    int ok = f && fread(sb, 1, sizeof sb, f) == sizeof sb && (sb[8] == 2 || sb[8] == 3);
    uint64_t root = 0;
    for (int i = 7; ok && i >= 0; i--)
        root = root << 8 | sb[36 + i];
    ok = ok && fseek(f, (long)root + 12, SEEK_SET) == 0 &&
         fwrite("\xa5\xa5\xa5\xa5\xa5\xa5\xa5\xa5", 1, 8, f) == 8;
    if (f && fclose(f)) ok = 0;
    return ok ? 0 : -1;
}

#endif // DS_TEST_RUN_ATTR_H
