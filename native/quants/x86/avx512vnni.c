/* quants/x86/avx512vnni.c: for CPUs with AVX-512 VNNI, VL and BW, the products of every
 * quantized type's rows sixteen at a time in 512-bit registers, one row per 32-bit lane, so that an
 * activation word broadcast to every lane meets the same four codes of all sixteen rows,
 * from a group packed by quants/rows16.c, where each register's bytes are one load: decode,
 * a lookup draft's check and a prompt (sq_packed_dot16_*, and sq_packed_batch16_q6_K for a
 * prompt's Q6_K); the 32-element types through rows16_block32, Q4_K, Q5_K, IQ4_XS, Q3_K and
 * Q2_K through rows16_super, Q6_K through rows16_q6_K. Every quantized type packs at this
 * setting, so a matrix in the file's layout (SMOLQ_PACK=0, or no memory to spare for the
 * packed copy) takes x86/avx2.c's eight-row and one-row kernels.
 *
 * Each gives the scalar definition's bits (quants/types.h) for every row and token: a
 * lane forms a block's exact integer sum however the instructions group the products,
 * then takes the block step, one fused multiply-add by the row's d times the token's,
 * block by block; the offset chains of Q4_1 and Q4_K beside it. The step kernels and the
 * batch kernels of a type differ only in their tiles of tokens and how they ask for
 * memory.
 *
 * At the "amx" setting a prompt's products (eight tokens on) take AMX's tiles instead
 * (sq_packed_batch16_<name>_amx, at the end): the same block decoders give the tile its
 * codes, a tile product forms each group's integer for sixteen tokens at once
 * (x86/amx_tiles.h), and the float steps are the ones here.
 *
 * Built with SQ_VNNI_VIA_SIMDE (cffi_build/build_kernel.py, SMOLQ_VNNI_VIA_SIMDE), the
 * VNNI instructions, and the 512-bit ones, come from SIMDe, the tiles from C stand-ins, and
 * the file runs on any AVX2 CPU: that is how the tests check it on machines without
 * AVX-512 or AMX.
 */
#include "simd.h"

#ifdef SQ_X86

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quants/kernels.h"
#include "quants/x86/token_rows.h"
#include "simd512.h"

#ifdef SQ_VNNI_VIA_SIMDE
#define TARGET SQ_AVX2
#else
#define TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

/* How the packed kernels ask memory for their rows: into L2 (prefetcht1) PREFETCH_AHEAD
 * bytes ahead, then for the same lines into L1 PREFETCH_NEAR bytes ahead. On the Xeon
 * with AVX-512 requests for L1 from afar used up the core's line fill buffers and the
 * prefetches waited on them: the 3B shape's decode went 8-13% faster with the L2
 * requests, and 3-6% more with the near ones (SmolLM2's 4%; on AMD's CPUs decode asks
 * otherwise: decode_fetch). */
#define PREFETCH_AHEAD 3072
#define PREFETCH_INTO _MM_HINT_T1
#define PREFETCH_NEAR 512

/* prefetch_ahead's requests for a piece of a packed group's run, from `ahead` bytes on
 * rather than PREFETCH_AHEAD, the near ones too where `near`; where all of them lie before
 * stop (everywhere but near a matrix's end) with one comparison for the piece rather than
 * one per request: decode's sixteen-row kernels spent as many instructions on those as on
 * their products. */
static inline __attribute__((always_inline)) TARGET void prefetch_run(const uint8_t *piece, int bytes, int ahead,
                                                                     const void *stop, int near_too) {
    const uintptr_t far = (uintptr_t)piece + (uintptr_t)ahead, near = (uintptr_t)piece + PREFETCH_NEAR;
    const int checked = far + (uintptr_t)bytes > (uintptr_t)stop;
    for (int k = 0; k < bytes; k += 64) {
        if (!checked || far + (uintptr_t)k < (uintptr_t)stop)
            _mm_prefetch((const char *)(far + (uintptr_t)k), PREFETCH_INTO);
        if (PREFETCH_NEAR && near_too && (!checked || near + (uintptr_t)k < (uintptr_t)stop))
            _mm_prefetch((const char *)(near + (uintptr_t)k), _MM_HINT_T0);
    }
}

/* How far ahead the packed Q4_K and Q6_K kernels ask for their runs (decode's Q4_K on AMD
 * excepted: decode_fetch). Streamed from memory (100 MB of rows of 2,048 columns, one
 * thread), 12 KiB ahead read them at 1 token 1.3x (Q4_K) and 1.5x (Q6_K) as fast as
 * PREFETCH_AHEAD's 3 KiB, and at 2 tokens 1.4x and 2.1x; 24 KiB no faster. Decode's Q4_1
 * and Q8_0 gained nothing from it (Q8_0 lost 15%). */
#define PACKED_AHEAD_K 12288

#ifdef SQ_VNNI_VIA_SIMDE
/* A 32-bit word of activation codes in every lane (SIMDe's instructions take no memory
 * operand to broadcast). */
static inline TARGET v16i word16(const int8_t *p) {
    int32_t w;
    memcpy(&w, p, 4);
    return V16(set1_epi32)(w);
}
#endif

/* acc + vpdpbusd(code, the 32-bit word at p in every lane). gcc keeps the broadcast
 * a load of its own before each vpdpbusd; taken as the instruction's {1to16} operand it
 * is one fused micro-op where it was two. */
static inline __attribute__((always_inline)) TARGET v16i dpbusd_word(v16i acc, v16i code, const int8_t *p) {
#ifdef SQ_VNNI_VIA_SIMDE
    return V16(dpbusd_epi32)(acc, code, word16(p));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(code), "m"(*(const int32_t *)p));
    return acc;
#endif
}

/* acc + vpdpwssd(x, the two neighbouring int16 at p in every lane): the same fused
 * {1to16} operand as dpbusd_word. */
static inline __attribute__((always_inline)) TARGET v16i dpwssd_pair(v16i acc, v16i x, const int16_t *p) {
#ifdef SQ_VNNI_VIA_SIMDE
    return V16(dpwssd_epi32)(acc, x, word16((const int8_t *)p));
#else
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*(const int32_t *)p));
    return acc;
#endif
}

/* Byte b of each 32-bit word, as an int32. */
static inline TARGET v16i byte_of_words(v16i x, int b) {
    return V16(and_si512)(V16(srli_epi32)(x, 8 * b), V16(set1_epi32)(0xff));
}

/* Byte b of each 32-bit word, in both of its int16 (unsigned). */
static inline TARGET v16i byte_twice16(v16i x, int b) {
    return V16(shuffle_epi8)(x, V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(b, -1, b, -1, 4 + b, -1, 4 + b, -1, 8 + b, -1,
                                                                          8 + b, -1, 12 + b, -1, 12 + b, -1))));
}

/* Bytes b and b + 1 of each 32-bit word, as the two int16 of the word (unsigned). */
static inline TARGET v16i byte_pair16(v16i x, int b) {
    return V16(shuffle_epi8)(x, V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(b, -1, b + 1, -1, 4 + b, -1, 5 + b, -1, 8 + b,
                                                                          -1, 9 + b, -1, 12 + b, -1, 13 + b, -1))));
}

/* Zero, but not known to the compiler as such: a loop that starts a span's chains from it
 * stays a few vector stores, where a known zero made it two memsets (rep stos, which takes
 * tens of cycles to start on AMD's CPUs) per group of sixteen rows. */
static inline TARGET v16f opaque_zero16(void) {
    v16f z = V16(setzero_ps)();
#ifndef SQ_VNNI_VIA_SIMDE
    __asm__("" : "+v"(z));
#endif
    return z;
}

/* The f16 at h in every lane, as a float. */
static inline TARGET v16f f16_lanes(uint16_t h) {
    return V16(set1_ps)(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
}

/* The definition's block step (quants/types.h) in each row's lane, for one token: sum plus
 * the block's exact integer times the row's scale times the token's, in one fused
 * multiply-add; every kernel here, the AMX ones too, takes its chains' steps through it. */
static inline __attribute__((always_inline)) TARGET v16f block_step16(v16f sum, v16i isum, v16f d_rows,
                                                                     v16f d_token) {
    return V16(fmadd_ps)(V16(cvtepi32_ps)(isum), V16(mul_ps)(d_rows, d_token), sum);
}

/* Two groups' sums of products (g0, g1), each times its scale in the row's lane (s0, s1),
 * added: a Q4_K-like span's or a Q6_K chunk's share of a block's integer. */
static inline __attribute__((always_inline)) TARGET v16i scaled_pair16(v16i g0, v16i s0, v16i g1, v16i s1) {
    return V16(add_epi32)(V16(mullo_epi32)(g0, s0), V16(mullo_epi32)(g1, s1));
}

/* ---------------------------------------------------------------------------
 * Q4_K (and Q5_K, IQ4_XS after it): sixteen rows packed side by side
 * ------------------------------------------------------------------------- */

/* The headers (d, dmin, and the twelve bytes of 6-bit scales and mins) of block i of a
 * packed group of sixteen Q4_K rows, the scales and mins unpacked as k_scales_mins does one
 * row's: scale[g] lane r holds row r's scale of group g; mins[q] row r's mins of groups 2q
 * and 2q + 1 as two int16, so that vpdpwssd by it multiplies those groups' sums of 32 codes
 * (sums32_16); d and dmin each row's. */
static inline __attribute__((always_inline)) TARGET void q4_K_headers16(const uint8_t *group, int64_t i,
                                                                       v16i scale[8], v16i mins[4], v16f *d,
                                                                       v16f *dmin) {
    v16i w[4];  /* w[j] lane r: header word j of row r (w[1..3]: the run's first 64 bytes hold d and dmin) */
    const uint8_t *run = group + i * 16 * (int64_t)sizeof(block_q4_K);
    for (int j = 1; j < 4; j++)
        w[j] = V16(loadu_si512)(run + 64 * j);
    /* Byte g of each lane: scales and mins of groups g (low) and 4 + g (high). */
    const v16i m6 = V16(set1_epi32)(0x3f3f3f3f), m4 = V16(set1_epi32)(0x0f0f0f0f), top2 = V16(set1_epi32)(0x30303030);
    const v16i sc_low = V16(and_si512)(w[1], m6), mn_low = V16(and_si512)(w[2], m6);
    const v16i sc_high = V16(or_si512)(V16(and_si512)(w[3], m4), V16(and_si512)(V16(srli_epi32)(w[1], 2), top2));
    const v16i mn_high = V16(or_si512)(V16(and_si512)(V16(srli_epi32)(w[3], 4), m4),
                                       V16(and_si512)(V16(srli_epi32)(w[2], 2), top2));
    for (int g = 0; g < 4; g++) {
        scale[g] = byte_of_words(sc_low, g);
        scale[g + 4] = byte_of_words(sc_high, g);
    }
    for (int q = 0; q < 4; q++)
        mins[q] = byte_pair16(q < 2 ? mn_low : mn_high, 2 * (q % 2));
    *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    *dmin = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)(run + 32))));
}

