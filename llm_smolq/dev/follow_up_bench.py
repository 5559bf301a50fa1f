"""Time to first token of a conversation's follow-up in a new process, with the prompt
cache and cold.

    python -m llm_smolq.dev.bench MODEL.gguf --follow-up 1000 [--threads N] [--repeat 3] [--json]

A first child process answers a first turn whose prompt is a long document (sized so that
the follow-up's whole conversation is about --follow-up tokens) and saves its KV state in
a temporary prompt cache. Then fresh child processes, alternately warm and cold, render the
conversation with that answer and a follow-up question through the model's chat template,
as `llm -c` does, and time from the start of the cache lookup (warm) or of the prefill
(cold) to the first token. Model loading is timed apart: it is the same for both.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llm_smolq.dev.spread import spread, spread_text

ANSWER_TOKENS = 32
QUESTION = "Summarise the entries above in one sentence."
FOLLOW_UP = "Which entry mentions the largest weight?"
_COLOURS = ("red", "green", "blue", "amber", "grey", "violet", "white")
_THINGS = ("crate", "lantern", "anchor", "barrel", "kettle", "ladder", "compass", "saddle")
_PLACES = ("the harbour", "the north field", "the old mill", "the market", "the chapel", "the river bank")


def document(n_sentences: int) -> str:
    return " ".join(
        f"Entry {i + 1}: the {_COLOURS[i % 7]} {_THINGS[i % 8]} at {_PLACES[i % 6]} weighed {(i * 37) % 91 + 5} kilograms."
        for i in range(n_sentences)
    )


def _prompt_ids(engine, template, messages: list[dict]) -> list[int]:
    """What the plugin sends for these messages: the chat template's text, tokenized."""
    from llm_smolq.decode.generate import prompt_ids

    extra = {"enable_thinking": True} if engine.config.arch == "smollm3" else {}
    return prompt_ids(engine, template.render(messages, add_generation_prompt=True, **extra))


def _first_messages(engine, template, budget: int) -> list[dict]:
    """A first turn whose prompt is as long as fits in `budget` tokens."""

    def messages(n_sentences: int) -> list[dict]:
        return [{"role": "user", "content": document(n_sentences) + "\n\n" + QUESTION}]

    base = len(_prompt_ids(engine, template, messages(0)))
    per_sentence = (len(_prompt_ids(engine, template, messages(20))) - base) / 20
    n = max(1, int((budget - base) / per_sentence))
    while n > 1 and len(_prompt_ids(engine, template, messages(n))) > budget:
        n -= 1
    return messages(n)


def first_turn(model: str, threads: int, n_tokens: int, work: Path) -> dict:
    """Answer the first turn, save its state, and write the follow-up's messages."""
    from llm_smolq.chat.template import chat_template_from_metadata
    from llm_smolq.engine.engine import load
    from llm_smolq.chat.reasoning import ReasoningSplitter
    from llm_smolq.decode.generate import Completion, generate
    from llm_smolq.decode.sampling import SamplingParams
    from llm_smolq.store.prompt_cache import PromptCache

    engine = load(model, n_ctx=n_tokens + 512, threads=threads)
    template = chat_template_from_metadata(engine.model.metadata)
    messages = _first_messages(engine, template, n_tokens - ANSWER_TOKENS - 20)  # room for the rest
    ids = _prompt_ids(engine, template, messages)
    done = Completion()
    text = "".join(generate(engine, ids, SamplingParams(temperature=0), ANSWER_TOKENS, (), done))
    if engine.config.arch == "smollm3":  # earlier reasoning is not part of the history
        splitter = ReasoningSplitter()
        pieces = splitter.push(text) + splitter.flush()
        text = "".join(t for kind, t in pieces if kind == "text")
    cache = PromptCache(work / "cache")
    saved = cache.save(engine)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UP}]
    (work / "messages.json").write_text(json.dumps(messages))
    return {
        "first_prompt_tokens": len(ids),
        "answer_tokens": len(done.output_ids),
        "save_s": saved.write_seconds,
        "saved_bytes": cache.total_bytes(),
        "saved_tokens": saved.written_tokens,
    }


