/* pool.h: running one job on every thread of an sq_pool. */
#ifndef SMOLQ_POOL_H
#define SMOLQ_POOL_H
#include "smolq.h"

/* A job is called once per thread with that thread's index ith in [0, nth);
 * each call takes its own share of the work. */
typedef void (*sq_job_fn)(void *ctx, int ith, int nth);

/* Runs fn on all threads (the caller is thread 0) and returns when every call has. */
void sq_pool_run(sq_pool *pool, sq_job_fn fn, void *ctx);

#endif
