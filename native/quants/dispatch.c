/* quants/dispatch.c: which copy of the dot products runs, and the dot products with
 * converted activations that the ABI offers (sq_vec_dot and its batched and many-row
 * forms).
 *
 * The AVX2/FMA or AVX-512 VNNI (quants/x86/, x86-64) or NEON (quants/arm/, AArch64)
 * versions of the vec_dot functions take the place of the table's entries while
 * enabled; every copy gives the scalar ones' bits (quants/types.h). The setting is
 * made on first use (CPU support, and SMOLQ_SIMD: "0" for scalar, "avx2" to keep to
 * AVX2 on a VNNI CPU) and then only changed by sq_set_simd; it is one atomic int, read
 * relaxed on every call.
 */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quants/kernels.h"

/* ---------------------------------------------------------------------------
 * The SIMD copies
 * ------------------------------------------------------------------------- */

/* The setting: which copy of the vec_dots is in use. The batched products, attention
 * and the rest have one SIMD version, used at SIMD_BASE and SIMD_VNNI alike, except a
 * prefill's Q4_K and Q6_K products and its attention, which take 512-bit registers at
 * SIMD_VNNI (sq_simd_512). */
enum { SIMD_OFF, SIMD_BASE, SIMD_VNNI, SIMD_LEVELS };

#if defined(SQ_X86)
#define SIMD(fn) sq_##fn##_avx2
static const char *const simd_names[SIMD_LEVELS] = {"scalar", "avx2", "avx512vnni"};
#elif defined(SQ_NEON)
#define SIMD(fn) sq_##fn##_neon
static const char *const simd_names[SIMD_LEVELS] = {"scalar", "neon", "neon"};
#endif

#ifdef SIMD
#define HAVE_SIMD 1
/* One SIMD copy's vec_dots, a row per type of quants/types.h's SQ_QUANT_TYPES. */
#define VEC_DOT_ENTRY(simd, NAME, name, ...) [SQ_##NAME] = sq_vec_dot_##name##_##simd,
#define VEC_DOTS(simd) { SQ_QUANT_TYPES(VEC_DOT_ENTRY, simd) }
/* By setting, then type: all NULL at SIMD_OFF. */
static const sq_simd_vec_dot_fn simd_vec_dot[SIMD_LEVELS][SQ_TYPE_SLOTS] = {
#if defined(SQ_X86)
    [SIMD_BASE] = VEC_DOTS(avx2), [SIMD_VNNI] = VEC_DOTS(avx512vnni),
#else
    [SIMD_BASE] = VEC_DOTS(neon),
#endif
};

/* One row times a whole batch (sq_vec_dot_batch), each output sq_vec_dot's. On x86-64
 * Q4_K's takes tokens four at a time (BATCH_TOKENS_BY); NEON's take any count. */
static const sq_batch_fn simd_batch[SQ_TYPE_SLOTS] = {
    [SQ_Q4_K] = SIMD(batch_dot_q4_K), [SQ_Q6_K] = SIMD(batch_dot_q6_K),
};
#endif

/* On x86-64, batches of fewer than BATCH_MIN_TOKENS tokens (a lookup draft's check) take
 * the kernels that keep each token's sums in registers (dotn, steps_dot8/16); larger ones
 * (a prompt) the tiled batch kernels of Q4_K and Q6_K, which decode a block once for many
 * tokens. NEON has only the batch kernels, which decode a block once for up to 32 tokens,
 * four to a register: from two tokens on they beat a vec_dot per token. Every kernel gives
 * every output sq_vec_dot's bits: the choice is speed alone. */
#if defined(SQ_NEON)
enum { BATCH_MIN_TOKENS = 2, BATCH_TOKENS_BY = 1 };
#else
enum { BATCH_MIN_TOKENS = 8, BATCH_TOKENS_BY = 4 };
#endif

