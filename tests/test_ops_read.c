// The bench's read instrument on the host: the per-block folds of ds_read_ref (the CUDA op's
// reference) and the grid plan ds_read_plan. Every expectation is exact: folds are XOR, the plan
// integers.
#include <stdalign.h>
#include <string.h>

#include "ds/kernels.h"
#include "test_ops_common.h"

// Two pieces whose folds are worked out by hand below (word k of a fold is the XOR of word k of
// its 16-byte units). With one block each (the plan's minimum), row 0 is a's fold and row 1 b's.
// Then one piece over two blocks: unit u goes to block (u mod 512) / 256.
static void fold_of_known_words(void) {
    alignas(16) uint32_t a[8] = {1, 2, 3, 4, 16, 32, 64, 128};
    alignas(16) uint32_t b[4] = {0xff, 0, 0, 1};
    struct ds_read_piece pc[2] = {{.p = a, .bytes = sizeof a}, {.p = b, .bytes = sizeof b}};
    int nb = 0;
    EXPECT_OK(ds_read_plan(pc, 2, 1, &nb));
    EXPECT_EQ_INT(nb, 2);
    uint32_t out[8];
    memset(out, 0xab, sizeof out); // written, not accumulated
    struct ds_read_args r = {.n_pieces = 2, .pieces = pc, .n_blocks = nb, .out = out};
    EXPECT_OK(ds_read_ref(&r));
    const uint32_t want[8] = {1 ^ 16, 2 ^ 32, 3 ^ 64, 4 ^ 128, 0xff, 0, 0, 1};
    for (int k = 0; k < 8; k++)
        EXPECT_EQ_INT(out[k], want[k]);
    // 600 units over 2 blocks: block 0 reads units 0-255 and 512-599, block 1 units 256-511.
    enum { U = 600 };
    static alignas(16) uint32_t big[4 * U];
    uint32_t w0[4] = {0}, w1[4] = {0};
    for (int u = 0; u < U; u++)
        for (int k = 0; k < 4; k++) {
            big[4 * u + k] = (uint32_t)(u * 2654435761u + k);
            if (u < 256 || u >= 512)
                w0[k] ^= big[4 * u + k];
            else
                w1[k] ^= big[4 * u + k];
        }
    struct ds_read_piece one = {.p = big, .bytes = sizeof big, .first_block = 0, .n_blocks = 2};
    r = (struct ds_read_args){.n_pieces = 1, .pieces = &one, .n_blocks = 2, .out = out};
    EXPECT_OK(ds_read_ref(&r));
    for (int k = 0; k < 4; k++) {
        EXPECT_EQ_INT(out[k], w0[k]);
        EXPECT_EQ_INT(out[4 + k], w1[k]);
    }
    one.n_blocks = 3; // past the 2 blocks of the call
    EXPECT_STATUS(ds_read_ref(&r), DS_ERR_ARG);
    EXPECT_ERROR_HAS("outside 2 blocks");
}

static void bad_pieces_are_refused(void) {
    alignas(16) unsigned char buf[64] = {0};
    uint32_t out[4] = {0};
    struct ds_read_piece pc = {.p = buf + 4, .bytes = 16, .n_blocks = 1};
    struct ds_read_args r = {.n_pieces = 1, .pieces = &pc, .n_blocks = 1, .out = out};
    EXPECT_STATUS(ds_read_ref(&r), DS_ERR_ARG);
    EXPECT_ERROR_HAS("read: piece 0 at");
    EXPECT_ERROR_HAS("not 16-byte aligned");
    pc.p = buf, pc.bytes = 24;
    EXPECT_STATUS(ds_read_ref(&r), DS_ERR_ARG);
    EXPECT_ERROR_HAS("piece 0 has 24 bytes, not a positive multiple of 16");
    pc.bytes = 0;
    EXPECT_STATUS(ds_read_ref(&r), DS_ERR_ARG);
    int nb = -1;
    EXPECT_STATUS(ds_read_plan(&pc, 1, 8, &nb), DS_ERR_ARG);
    pc.bytes = 16;
    EXPECT_STATUS(ds_read_plan(&pc, 1, 0, &nb), DS_ERR_ARG);
    EXPECT_STATUS(ds_read_plan(&pc, 0, 8, &nb), DS_ERR_ARG);
    r.n_pieces = 0;
    EXPECT_STATUS(ds_read_ref(&r), DS_ERR_ARG);
}

// The plan: consecutive runs of blocks, at least one per piece and at most one per 16-byte unit,
// shares in proportion to the bytes (within the rounding of each share to a whole block).
static void plan_splits_blocks_by_bytes(void) {
    // The pointers are never read by the plan; any 16-byte aligned address will do.
    const uintptr_t base = 1u << 20;
    const uint64_t bytes[5] = {16, 48, 1 << 20, 3u << 20, 4096};
    struct ds_read_piece pc[5];
    for (int i = 0; i < 5; i++)
        pc[i] = (struct ds_read_piece){.p = (const void *)(base + 16 * i), .bytes = bytes[i]};
    const int targets[3] = {1, 7, 528};
    for (int ti = 0; ti < 3; ti++) {
        int nb = -1;
        EXPECT_OK(ds_read_plan(pc, 5, targets[ti], &nb));
        double total = 0;
        for (int i = 0; i < 5; i++)
            total += (double)bytes[i];
        uint32_t next = 0;
        for (int i = 0; i < 5; i++) {
            EXPECT_EQ_INT(pc[i].first_block, next);
            EXPECT(pc[i].n_blocks >= 1);
            EXPECT(pc[i].n_blocks <= bytes[i] / 16);
            const double share = targets[ti] * (double)bytes[i] / total;
            if (share >= 1.0 && share <= (double)bytes[i] / 16)
                EXPECT_NEAR(pc[i].n_blocks, share, 0.5);
            next += pc[i].n_blocks;
        }
        EXPECT_EQ_INT(nb, (int)next);
    }
    // 48 bytes is 3 units: a larger share is capped there.
    struct ds_read_piece one = {.p = (const void *)base, .bytes = 48};
    int nb = -1;
    EXPECT_OK(ds_read_plan(&one, 1, 100, &nb));
    EXPECT_EQ_INT(nb, 3);
}

int main(void) {
    DS_RUN(fold_of_known_words);
    DS_RUN(bad_pieces_are_refused);
    DS_RUN(plan_splits_blocks_by_bytes);
    return ds_test_end();
}
