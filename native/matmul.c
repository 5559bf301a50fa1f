/* matmul.c: weight matrix x activations, split by output rows across the pool.
 *
 * One token (decode) uses the fused per-type dot product, reading each weight byte
 * once. A batch (prefill) decodes each weight row once into the thread's scratch row
 * and reuses it for every token, so decoding cost is paid once per batch.
 *
 * For F16 and BF16 weights llama.cpp first rounds the activations to the weights' own
 * precision and multiplies in that format; we round the same way so that both engines
 * agree to ~1e-3 instead of drifting apart by BF16's 3 significant digits.
 */
#include "matmul.h"
#include "pool.h"
#include "quants.h"

float sq_dot_f32(const float *a, const float *b, int64_t n) {
    /* Eight independent partial sums: lets the compiler use SIMD lanes without
     * reassociating a single sum (which it may not do without -ffast-math). */
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

typedef struct {
    const sq_matmul_set *set;
    const float *x;
    int n_tokens;
    int64_t total_rows;     /* rows of all matrices in the set, end to end */
    const sq_workspace *ws;
} matmul_job;

static void rows_of_one(const matmul_job *job, int i, int64_t r0, int64_t r1, float *row_buf) {
    const sq_tensor *w = job->set->w[i];
    float *y = job->set->y[i];
    int64_t ldy = job->set->ldy[i], cols = w->cols;
    const uint8_t *base = w->data;
    for (int64_t r = r0; r < r1; r++) {
        const void *row = base + r * w->row_bytes;
        if (job->n_tokens == 1) {
            y[r] = sq_dot_row(w->type, row, job->x, cols);
            continue;
        }
        const float *wr = row;
        if (w->type != SQ_F32) {
            sq_dequantize_row(w->type, row, row_buf, cols);
            wr = row_buf;
        }
        for (int t = 0; t < job->n_tokens; t++) y[t * ldy + r] = sq_dot_f32(wr, job->x + (int64_t)t * cols, cols);
    }
}

static void matmul_worker(void *p, int ith, int nth) {
    const matmul_job *job = p;
    int64_t lo = job->total_rows * ith / nth, hi = job->total_rows * (ith + 1) / nth;
    float *row_buf = job->ws->rows + ith * job->ws->stride;
    int64_t start = 0;
    for (int i = 0; i < job->set->n && lo < hi; i++) {
        int64_t rows = job->set->w[i]->rows, end = start + rows;
        if (lo < end) {
            int64_t r1 = hi < end ? hi : end;
            rows_of_one(job, i, lo - start, r1 - start, row_buf);
            lo = r1;
        }
        start = end;
    }
}

static int rounding_of(int type) { return type == SQ_F16 || type == SQ_BF16 ? type : SQ_F32; }

static void round_activations(float *dst, const float *x, int64_t n, int type) {
    if (type == SQ_F16)
        for (int64_t i = 0; i < n; i++) dst[i] = sq_fp16_to_fp32(sq_fp32_to_fp16(x[i]));
    else
        for (int64_t i = 0; i < n; i++) dst[i] = sq_bf16_to_fp32(sq_fp32_to_bf16(x[i]));
}

static void run(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, const sq_workspace *ws) {
    matmul_job job = {set, x, n_tokens, 0, ws};
    for (int i = 0; i < set->n; i++) job.total_rows += set->w[i]->rows;
    int rounding = rounding_of(set->w[0]->type);
    if (rounding != SQ_F32) {
        round_activations(ws->x_round, x, (int64_t)n_tokens * set->w[0]->cols, rounding);
        job.x = ws->x_round;
    }
    sq_pool_run(pool, matmul_worker, &job);
}

void sq_matmul(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, const sq_workspace *ws) {
    int same = 1;
    for (int i = 1; i < set->n; i++) same &= rounding_of(set->w[i]->type) == rounding_of(set->w[0]->type);
    if (same) {
        run(pool, set, x, n_tokens, ws);
        return;
    }
    /* Mixed precisions need differently rounded inputs: one job per matrix. */
    for (int i = 0; i < set->n; i++) {
        sq_matmul_set one = {1, {set->w[i]}, {set->y[i]}, {set->ldy[i]}};
        run(pool, &one, x, n_tokens, ws);
    }
}