def follow_up(model: str, threads: int, n_tokens: int, work: Path, warm: bool) -> dict:
    from llm_smolq.chat.template import chat_template_from_metadata
    from llm_smolq.engine.engine import load
    from llm_smolq.decode.generate import prefill
    from llm_smolq.store.prompt_cache import CacheActivity, PromptCache

    started = time.perf_counter()
    engine = load(model, n_ctx=n_tokens + 512, threads=threads)
    template = chat_template_from_metadata(engine.model.metadata)
    load_s = time.perf_counter() - started
    ids = _prompt_ids(engine, template, json.loads((work / "messages.json").read_text()))
    activity = CacheActivity()
    started = time.perf_counter()
    if warm:
        PromptCache(work / "cache").restore(engine, ids, activity)
    logits, cached = prefill(engine, ids)
    int(logits.argmax())  # the first token
    return {
        "ttft_s": time.perf_counter() - started,
        "load_s": load_s,
        "prompt_tokens": len(ids),
        "cached_tokens": cached,
        "read_tokens": activity.read_tokens,
        "read_s": activity.read_seconds,
    }


def _child(phase: str, model: str, threads: int, n_tokens: int, work: Path) -> dict:
    cmd = [sys.executable, "-m", "llm_smolq.dev.follow_up_bench", phase, model, str(threads), str(n_tokens), str(work)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {phase} run failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(model: str, threads: int, n_tokens: int, repeat: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="smolq-follow-up-") as work:
        first = _child("first", model, threads, n_tokens, Path(work))
        runs: dict[str, list[dict]] = {"warm": [], "cold": []}
        for _ in range(repeat):  # alternated, so machine noise falls on both alike
            for phase in runs:
                runs[phase].append(_child(phase, model, threads, n_tokens, Path(work)))
    med = {phase: statistics.median(r["ttft_s"] for r in rs) for phase, rs in runs.items()}
    return {
        "model": model,
        "threads": threads,
        "repeat": repeat,
        "first_turn": first,
        "follow_up_tokens": runs["cold"][0]["prompt_tokens"],
        "warm": {key: [r[key] for r in runs["warm"]] for key in runs["warm"][0]},
        "cold": {key: [r[key] for r in runs["cold"]] for key in runs["cold"][0]},
        "warm_ttft_s": med["warm"],
        "cold_ttft_s": med["cold"],
        "ratio": med["warm"] / med["cold"],
    }


def format_report(r: dict) -> str:
    first, warm, cold = r["first_turn"], r["warm"], r["cold"]

    def seconds(values):
        return spread_text(spread(values), ".3f") + " s"

    return "\n".join([
        f"{r['model']}: a follow-up of {r['follow_up_tokens']} tokens (first prompt {first['first_prompt_tokens']}, "
        f"answer {first['answer_tokens']}), {r['threads']} threads, median of {r['repeat']} new processes (min-max)",
        f"  saving the first turn: {first['save_s']:.3f} s, {first['saved_bytes'] / 1e6:.1f} MB",
        f"  cold re-prefill:   first token after {seconds(cold['ttft_s'])}",
        f"  with prompt cache: first token after {seconds(warm['ttft_s'])}; "
        f"{statistics.median(warm['read_tokens']):.0f} tokens read from disk in {seconds(warm['read_s'])}, "
        f"{statistics.median(warm['cached_tokens']):.0f} reused",
        f"  warm / cold: {r['ratio']:.3f}",
    ])


def main(argv: list[str]) -> None:
    phase, model, threads, n_tokens, work = argv[0], argv[1], int(argv[2]), int(argv[3]), Path(argv[4])
    if phase == "first":
        print(json.dumps(first_turn(model, threads, n_tokens, work)))
    else:
        print(json.dumps(follow_up(model, threads, n_tokens, work, warm=phase == "warm")))


if __name__ == "__main__":
    main(sys.argv[1:])
