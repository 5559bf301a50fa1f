"""Progress of a long prompt's prefill, on a terminal's stderr only: a piped answer, a
log or a script reading stdout never sees it."""

from __future__ import annotations

import time
from typing import Callable, TextIO


class PrefillProgress:
    """Called after each batch with (tokens done, tokens in all). Silent for the first
    `after` seconds, so that short prompts print nothing; then one line, rewritten in
    place ("prefill 4,096 / 8,000 tokens, 212 tok/s"), cleared when the prefill ends."""

    def __init__(self, stream: TextIO, after: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.stream, self.after, self.clock = stream, after, clock
        self.started = clock()
        self.shown = False

    @classmethod
    def for_terminal(cls, stream: TextIO) -> PrefillProgress | None:
        """A progress line for `stream` if it is a terminal, else None."""
        try:
            return cls(stream) if stream.isatty() else None
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            return None

    def __call__(self, done: int, total: int) -> None:
        elapsed = self.clock() - self.started
        if done >= total:
            self.finish()
            return
        if elapsed < self.after:
            return
        rate = done / elapsed if elapsed > 0 else 0.0
        self.stream.write(f"\rprefill {done:,} / {total:,} tokens, {rate:,.0f} tok/s\033[K")
        self.stream.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False
