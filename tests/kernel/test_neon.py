"""The NEON kernels (native/quants/arm/neon.c) on an emulated arm64 CPU.

The kernel is cross-compiled for aarch64 with zig's C compiler and run under unicorn (see
aarch64_kernel.py), through the same C entry points the Python side calls. For every
quantized type, on random blocks and on extreme codes, one row or many, one token or a
batch, the NEON path must give exactly the bits of the scalar definition (quants/types.h):
those of the scalar path of the same build (sq_set_simd(0)) and of this machine's native
kernel's scalar path, so that a model's products are the same on arm64 as on x86-64.
(The native SIMD paths have tests of their own; the reference here is the scalar code.)
"""

import subprocess
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from helpers.aarch64_kernel import CPU_BASELINE, CPU_DOTPROD, Aarch64Kernel, Build, build_kernel, require_tools
from helpers.run_once import once_per_run
from llm_smolq._kernel import ffi, lib
from test_quants import (ACT_GEOMETRY, GUARD, SIMD_TYPES, VEC_DOT_TYPE, activations, c_quantize, c_vec_dot,
                         extreme_row, float_rows, random_row)

BATCH_MIN_TOKENS = 2  # quants/dispatch.c's on NEON: from here on a batch takes the batch kernels
NEON_TILE = 32  # quants/arm/neon.c's TILE: the tokens a batch kernel decodes a block once for
FILLS = (0x00, 0xFF, 0x80, 0x7F)


@pytest.fixture(scope="session", params=[CPU_BASELINE, CPU_DOTPROD], ids=["armv8", "dotprod"])
def aarch64_build(request, tmp_path_factory):
    """The kernel built once per run for aarch64, warnings as errors: for
    baseline ARMv8-A, and with the dot-product extension (SDOT in quants/arm/neon.c's integer sums)."""
    try:
        require_tools()
    except ImportError as e:
        pytest.fail(str(e))
    def make(folder: Path) -> dict:
        try:
            built = build_kernel(folder, request.param)
        except subprocess.CalledProcessError as e:
            pytest.fail(f"aarch64 build failed:\n{e.stdout}{e.stderr}")
        return {"elf": str(built.elf), "flags": built.flags, "output": built.output}

    made = once_per_run(tmp_path_factory, f"aarch64-{request.param}", make)
    return Build(Path(made["elf"]), made["flags"], made["output"])


@pytest.fixture(scope="module")
def cpu(aarch64_build):
    return Aarch64Kernel(aarch64_build.elf)


@pytest.fixture
def emu(cpu):
    """The emulated kernel with an empty data region and the NEON path on."""
    cpu.reset()
    cpu.call("sq_set_simd", 1)
    return cpu


def bits(f: float) -> int:
    return int(np.float32(f).view(np.uint32))


def act_bytes(vtype: T, n: int) -> int:
    elems, size = ACT_GEOMETRY[vtype]
    return n // elems * size


def quantized(vtype: T, x: np.ndarray) -> np.ndarray:
    rc, buf = c_quantize(vtype, x)
    assert rc == 0
    return buf[:-GUARD]


def block_sizes(qtype: T) -> list[int]:
    """Row lengths: one block, a few, and a longer row."""
    qk = GGML_QUANT_SIZES[qtype][0]
    return [qk, 3 * qk, 8 * qk]


# --- The emulated entry points -------------------------------------------------------------


def emu_vec_dot(k: Aarch64Kernel, qtype: T, row: int, xq: int, n: int) -> int:
    return k.call_float_bits("sq_vec_dot", int(qtype), row, xq, n)


def emu_paths(k: Aarch64Kernel, fn, *args):
    """fn(k, *args) on the NEON path, then on the scalar path."""
    k.call("sq_set_simd", 1)
    neon = fn(k, *args)
    k.call("sq_set_simd", 0)
    scalar = fn(k, *args)
    k.call("sq_set_simd", 1)
    return neon, scalar


def native_scalar(fn, *args):
    """fn(*args) on the native kernel's scalar path, the definition; its setting is put back."""
    prev = lib.sq_set_simd(0)
    try:
        return fn(*args)
    finally:
        lib.sq_set_simd(prev)


