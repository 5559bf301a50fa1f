"""The row decoders and dot products of native/quants.c against gguf's numpy reference."""

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

from llm_smolq._kernel import ffi, lib

TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
         T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]

# Byte offsets of the f16 scale fields in each block. Everything else in a block
# is codes, for which any bit pattern is valid.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}


def random_row(qtype: T, n: int, rng: np.random.Generator) -> np.ndarray:
    """The raw bytes of a valid row of n elements: finite values throughout."""
    if qtype == T.F32:
        return rng.standard_normal(n, dtype=np.float32).view(np.uint8)
    if qtype == T.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8)
    if qtype == T.BF16:  # the top halves of finite floats are finite
        return (rng.standard_normal(n, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n // block_elems, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        blocks[:, off:off + 2] = rng.uniform(-2, 2, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(-1)


def sizes(qtype: T) -> list[int]:
    return [32, 96, 256, 512, 1024] if GGML_QUANT_SIZES[qtype][0] <= 32 else [256, 512, 1024]


def c_dequantize(qtype: int, raw: np.ndarray, n: int, out_len: int | None = None) -> tuple[int, np.ndarray]:
    out = np.full(n if out_len is None else out_len, np.nan, dtype=np.float32)
    rc = lib.sq_dequantize_row(int(qtype), ffi.from_buffer(raw), ffi.from_buffer("float[]", out), n)
    return rc, out


def c_dot(qtype: int, raw: np.ndarray, x: np.ndarray, n: int) -> float:
    return lib.sq_dot_row(int(qtype), ffi.from_buffer(raw), ffi.from_buffer("float[]", x), n)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_block_geometry(qtype):
    assert (lib.sq_block_elems(qtype), lib.sq_block_bytes(qtype)) == GGML_QUANT_SIZES[qtype]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    for n in sizes(qtype):
        for _ in range(3):
            raw = random_row(qtype, n, rng)
            # A longer output buffer checks that nothing is written past n.
            rc, out = c_dequantize(qtype, raw, n, out_len=n + 8)
            assert rc == 0
            ref = dequantize(raw, qtype).astype(np.float32, copy=False).reshape(-1)
            assert np.array_equal(out[:n], ref), f"{qtype.name} n={n}"
            assert np.isnan(out[n:]).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dot_matches_reference(qtype):
    rng = np.random.default_rng(100 + int(qtype))
    for n in sizes(qtype):
        for _ in range(3):
            raw = random_row(qtype, n, rng)
            x = rng.standard_normal(n, dtype=np.float32)
            w = dequantize(raw, qtype).astype(np.float64).reshape(-1)
            terms = w * x.astype(np.float64)
            got = c_dot(qtype, raw, x, n)
            # Error relative to sum |w_i x_i|, the scale of a float-accumulated sum's
            # rounding error; |exact| alone can be arbitrarily small through cancellation.
            assert abs(got - terms.sum()) <= 1e-5 * np.abs(terms).sum(), f"{qtype.name} n={n}"


def test_one_element_types_take_any_length():
    rng = np.random.default_rng(7)
    for qtype in (T.F32, T.F16, T.BF16):
        for n in (1, 7, 9, 255, 257, 1000):
            raw = random_row(qtype, n, rng)
            x = rng.standard_normal(n, dtype=np.float32)
            rc, out = c_dequantize(qtype, raw, n)
            assert rc == 0 and np.array_equal(out, dequantize(raw, qtype).reshape(-1))
            terms = out.astype(np.float64) * x
            assert abs(c_dot(qtype, raw, x, n) - terms.sum()) <= 1e-5 * np.abs(terms).sum()


def test_f16_all_bit_patterns():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    rc, out = c_dequantize(T.F16, bits.view(np.uint8), 65536)
    assert rc == 0
    ref = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(out), nan)
    # Bitwise, so that the sign of zero and every subnormal count.
    assert np.array_equal(out.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])


@pytest.mark.parametrize("qtype", [9, 99, -1, 4, 31, 1 << 20])
def test_unknown_type(qtype):
    raw = np.zeros(4096, dtype=np.uint8)
    x = np.zeros(256, dtype=np.float32)
    assert lib.sq_block_elems(qtype) == 0 and lib.sq_block_bytes(qtype) == 0
    assert c_dequantize(qtype, raw, 256)[0] == -1
    assert np.isnan(c_dot(qtype, raw, x, 256))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_bad_length(qtype):
    block_elems = GGML_QUANT_SIZES[qtype][0]
    raw = np.zeros(4096, dtype=np.uint8)
    x = np.zeros(512, dtype=np.float32)
    bad = [0, -block_elems] + ([block_elems + 1, block_elems // 2] if block_elems > 1 else [])
    for n in bad:
        rc, out = c_dequantize(qtype, raw, n, out_len=512)
        assert rc == -1 and np.isnan(out).all(), f"n={n}"
        assert np.isnan(c_dot(qtype, raw, x, n)), f"n={n}"
