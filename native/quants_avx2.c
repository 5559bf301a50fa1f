/* quants_avx2.c: AVX2/FMA versions of the hot vec_dot functions of quants.c.
 *
 * quants.c selects these at run time (see sq_simd_name / sq_set_simd) when the CPU
 * has AVX2 and FMA; the build passes no -march flag, so every function here carries
 * a target attribute and nothing in this file runs unless that check passed.
 *
 * The shape follows llama.cpp's AVX2 kernels: per block, the codes are multiplied
 * as bytes with maddubs (unsigned x signed, pairs summed to int16), widened with
 * madd (int16 pairs summed to int32, times a group scale where the type has one),
 * converted to float and accumulated with an FMA by the block's combined float
 * scale into 8 float lanes, which a final horizontal sum adds up. The integer part
 * of every block is exact, so these agree with the scalar functions up to float
 * rounding order: the scalar code rounds one block total at a time, these 8 lanes.
 * Every kernel here has a scalar twin in quants.c that repeats its float steps (the
 * same lanes, the same fmas, the same final sum), so the two paths agree bit for bit.
 *
 * maddubs saturates int16: every use here stays below it. Q4 nibbles (0..15) and
 * Q6_K codes (0..63) times activation codes (-127..127, as the quantizers make
 * them) give pair sums of at most 3810 and 16002, Q5_1's (0..31) 7874 (Q2_K, Q3_K
 * and Q5_K codes are smaller); signed x signed (Q8_0, Q4_0, Q5_0, the IQ4 grid)
 * goes through |x| and sign(y, x), at most 2 * 128 * 127 = 32512.
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <immintrin.h>

#include "quants.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define QK_K 256

/* Block layouts, as in quants.c (which documents them). */
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
typedef struct { uint16_t d, s; int8_t qs[32]; } blk_q8_1;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } blk_q8_K;
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0, blk_iq4_nl;
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;
typedef struct { uint16_t d, scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } blk_iq4_xs;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } blk_q4_K;
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } blk_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; } blk_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } blk_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } blk_q6_K;
static_assert(sizeof(blk_q8_0) == 34 && sizeof(blk_q8_1) == 36 && sizeof(blk_q8_K) == 292, "activation blocks");
static_assert(sizeof(blk_q4_0) == 18 && sizeof(blk_q4_1) == 20, "Q4 blocks");
static_assert(sizeof(blk_q5_0) == 22 && sizeof(blk_q5_1) == 24, "Q5 blocks");
static_assert(sizeof(blk_iq4_xs) == 136, "IQ4_XS block");
static_assert(sizeof(blk_q2_K) == 84 && sizeof(blk_q3_K) == 110, "K blocks");
static_assert(sizeof(blk_q4_K) == 144 && sizeof(blk_q5_K) == 176 && sizeof(blk_q6_K) == 210, "K blocks");

/* f16 -> f32 with F16C: exact for every half, as quants.c's conversion is. */
static inline AVX2 float h2f(uint16_t h) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

static inline AVX2 float hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* Sum of 4 int32 lanes (exact, so in any order). */
static inline AVX2 int32_t hsum_i32x4(__m128i v) {
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 1));
    return _mm_cvtsi128_si32(v);
}

static inline AVX2 float hsum4(__m128 r) {
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* Sum of 8 int32 lanes (exact, so any order will do). */
static inline AVX2 int32_t hsum8_i32(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1));
    return _mm_cvtsi128_si32(r);
}

/* Each vec_dot asks for the cache lines of the weights PREFETCH_AHEAD bytes ahead of the
 * block it works on, never for one at or past `stop` (the end of the rows the caller
 * vouched for). Decode streams every weight once per token, and one core left to the
 * hardware prefetchers kept too few lines in flight: streaming rows from memory on one
 * core went 1.18-1.40x faster with these (Q4_K, Q6_K, Q4_1, Q8_0 rows of 576 to 11008
 * columns), best at 1.5-3 KiB ahead. */
#define PREFETCH_AHEAD 2048
static inline AVX2 void prefetch_ahead(const void *block, int bytes, const void *stop) {
    const uintptr_t ahead = (uintptr_t)block + PREFETCH_AHEAD;
    for (int k = 0; k < bytes; k += 64)
        if (ahead + (uintptr_t)k < (uintptr_t)stop)
            _mm_prefetch((const char *)(ahead + (uintptr_t)k), _MM_HINT_T0);
}

/* 16 bytes of nibbles -> 32 codes 0..15: low nibbles in bytes 0..15, high in 16..31
 * (the element order of Q4_0/Q4_1 blocks). */
static inline AVX2 __m256i nibbles32(const uint8_t *p) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

