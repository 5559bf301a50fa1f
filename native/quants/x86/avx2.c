/* quants/x86/avx2.c: the x86 vec_dots (x86/vec_dots.h) and the few-token kernels
 * (x86/step_order.h) for AVX2/FMA/F16C, included here and compiled once, and the AVX2 products of several weight
 * rows, or one row, times several activation rows at once: a prefill's and a draft
 * check's. Q4_K and Q6_K have tiled prompt kernels; Q4_0, Q5_0, Q5_1, IQ4_NL and Q8_0
 * (rows8_block32), and Q5_K, IQ4_XS, Q3_K and Q2_K (rows8_super), eight rows side by side
 * for any number of tokens.
 *
 * They serve CPUs with AVX-512 VNNI as well (quants/dispatch.c's table), for a matrix left
 * in the file's layout; a packed one goes through x86/avx512vnni.c's sixteen-row kernels.
 * Every output has the scalar definition's bits for its row and token (quants/types.h):
 * per block one exact integer per (row, token), then the block step, in block order, with
 * a (row, token) pair per float lane.
 */
#include "simd.h"

#ifdef SQ_X86

#include "quants/x86/vec_dots.h"
#include "quants/x86/side_by_side.h"
#include "quants/x86/step_order.h"

/* ---------------------------------------------------------------------------
 * Q4_K: one row, and eight, times a prompt's tokens
 * ------------------------------------------------------------------------- */

/* One token's Q4_K block against one row: its code products, scaled, in eight int32 lanes
 * (isum), and its min terms mn[g] * (bsums[2g] + bsums[2g+1]) in lane g (imin). mins16
 * holds each min twice, for the two bsums of its group. */
static inline __attribute__((always_inline)) TARGET void q4_K_block_lanes(const block_q8_K *a, const __m256i lo[4],
                                                                          const __m256i hi[4], const __m256i scv[8],
                                                                          __m256i mins16, __m256i *isum, __m256i *imin) {
    __m256i p = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i a_lo = _mm256_loadu_si256((const __m256i *)(a->qs + 64 * c));
        const __m256i a_hi = _mm256_loadu_si256((const __m256i *)(a->qs + 64 * c + 32));
        p = madd_add(p, scv[2 * c], _mm256_maddubs_epi16(lo[c], a_lo));
        p = madd_add(p, scv[2 * c + 1], _mm256_maddubs_epi16(hi[c], a_hi));
    }
    *isum = p;
    *imin = _mm256_madd_epi16(mins16, _mm256_loadu_si256((const __m256i *)a->bsums));
}

/* Q4_K times n_tokens activation rows (stride bytes apart), y[t * ldy] with sq_vec_dot's
 * bits for token t: per block each token's exact integers for the codes and the mins
 * (q4_K_block_lanes), reduced eight tokens at a time by lane_totals into the float lanes
 * where those tokens' two chains run. The codes are split into nibbles once per block
 * for a tile of tokens. */
TARGET void sq_batch_dot_q4_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                                 float *y, int64_t ldy) {
    enum { TILE = 16, GROUPS = TILE / 8 };
    const block_q4_K *x = row;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        __m256 sumf[GROUPS], summ[GROUPS];
        for (int g = 0; g < GROUPS; g++)
            sumf[g] = summ[g] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const __m128i sm = k_scales_mins(x[i].scales);  /* 8 scales, 8 mins */
            uint8_t sc[8];
            _mm_storel_epi64((__m128i *)sc, sm);
            __m256i lo[4], hi[4], scv[8];
            for (int c = 0; c < 4; c++) {
                const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
                lo[c] = _mm256_and_si256(q4, m4);
                hi[c] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            }
            for (int g = 0; g < 8; g++)
                scv[g] = _mm256_set1_epi16(sc[g]);
            const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
            const __m256 dw = _mm256_set1_ps(h2f(x[i].d)), dminw = _mm256_set1_ps(h2f(x[i].dmin));
            for (int g = 0; 8 * g < nt; g++) {
                const int k = nt - 8 * g < 8 ? nt - 8 * g : 8, t = t0 + 8 * g;
                __m256i isum[8], imin[8];
                for (int j = 0; j < k; j++)
                    q4_K_block_lanes(token_block(xq, stride, t + j, i), lo, hi, scv, mins16, &isum[j], &imin[j]);
                const __m256 a_d = _mm256_castsi256_ps(token_words(xq, stride, t, k, i * (int64_t)sizeof(block_q8_K)));
                sumf[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_totals(isum, k)), _mm256_mul_ps(dw, a_d), sumf[g]);
                summ[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_totals(imin, k)), _mm256_mul_ps(dminw, a_d), summ[g]);
            }
        }
        float out[TILE];
        for (int g = 0; g < GROUPS; g++)
            _mm256_storeu_ps(out + 8 * g, _mm256_sub_ps(sumf[g], summ[g]));
        for (int t = 0; t < nt; t++)
            y[(t0 + t) * ldy] = out[t];
    }
}

/* Group g of block i for tokens t0 .. t0 + nt - 1 of a tile (see below): each token's
 * products added to its isum. With fetch, line g of each token's next block is asked for
 * as the token goes by: for a prompt of several tiles, whose activations come from L2 or
 * L3, the next block's lines for the whole tile asked for at once, as the block ended,
 * left 3B Q4_K products of 512 tokens 9-12% slower (one thread); for one tile, where
 * they come from L1 or L2, 1-3% faster. Into L2: the tile's blocks, the codes and the
 * sums fill most of L1 (into L1, 1-6% slower). */
static inline __attribute__((always_inline)) TARGET void q4_K_group_tokens(const void *xq, int64_t stride, int t0,
                                                                           int nt, int64_t i, int g,
                                                                           const __m256i code[8], __m256i scale,
                                                                           const int fetch, __m256i isum[]) {
    for (int t = 0; t < nt; t++) {
        const block_q8_K *a = token_block(xq, stride, t0 + t, i);
        if (fetch)
            prefetch_q8_K_line(a + 1, g);
        const __m256i s = q4_K_group8(a->qs + 32 * g, code, scale);
        isum[t] = g ? _mm256_add_epi32(isum[t], s) : s;
    }
}

/* Eight Q4_K rows (row_bytes apart) times n_tokens activation rows, each output with the
 * definition's bits for its row and token, with the rows in the float lanes: per block the
 * 8 rows' codes are put side by side, 4 consecutive elements of each row in one 32-bit
 * word, so that an activation word broadcast to all lanes multiplies all 8 rows at once
 * and every sum stays in its row's lane, with no horizontal reduction. A group's eight
 * registers of codes stay in registers while every token of the tile goes by, adding its
 * products to the token's block integer (isum, in memory between groups: token by token,
 * with the codes reloaded for each, 2048-wide rows took a tenth longer; 11008-wide ones,
 * whose activations come from L3, no longer); then each token's block steps, the mins
 * meeting the bsums. y[t * ldy + r] for r < 8. */
