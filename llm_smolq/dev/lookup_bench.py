"""Lookup decoding against plain decoding, greedy, on prompts that copy and one that does not;
and what checking a draft costs.

    python -m llm_smolq.dev.bench MODEL.gguf --lookup [N] [--threads T] [--repeat R] [--json]
    python -m llm_smolq.dev.bench MODEL.gguf --draft-check [DEPTH] [--threads T] [--repeat R] [--json]

Each prompt is answered with lookup off and with up to N drafted tokens, alternating,
R rounds, in one process (the engine reset before every answer). The report gives decode
tok/s of each (median, min-max), their ratio, what was drafted and kept, and whether the
two answers were the same tokens (they must be).

--draft-check prefills DEPTH random ids (default 512), then times one forward of k tokens
with every row's logits (what checking a draft of k - 1 tokens costs:
Engine.eval(..., all_logits=True)) for k = 1, 2, 4, 8, 9, 16 (9: the check
of a default lookup draft, the sampled token and 8 drafted), the sizes alternating, R
rounds; each is reported as its best time and as a multiple of k = 1's, a plain decode
step, beside its int8 floor: the k tokens' multiply-adds in the model's quantized matrices
(the output projection's too, every row's logits being asked for) at the int8 peak of the
engine's threads (Engine.int8_macs_per_second), the least time the products could take.
"""

from __future__ import annotations

import time

from llm_smolq.dev.spread import spread, spread_text

ANSWER_TOKENS = 400

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small brass lamp and a "
    "notebook in which he wrote the weather, the ships he saw, and the names of the birds that rested on the "
    "railing. In winter the wind came off the sea so hard that the glass hummed, and he would stand with his back "
    "to the lens and count the seconds between the flashes, as his father had taught him, and his grandfather "
    "before that. Nobody had asked him to keep the notebook. The lamp had been electric for forty years and the "
    "light turned itself on at dusk and off at dawn without anyone's help, but he liked to think that somebody "
    "should be watching, and that the sea behaved better when it knew it was being written down. On the last page "
    "of the oldest notebook, in his grandfather's hand, was a list of every ship that had gone aground on the reef "
    "below, with the date, the weather, and the number of people the keeper had brought up the cliff path alive."
)

FUNCTION = '''def parse_duration(text):
    """Parse '1h30m', '45s' or '2d' into seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    total = 0
    number = ""
    for ch in text.strip():
        if ch.isdigit():
            number += ch
        elif ch in units:
            if not number:
                raise ValueError(f"missing number before {ch!r} in {text!r}")
            total += int(number) * units[ch]
            number = ""
        elif ch.isspace():
            continue
        else:
            raise ValueError(f"unknown unit {ch!r} in {text!r}")
    if number:
        raise ValueError(f"number without a unit at the end of {text!r}")
    return totl


def format_duration(seconds):
    """Format seconds as '1h30m' (the largest units first, zero parts left out)."""
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds == 0:
        return "0s"
    parts = []
    for name, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts)


def add_durations(*texts):
    """The sum of several durations, formatted."""
    return format_duration(sum(parse_duration(t) for t in texts))
'''

PROMPTS = {
    "repeat a paragraph": f"Repeat this paragraph word for word:\n\n{PARAGRAPH}",
    "fix the typo in code": f"Fix the typo in this code and write out the whole fixed code:\n\n{FUNCTION}",
    "nothing to copy": "Write a short story about a robot who learns to paint, in about 300 words.",
}


def _answer(engine, template, prompt: str, lookup: int) -> dict:
    from llm_smolq.decode.generate import Completion, generate, prompt_ids
    from llm_smolq.decode.sampling import SamplingParams

    ids = prompt_ids(engine, template.render([{"role": "user", "content": prompt}], add_generation_prompt=True))
    engine.reset()
    done = Completion()
    for _ in generate(engine, ids, SamplingParams(temperature=0), ANSWER_TOKENS, (), done, lookup=lookup):
        pass
    tokens = len(done.output_ids) - 1  # the first comes out of the prefill
    return {"ids": done.output_ids, "tok_s": tokens / done.decode_seconds if tokens > 0 else 0.0,
            "drafted": done.drafted_tokens, "accepted": done.accepted_tokens}


