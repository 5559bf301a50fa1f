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
 * time decoding; with F16C an F16 model's products run about 8x faster.
 */
#include "simd.h"

#ifdef SQ_X86

#include <stdint.h>

#include "quants/kernels.h"
#include "quants/quants.h"

#define TARGET SQ_AVX2

/* Eight elements from memory as floats, one loader per type. */
TARGET static inline __m256 f32x8(const void *p) { return _mm256_loadu_ps(p); }

TARGET static inline __m256 f16x8(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128(p)); }

TARGET static inline __m256 bf16x8(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16));
}

static inline float f32_of(const void *p, int64_t i) { return ((const float *)p)[i]; }
static inline float f16_of(const void *p, int64_t i) { return sq_fp16_to_fp32(((const uint16_t *)p)[i]); }
static inline float bf16_of(const void *p, int64_t i) { return sq_bf16_to_fp32(((const uint16_t *)p)[i]); }

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
        float lanes[32];                                                                               \
        for (int k = 0; k < 4; k++)                                                                    \
            _mm256_storeu_ps(lanes + 8 * k, acc[k]);                                                   \
        double sum = sq_reduce32(lanes);                                                               \
        for (; i < nb; i++)                                                                            \
            sum += (double)(name##_of(a, i) * name##_of(b, i));                                        \
        return (float)sum;                                                                             \
    }

FLOAT_VEC_DOT(f32, 4)
FLOAT_VEC_DOT(f16, 2)
FLOAT_VEC_DOT(bf16, 2)

#endif
