/* quants/arm/neon.c: NEON (AArch64 Advanced SIMD) versions of the vec_dot functions,
 * and of every type's product of one row and a batch of tokens.
 *
 * Advanced SIMD is part of every AArch64 CPU, so quants/dispatch.c uses these whenever
 * it is built for one (unless SMOLQ_SIMD=0 or sq_set_simd(0) asks for the scalar code).
 * Only baseline ARMv8-A instructions are needed. Where the compiler targets the
 * dot-product extension (ARMv8.2's SDOT, e.g. -mcpu=native on a core that has it),
 * dot16 uses it instead; the integer sums are the same.
 *
 * Every output has exactly the bits of the scalar vec_dot in quants/scalar.c, by the
 * definition in quants/types.h. Here that means, for each block in row order:
 *  - the block's integer sum is formed exactly, in int32 lanes in whatever arrangement
 *    is cheapest (four partial sums, four groups' totals times their scales), then
 *    reduced to the one integer the float step needs: by ADDV, or in the batches
 *    four tokens' at once, one per lane (totals4);
 *  - the float step is the scalar one, (float)isum times dw * da with one fused
 *    multiply-add (fmaf, or vfmaq_f32 with one token per lane in the batches);
 *  - the offsets (mins, Q4_1/Q5_1's m * s) have a chain of their own, combined with
 *    the sum only at the end.
 *
 * Products of two int8 codes always fit an int16 (vmull_s8: |-128 * -128| = 2^14), and
 * every sum after that is widened to int32, so unlike AVX2's maddubs nothing here can
 * saturate, whatever the codes. The largest block sum (Q6_K's, < 2^28) fits int32 too.
 */
#include "simd.h"

#ifdef SQ_NEON

#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quants/kernels.h"

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------- */

/* f16 -> f32 by the hardware conversion: exact for every finite half and for
 * infinities, as quants/scalar.c's conversion is. */
static inline float half_to_f32(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* acc plus the 16 products of w and a, as four int32 partial sums (lane l takes
 * elements 4l..4l+3): SDOT, or two widening multiplies and pairwise adds. */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, a);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(a)));
    return vpadalq_s16(acc, vmull_high_s8(w, a));
#endif
}

/* The products of a 32-element chunk, codes w0 (elements 0..15) and w1 (16..31)
 * times the activations a, as four int32 partial sums. */
static inline int32x4_t dot32(int8x16_t w0, int8x16_t w1, const int8_t *a) {
    return dot16(dot16(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
}

/* Lane k: the total of the four lanes of p_k. Reduces four groups' (or four tokens')
 * partial sums at once, where four ADDVs would reduce them one by one. */
static inline int32x4_t totals4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* The block step of quants/types.h: the exact integer sum (the total of the
 * partial sums p) converted to float, times d, added to acc, rounded once. */
static inline float step(float acc, int32x4_t p, float d) {
    return fmaf((float)vaddvq_s32(p), d, acc);
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

/* The 16 IQ4 grid values, for a byte table lookup (TBL) of 16 codes at once. */
static const int8_t iq4_grid[16] = { SQ_IQ4_GRID };

static inline void iq4_values(const uint8_t *q, int8x16_t grid, int8x16_t *lo, int8x16_t *hi) {
    int8x16_t ilo, ihi;
    unpack_nibbles(q, &ilo, &ihi);
    *lo = vqtbl1q_s8(grid, vreinterpretq_u8_s8(ilo));
    *hi = vqtbl1q_s8(grid, vreinterpretq_u8_s8(ihi));
}

/* 16 int8 as four int32x4, in order. */
static inline void widen16(int8x16_t v, int32x4_t out[4]) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    out[0] = vmovl_s16(vget_low_s16(lo));
    out[1] = vmovl_high_s16(lo);
    out[2] = vmovl_s16(vget_low_s16(hi));
    out[3] = vmovl_high_s16(hi);
}

/* sum over 16 groups of f[g] * bsums[g] (Q2_K's mins, Q6_K's -32 times its scales),
 * as four partial sums. |f| <= 128 and |bsum| <= 2048, so each product fits easily. */
static inline int32x4_t bsums16_dot(const int16x8_t f[2], const int16_t *bsums) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    int32x4_t s = vmull_s16(vget_low_s16(f[0]), vget_low_s16(b0));
    s = vmlal_high_s16(s, f[0], b0);
    s = vmlal_s16(s, vget_low_s16(f[1]), vget_low_s16(b1));
    return vmlal_high_s16(s, f[1], b1);
}

/* ---------------------------------------------------------------------------
 * 32-element blocks with Q8_0 / Q8_1 activations: one block's four partial sums,
 * reduced by one ADDV, and its float step.
 * ------------------------------------------------------------------------- */

float sq_vec_dot_q8_0_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q8_0 *x = row, *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const int32x4_t p = dot32(vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16), y[i].qs);
        sum = step(sum, p, half_to_f32(x[i].d) * half_to_f32(y[i].d));
    }
    return sum;
}

