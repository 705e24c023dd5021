// ds_attention_workspace_bytes: the scratch the CUDA attention op needs for its split-key path.
//
// The split of a row's keys is fixed by kernels/cuda/attention.cu: 32-key chunks aligned to
// absolute positions, splits of a multiple of 4 chunks (at least 128 keys), at most 16 splits for
// a range that starts on a split boundary and 17 otherwise. A cache of max_pos positions holds at
// most ceil(max_pos / 32) chunks, so a row needs min(17, ceil(chunks / 4) + 1) records of
// n_heads·(head_dim + 2) floats (the accumulators, then m and l per head). (Earlier versions
// allowed 33 records, twice what the op uses at long contexts.)
// The CUDA launcher derives its per-row record count from this very function.
#include "ds/kernels.h"

size_t ds_attention_workspace_bytes(int n_rows, int n_heads, int head_dim, int max_pos) {
    if (n_rows <= 0 || n_heads <= 0 || head_dim <= 0 || max_pos <= 0) return 0;
    const long long chunks = ((long long)max_pos + 31) / 32, max_splits = 16;
    const long long splits = chunks > 4 * max_splits ? max_splits + 1 : (chunks + 3) / 4 + 1;
    return (size_t)n_rows * (size_t)splits * (size_t)n_heads * ((size_t)head_dim + 2) *
           sizeof(float);
}
