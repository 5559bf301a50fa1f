/* quants/blocks.h: the GGUF block layouts of the quantized types, and the IQ4 grid, in
 * one place for the scalar code (quants/scalar.c, whose section for each type explains
 * its encoding), the batched orders, the x86 kernels and the NEON kernels.
 *
 * Fields are little-endian, as GGUF stores them; "f16" is an IEEE half kept as its
 * 16 bits. None of the structs has padding (the size asserts check it), so an array
 * of them is exactly a row as the file holds it.
 */
#ifndef SMOLQ_QUANTS_BLOCKS_H
#define SMOLQ_QUANTS_BLOCKS_H

#include <assert.h>
#include <stdint.h>

/* C11's <assert.h> defines static_assert; not every Windows SDK's does so for C. */
#ifndef static_assert
#define static_assert _Static_assert
#endif

/* Elements per block: QK_K for the K-quants, IQ4_XS and Q8_K, 32 for the rest. */
#ifndef QK_K
#define QK_K 256
#endif
static_assert(QK_K == 256, "QK_K must be 256");
#define QK8_0 32
#define QK8_1 32
#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK4_NL 32

/* Activation formats (Q8_0 is also a weight type). */

/* Q8_0: f16 scale d, then 32 signed byte codes. */
typedef struct { uint16_t d; int8_t qs[QK8_0]; } block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* A row of Q8_0 activations as the mat-vecs take it (sq_quantize_activations) holds, after
 * its nb blocks, from this byte on, each block's offset: -128 times the sum of its codes,
 * an int32. The 512-bit kernels multiply the weights' codes as unsigned bytes, code + 128;
 * the offset takes the 128s' share back off a block's products, found once per token here
 * rather than once per sixteen rows in the kernels. */
static inline int64_t sq_q8_0_offsets_at(int64_t nb) { return (nb * (int64_t)sizeof(block_q8_0) + 3) / 4 * 4; }

/* After the offsets, each block's d as a float (the f16 value, exactly). */
static inline int64_t sq_q8_0_scales_at(int64_t nb) { return sq_q8_0_offsets_at(nb) + 4 * nb; }

/* Q8_1: f16 scale d, f16 s = d * sum(qs) (from d before its rounding), 32 signed byte codes. */
typedef struct { uint16_t d, s; int8_t qs[QK8_1]; } block_q8_1;
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");

/* A row of Q8_1 activations as the mat-vecs take it holds, after its nb blocks, from this
 * byte on, each block's d and s as two floats (the f16 values, exactly). */
static inline int64_t sq_q8_1_scales_at(int64_t nb) { return nb * (int64_t)sizeof(block_q8_1); }

/* Q8_K: float scale d, 256 codes in -127..127, bsums[g] the sum of codes 16g..16g+15. */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* A row of Q8_K activations as the mat-vecs take it (sq_quantize_activations) holds, after
 * its nb blocks, from this byte on, each block's eight sums of 32 codes (bsums 2g and 2g +
 * 1 added), as int16. The packed kernels of the types with a min or an offset per group of
 * 32 (Q4_K, Q5_K, IQ4_XS) take two groups' with one multiply (vpdpwssd, vpmaddwd), where
 * two bsums took one per group. */
static inline int64_t sq_q8_K_sums32_at(int64_t nb) { return nb * (int64_t)sizeof(block_q8_K); }

/* Weight types of 32 elements. */

/* Q4_0: f16 scale d, 32 4-bit codes (element j in the low nibble of qs[j], j + 16 in its high). */
typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

/* Q4_1: f16 scale d and offset m (the block minimum), 32 4-bit codes in Q4_0's order. */
typedef struct { uint16_t d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");

/* Q5_0: f16 scale d, bit 4 of element j at bit j of qh, the low 4 bits in Q4_0's order. */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

/* Q5_1: f16 scale d and offset m, then qh and qs as in Q5_0. */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

/* The IQ4 grid: the 16 values an IQ4_NL or IQ4_XS code indexes, non-linear (denser
 * near zero, where weights cluster). A list, so that it can fill a byte vector as well
 * as an array; SQ_IQ4_VALUE(i) is value i as a constant expression, for tables built
 * by the compiler. */
#define SQ_IQ4_GRID -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
#define SQ_IQ4_VALUE(i) SQ_IQ4_NTH((i), SQ_IQ4_GRID)
#define SQ_IQ4_NTH(i, ...) SQ_IQ4_PICK(i, __VA_ARGS__)
#define SQ_IQ4_PICK(i, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15)    \
    ((i) == 0 ? (v0) : (i) == 1 ? (v1) : (i) == 2 ? (v2) : (i) == 3 ? (v3) : (i) == 4 ? (v4) :   \
     (i) == 5 ? (v5) : (i) == 6 ? (v6) : (i) == 7 ? (v7) : (i) == 8 ? (v8) : (i) == 9 ? (v9) :   \
     (i) == 10 ? (v10) : (i) == 11 ? (v11) : (i) == 12 ? (v12) : (i) == 13 ? (v13) :            \
     (i) == 14 ? (v14) : (v15))

/* IQ4_NL: f16 scale d, 32 4-bit indices into the IQ4 grid, in Q4_0's order. */
typedef struct { uint16_t d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");

/* Weight types of QK_K elements. */

/* Q2_K: per group of 16 a byte of scale (low nibble) and min (high), 2-bit codes, f16 d and dmin. */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

/* Q3_K: the codes' high bits (hmask) and low 2 bits (qs), 16 6-bit scales in 12 bytes, f16 d. */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; } block_q3_K;
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");

/* Group g's scale, sc - 32, from the 12 packed bytes (the packing: scalar.c's Q3_K section). */
static inline int sq_q3_K_scale(const uint8_t *scales, int g) {
    const int lo4 = (scales[g % 8] >> (4 * (g / 8))) & 0x0f;
    const int hi2 = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo4 | hi2 << 4) - 32;
}

/* Q4_K: f16 d (for the scales) and dmin (for the mins), 8 6-bit scale/min pairs in 12 bytes, codes. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

/* Group j's 6-bit scale and min, of Q4_K and Q5_K alike, from the 12 packed bytes s
 * (the packing: scalar.c's section on scale/min pairs). */
static inline void sq_k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Q5_K: Q4_K's fields, with bit 4 of every code in qh ahead of the low 4 bits in qs. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

/* Q6_K: the codes' low 4 bits (ql) and high 2 bits (qh), 16 signed group scales, f16 d. */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

/* IQ4_XS: f16 d, 8 6-bit group scales (high 2 bits in scales_h, low 4 in scales_l), grid indices. */
typedef struct { uint16_t d, scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");

/* Group g's 6-bit scale code s (its scale is d * (s - 32); scalar.c's IQ4_XS section). */
static inline int sq_iq4_xs_scale(const block_iq4_xs *b, int g) {
    return ((b->scales_l[g / 2] >> (4 * (g % 2))) & 0x0f) | ((b->scales_h >> (2 * g)) & 3) << 4;
}

#endif
