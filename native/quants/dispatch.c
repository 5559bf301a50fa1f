/* quants/dispatch.c: which kernel runs, and the dot products with converted activations
 * that the ABI offers (sq_vec_dot and its batched and many-row forms).
 *
 * The AVX2/FMA, AVX-512 VNNI or AMX (quants/x86/, x86-64) or NEON (quants/arm/, AArch64)
 * kernels take the place of the type table's scalar vec_dots while enabled. Every one
 * gives the scalar ones' bits (quants/types.h), so the choice among them is speed alone,
 * and one table makes it: a row per setting and type, naming that type's kernels by the
 * rows and tokens each takes at once. The functions that choose read that row alone and
 * name no type. The setting is made on first use (CPU support, and SMOLQ_SIMD: "0" for
 * scalar, "avx2" to keep to AVX2 on a VNNI CPU, "amx" for the AMX tiles where the CPU has
 * them) and then only changed by sq_set_simd; it is one atomic int, read relaxed on every
 * call.
 */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quants/kernels.h"

/* ---------------------------------------------------------------------------
 * The kernels, by setting and type
 * ------------------------------------------------------------------------- */

/* The setting: which kernels are in use. The kernels of the file's layout, attention and
 * the rest have one SIMD version, used at every setting but SIMD_OFF; the packed
 * sixteen-row kernels, and a prefill's attention, take 512-bit registers at SIMD_VNNI and
 * SIMD_AMX (sq_simd_512); SIMD_AMX is SIMD_VNNI with a prompt's packed products through
 * AMX tiles. */
enum { SIMD_OFF, SIMD_BASE, SIMD_VNNI, SIMD_AMX, SIMD_LEVELS };

#if defined(SQ_X86)
static const char *const simd_names[SIMD_LEVELS] = {"scalar", "avx2", "avx512vnni", "amx"};
#elif defined(SQ_NEON)
static const char *const simd_names[SIMD_LEVELS] = {"scalar", "neon", "neon", "neon"};
#endif

/* On x86-64, batches of fewer than BATCH_MIN_TOKENS tokens (a lookup draft's check) take
 * the kernels that keep each token's sums in registers (dotn, steps_dot8/16); larger ones
 * (a prompt) the tiled batch kernels of Q4_K and Q6_K, which decode a block once for many
 * tokens. NEON has only the batch kernels, which decode a block once for up to 32 tokens,
 * four to a register: from two tokens on they beat a vec_dot per token. */
#if defined(SQ_NEON)
enum { BATCH_MIN_TOKENS = 2 };
#else
enum { BATCH_MIN_TOKENS = 8 };
#endif

/* The kernels of one type at one setting, by the rows they take at once (one; eight or
 * sixteen side by side in the file's layout; a group of sixteen packed by quants/rows16.c)
 * and the tokens: `token` one, `few` a few (a lookup draft's check, below
 * BATCH_MIN_TOKENS, and a batch of any size where the type has no prompt kernel),
 * `prompt` a prompt's batch, tiled. NULL where there is none: then fewer rows at a time
 * take those tokens, down to the vec_dot per row and token, or the scalar definition; a
 * packed group without a packed kernel goes through a copy in the file's layout. */
typedef struct {
    sq_rows_fn few, prompt;
} side_by_side;

typedef struct {
    struct {
        sq_simd_vec_dot_fn token;
        sq_vec_dotn_fn few;
        sq_batch_fn prompt;
    } row;
    side_by_side rows8, rows16;
    side_by_side packed;  /* few: from one token on */
    int tokens_by;        /* the prompt kernels take tokens in multiples of this (0: any count) */
    /* 1: after the packed prompt kernel, the few-token one takes the group's last tokens
     * with stop at the group, asking memory for nothing: the group is in cache, as the
     * kernel's own later passes over the tokens find it. */
    int rest_in_cache;
} kernels;

#ifdef SQ_X86
/* avx2's packed Q4_K kernels in the form of the others: a prompt's tokens in tiles, block
 * by block, and a few tokens with their sums in registers. */
