/* quants.c: GGUF block encodings, row decoders and row dot products.
 *
 * Every quantized type gets one section: how its block encodes the values (the
 * block_<type> struct itself is in quant_blocks.h), a one-block decoder,
 * then the row decoder and row dot product built from it (ROW_FUNCS below), and
 * its vec_dot: the dot product with activations already converted to the block
 * format llama.cpp pairs with the type. Those activation formats (Q8_0, also a
 * weight type, Q8_1 and Q8_K) have sections of their own with their quantizers.
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
 *  - The vec_dot functions follow llama.cpp's CPU backend instead of the gguf
 *    decoders: an exact integer sum per block (see "Integer dot products"),
 *    scaled by the float product of the two blocks' scales and summed in float.
 *    Q5_0, Q5_1, IQ4_XS and the K-quants keep the 8 float lanes of the AVX2 kernels
 *    too (see fma_lanes, KLANES), so their scalar, AVX2 and NEON (quants_neon.c,
 *    the same lanes in two 4-float registers) versions give the same bits.
 *    The activation quantizers reproduce llama.cpp's x86 code bit for bit.
 */
#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "smolq.h"
#include "quants/quants.h"
#include "quants/blocks.h"

static inline float bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

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
    uint32_t sub = f32_to_bits((float)(int32_t)mag * 0x1p-24f);
    uint32_t is_sub = 0u - (uint32_t)(mag < 0x0400u);
    bits = (sub & is_sub) | (bits & ~is_sub);
    return bits_to_f32(bits | sign);
}

float sq_fp16_to_fp32(uint16_t h) { return half_to_float(h); }

/* half_to_float for one value at a time, such as a block's scale: normal halves
 * (all but zero, subnormals, inf and NaN) take a short path behind a branch that
 * predicts well, since scales are nearly always normal. Same results. */
static inline float scale_to_float(uint16_t h) {
    const uint32_t e = h & 0x7c00u;
    if (e != 0 && e != 0x7c00u)
        return bits_to_f32((uint32_t)(h & 0x8000u) << 16 | (((uint32_t)(h & 0x7fffu) << 13) + (112u << 23)));
    return half_to_float(h);
}

uint16_t sq_fp32_to_fp16(float f) {
    uint32_t x = f32_to_bits(f);
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
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
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

/* Integer dot products for the vec_dot functions (the llama.cpp path: weights
 * times activations already quantized to 8 bits). A block's codes are widened
 * to int16, the weights with their group scale already multiplied in, and the
 * products summed in int32: the shape GCC compiles to pmaddwd on plain x86-64.
 * (int8 operands read straight from the blocks compile to a slower unpack and
 * pmullw sequence instead.) Folding the scales in is exact: |scale * code| is
 * at most 8064 (Q6_K's unsigned codes) and a super-block's sum stays below 2^28.
 * Being integer, the sum is the same in any order; only the float steps around
 * it (scale products, the running sum over blocks, and for some types which
 * elements share a float lane: see KLANES) follow llama.cpp's. */
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

/* Lane-ordered float sums, for the types whose vec_dot must give the same bits
 * on both paths. Their AVX2 versions (quants_avx2.c, shaped as llama.cpp's AVX2
 * kernels) keep 8 float lanes: lane l takes the integer products of elements
 * 4l..4l+3 of every 32 in a block and is updated once per block with an FMA by
 * the block's float scale; one fixed horizontal sum ends the row. The integer
 * lane sums are exact in any order, so repeating the float steps here, with
 * fmaf for the FMA, makes the scalar code round exactly as the AVX2 code does.
 * The NEON versions (quants_neon.c) repeat them once more, so every path agrees. */
#define NLANE 8

/* The lane sums of a 32-element block in element order: lane l takes the
 * products of elements 4l..4l+3. (All products first, then the sums of four:
 * the shape that vectorizes.) */
static inline void dot_i16_lanes(const int16_t *restrict a, const int16_t *restrict b,
                                 int32_t *restrict lane) {
    int32_t p[4 * NLANE];
    for (int j = 0; j < 4 * NLANE; j++)
        p[j] = a[j] * b[j];
    for (int l = 0; l < NLANE; l++)
        lane[l] = (p[4 * l] + p[4 * l + 1]) + (p[4 * l + 2] + p[4 * l + 3]);
}

/* One block's update of the lanes: acc[l] += d * lane[l], rounded once. */
static inline void fma_lanes(float *restrict acc, float d, const int32_t *restrict lane) {
    for (int l = 0; l < NLANE; l++)
        acc[l] = fmaf(d, (float)lane[l], acc[l]);
}

/* The AVX2 horizontal sum: the two 128-bit halves added (lane l + lane l + 4),
 * then the upper pair of that onto the lower, then the last two. */
static inline float sum_lanes(const float *acc) {
    const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5];
    const float t2 = acc[2] + acc[6], t3 = acc[3] + acc[7];
    return (t0 + t2) + (t1 + t3);
}

/* Round to the nearest integer, ties to even, for |v| < 2^22: llama.cpp's
 * nearest_int, and what its AVX code's _mm256_round_ps(_MM_ROUND_NEAREST) does.
 * Adding 1.5 * 2^23 leaves the integer in the low mantissa bits. No float to int
 * conversion (undefined out of range, e.g. on NaN), and it vectorizes on SSE2. */
static inline int32_t nearest_int(float v) {
    const uint32_t u = f32_to_bits(v + 12582912.f);
    return (int32_t)(u & 0x007fffffu) - 0x00400000;
}

/* Float dot products of the 1-element types with activations in the weights'
 * own format, shaped as llama.cpp's ggml_vec_dot_f32/f16/bf16 on AVX: 32 lanes
 * (four 8-float registers) each accumulating the products of its elements, a
 * pairwise reduction, and the last n % 32 products added in double. */
#define LANES 32
static inline float lanes_total(const float *acc) {
    float r[8], t[4];
    for (int l = 0; l < 8; l++)
        r[l] = (acc[l] + acc[16 + l]) + (acc[8 + l] + acc[24 + l]);
    for (int l = 0; l < 4; l++)
        t[l] = r[l] + r[4 + l];
    return (t[0] + t[1]) + (t[2] + t[3]);
}

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

