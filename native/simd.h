/* simd.h: what the kernel's SIMD code shares.
 *
 * The build passes no -march flag, so one binary serves every CPU of its architecture:
 * code for AVX2 is compiled inside functions that carry a target attribute, and runs
 * only once the CPU check has passed (sq_simd_enabled, set up by quants/dispatch.c).
 * This header holds, once each:
 *  - which SIMD code this build carries (SQ_X86, SQ_NEON) and the AVX2 target;
 *  - the CPU checks behind the choice;
 *  - the "written once, compiled twice" pattern (SQ_TWIN, SQ_COMPILED_TWICE);
 *  - the horizontal sums whose order every path keeps, plain and on AVX2 registers.
 * Why the order of those sums is fixed to the bit: quants/types.h.
 */
#ifndef SMOLQ_SIMD_H
#define SMOLQ_SIMD_H

/* ---------------------------------------------------------------------------
 * What this build carries
 * ------------------------------------------------------------------------- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* AVX2/FMA/F16C code (and AVX-512 VNNI vec_dots), chosen at run time. */
#define SQ_X86 1
#include <immintrin.h>
#define SQ_AVX2 __attribute__((target("avx2,fma,f16c")))
#if defined(__linux__) || defined(SQ_VNNI_VIA_SIMDE)
/* AMX tiles for a prompt's products (quants/x86/amx_tiles.h): Linux is the OS whose
 * request for them cpu_x86.c makes; the test build's stand-ins run anywhere. */
#define SQ_AMX 1
#endif
#elif defined(__aarch64__)
/* NEON code: Advanced SIMD is part of every AArch64 CPU, so no check is needed. */
#define SQ_NEON 1
#endif

/* Whether the SIMD paths (AVX2/FMA, AVX-512 VNNI or NEON) are in use: the setting
 * sq_simd_name and sq_set_simd (smolq.h) report and change. */
int sq_simd_enabled(void);

/* Whether the 512-bit code is in use (the "avx512vnni" setting): a prefill's attention
 * (flash_attention_x16.c) as well as the vec_dots of quants/x86/avx512vnni.c. */
int sq_simd_512(void);

/* Whether a prompt's products take AMX tiles (the "amx" setting). */
int sq_simd_amx(void);

/* ---------------------------------------------------------------------------
 * CPU checks
 * ------------------------------------------------------------------------- */

#ifdef SQ_X86
/* Whether the CPU has the instructions of the AVX2 code (AVX2, and FMA and F16C, which
 * every AVX2 CPU has; checked all the same) and the OS saves the YMM registers; and
 * whether it has those of the 512-bit code (AVX-512 F, BW, VL and VNNI) and the OS saves
 * the mask and ZMM registers too. From CPUID and XGETBV (cpu_x86.c); in the SIMDe test
 * build the second is always 1. */
int sq_cpu_has_avx2(void);
int sq_cpu_has_avx512vnni(void);
/* Whether AMD made the CPU (CPUID leaf 0's "AuthenticAMD"): the 512-bit kernels choose
 * decode's prefetches by it (decode_fetch, x86/avx512vnni.c). */
int sq_cpu_is_amd(void);
#ifdef SQ_AMX
/* Whether the CPU has AMX's tiles and int8 products (and the 512-bit code's instructions),
 * and the OS lets this process use the tiles: each call asks Linux for them (arch_prctl
 * ARCH_REQ_XCOMP_PERM; granted once, the grant is the process's for good), a refusal is a
 * 0. Always 1 in the SIMDe test build. */
int sq_cpu_has_amx(void);
#endif
#endif

/* ---------------------------------------------------------------------------
 * Written once, compiled twice
 *
 * Some code (the F32 cache's attention, SwiGLU, the tiled batch order) is plain C that
 * gains from AVX2/FMA: the loops vectorize and fmaf becomes one instruction. It is
 * written once and compiled twice, plainly and inside a target("avx2,fma,f16c")
 * wrapper; both copies give the same bits, since fmaf rounds once either way and the
 * source fixes the order of every other operation.
 * ------------------------------------------------------------------------- */

