/* quants/scalar.c: the scalar code of every type: block encodings, row decoders, row dot
 * products, the vec_dots that define the engine's products, activation quantizers, and
 * the type table.
 *
 * Every quantized type gets one section: how its block encodes the values (the
 * block_<type> struct itself is in quants/blocks.h), a one-block decoder,
 * then the row decoder and row dot product built from it (ROW_FUNCS below), and
 * its vec_dot: the dot product with activations already converted to the block
 * format llama.cpp pairs with the type. Those activation formats (Q8_0, also a
 * weight type, Q8_1 and Q8_K) have sections of their own with their quantizers.
 * The file ends with the type table, one row per type of quants/types.h's lists.
 *
 * Conventions that hold throughout:
 *  - Multi-byte fields are little-endian, as GGUF stores them; like the rest of
 *    the kernel this file assumes a little-endian host.
 *  - Decoded values must equal the gguf Python reference bit for bit, so each
 *    float operation mirrors its order: a scale is formed first (d * sc), then
 *    applied (scale * q), then an offset subtracted, each rounded to float.
 *    Where a product feeds an addition it is kept in its own statement so no
 *    compiler may contract the pair into an FMA (which rounds once, not twice).
 *  - The dot product decodes a tile of a few blocks into a stack buffer and
 *    multiplies it with x while the tile is still in L1. The weights it uses are
 *    therefore exactly the dequantized ones, and both loops are simple enough to
 *    auto-vectorize. Partial sums are float within a tile and double across
 *    tiles, which keeps long rows accurate at one double add per tile.
 *  - Decoders hoist per-group scales out of the element loops and shift only
 *    by loop-invariant amounts inside them: the shape compilers vectorize.
 *  - The vec_dot functions are the definition of the engine's products (quants/types.h):
 *    an exact integer per block, then block_step. Every SIMD kernel (x86/, arm/) gives
 *    their bits.
 */
#include <assert.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "quants/kernels.h"
#include "quants/quants.h"

/* ---------------------------------------------------------------------------
 * Half precision
 * ------------------------------------------------------------------------- */

/* Branch-free so that loops over it vectorize (selects, no control flow). */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t mag = h & 0x7fffu;
    /* Moving exponent and mantissa into float position and adding the bias
     * difference (127 - 15 = 112) is exact for normal halves. Adding it twice
     * takes exponent 31 to 255, so inf stays inf and NaN keeps its payload. */
    uint32_t bits = (mag << 13) + (112u << 23);
    bits += (uint32_t)(mag >= 0x7c00u) * (112u << 23);
    /* Subnormals (and zero) are mantissa * 2^-24; mag < 2^10 makes that exact. */
    uint32_t sub = sq_f32_bits((float)(int32_t)mag * 0x1p-24f);
    uint32_t is_sub = 0u - (uint32_t)(mag < 0x0400u);
    bits = (sub & is_sub) | (bits & ~is_sub);
    return sq_bits_f32(bits | sign);
}

float sq_fp16_to_fp32(uint16_t h) { return half_to_float(h); }

/* half_to_float for one value at a time, such as a block's scale: normal halves
 * (all but zero, subnormals, inf and NaN) take a short path behind a branch that
 * predicts well, since scales are nearly always normal. Same results. */
static inline float scale_to_float(uint16_t h) {
    const uint32_t e = h & 0x7c00u;
    if (e != 0 && e != 0x7c00u)
        return sq_bits_f32((uint32_t)(h & 0x8000u) << 16 | (((uint32_t)(h & 0x7fffu) << 13) + (112u << 23)));
    return half_to_float(h);
}

uint16_t sq_fp32_to_fp16(float f) {
    uint32_t x = sq_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;

    if (a > 0x7f800000u) /* NaN: keep the top payload bits, and stay a NaN even if they are all 0 */
        return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
    /* 65520 is halfway between the largest half (65504, odd mantissa) and 2^16:
     * ties go to even, which is the overflow, so from there on the answer is inf. */
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
    if (a >= 0x38800000u) { /* >= 2^-14: a normal half */
        uint32_t r = a - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u); /* round to nearest even; a carry bumps the exponent, as it should */
        return sign | (uint16_t)(r >> 13);
    }
    if (a < 0x33000000u) /* below 2^-25 (half the smallest subnormal): rounds to zero */
        return sign;
    /* Subnormal half: the result counts units of 2^-24. With the implicit bit,
     * f = m * 2^(e - 150), so the count is m >> (126 - e), rounded to even. */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += rem > half || (rem == half && (q & 1u)); /* reaching 0x400 gives the smallest normal */
    return sign | (uint16_t)q;
}

/* ---------------------------------------------------------------------------
 * Shared machinery
 * ------------------------------------------------------------------------- */

/* Dot product of k floats, k a multiple of 8. Eight independent lanes let the
 * compiler vectorize without reassociating a single running sum. (A scalar
 * tail loop in here slows the block types' tiles down by a third.) */
static inline float dot_lanes(const float *a, const float *b, int k) {
    float acc[8] = {0};
    for (int i = 0; i < k; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    return sq_reduce8(acc);
}

/* Dot product of any k floats. */
static inline float dot_any(const float *a, const float *b, int k) {
    float acc = dot_lanes(a, b, k & ~7);
    for (int i = k & ~7; i < k; i++)
        acc += a[i] * b[i];
    return acc;
}

/* Elements per dot-product tile: 2 KiB of floats, at least two blocks of any
 * type. A tile of one block would make the decode loops' trip counts constant;
 * compilers then unroll them completely, turn the buffer into scalars and lose
 * vectorization (GCC 12 runs several times slower that way). */
#define TILE 512

/* The dot product of a type with QK elements per block of type unit_t, built on
 * its row decoder dequant_<name>(src, dst, blocks) and a float dot product. */
#define DOT_BY_TILES(name, QK, unit_t, dot)                                        \
    static float dot_##name(const void *row, const float *x, int64_t nb) {         \
        const unit_t *b = row;                                                     \
        float w[TILE];                                                             \
        double acc = 0.0;                                                          \
        for (int64_t i = 0; i < nb; i += TILE / (QK)) {                            \
            int64_t k = nb - i < TILE / (QK) ? nb - i : TILE / (QK);               \
            dequant_##name(b + i, w, k);                                           \
            acc += dot(w, x + i * (QK), (int)k * (QK));                            \
        }                                                                          \
        return (float)acc;                                                         \
    }

