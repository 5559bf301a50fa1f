"""The kernel cross-compiled for macOS (arm64 and x86-64) and Windows (x86-64), with the
flags cffi_build/build_kernel.py gives those platforms and warnings as errors, so that a
change which would break `pip install` there shows here first.

Every native/**/*.c is compiled with zig's C compiler (clang, from the `ziglang` package)
for each target; the compiler must print nothing. macOS takes the builder's "darwin"
flags as they are: Apple's clang reads them as any clang does. Windows builds with
clang-cl, whose flags are translated to the clang driver's (CLANG_CL_TO_CLANG) for the
x86_64-windows-gnu target, the only Windows target zig has headers for (MinGW's): that
compiles the Win32 side of native/threads.h and every C library call against Windows'
own declarations. The one branch written for clang-cl itself (`_MSC_VER`, the CPU checks
of native/cpu_x86.c) is compiled by zig's clang in its clang-cl mode, with the builder's
Windows flags unchanged.

The objects are then linked, with no compiler runtime, against the system libraries
alone (libSystem on macOS; kernel32 and the Universal C Runtime on Windows), so that a
call into something a platform lacks, such as pthreads on Windows or the compiler
runtime's __cpu_model that __builtin_cpu_supports reads, fails here rather than at a
user's link. zig caches what it compiles (~/.cache/zig), so a second run takes seconds.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.kernel_builder import build_kernel
from helpers.run_once import once_per_run

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
INSTALL_HINT = "install the test extra: pip install -e '.[test]' (ziglang from PyPI)"

# zig's target for each platform of the builder's compile_flags().
TARGETS = {"aarch64-macos": "darwin", "x86_64-macos": "darwin", "x86_64-windows-gnu": "win32"}

# clang-cl's options in the builder's Windows flags, as the clang driver spells them.
# /clang:<option> hands <option> to clang as it is; /W4 is clang-cl's -Wall -Wextra; /O2,
# optimization for speed, is taken as -O2 (newer clang-cl make it -O3; the warnings are
# the same); /Od is -O0, /Z7 -g, /D<name> -D<name>, and /imsvc adds a system header folder.
# A flag missing here fails the test until its translation is added.
CLANG_CL_TO_CLANG = {"/O2": ["-O2"], "/Od": ["-O0"], "/W4": ["-Wall", "-Wextra"], "/Z7": ["-g"],
                     "/imsvc": ["-isystem"]}

# What the link may leave unresolved: on Windows, two functions the MinGW target's
# compiler runtime and C library supply, which a clang-cl build does not call (it probes
# the stack with __chkstk, from Visual Studio's C runtime, and calls sinf and cosf apart).
MINGW_ONLY = {"x86_64-windows-gnu": {"___chkstk_ms", "sincosf"}}


def zig() -> list[str]:
    if importlib.util.find_spec("ziglang") is None:
        pytest.fail(f"no ziglang module: {INSTALL_HINT}")
    return [sys.executable, "-m", "ziglang"]


def clang_flags(flags: list[str]) -> list[str]:
    """The builder's clang-cl flags as the clang driver's (CLANG_CL_TO_CLANG)."""
    out = []
    for flag in flags:
        if flag.startswith("/clang:"):
            out.append(flag[len("/clang:"):])
        elif flag.startswith("/D"):
            out.append("-D" + flag[2:])
        elif flag in CLANG_CL_TO_CLANG:
            out += CLANG_CL_TO_CLANG[flag]
        elif flag.startswith("/"):
            pytest.fail(f"no clang spelling of the builder's clang-cl flag {flag}: add it to CLANG_CL_TO_CLANG")
        else:
            out.append(flag)  # an argument of the flag before it
    return out


def target_flags(target: str) -> list[str]:
    flags = build_kernel.compile_flags(TARGETS[target])
    return clang_flags(flags) if TARGETS[target] == "win32" else flags


def run(cmd: list[str]) -> tuple[int, str]:
    done = subprocess.run(cmd, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def link_command(target: str, objects: list[str], out: Path) -> list[str]:
    """The objects linked as a shared library against the system's libraries and nothing
    else (no C runtime startup code, no compiler runtime: -nostdlib)."""
    if TARGETS[target] == "darwin":
        libraries = ["-lSystem"]
    else:  # kernel32 and the Universal C Runtime, as a Visual Studio build links them; no DllMain
        libraries = ["-lkernel32", "-lucrtbase", "-Wl,--no-entry"]
    return [*zig(), "cc", "-target", target, "-shared", "-nostdlib", *objects, *libraries, "-o", str(out)]


def build_for(target: str, folder: Path) -> dict:
    """Every native/**/*.c compiled for target (the compiler's output of each, by file),
    and the objects linked (the linker's status and output)."""
    sources = sorted(NATIVE.rglob("*.c"))
    flags = [*target_flags(target), "-Werror", "-I", str(NATIVE)]
    # Numbered, so that sources of one name in two folders never share an object file.
    objects = [str(folder / f"{i:02d}-{src.stem}.o") for i, src in enumerate(sources)]
    commands = [[*zig(), "cc", "-target", target, *flags, "-c", str(src), "-o", obj]
                for src, obj in zip(sources, objects)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        compiled = list(pool.map(run, commands))
    result = {"flags": flags,
              "compiled": {str(src.relative_to(ROOT)): [rc, out] for src, (rc, out) in zip(sources, compiled)}}
    if all(rc == 0 for rc, _ in compiled):
        library = "kernel.dylib" if TARGETS[target] == "darwin" else "kernel.dll"
        result["linked"] = run(link_command(target, objects, folder / library))
    return result


@pytest.fixture(scope="module", params=list(TARGETS))
def cross_build(request, tmp_path_factory):
    """The kernel compiled and linked for one target, once per run."""
    target = request.param
    return target, once_per_run(tmp_path_factory, f"cross-{target}", lambda folder: build_for(target, folder))


def test_every_file_compiles_without_a_warning(cross_build):
    target, built = cross_build
    noisy = {src: out for src, (rc, out) in built["compiled"].items() if rc != 0 or out}
    assert not noisy, (f"native/ must compile for {target} with no output (flags: {' '.join(built['flags'])}):\n"
                       + "\n".join(f"--- {src}\n{out}" for src, out in noisy.items()))


def test_links_against_the_system_libraries_alone(cross_build):
    target, built = cross_build
    if "linked" not in built:
        pytest.fail(f"not linked: the compile for {target} failed (see the test above)")
    rc, out = built["linked"]
    undefined = set(re.findall(r"undefined symbol: (\S+)", out))
    missing = undefined - MINGW_ONLY.get(target, set())
    assert not missing, (f"the kernel for {target} calls what the platform's libraries do not have: "
                         f"{sorted(missing)}\n{out}")
    assert rc == 0 or undefined, f"the link for {target} failed:\n{out}"


def test_cpu_checks_compile_under_clang_cl(tmp_path):
    """native/cpu_x86.c, whose CPUID and XGETBV come from <intrin.h> under clang-cl, compiled
    by clang in its clang-cl mode (`zig clang --driver-mode=cl`) with the builder's Windows
    flags as they are, then linked with no library at all: it must need none. It includes
    only headers a freestanding C has and clang's intrinsics, so it compiles freestanding
    with clang's own headers (zig's lib folder as the resource directory), without the
    Windows SDK's."""
    zig_command = zig()
    import ziglang

    flags = build_kernel.compile_flags("win32")
    obj = tmp_path / "cpu_x86.obj"
    # "--" before the source: clang-cl would read a path starting with "/" as an option.
    rc, out = run([*zig_command, "clang", "--driver-mode=cl", "--target=x86_64-pc-windows-msvc", "/nologo", "/c",
                   *flags, "/WX", f"/I{NATIVE}", "-resource-dir", str(Path(ziglang.__file__).parent / "lib"),
                   "/clang:-ffreestanding", f"/Fo{obj}", "--", str(NATIVE / "cpu_x86.c")])
    assert rc == 0 and not out, f"cpu_x86.c under clang-cl ({' '.join(flags)}):\n{out}"
    rc, out = run([*zig_command, "lld-link", "/dll", "/noentry", "/nodefaultlib", f"/out:{tmp_path / 'cpu.dll'}",
                   str(obj)])
    assert rc == 0, f"cpu_x86.c's clang-cl object calls outside itself:\n{out}"


# --- the Windows side of BuildExtInParallel, with a stand-in for setuptools' compiler ---------


class FakeMSVC:
    """What BuildExtInParallel uses of setuptools' Visual Studio compiler: initialize()
    finds cl.exe (here under a fake Visual Studio at vs) and sets the compile options."""

    compiler_type = "msvc"

    def __init__(self, vs: Path, fails: bool = False):
        self.vs, self.fails, self.initialized = vs, fails, False

    def initialize(self, plat_name=None):
        from setuptools.errors import PlatformError

        if self.fails:
            raise PlatformError("Unable to find a compatible Visual Studio installation.")
        self.cc = str(self.vs / "VC" / "Tools" / "MSVC" / "14.40" / "bin" / "HostX86" / "x64" / "cl.exe")
        self.compile_options = ["/nologo", "/O2", "/W3", "/GL", "/DNDEBUG", "/MD"]
        self._paths = str(self.vs / "VC" / "Tools" / "MSVC" / "14.40" / "bin" / "HostX86" / "x64")
        self.initialized = True

    def compile(self, sources, *args, **kwargs):
        return [str(source) + ".obj" for source in sources]


@pytest.fixture
def windows_build(monkeypatch, tmp_path):
    """A BuildExtInParallel as setup.py's on Windows, whose setuptools build_extension only
    records the extension and compiler it is given; no clang-cl on PATH."""
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    for name in ("VCINSTALLDIR", "ProgramFiles(x86)"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    for name in ("SMOLQ_SANITIZE", "SMOLQ_DEBUG", "SMOLQ_VNNI_VIA_SIMDE"):
        monkeypatch.delenv(name, raising=False)
    seen = {}
    monkeypatch.setattr(build_ext, "build_extension", lambda self, ext: seen.update(ext=ext, compiler=self.compiler))
    command = build_kernel.BuildExtInParallel(Distribution())
    command.plat_name = "win-amd64"
    ext = build_kernel.make_builder().distutils_extension(str(tmp_path / "wrapper"))
    return command, ext, seen, tmp_path / "VS"


def test_windows_builds_with_clang_cl_and_its_flags(windows_build):
    command, ext, seen, vs = windows_build
    clang_cl = vs / "VC" / "Tools" / "Llvm" / "x64" / "bin" / "clang-cl.exe"
    clang_cl.parent.mkdir(parents=True)
    clang_cl.touch()
    command.compiler = FakeMSVC(vs)
    command.build_extension(ext)
    compiler = seen["compiler"]
    assert compiler.cc == str(clang_cl), "Visual Studio's clang-cl in place of cl.exe"
    assert "/GL" not in compiler.compile_options and "-m64" in compiler.compile_options
    assert seen["ext"].extra_compile_args == build_kernel.compile_flags("win32")
    assert "/W4" in seen["ext"].extra_compile_args and not [f for f in seen["ext"].extra_compile_args if "pthread" in f]
    assert seen["ext"].libraries == [] and seen["ext"].extra_link_args == [], "no libm or -pthread for link.exe"


@pytest.mark.parametrize("visual_studio", ["without_clang_tools", "absent"])
def test_windows_without_clang_cl_says_what_to_install(windows_build, visual_studio):
    from setuptools.errors import PlatformError

    command, ext, seen, vs = windows_build
    command.compiler = FakeMSVC(vs, fails=visual_studio == "absent")
    with pytest.raises(PlatformError) as raised:
        command.build_extension(ext)
    message = str(raised.value)
    assert "C++ Clang tools for Windows" in message and "\n" not in message, message
    assert not seen, "nothing compiled"
