/* forward.c: a batch of tokens through every layer of a SmolLM (Llama-style) model.
 *
 * Per layer: RMSNorm -> q/k/v -> RoPE (skipped on NoPE layers) -> KV cache write ->
 * causal GQA attention -> output projection + residual -> RMSNorm -> SwiGLU FFN +
 * residual. Mat-vecs and attention run on the pool; the cheap elementwise steps run on
 * the calling thread.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "matmul.h"
#include "pool.h"
#include "quants/quants.h"
#include "exp_ggml.h"
#include "simd.h"

/* ---------------------------------------------------------------------------
 * Activation buffers
 * ------------------------------------------------------------------------- */

struct sq_state {
    int max_batch;          /* tokens per chunk */
    float *x;               /* [max_batch][dim] residual stream */
    float *xn;              /* [max_batch][dim] normed input / projection output */
    float *q;               /* [max_batch][n_heads*head_dim] */
    float *k;               /* [max_batch][n_kv_heads*head_dim] */
    float *v;               /* [max_batch][n_kv_heads*head_dim] */
    float *att;             /* [max_batch][n_heads*head_dim] attention output */
    float *gate;            /* [max_batch][hidden_dim] */
    float *up;              /* [max_batch][hidden_dim] */
    float *rope_cs;         /* [max_batch][head_dim/2][2] cos, sin of each token's angles */
    float *scores;          /* [scratch_threads][n_ctx] F32-cache attention weights, one row per pool thread */
    float *flash;           /* [scratch_threads][sq_flash_scratch_floats] compact-cache attention scratch */
    int scratch_threads;    /* rows of scores and flash, grown to the pool's size on first use */
    float *partials;        /* [sq_flash_partials_floats] a decode step's per-chunk softmax partials */
    void *xq;               /* [max_batch][widest] 2-byte slots: mat-mul inputs in vec-dot format
                               (sq_activation_row_bytes: F16's 2 bytes an element are the most) */
};

/* The bytes of each buffer of an sq_state: one account for sq_state_new, which
 * allocates them, and sq_state_bytes, which reports them. */
typedef struct {
    int64_t x, xn, q, k, v, att, gate, up, xq, rope_cs, partials;  /* as the fields above */
    int64_t per_thread;  /* one pool thread's row of scores and flash scratch */
} state_sizes;

static state_sizes sizes_of(const sq_config *c, int max_batch) {
    int64_t b = max_batch, f = sizeof(float);
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t widest = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    if (qd > widest) widest = qd;
    state_sizes z = {
        .x = b * c->dim * f, .xn = b * c->dim * f, .q = b * qd * f, .k = b * kvd * f, .v = b * kvd * f,
        .att = b * qd * f, .gate = b * c->hidden_dim * f, .up = b * c->hidden_dim * f, .xq = b * widest * 2,
        .rope_cs = b * c->head_dim * f, .partials = (int64_t)sq_flash_partials_floats(c) * f,
        .per_thread = ((int64_t)c->n_ctx + (int64_t)sq_flash_scratch_floats(c)) * f,
    };
    return z;
}

int64_t sq_state_bytes(const sq_config *c, int max_batch, int n_threads) {
    state_sizes z = sizes_of(c, max_batch);
    return z.x + z.xn + z.q + z.k + z.v + z.att + z.gate + z.up + z.xq + z.rope_cs + z.partials +
           (int64_t)n_threads * z.per_thread;
}

sq_state *sq_state_new(const sq_config *c, int max_batch) {
    if (max_batch < 1) return NULL;
    sq_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    state_sizes z = sizes_of(c, max_batch);
    s->max_batch = max_batch;
    s->x = malloc((size_t)z.x);
    s->xn = malloc((size_t)z.xn);
    s->q = malloc((size_t)z.q);
    s->k = malloc((size_t)z.k);
    s->v = malloc((size_t)z.v);
    s->att = malloc((size_t)z.att);
    s->gate = malloc((size_t)z.gate);
    s->up = malloc((size_t)z.up);
    s->xq = malloc((size_t)z.xq);
    s->rope_cs = malloc((size_t)z.rope_cs);
    s->partials = malloc((size_t)z.partials);
    if (!s->x || !s->xn || !s->q || !s->k || !s->v || !s->att || !s->gate || !s->up || !s->xq || !s->rope_cs ||
        !s->partials) {
        sq_state_free(s);
        return NULL;
    }
    return s;
}

