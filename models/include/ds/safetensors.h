// ds/safetensors.h: memory-mapped safetensors checkpoints, one file or a sharded set.
//
// File layout: u64 little-endian header length N, N bytes of JSON header
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"k": "v", ...}}
// then the data region; offsets are relative to the end of the header.
//
// Opening validates every entry (known dtype, shape x dtype size == end - begin, range inside the
// data region, no two ranges overlapping, header length sane, UTF-8 JSON) and maps the files; it
// never reads tensor data. A sharded set is opened through model.safetensors.index.json: every
// tensor of the weight_map must be found in the shard it names and nowhere else.
//
// Errors are one line naming the file and the problem, in ds_error_last().
#ifndef DS_SAFETENSORS_H
#define DS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ds_dtype {
    DS_DTYPE_BOOL = 0,
    DS_DTYPE_U8,
    DS_DTYPE_I8,
    DS_DTYPE_F8_E4M3,
    DS_DTYPE_F8_E5M2,
    DS_DTYPE_U16,
    DS_DTYPE_I16,
    DS_DTYPE_F16,
    DS_DTYPE_BF16,
    DS_DTYPE_U32,
    DS_DTYPE_I32,
    DS_DTYPE_F32,
    DS_DTYPE_U64,
    DS_DTYPE_I64,
    DS_DTYPE_F64,
    DS_DTYPE_COUNT
};

// Bytes per element; name as spelled in safetensors headers ("BF16"); parse from that name
// (DS_ERR_FORMAT for an unknown name).
size_t ds_dtype_size(enum ds_dtype t);
const char *ds_dtype_name(enum ds_dtype t);
enum ds_status ds_dtype_parse(const char *s, enum ds_dtype *out);

#define DS_MAX_DIMS 8

struct ds_tensor_info {
    const char *name;            // tensor name, owned by the set
    enum ds_dtype dtype;         //
    int ndim;                    // 0 for a scalar
    int64_t shape[DS_MAX_DIMS];  // dims, outermost first
    uint64_t numel;              // product of shape (1 for a scalar)
    uint64_t nbytes;             // numel * dtype size == end - begin
    int file;                    // index of the file holding it (ds_safetensors_file_path)
    uint64_t file_offset;        // absolute byte offset of the data in that file
    const void *data;            // pointer into the read-only mapping; pages are not touched here
};

typedef struct ds_safetensors ds_safetensors_t;

// Opens one .safetensors file. *out is NULL on failure.
enum ds_status ds_safetensors_open_file(const char *path, ds_safetensors_t **out);

// Opens a checkpoint directory: model.safetensors.index.json if present (sharded), else
// model.safetensors, else the directory's only *.safetensors file. *out is NULL on failure.
enum ds_status ds_safetensors_open_dir(const char *dir, ds_safetensors_t **out);

// Unmaps and frees; NULL is a no-op.
void ds_safetensors_close(ds_safetensors_t *st);

size_t ds_safetensors_count(const ds_safetensors_t *st);
// Tensors in a stable order (sorted by name); NULL when i is out of range.
const struct ds_tensor_info *ds_safetensors_at(const ds_safetensors_t *st, size_t i);
// Lookup by exact name; NULL when absent.
const struct ds_tensor_info *ds_safetensors_find(const ds_safetensors_t *st, const char *name);

int ds_safetensors_file_count(const ds_safetensors_t *st);
const char *ds_safetensors_file_path(const ds_safetensors_t *st, int file);
// Sum of nbytes over all tensors (the data, not the headers).
uint64_t ds_safetensors_tensor_bytes(const ds_safetensors_t *st);
// A "__metadata__" string value of the (first) file, or NULL.
const char *ds_safetensors_metadata(const ds_safetensors_t *st, const char *key);

// A name read from a file, fit for a one-line message: control bytes become '?' and a name of
// DS_SHOWN_CAP - 4 bytes or more is cut and ends in "...". Writes buf (DS_SHOWN_CAP bytes) and
// returns it.
#define DS_SHOWN_CAP 96
const char *ds_safetensors_shown(const char *name, char *buf);

// Validates a header in memory: `json`/`len` is the JSON text, `data_len` the size of the data
// region that follows it, `label` the file name used in messages. This is what open_file runs
// after mapping; it exists separately for tests and the fuzz target. Returns the number of
// tensors in *count_out on success.
enum ds_status ds_safetensors_check_header(const char *json, size_t len, uint64_t data_len,
                                           const char *label, size_t *count_out);

// Validates a whole file image in memory: the u64 length prefix and its bounds (at least 2, at
// most 100 MiB, inside `len`), then the header as ds_safetensors_check_header does with the rest
// of the bytes as the data region. `label` names the file in messages. This is open_file without
// the mapping, for the fuzz target. Returns the number of tensors in *count_out on success.
enum ds_status ds_safetensors_check_bytes(const void *bytes, size_t len, const char *label,
                                          size_t *count_out);

#ifdef __cplusplus
}
#endif
#endif // DS_SAFETENSORS_H
