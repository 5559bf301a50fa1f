/* flash_attention.c: attention over the compact KV caches (F16, Q8_0) in one pass.
 *
 * The F32 cache keeps llama.cpp's exact order (attention.c): a score row as long as the
 * context, a softmax over it, then the weighted sum. The compact caches take this path
 * instead, which never holds more than a block of scores:
 *  - keys go by in blocks of KEY_BLOCK, scored by every query row that sees them;
 *  - each row keeps a running max, sum and weighted sum of V rows (an online softmax:
 *    when the max grows, what was summed so far is rescaled);
 *  - every KEY_CHUNK keys that partial result is closed and merged, chunk by chunk in
 *    order, into the row's total.
 * Decode (one token) past the first chunk hands the chunks of each KV head to the pool's
 * threads and merges them after; a prefill (and a step within the first chunk) gives each
 * thread (query block, KV head) tasks, and a row skips the key blocks past its own
 * position. Since chunks are fixed spans of keys and every row's arithmetic is the same
 * whichever way the work is shared, a token's output does not depend on the batch it came
 * in, the thread count or the SIMD path.
 *
 * A key block's scores are dot products in 8 lanes (lane l sums the products of the
 * dimensions d = l mod 8, one fma chain in order of d), the lanes then added as a
 * register reduction; keys are read straight from the cache. Then each row's online
 * softmax, then the weighted V rows (each output one fma chain over the keys, in order),
 * from values widened once into scratch when many rows share them (prefill), straight
 * from the cache when few do (decode, a draft check). The AVX2 version runs those chains
 * in registers, up to four rows and eight keys or outputs at once, and asks memory for
 * the next keys and values ahead of use; the plain version runs the same chains one
 * value at a time, and both give the same bits (exp_le0 and the lane trees of max and
 * sum included). At the avx512vnni setting the block step of a task of many rows (a
 * prefill's, a long check's) goes to flash_attention_x16.c instead, with the keys in
 * pairs side by side (read in place, or widened once into scratch for all of the task's
 * rows): the same chains again, so the same bits.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "exp_ggml.h"
#include "flash_attention.h"
#include "pool.h"
#include "quants/blocks.h"
#include "quants/quants.h"
#include "simd.h"

enum {
    KEY_BLOCK = SQ_FLASH_KEY_BLOCK,  /* keys scored together (flash_attention.h) */
    KEY_CHUNK = 256,   /* keys of one partial softmax: what decode shares out between threads */
    QUERY_BLOCK = 16,  /* tokens of one prefill task */
    ROWS = 4,          /* query rows through a key block at once */
    /* A task's rows read a block's keys and values in place, converting them as they go
     * (a step's, a draft check's), or, when many share them (a prefill's), widen them once
     * into scratch for all. The AVX2 kernels read in place up to IN_PLACE_ROWS rows: a
     * check's task of four tokens of three query heads. At the avx512vnni setting, more
     * than X16_ROWS_FROM rows take the 512-bit kernels, which read whole blocks in place
     * up to X16_IN_PLACE_ROWS rows. Timed on Zen 4 (one process, alternating), SmolLM2's
     * checks of 3, 4 and 6 tokens (tasks of 6 and 9 rows) took x0.94-0.95 of the time in
     * place with the AVX2 kernels as widened with the 512-bit ones; of 8 and 16 tokens
     * (12 and 24 rows) x0.96-0.98 and x0.97 in place with the 512-bit ones; a 512-token
     * prefill (48 rows) x1.02, and steps and checks of 3 and 4 tokens x1.01-1.09, so those
     * keep theirs. */
    IN_PLACE_ROWS = 12,
    X16_ROWS_FROM = 8,
    X16_IN_PLACE_ROWS = 24,
};

/* Rows are widened into scratch padded with zeros to a multiple of 32 values, so the
 * kernels take any head_dim; the zeros add nothing to a score or an output. */
static size_t padded(int head_dim) { return ((size_t)head_dim + 31) / 32 * 32; }

static size_t max_rows(const sq_config *c) { return (size_t)QUERY_BLOCK * (size_t)(c->n_heads / c->n_kv_heads); }

static size_t n_chunks(int n_ctx) { return ((size_t)n_ctx + KEY_CHUNK - 1) / KEY_CHUNK; }

/* One thread's scratch. Rows are a task's query rows: row (t, g) is query head g of
 * the KV head's group, for the task's token t. */
typedef struct {
    float *k;          /* [KEY_BLOCK][hdp] the current key block's keys, widened in pairs (512-bit path) */
    float *v;          /* [KEY_BLOCK][hdp] the current key block's values, widened */
    float *lanes;      /* [ROWS][KEY_BLOCK][8] score lanes before their reduction */
    float *s;          /* [rows][KEY_BLOCK] scores, then weights, of the block */
    float *q;          /* [rows][hdp] the queries, scaled by 1/sqrt(head_dim) */
    float *m, *l;      /* [rows] the current chunk's running max and sum */
    float *o;          /* [rows][hdp] and weighted sum of V rows */
    float *c;          /* [rows] 512-bit path: the factor the online step leaves for the outputs */
    float *tm, *tl;    /* [rows] totals merged over the chunks so far */
    float *to;         /* [rows][hdp] */
} scratch;

