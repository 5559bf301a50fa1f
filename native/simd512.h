/* simd512.h: sixteen 32-bit lanes, for the code that runs at the "avx512vnni" SIMD
 * setting (quants/x86/avx512vnni.c, flash_attention_x16.c).
 *
 * v16f and v16i are __m512 and __m512i, and V16(fn) is _mm512_fn; in the test build
 * that checks this code on AVX2 CPUs (SQ_VNNI_VIA_SIMDE, cffi_build/build_kernel.py)
 * they are SIMDe's stand-ins, made of two 256-bit halves, and SQ_AVX512 targets plain
 * AVX2. Each lane's arithmetic is the same either way, so the bits are too.
 */
#ifndef SMOLQ_SIMD512_H
#define SMOLQ_SIMD512_H

#include "simd.h"

#ifdef SQ_X86
#ifdef SQ_VNNI_VIA_SIMDE
/* gcc: SIMDe's AVX2 code; under the pragma gcc defines __AVX2__, from which SIMDe takes
 * what it may use. SIMDE_NO_CONVERT_VECTOR makes it write vpdpbusd as a plain loop over
 * the byte products instead of widening them all at once into one wide vector, which gcc
 * 12 takes apart with a byte extract per element: the test build's engine tests ran in
 * half the time. (Either way far slower than the real instruction; this build is for
 * checking bits, not speed.) */
#define SIMDE_NO_CONVERT_VECTOR
#ifndef __clang__
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include <simde/x86/avx512.h>
#ifndef __clang__
#pragma GCC pop_options
#endif
/* Without AVX-512, gcc warns that a 512-bit vector changes the calling convention; the
 * functions that pass one are static and inlined, so no call between files sees it. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef simde__m512i v16i;
typedef simde__m512 v16f;
typedef simde__mmask16 mask16;
#define V16(fn) simde_mm512_##fn
/* SIMDe's 128- and 256-bit types have __m128i's and __m256's sizes but other element
 * types: a cast converts. */
#define AS128I(x) ((simde__m128i)(x))
#define AS256I(x) ((simde__m256i)(x))
#define AS256D(x) ((simde__m256d)(x))
#define FROM256I(x) ((__m256i)(x))
#define SQ_AVX512 SQ_AVX2
#else
typedef __m512i v16i;
typedef __m512 v16f;
typedef __mmask16 mask16;
#define V16(fn) _mm512_##fn
#define AS128I(x) (x)
#define AS256I(x) (x)
#define AS256D(x) (x)
#define FROM256I(x) (x)
#define SQ_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#endif

/* Lanes 0-7 and 8-15 of x. */
static inline SQ_AVX512 __m256 sq_low8(v16f x) {
    return _mm256_castsi256_ps(FROM256I(V16(castsi512_si256)(V16(castps_si512)(x))));
}
static inline SQ_AVX512 __m256 sq_high8(v16f x) {
    return _mm256_castsi256_ps(FROM256I(V16(extracti64x4_epi64)(V16(castps_si512)(x), 1)));
}

/* The eight floats at p in both halves. */
static inline SQ_AVX512 v16f sq_both_halves(const float *p) {
    return V16(castpd_ps)(V16(broadcast_f64x4)(AS256D(_mm256_castps_pd(_mm256_loadu_ps(p)))));
}
#endif

#endif
