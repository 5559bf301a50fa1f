"""macOS and Windows, pretended on Linux: the package is imported, and every path that branches
on the platform is run, with the platform made to look like each of them - sys.platform,
no sched_getaffinity, no /proc (opening it fails the test), 16 KiB pages and no huge pages
on macOS; on Windows no SIGPIPE, no sysconf, no madvise, GlobalMemoryStatusEx, and files
that cannot be replaced or deleted while a process holds them open. What cannot be
pretended here (the real system calls, the real file-sharing rules) is left to the
machines themselves."""

from __future__ import annotations

import builtins
import ctypes
import errno
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import platformdirs
import platformdirs.macos
import platformdirs.unix
import platformdirs.windows
import pytest

import llm_smolq
from llm_smolq import paths
from llm_smolq.cache import atomic_file, header_cache, in_use, kernel_identity, packed_cache
from llm_smolq.dev import bench, bench_markdown, fuzz_gguf
from llm_smolq.engine import engine as engine_module
from llm_smolq.engine import memory, packing
from llm_smolq.plugin import command
from llm_smolq.store import download
from llm_smolq.store.kv_blocks import KVLayout, block_bytes
from llm_smolq.store.prompt_cache import PromptCache

TINY = "tiny-smollm3-chat-Q8_0.gguf"
GIB = 1 << 30
WINDOWS_FREE = 6 * GIB  # what the pretended GlobalMemoryStatusEx says is available
IN_USE = "The process cannot access the file because it is being used by another process"


# -- the pretended systems ------------------------------------------------------------------
def no_linux_files(monkeypatch) -> None:
    """Opening anything under /proc or /sys fails the test: no such thing off Linux."""
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.fspath(file).startswith(("/proc/", "/sys/")):
            raise AssertionError(f"{os.fspath(file)} opened on {sys.platform}: a Linux-only path without a guard")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)


class Kernel32:
    """GlobalMemoryStatusEx as Windows answers it: it fails unless the struct's dwLength says
    its size, and fills the struct in."""

    def __init__(self, available: int | None):
        self.available = available

    def GlobalMemoryStatusEx(self, ref) -> int:
        status = ref._obj
        if self.available is None or status.dwLength != ctypes.sizeof(status) or ctypes.sizeof(status) != 64:
            return 0
        status.ullTotalPhys, status.ullAvailPhys = 16 * GIB, self.available
        return 1


@pytest.fixture
def macos(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.delattr(os, "posix_fallocate", raising=False)
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)  # macOS has MADV_DONTNEED, not this
    monkeypatch.setattr(mmap, "PAGESIZE", 16384)  # Apple silicon
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.macos.MacOS)  # what it picks there
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    no_linux_files(monkeypatch)
    return "darwin"


@pytest.fixture
def windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    for name in ("sched_getaffinity", "posix_fallocate", "sysconf", "sysconf_names"):
        monkeypatch.delattr(os, name, raising=False)
    monkeypatch.delattr(signal, "SIGPIPE", raising=False)
    for name in [n for n in dir(mmap) if n.startswith(("MADV_", "MAP_"))]:  # no madvise, no mmap flags
        monkeypatch.delattr(mmap, name)
    monkeypatch.setattr(mmap, "ALLOCATIONGRANULARITY", 65536)
    kernel32 = Kernel32(WINDOWS_FREE)
    monkeypatch.setattr(ctypes, "windll", SimpleNamespace(kernel32=kernel32), raising=False)
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.windows.Windows)
    monkeypatch.setenv("WIN_PD_OVERRIDE_LOCAL_APPDATA", r"C:\Users\ada\AppData\Local")
    no_linux_files(monkeypatch)
    return kernel32


