/* attention.c: grouped-query attention over one KV head of an F32 cache, rounded as
 * llama.cpp rounds it.
 *
 * llama.cpp (without flash attention) computes attention as separate steps: scores
 * K.q with its f32 dot product, a scaled softmax whose exponentials come from its own
 * exp and whose sum is kept in double, then the weighted sum of V rows as a mat-mul
 * whose kernel depends on the batch: the f32 dot product for one token, an 8-lane
 * tiled gemm for several. Each of those steps is reproduced here with the same
 * operations in the same order (why to the bit: quants/types.h). This is
 * the exact path, kept for the F32 cache; the compact caches (F16, Q8_0) take the
 * single-pass one in flash_attention.c.
 *
 * Per (token, query head) that costs one scores buffer of n_keys floats, and K and V
 * are each read once per query head group, as with a single-pass softmax.
 *
 * The functions are written once (SQ_TWIN, fmaf) and compiled twice (simd.h): plainly,
 * and with AVX2/FMA enabled so fmaf becomes one instruction and the 8-lane loops
 * vectorize. Both builds compute the same bits; the second is picked at run time.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "smolq.h"
#include "attention.h"
#include "exp_ggml.h"
#include "simd.h"

/* V rows are summed this many outputs at a time, so any head_dim works with a fixed
 * stack buffer; SmolLM's head_dim (64, 128) takes one pass. */
#define CHUNK 256

static void fill(float *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++) x[i] = value;
}

/* ---------------------------------------------------------------------------
 * The steps, as llama.cpp takes them
 * ------------------------------------------------------------------------- */

/* llama.cpp's f32 dot product: 4 x 8 lanes of fma over 32-element steps, their
 * reduction (sq_reduce32, simd.h), and any tail (n % 32) added one fma at a time. */
SQ_TWIN float dot_f32(const float *x, const float *y, size_t n) {
    float acc[32] = {0};
    const size_t body = n & ~(size_t)31;
    for (size_t i = 0; i < body; i += 32)
        for (size_t l = 0; l < 32; l++) acc[l] = fmaf(x[i + l], y[i + l], acc[l]);
    float sum = sq_reduce32(acc);
    for (size_t i = body; i < n; i++) sum = fmaf(x[i], y[i], sum);
    return sum;
}

/* p = softmax(scores * scale) in place over n entries: exponentials in groups of 8
 * summed as a register, the group sums added in double, then one float reciprocal. */
SQ_TWIN void softmax(float *p, size_t n, float scale) {
    float max = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        p[i] *= scale;
        max = p[i] > max ? p[i] : max;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i += 8) {
        float lane[8] = {0};
        const size_t m = n - i < 8 ? n - i : 8;  /* the padding llama.cpp masks: exp = 0 */
        for (size_t l = 0; l < m; l++) lane[l] = p[i + l] = exp_ggml(p[i + l] - max);
        sum += (double)sq_hsum8(lane);
    }
    const float inv = (float)(1.0 / sum);
    for (size_t i = 0; i < n; i++) p[i] *= inv;
}

/* out[d] = sum_t p[t] * v[t][d], in the order of llama.cpp's kernel for one token: the
 * f32 dot product over t (4 x 8 lanes), the same for a token of any batch (llama.cpp's
 * batches take another order; the engine keeps this one for every token, so that a
 * position's row does not depend on its batch). Positions past n_keys are masked there
 * (p = 0), so leaving them out changes nothing. The lanes are kept as rows
 * acc[lane][d], so that both the fmas and the final reductions run along d, 8 outputs
 * per instruction. */
SQ_TWIN void weighted_sum(const float *p, const float *v, size_t head_dim, size_t n_keys, float *out) {
    float acc[32][CHUNK];
    const size_t lanes = 32;
    for (size_t d0 = 0; d0 < head_dim; d0 += CHUNK) {  /* one pass for every head_dim up to CHUNK */
        const size_t n = head_dim - d0 < CHUNK ? head_dim - d0 : CHUNK;
        for (size_t l = 0; l < lanes; l++) memset(acc[l], 0, n * sizeof(float));
        for (size_t t = 0; t < n_keys; t++) {
            const float *vr = v + t * head_dim + d0;
            float *a = acc[t % lanes];
            const float pt = p[t];
            for (size_t d = 0; d < n; d++) a[d] = fmaf(vr[d], pt, a[d]);
        }
        float *o = out + d0;
        for (size_t d = 0; d < n; d++) {  /* sq_reduce32 of each output's 32 lanes */
            float r[8];
            for (size_t l = 0; l < 8; l++) r[l] = (acc[l][d] + acc[16 + l][d]) + (acc[8 + l][d] + acc[24 + l][d]);
            o[d] = ((r[0] + r[4]) + (r[1] + r[5])) + ((r[2] + r[6]) + (r[3] + r[7]));
        }
    }
}