void sq_state_free(sq_state *s) {
    if (!s) return;
    free(s->x); free(s->xn); free(s->q); free(s->k); free(s->v);
    free(s->att); free(s->gate); free(s->up); free(s->xq); free(s->rope_cs); free(s->scores);
    free(s->flash); free(s->partials);
    free(s);
}

/* ---------------------------------------------------------------------------
 * Norm, rotation, cache write
 * ------------------------------------------------------------------------- */

/* out = x / rms(x) * weight, rounded as llama.cpp rounds it: squares in float, their sum
 * in double (ss, in order), the mean back in float (to the bit: see quants/types.h). */
static void rms_apply(float *out, const float *x, const float *weight, int n, float eps, double ss) {
    float mean = (float)(ss / n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

static void rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    rms_apply(out, x, weight, n, eps, ss);
}

/* rmsnorm of four rows, n apart, their sums side by side: each the same chain of adds in
 * the same order, so the same bits, but four in flight, where one row's sum waits on each
 * of its adds. (A draft check's norms ran on one thread while the other waited.) */
static void rmsnorm4(float *out, const float *x, const float *weight, int n, float eps) {
    double ss[4] = {0.0, 0.0, 0.0, 0.0};
    for (int i = 0; i < n; i++)
        for (int r = 0; r < 4; r++) ss[r] += (double)(x[r * n + i] * x[r * n + i]);
    for (int r = 0; r < 4; r++) rms_apply(out + r * n, x + r * n, weight, n, eps, ss[r]);
}

/* The rotation angles depend only on the position: computed once per token per chunk,
 * then shared by q and k of every layer. As llama.cpp forms them: theta starts at the
 * position and is multiplied by base^(-2/head_dim) in float for each next pair, then
 * cosf/sinf, an exact recipe for the reason quants/types.h gives (YaRN's included: the
 * same float operations, the two sums that its optimized build fuses into fmas fused
 * here too). */
typedef struct {
    float freq_scale, mscale, low, high;  /* no scaling: freq_scale 0 */
} yarn;

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)3.14159265358979323846)) / (2 * logf(base));
}

static yarn yarn_of(const sq_config *c) {
    yarn y = {0};
    if (c->yarn_freq_scale <= 0.0f) return y;
    y.freq_scale = c->yarn_freq_scale;
    y.mscale = fmaf(0.1f, logf(1.0f / c->yarn_freq_scale), 1.0f);
    const float start = floorf(yarn_corr_dim(c->head_dim, c->yarn_orig_ctx, c->yarn_beta_fast, c->rope_theta));
    const float end = ceilf(yarn_corr_dim(c->head_dim, c->yarn_orig_ctx, c->yarn_beta_slow, c->rope_theta));
    y.low = start > 0.0f ? start : 0.0f;
    y.high = end < (float)(c->head_dim - 1) ? end : (float)(c->head_dim - 1);
    return y;
}

static void rope_angles(float *cs, int head_dim, int pos, float theta_base, const yarn *y) {
    const float theta_scale = powf(theta_base, -2.0f / (float)head_dim);
    float theta = (float)pos;
    for (int i = 0; i < head_dim / 2; i++) {
        if (y->freq_scale > 0.0f) {
            /* the ramp: 1 (extrapolate: keep the trained angle) for pairs below `low`,
             * 0 (interpolate) above `high` */
            const float r = ((float)i - y->low) / (y->high - y->low > 0.001f ? y->high - y->low : 0.001f);
            const float mix = 1.0f - (r > 1.0f ? 1.0f : r < 0.0f ? 0.0f : r);
            const float interp = y->freq_scale * theta;
            const float t = fmaf(interp, 1.0f - mix, theta * mix);
            cs[2 * i] = cosf(t) * y->mscale;
            cs[2 * i + 1] = sinf(t) * y->mscale;
        } else {
            cs[2 * i] = cosf(theta);
            cs[2 * i + 1] = sinf(theta);
        }
        theta *= theta_scale;
    }
}

/* GGUF's converter permutes Q and K rows so that each rotated pair is adjacent
 * (2i, 2i+1) rather than HF's (i, i + head_dim/2). Each output is one product plus
 * one fused multiply-add, the rounding llama.cpp's optimized build gets: its
 * a*c - b*s and a*s + b*c fuse the first product (the K rows it caches show it).
 * Compiled twice (simd.h): with FMA the fmaf is one instruction, where the plain build
 * calls the C library's for each. */
