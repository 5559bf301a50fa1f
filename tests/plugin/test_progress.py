"""A long prefill's progress line: on a terminal's stderr after 2 seconds, rewritten in
place and cleared at the end; never on a pipe, so never in an answer or a log."""

import io
import sys

import numpy as np
from click.testing import CliRunner
from llm.cli import cli

import llm_smolq
from llm_smolq.engine.engine import MAX_BATCH
from llm_smolq.plugin.progress import PrefillProgress


class Terminal(io.StringIO):
    def isatty(self):
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return True


class Clock:
    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        t, self.now = self.now, self.now + self.step
        return t


def test_short_prefills_print_nothing_and_long_ones_a_line_rewritten_then_cleared():
    out = Terminal()
    progress = PrefillProgress(out, after=2.0, clock=Clock(0.75))  # each reading 0.75 s later
    for done in (256, 512, 768, 1024):
        progress(done, 1024)
    # readings at 0.75, 1.5 (silent), 2.25 (768 at 2.25 s: 341 tok/s), then the end clears it
    assert out.getvalue() == "\rprefill 768 / 1,024 tokens, 341 tok/s\033[K\r\033[K"
    quiet = Terminal()
    fast = PrefillProgress(quiet, after=2.0, clock=Clock(0.1))
    for done in (256, 512, 768):
        fast(done, 768)
    assert quiet.getvalue() == ""


def test_only_a_terminal_gets_one():
    assert PrefillProgress.for_terminal(Terminal()) is not None
    assert PrefillProgress.for_terminal(io.StringIO()) is None  # a pipe or a file
    closed = Terminal()
    closed.close()
    assert PrefillProgress.for_terminal(closed) is None


def test_eval_reports_each_batch(reference_dir):
    eng = llm_smolq.load(reference_dir / "tiny-smollm3-Q8_0.gguf", n_ctx=1024, threads=1)
    seen = []
    eng.eval(np.arange(3, 3 + 2 * MAX_BATCH + 10).tolist(), progress=lambda done, total: seen.append((done, total)))
    total = 2 * MAX_BATCH + 10
    assert seen == [(MAX_BATCH, total), (2 * MAX_BATCH, total), (total, total)]


def long_prompt(word):  # three batches of SmolLM2's prompt, none of it in the KV cache yet
    return f"{word} " * 700


def test_llm_on_a_pipe_prints_only_the_answer(user_dir, monkeypatch):
    """CliRunner's stderr is no terminal: a prompt of many batches makes no progress line."""
    from llm_smolq.plugin import progress

    made = []
    real = progress.PrefillProgress.for_terminal.__func__
    monkeypatch.setattr(progress.PrefillProgress, "for_terminal",
                        classmethod(lambda cls, stream: made.append(real(cls, stream)) or made[-1]))
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "max_tokens", "2", "-o", "temperature", "0",
                                      long_prompt("word")])
    assert result.exit_code == 0
    assert made == [None]  # asked once, for a stream that is not a terminal
    assert "prefill" not in result.output and "\033[K" not in result.output


def test_on_a_terminal_the_line_goes_to_stderr_not_into_the_answer(user_dir, monkeypatch):
    import llm

    from llm_smolq.plugin import progress

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress.PrefillProgress, "for_terminal",  # at once, not after 2 s
                        classmethod(lambda cls, stream: cls(stream, after=0.0) if stream.isatty() else None))
    response = llm.get_model("smollm2-q").prompt(long_prompt("text"), max_tokens=2, temperature=0)
    text = response.text()
    assert "prefill" not in text
    lines = terminal.getvalue()
    assert lines.startswith("\rprefill 256 / ") and lines.endswith("\r\033[K"), lines
    assert response.input_tokens > 2 * MAX_BATCH
