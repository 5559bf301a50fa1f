/* quants/x86/activations.c: the conversion of activations into Q8_0, Q8_1 and Q8_K blocks,
 * and into F16, with AVX2 and F16C (sq_quant_<format>_avx2), which runs before every
 * matrix product while the SIMD paths are on (quants/scalar.c's table entries choose it).
 *
 * Each gives the bytes of scalar.c's quant_q8_0_rows, quant_q8_1_rows or quant_q8_K_rows,
 * the definition, for every input, NaN and infinity included, because it does the same
 * float operations on the same values:
 *  - the largest magnitude is a float max of |x| (maxps passes over a NaN in its first
 *    operand, as abs_max counts a NaN as 0); for non-negative floats that orders as
 *    abs_max's comparison of bits does;
 *  - scales are the same divisions, one instruction for eight Q8_0/Q8_1 blocks;
 *  - codes are x * scale, then + 1.5 * 2^23, rounded twice as scalar.c's separate
 *    multiply and add are (never a fused multiply-add); nearest_int's result as int8 is
 *    the low byte of that sum's bits, whatever the sum (a NaN's payload, infinity's 0),
 *    and the low byte is what these keep (vpand, then unsigned packs, which saturate
 *    nothing below 256);
 *  - f16 scales go through F16C's conversion with round-to-nearest-even, which equals
 *    sq_fp32_to_fp16 for every one of the 2^32 floats (overflow, subnormals and NaN
 *    payloads included).
 * That holds with the MXCSR at its default, which nothing in the engine changes: with
 * denormals-are-zero, maxps would take a subnormal for 0 where abs_max compares bits.
 *
 * The scale of a block, or of a group of eight, waits on a reduction and a division;
 * the next one's is worked out before this one's codes, which then hide that wait
 * (1.15x to 1.2x as fast on 2048-wide rows).
 *
 * An AVX-512 copy (vpmovdb narrowing sixteen codes at once in place of vpand and packs)
 * converted 4-5% faster on a Zen 4, whose 512-bit instructions take two 256-bit halves:
 * not enough for a second copy and its dispatch.
 */
#include "simd.h"

#ifdef SQ_X86

#include <stdint.h>
#include <string.h>

#include "quants/kernels.h"

#define TARGET SQ_AVX2
#define INLINE static inline __attribute__((always_inline)) TARGET

/* 1.5 * 2^23: added to |v| < 2^22, it leaves round(v) (ties to even) in the low mantissa
 * bits, as nearest_int (quants/scalar.c) does. */
#define ROUNDER 12582912.f

/* ---------------------------------------------------------------------------
 * Shared steps
 * ------------------------------------------------------------------------- */

/* max(|x|, m) lane by lane, m free of NaN: maxps returns its second operand when either
 * is NaN, so a NaN in x leaves m as it was. */
INLINE __m256 max_abs(__m256 x, __m256 m) {
    return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), m);
}

/* The largest |x| of 32 floats, NaNs passed over, in each lane of its register. */
INLINE __m256 max_abs32(const float *x) {
    __m256 m = max_abs(_mm256_loadu_ps(x), _mm256_setzero_ps());
    for (int j = 8; j < 32; j += 8)
        m = max_abs(_mm256_loadu_ps(x + j), m);
    return m;
}

/* The largest of m's lanes, in every lane. */
INLINE __m256 all_lanes_max(__m256 m) {
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4e));
    return _mm256_max_ps(m, _mm256_permute_ps(m, 0xb1));
}

/* Lane b: the largest of m[b]'s lanes. */
INLINE __m256 lane_maxes(const __m256 m[8]) {
    __m256 t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_max_ps(_mm256_unpacklo_ps(m[2 * i], m[2 * i + 1]), _mm256_unpackhi_ps(m[2 * i], m[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        u[i] = _mm256_max_ps(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], 0xee));
    return _mm256_max_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

/* Lane b: the sum of s[b]'s lanes. */
INLINE __m256i lane_sums(const __m256i s[8]) {
    const __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* x * scale + 1.5 * 2^23 for 8 x, as bits: the multiply first, as scalar.c writes it. */
INLINE __m256i rounded_bits(const float *x, __m256 scale) {
    return _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x), scale), _mm256_set1_ps(ROUNDER)));
}

/* The 32 bytes, in order, that sit in the low bytes of q[0..3]'s lanes (the rest zero). */
INLINE __m256i low_bytes(const __m256i q[4]) {
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]), _mm256_packus_epi32(q[2], q[3]));
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The sums of the signed bytes of q, four to each int32 lane. */
INLINE __m256i byte_sums(__m256i q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
}

