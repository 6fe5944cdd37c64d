/* A step of a few tokens through a Llama-family decoder stack in one call: every layer's
 * RMSNorm, qkv projection (with Qwen2's bias, Qwen3's per-head q/k norms), rotary, KV-cache
 * write, attention, output projection, RMSNorm and SiLU MLP. A row is a token with its own
 * block-table row and context length: decode rows, or a short chunk's tokens (a
 * speculative verify), each attending causally. Rows never mix, so a token's result does
 * not depend on what else is in the step.
 *
 * It composes cpu_native.c's kernels in the order and with the roundings of the model's
 * Python forward (engine/runner/models/llama.py over kernels/dispatch.py), so its result
 * is bit for bit that path's. What it saves is the path's per-layer cost around the
 * kernels: some fifteen Python calls, tensor views and allocations a layer, which on
 * SmolLM2's 30 layers took a third of a 15 ms step.
 *
 * hidden [rows, H] holds the embeddings on the way in and the last layer's MLP output on
 * the way out; residual [rows, H] receives the residual stream beside it (what the final
 * norm adds). Both contiguous. */
#include <string.h>

#include "cpu_native.h"

typedef struct {
    const uint16_t* input_norm;  /* [H] */
    const uint16_t* qkv;         /* [Q + 2 KV, H], Q = heads * head_dim, KV = kv_heads * head_dim */
    const uint16_t* qkv_bias;    /* [Q + 2 KV] or NULL */
    const uint16_t* q_norm;      /* [head_dim] or NULL (with k_norm: Qwen3) */
    const uint16_t* k_norm;      /* [head_dim] or NULL */
    const uint16_t* o_proj;      /* [H, Q] */
    const uint16_t* post_norm;   /* [H] */
    const uint16_t* gate_up;     /* [2 I, H] */
    const uint16_t* down;        /* [H, I] */
    uint16_t* k_cache;           /* [num_blocks, block_size, kv_heads, head_dim] */
    uint16_t* v_cache;
    float scale;                 /* attention's score scale */
} kvdeck_decoder_layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size, rot_dim;
    int64_t num_blocks;  /* of each layer's caches */
    float eps;
    const kvdeck_decoder_layer* layers;
} kvdeck_decoder_stack;

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

/* The workspace (in bf16 elements) a step of `rows` rows needs. */
int64_t kvdeck_decode_stack_workspace(const kvdeck_decoder_stack* s, int64_t rows) {
    const int64_t q = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim;
    return rows * (s->hidden + (q + 2 * kv) + 2 * (q + kv) + q + 3 * s->intermediate);
}

/* positions, slots [rows] int64 (slot -1: not written), cos_sin [max_positions, rot_dim] fp32,
 * block_tables [rows, bt_stride] int32, seq_lens [rows] int32. Returns 0, -2 when an index
 * is out of range (nothing is touched), -1 when a kernel refuses. */
int kvdeck_decode_stack_bf16(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions,
                             const float* cos_sin, int64_t max_positions, const int64_t* slots,
                             const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                             uint16_t* hidden, uint16_t* residual, uint16_t* workspace) {
    if (!step_in_range(s, rows, positions, max_positions, slots, block_tables, bt_stride, seq_lens))
        return -2;
    const int64_t h = s->hidden, d = s->head_dim, q = s->heads * d, kv = s->kv_heads * d;
    const int64_t qkv_width = q + 2 * kv, inter = s->intermediate;
    uint16_t* normed = workspace;                   /* [rows, H] */
    uint16_t* qkv = normed + rows * h;              /* [rows, Q + 2 KV] */
    uint16_t* q_normed = qkv + rows * qkv_width;    /* [rows, Q] (Qwen3) */
    uint16_t* k_normed = q_normed + rows * q;       /* [rows, KV] */
    uint16_t* q_rotated = k_normed + rows * kv;     /* [rows, Q] */
    uint16_t* k_rotated = q_rotated + rows * q;     /* [rows, KV] */
    uint16_t* attended = k_rotated + rows * kv;     /* [rows, Q] */
    uint16_t* gate_up = attended + rows * q;        /* [rows, 2 I] */
    uint16_t* activated = gate_up + rows * 2 * inter; /* [rows, I] */
    int status = 0;
    for (int64_t l = 0; l < s->num_layers && status == 0; l++) {
        const kvdeck_decoder_layer* layer = &s->layers[l];
        if (l == 0) {  /* the first layer's residual is its input */
            memcpy(residual, hidden, (size_t)(rows * h) * sizeof(uint16_t));
            status |= kvdeck_rms_norm_bf16(hidden, h, NULL, 0, layer->input_norm, s->eps, rows, h, NULL, normed);
        } else {
            status |= kvdeck_rms_norm_bf16(hidden, h, residual, h, layer->input_norm, s->eps, rows, h,
                                           residual, normed);
        }
        status |= kvdeck_gemv_bf16(normed, rows, h, layer->qkv, qkv_width, h, layer->qkv_bias, qkv, qkv_width);
        const uint16_t *q_source = qkv, *k_source = qkv + q;
        int64_t q_stride = qkv_width, k_stride = qkv_width;
        if (layer->q_norm) {
            for (int64_t r = 0; r < rows; r++) {
                status |= kvdeck_rms_norm_bf16(qkv + r * qkv_width, d, NULL, 0, layer->q_norm, s->eps,
                                               s->heads, d, NULL, q_normed + r * q);
                status |= kvdeck_rms_norm_bf16(qkv + r * qkv_width + q, d, NULL, 0, layer->k_norm, s->eps,
                                               s->kv_heads, d, NULL, k_normed + r * kv);
            }
            q_source = q_normed, k_source = k_normed, q_stride = q, k_stride = kv;
        }
        status |= kvdeck_rope_neox_bf16(q_source, q_stride, s->heads, k_source, k_stride, s->kv_heads, rows, d,
                                        positions, cos_sin, s->rot_dim, q_rotated, k_rotated);
        for (int64_t r = 0; r < rows; r++) {
            if (slots[r] == -1) continue;
            memcpy(layer->k_cache + slots[r] * kv, k_rotated + r * kv, (size_t)kv * sizeof(uint16_t));
            memcpy(layer->v_cache + slots[r] * kv, qkv + r * qkv_width + q + kv, (size_t)kv * sizeof(uint16_t));
        }
        status |= kvdeck_decode_attention_bf16(q_rotated, rows, q, s->heads, d, layer->k_cache, layer->v_cache,
                                               s->kv_heads, block_tables, bt_stride, seq_lens, s->block_size,
                                               0, layer->scale, 0.0f, attended);
        status |= kvdeck_gemv_bf16(attended, rows, q, layer->o_proj, h, q, NULL, hidden, h);
        status |= kvdeck_rms_norm_bf16(hidden, h, residual, h, layer->post_norm, s->eps, rows, h, residual,
                                       normed);
        status |= kvdeck_gemv_bf16(normed, rows, h, layer->gate_up, 2 * inter, h, NULL, gate_up, 2 * inter);
        status |= kvdeck_silu_and_mul_bf16(gate_up, 2 * inter, rows, inter, activated);
        status |= kvdeck_gemv_bf16(activated, rows, inter, layer->down, h, inter, NULL, hidden, h);
    }
    return status == 0 ? 0 : -1;
}
