/* quants/types.c: what the type table answers through the ABI: a type's block
 * geometry, its row decoder and float dot product, its activation format and the
 * conversion into it, and the names and weight types of quants/types.h's lists.
 * (The dot products with converted activations, which choose a SIMD path, are in
 * quants/dispatch.c.)
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quants/kernels.h"

/* ---------------------------------------------------------------------------
 * Geometry, decoding, conversion
 * ------------------------------------------------------------------------- */

int sq_block_elems(int type) {
    const sq_type_traits *t = sq_traits(type);
    return t ? t->elems : 0;
}

int sq_block_bytes(int type) {
    const sq_type_traits *t = sq_traits(type);
    return t ? t->bytes : 0;
}

int sq_dequantize_row(int type, const void *src, float *dst, int64_t n) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0)
        return -1;
    t->dequant(src, dst, nb);
    return 0;
}

/* Also serves Q8_1 and Q8_K rows (their decoded values times x); their vec_dot
 * entries are empty, so sq_vec_dot_type gives -1 and sq_vec_dot NaN for them. */
float sq_dot_row(int type, const void *row, const float *x, int64_t n) {
    const sq_type_traits *t = sq_traits(type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0)
        return NAN;
    return t->dot(row, x, nb);
}

int sq_vec_dot_type(int type) {
    const sq_type_traits *t = sq_traits(type);
    return t && t->vec_dot ? t->vec_type : -1;
}

int sq_quantize_row(int vec_type, const float *x, void *dst, int64_t n) {
    const sq_quantize_fn quantize = sq_quantizer(vec_type);
    int64_t nb = sq_whole_blocks(sq_traits(vec_type), n);
    if (nb < 0 || !quantize)
        return -1;
    quantize(x, dst, nb);
    return 0;
}

int64_t sq_activation_row_bytes(int vec_type, int64_t n) {
    const sq_type_traits *t = sq_traits(vec_type);
    int64_t nb = sq_whole_blocks(t, n);
    if (nb < 0 || !sq_quantizer(vec_type))
        return -1;
    if (vec_type == SQ_Q8_0)
        return sq_q8_0_scales_at(nb) + 4 * nb;
    if (vec_type == SQ_Q8_1)
        return sq_q8_1_scales_at(nb) + 8 * nb;
    if (vec_type == SQ_Q8_K)
        return sq_q8_K_sums32_at(nb) + 16 * nb;
    return nb * t->bytes;
}

int sq_quantize_activations(int vec_type, const float *x, void *dst, int64_t n) {
    if (sq_quantize_row(vec_type, x, dst, n) != 0)
        return -1;
    if (vec_type == SQ_Q8_0) {
        const int64_t nb = n / QK8_0;
        const block_q8_0 *b = dst;
        uint8_t *offsets = (uint8_t *)dst + sq_q8_0_offsets_at(nb);
        for (int64_t i = 0; i < nb; i++) {
            int32_t sum = 0;
            for (int j = 0; j < QK8_0; j++)
                sum += b[i].qs[j];
            const int32_t offset = -128 * sum;
            const float d = sq_fp16_to_fp32(b[i].d);
            memcpy(offsets + 4 * i, &offset, 4);
            memcpy((uint8_t *)dst + sq_q8_0_scales_at(nb) + 4 * i, &d, 4);
        }
    }
    if (vec_type == SQ_Q8_1) {
        const int64_t nb = n / QK8_1;
        const block_q8_1 *b = dst;
        for (int64_t i = 0; i < nb; i++) {
            const float ds[2] = {sq_fp16_to_fp32(b[i].d), sq_fp16_to_fp32(b[i].s)};
            memcpy((uint8_t *)dst + sq_q8_1_scales_at(nb) + 8 * i, ds, 8);
        }
    }
    if (vec_type == SQ_Q8_K) {
        const int64_t nb = n / QK_K;
        const block_q8_K *b = dst;
        uint8_t *sums = (uint8_t *)dst + sq_q8_K_sums32_at(nb);
        for (int64_t i = 0; i < nb; i++)
            for (int g = 0; g < QK_K / 32; g++) {
                const int16_t sum = (int16_t)(b[i].bsums[2 * g] + b[i].bsums[2 * g + 1]);  /* |.| <= 32 * 127 */
                memcpy(sums + 16 * i + 2 * g, &sum, 2);
            }
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Names and weight types
 * ------------------------------------------------------------------------- */

#define TYPE_ID(ctx, NAME, ...) SQ_##NAME,
static const int weight_types[] = { SQ_FLOAT_TYPES(TYPE_ID, _) SQ_QUANT_TYPES(TYPE_ID, _) };

int sq_weight_types(int *out, int cap) {
    const int n = (int)(sizeof weight_types / sizeof weight_types[0]);
    for (int i = 0; i < n && i < cap; i++)
        out[i] = weight_types[i];
    return n;
}

/* One case per type of the lists, and no default: -Wswitch (part of -Wall) names any
 * constant of smolq.h's enum sq_type the lists lack, and a listed name the enum lacks
 * does not compile, so the enum and the lists cannot drift apart. */
#define NAME_CASE(ctx, NAME, ...) \
    case SQ_##NAME:               \
        return #NAME;
const char *sq_type_name(int type) {
    if (type < 0 || type >= SQ_TYPE_SLOTS)
        return NULL;
    switch ((enum sq_type)type) {
        SQ_FLOAT_TYPES(NAME_CASE, _)
        SQ_QUANT_TYPES(NAME_CASE, _)
        SQ_ACTIVATION_TYPES(NAME_CASE, _)
    }
    return NULL;
}
