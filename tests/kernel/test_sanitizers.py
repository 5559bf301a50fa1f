"""The kernel under AddressSanitizer and UndefinedBehaviorSanitizer.

cffi_build/build_kernel.py builds a sanitized copy of the kernel into a temporary
directory; a child python loads it in place of the normal build and runs a selection of
the kernel and engine tests. Any out-of-bounds access, misaligned load, signed overflow or
other undefined behaviour there ends the child with a report, so a clean pass is required.
The ASan runtime has to be the first library in the child (LD_PRELOAD), and it comes from
the compiler that built the kernel.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers.kernel_copy import LOAD_KERNEL, ROOT, RUN_PYTEST, build, check_pytest_run
from helpers.run_once import once_per_run

# The selections each child runs: with the SIMD code the CPU supports, in parts that a
# run's workers can share, and "scalar" with SMOLQ_SIMD=0. The long-context tests and the
# repeats at other thread counts are left out (minutes each when sanitized), and so are the
# tests that compute again what another selected test computes (the SIMD paths against the
# scalar one run the same forward passes as every batching; the moved references). The
# scalar vec_dots and activation conversions of every type also run with the SIMD code
# (test_quants switches to them), so the scalar child adds the engine's plain code around
# them (attention, SwiGLU, the products' fallbacks), which does not depend on the weights'
# type, on one file (super-blocks with Q8_K activations, and Q6_K's). SmolLM2's real
# weights: the six conversations on the Q8_0 cache (the F16 cache's rows are sanitized in
# the kv_cache part).
SKIP = ("not long_context and not thread_counts and not simd_path and not moved_by_a_little "
        "and not (compact and (K_M or Q5 or Q4_1 or IQ4))")
SELECTIONS = {
    "kernels": ["tests/kernel/test_quants.py", "tests/kernel/test_rows16.py", "tests/kernel/test_swiglu.py",
                "tests/engine/test_packing.py", "tests/engine/test_buffer_gate.py", "-k", SKIP],
    "kv_cache": ["tests/engine/test_kv_cache.py", "-k", SKIP],
    "engine": ["tests/engine/test_engine_reference.py", "-k", f"{SKIP} and not smollm2_chat and not prefill_then_decode"],
    "smollm2": ["tests/engine/test_engine_reference.py::test_smollm2_chat_references_with_a_compact_cache[q8_0]"],
    "scalar": ["tests/engine/test_buffer_gate.py", "tests/engine/test_kv_cache.py::test_truncate_and_reset_recompute_the_same_logits[f32]",
               "tests/engine/test_engine_reference.py::test_every_batching_gives_the_same_bits[Q4_K_M]"],
}
REPORT = re.compile(r"\w+Sanitizer|runtime error: ")

def compiler() -> str:
    # The compiler cffi's build uses.
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")[0]


def asan_runtime() -> Path | None:
    try:
        out = subprocess.run([compiler(), "-print-file-name=libasan.so"], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    # An unknown file comes back as the bare name.
    path = Path(out)
    return path.resolve() if path.is_absolute() and path.exists() else None


@pytest.fixture(scope="module")
def runtime() -> Path:
    path = asan_runtime()
    if path is None:
        pytest.skip(f"{compiler()} has no libasan.so (gcc's AddressSanitizer runtime): install gcc "
                    "and libasan (Debian/Ubuntu: apt install gcc libasan8) to run the sanitized tests")
    return path


@pytest.fixture(scope="module")
def sanitized_kernel(runtime, tmp_path_factory) -> Path:
    """The kernel built with sanitize=True, by the builder's own code path, once per run."""
    made = once_per_run(tmp_path_factory, "sanitized",
                        lambda folder: {"path": str(build(folder, "sanitized", sanitize=True))})
    return Path(made["path"])


