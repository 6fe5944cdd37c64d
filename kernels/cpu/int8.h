/* INT8 weights on the CPU (int8.c): a dense weight quantised at load to int8 per block of 32
 * of its input (llama.cpp's Q8_0: one fp16 scale per 32 weights, symmetric), in tiles for the
 * integer dot products, and its product with a few rows of activations quantised to int8
 * the same way (int_dot.h). An INT4 model's output head takes it: the head is a third of
 * SmolLM2's bytes in bf16, and llama.cpp's Q4 files keep it at Q8_0 too.
 *
 * Layout ("q8 tiles"): the output columns in tiles of 16 (the last one padded with zero
 * weights), tile after tile. Within a tile, 64 k at a time:
 *   64 bytes of parameters: 16 fp16 scales of the first 32 k, 16 of the second;
 *   then 16 chunks of 64 bytes, chunk c holding k = 4c .. 4c + 3 for the 16 columns: byte
 *   4j + i is column j's weight at k = 4c + i, as int8.
 * w[k, n] = q[k, n] * scale[k / 32, n]; kernels/cpu/int8.py quantises and repacks.
 *
 * Returns 0, or -1 when this build has no path for the call (kvdeck_q4_isa() == 0). */
#ifndef KVDECK_INT8_H
#define KVDECK_INT8_H
#include <stdint.h>

/* k must be a multiple of this. */
#define KVDECK_Q8_TILE_K 64

typedef struct {
    const uint8_t* data;  /* the tiles */
    int64_t n;            /* output columns (the tiles cover n rounded up to 16) */
    int64_t k;            /* input rows, a multiple of KVDECK_Q8_TILE_K */
} kvdeck_q8_weight;

/* Bytes of one tile (16 columns over all k). */
int64_t kvdeck_q8_tile_bytes(int64_t k);
/* y [rows, n] = x [rows, k] W; bf16 x and y (rounded to nearest even), sums in fp32.
 * `scratch` holds kvdeck_q4_scratch_bytes(rows, k, 32) bytes, or is NULL. */
int kvdeck_q8_gemm_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, const kvdeck_q8_weight* w,
                        uint16_t* y, int64_t y_stride, void* scratch);
/* The same for fp32 x and y. */
int kvdeck_q8_gemm_f32(const float* x, int64_t rows, int64_t x_stride, const kvdeck_q8_weight* w, float* y,
                       int64_t y_stride, void* scratch);

#endif
