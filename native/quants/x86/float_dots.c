/* quants/x86/float_dots.c: the vec_dots of the float weight types (F32, F16, BF16) with
 * AVX2 and F16C, at both x86 settings.
 *
 * Each gives the bits of scalar.c's VEC_DOT_LANES, the definition, for every input: 32
 * lanes, lane j taking the products of elements j, j + 32, j + 64, ... as a multiply
 * rounded to float and then an add (never a fused multiply-add), the lanes summed by
 * sq_reduce32, and the last n % 32 products added in double. Here the 32 lanes are four
 * registers, so lane j of register k is the definition's lane 8k + j.
 *
 * The element conversions are exact, as the definition's are: F16C's vcvtph2ps widens
 * every half (subnormals included) to the float half_to_float makes, but for a signaling
 * NaN, which it quiets; the definition's multiply quiets it the same way, keeping the
 * payload, so the products agree. BF16 is its float's top sixteen bits.
 *
 * Plain x86-64 has no half conversion, so the definition's F16 dot spends most of its
 * time decoding: with F16C a SmolLM2-shaped F16 model steps in 10 ms, not 71.
 *
 * At the avx512vnni setting, sixteen rows times a few tokens or a prompt's (the kernel
 * table's rows16 entries) go in tiles of two rows by four tokens: the 32 lanes of each
 * (row, token) pair are two 512-bit registers, lanes 0-15 and 16-31, so a row's chunk is
 * loaded and widened once for four tokens, and the tokens are widened once for the sixteen
 * rows, where the vec_dot widens both for every pair (one thread, 1,536 F16 rows of 576 by
 * 64 tokens, on a Zen 4: 24 G multiply-adds/s against the vec_dot's 17, with the tokens
 * widened per pair of rows).
 */
#include "simd.h"

#ifdef SQ_X86

#include <stdint.h>

#include "quants/kernels.h"
#include "simd512.h"

#define TARGET SQ_AVX2

/* Eight elements from memory as floats, one loader per type. */
TARGET static inline __m256 f32x8(const void *p) { return _mm256_loadu_ps(p); }

TARGET static inline __m256 f16x8(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128(p)); }

TARGET static inline __m256 bf16x8(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16));
}

/* sq_reduce8 of a register's lanes: the halves added lane by lane, then (0 + 1) + (2 + 3).
 * (Float addition is commutative to the bit, so which operand comes first does not matter;
 * only for two NaNs, where the payload kept may differ.) */
TARGET static inline float reduce8(__m256 r) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    const __m128 w = _mm_add_ps(t, _mm_shuffle_ps(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehl_ps(w, w)));
}

/* sq_reduce32 of the lanes held as four registers (lane j of acc[k] is lane 8k + j):
 * registers (0 + 2) + (1 + 3), lane by lane, then reduce8. */
TARGET static inline float reduce32(const __m256 acc[4]) {
    return reduce8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])));
}

/* The definition's lanes, then its tail; unit the bytes of an element. nb counts
 * elements (a float type's block is one). stop goes unused: a float row is streamed from
 * start to end, which the hardware prefetcher follows unaided. */
#define FLOAT_VEC_DOT(name, unit)                                                                      \
    TARGET float sq_vec_dot_##name##_avx2(const void *row, const void *xq, int64_t nb, const void *stop) { \
        (void)stop;                                                                                    \
        const uint8_t *a = row, *b = xq;                                                               \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),              \
                         _mm256_setzero_ps()};                                                         \
        int64_t i = 0;                                                                                 \
        for (; i + 32 <= nb; i += 32)                                                                  \
            for (int k = 0; k < 4; k++) {                                                              \
                const int64_t at = (i + 8 * k) * (unit);                                               \
                acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(name##x8(a + at), name##x8(b + at)));     \
            }                                                                                          \
        return sq_float_tail_##name(reduce32(acc), a, b, i, nb);                                       \
    }

FLOAT_VEC_DOT(f32, 4)
FLOAT_VEC_DOT(f16, 2)
FLOAT_VEC_DOT(bf16, 2)

/* Sixteen elements from memory as floats, in 512-bit registers. */
SQ_AVX512 static inline v16f f32x16(const uint8_t *p) { return V16(loadu_ps)((const float *)p); }

SQ_AVX512 static inline v16f f16x16(const uint8_t *p) {
    return V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)p)));
}

SQ_AVX512 static inline v16f bf16x16(const uint8_t *p) {
    return V16(castsi512_ps)(V16(slli_epi32)(V16(cvtepu16_epi32)(AS256I(_mm256_loadu_si256((const __m256i *)p))), 16));
}

/* sq_reduce32 of lanes 0-15 in lo and 16-31 in hi: (l + 16) first, which is the four
 * registers' (0 + 2) and (1 + 3); then those two halves, lane by lane, and reduce8. */
SQ_AVX512 static inline float reduce32x16(v16f lo, v16f hi) {
    const v16f u = V16(add_ps)(lo, hi);
    return reduce8(_mm256_add_ps(sq_low8(u), sq_high8(u)));
}

