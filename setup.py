# setuptools reads cffi_modules only from setup(); everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["cffi_build/build_kernel.py:ffibuilder"])
