/* The entry points of cpu_native.c (bf16) and cpu_native_f32.c (fp32), for the decoder
 * stack that composes them (cpu_decode_stack.c). The bf16 kernels take bf16 as uint16_t
 * unless a pointer is named otherwise; each returns 0, or -1 when this build cannot run
 * it. Contracts: the comments in cpu_native.c; the fp32 twins keep them. */
#ifndef KVDECK_CPU_NATIVE_H
#define KVDECK_CPU_NATIVE_H
#include <stdint.h>

/* 1 when this build has the AVX512-BF16 path (the Python side uses nothing else). */
int kvdeck_gemv_native(void);
int kvdeck_gemv_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, const uint16_t* w,
                     int64_t n_len, int64_t k_len, const uint16_t* bias, uint16_t* y,
                     int64_t y_stride);
int kvdeck_decode_attention_bf16(const uint16_t* q, int64_t rows, int64_t q_stride, int64_t heads,
                                 int64_t dim, const uint16_t* k_cache, const uint16_t* v_cache,
                                 int64_t kv_heads, const int32_t* block_tables, int64_t bt_stride,
                                 const int32_t* seq_lens, int64_t block_size, int64_t window,
                                 float scale, float soft_cap, uint16_t* out);
int kvdeck_rms_norm_bf16(const uint16_t* x, int64_t x_stride, const uint16_t* residual,
                         int64_t residual_stride, const uint16_t* weight, float eps, int64_t rows,
                         int64_t n, uint16_t* summed, uint16_t* out);
int kvdeck_silu_and_mul_bf16(const uint16_t* x, int64_t x_stride, int64_t rows, int64_t d,
                             uint16_t* out);
int kvdeck_rope_neox_bf16(const uint16_t* q, int64_t q_stride, int64_t q_heads, const uint16_t* k,
                          int64_t k_stride, int64_t k_heads, int64_t tokens, int64_t dim,
                          const int64_t* positions, const float* cos_sin, int64_t rot_dim,
                          uint16_t* q_out, uint16_t* k_out);

int kvdeck_gemv_f32(const float* x, int64_t rows, int64_t x_stride, const float* w, int64_t n_len,
                    int64_t k_len, const float* bias, float* y, int64_t y_stride);
int kvdeck_decode_attention_f32(const float* q, int64_t rows, int64_t q_stride, int64_t heads, int64_t dim,
                                const float* k_cache, const float* v_cache, int64_t kv_heads,
                                const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                                int64_t block_size, int64_t window, float scale, float soft_cap, float* out);
int kvdeck_decode_attention_f32_f16kv(const float* q, int64_t rows, int64_t q_stride, int64_t heads, int64_t dim,
                                      const uint16_t* k_cache, const uint16_t* v_cache, int64_t kv_heads,
                                      const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                                      int64_t block_size, int64_t window, float scale, float soft_cap, float* out);
void kvdeck_store_f16(uint16_t* out, const float* values, int64_t count);
int kvdeck_rms_norm_f32(const float* x, int64_t x_stride, const float* residual, int64_t residual_stride,
                        const float* weight, float eps, int64_t rows, int64_t n, float* summed, float* out);
int kvdeck_silu_and_mul_f32(const float* x, int64_t x_stride, int64_t rows, int64_t d, float* out);
int kvdeck_rope_neox_f32(const float* q, int64_t q_stride, int64_t q_heads, const float* k, int64_t k_stride,
                         int64_t k_heads, int64_t tokens, int64_t dim, const int64_t* positions,
                         const float* cos_sin, int64_t rot_dim, float* q_out, float* k_out);

#endif
