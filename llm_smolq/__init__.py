"""llm-smolq: quantized SmolLM3 / SmolLM2 GGUF models on the CPU, for the llm tool."""

import importlib
from typing import Any

from llm_smolq.errors import DeviceError, GGUFError, LayoutError, ResourceError

__all__ = ["DeviceError", "Engine", "GGUFError", "LayoutError", "Q8_0_BLOCK", "ResourceError", "kernel", "load"]


def __getattr__(name: str) -> Any:
    # The engine pulls in the compiled kernel, numpy and gguf; `llm` imports this package
    # on every start just to list models, so those load on first use instead.
    if name in ("Engine", "load"):
        from llm_smolq.engine import engine

        return getattr(engine, name)
    if name == "Q8_0_BLOCK":  # the dtype of a q8_0 KV cache's blocks
        from llm_smolq.engine.kv_types import Q8_0_BLOCK

        return Q8_0_BLOCK
    if name == "kernel":
        # Not `from . import kernel`: that asks this hook for the name again, endlessly.
        return importlib.import_module(".kernel", __name__)
    raise AttributeError(f"module 'llm_smolq' has no attribute {name!r}")
