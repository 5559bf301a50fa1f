/* quants/x86/vec_dots.h: the x86-64 vec_dot kernels, one row of weights times one row of
 * activations, for AVX2/FMA/F16C (sq_vec_dot_<name>_avx2), and the helpers the other
 * AVX2 kernels share; part of x86/avx2.c, which includes it with x86/side_by_side.h and
 * x86/step_order.h. They serve the "avx512vnni" setting as well, for a matrix left in the
 * file's layout: there the packed sixteen-row kernels of x86/avx512vnni.c do the rest
 * (a VNNI copy of these, the same bodies with vpdpbusd, was no faster on Zen 4 and went).
 * Each gives the bits of the scalar vec_dot_<name> of quants/scalar.c, the definition of
 * the engine's products (quants/types.h): per block, in row order, an exact integer isum,
 * then one fmaf((float)isum, dw * da, sum), and for the types with offsets a second chain
 * beside it.
 *
 * quants/dispatch.c chooses them at run time (see sq_simd_name / sq_set_simd) from what
 * the CPU has; every function here carries a target attribute, and nothing here runs
 * unless that check passed (simd.h).
 *
 * Per block the codes are multiplied as bytes, with maddubs (unsigned x signed, pairs
 * summed to int16) widened by madd (int16 pairs summed to int32, times a group scale where
 * the type has one), into a register whose lanes sum to the block's isum: exact, so the
 * lanes may hold any split of it. The lanes of a few blocks are then added up together
 * (block_totals) and the blocks' steps taken one after another on a float (row_steps);
 * the K types with mins keep both chains in two lanes of one register (sum_min_step). The
 * chain's FMAs wait on one another (four cycles each on Zen 4), so a block's other work is
 * kept short, and small groups of blocks let the first step of a row come early.
 *
 * maddubs saturates int16: every use here stays below it, for activation codes in
 * -127..127 (as the quantizers make them; dot_offset also negates them). Unsigned codes
 * times them give pair sums of at most 2 * 63 * 127 = 16002 (Q6_K; Q4_1's nibbles 3810,
 * Q5_1's 7874; Q2_K, Q3_K's q + 4 and Q5_K smaller), two of Q4_1/Q5_1's folded into one
 * int16 lane 15748; codes with an offset (Q4_0, Q5_0) go as u * y plus c * -y, at most
 * 11938 and two folded 23876; signed x signed (Q8_0, the IQ4 grid) through |x| and
 * sign(y, x), at most 2 * 128 * 127 = 32512.
 */
#ifndef SMOLQ_QUANTS_X86_VEC_DOTS_H
#define SMOLQ_QUANTS_X86_VEC_DOTS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quants/kernels.h"

#define TARGET SQ_AVX2

/* ---------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------- */

/* f16 -> f32 with F16C: exact for every half, as quants/scalar.c's conversion is. */
static inline TARGET float h2f(uint16_t h) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* A block's two leading halves (d, m of a Q4_1 block; d, s of a Q8_1 block; d, dmin of
 * a Q2_K, Q4_K or Q5_K block) as floats in lanes 0 and 1, with one conversion. */
static inline TARGET __m128 h2f_pair(const uint16_t *h) {
    uint32_t both;
    memcpy(&both, h, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)both));
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
 * columns), best at 1.5-3 KiB ahead, into L1. (The packed kernels of x86/avx512vnni.c
 * ask otherwise: see there.) */
#define PREFETCH_AHEAD 2048
/* Always inlined, as every prefetch helper here: GCC sees no side effect in a prefetch,
 * so a helper left out of line is taken for a function without effects, and its calls,
 * reached through another inlined function, are deleted (it took every prefetch out of
 * the sixteen-row kernels once their bodies became inline functions). */
