/* quants/x86/step_order.h: the products of a few tokens (a lookup draft's check, a batch
 * smaller than a prompt's), each output with the scalar definition's bits for its row and
 * token (quants/types.h): per block one exact integer per (row, token), then that pair's
 * block step, in block order. A float lane holds one (row, token) pair: here a token, for
 * one row (dotn), or a row, for eight side by side (steps_dot8). Part of x86/avx2.c,
 * after vec_dots.h and side_by_side.h; the "avx512vnni" setting takes them too, for a
 * matrix left in the file's layout.
 */
#ifndef SMOLQ_QUANTS_X86_STEP_ORDER_H
#define SMOLQ_QUANTS_X86_STEP_ORDER_H

/* ---------------------------------------------------------------------------
 * A few activation rows times one weight row
 * ------------------------------------------------------------------------- */

/* sq_vec_dotn_*: n activation rows (stride bytes apart, 1 <= n <= SQ_DOTN_MAX) times one
 * weight row, out[t] with sq_vec_dot's bits for token t. The block's codes are unpacked
 * once for the n; each token's products go into int32 lanes of its own, which
 * lane_totals reduces to one integer per (block, token) in the float lane of that pair's
 * block step. They prefetch as the vec_dots do, up to stop.
 *
 * sq_vec_dotn_<name>_avx2 from the body dotn_<name>, inlined for each n with n a constant:
 * then every token's sums stay in registers (a loop over a variable n kept them in
 * memory, and each block waited on a store and a load). */
_Static_assert(SQ_DOTN_MAX == 9, "DOTN_FOR_EACH_N has a case for each n up to SQ_DOTN_MAX, two registers of lanes hold them");
#define DOTN_CASE(name, k) case k: dotn_##name(row, xq, stride, k, nb, stop, out); break;
#define DOTN_FOR_EACH_N(name)                                                                        \
    TARGET void sq_vec_dotn_##name##_avx2(const void *row, const void *xq, int64_t stride, int n, int64_t nb, \
                                         const void *stop, float *out) {                           \
        switch (n) {                                                                                 \
            DOTN_CASE(name, 1) DOTN_CASE(name, 2) DOTN_CASE(name, 3) DOTN_CASE(name, 4)              \
            DOTN_CASE(name, 5) DOTN_CASE(name, 6) DOTN_CASE(name, 7) DOTN_CASE(name, 8)              \
            DOTN_CASE(name, 9)                                                                       \
        }                                                                                            \
    }

/* The tokens of a group, whose chains run in the lanes of one float register: n < 8 in
 * the first, or 8, then n - 8 in the second. */
#define DOTN_FIRST(n) ((n) < 8 ? (n) : 8)

/* Blocks taken together for a group of k tokens: as many as fill the eight lanes of one
 * lane_totals tree, lane b * k + t holding block b's integer for token t. (Q8_0 with 2
 * tokens and a tree per block ran a fifth slower than the float lanes of the kernels
 * before the definition; four blocks per tree share its shuffles and the gathering of
 * the scales, and run faster than those did.) */
#define DOTN_BLOCKS(k) ((k) == 1 ? 8 : (k) == 2 ? 4 : (k) <= 4 ? 2 : 1)

/* out[t] for t < n from the two groups' lanes. */
static inline TARGET void dotn_store(__m256 first, __m256 second, int n, float *out) {
    float all[16];
    _mm256_storeu_ps(all, first);
    _mm256_storeu_ps(all + 8, second);
    memcpy(out, all, (size_t)n * sizeof(float));
}

/* Lane j: v's lane j / k, B values (one per block) spread over their k tokens' lanes. */
static inline __attribute__((always_inline)) TARGET __m256 dotn_spread(__m256 v, int k) {
    if (k >= 8)
        return _mm256_permutevar8x32_ps(v, _mm256_setzero_si256());
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0 / k, 1 / k, 2 / k, 3 / k, 4 / k, 5 / k, 6 / k, 7 / k));
}

/* v's lanes b * k .. b * k + k - 1 moved down to lanes 0 .. k - 1. */
static inline __attribute__((always_inline)) TARGET __m256 dotn_lanes(__m256 v, int k, int b) {
    if (b == 0)
        return v;
    const int s = b * k;
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(s & 7, (s + 1) & 7, (s + 2) & 7, (s + 3) & 7, (s + 4) & 7,
                                                         (s + 5) & 7, (s + 6) & 7, (s + 7) & 7));
}

