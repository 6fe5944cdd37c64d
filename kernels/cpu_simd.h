/* What the native kernels share (cpu_native.c for bf16, cpu_native_f32.c for fp32): whether
 * this build has the AVX-512 path, the masks of a vector's tail, a vector exp, and the
 * sizes below which a kernel stays on one thread. */
#ifndef KVDECK_CPU_SIMD_H
#define KVDECK_CPU_SIMD_H
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
#endif

#endif
