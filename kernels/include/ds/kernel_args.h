// ds/kernel_args.h: one plain-data argument struct per op, shared by the CPU reference and CUDA.
//
// Every op of the backend table (ds/backend.h) takes exactly one of these structs. The CPU
// reference (ds_<op>_ref in ds/kernels.h) and the CUDA launchers read the same struct, so tests
// and benchmarks drive both through identical arguments. The header compiles as C11 and as CUDA
// C++; it holds no pointers to host-only objects.
//
// Buffers. Every pointer below is a "device" pointer: memory from the backend's own allocator
// (backend->alloc, or backend->map_host for read-only weights), possibly offset by a byte count
// into a larger allocation. On the CPU reference that is ordinary host memory; on CUDA it is
// device memory, and the op never touches host memory, so a forward step needs no host round trip.
// Small per-step metadata (token ids, positions, sequence tables) is uploaded by the caller into
// device buffers before the step.
//
// Shapes. Dimension letters used in the comments:
//   T  rows of the call (tokens of all sequences packed together)
//   C  model width (hidden size), V vocabulary, N output features, K input features
//   NH query heads, NKV key/value heads, D head dim, S cache slots, P cache positions per slot
//   E  experts, KE experts per token (top-k), I expert intermediate size
// Matrices are row-major; a weight W[N][K] follows the checkpoint's (torch) layout, y = x·Wᵀ + b.
//
// Dtypes. `act` is the dtype of the activations an op reads and writes (its x/out). The CPU
// reference implements DS_ELEM_F32 activations only and returns DS_ERR_UNSUPPORTED for others;
// the CUDA path will use DS_ELEM_BF16 activations with fp32 math. Weight, bias, gain and sink
// tensors carry their own dtype field (DS_ELEM_BF16 as stored in the checkpoints, or DS_ELEM_F32).
// Indices are int32, probabilities and sampling outputs are always float32.
//
// Rows are independent. Every op computes each output row from that row's inputs alone, with a
// reduction order that depends neither on T nor on how the work is split across threads, so a
// row's result is bitwise the same alone or inside any batch (the batch-invariance contract).
//
// Outputs must not overlap inputs unless a field says so (in-place is allowed where documented).
#ifndef DS_KERNEL_ARGS_H
#define DS_KERNEL_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Element type of a buffer.
enum ds_elem {
    DS_ELEM_F32 = 0, // IEEE binary32
    DS_ELEM_BF16,    // bfloat16 bits (ds/bf16.h)
    DS_ELEM_COUNT
};

// Limits of the reference implementation (checked; larger values are DS_ERR_UNSUPPORTED).
#define DS_MAX_HEAD_DIM 256 // per-head accumulators live on the stack
#define DS_MAX_TOPK 64      // router top-k and vocabulary top-k

// ---------------------------------------------------------------------------------------------
// Dense ops

// Deferred RMSNorm (the target model's norms before q/k/v and before the MoE). A product of a
// normalised row, W·rmsnorm(x), is computed as s(x)·(W·(g ⊙ x)) with s(x) = 1/sqrt(mean(x²) + eps):
// the op that writes x (embed, the o_proj matmul, the MoE) also writes xg = act(g ⊙ x) for the next
// norm's gain g (norm_gain / norm_out, elementwise, no reduction), and the ops that read the norm's
// output take xg as their x and x itself as rms_of, multiplying each row's fp32 product by s before
// the bias (the MoE gets s from the router: row_scale). So no kernel needs a whole row before its
// first product and no separate norm kernel runs between producer and consumer. The results differ
// from rmsnorm-then-product by rounding only: g ⊙ x is rounded to act instead of g ⊙ x · s.
//
// THE ROW SCALE (CUDA, every kernel and every T: a row's s has the same bits everywhere, which the
// batch-invariance contract needs). C % 8 == 0. The sum of squares Σ x[c]² follows THE PER-LOGIT
// ORDER of kernels/cuda/router.cu with the row as both operands (groups of 8 elements dealt to 128
// virtual lanes, __fmaf_rn in element order, lane sums (q_l + q_{l+32}) + (q_{l+64} + q_{l+96}),
// xor butterfly), then s = 1 / sqrt(ss / C + eps) with one correctly rounded fp32 operation each
// (division, addition, square root, reciprocal). The CPU reference computes s in double.

