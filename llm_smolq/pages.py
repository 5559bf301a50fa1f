"""Memory pages, as far as Python's mmap lets a process speak of them, on every system.

- The page size to round to is the system's own (mmap.PAGESIZE), never a constant: 4 KiB on
  x86-64, 16 KiB on Apple silicon and some arm64 Linux kernels, 64 KiB on others.
- Letting go of a file mapping's pages (madvise MADV_DONTNEED): Linux drops them from the
  process, leaving them in the page cache; macOS takes it as a hint. Windows has no
  madvise: nothing is asked there, and the system trims the pages when it needs them.
- Anonymous memory, in huge pages where the system offers them (MADV_HUGEPAGE, Linux).

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


def anonymous(nbytes: int) -> mmap.mmap:
    """nbytes (at least one) of zeroed anonymous memory, in huge pages where offered."""
    buf = mmap.mmap(-1, max(nbytes, 1))
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # not offered here: 4 KiB pages do
            pass
    return buf