@pytest.fixture
def held_open(monkeypatch) -> set[str]:
    """Files some process holds open or mapped, as Windows treats them: os.replace onto or
    from one, and os.unlink of one, raise PermissionError. (Elsewhere nothing refuses;
    here the same refusal shows what the Linux code does with the error.)"""
    held: set[str] = set()
    real_replace, real_unlink = os.replace, os.unlink

    def refuse(path) -> None:
        if os.path.abspath(path) in held:
            raise PermissionError(errno.EACCES, IN_USE, os.fspath(path))

    def replace(src, dst, **kwargs):
        refuse(src)
        refuse(dst)
        return real_replace(src, dst, **kwargs)

    def unlink(path, **kwargs):
        refuse(path)
        return real_unlink(path, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "unlink", unlink)
    return held


def hold(held: set[str], path) -> None:
    held.add(os.path.abspath(path))


def let_go_later(held: set[str], path, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, held.discard, [os.path.abspath(path)])
    timer.start()
    return timer


# -- the package imports on each system --------------------------------------------------------
IMPORT_ON = r"""
import builtins, ctypes, importlib, json, mmap, os, pkgutil, signal, sys

import llm_smolq

names = sorted(m.name for m in pkgutil.walk_packages(llm_smolq.__path__, "llm_smolq."))
for name in names:  # on the real system first: every dependency is loaded as it would be there
    importlib.import_module(name)
for name in [n for n in sys.modules if n.startswith("llm_smolq") and n != "llm_smolq._kernel"]:
    del sys.modules[name]

system = sys.argv[1]
sys.platform = system
del os.sched_getaffinity, os.posix_fallocate
for name in [n for n in dir(mmap) if n.startswith(("MADV_", "MAP_"))]:
    if system == "win32" or name == "MADV_HUGEPAGE":
        delattr(mmap, name)
if system == "darwin":
    mmap.PAGESIZE = 16384
else:
    del os.sysconf, os.sysconf_names, signal.SIGPIPE
    mmap.ALLOCATIONGRANULARITY = 65536

    class Kernel32:
        def GlobalMemoryStatusEx(self, ref):
            ref._obj.ullAvailPhys = 5 << 30
            return 1

    ctypes.windll = type("WinDLL", (), {"kernel32": Kernel32()})()
real_open = builtins.open


def guarded(file, *args, **kwargs):
    if isinstance(file, str) and file.startswith(("/proc/", "/sys/")):
        raise AssertionError(f"{file} opened on {system}")
    return real_open(file, *args, **kwargs)


builtins.open = guarded
for name in names:
    importlib.import_module(name)
from llm_smolq.engine import engine, memory
from llm_smolq.plugin import command

print(json.dumps({"modules": len(names), "exit_stdout_closed": command.EXIT_STDOUT_CLOSED,
                  "threads": engine.default_threads(), "memory": memory.available_memory()}))
"""


