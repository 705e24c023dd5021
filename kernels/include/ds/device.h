// ds/device.h: choosing where the models run, decided at run time.
//
// The CUDA code is always compiled; whether a usable GPU is present is asked of the CUDA runtime
// when the program starts. `--device auto` picks CUDA when a device answers, else the CPU.
#ifndef DS_DEVICE_H
#define DS_DEVICE_H

#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ds_device_kind { DS_DEVICE_AUTO = 0, DS_DEVICE_CPU, DS_DEVICE_CUDA };

struct ds_device_info {
    enum ds_device_kind kind; // what was chosen (never AUTO)
    int cuda_device;          // device ordinal when kind == CUDA, else -1
    char name[128];           // "cpu" or the GPU's name
    int cc_major, cc_minor;   // compute capability (0 on the CPU)
    size_t total_mem;         // device memory in bytes (0 on the CPU)
    int driver_version;       // CUDA driver version (e.g. 13000), 0 if no driver
    int runtime_version;      // CUDA runtime version the binary was linked with
    char why_cpu[256];        // when AUTO fell back to the CPU: the runtime's reason
};

// Parses "auto", "cpu" or "cuda". Returns DS_ERR_ARG for anything else.
enum ds_status ds_device_parse(const char *s, enum ds_device_kind *out);

// Resolves a request. AUTO → CUDA device 0 if usable, else CPU with info->why_cpu set.
// CUDA requested but unusable → DS_ERR_NODEVICE with the runtime's reason in ds_error_last().
// info is written on success only.
enum ds_status ds_device_resolve(enum ds_device_kind want, struct ds_device_info *info);

// Number of usable CUDA devices (0 when there is no driver or no device); never fails.
int ds_cuda_device_count(void);

// CUDA device ordinal `device` is present: DS_OK. Otherwise DS_ERR_NODEVICE with the runtime's
// own reason, so that a command that needs a GPU says why there is none: "no CUDA device:
// <cudaGetErrorString>" when the runtime finds none (no driver, no GPU, CUDA_VISIBLE_DEVICES
// empty), "no CUDA device N: the runtime lists M (0..M-1)" for an ordinal past the last. It makes
// no CUDA context, so a tracer enabled after it still sees every module load.
enum ds_status ds_cuda_device_check(int device);

#ifdef __cplusplus
}
#endif
#endif // DS_DEVICE_H