SQ_TWIN void rotate_pairs(float *vec, int n_heads, int head_dim, const float *cs) {
    for (int h = 0; h < n_heads; h++) {
        float *p = vec + (int64_t)h * head_dim;
        for (int i = 0; i < head_dim / 2; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1], a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = fmaf(a, c, -(b * s));
            p[2 * i + 1] = fmaf(a, s, b * c);
        }
    }
}
SQ_COMPILED_TWICE(static, rope, rotate_pairs, (float *vec, int n_heads, int head_dim, const float *cs),
                  (vec, n_heads, head_dim, cs))

/* One row of head_dim values into the cache as kv_type: copied (F32), rounded to
 * halves (F16) or quantized to Q8_0 blocks as llama.cpp quantizes its cache. */
static void store_kv(uint8_t *row, int kv_type, const float *src, int n) {
    if (kv_type == SQ_F32) {
        memcpy(row, src, (size_t)n * sizeof(float));
    } else if (kv_type == SQ_F16) {
        sq_quantize_row(SQ_F16, src, row, n);
    } else {
        sq_quantize_row(SQ_Q8_0, src, row, n);
    }
}

/* A batch's tokens rotated (q and k, where the layer has RoPE) and their keys and values
 * stored in the cache at their positions, shared out between the threads: on one thread,
 * SmolLM2's 512-token prefill left the other waiting for 4% of its samples. */
typedef struct {
    const sq_config *c;
    const sq_state *s;
    int use_rope;
    uint8_t *k_layer, *v_layer;  /* this layer's [n_kv_heads][n_ctx] rows of rb bytes */
    int kv_type;
    size_t rb;
    int n_past;
} rope_store_job;

static void rope_and_store(void *p, int64_t t0, int64_t t1) {
    const rope_store_job *j = p;
    const sq_config *c = j->c;
    const int hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    for (int64_t t = t0; t < t1; t++) {
        float *qt = j->s->q + t * qd, *kt = j->s->k + t * kvd, *vt = j->s->v + t * kvd;
        if (j->use_rope) {
            const float *cs = j->s->rope_cs + t * hd;
            rope(qt, c->n_heads, hd, cs);
            rope(kt, c->n_kv_heads, hd, cs);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t off = ((size_t)h * c->n_ctx + (size_t)(j->n_past + t)) * j->rb;
            store_kv(j->k_layer + off, j->kv_type, kt + (int64_t)h * hd, hd);
            store_kv(j->v_layer + off, j->kv_type, vt + (int64_t)h * hd, hd);
        }
    }
}

/* ---------------------------------------------------------------------------
 * Attention over the F32 cache, on the pool
 * ------------------------------------------------------------------------- */

typedef struct {
    const sq_config *c;
    const float *q;         /* [n_tokens][n_heads*head_dim] */
    const float *k_layer;   /* this layer's [n_kv_heads][n_ctx][head_dim] */
    const float *v_layer;
    int n_tokens, n_past;
    float *scores;          /* [threads][n_ctx] scratch */
    float *out;             /* [n_tokens][n_heads*head_dim] */
} attention_job;

/* The F32 cache's exact path: tasks are (token, KV head) pairs; token t sees positions
 * 0..n_past+t. */
static void attention_worker(void *p, int ith, int nth) {
    const attention_job *job = p;
    const sq_config *c = job->c;
    int group = c->n_heads / c->n_kv_heads, hd = c->head_dim;
    size_t head_elems = (size_t)c->n_ctx * hd;
    int n_tasks = job->n_tokens * c->n_kv_heads;
    for (int task = ith; task < n_tasks; task += nth) {
        int t = task / c->n_kv_heads, h = task % c->n_kv_heads;
        int64_t qoff = ((int64_t)t * c->n_heads + (int64_t)h * group) * hd;
        sq_attention_group(job->q + qoff, group, job->k_layer + h * head_elems, job->v_layer + h * head_elems, hd,
                           job->n_past + t + 1, job->scores + (size_t)ith * c->n_ctx,
                           job->out + qoff);
    }
}

/* ---------------------------------------------------------------------------
 * The FFN's activation and the residual
 * ------------------------------------------------------------------------- */

/* gate = SiLU(gate) * up, plainly and (on x86-64) eight values at a time. */
static void swiglu_plain(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) gate[i] = swiglu_ggml(gate[i], up[i]);
}