def test_every_module_imports_on_macos_and_windows():
    """Each module imported anew with the platform patched (after its dependencies were
    loaded for real): an import-time call to something the system lacks (signal.SIGPIPE,
    sched_getaffinity, a /proc file) fails here."""
    env = {k: v for k, v in os.environ.items() if k != "SMOLQ_THREADS"}
    runs = {system: subprocess.Popen([sys.executable, "-c", IMPORT_ON, system], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
            for system in ("darwin", "win32")}
    seen = {}
    for system, proc in runs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{system}:\n{err}"
        seen[system] = json.loads(out.strip().splitlines()[-1])
    for system, got in seen.items():
        assert got["modules"] > 50, system
        assert got["exit_stdout_closed"] == 141, system  # 128 + SIGPIPE's 13, with or without a SIGPIPE
        assert got["threads"] == os.cpu_count(), system  # no affinity call to ask: every CPU
    assert seen["win32"]["memory"] == [5 << 30, "available physical memory (GlobalMemoryStatusEx)"]
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert seen["darwin"]["memory"] == [physical, "physical memory"]


# -- thread counts --------------------------------------------------------------------------
@pytest.mark.parametrize("system", ["macos", "windows"])
def test_the_thread_count_is_every_cpu_without_an_affinity_call(system, request, monkeypatch):
    request.getfixturevalue(system)
    assert not hasattr(os, "sched_getaffinity")
    monkeypatch.delenv("SMOLQ_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert engine_module.default_threads() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "cannot tell"
    assert engine_module.default_threads() == 1
    monkeypatch.setenv("SMOLQ_THREADS", "3")
    assert engine_module.default_threads() == 3


# -- available memory -------------------------------------------------------------------------
def test_macos_memory_is_the_physical_memory_sysconf_gives(macos, monkeypatch):
    values = {"SC_PHYS_PAGES": 1 << 20, "SC_PAGE_SIZE": 16384}  # 16 GiB in 16 KiB pages
    monkeypatch.setattr(os, "sysconf", values.__getitem__)
    assert memory.available_memory() == (16 * GIB, "physical memory")  # and /proc was never opened
    monkeypatch.delattr(os, "sysconf_names")  # a system that names nothing: no figure, no check
    assert memory.available_memory() is None


def test_windows_memory_is_global_memory_status_ex(windows):
    assert memory.available_memory() == (WINDOWS_FREE, "available physical memory (GlobalMemoryStatusEx)")
    windows.available = None  # the call fails
    assert memory.available_memory() is None


def test_windows_refuses_a_context_larger_than_what_global_memory_status_ex_says(windows, reference_dir):
    windows.available = 1 << 20
    with pytest.raises((llm_smolq.GGUFError, llm_smolq.ResourceError), match="GlobalMemoryStatusEx"):
        llm_smolq.load(reference_dir / TINY, n_ctx=4096, threads=1)


# -- cache locations --------------------------------------------------------------------------
def test_the_cache_directory_is_the_platforms(monkeypatch, tmp_path):
    monkeypatch.delenv("SMOLQ_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.unix.Unix)
    assert paths.header_cache_dir() == tmp_path / ".cache" / "llm-smolq"  # Linux, as before
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.header_cache_dir() == tmp_path / "xdg" / "llm-smolq"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.macos.MacOS)
    assert paths.header_cache_dir() == tmp_path / "Library" / "Caches" / "llm-smolq"
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.windows.Windows)
    monkeypatch.setenv("WIN_PD_OVERRIDE_LOCAL_APPDATA", r"C:\Users\ada\AppData\Local")
    assert paths.header_cache_dir() == Path(r"C:\Users\ada\AppData\Local") / "llm-smolq" / "Cache"
    assert packed_cache.folder() == paths.header_cache_dir() / "packed"
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path / "chosen"))  # chosen, or off, on every system
    assert paths.header_cache_dir() == tmp_path / "chosen"
    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    assert paths.header_cache_dir() is None


# -- pages: their size, and madvise where there is one ---------------------------------------
class Advice:
    """A mapping that records what it is advised."""

    def __init__(self):
        self.calls: list[tuple] = []

    def madvise(self, *args) -> None:
        self.calls.append(args)


class Mapped(np.ndarray):
    """A model file's bytes, with the mapping a numpy memmap keeps as _mmap."""


def mapped_model(n_bytes: int, first_tensor: int) -> SimpleNamespace:
    data = np.frombuffer(np.random.default_rng(0).bytes(n_bytes), np.uint8).view(Mapped)
    data._mmap = Advice()
    return SimpleNamespace(data=data, tensors={"w": SimpleNamespace(offset=first_tensor)})


def test_pages_let_go_of_are_whole_16_kib_pages_on_apple_silicon(macos):
    model = mapped_model(200_000, first_tensor=5000)
    packing._let_go(model, SimpleNamespace(offset=5000, n_bytes=70_000))  # bytes 5000-75000
    packing._let_go(model, SimpleNamespace(offset=20_000, n_bytes=10_000))  # inside one page: nothing
    assert model.data._mmap.calls == [(mmap.MADV_DONTNEED, 16384, 65536 - 16384)]
    model.data._mmap.calls.clear()
    kernel_identity.weights_digest(model)  # lets go of the weights as it hashes them
    assert model.data._mmap.calls == [(mmap.MADV_DONTNEED, 16384, 12 * 16384 - 16384)]