static inline __attribute__((always_inline)) TARGET void prefetch_ahead(const void *block, int bytes, const void *stop) {
    const uintptr_t ahead = (uintptr_t)block + PREFETCH_AHEAD;
    if (ahead + (uintptr_t)bytes <= (uintptr_t)stop) { /* all of it, as nearly always: one test */
        for (int k = 0; k < bytes; k += 64)
            _mm_prefetch((const char *)(ahead + (uintptr_t)k), _MM_HINT_T0);
        return;
    }
    for (int k = 0; k < bytes; k += 64)
        if (ahead + (uintptr_t)k < (uintptr_t)stop)
            _mm_prefetch((const char *)(ahead + (uintptr_t)k), _MM_HINT_T0);
}

/* Zero, but not known to the compiler as such: a loop that starts a variable number of
 * chains from it stays a few vector stores, where a known zero made it a memset (rep stos,
 * which takes tens of cycles to start on AMD's CPUs) per block of rows. */
static inline TARGET __m256 opaque_zero8(void) {
    __m256 z = _mm256_setzero_ps();
    __asm__("" : "+x"(z));
    return z;
}

/* 16 bytes of nibbles -> 32 codes 0..15: low nibbles in bytes 0..15, high in 16..31
 * (the element order of Q4_0/Q4_1 blocks). The bytes are loaded into both halves and
 * the high half shifted by 4, with no shuffle after the load. */
static inline TARGET __m256i nibbles32(const uint8_t *p) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
}

/* Sum of 32 products of unsigned bytes u and signed bytes s, as 8 int32 lanes: lane j
 * holds the 4 products of bytes 4j..4j+3 (maddubs's int16 pair sums, widened by madd). */
static inline TARGET __m256i dot_us8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* acc + madd(a, b): int16 pairs multiplied and summed into int32 lanes (a group scale
 * times maddubs's pair sums, in the K kernels), added to acc. */
static inline TARGET __m256i madd_add(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

/* The same for two signed operands: |x| times y with x's sign moved onto it. */
static inline TARGET __m256i dot_ss8(__m256i x, __m256i y) {
    return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* sum((u - c) * y) over 32 bytes, for unsigned u, signed y in -127..127 and constant
 * bytes c, as sum(u * y) + sum(c * -y): codes with an offset (Q4_0, Q5_0), without
 * dot_ss8's two sign instructions. The two maddubs's int16 pair sums added, at most
 * 2 * (u + c) * 127, for Q5_0's u + c <= 31 + 16 11938, left NARROW (fold_pairs widens
 * them). */
static inline TARGET __m256i dot_offset(__m256i u, __m256i c, __m256i y) {
    const __m256i neg_y = _mm256_sub_epi8(_mm256_setzero_si256(), y);
    return _mm256_add_epi16(_mm256_maddubs_epi16(u, y), _mm256_maddubs_epi16(c, neg_y));
}

/* ---------------------------------------------------------------------------
 * The block steps (quants/types.h), for a row of blocks of any type
 * ------------------------------------------------------------------------- */

/* What a kernel supplies: a block's integer vector, whose lanes sum to the block's isum
 * (in one of the forms below), and the products d = dw * da of n blocks' float scales
 * (n = 4, 2 or 1), in lanes 0..n-1 of a register. */
typedef __m256i (*block_ints_fn)(const void *x, const void *y);
typedef __m128 (*block_scales_fn)(const uint8_t *x, size_t xb, const uint8_t *y, size_t yb, int n);

/* The forms of a block's vector. WIDE: int32 lanes. NARROW: maddubs's int16 pair sums,
 * left unwidened until two blocks' are folded together (one madd for two blocks). */
enum { WIDE, NARROW };

/* Lane 0 of the result: the sum of v's 8 int32 lanes (exact). */
static inline TARGET __m128i sum_lanes(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
    return _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1));
}

/* Two blocks' vectors folded into one: in each 128-bit half, lanes 0 and 2 hold sums of
 * p's lanes, 1 and 3 of q's. Narrow (int16) vectors are folded a 32-bit pair of lanes at a
 * time and then widened, each int32 lane the sum of four of one block's int16 lanes (their
 * bound doubled: see dot_offset). Then two such folded into a, b, c, d's sums of the
 * half's lanes. Integer sums, so the order of the adds does not matter. */
