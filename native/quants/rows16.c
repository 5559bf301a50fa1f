/* quants/rows16.c: weight matrices packed sixteen rows side by side.
 *
 * The 512-bit kernels multiply sixteen rows at once, one row per 32-bit lane, so that an
 * activation word broadcast to every lane meets the same four codes of all sixteen rows.
 * From the file's layout (each row's blocks one after another) every pass over the rows
 * first gathers those words, a transpose per block; for a lookup draft's check that is a
 * quarter of the work. Packed when the model is loaded, a group of sixteen rows holds its
 * blocks as the kernels load them, and the transpose is done once.
 *
 * A group takes the bytes its rows took (16 * row_bytes at row 16g's offset), so a range
 * of whole groups lies where its rows did. Within the group, block i of the sixteen rows
 * is one run of 16 blocks' bytes at i * 16 * (block bytes): first the block's f16 fields
 * (d, then m for Q4_1 and Q5_1 or dmin for Q4_K and Q5_K; IQ4_XS's scales_h taken as one),
 * each as sixteen halves, row 0's first; then the rest of the block (codes, and the scales
 * of Q4_K, Q5_K and IQ4_XS before them, Q6_K's after; the fifth bits of Q5_0 and Q5_1
 * before, Q5_K's between) as 32-bit
 * words, word j of the sixteen rows together
 * (64 bytes), in order of j. Nothing is lost:
 * sq_rows16_unpack gives back the file's bytes.
 */
#include <stddef.h>
#include <string.h>

#include "quants/kernels.h"

enum { GROUP = 16 };

/* A packable block: `halves` f16 fields from byte half_at, and `words` 32-bit words of
 * everything else from byte word_at (the words and the halves the whole block). */
typedef struct {
    int half_at, halves, word_at, words;
} block_shape;

static block_shape shape_of(int type) {
    switch (type) {
    case SQ_Q4_1: return (block_shape){0, 2, 4, QK4_1 / 8};  /* d, m; 16 code bytes */
    case SQ_Q8_0: return (block_shape){0, 1, 2, QK8_0 / 4};  /* d; 32 code bytes */
    case SQ_Q4_0: return (block_shape){0, 1, 2, QK4_0 / 8};  /* d; 16 code bytes */
    case SQ_IQ4_NL: return (block_shape){0, 1, 2, QK4_NL / 8};  /* d; 16 bytes of grid indices */
    case SQ_Q5_0: return (block_shape){0, 1, 2, 1 + QK5_0 / 8};  /* d; qh, 16 code bytes */
    case SQ_Q5_1: return (block_shape){0, 2, 4, 1 + QK5_1 / 8};  /* d, m; qh, 16 code bytes */
    case SQ_Q4_K: return (block_shape){0, 2, 4, (12 + QK_K / 2) / 4};  /* d, dmin; 12 bytes of scales, 128 of codes */
    case SQ_Q5_K: return (block_shape){0, 2, 4, (12 + QK_K / 8 + QK_K / 2) / 4};
        /* d, dmin; 12 bytes of scales, 32 of fifth bits, 128 of codes */
    case SQ_IQ4_XS: return (block_shape){0, 2, 4, (QK_K / 64 + QK_K / 2) / 4};
        /* d and scales_h (not an f16, but two bytes as one is); 4 bytes of scales, 128 of codes */
    case SQ_Q3_K: return (block_shape){QK_K / 8 + QK_K / 4 + 12, 1, 0, (QK_K / 8 + QK_K / 4 + 12) / 4};
        /* d after hmask (32 bytes), qs (64) and the 12 bytes of scales */
    case SQ_Q2_K: return (block_shape){QK_K / 16 + QK_K / 4, 2, 0, (QK_K / 16 + QK_K / 4) / 4};
        /* d, dmin after the 16 bytes of scales and 64 of codes */
    case SQ_Q6_K: return (block_shape){QK_K / 2 + QK_K / 4 + QK_K / 16, 1, 0, (QK_K / 2 + QK_K / 4 + QK_K / 16) / 4};
        /* d after ql (128 bytes), qh (64) and the 16 scales */
    default: return (block_shape){0, 0, 0, 0};
    }
}

static_assert(2 * 2 + 4 * (QK4_1 / 8) == sizeof(block_q4_1), "Q4_1's shape is its block");
static_assert(2 * 1 + 4 * (QK8_0 / 4) == sizeof(block_q8_0), "Q8_0's shape is its block");
static_assert(2 * 1 + 4 * (QK4_0 / 8) == sizeof(block_q4_0), "Q4_0's shape is its block");
static_assert(2 * 1 + 4 * (QK4_NL / 8) == sizeof(block_iq4_nl), "IQ4_NL's shape is its block");
static_assert(2 * 1 + 4 * (1 + QK5_0 / 8) == sizeof(block_q5_0), "Q5_0's shape is its block");
static_assert(2 * 2 + 4 * (1 + QK5_1 / 8) == sizeof(block_q5_1), "Q5_1's shape is its block");
static_assert(2 * 2 + 4 * ((12 + QK_K / 2) / 4) == sizeof(block_q4_K), "Q4_K's shape is its block");
static_assert(2 * 2 + 4 * ((12 + QK_K / 8 + QK_K / 2) / 4) == sizeof(block_q5_K), "Q5_K's shape is its block");
static_assert(2 * 2 + 4 * ((QK_K / 64 + QK_K / 2) / 4) == sizeof(block_iq4_xs), "IQ4_XS's shape is its block");
static_assert(2 * 1 + (QK_K / 8 + QK_K / 4 + 12) == sizeof(block_q3_K) &&
                  offsetof(block_q3_K, d) == QK_K / 8 + QK_K / 4 + 12, "Q3_K's shape is its block");
