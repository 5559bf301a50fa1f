/* int8_peak.c: how fast the pool's threads multiply bytes. A prompt's or a lookup draft's
 * matrix products are int8 multiply-adds into exact int32 sums (quants/types.h), so this
 * rate is the wall they run against, as read_bandwidth.c's is decode's. Each thread runs
 * the instruction the kernels of the SIMD setting in use take for those sums, on registers
 * alone, with more independent sums than the pipes' latency needs:
 *   amx         TDPBSUD into four 16 x 16 tiles of int32 sums     16,384 each (K = 64)
 *   avx512vnni  vpdpbusd on 512-bit registers                    64 multiply-adds each
 *   avx2        vpmaddubsw, then vpmaddwd by ones and vpaddd     32 (three instructions)
 *   neon        sdot with the dot-product extension              16
 *               (without: smull and sadalp, twice)
 *   scalar      a C loop of byte products into int32 sums, as the compiler builds it
 * Every lane of every sum gains 4 * a * b a round (an AMX tile's element 64 * a * b), so the
 * checksum is a * b times the multiply-adds counted: the work cannot be skipped, and a test
 * can see it was all done. (At the "amx" setting decode's products still take vpdpbusd;
 * the tiles' rate is a prompt's and a draft check's wall.) */
#include <string.h>

#include "pool.h"
#include "quants/x86/amx_tiles.h"
#include "simd512.h"

#if defined(SQ_NEON)
#include <arm_neon.h>
#endif

enum { SUMS = 12 };  /* independent sums a thread keeps: latency 4-5 x up to 2 a cycle, and some */

/* The register's value unknown to the compiler from here on (no instruction): else it
 * would see that the products are the same every round and take them once. */
#if defined(SQ_X86) && !defined(SQ_VNNI_VIA_SIMDE)
#define OPAQUE(reg) __asm__("" : "+v"(reg))
#elif defined(SQ_NEON) && (defined(__GNUC__) || defined(__clang__))
#define OPAQUE(reg) __asm__("" : "+w"(reg))
#else
#define OPAQUE(reg) ((void)0)  /* SIMDe's stand-ins: a test build, its rate not a peak */
#endif  /* independent sums a thread keeps: latency 4-5 x up to 2 a cycle, and some */

typedef struct {
    int64_t rounds;
    uint8_t a;
    int8_t b;
    int64_t macs[256];     /* [thread]: multiply-adds done */
    uint64_t sums[256];    /* [thread]: the sum of its lanes, each as uint32 */
} peak_job;

#ifdef SQ_X86
#ifdef SQ_VNNI_VIA_SIMDE
#define VNNI_TARGET SQ_AVX2
#else
#define VNNI_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

static VNNI_TARGET uint64_t lanes16(v16i v) {
    uint32_t l[16];
    V16(storeu_si512)(l, v);
    uint64_t s = 0;
    for (int i = 0; i < 16; i++) s += l[i];
    return s;
}

static VNNI_TARGET uint64_t peak_vnni(int64_t rounds, uint8_t a, int8_t b, int64_t *macs) {
    v16i wa = V16(set1_epi8)((char)a);
    const v16i xb = V16(set1_epi8)(b);
    v16i acc[SUMS];
    for (int k = 0; k < SUMS; k++) acc[k] = V16(setzero_si512)();
    for (int64_t r = 0; r < rounds; r++) {
        OPAQUE(wa);
        for (int k = 0; k < SUMS; k++) acc[k] = V16(dpbusd_epi32)(acc[k], wa, xb);
    }
    uint64_t s = 0;
    for (int k = 0; k < SUMS; k++) s += lanes16(acc[k]);
    *macs = rounds * SUMS * 64;
    return s;
}

#ifdef SQ_AMX
/* Four C tiles, so that each product waits on no other: A holds b in every byte, B a. */
static AMX_TARGET uint64_t peak_amx(int64_t rounds, uint8_t a, int8_t b, int64_t *macs) {
    _Alignas(64) int8_t x[16 * 64];
    _Alignas(64) uint8_t w[16 * 64];
    _Alignas(64) int32_t out[16 * 16];
    memset(x, b, sizeof x);
    memset(w, a, sizeof w);
    amx_begin(16, 64);
    amx_load_a(x, 64);
    amx_load_b(w);
    amx_zero(2);
    amx_zero(3);
    amx_zero(4);
    amx_zero(5);
    for (int64_t r = 0; r < rounds; r++) {
        amx_product(2);
        amx_product(3);
        amx_product(4);
        amx_product(5);
    }
    uint64_t s = 0;
#define ADD_TILE(c)                                        \
    amx_store(c, out);                                     \
    for (int i = 0; i < 16 * 16; i++) s += (uint32_t)out[i];
    ADD_TILE(2) ADD_TILE(3) ADD_TILE(4) ADD_TILE(5)
#undef ADD_TILE
    amx_end();
    *macs = rounds * 4 * 16 * 16 * 64;
    return s;
}
#endif

