#include "h5attr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The attribute when it exists and holds exactly one element, else H5I_INVALID_HID. A simple
// extent of several elements would make H5Aread write past a one-value buffer.
static hid_t open_one(hid_t loc, const char *name) {
    if (H5Aexists(loc, name) <= 0) return H5I_INVALID_HID;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) return H5I_INVALID_HID;
    hid_t sp = H5Aget_space(a);
    const hssize_t npts = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    if (sp >= 0) H5Sclose(sp);
    if (npts != 1) {
        H5Aclose(a);
        return H5I_INVALID_HID;
    }
    return a;
}

char *ds_h5_attr_strdup(hid_t loc, const char *name) {
    hid_t a = open_one(loc, name), ft = H5I_INVALID_HID, mt = H5I_INVALID_HID;
    char *out = NULL;
    if (a < 0 || (ft = H5Aget_type(a)) < 0 || H5Tget_class(ft) != H5T_STRING) goto cleanup;
    if (H5Tis_variable_str(ft) > 0) {
        char *p = NULL;
        if ((mt = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 ||
            H5Tset_cset(mt, H5Tget_cset(ft)) < 0 || H5Aread(a, mt, &p) < 0)
            goto cleanup;
        out = strdup(p ? p : "");
        H5free_memory(p);
    } else {
        const size_t size = H5Tget_size(ft);
        if (size == 0) goto cleanup;
        out = calloc(1, size + 1); // + 1: a fixed-length string need not end in NUL
        if (out && H5Aread(a, ft, out) < 0) {
            free(out);
            out = NULL;
        }
    }
cleanup:
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    if (a >= 0) H5Aclose(a);
    return out;
}

int ds_h5_attr_str(hid_t loc, const char *name, char *buf, size_t n) {
    buf[0] = '\0';
    char *p = ds_h5_attr_strdup(loc, name);
    if (!p) return -1;
    snprintf(buf, n, "%s", p);
    free(p);
    return 0;
}

int ds_h5_attr_num(hid_t loc, const char *name, hid_t native, void *v) {
    hid_t a = open_one(loc, name);
    if (a < 0) return -1;
    // HDF5 converts a float to an integer type by truncation: k = 3.5 would read as 3.
    hid_t ft = H5Aget_type(a);
    const int lossy = ft < 0 || (H5Tget_class(native) == H5T_INTEGER &&
                                 H5Tget_class(ft) != H5T_INTEGER);
    if (ft >= 0) H5Tclose(ft);
    const herr_t e = lossy ? -1 : H5Aread(a, native, v);
    H5Aclose(a);
    return e < 0 ? -1 : 0;
}
