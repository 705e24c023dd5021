// The bench's read instrument on CUDA (ds_read_cuda) against its CPU twin ds_read_ref: the fold of
// seeded random bytes over piece lists of 1 unit, a few units, partial block strides, MB-sized
// pieces and 300 pieces (the block → piece search), at grids of 1, 7 and 4 blocks per SM.
// Exact: each block's fold (its row of out) against the reference's row for the same plan, so the
// partition of the units over the blocks is checked as well as the bytes; run twice over a
// poisoned out, since rows are written, not accumulated. And the
// bench's L2 discard (ds_l2_discard_cuda) leaves the bytes around its range alone.
#include <cuda_runtime.h>
#include <stdio.h>

#include "ds/kernels.h"
#include "ds/kernels_cuda.h"
#include "gpu_ops_common.h"

enum { BUF = 24 << 20 };

// Pieces at seeded 16-byte aligned offsets of the buffer (they may overlap: any bytes will do).
static void make_pieces(struct ds_read_piece *pc, int n, const unsigned char *base, uint64_t seed,
                        const uint64_t *sizes) {
    for (int i = 0; i < n; i++) {
        uint64_t bytes = sizes ? sizes[i] : 16 * (uint64_t)t_int(&seed, 1, 4000);
        uint64_t room = (BUF - bytes) / 16;
        pc[i] =
            (struct ds_read_piece){.p = base + 16 * (t_next(&seed) % (room + 1)), .bytes = bytes};
    }
}

static void fold_matches_reference(void) {
    unsigned char *h = t_alloc(BUF);
    uint64_t seed = 7;
    for (size_t i = 0; i < BUF; i += 8) {
        const uint64_t v = t_next(&seed);
        memcpy(h + i, &v, 8);
    }
    unsigned char *d = g_upload(h, BUF);
    int sms = 0;
    G_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int most = 4 * sms + 300; // blocks: the largest target, or one per piece
    uint32_t *d_out = g_alloc(16 * (size_t)most), *want = t_alloc(16 * (size_t)most),
             *got = t_alloc(16 * (size_t)most);
    const uint64_t one[1] = {16}, few[3] = {48, 16 * 257, 16 * 1000 + 16};
    const uint64_t big[3] = {(1u << 20) + 32, 3u << 20, (8u << 20) + 16 * 3};
    const struct {
        const char *name;
        int n;
        const uint64_t *sizes; // NULL: seeded sizes
    } cases[] = {{"1 unit", 1, one},
                 {"a few units", 3, few},
                 {"MB pieces", 3, big},
                 {"300 pieces", 300, NULL}};
    struct ds_read_piece hp[300], dp_host[300];
    struct ds_read_piece *d_tab = g_alloc(sizeof hp);
    const int targets[3] = {1, 7, 4 * sms};
    for (int ci = 0; ci < 4; ci++)
        for (int ti = 0; ti < 3; ti++) {
            const int n = cases[ci].n;
            make_pieces(hp, n, h, 100 + ci, cases[ci].sizes);
            int nb = 0;
            EXPECT_OK(ds_read_plan(hp, n, targets[ti], &nb));
            if (nb > most) {
                DS_FAILF("%s: %d blocks, more than the %d allotted", cases[ci].name, nb, most);
                continue;
            }
            struct ds_read_args r = {.n_pieces = n, .pieces = hp, .n_blocks = nb, .out = want};
            EXPECT_OK(ds_read_ref(&r));
            // The same pieces and plan on the device: the offsets moved from h to d.
            for (int i = 0; i < n; i++) {
                dp_host[i] = hp[i];
                dp_host[i].p = d + ((const unsigned char *)hp[i].p - h);
            }
            G_CHECK(cudaMemcpy(d_tab, dp_host, sizeof *dp_host * n, cudaMemcpyHostToDevice));
            for (int rep = 0; rep < 2; rep++) { // rows are written, not accumulated
                G_CHECK(cudaMemset(d_out, 0xab, 16 * (size_t)nb));
                struct ds_read_args g = {
                    .n_pieces = n, .pieces = d_tab, .n_blocks = nb, .out = d_out};
                EXPECT_OK(ds_read_cuda(&g, NULL));
                g_download(got, d_out, 16 * (size_t)nb);
                for (int w = 0; w < 4 * nb; w++)
                    if (got[w] != want[w]) {
                        DS_FAILF("%s, %d blocks, run %d: block %d word %d of the fold %08x, "
                                 "reference %08x",
                                 cases[ci].name, nb, rep, w / 4, w % 4, got[w], want[w]);
                        break;
                    }
            }
            uint32_t all[4] = {0, 0, 0, 0}; // the whole fold, for the log
            for (int w = 0; w < 4 * nb; w++)
                all[w % 4] ^= want[w];
            printf("  %s (%d pieces), %d blocks: fold %08x %08x %08x %08x\n", cases[ci].name, n, nb,
                   all[0], all[1], all[2], all[3]);
        }
    free(want), free(got);
    g_free(d), g_free(d_out), g_free(d_tab);
    free(h);
}

static void read_rejects_bad_arguments(void) {
    struct ds_read_args g = {.n_pieces = 0, .pieces = (void *)16, .n_blocks = 1, .out = (void *)16};
    EXPECT_STATUS(ds_read_cuda(&g, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("read: n_pieces is 0");
    g.n_pieces = 1, g.n_blocks = 0;
    EXPECT_STATUS(ds_read_cuda(&g, NULL), DS_ERR_ARG);
    g.n_blocks = 1, g.out = NULL;
    EXPECT_STATUS(ds_read_cuda(&g, NULL), DS_ERR_ARG);
    g.out = (void *)20; // not 16-byte aligned: refused before anything is queued
    EXPECT_STATUS(ds_read_cuda(&g, NULL), DS_ERR_ARG);
    EXPECT_ERROR_HAS("out is not 16-byte aligned");
}

// ds_l2_discard_cuda drops only whole 128-byte lines inside its range: the bytes around an
// unaligned range keep their values. The data is written just before (cudaMemcpy, so it is likely
// still dirty in L2, where dropping the wrong line would lose it); inside the range the contents
// are undefined and not checked.
static void discard_keeps_the_bytes_around_its_range(void) {
    enum { N = 64 << 10, LO = 100, HI = 10100 };
    unsigned char *h = t_alloc(N), *back = t_alloc(N);
    for (int i = 0; i < N; i++)
        h[i] = (unsigned char)(i * 7 + 3);
    unsigned char *d = g_upload(h, N);
    EXPECT_OK(ds_l2_discard_cuda(d + LO, HI - LO, NULL));
    EXPECT_OK(ds_l2_discard_cuda(d + 5, 100, NULL)); // no whole line inside: nothing dropped
    g_download(back, d, N);
    const int lo = (LO + 127) / 128 * 128, hi = HI / 128 * 128; // the whole lines: [128, 10048)
    EXPECT_EQ_INT(memcmp(back, h, lo), 0);
    EXPECT_EQ_INT(memcmp(back + hi, h + hi, N - hi), 0);
    EXPECT_STATUS(ds_l2_discard_cuda(NULL, 128, NULL), DS_ERR_ARG);
    g_free(d);
    free(h), free(back);
}

int main(void) {
    G_REQUIRE_GPU();
    DS_RUN(read_rejects_bad_arguments);
    DS_RUN(fold_matches_reference);
    DS_RUN(discard_keeps_the_bytes_around_its_range);
    return ds_test_end();
}
