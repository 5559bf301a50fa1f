"""What an engine will allocate, checked against the memory the machine has left, before
anything is allocated.

A KV cache too large for the machine would otherwise fail inside numpy with a bare
MemoryError, or - since its pages are only touched as the context fills - succeed and get
the process killed halfway through a long answer. Python integers do the arithmetic, so a
hostile size cannot overflow it. The weights are not counted: they stay in the file's
memory map, which the kernel can page out and back in.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

from llm_smolq.errors import GGUFError, ResourceError
from llm_smolq.engine.kv_types import KV_TYPES, KVType
from llm_smolq.model.model_file import ModelConfig

_FLOAT = 4


@dataclass(frozen=True)
class EngineMemory:
    kv_cache: int  # keys and values of every layer, n_ctx positions
    buffers: int  # the kernel's activation buffers and attention scratch, one row of logits

    @property
    def total(self) -> int:
        return self.kv_cache + self.buffers


def engine_memory(c: ModelConfig, n_ctx: int, kv: KVType, max_batch: int, threads: int) -> EngineMemory:
    """Bytes an Engine allocates for this model and context: the cache, and what the
    kernel says its state holds (sq_state_bytes) plus the row of logits eval returns."""
    from llm_smolq._kernel import lib
    from llm_smolq.engine.structs import c_config

    state = lib.sq_state_bytes(c_config(c, min(n_ctx, 2**31 - 1)), max_batch, threads)
    if n_ctx > 2**31 - 1 or state < 0:  # past what the kernel's sizes can say: too much, certainly
        state = 2**63
    return EngineMemory(2 * c.n_layers * c.n_kv_heads * n_ctx * kv.row_bytes(c.head_dim),
                        state + c.vocab_size * _FLOAT)


def available_memory() -> tuple[int, str] | None:
    """(bytes this process may still allocate, where that figure comes from), or None when
    the system does not say. Linux: the smaller of MemAvailable and a cgroup's memory
    limit. Windows: the available physical memory (GlobalMemoryStatusEx). macOS, and a
    Linux without /proc: the physical memory, as sysconf gives it (macOS says no more
    without the Mach API, and compresses and swaps before it refuses an allocation)."""
    if sys.platform == "win32":
        return _windows_available()
    found = _linux_available() if sys.platform.startswith("linux") else []
    if not found:
        physical = _physical_memory()
        if physical is None:
            return None
        found.append(physical)
    return min(found)


def _linux_available() -> list[tuple[int, str]]:
    """MemAvailable and the cgroup memory limit, those the system gives. (A cgroup's usage
    is not subtracted: it counts page cache the kernel can reclaim.)"""
    found: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
    except (OSError, ValueError, IndexError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit) as f:
                found.append((int(f.read()), f"the cgroup memory limit in {limit}"))
        except (OSError, ValueError):  # no such cgroup file, or "max" (no limit)
            pass
    return found


def _physical_memory() -> tuple[int, str] | None:
    """The machine's physical memory, where sysconf names it (Linux, macOS, the BSDs)."""
    names = getattr(os, "sysconf_names", {})
    if "SC_PHYS_PAGES" not in names or "SC_PAGE_SIZE" not in names:
        return None
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory"
    except (OSError, ValueError):
        return None


class _MemoryStatusEx(ctypes.Structure):
    """Windows' MEMORYSTATUSEX, 64 bytes."""

    _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64) for name in ("ullTotalPhys", "ullAvailPhys", "ullTotalPageFile", "ullAvailPageFile",
                                             "ullTotalVirtual", "ullAvailVirtual", "ullAvailExtendedVirtual")]


def _windows_available() -> tuple[int, str] | None:
    status = _MemoryStatusEx()
    status.dwLength = ctypes.sizeof(status)  # the call fails unless the caller says which struct it passes
    try:
        ok = ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))
    except (AttributeError, OSError):  # no windll: not Windows after all
        return None
    if not ok:
        return None
    return int(status.ullAvailPhys), "available physical memory (GlobalMemoryStatusEx)"


def check_engine_memory(path: str, c: ModelConfig, n_ctx: int, kv: KVType, max_batch: int, threads: int) -> None:
    """Raise before allocating when the engine would need more memory than is available:
    GGUFError when the model's own sizes are too much even without a context,
    ResourceError naming the cache types and the largest n_ctx that fit otherwise."""
    available = available_memory()
    if available is None:
        return
    free, source = available
    fixed = engine_memory(c, 0, kv, max_batch, threads)
    if fixed.total > free:
        raise GGUFError(
            f"{path}: its sizes (width {c.dim}, FFN {c.hidden_dim}, {c.n_heads} heads, vocabulary {c.vocab_size}) "
            f"need {_bytes(fixed.total)} for activations before any context, but {_bytes(free)} are available "
            f"({source}); the file is corrupt or not a model this machine can run"
        )
    need = engine_memory(c, n_ctx, kv, max_batch, threads)
    if need.total > free:
        fits = largest_fitting_n_ctx(c, kv, max_batch, threads, free)
        fixes = [f"lower n_ctx to {fits} or less (llm: -o n_ctx {fits})" if fits >= 1 else "free some memory"]
        for other in KV_TYPES.values():
            if other.row_bytes(c.head_dim) < kv.row_bytes(c.head_dim) and \
                    engine_memory(c, n_ctx, other, max_batch, threads).total <= free:
                fixes.append(f"use kv_dtype={other.name!r} (llm: -o kv_cache {other.name})")
        fix = ", or ".join(fixes)
        raise ResourceError(
            f"n_ctx={n_ctx} needs {_bytes(need.total)}: {need.kv_cache:,} for the {kv.name} KV cache of "
            f"{c.n_layers} layers and {need.buffers:,} for buffers; {_bytes(free)} are available ({source}). "
            f"{fix[0].upper()}{fix[1:]}"
        )


def largest_fitting_n_ctx(c: ModelConfig, kv: KVType, max_batch: int, threads: int, free: int) -> int:
    """The largest n_ctx whose engine fits in `free` bytes (0 if none does). Every term
    grows with n_ctx, so a binary search finds it."""
    lo, hi = 0, max(c.window, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if engine_memory(c, mid, kv, max_batch, threads).total <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _bytes(n: int) -> str:
    return f"{n:,} bytes ({n / 2**30:.2f} GiB)"
