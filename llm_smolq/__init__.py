"""llm-smolq: quantized SmolLM3 / SmolLM2 GGUF models on the CPU, for the llm tool."""

import importlib
from typing import Any

from .errors import DeviceError, GGUFError, LayoutError, ResourceError

__all__ = ["DeviceError", "Engine", "GGUFError", "LayoutError", "ResourceError", "kernel", "load"]


def __getattr__(name: str) -> Any:
    # The engine pulls in the compiled kernel, numpy and gguf; `llm` imports this package
    # on every start just to list models, so those load on first use instead.
    if name in ("Engine", "load"):
        from . import engine

        return getattr(engine, name)
    if name == "kernel":
        # Not `from . import kernel`: that asks this hook for the name again, endlessly.
        return importlib.import_module(".kernel", __name__)
    raise AttributeError(f"module 'llm_smolq' has no attribute {name!r}")
