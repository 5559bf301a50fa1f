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
        if p.top_k <= 0 and p.top_p >= 1.0:
            return self._uncut(logits)
        order, probs = self._top(logits)
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            order = order[keep]
        probs = _softmax(logits[order] / p.temperature)
        return int(order[self._pick(probs)])

    def _uncut(self, logits: np.ndarray) -> int:
        """A draw with no top-k or top-p cut: every token, but those min-p drops, in token
        order. The order a draw walks changes which token a seed gives, not how often each
        comes, and sorting SmolLM2's 49,152 logits took 5 ms a token, longer than its
        forward pass."""
        p = self.params
        if p.min_p > 0.0:  # p_i >= min_p * p_max, both over the same sum
            ids = np.flatnonzero(np.exp(logits - logits.max()) >= p.min_p)
            return int(ids[self._pick(_softmax(logits[ids] / p.temperature))])
        return self._pick(_softmax(logits / p.temperature))

    def _pick(self, probs: np.ndarray) -> int:
        """An index drawn with these probabilities: the draw rng.choice(len(probs), p=probs)
        makes, without its checks of probs (a third of a millisecond over a vocabulary)."""
        cdf = np.cumsum(probs)
        if not cdf[-1] > 0:  # NaN, or nothing left: as rng.choice refuses them
            raise ValueError("no token can be drawn: the probabilities are zero or not numbers")
        cdf /= cdf[-1]
        return int(np.searchsorted(cdf, self.rng.random(), side="right"))

    def _top(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What top-k and top-p keep (one of them cuts: __call__ draws uncut otherwise): the
        tokens in descending order of logit (ties in token order), with their probabilities
        at temperature 1 among what top-k left. Only as much of that order is sorted as the
        cuts reach: sorting all of SmolLM2's 49,152 logits took 4 ms a token, longer than its
        forward pass."""
        p = self.params
        if p.top_k > 0:
            order = _head(logits, p.top_k)
            probs = _softmax(logits[order])
            if p.top_p < 1.0:
                keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
                order, probs = order[:keep], probs[:keep]
            return order, probs
        top = logits.max()
        e = np.exp(logits - top)
        total = e.sum()
        # The tokens within `depth` of the largest logit lead the order (ties in token order
        # within it): a deeper cut until their probabilities reach top_p, else all of them.
        for depth in (8.0, 16.0, 32.0, 64.0, np.inf):
            ids = np.flatnonzero(logits >= top - depth) if depth < np.inf else np.arange(len(logits))
            order = ids[np.argsort(-logits[ids], kind="stable")]
            probs = e[order] / total
            cumulative = np.cumsum(probs)
            if cumulative[-1] >= p.top_p:
                break
        keep = int(np.searchsorted(cumulative, p.top_p)) + 1
        return order[:keep], probs[:keep]


def _head(logits: np.ndarray, n: int) -> np.ndarray:
    """The first n of the token ids sorted by descending logit, ties in token order (as a
    stable sort of all of them gives), sorting only those at or above the n-th largest."""
    if n >= len(logits):
        return np.argsort(-logits, kind="stable")
    nth = np.partition(logits, len(logits) - n)[len(logits) - n]
    ids = np.flatnonzero(logits >= nth)
    return ids[np.argsort(-logits[ids], kind="stable")][:n]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
