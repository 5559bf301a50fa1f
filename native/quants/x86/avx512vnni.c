/* quants/x86/avx512vnni.c: for CPUs with AVX-512 VNNI, VL and BW, the vec_dot kernels
 * of x86/vec_dots.h (sq_vec_dot_<type>_avx512vnni) and the step-order kernels of
 * x86/step_order.h; a prefill's Q4_K and Q6_K products sixteen rows at a time in 512-bit
 * registers (sq_batch_dot16_*_avx512vnni), and a lookup draft's check of Q4_K, Q4_1, Q8_0
 * and Q6_K rows the same way (sq_steps_dot16_*_avx512vnni).
 *
 * The vec_dots and x86/step_order.h's kernels keep to 256-bit registers and give the AVX2
 * copy's bits; vpdpbusd and vpdpwssd each stand for two integer instructions of the AVX2
 * copy. The sixteen-row kernels give the eight-row kernels' bits (x86/avx2.c's batched
 * orders, x86/step_order.h's step order) for each of their rows, and the Q6_K check the
 * one-token vec_dot's: the integer sums are exact, however they are formed, and the float
 * steps are the same, lane by lane.
 *
 * Built with SQ_VNNI_VIA_SIMDE (cffi_build/build_kernel.py, SMOLQ_VNNI_VIA_SIMDE), the
 * VNNI instructions, and the 512-bit ones, come from SIMDe, and the file runs on any AVX2
 * CPU: that is how the tests check it on machines without AVX-512.
 */
#include "simd.h"

#ifdef SQ_X86

#define SQ_X86_VNNI 1
#include "quants/x86/vec_dots.h"
#include "quants/x86/side_by_side.h"
#include "quants/x86/step_order.h"
#include "simd512.h"

/* Rows 0..7 from lo's lanes, rows 8..15 from hi's. */
static inline TARGET v16i join_i(__m256i lo, __m256i hi) {
    return V16(inserti64x4)(V16(castsi256_si512)(AS256I(lo)), AS256I(hi), 1);
}
static inline TARGET v16f join_f(__m256 lo, __m256 hi) {
    return V16(castsi512_ps)(join_i(_mm256_castps_si256(lo), _mm256_castps_si256(hi)));
}

/* Rows r (low half) and r + 8 (high half) of q in, word j of those sixteen rows out:
 * q[j] lane l holds word j of row l. sq_transpose8's steps in each half at once, the
 * last one taking 128-bit quarters from two registers (vpermt2q). */
static inline TARGET void transpose8_halves(v16i q[8]) {
    v16i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = V16(unpacklo_epi32)(q[i], q[i + 1]);
        t[i + 1] = V16(unpackhi_epi32)(q[i], q[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = V16(unpacklo_epi64)(t[i], t[i + 2]);
        u[i + 1] = V16(unpackhi_epi64)(t[i], t[i + 2]);
        u[i + 2] = V16(unpacklo_epi64)(t[i + 1], t[i + 3]);
        u[i + 3] = V16(unpackhi_epi64)(t[i + 1], t[i + 3]);
    }
    const v16i first = V16(setr_epi64)(0, 1, 8, 9, 4, 5, 12, 13), second = V16(setr_epi64)(2, 3, 10, 11, 6, 7, 14, 15);
    for (int i = 0; i < 4; i++) {
        q[i] = V16(permutex2var_epi64)(u[i], first, u[i + 4]);
        q[i + 4] = V16(permutex2var_epi64)(u[i], second, u[i + 4]);
    }
}

/* Block i's share of the sixteen rows after the sixteen at rows, asked of memory up to
 * stop while these are read (prefetch_next_rows for each eight). */
static inline __attribute__((always_inline)) TARGET void prefetch_next16(const void *rows, int64_t row_bytes, int64_t i, int64_t nb, const void *stop) {
    const uint8_t *next = (const uint8_t *)rows + 16 * row_bytes;
    const int64_t share = 8 * row_bytes / (nb > 0 ? nb : 1);
    prefetch_next_rows(next, i, share, stop);
    prefetch_next_rows(next + 8 * row_bytes, i, share, stop);
}

/* A 32-bit word of activation codes in every lane. */
static inline TARGET v16i word16(const int8_t *p) {
    int32_t w;
    memcpy(&w, p, 4);
    return V16(set1_epi32)(w);
}

/* acc + vpdpbusd(code, the 32-bit word at p in every lane). gcc keeps the broadcast
 * a load of its own before each vpdpbusd; taken as the instruction's {1to16} operand it
 * is one fused micro-op where it was two. */
static inline __attribute__((always_inline)) TARGET v16i dpbusd_word(v16i acc, v16i code, const int8_t *p) {
#ifdef SQ_VNNI_VIA_SIMDE
    return V16(dpbusd_epi32)(acc, code, word16(p));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(code), "m"(*(const int32_t *)p));
    return acc;
#endif
}

/* acc + vpdpwssd(x, the two neighbouring int16 at p in every lane): the same fused
 * {1to16} operand as dpbusd_word. */
static inline __attribute__((always_inline)) TARGET v16i dpwssd_pair(v16i acc, v16i x, const int16_t *p) {
#ifdef SQ_VNNI_VIA_SIMDE
    return V16(dpwssd_epi32)(acc, x, word16((const int8_t *)p));
#else
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*(const int32_t *)p));
    return acc;
#endif
}

/* The 16 bytes at p + r * row_bytes for sixteen rows r, side by side: w[j] lane r holds
 * bytes 4j..4j+3 of row r's (z[k]'s 128-bit quarter q holds row 4q + k's 16; then a
 * 4 x 4 transpose of words in each quarter). */
