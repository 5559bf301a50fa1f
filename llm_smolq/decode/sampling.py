"""Choosing the next token from logits: llama.cpp's default sampler chain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from llm_smolq.defaults import REPEAT_WINDOW


@dataclass(frozen=True)
class SamplingParams:
    """A sampler's settings. Left out, a cut is off (top_p 1, top_k 0, min_p 0, no
    penalty); the plugin's defaults per model card are in llm_smolq.defaults."""

    temperature: float  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    seed: int | None = None


class Sampler:
    """llama.cpp's default chain in order: repeat penalty, top-k, top-p, min-p,
    temperature, then a draw. Temperature 0 is plain argmax: greedy and deterministic."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, recent: Sequence[int]) -> int:
        p = self.params
        logits = logits.astype(np.float64)
        if p.repeat_penalty != 1.0 and recent:
            ids = np.unique(np.asarray(recent[-REPEAT_WINDOW:]))
            seen = logits[ids]
            logits[ids] = np.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
        if p.temperature <= 0:
            return int(np.argmax(logits))
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[: p.top_k]
        probs = _softmax(logits[order])
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            order, probs = order[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            order = order[keep]
        probs = _softmax(logits[order] / p.temperature)
        return int(order[self.rng.choice(len(order), p=probs)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
