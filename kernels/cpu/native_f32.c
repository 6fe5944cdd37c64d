/* The fp32 twins of cpu_native.c's kernels, which the decoder stack (cpu_decode_stack.c)
 * composes for an fp32 model's decode steps: the GEMV of a few rows, decode attention over
 * the paged cache, RMSNorm with the residual, SiLU-and-mul and rotary.
 *
 * They compute the torch path's formulas (kernels/reference/rmsnorm.py, activation.py, rope.py,
 * attention.py) in fp32 with nothing rounded in between, so they differ from it only in
 * the order of the fp32 sums and the last bits of exp: a few units in the last place, as
 * two BLAS libraries differ. fp32 stays the comparison with transformers; the tests hold
 * this path to its greedy tokens.
 *
 * The GEMV streams each thread's band of weight rows front to back, as the bf16 one does,
 * with two accumulators a row so that the fp32 fused multiply-adds (four cycles each) do
 * not wait on one another. A row's sum runs in the same order whatever the number of rows
 * in the step: a token's result does not depend on what else is in the step. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#include "native.h"
#include "simd.h"

#if KVDECK_NATIVE
/* Weight rows n0..n1 against `rows` (<= 8) rows of x, the row count a compile-time constant
 * in each instance so that the accumulators stay in registers. */
#define DEFINE_BAND_F32(ROWS)                                                                     \
    static void band_f32_##ROWS(const void* xv, int64_t x_stride, const void* wv, const void* bv, void* yv, \
                                int64_t y_stride, int64_t n0, int64_t n1, int64_t k_len) {               \
        const float *x = xv, *w = wv, *bias = bv;                                                \
        float* y = yv;                                                                           \
        const int64_t k_pairs = k_len & ~(int64_t)31;                                            \
        for (int64_t n = n0; n < n1; n++) {                                                      \
            const float* row = w + n * k_len;                                                    \
            __m512 even[ROWS], odd[ROWS];                                                        \
            for (int m = 0; m < ROWS; m++) even[m] = odd[m] = _mm512_setzero_ps();              \
            int64_t k = 0;                                                                       \
            for (; k < k_pairs; k += 32) {                                                       \
                const __m512 w0 = _mm512_loadu_ps(row + k), w1 = _mm512_loadu_ps(row + k + 16);  \
                for (int m = 0; m < ROWS; m++) {                                                 \
                    even[m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * x_stride + k), even[m]); \
                    odd[m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * x_stride + k + 16), odd[m]); \
                }                                                                                \
            }                                                                                    \
            for (; k < k_len; k += 16) {                                                         \
                const __mmask16 lanes = lanes_from(k_len - k);                                   \
                const __m512 w0 = _mm512_maskz_loadu_ps(lanes, row + k);                         \
                for (int m = 0; m < ROWS; m++)                                                   \
                    even[m] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(lanes, x + m * x_stride + k), \
                                              even[m]);                                          \
            }                                                                                    \
            const float b = bias ? bias[n] : 0.0f;                                               \
            for (int m = 0; m < ROWS; m++)                                                       \
                y[m * y_stride + n] = _mm512_reduce_add_ps(_mm512_add_ps(even[m], odd[m])) + b;  \
        }                                                                                        \
    }
DEFINE_BAND_F32(1)
DEFINE_BAND_F32(2)
DEFINE_BAND_F32(3)
DEFINE_BAND_F32(4)
DEFINE_BAND_F32(5)
DEFINE_BAND_F32(6)
DEFINE_BAND_F32(7)
DEFINE_BAND_F32(8)

static const kvdeck_band_fn BANDS_F32[9] = {0, band_f32_1, band_f32_2, band_f32_3, band_f32_4, band_f32_5,
                                            band_f32_6, band_f32_7, band_f32_8};
#else
#define BANDS_F32 NULL
#endif

/* y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]): x [rows, k_len] (row stride x_stride), w
 * [n_len, k_len] contiguous, bias [n_len] or NULL, y [rows, n_len] (row stride y_stride). */
int kvdeck_gemv_f32(const float* x, int64_t rows, int64_t x_stride, const float* w, int64_t n_len,
                    int64_t k_len, const float* bias, float* y, int64_t y_stride) {
    /* fp32 weights are twice bf16's bytes a element: the same bytes make a thread worth it */
    const int threads = 2 * n_len * k_len >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
    return kvdeck_gemv_rows(BANDS_F32, sizeof(float), x, rows, x_stride, w, n_len, k_len, bias, y, y_stride,
                            threads);
}