static void packed_batch16_q4_K(const void *group, int64_t row_bytes, const void *xq, int64_t stride,
                                int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    (void)row_bytes;
    sq_packed_batch16_q4_K_avx2(group, xq, stride, n_tokens, nb, stop, y, ldy);
}

static void packed_dotn16_q4_K(const void *group, int64_t row_bytes, const void *xq, int64_t stride, int n_tokens,
                               int64_t nb, const void *stop, float *y, int64_t ldy) {
    (void)row_bytes;
    sq_packed_dotn16_q4_K_avx2(group, xq, stride, n_tokens, nb, stop, y, ldy);
}
#endif

/* Every type's vec_dot, from quants/types.h's list: a setting's row.token column. */
#define VEC_DOT(simd, NAME, name, ...) [SQ_##NAME].row.token = sq_vec_dot_##name##_##simd,
/* Every quantized type's packed sixteen rows at VNNI, for a few tokens and a prompt's (Q6_K
 * alone has a prompt kernel of its own): the VNNI row's packed.few column. */
#define PACKED_VNNI(ctx, NAME, name, ...) [SQ_##NAME].packed.few = sq_packed_dot16_##name##_avx512vnni,
/* Every quantized type's packed sixteen rows through AMX tiles, for a prompt's batch: the
 * AMX row's packed.prompt column. */
#define PACKED_AMX(ctx, NAME, name, ...) [SQ_##NAME].packed.prompt = sq_packed_batch16_##name##_amx,
/* Every quantized type's one-row NEON batch: the NEON row's row.prompt column. */
#define PROMPT_NEON(ctx, NAME, name, ...) [SQ_##NAME].row.prompt = sq_batch_dot_##name##_neon,

/* The file's layout at both x86 settings: avx2's kernels. (VNNI copies of the one- and
 * eight-row kernels were no faster on Zen 4, 3B and SmolLM2 decode from the file's layout,
 * and went.) */
#define X86_FILE_LAYOUT                                                                               \
    SQ_QUANT_TYPES(VEC_DOT, avx2)                                                                      \
    SQ_FLOAT_TYPES(VEC_DOT, avx2)                                                                      \
    [SQ_Q4_1].row.few = sq_vec_dotn_q4_1_avx2,                                                         \
    /* Q4_1's sixteen rows at a time from eight tokens on; eight for fewer, and the rows left. */    \
    [SQ_Q4_1].rows8.few = sq_steps_dot8_q4_1_avx2,                                                     \
    [SQ_Q4_1].rows16.prompt = sq_steps_dot16_q4_1_avx2,                                                \
    [SQ_Q8_0].row.few = sq_vec_dotn_q8_0_avx2,                                                         \
    /* Eight rows at a time from two tokens on, dotn the rows left: 1.2x dotn's speed at 2 */        \
    /* tokens, 1.4x at 8, 1.9x at 64. */                                                               \
    [SQ_Q8_0].rows8.few = sq_steps_dot8_q8_0_avx2,                                                     \
    /* Q4_K's prompt kernels take the tokens four at a time; the rest go one by one. */               \
    [SQ_Q4_K].row.prompt = sq_batch_dot_q4_K_avx2,                                                     \
    [SQ_Q4_K].rows8 = {.few = sq_steps_dot8_q4_K_avx2, .prompt = sq_batch_dot8_q4_K_avx2},            \
    [SQ_Q4_K].tokens_by = 4,                                                                           \
    /* Q6_K has no eight-row few-token kernel: dotn takes its rows one at a time. */                  \
    [SQ_Q6_K].row.few = sq_vec_dotn_q6_K_avx2,                                                         \
    [SQ_Q6_K].row.prompt = sq_batch_dot_q6_K_avx2,                                                     \
    [SQ_Q6_K].rows8.prompt = sq_batch_dot8_q6_K_avx2,                                                  \
    /* Eight rows, for a draft's tokens and a prompt's alike. */                                       \
    [SQ_Q5_K].rows8.few = sq_steps_dot8_q5_K_avx2,                                                     \
    [SQ_IQ4_XS].rows8.few = sq_steps_dot8_iq4_xs_avx2,                                                 \
    [SQ_Q3_K].rows8.few = sq_steps_dot8_q3_K_avx2,                                                     \
    [SQ_Q2_K].rows8.few = sq_steps_dot8_q2_K_avx2,                                                     \
    [SQ_Q4_0].rows8.few = sq_steps_dot8_q4_0_avx2,                                                     \
    [SQ_Q5_0].rows8.few = sq_steps_dot8_q5_0_avx2,                                                     \
    [SQ_Q5_1].rows8.few = sq_steps_dot8_q5_1_avx2,                                                     \
    [SQ_IQ4_NL].rows8.few = sq_steps_dot8_iq4_nl_avx2,