#ifdef SQ_X86
/* Up to SQ_DOTN_MAX activation rows at a time, each with the one-row function's bits;
 * by setting, then type, as simd_vec_dot. */
#define VEC_DOTNS(simd) \
    { [SQ_Q4_1] = sq_vec_dotn_q4_1_##simd, [SQ_Q8_0] = sq_vec_dotn_q8_0_##simd, [SQ_Q6_K] = sq_vec_dotn_q6_K_##simd }
static const sq_vec_dotn_fn simd_vec_dotn[SIMD_LEVELS][SQ_TYPE_SLOTS] = {
    [SIMD_BASE] = VEC_DOTNS(avx2), [SIMD_VNNI] = VEC_DOTNS(avx512vnni),
};

/* Eight rows side by side, every token with the one-token vec_dot's bits. */
typedef void (*steps_dot8_fn)(const void *rows, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                              int64_t nb, const void *stop, float *y, int64_t ldy);
static const steps_dot8_fn simd_steps_dot8[SIMD_LEVELS][SQ_TYPE_SLOTS] = {
    [SIMD_BASE] = {[SQ_Q4_K] = sq_steps_dot8_q4_K_avx2, [SQ_Q4_1] = sq_steps_dot8_q4_1_avx2},
    [SIMD_VNNI] = {[SQ_Q4_K] = sq_steps_dot8_q4_K_avx512vnni, [SQ_Q4_1] = sq_steps_dot8_q4_1_avx512vnni,
                   [SQ_Q8_0] = sq_steps_dot8_q8_0_avx512vnni},
};

/* Sixteen rows side by side in 512-bit registers, same contract (the VNNI copy only). */
static const steps_dot8_fn steps_dot16[SQ_TYPE_SLOTS] = {
    [SQ_Q4_K] = sq_steps_dot16_q4_K_avx512vnni, [SQ_Q4_1] = sq_steps_dot16_q4_1_avx512vnni,
    [SQ_Q8_0] = sq_steps_dot16_q8_0_avx512vnni, [SQ_Q6_K] = sq_steps_dot16_q6_K_avx512vnni,
    [SQ_Q5_K] = sq_steps_dot16_q5_K_avx512vnni,
    [SQ_IQ4_XS] = sq_steps_dot16_iq4_xs_avx512vnni,
    [SQ_Q3_K] = sq_steps_dot16_q3_K_avx512vnni,
    [SQ_Q2_K] = sq_steps_dot16_q2_K_avx512vnni,
};

/* A group of sixteen rows packed side by side (quants/rows16.c), same contract. */
static const steps_dot8_fn packed_dot16[SQ_TYPE_SLOTS] = {
    [SQ_Q4_1] = sq_packed_dot16_q4_1_avx512vnni, [SQ_Q8_0] = sq_packed_dot16_q8_0_avx512vnni,
    [SQ_Q4_K] = sq_packed_dot16_q4_K_avx512vnni, [SQ_Q6_K] = sq_packed_dot16_q6_K_avx512vnni,
};

static int simd_level(void);

/* simd_vec_dotn's function for the type at the setting in use (NULL with the SIMD copies off). */
static sq_vec_dotn_fn vec_dotn(int type) { return simd_vec_dotn[simd_level()][type]; }

/* Tokens t0..n_tokens-1 of one row through dotn, SQ_DOTN_MAX at a time: y[t * ldy]. */
static void dotn_tokens(sq_vec_dotn_fn dotn, const void *row, const void *xq, int64_t xq_stride, int t0,
                        int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    float out[SQ_DOTN_MAX];
    for (int t = t0; t < n_tokens; t += SQ_DOTN_MAX) {
        const int n = n_tokens - t < SQ_DOTN_MAX ? n_tokens - t : SQ_DOTN_MAX;
        /* Only the first pass reads the row from memory. */
        dotn(row, (const uint8_t *)xq + t * xq_stride, xq_stride, n, nb, t == t0 ? stop : row, out);
        for (int j = 0; j < n; j++)
            y[(t + j) * ldy] = out[j];
    }
}
#endif

/* ---------------------------------------------------------------------------
 * The setting
 * ------------------------------------------------------------------------- */

/* Whether the CPU runs the base SIMD copy, and the VNNI one (simd.h's checks). */
static int simd_supported(void) {
#if defined(SQ_X86)
    return sq_cpu_has_avx2();
#elif defined(SQ_NEON)
    return 1;
#else
    return 0;
#endif
}

static int vnni_supported(void) {
#if defined(SQ_X86)
    return sq_cpu_has_avx512vnni();
#else
    return 0;
#endif
}

/* The best copy this CPU runs, no further than AVX2 if SMOLQ_SIMD says "avx2". */
static int simd_best(void) {
    if (!simd_supported())
        return SIMD_OFF;
    const char *env = getenv("SMOLQ_SIMD");
    if (vnni_supported() && !(env && strcmp(env, "avx2") == 0))
        return SIMD_VNNI;
    return SIMD_BASE;
}

static atomic_int simd_state = -1; /* -1 until first use, then SIMD_OFF, SIMD_BASE or SIMD_VNNI */

static int simd_level(void) {
    int s = atomic_load_explicit(&simd_state, memory_order_relaxed);
    if (s >= 0)
        return s;
    const char *env = getenv("SMOLQ_SIMD");
    int want = env && strcmp(env, "0") == 0 ? SIMD_OFF : simd_best();
    /* Racing first uses compute the same value; an sq_set_simd in between wins. */
    int expected = -1;
    if (!atomic_compare_exchange_strong(&simd_state, &expected, want))
        return expected;
    return want;
}

int sq_simd_enabled(void) { return simd_level() != SIMD_OFF; }

int sq_simd_512(void) { return simd_level() == SIMD_VNNI; }

const char *sq_simd_name(void) {
#ifdef HAVE_SIMD
    return simd_names[simd_level()];
#else
    return "scalar";
#endif
}

int sq_set_simd(int enabled) {
    simd_level(); /* settle the first-use choice, so it cannot overwrite this one */
    return atomic_exchange(&simd_state, enabled != 0 ? simd_best() : SIMD_OFF) != SIMD_OFF;
}

/* ---------------------------------------------------------------------------
 * Dot products with converted activations
 * ------------------------------------------------------------------------- */

float sq_vec_dot(int type, const void *row, const void *xq, int64_t n) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot)
        return NAN;
