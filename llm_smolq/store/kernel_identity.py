"""What the caches key their entries by: which build of the kernel this process runs, and
which weights it runs.

Another build may round differently (kept KV states), so a KV state made by one build is
never read by another. The weights are named by their content, read from the engine's own
mapping of the file, never by the file's path, inode or mtime: a copy of a file is the
same weights. (The prompt cache adds the file's size and mtime to that; the packed
weights, which depend on nothing but the bytes, do not.)
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from llm_smolq.model.model_file import ModelFile, TensorInfo

EDGE_BYTES = 1 << 20  # of the model's weights hashed at each end
RUNS_PER_TENSOR = 8  # short runs of bytes sampled along each tensor named to weights_sample
RUN_BYTES = 64

_fingerprint: dict | None = None


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


def weights_edges(model: ModelFile) -> str:
    """A SHA-256 of the first and last MiB of the model's weights (where a file that is
    another model's differs: the embedding, the last layers), read from the engine's own
    mapping, so it describes the weights the engine runs."""
    data = model.data
    weights_start = min((t.offset for t in model.tensors.values()), default=len(data))
    h = hashlib.sha256()
    h.update(memoryview(data[weights_start:weights_start + EDGE_BYTES]))
    h.update(memoryview(data[max(weights_start, len(data) - EDGE_BYTES):]))
    return h.hexdigest()


def weights_sample(model: ModelFile, tensors: Iterable[TensorInfo]) -> str:
    """A SHA-256 of RUNS_PER_TENSOR runs of RUN_BYTES spread evenly along each of the
    tensors (its first and last bytes among them), with their names: a tensor changed as
    a whole (a fine-tune merged into some matrices only) changes it, wherever it lies in
    the file. A few pages per tensor are read."""
    data = model.data
    h = hashlib.sha256()
    for info in tensors:
        h.update(f"{info.name}\0{int(info.type)}\0{info.shape}\0".encode())
        span = max(info.n_bytes - RUN_BYTES, 0)
        for i in range(RUNS_PER_TENSOR):
            at = info.offset + span * i // (RUNS_PER_TENSOR - 1)
            h.update(memoryview(data[at:at + min(RUN_BYTES, info.n_bytes)]))
    return h.hexdigest()


def weights_identity(model: ModelFile, sampled: Iterable[TensorInfo] = ()) -> dict:
    """The model's weights as the engine runs them, by content alone: the size of the
    mapped file, the digest of its header (metadata, vocabulary, tensor table) taken when
    it was opened, weights_edges, and weights_sample of the `sampled` tensors."""
    return {"size": len(model.data), "header": model.digest, "edges": weights_edges(model),
            "sample": weights_sample(model, sampled)}
