/* exp_ggml.h: exp(x) rounded exactly as llama.cpp's CPU backend rounds it.
 *
 * llama.cpp evaluates the exponentials of softmax and SiLU with its own vectorized
 * exp, not libm's: n = round(x / ln 2) by the 1.5 * 2^23 trick, the remainder
 * b = x - n ln 2 in two parts, a degree-5 polynomial for e^b - 1, and 2^n built in the
 * exponent bits (split in two factors when |n| > 126 so neither overflows). The same
 * operations and fmas here give the same bits (why that matters: quants/types.h).
 *
 * forced inline (SQ_TWIN, simd.h) so that a caller compiled with FMA gets fmaf as one
 * instruction.
 */
#ifndef SMOLQ_EXP_GGML_H
#define SMOLQ_EXP_GGML_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"
#include "quants/quants.h"

SQ_TWIN float exp_ggml(float x) {
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = sq_f32_bits(z) << 23;
    const float k = sq_bits_f32(e + sq_f32_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(j, k, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = sq_bits_f32(g + 0x7f000000u), s2 = sq_bits_f32(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

/* e^x for x <= 0 as exp_ggml computes it (the same operations, so the same bits down to
 * x = -87), without its branch for |n| > 126: x is held at -87 or above, where e^x is
 * 1.6e-38, a weight that no sum of one attention chunk's weights (flash_attention.c) can
 * feel. */
SQ_TWIN float exp_le0(float x) {
    x = -87.0f > x ? -87.0f : x;
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float k = sq_bits_f32((sq_f32_bits(z) << 23) + sq_f32_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    return fmaf(j, k, k);
}

#ifdef SQ_X86
/* exp_ggml eight lanes at a time, the same operations lane by lane, for lanes whose
 * n = round(x / ln 2) lies within +-126 (its case without the branch); n goes to *n_out so
 * that a caller can tell which lanes those are. */
SQ_AVX2 static inline __m256 exp_ggml_near_v(__m256 x, __m256 *n_out) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(z), 23),
                                                          _mm256_set1_epi32(0x3f800000)));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    *n_out = n;
    return _mm256_fmadd_ps(j, k, k);
}
#endif

/* SiLU(gate) * up, as llama.cpp's fused SwiGLU: x / (1 + exp(0 - x)), then the product. */
SQ_TWIN float swiglu_ggml(float gate, float up) {
    return gate / (1.0f + exp_ggml(0.0f - gate)) * up;
}

#endif
