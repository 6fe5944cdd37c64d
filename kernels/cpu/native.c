/* Native CPU kernels for bf16 decode steps on x86 CPUs with AVX512-BF16: the linear
 * layers' matrix-vector products for a few rows, decode attention over the paged cache,
 * and the element-wise steps of a layer (RMSNorm with the residual, SiLU-and-mul, rotary).
 *
 * GEMV: y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]), W row-major [N, K] bf16 as a checkpoint
 * stores it, x and y bf16 rows, sums in fp32 (vdpbf16ps), rounded to bf16 to nearest even.
 *
 * Decode reads every weight once per step for one row or a few, so a step costs the bytes
 * of its weights and this kernel is built to stream them: each thread walks its own
 * contiguous band of weight rows front to back, one row at a time (one sequential stream
 * per core is what the hardware prefetcher follows best; interleaving four rows measured
 * 21 GB/s against 27 on a 2-core EPYC), and uses each 64-byte load of W for up to eight
 * rows of x kept in registers. More rows than eight run as several passes.
 *
 * Threads are OpenMP's. Built with -fopenmp against libgomp.so.1, which torch has already
 * loaded by the time this library is, so both share one thread pool and torch's thread
 * count (omp_get_max_threads of the calling thread).
 *
 * Built at first use by kernels/cpu/native.py with -O3 -march=native.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#include "native.h"
#include "simd.h"

/* 1 when this build has the AVX512-BF16 path (the Python side uses nothing else). */
int kvdeck_gemv_native(void) { return KVDECK_NATIVE; }

static inline uint16_t to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float from_bf16(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

#if KVDECK_NATIVE
/* Sixteen bf16 values (the lanes in `mask`; the others 0) as fp32. */
static inline __m512 widen(const uint16_t* p, __mmask16 mask) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}

static inline void narrow_store(uint16_t* p, __mmask16 mask, __m512 v) {
    _mm256_mask_storeu_epi16(p, mask, (__m256i)_mm512_cvtneps_pbh(v));
}

static inline __m512 round_bf16(__m512 v) {  /* v rounded to bf16, back in fp32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

/* Weight rows n0..n1 against `rows` (<= 8) rows of x; the row count is a compile-time
 * constant in each instance so that the accumulators stay in registers. From six rows on,
 * the arithmetic no longer hides the stream's misses: those bands prefetch the weights
 * PREFETCH_BYTES ahead, non-temporal (a six-to-eight-row step of SmolLM2 ~1.2x faster; at
 * five rows and fewer it measured no gain or a loss). */
#define PREFETCH_BYTES 1024
#define PREFETCH_FROM_ROWS 6
#define DEFINE_BAND(ROWS)                                                                      \
    static void band_##ROWS(const void* xv, int64_t x_stride, const void* wv_, const void* bv,   \
                            void* yv, int64_t y_stride, int64_t n0, int64_t n1, int64_t k_len) { \
        const uint16_t *x = xv, *w = wv_, *bias = bv;                                         \
        uint16_t* y = yv;                                                                     \
        const int64_t k_full = k_len & ~(int64_t)31;                                          \
        const __mmask32 tail = (__mmask32)((1ull << (k_len - k_full)) - 1ull);                \
        for (int64_t n = n0; n < n1; n++) {                                                   \
            const uint16_t* row = w + n * k_len;                                              \
            __m512 acc[ROWS];                                                                 \
            for (int m = 0; m < ROWS; m++) acc[m] = _mm512_setzero_ps();                      \
            for (int64_t k = 0; k < k_full; k += 32) {                                        \
                if (ROWS >= PREFETCH_FROM_ROWS)                                               \
                    _mm_prefetch((const char*)(row + k) + PREFETCH_BYTES, _MM_HINT_NTA);      \
                __m512bh wv = (__m512bh)_mm512_loadu_si512(row + k);                          \
                for (int m = 0; m < ROWS; m++)                                                \
                    acc[m] = _mm512_dpbf16_ps(                                                \
                        acc[m], wv, (__m512bh)_mm512_loadu_si512(x + m * x_stride + k));     \
            }                                                                                 \
            if (tail) {                                                                       \
                __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, row + k_full);         \
                for (int m = 0; m < ROWS; m++)                                                \
                    acc[m] = _mm512_dpbf16_ps(acc[m], wv, (__m512bh)_mm512_maskz_loadu_epi16( \
                                                              tail, x + m * x_stride + k_full)); \
            }                                                                                 \
            const float b = bias ? from_bf16(bias[n]) : 0.0f;                                 \
            for (int m = 0; m < ROWS; m++)                                                    \
                y[m * y_stride + n] = to_bf16(_mm512_reduce_add_ps(acc[m]) + b);              \
        }                                                                                     \
    }