/* Row decoder and dot product of a block type, given decode_<name>(block, y). */
#define ROW_FUNCS(name, QK)                                                        \
    static void dequant_##name(const void *src, float *restrict dst, int64_t nb) { \
        const block_##name *b = src;                                               \
        for (int64_t i = 0; i < nb; i++)                                           \
            decode_##name(&b[i], dst + i * (QK));                                  \
    }                                                                              \
    DOT_BY_TILES(name, QK, block_##name, dot_lanes)

/* Integer dot products for the vec_dot functions (weights times activations already
 * quantized to 8 bits). A block's codes are widened
 * to int16, the weights with their group scale already multiplied in, and the
 * products summed in int32: the shape GCC compiles to pmaddwd on plain x86-64.
 * (int8 operands read straight from the blocks compile to a slower unpack and
 * pmullw sequence instead.) Folding the scales in is exact: |scale * code| is
 * at most 8064 (Q6_K's unsigned codes) and a super-block's sum stays below 2^28.
 * Being integer, the sum is the same in any order; block_step below is the one
 * float operation around it. */
static inline void widen_i8(const int8_t *restrict q, int16_t *restrict w, int k) {
    for (int j = 0; j < k; j++)
        w[j] = q[j];
}

static inline int32_t dot_i16(const int16_t *restrict a, const int16_t *restrict b, int k) {
    int32_t s = 0;
    for (int j = 0; j < k; j++)
        s += a[j] * b[j];
    return s;
}

/* The block step, the one float operation of a block (quants/types.h): the block's
 * exact integer sum, converted to float (rounded to nearest even past 2^24), times the
 * product d of the two blocks' float scales, added to the row's running sum, rounded
 * once. Every kernel makes exactly this call, block by block in row order. */
static inline float block_step(float acc, int32_t isum, float d) {
    return fmaf((float)isum, d, acc);
}

/* Round to the nearest integer, ties to even, for |v| < 2^22: llama.cpp's
 * nearest_int, and what its AVX code's _mm256_round_ps(_MM_ROUND_NEAREST) does.
 * Adding 1.5 * 2^23 leaves the integer in the low mantissa bits. No float to int
 * conversion (undefined out of range, e.g. on NaN), and it vectorizes on SSE2. */
static inline int32_t nearest_int(float v) {
    const uint32_t u = sq_f32_bits(v + 12582912.f);
    return (int32_t)(u & 0x007fffffu) - 0x00400000;
}

/* Float dot products of the 1-element types with activations in the weights'
 * own format, shaped as llama.cpp's ggml_vec_dot_f32/f16/bf16 on AVX: 32 lanes
 * (four 8-float registers) each accumulating the products of its elements, their
 * reduction (sq_reduce32, simd.h), and the last n % 32 products added in double. */
#define LANES 32

/* ---------------------------------------------------------------------------
 * F32, F16, BF16: one element per "block"; rows of any length.
 * ------------------------------------------------------------------------- */

static void dequant_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static float dot_f32(const void *row, const float *x, int64_t n) {
    const float *w = row;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i += TILE)
        acc += dot_any(w + i, x + i, n - i < TILE ? (int)(n - i) : TILE);
    return (float)acc;
}

static void dequant_f16(const void *src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = half_to_float(h[i]);
}
DOT_BY_TILES(f16, 1, uint16_t, dot_any)

static void dequant_bf16(const void *src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = sq_bf16_to_fp32(h[i]);
}
DOT_BY_TILES(bf16, 1, uint16_t, dot_any)

/* The 1-element types as activations: x converted element by element (F16 and
 * BF16 round to nearest even, as llama.cpp's F16C and scalar conversions do). */
static void quant_f32(const float *restrict x, void *restrict dst, int64_t n) {
    memcpy(dst, x, (size_t)n * sizeof(float));
}

static void quant_f16_rows(const float *restrict x, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = sq_fp32_to_fp16(x[i]);
}

static void quant_bf16(const float *restrict x, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = sq_fp32_to_bf16(x[i]);
}

/* The lane dot product of two rows of a 1-element type, given its decoder.
 * (Decoding F16 costs most of its time: plain x86-64 has no half conversion.) */
#define VEC_DOT_LANES(name, unit_t, to_f32)                                         \
    static float vec_dot_##name(const void *row, const void *xq, int64_t n) {      \
        const unit_t *a = row, *b = xq;                                            \
        float acc[LANES] = {0};                                                    \
        int64_t i = 0;                                                             \
        for (; i + LANES <= n; i += LANES)                                         \
            for (int j = 0; j < LANES; j++) {                                      \
                const float p = to_f32(a[i + j]) * to_f32(b[i + j]);               \
                acc[j] += p;                                                       \
            }                                                                      \
        return sq_float_tail_##name(sq_reduce32(acc), row, xq, i, n);              \
    }

static inline float f32_id(float f) { return f; }
VEC_DOT_LANES(f32, float, f32_id)
VEC_DOT_LANES(f16, uint16_t, half_to_float)
VEC_DOT_LANES(bf16, uint16_t, sq_bf16_to_fp32)

/* ---------------------------------------------------------------------------
 * Q8_0: 32 elements, y = d * q, q a signed byte. A weight type, and the
 * activation format of Q4_0, Q5_0, Q8_0 and IQ4_NL weights.
 * ------------------------------------------------------------------------- */

static inline void decode_q8_0(const block_q8_0 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int j = 0; j < QK8_0; j++)
        y[j] = d * (float)b->qs[j];
}
ROW_FUNCS(q8_0, QK8_0)

/* The conversions into the activation formats (Q8_0, Q8_1, Q8_K), and into F16, are the
 * table's quant_<name>: on x86-64, while the SIMD paths are on, quants/x86/activations.c's,
 * which give the bytes of quant_<name>_rows for every input; otherwise those. */
#ifdef SQ_X86
#define ACTIVATION_QUANTIZER(name)                                                      \
    static void quant_##name(const float *restrict x, void *restrict dst, int64_t nb) { \
        if (sq_simd_enabled())                                                          \
            sq_quant_##name##_avx2(x, dst, nb);                                         \
        else                                                                            \
            quant_##name##_rows(x, dst, nb);                                            \
    }
