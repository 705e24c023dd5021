// Storage formats shared by host and device code: bf16 (ds/bf16.h) and MXFP4 (ds/mxfp4.h,
// ds_mxfp4_dequant_ref). Every expectation is exact: decoding a format has no rounding.
#include <float.h>

#include "ds/bf16.h"
#include "ds/kernels.h"
#include "ds/mxfp4.h"
#include "test_ops_common.h"

// The E2M1 table of the gpt-oss spec §3, typed from the spec (not from the header).
static const float spec_e2m1[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static void bf16_decode_known_patterns(void) {
    float one = ds_bf16_to_f32(0x3f80), m2 = ds_bf16_to_f32(0xc000);
    EXPECT(one == 1.0f);
    EXPECT(m2 == -2.0f);
    EXPECT(isinf(ds_bf16_to_f32(0x7f80)) && ds_bf16_to_f32(0x7f80) > 0);
    EXPECT(isnan(ds_bf16_to_f32(0x7fc0)));
    EXPECT(ds_bf16_to_f32(0x0001) == ldexpf(1.0f, -133)); // smallest bf16 subnormal
    float negzero = ds_bf16_to_f32(0x8000);
    EXPECT(negzero == 0.0f && signbit(negzero));
}

static void bf16_encode_rounds_to_nearest_even(void) {
    EXPECT_EQ_INT(ds_f32_to_bf16(1.0f), 0x3f80);
    // 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7: goes to 1.
    EXPECT_EQ_INT(ds_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
    // 1 + 3·2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
    EXPECT_EQ_INT(ds_f32_to_bf16(1.0f + 3.0f * ldexpf(1.0f, -8)), 0x3f82);
    // Just above halfway rounds up.
    EXPECT_EQ_INT(ds_f32_to_bf16(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)), 0x3f81);
    EXPECT_EQ_INT(ds_f32_to_bf16(FLT_MAX), 0x7f80); // rounds to +Inf
    uint16_t nan = ds_f32_to_bf16(NAN);
    EXPECT((nan & 0x7f80) == 0x7f80 && (nan & 0x007f) != 0); // still a NaN, not Inf
}

static void e2m1_every_code_matches_the_spec_table(void) {
    for (unsigned c = 0; c < 16; c++) {
        float got = ds_e2m1_to_f32(c);
        if (memcmp(&got, &spec_e2m1[c], sizeof got))
            DS_FAILF("code %u decodes to %g, spec says %g", c, got, spec_e2m1[c]);
    }
    static const float header_table[16] = DS_E2M1_VALUES;
    EXPECT(t_same_bits(header_table, spec_e2m1, 16));
}

static void e8m0_every_byte_is_a_power_of_two(void) {
    for (int s = 0; s < 256; s++) {
        float want = ldexpf(1.0f, s - 127); // 2^-127 is subnormal, 2^128 overflows to +Inf
        float got = ds_e8m0_to_f32((uint8_t)s);
        if (memcmp(&got, &want, sizeof got)) DS_FAILF("scale byte %d: %g, want %g", s, got, want);
    }
}

// Every code × a spread of scale bytes, through the element accessor and the row dequantizer.
static void mxfp4_codes_times_scales_bit_exact(void) {
    static const uint8_t scales[] = {0, 1, 2, 100, 119, 126, 127, 128, 129, 140, 200, 253, 254, 255};
    for (size_t si = 0; si < sizeof scales; si++) {
        // One row of 32 elements: codes 0..15 then 15..0, packed two per byte, low nibble first.
        uint8_t blocks[16], scale = scales[si];
        unsigned codes[32];
        for (int k = 0; k < 32; k++) codes[k] = k < 16 ? (unsigned)k : (unsigned)(31 - k);
        for (int b = 0; b < 16; b++) blocks[b] = (uint8_t)(codes[2 * b] | codes[2 * b + 1] << 4);
        float row[32];
        EXPECT_OK(ds_mxfp4_dequant_ref(blocks, &scale, 1, 32, row));
        for (int k = 0; k < 32; k++) {
            float want = ldexpf(spec_e2m1[codes[k]], (int)scale - 127);
            float got = ds_mxfp4_get(blocks, &scale, k);
            if (memcmp(&got, &want, sizeof got) || memcmp(&row[k], &want, sizeof got))
                DS_FAILF("code %u scale %u: get %g, dequant %g, want %g", codes[k], scale, got,
                         row[k], want);
        }
    }
}

// Byte 0x21: element 0 is the low nibble (code 1 = 0.5), element 1 the high one (code 2 = 1.0).
static void mxfp4_low_nibble_is_the_even_element(void) {
    uint8_t blocks[16] = {0x21, 0xf7}, scale = 127;
    float row[32];
    EXPECT_OK(ds_mxfp4_dequant_ref(blocks, &scale, 1, 32, row));
    EXPECT(row[0] == 0.5f);
    EXPECT(row[1] == 1.0f);
    EXPECT(row[2] == 6.0f);  // 0xf7 low nibble 7
    EXPECT(row[3] == -6.0f); // 0xf7 high nibble 15
    EXPECT(row[4] == 0.0f && !signbit(row[4]));
}

// Two rows × two blocks: each block uses its own scale byte, rows are K/2 bytes apart.
static void mxfp4_block_and_row_layout(void) {
    uint8_t blocks[2 * 2 * 16], scales[4] = {127, 128, 126, 130};
    memset(blocks, 0x22, sizeof blocks); // code 2 (1.0) everywhere
    float out[2 * 64];
    EXPECT_OK(ds_mxfp4_dequant_ref(blocks, scales, 2, 64, out));
    EXPECT(out[0] == 1.0f && out[31] == 1.0f);      // row 0 block 0: 2^0
    EXPECT(out[32] == 2.0f && out[63] == 2.0f);     // row 0 block 1: 2^1
    EXPECT(out[64] == 0.5f && out[95] == 0.5f);     // row 1 block 0: 2^-1
    EXPECT(out[96] == 8.0f && out[127] == 8.0f);    // row 1 block 1: 2^3
}

static void mxfp4_dequant_rejects_bad_shapes(void) {
    uint8_t b[16] = {0}, s = 127;
    float out[48];
    EXPECT_STATUS(ds_mxfp4_dequant_ref(b, &s, 1, 48, out), DS_ERR_ARG);
    EXPECT_ERROR_HAS("multiple of 32");
    EXPECT_STATUS(ds_mxfp4_dequant_ref(NULL, &s, 1, 32, out), DS_ERR_ARG);
    EXPECT_ERROR_HAS("blocks");
}

int main(void) {
    DS_RUN(bf16_decode_known_patterns);
    DS_RUN(bf16_encode_rounds_to_nearest_even);
    DS_RUN(e2m1_every_code_matches_the_spec_table);
    DS_RUN(e8m0_every_byte_is_a_power_of_two);
    DS_RUN(mxfp4_codes_times_scales_bit_exact);
    DS_RUN(mxfp4_low_nibble_is_the_even_element);
    DS_RUN(mxfp4_block_and_row_layout);
    DS_RUN(mxfp4_dequant_rejects_bad_shapes);
    return ds_test_end();
}