TARGET void sq_batch_dot8_q4_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                  int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    enum { TILE = 64 };  /* tokens per pass over a block's codes (32: 5% slower on 2048-wide rows) */
    __m256i codes[4][2][8], scale[8], mins[4];
    __m256 d_rows, dmin_rows;
    const uint8_t *next = (const uint8_t *)rows + 8 * row_bytes;  /* prefetched as these are read */
    const int64_t share = 8 * row_bytes / (nb > 0 ? nb : 1);
    const int spread = n_tokens > TILE;  /* the next blocks' activations asked for as the groups go by */
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        __m256 sumf[TILE], summ[TILE];
        __m256i isum[TILE];
        for (int t = 0; t < nt; t++)
            sumf[t] = summ[t] = opaque_zero8();
        for (int64_t i = 0; i < nb; i++) {
            if (t0 == 0)
                prefetch_next_rows(next, i, share, stop);
            q4_K_side_by_side(rows, row_bytes, i, codes, scale, mins, &d_rows, &dmin_rows);
            for (int g = 0; g < 8; g++) {
                if (spread && g < Q8_K_LINES && i + 1 < nb)
                    q4_K_group_tokens(xq, stride, t0, nt, i, g, codes[g / 2][g % 2], scale[g], 1, isum);
                else
                    q4_K_group_tokens(xq, stride, t0, nt, i, g, codes[g / 2][g % 2], scale[g], 0, isum);
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                if (!spread && i + 1 < nb)
                    prefetch_block_q8_K(a + 1);  /* this token's next block: wanted a tile from now */
                __m256i imin = q4_K_min8(a, 0, mins[0]);
                for (int c = 1; c < 4; c++)
                    imin = _mm256_add_epi32(imin, q4_K_min8(a, c, mins[c]));
                const __m256 a_d = _mm256_set1_ps(a->d);
                sumf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d_rows, a_d), sumf[t]);
                summ[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin_rows, a_d), summ[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + (t0 + t) * ldy, _mm256_sub_ps(sumf[t], summ[t]));
    }
}

/* A group of sixteen Q4_K rows packed side by side (quants/rows16.c) times n_tokens
 * activation rows, each output with the definition's bits for its row and token: per block
 * and group, the tile's tokens go by the group's first sixteen codes of all sixteen rows,
 * their int16 sums parked (s16), then by its last sixteen, each token's sums finished and
 * times the group's scale into its isum (the two passes' eight pair sums of vpmaddubsw fit
 * an int16, as nibble_pairs8's do); then each token's block steps, the mins meeting the
 * token's sums of 32 codes (q4_K_mins8). Each activation word broadcast
 * meets sixteen rows: eight rows a pass, with a group's eight registers of codes, took one
 * broadcast per vpmaddubsw, and on Zen 4 the broadcasts take slots of the vector pipes.
 * There, in one process alternating with that form, the 3B shape's 512-token prefill took
 * x0.86 of the time, its 8- and 16-token checks x0.85 and x0.89. y[t * ldy + r], r < 16. */
TARGET void sq_packed_batch16_q4_K_avx2(const void *group, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                                        const void *stop, float *y, int64_t ldy) {
    enum { TILE = 64 };
    enum { RUN_EIGHTH = 16 * (int)sizeof(block_q4_K) / 8 };  /* of a block's run, asked for per group */
    const int spread = n_tokens > TILE;  /* the next blocks' activations asked for as the groups go by */
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        __m256 sumf[TILE][2], summ[TILE][2];
        __m256i isum[TILE][2], s16[TILE][2];
        for (int t = 0; t < nt; t++)
            for (int h = 0; h < 2; h++)
                sumf[t][h] = summ[t][h] = opaque_zero8();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *run = q4_K_run(group, i);
            __m256i scale[2][8], mins[2][4];
            __m256 d_rows[2], dmin_rows[2];
            for (int h = 0; h < 2; h++)
                q4_K_packed_headers(run, h, scale[h], mins[h], &d_rows[h], &dmin_rows[h]);
            for (int g = 0; g < 8; g++) {
                /* An eighth of the run a group: the whole run asked for at the block's start
                 * (36 lines at once) filled the core's miss buffers and the thread waited on
                 * them (asked for so, the 3B shape's 8 to 16-token checks took 1.12-1.18x as
                 * long at the avx2 setting, with the eight-row form of this kernel). */
                if (t0 == 0)
                    prefetch_ahead(run + g * RUN_EIGHTH, RUN_EIGHTH, stop);
                const int fetch = spread && g < Q8_K_LINES && i + 1 < nb;
                __m256i code[8];
                q4_K_packed_words16(run, g, 0, code);
                for (int t = 0; t < nt; t++) {
                    const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                    if (fetch)
                        prefetch_q8_K_line(a + 1, g);
                    words4_16(a->qs + 32 * g, code, s16[t]);
                }
                q4_K_packed_words16(run, g, 1, code);
                for (int t = 0; t < nt; t++) {
                    const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                    __m256i s[2];
                    words4_16(a->qs + 32 * g + 16, code, s);
                    for (int h = 0; h < 2; h++) {
                        const __m256i v = _mm256_madd_epi16(_mm256_add_epi16(s[h], s16[t][h]), scale[h][g]);
                        isum[t][h] = g ? _mm256_add_epi32(isum[t][h], v) : v;
                    }
                }
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                if (!spread && i + 1 < nb)
                    prefetch_block_q8_K(a + 1);  /* this token's next block: wanted a tile from now */
                const int16_t *sums = token_sums32(xq, stride, t0 + t, nb, i);
                const __m256 a_d = _mm256_set1_ps(a->d);
                for (int h = 0; h < 2; h++) {
                    const __m256i imin = q4_K_mins8(sums, mins[h]);
                    sumf[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][h]), _mm256_mul_ps(d_rows[h], a_d), sumf[t][h]);
                    summ[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin_rows[h], a_d), summ[t][h]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            for (int h = 0; h < 2; h++)
                _mm256_storeu_ps(y + (t0 + t) * ldy + 8 * h, _mm256_sub_ps(sumf[t][h], summ[t][h]));
    }
}

/* ---------------------------------------------------------------------------
 * Q4_K rows packed side by side, a few tokens
 * ------------------------------------------------------------------------- */

/* At most PASS tokens go through the codes at a time: with more, their int16 sums and
 * int32 totals no longer fit the sixteen registers. Later passes find the codes in cache. */
enum { PASS = 4 };

/* A packed group of sixteen Q4_K rows times n (1..PASS) tokens, each output with the
 * definition's bits for its row and token, y[t * ldy + r] for r < 16: per block each
 * (row, token) pair's exact integers for the codes and the mins, then its block steps.
 * Unlike that kernel, no block's codes are kept in memory: a group of 32 elements is read
 * a word at a time, its nibbles taken out, and every token's products added into that
 * token's int16 sums, held in registers until the group's scale multiplies them; a token
 * costs the loads of its activation words and the multiplies, and the codes are read
 * once. Each block's run is read whole, eight rows and then the other eight, so that
 * memory streams while the core computes (the two halves in two passes over the rows
 * left memory idle in the second: one thread streamed 14% slower than the file's layout). */
static inline __attribute__((always_inline)) TARGET void packed_dotn16_q4_K(const void *group, const void *xq,
                                                                            int64_t stride, const int n, int64_t nb,
                                                                            const void *stop, float *y, int64_t ldy) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 sumf[2][PASS], summ[2][PASS];  /* [half][token] */
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < n; t++)
            sumf[h][t] = summ[h][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *run = q4_K_run(group, i);
        for (int half = 0; half < 2; half++) {
            __m256i scale[8], mins[4];
            __m256 d_rows, dmin_rows;
            q4_K_packed_headers(run, half, scale, mins, &d_rows, &dmin_rows);
            const uint8_t *codes = run + 64 * 4 + 32 * half;  /* code word j at codes + 64 j */
            __m256i isum[PASS];
            for (int t = 0; t < n; t++)
                isum[t] = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {  /* group g: the low (even g) or high nibbles of words 8 (g / 2) .. +7 */
                /* A sixteenth of the run asked for per group, so that the requests are spread
                 * out as the one-row vec_dots' are (all at once, they waited on one another). */
                prefetch_ahead(run + (8 * half + g) * (int)sizeof(block_q4_K), (int)sizeof(block_q4_K), stop);
                __m256i s16[PASS];
                for (int t = 0; t < n; t++)
                    s16[t] = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(codes + 64 * (8 * (g / 2) + j)));
                    const __m256i code = g % 2 ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
                    for (int t = 0; t < n; t++)
                        s16[t] = _mm256_add_epi16(
                            s16[t], _mm256_maddubs_epi16(code, word8(token_block(xq, stride, t, i)->qs + 32 * g + 4 * j)));
                }
                /* |s16| <= 8 * 3840: nibble_pairs8's bound */
                for (int t = 0; t < n; t++)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], scale[g]));
            }
            for (int t = 0; t < n; t++) {
                const block_q8_K *a = token_block(xq, stride, t, i);
                const __m256i imin = q4_K_mins8(token_sums32(xq, stride, t, nb, i), mins);
                const __m256 a_d = _mm256_set1_ps(a->d);
                sumf[half][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d_rows, a_d), sumf[half][t]);
                summ[half][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin_rows, a_d), summ[half][t]);
            }
        }
    }
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < n; t++)
            _mm256_storeu_ps(y + t * ldy + 8 * h, _mm256_sub_ps(sumf[h][t], summ[h][t]));
}