#else
#define ACTIVATION_QUANTIZER(name)                                                      \
    static void quant_##name(const float *restrict x, void *restrict dst, int64_t nb) { \
        quant_##name##_rows(x, dst, nb);                                                \
    }
#endif
ACTIVATION_QUANTIZER(f16)

/* The largest |x[j]| of n, NaNs passed over. The bits of a non-negative float order as
 * its value does, so the maximum is taken over them as integers: a reduction compilers
 * vectorize (a float one, whose NaNs are ordered by position, stays scalar). */
static inline float abs_max(const float *restrict x, int n) {
    uint32_t m = 0;
    for (int j = 0; j < n; j++) {
        uint32_t b = sq_f32_bits(x[j]) & 0x7fffffffu;
        b &= 0u - (uint32_t)(b <= 0x7f800000u); /* a NaN counts as 0 */
        m = b > m ? b : m;
    }
    return sq_bits_f32(m);
}

/* Codes of 32 activations for Q8_0 and Q8_1, as llama.cpp's x86 (AVX and AVX2)
 * quantize_row_q8_0/_1 make them: q = round(x * (127 / amax)), ties to even.
 * Returns d = amax / 127, unrounded; the blocks store it as f16, and the dot
 * products use that rounded d while the codes came from the exact one.
 * (llama.cpp's scalar reference code, and gguf's, multiply by 1 / d and round
 * ties away from zero; the codes differ only where x * 127 / amax is within an
 * ulp or two of a half.) All-zero blocks get d = 0 and codes 0. Non-finite x
 * give unspecified codes (but no undefined behaviour). */
static inline float q8_32_codes(const float *restrict x, int8_t *restrict qs) {
    const float amax = abs_max(x, 32);
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    for (int j = 0; j < 32; j++) {
        const float v = x[j] * id;
        qs[j] = (int8_t)nearest_int(v);
    }
    return amax / 127.f;
}

static void quant_q8_0_rows(const float *restrict x, void *restrict dst, int64_t nb) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < nb; i++)
        y[i].d = sq_fp32_to_fp16(q8_32_codes(x + i * QK8_0, y[i].qs));
}
ACTIVATION_QUANTIZER(q8_0)

/* Q8_0 weights . Q8_0 activations: the block step (quants/types.h), isum = sum(qx * qy). */
static float vec_dot_q8_0(const void *row, const void *xq, int64_t nb) {
    const block_q8_0 *x = row, *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK8_0], a[QK8_0];
        widen_i8(x[i].qs, w, QK8_0);
        widen_i8(y[i].qs, a, QK8_0);
        sum = block_step(sum, dot_i16(w, a, QK8_0), scale_to_float(x[i].d) * scale_to_float(y[i].d));
    }
    return sum;
}

/* ---------------------------------------------------------------------------
 * Q8_1: 32 elements, y = d * q, q a signed byte, plus s = d * sum(q). Only an
 * activation format (of Q4_1 and Q5_1 weights, whose offset m then contributes
 * m * s to a block's dot product without touching the codes).
 * ------------------------------------------------------------------------- */

static inline void decode_q8_1(const block_q8_1 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int j = 0; j < QK8_1; j++)
        y[j] = d * (float)b->qs[j];
}
ROW_FUNCS(q8_1, QK8_1)

static void quant_q8_1_rows(const float *restrict x, void *restrict dst, int64_t nb) {
    block_q8_1 *y = dst;
    for (int64_t i = 0; i < nb; i++) {
        const float d = q8_32_codes(x + i * QK8_1, y[i].qs);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++)
            sum += y[i].qs[j];
        y[i].d = sq_fp32_to_fp16(d);
        y[i].s = sq_fp32_to_fp16(d * (float)sum);
    }
}
ACTIVATION_QUANTIZER(q8_1)

/* ---------------------------------------------------------------------------
 * Q8_K: 256 elements, y = d * q, q a signed byte in -127..127, d a float
 * (negative when the block's largest-magnitude value is positive). Only
 * an activation format (of the K-quants and IQ4_XS). bsums lets the types with
 * per-group offsets (mins in Q2_K/Q4_K/Q5_K) apply them as mn * sum(q) per group.
 * The float d makes the block 4-byte aligned: rows of it must start so.
 * ------------------------------------------------------------------------- */

static inline void decode_q8_K(const block_q8_K *restrict b, float *restrict y) {
    for (int j = 0; j < QK_K; j++)
        y[j] = b->d * (float)b->qs[j];
}
ROW_FUNCS(q8_K, QK_K)

/* llama.cpp's quantize_row_q8_K_ref, which its x86 backend uses as is: max is
 * the first element of largest magnitude, with its sign; iscale = -127 / max,
 * q = min(127, nearest_int(iscale * x)) (so max itself becomes -127) and
 * d = 1 / iscale. An all-zero block gets d = 0, codes 0 and (unlike llama.cpp,
 * which leaves them as they were) bsums 0. For finite x, |iscale * x| <= 127
 * up to rounding, so the min() never acts; it is kept as llama.cpp has it. */
static void quant_q8_K_rows(const float *restrict x, void *restrict dst, int64_t nb) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        /* The largest magnitude, then the first element of it (the least index of one,
         * taken as a reduction that vectorizes, where a search stopping at it would not). */
        const float amax = abs_max(x, QK_K);
        int first = QK_K - 1;
        for (int j = QK_K - 1; j >= 0; j--)
            first = fabsf(x[j]) == amax ? j : first;
        const float max = x[first];
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            const float v = iscale * x[j];
            const int32_t q = nearest_int(v);
            y[i].qs[j] = (int8_t)(q < 127 ? q : 127);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}
ACTIVATION_QUANTIZER(q8_K)

/* ---------------------------------------------------------------------------
 * Q4_0: 32 elements, y = d * (q - 8), q a 4-bit code.
 * Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
 * ------------------------------------------------------------------------- */

static inline void decode_q4_0(const block_q4_0 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int j = 0; j < QK4_0 / 2; j++) {
        y[j] = d * (float)((b->qs[j] & 0x0f) - 8);
        y[j + QK4_0 / 2] = d * (float)((b->qs[j] >> 4) - 8);
    }
}
ROW_FUNCS(q4_0, QK4_0)

