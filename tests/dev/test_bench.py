"""The benchmark command runs end to end and reports what it promises (no speed asserts)."""

import json
import subprocess
import sys

from gguf import GGUFReader


def test_bench_reports_speed_memory_and_bandwidth(reference_dir):
    model = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    cmd = [sys.executable, "-m", "llm_smolq.dev.bench", str(model), "--threads", "2", "--prefill", "16",
           "--decode", "4", "--repeat", "2", "--json", "--schema"]
    report = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    ours = report["engines"]["llm-smolq"]
    for key in ("prefill_tok_s", "decode_tok_s", "load_s", "peak_rss_mb", "schema_ms_per_token",
                "schema_pct_of_decode"):
        assert 0 < ours[key]["min"] <= ours[key]["median"] <= ours[key]["max"]
    # Tied embeddings: a decode step reads every tensor once (token_embd as the output).
    assert report["weight_bytes_per_token"] == sum(t.n_bytes for t in GGUFReader(model).tensors)
    assert report["machine_read_gb_s"] > 0 and ours["decode_gb_s"] > 0


def test_bench_bandwidth_reads_the_model_file_with_the_engines_threads(reference_dir):
    model = reference_dir / "tiny-smollm3-Q8_0.gguf"
    cmd = [sys.executable, "-m", "llm_smolq.dev.bench", str(model), "--threads", "2", "--prefill", "16",
           "--decode", "8", "--repeat", "1", "--json", "--bandwidth"]
    report = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    ours = report["engines"]["llm-smolq"]
    read, share = ours["file_read_gb_s"]["median"], ours["decode_pct_of_read"]["median"]
    assert read > 0.1 and share > 0
    # the share is decode's weight bytes per second over that read rate
    expected = 100 * report["weight_bytes_per_token"] * ours["decode_tok_s"]["median"] / 1e9 / read
    assert abs(share - expected) < 0.01 * expected


def test_the_kernel_reads_every_byte_it_is_given():
    """sq_read_all's checksum: the 64-bit words of every whole cache line, plus the bytes
    after the last one, summed modulo 2**64, whatever the split between threads."""
    import numpy as np

    from llm_smolq._kernel import ffi, lib

    data = np.random.default_rng(0).integers(0, 256, 64 * 1000 + 13, dtype=np.uint8)
    whole = data.size // 64 * 64
    expected = (int(data[:whole].view(np.uint64).sum(dtype=np.uint64)) + int(data[whole:].sum())) % 2**64
    for threads in (1, 2, 3):
        pool = ffi.gc(lib.sq_pool_new(threads), lib.sq_pool_free)
        assert lib.sq_read_all(pool, ffi.from_buffer(data), data.size) == expected
    assert lib.sq_read_all(pool, ffi.from_buffer(data[1:]), data.size - 1) == 0  # not 8-byte aligned: refused


def test_bench_lookup_compares_lookup_with_plain_decoding(smollm2_gguf, monkeypatch):
    from llm_smolq.dev import lookup_bench

    monkeypatch.setattr(lookup_bench, "ANSWER_TOKENS", 40)
    report = lookup_bench.measure(str(smollm2_gguf), 2, 8, 1)
    assert set(report["prompts"]) == set(lookup_bench.PROMPTS)
    for p in report["prompts"].values():
        assert p["same_output"] and p["answer_tokens"] > 1
        assert p["plain_tok_s"]["median"] > 0 and p["lookup_tok_s"]["median"] > 0
    assert report["prompts"]["repeat a paragraph"]["accepted"] > 0
    assert "x" in lookup_bench.format_report(report)


def test_bench_draft_check_times_step_order_batches_against_one_step(smollm2_gguf, capsys):
    from llm_smolq.dev import bench

    bench.main([str(smollm2_gguf), "--draft-check", "40", "--threads", "2", "--repeat", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["depth"] == 40 and list(report["sizes"]) == ["1", "2", "4", "8", "9", "16"]
    assert report["sizes"]["1"]["steps"] == 1.0
    assert all(v["ms"] > 0 for v in report["sizes"].values())
    assert report["sizes"]["16"]["ms"] > report["sizes"]["1"]["ms"]  # sixteen tokens are not free


def test_bench_kernels_times_each_types_largest_matrix_in_both_layouts(reference_dir, capsys):
    from llm_smolq._kernel import lib
    from llm_smolq.dev import bench

    bench.main([str(reference_dir / "tiny-smollm3-Q4_K_M.gguf"), "--kernels", "1,2,9", "--repeat", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert set(report["types"]) == {"Q4_K", "Q6_K"}  # the file's quantized types; its F32 norms are no mat-vecs
    for name, entry in report["types"].items():
        assert list(entry["tokens"]) == ["1", "2", "9"] and entry["mb"] > 0
        packs = bool(lib.sq_rows16_wanted(getattr(lib, f"SQ_{name}")))
        for row in entry["tokens"].values():
            assert row["file_gb_s"] > 0
            assert ("packed_gb_s" in row) == packs  # packed only where the path in use reads it so
            assert row.get("same_bits", True) is True


def test_bench_kernels_refuses_token_counts_it_cannot_use(reference_dir, capsys):
    import pytest

    from llm_smolq.dev import bench

    for bad in ("a,b", "0,2", "1,,2"):
        with pytest.raises(SystemExit):
            bench.main([str(reference_dir / "tiny-smollm3-Q4_K_M.gguf"), "--kernels", bad])
        assert "--kernels" in capsys.readouterr().err
