/* quants/arm/neon.c: NEON (AArch64 Advanced SIMD) versions of the vec_dot functions,
 * and of the batched Q4_K and Q6_K products.
 *
 * Advanced SIMD is part of every AArch64 CPU, so quants/dispatch.c uses these whenever
 * it is built for one (unless SMOLQ_SIMD=0 or sq_set_simd(0) asks for the scalar code).
 * Only baseline ARMv8-A instructions are needed. Where the compiler targets the
 * dot-product extension (ARMv8.2's SDOT, e.g. -mcpu=native on a core that has it),
 * the two helpers that sum int8 products use it instead; the sums are the same.
 *
 * Every function gives exactly the bits of its scalar twin in quants/scalar.c, by the
 * rules of quants/types.h. Here that means:
 *  - the 8-lane types keep AVX2's 8 float accumulators as two float32x4_t (lanes
 *    0..3 and 4..7); each block updates them with one fused multiply-add (vfmaq, as
 *    the scalar code's fmaf) and the row ends in sq_hsum8's order;
 *  - the single-chain types (Q4_0, IQ4_NL, Q4_K) form a block's whole integer
 *    sum and run the scalar chain of fmaf in block order;
 *  - scale products (d * dy) are plain float multiplies in statements of their own.
 *
 * Products of two int8 codes always fit an int16 (vmull_s8), and every sum after
 * that is widened to int32, so unlike AVX2's maddubs nothing here can saturate,
 * whatever the codes.
 */
#include "simd.h"

#ifdef SQ_NEON

#include <arm_neon.h>
#include <math.h>
#include <stdint.h>

#include "quants/kernels.h"

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------- */

/* f16 -> f32 by the hardware conversion: exact for every finite half and for
 * infinities, as quants/scalar.c's conversion is. */
static inline float half_to_f32(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* The 8 float lanes of the AVX2 kernels (lo: lanes 0..3, hi: 4..7), and the
 * 8 integer lane sums a block contributes to them. */
typedef struct { float32x4_t lo, hi; } f32x8;
typedef struct { int32x4_t lo, hi; } i32x8;

static inline f32x8 f32x8_zero(void) {
    f32x8 r = { vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) };
    return r;
}

static inline i32x8 i32x8_zero(void) {
    i32x8 r = { vdupq_n_s32(0), vdupq_n_s32(0) };
    return r;
}

/* acc[l] += d * lane[l], rounded once: scalar.c's fma_lanes. */
static inline f32x8 fma_lanes(f32x8 acc, float d, i32x8 lane) {
    acc.lo = vfmaq_n_f32(acc.lo, vcvtq_f32_s32(lane.lo), d);
    acc.hi = vfmaq_n_f32(acc.hi, vcvtq_f32_s32(lane.hi), d);
    return acc;
}

/* sq_hsum8 (simd.h) of the two registers: lane l + lane l+4 first, then the upper
 * pair of that onto the lower, then the last two. */
static inline float sum_lanes(f32x8 acc) {
    const float32x4_t t = vaddq_f32(acc.lo, acc.hi);
    const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));
    return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

/* Lane l of the result is the sum of the products of elements 4l..4l+3: exactly
 * what SDOT computes, and otherwise two widening multiplies and pairwise adds. */
static inline int32x4_t dot16_by4(int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), w, a);
#else
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, a));
    return vpaddq_s32(lo, hi);
#endif
}

/* The 8 lane sums of a 32-element chunk: codes w0 (elements 0..15) and w1
 * (16..31) times the activations a, each half times its own scale. */
static inline i32x8 add_chunk(i32x8 acc, int8x16_t w0, int8x16_t w1, const int8_t *a, int32_t s0, int32_t s1) {
    acc.lo = vmlaq_n_s32(acc.lo, dot16_by4(w0, vld1q_s8(a)), s0);
    acc.hi = vmlaq_n_s32(acc.hi, dot16_by4(w1, vld1q_s8(a + 16)), s1);
    return acc;
}