static inline TARGET void words16_side_by_side(const uint8_t *p, int64_t row_bytes, v16i w[4]) {
    v16i z[4];
    for (int k = 0; k < 4; k++) {
        const uint8_t *row = p + k * row_bytes;
        z[k] = V16(castsi128_si512)(AS128I(_mm_loadu_si128((const __m128i *)row)));
        z[k] = V16(inserti32x4)(z[k], AS128I(_mm_loadu_si128((const __m128i *)(row + 4 * row_bytes))), 1);
        z[k] = V16(inserti32x4)(z[k], AS128I(_mm_loadu_si128((const __m128i *)(row + 8 * row_bytes))), 2);
        z[k] = V16(inserti32x4)(z[k], AS128I(_mm_loadu_si128((const __m128i *)(row + 12 * row_bytes))), 3);
    }
    const v16i t0 = V16(unpacklo_epi32)(z[0], z[1]), t1 = V16(unpackhi_epi32)(z[0], z[1]);
    const v16i t2 = V16(unpacklo_epi32)(z[2], z[3]), t3 = V16(unpackhi_epi32)(z[2], z[3]);
    w[0] = V16(unpacklo_epi64)(t0, t2);
    w[1] = V16(unpackhi_epi64)(t0, t2);
    w[2] = V16(unpacklo_epi64)(t1, t3);
    w[3] = V16(unpackhi_epi64)(t1, t3);
}

/* The 32 bytes at p + r * row_bytes for sixteen rows r, side by side: q[j] lane r holds
 * bytes 4j..4j+3 of row r's. */
static inline TARGET void bytes32_side_by_side(const uint8_t *p, int64_t row_bytes, v16i q[8]) {
    for (int r = 0; r < 8; r++)
        q[r] = join_i(_mm256_loadu_si256((const __m256i *)(p + r * row_bytes)),
                      _mm256_loadu_si256((const __m256i *)(p + (r + 8) * row_bytes)));
    transpose8_halves(q);
}

/* ---------------------------------------------------------------------------
 * Q4_K: sixteen rows side by side
 * ------------------------------------------------------------------------- */

/* The headers (d, dmin, and the twelve bytes of 6-bit scales and mins) of block i of
 * sixteen Q4_K rows side by side, the scales and mins unpacked as k_scales_mins does one
 * row's: scale[g] lane r holds row r's scale of group g in its low 16 bits and zero above,
 * so that vpdpwssd by it multiplies an int16 sum by the scale; min2[g] holds row r's min of
 * group g in both 16-bit halves, so that vpdpwssd by it multiplies the sum of two bsums;
 * d and dmin each row's. */
static inline __attribute__((always_inline)) TARGET void q4_K_headers16(const uint8_t *rows, int64_t row_bytes,
                                                                       int64_t i, const int packed, v16i scale[8],
                                                                       v16i min2[8], v16f *d, v16f *dmin) {
    v16i w[4];  /* w[j] lane r: header word j of row r (from a packed group: w[1..3], the d and dmin apart) */
    const uint8_t *run = rows + i * 16 * (int64_t)sizeof(block_q4_K);
    if (packed)
        for (int j = 1; j < 4; j++)
            w[j] = V16(loadu_si512)(run + 64 * j);
    else
        words16_side_by_side(rows + i * (int64_t)sizeof(block_q4_K), row_bytes, w);
    /* Byte g of each lane: scales and mins of groups g (low) and 4 + g (high). */
    const v16i m6 = V16(set1_epi32)(0x3f3f3f3f), m4 = V16(set1_epi32)(0x0f0f0f0f), top2 = V16(set1_epi32)(0x30303030);
    const v16i sc_low = V16(and_si512)(w[1], m6), mn_low = V16(and_si512)(w[2], m6);
    const v16i sc_high = V16(or_si512)(V16(and_si512)(w[3], m4), V16(and_si512)(V16(srli_epi32)(w[1], 2), top2));
    const v16i mn_high = V16(or_si512)(V16(and_si512)(V16(srli_epi32)(w[3], 4), m4),
                                       V16(and_si512)(V16(srli_epi32)(w[2], 2), top2));
    const v16i byte0 = V16(set1_epi32)(0xff);
    for (int g = 0; g < 4; g++) {
        scale[g] = V16(and_si512)(V16(srli_epi32)(sc_low, 8 * g), byte0);
        scale[g + 4] = V16(and_si512)(V16(srli_epi32)(sc_high, 8 * g), byte0);
        /* byte g of each lane into bytes 0 and 2 */
        const v16i dup = V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(g, -1, g, -1, 4 + g, -1, 4 + g, -1, 8 + g, -1, 8 + g, -1,
                                                                   12 + g, -1, 12 + g, -1)));
        min2[g] = V16(shuffle_epi8)(mn_low, dup);
        min2[g + 4] = V16(shuffle_epi8)(mn_high, dup);
    }
    if (packed) {
        *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
        *dmin = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)(run + 32))));
        return;
    }
    /* The f16 d (low half of w[0]) and dmin (high half), sixteen of each. */
    const v16i halves = V16(permutexvar_epi64)(
        V16(setr_epi64)(0, 2, 4, 6, 1, 3, 5, 7),
        V16(packus_epi32)(V16(and_si512)(w[0], V16(set1_epi32)(0xffff)), V16(srli_epi32)(w[0], 16)));
    *d = V16(cvtph_ps)(V16(castsi512_si256)(halves));
    *dmin = V16(cvtph_ps)(V16(extracti64x4_epi64)(halves, 1));
}

/* Span c (elements 64c .. 64c + 63) of block i of sixteen Q4_K rows side by side:
 * code[h][j] lane r holds elements 64c + 32h + 4j .. +3 of row r. */
static inline __attribute__((always_inline)) TARGET void q4_K_codes16(const uint8_t *rows, int64_t row_bytes,
                                                                     int64_t i, int c, const int packed,
                                                                     v16i code[2][8]) {
    const v16i m4 = V16(set1_epi8)(0x0f);
    v16i q[8];
    if (packed)  /* words 3 + 8c + j of the group's run: after the scales' three */
        for (int j = 0; j < 8; j++)
            q[j] = V16(loadu_si512)(rows + i * 16 * (int64_t)sizeof(block_q4_K) + 64 * (4 + 8 * c + j));
    else
        bytes32_side_by_side(((const block_q4_K *)rows + i)->qs + 32 * c, row_bytes, q);
    for (int j = 0; j < 8; j++) {
        code[0][j] = V16(and_si512)(q[j], m4);
        code[1][j] = V16(and_si512)(V16(srli_epi16)(q[j], 4), m4);
    }
}

/* Span c of one token's activation block (aq: its 64 codes) against sixteen rows' codes
 * (q4_K_codes16): isum plus, for each row, the scale of group 2c times the group's 32
 * products, and the same for group 2c + 1. A group's products are summed in two halves of
 * 16 (alternate words), |.| <= 16 * 15 * 128 < 2^15, so that vpdpwssd by the scale word
 * (zero in its high half) multiplies each half exactly: no vpmulld. */
