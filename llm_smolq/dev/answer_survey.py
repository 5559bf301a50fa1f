"""How a model's answers end, prompt by prompt: the finish reasons and lengths of seeded
runs at the default options (or others), through llm's Python API as a user meets them.
It is how the README's examples were chosen, and how repeat_penalty's effect was measured:

    python -m llm_smolq.dev.answer_survey smollm2-q --seeds 5
    python -m llm_smolq.dev.answer_survey smollm2-q --seeds 5 --repeat-penalty 1.2 "What is the capital of France?"
    python -m llm_smolq.dev.answer_survey smollm2-q --seeds 10 --system "Answer in one sentence." "What is a rainbow?"
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import llm

CANDIDATES = (
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "What is photosynthesis? Answer in one sentence.",
    "Explain what a computer is to a child.",
    "Translate 'good morning' into Spanish.",
    "Write a short poem about autumn.",
    "Suggest three names for a pet cat.",
    "What are the benefits of drinking water?",
    "Tell me a fun fact about octopuses.",
    "How do I boil an egg?",
    "Summarize the story of Cinderella in two sentences.",
    "What is the largest planet in our solar system?",
)


def survey(model_id: str, prompts: list[str], seeds: int, options: dict, system: str | None = None) -> list[dict]:
    model = llm.get_model(model_id)
    rows = []
    for text in prompts:
        reasons, lengths, first = Counter(), [], None
        for seed in range(seeds):
            response = model.prompt(text, system=system, seed=seed, **options)
            answer = response.text()
            reasons[response.response_json["finish_reason"]] += 1
            lengths.append(response.output_tokens)
            first = first if first is not None else answer
        lengths.sort()
        rows.append({"prompt": text, "finish": dict(reasons), "median_tokens": lengths[len(lengths) // 2],
                     "max_tokens": lengths[-1], "seed_0": first})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llm_smolq.dev.answer_survey", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an llm model id, e.g. smollm2-q")
    parser.add_argument("prompts", nargs="*", help="prompts to try (default: a built-in dozen)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--system", help="a system prompt for every prompt")
    parser.add_argument("--repeat-penalty", type=float)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--no-repeat-guard", action="store_true", help="let loops run to max_tokens")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_intermixed_args(argv)
    options = {"prompt_cache": False}
    if args.repeat_penalty is not None:
        options["repeat_penalty"] = args.repeat_penalty
    if args.temperature is not None:
        options["temperature"] = args.temperature
    if args.no_repeat_guard:
        options["repeat_guard"] = False
    rows = survey(args.model, args.prompts or list(CANDIDATES), args.seeds, options, args.system)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print("| prompt | finish reasons | median tokens | most tokens | seed 0's answer, first 60 characters |")
    print("|---|---|---|---|---|")
    for row in rows:
        finish = ", ".join(f"{reason} {n}" for reason, n in sorted(row["finish"].items()))
        head = " ".join(row["seed_0"].split())[:60].replace("|", "\\|")
        print(f"| {row['prompt']} | {finish} | {row['median_tokens']} | {row['max_tokens']} | {head} |")


if __name__ == "__main__":
    main()