#ifdef HAVE_SIMD
    const sq_simd_vec_dot_fn simd = simd_vec_dot[simd_level()][type];
    if (simd)
        return simd(row, xq, nb, (const uint8_t *)row + nb * t->bytes);
#endif
    return t->vec_dot(row, xq, nb);
}

int sq_vec_dot_batch(int type, const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t n,
                     float *y, int64_t ldy) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_tokens < 0)
        return -1;
    int i = 0;
#ifdef HAVE_SIMD
    const sq_batch_fn simd = sq_simd_enabled() && n_tokens >= BATCH_MIN_TOKENS ? simd_batch[type] : NULL;
    if (simd) {
        i = type == SQ_Q4_K ? n_tokens - n_tokens % BATCH_TOKENS_BY : n_tokens;
        simd(row, xq, xq_stride, i, nb, y, ldy);
    }
#endif
#ifdef SQ_X86
    /* The rest: several at a time where the type has a dotn. */
    const sq_vec_dotn_fn dotn = vec_dotn(type);
    if (dotn && n_tokens - i > 1) {
        dotn_tokens(dotn, row, xq, xq_stride, i, n_tokens, nb, (const uint8_t *)row + nb * t->bytes, y, ldy);
        return 0;
    }
#endif
    for (; i < n_tokens; i++)
        y[i * ldy] = sq_vec_dot(type, row, (const uint8_t *)xq + i * xq_stride, n);
    return 0;
}

