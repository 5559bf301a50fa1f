"""cffi builder for the native kernel (out-of-line API mode).

`pip install -e .` runs this through setup.py's cffi_modules; running it directly
(`python cffi_build/build_kernel.py`) rebuilds the extension in place.
With SMOLQ_SANITIZE=1 in the environment either way builds the kernel with AddressSanitizer
and UndefinedBehaviorSanitizer (see the README for how to load it).
With SMOLQ_VNNI_VIA_SIMDE=<SIMDe's include directory> (simde_py.get_include() of the
simde-py package) it builds a test kernel whose AVX-512 VNNI vec_dots take the VNNI
instructions from SIMDe and are chosen on any AVX2 CPU (tests/test_avx512vnni.py).

The compiler is the one setuptools picks: gcc or clang (Apple's on macOS) with GCC-style
flags, and on Windows clang-cl in place of Visual Studio's cl.exe, which lacks what the
kernel is written with (target attributes, GCC builtins, <stdatomic.h>); Visual Studio's
linker links it. compile_flags() gives the flags of each platform.
"""

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cffi import FFI
from setuptools import Distribution
from setuptools.command.build_ext import build_ext
from setuptools.errors import PlatformError

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
PLATFORMS = ("linux", "darwin", "win32")


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


@dataclass(frozen=True)
class KernelOptions:
    """The build's variant: sanitized (SMOLQ_SANITIZE), for a debugger (SMOLQ_DEBUG), or
    with SIMDe's VNNI stand-ins from this include directory (SMOLQ_VNNI_VIA_SIMDE)."""

    sanitize: bool = False
    debug: bool = False
    vnni_via_simde: str | None = None

    @classmethod
    def resolve(cls, sanitize: bool | None = None, vnni_via_simde: str | None = None) -> "KernelOptions":
        """The options given, and the environment's for those given as None."""
        if sanitize is None:
            sanitize = sanitize_requested()
        if vnni_via_simde is None:
            vnni_via_simde = os.environ.get("SMOLQ_VNNI_VIA_SIMDE") or None
        if vnni_via_simde and not (Path(vnni_via_simde) / "simde" / "x86" / "avx512" / "dpbusd.h").is_file():
            raise FileNotFoundError(f"no SIMDe headers (simde/x86/avx512/dpbusd.h) under {vnni_via_simde}")
        return cls(sanitize, bool(os.environ.get("SMOLQ_DEBUG")), vnni_via_simde)


def _gcc_style_args(platform: str, options: KernelOptions) -> list[str]:
    # -fno-wrapv: Python's own CFLAGS carry -fwrapv, which stops gcc vectorizing int-counted
    # loops (and would hide signed overflow from the sanitizer). -ffp-contract=off: what gcc
    # does anyway in ISO C mode (-std=c11); clang would otherwise fuse a * b + c into one
    # fma where the target has it, and change the bits (native/quants/types.h). -g0: Python's
    # flags ask for debug information, which doubles the time the SIMD files take to build
    # (their inlined kernels) and changes no instruction; the sanitized and debug builds
    # ask for it again. -pthread: not on macOS, whose C library holds the threads.
    args = ["-std=c11", "-O3", "-g0", "-fno-wrapv", "-ffp-contract=off", "-Wall", "-Wextra", "-fno-math-errno"]
    if platform == "linux":
        args.insert(args.index("-Wextra") + 1, "-pthread")
    if options.sanitize:
        # -g1: the line tables a report's stack needs, at three quarters of -g's build time.
        args = [a if a != "-O3" else "-O1" for a in args] + ["-g1", "-fno-omit-frame-pointer", *SANITIZE]
    elif options.debug:
        args = [a if a != "-O3" else "-O0" for a in args] + ["-g"]
    if options.vnni_via_simde:
        # -isystem: SIMDe's headers are not held to the kernel's -Wall -Wextra. -O2 (after
        # the -O3, so it wins): the same bits, and the VNNI file builds in 5 s instead of 11.
        args += ["-DSQ_VNNI_VIA_SIMDE", "-isystem", options.vnni_via_simde, "-O2"]
    return args


def _clang_cl_args(options: KernelOptions) -> list[str]:
    # /W4: clang-cl's -Wall -Wextra (its -Wall is -Weverything). /clang:...: the clang
    # options clang-cl has no spelling of, with the meaning they have above. No -fno-wrapv:
    # Python's flags for Visual Studio do not turn wrapping on. _CRT_SECURE_NO_WARNINGS:
    # the Windows SDK's headers would warn that getenv is unsafe.
    args = ["/clang:-std=c11", "/O2", "/W4", "/clang:-ffp-contract=off", "/clang:-fno-math-errno",
            "/D_CRT_SECURE_NO_WARNINGS"]
    if options.sanitize:
        raise PlatformError("SMOLQ_SANITIZE builds are made with gcc or clang on Linux (see docs/development.md)")
    if options.debug:
        args = [a if a != "/O2" else "/Od" for a in args] + ["/Z7"]
    if options.vnni_via_simde:
        args += ["/DSQ_VNNI_VIA_SIMDE", "/imsvc", options.vnni_via_simde]
    return args


