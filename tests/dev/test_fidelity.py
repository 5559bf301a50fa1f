"""The fidelity report runs end to end and reports what it promises."""

import json

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