static inline TARGET __m256i fold_pairs(__m256i p, __m256i q, const int form) {
    if (form == NARROW)
        return _mm256_madd_epi16(_mm256_add_epi16(_mm256_unpacklo_epi32(p, q), _mm256_unpackhi_epi32(p, q)),
                                 _mm256_set1_epi16(1));
    return _mm256_add_epi32(_mm256_unpacklo_epi32(p, q), _mm256_unpackhi_epi32(p, q));
}
static inline TARGET __m256i fold_quads(__m256i pq, __m256i rs) {
    return _mm256_add_epi32(_mm256_unpacklo_epi64(pq, rs), _mm256_unpackhi_epi64(pq, rs));
}

/* The blocks' totals as floats, lane k block k, for n = 4, 2 or 1: unpacks and adds (no
 * 256-bit hadd: on Zen 4 it holds a shuffle unit two cycles), then cvtdq2ps, which rounds
 * as (float) does. */
static inline __attribute__((always_inline)) TARGET __m128 block_totals(const __m256i *v, const int n, const int form) {
    if (n == 4) {
        const __m256i a = fold_quads(fold_pairs(v[0], v[1], form), fold_pairs(v[2], v[3], form));
        return _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1)));
    }
    if (n == 2) {
        const __m256i a = fold_pairs(v[0], v[1], form);
        const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        return _mm_cvtepi32_ps(_mm_add_epi32(h, _mm_unpackhi_epi64(h, h)));
    }
    const __m256i w = form == NARROW ? _mm256_madd_epi16(v[0], _mm256_set1_epi16(1)) : v[0];
    return _mm_cvtepi32_ps(sum_lanes(w));
}

/* Lane k of a register of 4 floats, k a constant. */
static inline __attribute__((always_inline)) TARGET float lane_f32(__m128 v, const int k) {
    return k == 0 ? _mm_cvtss_f32(v) : k == 1 ? _mm_cvtss_f32(_mm_movehdup_ps(v))
         : k == 2 ? _mm_cvtss_f32(_mm_movehl_ps(v, v)) : _mm_cvtss_f32(_mm_shuffle_ps(v, v, 3));
}

/* n (4, 2 or 1) consecutive blocks, xb and yb bytes each, from x and y: their integer sums
 * and scale products, then their block steps in order on the row's chain `sum`. The
 * scales come first, so that they are ready when the steps are, which wait for all n
 * blocks' integers. With `off` (Q4_1, Q5_1), `scales` is not used: each block's leading
 * halves, d and m times Q8_1's d and s, give both the scale product (lane 0 of their
 * product) and the step of the offset chain fmaf(m, s, off) in lane 1 of *off (whose
 * lane 0 collects d * dy, of no use); read with the steps, from memory straight into a
 * vector register, they are ready in time, and hold no registers while the integers are
 * formed (in AVX2's sixteen, GCC then kept the chains in memory). The group's lines are
 * asked for once (prefetch_ahead), not once a block: several small blocks share a line. */
static inline __attribute__((always_inline)) TARGET float block_steps(float sum, __m128 *off, const uint8_t *x,
                                                                      size_t xb, const uint8_t *y, size_t yb,
                                                                      const int n, block_ints_fn ints, const int form,
                                                                      block_scales_fn scales, const void *stop) {
    __m256i v[4];
    prefetch_ahead(x, n * (int)xb, stop);
    const __m128 d = off ? _mm_setzero_ps() : scales(x, xb, y, yb, n);
    for (int k = 0; k < n; k++)
        v[k] = ints(x + k * xb, y + k * yb);
    const __m128 t = block_totals(v, n, form);
    for (int k = 0; k < n; k++) {
        if (off) {
            const __m128 xs = h2f_pair((const uint16_t *)(x + k * xb)), ys = h2f_pair((const uint16_t *)(y + k * yb));
            *off = _mm_fmadd_ps(xs, ys, *off);
            sum = __builtin_fmaf(lane_f32(t, k), _mm_cvtss_f32(_mm_mul_ps(xs, ys)), sum);
        } else {
            sum = __builtin_fmaf(lane_f32(t, k), lane_f32(d, k), sum);
        }
    }
    return sum;
}

