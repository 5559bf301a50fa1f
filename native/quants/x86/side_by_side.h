/* quants/x86/side_by_side.h: the steps x86/avx2.c's batched products share (part of that
 * file, after vec_dots.h): prefetches, several tokens' integer lanes reduced to one
 * integer per token, and eight weight rows' blocks put side by side (or a packed group's
 * sixteen read as they lie), a row per 32-bit lane, so that an activation word broadcast
 * to every lane multiplies all the rows.
 * Either way each float lane ends up with one (row, token) pair, whose block steps it
 * takes in block order: the definition of quants/types.h.
 */
#ifndef SMOLQ_QUANTS_X86_SIDE_BY_SIDE_H
#define SMOLQ_QUANTS_X86_SIDE_BY_SIDE_H

#include <stdint.h>
#include <string.h>

#include "quants/x86/token_rows.h"

/* The two f16 halves of each 32-bit lane of both (a block's d, and its m, dmin or s),
 * converted eight at a time: first[r] the low half of lane r, second[r] the high. */
static inline TARGET void halves_of_words(__m256i both, __m256 *first, __m256 *second) {
    const __m256i halves = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(both, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(both, 16)), 0xd8);
    *first = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
    *second = _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1));
}

/* halves_of_words for the pairs of rows r = 0..7 held in memory. */
static inline TARGET void halves_of_eight(const uint32_t pairs[8], __m256 *first, __m256 *second) {
    halves_of_words(_mm256_loadu_si256((const __m256i *)pairs), first, second);
}

/* Lane b * k + t, for b < B and t < k (B * k <= 8, constants where this is inlined): the
 * 32-bit word at + b * block_bytes bytes into token t0 + t's activation row; 0 in the
 * other lanes. The d (and s) of B blocks of k tokens, for the lanes where their block
 * steps run; with stride 0 and k = 1, the words of B blocks of one row. The words are
 * paired in general registers and moved over 64 bits at a time: fewer vector
 * instructions than inserting them one by one. */
static inline __attribute__((always_inline)) TARGET __m256i pair_words(const void *xq, int64_t stride, int t0, int k,
                                                                       int B, int64_t at, int block_bytes) {
    uint64_t q[4];
    for (int j = 0; j < 8; j += 2) {
        uint32_t w[2] = {0, 0};
        for (int h = 0; h < 2; h++)
            if (j + h < B * k)
                memcpy(&w[h], (const uint8_t *)token_row(xq, stride, t0 + (j + h) % k) + at +
                                  (int64_t)((j + h) / k) * block_bytes, 4);
        q[j / 2] = (uint64_t)w[0] | (uint64_t)w[1] << 32;
    }
    return _mm256_set_epi64x((long long)q[3], (long long)q[2], (long long)q[1], (long long)q[0]);
}

/* pair_words' lanes for an f16 (a block's d) at each place, widened to float. */
static inline __attribute__((always_inline)) TARGET __m256 pair_halves(const void *xq, int64_t stride, int t0, int k,
                                                                       int B, int64_t at, int block_bytes) {
    uint64_t q[2];
    for (int j = 0; j < 8; j += 4) {
        uint64_t v = 0;
        for (int h = 0; h < 4; h++)
            if (j + h < B * k) {
                uint16_t half;
                memcpy(&half, (const uint8_t *)token_row(xq, stride, t0 + (j + h) % k) + at +
                                  (int64_t)((j + h) / k) * block_bytes, 2);
                v |= (uint64_t)half << 16 * h;
            }
        q[j / 4] = v;
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)q[1], (long long)q[0]));
}

/* Lane t < k: the word `at` bytes into token t0 + t's row (pair_words of one block). */
static inline __attribute__((always_inline)) TARGET __m256i token_words(const void *xq, int64_t stride, int t0, int k,
                                                                        int64_t at) {
    return pair_words(xq, stride, t0, k, 1, at, 0);
}

/* in[r % 4] holds four 32-bit words of row r in its low half (r < 4) or its high half
 * (r >= 4); out[j] gets word j of rows 0..3, then of rows 4..7: a 4 x 4 transpose per half. */
