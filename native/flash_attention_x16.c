/* flash_attention_x16.c: a task's query rows through one key block (flash_attention.c's
 * block step) in 512-bit registers, at the "avx512vnni" SIMD setting: a prefill's, whose
 * keys and values flash_attention.c widens into scratch once for all its rows, and a long
 * draft check's, which reads them from the cache in place, widening as it loads.
 *
 * Each piece keeps the bits of the AVX2 and plain code it stands for:
 *  - scores: a register holds two keys side by side (key 2p in lanes 0-7, key 2p + 1 in
 *    lanes 8-15), so each lane is the same fma chain over d as lane l of an 8-lane key;
 *    a key's 8 lanes are then added in sq_hsum8's order, eight keys at once;
 *  - the online softmax: the block's 32 scores in two registers, their max and sum taken
 *    in the pairing of the AVX2 trees (keys 0-7 with 8-15, 16-23 with 24-31, then the two);
 *  - weighted values: sixteen outputs a register, each output one fma chain over the
 *    keys in order.
 * The gain is in the width and in the 32 registers: four rows times eight keys of
 * accumulators, each key read once for the four rows and each query once for the eight
 * keys, where the AVX2 kernels hold four rows times two keys.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "exp_ggml.h"
#include "flash_attention.h"
#include "quants/blocks.h"
#include "simd512.h"
#include "smolq.h"

#ifdef SQ_X86

#define ALWAYS_INLINE inline __attribute__((always_inline))

enum {
    KEY_BLOCK = SQ_FLASH_KEY_BLOCK,
    PAIRS = KEY_BLOCK / 2,
    ROWS = 4,  /* query rows through the keys at once */
};

/* exp_le0 (exp_ggml.h), sixteen lanes at a time. */
SQ_AVX512 static ALWAYS_INLINE v16f exp_le0_x16(v16f x) {
    x = V16(max_ps)(V16(set1_ps)(-87.0f), x);
    const v16f shift = V16(set1_ps)(0x1.8p23f);
    const v16f z = V16(fmadd_ps)(x, V16(set1_ps)(0x1.715476p+0f), shift);
    const v16f n = V16(sub_ps)(z, shift);
    const v16f b = V16(fnmadd_ps)(n, V16(set1_ps)(0x1.7f7d1cp-20f), V16(fnmadd_ps)(n, V16(set1_ps)(0x1.62e4p-1f), x));
    const v16f k = V16(castsi512_ps)(
        V16(add_epi32)(V16(slli_epi32)(V16(castps_si512)(z), 23), V16(set1_epi32)(0x3f800000)));
    const v16f u = V16(mul_ps)(b, b);
    const v16f j = V16(fmadd_ps)(
        V16(fmadd_ps)(V16(fmadd_ps)(V16(set1_ps)(0x1.0e4020p-7f), b, V16(set1_ps)(0x1.573e2ep-5f)), u,
                      V16(fmadd_ps)(V16(set1_ps)(0x1.555e66p-3f), b, V16(set1_ps)(0x1.fffdb6p-2f))),
        u, V16(mul_ps)(V16(set1_ps)(0x1.ffffecp-1f), b));
    return V16(fmadd_ps)(j, k, k);
}

/* -- rows from the cache ---------------------------------------------------------------------- */

/* CALL(G, SRC) with SRC the constant that src (SQ_F16, SQ_Q8_0 or SQ_FLASH_WIDE) holds: the
 * kernels below are inlined once for each source of keys and values. */
#define FOR_SOURCE(src, G, CALL)                 \
    ((src) == SQ_F16    ? CALL(G, SQ_F16)        \
     : (src) == SQ_Q8_0 ? CALL(G, SQ_Q8_0)       \
                        : CALL(G, SQ_FLASH_WIDE))

/* Sixteen signed bytes as floats (via 16-bit words: the build through SIMDe has no direct
 * byte-to-dword widening at 512 bits). */
