// ds/mxfp4.h: the MXFP4 weight format of the gpt-oss experts, shared by host C and CUDA code.
//
// A logical weight matrix W[n, k] (n = output row, k = input column, K a multiple of 32) is
// stored as two U8 tensors per expert e:
//   blocks[e][n][k / 32][(k % 32) / 2]   16 bytes of 4-bit codes per block of 32 elements
//   scales[e][n][k / 32]                 1 E8M0 exponent byte per block
// Within a row the code of element k therefore sits in byte k / 2 of the row's blocks: the element
// at EVEN k is the LOW nibble (byte & 0xF), the element at ODD k the HIGH nibble (byte >> 4).
//
// Code -> value (E2M1: bit 3 sign, bits 2..1 exponent with bias 1, bit 0 mantissa):
//   0:+0 1:+0.5 2:+1 3:+1.5 4:+2 5:+3 6:+4 7:+6 8:-0 9:-0.5 10:-1 11:-1.5 12:-2 13:-3 14:-4 15:-6
// Scale byte s -> 2^(s - 127) (E8M0, bias 127). value = e2m1(code) * 2^(s - 127).
//
// Decoding here is bit-exact against ldexpf(e2m1(code), s - 127), the references' definition: the
// scale of s = 0 is the subnormal 2^-127; s = 255 means 2^128, so 0.5·2^128 stays finite, 0 stays
// 0, and |value| >= 1 overflows to ±Inf (the references do not special-case the OCP NaN encoding
// 255; it is not expected in real checkpoints).
#ifndef DS_MXFP4_H
#define DS_MXFP4_H

#include <stdint.h>

#include "ds/hd.h"

#define DS_MXFP4_BLOCK 32       // elements per block (along the input dimension)
#define DS_MXFP4_BLOCK_BYTES 16 // packed code bytes per block
#define DS_E8M0_BIAS 127

// The 16 E2M1 values in code order, for host lookup tables.
#define DS_E2M1_VALUES                                                                             \
    { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,                                              \
      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f }

// Value of a 4-bit E2M1 code (only the low 4 bits of code are used).
DS_HD float ds_e2m1_to_f32(unsigned code) {
    unsigned e = (code >> 1) & 3u, m = code & 1u;
    float mag = e ? (1.0f + 0.5f * (float)m) * (float)(1u << (e - 1)) : 0.5f * (float)m;
    return (code & 8u) ? -mag : mag;
}

// 2^(s - 127) as a float: exponent field s with a zero mantissa, except s = 0 (subnormal 2^-127)
// and s = 255 (+Inf: use ds_mxfp4_scale to apply a scale to a value).
DS_HD float ds_e8m0_to_f32(uint8_t s) {
    return ds_f32_from_bits(s ? (uint32_t)s << 23 : 0x00400000u);
}

// v · 2^(s − 127) exactly as ldexpf would give it. 2^128 (s = 255) is not a float, so that scale
// is applied as two exact halves.
DS_HD float ds_mxfp4_scale(float v, uint8_t s) {
    return s == 255 ? (v * 0x1p64f) * 0x1p64f : v * ds_e8m0_to_f32(s);
}

// The 4-bit code of element k of one row of packed blocks (row = blocks + n * K / 2).
DS_HD unsigned ds_mxfp4_code(const uint8_t *row_blocks, int64_t k) {
    uint8_t b = row_blocks[k >> 1];
    return (k & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0fu);
}

// Element k of one row: row_blocks = blocks + n * (K / 2), row_scales = scales + n * (K / 32).
DS_HD float ds_mxfp4_get(const uint8_t *row_blocks, const uint8_t *row_scales, int64_t k) {
    return ds_mxfp4_scale(ds_e2m1_to_f32(ds_mxfp4_code(row_blocks, k)),
                          row_scales[k / DS_MXFP4_BLOCK]);
}

#endif // DS_MXFP4_H
