"""The generate loop: the prompt evaluated (reusing the KV cache's common prefix), tokens
sampled one by one under the stop rules and any constraint, text streamed out."""

from __future__ import annotations

import codecs
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from llm_smolq.decode.lookup import Draft, DraftPolicy, NgramDrafter
from llm_smolq.decode.sampling import Sampler, SamplingParams
from llm_smolq.defaults import REPEAT_WINDOW
from llm_smolq.model.tokenizer import end_of_turn_ids

if TYPE_CHECKING:
    from llm_smolq.decode.constrained import Constraint
    from llm_smolq.decode.json_closing import JsonCloser
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
    closed_early: bool = False  # a JSON answer that max_tokens, the context or the guard cut, closed validly

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
    ("stop") once the grammar is complete and nothing but end-of-turn may follow. A JSON
    schema's answer is valid whenever it ends: enough of max_tokens and of the context is
    kept in hand to close it, and when either would be used up, or the guard finds a loop,
    the shortest ending the schema allows is written instead of samples
    (decode/json_closing.py); finish_reason then says why and `closed_early` is set. Stop
    strings do not apply to it (the grammar says where it ends).
    `progress` follows the prefill of what the cache does not hold (see Engine.eval).

    `lookup` > 0: lookup decoding (decode/lookup.py), drafts of up to that many tokens
    checked in one batch; the output is the same as without it."""
    run = Generation.start(engine, prompt_ids, params, completion, progress,
                           max_tokens=max_tokens, stops=stops, constraint=constraint, guard=guard, lookup=lookup)
    try:
        while True:
            token = run.next_token()
            if token in run.enders:  # the model ends its turn (or a closed answer ends)
                run.done.finish_reason = run.closing_for or "stop"
                break
            run.constrain(token)
            text = run.record(token)
            if text:
                yield text
            reason = run.stop_reason(token)
            if reason is not None:
                run.done.finish_reason = reason
                break
            run.step(token)
        tail = run.stream.flush()
        if tail:
            yield tail
    finally:
        run.close()


@dataclass
class Generation:
    """One answer as it is produced: everything the loop in `generate` reads and changes.

    `kept` counts the KV cache positions that plain decoding would hold: the prompt and
    the answer but its newest token (which `step` evaluates). While a lookup draft is
    checked the cache holds the draft's unchecked rest past them; every way out of the
    loop trims it back (`close`)."""

    engine: Engine
    done: Completion  # the output so far, why it ended, the counts callers read
    sampler: Sampler
    stream: TextStream  # the text so far, held back while it may begin a stop string
    enders: set[int]  # end-of-turn tokens
    max_tokens: int
    constraint: Constraint | None
    guard: RepetitionGuard | None
    drafter: NgramDrafter | None  # lookup decoding: where drafts come from,
    policy: DraftPolicy | None  # and how long they are worth making
    logits: np.ndarray  # the next token's
    kept: int
    recent: list[int]  # what the repeat penalty looks back on: the prompt's end, then the answer
    draft: Draft | None = None  # a lookup draft being checked
    started: float = 0.0  # when decoding began (perf_counter)
    closer: JsonCloser | None = None  # a JSON schema's answer: how to close it from here
    closing: list[int] = field(default_factory=list)  # the closing's tokens still to write
    closing_for: str | None = None  # why the answer is being closed: "length", "context" or "repetition"

    @classmethod
    def start(cls, engine: Engine, prompt_ids: Sequence[int], params: SamplingParams, completion: Completion | None,
              progress: Callable[[int, int], None] | None, *, max_tokens: int, stops: Sequence[str],
              constraint: Constraint | None, guard: RepetitionGuard | None, lookup: int) -> Generation:
        """The prompt evaluated (the cache's common prefix reused) and the answer's state set."""
        done = completion if completion is not None else Completion()
        done.prompt_tokens = len(prompt_ids)
        closer = None
        if getattr(constraint, "schema", None) is not None:
            from llm_smolq.decode.json_closing import JsonCloser
            from llm_smolq.errors import ConstraintError

            closer, stops = JsonCloser(constraint), ()
            if max_tokens < closer.length():
                raise ConstraintError(f"max_tokens={max_tokens} is too few for this schema: its shortest valid "
                                      f"answer takes {closer.length()} tokens")
        sampler, enders, stream = Sampler(params), end_of_turn_ids(engine.tokenizer), TextStream(stops)
        started = time.perf_counter()
        logits, done.cached_tokens = prefill(engine, prompt_ids, progress)
        done.prefill_seconds = time.perf_counter() - started
        drafter, policy = (NgramDrafter(prompt_ids), DraftPolicy(lookup)) if lookup > 0 else (None, None)
        return cls(engine=engine, done=done, sampler=sampler, stream=stream, enders=enders, max_tokens=max_tokens,
                   constraint=constraint, guard=guard, drafter=drafter, policy=policy, logits=logits,
                   kept=engine.n_past, recent=list(prompt_ids[-REPEAT_WINDOW:]), started=time.perf_counter(),
                   closer=closer)

    @property
    def budget(self) -> int:
        """Tokens the answer may still take under max_tokens."""
        return self.max_tokens - len(self.done.output_ids)

    # -- one token: drawn (or the closing's next), taken by the grammar, added to the answer --

    def next_token(self) -> int:
        """The closing's next token while a JSON answer is being closed; else a sample,
        unless what is left of max_tokens or of the context is no more than the closing
        may need after one more token: then the closing starts."""
        if self.closer is not None and not self.closing and self.closing_for is None:
            room = self.engine.n_ctx - self.kept
            if min(self.budget, room) <= self.closer.reserve():
                self.close_json("length" if self.budget <= room else "context")
        if self.closing:
            return self.closing.pop(0)
        if self.closing_for is not None:  # complete as it stands: nothing to write
            return min(self.enders)
        return self.sample()

    def close_json(self, reason: str) -> None:
        """Write the shortest ending the schema allows from here on, for `reason`."""
        self.closing, self.closing_for = self.closer.tokens(), reason
        self.done.closed_early = True

    def sample(self) -> int:
        """The next token, drawn from the logits under the constraint's mask."""
        logits = self.logits if self.constraint is None else self.constraint.mask(self.logits)
        return self.sampler(logits, self.recent)

    def constrain(self, token: int) -> None:
        """The grammar moves past `token` (one its mask allowed)."""
        if self.constraint is not None:
            self.constraint.consume(token)

    def record(self, token: int) -> str:
        """`token` joins the answer; returns the text that can be released now."""
        self.done.output_ids.append(token)
        self.recent.append(token)
        return self.stream.push(self.engine.tokenizer.token_to_bytes(token))

    # -- the stop rules --------------------------------------------------------------------------

    def stop_reason(self, token: int) -> str | None:
        """Why the answer ends with `token` just recorded, or None to go on: a stop string
        or a complete grammar ("stop"), a loop of repeated text ("repetition", with a
        guard), no budget left ("length"), no room in the context for `token` ("context").
        An end-of-turn token ends the answer before it is recorded (the loop checks it)."""
        if self.closing_for is not None:  # a JSON answer being closed ends with its closing
            return None if self.closing else self.closing_for
        if self.stream.stopped or (self.constraint is not None and self.constraint.finished):
            return "stop"
        if self.repeating(token):
            if self.closer is None:
                return "repetition"
            self.close_json("repetition")
            return None if self.closing else "repetition"
        if self.budget <= 0:
            return "length"
        if self.kept >= self.engine.n_ctx:
            return "context"
        return None

    def repeating(self, token: int) -> bool:
        """The repetition guard, given the answer's newest token: True once the answer is a
        loop, its length in done.repeated_tokens."""
        repeated = self.guard.push(token) if self.guard is not None else 0
        if repeated:
            self.done.repeated_tokens = repeated
        return repeated > 0

    # -- into the KV cache: a kept draft token, one step, or a batch with a new draft ----------

    def step(self, token: int) -> None:
        """Put `token` in the KV cache and take the logits after it: from the draft being
        checked when `token` is what it drafted next, else by evaluating it (with a new
        draft after it when lookup finds one worth making)."""
        if self.drafter is not None:
            self.drafter.append(token)
        if self.draft is not None and self.check_draft(token):
            return
        self.evaluate(token)

    def check_draft(self, token: int) -> bool:
        """Compare `token` with the draft's next token. The same: it is kept (already in the
        cache, its row the next logits). Different: the draft's rest leaves the cache. The
        policy learns how the draft did once it is decided either way."""
        draft = self.draft
        kept = token == draft.expected
        if kept:
            self.logits, self.kept = draft.accept(), self.kept + 1
            self.done.accepted_tokens += 1
        else:
            self.engine.truncate(self.kept)
        if not kept or draft.all_kept:
            self.policy.judged(draft)
            self.draft = None
        return kept

    def evaluate(self, token: int) -> None:
        """Evaluate `token`: one step, or one batch with a draft of what follows it when the
        text's ending occurred before and the policy finds a draft worth its check."""
        room = min(self.budget, self.engine.n_ctx - self.kept) - 1  # for drafted tokens after `token`
        order = self.drafter.order() if self.drafter is not None else 0  # 0: nothing to draft from
        tokens = self.drafter.draft(self.policy.length(room, order)) if order else []
        started = time.perf_counter()
        if not tokens:
            self.logits, self.kept = self.engine.eval([token]), self.kept + 1
            if self.policy is not None:
                self.policy.stepped(time.perf_counter() - started)
            return
        rows = self.engine.eval([token, *tokens], all_logits=True)
        self.done.drafted_tokens += len(tokens)
        self.draft = Draft(tokens, rows[1:], order, time.perf_counter() - started)
        self.logits, self.kept = rows[0], self.kept + 1

    def close(self) -> None:
        """The cache trimmed back to `kept` (a draft's unchecked rest), the decode time recorded."""
        if self.engine.n_past > self.kept:
            self.engine.truncate(self.kept)
        self.done.decode_seconds = time.perf_counter() - self.started


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