static inline __attribute__((always_inline)) TARGET v16i q4_K_span16(const int8_t *aq, const v16i code[2][8],
                                                                     v16i sc_low, v16i sc_high, v16i isum) {
    for (int h = 0; h < 2; h++) {
        v16i even = V16(setzero_si512)(), odd = V16(setzero_si512)();
        for (int j = 0; j < 8; j += 2) {
            even = dpbusd_word(even, code[h][j], aq + 32 * h + 4 * j);
            odd = dpbusd_word(odd, code[h][j + 1], aq + 32 * h + 4 * j + 4);
        }
        const v16i sc = h ? sc_high : sc_low;
        isum = V16(dpwssd_epi32)(V16(dpwssd_epi32)(isum, even, sc), odd, sc);
    }
    return isum;
}

/* Sixteen Q4_K rows (row_bytes apart) times n_tokens activation rows, each row with
 * sq_batch_dot8_q4_K_avx2's bits, in the same order: per block and span c (groups 2c
 * and 2c + 1), one exact integer sum of scale times products, fma'd by the row's d times
 * the token's into its chain, and one of mins times bsums into the other. A span's codes
 * are put side by side sixteen rows at once (q4_K_codes16), its scales and mins by the
 * eight-row steps, and its sixteen registers of codes stay in registers while every
 * token of the tile goes by. vpdpbusd forms a group's products in eight instructions,
 * where the AVX2 kernel takes sixteen for half the rows (maddubs and the int16 adds
 * after). y[t * ldy + r] for r < 16; the next sixteen rows' bytes are asked of memory up
 * to stop. */
static inline __attribute__((always_inline)) TARGET void batch_dot16_q4_K(
    const uint8_t *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens, int64_t nb, const void *stop,
    float *y, int64_t ldy, const int packed) {
    enum { TILE = 64 };
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        v16f sumf[TILE], summ[TILE], d[TILE], dmin[TILE];
        for (int t = 0; t < nt; t++)
            sumf[t] = summ[t] = V16(setzero_ps)();
        for (int64_t i = 0; i < nb; i++) {
            if (t0 == 0 && packed)  /* one stream: ahead of this run, as decode's vec_dots ask */
                prefetch_ahead(rows + i * 16 * (int64_t)sizeof(block_q4_K), 16 * (int)sizeof(block_q4_K), stop);
            else if (t0 == 0)
                prefetch_next16(rows, row_bytes, i, nb, stop);
            v16i scale[8], min2[8];
            v16f d_rows, dmin_rows;
            q4_K_headers16(rows, row_bytes, i, packed, scale, min2, &d_rows, &dmin_rows);
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                if (i + 1 < nb)
                    prefetch_block_q8_K(a + 1);  /* this token's next block: wanted a tile from now */
                d[t] = V16(mul_ps)(d_rows, V16(set1_ps)(a->d));
                dmin[t] = V16(mul_ps)(dmin_rows, V16(set1_ps)(a->d));
            }
            for (int c = 0; c < 4; c++) {
                v16i code[2][8];
                q4_K_codes16(rows, row_bytes, i, c, packed, code);
                for (int t = 0; t < nt; t++) {
                    const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                    const v16i isum = q4_K_span16(a->qs + 64 * c, code, scale[2 * c], scale[2 * c + 1], V16(setzero_si512)());
                    const v16i imin = dpwssd_pair(dpwssd_pair(V16(setzero_si512)(), min2[2 * c], a->bsums + 4 * c),
                                                  min2[2 * c + 1], a->bsums + 4 * c + 2);
                    sumf[t] = V16(fmadd_ps)(V16(cvtepi32_ps)(isum), d[t], sumf[t]);
                    summ[t] = V16(fmadd_ps)(V16(cvtepi32_ps)(imin), dmin[t], summ[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, V16(sub_ps)(sumf[t], summ[t]));
    }
}

TARGET void sq_batch_dot16_q4_K_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                           int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    batch_dot16_q4_K(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 0);
}

TARGET void sq_packed_batch16_q4_K_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                              int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    batch_dot16_q4_K(group, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 1);
}

/* Sixteen Q4_K rows (row_bytes apart) times n_tokens activation rows, each output with
 * the one-token vec_dot's bits for its row and token (the step order of
 * KERNEL(steps_dot8_q4_K), x86/step_order.h): per block one exact integer total of scale
 * times products and one of mins times bsums, each fma'd by the row's d (dmin) times the
 * token's into its chain. The spans are put side by side as sq_batch_dot16_q4_K_avx512vnni
 * puts them, a span's sixteen registers of codes kept while the tile's tokens go by; the
 * headers sixteen rows at once (q4_K_headers16). Each token's code total waits in isum for
 * the block's last span; its min total is taken at the block's end, a group at a time,
 * from the bsums as they lie in memory. A lookup draft's check runs its Q4_K rows here.
 * y[t * ldy + r] for r < 16.
 * The next sixteen rows' bytes are asked of memory up to stop a piece per span, in their
 * order in memory: asked a block's worth at a time (as prefetch_next16 does), rows of
 * 2,048 columns streamed from memory no faster than the eight-row kernel's, where in cache
 * they ran 30% faster; spread out, the 3B shape's Q4_K rows at 8 tokens took 190 ms where
 * they took 250 (one thread). */
