/* matmul.c: weight matrix x activations, split by output rows across the pool.
 *
 * As in llama.cpp's CPU backend, the activations are converted once per call to the
 * format paired with the weight type (sq_vec_dot_type: 8-bit blocks for quantized
 * weights), and every output is a block-wise integer dot product (sq_vec_dot_matrix_rows,
 * for one token or a batch, in the file's layout or packed), with sq_vec_dot's bits
 * whatever the batch (quants/types.h).
 */
#include "matmul.h"
#include "pool.h"

typedef struct {
    const sq_matmul_set *set;
    int n_tokens;
    int64_t total_rows;    /* rows of all matrices in the set, end to end */
    const uint8_t *xq;     /* [n_tokens][xq_row_bytes] activations in the set's vec-dot type */
    int64_t xq_row_bytes;
} matmul_job;

static void rows_of_one(const matmul_job *job, int i, int64_t r0, int64_t r1, int64_t fetch_end) {
    const sq_tensor *w = job->set->w[i];
    sq_vec_dot_matrix_rows(w, r0, r1, fetch_end < w->rows ? fetch_end : w->rows, job->xq, job->xq_row_bytes,
                           job->n_tokens, job->set->y[i] + r0, job->set->ldy[i]);
}

/* Rows [lo, hi) of the set's matrices end to end, the kernels asking memory ahead for
 * rows up to fetch_end (>= hi) of the matrix they are in. */
static void rows_of_set(const matmul_job *job, int64_t lo, int64_t hi, int64_t fetch_end) {
    int64_t start = 0;
    for (int i = 0; i < job->set->n && lo < hi; i++) {
        int64_t end = start + job->set->w[i]->rows;
        if (lo < end) {
            int64_t r1 = hi < end ? hi : end;
            rows_of_one(job, i, lo - start, r1 - start, fetch_end - start);
            lo = r1;
        }
        start = end;
    }
}

/* The product goes in runs of groups of 16 rows (sq_pool_runs; the kernels take rows
 * sixteen or eight at a time): a thread streams through its own run, the kernels asking
 * memory ahead to its end, then takes the last groups of the other's. A worker not yet
 * running leaves its run to the caller (pool.c). Runs against the ways before (Zen 4, one
 * process, alternating): against a fixed half each for a few tokens, where the thread
 * that ended first waited out the other, the 3B shape's steps took x0.935-0.997 of the
 * time, its 8-token checks x0.936-0.983, SmolLM2's steps and checks x0.984-1.001, at the
 * avx2 setting the 3B shape's steps x0.974; against chunks taken in turn, 32 a thread for
 * a prompt (each chunk's stream starting afresh), a 512-token prefill took x0.957-1.001
 * (SmolLM2, five runs; x0.963-0.965 on 3 and 4 threads) and x0.971-0.991 (3B shape), at
 * the avx2 setting x0.94 and x0.972. */
static void groups_of_rows(void *p, int64_t lo, int64_t hi, int64_t end, int ith) {
    const matmul_job *job = p;
    (void)ith;
#define ROW(group) ((group) * 16 < job->total_rows ? (group) * 16 : job->total_rows)
    rows_of_set(job, ROW(lo), ROW(hi), ROW(end));
#undef ROW
}

typedef struct {
    const float *x;        /* [n_tokens][cols] */
    uint8_t *xq;           /* [n_tokens][row_bytes] */
    int vec_type;
    int64_t cols, row_bytes;
} convert_job;

static void convert_tokens(void *p, int64_t t0, int64_t t1) {
    const convert_job *job = p;
    for (int64_t t = t0; t < t1; t++)
        sq_quantize_activations(job->vec_type, job->x + t * job->cols, job->xq + t * job->row_bytes, job->cols);
}

/* All matrices of the set share one vec-dot type: x is converted once for all, a batch's
 * tokens shared out between the threads (a prompt's conversion on one thread alone would
 * leave the others waiting for a few percent of the pass). */
static void run(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, void *xq) {
    int64_t cols = set->w[0]->cols;
    int vec_type = sq_vec_dot_type(set->w[0]->type);
    matmul_job job = {.set = set, .n_tokens = n_tokens, .xq = (const uint8_t *)x,
                      .xq_row_bytes = cols * (int64_t)sizeof(float)};
    for (int i = 0; i < set->n; i++) job.total_rows += set->w[i]->rows;
    if (vec_type != SQ_F32) {
        job.xq = xq;
        job.xq_row_bytes = sq_activation_row_bytes(vec_type, cols);
        convert_job cj = {x, xq, vec_type, cols, job.xq_row_bytes};
        sq_pool_ranges(pool, n_tokens, 4, convert_tokens, &cj);
    }
    sq_pool_runs(pool, (job.total_rows + 15) / 16, groups_of_rows, &job);
}

void sq_matmul(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, void *xq) {
    int same = 1;
    for (int i = 1; i < set->n; i++) same &= sq_vec_dot_type(set->w[i]->type) == sq_vec_dot_type(set->w[0]->type);
    if (same) {
        run(pool, set, x, n_tokens, xq);
        return;
    }
    /* e.g. Q4_0 q/k with a Q6_K v: differently converted inputs, one job per matrix. */
    for (int i = 0; i < set->n; i++) {
        sq_matmul_set one = {1, {set->w[i]}, {set->y[i]}, {set->ldy[i]}};
        run(pool, &one, x, n_tokens, xq);
    }
}