/* add_chunk for the types with one scale per block, applied in float later. */
static inline i32x8 chunk_lanes(int8x16_t w0, int8x16_t w1, const int8_t *a) {
    return add_chunk(i32x8_zero(), w0, w1, a, 1, 1);
}

/* The sum of 16 products, as four int32 partial sums: for callers that only
 * need the total, where the grouping does not matter. */
static inline int32x4_t dot16_partial(int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), w, a);
#else
    const int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));
    return vpadalq_s16(s, vmull_high_s8(w, a));
#endif
}

/* The whole integer sum of a 32-element chunk, w0 and w1 as in add_chunk. */
static inline int32_t dot32_total(int8x16_t w0, int8x16_t w1, const int8_t *a) {
    const int32x4_t s = vaddq_s32(dot16_partial(w0, vld1q_s8(a)), dot16_partial(w1, vld1q_s8(a + 16)));
    return vaddvq_s32(s);
}

/* Lane l = m[2l] * b[2l] + m[2l+1] * b[2l+1] over 16 (factor, bsum) pairs: the
 * lanes of Q2_K's mins and Q6_K's offsets (AVX2's madd of 16 int16 pairs). */
static inline i32x8 pair_lanes(int16x8_t m0, int16x8_t m1, const int16_t *bsums) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    i32x8 r;
    r.lo = vpaddq_s32(vmull_s16(vget_low_s16(m0), vget_low_s16(b0)), vmull_high_s16(m0, b0));
    r.hi = vpaddq_s32(vmull_s16(vget_low_s16(m1), vget_low_s16(b1)), vmull_high_s16(m1, b1));
    return r;
}

/* 16 bytes of nibbles as 32 codes 0..15: the low nibbles are elements 0..15,
 * the high ones 16..31 (the order of Q4_0, Q4_1, Q5_x and the IQ4 blocks). */
static inline void unpack_nibbles(const uint8_t *q, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t b = vld1q_u8(q);
    *lo = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0f)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
}

/* Bit 4 of 16 consecutive Q5_0/Q5_1 codes, as 0x10 or 0: element j's is bit
 * j % 8 of qh[j / 8], so each qh byte is spread over 8 lanes and tested
 * against one bit per lane. */
static inline int8x16_t q5_bit4(const uint8_t *qh) {
    static const uint8_t bit[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
    const uint8x16_t spread = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(spread, vld1q_u8(bit)), vdupq_n_u8(0x10)));
}

/* The 16 IQ4_NL grid values, for a byte table lookup (TBL) of 16 codes at once. */
static const int8_t iq4_grid[16] = { SQ_IQ4_GRID };

static inline void iq4_values(const uint8_t *q, int8x16_t grid, int8x16_t *lo, int8x16_t *hi) {
    int8x16_t ilo, ihi;
    unpack_nibbles(q, &ilo, &ihi);
    *lo = vqtbl1q_s8(grid, vreinterpretq_u8_s8(ilo));
    *hi = vqtbl1q_s8(grid, vreinterpretq_u8_s8(ihi));
}

/* The 8 6-bit scales and mins of a Q4_K/Q5_K block (blocks.h's sq_k_scale_min). */
static inline void k_scales_mins(const uint8_t *s, int32_t sc[8], int32_t mn[8]) {
    for (int j = 0; j < 8; j++) {
        int a, b;
        sq_k_scale_min(s, j, &a, &b);
        sc[j] = a;
        mn[j] = b;
    }
}

/* sum over groups of 32 of mn[g] * (bsums[2g] + bsums[2g+1]): the min term of a
 * Q4_K/Q5_K block. bsums are widened before they are paired, so any values do. */
