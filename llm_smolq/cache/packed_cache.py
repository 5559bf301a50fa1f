"""Packed weights kept on disk, so that a model is packed once rather than on every load.

Packing the 3B shape's 1.8 GB of matrices (engine/packing.py) takes most of a second, and
nearly all of that is the first touch of fresh memory (0.6-3.8 s for 1.9 GB on the
machines measured here), not the rearranging; a one-shot `llm -m … "prompt"` would pay it
on every run. So the packed matrices are written straight into a file of the cache
directory, through a shared mapping (the kernel writes the pages to disk in the
background), and a later load maps that file, whose pages the page cache usually holds.

Entries live in the cache directory's packed/. An entry is named by what its bytes
depend on, and nothing else (engine/packing.py says what: a SHA-256 of every byte of the
weights, which matrices were packed where, what the kernel's packing does): a copy of a
model file under another name, or the same kernel installed again elsewhere, finds the
entry already there, and a file whose weights differ anywhere, one byte edited in place
among them, gets its own. It ends with a trailer: a magic, that name, the size of the
data and the 64-bit sum of its words, and it is only used when all of them check out, so
a torn or damaged entry means packing again, never wrong weights. A new entry's disk space is reserved
before anything is written into its mapping: a write to a mapped page the disk has no
room for would end the process. Anything else (the cache off, no room, an unwritable
directory) leaves packing into memory, as without the cache. So does a system without
posix_fallocate (macOS, Windows; Linux and FreeBSD have it): with no way to reserve the
space, no entry is made there, and the weights are not even hashed for one.

The digest is hashed once per state of the file and remembered in packed/weights.index:
hashing the 3B shape's 1.9 GB of weights takes 1.25 s on one thread, 0.62 s on two, and
SmolLM2-135M's 98 MB 0.06 s and 0.03 s (from the page cache; a Zen 4 EPYC), which the
first load of a file, of a copy of it, or of it once changed pays, while a later load of
the same state reads the index (0.3 ms; the 3B shape then loads in 0.11 s, as before). A
state is the file's resolved path, size, mtime, ctime (which catches an edit that put the
mtime back), inode and device, as open_model mapped it, with its header's digest; the
index keeps the REMEMBERED last used, is checksummed and replaced whole, and is as none
when it does not check out. A digest is remembered, and names a new entry, only when the
file is still the one mapped, unchanged while it was hashed and for SETTLED_SECONDS
before, by its ctime (a change within one tick of its timestamps would leave them as
they were); else it serves this load alone, to map an entry already kept, or the weights
are packed into memory. A new entry is sealed only if its file is still unchanged once
it is packed.

At most KEEP entries stay, the most recently used (a load that maps an entry marks it
used): before a new one is reserved the others are cut to KEEP - 1, and after it is in
place to KEEP, least recently used first. Deleting an entry another process has mapped
does not harm that process: the file's name goes, its pages stay until the last mapping
of it is gone (and so does its space on disk, until then). Where the system refuses to
delete a file in use (Windows), the entry stays, and a later eviction deletes it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from llm_smolq import pages
from llm_smolq.cache.atomic_file import TEMP_PREFIX, replaced_atomically
from llm_smolq.cache.kernel_identity import MappedModel, weights_digest
from llm_smolq.paths import header_cache_dir

MAGIC = b"SMOLQPK1"  # bump the digit when the trailer's layout changes
TRAILER = struct.Struct("<8s16sQQ")  # magic, key, data bytes, sum of the data's uint64 words
SUFFIX = ".packed"
KEEP = 3  # entries kept: each is as large as the model's packed matrices
STALE_TEMP_SECONDS = 3600  # a temporary file this old was left by a process that died
# The weights' digest of the file states last seen: in packed/, beside what it names and
# out of the way of the header cache, which counts every file at the top of the directory
INDEX = "weights.index"
INDEX_MAGIC = b"SMOLQWI1"  # bump the digit when the index's layout changes
REMEMBERED = 64  # file states the index keeps, the most recently used
SETTLED_SECONDS = 2.0  # a file changed (its ctime) more recently may change again within the tick


def folder() -> Path | None:
    """packed/ of the cache directory; None when the cache is off."""
    root = header_cache_dir()
    return None if root is None else root / "packed"


def reserves_space() -> bool:
    """Whether this system can reserve a new entry's disk space before its mapping is
    written (os.posix_fallocate): where it cannot, no entry is made."""
    return hasattr(os, "posix_fallocate")


def entry_path(identity: str) -> Path | None:
    """Where the packed weights named by identity (everything their bytes depend on) are
    kept; None when the cache is off."""
    where = folder()
    if where is None:
        return None
    key = hashlib.blake2b(identity.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    return where / f"{key}{SUFFIX}"


def most_bytes(sizes: Iterable[int]) -> int:
    """The most the kept entries can take when no model's packed weights are larger than
    the largest of `sizes`: KEEP of those."""
    return KEEP * max(sizes, default=0)


def most_bytes_here(model_files: Iterable[int], *more: int) -> int:
    """most_bytes for the sizes of the model files llm-smolq has here (`model_files`, from
    the catalog: a model's packed weights are never larger than its file), the entries
    kept now, and `more` (a copy just made)."""
    return most_bytes([*model_files, *(k.size for k in kept_entries()[1]), *more])


class Kept(NamedTuple):
    path: Path
    size: int  # bytes
    used: float  # when last used (mapped or made), as a time.time()


def kept_entries() -> tuple[Path | None, list[Kept]]:
    """The folder of kept packed weights (None when the cache is off) and its entries,
    most recently used first."""
    where, found = folder(), []
    if where is None:
        return None, []
    try:
        names = [p for p in where.iterdir() if p.name.endswith(SUFFIX)]
    except OSError:
        return where, []
    for p in names:
        try:
            st = p.stat()
        except OSError:  # another process removed it
            continue
        found.append(Kept(p, st.st_size, st.st_mtime))
    return where, sorted(found, key=lambda k: (-k.used, k.path.name))


class Weights(NamedTuple):
    digest: str  # kernel_identity.weights_digest of the model's weights
    # Whether the digest is of the file in a state that cannot change unseen (unchanged
    # while hashed, and since it was mapped, and last changed SETTLED_SECONDS before): only
    # such a digest is remembered, or names a new entry.
    settled: bool


def weights(model: MappedModel, threads: int = 1) -> Weights:
    """The digest of the model's weights: remembered in the index when this state of the
    file (its resolved path, size, mtime, ctime, inode and device, and its header's
    digest) was hashed before, else hashed, `threads` at a time, and remembered if the
    state is settled. A changed file (another mtime or size, or ctime: an edit that put
    its mtime back) or a copy (another path and inode) is another state, hashed anew."""
    mapped = _state(model.path, model.stat)
    try:
        now = _state(model.path, os.stat(model.path))
    except OSError:
        now = None
    index = _index_path() if mapped is not None and mapped == now else None
    if index is None:  # no state to go by, or the file changed since it was mapped
        return Weights(weights_digest(model, threads), False)
    records = _read_index(index)
    for i, record in enumerate(records):
        if record["state"] == mapped and record["header"] == model.digest:
            if i != len(records) - 1:  # the most recently used last
                _write_index(index, [*records[:i], *records[i + 1:], record])
            return Weights(record["weights"], True)
    began = time.time()
    digest = weights_digest(model, threads)
    try:
        after = _state(model.path, os.stat(model.path))
    except OSError:
        after = None
    # the ctime, not the mtime: every write sets it from this machine's clock, and no tool
    # can set it (an mtime may lie in the future)
    settled = after == mapped and began - mapped[3] / 1e9 >= SETTLED_SECONDS
    if settled:
        record = {"state": mapped, "header": model.digest, "weights": digest}
        _write_index(index, [*(r for r in _read_index(index) if r["state"] != mapped), record])
    return Weights(digest, settled)


def unchanged(model: MappedModel) -> bool:
    """Whether the file at the model's path is still the one mapped, in the state it was
    mapped in."""
    try:
        now = _state(model.path, os.stat(model.path))
    except OSError:
        return False
    return now is not None and now == _state(model.path, model.stat)


def _state(path: str, st: os.stat_result | None) -> list | None:
    if st is None:
        return None
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _index_path() -> Path | None:
    where = folder()
    return None if where is None else where / INDEX


def _read_index(index: Path) -> list[dict]:
    """The index's records, least recently used first; none when it is missing, damaged
    (its checksum or its records' form) or foreign: then the digests are hashed again."""
    try:
        blob = index.read_bytes()
    except OSError:
        return []
    head = len(INDEX_MAGIC) + 16
    if blob[:len(INDEX_MAGIC)] != INDEX_MAGIC or hashlib.blake2b(blob[head:], digest_size=16).digest() != \
            blob[len(INDEX_MAGIC):head]:
        return []
    try:
        records = json.loads(blob[head:])
    except ValueError:
        return []
    good = (isinstance(records, list) and all(
        isinstance(r, dict) and set(r) == {"state", "header", "weights"}
        and isinstance(r["state"], list) and len(r["state"]) == 6 and isinstance(r["state"][0], str)
        and all(type(x) is int for x in r["state"][1:])
        and isinstance(r["header"], str) and isinstance(r["weights"], str) and len(r["weights"]) == 64
        for r in records))
    return records if good else []


def _write_index(index: Path, records: list[dict]) -> None:
    """The index replaced by `records` (the REMEMBERED last), atomically; nothing when it
    cannot be written (the digests are hashed again next time)."""
    payload = json.dumps(records[-REMEMBERED:]).encode()
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        with replaced_atomically(index) as f:
            f.write(INDEX_MAGIC + hashlib.blake2b(payload, digest_size=16).digest() + payload)
    except OSError:
        pass


def word_sum(data: np.ndarray, threads: int = 1) -> int:
    """The sum of data's little-endian uint64 words, modulo 2**64 (data: a multiple of 8
    bytes), `threads` pieces at a time (numpy lets go of the GIL)."""
    words = data.view("<u8")
    pieces = np.array_split(words, max(1, threads))
    with ThreadPoolExecutor(max(1, threads)) as pool:
        sums = list(pool.map(lambda p: int(p.sum(dtype=np.uint64)), pieces))
    return sum(sums) % (1 << 64)


def open_entry(path: Path, n_bytes: int, threads: int = 1) -> np.ndarray | None:
    """The kept packed weights (n_bytes, read-only), or None when there are none that
    check out (a damaged entry is removed)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != n_bytes + TRAILER.size:
                raise ValueError("another size")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        pages.prefer_huge(mapped)  # before the word sum reads it in
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        _remove(path)
        return None
    magic, key, size, total = TRAILER.unpack_from(mapped, n_bytes)
    data = np.frombuffer(mapped, np.uint8, count=n_bytes)
    if magic != MAGIC or key.hex() + SUFFIX != path.name or size != n_bytes or word_sum(data, threads) != total:
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used: eviction reads the mtime
    except OSError:
        pass
    return data


@contextmanager
def new_entry(path: Path, n_bytes: int, threads: int = 1,
              still_good: Callable[[], bool] = lambda: True) -> Iterator[np.ndarray | None]:
    """A writable n_bytes array mapped from a new entry, or None (nothing to write into:
    pack into memory instead). Once the block has filled it, the entry is sealed with its
    trailer and takes path's name (a reader sees no entry or a whole one), if still_good()
    says what was written is still what the name says (the model file unchanged); if not,
    or if the block raises, it is deleted (this process's mapping of it stays good)."""
    _evict(path.parent, KEEP - 1)  # room for this one within KEEP, before its space is taken
    mapped, temp = _reserve(path, n_bytes + TRAILER.size)
    if mapped is None:
        yield None
        return
    data = np.frombuffer(mapped, np.uint8, count=n_bytes)
    try:
        yield data
    except BaseException:
        _remove(temp)
        raise
    if not still_good():
        _remove(temp)
        return
    TRAILER.pack_into(mapped, n_bytes, MAGIC, bytes.fromhex(path.name[:-len(SUFFIX)]), n_bytes,
                      word_sum(data, threads))
    try:
        os.replace(temp, path)
    except OSError:  # not kept; this process's mapping stays good
        _remove(temp)
        return
    _evict(path.parent, KEEP, path)


def _reserve(path: Path, n_bytes: int) -> tuple[mmap.mmap | None, Path | None]:
    """A new temporary file beside path with n_bytes of disk reserved, mapped for writing;
    (None, None) where there is none to be had (an unwritable directory, no room, no
    posix_fallocate on this system)."""
    if not reserves_space():
        return None, None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
    except OSError:
        return None, None
    temp = Path(name)
    try:
        os.posix_fallocate(fd, 0, n_bytes)
        mapped = mmap.mmap(fd, n_bytes)
        pages.prefer_huge(mapped)  # so the pages it is written into are cached whole for later loads
        return mapped, temp
    except (OSError, ValueError, AttributeError):
        _remove(temp)
        return None, None
    finally:
        os.close(fd)


def _evict(root: Path, keep: int, newest: Path | None = None) -> None:
    """Drop the least recently used entries past the `keep` most recent (`newest`, just
    made, counted first and never dropped), and temporary files left by processes that
    died while writing one."""
    now = time.time()
    entries = []
    try:
        found = list(root.iterdir())
    except OSError:  # no folder yet: nothing kept
        return
    for p in found:
        try:
            st = p.stat()
        except OSError:
            continue
        if p.name.startswith(TEMP_PREFIX) and now - st.st_mtime > STALE_TEMP_SECONDS:
            _remove(p)
        elif p.name.endswith(SUFFIX) and p != newest:
            entries.append((st.st_mtime_ns, p.name, p))
    others = keep - (newest is not None)
    for *_, p in sorted(entries, reverse=True)[max(others, 0):]:
        _remove(p)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:  # gone already, or (Windows) mapped by a process: a later eviction retries
        pass