/* . Q8_0 activations: the block step, isum = sum((q - 8) * qy). */
static float vec_dot_q4_0(const void *row, const void *xq, int64_t nb) {
    const block_q4_0 *x = row;
    const block_q8_0 *y = xq;
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK4_0], a[QK4_0];
        for (int j = 0; j < QK4_0 / 2; j++) {
            w[j] = (int16_t)((x[i].qs[j] & 0x0f) - 8);
            w[j + QK4_0 / 2] = (int16_t)((x[i].qs[j] >> 4) - 8);
        }
        widen_i8(y[i].qs, a, QK4_0);
        sumf = block_step(sumf, dot_i16(w, a, QK4_0), scale_to_float(x[i].d) * scale_to_float(y[i].d));
    }
    return sumf;
}

/* ---------------------------------------------------------------------------
 * Q4_1: 32 elements, y = d * q + m, q a 4-bit code; nibble order as Q4_0.
 * ------------------------------------------------------------------------- */

static inline void decode_q4_1(const block_q4_1 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d), m = half_to_float(b->m);
    for (int j = 0; j < QK4_1 / 2; j++) {
        float lo = d * (float)(b->qs[j] & 0x0f);
        float hi = d * (float)(b->qs[j] >> 4);
        y[j] = lo + m;
        y[j + QK4_1 / 2] = hi + m;
    }
}
ROW_FUNCS(q4_1, QK4_1)

/* . Q8_1 activations: the block step with isum = sum(q * qy), and the offset
 * chain of m * s (quants/types.h). */
static float vec_dot_q4_1(const void *row, const void *xq, int64_t nb) {
    const block_q4_1 *x = row;
    const block_q8_1 *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK4_1], a[QK4_1];
        for (int j = 0; j < QK4_1 / 2; j++) {
            w[j] = (int16_t)(x[i].qs[j] & 0x0f);
            w[j + QK4_1 / 2] = (int16_t)(x[i].qs[j] >> 4);
        }
        widen_i8(y[i].qs, a, QK4_1);
        sum = block_step(sum, dot_i16(w, a, QK4_1), scale_to_float(x[i].d) * scale_to_float(y[i].d));
        off = fmaf(scale_to_float(x[i].m), scale_to_float(y[i].s), off);
    }
    return sum + off;
}

/* ---------------------------------------------------------------------------
 * Q5_0: 32 elements, y = d * (q - 16), q a 5-bit code. The low 4 bits are laid
 * out as in Q4_0; bit 4 of element j is bit j of the 32-bit little-endian qh.
 * ------------------------------------------------------------------------- */

/* Bit 4 of each of the 32 elements of a Q5_0/Q5_1 block, as 0 or 16. Testing
 * against a table of masks, not shifting by the element index, because SSE2
 * has no per-lane variable shift and that loop would stay scalar; bytes, not
 * ints, because the narrower lanes halve the decode's instruction count. */
static inline void q5_high_bits(const uint8_t *qh, uint8_t *hb) {
    static const uint32_t bit[16] = {
        1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7,
        1u << 8, 1u << 9, 1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    };
    /* Assembled bytewise: qh sits at offset 2, so a uint32_t load could be misaligned. */
    const uint32_t lo = (uint32_t)qh[0] | (uint32_t)qh[1] << 8, hi = (uint32_t)qh[2] | (uint32_t)qh[3] << 8;
    for (int j = 0; j < 16; j++) {
        hb[j] = (lo & bit[j]) ? 16 : 0;
        hb[j + 16] = (hi & bit[j]) ? 16 : 0;
    }
}

static inline void decode_q5_0(const block_q5_0 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    uint8_t hb[QK5_0];
    q5_high_bits(b->qh, hb);
    for (int j = 0; j < QK5_0 / 2; j++) {
        y[j] = d * (float)(((b->qs[j] & 0x0f) | hb[j]) - 16);
        y[j + QK5_0 / 2] = d * (float)(((b->qs[j] >> 4) | hb[j + 16]) - 16);
    }
}
ROW_FUNCS(q5_0, QK5_0)

/* . Q8_0 activations: the block step, isum = sum((q - 16) * qy). */
static float vec_dot_q5_0(const void *row, const void *xq, int64_t nb) {
    const block_q5_0 *x = row;
    const block_q8_0 *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK5_0], a[QK5_0];
        uint8_t hb[QK5_0];
        q5_high_bits(x[i].qh, hb);
        for (int j = 0; j < QK5_0 / 2; j++) {
            w[j] = (int16_t)(((x[i].qs[j] & 0x0f) | hb[j]) - 16);
            w[j + QK5_0 / 2] = (int16_t)(((x[i].qs[j] >> 4) | hb[j + QK5_0 / 2]) - 16);
        }
        widen_i8(y[i].qs, a, QK5_0);
        sum = block_step(sum, dot_i16(w, a, QK5_0), scale_to_float(x[i].d) * scale_to_float(y[i].d));
    }
    return sum;
}

/* ---------------------------------------------------------------------------
 * Q5_1: 32 elements, y = d * q + m, q a 5-bit code laid out as in Q5_0.
 * ------------------------------------------------------------------------- */

static inline void decode_q5_1(const block_q5_1 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d), m = half_to_float(b->m);
    uint8_t hb[QK5_1];
    q5_high_bits(b->qh, hb);
    for (int j = 0; j < QK5_1 / 2; j++) {
        float lo = d * (float)((b->qs[j] & 0x0f) | hb[j]);
        float hi = d * (float)((b->qs[j] >> 4) | hb[j + 16]);
        y[j] = lo + m;
        y[j + QK5_1 / 2] = hi + m;
    }
}
ROW_FUNCS(q5_1, QK5_1)

/* . Q8_1 activations: as Q4_1, with 5-bit codes. */
static float vec_dot_q5_1(const void *row, const void *xq, int64_t nb) {
    const block_q5_1 *x = row;
    const block_q8_1 *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK5_1], a[QK5_1];
        uint8_t hb[QK5_1];
        q5_high_bits(x[i].qh, hb);
        for (int j = 0; j < QK5_1 / 2; j++) {
            w[j] = (int16_t)((x[i].qs[j] & 0x0f) | hb[j]);
            w[j + QK5_1 / 2] = (int16_t)((x[i].qs[j] >> 4) | hb[j + QK5_1 / 2]);
        }
        widen_i8(y[i].qs, a, QK5_1);
        sum = block_step(sum, dot_i16(w, a, QK5_1), scale_to_float(x[i].d) * scale_to_float(y[i].d));
        off = fmaf(scale_to_float(x[i].m), scale_to_float(y[i].s), off);
    }
    return sum + off;
}