static inline int32_t k_min_total(const int32_t mn[8], const int16_t *bsums) {
    const int32x4_t pairs0 = vpaddlq_s16(vld1q_s16(bsums)), pairs1 = vpaddlq_s16(vld1q_s16(bsums + 8));
    const int32x4_t s = vmlaq_s32(vmulq_s32(vld1q_s32(mn), pairs0), vld1q_s32(mn + 4), pairs1);
    return vaddvq_s32(s);
}

/* ---------------------------------------------------------------------------
 * 32-element blocks with Q8_0 / Q8_1 activations
 * ------------------------------------------------------------------------- */

float sq_vec_dot_q8_0_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q8_0 *x = row, *y = xq;
    f32x8 acc = f32x8_zero();
    for (int64_t i = 0; i < nb; i++) {
        const int8x16_t w0 = vld1q_s8(x[i].qs), w1 = vld1q_s8(x[i].qs + 16);
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = fma_lanes(acc, d, chunk_lanes(w0, w1, y[i].qs));
    }
    return sum_lanes(acc);
}

/* Q4_0 and IQ4_NL run one fmaf chain over whole-block sums (see scalar.c). */
float sq_vec_dot_q4_0_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q4_0 *x = row;
    const block_q8_0 *y = xq;
    const int8x16_t eight = vdupq_n_s8(8);
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        unpack_nibbles(x[i].qs, &w0, &w1);
        const int32_t isum = dot32_total(vsubq_s8(w0, eight), vsubq_s8(w1, eight), y[i].qs);
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = fmaf((float)isum, d, acc);
    }
    return acc;
}

float sq_vec_dot_iq4_nl_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_iq4_nl *x = row;
    const block_q8_0 *y = xq;
    const int8x16_t grid = vld1q_s8(iq4_grid);
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        iq4_values(x[i].qs, grid, &w0, &w1);
        const int32_t isum = dot32_total(w0, w1, y[i].qs);
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = fmaf((float)isum, d, acc);
    }
    return acc;
}

/* The offset terms m * s have a float sum of their own, added after the lanes. */
float sq_vec_dot_q4_1_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q4_1 *x = row;
    const block_q8_1 *y = xq;
    f32x8 acc = f32x8_zero();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        unpack_nibbles(x[i].qs, &w0, &w1);
        const float ms = half_to_f32(x[i].m) * half_to_f32(y[i].s);
        summs += ms;
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = fma_lanes(acc, d, chunk_lanes(w0, w1, y[i].qs));
    }
    return sum_lanes(acc) + summs;
}

/* The 5-bit codes of a Q5_0/Q5_1 block, 0..31. */
static inline void q5_codes(const uint8_t *qs, const uint8_t *qh, int8x16_t *lo, int8x16_t *hi) {
    int8x16_t n0, n1;
    unpack_nibbles(qs, &n0, &n1);
    *lo = vorrq_s8(n0, q5_bit4(qh));
    *hi = vorrq_s8(n1, q5_bit4(qh + 2));
}

float sq_vec_dot_q5_0_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q5_0 *x = row;
    const block_q8_0 *y = xq;
    const int8x16_t sixteen = vdupq_n_s8(16);
    f32x8 acc = f32x8_zero();
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        q5_codes(x[i].qs, x[i].qh, &w0, &w1);
        const i32x8 lane = chunk_lanes(vsubq_s8(w0, sixteen), vsubq_s8(w1, sixteen), y[i].qs);
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc);
}

float sq_vec_dot_q5_1_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q5_1 *x = row;
    const block_q8_1 *y = xq;
    f32x8 acc = f32x8_zero();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        q5_codes(x[i].qs, x[i].qh, &w0, &w1);
        const float ms = half_to_f32(x[i].m) * half_to_f32(y[i].s);
        summs += ms;
        const float d = half_to_f32(x[i].d) * half_to_f32(y[i].d);
        acc = fma_lanes(acc, d, chunk_lanes(w0, w1, y[i].qs));
    }
    return sum_lanes(acc) + summs;
}