/* Sum of 32 products of unsigned bytes u and signed bytes s, as 8 int32 lanes. */
static inline AVX2 __m256i dot_us8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* The same for two signed operands: |x| times y with x's sign moved onto it. */
static inline AVX2 __m256i dot_ss8(__m256i x, __m256i y) {
    return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

AVX2 float sq_vec_dot_q8_0_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q8_0 *x = row, *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_ss8(qx, qy)), acc);
    }
    return hsum8(acc);
}

/* Q4_0 and IQ4_NL: one whole-block integer sum, then one fma per block in block
 * order, the chain each lane of llama.cpp's repacked (8-row) kernels runs. */
AVX2 float sq_vec_dot_q4_0_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q4_0 *x = row;
    const blk_q8_0 *y = xq;
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const float d = h2f(x[i].d) * h2f(y[i].d);
        const __m256i qx = _mm256_sub_epi8(nibbles32(x[i].qs), _mm256_set1_epi8(8));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = __builtin_fmaf((float)hsum8_i32(dot_ss8(qx, qy)), d, acc);
    }
    return acc;
}

/* The 16 grid values of IQ4_NL, looked up 32 codes at a time with a byte shuffle. */
AVX2 float sq_vec_dot_iq4_nl_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_iq4_nl *x = row;
    const blk_q8_0 *y = xq;
    const __m128i grid = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    const __m256i lut = _mm256_broadcastsi128_si256(grid);
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const float d = h2f(x[i].d) * h2f(y[i].d);
        const __m256i qx = _mm256_shuffle_epi8(lut, nibbles32(x[i].qs));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = __builtin_fmaf((float)hsum8_i32(dot_ss8(qx, qy)), d, acc);
    }
    return acc;
}

/* A block's two halves (d, m of a Q4_1 block; d, s of a Q8_1 block) as floats in
 * lanes 0 and 1, with one conversion. */
static inline AVX2 __m128 h2f_pair(const uint16_t *h) {
    uint32_t both;
    memcpy(&both, h, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)both));
}

/* Per block: lane 0 of x's (d, m) times y's (d, s) is the codes' scale d*dy, lane 1
 * the block's min term m*s, summed in lane 1 of `summs` (lane 0 collects nothing of use). */
AVX2 float sq_vec_dot_q4_1_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q4_1 *x = row;
    const blk_q8_1 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    __m128 summs = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128 scales = _mm_mul_ps(h2f_pair(&x[i].d), h2f_pair(&y[i].d));
        summs = _mm_add_ps(summs, scales);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), _mm256_cvtepi32_ps(dot_us8(nibbles32(x[i].qs), qy)), acc);
    }
    return hsum8(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summs));
}

/* Four activation rows (stride bytes apart) at once, each rounded exactly as
 * sq_vec_dot_q4_1_avx2 rounds it: the block's codes are unpacked once for the four. */
AVX2 void sq_vec_dot4_q4_1_avx2(const void *row, const void *xq, int64_t stride, int64_t nb, float *out) {
    const blk_q4_1 *x = row;
    const blk_q8_1 *y[4];
    __m256 acc[4];
    __m128 summs[4];
    for (int t = 0; t < 4; t++) {
        y[t] = (const blk_q8_1 *)((const uint8_t *)xq + t * stride);
        acc[t] = _mm256_setzero_ps();
        summs[t] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const __m128 xs = h2f_pair(&x[i].d);
        const __m256i qx = nibbles32(x[i].qs);
        for (int t = 0; t < 4; t++) {
            const __m128 scales = _mm_mul_ps(xs, h2f_pair(&y[t][i].d));
            summs[t] = _mm_add_ps(summs[t], scales);
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y[t][i].qs);
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), _mm256_cvtepi32_ps(dot_us8(qx, qy)), acc[t]);
        }
    }
    for (int t = 0; t < 4; t++)
        out[t] = hsum8(acc[t]) + _mm_cvtss_f32(_mm_movehdup_ps(summs[t]));
}

/* Bit 4 of the 32 codes of a Q5_0/Q5_1 block as bytes 0x10 or 0: byte j copies
 * byte j / 8 of qh (bit j of the little-endian word is element j's) and keeps
 * bit j % 8. The element order is nibbles32's, which the lanes depend on. */
static inline AVX2 __m256i q5_bit4(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

/* quants.c's vec_dot_q5_0 does the same lane by lane, so the two agree bit for bit. */
AVX2 float sq_vec_dot_q5_0_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q5_0 *x = row;
    const blk_q8_0 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256i q = _mm256_or_si256(nibbles32(x[i].qs), q5_bit4(x[i].qh));
        const __m256i qx = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_ss8(qx, qy)), acc);
    }
    return hsum8(acc);
}