def compile_flags(platform: str, options: KernelOptions = KernelOptions()) -> list[str]:
    """The kernel's compile flags on platform ("linux", "darwin" or "win32", as
    sys.platform names them): gcc's or clang's on the first two, clang-cl's on Windows."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, not {platform!r}")
    return _clang_cl_args(options) if platform == "win32" else _gcc_style_args(platform, options)


def _link(platform: str, options: KernelOptions) -> tuple[list[str], list[str]]:
    """The extra link flags and the libraries of a build for platform."""
    if platform == "win32":
        return [], []  # the C runtime and kernel32 hold everything, and link.exe takes them by default
    flags = (["-pthread"] if platform == "linux" else []) + (SANITIZE if options.sanitize else [])
    return flags, ["m"]


def _host_platform() -> str:
    return "darwin" if sys.platform == "darwin" else "linux"


def make_builder(absolute_sources: bool = False) -> FFI:
    """The kernel's cffi builder. Its compile and link flags are chosen when it is built
    (BuildExtInParallel), once the compiler is known."""
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
    )
    return builder


# Where clang-cl is when it comes with Visual Studio ("C++ Clang tools for Windows"),
# under the VC folder: the 64-bit build first, then the 32-bit one.
VS_CLANG_CL = ("Tools/Llvm/x64/bin/clang-cl.exe", "Tools/Llvm/bin/clang-cl.exe")
# The target of a 32-bit clang-cl is 32-bit x86 unless told otherwise.
CLANG_CL_TARGET = {"win-amd64": ["-m64"], "win32": ["-m32"]}
CLANG_CL_MISSING = ("llm-smolq builds its kernel with clang-cl on Windows and found none: install "
                    "\"C++ Clang tools for Windows\" in the Visual Studio Installer (with \"Desktop development "
                    "with C++\"), or LLVM's clang-cl on PATH, then install llm-smolq again")


def _visual_studio_vc_dirs(cl_exe: str) -> list[Path]:
    """Visual Studio's VC folders: the developer prompt's, the one cl.exe is under, and
    those vswhere lists with the Clang tools installed."""
    dirs = [Path(os.environ["VCINSTALLDIR"])] if os.environ.get("VCINSTALLDIR") else []
    dirs += [p for p in Path(cl_exe).parents if p.name.lower() == "vc"][:1]
    vswhere = Path(os.environ.get("ProgramFiles(x86)", r"C:\Program Files (x86)"),
                   "Microsoft Visual Studio", "Installer", "vswhere.exe")
    if vswhere.is_file():
        found = subprocess.run([str(vswhere), "-products", "*", "-property", "installationPath",
                                "-requires", "Microsoft.VisualStudio.Component.VC.Llvm.Clang"],
                               capture_output=True, text=True).stdout
        dirs += [Path(line.strip(), "VC") for line in found.splitlines() if line.strip()]
    return dirs


def find_clang_cl(compiler) -> str | None:
    """clang-cl's path: on PATH, on the Visual Studio environment's PATH, or in a Visual
    Studio installation; None if there is none."""
    for path in (None, getattr(compiler, "_paths", None)):
        found = shutil.which("clang-cl", path=path)
        if found:
            return found
    for vc in _visual_studio_vc_dirs(getattr(compiler, "cc", "")):
        for relative in VS_CLANG_CL:
            if (vc / relative).is_file():
                return str(vc / relative)
    return None


def use_clang_cl(compiler, plat_name: str) -> None:
    """Makes setuptools' Visual Studio compiler compile with clang-cl (its linker stays),
    or stops the build with what to install."""
    if not compiler.initialized:
        try:
            compiler.initialize(plat_name)  # finds Visual Studio: its cl.exe, link.exe, headers and libraries
        except PlatformError as e:
            raise PlatformError(f"{CLANG_CL_MISSING} ({e})") from None
    if Path(compiler.cc).stem.lower() == "clang-cl":
        return  # swapped in already
    clang_cl = find_clang_cl(compiler)
    if clang_cl is None:
        raise PlatformError(CLANG_CL_MISSING)
    compiler.cc = clang_cl
    # /GL asks cl.exe for whole-program optimization, which clang-cl ignores with a warning.
    compiler.compile_options = [o for o in compiler.compile_options if o != "/GL"]
    compiler.compile_options += CLANG_CL_TARGET.get(plat_name, [])


class BuildExtInParallel(build_ext):
    """Builds the kernel with the flags of the compiler setuptools picked (clang-cl in place
    of cl.exe on Windows, see compile_flags) and the options of the extension (compile_kernel)
    or of the environment (setup.py). setuptools compiles an extension's C files one after
    another; this compiles them a CPU each (the kernel's take a minute on one slow core).
    setup.py and compile_kernel() both build with it."""

    def build_extension(self, ext):
        options = getattr(ext, "smolq_options", None) or KernelOptions.resolve()
        kind = self.compiler.compiler_type
        if kind == "msvc":
            use_clang_cl(self.compiler, self.plat_name)
        platform = "win32" if kind in ("msvc", "clangcl") else _host_platform()
        ext.extra_compile_args = compile_flags(platform, options)
        ext.extra_link_args, ext.libraries = _link(platform, options)
        if kind not in ("unix", "msvc") or len(ext.sources) < 2:
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
    """Build the extension under tmpdir and return the path of the module file. sanitize:
    None follows SMOLQ_SANITIZE. vnni_via_simde: SIMDe's include directory for a test build
    of the VNNI kernels on any AVX2 CPU; None follows SMOLQ_VNNI_VIA_SIMDE."""
    options = KernelOptions.resolve(sanitize, vnni_via_simde)
    builder = make_builder(absolute_sources=True)
    ext = builder.distutils_extension(str(tmpdir), verbose=verbose)  # writes the C wrapper there
    ext.smolq_options = options
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