def test_without_madvise_pages_are_left_to_the_system(windows):
    model = mapped_model(200_000, first_tensor=5000)
    packing._let_go(model, SimpleNamespace(offset=0, n_bytes=200_000))
    digest = kernel_identity.weights_digest(model)
    assert model.data._mmap.calls == []  # never asked: there is no madvise
    buf = packing._anonymous(100_000)  # no MADV_HUGEPAGE to ask for: plain pages
    assert len(buf) == 100_000 and not buf.any()
    buf[:] = 7
    assert digest == kernel_identity.weights_digest(mapped_model(200_000, first_tensor=5000))


# -- an engine on each system --------------------------------------------------------------------
def logits(eng) -> list[bytes]:
    return [eng.eval([1, 5, 9, 200, 17]).tobytes(), eng.eval([21]).tobytes()]


@pytest.mark.parametrize("system", ["macos", "windows"])
def test_an_engine_packs_in_memory_where_no_disk_space_can_be_reserved(system, request, reference_dir, tmp_path,
                                                                        monkeypatch):
    """Without posix_fallocate a packed entry's space cannot be reserved: the weights are
    packed in memory, nothing is left in packed/ (not even a temporary file), and they are
    not hashed for an entry that will never be made. The answers are the same bits."""
    path = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    monkeypatch.setenv("SMOLQ_PACK", "1")
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(packed_cache, "SETTLED_SECONDS", 0.0)
    on_linux = llm_smolq.load(path, n_ctx=32, threads=1)
    assert on_linux.model.packed_kept is not None  # the control: here an entry is kept
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path / "elsewhere"))
    request.getfixturevalue(system)
    hashed = []
    monkeypatch.setattr(packed_cache, "weights_digest", lambda *args: hashed.append(args) or "0" * 64)
    eng = llm_smolq.load(path, n_ctx=32, threads=1)
    assert eng._packed == on_linux._packed and eng._packed
    assert eng.model.packed_kept is None and hashed == []
    assert not (tmp_path / "elsewhere" / "packed").exists() or not list((tmp_path / "elsewhere" / "packed").iterdir())
    assert logits(eng) == logits(on_linux)


def test_llm_smolq_cache_says_why_no_packed_weights_are_kept(windows, monkeypatch, tmp_path):
    from helpers.llm_cli import run

    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm"))
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path / "cache"))
    out = run("smolq", "cache", "info").output
    assert "none kept on this system" in out and "packed in memory on each load" in out


# -- broken pipes ------------------------------------------------------------------------------
def answer_ends_with(error: BaseException, monkeypatch, tmp_path) -> int | str:
    """The exit status of `llm prompt` whose answer ended in `error` (its message when it
    ends in an error instead), stdout a pipe."""
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    reader, writer = os.pipe()
    try:
        with os.fdopen(writer, "w") as out:
            monkeypatch.setattr(sys, "stdout", out)

            def answer(**kwargs):
                raise error

            callback = command._prompt_callback(answer)
            with click.Context(click.Command("prompt")):
                try:
                    callback(database=str(tmp_path / "logs.db"))
                except click.exceptions.Exit as ended:
                    return ended.exit_code
                except click.ClickException as failed:
                    return failed.message
    finally:
        os.close(reader)
    raise AssertionError("the callback neither ended nor failed")


def closed_pipe_on_windows() -> click.ClickException:
    """What llm raises when printing to a pipe whose reader has gone, on Windows: the C
    runtime's EINVAL, wrapped in llm's ClickException."""
    try:
        raise OSError(errno.EINVAL, "Invalid argument")
    except OSError as exc:
        try:
            raise click.ClickException(str(exc)) from exc
        except click.ClickException as wrapped:
            return wrapped


def test_a_closed_pipe_ends_with_status_141_on_windows_too(windows, monkeypatch, tmp_path):
    assert answer_ends_with(BrokenPipeError(errno.EPIPE, "Broken pipe"), monkeypatch, tmp_path) == 141
    assert answer_ends_with(closed_pipe_on_windows(), monkeypatch, tmp_path) == 141


