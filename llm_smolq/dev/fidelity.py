"""How far the engine's logits are from llama.cpp's, beside how far llama.cpp's own two
builds are from each other, on the reference files (tests/data/reference):

    python -m llm_smolq.dev.fidelity .models/reference --smollm2 .models/SmolLM2-135M-Instruct.Q4_1.gguf
    python -m llm_smolq.dev.fidelity .models/reference --types Q4_K_M,Q6_K

REFERENCE holds the reference logits and the tiny GGUFs beside them (the tests rebuild the
missing GGUFs into .models/reference/ on their first run). For each tiny file, the per-row
relative error (L2) of ours against llama.cpp's AVX2 build and its AVX-512 build, each
teacher-forced on that build's greedy continuation, and of the two builds against each other
(the steps where their continuations agree), as median / worst row; then the 3,000-position
files. With --smollm2, the six real SmolLM2 conversations: teacher-forced on each build's
greedy answer, the KL divergence of our distribution from llama.cpp's over its top 10 ids,
and the same between its builds; and how many of our greedy answers are each build's.
Those on the F32 KV cache, the path whose order is llama.cpp's outside the products.

Six short conversations give about a hundred steps, too few for a mean KL: a few steps
decide it. With --text, a real text teacher-forced through SmolLM2 gives as many positions
as it has tokens (--positions), compared over the whole vocabulary, ours with the default F16
cache and with the F32 one, against llama.cpp builds run live, each in a process of its own;
then ours less the first two builds' KL, position by position (is ours further from llama.cpp
than its builds are from each other?). --llama-cpp names the folders that hold each build's
llama_cpp package ("installed": the one installed here), for example one built for this CPU
and one built for AVX2 alone (docs/development.md says how):

    python -m llm_smolq.dev.fidelity .models/reference --types Q4_1 \
        --smollm2 .models/SmolLM2-135M-Instruct.Q4_1.gguf --text /usr/share/common-licenses/GPL-3 \
        --llama-cpp installed,/tmp/llama-cpp-avx2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import llm_smolq

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K",
         "IQ4_NL", "IQ4_XS"]
LONG_TYPES = ["F32", "Q8_0", "Q4_K_M"]


def row_errors(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)


def _teacher_forced(engine, ref, chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's rows (in batches of chunk, else one batch) and each greedy step's logits."""
    engine.reset()
    ids = ref["tokens"].tolist()
    step = chunk or len(ids)
    rows = np.concatenate([engine.eval(ids[i:i + step], all_logits=True) for i in range(0, len(ids), step)])
    steps = [rows[-1]] + [engine.eval([t]) for t in ref["greedy"].tolist()[:-1]]
    return rows, np.stack(steps)


def _agreeing_steps(a, b) -> int:
    """Steps whose rows the two builds computed from the same ids: up to where their greedy
    continuations part (the step at which they part included)."""
    ga, gb = a["greedy"].tolist(), b["greedy"].tolist()
    same = next((k for k, (x, y) in enumerate(zip(ga, gb)) if x != y), min(len(ga), len(gb)))
    return min(same + 1, len(ga), len(gb))


def tiny_file(reference: Path, kind: str) -> dict:
    builds = np.load(reference / f"tiny-smollm3-{kind}.avx2.npz"), np.load(reference / f"tiny-smollm3-{kind}.npz")
    engine = llm_smolq.load(reference / f"tiny-smollm3-{kind}.gguf", n_ctx=256, kv_dtype="f32")
    out = {}
    for name, ref in zip(("avx2", "avx512"), builds):
        rows, steps = _teacher_forced(engine, ref)
        err = np.r_[row_errors(rows, ref["logits"]), row_errors(steps, ref["greedy_logits"])]
        out[name] = (float(np.median(err)), float(err.max()))
    a, b = builds
    k = _agreeing_steps(a, b)
    err = np.r_[row_errors(b["logits"], a["logits"]), row_errors(b["greedy_logits"][:k], a["greedy_logits"][:k])]
    out["builds"] = (float(np.median(err)), float(err.max()))
    return out