float sq_vec_dot_q4_0_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q4_0 *x = row;
    const block_q8_0 *y = xq;
    const int8x16_t eight = vdupq_n_s8(8);
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        unpack_nibbles(x[i].qs, &w0, &w1);
        const int32x4_t p = dot32(vsubq_s8(w0, eight), vsubq_s8(w1, eight), y[i].qs);
        sum = step(sum, p, half_to_f32(x[i].d) * half_to_f32(y[i].d));
    }
    return sum;
}

float sq_vec_dot_iq4_nl_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_iq4_nl *x = row;
    const block_q8_0 *y = xq;
    const int8x16_t grid = vld1q_s8(iq4_grid);
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        iq4_values(x[i].qs, grid, &w0, &w1);
        sum = step(sum, dot32(w0, w1, y[i].qs), half_to_f32(x[i].d) * half_to_f32(y[i].d));
    }
    return sum;
}

/* The unsigned codes against the activations, and m * s in a chain of its own. */
float sq_vec_dot_q4_1_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q4_1 *x = row;
    const block_q8_1 *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        unpack_nibbles(x[i].qs, &w0, &w1);
        sum = step(sum, dot32(w0, w1, y[i].qs), half_to_f32(x[i].d) * half_to_f32(y[i].d));
        off = fmaf(half_to_f32(x[i].m), half_to_f32(y[i].s), off);
    }
    return sum + off;
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
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        q5_codes(x[i].qs, x[i].qh, &w0, &w1);
        const int32x4_t p = dot32(vsubq_s8(w0, sixteen), vsubq_s8(w1, sixteen), y[i].qs);
        sum = step(sum, p, half_to_f32(x[i].d) * half_to_f32(y[i].d));
    }
    return sum;
}

float sq_vec_dot_q5_1_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q5_1 *x = row;
    const block_q8_1 *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t w0, w1;
        q5_codes(x[i].qs, x[i].qh, &w0, &w1);
        sum = step(sum, dot32(w0, w1, y[i].qs), half_to_f32(x[i].d) * half_to_f32(y[i].d));
        off = fmaf(half_to_f32(x[i].m), half_to_f32(y[i].s), off);
    }
    return sum + off;
}

/* ---------------------------------------------------------------------------
 * 256-element blocks with Q8_K activations
 *
 * A block is decoded into codes by group (int8, scale not applied) and its group
 * scales as int32 lanes. A block's integer sum is then: each group's products as
 * partial sums, four groups' totals side by side (totals4), times the four groups'
 * scales, added up over the block; one ADDV at the end.
 * ------------------------------------------------------------------------- */

/* Q2_K, Q3_K and Q6_K: 16 groups of 16; group g's codes q[g] meet activations
 * 16g..16g+15. m: Q2_K's mins, Q6_K's scales again (for the offset term). */
typedef struct { int8x16_t q[16]; int32x4_t sc[4]; int16x8_t m[2]; } groups16;

/* sum over the 16 groups of sc[g] * (codes . activations), as four partial sums. */
static inline int32x4_t groups16_dot(const groups16 *w, const int8_t *a) {
    const int32x4_t zero = vdupq_n_s32(0);
    int32x4_t acc = zero;
    for (int j = 0; j < 4; j++) {
        const int8x16_t *q = w->q + 4 * j;
        const int8_t *aj = a + 64 * j;
        const int32x4_t t = totals4(dot16(zero, q[0], vld1q_s8(aj)), dot16(zero, q[1], vld1q_s8(aj + 16)),
                                    dot16(zero, q[2], vld1q_s8(aj + 32)), dot16(zero, q[3], vld1q_s8(aj + 48)));
        acc = vmlaq_s32(acc, t, w->sc[j]);
    }
    return acc;
}

/* Q4_K, Q5_K and IQ4_XS: 8 groups of 32; group g's codes q[g][0..1] meet
 * activations 32g..32g+31. mn: Q4_K/Q5_K's mins. */
typedef struct { int8x16_t q[8][2]; int32x4_t sc[2]; int16x8_t mn; } groups32;

