/* attention.h: the attention pieces forward.c calls per KV head. */
#ifndef SMOLQ_ATTENTION_H
#define SMOLQ_ATTENTION_H

/* The `group` query heads that share one KV head, attending to its positions
 * 0..n_keys-1 with llama.cpp's rounding (see attention.c). batched says whether the
 * token is part of a multi-token batch, which in llama.cpp changes the kernel, and so
 * the rounding, of the weighted sum of V rows.
 * q: [group][head_dim] f32; k, v: [n_keys][head_dim] of kv_type (SQ_F32 or SQ_F16),
 * the KV head's own rows; scores: [n_keys] scratch; out: [group][head_dim]. */
void sq_attention_group(const float *q, int group, const void *k, const void *v, int kv_type, int head_dim,
                        int n_keys, int batched, float *scores, float *out);

#endif
