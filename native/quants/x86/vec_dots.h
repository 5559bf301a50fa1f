/* quants/x86/vec_dots.h: the x86-64 vec_dot kernels, written once and compiled twice:
 * by x86/avx2.c for AVX2/FMA/F16C, and by x86/avx512vnni.c for CPUs that also have
 * AVX-512 VNNI (with VL and BW), where two integer steps each become one instruction.
 * Both copies work in 256-bit registers and put the same value in every int32 lane, so
 * their float steps, and their results, are the same bits.
 *
 * quants/dispatch.c selects a copy at run time (see sq_simd_name / sq_set_simd) from
 * what the CPU has; every function here carries a target attribute, and nothing here
 * runs unless that check passed (simd.h).
 *
 * The shape follows llama.cpp's AVX2 kernels: per block, the codes are multiplied
 * as bytes with maddubs (unsigned x signed, pairs summed to int16), widened with
 * madd (int16 pairs summed to int32, times a group scale where the type has one),
 * converted to float and accumulated with an FMA by the block's combined float
 * scale into 8 float lanes, which a final horizontal sum adds up. Every kernel here
 * has a scalar twin in quants/scalar.c with the same float steps, so the two paths
 * agree bit for bit (quants/types.h says why that holds). The VNNI copy forms the
 * same int32 lanes with vpdpbusd (the 4 byte products of a lane summed straight into
 * int32) where a product has no group scale, and with vpdpwssd (madd and the add
 * after it) where it has one.
 *
 * maddubs saturates int16: every use here stays below it. Q4 nibbles (0..15) and
 * Q6_K codes (0..63) times activation codes (-127..127, as the quantizers make
 * them) give pair sums of at most 3810 and 16002, Q5_1's (0..31) 7874 (Q2_K, Q3_K
 * and Q5_K codes are smaller); signed x signed (Q8_0, Q4_0, Q5_0, the IQ4 grid)
 * goes through |x| and sign(y, x), at most 2 * 128 * 127 = 32512.
 *
 * The including file defines SQ_X86_VNNI for the VNNI copy and nothing for the AVX2
 * one; KERNEL(vec_dot_q8_0) is then sq_vec_dot_q8_0_avx512vnni or sq_vec_dot_q8_0_avx2.
 * With SQ_VNNI_VIA_SIMDE (a test build) the VNNI instructions come from SIMDe's
 * portable versions of them and the VNNI copy targets plain AVX2, so that it runs, and
 * is tested, on any AVX2 CPU.
 */
#ifndef SMOLQ_QUANTS_X86_VEC_DOTS_H
#define SMOLQ_QUANTS_X86_VEC_DOTS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quants/kernels.h"

#if !defined(SQ_X86_VNNI)
#define TARGET SQ_AVX2
#define KERNEL(fn) sq_##fn##_avx2
#elif defined(SQ_VNNI_VIA_SIMDE)
#ifdef __clang__
#include <simde/x86/avx512/dpbusd.h>
#include <simde/x86/avx512/dpwssd.h>
#else
/* gcc: SIMDe's AVX2 code; under this pragma gcc defines __AVX2__, from which SIMDe
 * takes what it may use. SIMDE_NO_CONVERT_VECTOR makes it write vpdpbusd as a plain
 * loop over the 32 byte products instead of widening 32 bytes at once into a 128-byte
 * vector, which gcc 12 takes apart with a byte extract per element: the test build's
 * engine tests ran in half the time. (Either way far slower than the real instruction;
 * this build is for checking bits, not speed.) */
#define SIMDE_NO_CONVERT_VECTOR
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <simde/x86/avx512/dpbusd.h>
#include <simde/x86/avx512/dpwssd.h>
#pragma GCC pop_options
#endif
#define TARGET SQ_AVX2
#define KERNEL(fn) sq_##fn##_avx512vnni
#else
#define TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define KERNEL(fn) sq_##fn##_avx512vnni
#endif

/* ---------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------- */

/* f16 -> f32 with F16C: exact for every half, as quants/scalar.c's conversion is. */
static inline TARGET float h2f(uint16_t h) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* Sum of 4 int32 lanes (exact, so in any order). */
static inline TARGET int32_t hsum_i32x4(__m128i v) {
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 1));
    return _mm_cvtsi128_si32(v);
}