/* Where a packed Q4_K run's codes lie, in 64-byte units from the run's start: after the
 * sixteen d and dmin (the first) and the scales' three. */
enum { Q4_K_QS_AT = 4 };

/* Span c (elements 64c .. 64c + 63) of block i of a packed group of sixteen Q4_K rows:
 * code[h][j] lane r holds elements 64c + 32h + 4j .. +3 of row r. */
static inline __attribute__((always_inline)) TARGET void q4_K_codes16(const uint8_t *group, int64_t i, int c,
                                                                     v16i code[2][8]) {
    const v16i m4 = V16(set1_epi8)(0x0f);
    for (int j = 0; j < 8; j++) {
        const v16i q = V16(loadu_si512)(group + i * 16 * (int64_t)sizeof(block_q4_K) + 64 * (Q4_K_QS_AT + 8 * c + j));
        code[0][j] = V16(and_si512)(q, m4);
        code[1][j] = V16(and_si512)(V16(srli_epi16)(q, 4), m4);
    }
}

/* Span c of one token's activation block (aq: its 64 codes) against sixteen rows' codes
 * (q4_K_codes16): isum plus, for each row, the scale of group 2c times the group's 32
 * products, and the same for group 2c + 1. A group's products are summed in two chains of
 * alternate words, then their sum (|.| <= 32 * 15 * 128) times the scale by vpmulld: one
 * multiply per group where vpdpwssd by the scale took one per chain (each chain's sum below
 * 2^15, the scale in the low half of a word), 9 tokens 6% faster, 64 tokens 10%. */
static inline __attribute__((always_inline)) TARGET v16i q4_K_span16(const int8_t *aq, const v16i code[2][8],
                                                                     v16i sc_low, v16i sc_high, v16i isum) {
    for (int h = 0; h < 2; h++) {
        v16i even = V16(setzero_si512)(), odd = V16(setzero_si512)();
        for (int j = 0; j < 8; j += 2) {
            even = dpbusd_word(even, code[h][j], aq + 32 * h + 4 * j);
            odd = dpbusd_word(odd, code[h][j + 1], aq + 32 * h + 4 * j + 4);
        }
        const v16i sc = h ? sc_high : sc_low;
        isum = V16(add_epi32)(isum, V16(mullo_epi32)(V16(add_epi32)(even, odd), sc));
    }
    return isum;
}

/* ---------------------------------------------------------------------------
 * Q4_1 and Q8_0: sixteen rows packed side by side
 * ------------------------------------------------------------------------- */

/* Block i of a packed group of sixteen Q4_1 rows (quants/rows16.c: each register's bytes
 * one load): codes[l] lane r holds the four codes of row r that meet word l of the
 * activation block (codes[j] the low nibbles of qs word j, elements 4j..4j+3; codes[j + 4]
 * its high nibbles, elements 16 + 4j..); d and m each row's. */
static inline __attribute__((always_inline)) TARGET void q4_1_block16(const uint8_t *group, int64_t i, v16i codes[8],
                                                                    v16f *d_rows, v16f *m_rows) {
    const uint8_t *run = group + i * 16 * (int64_t)sizeof(block_q4_1);
    *d_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    *m_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)(run + 32))));
    const v16i m4 = V16(set1_epi8)(0x0f);
    for (int j = 0; j < 4; j++) {
        const v16i w = V16(loadu_si512)(run + 64 + 64 * j);  /* lane r: qs word j of row r */
        codes[j] = V16(and_si512)(w, m4);
        codes[j + 4] = V16(and_si512)(V16(srli_epi16)(w, 4), m4);
    }
}

/* Block i of a packed group of sixteen Q8_0 rows: codes[l] lane r holds row r's codes
 * 4l..4l+3, each plus 128 so that it multiplies as an unsigned byte; d each row's. */
static inline __attribute__((always_inline)) TARGET void q8_0_block16(const uint8_t *group, int64_t i, v16i codes[8],
                                                                    v16f *d_rows) {
    const uint8_t *run = group + i * 16 * (int64_t)sizeof(block_q8_0);
    *d_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    for (int l = 0; l < 8; l++)
        codes[l] = V16(xor_si512)(V16(loadu_si512)(run + 32 + 64 * l), V16(set1_epi8)((char)0x80));
}

/* Block i's offset in every lane, from the activation row (nb blocks) of a token: what makes
 * the products of codes plus 128 exact (quants/blocks.h, sq_q8_0_offsets_at). */
static inline TARGET v16i q8_0_offset16(const void *row, int64_t nb, int64_t i) {
    int32_t offset;
    memcpy(&offset, (const uint8_t *)row + sq_q8_0_offsets_at(nb) + 4 * i, 4);
    return V16(set1_epi32)(offset);
}

/* ---------------------------------------------------------------------------
 * Every 32-element type: sixteen rows packed side by side
 * ------------------------------------------------------------------------- */

/* The 32-element types go through one token step (tokens32_16) in Q4_1's form or Q8_0's:
 * a block decoder puts each type's codes in the form those take. Q5_1's
 * codes are unsigned, with an offset chain, as Q4_1's. The others' codes are signed (q - 8,
 * q - 16, the IQ4 grid); each goes as an unsigned byte c + 128, as Q8_0's do, and the
 * token steps take 128 times the activation block's sum off the block's total, exactly
 * (q8_0_offset16): the codes' offset costs the 16 rows no more than Q8_0's does.
 * vpdpbusd sums into int32 and saturates nothing; a block's products, at most 32 * 241 *
 * 128 (the grid's 113 + 128) in size, stay far below 2^31. */

/* The 32 nibbles of four words of sixteen rows (w[j] lane r: word j of row r), in Q4_1's
 * order (q4_1_block16): codes[l] lane r holds row r's elements 4l..4l+3, the low nibbles of
 * its word l for l < 4, the high nibbles of word l - 4 after; plus `plus` in every byte. */
static inline __attribute__((always_inline)) TARGET void nibbles16(const v16i w[4], int plus, v16i codes[8]) {
    const v16i m4 = V16(set1_epi8)(0x0f), add = V16(set1_epi8)((char)plus);
    for (int j = 0; j < 8; j++) {
        const v16i nibble = j < 4 ? w[j] : V16(srli_epi16)(w[j - 4], 4);
        /* plus in the high nibble (0, Q5_0's 112): (nibble & 0x0f) | plus, one ternary-logic
         * instruction ((a & b) | c is 0xea) */
        codes[j] = plus & 0x0f ? V16(add_epi8)(V16(and_si512)(nibble, m4), add)
                               : V16(ternarylogic_epi32)(nibble, m4, add, 0xea);
    }
}

/* Q5's fifth bits: 16 added to byte b of codes[l] where bit 4l + b of the lane's qh (one
 * row's 32 bits, element e's at bit e) is set. Byte l / 2 of qh copied to the lane's four
 * bytes, each tested against its own bit. */
static inline __attribute__((always_inline)) TARGET void fifth_bits16(v16i qh, v16i codes[8]) {
    const v16i sixteen = V16(set1_epi8)(16);
    for (int l = 0; l < 8; l++) {
        const int b = l / 2;
        const v16i spread = V16(shuffle_epi8)(
            qh, V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(b, b, b, b, 4 + b, 4 + b, 4 + b, 4 + b, 8 + b, 8 + b, 8 + b,
                                                          8 + b, 12 + b, 12 + b, 12 + b, 12 + b))));
        const v16i bits = V16(set1_epi32)((int)(0x08040201u << 4 * (l % 2)));
        codes[l] = V16(mask_add_epi8)(codes[l], V16(test_epi8_mask)(spread, bits), codes[l], sixteen);
    }
}

/* Block i of a packed group of sixteen rows of a 32-element type (a constant), as its
 * token steps take it: codes[l] lane r holds row r's codes of elements 4l..4l+3 (unsigned
 * for Q4_1 and Q5_1, else plus 128); d, and the m of Q4_1 and Q5_1, each row's. The run
 * (quants/rows16.c) holds the sixteen d, and Q5_1's m, then word j of the sixteen rows at
 * each 64 bytes, Q5's qh before the codes. */
static inline __attribute__((always_inline)) TARGET void block32_16(const int type, const uint8_t *group, int64_t i,
                                                                   v16i codes[8], v16f *d_rows, v16f *m_rows) {
    if (type == SQ_Q4_1) {
        q4_1_block16(group, i, codes, d_rows, m_rows);
        return;
    }
    if (type == SQ_Q8_0) {
        q8_0_block16(group, i, codes, d_rows);
        return;
    }
    const int fifth = type == SQ_Q5_0 || type == SQ_Q5_1;
    const uint8_t *run = group + i * 16 * (int64_t)sq_block_size(type);
    *d_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    if (type == SQ_Q5_1)
        *m_rows = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)(run + 32))));
    const uint8_t *words = run + 32 * (type == SQ_Q5_1 ? 2 : 1);
    const v16i qh = fifth ? V16(loadu_si512)(words) : V16(setzero_si512)();
    v16i w[4];
    for (int j = 0; j < 4; j++)
        w[j] = V16(loadu_si512)(words + 64 * (fifth + j));
    nibbles16(w, type == SQ_Q4_0 ? 128 - 8 : type == SQ_Q5_0 ? 128 - 16 : 0, codes);
    if (type == SQ_IQ4_NL) {
        /* the grid's values plus 128, looked up by index in every 128-bit quarter */
        const v16i grid = V16(broadcast_i32x4)(
            AS128I(_mm_xor_si128(_mm_setr_epi8(SQ_IQ4_GRID), _mm_set1_epi8((char)0x80))));
        for (int l = 0; l < 8; l++)
            codes[l] = V16(shuffle_epi8)(grid, codes[l]);
    }
    if (fifth)
        fifth_bits16(qh, codes);
}

/* One token's block step for sixteen rows of a 32-element type, from isum, the exact
 * integer of the rows' codes and block i of the token's activation row (row, nb blocks):
 * the step by the row's d times the token's, and for Q4_1 and Q5_1 (Q8_1 activations) the
 * offset chain's fmaf(m, s). With `widened`, the token's d and s are the floats after the
 * row's blocks (quants/blocks.h), broadcast straight from memory, where widening an f16
 * takes four instructions: decode and a few tokens' loops (SmolLM2's Q4_1 rows in cache
 * x0.97-1.04 as fast at one token, x1.05-1.11 at four). A prompt's span widens the f16 in
 * the block it has just read: the floats' lines, one more per token, made SmolLM2's
 * prefill 1-2% slower. */
