// kernels/cuda/read.cu: the bench's read instrument (ds_read_args in ds/kernel_args.h; the CPU
// twin and the grid plan are kernels/ref/read_ref.c). It streams the bytes of a list of pieces
// and folds them, with no other work, so its time is the floor of any kernel that must read the
// same bytes, launch included: `draftscope bench --ops` runs it over the MoE's weight pieces.
//
// Work split: ds_read_plan gives each piece a run of blocks in proportion to its bytes; a block
// finds its piece in one parallel scan of the table (first_block is increasing), then its threads
// stride over the piece's 16-byte units with four streaming loads (`ld.global.cs`) in flight each.
//
// Launch: ds_launch (programmatic dependent launch). The pieces are read before the grid
// dependency, as the MoE kernels read their weights (common.cuh: memory that no kernel of the two
// before it writes), and the dependents are released at once, so a second read launch streams
// beside the first's tail as the MoE's down kernel streams beside gate_up. Only the fold's
// write waits. Each block writes its own row of out: a single shared fold took an atomicXor per
// warp on the same four words, which serialise, and the instrument got slower the more blocks it
// had (the H200 figures in docs/performance.md fit about 3 ns per warp).
//
// ds_l2_discard_cuda, the bench's other L2 tool: after its flush (a memset larger than L2, which
// leaves L2 full of dirty lines), `discard.global.L2` drops those lines without writing them
// back, so the timed op that follows neither finds its inputs in L2 nor pays for the flush's
// write-backs.
#include "common.cuh"

#include "ds/kernels_cuda.h"

#define READ_THREADS DS_READ_THREADS

__global__ void __launch_bounds__(READ_THREADS)
    read_fold(const struct ds_read_piece *t, int n, uint32_t *out) {
    ds_grid_launch_dependents();
    // The block's piece: the last whose first block is at or before this one. Threads check
    // READ_THREADS-entry windows of the table with independent loads (one round trip per window
    // instead of a binary search's ~log2(n) dependent ones, which right after the bench's L2
    // flush all go to DRAM); the unique match writes s_piece.
    __shared__ int s_piece;
    for (int w = 0; w < n; w += READ_THREADS) {
        const int i = w + (int)threadIdx.x;
        if (i < n && t[i].first_block <= blockIdx.x &&
            (i + 1 == n || t[i + 1].first_block > blockIdx.x))
            s_piece = i;
    }
    __syncthreads();
    const struct ds_read_piece pc = t[s_piece];
    const uint4 *p = (const uint4 *)pc.p;
    const uint64_t n16 = pc.bytes / 16, stride = (uint64_t)pc.n_blocks * READ_THREADS;
    uint64_t i = (uint64_t)(blockIdx.x - pc.first_block) * READ_THREADS + threadIdx.x;
    uint4 acc = make_uint4(0u, 0u, 0u, 0u);
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride);
        const uint4 c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc.x ^= a.x ^ b.x ^ c.x ^ d.x, acc.y ^= a.y ^ b.y ^ c.y ^ d.y;
        acc.z ^= a.z ^ b.z ^ c.z ^ d.z, acc.w ^= a.w ^ b.w ^ c.w ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc.x ^= a.x, acc.y ^= a.y, acc.z ^= a.z, acc.w ^= a.w;
    }
    for (int o = DS_WARP / 2; o; o >>= 1) {
        acc.x ^= __shfl_xor_sync(DS_FULL_MASK, acc.x, o);
        acc.y ^= __shfl_xor_sync(DS_FULL_MASK, acc.y, o);
        acc.z ^= __shfl_xor_sync(DS_FULL_MASK, acc.z, o);
        acc.w ^= __shfl_xor_sync(DS_FULL_MASK, acc.w, o);
    }
    // The block's fold in its own row of out: no atomics (same-address ones serialise).
    __shared__ uint4 s_warp[READ_THREADS / DS_WARP];
    const int warp = threadIdx.x / DS_WARP;
    if (threadIdx.x % DS_WARP == 0) s_warp[warp] = acc;
    __syncthreads();
    ds_grid_wait(); // out: earlier kernels may read or write it
    if (threadIdx.x == 0) {
        uint4 f = s_warp[0];
        for (int w = 1; w < READ_THREADS / DS_WARP; w++)
            f.x ^= s_warp[w].x, f.y ^= s_warp[w].y, f.z ^= s_warp[w].z, f.w ^= s_warp[w].w;
        ((uint4 *)out)[blockIdx.x] = f;
    }
}

// One thread per 128-byte line of [lo, lo + n·128).
__global__ void l2_discard(char *lo, uint64_t n) {
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) asm volatile("discard.global.L2 [%0], 128;" ::"l"(lo + 128 * i) : "memory");
}

extern "C" enum ds_status ds_l2_discard_cuda(void *p, size_t bytes, void *stream) {
    CU_TRY(cu_check_ptr("l2_discard", "p", p));
    // Whole lines inside the range only: a line that reaches outside it holds other data.
    const uintptr_t lo = ((uintptr_t)p + 127) & ~(uintptr_t)127;
    const uintptr_t hi = ((uintptr_t)p + bytes) & ~(uintptr_t)127;
    if (hi <= lo) return DS_OK;
    const uint64_t n = (hi - lo) / 128;
    l2_discard<<<(unsigned)((n + 255) / 256), 256, 0, DS_STREAM(stream)>>>((char *)lo, n);
    DS_KERNEL_CHECK();
    return DS_OK;
}

extern "C" enum ds_status ds_read_cuda(const struct ds_read_args *a, void *stream) {
    static const char op[] = "read";
    if (!a) return ds_error_set(DS_ERR_ARG, "%s: no arguments", op);
    CU_TRY(cu_check_dim(op, "n_pieces", a->n_pieces, 1));
    CU_TRY(cu_check_dim(op, "n_blocks", a->n_blocks, 1));
    CU_TRY(cu_check_ptr(op, "pieces", a->pieces));
    CU_TRY(cu_check_ptr(op, "out", a->out));
    if ((uintptr_t)a->out % 16)
        return ds_error_set(DS_ERR_ARG, "%s: out is not 16-byte aligned", op);
    ds_launch(read_fold, dim3((unsigned)a->n_blocks), dim3(READ_THREADS), 0, DS_STREAM(stream),
              a->pieces, a->n_pieces, a->out);
    return DS_OK;
}