/* Sum of 8 int32 lanes (exact, so any order will do). */
static inline TARGET int32_t hsum8_i32(__m256i v) {
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
 * columns), best at 1.5-3 KiB ahead, into L1.
 * The VNNI copy asks into L2 only (prefetcht1), 3 KiB ahead, then for the same lines
 * into L1 512 bytes ahead: on the Xeon with AVX-512 the requests for L1 from afar used up
 * the core's line fill buffers and the prefetches waited on them. The 3B shape's decode
 * went 8-13% faster with the L2 requests, and 3-6% more with the near ones (SmolLM2's
 * 4%). (The AVX2 copy, run on the same Xeon, gained nothing from the L2 requests; it
 * keeps the setting measured on the AVX2-only machines.) */
#ifdef SQ_X86_VNNI
#define PREFETCH_AHEAD 3072
#define PREFETCH_INTO _MM_HINT_T1
#define PREFETCH_NEAR 512
#else
#define PREFETCH_AHEAD 2048
#define PREFETCH_INTO _MM_HINT_T0
#define PREFETCH_NEAR 0 /* none */
#endif
/* Always inlined, as every prefetch helper here: GCC sees no side effect in a prefetch,
 * so a helper left out of line is taken for a function without effects, and its calls,
 * reached through another inlined function, are deleted (it took every prefetch out of
 * the sixteen-row kernels once their bodies became inline functions). */
static inline __attribute__((always_inline)) TARGET void prefetch_ahead(const void *block, int bytes, const void *stop) {
    const uintptr_t ahead = (uintptr_t)block + PREFETCH_AHEAD, near = (uintptr_t)block + PREFETCH_NEAR;
    for (int k = 0; k < bytes; k += 64) {
        if (ahead + (uintptr_t)k < (uintptr_t)stop)
            _mm_prefetch((const char *)(ahead + (uintptr_t)k), PREFETCH_INTO);
        if (PREFETCH_NEAR && near + (uintptr_t)k < (uintptr_t)stop)
            _mm_prefetch((const char *)(near + (uintptr_t)k), _MM_HINT_T0);
    }
}

/* 16 bytes of nibbles -> 32 codes 0..15: low nibbles in bytes 0..15, high in 16..31
 * (the element order of Q4_0/Q4_1 blocks). */
static inline TARGET __m256i nibbles32(const uint8_t *p) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

/* The two integer steps the VNNI copy does in one instruction each. Their lanes are
 * the AVX2 copy's: exact sums, in an order that does not matter for integers. */
#ifdef SQ_X86_VNNI
#ifdef SQ_VNNI_VIA_SIMDE
/* SIMDe's vector type has __m256i's size but another element type: a cast converts. */
static inline TARGET __m256i vnni_dpbusd(__m256i acc, __m256i u, __m256i s) {
    return (__m256i)simde_mm256_dpbusd_epi32((simde__m256i)acc, (simde__m256i)u, (simde__m256i)s);
}
static inline TARGET __m256i vnni_dpwssd(__m256i acc, __m256i a, __m256i b) {
    return (__m256i)simde_mm256_dpwssd_epi32((simde__m256i)acc, (simde__m256i)a, (simde__m256i)b);
}
#else
static inline TARGET __m256i vnni_dpbusd(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(acc, u, s);
}
static inline TARGET __m256i vnni_dpwssd(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_epi32(acc, a, b);
}
#endif
#endif

/* Sum of 32 products of unsigned bytes u and signed bytes s, as 8 int32 lanes: lane j
 * holds the 4 products of bytes 4j..4j+3. (vpdpbusd does not saturate where maddubs
 * would, but no kernel here comes near that: the same lanes either way.) */
