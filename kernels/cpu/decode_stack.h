/* The decoder stack's entry points (decode_stack.c) and the structs they read, which
 * kernels/cpu/decode_stack.py mirrors as ctypes Structures (tests/kernels hold the two
 * together, and kernels/cpu/signatures.py's table to these prototypes). */
#ifndef KVDECK_DECODE_STACK_H
#define KVDECK_DECODE_STACK_H
#include <stdint.h>

#include "int4.h"

/* A layer's tensors, all of the stack's element type (bf16 or fp32; the step function says
 * which). A projection is either dense (row-major [out, in]) or INT4 tiles (its *_q4, the
 * dense pointer then NULL). */
typedef struct {
    const void* input_norm;  /* [H] */
    const void* qkv;         /* [Q + 2 KV, H], Q = heads * head_dim, KV = kv_heads * head_dim */
    const void* qkv_bias;    /* [Q + 2 KV] or NULL */
    const void* q_norm;      /* [head_dim] or NULL (with k_norm: Qwen3) */
    const void* k_norm;      /* [head_dim] or NULL */
    const void* o_proj;      /* [H, Q] */
    const void* post_norm;   /* [H] */
    const void* gate_up;     /* [2 I, H] */
    const void* down;        /* [H, I] */
    void* k_cache;           /* [num_blocks, block_size, kv_heads, head_dim] */
    void* v_cache;
    const kvdeck_q4_weight* qkv_q4;      /* or NULL */
    const kvdeck_q4_weight* o_proj_q4;   /* or NULL */
    const kvdeck_q4_weight* gate_up_q4;  /* or NULL */
    const kvdeck_q4_weight* down_q4;     /* or NULL */
    float scale;             /* attention's score scale */
} kvdeck_decoder_layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size, rot_dim;
    int64_t num_blocks;  /* of each layer's caches */
    float eps;
    const kvdeck_decoder_layer* layers;
    const void* final_norm;  /* [H] or NULL: the model's norm after the last layer */
} kvdeck_decoder_stack;

/* 1 when every index a step of `rows` rows follows lies inside what it indexes. */
int kvdeck_decode_stack_in_range(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions,
                                 int64_t max_positions, const int64_t* slots, const int32_t* block_tables,
                                 int64_t bt_stride, const int32_t* seq_lens);
/* The workspace (in elements of the stack's type) a step of `rows` rows needs. */
int64_t kvdeck_decode_stack_workspace(const kvdeck_decoder_stack* s, int64_t rows);
/* A step (decode_stack_step.h): bf16 over a bf16 cache, fp32 over fp32, fp32 over fp16. */
int kvdeck_decode_stack_bf16(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions,
                             const float* cos_sin, int64_t max_positions, const int64_t* slots,
                             const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                             uint16_t* hidden, uint16_t* residual, uint16_t* workspace);
int kvdeck_decode_stack_f32(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions,
                            const float* cos_sin, int64_t max_positions, const int64_t* slots,
                            const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                            float* hidden, float* residual, float* workspace);
int kvdeck_decode_stack_f32_f16kv(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions,
                                  const float* cos_sin, int64_t max_positions, const int64_t* slots,
                                  const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                                  float* hidden, float* residual, float* workspace);

#endif