#if KVDECK_NATIVE
/* The caches' element formats the attention reads. */
enum { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2 };

/* Sixteen cache elements from `index` (the lanes in `lanes`; the others 0) as fp32: fp32
 * elements, fp16 ones (an fp32 model's 16-bit cache, llama.cpp's default) or bf16 ones (a
 * bf16 model's cache). Each widening is exact. */
static inline __m512 load_kv(const void* cache, int64_t index, __mmask16 lanes, int format) {
    const uint16_t* halves = (const uint16_t*)cache + index;
    if (format == KV_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, halves));
    if (format == KV_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, halves)),
                                                     16));
    return _mm512_maskz_loadu_ps(lanes, (const float*)cache + index);
}

/* Up to HEAD_TILE query heads of one row (`heads` of them, from first_head; head h reads kv
 * head h / group) over the row's keys, each with cpu_native.c's online softmax over tiles
 * of sixteen keys. One walk over a key's slot serves every head of the tile, and a kv
 * head's key and value are widened once for the heads of its group that follow each other
 * in the tile (tiles hold whole groups where they fit: kvdeck_attention_rows), the tile's
 * positions step through the block table without a division a key, and a head's sixteen
 * scores are summed across lanes together (sum_lanes16) rather than one reduction a key.
 * Inlined into instances where `heads` and `chunks` are constants, so that the
 * accumulators, the query and the scores' vectors stay in registers (runtime counts left
 * them in memory, twice as slow). */
static inline __attribute__((always_inline)) void attend_heads_f32(
    const float* query, int64_t first_head, int64_t heads, int64_t group, const void* k_cache,
    const void* v_cache, const int32_t* table, int64_t first, int64_t len, int64_t block_size, int64_t kv_heads,
    int64_t dim, int64_t chunks, int format, float scale, float soft_cap, float* result) {
    __mmask16 lanes[MAX_HEAD_DIM / 16];
    for (int64_t c = 0; c < chunks; c++) lanes[c] = lanes_from(dim - c * 16);
    __m512 acc[HEAD_TILE][MAX_HEAD_DIM / 16], qv[HEAD_TILE][MAX_HEAD_DIM / 16];
    float running_max[HEAD_TILE], denominator[HEAD_TILE];
    int64_t kv_offset[HEAD_TILE];
    for (int64_t g = 0; g < heads; g++) {
        running_max[g] = -INFINITY, denominator[g] = 0.0f;
        kv_offset[g] = (first_head + g) / group * dim;
        for (int64_t c = 0; c < chunks; c++) {
            acc[g][c] = _mm512_setzero_ps();
            qv[g][c] = _mm512_maskz_loadu_ps(lanes[c], query + g * dim + c * 16);
        }
    }
    int64_t block = first / block_size, in_block = first % block_size;
    for (int64_t p0 = first; p0 < len; p0 += KEY_TILE) {
        const int64_t count = len - p0 < KEY_TILE ? len - p0 : KEY_TILE;
        int64_t slots[KEY_TILE];  /* each key's slot, in elements */
        for (int64_t j = 0; j < count; j++) {
            slots[j] = ((int64_t)table[block] * block_size + in_block) * kv_heads * dim;
            if (++in_block == block_size) in_block = 0, block++;
        }
        __m512 dots[HEAD_TILE][KEY_TILE];
        for (int64_t j = 0; j < KEY_TILE; j++) {
            __m512 key[MAX_HEAD_DIM / 16];
            for (int64_t g = 0; g < heads; g++) {
                __m512 dot = _mm512_setzero_ps();
                if (j < count) {
                    if (g == 0 || kv_offset[g] != kv_offset[g - 1])  /* a kv head's key widened once */
                        for (int64_t c = 0; c < chunks; c++)
                            key[c] = load_kv(k_cache, slots[j] + kv_offset[g] + c * 16, lanes[c], format);
                    for (int64_t c = 0; c < chunks; c++) dot = _mm512_fmadd_ps(qv[g][c], key[c], dot);
                }
                dots[g][j] = dot;
            }
        }
        float weight[HEAD_TILE][KEY_TILE];
        for (int64_t g = 0; g < heads; g++) {
            float scores[KEY_TILE];
            _mm512_storeu_ps(scores, _mm512_mul_ps(sum_lanes16(dots[g]), _mm512_set1_ps(scale)));
            if (soft_cap > 0.0f)
                for (int64_t j = 0; j < count; j++) scores[j] = soft_cap * tanhf(scores[j] / soft_cap);
            softmax_tile(scores, count, &running_max[g], &denominator[g], acc[g], chunks, weight[g]);
        }
        for (int64_t j = 0; j < count; j++) {
            __m512 value[MAX_HEAD_DIM / 16];
            for (int64_t g = 0; g < heads; g++) {
                const __m512 w = _mm512_set1_ps(weight[g][j]);
                if (g == 0 || kv_offset[g] != kv_offset[g - 1])
                    for (int64_t c = 0; c < chunks; c++)
                        value[c] = load_kv(v_cache, slots[j] + kv_offset[g] + c * 16, lanes[c], format);
                for (int64_t c = 0; c < chunks; c++) acc[g][c] = _mm512_fmadd_ps(w, value[c], acc[g][c]);
            }
        }
    }
    for (int64_t g = 0; g < heads; g++) {
        const __m512 inverse = _mm512_set1_ps(denominator[g] > 0.0f ? 1.0f / denominator[g] : 0.0f);
        for (int64_t c = 0; c < chunks; c++)
            _mm512_mask_storeu_ps(result + g * dim + c * 16, lanes[c], _mm512_mul_ps(acc[g][c], inverse));
    }
}

