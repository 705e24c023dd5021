// Backend-independent helpers of the backend table (ds/backend.h).
#include "ds/backend.h"

size_t ds_elem_size(enum ds_elem e) {
    switch (e) {
    case DS_ELEM_F32: return 4;
    case DS_ELEM_BF16: return 2;
    default: return 0;
    }
}

enum ds_status ds_backend_check(const struct ds_backend *be) {
    if (!be) return ds_error_set(DS_ERR_ARG, "backend: no backend given");
    const char *name = be->name ? be->name : "(unnamed)";
    if (be->api_version != DS_BACKEND_API_VERSION)
        return ds_error_set(DS_ERR_MISMATCH, "backend %s: API version %d, this build expects %d",
                            name, be->api_version, DS_BACKEND_API_VERSION);
    // Every entry except map_host is mandatory.
    const struct {
        const char *what;
        int present;
    } entries[] = {
        {"alloc", !!be->alloc},         {"free", !!be->free},
        {"upload", !!be->upload},       {"download", !!be->download},
        {"memset", !!be->memset},       {"copy_2d", !!be->copy_2d},
        {"sync", !!be->sync},           {"embed", !!be->embed},
        {"rmsnorm", !!be->rmsnorm},     {"matmul", !!be->matmul},
        {"add", !!be->add},             {"silu_mul", !!be->silu_mul},
        {"gather_rows", !!be->gather_rows}, {"rope", !!be->rope},
        {"attention", !!be->attention}, {"router", !!be->router},
        {"moe", !!be->moe},             {"softmax", !!be->softmax},
        {"argmax", !!be->argmax},       {"topk", !!be->topk},
        {"entropy", !!be->entropy},     {"overlap", !!be->overlap},
        {"vocab_scatter", !!be->vocab_scatter}, {"release", !!be->release},
    };
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (!entries[i].present)
            return ds_error_set(DS_ERR_MISMATCH, "backend %s: missing entry %s", name,
                                entries[i].what);
    return DS_OK;
}

void ds_backend_release(struct ds_backend *be) {
    if (be && be->release) be->release(be);
}