def check_vec_dot(k: Aarch64Kernel, qtype: T, raw: np.ndarray, xq: np.ndarray, n: int, what: str) -> None:
    row_addr, xq_addr = k.put(raw), k.put(xq)
    neon, scalar = emu_paths(k, emu_vec_dot, qtype, row_addr, xq_addr, n)
    native = bits(native_scalar(c_vec_dot, qtype, raw, xq, n))
    assert neon == scalar, f"{qtype.name} {what}: NEON {neon:#010x} != scalar {scalar:#010x}"
    assert scalar == native, f"{qtype.name} {what}: emulated {scalar:#010x} != native scalar {native:#010x}"


# --- The build and the selection -------------------------------------------------------------


def test_aarch64_build_is_warning_clean(aarch64_build):
    """-Wall -Wextra -Werror for aarch64 (for each target CPU): the build succeeded, and said nothing."""
    assert {"-Wall", "-Wextra", "-Werror"} <= set(aarch64_build.flags)
    assert aarch64_build.output.strip() == ""


def test_simd_name(emu):
    assert emu.cstring(emu.call_ptr("sq_simd_name")) == "neon"
    assert emu.call("sq_set_simd", 0) == 1
    assert emu.cstring(emu.call_ptr("sq_simd_name")) == "scalar"
    assert emu.call("sq_set_simd", 0) == 0
    assert emu.call("sq_set_simd", 1) == 0
    assert emu.cstring(emu.call_ptr("sq_simd_name")) == "neon"


def test_smolq_simd_0_selects_scalar(aarch64_build):
    """The first use reads SMOLQ_SIMD from the environment, as on x86."""
    k = Aarch64Kernel(aarch64_build.elf, env={"LANG": "C", "SMOLQ_SIMD": "0"})
    assert k.cstring(k.call_ptr("sq_simd_name")) == "scalar"
    assert k.call("sq_set_simd", 1) == 0
    assert k.cstring(k.call_ptr("sq_simd_name")) == "neon"
    k = Aarch64Kernel(aarch64_build.elf, env={"SMOLQ_SIMD": "1"})
    assert k.cstring(k.call_ptr("sq_simd_name")) == "neon"


@pytest.mark.parametrize("vtype", [T.Q8_0, T.Q8_1, T.Q8_K, T.F16, T.BF16], ids=lambda t: t.name)
def test_quantize_row_matches_x86(emu, vtype):
    """The activation quantizers give the same bytes on both machines."""
    rng = np.random.default_rng(900 + int(vtype))
    n = 512
    for x in (activations(n, rng), np.zeros(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32) * 1e-3):
        size = act_bytes(vtype, n)
        src, dst = emu.put(x), emu.alloc(size + GUARD)
        emu.uc.mem_write(dst, b"\xab" * (size + GUARD))
        assert emu.call("sq_quantize_row", int(vtype), src, dst, n) == 0
        got = emu.read(dst, size + GUARD)
        assert got[:size] == quantized(vtype, x).tobytes(), vtype.name
        assert got[size:] == b"\xab" * GUARD


# --- vec_dot ---------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", SIMD_TYPES, ids=lambda t: t.name)
def test_vec_dot(emu, qtype):
    """Random rows, and every code byte at its extremes against activations at +-127."""
    rng = np.random.default_rng(1000 + int(qtype))
    vtype = VEC_DOT_TYPE[qtype]
    for n in block_sizes(qtype):
        for trial in range(3):
            raw = random_row(qtype, n, rng)
            check_vec_dot(emu, qtype, raw, quantized(vtype, activations(n, rng)), n, f"n={n} trial={trial}")
    n = 2 * GGML_QUANT_SIZES[qtype][0]
    for fill in FILLS:
        raw = extreme_row(qtype, n, fill, rng)
        xq = quantized(vtype, np.where(rng.random(n) < 0.5, -1.0, 1.0).astype(np.float32))
        check_vec_dot(emu, qtype, raw, xq, n, f"fill={fill:#x}")


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_vec_dot(emu, qtype):
    """The float types' vec_dots (quants/arm/float_dots.c): lengths around the 32 lanes and
    every 16-bit pattern, the definition's bits; a NaN anywhere gives a NaN (which one
    depends on the order a compiler gave an add's operands)."""
    rng = np.random.default_rng(1200 + int(qtype))
    for what, raw, xq in float_rows(qtype, rng):
        n = len(raw) // (4 if qtype == T.F32 else 2)
        neon, scalar = emu_paths(emu, emu_vec_dot, qtype, emu.put(raw), emu.put(xq), n)
        native = bits(native_scalar(c_vec_dot, qtype, raw, xq, n))
        got = np.array([neon, scalar, native], dtype=np.uint32).view(np.float32)
        if np.isnan(got[2]):
            assert np.isnan(got).all(), f"{qtype.name} {what}: NEON {got[0]}, scalar {got[1]}, native NaN"
        else:
            assert neon == scalar == native, f"{qtype.name} {what}: NEON {neon:#010x}, scalar {scalar:#010x}, native {native:#010x}"