/* The arrays the kernels stream through start on a cache line (64 bytes, 16 floats): a
 * 512-bit load that straddles two lines costs two. */
enum { LINE = 16, ALIGNED_ARRAYS = 5 };

size_t sq_flash_scratch_floats(const sq_config *c) {
    size_t hd = padded(c->head_dim), rows = max_rows(c);
    return 2 * KEY_BLOCK * hd + ROWS * KEY_BLOCK * 8 + rows * (KEY_BLOCK + 5 + 3 * hd) + ALIGNED_ARRAYS * LINE;
}

static float *line_up(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

static scratch carve(float *base, const sq_config *c) {
    size_t hd = padded(c->head_dim), rows = max_rows(c);
    scratch sc;
    sc.k = line_up(base); base = sc.k + KEY_BLOCK * hd;
    sc.v = line_up(base); base = sc.v + KEY_BLOCK * hd;
    sc.lanes = line_up(base); base = sc.lanes + ROWS * KEY_BLOCK * 8;
    sc.q = line_up(base); base = sc.q + rows * hd;
    sc.o = line_up(base); base = sc.o + rows * hd;
    sc.s = base; base += rows * KEY_BLOCK;
    sc.m = base; base += rows;
    sc.l = base; base += rows;
    sc.c = base; base += rows;
    sc.tm = base; base += rows;
    sc.tl = base; base += rows;
    sc.to = base;
    return sc;
}

size_t sq_flash_partials_floats(const sq_config *c) {
    return (size_t)c->n_heads * n_chunks(c->n_ctx) * (2 + padded(c->head_dim));
}

/* -- the arithmetic, plainly -------------------------------------------------------------- */

static inline float max2(float a, float b) { return a > b ? a : b; }

/* The max and the sum of 32 values as 4 registers of 8 lanes reduce them: the registers
 * (0 + 1) + (2 + 3), then the 8 lanes in sq_hsum8's order (simd.h). (Not sq_reduce32,
 * whose registers pair as (0 + 2) + (1 + 3): a different order, so a different sum.) */
static float max32(const float *x) {
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = max2(max2(x[i], x[i + 8]), max2(x[i + 16], x[i + 24]));
    const float a = max2(max2(t[0], t[4]), max2(t[2], t[6])), b = max2(max2(t[1], t[5]), max2(t[3], t[7]));
    return max2(a, b);
}

static float sum32(const float *x) {
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = (x[i] + x[i + 8]) + (x[i + 16] + x[i + 24]);
    return sq_hsum8(t);
}

/* One row's scores s[0..31] (the first `valid` count) into its chunk's running max m,
 * sum l and weighted sum o: s becomes the block's weights; o is rescaled to the new max
 * (or, at the chunk's first block, cleared) for the weighted V rows to be added. */
static void online_plain(float *s, size_t valid, float *m, float *l, float *o, size_t hdp) {
    for (size_t j = valid; j < KEY_BLOCK; j++) s[j] = -INFINITY;
    const int first = *m == -INFINITY;
    const float mx = max2(max32(s), *m);
    for (size_t j = 0; j < KEY_BLOCK; j++) s[j] = exp_le0(s[j] - mx);
    for (size_t j = valid; j < KEY_BLOCK; j++) s[j] = 0.0f;
    const float corr = first ? 0.0f : exp_le0(*m - mx);
    *l = (first ? 0.0f : *l * corr) + sum32(s);
    *m = mx;
    if (first)
        memset(o, 0, hdp * sizeof(float));
    else if (corr != 1.0f)
        for (size_t d = 0; d < hdp; d++) o[d] *= corr;
}

/* Element d of a cached row as a float (for Q8_0, its block's scale times its code). */
static float cached_value(const uint8_t *row, int kv_type, size_t d) {
    if (kv_type == SQ_F16) return sq_fp16_to_fp32(((const uint16_t *)row)[d]);
    const block_q8_0 *b = (const block_q8_0 *)row + d / QK8_0;
    return sq_fp16_to_fp32(b->d) * (float)b->qs[d % QK8_0];
}

/* s[r][j] = row r's query . key j for the block's nk keys (cache rows rb apart), in 8
 * lanes; scores past nk are 0 (the rows' masks drop them). */
static void scores_plain(const float *q, size_t n, size_t hdp, const uint8_t *k, int kv_type, size_t rb, size_t nk,
                         size_t head_dim, float *s) {
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < KEY_BLOCK; j++) {
            float lane[8] = {0};
            for (size_t d = 0; j < nk && d < head_dim; d += 8)
                for (size_t i = 0; i < 8; i++) {
                    const float x = d + i < head_dim ? cached_value(k + j * rb, kv_type, d + i) : 0.0f;
                    lane[i] = fmaf(q[r * hdp + d + i], x, lane[i]);
                }
            s[r * KEY_BLOCK + j] = sq_hsum8(lane);
        }
}

/* o[r] += sum_j s[r][j] v[j] over the block's first `most` keys (weights past a row's
 * own keys are 0, and adding 0 * (a finite value) changes nothing). */