/* ---------------------------------------------------------------------------
 * 256-element blocks with Q8_K activations
 *
 * A K-quant block is 8 chunks of 32 elements. Each chunk's first 16 elements
 * feed lanes 0..3 and its last 16 lanes 4..7, and a group of 16 always lies in
 * one of those halves, so a group's scale multiplies whole lanes.
 * ------------------------------------------------------------------------- */

/* Q2_K: the min lanes go into the accumulators first, by -(dy * dmin); then the
 * code lanes by dy * d. Byte l of each 32 of qs holds, in bit pairs 2c..2c+1,
 * element 32c + l of its 128-element half. */
float sq_vec_dot_q2_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q2_K *x = row;
    const block_q8_K *y = xq;
    const uint8x16_t m3 = vdupq_n_u8(3);
    f32x8 acc = f32x8_zero();
    for (int64_t i = 0; i < nb; i++) {
        const uint8x16_t packed = vld1q_u8(x[i].scales);
        const uint8x16_t mins = vshrq_n_u8(packed, 4);
        const int16x8_t mn0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
        const int16x8_t mn1 = vreinterpretq_s16_u16(vmovl_high_u8(mins));
        const float dmin = -(y[i].d * half_to_f32(x[i].dmin));
        acc = fma_lanes(acc, dmin, pair_lanes(mn0, mn1, y[i].bsums));

        i32x8 lane = i32x8_zero();
        for (int h = 0; h < 2; h++) {
            const uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * h), b1 = vld1q_u8(x[i].qs + 32 * h + 16);
            for (int c = 0; c < 4; c++) {
                const int g = 8 * h + 2 * c;
                const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * c));
                const int8x16_t q0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b0, shift), m3));
                const int8x16_t q1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b1, shift), m3));
                lane = add_chunk(lane, q0, q1, y[i].qs + 128 * h + 32 * c, x[i].scales[g] & 0x0f,
                                 x[i].scales[g + 1] & 0x0f);
            }
        }
        const float d = y[i].d * half_to_f32(x[i].d);
        acc = fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc);
}

/* The 16 scales of a Q3_K block, sc - 32 (blocks.h's sq_q3_K_scale). */
static inline void q3_K_scales(const uint8_t *s, int32_t sc[16]) {
    for (int g = 0; g < 16; g++)
        sc[g] = sq_q3_K_scale(s, g);
}

/* Q3_K: the low 2 bits as in Q2_K; element 32c + l of half h has its high bit
 * at bit 4h + c of hmask[l], and its code is low2 - 4 unless that bit is set. */
float sq_vec_dot_q3_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q3_K *x = row;
    const block_q8_K *y = xq;
    const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    f32x8 acc = f32x8_zero();
    for (int64_t i = 0; i < nb; i++) {
        int32_t sc[16];
        q3_K_scales(x[i].scales, sc);
        const uint8x16_t hm0 = vld1q_u8(x[i].hmask), hm1 = vld1q_u8(x[i].hmask + 16);
        i32x8 lane = i32x8_zero();
        for (int h = 0; h < 2; h++) {
            const uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * h), b1 = vld1q_u8(x[i].qs + 32 * h + 16);
            for (int c = 0; c < 4; c++) {
                const int g = 8 * h + 2 * c;
                const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * c));
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + c)));
                /* low2 | 4 when the bit is set, then - 4: low2 - 4 or low2. */
                const uint8x16_t u0 = vorrq_u8(vandq_u8(vshlq_u8(b0, shift), m3), vandq_u8(vtstq_u8(hm0, bit), four));
                const uint8x16_t u1 = vorrq_u8(vandq_u8(vshlq_u8(b1, shift), m3), vandq_u8(vtstq_u8(hm1, bit), four));
                const int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(u0), vreinterpretq_s8_u8(four));
                const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(u1), vreinterpretq_s8_u8(four));
                lane = add_chunk(lane, q0, q1, y[i].qs + 128 * h + 32 * c, sc[g], sc[g + 1]);
            }
        }
        const float d = y[i].d * half_to_f32(x[i].d);
        acc = fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc);
}

