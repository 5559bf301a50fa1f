"""Fuzz the GGUF loader: seeded mutations of small valid models, each loaded and run in a
child process, so that a crash or a hang is caught and named by its case.

    python -m llm_smolq.dev.fuzz_gguf --cases 100000 --seed 1 [--jobs 2] [--fixture F.gguf ...]
    python -m llm_smolq.dev.fuzz_gguf --seed 1 --case 4711      # replay one case, in-process

A case is a pure function of (seed, case number, fixture list). The fixtures are small
synthetic models (llm_smolq.dev.synth) in several tensor types, plus any --fixture files.
Each case mutates one of them (llm_smolq.dev.gguf_mutations: header counts, string and
array lengths, value types, metadata values, tensor dimensions, types and offsets,
alignment, truncation at a region boundary, inserted or deleted bytes, flipped bytes,
corrupted weights, re-cut attention heads), loads the result, runs a forward pass and, if
the file gets that far, tokenizes.

A case passes when the file is refused with a GGUFError whose message says what is wrong,
or when it loads, every weight matrix the kernel will read lies inside the file by the
kernel's own block geometry, the forward pass gives finite logits (or a GGUFError), and
tokenizing gives ids (or a GGUFError). Anything else - another exception, a crash, a run
longer than --timeout - is a failure, reported with its seed and case number.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from llm_smolq.errors import GGUFError
from llm_smolq.dev.gguf_mutations import Layout, make_case, parse

DEFAULT_TARGET = "llm_smolq.dev.fuzz_gguf:exercise"
N_CTX = 16
MAX_MESSAGE = 1000  # characters, besides the file's path
WORKER_MEMORY = 8 << 30  # address space per worker process
LOADED = ("ran", "refused at eval", "tokenizer refused")  # the outcomes of a file that loads
TEXT = "Hello world 123 <|im_start|>user\nhé🙂\t  x<|im_end|>"

# ---------------------------------------------------------------------------------------
# Fixtures: small valid models of the shapes the engine supports
# ---------------------------------------------------------------------------------------

#: (name, architecture, layers, tensor type). dim 256 is the smallest width the K-quants
#: allow; four smollm3 layers include one that skips RoPE.
FIXTURES = (
    ("smollm3-Q8_0", "smollm3", 4, "Q8_0"),
    ("smollm3-Q4_K_M", "smollm3", 4, "Q4_K_M"),
    ("smollm3-IQ4_XS", "smollm3", 4, "IQ4_XS"),
    ("llama-Q5_1", "llama", 2, "Q5_1"),
    ("llama-F16", "llama", 2, "F16"),
)


def make_fixtures(directory: str | os.PathLike[str]) -> list[Path]:
    """Write the synthetic fixtures into `directory` (kept if already there)."""
    from llm_smolq.dev.synth import Preset, write_synthetic

    Path(directory).mkdir(parents=True, exist_ok=True)
    out = []
    for name, arch, layers, qtype in FIXTURES:
        path = Path(directory) / f"fixture-{name}.gguf"
        if not path.exists():
            preset = Preset(arch, 256, layers, 4, 2, 64, 256, 320, 64, 1e4 if arch == "llama" else 5e6, 1e-5)
            write_synthetic(path, preset, qtype, seed=7)
        out.append(path)
    return out


# ---------------------------------------------------------------------------------------
# One case: what the loader, the engine and the tokenizer must do with a file
# ---------------------------------------------------------------------------------------

class FuzzFailure(AssertionError):
    """A case that broke a rule without raising something else first."""


def check_message(err: GGUFError, path: str) -> None:
    """A GGUFError must say what is wrong, in a message a person can read."""
    text = str(err).replace(path, "").strip(" :")
    if not 12 <= len(text) <= MAX_MESSAGE:
        raise FuzzFailure(f"GGUFError message of {len(text)} characters: {str(err)[:MAX_MESSAGE]!r}")


def exercise(path: str) -> str:
    """Load, check what the kernel will read, run a forward pass, tokenize. Returns how far
    the file got; raises GGUFError if it was refused at load, anything else on a failure."""
    import numpy as np

    from llm_smolq.engine.engine import Engine
    from llm_smolq.model.model_file import open_model

    model = open_model(path)
    # As the plugin does: the context capped at the model's own.
    eng = Engine(model, n_ctx=min(N_CTX, model.config.context_length), threads=1)
    check_kernel_view(eng)
    vocab = model.config.vocab_size
    ids = [(7 * i + 1) % vocab for i in range(min(3, eng.n_ctx))]
    try:
        for batch in (ids, ids[:1]) if eng.n_ctx > len(ids) else (ids,):
            logits = eng.eval(batch)
            if logits.shape != (vocab,) or not np.isfinite(logits).all():
                raise FuzzFailure(f"eval gave {logits.shape} logits, finite: {np.isfinite(logits).all()}")
    except GGUFError as err:
        check_message(err, path)
        return "refused at eval"
    try:
        for special in (True, False):
            got = eng.tokenize(TEXT, special=special)
            if not all(isinstance(i, int) and 0 <= i < vocab for i in got):
                raise FuzzFailure(f"tokenize gave ids outside the vocabulary: {got}")
            eng.detokenize(got)
    except GGUFError as err:
        check_message(err, path)
        return "tokenizer refused"
    return "ran"


def check_kernel_view(eng: Any) -> None:
    """What C will be handed, checked on its own terms: each matrix has the rows and
    columns the forward pass reads and writes (norms are F32), and every byte the kernel
    reads of it, by the kernel's own block sizes, lies inside the file."""
    from llm_smolq._kernel import ffi, lib
    from llm_smolq.model.model_file import LAYER_TENSORS

    m, c = eng.c_model, eng.c_model.cfg
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

    def kernel_shape(gguf_shape: tuple[int, ...]) -> tuple[int, int]:  # [rows][cols], a norm one row
        return (gguf_shape[1], gguf_shape[0]) if len(gguf_shape) == 2 else (1, gguf_shape[0])

    shapes = {"token_embd": (c.vocab_size, c.dim), "output": (c.vocab_size, c.dim), "output_norm": (1, c.dim)}
    shapes |= {t.field: kernel_shape(t.shape(c.dim, q, kv, c.hidden_dim)) for t in LAYER_TENSORS}
    tensors = [(name, name, getattr(m, name)) for name in ("token_embd", "output_norm", "output")]
    for i in range(c.n_layers):
        tensors += [(f"layer {i} {t.field}", t.field, getattr(m.layers[i], t.field)) for t in LAYER_TENSORS]
    # where a matrix lies: in the file, or in the engine's packed copy (engine/packing.py)
    spans = {0: (int(ffi.cast("uintptr_t", eng.weights)), len(eng.model.data), "file"),
             1: (int(ffi.cast("uintptr_t", eng.packed_weights)), len(eng.model.packed_data), "packed copy")}
    for name, role, t in tensors:
        if (t.rows, t.cols) != shapes[role] or (role.endswith("norm") and t.type != lib.SQ_F32):
            raise FuzzFailure(f"{name}: {t.rows} x {t.cols} of type {t.type} reached the kernel, "
                              f"which reads {shapes[role][0]} x {shapes[role][1]}")
        elems, block = lib.sq_block_elems(t.type), lib.sq_block_bytes(t.type)
        if elems <= 0 or t.cols % elems or t.cols // elems * block > t.row_bytes:
            raise FuzzFailure(f"{name}: rows of {t.cols} values of type {t.type} in {t.row_bytes} bytes")
        if t.packed16 and (t.rows % 16 or not lib.sq_rows16_packs(t.type)):
            raise FuzzFailure(f"{name}: {t.rows} rows of type {t.type} reached the kernel as packed")
        base, size, what = spans[t.packed16]
        start = int(ffi.cast("uintptr_t", t.data)) - base
        end = start + (t.rows - 1) * t.row_bytes + t.cols // elems * block
        if start < 0 or end > size:
            raise FuzzFailure(f"{name}: the kernel would read bytes {start}..{end} of a {size}-byte {what}")