static inline __attribute__((always_inline)) TARGET void step32_16(const int with_m, const int widened,
                                                                  const void *row, int64_t nb, int64_t i, v16i isum,
                                                                  v16f d_rows, v16f m_rows, v16f *sum, v16f *off) {
    v16f d, s = V16(setzero_ps)();  /* the token's */
    if (widened) {
        const float *ds = (const float *)((const uint8_t *)row + (with_m ? sq_q8_1_scales_at(nb) + 8 * i
                                                                         : sq_q8_0_scales_at(nb) + 4 * i));
        d = V16(set1_ps)(ds[0]);
        if (with_m)
            s = V16(set1_ps)(ds[1]);
    } else if (with_m) {
        const block_q8_1 *b = (const block_q8_1 *)row + i;
        d = f16_lanes(b->d);
        s = f16_lanes(b->s);
    } else {
        d = f16_lanes(((const block_q8_0 *)row + i)->d);
    }
    *sum = block_step16(*sum, isum, d_rows, d);
    if (with_m)
        *off = V16(fmadd_ps)(m_rows, s, *off);
}

/* T tokens (1 to 4) from token t through block i of sixteen rows of a 32-element type,
 * sum[u] and off[u] token t + u's chains (off Q4_1's and Q5_1's alone). Each register of
 * codes is loaded once for the T: token by token, a load for every vpdpbusd, 9 tokens took
 * 1.3x as long, 64 tokens 1.4x. A token's products go into two chains of alternate words;
 * with Q8_0 activations (codes plus 128) the first starts from the block's offset, which
 * makes the sum exact (quants/blocks.h, sq_q8_0_offsets_at; summing the activation codes
 * here instead, once per block, token and sixteen rows, made 8 to 512 tokens of Q8_0-like
 * rows take 1.2-1.27x as long). */
static inline __attribute__((always_inline)) TARGET void tokens32_16(const int type, const int T, const int widened,
                                                                    const void *xq, int64_t stride, int64_t nb,
                                                                    int t, int64_t i,
                                                                    const v16i codes[8], v16f d_rows, v16f m_rows,
                                                                    v16f sum[], v16f off[]) {
    const int with_m = type == SQ_Q4_1 || type == SQ_Q5_1;  /* Q8_1 activations, an offset chain */
    const int64_t a_bytes = with_m ? (int64_t)sizeof(block_q8_1) : (int64_t)sizeof(block_q8_0);
    const int qs_at = with_m ? (int)offsetof(block_q8_1, qs) : (int)offsetof(block_q8_0, qs);
    const uint8_t *a[4];
    v16i part[4][2];
    for (int u = 0; u < T; u++) {
        a[u] = (const uint8_t *)token_row(xq, stride, t + u) + i * a_bytes;
        part[u][0] = with_m ? V16(setzero_si512)() : q8_0_offset16(token_row(xq, stride, t + u), nb, i);
        part[u][1] = V16(setzero_si512)();
    }
    for (int l = 0; l < 8; l++)
        for (int u = 0; u < T; u++)
            part[u][l & 1] = dpbusd_word(part[u][l & 1], codes[l], (const int8_t *)a[u] + qs_at + 4 * l);
    for (int u = 0; u < T; u++)
        step32_16(with_m, widened, token_row(xq, stride, t + u), nb, i, V16(add_epi32)(part[u][0], part[u][1]),
                  d_rows, m_rows, &sum[u], &off[u]);
}

/* The tokens the 32-element kernels take through a block at a time: a prompt's 128 (each
 * block decoded once a span of them: every 16 tokens, as it was, SmolLM2's 512-token
 * prefill took 1.075x as long, timed in one process pass by pass). Two, three and four
 * tokens each have a loop compiled for their count, whose chains stay in registers rather
 * than in the span's arrays: SmolLM2's Q4_1 rows in cache ran x1.32-1.50 as fast at 2
 * tokens, x1.14-1.27 at 4, its 30 MB Q8_0 output matrix x1.25-1.29 (one thread, call by
 * call). A few more (a draft's check, up to FEW_TOKENS) go through those loops in passes
 * (rows16_block32_passes) or, for some types, one span of them all. */
enum { PROMPT_SPAN = 128, FEW_TOKENS = 16 };

/* How decode (one token) asks memory for the rows to come, by the CPU's maker. On the Xeon,
 * the 32-element kernels PREFETCH_AHEAD ahead and their near requests for L1 too (SmolLM2's
 * decode 4% faster with those), the K-quant spans PACKED_AHEAD_K ahead. On AMD's CPUs the
 * core's own stream prefetcher follows one token's pass through the rows, and requests far
 * ahead of it only got in its way: on Zen 4, one process, steps alternating between the
 * settings, DECODE_AHEAD_AMD rather than those made the 3B shape's Q4_K_M steps take x0.96
 * of the time, Q5_K_M's x0.92-0.95, Q4_1's x0.80 (SmolLM2's x0.90-1.0; Q6_K's runs kept
 * theirs: 1 KiB made the 3B shape's steps x1.09); and the 32-element kernels' near
 * requests made SmolLM2's 5-8% slower (600-800 steps each, two builds), where the K-quant
 * spans still gained 2.5% from theirs. A few tokens' and a prompt's passes keep their
 * distances (8 tokens of Q4_K took 1.2x as long 1.5 KiB ahead). */
enum { DECODE_AHEAD_AMD = 1024 };

typedef struct {
    int ahead_32, near_32;  /* the 32-element kernels' distance, and whether they ask for L1 too */
    int ahead_K;            /* the K-quant spans' (rows16_super) */
} decode_fetch;

static decode_fetch decode_fetch_here(void) {
    static atomic_int amd = -1;
    int v = atomic_load_explicit(&amd, memory_order_relaxed);
    if (v < 0) {
        v = sq_cpu_is_amd();
        atomic_store_explicit(&amd, v, memory_order_relaxed);
    }
    if (v)
        return (decode_fetch){DECODE_AHEAD_AMD, 0, DECODE_AHEAD_AMD};
    return (decode_fetch){PREFETCH_AHEAD, 1, PACKED_AHEAD_K};
}

/* A packed group of sixteen rows of a 32-element type times n_tokens activation rows, each
 * output the scalar vec_dot's bits for its row and token (quants/types.h): per block the
 * exact sum of codes times the token's codes in each row's lane, its block step by the
 * row's d times the token's, and for Q4_1 and Q5_1 the offset chain's fmaf(m, s); y = sum
 * (+ off). Block by block, the codes go from the loads into registers (block32_16), and
 * every token of a span of SPAN (at most PROMPT_SPAN), four at a time, through them, the
 * chains waiting in memory from block to block. (Decoding 32 blocks at a time into memory
 * first, as these kernels did, made a SmolLM2 draft check of 8 tokens 1.08x as long, of 2
 * tokens 1.14x, and its prefill 1.03x: timed in one process, alternating.) y[t * ldy + r]
 * for r < 16. The bytes to come are asked of memory up to stop as the first span reads
 * the blocks, as decode_fetch says for one token, PREFETCH_AHEAD and 32 blocks further
 * for more (SmolLM2's output matrix, 30 MB, times 2 tokens ran 1.9x as fast with them),
 * near ones too. */