/* The block steps of B blocks for k tokens (isum and d in lanes b * k + t): each token's
 * chain, in lane t of sum, takes its blocks in order. */
static inline __attribute__((always_inline)) TARGET __m256 dotn_steps(__m256 sum, __m256 isum, __m256 d, int k, int B) {
    for (int b = 0; b < B; b++)
        sum = _mm256_fmadd_ps(dotn_lanes(isum, k, b), dotn_lanes(d, k, b), sum);
    return sum;
}

/* Q4_1, blocks x[0 .. B - 1] (block i onwards of the row) for tokens t0 .. t0 + k - 1:
 * sum = fma(isum, d * dy, sum) and off = fma(m, sy, off) per block, in the tokens' lanes. */
static inline __attribute__((always_inline)) TARGET void dotn_q4_1_blocks(const block_q4_1 *x, const void *xq,
                                                                          int64_t stride, int t0, const int k,
                                                                          const int B, int64_t i, __m256 *sum,
                                                                          __m256 *off) {
    __m256i p[8];
    for (int b = 0; b < B; b++) {
        const __m256i qx = nibbles32(x[b].qs);
        for (int t = 0; t < k; t++) {
            const block_q8_1 *y = (const block_q8_1 *)token_row(xq, stride, t0 + t) + i + b;
            p[b * k + t] = dot_us8(qx, _mm256_loadu_si256((const __m256i *)y->qs));
        }
    }
    const int64_t at = i * (int64_t)sizeof(block_q8_1);
    const __m256 dy = pair_halves(xq, stride, t0, k, B, at, sizeof(block_q8_1));
    const __m256 sy = pair_halves(xq, stride, t0, k, B, at + 2, sizeof(block_q8_1));
    __m256 dx, m;  /* each lane's block's d and m */
    if (B == 1) {
        const __m128 dm = h2f_pair(&x->d);
        dx = _mm256_broadcastss_ps(dm);
        m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    } else {
        dx = dotn_spread(pair_halves(x, 0, 0, 1, B, 0, sizeof *x), k);
        m = dotn_spread(pair_halves(x, 0, 0, 1, B, 2, sizeof *x), k);
    }
    const __m256 d = _mm256_mul_ps(dx, dy);
    *sum = dotn_steps(*sum, _mm256_cvtepi32_ps(lane_totals(p, B * k)), d, k, B);
    *off = dotn_steps(*off, m, sy, k, B);
}

static inline __attribute__((always_inline)) TARGET void dotn_q4_1(const void *row, const void *xq, int64_t stride,
                                                                   const int n, int64_t nb, const void *stop,
                                                                   float *out) {
    const block_q4_1 *x = row;
    const int B = DOTN_BLOCKS(DOTN_FIRST(n));
    __m256 sum0 = _mm256_setzero_ps(), off0 = sum0, sum1 = sum0, off1 = sum0;
    int64_t i = 0;
    for (; i + B <= nb; i += B) {
        prefetch_ahead(x + i, B * (int)sizeof *x, stop);
        dotn_q4_1_blocks(x + i, xq, stride, 0, DOTN_FIRST(n), B, i, &sum0, &off0);
        if (n > 8)
            dotn_q4_1_blocks(x + i, xq, stride, 8, n - 8, B, i, &sum1, &off1);
    }
    for (; i < nb; i++) {  /* the last nb % B */
        dotn_q4_1_blocks(x + i, xq, stride, 0, DOTN_FIRST(n), 1, i, &sum0, &off0);
        if (n > 8)
            dotn_q4_1_blocks(x + i, xq, stride, 8, n - 8, 1, i, &sum1, &off1);
    }
    dotn_store(_mm256_add_ps(sum0, off0), _mm256_add_ps(sum1, off1), n, out);
}
DOTN_FOR_EACH_N(q4_1)

/* Q8_0, blocks x[0 .. B - 1] (block i onwards of the row) for tokens t0 .. t0 + k - 1:
 * sum = fma(isum, d * dy, sum) per block, in the tokens' lanes. |x| once per block; each
 * token's y takes x's signs. */