static inline int32x4_t groups32_dot(const groups32 *w, const int8_t *a) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int j = 0; j < 2; j++) {
        const int g = 4 * j;
        const int32x4_t t = totals4(dot32(w->q[g][0], w->q[g][1], a + 32 * g),
                                    dot32(w->q[g + 1][0], w->q[g + 1][1], a + 32 * (g + 1)),
                                    dot32(w->q[g + 2][0], w->q[g + 2][1], a + 32 * (g + 2)),
                                    dot32(w->q[g + 3][0], w->q[g + 3][1], a + 32 * (g + 3)));
        acc = vmlaq_s32(acc, t, w->sc[j]);
    }
    return acc;
}

/* The min term of a Q4_K/Q5_K block, sum over groups of mn[g] * (bsums[2g] +
 * bsums[2g+1]), as four partial sums. A pair of bsums is at most 32 * 128 in
 * magnitude, so it fits an int16. */
static inline int32x4_t k_mins_dot(int16x8_t mn, const int16_t *bsums) {
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    return vmlal_high_s16(vmull_s16(vget_low_s16(mn), vget_low_s16(pairs)), mn, pairs);
}

/* The 2-bit codes at bits 2c..2c+1 of the 16 bytes b. */
static inline int8x16_t crumbs(uint8x16_t b, int c) {
    return vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b, vdupq_n_s8((int8_t)(-2 * c))), vdupq_n_u8(3)));
}

/* Q2_K: byte l of each 32 of qs holds, in bit pairs 2c..2c+1, element 32c + l of
 * its 128-element half: groups 8h + 2c (l < 16) and 8h + 2c + 1. Scale in the low
 * nibble of scales[g], min in the high one. */
static inline void decode_q2_K(const block_q2_K *b, groups16 *w) {
    const uint8x16_t packed = vld1q_u8(b->scales);
    widen16(vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0f))), w->sc);
    const uint8x16_t mins = vshrq_n_u8(packed, 4);
    w->m[0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
    w->m[1] = vreinterpretq_s16_u16(vmovl_high_u8(mins));
    for (int h = 0; h < 2; h++) {
        const uint8x16_t b0 = vld1q_u8(b->qs + 32 * h), b1 = vld1q_u8(b->qs + 32 * h + 16);
        for (int c = 0; c < 4; c++) {
            w->q[8 * h + 2 * c] = crumbs(b0, c);
            w->q[8 * h + 2 * c + 1] = crumbs(b1, c);
        }
    }
}

float sq_vec_dot_q2_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q2_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        groups16 w;
        decode_q2_K(&x[i], &w);
        sum = step(sum, groups16_dot(&w, y[i].qs), half_to_f32(x[i].d) * y[i].d);
        off = step(off, bsums16_dot(w.m, y[i].bsums), half_to_f32(x[i].dmin) * y[i].d);
    }
    return sum - off;
}

/* The 16 scales of a Q3_K block, sc - 32 (blocks.h's sq_q3_K_scale): group g takes
 * its low 4 bits from the low (g < 8) or high nibble of scales[g % 8], its top 2
 * from bits 2 * (g / 4) of scales[8 + g % 4]. */
static inline int8x16_t q3_K_scales(const uint8_t *s) {
    static const int8_t shift[16] = { 0, 0, 0, 0, -2, -2, -2, -2, -4, -4, -4, -4, -6, -6, -6, -6 };
    const uint8x8_t lo = vld1_u8(s);
    const uint8x16_t nib = vcombine_u8(vand_u8(lo, vdup_n_u8(0x0f)), vshr_n_u8(lo, 4));
    uint32_t h4;
    memcpy(&h4, s + 8, 4);
    const uint8x16_t h = vreinterpretq_u8_u32(vdupq_n_u32(h4)); /* byte g: scales[8 + g % 4] */
    const uint8x16_t top = vandq_u8(vshlq_u8(h, vld1q_s8(shift)), vdupq_n_u8(3));
    return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, vshlq_n_u8(top, 4))), vdupq_n_s8(32));
}

/* Q3_K's codes at bits 2c..2c+1 of b, in -4..3: low2 - 4, or low2 where the high
 * bit (bit `bit` of the matching hmask byte) is set. */
static inline int8x16_t q3_codes(uint8x16_t b, uint8x16_t hm, int c, int bit) {
    const uint8x16_t four = vbicq_u8(vdupq_n_u8(4), vtstq_u8(hm, vdupq_n_u8((uint8_t)(1u << bit))));
    return vsubq_s8(crumbs(b, c), vreinterpretq_s8_u8(four));
}

/* Q3_K: the low 2 bits as in Q2_K; element 32c + l of half h has its high bit
 * at bit 4h + c of hmask[l]. */
