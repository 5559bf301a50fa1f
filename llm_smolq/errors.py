"""The exceptions llm-smolq raises for input it cannot use. Each message says what was
expected, what was found, and how to fix it."""

from typing import Any


def brief(value: Any, limit: int = 80) -> str:
    """repr(value) cut to `limit` characters: values read from a damaged file can be huge."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 5]}...{text[-2:]}"


class GGUFError(ValueError):
    """A file that is not a usable GGUF model."""


class LayoutError(ValueError):
    """An array whose dtype, shape, contiguity, offset or alignment the kernel cannot read."""


class DeviceError(ValueError):
    """Memory that does not live on the CPU."""


class ResourceError(ValueError):
    """A request (a context length, say) that needs more memory than the machine has."""


class ConstraintError(ValueError):
    """A schema or grammar that cannot constrain decoding, with the reason."""
