/* quants/x86/token_rows.h: where a token's activations lie in a batch, for the x86
 * kernels of every setting (x86/side_by_side.h for AVX2, x86/avx512vnni.c). Plain loads
 * and prefetches, which need no target of their own. */
#ifndef SMOLQ_QUANTS_X86_TOKEN_ROWS_H
#define SMOLQ_QUANTS_X86_TOKEN_ROWS_H

#include <stdint.h>

#include "quants/kernels.h"

/* Token t's activation row, stride bytes apart from the one before. */
static inline const void *token_row(const void *xq, int64_t stride, int t) {
    return (const uint8_t *)xq + t * stride;
}

/* Block i of token t's Q8_K activation row. */
static inline const block_q8_K *token_block(const void *xq, int64_t stride, int t, int64_t i) {
    return (const block_q8_K *)token_row(xq, stride, t) + i;
}

/* Block i's eight sums of 32 codes in token t's Q8_K activation row of nb blocks, as
 * sq_quantize_activations writes them after the blocks (quants/blocks.h). */
static inline const int16_t *token_sums32(const void *xq, int64_t stride, int t, int64_t nb, int64_t i) {
    return (const int16_t *)((const uint8_t *)token_row(xq, stride, t) + sq_q8_K_sums32_at(nb)) + 8 * i;
}

/* An activation block asked for ahead of use. A batch of long rows outgrows L2, and the
 * hardware does not follow one block from each of the 32 to a hundred token rows at a time.
 * Always inlined: see prefetch_ahead (x86/vec_dots.h). */
static inline __attribute__((always_inline)) void prefetch_block_q8_K(const block_q8_K *a) {
    for (int b = 0; b < (int)sizeof(block_q8_K); b += 64)
        _mm_prefetch((const char *)a + b, _MM_HINT_T0);
}

/* Line l (0 .. Q8_K_LINES - 1) of an activation block into L2, by its own bytes: the starts
 * of its first five lines, then its last byte, so that the six a 292-byte block can straddle
 * are all asked for. The prompt kernels ask a line at a time as their groups go by. */
enum { Q8_K_LINES = 6 };
static inline __attribute__((always_inline)) void prefetch_q8_K_line(const block_q8_K *a, int l) {
    _mm_prefetch((const char *)a + (l < Q8_K_LINES - 1 ? 64 * l : (int)sizeof(block_q8_K) - 1), _MM_HINT_T1);
}

#endif
