/* read_bandwidth.c: how fast the pool's threads read a buffer, the model file's pages
 * above all. Decode streams every weight once per token, so this rate is the wall a
 * decode step runs against; the benchmark sets decode's bytes per second beside it. */
#include "pool.h"

typedef struct {
    const uint8_t *p;
    int64_t bytes;
    uint64_t sums[256];    /* [share]: a checksum of what its thread read, so no read can be skipped */
} read_job;

/* Lines [lo, hi), with eight independent sums (enough loads in flight for the memory
 * system, vectorized by the compiler), into the share's checksum. The threads read in runs
 * (sq_pool_runs), as decode's products stream the weights. */
static void read_lines(void *ctx, int64_t lo, int64_t hi, int64_t end, int ith) {
    read_job *job = ctx;
    (void)end;
    uint64_t acc[8] = {0};
    for (int64_t line = lo; line < hi; line++) {
        const uint64_t *w = (const uint64_t *)(job->p + line * 64);
        for (int k = 0; k < 8; k++) acc[k] += w[k];
    }
    for (int k = 0; k < 8; k++) job->sums[ith] += acc[k];
}

uint64_t sq_read_all(sq_pool *pool, const void *p, int64_t bytes) {
    if (!pool || !p || bytes <= 0 || sq_pool_threads(pool) > 256 || ((uintptr_t)p & 7)) return 0;
    read_job job = {p, bytes, {0}};
    sq_pool_runs(pool, bytes / 64, read_lines, &job);
    uint64_t sum = 0;
    for (int i = 0; i < sq_pool_threads(pool); i++) sum += job.sums[i];
    for (int64_t i = bytes / 64 * 64; i < bytes; i++) sum += job.p[i];  /* the bytes past the last whole line */
    return sum;
}