// out[t] = table[ids[t]]. An id outside [0, V) is DS_ERR_RANGE (the ref names the row and id).
struct ds_embed_args {
    enum ds_elem act;         // dtype of out
    enum ds_elem table_dtype; // dtype of table
    int n_rows;               // T
    int vocab;                // V
    int dim;                  // C
    const void *table;        // (V, C) table_dtype
    const int32_t *ids;       // (T) int32
    void *out;                // (T, C) act
    // Optional deferred-norm output (see Deferred RMSNorm): when norm_gain is set,
    // norm_out[t][c] = act(norm_gain[c] · out[t][c]), with out[t][c] as stored (rounded to act).
    const void *norm_gain;        // (C) norm_gain_dtype, or NULL
    enum ds_elem norm_gain_dtype; // dtype of norm_gain
    void *norm_out;               // (T, C) act; must not overlap any input or out
};

// out[t] = w ⊙ (x[t] · 1/sqrt(mean(x[t]²) + eps)). No bias, no "1 + w" offset.
// out may equal x (in place).
struct ds_rmsnorm_args {
    enum ds_elem act;     // dtype of x and out
    enum ds_elem w_dtype; // dtype of w
    int n_rows;           // T
    int dim;              // C
    float eps;            // from the config (1e-5 for gpt-oss and the EAGLE-3 drafts)
    const void *x;        // (T, C) act
    const void *w;        // (C) w_dtype, the gain
    void *out;            // (T, C) act
};

// out[t][n] = Σ_k x[t][k]·w[n][k] + bias[n] + residual[t][n].
// bias and residual are optional (NULL). out may equal residual (fused residual add), never x.
//
// Split outputs (optional; a zero-initialised struct has none): one call computes several
// projections whose weight matrices lie back to back in memory (w is their concatenation along
// N), e.g. q, k and v, and writes each part to its own buffer. When part_dim[0] > 0, the N
// features are cut into consecutive parts of part_dim[0], part_dim[1], part_dim[2] features
// (they must sum to N; a part of width 0 is absent): features [0, d0) go to out, [d0, d0 + d1)
// to out1, the rest to out2, each part (T, dj) row-major with row stride dj. Each part has its
// own optional bias (any address, bias_dtype): bias for part 0 (d0 entries), bias1, bias2.
// residual must be NULL then; no part may overlap x. Every element is computed exactly as
// without the split (its reduction depends on K only), so the parts are bitwise what separate
// calls would write.
struct ds_matmul_args {
    enum ds_elem act;        // dtype of x, residual and out
    enum ds_elem w_dtype;    // dtype of w
    enum ds_elem bias_dtype; // dtype of bias (ignored when bias is NULL)
    int n_rows;              // T
    int in_dim;              // K
    int out_dim;             // N
    const void *x;           // (T, K) act
    const void *w;           // (N, K) w_dtype
    const void *bias;        // (N) bias_dtype, or NULL; with a split: part 0's, (part_dim[0])
    const void *residual;    // (T, N) act, or NULL
    void *out;               // (T, N) act; with a split: part 0, (T, part_dim[0]) act
    int part_dim[3];         // split widths, or all 0 (no split)
    void *out1;              // (T, part_dim[1]) act, part 1 (ignored when part_dim[1] is 0)
    void *out2;              // (T, part_dim[2]) act, part 2 (ignored when part_dim[2] is 0)
    const void *bias1;       // (part_dim[1]) bias_dtype or NULL; used only with a split
    const void *bias2;       // (part_dim[2]) bias_dtype or NULL; used only with a split
    // Optional RoPE after the product (the gpt-oss q and k): when rope_cos is set, parts 0 and 1
    // of a split (out: part_dim[0] / rope_head_dim heads, out1: part_dim[1] / rope_head_dim
    // heads) are rotated in place exactly as ds_rope rotates q and k with these fields (struct
    // ds_rope_args). Same bits as the product then ds_rope.
    int rope_head_dim;              // D (even; both part widths multiples of it)
    const int32_t *rope_positions;  // (T) int32, absolute position of each row
    const float *rope_cos;          // (rope_table_len, D/2) f32, or NULL for no RoPE
    const float *rope_sin;          // (rope_table_len, D/2) f32
    int rope_table_len;             // positions covered by the tables
    // Optional deferred norm of the input (see Deferred RMSNorm): when rms_of is set, each row's
    // fp32 sum is multiplied by s(rms_of[t]) before the bias: out = s·Σ_k x·w + bias + residual.
    // x is then the producer's norm_out (g ⊙ rms_of). On CUDA K % 8 == 0, and a call of more
    // than 16 rows keeps its row scales in module memory: such calls must not overlap in time
    // (every caller issues its ops on one stream, as for the router's workspace path).
    const void *rms_of;             // (T, K) act, or NULL
    float rms_eps;                  // the norm's eps
    // Optional deferred-norm output over out (C = N; not with a split): as ds_embed_args.
    // Optional deferred-norm output (see Deferred RMSNorm): when norm_gain is set,
    // norm_out[t][c] = act(norm_gain[c] · out[t][c]), with out[t][c] as stored (rounded to act).
    const void *norm_gain;        // (C) norm_gain_dtype, or NULL
    enum ds_elem norm_gain_dtype; // dtype of norm_gain
    void *norm_out;               // (T, C) act; must not overlap any input or out
};

