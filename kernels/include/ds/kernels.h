// ds/kernels.h: the CPU reference ops and the host-side helpers that prepare their inputs.
//
// Each ds_<op>_ref takes the op's argument struct from ds/kernel_args.h (see there for shapes,
// the math and what may alias). They are plain C11 over host memory, parallelised with OpenMP
// across rows and output features only: one row's reductions never split across threads and run
// in a fixed order (double accumulation), so results are deterministic and batch invariant. They
// implement fp32 activations (act == DS_ELEM_F32); any other act is DS_ERR_UNSUPPORTED.
//
// Every function validates its arguments and returns DS_OK, or an error status with a one-line
// message from ds_error_set() that names the op and the problem ("attention: sequence 2 uses slot
// 9 of 8"). On error the outputs may be partly written. Thread-safety: the functions keep no
// state; concurrent calls on disjoint outputs are safe.
//
// Models normally call these through the backend table (ds/backend.h), not directly.
#ifndef DS_KERNELS_H
#define DS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/kernel_args.h"
#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// Reference ops (kernels/ref/)

enum ds_status ds_embed_ref(const struct ds_embed_args *a);
enum ds_status ds_rmsnorm_ref(const struct ds_rmsnorm_args *a);
enum ds_status ds_matmul_ref(const struct ds_matmul_args *a);
enum ds_status ds_add_ref(const struct ds_add_args *a);
enum ds_status ds_silu_mul_ref(const struct ds_silu_mul_args *a);
enum ds_status ds_gather_rows_ref(const struct ds_gather_rows_args *a);
enum ds_status ds_rope_ref(const struct ds_rope_args *a);
enum ds_status ds_attention_ref(const struct ds_attention_args *a);
enum ds_status ds_router_ref(const struct ds_router_args *a);
enum ds_status ds_moe_ref(const struct ds_moe_args *a);
enum ds_status ds_softmax_ref(const struct ds_softmax_args *a);
enum ds_status ds_argmax_ref(const struct ds_argmax_args *a);
enum ds_status ds_topk_ref(const struct ds_topk_args *a);
enum ds_status ds_entropy_ref(const struct ds_entropy_args *a);
enum ds_status ds_overlap_ref(const struct ds_overlap_args *a);
enum ds_status ds_vocab_scatter_ref(const struct ds_vocab_scatter_args *a);
// The bench's read instrument (ds_read_args): each block's fold, for pieces ds_read_plan split.
// DS_ERR_ARG for a piece that is misaligned, empty or not a multiple of 16 bytes, or whose blocks
// lie outside [0, n_blocks).
enum ds_status ds_read_ref(const struct ds_read_args *a);
// Splits about `target_blocks` CUDA blocks over the pieces in proportion to their bytes (at least
// one each) and fills each piece's first_block / n_blocks; *n_blocks the total. Host-side, so the
// CUDA op (which reads its table from device memory) needs no check of its own: DS_ERR_ARG as
// ds_read_ref, and for n_pieces < 1 or target_blocks < 1.
enum ds_status ds_read_plan(struct ds_read_piece *pieces, int n_pieces, int target_blocks,
                            int *n_blocks);

// Bytes of workspace the CPU reference ds_moe_ref needs for n_rows rows. CPU only: the CUDA op
// needs more; size a workspace for any backend with ds_moe_workspace_bytes_v2.
size_t ds_moe_workspace_bytes(int n_rows, int inter, int top_k);

// Bytes of workspace ds_moe_args needs for n_rows rows on every backend (the larger of the CPU
// reference's and ds_moe_cuda_workspace_bytes); plan it once for the largest step. 0 for a
// non-positive argument.
size_t ds_moe_workspace_bytes_v2(int n_rows, int dim, int inter, int n_experts, int top_k);

// Bytes of ds_attention_args.workspace that let the CUDA op split the keys of up to n_rows rows
// over several blocks (flash-decoding) when every position is below max_pos (the cache's P): per
// row, up to 17 split states of n_heads·(head_dim + 2) floats. A plain formula, no device needed;
// 0 for a non-positive argument. The CPU reference needs no workspace.
size_t ds_attention_workspace_bytes(int n_rows, int n_heads, int head_dim, int max_pos);

