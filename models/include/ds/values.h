// ds/values.h: scans a checkpoint's tensor data for values no forward pass survives: NaN or Inf
// in float tensors (BF16, F16, F32, F64; F8 E4M3 has NaN only, F8 E5M2 both) and the NaN scale
// 0xFF in the E8M0 scale tensors of MXFP4 experts (U8 tensors whose name ends in "_scales").
// Other dtypes (the MXFP4 codes, integer maps, BOOL) hold no such values and are not counted.
//
// The loaders never read tensor data this way: a scan reads every byte of the scanned tensors
// once through the read-only mapping (`draftscope inspect --scan-values`), at the speed of the
// page cache or the disk. One problem line per tensor that holds any, naming its file. The same
// pass measures what the finite values span (largest |x|, all-zero tensors, scale exponents).
#ifndef DS_VALUES_H
#define DS_VALUES_H

#include <stdint.h>

#include "ds/checkpoint.h"
#include "ds/safetensors.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ds_value_scan {
    uint64_t tensors;     // tensors of a scanned dtype
    uint64_t bytes;       // their bytes
    uint64_t bad_tensors; // of them, tensors holding at least one NaN, Inf or NaN scale
    uint64_t nan, inf;    // NaN and Inf values over all float tensors
    uint64_t nan_scales;  // E8M0 scale bytes 0xFF over all "*_scales" U8 tensors
    // What the finite values span, for a reader judging a checkpoint that has no NaN: the largest
    // |x| of the float tensors and its tensor (ds_safetensors_at index, -1 when none), the float
    // tensors whose every element is ±0 (the first's index, -1 when none), and the E8M0 scales'
    // smallest and largest exponent (byte − 127; INT32_MIN when no scale is finite).
    double max_abs;
    int64_t max_abs_tensor;
    uint64_t zero_tensors;
    int64_t first_zero_tensor;
    int scale_min, scale_max;
};

// Counts of one tensor's data (exposed for the tests): NaN, Inf and the first such element (-1
// when none); the finite elements, the largest finite |x| (0 when none) and the ±0 elements. For
// U8 with `e8m0` set the bytes are scales: "NaN" counts the 0xFF bytes, scale_min / scale_max are
// the finite scales' exponents (INT32_MIN when none) and max_abs, zeros stay 0.
struct ds_value_count {
    uint64_t nan, inf, finite, zeros;
    int64_t first;
    double max_abs;
    int scale_min, scale_max;
};
// 1 when the dtype is scanned (for U8 only with e8m0), 0 otherwise (*out zeroed either way).
int ds_values_count(const void *data, uint64_t numel, enum ds_dtype dtype, int e8m0,
                    struct ds_value_count *out);

// Scans every tensor of st. progress (may be NULL) is called after each tensor with the bytes
// done and the total of scanned bytes. A tensor with such values adds one line to problems:
// "FILE: tensor NAME (DTYPE): N NaN and M Inf among K values, the first at element I" (or the
// NaN-scale form). Returns DS_OK, DS_ERR_MISMATCH when lines were added (ds_error_last() holds
// the first), DS_ERR_NOMEM.
enum ds_status ds_values_scan(const ds_safetensors_t *st, struct ds_value_scan *out,
                              void (*progress)(void *user, uint64_t done, uint64_t total),
                              void *user, struct ds_problems *problems);

#ifdef __cplusplus
}
#endif
#endif // DS_VALUES_H
