/* matmul.h: threaded products of quantized weight matrices with float activations. */
#ifndef SMOLQ_MATMUL_H
#define SMOLQ_MATMUL_H
#include "smolq.h"

enum { SQ_MATMUL_MAX = 3 };

/* Up to SQ_MATMUL_MAX matrices that read the same input, computed in one pool job
 * (q/k/v, gate/up): for each i, y[i][t][r] = w[i] row r . x[t].
 * y[i]: [n_tokens][ldy[i]] with ldy[i] >= w[i]->rows. */
typedef struct {
    int n;
    const sq_tensor *w[SQ_MATMUL_MAX];
    float *y[SQ_MATMUL_MAX];
    int64_t ldy[SQ_MATMUL_MAX];
} sq_matmul_set;

/* Buffers a mat-mul needs besides its operands; `stride` >= the widest input row. */
typedef struct {
    float *rows;     /* [n_threads][stride]: each thread's decoded weight row */
    float *x_round;  /* [max_batch][stride]: activations rounded to F16/BF16 precision */
    int64_t stride;
} sq_workspace;

/* x: [n_tokens][cols], n_tokens <= the workspace's max_batch. */
void sq_matmul(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, const sq_workspace *ws);

/* Plain float dot product, written so the compiler vectorizes it. */
float sq_dot_f32(const float *a, const float *b, int64_t n);

#endif
