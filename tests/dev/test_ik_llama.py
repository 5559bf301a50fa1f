"""The ik_llama.cpp helper exports a repository's tree as its build needs it and configures the
build for this CPU or for AVX2 alone (the build itself, 7-25 minutes, is never run by the
tests)."""

import subprocess

from llm_smolq.dev import ik_llama
from llm_smolq.dev.ik_llama import export_tree


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
