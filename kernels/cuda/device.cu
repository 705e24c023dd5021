// Run-time GPU discovery (ds/device.h). No kernels here: only CUDA runtime queries, so a machine
// without a driver or device gets a clear answer instead of a failure at the first launch.
#include "ds/device.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" int ds_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky error so later queries start clean
        return 0;
    }
    return n;
}

extern "C" enum ds_status ds_cuda_device_check(int device) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ds_error_set(DS_ERR_NODEVICE, "no CUDA device: %s", cudaGetErrorString(e));
    }
    if (n == 0) return ds_error_set(DS_ERR_NODEVICE, "no CUDA device: the runtime lists none");
    if (device < 0 || device >= n)
        return ds_error_set(DS_ERR_NODEVICE, "no CUDA device %d: the runtime lists %d (0..%d)",
                            device, n, n - 1);
    return DS_OK;
}

extern "C" enum ds_status ds_device_parse(const char *s, enum ds_device_kind *out) {
    if (!s) return ds_error_set(DS_ERR_ARG, "--device: missing value");
    if (!strcmp(s, "auto")) *out = DS_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = DS_DEVICE_CPU;
    else if (!strcmp(s, "cuda")) *out = DS_DEVICE_CUDA;
    else return ds_error_set(DS_ERR_ARG, "--device: expected auto, cpu or cuda, got '%s'", s);
    return DS_OK;
}

static void fill_cpu(struct ds_device_info *info) {
    memset(info, 0, sizeof *info);
    info->kind = DS_DEVICE_CPU;
    info->cuda_device = -1;
    snprintf(info->name, sizeof info->name, "cpu");
    cudaRuntimeGetVersion(&info->runtime_version);
}

extern "C" enum ds_status ds_device_resolve(enum ds_device_kind want, struct ds_device_info *info) {
    struct ds_device_info d;
    fill_cpu(&d);
    if (want == DS_DEVICE_CPU) {
        *info = d;
        return DS_OK;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device present";
        cudaGetLastError();
        if (want == DS_DEVICE_CUDA)
            return ds_error_set(DS_ERR_NODEVICE, "--device cuda: no usable GPU (%s)", why);
        snprintf(d.why_cpu, sizeof d.why_cpu, "%s", why);
        *info = d;
        return DS_OK;
    }
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess)
        return ds_error_set(DS_ERR_NODEVICE, "GPU 0: cannot read properties (%s)",
                            cudaGetErrorString(e));
    d.kind = DS_DEVICE_CUDA;
    d.cuda_device = 0;
    snprintf(d.name, sizeof d.name, "%s", p.name);
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.total_mem = p.totalGlobalMem;
    cudaDriverGetVersion(&d.driver_version);
    *info = d;
    return DS_OK;
}
