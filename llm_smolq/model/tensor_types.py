"""The tensor types the kernel reads, as the kernel lists them: native/quants/types.h holds
the one list, and Python asks for it rather than keeping its own."""

from __future__ import annotations

import math
import re
from functools import cache
from typing import Iterable, Sequence


@cache
def weight_types() -> dict[int, str]:
    """GGUF type id -> name ("Q4_K", ...) of every type the kernel reads as weights."""
    from llm_smolq._kernel import ffi, lib

    n = lib.sq_weight_types(ffi.NULL, 0)
    ids = ffi.new("int[]", n)
    lib.sq_weight_types(ids, n)
    return {int(t): ffi.string(lib.sq_type_name(t)).decode("ascii") for t in ids}


@cache
def file_type_pattern() -> re.Pattern[str]:
    """A file name's quant at its end (``SmolLM3-Q4_K_M``): a weight type's name, and for the
    K types the mixes llama.cpp names after them (_S, _M, _L)."""
    names = sorted(weight_types().values(), key=len, reverse=True)
    alternatives = [re.escape(n) + (r"(?:_[SML])?" if n.endswith("_K") else "") for n in names]
    return re.compile(r"(?:^|[-_.])(" + "|".join(alternatives) + r")$", re.IGNORECASE)


def file_quant(file_type: object, tensors: Iterable[tuple[int, Sequence[int]]]) -> str | None:
    """The quant a GGUF file holds, as llama.cpp names it ("Q4_K_M", "Q8_0", "F16"), from its
    header: `general.file_type` (`file_type`) when it names a type the kernel reads and the
    file has weights of that type; else the type holding most of the parameters of its
    matrices (`tensors`: (GGUF type id, shape) pairs). None when neither says."""
    from gguf import LlamaFileType

    types = weight_types()
    present = {type_id for type_id, _ in tensors}
    try:
        named = LlamaFileType(file_type) if isinstance(file_type, int) and not isinstance(file_type, bool) else None
    except ValueError:  # a file type newer than the gguf package, or nonsense
        named = None
    if named is not None:
        name = named.name.removeprefix("MOSTLY_").removeprefix("ALL_")
        base = name[:-2] if re.search(r"_K_[SML]$", name) else name
        if any(types[t] == base for t in present if t in types):
            return name
    weight: dict[int, int] = {}
    for type_id, shape in tensors:
        if type_id in types and len(shape) >= 2:  # the matrices: norms are F32 everywhere
            weight[type_id] = weight.get(type_id, 0) + math.prod(shape)
    return types[max(weight, key=weight.__getitem__)] if weight else None