DEFINE_BAND(1)
DEFINE_BAND(2)
DEFINE_BAND(3)
DEFINE_BAND(4)
DEFINE_BAND(5)
DEFINE_BAND(6)
DEFINE_BAND(7)
DEFINE_BAND(8)

static const kvdeck_band_fn BANDS[9] = {0, band_1, band_2, band_3, band_4, band_5, band_6, band_7, band_8};
#else
#define BANDS NULL
#endif

int kvdeck_gemv_rows(const kvdeck_band_fn bands[9], size_t element, const void* x, int64_t rows,
                      int64_t x_stride, const void* w, int64_t n_len, int64_t k_len, const void* bias, void* y,
                      int64_t y_stride, int threads) {
    if (bands == NULL) return -1;
    /* One team for all the passes: each thread keeps its band of weight rows (in its own
     * core's cache) for every pass, and the threads meet once, not once a pass. */
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
        for (int64_t first = 0; first < rows; first += 8) {
            const kvdeck_band_fn band = bands[rows - first < 8 ? rows - first : 8];
            band((const char*)x + (size_t)(first * x_stride) * element, x_stride, w, bias,
                 (char*)y + (size_t)(first * y_stride) * element, y_stride, n_len * me / team,
                 n_len * (me + 1) / team, k_len);
        }
    }
    return 0;
}

/* x [rows, k_len] (row stride x_stride), w [n_len, k_len] contiguous, bias [n_len] or NULL,
 * y [rows, n_len] (row stride y_stride). Returns 0, or -1 when this build cannot run it. */
int kvdeck_gemv_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, const uint16_t* w,
                     int64_t n_len, int64_t k_len, const uint16_t* bias, uint16_t* y,
                     int64_t y_stride) {
    const int threads = n_len * k_len >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
    return kvdeck_gemv_rows(BANDS, sizeof(uint16_t), x, rows, x_stride, w, n_len, k_len, bias, y, y_stride,
                            threads);
}

/* Decode attention: one query token per row, bf16 q and cache, fp32 arithmetic.
 *
 * Each (row, tile of up to four heads) walks its context once (the last `window` positions
 * with a window), with an online softmax (flash attention's running maximum and
 * denominator), so nothing of size context is allocated: native_f32.c's tile kernel over
 * the bf16 cache, each key's slot read once for the tile's heads and each head's sixteen
 * scores summed across lanes together (one reduction a key, with a division a key through
 * the block table, cost SmolLM2 a third of its INT4 decode step). The query is widened to
 * fp32 (exact), scores are capped as c * tanh(s / c) when soft_cap > 0 (Gemma 2), and the
 * output is rounded to bf16 once at the end. Rows and head tiles are shared among the
 * threads.
 *
 * q [rows, heads, dim] (row stride q_stride), caches [num_blocks, block_size, kv_heads, dim]
 * contiguous, block_tables [rows, bt_stride] int32, seq_lens [rows] int32 (context length
 * including this step's token), out [rows, heads, dim] contiguous. */

#if KVDECK_NATIVE
#define ATTEND_HEADS kvdeck_attend_tile_bf16
#else
#define ATTEND_HEADS NULL  /* kvdeck_attention_rows refuses: this build has no AVX-512 path */
#endif