static inline __attribute__((always_inline)) TARGET void steps_dot16_q4_K(
    const uint8_t *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens, int64_t nb, const void *stop,
    float *y, int64_t ldy, const int packed) {
    enum { TILE = 16 };
    const uint8_t *next16 = rows + 16 * row_bytes;
    const int64_t piece = 16 * row_bytes / (nb > 0 ? 4 * nb : 1);
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        v16f sumf[TILE], summ[TILE];
        v16i isum[TILE];
        for (int t = 0; t < nt; t++)
            sumf[t] = summ[t] = V16(setzero_ps)();
        for (int64_t i = 0; i < nb; i++) {
            v16i scale[8], min2[8];
            v16f d_rows, dmin_rows;
            q4_K_headers16(rows, row_bytes, i, packed, scale, min2, &d_rows, &dmin_rows);
            for (int c = 0; c < 4; c++) {
                v16i code[2][8];
                q4_K_codes16(rows, row_bytes, i, c, packed, code);
                if (t0 == 0 && packed)  /* one stream: ahead of a quarter of the run per span */
                    prefetch_ahead(rows + i * 16 * (int64_t)sizeof(block_q4_K) + c * 4 * (int64_t)sizeof(block_q4_K),
                                   4 * (int)sizeof(block_q4_K), stop);
                else if (t0 == 0)
                    prefetch_next_rows(next16, 4 * i + c, piece, stop);
                for (int t = 0; t < nt; t++) {
                    const int8_t *aq = token_block(xq, stride, t0 + t, i)->qs + 64 * c;
                    isum[t] = q4_K_span16(aq, code, scale[2 * c], scale[2 * c + 1], c ? isum[t] : V16(setzero_si512)());
                }
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                v16i imin = V16(setzero_si512)();
                for (int g = 0; g < 8; g++)
                    imin = dpwssd_pair(imin, min2[g], a->bsums + 2 * g);
                const v16f a_d = V16(set1_ps)(a->d);
                sumf[t] = V16(fmadd_ps)(V16(cvtepi32_ps)(isum[t]), V16(mul_ps)(d_rows, a_d), sumf[t]);
                summ[t] = V16(fmadd_ps)(V16(cvtepi32_ps)(imin), V16(mul_ps)(dmin_rows, a_d), summ[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, V16(sub_ps)(sumf[t], summ[t]));
    }
}

TARGET void sq_steps_dot16_q4_K_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                           int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    steps_dot16_q4_K(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 0);
}

TARGET void sq_packed_dot16_q4_K_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                            int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    steps_dot16_q4_K(group, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 1);
}

/* ---------------------------------------------------------------------------
 * Q4_1 and Q8_0 draft checks: sixteen rows side by side
 * ------------------------------------------------------------------------- */

/* An integer sum started at EXACT_FLOAT_BIAS (the bits of the float 1.5 * 2^23) has the
 * bits of the float 1.5 * 2^23 + sum while |sum| < 2^22; subtracting 1.5 * 2^23 then gives
 * the sum exactly, as vcvtdq2ps would. A Q4_1 lane's sum is four products, at most
 * 4 * 15 * 128 in size, and the subtraction issues on two ports where the conversion has
 * one: the Q4_1 check kernel below ran 2-3% faster with it. (The Q8_0 one, whose start
 * differs per lane, ran slower.) */
#define EXACT_FLOAT_BIAS 0x4B400000
static inline TARGET v16f biased_to_float(v16i biased) {
    return V16(sub_ps)(V16(castsi512_ps)(biased), V16(set1_ps)(12582912.0f));
}

/* lane_sums8 (x86/step_order.h) for sixteen rows: the eight lane registers summed in
 * sq_hsum8_avx2's order, each row's sum in its lane. */
static inline TARGET v16f lane_sums16(const v16f A[8]) {
    return V16(add_ps)(V16(add_ps)(V16(add_ps)(A[0], A[4]), V16(add_ps)(A[2], A[6])),
                       V16(add_ps)(V16(add_ps)(A[1], A[5]), V16(add_ps)(A[3], A[7])));
}

/* Block i of sixteen Q4_1 rows, the lanes of q4_1_side_by_side for all sixteen: from the
 * file's layout (rows row_bytes apart), or from a group packed side by side
 * (quants/rows16.c), where each register's bytes are one load. */
static inline __attribute__((always_inline)) TARGET void q4_1_block16(const uint8_t *rows, int64_t row_bytes,
                                                                    int64_t i, const int packed, v16i codes[8],
                                                                    v16f *d_rows, v16f *m_rows) {
    if (!packed) {
        __m256i lo[8], hi[8];
        __m256 d_half[2], m_half[2];
        q4_1_side_by_side(rows, row_bytes, i, lo, &d_half[0], &m_half[0]);
        q4_1_side_by_side(rows + 8 * row_bytes, row_bytes, i, hi, &d_half[1], &m_half[1]);
        for (int l = 0; l < 8; l++)
            codes[l] = join_i(lo[l], hi[l]);
        *d_rows = join_f(d_half[0], d_half[1]);
        *m_rows = join_f(m_half[0], m_half[1]);
        return;
    }
    const uint8_t *run = rows + i * 16 * (int64_t)sizeof(block_q4_1);
    const v16i m4 = V16(set1_epi8)(0x0f);
    *d_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    *m_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)(run + 32))));
    for (int j = 0; j < 4; j++) {
        const v16i word = V16(loadu_si512)(run + 64 + 64 * j);
        codes[j] = V16(and_si512)(word, m4);                             /* low nibbles: lane j */
        codes[j + 4] = V16(and_si512)(V16(srli_epi16)(word, 4), m4);  /* high: lane j + 4 */
    }
}

/* Sixteen Q4_1 rows (row_bytes apart, or a packed group) times n_tokens activation rows,
 * each output with the one-token vec_dot's bits: KERNEL(steps_dot8_q4_1) of
 * x86/step_order.h with rows 0..7 and 8..15 joined in one register, so that each
 * instruction of a token's steps does sixteen rows. y[t * ldy + r] for r < 16; the next
 * sixteen rows' bytes are asked of memory up to stop. */
