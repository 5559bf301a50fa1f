/* matmul.c: weight matrix x activations, split by output rows across the pool.
 *
 * As in llama.cpp's CPU backend, the activations are converted once per call to the
 * format paired with the weight type (sq_vec_dot_type: 8-bit blocks for quantized
 * weights), and every output is a block-wise integer dot product rounded as its
 * kernels round it (sq_vec_dot_rows for one token, sq_vec_dot_batch_rows for a batch,
 * sq_vec_dot_steps_rows for a batch rounded as one-token steps),
 * which keeps the logits bit-identical to llama.cpp's on the same file.
 */
#include "matmul.h"
#include "pool.h"

typedef struct {
    const sq_matmul_set *set;
    int n_tokens;
    int step_order;        /* each token's outputs as a one-token call rounds them */
    int64_t total_rows;    /* rows of all matrices in the set, end to end */
    const uint8_t *xq;     /* [n_tokens][xq_row_bytes] activations in the set's vec-dot type */
    int64_t xq_row_bytes;
} matmul_job;

static void rows_of_one(const matmul_job *job, int i, int64_t r0, int64_t r1) {
    const sq_tensor *w = job->set->w[i];
    float *y = job->set->y[i];
    int64_t ldy = job->set->ldy[i];
    const uint8_t *base = w->data;
    if (job->n_tokens == 1) {
        sq_vec_dot_rows(w->type, base + r0 * w->row_bytes, w->row_bytes, r1 - r0, job->xq, w->cols, y + r0);
        return;
    }
    if (job->step_order) {
        sq_vec_dot_steps_rows(w->type, base + r0 * w->row_bytes, w->row_bytes, r1 - r0, job->xq, job->xq_row_bytes,
                              job->n_tokens, w->cols, y + r0, ldy);
        return;
    }
    sq_vec_dot_batch_rows(w->type, base + r0 * w->row_bytes, w->row_bytes, r1 - r0, job->xq, job->xq_row_bytes,
                          job->n_tokens, w->cols, y + r0, ldy);
}

static void matmul_worker(void *p, int ith, int nth) {
    const matmul_job *job = p;
    int64_t lo = job->total_rows * ith / nth, hi = job->total_rows * (ith + 1) / nth;
    int64_t start = 0;
    for (int i = 0; i < job->set->n && lo < hi; i++) {
        int64_t end = start + job->set->w[i]->rows;
        if (lo < end) {
            int64_t r1 = hi < end ? hi : end;
            rows_of_one(job, i, lo - start, r1 - start);
            lo = r1;
        }
        start = end;
    }
}

/* All matrices of the set share one vec-dot type: x is converted once for all. */
static void run(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, void *xq, int step_order) {
    int64_t cols = set->w[0]->cols;
    int vec_type = sq_vec_dot_type(set->w[0]->type);
    matmul_job job = {set, n_tokens, step_order, 0, (const uint8_t *)x, cols * (int64_t)sizeof(float)};
    for (int i = 0; i < set->n; i++) job.total_rows += set->w[i]->rows;
    if (vec_type != SQ_F32) {
        job.xq = xq;
        job.xq_row_bytes = cols / sq_block_elems(vec_type) * sq_block_bytes(vec_type);
        for (int t = 0; t < n_tokens; t++)
            sq_quantize_row(vec_type, x + t * cols, (uint8_t *)xq + t * job.xq_row_bytes, cols);
    }
    sq_pool_run(pool, matmul_worker, &job);
}

void sq_matmul(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, void *xq, int step_order) {
    int same = 1;
    for (int i = 1; i < set->n; i++) same &= sq_vec_dot_type(set->w[i]->type) == sq_vec_dot_type(set->w[0]->type);
    if (same) {
        run(pool, set, x, n_tokens, xq, step_order);
        return;
    }
    /* e.g. Q4_0 q/k with a Q6_K v: differently converted inputs, one job per matrix. */
    for (int i = 0; i < set->n; i++) {
        sq_matmul_set one = {1, {set->w[i]}, {set->y[i]}, {set->ldy[i]}};
        run(pool, &one, x, n_tokens, xq, step_order);
    }
}
