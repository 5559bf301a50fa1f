/* flash_attention.h: what flash_attention.c shares with its 512-bit block step,
 * flash_attention_x16.c, and no one else. */
#ifndef SMOLQ_FLASH_ATTENTION_H
#define SMOLQ_FLASH_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

/* Keys of one online-softmax step: the block that a task's rows score together. */
enum { SQ_FLASH_KEY_BLOCK = 32 };

/* CALL(G) with G the constant 1, 2, 3 or 4 that g (1..4) holds: the kernels that take
 * query rows four at a time are inlined once for each size of group. */
#define SQ_FOR_GROUP_OF_ROWS(g, CALL) \
    switch (g) {                      \
    case 1: CALL(1); break;           \
    case 2: CALL(2); break;           \
    case 3: CALL(3); break;           \
    default: CALL(4); break;          \
    }

/* The lines of bytes [from, to) of a and (unless NULL) b asked of memory: into L1, or (into_l1
 * 0) L2 only, as flash_attention.c's block_step says for whom. The scores passes ask a slice
 * at a time. */
static inline void sq_flash_prefetch(const uint8_t *a, const uint8_t *b, size_t from, size_t to, int into_l1) {
    for (size_t at = from & ~(size_t)63; at < to; at += 64)
        if (into_l1) {
            __builtin_prefetch(a + at);
            if (b) __builtin_prefetch(b + at);
        } else {
            __builtin_prefetch(a + at, 0, 2);
            if (b) __builtin_prefetch(b + at, 0, 2);
        }
}

/* Where the 512-bit kernels read a block's keys and values: floats widened into scratch
 * (SQ_FLASH_WIDE), or the rows of an SQ_F16 or SQ_Q8_0 cache, widened as they are read. */
enum { SQ_FLASH_WIDE = -1 };

/* A task's rows through one key block of SQ_FLASH_KEY_BLOCK keys in 512-bit registers
 * (flash_attention_x16.c), for the x86-64 build at sq_simd_512(); each gives the bits of
 * flash_attention.c's code for the same step. q: [n][hdp] scaled queries; s:
 * [n][SQ_FLASH_KEY_BLOCK]; src SQ_FLASH_WIDE: kw, the block's keys as floats in pairs
 * (flash_attention.c, widen_key_pairs), and v, [SQ_FLASH_KEY_BLOCK][hdp] widened values;
 * src a cache type: k and vc, the block's first key and value rows, rb bytes apart (then
 * hdp must be head_dim); o: [n][hdp]; scale: [n], what the online step leaves for the
 * weighted sum (sq_flash_online_x16). The scores also ask memory for the first pf_bytes at
 * pf_a and (unless NULL) pf_b, a slice per group of rows. */
void sq_flash_scores_x16(const float *q, size_t n, size_t hdp, const float *kw, const uint8_t *k, int src, size_t rb,
                         size_t head_dim, float *s, const uint8_t *pf_a, const uint8_t *pf_b, size_t pf_bytes);
void sq_flash_online_x16(float *s, size_t n, const size_t *valid, float *m, float *l, float *scale);
void sq_flash_weigh_x16(const float *s, size_t n, size_t most, const float *v, const uint8_t *vc, int src, size_t rb,
                        size_t hdp, float *o, const float *scale);

#endif
