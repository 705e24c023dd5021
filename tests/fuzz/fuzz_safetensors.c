// libFuzzer target for the safetensors header validator (ds/safetensors.h).
//
// Each input is tried two ways: as the JSON header text itself (with a 1 MiB data region behind
// it, so that plausible offsets pass and the overlap check is reached), and as a whole file image
// whose first 8 bytes are the little-endian header length (the path open_file takes after
// mapping). Built by tests/fuzz/build.sh; see docs/fuzzing.md.
#include <stddef.h>
#include <stdint.h>

#include "ds/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t count;
    ds_safetensors_check_header((const char *)data, size, (uint64_t)1 << 20, "fuzz", &count);
    ds_safetensors_check_bytes(data, size, "fuzz", &count);
    return 0;
}
