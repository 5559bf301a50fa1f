/* quants.c: GGUF block layouts, row decoders and row dot products.
 *
 * Every quantized type gets one section: the block layout, a one-block decoder,
 * then the row decoder and row dot product built from it (ROW_FUNCS below).
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
 */
#include <assert.h>
#include <stddef.h>
#include <string.h>
#include <math.h>

#include "smolq.h"
#include "quants.h"

#define QK_K 256 /* elements per super-block of the K and IQ4_XS types */

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

/* ---------------------------------------------------------------------------
 * Q4_0: 32 elements, y = d * (q - 8), q a 4-bit code.
 * Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
 * ------------------------------------------------------------------------- */

#define QK4_0 32
typedef struct {
    uint16_t d;              /* f16 scale */
    uint8_t qs[QK4_0 / 2];   /* nibbles */
} block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

static inline void decode_q4_0(const block_q4_0 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int j = 0; j < QK4_0 / 2; j++) {
        y[j] = d * (float)((b->qs[j] & 0x0f) - 8);
        y[j + QK4_0 / 2] = d * (float)((b->qs[j] >> 4) - 8);
    }
}
ROW_FUNCS(q4_0, QK4_0)

/* ---------------------------------------------------------------------------
 * Q4_1: 32 elements, y = d * q + m, q a 4-bit code; nibble order as Q4_0.
 * ------------------------------------------------------------------------- */

#define QK4_1 32
typedef struct {
    uint16_t d;              /* f16 scale */
    uint16_t m;              /* f16 offset (the block minimum) */
    uint8_t qs[QK4_1 / 2];   /* nibbles */
} block_q4_1;
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");

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

/* ---------------------------------------------------------------------------
 * Q5_0: 32 elements, y = d * (q - 16), q a 5-bit code. The low 4 bits are laid
 * out as in Q4_0; bit 4 of element j is bit j of the 32-bit little-endian qh.
 * ------------------------------------------------------------------------- */

#define QK5_0 32
typedef struct {
    uint16_t d;              /* f16 scale */
    uint8_t qh[4];           /* bit 4 of every element */
    uint8_t qs[QK5_0 / 2];   /* low nibbles */
} block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

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

/* ---------------------------------------------------------------------------
 * Q5_1: 32 elements, y = d * q + m, q a 5-bit code laid out as in Q5_0.
 * ------------------------------------------------------------------------- */

#define QK5_1 32
typedef struct {
    uint16_t d;              /* f16 scale */
    uint16_t m;              /* f16 offset */
    uint8_t qh[4];           /* bit 4 of every element */
    uint8_t qs[QK5_1 / 2];   /* low nibbles */
} block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

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

/* ---------------------------------------------------------------------------
 * Q8_0: 32 elements, y = d * q, q a signed byte.
 * ------------------------------------------------------------------------- */

#define QK8_0 32
typedef struct {
    uint16_t d;              /* f16 scale */
    int8_t qs[QK8_0];
} block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

static inline void decode_q8_0(const block_q8_0 *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int j = 0; j < QK8_0; j++)
        y[j] = d * (float)b->qs[j];
}
ROW_FUNCS(q8_0, QK8_0)

/* ---------------------------------------------------------------------------
 * Q2_K: 256 elements in 16 groups of 16; y = (d * sc) * q - (dmin * mn),
 * q a 2-bit code, sc and mn the low and high nibble of the group's scale byte.
 * Each 128-element half reads 32 bytes of qs, taking bits 0-1 for its first 32
 * elements, bits 2-3 for the next 32, and so on.
 * ------------------------------------------------------------------------- */

typedef struct {
    uint8_t scales[QK_K / 16]; /* per group: scale (low nibble), min (high nibble) */
    uint8_t qs[QK_K / 4];      /* 2-bit codes */
    uint16_t d;                /* f16 super-scale for the scales */
    uint16_t dmin;             /* f16 super-scale for the mins */
} block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

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

/* ---------------------------------------------------------------------------
 * Q3_K: 256 elements in 16 groups of 16; y = (d * (sc - 32)) * q with
 * q = low2 - (hbit ? 0 : 4) in -4..3. The 2-bit codes are laid out as in Q2_K.
 * hbit of element e is bit e / 32 of hmask[e % 32]. The 6-bit scales sc are
 * packed in 12 bytes: group i < 8 takes its low 4 bits from the low nibble of
 * scales[i], group i >= 8 from the high nibble of scales[i - 8]; its high 2 bits
 * are bits 2*(i/4)..+1 of scales[8 + i % 4].
 * ------------------------------------------------------------------------- */

typedef struct {
    uint8_t hmask[QK_K / 8];   /* high bit of every element (set means no -4) */
    uint8_t qs[QK_K / 4];      /* low 2 bits */
    uint8_t scales[12];        /* 16 6-bit scales, packed as above */
    uint16_t d;                /* f16 super-scale */
} block_q3_K;
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");

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

