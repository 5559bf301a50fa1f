/* matmul.c: weight matrix x activations, split by output rows across the pool.
 *
 * As in llama.cpp's CPU backend, the activations are converted once per call to the
 * format paired with the weight type (sq_vec_dot_type: 8-bit blocks for quantized
 * weights), and every output is a block-wise integer dot product (sq_vec_dot_rows for
 * one token, sq_vec_dot_batch_rows for a batch), with sq_vec_dot's bits whatever the
 * batch (quants/types.h).
 */
#include "matmul.h"
#include "pool.h"

typedef struct {
    const sq_matmul_set *set;
    int n_tokens;
    int64_t total_rows;    /* rows of all matrices in the set, end to end */
    const uint8_t *xq;     /* [n_tokens][xq_row_bytes] activations in the set's vec-dot type */
    int64_t xq_row_bytes;
    int64_t chunk;         /* a prompt's: rows a thread takes at a time */
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

/* A prompt's task k: the chunk of rows from k * chunk, taken by the threads in turn
 * (sq_pool_tasks) rather than a fixed half each. */
static void chunk_of_rows(void *p, int64_t k, int ith) {
    const matmul_job *job = p;
    (void)ith;
    const int64_t lo = k * job->chunk, hi = lo + job->chunk < job->total_rows ? lo + job->chunk : job->total_rows;
    rows_of_set(job, lo, hi, hi);
}

/* A few tokens' product (decode's one, a draft's check) goes in runs of groups of 16 rows
 * (sq_pool_runs): a thread streams through its own run, the kernels asking memory ahead
 * to its end, then takes the last groups of the other's. (A fixed half each, the thread
 * that ended first waiting out the other, the 3B shape's steps took x1.003-1.069 of the
 * time, its 8-token checks x1.017-1.068, SmolLM2's steps and checks x0.999-1.016, and at
 * the avx2 setting the 3B shape's steps x1.027; three chunks a thread taken in turn, each
 * chunk's stream starting afresh, SmolLM2's steps took x1.034 and its 8-token checks
 * x1.033. Zen 4, one process, alternating.) */
static void groups_of_rows(void *p, int64_t lo, int64_t hi, int64_t end, int ith) {
    const matmul_job *job = p;
    (void)ith;
#define ROW(group) ((group) * 16 < job->total_rows ? (group) * 16 : job->total_rows)
    rows_of_set(job, ROW(lo), ROW(hi), ROW(end));
#undef ROW
}

/* A prompt's chunks: about CHUNKS_PER_THREAD each, in multiples of 16 rows (the kernels
 * take rows sixteen or eight at a time). A chunk is the most a thread can be left waiting
 * for its partner at the end of a product: with 8 a thread, SmolLM2's 512-token prefill
 * spent 10.5% of its samples waiting in the pool, with 32 7.4%. A few tokens (FEW_TOKENS
 * at most) go in runs instead (groups_of_rows). A worker not yet running leaves its share to
 * the caller (pool.c). */
enum { CHUNKS_PER_THREAD = 32, FEW_TOKENS = 16 };

static int64_t chunk_rows(int64_t total_rows, int n_threads) {
    const int64_t chunks = (int64_t)CHUNKS_PER_THREAD * n_threads, chunk = (total_rows + chunks - 1) / chunks;
    return chunk > 16 ? (chunk + 15) / 16 * 16 : 16;
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
    if (n_tokens <= FEW_TOKENS) {
        sq_pool_runs(pool, (job.total_rows + 15) / 16, groups_of_rows, &job);
        return;
    }
    job.chunk = chunk_rows(job.total_rows, sq_pool_threads(pool));
    sq_pool_tasks(pool, (job.total_rows + job.chunk - 1) / job.chunk, chunk_of_rows, &job);
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