#define ATTEND_HEADS_F32(HEADS, CHUNKS, FORMAT)                                                            \
    static void attend_##HEADS##_##CHUNKS##_##FORMAT(const float* q, int64_t h0, int64_t group, const void* k, \
                                                   const void* v, const int32_t* t, int64_t first, int64_t len, \
                                                   int64_t bs, int64_t kvh, int64_t dim, float scale, float cap, \
                                                   float* out) {                                            \
        attend_heads_f32(q, h0, HEADS, group, k, v, t, first, len, bs, kvh, dim, CHUNKS, FORMAT, scale, cap, out); \
    }
#define ATTEND_SHAPES(FORMAT)                                                                                \
    ATTEND_HEADS_F32(1, 4, FORMAT) ATTEND_HEADS_F32(2, 4, FORMAT) ATTEND_HEADS_F32(3, 4, FORMAT)             \
    ATTEND_HEADS_F32(4, 4, FORMAT) ATTEND_HEADS_F32(1, 8, FORMAT) ATTEND_HEADS_F32(2, 8, FORMAT)             \
    ATTEND_HEADS_F32(3, 8, FORMAT) ATTEND_HEADS_F32(4, 8, FORMAT)
ATTEND_SHAPES(0)
ATTEND_SHAPES(1)
ATTEND_SHAPES(2)

/* One (row, tile of heads) through the instance for its shape: 64- and 128-dim heads (4
 * and 8 vectors) in tiles of 1 to 4 heads; other shapes run the same code with runtime
 * counts. `format`: the caches' elements (KV_F32, KV_F16, KV_BF16). */
static inline __attribute__((always_inline)) void attend_tile(
    const void* query_, int64_t first_head, int64_t heads, int64_t group, const void* k, const void* v,
    const int32_t* table, int64_t first, int64_t len, int64_t block_size, int64_t kv_heads, int64_t dim, float scale,
    float soft_cap, void* result_, int format) {
    const float* q = query_;
    float* out = result_;
    const int64_t chunks = (dim + 15) / 16;
    switch (chunks == 4 || chunks == 8 ? heads * 100 + chunks : 0) {
#define CASE(HEADS, CHUNKS)                                                                                      \
    case HEADS * 100 + CHUNKS:                                                                                   \
        if (format == KV_F16)                                                                                    \
            attend_##HEADS##_##CHUNKS##_1(q, first_head, group, k, v, table, first, len, block_size, kv_heads,   \
                                          dim, scale, soft_cap, out);                                            \
        else if (format == KV_BF16)                                                                              \
            attend_##HEADS##_##CHUNKS##_2(q, first_head, group, k, v, table, first, len, block_size, kv_heads,   \
                                          dim, scale, soft_cap, out);                                            \
        else                                                                                                     \
            attend_##HEADS##_##CHUNKS##_0(q, first_head, group, k, v, table, first, len, block_size, kv_heads,   \
                                          dim, scale, soft_cap, out);                                            \
        break;
        CASE(1, 4) CASE(2, 4) CASE(3, 4) CASE(4, 4) CASE(1, 8) CASE(2, 8) CASE(3, 8) CASE(4, 8)
#undef CASE
        default:
            attend_heads_f32(q, first_head, heads, group, k, v, table, first, len, block_size, kv_heads, dim, chunks,
                             format, scale, soft_cap, out);
    }
}