static inline __attribute__((always_inline)) TARGET __m256 dotn_q8_0_blocks(const block_q8_0 *x, const void *xq,
                                                                            int64_t stride, int t0, const int k,
                                                                            const int B, int64_t i, __m256 sum) {
    __m256i p[8];
    for (int b = 0; b < B; b++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i ax = _mm256_sign_epi8(qx, qx);
        for (int t = 0; t < k; t++) {
            const block_q8_0 *y = (const block_q8_0 *)token_row(xq, stride, t0 + t) + i + b;
            p[b * k + t] = dot_us8(ax, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), qx));
        }
    }
    const __m256 dx = pair_halves(x, 0, 0, 1, B, 0, sizeof *x);
    const __m256 dy = pair_halves(xq, stride, t0, k, B, i * (int64_t)sizeof(block_q8_0), sizeof(block_q8_0));
    const __m256 d = _mm256_mul_ps(dotn_spread(dx, k), dy);
    return dotn_steps(sum, _mm256_cvtepi32_ps(lane_totals(p, B * k)), d, k, B);
}

static inline __attribute__((always_inline)) TARGET void dotn_q8_0(const void *row, const void *xq, int64_t stride,
                                                                   const int n, int64_t nb, const void *stop,
                                                                   float *out) {
    const block_q8_0 *x = row;
    const int B = DOTN_BLOCKS(DOTN_FIRST(n));
    __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
    int64_t i = 0;
    for (; i + B <= nb; i += B) {
        prefetch_ahead(x + i, B * (int)sizeof *x, stop);
        sum0 = dotn_q8_0_blocks(x + i, xq, stride, 0, DOTN_FIRST(n), B, i, sum0);
        if (n > 8)
            sum1 = dotn_q8_0_blocks(x + i, xq, stride, 8, n - 8, B, i, sum1);
    }
    for (; i < nb; i++) {  /* the last nb % B */
        sum0 = dotn_q8_0_blocks(x + i, xq, stride, 0, DOTN_FIRST(n), 1, i, sum0);
        if (n > 8)
            sum1 = dotn_q8_0_blocks(x + i, xq, stride, 8, n - 8, 1, i, sum1);
    }
    dotn_store(sum0, sum1, n, out);
}
DOTN_FOR_EACH_N(q8_0)

/* Q6_K: the 6-bit codes and the group scales of a block assembled once, half a block at
 * a time; a token's integer lanes stay in a register across the two halves, starting from the
 * -32 * sc * bsums that takes the codes' offset off. One group of up to eight tokens per
 * lane_totals tree: next to a Q6_K block's products, the tree costs little. */
static inline __attribute__((always_inline)) TARGET void dotn_q6_K(const void *row, const void *xq, int64_t stride,
                                                                   const int n, int64_t nb, const void *stop,
                                                                   float *out) {
    const block_q6_K *x = row;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        /* The scale of group 2j over the low 128 bits, of group 2j + 1 over the high. */
        const __m256i sc_pairs = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
        /* -32 * sc: |.| <= 4096, so its products with bsums (|.| <= 16 * 127) pair up in int32. */
        const __m256i minus32sc = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(sc8)), 5);
        __m256i sumi[SQ_DOTN_MAX];
        for (int t = 0; t < n; t++)
            sumi[t] = _mm256_madd_epi16(minus32sc, _mm256_loadu_si256((const __m256i *)token_block(xq, stride, t, i)->bsums));
        for (int h = 0; h < 2; h++) {
            /* q[c]: elements 128h + 32c .. +31, groups 8h + 2c (bytes 0..15) and 8h + 2c + 1. */
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
            for (int c = 0; c < 4; c++) {
                const __m256i scv = broadcast_word(sc_pairs, 4 * h + c);
                for (int t = 0; t < n; t++) {
                    const block_q8_K *a = token_block(xq, stride, t, i);
                    const __m256i qy = _mm256_loadu_si256((const __m256i *)(a->qs + 128 * h + 32 * c));
                    sumi[t] = madd_add(sumi[t], scv, _mm256_maddubs_epi16(q[c], qy));
                }
            }
        }
        const __m256 dx = _mm256_set1_ps(h2f(x[i].d));
        const int64_t at = i * (int64_t)sizeof(block_q8_K);  /* each token's d */
        sum0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_totals(sumi, DOTN_FIRST(n))),
                               _mm256_mul_ps(dx, _mm256_castsi256_ps(token_words(xq, stride, 0, DOTN_FIRST(n), at))), sum0);
        if (n > 8)
            sum1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_totals(sumi + 8, n - 8)),
                                   _mm256_mul_ps(dx, _mm256_castsi256_ps(token_words(xq, stride, 8, n - 8, at))), sum1);
    }
    dotn_store(sum0, sum1, n, out);
}
DOTN_FOR_EACH_N(q6_K)