static inline TARGET __m256i dot_us8(__m256i u, __m256i s) {
#ifdef SQ_X86_VNNI
    return vnni_dpbusd(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* acc + madd(a, b): int16 pairs multiplied and summed into int32 lanes (a group scale
 * times maddubs's pair sums, in the K kernels), added to acc. */
static inline TARGET __m256i madd_add(__m256i acc, __m256i a, __m256i b) {
#ifdef SQ_X86_VNNI
    return vnni_dpwssd(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* The same for two signed operands: |x| times y with x's sign moved onto it. */
static inline TARGET __m256i dot_ss8(__m256i x, __m256i y) {
    return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ---------------------------------------------------------------------------
 * 32-element blocks with Q8_0 / Q8_1 activations
 * ------------------------------------------------------------------------- */

TARGET float KERNEL(vec_dot_q8_0)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q8_0 *x = row, *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_ss8(qx, qy)), acc);
    }
    return sq_hsum8_avx2(acc);
}

/* Q4_0 and IQ4_NL: one whole-block integer sum, then one fma per block in block
 * order, the chain each lane of llama.cpp's repacked (8-row) kernels runs. */
TARGET float KERNEL(vec_dot_q4_0)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q4_0 *x = row;
    const block_q8_0 *y = xq;
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
TARGET float KERNEL(vec_dot_iq4_nl)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_iq4_nl *x = row;
    const block_q8_0 *y = xq;
    const __m128i grid = _mm_setr_epi8(SQ_IQ4_GRID);
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
static inline TARGET __m128 h2f_pair(const uint16_t *h) {
    uint32_t both;
    memcpy(&both, h, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)both));
}

/* Per block: lane 0 of x's (d, m) times y's (d, s) is the codes' scale d*dy, lane 1
 * the block's min term m*s, summed in lane 1 of `summs` (lane 0 collects nothing of use). */
TARGET float KERNEL(vec_dot_q4_1)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q4_1 *x = row;
    const block_q8_1 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    __m128 summs = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128 scales = _mm_mul_ps(h2f_pair(&x[i].d), h2f_pair(&y[i].d));
        summs = _mm_add_ps(summs, scales);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), _mm256_cvtepi32_ps(dot_us8(nibbles32(x[i].qs), qy)), acc);
    }
    return sq_hsum8_avx2(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summs));
}

/* Bit 4 of the 32 codes of a Q5_0/Q5_1 block as bytes 0x10 or 0: byte j copies
 * byte j / 8 of qh (bit j of the little-endian word is element j's) and keeps
 * bit j % 8. The element order is nibbles32's, which the lanes depend on. */
static inline TARGET __m256i q5_bit4(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

/* scalar.c's vec_dot_q5_0 does the same lane by lane. */
TARGET float KERNEL(vec_dot_q5_0)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q5_0 *x = row;
    const block_q8_0 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256i q = _mm256_or_si256(nibbles32(x[i].qs), q5_bit4(x[i].qh));
        const __m256i qx = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_ss8(qx, qy)), acc);
    }
    return sq_hsum8_avx2(acc);
}

/* As Q4_1 with 5-bit codes, as scalar.c's vec_dot_q5_1. */
TARGET float KERNEL(vec_dot_q5_1)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q5_1 *x = row;
    const block_q8_1 *y = xq;
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
    return sq_hsum8_avx2(acc) + summs;
}

/* ---------------------------------------------------------------------------
 * 256-element blocks with Q8_K activations
 * ------------------------------------------------------------------------- */

/* The 8 6-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K/Q5_K block, from
 * their 12 packed bytes a 32-bit word at a time (blocks.h's sq_k_scale_min gives the same
 * values one pair at a time). Reads 16 bytes from s: the 12 and 4 of the codes after. */
static inline TARGET __m128i k_scales_mins(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* words a0 a2 a1 a2 */
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* words a0 a0 a1 a1 */
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i high = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(low, high);
}

/* int16 word w (0..7) of each 128-bit half of v, in every word of that half. */
static inline TARGET __m256i broadcast_word(__m256i v, int w) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0202 * w + 0x0100)));
}

/* Q4_K: whole-block integer sums for the codes and the mins, then two fma chains
 * in block order (lanes 0 and 1 of acc) subtracted at the end, as each lane of
 * llama.cpp's repacked (8-row) Q4_K kernel computes it. The group scales stay in a
 * register and are spread over the codes with byte shuffles. */
TARGET float KERNEL(vec_dot_q4_K)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q4_K *x = row;
    const block_q8_K *y = xq;
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
            sumi = madd_add(sumi, broadcast_word(sc, 2 * c), _mm256_maddubs_epi16(lo, y_lo));
            sumi = madd_add(sumi, broadcast_word(sc, 2 * c + 1), _mm256_maddubs_epi16(hi, y_hi));
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

