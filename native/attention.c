/* attention.c: one decode step of grouped-query attention.
 *
 * For each KV head, the `group` query heads that share it walk its keys once with an
 * online softmax: a running max m, a running sum l of exp(score - m) and an unnormalized
 * output acc = sum exp(score - m) * v. When a new score beats m, l and acc are rescaled by
 * exp(m_old - m_new). So K and V are each read exactly once, with no scores buffer, which
 * matters because decode attention is bound by the bytes of cache it reads.
 *
 * Scalar C11. The loops are written so the compiler can vectorize them without
 * -ffast-math: independent partial sums for dot products, elementwise updates elsewhere.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "smolq.h"
#include "attention.h"

/* Query heads walked together. A group larger than this (no SmolLM has one: SmolLM3
 * uses 4) is split into tiles, and each tile makes its own pass over K and V. */
#define TILE 16

/* F16 rows are widened to float this many elements at a time, so any head_dim works
 * with a fixed stack buffer (1 KiB); SmolLM's head_dim (64, 128) takes one chunk. */
#define CHUNK 256

/* Indices below are size_t, not int: Python's build flags include -fwrapv, under which
 * int counters may wrap, and gcc then leaves some of these loops scalar (2x slower). */

static void fill(float *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++) x[i] = value;
}

/* Dot product with eight independent partial sums: a single running sum is a serial
 * dependency the compiler may not reorder under strict IEEE rules, eight are not. */
static float dot(const float *a, const float *b, size_t n) {
    float acc[8] = {0};
    const size_t body = n & ~(size_t)7;
    for (size_t i = 0; i < body; i += 8)
        for (size_t j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float sum = 0.0f;
    for (size_t i = body; i < n; i++) sum += a[i] * b[i];
    for (size_t j = 0; j < 8; j++) sum += acc[j];
    return sum;
}

/* out = out * c + w * v: rescale the accumulator to the new max and add this row. */
static void rescale_add(float *restrict out, float c, float w, const float *restrict v,
                        size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = out[i] * c + w * v[i];
}

/* n floats of a K or V row starting at element `at`: a pointer straight into the cache
 * for F32, else the elements widened into buf. The widening goes through quants.c's row
 * decoder, the same conversion as sq_fp16_to_fp32 but one call per chunk instead of one
 * per element: that call overhead made F16 caches ~1.5x slower. */
static const float *row_f32(const void *rows, int kv_type, size_t at, size_t n, float *buf) {
    if (kv_type == SQ_F32) return (const float *)rows + at;
    sq_dequantize_row(SQ_F16, (const uint16_t *)rows + at, buf, (int64_t)n);
    return buf;
}

/* Attention for up to TILE query heads over one KV head's rows; see sq_attention_group. */
static void attend_tile(const float *q, size_t group, const void *k, const void *v,
                        int kv_type, size_t head_dim, size_t n_keys, float *out) {
    float m[TILE], l[TILE];        /* running max and running sum of exp(score - m) */
    float score[TILE], c[TILE], w[TILE];
    float buf[CHUNK];
    const float scale = 1.0f / sqrtf((float)head_dim);

    for (size_t g = 0; g < group; g++) m[g] = -INFINITY, l[g] = 0.0f;
    fill(out, group * head_dim, 0.0f);   /* 0 * c stays 0 on the first key */

    for (size_t t = 0; t < n_keys; t++) {
        const size_t row = t * head_dim;

        /* Scores: one read of this K row serves every query head of the group. */
        for (size_t g = 0; g < group; g++) score[g] = 0.0f;
        for (size_t d = 0; d < head_dim; d += CHUNK) {
            const size_t n = head_dim - d < CHUNK ? head_dim - d : CHUNK;
            const float *kr = row_f32(k, kv_type, row + d, n, buf);
            for (size_t g = 0; g < group; g++)
                score[g] += dot(q + g * head_dim + d, kr, n);
        }

        /* Online softmax step. Only a new max costs a rescale (c < 1). A NaN score is
         * not > m, so w = exp(NaN) = NaN and the NaN reaches out, as it should. */
        for (size_t g = 0; g < group; g++) {
            const float x = score[g] * scale;
            if (x > m[g]) {
                c[g] = expf(m[g] - x);   /* exp(-inf) = 0 on the first key */
                w[g] = 1.0f;
                m[g] = x;
            } else {
                c[g] = 1.0f;
                w[g] = expf(x - m[g]);
            }
            l[g] = l[g] * c[g] + w[g];
        }

        /* Values: likewise one read of this V row for the whole group. */
        for (size_t d = 0; d < head_dim; d += CHUNK) {
            const size_t n = head_dim - d < CHUNK ? head_dim - d : CHUNK;
            const float *vr = row_f32(v, kv_type, row + d, n, buf);
            for (size_t g = 0; g < group; g++)
                rescale_add(out + g * head_dim + d, c[g], w[g], vr, n);
        }
    }

    for (size_t g = 0; g < group; g++) {
        const float inv = 1.0f / l[g];
        float *o = out + g * head_dim;
        for (size_t i = 0; i < head_dim; i++) o[i] *= inv;
    }
}

/* out doubles as the accumulator, so it must not overlap q, k or v. */
void sq_attention_group(const float *q, int group, const void *k, const void *v,
                        int kv_type, int head_dim, int n_keys, float *out) {
    if (group <= 0 || head_dim <= 0) return;
    const size_t hd = (size_t)head_dim, n_out = (size_t)group * hd;
    if (kv_type != SQ_F32 && kv_type != SQ_F16) {
        fill(out, n_out, NAN);   /* a caller bug: make it loud, not plausible */
        return;
    }
    if (n_keys <= 0) {
        fill(out, n_out, 0.0f);  /* nothing to attend to; the Python side forbids this */
        return;
    }
    for (size_t g0 = 0; g0 < (size_t)group; g0 += TILE) {
        const size_t n = (size_t)group - g0 < TILE ? (size_t)group - g0 : TILE;
        attend_tile(q + g0 * hd, n, k, v, kv_type, hd, (size_t)n_keys, out + g0 * hd);
    }
}

void sq_attention(const float *q, const void *k_cache, const void *v_cache, int kv_type,
                  int n_heads, int n_kv_heads, int n_ctx, int head_dim, int n_keys,
                  float *out) {
    if (n_heads <= 0 || head_dim <= 0) return;
    /* Arguments the Python gate refuses; reading past n_ctx would leave the cache. */
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || n_keys > n_ctx ||
        (kv_type != SQ_F32 && kv_type != SQ_F16)) {
        fill(out, (size_t)n_heads * (size_t)head_dim, NAN);
        return;
    }
    const int group = n_heads / n_kv_heads;
    const size_t elem = kv_type == SQ_F32 ? sizeof(float) : sizeof(uint16_t);
    const size_t head_bytes = (size_t)n_ctx * (size_t)head_dim * elem;  /* one KV head */
    const size_t q_stride = (size_t)group * (size_t)head_dim;  /* its query heads */
    for (size_t h = 0; h < (size_t)n_kv_heads; h++) {
        sq_attention_group(q + h * q_stride, group,
                           (const char *)k_cache + h * head_bytes,
                           (const char *)v_cache + h * head_bytes,
                           kv_type, head_dim, n_keys, out + h * q_stride);
    }
}
