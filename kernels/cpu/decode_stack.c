/* A step of a few tokens through a Llama-family decoder stack in one call: every layer's
 * RMSNorm, qkv projection (with Qwen2's bias, Qwen3's per-head q/k norms), rotary, KV-cache
 * write, attention, output projection, RMSNorm and SiLU MLP. A row is a token with its own
 * block-table row and context length: decode rows, or a short chunk's tokens (a
 * speculative verify), each attending causally. Rows never mix, so a token's result does
 * not depend on what else is in the step.
 *
 * In bf16 it composes cpu_native.c's kernels in the order and with the roundings of the
 * model's Python forward (engine/runner/models/llama.py over kernels/dispatch.py), so its
 * result is bit for bit that path's. What it saves is the path's per-layer cost around
 * the kernels: some fifteen Python calls, tensor views and allocations a layer, which on
 * SmolLM2's 30 layers took a third of a 15 ms step. In fp32 it composes cpu_native_f32.c's
 * twins, the same formulas with nothing rounded in between (the Python forward's fp32 up
 * to the order of its sums). One body (cpu_decode_stack_step.h) serves both types.
 *
 * hidden [rows, H] holds the embeddings on the way in and on the way out the last layer's
 * MLP output, or with a final norm that output plus the residual, normed; residual [rows,
 * H] receives the residual stream beside it. Both contiguous. */
#include <string.h>

#include "decode_stack.h"
#include "native.h"

/* Whether every index the step will follow lies inside what it indexes: a position inside
 * the cos|sin table, a slot (or -1) and every block of each row's context inside the cache,
 * a context that fits its table row. The Python path would raise on any of these; here a
 * wrong one would read or write outside the tensors. */
static int step_in_range(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions,
                         int64_t max_positions, const int64_t* slots, const int32_t* block_tables,
                         int64_t bt_stride, const int32_t* seq_lens) {
    const int64_t num_slots = s->num_blocks * s->block_size;
    for (int64_t r = 0; r < rows; r++) {
        if (positions[r] < 0 || positions[r] >= max_positions || slots[r] < -1 || slots[r] >= num_slots
            || seq_lens[r] < 1 || seq_lens[r] > bt_stride * s->block_size)
            return 0;
        const int32_t* table = block_tables + r * bt_stride;
        for (int64_t b = 0; b < (seq_lens[r] + s->block_size - 1) / s->block_size; b++)
            if (table[b] < 0 || table[b] >= s->num_blocks) return 0;
    }
    return 1;
}

/* step_in_range for a whole step before it runs in several calls (so a bad index in a later
 * pass is refused before an earlier pass writes anything): 1 when every index is inside. */
int kvdeck_decode_stack_in_range(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions,
                                 int64_t max_positions, const int64_t* slots, const int32_t* block_tables,
                                 int64_t bt_stride, const int32_t* seq_lens) {
    return step_in_range(s, rows, positions, max_positions, slots, block_tables, bt_stride, seq_lens);
}

/* The workspace (in elements of the stack's type, at least 2 bytes) a step of `rows` rows
 * needs: the activations between kernels, then the INT4 products' scratch (their int8
 * activations, for the widest input at the smallest group). */
int64_t kvdeck_decode_stack_workspace(const kvdeck_decoder_stack* s, int64_t rows) {
    const int64_t q = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim;
    int64_t widest = s->hidden > q ? s->hidden : q;
    widest = widest > s->intermediate ? widest : s->intermediate;
    return rows * (s->hidden + (q + 2 * kv) + 2 * (q + kv) + q + 3 * s->intermediate)
           + (kvdeck_q4_scratch_bytes(rows, widest, KVDECK_Q8_BLOCK) + 1) / 2 + 64;
}

#define STACK_ELEM uint16_t
#define STACK_CACHE_ELEM uint16_t
#define STACK_STORE_KV(dst, src, count) memcpy(dst, src, (size_t)(count) * sizeof(uint16_t))
#define STACK_STEP kvdeck_decode_stack_bf16
#define STACK_GEMV kvdeck_gemv_bf16
#define STACK_Q4_GEMM kvdeck_q4_gemm_bf16
#define STACK_RMS_NORM kvdeck_rms_norm_bf16
#define STACK_ROPE kvdeck_rope_neox_bf16
#define STACK_ATTENTION kvdeck_decode_attention_bf16
#define STACK_SILU_AND_MUL kvdeck_silu_and_mul_bf16
#include "decode_stack_step.h"
#undef STACK_ELEM
#undef STACK_CACHE_ELEM
#undef STACK_STORE_KV
#undef STACK_STEP
#undef STACK_GEMV
#undef STACK_Q4_GEMM
#undef STACK_RMS_NORM
#undef STACK_ROPE
#undef STACK_ATTENTION
#undef STACK_SILU_AND_MUL

#define STACK_ELEM float
#define STACK_CACHE_ELEM float
#define STACK_STORE_KV(dst, src, count) memcpy(dst, src, (size_t)(count) * sizeof(float))
#define STACK_STEP kvdeck_decode_stack_f32
#define STACK_GEMV kvdeck_gemv_f32
#define STACK_Q4_GEMM kvdeck_q4_gemm_f32
#define STACK_RMS_NORM kvdeck_rms_norm_f32
#define STACK_ROPE kvdeck_rope_neox_f32
#define STACK_ATTENTION kvdeck_decode_attention_f32
#define STACK_SILU_AND_MUL kvdeck_silu_and_mul_f32
#include "decode_stack_step.h"
#undef STACK_CACHE_ELEM
#undef STACK_STORE_KV
#undef STACK_STEP
#undef STACK_ATTENTION

/* fp32 over an fp16 KV cache (kv_cache_dtype float16): keys and values rounded to fp16 as
 * they are written, widened as they are read; everything else the fp32 step's. */
#define STACK_CACHE_ELEM uint16_t
#define STACK_STORE_KV(dst, src, count) kvdeck_store_f16(dst, src, count)
#define STACK_STEP kvdeck_decode_stack_f32_f16kv
#define STACK_ATTENTION kvdeck_decode_attention_f32_f16kv
#include "decode_stack_step.h"