def raw_activations(vtype: T, n: int, rng: np.random.Generator) -> np.ndarray:
    """Activation blocks with any codes, -128 too (which the quantizers never make), consistent
    sums, and finite scales."""
    elems, size = ACT_GEOMETRY[vtype]
    blocks = np.zeros((n // elems, size), dtype=np.uint8)
    codes = rng.integers(-128, 128, (n // elems, elems)).astype(np.int8)
    scale = rng.uniform(-2, 2, (n // elems, 1)).astype(np.float16)
    if vtype == T.Q8_K:
        blocks[:, :4] = rng.uniform(-1, 1, (n // elems, 1)).astype(np.float32).view(np.uint8)
        blocks[:, 4:260] = codes.view(np.uint8)
        bsums = codes.reshape(len(codes), 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
        blocks[:, 260:] = bsums.view(np.uint8)
    else:
        blocks[:, :2] = scale.view(np.uint8)
        if vtype == T.Q8_1:
            s = (scale.astype(np.float32) * codes.sum(axis=1, keepdims=True)).astype(np.float16)
            blocks[:, 2:4] = s.view(np.uint8)
        blocks[:, size - elems:] = codes.view(np.uint8)
    return blocks.reshape(-1)


@pytest.mark.parametrize("qtype", SIMD_TYPES, ids=lambda t: t.name)
def test_vec_dot_any_activation_codes(emu, qtype):
    """NEON widens every product, so it agrees with the scalar code for any activation codes,
    not only the quantizers' -127..127 (AVX2's maddubs may not: compared with x86's scalar path)."""
    rng = np.random.default_rng(1100 + int(qtype))
    vtype = VEC_DOT_TYPE[qtype]
    n = 2 * GGML_QUANT_SIZES[qtype][0]
    for fill in (None, *FILLS):
        raw = random_row(qtype, n, rng) if fill is None else extreme_row(qtype, n, fill, rng)
        xq = raw_activations(vtype, n, rng)
        neon, scalar = emu_paths(emu, emu_vec_dot, qtype, emu.put(raw), emu.put(xq), n)
        native = bits(native_scalar(c_vec_dot, qtype, raw, xq, n))
        assert neon == scalar == native, f"{qtype.name} fill={fill}"


@pytest.mark.parametrize("qtype", SIMD_TYPES, ids=lambda t: t.name)
def test_vec_dot_rows(emu, qtype):
    """sq_vec_dot_rows: a mat-vec's rows in one call, each row sq_vec_dot's bits."""
    rng = np.random.default_rng(1200 + int(qtype))
    n = 2 * GGML_QUANT_SIZES[qtype][0]
    n_rows = 5
    rows = np.stack([random_row(qtype, n, rng) for _ in range(n_rows)])
    xq = quantized(VEC_DOT_TYPE[qtype], activations(n, rng))
    rows_addr, xq_addr = emu.put(rows), emu.put(xq)

    def run(k):
        y = k.put(np.full(n_rows + 1, np.nan, dtype=np.float32))
        assert k.call("sq_vec_dot_rows", int(qtype), rows_addr, rows.shape[1], n_rows, xq_addr, n, y) == 0
        return np.frombuffer(k.read(y, 4 * (n_rows + 1)), dtype=np.float32)

    def native(_):
        y = np.full(n_rows + 1, np.nan, dtype=np.float32)
        assert lib.sq_vec_dot_rows(int(qtype), ffi.from_buffer(rows), rows.shape[1], n_rows, ffi.from_buffer(xq), n,
                                   ffi.from_buffer("float[]", y)) == 0
        return y

    neon, scalar = emu_paths(emu, run)
    assert np.isnan(neon[-1]) and np.isnan(scalar[-1])
    assert neon.tobytes() == scalar.tobytes(), qtype.name
    assert native_scalar(native, None).tobytes() == neon.tobytes(), qtype.name
    one = np.array([emu_vec_dot(emu, qtype, rows_addr + r * rows.shape[1], xq_addr, n) for r in range(n_rows)],
                   dtype=np.uint32)
    assert neon[:-1].view(np.uint32).tolist() == one.tolist(), qtype.name


# --- Batches ---------------------------------------------------------------------------------


def batch_inputs(qtype: T, n: int, n_rows: int, tokens: int, rng: np.random.Generator, fill=None):
    vtype = VEC_DOT_TYPE[qtype]
    if fill is None:
        rows = np.stack([random_row(qtype, n, rng) for _ in range(n_rows)])
        xq = np.stack([quantized(vtype, activations(n, rng)) for _ in range(tokens)])
    else:
        rows = np.stack([extreme_row(qtype, n, fill, rng) for _ in range(n_rows)])
        xq = np.stack([quantized(vtype, np.where(rng.random(n) < 0.5, -1.0, 1.0).astype(np.float32))
                       for _ in range(tokens)])
    return rows, xq


def emu_batch_rows(k: Aarch64Kernel, qtype: T, rows: np.ndarray, xq: np.ndarray, n: int, ldy: int) -> np.ndarray:
    """sq_vec_dot_batch_rows, or sq_vec_dot_batch for a single row; y[tokens][ldy] starts as NaN."""
    n_rows, tokens = len(rows), len(xq)
    rows_addr, xq_addr = k.put(rows), k.put(xq)
    y = k.put(np.full(tokens * ldy, np.nan, dtype=np.float32))
    if n_rows == 1:
        rc = k.call("sq_vec_dot_batch", int(qtype), rows_addr, xq_addr, xq.shape[1], tokens, n, y, ldy)
    else:
        rc = k.call("sq_vec_dot_batch_rows", int(qtype), rows_addr, rows.shape[1], n_rows, xq_addr, xq.shape[1],
                    tokens, n, y, ldy)
    assert rc == 0
    return np.frombuffer(k.read(y, 4 * tokens * ldy), dtype=np.float32).reshape(tokens, ldy)


def native_batch_rows(qtype: T, rows: np.ndarray, xq: np.ndarray, n: int, ldy: int) -> np.ndarray:
    n_rows, tokens = len(rows), len(xq)
    y = np.full(tokens * ldy, np.nan, dtype=np.float32)
    if n_rows == 1:
        rc = lib.sq_vec_dot_batch(int(qtype), ffi.from_buffer(rows), ffi.from_buffer(xq), xq.shape[1], tokens, n,
                                  ffi.from_buffer("float[]", y), ldy)
    else:
        rc = lib.sq_vec_dot_batch_rows(int(qtype), ffi.from_buffer(rows), rows.shape[1], n_rows, ffi.from_buffer(xq),
                                       xq.shape[1], tokens, n, ffi.from_buffer("float[]", y), ldy)
    assert rc == 0
    return y.reshape(tokens, ldy)


def check_batch(k, qtype, rows, xq, n, what):
    ldy = len(rows) + 2  # two columns that must stay NaN
    neon, scalar = emu_paths(k, emu_batch_rows, qtype, rows, xq, n, ldy)
    assert np.isnan(neon[:, len(rows):]).all() and np.isnan(scalar[:, len(rows):]).all(), what
    assert neon.tobytes() == scalar.tobytes(), f"{qtype.name} {what}: NEON != scalar"
    native = native_scalar(native_batch_rows, qtype, rows, xq, n, ldy)
    assert native.tobytes() == neon.tobytes(), f"{qtype.name} {what}: emulated != native scalar"


@pytest.mark.parametrize("qtype", SIMD_TYPES, ids=lambda t: t.name)
def test_vec_dot_batch(emu, qtype):
    """One row (sq_vec_dot_batch) and several (sq_vec_dot_batch_rows) times batches below
    and above BATCH_MIN_TOKENS, of sizes that are and are not multiples of 4 (every type's
    batch kernel fills a register's spare lanes) and past a tile of NEON_TILE tokens, each
    output the one-token definition's bits."""
    rng = np.random.default_rng(1300 + int(qtype))
    qk = GGML_QUANT_SIZES[qtype][0]
    for n_rows, tokens, n in ((1, 1, qk), (1, 3, qk), (1, 6, 3 * qk), (1, BATCH_MIN_TOKENS, 2 * qk), (1, 13, qk),
                              (3, 5, 2 * qk), (9, 13, qk), (8, 4, qk), (2, 12, qk), (3, NEON_TILE + 6, 2 * qk)):
        rows, xq = batch_inputs(qtype, n, n_rows, tokens, rng)
        check_batch(emu, qtype, rows, xq, n, f"rows={n_rows} tokens={tokens} n={n}")
        emu.reset()
    for fill in FILLS:
        for tokens in (5, 9):
            rows, xq = batch_inputs(qtype, qk, 2, tokens, rng, fill)
            check_batch(emu, qtype, rows, xq, qk, f"fill={fill:#x} tokens={tokens}")
            emu.reset()


def test_vec_dot_batch_bad_arguments(emu):
    """The emulated build rejects what the native one rejects, leaving y alone."""
    raw = emu.put(np.zeros(4096, dtype=np.uint8))
    y = emu.put(np.full(8, 7.0, dtype=np.float32))
    for qtype, n, tokens in ((T.Q6_K, 100, 8), (T.Q8_K, 256, 8), (99, 256, 8), (T.Q6_K, 256, -1)):
        assert emu.call("sq_vec_dot_batch", int(qtype), raw, raw, 292, tokens, n, y, 1) == -1
    assert emu.read(y, 32) == struct.pack("<8f", *[7.0] * 8)
    nan = emu.call_float_bits("sq_vec_dot", int(T.Q4_K), raw, raw, 100)
    assert np.isnan(np.uint32(nan).view(np.float32))


def act_rows(vtype: T, n: int, tokens: int, rng: np.random.Generator, raw: bool = False) -> np.ndarray:
    """[tokens][bytes] activation rows: quantized normal rows, or raw_activations' any codes."""
    make = (lambda: raw_activations(vtype, n, rng)) if raw else (lambda: quantized(vtype, activations(n, rng)))
    return np.stack([make() for _ in range(tokens)])


def batch_fn(qtype: T) -> str:
    """The name of qtype's NEON batch kernel: sq_batch_dot_q4_K_neon, sq_batch_dot_iq4_nl_neon."""
    name = qtype.name.lower()
    return f"sq_batch_dot_{name[:-1] + 'K' if name.endswith('_k') else name}_neon"


@pytest.mark.parametrize("qtype", SIMD_TYPES, ids=lambda t: t.name)
def test_batch_kernel_any_token_count(emu, qtype):
    """sq_batch_dot_<type>_neon called directly, for every token count from 1 to past a tile of
    NEON_TILE tokens (one the dispatcher never gives it, and each way of filling a register's
    lanes), on rows of one block and of several; every output the native scalar sq_vec_dot's
    bits, the y columns between them untouched. Raw activation codes (-128 included) and
    extreme weight codes too."""
    rng = np.random.default_rng(1400 + int(qtype))
    qk = GGML_QUANT_SIZES[qtype][0]
    vtype = VEC_DOT_TYPE[qtype]
    ldy = 3
    cases = [(tokens, 1 + tokens % 3, tokens % 5 == 0, None) for tokens in range(1, NEON_TILE + 7)]
    cases += [(NEON_TILE + 1, 2, True, fill) for fill in FILLS] + [(7, 2, False, fill) for fill in FILLS]
    for tokens, n_blocks, raw, fill in cases:
        n = n_blocks * qk
        row = random_row(qtype, n, rng) if fill is None else extreme_row(qtype, n, fill, rng)
        xq = act_rows(vtype, n, tokens, rng, raw)
        emu.reset()
        y = emu.put(np.full(tokens * ldy, np.nan, dtype=np.float32))
        emu.call(batch_fn(qtype), emu.put(row), emu.put(xq), xq.shape[1], tokens, n_blocks, y, ldy)
        got = np.frombuffer(emu.read(y, 4 * tokens * ldy), dtype=np.float32).reshape(tokens, ldy)
        what = f"{qtype.name} tokens={tokens} blocks={n_blocks} raw={raw} fill={fill}"
        assert np.isnan(got[:, 1:]).all(), what
        want = native_scalar(lambda: np.array([c_vec_dot(qtype, row, x, n) for x in xq], dtype=np.float32))
        assert got[:, 0].tobytes() == want.tobytes(), what
