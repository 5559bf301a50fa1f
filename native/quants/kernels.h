/* quants/kernels.h: how the files of quants/ reach one another.
 *
 *   types.h      the list of types, and the definition of their products
 *   blocks.h     their block layouts
 *   scalar.c     the scalar definition of every type's products, and the type table
 *   types.c      what the table answers: geometry, decoding, conversion, names
 *   dispatch.c   the SIMD setting in use, the table of its kernels by type, and the
 *                dot products that choose from it
 *   rows16.c     matrices packed sixteen rows side by side for the 512-bit kernels
 *   x86/, arm/   the SIMD kernels, each with a scalar twin in scalar.c
 */
#ifndef SMOLQ_QUANTS_KERNELS_H
#define SMOLQ_QUANTS_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "smolq.h"
#include "simd.h"
#include "quants/blocks.h"
#include "quants/quants.h"
#include "quants/types.h"

/* ---------------------------------------------------------------------------
 * The type table (quants/scalar.c)
 * ------------------------------------------------------------------------- */

/* The bytes of a block of a quantized type (0 for any other): a constant wherever the type
 * is one, as in the kernels that take it as a parameter and are inlined for each type. */
#define SQ_BLOCK_SIZE_CASE(ctx, NAME, name, ...) case SQ_##NAME: return (int)sizeof(block_##name);
static inline int sq_block_size(const int type) {
    switch (type) {
    SQ_QUANT_TYPES(SQ_BLOCK_SIZE_CASE, _)
    default: return 0;
    }
}

/* Tables indexed by type have this many slots: every listed type's GGUF number is below. */
#define SQ_TYPE_SLOTS (SQ_BF16 + 1)
#define SQ_CHECK_SLOT(ctx, NAME, ...) \
    static_assert(SQ_##NAME >= 0 && SQ_##NAME < SQ_TYPE_SLOTS, "SQ_" #NAME " has no slot in the type tables");
SQ_FLOAT_TYPES(SQ_CHECK_SLOT, _)
SQ_QUANT_TYPES(SQ_CHECK_SLOT, _)
SQ_ACTIVATION_TYPES(SQ_CHECK_SLOT, _)

/* Row functions take a count of blocks (elements, for the float types). */
typedef void (*sq_dequant_fn)(const void *src, float *dst, int64_t nb);
typedef float (*sq_dot_fn)(const void *row, const float *x, int64_t nb);
typedef float (*sq_vec_dot_fn)(const void *row, const void *xq, int64_t nb);
typedef void (*sq_quantize_fn)(const float *x, void *dst, int64_t nb);
/* n_tokens activation rows xq_stride bytes apart times one weight row, into y[t * ldy]. */
typedef void (*sq_batch_fn)(const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy);

typedef struct {
    int elems, bytes;
    sq_dequant_fn dequant;
    sq_dot_fn dot;
    /* Weight types: the activation format and the dot product with a row of it, the
     * definition every kernel's bits follow (quants/types.h). */
    int vec_type;
    sq_vec_dot_fn vec_dot;
} sq_type_traits;

/* The table, by type; slots of no type have elems 0. */
extern const sq_type_traits sq_type_table[SQ_TYPE_SLOTS];
/* By activation format (the float types, Q8_0, Q8_1 and Q8_K): the conversion from floats. */
extern const sq_quantize_fn sq_quantizers[SQ_TYPE_SLOTS];

/* The traits of type, or NULL for a type the kernel does not know. */
static inline const sq_type_traits *sq_traits(int type) {
    if (type < 0 || type >= SQ_TYPE_SLOTS || sq_type_table[type].elems == 0)
        return NULL;
    return &sq_type_table[type];
}

/* The conversion from floats into activation format type, or NULL. */
static inline sq_quantize_fn sq_quantizer(int type) {
    return sq_traits(type) ? sq_quantizers[type] : NULL;
}

/* Blocks in n elements, or -1 unless t is a type and n a positive whole number of its blocks. */
static inline int64_t sq_whole_blocks(const sq_type_traits *t, int64_t n) {
    if (!t || n <= 0 || n % t->elems != 0)
        return -1;
    return n / t->elems;
}

/* ---------------------------------------------------------------------------
 * The SIMD kernels
 *
 * Every one gives every output the bits of scalar.c's vec_dot_<name> for its row and
 * token (quants/types.h), whatever rows and tokens it takes together; they differ only in
 * speed. sq_vec_dot_<name>_<simd>: the contract of vec_dot_<name> plus a `stop` that
 * bounds how far ahead a kernel may prefetch weights: the end of the row, or of the
 * last of the rows a mat-vec is going through. Each is chosen by its field in the row of
 * its setting and type in quants/dispatch.c's kernel table, and by nothing else.
 * ------------------------------------------------------------------------- */

typedef float (*sq_simd_vec_dot_fn)(const void *row, const void *xq, int64_t nb, const void *stop);
/* How a float type's vec_dot ends, in every copy (quants/scalar.c's VEC_DOT_LANES): sum,
 * its lanes' reduction, plus the products of elements i..n-1 of a and b, each rounded to
 * float and added one by one in double; then rounded to float. */
#define SQ_FLOAT_TAIL(name, unit_t, to_f32)                                                                   \
    static inline float sq_float_tail_##name(double sum, const void *a, const void *b, int64_t i, int64_t n) { \
        const unit_t *x = a, *y = b;                                                                          \
        for (; i < n; i++)                                                                                    \
            sum += (double)(to_f32(x[i]) * to_f32(y[i]));                                                     \
        return (float)sum;                                                                                    \
    }