/* ---------------------------------------------------------------------------
 * Q2_K: 256 elements in 16 groups of 16; y = (d * sc) * q - (dmin * mn),
 * q a 2-bit code, sc and mn the low and high nibble of the group's scale byte.
 * Each 128-element half reads 32 bytes of qs, taking bits 0-1 for its first 32
 * elements, bits 2-3 for the next 32, and so on.
 * ------------------------------------------------------------------------- */

static inline void decode_q2_K(const block_q2_K *restrict b, float *restrict y) {
    const float d = half_to_float(b->d), dmin = half_to_float(b->dmin);
    float dl[16], ml[16];
    for (int g = 0; g < 16; g++) {
        dl[g] = d * (float)(b->scales[g] & 0x0f);
        ml[g] = dmin * (float)(b->scales[g] >> 4);
    }
    /* The 16 bytes q[] feed groups g, g+2, g+4, g+6, 32 elements apart. */
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *q = b->qs + 32 * h + 16 * k;
            float *o = y + 128 * h + 16 * k;
            const int g = 8 * h + k;
            for (int l = 0; l < 16; l++) {
                float t0 = dl[g] * (float)(q[l] & 3);
                float t1 = dl[g + 2] * (float)((q[l] >> 2) & 3);
                float t2 = dl[g + 4] * (float)((q[l] >> 4) & 3);
                float t3 = dl[g + 6] * (float)(q[l] >> 6);
                o[l] = t0 - ml[g];
                o[32 + l] = t1 - ml[g + 2];
                o[64 + l] = t2 - ml[g + 4];
                o[96 + l] = t3 - ml[g + 6];
            }
        }
    }
}
ROW_FUNCS(q2_K, QK_K)

/* The 16 group scales and mins of a Q2_K block as integers. */
static inline void ints_q2_K(const block_q2_K *b, int16_t *sc, int16_t *mn) {
    for (int g = 0; g < 16; g++) {
        sc[g] = (int16_t)(b->scales[g] & 0x0f);
        mn[g] = (int16_t)(b->scales[g] >> 4);
    }
}

/* w[e] = sc[group of e] * q[e], the codes in element order (as decode_q2_K). */
static inline void scaled_codes_q2_K(const block_q2_K *restrict b, const int16_t *restrict sc, int16_t *restrict w) {
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *q = b->qs + 32 * h + 16 * k;
            int16_t *o = w + 128 * h + 16 * k;
            const int g = 8 * h + k;
            for (int l = 0; l < 16; l++) {
                o[l] = (int16_t)(sc[g] * (q[l] & 3));
                o[32 + l] = (int16_t)(sc[g + 2] * ((q[l] >> 2) & 3));
                o[64 + l] = (int16_t)(sc[g + 4] * ((q[l] >> 4) & 3));
                o[96 + l] = (int16_t)(sc[g + 6] * (q[l] >> 6));
            }
        }
    }
}

/* . Q8_K activations: the block step with isum = sum(sc * q * qy), and the offset
 * chain with imin = sum(mn * bsum), mn * bsum per group of 16. */
static float vec_dot_q2_K(const void *row, const void *xq, int64_t nb) {
    const block_q2_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[16], mn[16];
        ints_q2_K(&x[i], sc, mn);
        scaled_codes_q2_K(&x[i], sc, w);
        widen_i8(y[i].qs, a, QK_K);
        sum = block_step(sum, dot_i16(w, a, QK_K), scale_to_float(x[i].d) * y[i].d);
        off = block_step(off, dot_i16(mn, y[i].bsums, QK_K / 16), scale_to_float(x[i].dmin) * y[i].d);
    }
    return sum - off;
}

/* ---------------------------------------------------------------------------
 * Q3_K: 256 elements in 16 groups of 16; y = (d * (sc - 32)) * q with
 * q = low2 - (hbit ? 0 : 4) in -4..3. The 2-bit codes are laid out as in Q2_K.
 * hbit of element e is bit e / 32 of hmask[e % 32]. The 6-bit scales sc are
 * packed in 12 bytes: group i < 8 takes its low 4 bits from the low nibble of
 * scales[i], group i >= 8 from the high nibble of scales[i - 8]; its high 2 bits
 * are bits 2*(i/4)..+1 of scales[8 + i % 4].
 * ------------------------------------------------------------------------- */

static inline void decode_q3_K(const block_q3_K *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    float dl[16];
    for (int g = 0; g < 16; g++) {
        dl[g] = d * (float)sq_q3_K_scale(b->scales, g);
    }
    /* As in Q2_K, q[] feeds groups g, g+2, g+4, g+6; their high bits are bits
     * 4h..4h+3 of hm[]. q = low2 - 4 + 4 * hbit. */
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *q = b->qs + 32 * h + 16 * k, *hm = b->hmask + 16 * k;
            float *o = y + 128 * h + 16 * k;
            const int g = 8 * h + k;
            for (int l = 0; l < 16; l++) {
                const int hb = hm[l] >> (4 * h);
                o[l] = dl[g] * (float)((q[l] & 3) - 4 + ((hb & 1) << 2));
                o[32 + l] = dl[g + 2] * (float)(((q[l] >> 2) & 3) - 4 + ((hb & 2) << 1));
                o[64 + l] = dl[g + 4] * (float)(((q[l] >> 4) & 3) - 4 + (hb & 4));
                o[96 + l] = dl[g + 6] * (float)((q[l] >> 6) - 4 + ((hb & 8) >> 1));
            }
        }
    }
}
ROW_FUNCS(q3_K, QK_K)

/* The 16 group scales of a Q3_K block, sc - 32, as integers. */
static inline void scales_q3_K(const block_q3_K *b, int16_t *sc) {
    for (int g = 0; g < 16; g++) {
        sc[g] = (int16_t)sq_q3_K_scale(b->scales, g);
    }
}

