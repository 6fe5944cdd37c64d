/* What the native kernels share (cpu_native.c for bf16, cpu_native_f32.c for fp32): whether
 * this build has the AVX-512 path, the masks of a vector's tail, a vector exp, the sizes
 * below which a kernel stays on one thread, and the two drivers that share a GEMV's or an
 * attention's work among the threads for either element type (defined in cpu_native.c). */
#ifndef KVDECK_CPU_SIMD_H
#define KVDECK_CPU_SIMD_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define KVDECK_NATIVE 1
#else
#define KVDECK_NATIVE 0
#endif

/* Below this many weight elements one thread does it all: waking the others costs more. */
#define PARALLEL_MIN_ELEMENTS (1 << 16)
/* The kernels keep a head's query and output in registers. */
#define MAX_HEAD_DIM 512
/* Decode attention takes its keys this many at a time (one vector of scores). */
#define KEY_TILE 16

/* A GEMV's band: weight rows n0..n1 against a few rows of x (how many: the band's own
 * compile-time count), in the element type of the band. */
typedef void (*kvdeck_band_fn)(const void* x, int64_t x_stride, const void* w, const void* bias, void* y,
                               int64_t y_stride, int64_t n0, int64_t n1, int64_t k_len);
/* y [rows, n_len] = x [rows, k_len] W^T: up to eight rows at a time through bands[count]
 * (index 1..8), each pass's weight rows split among `threads` threads. `element`: bytes of
 * an element. Returns 0, or -1 without bands (a build with no AVX-512 path). */
int kvdeck_gemv_rows(const kvdeck_band_fn bands[9], size_t element, const void* x, int64_t rows,
                      int64_t x_stride, const void* w, int64_t n_len, int64_t k_len, const void* bias, void* y,
                      int64_t y_stride, int threads);

/* The most query heads of a row one walk over its keys serves (the fp32 attention's tile). */
#define HEAD_TILE 4

/* One (row, tile of query heads) of decode attention: heads first_head..first_head+heads-1
 * (query and result: their rows side by side), head h reading kv head h / group, over
 * positions first..len-1 of the row's table. */
typedef void (*kvdeck_attend_fn)(const void* query, int64_t first_head, int64_t heads, int64_t group,
                                 const void* k_cache, const void* v_cache, const int32_t* table, int64_t first,
                                 int64_t len, int64_t block_size, int64_t kv_heads, int64_t dim, float scale,
                                 float soft_cap, void* result);
/* kvdeck_decode_attention_bf16's contract (cpu_native.c) with every row's heads through
 * `attend`, `tile` heads an item, the items shared among the threads; `element`: bytes of an
 * element of q, caches and out. */
int kvdeck_attention_rows(kvdeck_attend_fn attend, int64_t tile, size_t element, const void* q, int64_t rows,
                          int64_t q_stride, int64_t heads, int64_t dim, const void* k_cache, const void* v_cache,
                          int64_t kv_heads, const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                          int64_t block_size, int64_t window, float scale, float soft_cap, void* out);
#if KVDECK_NATIVE
/* A bf16 model's (row, tile of at most HEAD_TILE heads) of decode attention, the fp32 tile
 * kernel over bf16 caches (native_f32.c); a kvdeck_attend_fn. */
void kvdeck_attend_tile_bf16(const void* query, int64_t first_head, int64_t heads, int64_t group, const void* k,
                             const void* v, const int32_t* table, int64_t first, int64_t len, int64_t block_size,
                             int64_t kv_heads, int64_t dim, float scale, float soft_cap, void* result);
#endif

#if KVDECK_NATIVE
static inline __mmask16 lanes_from(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* e^x to about 2 ulp of fp32: 2^n * p(r), r = x - n ln2 (Cody-Waite), p of degree 6. */
static inline __m512 exp_ps(__m512 x) {
    /* above 88.7 the result is inf (scalef overflows), below -103.9 it is 0, as expf */
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(128.0f)), _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* v[j]'s sixteen lanes summed, in lane j: the reductions of sixteen vectors as one
 * transpose-and-add tree (four levels of shuffles and adds, then one permutation) where
 * sixteen _mm512_reduce_add_ps would take four levels each. */
static inline __m512 sum_lanes16(const __m512 v[16]) {
    __m512 halves[8], quarters[4], eighths[2];
    for (int i = 0; i < 8; i++)  /* quarter sums 0+2, 1+3 of v[2i] and of v[2i+1] */
        halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++)  /* 128-bit lane k: four partial sums of v[4i + k] */
        quarters[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++)  /* lane k: two partials each of v[8i + k], v[8i + 4 + k] */
        eighths[i] = _mm512_add_ps(_mm512_unpacklo_ps(quarters[2 * i], quarters[2 * i + 1]),
                                   _mm512_unpackhi_ps(quarters[2 * i], quarters[2 * i + 1]));
    /* element e of 128-bit lane k: the sum of v[4e + k]; the permutation puts it in lane 4e + k */
    const __m512 sums = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(eighths[0]), _mm512_castps_pd(eighths[1]))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(eighths[0]), _mm512_castps_pd(eighths[1]))));
    return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), sums);
}

/* One tile of an online softmax (flash attention's running maximum and denominator): the
 * tile's `count` scores become weights relative to the running maximum, and when the tile
 * raises that maximum, what was summed so far (acc's chunks, the denominator) is rescaled
 * first. The caller then adds weight[j] times key j's value row to acc. */
static inline void softmax_tile(const float* scores, int64_t count, float* running_max, float* denominator,
                                __m512* acc, int64_t chunks, float* weight) {
    const __mmask16 tile = lanes_from(count);
    const __m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tile, scores);
    const float tile_max = _mm512_reduce_max_ps(s);
    if (tile_max > *running_max) {
        const __m512 rescale = _mm512_set1_ps(expf(*running_max - tile_max));
        for (int64_t c = 0; c < chunks; c++) acc[c] = _mm512_mul_ps(acc[c], rescale);
        *denominator *= _mm512_cvtss_f32(rescale);
        *running_max = tile_max;
    }
    const __m512 weights = _mm512_maskz_mov_ps(tile, exp_ps(_mm512_sub_ps(s, _mm512_set1_ps(*running_max))));
    *denominator += _mm512_reduce_add_ps(weights);
    _mm512_storeu_ps(weight, weights);
}
#endif

#endif
