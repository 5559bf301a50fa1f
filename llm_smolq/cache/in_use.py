"""Replacing and deleting files that another reader may hold open, on every system.

On Linux and macOS a name can be replaced or deleted under a reader: the reader keeps
the file it opened, and a mapping keeps its pages, until it lets go. Windows refuses both,
with PermissionError, while any process holds the file open without FILE_SHARE_DELETE,
which is how Python, numpy and mmap open files there. A cache file is held for the
milliseconds a read takes, a mapped one for as long as its engine lives. So on Windows a
replace is tried again for a moment before it gives up, and a deletion that finds the file
in use leaves it for the next eviction; elsewhere both are plain os calls, as before.
"""

from __future__ import annotations

import os
import sys
import time

REPLACE_PATIENCE = 1.0  # seconds a replace waits, on Windows, for readers to close the file


def files_stay_while_open() -> bool:
    """Whether a file another process holds open can still be replaced or deleted
    (everywhere but Windows)."""
    return sys.platform != "win32"


def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """os.replace(src, dst); on Windows, tried again for up to REPLACE_PATIENCE seconds
    while a reader holds dst open, then its PermissionError is raised."""
    if files_stay_while_open():
        os.replace(src, dst)
        return
    deadline, pause = time.monotonic() + REPLACE_PATIENCE, 0.005
    while True:
        try:
            os.replace(src, dst)
            return
        except PermissionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 0.1)


def remove(path: str | os.PathLike[str]) -> bool:
    """Delete path: True once it is gone (also when it already was), False when Windows
    says a process holds it open or mapped, and it stays for a later eviction to delete.
    Any other error is raised."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except PermissionError:
        if files_stay_while_open():
            raise  # not a file in use: an unwritable directory, say
        return False
    return True
