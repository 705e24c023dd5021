// The summary's checks of a run file, run by the recorder on the file it opened for --resume, so
// that a file whose rows break the schema is refused before a new session is added to it.
#ifndef DS_PROFILER_SUMMARY_CHECK_H
#define DS_PROFILER_SUMMARY_CHECK_H

#include <hdf5.h>
#include <stdint.h>

#include "ds/status.h"

// Reads the open file as ds_summary_compute reads a path and returns its error (DS_ERR_FORMAT for
// rows that break the schema), or DS_OK. It also refuses a finished request whose /steps or
// /drafts rows do not add up to its /requests row (rows lost), which a summary reads as it is.
// The file stays open.
enum ds_status ds_summary_check_open(hid_t file, const char *path);

// Bytes between the end of the file at path and the end its superblock records (0: none, not
// known, or the file cannot be read); *size_out = its size. A file cut short, copied while the
// run wrote it, or left by a write that failed for want of space has some.
uint64_t ds_rec_bytes_missing(const char *path, uint64_t *size_out);

#endif
