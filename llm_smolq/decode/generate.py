"""The generate loop: the prompt evaluated (reusing the KV cache's common prefix), tokens
sampled one by one under the stop rules and any constraint, text streamed out."""

from __future__ import annotations

import codecs
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from llm_smolq.decode.lookup import DraftPolicy, NgramDrafter
from llm_smolq.decode.sampling import Sampler, SamplingParams
from llm_smolq.defaults import REPEAT_WINDOW
from llm_smolq.model.tokenizer import end_of_turn_ids

if TYPE_CHECKING:
    from llm_smolq.decode.constrained import Constraint
    from llm_smolq.engine.engine import Engine


@dataclass
class Completion:
    """What a generation did, filled in as it runs (usable after an interrupt too)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    repeated_tokens: int = 0  # with finish_reason "repetition": how long the loop ran
    drafted_tokens: int = 0  # lookup decoding: tokens drafted and checked
    accepted_tokens: int = 0  # and of those, the ones the answer kept

    @property
    def tokens_per_second(self) -> float | None:
        n = len(self.output_ids) - 1  # the first token comes out of the prefill
        return round(n / self.decode_seconds, 2) if n > 0 and self.decode_seconds > 0 else None


class RepetitionGuard:
    """Tells when an answer has fallen into a loop: the same span of tokens (up to
    `longest_span` long) repeated back to back until `tokens` tokens in a row equal the
    token one span earlier. A small model at a low temperature can do that until
    max_tokens ("la République, la République, ..."); natural text, lists and code
    vary within a few hundred tokens.

    For every span length p it keeps the run of latest tokens that equal the one p
    back, so a step costs O(longest_span), not a scan of the answer."""

    def __init__(self, tokens: int = 256, longest_span: int = 64):
        if not 1 <= longest_span <= tokens // 2:
            raise ValueError("the longest span must fit twice in the guarded run")
        self.tokens, self.longest_span = tokens, longest_span
        self._recent: deque[int] = deque(maxlen=longest_span + 1)  # the newest last
        self._runs = [0] * (longest_span + 1)  # [p]: tokens in a row equal to the one p back

    def push(self, token: int) -> int:
        """Take the next output token; the length of the repeated text once a run reaches
        `tokens` (the answer should end), else 0."""
        recent, runs = self._recent, self._runs
        recent.append(token)
        for p in range(1, len(recent)):
            runs[p] = runs[p] + 1 if recent[-1 - p] == token else 0
            if runs[p] >= self.tokens:
                return runs[p] + p  # the first copy of the span counts too
        return 0


def prompt_ids(engine: Engine, text: str) -> list[int]:
    """The ids a rendered chat prompt is evaluated as: control-token text as those tokens,
    BOS first when the vocabulary asks for it."""
    ids = engine.tokenize(text, special=True)
    tok = engine.tokenizer
    return [tok.bos_id] + ids if tok.add_bos and tok.bos_id is not None else ids


def prefill(engine: Engine, prompt_ids: Sequence[int], progress: Callable[[int, int], None] | None = None
            ) -> tuple[np.ndarray, int]:
    """Evaluate prompt_ids, reusing the longest prefix already in the KV cache.
    Returns the last position's logits and how many tokens were reused. A prompt longer
    than the context is refused before the cache is touched."""
    if len(prompt_ids) > engine.n_ctx:
        raise ValueError(f"the prompt is {len(prompt_ids)} tokens but the context holds {engine.n_ctx}; "
                         "shorten it or load with a larger n_ctx")
    cached = engine.tokens
    common = 0
    for a, b in zip(cached, prompt_ids):
        if a != b:
            break
        common += 1
    common = min(common, len(prompt_ids) - 1)  # the last token must run to give logits
    engine.truncate(common)
    return engine.eval(list(prompt_ids[common:]), progress=progress), common


class TextStream:
    """Incremental detokenization: bytes in, complete UTF-8 text out, holding back any
    tail that could still become one of the stop strings."""

    def __init__(self, stops: Sequence[str]):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._pending = ""
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        self._pending += self._utf8.decode(data)
        for stop in self._stops:
            at = self._pending.find(stop)
            if at >= 0:
                self._pending = self._pending[:at]
                self.stopped = True
        release = len(self._pending) if self.stopped else self._safe_length()
        out, self._pending = self._pending[:release], self._pending[release:]
        self.text += out
        return out

    def flush(self) -> str:
        out = self._pending + ("" if self.stopped else self._utf8.decode(b"", final=True))
        self._pending = ""
        self.text += out
        return out

    def _safe_length(self) -> int:
        """Length of pending text that cannot be the start of a stop string."""
        keep = max((partial_suffix(self._pending, stop) for stop in self._stops), default=0)
        return len(self._pending) - keep


def generate(
    engine: Engine,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    max_tokens: int,
    stops: Sequence[str] = (),
    completion: Completion | None = None,
    constraint: Constraint | None = None,
    progress: Callable[[int, int], None] | None = None,
    guard: RepetitionGuard | None = None,
    lookup: int = 0,
) -> Iterator[str]:
    """Yield text as it is produced. Stops at an end-of-turn token, a stop string,
    max_tokens, a full context, or (with a `guard`) a loop of repeated text;
    `completion` records which, and the counts.

    With a `constraint`, only tokens its grammar allows are sampled, and the answer ends
    ("stop") once the grammar is complete and nothing but end-of-turn may follow. Cut
    short by max_tokens, a stop string or the context, the text is an incomplete value.
    `progress` follows the prefill of what the cache does not hold (see Engine.eval).

    `lookup` > 0: lookup decoding (decode/lookup.py), drafts of up to that many tokens
    checked in one batch; the output is the same as without it."""
    done = completion if completion is not None else Completion()
    done.prompt_tokens = len(prompt_ids)
    sampler, enders, stream = Sampler(params), end_of_turn_ids(engine.tokenizer), TextStream(stops)
    started = time.perf_counter()
    logits, done.cached_tokens = prefill(engine, prompt_ids, progress)
    done.prefill_seconds = time.perf_counter() - started
    started = time.perf_counter()
    recent = list(prompt_ids[-REPEAT_WINDOW:])
    drafter, policy = (NgramDrafter(prompt_ids), DraftPolicy(lookup)) if lookup > 0 else (None, None)
    check: list = []  # the draft being checked: [tokens drafted, kept so far, seconds its batch took, n-gram length]
    # Drafted tokens in the KV cache past the answer, each with the logits after it, and the
    # positions plain decoding's cache would hold: every exit trims the cache back to those.
    ahead: list[tuple[int, np.ndarray]] = []
    kept = engine.n_past
    try:
        while True:
            if constraint is not None:
                logits = constraint.mask(logits)
            token = sampler(logits, recent)
            if token in enders:
                done.finish_reason = "stop"
                break
            if constraint is not None:
                constraint.consume(token)
            done.output_ids.append(token)
            recent.append(token)
            text = stream.push(engine.tokenizer.token_to_bytes(token))
            if text:
                yield text
            if stream.stopped or (constraint is not None and constraint.finished):
                done.finish_reason = "stop"
                break
            if guard is not None and (repeated := guard.push(token)):
                done.finish_reason, done.repeated_tokens = "repetition", repeated
                break
            if len(done.output_ids) >= max_tokens:
                done.finish_reason = "length"
                break
            if kept >= engine.n_ctx:
                done.finish_reason = "context"
                break
            if drafter is not None:
                drafter.append(token)
            if ahead:  # the draft holds while the samples agree with it
                if token == ahead[0][0]:
                    done.accepted_tokens += 1
                    check[1] += 1
                    logits, kept = ahead.pop(0)[1], kept + 1
                    if not ahead:
                        policy.checked(*check)
                    continue
                ahead.clear()
                engine.truncate(kept)
                policy.checked(*check)
            room = min(max_tokens - len(done.output_ids) - 1, engine.n_ctx - kept - 1)
            order = drafter.order() if drafter is not None else 0  # 0: nothing to draft from
            draft = drafter.draft(policy.length(room, order)) if order else []
            step = time.perf_counter()
            if not draft:
                logits, kept = engine.eval([token]), kept + 1
                if drafter is not None:
                    policy.stepped(time.perf_counter() - step)
                continue
            rows = engine.eval([token, *draft], all_logits=True, step_order=True)
            done.drafted_tokens += len(draft)
            check = [len(draft), 0, time.perf_counter() - step, order]
            logits, ahead, kept = rows[0], list(zip(draft, rows[1:])), kept + 1
        tail = stream.flush()
        if tail:
            yield tail
    finally:
        if engine.n_past > kept:
            engine.truncate(kept)
        done.decode_seconds = time.perf_counter() - started


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
