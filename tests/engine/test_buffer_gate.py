"""kernel.attention through the buffer gate: the reference's numbers for every layout the
gate lets through, and a clear error naming the argument for every layout it refuses."""

from __future__ import annotations

import mmap
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided

from llm_smolq import DeviceError, LayoutError
from llm_smolq.engine import buffer_gate as gate
from llm_smolq._kernel import ffi
from llm_smolq.kernel import attention


def test_kernel_is_an_attribute_of_the_package():
    # As the README spells it, in a fresh interpreter where nothing imported the module yet.
    code = "import llm_smolq; print(llm_smolq.kernel.attention.__name__)"
    run = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
                         capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "attention", run.stderr[-3000:]


def reference_attention(q, k_cache, v_cache, n_past: int) -> np.ndarray:
    """GQA decode attention in float64, the plain way: scores, softmax, weighted sum."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k_cache, v_cache))
    n_heads, head_dim = q.shape
    group = n_heads // k.shape[0]
    out = np.empty((n_heads, head_dim))
    for h in range(n_heads):
        keys, values = k[h // group, :n_past], v[h // group, :n_past]
        scores = keys @ q[h] / np.sqrt(head_dim)
        p = np.exp(scores - scores.max())
        out[h] = (p / p.sum()) @ values
    return out


def assert_matches(out, q, k, v, n_past) -> None:
    ref = reference_attention(q, k, v, n_past)
    scale = float(np.abs(np.asarray(v, dtype=np.float64)).max()) or 1.0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * scale)


def make(n_heads=8, n_kv_heads=2, n_ctx=32, head_dim=64, kv_dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_heads, head_dim), dtype=np.float32)
    k = rng.standard_normal((n_kv_heads, n_ctx, head_dim), dtype=np.float32).astype(kv_dtype)
    v = rng.standard_normal((n_kv_heads, n_ctx, head_dim), dtype=np.float32).astype(kv_dtype)
    return q, k, v


def raises(error, *names: str):
    """pytest.raises that also checks the message names every one of `names`."""

    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(error)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            for name in names:
                assert name in str(self.info.value), f"{name!r} not in: {self.info.value}"
            return handled

    return Check()


# Correct numbers -------------------------------------------------------------------------


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    "n_heads,n_kv_heads,head_dim",
    [(4, 4, 64), (8, 4, 128), (8, 2, 64), (16, 4, 128), (9, 3, 64), (4, 1, 80)],
)
@pytest.mark.parametrize("n_past", [1, 13, 32])
def test_matches_reference(kv_dtype, n_heads, n_kv_heads, head_dim, n_past):
    q, k, v = make(n_heads, n_kv_heads, 32, head_dim, kv_dtype)
    out = attention(q, k, v, n_past)
    assert out.shape == (n_heads, head_dim) and out.dtype == np.float32
    assert_matches(out, q, k, v, n_past)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_wide_group_and_head_dim(kv_dtype):
    """A group of 20 query heads (more than the C side walks at once) and a head_dim of
    300 (more than it widens from F16 at once)."""
    q, k, v = make(n_heads=20, n_kv_heads=1, n_ctx=24, head_dim=300, kv_dtype=kv_dtype)
    assert_matches(attention(q, k, v, 17), q, k, v, 17)


def test_n_past_one_returns_the_first_value_row():
    q, k, v = make(n_heads=4, n_kv_heads=2)
    out = attention(q, k, v, 1)
    np.testing.assert_array_equal(out, np.repeat(v[:, 0], 2, axis=0))


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_rising_and_large_scores(kv_dtype):
    """Every key beats the running max (a rescale each step), and the scores reach ~200,
    where exp() of an unshifted score overflows float32."""
    head_dim, n_ctx = 64, 200
    q = np.ones((2, head_dim), dtype=np.float32)
    ramp = np.linspace(0.0, 200.0 / np.sqrt(head_dim), n_ctx, dtype=np.float32)
    k = np.broadcast_to(ramp[None, :, None], (1, n_ctx, head_dim)).astype(kv_dtype)
    v = np.random.default_rng(1).standard_normal((1, n_ctx, head_dim)).astype(kv_dtype)
    out = attention(q, k, v, n_ctx)
    assert np.isfinite(out).all()
    assert_matches(out, q, k, v, n_ctx)


def test_long_context():
    q, k, v = make(n_heads=16, n_kv_heads=4, n_ctx=1024, head_dim=128, seed=3)
    assert_matches(attention(q, k, v, 1000), q, k, v, 1000)


def test_out_is_filled_and_returned():
    q, k, v = make()
    out = np.full(q.shape, np.nan, dtype=np.float32)
    assert attention(q, k, v, 20, out=out) is out
    assert_matches(out, q, k, v, 20)


def test_inputs_are_not_modified():
    q, k, v = make(kv_dtype=np.float16)
    copies = [a.copy() for a in (q, k, v)]
    attention(q, k, v, 32)
    for before, after in zip(copies, (q, k, v)):
        np.testing.assert_array_equal(before, after)


def test_offset_views_read_exactly_their_own_elements():
    q, k, v = make(n_heads=8, n_kv_heads=2)
    big_q = np.random.default_rng(5).standard_normal((12, 64), dtype=np.float32)
    big_q[2:10] = q
    big_k = np.zeros((4, 32, 64), np.float32)
    big_v = np.zeros((4, 32, 64), np.float32)
    big_k[1:3], big_v[1:3] = k, v
    big_k[0] = big_v[0] = 1e6  # anything read from the wrong head shows
    out = attention(big_q[2:10], big_k[1:3], big_v[1:3], 32)
    assert_matches(out, q, k, v, 32)


def test_read_only_inputs_are_fine():
    q, k, v = make()
    for a in (q, k, v):
        a.flags.writeable = False
    assert_matches(attention(q, k, v, 7), q, k, v, 7)


def test_buffer_protocol_input_and_cpu_dlpack_object():
    q, k, v = make()
    out = attention(memoryview(q), CpuForeign(k), v, 9)
    assert_matches(out, q, k, v, 9)


def test_aligned_offset_in_a_foreign_buffer_is_fine():
    q, k, v = make()
    raw = bytearray(q.nbytes + 8)
    qv = np.frombuffer(raw, np.float32, count=q.size, offset=8).reshape(q.shape)
    qv[...] = q
    assert_matches(attention(qv, k, v, 5), q, k, v, 5)


# Device ----------------------------------------------------------------------------------


class FakeCuda:
    """A GPU tensor as far as the gate can tell. Converting it would be a bug."""

    def __init__(self, device=(2, 0)):
        self.device = device

    def __dlpack_device__(self):
        return self.device

    def __array__(self, dtype=None, copy=None):
        raise AssertionError("the gate converted GPU memory before checking its device")


class FakeNumbaCuda:
    __cuda_array_interface__ = {
        "shape": (8, 64), "typestr": "<f4", "data": (0, False), "version": 3,
    }

    def __array__(self, dtype=None, copy=None):
        raise AssertionError("the gate converted GPU memory before checking its device")


@pytest.mark.parametrize("arg", ["q", "k_cache", "v_cache", "out"])
def test_cuda_tensor_is_a_device_error(arg):
    q, k, v = make()
    args = {"q": q, "k_cache": k, "v_cache": v, "out": None, arg: FakeCuda()}
    with raises(DeviceError, arg, "cuda:0", ".cpu()"):
        attention(args["q"], args["k_cache"], args["v_cache"], 4, out=args["out"])


def test_device_is_checked_before_other_arguments_dtype():
    q, k, v = make()
    with raises(DeviceError, "v_cache", "cuda:1"):
        attention(q.astype(np.float64), k, FakeCuda((2, 1)), 4)


@pytest.mark.parametrize(
    "device,word", [((10, 0), "rocm:0"), ((8, 0), "metal:0"), ((3, 0), "cuda_host:0")]
)
def test_other_devices(device, word):
    q, k, v = make()
    with raises(DeviceError, "q", word):
        attention(FakeCuda(device), k, v, 4)


def test_cuda_array_interface_is_a_device_error():
    q, k, v = make()
    with raises(DeviceError, "q", "CUDA"):
        attention(FakeNumbaCuda(), k, v, 4)


# Layout ----------------------------------------------------------------------------------


def test_strided_cache_is_refused():
    q, k, v = make(n_ctx=64)
    with raises(LayoutError, "k_cache", "C-contiguous", "ascontiguousarray"):
        attention(q, k[:, ::2], v[:, ::2], 4)


def test_cache_sliced_along_positions_is_refused():
    q, k, v = make()
    with raises(LayoutError, "v_cache", "C-contiguous"):
        attention(q, k[:, :16].copy(), v[:, :16], 4)


def test_transposed_q_is_refused():
    q, k, v = make()
    with raises(LayoutError, "q", "C-contiguous"):
        attention(np.ascontiguousarray(q.T).T, k, v, 4)


def test_view_reaching_outside_its_buffer_is_refused():
    q, k, v = make()
    small = np.zeros(q.size // 2, np.float32)
    with raises(LayoutError, "q", "outside"):
        attention(as_strided(small, shape=q.shape, strides=q.strides), k, v, 4)


@pytest.mark.parametrize(
    "arg,bad,words",
    [
        ("q", lambda a: a.astype(np.float64), ["float64", "float32", "astype"]),
        ("q", lambda a: a.astype(np.float16), ["float16", "float32"]),
        ("q", lambda a: a.astype(">f4"), ["big-endian", "astype"]),
        ("k_cache", lambda a: a.astype(np.float64), ["float32 or float16"]),
        ("k_cache", lambda a: a.astype(">f2"), ["big-endian"]),
        ("v_cache", lambda a: a.astype(np.float16), ["float16", "k_cache", "same dtype"]),
        ("q", lambda a: a.tolist(), ["float64", "float32"]),  # no silent casting of lists
        ("q", lambda a: a.astype(np.int32), ["int32"]),
    ],
)
def test_wrong_dtype(arg, bad, words):
    q, k, v = make()
    args = {"q": q, "k_cache": k, "v_cache": v}
    args[arg] = bad(args[arg])
    with raises(LayoutError, arg, *words):
        attention(args["q"], args["k_cache"], args["v_cache"], 4)


def misaligned(a: np.ndarray, offset: int = 1) -> np.ndarray:
    raw = bytearray(a.nbytes + offset)
    view = np.frombuffer(raw, a.dtype, count=a.size, offset=offset).reshape(a.shape)
    view[...] = a
    return view


def test_misaligned_float32_is_refused():
    q, k, v = make()
    with raises(LayoutError, "q", "4 bytes", "np.array(q)"):
        attention(misaligned(q), k, v, 4)


def test_misaligned_float16_is_refused():
    q, k, v = make(kv_dtype=np.float16)
    with raises(LayoutError, "k_cache", "2 bytes"):
        attention(q, misaligned(k, 3), v, 4)


def test_misaligned_out_is_refused():
    q, k, v = make()
    with raises(LayoutError, "out", "4 bytes"):
        attention(q, k, v, 4, out=misaligned(np.zeros_like(q), 2))


def test_read_only_out_is_refused():
    q, k, v = make()
    out = np.zeros_like(q)
    out.flags.writeable = False
    with raises(LayoutError, "out", "read-only"):
        attention(q, k, v, 4, out=out)


def test_out_must_be_an_ndarray():
    q, k, v = make()
    with raises(LayoutError, "out", "numpy.ndarray"):
        attention(q, k, v, 4, out=np.zeros_like(q).tolist())


@pytest.mark.parametrize(
    "out,words",
    [
        (np.zeros((8, 64), np.float64), ["float64", "float32"]),
        (np.zeros((8, 32), np.float32), ["head_dim", "(8, 32)"]),
        (np.zeros((8, 128), np.float32)[:, ::2], ["C-contiguous"]),
    ],
)
def test_bad_out(out, words):
    q, k, v = make()
    with raises(LayoutError, "out", *words):
        attention(q, k, v, 4, out=out)


def test_out_aliasing_q_is_refused():
    q, k, v = make()
    with raises(LayoutError, "out", "q", "overlaps"):
        attention(q, k, v, 4, out=q)


def test_out_inside_the_cache_is_refused():
    q, k, v = make()
    inside = v.reshape(-1)[64 : 64 + q.size].reshape(q.shape)
    with raises(LayoutError, "out", "v_cache"):
        attention(q, k, v, 4, out=inside)


@pytest.mark.parametrize("n_past", [0, -1, 33, 1000])
def test_n_past_out_of_range(n_past):
    q, k, v = make(n_ctx=32)
    with raises(LayoutError, "n_past", "32"):
        attention(q, k, v, n_past)


def test_n_past_must_be_an_integer():
    q, k, v = make()
    with pytest.raises(TypeError, match="n_past"):
        attention(q, k, v, 4.0)
    assert attention(q, k, v, np.int64(4)).shape == q.shape


@pytest.mark.parametrize(
    "shapes,names",
    [
        (((8, 64), (2, 32, 32), (2, 32, 32)), ["k_cache", "head_dim", "64"]),
        (((8, 64), (2, 32, 64), (2, 16, 64)), ["v_cache", "n_ctx", "32"]),
        (((8, 64), (2, 32, 64), (4, 32, 64)), ["v_cache", "n_kv_heads"]),
        (((8, 64), (3, 32, 64), (3, 32, 64)), ["q", "k_cache", "multiple"]),
        (((8, 64, 1), (2, 32, 64), (2, 32, 64)), ["q", "2 dimensions"]),
        (((8, 64), (64, 64), (2, 32, 64)), ["k_cache", "3 dimensions"]),
        (((0, 64), (2, 32, 64), (2, 32, 64)), ["q", "at least 1"]),
    ],
)
def test_mismatched_shapes(shapes, names):
    q, k, v = (np.zeros(s, np.float32) for s in shapes)
    with raises(LayoutError, *names):
        attention(q, k, v, 4)


# The gate on its own, as the engine will use it ------------------------------------------


def test_pointer_is_the_views_first_element():
    big = np.arange(100, dtype=np.float32)
    b = gate.check_buffer("x", big[10:30], np.float32, (20,))
    assert int(ffi.cast("uintptr_t", b.ptr)) == big[10:].ctypes.data
    assert b.ptr[0] == 10.0 and len(b.ptr) == 20


def test_dims_known_from_the_config():
    dims = gate.Dims("the model config", n_ctx=16, head_dim=64)
    with raises(LayoutError, "k_cache", "head_dim", "the model config"):
        gate.check_buffer("k_cache", np.zeros((2, 16, 32), np.float32), np.float32,
                          ("n_kv_heads", "n_ctx", "head_dim"), dims=dims)


def test_views_of_an_mmap_are_bounded_by_it():
    with mmap.mmap(-1, 4096) as m:
        whole = np.frombuffer(m, np.float32)
        b = gate.check_buffer("tokens", whole[8:16], np.float32, (8,))
        assert len(b.ptr) == 8
        with raises(LayoutError, "tokens", "outside"):
            gate.check_buffer("tokens", as_strided(whole[1000:], shape=(48,)), np.float32, (None,))
        del b, whole


def test_alignment_can_be_raised():
    a = np.zeros(64, np.float32)
    start = 1 if (a.ctypes.data + 4) % 64 else 2  # 4-byte aligned, not 64-byte aligned
    gate.check_buffer("x", a[start : start + 16], np.float32, (16,))
    with raises(LayoutError, "x", "64 bytes"):
        gate.check_buffer("x", a[start : start + 16], np.float32, (16,), align=64)


def test_outputs_may_not_overlap_each_other():
    a = np.zeros(16, np.float32)
    x = gate.check_buffer("x", a[:10], np.float32, (10,), output=True)
    y = gate.check_buffer("y", a[8:], np.float32, (8,), output=True)
    with raises(LayoutError, "y", "x", "overlaps"):
        gate.check_no_alias([x, y], [])


# Properties ------------------------------------------------------------------------------


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    return tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * itemsize for i in range(len(shape)))


def with_strides(a: np.ndarray, shift: int, factors: tuple[int, ...]) -> np.ndarray:
    """A copy of `a` behind other strides, `shift` bytes into a uint8 buffer: each axis's C
    stride times its factor (0 repeats one element, negative runs backwards). An axis of
    length 1 gets an odd stride: never followed, so the array is still in C order."""
    strides = tuple(
        f * s if n > 1 else f * s + 1 for n, s, f in zip(a.shape, c_strides(a.shape, a.itemsize), factors)
    )
    low = sum(min(0, (n - 1) * s) for n, s in zip(a.shape, strides))
    high = sum(max(0, (n - 1) * s) for n, s in zip(a.shape, strides)) + a.itemsize
    raw = np.zeros(high - low + shift, np.uint8)
    view = np.ndarray(a.shape, a.dtype, buffer=raw, offset=shift - low, strides=strides)
    view[...] = a  # where strides repeat elements, the view holds whichever value came last
    return view


def lay_out(values: np.ndarray, dtype: str, how: str, shift: int, factors: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """`values` as `dtype`, laid out in memory as `how` says, and whether the view stays
    inside the memory it was made from."""
    a = values.astype(dtype)
    if how == "offset":  # a view `shift` elements into a larger array
        flat = np.full(a.size + shift + 5, 7, dtype)
        flat[shift : shift + a.size] = a.ravel()
        return flat[shift : shift + a.size].reshape(a.shape), True
    if how == "bytes":  # `shift` bytes into a bytearray: misaligned unless a multiple of itemsize
        return misaligned(a, shift), True
    if how == "strided":  # every other element of the last axis
        big = np.full(a.shape[:-1] + (2 * a.shape[-1],), 7, dtype)
        big[..., ::2] = a
        return big[..., ::2], True
    if how == "transposed":  # the right values in Fortran order
        return np.asfortranarray(a), True
    if how == "strides":
        return with_strides(a, shift, factors[-a.ndim:]), True
    if how == "overrun":  # C order over a buffer one element short; never read or written here
        short = np.zeros(a.size - 1, dtype)
        return as_strided(short, shape=a.shape, strides=c_strides(a.shape, a.itemsize)), False
    return a, True


def readable(a: np.ndarray, dtypes: tuple[str, ...], inside: bool) -> bool:
    """What the gate should accept, decided independently of it."""
    in_c_order = all(s == c for n, s, c in zip(a.shape, a.strides, c_strides(a.shape, a.itemsize)) if n > 1)
    return (
        inside
        and a.dtype.isnative
        and a.dtype.name in dtypes
        and in_c_order
        and a.ctypes.data % a.dtype.itemsize == 0
    )


class CpuForeign:
    """A CPU tensor from another library: DLPack says CPU, numpy reads it via __array__."""

    def __init__(self, a):
        self.a = a

    def __dlpack_device__(self):
        return (1, 0)

    def __array__(self, dtype=None, copy=None):
        return self.a


class UnknownDevice:
    """An object whose __dlpack_device__ fails: where its memory is, nobody can tell."""

    def __dlpack_device__(self):
        raise RuntimeError("device query failed")

    def __array__(self, dtype=None, copy=None):
        raise AssertionError("the gate converted memory of unknown device")


ON_CPU = ("numpy", "memoryview", "cpu_dlpack")


def wrap(a: np.ndarray, where: str):
    return {
        "numpy": lambda: a,
        "memoryview": lambda: memoryview(a),
        "cpu_dlpack": lambda: CpuForeign(a),
        "cuda_dlpack": lambda: FakeCuda((2, 0)),
        "rocm_dlpack": lambda: FakeCuda((10, 1)),
        "cuda_interface": lambda: FakeNumbaCuda(),
        "unknown_device": lambda: UnknownDevice(),
    }[where]()


@st.composite
def calls(draw):
    # Half the calls draw only from valid choices, so the numbers get exercised as much as
    # the refusals; in the other half each choice is a bad one one time in five, so that
    # the later checks (n_past, out, aliasing) are reached as well as the first ones.
    healthy = draw(st.booleans())

    def pick(good, bad=()):
        spoil = bad and not healthy and draw(st.integers(0, 4)) == 0
        return draw(st.sampled_from(list(bad) if spoil else list(good)))

    n_kv = draw(st.integers(1, 3))
    n_heads = n_kv * draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([1, 2, 7, 8, 16, 63, 64, 65, 128, 130]))
    n_ctx = draw(st.integers(1, 24))
    n_past = pick([draw(st.integers(1, n_ctx))] * 9, [0, n_ctx + 1])
    kv_dtype = pick(["float32"] * 3 + ["float16"] * 3 + ["<f4", "=f2"], [">f2", ">f4", "float64"])
    v_dtype = pick([kv_dtype] * 8, ["float32", "float16"])
    q_dtype = pick(["float32"] * 10 + ["<f4"], ["float64", ">f4", "float16"])
    out_dtype = pick(["float32"] * 10, ["float64", ">f4"])

    def arg(output: bool = False):
        return dict(
            how=pick(["plain", "offset", "strides"], ["bytes", "strided", "transposed", "strides", "overrun"]),
            shift=draw(st.integers(0, 9)),
            factors=tuple(pick([1], [-2, -1, 0, 2]) for _ in range(3)),
            read_only=pick([False], [True]) if output else draw(st.booleans()),
            where=pick(["numpy"], ["memoryview", "cpu_dlpack", "cuda_dlpack", "cuda_interface", "unknown_device"])
            if output else pick(["numpy"] * 4 + list(ON_CPU), ["cuda_dlpack", "rocm_dlpack", "cuda_interface", "unknown_device"]),
        )

    return dict(
        shape=(n_heads, n_kv, n_ctx, head_dim), n_past=n_past, seed=draw(st.integers(0, 2**32 - 1)),
        dtypes=(q_dtype, kv_dtype, v_dtype, out_dtype), args=(arg(), arg(), arg(), arg(output=True)),
        out_kind=pick(["none", "array"], ["alias_q"]),
    )


def expected_refusal(arrays, specs, names, n_past, n_ctx, out_is_q):
    """(error class, the argument its message must start with), or None to accept: the
    gate checks every device first, then each argument in order, then n_past and out."""
    for name, spec in zip(names, specs):
        if spec["where"] not in ON_CPU:
            return DeviceError, name
    k, v = arrays[1][0], arrays[2][0]
    for name, (a, inside), dtypes in zip(names, arrays, [("float32",), ("float32", "float16"), ("float32", "float16")]):
        if not readable(a, dtypes, inside):
            return LayoutError, name
    if v.dtype != k.dtype:
        return LayoutError, "v_cache"
    if not 1 <= n_past <= n_ctx:
        return LayoutError, "n_past"
    if len(arrays) == 4:
        out, inside = arrays[3]
        if specs[3]["where"] != "numpy" or not readable(out, ("float32",), inside) or not out.flags.writeable or out_is_q:
            return LayoutError, "out"
    return None


@settings(max_examples=300, deadline=None)
@given(calls())
def test_property_right_numbers_or_a_clear_refusal(call):
    n_heads, n_kv, n_ctx, head_dim = call["shape"]
    rng = np.random.default_rng(call["seed"])
    values = [
        rng.standard_normal((n_heads, head_dim)),
        rng.standard_normal((n_kv, n_ctx, head_dim)),
        rng.standard_normal((n_kv, n_ctx, head_dim)),
        np.zeros((n_heads, head_dim)),
    ]
    names = ["q", "k_cache", "v_cache", "out"]
    specs = list(call["args"])
    if call["out_kind"] == "none":
        values, names, specs = values[:3], names[:3], specs[:3]
    arrays = [lay_out(x, d, s["how"], s["shift"], s["factors"]) for x, d, s in zip(values, call["dtypes"], specs)]
    if call["out_kind"] == "alias_q":
        arrays[3] = arrays[0]
    for (a, inside), spec in zip(arrays, specs):
        if spec["read_only"]:
            a.flags.writeable = False
    objs = [wrap(a, s["where"]) for (a, _), s in zip(arrays, specs)]
    expected = expected_refusal(arrays, specs, names, call["n_past"], n_ctx, call["out_kind"] == "alias_q")
    inputs_before = [a.copy() for a, inside in arrays[:3] if inside]

    try:
        result = attention(*objs[:3], call["n_past"], out=objs[3] if len(objs) == 4 else None)
    except (LayoutError, DeviceError) as e:
        assert expected is not None, f"refused a call the kernel can read: {e}"
        kind, name = expected
        assert type(e) is kind and re.match(rf"{name}\b", str(e)), f"expected {kind.__name__} for {name}: {e}"
        event(f"refused: {kind.__name__} for {name}")
        return
    assert expected is None, f"accepted a call that should fail with {expected[0].__name__} for {expected[1]}"
    event("accepted")
    if len(arrays) == 4:
        assert result is arrays[3][0]
    assert_matches(result, *(a for a, _ in arrays[:3]), call["n_past"])
    for before, (after, _) in zip(inputs_before, arrays):
        np.testing.assert_array_equal(before, after)  # inputs are read, never written