static_assert(2 * 2 + (QK_K / 16 + QK_K / 4) == sizeof(block_q2_K) &&
                  offsetof(block_q2_K, d) == QK_K / 16 + QK_K / 4, "Q2_K's shape is its block");
static_assert(2 * 1 + (QK_K / 2 + QK_K / 4 + QK_K / 16) == sizeof(block_q6_K) &&
                  offsetof(block_q6_K, d) == QK_K / 2 + QK_K / 4 + QK_K / 16, "Q6_K's shape is its block");

int sq_rows16_packs(int type) { return shape_of(type).words > 0; }

/* Bytes of a row of cols elements of a packable type, or 0 when cols is not whole blocks. */
static int64_t row_bytes_of(int type, int64_t cols) {
    const int elems = sq_block_elems(type);
    return elems > 0 && cols > 0 && cols % elems == 0 ? cols / elems * sq_block_bytes(type) : 0;
}

/* Where the run of block i starts in a group, and where its codes start in the run. */
static size_t run_at(block_shape s, int64_t i) { return (size_t)i * GROUP * (2 * (size_t)s.halves + 4 * (size_t)s.words); }
static size_t words_at(block_shape s) { return (size_t)s.halves * GROUP * 2; }

/* A plain block into row r's place (0..15) in block i of a group. */
static void pack_block(block_shape s, const uint8_t *block, uint8_t *group, int64_t i, int r) {
    uint8_t *run = group + run_at(s, i);
    for (int h = 0; h < s.halves; h++)
        memcpy(run + ((size_t)h * GROUP + (size_t)r) * 2, block + s.half_at + 2 * h, 2);
    for (int j = 0; j < s.words; j++)
        memcpy(run + words_at(s) + ((size_t)j * GROUP + (size_t)r) * 4, block + s.word_at + 4 * j, 4);
}

/* Row r's block i of a group, as the file had it. */
static void unpack_block(block_shape s, const uint8_t *group, int64_t i, int r, uint8_t *block) {
    const uint8_t *run = group + run_at(s, i);
    for (int h = 0; h < s.halves; h++)
        memcpy(block + s.half_at + 2 * h, run + ((size_t)h * GROUP + (size_t)r) * 2, 2);
    for (int j = 0; j < s.words; j++)
        memcpy(block + s.word_at + 4 * j, run + words_at(s) + ((size_t)j * GROUP + (size_t)r) * 4, 4);
}

/* Every row's blocks from src into their places in dst's groups, or back. */
static int repack(int type, const void *src, void *dst, int64_t rows, int64_t cols, int to_packed) {
    const block_shape s = shape_of(type);
    const int64_t row_bytes = row_bytes_of(type, cols);
    if (!s.words || !row_bytes || rows < 0 || rows % GROUP)
        return -1;
    if (!rows)
        return 0;
    const uint8_t *from = src;
    uint8_t *to = dst;
    const int64_t size = rows * row_bytes;
    if (!from || !to || (from < to + size && to < from + size))  /* the two must not overlap */
        return -1;
    const int64_t nb = cols / sq_block_elems(type), bytes = sq_block_bytes(type);
    for (int64_t g = 0; g < rows; g += GROUP)
        for (int r = 0; r < GROUP; r++)
            for (int64_t i = 0; i < nb; i++) {
                const int64_t plain = (g + r) * row_bytes + i * bytes;  /* row g + r's block i */
                if (to_packed)
                    pack_block(s, from + plain, to + g * row_bytes, i, r);
                else
                    unpack_block(s, from + g * row_bytes, i, r, to + plain);
            }
    return 0;
}

int sq_rows16_pack(int type, const void *src, void *dst, int64_t rows, int64_t cols) {
    return repack(type, src, dst, rows, cols, 1);
}

int sq_rows16_unpack(int type, const void *src, void *dst, int64_t rows, int64_t cols) {
    return repack(type, src, dst, rows, cols, 0);
}

int sq_dequantize_row16(int type, const void *group, int r, float *dst, int64_t n) {
    const block_shape s = shape_of(type);
    if (!s.words || r < 0 || r >= GROUP || !row_bytes_of(type, n))
        return -1;
    const int elems = sq_block_elems(type);
    uint8_t block[sizeof(block_q6_K)];  /* the largest packable block */
    static_assert(sizeof(block_q8_0) <= sizeof(block) && sizeof(block_q4_1) <= sizeof(block) &&
                  sizeof(block_q4_K) <= sizeof(block) && sizeof(block_q5_K) <= sizeof(block),
                  "block buffer");
    for (int64_t i = 0; i < n / elems; i++) {
        unpack_block(s, group, i, r, block);
        sq_dequantize_row(type, block, dst + i * elems, elems);
    }
    return 0;
}
