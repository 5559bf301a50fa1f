"""The native kernel cross-compiled for arm64 (AArch64) and run under emulation, so that
its NEON code paths can be tested on an x86 machine.

build_kernel() compiles native/**/*.c with zig's C cross compiler (the `ziglang` package) into
a static aarch64 executable; Aarch64Kernel loads that ELF file into a unicorn
(`unicorn` package) AArch64 CPU and calls its C functions directly, by the AAPCS64 calling
convention: integer and pointer arguments in X0..X7, then on the stack; integer results in
X0, float results in S0. No C library is linked: aarch64_runtime.c gives memcpy, memset and
getenv, and a trap for the rest of what the kernel names (the allocator, libm, pthreads), so
only functions that need no more than that can be called: no malloc, no threads, no system
calls (a trap or an SVC instruction stops the emulation with an error). The environment
getenv reads is set up here.

Test buffers live in one data region, handed out by a bump allocator (Aarch64Kernel.put
and .alloc) and reclaimed all at once with .reset().
"""

from __future__ import annotations

import importlib
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers.kernel_builder import build_kernel

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
RUNTIME = Path(__file__).with_name("aarch64_runtime.c")

INSTALL_HINT = "install the test extra: pip install -e '.[test]' (ziglang, unicorn and pyelftools from PyPI)"

# The flags of cffi_build/build_kernel.py's optimised build for Linux, with warnings as errors.
CFLAGS = [*build_kernel.compile_flags("linux"), "-Werror"]
# Target CPUs (zig's -mcpu syntax): baseline ARMv8-A, what a build with no -mcpu flag gets,
# so the NEON code may use nothing newer; and the same with the dot-product extension,
# which quants/arm/neon.c uses where the compiler targets it.
CPU_BASELINE = "generic"
CPU_DOTPROD = "generic+dotprod"

PAGE = 0x1000
DATA_BASE, DATA_SIZE = 0x4000_0000, 16 << 20
STACK_BASE, STACK_SIZE = 0x7000_0000, 1 << 20
TLS_BASE, TLS_SIZE = 0x7100_0000, 0x10000
STOP_ADDR = 0x7200_0000  # the return address of every call: reaching it ends the emulation


def require_tools() -> None:
    """Raise ImportError with INSTALL_HINT unless the cross compiler and the emulator are installed."""
    try:
        for module in ("elftools", "unicorn", "ziglang"):
            importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{e}; {INSTALL_HINT}") from e


@dataclass
class Build:
    elf: Path
    flags: list[str]  # the compiler flags of every source file
    output: str  # the compiler's stdout and stderr: empty for a warning-free build