static inline void decode_q3_K(const block_q3_K *b, groups16 *w) {
    widen16(q3_K_scales(b->scales), w->sc);
    const uint8x16_t hm0 = vld1q_u8(b->hmask), hm1 = vld1q_u8(b->hmask + 16);
    for (int h = 0; h < 2; h++) {
        const uint8x16_t b0 = vld1q_u8(b->qs + 32 * h), b1 = vld1q_u8(b->qs + 32 * h + 16);
        for (int c = 0; c < 4; c++) {
            w->q[8 * h + 2 * c] = q3_codes(b0, hm0, c, 4 * h + c);
            w->q[8 * h + 2 * c + 1] = q3_codes(b1, hm1, c, 4 * h + c);
        }
    }
}

float sq_vec_dot_q3_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q3_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        groups16 w;
        decode_q3_K(&x[i], &w);
        sum = step(sum, groups16_dot(&w, y[i].qs), half_to_f32(x[i].d) * y[i].d);
    }
    return sum;
}

/* The 8 6-bit scales and mins of a Q4_K/Q5_K block (blocks.h's sq_k_scale_min):
 * for j < 4, sc = s[j] & 63 and mn = s[j + 4] & 63; for j >= 4 the low 4 bits are
 * the nibbles of s[j + 4] and the top 2 bits 6-7 of s[j - 4] (sc) and s[j] (mn). */
static inline void k_scales_mins(const uint8_t *s, groups32 *w) {
    static const int8_t nib_shift[8] = { 0, 0, 0, 0, -4, -4, -4, -4 };
    static const uint8_t nib_mask[8] = { 0x0f, 0x0f, 0x0f, 0x0f, 0xf0, 0xf0, 0xf0, 0xf0 };
    const uint8x8_t a = vld1_u8(s);
    uint32_t t4;
    memcpy(&t4, s + 8, 4);
    const uint8x8_t t = vreinterpret_u8_u32(vdup_n_u32(t4));
    /* lanes 0..3 the scales', 4..7 the mins' halves, for j < 4 (low) and j >= 4 (high) */
    const uint8x8_t low = vand_u8(a, vdup_n_u8(63));
    const uint8x8_t high = vorr_u8(vshl_u8(vand_u8(t, vld1_u8(nib_mask)), vld1_s8(nib_shift)),
                                   vshl_n_u8(vshr_n_u8(a, 6), 4));
    const uint32x2_t lw = vreinterpret_u32_u8(low), hw = vreinterpret_u32_u8(high);
    const uint8x8_t sc = vreinterpret_u8_u32(vzip1_u32(lw, hw)), mn = vreinterpret_u8_u32(vzip2_u32(lw, hw));
    const uint16x8_t sc16 = vmovl_u8(sc);
    w->sc[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(sc16)));
    w->sc[1] = vreinterpretq_s32_u32(vmovl_high_u16(sc16));
    w->mn = vreinterpretq_s16_u16(vmovl_u8(mn));
}

/* Q4_K: 32 bytes of qs per 64 elements, low nibbles for group 2c, high for 2c+1. */
static inline void decode_q4_K(const block_q4_K *b, groups32 *w) {
    k_scales_mins(b->scales, w);
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 2; k++) {
            const uint8x16_t q = vld1q_u8(b->qs + 32 * c + 16 * k);
            w->q[2 * c][k] = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
            w->q[2 * c + 1][k] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
        }
}

float sq_vec_dot_q4_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q4_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        groups32 w;
        decode_q4_K(&x[i], &w);
        sum = step(sum, groups32_dot(&w, y[i].qs), half_to_f32(x[i].d) * y[i].d);
        off = step(off, k_mins_dot(w.mn, y[i].bsums), half_to_f32(x[i].dmin) * y[i].d);
    }
    return sum - off;
}

/* Q5_K: Q4_K's codes plus bit 4, which for element l of group 2c (2c+1) is bit
 * 2c (2c+1) of qh[l]. */
static inline void decode_q5_K(const block_q5_K *b, groups32 *w) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m16 = vdupq_n_u8(0x10);
    k_scales_mins(b->scales, w);
    for (int k = 0; k < 2; k++) {
        const uint8x16_t hb = vld1q_u8(b->qh + 16 * k);
        for (int c = 0; c < 4; c++) {
            const uint8x16_t q = vld1q_u8(b->qs + 32 * c + 16 * k);
            const uint8x16_t lo = vandq_u8(vtstq_u8(hb, vdupq_n_u8((uint8_t)(1u << (2 * c)))), m16);
            const uint8x16_t hi = vandq_u8(vtstq_u8(hb, vdupq_n_u8((uint8_t)(2u << (2 * c)))), m16);
            w->q[2 * c][k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, m4), lo));
            w->q[2 * c + 1][k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), hi));
        }
    }
}

