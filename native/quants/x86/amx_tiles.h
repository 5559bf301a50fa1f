/* quants/x86/amx_tiles.h: the AMX tiles the packed kernels' prompt products use
 * (x86/avx512vnni.c, the "amx" setting), or in the test build (SQ_VNNI_VIA_SIMDE) plain C
 * that does what the instructions do, with the checks the CPU makes, so that the kernels'
 * use of the tiles is tested bit for bit on any AVX2 CPU.
 *
 * The tiles, set up by amx_begin for a kernel's run and given back by amx_end:
 *   A (tile 0)  rows tokens' activation codes, K signed bytes each, one token a row;
 *   B (tile 1)  sixteen weight rows' codes as quants/rows16.c packs them: K / 4 rows of
 *               64 bytes, row j the sixteen rows' words j (their codes 4j..4j+3), unsigned;
 *   C (tiles 2 to 5)  rows x 16 int32 each: C[t][r] += sum over k of A[t][k] * B[k / 4][4r + k % 4]
 *               (amx_product(c)); the kernels use tile 2, int8_peak.c all four.
 * TDPBSUD (signed times unsigned) forms C exactly in int32, as vpdpbusd forms a lane's sum
 * in the 512-bit kernels, with the operands' roles swapped: the codes that vpdpbusd takes as
 * its unsigned bytes are B's here. So a group's products are the same integers either way.
 */
#ifndef SMOLQ_QUANTS_X86_AMX_TILES_H
#define SMOLQ_QUANTS_X86_AMX_TILES_H

#include <stdint.h>
#include <string.h>

#include "simd.h"

#ifdef SQ_AMX

enum { AMX_B_ROWS_MAX = 16 };  /* K <= 64: a tile row is 64 bytes at most */

#ifdef SQ_VNNI_VIA_SIMDE
#include <stdio.h>
#include <stdlib.h>

/* The stand-in's tiles: 16 rows of 64 bytes each, and the shapes amx_begin gave them. */
typedef struct {
    uint8_t data[16][64];
    int rows, colsb;
} amx_tile;

static _Thread_local amx_tile amx_tiles[6];
static _Thread_local int amx_configured;

/* What the CPU would fault on (#UD, #GP): a tile used outside a configuration, or shapes
 * that do not meet. The test build stops there, loudly. */
static inline void amx_check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "smolq: AMX stand-in: %s\n", what);
        abort();
    }
}

static inline void amx_begin(int rows, int k) {
    amx_check(rows >= 1 && rows <= 16 && k >= 4 && k <= 64 && k % 4 == 0, "tile shape out of range");
    memset(amx_tiles, 0, sizeof amx_tiles);  /* LDTILECFG zeroes every tile */
    amx_tiles[0] = (amx_tile){.rows = rows, .colsb = k};
    amx_tiles[1] = (amx_tile){.rows = k / 4, .colsb = 64};
    for (int c = 2; c < 6; c++)
        amx_tiles[c] = (amx_tile){.rows = rows, .colsb = 64};
    amx_configured = 1;
}

static inline void amx_end(void) { amx_configured = 0; }

static inline void amx_load(amx_tile *t, const void *base, int64_t stride) {
    amx_check(amx_configured, "tile load without a configuration");
    for (int r = 0; r < t->rows; r++)
        memcpy(t->data[r], (const uint8_t *)base + r * stride, (size_t)t->colsb);
}

static inline void amx_load_a(const void *base, int64_t stride) { amx_load(&amx_tiles[0], base, stride); }
static inline void amx_load_b(const void *base) { amx_load(&amx_tiles[1], base, 64); }

static inline void amx_zero(int c) {
    amx_check(amx_configured, "tile zero without a configuration");
    memset(amx_tiles[c].data, 0, sizeof amx_tiles[c].data);
}

/* C += A B, signed bytes of A times unsigned ones of B, summed in int32 (wrapping, as the
 * instruction does; the kernels' sums stay far inside the range). The loops run along B's
 * rows, so that the compiler vectorizes them. */
static inline void amx_product(int tile) {
    amx_tile *a = &amx_tiles[0], *b = &amx_tiles[1], *c = &amx_tiles[tile];
    amx_check(amx_configured, "tile product without a configuration");
    amx_check(a->colsb == 4 * b->rows && a->rows == c->rows && b->colsb == c->colsb, "tile shapes do not meet");
    for (int t = 0; t < c->rows; t++) {
        uint32_t acc[16];
        memcpy(acc, c->data[t], sizeof acc);
        for (int j = 0; j < b->rows; j++)  /* B's row j: codes 4j..4j+3 of each of the 16 columns */
            for (int r = 0; r < 16; r++)
                for (int i = 0; i < 4; i++)
                    acc[r] += (uint32_t)((int32_t)(int8_t)a->data[t][4 * j + i] * (int32_t)b->data[j][4 * r + i]);
        memcpy(c->data[t], acc, sizeof acc);
    }
}

static inline void amx_store(int c, int32_t *out) {
    amx_check(amx_configured, "tile store without a configuration");
    for (int t = 0; t < amx_tiles[c].rows; t++)
        memcpy(out + 16 * t, amx_tiles[c].data[t], 64);
}

#define AMX_TARGET SQ_AVX2

#else /* the instructions */

#include <immintrin.h>

#define AMX_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))

/* LDTILECFG's operand: palette 1, then each tile's bytes per row and its rows. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;
_Static_assert(sizeof(amx_config) == 64, "LDTILECFG reads 64 bytes");

static inline AMX_TARGET void amx_begin(int rows, int k) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = (uint8_t)rows, c.colsb[0] = (uint16_t)k;
    c.rows[1] = (uint8_t)(k / 4), c.colsb[1] = 64;
    for (int t = 2; t < 6; t++)
        c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* TILERELEASE: the tiles back to their initial state, so that the OS saves none of them. */
static inline AMX_TARGET void amx_end(void) { _tile_release(); }

#define amx_load_a(base, stride) _tile_loadd(0, (base), (stride))
#define amx_load_b(base) _tile_loadd(1, (base), 64)
/* c: a C tile's number, 2 to 5, written as a number (the instructions name their tiles) */
#define amx_zero(c) _tile_zero(c)
#define amx_product(c) _tile_dpbsud(c, 0, 1)
#define amx_store(c, out) _tile_stored(c, (out), 64)

#endif
#endif /* SQ_AMX */
#endif