#define PACKED_DOTN16_CASE(k) case k: packed_dotn16_q4_K(group, x, stride, k, nb, fetch, y + t * ldy, ldy); break;
TARGET void sq_packed_dotn16_q4_K_avx2(const void *group, const void *xq, int64_t stride, int n, int64_t nb,
                                       const void *stop, float *y, int64_t ldy) {
    const int passes = (n + PASS - 1) / PASS;
    for (int t = 0, p = 0; p < passes; p++) {
        const int k = (n - t) / (passes - p);  /* as even as can be: 9 as 3 + 3 + 3 */
        const void *x = (const uint8_t *)xq + t * stride, *fetch = p == 0 ? stop : group;
        switch (k) {
            PACKED_DOTN16_CASE(1) PACKED_DOTN16_CASE(2) PACKED_DOTN16_CASE(3) PACKED_DOTN16_CASE(4)
        }
        t += k;
    }
}

/* ---------------------------------------------------------------------------
 * Q4_0, Q5_0, Q5_1, IQ4_NL and Q8_0: eight rows side by side
 * ------------------------------------------------------------------------- */

/* One body for the 32-element types (rows8_block32), as x86/avx512vnni.c's rows16_block32
 * is for sixteen rows: a block decoder (block32_8) puts eight rows' codes side by side,
 * codes[l] lane r holding row r's elements 4l..4l+3, so that an activation word broadcast
 * to every lane multiplies the eight rows at once and each row's sum stays in its lane. AVX2
 * multiplies bytes with vpmaddubsw (unsigned x signed, pair sums SATURATING at int16), so
 * each type's codes take the form that keeps every pair sum, and every int16 sum a lane
 * keeps, within int16 (activation codes in -127..127, as the quantizers make them):
 *  - Q4_0, Q5_0: the unsigned codes, 0..15 or 0..31 (pair sums at most 2 * 31 * 127 =
 *    7874), a block's eight words summed in int16 on top of the offset's share (8 or 16
 *    times the activations' pair sums, taken off: offsets32_8). Those adds wrap, but the
 *    lane's true total, sum((q - c) * a) over its 16 elements, is at most 16 * 16 * 127 =
 *    32512 in size (Q5_0; Q4_0 16256), so the wrapped int16 is exact, and one vpmaddwd by
 *    ones widens it.
 *  - Q5_1: the unsigned codes with no offset (m's chain takes it): a lane's 16 products
 *    reach 16 * 31 * 127, past int16, so the words go in two int16 sums of four
 *    (4 * 2 * 31 * 127 = 31496), each widened.
 *  - IQ4_NL, Q8_0: the codes are signed (the grid's -127..113; -128..127), so |c| goes in
 *    codes and c in signs, and each token's word takes c's sign (vpsignb) before the
 *    multiply, as the one-row vec_dots do: a pair sum reaches 2 * 128 * 127 = 32512, so
 *    every word's is widened at once.
 * Then each (row, token) pair's block step in its float lane, in block order. */

/* Word j (bytes 4j..4j+3) of the 16 bytes at p + r * row_bytes, for rows r = 0..7, in
 * lane r of w[j]. */
static inline TARGET void words8_side_by_side(const uint8_t *p, int64_t row_bytes, __m256i w[4]) {
    __m256i h[4];  /* rows r and r + 4 in one register's halves */
    for (int r = 0; r < 4; r++)
        h[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + r * row_bytes))),
                                       _mm_loadu_si128((const __m128i *)(p + (r + 4) * row_bytes)), 1);
    transpose4_halves(h, w);
}

/* The 32 nibbles of the 16 bytes at p of eight rows side by side in the elements' order:
 * codes[l] lane r holds row r's elements 4l..4l+3, the low nibbles of its word l for l < 4,
 * the high nibbles of word l - 4 after. */
static inline TARGET void nibbles8(const uint8_t *p, int64_t row_bytes, __m256i codes[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i w[4];
    words8_side_by_side(p, row_bytes, w);
    for (int j = 0; j < 4; j++) {
        codes[j] = _mm256_and_si256(w[j], m4);
        codes[j + 4] = _mm256_and_si256(_mm256_srli_epi16(w[j], 4), m4);
    }
}

/* Q5's fifth bits: 16 added to byte b of codes[l] where bit 4l + b of the lane's qh (one
 * row's 32 bits, element e's at bit e) is set. Byte l / 2 of qh is copied to the lane's
 * four bytes, each tested against its own bit. */
static inline __attribute__((always_inline)) TARGET void fifth_bits8(__m256i qh, __m256i codes[8]) {
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int l = 0; l < 8; l++) {
        const char b = (char)(l / 2);
        const __m256i spread = _mm256_shuffle_epi8(
            qh, _mm256_setr_epi8(b, b, b, b, 4 + b, 4 + b, 4 + b, 4 + b, 8 + b, 8 + b, 8 + b, 8 + b, 12 + b, 12 + b,
                                 12 + b, 12 + b, b, b, b, b, 4 + b, 4 + b, 4 + b, 4 + b, 8 + b, 8 + b, 8 + b, 8 + b,
                                 12 + b, 12 + b, 12 + b, 12 + b));
        const __m256i bits = _mm256_set1_epi32((int)(0x08040201u << 4 * (l % 2)));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
        codes[l] = _mm256_or_si256(codes[l], _mm256_and_si256(set, sixteen));
    }
}

/* Block i of eight rows of type (a constant) side by side, in the form its token steps
 * take (see above): codes[l] lane r holds row r's codes of elements 4l..4l+3, unsigned, or
 * for IQ4_NL and Q8_0 their sizes, with the codes themselves in signs[l]; d, and Q5_1's
 * m, each row's. The fields before qs come from the block's first 16 bytes side by side
 * (word 0: d, and m or qh's low half; word 1: qh or its high half): gathered word by word
 * in general registers (pair_halves), they took longer where a token's work is short
 * (Q4_0, Q5_0 and Q5_1 at 2 tokens: 6-10%). Q8_0's d alone is gathered so: its codes
 * come from other loads, and the sixteen bytes cost it more than they saved. */