// Checks the split fields of a matmul call (widths sum to N, a buffer per part, none aliasing x,
// no residual); DS_OK without a split. Shared by the CPU reference and the CUDA launcher.
enum ds_status ds_matmul_check_split(const char *op, const struct ds_matmul_args *a);
// Checks the RoPE fields (a split whose first two widths are multiples of an even head_dim,
// positions and both tables given, table_len >= 1); DS_OK without rope_cos. Shared the same way.
enum ds_status ds_matmul_check_rope(const char *op, const struct ds_matmul_args *a);

// out = a + b elementwise over n_rows × dim. out may equal a or b.
struct ds_add_args {
    enum ds_elem act;
    int n_rows; // T
    int dim;    // C
    const void *a;
    const void *b;
    void *out;
};

// out[t][j] = silu(gate[t][j]) · up[t][j], silu(g) = g · σ(g): the plain SwiGLU of a Llama MLP
// (the EAGLE-3 draft). out may equal gate or up.
struct ds_silu_mul_args {
    enum ds_elem act;
    int n_rows; // T
    int dim;    // I
    const void *gate; // (T, I) act
    const void *up;   // (T, I) act
    void *out;        // (T, I) act
};

// out[i] = x[rows[i]] for i < n_rows: picks rows (e.g. the last row of each sequence before the
// lm_head). A row index outside [0, src_rows) is DS_ERR_RANGE.
struct ds_gather_rows_args {
    enum ds_elem act;
    int n_rows;           // rows gathered
    int src_rows;         // rows of x
    int dim;              // C
    const void *x;        // (src_rows, C) act
    const int32_t *rows;  // (n_rows) int32
    void *out;            // (n_rows, C) act, must not overlap x
};

// ---------------------------------------------------------------------------------------------
// Rotary position embedding

