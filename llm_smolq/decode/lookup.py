"""Lookup decoding: drafts of the next tokens taken from the text so far.

An answer that repeats its prompt (a paragraph to copy, code with one fix) or itself
holds n-grams that occurred before; the tokens that followed them then are a good guess
for what follows now. The generate loop evaluates such a draft together with the token
it has just sampled, in one batch that reads the weights once, and samples each next
token from those rows exactly as plain decoding would, keeping the draft as long as the
samples agree with it (decode/generate.py).

Sampling a token and keeping the draft's token only when they are equal is the
speculative-sampling acceptance rule for a draft that puts all its probability on one
token: the draft is kept with probability p(token), and otherwise the token comes from
p without it, renormalized. The engine gives every row of a batch the bits of a one-token
step (Engine.eval), so every row is the logits plain decoding computes, and the sampler
draws once per token in the same order: the output is the same as plain decoding's,
token for token, greedy or seeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


class NgramDrafter:
    """The tokens that followed the latest earlier occurrence of the text's last n tokens,
    trying n from `longest` down to `shortest`. Each append is O(longest).

    Up to 8: in an answer that copies code with a change, a match of 5-8 tokens more often
    points at the place being copied than one of 4 does (a line's ending, say, occurs in
    several places). Replayed with measured check costs, the typo benchmark's answer went
    from x1.55 to x1.65 and the other two moved by 0.03 at most; measured live, with the
    two drafters alternating, the gain was inside the noise (BENCHMARKS.md)."""

    def __init__(self, tokens: Sequence[int] = (), shortest: int = 2, longest: int = 8):
        if not 1 <= shortest <= longest:
            raise ValueError("the n-gram lengths must satisfy 1 <= shortest <= longest")
        self.shortest, self.longest = shortest, longest
        self.tokens: list[int] = []
        # for each n: n-gram -> the position of the token that followed its latest occurrence
        self._follows: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(shortest, longest + 1)}
        # The prompt is filed on first use, not when the answer starts: a long prompt takes
        # a while (about 0.2 s for 64k tokens), which would delay the first token.
        self._unfiled = list(tokens)

    def _file_prompt(self) -> None:
        if self._unfiled:
            tokens, self._unfiled = self._unfiled, []
            for token in tokens:
                self._append(token)

    def append(self, token: int) -> None:
        self._file_prompt()
        self._append(token)

    def _append(self, token: int) -> None:
        # The n-grams ending at the last token are filed now that their follower is known,
        # so a lookup never finds the text's own ending.
        end = len(self.tokens)
        for n, follows in self._follows.items():
            if end >= n:
                follows[tuple(self.tokens[end - n:])] = end
        self.tokens.append(token)

    def _match(self) -> tuple[int, int]:
        """(n, where its follower is) for the longest n whose ending occurred before; (0, 0) if none."""
        self._file_prompt()
        for n in range(self.longest, self.shortest - 1, -1):
            if len(self.tokens) >= n:
                at = self._follows[n].get(tuple(self.tokens[-n:]))
                if at is not None:
                    return n, at
        return 0, 0

    def order(self) -> int:
        """The length of the n-gram a draft would come from now; 0 when there is none."""
        return self._match()[0]

    def draft(self, limit: int) -> list[int]:
        """Up to `limit` tokens to try next; [] when the text's ending did not occur before."""
        if limit <= 0:
            return []
        n, at = self._match()
        if not n:
            return []
        draft = self.tokens[at:at + limit]
        # Running into the end, the text repeats with period len - at: go on with it.
        period = len(self.tokens) - at
        while len(draft) < limit:
            draft.append(draft[-period])
        return draft


@dataclass
class Draft:
    """A draft in the KV cache past the answer, being checked: the tokens drafted, each
    with the logits after it (the rows of the batch that evaluated it), kept one by one
    while the sampled tokens equal them."""

    tokens: list[int]
    rows: Sequence[np.ndarray]  # rows[i]: the logits after tokens[i]
    order: int  # the length of the n-gram match it came from
    seconds: float  # what the batch that checked it took
    accepted: int = 0  # kept so far: the answer's tokens equal its first `accepted`

    @property
    def expected(self) -> int:
        """The drafted token the next sampled one is compared with."""
        return self.tokens[self.accepted]

    @property
    def all_kept(self) -> bool:
        """Every drafted token was kept."""
        return self.accepted == len(self.tokens)

    def accept(self) -> np.ndarray:
        """The next drafted token is kept: the logits after it."""
        row = self.rows[self.accepted]
        self.accepted += 1
        return row


class DraftPolicy:
    """How long a draft is worth making. A drafted token costs `cost` of a one-token step
    to check (measured as the answer runs: checking is compute, and the batch reads the
    weights once) and is kept with a probability `rate` (measured too, for each length of
    the n-gram the draft comes from: a longer match is a better guess; a draft is kept up
    to its first miss, so its i-th token counts with rate**i). A draft pays while
    rate**k > cost: the policy drafts the longest such k, up to `limit`, and nothing
    when even one token does not pay, except a one-token probe every `probe_every` steps
    so that an answer which turns to copying is noticed."""

    def __init__(self, limit: int, rate: float = 0.6, cost: float = 0.5, probe_every: int = 16):
        self.limit, self.cost, self.probe_every = limit, cost, probe_every
        self.first_rate = rate
        self.rates: dict[int, float] = {}  # n-gram length -> the rate its drafts were kept at
        self.step_seconds: float | None = None  # a plain one-token step, as measured here
        self._since_draft = 0

    def rate(self, order: int) -> float:
        return self.rates.get(order, self.first_rate)

    def length(self, room: int, order: int = 0) -> int:
        """Tokens to draft from an n-gram match of length `order` (0: one rate for every length)."""
        limit = min(self.limit, room)
        if limit <= 0:
            return 0
        rate, k = self.rate(order), 0
        while k < limit and rate ** (k + 1) > self.cost:
            k += 1
        if k == 0 and self._since_draft >= self.probe_every:
            k = 1
        self._since_draft = 0 if k else self._since_draft + 1
        return k

    def stepped(self, seconds: float) -> None:
        """A one-token step took `seconds`."""
        self.step_seconds = seconds if self.step_seconds is None else 0.8 * self.step_seconds + 0.2 * seconds

    def checked(self, drafted: int, accepted: int, seconds: float, order: int = 0) -> None:
        """A draft of `drafted` tokens from an n-gram of length `order`, checked in
        `seconds`, kept `accepted` of them."""
        rate = self.rate(order)
        for kept in [1.0] * accepted + [0.0] * (accepted < drafted):  # tokens compared, up to the first miss
            rate += 0.1 * (kept - rate)
        self.rates[order] = rate
        if self.step_seconds:
            each = max(seconds - self.step_seconds, 0.0) / drafted / self.step_seconds
            self.cost += 0.25 * (min(each, 2.0) - self.cost)

    def judged(self, draft: Draft) -> None:
        """A draft's check is over: all of it kept, or up to its first miss."""
        self.checked(len(draft.tokens), draft.accepted, draft.seconds, draft.order)