/* ---------------------------------------------------------------------------
 * Q8_0 and Q8_1: blocks of 32, eight at a time
 * ------------------------------------------------------------------------- */

/* The codes of 32 x as q8_32_codes makes them: (int8_t)nearest_int(x * id). */
INLINE __m256i codes_q8_32(const float *x, __m256 id) {
    __m256i q[4];
    for (int j = 0; j < 4; j++)
        q[j] = _mm256_and_si256(rounded_bits(x + 8 * j, id), _mm256_set1_epi32(0xff));
    return low_bytes(q);
}

/* Lane b: the largest |x| of block b (of k, 1..8) of 32, NaNs passed over; 0 past k. */
INLINE __m256 group_amax(const float *x, const int k) {
    __m256 m[8];
    for (int b = 0; b < 8; b++)
        m[b] = b < k ? max_abs32(x + 32 * b) : _mm256_setzero_ps();
    return lane_maxes(m);
}

/* k (1..8) blocks of Q8_0 (sum 0) or Q8_1 (sum 1) from x into y, given their amax. Eight
 * blocks share the divisions, which take longer than the rest of a block. */
INLINE void group_codes(const float *x, uint8_t *y, const int k, __m256 amax, const int sum) {
    const size_t size = sum ? sizeof(block_q8_1) : sizeof(block_q8_0), qs = sum ? 4 : 2;
    const __m256 nonzero = _mm256_cmp_ps(amax, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(127.f), amax), nonzero);
    const __m256 d = _mm256_div_ps(amax, _mm256_set1_ps(127.f));
    __m256i sums[8];
    for (int b = 0; b < 8; b++) {
        sums[b] = _mm256_setzero_si256();
        if (b < k) {
            const __m256i q = codes_q8_32(x + 32 * b, _mm256_permutevar8x32_ps(id, _mm256_set1_epi32(b)));
            _mm256_storeu_si256((__m256i *)(y + b * size + qs), q);
            if (sum)
                sums[b] = byte_sums(q);
        }
    }
    const __m128i dh = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
    if (sum) {
        /* s = d * sum(q), d as it was before its rounding to f16 */
        const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(lane_sums(sums)));
        const __m128i sh = _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT);
        uint32_t ds[8];
        _mm_storeu_si128((__m128i *)ds, _mm_unpacklo_epi16(dh, sh));
        _mm_storeu_si128((__m128i *)(ds + 4), _mm_unpackhi_epi16(dh, sh));
        for (int b = 0; b < k; b++)
            memcpy(y + b * size, &ds[b], 4);
    } else {
        uint16_t d16[8];
        _mm_storeu_si128((__m128i *)d16, dh);
        for (int b = 0; b < k; b++)
            memcpy(y + b * size, &d16[b], 2);
    }
}

/* Groups of eight blocks, each group's amax found before the group before it is coded;
 * the nb % 8 blocks left over make a last, short group. */
INLINE void q8_32_rows(const float *x, void *dst, int64_t nb, const int sum) {
    uint8_t *y = dst;
    const size_t size = sum ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int64_t full = nb / 8;
    const int rest = (int)(nb % 8);
    __m256 amax = full ? group_amax(x, 8) : group_amax(x, rest);
    for (int64_t g = 0; g < full; g++) {
        const float *next = x + 256 * (g + 1);
        const __m256 next_amax = g + 1 < full ? group_amax(next, 8) : rest ? group_amax(next, rest) : amax;
        group_codes(x + 256 * g, y + 8 * g * size, 8, amax, sum);
        amax = next_amax;
    }
    if (rest)
        group_codes(x + 256 * full, y + 8 * full * size, rest, amax, sum);
}

TARGET void sq_quant_q8_0_avx2(const float *x, void *dst, int64_t nb) { q8_32_rows(x, dst, nb, 0); }

TARGET void sq_quant_q8_1_avx2(const float *x, void *dst, int64_t nb) { q8_32_rows(x, dst, nb, 1); }

/* ---------------------------------------------------------------------------
 * Q8_K: blocks of 256
 * ------------------------------------------------------------------------- */

/* The least j with |x[j]| == amax (> 0, in every lane of its register), given each run of
 * 32's largest |x| (chunk): the first run that reaches amax, then its first element that
 * does. A NaN equals nothing. (Found without branches, from bit masks of every
 * comparison, it took a fifth longer on rows of random values.) */
