"""The benchmark command runs end to end and reports what it promises (no speed asserts)."""

import json
import subprocess
import sys

import pytest
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
    # the kernels' path, as a fresh process names it under the same environment
    name = "from llm_smolq._kernel import ffi, lib; print(ffi.string(lib.sq_simd_name()).decode())"
    assert report["simd"] == subprocess.run([sys.executable, "-c", name], capture_output=True, text=True,
                                            check=True).stdout.strip()


def test_bench_warm_times_the_prefill_again_as_llama_bench_does(reference_dir):
    model = reference_dir / "tiny-smollm3-Q8_0.gguf"
    cmd = [sys.executable, "-m", "llm_smolq.dev.bench", str(model), "--threads", "2", "--prefill", "24",
           "--decode", "2", "--repeat", "1", "--warm"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "warm prefill tok/s (llama-bench's way)" in out and "warm decode tok/s" in out
    report = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True).stdout)
    assert report["engines"]["llm-smolq"]["warm_prefill_tok_s"]["median"] > 0
    assert report["engines"]["llm-smolq"]["warm_decode_tok_s"]["median"] > 0


def test_warm_decode_steps_follow_the_last_warm_prefill(monkeypatch):
    """With warm, the decode is timed again after the warm prefill's last pass: the same
    steps from a cache that holds the prompt, as llama-bench's -gp times its steps."""
    import llm_smolq.dev.bench as bench

    class Engine:
        def __init__(self):
            self.cached, self.steps = [], []

        def reset(self):
            self.cached = []

        def eval(self, ids):
            if len(ids) == 1:
                self.steps.append((len(self.cached), ids[0]))
            self.cached += ids

    eng = Engine()
    monkeypatch.setattr(bench, "_load", lambda *a: (eng.eval, 1000, eng))
    monkeypatch.setattr(bench, "_peak_rss_mb", lambda: None)
    result = bench.run("llm-smolq", "m.gguf", 2, n_prefill=6, n_decode=3, warm=True)
    ids = bench._token_ids(1000, 9)
    cold, warm = eng.steps[:3], eng.steps[3:]
    assert cold == warm == [(6, ids[6]), (7, ids[7]), (8, ids[8])]
    assert result["warm_decode_tok_s"] > 0 and result["warm_prefill_tok_s"] > 0


def test_warm_prefill_is_the_mean_of_passes_from_an_empty_cache(monkeypatch):
    import llm_smolq.dev.bench as bench

    class Engine:
        """Records each reset and call; the n-th call takes n seconds of a fake clock."""
        def __init__(self):
            self.calls, self.now = [], 0.0

        def reset(self):
            self.calls.append("reset")

        def eval(self, ids):
            self.calls.append(len(ids))
            self.now += sum(1 for c in self.calls if c != "reset")

    eng = Engine()
    monkeypatch.setattr(bench.time, "perf_counter", lambda: eng.now)
    rate = bench.warm_prefill_tok_s(eng, list(range(8)), 4, passes=3)
    # a warm-up pass and three timed ones, each from an empty cache, in two calls of 4 ids
    assert eng.calls == ["reset", 4, 4] * 4
    # the timed passes took 3 + 4 = 7 (calls 3 and 4), 11 and 15 seconds: the mean of their rates
    assert rate == (8 / 7 + 8 / 11 + 8 / 15) / 3


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


def test_the_int8_peak_does_all_the_multiply_adds_it_counts(monkeypatch, simd_restore):
    """sq_int8_peak on every SIMD path this CPU runs: every lane gains a * b per product,
    so the checksum is a * b times the multiply-adds counted, for any thread count; the
    count is the path's instruction width times its rounds and sums."""
    from helpers.simd_paths import simd_paths

    from llm_smolq._kernel import ffi, lib

    checksum = ffi.new("uint64_t *")
    widths = {"amx": 4 * 16 * 16 * 64, "avx512vnni": 64 * 12, "avx2": 32 * 12, "neon": 16 * 12, "scalar": 64}
    seen = set()
    for set_path in simd_paths(monkeypatch):
        name = set_path()
        if name in seen:
            continue
        seen.add(name)
        for threads, a, b in ((1, 3, 2), (2, 127, 63), (3, 0, -5)):
            pool = ffi.gc(lib.sq_pool_new(threads), lib.sq_pool_free)
            macs = lib.sq_int8_peak(pool, 1000, a, b, checksum)
            assert macs == threads * 1000 * widths[name], name
            assert checksum[0] == macs * a * b, (name, a, b)
        for bad in ((-1, 1), (128, 1), (1, 64), (1, -65)):
            assert lib.sq_int8_peak(pool, 10, *bad, checksum) == -1
        assert lib.sq_int8_peak(pool, -1, 1, 1, checksum) == -1
        assert lib.sq_int8_peak(ffi.NULL, 10, 1, 1, checksum) == -1


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


