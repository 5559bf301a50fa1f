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

Location: $SMOLQ_CACHE_DIR, else $XDG_CACHE_HOME/llm-smolq, else ~/.cache/llm-smolq.
SMOLQ_CACHE_DIR=off turns the cache off.
"""

from __future__ import annotations

import hashlib
import marshal
import os
from pathlib import Path
from typing import Callable

from llm_smolq.store.atomic_file import replaced_atomically
from llm_smolq.store.paths import header_cache_dir
from llm_smolq.model.gguf_file import GGUFHeader, RawTensor, header_digest, read_header

MAGIC = b"SMOLQIX1"  # bump the digit when the stored layout changes
_CHECK = 16  # bytes of blake2b over the payload, after the magic
MAX_ENTRIES = 64  # beyond this the least recently used entries go


def read_header_cached(path: str) -> GGUFHeader:
    """read_header(path), from the cache when the file's header is unchanged."""
    root = header_cache_dir()
    entry = _header_entry(root, path) if root else None
    if entry is not None:
        cached = _load(entry)
        if cached is not None:
            header = _header_from(cached)
            if (
                header is not None
                and header.file_size == os.path.getsize(path)
                and header_digest(path, header.header_bytes) == header.digest
            ):
                return header
    header = read_header(path)
    if entry is not None:
        _store(entry, _header_to(header))
    return header


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


def _header_entry(root: Path, path: str) -> Path | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    key = f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}".encode("utf-8", "surrogateescape")
    return root / f"{hashlib.blake2b(key, digest_size=16).hexdigest()}.header"


def _header_to(h: GGUFHeader) -> tuple:
    tensors = [(t.name, t.type_id, t.shape, t.offset) for t in h.tensors]
    return (h.version, h.metadata, tensors, h.alignment, h.data_offset, h.file_size, h.little_endian,
            h.header_bytes, h.digest)


def _header_from(value) -> GGUFHeader | None:
    try:
        version, metadata, tensors, alignment, data_offset, file_size, little, n_bytes, digest = value
        return GGUFHeader(version, metadata, [RawTensor(*t) for t in tensors], alignment, data_offset,
                          file_size, little, n_bytes, digest)
    except (TypeError, ValueError):
        return None


def _load(entry: Path):
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


def _store(entry: Path, value) -> None:
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
        except OSError:
            pass
