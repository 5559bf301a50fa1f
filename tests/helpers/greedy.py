"""The engine's own greedy answer, the expected output of every greedy test through llm."""

from __future__ import annotations


def greedy_ids(engine, prompt_ids: list[int], max_tokens: int, end_of_turn: int = 2) -> list[int]:
    """Argmax after argmax from a fresh cache, up to max_tokens or the end of turn
    (SmolLM2's <|im_end|>, 2), which ends the list when it came."""
    engine.reset()
    logits, ids = engine.eval(prompt_ids), []
    while len(ids) < max_tokens:
        ids.append(int(logits.argmax()))
        if ids[-1] == end_of_turn or len(ids) == max_tokens:
            break
        logits = engine.eval([ids[-1]])
    return ids
