/* quants/arm/float_dots.c: the vec_dots of the float weight types (F32, F16, BF16) with
 * NEON.
 *
 * Each gives the bits of scalar.c's VEC_DOT_LANES, the definition, for every input: 32
 * lanes, lane j taking the products of elements j, j + 32, j + 64, ... as a multiply
 * rounded to float and then an add (vmulq then vaddq, never vfmaq), the lanes summed by
 * sq_reduce32, and the last n % 32 products added in double. Here the 32 lanes are eight
 * registers, so lane j of register k is the definition's lane 4k + j.
 *
 * The element conversions are exact, as the definition's are: FCVTL widens every half
 * (subnormals included) to the float half_to_float makes, but for a signaling NaN, which
 * it quiets; the definition's multiply quiets it the same way, so a NaN in gives a NaN
 * out either way. BF16 is its float's top sixteen bits.
 */
#include "simd.h"

#ifdef SQ_NEON

#include <arm_neon.h>
#include <stdint.h>

#include "quants/kernels.h"

/* Four elements from memory as floats, one loader per type. */
static inline float32x4_t f32x4(const uint8_t *p) { return vld1q_f32((const float *)p); }

static inline float32x4_t f16x4(const uint8_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
}

static inline float32x4_t bf16x4(const uint8_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p), 16));
}

/* The definition's lanes, then its tail; unit the bytes of an element, nb the elements. */
#define FLOAT_VEC_DOT(name, unit)                                                                       \
    float sq_vec_dot_##name##_neon(const void *row, const void *xq, int64_t nb, const void *stop) {     \
        (void)stop;                                                                                     \
        const uint8_t *a = row, *b = xq;                                                                \
        float32x4_t acc[8];                                                                             \
        for (int k = 0; k < 8; k++)                                                                     \
            acc[k] = vdupq_n_f32(0.0f);                                                                 \
        int64_t i = 0;                                                                                  \
        for (; i + 32 <= nb; i += 32)                                                                   \
            for (int k = 0; k < 8; k++) {                                                               \
                const int64_t at = (i + 4 * k) * (unit);                                                \
                acc[k] = vaddq_f32(acc[k], vmulq_f32(name##x4(a + at), name##x4(b + at)));              \
            }                                                                                           \
        float lanes[32];                                                                                \
        for (int k = 0; k < 8; k++)                                                                     \
            vst1q_f32(lanes + 4 * k, acc[k]);                                                           \
        return sq_float_tail_##name(sq_reduce32(lanes), a, b, i, nb);                                   \
    }

FLOAT_VEC_DOT(f32, 4)
FLOAT_VEC_DOT(f16, 2)
FLOAT_VEC_DOT(bf16, 2)

#endif