SQ_AVX512 static ALWAYS_INLINE v16f codes16(__m128i bytes) {
    return V16(cvtepi32_ps)(V16(cvtepi16_epi32)(AS256I(_mm256_cvtepi8_epi16(bytes))));
}

/* Eight elements from element d (a multiple of 8) of each of two cached rows, as floats:
 * row a's in lanes 0-7, row b's in 8-15. As flash_attention.c's load8 widens them: the
 * halves converted, or a Q8_0 block's scale times each code, rounded once. */
SQ_AVX512 static ALWAYS_INLINE v16f cached_pair(const uint8_t *a, const uint8_t *b, size_t d, const int KV) {
    if (KV == SQ_F16) {
        const __m128i lo = _mm_loadu_si128((const __m128i *)(a + 2 * d));
        const __m128i hi = _mm_loadu_si128((const __m128i *)(b + 2 * d));
        return V16(cvtph_ps)(AS256I(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)));
    }
    const block_q8_0 *ba = (const block_q8_0 *)a + d / QK8_0, *bb = (const block_q8_0 *)b + d / QK8_0;
    const __m128i codes = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(ba->qs + d % QK8_0)),
                                             _mm_loadl_epi64((const __m128i *)(bb->qs + d % QK8_0)));
    const __m256i scales = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)ba->d)),
                                                   _mm_set1_epi16((short)bb->d), 1);
    const v16f scale = V16(cvtph_ps)(AS256I(scales));  /* row a's in lanes 0-7, b's in 8-15 */
    return V16(mul_ps)(scale, codes16(codes));
}

/* Sixteen elements from element d (a multiple of 16) of one cached row, as floats, as
 * cached_pair widens them. */
SQ_AVX512 static ALWAYS_INLINE v16f cached16(const uint8_t *row, size_t d, const int KV) {
    if (KV == SQ_F16) return V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)(row + 2 * d))));
    const block_q8_0 *b = (const block_q8_0 *)row + d / QK8_0;
    const v16f scale = V16(set1_ps)(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(b->d))));
    const __m128i codes = _mm_loadu_si128((const __m128i *)(b->qs + d % QK8_0));
    return V16(mul_ps)(scale, codes16(codes));
}

/* -- scores --------------------------------------------------------------------------------- */

/* Eight keys' scores from their four pair registers (pair[i]: key 2i in lanes 0-7, key
 * 2i + 1 in 8-15), each key's 8 lanes added in sq_hsum8's order, (l0 + l4) + (l2 + l6)
 * plus (l1 + l5) + (l3 + l7), into s[0..7], in registers (through memory, as the lanes of
 * all 32 keys were stored and read back, a 512-token prefill at depth 3,072 took 1.04-1.11
 * times as long; Zen 4, one process, alternating). */
