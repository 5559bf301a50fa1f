"""The row decoders and dot products of native/quants/ against gguf's numpy reference, and
the llama.cpp path: activations quantized to a vec_dot type, then integer block dot products."""

import os
import platform
import sys

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from helpers.simd_paths import amx_runs, simd_paths

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


@pytest.mark.parametrize("qtype", [99, -1, 4, 5, 16, 31, 1 << 20])
def test_unknown_type(qtype):
    raw = np.zeros(4096, dtype=np.uint8)
    x = np.zeros(256, dtype=np.float32)
    assert lib.sq_block_elems(qtype) == 0 and lib.sq_block_bytes(qtype) == 0
    assert c_dequantize(qtype, raw, 256)[0] == -1
    assert np.isnan(c_dot(qtype, raw, x, 256))


# The weight types llm_smolq reads (model/tensor_types.py asks the kernel for them), in the kernel's order.
WEIGHT_TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
                T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]


def test_weight_types_are_the_supported_ones():
    """The kernel's own list (quants/types.h) of the types it reads as weights."""
    assert set(WEIGHT_TYPES) == set(TYPES)
    n = lib.sq_weight_types(ffi.NULL, 0)
    out = ffi.new("int[]", n + 1)
    out[n] = -7
    assert lib.sq_weight_types(out, n) == n
    assert list(out)[:n] == [int(t) for t in WEIGHT_TYPES] and out[n] == -7
    short = ffi.new("int[]", 4)
    assert lib.sq_weight_types(short, 3) == n  # the count, whatever fits
    assert list(short) == [int(t) for t in WEIGHT_TYPES[:3]] + [0]