/* A row of nb blocks: the definition's `sum` chain (and Q4_1/Q5_1's offset chain in lane
 * 1 of *off, as block_steps), `group` (4 or 1) blocks at a time, then two, then one.
 * Small groups: a group's first step waits for all its integers and their reduction, and
 * at the start of a row the chain has nothing else to do. The blocks of 32 go four at a
 * time (eight took longer on SmolLM2's rows), the K types' of 256 one at a time (two
 * took longer on 11008-wide rows, and spill AVX2's sixteen registers). */
static inline __attribute__((always_inline)) TARGET float row_steps(const void *row, size_t xb, const void *xq,
                                                                    size_t yb, int64_t nb, const int group,
                                                                    block_ints_fn ints, const int form,
                                                                    block_scales_fn scales, __m128 *off,
                                                                    const void *stop) {
    const uint8_t *x = row, *y = xq;
    float sum = 0.0f;
    int64_t i = 0;
    if (group > 1)
        for (; i + group <= nb; i += group)
            sum = block_steps(sum, off, x + i * xb, xb, y + i * yb, yb, group, ints, form, scales, stop);
    if (group > 2 && i + 2 <= nb) {
        sum = block_steps(sum, off, x + i * xb, xb, y + i * yb, yb, 2, ints, form, scales, stop);
        i += 2;
    }
    for (; i < nb; i++)
        sum = block_steps(sum, off, x + i * xb, xb, y + i * yb, yb, 1, ints, form, scales, stop);
    return sum;
}

/* The f16 at p + k * stride for k < n (n = 4, 2 or 1), in halves 0..n-1 of a register; the
 * other halves 0. One 16-bit load each, nothing read beside them; the halves are put
 * together in a general register, on the integer units, which the vector work leaves
 * idle (pinsrw would take a shuffle unit each: Q8_0's rows went 5-7% slower). */
static inline __attribute__((always_inline)) TARGET __m128i f16_column(const uint8_t *p, size_t stride, const int n) {
    uint64_t w = 0;
    for (int k = 0; k < n; k++) {
        uint16_t h;
        memcpy(&h, p + k * stride, 2);
        w |= (uint64_t)h << (16 * k);
    }
    return _mm_cvtsi64_si128((long long)w);
}

/* The scale products of K blocks, whose f16 d is `at` bytes into each block, with Q8_K
 * activations, whose d is a float: each product one float multiply of an exactly widened
 * half and a float, n at once. */
static inline __attribute__((always_inline)) TARGET __m128 scales_f16_f32(const uint8_t *x, size_t at, size_t xb,
                                                                          const uint8_t *y, size_t yb, const int n) {
    float a[4];
    for (int k = 0; k < n; k++)
        memcpy(&a[k], y + k * yb, 4);
    const __m128 da = n == 4   ? _mm_setr_ps(a[0], a[1], a[2], a[3])
                      : n == 2 ? _mm_setr_ps(a[0], a[1], 0, 0)
                               : _mm_set_ss(a[0]);
    return _mm_mul_ps(_mm_cvtph_ps(f16_column(x + at, xb, n)), da);
}

/* ---------------------------------------------------------------------------
 * 32-element blocks with Q8_0 / Q8_1 activations
 * ------------------------------------------------------------------------- */

/* Every 32-element block, weights and activations alike, starts with its f16 d: the
 * scale products are one float multiply of two exactly widened halves, n at once. */
static inline TARGET __m128 scales_32(const uint8_t *x, size_t xb, const uint8_t *y, size_t yb, int n) {
    return _mm_mul_ps(_mm_cvtph_ps(f16_column(x, xb, n)), _mm_cvtph_ps(f16_column(y, yb, n)));
}