# ---------------------------------------------------------------------------------------
# Running cases: a worker process runs a range; the parent watches it for crashes and hangs
# ---------------------------------------------------------------------------------------

def _load_target(spec: str) -> Callable[[str], str]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def run_one(seed: int, index: int, fixtures: Sequence[Layout], path: str,
            target: Callable[[str], str] = exercise) -> tuple[str, str, str | None]:
    """Write case `index` to `path` and run it: (mutation, outcome, failure detail or None)."""
    data, name, what = make_case(seed, index, fixtures)
    with open(path, "wb") as f:
        f.write(data)
    try:
        outcome = target(path)
    except GGUFError as err:
        try:
            check_message(err, path)
        except FuzzFailure as bad:
            return name, "failure", f"{what}\n{bad}"
        return name, "rejected", None
    except Exception as err:
        detail = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:])
        return name, "failure", f"{what}\n{type(err).__name__}: {err}\n{detail}"
    return name, outcome, None


def _cap_memory() -> None:
    """A runaway allocation becomes a MemoryError (a failure) instead of a swapping machine:
    the address space is capped where the system has RLIMIT_AS (not on Windows, where
    there is no resource module; macOS may refuse the cap)."""
    try:
        import resource
    except ImportError:
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, hard))
    except (AttributeError, OSError, ValueError):
        pass


