"""The fidelity report runs end to end and reports what it promises."""

import json

import numpy as np
import pytest

from llm_smolq.dev import fidelity


def test_fidelity_reports_ours_and_llama_cpps_builds_side_by_side(reference_dir, capsys):
    fidelity.main([str(reference_dir), "--types", "Q4_1,Q8_0", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert set(report["files"]) == {"Q4_1", "Q8_0", "long Q8_0"}
    for name, row in report["files"].items():
        for against in ("avx2", "avx512", "builds"):
            median, worst = row[against]
            assert 0 <= median <= worst, (name, against)
        # Held as the engine's tests hold it (tests/engine/test_engine_reference.py).
        assert row["avx2"][0] <= 2.5e-2 and row["avx512"][0] <= 2.5e-2, (name, row)
    text = fidelity.format_report(report)
    assert "long Q8_0" in text and "vs AVX-512 build" in text


def test_fidelity_names_what_it_lacks(tmp_path, capsys):
    for types, says in (("Q4_1", "lacks the GGUFs of Q4_1"), ("Q9_9", "no reference file of Q9_9")):
        with pytest.raises(SystemExit) as stop:
            fidelity.main([str(tmp_path), "--types", types])
        assert stop.value.code == 2 and says in capsys.readouterr().err


def test_full_kl_is_zero_for_the_same_logits_and_matches_a_worked_case():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 50)).astype(np.float32)
    assert np.allclose(fidelity.full_kl(logits, logits), 0.0, atol=1e-12)
    # Two ids: p = softmax(0, 0) = (1/2, 1/2), q = softmax(0, ln 3) = (1/4, 3/4).
    kl = fidelity.full_kl(np.array([[0.0, 0.0]]), np.array([[0.0, np.log(3.0)]]))
    assert kl[0] == pytest.approx(0.5 * np.log(2.0) + 0.5 * np.log(2.0 / 3.0))
    # Shifting a row's logits by a constant changes no distribution.
    assert np.allclose(fidelity.full_kl(logits, logits + 7.0), 0.0, atol=1e-12)


def test_text_needs_the_smollm2_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        fidelity.main([str(tmp_path), "--types", "Q4_1", "--text", str(tmp_path / "t.txt")])
    assert stop.value.code == 2 and "give its GGUF with --smollm2" in capsys.readouterr().err


@pytest.mark.may_skip_in_ci
def test_live_text_compares_ours_with_llama_cpp_over_the_vocabulary(smollm2_gguf, tmp_path):
    """Only where llama-cpp-python is installed (the `bench` extra)."""
    pytest.importorskip("llama_cpp")
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8)
    report = fidelity.live_text(smollm2_gguf, text, ["installed"], positions=40)
    assert report["positions"] == 40
    assert set(report["pairs"]) == {"ours F32 cache || ours F16 cache", "llama.cpp installed || ours F16 cache",
                                    "llama.cpp installed || ours F32 cache"}
    # Near, not equal: llama.cpp's own builds are about this far apart on real text (docs/design.md).
    for pair, r in report["pairs"].items():
        assert 0 < r["kl_mean"] < 0.05 and r["top1_same"] >= 0.8, (pair, r)


def test_mean_error_is_the_spread_of_block_means():
    # Sixteen runs of four alike values: the error of the mean comes from the runs' means.
    values = np.repeat(np.arange(16, dtype=np.float64), 4)
    assert fidelity.mean_error(values) == pytest.approx(np.arange(16).std(ddof=1) / 4)
    assert fidelity.mean_error(np.full(64, 2.5)) == 0.0


def test_the_report_says_when_two_builds_gave_the_same_logits():
    pair = {"kl_mean_se": 0.0, "kl_median": 0.0, "kl_p99": 0.0, "top1_same": 1.0}
    text = {"positions": 8, "beyond_builds": {},
            "pairs": {"llama.cpp b || llama.cpp a": {**pair, "kl_mean": 0.0},
                      "llama.cpp b || ours F16 cache": {**pair, "kl_mean": 4e-3}}}
    lines = fidelity.format_report({"files": {}, "text": text}).splitlines()
    flagged = [line for line in lines if "the same logits" in line]
    assert len(flagged) == 1 and "llama.cpp b || llama.cpp a" in flagged[0]
