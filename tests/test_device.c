// Device selection from the command-line string, and the CPU answer on a machine without a GPU.
#include "harness.h"
#include "ds/device.h"

static void parse(void) {
    enum ds_device_kind k;
    EXPECT_OK(ds_device_parse("auto", &k));
    EXPECT_EQ_INT(k, DS_DEVICE_AUTO);
    EXPECT_OK(ds_device_parse("cpu", &k));
    EXPECT_EQ_INT(k, DS_DEVICE_CPU);
    EXPECT_OK(ds_device_parse("cuda", &k));
    EXPECT_EQ_INT(k, DS_DEVICE_CUDA);
    EXPECT_STATUS(ds_device_parse("gpu", &k), DS_ERR_ARG);
    EXPECT_ERROR_HAS("'gpu'");
}

static void cpu_is_always_available(void) {
    struct ds_device_info info;
    EXPECT_OK(ds_device_resolve(DS_DEVICE_CPU, &info));
    EXPECT_EQ_INT(info.kind, DS_DEVICE_CPU);
    EXPECT_EQ_INT(info.cuda_device, -1);
}

static void auto_and_cuda_agree_with_the_runtime(void) {
    struct ds_device_info info;
    EXPECT_OK(ds_device_resolve(DS_DEVICE_AUTO, &info));
    if (ds_cuda_device_count() == 0) {
        EXPECT_EQ_INT(info.kind, DS_DEVICE_CPU);
        EXPECT(info.why_cpu[0] != '\0');
        EXPECT_STATUS(ds_device_resolve(DS_DEVICE_CUDA, &info), DS_ERR_NODEVICE);
        EXPECT_ERROR_HAS("no usable GPU");
    } else {
        EXPECT_EQ_INT(info.kind, DS_DEVICE_CUDA);
    }
}

int main(void) {
    DS_RUN(parse);
    DS_RUN(cpu_is_always_available);
    DS_RUN(auto_and_cuda_agree_with_the_runtime);
    return ds_test_end();
}