static inline __attribute__((always_inline)) TARGET void block32_8(const int type, const uint8_t *rows,
                                                                  int64_t row_bytes, int64_t i, __m256i codes[8],
                                                                  __m256i signs[8], __m256 *d_rows, __m256 *m_rows) {
    const uint8_t *b = rows + i * sq_block_size(type);
    if (type == SQ_Q8_0) {
        *d_rows = pair_halves(b, row_bytes, 0, 8, 1, 0, 0);
        for (int r = 0; r < 8; r++)
            signs[r] = _mm256_loadu_si256((const __m256i *)(b + 2 + r * row_bytes));
        sq_transpose8_epi32(signs);
        for (int l = 0; l < 8; l++)
            codes[l] = _mm256_abs_epi8(signs[l]);  /* -128's is 0x80: 128 as the unsigned operand */
        return;
    }
    __m256i h[4];
    __m256 no_m;
    words8_side_by_side(b, row_bytes, h);
    halves_of_words(h[0], d_rows, type == SQ_Q5_1 ? m_rows : &no_m);
    if (type == SQ_Q4_0) {
        nibbles8(b + 2, row_bytes, codes);
    } else if (type == SQ_Q5_0) {
        nibbles8(b + 6, row_bytes, codes);
        fifth_bits8(_mm256_or_si256(_mm256_srli_epi32(h[0], 16), _mm256_slli_epi32(h[1], 16)), codes);
    } else if (type == SQ_Q5_1) {
        nibbles8(b + 8, row_bytes, codes);
        fifth_bits8(h[1], codes);
    } else {  /* SQ_IQ4_NL: the grid's values, looked up by index in each 128-bit half */
        const __m256i grid = _mm256_setr_epi8(SQ_IQ4_GRID, SQ_IQ4_GRID);
        nibbles8(b + 2, row_bytes, codes);
        for (int l = 0; l < 8; l++) {
            signs[l] = _mm256_shuffle_epi8(grid, codes[l]);
            codes[l] = _mm256_abs_epi8(signs[l]);
        }
    }
}

/* Lane j: the sum of v[j]'s eight 32-bit lanes, each as two int16 summed apart
 * (wrapping: exact where the true sums fit), by lane_totals' tree with 16-bit adds. */
static inline __attribute__((always_inline)) TARGET __m256i pair_totals8(const __m256i v[8]) {
    __m256i q[2];
    for (int h = 0; h < 2; h++) {
        const __m256i *u = v + 4 * h;
        const __m256i a = _mm256_add_epi16(_mm256_unpacklo_epi32(u[0], u[1]), _mm256_unpackhi_epi32(u[0], u[1]));
        const __m256i c = _mm256_add_epi16(_mm256_unpacklo_epi32(u[2], u[3]), _mm256_unpackhi_epi32(u[2], u[3]));
        q[h] = _mm256_add_epi16(_mm256_unpacklo_epi64(a, c), _mm256_unpackhi_epi64(a, c));
    }
    return _mm256_add_epi16(_mm256_permute2x128_si256(q[0], q[1], 0x20), _mm256_permute2x128_si256(q[0], q[1], 0x31));
}

/* The offset c (8 for Q4_0, 16 for Q5_0) of the unsigned codes, for activation blocks
 * a[0..n-1]: out[k] = minus c times the sums of a[k]'s codes 4l and 4l + 1 over l (low
 * int16), and of its codes 4l + 2 and 4l + 3 (high), what an int16 lane of the token step
 * starts from; at most 16 * 16 * 127 = 32512 in size. Once per token and block for all
 * eight rows, eight blocks at a time into one register: vpmaddubsw by c gives the pair
 * sums (at most 16 * 254), and pair_totals8 adds each block's words. */
static inline __attribute__((always_inline)) TARGET void offsets32_8(const block_q8_0 *a, int n, const int c,
                                                                    int32_t out[]) {
    for (int k0 = 0; k0 < n; k0 += 8) {
        __m256i v[8];
        for (int j = 0; j < 8; j++)
            v[j] = k0 + j < n ? _mm256_maddubs_epi16(_mm256_set1_epi8((char)c),
                                                     _mm256_loadu_si256((const __m256i *)a[k0 + j].qs))
                              : _mm256_setzero_si256();
        _mm256_storeu_si256((__m256i *)(out + k0), _mm256_sub_epi16(_mm256_setzero_si256(), pair_totals8(v)));
    }
}

/* One block's exact isum for T tokens (aq[u]: token u's 32 codes; offset[u] its
 * offsets32_8 word, Q4_0 and Q5_0 alone), each row in its lane. Each word of codes is
 * loaded once for the T. */
static inline __attribute__((always_inline)) TARGET void isums32_8(const int type, const int T,
                                                                  const int8_t *const aq[4], const int32_t offset[4],
                                                                  const __m256i code[8], const __m256i sign[8],
                                                                  __m256i isum[4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (type == SQ_Q8_0 || type == SQ_IQ4_NL) {
        for (int u = 0; u < T; u++)
            isum[u] = _mm256_setzero_si256();
        for (int l = 0; l < 8; l++)
            for (int u = 0; u < T; u++) {
                const __m256i p = _mm256_maddubs_epi16(code[l], _mm256_sign_epi8(word8(aq[u] + 4 * l), sign[l]));
                isum[u] = _mm256_add_epi32(isum[u], _mm256_madd_epi16(p, ones));
            }
    } else if (type == SQ_Q5_1) {
        __m256i s16[4][2];
        for (int l = 0; l < 8; l++)
            for (int u = 0; u < T; u++) {
                const __m256i p = _mm256_maddubs_epi16(code[l], word8(aq[u] + 4 * l));
                s16[u][l / 4] = l % 4 ? _mm256_add_epi16(s16[u][l / 4], p) : p;
            }
        for (int u = 0; u < T; u++)
            isum[u] = _mm256_add_epi32(_mm256_madd_epi16(s16[u][0], ones), _mm256_madd_epi16(s16[u][1], ones));
    } else {  /* Q4_0, Q5_0 */
        __m256i s16[4];
        for (int u = 0; u < T; u++)
            s16[u] = _mm256_set1_epi32(offset[u]);
        for (int l = 0; l < 8; l++)
            for (int u = 0; u < T; u++)
                s16[u] = _mm256_add_epi16(s16[u], _mm256_maddubs_epi16(code[l], word8(aq[u] + 4 * l)));
        for (int u = 0; u < T; u++)
            isum[u] = _mm256_madd_epi16(s16[u], ones);
    }
}

enum { ROWS8_CHUNK = 32 };  /* blocks put side by side at a time */

/* T tokens (1 to 4) from token t through nc blocks of eight rows from block i0, each
 * block's isums (isums32_8) then each token's block steps: sum[u] and off[u] token t + u's
 * chains (off Q5_1's alone, whose activations are Q8_1; the others' Q8_0). With fetch,
 * the next eight rows' share of each block is asked of memory up to stop as the pass goes
 * (prefetch_next_rows). */
static inline __attribute__((always_inline)) TARGET void tokens32_8(const int type, const int T, const void *xq,
                                                                   int64_t stride, int t, int64_t i0, int nc,
                                                                   const __m256i codes[][8], const __m256i signs[][8],
                                                                   const __m256 d_rows[], const __m256 m_rows[],
                                                                   __m256 sum[], __m256 off[], const uint8_t *fetch,
                                                                   const void *stop) {
    const int64_t a_bytes = type == SQ_Q5_1 ? (int64_t)sizeof(block_q8_1) : (int64_t)sizeof(block_q8_0);
    const int qs_at = type == SQ_Q5_1 ? 4 : 2;
    const int64_t share = 8 * (int64_t)sq_block_size(type);
    const uint8_t *a[4];  /* token u's block i0 */
    int32_t offset[4][ROWS8_CHUNK];
    __m256 s[4], o[4];
    for (int u = 0; u < T; u++) {
        a[u] = (const uint8_t *)token_row(xq, stride, t + u) + i0 * a_bytes;
        if (type == SQ_Q4_0 || type == SQ_Q5_0)
            offsets32_8((const block_q8_0 *)a[u], nc, type == SQ_Q4_0 ? 8 : 16, offset[u]);
        s[u] = sum[u];
        o[u] = off[u];
    }
    for (int k = 0; k < nc; k++) {
        if (fetch)
            prefetch_next_rows(fetch, i0 + k, share, stop);
        const int8_t *aq[4];
        int32_t at_k[4] = {0, 0, 0, 0};
        __m256i isum[4];
        for (int u = 0; u < T; u++) {
            aq[u] = (const int8_t *)(a[u] + k * a_bytes + qs_at);
            if (type == SQ_Q4_0 || type == SQ_Q5_0)
                at_k[u] = offset[u][k];
        }
        isums32_8(type, T, aq, at_k, codes[k], signs[k], isum);
        for (int u = 0; u < T; u++) {
            const uint16_t *h = (const uint16_t *)(a[u] + k * a_bytes);
            const __m128 ds = type == SQ_Q5_1 ? h2f_pair(h) : _mm_set_ss(h2f(*h));  /* the token's d (, s) */
            const __m256 d = _mm256_mul_ps(d_rows[k], _mm256_broadcastss_ps(ds));
            s[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[u]), d, s[u]);
            if (type == SQ_Q5_1)
                o[u] = _mm256_fmadd_ps(m_rows[k], _mm256_broadcastss_ps(_mm_movehdup_ps(ds)), o[u]);
        }
    }
    for (int u = 0; u < T; u++) {
        sum[u] = s[u];
        off[u] = o[u];
    }
}

