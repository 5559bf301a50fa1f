"""The buffer gate: the one place where arrays are checked before a pointer reaches C.

The C kernel reads raw memory: it assumes a CPU address, a dtype, a shape, rows laid out
back to back (C order), a first element exactly where the pointer points, natural
alignment, and for outputs that it may write. Nothing in C can check any of that, so every
array passes through `check_buffer` first, which checks in this order and raises an error
naming the argument, what was expected, what was found and how to fix it:

1. device       memory on a GPU (``__dlpack_device__`` not CPU, or ``__cuda_array_interface__``)
                is refused before numpy ever touches it                      -> DeviceError
2. dtype        exactly one of the expected dtypes, native byte order; never cast silently
3. shape        against fixed sizes and named sizes shared between arguments (`Dims`)
4. contiguity   C order; this gate refuses rather than copies (a caller that wants a copy
                makes it, visibly)
5. offset       the pointer is the view's own first element, and its bytes lie inside the
                buffer that owns them (as_strided can build views that do not; numpy's
                own slicing cannot)
6. alignment    the address is a multiple of the element size (4 for float32, 2 for float16)
                unless the caller asks for more with ``align=``
7. writability  outputs must be writable numpy arrays (never converted: a converted copy would
                receive the result and be thrown away)
8. aliasing     `check_no_alias`: an output must not overlap any input or other output
9. lifetime     the returned `Buffer` holds the array and the cffi pointer; keep it referenced
                (a local variable is enough) until the C call returns

Step 1 raises DeviceError; the others raise LayoutError. Typical use::

    dims = Dims()
    q = check_buffer("q", q, np.float32, ("n_heads", "head_dim"), dims=dims)
    out = check_buffer("out", out, np.float32, ("n_heads", "head_dim"), dims=dims, output=True)
    check_no_alias([out], [q])
    lib.sq_something(q.ptr, out.ptr, dims["n_heads"], dims["head_dim"])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence, Union

import numpy as np

from llm_smolq._kernel import ffi
from llm_smolq.errors import DeviceError, LayoutError

try:  # numpy >= 2.0
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy 1.26
    byte_bounds = np.byte_bounds  # type: ignore[attr-defined]

DTypes = Union[np.dtype, type, str, Sequence[Union[np.dtype, type, str]]]
# One entry per dimension: an int is a fixed size, a str names a size that every argument
# using that name must agree on, None accepts any size.
Shape = Sequence[Union[int, str, None]]

# DLPack device types (dlpack.h, DLDeviceType), named as torch and friends name them.
# Only CPU memory is accepted: pinned or managed memory is CPU-addressable, but a plain
# CPU array (.cpu() / .numpy()) is the one layout this gate can vouch for.
DLPACK_CPU = 1
_DLPACK_DEVICES = {
    1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi",
    10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed", 14: "oneapi",
    15: "webgpu", 16: "hexagon", 17: "maia",
}

# The C element type each numpy dtype is handed over as.
_C_TYPES = {
    np.dtype(t): c
    for t, c in [
        (np.float32, "float[]"), (np.float16, "uint16_t[]"), (np.float64, "double[]"),
        (np.int8, "int8_t[]"), (np.uint8, "uint8_t[]"), (np.int16, "int16_t[]"),
        (np.uint16, "uint16_t[]"), (np.int32, "int32_t[]"), (np.uint32, "uint32_t[]"),
        (np.int64, "int64_t[]"), (np.uint64, "uint64_t[]"),
    ]
}

_MOVE_TO_CPU = "move it to the CPU with .cpu() / .numpy() (cupy: .get()) first"


@dataclass(frozen=True)
class Buffer:
    """An array that passed the gate, and the pointer C may use while this object lives.

    `ptr` is a cffi buffer over `array`: it keeps the array alive and holds a buffer
    export on it, so numpy refuses to resize it while the pointer exists."""

    name: str
    array: np.ndarray
    ptr: Any  # cffi cdata, e.g. float[] for float32

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype


class Dims:
    """Named sizes shared by the arguments of one call (head_dim in q and in the caches).

    The first argument to use a name fixes its size; later ones must agree. Known sizes
    can be given up front, e.g. ``Dims("the model config", n_ctx=4096, head_dim=128)``."""

    def __init__(self, source: str = "the caller", **known: int) -> None:
        self._sizes: dict[str, tuple[int, str]] = {k: (v, source) for k, v in known.items()}

    def __getitem__(self, label: str) -> int:
        return self._sizes[label][0]

    def __contains__(self, label: str) -> bool:
        return label in self._sizes

    def get(self, label: str) -> tuple[int, str] | None:
        """(size, who fixed it), or None when no argument has fixed it yet."""
        return self._sizes.get(label)

    def bind(self, label: str, size: int, source: str) -> None:
        self._sizes.setdefault(label, (size, source))


def check_buffer(
    name: str,
    obj: Any,
    dtypes: DTypes,
    shape: Shape,
    *,
    output: bool = False,
    align: int | None = None,
    dims: Dims | None = None,
) -> Buffer:
    """Check `obj` for argument `name` (steps 1-7 of the module docstring) and return it
    with its cffi pointer. Inputs may be anything numpy reads (lists, buffers); outputs
    must already be numpy arrays. `align` defaults to the element size."""
    allowed = _as_dtypes(dtypes)
    dims = Dims() if dims is None else dims
    check_device(obj, name)
    arr = _as_array(name, obj, output)
    _check_dtype(name, arr, allowed)
    _check_shape(name, arr, shape, dims)
    _check_contiguous(name, arr, output)
    start = _check_extent(name, arr)
    _check_alignment(name, arr, start, align or arr.dtype.itemsize)
    if output and not arr.flags.writeable:
        raise LayoutError(
            f"{name} is read-only, but the kernel writes its result into it; pass a "
            f"writable array such as np.empty({arr.shape}, {_dtype_expr(arr.dtype)})"
        )
    ptr = ffi.from_buffer(_C_TYPES.get(arr.dtype, "char[]"), arr, require_writable=output)
    if int(ffi.cast("uintptr_t", ptr)) != start:  # cannot happen for a C-contiguous array
        raise LayoutError(f"{name}: the buffer pointer is not the view's first element")
    return Buffer(name, arr, ptr)


def check_device(obj: Any, name: str) -> None:
    """Refuse memory that is not on the CPU, before anything tries to read it."""
    where = _dlpack_device(obj, name)
    if where is not None and where[0] != DLPACK_CPU:
        kind, index = where
        device = _DLPACK_DEVICES.get(kind, f"dlpack device type {kind}")
        raise DeviceError(
            f"{name} is on {device}:{index}, but the kernel reads CPU memory only; "
            f"{_MOVE_TO_CPU}"
        )
    if _has_attr(obj, "__cuda_array_interface__"):
        raise DeviceError(
            f"{name} is on a CUDA device (it has __cuda_array_interface__), but the kernel "
            f"reads CPU memory only; {_MOVE_TO_CPU}"
        )


def check_no_alias(outputs: Iterable[Buffer], inputs: Iterable[Buffer]) -> None:
    """Refuse an output that overlaps an input or another output: C would overwrite
    what it has yet to read. Gated arrays are contiguous, so overlapping byte ranges
    (what may_share_memory tests) are exactly shared memory."""
    outs, ins = list(outputs), list(inputs)
    for i, out in enumerate(outs):
        for other in outs[:i] + ins:
            if np.may_share_memory(out.array, other.array):
                raise LayoutError(
                    f"{out.name} overlaps {other.name} in memory, so the kernel would "
                    f"overwrite {other.name} while reading it; pass a separate array as "
                    f"{out.name}"
                )


def _as_dtypes(dtypes: DTypes) -> tuple[np.dtype, ...]:
    if isinstance(dtypes, (list, tuple)):
        return tuple(np.dtype(d) for d in dtypes)
    return (np.dtype(dtypes),)


def _dlpack_device(obj: Any, name: str) -> tuple[int, int] | None:
    method = getattr(type(obj), "__dlpack_device__", None)
    if method is None:
        return None
    try:
        kind, index = method(obj)
        return int(kind), int(index)
    except Exception as e:
        raise DeviceError(
            f"{name}: could not tell which device it is on (__dlpack_device__ failed: {e}); "
            f"pass a numpy array"
        ) from e


def _has_attr(obj: Any, attr: str) -> bool:
    try:
        return hasattr(obj, attr)
    except Exception:  # a property that raises still says what the object is
        return True


def _as_array(name: str, obj: Any, output: bool) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        return obj
    if output:
        raise LayoutError(
            f"{name} must be a numpy.ndarray for the kernel to write into; found "
            f"{type(obj).__name__}. Pass a numpy array, or None to get a new one"
        )
    try:
        return np.asarray(obj)
    except Exception as e:
        raise LayoutError(
            f"{name} could not be read as a numpy array (found {type(obj).__name__}: {e}); "
            f"pass a numpy array"
        ) from e


def dtype_name(d: np.dtype) -> str:
    """numpy's name, or for a structured dtype the name its metadata gives (Q8_0 blocks)."""
    return (d.metadata or {}).get("name", d.name) if d.fields else d.name