/* w[e] = sc[group of e] * q[e], q in -4..3, in element order (as decode_q3_K). */
static inline void scaled_codes_q3_K(const block_q3_K *restrict b, const int16_t *restrict sc, int16_t *restrict w) {
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *q = b->qs + 32 * h + 16 * k, *hm = b->hmask + 16 * k;
            int16_t *o = w + 128 * h + 16 * k;
            const int g = 8 * h + k;
            for (int l = 0; l < 16; l++) {
                const int hb = hm[l] >> (4 * h);
                o[l] = (int16_t)(sc[g] * ((q[l] & 3) - 4 + ((hb & 1) << 2)));
                o[32 + l] = (int16_t)(sc[g + 2] * (((q[l] >> 2) & 3) - 4 + ((hb & 2) << 1)));
                o[64 + l] = (int16_t)(sc[g + 4] * (((q[l] >> 4) & 3) - 4 + (hb & 4)));
                o[96 + l] = (int16_t)(sc[g + 6] * ((q[l] >> 6) - 4 + ((hb & 8) >> 1)));
            }
        }
    }
}

/* . Q8_K activations: the block step, isum = sum((sc - 32) * q * qy), q in -4..3. */
static float vec_dot_q3_K(const void *row, const void *xq, int64_t nb) {
    const block_q3_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[16];
        scales_q3_K(&x[i], sc);
        scaled_codes_q3_K(&x[i], sc, w);
        widen_i8(y[i].qs, a, QK_K);
        sum = block_step(sum, dot_i16(w, a, QK_K), scale_to_float(x[i].d) * y[i].d);
    }
    return sum;
}

/* ---------------------------------------------------------------------------
 * 6-bit scale/min pairs shared by Q4_K and Q5_K: 8 pairs in 12 bytes.
 * For j < 4: sc = scales[j] & 63, mn = scales[j + 4] & 63.
 * For j >= 4 the low 4 bits come from the nibbles of scales[j + 4] (low for sc,
 * high for mn) and the top 2 bits from bits 6-7 of scales[j - 4] (sc) and
 * scales[j] (mn). sq_k_scale_min (quants/blocks.h) unpacks them.
 * ------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------
 * Q4_K: 256 elements in 8 groups of 32; y = (d * sc) * q - (dmin * mn),
 * q a 4-bit code. Groups 2c and 2c+1 share qs[32c .. 32c+32): low nibbles for
 * the even group, high nibbles for the odd one.
 * ------------------------------------------------------------------------- */

/* d * sc and dmin * mn for the 8 groups of a Q4_K or Q5_K block. */
static inline void k_group_scales(const uint8_t *scales, float d, float dmin, float *dl, float *ml) {
    for (int g = 0; g < 8; g++) {
        int sc, mn;
        sq_k_scale_min(scales, g, &sc, &mn);
        dl[g] = d * (float)sc;
        ml[g] = dmin * (float)mn;
    }
}

static inline void decode_q4_K(const block_q4_K *restrict b, float *restrict y) {
    float dl[8], ml[8];
    k_group_scales(b->scales, half_to_float(b->d), half_to_float(b->dmin), dl, ml);
    for (int c = 0; c < 4; c++) {
        const uint8_t *q = b->qs + 32 * c;
        float *o = y + 64 * c;
        for (int l = 0; l < 32; l++) {
            float lo = dl[2 * c] * (float)(q[l] & 0x0f);
            float hi = dl[2 * c + 1] * (float)(q[l] >> 4);
            o[l] = lo - ml[2 * c];
            o[32 + l] = hi - ml[2 * c + 1];
        }
    }
}
ROW_FUNCS(q4_K, QK_K)

/* A Q4_K block's scaled codes w (sc * q, in element order) and per-group mins. */
static inline void scaled_codes_q4_K(const block_q4_K *restrict b, int16_t *restrict w, int16_t *restrict mn) {
    int16_t sc[8];
    for (int g = 0; g < 8; g++) {
        int s, m;
        sq_k_scale_min(b->scales, g, &s, &m);
        sc[g] = (int16_t)s;
        mn[g] = (int16_t)m;
    }
    for (int c = 0; c < 4; c++) {
        const uint8_t *q = b->qs + 32 * c;
        int16_t *o = w + 64 * c;
        for (int l = 0; l < 32; l++) {
            o[l] = (int16_t)(sc[2 * c] * (q[l] & 0x0f));
            o[32 + l] = (int16_t)(sc[2 * c + 1] * (q[l] >> 4));
        }
    }
}

/* The offset sum of a Q4_K or Q5_K block: mn * bsum per group of 32 (two bsums). */
static inline int32_t k_group_mins(const int16_t *restrict mn, const int16_t *restrict bsums) {
    int32_t imin = 0;
    for (int g = 0; g < 8; g++)
        imin += mn[g] * (bsums[2 * g] + bsums[2 * g + 1]);
    return imin;
}

/* . Q8_K activations: the block step with isum = sum(sc * q * qy), and the offset
 * chain with imin = sum(mn * bsum). */
static float vec_dot_q4_K(const void *row, const void *xq, int64_t nb) {
    const block_q4_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], mn[8];
        scaled_codes_q4_K(&x[i], w, mn);
        widen_i8(y[i].qs, a, QK_K);
        sum = block_step(sum, dot_i16(w, a, QK_K), scale_to_float(x[i].d) * y[i].d);
        off = block_step(off, k_group_mins(mn, y[i].bsums), scale_to_float(x[i].dmin) * y[i].d);
    }
    return sum - off;
}

/* ---------------------------------------------------------------------------
 * Q5_K: Q4_K plus a fifth bit: bit 4 of element l of group g is bit g of qh[l].
 * ------------------------------------------------------------------------- */

static inline void decode_q5_K(const block_q5_K *restrict b, float *restrict y) {
    float dl[8], ml[8];
    k_group_scales(b->scales, half_to_float(b->d), half_to_float(b->dmin), dl, ml);
    for (int c = 0; c < 4; c++) {
        const uint8_t *q = b->qs + 32 * c;
        float *o = y + 64 * c;
        for (int l = 0; l < 32; l++) {
            const int hb = b->qh[l] >> (2 * c); /* bits for groups 2c, 2c+1 */
            float lo = dl[2 * c] * (float)((q[l] & 0x0f) | (hb & 1) << 4);
            float hi = dl[2 * c + 1] * (float)((q[l] >> 4) | (hb & 2) << 3);
            o[l] = lo - ml[2 * c];
            o[32 + l] = hi - ml[2 * c + 1];
        }
    }
}
ROW_FUNCS(q5_K, QK_K)

