/* quants.h: scalar conversions shared by the kernel's C files. The block layouts are
 * in quant_blocks.h; the row decoders and dot products live in quants.c, declared in
 * smolq.h. */
#ifndef SMOLQ_QUANTS_H
#define SMOLQ_QUANTS_H
#include <stdint.h>

/* IEEE half <-> single, exact (round-to-nearest-even on the way down). */
float sq_fp16_to_fp32(uint16_t h);
uint16_t sq_fp32_to_fp16(float f);

/* bfloat16 is the top half of a float32. */
static inline float sq_bf16_to_fp32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

/* float32 -> bfloat16, rounding to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t sq_fp32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* For code written once and compiled twice, plainly and inside a target("avx2,fma")
 * wrapper: forced inline, so that the wrapper's copy really is compiled for AVX2/FMA
 * (a call out to a shared copy would run plain code, and fmaf as a library call). */
#define SQ_TWIN static inline __attribute__((always_inline))

/* The 12 quantized vec_dots of one SIMD copy (suffix avx2, avx512vnni or neon):
 * sq_vec_dot_<type>_<suffix>, the contract of quants.c's scalar vec_dot_<type> plus a
 * `stop` that bounds how far ahead a kernel may prefetch weights. */
#define SQ_DECLARE_VEC_DOTS(suffix)                                                        \
    float sq_vec_dot_q4_0_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_iq4_nl_##suffix(const void *row, const void *xq, int64_t nb, const void *stop); \
    float sq_vec_dot_q4_1_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q5_0_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q5_1_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q8_0_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q2_K_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q3_K_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q4_K_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q5_K_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_q6_K_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);   \
    float sq_vec_dot_iq4_xs_##suffix(const void *row, const void *xq, int64_t nb, const void *stop);

/* AVX2/FMA vec_dot functions (quants_avx2.c), same contract as quants.c's scalar
 * vec_dot_<type>: nb blocks of weights times activations in the paired format. They
 * prefetch weights ahead of the block they work on, up to `stop`: the end of the row,
 * or of the last of the rows a mat-vec is going through.
 * Compiled with target attributes; call only when the CPU has AVX2, FMA and F16C. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SQ_HAVE_AVX2_KERNELS 1
SQ_DECLARE_VEC_DOTS(avx2)
/* The same for four activation rows stride bytes apart, into out[0..3], each exactly
 * as the one-row function computes it. */
void sq_vec_dot4_q4_1_avx2(const void *row, const void *xq, int64_t stride, int64_t nb, float *out);
/* Q4_K rows times n_tokens activation rows in llama.cpp's repacked-gemm order (quants.c's
 * batch_dot_q4_K, same bits). */
void sq_batch_dot_q4_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy);
/* Eight Q4_K rows row_bytes apart at once, each with sq_batch_dot_q4_K_avx2's bits:
 * y[t * ldy + r] for r < 8. */
void sq_batch_dot8_q4_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, float *y, int64_t ldy);
/* Q6_K rows times n_tokens activation rows in llama.cpp's tiled order (quants.c's
 * batch_dot_k, same bits). */
void sq_batch_dot_q6_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy);
/* Eight Q6_K rows at once, each with sq_batch_dot_q6_K_avx2's bits: y[t * ldy + r], r < 8. */
void sq_batch_dot8_q6_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, float *y, int64_t ldy);

/* The same vec_dots for CPUs with AVX-512 VNNI, VL and BW as well (quants_avx512vnni.c):
 * the AVX2 ones' contract and bits. Call only when the CPU has all of those and the
 * AVX2 set; a build with SQ_VNNI_VIA_SIMDE needs only the AVX2 set. */
SQ_DECLARE_VEC_DOTS(avx512vnni)
#endif

/* NEON vec_dot functions (quants_neon.c), the same contract and the same bits as the
 * scalar ones. Advanced SIMD is part of every AArch64 CPU: no run-time check needed.
 * They take the AVX2 ones' `stop` but do not prefetch: that paid off on one x86 core
 * and has not been measured on an arm64 one. */
#if defined(__aarch64__)
#define SQ_HAVE_NEON_KERNELS 1
SQ_DECLARE_VEC_DOTS(neon)
/* Batches with the bits of quants.c's batch_dot_q4_K and (for Q6_K) batch_dot_k. */
void sq_batch_dot_q4_K_neon(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy);
void sq_batch_dot_q6_K_neon(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy);
#endif

/* Whether the SIMD paths (AVX2/FMA, AVX-512 VNNI or NEON) are in use (the setting
 * sq_simd_name reports). */
int sq_simd_enabled(void);

#endif