/* Q4_K: 32 bytes of qs per 64 elements, low nibbles for group 2c, high for 2c+1. */
typedef struct { int8x16_t lo[4][2], hi[4][2]; } q4_K_codes;

static inline void unpack_q4_K(const uint8_t *qs, q4_K_codes *q) {
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 2; k++) {
            const uint8x16_t b = vld1q_u8(qs + 32 * c + 16 * k);
            q->lo[c][k] = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0f)));
            q->hi[c][k] = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
        }
}

/* The exact integer sum of span c (elements 64c..64c+63) of a Q4_K block, scaled by group. */
static inline int32_t q4_K_span(const q4_K_codes *q, int c, const int32_t sc[8], const int8_t *a) {
    const int8_t *lo = a + 64 * c, *hi = lo + 32;
    int32x4_t s = vmulq_n_s32(vaddq_s32(dot16_partial(q->lo[c][0], vld1q_s8(lo)),
                                        dot16_partial(q->lo[c][1], vld1q_s8(lo + 16))), sc[2 * c]);
    s = vmlaq_n_s32(s, vaddq_s32(dot16_partial(q->hi[c][0], vld1q_s8(hi)),
                                 dot16_partial(q->hi[c][1], vld1q_s8(hi + 16))), sc[2 * c + 1]);
    return vaddvq_s32(s);
}

/* One fmaf chain for the codes and one for the mins, in block order, subtracted
 * at the end (scalar.c's vec_dot_q4_K). */
float sq_vec_dot_q4_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q4_K *x = row;
    const block_q8_K *y = xq;
    float sumf = 0.0f, summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sc[8], mn[8];
        k_scales_mins(x[i].scales, sc, mn);
        q4_K_codes q;
        unpack_q4_K(x[i].qs, &q);
        int32_t isum = 0;
        for (int c = 0; c < 4; c++)
            isum += q4_K_span(&q, c, sc, y[i].qs);
        const float d = half_to_f32(x[i].d) * y[i].d;
        const float dmin = half_to_f32(x[i].dmin) * y[i].d;
        sumf = fmaf((float)isum, d, sumf);
        summ = fmaf((float)k_min_total(mn, y[i].bsums), dmin, summ);
    }
    return sumf - summ;
}

/* Q5_K: Q4_K's codes plus bit 4, which for element l of group 2c (2c+1) is bit
 * 2c (2c+1) of qh[l]. The codes go into lanes; the mins are one integer per
 * block, fma'd by -(dy * dmin) into a float of their own added at the end. */
float sq_vec_dot_q5_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q5_K *x = row;
    const block_q8_K *y = xq;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m16 = vdupq_n_u8(0x10);
    f32x8 acc = f32x8_zero();
    float summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sc[8], mn[8];
        k_scales_mins(x[i].scales, sc, mn);
        const float dmin = -(y[i].d * half_to_f32(x[i].dmin));
        summ = fmaf(dmin, (float)k_min_total(mn, y[i].bsums), summ);

        const uint8x16_t hb0 = vld1q_u8(x[i].qh), hb1 = vld1q_u8(x[i].qh + 16);
        i32x8 lane = i32x8_zero();
        for (int c = 0; c < 4; c++) {
            const uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * c), b1 = vld1q_u8(x[i].qs + 32 * c + 16);
            const uint8x16_t bit_lo = vdupq_n_u8((uint8_t)(1u << (2 * c))), bit_hi = vdupq_n_u8((uint8_t)(2u << (2 * c)));
            const int8x16_t lo0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b0, m4), vandq_u8(vtstq_u8(hb0, bit_lo), m16)));
            const int8x16_t lo1 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b1, m4), vandq_u8(vtstq_u8(hb1, bit_lo), m16)));
            const int8x16_t hi0 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b0, 4), vandq_u8(vtstq_u8(hb0, bit_hi), m16)));
            const int8x16_t hi1 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b1, 4), vandq_u8(vtstq_u8(hb1, bit_hi), m16)));
            lane = add_chunk(lane, lo0, lo1, y[i].qs + 64 * c, sc[2 * c], sc[2 * c]);
            lane = add_chunk(lane, hi0, hi1, y[i].qs + 64 * c + 32, sc[2 * c + 1], sc[2 * c + 1]);
        }
        const float d = y[i].d * half_to_f32(x[i].d);
        acc = fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc) + summ;
}