/* For code compiled twice: forced inline, so that the wrapper's copy really is compiled
 * for AVX2/FMA (a call out to a shared copy would run plain code, and fmaf as a library
 * call). */
#define SQ_TWIN static inline __attribute__((always_inline))

/* `linkage void name params`, which runs body args (an SQ_TWIN function) from its AVX2
 * copy while the SIMD paths are on and from its plain copy otherwise (only the plain one
 * where the build has no AVX2 code). linkage is static or extern; params is the
 * parenthesized parameter list and args the same names as a call's arguments. */
#ifdef SQ_X86
#define SQ_COMPILED_TWICE(linkage, name, body, params, args) \
    SQ_AVX2 static void name##_avx2 params { body args; }    \
    static void name##_plain params { body args; }           \
    linkage void name params {                               \
        if (sq_simd_enabled())                               \
            name##_avx2 args;                                \
        else                                                 \
            name##_plain args;                               \
    }
#else
#define SQ_COMPILED_TWICE(linkage, name, body, params, args) \
    linkage void name params { body args; }
#endif

/* ---------------------------------------------------------------------------
 * Horizontal sums
 *
 * Two orders of adding 8 float lanes occur in llama.cpp's CPU code, and each kernel
 * here keeps the one of the code it matches; a float sum's value depends on its order.
 * ------------------------------------------------------------------------- */

/* The order of the quantized dot products (llama.cpp's hsum_float_8): lane l + lane
 * l + 4 (the two halves of a register), then those four as (0 + 2) + (1 + 3). */
SQ_TWIN float sq_hsum8(const float a[8]) {
    const float t0 = a[0] + a[4], t1 = a[1] + a[5];
    const float t2 = a[2] + a[6], t3 = a[3] + a[7];
    return (t0 + t2) + (t1 + t3);
}

/* The order that ends llama.cpp's float vector dot products: the halves as above, then
 * those four as (0 + 1) + (2 + 3). */
SQ_TWIN float sq_reduce8(const float a[8]) {
    const float t0 = a[0] + a[4], t1 = a[1] + a[5];
    const float t2 = a[2] + a[6], t3 = a[3] + a[7];
    return (t0 + t1) + (t2 + t3);
}

/* 32 lanes, held as four registers of 8 (lane l of register j is a[8j + l]), in
 * llama.cpp's float vector dot product order: registers (0 + 2) + (1 + 3), lane by
 * lane, then sq_reduce8. */
SQ_TWIN float sq_reduce32(const float a[32]) {
    float r[8];
    for (int l = 0; l < 8; l++)
        r[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    return sq_reduce8(r);
}

#ifdef SQ_X86
/* sq_hsum8 of a register. */
SQ_AVX2 static inline __attribute__((always_inline)) float sq_hsum8_avx2(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* sq_hsum8's order with max (a > b ? a : b) in place of + (flash_attention.c's max32). */
SQ_AVX2 static inline __attribute__((always_inline)) float sq_hmax8_avx2(__m256 t) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float a = _mm_cvtss_f32(h), b = _mm_cvtss_f32(_mm_shuffle_ps(h, h, 1));
    return a > b ? a : b;
}

/* Eight registers of eight 32-bit values transposed: value j of r[i] becomes value i of
 * r[j]. Only moves data, so it serves floats and integers alike. */
SQ_AVX2 static inline __attribute__((always_inline)) void sq_transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* sq_transpose8 of integer registers. */
SQ_AVX2 static inline __attribute__((always_inline)) void sq_transpose8_epi32(__m256i v[8]) {
    __m256 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_castsi256_ps(v[i]);
    sq_transpose8(r);
    for (int i = 0; i < 8; i++)
        v[i] = _mm256_castps_si256(r[i]);
}
#endif

#endif
