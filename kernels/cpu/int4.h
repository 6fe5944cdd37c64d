/* INT4 weights on the CPU (int4.c): AutoAWQ's INT4 weights repacked at load into tiles
 * for the integer dot products of the SIMD the CPU has, and the product of a few rows of
 * activations with them, the activations quantised to int8 per block of 32 on the way in
 * (as llama.cpp's Q8 dot products do).
 *
 * Layout ("q4 tiles"): the output columns in tiles of 16 (the last one padded with zero
 * weights), tile after tile. Within a tile, group after group (a group: `group` rows of k
 * sharing a scale and a zero point per column):
 *   64 bytes of parameters: 16 scales (fp16), 16 zero points (u8), 16 bytes unused;
 *   then group / 8 chunks of 64 bytes, chunk c holding k = 8c .. 8c + 7 of the group for the
 *   16 columns: byte 4j + i holds column j's k = 8c + i in its low nibble and k = 8c + 4 + i
 *   in its high one (four consecutive k of a column are the four bytes one 32-bit lane of
 *   an integer dot product multiplies).
 * w[k, n] = (q[k, n] - zero[g, n]) * scale[g, n] as in AutoAWQ; kernels/cpu/int4.py repacks.
 *
 * Returns 0, or -1 when this build has no path for the call (int4_isa() == 0). */
#ifndef KVDECK_INT4_H
#define KVDECK_INT4_H
#include <stdint.h>

/* Activations are quantised to int8 in blocks of this many along k. */
#define KVDECK_Q8_BLOCK 32

typedef struct {
    const uint8_t* data;  /* the tiles */
    int64_t n;            /* output columns (the tiles cover n rounded up to 16) */
    int64_t k;            /* input rows, a multiple of group */
    int64_t group;        /* 32, 64 or 128 (a multiple of KVDECK_Q8_BLOCK) */
} kvdeck_q4_weight;

/* Which integer dot product this build runs INT4 with: 2 AVX-512 VNNI, 1 AVX2, 0 none. */
int kvdeck_q4_isa(void);
/* Bytes of one tile (16 columns over all k). */
int64_t kvdeck_q4_tile_bytes(int64_t k, int64_t group);
/* Bytes of scratch a product of `rows` rows needs (the int8 activations and their scales). */
int64_t kvdeck_q4_scratch_bytes(int64_t rows, int64_t k, int64_t group);
/* y [rows, n] = x [rows, k] W (+ bias [n]); x and y bf16 (uint16_t) rows with their strides;
 * sums in fp32, y rounded to bf16 to nearest even. `scratch` holds scratch_bytes, or is NULL
 * (then allocated here). */
int kvdeck_q4_gemm_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, const kvdeck_q4_weight* w,
                        const uint16_t* bias, uint16_t* y, int64_t y_stride, void* scratch);
/* The same for fp32 x, bias and y. */
int kvdeck_q4_gemm_f32(const float* x, int64_t rows, int64_t x_stride, const kvdeck_q4_weight* w,
                       const float* bias, float* y, int64_t y_stride, void* scratch);
/* The dense weight the tiles stand for, out [n, k] fp32, (q - zero) * scale. */
int kvdeck_q4_dequantize_f32(const kvdeck_q4_weight* w, float* out);

#endif