def measure(path: str, threads: int, lookup: int, repeat: int) -> dict:
    import llm_smolq
    from llm_smolq.chat.template import chat_template_from_metadata

    engine = llm_smolq.load(path, n_ctx=4096, threads=threads)
    template = chat_template_from_metadata(engine.model.metadata)
    report = {"model": path, "threads": threads, "lookup": lookup, "repeat": repeat, "prompts": {}}
    for name, prompt in PROMPTS.items():
        runs: dict[int, list[dict]] = {0: [], lookup: []}
        started = time.perf_counter()
        for _ in range(repeat):
            for n in (0, lookup):
                runs[n].append(_answer(engine, template, prompt, n))
        plain, looked = runs[0], runs[lookup]
        ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(plain, looked) if a["tok_s"] > 0]
        report["prompts"][name] = {
            "answer_tokens": len(plain[0]["ids"]),
            "plain_tok_s": spread([r["tok_s"] for r in plain]),
            "lookup_tok_s": spread([r["tok_s"] for r in looked]),
            "ratio": spread(ratios),
            "drafted": looked[0]["drafted"],
            "accepted": looked[0]["accepted"],
            "same_output": all(r["ids"] == plain[0]["ids"] for r in plain + looked),
            "seconds": time.perf_counter() - started,
        }
    return report


def format_report(r: dict) -> str:
    lines = [f"{r['model']}: {r['threads']} threads, greedy, lookup 0 vs {r['lookup']}, "
             f"median of {r['repeat']} alternating rounds (min-max)"]
    for name, p in r["prompts"].items():
        lines.append(f"  {name}: {p['answer_tokens']} tokens; plain {spread_text(p['plain_tok_s'], '.1f')} tok/s, "
                     f"lookup {spread_text(p['lookup_tok_s'], '.1f')} tok/s, x{spread_text(p['ratio'])}; "
                     f"drafted {p['drafted']}, kept {p['accepted']}; same output: {p['same_output']}")
    return "\n".join(lines)


CHECK_SIZES = (1, 2, 4, 8, 9, 16)


def measure_check_cost(path: str, threads: int, depth: int, repeat: int) -> dict:
    import numpy as np

    import llm_smolq
    from llm_smolq._kernel import ffi, lib

    engine = llm_smolq.load(path, n_ctx=depth + max(CHECK_SIZES), threads=threads)
    ids = [int(i) for i in np.random.default_rng(0).integers(100, min(engine.config.vocab_size, 20000),
                                                             depth + max(CHECK_SIZES))]
    for start in range(0, depth, 512):
        engine.eval(ids[start:min(start + 512, depth)])
    seconds: dict[int, list[float]] = {k: [] for k in CHECK_SIZES}
    for _ in range(repeat):
        for k in CHECK_SIZES:
            engine.truncate(depth)
            started = time.perf_counter()
            engine.eval(ids[depth:depth + k], all_logits=True)
            seconds[k].append(time.perf_counter() - started)
    one = min(seconds[1])
    peak = engine.int8_macs_per_second()
    macs = int8_macs_per_token(path)
    return {"model": path, "threads": threads, "depth": depth, "repeat": repeat, "simd": ffi.string(lib.sq_simd_name()).decode(),
            "int8_macs_per_s": peak, "int8_macs_per_token": macs,
            "sizes": {k: {"ms": min(v) * 1e3, "steps": min(v) / one, "int8_floor_ms": k * macs / peak * 1e3}
                      for k, v in seconds.items()}}


def int8_macs_per_token(path: str) -> int:
    """The int8 multiply-adds of one token through the model's quantized matrices: every
    layer's, and the output projection's (token_embd's where the embeddings are tied)."""
    from llm_smolq.model.model_file import open_model

    model = open_model(path)
    output = "token_embd.weight" if model.config.tied_embeddings else "output.weight"
    return sum(int(t.shape[0]) * int(t.shape[1]) for name, t in model.tensors.items()
               if len(t.shape) == 2 and t.type.name not in ("F32", "F16", "BF16")
               and (name.startswith("blk.") or name == output))


def format_check_cost(r: dict) -> str:
    lines = [f"{r['model']}: {r['threads']} threads, at depth {r['depth']}, best of {r['repeat']} alternating rounds",
             f"  int8 peak ({r['simd']}): {r['int8_macs_per_s'] / 1e9:.0f} G multiply-adds/s; "
             f"{r['int8_macs_per_token'] / 1e9:.2f} G per token"]
    for k, v in r["sizes"].items():
        lines.append(f"  {k:2d} tokens: {v['ms']:.1f} ms, x{v['steps']:.2f} one step; int8 floor {v['int8_floor_ms']:.1f} ms"
                     f" (x{v['ms'] / v['int8_floor_ms']:.2f} of it)")
    return "\n".join(lines)