static void quant_f16(const float *restrict x, void *restrict dst, int64_t n) {
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
        double sum = lanes_total(acc);                                             \
        for (; i < n; i++)                                                         \
            sum += (double)(to_f32(a[i]) * to_f32(b[i]));                          \
        return (float)sum;                                                         \
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

/* Codes of 32 activations for Q8_0 and Q8_1, as llama.cpp's x86 (AVX and AVX2)
 * quantize_row_q8_0/_1 make them: q = round(x * (127 / amax)), ties to even.
 * Returns d = amax / 127, unrounded; the blocks store it as f16, and the dot
 * products use that rounded d while the codes came from the exact one.
 * (llama.cpp's scalar reference code, and gguf's, multiply by 1 / d and round
 * ties away from zero; the codes differ only where x * 127 / amax is within an
 * ulp or two of a half.) All-zero blocks get d = 0 and codes 0. Non-finite x
 * give unspecified codes (but no undefined behaviour). */
static inline float q8_32_codes(const float *restrict x, int8_t *restrict qs) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    for (int j = 0; j < 32; j++) {
        const float v = x[j] * id;
        qs[j] = (int8_t)nearest_int(v);
    }
    return amax / 127.f;
}

static void quant_q8_0(const float *restrict x, void *restrict dst, int64_t nb) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < nb; i++)
        y[i].d = sq_fp32_to_fp16(q8_32_codes(x + i * QK8_0, y[i].qs));
}

/* Q8_0 weights . Q8_0 activations: per block (dx * dy) * sum(qx * qy), summed in float. */
static float vec_dot_q8_0(const void *row, const void *xq, int64_t nb) {
    const block_q8_0 *x = row, *y = xq;
    float acc[8] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK8_0], a[QK8_0];
        widen_i8(x[i].qs, w, QK8_0);
        widen_i8(y[i].qs, a, QK8_0);
        int32_t lane[NLANE];
        dot_i16_lanes(w, a, lane);
        fma_lanes(acc, scale_to_float(x[i].d) * scale_to_float(y[i].d), lane);
    }
    return sum_lanes(acc);
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

static void quant_q8_1(const float *restrict x, void *restrict dst, int64_t nb) {
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
static void quant_q8_K(const float *restrict x, void *restrict dst, int64_t nb) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
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

/* The vec_dot functions of Q2_K, Q3_K, Q5_K and Q6_K round as llama.cpp's AVX2
 * kernels do, so that their scalar and AVX2 (quants_avx2.c) versions agree with
 * it, and with each other, bit for bit. Those kernels keep a block's integer sum
 * in 8 int32 lanes: maddubs then madd give int32 lane l the products of bytes
 * 4l .. 4l+3 of each 32-element register, so lane l sums the elements with
 * e % 32 in 4l .. 4l+3. Per block each lane is converted to float and scaled
 * into its own float accumulator by an FMA; hsum_float_8 adds the 8 at the end.
 * Terms made from bsums (two groups of 16 per lane) have lanes of their own. */
#define KLANES 8

/* Lane sums of a block's scaled codes w times its activations a (as int16). One
 * running sum per position in a 32-element chunk keeps the loop vectorizable. */
static inline void k_lanes_dot(const int16_t *restrict w, const int16_t *restrict a, int32_t *restrict lane) {
    int32_t p[32] = {0};
    for (int j = 0; j < QK_K; j += 32)
        for (int k = 0; k < 32; k++)
            p[k] += w[j + k] * a[j + k];
    for (int l = 0; l < KLANES; l++)
        lane[l] = p[4 * l] + p[4 * l + 1] + p[4 * l + 2] + p[4 * l + 3];
}

/* Lane l = m[2l] * bsums[2l] + m[2l+1] * bsums[2l+1], m a per-group factor
 * (madd of the 16 factors with the 16 bsums). */
static inline void k_lanes_bsums(const int16_t *restrict m, const int16_t *restrict bsums, int32_t *restrict lane) {
    for (int l = 0; l < KLANES; l++)
        lane[l] = m[2 * l] * bsums[2 * l] + m[2 * l + 1] * bsums[2 * l + 1];
}

/* acc[l] += d * lane[l], rounded once, as _mm256_fmadd_ps does. */
static inline void k_lanes_fma(float *restrict acc, float d, const int32_t *restrict lane) {
    for (int l = 0; l < KLANES; l++)
        acc[l] = fmaf(d, (float)lane[l], acc[l]);
}

/* The 8 accumulators added in hsum_float_8's order: halves, then pairs. */
static inline float k_lanes_total(const float *acc) {
    const float r0 = acc[0] + acc[4], r1 = acc[1] + acc[5];
    const float r2 = acc[2] + acc[6], r3 = acc[3] + acc[7];
    return (r0 + r2) + (r1 + r3);
}

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

/* . Q8_0 activations: sum over blocks of isum * (dx * dy), one fmaf per block in
 * block order. On AVX2 llama.cpp repacks Q4_0 matrices (8 rows interleaved) and
 * each output lane runs exactly this chain, so this is the order to match; its
 * plain vec_dot (8-lane sums) is only used for matrices whose row count is not a
 * multiple of 8, which no model here has. */
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
        const float d = scale_to_float(x[i].d) * scale_to_float(y[i].d);
        sumf = fmaf((float)dot_i16(w, a, QK4_0), d, sumf);
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

/* . Q8_1 activations: per block (dx * dy) * sum(q * qy) + m * s. As in
 * llama.cpp's x86 code the offset terms m * s have their own float sum. */
static float vec_dot_q4_1(const void *row, const void *xq, int64_t nb) {
    const block_q4_1 *x = row;
    const block_q8_1 *y = xq;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK4_1], a[QK4_1];
        for (int j = 0; j < QK4_1 / 2; j++) {
            w[j] = (int16_t)(x[i].qs[j] & 0x0f);
            w[j + QK4_1 / 2] = (int16_t)(x[i].qs[j] >> 4);
        }
        widen_i8(y[i].qs, a, QK4_1);
        const float ms = scale_to_float(x[i].m) * scale_to_float(y[i].s);
        summs += ms;
        int32_t lane[NLANE];
        dot_i16_lanes(w, a, lane);
        fma_lanes(acc, scale_to_float(x[i].d) * scale_to_float(y[i].d), lane);
    }
    return sum_lanes(acc) + summs;
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

/* . Q8_0 activations: per block (dx * dy) * sum((q - 16) * qy), in lanes (see
 * fma_lanes) so that the result matches the AVX2 version bit for bit. */
static float vec_dot_q5_0(const void *row, const void *xq, int64_t nb) {
    const block_q5_0 *x = row;
    const block_q8_0 *y = xq;
    float acc[NLANE] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK5_0], a[QK5_0];
        uint8_t hb[QK5_0];
        q5_high_bits(x[i].qh, hb);
        for (int j = 0; j < QK5_0 / 2; j++) {
            w[j] = (int16_t)(((x[i].qs[j] & 0x0f) | hb[j]) - 16);
            w[j + QK5_0 / 2] = (int16_t)(((x[i].qs[j] >> 4) | hb[j + QK5_0 / 2]) - 16);
        }
        widen_i8(y[i].qs, a, QK5_0);
        int32_t lane[NLANE];
        dot_i16_lanes(w, a, lane);
        const float d = scale_to_float(x[i].d) * scale_to_float(y[i].d);
        fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc);
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

