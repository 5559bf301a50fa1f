/* pool.c: a persistent thread pool with one job in flight at a time.
 *
 * A forward pass hands the pool hundreds of short jobs (one per mat-vec), so waking a
 * sleeping thread for each would cost more than the work. Workers therefore spin on a
 * generation counter for a while after each job and only sleep on a condition variable
 * when no job has come for a long time (between prompts, say).
 *
 * A job is n_threads shares, and a share goes to whichever thread claims it first: the
 * caller and the workers take them one at a time until none is left, and the job is done
 * when every share is. So a worker the system has not scheduled yet (more runnable threads
 * than cores: another program busy, or several engines at once) does not hold the job up;
 * the caller takes its share, where waiting for it cost a scheduler time slice per
 * mat-vec. The caller only takes a share no worker has started, so the job never ends
 * later than it would waiting. A share's index, not the thread's, is the `ith` a job
 * sees (its scratch, its part of the work).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "pool.h"
#include "threads.h"

/* Spin briefly, then yield the core (a thread that spins while the thread it waits for
 * is descheduled only delays it: with more runnable threads than cores, pure spinning
 * turns each hand-off into a scheduler time slice), then sleep. */
enum { SPIN_ROUNDS = 4000, YIELD_ROUNDS = 20000 };

/* A share's run of items not yet taken, [first, end): first in the low 32 bits, end in
 * the high, so that a claim from either side is one compare-and-swap; a cache line each. */
typedef struct {
    atomic_ullong left;
    char own_line[64 - sizeof(atomic_ullong)];
} run_left;

struct sq_pool {
    int n_threads;
    sq_thread *threads;     /* [n_threads - 1]: the workers beside the caller */
    sq_mutex mu;            /* guards sleeping, with `wake` */
    sq_cond wake;
    /* The current job's generation (high 32 bits, bumped once per job; workers compare it
     * with the last they saw) and its next unclaimed share (low 32 bits): one word, so a
     * claim is of this job's share or fails. */
    atomic_ullong claims;
    atomic_int pending;     /* the current job's shares not finished */
    atomic_int stop;
    sq_job_fn fn;           /* the current job: written before its generation is published */
    void *ctx;
    run_left *runs;         /* [n_threads] what sq_pool_runs's current job has left of each run */
    void *runs_memory;      /* runs' allocation, before rounding up to a cache line */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint32_t generation_of(unsigned long long claims) { return (uint32_t)(claims >> 32); }

/* Waits until the generation differs from `seen`; returns the new one. */
static uint32_t wait_for_job(sq_pool *pool, uint32_t seen) {
    for (int i = 0; i < SPIN_ROUNDS + YIELD_ROUNDS; i++) {
        uint32_t g = generation_of(atomic_load_explicit(&pool->claims, memory_order_acquire));
        if (g != seen) return g;
        if (i < SPIN_ROUNDS)
            cpu_relax();
        else
            sq_thread_yield();
    }
    sq_mutex_lock(&pool->mu);
    uint32_t g;
    while ((g = generation_of(atomic_load(&pool->claims))) == seen) sq_cond_wait(&pool->wake, &pool->mu);
    sq_mutex_unlock(&pool->mu);
    return g;
}

/* Runs the shares of job `generation` this thread claims, until none is left unclaimed
 * (or the pool has moved on to a later job). */
static void take_shares(sq_pool *pool, uint32_t generation) {
    unsigned long long claims = atomic_load_explicit(&pool->claims, memory_order_acquire);
    while (generation_of(claims) == generation && (claims & 0xffffffff) < (unsigned)pool->n_threads) {
        if (!atomic_compare_exchange_weak_explicit(&pool->claims, &claims, claims + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue;  /* claims now holds what another thread left */
        pool->fn(pool->ctx, (int)(claims & 0xffffffff), pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
        claims = atomic_load_explicit(&pool->claims, memory_order_acquire);
    }
}

static sq_thread_result SQ_THREAD_CALL worker_main(void *p) {
    sq_pool *pool = p;
    uint32_t seen = 0; /* the generation before any job: a job published before this thread ran is not missed */
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) break;
        take_shares(pool, seen);
    }
    return 0;
}

sq_pool *sq_pool_new(int n_threads) {
    if (n_threads < 1) return NULL;
    sq_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    pool->runs_memory = calloc((size_t)n_threads + 1, sizeof(run_left));
    if (!pool->runs_memory) {
        free(pool);
        return NULL;
    }
    pool->runs = (run_left *)(((uintptr_t)pool->runs_memory + 63) & ~(uintptr_t)63);
    sq_mutex_init(&pool->mu);
    sq_cond_init(&pool->wake);
    int n_workers = n_threads - 1;
    if (n_workers > 0) {
        pool->threads = calloc((size_t)n_workers, sizeof *pool->threads);
        if (!pool->threads) goto fail;
    }
    for (int i = 0; i < n_workers; i++) {
        if (sq_thread_start(&pool->threads[i], worker_main, pool) != 0) {
            pool->n_threads = i + 1; /* only i workers exist: free() must join just those */
            sq_pool_free(pool);
            return NULL;
        }
    }
    return pool;
fail:
    free(pool->threads);
    free(pool->runs_memory);
    free(pool);
    return NULL;
}

int sq_pool_threads(const sq_pool *pool) { return pool->n_threads; }

/* Publishes a job, its shares all unclaimed, under the mutex so a worker about to sleep
 * cannot miss the wake-up; returns its generation. */
static uint32_t publish(sq_pool *pool, sq_job_fn fn, void *ctx) {
    sq_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n_threads);
    const uint32_t generation = generation_of(atomic_load(&pool->claims)) + 1;
    atomic_store_explicit(&pool->claims, (unsigned long long)generation << 32, memory_order_release);
    sq_cond_broadcast(&pool->wake);
    sq_mutex_unlock(&pool->mu);
    return generation;
}

void sq_pool_run(sq_pool *pool, sq_job_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    take_shares(pool, publish(pool, fn, ctx));
    /* the shares workers claimed and are still running */
    for (int i = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; i++) {
        if (i < SPIN_ROUNDS)
            cpu_relax();
        else
            sq_thread_yield();
    }
}

typedef struct {
    sq_range_fn fn;
    void *ctx;
    int64_t n;
} range_job;

static void range_worker(void *p, int ith, int nth) {
    const range_job *job = p;
    const int64_t lo = job->n * ith / nth, hi = job->n * (ith + 1) / nth;
    if (lo < hi) job->fn(job->ctx, lo, hi);
}

void sq_pool_ranges(sq_pool *pool, int64_t n, int64_t min_items, sq_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!pool || pool->n_threads == 1 || n < 2 * min_items) {
        fn(ctx, 0, n);
        return;
    }
    range_job job = {fn, ctx, n};
    sq_pool_run(pool, range_worker, &job);
}

