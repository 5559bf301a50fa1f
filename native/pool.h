/* pool.h: running one job on every thread of an sq_pool. */
#ifndef SMOLQ_POOL_H
#define SMOLQ_POOL_H
#include "smolq.h"

/* A job is called once per thread with that thread's index ith in [0, nth);
 * each call takes its own share of the work. */
typedef void (*sq_job_fn)(void *ctx, int ith, int nth);

/* Runs fn on all threads (the caller is thread 0) and returns when every call has. */
void sq_pool_run(sq_pool *pool, sq_job_fn fn, void *ctx);

/* fn(ctx, lo, hi) over items [0, n) in one contiguous range per thread, or in a single
 * call on the calling thread when n < 2 * min_items: waking the pool costs microseconds,
 * more than a few items of work. */
typedef void (*sq_range_fn)(void *ctx, int64_t lo, int64_t hi);
void sq_pool_ranges(sq_pool *pool, int64_t n, int64_t min_items, sq_range_fn fn, void *ctx);

#endif
