"""Memory pages, as far as Python's mmap lets a process speak of them, on every system.

- The page size to round to is the system's own (mmap.PAGESIZE), never a constant: 4 KiB on
  x86-64, 16 KiB on Apple silicon and some arm64 Linux kernels, 64 KiB on others.
- Letting go of a file mapping's pages (madvise MADV_DONTNEED): Linux drops them from the
  process, leaving them in the page cache; macOS takes it as a hint. Windows has no
  madvise: nothing is asked there, and the system trims the pages when it needs them.
- Huge pages asked for (MADV_HUGEPAGE, Linux) under the weights a forward pass streams: the
  packed weights, in anonymous memory or mapped from their kept copy. With half of the kept
  copy in 4 KiB pages, the 3B shape's steps and 8-token checks took 3-5% longer than from
  huge pages (Zen 4, one process, alternating). Small pages asked for under the KV cache,
  whose positions fill in a little of each head's span at a time.
- Anonymous memory private to the process (MAP_PRIVATE), where the system has the flag.

Every file mapping in this package starts at the file's first byte, so no offset has to be
a multiple of Windows' 64 KiB allocation granularity (mmap.ALLOCATIONGRANULARITY).
"""

from __future__ import annotations

import mmap
from typing import Any


def page_size() -> int:
    return mmap.PAGESIZE


def let_go(data: Any, start: int, end: int) -> None:
    """Drop the process's hold on the pages wholly inside [start, end) of `data`, a numpy
    memmap of a whole file (the pages come back from the file if read again). Only memory
    held a little longer where the system cannot."""
    page = page_size()
    start, end = -(-start // page) * page, end // page * page
    if end > start and hasattr(mmap, "MADV_DONTNEED"):
        try:
            data._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, AttributeError, ValueError):  # no madvise on this mapping, or refused
            pass


def _advise(buf: mmap.mmap, name: str) -> None:
    """madvise(mmap.<name>) over the whole mapping, where the system has that advice and
    takes it; elsewhere nothing changes (the system's own page sizes do)."""
    option = getattr(mmap, name, None)
    if option is not None:
        try:
            buf.madvise(option)
        except OSError:  # refused here (a kernel without transparent huge pages)
            pass


def prefer_huge(buf: mmap.mmap) -> None:
    """Ask for huge pages under a mapping. For a file's, Linux then reads it into the page
    cache 2 MiB at a time and maps those whole; what is cached already keeps the pieces it
    was cached in (a file written through a mapping without this: half the 3B shape's
    packed copy)."""
    _advise(buf, "MADV_HUGEPAGE")


def _private(nbytes: int) -> mmap.mmap:
    """nbytes (at least one) of zeroed anonymous memory, private to the process. Python maps
    fileno -1 shared by default, which Linux treats as shared memory: counted as RssShmem,
    not RssAnon, and without huge pages where systems leave them off for it (shmem_enabled)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE)
    return mmap.mmap(-1, max(nbytes, 1))  # Windows: no flags to give


def anonymous(nbytes: int) -> mmap.mmap:
    """nbytes (at least one) of zeroed anonymous memory, in huge pages where offered."""
    buf = _private(nbytes)
    prefer_huge(buf)
    return buf


def small_anonymous(nbytes: int) -> mmap.mmap:
    """nbytes (at least one) of zeroed anonymous memory in small pages, each resident once
    written, even where the system hands out huge pages unasked (THP "always")."""
    buf = _private(nbytes)
    _advise(buf, "MADV_NOHUGEPAGE")
    return buf