// Decodes n_rows MXFP4 rows of k_dim elements (k_dim a multiple of 32) to float, bit-exact:
// out[n][k] = e2m1(code) · 2^(scale − 127). blocks: (n_rows, k_dim/32, 16), scales:
// (n_rows, k_dim/32). Host memory; for tests, tools and inspection (the ops decode on the fly).
enum ds_status ds_mxfp4_dequant_ref(const uint8_t *blocks, const uint8_t *scales, int n_rows,
                                    int k_dim, float *out);

// ---------------------------------------------------------------------------------------------
// RoPE tables (host side, built once per model and uploaded)

enum ds_rope_table_kind {
    DS_ROPE_TABLE_PLAIN = 0, // inv_freq_i = theta^(−2i/D): Llama, the EAGLE-3 drafts (theta 10000)
    DS_ROPE_TABLE_YARN,      // YaRN "NTK by parts" with concentration: gpt-oss
};

#define DS_ROPE_MAX_HALF (DS_MAX_HEAD_DIM / 2)

// RoPE parameters from a model config. For DS_ROPE_TABLE_PLAIN only head_dim and theta are read.
struct ds_rope_table_config {
    enum ds_rope_table_kind kind;
    int head_dim;            // D (even, <= DS_MAX_HEAD_DIM)
    double theta;            // rope_theta (150000 gpt-oss, 10000 drafts)
    double factor;           // YaRN: rope_scaling.factor (32)
    double beta_fast;        // YaRN: rope_scaling.beta_fast (32)
    double beta_slow;        // YaRN: rope_scaling.beta_slow (1)
    int original_max_pos;    // YaRN: rope_scaling.original_max_position_embeddings (4096)
    bool truncate;           // YaRN: rope_scaling.truncate (false for gpt-oss: no floor/ceil)
    double attention_factor; // YaRN: rope_scaling.attention_factor; 0 = 0.1·ln(factor) + 1
};

// Frequencies of one config, in double precision.
struct ds_rope_freqs {
    int n_half;                         // D / 2
    double inv_freq[DS_ROPE_MAX_HALF];  // per rotated pair i
    double ramp[DS_ROPE_MAX_HALF];      // YaRN blend r_i in [0, 1] (0 for PLAIN)
    double low, high;                   // YaRN correction range (0 for PLAIN)
    double concentration;               // multiplies cos and sin (1 for PLAIN)
};

// Computes the frequencies (formulas in docs/backend.md and the gpt-oss spec §4.4):
//   f_i = theta^(2i/D); low/high = (D/2)·ln(L0 / (beta·2π)) / ln theta (floor/ceil if truncate,
//   clamped to [0, D−1]); r_i = clamp((i − low)/(high − low), 0, 1);
//   inv_freq_i = r_i/(factor·f_i) + (1 − r_i)/f_i; concentration = 0.1·ln(factor) + 1.
// DS_ERR_ARG for an odd/oversized head_dim, theta <= 1, factor < 1 or beta_fast <= beta_slow.
enum ds_status ds_rope_freqs_compute(const struct ds_rope_table_config *cfg,
                                     struct ds_rope_freqs *freqs_out);

// Fills cos/sin tables of n_pos positions × D/2 floats each (host memory, caller-allocated):
// cos[p][i] = C·cos(p·inv_freq_i), sin[p][i] = C·sin(p·inv_freq_i), angles in double, rounded once
// to float. Positions are absolute token indices from 0; size the table for the longest context.
enum ds_status ds_rope_table_fill(const struct ds_rope_table_config *cfg, int n_pos, float *cos_out,
                                  float *sin_out);

// ---------------------------------------------------------------------------------------------
// Draft vocabulary (EAGLE-3 d2t)

// Turns the checkpoint's d2t offsets (draft id i → target id i + d2t[i]) into an explicit map
// for ds_vocab_scatter_args / ds_overlap_args: map_out[i] = i + d2t[i]. Checks that every target
// id lies in [0, target_vocab) and that the ids strictly increase (SpecForge sorts the kept ids, so
// the map is injective); DS_ERR_FORMAT names the first bad entry. d2t == NULL means identity
// (drafts without a reduced vocabulary; then draft_vocab must equal target_vocab).
enum ds_status ds_d2t_to_map(const int64_t *d2t, int draft_vocab, int target_vocab,
                             int32_t *map_out);

#ifdef __cplusplus
}
#endif
#endif // DS_KERNELS_H
