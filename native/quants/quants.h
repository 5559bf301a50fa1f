/* quants/quants.h: the number conversions the rest of the kernel shares with quants/.
 * (What quants/ offers besides, the row functions and dot products, is in smolq.h.) */
#ifndef SMOLQ_QUANTS_H
#define SMOLQ_QUANTS_H
#include <stdint.h>
#include <string.h>

/* A float's bits, and the float of some bits. */
static inline uint32_t sq_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float sq_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* IEEE half <-> single, exact (round-to-nearest-even on the way down). */
float sq_fp16_to_fp32(uint16_t h);
uint16_t sq_fp32_to_fp16(float f);

/* bfloat16 is the top half of a float32. */
static inline float sq_bf16_to_fp32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

/* float32 -> bfloat16, rounding to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t sq_fp32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

#endif