static inline __attribute__((always_inline)) TARGET void rows16_block32(const int type, const uint8_t *group,
                                                                       const void *xq, int64_t stride, int n_tokens,
                                                                       int64_t nb, const void *stop, float *y,
                                                                       int64_t ldy, const int SPAN) {
    v16f sum[PROMPT_SPAN], off[PROMPT_SPAN];  /* the span's tokens' chains */
    const int64_t run = 16 * (int64_t)sq_block_size(type);  /* a block's bytes in the group */
    const decode_fetch fetch = SPAN == 1 ? decode_fetch_here()  /* SPAN 1: decode's one token */
                                         : (decode_fetch){PREFETCH_AHEAD + 32 * (int)run, 1, PACKED_AHEAD_K};
    for (int t0 = 0; t0 < n_tokens; t0 += SPAN) {
        const int nt = n_tokens - t0 < SPAN ? n_tokens - t0 : SPAN;
        for (int t = 0; t < nt; t++)
            sum[t] = off[t] = opaque_zero16();
        for (int64_t i = 0; i < nb; i++) {
            if (t0 == 0)
                prefetch_run(group + i * run, (int)run, fetch.ahead_32, stop, fetch.near_32);
            v16i codes[8];
            v16f d_rows, m_rows;
            block32_16(type, group, i, codes, &d_rows, &m_rows);
            for (int t = 0; t < nt;) {
                const int T = nt - t >= 4 ? 4 : nt - t;
                if (T == 4)
                    tokens32_16(type, 4, SPAN <= 4, xq, stride, nb, t0 + t, i, codes, d_rows, m_rows, sum + t, off + t);
                else if (T == 3)
                    tokens32_16(type, 3, SPAN <= 4, xq, stride, nb, t0 + t, i, codes, d_rows, m_rows, sum + t, off + t);
                else if (T == 2)
                    tokens32_16(type, 2, SPAN <= 4, xq, stride, nb, t0 + t, i, codes, d_rows, m_rows, sum + t, off + t);
                else
                    tokens32_16(type, 1, SPAN <= 4, xq, stride, nb, t0 + t, i, codes, d_rows, m_rows, sum + t, off + t);
                t += T;
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy,
                           type == SQ_Q4_1 || type == SQ_Q5_1 ? V16(add_ps)(sum[t], off[t]) : sum[t]);
    }
}

/* Five to FEW_TOKENS tokens through a group in passes of two to four, as even as they go
 * (9 tokens: 3 + 3 + 3), each pass's chains in registers: the first pass asks memory for
 * the rows, the others find them in L1 (a group of SmolLM2's rows is 10-15 KB). For the
 * types whose blocks are four-bit codes alone (four_bit_codes), which decode in a few
 * instructions: in one span of them all, each token's chains waiting in memory from block
 * to block, SmolLM2's Q4_1 rows in cache ran x0.78-0.92 as fast at 5-16 tokens, Q4_0's and
 * IQ4_NL's x0.90-0.99 (one thread, call by call). Q5_0's and Q5_1's blocks (their fifth
 * bits) and Q8_0's (eight registers of codes) take more to decode, and decoded once a pass
 * ran up to 1.35x as long at 5 and 9 tokens: they keep the span. */
static inline int four_bit_codes(const int type) { return type == SQ_Q4_0 || type == SQ_Q4_1 || type == SQ_IQ4_NL; }

/* One to four tokens, each count through a loop compiled for it (SPAN = the count). */
static inline __attribute__((always_inline)) TARGET void rows16_block32_upto4(const int type, const uint8_t *group,
                                                                             const void *xq, int64_t stride,
                                                                             int n_tokens, int64_t nb,
                                                                             const void *stop, float *y,
                                                                             int64_t ldy) {
    if (n_tokens == 4)
        rows16_block32(type, group, xq, stride, 4, nb, stop, y, ldy, 4);
    else if (n_tokens == 3)
        rows16_block32(type, group, xq, stride, 3, nb, stop, y, ldy, 3);
    else if (n_tokens == 2)
        rows16_block32(type, group, xq, stride, 2, nb, stop, y, ldy, 2);
    else
        rows16_block32(type, group, xq, stride, 1, nb, stop, y, ldy, 1);
}

static inline __attribute__((always_inline)) TARGET void rows16_block32_passes(const int type, const uint8_t *group,
                                                                              const void *xq, int64_t stride,
                                                                              int n_tokens, int64_t nb,
                                                                              const void *stop, float *y,
                                                                              int64_t ldy) {
    const int passes = (n_tokens + 3) / 4;
    for (int p = 0, t = 0; p < passes; p++) {
        const int T = (n_tokens - t) / (passes - p);  /* 2 to 4 */
        rows16_block32_upto4(type, group, token_row(xq, stride, t), stride, T, nb, p == 0 ? stop : group,
                             y + t * ldy, ldy);
        t += T;
    }
}

/* Each type's kernel: decode's one token alone, two to four tokens each in a loop of its
 * own, a few more in passes of those, a prompt's in its span. */
#define ROWS16_BLOCK32(name, NAME)                                                                              \
    TARGET void sq_packed_dot16_##name##_avx512vnni(const void *group, int64_t row_bytes, const void *xq,      \
                                                    int64_t stride, int n_tokens, int64_t nb, const void *stop,\
                                                    float *y, int64_t ldy) {                                   \
        (void)row_bytes;                                                                                        \
        if (n_tokens <= 4)                                                                                      \
            rows16_block32_upto4(SQ_##NAME, group, xq, stride, n_tokens, nb, stop, y, ldy);                    \
        else if (n_tokens <= FEW_TOKENS && four_bit_codes(SQ_##NAME))                                           \
            rows16_block32_passes(SQ_##NAME, group, xq, stride, n_tokens, nb, stop, y, ldy);                   \
        else if (n_tokens <= FEW_TOKENS)                                                                        \
            rows16_block32(SQ_##NAME, group, xq, stride, n_tokens, nb, stop, y, ldy, FEW_TOKENS);              \
        else                                                                                                    \
            rows16_block32(SQ_##NAME, group, xq, stride, n_tokens, nb, stop, y, ldy, PROMPT_SPAN);             \
    }
ROWS16_BLOCK32(q4_1, Q4_1)
ROWS16_BLOCK32(q8_0, Q8_0)
ROWS16_BLOCK32(q4_0, Q4_0)
ROWS16_BLOCK32(q5_0, Q5_0)
ROWS16_BLOCK32(q5_1, Q5_1)
ROWS16_BLOCK32(iq4_nl, IQ4_NL)

/* ---------------------------------------------------------------------------
 * Q6_K: sixteen rows packed side by side
 * ------------------------------------------------------------------------- */

/* The scales and d of block i of a packed group of sixteen Q6_K rows: scale[g] lane r holds row
 * r's scale of group g (codes 16g..16g+15), sign-extended; off[p] its scales of groups 2p
 * and 2p + 1, each times -32, as two int16 (|.| <= 4096), so that vpdpwssd by a pair of
 * bsums takes the codes' offset of 32 off a block's sum; d each row's. The run
 * (quants/rows16.c) holds the sixteen d, then word j of the sixteen rows at 32 + 64j: ql's
 * are words 0-31, qh's 32-47, the scales' 48-51. */
static inline __attribute__((always_inline)) TARGET void q6_K_scales16(const uint8_t *group, int64_t i,
                                                                      v16i scale[16], v16i off[8], v16f *d) {
    v16i w[4];  /* w[j] lane r: scales 4j..4j+3 of row r */
    const uint8_t *run = group + i * 16 * (int64_t)sizeof(block_q6_K);
    for (int j = 0; j < 4; j++)
        w[j] = V16(loadu_si512)(run + 32 + 64 * (48 + j));
    *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    for (int g = 0; g < 16; g++)  /* byte g % 4, with its sign */
        scale[g] = V16(srai_epi32)(V16(slli_epi32)(w[g / 4], 24 - 8 * (g % 4)), 24);
    for (int p = 0; p < 8; p++) {
        /* bytes b and b + 1 of each lane into bytes 1 and 3, shifted down with their signs */
        const int b = 2 * (p % 2);
        const v16i pair = V16(broadcast_i32x4)(AS128I(_mm_setr_epi8(-1, b, -1, b + 1, -1, 4 + b, -1, 5 + b, -1, 8 + b,
                                                                    -1, 9 + b, -1, 12 + b, -1, 13 + b)));
        off[p] = V16(mullo_epi16)(V16(srai_epi16)(V16(shuffle_epi8)(w[p / 2], pair), 8), V16(set1_epi16)(-32));
    }
}

/* Chunk k (codes 32k .. 32k + 31) of block i of a packed group of sixteen Q6_K rows:
 * code[j] lane r holds row r's 6-bit codes 32k + 4j .. +3, the low four bits from ql
 * (bytes 64h + 32(k & 1) .. of the block, h = k / 4: their low nibbles for k % 4 < 2, else
 * their high ones), the top two from bits 2(k % 4) of qh's bytes 32h ..; each register's
 * bytes one load. */
static inline __attribute__((always_inline)) TARGET void q6_K_chunk16(const uint8_t *group, int64_t i, int k,
                                                                     v16i code[8]) {
    const int h = k / 4, part = k % 4;
    const uint8_t *words = group + i * 16 * (int64_t)sizeof(block_q6_K) + 32;
    const v16i m4 = V16(set1_epi8)(0x0f), top2 = V16(set1_epi8)(0x30);
    for (int j = 0; j < 8; j++) {
        const v16i l = V16(loadu_si512)(words + 64 * (16 * h + 8 * (part & 1) + j));
        const v16i hb = V16(loadu_si512)(words + 64 * (32 + 8 * h + j));
        const v16i low = part < 2 ? l : V16(srli_epi32)(l, 4);
        const v16i high = part == 0   ? V16(slli_epi32)(hb, 4)
                          : part == 1 ? V16(slli_epi32)(hb, 2)
                          : part == 2 ? hb
                                      : V16(srli_epi32)(hb, 2);
        /* (low & 0x0f) | (high & 0x30): ternary-logic 0xea is (a & b) | c */
        code[j] = V16(ternarylogic_epi32)(low, m4, V16(and_si512)(high, top2), 0xea);
    }
}

/* A packed group of sixteen Q6_K rows times n_tokens activation rows,
 * each output the scalar definition's bits for its row and token (quants/types.h): per
 * block the exact isum = sum(scale * (code - 32) * a), formed as the sum over groups of
 * the scale times vpdpbusd's sum of the unsigned codes' 16 products (|.| <= 16 * 63 * 128,
 * times the scale by vpmulld), the offset taken off through the bsums (q6_K_scales16);
 * then the block step by the row's d times the token's. A chunk's eight registers of codes
 * stay while the tile's tokens go by, each token's isum waiting for the block's last chunk.
 * (88 multiplies per block and token, where the eight lanes per row of before took 136:
 * vpmaddubsw and vpdpwssd per four codes.) TILE tokens at a time: 1 for decode (the
 * token's sums stay in registers), 16 for a few (a lookup draft's check), 64 for a prompt
 * (batch), which also asks for each token's next block a block ahead. y[t * ldy + r] for r
 * < 16; the bytes to come are asked of memory up to stop a piece per chunk, as rows16_super
 * asks for them. */
static inline __attribute__((always_inline)) TARGET void rows16_q6_K(const uint8_t *group, const void *xq,
                                                                    int64_t stride, int n_tokens, int64_t nb,
                                                                    const void *stop, float *y, int64_t ldy,
                                                                    const int TILE) {
    enum { MAX_TILE = 64, RUN = 16 * (int)sizeof(block_q6_K) };
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        v16f sum[MAX_TILE];
        v16i isum[MAX_TILE];
        for (int t = 0; t < nt; t++)
            sum[t] = opaque_zero16();
        for (int64_t i = 0; i < nb; i++) {
            v16i scale[16], off[8];
            v16f d_rows;
            q6_K_scales16(group, i, scale, off, &d_rows);
            for (int t = 0; t < nt; t++) {
                const block_q8_K *a = token_block(xq, stride, t0 + t, i);
                if (TILE == 64 && i + 1 < nb)
                    prefetch_block_q8_K(a + 1);
                v16i even = V16(setzero_si512)(), odd = V16(setzero_si512)();
                for (int p = 0; p < 8; p += 2) {
                    even = dpwssd_pair(even, off[p], a->bsums + 2 * p);
                    odd = dpwssd_pair(odd, off[p + 1], a->bsums + 2 * p + 2);
                }
                isum[t] = V16(add_epi32)(even, odd);
            }
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {  /* unrolled: each chunk's shifts are its own */
                v16i code[8];
                q6_K_chunk16(group, i, k, code);
                if (t0 == 0)  /* one stream: ahead of an eighth of the run per chunk */
                    prefetch_run(group + i * RUN + k * (RUN / 8), RUN / 8, PACKED_AHEAD_K, stop, 1);
                for (int t = 0; t < nt; t++) {
                    const int8_t *aq = token_block(xq, stride, t0 + t, i)->qs + 32 * k;
                    v16i g0 = V16(setzero_si512)(), g1 = V16(setzero_si512)();
                    for (int j = 0; j < 4; j++) {
                        g0 = dpbusd_word(g0, code[j], aq + 4 * j);
                        g1 = dpbusd_word(g1, code[j + 4], aq + 16 + 4 * j);
                    }
                    isum[t] = V16(add_epi32)(isum[t], scaled_pair16(g0, scale[2 * k], g1, scale[2 * k + 1]));
                }
            }
            for (int t = 0; t < nt; t++)
                sum[t] = block_step16(sum[t], isum[t], d_rows, V16(set1_ps)(token_block(xq, stride, t0 + t, i)->d));
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, sum[t]);
    }
}

/* Q6_K's entry points: a few tokens in tiles of 16 (decode's one token, and two to four, in
 * tiles of their own: the 3B shape's Q6_K rows ran x1.14-1.20 as fast at 2-4 tokens with
 * their sums in registers; Q4_K's ran x0.97 so, and keep theirs), a prompt's batch in
 * tiles of 64. */
TARGET void sq_packed_dot16_q6_K_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                            int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    (void)row_bytes;
    if (n_tokens == 1)
        rows16_q6_K(group, xq, stride, 1, nb, stop, y, ldy, 1);
    else if (n_tokens == 2)
        rows16_q6_K(group, xq, stride, 2, nb, stop, y, ldy, 2);
    else if (n_tokens == 3)
        rows16_q6_K(group, xq, stride, 3, nb, stop, y, ldy, 3);
    else if (n_tokens == 4)
        rows16_q6_K(group, xq, stride, 4, nb, stop, y, ldy, 4);
    else
        rows16_q6_K(group, xq, stride, n_tokens, nb, stop, y, ldy, 16);
}

TARGET void sq_packed_batch16_q6_K_avx512vnni(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                              int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    (void)row_bytes;
    rows16_q6_K(group, xq, stride, n_tokens, nb, stop, y, ldy, 64);
}

/* ---------------------------------------------------------------------------
 * Q5_K, IQ4_XS, Q3_K and Q2_K: sixteen rows packed side by side
 * ------------------------------------------------------------------------- */

/* x shifted left by n bits in each 32-bit lane, right by -n where n < 0: masked, a bit of
 * each byte moved to another place in that byte (what crosses from a neighbour masked off). */
static inline __attribute__((always_inline)) TARGET v16i shift_bits(v16i x, int n) {
    return n > 0 ? V16(slli_epi32)(x, n) : n < 0 ? V16(srli_epi32)(x, -n) : x;
}

/* Where a packed Q5_K run's words lie, in 64-byte units from the run's start (the d and
 * dmin, sixteen halves each, take the first): the scales, the fifth bits, the codes. */
enum { Q5_K_SCALES_AT = 1, Q5_K_QH_AT = 4, Q5_K_QS_AT = 12 };

/* Q5_K: the header of a block's run in a packed group of sixteen rows, as q4_K_headers16
 * reads Q4_K's (a Q5_K run's first 256 bytes are a Q4_K run's: d, dmin, the packed scales
 * and mins), and qh[j] lane r the qh bytes 4j..4j+3 of row r: the fifth bits of all its
 * codes. */
static inline __attribute__((always_inline)) TARGET void q5_K_header16(const uint8_t *run, v16i scale[8], v16i mins[4],
                                                                      v16i qh[8], v16f *d, v16f *dmin) {
    q4_K_headers16(run, 0, scale, mins, d, dmin);
    for (int j = 0; j < 8; j++)
        qh[j] = V16(loadu_si512)(run + 64 * (Q5_K_QH_AT + j));
}

/* The codes of one register of a Q5_K span (q: the bytes of qs word j of span c, sixteen
 * rows; qh: their qh word j): bit 4 of element l of group g is bit g of byte l of qh. */
static inline __attribute__((always_inline)) TARGET void q5_K_word16(v16i q, v16i qh, int c, v16i *low, v16i *high) {
    const v16i m4 = V16(set1_epi8)(0x0f), bit4 = V16(set1_epi8)(0x10);
    /* (a & b) | c: ternary-logic 0xea */
    *low = V16(ternarylogic_epi32)(q, m4, V16(and_si512)(shift_bits(qh, 4 - 2 * c), bit4), 0xea);
    *high = V16(ternarylogic_epi32)(V16(srli_epi16)(q, 4), m4, V16(and_si512)(shift_bits(qh, 3 - 2 * c), bit4), 0xea);
}

/* Span c (elements 64c .. 64c + 63) of a Q5_K block's run, as q4_K_codes16's: the nibbles
 * of qs and the fifth bits of qh (q5_K_header16), so codes in 0..31 (a group's sum in
 * q4_K_span16 at most 32 * 31 * 127 < 2^17, times a scale below 64). */
static inline __attribute__((always_inline)) TARGET void q5_K_codes16(const uint8_t *run, int c, const v16i qh[8],
                                                                     v16i code[2][8]) {
    for (int j = 0; j < 8; j++)
        q5_K_word16(V16(loadu_si512)(run + 64 * (Q5_K_QS_AT + 8 * c + j)), qh[j], c, &code[0][j], &code[1][j]);
}

/* Where a packed IQ4_XS run's words lie, in 64-byte units (d and scales_h, sixteen of each,
 * take the first): the low bits of the scales, the codes. */
enum { IQ4_XS_SCALES_AT = 1, IQ4_XS_QS_AT = 2 };

/* IQ4_XS: the header of a block's run in a packed group of sixteen rows: scale[g]
 * lane r row r's scale of group g (s - 32, in -32..31); off[q] -128 times the scales of
 * groups 2q and 2q + 1 as two int16 (|.| <= 4096), so that vpdpwssd by those groups' sums
 * of 32 codes (sums32_16) takes off the 128 that iq4_xs_codes16 adds to every grid value;
 * d each row's. */
static inline __attribute__((always_inline)) TARGET void iq4_xs_header16(const uint8_t *run, v16i scale[8],
                                                                        v16i off[4], v16f *d) {
    v16i w[2];  /* w[0] lane r: row r's scales_h (high half); w[1] its scales_l */
    w[0] = V16(slli_epi32)(V16(cvtepu16_epi32)(AS256I(_mm256_loadu_si256((const __m256i *)(run + 32)))), 16);
    w[1] = V16(loadu_si512)(run + 64 * IQ4_XS_SCALES_AT);
    *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    for (int g = 0; g < 8; g++) {
        /* the low four bits: nibble g of scales_l; the high two: bits 2g, 2g + 1 of scales_h */
        const v16i s = V16(or_si512)(V16(and_si512)(V16(srli_epi32)(w[1], 4 * g), V16(set1_epi32)(0x0f)),
                                     V16(and_si512)(V16(srli_epi32)(w[0], 12 + 2 * g), V16(set1_epi32)(0x30)));
        scale[g] = V16(sub_epi32)(s, V16(set1_epi32)(32));
    }
    for (int q = 0; q < 4; q++) {
        const v16i o0 = V16(mullo_epi32)(scale[2 * q], V16(set1_epi32)(-128));
        const v16i o1 = V16(mullo_epi32)(scale[2 * q + 1], V16(set1_epi32)(-128));
        off[q] = V16(or_si512)(V16(and_si512)(o0, V16(set1_epi32)(0xffff)), V16(slli_epi32)(o1, 16));
    }
}

/* The grid values, each plus 128, of the nibbles of one register of IQ4_XS codes. */
static inline __attribute__((always_inline)) TARGET void iq4_xs_word16(v16i q, v16i *low, v16i *high) {
    const v16i m4 = V16(set1_epi8)(0x0f);
    const v16i grid = V16(broadcast_i32x4)(AS128I(_mm_xor_si128(_mm_setr_epi8(SQ_IQ4_GRID), _mm_set1_epi8((char)0x80))));
    *low = V16(shuffle_epi8)(grid, V16(and_si512)(q, m4));
    *high = V16(shuffle_epi8)(grid, V16(and_si512)(V16(srli_epi16)(q, 4), m4));
}

/* Span c of an IQ4_XS block's run, as q4_K_codes16's: code[h][j]
 * lane r holds the grid values of row r's elements 32h + 4j .. +3 of the span (group 2c + h:
 * its qs bytes 0..15 hold elements 0..15 in their low nibbles, 16..31 in their high ones),
 * each plus 128 (1..241), so that it multiplies as an unsigned byte (a group's sum in
 * q4_K_span16 at most 32 * 241 * 127 < 2^20, times a scale of at most 32: the block's isum
 * with the offsets' share stays below 2^29). */
static inline __attribute__((always_inline)) TARGET void iq4_xs_codes16(const uint8_t *run, int c, v16i code[2][8]) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            iq4_xs_word16(V16(loadu_si512)(run + 64 * (IQ4_XS_QS_AT + 8 * c + 4 * h + j)), &code[h][j],
                          &code[h][j + 4]);
}

/* The codes of span c of a Q4_K, Q5_K or IQ4_XS block's run (q4_K_codes16, q5_K_codes16,
 * iq4_xs_codes16; qh: Q5_K's fifth bits) and q4_K_span16 at once for T tokens (one or
 * two): each register of codes goes from its load straight to its products, none parked on
 * the stack. (Put side by side first, the sixteen registers of a Q4_K span went to the
 * stack and back, and decode took 1.3x as long; two Q5_K tokens through the tile of
 * sixteen, its codes parked, read 0.78x as fast as the file's layout did.) Register j of a
 * Q4_K or Q5_K span holds both groups' words j (low nibbles group 2c, high 2c + 1); of an
 * IQ4_XS span, group j / 4's elements 4j.. (low) and 16 + 4j.. (high). Each group's
 * products go into two chains, so that each waits on half the instructions. */
static inline __attribute__((always_inline)) TARGET void k_packed_span16(const int type, const uint8_t *run, int c,
                                                                        const v16i qh[8], const int T,
                                                                        const int8_t *const aq[2], v16i sc_low,
                                                                        v16i sc_high, v16i isum[2]) {
    const v16i m4 = V16(set1_epi8)(0x0f);
    v16i acc[2][2][2];  /* token, group, chain */
    for (int t = 0; t < T; t++)
        acc[t][0][0] = acc[t][0][1] = acc[t][1][0] = acc[t][1][1] = V16(setzero_si512)();
    for (int j = 0; j < 8; j++) {
        v16i lo, hi;
        if (type == SQ_Q5_K) {
            q5_K_word16(V16(loadu_si512)(run + 64 * (Q5_K_QS_AT + 8 * c + j)), qh[j], c, &lo, &hi);
        } else if (type == SQ_IQ4_XS) {
            iq4_xs_word16(V16(loadu_si512)(run + 64 * (IQ4_XS_QS_AT + 8 * c + j)), &lo, &hi);
        } else {
            const v16i q = V16(loadu_si512)(run + 64 * (Q4_K_QS_AT + 8 * c + j));
            lo = V16(and_si512)(q, m4);
            hi = V16(and_si512)(V16(srli_epi16)(q, 4), m4);
        }
        for (int t = 0; t < T; t++) {
            if (type == SQ_IQ4_XS) {
                const int g = j / 4, at = 32 * g + 4 * (j % 4);
                acc[t][g][0] = dpbusd_word(acc[t][g][0], lo, aq[t] + at);
                acc[t][g][1] = dpbusd_word(acc[t][g][1], hi, aq[t] + at + 16);
            } else {
                acc[t][0][j & 1] = dpbusd_word(acc[t][0][j & 1], lo, aq[t] + 4 * j);
                acc[t][1][j & 1] = dpbusd_word(acc[t][1][j & 1], hi, aq[t] + 32 + 4 * j);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        isum[t] = V16(add_epi32)(isum[t], V16(mullo_epi32)(V16(add_epi32)(acc[t][0][0], acc[t][0][1]), sc_low));
        isum[t] = V16(add_epi32)(isum[t], V16(mullo_epi32)(V16(add_epi32)(acc[t][1][0], acc[t][1][1]), sc_high));
    }
}

/* Where a packed Q3_K run's words lie, in 64-byte units after its sixteen d (32 bytes):
 * hmask's first, then qs's, then the scales'; and a packed Q2_K run's qs, after its sixteen
 * d and dmin (64 bytes) and the scales' four. */
enum { Q3_K_QS_AT = 8, Q3_K_SCALES_AT = 24, Q2_K_QS_AT = 4 };

/* Q3_K: the header of a block's run in a packed group of sixteen rows, for codes that carry their
 * group's scale sc (in -32..31) as unsigned bytes (q3_K_codes16): for group g, scale2[g]
 * lane r |sc| of row r in both int16, flip[g] 7 in each byte where sc < 0, else 0; off[p]
 * the offsets of groups 2p and 2p + 1 as two int16 (in -124..0), -4 sc where sc >= 0, 3 sc
 * where sc < 0, so that vpdpwssd by a pair of bsums makes the block's sum of the codes'
 * products exact (see q3_K_codes16); hmask[j] lane r the hmask bytes 4j..4j+3 of row r (the
 * codes' high bits); d each row's. */
static inline __attribute__((always_inline)) TARGET void q3_K_header16(const uint8_t *run, v16i scale2[16],
                                                                      v16i flip[16], v16i off[8], v16i hmask[8],
                                                                      v16f *d) {
    v16i s[3];  /* s[j] lane r: row r's scales bytes 4j..4j+3 */
    *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    for (int j = 0; j < 3; j++)
        s[j] = V16(loadu_si512)(run + 32 + 64 * (Q3_K_SCALES_AT + j));
    const v16i m4 = V16(set1_epi8)(0x0f), m2 = V16(set1_epi8)(0x03);
    v16i o[16];
    for (int k = 0; k < 4; k++) {
        /* u's bytes: groups 4k..4k+3's 6-bit codes, sc + 32. The low four bits: the low
         * nibbles of scales 0..7 for groups 0..7, their high nibbles for 8..15; the high two:
         * bits 2k, 2k + 1 of scales 8..11. */
        const v16i low = k < 2 ? V16(and_si512)(s[k], m4) : V16(and_si512)(V16(srli_epi32)(s[k - 2], 4), m4);
        const v16i u = V16(or_si512)(low, V16(slli_epi32)(V16(and_si512)(V16(srli_epi32)(s[2], 2 * k), m2), 4));
        for (int b = 0; b < 4; b++) {
            const int g = 4 * k + b;
            const v16i sc = V16(sub_epi32)(byte_of_words(u, b), V16(set1_epi32)(32));
            const v16i neg = V16(srai_epi32)(sc, 31);
            const v16i abs = V16(abs_epi32)(sc);
            scale2[g] = V16(or_si512)(abs, V16(slli_epi32)(abs, 16));
            flip[g] = V16(and_si512)(neg, V16(set1_epi8)(7));
            o[g] = V16(mullo_epi32)(sc, V16(sub_epi32)(V16(and_si512)(neg, V16(set1_epi32)(7)), V16(set1_epi32)(4)));
        }
    }
    for (int p = 0; p < 8; p++)
        off[p] = V16(or_si512)(V16(and_si512)(o[2 * p], V16(set1_epi32)(0xffff)), V16(slli_epi32)(o[2 * p + 1], 16));
    for (int j = 0; j < 8; j++)
        hmask[j] = V16(loadu_si512)(run + 32 + 64 * j);
}

/* Span c (chunks 2c and 2c + 1 of 32 elements) of a Q3_K block's run:
 * code[h][j] lane r holds row r's elements 64c + 32h + 4j .. +3 as bytes w = c' |sc| where
 * sc >= 0, (7 - c') |sc| where sc < 0 (w <= 7 * 32 = 224), c' = q + 4 in 0..7 its code: the
 * two low bits from bits 2s of the qs bytes 32m .. 32m + 31 of its half m = k / 4 (chunk k
 * = 2c + h, s = k % 4), the third from bit k of hmask's; low: those 32 bytes side by side,
 * read at the half's first span. Then sc q = w - 4 sc where sc >= 0 and w + 3 sc where sc <
 * 0: the group's products sum(sc q a) are sum(w a) + off's share times its bsum
 * (q3_K_header16). vpmullw multiplies two bytes at once by |sc| (the product of each stays
 * in its byte), and the block's sum takes no multiply per token. */
static inline __attribute__((always_inline)) TARGET void q3_K_codes16(const uint8_t *run, int c, v16i low[8],
                                                                     const v16i hmask[8], const v16i scale2[16],
                                                                     const v16i flip[16], v16i code[2][8]) {
    const v16i m2 = V16(set1_epi8)(0x03), bit2 = V16(set1_epi8)(0x04);
    if (c % 2 == 0)
        for (int j = 0; j < 8; j++)
            low[j] = V16(loadu_si512)(run + 32 + 64 * (Q3_K_QS_AT + 4 * c + j));
    for (int h = 0; h < 2; h++) {
        const int k = 2 * c + h;
        for (int j = 0; j < 8; j++) {
            const int g = 2 * k + j / 4;
            /* (a & b) ^ c: ternary-logic 0x6a; the code's bits apart, so ^ flip is 7 - c' */
            const v16i high = V16(ternarylogic_epi32)(shift_bits(hmask[j], 2 - k), bit2, flip[g], 0x6a);
            const v16i q = V16(ternarylogic_epi32)(shift_bits(low[j], -2 * (k % 4)), m2, high, 0x6a);
            code[h][j] = V16(mullo_epi16)(q, scale2[g]);
        }
    }
}

/* Q2_K: the header of a block's run in a packed group of sixteen rows: scale2[g] lane r row r's scale
 * of group g (0..15) in both int16, for q2_K_codes16; min2[p] its mins of groups 2p and 2p +
 * 1 (0..15) as two int16, for vpdpwssd by a pair of bsums; d and dmin each row's. */
static inline __attribute__((always_inline)) TARGET void q2_K_header16(const uint8_t *run, v16i scale2[16],
                                                                      v16i min2[8], v16f *d, v16f *dmin) {
    v16i w[4];  /* w[j] lane r: row r's scales bytes 4j..4j+3, each a scale (low nibble) and a min */
    *d = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)run)));
    *dmin = V16(cvtph_ps)(AS256I(_mm256_loadu_si256((const __m256i *)(run + 32))));
    for (int j = 0; j < 4; j++)
        w[j] = V16(loadu_si512)(run + 64 + 64 * j);
    for (int g = 0; g < 16; g++)
        scale2[g] = V16(and_si512)(byte_twice16(w[g / 4], g % 4), V16(set1_epi16)(0x0f));
    for (int p = 0; p < 8; p++)
        min2[p] = V16(srli_epi16)(byte_pair16(w[p / 2], 2 * (p % 2)), 4);
}

/* Span c of a Q2_K block's run, as q3_K_codes16's but the 2-bit codes
 * (0..3) alone, each times its group's scale (0..15) by vpmullw, two bytes at once: each
 * product, at most 45, stays in its byte. */
static inline __attribute__((always_inline)) TARGET void q2_K_codes16(const uint8_t *run, int c, v16i low[8],
                                                                     const v16i scale2[16], v16i code[2][8]) {
    const v16i m2 = V16(set1_epi8)(0x03);
    if (c % 2 == 0)
        for (int j = 0; j < 8; j++)
            low[j] = V16(loadu_si512)(run + 64 + 64 * (Q2_K_QS_AT + 4 * c + j));
    for (int h = 0; h < 2; h++) {
        const int k = 2 * c + h;
        for (int j = 0; j < 8; j++)
            code[h][j] = V16(mullo_epi16)(V16(and_si512)(shift_bits(low[j], -2 * (k % 4)), m2), scale2[2 * k + j / 4]);
    }
}

/* A span's 64 products for one token (aq: its 64 codes) into isum, for codes that carry
 * their scales (Q3_K's, Q2_K's): the products summed, in two chains of alternate words. */
static inline __attribute__((always_inline)) TARGET v16i span16_scaled(const int8_t *aq, const v16i code[2][8],
                                                                      v16i isum) {
    v16i other = V16(setzero_si512)();
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 8; j += 2) {
            isum = dpbusd_word(isum, code[h][j], aq + 32 * h + 4 * j);
            other = dpbusd_word(other, code[h][j + 1], aq + 32 * h + 4 * j + 4);
        }
    return V16(add_epi32)(isum, other);
}