def child_env(runtime: Path, simd: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(runtime), env.get("LD_PRELOAD")]))
    # Python frees little at exit by design: leak reports would be noise.
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1"
    env.pop("SMOLQ_SIMD", None)
    if simd == "scalar":
        env["SMOLQ_SIMD"] = "0"
    return env


def reproduce(runtime: Path, simd: str, args: list[str]) -> str:
    scalar = "SMOLQ_SIMD=0 " if simd == "scalar" else ""
    return (f"to reproduce: SMOLQ_SANITIZE=1 python cffi_build/build_kernel.py && {scalar}"
            f"LD_PRELOAD={runtime} ASAN_OPTIONS=detect_leaks=0 python -m pytest {shlex.join(args)}; "
            "then rebuild without SMOLQ_SANITIZE")


def test_sanitized_build_is_instrumented(sanitized_kernel):
    data = sanitized_kernel.read_bytes()
    assert b"__asan_init" in data and b"__ubsan_handle_" in data


# What the buffer gate exists to prevent, done on purpose by calling C directly: the
# sanitized kernel must stop with a report, or a clean run below would prove nothing.
BAD_CALLS = {
    "short row": ("heap-buffer-overflow", """
raw = np.zeros(3 * 34, np.uint8)  # three Q8_0 blocks where the call reads four
out = np.zeros(128, np.float32)
lib.sq_dequantize_row(lib.SQ_Q8_0, ffi.from_buffer(raw), ffi.from_buffer("float[]", out), 128)
"""),
    "misaligned q": ("load of misaligned address", """
raw = np.zeros(65 * 4, np.uint8)
q = ffi.cast("float *", ffi.from_buffer(raw) + 1)
kv = np.zeros((1, 4, 64), np.float32)
out = np.zeros((1, 64), np.float32)
lib.sq_attention(q, ffi.from_buffer(kv), ffi.from_buffer(kv), lib.SQ_F32, 1, 1, 4, 64, 4,
                 ffi.from_buffer("float[]", out))
"""),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_sanitized_kernel_reports_a_bad_call(case, sanitized_kernel, runtime):
    words, call = BAD_CALLS[case]
    code = LOAD_KERNEL + "import numpy as np\n" + call + "print('no report')\n"
    run = subprocess.run([sys.executable, "-c", code, str(sanitized_kernel)], cwd=ROOT,
                         env=child_env(runtime, "default"), capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and words in run.stderr, (
        f"{case}: the sanitized kernel did not report '{words}'; either the build flags or the "
        f"child's LD_PRELOAD/ASAN_OPTIONS no longer work, or the kernel no longer makes this access "
        f"(then make the call fail another way):\n{run.stdout}\n{run.stderr}"
    )


@pytest.mark.parametrize("part", SELECTIONS)
def test_kernel_and_engine_tests_pass_sanitized(part, sanitized_kernel, runtime):
    # --capture=sys leaves file descriptor 2 alone: a report still reaches us when it ends
    # the child in the middle of a test.
    simd = "scalar" if part == "scalar" else "default"
    args = ["-q", "-p", "no:cacheprovider", "--capture=sys", *SELECTIONS[part]]
    run = subprocess.run([sys.executable, "-c", RUN_PYTEST, str(sanitized_kernel), *args], cwd=ROOT,
                         env=child_env(runtime, simd), capture_output=True, text=True, timeout=1200)
    out = run.stdout + run.stderr
    found = REPORT.search(out)
    assert not found, (
        f"sanitized run ({part}): a sanitizer report; fix the kernel where it points, "
        f"{reproduce(runtime, simd, args)}\n{out[-12000:]}"
    )
    assert run.returncode == 0, (
        f"sanitized run ({part}) exited with status {run.returncode} and no sanitizer report, so a test "
        f"failed: check it on the normal build (python -m pytest {shlex.join(args)}), or "
        f"{reproduce(runtime, simd, args)}\n{out[-12000:]}"
    )
    check_pytest_run(run, sanitized_kernel, f"sanitized run ({part})")
