"""Weight matrices packed sixteen rows side by side (native/quants/rows16.c): the layout the
header describes, the way back, and every product and row read from a packed matrix
exactly what the file's layout gives, on every SIMD path, for any range of rows."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from helpers.simd_paths import amx_runs, simd_paths
from test_quants import VEC_DOT_TYPE, amx_expected, quantized_rows, random_row, scalar_steps

from llm_smolq._kernel import ffi, lib

PACKED_TYPES = [T.Q4_1, T.Q8_0, T.Q4_0, T.Q5_0, T.Q5_1, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.IQ4_XS, T.Q6_K]
# where a block's f16 fields are (d, then m or dmin): (first byte, how many)
HALVES = {T.Q4_1: (0, 2), T.Q8_0: (0, 1), T.Q4_0: (0, 1), T.Q5_0: (0, 1), T.Q5_1: (0, 2), T.IQ4_NL: (0, 1), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.IQ4_XS: (0, 2), T.Q6_K: (208, 1), T.Q3_K: (108, 1), T.Q2_K: (80, 2)}


def matrix(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    return np.stack([random_row(qtype, cols, rng) for _ in range(rows)])


def packed(qtype: T, plain: np.ndarray, cols: int) -> np.ndarray:
    out = np.zeros_like(plain)
    assert lib.sq_rows16_pack(int(qtype), ffi.from_buffer(plain), ffi.from_buffer(out), plain.shape[0], cols) == 0
    return out


def expected_packing(qtype: T, plain: np.ndarray) -> np.ndarray:
    """The layout written out in numpy: per group and block, each f16 field of the sixteen
    rows, then each 32-bit word of the rest of their blocks, row 0 first."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    rows, (at, halves) = plain.shape[0], HALVES[qtype]
    blocks = plain.reshape(rows // 16, 16, -1, block_bytes)  # group, row, block, byte
    out = []
    for group in blocks:
        for i in range(group.shape[1]):
            block = group[:, i]  # [16 rows][bytes]
            rest = np.concatenate([block[:, :at], block[:, at + 2 * halves:]], axis=1)
            fields = [block[:, at + 2 * h:at + 2 * h + 2] for h in range(halves)]
            words = [rest[:, 4 * j:4 * j + 4] for j in range(rest.shape[1] // 4)]
            out += [f.reshape(-1) for f in fields + words]
    return np.concatenate(out).reshape(plain.shape)


def test_which_types_pack():
    assert {int(t) for t in PACKED_TYPES} == {int(t) for t in T if lib.sq_rows16_packs(int(t))}


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda t: t.name)
def test_packing_is_the_documented_layout_and_comes_back(qtype):
    rng = np.random.default_rng(40 + int(qtype))
    elems = GGML_QUANT_SIZES[qtype][0]
    for rows, cols in ((16, elems), (48, 4 * elems), (32, 37 * elems)):
        plain = matrix(qtype, rows, cols, rng)
        out = packed(qtype, plain, cols)
        assert out.tobytes() == expected_packing(qtype, plain).tobytes()
        back = np.zeros_like(plain)
        assert lib.sq_rows16_unpack(int(qtype), ffi.from_buffer(out), ffi.from_buffer(back), rows, cols) == 0
        assert back.tobytes() == plain.tobytes()


def test_packing_refuses_what_it_cannot_pack():
    rng = np.random.default_rng(5)
    plain = matrix(T.Q4_1, 32, 64, rng)
    for qtype, rows, cols in ((T.Q8_K, 32, 256), (T.F16, 32, 64), (T.F32, 32, 64), (99, 32, 64), (T.Q4_1, 24, 64),
                              (T.Q4_1, -16, 64), (T.Q4_1, 16, 48), (T.Q4_1, 16, 0)):
        for fn in (lib.sq_rows16_pack, lib.sq_rows16_unpack):
            out = np.full_like(plain, 7)
            assert fn(int(qtype), ffi.from_buffer(plain), ffi.from_buffer(out), rows, cols) == -1, (qtype, rows, cols)
            assert (out == 7).all()
    both = np.concatenate([plain, plain])  # overlapping source and destination
    for fn in (lib.sq_rows16_pack, lib.sq_rows16_unpack):
        base = ffi.from_buffer(both)
        assert fn(int(T.Q4_1), base, base + 16 * plain.shape[1], 32, 64) == -1
        assert fn(int(T.Q4_1), base, base, 16, 64) == -1
        assert both.tobytes() == np.concatenate([plain, plain]).tobytes()
    assert lib.sq_rows16_pack(int(T.Q4_1), ffi.NULL, ffi.NULL, 0, 64) == 0  # nothing to do


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda t: t.name)
def test_products_of_a_packed_matrix_are_the_files(qtype, simd_restore, monkeypatch):
    """sq_vec_dot_rows16 over whole groups and ranges that start or end inside one, for one
    token (decode), two to four (each a loop of its own in the 32-element kernels), five to
    sixteen (passes of those, or one span), to past the kernels' 16-token tile and into the
    tiled batch kernels' sizes, past the 128-token span whose chains the 32-element kernels
    keep from block to block, rows of 37 blocks: each output the scalar sq_vec_dot's bits
    for the row as the file had it; y written only where it should be."""
    rng = np.random.default_rng(60 + int(qtype))
    vtype = VEC_DOT_TYPE[qtype]
    elems = GGML_QUANT_SIZES[qtype][0]
    seen = []
    for cols, rows in ((8 * elems, 48), (37 * elems, 32)):
        plain = matrix(qtype, rows, cols, rng)
        pack = packed(qtype, plain, cols)
        for tokens in (1, 2, 3, 4, 5, 8, 9, 16, 17, 70) + ((131,) if cols > 8 * elems else ()):
            xq = quantized_rows(vtype, cols, tokens, rng)
            want = scalar_steps(qtype, plain, xq, cols)
            for set_path in simd_paths(monkeypatch):
                seen.append(set_path())
                for r0, r1 in ((0, rows), (16, 32), (3, rows - 5), (5, 9), (17, 17), (0, 1)):
                    ldy = r1 - r0 + 2
                    y = np.full(tokens * ldy, np.nan, dtype=np.float32)
                    rc = lib.sq_vec_dot_rows16(int(qtype), ffi.from_buffer(pack), r0, r1, ffi.from_buffer(xq),
                                               xq.shape[1], tokens, cols, ffi.from_buffer("float[]", y), ldy)
                    assert rc == 0
                    y = y.reshape(tokens, ldy)
                    assert np.isnan(y[:, r1 - r0:]).all()
                    assert y[:, :r1 - r0].tobytes() == want[:, r0:r1].tobytes(), \
                        f"{qtype.name} cols={cols} rows {r0}..{r1} tokens={tokens} simd={seen[-1]}"
    assert len(set(seen)) >= 2 or seen == ["scalar"] * len(seen)


@pytest.mark.may_skip_in_ci  # on a CPU without AMX, or an OS that does not grant the tiles
def test_amx_products_on_real_tiles(simd_restore, monkeypatch):
    """Where the CPU has AMX, its tiles' products of every type (a draft's eight tokens, a
    tile of sixteen and one left, four tiles and some) are the scalar definition's bits; the
    run's output says when that could not be tried. (test_products_of_a_packed_matrix_are_the_files
    tries the AMX path too, wherever it runs, the tiles' C stand-ins included.)"""
    if os.environ.get("SMOLQ_VNNI_VIA_SIMDE") or not amx_expected():
        pytest.skip("no AMX on this CPU: the AMX kernels ran on the tiles' C stand-ins alone "
                    "(tests/kernel/test_avx512vnni.py)")
    if not amx_runs():
        pytest.skip("this CPU has AMX but the OS did not grant this process the tiles (arch_prctl "
                    "ARCH_REQ_XCOMP_PERM; an alternate signal stack too small for their state is one "
                    "reason): the AMX kernels ran on the tiles' C stand-ins alone")
    monkeypatch.setenv("SMOLQ_SIMD", "amx")
    lib.sq_set_simd(1)
    assert ffi.string(lib.sq_simd_name()) == b"amx"
    rng = np.random.default_rng(90)
    for qtype in PACKED_TYPES:
        cols = 9 * GGML_QUANT_SIZES[qtype][0]
        plain = matrix(qtype, 32, cols, rng)
        pack = packed(qtype, plain, cols)
        for tokens in (8, 17, 70):
            xq = quantized_rows(VEC_DOT_TYPE[qtype], cols, tokens, rng)
            want = scalar_steps(qtype, plain, xq, cols)
            y = np.full((tokens, 32), np.nan, dtype=np.float32)
            assert lib.sq_vec_dot_rows16(int(qtype), ffi.from_buffer(pack), 0, 32, ffi.from_buffer(xq),
                                         xq.shape[1], tokens, cols, ffi.from_buffer("float[]", y), 32) == 0
            assert y.tobytes() == want.tobytes(), f"{qtype.name} tokens={tokens}"


def test_products_of_a_packed_matrix_refuse_bad_arguments():
    rng = np.random.default_rng(7)
    pack = packed(T.Q4_1, matrix(T.Q4_1, 16, 64, rng), 64)
    xq = quantized_rows(VEC_DOT_TYPE[T.Q4_1], 64, 2, rng)
    y = np.full(64, 7.0, dtype=np.float32)
    for qtype, r0, r1, tokens, cols in ((T.F16, 0, 16, 1, 64), (T.Q4_1, 0, 16, 0, 64), (T.Q4_1, 8, 4, 1, 64),
                                        (T.Q4_1, -1, 16, 1, 64), (T.Q4_1, 0, 16, 1, 48), (99, 0, 16, 1, 64)):
        rc = lib.sq_vec_dot_rows16(int(qtype), ffi.from_buffer(pack), r0, r1, ffi.from_buffer(xq), xq.shape[1],
                                   tokens, cols, ffi.from_buffer("float[]", y), 16)
        assert rc == -1 and (y == 7.0).all(), (qtype, r0, r1, tokens, cols)
    # activation rows closer together than a row's bytes (its sums included) would overlap
    for qtype in (T.Q4_1, T.Q8_0, T.Q4_K):
        cols = 256
        pack = packed(qtype, matrix(qtype, 16, cols, rng), cols)
        xq = quantized_rows(VEC_DOT_TYPE[qtype], cols, 2, rng)
        for stride, want in ((xq.shape[1] - 1, -1), (xq.shape[1], 0)):
            rc = lib.sq_vec_dot_rows16(int(qtype), ffi.from_buffer(pack), 0, 16, ffi.from_buffer(xq), stride, 2, cols,
                                       ffi.from_buffer("float[]", y), 16)
            assert rc == want, (qtype, stride)


def tensor(qtype: T, data: np.ndarray, cols: int, is_packed: bool):
    """An sq_tensor over data (kept alive by the caller), in the file's layout or packed."""
    return ffi.new("sq_tensor *", {"data": ffi.from_buffer(data), "type": int(qtype), "rows": data.shape[0],
                                   "cols": cols, "row_bytes": data.shape[1], "packed16": int(is_packed)})


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_a_matrix_s_rows_are_the_file_s_products_however_far_ahead_they_ask(qtype, simd_restore, monkeypatch):
    """sq_vec_dot_matrix_rows, what the engine's threads call (native/matmul.c), over ranges
    of a matrix in the file's layout and packed, for a step, a few tokens and a prompt's
    many: the scalar definition's bits whether the kernels ask memory ahead to the range's
    end or to the matrix's; y written only where it should be."""
    rng = np.random.default_rng(70 + int(qtype))
    rows, cols = 48, 8 * GGML_QUANT_SIZES[qtype][0]
    plain = matrix(qtype, rows, cols, rng)
    layouts = {"file": plain, "packed": packed(qtype, plain, cols)}
    for tokens in (1, 3, 8, 20):
        xq = quantized_rows(VEC_DOT_TYPE[qtype], cols, tokens, rng)
        want = scalar_steps(qtype, plain, xq, cols)
        for set_path in simd_paths(monkeypatch):
            path = set_path()
            for layout, data in layouts.items():
                w = tensor(qtype, data, cols, layout == "packed")
                for r0, r1 in ((0, rows), (16, 32), (3, rows - 5), (5, 9)):
                    for fetch_end in (r1, rows):
                        ldy = r1 - r0 + 2
                        y = np.full((tokens, ldy), np.nan, dtype=np.float32)
                        assert lib.sq_vec_dot_matrix_rows(w, r0, r1, fetch_end, ffi.from_buffer(xq), xq.shape[1],
                                                          tokens, ffi.from_buffer("float[]", y), ldy) == 0
                        assert np.isnan(y[:, r1 - r0:]).all()
                        assert y[:, :r1 - r0].tobytes() == want[:, r0:r1].tobytes(), \
                            f"{qtype.name} {layout} rows {r0}..{r1} ahead to {fetch_end} tokens={tokens} simd={path}"


def test_a_matrix_s_rows_refuse_a_range_outside_it():
    rng = np.random.default_rng(8)
    plain = matrix(T.Q4_1, 32, 64, rng)
    xq = quantized_rows(VEC_DOT_TYPE[T.Q4_1], 64, 2, rng)
    y = np.full(64, 7.0, dtype=np.float32)
    for is_packed in (False, True):
        data = packed(T.Q4_1, plain, 64) if is_packed else plain
        w = tensor(T.Q4_1, data, 64, is_packed)
        for r0, r1, fetch_end, tokens in ((-1, 16, 16, 1), (8, 4, 8, 1), (0, 16, 15, 1), (0, 16, 33, 1),
                                          (0, 32, 32, 0), (16, 40, 40, 2)):
            rc = lib.sq_vec_dot_matrix_rows(w, r0, r1, fetch_end, ffi.from_buffer(xq), xq.shape[1], tokens,
                                            ffi.from_buffer("float[]", y), 16)
            assert rc == -1 and (y == 7.0).all(), (is_packed, r0, r1, fetch_end, tokens)
    assert lib.sq_vec_dot_matrix_rows(ffi.NULL, 0, 16, 16, ffi.from_buffer(xq), xq.shape[1], 1,
                                      ffi.from_buffer("float[]", y), 16) == -1


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda t: t.name)
def test_a_row_of_a_packed_group_decodes_as_it_did(qtype):
    rng = np.random.default_rng(80 + int(qtype))
    cols = 5 * GGML_QUANT_SIZES[qtype][0]
    plain = matrix(qtype, 32, cols, rng)
    pack = packed(qtype, plain, cols)
    row_bytes = plain.shape[1]
    for r in (0, 7, 15, 16, 31):
        want = np.zeros(cols, dtype=np.float32)
        assert lib.sq_dequantize_row(int(qtype), ffi.from_buffer(plain[r]), ffi.from_buffer("float[]", want), cols) == 0
        got = np.zeros(cols, dtype=np.float32)
        group = ffi.from_buffer(pack) + (r // 16) * 16 * row_bytes
        assert lib.sq_dequantize_row16(int(qtype), group, r % 16, ffi.from_buffer("float[]", got), cols) == 0
        assert got.tobytes() == want.tobytes()
    got = np.full(cols, 7.0, dtype=np.float32)
    for qtype_, r, n in ((T.F16, 0, cols), (qtype, 16, cols), (qtype, -1, cols), (qtype, 0, cols + 1)):
        assert lib.sq_dequantize_row16(int(qtype_), ffi.from_buffer(pack), r, ffi.from_buffer("float[]", got), n) == -1
    assert (got == 7.0).all()
