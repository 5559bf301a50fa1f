"""The exceptions llm-smolq raises for input it cannot use. Each message says what was
expected, what was found, and how to fix it."""


class GGUFError(ValueError):
    """A file that is not a usable GGUF model."""


class LayoutError(ValueError):
    """An array whose dtype, shape, contiguity, offset or alignment the kernel cannot read."""


class DeviceError(ValueError):
    """Memory that does not live on the CPU."""