/* The sum of the products of 32 activations with the nibbles of eight rows side by side
 * (nibble_pairs8's), exact in each row's int32 lane. */
static inline __attribute__((always_inline)) TARGET __m256i nibble_dot8(const int8_t *aq, const __m256i code[8]) {
    return _mm256_madd_epi16(nibble_pairs8(aq, code), _mm256_set1_epi16(1));
}

/* ---------------------------------------------------------------------------
 * Q4_1: eight rows side by side, in one-token steps
 * ------------------------------------------------------------------------- */

/* Block i of eight Q4_1 rows side by side: codes[l] holds the 4 codes of lane l (bytes
 * 4l..4l+3 in nibbles32's order) of rows 0..7, one row per 32-bit lane; d and m each row's. */
static inline TARGET void q4_1_side_by_side(const void *rows, int64_t row_bytes, int64_t i, __m256i codes[8],
                                          __m256 *d_rows, __m256 *m_rows) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i w[4];  /* the 4 words of qs of rows r and r + 4, in one register's halves */
    uint32_t dm[8];
    for (int r = 0; r < 8; r++) {
        const block_q4_1 *x = (const block_q4_1 *)((const uint8_t *)rows + r * row_bytes) + i;
        const __m128i q = _mm_loadu_si128((const __m128i *)x->qs);
        w[r % 4] = r < 4 ? _mm256_castsi128_si256(q) : _mm256_inserti128_si256(w[r % 4], q, 1);
        memcpy(&dm[r], &x->d, 4);  /* d, m */
    }
    __m256i word[4];  /* word j of rows 0..7 */
    transpose4_halves(w, word);
    for (int j = 0; j < 4; j++) {
        codes[j] = _mm256_and_si256(word[j], m4);                             /* low nibbles: lane j */
        codes[j + 4] = _mm256_and_si256(_mm256_srli_epi16(word[j], 4), m4);  /* high: lane j + 4 */
    }
    halves_of_eight(dm, d_rows, m_rows);
}

/* Eight Q4_1 rows (row_bytes apart) times n_tokens activation rows, each output with the
 * definition's bits for its row and token: the rows in the float lanes, and per block
 * their exact integers (nibble_dot8, a broadcast activation word multiplying eight rows
 * at once) and their two block steps. Block by block, the eight rows' codes are put side
 * by side in registers and each token of a tile of TILE runs through them, its two chains
 * waiting in sums and offs from block to block. A prompt's tiles of 128 tokens rather than
 * 16 put a row's blocks side by side an eighth as often (SmolLM2's rows times 512 tokens
 * 1.06-1.10x as fast, one thread); a few tokens keep the tile of 16 they had (8 tokens
 * measured x0.95-0.985 in the larger). (32 blocks at a time put side by side in memory
 * first, as this kernel did, made a SmolLM2 2-token check 1.12x as long, 8 tokens 1.04x,
 * its prefill the same: on Zen 4 at the avx2 setting, one process, alternating.) It
 * prefetches the eight rows after these, up to stop. y[t * ldy + r] for r < 8. */