static void weigh_plain(const float *s, size_t n, size_t most, const float *v, size_t hdp, float *o) {
    for (size_t r = 0; r < n; r++)
        for (size_t d = 0; d < hdp; d++) {
            float acc = o[r * hdp + d];
            for (size_t j = 0; j < most; j++) acc = fmaf(s[r * KEY_BLOCK + j], v[j * hdp + d], acc);
            o[r * hdp + d] = acc;
        }
}

/* nk rows of head_dim values from row `first` of a KV head's values into vb, padding
 * and rows past nk zeroed, so that masked lanes hold finite values. */
static void widen_plain(const uint8_t *v, int kv_type, size_t head_dim, size_t hdp, size_t first, size_t nk,
                        float *vb) {
    const size_t rb = sq_kv_row_bytes(kv_type, (int)head_dim);
    memset(vb, 0, hdp * KEY_BLOCK * sizeof(float));
    for (size_t j = 0; j < nk; j++)
        for (size_t d = 0; d < head_dim; d++) vb[j * hdp + d] = cached_value(v + (first + j) * rb, kv_type, d);
}

/* -- the same arithmetic on AVX2 ------------------------------------------------------------ */

#ifdef SQ_X86
SQ_AVX2 static inline __m256 exp_le0_v(__m256 x) {
    __m256 n;  /* within +-126 for every x held at -87 or above */
    return exp_ggml_near_v(_mm256_max_ps(_mm256_set1_ps(-87.0f), x), &n);  /* max_ps(a, b): a > b ? a : b, as above */
}

SQ_AVX2 static void online_avx2(float *s, size_t valid, float *m, float *l, float *o, size_t hdp) {
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), ninf = _mm256_set1_ps(-INFINITY);
    __m256 x[4], keep[4];
    for (int i = 0; i < 4; i++) {
        keep[i] = _mm256_cmp_ps(_mm256_add_ps(lane, _mm256_set1_ps((float)(8 * i))), _mm256_set1_ps((float)valid),
                                _CMP_LT_OQ);
        x[i] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * i), keep[i]);
    }
    const int first = *m == -INFINITY;
    const float mx = max2(sq_hmax8_avx2(_mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3]))), *m);
    const __m256 vmx = _mm256_set1_ps(mx);
    for (int i = 0; i < 4; i++) x[i] = _mm256_and_ps(exp_le0_v(_mm256_sub_ps(x[i], vmx)), keep[i]);
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(s + 8 * i, x[i]);
    const float corr = first ? 0.0f : exp_le0(*m - mx);
    *l = (first ? 0.0f : *l * corr) + sq_hsum8_avx2(_mm256_add_ps(_mm256_add_ps(x[0], x[1]), _mm256_add_ps(x[2], x[3])));
    *m = mx;
    if (first) {
        memset(o, 0, hdp * sizeof(float));
    } else if (corr != 1.0f) {
        const __m256 c = _mm256_set1_ps(corr);
        for (size_t d = 0; d < hdp; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), c));
    }
}

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Eight values from element d of a cached row as floats (d a multiple of 8; for Q8_0 the
 * scale times each code, as cached_value rounds them). */
SQ_AVX2 static ALWAYS_INLINE __m256 load8(const uint8_t *row, int kv_type, size_t d) {
    if (kv_type == SQ_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)));
    const block_q8_0 *b = (const block_q8_0 *)row + d / QK8_0;
    const __m256 codes = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + d % QK8_0))));
    const __m256 scale = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(b->d)));
    return _mm256_mul_ps(scale, codes);
}

/* The kernels below are written once for G query rows (1..ROWS) and one source of values
 * (SQ_F16 or SQ_Q8_0 cache rows, or WIDE: floats widened into scratch), and inlined for
 * each as constants, so a row that is not there costs no fma and no branch is left in an
 * inner loop. Each keeps about eight fma chains in flight (an fma waits four cycles for
 * the one before it in its chain, and two start per cycle) in at most 13 registers. */
enum { WIDE = -1 };

/* Keys scored, or groups of 8 outputs summed, together by G rows: G times this chains. */
#define AT_ONCE(G) ((G) == 1 ? 8 : (G) == 2 ? 4 : (G) == 3 ? 3 : 2)

/* Eight values from element d of a value row j: widened floats (hdp apart) or a cache row. */
SQ_AVX2 static ALWAYS_INLINE __m256 value8(const void *v, const int SRC, size_t row_bytes, size_t hdp, size_t j,
                                        size_t d) {
    if (SRC == WIDE) return _mm256_loadu_ps((const float *)v + j * hdp + d);
    return load8((const uint8_t *)v + j * row_bytes, SRC, d);
}