/* . Q8_1 activations: per block (dx * dy) * sum(q * qy) in lanes, as Q5_0, and
 * the offset terms m * s in a float sum of their own, added last. */
static float vec_dot_q5_1(const void *row, const void *xq, int64_t nb) {
    const block_q5_1 *x = row;
    const block_q8_1 *y = xq;
    float acc[NLANE] = {0}, summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK5_1], a[QK5_1];
        uint8_t hb[QK5_1];
        q5_high_bits(x[i].qh, hb);
        for (int j = 0; j < QK5_1 / 2; j++) {
            w[j] = (int16_t)((x[i].qs[j] & 0x0f) | hb[j]);
            w[j + QK5_1 / 2] = (int16_t)((x[i].qs[j] >> 4) | hb[j + QK5_1 / 2]);
        }
        widen_i8(y[i].qs, a, QK5_1);
        int32_t lane[NLANE];
        dot_i16_lanes(w, a, lane);
        const float ms = scale_to_float(x[i].m) * scale_to_float(y[i].s);
        summs += ms;
        const float d = scale_to_float(x[i].d) * scale_to_float(y[i].d);
        fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc) + summs;
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

/* . Q8_K activations: per block (dy * d) * sum(sc * q * qy) - (dy * dmin) * sum(mn * bsum),
 * mn * bsum per group of 16. In KLANES lanes (see the Q8_K section): the min
 * lanes are scaled by -(dy * dmin) first, then the code lanes by dy * d, both
 * into the same accumulators. */
