/* attention.h: the attention pieces forward.c calls per layer. */
#ifndef SMOLQ_ATTENTION_H
#define SMOLQ_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

#include "smolq.h"

/* The F32 cache's path (attention.c): the `group` query heads that share one KV head,
 * attending to its positions 0..n_keys-1 with the rounding of llama.cpp's one-token
 * step, for a token of any batch.
 * q: [group][head_dim] f32; k, v: [n_keys][head_dim] f32, the KV head's own rows;
 * scores: [n_keys] scratch; out: [group][head_dim]. */
void sq_attention_group(const float *q, int group, const float *k, const float *v, int head_dim, int n_keys,
                        float *scores, float *out);

/* Bytes of one cached row of head_dim elements of kv_type (SQ_F32, SQ_F16, or SQ_Q8_0
 * when head_dim is a multiple of 32); 0 otherwise. */
size_t sq_kv_row_bytes(int kv_type, int head_dim);

/* The compact caches' path (flash_attention.c): n_tok tokens at positions n_past.. of
 * one layer, token t attending to keys 0..n_past + t, in one online-softmax pass.
 * q, out: [n_tok][n_heads * head_dim]; k_layer, v_layer: [n_kv_heads][n_ctx][row] of
 * kv_type (SQ_F16 or SQ_Q8_0); scratch: [threads][sq_flash_scratch_floats(c)];
 * partials: [sq_flash_partials_floats(c)]. pool NULL runs on the calling thread.
 * The result does not depend on n_tok, the thread count or the SIMD path.
 * Returns 0, or -1 for a type, head_dim (a multiple of 32 up to 1024) or span it
 * cannot take. */
int sq_flash_attention(sq_pool *pool, const sq_config *c, const float *q, const void *k_layer, const void *v_layer,
                       int kv_type, int n_tok, int n_past, float *scratch, float *partials, float *out);
size_t sq_flash_scratch_floats(const sq_config *c);
size_t sq_flash_partials_floats(const sq_config *c);

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

/* A prefill's rows through one key block in 512-bit registers (flash_attention_x16.c),
 * for the x86-64 build at sq_simd_512(); each gives the bits of flash_attention.c's
 * code for the same step. q: [n][hdp] scaled queries; s: [n][SQ_FLASH_KEY_BLOCK];
 * kw: the block's keys as floats in pairs (flash_attention.c, widen_key_pairs);
 * lanes: [4][SQ_FLASH_KEY_BLOCK][8] scratch; v: [SQ_FLASH_KEY_BLOCK][hdp] widened
 * values; o: [n][hdp]; scale: [n], what the online step leaves for the weighted sum
 * (sq_flash_online_x16). The scores also ask memory for the first pf_bytes at pf_a and
 * (unless NULL) pf_b, a slice per group of rows. */
void sq_flash_scores_x16(const float *q, size_t n, size_t hdp, const float *kw, size_t head_dim, float *lanes,
                         float *s, const uint8_t *pf_a, const uint8_t *pf_b, size_t pf_bytes);
void sq_flash_online_x16(float *s, size_t valid, float *m, float *l, float *scale);
void sq_flash_weigh_x16(const float *s, size_t n, size_t most, const float *v, size_t hdp, float *o,
                        const float *scale);

#endif
