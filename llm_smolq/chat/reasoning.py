"""SmolLM3's reasoning (`<think>...</think>`) told apart from its answer as text streams in."""

from __future__ import annotations

from llm_smolq.decode.generate import partial_suffix


class ReasoningSplitter:
    """Separates SmolLM3's `<think>…</think>` preamble from the answer in a text stream.
    push() returns (kind, text) pieces, kind "reasoning" or "text"."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self) -> None:
        self._state = "start"  # start -> thinking -> answer, or start -> answer
        self._buf = ""
        self._fresh = True  # nothing of the reasoning emitted yet

    def push(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        out: list[tuple[str, str]] = []
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(self.OPEN):
                self._buf, self._state = head[len(self.OPEN):], "thinking"
            elif self.OPEN.startswith(head):
                return out  # not enough text yet to tell
            else:
                self._state = "answer"
        if self._state == "thinking":
            if self._fresh:  # the template's newline after <think> is not reasoning
                self._buf = self._buf.lstrip("\n")
                if not self._buf:
                    return out
                self._fresh = False
            at = self._buf.find(self.CLOSE)
            if at < 0:
                keep = partial_suffix(self._buf, self.CLOSE)
                if len(self._buf) > keep:
                    out.append(("reasoning", self._buf[: len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
                return out
            if at:
                out.append(("reasoning", self._buf[:at]))
            self._buf, self._state = self._buf[at + len(self.CLOSE):], "after_think"
        if self._state == "after_think":
            self._buf = self._buf.lstrip()
            if not self._buf:
                return out
            self._state = "answer"
        if self._state == "answer" and self._buf:
            out.append(("text", self._buf))
            self._buf = ""
        return out

    def flush(self) -> list[tuple[str, str]]:
        kind = "reasoning" if self._state == "thinking" else "text"
        out = [(kind, self._buf)] if self._buf else []
        self._buf = ""
        return out