static float vec_dot_q2_K(const void *row, const void *xq, int64_t nb) {
    const block_q2_K *x = row;
    const block_q8_K *y = xq;
    float acc[KLANES] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[16], mn[16];
        int32_t lane[KLANES];
        ints_q2_K(&x[i], sc, mn);
        k_lanes_bsums(mn, y[i].bsums, lane);
        const float dmin = -(y[i].d * scale_to_float(x[i].dmin));
        k_lanes_fma(acc, dmin, lane);
        scaled_codes_q2_K(&x[i], sc, w);
        widen_i8(y[i].qs, a, QK_K);
        k_lanes_dot(w, a, lane);
        const float d = y[i].d * scale_to_float(x[i].d);
        k_lanes_fma(acc, d, lane);
    }
    return k_lanes_total(acc);
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
        const int lo4 = (b->scales[g % 8] >> (4 * (g / 8))) & 0x0f;
        const int hi2 = (b->scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        dl[g] = d * (float)((lo4 | hi2 << 4) - 32);
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
        const int lo4 = (b->scales[g % 8] >> (4 * (g / 8))) & 0x0f;
        const int hi2 = (b->scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = (int16_t)((lo4 | hi2 << 4) - 32);
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

/* . Q8_K activations: per block (dy * d) * sum((sc - 32) * q * qy), q in -4..3,
 * in KLANES lanes (see the Q8_K section). */
static float vec_dot_q3_K(const void *row, const void *xq, int64_t nb) {
    const block_q3_K *x = row;
    const block_q8_K *y = xq;
    float acc[KLANES] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[16];
        int32_t lane[KLANES];
        scales_q3_K(&x[i], sc);
        scaled_codes_q3_K(&x[i], sc, w);
        widen_i8(y[i].qs, a, QK_K);
        k_lanes_dot(w, a, lane);
        const float d = y[i].d * scale_to_float(x[i].d);
        k_lanes_fma(acc, d, lane);
    }
    return k_lanes_total(acc);
}

/* ---------------------------------------------------------------------------
 * 6-bit scale/min pairs shared by Q4_K and Q5_K: 8 pairs in 12 bytes.
 * For j < 4: sc = scales[j] & 63, mn = scales[j + 4] & 63.
 * For j >= 4 the low 4 bits come from the nibbles of scales[j + 4] (low for sc,
 * high for mn) and the top 2 bits from bits 6-7 of scales[j - 4] (sc) and
 * scales[j] (mn).
 * ------------------------------------------------------------------------- */

static inline void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* ---------------------------------------------------------------------------
 * Q4_K: 256 elements in 8 groups of 32; y = (d * sc) * q - (dmin * mn),
 * q a 4-bit code. Groups 2c and 2c+1 share qs[32c .. 32c+32): low nibbles for
 * the even group, high nibbles for the odd one.
 * ------------------------------------------------------------------------- */

/* d * sc and dmin * mn for the 8 groups of a Q4_K or Q5_K block. */
static inline void k_group_scales(const uint8_t *scales, float d, float dmin, float *dl, float *ml) {
    for (int g = 0; g < 8; g++) {
        int sc, mn;
        k_scale_min(scales, g, &sc, &mn);
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
        k_scale_min(b->scales, g, &s, &m);
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

/* . Q8_K activations, as llama.cpp's repacked Q4_K gemv rounds it (its kernels for
 * 8 interleaved rows are what it runs on AVX2 for every matrix with a multiple of 8
 * rows): per block isum = sum(sc * q * qy) and imin = sum(mn * bsum) (mn * bsum per
 * group of 32, two bsums), then two fmaf chains in block order, isum * (d * dy) and
 * imin * (dmin * dy), subtracted at the end. Its gemm (four activation rows at a
 * time) differs only in taking a term per 64 elements: batch_dot_q4_K. */
static float vec_dot_q4_K(const void *row, const void *xq, int64_t nb) {
    const block_q4_K *x = row;
    const block_q8_K *y = xq;
    float sumf = 0.0f, summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], mn[8];
        int32_t summs = 0;
        scaled_codes_q4_K(&x[i], w, mn);
        for (int g = 0; g < 8; g++)
            summs += mn[g] * (y[i].bsums[2 * g] + y[i].bsums[2 * g + 1]);
        widen_i8(y[i].qs, a, QK_K);
        const float d = scale_to_float(x[i].d) * y[i].d;
        const float dmin = scale_to_float(x[i].dmin) * y[i].d;
        sumf = fmaf((float)dot_i16(w, a, QK_K), d, sumf);
        summ = fmaf((float)summs, dmin, summ);
    }
    return sumf - summ;
}

/* The gemm's order for n_tokens activation rows (xq_stride bytes apart) at once:
 * vec_dot_q4_K's two chains with a term per 64 elements, each block decoded once
 * per tile of rows. (quants_avx2.c's sq_batch_dot_q4_K_avx2 gives the same bits.) */
#define Q4K_TILE 16
static void batch_dot_q4_K(const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t nb,
                           float *y, int64_t ldy) {
    const block_q4_K *x = row;
    for (int t0 = 0; t0 < n_tokens; t0 += Q4K_TILE) {
        const int nt = n_tokens - t0 < Q4K_TILE ? n_tokens - t0 : Q4K_TILE;
        float sumf[Q4K_TILE] = {0}, summ[Q4K_TILE] = {0};
        for (int64_t i = 0; i < nb; i++) {
            int16_t w[QK_K], mn[8];
            scaled_codes_q4_K(&x[i], w, mn);
            const float dw = scale_to_float(x[i].d), dminw = scale_to_float(x[i].dmin);
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = (const block_q8_K *)((const uint8_t *)xq + (t0 + t) * xq_stride) + i;
                const float d = dw * a->d, dmin = dminw * a->d;
                for (int e = 0; e < QK_K; e += 64) {
                    int32_t isum = 0;
                    for (int j = 0; j < 64; j++)
                        isum += w[e + j] * a->qs[e + j];
                    const int g = e / 32;
                    const int32_t imin = mn[g] * (a->bsums[2 * g] + a->bsums[2 * g + 1])
                                         + mn[g + 1] * (a->bsums[2 * g + 2] + a->bsums[2 * g + 3]);
                    sumf[t] = fmaf((float)isum, d, sumf[t]);
                    summ[t] = fmaf((float)imin, dmin, summ[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            y[(t0 + t) * ldy] = sumf[t] - summ[t];
    }
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

/* . Q8_K activations: as Q4_K, with 5-bit codes, but rounded as llama.cpp's AVX2
 * Q5_K kernel: the codes in KLANES lanes (see the Q8_K section), the mins as one
 * integer sum per block, FMA'd by -(dy * dmin) into a float of their own that is
 * added after the lanes' total. (The FMA is the compiler's there: its multiply
 * and add are contracted into one in llama.cpp's AVX2 builds.) */
static float vec_dot_q5_K(const void *row, const void *xq, int64_t nb) {
    const block_q5_K *x = row;
    const block_q8_K *y = xq;
    float acc[KLANES] = {0}, summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[8];
        int32_t lane[KLANES], summs = 0;
        for (int g = 0; g < 8; g++) {
            int s, m;
            k_scale_min(x[i].scales, g, &s, &m);
            sc[g] = (int16_t)s;
            summs += m * (y[i].bsums[2 * g] + y[i].bsums[2 * g + 1]);
        }
        const float dmin = -(y[i].d * scale_to_float(x[i].dmin));
        summ = fmaf(dmin, (float)summs, summ);
        scaled_codes_q5_K(&x[i], sc, w);
        widen_i8(y[i].qs, a, QK_K);
        k_lanes_dot(w, a, lane);
        const float d = y[i].d * scale_to_float(x[i].d);
        k_lanes_fma(acc, d, lane);
    }
    return k_lanes_total(acc) + summ;
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

/* . Q8_K activations: per block (dy * d) * sum(sc * (q - 32) * qy), in KLANES
 * lanes (see the Q8_K section). As in llama.cpp's AVX2 kernel the lanes take the
 * unsigned codes q, and the -32 comes off them as 32 * sc * bsum, two groups per
 * lane: a lane's integer sum differs from that of its own elements' (q - 32). */
static float vec_dot_q6_K(const void *row, const void *xq, int64_t nb) {
    const block_q6_K *x = row;
    const block_q8_K *y = xq;
    float acc[KLANES] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK_K], a[QK_K], sc[16];
        int32_t lane[KLANES], off[KLANES];
        for (int g = 0; g < 16; g++)
            sc[g] = x[i].scales[g];
        scaled_codes_q6_K(&x[i], sc, 0, w);
        widen_i8(y[i].qs, a, QK_K);
        k_lanes_dot(w, a, lane);
        k_lanes_bsums(sc, y[i].bsums, off);
        for (int l = 0; l < KLANES; l++)
            lane[l] -= 32 * off[l];
        const float d = y[i].d * scale_to_float(x[i].d);
        k_lanes_fma(acc, d, lane);
    }
    return k_lanes_total(acc);
}

/* ---------------------------------------------------------------------------
 * IQ4_NL: 32 elements, y = d * kvalues[q], q a 4-bit index into a fixed
 * non-linear grid (denser near zero, where weights cluster); nibble order as Q4_0.
 * ------------------------------------------------------------------------- */

static const int8_t kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

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
#define IQ4_KV(i) ((i) == 0 ? -127 : (i) == 1 ? -104 : (i) == 2 ? -83 : (i) == 3 ? -65 :   \
                   (i) == 4 ? -49 : (i) == 5 ? -35 : (i) == 6 ? -22 : (i) == 7 ? -10 :      \
                   (i) == 8 ? 1 : (i) == 9 ? 13 : (i) == 10 ? 25 : (i) == 11 ? 38 :         \
                   (i) == 12 ? 53 : (i) == 13 ? 69 : (i) == 14 ? 89 : 113)
#define IQ4_PAIR(b) ((uint32_t)(uint16_t)IQ4_KV((b) & 15) | (uint32_t)(uint16_t)IQ4_KV((b) >> 4) << 16)
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

/* . Q8_0 activations: sum over blocks of isum * (dx * dy), one fmaf per block in
 * block order: the chain of llama.cpp's repacked IQ4_NL kernels (as for Q4_0). */
static float vec_dot_iq4_nl(const void *row, const void *xq, int64_t nb) {
    const block_iq4_nl *x = row;
    const block_q8_0 *y = xq;
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int16_t w[QK4_NL], a[QK4_NL];
        iq4_codes32(x[i].qs, w);
        interleave32(y[i].qs, a);
        const float d = scale_to_float(x[i].d) * scale_to_float(y[i].d);
        sumf = fmaf((float)dot_i16(w, a, QK4_NL), d, sumf);
    }
    return sumf;
}

/* ---------------------------------------------------------------------------
 * IQ4_XS: 256 elements in 8 groups of 32, each group an IQ4_NL block whose
 * scale is d * (s - 32), s a 6-bit code: low 4 bits in nibble g % 2 of
 * scales_l[g / 2], high 2 bits at bits 2g..2g+1 of scales_h.
 * ------------------------------------------------------------------------- */

/* The 6-bit scale code of group g. */
static inline int iq4_xs_scale(const block_iq4_xs *b, int g) {
    return ((b->scales_l[g / 2] >> (4 * (g % 2))) & 0x0f) | ((b->scales_h >> (2 * g)) & 3) << 4;
}

static inline void decode_iq4_xs(const block_iq4_xs *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int g = 0; g < 8; g++) {
        iq4_decode32(b->qs + 16 * g, d * (float)(iq4_xs_scale(b, g) - 32), y + 32 * g);
    }
}
ROW_FUNCS(iq4_xs, QK_K)

/* The lane sums (see fma_lanes) of a block in iq4_codes32's interleaved order:
 * element j sits at position 2j and element j + 16 at 2j + 1, so the elements
 * 4l..4l+3 of lane l < 4 are at the even positions 8l..8l+6 and those of lane
 * l + 4 at the odd positions between them. */
static inline void iq4_lanes(const int16_t *restrict w, const int16_t *restrict a,
                             int32_t *restrict lane) {
    int32_t p[4 * NLANE];
    for (int j = 0; j < 4 * NLANE; j++)
        p[j] = w[j] * a[j];
    for (int l = 0; l < 4; l++) {
        const int32_t *q = p + 8 * l;
        lane[l] = (q[0] + q[2]) + (q[4] + q[6]);
        lane[l + 4] = (q[1] + q[3]) + (q[5] + q[7]);
    }
}

/* . Q8_K activations: per block (d * dy) * sum((s - 32) * kvalues[q] * qy), in
 * lanes: lane l sums elements 4l..4l+3 of all 8 groups, each group's share
 * times its scale, so the result matches the AVX2 version bit for bit. */
static float vec_dot_iq4_xs(const void *row, const void *xq, int64_t nb) {
    const block_iq4_xs *x = row;
    const block_q8_K *y = xq;
    float acc[NLANE] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int32_t lane[NLANE] = {0};
        for (int g = 0; g < 8; g++) {
            const int32_t s = iq4_xs_scale(&x[i], g) - 32;
            int16_t w[32], a[32];
            int32_t part[NLANE];
            iq4_codes32(x[i].qs + 16 * g, w);
            interleave32(y[i].qs + 32 * g, a);
            iq4_lanes(w, a, part);
            for (int l = 0; l < NLANE; l++)
                lane[l] += s * part[l];
        }
        const float d = scale_to_float(x[i].d) * y[i].d;
        fma_lanes(acc, d, lane);
    }
    return sum_lanes(acc);
}