#define TOKENS32_8(T)                                                                                              \
    case T:                                                                                                        \
        tokens32_8(type, T, xq, stride, t0 + t, i0, nc, codes, signs, d_rows, m_rows, sum + t, off + t, fetch, stop); \
        break;

/* Eight rows of a 32-element type (row_bytes apart, in the file's layout) times n_tokens
 * activation rows, each output the scalar vec_dot's bits for its row and token
 * (quants/types.h): ROWS8_CHUNK blocks put side by side at a time (block32_8), then the
 * tile's tokens through them; y = sum (+ off for Q5_1). y[t * ldy + r] for r < 8.
 * IQ4_NL's and Q8_0's tokens go four at a time, each register of codes and signs loaded
 * once for the four (one by one, 64 tokens of Q8_0 took 5% longer); the others' one by
 * one, their sums in fewer registers (four at a time: Q4_0 5% slower, Q5_1 20%). The next
 * eight rows' bytes are asked of memory up to stop as the first token goes through a
 * chunk, spread over its work: asked for all at once as the blocks were put side by side,
 * they left memory idle while the tokens went by (Q8_0 rows from memory, 2 tokens: 1.2x
 * as long, and slower than dotn). */
static inline __attribute__((always_inline)) TARGET void rows8_block32(const int type, const uint8_t *rows,
                                                                      int64_t row_bytes, const void *xq,
                                                                      int64_t stride, int n_tokens, int64_t nb,
                                                                      const void *stop, float *y, int64_t ldy) {
    enum { TILE = 64, CHUNK = ROWS8_CHUNK };
    __m256i codes[CHUNK][8], signs[CHUNK][8];
    __m256 d_rows[CHUNK], m_rows[CHUNK];
    __m256 sum[TILE], off[TILE];
    const int by4 = type == SQ_IQ4_NL || type == SQ_Q8_0;
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        for (int t = 0; t < nt; t++)
            sum[t] = off[t] = _mm256_setzero_ps();
        for (int64_t i0 = 0; i0 < nb; i0 += CHUNK) {
            const int nc = nb - i0 < CHUNK ? (int)(nb - i0) : CHUNK;
            for (int k = 0; k < nc; k++)
                block32_8(type, rows, row_bytes, i0 + k, codes[k], signs[k], &d_rows[k], &m_rows[k]);
            for (int t = 0; t < nt;) {
                const int T = !by4 ? 1 : nt - t >= 4 ? 4 : nt - t;
                const uint8_t *fetch = t0 + t == 0 ? rows + 8 * row_bytes : NULL;
                switch (T) {
                    TOKENS32_8(4) TOKENS32_8(3) TOKENS32_8(2) TOKENS32_8(1)
                }
                t += T;
            }
        }
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + (t0 + t) * ldy, type == SQ_Q5_1 ? _mm256_add_ps(sum[t], off[t]) : sum[t]);
    }
}

#define ROWS8_BLOCK32(name, NAME)                                                                               \
    TARGET void sq_steps_dot8_##name##_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, \
                                            int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) { \
        rows8_block32(SQ_##NAME, rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy);                      \
    }
ROWS8_BLOCK32(q4_0, Q4_0)
ROWS8_BLOCK32(q5_0, Q5_0)
ROWS8_BLOCK32(q5_1, Q5_1)
ROWS8_BLOCK32(iq4_nl, IQ4_NL)
ROWS8_BLOCK32(q8_0, Q8_0)

/* ---------------------------------------------------------------------------
 * Q6_K: eight rows, and one, times a prompt's tokens
 * ------------------------------------------------------------------------- */

/* Eight Q6_K rows times n_tokens (SPAN at most) activation rows, each output with the
 * definition's bits for its row and token: per block the exact isum = sum(scale * code * a)
 * - 32 * sum(scale * bsums) (the codes' offset taken off whole), then the block step
 * chain[t] = fma(isum, d * a->d, chain[t]). As in sq_batch_dot8_q4_K_avx2, the rows sit in
 * the lanes (4 consecutive codes of each row per 32-bit word) and activation words are
 * broadcast. Two maddubs results fit an int16 (2 * 2 * 63 * 128 = 32256), so pairs are
 * summed before each group's scale multiplies them. */
static inline __attribute__((always_inline)) TARGET void batch_dot8_q6_K_span(const void *rows, int64_t row_bytes,
                                                                             const void *xq, int64_t stride,
                                                                             int n_tokens, int64_t nb,
                                                                             const void *stop, __m256 *chain) {
    enum { TILE = 64 };   /* tokens whose activation blocks (18 KiB) stay in L1 over a block's eight chunks */
    /* The next rows' share is asked for in slices, one by each of the first SLICES tokens'
     * block steps: all at once at the block's start (27 lines), the requests filled the
     * core's miss buffers and the thread waited on them. On Zen 4 at the avx2 setting, the
     * 3B shape's 8 and 16-token checks took x0.98 of the time (one process, alternating);
     * its prefill x1.0. */
    enum { SLICES = 8 };
    const uint8_t *next = (const uint8_t *)rows + 8 * row_bytes;  /* prefetched as these are read */
    const int64_t share = 8 * row_bytes / (nb > 0 ? nb : 1);
    __m256i codes[8][8];   /* [chunk k: elements 32k..][word j: elements 32k + 4j..+3], 8 rows */
    __m256i scale[16];     /* group g (16 elements): each row's scale as two int16 */
    __m256i bs_scale[8];   /* groups 2p, 2p+1: each row's (scale 2p, scale 2p+1) as int16 */
    __m256i isum[TILE];    /* each token's products so far in the block */
    for (int t = 0; t < n_tokens; t++)
        chain[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256 d_rows;
        q6_K_scales_side_by_side(rows, row_bytes, i, scale, bs_scale, &d_rows);
        for (int k = 0; k < 8; k++)
            q6_K_side_by_side(rows, row_bytes, i, k, codes[k]);
        for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
            const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
            /* A chunk's eight registers of codes and its two scales stay in registers while
             * the tile's tokens go by: token by token through all eight chunks, the codes
             * were loaded again for every token, two loads to a multiply, and the loads set
             * the pace (3B Q6_K products of 16 to 512 tokens x1.10-1.22 as fast, one thread).
             * The next tile's activation blocks (this block's next tokens, or the next
             * block's first tile) are asked for a line per token as the chunks go by, into
             * L2, as batch_dot8_q4_K's are. */
            const int64_t next_t0 = t0 + TILE < n_tokens ? t0 + TILE : 0, next_i = next_t0 ? i : i + 1;
            const int next_nt = next_i == nb ? 0 : n_tokens - next_t0 < TILE ? (int)(n_tokens - next_t0) : TILE;
            for (int k = 0; k < 8; k++) {
                const __m256i *code = codes[k];
                const __m256i sc0 = scale[2 * k], sc1 = scale[2 * k + 1];
                for (int t = 0; t < nt; t++) {
                    const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                    if (k < Q8_K_LINES && t < next_nt)
                        prefetch_q8_K_line(token_block(xq, stride, (int)next_t0 + t, next_i), k);
                    const int8_t *aq = a->qs + 32 * k;
                    __m256i s16[4];  /* words 2u, 2u + 1: group 2k + u / 2 */
                    for (int u = 0; u < 4; u++) {
                        int32_t w0, w1;
                        memcpy(&w0, aq + 8 * u, 4);
                        memcpy(&w1, aq + 8 * u + 4, 4);
                        s16[u] = _mm256_add_epi16(_mm256_maddubs_epi16(code[2 * u], _mm256_set1_epi32(w0)),
                                                  _mm256_maddubs_epi16(code[2 * u + 1], _mm256_set1_epi32(w1)));
                    }
                    const __m256i s = _mm256_add_epi32(
                        _mm256_add_epi32(_mm256_madd_epi16(s16[0], sc0), _mm256_madd_epi16(s16[1], sc0)),
                        _mm256_add_epi32(_mm256_madd_epi16(s16[2], sc1), _mm256_madd_epi16(s16[3], sc1)));
                    isum[t] = k ? _mm256_add_epi32(isum[t], s) : s;
                }
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                if (t0 + t < SLICES)
                    prefetch_slice(next, i, share, t0 + t, n_tokens < SLICES ? n_tokens : SLICES, stop);
                __m256i off = _mm256_setzero_si256();
                for (int p = 0; p < 8; p++) {
                    int32_t pair;  /* bsums 2p and 2p + 1, as the two int16 of a word */
                    memcpy(&pair, a->bsums + 2 * p, 4);
                    off = _mm256_add_epi32(off, _mm256_madd_epi16(bs_scale[p], _mm256_set1_epi32(pair)));
                }
                const __m256i block_isum = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(off, 5));
                chain[t0 + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_isum),
                                                _mm256_mul_ps(d_rows, _mm256_set1_ps(a->d)), chain[t0 + t]);
            }
        }
    }
}