static inline __attribute__((always_inline)) TARGET void steps_dot8_q4_1(const void *rows, int64_t row_bytes,
                                                                        const void *xq, int64_t stride, int n_tokens,
                                                                        int64_t nb, const void *stop, float *y,
                                                                        int64_t ldy, const int TILE) {
    enum { MAX_TILE = 128 };
    __m256 sums[MAX_TILE], offs[MAX_TILE];  /* a token's sum and off chains, a row per lane */
    const uint8_t *next = (const uint8_t *)rows + 8 * row_bytes;
    const int64_t share = 8 * (int64_t)sizeof(block_q4_1);  /* of the next rows, per block */
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        for (int t = 0; t < nt; t++)
            sums[t] = offs[t] = opaque_zero8();
        for (int64_t i = 0; i < nb; i++) {
            if (t0 == 0)
                prefetch_next_rows(next, i, share, stop);
            __m256i codes[8];
            __m256 d_rows, m_rows;
            q4_1_side_by_side(rows, row_bytes, i, codes, &d_rows, &m_rows);
            for (int t = 0; t < nt; t++) {
                const block_q8_1 *a = (const block_q8_1 *)((const uint8_t *)xq + (t0 + t) * stride) + i;
                const __m128 ds = h2f_pair(&a->d);  /* the token's d, s */
                const __m256i isum = nibble_dot8(a->qs, codes);
                sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_rows, _mm256_broadcastss_ps(ds)),
                                          sums[t]);
                offs[t] = _mm256_fmadd_ps(m_rows, _mm256_broadcastss_ps(_mm_movehdup_ps(ds)), offs[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + (t0 + t) * ldy, _mm256_add_ps(sums[t], offs[t]));
    }
}

/* A Q4_1 kernel's entry: a prompt's tokens in tiles of 128, a few in a tile of 16 (see
 * steps_dot8_q4_1). */
#define Q4_1_TILES(entry, kernel)                                                                               \
    TARGET void entry(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,       \
                      int64_t nb, const void *stop, float *y, int64_t ldy) {                                   \
        if (n_tokens > 16)                                                                                      \
            kernel(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 128);                               \
        else                                                                                                    \
            kernel(rows, row_bytes, xq, stride, n_tokens, nb, stop, y, ldy, 16);                                \
    }
Q4_1_TILES(sq_steps_dot8_q4_1_avx2, steps_dot8_q4_1)

/* Sixteen Q4_1 rows (row_bytes apart) times n_tokens activation rows (a prompt's or a
 * draft check's, eight on), each output with the definition's bits for its row and token,
 * as steps_dot8_q4_1 gives them for eight, but each broadcast activation word meets both
 * eights of rows (words4_16): per block, the tile's tokens go by the first four words of
 * codes of the sixteen rows (elements 0..15), their int16 sums parked (part), then by the
 * last four, each token's sums finished (together within int16, as nibble_pairs8's) into
 * int32 where they were parked; then each token's two block steps for both eights, its d
 * and s converted once. Eight rows at a time took one broadcast per vpmaddubsw, and on Zen
 * 4 the broadcasts take slots of the vector pipes; the steps in the codes' second pass
 * pushed codes out of registers (4% slower). There, at the avx2 setting, in one process
 * alternating with the eight-row kernel, SmolLM2's 512-token prefill took x0.87 of the
 * time, its 8- and 16-token checks x0.96 and x0.92. y[t * ldy + r] for r < 16; the
 * sixteen rows after these asked for ahead, up to stop. */
