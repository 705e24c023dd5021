// Element types of safetensors files: sizes and header spellings (ds/safetensors.h).
#include "ds/safetensors.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[DS_DTYPE_COUNT] = {
    [DS_DTYPE_BOOL] = {"BOOL", 1},   [DS_DTYPE_U8] = {"U8", 1},
    [DS_DTYPE_I8] = {"I8", 1},       [DS_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [DS_DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [DS_DTYPE_U16] = {"U16", 2},
    [DS_DTYPE_I16] = {"I16", 2},     [DS_DTYPE_F16] = {"F16", 2},
    [DS_DTYPE_BF16] = {"BF16", 2},   [DS_DTYPE_U32] = {"U32", 4},
    [DS_DTYPE_I32] = {"I32", 4},     [DS_DTYPE_F32] = {"F32", 4},
    [DS_DTYPE_U64] = {"U64", 8},     [DS_DTYPE_I64] = {"I64", 8},
    [DS_DTYPE_F64] = {"F64", 8},
};

size_t ds_dtype_size(enum ds_dtype t) {
    return (unsigned)t < DS_DTYPE_COUNT ? dtypes[t].size : 0;
}

const char *ds_dtype_name(enum ds_dtype t) {
    return (unsigned)t < DS_DTYPE_COUNT ? dtypes[t].name : "?";
}

enum ds_status ds_dtype_parse(const char *s, enum ds_dtype *out) {
    for (int i = 0; i < DS_DTYPE_COUNT; i++) {
        if (s && !strcmp(s, dtypes[i].name)) {
            *out = (enum ds_dtype)i;
            return DS_OK;
        }
    }
    return ds_error_set(DS_ERR_FORMAT, "unknown dtype '%s'", s ? s : "(null)");
}