/* As Q4_1 with 5-bit codes; bit-exact with quants.c's vec_dot_q5_1. */
AVX2 float sq_vec_dot_q5_1_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q5_1 *x = row;
    const blk_q8_1 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const float ms = h2f(x[i].m) * h2f(y[i].s);
        summs += ms;
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256i qx = _mm256_or_si256(nibbles32(x[i].qs), q5_bit4(x[i].qh));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_us8(qx, qy)), acc);
    }
    return hsum8(acc) + summs;
}

/* The 8 6-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K/Q5_K block,
 * rearranged from their 12 packed bytes a 32-bit word at a time (k_scale_min in
 * quants.c gives the same values one pair at a time). */
static inline void k_unpack_scales(const uint8_t *s, uint32_t u[4]) {
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    uint32_t a[3];
    memcpy(a, s, 12);
    u[0] = a[0] & m6;                                        /* sc 0..3 */
    u[1] = (a[2] & m4) | ((a[0] >> 6) & m2) << 4;            /* sc 4..7 */
    u[2] = a[1] & m6;                                        /* mn 0..3 */
    u[3] = ((a[2] >> 4) & m4) | ((a[1] >> 6) & m2) << 4;     /* mn 4..7 */
}

/* The 8 6-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K/Q5_K block, as
 * k_unpack_scales gives them, without leaving the vector registers: reads 16 bytes
 * from s (the 12 packed ones and 4 of the codes after them). */
static inline AVX2 __m128i k_scales_mins(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* words a0 a2 a1 a2 */
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* words a0 a0 a1 a1 */
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i high = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(low, high);
}

/* Q4_K: whole-block integer sums for the codes and the mins, then two fma chains
 * in block order (lanes 0 and 1 of acc) subtracted at the end, as each lane of
 * llama.cpp's repacked (8-row) Q4_K kernel computes it. The group scales stay in a
 * register and are spread over the codes with byte shuffles. */
AVX2 float sq_vec_dot_q4_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q4_K *x = row;
    const blk_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128i sc_mn = k_scales_mins(x[i].scales);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc_mn)); /* int16 sc[g] */

        /* Min terms: mn[g] * (bsums[2g] + bsums[2g+1]), 4 int32 lanes. */
        const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sc_mn, sc_mn));
        const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y[i].bsums),
                                          _mm_loadu_si128((const __m128i *)(y[i].bsums + 8)));
        const __m128i min_terms = _mm_madd_epi16(mins, bs);

        /* Codes: 32 bytes of qs serve groups 2c (low nibbles) and 2c+1 (high). */
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(q4, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i y_lo = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
            const __m256i y_hi = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
            /* int16 word g of sc in every word: bytes 2g, 2g+1 picked into each pair */
            const __m256i s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)(0x0202 * (2 * c) + 0x0100)));
            const __m256i s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)(0x0202 * (2 * c + 1) + 0x0100)));
            const __m256i p_lo = _mm256_madd_epi16(s_lo, _mm256_maddubs_epi16(lo, y_lo));
            const __m256i p_hi = _mm256_madd_epi16(s_hi, _mm256_maddubs_epi16(hi, y_hi));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p_lo, p_hi));
        }
        /* Both block totals at once: lanes S, M, S, M; exact, so any order of adds. */
        const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1));
        const __m128i h = _mm_hadd_epi32(s4, min_terms);
        const __m128i totals = _mm_hadd_epi32(h, h);
        const __m128 scales = _mm_mul_ps(h2f_pair(&x[i].d), _mm_set1_ps(y[i].d)); /* d*dy, dmin*dy */
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(totals), scales, acc);
    }
    return _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc));
}

/* One token's four span sums of a Q4_K block (64 elements each, exact, as floats) and
 * its four min terms mn[2c] * (bsums[4c] + bsums[4c+1]) + mn[2c+1] * (bsums[4c+2] + bsums[4c+3]). */
static inline AVX2 void q4_K_span_sums(const blk_q8_K *a, const __m256i lo[4], const __m256i hi[4],
                                       const __m256i scv[8], __m128i mins, __m128 *sums, __m128 *min_terms) {
    __m256i p[4];
    for (int c = 0; c < 4; c++) {
        const __m256i a_lo = _mm256_loadu_si256((const __m256i *)(a->qs + 64 * c));
        const __m256i a_hi = _mm256_loadu_si256((const __m256i *)(a->qs + 64 * c + 32));
        p[c] = _mm256_add_epi32(_mm256_madd_epi16(scv[2 * c], _mm256_maddubs_epi16(lo[c], a_lo)),
                                _mm256_madd_epi16(scv[2 * c + 1], _mm256_maddubs_epi16(hi[c], a_hi)));
    }
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    *sums = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)a->bsums),
                                      _mm_loadu_si128((const __m128i *)(a->bsums + 8)));
    *min_terms = _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs));
}