// Rotates q and k in place, NeoX "half split": for each head and i < D/2 the pair (x[i], x[i+D/2])
//   x'[i]       = x[i]·cos[p][i] − x[i+D/2]·sin[p][i]
//   x'[i + D/2] = x[i+D/2]·cos[p][i] + x[i]·sin[p][i]
// with p = positions[t]. The table (built once by ds_rope_table_fill in ds/kernels.h) already
// holds the YaRN concentration in both cos and sin. A position outside [0, table_len) is
// DS_ERR_RANGE. k may be NULL (then n_k_heads is ignored).
struct ds_rope_args {
    enum ds_elem act;
    int n_rows;               // T
    int head_dim;             // D (even)
    int n_q_heads;            // NH
    int n_k_heads;            // NKV
    void *q;                  // (T, NH, D) act, rotated in place
    void *k;                  // (T, NKV, D) act, rotated in place, or NULL
    const int32_t *positions; // (T) int32, absolute position of each row
    const float *cos;         // (table_len, D/2) f32
    const float *sin;         // (table_len, D/2) f32
    int table_len;            // positions covered by the table
};

// The ds_rope call a matmul's RoPE fields stand for (q = out, k = out1).
struct ds_rope_args ds_matmul_rope_args(const struct ds_matmul_args *a);

// ---------------------------------------------------------------------------------------------
// Attention over a KV cache

// One sequence of an attention call: rows row0 .. row0+n_rows-1 of q/k/v/out are its query tokens
// at absolute positions pos0 .. pos0+n_rows-1, and it owns cache slot `slot`. A prefill chunk, a
// one-token decode and a K+1-token verify are all just sequences with different n_rows.
struct ds_attn_seq {
    int32_t row0;   // first packed row
    int32_t n_rows; // query rows (>= 1)
    int32_t pos0;   // absolute position of the first query row
    int32_t slot;   // KV-cache slot in [0, S)
};

// KV cache of one layer: k_cache and v_cache are each (S, P, NKV, D) in cache_dtype, i.e. element
// [slot][pos][g][d] at ((slot·P + pos)·NKV + g)·D + d.
//
// The op first writes every row's new k and v into its sequence's slot at its position
// (overwriting whatever was there: this is how rejected draft positions and the draft's temporary
// KV get replaced), then, for row i of a sequence at position p = pos0 + i and each query head h:
//   keys j: 0 <= j <= p (causal), and j > p − window when window > 0 (exactly `window` keys
//           including the current token; gpt-oss even layers: 128; full attention: 0);
//   g = h / (NH / NKV) (GQA: consecutive query heads share a KV head);
//   ℓ_j = scale · q_h(i) · k_g(j);
//   out_h(i) = Σ_j e^{ℓ_j − m} v_g(j) / (Σ_j e^{ℓ_j − m} + e^{S_h − m}),  m = max(max_j ℓ_j, S_h)
// where the sink term S_h = sinks[h] is a raw logit (not scaled, never masked), present only when
// sinks != NULL (gpt-oss); without sinks it is the plain softmax. Cache positions after p are
// ignored, so stale entries beyond the current length are harmless.
//
// Rows not covered by any sequence are left unwritten. The sequences must lie inside [0, T), be
// sorted by row0 without overlap, and own distinct slots; pos0 + n_rows <= P. The reference checks
// all of this (DS_ERR_ARG / DS_ERR_RANGE); the CUDA path trusts its caller for the device-side
// table. q and k are expected already rotated (ds_rope_args).
struct ds_attention_args {
    enum ds_elem act;         // dtype of q, k, v, out
    enum ds_elem cache_dtype; // dtype of k_cache, v_cache
    enum ds_elem sinks_dtype; // dtype of sinks (ignored when sinks is NULL)
    int n_rows;               // T
    int n_heads;              // NH
    int n_kv_heads;           // NKV (divides NH)
    int head_dim;             // D (<= DS_MAX_HEAD_DIM)
    int n_seq;                // sequences in this call
    const struct ds_attn_seq *seqs; // (n_seq), device buffer
    const void *q;            // (T, NH, D) act
    const void *k;            // (T, NKV, D) act, this call's new keys
    const void *v;            // (T, NKV, D) act, this call's new values
    void *k_cache;            // (S, P, NKV, D) cache_dtype
    void *v_cache;            // (S, P, NKV, D) cache_dtype
    int n_slots;              // S
    int max_pos;              // P
    int window;               // sliding window in keys incl. the current one; 0 = full causal
    float scale;              // logit scale, normally 1/sqrt(D)
    const void *sinks;        // (NH) sinks_dtype raw logits, or NULL
    void *out;                // (T, NH, D) act
    // Scratch of the CUDA split-key path: at least ds_attention_workspace_bytes(T, NH, D, P)
    // bytes of device memory, 16-byte aligned, or NULL. With NULL (or too few bytes) the CUDA op
    // runs every row in one block, bitwise identical but slower for a few long rows. The CPU
    // reference ignores both fields.
    void *workspace;
    size_t workspace_bytes;
    // Nonzero: every cache entry below a sequence's pos0 was written before the op preceding this
    // call on the stream began (the model's calls: at least the q/k/v product lies between two
    // attention calls of a layer), so the CUDA op may copy those entries before the grid
    // dependency resolves. 0 (the default) keeps every read after it. Same results either way.
    int cache_settled;
    // The most splits a row's keys are cut into on CUDA (the CPU reference ignores it): 0 (the
    // default) is 16, the batch-invariant split, a function of the row's own key range. 1 .. 16
    // cuts it into at most that many (plus one when the range starts mid-split): a batch-variant
    // backend sets it from the call's size as flash-decoding engines do, which changes the merge
    // order and so the bits (ds_backend_cuda_set_numerics).
    int max_splits;
};