float sq_vec_dot_q5_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q5_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        groups32 w;
        decode_q5_K(&x[i], &w);
        sum = step(sum, groups32_dot(&w, y[i].qs), half_to_f32(x[i].d) * y[i].d);
        off = step(off, k_mins_dot(w.mn, y[i].bsums), half_to_f32(x[i].dmin) * y[i].d);
    }
    return sum - off;
}

/* Q6_K's codes less bias (0: the unsigned 6-bit codes, 32: the signed ones), and
 * its scales. Chunk 4h + m holds elements 128h + 32m .. +31, groups 2(4h + m) and
 * the next. Byte l of ql (ql + 32) gives the low nibble of elements l and 64 + l
 * (32 + l and 96 + l) of a half; bits 2m..2m+1 of qh[l] the top bits of element 32m + l. */
static inline void decode_q6_K(const block_q6_K *b, int8_t bias, groups16 *w) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(3);
    const int8x16_t sb = vdupq_n_s8(bias);
    const int8x16_t sc = vld1q_s8(b->scales);
    widen16(sc, w->sc);
    w->m[0] = vmovl_s8(vget_low_s8(sc));
    w->m[1] = vmovl_high_s8(sc);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 2; k++) {
            const uint8x16_t l0 = vld1q_u8(b->ql + 64 * h + 16 * k);
            const uint8x16_t l1 = vld1q_u8(b->ql + 64 * h + 32 + 16 * k);
            const uint8x16_t hb = vld1q_u8(b->qh + 32 * h + 16 * k);
            const uint8x16_t top0 = vshlq_n_u8(vandq_u8(hb, m3), 4);
            const uint8x16_t top1 = vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4);
            const uint8x16_t top2 = vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4);
            const uint8x16_t top3 = vshlq_n_u8(vshrq_n_u8(hb, 6), 4);
            int8x16_t *q = w->q + 8 * h + k;
            q[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l0, m4), top0)), sb);
            q[2] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l1, m4), top1)), sb);
            q[4] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l0, 4), top2)), sb);
            q[6] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l1, 4), top3)), sb);
        }
}

/* Q6_K: the unsigned codes (bias 0, so the compiler drops the subtractions), and the
 * -32 taken off as 32 * sum(sc * bsum): the same integer as the signed codes give, in
 * fewer operations than forming them. Neither term can overflow: the first is below
 * 16 * 16 * 63 * 128 * 128 < 2^28, the second below 32 * 16 * 128 * 2048 = 2^27. */
float sq_vec_dot_q6_K_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_q6_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        groups16 w;
        decode_q6_K(&x[i], 0, &w);
        const int32x4_t p = vsubq_s32(groups16_dot(&w, y[i].qs), vshlq_n_s32(bsums16_dot(w.m, y[i].bsums), 5));
        sum = step(sum, p, half_to_f32(x[i].d) * y[i].d);
    }
    return sum;
}

/* IQ4_XS: 8 IQ4_NL-coded groups of 32, group g's scale s - 32 with s's low 4 bits
 * in nibble g % 2 of scales_l[g / 2] and its top 2 at bits 2g..2g+1 of scales_h. */
static inline void decode_iq4_xs(const block_iq4_xs *b, int8x16_t grid, groups32 *w) {
    static const int16_t h_shift[8] = { 0, -2, -4, -6, -8, -10, -12, -14 };
    uint32_t l4;
    memcpy(&l4, b->scales_l, 4);
    const uint8x8_t l = vcreate_u8(l4);
    const uint8x8_t lo = vzip1_u8(vand_u8(l, vdup_n_u8(0x0f)), vshr_n_u8(l, 4)); /* byte g: s & 15 */
    const uint16x8_t hi = vandq_u16(vshlq_u16(vdupq_n_u16(b->scales_h), vld1q_s16(h_shift)), vdupq_n_u16(3));
    const int16x8_t s = vsubq_s16(vreinterpretq_s16_u16(vorrq_u16(vmovl_u8(lo), vshlq_n_u16(hi, 4))), vdupq_n_s16(32));
    w->sc[0] = vmovl_s16(vget_low_s16(s));
    w->sc[1] = vmovl_high_s16(s);
    for (int g = 0; g < 8; g++)
        iq4_values(b->qs + 16 * g, grid, &w->q[g][0], &w->q[g][1]);
}

float sq_vec_dot_iq4_xs_neon(const void *row, const void *xq, int64_t nb, const void *stop) {
    (void)stop; /* see quants/kernels.h */
    const block_iq4_xs *x = row;
    const block_q8_K *y = xq;
    const int8x16_t grid = vld1q_s8(iq4_grid);
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        groups32 w;
        decode_iq4_xs(&x[i], grid, &w);
        sum = step(sum, groups32_dot(&w, y[i].qs), half_to_f32(x[i].d) * y[i].d);
    }
    return sum;
}

