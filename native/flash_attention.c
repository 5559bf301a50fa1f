/* flash_attention.c: attention over the compact KV caches (F16, Q8_0) in one pass.
 *
 * The F32 cache keeps llama.cpp's exact order (attention.c): a score row as long as the
 * context, a softmax over it, then the weighted sum. The compact caches take this path
 * instead, which never holds more than a block of scores:
 *  - keys go by in blocks of KEY_BLOCK, each block's keys and values widened to float
 *    once into scratch and shared by every query row that sees them;
 *  - each row keeps a running max, sum and weighted sum of V rows (an online softmax:
 *    when the max grows, what was summed so far is rescaled);
 *  - every KEY_CHUNK keys that partial result is closed and merged, chunk by chunk in
 *    order, into the row's total.
 * Decode (one token) hands the chunks of each KV head to the pool's threads and merges
 * them after; a prefill gives each thread (KV head, query block) tasks, and a row skips
 * the key blocks past its own position. Since chunks are fixed spans of keys and every
 * row's arithmetic is the same whichever way the work is shared, a token's output does
 * not depend on the batch it came in, the thread count or the SIMD path.
 *
 * The arithmetic is written once in plain C with explicit 8-lane accumulators (SQ_TWIN)
 * and compiled twice, plainly and for AVX2/FMA, where the lanes become registers; only
 * the widening of F16 rows has AVX2 code of its own (F16C), exact like the plain one.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "exp_ggml.h"
#include "pool.h"
#include "quant_blocks.h"
#include "quants.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_FLASH_AVX2 1
#endif

enum {
    KEY_BLOCK = 32,    /* keys widened and scored together */
    KEY_CHUNK = 256,   /* keys of one partial softmax: what decode shares out between threads */
    QUERY_BLOCK = 16,  /* tokens of one prefill task */
    LANES = 8,
};

/* Bytes of one cached row of head_dim elements: F16 halves or Q8_0 blocks. */
size_t sq_kv_row_bytes(int kv_type, int head_dim) {
    switch (kv_type) {
    case SQ_F32: return (size_t)head_dim * 4;
    case SQ_F16: return (size_t)head_dim * 2;
    case SQ_Q8_0: return head_dim % QK8_0 ? 0 : (size_t)head_dim / QK8_0 * sizeof(block_q8_0);
    default: return 0;
    }
}

/* One row's per-thread state: its chunk's running max m, sum l and weighted sum o. */
typedef struct {
    float *k, *v;      /* [KEY_BLOCK][head_dim] the current key block, widened */
    float *s;          /* [KEY_BLOCK] scores of one row */
    float *m, *l;      /* [rows] chunk partials */
    float *o;          /* [rows][head_dim] */
    float *tm, *tl;    /* [rows] totals merged over the chunks so far */
    float *to;         /* [rows][head_dim] */
} scratch;

static size_t max_rows(const sq_config *c) { return (size_t)QUERY_BLOCK * (size_t)(c->n_heads / c->n_kv_heads); }

/* Rows are widened into scratch padded with zeros to a multiple of 32 values, so the
 * 8-lane dot products and the 32-wide weighted sums take any head_dim; the zeros add
 * nothing to either. */
static size_t padded(int head_dim) { return ((size_t)head_dim + 31) / 32 * 32; }

size_t sq_flash_scratch_floats(const sq_config *c) {
    size_t hd = padded(c->head_dim), rows = max_rows(c);
    return 2 * KEY_BLOCK * hd + KEY_BLOCK + rows * (4 + 2 * hd);
}

static scratch carve(float *base, const sq_config *c) {
    size_t hd = padded(c->head_dim), rows = max_rows(c);
    scratch sc;
    sc.k = base; base += KEY_BLOCK * hd;
    sc.v = base; base += KEY_BLOCK * hd;
    sc.s = base; base += KEY_BLOCK;
    sc.m = base; base += rows;
    sc.l = base; base += rows;
    sc.o = base; base += rows * hd;
    sc.tm = base; base += rows;
    sc.tl = base; base += rows;
    sc.to = base;
    return sc;
}

static size_t n_chunks(int n_ctx) { return ((size_t)n_ctx + KEY_CHUNK - 1) / KEY_CHUNK; }

size_t sq_flash_partials_floats(const sq_config *c) {
    return (size_t)c->n_heads * n_chunks(c->n_ctx) * (2 + padded(c->head_dim));
}

/* -- widening a key block to float ------------------------------------------------------ */

static void widen_f16_plain(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = sq_fp16_to_fp32(src[i]);
}

#ifdef HAVE_FLASH_AVX2
__attribute__((target("avx2,f16c")))
static void widen_f16_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = sq_fp16_to_fp32(src[i]);
}
#endif