int sq_vec_dot_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq, int64_t n,
                    float *y) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_rows < 0)
        return -1;
    /* The function is chosen once for all rows. (Several rows per pass over xq, tried for
     * Q4_1, Q8_0 (4 rows) and Q4_K (8 rows side by side), made decode slower.) */
    const uint8_t *base = rows;
#ifdef HAVE_SIMD
    const sq_simd_vec_dot_fn one = simd_vec_dot[simd_level()][type];
    if (one && n_rows > 0) {
        const uint8_t *stop = base + (n_rows - 1) * row_bytes + nb * t->bytes; /* the last row's end */
        for (int64_t r = 0; r < n_rows; r++)
            y[r] = one(base + r * row_bytes, xq, nb, stop);
        return 0;
    }
#endif
    for (int64_t r = 0; r < n_rows; r++)
        y[r] = t->vec_dot(base + r * row_bytes, xq, nb);
    return 0;
}

static int steps_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq,
                      int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy);

int sq_vec_dot_batch_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq,
                          int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_rows < 0 || n_tokens < 0)
        return -1;
    /* Small batches, and the types without tiled batch kernels: the step kernels. */
    if (n_tokens < BATCH_MIN_TOKENS || (type != SQ_Q4_K && type != SQ_Q6_K))
        return steps_rows(type, rows, row_bytes, n_rows, xq, xq_stride, n_tokens, n, y, ldy);
    const uint8_t *base = rows;
    int64_t r = 0;
#ifdef SQ_X86
    const uint8_t *stop = base + (n_rows > 0 ? n_rows - 1 : 0) * row_bytes + nb * t->bytes;  /* the last row's end */
    /* (x86-64 only: elsewhere every row takes the loop below, with the same bits.)
     * Q6_K: sixteen rows at a time in 512-bit registers where the CPU has AVX-512 VNNI,
     * else eight. */
    const int wide = sq_simd_512();
    if (type == SQ_Q6_K && sq_simd_enabled()) {
        for (; wide && r + 16 <= n_rows; r += 16)
            sq_batch_dot16_q6_K_avx512vnni(base + r * row_bytes, row_bytes, xq, xq_stride, n_tokens, nb, stop, y + r, ldy);
        for (; r + 8 <= n_rows; r += 8)
            sq_batch_dot8_q6_K_avx2(base + r * row_bytes, row_bytes, xq, xq_stride, n_tokens, nb, stop, y + r, ldy);
    }
    /* Q4_K: its tokens four at a time (all but n_tokens % 4) sixteen or eight rows at a
     * time; the rest of those rows' tokens one by one. */
    const int by4 = n_tokens - n_tokens % BATCH_TOKENS_BY;
    if (type == SQ_Q4_K && by4 && sq_simd_enabled()) {
        for (int step; r + 8 <= n_rows; r += step) {
            step = wide && r + 16 <= n_rows ? 16 : 8;
            if (step == 16)
                sq_batch_dot16_q4_K_avx512vnni(base + r * row_bytes, row_bytes, xq, xq_stride, by4, nb, stop, y + r, ldy);
            else
                sq_batch_dot8_q4_K_avx2(base + r * row_bytes, row_bytes, xq, xq_stride, by4, nb, stop, y + r, ldy);
            for (int k = by4; k < n_tokens; k++)
                for (int j = 0; j < step; j++)
                    y[k * ldy + r + j] = sq_vec_dot(type, base + (r + j) * row_bytes,
                                                    (const uint8_t *)xq + k * xq_stride, n);
        }
    }
#endif
    for (; r < n_rows; r++)
        sq_vec_dot_batch(type, base + r * row_bytes, xq, xq_stride, n_tokens, n, y + r, ldy);
    return 0;
}

