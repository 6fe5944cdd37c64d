/* INT8 weights (llama.cpp's Q8_0 blocks) times a few rows of activations on the CPU (layout
 * and contracts: int8.h; the activation quantisation and the driver: int_dot.h).
 *
 * Per block of 32 k: y[n] += sw[b, n] * sx[b] * dot_b(w[., n], x8). The integer dot product
 * wants one operand unsigned: AVX-512 VNNI's vpdpbusd takes the weights as w + 128 (one xor
 * of the sign bit) and the offset comes off with the block's activation sum,
 * sum (w + 128) x = sum w x + 128 sum x; AVX2's vpmaddubsw takes |w| and x with w's sign
 * (llama.cpp's way: no pair of products then reaches int16's limit). The reference is
 * kernels/reference/int8_gemm.py's `int8_gemm_q8_torch`. */
#include "int_dot.h"
#include "int8.h"

#define CHUNK 64    /* bytes of a chunk: 4 k of the tile's 16 columns */
#define PARAMS 64   /* 16 fp16 scales for each of the 2 blocks of 32 k */

int64_t kvdeck_q8_tile_bytes(int64_t k) { return (k / KVDECK_Q8_TILE_K) * (PARAMS + 16 * CHUNK); }

#if INT_DOT_ISA == 2
#define DEFINE_TILE(ROWS)                                                                          \
    static void tile_##ROWS(const uint8_t* tile, int64_t k, int64_t group, const q8_row* rows,      \
                            float* y /* [ROWS][16] */) {                                            \
        (void)group;                                                                                \
        const __m512i sign = _mm512_set1_epi8((char)0x80);                                          \
        __m512 acc[ROWS];                                                                           \
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();                                \
        const uint8_t* p = tile;                                                                    \
        for (int64_t k0 = 0; k0 < k; k0 += KVDECK_Q8_TILE_K, p += PARAMS + 16 * CHUNK) {            \
            for (int half = 0; half < 2; half++) {                                                  \
                const int64_t b = (k0 + KVDECK_Q8_BLOCK * half) / KVDECK_Q8_BLOCK;                   \
                const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 32 * half))); \
                __m512i w[8];                                                                       \
                for (int c = 0; c < 8; c++)                                                         \
                    w[c] = _mm512_xor_si512(_mm512_loadu_si512(p + PARAMS + (8 * half + c) * CHUNK), sign); \
                for (int r = 0; r < ROWS; r++) {                                                    \
                    const int8_t* x8 = rows[r].x8 + b * KVDECK_Q8_BLOCK;                            \
                    __m512i dot0 = _mm512_setzero_si512(), dot1 = _mm512_setzero_si512();           \
                    for (int c = 0; c < 8; c += 2) {                                                \
                        dot0 = _mm512_dpbusd_epi32(dot0, w[c], _mm512_set1_epi32(load_i32(x8 + 4 * c))); \
                        dot1 = _mm512_dpbusd_epi32(dot1, w[c + 1], _mm512_set1_epi32(load_i32(x8 + 4 * c + 4))); \
                    }                                                                               \
                    /* sx * (dot - 128 sum x8) = sx dot - 128 X[b] (a group is a block here) */     \
                    const __m512 block = _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dot0, dot1)), \
                                                         _mm512_set1_ps(rows[r].sx[b]),              \
                                                         _mm512_set1_ps(128.0f * rows[r].xg[b]));    \
                    acc[r] = _mm512_fmadd_ps(scale, block, acc[r]);                                 \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < ROWS; r++) _mm512_storeu_ps(y + r * TILE, acc[r]);                      \
    }
#elif INT_DOT_ISA == 1
#define DEFINE_TILE(ROWS)                                                                          \
    static void tile_##ROWS(const uint8_t* tile, int64_t k, int64_t group, const q8_row* rows,      \
                            float* y /* [ROWS][16] */) {                                            \
        (void)group;                                                                                \
        const __m256i ones = _mm256_set1_epi16(1);                                                  \
        __m256 acc[ROWS][2];                                                                        \
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();                 \
        const uint8_t* p = tile;                                                                    \
        for (int64_t k0 = 0; k0 < k; k0 += KVDECK_Q8_TILE_K, p += PARAMS + 16 * CHUNK) {            \
            for (int half = 0; half < 2; half++) {                                                  \
                const int64_t b = (k0 + KVDECK_Q8_BLOCK * half) / KVDECK_Q8_BLOCK;                   \
                for (int h = 0; h < 2; h++) {                                                       \
                    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 32 * half + 16 * h))); \
                    __m256i w[8];                                                                   \
                    for (int c = 0; c < 8; c++)                                                     \
                        w[c] = _mm256_loadu_si256((const __m256i*)(p + PARAMS + (8 * half + c) * CHUNK + 32 * h)); \
                    for (int r = 0; r < ROWS; r++) {                                                \
                        const int8_t* x8 = rows[r].x8 + b * KVDECK_Q8_BLOCK;                        \
                        __m256i dot = _mm256_setzero_si256();                                       \
                        for (int c = 0; c < 8; c++) {                                               \
                            const __m256i x = _mm256_set1_epi32(load_i32(x8 + 4 * c));              \
                            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(      \
                                _mm256_sign_epi8(w[c], w[c]), _mm256_sign_epi8(x, w[c])), ones));    \
                        }                                                                           \
                        acc[r][h] = _mm256_fmadd_ps(scale, _mm256_mul_ps(_mm256_cvtepi32_ps(dot),    \
                                                    _mm256_set1_ps(rows[r].sx[b])), acc[r][h]);      \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < ROWS; r++)                                                              \
            for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + r * TILE + 8 * h, acc[r][h]);          \
    }
#endif

DEFINE_TILES

int kvdeck_q8_gemm_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, const kvdeck_q8_weight* w,
                        uint16_t* y, int64_t y_stride, void* scratch) {
    if (w->k % KVDECK_Q8_TILE_K) return -1;
    return int_dot_gemm(TILES, w->data, kvdeck_q8_tile_bytes(w->k), w->n, w->k, KVDECK_Q8_BLOCK, x,
                        sizeof(uint16_t), rows, x_stride, quantize_row_bf16, NULL, y, y_stride, store_bf16, scratch);
}

int kvdeck_q8_gemm_f32(const float* x, int64_t rows, int64_t x_stride, const kvdeck_q8_weight* w, float* y,
                       int64_t y_stride, void* scratch) {
    if (w->k % KVDECK_Q8_TILE_K) return -1;
    return int_dot_gemm(TILES, w->data, kvdeck_q8_tile_bytes(w->k), w->n, w->k, KVDECK_Q8_BLOCK, x,
                        sizeof(float), rows, x_stride, quantize_row_f32, NULL, y, y_stride, store_f32, scratch);
}