/* nk consecutive rows of head_dim values from row `first` of a KV head into dst, rows
 * hdp floats apart with the padding zeroed; the block's rows past nk are zeroed too,
 * so that the masked lanes hold finite values. */
static void widen_rows(const uint8_t *rows, int kv_type, size_t head_dim, size_t hdp, size_t first, size_t nk,
                       float *dst, int simd) {
    const size_t rb = sq_kv_row_bytes(kv_type, (int)head_dim);
    for (size_t j = 0; j < nk; j++) {
        const uint8_t *src = rows + (first + j) * rb;
        float *d = dst + j * hdp;
        if (kv_type == SQ_F16) {
#ifdef HAVE_FLASH_AVX2
            if (simd)
                widen_f16_avx2((const uint16_t *)src, d, head_dim);
            else
#endif
                widen_f16_plain((const uint16_t *)src, d, head_dim);
        } else {
            const block_q8_0 *b = (const block_q8_0 *)src;
            for (size_t i = 0; i < head_dim / QK8_0; i++) {
                const float scale = sq_fp16_to_fp32(b[i].d);
                for (size_t l = 0; l < QK8_0; l++) d[i * QK8_0 + l] = scale * (float)b[i].qs[l];
            }
        }
        memset(d + head_dim, 0, (hdp - head_dim) * sizeof(float));
    }
    (void)simd;
    memset(dst + nk * hdp, 0, (KEY_BLOCK - nk) * hdp * sizeof(float));
}

/* -- the arithmetic of one row ---------------------------------------------------------- */

/* e^x for x <= 0 as exp_ggml computes it (the same operations, so the same bits down to
 * x = -87), without its branch for |n| > 126: x is held at -87 or above, where e^x is
 * 1.6e-38, a weight no sum of KEY_CHUNK of them can feel. */