static inline TARGET void transpose4_halves(const __m256i in[4], __m256i out[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(in[0], in[1]), t1 = _mm256_unpackhi_epi32(in[0], in[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(in[2], in[3]), t3 = _mm256_unpackhi_epi32(in[2], in[3]);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* Lane j: the sum of v[j]'s eight int32 lanes, for j < k (k <= 8, a constant where this
 * is inlined, so that only the tree it needs is built); the other lanes unspecified.
 * Exact, so the order of the adds does not matter: it turns the integer lanes of k
 * (block, token) pairs into each pair's block integer, in the float lane where that
 * pair's block step runs. Unpacks and adds: the shuffles and adds an hadd does inside,
 * without those left over once the zero vectors of k < 8 are folded away. */
static inline __attribute__((always_inline)) TARGET __m256i lane_totals(const __m256i *v, int k) {
    __m256i w[8];
    for (int j = 0; j < 8; j++)
        w[j] = j < k ? v[j] : _mm256_setzero_si256();
    __m256i q[2];  /* per 128-bit half: the half-sums of v[4h], v[4h+1], v[4h+2], v[4h+3] */
    for (int h = 0; h < (k > 4 ? 2 : 1); h++) {
        const __m256i *u = w + 4 * h;
        /* a: u0 0+2, u1 0+2, u0 1+3, u1 1+3 (per half); c the same for u2, u3 */
        const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(u[0], u[1]), _mm256_unpackhi_epi32(u[0], u[1]));
        const __m256i c = _mm256_add_epi32(_mm256_unpacklo_epi32(u[2], u[3]), _mm256_unpackhi_epi32(u[2], u[3]));
        q[h] = _mm256_add_epi32(_mm256_unpacklo_epi64(a, c), _mm256_unpackhi_epi64(a, c));
    }
    if (k <= 4)
        return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(q[0]), _mm256_extracti128_si256(q[0], 1)));
    return _mm256_add_epi32(_mm256_permute2x128_si256(q[0], q[1], 0x20), _mm256_permute2x128_si256(q[0], q[1], 0x31));
}

/* Slice k of n of block i's share (`share` bytes) of the eight rows that follow the ones
 * being worked on (the lines from k/n of the way), asked for ahead of use up to stop: the
 * hardware prefetchers do not follow eight rows read a block of each at a time. Into L1, as
 * prefetch_ahead's requests. */
static inline __attribute__((always_inline)) TARGET void prefetch_slice(const uint8_t *next, int64_t i, int64_t share,
                                                                       int k, int n, const void *stop) {
    const int64_t from = i * share + (share * k / n + 63) / 64 * 64, to = i * share + (share * (k + 1) / n + 63) / 64 * 64;
    for (int64_t b = from; b < to; b += 64)
        if ((uintptr_t)(next + b) < (uintptr_t)stop)
            _mm_prefetch((const char *)(next + b), _MM_HINT_T0);
}

/* The whole of block i's share at once. */
static inline __attribute__((always_inline)) TARGET void prefetch_next_rows(const uint8_t *next, int64_t i, int64_t share,
                                                                           const void *stop) {
    prefetch_slice(next, i, share, 0, 1, stop);
}

/* The scales, mins and d of block i of eight Q4_K rows side by side (see
 * sq_batch_dot8_q4_K_avx2): scale[g] each row's scale of group g as two int16; mins[c]
 * each row's (min 2c, min 2c+1); d_rows and dmin_rows each row's d and dmin. */
