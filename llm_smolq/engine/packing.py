"""Weight matrices packed sixteen rows side by side, for the kernel's 512-bit path.

Where the kernel runs its "avx512vnni" path, it multiplies sixteen rows at once, and reads
Q4_1, Q8_0, Q4_K and Q6_K matrices fastest with each group of sixteen rows interleaved
block by block (native/quants/rows16.c): no transpose of the rows on every pass, and one
stream of memory where there were sixteen. On the 3B shape a decode step took 16% less
time and a lookup draft's check of eight tokens 13% less (BENCHMARKS.md). The model file
is mapped copy-on-write, so packing rewrites this process's pages in place: the file on
disk is untouched, and the memory is what the weights would take once read. Every kernel
path reads packed matrices (with the same bits), so a later switch of path (sq_set_simd)
stays correct.

Packing is decided once per opened model, by its first engine. SMOLQ_PACK=0 leaves the
weights as the file has them, SMOLQ_PACK=1 packs them on any path (both to compare).
"""

from __future__ import annotations

import os

from llm_smolq._kernel import ffi, lib
from llm_smolq.model.model_file import ModelFile, TensorInfo

GROUP = 16


def packable(info: TensorInfo) -> bool:
    """A matrix of a type the kernel packs, in whole groups of sixteen rows."""
    return len(info.shape) == 2 and info.rows % GROUP == 0 and bool(lib.sq_rows16_packs(int(info.type)))


def _wanted() -> bool:
    setting = os.environ.get("SMOLQ_PACK")
    return setting == "1" if setting in ("0", "1") else bool(lib.sq_rows16_wanted())


def pack_weights(model: ModelFile) -> frozenset[str]:
    """The names of the model's tensors packed for the kernel, packing them on first call."""
    with model.pack_lock:
        if model.packed is not None:
            return model.packed
        names: list[str] = []
        try:
            if _wanted():
                base = ffi.from_buffer("uint8_t[]", model.data)
                for info in model.tensors.values():
                    if packable(info):
                        if lib.sq_rows16_pack(int(info.type), base + info.offset, info.rows, info.shape[0]) != 0:
                            raise MemoryError(f"no memory for a copy of sixteen rows of {info.name} to pack them")
                        names.append(info.name)
        finally:  # what was packed, even if not all: never packed twice
            model.packed = frozenset(names)
        return model.packed
