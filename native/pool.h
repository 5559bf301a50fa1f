/* pool.h: running one job on the threads of an sq_pool. */
#ifndef SMOLQ_POOL_H
#define SMOLQ_POOL_H
#include "smolq.h"

/* A job is nth shares, one per thread of the pool: it is called once per share ith in
 * [0, nth), each call taking its own share of the work, by whichever thread claims the
 * share first (pool.c). One thread at a time holds a share, so scratch memory indexed by
 * ith is the call's own. */
typedef void (*sq_job_fn)(void *ctx, int ith, int nth);

/* Runs fn's shares on the pool's threads (the caller's included) and returns when every
 * call has. */
void sq_pool_run(sq_pool *pool, sq_job_fn fn, void *ctx);

/* fn(ctx, lo, hi) over items [0, n) in one contiguous range per thread, or in a single
 * call on the calling thread when n < 2 * min_items: waking the pool costs microseconds,
 * more than a few items of work. */
typedef void (*sq_range_fn)(void *ctx, int64_t lo, int64_t hi);
void sq_pool_ranges(sq_pool *pool, int64_t n, int64_t min_items, sq_range_fn fn, void *ctx);

/* fn(ctx, task, ith) for tasks [0, n_tasks), taken by the threads in turn until none are
 * left (ith: the index of the share the thread holds), so a core the machine slows takes
 * fewer of them instead of keeping the others waiting at the end. Without a pool, all on
 * the calling thread. */
typedef void (*sq_task_fn)(void *ctx, int64_t task, int ith);
void sq_pool_tasks(sq_pool *pool, int64_t n_tasks, sq_task_fn fn, void *ctx);

/* fn(ctx, lo, hi, end, ith) over items [0, n) in runs: each share a run of about n / nth
 * items in order, which its thread takes from the front, a quarter of what is left (at
 * least one item) at a time, `end` the run's end so far (a product's kernels ask memory
 * ahead to it); a thread done with its own run then takes the last items of the others',
 * a quarter of what is left at a time, from the back (end = hi). So a thread streams
 * through memory in order, and one the machine slows does not keep the other waiting at
 * the end. Without a pool, all on the calling thread in one call. */
typedef void (*sq_run_fn)(void *ctx, int64_t lo, int64_t hi, int64_t end, int ith);
void sq_pool_runs(sq_pool *pool, int64_t n, sq_run_fn fn, void *ctx);

#endif