/* A prompt's tokens are widened to floats once per group of sixteen rows, SEGMENT elements
 * of up to four tokens at a time (16 KiB), not once per pair of rows: in the tiles below,
 * F16's conversions of the tokens took as long as the products. */
enum { SEGMENT = 1024 };

/* Rows r0, r0 + 1 (R of them) times the T tokens widened in xs, over elements s0..s0+len
 * (whole chunks of 32): each pair's 32 lanes in acc[r][t] (lanes 0-15, 16-31), carried on
 * from the segment before. */
#define FLOAT_TILE(name, unit)                                                                             \
    SQ_AVX512 static inline __attribute__((always_inline)) void tile_##name(                              \
        const uint8_t *rows, int64_t row_bytes, const float xs[][SEGMENT], int64_t s0, int64_t len, int R,  \
        int T, v16f acc[][4][2]) {                                                                         \
        v16f a[2][4][2];                                                                                   \
        for (int r = 0; r < R; r++)                                                                        \
            for (int t = 0; t < T; t++)                                                                    \
                a[r][t][0] = acc[r][t][0], a[r][t][1] = acc[r][t][1];                                      \
        for (int64_t i = 0; i < len; i += 32) {                                                            \
            v16f w[2][2];                                                                                  \
            for (int r = 0; r < R; r++)                                                                    \
                for (int h = 0; h < 2; h++)                                                                \
                    w[r][h] = name##x16(rows + r * row_bytes + (s0 + i + 16 * h) * (unit));                \
            for (int t = 0; t < T; t++)                                                                    \
                for (int h = 0; h < 2; h++) {                                                              \
                    const v16f x = V16(loadu_ps)(xs[t] + i + 16 * h);                                      \
                    for (int r = 0; r < R; r++)                                                            \
                        a[r][t][h] = V16(add_ps)(a[r][t][h], V16(mul_ps)(w[r][h], x));                     \
                }                                                                                          \
        }                                                                                                  \
        for (int r = 0; r < R; r++)                                                                        \
            for (int t = 0; t < T; t++)                                                                    \
                acc[r][t][0] = a[r][t][0], acc[r][t][1] = a[r][t][1];                                      \
    }                                                                                                      \
                                                                                                           \
    /* Sixteen rows times n_tokens, four tokens at a time, in tiles of two rows by those tokens \
     * (each count a constant for the compiler); then, pair by pair, the definition's reduction \
     * and tail. stop goes unused, as in the vec_dots. */                                                  \
    SQ_AVX512 void sq_steps_dot16_##name##_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, \
                                                      int64_t stride, int n_tokens, int64_t nb,            \
                                                      const void *stop, float *y, int64_t ldy) {           \
        (void)stop;                                                                                        \
        const uint8_t *w = rows, *x = xq;                                                                  \
        const int64_t whole = nb / 32 * 32;                                                                \
        float xs[4][SEGMENT];                                                                              \
        v16f acc[16][4][2];                                                                                \
        for (int t0 = 0; t0 < n_tokens; t0 += 4) {                                                         \
            const int T = n_tokens - t0 < 4 ? n_tokens - t0 : 4;                                           \
            for (int r = 0; r < 16; r++)                                                                   \
                for (int t = 0; t < T; t++)                                                                \
                    acc[r][t][0] = acc[r][t][1] = V16(setzero_ps)();                                       \
            for (int64_t s0 = 0; s0 < whole; s0 += SEGMENT) {                                              \
                const int64_t len = whole - s0 < SEGMENT ? whole - s0 : SEGMENT;                           \
                for (int t = 0; t < T; t++)                                                                \
                    for (int64_t i = 0; i < len; i += 16)                                                  \
                        V16(storeu_ps)(xs[t] + i, name##x16(x + (t0 + t) * stride + (s0 + i) * (unit)));   \
                for (int r = 0; r < 16; r += 2) {                                                          \
                    const uint8_t *wr = w + r * row_bytes;                                                 \
                    switch (T) {                                                                           \
                    case 1: tile_##name(wr, row_bytes, xs, s0, len, 2, 1, acc + r); break;                 \
                    case 2: tile_##name(wr, row_bytes, xs, s0, len, 2, 2, acc + r); break;                 \
                    case 3: tile_##name(wr, row_bytes, xs, s0, len, 2, 3, acc + r); break;                 \
                    default: tile_##name(wr, row_bytes, xs, s0, len, 2, 4, acc + r); break;                \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
            for (int r = 0; r < 16; r++)                                                                   \
                for (int t = 0; t < T; t++)                                                                \
                    y[(t0 + t) * ldy + r] = sq_float_tail_##name(reduce32x16(acc[r][t][0], acc[r][t][1]),  \
                                                                 w + r * row_bytes, x + (t0 + t) * stride, \
                                                                 whole, nb);                               \
        }                                                                                                  \
    }

FLOAT_TILE(f32, 4)
FLOAT_TILE(f16, 2)
FLOAT_TILE(bf16, 2)

#endif