/* ---------------------------------------------------------------------------
 * Batches: one weight row times n_tokens activation rows, stride bytes apart, each
 * output the one-token vec_dot's bits. Tokens go four to a register, one per float
 * lane, each lane running its token's chains block by block; a block is decoded once
 * for a tile of TILE tokens, whose chains stay on the stack meanwhile. A batch that
 * is not a multiple of four fills its last register's spare lanes by repeating its
 * last token (reading only rows the caller passed) and stores only the real ones.
 * ------------------------------------------------------------------------- */

enum { TILE = 32 };

/* y[k * ldy] = lane k of v for k < n. */
static inline void store_tokens(float32x4_t v, int n, float *y, int64_t ldy) {
    float out[4];
    vst1q_f32(out, v);
    for (int k = 0; k < n && k < 4; k++)
        y[k * ldy] = out[k];
}

/* The four tokens' f16 scales as float lanes, widened exactly. */
static inline float32x4_t halves4(uint16_t h0, uint16_t h1, uint16_t h2, uint16_t h3) {
    const uint16_t h[4] = { h0, h1, h2, h3 };
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* The batch bodies below take their block decoder and integer sums as parameters and
 * are inlined into each type's kernel (always_inline: they are too large for the
 * compiler to inline on its own), so the calls through those pointers become direct
 * code and nothing is called per block or per token. */
#define SQ_INLINE static inline __attribute__((always_inline))

/* --- 32-element blocks, Q8_0 or Q8_1 activations --- */

/* A block decoded once for the tile: its 32 codes with the integer offsets folded in
 * (as the one-token kernels form them), its d and (Q4_1, Q5_1) m as floats. */
typedef struct { int8x16_t q[2]; float d, m; } block32;
typedef void (*decode32_fn)(const void *row, int64_t i, block32 *b);

static inline void decode32_q8_0(const void *row, int64_t i, block32 *b) {
    const block_q8_0 *x = (const block_q8_0 *)row + i;
    b->q[0] = vld1q_s8(x->qs);
    b->q[1] = vld1q_s8(x->qs + 16);
    b->d = half_to_f32(x->d);
}

static inline void decode32_q4_0(const void *row, int64_t i, block32 *b) {
    const block_q4_0 *x = (const block_q4_0 *)row + i;
    unpack_nibbles(x->qs, &b->q[0], &b->q[1]);
    b->q[0] = vsubq_s8(b->q[0], vdupq_n_s8(8));
    b->q[1] = vsubq_s8(b->q[1], vdupq_n_s8(8));
    b->d = half_to_f32(x->d);
}

static inline void decode32_q4_1(const void *row, int64_t i, block32 *b) {
    const block_q4_1 *x = (const block_q4_1 *)row + i;
    unpack_nibbles(x->qs, &b->q[0], &b->q[1]);
    b->d = half_to_f32(x->d);
    b->m = half_to_f32(x->m);
}

static inline void decode32_q5_0(const void *row, int64_t i, block32 *b) {
    const block_q5_0 *x = (const block_q5_0 *)row + i;
    q5_codes(x->qs, x->qh, &b->q[0], &b->q[1]);
    b->q[0] = vsubq_s8(b->q[0], vdupq_n_s8(16));
    b->q[1] = vsubq_s8(b->q[1], vdupq_n_s8(16));
    b->d = half_to_f32(x->d);
}

static inline void decode32_q5_1(const void *row, int64_t i, block32 *b) {
    const block_q5_1 *x = (const block_q5_1 *)row + i;
    q5_codes(x->qs, x->qh, &b->q[0], &b->q[1]);
    b->d = half_to_f32(x->d);
    b->m = half_to_f32(x->m);
}

static inline void decode32_iq4_nl(const void *row, int64_t i, block32 *b) {
    const block_iq4_nl *x = (const block_iq4_nl *)row + i;
    iq4_values(x->qs, vld1q_s8(iq4_grid), &b->q[0], &b->q[1]);
    b->d = half_to_f32(x->d);
}

/* Block i of tokens t..t+3's activation rows (Q8_1 if q8_1, else Q8_0), the last
 * token below end repeated past it. */
static inline void act32_blocks4(const void *xq, int64_t stride, int t, int end, int64_t i, int q8_1,
                                 const uint8_t *a[4]) {
    const int64_t size = q8_1 ? (int64_t)sizeof(block_q8_1) : (int64_t)sizeof(block_q8_0);
    for (int k = 0; k < 4; k++)
        a[k] = (const uint8_t *)xq + (int64_t)(t + k < end ? t + k : end - 1) * stride + i * size;
}