/* The same for any number of tokens, SPAN at a time: y[t * ldy + r] for r < 8. The
 * chains wait between blocks in an array of their own, contiguous, rather than in y: y's
 * rows are a matrix's width apart (8 KiB for the 3B shape's ffn_down), so every token's
 * eight outputs fell in the same few sets of L1 and L2, and a sixth of the kernel's perf
 * samples sat on the store of each block's step. At the avx2 setting the 3B shape's
 * 512-token prefill took x0.91 of the time, its 8 and 16-token checks x0.95 (Zen 4, one
 * process, alternating). */
TARGET void sq_batch_dot8_q6_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                  int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    /* The chains of 512 tokens: 16 KiB. The engine's passes are 256 tokens at most
     * (engine.py's MAX_BATCH), so one span takes a whole pass; only a direct caller's
     * longer batch puts the blocks side by side again for each span. */
    enum { SPAN = 512 };
    __m256 chain[SPAN];
    for (int s0 = 0; s0 < n_tokens; s0 += SPAN) {
        const int ns = n_tokens - s0 < SPAN ? n_tokens - s0 : SPAN;
        batch_dot8_q6_K_span(rows, row_bytes, token_row(xq, stride, s0), stride, ns, nb, stop, chain);
        for (int t = 0; t < ns; t++)
            _mm256_storeu_ps(y + (s0 + t) * ldy, chain[t]);
    }
}

/* Q6_K times n_tokens activation rows (stride bytes apart), y[t * ldy] with sq_vec_dot's
 * bits for token t: per block each token's exact isum = sum(sc * q * qy) - 32 *
 * sum(sc * bsum) in int32 lanes, reduced eight tokens at a time by lane_totals into the
 * float lanes where those tokens' chains run. The 6-bit codes are assembled once per
 * block for a tile of tokens. */
TARGET void sq_batch_dot_q6_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                                 float *y, int64_t ldy) {
    enum { TILE = 16, GROUPS = TILE / 8 };
    const block_q6_K *x = row;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        __m256 sum[GROUPS];
        for (int g = 0; g < GROUPS; g++)
            sum[g] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            /* Chunk 4h + k holds elements 128h + 32k .. +32, groups 2(4h + k) and 2(4h + k) + 1. */
            __m256i q[8], scv[8];
            for (int h = 0; h < 2; h++) {
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
                q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
                q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
                q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
                q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
            }
            for (int j = 0; j < 8; j++)
                scv[j] = scale_halves(x[i].scales[2 * j], x[i].scales[2 * j + 1]);
            /* -32 * sc: |.| <= 4096, so its products with bsums (|.| <= 16 * 127) pair up in int32. */
            const __m256i minus32sc = _mm256_slli_epi16(
                _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales))), 5);
            const __m256 d = _mm256_set1_ps(h2f(x[i].d));
            for (int g = 0; 8 * g < nt; g++) {
                const int k = nt - 8 * g < 8 ? nt - 8 * g : 8, t = t0 + 8 * g;
                __m256i isum[8];
                for (int j = 0; j < k; j++) {
                    const block_q8_K *a = token_block(xq, stride, t + j, i);
                    __m256i acc = _mm256_madd_epi16(minus32sc, _mm256_loadu_si256((const __m256i *)a->bsums));
                    for (int c = 0; c < 8; c++) {
                        const __m256i qy = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * c));
                        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(scv[c], _mm256_maddubs_epi16(q[c], qy)));
                    }
                    isum[j] = acc;
                }
                const __m256 a_d = _mm256_castsi256_ps(token_words(xq, stride, t, k, i * (int64_t)sizeof(block_q8_K)));
                sum[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_totals(isum, k)), _mm256_mul_ps(d, a_d), sum[g]);
            }
        }
        float out[TILE];
        for (int g = 0; g < GROUPS; g++)
            _mm256_storeu_ps(out + 8 * g, sum[g]);
        for (int t = 0; t < nt; t++)
            y[(t0 + t) * ldy] = out[t];
    }
}

/* ---------------------------------------------------------------------------
 * Q5_K, IQ4_XS, Q3_K and Q2_K: eight rows side by side, from the file's layout
 * ------------------------------------------------------------------------- */

/* The 32 bytes at p + r * row_bytes of eight rows side by side: q[j] lane r holds bytes
 * 4j..4j+3 of row r's. */
static inline TARGET void super8_bytes32(const uint8_t *p, int64_t row_bytes, __m256i q[8]) {
    for (int r = 0; r < 8; r++)
        q[r] = _mm256_loadu_si256((const __m256i *)(p + r * row_bytes));
    sq_transpose8_epi32(q);
}

/* x shifted left by n bits, or right by -n: a bit of each byte moved to another place in
 * the same byte, once masked (what comes over from the neighbouring byte masked off). */
static inline __attribute__((always_inline)) TARGET __m256i super8_shift(__m256i x, int n) {
    return n > 0 ? _mm256_slli_epi16(x, n) : n < 0 ? _mm256_srli_epi16(x, -n) : x;
}

/* Byte a of each 32-bit lane in its low int16 and byte b in its high one (unsigned). */
static inline TARGET __m256i super8_bytes(__m256i x, int a, int b) {
    return _mm256_shuffle_epi8(x, lane_bytes_to_words(a, b));
}

/* A block of eight rows side by side, as super8_header reads it and super8_chunk decodes
 * its codes. scale[g]: each row's scale of group g (32 elements for Q5_K and IQ4_XS, 16
 * for Q3_K and Q2_K) in both int16 of its lane, for the madd that widens a group's int16
 * sums; pairs[p]: each row's multipliers of the activations' bsums 2p and 2p + 1 as two
 * int16 (Q5_K's and Q2_K's mins, Q3_K's offsets); bits: Q5_K's qh, Q3_K's hmask side by
 * side; span: the qs bytes that the chunks in hand take their codes from. */
typedef struct {
    __m256i scale[16], pairs[8], bits[8], span[8];
    __m256 d, dmin;
} super8_block;

