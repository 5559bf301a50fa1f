"""Benchmark: prefill and decode speed, load time and peak memory on one GGUF file.

    python -m llm_smolq.dev.bench MODEL.gguf [--threads N] [--prefill 256] [--decode 128]
                                  [--repeat 5] [--json | --markdown] [--vs-llama-cpp] [--schema]
                                  [--depth N] [--kv-cache f16|q8_0|f32] [--bandwidth]
                                  [--with-depth N] [--with-lookup [N]]
    python -m llm_smolq.dev.bench MODEL.gguf --follow-up 1000 [--threads N] [--repeat 5] [--json]
    python -m llm_smolq.dev.bench MODEL.gguf --lookup [8] [--threads N] [--repeat 5] [--json | --markdown]
    python -m llm_smolq.dev.bench MODEL.gguf --draft-check [512] [--threads N] [--repeat 5] [--json]
    python -m llm_smolq.dev.bench MODEL.gguf --kernels [1,2,4,8,9] [--repeat 5] [--json]
    python -m llm_smolq.dev.bench MODEL.gguf --kernels 1,8 --against OTHER/_kernel.abi3.so

With --depth N the prompt is N random ids fed in batches of 512 (prefill tok/s is their
average), and decode is timed at that depth; --vs-llama-cpp then runs llama.cpp twice,
with its default settings and with flash attention, and the ratios take the faster of
the two as the anchor. Each engine uses its default KV cache type unless --kv-cache says.

Every measurement runs in a fresh child process, so load time and peak RSS are those of
a cold start, and with --vs-llama-cpp the two engines alternate (A B A B ...) so that
machine noise falls on both alike. Figures are medians over repeats, with min-max.
Decode is memory-bound: the report sets the weight bytes read per token x decode tok/s
beside this machine's measured read bandwidth. With --schema, each llm-smolq run also
times what a JSON-schema constraint adds per generated token (mask + matcher update).
With --bandwidth, each llm-smolq run also times its own threads reading every page of the
model file (Engine.weight_read_seconds, best of three), right after its decode, and gives
decode's weight bytes per second as a share of that rate: how close decode is to the wall.

--with-depth N adds the --depth N runs (same engines, same --repeat) to the speed runs, and
--with-lookup [N] the --lookup comparison, so that one command measures every row of a
BENCHMARKS.md table; --markdown prints the result as that table, with a line naming the
machine, the date and the commit (dev/bench_markdown.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from llm_smolq.dev import bench_markdown
from llm_smolq.dev.spread import spread, spread_text

ENGINES = ("llm-smolq", "llama.cpp", "llama.cpp-fa")  # -fa: llama.cpp with flash attention
_LLAMA_KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}  # ggml's type numbers


def _peak_rss_mb() -> float | None:
    """The process's peak resident memory in MiB: VmHWM on Linux, else getrusage's
    ru_maxrss (bytes on macOS, KiB elsewhere); None on Windows, which has no getrusage
    (the report then leaves the figure out)."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def _token_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def _load(engine: str, path: str, threads: int, n_ctx: int, kv_cache: str | None = None):
    """Returns (eval function taking a list of ids, vocabulary size, the Engine or None)."""
    if engine == "llm-smolq":
        import llm_smolq

        eng = llm_smolq.load(path, n_ctx=n_ctx, threads=threads, **({"kv_dtype": kv_cache} if kv_cache else {}))
        return eng.eval, eng.config.vocab_size, eng
    from llama_cpp import Llama

    kv = {"type_k": _LLAMA_KV_TYPES[kv_cache], "type_v": _LLAMA_KV_TYPES[kv_cache]} if kv_cache else {}
    model = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                  flash_attn=engine == "llama.cpp-fa", verbose=False, **kv)
    return model.eval, model.n_vocab(), None


