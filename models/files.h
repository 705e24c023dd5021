// models/files.h (private to models/): opening the files the loaders read. Inline, so that the
// fuzz targets (tests/fuzz/build.sh) that compile single loader sources need nothing more.
#ifndef DS_MODELS_FILES_H
#define DS_MODELS_FILES_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/status.h"

// fopen(path, "rb") that refuses anything but a regular file ("PATH: not a regular file"): a
// directory opens fine on Linux and then reads as a garbage size or an empty document, and a FIFO
// would block the open until a writer came. The open is non-blocking for that reason; the stream
// is made blocking again once the file is known to be regular.
static inline enum ds_status ds_fopen_regular(const char *path, FILE **f_out) {
    *f_out = NULL;
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return ds_error_set(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    enum ds_status s = DS_OK;
    FILE *f = NULL;
    if (fstat(fd, &sb) != 0)
        s = ds_error_set(DS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        s = ds_error_set(DS_ERR_IO, "%s: not a regular file", path);
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb")))
        s = ds_error_set(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (s) {
        close(fd);
        return s;
    }
    *f_out = f;
    return DS_OK;
}

#endif
