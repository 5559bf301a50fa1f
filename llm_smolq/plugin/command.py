"""The llm command an answer runs under: where its notices go (stderr, after llm has
printed and logged the answer) and the exit status a one-shot prompt ends with; and the
wrapping of llm's `prompt` and `chat` commands that makes that possible."""

from __future__ import annotations

import errno
import functools
import io
import os
import re
import signal
import stat
import sys
from dataclasses import dataclass, field
from typing import NoReturn

import click

from llm_smolq.plugin.logs_db import logging_one_at_a_time, migrate_logs_db


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


def wrap_llm_commands(cli: click.Group) -> None:
    """Wrap llm's `prompt` and `chat` commands: logs.db is migrated, and answers logged, one
    process at a time (plugin/logs_db.py); a refusal of tools names a model that has them; `prompt` also ends
    with what its answer left (AfterPrompt), and quietly when its reader has gone."""
    _wrap(cli, "prompt", _prompt_callback)
    _wrap(cli, "chat", _chat_callback)


def _wrap(cli: click.Group, name: str, make) -> None:
    command = cli.commands.get(name)
    if command is None or command.callback is None or getattr(command.callback, "smolq_wrapped", False):
        return
    callback = functools.wraps(command.callback)(make(command.callback))
    callback.smolq_wrapped = True
    command.callback = callback


def _prompt_callback(original):
    def callback(*args, **kwargs):
        ctx = click.get_current_context()
        after = ctx.meta.setdefault(AFTER_PROMPT, AfterPrompt())
        migrate_logs_db(kwargs.get("database"))
        try:
            with logging_one_at_a_time():
                result = original(*args, **kwargs)
            after.run(ctx)
        except click.ClickException as exc:  # what llm raised while answering, as its message
            if _stdout_closed(exc):
                _end_quietly(ctx)
            better = _reworded(exc.message)
            if better is None:
                raise
            raise click.ClickException(better) from None
        except OSError as exc:  # from the flush above, or from llm as it is under pytest
            if not _stdout_closed(exc):
                raise
            _end_quietly(ctx)
        return result

    return callback


#: The status a shell reports for `seq 1000000 | head -1` and every program that SIGPIPE
#: ends when its reader goes away: 128 + SIGPIPE (13 wherever there is one). Windows has
#: no SIGPIPE, and no convention of its own: the same status there.
EXIT_STDOUT_CLOSED = 128 + int(getattr(signal, "SIGPIPE", 13))


def _stdout_closed(exc: BaseException) -> bool:
    """Whether llm's error is a write to a pipe nobody reads any more: it reports its own
    OSErrors as "Error: [Errno 32] Broken pipe", a ClickException raised from them. On
    Windows such a write fails with EINVAL instead (the C runtime has no errno for the
    pipe's ERROR_NO_DATA): taken as the pipe closed when stdout is a pipe."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, BrokenPipeError):
            return True
        if sys.platform == "win32" and isinstance(exc, OSError) and exc.errno == errno.EINVAL and _stdout_is_pipe():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _stdout_is_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no descriptor (a test runner's)
        return False


def _end_quietly(ctx: click.Context) -> NoReturn:
    """`llm ... | head -1`: the reader has what it wanted, so stop as the tools around it
    do: nothing more on stdout or stderr (the notices of an answer cut short are moot), exit
    status 141. stdout goes to /dev/null so Python's last flush of what is left in its
    buffer, at exit, cannot fail and print "Exception ignored ... BrokenPipeError"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):  # a stdout with no descriptor (click's test runner)
        pass
    ctx.exit(EXIT_STDOUT_CLOSED)


def _chat_callback(original):
    def callback(*args, **kwargs):
        migrate_logs_db(kwargs.get("database"))
        try:
            with logging_one_at_a_time():
                return original(*args, **kwargs)
        except ValueError as exc:  # `llm chat` lets llm's refusal out as a traceback
            better = _reworded(str(exc))
            if better is None:
                raise
            raise click.ClickException(better) from None

    return callback


def _reworded(message: str) -> str | None:
    """Our words for a refusal llm makes about one of these models, else None: llm says
    "SmolQ: smollm2-q does not support tools" and no more."""
    from llm_smolq.plugin.abilities import NAME_PREFIX, no_tools

    match = re.fullmatch(re.escape(NAME_PREFIX) + r"(\S+) does not support tools", message)
    return no_tools(match.group(1)) if match else None


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