def _worker(args: argparse.Namespace) -> int:
    import faulthandler

    faulthandler.enable()  # a crash prints the Python stack to stderr, which the parent keeps
    _cap_memory()
    report = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the report stream
    fixtures = [parse(Path(p).read_bytes()) for p in args.fixture]
    target = _load_target(args.target)
    report.write("ready\n")
    for index in range(args.start, args.stop):
        report.write(f"start {index}\n")
        name, outcome, detail = run_one(args.seed, index, fixtures, args.case_file, target)
        if detail is not None and args.save_failures:
            _save(args.case_file, args.save_failures, args.seed, index)
        report.write(json.dumps({"case": index, "mutation": name, "outcome": outcome, "detail": detail}) + "\n")
    return 0


def _save(case_file: str | os.PathLike[str], directory: str | os.PathLike[str], seed: int, index: int) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)
    shutil.copy(case_file, Path(directory) / f"seed{seed}-case{index}.gguf")


@dataclass
class Report:
    seed: int
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_mutation: dict[str, Counter] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, case: int, mutation: str, outcome: str, detail: str | None = None) -> None:
        self.cases += 1
        self.outcomes[outcome] += 1
        self.by_mutation.setdefault(mutation, Counter())[outcome] += 1
        if detail is not None:
            self.failures.append({"case": case, "mutation": mutation, "kind": outcome, "detail": detail})

    @property
    def loaded(self) -> int:
        return sum(self.outcomes[k] for k in LOADED)

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "cases": self.cases, "seconds": round(self.seconds, 1), "loaded": self.loaded,
                "outcomes": dict(self.outcomes), "by_mutation": {k: dict(v) for k, v in self.by_mutation.items()},
                "failures": self.failures}

    def summary(self) -> str:
        lines = [f"seed {self.seed}: {self.cases} cases in {self.seconds:.1f} s "
                 f"({self.cases / max(self.seconds, 1e-9):.0f}/s); loaded {self.loaded}, "
                 f"rejected {self.outcomes['rejected']}, failures {len(self.failures)}",
                 "  outcomes: " + ", ".join(f"{k} {n}" for k, n in self.outcomes.most_common())]
        for name in sorted(self.by_mutation):
            counts = self.by_mutation[name]
            lines.append(f"  {name:10s} " + ", ".join(f"{k} {n}" for k, n in counts.most_common()))
        for f in self.failures[:20]:
            lines.append(f"FAILURE case {f['case']} ({f['kind']}, {f['mutation']}); replay with "
                         f"--seed {self.seed} --case {f['case']}:\n    " + f["detail"].replace("\n", "\n    "))
        return "\n".join(lines)