def build_kernel(out_dir: Path, cpu: str = CPU_BASELINE) -> Build:
    """Compile native/**/*.c for aarch64 and the target CPU cpu, with aarch64_runtime.c in place
    of a C library, into the static executable out_dir/kernel.elf (CalledProcessError on
    failure). The tests call the kernel's functions, never the program."""
    require_tools()
    out_dir.mkdir(parents=True, exist_ok=True)
    zig = [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-musl"]
    compile_flags = [f"-mcpu={cpu}", *CFLAGS, "-I", str(NATIVE)]
    sources = [(src, compile_flags) for src in sorted(NATIVE.rglob("*.c"))]
    sources.append((RUNTIME, [*compile_flags, "-ffreestanding"]))
    # Numbered, so that sources of one name in two folders never share an object file.
    objects = [out_dir / f"{i:02d}-{src.stem}.o" for i, (src, _) in enumerate(sources)]
    # --no-gc-sections keeps every function of the kernel, though nothing calls it.
    elf = out_dir / "kernel.elf"
    commands = [[*zig, *flags, "-c", str(src), "-o", str(obj)] for (src, flags), obj in zip(sources, objects)]
    commands.append([*zig, f"-mcpu={CPU_BASELINE}", "-nostdlib", "-static", *map(str, objects),
                     "-Wl,--no-gc-sections", "-o", str(elf)])
    output = ""
    for cmd in commands:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
        output += done.stdout + done.stderr
    return Build(elf, compile_flags, output)


def _page_down(a: int) -> int:
    return a & ~(PAGE - 1)


def _page_up(a: int) -> int:
    return (a + PAGE - 1) & ~(PAGE - 1)


class Aarch64Kernel:
    """One emulated CPU with the kernel's ELF file loaded. env: the process environment its
    getenv sees (empty by default)."""

    def __init__(self, elf: Path, env: dict[str, str] | None = None):
        require_tools()
        from elftools.elf.elffile import ELFFile
        from unicorn import UC_ARCH_ARM64, UC_MODE_ARM, UC_PROT_ALL, Uc
        from unicorn import arm64_const as A

        self._A = A
        uc = self.uc = Uc(UC_ARCH_ARM64, UC_MODE_ARM)
        uc.ctl_set_cpu_model(A.UC_CPU_ARM64_MAX)
        with open(elf, "rb") as f:
            ef = ELFFile(f)
            assert ef["e_machine"] == "EM_AARCH64" and ef["e_type"] == "ET_EXEC", "a static aarch64 executable"
            # Segments may share a page: map the union of their page ranges, then copy each in.
            loads = [s for s in ef.iter_segments() if s["p_type"] == "PT_LOAD"]
            spans: list[list[int]] = []
            for s in sorted(loads, key=lambda s: s["p_vaddr"]):
                lo, hi = _page_down(s["p_vaddr"]), _page_up(s["p_vaddr"] + s["p_memsz"])
                if spans and lo <= spans[-1][1]:
                    spans[-1][1] = max(spans[-1][1], hi)
                else:
                    spans.append([lo, hi])
            for lo, hi in spans:
                uc.mem_map(lo, hi - lo, UC_PROT_ALL)
            for s in loads:
                uc.mem_write(s["p_vaddr"], s.data())  # p_filesz bytes; the rest (.bss) stays zero
            symtab = ef.get_section_by_name(".symtab")
            self.symbols = {sym.name: sym["st_value"] for sym in symtab.iter_symbols()
                            if sym.name and sym["st_info"]["type"] in ("STT_FUNC", "STT_OBJECT")}
        uc.mem_map(DATA_BASE, DATA_SIZE, UC_PROT_ALL)
        uc.mem_map(STACK_BASE, STACK_SIZE, UC_PROT_ALL)
        uc.mem_map(TLS_BASE, TLS_SIZE, UC_PROT_ALL)
        uc.mem_map(STOP_ADDR, PAGE, UC_PROT_ALL)
        # FP/SIMD instructions trap unless CPACR_EL1.FPEN (bits 20-21) allows them.
        uc.reg_write(A.UC_ARM64_REG_CPACR_EL1, uc.reg_read(A.UC_ARM64_REG_CPACR_EL1) | (3 << 20))
        # A thread pointer into zeroed memory, for anything that reads thread-local state.
        uc.reg_write(A.UC_ARM64_REG_TPIDR_EL0, TLS_BASE + TLS_SIZE // 2)
        self._env = dict(env or {})
        self.reset()

    # --- memory -------------------------------------------------------------------------

    def reset(self) -> None:
        """Free every buffer, and lay out the environment (aarch64_runtime.c's environ) again."""
        self._next = DATA_BASE
        strings = [self.put(f"{k}={v}".encode() + b"\0") for k, v in self._env.items()]
        environ = self.put(struct.pack(f"<{len(strings) + 1}Q", *strings, 0))
        self.uc.mem_write(self.symbols["environ"], struct.pack("<Q", environ))

    def alloc(self, nbytes: int, align: int = 16) -> int:
        """nbytes of zeroed memory (unless reused since the last reset: contents undefined)."""
        addr = (self._next + align - 1) & ~(align - 1)
        if addr + nbytes > DATA_BASE + DATA_SIZE:
            raise MemoryError("emulated data region full: call reset()")
        self._next = addr + max(nbytes, 1)
        return addr

    def put(self, data: bytes | bytearray | memoryview, align: int = 16) -> int:
        """Copy data (anything with the buffer protocol, e.g. a numpy array) in; returns its address."""
        data = memoryview(data).cast("B")
        addr = self.alloc(len(data), align)
        self.uc.mem_write(addr, bytes(data))
        return addr

    def read(self, addr: int, nbytes: int) -> bytes:
        return bytes(self.uc.mem_read(addr, nbytes))

    def cstring(self, addr: int, limit: int = 256) -> str:
        raw = self.read(addr, limit)
        return raw[:raw.index(b"\0")].decode()

    # --- calls --------------------------------------------------------------------------

    def _run(self, name: str, args: tuple[int, ...]) -> None:
        A, uc = self._A, self.uc
        regs = [getattr(A, f"UC_ARM64_REG_X{i}") for i in range(8)]
        words = [int(a) & (2**64 - 1) for a in args]
        sp = STACK_BASE + STACK_SIZE - 0x100
        stacked = words[8:]
        if stacked:  # the ninth argument on, one 8-byte slot each from SP up (AAPCS64, Linux)
            sp -= (8 * len(stacked) + 15) & ~15
            uc.mem_write(sp, struct.pack(f"<{len(stacked)}Q", *stacked))
        for reg, w in zip(regs, words[:8]):
            uc.reg_write(reg, w)
        uc.reg_write(A.UC_ARM64_REG_SP, sp)
        uc.reg_write(A.UC_ARM64_REG_LR, STOP_ADDR)
        uc.emu_start(self.symbols[name], STOP_ADDR)

    def call(self, name: str, *args: int) -> int:
        """Call a C function returning an int (or nothing): its 32-bit result, sign-extended."""
        self._run(name, args)
        x0 = self.uc.reg_read(self._A.UC_ARM64_REG_X0) & 0xFFFF_FFFF
        return x0 - (1 << 32) if x0 & 0x8000_0000 else x0

    def call_ptr(self, name: str, *args: int) -> int:
        """Call a C function returning a pointer."""
        self._run(name, args)
        return self.uc.reg_read(self._A.UC_ARM64_REG_X0)

    def call_float_bits(self, name: str, *args: int) -> int:
        """Call a C function returning a float: the result's 32 bits (S0), for bitwise comparison."""
        self._run(name, args)
        return self.uc.reg_read(self._A.UC_ARM64_REG_Q0) & 0xFFFF_FFFF