static inline float sq_f32_of_f32(float f) { return f; }
SQ_FLOAT_TAIL(f32, float, sq_f32_of_f32)
SQ_FLOAT_TAIL(f16, uint16_t, sq_fp16_to_fp32)
SQ_FLOAT_TAIL(bf16, uint16_t, sq_bf16_to_fp32)
#define SQ_DECLARE_VEC_DOT(simd, NAME, name, ...) \
    float sq_vec_dot_##name##_##simd(const void *row, const void *xq, int64_t nb, const void *stop);
/* sq_vec_dotn_<name>_<simd> (x86-64 only, so far): the same for n activation rows stride
 * bytes apart (1 <= n <= SQ_DOTN_MAX), into out[0..n-1], each exactly as the one-row
 * function computes it; the weights' blocks are decoded once for the n, and prefetched
 * ahead up to stop as the one-row ones do.
 * Up to 9: a lookup check is the sampled token and up to 8 drafted ones (with 8, its
 * ninth token decoded every Q6_K row again: 3B ffn_down at 9 tokens, one thread, 6.45 ->
 * 6.02 ms, 8 tokens unchanged). */
#define SQ_DOTN_MAX 9
typedef void (*sq_vec_dotn_fn)(const void *row, const void *xq, int64_t stride, int n, int64_t nb,
                               const void *stop, float *out);
/* Rows side by side times n_tokens activation rows stride bytes apart, into
 * y[t * ldy + r]: eight rows row_bytes apart (sq_steps_dot8_*, sq_batch_dot8_*), sixteen
 * float rows (sq_steps_dot16_f*) or a group of sixteen packed by quants/rows16.c
 * (sq_packed_dot16_*, sq_packed_batch16_*), asking for the bytes to come up to stop. */
typedef void (*sq_rows_fn)(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                           int64_t nb, const void *stop, float *y, int64_t ldy);

#ifdef SQ_X86
/* AVX2/FMA (quants/x86/avx2.c), at both x86 settings: at "avx512vnni" for a matrix left in
 * the file's layout. They prefetch weights ahead of the block they work on, up to `stop`.
 * Compiled with target attributes; call only when the CPU has AVX2, FMA and F16C. */
SQ_QUANT_TYPES(SQ_DECLARE_VEC_DOT, avx2)
/* The float types' vec_dots with AVX2 and F16C (quants/x86/float_dots.c), at both x86
 * settings: a 512-bit copy would be held back by the same memory. */