/* The 32 byte codes `at` bytes into a block. */
static inline TARGET __m256i codes32(const void *block, size_t at) {
    return _mm256_loadu_si256((const __m256i *)((const uint8_t *)block + at));
}

/* Q8_0: signed times signed, through the signs (dot_ss8). */
static inline TARGET __m256i ints_q8_0(const void *x, const void *y) {
    const __m256i qx = codes32(x, offsetof(block_q8_0, qs)), qy = codes32(y, offsetof(block_q8_0, qs));
    return dot_ss8(qx, qy);
}

TARGET float sq_vec_dot_q8_0_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    return row_steps(row, sizeof(block_q8_0), xq, sizeof(block_q8_0), nb, 4, ints_q8_0, WIDE, scales_32, NULL, stop);
}

/* Q4_0: the codes q - 8. */
static inline TARGET __m256i ints_q4_0(const void *x, const void *y) {
    const __m256i qy = codes32(y, offsetof(block_q8_0, qs));
    return dot_offset(nibbles32(((const block_q4_0 *)x)->qs), _mm256_set1_epi8(8), qy);
}

TARGET float sq_vec_dot_q4_0_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    return row_steps(row, sizeof(block_q4_0), xq, sizeof(block_q8_0), nb, 4, ints_q4_0, NARROW, scales_32, NULL,
                     stop);
}

/* IQ4_NL: the 16 grid values, looked up 32 codes at a time with a byte shuffle. */
static inline TARGET __m256i ints_iq4_nl(const void *x, const void *y) {
    const __m256i qy = codes32(y, offsetof(block_q8_0, qs));
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(SQ_IQ4_GRID));
    const __m256i q = nibbles32(((const block_iq4_nl *)x)->qs);
    return dot_ss8(_mm256_shuffle_epi8(lut, q), qy);
}

TARGET float sq_vec_dot_iq4_nl_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    return row_steps(row, sizeof(block_iq4_nl), xq, sizeof(block_q8_0), nb, 4, ints_iq4_nl, WIDE, scales_32, NULL,
                     stop);
}

/* Q4_1: the unsigned codes; m * s goes to the offset chain. maddubs's pair sums are at
 * most 2 * 15 * 127, folded two to an int16 lane 7620. */
static inline TARGET __m256i ints_q4_1(const void *x, const void *y) {
    const __m256i qy = codes32(y, offsetof(block_q8_1, qs));
    return _mm256_maddubs_epi16(nibbles32(((const block_q4_1 *)x)->qs), qy);
}

TARGET float sq_vec_dot_q4_1_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    __m128 off = _mm_setzero_ps();
    const float sum = row_steps(row, sizeof(block_q4_1), xq, sizeof(block_q8_1), nb, 4, ints_q4_1, NARROW, NULL,
                                &off, stop);
    return sum + _mm_cvtss_f32(_mm_movehdup_ps(off));
}

/* Bit 4 of the 32 codes of a Q5_0/Q5_1 block as bytes 0x10 or 0: byte j copies
 * byte j / 8 of qh (bit j of the little-endian word is element j's) and keeps
 * bit j % 8. The element order is nibbles32's. */
static inline TARGET __m256i q5_bit4(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

/* Q5_0: the codes q - 16. */
static inline TARGET __m256i ints_q5_0(const void *x, const void *y) {
    const block_q5_0 *b = x;
    return dot_offset(_mm256_or_si256(nibbles32(b->qs), q5_bit4(b->qh)), _mm256_set1_epi8(16),
                      codes32(y, offsetof(block_q8_0, qs)));
}

TARGET float sq_vec_dot_q5_0_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    return row_steps(row, sizeof(block_q5_0), xq, sizeof(block_q8_0), nb, 4, ints_q5_0, NARROW, scales_32, NULL,
                     stop);
}