/* Block i's share of a token's integer sums from its bsums: the sum over p of the two
 * int16 of pairs[p] times bsums 2p and 2p + 1 (vpdpwssd; two chains). Q3_K's and Q2_K's,
 * whose groups are sixteen codes. */
static inline __attribute__((always_inline)) TARGET v16i bsums16(const v16i pairs[8], const int16_t *bsums) {
    v16i even = V16(setzero_si512)(), odd = V16(setzero_si512)();
    for (int p = 0; p < 8; p += 2) {
        even = dpwssd_pair(even, pairs[p], bsums + 2 * p);
        odd = dpwssd_pair(odd, pairs[p + 1], bsums + 2 * p + 2);
    }
    return V16(add_epi32)(even, odd);
}

/* The same for the types of groups of 32 (Q4_K, Q5_K, IQ4_XS): the sum over q of the two
 * int16 of pairs[q] times groups 2q and 2q + 1's sums of 32 codes, which the token's
 * activation row holds after its blocks (sums: block i's eight, quants/blocks.h). */
static inline __attribute__((always_inline)) TARGET v16i sums32_16(const v16i pairs[4], const int16_t *sums) {
    const v16i even = dpwssd_pair(V16(setzero_si512)(), pairs[0], sums);
    const v16i odd = dpwssd_pair(V16(setzero_si512)(), pairs[1], sums + 2);
    return V16(add_epi32)(dpwssd_pair(even, pairs[2], sums + 4), dpwssd_pair(odd, pairs[3], sums + 6));
}