#ifdef SQ_X86
/* swiglu_ggml eight values at a time, with the same bits; eight with a lane where exp_ggml
 * takes its branch (|n| > 126: gates beyond about +-87) go through swiglu_ggml. The branch
 * kept the plain loop from vectorizing. */
SQ_AVX2 static void swiglu_avx2(float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        __m256 m;
        const __m256 e = exp_ggml_near_v(_mm256_sub_ps(_mm256_setzero_ps(), g), &m);
        const __m256 far = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), m), _mm256_set1_ps(126.0f), _CMP_GT_OQ);
        if (_mm256_movemask_ps(far)) {
            for (int64_t l = i; l < i + 8; l++) gate[l] = swiglu_ggml(gate[l], up[l]);
            continue;
        }
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) gate[i] = swiglu_ggml(gate[i], up[i]);
}
#endif

void sq_swiglu(float *gate, const float *up, int64_t n) {
#ifdef SQ_X86
    if (sq_simd_enabled()) {
        swiglu_avx2(gate, up, n);
        return;
    }
#endif
    swiglu_plain(gate, up, n);
}

static void swiglu_range(void *gu, int64_t lo, int64_t hi) {
    float **p = gu;
    sq_swiglu(p[0] + lo, p[1] + lo, hi - lo);
}

/* A batch's rms norms (one per token row), shared out between the threads. */
typedef struct {
    float *out;
    const float *x, *weight;
    int dim;
    float eps;
} norm_job;

static void norm_rows(void *p, int64_t t0, int64_t t1) {
    const norm_job *j = p;
    int64_t t = t0;
    for (; t + 4 <= t1; t += 4) rmsnorm4(j->out + t * j->dim, j->x + t * j->dim, j->weight, j->dim, j->eps);
    for (; t < t1; t++) rmsnorm(j->out + t * j->dim, j->x + t * j->dim, j->weight, j->dim, j->eps);
}

static void rmsnorm_rows(sq_pool *pool, float *out, const float *x, const float *weight, int n_rows, int dim,
                         float eps) {
    norm_job j = {out, x, weight, dim, eps};
    sq_pool_ranges(pool, n_rows, 8, norm_rows, &j);
}

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* ---------------------------------------------------------------------------
 * A layer, a chunk, a batch
 * ------------------------------------------------------------------------- */

static void layer_forward(const sq_model *m, int l, sq_state *s, sq_pool *pool, uint8_t *k_cache,
                          uint8_t *v_cache, int kv_type, int n_tok, int n_past) {
    const sq_config *c = &m->cfg;
    const sq_layer *L = &m->layers[l];
    int dim = c->dim, hd = c->head_dim;
    int qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    size_t rb = sq_kv_row_bytes(kv_type, hd), layer_bytes = (size_t)c->n_kv_heads * c->n_ctx * rb;

    rmsnorm_rows(pool, s->xn, s->x, L->attn_norm.data, n_tok, dim, c->rms_eps);
    sq_matmul_set qkv = {3, {&L->wq, &L->wk, &L->wv}, {s->q, s->k, s->v}, {qd, kvd, kvd}};
    sq_matmul(pool, &qkv, s->xn, n_tok, s->xq);

    uint8_t *kl = k_cache + (size_t)l * layer_bytes, *vl = v_cache + (size_t)l * layer_bytes;
    rope_store_job rj = {c, s, L->use_rope, kl, vl, kv_type, rb, n_past};
    sq_pool_ranges(pool, n_tok, 8, rope_and_store, &rj);
    if (kv_type == SQ_F32) {
        attention_job aj = {c, s->q, (const float *)kl, (const float *)vl, n_tok, n_past, s->scores, s->att};
        sq_pool_run(pool, attention_worker, &aj);
    } else {
        sq_flash_attention(pool, c, s->q, kl, vl, kv_type, n_tok, n_past, s->flash, s->partials, s->att);
    }

    sq_matmul_set o = {1, {&L->wo}, {s->xn}, {dim}};
    sq_matmul(pool, &o, s->att, n_tok, s->xq);
    add_into(s->x, s->xn, (int64_t)n_tok * dim);

    rmsnorm_rows(pool, s->xn, s->x, L->ffn_norm.data, n_tok, dim, c->rms_eps);
    sq_matmul_set gu = {2, {&L->ffn_gate, &L->ffn_up}, {s->gate, s->up}, {c->hidden_dim, c->hidden_dim}};
    sq_matmul(pool, &gu, s->xn, n_tok, s->xq);
    float *gu_rows[2] = {s->gate, s->up};
    /* Shared out from 8,192 elements: a draft check's few tokens are worth both threads. */
    sq_pool_ranges(pool, (int64_t)n_tok * c->hidden_dim, 4096, swiglu_range, gu_rows);
    sq_matmul_set down = {1, {&L->ffn_down}, {s->xn}, {dim}};
    sq_matmul(pool, &down, s->gate, n_tok, s->xq);
    add_into(s->x, s->xn, (int64_t)n_tok * dim);
}