static inline __attribute__((always_inline)) TARGET void steps_dot16_q4_1(const void *rows, int64_t row_bytes,
                                                                         const void *xq, int64_t stride,
                                                                         int n_tokens, int64_t nb, const void *stop,
                                                                         float *y, int64_t ldy, const int TILE) {
    enum { MAX_TILE = 128 };
    __m256 sums[MAX_TILE][2], offs[MAX_TILE][2];  /* a token's chains, for rows 0..7 and 8..15 */
    __m256i part[MAX_TILE][2];  /* a token's int16 sums of the block's first sixteen codes, then its integers */
    const uint8_t *next = (const uint8_t *)rows + 16 * row_bytes;
    const int64_t share = 16 * (int64_t)sizeof(block_q4_1);  /* of the next rows, per block */
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        for (int t = 0; t < nt; t++)
            for (int h = 0; h < 2; h++)
                sums[t][h] = offs[t][h] = opaque_zero8();
        for (int64_t i = 0; i < nb; i++) {
            if (t0 == 0)
                prefetch_next_rows(next, i, share, stop);
            __m256i codes[2][8], words[8];
            __m256 d_rows[2], m_rows[2];
            for (int h = 0; h < 2; h++)
                q4_1_side_by_side((const uint8_t *)rows + 8 * h * row_bytes, row_bytes, i, codes[h], &d_rows[h],
                                  &m_rows[h]);
            for (int j = 0; j < 8; j++)  /* words 0..3 of both eights: the low nibbles */
                words[j] = codes[j / 4][j % 4];
            for (int t = 0; t < nt; t++)
                words4_16(((const block_q8_1 *)token_row(xq, stride, t0 + t) + i)->qs, words, part[t]);
            for (int j = 0; j < 8; j++)  /* then the high nibbles, elements 16.. */
                words[j] = codes[j / 4][4 + j % 4];
            for (int t = 0; t < nt; t++) {
                const block_q8_1 *a = (const block_q8_1 *)token_row(xq, stride, t0 + t) + i;
                __m256i s[2];
                words4_16(a->qs + 16, words, s);
                for (int h = 0; h < 2; h++)
                    part[t][h] = _mm256_madd_epi16(_mm256_add_epi16(s[h], part[t][h]), _mm256_set1_epi16(1));
            }
            for (int t = 0; t < nt; t++) {
                const block_q8_1 *a = (const block_q8_1 *)token_row(xq, stride, t0 + t) + i;
                const __m128 ds = h2f_pair(&a->d);  /* the token's d, s */
                const __m256 d = _mm256_broadcastss_ps(ds), sm = _mm256_broadcastss_ps(_mm_movehdup_ps(ds));
                for (int h = 0; h < 2; h++) {
                    sums[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[t][h]), _mm256_mul_ps(d_rows[h], d), sums[t][h]);
                    offs[t][h] = _mm256_fmadd_ps(m_rows[h], sm, offs[t][h]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            for (int h = 0; h < 2; h++)
                _mm256_storeu_ps(y + (t0 + t) * ldy + 8 * h, _mm256_add_ps(sums[t][h], offs[t][h]));
    }
}

Q4_1_TILES(sq_steps_dot16_q4_1_avx2, steps_dot16_q4_1)

/* Eight Q4_K rows times n_tokens activation rows, each output with the definition's bits
 * for its row and token: per block one exact integer total for the codes and one for the
 * mins, each into its chain by one fma. The rows sit side by side as in
 * sq_batch_dot8_q4_K_avx2, which pays for putting them there once per block (about three
 * quarters of a one-token vec_dot per row, measured in L1); after that a token costs
 * under two fifths of one, because a lane holds a whole row and a group's 32 products
 * add up in int16 before its scale multiplies them. y[t * ldy + r] for r < 8. */
TARGET void sq_steps_dot8_q4_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                     int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    enum { TILE = 16 };
    __m256i codes[4][2][8], scale[8], mins[4];
    __m256 d_rows, dmin_rows;
    const uint8_t *next = (const uint8_t *)rows + 8 * row_bytes;  /* prefetched as these are read */
    const int64_t share = 8 * row_bytes / (nb > 0 ? nb : 1);
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        __m256 sumf[TILE], summ[TILE];
        for (int t = 0; t < nt; t++)
            sumf[t] = summ[t] = opaque_zero8();
        for (int64_t i = 0; i < nb; i++) {
            if (t0 == 0)
                prefetch_next_rows(next, i, share, stop);
            q4_K_side_by_side(rows, row_bytes, i, codes, scale, mins, &d_rows, &dmin_rows);
            /* Token by token: with the few tokens of a draft, keeping a group's codes in
             * registers across the tokens (as sq_batch_dot8_q4_K_avx2 does) measured slower. */
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                __m256i isum = _mm256_setzero_si256(), imin = _mm256_setzero_si256();
                for (int c = 0; c < 4; c++) {
                    isum = _mm256_add_epi32(isum, _mm256_add_epi32(q4_K_group8(a->qs + 64 * c, codes[c][0], scale[2 * c]),
                                                                   q4_K_group8(a->qs + 64 * c + 32, codes[c][1], scale[2 * c + 1])));
                    imin = _mm256_add_epi32(imin, q4_K_min8(a, c, mins[c]));
                }
                const __m256 a_d = _mm256_set1_ps(a->d);
                sumf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_rows, a_d), sumf[t]);
                summ[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin_rows, a_d), summ[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + (t0 + t) * ldy, _mm256_sub_ps(sumf[t], summ[t]));
    }
}

#endif
