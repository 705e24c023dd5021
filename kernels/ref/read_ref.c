// CPU reference of the bench's read instrument (ds_read_args) and the host-side plan of its CUDA
// grid. The fold is the XOR of 16-byte units as four little-endian uint32 words, one fold per
// block of the plan.
#include <stdint.h>
#include <string.h>

#include "ds/kernels.h"

static enum ds_status check_piece(const struct ds_read_piece *pc, int i) {
    if (!pc->p || (uintptr_t)pc->p % 16)
        return ds_error_set(DS_ERR_ARG, "read: piece %d at %p is not 16-byte aligned", i, pc->p);
    if (!pc->bytes || pc->bytes % 16)
        return ds_error_set(DS_ERR_ARG,
                            "read: piece %d has %llu bytes, not a positive multiple of 16", i,
                            (unsigned long long)pc->bytes);
    return DS_OK;
}

enum ds_status ds_read_ref(const struct ds_read_args *a) {
    if (!a || a->n_pieces < 1 || !a->pieces || !a->out || a->n_blocks < 1)
        return ds_error_set(DS_ERR_ARG, "read: no pieces, no blocks or no output");
    for (int i = 0; i < a->n_pieces; i++) {
        const struct ds_read_piece *pc = &a->pieces[i];
        enum ds_status st = check_piece(pc, i);
        if (st != DS_OK) return st;
        if (!pc->n_blocks || (uint64_t)pc->first_block + pc->n_blocks > (uint64_t)a->n_blocks)
            return ds_error_set(DS_ERR_ARG, "read: piece %d's blocks [%u, +%u) outside %d blocks",
                                i, pc->first_block, pc->n_blocks, a->n_blocks);
    }
    memset(a->out, 0, sizeof *a->out * 4 * (size_t)a->n_blocks);
    for (int i = 0; i < a->n_pieces; i++) {
        const struct ds_read_piece *pc = &a->pieces[i];
        const unsigned char *b = pc->p;
        const uint64_t span = (uint64_t)pc->n_blocks * DS_READ_THREADS;
        for (uint64_t u = 0; u < pc->bytes / 16; u++) {
            uint32_t *row = a->out + 4 * ((size_t)pc->first_block + (u % span) / DS_READ_THREADS);
            for (int k = 0; k < 4; k++) {
                uint32_t w;
                memcpy(&w, b + 16 * u + 4 * k, 4); // little-endian hosts, as the GPU
                row[k] ^= w;
            }
        }
    }
    return DS_OK;
}

enum ds_status ds_read_plan(struct ds_read_piece *pieces, int n_pieces, int target_blocks,
                            int *n_blocks) {
    if (!pieces || n_pieces < 1 || target_blocks < 1 || !n_blocks)
        return ds_error_set(DS_ERR_ARG, "read plan: %d pieces, %d blocks", n_pieces, target_blocks);
    double total = 0;
    for (int i = 0; i < n_pieces; i++) {
        enum ds_status st = check_piece(&pieces[i], i);
        if (st != DS_OK) return st;
        total += (double)pieces[i].bytes;
    }
    uint64_t next = 0;
    for (int i = 0; i < n_pieces; i++) {
        double share = (double)target_blocks * (double)pieces[i].bytes / total;
        uint64_t nb = (uint64_t)(share + 0.5);
        if (nb < 1) nb = 1;
        if (nb > pieces[i].bytes / 16) nb = pieces[i].bytes / 16; // no block without a unit
        pieces[i].first_block = (uint32_t)next;
        pieces[i].n_blocks = (uint32_t)nb;
        next += nb;
        if (next > (uint64_t)INT32_MAX)
            return ds_error_set(DS_ERR_ARG, "read plan: more than 2^31 blocks");
    }
    *n_blocks = (int)next;
    return DS_OK;
}