/* ---------------------------------------------------------------------------
 * Batched K-quant products: one weight row times a batch of Q8_K rows.
 *
 * For a batch of at least SQ_TILED_MIN_TOKENS tokens llama.cpp's CPU backend
 * multiplies Q2_K, Q3_K, Q5_K, Q6_K and IQ4_XS matrices with its tiled kernel,
 * which rounds differently from its vec_dot: per block it forms the exact
 * integer sums s1 = sum(sc * q * qy) (q the signed code) and s2 = sum(mn * bsum),
 * then r = d * s1, r = fma(-dmin, s2, r) and acc = fma(r, dy, acc), in block
 * order. Decoding a block once for the whole batch is also the cheaper order.
 * (Q4_K is left out: llama.cpp repacks it on AVX2, see vec_dot_q4_K.)
 * ------------------------------------------------------------------------- */

/* One block in integers: w the scaled signed codes in element order, mn the
 * mins per group of 16 (all 0 for the types without), d and dmin its scales. */
typedef struct {
    int16_t w[QK_K];
    int16_t mn[QK_K / 16];
    float d, dmin;
    int has_min;
} k_block_ints;

typedef void (*k_ints_fn)(const void *block, k_block_ints *k);
/* n_tokens activation rows xq_stride bytes apart times one weight row, into y[t * ldy]. */
typedef void (*batch_fn)(const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t nb,
                         float *y, int64_t ldy);

static void k_ints_q2_K(const void *block, k_block_ints *k) {
    const block_q2_K *b = block;
    int16_t sc[16];
    ints_q2_K(b, sc, k->mn);
    scaled_codes_q2_K(b, sc, k->w);
    k->d = scale_to_float(b->d);
    k->dmin = scale_to_float(b->dmin);
    k->has_min = 1;
}

static void k_ints_q3_K(const void *block, k_block_ints *k) {
    const block_q3_K *b = block;
    int16_t sc[16];
    scales_q3_K(b, sc);
    scaled_codes_q3_K(b, sc, k->w);
    memset(k->mn, 0, sizeof(k->mn));
    k->d = scale_to_float(b->d);
    k->dmin = 0.0f;
    k->has_min = 0;
}

static void k_ints_q5_K(const void *block, k_block_ints *k) {
    const block_q5_K *b = block;
    int16_t sc[8];
    for (int g = 0; g < 8; g++) {
        int s, m;
        k_scale_min(b->scales, g, &s, &m);
        sc[g] = (int16_t)s;
        k->mn[2 * g] = k->mn[2 * g + 1] = (int16_t)m; /* a group of 32 spans two bsums */
    }
    scaled_codes_q5_K(b, sc, k->w);
    k->d = scale_to_float(b->d);
    k->dmin = scale_to_float(b->dmin);
    k->has_min = 1;
}

static void k_ints_q6_K(const void *block, k_block_ints *k) {
    const block_q6_K *b = block;
    int16_t sc[16];
    for (int g = 0; g < 16; g++)
        sc[g] = b->scales[g];
    scaled_codes_q6_K(b, sc, 32, k->w);
    memset(k->mn, 0, sizeof(k->mn));
    k->d = scale_to_float(b->d);
    k->dmin = 0.0f;
    k->has_min = 0;
}

static void k_ints_iq4_xs(const void *block, k_block_ints *k) {
    const block_iq4_xs *b = block;
    for (int g = 0; g < 8; g++) {
        const int16_t s = (int16_t)(iq4_xs_scale(b, g) - 32);
        const uint8_t *q = b->qs + 16 * g;
        int16_t *o = k->w + 32 * g;
        for (int j = 0; j < 16; j++) {
            o[j] = (int16_t)(s * kvalues_iq4nl[q[j] & 0x0f]);
            o[j + 16] = (int16_t)(s * kvalues_iq4nl[q[j] >> 4]);
        }
    }
    memset(k->mn, 0, sizeof(k->mn));
    k->d = scale_to_float(b->d);
    k->dmin = 0.0f;
    k->has_min = 0;
}