class _Job:
    """A worker process running cases [start, stop), and what the parent knows of it."""

    def __init__(self, cmd: list[str], start: int, stop: int, work: Path, number: int, timeout: float):
        self.stop = stop
        self.current: int | None = None  # the case it started and has not reported
        self.case_file = work / f"case-{number}.gguf"
        self.log_path = work / f"worker-{number}.log"
        self.log = open(self.log_path, "wb")
        # The workers import this same package, wherever the parent found it. Every case
        # is a new file, so the header cache would only collect entries: it is off.
        env = dict(os.environ, SMOLQ_CACHE_DIR="off", PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            cmd + ["--start", str(start), "--stop", str(stop), "--case-file", str(self.case_file)],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        self.buffer = b""
        self.deadline = time.monotonic() + timeout + 120  # imports and fixture parsing come first

    def stderr_tail(self) -> str:
        self.log.flush()
        return self.log_path.read_bytes()[-3000:].decode("utf-8", "replace").strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


def _check_platform() -> None:
    """The run watches its workers' pipes with select(), which Windows offers for sockets
    only."""
    if sys.platform == "win32":
        raise RuntimeError("a fuzz run is not available on Windows: it watches its worker processes' pipes "
                           "with select(), which Windows offers for sockets only. Run it on Linux or macOS "
                           "(WSL works), or replay one case in this process with --case N")


def _died_of(rc: int) -> str:
    if rc >= 0:
        return f"exit status {rc}"
    try:
        return f"signal {signal.Signals(-rc).name}"
    except ValueError:
        return f"signal {-rc}"


def _fast_tmp() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def run(seed: int, cases: int, fixture_paths: Sequence[str | os.PathLike[str]], *, start: int = 0,
        jobs: int = 1, timeout: float = 20.0, workdir: str | os.PathLike[str] | None = None,
        target: str = DEFAULT_TARGET, progress: Callable[[str], None] | None = None,
        save_failures: str | os.PathLike[str] | None = None) -> Report:
    """Run cases [start, start + cases) in `jobs` worker processes and report what happened.
    A worker that dies, or takes longer than `timeout` seconds on a case, is recorded as a
    crash or a hang of that case, and a new worker carries on after it."""
    _check_platform()
    work = Path(workdir or tempfile.mkdtemp(prefix="gguf-fuzz-", dir=_fast_tmp()))
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "llm_smolq.dev.fuzz_gguf", "--worker", "--seed", str(seed), "--target", target]
    for p in fixture_paths:
        cmd += ["--fixture", os.fspath(p)]
    if save_failures is not None:
        cmd += ["--save-failures", os.fspath(save_failures)]
    fixtures = [parse(Path(p).read_bytes()) for p in fixture_paths]
    report = Report(seed)
    began = last_note = time.monotonic()
    cuts = [start + cases * j // jobs for j in range(jobs + 1)]
    pending = [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if lo < hi]
    running: list[_Job] = []
    spawned = 0

    def lost(job: _Job, kind: str, detail: str) -> None:
        """The worker died or hung in its current case: record it, go on after it."""
        index = job.current
        _, name, what = make_case(seed, index, fixtures)
        report.add(index, name, kind, f"{what}\n{detail}")
        if save_failures is not None:
            _save(job.case_file, save_failures, seed, index)
        if index + 1 < job.stop:
            pending.append((index + 1, job.stop))

    try:
        while pending or running:
            while pending:
                spawned += 1
                running.append(_Job(cmd, *pending.pop(), work, spawned, timeout))
            wait = max(0.0, min(j.deadline for j in running) - time.monotonic())
            ready, _, _ = select.select([j.proc.stdout for j in running], [], [], wait)
            for job in list(running):
                if job.proc.stdout in ready:
                    chunk = os.read(job.proc.stdout.fileno(), 1 << 16)
                    if not chunk:  # the worker has exited
                        rc = job.proc.wait()
                        if job.current is not None:
                            lost(job, "crash", f"the worker died ({_died_of(rc)}); its stderr ends:\n"
                                               f"{job.stderr_tail()}")
                        elif rc != 0:
                            raise RuntimeError(f"a fuzz worker failed outside any case:\n{job.stderr_tail()}")
                        running.remove(job)
                        job.close()
                        continue
                    job.buffer += chunk
                    *lines, job.buffer = job.buffer.split(b"\n")
                    for line in lines:
                        if line.startswith(b"start "):
                            job.current = int(line[6:])
                        elif line.startswith(b"{"):
                            rec = json.loads(line)
                            report.add(rec["case"], rec["mutation"], rec["outcome"], rec["detail"])
                            job.current = None
                    job.deadline = time.monotonic() + timeout
                elif time.monotonic() > job.deadline:
                    running.remove(job)
                    job.close()
                    if job.current is None:
                        raise RuntimeError(f"a fuzz worker did not start in time:\n{job.stderr_tail()}")
                    lost(job, "hang", f"no result after {timeout:g} s; the worker was killed")
            if progress and time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                progress(f"{report.cases}/{cases} cases, {report.loaded} loaded, "
                         f"{len(report.failures)} failures, {last_note - began:.0f} s")
    finally:
        for job in running:
            job.close()
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    report.seconds = time.monotonic() - began
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llm_smolq.dev.fuzz_gguf", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--case", type=int, help="replay this one case in this process and show what it did")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds a case may take before it is a hang")
    ap.add_argument("--fixture", action="append", default=[], help="another valid GGUF to mutate (repeatable)")
    ap.add_argument("--workdir", help="keep fixtures and case files here (default: a temporary directory)")
    ap.add_argument("--save-failures", metavar="DIR", help="copy the file of every failing case into DIR")
    ap.add_argument("--json", metavar="FILE", help="also write the whole report, every failure included, as JSON")
    ap.add_argument("--target", default=DEFAULT_TARGET, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--case-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.case is None:
        try:
            _check_platform()
        except RuntimeError as exc:
            ap.error(str(exc))

    scratch = args.workdir or tempfile.mkdtemp(prefix="gguf-fuzz-", dir=_fast_tmp())
    try:
        fixtures = [str(p) for p in make_fixtures(scratch)] + [os.path.abspath(f) for f in args.fixture]
        if args.case is not None:
            layouts = [parse(Path(p).read_bytes()) for p in fixtures]
            path = os.path.join(scratch, f"case-{args.case}.gguf")
            name, outcome, detail = run_one(args.seed, args.case, layouts, path, _load_target(args.target))
            print(f"case {args.case} ({name}): {make_case(args.seed, args.case, layouts)[2]}\n-> {outcome}")
            if detail:
                print(detail)
                if args.save_failures:
                    _save(path, args.save_failures, args.seed, args.case)
            return 1 if detail else 0
        report = run(args.seed, args.cases, fixtures, start=args.start, jobs=args.jobs, timeout=args.timeout,
                     workdir=os.path.join(scratch, "cases"), target=args.target, save_failures=args.save_failures,
                     progress=lambda note: print(note, file=sys.stderr, flush=True))
    finally:
        if not args.workdir:
            shutil.rmtree(scratch, ignore_errors=True)
    print(report.summary())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.as_dict(), f, indent=1)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
