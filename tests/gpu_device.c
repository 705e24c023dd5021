// GPU discovery: on a machine with a GPU, auto resolves to it; without one, the test skips, and
// the CPU fallback path is checked by test_device.c.
#include "harness.h"
#include "ds/device.h"

static void auto_picks_the_gpu(void) {
    struct ds_device_info info;
    EXPECT_OK(ds_device_resolve(DS_DEVICE_AUTO, &info));
    EXPECT_EQ_INT(info.kind, DS_DEVICE_CUDA);
    EXPECT_EQ_INT(info.cuda_device, 0);
    EXPECT(info.total_mem > 0);
    EXPECT(info.cc_major >= 7);
    EXPECT(info.driver_version > 0);
}

int main(void) {
    if (ds_cuda_device_count() == 0) DS_SKIP("no CUDA device");
    DS_RUN(auto_picks_the_gpu);
    return ds_test_end();
}