/* Of the types of 256-element blocks: whose scales are per group of 32 codes (Q3_K's and
 * Q2_K's per 16), and whose pairs are mins, taken off by a second chain (Q4_K, Q5_K, Q2_K;
 * IQ4_XS's and Q3_K's are offsets, taken off a block's own sum). */
static inline int super_groups32(const int type) { return type == SQ_Q4_K || type == SQ_Q5_K || type == SQ_IQ4_XS; }
static inline int super_mins(const int type) { return type == SQ_Q4_K || type == SQ_Q5_K || type == SQ_Q2_K; }

/* What block i's pairs (super_header16) take from token t's activations (nb blocks a
 * row): through its sums of 32 codes where the type's groups are 32 codes, else its bsums. */
static inline __attribute__((always_inline)) TARGET v16i pairs_share16(const int type, const v16i pairs[8],
                                                                      const void *xq, int64_t stride, int t,
                                                                      int64_t nb, int64_t i) {
    if (super_groups32(type))
        return sums32_16(pairs, token_sums32(xq, stride, t, nb, i));
    return bsums16(pairs, token_block(xq, stride, t, i)->bsums);
}

/* A block run's header, for a type of 256-element blocks (Q4_K, Q5_K, IQ4_XS, Q3_K, Q2_K), by
 * its <type>_header16: the integer scales (and Q3_K's flips), the pairs that meet the
 * activations' sums (pairs_share16), the bits Q5_K's and Q3_K's codes take from elsewhere,
 * d and dmin (zero where the type has none). */
static inline __attribute__((always_inline)) TARGET void super_header16(const int type, const uint8_t *run,
                                                                       v16i scale[16], v16i flip[16], v16i pairs[8],
                                                                       v16i bits[8], v16f *d_rows, v16f *dmin_rows) {
    *dmin_rows = V16(setzero_ps)();
    if (type == SQ_Q4_K)
        q4_K_headers16(run, 0, scale, pairs, d_rows, dmin_rows);
    else if (type == SQ_Q5_K)
        q5_K_header16(run, scale, pairs, bits, d_rows, dmin_rows);
    else if (type == SQ_IQ4_XS)
        iq4_xs_header16(run, scale, pairs, d_rows);
    else if (type == SQ_Q3_K)
        q3_K_header16(run, scale, flip, pairs, bits, d_rows);
    else
        q2_K_header16(run, scale, pairs, d_rows, dmin_rows);
}