/* Q5_1: as Q4_1 with 5-bit codes: pair sums at most 2 * 31 * 127, two 15748. */
static inline TARGET __m256i ints_q5_1(const void *x, const void *y) {
    const block_q5_1 *b = x;
    const __m256i q = _mm256_or_si256(nibbles32(b->qs), q5_bit4(b->qh)), qy = codes32(y, offsetof(block_q8_1, qs));
    return _mm256_maddubs_epi16(q, qy);
}

TARGET float sq_vec_dot_q5_1_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    __m128 off = _mm_setzero_ps();
    const float sum = row_steps(row, sizeof(block_q5_1), xq, sizeof(block_q8_1), nb, 4, ints_q5_1, NARROW, NULL,
                                &off, stop);
    return sum + _mm_cvtss_f32(_mm_movehdup_ps(off));
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

/* Types with mins (Q2_K, Q4_K, Q5_K) run both chains of the definition in lanes 0 (sum)
 * and 1 (off) of one register: a block's two totals come out of one reduction, in lanes
 * 0 and 1 (S the sum of s's 8 lanes, M of m's 4), and one FMA by (d * dy, dmin * dy)
 * steps both. The row's result is lane 0 minus lane 1. */
static inline TARGET __m128 sum_min_step(__m128 acc, __m256i s, __m128i m, const uint16_t *d_dmin, float dy) {
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    const __m128i h = _mm_hadd_epi32(s4, m);
    const __m128i totals = _mm_hadd_epi32(h, h); /* S, M, S, M; exact, so any order of adds */
    return _mm_fmadd_ps(_mm_cvtepi32_ps(totals), _mm_mul_ps(h2f_pair(d_dmin), _mm_set1_ps(dy)), acc);
}

static inline TARGET float sum_minus_off(__m128 acc) {
    return _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc));
}

/* Q4_K's min terms mn[g] * (bsums[2g] + bsums[2g+1]) in 4 int32 lanes, from the mins in
 * bytes 8..15 of sc_mn (k_scales_mins). A pair of bsums is at most 2 * 16 * 128 in int16. */
static inline TARGET __m128i k_min_terms(__m128i sc_mn, const int16_t *bsums) {
    const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sc_mn, sc_mn));
    const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                      _mm_loadu_si128((const __m128i *)(bsums + 8)));
    return _mm_madd_epi16(mins, bs);
}

/* Q4_K: the group scales stay in a register and are spread over the codes with byte
 * shuffles; 32 bytes of qs serve groups 2c (low nibbles) and 2c+1 (high). A block's two
 * totals, then the two steps, as the definition has them (this kernel already did). */
TARGET float sq_vec_dot_q4_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q4_K *x = row;
    const block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128i sc_mn = k_scales_mins(x[i].scales);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc_mn)); /* int16 sc[g] */
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
        acc = sum_min_step(acc, sumi, k_min_terms(sc_mn, y[i].bsums), &x[i].d, y[i].d);
    }
    return sum_minus_off(acc);
}

/* Q5_K: the codes as Q4_K's plus bit 2c (even group) or 2c+1 (odd) of qh[l] as
 * bit 4; codes 0..31 keep the maddubs pair sums below 2 * 31 * 128. */
TARGET float sq_vec_dot_q5_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q5_K *x = row;
    const block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128i sc_mn = k_scales_mins(x[i].scales);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc_mn)); /* int16 sc[g] */
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
        acc = sum_min_step(acc, sumi, k_min_terms(sc_mn, y[i].bsums), &x[i].d, y[i].d);
    }
    return sum_minus_off(acc);
}

/* Q2_K, Q3_K and Q6_K: every group of 16 lies in one 128-bit half of a register of 32
 * codes, so its scale is one int16 broadcast over that half. */
static inline TARGET __m256i scale_halves(int lo, int hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)lo)), _mm_set1_epi16((short)hi), 1);
}

/* The 16 byte scales of a block (int8, group order) as int16, even groups' in the low 128
 * bits and odd groups' in the high: the pair of groups g and g+1 that a register of 32
 * codes holds, one per half, is then one byte shuffle away (broadcast_word(sc_pairs, g / 2)),
 * where scale_halves would take two broadcasts and an insert. */
