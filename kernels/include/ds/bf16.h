// ds/bf16.h: bfloat16 <-> float conversion, shared by host C and CUDA device code.
//
// bf16 is the upper half of an IEEE binary32: 1 sign bit, 8 exponent bits, 7 mantissa bits.
// Decoding is a 16-bit shift (exact for every input, NaN and Inf included). Encoding rounds to
// nearest, ties to even, and keeps NaN a (quiet) NaN instead of letting rounding turn it into Inf.
#ifndef DS_BF16_H
#define DS_BF16_H

#include <stdint.h>

#include "ds/hd.h"

// Bits of one bf16 value as stored in a safetensors "BF16" tensor (little-endian u16).
typedef uint16_t ds_bf16;

DS_HD float ds_bf16_to_f32(ds_bf16 h) {
    return ds_f32_from_bits((uint32_t)h << 16);
}

DS_HD ds_bf16 ds_f32_to_bf16(float f) {
    uint32_t u = ds_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ds_bf16)((u >> 16) | 0x0040u); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even on the 16 dropped bits
    return (ds_bf16)(u >> 16);
}

#endif // DS_BF16_H