/* w[e] = sc[group of e] * q[e] for the 8 groups of 32, in element order (as decode_q5_K). */
static inline void scaled_codes_q5_K(const block_q5_K *restrict b, const int16_t *restrict sc, int16_t *restrict w) {
    for (int c = 0; c < 4; c++) {
        const uint8_t *q = b->qs + 32 * c;
        int16_t *o = w + 64 * c;
        for (int l = 0; l < 32; l++) {
            const int hb = b->qh[l] >> (2 * c); /* bits for groups 2c, 2c+1 */
            o[l] = (int16_t)(sc[2 * c] * ((q[l] & 0x0f) | (hb & 1) << 4));
            o[32 + l] = (int16_t)(sc[2 * c + 1] * ((q[l] >> 4) | (hb & 2) << 3));
        }
    }
}

/* . Q8_K activations: as Q4_K, with 5-bit codes. */
static float vec_dot_q5_K(const void *row, const void *xq, int64_t nb) {
    const block_q5_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f, off = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[8], mn[8];
        for (int g = 0; g < 8; g++) {
            int s, m;
            sq_k_scale_min(x[i].scales, g, &s, &m);
            sc[g] = (int16_t)s;
            mn[g] = (int16_t)m;
        }
        scaled_codes_q5_K(&x[i], sc, w);
        widen_i8(y[i].qs, a, QK_K);
        sum = block_step(sum, dot_i16(w, a, QK_K), scale_to_float(x[i].d) * y[i].d);
        off = block_step(off, k_group_mins(mn, y[i].bsums), scale_to_float(x[i].dmin) * y[i].d);
    }
    return sum - off;
}

/* ---------------------------------------------------------------------------
 * Q6_K: 256 elements in 16 groups of 16; y = (d * sc) * (q - 32), q a 6-bit
 * code, sc a signed byte. Within each 128-element half h, element k takes its
 * low 4 bits from ql[64h + k % 64] (low nibble if k < 64, else high) and its
 * top 2 bits from bits 2*(k/32)..+1 of qh[32h + k % 32].
 * ------------------------------------------------------------------------- */

static inline void decode_q6_K(const block_q6_K *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    float dl[16];
    for (int g = 0; g < 16; g++)
        dl[g] = d * (float)b->scales[g];
    /* Byte l of ql, ql + 32 and qh serves elements l, 32 + l, 64 + l, 96 + l of
     * the half; for l < 16 those are groups g, g+2, g+4, g+6. */
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *ql = b->ql + 64 * h + 16 * k, *qh = b->qh + 32 * h + 16 * k;
            float *o = y + 128 * h + 16 * k;
            const int g = 8 * h + k;
            for (int l = 0; l < 16; l++) {
                o[l] = dl[g] * (float)(((ql[l] & 0x0f) | (qh[l] & 3) << 4) - 32);
                o[32 + l] = dl[g + 2] * (float)(((ql[32 + l] & 0x0f) | (qh[l] & 0x0c) << 2) - 32);
                o[64 + l] = dl[g + 4] * (float)(((ql[l] >> 4) | (qh[l] & 0x30)) - 32);
                o[96 + l] = dl[g + 6] * (float)(((ql[32 + l] >> 4) | (qh[l] & 0xc0) >> 2) - 32);
            }
        }
    }
}
ROW_FUNCS(q6_K, QK_K)

/* w[e] = sc[group of e] * (q[e] - bias), q the unsigned 6-bit code, in element
 * order (as decode_q6_K): bias 32 gives the signed weights, 0 the raw codes. */
static inline void scaled_codes_q6_K(const block_q6_K *restrict b, const int16_t *restrict sc, int bias,
                                     int16_t *restrict w) {
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 2; k++) {
            const uint8_t *ql = b->ql + 64 * h + 16 * k, *qh = b->qh + 32 * h + 16 * k;
            int16_t *o = w + 128 * h + 16 * k;
            const int g = 8 * h + k;
            for (int l = 0; l < 16; l++) {
                o[l] = (int16_t)(sc[g] * (((ql[l] & 0x0f) | (qh[l] & 3) << 4) - bias));
                o[32 + l] = (int16_t)(sc[g + 2] * (((ql[32 + l] & 0x0f) | (qh[l] & 0x0c) << 2) - bias));
                o[64 + l] = (int16_t)(sc[g + 4] * (((ql[l] >> 4) | (qh[l] & 0x30)) - bias));
                o[96 + l] = (int16_t)(sc[g + 6] * (((ql[32 + l] >> 4) | (qh[l] & 0xc0) >> 2) - bias));
            }
        }
    }
}

/* . Q8_K activations: the block step, isum = sum(sc * (q - 32) * qy). */
static float vec_dot_q6_K(const void *row, const void *xq, int64_t nb) {
    const block_q6_K *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[16];
        for (int g = 0; g < 16; g++)
            sc[g] = x[i].scales[g];
        scaled_codes_q6_K(&x[i], sc, 32, w);
        widen_i8(y[i].qs, a, QK_K);
        sum = block_step(sum, dot_i16(w, a, QK_K), scale_to_float(x[i].d) * y[i].d);
    }
    return sum;
}

/* ---------------------------------------------------------------------------
 * IQ4_NL: 32 elements, y = d * kvalues[q], q a 4-bit index into a fixed
 * non-linear grid (denser near zero, where weights cluster); nibble order as Q4_0.
 * ------------------------------------------------------------------------- */

static const int8_t kvalues_iq4nl[16] = { SQ_IQ4_GRID };

/* 32 elements from 16 bytes of grid indices. Scaling the 16 grid values once
 * and looking the codes up gives the same floats as scaling every element, at
 * half the multiplies. */
static inline void iq4_decode32(const uint8_t *restrict qs, float d, float *restrict y) {
    float t[16];
    for (int i = 0; i < 16; i++)
        t[i] = d * (float)kvalues_iq4nl[i];
    for (int j = 0; j < 16; j++) {
        y[j] = t[qs[j] & 0x0f];
        y[j + 16] = t[qs[j] >> 4];
    }
}