/* The unsigned 6-bit codes (0..63) of a Q6_K block, chunk 4h + k holding
 * elements 128h + 32k .. +31 as two registers of 16. Byte l of ql (ql + 32)
 * gives the low nibble of elements l and 64 + l (32 + l and 96 + l) of a half;
 * bits 2k..2k+1 of qh[l] the top bits of element 32k + l. */
static inline void q6_K_codes(const block_q6_K *b, int8x16_t q[8][2]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(3);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 2; k++) {
            const uint8x16_t l0 = vld1q_u8(b->ql + 64 * h + 16 * k);
            const uint8x16_t l1 = vld1q_u8(b->ql + 64 * h + 32 + 16 * k);
            const uint8x16_t hb = vld1q_u8(b->qh + 32 * h + 16 * k);
            const uint8x16_t top0 = vshlq_n_u8(vandq_u8(hb, m3), 4);
            const uint8x16_t top1 = vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4);
            const uint8x16_t top2 = vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4);
            const uint8x16_t top3 = vshlq_n_u8(vshrq_n_u8(hb, 6), 4);
            q[4 * h + 0][k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l0, m4), top0));
            q[4 * h + 1][k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l1, m4), top1));
            q[4 * h + 2][k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l0, 4), top2));
            q[4 * h + 3][k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l1, 4), top3));
        }
}

/* Q6_K: the lanes take the unsigned codes, and the -32 comes off as 32 times the
 * (scale, bsum) pair lanes, two groups per lane, as in scalar.c's vec_dot_q6_K:
 * a lane's integer differs from that of its own elements' signed codes, so the
 * signed codes would not give the same bits. */
float sq_vec_dot_q6_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q6_K *x = row;
    const block_q8_K *y = xq;
    f32x8 acc = f32x8_zero();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *sc = x[i].scales;
        int8x16_t q[8][2];
        q6_K_codes(&x[i], q);
        i32x8 lane = i32x8_zero();
        for (int j = 0; j < 8; j++)
            lane = add_chunk(lane, q[j][0], q[j][1], y[i].qs + 32 * j, sc[2 * j], sc[2 * j + 1]);
        const int8x16_t sc8 = vld1q_s8(sc);
        const i32x8 off = pair_lanes(vmovl_s8(vget_low_s8(sc8)), vmovl_high_s8(sc8), y[i].bsums);
        lane.lo = vsubq_s32(lane.lo, vshlq_n_s32(off.lo, 5));
        lane.hi = vsubq_s32(lane.hi, vshlq_n_s32(off.hi, 5));
        const float d = y[i].d * half_to_f32(x[i].d);
        acc = fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc);
}

/* IQ4_XS: 8 IQ4_NL-coded groups of 32, each with its scale s - 32 applied to its
 * lane sums; the 8 groups are summed in integers before the block's one FMA. */
