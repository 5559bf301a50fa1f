"""A bounded batch of the GGUF fuzzer (llm_smolq.dev.fuzz_gguf): every mutated file is refused
with a GGUFError that says what is wrong, or loads, runs and tokenizes. Nothing may crash,
hang, or raise anything else. The long run is `python -m llm_smolq.dev.fuzz_gguf --cases 100000`."""

import textwrap

from llm_smolq.dev.fuzz_gguf import make_fixtures, run
from llm_smolq.dev.gguf_mutations import MUTATIONS

SEED = 20251129
CASES = 3000


def test_a_batch_of_mutated_files_loads_or_is_refused_cleanly(tmp_path):
    report = run(SEED, CASES, make_fixtures(tmp_path / "fixtures"), timeout=60, workdir=tmp_path / "cases")
    summary = report.summary()
    print(summary)
    assert not report.failures, summary
    assert report.cases == CASES
    # Both sides are exercised: many files get through to a forward pass, many are refused,
    # and every kind of mutation was tried.
    assert report.outcomes["ran"] >= CASES // 5 and report.outcomes["rejected"] >= CASES // 3, summary
    assert report.outcomes["rejected"] + report.loaded == CASES
    assert set(report.by_mutation) == set(MUTATIONS)


SELFTEST_TARGET = '''
    import ctypes, os, time
    from pathlib import Path
    from llm_smolq import GGUFError

    def target(path):
        steps = Path(os.environ["FUZZ_SELFTEST_STEPS"])
        step = len(list(steps.iterdir()))
        (steps / str(step)).touch()
        if step == 0:
            ctypes.string_at(0)  # a segfault
        if step == 1:
            time.sleep(600)  # a hang
        if step == 2:
            raise KeyError("not a GGUFError")
        if step == 3:
            raise GGUFError("bad")  # says nothing
        if step == 4:
            raise GGUFError("a message that says what is wrong with the file")
        return "ran"
'''


def test_the_harness_reports_crashes_hangs_and_wrong_errors_by_case(tmp_path, monkeypatch):
    (tmp_path / "selftest_target.py").write_text(textwrap.dedent(SELFTEST_TARGET))
    (tmp_path / "steps").mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FUZZ_SELFTEST_STEPS", str(tmp_path / "steps"))
    fixtures = make_fixtures(tmp_path / "fixtures")[:1]
    report = run(7, 7, fixtures, timeout=3, workdir=tmp_path / "cases", target="selftest_target:target")
    kinds = {f["case"]: f["kind"] for f in report.failures}
    assert kinds == {0: "crash", 1: "hang", 2: "failure", 3: "failure"}, report.summary()
    detail = {f["case"]: f["detail"] for f in report.failures}
    assert "SIGSEGV" in detail[0] and "Segmentation fault" in detail[0]
    assert "KeyError" in detail[2]
    assert "message of 3 characters" in detail[3]
    assert report.outcomes["rejected"] == 1 and report.outcomes["ran"] == 2
    assert "--seed 7 --case 0" in report.summary()