/* Exact: |w| <= 4096 (Q6_K's 128 * 32) and |qy| <= 127, so 256 products stay below 2^27. */
SQ_TWIN int32_t dot_w_q8(const int16_t *restrict w, const int8_t *restrict q) {
    int32_t s = 0;
    for (int j = 0; j < QK_K; j++)
        s += w[j] * q[j];
    return s;
}

/* y[t * ldy] for t < n_tokens: the row of nb blocks times activation row t (Q8_K,
 * xq_stride bytes apart), in the order described above. The sums are exact
 * integers and fmaf rounds once everywhere, so every compilation of this body
 * gives the same bits: it is compiled twice, plain and for AVX2/FMA. */
SQ_TWIN void batch_dot_k_body(k_ints_fn ints, int block_bytes, const void *row, const void *xq,
                                    int64_t xq_stride, int n_tokens, int64_t nb, float *y, int64_t ldy) {
    for (int t = 0; t < n_tokens; t++)
        y[t * ldy] = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        k_block_ints k;
        ints((const uint8_t *)row + i * block_bytes, &k);
        for (int t = 0; t < n_tokens; t++) {
            const block_q8_K *a = (const block_q8_K *)((const uint8_t *)xq + t * xq_stride) + i;
            float r = k.d * (float)dot_w_q8(k.w, a->qs);
            if (k.has_min) {
                int32_t s2 = 0;
                for (int g = 0; g < QK_K / 16; g++)
                    s2 += k.mn[g] * a->bsums[g];
                r = fmaf(-k.dmin, (float)s2, r);
            }
            y[t * ldy] = fmaf(r, a->d, y[t * ldy]);
        }
    }
}

#ifdef SQ_HAVE_AVX2_KERNELS
__attribute__((target("avx2,fma")))
static void batch_dot_k_avx2(k_ints_fn ints, int block_bytes, const void *row, const void *xq, int64_t xq_stride,
                             int n_tokens, int64_t nb, float *y, int64_t ldy) {
    batch_dot_k_body(ints, block_bytes, row, xq, xq_stride, n_tokens, nb, y, ldy);
}
#endif

static void batch_dot_k(k_ints_fn ints, int block_bytes, const void *row, const void *xq, int64_t xq_stride,
                        int n_tokens, int64_t nb, float *y, int64_t ldy) {
#ifdef SQ_HAVE_AVX2_KERNELS
    if (sq_simd_enabled()) {
        batch_dot_k_avx2(ints, block_bytes, row, xq, xq_stride, n_tokens, nb, y, ldy);
        return;
    }
#endif
    batch_dot_k_body(ints, block_bytes, row, xq, xq_stride, n_tokens, nb, y, ldy);
}

/* ---------------------------------------------------------------------------
 * Dispatch
 * ------------------------------------------------------------------------- */

/* Row functions take a count of blocks (elements, for the 1-element types). */
typedef struct {
    int elems, bytes;
    void (*dequant)(const void *src, float *dst, int64_t nb);
    float (*dot)(const void *row, const float *x, int64_t nb);
    /* Weight types: the activation format and the dot product with a row of it. */
    int vec_type;
    float (*vec_dot)(const void *row, const void *xq, int64_t nb);
    /* Activation formats: the conversion from floats. */
    void (*quantize)(const float *x, void *dst, int64_t nb);
    /* Types with a batched order of their own (see batch_dot_k): their integer form. */
    k_ints_fn batch_ints;
    /* Q4_K: the rows of a batch llama.cpp's repacked kernel takes 4 at a time. */
    batch_fn batch_by4;
} type_traits;

