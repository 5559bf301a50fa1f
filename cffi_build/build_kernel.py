"""cffi builder for the native kernel (out-of-line API mode).

`pip install -e .` runs this through setup.py's cffi_modules; running it directly
(`python cffi_build/build_kernel.py`) rebuilds the extension in place.
"""

import os
import sys
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"


def _cdef_text() -> str:
    # smolq.h is valid C for the compiler; cffi's parser takes it without preprocessor lines.
    lines = (NATIVE / "smolq.h").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def _compile_args() -> list[str]:
    # -fno-wrapv: Python's own CFLAGS carry -fwrapv, which stops gcc vectorizing int-counted loops.
    args = ["-std=c11", "-O3", "-fno-wrapv", "-Wall", "-Wextra", "-pthread", "-fno-math-errno"]
    if os.environ.get("SMOLQ_DEBUG"):
        args = [a if a != "-O3" else "-O0" for a in args] + ["-g"]
    return args


def make_builder(absolute_sources: bool = False) -> FFI:
    # setuptools insists on sources relative to the project; cffi's own compile() runs
    # the compiler from its temporary directory, where only absolute paths resolve.
    sources = sorted(NATIVE.glob("*.c"))
    builder = FFI()
    builder.cdef(_cdef_text())
    builder.set_source(
        "llm_smolq._kernel",
        '#include "smolq.h"',
        sources=[str(p if absolute_sources else p.relative_to(ROOT)) for p in sources],
        include_dirs=[str(NATIVE)],
        extra_compile_args=_compile_args(),
        extra_link_args=["-pthread"],
        libraries=["m"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    make_builder(absolute_sources=True).compile(tmpdir=str(ROOT / "build" / "cffi"), verbose="-v" in sys.argv)
    # compile() leaves the module under tmpdir/llm_smolq/; move it next to the package
    # under the name `pip install -e .` gives it (cffi builds for the stable ABI), so the
    # two ways of building replace each other instead of one shadowing the other.
    for old in (ROOT / "llm_smolq").glob("_kernel*.so"):
        old.unlink()
    for built in (ROOT / "build" / "cffi" / "llm_smolq").glob("_kernel*.so"):
        built.replace(ROOT / "llm_smolq" / "_kernel.abi3.so")