/* What the 512-bit settings share: the file's layout as at SIMD_BASE, every quantized type's
 * packed sixteen rows, the float types' sixteen rows in tiles of two rows by four tokens. */
#define X86_512_BITS                                                                                  \
    X86_FILE_LAYOUT                                                                                    \
    SQ_QUANT_TYPES(PACKED_VNNI, _)                                                                     \
    [SQ_F32].rows16.few = sq_steps_dot16_f32_avx512vnni,                                               \
    [SQ_F16].rows16.few = sq_steps_dot16_f16_avx512vnni,                                               \
    [SQ_BF16].rows16.few = sq_steps_dot16_bf16_avx512vnni,

/* By setting, then type: all NULL at SIMD_OFF, and in a build without SIMD code. */
static const kernels kernel_table[SIMD_LEVELS][SQ_TYPE_SLOTS] = {
#if defined(SQ_X86)
    [SIMD_BASE] = {
        X86_FILE_LAYOUT
        /* Read packed at this setting, Q4_K alone: its eight-row kernels take fewer
         * multiplies per row than the one-row vec_dot; the other types' as many. */
        [SQ_Q4_K].packed = {.few = packed_dotn16_q4_K, .prompt = packed_batch16_q4_K},
        [SQ_Q4_K].rest_in_cache = 1,
    },
    /* Every quantized type's packed groups of sixteen rows in 512-bit registers: a packed
     * matrix's every product. A matrix left in the file's layout (SMOLQ_PACK=0, no memory
     * to spare for the packed copy, rows not a multiple of sixteen) takes avx2's kernels;
     * the float types take sixteen rows at a time. */
    [SIMD_VNNI] = {
        X86_512_BITS
        [SQ_Q6_K].packed.prompt = sq_packed_batch16_q6_K_avx512vnni,
    },
#ifdef SQ_AMX
    /* The same, but a prompt's batch (eight tokens on) of every quantized type goes through
     * the AMX tiles. */
    [SIMD_AMX] = {
        X86_512_BITS
        SQ_QUANT_TYPES(PACKED_AMX, _)
    },
#endif
#elif defined(SQ_NEON)
    /* The vec_dots, and one row times a batch of any size. */
    [SIMD_BASE] = {
        SQ_QUANT_TYPES(VEC_DOT, neon)
        SQ_FLOAT_TYPES(VEC_DOT, neon)
        SQ_QUANT_TYPES(PROMPT_NEON, _)
    },
#endif
};

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

static int amx_supported(void) {
#if defined(SQ_AMX)
    return sq_cpu_has_amx();
#else
    return 0;
#endif
}

/* The best copy this CPU runs, no further than AVX2 if SMOLQ_SIMD says "avx2". The AMX
 * tiles only where SMOLQ_SIMD asks for them ("amx"): their kernels give the same bits, but
 * how fast they are has yet to be measured on a CPU that has them. */
static int simd_best(void) {
    if (!simd_supported())
        return SIMD_OFF;
    const char *env = getenv("SMOLQ_SIMD");
    if (vnni_supported() && !(env && strcmp(env, "avx2") == 0))
        return env && strcmp(env, "amx") == 0 && amx_supported() ? SIMD_AMX : SIMD_VNNI;
    return SIMD_BASE;
}

static atomic_int simd_state = -1; /* -1 until first use, then a SIMD_* setting */

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

int sq_simd_512(void) { return simd_level() >= SIMD_VNNI; }

