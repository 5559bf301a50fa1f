/* read_bandwidth.c: how fast the pool's threads read a buffer, the model file's pages
 * above all. Decode streams every weight once per token, so this rate is the wall a
 * decode step runs against; the benchmark sets decode's bytes per second beside it. */
#include "pool.h"

typedef struct {
    const uint8_t *p;
    int64_t bytes;
    uint64_t sums[256];    /* [thread]: a checksum of its share, so no read can be skipped */
} read_job;

/* Each thread reads one contiguous share, in cache lines, with eight independent sums
 * (enough loads in flight for the memory system, vectorized by the compiler). */
static void read_share(void *ctx, int ith, int nth) {
    read_job *job = ctx;
    int64_t lines = job->bytes / 64;
    int64_t lo = lines * ith / nth, hi = lines * (ith + 1) / nth;
    uint64_t acc[8] = {0};
    for (int64_t line = lo; line < hi; line++) {
        const uint64_t *w = (const uint64_t *)(job->p + line * 64);
        for (int k = 0; k < 8; k++) acc[k] += w[k];
    }
    uint64_t sum = 0;
    for (int k = 0; k < 8; k++) sum += acc[k];
    if (ith == nth - 1)  /* the bytes past the last whole line */
        for (int64_t i = lines * 64; i < job->bytes; i++) sum += job->p[i];
    job->sums[ith] = sum;
}

uint64_t sq_read_all(sq_pool *pool, const void *p, int64_t bytes) {
    if (!pool || !p || bytes <= 0 || sq_pool_threads(pool) > 256 || ((uintptr_t)p & 7)) return 0;
    read_job job = {p, bytes, {0}};
    sq_pool_run(pool, read_share, &job);
    uint64_t sum = 0;
    for (int i = 0; i < sq_pool_threads(pool); i++) sum += job.sums[i];
    return sum;
}