static inline TARGET void q4_K_scales_side_by_side(const void *rows, int64_t row_bytes, int64_t i, __m256i scale[8],
                                                 __m256i mins[4], __m256 *d_rows, __m256 *dmin_rows) {
    /* Per row: its 8 scales as int32 words (sc | sc << 16), and its mins as the words
     * (mn 2c | mn 2c+1 << 16), the mins of rows r and r + 4 in one register's halves. */
    __m256i sc_words[8], mn_words[4];
    uint32_t dd[8];
    for (int r = 0; r < 8; r++) {
        const block_q4_K *x = (const block_q4_K *)((const uint8_t *)rows + r * row_bytes) + i;
        const __m128i sm = k_scales_mins(x->scales);
        sc_words[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sm, sm));
        const __m128i mn = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
        mn_words[r % 4] = r < 4 ? _mm256_castsi128_si256(mn) : _mm256_inserti128_si256(mn_words[r % 4], mn, 1);
        memcpy(&dd[r], &x->d, 4);  /* d, dmin */
    }
    sq_transpose8_epi32(sc_words);  /* sc_words[g]: every row's scale of group g */
    for (int g = 0; g < 8; g++)
        scale[g] = sc_words[g];
    transpose4_halves(mn_words, mins);  /* mins[c]: every row's (mn 2c, mn 2c+1) */
    halves_of_eight(dd, d_rows, dmin_rows);
}

/* Block i of eight Q4_K rows side by side: codes[c][h][j] holds elements 64c + 32h + 4j
 * .. +3 of every row, one row per 32-bit lane, and the rest as q4_K_scales_side_by_side. */
static inline TARGET void q4_K_side_by_side(const void *rows, int64_t row_bytes, int64_t i, __m256i codes[4][2][8],
                                          __m256i scale[8], __m256i mins[4], __m256 *d_rows, __m256 *dmin_rows) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    q4_K_scales_side_by_side(rows, row_bytes, i, scale, mins, d_rows, dmin_rows);
    for (int c = 0; c < 4; c++) {
        __m256i q[8];
        for (int r = 0; r < 8; r++)
            q[r] = _mm256_loadu_si256((const __m256i *)(((const block_q4_K *)((const uint8_t *)rows + r * row_bytes) + i)->qs + 32 * c));
        sq_transpose8_epi32(q);  /* q[j]: bytes 4j..4j+3 of this span's 32, for rows 0..7 */
        for (int j = 0; j < 8; j++) {
            codes[c][0][j] = _mm256_and_si256(q[j], m4);
            codes[c][1][j] = _mm256_and_si256(_mm256_srli_epi16(q[j], 4), m4);
        }
    }
}

/* Where block i's run starts in a group of sixteen Q4_K rows packed side by side
 * (quants/rows16.c): each of the block's 32-bit words of the sixteen rows in 64 bytes, rows
 * 0..7 in its first 32 and rows 8..15 in its second, after the rows' d and dmin. */
static inline const uint8_t *q4_K_run(const void *group, int64_t i) {
    return (const uint8_t *)group + i * 16 * (int64_t)sizeof(block_q4_K);
}

/* (byte a of each 32-bit lane) | (byte b) << 16, for a shuffle: a byte index -1 gives 0. */
static inline TARGET __m256i lane_bytes_to_words(int a, int b) {
    return _mm256_setr_epi8(a, -1, b, -1, 4 + a, -1, 4 + b, -1, 8 + a, -1, 8 + b, -1, 12 + a, -1, 12 + b, -1,
                            a, -1, b, -1, 4 + a, -1, 4 + b, -1, 8 + a, -1, 8 + b, -1, 12 + a, -1, 12 + b, -1);
}

/* q4_K_scales_side_by_side's scale[], mins[], d_rows and dmin_rows for rows 8 half .. 8 half
 * + 7 of a packed group's block (run: q4_K_run), whose words lie side by side already: no
 * transpose. The scales and mins come out of their twelve packed bytes eight rows at once,
 * as k_scales_mins takes them out of one row's, and one shuffle per group puts each lane's
 * bytes in place. */