int sq_simd_amx(void) { return simd_level() == SIMD_AMX; }

const char *sq_simd_name(void) {
#if defined(SQ_X86) || defined(SQ_NEON)
    return simd_names[simd_level()];
#else
    return "scalar";
#endif
}

int sq_set_simd(int enabled) {
    simd_level(); /* settle the first-use choice, so it cannot overwrite this one */
    return atomic_exchange(&simd_state, enabled != 0 ? simd_best() : SIMD_OFF) != SIMD_OFF;
}

/* The kernels of type (one of the type table's) at the setting in use. */
static const kernels *kernels_for(int type) { return &kernel_table[simd_level()][type]; }

/* How many of n_tokens a prompt kernel takes: none of a few; of a prompt's batch, the
 * most the kernel takes. */
static int prompt_tokens(const kernels *k, int n_tokens) {
    if (n_tokens < BATCH_MIN_TOKENS)
        return 0;
    return k->tokens_by > 1 ? n_tokens - n_tokens % k->tokens_by : n_tokens;
}

/* ---------------------------------------------------------------------------
 * Dot products with converted activations
 * ------------------------------------------------------------------------- */

float sq_vec_dot(int type, const void *row, const void *xq, int64_t n) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot)
        return NAN;
    const sq_simd_vec_dot_fn one = kernels_for(type)->row.token;
    if (one)
        return one(row, xq, nb, (const uint8_t *)row + nb * t->bytes);
    return t->vec_dot(row, xq, nb);
}

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

int sq_vec_dot_batch(int type, const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t n,
                     float *y, int64_t ldy) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_tokens < 0)
        return -1;
    const kernels *k = kernels_for(type);
    int i = k->row.prompt ? prompt_tokens(k, n_tokens) : 0;
    if (i > 0)
        k->row.prompt(row, xq, xq_stride, i, nb, y, ldy);
    /* The rest: several at a time where the type has a dotn. */
    if (k->row.few && n_tokens - i > 1) {
        dotn_tokens(k->row.few, row, xq, xq_stride, i, n_tokens, nb, (const uint8_t *)row + nb * t->bytes, y, ldy);
        return 0;
    }
    for (; i < n_tokens; i++)
        y[i * ldy] = sq_vec_dot(type, row, (const uint8_t *)xq + i * xq_stride, n);
    return 0;
}

/* The end of the last of n_rows rows (n_rows > 0) of nb blocks each: where a kernel's
 * requests for the bytes ahead stop. */
static const uint8_t *rows_end(const void *rows, int64_t row_bytes, int64_t n_rows, int64_t nb,
                               const sq_type_traits *t) {
    return (const uint8_t *)rows + (n_rows - 1) * row_bytes + nb * t->bytes;
}

/* sq_vec_dot_rows, asking memory ahead for fetch_rows >= n_rows rows. */
static int token_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, int64_t fetch_rows,
                      const void *xq, int64_t n, float *y) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_rows < 0)
        return -1;
    /* The function is chosen once for all rows. (Several rows per pass over xq, tried for
     * Q4_1, Q8_0 (4 rows) and Q4_K (8 rows side by side), made decode slower.) */
    const uint8_t *base = rows;
    const sq_simd_vec_dot_fn one = kernels_for(type)->row.token;
    if (one && n_rows > 0) {
        const uint8_t *stop = rows_end(rows, row_bytes, fetch_rows, nb, t);
        for (int64_t r = 0; r < n_rows; r++)
            y[r] = one(base + r * row_bytes, xq, nb, stop);
        return 0;
    }
    for (int64_t r = 0; r < n_rows; r++)
        y[r] = t->vec_dot(base + r * row_bytes, xq, nb);
    return 0;
}

int sq_vec_dot_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq, int64_t n,
                    float *y) {
    return token_rows(type, rows, row_bytes, n_rows, n_rows, xq, n, y);
}

/* sq_vec_dot_batch_rows's operands: n_rows rows row_bytes apart (stop: where the kernels'
 * requests ahead end) times n_tokens activation rows xq_stride apart, n elements (nb
 * blocks) each, into y[t * ldy + r]. */