static inline __attribute__((always_inline)) TARGET void steps_dot16_q4_1(
    const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens, int64_t nb, const void *stop,
    float *y, int64_t ldy, const int packed, const int CHUNK) {
    enum { TILE = 16 };
    v16i codes[32][8];  /* CHUNK (1 or 32) blocks side by side */
    v16f d_rows[32], m_rows[32];
    v16f acc_tokens[TILE][9];  /* a token's 8 lane registers, then its sum of m * s */
    const uint8_t *next = (const uint8_t *)rows + 16 * row_bytes;
    const int64_t share = 16 * (int64_t)sizeof(block_q4_1);  /* of the next rows, per block */
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        for (int t = 0; t < nt; t++)
            for (int l = 0; l < 9; l++)
                acc_tokens[t][l] = V16(setzero_ps)();
        for (int64_t i0 = 0; i0 < nb; i0 += CHUNK) {
            const int nc = nb - i0 < CHUNK ? (int)(nb - i0) : CHUNK;
            for (int k = 0; k < nc; k++) {
                if (t0 == 0 && packed)  /* one stream: ahead of this run, as decode's vec_dots ask */
                    prefetch_ahead((const uint8_t *)rows + (i0 + k) * share, (int)share, stop);
                else if (t0 == 0)
                    prefetch_next_rows(next, i0 + k, share, stop);
                q4_1_block16(rows, row_bytes, i0 + k, packed, codes[k], &d_rows[k], &m_rows[k]);
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_1 *a = (const block_q8_1 *)((const uint8_t *)xq + (t0 + t) * stride) + i0;
                v16f acc[8], summs = acc_tokens[t][8];
                for (int l = 0; l < 8; l++)
                    acc[l] = acc_tokens[t][l];
                for (int k = 0; k < nc; k++) {
                    const __m128 ds = h2f_pair(&a[k].d);  /* the token's d, s */
                    const v16f d = V16(mul_ps)(d_rows[k], V16(set1_ps)(_mm_cvtss_f32(ds)));
                    summs = V16(add_ps)(summs, V16(mul_ps)(m_rows[k], V16(set1_ps)(_mm_cvtss_f32(_mm_movehdup_ps(ds)))));
                    for (int l = 0; l < 8; l++) {
                        const v16i p = dpbusd_word(V16(set1_epi32)(EXACT_FLOAT_BIAS), codes[k][l], a[k].qs + 4 * l);
                        acc[l] = V16(fmadd_ps)(d, biased_to_float(p), acc[l]);
                    }
                }
                for (int l = 0; l < 8; l++)
                    acc_tokens[t][l] = acc[l];
                acc_tokens[t][8] = summs;
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, V16(add_ps)(lane_sums16(acc_tokens[t]), acc_tokens[t][8]));
    }
}

TARGET void sq_steps_dot16_q4_1_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                           int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    steps_dot16_q4_1(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 0, 32);
}

TARGET void sq_packed_dot16_q4_1_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                            int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    if (n_tokens == 1)  /* decode: a block's codes straight from the loads to the products */
        steps_dot16_q4_1(group, row_bytes, xq, stride, 1, nb, stop, y, ldy, 1, 1);
    else
        steps_dot16_q4_1(group, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 1, 32);
}

/* Block i of sixteen Q8_0 rows, as q8_0_side_by_side gives them (codes offset to
 * unsigned) for all sixteen: from the file's layout or a packed group. */
static inline __attribute__((always_inline)) TARGET void q8_0_block16(const uint8_t *rows, int64_t row_bytes,
                                                                    int64_t i, const int packed, v16i codes[8],
                                                                    v16f *d_rows) {
    if (!packed) {
        __m256i lo[8], hi[8];
        __m256 d_half[2];
        q8_0_side_by_side(rows, row_bytes, i, lo, &d_half[0]);
        q8_0_side_by_side(rows + 8 * row_bytes, row_bytes, i, hi, &d_half[1]);
        for (int l = 0; l < 8; l++)
            codes[l] = join_i(lo[l], hi[l]);
        *d_rows = join_f(d_half[0], d_half[1]);
        return;
    }
    const uint8_t *run = rows + i * 16 * (int64_t)sizeof(block_q8_0);
    *d_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    for (int l = 0; l < 8; l++)
        codes[l] = V16(xor_si512)(V16(loadu_si512)(run + 32 + 64 * l), V16(set1_epi8)((char)0x80));
}

/* Sixteen Q8_0 rows (or a packed group), as KERNEL(steps_dot8_q8_0) of x86/step_order.h
 * does eight: codes offset to unsigned, each lane's sum started at -128 times its four
 * activations' sum. */
static inline __attribute__((always_inline)) TARGET void steps_dot16_q8_0(
    const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens, int64_t nb, const void *stop,
    float *y, int64_t ldy, const int packed, const int CHUNK) {
    enum { TILE = 16 };
    v16i codes[32][8];  /* CHUNK (1 or 32) blocks side by side */
    v16f d_rows[32];
    v16f acc_tokens[TILE][8];  /* a token's 8 lane registers */
    const uint8_t *next = (const uint8_t *)rows + 16 * row_bytes;
    const int64_t share = 16 * (int64_t)sizeof(block_q8_0);  /* of the next rows, per block */
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        for (int t = 0; t < nt; t++)
            for (int l = 0; l < 8; l++)
                acc_tokens[t][l] = V16(setzero_ps)();
        for (int64_t i0 = 0; i0 < nb; i0 += CHUNK) {
            const int nc = nb - i0 < CHUNK ? (int)(nb - i0) : CHUNK;
            for (int k = 0; k < nc; k++) {
                if (t0 == 0 && packed)  /* one stream: ahead of this run, as decode's vec_dots ask */
                    prefetch_ahead((const uint8_t *)rows + (i0 + k) * share, (int)share, stop);
                else if (t0 == 0)
                    prefetch_next_rows(next, i0 + k, share, stop);
                q8_0_block16(rows, row_bytes, i0 + k, packed, codes[k], &d_rows[k]);
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_0 *a = (const block_q8_0 *)((const uint8_t *)xq + (t0 + t) * stride) + i0;
                v16f acc[8];
                for (int l = 0; l < 8; l++)
                    acc[l] = acc_tokens[t][l];
                for (int k = 0; k < nc; k++) {
                    const v16f d = V16(mul_ps)(d_rows[k], V16(set1_ps)(h2f(a[k].d)));
                    int32_t start[8];
                    q8_0_starts(a[k].qs, start);
                    for (int l = 0; l < 8; l++) {
                        const v16i p = dpbusd_word(V16(set1_epi32)(start[l]), codes[k][l], a[k].qs + 4 * l);
                        acc[l] = V16(fmadd_ps)(d, V16(cvtepi32_ps)(p), acc[l]);
                    }
                }
                for (int l = 0; l < 8; l++)
                    acc_tokens[t][l] = acc[l];
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, lane_sums16(acc_tokens[t]));
    }
}

TARGET void sq_steps_dot16_q8_0_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                           int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    steps_dot16_q8_0(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 0, 32);
}

TARGET void sq_packed_dot16_q8_0_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                            int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    if (n_tokens == 1)  /* decode: a block's codes straight from the loads to the products */
        steps_dot16_q8_0(group, row_bytes, xq, stride, 1, nb, stop, y, ldy, 1, 1);
    else
        steps_dot16_q8_0(group, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 1, 32);
}