def _dtype_expr(d: np.dtype) -> str:
    """How Python code names the dtype: np.float32, or what a structured dtype's metadata says."""
    return (d.metadata or {}).get("expr", f"np.{d.name}")


def _check_dtype(name: str, arr: np.ndarray, allowed: tuple[np.dtype, ...]) -> None:
    if arr.dtype in allowed:
        return
    want = " or ".join(dtype_name(d) for d in allowed)
    if allowed[0].fields:  # blocks are made by a quantizer, not by a cast
        raise LayoutError(f"{name} has dtype {dtype_name(arr.dtype)}; expected {want}. The kernel does not "
                          f"convert: pass an array of that dtype")
    fix = f"{name}.astype(np.{allowed[0].name})"
    if not arr.dtype.isnative and arr.dtype.newbyteorder("=") in allowed:
        raise LayoutError(
            f"{name} is {arr.dtype.name} in non-native (big-endian) byte order ({arr.dtype.str}); "
            f"the kernel reads native byte order. Convert it with {fix}"
        )
    raise LayoutError(
        f"{name} has dtype {arr.dtype}; expected {want}. The kernel does not cast "
        f"silently: convert it with {fix}"
    )


def _check_shape(name: str, arr: np.ndarray, shape: Shape, dims: Dims) -> None:
    parts = []  # the expectation as known before this argument, e.g. (n_ctx, head_dim=64)
    for spec in shape:
        known = dims.get(spec) if isinstance(spec, str) else None
        parts.append("any" if spec is None else f"{spec}={known[0]}" if known else str(spec))
    wanted = "(" + ", ".join(parts) + ")"

    if arr.ndim != len(shape):
        raise LayoutError(
            f"{name} has shape {arr.shape} ({arr.ndim} dimensions); expected {len(shape)} "
            f"dimensions {wanted}"
        )
    for axis, (size, spec) in enumerate(zip(arr.shape, shape)):
        if spec is None:
            continue
        if isinstance(spec, str):
            known = dims.get(spec)
            if known is None:
                dims.bind(spec, size, name)
                continue
            expected, source = known
            if size != expected:
                raise LayoutError(
                    f"{name} has shape {arr.shape}; expected {wanted}: {spec} (axis {axis}) "
                    f"is {size} here but {expected} in {source}. Pass arrays that agree"
                )
        elif size != spec:
            raise LayoutError(
                f"{name} has shape {arr.shape}; expected {wanted}: axis {axis} must be "
                f"{spec}, found {size}"
            )