/* Lanes of keys j..j+KP-1 (j + KP <= nk) for G rows: scores_plain's chains, in order of d. */
SQ_AVX2 static ALWAYS_INLINE void score_keys(const float *q, size_t hdp, const uint8_t *k, size_t rb, size_t head_dim,
                                          size_t j, float *lanes, const int KV, const int G, const int KP, const int HOLD) {
    __m256 acc[ROWS][8];
#pragma GCC unroll 4
    for (int r = 0; r < G; r++)
#pragma GCC unroll 8
        for (int i = 0; i < KP; i++) acc[r][i] = _mm256_setzero_ps();
    for (size_t d = 0; d < head_dim; d += 8) {
        __m256 w[ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < G; r++) {
            w[r] = _mm256_loadu_ps(q + r * hdp + d);
            /* HOLD: the query stays in its register for the KP keys. Left alone, the compiler
             * folds it into each fma as a load of its own: G * KP loads of q per step instead
             * of G, and a prefill's attention took 12-15% longer. (A decode step reads its
             * keys from memory: held, it was no faster, SmolLM2's up to a tenth slower.) */
            if (HOLD) __asm__("" : "+x"(w[r]));
        }
#pragma GCC unroll 8
        for (int i = 0; i < KP; i++) {
            const __m256 x = load8(k + (j + i) * rb, KV, d);
#pragma GCC unroll 4
            for (int r = 0; r < G; r++) acc[r][i] = _mm256_fmadd_ps(w[r], x, acc[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < G; r++)
#pragma GCC unroll 8
        for (int i = 0; i < KP; i++) _mm256_storeu_ps(lanes + (r * KEY_BLOCK + j + i) * 8, acc[r][i]);
}

/* The block's lanes for G rows, KP keys at a time and the last few one by one; lanes of
 * keys past nk are 0. The first pf_bytes bytes from pf_a and (unless NULL) pf_b are
 * prefetched a slice per step, into L1 or (into_l1 0) L2 only: see block_step. */
SQ_AVX2 static ALWAYS_INLINE void score_block(const float *q, size_t hdp, const uint8_t *k, size_t rb, size_t nk,
                                           size_t head_dim, float *lanes, const uint8_t *pf_a, const uint8_t *pf_b,
                                           size_t pf_bytes, int into_l1, const int KV, const int G, const int HOLD) {
    const int KP = AT_ONCE(G);
    for (size_t j = 0; j < KEY_BLOCK; j += KP) {
        const size_t end = (j + KP) * pf_bytes / KEY_BLOCK;
        sq_flash_prefetch(pf_a, pf_b, j * pf_bytes / KEY_BLOCK, end < pf_bytes ? end : pf_bytes, into_l1);
        if (j + KP <= nk) {
            score_keys(q, hdp, k, rb, head_dim, j, lanes, KV, G, KP, HOLD);
            continue;
        }
        for (size_t i = j; i < j + KP && i < KEY_BLOCK; i++) {  /* the block's last keys, one by one */
            if (i < nk) {
                score_keys(q, hdp, k, rb, head_dim, i, lanes, KV, G, 1, HOLD);
                continue;
            }
            for (int r = 0; r < G; r++) _mm256_storeu_ps(lanes + (r * KEY_BLOCK + i) * 8, _mm256_setzero_ps());
        }
    }
}

/* Each row's lanes added in sq_hsum8's order, eight keys at once. */
SQ_AVX2 static void reduce_lanes(const float *lanes, size_t g, float *s) {
    for (size_t r = 0; r < g; r++)
        for (size_t j0 = 0; j0 < KEY_BLOCK; j0 += 8) {
            __m256 c[8];
            for (size_t i = 0; i < 8; i++) c[i] = _mm256_loadu_ps(lanes + (r * KEY_BLOCK + j0 + i) * 8);
            sq_transpose8(c);
            const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c[0], c[4]), _mm256_add_ps(c[2], c[6])),
                                             _mm256_add_ps(_mm256_add_ps(c[1], c[5]), _mm256_add_ps(c[3], c[7])));
            _mm256_storeu_ps(s + r * KEY_BLOCK + j0, sum);
        }
}

/* scores_plain's scores for n rows (head_dim a multiple of 8), ROWS rows at a time; the
 * queries held in registers where more than ROWS rows share the block (a check's, a
 * prefill's); the prefetches into L1 or L2 as into_l1 says. */
SQ_AVX2 static void scores_avx2(const float *q, size_t n, size_t hdp, const uint8_t *k, int kv_type, size_t rb,
                             size_t nk, size_t head_dim, float *lanes, float *s, const uint8_t *pf_a,
                             const uint8_t *pf_b, size_t pf_bytes, int into_l1) {
    const int hold = n > ROWS;
    for (size_t r0 = 0; r0 < n; r0 += ROWS) {
        const size_t g = n - r0 < ROWS ? n - r0 : ROWS, pf = r0 ? 0 : pf_bytes;  /* the first pass prefetches */
        const float *qr = q + r0 * hdp;
#define SCORE_AS(G, KV, HOLD) score_block(qr, hdp, k, rb, nk, head_dim, lanes, pf_a, pf_b, pf, into_l1, KV, G, HOLD)
#define SCORE(G)                                                                   \
    (kv_type == SQ_F16 ? (hold ? SCORE_AS(G, SQ_F16, 1) : SCORE_AS(G, SQ_F16, 0)) \
                       : (hold ? SCORE_AS(G, SQ_Q8_0, 1) : SCORE_AS(G, SQ_Q8_0, 0)))
        SQ_FOR_GROUP_OF_ROWS(g, SCORE)
#undef SCORE
#undef SCORE_AS
        reduce_lanes(lanes, g, s + r0 * KEY_BLOCK);
    }
}