typedef struct {
    int type;
    const uint8_t *rows;
    int64_t row_bytes, n_rows;
    const uint8_t *xq;
    int64_t xq_stride;
    int n_tokens;
    int64_t n, nb;
    const uint8_t *stop;
    float *y;
    int64_t ldy;
} product;

/* Rows r.. `size` at a time, while that many are left, through one layout's kernels: a
 * prompt's batch (by > 0) through its prompt kernel, which takes the first by tokens (the
 * rest of those rows' tokens then go one by one), else through its few-token kernel, from
 * two tokens on. The first row left. */
static int64_t rows_side_by_side(const product *p, const side_by_side *l, int size, int by, int64_t r) {
    const int prompt = by > 0 && l->prompt;
    const sq_rows_fn fn = prompt ? l->prompt : p->n_tokens >= 2 ? l->few : NULL;
    const int tokens = prompt ? by : p->n_tokens;
    for (; fn && r + size <= p->n_rows; r += size) {
        const uint8_t *rows = p->rows + r * p->row_bytes;
        fn(rows, p->row_bytes, p->xq, p->xq_stride, tokens, p->nb, p->stop, p->y + r, p->ldy);
        for (int tok = tokens; tok < p->n_tokens; tok++)
            for (int j = 0; j < size; j++)
                p->y[tok * p->ldy + r + j] = sq_vec_dot(p->type, rows + j * p->row_bytes, p->xq + tok * p->xq_stride,
                                                        p->n);
    }
    return r;
}

/* Rows r.. one at a time: a prompt's batch through sq_vec_dot_batch; a few tokens through
 * dotn, a row's blocks decoded once for them all, else a vec_dot per token. */
static void rows_one_by_one(const product *p, const kernels *k, int prompt, int64_t r) {
    const sq_type_traits *t = sq_traits(p->type);
    for (; r < p->n_rows; r++) {
        const uint8_t *row = p->rows + r * p->row_bytes;
        if (prompt) {
            sq_vec_dot_batch(p->type, row, p->xq, p->xq_stride, p->n_tokens, p->n, p->y + r, p->ldy);
            continue;
        }
        if (k->row.few && p->n_tokens >= 2) {
            dotn_tokens(k->row.few, row, p->xq, p->xq_stride, 0, p->n_tokens, p->nb, p->stop, p->y + r, p->ldy);
            continue;
        }
        /* The first token reads the row from memory, prefetching ahead; the rest find it in L1. */
        for (int j = 0; j < p->n_tokens; j++) {
            const uint8_t *x = p->xq + j * p->xq_stride;
            p->y[j * p->ldy + r] = k->row.token ? k->row.token(row, x, p->nb, j == 0 ? p->stop : row)
                                                : t->vec_dot(row, x, p->nb);
        }
    }
}

/* sq_vec_dot_batch_rows, asking memory ahead for fetch_rows >= n_rows rows. */
static int batch_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, int64_t fetch_rows,
                      const void *xq, int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !t->vec_dot || n_rows < 0 || n_tokens < 0)
        return -1;
    if (n_rows == 0 || n_tokens == 0)
        return 0;
    const product p = {type, rows, row_bytes, n_rows, xq, xq_stride, n_tokens, n, nb,
                       rows_end(rows, row_bytes, fetch_rows, nb, t), y, ldy};
    /* A prompt's batch takes the prompt kernels where the type has them; a few tokens, and
     * the types without, the few-token kernels. Sixteen rows at a time, then eight, then one. */
    const kernels *k = kernels_for(type);
    const int has_prompt = k->row.prompt || k->rows8.prompt || k->rows16.prompt;
    const int by = has_prompt ? prompt_tokens(k, n_tokens) : 0;
    int64_t r = rows_side_by_side(&p, &k->rows16, 16, by, 0);
    r = rows_side_by_side(&p, &k->rows8, 8, by, r);
    rows_one_by_one(&p, k, by > 0, r);
    return 0;
}

int sq_vec_dot_batch_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq,
                          int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy) {
    return batch_rows(type, rows, row_bytes, n_rows, n_rows, xq, xq_stride, n_tokens, n, y, ldy);
}