// ---------------------------------------------------------------------------------------------
// Mixture of experts (gpt-oss)

// Router: logits = w·x[t] + bias over E experts; take the top_k largest logits (ties go to the
// LOWER expert index), then softmax over those top_k values only (fp32 output, computed in double).
// Outputs are ordered by decreasing logit. This is top-k THEN softmax, not softmax then top-k.
struct ds_router_args {
    enum ds_elem act;        // dtype of x
    enum ds_elem w_dtype;    // dtype of w
    enum ds_elem bias_dtype; // dtype of bias (ignored when NULL)
    int n_rows;              // T
    int dim;                 // C
    int n_experts;           // E
    int top_k;               // KE (<= min(E, DS_MAX_TOPK))
    const void *x;           // (T, C) act, the post-attention-normed stream
    const void *w;           // (E, C) w_dtype
    const void *bias;        // (E) bias_dtype, or NULL
    int32_t *expert_ids;     // (T, KE) int32 out: selected experts, best first
    float *expert_weights;   // (T, KE) f32 out: softmax weights of those experts (sum 1)
    // Optional deferred norm of the input (see Deferred RMSNorm): when rms_of is set, logit =
    // s(rms_of[t])·(w·x[t]) + bias, and row_scale (if not NULL) receives each row's s for the MoE.
    const void *rms_of;      // (T, C) act, or NULL
    float rms_eps;           // the norm's eps
    float *row_scale;        // (T) f32 out, or NULL
    // Scratch of the CUDA many-block path for small calls: at least
    // ds_router_workspace_bytes(T, E) bytes of device memory, 16-byte aligned, or NULL. With
    // NULL (or too few bytes) the CUDA op runs its cluster path, bitwise identical but slower
    // for a few rows. The CPU reference ignores both fields.
    void *workspace;
    size_t workspace_bytes;
};

// Router workspace: T·E·4 bytes. Its presence selects the CUDA many-block path for T <= 8 (which
// keeps its logits in the module's own slot array; the workspace itself is not written). 0 for a
// non-positive argument.
static inline size_t ds_router_workspace_bytes(int n_rows, int n_experts) {
    if (n_rows <= 0 || n_experts <= 0) return 0;
    return (size_t)n_rows * (size_t)n_experts * sizeof(float);
}