static void attend_tile_f32(const void* query, int64_t first_head, int64_t heads, int64_t group, const void* k,
                            const void* v, const int32_t* table, int64_t first, int64_t len, int64_t block_size,
                            int64_t kv_heads, int64_t dim, float scale, float soft_cap, void* result) {
    attend_tile(query, first_head, heads, group, k, v, table, first, len, block_size, kv_heads, dim, scale,
                soft_cap, result, KV_F32);
}

static void attend_tile_f32_f16kv(const void* query, int64_t first_head, int64_t heads, int64_t group,
                                  const void* k, const void* v, const int32_t* table, int64_t first, int64_t len,
                                  int64_t block_size, int64_t kv_heads, int64_t dim, float scale, float soft_cap,
                                  void* result) {
    attend_tile(query, first_head, heads, group, k, v, table, first, len, block_size, kv_heads, dim, scale,
                soft_cap, result, KV_F16);
}

/* A bf16 model's tile: its query widened to fp32 (exact), the fp32 tile over the bf16
 * caches, the result rounded to bf16 once (round to nearest even). */
void kvdeck_attend_tile_bf16(const void* query, int64_t first_head, int64_t heads, int64_t group, const void* k,
                             const void* v, const int32_t* table, int64_t first, int64_t len, int64_t block_size,
                             int64_t kv_heads, int64_t dim, float scale, float soft_cap, void* result) {
    float wide[HEAD_TILE * MAX_HEAD_DIM], out[HEAD_TILE * MAX_HEAD_DIM];
    const uint16_t* q = query;
    for (int64_t i = 0; i < heads * dim; i += 16) {
        const __mmask16 m = lanes_from(heads * dim - i);
        _mm512_mask_storeu_ps(wide + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, q + i)), 16)));
    }
    attend_tile(wide, first_head, heads, group, k, v, table, first, len, block_size, kv_heads, dim, scale, soft_cap,
                out, KV_BF16);
    for (int64_t i = 0; i < heads * dim; i += 16) {
        const __mmask16 m = lanes_from(heads * dim - i);
        _mm256_mask_storeu_epi16((uint16_t*)result + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, out + i)));
    }
}
#define ATTEND_TILE_F32 attend_tile_f32
#define ATTEND_TILE_F32_F16KV attend_tile_f32_f16kv
#else /* kvdeck_attention_rows refuses: this build has no AVX-512 path */
#define ATTEND_TILE_F32 NULL
#define ATTEND_TILE_F32_F16KV NULL
#endif

/* kvdeck_decode_attention_bf16's contract (cpu_native.c) for fp32 q, caches and out. */
int kvdeck_decode_attention_f32(const float* q, int64_t rows, int64_t q_stride, int64_t heads, int64_t dim,
                                const float* k_cache, const float* v_cache, int64_t kv_heads,
                                const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                                int64_t block_size, int64_t window, float scale, float soft_cap, float* out) {
    return kvdeck_attention_rows(ATTEND_TILE_F32, HEAD_TILE, sizeof(float), q, rows, q_stride, heads, dim, k_cache,
                                 v_cache, kv_heads, block_tables, bt_stride, seq_lens, block_size, window, scale,
                                 soft_cap, out);
}

/* The same over fp16 caches (an fp32 model's 16-bit KV cache, kv_cache_dtype float16): q and
 * out fp32, the keys and values widened from fp16 as they are read. */
int kvdeck_decode_attention_f32_f16kv(const float* q, int64_t rows, int64_t q_stride, int64_t heads, int64_t dim,
                                      const uint16_t* k_cache, const uint16_t* v_cache, int64_t kv_heads,
                                      const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                                      int64_t block_size, int64_t window, float scale, float soft_cap, float* out) {
    return kvdeck_attention_rows(ATTEND_TILE_F32_F16KV, HEAD_TILE, sizeof(float), q, rows, q_stride, heads, dim,
                                 k_cache, v_cache, kv_heads, block_tables, bt_stride, seq_lens, block_size, window,
                                 scale, soft_cap, out);
}

/* count fp32 values as fp16 (round to nearest even, as torch's .to(float16)) at `out`: a key
 * or value row into an fp32 model's fp16 cache. */
void kvdeck_store_f16(uint16_t* out, const float* values, int64_t count) {
#if KVDECK_NATIVE
    for (int64_t i = 0; i < count; i += 16) {
        const __mmask16 lanes = lanes_from(count - i);
        _mm256_mask_storeu_epi16(out + i, lanes,
                                 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(lanes, values + i), _MM_FROUND_TO_NEAREST_INT));
    }