int kvdeck_decode_attention_bf16(const uint16_t* q, int64_t rows, int64_t q_stride, int64_t heads,
                                 int64_t dim, const uint16_t* k_cache, const uint16_t* v_cache,
                                 int64_t kv_heads, const int32_t* block_tables, int64_t bt_stride,
                                 const int32_t* seq_lens, int64_t block_size, int64_t window,
                                 float scale, float soft_cap, uint16_t* out) {
    return kvdeck_attention_rows(ATTEND_HEADS, HEAD_TILE, sizeof(uint16_t), q, rows, q_stride, heads, dim, k_cache,
                                 v_cache, kv_heads, block_tables, bt_stride, seq_lens, block_size, window, scale,
                                 soft_cap, out);
}

int kvdeck_attention_rows(kvdeck_attend_fn attend, int64_t tile, size_t element, const void* q, int64_t rows,
                          int64_t q_stride, int64_t heads, int64_t dim, const void* k_cache, const void* v_cache,
                          int64_t kv_heads, const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                          int64_t block_size, int64_t window, float scale, float soft_cap, void* out) {
    if (attend == NULL || tile < 1 || dim > MAX_HEAD_DIM || kv_heads <= 0 || heads % kv_heads != 0) return -1;
    const int64_t group = heads / kv_heads;
    /* Tiles hold whole groups of heads where they fit: a kv head's keys are widened once a tile. */
    if (group <= tile) tile = tile / group * group;
    const int64_t tiles = (heads + tile - 1) / tile, work = rows * tiles;
    int64_t context = 0;
    for (int64_t r = 0; r < rows; r++) context += seq_lens[r];
    const int threads = context * heads * dim >= PARALLEL_MIN_ELEMENTS / 2 ? omp_get_max_threads() : 1;
    /* dynamic: a chunk's tokens attend to ever longer contexts, so equal shares of items are
     * not equal shares of work */
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(dynamic, 1)
    for (int64_t item = 0; item < work; item++) {
        const int64_t r = item / tiles, h = item % tiles * tile, count = heads - h < tile ? heads - h : tile;
        const int64_t len = seq_lens[r], first = window > 0 && len > window ? len - window : 0;
        attend((const char*)q + (size_t)(r * q_stride + h * dim) * element, h, count, group, k_cache, v_cache,
               block_tables + r * bt_stride, first, len, block_size, kv_heads, dim, scale, soft_cap,
               (char*)out + (size_t)((r * heads + h) * dim) * element);
    }
    return 0;
}

/* Element-wise steps of a bf16 layer, each one pass where torch takes five to ten calls.
 * Each rounds where the torch path rounds (to bf16 after the same fp32 formula), so they
 * differ from it only by the order of the fp32 sum in the norm and by the last bits of exp.
 * Rows are shared among the threads when there are enough elements. */


/* out = weight * bf16(v * rsqrt(mean(v^2) + eps)), v = x, or with a residual v = bf16(x +
 * residual), which is also written to `summed` (the next residual). x, residual: row
 * strides; weight [n] bf16; summed, out [rows, n] contiguous. */
int kvdeck_rms_norm_bf16(const uint16_t* x, int64_t x_stride, const uint16_t* residual,
                         int64_t residual_stride, const uint16_t* weight, float eps, int64_t rows,
                         int64_t n, uint16_t* summed, uint16_t* out) {
#if KVDECK_NATIVE
    const int threads = rows * n >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t* xr = x + r * x_stride;
        uint16_t* sr = summed + r * n;
        __m512 squares = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = lanes_from(n - i);
            __m512 v = widen(xr + i, m);
            if (residual) {
                v = round_bf16(_mm512_add_ps(v, widen(residual + r * residual_stride + i, m)));
                narrow_store(sr + i, m, v);
            }
            squares = _mm512_fmadd_ps(v, v, squares);
        }
        const float inverse = 1.0f / sqrtf(_mm512_reduce_add_ps(squares) / (float)n + eps);
        const __m512 scale = _mm512_set1_ps(inverse);
        const uint16_t* source = residual ? sr : xr;
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = lanes_from(n - i);
            const __m512 normed = round_bf16(_mm512_mul_ps(widen(source + i, m), scale));
            narrow_store(out + r * n + i, m, _mm512_mul_ps(normed, widen(weight + i, m)));
        }
    }
    return 0;
