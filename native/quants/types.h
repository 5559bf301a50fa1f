/* quants/types.h: the tensor types the kernel reads, listed once, and the rule every
 * kernel for them follows.
 *
 * The lists below are the one place that names the types in C. From them come the
 * declarations of every type's kernels (quants/kernels.h), the rows of the type table
 * (quants/scalar.c), each setting's vec_dots in the kernel table (quants/dispatch.c),
 * and the names and weight types the Python side asks the kernel for (quants/types.c).
 * smolq.h's enum sq_type numbers them as GGUF does and is the ABI (cffi sees no
 * macros, so it cannot read these lists); quants/types.c holds a switch over the lists
 * that makes the compiler name any enum constant they miss, and any name the enum lacks.
 *
 * Adding a quantized weight type:
 *  1. its GGUF number in smolq.h's enum sq_type;
 *  2. its block layout in quants/blocks.h;
 *  3. a line in SQ_QUANT_TYPES below;
 *  4. its section in quants/scalar.c: decode_<name> (ROW_FUNCS makes the row decoder and
 *     the float dot product from it) and vec_dot_<name>, the definition of its products;
 *  5. sq_vec_dot_<name>_<simd> in quants/x86/vec_dots.h (AVX2) and in quants/arm/neon.c,
 *     and sq_packed_dot16_<name>_avx512vnni in quants/x86/avx512vnni.c, with the scalar
 *     vec_dot's bits.
 * Until each is there the build stops at the name that is missing.
 *
 * ---------------------------------------------------------------------------------
 * The engine's arithmetic: one definition, the same bits everywhere
 *
 * A product of a weight row and an activation row is defined once, by the scalar
 * vec_dot_<name> in quants/scalar.c, and every other way of computing it (the AVX2,
 * AVX-512 VNNI and NEON kernels, one row or sixteen side by side, one token or a
 * batch of any size, in the file's layout or packed) gives its bits. So a batch of N
 * tokens gives the outputs of N one-token calls, a prompt gives the logits of as many
 * decode steps in any chunking, and the answers are the same on every CPU. The
 * definition, for each block of the row in row order:
 *
 *  1. The integer sum. isum = the sum over the block's elements of weight code times
 *     activation code, each code times its group's integer scale where the format has
 *     integer sub-block scales (K-quants, IQ4_XS), the offsets folded into the codes
 *     where they are integers (Q4_0's q - 8, Q6_K's q - 32, Q3_K's high bit). Exact in
 *     int32 (the largest, Q6_K's, stays below 2^28), so any order of adding gives it.
 *     The types with a per-group offset in float (the mins of Q2_K, Q4_K and Q5_K) also
 *     form imin = the sum over groups of min times the group's activation sum (Q8_K's
 *     bsums), exact too.
 *  2. The block step: sum = fmaf((float)isum, dw * da, sum), dw and da the two blocks'
 *     float scales (f16 widened exactly; Q8_K's is a float), their product rounded
 *     once, the FMA rounded once; (float) rounds to nearest even past 2^24.
 *  3. Offsets have a second chain of their own, updated in the same block: for Q2_K,
 *     Q4_K and Q5_K, off = fmaf((float)imin, dminw * da, off), and the row's result is
 *     sum - off; for Q4_1 and Q5_1 (Q8_1 activations, whose s is d times the sum of the
 *     block's codes, as an f16), off = fmaf(mw, sa, off) and the result is sum + off.
 *     Every other type's result is sum. Both chains start at +0.
 *
 * Nothing else is rounded, and nothing is in another order: a SIMD kernel computes the
 * integer sums however it likes, then applies step 2 (and 3) block by block, one row
 * and one token per float lane. A kernel may keep sixteen rows, or several tokens, in
 * the lanes of one register; it may not split a row's blocks across lanes.
 *
 * Around the products: the activation quantizers round ties to even (as llama.cpp's x86
 * code does), and RMSNorm, RoPE, SwiGLU's exp and the F32 cache's attention follow
 * llama.cpp's operations (forward.c, exp_ggml.h, attention.c); each works on one token's
 * row at a time, so it too gives every token the same bits in any batch. The compact
 * caches' single-pass attention (flash_attention.c) keeps one order of its own on every
 * path. llama.cpp's own builds round its products in other orders (its AVX2 and AVX-512
 * builds differ by 1.5-2.9% median per logits row on the tiny reference files); the
 * engine stays within that spread of both (tests/engine/test_engine_reference.py).
 *
 * (The row decoders and sq_dot_row are another matter: they match gguf's Python
 * decoders, not these products; see quants/scalar.c.)
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

/* The quantized weight types: X(ctx, NAME, name, QK, ACT), with QK the elements per
 * block and ACT the activation format its vec_dot pairs it with (as llama.cpp does). */
#define SQ_QUANT_TYPES(X, ctx)            \
    X(ctx, Q8_0, q8_0, QK8_0, Q8_0)       \
    X(ctx, Q4_0, q4_0, QK4_0, Q8_0)       \
    X(ctx, Q4_1, q4_1, QK4_1, Q8_1)       \
    X(ctx, Q5_0, q5_0, QK5_0, Q8_0)       \
    X(ctx, Q5_1, q5_1, QK5_1, Q8_1)       \
    X(ctx, Q2_K, q2_K, QK_K, Q8_K)        \
    X(ctx, Q3_K, q3_K, QK_K, Q8_K)        \
    X(ctx, Q4_K, q4_K, QK_K, Q8_K)        \
    X(ctx, Q5_K, q5_K, QK_K, Q8_K)        \
    X(ctx, Q6_K, q6_K, QK_K, Q8_K)        \
    X(ctx, IQ4_NL, iq4_nl, QK4_NL, Q8_0)  \
    X(ctx, IQ4_XS, iq4_xs, QK_K, Q8_K)

/* The formats that only hold activations: X(ctx, NAME, name, QK). (Q8_0, a weight type
 * too, and the float types are activation formats as well.) */
#define SQ_ACTIVATION_TYPES(X, ctx) \
    X(ctx, Q8_1, q8_1, QK8_1)       \
    X(ctx, Q8_K, q8_K, QK_K)

#endif