static SQ_AVX2 uint64_t peak_avx2(int64_t rounds, uint8_t a, int8_t b, int64_t *macs) {
    __m256i wa = _mm256_set1_epi8((char)a);
    const __m256i xb = _mm256_set1_epi8(b), ones = _mm256_set1_epi16(1);
    __m256i acc[SUMS];
    for (int k = 0; k < SUMS; k++) acc[k] = _mm256_setzero_si256();
    for (int64_t r = 0; r < rounds; r++) {
        OPAQUE(wa);
        for (int k = 0; k < SUMS; k++)
            acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xb), ones));
    }
    uint64_t s = 0;
    for (int k = 0; k < SUMS; k++) {
        uint32_t l[8];
        _mm256_storeu_si256((__m256i *)l, acc[k]);
        for (int i = 0; i < 8; i++) s += l[i];
    }
    *macs = rounds * SUMS * 32;
    return s;
}
#endif

#ifdef SQ_NEON
static uint64_t peak_neon(int64_t rounds, uint8_t a, int8_t b, int64_t *macs) {
    int8x16_t wa = vdupq_n_s8((int8_t)a);
    const int8x16_t xb = vdupq_n_s8(b);
    int32x4_t acc[SUMS];
    for (int k = 0; k < SUMS; k++) acc[k] = vdupq_n_s32(0);
    for (int64_t r = 0; r < rounds; r++) {
        OPAQUE(wa);
        for (int k = 0; k < SUMS; k++) {
#if defined(__ARM_FEATURE_DOTPROD)
            acc[k] = vdotq_s32(acc[k], wa, xb);
#else
            acc[k] = vpadalq_s16(acc[k], vmull_s8(vget_low_s8(wa), vget_low_s8(xb)));
            acc[k] = vpadalq_s16(acc[k], vmull_high_s8(wa, xb));
#endif
        }
    }
    uint64_t s = 0;
    for (int k = 0; k < SUMS; k++) {
        uint32_t l[4];
        vst1q_u32(l, vreinterpretq_u32_s32(acc[k]));
        for (int i = 0; i < 4; i++) s += l[i];
    }
    *macs = rounds * SUMS * 16;
    return s;
}
#endif

/* Sixteen int32 lanes of four byte products each, the bytes read afresh every round (the
 * empty asm says memory may have changed): else the compiler would see the products are
 * the same each round and multiply once. */
static uint64_t peak_plain(int64_t rounds, uint8_t a, int8_t b, int64_t *macs) {
    uint8_t w[64];
    int8_t x[64];
    memset(w, a, sizeof w);
    memset(x, b, sizeof x);
    uint32_t acc[16] = {0};
    for (int64_t r = 0; r < rounds; r++) {
#if defined(__GNUC__) || defined(__clang__)
        __asm__ __volatile__("" : : "r"(w), "r"(x) : "memory");
#endif
        for (int l = 0; l < 16; l++)
            for (int j = 0; j < 4; j++)
                acc[l] += (uint32_t)((int32_t)w[4 * l + j] * x[4 * l + j]);
    }
    uint64_t s = 0;
    for (int l = 0; l < 16; l++) s += acc[l];
    *macs = rounds * 64;
    return s;
}

static void peak_share(void *ctx, int ith, int nth) {
    peak_job *job = ctx;
    (void)nth;
#if defined(SQ_AMX)
    if (sq_simd_amx()) {
        job->sums[ith] = peak_amx(job->rounds, job->a, job->b, &job->macs[ith]);
        return;
    }
#endif
#if defined(SQ_X86)
    if (sq_simd_512()) {
        job->sums[ith] = peak_vnni(job->rounds, job->a, job->b, &job->macs[ith]);
        return;
    }
    if (sq_simd_enabled()) {
        job->sums[ith] = peak_avx2(job->rounds, job->a, job->b, &job->macs[ith]);
        return;
    }
#elif defined(SQ_NEON)
    if (sq_simd_enabled()) {
        job->sums[ith] = peak_neon(job->rounds, job->a, job->b, &job->macs[ith]);
        return;
    }
#endif
    job->sums[ith] = peak_plain(job->rounds, job->a, job->b, &job->macs[ith]);
}

int64_t sq_int8_peak(sq_pool *pool, int64_t rounds, int a, int b, uint64_t *checksum) {
    /* |2ab| <= 2^15 - 1 keeps vpmaddubsw's pair sums from saturating */
    if (!pool || !checksum || sq_pool_threads(pool) > 256 || rounds < 0 || a < 0 || a > 127 || b < -64 || b > 63)
        return -1;
    peak_job job = {.rounds = rounds, .a = (uint8_t)a, .b = (int8_t)b};
    sq_pool_run(pool, peak_share, &job);
    int64_t macs = 0;
    *checksum = 0;
    for (int i = 0; i < sq_pool_threads(pool); i++) {
        macs += job.macs[i];
        *checksum += job.sums[i];
    }
    return macs;
}