/* ---------------------------------------------------------------------------
 * Q6_K draft checks: sixteen rows side by side
 * ------------------------------------------------------------------------- */

/* Words w0..w0+7 of a packed Q6_K run (quants/rows16.c: the sixteen d, then word j of
 * the sixteen rows at 32 + 64j): ql's are words 0-31, qh's 32-47, the scales' 48-51. */
static inline TARGET void q6_K_words16(const uint8_t *run, int w0, v16i q[8]) {
    for (int j = 0; j < 8; j++)
        q[j] = V16(loadu_si512)(run + 32 + 64 * (w0 + j));
}

static inline TARGET void q6_K_scale_words16(const uint8_t *run, v16i w[4]) {
    for (int j = 0; j < 4; j++)
        w[j] = V16(loadu_si512)(run + 32 + 64 * (48 + j));
}

/* Block i of sixteen Q6_K rows side by side, in the lanes of sq_vec_dot_q6_K_avx2: code[8k + m]
 * lane r holds row r's 6-bit codes 32k + 4m .. +3 (k = 4h + c: register q[c] of half h in
 * that kernel), scale2[g] its scale of group g in both 16-bit halves, off[m] its scales of
 * groups 2m and 2m + 1 times -32 (the offset's lane m, taken from the bsums), d its d. The
 * low nibbles and the high bits are put side by side as they lie, then assembled into
 * codes sixteen rows at once. */
static inline __attribute__((always_inline)) TARGET void q6_K_block16(const uint8_t *rows, int64_t row_bytes,
                                                                     int64_t i, const int packed, v16i code[64],
                                                                     v16i scale2[16], v16i off[8], v16f *d) {
    const block_q6_K *x = (const block_q6_K *)rows + i;
    const uint8_t *run = rows + i * 16 * (int64_t)sizeof(block_q6_K);  /* packed: d, then the words */
    const v16i m4 = V16(set1_epi8)(0x0f), top2 = V16(set1_epi8)(0x30);
    for (int h = 0; h < 2; h++) {
        v16i l0[8], l1[8], hb[8];
        if (packed) {
            q6_K_words16(run, 16 * h, l0);      /* ql bytes 64h .. */
            q6_K_words16(run, 16 * h + 8, l1);  /* ql bytes 64h + 32 .. */
            q6_K_words16(run, 32 + 8 * h, hb);  /* qh bytes 32h .. */
        } else {
            bytes32_side_by_side(x->ql + 64 * h, row_bytes, l0);
            bytes32_side_by_side(x->ql + 64 * h + 32, row_bytes, l1);
            bytes32_side_by_side(x->qh + 32 * h, row_bytes, hb);
        }
        v16i *q = code + 32 * h;
        for (int m = 0; m < 8; m++) {
            /* (low nibble & 0x0f) | high bits already at bits 4-5: ternary-logic 0xea is (a & b) | c */
            q[m] = V16(ternarylogic_epi32)(l0[m], m4, V16(and_si512)(V16(slli_epi32)(hb[m], 4), top2), 0xea);
            q[8 + m] = V16(ternarylogic_epi32)(l1[m], m4, V16(and_si512)(V16(slli_epi32)(hb[m], 2), top2), 0xea);
            q[16 + m] = V16(ternarylogic_epi32)(V16(srli_epi32)(l0[m], 4), m4, V16(and_si512)(hb[m], top2), 0xea);
            q[24 + m] = V16(ternarylogic_epi32)(V16(srli_epi32)(l1[m], 4), m4,
                                                V16(and_si512)(V16(srli_epi32)(hb[m], 2), top2), 0xea);
        }
    }
    v16i w[4];  /* w[j] lane r: scales 4j..4j+3 of row r */
    if (packed)
        q6_K_scale_words16(run, w);
    else
        words16_side_by_side((const uint8_t *)x->scales, row_bytes, w);
    for (int b = 0; b < 4; b++) {
        /* byte b of each lane into bytes 1 and 3, then each 16-bit half shifted down with its sign */
        const v16i twice = V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(-1, b, -1, b, -1, 4 + b, -1, 4 + b, -1, 8 + b, -1,
                                                                     8 + b, -1, 12 + b, -1, 12 + b)));
        for (int j = 0; j < 4; j++)
            scale2[4 * j + b] = V16(srai_epi16)(V16(shuffle_epi8)(w[j], twice), 8);
    }
    for (int p = 0; p < 2; p++) {
        /* bytes 2p and 2p + 1 of each lane into bytes 1 and 3: groups 4j + 2p and 4j + 2p + 1 */
        const v16i pair = V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(-1, 2 * p, -1, 2 * p + 1, -1, 4 + 2 * p, -1, 5 + 2 * p,
                                                                    -1, 8 + 2 * p, -1, 9 + 2 * p, -1, 12 + 2 * p, -1,
                                                                    13 + 2 * p)));
        for (int j = 0; j < 4; j++)
            off[2 * j + p] = V16(mullo_epi16)(V16(srai_epi16)(V16(shuffle_epi8)(w[j], pair), 8), V16(set1_epi16)(-32));
    }
    if (packed) {
        *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
        return;
    }
    uint16_t dh[16];
    for (int r = 0; r < 16; r++)
        dh[r] = ((const block_q6_K *)(rows + r * row_bytes) + i)->d;
    *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)dh)));
}

/* Block k of a chunk side by side (q6_K_block16) against block k of n (1 or 2) tokens'
 * activations a[u] + k: each token's eight lanes fma'd into acc[u]. Two tokens share each
 * load of the codes and scales. The next rows' lines are asked for as the chunks go by. */