def long_file(reference: Path, kind: str) -> dict:
    builds = (np.load(reference / f"long-tiny-smollm3-{kind}.avx2.npz"),
              np.load(reference / f"long-tiny-smollm3-{kind}.npz"))
    engine = llm_smolq.load(reference / f"tiny-smollm3-{kind}.gguf", n_ctx=4096, kv_dtype="f32")
    out = {}
    for name, ref in zip(("avx2", "avx512"), builds):
        rows, steps = _teacher_forced(engine, ref, chunk=512)
        err = np.r_[row_errors(rows[int(ref["tail_start"]):], ref["logits_tail"]),
                    row_errors(steps, ref["greedy_logits"])]
        out[name] = (float(np.median(err)), float(err.max()))
    a, b = builds
    k = _agreeing_steps(a, b)
    err = np.r_[row_errors(b["logits_tail"], a["logits_tail"]),
                row_errors(b["greedy_logits"][:k], a["greedy_logits"][:k])]
    out["builds"] = (float(np.median(err)), float(err.max()))
    return out


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) of the softmaxes of two logit vectors over the same ids."""
    p = np.exp(p_logits - p_logits.max())
    q = np.exp(q_logits - q_logits.max())
    p, q = p / p.sum(), q / q.sum()
    return float((p * np.log(p / q)).sum())


def smollm2(reference: Path, model: Path) -> dict:
    builds = {name: json.loads((reference / f"smollm2-chat-A{suffix}.json").read_text())["cases"]
              for name, suffix in (("avx2", ".avx2"), ("avx512", ""))}
    a_cases, b_cases = builds["avx2"], builds["avx512"]
    # The steps both builds computed from the same ids: where their greedy answers agree so far.
    common = [next((k for k, (x, y) in enumerate(zip(a["greedy_ids"], b["greedy_ids"])) if x != y),
                   min(len(a["greedy_ids"]), len(b["greedy_ids"]))) + 1 for a, b in zip(a_cases, b_cases)]
    engine = llm_smolq.load(model, n_ctx=1024, kv_dtype="f32")
    out: dict = {"builds": []}
    for name, cases in builds.items():
        kls, common_kls, same, ours_all = [], [], 0, []
        for case, n_common in zip(cases, common):
            engine.reset()
            logits = engine.eval(case["prompt_ids"])
            ours = []
            for step, top10 in enumerate(case["top10_per_step"]):
                ids = [i for i, _ in top10]
                kl = _kl(np.array([v for _, v in top10], np.float64), logits[ids].astype(np.float64))
                kls.append(kl)
                if step < n_common:
                    common_kls.append(kl)
                if step + 1 < len(case["top10_per_step"]):
                    logits = engine.eval([case["greedy_ids"][step]])
            # Our own greedy answer, from the prompt.
            engine.reset()
            logits = engine.eval(case["prompt_ids"])
            while len(ours) < 48:
                ours.append(int(logits.argmax()))
                if ours[-1] == 2 or len(ours) == 48:
                    break
                logits = engine.eval([ours[-1]])
            same += ours == case["greedy_ids"]
            ours_all.append(ours)
        out[name] = {"kl_mean": float(np.mean(kls)), "kl_median": float(np.median(kls)), "kl_max": float(np.max(kls)),
                     "steps": len(kls), "kl_common_mean": float(np.mean(common_kls)),
                     "kl_common_median": float(np.median(common_kls)), "same_answers": same}
    for a, b, n_common in zip(a_cases, b_cases, common):
        for step in range(min(n_common, len(a["top10_per_step"]), len(b["top10_per_step"]))):
            da, db = dict(a["top10_per_step"][step]), dict(b["top10_per_step"][step])
            ids = [i for i in da if i in db]
            out["builds"].append(_kl(np.array([da[i] for i in ids]), np.array([db[i] for i in ids])))
    kls = out.pop("builds")
    out["between_builds"] = {"kl_mean": float(np.mean(kls)), "kl_median": float(np.median(kls)),
                             "kl_max": float(np.max(kls)), "steps": len(kls),
                             "same_answers": sum(a["greedy_ids"] == b["greedy_ids"] for a, b in zip(a_cases, b_cases))}
    return out


def full_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) of each row's softmax over the whole vocabulary, in float64."""
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def mean_error(values: np.ndarray, blocks: int = 16) -> float:
    """The standard error of values' mean, from the means of `blocks` runs of consecutive
    positions: neighbouring positions of one text are alike, so the spread of single values
    would understate it."""
    means = np.array([piece.mean() for piece in np.array_split(values, min(blocks, len(values)))])
    return float(means.std(ddof=1) / np.sqrt(len(means))) if len(means) > 1 else float("nan")