/* Q2_K, Q3_K, Q5_K and Q6_K keep the integer lanes of llama.cpp's AVX2 kernels (scalar.c
 * describes them). Every group of 16 lies in one 128-bit half of a register of 32 codes,
 * so its scale is one int16 broadcast over that half. */
static inline TARGET __m256i scale_halves(int lo, int hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)lo)), _mm_set1_epi16((short)hi), 1);
}

/* Q2_K: the min lanes (mn[2l] * bsums[2l] + mn[2l+1] * bsums[2l+1]) go into the
 * accumulators first, by -(dy * dmin); then the code lanes by dy * d. */
TARGET float KERNEL(vec_dot_q2_K)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q2_K *x = row;
    const block_q8_K *y = xq;
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
                sumi = madd_add(sumi, sc, _mm256_maddubs_epi16(q, qy));
            }
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return sq_hsum8_avx2(acc);
}

/* Q3_K: q = low2 - 4 * (hbit clear) is taken as maddubs(low2, y) - maddubs(4 or 0, y),
 * both unsigned times signed; the pair sums are at most 2 * 4 * 128. */
TARGET float KERNEL(vec_dot_q3_K)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q3_K *x = row;
    const block_q8_K *y = xq;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4), zero = _mm256_setzero_si256();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        int sc[16];
        for (int g = 0; g < 16; g++)
            sc[g] = sq_q3_K_scale(x[i].scales, g);
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
                sumi = madd_add(sumi, scale_halves(sc[g], sc[g + 1]), p16);
            }
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return sq_hsum8_avx2(acc);
}

/* Q5_K: the codes as Q4_K's plus bit 2c (even group) or 2c+1 (odd) of qh[l] as
 * bit 4; codes 0..31 keep the maddubs pair sums below 2 * 31 * 128. The mins are
 * one integer per block, FMA'd by -(dy * dmin) into a scalar added at the end (a
 * multiply and add in llama.cpp's source, which its FMA build contracts into one). */
TARGET float KERNEL(vec_dot_q5_K)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q5_K *x = row;
    const block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128i sc_mn = k_scales_mins(x[i].scales);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc_mn)); /* int16 sc[g] */

        const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sc_mn, sc_mn));
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
            sumi = madd_add(sumi, broadcast_word(sc, 2 * c), _mm256_maddubs_epi16(lo, y_lo));
            sumi = madd_add(sumi, broadcast_word(sc, 2 * c + 1), _mm256_maddubs_epi16(hi, y_hi));
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return sq_hsum8_avx2(acc) + summs;
}

/* Q6_K: the codes q (0..63) multiply the activations unsigned, pair sums at most
 * 2 * 63 * 128; the -32 offset comes off afterwards as 32 * (sc * bsum) lanes, two
 * groups each, as in llama.cpp (not per element: that would fill the lanes differently). */
TARGET float KERNEL(vec_dot_q6_K)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q6_K *x = row;
    const block_q8_K *y = xq;
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
                sumi = madd_add(sumi, broadcast_word(sc_pairs, g / 2), _mm256_maddubs_epi16(q[c], qy));
            }
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return sq_hsum8_avx2(acc);
}

/* IQ4_XS: the grid (quants/blocks.h) is looked up 16 codes at a time with a byte
 * shuffle, in each 128-bit half. Every group's int16 pair sums are multiplied by its
 * scale s - 32 in the widening madd, and the 8 groups of a super-block summed in int32
 * before the one FMA; scalar.c's vec_dot_iq4_xs forms the same lane sums. */
static const int8_t iq4_grid[16] = { SQ_IQ4_GRID };

TARGET float KERNEL(vec_dot_iq4_xs)(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_iq4_xs *x = row;
    const block_q8_K *y = xq;
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        __m256i sumi = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const int s = sq_iq4_xs_scale(&x[i], g);
            const __m256i w = _mm256_shuffle_epi8(grid, nibbles32(x[i].qs + 16 * g));
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * g));
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(qy, w));
            sumi = madd_add(sumi, p16, _mm256_set1_epi16((short)(s - 32)));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return sq_hsum8_avx2(acc);
}

#endif