def test_elsewhere_invalid_argument_is_an_error_not_a_closed_pipe(monkeypatch, tmp_path):
    assert answer_ends_with(BrokenPipeError(errno.EPIPE, "Broken pipe"), monkeypatch, tmp_path) == 141
    assert answer_ends_with(closed_pipe_on_windows(), monkeypatch, tmp_path) == "[Errno 22] Invalid argument"


def test_on_windows_invalid_argument_is_a_closed_pipe_only_when_stdout_is_a_pipe(windows, monkeypatch, tmp_path):
    with open(tmp_path / "answer.txt", "w") as out:  # stdout redirected to a file
        monkeypatch.setattr(sys, "stdout", out)
        assert not command._stdout_closed(closed_pipe_on_windows())


# -- files held open: replaced and deleted as Windows allows --------------------------------------
def test_on_windows_a_replace_waits_for_the_reader_to_close_the_file(windows, held_open, tmp_path):
    entry = tmp_path / "cache" / "x.header"
    header_cache.store(entry, {"v": 1})
    hold(held_open, entry)  # a reader has it open for a moment
    timer = let_go_later(held_open, entry, 0.05)
    header_cache.store(entry, {"v": 2})
    timer.join()
    assert header_cache.load(entry) == {"v": 2}


def test_elsewhere_a_refused_replace_is_not_tried_again(held_open, tmp_path):
    entry = tmp_path / "cache" / "x.header"
    header_cache.store(entry, {"v": 1})
    hold(held_open, entry)
    timer = let_go_later(held_open, entry, 0.05)
    header_cache.store(entry, {"v": 2})  # not an error: a cache that cannot be written is no cache
    timer.join()
    assert header_cache.load(entry) == {"v": 1}