SQ_FLOAT_TYPES(SQ_DECLARE_VEC_DOT, avx2)
/* The few-token kernels of quants/x86/step_order.h. */
void sq_vec_dotn_q4_1_avx2(const void *row, const void *xq, int64_t stride, int n, int64_t nb, const void *stop,
                           float *out);
void sq_vec_dotn_q8_0_avx2(const void *row, const void *xq, int64_t stride, int n, int64_t nb, const void *stop,
                           float *out);
void sq_vec_dotn_q6_K_avx2(const void *row, const void *xq, int64_t stride, int n, int64_t nb, const void *stop,
                           float *out);
/* Eight Q4_K rows row_bytes apart times n_tokens activation rows, each output with the
 * one-token vec_dot's bits for its row and token: y[t * ldy + r] for r < 8. It prefetches
 * the eight rows after these, up to stop. */
void sq_steps_dot8_q4_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
/* The same for eight Q4_1 rows. */
void sq_steps_dot8_q4_1_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
/* Sixteen F32, F16 or BF16 rows at once, each token with the one-token vec_dot's bits
 * (quants/x86/float_dots.c): y[t * ldy + r] for r < 16 (VNNI setting only). */
void sq_steps_dot16_f32_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                                   int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot16_f16_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                                   int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot16_bf16_avx512vnni(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                                    int64_t nb, const void *stop, float *y, int64_t ldy);
/* A group of sixteen rows of a quantized type packed side by side (quants/rows16.c) times
 * n_tokens activation rows as sq_quantize_activations writes them (with their sums of
 * codes), from one token on, each output with the one-token vec_dot's
 * bits: a packed matrix's every product, decode's included, but for a Q6_K prefill's
 * (sq_packed_batch16_q6_K_avx512vnni, its tokens in tiles of 64). Every quantized type has
 * one, sq_packed_dot16_<name>_avx512vnni (quants/x86/avx512vnni.c). Call only when the CPU
 * has AVX-512 VNNI, VL and BW and the AVX2 set; a build with SQ_VNNI_VIA_SIMDE needs only
 * the AVX2 set. */
#define SQ_DECLARE_PACKED_DOT16(ctx, NAME, name, ...)                                                        \
    void sq_packed_dot16_##name##_avx512vnni(const void *group, int64_t row_bytes, const void *xq,          \
                                             int64_t stride, int n_tokens, int64_t nb, const void *stop,    \
                                             float *y, int64_t ldy);
SQ_QUANT_TYPES(SQ_DECLARE_PACKED_DOT16, _)
void sq_packed_batch16_q6_K_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                       int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy);
#ifdef SQ_AMX
/* The same for a prompt's batch (eight tokens on) through AMX tiles, each output again
 * the vec_dot's bits: sq_packed_batch16_<name>_amx, every quantized type (quants/x86/
 * avx512vnni.c). Call only when sq_cpu_has_amx() said yes on this process. */
#define SQ_DECLARE_PACKED_AMX(ctx, NAME, name, ...)                                                          \
    void sq_packed_batch16_##name##_amx(const void *group, int64_t row_bytes, const void *xq, int64_t stride,\
                                        int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy);
SQ_QUANT_TYPES(SQ_DECLARE_PACKED_AMX, _)
#endif
/* One Q4_K row times n_tokens (a multiple of 4) activation rows, a block decoded once for
 * four tokens. */
void sq_batch_dot_q4_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy);
/* Eight Q4_K rows row_bytes apart at once, the tokens four at a time: y[t * ldy + r] for
 * r < 8. The next eight rows' bytes are asked of memory up to stop. */
void sq_batch_dot8_q4_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
/* One Q6_K row times n_tokens activation rows, a block decoded once for them all. */
void sq_batch_dot_q6_K_avx2(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                            float *y, int64_t ldy);
/* Eight Q6_K rows at once: y[t * ldy + r], r < 8.
 * The next eight rows' bytes are asked of memory up to stop. */