#define TRAITS(name, QK) \
    .elems = QK, .bytes = (int)sizeof(block_##name), .dequant = dequant_##name, .dot = dot_##name
#define WEIGHT(name, vec) .vec_type = vec, .vec_dot = vec_dot_##name
static const type_traits traits[SQ_BF16 + 1] = {
    [SQ_F32] = { .elems = 1, .bytes = 4, .dequant = dequant_f32, .dot = dot_f32,
                 WEIGHT(f32, SQ_F32), .quantize = quant_f32 },
    [SQ_F16] = { .elems = 1, .bytes = 2, .dequant = dequant_f16, .dot = dot_f16,
                 WEIGHT(f16, SQ_F16), .quantize = quant_f16 },
    [SQ_BF16] = { .elems = 1, .bytes = 2, .dequant = dequant_bf16, .dot = dot_bf16,
                  WEIGHT(bf16, SQ_BF16), .quantize = quant_bf16 },
    [SQ_Q8_0] = { TRAITS(q8_0, QK8_0), WEIGHT(q8_0, SQ_Q8_0), .quantize = quant_q8_0 },
    [SQ_Q8_1] = { TRAITS(q8_1, QK8_1), .quantize = quant_q8_1 },
    [SQ_Q8_K] = { TRAITS(q8_K, QK_K), .quantize = quant_q8_K },
    [SQ_Q4_0] = { TRAITS(q4_0, QK4_0), WEIGHT(q4_0, SQ_Q8_0) },
    [SQ_Q4_1] = { TRAITS(q4_1, QK4_1), WEIGHT(q4_1, SQ_Q8_1) },
    [SQ_Q5_0] = { TRAITS(q5_0, QK5_0), WEIGHT(q5_0, SQ_Q8_0) },
    [SQ_Q5_1] = { TRAITS(q5_1, QK5_1), WEIGHT(q5_1, SQ_Q8_1) },
    [SQ_Q2_K] = { TRAITS(q2_K, QK_K), WEIGHT(q2_K, SQ_Q8_K), .batch_ints = k_ints_q2_K },
    [SQ_Q3_K] = { TRAITS(q3_K, QK_K), WEIGHT(q3_K, SQ_Q8_K), .batch_ints = k_ints_q3_K },
    [SQ_Q4_K] = { TRAITS(q4_K, QK_K), WEIGHT(q4_K, SQ_Q8_K), .batch_by4 = batch_dot_q4_K },
    [SQ_Q5_K] = { TRAITS(q5_K, QK_K), WEIGHT(q5_K, SQ_Q8_K), .batch_ints = k_ints_q5_K },
    [SQ_Q6_K] = { TRAITS(q6_K, QK_K), WEIGHT(q6_K, SQ_Q8_K), .batch_ints = k_ints_q6_K },
    [SQ_IQ4_NL] = { TRAITS(iq4_nl, QK4_NL), WEIGHT(iq4_nl, SQ_Q8_0) },
    [SQ_IQ4_XS] = { TRAITS(iq4_xs, QK_K), WEIGHT(iq4_xs, SQ_Q8_K), .batch_ints = k_ints_iq4_xs },
};
/* Every weight type's activations come in blocks of its own size, so one block
 * count serves both rows of a vec_dot. */
static_assert(QK4_0 == QK8_0 && QK5_0 == QK8_0 && QK4_NL == QK8_0, "Q8_0 pairs");
static_assert(QK4_1 == QK8_1 && QK5_1 == QK8_1, "Q8_1 pairs");

/* The traits of type, or NULL for an unknown type (holes in the table have elems 0). */
static const type_traits *lookup(int type) {
    if (type < 0 || type > SQ_BF16 || traits[type].elems == 0)
        return NULL;
    return &traits[type];
}

/* Blocks in n elements, or -1 unless n is a positive whole number of them. */
static int64_t whole_blocks(const type_traits *t, int64_t n) {
    if (!t || n <= 0 || n % t->elems != 0)
        return -1;
    return n / t->elems;
}

int sq_block_elems(int type) {
    const type_traits *t = lookup(type);
    return t ? t->elems : 0;
}

int sq_block_bytes(int type) {
    const type_traits *t = lookup(type);
    return t ? t->bytes : 0;
}

int sq_dequantize_row(int type, const void *src, float *dst, int64_t n) {
    const type_traits *t = lookup(type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0)
        return -1;
    t->dequant(src, dst, nb);
    return 0;
}

/* Also serves Q8_1 and Q8_K rows (their decoded values times x); their vec_dot
 * entries are empty, so sq_vec_dot_type gives -1 and sq_vec_dot NaN for them. */
float sq_dot_row(int type, const void *row, const float *x, int64_t n) {
    const type_traits *t = lookup(type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0)
        return NAN;
    return t->dot(row, x, nb);
}

int sq_vec_dot_type(int type) {
    const type_traits *t = lookup(type);
    return t && t->vec_dot ? t->vec_type : -1;
}

int sq_quantize_row(int vec_type, const float *x, void *dst, int64_t n) {
    const type_traits *t = lookup(vec_type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0 || !t->quantize)
        return -1;
    t->quantize(x, dst, nb);
    return 0;
}

/* ---------------------------------------------------------------------------
 * SIMD selection: the AVX2/FMA or AVX-512 VNNI (quants_avx2.c, quants_avx512vnni.c,
 * x86-64) or NEON (quants_neon.c, AArch64) versions of the vec_dot functions, taking
 * the place of the table's entries while enabled. The setting is made on first use
 * (CPU support, and SMOLQ_SIMD: "0" for scalar, "avx2" to keep to AVX2 on a VNNI
 * CPU) and then only changed by sq_set_simd; it is one atomic int, read relaxed on
 * every call.
 * ------------------------------------------------------------------------- */

typedef float (*vec_dot_fn)(const void *row, const void *xq, int64_t nb);

/* The setting: which copy of the vec_dots is in use. The batched products, attention
 * and the rest have one SIMD version, used at SIMD_BASE and SIMD_VNNI alike. */
enum { SIMD_OFF, SIMD_BASE, SIMD_VNNI, SIMD_LEVELS };

#if defined(SQ_HAVE_AVX2_KERNELS)
#define SIMD(fn) sq_##fn##_avx2
static const char *const simd_names[SIMD_LEVELS] = {"scalar", "avx2", "avx512vnni"};
#elif defined(SQ_HAVE_NEON_KERNELS)
#define SIMD(fn) sq_##fn##_neon
static const char *const simd_names[SIMD_LEVELS] = {"scalar", "neon", "neon"};
#endif

#ifdef SIMD
#define HAVE_SIMD 1
/* As vec_dot_fn, prefetching no further than stop (quants.h). */
typedef float (*simd_vec_dot_fn)(const void *row, const void *xq, int64_t nb, const void *stop);
#define VEC_DOTS(suffix) {                                                                \
    [SQ_Q4_0] = sq_vec_dot_q4_0_##suffix, [SQ_Q4_1] = sq_vec_dot_q4_1_##suffix,            \
    [SQ_Q5_0] = sq_vec_dot_q5_0_##suffix, [SQ_Q5_1] = sq_vec_dot_q5_1_##suffix,            \
    [SQ_Q8_0] = sq_vec_dot_q8_0_##suffix, [SQ_Q2_K] = sq_vec_dot_q2_K_##suffix,            \
    [SQ_Q3_K] = sq_vec_dot_q3_K_##suffix, [SQ_Q4_K] = sq_vec_dot_q4_K_##suffix,            \
    [SQ_Q5_K] = sq_vec_dot_q5_K_##suffix, [SQ_Q6_K] = sq_vec_dot_q6_K_##suffix,            \
    [SQ_IQ4_NL] = sq_vec_dot_iq4_nl_##suffix, [SQ_IQ4_XS] = sq_vec_dot_iq4_xs_##suffix,    \
}
/* By setting, then type: all NULL at SIMD_OFF. */
static const simd_vec_dot_fn simd_vec_dot[SIMD_LEVELS][SQ_BF16 + 1] = {
#if defined(SQ_HAVE_AVX2_KERNELS)
    [SIMD_BASE] = VEC_DOTS(avx2), [SIMD_VNNI] = VEC_DOTS(avx512vnni),
#else
    [SIMD_BASE] = VEC_DOTS(neon),
#endif
};

/* Whole batches (sq_vec_dot_batch): the same bits as the C code they stand for
 * (batch_dot_k for Q6_K, batch_dot_q4_K for Q4_K). */
static const batch_fn simd_batch[SQ_BF16 + 1] = {
    [SQ_Q4_K] = SIMD(batch_dot_q4_K), [SQ_Q6_K] = SIMD(batch_dot_q6_K),
};
#endif

#ifdef SQ_HAVE_AVX2_KERNELS
/* Four activation rows at a time, each with the one-row function's bits (sq_vec_dot_batch). */
typedef void (*vec_dot4_fn)(const void *row, const void *xq, int64_t stride, int64_t nb, float *out);
static const vec_dot4_fn simd_vec_dot4[SQ_BF16 + 1] = {
    [SQ_Q4_1] = sq_vec_dot4_q4_1_avx2,
};

/* The kernels also use F16C, which every AVX2 CPU has; checked all the same.
 * libgcc's (and compiler-rt's) checks include the OS saving the YMM registers
 * (and, for the AVX-512 features, the mask and ZMM state). */
static int simd_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

#ifdef SQ_VNNI_VIA_SIMDE
/* A test build: the VNNI copy takes its VNNI instructions from SIMDe and runs wherever
 * the AVX2 one does. */