static inline TARGET __m256i scale_pairs(__m128i sc8) {
    const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
}

/* Q2_K: imin = mn[g] * bsums[g] over the 16 groups, folded to 4 lanes; the scales (low
 * nibbles) spread over the codes as Q6_K's. */
TARGET float sq_vec_dot_q2_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    const block_q2_K *x = row;
    const block_q8_K *y = xq;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x, stop);
        const __m128i packed = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i sc_pairs = scale_pairs(_mm_and_si128(packed, _mm_set1_epi8(0x0f)));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0f)));
        const __m256i pm = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums));
        const __m128i imin = _mm_add_epi32(_mm256_castsi256_si128(pm), _mm256_extracti128_si256(pm, 1));

        /* 32 bytes of qs per half h: bits 2c..2c+1 are elements 32c..32c+31 of it,
         * groups 8h + 2c (bytes 0..15) and 8h + 2c + 1 (16..31). */
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int c = 0; c < 4; c++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * c), m3);
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * c));
                sumi = madd_add(sumi, broadcast_word(sc_pairs, 4 * h + c), _mm256_maddubs_epi16(q, qy));
            }
        }
        acc = sum_min_step(acc, sumi, imin, &x[i].d, y[i].d);
    }
    return sum_minus_off(acc);
}

/* The K types with one chain (Q3_K, Q6_K, IQ4_XS) go through row_steps, a block at a
 * time. */

/* Q3_K's 16 group scales, sc - 32, as bytes in group order, from their 12 packed bytes
 * (blocks.h's sq_q3_K_scale gives them one at a time): low 4 bits from the nibbles of
 * words 0 and 1, high 2 bits from word 2, four groups a word. The 12 bytes are read as
 * the block's last 16 (two bytes of qs before them, d after), nothing past the block. */
static inline TARGET __m128i q3_K_scales(const block_q3_K *x) {
    const uint8_t *p = (const uint8_t *)x + offsetof(block_q3_K, scales) - 2;
    const __m128i v = _mm_srli_si128(_mm_loadu_si128((const __m128i *)p), 2);
    const __m128i w01 = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 1, 0)); /* words 0 1 0 1 */
    const __m128i w2 = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(w01, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(w2, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi32(hi, 4)), _mm_set1_epi8(32));
}

/* Q3_K: the codes q = low2 + 4 * hbit - 4 multiply the activations as q + 4 (0..7,
 * unsigned: pair sums at most 2 * 7 * 127), and 4 * sum(sc * bsum) comes off, which
 * leaves the block's sum(sc * q * qy) exact. The low bits are laid out as in Q2_K; the
 * high bit of element 32c + b of half h is bit 4h + c of hmask[b], shifted to bit 2.
 * The two halves in two sums, so that each chain of adds waits on half the work. */
static inline TARGET __m256i ints_q3_K(const void *xv, const void *yv) {
    const block_q3_K *x = xv;
    const block_q8_K *y = yv;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    const __m128i sc8 = q3_K_scales(x);
    const __m256i sc_pairs = scale_pairs(sc8);
    const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
    const __m256i hbits = _mm256_loadu_si256((const __m256i *)x->hmask);
    __m256i acc[2];
    const __m256i sc_bsums = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bsums);
    acc[0] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc_bsums, 2));
    acc[1] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        __m256i sumi = acc[h];
        for (int c = 0; c < 4; c++) {
            const int b = 4 * h + c; /* the high bit's position, to go to bit 2 */
            const __m256i hb = b >= 2 ? _mm256_srli_epi16(hbits, b - 2) : _mm256_slli_epi16(hbits, 2 - b);
            const __m256i low2 = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * c), m3);
            const __m256i q = _mm256_or_si256(low2, _mm256_and_si256(hb, m4));
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * c));
            sumi = madd_add(sumi, broadcast_word(sc_pairs, 4 * h + c), _mm256_maddubs_epi16(q, qy));
        }
        acc[h] = sumi;
    }
    return _mm256_add_epi32(acc[0], acc[1]);
}