# A llama.cpp build's logits at every position of the ids, run where PYTHONPATH finds it.
_LLAMA_CPP_WORKER = """
import json, sys, numpy as np, llama_cpp
model, ids_path, out = sys.argv[1:4]
ids = json.load(open(ids_path))
llm = llama_cpp.Llama(model_path=model, n_ctx=len(ids) + 8, n_batch=512, n_ubatch=512, logits_all=True,
                      n_threads=2, verbose=False, flash_attn=False)
llm.eval(ids)
np.save(out, np.array(llm.scores[:len(ids)], dtype=np.float32))
"""


def _llama_cpp_logits(site: str, model: Path, ids_path: Path, out: Path) -> np.ndarray:
    env = dict(os.environ)
    if site != "installed":
        env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, "-c", _LLAMA_CPP_WORKER, str(model), str(ids_path), str(out)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp from {site!r} failed: {done.stderr.strip().splitlines()[-1:]}")
    return np.load(out)


def live_text(model: Path, text: Path, sites: list[str], positions: int) -> dict:
    """Our logits and each llama.cpp build's at every position of the text's first tokens,
    and the full-vocabulary KL between every two of them. Ours twice: with the F16 KV cache,
    the default, whose keys and values are rounded to halves as llama.cpp's default cache
    rounds them, and with the F32 cache, whose attention is llama.cpp's order in floats."""
    logits, ids = {}, None
    for kv in ("f16", "f32"):
        engine = llm_smolq.load(model, n_ctx=positions + 8, kv_dtype=kv)
        if ids is None:
            ids = engine.tokenize(text.read_text())[:positions]
        logits[f"ours {kv.upper()} cache"] = np.concatenate(
            [np.array(engine.eval(ids[s:s + 512], all_logits=True), np.float32) for s in range(0, len(ids), 512)])
        del engine
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = Path(tmp) / "ids.json"
        ids_path.write_text(json.dumps(ids))
        for i, site in enumerate(sites):
            logits[f"llama.cpp {site}"] = _llama_cpp_logits(site, model, ids_path, Path(tmp) / f"{i}.npy")
    names = list(logits)
    pairs, kls = {}, {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            kl = kls[b, a] = full_kl(logits[b], logits[a])  # KL(llama.cpp || ours), KL(build || build)
            pairs[f"{b} || {a}"] = {"kl_mean": float(kl.mean()), "kl_mean_se": mean_error(kl),
                                    "kl_median": float(np.median(kl)), "kl_p99": float(np.quantile(kl, 0.99)),
                                    "top1_same": float((logits[a].argmax(1) == logits[b].argmax(1)).mean())}
    # Ours against a build, less the two builds against each other, position by position:
    # whether ours is further from llama.cpp than its builds are from each other.
    builds = [name for name in names if name.startswith("llama.cpp")]
    beyond = {}
    if len(builds) >= 2:
        between = kls[builds[1], builds[0]]
        for ours in (name for name in names if name.startswith("ours")):
            for build in builds[:2]:
                d = kls[build, ours] - between
                beyond[f"{build} || {ours}"] = {"mean": float(d.mean()), "se": mean_error(d)}
    return {"positions": len(ids), "pairs": pairs, "beyond_builds": beyond}


def format_report(report: dict) -> str:
    lines = ["per-row relative error, median / worst row: ours against each llama.cpp build, and its builds "
             "against each other",
             f"{'file':16s} {'vs AVX2 build':>20s} {'vs AVX-512 build':>20s} {'AVX2 vs AVX-512':>20s}"]
    pair = lambda v: f"{v[0]:.2e} / {v[1]:.2e}"  # noqa: E731
    for name, row in report["files"].items():
        lines.append(f"{name:16s} {pair(row['avx2']):>20s} {pair(row['avx512']):>20s} {pair(row['builds']):>20s}")
    if "smollm2" in report:
        s = report["smollm2"]
        lines.append("SmolLM2-135M-Instruct Q4_1, six conversations, teacher-forced: KL over llama.cpp's top 10 ids, "
                     "mean / median / max (steps both builds share: mean / median)")
        for name in ("avx2", "avx512"):
            r = s[name]
            lines.append(f"  ours vs {name:6s}: {r['kl_mean']:.2e} / {r['kl_median']:.2e} / {r['kl_max']:.2e} over "
                         f"{r['steps']} steps ({r['kl_common_mean']:.2e} / {r['kl_common_median']:.2e}); "
                         f"greedy answers the same: {r['same_answers']} of 6")
        r = s["between_builds"]
        lines.append(f"  AVX2 vs AVX-512: {r['kl_mean']:.2e} / {r['kl_median']:.2e} / {r['kl_max']:.2e} over "
                     f"{r['steps']} shared steps; greedy answers the same: {r['same_answers']} of 6")
    if "text" in report:
        t = report["text"]
        lines.append(f"SmolLM2, {t['positions']} positions of real text, teacher-forced: KL over the whole "
                     "vocabulary, mean (+- its standard error) / median / 99th percentile; top-1 the same")
        for pair, r in t["pairs"].items():
            same = "  (the same logits: are these two builds of one kind?)" if r["kl_mean"] == 0 else ""
            lines.append(f"  KL({pair}): {r['kl_mean']:.2e} (+-{r['kl_mean_se']:.1e}) / {r['kl_median']:.2e} / "
                         f"{r['kl_p99']:.2e}; {r['top1_same']:.2%}{same}")
        if t.get("beyond_builds"):
            lines.append("  each of those less the two builds' KL, position by position (mean +- its standard error):")
            for pair, r in t["beyond_builds"].items():
                lines.append(f"    KL({pair}) - KL(builds): {r['mean']:+.2e} (+-{r['se']:.1e})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llm_smolq.dev.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path, help="the reference folder, with the tiny GGUFs beside the logits")
    parser.add_argument("--smollm2", type=Path, help="the real SmolLM2-135M-Instruct Q4_1 GGUF")
    parser.add_argument("--types", default=",".join(TYPES), metavar="TYPE,...",
                        help="the reference files to compare (default: all)")
    parser.add_argument("--text", type=Path, help="with --smollm2: a real text to teacher-force, compared live")
    parser.add_argument("--llama-cpp", default="installed", metavar="SITE,...",
                        help="with --text: folders holding a llama_cpp build each ('installed': the one here)")
    parser.add_argument("--positions", type=int, default=1536, help="with --text: its first tokens (default 1536)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.text and not args.smollm2:
        parser.error("--text compares SmolLM2 live: give its GGUF with --smollm2")
    kinds = args.types.split(",")
    if unknown := [kind for kind in kinds if kind not in TYPES]:
        parser.error(f"--types: no reference file of {', '.join(unknown)}; the files are {', '.join(TYPES)}")
    missing = [kind for kind in kinds if not (args.reference / f"tiny-smollm3-{kind}.gguf").is_file()]
    if missing:
        parser.error(f"{args.reference} lacks the GGUFs of {', '.join(missing)}: run the tests once, which "
                     "rebuild them into .models/reference/, and point this at that folder")
    report: dict = {"files": {kind: tiny_file(args.reference, kind) for kind in kinds}}
    for kind in [k for k in LONG_TYPES if k in kinds]:
        report["files"][f"long {kind}"] = long_file(args.reference, kind)
    if args.smollm2:
        report["smollm2"] = smollm2(args.reference, args.smollm2)
    if args.text:
        report["text"] = live_text(args.smollm2, args.text, args.llama_cpp.split(","), args.positions)
    print(json.dumps(report, indent=1) if args.json else format_report(report))


if __name__ == "__main__":
    main()