/* One chunk of at most max_batch tokens; logits rows for the tokens in [first_out, n_tok). */
static void chunk_forward(const sq_model *m, sq_state *s, sq_pool *pool, uint8_t *k_cache, uint8_t *v_cache,
                          int kv_type, const int32_t *tokens, int n_tok, int n_past, float *logits, int first_out) {
    const sq_config *c = &m->cfg;
    int dim = c->dim;
    const yarn y = yarn_of(c);
    for (int t = 0; t < n_tok; t++) {
        const sq_tensor *e = &m->token_embd;
        const int64_t id = tokens[t];
        if (e->packed16)
            sq_dequantize_row16(e->type, (const uint8_t *)e->data + (id - id % 16) * e->row_bytes, (int)(id % 16),
                                s->x + (int64_t)t * dim, dim);
        else
            sq_dequantize_row(e->type, (const uint8_t *)e->data + id * e->row_bytes, s->x + (int64_t)t * dim, dim);
        rope_angles(s->rope_cs + (int64_t)t * c->head_dim, c->head_dim, n_past + t, c->rope_theta, &y);
    }
    for (int l = 0; l < c->n_layers; l++) layer_forward(m, l, s, pool, k_cache, v_cache, kv_type, n_tok, n_past);

    int n_out = n_tok - first_out;
    if (n_out <= 0) return;
    for (int t = 0; t < n_out; t++)
        rmsnorm(s->xn + (int64_t)t * dim, s->x + (int64_t)(first_out + t) * dim, m->output_norm.data, dim, c->rms_eps);
    sq_matmul_set out = {1, {&m->output}, {logits}, {c->vocab_size}};
    sq_matmul(pool, &out, s->xn, n_out, s->xq);
}

int sq_forward(const sq_model *m, sq_state *s, sq_pool *pool, void *k_cache, void *v_cache, int kv_type,
               const int32_t *tokens, int n_tokens, int n_past, float *logits, int flags) {
    if (!m || !s || !pool || !k_cache || !v_cache || !tokens || !logits || n_tokens < 1 || n_past < 0 ||
        (flags & ~SQ_ALL_LOGITS))
        return SQ_ERR_ARGS;
    int all_logits = flags & SQ_ALL_LOGITS;
    const sq_config *c = &m->cfg;
    if (sq_kv_row_bytes(kv_type, c->head_dim) == 0 || (kv_type != SQ_F32 && c->head_dim > 1024)) return SQ_ERR_ARGS;
    if (n_tokens > c->n_ctx - n_past) return SQ_ERR_CONTEXT;
    for (int t = 0; t < n_tokens; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size) return SQ_ERR_TOKEN;

    int nth = sq_pool_threads(pool);
    if (s->scratch_threads < nth) {
        float *scores = realloc(s->scores, (size_t)nth * (size_t)c->n_ctx * sizeof(float));
        if (scores) s->scores = scores;
        float *flash = realloc(s->flash, (size_t)nth * sq_flash_scratch_floats(c) * sizeof(float));
        if (flash) s->flash = flash;
        if (!scores || !flash) return SQ_ERR_ARGS;
        s->scratch_threads = nth;
    }
    for (int start = 0; start < n_tokens; start += s->max_batch) {
        int n_tok = n_tokens - start < s->max_batch ? n_tokens - start : s->max_batch;
        int last_chunk = start + n_tok == n_tokens;
        float *rows = all_logits ? logits + (int64_t)start * c->vocab_size : logits;
        int first_out = all_logits ? 0 : (last_chunk ? n_tok - 1 : n_tok);
        chunk_forward(m, s, pool, k_cache, v_cache, kv_type, tokens + start, n_tok, n_past + start, rows, first_out);
    }
    return SQ_OK;
}