static inline const int8_t *act32_qs(const uint8_t *a, int q8_1) {
    return q8_1 ? ((const block_q8_1 *)a)->qs : ((const block_q8_0 *)a)->qs;
}

/* A Q8_0 or Q8_1 block's d (the first field of both), and a Q8_1 block's s. */
static inline uint16_t act32_d(const uint8_t *a) { return ((const block_q8_0 *)a)->d; }
static inline uint16_t act32_s(const uint8_t *a) { return ((const block_q8_1 *)a)->s; }

/* One row of 32-element blocks times n_tokens rows: a sum chain per token and, where
 * q8_1 (Q4_1, Q5_1), the chain off of m * s, the result sum + off. */
SQ_INLINE void batch32(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb, float *y,
                       int64_t ldy, decode32_fn decode, int q8_1) {
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int end = n_tokens - t0 < TILE ? n_tokens : t0 + TILE;
        float32x4_t sum[TILE / 4], off[TILE / 4];
        for (int g = 0; g < TILE / 4; g++)
            sum[g] = off[g] = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < nb; i++) {
            block32 b;
            decode(row, i, &b);
            for (int t = t0, g = 0; t < end; t += 4, g++) {
                const uint8_t *a[4];
                act32_blocks4(xq, stride, t, end, i, q8_1, a);
                const int32x4_t isum = totals4(dot32(b.q[0], b.q[1], act32_qs(a[0], q8_1)),
                                               dot32(b.q[0], b.q[1], act32_qs(a[1], q8_1)),
                                               dot32(b.q[0], b.q[1], act32_qs(a[2], q8_1)),
                                               dot32(b.q[0], b.q[1], act32_qs(a[3], q8_1)));
                const float32x4_t da = halves4(act32_d(a[0]), act32_d(a[1]), act32_d(a[2]), act32_d(a[3]));
                sum[g] = vfmaq_f32(sum[g], vcvtq_f32_s32(isum), vmulq_n_f32(da, b.d));
                if (q8_1) {
                    const float32x4_t sa = halves4(act32_s(a[0]), act32_s(a[1]), act32_s(a[2]), act32_s(a[3]));
                    off[g] = vfmaq_f32(off[g], vdupq_n_f32(b.m), sa);
                }
            }
        }
        for (int t = t0, g = 0; t < end; t += 4, g++)
            store_tokens(q8_1 ? vaddq_f32(sum[g], off[g]) : sum[g], end - t, y + t * ldy, ldy);
    }
}

