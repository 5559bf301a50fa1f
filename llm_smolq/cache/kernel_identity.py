"""What the caches key their entries by: which build of the kernel this process runs, and
which weights it runs.

Another build may round differently (kept KV states), so a KV state made by one build is
never read by another. The weights are named by their content, read from the engine's own
mapping of the file, never by the file's path, inode or mtime: a copy of a file is the
same weights. The prompt cache takes the first and last MiB of them (weights_edges) and
adds the file's size and mtime; the packed weights take a digest of every byte of them
(weights_digest), which cache/packed_cache.py remembers per state of the file, as it takes
a second or two on the largest models.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Mapping, Protocol

from llm_smolq import pages

if TYPE_CHECKING:
    import numpy as np

EDGE_BYTES = 1 << 20  # of the model's weights hashed at each end
PIECE_BYTES = 16 << 20  # weights_digest hashes the weights in pieces this long, several at once

_fingerprint: dict | None = None


class PlacedTensor(Protocol):
    @property
    def offset(self) -> int: ...  # absolute byte offset in the file


class MappedModel(Protocol):
    """What the caches read of an opened model file (model/model_file.py's ModelFile, which
    this layer, below the model, does not import): where it is, the state of the file as
    it was mapped, its header's digest, the mapping itself, and where its tensors begin."""

    @property
    def path(self) -> str: ...
    @property
    def stat(self) -> os.stat_result | None: ...
    @property
    def digest(self) -> str: ...
    @property
    def data(self) -> np.memmap: ...
    @property
    def tensors(self) -> Mapping[str, PlacedTensor]: ...


def kernel_fingerprint() -> dict:
    """The compiled kernel's sha256 and the code path it picked."""
    global _fingerprint
    if _fingerprint is None:
        import llm_smolq._kernel as _kernel

        with open(_kernel.__file__, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest() if hasattr(hashlib, "file_digest") else \
                hashlib.sha256(f.read()).hexdigest()
        _fingerprint = {"sha256": digest, "simd": _kernel.ffi.string(_kernel.lib.sq_simd_name()).decode()}
    return _fingerprint


def weights_start(model: MappedModel) -> int:
    """Where the model's weights begin in its file: the first tensor's offset (the header,
    metadata and tensor table lie before it)."""
    return min((t.offset for t in model.tensors.values()), default=len(model.data))


def weights_edges(model: MappedModel) -> str:
    """A SHA-256 of the first and last MiB of the model's weights (where a file that is
    another model's differs: the embedding, the last layers), read from the engine's own
    mapping, so it describes the weights the engine runs."""
    data = model.data
    start = weights_start(model)
    h = hashlib.sha256()
    h.update(memoryview(data[start:start + EDGE_BYTES]))
    h.update(memoryview(data[max(start, len(data) - EDGE_BYTES):]))
    return h.hexdigest()


def weights_digest(model: MappedModel, threads: int = 1) -> str:
    """A SHA-256 of every byte of the model's weights, from weights_start to the end of the
    file, read from the engine's own mapping: each PIECE_BYTES piece is hashed on its own,
    `threads` at a time (hashlib lets go of the GIL), then the length and the pieces'
    digests in order are; the same whatever `threads` is. SHA-256 rather than BLAKE2b:
    on CPUs with SHA instructions (Zen, Ice Lake and later) it is the faster of the two
    (1.8 against 0.7 GB/s a thread on a Zen 4 EPYC). Each piece's pages are let go of
    once hashed, so hashing a large model does not leave all of it in the process's
    memory."""
    data = model.data
    start, end = weights_start(model), len(data)

    def piece(at: int) -> bytes:
        stop = min(at + PIECE_BYTES, end)
        digest = hashlib.sha256(memoryview(data[at:stop])).digest()
        _let_go(model, at, stop)
        return digest

    with ThreadPoolExecutor(max(1, threads)) as pool:
        pieces = list(pool.map(piece, range(start, end, PIECE_BYTES)))
    h = hashlib.sha256(f"smolq weights: {end - start} bytes in pieces of {PIECE_BYTES}\n".encode())
    for digest in pieces:
        h.update(digest)
    return h.hexdigest()


def _let_go(model: MappedModel, start: int, end: int) -> None:
    """Drop the process's hold on the file's pages wholly inside [start, end) (they stay in
    the page cache, and come back if read)."""
    pages.let_go(model.data, start, end)
