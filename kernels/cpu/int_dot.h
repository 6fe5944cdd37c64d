/* What the integer-dot-product kernels share (int4.c, int8.c): which SIMD they run on, the
 * activations quantised to int8 per block of 32 on the way in (as llama.cpp's Q8 dot
 * products do), and the driver that runs a weight's tiles against a few rows of them.
 *
 * Activation quantisation (KVDECK_Q8_BLOCK values): amax = max |x|, sx = amax / 127,
 * x8 = round-half-even(x * (127 / amax)) (0 where amax is 0): the same operations as the
 * torch reference (kernels/reference/w4a16_gemm.py's `quantize_activations_q8`), so x8 and
 * sx are bit for bit its own. Per group of `group` k (a multiple of 32) the row also keeps
 * X[g] = sum_{b in g} sx[b] * sum(x8 in b), which takes a zero point (or an offset) off a
 * group's dot in one product.
 *
 * A weight is a run of tiles of 16 output columns; threads (OpenMP, torch's pool) take
 * contiguous runs of tiles, one sequential weight stream each, and each tile takes the rows
 * four at a time (its weights widened once for the four), further rows again through the
 * same tile, from the core's cache. Everything here is static: each kernel file has its own. */
#ifndef KVDECK_INT_DOT_H
#define KVDECK_INT_DOT_H
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "int4.h"
#include "simd.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define INT_DOT_ISA 2
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define INT_DOT_ISA 1
#else
#define INT_DOT_ISA 0
#endif
#if INT_DOT_ISA
#include <immintrin.h>
#endif

#define TILE 16          /* output columns of a tile */
#define ROW_BLOCK 4      /* rows a tile takes at once */

/* One row's quantised activations inside the scratch. */
typedef struct {
    const int8_t* x8;  /* [k] */
    const float* sx;   /* [k / 32]: each block's scale */
    const float* xg;   /* [k / group]: X[g] */
} q8_row;

static inline int64_t row_scratch_bytes(int64_t k, int64_t group) {
    const int64_t bytes = k + (int64_t)sizeof(float) * (k / KVDECK_Q8_BLOCK + k / group);
    return (bytes + 63) & ~(int64_t)63;
}

static inline float bf16_value(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline float half_value(uint16_t h) {  /* IEEE fp16 -> fp32, exactly */
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float magnitude;
    if (exponent == 0) magnitude = ldexpf((float)mantissa, -24);                      /* subnormal */
    else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
    else magnitude = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    uint32_t bits;
    memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t to_bf16(float value) {  /* round to nearest even, as torch */
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* A block's x8 and sum from its 32 values (fp32) and their largest magnitude. */
static inline int32_t quantize_block(const float* values, float amax, int8_t* x8) {
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
#if INT_DOT_ISA == 2
    for (int h = 0; h < KVDECK_Q8_BLOCK; h += 16) {
        /* vcvtps2dq rounds half to even (the default rounding mode), as torch.round */
        const __m512i q = _mm512_max_epi32(_mm512_set1_epi32(-127), _mm512_min_epi32(_mm512_set1_epi32(127),
            _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(values + h), _mm512_set1_ps(inverse)))));
        _mm_storeu_si128((__m128i*)(x8 + h), _mm512_cvtepi32_epi8(q));
        sum += _mm512_reduce_add_epi32(q);
    }
#else
    for (int i = 0; i < KVDECK_Q8_BLOCK; i++) {
        const int32_t q = (int32_t)fminf(127.0f, fmaxf(-127.0f, nearbyintf(values[i] * inverse)));
        x8[i] = (int8_t)q;
        sum += q;
    }
#endif
    return sum;
}

static inline float block_amax(const float* values) {
#if INT_DOT_ISA == 2
    const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(values)), b = _mm512_abs_ps(_mm512_loadu_ps(values + 16));
    return _mm512_reduce_max_ps(_mm512_max_ps(a, b));
#else
    float amax = 0.0f;
    for (int i = 0; i < KVDECK_Q8_BLOCK; i++) amax = fmaxf(amax, fabsf(values[i]));
    return amax;
#endif
}

/* x (k values, widened to fp32 by WIDEN) -> x8, sx, xg in `out`'s scratch. */
#define DEFINE_QUANTIZE_ROW(NAME, ELEM, WIDEN)                                                    \
    static void NAME(const void* xv, int64_t k, int64_t group, char* scratch, q8_row* out) {    \
        const ELEM* x = xv;                                                                     \
        int8_t* x8 = (int8_t*)scratch;                                                          \
        float* sx = (float*)(scratch + k);                                                      \
        float* xg = sx + k / KVDECK_Q8_BLOCK;                                                   \
        const int64_t blocks_per_group = group / KVDECK_Q8_BLOCK;                               \
        for (int64_t b = 0; b < k / KVDECK_Q8_BLOCK; b++) {                                     \
            float values[KVDECK_Q8_BLOCK];                                                      \
            WIDEN(x + b * KVDECK_Q8_BLOCK, values);                                             \
            const float amax = block_amax(values);                                              \
            const int32_t sum = quantize_block(values, amax, x8 + b * KVDECK_Q8_BLOCK);         \
            sx[b] = amax / 127.0f;                                                              \
            if (b % blocks_per_group == 0) xg[b / blocks_per_group] = 0.0f;                     \
            xg[b / blocks_per_group] += sx[b] * (float)sum;                                     \
        }                                                                                       \
        out->x8 = x8, out->sx = sx, out->xg = xg;                                               \
    }