def _check_contiguous(name: str, arr: np.ndarray, output: bool) -> None:
    if arr.flags.c_contiguous:
        return
    fix = (
        f"pass a C-contiguous array such as np.empty({arr.shape}, {_dtype_expr(arr.dtype)})"
        if output
        else f"pass np.ascontiguousarray({name})"
    )
    raise LayoutError(
        f"{name} is not C-contiguous (shape {arr.shape}, strides {arr.strides}): the kernel "
        f"reads rows back to back and would read the wrong elements; {fix}"
    )


def _check_extent(name: str, arr: np.ndarray) -> int:
    """Return the address of the view's first element after checking that the view's
    bytes [start, start + nbytes) lie inside the buffer of the object that owns them."""
    start = arr.__array_interface__["data"][0]
    owner = _owner(arr)
    bounds = _owner_bounds(owner)
    if bounds is None:  # an owner without a buffer we can measure: numpy's word stands
        return start
    low, high = bounds
    end = start + arr.nbytes
    if not (low <= start and end <= high):
        raise LayoutError(
            f"{name} views bytes {start - low}..{end - low} of a {high - low}-byte "
            f"{type(owner).__name__}, which reaches outside it (as_strided can build such "
            f"views); pass a view that stays inside its buffer"
        )
    return start


def _check_alignment(name: str, arr: np.ndarray, start: int, align: int) -> None:
    """C dereferences float* and uint16_t* directly: the address must be a multiple of
    the element size (misaligned loads are undefined behaviour in C, and slow or fatal
    on some CPUs). SIMD code that needs more passes a larger `align`."""
    if start % align:
        raise LayoutError(
            f"{name} starts at address {start:#x}, which is not a multiple of {align} bytes, "
            f"the alignment the kernel needs for {name} ({dtype_name(arr.dtype)}); pass an aligned "
            f"copy: np.array({name})"
        )


def _owner(arr: np.ndarray) -> object:
    """The object at the end of arr's base chain: the one whose memory arr views.
    Followed only through numpy objects and memoryviews, whose links mean exactly that."""
    obj: object = arr
    for _ in range(100):  # chains are short; the bound only guards against a cycle
        if isinstance(obj, memoryview):
            nxt = obj.obj
        elif isinstance(obj, np.ndarray) or hasattr(obj, "__array_interface__"):
            nxt = getattr(obj, "base", None)  # as_strided's DummyArray keeps its array here
        else:
            nxt = None
        if nxt is None:
            return obj
        obj = nxt
    return obj


def _owner_bounds(owner: object) -> tuple[int, int] | None:
    """[low, high) addresses of the owner's memory, or None if it exposes no flat buffer."""
    if isinstance(owner, np.ndarray):
        return byte_bounds(owner)
    try:
        raw = ffi.from_buffer(owner)  # bytearray, bytes, mmap, ...; needs a contiguous buffer
    except (TypeError, ValueError, BufferError):
        return None
    low = int(ffi.cast("uintptr_t", raw))
    return low, low + len(raw)
