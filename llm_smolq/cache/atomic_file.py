"""Files replaced whole: written under a temporary name beside the final one, then
renamed over it, so a reader sees the old file or the complete new one, never a part.
On Windows the rename waits a moment for readers of the old file to close it
(cache/in_use.py).

No fsync: every file written this way is either checked when read (a digest or
checksum) or small enough to write again, so a file torn by a power cut costs a
rebuild, not a wrong answer.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from llm_smolq.cache import in_use

TEMP_PREFIX = ".tmp-"  # what a directory's cleaner may delete once it is old


@contextmanager
def replaced_atomically(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a new file to write in place of `path`; it takes `path`'s name when the
    block ends normally and is deleted if the block raises."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        in_use.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