def test_bench_draft_check_times_batches_against_one_step(smollm2_gguf, capsys):
    from llm_smolq.dev import bench

    bench.main([str(smollm2_gguf), "--draft-check", "40", "--threads", "2", "--repeat", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["depth"] == 40 and list(report["sizes"]) == ["1", "2", "4", "8", "9", "16"]
    assert report["sizes"]["1"]["steps"] == 1.0
    one = report["sizes"]["1"]["ms"]
    for size in report["sizes"].values():  # each size's time in one-step units (no claim on the times: the run may share the CPU)
        assert size["ms"] > 0 and size["steps"] == pytest.approx(size["ms"] / one)
    # The int8 floor: a size's multiply-adds (every layer's matrices and the tied output's
    # per token) at the measured peak.
    from llm_smolq.model.model_file import open_model

    model = open_model(str(smollm2_gguf))
    per_token = sum(t.shape[0] * t.shape[1] for n, t in model.tensors.items()
                    if len(t.shape) == 2 and (n.startswith("blk.") or n == "token_embd.weight"))
    assert report["int8_macs_per_token"] == per_token and report["int8_macs_per_s"] > 0
    for k, size in report["sizes"].items():
        assert size["int8_floor_ms"] == pytest.approx(int(k) * per_token / report["int8_macs_per_s"] * 1e3)


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


def test_bench_kernels_against_another_build_alternates_them_call_by_call(reference_dir, capsys):
    """--against: the kernel in use and another build (here the same file, loaded again) take
    each product in turn; the report gives both rates, their ratio and that the bits agree."""
    import llm_smolq._kernel
    from llm_smolq._kernel import lib
    from llm_smolq.dev import bench

    other = llm_smolq._kernel.__file__
    bench.main([str(reference_dir / "tiny-smollm3-Q4_K_M.gguf"), "--kernels", "1,9", "--against", other,
                "--repeat", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["against"] == other and report["calls"] == 10 and len(report["simd"]) == 2
    assert set(report["types"]) == {"Q4_K", "Q6_K"}
    for name, entry in report["types"].items():
        packs = bool(lib.sq_rows16_wanted(getattr(lib, f"SQ_{name}")))
        assert entry["layout"] == ("packed" if packs else "file")
        assert list(entry["tokens"]) == ["1", "9"]
        for row in entry["tokens"].values():
            assert row["this_gb_s"] > 0 and row["other_gb_s"] > 0 and row["same_bits"] is True
            assert row["speedup"] == pytest.approx(row["this_gb_s"] / row["other_gb_s"])


def test_bench_against_refuses_a_missing_build_and_other_modes(reference_dir, tmp_path, capsys):
    from llm_smolq.dev import bench

    model = str(reference_dir / "tiny-smollm3-Q4_K_M.gguf")
    for args in (["--kernels", "1", "--against", str(tmp_path / "missing.so")], ["--against", str(tmp_path)]):
        with pytest.raises(SystemExit):
            bench.main([model, *args])
        assert "--against" in capsys.readouterr().err


def test_bench_kernels_refuses_token_counts_it_cannot_use(reference_dir, capsys):
    import pytest

    from llm_smolq.dev import bench

    for bad in ("a,b", "0,2", "1,,2"):
        with pytest.raises(SystemExit):
            bench.main([str(reference_dir / "tiny-smollm3-Q4_K_M.gguf"), "--kernels", bad])
        assert "--kernels" in capsys.readouterr().err


def _markdown_table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header and the rows (by label) of the one table in the bench's Markdown output;
    checks that every line of it has the header's number of cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    header, rule, body = cells[0], cells[1], cells[2:]
    assert rule == ["---"] * len(header)
    assert all(len(row) == len(header) for row in body)
    return header, {row[0]: row[1:] for row in body}


def _shows(cell: str, value: float) -> bool:
    """Whether a cell holds `value` as printed: the number, rounded at the cell's last digit."""
    text = cell.replace(",", "")
    decimals = len(text.partition(".")[2])
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9


def _machine_line(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("Machine: ")]
    return line


def _recording_children(monkeypatch, fake=None) -> dict:
    """bench._child, with every run's figures kept by (engine, depth); `fake(engine, args, call)`
    stands in for the engines it answers for."""
    from llm_smolq.dev import bench

    seen: dict = {}
    real = bench._child

    def child(engine, args):
        runs = seen.setdefault((engine, args.depth), [])
        result = (fake and fake(engine, args, len(runs))) or real(engine, args)
        runs.append(result)
        return result

    monkeypatch.setattr(bench, "_child", child)
    return seen


def test_bench_markdown_prints_the_measured_figures_with_the_machine(reference_dir, monkeypatch, capsys):
    import statistics
    from datetime import date
    from pathlib import Path

    from llm_smolq._kernel import ffi, lib
    from llm_smolq.dev import bench

    seen = _recording_children(monkeypatch)
    model = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    bench.main([str(model), "--threads", "2", "--prefill", "16", "--decode", "4", "--repeat", "3", "--bandwidth",
                "--with-depth", "40", "--markdown"])
    out = capsys.readouterr().out
    assert out.startswith(f"### {model.name} (")
    header, rows = _markdown_table(out)
    assert header == ["", "llm-smolq"]  # no llama.cpp column without --vs-llama-cpp
    assert list(rows) == [
        "prefill, 16 tokens, tok/s", "decode, 4 tokens, tok/s",
        "decode: weights read per second, share of our threads' file read rate", "load, s", "peak RSS, MB",
        "prefill to depth 40 (batches of 512), tok/s", "decode at depth 40, 4 tokens, tok/s",
        "decode at depth 40: weights read per second, share of our threads' file read rate",
        "peak RSS at depth 40, MB"]
    short, deep = seen[("llm-smolq", None)], seen[("llm-smolq", 40)]
    assert len(short) == len(deep) == 3

    def median(runs, key):
        return statistics.median(r[key] for r in runs)

    for label, runs, key in [("prefill, 16 tokens, tok/s", short, "prefill_tok_s"),
                             ("decode, 4 tokens, tok/s", short, "decode_tok_s"),
                             ("load, s", short, "load_s"), ("peak RSS, MB", short, "peak_rss_mb"),
                             ("prefill to depth 40 (batches of 512), tok/s", deep, "prefill_tok_s"),
                             ("decode at depth 40, 4 tokens, tok/s", deep, "decode_tok_s"),
                             ("peak RSS at depth 40, MB", deep, "peak_rss_mb")]:
        assert _shows(rows[label][0], median(runs, key)), (label, rows[label], [r[key] for r in runs])
    share, _, read = rows["decode: weights read per second, share of our threads' file read rate"][0].partition(" of ")
    assert _shows(share.rstrip("%"), median(short, "decode_pct_of_read"))
    assert _shows(read.removesuffix(" GB/s"), median(short, "file_read_gb_s"))

    machine = _machine_line(out)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.partition(":")[2].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        if names:
            assert names[0] in machine
    assert f"{ffi.string(lib.sq_simd_name()).decode()} kernels" in machine
    assert "; 2 threads; " in machine and date.today().isoformat() in machine
    head = subprocess.run(["git", "-C", str(Path(bench.__file__).resolve().parents[2]), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode == 0:
        assert f"commit {head.stdout.strip()}" in machine


def test_bench_markdown_sets_llama_cpp_beside_ours_with_the_rounds_ratios(reference_dir, monkeypatch, capsys):
    """With --vs-llama-cpp: llama.cpp's column and the ratio's are the medians of what its runs
    gave and of the rounds' ratios. llama.cpp itself is a stand-in here (its figures differ in
    every run), so that the arithmetic is checked wherever the test runs."""
    import statistics
    import types

    from llm_smolq.dev import bench

    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))

    def fake(engine, args, call):
        if engine == "llm-smolq":
            return None
        scale = (1.0 + 0.37 * call) * (1.5 if engine.endswith("-fa") else 1.0)
        return {"load_s": 0.9 * scale, "prefill_tok_s": 700.0 * scale, "decode_tok_s": 90.0 / scale,
                "peak_rss_mb": 300.0 * scale}

    seen = _recording_children(monkeypatch, fake)
    model = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    bench.main([str(model), "--threads", "2", "--prefill", "16", "--decode", "4", "--repeat", "3", "--vs-llama-cpp",
                "--with-depth", "24", "--markdown"])
    out = capsys.readouterr().out
    header, rows = _markdown_table(out)
    assert header == ["", "llm-smolq", "llama.cpp", "llm-smolq / llama.cpp"]
    assert "the rounds' ratios" in out and "flash attention (fa)" in out

    def ratio_cell(values):
        return f"x{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    better = {"prefill_tok_s": max, "decode_tok_s": max, "load_s": min, "peak_rss_mb": min}
    for label, depth, key in [("prefill, 16 tokens, tok/s", None, "prefill_tok_s"),
                              ("decode, 4 tokens, tok/s", None, "decode_tok_s"),
                              ("load, s", None, "load_s"), ("peak RSS, MB", None, "peak_rss_mb"),
                              ("prefill to depth 24 (batches of 512), tok/s", 24, "prefill_tok_s"),
                              ("decode at depth 24, 4 tokens, tok/s", 24, "decode_tok_s"),
                              ("peak RSS at depth 24, MB", 24, "peak_rss_mb")]:
        ours_cell, theirs_cell, ratio = rows[label]
        ours = [r[key] for r in seen[("llm-smolq", depth)]]
        assert _shows(ours_cell, statistics.median(ours))
        if depth is None:  # llama.cpp with its defaults only
            theirs = [r[key] for r in seen[("llama.cpp", None)]]
            assert _shows(theirs_cell, statistics.median(theirs))
        else:  # at depth also with flash attention; the ratio takes the better of the two each round
            plain, fa = ([r[key] for r in seen[(e, depth)]] for e in ("llama.cpp", "llama.cpp-fa"))
            plain_cell, fa_cell = theirs_cell.split(" / ")
            assert _shows(plain_cell, statistics.median(plain))
            assert fa_cell.startswith("fa ") and _shows(fa_cell[3:], statistics.median(fa))
            theirs = [better[key](a, b) for a, b in zip(plain, fa)]
        assert ratio == ratio_cell([a / b for a, b in zip(ours, theirs)]), (label, ratio)


def test_bench_markdown_lookup_rows(smollm2_gguf, monkeypatch, capsys):
    from llm_smolq.dev import bench, lookup_bench

    monkeypatch.setattr(lookup_bench, "ANSWER_TOKENS", 16)
    measured = []
    real = lookup_bench.measure
    monkeypatch.setattr(lookup_bench, "measure", lambda *a: measured.append(real(*a)) or measured[-1])
    bench.main([str(smollm2_gguf), "--lookup", "--threads", "2", "--repeat", "1", "--markdown"])
    out = capsys.readouterr().out
    header, rows = _markdown_table(out)
    assert header == ["", "llm-smolq"] and _machine_line(out)
    (report,) = measured
    assert len(rows) == len(lookup_bench.PROMPTS)
    for name, p in report["prompts"].items():
        (cell,) = [cells[0] for label, cells in rows.items() if label.startswith(f"lookup decoding, {name} (")]
        r = p["ratio"]
        assert cell.startswith(f"x{r['median']:.2f}")
        assert ("ANSWERS DIFFER" in cell) != p["same_output"]


def test_bench_markdown_refuses_what_it_cannot_print(reference_dir, capsys):
    import pytest

    from llm_smolq.dev import bench

    model = str(reference_dir / "tiny-smollm3-Q4_K_M.gguf")
    for extra, says in [(["--json"], "one output format"), (["--draft-check"], "not --draft-check"),
                        (["--kernels"], "not --kernels")]:
        with pytest.raises(SystemExit):
            bench.main([model, "--markdown", *extra])
        assert says in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main([model, "--depth", "64", "--with-depth", "128"])
    assert "--with-depth" in capsys.readouterr().err