/* Q4_K times n_tokens activation rows (stride bytes apart) in the order of llama.cpp's
 * repacked gemm, as quants.c's batch_dot_q4_K: per 64 elements (groups 2c and 2c+1) an
 * exact integer sum for the codes and one for the mins, each fma'd into its chain.
 * The codes are split into nibbles once per block for a tile of rows. */
AVX2 void sq_batch_dot_q4_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                                 float *y, int64_t ldy) {
    enum { TILE = 16 };
    const blk_q4_K *x = row;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        float sumf[TILE] = {0}, summ[TILE] = {0};
        for (int64_t i = 0; i < nb; i++) {
            uint32_t u[4];
            k_unpack_scales(x[i].scales, u);
            const uint8_t *sc = (const uint8_t *)u, *mn = (const uint8_t *)(u + 2);
            __m256i lo[4], hi[4];
            for (int c = 0; c < 4; c++) {
                const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
                lo[c] = _mm256_and_si256(q4, m4);
                hi[c] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            }
            __m256i scv[8];
            for (int g = 0; g < 8; g++)
                scv[g] = _mm256_set1_epi16(sc[g]);
            const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
            const float dw = h2f(x[i].d), dminw = h2f(x[i].dmin);
            int t = 0;
            /* Eight tokens at a time, one per float lane: their sums are transposed so
             * that each lane runs its token's chain with the scalar loop's fmas. */
            for (; t + 8 <= nt; t += 8) {
                __m128 fs[8], fm[8];
                float ad[8];
                for (int k = 0; k < 8; k++) {
                    const blk_q8_K *a = (const blk_q8_K *)((const uint8_t *)xq + (t0 + t + k) * stride) + i;
                    q4_K_span_sums(a, lo, hi, scv, mins, &fs[k], &fm[k]);
                    ad[k] = a->d;
                }
                _MM_TRANSPOSE4_PS(fs[0], fs[1], fs[2], fs[3]);
                _MM_TRANSPOSE4_PS(fs[4], fs[5], fs[6], fs[7]);
                _MM_TRANSPOSE4_PS(fm[0], fm[1], fm[2], fm[3]);
                _MM_TRANSPOSE4_PS(fm[4], fm[5], fm[6], fm[7]);
                const __m256 a_d = _mm256_loadu_ps(ad);
                const __m256 d = _mm256_mul_ps(_mm256_set1_ps(dw), a_d), dmin = _mm256_mul_ps(_mm256_set1_ps(dminw), a_d);
                __m256 vf = _mm256_loadu_ps(sumf + t), vm = _mm256_loadu_ps(summ + t);
                for (int c = 0; c < 4; c++) {
                    vf = _mm256_fmadd_ps(_mm256_set_m128(fs[4 + c], fs[c]), d, vf);
                    vm = _mm256_fmadd_ps(_mm256_set_m128(fm[4 + c], fm[c]), dmin, vm);
                }
                _mm256_storeu_ps(sumf + t, vf);
                _mm256_storeu_ps(summ + t, vm);
            }
            for (; t < nt; t++) {
                const blk_q8_K *a = (const blk_q8_K *)((const uint8_t *)xq + (t0 + t) * stride) + i;
                __m128 vs, vmn;
                q4_K_span_sums(a, lo, hi, scv, mins, &vs, &vmn);
                float fs[4], fm[4];
                _mm_storeu_ps(fs, vs);
                _mm_storeu_ps(fm, vmn);
                const float d = dw * a->d, dmin = dminw * a->d;
                for (int c = 0; c < 4; c++) {
                    sumf[t] = __builtin_fmaf(fs[c], d, sumf[t]);
                    summ[t] = __builtin_fmaf(fm[c], dmin, summ[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            y[(t0 + t) * ldy] = sumf[t] - summ[t];
    }
}

/* 8x8 transpose of 32-bit words: v[r] word j -> v[j] word r. */
static inline AVX2 void transpose8_epi32(__m256i v[8]) {
    __m256i a[8], b[8];
    for (int k = 0; k < 8; k += 2) {
        a[k] = _mm256_unpacklo_epi32(v[k], v[k + 1]);
        a[k + 1] = _mm256_unpackhi_epi32(v[k], v[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        b[k] = _mm256_unpacklo_epi64(a[k], a[k + 2]);
        b[k + 1] = _mm256_unpackhi_epi64(a[k], a[k + 2]);
        b[k + 2] = _mm256_unpacklo_epi64(a[k + 1], a[k + 3]);
        b[k + 3] = _mm256_unpackhi_epi64(a[k + 1], a[k + 3]);
    }
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2x128_si256(b[k], b[k + 4], 0x20);
        v[k + 4] = _mm256_permute2x128_si256(b[k], b[k + 4], 0x31);
    }
}

/* Block i of eight Q4_K rows side by side (see sq_batch_dot8_q4_K_avx2): codes[c][h][j]
 * holds elements 64c + 32h + 4j .. +3 of every row, one row per 32-bit lane; scale[g]
 * each row's scale of group g as two int16; mins[c] each row's (min 2c, min 2c+1). */
static inline AVX2 void q4_K_side_by_side(const void *rows, int64_t row_bytes, int64_t i, __m256i codes[4][2][8],
                                          __m256i scale[8], __m256i mins[4], __m256 *d_rows, __m256 *dmin_rows) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    float dr[8], dminr[8];
    int32_t sc_words[8][8], mn_words[4][8];
    for (int r = 0; r < 8; r++) {
        const blk_q4_K *x = (const blk_q4_K *)((const uint8_t *)rows + r * row_bytes) + i;
        uint32_t u[4];
        k_unpack_scales(x->scales, u);
        const uint8_t *sc = (const uint8_t *)u, *mn = (const uint8_t *)(u + 2);
        for (int g = 0; g < 8; g++)
            sc_words[g][r] = (int32_t)(sc[g] | (uint32_t)sc[g] << 16);
        for (int c = 0; c < 4; c++)
            mn_words[c][r] = (int32_t)(mn[2 * c] | (uint32_t)mn[2 * c + 1] << 16);
        dr[r] = h2f(x->d);
        dminr[r] = h2f(x->dmin);
    }
    for (int g = 0; g < 8; g++)
        scale[g] = _mm256_loadu_si256((const __m256i *)sc_words[g]);
    for (int c = 0; c < 4; c++) {
        mins[c] = _mm256_loadu_si256((const __m256i *)mn_words[c]);
        __m256i q[8];
        for (int r = 0; r < 8; r++)
            q[r] = _mm256_loadu_si256(
                (const __m256i *)(((const blk_q4_K *)((const uint8_t *)rows + r * row_bytes) + i)->qs + 32 * c));
        transpose8_epi32(q);  /* q[j]: bytes 4j..4j+3 of this span's 32, for rows 0..7 */
        for (int j = 0; j < 8; j++) {
            codes[c][0][j] = _mm256_and_si256(q[j], m4);
            codes[c][1][j] = _mm256_and_si256(_mm256_srli_epi16(q[j], 4), m4);
        }
    }
    *d_rows = _mm256_loadu_ps(dr);
    *dmin_rows = _mm256_loadu_ps(dminr);
}

/* Span c of one activation block against eight rows side by side: the exact integer
 * sum of each row's 64 products (scaled per group), and each row's min term. */
static inline AVX2 void q4_K_span8(const blk_q8_K *a, int c, __m256i codes[4][2][8], const __m256i scale[8],
                                   const __m256i mins[4], __m256i *isum_out, __m256i *imin_out) {
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const int8_t *aq = a->qs + 64 * c + 32 * h;
        __m256i s16 = _mm256_setzero_si256();  /* 8 steps of pair sums: |.| <= 8 * 3840 */
        for (int j = 0; j < 8; j++) {
            int32_t w;
            memcpy(&w, aq + 4 * j, 4);
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(codes[c][h][j], _mm256_set1_epi32(w)));
        }
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16, scale[2 * c + h]));
    }
    /* The span's min term: bsums of its four 16-element quarters, paired. */
    const int32_t bs_lo = a->bsums[4 * c] + a->bsums[4 * c + 1];
    const int32_t bs_hi = a->bsums[4 * c + 2] + a->bsums[4 * c + 3];
    const __m256i bs = _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)bs_lo | (uint32_t)bs_hi << 16));
    *isum_out = isum;
    *imin_out = _mm256_madd_epi16(mins[c], bs);
}