float sq_vec_dot_iq4_xs_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_iq4_xs *x = row;
    const block_q8_K *y = xq;
    const int8x16_t grid = vld1q_s8(iq4_grid);
    f32x8 acc = f32x8_zero();
    for (int64_t i = 0; i < nb; i++) {
        i32x8 lane = i32x8_zero();
        for (int g = 0; g < 8; g++) {
            const int s = sq_iq4_xs_scale(&x[i], g);
            int8x16_t w0, w1;
            iq4_values(x[i].qs + 16 * g, grid, &w0, &w1);
            lane = add_chunk(lane, w0, w1, y[i].qs + 32 * g, s - 32, s - 32);
        }
        const float d = half_to_f32(x[i].d) * y[i].d;
        acc = fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc);
}

/* ---------------------------------------------------------------------------
 * Batches: one weight row times n_tokens activation rows, stride bytes apart.
 * The block is unpacked once for every row; each row's float steps are the
 * scalar batch functions' (quants/batch.c's sq_batch_dot_q4_K and sq_batch_dot_k).
 * ------------------------------------------------------------------------- */

static inline const block_q8_K *act_block(const void *xq, int64_t stride, int t, int64_t i) {
    return (const block_q8_K *)((const uint8_t *)xq + t * stride) + i;
}

/* Q4_K in the repacked gemm's order: per 64 elements an integer code sum and a
 * min term, each fma'd into its own chain; tokens in tiles of 16 so that the
 * chains stay in registers or at least in L1. */
void sq_batch_dot_q4_K_neon(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy) {
    enum { TILE = 16 };
    const block_q4_K *x = row;
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        float sumf[TILE] = {0}, summ[TILE] = {0};
        for (int64_t i = 0; i < nb; i++) {
            int32_t sc[8], mn[8];
            k_scales_mins(x[i].scales, sc, mn);
            q4_K_codes q;
            unpack_q4_K(x[i].qs, &q);
            const float dw = half_to_f32(x[i].d), dminw = half_to_f32(x[i].dmin);
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = act_block(xq, stride, t0 + t, i);
                const float d = dw * a->d, dmin = dminw * a->d;
                for (int c = 0; c < 4; c++) {
                    const int16_t *bs = a->bsums + 4 * c;
                    const int32_t imin = mn[2 * c] * (bs[0] + bs[1]) + mn[2 * c + 1] * (bs[2] + bs[3]);
                    sumf[t] = fmaf((float)q4_K_span(&q, c, sc, a->qs), d, sumf[t]);
                    summ[t] = fmaf((float)imin, dmin, summ[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            y[(t0 + t) * ldy] = sumf[t] - summ[t];
    }
}

/* Q6_K in the tiled order: per block the exact s1 = sum(sc * (q - 32) * qy), then
 * y = fma(d * s1, dy, y). The signed codes q - 32 are formed once per block. */
void sq_batch_dot_q6_K_neon(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy) {
    const block_q6_K *x = row;
    const int8x16_t bias = vdupq_n_s8(32);
    for (int t = 0; t < n_tokens; t++)
        y[t * ldy] = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t q[8][2];
        q6_K_codes(&x[i], q);
        for (int j = 0; j < 8; j++) {
            q[j][0] = vsubq_s8(q[j][0], bias);
            q[j][1] = vsubq_s8(q[j][1], bias);
        }
        const int8_t *sc = x[i].scales;
        const float d = half_to_f32(x[i].d);
        for (int t = 0; t < n_tokens; t++) {
            const block_q8_K *a = act_block(xq, stride, t, i);
            int32x4_t s = vdupq_n_s32(0);
            for (int j = 0; j < 8; j++) {
                s = vmlaq_n_s32(s, dot16_partial(q[j][0], vld1q_s8(a->qs + 32 * j)), sc[2 * j]);
                s = vmlaq_n_s32(s, dot16_partial(q[j][1], vld1q_s8(a->qs + 32 * j + 16)), sc[2 * j + 1]);
            }
            const float r = d * (float)vaddvq_s32(s);
            y[t * ldy] = fmaf(r, a->d, y[t * ldy]);
        }
    }
}

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_neon_unused;
#endif
