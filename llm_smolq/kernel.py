"""Python entry points to single C kernel routines, for tests, benchmarks and experiments.

Every array goes through the buffer gate (llm_smolq.engine.buffer_gate) before its pointer
reaches C; see that module for what is checked and why.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from llm_smolq.engine import buffer_gate as gate
from llm_smolq._kernel import lib
from llm_smolq.errors import LayoutError
from llm_smolq.engine.kv_types import KV_TYPES, kv_type_of

_C_INT_MAX = 2**31 - 1  # sizes cross into C as int


def attention(q: Any, k_cache: Any, v_cache: Any, n_past: int, out: Any = None) -> np.ndarray:
    """One decode step of grouped-query attention over cached positions 0..n_past-1, as
    the engine computes it for a cache of that type.

    q: [n_heads, head_dim] float32. k_cache, v_cache: [n_kv_heads, n_ctx, row], both of
    one KV cache type: float32 or float16 (row = head_dim), or llm_smolq.Q8_0_BLOCK
    (row = head_dim / 32 blocks). n_heads must be a multiple of n_kv_heads; query head h
    uses KV head h // (n_heads // n_kv_heads). Scores are scaled by 1/sqrt(head_dim).
    1 <= n_past <= n_ctx. out: an optional writable [n_heads, head_dim] float32 array
    that overlaps no input. Returns out (a new array when out is None).

    Raises DeviceError for memory off the CPU and LayoutError for anything else the
    kernel cannot read as it assumes; arrays are never copied or cast behind your back.
    """
    # Device first for every argument: a GPU tensor is the news, not its dtype.
    for name, obj in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
        if obj is not None:
            gate.check_device(obj, name)

    dims = gate.Dims()
    qb = gate.check_buffer("q", q, np.float32, ("n_heads", "head_dim"), dims=dims)
    dtypes = tuple(KV_TYPES[name].dtype for name in ("f32", "f16", "q8_0"))
    align = 2 if np.asarray(k_cache).dtype.fields else None  # blocks: their half scale's alignment
    cache_shape = ("n_kv_heads", "n_ctx", "row")
    kb = gate.check_buffer("k_cache", k_cache, dtypes, cache_shape, dims=dims, align=align)
    vb = gate.check_buffer("v_cache", v_cache, dtypes, cache_shape, dims=dims, align=align)
    if vb.dtype != kb.dtype:
        fix = f": convert with v_cache.astype(np.{kb.dtype.name})" if not kb.dtype.fields else ""
        raise LayoutError(f"v_cache is {gate.dtype_name(vb.dtype)} but k_cache is {gate.dtype_name(kb.dtype)}; "
                          f"both caches must have the same dtype{fix}")
    kv = kv_type_of(kb.dtype)
    n_heads, head_dim = qb.shape
    n_kv_heads, n_ctx, row = kb.shape
    if row * kv.per_item != head_dim:
        raise LayoutError(f"k_cache rows hold {row * kv.per_item} values ({row} of {gate.dtype_name(kb.dtype)}), "
                          f"but q has head_dim {head_dim}; the caches' last axis must hold head_dim values")
    _check_sizes(qb, kb)
    n_past = _check_n_past(n_past, n_ctx)

    if out is None:
        out = np.empty((n_heads, head_dim), dtype=np.float32)
    ob = gate.check_buffer("out", out, np.float32, ("n_heads", "head_dim"), output=True, dims=dims)
    gate.check_no_alias([ob], [qb, kb, vb])

    # qb, kb, vb and ob hold the arrays and their exports until this call returns.
    lib.sq_attention(
        qb.ptr, kb.ptr, vb.ptr, kv.kernel_type,
        n_heads, n_kv_heads, n_ctx, head_dim, n_past, ob.ptr,
    )
    return ob.array


def _check_sizes(qb: gate.Buffer, kb: gate.Buffer) -> None:
    for b in (qb, kb):
        if min(b.shape) < 1:
            raise LayoutError(f"{b.name} has shape {b.shape}; every dimension must be at least 1")
        if max(b.shape) > _C_INT_MAX:
            raise LayoutError(
                f"{b.name} has shape {b.shape}; the kernel takes sizes up to {_C_INT_MAX}"
            )
    n_heads, n_kv_heads = qb.shape[0], kb.shape[0]
    if n_heads % n_kv_heads:
        raise LayoutError(
            f"q has {n_heads} heads and k_cache {n_kv_heads} KV heads; the number of query "
            f"heads (q.shape[0]) must be a multiple of the number of KV heads (k_cache.shape[0])"
        )


def _check_n_past(n_past: Any, n_ctx: int) -> int:
    try:
        n = operator.index(n_past)
    except TypeError:
        raise TypeError(f"n_past must be an int, found {type(n_past).__name__}") from None
    if not 1 <= n <= n_ctx:
        raise LayoutError(
            f"n_past={n} is outside 1..{n_ctx}: it counts the cached positions to attend to, "
            f"at least 1 and at most the cache length n_ctx={n_ctx} (k_cache.shape[1])"
        )
    return n
