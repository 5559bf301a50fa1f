"""The tensor types the kernel reads, as the kernel lists them: native/quants/types.h holds
the one list, and Python asks for it rather than keeping its own."""

from __future__ import annotations

import re
from functools import cache


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