/* Eight Q4_K rows (row_bytes apart) times n_tokens activation rows, as sq_batch_dot_q4_K_avx2
 * computes each row (same bits: exact integer sums, the same fmas per 64 elements), with
 * the rows in the float lanes instead of tokens: per block the 8 rows' codes are put
 * side by side, 4 consecutive elements of each row in one 32-bit word, so that an
 * activation word broadcast to all lanes multiplies all 8 rows at once and every sum
 * stays in its row's lane, with no horizontal reduction. y[t * ldy + r] for r < 8. */
AVX2 void sq_batch_dot8_q4_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                  int n_tokens, int64_t nb, float *y, int64_t ldy) {
    enum { TILE = 32 };
    __m256i codes[4][2][8], scale[8], mins[4];
    __m256 d_rows, dmin_rows;
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        __m256 sumf[TILE], summ[TILE];
        for (int t = 0; t < nt; t++)
            sumf[t] = summ[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            q4_K_side_by_side(rows, row_bytes, i, codes, scale, mins, &d_rows, &dmin_rows);
            for (int t = 0; t < nt; t++) {
                const blk_q8_K *a = (const blk_q8_K *)((const uint8_t *)xq + (t0 + t) * stride) + i;
                const __m256 a_d = _mm256_set1_ps(a->d);
                const __m256 d = _mm256_mul_ps(d_rows, a_d), dmin = _mm256_mul_ps(dmin_rows, a_d);
                __m256 vf = sumf[t], vm = summ[t];
                for (int c = 0; c < 4; c++) {
                    __m256i isum, imin;
                    q4_K_span8(a, c, codes, scale, mins, &isum, &imin);
                    vf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, vf);
                    vm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), dmin, vm);
                }
                sumf[t] = vf;
                summ[t] = vm;
            }
        }
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + (t0 + t) * ldy, _mm256_sub_ps(sumf[t], summ[t]));
    }
}