/* Outputs d..d+8W-1 of G rows: weigh_plain's chains, one per output, in order of j. */
SQ_AVX2 static ALWAYS_INLINE void weigh_outs(const float *s, size_t most, const void *v, size_t row_bytes, size_t hdp,
                                          float *o, size_t d, const int SRC, const int G, const int W) {
    __m256 acc[ROWS][8];
#pragma GCC unroll 4
    for (int r = 0; r < G; r++)
#pragma GCC unroll 8
        for (int i = 0; i < W; i++) acc[r][i] = _mm256_loadu_ps(o + r * hdp + d + 8 * i);
    for (size_t j = 0; j < most; j++) {
        __m256 w[ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < G; r++) w[r] = _mm256_broadcast_ss(s + r * KEY_BLOCK + j);
#pragma GCC unroll 8
        for (int i = 0; i < W; i++) {
            const __m256 x = value8(v, SRC, row_bytes, hdp, j, d + 8 * i);
#pragma GCC unroll 4
            for (int r = 0; r < G; r++) acc[r][i] = _mm256_fmadd_ps(w[r], x, acc[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < G; r++)
#pragma GCC unroll 8
        for (int i = 0; i < W; i++) _mm256_storeu_ps(o + r * hdp + d + 8 * i, acc[r][i]);
}

SQ_AVX2 static ALWAYS_INLINE void weigh_rows(const float *s, size_t most, const void *v, size_t row_bytes,
                                          size_t width, size_t hdp, float *o, const int SRC, const int G) {
    const int W = AT_ONCE(G);
    size_t d = 0;
    for (; d + 8 * (size_t)W <= width; d += 8 * (size_t)W) weigh_outs(s, most, v, row_bytes, hdp, o, d, SRC, G, W);
    for (; d < width; d += 8) weigh_outs(s, most, v, row_bytes, hdp, o, d, SRC, G, 1);
}

/* o[r] += sum_j s[r][j] v[j] for n rows over the block's first `most` keys, the values
 * widened (row_bytes 0) or read straight from the cache. */
SQ_AVX2 static void weigh_avx2(const float *s, size_t n, size_t most, const void *v, int kv_type, size_t row_bytes,
                            size_t width, size_t hdp, float *o) {
    for (size_t r0 = 0; r0 < n; r0 += ROWS) {
        const size_t g = n - r0 < ROWS ? n - r0 : ROWS;
        const float *sr = s + r0 * KEY_BLOCK;
        float *orow = o + r0 * hdp;
#define WEIGH(G)                                                                      \
    (!row_bytes ? weigh_rows(sr, most, v, 0, width, hdp, orow, WIDE, G)               \
     : kv_type == SQ_F16 ? weigh_rows(sr, most, v, row_bytes, width, hdp, orow, SQ_F16, G) \
                         : weigh_rows(sr, most, v, row_bytes, width, hdp, orow, SQ_Q8_0, G))
        SQ_FOR_GROUP_OF_ROWS(g, WEIGH)
#undef WEIGH
    }
}

SQ_AVX2 static void widen_avx2(const uint8_t *v, int kv_type, size_t head_dim, size_t hdp, size_t first, size_t nk,
                            float *vb) {
    const size_t rb = sq_kv_row_bytes(kv_type, (int)head_dim);
    for (size_t j = 0; j < KEY_BLOCK; j++) {
        float *dst = vb + j * hdp;
        if (j < nk)
            for (size_t d = 0; d < head_dim; d += 8) _mm256_storeu_ps(dst + d, load8(v + (first + j) * rb, kv_type, d));
        memset(dst + (j < nk ? head_dim : 0), 0, (hdp - (j < nk ? head_dim : 0)) * sizeof(float));
    }
}

/* The block's nk keys as floats for sq_flash_scores_x16, two keys side by side:
 * kw[(p * steps + s) * 16 + 8h + l] is element 8s + l of key 2p + h (steps = head_dim / 8),
 * and keys past nk are zeros, whose scores are 0 as scores_plain's are. */
SQ_AVX2 static void widen_key_pairs(const uint8_t *k, int kv_type, size_t rb, size_t head_dim, size_t nk, float *kw) {
    const size_t steps = head_dim / 8;
    for (size_t j = 0; j < KEY_BLOCK; j++) {
        float *dst = kw + (j / 2) * steps * 16 + (j % 2) * 8;
        for (size_t s = 0; s < steps; s++)
            _mm256_storeu_ps(dst + s * 16, j < nk ? load8(k + j * rb, kv_type, 8 * s) : _mm256_setzero_ps());
    }
}
#endif

/* -- chunks, merged --------------------------------------------------------------------------- */

/* A closed chunk (m, l, o) into a row's total (tm, tl, to), which starts empty (tm = -inf). */
SQ_TWIN void merge_into(float m, float l, const float *o, size_t hdp, float *tm, float *tl, float *to) {
    if (*tm == -INFINITY) {
        *tm = m, *tl = l;
        memcpy(to, o, hdp * sizeof(float));
        return;
    }
    const float mx = max2(m, *tm), a = exp_le0(*tm - mx), b = exp_le0(m - mx);
    *tl = *tl * a + l * b;
    *tm = mx;
    for (size_t d = 0; d < hdp; d++) to[d] = to[d] * a + o[d] * b;
}
/* The outputs' loop vectorizes in 8 lanes in the AVX2 copy (no fma: products and sum
 * rounded apart, as written, in both copies). */
SQ_COMPILED_TWICE(static, merge, merge_into, (float m, float l, const float *o, size_t hdp, float *tm, float *tl, float *to),
                  (m, l, o, hdp, tm, tl, to))

static void finish(float tl, const float *to, size_t head_dim, float *out) {
    const float inv = 1.0f / tl;
    for (size_t d = 0; d < head_dim; d++) out[d] = to[d] * inv;
}

/* -- tasks -------------------------------------------------------------------------------- */

typedef struct {
    const sq_config *c;
    const float *q;          /* [n_tok][n_heads * head_dim] */
    const uint8_t *k, *v;    /* this layer's [n_kv_heads][n_ctx][row] */
    int kv_type, n_tok, n_past;
    float *scratch;          /* [threads][sq_flash_scratch_floats] */
    float *partials;         /* decode: [n_heads][chunks][2 + hdp] (m, l, o) */
    float *out;              /* [n_tok][n_heads * head_dim] */
    int block;               /* a batch: tokens of one task, at most QUERY_BLOCK */
} flash_job;

/* Which code a task runs: the plain C, the AVX2 kernels, or those and the 512-bit
 * block step (flash_attention_x16.c). Asked once a task. */
enum { PLAIN, SIMD_256, SIMD_512 };

static int use_simd(void) {
#ifdef SQ_X86
    return !sq_simd_enabled() ? PLAIN : sq_simd_512() ? SIMD_512 : SIMD_256;
#else
    return PLAIN;
#endif
}

/* Rows r0..n_rows-1 of a task (tokens from t0) through the key block of nk keys at key
 * b0 (k: its first key's row; `end`: one past the task's last key): scores, each row's
 * online softmax, weighted values, the keys and values read in place or widened once
 * (IN_PLACE_ROWS says when). */
static void block_step(const flash_job *job, scratch *sc, const uint8_t *k, const uint8_t *vh, size_t b0, size_t nk,
                       size_t end, size_t r0, size_t n_rows, int t0, int simd) {
    const sq_config *c = job->c;
    const size_t hd = (size_t)c->head_dim, hdp = padded(c->head_dim), group = (size_t)(c->n_heads / c->n_kv_heads);
    const size_t rb = sq_kv_row_bytes(job->kv_type, c->head_dim), n = n_rows - r0;
    float *q = sc->q + r0 * hdp, *s = sc->s + r0 * KEY_BLOCK, *o = sc->o + r0 * hdp;
    size_t most = 0;
#ifndef SQ_X86
    (void)simd, (void)end; /* no SIMD path to choose, nor prefetches to bound, in this build */
#else
    const int fast = simd && hd % 8 == 0, x16 = fast && simd == SIMD_512 && n > X16_ROWS_FROM;
    const int in_place = x16 ? n <= X16_IN_PLACE_ROWS && nk == KEY_BLOCK && hdp == hd : fast && n <= IN_PLACE_ROWS;
    const int wide = x16 && !in_place, src = wide ? SQ_FLASH_WIDE : job->kv_type;
    /* This block's values (read next) and the next block's keys asked of memory while
     * the keys are scored (or widened): left to the hardware prefetchers, decode waits on
     * memory for half its time. Rows that read them in place (a decode step's, a draft
     * check's) ask for them into L2 only (prefetcht1): a request for L1 holds one of the
     * core's few line fill buffers until its line arrives, and with them all taken the
     * prefetches themselves stall; SmolLM2's decode at depth 8,000 went 8% faster with an
     * F16 cache, 20% with Q8_0, its checks of 4 and 8 tokens 1-2% (Zen 4, one process,
     * alternating). A prefill's rows, which widen them once for all, keep prefetcht0. */
    const uint8_t *next_keys = b0 + 2 * nk <= end ? k + nk * rb : NULL;
    if (x16) {
        if (wide) widen_key_pairs(k, job->kv_type, rb, hd, nk, sc->k);
        sq_flash_scores_x16(q, n, hdp, sc->k, k, src, rb, hd, s, vh + b0 * rb, next_keys, nk * rb);
    } else if (fast) {
        scores_avx2(q, n, hdp, k, job->kv_type, rb, nk, hd, sc->lanes, s, vh + b0 * rb, next_keys, nk * rb, !in_place);
    }
    else
#endif
        scores_plain(q, n, hdp, k, job->kv_type, rb, nk, hd, s);
    /* each row's online softmax over the keys it sees; the 512-bit step takes sixteen rows
     * at a time */
    for (size_t r1 = r0; r1 < n_rows; r1 += 16) {
        const size_t count = n_rows - r1 < 16 ? n_rows - r1 : 16;
        size_t valid[16];
        for (size_t i = 0; i < count; i++) {
            const size_t pos = (size_t)job->n_past + (size_t)t0 + (r1 + i) / group;
            valid[i] = pos - b0 + 1 < nk ? pos - b0 + 1 : nk;
            most = valid[i] > most ? valid[i] : most;
        }
#ifdef SQ_X86
        if (x16) {
            sq_flash_online_x16(sc->s + r1 * KEY_BLOCK, count, valid, sc->m + r1, sc->l + r1, sc->c + r1);
            continue;
        }
#endif
        for (size_t i = 0, r = r1; i < count; i++, r++) {
#ifdef SQ_X86
            if (simd)
                online_avx2(sc->s + r * KEY_BLOCK, valid[i], sc->m + r, sc->l + r, sc->o + r * hdp, hdp);
            else
#endif
                online_plain(sc->s + r * KEY_BLOCK, valid[i], sc->m + r, sc->l + r, sc->o + r * hdp, hdp);
        }
    }
#ifdef SQ_X86
    if (x16 && in_place) {
        sq_flash_weigh_x16(s, n, most, NULL, vh + b0 * rb, src, rb, hdp, o, sc->c + r0);
        return;
    }
    if (in_place) {
        weigh_avx2(s, n, most, vh + b0 * rb, job->kv_type, rb, hd, hdp, o);
        return;
    }
    if (fast)
        widen_avx2(vh, job->kv_type, hd, hdp, b0, nk, sc->v);
    else
#endif
        widen_plain(vh, job->kv_type, hd, hdp, b0, nk, sc->v);
#ifdef SQ_X86
    if (wide) {
        sq_flash_weigh_x16(s, n, most, sc->v, NULL, SQ_FLASH_WIDE, 0, hdp, o, sc->c + r0);
        return;
    }
    if (simd) {
        weigh_avx2(s, n, most, sc->v, job->kv_type, 0, hdp, hdp, o);
        return;
    }
#endif
    weigh_plain(s, n, most, sc->v, hdp, o);
}

/* The rows of tokens t0..t1-1 of KV head h: row (t, g) is query head h * group + g of
 * token t, which sees keys 0..n_past + t. With `only` >= 0 (decode) that chunk alone is
 * computed and left in the partials; otherwise every chunk, merged, goes to out. */
static void run_rows(const flash_job *job, scratch *sc, int h, int t0, int t1, long only) {
    const sq_config *c = job->c;
    const size_t hd = (size_t)c->head_dim, hdp = padded(c->head_dim), group = (size_t)(c->n_heads / c->n_kv_heads);
    const size_t rb = sq_kv_row_bytes(job->kv_type, c->head_dim), head_bytes = (size_t)c->n_ctx * rb;
    const uint8_t *kh = job->k + (size_t)h * head_bytes, *vh = job->v + (size_t)h * head_bytes;
    const size_t n_rows = (size_t)(t1 - t0) * group, qd = (size_t)c->n_heads * hd;
    const size_t last_key = (size_t)job->n_past + (size_t)t1 - 1;  /* the last row sees keys 0..last_key */
    const float scale = 1.0f / sqrtf((float)hd);
    const int simd = use_simd();

    for (size_t r = 0; r < n_rows; r++) {
        const size_t t = (size_t)t0 + r / group, g = r % group;
        const float *src = job->q + t * qd + ((size_t)h * group + g) * hd;
        float *dst = sc->q + r * hdp;
        for (size_t d = 0; d < hd; d++) dst[d] = src[d] * scale;
        memset(dst + hd, 0, (hdp - hd) * sizeof(float));
        sc->tm[r] = -INFINITY;
    }
    const size_t c0 = only >= 0 ? (size_t)only : 0, c1 = only >= 0 ? (size_t)only + 1 : last_key / KEY_CHUNK + 1;
    for (size_t ch = c0; ch < c1; ch++) {
        for (size_t r = 0; r < n_rows; r++) sc->m[r] = -INFINITY;
        const size_t start = ch * KEY_CHUNK, end = start + KEY_CHUNK < last_key + 1 ? start + KEY_CHUNK : last_key + 1;
        for (size_t b0 = start; b0 < end; b0 += KEY_BLOCK) {
            const size_t nk = end - b0 < KEY_BLOCK ? end - b0 : KEY_BLOCK;
            /* rows are in position order: those that see this block are the last ones */
            size_t r0 = 0;
            while (r0 < n_rows && (size_t)job->n_past + (size_t)t0 + r0 / group < b0) r0++;
            block_step(job, sc, kh + b0 * rb, vh, b0, nk, last_key + 1, r0, n_rows, t0, simd);
        }
        for (size_t r = 0; r < n_rows; r++) {
            if (sc->m[r] == -INFINITY) continue;  /* the whole chunk is past this row */
            if (only >= 0) {
                float *p = job->partials + (((size_t)h * group + r) * n_chunks(c->n_ctx) + ch) * (2 + hdp);
                p[0] = sc->m[r], p[1] = sc->l[r];
                memcpy(p + 2, sc->o + r * hdp, hdp * sizeof(float));
            } else {
                merge(sc->m[r], sc->l[r], sc->o + r * hdp, hdp, sc->tm + r, sc->tl + r, sc->to + r * hdp);
            }
        }
    }
    if (only >= 0) return;
    for (size_t r = 0; r < n_rows; r++) {
        const size_t t = (size_t)t0 + r / group, g = r % group;
        finish(sc->tl[r], sc->to + r * hdp, hd, job->out + t * qd + ((size_t)h * group + g) * hd);
    }
}

static scratch thread_scratch(const flash_job *job, int ith) {
    return carve(job->scratch + (size_t)ith * sq_flash_scratch_floats(job->c), job->c);
}

/* Decode, step 1: tasks (KV head, chunk) in runs of consecutive ones (sq_pool_runs), so
 * that a thread streams through the cache in order (taken in turn, as a prefill's are,
 * they interleave and the step is a fifth slower), and a thread done with its own run
 * takes the last tasks of the other's (SmolLM2's steps took x0.995 of a fixed half's time
 * at depth 1,024, x0.964-0.973 at 4,096 and x0.986 at 8,000: Zen 4, one process,
 * alternating). */
static void chunk_tasks(void *p, int64_t lo, int64_t hi, int64_t end, int ith) {
    const flash_job *job = p;
    (void)end;
    scratch sc = thread_scratch(job, ith);
    const int64_t chunks = job->n_past / KEY_CHUNK + 1;
    for (int64_t task = lo; task < hi; task++) run_rows(job, &sc, (int)(task / chunks), 0, 1, (long)(task % chunks));
}

/* Decode, step 2: tasks (query head), each head's chunks merged in order, as run_rows
 * merges them. */
static void merge_worker(void *p, int ith, int nth) {
    const flash_job *job = p;
    scratch sc = thread_scratch(job, ith);
    const sq_config *c = job->c;
    const size_t hd = (size_t)c->head_dim, hdp = padded(c->head_dim), chunks = (size_t)job->n_past / KEY_CHUNK + 1;
    for (int head = ith; head < c->n_heads; head += nth) {
        const float *part = job->partials + (size_t)head * n_chunks(c->n_ctx) * (2 + hdp);
        sc.tm[0] = -INFINITY;
        for (size_t ch = 0; ch < chunks; ch++, part += 2 + hdp) merge(part[0], part[1], part + 2, hdp, sc.tm, sc.tl, sc.to);
        finish(sc.tl[0], sc.to, hd, job->out + (size_t)head * hd);
    }
}

/* Prefill: tasks (query block, KV head), taken by the threads in turn. */
static void block_task(void *p, int64_t task, int ith) {
    const flash_job *job = p;
    scratch sc = thread_scratch(job, ith);
    const int b = (int)(task / job->c->n_kv_heads), h = (int)(task % job->c->n_kv_heads);
    const int t0 = b * job->block, t1 = t0 + job->block < job->n_tok ? t0 + job->block : job->n_tok;
    run_rows(job, &sc, h, t0, t1, -1);
}

/* On the pool, or without one on the calling thread alone. */
static void run_job(sq_pool *pool, sq_job_fn fn, flash_job *job) {
    if (pool)
        sq_pool_run(pool, fn, job);
    else
        fn(job, 0, 1);
}

int sq_flash_attention(sq_pool *pool, const sq_config *c, const float *q, const void *k_layer, const void *v_layer,
                       int kv_type, int n_tok, int n_past, float *scratch_buf, float *partials, float *out) {
    if (sq_kv_row_bytes(kv_type, c->head_dim) == 0 || kv_type == SQ_F32 || c->head_dim < 1 || c->head_dim > 1024 ||
        n_tok < 1 || n_past < 0 || n_past + n_tok > c->n_ctx)
        return -1;
    flash_job job = {c, q, k_layer, v_layer, kv_type, n_tok, n_past, scratch_buf, partials, out, QUERY_BLOCK};
    if (n_tok == 1 && n_past >= KEY_CHUNK) {
        sq_pool_runs(pool, (int64_t)c->n_kv_heads * (n_past / KEY_CHUNK + 1), chunk_tasks, &job);
        run_job(pool, merge_worker, &job);
    } else {
        /* Blocks of QUERY_BLOCK tokens, but a draft check's few tokens in as many blocks as it
         * takes to give every thread a task for each of its KV heads (SmolLM2's three heads
         * were two tasks on one thread and one on the other), as even as they go. A step
         * within the first chunk of keys comes here too, a task per KV head: its one chunk
         * merged and finished where it was computed, as the merge job would, in one job. */
        const int threads = pool ? sq_pool_threads(pool) : 1;
        int blocks = (n_tok + QUERY_BLOCK - 1) / QUERY_BLOCK;
        while (blocks * c->n_kv_heads % threads != 0 && blocks < threads && blocks < n_tok) blocks++;
        job.block = (n_tok + blocks - 1) / blocks;
        sq_pool_tasks(pool, (int64_t)((n_tok + job.block - 1) / job.block) * c->n_kv_heads, block_task, &job);
    }
    return 0;
}