SQ_TWIN void attend(const float *q, size_t group, const float *k, const float *v, size_t head_dim, size_t n_keys,
                    float *scores, float *out) {
    const float scale = 1.0f / sqrtf((float)head_dim);
    for (size_t g = 0; g < group; g++) {
        const float *qg = q + g * head_dim;
        for (size_t t = 0; t < n_keys; t++) scores[t] = dot_f32(qg, k + t * head_dim, head_dim);
        softmax(scores, n_keys, scale);
        weighted_sum(scores, v, head_dim, n_keys, out + g * head_dim);
    }
}

/* ---------------------------------------------------------------------------
 * One KV head's query heads, on the copy the CPU runs
 * ------------------------------------------------------------------------- */

SQ_COMPILED_TWICE(static, attend_twice, attend,
                  (const float *q, size_t group, const float *k, const float *v, size_t head_dim, size_t n_keys,
                   float *scores, float *out),
                  (q, group, k, v, head_dim, n_keys, scores, out))

void sq_attention_group(const float *q, int group, const float *k, const float *v, int head_dim, int n_keys,
                        float *scores, float *out) {
    if (group <= 0 || head_dim <= 0) return;
    const size_t hd = (size_t)head_dim;
    if (n_keys <= 0) {
        fill(out, (size_t)group * hd, 0.0f);  /* nothing to attend to; the Python side forbids this */
        return;
    }
    attend_twice(q, (size_t)group, k, v, hd, (size_t)n_keys, scores, out);
}

/* ---------------------------------------------------------------------------
 * One decode step over a whole cache (sq_attention)
 * ------------------------------------------------------------------------- */

/* The compact caches: the flash path on the calling thread, its scratch from the heap. */
static int attention_compact(const float *q, const void *k_cache, const void *v_cache, int kv_type, int n_heads,
                             int n_kv_heads, int n_ctx, int head_dim, int n_keys, float *out) {
    sq_config c = {0};
    c.n_heads = n_heads, c.n_kv_heads = n_kv_heads, c.head_dim = head_dim, c.n_ctx = n_ctx;
    float *scratch = malloc(sq_flash_scratch_floats(&c) * sizeof(float));
    float *partials = malloc(sq_flash_partials_floats(&c) * sizeof(float));
    int rc = scratch && partials
                 ? sq_flash_attention(NULL, &c, q, k_cache, v_cache, kv_type, 1, n_keys - 1, scratch, partials, out)
                 : -1;
    free(scratch);
    free(partials);
    return rc;
}

void sq_attention(const float *q, const void *k_cache, const void *v_cache, int kv_type,
                  int n_heads, int n_kv_heads, int n_ctx, int head_dim, int n_keys,
                  float *out) {
    if (n_heads <= 0 || head_dim <= 0) return;
    const size_t n_out = (size_t)n_heads * (size_t)head_dim;
    /* Arguments the Python gate refuses; reading past n_ctx would leave the cache. */
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || n_keys < 1 || n_keys > n_ctx ||
        sq_kv_row_bytes(kv_type, head_dim) == 0) {
        fill(out, n_out, NAN);
        return;
    }
    if (kv_type != SQ_F32) {
        if (attention_compact(q, k_cache, v_cache, kv_type, n_heads, n_kv_heads, n_ctx, head_dim, n_keys, out))
            fill(out, n_out, NAN);
        return;
    }
    float *scores = malloc((size_t)n_keys * sizeof(float));
    if (!scores) {
        fill(out, n_out, NAN);
        return;
    }
    const int group = n_heads / n_kv_heads;
    const size_t head_elems = (size_t)n_ctx * (size_t)head_dim;  /* one KV head */
    const size_t q_stride = (size_t)group * (size_t)head_dim;  /* its query heads */
    for (size_t h = 0; h < (size_t)n_kv_heads; h++) {
        sq_attention_group(q + h * q_stride, group, (const float *)k_cache + h * head_elems,
                           (const float *)v_cache + h * head_elems, head_dim, n_keys, scores,
                           out + h * q_stride);
    }
    free(scores);
}