/* Q2_K, Q3_K, Q5_K and Q6_K round as llama.cpp's AVX2 kernels do (and as the
 * scalar versions in quants.c, which describe the lanes): each block's integer
 * lanes are those of llama.cpp's, as its float steps are, so results agree bit
 * for bit. Every group of 16 lies in one 128-bit half of a register of 32 codes,
 * so its scale is one int16 broadcast over that half. */
static inline AVX2 __m256i scale_halves(int lo, int hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)lo)), _mm_set1_epi16((short)hi), 1);
}

/* Q2_K: the min lanes (mn[2l] * bsums[2l] + mn[2l+1] * bsums[2l+1]) go into the
 * accumulators first, by -(dy * dmin); then the code lanes by dy * d. */
AVX2 float sq_vec_dot_q2_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q2_K *x = row;
    const blk_q8_K *y = xq;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const uint8_t *s = x[i].scales;
        const __m128i packed = _mm_loadu_si128((const __m128i *)s);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0f)));
        const __m256i pm = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums));
        const float dmin = -(y[i].d * h2f(x[i].dmin));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), acc);

        /* 32 bytes of qs per half h: bits 2c..2c+1 are elements 32c..32c+31 of it,
         * groups 8h + 2c (bytes 0..15) and 8h + 2c + 1 (16..31). */
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int c = 0; c < 4; c++) {
                const int g = 8 * h + 2 * c;
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * c), m3);
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * c));
                const __m256i sc = scale_halves(s[g] & 0x0f, s[g + 1] & 0x0f);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, qy)));
            }
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

/* Q3_K: q = low2 - 4 * (hbit clear) is taken as maddubs(low2, y) - maddubs(4 or 0, y),
 * both unsigned times signed; the pair sums are at most 2 * 4 * 128. */
AVX2 float sq_vec_dot_q3_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q3_K *x = row;
    const blk_q8_K *y = xq;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4), zero = _mm256_setzero_si256();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        int sc[16];
        for (int g = 0; g < 16; g++) {
            const int lo4 = (x[i].scales[g % 8] >> (4 * (g / 8))) & 0x0f;
            const int hi2 = (x[i].scales[8 + g % 4] >> (2 * (g / 4))) & 3;
            sc[g] = (lo4 | hi2 << 4) - 32;
        }
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        /* Low bits laid out as in Q2_K; the high bit of element 32c + b of half h
         * is bit 4h + c of hmask[b]. */
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int c = 0; c < 4; c++) {
                const int g = 8 * h + 2 * c;
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * c), m3);
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + c)));
                const __m256i minus4 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), zero), m4);
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * c));
                const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, qy), _mm256_maddubs_epi16(minus4, qy));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale_halves(sc[g], sc[g + 1]), p16));
            }
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

/* Q5_K: the codes as Q4_K's plus bit 2c (even group) or 2c+1 (odd) of qh[l] as
 * bit 4; codes 0..31 keep the maddubs pair sums below 2 * 31 * 128. The mins are
 * one integer per block, FMA'd by -(dy * dmin) into a scalar added at the end (a
 * multiply and add in llama.cpp's source, which its FMA build contracts into one). */