typedef struct {
    uint16_t d;                /* f16 super-scale for the scales */
    uint16_t dmin;             /* f16 super-scale for the mins */
    uint8_t scales[12];        /* 8 6-bit (scale, min) pairs, see k_scale_min */
    uint8_t qs[QK_K / 2];      /* 4-bit codes */
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

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

/* ---------------------------------------------------------------------------
 * Q5_K: Q4_K plus a fifth bit: bit 4 of element l of group g is bit g of qh[l].
 * ------------------------------------------------------------------------- */

typedef struct {
    uint16_t d;                /* f16 super-scale for the scales */
    uint16_t dmin;             /* f16 super-scale for the mins */
    uint8_t scales[12];        /* 8 6-bit (scale, min) pairs, see k_scale_min */
    uint8_t qh[QK_K / 8];      /* bit 4 of every element */
    uint8_t qs[QK_K / 2];      /* low 4 bits */
} block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

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

/* ---------------------------------------------------------------------------
 * Q6_K: 256 elements in 16 groups of 16; y = (d * sc) * (q - 32), q a 6-bit
 * code, sc a signed byte. Within each 128-element half h, element k takes its
 * low 4 bits from ql[64h + k % 64] (low nibble if k < 64, else high) and its
 * top 2 bits from bits 2*(k/32)..+1 of qh[32h + k % 32].
 * ------------------------------------------------------------------------- */

typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits */
    uint8_t qh[QK_K / 4];      /* high 2 bits */
    int8_t scales[QK_K / 16];  /* signed group scales */
    uint16_t d;                /* f16 super-scale */
} block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

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

/* ---------------------------------------------------------------------------
 * IQ4_NL: 32 elements, y = d * kvalues[q], q a 4-bit index into a fixed
 * non-linear grid (denser near zero, where weights cluster); nibble order as Q4_0.
 * ------------------------------------------------------------------------- */

static const int8_t kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

#define QK4_NL 32
typedef struct {
    uint16_t d;                /* f16 scale */
    uint8_t qs[QK4_NL / 2];    /* grid indices */
} block_iq4_nl;
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");

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

/* ---------------------------------------------------------------------------
 * IQ4_XS: 256 elements in 8 groups of 32, each group an IQ4_NL block whose
 * scale is d * (s - 32), s a 6-bit code: low 4 bits in nibble g % 2 of
 * scales_l[g / 2], high 2 bits at bits 2g..2g+1 of scales_h.
 * ------------------------------------------------------------------------- */

typedef struct {
    uint16_t d;                /* f16 super-scale */
    uint16_t scales_h;         /* high 2 bits of the 8 group scales */
    uint8_t scales_l[QK_K / 64]; /* low 4 bits of the group scales */
    uint8_t qs[QK_K / 2];      /* grid indices */
} block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");

static inline void decode_iq4_xs(const block_iq4_xs *restrict b, float *restrict y) {
    const float d = half_to_float(b->d);
    for (int g = 0; g < 8; g++) {
        const int s = ((b->scales_l[g / 2] >> (4 * (g % 2))) & 0x0f) | ((b->scales_h >> (2 * g)) & 3) << 4;
        iq4_decode32(b->qs + 16 * g, d * (float)(s - 32), y + 32 * g);
    }
}
ROW_FUNCS(iq4_xs, QK_K)

/* ---------------------------------------------------------------------------
 * Dispatch
 * ------------------------------------------------------------------------- */

/* Row functions take a count of blocks (elements, for the 1-element types). */
typedef struct {
    int elems, bytes;
    void (*dequant)(const void *src, float *dst, int64_t nb);
    float (*dot)(const void *row, const float *x, int64_t nb);
} type_traits;

#define TRAITS(name, QK) { QK, (int)sizeof(block_##name), dequant_##name, dot_##name }
static const type_traits traits[SQ_BF16 + 1] = {
    [SQ_F32] = { 1, 4, dequant_f32, dot_f32 },
    [SQ_F16] = { 1, 2, dequant_f16, dot_f16 },
    [SQ_BF16] = { 1, 2, dequant_bf16, dot_bf16 },
    [SQ_Q4_0] = TRAITS(q4_0, QK4_0),
    [SQ_Q4_1] = TRAITS(q4_1, QK4_1),
    [SQ_Q5_0] = TRAITS(q5_0, QK5_0),
    [SQ_Q5_1] = TRAITS(q5_1, QK5_1),
    [SQ_Q8_0] = TRAITS(q8_0, QK8_0),
    [SQ_Q2_K] = TRAITS(q2_K, QK_K),
    [SQ_Q3_K] = TRAITS(q3_K, QK_K),
    [SQ_Q4_K] = TRAITS(q4_K, QK_K),
    [SQ_Q5_K] = TRAITS(q5_K, QK_K),
    [SQ_Q6_K] = TRAITS(q6_K, QK_K),
    [SQ_IQ4_NL] = TRAITS(iq4_nl, QK4_NL),
    [SQ_IQ4_XS] = TRAITS(iq4_xs, QK_K),
};

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

float sq_dot_row(int type, const void *row, const float *x, int64_t n) {
    const type_traits *t = lookup(type);
    int64_t nb = whole_blocks(t, n);
    if (nb < 0)
        return NAN;
    return t->dot(row, x, nb);
}