typedef struct {
    sq_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_llong next;  /* the first task no thread has taken yet */
} task_job;

static void task_worker(void *p, int ith, int nth) {
    task_job *job = p;
    (void)nth;
    for (int64_t task; (task = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed)) < job->n_tasks;)
        job->fn(job->ctx, task, ith);
}

void sq_pool_tasks(sq_pool *pool, int64_t n_tasks, sq_task_fn fn, void *ctx) {
    if (!pool) {
        for (int64_t task = 0; task < n_tasks; task++) fn(ctx, task, 0);
        return;
    }
    task_job job = {.fn = fn, .ctx = ctx, .n_tasks = n_tasks};
    atomic_init(&job.next, 0);
    sq_pool_run(pool, task_worker, &job);
}

/* A quarter of what is left of a run (at least one item), from its front or its back; 0
 * when nothing is. */
static int take_quarter(run_left *run, int from_back, int64_t *lo, int64_t *hi, int64_t *end) {
    unsigned long long left = atomic_load_explicit(&run->left, memory_order_relaxed), after;
    uint32_t first, last, n;
    do {
        first = (uint32_t)left, last = (uint32_t)(left >> 32);
        if (first >= last) return 0;
        n = (last - first + 3) / 4;
        after = from_back ? (unsigned long long)(last - n) << 32 | first : left + n;
    } while (!atomic_compare_exchange_weak_explicit(&run->left, &left, after, memory_order_relaxed,
                                                    memory_order_relaxed));
    *lo = from_back ? last - n : first, *hi = from_back ? last : first + n, *end = last;
    return 1;
}

typedef struct {
    sq_run_fn fn;
    void *ctx;
    run_left *runs;  /* the pool's: [n_threads] */
} runs_job;

static void runs_worker(void *p, int ith, int nth) {
    const runs_job *job = p;
    int64_t lo, hi, end;
    while (take_quarter(&job->runs[ith], 0, &lo, &hi, &end)) job->fn(job->ctx, lo, hi, end, ith);
    for (int k = 1; k < nth; k++)
        while (take_quarter(&job->runs[(ith + k) % nth], 1, &lo, &hi, &end)) job->fn(job->ctx, lo, hi, hi, ith);
}

void sq_pool_runs(sq_pool *pool, int64_t n, sq_run_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!pool || pool->n_threads == 1 || n > UINT32_MAX) {  /* (items are counted in 32 bits) */
        fn(ctx, 0, n, n, 0);
        return;
    }
    const int nth = pool->n_threads;
    for (int i = 0; i < nth; i++)
        atomic_init(&pool->runs[i].left, (uint64_t)(n * (i + 1) / nth) << 32 | (uint64_t)(n * i / nth));
    runs_job job = {fn, ctx, pool->runs};
    sq_pool_run(pool, runs_worker, &job);
}

void sq_pool_free(sq_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    publish(pool, NULL, NULL);
    for (int i = 0; i < pool->n_threads - 1; i++) sq_thread_join(pool->threads[i]);
    sq_mutex_destroy(&pool->mu);
    sq_cond_destroy(&pool->wake);
    free(pool->threads);
    free(pool->runs_memory);
    free(pool);
}
