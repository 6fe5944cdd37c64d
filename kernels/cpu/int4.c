/* INT4 weights times a few rows of activations on the CPU (layout and contracts: int4.h;
 * what it shares with the INT8 kernel, int_dot.h).
 *
 * A decode step reads every weight once, so its cost is the weights' bytes: 4-bit weights
 * read a quarter of bf16's. What must not happen is to widen them in memory (a dequantised
 * copy per call costs more than the bf16 model). Here they widen only in registers: each
 * 64-byte chunk of a tile is 128 weights of 16 columns, split into low and high nibbles
 * (two masks and a shift) and fed, as unsigned bytes, to the integer dot product (AVX-512
 * VNNI's vpdpbusd: 64 byte products an instruction; AVX2's vpmaddubsw + vpmaddwd) against
 * the activations quantised to int8 per block of 32 k. Per block of 32 k the int32 dot is
 * scaled by the block's activation scale, per group the zero point comes off as one
 * product with the block sums (sum_k (q - z) x = sum_k q x - z sum_k x) and the group's
 * scale applies:
 *   y[n] = sum_g s[g, n] * (sum_{b in g} sx[b] * dot_b(q[., n], x8) - z[g, n] * X[g]).
 * The torch reference is kernels/reference/w4a16_gemm.py's `w4a16_gemm_q8_torch`: the
 * same x8 and sx bit for bit, y up to the order of fp32 sums. */
#include "int_dot.h"

#define CHUNK 64         /* bytes of a chunk: 8 k of the tile's 16 columns */
#define PARAMS 64        /* bytes of a group's parameters in a tile */

int kvdeck_q4_isa(void) { return INT_DOT_ISA; }

int64_t kvdeck_q4_tile_bytes(int64_t k, int64_t group) {
    return (k / group) * (PARAMS + (group / 8) * CHUNK);
}

int64_t kvdeck_q4_scratch_bytes(int64_t rows, int64_t k, int64_t group) {
    return rows * row_scratch_bytes(k, group) + 64;
}

#if INT_DOT_ISA == 2
/* One tile against ROWS rows: y[r] (16 columns) = the tile's product with row r. */
#define DEFINE_TILE(ROWS)                                                                          \
    static void tile_##ROWS(const uint8_t* tile, int64_t k, int64_t group, const q8_row* rows,      \
                            float* y /* [ROWS][16] */) {                                            \
        const __m512i low = _mm512_set1_epi8(0x0f);                                                 \
        __m512 acc[ROWS];                                                                           \
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();                                \
        const uint8_t* p = tile;                                                                    \
        for (int64_t g = 0; g < k / group; g++, p += PARAMS) {                                      \
            const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));            \
            const __m512 zero = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(                            \
                _mm_loadu_si128((const __m128i*)(p + 32))));                                        \
            __m512 in_group[ROWS];                                                                  \
            for (int r = 0; r < ROWS; r++) in_group[r] = _mm512_setzero_ps();                       \
            for (int64_t kb = g * group; kb < (g + 1) * group; kb += KVDECK_Q8_BLOCK) {             \
                const uint8_t* chunks = p + PARAMS + (kb - g * group) / 8 * CHUNK;                  \
                __m512i w[8];                                                                       \
                for (int c = 0; c < 4; c++) {                                                       \
                    const __m512i v = _mm512_loadu_si512(chunks + c * CHUNK);                       \
                    w[2 * c] = _mm512_and_si512(v, low);                                            \
                    w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);                  \
                }                                                                                   \
                for (int r = 0; r < ROWS; r++) {                                                    \
                    const int8_t* x8 = rows[r].x8 + kb;                                             \
                    __m512i dot0 = _mm512_setzero_si512(), dot1 = _mm512_setzero_si512();           \
                    for (int c = 0; c < 4; c++) {                                                   \
                        dot0 = _mm512_dpbusd_epi32(dot0, w[2 * c], _mm512_set1_epi32(load_i32(x8 + 8 * c))); \
                        dot1 = _mm512_dpbusd_epi32(dot1, w[2 * c + 1],                               \
                                                   _mm512_set1_epi32(load_i32(x8 + 8 * c + 4)));     \
                    }                                                                               \
                    in_group[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dot0, dot1)),  \
                                                  _mm512_set1_ps(rows[r].sx[kb / KVDECK_Q8_BLOCK]),   \
                                                  in_group[r]);                                     \
                }                                                                                   \
            }                                                                                       \
            p += (group / 8) * CHUNK;                                                               \
            for (int r = 0; r < ROWS; r++)                                                          \
                acc[r] = _mm512_fmadd_ps(                                                           \
                    scale, _mm512_fnmadd_ps(zero, _mm512_set1_ps(rows[r].xg[g]), in_group[r]), acc[r]); \
        }                                                                                           \
        for (int r = 0; r < ROWS; r++) _mm512_storeu_ps(y + r * TILE, acc[r]);                      \
    }
#elif INT_DOT_ISA == 1
/* AVX2: each 64-byte chunk as two halves of 8 columns; vpmaddubsw sums byte pairs into
 * int16 (at most 2 * 15 * 127, no saturation), vpmaddwd with ones sums those into int32. */
