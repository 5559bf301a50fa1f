"""cffi builder for the native kernel (out-of-line API mode).

`pip install -e .` runs this through setup.py's cffi_modules; running it directly
(`python cffi_build/build_kernel.py`) rebuilds the extension in place.
With SMOLQ_SANITIZE=1 in the environment either way builds the kernel with AddressSanitizer
and UndefinedBehaviorSanitizer (see the README for how to load it).
With SMOLQ_VNNI_VIA_SIMDE=<SIMDe's include directory> (simde_py.get_include() of the
simde-py package) it builds a test kernel whose AVX-512 VNNI vec_dots take the VNNI
instructions from SIMDe and are chosen on any AVX2 CPU (tests/test_avx512vnni.py).
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cffi import FFI
from setuptools import Distribution
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"


def _cdef_text() -> str:
    # smolq.h is valid C for the compiler; cffi's parser takes it without preprocessor lines.
    lines = (NATIVE / "smolq.h").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


# AddressSanitizer and UndefinedBehaviorSanitizer, plus float-to-int conversions out of range
# (undefined, but not in gcc's `undefined` set); no recovery: the first finding prints its
# report and ends the process. The ASan runtime must be the first library loaded, so an
# uninstrumented python needs it in LD_PRELOAD (README, "Sanitizer build").
SANITIZE = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all"]


def sanitize_requested() -> bool:
    return os.environ.get("SMOLQ_SANITIZE", "") not in ("", "0")


def _compile_args(sanitize: bool) -> list[str]:
    # -fno-wrapv: Python's own CFLAGS carry -fwrapv, which stops gcc vectorizing int-counted
    # loops (and would hide signed overflow from the sanitizer).
    args = ["-std=c11", "-O3", "-fno-wrapv", "-Wall", "-Wextra", "-pthread", "-fno-math-errno"]
    if sanitize:
        # -g1: the line tables a report's stack needs, at three quarters of -g's build time.
        args = [a if a != "-O3" else "-O1" for a in args] + ["-g1", "-fno-omit-frame-pointer", *SANITIZE]
    elif os.environ.get("SMOLQ_DEBUG"):
        args = [a if a != "-O3" else "-O0" for a in args] + ["-g"]
    return args


def _simde_args(vnni_via_simde: str | None) -> list[str]:
    # -isystem: SIMDe's headers are not held to the kernel's -Wall -Wextra. -O2 (after the
    # -O3, so it wins): the same bits, and the VNNI file builds in 5 s instead of 11.
    if not vnni_via_simde:
        return []
    if not (Path(vnni_via_simde) / "simde" / "x86" / "avx512" / "dpbusd.h").is_file():
        raise FileNotFoundError(f"no SIMDe headers (simde/x86/avx512/dpbusd.h) under {vnni_via_simde}")
    return ["-DSQ_VNNI_VIA_SIMDE", "-isystem", str(vnni_via_simde), "-O2"]


def make_builder(absolute_sources: bool = False, sanitize: bool | None = None,
                 vnni_via_simde: str | None = None) -> FFI:
    """sanitize: None follows SMOLQ_SANITIZE. vnni_via_simde: SIMDe's include directory for
    a test build of the VNNI kernels on any AVX2 CPU; None follows SMOLQ_VNNI_VIA_SIMDE."""
    if sanitize is None:
        sanitize = sanitize_requested()
    if vnni_via_simde is None:
        vnni_via_simde = os.environ.get("SMOLQ_VNNI_VIA_SIMDE") or None
    # setuptools insists on sources relative to the project; cffi's own compile() runs
    # the compiler from its temporary directory, where only absolute paths resolve.
    sources = sorted(NATIVE.rglob("*.c"))
    builder = FFI()
    builder.cdef(_cdef_text())
    builder.set_source(
        "llm_smolq._kernel",
        '#include "smolq.h"',
        sources=[str(p if absolute_sources else p.relative_to(ROOT)) for p in sources],
        include_dirs=[str(NATIVE)],
        extra_compile_args=_compile_args(sanitize) + _simde_args(vnni_via_simde),
        extra_link_args=["-pthread", *(SANITIZE if sanitize else [])],
        libraries=["m"],
    )
    return builder


class BuildExtInParallel(build_ext):
    """setuptools compiles an extension's C files one after another; with gcc or clang this
    compiles them a CPU each (the kernel's take a minute on one slow core). setup.py and
    compile_kernel() both build with it."""

    def build_extension(self, ext):
        if self.compiler.compiler_type != "unix" or len(ext.sources) < 2:
            return super().build_extension(ext)
        one_by_one = self.compiler.compile

        def each_at_once(sources, *args, **kwargs):
            jobs = min(len(sources), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                       else os.cpu_count() or 1)
            with ThreadPoolExecutor(jobs) as pool:
                objects = list(pool.map(lambda source: one_by_one([source], *args, **kwargs), sources))
            return [o for some in objects for o in some]

        self.compiler.compile = each_at_once
        try:
            return super().build_extension(ext)
        finally:
            del self.compiler.compile


def compile_kernel(tmpdir: Path, sanitize: bool | None = None, verbose: bool = False,
                   vnni_via_simde: str | None = None) -> Path:
    """Build the extension under tmpdir and return the path of the module file."""
    builder = make_builder(absolute_sources=True, sanitize=sanitize, vnni_via_simde=vnni_via_simde)
    ext = builder.distutils_extension(str(tmpdir), verbose=verbose)  # writes the C wrapper there
    dist = Distribution({"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtInParallel}})
    command = dist.get_command_obj("build_ext")
    command.build_lib = command.build_temp = str(tmpdir)
    command.force = True
    dist.run_command("build_ext")
    [built] = command.get_outputs()
    return Path(built)


ffibuilder = make_builder()

if __name__ == "__main__":
    built = compile_kernel(ROOT / "build" / "cffi", verbose="-v" in sys.argv)
    # Move the module next to the package under the name `pip install -e .` gives it
    # (cffi builds for the stable ABI), so the two ways of building replace each other
    # instead of one shadowing the other.
    for old in (ROOT / "llm_smolq").glob("_kernel*.so"):
        old.unlink()
    built.replace(ROOT / "llm_smolq" / "_kernel.abi3.so")
