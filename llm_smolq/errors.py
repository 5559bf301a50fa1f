"""Every exception llm-smolq raises. Each message says what was expected, what was found,
and how to fix it. (The plugin turns them into llm.ModelError or click errors for `llm`.)"""

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


class ChatTemplateError(ValueError):
    """A chat template that cannot be compiled or rendered, or that broke a safety rule.

    `template_message` holds the text a template passed to `raise_exception` (None for
    other failures); `lineno` the template line, when known.
    """

    def __init__(self, message: str, *, template_message: str | None = None, lineno: int | None = None):
        super().__init__(message)
        self.template_message = template_message
        self.lineno = lineno


class CatalogError(Exception):
    """Something the catalog cannot do; the message is one line and says how to fix it."""


class ModelNotFound(CatalogError):
    """The model id is unknown, or its file is not on disk."""


class UnknownModel(ModelNotFound):
    """A model id neither built in nor registered."""


class UnknownQuant(CatalogError):
    """A quant the model is not published in."""


class DownloadError(CatalogError):
    """A download that did not finish: network, disk, or a file that is not what was asked for."""


class FetchError(RuntimeError):
    """A model file that could not be taken out of its PyPI wheel."""


class BadBlock(Exception):
    """A prompt-cache block file that cannot be trusted (the cache drops it and goes on);
    `inode` names the file that was read."""

    def __init__(self, reason: str, inode: int | None = None):
        super().__init__(reason)
        self.inode = inode