/* Rows first..first+count-1 of a packed group through a copy in the file's layout: how
 * a setting without a packed kernel for the type reads one (scalar, or avx2 after
 * sq_set_simd for all but Q4_K), and how a range that starts or ends inside a group reads
 * that group. Slow, same bits. */
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

/* A whole packed group: a prompt's batch through the prompt kernel where the type has
 * one, as many tokens as it takes; the rest, and a few tokens, through the few-token one. */
static void packed_group(const kernels *k, const uint8_t *group, int64_t row_bytes, const void *xq,
                         int64_t xq_stride, int n_tokens, int64_t nb, const void *stop, float *y, int64_t ldy) {
    const int t = k->packed.prompt ? prompt_tokens(k, n_tokens) : 0;
    if (t > 0)
        k->packed.prompt(group, row_bytes, xq, xq_stride, t, nb, stop, y, ldy);
    if (t < n_tokens)
        k->packed.few(group, row_bytes, (const uint8_t *)xq + t * xq_stride, xq_stride, n_tokens - t, nb,
                      t > 0 && k->rest_in_cache ? group : stop, y + t * ldy, ldy);
}

int sq_rows16_wanted(int type) {
    /* Matrices are packed for the settings that have a packed kernel for the type. */
    return sq_rows16_packs(type) && kernels_for(type)->packed.few;
}

/* sq_vec_dot_rows16, asking memory ahead for the rows up to fetch_end >= r1. */
static int packed_rows(int type, const void *data, int64_t r0, int64_t r1, int64_t fetch_end, const void *xq,
                       int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !sq_rows16_packs(type) || r0 < 0 || r1 < r0 || n_tokens < 1 ||
        (n_tokens > 1 && xq_stride < sq_activation_row_bytes(t->vec_type, n)))
        return -1;
    if (r0 == r1)
        return 0;
    const kernels *k = kernels_for(type);
    const int64_t row_bytes = nb * t->bytes;
    const uint8_t *base = data, *stop = base + (fetch_end + 15) / 16 * 16 * row_bytes;  /* past the last group wanted */
    int status = 0;
    for (int64_t g = r0 / 16 * 16; g < r1 && !status; g += 16) {
        const int64_t first = g > r0 ? g : r0, end = g + 16 < r1 ? g + 16 : r1;  /* this group's rows asked for */
        float *out = y + (first - r0);
        if (k->packed.few && first == g && end == g + 16)
            packed_group(k, base + g * row_bytes, row_bytes, xq, xq_stride, n_tokens, nb, stop, out, ldy);
        else
            status = group_via_copy(type, base + g * row_bytes, row_bytes, (int)(first - g), (int)(end - first), xq,
                                    xq_stride, n_tokens, n, out, ldy);
    }
    return status;
}

int sq_vec_dot_rows16(int type, const void *data, int64_t r0, int64_t r1, const void *xq, int64_t xq_stride,
                      int n_tokens, int64_t n, float *y, int64_t ldy) {
    return packed_rows(type, data, r0, r1, r1, xq, xq_stride, n_tokens, n, y, ldy);
}

int sq_vec_dot_matrix_rows(const sq_tensor *w, int64_t r0, int64_t r1, int64_t fetch_end, const void *xq,
                           int64_t xq_stride, int n_tokens, float *y, int64_t ldy) {
    if (!w || r0 < 0 || r1 < r0 || fetch_end < r1 || fetch_end > w->rows || n_tokens < 1)
        return -1;
    if (w->packed16)
        return packed_rows(w->type, w->data, r0, r1, fetch_end, xq, xq_stride, n_tokens, w->cols, y, ldy);
    const uint8_t *rows = (const uint8_t *)w->data + r0 * w->row_bytes;
    if (n_tokens == 1)
        return token_rows(w->type, rows, w->row_bytes, r1 - r0, fetch_end - r0, xq, w->cols, y);
    return batch_rows(w->type, rows, w->row_bytes, r1 - r0, fetch_end - r0, xq, xq_stride, n_tokens, w->cols, y, ldy);
}
