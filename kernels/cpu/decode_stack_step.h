/* The body of a step through the decoder stack for one element type, included by
 * cpu_decode_stack.c once per type (C's way to a template) with these defined:
 * STACK_ELEM (uint16_t for bf16, float), STACK_CACHE_ELEM (the KV cache's: the same, or
 * fp16's uint16_t under fp32), STACK_STORE_KV (a key or value row into the cache),
 * STACK_STEP (the function's name) and the kernels it composes, STACK_GEMV (a dense
 * projection), STACK_Q4_GEMM (an INT4 one), STACK_RMS_NORM, STACK_ROPE, STACK_ATTENTION and STACK_SILU_AND_MUL, which take that
 * type (the attention, its cache's). */

/* A step through the stack, in STACK_ELEM: positions, slots [rows] int64 (slot -1: not
 * written), cos_sin [max_positions, rot_dim] fp32, block_tables [rows, bt_stride] int32,
 * seq_lens [rows] int32. Returns 0, -2 when an index is out of range (nothing is touched),
 * -1 when a kernel refuses. */
int STACK_STEP(const kvdeck_decoder_stack* s, int64_t rows, const int64_t* positions, const float* cos_sin,
               int64_t max_positions, const int64_t* slots, const int32_t* block_tables, int64_t bt_stride,
               const int32_t* seq_lens, STACK_ELEM* hidden, STACK_ELEM* residual, STACK_ELEM* workspace) {
    if (!step_in_range(s, rows, positions, max_positions, slots, block_tables, bt_stride, seq_lens))
        return -2;
    const int64_t h = s->hidden, d = s->head_dim, q = s->heads * d, kv = s->kv_heads * d;
    const int64_t qkv_width = q + 2 * kv, inter = s->intermediate;
    STACK_ELEM* normed = workspace;                   /* [rows, H] */
    STACK_ELEM* qkv = normed + rows * h;              /* [rows, Q + 2 KV] */
    STACK_ELEM* q_normed = qkv + rows * qkv_width;    /* [rows, Q] (Qwen3) */
    STACK_ELEM* k_normed = q_normed + rows * q;       /* [rows, KV] */
    STACK_ELEM* q_rotated = k_normed + rows * kv;     /* [rows, Q] */
    STACK_ELEM* k_rotated = q_rotated + rows * q;     /* [rows, KV] */
    STACK_ELEM* attended = k_rotated + rows * kv;     /* [rows, Q] */
    STACK_ELEM* gate_up = attended + rows * q;        /* [rows, 2 I] */
    STACK_ELEM* activated = gate_up + rows * 2 * inter; /* [rows, I] */
    void* q4_scratch = activated + rows * inter;      /* the INT4 products' int8 activations */
    int status = 0;
/* A projection, dense or INT4 (y = x W^T (+ bias)). */
#define STACK_LINEAR(x, x_stride, dense, q4, n, k, bias, y, y_stride)                               \
    ((q4) != NULL ? STACK_Q4_GEMM(x, rows, x_stride, q4, bias, y, y_stride, q4_scratch)              \
                  : STACK_GEMV(x, rows, x_stride, dense, n, k, bias, y, y_stride))
    for (int64_t l = 0; l < s->num_layers && status == 0; l++) {
        const kvdeck_decoder_layer* layer = &s->layers[l];
        STACK_CACHE_ELEM* k_cache = layer->k_cache;
        STACK_CACHE_ELEM* v_cache = layer->v_cache;
        if (l == 0) {  /* the first layer's residual is its input */
            memcpy(residual, hidden, (size_t)(rows * h) * sizeof(STACK_ELEM));
            status |= STACK_RMS_NORM(hidden, h, NULL, 0, layer->input_norm, s->eps, rows, h, NULL, normed);
        } else {
            status |= STACK_RMS_NORM(hidden, h, residual, h, layer->input_norm, s->eps, rows, h, residual,
                                     normed);
        }
        status |= STACK_LINEAR(normed, h, layer->qkv, layer->qkv_q4, qkv_width, h, layer->qkv_bias, qkv,
                               qkv_width);
        const STACK_ELEM *q_source = qkv, *k_source = qkv + q;
        int64_t q_stride = qkv_width, k_stride = qkv_width;
        if (layer->q_norm) {
            for (int64_t r = 0; r < rows; r++) {
                status |= STACK_RMS_NORM(qkv + r * qkv_width, d, NULL, 0, layer->q_norm, s->eps, s->heads, d,
                                         NULL, q_normed + r * q);
                status |= STACK_RMS_NORM(qkv + r * qkv_width + q, d, NULL, 0, layer->k_norm, s->eps,
                                         s->kv_heads, d, NULL, k_normed + r * kv);
            }
            q_source = q_normed, k_source = k_normed, q_stride = q, k_stride = kv;
        }
        status |= STACK_ROPE(q_source, q_stride, s->heads, k_source, k_stride, s->kv_heads, rows, d, positions,
                             cos_sin, s->rot_dim, q_rotated, k_rotated);
        for (int64_t r = 0; r < rows; r++) {
            if (slots[r] == -1) continue;
            STACK_STORE_KV(k_cache + slots[r] * kv, k_rotated + r * kv, kv);
            STACK_STORE_KV(v_cache + slots[r] * kv, qkv + r * qkv_width + q + kv, kv);
        }
        status |= STACK_ATTENTION(q_rotated, rows, q, s->heads, d, k_cache, v_cache, s->kv_heads, block_tables,
                                  bt_stride, seq_lens, s->block_size, 0, layer->scale, 0.0f, attended);
        status |= STACK_LINEAR(attended, q, layer->o_proj, layer->o_proj_q4, h, q, NULL, hidden, h);
        status |= STACK_RMS_NORM(hidden, h, residual, h, layer->post_norm, s->eps, rows, h, residual, normed);
        status |= STACK_LINEAR(normed, h, layer->gate_up, layer->gate_up_q4, 2 * inter, h, NULL, gate_up,
                               2 * inter);
        status |= STACK_SILU_AND_MUL(gate_up, 2 * inter, rows, inter, activated);
        status |= STACK_LINEAR(activated, inter, layer->down, layer->down_q4, h, inter, NULL, hidden, h);
    }
    if (status == 0 && s->final_norm != NULL) {  /* the model's last norm, as its forward does */
        status |= STACK_RMS_NORM(hidden, h, residual, h, s->final_norm, s->eps, rows, h, residual, normed);
        memcpy(hidden, normed, (size_t)(rows * h) * sizeof(STACK_ELEM));
    }
#undef STACK_LINEAR
    return status == 0 ? 0 : -1;
}