def test_on_windows_a_file_held_open_for_good_is_not_replaced_and_leaves_no_temporary(windows, held_open, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setattr(in_use, "REPLACE_PATIENCE", 0.05)
    target = tmp_path / "models.json"
    target.write_bytes(b"old")
    hold(held_open, target)
    with pytest.raises(PermissionError, match="being used by another process"):
        with atomic_file.replaced_atomically(target) as f:
            f.write(b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["models.json"]


def test_header_cache_eviction_skips_an_entry_in_use_and_deletes_it_later(windows, held_open, tmp_path,
                                                                         monkeypatch):
    root = tmp_path / "cache"
    for i in range(3):
        header_cache.store(root / f"{i}.header", i)
        os.utime(root / f"{i}.header", ns=(i * 10**9, i * 10**9))  # 0 the least recently used
    monkeypatch.setattr(header_cache, "MAX_ENTRIES", 2)
    hold(held_open, root / "0.header")
    header_cache.store(root / "3.header", 3)  # 0 and 1 go; 0 is in use
    assert sorted(p.name for p in root.iterdir()) == ["0.header", "2.header", "3.header"]
    held_open.clear()
    header_cache.store(root / "4.header", 4)
    assert sorted(p.name for p in root.iterdir()) == ["3.header", "4.header"]


@pytest.fixture
def tiny_cache(reference_dir, tmp_path):
    """A prompt cache of blocks of 16 positions with room for 2.5 blocks, and a function that
    saves a one-block state of the tiny model (its block's path)."""
    path = reference_dir / TINY
    first = llm_smolq.load(path, n_ctx=16, threads=1)
    one_block = block_bytes(450, 16, KVLayout.of(first))
    cache = PromptCache(tmp_path / "prompts", max_bytes=int(2.5 * one_block), block_tokens=16)

    def save(seed: int):
        eng = llm_smolq.load(path, n_ctx=32, threads=1)
        eng.eval(np.random.default_rng(seed).integers(0, eng.config.vocab_size, 16).tolist())
        before = set(cache.directory.glob("*.kv"))
        activity = cache.save(eng)
        (new,) = set(cache.directory.glob("*.kv")) - before
        return activity, new

    return cache, save


def test_on_windows_prompt_cache_eviction_skips_a_block_being_read(windows, held_open, tiny_cache):
    cache, save = tiny_cache
    (_, a), (_, b) = save(1), save(2)
    hold(held_open, a)  # another process is reading the least recently used block
    activity, c = save(3)  # over budget: a should go, but cannot yet
    assert activity.problems == [] and {a, b, c} == set(cache.directory.glob("*.kv"))
    held_open.clear()
    activity, d = save(4)  # the next eviction deletes it, and then b
    assert activity.problems == [] and {c, d} == set(cache.directory.glob("*.kv"))


def test_elsewhere_a_block_that_cannot_be_deleted_is_a_problem_reported(held_open, tiny_cache):
    cache, save = tiny_cache
    (_, a), _ = save(1), save(2)
    hold(held_open, a)  # on Linux only an unwritable directory refuses: said, as before
    activity, _ = save(3)
    assert activity.problems and "saving the prompt cache failed" in activity.problems[0]


def test_on_windows_clearing_the_prompt_cache_leaves_a_block_being_read(windows, held_open, tiny_cache):
    cache, save = tiny_cache
    (_, a), (_, b) = save(1), save(2)
    hold(held_open, b)
    a_bytes = a.stat().st_size
    assert cache.clear() == (1, a_bytes)
    assert list(cache.directory.glob("*.kv")) == [b]


def test_on_windows_a_download_lets_filelock_delete_its_lock_file(windows, held_open, tmp_path):
    lock_file = tmp_path / "model.gguf.part.lock"
    lock_file.write_bytes(b"")
    hold(held_open, lock_file)  # the lock holds it open until released
    released = []
    download._release(SimpleNamespace(lock_file=str(lock_file), release=lambda: released.append(True)))
    assert released == [True]  # filelock itself deletes the file once it has let go


def test_elsewhere_a_download_deletes_its_lock_file_while_it_holds_the_lock(tmp_path):
    lock_file = tmp_path / "model.gguf.part.lock"
    lock_file.write_bytes(b"")
    gone_before_release = []
    download._release(SimpleNamespace(lock_file=str(lock_file),
                                      release=lambda: gone_before_release.append(not lock_file.exists())))
    assert gone_before_release == [True]


# -- the benchmark tools -------------------------------------------------------------------------
def test_bench_peak_memory_on_macos_is_ru_maxrss_in_bytes(macos, monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=300 << 20))
    assert bench._peak_rss_mb() == 300.0  # and /proc/self/status was never opened


def test_bench_on_windows_leaves_out_the_peak_memory_it_cannot_measure(windows, reference_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "resource", None)  # no resource module there
    assert bench._peak_rss_mb() is None
    result = bench.run("llm-smolq", str(reference_dir / TINY), threads=1, n_prefill=8, n_decode=2)
    assert set(result) == {"load_s", "prefill_tok_s", "decode_tok_s"}
    runs = {"llm-smolq": [result], "llama.cpp": [dict(result, prefill_tok_s=2 * result["prefill_tok_s"])]}
    assert set(bench.ratios(runs)) == {"load_s", "prefill_tok_s", "decode_tok_s"}


def test_bench_names_the_cpu_on_macos_by_sysctl(macos, monkeypatch):
    def sysctl(cmd, **kwargs):
        assert cmd == ["sysctl", "-n", "machdep.cpu.brand_string"]
        return subprocess.CompletedProcess(cmd, 0, stdout="Apple M2 Pro\n", stderr="")

    monkeypatch.setattr(bench_markdown.subprocess, "run", sysctl)
    assert bench_markdown.cpu_name() == "Apple M2 Pro"


def test_the_fuzz_run_says_it_is_not_available_on_windows(windows, tmp_path, capsys):
    with pytest.raises(RuntimeError, match="not available on Windows.*--case N"):
        fuzz_gguf.run(1, 1, [], workdir=tmp_path)
    with pytest.raises(SystemExit) as ended:
        fuzz_gguf.main(["--cases", "1", "--workdir", str(tmp_path)])
    assert ended.value.code == 2 and "not available on Windows" in capsys.readouterr().err
