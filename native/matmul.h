/* matmul.h: threaded products of quantized weight matrices with activations. */
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

/* x: [n_tokens][cols] f32. xq: room for n_tokens rows of cols activations in any
 * vec-dot format (2 bytes per element is enough for all of them). Every output has
 * sq_vec_dot's bits, whatever n_tokens. */
void sq_matmul(sq_pool *pool, const sq_matmul_set *set, const float *x, int n_tokens, void *xq);

#endif