static inline __m256i dot_u8_s8(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

#define DEFINE_TILE(ROWS)                                                                          \
    static void tile_##ROWS(const uint8_t* tile, int64_t k, int64_t group, const q8_row* rows,      \
                            float* y /* [ROWS][16] */) {                                            \
        const __m256i low = _mm256_set1_epi8(0x0f);                                                 \
        __m256 acc[ROWS][2];                                                                        \
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();                 \
        const uint8_t* p = tile;                                                                    \
        for (int64_t g = 0; g < k / group; g++, p += PARAMS) {                                      \
            __m256 scale[2], zero[2];                                                               \
            for (int h = 0; h < 2; h++) {                                                           \
                scale[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16 * h)));          \
                zero[h] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(                                  \
                    _mm_loadl_epi64((const __m128i*)(p + 32 + 8 * h))));                            \
            }                                                                                       \
            __m256 in_group[ROWS][2];                                                               \
            for (int r = 0; r < ROWS; r++) in_group[r][0] = in_group[r][1] = _mm256_setzero_ps();   \
            for (int64_t kb = g * group; kb < (g + 1) * group; kb += KVDECK_Q8_BLOCK) {             \
                const uint8_t* chunks = p + PARAMS + (kb - g * group) / 8 * CHUNK;                  \
                for (int h = 0; h < 2; h++) {                                                       \
                    __m256i w[8];                                                                   \
                    for (int c = 0; c < 4; c++) {                                                   \
                        const __m256i v = _mm256_loadu_si256((const __m256i*)(chunks + c * CHUNK + 32 * h)); \
                        w[2 * c] = _mm256_and_si256(v, low);                                        \
                        w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);              \
                    }                                                                               \
                    for (int r = 0; r < ROWS; r++) {                                                \
                        const int8_t* x8 = rows[r].x8 + kb;                                         \
                        __m256i dot = _mm256_setzero_si256();                                       \
                        for (int c = 0; c < 4; c++) {                                               \
                            dot = _mm256_add_epi32(dot, dot_u8_s8(w[2 * c], _mm256_set1_epi32(load_i32(x8 + 8 * c)))); \
                            dot = _mm256_add_epi32(dot, dot_u8_s8(w[2 * c + 1],                      \
                                                                  _mm256_set1_epi32(load_i32(x8 + 8 * c + 4)))); \
                        }                                                                           \
                        in_group[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),                    \
                                                         _mm256_set1_ps(rows[r].sx[kb / KVDECK_Q8_BLOCK]), \
                                                         in_group[r][h]);                           \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
            p += (group / 8) * CHUNK;                                                               \
            for (int r = 0; r < ROWS; r++)                                                          \
                for (int h = 0; h < 2; h++)                                                         \
                    acc[r][h] = _mm256_fmadd_ps(                                                    \
                        scale[h], _mm256_fnmadd_ps(zero[h], _mm256_set1_ps(rows[r].xg[g]), in_group[r][h]), \
                        acc[r][h]);                                                                 \
        }                                                                                           \
        for (int r = 0; r < ROWS; r++)                                                              \
            for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + r * TILE + 8 * h, acc[r][h]);          \
    }
#endif

DEFINE_TILES

int kvdeck_q4_gemm_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, const kvdeck_q4_weight* w,
                        const uint16_t* bias, uint16_t* y, int64_t y_stride, void* scratch) {
    return int_dot_gemm(TILES, w->data, kvdeck_q4_tile_bytes(w->k, w->group), w->n, w->k, w->group, x,
                        sizeof(uint16_t), rows, x_stride, quantize_row_bf16, bias, y, y_stride, store_bf16, scratch);
}

int kvdeck_q4_gemm_f32(const float* x, int64_t rows, int64_t x_stride, const kvdeck_q4_weight* w,
                       const float* bias, float* y, int64_t y_stride, void* scratch) {
    return int_dot_gemm(TILES, w->data, kvdeck_q4_tile_bytes(w->k, w->group), w->n, w->k, w->group, x,
                        sizeof(float), rows, x_stride, quantize_row_f32, bias, y, y_stride, store_f32, scratch);
}

int kvdeck_q4_dequantize_f32(const kvdeck_q4_weight* w, float* out) {
    if (w->data == NULL || w->n < 1 || w->group < KVDECK_Q8_BLOCK || w->group % KVDECK_Q8_BLOCK
        || w->k % w->group)
        return -1;
    const int64_t tiles = (w->n + TILE - 1) / TILE, tile_bytes = kvdeck_q4_tile_bytes(w->k, w->group);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const uint8_t* p = w->data + t * tile_bytes;
        for (int64_t g = 0; g < w->k / w->group; g++) {
            const uint16_t* scales = (const uint16_t*)p;
            const uint8_t* zeros = p + 32;
            const uint8_t* chunks = p + PARAMS;
            for (int64_t j = 0; j < TILE && t * TILE + j < w->n; j++) {
                const float scale = half_value(scales[j]);
                float* row = out + (t * TILE + j) * w->k + g * w->group;
                for (int64_t kk = 0; kk < w->group; kk++) {
                    const uint8_t byte = chunks[(kk / 8) * CHUNK + 4 * j + (kk % 8) % 4];
                    const int q = (kk % 8) < 4 ? (byte & 0x0f) : (byte >> 4);
                    row[kk] = (float)(q - zeros[j]) * scale;
                }
            }
            p += PARAMS + (w->group / 8) * CHUNK;
        }
    }
    return 0;
}
