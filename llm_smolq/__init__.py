"""llm-smolq: quantized SmolLM3 / SmolLM2 GGUF models on the CPU, for the llm tool."""

from .engine import Engine, load
from .errors import DeviceError, GGUFError, LayoutError

__all__ = ["DeviceError", "Engine", "GGUFError", "LayoutError", "load"]
