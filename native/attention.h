/* attention.h: the attention forward.c calls per layer, one path per KV cache type: the F32
 * cache's (attention.c) and the compact caches' (flash_attention.c, whose own pieces are in
 * flash_attention.h). */
#ifndef SMOLQ_ATTENTION_H
#define SMOLQ_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

#include "smolq.h"
#include "quants/blocks.h"

/* The F32 cache's path (attention.c): the `group` query heads that share one KV head,
 * attending to its positions 0..n_keys-1 with the rounding of llama.cpp's one-token
 * step, for a token of any batch.
 * q: [group][head_dim] f32; k, v: [n_keys][head_dim] f32, the KV head's own rows;
 * scores: [n_keys] scratch; out: [group][head_dim]. */
void sq_attention_group(const float *q, int group, const float *k, const float *v, int head_dim, int n_keys,
                        float *scores, float *out);

/* Bytes of one cached row of head_dim elements of kv_type: floats, halves, or Q8_0 blocks
 * when head_dim is a multiple of 32; 0 otherwise. */
static inline size_t sq_kv_row_bytes(int kv_type, int head_dim) {
    switch (kv_type) {
    case SQ_F32: return (size_t)head_dim * 4;
    case SQ_F16: return (size_t)head_dim * 2;
    case SQ_Q8_0: return head_dim % QK8_0 ? 0 : (size_t)head_dim / QK8_0 * sizeof(block_q8_0);
    default: return 0;
    }
}

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

#endif