static int vnni_supported(void) { return 1; }
#else
static int vnni_supported(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#endif
#elif defined(SQ_HAVE_NEON_KERNELS)
/* Advanced SIMD is a mandatory part of AArch64. */
static int simd_supported(void) { return 1; }
static int vnni_supported(void) { return 0; }
#else
static int simd_supported(void) { return 0; }
static int vnni_supported(void) { return 0; }
#endif

/* The best copy this CPU runs, no further than AVX2 if SMOLQ_SIMD says "avx2". */
static int simd_best(void) {
    if (!simd_supported())
        return SIMD_OFF;
    const char *env = getenv("SMOLQ_SIMD");
    if (vnni_supported() && !(env && strcmp(env, "avx2") == 0))
        return SIMD_VNNI;
    return SIMD_BASE;
}

static atomic_int simd_state = -1; /* -1 until first use, then SIMD_OFF, SIMD_BASE or SIMD_VNNI */

static int simd_level(void) {
    int s = atomic_load_explicit(&simd_state, memory_order_relaxed);
    if (s >= 0)
        return s;
    const char *env = getenv("SMOLQ_SIMD");
    int want = env && strcmp(env, "0") == 0 ? SIMD_OFF : simd_best();
    /* Racing first uses compute the same value; an sq_set_simd in between wins. */
    int expected = -1;
    if (!atomic_compare_exchange_strong(&simd_state, &expected, want))
        return expected;
    return want;
}

int sq_simd_enabled(void) { return simd_level() != SIMD_OFF; }

const char *sq_simd_name(void) {
#ifdef HAVE_SIMD
    return simd_names[simd_level()];
#else
    return "scalar";
#endif
}

int sq_set_simd(int enabled) {
    simd_level(); /* settle the first-use choice, so it cannot overwrite this one */
    return atomic_exchange(&simd_state, enabled != 0 ? simd_best() : SIMD_OFF) != SIMD_OFF;
}

float sq_vec_dot(int type, const void *row, const void *xq, int64_t n) {
    const type_traits *t = lookup(type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot)
        return NAN;
#ifdef HAVE_SIMD
    const simd_vec_dot_fn simd = simd_vec_dot[simd_level()][type];
    if (simd)
        return simd(row, xq, nb, (const uint8_t *)row + nb * t->bytes);
#endif
    return t->vec_dot(row, xq, nb);
}

int sq_vec_dot_batch(int type, const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t n,
                     float *y, int64_t ldy) {
    const type_traits *t = lookup(type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_tokens < 0)
        return -1;
    batch_fn simd = NULL;
#ifdef HAVE_SIMD
    if (simd_batch[type] && sq_simd_enabled())
        simd = simd_batch[type];
#endif
    if (t->batch_ints && n_tokens >= SQ_TILED_MIN_TOKENS) {
        if (simd)
            simd(row, xq, xq_stride, n_tokens, nb, y, ldy);
        else
            batch_dot_k(t->batch_ints, t->bytes, row, xq, xq_stride, n_tokens, nb, y, ldy);
        return 0;
    }
    int by4 = t->batch_by4 ? n_tokens - n_tokens % 4 : 0;
    if (by4)
        (simd ? simd : t->batch_by4)(row, xq, xq_stride, by4, nb, y, ldy);
    int i = by4;
#ifdef SQ_HAVE_AVX2_KERNELS
    if (simd_vec_dot4[type] && sq_simd_enabled()) {
        for (float out[4]; i + 4 <= n_tokens; i += 4) {
            simd_vec_dot4[type](row, (const uint8_t *)xq + i * xq_stride, xq_stride, nb, out);
            for (int j = 0; j < 4; j++)
                y[(i + j) * ldy] = out[j];
        }
    }
#endif
    for (; i < n_tokens; i++)
        y[i * ldy] = sq_vec_dot(type, row, (const uint8_t *)xq + i * xq_stride, n);
    return 0;
}

int sq_vec_dot_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq, int64_t n,
                    float *y) {
    const type_traits *t = lookup(type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_rows < 0)
        return -1;
    /* The function is chosen once for all rows. (Several rows per pass over xq, tried for
     * Q4_1, Q8_0 (4 rows) and Q4_K (8 rows side by side), made decode slower.) */
    const uint8_t *base = rows;
#ifdef HAVE_SIMD
    const simd_vec_dot_fn one = simd_vec_dot[simd_level()][type];
    if (one && n_rows > 0) {
        const uint8_t *stop = base + (n_rows - 1) * row_bytes + nb * t->bytes; /* the last row's end */
        for (int64_t r = 0; r < n_rows; r++)
            y[r] = one(base + r * row_bytes, xq, nb, stop);
        return 0;
    }
#endif
    for (int64_t r = 0; r < n_rows; r++)
        y[r] = t->vec_dot(base + r * row_bytes, xq, nb);
    return 0;
}

int sq_vec_dot_batch_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq,
                          int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy) {
    const type_traits *t = lookup(type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_rows < 0 || n_tokens < 0)
        return -1;
    const uint8_t *base = rows;
    int64_t r = 0;
#ifdef SQ_HAVE_AVX2_KERNELS
    /* (x86-64 only: elsewhere every row takes the loop below, with the same bits.)
     * Q6_K in the tiled order (every token, from SQ_TILED_MIN_TOKENS on): eight rows at a time. */
    if (type == SQ_Q6_K && n_tokens >= SQ_TILED_MIN_TOKENS && sq_simd_enabled())
        for (; r + 8 <= n_rows; r += 8)
            sq_batch_dot8_q6_K_avx2(base + r * row_bytes, row_bytes, xq, xq_stride, n_tokens, nb, y + r, ldy);
    /* Q4_K: the repacked gemm's tokens (all but n_tokens % 4) eight rows at a time; the
     * rest of those rows' tokens as sq_vec_dot_batch would do them. */
    const int by4 = n_tokens - n_tokens % 4;
    if (type == SQ_Q4_K && by4 && sq_simd_enabled()) {
        for (; r + 8 <= n_rows; r += 8) {
            sq_batch_dot8_q4_K_avx2(base + r * row_bytes, row_bytes, xq, xq_stride, by4, nb, y + r, ldy);
            for (int k = by4; k < n_tokens; k++)
                for (int j = 0; j < 8; j++)
                    y[k * ldy + r + j] = sq_vec_dot(type, base + (r + j) * row_bytes,
                                                    (const uint8_t *)xq + k * xq_stride, n);
        }
    }
#endif
    for (; r < n_rows; r++)
        sq_vec_dot_batch(type, base + r * row_bytes, xq, xq_stride, n_tokens, n, y + r, ldy);
    return 0;
}
