"""The llm command an answer runs under: where its notices go (stderr, after llm has
printed and logged the answer) and the exit status a one-shot prompt ends with."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field

import click


AFTER_PROMPT = "llm_smolq.after_prompt"  # the key of an AfterPrompt in click's ctx.meta


@dataclass
class AfterPrompt:
    """What an answer leaves for the end of llm's `prompt` command, once llm has printed
    the answer (and its newline) and logged it: notices for stderr, an exit status."""

    notices: list[str] = field(default_factory=list)
    exit_code: int | None = None

    def run(self, ctx: click.Context) -> None:
        sys.stdout.flush()  # the answer first, where both streams go to one terminal
        for line in self.notices:
            click.echo(f"llm-smolq: {line}", err=True)
        if self.exit_code is not None:
            ctx.exit(self.exit_code)


def finish_after_prompt(cli: click.Group) -> None:
    command = cli.commands.get("prompt")
    if command is None or command.callback is None or getattr(command.callback, "smolq_after", False):
        return
    original = command.callback

    @functools.wraps(original)
    def callback(*args, **kwargs):
        ctx = click.get_current_context()
        after = ctx.meta.setdefault(AFTER_PROMPT, AfterPrompt())
        result = original(*args, **kwargs)
        after.run(ctx)
        return result

    callback.smolq_after = True
    command.callback = callback


@dataclass(frozen=True)
class Command:
    """The llm command an answer runs under (ctx None: the Python API). Notices about the
    answer go to its stderr, never into the answer; the API reads finish_reason instead."""

    ctx: click.Context | None

    @classmethod
    def current(cls) -> Command:
        return cls(click.get_current_context(silent=True))

    @property
    def _after(self) -> AfterPrompt | None:
        return self.ctx.meta.get(AFTER_PROMPT) if self.ctx is not None else None

    def tell(self, line: str) -> None:
        """One line on stderr: after the answer's line for a one-shot prompt; in `llm
        chat`, on a line of its own right away; elsewhere (another program's click
        command using the Python API) nothing."""
        if self._after is not None:
            self._after.notices.append(line)
        elif self.ctx is not None and self.ctx.info_name == "chat":
            sys.stdout.flush()
            click.echo(f"\nllm-smolq: {line}", err=True)

    def exit_when_done(self, code: int) -> None:
        """A one-shot `llm prompt` exits with `code` once llm has logged the answer and
        the notices are out (`llm chat` goes on to the next prompt)."""
        if self._after is not None:
            self._after.exit_code = code
