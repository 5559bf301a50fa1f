"""CI cannot pass by not testing: run pytest on small test files under this suite's
conftest.py, with CI set and not, and read how each run ended."""

import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

TESTS = '''
import pytest

def test_compares_with_llama_cpp(reference_dir):
    assert (reference_dir / "README.md").exists()

def test_plain():
    pass

def test_skips():
    pytest.skip("a reason of its own")

@pytest.mark.may_skip_in_ci
def test_optional_extra():
    pytest.importorskip("no_such_module_anywhere")

@pytest.mark.xfail(reason="expected to fail", strict=True)
def test_expected_failure():
    assert False
'''


def run_pytest(folder: Path, ci: bool, reference: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SMOLQ_REFERENCE": str(reference), "HOME": str(folder)}
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "-o", "markers=may_skip_in_ci: optional", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def suite(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_sample.py").write_text(TESTS)
    return tmp_path


@pytest.mark.parametrize("ci", [True, False])
def test_missing_references_stop_the_run_with_the_fix(suite, tmp_path, ci):
    missing = tmp_path / "no-reference-here"
    result = run_pytest(suite, ci, missing)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert f"llama.cpp's reference files are not at {missing}" in result.stderr
    assert "unset SMOLQ_REFERENCE" in result.stderr and "passed" not in result.stdout


def test_outside_ci_a_skip_is_a_skip(suite, tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "README.md").write_text("stand-in\n")
    result = run_pytest(suite, False, reference)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "a reason of its own" in result.stdout
    assert "2 passed, 2 skipped, 1 xfailed" in result.stdout


def test_in_ci_a_skip_fails_unless_marked_and_marked_skips_stay_in_the_summary(suite, tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "README.md").write_text("stand-in\n")
    result = run_pytest(suite, True, reference)
    out = result.stdout
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, out + result.stderr
    assert "skipped in CI, where every test must run: Skipped: a reason of its own" in out
    assert "SKIPPED [1] test_sample.py" in out and "no_such_module_anywhere" in out
    assert "1 failed, 2 passed, 1 skipped, 1 xfailed" in out
