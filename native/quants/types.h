/* quants/types.h: the tensor types the kernel reads, listed once, and the rule every
 * kernel for them follows.
 *
 * The lists below are the one place that names the types in C. From them come the
 * declarations of every type's kernels (quants/kernels.h), the rows of the type table
 * (quants/scalar.c), the per-SIMD vec_dot tables (quants/dispatch.c), and the names
 * and weight types the Python side asks the kernel for (quants/types.c). smolq.h's
 * enum sq_type numbers them as GGUF does and is the ABI (cffi sees no macros, so it
 * cannot read these lists); quants/types.c holds a switch over the lists that makes
 * the compiler name any enum constant they miss, and any name the enum lacks.
 *
 * Adding a quantized weight type:
 *  1. its GGUF number in smolq.h's enum sq_type;
 *  2. its block layout in quants/blocks.h;
 *  3. a line in SQ_QUANT_TYPES below;
 *  4. its section in quants/scalar.c: decode_<name> (ROW_FUNCS makes the row decoder and
 *     the float dot product from it) and vec_dot_<name>, plus k_ints_<name> if it
 *     takes the tiled batch order;
 *  5. sq_vec_dot_<name>_<simd> in quants/x86/vec_dots.h (compiled for AVX2 and for
 *     AVX-512 VNNI) and in quants/arm/neon.c, with the scalar vec_dot's bits.
 * Until each is there the build stops at the name that is missing.
 *
 * ---------------------------------------------------------------------------------
 * Why every path gives llama.cpp's bits
 *
 * The engine's logits are meant to equal, bit for bit, those of llama.cpp's CPU backend
 * in its AVX2 build on the same file, on every path this kernel has (scalar, AVX2,
 * AVX-512 VNNI, NEON). Bits matter that much because every mat-vec quantizes its input
 * to 8 bits first: a one-ulp difference anywhere upstream can flip a code and move
 * every later logit by about 1%. So:
 *
 *  - Integers are exact: a block's dot product is an integer sum (codes times 8-bit
 *    activation codes, group scales folded in), the same in any order; every kernel
 *    keeps it below int32's and int16's limits (the bounds are stated where the
 *    kernels saturate or widen). Only the float steps around it must match: the
 *    product of the two blocks' scales, how block results are accumulated, which
 *    elements share a float lane, and the final horizontal sum.
 *
 *  - The float steps are llama.cpp's: each kernel names the llama.cpp kernel whose
 *    steps it repeats. Most keep the AVX2 kernels' 8 float lanes: integer lane l holds
 *    the products of elements 4l..4l+3 of every 32 (what maddubs then madd give), and
 *    each block adds lane times scale into float lane l with one FMA; the row ends with
 *    sq_hsum8's order (simd.h). Q4_0, IQ4_NL and Q4_K instead follow the repacked 8-row
 *    kernels llama.cpp runs on AVX2 for matrices with a multiple of 8 rows: one whole
 *    block integer, one fmaf chain in block order. A batch of tokens takes llama.cpp's
 *    batch orders (quants/batch.c): its tiled one for Q2_K, Q3_K, Q5_K, Q6_K and
 *    IQ4_XS from SQ_TILED_MIN_TOKENS tokens on, its repacked gemm's for Q4_K, four
 *    tokens at a time.
 *
 *  - FMA versus multiply-then-add is part of the order: an FMA rounds once, a multiply
 *    and an add twice. Where llama.cpp fuses (its intrinsics, or its AVX2 build's
 *    compiler contracting a multiply and an add), the kernels here call an FMA (fmaf,
 *    _mm256_fmadd_ps, vfmaq); where it does not, the product stays in a statement of
 *    its own, so that no compiler may contract it into the add that follows.
 *
 *  - The scalar code in quants/scalar.c is the reference: it repeats the AVX2 kernels'
 *    float steps lane by lane (fmaf for each FMA), and the x86 and NEON kernels each
 *    have a scalar twin there with the same bits. The tests compare every path.
 *
 *  - The activation quantizers reproduce llama.cpp's x86 ones bit for bit (rounding
 *    ties to even, as its AVX code does), and the same holds outside quants/: RMSNorm,
 *    RoPE, SwiGLU's exp and the F32 cache's attention repeat llama.cpp's operations in
 *    its order (forward.c, exp_ggml.h, attention.c). The compact caches' single-pass
 *    attention (flash_attention.c) keeps one order of its own on every path.
 *
 * (The row decoders and sq_dot_row are another matter: they match gguf's Python
 * decoders, not llama.cpp's vec_dots; see quants/scalar.c.)
 * ---------------------------------------------------------------------------------
 */
#ifndef SMOLQ_QUANTS_TYPES_H
#define SMOLQ_QUANTS_TYPES_H

/* Each list calls X(ctx, ...) once per type, with ctx passed through unchanged: a
 * generator that needs a parameter (a SIMD suffix) takes it from there, others pass _. */

/* The float weight types, one element per "block": X(ctx, NAME, name, unit_t), NAME the
 * GGUF name (and SQ_<NAME> its enum constant), name the C functions' infix, unit_t an
 * element. Their activations are in their own format. */
#define SQ_FLOAT_TYPES(X, ctx) \
    X(ctx, F32, f32, float)    \
    X(ctx, F16, f16, uint16_t) \
    X(ctx, BF16, bf16, uint16_t)

/* The quantized weight types: X(ctx, NAME, name, QK, ACT, BATCH), with QK the elements
 * per block, ACT the activation format its vec_dot pairs it with (as llama.cpp does),
 * and BATCH the order of a batch of tokens: VEC (each token as sq_vec_dot), TILED
 * (llama.cpp's tiled order, from SQ_TILED_MIN_TOKENS tokens) or GEMM4 (Q4_K's repacked
 * gemm, four tokens at a time). */
#define SQ_QUANT_TYPES(X, ctx)                  \
    X(ctx, Q8_0, q8_0, QK8_0, Q8_0, VEC)        \
    X(ctx, Q4_0, q4_0, QK4_0, Q8_0, VEC)        \
    X(ctx, Q4_1, q4_1, QK4_1, Q8_1, VEC)        \
    X(ctx, Q5_0, q5_0, QK5_0, Q8_0, VEC)        \
    X(ctx, Q5_1, q5_1, QK5_1, Q8_1, VEC)        \
    X(ctx, Q2_K, q2_K, QK_K, Q8_K, TILED)       \
    X(ctx, Q3_K, q3_K, QK_K, Q8_K, TILED)       \
    X(ctx, Q4_K, q4_K, QK_K, Q8_K, GEMM4)       \
    X(ctx, Q5_K, q5_K, QK_K, Q8_K, TILED)       \
    X(ctx, Q6_K, q6_K, QK_K, Q8_K, TILED)       \
    X(ctx, IQ4_NL, iq4_nl, QK4_NL, Q8_0, VEC)   \
    X(ctx, IQ4_XS, iq4_xs, QK_K, Q8_K, TILED)

/* The formats that only hold activations: X(ctx, NAME, name, QK). (Q8_0, a weight type
 * too, and the float types are activation formats as well.) */
#define SQ_ACTIVATION_TYPES(X, ctx) \
    X(ctx, Q8_1, q8_1, QK8_1)       \
    X(ctx, Q8_K, q8_K, QK_K)

#endif