AVX2 float sq_vec_dot_q5_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q5_K *x = row;
    const blk_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        uint32_t u[4];
        k_unpack_scales(x[i].scales, u);
        const uint8_t *sc = (const uint8_t *)u;

        const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(u + 2)));
        const __m128i bs_lo = _mm_loadu_si128((const __m128i *)y[i].bsums);
        const __m128i bs_hi = _mm_loadu_si128((const __m128i *)(y[i].bsums + 8));
        const __m128i prod = _mm_madd_epi16(mins, _mm_hadd_epi16(bs_lo, bs_hi));
        const float dmin = -(y[i].d * h2f(x[i].dmin));
        summs = fmaf(dmin, (float)hsum_i32x4(prod), summs);

        const __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i b_lo = _mm256_set1_epi8((char)(1 << (2 * c))), b_hi = _mm256_set1_epi8((char)(2 << (2 * c)));
            const __m256i h_lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b_lo), b_lo), m16);
            const __m256i h_hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b_hi), b_hi), m16);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q4, m4), h_lo);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), h_hi);
            const __m256i y_lo = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
            const __m256i y_hi = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
            const __m256i p_lo = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * c]), _mm256_maddubs_epi16(lo, y_lo));
            const __m256i p_hi = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * c + 1]), _mm256_maddubs_epi16(hi, y_hi));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p_lo, p_hi));
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc) + summs;
}

/* Q6_K: the codes q (0..63) multiply the activations unsigned, pair sums at most
 * 2 * 63 * 128; the -32 offset comes off afterwards as 32 * (sc * bsum) lanes, two
 * groups each, as in llama.cpp (not per element: that would fill the lanes differently). */
AVX2 float sq_vec_dot_q6_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_q6_K *x = row;
    const blk_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m2 = _mm256_set1_epi8(0x03), m2_2 = _mm256_set1_epi8(0x0c);
    const __m256i m2_4 = _mm256_set1_epi8(0x30), m2_6 = _mm256_set1_epi8((char)0xc0);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        /* Even groups' scales in the low 128 bits, odd groups' in the high: the scales of
         * groups g and g+1 (a register of codes, one per half) are one byte shuffle away. */
        const __m256i sc_pairs = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *q8 = y[i].qs + 128 * h;
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            /* Elements 0..31, 32..63, 64..95, 96..127 of the half (order of decode_q6_K). */
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2_2), 2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), _mm256_and_si256(hb, m2_4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                   _mm256_srli_epi16(_mm256_and_si256(hb, m2_6), 2));
            for (int c = 0; c < 4; c++) {
                const int g = 8 * h + 2 * c; /* groups g (bytes 0..15) and g+1 (16..31) */
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(q8 + 32 * c));
                const __m256i scale = _mm256_shuffle_epi8(sc_pairs, _mm256_set1_epi16((short)(0x0101 * g + 0x0100)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q[c], qy)));
            }
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

/* IQ4_XS: the grid (quants.c's kvalues_iq4nl) is looked up 16 codes at a time
 * with a byte shuffle, in each 128-bit half. Every group's int16 pair sums are
 * multiplied by its scale s - 32 in the widening madd, and the 8 groups of a
 * super-block summed in int32 before the one FMA; quants.c's vec_dot_iq4_xs
 * forms the same lane sums, so the two agree bit for bit. */
static const int8_t iq4_grid[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

AVX2 float sq_vec_dot_iq4_xs_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const blk_iq4_xs *x = row;
    const blk_q8_K *y = xq;
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        __m256i sumi = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const int s = ((x[i].scales_l[g / 2] >> (4 * (g % 2))) & 0x0f) | ((x[i].scales_h >> (2 * g)) & 3) << 4;
            const __m256i w = _mm256_shuffle_epi8(grid, nibbles32(x[i].qs + 16 * g));
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * g));
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(qy, w));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16((short)(s - 32))));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

/* Eight Q6_K rows at once in the tiled order of sq_batch_dot_q6_K_avx2, each row with its
 * bits: per block the exact sum s1 = sum(scale * code * a) - 32 * sum(scale * bsums), then
 * y = fma(d * s1, a->d, y). As in sq_batch_dot8_q4_K_avx2, the rows sit in the lanes (4
 * consecutive codes of each row per 32-bit word) and activation words are broadcast.
 * Two maddubs results fit an int16 (2 * 2 * 63 * 128 = 32256), so pairs are summed
 * before each group's scale multiplies them. y[t * ldy + r] for r < 8. */
