// models/files.h (private to models/): opening the files the loaders read. Inline, so that the
// fuzz targets (tests/fuzz/build.sh) that compile single loader sources need nothing more.
#ifndef DS_MODELS_FILES_H
#define DS_MODELS_FILES_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ds/status.h"

// fopen(path, "rb") that refuses anything but a regular file ("PATH: not a regular file"): a
// directory opens fine on Linux and then reads as a garbage size or an empty document.
static inline enum ds_status ds_fopen_regular(const char *path, FILE **f_out) {
    *f_out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ds_error_set(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    enum ds_status s = DS_OK;
    if (fstat(fileno(f), &sb) != 0)
        s = ds_error_set(DS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        s = ds_error_set(DS_ERR_IO, "%s: not a regular file", path);
    if (s) {
        fclose(f);
        return s;
    }
    *f_out = f;
    return DS_OK;
}

#endif