INLINE int first_of_max(const float *x, const __m256 chunk[8], __m256 amax) {
    for (int c = 0; c < 8; c++) {
        if (!_mm256_movemask_ps(_mm256_cmp_ps(chunk[c], amax, _CMP_EQ_OQ)))
            continue;
        for (int j = 32 * c; j < 32 * c + 32; j += 8) {
            const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j));
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, amax, _CMP_EQ_OQ));
            if (hit)
                return j + __builtin_ctz((unsigned)hit);
        }
    }
    return QK_K - 1; /* not reached: amax is one of the |x| */
}

/* The codes of 32 x as quant_q8_K_rows makes them: (int8_t)min(nearest_int(iscale * x),
 * 127). nearest_int is the sum's low 23 bits less 2^22, so the min is taken on those
 * bits, against 2^22 + 127. */
INLINE __m256i codes_q8_K(const float *x, __m256 iscale) {
    __m256i q[4];
    for (int j = 0; j < 4; j++) {
        const __m256i m = _mm256_and_si256(rounded_bits(x + 8 * j, iscale), _mm256_set1_epi32(0x7fffff));
        q[j] = _mm256_and_si256(_mm256_min_epi32(m, _mm256_set1_epi32(0x40007f)), _mm256_set1_epi32(0xff));
    }
    return low_bytes(q);
}

/* bsums from the block's codes, 32 to a register: per register lane h (group 2c + h),
 * maddubs's pair sums, then three rounds of pairwise adds across registers leave lane h
 * of the result with the groups 2c + h in order of c; interleaving the lanes puts them in
 * order. The sums, at most 16 * 127, fit int16. */
INLINE void bsums_q8_K(const __m256i q[8], int16_t *bsums) {
    __m256i s[8];
    for (int c = 0; c < 8; c++)
        s[c] = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q[c]);
    for (int w = 4; w >= 1; w /= 2)
        for (int c = 0; c < w; c++)
            s[c] = _mm256_hadd_epi16(s[2 * c], s[2 * c + 1]);
    const __m128i even = _mm256_castsi256_si128(s[0]), odd = _mm256_extracti128_si256(s[0], 1);
    _mm_storeu_si128((__m128i *)bsums, _mm_unpacklo_epi16(even, odd));
    _mm_storeu_si128((__m128i *)(bsums + 8), _mm_unpackhi_epi16(even, odd));
}

/* A block's iscale = -127 / max, max its first x of the largest magnitude; 0 (and no
 * iscale) for a block of zeros and NaNs. */
INLINE int q8_K_scale(const float *x, float *iscale) {
    __m256 chunk[8], all = _mm256_setzero_ps();
    for (int c = 0; c < 8; c++) {
        chunk[c] = max_abs32(x + 32 * c);
        all = _mm256_max_ps(chunk[c], all);
    }
    const __m256 amax = all_lanes_max(all);
    if (_mm256_cvtss_f32(amax) == 0.0f)
        return 0;
    *iscale = -127.f / x[first_of_max(x, chunk, amax)];
    return 1;
}

INLINE void q8_K_codes(const float *x, float iscale, block_q8_K *y) {
    __m256i q[8];
    for (int c = 0; c < 8; c++) {
        q[c] = codes_q8_K(x + 32 * c, _mm256_set1_ps(iscale));
        _mm256_storeu_si256((__m256i *)(y->qs + 32 * c), q[c]);
    }
    bsums_q8_K(q, y->bsums);
    y->d = 1.0f / iscale;
}

/* Each block's scale is found before the block before it is coded. */
TARGET void sq_quant_q8_K_avx2(const float *x, void *dst, int64_t nb) {
    block_q8_K *y = dst;
    float iscale = 0.0f;
    int nonzero = nb > 0 && q8_K_scale(x, &iscale);
    for (int64_t i = 0; i < nb; i++) {
        float next = 0.0f;
        const int next_nonzero = i + 1 < nb && q8_K_scale(x + (i + 1) * QK_K, &next);
        if (nonzero)
            q8_K_codes(x + i * QK_K, iscale, &y[i]);
        else
            memset(&y[i], 0, sizeof(y[i]));
        iscale = next;
        nonzero = next_nonzero;
    }
}

/* F16, eight values at a time through F16C (see above for why its rounding is
 * sq_fp32_to_fp16's), the last few one by one. */
TARGET void sq_quant_f16_avx2(const float *x, void *dst, int64_t n) {
    uint16_t *h = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        h[i] = sq_fp32_to_fp16(x[i]);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_activations_unused;
#endif