static inline TARGET __m128 scales_q3_K(const uint8_t *x, size_t xb, const uint8_t *y, size_t yb, int n) {
    return scales_f16_f32(x, offsetof(block_q3_K, d), xb, y, yb, n);
}

TARGET float sq_vec_dot_q3_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    return row_steps(row, sizeof(block_q3_K), xq, sizeof(block_q8_K), nb, 1, ints_q3_K, WIDE, scales_q3_K, NULL, stop);
}

/* Q6_K: the codes q (0..63) multiply the activations unsigned, pair sums at most
 * 2 * 63 * 127; the -32 offset comes off as 32 * (sc * bsum) lanes, which leaves the
 * block's integer sum(sc * (q - 32) * qy) exact. The high bits go to bits 4-5 with 16-bit
 * shifts and one mask (what crosses a byte is masked off). The two halves in two sums, as
 * Q3_K's. */
static inline TARGET __m256i ints_q6_K(const void *xv, const void *yv) {
    const block_q6_K *x = xv;
    const block_q8_K *y = yv;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8), sc_pairs = scale_pairs(sc8);
    const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
    __m256i acc[2];
    acc[0] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5));
    acc[1] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i sumi = acc[h];
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        const int8_t *q8 = y->qs + 128 * h;
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
        const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
        /* Elements 0..31, 32..63, 64..95, 96..127 of the half (order of decode_q6_K). */
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), _mm256_and_si256(hb, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        for (int c = 0; c < 4; c++) {
            const int g = 8 * h + 2 * c; /* groups g (bytes 0..15) and g+1 (16..31) */
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(q8 + 32 * c));
            sumi = madd_add(sumi, broadcast_word(sc_pairs, g / 2), _mm256_maddubs_epi16(q[c], qy));
        }
        acc[h] = sumi;
    }
    return _mm256_add_epi32(acc[0], acc[1]);
}

static inline TARGET __m128 scales_q6_K(const uint8_t *x, size_t xb, const uint8_t *y, size_t yb, int n) {
    return scales_f16_f32(x, offsetof(block_q6_K, d), xb, y, yb, n);
}

TARGET float sq_vec_dot_q6_K_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    return row_steps(row, sizeof(block_q6_K), xq, sizeof(block_q8_K), nb, 1, ints_q6_K, WIDE, scales_q6_K, NULL, stop);
}

/* IQ4_XS: the grid (quants/blocks.h) is looked up 16 codes at a time with a byte
 * shuffle, in each 128-bit half. Every group's int16 pair sums are multiplied by its
 * scale s - 32 in the widening madd, and the 8 groups summed in int32 lanes: the block's
 * isum. */
static const int8_t iq4_grid[16] = { SQ_IQ4_GRID };

static inline TARGET __m256i ints_iq4_xs(const void *xv, const void *yv) {
    const block_iq4_xs *x = xv;
    const block_q8_K *y = yv;
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid));
    __m256i sumi = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++) {
        const int s = sq_iq4_xs_scale(x, g);
        const __m256i w = _mm256_shuffle_epi8(grid, nibbles32(x->qs + 16 * g));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * g));
        const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(qy, w));
        sumi = madd_add(sumi, p16, _mm256_set1_epi16((short)(s - 32)));
    }
    return sumi;
}

static inline TARGET __m128 scales_iq4_xs(const uint8_t *x, size_t xb, const uint8_t *y, size_t yb, int n) {
    return scales_f16_f32(x, offsetof(block_iq4_xs, d), xb, y, yb, n);
}

TARGET float sq_vec_dot_iq4_xs_avx2(const void *row, const void *xq, int64_t nb, const void *stop) {
    return row_steps(row, sizeof(block_iq4_xs), xq, sizeof(block_q8_K), nb, 1, ints_iq4_xs, WIDE, scales_iq4_xs, NULL,
                     stop);
}

#endif