static inline __attribute__((always_inline)) TARGET void q4_K_packed_headers(const uint8_t *run, int half,
                                                                             __m256i scale[8], __m256i mins[4],
                                                                             __m256 *d_rows, __m256 *dmin_rows) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m6 = _mm256_set1_epi8(0x3f), top2 = _mm256_set1_epi8(0x30);
    const uint8_t *words = run + 64 + 32 * half;  /* word j of these rows at words + 64 j */
    /* Bytes 0..3 of the scales (scales 0..3, and the top bits of scales 4..7), 4..7 (mins
     * 0..3, the top bits of mins 4..7), 8..11 (the low four bits of scales and mins 4..7). */
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)words);
    const __m256i w1 = _mm256_loadu_si256((const __m256i *)(words + 64));
    const __m256i w2 = _mm256_loadu_si256((const __m256i *)(words + 128));
    const __m256i sc_low = _mm256_and_si256(w0, m6), mn_low = _mm256_and_si256(w1, m6);
    const __m256i sc_high = _mm256_or_si256(_mm256_and_si256(w2, m4), _mm256_and_si256(_mm256_srli_epi32(w0, 2), top2));
    const __m256i mn_high = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), m4),
                                            _mm256_and_si256(_mm256_srli_epi32(w1, 2), top2));
    for (int g = 0; g < 4; g++) {
        scale[g] = _mm256_shuffle_epi8(sc_low, lane_bytes_to_words(g, g));
        scale[g + 4] = _mm256_shuffle_epi8(sc_high, lane_bytes_to_words(g, g));
    }
    for (int c = 0; c < 2; c++) {
        mins[c] = _mm256_shuffle_epi8(mn_low, lane_bytes_to_words(2 * c, 2 * c + 1));
        mins[c + 2] = _mm256_shuffle_epi8(mn_high, lane_bytes_to_words(2 * c, 2 * c + 1));
    }
    *d_rows = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(run + 16 * half)));
    *dmin_rows = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(run + 32 + 16 * half)));
}

/* The 32-bit word at p (four activation codes, or two bsums) in every lane. */
static inline TARGET __m256i word8(const void *p) {
    int32_t w;
    memcpy(&w, p, 4);
    return _mm256_set1_epi32(w);
}

/* Words 4 half .. 4 half + 3 of group g of a packed Q4_K block's run (q4_K_run) for all
 * sixteen rows: code[j] rows 0..7's elements 16 half + 4j .. +3 of the group, one row per
 * 32-bit lane, code[4 + j] rows 8..15's. */
static inline __attribute__((always_inline)) TARGET void q4_K_packed_words16(const uint8_t *run, int g, int half,
                                                                             __m256i code[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const uint8_t *words = run + 64 * 4 + 64 * (8 * (g / 2) + 4 * half);  /* after d, dmin and the scales */
    for (int j = 0; j < 4; j++)
        for (int r8 = 0; r8 < 2; r8++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(words + 64 * j + 32 * r8));
            code[4 * r8 + j] = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
        }
}

/* Four activation words (aq: 16 codes) against sixteen rows' 4-bit codes, code[j] rows
 * 0..7's four that meet word j and code[4 + j] rows 8..15's (as q4_K_packed_words16 gives
 * them): each eight rows' products in two int16 per lane (|.| <= 4 * 2 * 15 * 128), in
 * s[0] (rows 0..7) and s[1]. Each broadcast word meets both eights of rows. */
static inline __attribute__((always_inline)) TARGET void words4_16(const int8_t *aq, const __m256i code[8],
                                                                   __m256i s[2]) {
    __m256i p[2][4];
    for (int j = 0; j < 4; j++) {
        const __m256i a = word8(aq + 4 * j);
        p[0][j] = _mm256_maddubs_epi16(code[j], a);
        p[1][j] = _mm256_maddubs_epi16(code[4 + j], a);
    }
    for (int h = 0; h < 2; h++)
        s[h] = _mm256_add_epi16(_mm256_add_epi16(p[h][0], p[h][1]), _mm256_add_epi16(p[h][2], p[h][3]));
}

/* 32 activations against the nibbles of eight rows side by side: code[j] holds codes
 * 4j..4j+3 of every row (one row per 32-bit lane), aq the 32 activation codes, each word
 * of them broadcast to all eight rows. The result: each row's products, in two int16 per
 * lane, to be summed by a madd. The pair sums of the 8 maddubs fit an int16:
 * |.| <= 8 * 2 * 15 * 128 = 30720. */