SQ_TWIN float exp_le0(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float k = sq_bits_f32((sq_f32_bits(z) << 23) + sq_f32_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    return fmaf(j, k, k);
}

/* Lanes l, l+8, l+16, l+24 folded, then the 8 lanes as a register reduction. */
SQ_TWIN float sum32(const float *x) {
    float t[LANES];
    for (size_t l = 0; l < LANES; l++) t[l] = (x[l] + x[l + 8]) + (x[l + 16] + x[l + 24]);
    return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

SQ_TWIN float max32(const float *x) {
    float t[LANES];
    for (size_t l = 0; l < LANES; l++) {
        float a = x[l] > x[l + 8] ? x[l] : x[l + 8], b = x[l + 16] > x[l + 24] ? x[l + 16] : x[l + 24];
        t[l] = a > b ? a : b;
    }
    float a = t[0] > t[4] ? t[0] : t[4], b = t[1] > t[5] ? t[1] : t[5];
    float c = t[2] > t[6] ? t[2] : t[6], d = t[3] > t[7] ? t[3] : t[7];
    a = a > c ? a : c;
    b = b > d ? b : d;
    return a > b ? a : b;
}

/* s[j] = q . k[j] for the block's KEY_BLOCK keys, four keys at a time, each in 8 lanes
 * of fma over the head dimension and a register sum. */
SQ_TWIN void scores(const float *q, const float *k, size_t head_dim, float *s) {
    for (size_t j = 0; j < KEY_BLOCK; j += 4) {
        float acc[4][LANES] = {{0}};
        for (size_t d = 0; d < head_dim; d += LANES)
            for (size_t r = 0; r < 4; r++)
                for (size_t l = 0; l < LANES; l++)
                    acc[r][l] = fmaf(q[d + l], k[(j + r) * head_dim + d + l], acc[r][l]);
        for (size_t r = 0; r < 4; r++) {
            const float *a = acc[r];
            s[j + r] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        }
    }
}

/* One key block into a row's chunk partial (m, l, o): the block's first `valid` keys
 * count, the rest are masked (later positions, or past the last key). */
SQ_TWIN void row_block(const float *q, const float *k, const float *v, size_t head_dim, size_t valid, float *s,
                       float *m, float *l, float *o) {
    scores(q, k, head_dim, s);
    for (size_t j = valid; j < KEY_BLOCK; j++) s[j] = -INFINITY;
    const float top = max32(s);
    const int first = *m == -INFINITY;
    const float mx = top > *m ? top : *m;
    for (size_t j = 0; j < KEY_BLOCK; j++) s[j] = exp_le0(s[j] - mx);
    for (size_t j = valid; j < KEY_BLOCK; j++) s[j] = 0.0f;
    const float corr = first ? 0.0f : exp_le0(*m - mx);
    *l = (first ? 0.0f : *l * corr) + sum32(s);
    *m = mx;
    if (first) {
        memset(o, 0, head_dim * sizeof(float));
    } else if (corr != 1.0f) {
        for (size_t d = 0; d < head_dim; d++) o[d] *= corr;
    }
    /* o += sum_j s[j] v[j], 32 outputs at a time so that they stay in registers */
    for (size_t d0 = 0; d0 < head_dim; d0 += 32) {
        float acc[32];
        for (size_t i = 0; i < 32; i++) acc[i] = o[d0 + i];
        for (size_t j = 0; j < valid; j++)
            for (size_t i = 0; i < 32; i++) acc[i] = fmaf(s[j], v[j * head_dim + d0 + i], acc[i]);
        for (size_t i = 0; i < 32; i++) o[d0 + i] = acc[i];
    }
}

/* A closed chunk (m, l, o) into a row's total (tm, tl, to), which starts empty (tm = -inf). */
SQ_TWIN void merge(float m, float l, const float *o, size_t head_dim, float *tm, float *tl, float *to) {
    if (*tm == -INFINITY) {
        *tm = m, *tl = l;
        memcpy(to, o, head_dim * sizeof(float));
        return;
    }
    const float mx = m > *tm ? m : *tm, a = exp_le0(*tm - mx), b = exp_le0(m - mx);
    *tl = *tl * a + l * b;
    *tm = mx;
    for (size_t d = 0; d < head_dim; d++) to[d] = to[d] * a + o[d] * b;
}

SQ_TWIN void finish(float tl, const float *to, size_t head_dim, float *out) {
    const float inv = 1.0f / tl;
    for (size_t d = 0; d < head_dim; d++) out[d] = to[d] * inv;
}

/* -- tasks ------------------------------------------------------------------------------- */

typedef struct {
    const sq_config *c;
    const float *q;          /* [n_tok][n_heads * head_dim] */
    const uint8_t *k, *v;    /* this layer's [n_kv_heads][n_ctx][row] */
    int kv_type, n_tok, n_past;
    float *scratch;          /* [threads][sq_flash_scratch_floats] */
    float *partials;         /* decode: [n_heads][chunks][2 + head_dim] (m, l, o) */
    float *out;              /* [n_tok][n_heads * head_dim] */
} flash_job;

/* The rows of query tokens t0..t1-1 of KV head h: row (t, g) is query head h * group + g
 * of token t, which sees keys 0..n_past + t. With partials (decode), chunk `only` alone
 * is computed and left there; otherwise every chunk, merged, into out. */
SQ_TWIN void run_rows(const flash_job *job, scratch *sc, int h, int t0, int t1, long only, int simd) {
    const sq_config *c = job->c;
    const size_t hd = (size_t)c->head_dim, hdp = padded(c->head_dim), group = (size_t)(c->n_heads / c->n_kv_heads);
    const size_t rb = sq_kv_row_bytes(job->kv_type, c->head_dim), head_bytes = (size_t)c->n_ctx * rb;
    const uint8_t *kh = job->k + (size_t)h * head_bytes, *vh = job->v + (size_t)h * head_bytes;
    const size_t n_rows = (size_t)(t1 - t0) * group, qd = (size_t)c->n_heads * hd;
    const size_t last_key = (size_t)job->n_past + (size_t)t1 - 1;  /* the block's last row sees keys 0..last_key */
    const float scale = 1.0f / sqrtf((float)hd);
    float qrow[1024];  /* one row's query, scaled and padded; head_dim <= 1024 (checked by the caller) */
    memset(qrow + hd, 0, (hdp - hd) * sizeof(float));

    for (size_t r = 0; r < n_rows; r++) sc->tm[r] = -INFINITY;
    size_t c0 = only >= 0 ? (size_t)only : 0, c1 = only >= 0 ? (size_t)only + 1 : last_key / KEY_CHUNK + 1;
    for (size_t ch = c0; ch < c1; ch++) {
        for (size_t r = 0; r < n_rows; r++) sc->m[r] = -INFINITY;
        const size_t start = ch * KEY_CHUNK, end = start + KEY_CHUNK < last_key + 1 ? start + KEY_CHUNK : last_key + 1;
        for (size_t b0 = start; b0 < end; b0 += KEY_BLOCK) {
            const size_t nk = end - b0 < KEY_BLOCK ? end - b0 : KEY_BLOCK;
            widen_rows(kh, job->kv_type, hd, hdp, b0, nk, sc->k, simd);
            widen_rows(vh, job->kv_type, hd, hdp, b0, nk, sc->v, simd);
            for (size_t r = 0; r < n_rows; r++) {
                const size_t t = (size_t)t0 + r / group, g = r % group, pos = (size_t)job->n_past + t;
                if (pos < b0) continue;  /* the block is past this row's position */
                const size_t valid = pos - b0 + 1 < nk ? pos - b0 + 1 : nk;
                const float *qs = job->q + t * qd + ((size_t)h * group + g) * hd;
                for (size_t d = 0; d < hd; d++) qrow[d] = qs[d] * scale;
                row_block(qrow, sc->k, sc->v, hdp, valid, sc->s, sc->m + r, sc->l + r, sc->o + r * hdp);
            }
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

/* Decode's second step: each query head's chunks merged in order, as run_rows merges them. */
SQ_TWIN void merge_partials(const flash_job *job, scratch *sc, int head, int simd) {
    const sq_config *c = job->c;
    const size_t hd = (size_t)c->head_dim, hdp = padded(c->head_dim), chunks = (size_t)job->n_past / KEY_CHUNK + 1;
    const float *p = job->partials + (size_t)head * n_chunks(c->n_ctx) * (2 + hdp);
    (void)simd;
    sc->tm[0] = -INFINITY;
    for (size_t ch = 0; ch < chunks; ch++, p += 2 + hdp) merge(p[0], p[1], p + 2, hdp, sc->tm, sc->tl, sc->to);
    finish(sc->tl[0], sc->to, hd, job->out + (size_t)head * hd);
}

#ifdef HAVE_FLASH_AVX2
__attribute__((target("avx2,fma,f16c")))
static void run_rows_avx2(const flash_job *job, scratch *sc, int h, int t0, int t1, long only) {
    run_rows(job, sc, h, t0, t1, only, 1);
}
__attribute__((target("avx2,fma,f16c")))
static void merge_partials_avx2(const flash_job *job, scratch *sc, int head) { merge_partials(job, sc, head, 1); }
#endif

static void run_rows_plain(const flash_job *job, scratch *sc, int h, int t0, int t1, long only) {
    run_rows(job, sc, h, t0, t1, only, 0);
}
static void merge_partials_plain(const flash_job *job, scratch *sc, int head) { merge_partials(job, sc, head, 0); }

static void rows_task(const flash_job *job, scratch *sc, int h, int t0, int t1, long only) {
#ifdef HAVE_FLASH_AVX2
    if (sq_simd_enabled()) {
        run_rows_avx2(job, sc, h, t0, t1, only);
        return;
    }
#endif
    run_rows_plain(job, sc, h, t0, t1, only);
}

static scratch thread_scratch(const flash_job *job, int ith) {
    return carve(job->scratch + (size_t)ith * sq_flash_scratch_floats(job->c), job->c);
}

/* Decode, step 1: tasks (KV head, chunk). */
static void chunk_worker(void *p, int ith, int nth) {
    const flash_job *job = p;
    scratch sc = thread_scratch(job, ith);
    const int chunks = job->n_past / KEY_CHUNK + 1, n_tasks = job->c->n_kv_heads * chunks;
    for (int task = ith; task < n_tasks; task += nth) rows_task(job, &sc, task / chunks, 0, 1, task % chunks);
}

/* Decode, step 2: tasks (query head). */
static void merge_worker(void *p, int ith, int nth) {
    const flash_job *job = p;
    scratch sc = thread_scratch(job, ith);
    for (int head = ith; head < job->c->n_heads; head += nth) {
#ifdef HAVE_FLASH_AVX2
        if (sq_simd_enabled()) {
            merge_partials_avx2(job, &sc, head);
            continue;
        }
#endif
        merge_partials_plain(job, &sc, head);
    }
}

/* Prefill: tasks (query block, KV head). */
static void block_worker(void *p, int ith, int nth) {
    const flash_job *job = p;
    scratch sc = thread_scratch(job, ith);
    const int blocks = (job->n_tok + QUERY_BLOCK - 1) / QUERY_BLOCK, n_tasks = blocks * job->c->n_kv_heads;
    for (int task = ith; task < n_tasks; task += nth) {
        const int b = task / job->c->n_kv_heads, h = task % job->c->n_kv_heads;
        const int t0 = b * QUERY_BLOCK, t1 = t0 + QUERY_BLOCK < job->n_tok ? t0 + QUERY_BLOCK : job->n_tok;
        rows_task(job, &sc, h, t0, t1, -1);
    }
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
    flash_job job = {c, q, k_layer, v_layer, kv_type, n_tok, n_past, scratch_buf, partials, out};
    if (n_tok == 1) {
        run_job(pool, chunk_worker, &job);
        run_job(pool, merge_worker, &job);
    } else {
        run_job(pool, block_worker, &job);
    }
    return 0;
}