#define SQ_BATCH32(name, q8_1)                                                                              \
    void sq_batch_dot_##name##_neon(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb, \
                                    float *y, int64_t ldy) {                                                \
        batch32(row, xq, stride, n_tokens, nb, y, ldy, decode32_##name, q8_1);                              \
    }
SQ_BATCH32(q8_0, 0)
SQ_BATCH32(q4_0, 0)
SQ_BATCH32(q4_1, 1)
SQ_BATCH32(q5_0, 0)
SQ_BATCH32(q5_1, 1)
SQ_BATCH32(iq4_nl, 0)

/* --- 256-element blocks, Q8_K activations --- */

/* A block decoded once for the tile: groups of 16 (Q2_K, Q3_K, Q6_K) or of 32 (Q4_K,
 * Q5_K, IQ4_XS), d and (Q2_K, Q4_K, Q5_K) dmin as floats. */
typedef struct {
    union { groups16 g16; groups32 g32; } w;
    float d, dmin;
} blockK;
typedef void (*decodeK_fn)(const void *row, int64_t i, blockK *b);
/* A block's isum (or imin) against one token's block, as four partial sums. */
typedef int32x4_t (*sumK_fn)(const blockK *b, const block_q8_K *a);

static inline int32x4_t isum16(const blockK *b, const block_q8_K *a) { return groups16_dot(&b->w.g16, a->qs); }
static inline int32x4_t imin16(const blockK *b, const block_q8_K *a) { return bsums16_dot(b->w.g16.m, a->bsums); }
static inline int32x4_t isum32(const blockK *b, const block_q8_K *a) { return groups32_dot(&b->w.g32, a->qs); }
static inline int32x4_t imin32(const blockK *b, const block_q8_K *a) { return k_mins_dot(b->w.g32.mn, a->bsums); }

static inline void decodeK_q2_K(const void *row, int64_t i, blockK *b) {
    const block_q2_K *x = (const block_q2_K *)row + i;
    decode_q2_K(x, &b->w.g16);
    b->d = half_to_f32(x->d);
    b->dmin = half_to_f32(x->dmin);
}

static inline void decodeK_q3_K(const void *row, int64_t i, blockK *b) {
    const block_q3_K *x = (const block_q3_K *)row + i;
    decode_q3_K(x, &b->w.g16);
    b->d = half_to_f32(x->d);
}

static inline void decodeK_q4_K(const void *row, int64_t i, blockK *b) {
    const block_q4_K *x = (const block_q4_K *)row + i;
    decode_q4_K(x, &b->w.g32);
    b->d = half_to_f32(x->d);
    b->dmin = half_to_f32(x->dmin);
}

static inline void decodeK_q5_K(const void *row, int64_t i, blockK *b) {
    const block_q5_K *x = (const block_q5_K *)row + i;
    decode_q5_K(x, &b->w.g32);
    b->d = half_to_f32(x->d);
    b->dmin = half_to_f32(x->dmin);
}

/* Q6_K's signed codes are formed once per block for the tile, so no token needs the
 * bsums term of the one-token kernel. */
static inline void decodeK_q6_K(const void *row, int64_t i, blockK *b) {
    const block_q6_K *x = (const block_q6_K *)row + i;
    decode_q6_K(x, 32, &b->w.g16);
    b->d = half_to_f32(x->d);
}

static inline void decodeK_iq4_xs(const void *row, int64_t i, blockK *b) {
    const block_iq4_xs *x = (const block_iq4_xs *)row + i;
    decode_iq4_xs(x, vld1q_s8(iq4_grid), &b->w.g32);
    b->d = half_to_f32(x->d);
}

/* Block i of tokens t..t+3, the last one below end repeated past it. */
static inline void act_blocks4(const void *xq, int64_t stride, int t, int end, int64_t i, const block_q8_K *a[4]) {
    for (int k = 0; k < 4; k++)
        a[k] = (const block_q8_K *)((const uint8_t *)xq + (int64_t)(t + k < end ? t + k : end - 1) * stride) + i;
}

/* The four tokens' Q8_K scales, one per lane. */
static inline float32x4_t act_scales4(const block_q8_K *const a[4]) {
    float32x4_t d = vdupq_n_f32(0.0f);
    d = vld1q_lane_f32(&a[0]->d, d, 0);
    d = vld1q_lane_f32(&a[1]->d, d, 1);
    d = vld1q_lane_f32(&a[2]->d, d, 2);
    return vld1q_lane_f32(&a[3]->d, d, 3);
}

/* One row of 256-element blocks times n_tokens rows: a sum chain per token and, where
 * imin is given (the types with mins), the chain off, the result sum - off. */
SQ_INLINE void batchK(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb, float *y,
                      int64_t ldy, decodeK_fn decode, sumK_fn isum, sumK_fn imin) {
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int end = n_tokens - t0 < TILE ? n_tokens : t0 + TILE;
        float32x4_t sum[TILE / 4], off[TILE / 4];
        for (int g = 0; g < TILE / 4; g++)
            sum[g] = off[g] = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < nb; i++) {
            blockK b;
            decode(row, i, &b);
            for (int t = t0, g = 0; t < end; t += 4, g++) {
                const block_q8_K *a[4];
                act_blocks4(xq, stride, t, end, i, a);
                const float32x4_t da = act_scales4(a);
                const int32x4_t is = totals4(isum(&b, a[0]), isum(&b, a[1]), isum(&b, a[2]), isum(&b, a[3]));
                sum[g] = vfmaq_f32(sum[g], vcvtq_f32_s32(is), vmulq_n_f32(da, b.d));
                if (imin) {
                    const int32x4_t im = totals4(imin(&b, a[0]), imin(&b, a[1]), imin(&b, a[2]), imin(&b, a[3]));
                    off[g] = vfmaq_f32(off[g], vcvtq_f32_s32(im), vmulq_n_f32(da, b.dmin));
                }
            }
        }
        for (int t = t0, g = 0; t < end; t += 4, g++)
            store_tokens(imin ? vsubq_f32(sum[g], off[g]) : sum[g], end - t, y + t * ldy, ldy);
    }
}

#define SQ_BATCH_K(name, size, imin)                                                                        \
    void sq_batch_dot_##name##_neon(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb, \
                                    float *y, int64_t ldy) {                                                \
        batchK(row, xq, stride, n_tokens, nb, y, ldy, decodeK_##name, isum##size, imin);                    \
    }
SQ_BATCH_K(q2_K, 16, imin16)
SQ_BATCH_K(q3_K, 16, NULL)
SQ_BATCH_K(q4_K, 32, imin32)
SQ_BATCH_K(q5_K, 32, imin32)
SQ_BATCH_K(q6_K, 16, NULL)
SQ_BATCH_K(iq4_xs, 32, NULL)

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_neon_unused;
#endif