static inline __attribute__((always_inline)) TARGET __m256i nibble_pairs8(const int8_t *aq, const __m256i code[8]) {
    __m256i p[8];
    for (int j = 0; j < 8; j++)
        p[j] = _mm256_maddubs_epi16(code[j], word8(aq + 4 * j));
    return _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                            _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
}

/* Group g (32 elements) of one token's activation block against eight rows side by side:
 * each row's exact sum of the group's products times its scale (two int16 per lane, as
 * q4_K_scales_side_by_side gives it). code[j] is codes[c][h][j] of q4_K_side_by_side
 * (g = 2c + h). */
static inline __attribute__((always_inline)) TARGET __m256i q4_K_group8(const int8_t *aq, const __m256i code[8],
                                                                        __m256i scale) {
    return _mm256_madd_epi16(nibble_pairs8(aq, code), scale);
}

/* Span c's min term for eight rows: the bsums of its four 16-element quarters, paired. */
static inline TARGET __m256i q4_K_min8(const block_q8_K *a, int c, __m256i mins_c) {
    const int32_t bs_lo = a->bsums[4 * c] + a->bsums[4 * c + 1];
    const int32_t bs_hi = a->bsums[4 * c + 2] + a->bsums[4 * c + 3];
    return _mm256_madd_epi16(mins_c, _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)bs_lo | (uint32_t)bs_hi << 16)));
}

/* The four spans' min terms for eight rows added, each from the pair of sums of 32 codes
 * that the activation row holds for it (block_sums, token_sums32), rather than from four
 * bsums: the packed kernels' activations have them. */
static inline TARGET __m256i q4_K_mins8(const int16_t *block_sums, const __m256i mins[4]) {
    __m256i imin = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        int32_t pair;
        memcpy(&pair, block_sums + 2 * c, 4);
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[c], _mm256_set1_epi32(pair)));
    }
    return imin;
}

/* The scales and d of block i of eight Q6_K rows side by side: pairs[p] each row's scales
 * of groups 2p and 2p + 1 as two int16 (sign-extended), scale[g] its scale of group g as
 * two int16, d_rows each row's d. */
static inline TARGET void q6_K_scales_side_by_side(const void *rows, int64_t row_bytes, int64_t i, __m256i scale[16],
                                                   __m256i pairs[8], __m256 *d_rows) {
    uint16_t d[8];
    for (int r = 0; r < 8; r++) {
        const block_q6_K *x = (const block_q6_K *)((const uint8_t *)rows + r * row_bytes) + i;
        pairs[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));  /* word g: scale g */
        memcpy(&d[r], &x->d, 2);
    }
    sq_transpose8_epi32(pairs);
    const __m256i even = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8,
                                          9, 8, 9, 12, 13, 12, 13);
    const __m256i odd = _mm256_add_epi8(even, _mm256_set1_epi8(2));
    for (int p = 0; p < 8; p++) {
        scale[2 * p] = _mm256_shuffle_epi8(pairs[p], even);
        scale[2 * p + 1] = _mm256_shuffle_epi8(pairs[p], odd);
    }
    *d_rows = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
}

/* Chunk k (elements 32k .. 32k + 31) of block i of eight Q6_K rows side by side: q[j]
 * holds the 6-bit codes 32k + 4j .. +3 of every row, one row per 32-bit lane. */
static inline TARGET void q6_K_side_by_side(const void *rows, int64_t row_bytes, int64_t i, int k, __m256i q[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    const int h = k / 4, part = k % 4;  /* elements 128h + 32 part .. */
    for (int r = 0; r < 8; r++) {
        const block_q6_K *x = (const block_q6_K *)((const uint8_t *)rows + r * row_bytes) + i;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (part & 1)));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        const __m256i low = part < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * part), m2);
        q[r] = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    }
    sq_transpose8_epi32(q);
}

#endif