static inline __attribute__((always_inline)) TARGET void q6_K_block_tokens16(
    const int n, const v16i code[64], const v16i scale2[16], const v16i off[8], v16f d_rows,
    const block_q8_K *const a[2], int k, v16f acc[][8], const uint8_t **ahead, int lines_per_slot, const void *stop) {
    v16i lane[2][8];
    for (int u = 0; u < n; u++)
        for (int m = 0; m < 8; m++)
            lane[u][m] = dpwssd_pair(V16(setzero_si512)(), off[m], a[u][k].bsums + 2 * m);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        for (int p = 0; p < n * lines_per_slot; p++, *ahead += 64)
            if ((uintptr_t)*ahead < (uintptr_t)stop)
                _mm_prefetch((const char *)*ahead, PREFETCH_INTO);
        for (int m = 0; m < 8; m++) {
            const v16i c = code[8 * j + m], sc = scale2[2 * j + m / 4];
            for (int u = 0; u < n; u++)
                lane[u][m] = V16(dpwssd_epi32)(lane[u][m], V16(maddubs_epi16)(c, word16(a[u][k].qs + 32 * j + 4 * m)), sc);
        }
    }
    for (int u = 0; u < n; u++) {
        const v16f d = V16(mul_ps)(V16(set1_ps)(a[u][k].d), d_rows);
        for (int m = 0; m < 8; m++)
            acc[u][m] = V16(fmadd_ps)(d, V16(cvtepi32_ps)(lane[u][m]), acc[u][m]);
    }
}

/* Sixteen Q6_K rows (row_bytes apart) times n_tokens activation rows, each output with the
 * one-token vec_dot's bits for its row and token: sq_vec_dot_q6_K_avx2's eight int32 lanes
 * per row, each register here one lane of sixteen rows. A lane's sum is exact however it
 * is formed: per block the offset (vpdpwssd of the scale pairs times -32 by a pair of
 * bsums), then per four codes of a row vpmaddubsw and vpdpwssd by the group's scale, as
 * that kernel pairs them; then the lane is fma'd by d times the token's d, lane by lane,
 * and the lanes summed in sq_hsum8's order at the end. CHUNK blocks are put side by side
 * at a time (q6_K_block16), then the tokens go through them two by two
 * (q6_K_block_tokens16). In 512-bit registers the multiplies of sixteen rows issue on two
 * ports (measured here), as the 256-bit ones of eight do; before, a check decoded each
 * Q6_K row once per token (dotn). y[t * ldy + r] for r < 16; the next sixteen rows' bytes
 * are asked of memory up to stop a line or so at a time as the first tile's tokens go by
 * (asked a block at a time, the requests stalled the kernel). */
static inline __attribute__((always_inline)) TARGET void steps_dot16_q6_K(
    const uint8_t *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens, int64_t nb, const void *stop,
    float *y, int64_t ldy, const int packed, const int CHUNK) {
    enum { TILE = 16 };
    v16i code[4][64], scale2[4][16], off[4][8];  /* CHUNK (1 or 4) blocks side by side */
    v16f d_rows[4];
    v16f acc_tokens[TILE][8];  /* a token's 8 lane registers */
    /* The file's layout: the next sixteen rows, as this group's are read. Packed, one
     * stream: PREFETCH_AHEAD bytes ahead of the reads, as decode's vec_dots ask, and a
     * check a chunk further, since it reads a chunk's blocks at once and only then lets
     * the tokens go through them (from PREFETCH_AHEAD alone most of a chunk was asked for
     * as it was read: one thread, 8 tokens, rows of 2,048 columns from memory, 7.2 GB/s,
     * a chunk ahead 8.7, two 8.4). */
    const int64_t lead = packed ? PREFETCH_AHEAD + (CHUNK > 1 ? CHUNK * 16 * (int64_t)sizeof(block_q6_K) : 0) : 16 * row_bytes;
    const uint8_t *ahead = rows + lead;
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        /* The next rows' lines, asked for a few at a time: lines_per_slot per block, token
         * and chunk of 32 codes of the first tile. */
        const int64_t slots = nb * nt * 8, lines = (16 * row_bytes + 63) / 64;
        const int lines_per_slot = t0 == 0 && slots > 0 ? (int)((lines + slots - 1) / slots) : 0;
        for (int t = 0; t < nt; t++)
            for (int m = 0; m < 8; m++)
                acc_tokens[t][m] = V16(setzero_ps)();
        for (int64_t i0 = 0; i0 < nb; i0 += CHUNK) {
            const int nc = nb - i0 < CHUNK ? (int)(nb - i0) : CHUNK;
            for (int k = 0; k < nc; k++)
                q6_K_block16(rows, row_bytes, i0 + k, packed, code[k], scale2[k], off[k], &d_rows[k]);
            for (int t = 0; t < nt; t += 2) {
                const block_q8_K *a[2] = {token_block(xq, stride, t0 + t, i0),
                                          token_block(xq, stride, t0 + (t + 1 < nt ? t + 1 : t), i0)};
                for (int k = 0; k < nc; k++) {
                    if (t + 1 < nt)
                        q6_K_block_tokens16(2, code[k], scale2[k], off[k], d_rows[k], a, k, acc_tokens + t, &ahead,
                                            lines_per_slot, stop);
                    else
                        q6_K_block_tokens16(1, code[k], scale2[k], off[k], d_rows[k], a, k, acc_tokens + t, &ahead,
                                            lines_per_slot, stop);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, lane_sums16(acc_tokens[t]));
    }
}

TARGET void sq_steps_dot16_q6_K_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                           int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    steps_dot16_q6_K(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 0, 4);
}

TARGET void sq_packed_dot16_q6_K_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                            int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    if (n_tokens == 1)  /* decode: each block's codes straight from the loads to the products */
        steps_dot16_q6_K(group, row_bytes, xq, stride, 1, nb, stop, y, ldy, 1, 1);
    else
        steps_dot16_q6_K(group, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 1, 4);
}

/* ---------------------------------------------------------------------------
 * Q6_K: sixteen rows side by side
 * ------------------------------------------------------------------------- */

/* Sixteen Q6_K rows (row_bytes apart) times n_tokens activation rows, each row with
 * sq_batch_dot8_q6_K_avx2's bits, in the same order: per block the exact sum s1 =
 * sum(scale * code * a) - 32 * sum(scale * bsums), then y = fma(d * s1, a->d, y). The
 * chunks of 32 codes are put side by side by the eight-row steps, rows 0..7 and 8..15
 * joined in one register, and a chunk's eight registers stay in registers while every
 * token of the tile goes by; a 16-element group's products (|.| <= 16 * 63 * 128) are
 * summed by vpdpbusd, then multiplied by its scale. y[t * ldy + r] for r < 16; the next
 * sixteen rows' bytes are asked of memory up to stop. */