/* Q5_K's first 16 bytes are Q4_K's: d and dmin, then the 6-bit scales and mins, unpacked
 * eight rows at once as k_scales_mins does one row's; then qh, the fifth bits. */
static inline __attribute__((always_inline)) TARGET void q5_K_header8(const uint8_t *block, int64_t row_bytes,
                                                                     super8_block *b) {
    const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f), top2 = _mm256_set1_epi8(0x30);
    __m256i w[4];
    words8_side_by_side(block, row_bytes, w);
    /* Byte g of each lane: the scales and mins of groups g (low) and 4 + g (high). */
    const __m256i sc_low = _mm256_and_si256(w[1], m6), mn_low = _mm256_and_si256(w[2], m6);
    const __m256i sc_high = _mm256_or_si256(_mm256_and_si256(w[3], m4), _mm256_and_si256(_mm256_srli_epi32(w[1], 2), top2));
    const __m256i mn_high = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w[3], 4), m4),
                                            _mm256_and_si256(_mm256_srli_epi32(w[2], 2), top2));
    for (int g = 0; g < 4; g++) {
        b->scale[g] = super8_bytes(sc_low, g, g);
        b->scale[g + 4] = super8_bytes(sc_high, g, g);
        b->pairs[g] = super8_bytes(mn_low, g, g);  /* group g's min, for both of its bsums */
        b->pairs[g + 4] = super8_bytes(mn_high, g, g);
    }
    halves_of_words(w[0], &b->d, &b->dmin);
    super8_bytes32(((const block_q5_K *)block)->qh, row_bytes, b->bits);
}

/* IQ4_XS: d and scales_h in word 0, scales_l in word 1; the scales s - 32, in -32..31. */
static inline __attribute__((always_inline)) TARGET void iq4_xs_header8(const uint8_t *block, int64_t row_bytes,
                                                                       super8_block *b) {
    __m256i w[4];
    words8_side_by_side(block, row_bytes, w);
    for (int g = 0; g < 8; g++) {
        /* the low four bits: nibble g of scales_l; the high two: bits 2g, 2g + 1 of scales_h */
        const __m256i s = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w[1], 4 * g), _mm256_set1_epi32(0x0f)),
                                          _mm256_and_si256(_mm256_srli_epi32(w[0], 12 + 2 * g), _mm256_set1_epi32(0x30)));
        const __m256i sc = _mm256_sub_epi32(s, _mm256_set1_epi32(32));
        b->scale[g] = _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(sc, 16));
    }
    __m256 unused;
    halves_of_words(w[0], &b->d, &unused);
}

/* Q3_K: the 12 bytes of scales read as the block's last 16 (qs's last two before them, d
 * after), nothing past the block. The codes q in -4..3 go to maddubs as q + 4 (0..7,
 * unsigned), so a group's products come out 4 sc times its bsum too large: pairs[p] holds
 * -4 sc of groups 2p and 2p + 1 (|.| <= 128), which takes that off exactly. */
static inline __attribute__((always_inline)) TARGET void q3_K_header8(const uint8_t *block, int64_t row_bytes,
                                                                     super8_block *b) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03), c32 = _mm256_set1_epi16(32);
    __m256i w[4], s[3];
    words8_side_by_side(block + sizeof(block_q3_K) - 16, row_bytes, w);
    for (int j = 0; j < 3; j++)  /* s[j] lane r: row r's scales bytes 4j..4j+3 */
        s[j] = _mm256_or_si256(_mm256_srli_epi32(w[j], 16), _mm256_slli_epi32(w[j + 1], 16));
    for (int k = 0; k < 4; k++) {
        /* u's bytes: groups 4k..4k+3's 6-bit codes, sc + 32. The low four bits: the low
         * nibbles of scales 0..7 for groups 0..7, their high nibbles for 8..15; the high two:
         * bits 2k, 2k + 1 of scales 8..11. */
        const __m256i low = k < 2 ? _mm256_and_si256(s[k], m4) : _mm256_and_si256(_mm256_srli_epi32(s[k - 2], 4), m4);
        const __m256i u = _mm256_or_si256(low, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(s[2], 2 * k), m2), 4));
        for (int g = 0; g < 4; g++)
            b->scale[4 * k + g] = _mm256_sub_epi16(super8_bytes(u, g, g), c32);
        for (int h = 0; h < 2; h++)  /* 4 (32 - (sc + 32)) = -4 sc */
            b->pairs[2 * k + h] = _mm256_slli_epi16(_mm256_sub_epi16(c32, super8_bytes(u, 2 * h, 2 * h + 1)), 2);
    }
    __m256 unused;
    halves_of_words(w[3], &unused, &b->d);
    super8_bytes32(((const block_q3_K *)block)->hmask, row_bytes, b->bits);
}

/* Q2_K: a scale (low nibble) and a min (high) per byte of scales; d and dmin at the end. */
static inline __attribute__((always_inline)) TARGET void q2_K_header8(const uint8_t *block, int64_t row_bytes,
                                                                     super8_block *b) {
    __m256i w[4];
    words8_side_by_side(block, row_bytes, w);
    for (int g = 0; g < 16; g++)
        b->scale[g] = _mm256_and_si256(super8_bytes(w[g / 4], g % 4, g % 4), _mm256_set1_epi16(0x0f));
    for (int p = 0; p < 8; p++)
        b->pairs[p] = _mm256_srli_epi16(super8_bytes(w[p / 2], 2 * (p % 2), 2 * (p % 2) + 1), 4);
    uint32_t dd[8];
    for (int r = 0; r < 8; r++)
        memcpy(&dd[r], block + r * row_bytes + offsetof(block_q2_K, d), 4);  /* d, dmin */
    halves_of_eight(dd, &b->d, &b->dmin);
}

static inline __attribute__((always_inline)) TARGET void super8_header(const int type, const uint8_t *block,
                                                                      int64_t row_bytes, super8_block *b) {
    if (type == SQ_Q5_K)
        q5_K_header8(block, row_bytes, b);
    else if (type == SQ_IQ4_XS)
        iq4_xs_header8(block, row_bytes, b);
    else if (type == SQ_Q3_K)
        q3_K_header8(block, row_bytes, b);
    else
        q2_K_header8(block, row_bytes, b);
}

/* Chunk k (elements 32k .. 32k + 31) of a block of eight rows side by side: code[j] lane r
 * holds row r's codes 32k + 4j .. +3 as unsigned bytes, and for IQ4_XS sgn[j] their grid
 * values with their signs (code = |sgn|, 1..127). Where the codes lie:
 *   Q5_K:   the low nibbles (even k) or high ones (odd k) of qs 16k .. (span: 32 bytes
 *           from qs + 32 (k / 2)), bit k of qh[l] (bits) as bit 4;
 *   IQ4_XS: group k's 16 bytes of qs, elements l < 16 in their low nibbles, 16 + l in their
 *           high ones (span as Q5_K's), looked up in the grid;
 *   Q2_K:   bits 2 (k % 4) of qs 32 (k / 4) ... (span: those 32 bytes, read at k % 4 == 0);
 *   Q3_K:   those, and bit k of hmask[l] (bits) as bit 2: q + 4 in 0..7. */
