/* quants/batch.c: the batched orders, one weight row times a batch of activation rows.
 *
 * A batch is not a loop over sq_vec_dot: llama.cpp's CPU backend multiplies a batch
 * with other kernels than a single token, and those round differently, so a prefill
 * matches it only in their order (quants/types.h says why the order is the bits).
 * quants/dispatch.c's sq_vec_dot_batch picks the order of a type (its BATCH in
 * quants/types.h) and, where there is one, the SIMD kernel with the same bits.
 */
#include <math.h>
#include <stdint.h>

#include "quants/kernels.h"
#include "quants/quants.h"

/* ---------------------------------------------------------------------------
 * The tiled order (BATCH TILED): Q2_K, Q3_K, Q5_K, Q6_K and IQ4_XS
 *
 * For a batch of at least SQ_TILED_MIN_TOKENS tokens llama.cpp's CPU backend
 * multiplies Q2_K, Q3_K, Q5_K, Q6_K and IQ4_XS matrices with its tiled kernel,
 * which rounds differently from its vec_dot: per block it forms the exact
 * integer sums s1 = sum(sc * q * qy) (q the signed code) and s2 = sum(mn * bsum),
 * then r = d * s1, r = fma(-dmin, s2, r) and acc = fma(r, dy, acc), in block
 * order. Decoding a block once for the whole batch (into scalar.c's sq_block_ints,
 * by the type's k_ints_<name>) is also the cheaper order.
 * ------------------------------------------------------------------------- */

/* Exact: |w| <= 4096 (Q6_K's 128 * 32) and |qy| <= 127, so 256 products stay below 2^27. */
SQ_TWIN int32_t dot_w_q8(const int16_t *restrict w, const int8_t *restrict q) {
    int32_t s = 0;
    for (int j = 0; j < QK_K; j++)
        s += w[j] * q[j];
    return s;
}

/* y[t * ldy] for t < n_tokens: the row of nb blocks times activation row t (Q8_K,
 * xq_stride bytes apart), in the order described above. The sums are exact
 * integers and fmaf rounds once everywhere, so every compilation of this body
 * gives the same bits: it is compiled twice, plain and for AVX2/FMA (simd.h). */
SQ_TWIN void batch_dot_k_body(sq_ints_fn ints, int block_bytes, const void *row, const void *xq,
                              int64_t xq_stride, int n_tokens, int64_t nb, float *y, int64_t ldy) {
    for (int t = 0; t < n_tokens; t++)
        y[t * ldy] = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        sq_block_ints k;
        ints((const uint8_t *)row + i * block_bytes, &k);
        for (int t = 0; t < n_tokens; t++) {
            const block_q8_K *a = (const block_q8_K *)((const uint8_t *)xq + t * xq_stride) + i;
            float r = k.d * (float)dot_w_q8(k.w, a->qs);
            if (k.has_min) {
                int32_t s2 = 0;
                for (int g = 0; g < QK_K / 16; g++)
                    s2 += k.mn[g] * a->bsums[g];
                r = fmaf(-k.dmin, (float)s2, r);
            }
            y[t * ldy] = fmaf(r, a->d, y[t * ldy]);
        }
    }
}

SQ_COMPILED_TWICE(extern, sq_batch_dot_k, batch_dot_k_body,
                  (sq_ints_fn ints, int block_bytes, const void *row, const void *xq, int64_t xq_stride,
                   int n_tokens, int64_t nb, float *y, int64_t ldy),
                  (ints, block_bytes, row, xq, xq_stride, n_tokens, nb, y, ldy))

/* ---------------------------------------------------------------------------
 * The repacked gemm's order (BATCH GEMM4): Q4_K
 *
 * On AVX2 llama.cpp repacks Q4_K matrices (8 rows interleaved) and multiplies four
 * activation rows at a time with their gemm, whose chains take a term per 64
 * elements instead of the gemv's per block (scalar.c's vec_dot_q4_K).
 * ------------------------------------------------------------------------- */

/* The gemm's order for n_tokens activation rows (xq_stride bytes apart) at once:
 * scalar.c's vec_dot_q4_K's two chains with a term per 64 elements, each block decoded
 * once per tile of rows. (x86/avx2.c's sq_batch_dot_q4_K_avx2 and arm/neon.c's
 * sq_batch_dot_q4_K_neon give the same bits.) */
#define Q4K_TILE 16
void sq_batch_dot_q4_K(const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t nb,
                       float *y, int64_t ldy) {
    const block_q4_K *x = row;
    for (int t0 = 0; t0 < n_tokens; t0 += Q4K_TILE) {
        const int nt = n_tokens - t0 < Q4K_TILE ? n_tokens - t0 : Q4K_TILE;
        float sumf[Q4K_TILE] = {0}, summ[Q4K_TILE] = {0};
        for (int64_t i = 0; i < nb; i++) {
            int16_t w[QK_K], mn[8];
            sq_ints_q4_K(&x[i], w, mn);
            const float dw = sq_fp16_to_fp32(x[i].d), dminw = sq_fp16_to_fp32(x[i].dmin);
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = (const block_q8_K *)((const uint8_t *)xq + (t0 + t) * xq_stride) + i;
                const float d = dw * a->d, dmin = dminw * a->d;
                for (int e = 0; e < QK_K; e += 64) {
                    int32_t isum = 0;
                    for (int j = 0; j < 64; j++)
                        isum += w[e + j] * a->qs[e + j];
                    const int g = e / 32;
                    const int32_t imin = mn[g] * (a->bsums[2 * g] + a->bsums[2 * g + 1])
                                         + mn[g + 1] * (a->bsums[2 * g + 2] + a->bsums[2 * g + 3]);
                    sumf[t] = fmaf((float)isum, d, sumf[t]);
                    summ[t] = fmaf((float)imin, dmin, summ[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            y[(t0 + t) * ldy] = sumf[t] - summ[t];
    }
}
