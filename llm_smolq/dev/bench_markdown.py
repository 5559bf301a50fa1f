"""The bench's result as a Markdown table, the layout BENCHMARKS.md uses:

    python -m llm_smolq.dev.bench MODEL.gguf --threads 2 --prefill 128 --decode 64 --repeat 3 \\
        --vs-llama-cpp --bandwidth --with-depth 8000 --with-lookup --markdown

A heading names the file; a line names the machine: the CPU (/proc/cpuinfo's model name,
family and model), its logical CPUs, the SIMD kernels llm_smolq._kernel runs, the bench's own
memory read rate, then the thread count, the date and the commit (`git rev-parse --short
HEAD`, when the package runs from a git checkout; "with local changes" when the code differs
from it). Rows: prefill, decode, decode's share of the rate our threads read the file at
(--bandwidth), prefill and decode at depth (--depth or --with-depth), load time, peak RSS,
lookup decoding against plain decoding (--lookup or --with-lookup). Columns: llm-smolq, and
with --vs-llama-cpp llama.cpp and the ratio. A figure is the median over the runs; a ratio is
the median of the rounds' ratios (each round runs both engines), with their min-max.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import date
from pathlib import Path

OURS = "llm-smolq"
THEIRS = ("llama.cpp", "llama.cpp-fa")


def cpu_name() -> str:
    """The first processor's model name, with its family and model where /proc/cpuinfo gives
    them (Linux); on macOS the brand sysctl names; elsewhere what the platform module says."""
    fields: dict[str, str] = {}
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    key, sep, value = line.partition(":")
                    if not sep:
                        if fields:
                            break  # a blank line ends the first processor's block
                        continue
                    fields.setdefault(key.strip(), value.strip())
        except OSError:
            pass
    elif sys.platform == "darwin":
        fields["model name"] = _sysctl("machdep.cpu.brand_string")  # "Apple M2", "Intel(R) Core(TM) i7-..."
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def _sysctl(name: str) -> str:
    """A macOS sysctl value as text, "" when there is none."""
    try:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def simd_path() -> str:
    from llm_smolq._kernel import ffi, lib

    return ffi.string(lib.sq_simd_name()).decode()


def git_commit() -> str | None:
    """HEAD's short hash when this package runs from its own git checkout, else None."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root:
        return None  # installed, or inside some other repository
    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no", "--", "native", "llm_smolq", "cffi_build",
                      "setup.py", "pyproject.toml"):
        commit += " with local changes"
    return commit


def machine_line(threads: int, read_gb_s: float | None = None) -> str:
    cpu = f"{cpu_name()}, {os.cpu_count()} logical CPUs, {simd_path()} kernels"
    if read_gb_s:
        cpu += f", memory read rate {read_gb_s:.1f} GB/s"
    commit = git_commit()
    return (f"Machine: {cpu}; {threads} threads; {date.today().isoformat()}; "
            + (f"commit {commit}." if commit else "not run from a git checkout."))


def number(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def ratio(v: dict) -> str:
    text = f"x{v['median']:.2f}"
    return text if v["min"] == v["max"] else text + f" ({v['min']:.2f}-{v['max']:.2f})"


def _speed_rows(r: dict, with_load: bool) -> list[list[str]]:
    """Rows of one bench report (the short run, or the run at depth)."""
    engines = r["engines"]
    ours = engines[OURS]
    theirs = [e for e in THEIRS if e in engines]
    ratios = r.get("ratios", {})

    def row(label: str, key: str) -> list[str]:
        other = " / ".join(("fa " if e.endswith("-fa") else "") + number(engines[e][key]["median"]) for e in theirs)
        return [label, number(ours[key]["median"]), other, ratio(ratios[key]) if key in ratios else ""]

    depth = r.get("depth")
    at = f" at depth {depth:,}" if depth else ""
    if depth:
        rows = [row(f"prefill to depth {depth:,} (batches of 512), tok/s", "prefill_tok_s"),
                row(f"decode at depth {depth:,}, {r['decode_tokens']} tokens, tok/s", "decode_tok_s")]
    else:
        rows = [row(f"prefill, {r['prefill_tokens']} tokens, tok/s", "prefill_tok_s"),
                row(f"decode, {r['decode_tokens']} tokens, tok/s", "decode_tok_s")]
    if "file_read_gb_s" in ours:
        read = ours["file_read_gb_s"]["median"]
        rows.append([f"decode{at}: weights read per second, share of our threads' file read rate",
                     f"{ours['decode_pct_of_read']['median']:.0f}% of {read:.1f} GB/s",
                     " / ".join(f"{100 * engines[e]['decode_gb_s'] / read:.0f}%" for e in theirs), ""])
    if with_load:
        rows.append(row("load, s", "load_s"))
    if "peak_rss_mb" in ours:  # not measured on Windows
        rows.append(row(f"peak RSS{at}, MB", "peak_rss_mb"))
    return rows


def _lookup_rows(r: dict) -> list[list[str]]:
    rows = []
    for name, p in r["prompts"].items():
        ours = ratio(p["ratio"]) + ("" if p["same_output"] else ", ANSWERS DIFFER")
        rows.append([f"lookup decoding, {name} ({p['answer_tokens']} tokens): speed vs plain decoding", ours,
                     "not measured", ""])
    return rows


def format_markdown(r: dict) -> str:
    """A report of the speed runs (with any "at_depth" and "lookup" parts), or of --lookup alone."""
    lookup = r if "prompts" in r else r.get("lookup")
    speed = None if "prompts" in r else r
    deep = speed.get("at_depth") if speed else None
    rows: list[list[str]] = []
    notes = []
    if speed:
        rows += _speed_rows(speed, with_load=True)
        notes.append(f"Figures are medians of {speed['repeat']} runs, each engine in a fresh process"
                     + (", the engines alternating; a ratio is the median of the rounds' ratios (min-max)."
                        if "ratios" in speed else "."))
    if deep:
        rows += _speed_rows(deep, with_load=False)
    if any("llama.cpp-fa" in part["engines"] for part in (speed, deep) if part):
        notes.append("At depth llama.cpp ran with its defaults and with flash attention (fa); "
                     "the ratio is against the faster of the two in each round.")
    if lookup:
        rows += _lookup_rows(lookup)
        notes.append(f"Lookup decoding: greedy answers with up to {lookup['lookup']} drafted tokens against plain "
                     f"decoding, {lookup['repeat']} rounds alternating in one process.")
    vs = any(part and "ratios" in part for part in (speed, deep))
    header = ["", OURS] + (["llama.cpp", f"{OURS} / llama.cpp"] if vs else [])
    width = len(header)
    model = r["model"]
    size = os.path.getsize(model)
    size_text = f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"
    read = speed["machine_read_gb_s"] if speed else None
    lines = [f"### {Path(model).name} ({size_text})", "", machine_line(r["threads"], read), " ".join(notes), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(cells[:width]) + " |" for cells in rows]
    return "\n".join(lines)
