"""Weight matrices packed sixteen rows side by side, for the kernel's SIMD paths.

Where the kernel runs its "avx512vnni" path, it multiplies sixteen rows at once, and reads
every quantized type's matrices with each group of sixteen rows interleaved block by block
(native/quants/rows16.c): no transpose of the rows on every pass, and one stream of memory
where there were sixteen. On the 3B shape a decode step took 16% less time and a lookup
draft's check of eight tokens 13% less (BENCHMARKS.md); its sixteen-row kernels read
packed groups alone, so a matrix left in the file's layout there takes eight rows at a
time. On the "avx2" path only Q4_K matrices are packed: its eight-row Q4_K kernels take
fewer multiplies per row than the one-row vec_dot, which paid on a CPU bound by them (Zen
1); for the other types they take as many, and the file's layout serves as well. The
kernel says which types its path wants packed (sq_rows16_wanted).

The packed matrices go to one buffer, a file kept on disk (below) or else anonymous memory
(in huge pages where the system gives them), and the file's pages they came from are let
go of at once, so the process holds each weight once, as it would have after a first
forward pass. (Packed in place in a
copy-on-write mapping of the file instead, the 3B shape took 5.5 s to load, each page
copied on a fault of its own, where this takes about 1 s.) Every kernel path reads packed
matrices with the same bits, so a later switch of path (sq_set_simd) stays correct.

The packed copy is kept on disk as well (cache/packed_cache.py): a later load of the same
weights maps it instead of packing again (the 3B shape: 0.8-1.3 s to load with packing,
0.23 s from the kept copy). Where no copy can be kept (the cache off, or a system that
cannot reserve its disk space: macOS, Windows), packing goes into memory. The copy
is named by what its bytes depend on (packed_identity): the weights' content (a SHA-256
of every byte of them, remembered per state of the file: cache/packed_cache.py), which
matrices were packed, from where in the weights and to where (the set differs between the
kernel's paths), and what the kernel's packing does (packing_identity: its output on a
probe matrix of every type it packs). Not the file's path or mtime, its metadata, nor
which build of the kernel, where those leave the bytes the same: a copy of the file, or
the package installed again, maps the copy already kept; a byte of the weights changed
anywhere names another.

Packing is decided once per opened model, by its first engine. SMOLQ_PACK=0 leaves the
weights as the file has them, SMOLQ_PACK=1 packs them on any path (both to compare).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np

from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from llm_smolq import pages
from llm_smolq._kernel import ffi, lib
from llm_smolq.engine import memory
from llm_smolq.model.model_file import ModelFile, TensorInfo
from llm_smolq.cache import packed_cache
from llm_smolq.cache.kernel_identity import weights_digest, weights_start

GROUP = 16
ALIGN = 64  # each packed matrix starts on a cache line
PROBE_ROWS, PROBE_BLOCKS = 2 * GROUP, 3  # the probe matrix packing_identity packs, per type


def packable(info: TensorInfo) -> bool:
    """A matrix of a type the kernel packs, in whole groups of sixteen rows."""
    return len(info.shape) == 2 and info.rows % GROUP == 0 and bool(lib.sq_rows16_packs(int(info.type)))


def _wanted(info: TensorInfo) -> bool:
    """Whether to pack a packable matrix: where the kernels in use read its type faster
    packed, as the kernel says, unless SMOLQ_PACK says otherwise."""
    setting = os.environ.get("SMOLQ_PACK")
    return setting == "1" if setting in ("0", "1") else bool(lib.sq_rows16_wanted(int(info.type)))


_packing_identity: str | None = None


def packing_identity() -> str:
    """What the kernel's packing does, as a digest: the types it packs, each with its
    packed form of a probe matrix (two groups of rows, three blocks each, of pseudo-random
    bytes that are the same everywhere; about 30 kB in all, packed once per process).
    Packing only moves bytes, so two builds that move them alike give the same digest,
    wherever they were built or installed; one that lays a type out otherwise gives
    another."""
    global _packing_identity
    if _packing_identity is None:
        h = hashlib.sha256()
        for qt in QT:
            if not lib.sq_rows16_packs(int(qt)):
                continue
            elems, block_bytes = GGML_QUANT_SIZES[qt]
            n = PROBE_ROWS * PROBE_BLOCKS * block_bytes
            src = np.frombuffer(hashlib.shake_256(f"smolq rows16 probe {qt.name}".encode()).digest(n), np.uint8)
            dst = np.zeros(n, np.uint8)
            if lib.sq_rows16_pack(int(qt), ffi.from_buffer("uint8_t[]", src), ffi.from_buffer("uint8_t[]", dst),
                                  PROBE_ROWS, PROBE_BLOCKS * elems) != 0:
                raise RuntimeError(f"the kernel would not pack a {qt.name} probe")  # sq_rows16_packs said it would
            h.update(f"{int(qt)}:{qt.name}:".encode() + dst.tobytes())
        _packing_identity = h.hexdigest()
    return _packing_identity


def packed_identity(model: ModelFile, todo: list[TensorInfo], offsets: dict[str, int],
                    digest: str | None = None) -> str:
    """Everything the packed copy's bytes depend on: the weights (`digest`, of every byte
    of them, else computed here), which matrices were packed, where each was in the weights
    and where it went, and the kernel's packing. Not the header before the weights: a file
    whose metadata alone differs packs to the same bytes."""
    start = weights_start(model)
    return json.dumps({
        "weights": digest if digest is not None else weights_digest(model),
        "layout": [[info.name, int(info.type), list(info.shape), info.offset - start, offsets[info.name]]
                   for info in todo],
        "packing": packing_identity(),
        "group": GROUP,
    }, sort_keys=True)


def _anonymous(nbytes: int) -> np.ndarray:
    return np.frombuffer(pages.anonymous(nbytes), np.uint8, count=nbytes)


def _let_go(model: ModelFile, info: TensorInfo) -> None:
    """Drop the process's hold on the file's pages that lie wholly inside the tensor (they
    stay in the page cache, and come back if read)."""
    pages.let_go(model.data, info.offset, info.offset + info.n_bytes)


def pack_weights(model: ModelFile, threads: int = 1) -> dict[str, int]:
    """{tensor name: its offset in model.packed_data} for the tensors packed for the
    kernel, packing them on the first call, `threads` at a time (the kernel lets go of the
    GIL), largest first."""
    with model.pack_lock:
        if model.packed is not None:
            return model.packed
        todo = [info for info in model.tensors.values() if packable(info) and _wanted(info)]
        todo.sort(key=lambda t: -t.n_bytes)
        free = memory.available_memory()
        if free is not None and sum(info.n_bytes for info in todo) > free[0]:
            todo = []  # no room for a copy that cannot be paged back to the file: the file's layout
        offsets, size = {}, 0
        for info in todo:
            offsets[info.name] = size
            size += -(-info.n_bytes // ALIGN) * ALIGN
        keepable = todo and packed_cache.folder() is not None and packed_cache.reserves_space()
        weights = packed_cache.weights(model, threads) if keepable else None
        entry = packed_cache.entry_path(packed_identity(model, todo, offsets, weights.digest)) if weights else None
        kept = packed_cache.open_entry(entry, size, threads) if entry else None
        if kept is not None:
            for info in todo:  # any pages of them read before (the digest lets go of its own)
                _let_go(model, info)
            model.packed, model.packed_data = offsets, kept
            return model.packed
        # A new entry only for a digest of a settled file, sealed only if the file is still
        # as it was: else packing goes into memory (or the entry is not kept).
        keep = entry if weights and weights.settled else None
        with packed_cache.new_entry(keep, size, threads, lambda: packed_cache.unchanged(model)) if keep \
                else nullcontext() as into:
            packed = into if into is not None else _anonymous(size)
            _pack_into(model, todo, offsets, packed, threads)
        packed.flags.writeable = False  # the kernel only reads it; a kept entry is mapped read-only
        model.packed, model.packed_data = offsets, packed
        if into is not None and keep.exists():
            model.packed_kept = keep
        return model.packed


def _pack_into(model: ModelFile, todo: list[TensorInfo], offsets: dict[str, int], packed: np.ndarray,
               threads: int) -> None:
    src, dst = ffi.from_buffer("uint8_t[]", model.data), ffi.from_buffer("uint8_t[]", packed)

    def pack(info: TensorInfo) -> None:
        if lib.sq_rows16_pack(int(info.type), src + info.offset, dst + offsets[info.name], info.rows,
                              info.shape[0]) != 0:
            raise RuntimeError(f"the kernel would not pack {info.name}")  # packable() said it would
        _let_go(model, info)

    with ThreadPoolExecutor(max(1, threads)) as workers:
        for job in [workers.submit(pack, info) for info in todo]:
            job.result()