static inline void widen_bf16(const uint16_t* x, float* values) {
#if INT_DOT_ISA == 2
    for (int h = 0; h < KVDECK_Q8_BLOCK; h += 16)
        _mm512_storeu_ps(values + h, _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(x + h))), 16)));
#else
    for (int i = 0; i < KVDECK_Q8_BLOCK; i++) values[i] = bf16_value(x[i]);
#endif
}

static inline void widen_f32(const float* x, float* values) { memcpy(values, x, KVDECK_Q8_BLOCK * sizeof(float)); }

DEFINE_QUANTIZE_ROW(quantize_row_bf16, uint16_t, widen_bf16)
DEFINE_QUANTIZE_ROW(quantize_row_f32, float, widen_f32)

/* Four int8 activations as one int32, read in place (a broadcast from memory, not a move
 * through a general register). */
typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;
static inline int32_t load_i32(const int8_t* p) { return *(const unaligned_i32*)p; }


/* A tile against `rows` rows (1..ROW_BLOCK, the table's index): y[r][16] = the tile's
 * product with row r, in fp32. */
typedef void (*tile_fn)(const uint8_t* tile, int64_t k, int64_t group, const q8_row* rows, float* y);
/* A kernel file's tiles for 1..ROW_BLOCK rows (from its DEFINE_TILE(ROWS)) and their table,
 * indexed by the row count; an empty table where there is no integer dot product. */
#if INT_DOT_ISA
#define DEFINE_TILES                                                                                 \
    DEFINE_TILE(1)                                                                                   \
    DEFINE_TILE(2)                                                                                   \
    DEFINE_TILE(3)                                                                                   \
    DEFINE_TILE(4)                                                                                   \
    static const tile_fn TILES[ROW_BLOCK + 1] = {0, tile_1, tile_2, tile_3, tile_4};
#else
#define DEFINE_TILES static const tile_fn TILES[ROW_BLOCK + 1] = {0};
#endif
/* A row's 16 (or fewer, the last tile's) results, plus the bias, into y. */
typedef void (*store_fn)(void* y, int64_t y_stride, int64_t row, int64_t n0, int64_t count,
                         const float* values, const void* bias);
/* A row of x (of the kernel's element type) -> its q8_row in the scratch. */
typedef void (*quantize_fn)(const void* x, int64_t k, int64_t group, char* scratch, q8_row* out);

static void store_bf16(void* yv, int64_t y_stride, int64_t row, int64_t n0, int64_t count, const float* values,
                       const void* biasv) {
    uint16_t* y = (uint16_t*)yv + row * y_stride + n0;
    const uint16_t* bias = biasv;
#if INT_DOT_ISA == 2 && defined(__AVX512BF16__)
    if (count == TILE && bias == NULL) {  /* _mm512_cvtneps_pbh: round to nearest even, as to_bf16 */
        _mm256_storeu_si256((__m256i*)y, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(values)));
        return;
    }
#endif
    for (int64_t j = 0; j < count; j++) y[j] = to_bf16(values[j] + (bias ? bf16_value(bias[n0 + j]) : 0.0f));
}

static void store_f32(void* yv, int64_t y_stride, int64_t row, int64_t n0, int64_t count, const float* values,
                      const void* biasv) {
    float* y = (float*)yv + row * y_stride + n0;
    const float* bias = biasv;
    for (int64_t j = 0; j < count; j++) y[j] = values[j] + (bias ? bias[n0 + j] : 0.0f);
}


/* A weight's tiles (`data`, `tile_bytes` each, covering n columns) against x [rows, k]:
 * the rows quantised into `scratch` (or an allocation), then every tile against them. */
static int int_dot_gemm(const tile_fn tiles[ROW_BLOCK + 1], const uint8_t* data, int64_t tile_bytes, int64_t n,
                        int64_t k, int64_t group, const void* x, size_t element, int64_t rows, int64_t x_stride,
                        quantize_fn quantize, const void* bias, void* y, int64_t y_stride, store_fn store,
                        void* scratch) {
    if (!INT_DOT_ISA || rows < 1 || data == NULL || n < 1 || k < 1 || group < KVDECK_Q8_BLOCK
        || group % KVDECK_Q8_BLOCK || k % group)
        return -1;
    void* owned = NULL;
    if (scratch == NULL) {
        scratch = owned = malloc((size_t)(rows * row_scratch_bytes(k, group) + 64));
        if (scratch == NULL) return -1;
    }
    char* base = (char*)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    q8_row on_stack[64];
    q8_row* quantized = rows <= 64 ? on_stack : malloc(sizeof(q8_row) * (size_t)rows);
    if (quantized == NULL) {
        free(owned);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++)
        quantize((const char*)x + (size_t)(r * x_stride) * element, k, group,
                 base + r * row_scratch_bytes(k, group), &quantized[r]);
    const int64_t count = (n + TILE - 1) / TILE;
    const int threads = n * k >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
        float out[ROW_BLOCK * TILE];
        for (int64_t t = count * me / team; t < count * (me + 1) / team; t++) {
            const int64_t n0 = t * TILE, valid = n - n0 < TILE ? n - n0 : TILE;
            for (int64_t first = 0; first < rows; first += ROW_BLOCK) {
                const int64_t block = rows - first < ROW_BLOCK ? rows - first : ROW_BLOCK;
                tiles[block](data + t * tile_bytes, k, group, quantized + first, out);
                for (int64_t r = 0; r < block; r++) store(y, y_stride, first + r, n0, valid, out + r * TILE, bias);
            }
        }
    }
    if (quantized != on_stack) free(quantized);
    free(owned);
    return 0;
}

#endif
