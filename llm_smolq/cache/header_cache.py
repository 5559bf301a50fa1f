"""A cache of the slow parts of opening a GGUF: its parsed header and its tokenizer.

Reading SmolLM2's 49k vocabulary strings and merges from the header and building a
tokenizer from them takes half a second; a one-shot `llm -m … "prompt"` would pay it on
every run. Both are pure functions of the header's bytes, so they are kept here: the
parsed header keyed by the file (path, size, mtime, inode) and trusted only after
checking that the file's header still hashes to the digest recorded at parse time; the
tokenizer's vocabulary and merges as files tokenizers reads itself (faster, and in less
memory than building from Python objects), named by that digest. Every entry carries a
checksum. Anything else (a changed file, a damaged or foreign entry, an unwritable
directory) means parsing or building again, never an error.

What an entry holds is its reader's: model/gguf_file.py keeps its parsed header here
(read_header_cached) and checks it against the file, model/tokenizer.py its vocabulary
and merges (cached_file); this module only keeps, checks and evicts the entries.

Location: $SMOLQ_CACHE_DIR, else the platform's user cache directory (paths.py:
~/.cache/llm-smolq on Linux, ~/Library/Caches/llm-smolq on macOS, %LOCALAPPDATA%'s
llm-smolq/Cache on Windows). SMOLQ_CACHE_DIR=off turns the cache off. Eviction skips an
entry Windows says is in use; the next eviction deletes it.
"""

from __future__ import annotations

import hashlib
import marshal
import os
from pathlib import Path
from typing import Callable

from llm_smolq.cache.atomic_file import replaced_atomically
from llm_smolq.paths import header_cache_dir

MAGIC = b"SMOLQIX1"  # bump the digit when the stored layout changes
_CHECK = 16  # bytes of blake2b over the payload, after the magic
MAX_ENTRIES = 64  # beyond this the least recently used entries go


def entry_for(path: str) -> Path | None:
    """Where the entry for the file at path, as it is now, is kept: named by its real path,
    size, mtime, inode and device. None when the cache is off or the file cannot be stat'ed."""
    root = header_cache_dir()
    if root is None:
        return None
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    key = f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}".encode("utf-8", "surrogateescape")
    return root / f"{hashlib.blake2b(key, digest_size=16).hexdigest()}.header"


def cached_file(digest: str, name: str, produce: Callable[[], bytes]) -> Path | None:
    """A file holding produce()'s bytes, kept under the header digest they were computed
    from, for readers that want a path (its checksum, in a file beside it, is checked on
    every call). None when the cache is off or cannot be written."""
    root = header_cache_dir()
    if root is None or not digest:
        return None
    path, check = root / f"{digest}.{name}", root / f"{digest}.{name}.b2"
    try:
        if check.read_text() == hashlib.blake2b(path.read_bytes(), digest_size=_CHECK).hexdigest():
            os.utime(path)  # both recently used, as eviction reads it
            os.utime(check)
            return path
    except OSError:
        pass
    data = produce()
    try:
        _write_atomically(path, data)
        _write_atomically(check, hashlib.blake2b(data, digest_size=_CHECK).hexdigest().encode())
        _evict(root)
    except OSError:
        return None
    return path


def load(entry: Path):
    """The value stored at entry, or None if it is missing or does not check out."""
    try:
        blob = entry.read_bytes()
    except OSError:
        return None
    head = len(MAGIC) + _CHECK
    payload = memoryview(blob)[head:]  # no copy of a megabyte-sized entry
    if blob[:len(MAGIC)] != MAGIC or hashlib.blake2b(payload, digest_size=_CHECK).digest() != blob[len(MAGIC):head]:
        return None
    try:
        value = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    try:
        os.utime(entry)  # its mtime orders the eviction: recently used entries stay
    except OSError:
        pass
    return value


def store(entry: Path, value) -> None:
    """Write atomically (a reader sees the old entry or the new one); a cache that cannot
    be written is no cache, not an error."""
    payload = marshal.dumps(value)
    try:
        _write_atomically(entry, MAGIC + hashlib.blake2b(payload, digest_size=_CHECK).digest() + payload)
        _evict(entry.parent)
    except OSError:
        pass


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as f:
        f.write(data)


def _evict(root: Path) -> None:
    entries = []
    for p in root.iterdir():
        try:
            if not p.name.startswith("."):
                entries.append((p.stat().st_mtime_ns, p))
        except OSError:
            continue  # another process removed it
    entries.sort()
    for _, p in entries[: max(0, len(entries) - MAX_ENTRIES)]:
        try:
            p.unlink()
        except OSError:  # gone already, or (Windows) open in a reader: the next eviction retries
            pass
