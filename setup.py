# setuptools reads cffi_modules only from setup(); everything else is in pyproject.toml.
# The kernel is built for the stable ABI (cffi's default), so a wheel is tagged abi3 from
# 3.10 on: one wheel per platform serves every CPython the project supports.
from setuptools import setup

setup(
    cffi_modules=["cffi_build/build_kernel.py:ffibuilder"],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