@pytest.mark.parametrize("qtype", [*WEIGHT_TYPES, T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_type_name_is_the_gguf_name(qtype):
    assert ffi.string(lib.sq_type_name(qtype)).decode() == qtype.name


@pytest.mark.parametrize("qtype", [99, -1, 4, 5, 16, 29, 31, 1 << 20])
def test_type_name_of_unknown_type(qtype):
    assert lib.sq_type_name(qtype) == ffi.NULL


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


# ---------------------------------------------------------------------------
# The llama.cpp path: activations converted to the weight type's vec_dot type
# (sq_quantize_row), then multiplied block by block in integers (sq_vec_dot).
# ---------------------------------------------------------------------------

# ggml-cpu's type_traits_cpu[type].vec_dot_type for every weight type we read.
VEC_DOT_TYPE = {
    T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16,
    T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.IQ4_NL: T.Q8_0,
    T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1,
    T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K, T.IQ4_XS: T.Q8_K,
}
ACT_TYPES = [T.Q8_0, T.Q8_1, T.Q8_K, T.F16, T.BF16, T.F32]
# ggml's block sizes. gguf-py still lists Q8_1 as 40 bytes (the old float d and s);
# ggml's block_q8_1 has f16 d and s: 36.
ACT_GEOMETRY = {T.Q8_0: (32, 34), T.Q8_1: (32, 36), T.Q8_K: (256, 292),
                T.F16: (1, 2), T.BF16: (1, 2), T.F32: (1, 4)}
GUARD = 16  # bytes past a quantized row that must stay untouched


def c_quantize(vtype: int, x: np.ndarray, n: int | None = None) -> tuple[int, np.ndarray]:
    """sq_quantize_row into a fresh buffer; returns rc and the row's bytes plus GUARD guard bytes."""
    n = len(x) if n is None else n
    elems, size = ACT_GEOMETRY.get(vtype, (1, 4))
    nbytes = max(n, 0) // elems * size if elems else 0
    # float64 storage: 8-byte aligned, as Q8_K's float d needs.
    buf = np.full((nbytes + GUARD + 7) // 8, np.nan).view(np.uint8)[:nbytes + GUARD]
    buf[:] = 0xAB
    rc = lib.sq_quantize_row(int(vtype), ffi.from_buffer("float[]", x), ffi.from_buffer(buf), n)
    return rc, buf


def c_vec_dot(qtype: int, raw: np.ndarray, xq: np.ndarray, n: int) -> float:
    return lib.sq_vec_dot(int(qtype), ffi.from_buffer(raw), ffi.from_buffer(xq), n)


def activations(n: int, rng: np.random.Generator) -> np.ndarray:
    """Normal activations with a few outliers and an all-zero 32-block, as real rows have."""
    x = rng.standard_normal(n, dtype=np.float32)
    x[rng.integers(0, n, max(1, n // 100))] *= 20
    if n >= 64:
        x[32:64] = 0
    return x


def q8_0_fields(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = raw.reshape(-1, 34)
    return b[:, :2].copy().view(np.float16).astype(np.float32)[:, 0], b[:, 2:].view(np.int8)


def q8_1_fields(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b = raw.reshape(-1, 36)
    h = b[:, :4].copy().view(np.float16).astype(np.float32)
    return h[:, 0], h[:, 1], b[:, 4:].view(np.int8)


def q8_k_fields(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b = raw.reshape(-1, 292)
    return b[:, :4].copy().view(np.float32)[:, 0], b[:, 4:260].view(np.int8), b[:, 260:].copy().view(np.int16)


def test_vec_dot_type_table():
    for qtype in TYPES:
        assert lib.sq_vec_dot_type(qtype) == VEC_DOT_TYPE[qtype], qtype.name
    # Activation-only formats and unknown types have no vec_dot.
    for other in (T.Q8_1, T.Q8_K, 4, 5, 16, 31, 99, -1, 1 << 20):
        assert lib.sq_vec_dot_type(int(other)) == -1, other


@pytest.mark.parametrize("vtype", [T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_activation_geometry(vtype):
    assert (lib.sq_block_elems(vtype), lib.sq_block_bytes(vtype)) == ACT_GEOMETRY[vtype]


def test_dot_row_of_activation_formats():
    """sq_dot_row also takes Q8_1 and Q8_K rows: their decoded values times x."""
    rng = np.random.default_rng(86)
    for vtype in (T.Q8_1, T.Q8_K):
        raw = c_quantize(vtype, activations(1024, rng))[1][:-GUARD]
        x = rng.standard_normal(1024, dtype=np.float32)
        terms = c_dequantize(vtype, raw, 1024)[1].astype(np.float64) * x
        assert abs(c_dot(vtype, raw, x, 1024) - terms.sum()) <= 1e-5 * np.abs(terms).sum()


def test_quantize_q8_0_matches_gguf():
    """Bytes equal gguf's (= llama.cpp's reference C) except where rounding ties decide:
    llama.cpp's x86 code and ours multiply by 127/amax and round ties to even, gguf and the
    reference multiply by 1/(amax/127) and round ties away from zero."""
    rng = np.random.default_rng(80)
    n = 4096
    x = activations(n, rng)
    rc, buf = c_quantize(T.Q8_0, x)
    assert rc == 0 and (buf[-GUARD:] == 0xAB).all()
    ours = buf[:-GUARD].reshape(-1, 34)
    ref = quantize(x.reshape(-1, 32), T.Q8_0).reshape(-1, 34)
    assert np.array_equal(ours[:, :2], ref[:, :2])  # d = f16(amax / 127)
    q_ours, q_ref = ours[:, 2:].view(np.int8), ref[:, 2:].view(np.int8)
    amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(amax > 0, x.reshape(-1, 32) * 127.0 / amax, 0.0)
    near_tie = np.abs(np.abs(v) % 1 - 0.5) < 1e-4
    differ = q_ours != q_ref
    assert not (differ & ~near_tie).any()
    assert (np.abs(q_ours.astype(int) - q_ref) <= 1).all()
    # Exact ties: amax 127 makes the multiplier 1.
    ties = np.array([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5] + [0] * 24, dtype=np.float32)
    rc, buf = c_quantize(T.Q8_0, ties)
    assert list(buf[2:10].view(np.int8)) == [127, 0, 2, 2, 0, -2, -2, 126]
    assert list(quantize(ties, T.Q8_0)[2:10].view(np.int8)) == [127, 1, 2, 3, -1, -2, -3, 127]


def test_quantize_q8_0_is_llama_cpp_x86():
    """Exactly llama.cpp's AVX quantize_row_q8_0: codes rint(x * (127 / amax)) in float32."""
    rng = np.random.default_rng(85)
    x = activations(4096, rng).reshape(-1, 32)
    d16, q = q8_0_fields(c_quantize(T.Q8_0, x.reshape(-1))[1][:-GUARD])
    amax = np.abs(x).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        idv = np.where(amax > 0, np.float32(127) / amax, np.float32(0))
    assert np.array_equal(q, np.rint(x * idv).astype(np.int8))
    assert np.array_equal(d16, (amax[:, 0] / np.float32(127)).astype(np.float16).astype(np.float32))
    # A block where the multiplier matters: x * (127 / amax) is exactly 122.5 (ties to 122),
    # x * (1 / (amax / 127)) is 122.50001 (123 for gguf and llama.cpp's reference C).
    block = np.zeros(32, dtype=np.float32)
    block[:2] = [1.4099537134170532, 1.3599947690963745]
    assert list(q8_0_fields(c_quantize(T.Q8_0, block)[1][:-GUARD])[1][0, :2]) == [127, 122]
    assert list(quantize(block, T.Q8_0)[2:4].view(np.int8)) == [127, 123]


def test_quantize_q8_0_round_trip():
    rng = np.random.default_rng(81)
    x = activations(1024, rng)
    rc, buf = c_quantize(T.Q8_0, x)
    raw = buf[:-GUARD]
    d16, q = q8_0_fields(raw)
    rc, deq = c_dequantize(T.Q8_0, raw, len(x))
    assert rc == 0 and np.array_equal(deq, dequantize(raw, T.Q8_0).reshape(-1))
    assert np.array_equal(deq.reshape(-1, 32), d16[:, None] * q)
    d = np.abs(x.reshape(-1, 32)).max(axis=1).astype(np.float64) / 127
    # Half a step, plus what storing d as f16 moves the largest codes.
    tol = 0.5 * d + 127 * np.abs(d16 - d) + 1e-6 * d
    assert (np.abs(deq.reshape(-1, 32) - x.reshape(-1, 32)) <= tol[:, None]).all()


def test_quantize_q8_1():
    rng = np.random.default_rng(82)
    x = activations(1024, rng)
    rc, buf = c_quantize(T.Q8_1, x)
    assert rc == 0 and (buf[-GUARD:] == 0xAB).all()
    raw = buf[:-GUARD]
    d16, s16, q = q8_1_fields(raw)
    # Codes and d exactly as Q8_0's.
    rc0, buf0 = c_quantize(T.Q8_0, x)
    d0, q0 = q8_0_fields(buf0[:-GUARD])
    assert np.array_equal(q, q0) and np.array_equal(d16, d0)
    # s = f16(d * sum(q)) with the float32 d = amax / 127 before its f16 rounding.
    amax = np.abs(x.reshape(-1, 32)).max(axis=1)
    d32 = amax / np.float32(127)
    s_ref = (d32 * q.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float16).astype(np.float32)
    assert np.array_equal(s16, s_ref)
    rc, deq = c_dequantize(T.Q8_1, raw, len(x))
    assert rc == 0 and np.array_equal(deq.reshape(-1, 32), d16[:, None] * q)
    d = amax.astype(np.float64) / 127
    tol = 0.5 * d + 127 * np.abs(d16 - d) + 1e-6 * d
    assert (np.abs(deq.reshape(-1, 32) - x.reshape(-1, 32)) <= tol[:, None]).all()


def test_quantize_q8_k():
    rng = np.random.default_rng(83)
    n = 2048
    x = activations(n, rng)
    rc, buf = c_quantize(T.Q8_K, x)
    assert rc == 0 and (buf[-GUARD:] == 0xAB).all()
    raw = buf[:-GUARD]
    d, q, bsums = q8_k_fields(raw)
    xb = x.reshape(-1, 256)
    assert np.array_equal(bsums, q.reshape(-1, 16, 16).astype(np.int32).sum(axis=2))
    assert q.min() >= -127 and q.max() <= 127
    # The first element of largest magnitude becomes -127; d = 1 / (-127 / max) in float32.
    first = np.abs(xb).argmax(axis=1)
    mx = xb[np.arange(len(xb)), first]
    assert (q[np.arange(len(xb)), first] == -127).all()
    assert np.array_equal(d, np.float32(1) / (np.float32(-127) / mx))
    # Codes: round(iscale * x) with ties to even, computed in float32 as llama.cpp does.
    iscale = (np.float32(-127) / mx)[:, None]
    assert np.array_equal(q, np.minimum(np.rint(iscale * xb), 127).astype(np.int8))
    rc, deq = c_dequantize(T.Q8_K, raw, n)
    assert rc == 0 and np.array_equal(deq.reshape(-1, 256), d[:, None] * q)
    tol = np.abs(d.astype(np.float64)) * (0.5 + 1e-4)
    assert (np.abs(deq.reshape(-1, 256) - xb) <= tol[:, None]).all()


def test_quantize_q8_k_sign_ties():
    """Equal magnitudes of both signs: the first one decides the sign of d."""
    x = np.zeros(256, dtype=np.float32)
    x[5], x[9] = 2.0, -2.0
    d, q, _ = q8_k_fields(c_quantize(T.Q8_K, x)[1][:-GUARD])
    assert d[0] < 0 and q[0, 5] == -127 and q[0, 9] == 127
    x[5], x[9] = -2.0, 2.0
    d, q, _ = q8_k_fields(c_quantize(T.Q8_K, x)[1][:-GUARD])
    assert d[0] > 0 and q[0, 5] == -127 and q[0, 9] == 127


def test_quantize_float_formats():
    rng = np.random.default_rng(84)
    x = activations(999, rng)
    x[:4] = [65520.0, -1e-8, 3e-5, np.float32(1) + np.float32(2.0**-11)]  # overflow, subnormal, tie
    rc, buf = c_quantize(T.F16, x)
    assert rc == 0 and (buf[-GUARD:] == 0xAB).all()
    with np.errstate(over="ignore"):
        assert np.array_equal(buf[:-GUARD].view(np.uint16), x.astype(np.float16).view(np.uint16))
    rc, buf = c_quantize(T.BF16, x)
    assert rc == 0 and (buf[-GUARD:] == 0xAB).all()
    assert np.array_equal(buf[:-GUARD], quantize(x, T.BF16).view(np.uint8).reshape(-1))
    rc, buf = c_quantize(T.F32, x)
    assert rc == 0 and (buf[-GUARD:] == 0xAB).all()
    assert np.array_equal(buf[:-GUARD].view(np.float32), x)



@pytest.mark.may_skip_in_ci  # on a CPU without AVX2/FMA (x86-64) or NEON
def test_f16_conversion_gives_the_same_halves_on_every_path(simd_paths_of_cpu):
    """F16 rows (the F16 weights' activations, the F16 KV cache): every path's conversion
    gives the scalar one's halves, for a million random bit patterns (NaN payloads,
    infinities, subnormals, overflow) and the boundaries between halves, in rows whose
    length leaves a tail for the one-by-one code."""
    if not native_simd():
        pytest.skip("no SIMD path on this CPU (no AVX2/FMA)")
    rng = np.random.default_rng(86)
    edges = np.array([0x477FEFFF, 0x477FF000, 0x477FF001, 0x387FFFFF, 0x38800000, 0x33000000, 0x33000001,
                      0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x3F801000, 0x3F803000, 0], dtype=np.uint32)
    bits = np.concatenate([rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32), edges, edges | 0x80000000])
    x = bits[: len(bits) - 3].view(np.float32)
    halves = []
    for set_path in simd_paths_of_cpu:
        simd = set_path()
        rc, buf = c_quantize(T.F16, x)
        assert rc == 0 and (buf[-GUARD:] == 0xAB).all(), simd
        halves.append((simd, buf[:-GUARD].view(np.uint16)))
    want = halves[-1][1]
    for simd, got in halves[:-1]:
        wrong = np.flatnonzero(got != want)
        assert not len(wrong), f"{simd}: {len(wrong)} halves differ from the scalar conversion, first for bits {bits[wrong[0]]:#010x}"

def test_quantize_zero_rows():
    x = np.zeros(512, dtype=np.float32)
    x[300] = -0.0
    for vtype in (T.Q8_0, T.Q8_1, T.Q8_K):
        rc, buf = c_quantize(vtype, x)
        assert rc == 0 and (buf[:-GUARD] == 0).all() and (buf[-GUARD:] == 0xAB).all(), vtype.name
        rc, deq = c_dequantize(vtype, buf[:-GUARD], len(x))
        assert rc == 0 and (deq == 0).all()


def expected_vec_dot(qtype: T, raw: np.ndarray, xq: np.ndarray, n: int) -> np.ndarray:
    """Terms of the exact dot product of the dequantized rows, in float64.
    Q4_1/Q5_1 (as llama.cpp) take a block's offset term as m * s, with Q8_1's stored s
    in place of d * sum(q); that correction is returned as one extra term."""
    vtype = VEC_DOT_TYPE[qtype]
    w = dequantize(raw, qtype).astype(np.float64).reshape(-1)
    rc, xd = c_dequantize(vtype, xq, n)
    assert rc == 0
    terms = w * xd.astype(np.float64)
    if vtype == T.Q8_1:
        d16, s16, q = q8_1_fields(xq[:n // 32 * 36])
        m = raw.reshape(n // 32, -1)[:, 2:4].copy().view(np.float16).astype(np.float64)[:, 0]
        fix = m * (s16.astype(np.float64) - d16.astype(np.float64) * q.astype(np.int64).sum(axis=1))
        terms = np.append(terms, fix.sum())
    return terms


U = 2.0 ** -24  # float32's unit roundoff


def k_scale_min(scales: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: group j's 6-bit scale and min from each block's 12 scale bytes."""
    q = scales.astype(np.int64)
    if j < 4:
        return q[:, j] & 63, q[:, j + 4] & 63
    return (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4), (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)


def element_mins(qtype: T, raw: np.ndarray, n: int) -> np.ndarray:
    """Each weight's float offset (dmin * min, or Q4_1/Q5_1's m), float64; 0 for the types
    without one."""
    blocks = raw.reshape(n // GGML_QUANT_SIZES[qtype][0], -1)
    half = lambda at: blocks[:, at:at + 2].copy().view(np.float16).astype(np.float64)[:, 0]  # noqa: E731
    if qtype in (T.Q4_1, T.Q5_1):
        return np.repeat(half(2), 32)
    if qtype == T.Q2_K:
        return (half(82)[:, None] * (blocks[:, :16] >> 4).astype(np.float64)).repeat(16, axis=1).reshape(-1)
    if qtype in (T.Q4_K, T.Q5_K):
        mins = np.stack([k_scale_min(blocks[:, 4:16], j)[1] for j in range(8)], axis=1).astype(np.float64)
        return (half(2)[:, None] * mins).repeat(32, axis=1).reshape(-1)
    return np.zeros(n)


def rounding_bound(qtype: T, raw: np.ndarray, xq: np.ndarray, n: int) -> tuple[float, float]:
    """The exact dot product of the dequantized rows (float64) and a bound on how far the
    definition (native/quants/types.h) may round away from it, derived from its steps:
    every block step rounds its result once (u times each partial sum of its chain), each
    block's scale product and int-to-float conversion once each (2u times each block's
    value), the final sum or difference once; and gguf's float32 weights are off the exact
    ones by at most 3u (|w| + 2 |offset|) each (a scale product, the code's product, the
    offset's product and subtraction)."""
    terms = expected_vec_dot(qtype, raw, xq, n)
    exact = terms.sum()
    _, xd = c_dequantize(VEC_DOT_TYPE[qtype], xq, n)
    xd = xd.astype(np.float64)
    w = dequantize(raw, qtype).astype(np.float64).reshape(-1)
    qk = GGML_QUANT_SIZES[qtype][0]
    mins = element_mins(qtype, raw, n)
    if qtype in (T.Q4_1, T.Q5_1):  # the offset chain adds m * s, s Q8_1's stored sum
        d, s16, _ = q8_1_fields(xq[:n // 32 * 36])
        off = mins[::32] * s16.astype(np.float64)
    else:  # the offset chain takes dmin * min * (the group's activations)
        off = (mins * xd).reshape(-1, qk).sum(axis=1)
    blocks = terms[:n].reshape(-1, qk).sum(axis=1)
    if qtype in (T.Q4_1, T.Q5_1):
        blocks[-1] += terms[n:].sum()  # the Q8_1 correction (expected_vec_dot's extra term)
        codes = blocks - off
    else:
        codes = blocks + off  # the codes' chain; the row is codes - off
    partials = np.abs(np.cumsum(codes)).sum() + np.abs(np.cumsum(off)).sum()
    bound = (U * partials + 2 * U * (np.abs(codes).sum() + np.abs(off).sum())
             + 3 * U * ((np.abs(w) + 2 * np.abs(mins)) * np.abs(xd)).sum() + U * abs(exact)) * 1.01
    return exact, bound


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_vec_dot_matches_dequantized(qtype):
    """The definition against the exact dot product of the dequantized operands: within the
    bound its steps allow (rounding_bound) for the quantized types, and that bound is tight
    enough that moving a result by 1e-4 of itself leaves it, for three rows in four at least
    (the others are results much smaller than their terms); the float
    types within 1e-5 of sum |w * x|."""
    rng = np.random.default_rng(200 + int(qtype))
    vtype = VEC_DOT_TYPE[qtype]
    rows = tight = 0
    for n in sizes(qtype) + ([5, 33, 1000] if GGML_QUANT_SIZES[qtype][0] == 1 else [4096]):
        for _ in range(3):
            raw = random_row(qtype, n, rng)
            x = activations(n, rng)
            rc, buf = c_quantize(vtype, x)
            assert rc == 0
            xq = buf[:-GUARD]
            got = c_vec_dot(qtype, raw, xq, n)
            if GGML_QUANT_SIZES[qtype][0] == 1:
                terms = expected_vec_dot(qtype, raw, xq, n)
                assert abs(got - terms.sum()) <= 1e-5 * np.abs(terms).sum(), f"{qtype.name} n={n}"
            else:
                exact, bound = rounding_bound(qtype, raw, xq, n)
                assert abs(got - exact) <= bound, f"{qtype.name} n={n}: off by {abs(got - exact):.3g}, bound {bound:.3g}"
                rows += 1
                tight += abs(got * 1e-4) > 2 * bound  # a result moved by 1e-4 of itself would fail
            # Sanity: close to the float-activation dot product. (Without the outliers, which
            # coarsen a block's step enough to move a 32-element dot product by a few %.)
            x = rng.standard_normal(n, dtype=np.float32)
            xq = c_quantize(vtype, x)[1][:-GUARD]
            got, want = c_vec_dot(qtype, raw, xq, n), c_dot(qtype, raw, x, n)
            scale = np.abs(dequantize(raw, qtype).astype(np.float64).reshape(-1) * x).sum()
            assert abs(got - want) <= 1e-2 * scale, f"{qtype.name} n={n}"
    assert tight >= 0.75 * rows, f"{qtype.name}: the bound is loose: a 1e-4 move of the result passes in {rows - tight} of {rows} rows"


def extreme_row(qtype: T, n: int, fill: int, rng: np.random.Generator) -> np.ndarray:
    """A random row with every byte but the f16 scales set to fill (0x00, 0xFF, 0x80, 0x7F:
    the extreme codes and integer scales)."""
    raw = random_row(qtype, n, rng)
    blocks = raw.reshape(n // GGML_QUANT_SIZES[qtype][0], -1)
    keep = np.zeros(blocks.shape[1], dtype=bool)
    for off in F16_FIELDS[qtype]:
        keep[off:off + 2] = True
    blocks[:, ~keep] = fill
    return raw


@pytest.mark.parametrize("qtype", [t for t in TYPES if GGML_QUANT_SIZES[t][0] > 1], ids=lambda t: t.name)
def test_vec_dot_extreme_codes(qtype):
    """Code bytes all 0x00, 0xFF, 0x80 or 0x7F (the extreme codes and scales) against
    activations at +-127: nothing overflows the integer sums."""
    rng = np.random.default_rng(300 + int(qtype))
    n = 512
    vtype = VEC_DOT_TYPE[qtype]
    for fill in (0x00, 0xFF, 0x80, 0x7F):
        raw = extreme_row(qtype, n, fill, rng)
        x = np.where(rng.random(n) < 0.5, -1.0, 1.0).astype(np.float32)
        xq = c_quantize(vtype, x)[1][:-GUARD]
        terms = expected_vec_dot(qtype, raw, xq, n)
        got = c_vec_dot(qtype, raw, xq, n)
        assert abs(got - terms.sum()) <= 1e-5 * np.abs(terms).sum() + 1e-30, f"{qtype.name} fill={fill:#x}"


@pytest.mark.parametrize("qtype", [T.Q8_1, T.Q8_K, 4, 5, 16, 31, 99, -1, 1 << 20], ids=str)
def test_vec_dot_unknown_type(qtype):
    raw = np.zeros(4096, dtype=np.uint8)
    assert np.isnan(c_vec_dot(int(qtype), raw, raw, 256))


@pytest.mark.parametrize("vtype", [T.Q4_0, T.Q4_1, T.Q2_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, 4, 31, 99, -1, 1 << 20],
                         ids=str)
def test_quantize_unsupported_format(vtype):
    x = np.ones(256, dtype=np.float32)
    rc, buf = c_quantize(int(vtype), x)
    assert rc == -1 and (buf == 0xAB).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_vec_dot_bad_length(qtype):
    block_elems = GGML_QUANT_SIZES[qtype][0]
    vtype = VEC_DOT_TYPE[qtype]
    raw = np.zeros(4096, dtype=np.uint8)
    x = np.ones(512, dtype=np.float32)
    bad = [0, -block_elems] + ([block_elems + 1, block_elems // 2] if block_elems > 1 else [])
    for n in bad:
        assert np.isnan(c_vec_dot(qtype, raw, raw, n)), f"n={n}"
        rc, buf = c_quantize(vtype, x, n)
        assert rc == -1 and (buf == 0xAB).all(), f"n={n}"


# --- SIMD vec_dot (native/quants/x86/, native/quants/arm/), chosen at run time

SIMD_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
              T.IQ4_NL, T.IQ4_XS]


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def native_simd() -> str | None:
    """The SIMD path this machine's kernel takes: "neon" on arm64 (always there); on x86-64
    "avx512vnni" where the CPU has AVX-512 VNNI, VL and BW besides AVX2 and FMA, or has AVX2
    and FMA and the kernel is the SIMDe test build (SMOLQ_VNNI_VIA_SIMDE set, as
    tests/kernel/test_avx512vnni.py does), unless SMOLQ_SIMD=avx2; "amx" there with SMOLQ_SIMD=amx
    where the CPU has AMX (on Linux) or the build is that test build; "avx2" on other AVX2/FMA
    CPUs; else None. (tests/kernel/test_neon.py tests NEON anywhere.)"""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    flags = cpu_flags()
    if not {"avx2", "fma"} <= flags:
        return None
    if os.environ.get("SMOLQ_SIMD") == "amx" and amx_expected():
        return "amx"
    vnni = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags or bool(os.environ.get("SMOLQ_VNNI_VIA_SIMDE"))
    return "avx512vnni" if vnni and os.environ.get("SMOLQ_SIMD") != "avx2" else "avx2"


@pytest.fixture
def simd_paths_of_cpu(monkeypatch, simd_restore):
    """The setters of every path this CPU runs (helpers.simd_paths), the scalar one last;
    the path in use is restored afterwards."""
    paths = simd_paths(monkeypatch)
    if native_simd() in ("avx512vnni", "amx"):
        return paths
    avx2, scalar = paths[-2:]
    if os.environ.get("SMOLQ_SIMD") == "avx2":  # held to AVX2 on a CPU with more: that path alone
        return [avx2, scalar]
    return [paths[0], scalar] if native_simd() else [scalar]


def test_simd_name(simd_restore):
    name = ffi.string(lib.sq_simd_name()).decode()
    simd = native_simd()
    assert name in ("amx", "avx512vnni", "avx2", "neon", "scalar")
    if simd:
        # Unless the environment turned it off, as SMOLQ_SIMD=0 does.
        assert name == ("scalar" if os.environ.get("SMOLQ_SIMD") == "0" else simd)
        lib.sq_set_simd(1)
        assert ffi.string(lib.sq_simd_name()).decode() == simd
    prev = lib.sq_set_simd(0)
    assert prev == (1 if simd else 0)
    assert ffi.string(lib.sq_simd_name()) == b"scalar"
    assert lib.sq_set_simd(0) == 0


def amx_expected() -> bool:
    """Whether SMOLQ_SIMD=amx should give the AMX path: Linux on a CPU with AMX-TILE and
    AMX-INT8 (and the 512-bit code's instructions), or the SIMDe test build on an AVX2 CPU."""
    flags = cpu_flags()
    if not {"avx2", "fma"} <= flags:
        return False
    if os.environ.get("SMOLQ_VNNI_VIA_SIMDE"):
        return True
    return sys.platform == "linux" and {"amx_tile", "amx_int8", "avx512f", "avx512bw", "avx512vl",
                                        "avx512_vnni"} <= flags


def test_amx_is_taken_only_where_the_tiles_are():
    """SMOLQ_SIMD=amx on a CPU without the tiles: the best other path, never a crash."""
    if not amx_expected():
        assert not amx_runs()
    assert ffi.string(lib.sq_simd_name()).decode() != "amx" or os.environ.get("SMOLQ_SIMD") == "amx"


@pytest.mark.may_skip_in_ci  # on a CPU without AVX2/FMA (x86-64) or NEON
@pytest.mark.parametrize("qtype", SIMD_TYPES, ids=lambda t: t.name)
def test_simd_vec_dot_matches_scalar(qtype, simd_paths_of_cpu):
    """Every SIMD path's vec_dot has the scalar definition's bits (AVX2's serves both x86
    settings), on random rows and with every code byte at its extremes
    (nothing saturates in maddubs)."""
    if not native_simd():
        pytest.skip("no SIMD path on this CPU (no AVX2/FMA)")
    rng = np.random.default_rng(400 + int(qtype))
    vtype = VEC_DOT_TYPE[qtype]
    cases = []
    for n in sizes(qtype) + [4096]:
        for _ in range(3):
            cases.append((f"n={n}", n, random_row(qtype, n, rng), c_quantize(vtype, activations(n, rng))[1][:-GUARD]))
    for fill in (0x00, 0xFF, 0x80, 0x7F):
        x = np.where(rng.random(512) < 0.5, -1.0, 1.0).astype(np.float32)
        cases.append((f"fill={fill:#x}", 512, extreme_row(qtype, 512, fill, rng), c_quantize(vtype, x)[1][:-GUARD]))
    for what, n, raw, xq in cases:
        want = scalar_steps(qtype, raw[None], xq[None], n)[0, 0]
        for set_path in simd_paths_of_cpu[:-1]:
            simd = set_path()
            got = c_vec_dot(qtype, raw, xq, n)
            assert np.float32(got).tobytes() == want.tobytes(), f"{qtype.name} {what} simd={simd}"


def float_rows(qtype: T, rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(what, row, activations) of a float type: lengths around the 32 lanes, and every one
    of the 65,536 bit patterns of a 16-bit type (subnormals, infinities and NaNs; F32's
    edge values), each row in pairs of 1,024 against random activations."""
    unit = np.float32 if qtype == T.F32 else np.uint16
    cases = [(f"n={n}", random_row(qtype, n, rng), random_row(qtype, n, rng))
             for n in (1, 7, 31, 32, 33, 64, 95, 1000, 4096 + 7)]
    if qtype == T.F32:
        edges = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-39, np.finfo(np.float32).tiny, np.finfo(np.float32).max,
                          -np.finfo(np.float32).max, np.inf, -np.inf, np.nan], dtype=np.float32)
        every = np.resize(edges, 4096)
    else:
        every = np.arange(65536, dtype=np.uint16)
    every = rng.permutation(every)
    for at in range(0, len(every), 1024):
        row = every[at:at + 1024].astype(unit)
        cases.append((f"patterns {at}..", row.view(np.uint8), random_row(qtype, 1024, rng)))
    return cases


@pytest.mark.may_skip_in_ci  # on a CPU without AVX2/FMA (x86-64) or NEON
@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_simd_float_vec_dot_matches_scalar(qtype, simd_paths_of_cpu):
    """The float types' SIMD vec_dots (quants/x86/float_dots.c) have the definition's bits,
    in llama.cpp's 32-lane order; a NaN anywhere gives a NaN (which NaN depends on the order
    the compiler gave an add's operands, in the definition as here)."""
    if not native_simd():
        pytest.skip("no SIMD path on this CPU (no AVX2/FMA)")
    rng = np.random.default_rng(430 + int(qtype))
    for what, raw, xq in float_rows(qtype, rng):
        n = len(raw) // (4 if qtype == T.F32 else 2)
        simd_paths_of_cpu[-1]()
        want = np.float32(c_vec_dot(qtype, raw, xq, n))
        for set_path in simd_paths_of_cpu[:-1]:
            simd = set_path()
            got = np.float32(c_vec_dot(qtype, raw, xq, n))
            if np.isnan(want):
                assert np.isnan(got), f"{qtype.name} {what} simd={simd}: {got} where the definition gives NaN"
            else:
                assert got.tobytes() == want.tobytes(), f"{qtype.name} {what} simd={simd}: {got!r} != {want!r}"


# --- SIMD activation conversions (native/quants/x86/activations.c) -------------------------

F32_MAX = np.finfo(np.float32).max
# NaNs whose payloads reach the codes (scalar.c's nearest_int keeps a NaN's low bits):
# quiet and signalling, both signs, low bytes below, at and above Q8_K's clamp of 127.
NANS = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800005, 0x7FC000AB, 0xFFC0007F, 0x7FC00080,
                 0x7FC0017F, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)


def tie_blocks(qk: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Blocks whose values times their format's scale are exactly k + 0.5 for many k (the
    scale: Q8_0's and Q8_1's 127 / amax, Q8_K's -127 / max, max the first of the largest
    magnitude): scales of 1, 2, 1/2, 4 and -1 exactly, then scales of random blocks, with
    the values whose product with it rounds to k + 0.5 exactly."""
    blocks = []
    for top in (127.0, -127.0, 63.5, 254.0, -31.75, float(rng.uniform(1, 200)), float(rng.uniform(1e-3, 1))):
        scale = np.float32(127) / np.float32(abs(top)) if qk == 32 else np.float32(-127) / np.float32(top)
        halves = rng.integers(-127, 127, 4 * qk) + 0.5
        x = (halves / np.float64(scale)).astype(np.float32)
        x = x[(x * scale == halves) & (np.abs(x) < abs(top))][:qk - 1]
        assert len(x) >= qk // 2, "too few exact ties"
        b = np.zeros(qk, dtype=np.float32)
        b[1:1 + len(x)] = x
        b[0] = top
        blocks.append(rng.permutation(b) if qk == 32 else b)  # Q8_K's max stays first
    return blocks


def special_blocks(qk: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Finite blocks that are not ordinary rows: zeros of both signs, one huge value,
    subnormals and values so small that the scale overflows, the largest magnitude at the
    ends of registers and tied between signs."""
    normal = lambda: rng.standard_normal(qk).astype(np.float32)  # noqa: E731
    blocks = [np.zeros(qk, dtype=np.float32), np.full(qk, -0.0, dtype=np.float32),
              np.where(rng.random(qk) < 0.5, np.float32(-0.0), np.float32(0.0))]
    b = normal()
    b[rng.random(qk) < 0.3] = -0.0
    blocks.append(b)
    for huge in (1e30, -3e38, F32_MAX):
        b = normal()
        b[rng.integers(qk)] = huge
        blocks.append(b)
        b = np.zeros(qk, dtype=np.float32)
        b[rng.integers(qk)] = huge
        blocks.append(b)
    tiny = np.float32(1e-45)  # the smallest subnormal
    blocks += [normal() * np.float32(1e-39), normal() * np.float32(1e-37), np.full(qk, tiny, dtype=np.float32),
               np.where(rng.random(qk) < 0.5, -tiny, tiny).astype(np.float32)]
    b = normal() * np.float32(1e-40)
    b[rng.integers(qk)] = 1.0
    blocks.append(b)
    # Largest magnitudes whose d = amax / 127 is an f16 edge: 65520 (a tie that rounds to
    # inf), the largest finite f16, the smallest normal one, a subnormal one, half the
    # smallest subnormal (a tie that rounds to 0).
    for amax in (65520 * 127, 65504 * 127, 2.0**-14 * 127, 3e-6 * 127, 2.0**-25 * 127):
        b = normal()
        b *= np.float32(amax / 2) / np.abs(b).max()
        b[rng.integers(qk)] = -amax
        blocks.append(b.astype(np.float32))
    for at in (0, 7, 8, 31, qk - 1):
        b = normal() * np.float32(0.1)
        b[at] = 5.0 if at % 2 else -5.0
        blocks.append(b)
    for first, second in ((7, 8), (1, 9), (8, 7 + qk // 2), (qk - 2, qk - 1)):
        b = normal()
        top = 2 * np.abs(b).max()
        b[first], b[second] = top, -top
        blocks.append(b)
        b = normal()
        b[first], b[second] = -top, top
        blocks.append(b)
    return blocks


def non_finite_blocks(qk: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Blocks with NaNs of several payloads, infinities, or both, among ordinary values,
    zeros or subnormals."""
    blocks = []
    for base in (rng.standard_normal(qk).astype(np.float32), np.zeros(qk, dtype=np.float32),
                 rng.standard_normal(qk).astype(np.float32) * np.float32(1e-39)):
        for bad in ([np.inf], [-np.inf], [np.inf, -np.inf], [NANS[0]], NANS, [np.inf, *NANS[:3]]):
            b = base.copy()
            b[rng.choice(qk, len(bad), replace=False)] = bad
            blocks.append(b)
    blocks += [np.resize(NANS, qk), np.full(qk, np.inf, dtype=np.float32)]
    return blocks


def quantize_rows(qk: int, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """Rows for the conversions: random ones of lengths that leave every remainder of a
    group of eight 32-blocks, and rows of the blocks above, whole and in pieces of every
    length up to 19 blocks."""
    rows = []
    for blocks in ((1, 2, 3, 7, 8, 9, 15, 18, 19, 48, 65) if qk == 32 else (1, 2, 3, 6, 9)):
        rows += [(f"random n={blocks * qk}", activations(blocks * qk, rng)) for _ in range(2)]
    for what, blocks in (("ties", tie_blocks(qk, rng)), ("special", special_blocks(qk, rng)),
                         ("non-finite", non_finite_blocks(qk, rng))):
        for shift in (0, 1, 5):  # so that each block meets other lanes of a group of eight
            rows.append((f"{what} shift={shift}", np.concatenate(blocks[len(blocks) - shift:] + blocks)))
        mixed = [blocks[i] for i in rng.integers(0, len(blocks), 64)]
        start = 0
        for k in range(1, 20):
            rows.append((f"{what} {k} blocks", np.concatenate(mixed[start % 40:start % 40 + k])))
            start += k
    return rows


@pytest.mark.may_skip_in_ci  # on a CPU without AVX2/FMA (x86-64) or NEON
@pytest.mark.parametrize("vtype", [T.Q8_0, T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_simd_quantize_matches_scalar(vtype, simd_paths_of_cpu):
    """Every SIMD path converts activations to the scalar code's bytes: on random rows of
    many lengths, on exact rounding ties, zero and negative zero blocks, huge values,
    subnormals, and the largest magnitude tied between signs; and on NaNs and infinities,
    whose codes are unspecified, the same bytes too (the finite blocks are checked
    first, for a clearer message)."""
    if not native_simd():
        pytest.skip("no SIMD path on this CPU (no AVX2/FMA)")
    qk, size = ACT_GEOMETRY[vtype]
    for what, x in quantize_rows(qk, np.random.default_rng(500 + int(vtype))):
        simd_paths_of_cpu[-1]()
        rc, want = c_quantize(vtype, x)
        assert rc == 0
        want = want[:-GUARD].reshape(-1, size)
        finite = np.isfinite(x.reshape(-1, qk)).all(axis=1)
        for set_path in simd_paths_of_cpu[:-1]:
            simd = set_path()
            rc, got = c_quantize(vtype, x)
            assert rc == 0 and (got[-GUARD:] == 0xAB).all(), f"{vtype.name} {what} simd={simd}"
            differ = (got[:-GUARD].reshape(-1, size) != want).any(axis=1)
            assert not (differ & finite).any(), f"{vtype.name} {what} simd={simd}: finite blocks {np.flatnonzero(differ & finite)}"
            assert not differ.any(), f"{vtype.name} {what} simd={simd}: non-finite blocks {np.flatnonzero(differ)}"


# --- Batched products (sq_vec_dot_batch) --------------------------------------------------

# Batches from this many tokens take the tiled batch kernels (Q4_K four tokens at a time, Q6_K);
# smaller ones the kernels that keep each token's sums in registers: the same bits either way.
BATCH_MIN_TOKENS = 8


def c_vec_dot_batch(qtype: int, raw: np.ndarray, xq_rows: np.ndarray, n: int) -> np.ndarray:
    """sq_vec_dot_batch over the rows of xq_rows ([tokens][bytes]); y written with a stride
    of 3 so that a write to the wrong place shows."""
    y = np.full(3 * len(xq_rows), np.nan, dtype=np.float32)
    rc = lib.sq_vec_dot_batch(int(qtype), ffi.from_buffer(raw), ffi.from_buffer(xq_rows), xq_rows.shape[1],
                              len(xq_rows), n, ffi.from_buffer("float[]", y), 3)
    assert rc == 0
    assert np.isnan(y[1::3]).all() and np.isnan(y[2::3]).all()
    return y[::3]


def c_activations(vtype: int, x: np.ndarray) -> np.ndarray:
    """One activation row as the mat-vecs take it (sq_quantize_activations): the blocks, and
    after them Q8_0's offsets or Q8_K's sums of 32 codes."""
    size = lib.sq_activation_row_bytes(int(vtype), len(x))
    row = np.full((size + 7) // 8, np.nan).view(np.uint8)[:size]  # 8-byte aligned, as c_quantize's
    assert lib.sq_quantize_activations(int(vtype), ffi.from_buffer("float[]", x), ffi.from_buffer(row), len(x)) == 0
    return row


def quantized_rows(vtype: T, n: int, tokens: int, rng: np.random.Generator) -> np.ndarray:
    return np.stack([c_activations(vtype, activations(n, rng)) for _ in range(tokens)])


@pytest.mark.parametrize("vtype", ACT_TYPES, ids=lambda t: t.name)
def test_activation_rows_are_the_blocks_and_their_sums(vtype):
    """sq_quantize_activations writes sq_quantize_row's blocks, and after them for Q8_0 each
    block's offset (-128 times its codes' sum, an int32, from the first multiple of 4) and
    then its d as a float, for Q8_1 each block's d and s as floats, for Q8_K each block's
    eight sums of 32 codes (int16); nothing past sq_activation_row_bytes; both say -1 where
    sq_quantize_row fails."""
    rng = np.random.default_rng(77)
    elems, size = ACT_GEOMETRY[vtype]
    for n in (256, 512, 32 * 9, 2048):
        if n % elems:
            continue
        x = activations(n, rng)
        nb = n // elems
        blocks = c_quantize(vtype, x)[1][:nb * size]
        at = (nb * size + 3) // 4 * 4
        want = {T.Q8_0: at + 8 * nb, T.Q8_1: len(blocks) + 8 * nb, T.Q8_K: len(blocks) + 16 * nb}.get(vtype, len(blocks))
        assert lib.sq_activation_row_bytes(int(vtype), n) == want, f"n={n}"
        buf = np.full((want + GUARD + 7) // 8, np.nan).view(np.uint8)[:want + GUARD]
        buf[:] = 0xAB
        assert lib.sq_quantize_activations(int(vtype), ffi.from_buffer("float[]", x), ffi.from_buffer(buf), n) == 0
        assert buf[:nb * size].tobytes() == blocks.tobytes(), f"n={n}"
        assert (buf[want:] == 0xAB).all(), f"n={n}: written past the row"
        if vtype == T.Q8_0:
            d, q = q8_0_fields(blocks)
            got = buf[at:at + 4 * nb].copy().view("<i4")
            assert (got == -128 * q.astype(np.int32).sum(axis=1)).all(), f"n={n}"
            assert buf[at + 4 * nb:want].copy().view("<f4").tobytes() == d.tobytes(), f"n={n}"
        if vtype == T.Q8_1:
            d, s, _ = q8_1_fields(blocks)
            got = buf[len(blocks):want].copy().view("<f4").reshape(nb, 2)
            assert got.tobytes() == np.stack([d, s], axis=1).tobytes(), f"n={n}"
        if vtype == T.Q8_K:
            _, q, _ = q8_k_fields(blocks)
            got = buf[len(blocks):want].copy().view("<i2").reshape(nb, 8)
            assert (got == q.astype(np.int32).reshape(nb, 8, 32).sum(axis=2)).all(), f"n={n}"
    assert lib.sq_activation_row_bytes(int(vtype), 3 if elems > 1 else -1) == -1
    assert lib.sq_activation_row_bytes(int(T.Q4_0), 256) == -1  # not an activation format


def scalar_steps(qtype: T, rows: np.ndarray, xq: np.ndarray, n: int) -> np.ndarray:
    """[tokens][rows] of the scalar sq_vec_dot, the definition, whatever path was in use."""
    was = lib.sq_set_simd(0)
    try:
        return np.array([[c_vec_dot(qtype, row, x, n) for row in rows] for x in xq], dtype=np.float32)
    finally:
        lib.sq_set_simd(was)


@pytest.mark.parametrize("qtype", [t for t in TYPES if GGML_QUANT_SIZES[t][0] > 1], ids=lambda t: t.name)
def test_vec_dot_batch_is_vec_dot_token_by_token(qtype, simd_paths_of_cpu):
    """Every output of a batch has the scalar sq_vec_dot's bits, below and past the batch
    kernels' thresholds (Q4_K's four tokens at a time, the tiled 8) and their 64-token
    tiles, on every path."""
    rng = np.random.default_rng(500 + int(qtype))
    vtype = VEC_DOT_TYPE[qtype]
    n = max(sizes(qtype))
    raw = random_row(qtype, n, rng)
    for set_path in simd_paths_of_cpu:
        simd = set_path()
        for tokens in (1, BATCH_MIN_TOKENS - 1, BATCH_MIN_TOKENS, 13, 70):
            xq = quantized_rows(vtype, n, tokens, rng)
            got = c_vec_dot_batch(qtype, raw, xq, n)
            want = scalar_steps(qtype, raw[None], xq, n)[:, 0]
            assert got.tobytes() == want.tobytes(), f"{qtype.name} tokens={tokens} simd={simd}"


@pytest.mark.parametrize("qtype", [t for t in TYPES if GGML_QUANT_SIZES[t][0] > 1], ids=lambda t: t.name)
def test_vec_dot_batch_extreme_codes(qtype, simd_paths_of_cpu):
    """The batch kernels' integer sums with every code byte at its extremes: nothing
    saturates, every output the scalar definition's."""
    rng = np.random.default_rng(600 + int(qtype))
    n, vtype = 512, VEC_DOT_TYPE[qtype]
    for fill in (0x00, 0xFF, 0x80, 0x7F):
        raw = extreme_row(qtype, n, fill, rng)
        xq = np.stack([c_quantize(vtype, np.where(rng.random(n) < 0.5, -1.0, 1.0).astype(np.float32))[1][:-GUARD]
                       for _ in range(BATCH_MIN_TOKENS)])
        want = scalar_steps(qtype, raw[None], xq, n)[:, 0]
        for t, row in enumerate(xq):
            terms = expected_vec_dot(qtype, raw, row, n)
            assert abs(want[t] - terms.sum()) <= 1e-5 * np.abs(terms).sum() + 1e-30, f"{qtype.name} fill={fill:#x}"
        for set_path in simd_paths_of_cpu:
            simd = set_path()
            assert c_vec_dot_batch(qtype, raw, xq, n).tobytes() == want.tobytes(), f"{qtype.name} {fill:#x} {simd}"


def test_vec_dot_batch_bad_arguments():
    raw = np.zeros(4096, dtype=np.uint8)
    y = np.full(8, 7.0, dtype=np.float32)
    for qtype, n, tokens in ((T.Q6_K, 100, 8), (T.Q8_K, 256, 8), (99, 256, 8), (T.Q6_K, 256, -1)):
        rc = lib.sq_vec_dot_batch(int(qtype), ffi.from_buffer(raw), ffi.from_buffer(raw), 292, tokens, n,
                                  ffi.from_buffer("float[]", y), 1)
        assert rc == -1 and (y == 7.0).all(), (qtype, n, tokens)


# --- Mat-vec rows (sq_vec_dot_rows) ---------------------------------------------------------


@pytest.mark.parametrize("qtype", [t for t in TYPES if t in VEC_DOT_TYPE], ids=lambda t: t.name)
def test_vec_dot_rows_is_vec_dot_row_by_row(qtype, simd_restore):
    """Every row gets exactly sq_vec_dot's bits, on both paths, whatever the row count."""
    rng = np.random.default_rng(700 + int(qtype))
    n = max(sizes(qtype))
    xq = c_quantize(VEC_DOT_TYPE[qtype], activations(n, rng))[1][:-GUARD]
    for simd in (1, 0) if native_simd() else (0,):
        lib.sq_set_simd(simd)
        for n_rows in (1, 3, 4, 5, 8, 11):
            rows = np.stack([random_row(qtype, n, rng) for _ in range(n_rows)])
            y = np.full(n_rows + 1, np.nan, dtype=np.float32)
            rc = lib.sq_vec_dot_rows(int(qtype), ffi.from_buffer(rows), rows.shape[1], n_rows, ffi.from_buffer(xq),
                                     n, ffi.from_buffer("float[]", y))
            assert rc == 0 and np.isnan(y[-1])
            single = np.array([c_vec_dot(qtype, row, xq, n) for row in rows], dtype=np.float32)
            assert y[:-1].tobytes() == single.tobytes(), f"{qtype.name} rows={n_rows} simd={simd}"


def test_vec_dot_rows_bad_arguments():
    raw = np.zeros(4096, dtype=np.uint8)
    y = np.full(8, 7.0, dtype=np.float32)
    for qtype, n, n_rows in ((T.Q4_1, 100, 4), (T.Q8_K, 256, 4), (99, 256, 4), (T.Q4_1, 256, -1)):
        rc = lib.sq_vec_dot_rows(int(qtype), ffi.from_buffer(raw), 160, n_rows, ffi.from_buffer(raw), n,
                                 ffi.from_buffer("float[]", y))
        assert rc == -1 and (y == 7.0).all(), (qtype, n, n_rows)


def assert_batch_rows_on_every_path(qtype, rows: np.ndarray, xq: np.ndarray, n: int, paths, label: str) -> None:
    """sq_vec_dot_batch_rows of rows times the activation rows xq on each path: every output
    the scalar definition's bits, and y written only where it should be."""
    n_rows, tokens = rows.shape[0], xq.shape[0]
    want = scalar_steps(qtype, rows, xq, n)
    for set_path in paths:
        simd = set_path()
        ldy = n_rows + 2
        y = np.full(tokens * ldy, np.nan, dtype=np.float32)
        rc = lib.sq_vec_dot_batch_rows(int(qtype), ffi.from_buffer(rows), rows.shape[1], n_rows,
                                       ffi.from_buffer(xq), xq.shape[1], tokens, n, ffi.from_buffer("float[]", y), ldy)
        assert rc == 0
        y = y.reshape(tokens, ldy)
        assert np.isnan(y[:, n_rows:]).all()
        assert y[:, :n_rows].tobytes() == want.tobytes(), f"{qtype.name} {label} simd={simd}"


@pytest.mark.parametrize("qtype", [t for t in TYPES if t in VEC_DOT_TYPE], ids=lambda t: t.name)
def test_vec_dot_batch_rows_is_vec_dot_token_by_token(qtype, simd_paths_of_cpu):
    """Rows times a batch: every output exactly the scalar sq_vec_dot's bits, for token
    counts below and past the batch kernels' thresholds (Q4_K's 4, the tiled 8) and tiles
    (8 tokens per row, 16 per eight rows, 64 in the tiled kernels, 128 in a prompt's eight
    or sixteen Q4_1 rows, 512 in the spans of AVX2's eight Q6_K rows), rows by sixteens,
    eights and left over, rows longer than the kernels' chunks of blocks (32, or 4 for
    Q6_K) and ending in a part of one, on every path (the VNNI and the AVX2 copy where the
    CPU has both); y is written only where it should be."""
    rng = np.random.default_rng(900 + int(qtype))
    vtype = VEC_DOT_TYPE[qtype]
    cases = [(max(sizes(qtype)), n_rows, tokens)
             for n_rows, tokens in ((5, 1), (3, 3), (8, 4), (4, 7), (9, 9), (17, 2), (16, 17), (25, 9), (17, 13),
                                    (9, 35), (27, 70), (40, 22))]
    cases += [(32 * GGML_QUANT_SIZES[qtype][0] + 2 * max(sizes(qtype)), n_rows, 3) for n_rows in (8, 17)]
    cases += [(37 * GGML_QUANT_SIZES[qtype][0], 17, 5)]  # a chunk and a part of one
    cases += [(37 * GGML_QUANT_SIZES[qtype][0], 17, 131)]  # past the 128-token tiles, chunks and parts of them
    cases += [(256, 9, 515)]  # past the 512-token spans whose chains AVX2's eight Q6_K rows keep apart from y
    if GGML_QUANT_SIZES[qtype][0] == 1:  # the float kernels' tokens widened 1,024 at a time: two, a part, a tail
        cases += [(2 * 1024 + 96 + 7, 16, 6)]
    for n, n_rows, tokens in cases:
        rows = np.stack([random_row(qtype, n, rng) for _ in range(n_rows)])
        xq = quantized_rows(vtype, n, tokens, rng)
        assert_batch_rows_on_every_path(qtype, rows, xq, n, simd_paths_of_cpu, f"rows={n_rows} tokens={tokens}")


@pytest.mark.parametrize("qtype", [t for t in TYPES if GGML_QUANT_SIZES[t][0] > 1], ids=lambda t: t.name)
def test_vec_dot_batch_rows_extreme_codes(qtype, simd_paths_of_cpu):
    """Rows times a batch with every code byte at its extremes (each row of a group of
    sixteen with its own fill, so that every lane of the sixteen-row kernels meets each),
    against activations at +-127 of one sign throughout (the bsums at their extremes) or of
    both, in the few tokens' tiles and a prompt's: nothing saturates or wraps in the integer
    sums or in the offsets taken through the bsums; every output the scalar definition's."""
    rng = np.random.default_rng(1000 + int(qtype))
    n, vtype, n_rows = 512, VEC_DOT_TYPE[qtype], 17
    fills = (0x00, 0xFF, 0x80, 0x7F)
    rows = np.stack([extreme_row(qtype, n, fills[(r + r // 4) % 4], rng) for r in range(n_rows)])
    signs = [np.ones(n), -np.ones(n)] + [np.where(rng.random(n) < 0.5, -1.0, 1.0) for _ in range(5)]
    for tokens in (9, 70):
        xq = np.stack([c_quantize(vtype, signs[t % len(signs)].astype(np.float32))[1][:-GUARD] for t in range(tokens)])
        assert_batch_rows_on_every_path(qtype, rows, xq, n, simd_paths_of_cpu, f"tokens={tokens}")