// Experts, fused: for each row t and each selected expert e = expert_ids[t][s] with weight w_s:
//   u   = r_t · (W1_e · x[t]) + b1_e        (2I values; W1 MXFP4 [2I][C], decoded exactly;
//                                            r_t = row_scale[t], 1 without a row_scale)
//   g_j = min(u[2j], limit)                 gate: even rows, clamped from above only
//   l_j = clamp(u[2j+1], −limit, limit)     linear: odd rows
//   h_j = g_j · σ(alpha · g_j) · (l_j + 1)
//   y_e = W2_e · h + b2_e                   (C values; W2 MXFP4 [C][I])
//   out[t] = residual[t] + Σ_s w_s · y_e    (the down bias is inside the weighted sum)
// Sums over s run in the router's order (best first). C and I must be multiples of 32.
// workspace: at least ds_moe_workspace_bytes(n_rows, inter, top_k) bytes of device memory.
// out may equal residual, never x.
struct ds_moe_args {
    enum ds_elem act;        // dtype of x, residual, out
    enum ds_elem bias_dtype; // dtype of gate_up_bias and down_bias
    int n_rows;              // T
    int dim;                 // C
    int inter;               // I
    int n_experts;           // E
    int top_k;               // KE
    float swiglu_alpha;      // 1.702 for gpt-oss (not in config.json)
    float swiglu_limit;      // config.swiglu_limit (7.0)
    const void *x;                  // (T, C) act
    const int32_t *expert_ids;      // (T, KE) from the router
    const float *expert_weights;    // (T, KE) from the router
    const uint8_t *gate_up_blocks;  // (E, 2I, C/32, 16) u8
    const uint8_t *gate_up_scales;  // (E, 2I, C/32) u8
    const void *gate_up_bias;       // (E, 2I) bias_dtype, gate/up interleaved like the rows
    const uint8_t *down_blocks;     // (E, C, I/32, 16) u8
    const uint8_t *down_scales;     // (E, C, I/32) u8
    const void *down_bias;          // (E, C) bias_dtype
    const void *residual;           // (T, C) act, or NULL
    void *out;                      // (T, C) act
    void *workspace;                // scratch, see ds_moe_workspace_bytes
    size_t workspace_bytes;
    // Deferred norm (see Deferred RMSNorm): the router's row_scale of x's rows, or NULL.
    const float *row_scale;         // (T) f32
    // Optional deferred-norm output over out, as ds_embed_args (C = dim).
    // Optional deferred-norm output (see Deferred RMSNorm): when norm_gain is set,
    // norm_out[t][c] = act(norm_gain[c] · out[t][c]), with out[t][c] as stored (rounded to act).
    const void *norm_gain;        // (C) norm_gain_dtype, or NULL
    enum ds_elem norm_gain_dtype; // dtype of norm_gain
    void *norm_out;               // (T, C) act; must not overlap any input or out
};

// ---------------------------------------------------------------------------------------------
// Vocabulary-row ops (sampling side). One row = one distribution over a vocabulary.

// probs[r] = softmax(logits[r] / temperature), optionally restricted:
//   top_k > 0: keep the top_k largest logits (ties: lower id first) and renormalise;
//   0 < top_p < 1: then keep the smallest prefix of the tokens sorted by probability (descending,
//     ties: lower id first) whose mass reaches top_p (the token crossing top_p is kept), and
//     renormalise. Removed entries are exactly 0.
// temperature must be > 0 (a greedy run uses argmax, and records distributions at 1.0).
struct ds_softmax_args {
    enum ds_elem act;         // dtype of logits
    int n_rows;               // rows
    int vocab;                // V
    float temperature;        // > 0
    int top_k;                // 0 = off
    float top_p;              // >= 1 = off; must be > 0
    const void *logits;       // (rows, V) act
    float *probs;             // (rows, V) f32
};