static int steps_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq,
                      int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_rows < 0 || n_tokens < 0)
        return -1;
    if (n_rows == 0 || n_tokens == 0)
        return 0;
    const uint8_t *base = rows, *stop = base + (n_rows - 1) * row_bytes + nb * t->bytes; /* the last row's end */
    int64_t r = 0;
#ifdef SQ_X86
    /* Q4_K, Q4_1 and, in the VNNI copy, Q8_0: eight rows side by side, each token with its
     * one-token bits; in the VNNI copy sixteen at a time first, and Q6_K's too. */
    const steps_dot8_fn sixteen = n_tokens >= 2 && sq_simd_512() ? steps_dot16[type] : NULL;
    if (sixteen)
        for (; r + 16 <= n_rows; r += 16)
            sixteen(base + r * row_bytes, row_bytes, xq, xq_stride, n_tokens, nb, stop, y + r, ldy);
    const steps_dot8_fn eight = n_tokens >= 2 ? simd_steps_dot8[simd_level()][type] : NULL;
    if (eight)
        for (; r + 8 <= n_rows; r += 8)
            eight(base + r * row_bytes, row_bytes, xq, xq_stride, n_tokens, nb, stop, y + r, ldy);
    /* A row's blocks decoded once for several tokens. */
    const sq_vec_dotn_fn dotn = n_tokens >= 2 ? vec_dotn(type) : NULL;
    if (dotn) {
        for (; r < n_rows; r++)
            dotn_tokens(dotn, base + r * row_bytes, xq, xq_stride, 0, n_tokens, nb, stop, y + r, ldy);
        return 0;
    }
#endif
#ifdef HAVE_SIMD
    const sq_simd_vec_dot_fn one = simd_vec_dot[simd_level()][type];
#endif
    for (; r < n_rows; r++) {
        const uint8_t *row = base + r * row_bytes;
        /* The first token reads the row from memory, prefetching ahead; the rest find it in L1. */
        for (int k = 0; k < n_tokens; k++) {
            const uint8_t *x = (const uint8_t *)xq + k * xq_stride;
#ifdef HAVE_SIMD
            if (one) {
                y[k * ldy + r] = one(row, x, nb, k == 0 ? stop : row);
                continue;
            }
#endif
            y[k * ldy + r] = t->vec_dot(row, x, nb);
        }
    }
    return 0;
}

/* Rows first..first+count-1 of a packed group through a copy in the file's layout: how
 * the settings without a packed kernel read one (scalar, or AVX2 after sq_set_simd), and
 * how a range that starts or ends inside a group reads that group. Slow, same bits. */
static int group_via_copy(int type, const uint8_t *group, int64_t row_bytes, int first, int count, const void *xq,
                          int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy) {
    uint8_t *copy = malloc((size_t)(16 * row_bytes));
    float *out = malloc((size_t)n_tokens * 16 * sizeof(float));
    int status = copy && out ? 0 : -1;
    if (!status)
        status = sq_rows16_unpack(type, group, copy, 16, n);
    if (!status)
        status = sq_vec_dot_batch_rows(type, copy, row_bytes, 16, xq, xq_stride, n_tokens, n, out, 16);
    for (int t = 0; t < n_tokens && !status; t++)
        memcpy(y + t * ldy, out + t * 16 + first, (size_t)count * sizeof(float));
    free(copy);
    free(out);
    return status;
}

#ifdef SQ_X86
/* The types the avx2 setting reads packed, with packed_group8_q4_K: Q4_K alone (its
 * eight-row kernels take fewer multiplies per row than the one-row vec_dot; the other
 * types' as many). */
static int avx2_reads_packed(int type) { return type == SQ_Q4_K; }

/* A whole packed Q4_K group at the avx2 setting: a prompt's tokens four at a time eight
 * rows at a time (the second eight find the group's bytes in cache), the rest, and small
 * batches, all sixteen rows at once. */
