"""The KV cache's element types: what one cached row of head_dim values is, in numpy and
in the kernel.

- "f16" (the default, as llama.cpp's): halves; attention in one online-softmax pass.
- "f32": floats; attention in llama.cpp's own order, so logits are its bits.
- "q8_0": llama.cpp's Q8_0 blocks (a half scale and 32 signed byte codes per 32 values,
  34 bytes), just over half the memory of "f16"; attention as for "f16".

A cache is an array [n_layers, n_kv_heads, n_ctx, head_dim / per_item] of `dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as GGML

from llm_smolq import defaults

#: One Q8_0 block as numpy sees it: field "d" the scale, "qs" the 32 codes.
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (32,))],
                      metadata={"name": "Q8_0 blocks (llm_smolq.Q8_0_BLOCK)", "expr": "llm_smolq.Q8_0_BLOCK"})


@dataclass(frozen=True)
class KVType:
    name: str          # as the options spell it
    dtype: np.dtype    # an element of a cache array
    per_item: int      # head_dim values in one element
    kernel_type: int   # the kernel's enum sq_type (GGUF's type numbers)
    align: int         # bytes the kernel needs a cache's address to be a multiple of

    def row_items(self, head_dim: int) -> int:
        """Elements of one cached row; a ValueError where head_dim does not divide."""
        if head_dim % self.per_item:
            raise ValueError(f"kv_dtype={self.name!r} stores {self.per_item} values per block, which does not "
                             f"divide this model's head_dim of {head_dim}; use kv_dtype='f16'")
        return head_dim // self.per_item

    def row_bytes(self, head_dim: int) -> int:
        return self.row_items(head_dim) * self.dtype.itemsize


KV_TYPES = {
    "f16": KVType("f16", np.dtype(np.float16), 1, int(GGML.F16), 2),
    "f32": KVType("f32", np.dtype(np.float32), 1, int(GGML.F32), 4),
    "q8_0": KVType("q8_0", Q8_0_BLOCK, 32, int(GGML.Q8_0), 2),
}
DEFAULT_KV_TYPE = defaults.KV_CACHE
_BY_DTYPE = {t.dtype: t for t in KV_TYPES.values()}


def kv_type(name: str) -> KVType:
    """The type an option names; a ValueError listing them otherwise."""
    try:
        return KV_TYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"kv_dtype must be one of {', '.join(map(repr, KV_TYPES))}, got {name!r}") from None


def kv_type_of(dtype: np.dtype) -> KVType | None:
    """The type whose arrays have this dtype, or None."""
    return _BY_DTYPE.get(np.dtype(dtype))