#else
    (void)out, (void)values, (void)count;
#endif
}

/* out = weight * (v * 1 / sqrt(mean(v^2) + eps)), v = x, or with a residual v = x + residual,
 * which is also written to `summed` (the next residual). Strides as kvdeck_rms_norm_bf16. */
int kvdeck_rms_norm_f32(const float* x, int64_t x_stride, const float* residual, int64_t residual_stride,
                        const float* weight, float eps, int64_t rows, int64_t n, float* summed, float* out) {
#if KVDECK_NATIVE
    const int threads = rows * n >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * x_stride;
        float* sr = summed + r * n;
        __m512 squares = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = lanes_from(n - i);
            __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
            if (residual) {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, residual + r * residual_stride + i));
                _mm512_mask_storeu_ps(sr + i, m, v);
            }
            squares = _mm512_fmadd_ps(v, v, squares);
        }
        const __m512 scale = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(squares) / (float)n + eps));
        const float* source = residual ? sr : xr;
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = lanes_from(n - i);
            const __m512 normed = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, source + i), scale);
            _mm512_mask_storeu_ps(out + r * n + i, m, _mm512_mul_ps(normed, _mm512_maskz_loadu_ps(m, weight + i)));
        }
    }
    return 0;
#else
    (void)x; (void)x_stride; (void)residual; (void)residual_stride; (void)weight; (void)eps; (void)rows;
    (void)n; (void)summed; (void)out;
    return -1;
#endif
}

/* out [rows, d] = silu(gate) * up, silu(g) = g / (1 + e^-g); x [rows, 2d] holds gate | up. */
int kvdeck_silu_and_mul_f32(const float* x, int64_t x_stride, int64_t rows, int64_t d, float* out) {
#if KVDECK_NATIVE
    const int threads = rows * d >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float* gate = x + r * x_stride;
        const float* up = gate + d;
        for (int64_t i = 0; i < d; i += 16) {
            const __mmask16 m = lanes_from(d - i);
            const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
            const __m512 silu = _mm512_div_ps(
                g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
            _mm512_mask_storeu_ps(out + r * d + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
        }
    }
    return 0;
#else
    (void)x; (void)x_stride; (void)rows; (void)d; (void)out;
    return -1;
#endif
}

/* kvdeck_rope_neox_bf16's rotation (cpu_native.c) on fp32 q and k. */
int kvdeck_rope_neox_f32(const float* q, int64_t q_stride, int64_t q_heads, const float* k, int64_t k_stride,
                         int64_t k_heads, int64_t tokens, int64_t dim, const int64_t* positions,
                         const float* cos_sin, int64_t rot_dim, float* q_out, float* k_out) {
#if KVDECK_NATIVE
    const int64_t half = rot_dim / 2, heads = q_heads + k_heads;
    const int threads = tokens * heads * dim >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t item = 0; item < tokens * heads; item++) {
        const int64_t t = item / heads, h = item % heads;
        const float* src = h < q_heads ? q + t * q_stride + h * dim : k + t * k_stride + (h - q_heads) * dim;
        float* dst = h < q_heads ? q_out + (t * q_heads + h) * dim : k_out + (t * k_heads + h - q_heads) * dim;
        const float* cos = cos_sin + positions[t] * rot_dim;
        const float* sin = cos + half;
        for (int64_t i = 0; i < half; i += 16) {
            const __mmask16 m = lanes_from(half - i);
            const __m512 x1 = _mm512_maskz_loadu_ps(m, src + i), x2 = _mm512_maskz_loadu_ps(m, src + half + i);
            const __m512 c = _mm512_maskz_loadu_ps(m, cos + i), s = _mm512_maskz_loadu_ps(m, sin + i);
            _mm512_mask_storeu_ps(dst + i, m, _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s)));
            _mm512_mask_storeu_ps(dst + half + i, m, _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s)));
        }
        if (rot_dim < dim) memcpy(dst + rot_dim, src + rot_dim, (size_t)(dim - rot_dim) * sizeof(float));
    }
    return 0;
#else
    (void)q; (void)q_stride; (void)q_heads; (void)k; (void)k_stride; (void)k_heads; (void)tokens; (void)dim;
    (void)positions; (void)cos_sin; (void)rot_dim; (void)q_out; (void)k_out;
    return -1;
#endif
}
