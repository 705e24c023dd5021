// The bench's read instrument on CUDA (ds_read_cuda) against its CPU twin ds_read_ref: the fold of
// seeded random bytes over piece lists of 1 unit, a few units, partial block strides, MB-sized
// pieces and 300 pieces (the block → piece search), at grids of 1, 7 and 4 blocks per SM.
// Exact: the fold is XOR. Running it twice must give zero (out ^= the same fold), which also
// shows that no unit is read twice or skipped in a way that happens to cancel once. And the
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
    uint32_t *d_out = g_alloc(16);
    int sms = 0;
    G_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
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
            uint32_t want[4] = {0, 0, 0, 0}, got[4];
            struct ds_read_args r = {.n_pieces = n, .pieces = hp, .out = want};
            EXPECT_OK(ds_read_ref(&r));
            // The same pieces on the device: the offsets moved from h to d.
            for (int i = 0; i < n; i++) {
                dp_host[i] = hp[i];
                dp_host[i].p = d + ((const unsigned char *)hp[i].p - h);
            }
            int nb = 0;
            EXPECT_OK(ds_read_plan(dp_host, n, targets[ti], &nb));
            G_CHECK(cudaMemcpy(d_tab, dp_host, sizeof *dp_host * n, cudaMemcpyHostToDevice));
            G_CHECK(cudaMemset(d_out, 0, 16));
            struct ds_read_args g = {.n_pieces = n, .pieces = d_tab, .n_blocks = nb, .out = d_out};
            EXPECT_OK(ds_read_cuda(&g, NULL));
            g_download(got, d_out, 16);
            for (int k = 0; k < 4; k++)
                if (got[k] != want[k])
                    DS_FAILF("%s, %d blocks: word %d of the fold %08x, reference %08x",
                             cases[ci].name, nb, k, got[k], want[k]);
            EXPECT_OK(ds_read_cuda(&g, NULL));
            g_download(got, d_out, 16);
            for (int k = 0; k < 4; k++)
                EXPECT_EQ_INT(got[k], 0);
            printf("  %s (%d pieces), %d blocks: fold %08x %08x %08x %08x\n", cases[ci].name, n, nb,
                   want[0], want[1], want[2], want[3]);
        }
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