static inline void decode_iq4_nl(const block_iq4_nl *restrict b, float *restrict y) {
    iq4_decode32(b->qs, half_to_float(b->d), y);
}
ROW_FUNCS(iq4_nl, QK4_NL)

/* The vec_dot functions look grid values up a byte (two codes) at a time: entry b
 * of iq4_pairs holds kvalues[b & 15] in its low int16 and kvalues[b >> 4] in its
 * high one. The 32 weights of a block then come out in the order of elements
 * 0, 16, 1, 17, ..., and the activations are interleaved to match. (Plain x86-64
 * has no vector table lookup, so these stay scalar: 16 per block, not 32.) */
#define IQ4_PAIR(b) ((uint32_t)(uint16_t)SQ_IQ4_VALUE((b) & 15) | (uint32_t)(uint16_t)SQ_IQ4_VALUE((b) >> 4) << 16)
#define IQ4_P4(b) IQ4_PAIR(b), IQ4_PAIR((b) + 1), IQ4_PAIR((b) + 2), IQ4_PAIR((b) + 3)
#define IQ4_P16(b) IQ4_P4(b), IQ4_P4((b) + 4), IQ4_P4((b) + 8), IQ4_P4((b) + 12)
#define IQ4_P64(b) IQ4_P16(b), IQ4_P16((b) + 16), IQ4_P16((b) + 32), IQ4_P16((b) + 48)
static const uint32_t iq4_pairs[256] = { IQ4_P64(0), IQ4_P64(64), IQ4_P64(128), IQ4_P64(192) };

/* 32 int16 grid values from 16 bytes of indices, interleaved as above. */
static inline void iq4_codes32(const uint8_t *restrict qs, int16_t *restrict w) {
    uint32_t p[16];
    for (int j = 0; j < 16; j++)
        p[j] = iq4_pairs[qs[j]];
    memcpy(w, p, sizeof(p));
}

/* The 32 activations of a block in the same interleaved order. */
static inline void interleave32(const int8_t *restrict q, int16_t *restrict a) {
    for (int j = 0; j < 16; j++) {
        a[2 * j] = q[j];
        a[2 * j + 1] = q[j + 16];
    }
}

/* . Q8_0 activations: the block step, isum = sum(kvalues[q] * qy). */
static float vec_dot_iq4_nl(const void *row, const void *xq, int64_t nb) {
    const block_iq4_nl *x = row;
    const block_q8_0 *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK4_NL], a[QK4_NL];
        iq4_codes32(x[i].qs, w);
        interleave32(y[i].qs, a);
        sum = block_step(sum, dot_i16(w, a, QK4_NL), scale_to_float(x[i].d) * scale_to_float(y[i].d));
    }
    return sum;
}

/* ---------------------------------------------------------------------------
 * IQ4_XS: 256 elements in 8 groups of 32, each group an IQ4_NL block whose
 * scale is d * (s - 32), s a 6-bit code: low 4 bits in nibble g % 2 of
 * scales_l[g / 2], high 2 bits at bits 2g..2g+1 of scales_h.
 * ------------------------------------------------------------------------- */

static inline void decode_iq4_xs(const block_iq4_xs *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int g = 0; g < 8; g++) {
        iq4_decode32(b->qs + 16 * g, d * (float)(sq_iq4_xs_scale(b, g) - 32), y + 32 * g);
    }
}
ROW_FUNCS(iq4_xs, QK_K)

/* . Q8_K activations: the block step, isum = sum((s - 32) * kvalues[q] * qy). */
static float vec_dot_iq4_xs(const void *row, const void *xq, int64_t nb) {
    const block_iq4_xs *x = row;
    const block_q8_K *y = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int g = 0; g < 8; g++) {
            int16_t w[32], a[32];
            iq4_codes32(x[i].qs + 16 * g, w);
            interleave32(y[i].qs + 32 * g, a);
            isum += (sq_iq4_xs_scale(&x[i], g) - 32) * dot_i16(w, a, 32);
        }
        sum = block_step(sum, isum, scale_to_float(x[i].d) * y[i].d);
    }
    return sum;
}

/* ---------------------------------------------------------------------------
 * The type table: one row per type of quants/types.h's lists
 * ------------------------------------------------------------------------- */

#define TRAITS(name, QK) \
    .elems = QK, .bytes = (int)sizeof(block_##name), .dequant = dequant_##name, .dot = dot_##name
#define WEIGHT(name, vec) .vec_type = vec, .vec_dot = vec_dot_##name
#define FLOAT_ROW(ctx, NAME, name, unit_t) \
    [SQ_##NAME] = { .elems = 1, .bytes = (int)sizeof(unit_t), .dequant = dequant_##name, .dot = dot_##name, \
                    WEIGHT(name, SQ_##NAME) },
#define QUANT_ROW(ctx, NAME, name, QK, ACT) \
    [SQ_##NAME] = { TRAITS(name, QK), WEIGHT(name, SQ_##ACT) },
#define ACTIVATION_ROW(ctx, NAME, name, QK) [SQ_##NAME] = { TRAITS(name, QK) },
const sq_type_traits sq_type_table[SQ_TYPE_SLOTS] = {
    SQ_FLOAT_TYPES(FLOAT_ROW, _)
    SQ_QUANT_TYPES(QUANT_ROW, _)
    SQ_ACTIVATION_TYPES(ACTIVATION_ROW, _)
};
/* Every weight type's activations come in blocks of its own size, so one block
 * count serves both rows of a vec_dot. */
#define ACT_QK_Q8_0 QK8_0
#define ACT_QK_Q8_1 QK8_1
#define ACT_QK_Q8_K QK_K
#define SAME_BLOCKS(ctx, NAME, name, QK, ACT) \
    static_assert(QK == ACT_QK_##ACT, #NAME "'s blocks and " #ACT "'s differ in size");
SQ_QUANT_TYPES(SAME_BLOCKS, _)

/* The activation formats: x converted to them for a vec_dot. */
#define QUANTIZER(ctx, NAME, name, ...) [SQ_##NAME] = quant_##name,
const sq_quantize_fn sq_quantizers[SQ_TYPE_SLOTS] = {
    SQ_FLOAT_TYPES(QUANTIZER, _)
    [SQ_Q8_0] = quant_q8_0,
    SQ_ACTIVATION_TYPES(QUANTIZER, _)
};
