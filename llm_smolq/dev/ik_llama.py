"""Build ik_llama.cpp's llama-bench from a git directory of its public source, and run it the
way BENCHMARKS.md compares with it (a development tool; never part of the tests' run):

    python -m llm_smolq.dev.ik_llama build GIT_DIR OUT_DIR [--avx2] # export the tree, cmake, build (~25 min on 2 cores)
    python -m llm_smolq.dev.ik_llama bench OUT_DIR MODEL.gguf [--threads 2] [--prompt 512]

GIT_DIR is a git directory (a clone's .git, or a bare mirror) whose history may lack the large
web-UI blobs: the tree of HEAD is written out file by file, skipping what a CPU benchmark
does not build (the server's web pages, the web UI, docs and media), so a missing blob there
does not stop it. `bench` runs `llama-bench -p PROMPT -n 32 -r 3` with `-rtr 0` and `-rtr 1`
(run-time repacking off and on) and prints both; the better one counts.

`--avx2` builds for AVX2 alone, whatever the CPU has: set beside `SMOLQ_SIMD=avx2`, an
AVX-512 machine compares the two engines' AVX2 code (a stand-in for, not a figure of, an
AVX2-only CPU, whose cores split 256-bit work differently).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path

SKIPPED = re.compile(r"^(docs/|media/|examples/server/public|.*webui)")
CMAKE = ["-DGGML_IQK_FA_ALL_QUANTS=OFF", "-DLLAMA_CURL=OFF"]
NATIVE = ["-DGGML_NATIVE=ON"]
AVX2_ONLY = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_BF16=OFF"]


def export_tree(git_dir: Path, out: Path) -> tuple[int, list[str]]:
    """HEAD's files, but the skipped ones, written under out: (files written, paths whose
    blob the repository lacks)."""
    git = ["git", f"--git-dir={git_dir}"]
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", "HEAD"], capture_output=True, check=True).stdout
    written, missing = 0, []
    for entry in filter(None, listing.decode().split("\0")):
        meta, path = entry.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind != "blob" or SKIPPED.match(path):
            continue
        blob = subprocess.run([*git, "cat-file", "blob", sha], capture_output=True)
        if blob.returncode:
            missing.append(path)
            continue
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            if not target.is_symlink():
                os.symlink(blob.stdout.decode(), target)
        else:
            target.write_bytes(blob.stdout)
            if mode == "100755":
                target.chmod(0o755)
        written += 1
    return written, missing


def build(out: Path, avx2_only: bool = False) -> Path:
    flags = [*CMAKE, *(AVX2_ONLY if avx2_only else NATIVE)]
    subprocess.run(["cmake", "-B", str(out / "build"), *flags], cwd=out, check=True)
    subprocess.run(["cmake", "--build", str(out / "build"), "--target", "llama-bench", "-j", str(os.cpu_count() or 1)],
                   cwd=out, check=True)
    return out / "build" / "bin" / "llama-bench"


def bench(out: Path, model: Path, threads: int, prompt: int) -> None:
    tool = out / "build" / "bin" / "llama-bench"
    if not tool.is_file():
        raise SystemExit(f"no {tool}: run `python -m llm_smolq.dev.ik_llama build GIT_DIR {out}` first")
    for rtr in (0, 1):
        print(f"-rtr {rtr}:", flush=True)
        subprocess.run([str(tool), "-m", str(model), "-t", str(threads), "-p", str(prompt), "-n", "32", "-r", "3",
                        "-rtr", str(rtr)], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llm_smolq.dev.ik_llama", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="export HEAD's tree from GIT_DIR into OUT_DIR and build llama-bench")
    b.add_argument("git_dir", type=Path)
    b.add_argument("out_dir", type=Path)
    b.add_argument("--avx2", action="store_true", help="build for AVX2 alone (no AVX-512), whatever this CPU has")
    r = commands.add_parser("bench", help="llama-bench with run-time repacking off and on")
    r.add_argument("out_dir", type=Path)
    r.add_argument("model", type=Path)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--prompt", type=int, default=512)
    args = parser.parse_args(argv)
    if args.command == "build":
        args.out_dir.mkdir(parents=True, exist_ok=True)
        written, missing = export_tree(args.git_dir, args.out_dir)
        print(f"{written} files written; {len(missing)} missing from the repository: {', '.join(missing) or '-'}")
        print(f"built {build(args.out_dir, args.avx2)}")
    else:
        bench(args.out_dir, args.model, args.threads, args.prompt)


if __name__ == "__main__":
    main()
