"""Build ik_llama.cpp's llama-bench from a git directory of its public source, and run it the
way BENCHMARKS.md compares with it (a development tool; never part of the tests' run):

    python -m llm_smolq.dev.ik_llama build GIT_DIR OUT_DIR [--avx2] # export the tree, cmake, build (~25 min on 2 cores)
    python -m llm_smolq.dev.ik_llama bench OUT_DIR MODEL.gguf [--threads 2] [--prompt 512] [--decode N] [--rounds 3]

GIT_DIR is a git directory (a clone's .git, or a bare mirror) whose history may lack the large
web-UI blobs: the tree of HEAD is written out file by file, skipping what a CPU benchmark
does not build (the server's web pages, the web UI, docs and media), so a missing blob there
does not stop it.

`bench` compares the two engines' prefill of PROMPT tokens in rounds, by turns, so that a
machine whose speed drifts by the minute moves both alike: in each round our prefill as
llama-bench times its own (`bench --warm` in a fresh process: a warm-up pass, then the mean of
5), then `llama-bench -p PROMPT -n 0 -r 1` with `-rtr 0` and `-rtr 1` (run-time repacking off
and on), the better of the two counting. It prints each round and the medians, the ratio being
the median of the rounds' own ratios (min-max). With `--decode N`, decode too: N of our steps
after the warm prefill's last pass against llama-bench's `-gp PROMPT,N` (N steps after a
prompt of PROMPT tokens, past its warm-up run, the steps alone timed). Our kernels are the
ones SMOLQ_SIMD picks, as in the bench; a line says which, with the CPU, the date and the
commit, as the bench's Markdown does.

`--avx2` builds for AVX2 alone, whatever the CPU has: set beside `SMOLQ_SIMD=avx2`, an
AVX-512 machine compares the two engines' AVX2 code (a stand-in for, not a figure of, an
AVX2-only CPU, whose cores split 256-bit work differently).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
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


def ik_tok_s(tool: Path, model: Path, threads: int, prompt: int, decode: int, rtr: int) -> float:
    """llama-bench's tokens per second for one run (a warm-up, then one timed): of a prompt
    of `prompt` tokens (decode 0), or of `decode` steps after it (`-gp`, which times the
    steps alone, as ours are timed after our prefill)."""
    test = ["-p", str(prompt), "-n", "0"] if not decode else ["-p", "0", "-n", "0", "-gp", f"{prompt},{decode}"]
    done = subprocess.run([str(tool), "-m", str(model), "-t", str(threads), *test, "-r", "1", "-rtr", str(rtr), "-o",
                           "json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llama-bench failed:\n{done.stderr.strip()[-2000:]}")
    return float(json.loads(done.stdout)[0]["avg_ts"])


def ours(model: Path, threads: int, prompt: int, decode: int) -> dict:
    """Our warm prefill (and decode) in a fresh process, as `bench --warm` measures them."""
    done = subprocess.run([sys.executable, "-m", "llm_smolq.dev.bench", str(model), "--child", "llm-smolq", "--threads",
                           str(threads), "--prefill", str(prompt), "--decode", str(max(decode, 1)), "--warm"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llm-smolq run failed:\n{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(out: Path, model: Path, threads: int, prompt: int, decode: int, rounds: int) -> None:
    tool = out / "build" / "bin" / "llama-bench"
    if not tool.is_file():
        raise SystemExit(f"no {tool}: run `python -m llm_smolq.dev.ik_llama build GIT_DIR {out}` first")
    if not model.is_file():
        raise SystemExit(f"no model file {model}")
    from llm_smolq.dev.bench_markdown import machine_line
    from llm_smolq.dev.spread import spread, spread_text

    print(f"{model} against {tool}, {rounds} rounds by turns", flush=True)
    print(machine_line(threads), flush=True)
    kinds = [("prefill", prompt, 0)] + ([("decode", prompt, decode)] if decode else [])
    seen = {kind: {"ours": [], "ik": [], "ratio": []} for kind, _, _ in kinds}
    for r in range(1, rounds + 1):
        mine = ours(model, threads, prompt, decode)
        for kind, p, n in kinds:
            ik = [ik_tok_s(tool, model, threads, p, n, rtr) for rtr in (0, 1)]
            me = mine["warm_prefill_tok_s" if kind == "prefill" else "warm_decode_tok_s"]
            got = seen[kind]
            got["ours"].append(me)
            got["ik"].append(max(ik))
            got["ratio"].append(me / max(ik))
            print(f"  round {r} {kind}: llm-smolq {me:,.1f} tok/s; ik_llama.cpp -rtr 0 {ik[0]:,.1f}, -rtr 1 {ik[1]:,.1f}; "
                  f"x{me / max(ik):.2f}", flush=True)
    for kind, p, n in kinds:
        got = seen[kind]
        what = f"prefill {p} tokens" if kind == "prefill" else f"decode {n} tokens after {p}"
        print(f"{what}: llm-smolq {spread_text(spread(got['ours']), ',.1f')} tok/s, "
              f"ik_llama.cpp {spread_text(spread(got['ik']), ',.1f')} (its better -rtr), "
              f"x{spread_text(spread(got['ratio']))}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llm_smolq.dev.ik_llama", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="export HEAD's tree from GIT_DIR into OUT_DIR and build llama-bench")
    b.add_argument("git_dir", type=Path)
    b.add_argument("out_dir", type=Path)
    b.add_argument("--avx2", action="store_true", help="build for AVX2 alone (no AVX-512), whatever this CPU has")
    r = commands.add_parser("bench", help="our prefill against llama-bench's (-rtr 0 and 1), by turns")
    r.add_argument("out_dir", type=Path)
    r.add_argument("model", type=Path)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--prompt", type=int, default=512)
    r.add_argument("--decode", type=int, default=0, metavar="N", help="also compare N decode steps")
    r.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "build":
        args.out_dir.mkdir(parents=True, exist_ok=True)
        written, missing = export_tree(args.git_dir, args.out_dir)
        print(f"{written} files written; {len(missing)} missing from the repository: {', '.join(missing) or '-'}")
        print(f"built {build(args.out_dir, args.avx2)}")
    else:
        if args.rounds < 1 or args.prompt < 1 or args.decode < 0 or args.threads < 1:
            parser.error("--rounds, --prompt and --threads must be at least 1, --decode at least 0")
        bench(args.out_dir, args.model, args.threads, args.prompt, args.decode, args.rounds)


if __name__ == "__main__":
    main()