/* Chunk k (codes 32k .. 32k + 31) of block i of a packed group of sixteen Q6_K rows, as
 * q6_K_side_by_side gives eight: code[j] lane r holds row r's codes 32k + 4j .. +3. */
static inline TARGET void q6_K_packed_chunk16(const uint8_t *run, int k, v16i code[8]) {
    const v16i m4 = V16(set1_epi8)(0x0f), m2 = V16(set1_epi8)(3);
    const int h = k / 4, part = k % 4;  /* codes 128h + 32 part .. */
    v16i l[8], hb[8];
    q6_K_words16(run, 16 * h + 8 * (part & 1), l);
    q6_K_words16(run, 32 + 8 * h, hb);
    for (int j = 0; j < 8; j++) {
        const v16i low = V16(and_si512)(part < 2 ? l[j] : V16(srli_epi16)(l[j], 4), m4);
        const v16i high = V16(and_si512)(V16(srli_epi16)(hb[j], 2 * part), m2);
        code[j] = V16(or_si512)(low, V16(slli_epi16)(high, 4));
    }
}

static inline __attribute__((always_inline)) TARGET void batch_dot16_q6_K(
    const uint8_t *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens, int64_t nb, const void *stop,
    float *y, int64_t ldy, const int packed) {
    enum { TILE = 64 };
    const uint8_t *upper = rows + 8 * row_bytes;  /* rows 8..15 */
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        v16f sum[TILE];
        v16i acc[TILE];
        for (int t = 0; t < nt; t++)
            sum[t] = V16(setzero_ps)();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *run = rows + i * 16 * (int64_t)sizeof(block_q6_K);  /* packed */
            if (t0 == 0 && packed)  /* one stream: ahead of this run, as decode's vec_dots ask */
                prefetch_ahead(run, 16 * (int)sizeof(block_q6_K), stop);
            else if (t0 == 0)
                prefetch_next16(rows, row_bytes, i, nb, stop);
            /* Per group its scale, per pair of groups (scale 2p, scale 2p+1) as int16, per row d. */
            int32_t sc_lanes[16][16], pair_lanes[8][16];
            float dr[16];
            if (packed) {
                v16i w[4];  /* w[j] lane r: scales 4j..4j+3 of row r */
                q6_K_scale_words16(run, w);
                for (int g = 0; g < 16; g++)  /* byte g % 4, with its sign */
                    V16(storeu_si512)(sc_lanes[g], V16(srai_epi32)(V16(slli_epi32)(w[g / 4], 24 - 8 * (g % 4)), 24));
                for (int p = 0; p < 8; p++) {
                    /* bytes b and b + 1 of each lane into bytes 1 and 3, shifted down with their signs */
                    const int b = 2 * (p % 2);
                    const v16i pair = V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(-1, b, -1, b + 1, -1, 4 + b, -1, 5 + b, -1, 8 + b,
                                                                                -1, 9 + b, -1, 12 + b, -1, 13 + b)));
                    V16(storeu_si512)(pair_lanes[p], V16(srai_epi16)(V16(shuffle_epi8)(w[p / 2], pair), 8));
                }
                V16(storeu_ps)(dr, V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run))));
            } else {
                for (int r = 0; r < 16; r++) {
                    const block_q6_K *x = (const block_q6_K *)(rows + r * row_bytes) + i;
                    for (int g = 0; g < 16; g++)
                        sc_lanes[g][r] = x->scales[g];
                    for (int p = 0; p < 8; p++)
                        pair_lanes[p][r] = (int32_t)((uint16_t)x->scales[2 * p] | (uint32_t)(uint16_t)x->scales[2 * p + 1] << 16);
                    dr[r] = h2f(x->d);
                }
            }
            const v16f d_rows = V16(loadu_ps)(dr);
            for (int t = 0; t < nt; t++)
                acc[t] = V16(setzero_si512)();
            for (int k = 0; k < 8; k++) {
                v16i code[8];
                if (packed) {
                    q6_K_packed_chunk16(run, k, code);
                } else {
                    __m256i lo[8], hi[8];
                    q6_K_side_by_side(rows, row_bytes, i, k, lo);
                    q6_K_side_by_side(upper, row_bytes, i, k, hi);
                    for (int j = 0; j < 8; j++)
                        code[j] = join_i(lo[j], hi[j]);
                }
                const v16i sc0 = V16(loadu_si512)(sc_lanes[2 * k]), sc1 = V16(loadu_si512)(sc_lanes[2 * k + 1]);
                for (int t = 0; t < nt; t++) {
                    const int8_t *aq = token_block(xq, stride, t0 + t, i)->qs + 32 * k;
                    v16i g0 = V16(setzero_si512)(), g1 = V16(setzero_si512)();
                    for (int j = 0; j < 4; j++) {
                        g0 = dpbusd_word(g0, code[j], aq + 4 * j);
                        g1 = dpbusd_word(g1, code[j + 4], aq + 16 + 4 * j);
                    }
                    acc[t] = V16(add_epi32)(acc[t], V16(add_epi32)(V16(mullo_epi32)(g0, sc0), V16(mullo_epi32)(g1, sc1)));
                }
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                if (i + 1 < nb)
                    prefetch_block_q8_K(a + 1);  /* this token's next block: wanted a tile from now */
                v16i off = V16(setzero_si512)();
                for (int p = 0; p < 8; p++) {
                    const int32_t pair = (int32_t)((uint32_t)(uint16_t)a->bsums[2 * p] | (uint32_t)(uint16_t)a->bsums[2 * p + 1] << 16);
                    off = V16(add_epi32)(off, V16(madd_epi16)(V16(loadu_si512)(pair_lanes[p]), V16(set1_epi32)(pair)));
                }
                const v16i s1 = V16(sub_epi32)(acc[t], V16(slli_epi32)(off, 5));
                sum[t] = V16(fmadd_ps)(V16(mul_ps)(d_rows, V16(cvtepi32_ps)(s1)), V16(set1_ps)(a->d), sum[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, sum[t]);
    }
}

TARGET void sq_batch_dot16_q6_K_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                           int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    batch_dot16_q6_K(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 0);
}

TARGET void sq_packed_batch16_q6_K_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                              int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    batch_dot16_q6_K(group, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 1);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_avx512vnni_unused;
#endif
