"""The memory mapping that holds an array, as Linux's /proc/self/smaps describes it."""

from __future__ import annotations

import os

import numpy as np

#: Whether this kernel has transparent huge pages at all: without them it refuses the advice
#: about them (EINVAL), and no mapping carries the flags.
THP_CONFIGURED = os.path.exists("/sys/kernel/mm/transparent_hugepage")


def mapping_of(array: np.ndarray) -> tuple[str, set[str]]:
    """The permissions ("rw-p": private, "r--s": a shared file's) and VmFlags ("hg": huge
    pages asked for, "nh": refused) of the mapping that holds array's first byte."""
    at = array.__array_interface__["data"][0]
    found = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and all(c in "0123456789abcdef-" for c in head[0]):
                start, end = (int(x, 16) for x in head[0].split("-"))
                found = head[1] if start <= at < end else None
            elif found and line.startswith("VmFlags:"):
                return found, set(line.split()[1:])
    raise AssertionError(f"no mapping holds {at:#x}")