static void packed_group8_q4_K(const uint8_t *group, const void *xq, int64_t xq_stride, int n_tokens, int64_t nb,
                               const void *stop, float *y, int64_t ldy) {
    const int by4 = n_tokens < BATCH_MIN_TOKENS ? 0 : n_tokens - n_tokens % BATCH_TOKENS_BY;
    for (int half = 0; by4 && half < 2; half++)
        sq_packed_batch8_q4_K_avx2(group, half, xq, xq_stride, by4, nb, stop, y + 8 * half, ldy);
    if (by4 < n_tokens)
        sq_packed_dotn16_q4_K_avx2(group, (const uint8_t *)xq + by4 * xq_stride, xq_stride, n_tokens - by4, nb,
                                   by4 ? group : stop, y + by4 * ldy, ldy);
}

/* A whole packed group at the avx512vnni setting. A prompt's batch takes the tiled
 * kernels as sq_vec_dot_batch_rows does: Q4_K's for its first n_tokens - n_tokens % 4
 * tokens, Q6_K's for all; everything else the step kernels. */
static void packed_group(int type, const uint8_t *group, int64_t row_bytes, const void *xq, int64_t xq_stride,
                         int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    int t = 0;
    const int tiled = n_tokens >= BATCH_MIN_TOKENS;
    if (type == SQ_Q4_K && tiled && (t = n_tokens - n_tokens % BATCH_TOKENS_BY) > 0)
        sq_packed_batch16_q4_K_avx512vnni(group, row_bytes, xq, xq_stride, t, nb, stop, y, ldy);
    if (type == SQ_Q6_K && tiled)
        sq_packed_batch16_q6_K_avx512vnni(group, row_bytes, xq, xq_stride, t = n_tokens, nb, stop, y, ldy);
    if (t < n_tokens)
        packed_dot16[type](group, row_bytes, (const uint8_t *)xq + t * xq_stride, xq_stride, n_tokens - t, nb, stop,
                           y + t * ldy, ldy);
}
#endif

int sq_rows16_wanted(int type) {
    if (!sq_rows16_packs(type))
        return 0;
#ifdef SQ_X86
    /* The 512-bit kernels read every packable type packed. */
    return sq_simd_512() || (avx2_reads_packed(type) && sq_simd_enabled());
#else
    return 0;
#endif
}

int sq_vec_dot_rows16(int type, const void *data, int64_t r0, int64_t r1, const void *xq, int64_t xq_stride,
                      int n_tokens, int64_t n, float *y, int64_t ldy) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !sq_rows16_packs(type) || r0 < 0 || r1 < r0 || n_tokens < 1)
        return -1;
    if (r0 == r1)
        return 0;
    const int64_t row_bytes = nb * t->bytes;
    const uint8_t *base = data;
#ifdef SQ_X86
    const int wide = sq_simd_512();
    const uint8_t *stop = base + (r1 + 15) / 16 * 16 * row_bytes;  /* past the last group read */
#endif
    int status = 0;
    for (int64_t g = r0 / 16 * 16; g < r1 && !status; g += 16) {
        const int64_t first = g > r0 ? g : r0, end = g + 16 < r1 ? g + 16 : r1;  /* this group's rows asked for */
        float *out = y + (first - r0);
#ifdef SQ_X86
        if (wide && first == g && end == g + 16) {
            packed_group(type, base + g * row_bytes, row_bytes, xq, xq_stride, n_tokens, nb, stop, out, ldy);
            continue;
        }
        if (!wide && avx2_reads_packed(type) && sq_simd_enabled() && first == g && end == g + 16) {
            packed_group8_q4_K(base + g * row_bytes, xq, xq_stride, n_tokens, nb, stop, out, ldy);
            continue;
        }
#endif
        status = group_via_copy(type, base + g * row_bytes, row_bytes, (int)(first - g), (int)(end - first), xq,
                                xq_stride, n_tokens, n, out, ldy);
    }
    return status;
}