/* Span c's codes of such a run, by its <type>_codes16 (low: the 2-bit codes Q3_K and Q2_K
 * read at a half's first span). */
static inline __attribute__((always_inline)) TARGET void super_codes16(const int type, const uint8_t *run, int c,
                                                                      v16i low[8], const v16i bits[8],
                                                                      const v16i scale[16], const v16i flip[16],
                                                                      v16i code[2][8]) {
    if (type == SQ_Q4_K)
        q4_K_codes16(run, 0, c, code);
    else if (type == SQ_Q5_K)
        q5_K_codes16(run, c, bits, code);
    else if (type == SQ_IQ4_XS)
        iq4_xs_codes16(run, c, code);
    else if (type == SQ_Q3_K)
        q3_K_codes16(run, c, low, bits, scale, flip, code);
    else
        q2_K_codes16(run, c, low, scale, code);
}

/* The block steps of block i for tokens t0 .. t0 + nt - 1 of a super-block type (rows16_super
 * and its AMX form; nb blocks a row): each token's isum into its sum, and where the type has
 * mins their share (pairs_share16) into off, both by the row's d (dmin) times the token's;
 * with fetch_next, each token's next activation block is asked of memory first. */
static inline __attribute__((always_inline)) TARGET void super_steps16(const int type, const void *xq, int64_t stride,
                                                                      int t0, int nt, int64_t nb, int64_t i,
                                                                      int fetch_next, const v16i isum[],
                                                                      const v16i pairs[8], v16f d_rows,
                                                                      v16f dmin_rows, v16f sum[], v16f off[]) {
    const int mins = super_mins(type);
    for (int t = 0; t < nt; t++) {
        const block_q8_K *a = token_block(xq, stride, t0 + t, i);
        if (fetch_next)
            prefetch_block_q8_K(a + 1);
        const v16f a_d = V16(set1_ps)(a->d);
        sum[t] = block_step16(sum[t], isum[t], d_rows, a_d);
        if (mins)
            off[t] = block_step16(off[t], pairs_share16(type, pairs, xq, stride, t0 + t, nb, i), dmin_rows, a_d);
    }
}

/* y[t * ldy + r] = sum (- off where the type has mins) for the nt tokens' sixteen rows. */
static inline __attribute__((always_inline)) TARGET void super_store16(int mins, int nt, const v16f sum[],
                                                                      const v16f off[], float *y, int64_t ldy) {
    for (int t = 0; t < nt; t++)
        V16(storeu_ps)(y + t * ldy, mins ? V16(sub_ps)(sum[t], off[t]) : sum[t]);
}

/* A packed group of sixteen rows of a type of 256-element blocks with Q8_K activations
 * (Q4_K, Q5_K, IQ4_XS, Q3_K, Q2_K) times n_tokens activation rows, each output the scalar
 * definition's bits for its row and token (quants/types.h): per block a header of sixteen
 * rows (<type>_header16: the integer scales, the pairs that meet the activations' sums, d
 * and dmin), then four spans of 64 codes (<type>_codes16), sixteen registers that stay while the
 * tile's tokens go by, each token's isum waiting for the block's last span. vpdpbusd forms
 * a group's products in eight instructions, where the AVX2 kernels take sixteen for half
 * the rows. The codes go to vpdpbusd as unsigned bytes; where that takes an offset (IQ4_XS's
 * grid values plus 128, Q3_K's codes with their scales folded in), the pairs take it back
 * off exactly through the activations' sums at the block's start (pairs_share16: two groups
 * of 32 a vpdpwssd, or two halves of Q3_K's one); Q4_K's, Q5_K's and Q2_K's pairs are
 * their mins, whose sum takes the second chain's block step at the block's end. A group's
 * products meet its scale by vpmulld per token and group of 32 (Q4_K, Q5_K, IQ4_XS), or are
 * scaled in the codes (Q3_K, Q2_K: their groups of 16 would take twice as many). y = sum,
 * or sum - off.
 * TILE tokens at a time: 1 (decode) or 2 of Q4_K, Q5_K or IQ4_XS, each span's codes from
 * the loads straight to the products (k_packed_span16); 16 for a few
 * (a lookup draft's check), 64 for a prompt (tiles of 32 were 2-4% slower). Q4_K's prompt also asks
 * for each token's next activation block a block ahead: a batch of long rows outgrows L2,
 * and the hardware does not follow one block from each of 64 token rows at a time (the
 * same made 64 tokens of Q5_K rows of 11,008 columns 12% slower, one thread).
 * The bytes to come are asked of memory up to stop a piece per span, in their order in
 * memory, `ahead` bytes ahead of the span: PACKED_AHEAD_K, but decode's decode_fetch.
 * (Asked a block's worth at a time, Q4_K rows of 2,048 columns streamed from memory no
 * faster than the eight-row kernel's, where in cache they ran 30% faster; spread out, the
 * 3B shape's Q4_K rows at 8 tokens took 190 ms where they took 250, one thread.)
 * y[t * ldy + r] for r < 16. */
static inline __attribute__((always_inline)) TARGET void rows16_super(const int type, const uint8_t *group,
                                                                     const void *xq, int64_t stride, int n_tokens,
                                                                     int64_t nb, const void *stop, float *y,
                                                                     int64_t ldy, const int TILE) {
    enum { MAX_TILE = 64 };
    const int ahead = TILE == 1 ? decode_fetch_here().ahead_K : PACKED_AHEAD_K;
    const int mins = super_mins(type);
    const int64_t bytes = sq_block_size(type);
    for (int t0 = 0; t0 < n_tokens; t0 += TILE) {
        const int nt = n_tokens - t0 < TILE ? n_tokens - t0 : TILE;
        v16f sum[MAX_TILE], off[MAX_TILE];
        v16i isum[MAX_TILE];
        for (int t = 0; t < nt; t++)
            sum[t] = off[t] = opaque_zero16();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *run = group + i * 16 * bytes;
            v16i scale[16], flip[16], pairs[8], bits[8], low[8];  /* bits: Q5_K's qh, Q3_K's hmask */
            v16f d_rows, dmin_rows;
            super_header16(type, run, scale, flip, pairs, bits, &d_rows, &dmin_rows);
            /* a token's isum: the offsets' share (pairs_share16), or, where the pairs are
             * mins, nothing until the first span's products (decode's spans add to zeros) */
            for (int t = 0; t < nt; t++)
                if (!mins || TILE <= 2)
                    isum[t] = mins ? V16(setzero_si512)() : pairs_share16(type, pairs, xq, stride, t0 + t, nb, i);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {  /* unrolled: each span's shifts are its own */
                if (t0 == 0)  /* one stream: ahead of a quarter of the run per span */
                    prefetch_run(run + c * 4 * bytes, 4 * (int)bytes, ahead, stop, 1);
                if (TILE <= 2 && super_groups32(type)) {  /* TILE tokens exactly */
                    const int8_t *aq[2];
                    for (int t = 0; t < TILE; t++)
                        aq[t] = token_block(xq, stride, t0 + t, i)->qs + 64 * c;
                    k_packed_span16(type, run, c, bits, TILE, aq, scale[2 * c], scale[2 * c + 1], isum);
                    continue;
                }
                v16i code[2][8];
                super_codes16(type, run, c, low, bits, scale, flip, code);
                for (int t = 0; t < nt; t++) {
                    const int8_t *aq = token_block(xq, stride, t0 + t, i)->qs + 64 * c;
                    const v16i so_far = c == 0 && mins ? V16(setzero_si512)() : isum[t];
                    if (type == SQ_Q3_K || type == SQ_Q2_K)
                        isum[t] = span16_scaled(aq, code, so_far);
                    else
                        isum[t] = q4_K_span16(aq, code, scale[2 * c], scale[2 * c + 1], so_far);
                }
            }
            super_steps16(type, xq, stride, t0, nt, nb, i, TILE == 64 && type == SQ_Q4_K && i + 1 < nb, isum, pairs,
                          d_rows, dmin_rows, sum, off);
        }
        super_store16(mins, nt, sum, off, y + t0 * ldy, ldy);
    }
}

/* sq_packed_dot16_<name>_avx512vnni: rows16_super for a type, decode's one token, or two,
 * in a tile of their own, a few sixteen at a time, a prompt 64 at a time (no prompt kernel
 * of its own: a prompt's tokens come here too). */
#define ROWS16_SUPER_PACKED_ENTRY(name, TYPE)                                                                   \
    TARGET void sq_packed_dot16_##name##_avx512vnni(const void *group, int64_t row_bytes, const void *xq,      \
                                                    int64_t stride, int n_tokens, int64_t nb, const void *stop,\
                                                    float *y, int64_t ldy) {                                   \
        (void)row_bytes;                                                                                        \
        if (n_tokens == 1)                                                                                      \
            rows16_super(TYPE, group, xq, stride, 1, nb, stop, y, ldy, 1);                                     \
        else if (n_tokens == 2)                                                                                 \
            rows16_super(TYPE, group, xq, stride, 2, nb, stop, y, ldy, 2);                                     \
        else if (n_tokens <= 16)                                                                                \
            rows16_super(TYPE, group, xq, stride, n_tokens, nb, stop, y, ldy, 16);                             \
        else                                                                                                    \
            rows16_super(TYPE, group, xq, stride, n_tokens, nb, stop, y, ldy, 64);                             \
    }

ROWS16_SUPER_PACKED_ENTRY(q4_K, SQ_Q4_K)
ROWS16_SUPER_PACKED_ENTRY(q5_K, SQ_Q5_K)
ROWS16_SUPER_PACKED_ENTRY(iq4_xs, SQ_IQ4_XS)
ROWS16_SUPER_PACKED_ENTRY(q3_K, SQ_Q3_K)
ROWS16_SUPER_PACKED_ENTRY(q2_K, SQ_Q2_K)

/* ---------------------------------------------------------------------------
 * AMX: a prompt's products through the tiles (the "amx" setting)
 * ------------------------------------------------------------------------- */

#ifdef SQ_AMX
#include "quants/x86/amx_tiles.h"

/* A group's products through the tiles: K codes of sixteen rows (code[j] lane r: row r's
 * codes 4j..4j+3, unsigned, as the kernels above give them to vpdpbusd) times nt tokens' K
 * activation codes (token t's at a + t * stride), into out[t][r]: the integer the kernels
 * above sum from the same bytes. nt a multiple of the tiles' rows (amx_begin). */
static inline __attribute__((always_inline)) AMX_TARGET void amx_group(const v16i *code, int K, const int8_t *a,
                                                                      int64_t stride, int nt, int rows,
                                                                      int32_t (*out)[16]) {
    _Alignas(64) uint8_t b[AMX_B_ROWS_MAX * 64];
    for (int j = 0; j < K / 4; j++)
        V16(storeu_si512)(b + 64 * j, code[j]);
    amx_load_b(b);
    for (int t = 0; t < nt; t += rows) {
        amx_load_a(a + t * stride, stride);
        amx_zero(2);
        amx_product(2);
        amx_store(2, out[t]);
    }
}

