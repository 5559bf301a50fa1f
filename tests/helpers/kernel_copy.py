"""A separately built copy of the kernel, and child pythons that run tests against it
(tests/kernel/test_sanitizers.py, tests/kernel/test_avx512vnni.py).

build() runs cffi_build/build_kernel.py's compile_kernel in a child python, so that the
compiler's output can be checked for warnings; RUN_PYTEST, given the copy's path and pytest's
arguments, loads the copy in place of llm_smolq._kernel and runs pytest with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Child programs start with this: the kernel file in argv[1] becomes llm_smolq._kernel.
LOAD_KERNEL = """
import importlib.util, sys
import llm_smolq
spec = importlib.util.spec_from_file_location("llm_smolq._kernel", sys.argv[1])
kernel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel)
sys.modules["llm_smolq._kernel"] = llm_smolq._kernel = kernel
ffi, lib = kernel.ffi, kernel.lib
"""
RUN_PYTEST = LOAD_KERNEL + """
import pytest
rc = pytest.main(sys.argv[2:])
print("kernel in use:", sys.modules["llm_smolq._kernel"].__file__)
sys.exit(rc)
"""


def build(out: Path, what: str, **options) -> Path:
    """compile_kernel(out, **options) (keyword arguments given as Python literals) in a child;
    asserts a -Wall -Wextra clean build and returns the module's path. what names the copy."""
    args = ", ".join(f"{k}={v!r}" for k, v in options.items())
    code = ("import sys; from pathlib import Path; import build_kernel\n"
            f"print(build_kernel.compile_kernel(Path(sys.argv[1]), {args}))")
    run = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT / "cffi_build",
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the {what} build failed:\n{run.stdout}\n{run.stderr}"
    warnings = [line for line in (run.stdout + run.stderr).splitlines() if "warning:" in line]
    assert not warnings, (f"the kernel must build -Wall -Wextra clean ({what}); fix these warnings:\n"
                          + "\n".join(warnings))
    path = Path(run.stdout.strip().splitlines()[-1])
    assert path.is_file() and out in path.parents, run.stdout
    return path


def check_pytest_run(run: subprocess.CompletedProcess, kernel: Path, what: str) -> None:
    """The child ran the copy, ran some tests, and they passed."""
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"{what}: exited with status {run.returncode}:\n{out[-12000:]}"
    assert f"kernel in use: {kernel}" in run.stdout, f"{what}: the child ran another kernel:\n{out[-2000:]}"
    assert re.search(r"\d+ passed", run.stdout), f"{what}: the selection ran no tests:\n{out[-2000:]}"
