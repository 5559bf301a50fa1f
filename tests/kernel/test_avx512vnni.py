"""The code of the avx512vnni setting on a CPU without AVX-512: the VNNI vec_dots and
16-row batch products (native/quants/x86/avx512vnni.c) and a prefill's 512-bit attention
(native/flash_attention_x16.c).

cffi_build/build_kernel.py builds a copy of the kernel from the same source whose VNNI
kernels take their two VNNI instructions (vpdpbusd, vpdpwssd) from SIMDe (the simde-py
package, in the `test` extra), which implements them with AVX2 and plain C, and which
takes the 512-bit registers from SIMDe's stand-ins, and chooses that code on any AVX2 CPU.
The same build's AMX kernels take C stand-ins for the tiles (native/quants/x86/amx_tiles.h),
which check the shapes as the CPU would. A child python loads that copy and runs the kernel
tests (every type's SIMD vec_dot against the scalar one, bit for bit, with sq_simd_name()
"avx512vnni", and every path of helpers.simd_paths, "amx" among them), the packed weights'
tests (native/quants/rows16.c and the engine on them), the whole forward pass on every
path against the scalar one on every reference file, SmolLM2's conversations against
llama.cpp's, and the KV cache tests (a prefill's attention on every SIMD
path, bit for bit).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.kernel_copy import LOAD_KERNEL, ROOT, RUN_PYTEST, build, check_pytest_run
from helpers.run_once import once_per_run
from test_quants import cpu_flags

# The one skip here is for a CPU that cannot run this code (not x86-64, or without AVX2).
pytestmark = pytest.mark.may_skip_in_ci

# The tests the child runs on this build, in parts that a run's workers can share. The
# long-context tests and the repeats at other thread counts are left out (each several
# minutes under SIMDe), and so are the tests that compute again what another selected test
# computes: every SIMD path against the scalar one, through the whole forward pass, implies
# this path's logits in every other engine comparison (the main run holds the scalar path
# to llama.cpp's spread and to every batching); the thread counts' test on the F16 cache
# (it splits the same matrix products over the threads as on Q8_0).
# SmolLM2's real weights: a conversation's prompt and steps on every path.
SKIP = "not long_context and not (thread_counts and f16)"
SELECTIONS = {
    "kernels": ["tests/kernel/test_quants.py", "tests/kernel/test_rows16.py", "tests/engine/test_packing.py",
                "tests/dev/test_bench.py::test_the_int8_peak_does_all_the_multiply_adds_it_counts", "-k", SKIP],
    "engine": ["tests/engine/test_engine_reference.py", "-k", "simd_path and not smollm2"],
    "smollm2": ["tests/engine/test_engine_reference.py::test_smollm2_every_simd_path_gives_the_scalar_paths_bits"],
    "kv_cache": ["tests/engine/test_kv_cache.py", "-k", SKIP],
}


def simde_include() -> str:
    try:
        import simde_py
    except ImportError:
        pytest.fail("simde-py (SIMDe's headers) is missing: install the test extra, pip install -e '.[test]'")
    return simde_py.get_include()


@pytest.fixture(scope="module")
def vnni_kernel(tmp_path_factory) -> Path:
    """The kernel with SIMDe standing in for the VNNI instructions, by the builder's own code
    path, once per run."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("the VNNI kernels are x86-64 code; their SIMDe build runs on CPUs with AVX2, FMA and F16C")
    include = simde_include()
    made = once_per_run(tmp_path_factory, "vnni-via-simde",
                        lambda folder: {"path": str(build(folder, "VNNI via SIMDe", vnni_via_simde=include))})
    return Path(made["path"])


def child_env(simd: str | None) -> dict[str, str]:
    env = dict(os.environ)
    # Tells test_quants which path the kernel takes (native_simd).
    env["SMOLQ_VNNI_VIA_SIMDE"] = simde_include()
    env.pop("SMOLQ_SIMD", None)
    if simd is not None:
        env["SMOLQ_SIMD"] = simd
    return env


NAMES = LOAD_KERNEL + """
name = lambda: ffi.string(lib.sq_simd_name()).decode()
first = name()
lib.sq_set_simd(0)
off = name()
lib.sq_set_simd(1)
print(first, off, name())
"""


@pytest.mark.parametrize("simd, names", [(None, "avx512vnni scalar avx512vnni"),
                                         ("avx2", "avx2 scalar avx2"),
                                         ("amx", "amx scalar amx"),
                                         ("0", "scalar scalar avx512vnni")])
def test_simd_names(vnni_kernel, simd, names):
    """The path on first use, after sq_set_simd(0) and after sq_set_simd(1): SMOLQ_SIMD=avx2
    keeps to the AVX2 kernels, SMOLQ_SIMD=amx takes the AMX tiles (here their stand-ins),
    SMOLQ_SIMD=0 starts with the scalar ones."""
    run = subprocess.run([sys.executable, "-c", NAMES, str(vnni_kernel)], cwd=ROOT, env=child_env(simd),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == names.split(), f"SMOLQ_SIMD={simd}: {run.stdout}"


@pytest.mark.parametrize("part", SELECTIONS)
def test_kernel_and_engine_tests_pass_with_vnni(vnni_kernel, part):
    args = ["-q", "-p", "no:cacheprovider", *SELECTIONS[part]]
    run = subprocess.run([sys.executable, "-c", RUN_PYTEST, str(vnni_kernel), *args], cwd=ROOT,
                         env=child_env(None), capture_output=True, text=True, timeout=600)
    check_pytest_run(run, vnni_kernel, "the VNNI kernels via SIMDe "
                     f"(SMOLQ_VNNI_VIA_SIMDE=<simde_py.get_include()> python cffi_build/build_kernel.py, then "
                     f"python -m pytest {' '.join(args[3:])})")