enum { AMX_TILE = 64 };  /* tokens whose sums a block's pass keeps: four tiles of sixteen */

/* rows16_block32 through the tiles: per block, its codes (block32_16) times the tokens' 32
 * codes as one product per sixteen tokens, then each token's block step (step32_16, as
 * tokens32_16 takes it: the same integer, the same float operations).
 * n_tokens a multiple of rows. */
static inline __attribute__((always_inline)) AMX_TARGET void rows16_block32_amx(const int type, const uint8_t *group,
                                                                               const void *xq, int64_t stride,
                                                                               int n_tokens, int64_t nb,
                                                                               const void *stop, float *y,
                                                                               int64_t ldy, int rows) {
    const int with_m = type == SQ_Q4_1 || type == SQ_Q5_1;  /* Q8_1 activations, an offset chain */
    const int64_t run = 16 * (int64_t)sq_block_size(type);
    const int64_t a_bytes = with_m ? (int64_t)sizeof(block_q8_1) : (int64_t)sizeof(block_q8_0);
    const int64_t qs_at = with_m ? (int64_t)offsetof(block_q8_1, qs) : (int64_t)offsetof(block_q8_0, qs);
    amx_begin(rows, 32);
    for (int t0 = 0; t0 < n_tokens; t0 += AMX_TILE) {
        const int nt = n_tokens - t0 < AMX_TILE ? n_tokens - t0 : AMX_TILE;
        v16f sum[AMX_TILE], off[AMX_TILE];
        for (int t = 0; t < nt; t++)
            sum[t] = off[t] = opaque_zero16();
        for (int64_t i = 0; i < nb; i++) {
            if (t0 == 0)
                prefetch_run(group + i * run, (int)run, PREFETCH_AHEAD, stop, 1);
            v16i codes[8];
            v16f d_rows, m_rows = V16(setzero_ps)();
            block32_16(type, group, i, codes, &d_rows, &m_rows);
            int32_t dot[AMX_TILE][16];
            const uint8_t *a = (const uint8_t *)token_row(xq, stride, t0) + i * a_bytes + qs_at;
            amx_group(codes, 32, (const int8_t *)a, stride, nt, rows, dot);
            for (int t = 0; t < nt; t++) {
                const v16i isum = V16(loadu_si512)(dot[t]);
                const void *row = token_row(xq, stride, t0 + t);
                step32_16(with_m, 0, row, nb, i, with_m ? isum : V16(add_epi32)(isum, q8_0_offset16(row, nb, i)),
                          d_rows, m_rows, &sum[t], &off[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, with_m ? V16(add_ps)(sum[t], off[t]) : sum[t]);
    }
    amx_end();
}

/* rows16_super through the tiles: a span's two groups of 32 codes (each times its scale
 * by vpmulld, as q4_K_span16 does), or for Q3_K and Q2_K, whose codes carry their scales,
 * the span's 64 at once (as span16_scaled); the header, the offsets (pairs_share16) and
 * the block steps as rows16_super's. n_tokens a multiple of rows. */
static inline __attribute__((always_inline)) AMX_TARGET void rows16_super_amx(const int type, const uint8_t *group,
                                                                             const void *xq, int64_t stride,
                                                                             int n_tokens, int64_t nb,
                                                                             const void *stop, float *y,
                                                                             int64_t ldy, int rows) {
    const int mins = super_mins(type);
    const int scaled = type == SQ_Q3_K || type == SQ_Q2_K;
    const int64_t bytes = sq_block_size(type);
    amx_begin(rows, scaled ? 64 : 32);
    for (int t0 = 0; t0 < n_tokens; t0 += AMX_TILE) {
        const int nt = n_tokens - t0 < AMX_TILE ? n_tokens - t0 : AMX_TILE;
        v16f sum[AMX_TILE], off[AMX_TILE];
        v16i isum[AMX_TILE];
        for (int t = 0; t < nt; t++)
            sum[t] = off[t] = opaque_zero16();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *run = group + i * 16 * bytes;
            v16i scale[16], flip[16], pairs[8], bits[8], low[8];  /* bits: Q5_K's qh, Q3_K's hmask */
            v16f d_rows, dmin_rows;
            super_header16(type, run, scale, flip, pairs, bits, &d_rows, &dmin_rows);
            /* a token's isum: the offsets' share (pairs_share16), or where the pairs are mins,
             * the first span's products */
            if (!mins)
                for (int t = 0; t < nt; t++)
                    isum[t] = pairs_share16(type, pairs, xq, stride, t0 + t, nb, i);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                if (t0 == 0)
                    prefetch_run(run + c * 4 * bytes, 4 * (int)bytes, PACKED_AHEAD_K, stop, 1);
                v16i code[2][8];
                super_codes16(type, run, c, low, bits, scale, flip, code);
                const int8_t *a = token_block(xq, stride, t0, i)->qs + 64 * c;
                int32_t dot[2][AMX_TILE][16];
                if (scaled) {
                    amx_group(code[0], 64, a, stride, nt, rows, dot[0]);  /* code[1] follows code[0] */
                    for (int t = 0; t < nt; t++)
                        isum[t] = c == 0 && mins ? V16(loadu_si512)(dot[0][t])
                                                 : V16(add_epi32)(isum[t], V16(loadu_si512)(dot[0][t]));
                    continue;
                }
                amx_group(code[0], 32, a, stride, nt, rows, dot[0]);
                amx_group(code[1], 32, a + 32, stride, nt, rows, dot[1]);
                for (int t = 0; t < nt; t++) {
                    const v16i span = scaled_pair16(V16(loadu_si512)(dot[0][t]), scale[2 * c],
                                                    V16(loadu_si512)(dot[1][t]), scale[2 * c + 1]);
                    isum[t] = c == 0 && mins ? span : V16(add_epi32)(isum[t], span);
                }
            }
            super_steps16(type, xq, stride, t0, nt, nb, i, 0, isum, pairs, d_rows, dmin_rows, sum, off);
        }
        super_store16(mins, nt, sum, off, y + t0 * ldy, ldy);
    }
    amx_end();
}

/* rows16_q6_K through the tiles: each chunk's two groups of 16 codes, each times its
 * scale; the offsets through the bsums and the block step as rows16_q6_K's. n_tokens a
 * multiple of rows. */
static inline __attribute__((always_inline)) AMX_TARGET void rows16_q6_K_amx(const uint8_t *group, const void *xq,
                                                                            int64_t stride, int n_tokens, int64_t nb,
                                                                            const void *stop, float *y, int64_t ldy,
                                                                            int rows) {
    enum { RUN = 16 * (int)sizeof(block_q6_K) };
    amx_begin(rows, 16);
    for (int t0 = 0; t0 < n_tokens; t0 += AMX_TILE) {
        const int nt = n_tokens - t0 < AMX_TILE ? n_tokens - t0 : AMX_TILE;
        v16f sum[AMX_TILE];
        v16i isum[AMX_TILE];
        for (int t = 0; t < nt; t++)
            sum[t] = opaque_zero16();
        for (int64_t i = 0; i < nb; i++) {
            v16i scale[16], off[8];
            v16f d_rows;
            q6_K_scales16(group, i, scale, off, &d_rows);
            for (int t = 0; t < nt; t++)
                isum[t] = bsums16(off, token_block(xq, stride, t0 + t, i)->bsums);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                v16i code[8];
                q6_K_chunk16(group, i, k, code);
                if (t0 == 0)
                    prefetch_run(group + i * RUN + k * (RUN / 8), RUN / 8, PACKED_AHEAD_K, stop, 1);
                const int8_t *a = token_block(xq, stride, t0, i)->qs + 32 * k;
                int32_t dot[2][AMX_TILE][16];
                amx_group(code, 16, a, stride, nt, rows, dot[0]);
                amx_group(code + 4, 16, a + 16, stride, nt, rows, dot[1]);
                for (int t = 0; t < nt; t++)
                    isum[t] = V16(add_epi32)(isum[t], scaled_pair16(V16(loadu_si512)(dot[0][t]), scale[2 * k],
                                                                    V16(loadu_si512)(dot[1][t]), scale[2 * k + 1]));
            }
            for (int t = 0; t < nt; t++)
                sum[t] = block_step16(sum[t], isum[t], d_rows, V16(set1_ps)(token_block(xq, stride, t0 + t, i)->d));
        }
        for (int t = 0; t < nt; t++)
            V16(storeu_ps)(y + (t0 + t) * ldy, sum[t]);
    }
    amx_end();
}

/* sq_packed_batch16_<name>_amx: kernel(<type,> ...), the tokens sixteen to a tile, then
 * those left (fewer than sixteen: a draft's check, a prompt's last few) in a tile of their
 * own rows, the group's bytes in cache by then (stop at the group: nothing asked of memory). */
#define AMX_ENTRY(name, kernel, ...)                                                                            \
    AMX_TARGET void sq_packed_batch16_##name##_amx(const void *group, int64_t row_bytes, const void *xq,       \
                                                   int64_t stride, int n_tokens, int64_t nb, const void *stop, \
                                                   float *y, int64_t ldy) {                                    \
        (void)row_bytes;                                                                                        \
        const int whole = n_tokens / 16 * 16;                                                                   \
        if (whole > 0)                                                                                          \
            kernel(__VA_ARGS__ group, xq, stride, whole, nb, stop, y, ldy, 16);                                 \
        if (n_tokens > whole)                                                                                   \
            kernel(__VA_ARGS__ group, token_row(xq, stride, whole), stride, n_tokens - whole, nb,               \
                   whole > 0 ? group : stop, y + whole * ldy, ldy, n_tokens - whole);                           \
    }

AMX_ENTRY(q4_1, rows16_block32_amx, SQ_Q4_1,)
AMX_ENTRY(q8_0, rows16_block32_amx, SQ_Q8_0,)
AMX_ENTRY(q4_0, rows16_block32_amx, SQ_Q4_0,)
AMX_ENTRY(q5_0, rows16_block32_amx, SQ_Q5_0,)
AMX_ENTRY(q5_1, rows16_block32_amx, SQ_Q5_1,)
AMX_ENTRY(iq4_nl, rows16_block32_amx, SQ_IQ4_NL,)
AMX_ENTRY(q4_K, rows16_super_amx, SQ_Q4_K,)
AMX_ENTRY(q5_K, rows16_super_amx, SQ_Q5_K,)
AMX_ENTRY(iq4_xs, rows16_super_amx, SQ_IQ4_XS,)
AMX_ENTRY(q3_K, rows16_super_amx, SQ_Q3_K,)
AMX_ENTRY(q2_K, rows16_super_amx, SQ_Q2_K,)
AMX_ENTRY(q6_K, rows16_q6_K_amx)
#endif /* SQ_AMX */

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_avx512vnni_unused;
#endif