CONSTRAINED_SCHEMA = {
    "type": "array",
    "items": {"type": "object", "properties": {"animal": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["animal", "legs"]},
}
CONSTRAINED_TEXT = '[{"animal": "Lion", "legs": 4}, {"animal": "Snake \\"Kaa\\"", "legs": 0}, {"animal": "Ostrich", "legs": 2}]'


def constraint_ms_per_token(engine) -> float:
    """Median time to mask the logits and advance the matcher, over the tokens of a JSON
    answer to CONSTRAINED_SCHEMA (compiling the schema and indexing the vocabulary, once
    per model, are not counted)."""
    import numpy as np

    from llm_smolq.decode.constrained import Constraint

    logits = np.zeros(engine.config.vocab_size, np.float32)
    Constraint.for_json_schema(engine.tokenizer, CONSTRAINED_SCHEMA)  # the one-off vocabulary index
    constraint = Constraint.for_json_schema(engine.tokenizer, CONSTRAINED_SCHEMA)
    costs = []
    for token in engine.tokenize(CONSTRAINED_TEXT):
        t = time.perf_counter()
        constraint.mask(logits)
        constraint.consume(token)
        costs.append(time.perf_counter() - t)
    return statistics.median(costs) * 1e3


def warm_prefill_tok_s(eng, ids: list[int], step: int, passes: int = 5) -> float:
    """A prefill of ids (in calls of `step`) timed as llama-bench times one, and so as the
    ik_llama.cpp comparison is made: each pass from an empty cache, one to warm up, then the
    mean of `passes` passes' rates."""
    def once() -> float:
        eng.reset()
        t = time.perf_counter()
        for start in range(0, len(ids), step):
            eng.eval(ids[start:start + step])
        return len(ids) / (time.perf_counter() - t)

    once()
    return statistics.mean(once() for _ in range(passes))


def _steps_seconds(evaluate, tokens: list[int]) -> float:
    """The seconds that one-token steps through `tokens`, one after another, take."""
    t = time.perf_counter()
    for token in tokens:
        evaluate([token])
    return time.perf_counter() - t


def run(engine: str, path: str, threads: int, n_prefill: int, n_decode: int, schema: bool = False,
        batch: int | None = None, kv_cache: str | None = None, bandwidth: bool = False, warm: bool = False) -> dict:
    """One cold run: load, prefill n_prefill random ids (in calls of `batch` ids, else
    one), decode n_decode more one by one; with warm (ours alone), the prefill again as
    llama-bench times it (warm_prefill_tok_s), and the decode again after the last of its
    passes, as llama-bench times steps after its warm-up run."""
    started = time.perf_counter()
    evaluate, vocab, eng = _load(engine, path, threads, n_prefill + n_decode + 8, kv_cache)
    load_s = time.perf_counter() - started
    ids = _token_ids(vocab, n_prefill + n_decode)
    t = time.perf_counter()
    step = batch or n_prefill
    for start in range(0, n_prefill, step):
        evaluate(ids[start:min(start + step, n_prefill)])
    prefill_s = time.perf_counter() - t
    decode_s = _steps_seconds(evaluate, ids[n_prefill:])
    result = {
        "load_s": load_s,
        "prefill_tok_s": n_prefill / prefill_s,
        "decode_tok_s": n_decode / decode_s,
    }
    peak = _peak_rss_mb()
    if peak is not None:
        result["peak_rss_mb"] = peak
    if bandwidth and eng is not None:
        result["file_read_gb_s"] = len(eng.model.data) / eng.weight_read_seconds() / 1e9
        decode_gb_s = weight_bytes_per_token(path) * result["decode_tok_s"] / 1e9
        result["decode_pct_of_read"] = 100 * decode_gb_s / result["file_read_gb_s"]
    if warm and eng is not None:
        result["warm_prefill_tok_s"] = warm_prefill_tok_s(eng, ids[:n_prefill], step)  # leaves the prompt cached
        if n_decode:
            result["warm_decode_tok_s"] = n_decode / _steps_seconds(eng.eval, ids[n_prefill:])
    if schema and eng is not None:
        ms = constraint_ms_per_token(eng)
        result["schema_ms_per_token"] = ms
        result["schema_pct_of_decode"] = 100 * ms / 1e3 * (n_decode / decode_s)
    return result


def _child(engine: str, args) -> dict:
    cmd = [sys.executable, "-m", "llm_smolq.dev.bench", args.model, "--child", engine, "--threads", str(args.threads),
           "--prefill", str(args.prefill), "--decode", str(args.decode)] + (["--schema"] if args.schema else []) + (
           ["--depth", str(args.depth)] if args.depth else []) + (["--kv-cache", args.kv_cache] if args.kv_cache else []) + (
           ["--bandwidth"] if args.bandwidth and engine == "llm-smolq" else []) + (
           ["--warm"] if args.warm and engine == "llm-smolq" else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{engine} run failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def weight_bytes_per_token(path: str) -> int:
    """Bytes of weights one decode step reads: every mat-vec matrix once (with tied
    embeddings the output projection reads all of token_embd; the lookup, one row)."""
    from llm_smolq.model.model_file import open_model

    model = open_model(path)
    skip = set() if model.config.tied_embeddings else {"token_embd.weight"}
    return sum(t.n_bytes for name, t in model.tensors.items() if name not in skip)


def read_bandwidth_gb_s(threads: int, size_mb: int = 256, passes: int = 8) -> float:
    """Best of `passes`: `threads` numpy threads each summing its share of an array well
    past any last-level cache these CPUs have (96 MB on a Zen 4 with stacked cache). A
    larger array costs seconds of page faults on some virtual machines for the same figure."""
    import numpy as np

    data = np.ones(size_mb * (1 << 20) // 8, dtype=np.float64)
    parts = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(passes):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t)
    return data.nbytes / best / 1e9


def summarize(runs: list[dict]) -> dict:
    return {key: spread([r[key] for r in runs]) for key in runs[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llm_smolq.dev.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="path to a GGUF file")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--prefill", type=int, default=256, help="prompt tokens (default 256)")
    parser.add_argument("--decode", type=int, default=128, help="generated tokens (default 128)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--markdown", action="store_true",
                        help="print the result as a Markdown table with the machine, date and commit, as "
                             "BENCHMARKS.md gives it (the speed runs and --lookup)")
    parser.add_argument("--vs-llama-cpp", action="store_true", help="also run llama-cpp-python, interleaved")
    parser.add_argument("--schema", action="store_true", help="also time a JSON-schema constraint per token")
    parser.add_argument("--warm", action="store_true",
                        help="also time our prefill as llama-bench does (a warm-up pass, then the mean of 5), "
                             "and the decode again after it, to set beside ik_llama.cpp's llama-bench")
    parser.add_argument("--follow-up", type=int, metavar="TOKENS",
                        help="instead: time to first token of a TOKENS-long conversation's follow-up in a new "
                             "process, with the prompt cache and cold")
    parser.add_argument("--depth", type=int, metavar="N",
                        help="prefill N ids in batches of 512 and time decode at that depth (replaces --prefill)")
    parser.add_argument("--kv-cache", choices=tuple(_LLAMA_KV_TYPES),
                        help="KV cache type for every engine (default: each engine's own default)")
    parser.add_argument("--lookup", type=int, nargs="?", const=8, metavar="N",
                        help="instead: greedy answers with lookup decoding (up to N drafted tokens, default 8) "
                             "against plain decoding, on prompts that copy and one that does not")
    parser.add_argument("--draft-check", type=int, nargs="?", const=512, metavar="DEPTH",
                        help="instead: what one forward of 1, 2, 4, 8, 9 and 16 tokens costs at DEPTH "
                             "(default 512), as multiples of one decode step")
    parser.add_argument("--kernels", nargs="?", const="1,2,4,8,9", metavar="K,K,...",
                        help="instead: one thread's GB/s in each quantized type's largest matrix times K tokens, "
                             "from the file's layout and packed (dev/kernel_bench.py)")
    parser.add_argument("--against", metavar="KERNEL",
                        help="with --kernels: time this kernel build and another (a _kernel*.so path) call by call "
                             "in one process, and print their ratio")
    parser.add_argument("--bandwidth", action="store_true",
                        help="also time llm-smolq's threads reading the model file, and decode as a share of it")
    parser.add_argument("--with-depth", type=int, metavar="N",
                        help="with the speed runs: also the --depth N runs, reported beside them")
    parser.add_argument("--with-lookup", type=int, nargs="?", const=8, metavar="N",
                        help="with the speed runs: also the --lookup N comparison (default 8), reported beside them")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.depth:
        args.prefill = args.depth
    modes = {"--follow-up": bool(args.follow_up), "--lookup": bool(args.lookup),
             "--draft-check": args.draft_check is not None, "--kernels": bool(args.kernels)}
    other_mode = next((mode for mode, given in modes.items() if given), None)
    if args.markdown and args.json:
        parser.error("--markdown and --json: one output format at a time")
    if args.markdown and other_mode not in (None, "--lookup"):
        parser.error(f"--markdown prints the speed runs and --lookup, not {other_mode}")
    if args.against and other_mode != "--kernels":
        parser.error("--against goes with --kernels")
    if (args.with_depth or args.with_lookup) and (other_mode or args.depth):
        parser.error("--with-depth and --with-lookup go with the speed runs, not with --depth or another mode")

    if args.follow_up:
        from llm_smolq.dev import follow_up_bench

        report = follow_up_bench.measure(args.model, args.threads, args.follow_up, args.repeat)
        print(json.dumps(report, indent=2) if args.json else follow_up_bench.format_report(report))
        return

    if args.lookup:
        from llm_smolq.dev import lookup_bench

        report = lookup_bench.measure(args.model, args.threads, args.lookup, args.repeat)
        print(json.dumps(report, indent=2) if args.json else
              bench_markdown.format_markdown(report) if args.markdown else lookup_bench.format_report(report))
        return

    if args.draft_check is not None:
        from llm_smolq.dev import lookup_bench

        report = lookup_bench.measure_check_cost(args.model, args.threads, args.draft_check, args.repeat)
        print(json.dumps(report, indent=2) if args.json else lookup_bench.format_check_cost(report))
        return

    if args.kernels:
        from llm_smolq.dev import kernel_bench

        try:
            tokens = [int(k) for k in args.kernels.split(",")]
        except ValueError:
            parser.error(f"--kernels takes token counts separated by commas, such as 1,2,9; not {args.kernels!r}")
        if not tokens or min(tokens) < 1:
            parser.error("--kernels: every token count must be 1 or more")
        if args.against:
            try:
                report = kernel_bench.measure_against(args.model, tokens, args.repeat, args.against)
            except FileNotFoundError as e:
                parser.error(f"--against: {e}")
            print(json.dumps(report, indent=2) if args.json else kernel_bench.format_against(report))
            return
        report = kernel_bench.measure(args.model, tokens, args.repeat)
        print(json.dumps(report, indent=2) if args.json else kernel_bench.format_report(report))
        return

    if args.child:
        print(json.dumps(run(args.child, args.model, args.threads, args.prefill, args.decode, args.schema,
                             512 if args.depth else None, args.kv_cache, args.bandwidth, args.warm)))
        return
    if args.vs_llama_cpp:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            parser.error("--vs-llama-cpp needs llama-cpp-python: pip install -e '.[bench]'")

    report = measure(args)
    if args.with_depth:
        report["at_depth"] = measure(argparse.Namespace(**{**vars(args), "depth": args.with_depth,
                                                           "prefill": args.with_depth}))
    if args.with_lookup:
        from llm_smolq.dev import lookup_bench

        report["lookup"] = lookup_bench.measure(args.model, args.threads, args.with_lookup, args.repeat)
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.markdown:
        print(bench_markdown.format_markdown(report))
    else:
        print(format_report(report))


def measure(args) -> dict:
    """The speed runs: each engine's cold runs, alternating, --repeat rounds, summarized."""
    engines = (ENGINES if args.depth else ENGINES[:2]) if args.vs_llama_cpp else ENGINES[:1]
    if args.kv_cache == "q8_0" and "llama.cpp-fa" in engines:
        # llama.cpp makes no context with a quantized V cache unless flash attention is on
        engines = tuple(e for e in engines if e != "llama.cpp")
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for _ in range(args.repeat):
        for engine in engines:
            runs[engine].append(_child(engine, args))
    report = {
        "model": args.model,
        "threads": args.threads,
        "simd": bench_markdown.simd_path(),  # the children's too: they inherit SMOLQ_SIMD
        "prefill_tokens": args.prefill,
        "depth": args.depth,
        "kv_cache": args.kv_cache,
        "decode_tokens": args.decode,
        "repeat": args.repeat,
        "weight_bytes_per_token": weight_bytes_per_token(args.model),
        "machine_read_gb_s": read_bandwidth_gb_s(args.threads),
        "engines": {e: summarize(r) for e, r in runs.items()},
    }
    for stats in report["engines"].values():
        stats["decode_gb_s"] = report["weight_bytes_per_token"] * stats["decode_tok_s"]["median"] / 1e9
    if args.vs_llama_cpp:
        report["ratios"] = ratios(runs)
    return report


def ratios(runs: dict[str, list[dict]]) -> dict:
    """llm-smolq / llama.cpp per run, side by side; where llama.cpp ran both ways, against
    whichever of its two settings was faster (or used less memory) in that round."""
    better = {"prefill_tok_s": max, "decode_tok_s": max, "load_s": min, "peak_rss_mb": min}
    theirs = [e for e in ENGINES[1:] if e in runs]
    out = {}
    for key, pick in better.items():
        if any(key not in r for rs in runs.values() for r in rs):
            continue  # a figure this system does not give (peak RSS on Windows)
        anchor = [pick(runs[e][i][key] for e in theirs) for i in range(len(runs["llm-smolq"]))]
        out[key] = summarize([{key: a[key] / b} for a, b in zip(runs["llm-smolq"], anchor)])[key]
        if len(theirs) > 1:
            for e in theirs:
                out[f"{key} vs {e}"] = summarize([{key: a[key] / b[key]} for a, b in zip(runs["llm-smolq"], runs[e])])[key]
    return out


def format_report(r: dict) -> str:
    at = f"depth {r['depth']} (batches of 512)" if r.get("depth") else f"prefill {r['prefill_tokens']}"
    kv = f", KV cache {r['kv_cache']}" if r.get("kv_cache") else ""
    lines = [
        f"{r['model']}: {r['threads']} threads, {r['simd']} kernels, {at}, decode {r['decode_tokens']}{kv}, "
        f"median of {r['repeat']} (min-max)",
        f"weights read per token: {r['weight_bytes_per_token'] / 1e6:.1f} MB; "
        f"machine read bandwidth: {r['machine_read_gb_s']:.1f} GB/s",
    ]
    fmt = {"prefill_tok_s": "prefill tok/s", "warm_prefill_tok_s": "warm prefill tok/s (llama-bench's way)",
           "decode_tok_s": "decode tok/s", "warm_decode_tok_s": "warm decode tok/s", "load_s": "load s",
           "peak_rss_mb": "peak RSS MB", "schema_ms_per_token": "schema constraint ms/token",
           "schema_pct_of_decode": "constraint % of a decode step",
           "file_read_gb_s": "its threads read the file at GB/s", "decode_pct_of_read": "decode % of that"}
    for engine, stats in r["engines"].items():
        parts = [f"{label} {spread_text(stats[k])}"
                 for k, label in fmt.items() if k in stats]
        lines.append(f"  {engine:10s} " + ", ".join(parts) + f", decode bandwidth {stats['decode_gb_s']:.1f} GB/s")
    if "ratios" in r:
        def label(key: str) -> str:
            base, _, versus = key.partition(" vs ")
            return fmt[base] + (f" vs {versus}" if versus else "")

        parts = [f"{label(k)} x{spread_text(v)}" for k, v in r["ratios"].items()]
        anchor = "the faster llama.cpp of each round" if len(r["engines"]) > 2 else "llama.cpp"
        lines.append(f"  llm-smolq / {anchor}: " + ", ".join(parts))
    if "at_depth" in r:
        lines.append(format_report(r["at_depth"]))
    if "lookup" in r:
        from llm_smolq.dev import lookup_bench

        lines.append(lookup_bench.format_report(r["lookup"]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
