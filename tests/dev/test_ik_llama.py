"""The ik_llama.cpp helper exports a repository's tree as its build needs it (the build itself,
~25 minutes, is never run by the tests)."""

import subprocess

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