void sq_batch_dot8_q6_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
/* Sixteen Q4_1 rows at once, for a prompt's or a draft check's tokens (eight on): y[t *
 * ldy + r], r < 16. The next sixteen rows' bytes are asked of memory up to stop. */
void sq_steps_dot16_q4_1_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                              int64_t nb, const void *stop, float *y, int64_t ldy);
/* Eight Q4_0, Q5_0, Q5_1, IQ4_NL or Q8_0 rows at once, from the file's layout, for any
 * number of tokens: y[t * ldy + r], r < 8. The next eight rows' bytes are asked of memory
 * up to stop. */
void sq_steps_dot8_q4_0_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot8_q5_0_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot8_q5_1_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot8_iq4_nl_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                               int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot8_q8_0_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
/* A group of sixteen Q4_K rows packed side by side (quants/rows16.c) times n_tokens
 * activation rows as sq_quantize_activations writes them (the mins meet their sums of 32
 * codes), block by block, each activation word meeting all sixteen rows: y[t * ldy + r]
 * for r < 16. The group's bytes are asked for ahead, up to stop. */
void sq_packed_batch16_q4_K_avx2(const void *group, const void *xq, int64_t stride, int n_tokens, int64_t nb,
                                 const void *stop, float *y, int64_t ldy);
/* The whole group (both halves) for n >= 1 tokens, each token's sums kept in registers: a
 * decode step's and a lookup draft's check, the activation rows again with their sums.
 * y[t * ldy + r] for r < 16; the group's bytes asked for ahead up to stop. */
void sq_packed_dotn16_q4_K_avx2(const void *group, const void *xq, int64_t stride, int n, int64_t nb,
                                const void *stop, float *y, int64_t ldy);
/* Eight Q5_K, IQ4_XS, Q3_K or Q2_K rows row_bytes apart in the file's layout times
 * n_tokens activation rows, a few or a prompt's, a block decoded once for up to 64 tokens:
 * y[t * ldy + r] for r < 8. The next eight rows' bytes are asked of memory up to stop. */
void sq_steps_dot8_q5_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot8_iq4_xs_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                               int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot8_q3_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);
void sq_steps_dot8_q2_K_avx2(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                             int64_t nb, const void *stop, float *y, int64_t ldy);

/* The conversions of activations into Q8_0, Q8_1 and Q8_K blocks (quants/x86/activations.c):
 * the bytes of scalar.c's quant_<format>_rows for every input. Call only when the CPU has
 * AVX2, FMA and F16C. */
void sq_quant_q8_0_avx2(const float *x, void *dst, int64_t nb);
void sq_quant_q8_1_avx2(const float *x, void *dst, int64_t nb);
void sq_quant_q8_K_avx2(const float *x, void *dst, int64_t nb);
/* F16 (the F16 weights' activations, and the F16 KV cache's rows): n values. */
void sq_quant_f16_avx2(const float *x, void *dst, int64_t n);
#endif

#ifdef SQ_NEON
/* NEON (quants/arm/neon.c). They take the AVX2 ones' `stop` but do not prefetch: that
 * paid off on one x86 core and has not been measured on an arm64 one. */
SQ_QUANT_TYPES(SQ_DECLARE_VEC_DOT, neon)
/* The float types' (quants/arm/float_dots.c). */
SQ_FLOAT_TYPES(SQ_DECLARE_VEC_DOT, neon)
/* One row times a batch of any size, a block decoded once for up to 32 tokens. */
#define SQ_DECLARE_BATCH_NEON(ctx, NAME, name, ...)                                                         \
    void sq_batch_dot_##name##_neon(const void *row, const void *xq, int64_t stride, int n_tokens, int64_t nb, \
                                    float *y, int64_t ldy);
SQ_QUANT_TYPES(SQ_DECLARE_BATCH_NEON, _)
#endif

#endif