AVX2 void sq_batch_dot8_q6_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride,
                                  int n_tokens, int64_t nb, float *y, int64_t ldy) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    __m256i codes[8][8];   /* [chunk k: elements 32k..][word j: elements 32k + 4j..+3], 8 rows */
    __m256i scale[16];     /* group g (16 elements): each row's scale as two int16 */
    __m256i bs_scale[8];   /* groups 2p, 2p+1: each row's (scale 2p, scale 2p+1) as int16 */
    for (int t = 0; t < n_tokens; t++)
        _mm256_storeu_ps(y + t * ldy, _mm256_setzero_ps());
    for (int64_t i = 0; i < nb; i++) {
        float dr[8];
        int32_t sc_words[16][8], pair_words[8][8];
        for (int r = 0; r < 8; r++) {
            const blk_q6_K *x = (const blk_q6_K *)((const uint8_t *)rows + r * row_bytes) + i;
            for (int g = 0; g < 16; g++)
                sc_words[g][r] = (int32_t)((uint16_t)x->scales[g] | (uint32_t)(uint16_t)x->scales[g] << 16);
            for (int p = 0; p < 8; p++)
                pair_words[p][r] = (int32_t)((uint16_t)x->scales[2 * p] | (uint32_t)(uint16_t)x->scales[2 * p + 1] << 16);
            dr[r] = h2f(x->d);
        }
        for (int g = 0; g < 16; g++)
            scale[g] = _mm256_loadu_si256((const __m256i *)sc_words[g]);
        for (int p = 0; p < 8; p++)
            bs_scale[p] = _mm256_loadu_si256((const __m256i *)pair_words[p]);
        for (int k = 0; k < 8; k++) {
            const int h = k / 4, part = k % 4;  /* elements 128h + 32 part .. */
            __m256i q[8];
            for (int r = 0; r < 8; r++) {
                const blk_q6_K *x = (const blk_q6_K *)((const uint8_t *)rows + r * row_bytes) + i;
                const __m256i l = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (part & 1)));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
                const __m256i low = part < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * part), m2);
                q[r] = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
            }
            transpose8_epi32(q);
            for (int j = 0; j < 8; j++)
                codes[k][j] = q[j];
        }
        const __m256 d_rows = _mm256_loadu_ps(dr);
        for (int t = 0; t < n_tokens; t++) {
            const blk_q8_K *a = (const blk_q8_K *)((const uint8_t *)xq + t * stride) + i;
            __m256i acc = _mm256_setzero_si256(), off = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                const int8_t *aq = a->qs + 32 * k;
                for (int half = 0; half < 2; half++) {  /* group 2k + half: words 4 half .. +3 */
                    __m256i s16[2];
                    for (int u = 0; u < 2; u++) {
                        const int j = 4 * half + 2 * u;
                        int32_t w0, w1;
                        memcpy(&w0, aq + 4 * j, 4);
                        memcpy(&w1, aq + 4 * j + 4, 4);
                        s16[u] = _mm256_add_epi16(_mm256_maddubs_epi16(codes[k][j], _mm256_set1_epi32(w0)),
                                                  _mm256_maddubs_epi16(codes[k][j + 1], _mm256_set1_epi32(w1)));
                    }
                    const __m256i sc = scale[2 * k + half];
                    acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(s16[0], sc), _mm256_madd_epi16(s16[1], sc)));
                }
            }
            for (int p = 0; p < 8; p++) {
                const int32_t pair = (int32_t)((uint32_t)(uint16_t)a->bsums[2 * p] | (uint32_t)(uint16_t)a->bsums[2 * p + 1] << 16);
                off = _mm256_add_epi32(off, _mm256_madd_epi16(bs_scale[p], _mm256_set1_epi32(pair)));
            }
            const __m256i s1 = _mm256_sub_epi32(acc, _mm256_slli_epi32(off, 5));
            float *yt = y + t * ldy;
            _mm256_storeu_ps(yt, _mm256_fmadd_ps(_mm256_mul_ps(d_rows, _mm256_cvtepi32_ps(s1)), _mm256_set1_ps(a->d),
                                                 _mm256_loadu_ps(yt)));
        }
    }
}

/* Q6_K times n_tokens activation rows (stride bytes apart) in llama.cpp's tiled
 * order, as quants.c's batch_dot_k: per block the exact integer
 * s1 = sum(sc * (q - 32) * qy), formed as sum(sc * q * qy) - 32 * sum(sc * bsum), then
 * y = fma(d * s1, dy, y). The 6-bit codes are assembled once per block for all rows. */
AVX2 void sq_batch_dot_q6_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                                 float *y, int64_t ldy) {
    const blk_q6_K *x = row;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    for (int t = 0; t < n_tokens; t++)
        y[t * ldy] = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        /* Chunk 4h + k holds elements 128h + 32k .. +32, groups 2(4h + k) and 2(4h + k) + 1. */
        __m256i q[8], scv[8];
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
        }
        for (int j = 0; j < 8; j++)
            scv[j] = scale_halves(x[i].scales[2 * j], x[i].scales[2 * j + 1]);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const float d = h2f(x[i].d);
        for (int t = 0; t < n_tokens; t++) {
            const blk_q8_K *a = (const blk_q8_K *)((const uint8_t *)xq + t * stride) + i;
            __m256i acc = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * j));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(scv[j], _mm256_maddubs_epi16(q[j], qy)));
            }
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a->bsums));
            const int32_t s1 = hsum8_i32(acc) - 32 * hsum8_i32(off);
            y[t * ldy] = __builtin_fmaf(d * (float)s1, a->d, y[t * ldy]);
        }
    }
}

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_avx2_unused;
#endif