SQ_AVX512 static ALWAYS_INLINE void reduce8(const v16f pair[4], float *s) {
    v16f t[2];
    for (int m = 0; m < 2; m++)  /* quarter c of t[m]: key 4m + c's l0 + l4, l1 + l5, l2 + l6, l3 + l7 */
        t[m] = V16(add_ps)(V16(shuffle_f32x4)(pair[2 * m], pair[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           V16(shuffle_f32x4)(pair[2 * m], pair[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* quarter c: the two halves of key c, then of key 4 + c */
    const v16f u = V16(add_ps)(V16(shuffle_ps)(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               V16(shuffle_ps)(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 4c: the score of key c, lane 4c + 1: of key 4 + c */
    const v16f sum = V16(add_ps)(V16(shuffle_ps)(u, u, _MM_SHUFFLE(2, 0, 2, 0)), V16(shuffle_ps)(u, u, _MM_SHUFFLE(3, 1, 3, 1)));
    const v16i order = V16(setr_epi32)(0, 4, 8, 12, 1, 5, 9, 13, 0, 4, 8, 12, 1, 5, 9, 13);
    _mm256_storeu_ps(s, sq_low8(V16(permutexvar_ps)(order, sum)));
}

/* Scores of key pairs p0..p0+KP-1 for G rows: scores[r][2p + h] is q[r] . k[2p + h], whose
 * lane l sums q[r][d] k[2p + h][d] over d = l mod 8, in order of d, the lanes then added by
 * reduce8. With SRC SQ_FLASH_WIDE, kw holds the block's keys in pairs:
 * kw[(p * steps + s) * 16 + 8h + l] is element 8s + l of key 2p + h; with SRC a cache
 * type, the keys are the cache's rows at k, rb bytes apart, widened as they are read. */
SQ_AVX512 static ALWAYS_INLINE void score_pairs(const float *q, size_t hdp, const float *kw, const uint8_t *k,
                                             size_t rb, size_t steps, size_t p0, float *scores, const int G,
                                             const int KP, const int SRC) {
    v16f acc[ROWS][8];
#pragma GCC unroll 4
    for (int r = 0; r < G; r++)
#pragma GCC unroll 8
        for (int i = 0; i < KP; i++) acc[r][i] = V16(setzero_ps)();
    const float *kp = kw + p0 * steps * 16;
    for (size_t s = 0; s < steps; s++) {
        v16f key[8];
#pragma GCC unroll 8
        for (int i = 0; i < KP; i++)
            key[i] = SRC == SQ_FLASH_WIDE ? V16(loadu_ps)(kp + ((size_t)i * steps + s) * 16)
                                          : cached_pair(k + 2 * (p0 + (size_t)i) * rb, k + (2 * (p0 + (size_t)i) + 1) * rb,
                                                        8 * s, SRC);
#pragma GCC unroll 4
        for (int r = 0; r < G; r++) {
            const v16f w = sq_both_halves(q + (size_t)r * hdp + 8 * s);
#pragma GCC unroll 8
            for (int i = 0; i < KP; i++) acc[r][i] = V16(fmadd_ps)(w, key[i], acc[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < G; r++)
#pragma GCC unroll 2
        for (int i = 0; i < KP; i += 4) reduce8(acc[r] + i, scores + (size_t)r * KEY_BLOCK + 2 * (p0 + (size_t)i));
}

SQ_AVX512 static ALWAYS_INLINE void score_rows(const float *q, size_t hdp, const float *kw, const uint8_t *k,
                                            size_t rb, size_t steps, float *s, const int G, const int SRC) {
    const int KP = G <= 2 ? 8 : 4;
    for (size_t p0 = 0; p0 < PAIRS; p0 += (size_t)KP) score_pairs(q, hdp, kw, k, rb, steps, p0, s, G, KP, SRC);
}

SQ_AVX512 void sq_flash_scores_x16(const float *q, size_t n, size_t hdp, const float *kw, const uint8_t *k, int src,
                                   size_t rb, size_t head_dim, float *s, const uint8_t *pf_a, const uint8_t *pf_b,
                                   size_t pf_bytes) {
    const size_t steps = head_dim / 8;
    for (size_t r0 = 0; r0 < n; r0 += ROWS) {
        const size_t g = n - r0 < ROWS ? n - r0 : ROWS;
        const float *qr = q + r0 * hdp;
        /* A slice of the prefetches per group of rows: asked all at once, they fill the
         * line fill buffers and the thread waits on them. A draft check's rows, which read
         * the cache in place, ask for L2 only (flash_attention.c, block_step, says why):
         * SmolLM2's 8-token checks took x0.984-0.993 of the time (Zen 4, one process,
         * alternating; 16 tokens x0.998); a prefill's keep L1. */
        sq_flash_prefetch(pf_a, pf_b, r0 * pf_bytes / n, (r0 + g) * pf_bytes / n, src == SQ_FLASH_WIDE);
#define SCORE_FROM(G, SRC) score_rows(qr, hdp, kw, k, rb, steps, s + r0 * KEY_BLOCK, G, SRC)
#define SCORE(G) FOR_SOURCE(src, G, SCORE_FROM)
        SQ_FOR_GROUP_OF_ROWS(g, SCORE)
#undef SCORE
#undef SCORE_FROM
    }
}

/* -- the online softmax --------------------------------------------------------------------- */

/* Lanes 0-7 of a and of b, then lanes 8-15 of a and of b. */
#define LOW_HALVES(a, b) V16(shuffle_f32x4)(a, b, _MM_SHUFFLE(1, 0, 1, 0))
#define HIGH_HALVES(a, b) V16(shuffle_f32x4)(a, b, _MM_SHUFFLE(3, 2, 3, 2))

/* online_avx2's step for rows 0..n-1 (n <= 16) of a block's scores (s[r * KEY_BLOCK]), row
 * r's first valid[r] keys, but what was summed so far is not rescaled here: scale[r] is left
 * for sq_flash_weigh_x16, which multiplies the row's outputs as it loads them (0: the
 * chunk's first block, outputs start from zero). The same operations as the rescale in
 * place, so the same bits, and one pass over the outputs fewer. Each row's new max first,
 * then all the rows' factors in one register (exp_le0_x16 gives exp_le0's bits lane by
 * lane), then each row's weights and sum: one row at a time, with the factor's exp_le0 in
 * each, a 512-token prefill at depth 3,072 took 1.04-1.06 times as long (Zen 4, one
 * process, alternating). */
SQ_AVX512 void sq_flash_online_x16(float *s, size_t n, const size_t *valid, float *m, float *l, float *scale) {
    float was[16], mx[16], corr[16];  /* each row's max before the block and after, and the factor between */
    const v16f ninf = V16(set1_ps)(-INFINITY);
    mask16 keep0[16], keep1[16];
    for (size_t r = 0; r < n; r++) {
        keep0[r] = valid[r] >= 16 ? 0xffff : (mask16)((1u << valid[r]) - 1);
        keep1[r] = valid[r] >= 32 ? 0xffff : valid[r] <= 16 ? 0 : (mask16)((1u << (valid[r] - 16)) - 1);
        const float *row = s + r * KEY_BLOCK;
        const v16f a = V16(mask_blend_ps)(keep0[r], ninf, V16(loadu_ps)(row));
        const v16f b = V16(mask_blend_ps)(keep1[r], ninf, V16(loadu_ps)(row + 16));
        const v16f pair_max = V16(max_ps)(LOW_HALVES(a, b), HIGH_HALVES(a, b));
        const float block_max = sq_hmax8_avx2(_mm256_max_ps(sq_low8(pair_max), sq_high8(pair_max)));
        was[r] = m[r];
        mx[r] = block_max > m[r] ? block_max : m[r];
        m[r] = mx[r];
    }
    for (size_t r = n; r < 16; r++) was[r] = mx[r] = -INFINITY;
    /* the chunk's first block (the max was -inf) starts afresh: factor 0; the masked keys'
     * lanes (reread below without their -inf) are zeroed after their exp */
    const v16f old = V16(loadu_ps)(was), now = V16(loadu_ps)(mx);
    const mask16 first = V16(cmp_ps_mask)(old, ninf, _CMP_EQ_OQ);
    V16(storeu_ps)(corr, V16(mask_blend_ps)(first, exp_le0_x16(V16(sub_ps)(old, now)), V16(setzero_ps)()));
    for (size_t r = 0; r < n; r++) {
        float *row = s + r * KEY_BLOCK;
        const v16f vmx = V16(set1_ps)(mx[r]);
        const v16f a = V16(maskz_mov_ps)(keep0[r], exp_le0_x16(V16(sub_ps)(V16(loadu_ps)(row), vmx)));
        const v16f b = V16(maskz_mov_ps)(keep1[r], exp_le0_x16(V16(sub_ps)(V16(loadu_ps)(row + 16), vmx)));
        V16(storeu_ps)(row, a);
        V16(storeu_ps)(row + 16, b);
        const v16f pair_sum = V16(add_ps)(LOW_HALVES(a, b), HIGH_HALVES(a, b));
        const float sum = sq_hsum8_avx2(_mm256_add_ps(sq_low8(pair_sum), sq_high8(pair_sum)));
        l[r] = ((first >> r) & 1 ? 0.0f : l[r] * corr[r]) + sum;
        scale[r] = corr[r];
    }
}

/* -- weighted values ------------------------------------------------------------------------ */

/* Outputs d..d+16W-1 of G rows: o[r][d] * scale[r] (0 where scale[r] is 0: the chunk
 * starts afresh) plus s[r][j] v[j][d] over j < most, in order of j. */
SQ_AVX512 static ALWAYS_INLINE void weigh_outs(const float *s, size_t most, const float *v, const uint8_t *vc,
                                            size_t rb, size_t hdp, float *o, const float *scale, size_t d, const int G,
                                            const int W, const int SRC) {
    v16f acc[ROWS][8];
#pragma GCC unroll 4
    for (int r = 0; r < G; r++) {
        const v16f c = V16(set1_ps)(scale[r]);
#pragma GCC unroll 8
        for (int i = 0; i < W; i++) {
            /* at a chunk's first block o holds the last chunk's outputs (or nothing yet) */
            const v16f was = scale[r] == 0.0f ? V16(setzero_ps)() : V16(loadu_ps)(o + (size_t)r * hdp + d + 16 * (size_t)i);
            acc[r][i] = scale[r] == 1.0f ? was : V16(mul_ps)(was, c);
        }
    }
    for (size_t j = 0; j < most; j++) {
        v16f w[ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < G; r++) w[r] = V16(set1_ps)(s[(size_t)r * KEY_BLOCK + j]);
#pragma GCC unroll 8
        for (int i = 0; i < W; i++) {
            const v16f x = SRC == SQ_FLASH_WIDE ? V16(loadu_ps)(v + j * hdp + d + 16 * (size_t)i)
                                                : cached16(vc + j * rb, d + 16 * (size_t)i, SRC);
#pragma GCC unroll 4
            for (int r = 0; r < G; r++) acc[r][i] = V16(fmadd_ps)(w[r], x, acc[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < G; r++)
#pragma GCC unroll 8
        for (int i = 0; i < W; i++) V16(storeu_ps)(o + (size_t)r * hdp + d + 16 * (size_t)i, acc[r][i]);
}

/* hdp is a multiple of 32: eight, four, then two registers of outputs at a time. */
SQ_AVX512 static ALWAYS_INLINE void weigh_rows(const float *s, size_t most, const float *v, const uint8_t *vc,
                                            size_t rb, size_t hdp, float *o, const float *scale, const int G,
                                            const int SRC) {
    size_t d = 0;
    if (G <= 2)
        for (; d + 128 <= hdp; d += 128) weigh_outs(s, most, v, vc, rb, hdp, o, scale, d, G, 8, SRC);
    for (; d + 64 <= hdp; d += 64) weigh_outs(s, most, v, vc, rb, hdp, o, scale, d, G, 4, SRC);
    for (; d < hdp; d += 32) weigh_outs(s, most, v, vc, rb, hdp, o, scale, d, G, 2, SRC);
}

SQ_AVX512 void sq_flash_weigh_x16(const float *s, size_t n, size_t most, const float *v, const uint8_t *vc, int src,
                                  size_t rb, size_t hdp, float *o, const float *scale) {
    for (size_t r0 = 0; r0 < n; r0 += ROWS) {
        const size_t g = n - r0 < ROWS ? n - r0 : ROWS;
        const float *sr = s + r0 * KEY_BLOCK, *cr = scale + r0;
        float *orow = o + r0 * hdp;
#define WEIGH_FROM(G, SRC) weigh_rows(sr, most, v, vc, rb, hdp, orow, cr, G, SRC)
#define WEIGH(G) FOR_SOURCE(src, G, WEIGH_FROM)
        SQ_FOR_GROUP_OF_ROWS(g, WEIGH)
#undef WEIGH
#undef WEIGH_FROM
    }
}

#endif
