"""cffi_build/build_kernel.py as a module: the builder is a script beside the package, not
part of it, and its compile flags are what the cross-compiled kernels must be built with."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("build_kernel", ROOT / "cffi_build" / "build_kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_kernel = _load()
