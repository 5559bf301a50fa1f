# setuptools reads cffi_modules only from setup(); everything else is in pyproject.toml.
# The kernel is built for the stable ABI (cffi's default), so a wheel is tagged abi3 from
# 3.10 on: one wheel per platform serves every CPython the project supports.
import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "cffi_build"))
from build_kernel import BuildExtInParallel  # noqa: E402

setup(
    cffi_modules=["cffi_build/build_kernel.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtInParallel},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