static inline __attribute__((always_inline)) TARGET void super8_chunk(const int type, const uint8_t *block,
                                                                     int64_t row_bytes, int k, super8_block *b,
                                                                     __m256i code[8], __m256i sgn[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    if (type == SQ_Q5_K || type == SQ_IQ4_XS) {
        const size_t qs = type == SQ_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_iq4_xs, qs);
        if (k % 2 == 0)
            super8_bytes32(block + qs + 16 * k, row_bytes, b->span);
    } else if (k % 4 == 0) {
        const size_t qs = type == SQ_Q3_K ? offsetof(block_q3_K, qs) : offsetof(block_q2_K, qs);
        super8_bytes32(block + qs + 8 * k, row_bytes, b->span);
    }
    if (type == SQ_Q5_K) {
        for (int j = 0; j < 8; j++) {
            const __m256i low = k % 2 ? _mm256_srli_epi16(b->span[j], 4) : b->span[j];
            code[j] = _mm256_or_si256(_mm256_and_si256(low, m4),
                                      _mm256_and_si256(super8_shift(b->bits[j], 4 - k), _mm256_set1_epi8(0x10)));
        }
    } else if (type == SQ_IQ4_XS) {
        const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid));
        for (int j = 0; j < 8; j++) {
            const __m256i q = b->span[4 * (k % 2) + j % 4];
            sgn[j] = _mm256_shuffle_epi8(grid, _mm256_and_si256(j < 4 ? q : _mm256_srli_epi16(q, 4), m4));
            code[j] = _mm256_abs_epi8(sgn[j]);
        }
    } else {
        for (int j = 0; j < 8; j++) {
            code[j] = _mm256_and_si256(_mm256_srli_epi16(b->span[j], 2 * (k % 4)), m2);
            if (type == SQ_Q3_K)
                code[j] = _mm256_or_si256(code[j], _mm256_and_si256(super8_shift(b->bits[j], 2 - k), _mm256_set1_epi8(4)));
        }
    }
}

/* Chunk k's products for one token (aq: its 32 activation codes, -127..127) against eight
 * rows' codes (super8_chunk), each row's group sums times their scales, in int32: s_lo
 * scales words 0..3 (codes 0..15), s_hi words 4..7 (the one group's scale in both for
 * Q5_K and IQ4_XS, whose groups are 32 codes). The unsigned codes' products go to
 * int16 four maddubs at a time, at most 4 * 2 * 31 * 127 = 31496 (Q5_K; Q3_K's 0..7
 * 7112, Q2_K's 0..3 3048), then madd by the scale widens them. IQ4_XS's signed grid values
 * go as |v| times sign(a, v), at most 2 * 127 * 127 = 32258 in a pair: one maddubs to each
 * madd. */
static inline __attribute__((always_inline)) TARGET __m256i super8_products(const int type, const int8_t *aq,
                                                                           const __m256i code[8], const __m256i sgn[8],
                                                                           __m256i s_lo, __m256i s_hi) {
    if (type == SQ_IQ4_XS) {
        __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
        for (int j = 0; j < 8; j += 2) {
            const __m256i p0 = _mm256_maddubs_epi16(code[j], _mm256_sign_epi8(word8(aq + 4 * j), sgn[j]));
            const __m256i p1 = _mm256_maddubs_epi16(code[j + 1], _mm256_sign_epi8(word8(aq + 4 * j + 4), sgn[j + 1]));
            even = _mm256_add_epi32(even, _mm256_madd_epi16(p0, s_lo));
            odd = _mm256_add_epi32(odd, _mm256_madd_epi16(p1, s_lo));
        }
        return _mm256_add_epi32(even, odd);
    }
    __m256i p[8];
    for (int j = 0; j < 8; j++)
        p[j] = _mm256_maddubs_epi16(code[j], word8(aq + 4 * j));
    const __m256i lo = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
    const __m256i hi = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
    return _mm256_add_epi32(_mm256_madd_epi16(lo, s_lo), _mm256_madd_epi16(hi, s_hi));
}

/* The sum over p of pairs[p]'s two int16 times bsums 2p and 2p + 1 (each |.| <= 16 * 127). */
static inline __attribute__((always_inline)) TARGET __m256i super8_bsums(const __m256i pairs[8], const int16_t *bsums) {
    __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
    for (int p = 0; p < 8; p += 2) {
        even = _mm256_add_epi32(even, _mm256_madd_epi16(pairs[p], word8(bsums + 2 * p)));
        odd = _mm256_add_epi32(odd, _mm256_madd_epi16(pairs[p + 1], word8(bsums + 2 * p + 2)));
    }
    return _mm256_add_epi32(even, odd);
}

/* Eight rows of a type of 256-element blocks with Q8_K activations (Q5_K, IQ4_XS, Q3_K,
 * Q2_K), row_bytes apart in the file's layout, times n_tokens activation rows, each output
 * the scalar definition's bits for its row and token (quants/types.h), with the rows in
 * the lanes as sq_batch_dot8_q4_K_avx2 has them: per block a header of the eight rows side
 * by side (super8_header: scales, the pairs that meet the bsums, d and dmin), then eight
 * chunks of 32 codes (super8_chunk), each kept in registers while the tile's tokens go by,
 * each token's isum waiting in memory for the block's last chunk. Q3_K's offsets start the
 * isum (taken off through the bsums); Q5_K's and Q2_K's mins, through the bsums too, take
 * the second chain's block step at the block's end. y = sum, or sum - off. A block costs
 * its transposes once for the tile, a token a maddubs per four codes of eight rows. The
 * next eight rows' bytes are asked of memory up to stop, a piece per chunk; each token's
 * next block a block ahead. y[t * ldy + r] for r < 8. */
static inline __attribute__((always_inline)) TARGET void rows8_super(const int type, const uint8_t *rows,
                                                                    int64_t row_bytes, const void *xq, int64_t stride,
                                                                    int n_tokens, int64_t nb, const void *stop,
                                                                    float *y, int64_t ldy) {
    enum { TILE = 64 };
    const int mins = type == SQ_Q5_K || type == SQ_Q2_K, groups16 = type == SQ_Q3_K || type == SQ_Q2_K;
    const int64_t bytes = sq_block_size(type);
    const uint8_t *next = rows + 8 * row_bytes;
    const int64_t piece = 8 * row_bytes / (nb > 0 ? 8 * nb : 1);
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        __m256 sum[TILE], off[TILE];
        __m256i isum[TILE];
        for (int t = 0; t < nt; t++)
            sum[t] = off[t] = opaque_zero8();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *block = rows + i * bytes;
            super8_block b;
            super8_header(type, block, row_bytes, &b);
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                if (i + 1 < nb)
                    prefetch_block_q8_K(a + 1);
                isum[t] = type == SQ_Q3_K ? super8_bsums(b.pairs, a->bsums) : _mm256_setzero_si256();
            }
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {  /* unrolled: each chunk's shifts are its own */
                if (t0 == 0)
                    prefetch_next_rows(next, 8 * i + k, piece, stop);
                __m256i code[8], sgn[8];
                super8_chunk(type, block, row_bytes, k, &b, code, sgn);
                const __m256i s_lo = b.scale[groups16 ? 2 * k : k], s_hi = b.scale[groups16 ? 2 * k + 1 : k];
                for (int t = 0; t < nt; t++) {
                    const int8_t *aq = token_block(xq, stride, t0 + t, i)->qs + 32 * k;
                    isum[t] = _mm256_add_epi32(isum[t], super8_products(type, aq, code, sgn, s_lo, s_hi));
                }
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                const __m256 a_d = _mm256_set1_ps(a->d);
                sum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(b.d, a_d), sum[t]);
                if (mins)
                    off[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(super8_bsums(b.pairs, a->bsums)), _mm256_mul_ps(b.dmin, a_d),
                                             off[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + (t0 + t) * ldy, mins ? _mm256_sub_ps(sum[t], off[t]) : sum[t]);
    }
}

#define ROWS8_SUPER_ENTRY(name, TYPE)                                                                               \
    TARGET void sq_steps_dot8_##name##_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,     \
                                            int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {     \
        rows8_super(TYPE, rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy);                                   \
    }

ROWS8_SUPER_ENTRY(q5_K, SQ_Q5_K)
ROWS8_SUPER_ENTRY(iq4_xs, SQ_IQ4_XS)
ROWS8_SUPER_ENTRY(q3_K, SQ_Q3_K)
ROWS8_SUPER_ENTRY(q2_K, SQ_Q2_K)

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_avx2_unused;
#endif