// ids[r] = the index of the largest value of x[r] (ties: lowest id; NaN never wins unless the
// whole row is NaN, then 0); values[r] = that value (values may be NULL).
struct ds_argmax_args {
    enum ds_elem act;
    int n_rows;
    int vocab;
    const void *x;    // (rows, V) act
    int32_t *ids;     // (rows) int32
    float *values;    // (rows) f32, or NULL
};

// The k largest entries of each row, best first (ties: lower id first; NaN entries are skipped).
struct ds_topk_args {
    enum ds_elem act;
    int n_rows;
    int vocab;
    int k;            // 1 .. min(V, DS_MAX_TOPK)
    const void *x;    // (rows, V) act
    int32_t *ids;     // (rows, k) int32
    float *values;    // (rows, k) f32
};

// out[r] = −Σ_v p log p in nats (0·log 0 = 0), accumulated in double; NaN if any p is NaN.
struct ds_entropy_args {
    int n_rows;
    int vocab;
    const float *probs; // (rows, V) f32
    float *out;         // (rows) f32
};

// out[r] = Σ_i min(p[r][map(i)], q[r][i]): the expected acceptance of rejection sampling. With
// q_to_p == NULL, q is over the same vocabulary as p (vocab_q == vocab_p, map = identity);
// otherwise q_to_p[i] is the p-index of q's entry i (the draft→target map of ds_d2t_to_map).
// NaN if any summed entry of p or q is NaN (a plain min would drop one side's NaN).
struct ds_overlap_args {
    int n_rows;
    int vocab_p;
    int vocab_q;
    const float *p;         // (rows, vocab_p) f32
    const float *q;         // (rows, vocab_q) f32
    const int32_t *q_to_p;  // (vocab_q) int32, or NULL
    float *out;             // (rows) f32
};

// dst[r][map[i]] = src[r][i]; every other entry of dst[r] = fill (−INFINITY for logits, 0 for
// probabilities). Maps a draft-vocabulary row into the target vocabulary. map entries must be
// distinct and inside [0, dst_vocab) (ds_d2t_to_map guarantees it).
struct ds_vocab_scatter_args {
    enum ds_elem act;       // dtype of src and dst
    int n_rows;
    int src_vocab;          // D
    int dst_vocab;          // V
    float fill;
    const void *src;        // (rows, D) act
    const int32_t *map;     // (D) int32
    void *dst;              // (rows, V) act
};

// A bench instrument, not a model op: read the bytes of a list of pieces and fold them, nothing
// else. `draftscope bench --ops` times it over the MoE's weight pieces beside the MoE op, as the
// floor of any kernel that must read those bytes (with its launch). The fold of a set of 16-byte
// units is their XOR, taken as four little-endian uint32 words. Row b of out is the fold of the
// units block b of the plan reads: unit u of piece i belongs to block first_block +
// (u mod (n_blocks·DS_READ_THREADS)) / DS_READ_THREADS. Rows are written, not accumulated, and
// no block touches another's row (a shared fold would need same-address atomics, whose
// serialisation costs more than the read at small sizes); the XOR of the rows is the fold of
// every piece, which checks that every byte was read.
#define DS_READ_THREADS 256 // threads per block of the CUDA grid
struct ds_read_piece {
    const void *p;            // 16-byte aligned
    uint64_t bytes;           // a multiple of 16, > 0
    uint32_t first_block;     // the blocks that read this piece (ds_read_plan fills them)
    uint32_t n_blocks;
};
struct ds_read_args {
    int n_pieces;
    const struct ds_read_piece *pieces; // host memory for ds_read_ref, device for ds_read_cuda
    int n_blocks;                       // ds_read_plan's total: the CUDA grid
    uint32_t *out;                      // (n_blocks, 4) words, 16-byte aligned: each block's fold
};

#ifdef __cplusplus
}
#endif
#endif // DS_KERNEL_ARGS_H
