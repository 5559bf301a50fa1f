"""The ik_llama.cpp helper exports a repository's tree as its build needs it, configures the
build for this CPU or for AVX2 alone, and compares the engines' prefill by turns (the build
and the engines themselves, minutes each, are never run by the tests: subprocess stands in)."""

import json
import subprocess

import pytest

from llm_smolq.dev import ik_llama
from llm_smolq.dev.ik_llama import export_tree

real_run = subprocess.run  # the machine line's git call still runs where subprocess.run is stood in for


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_export_writes_heads_files_but_the_web_pages_and_docs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "examples" / "server" / "public").mkdir(parents=True)
    (repo / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "docs" / "guide.md").write_text("docs\n")
    (repo / "examples" / "server" / "public" / "index.html.gz").write_bytes(b"\x1f\x8b")
    (repo / "link").symlink_to("src/main.c")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "tree")
    out = tmp_path / "out"
    written, missing = export_tree(repo / ".git", out)
    assert (written, missing) == (3, [])
    assert (out / "src" / "main.c").read_text() == "int main(void) { return 0; }\n"
    assert (out / "run.sh").stat().st_mode & 0o111 and (out / "link").readlink().as_posix() == "src/main.c"
    assert not (out / "docs").exists() and not (out / "examples").exists()


def test_build_configures_for_this_cpu_or_for_avx2_alone(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ik_llama.subprocess, "run", lambda args, **kw: calls.append(args))
    for argv in (["build", "git", str(tmp_path)], ["build", "git", str(tmp_path), "--avx2"]):
        monkeypatch.setattr(ik_llama, "export_tree", lambda git_dir, out: (0, []))
        ik_llama.main(argv)
    native, avx2 = calls[0], calls[2]
    assert native[:3] == ["cmake", "-B", str(tmp_path / "build")] and "-DGGML_NATIVE=ON" in native
    assert not any("AVX" in flag for flag in native)
    assert "-DGGML_NATIVE=OFF" in avx2 and "-DGGML_AVX2=ON" in avx2 and "-DGGML_AVX512=OFF" in avx2
    assert "-DGGML_IQK_FA_ALL_QUANTS=OFF" in native and "-DGGML_IQK_FA_ALL_QUANTS=OFF" in avx2
    assert calls[1][:2] == calls[3][:2] == ["cmake", "--build"]


def test_bench_alternates_the_engines_and_takes_the_better_repacking(tmp_path, monkeypatch, capsys):
    """Each round runs our warm prefill, then llama-bench with -rtr 0 and -rtr 1; a round's
    ratio is ours over the better of the two, and the summary gives the medians (min-max)."""
    tool = tmp_path / "build" / "bin" / "llama-bench"
    tool.parent.mkdir(parents=True)
    tool.write_text("")
    model = tmp_path / "m.gguf"
    model.write_text("")
    ours = iter([{"warm_prefill_tok_s": 120.0}, {"warm_prefill_tok_s": 90.0}, {"warm_prefill_tok_s": 100.0}])
    ik = iter([50.0, 60.0, 80.0, 40.0, 100.0, 50.0])  # -rtr 0, -rtr 1 by round
    order = []

    def run(args, **kw):
        if args[0] == "git":  # the machine line's commit
            return real_run(args, **kw)
        if args[0] == str(tool):
            order.append(("ik", args[args.index("-rtr") + 1]))
            assert args[args.index("-p") + 1] == "256" and args[args.index("-n") + 1] == "0"
            return subprocess.CompletedProcess(args, 0, json.dumps([{"avg_ts": next(ik)}]), "")
        order.append(("ours", None))
        assert "--warm" in args and args[args.index("--prefill") + 1] == "256"
        return subprocess.CompletedProcess(args, 0, "log line\n" + json.dumps(next(ours)) + "\n", "")

    monkeypatch.setattr(ik_llama.subprocess, "run", run)
    ik_llama.main(["bench", str(tmp_path), str(model), "--prompt", "256", "--rounds", "3"])
    assert order == [("ours", None), ("ik", "0"), ("ik", "1")] * 3
    out = capsys.readouterr().out
    assert "Machine: " in out and " kernels; 2 threads; " in out  # the CPU, our kernels, the date and commit
    assert "round 1 prefill: llm-smolq 120.0 tok/s; ik_llama.cpp -rtr 0 50.0, -rtr 1 60.0; x2.00" in out
    assert "round 2 prefill: llm-smolq 90.0 tok/s; ik_llama.cpp -rtr 0 80.0, -rtr 1 40.0; x1.12" in out
    # ratios 2.0, 1.125, 1.0: the median of the rounds' own ratios, not of the medians' ratio
    assert ("prefill 256 tokens: llm-smolq 100.0 (90.0-120.0) tok/s, ik_llama.cpp 80.0 (60.0-100.0) (its better -rtr), "
            "x1.12 (1.00-2.00)") in out


def test_bench_says_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="run `python -m llm_smolq.dev.ik_llama build"):
        ik_llama.main(["bench", str(tmp_path), str(tmp_path / "m.gguf")])
    tool = tmp_path / "build" / "bin" / "llama-bench"
    tool.parent.mkdir(parents=True)
    tool.write_text("")
    with pytest.raises(SystemExit, match="no model file"):
        ik_llama.main(["bench", str(tmp_path), str(tmp_path / "m.gguf")])


def test_bench_times_decode_after_the_prompt_on_both_sides(tmp_path, monkeypatch, capsys):
    """With --decode N, our N warm steps after the prefill (not the cold run's) meet
    llama-bench's -gp PROMPT,N, which times N steps after a prompt of PROMPT tokens."""
    tool = tmp_path / "build" / "bin" / "llama-bench"
    tool.parent.mkdir(parents=True)
    tool.write_text("")
    model = tmp_path / "m.gguf"
    model.write_text("")
    calls = []

    def run(args, **kw):
        if args[0] == "git":  # the machine line's commit
            return real_run(args, **kw)
        calls.append(args)
        if args[0] == str(tool):
            return subprocess.CompletedProcess(args, 0, json.dumps([{"avg_ts": 20.0 if "-gp" in args else 50.0}]), "")
        return subprocess.CompletedProcess(args, 0, json.dumps({"warm_prefill_tok_s": 100.0, "decode_tok_s": 5.0,
                                                                "warm_decode_tok_s": 25.0}), "")

    monkeypatch.setattr(ik_llama.subprocess, "run", run)
    ik_llama.main(["bench", str(tmp_path), str(model), "--decode", "32", "--rounds", "1"])
    ours, *ik = calls
    assert ours[ours.index("--prefill") + 1] == "512" and ours[ours.index("--decode") + 1] == "32"
    decode = [c for c in ik if "-gp" in c]
    assert len(decode) == 2 and all(c[c.index("-gp") + 1] == "512,32" and c[c.index("-n") + 1] == "0" for c in decode)
    out = capsys.readouterr().out
    assert "decode 32 tokens after 512: llm-smolq 25.0 (25.0-25.0) tok/s, ik_llama.cpp 20.0 (20.0-20.0)" in out
    assert "x1.25 (1.25-1.25)" in out and "x2.00 (2.00-2.00)" in out