#else
    (void)x; (void)x_stride; (void)residual; (void)residual_stride; (void)weight; (void)eps;
    (void)rows; (void)n; (void)summed; (void)out;
    return -1;
#endif
}

/* out [rows, d] = bf16(bf16(silu(gate)) * up), x [rows, 2d] holding gate | up (row stride). */
int kvdeck_silu_and_mul_bf16(const uint16_t* x, int64_t x_stride, int64_t rows, int64_t d,
                             uint16_t* out) {
#if KVDECK_NATIVE
    const int threads = rows * d >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t* gate = x + r * x_stride;
        const uint16_t* up = gate + d;
        for (int64_t i = 0; i < d; i += 16) {
            const __mmask16 m = lanes_from(d - i);
            const __m512 g = widen(gate + i, m);
            const __m512 one = _mm512_set1_ps(1.0f);
            const __m512 silu = round_bf16(_mm512_div_ps(g, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
            narrow_store(out + r * d + i, m, _mm512_mul_ps(silu, widen(up + i, m)));
        }
    }
    return 0;
#else
    (void)x; (void)x_stride; (void)rows; (void)d; (void)out;
    return -1;
#endif
}

/* Rotary embedding, rotate-half (neox) form, on q and k in one call: for i < rot_dim / 2,
 * out[i] = x[i] cos - x[i + h] sin and out[i + h] = x[i + h] cos + x[i] sin (h = rot_dim / 2,
 * each product and the sum rounded in fp32 as the torch formula does, then bf16); dims past
 * rot_dim are copied. q [tokens, q_heads, dim], k [tokens, k_heads, dim] (token strides),
 * positions [tokens] int64, cos_sin [max_positions, rot_dim] fp32 (cos | sin halves),
 * q_out, k_out contiguous. */
int kvdeck_rope_neox_bf16(const uint16_t* q, int64_t q_stride, int64_t q_heads, const uint16_t* k,
                          int64_t k_stride, int64_t k_heads, int64_t tokens, int64_t dim,
                          const int64_t* positions, const float* cos_sin, int64_t rot_dim,
                          uint16_t* q_out, uint16_t* k_out) {
#if KVDECK_NATIVE
    const int64_t half = rot_dim / 2, heads = q_heads + k_heads;
    const int threads = tokens * heads * dim >= PARALLEL_MIN_ELEMENTS ? omp_get_max_threads() : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t item = 0; item < tokens * heads; item++) {
        const int64_t t = item / heads, h = item % heads;
        const uint16_t* src = h < q_heads ? q + t * q_stride + h * dim : k + t * k_stride + (h - q_heads) * dim;
        uint16_t* dst = h < q_heads ? q_out + (t * q_heads + h) * dim : k_out + (t * k_heads + h - q_heads) * dim;
        const float* cos = cos_sin + positions[t] * rot_dim;
        const float* sin = cos + half;
        for (int64_t i = 0; i < half; i += 16) {
            const __mmask16 m = lanes_from(half - i);
            const __m512 x1 = widen(src + i, m), x2 = widen(src + half + i, m);
            const __m512 c = _mm512_maskz_loadu_ps(m, cos + i), s = _mm512_maskz_loadu_ps(m, sin + i);
            narrow_store(dst + i, m, _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s)));
            narrow_store(dst + half + i, m, _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s)));
        }
        if (rot_dim < dim) memcpy(dst + rot_dim, src + rot_dim, (size_t)(dim - rot_dim) * sizeof(uint16_t));
    }
    return 0;
#else
    (void)q; (void)q_stride; (void)q_heads; (void)k; (void)k_stride; (void)k_heads; (void)tokens;
    (void)dim; (void)positions; (void)cos_sin; (void)rot_dim; (void)q_out; (void)k_out;
    return -1;
#endif
}
