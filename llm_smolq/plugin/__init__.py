"""The llm hooks: models, their options, and the `llm smolq` commands."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Iterator, Optional, Union

import click
import llm
from llm.parts import StreamEvent
from pydantic import Field, field_validator

from llm_smolq.store import catalog

if TYPE_CHECKING:  # the kernel, gguf and jinja2 load on first use, not on every `llm` start
    from llm_smolq.chat.template import ChatTemplate
    from llm_smolq.engine.engine import Engine
    from llm_smolq.plugin.turn import Command

DEFAULT_MAX_TOKENS = 1024


@llm.hookimpl
def register_models(register):
    for record in catalog.list_models():
        abilities = {"tools": record.tools, "thinking": record.thinking}
        register(SmolQModel(record.id, **abilities), AsyncSmolQModel(record.id, **abilities),
                 aliases=tuple(record.aliases))


@llm.hookimpl
def register_commands(cli):
    from llm_smolq.plugin.commands import register_commands as add_commands

    add_commands(cli)
    _finish_after_prompt(cli)


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


def _finish_after_prompt(cli: click.Group) -> None:
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


class SmolQOptions(llm.Options):
    max_tokens: Optional[int] = Field(
        default=None, ge=1, description=f"Most tokens to generate (default {DEFAULT_MAX_TOKENS})"
    )
    temperature: Optional[float] = Field(
        default=None, ge=0.0, le=5.0, description="Sampling temperature; 0 is greedy (default per model card)"
    )
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, description="Nucleus sampling: keep this much probability")
    top_k: Optional[int] = Field(default=None, ge=0, description="Keep only the k likeliest tokens; 0 keeps all")
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0, description="Drop tokens below min_p x the top probability")
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0, le=5.0, description="Penalty for the last 64 tokens (1.0: off)")
    seed: Optional[int] = Field(default=None, ge=0, description="Random seed for reproducible sampling")
    stop: Optional[Union[str, list[str]]] = Field(
        default=None, description='Stop when this text appears; a JSON list of strings (\'["sea", "waves"]\') '
                                  'stops at any of them (text that itself reads as such a list: \'["[1, 2]"]\')'
    )
    n_ctx: Optional[int] = Field(
        default=None, ge=16, le=1 << 20,
        description="Context length in tokens (default: the model's whole window, as far as memory holds it)"
    )
    rope_scaling: Optional[str] = Field(
        default=None, description="yarn: extend the window with YaRN (by rope_scale, else n_ctx over the trained "
                                  "context, else 2x); none: turn off a file's own"
    )
    rope_scale: Optional[float] = Field(default=None, ge=1.0, le=1024.0, description="YaRN's factor")
    kv_cache: Optional[str] = Field(
        default=None, description="KV cache type: f16 (default), q8_0 (about half the memory) or f32 "
                                  "(llama.cpp's exact attention order)"
    )
    threads: Optional[int] = Field(default=None, ge=1, le=256, description="CPU threads (default: all cores)")
    prompt_cache: Optional[bool] = Field(
        default=None, description="Keep the prompt's state on disk so `llm -c` skips re-reading it (default true)"
    )
    repeat_guard: Optional[bool] = Field(
        default=None, description="End an answer that repeats the same span over and over for a few hundred "
                                  "tokens, finish_reason 'repetition' (default true)"
    )

    @field_validator("kv_cache")
    @classmethod
    def _known_kv_cache(cls, value):
        from llm_smolq.engine.kv_types import KV_TYPES

        if value is not None and value not in KV_TYPES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_TYPES)}")
        return value

    @field_validator("rope_scaling")
    @classmethod
    def _known_rope_scaling(cls, value):
        if value is not None and value not in ("yarn", "none"):
            raise ValueError("rope_scaling must be yarn or none")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list_from_json(cls, value):
        # llm hands command-line values over as text: '["sea", "waves"]' means two stops
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                parsed = json.loads(value)
            except ValueError:
                return value
            if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
                return parsed
        return value

    @field_validator("stop")
    @classmethod
    def _stops_are_text(cls, value):
        stops = [value] if isinstance(value, str) else value
        if stops is not None and not all(stops):
            raise ValueError("stop strings must not be empty")
        return value


class ThinkingOptions(SmolQOptions):
    """For models whose chat template has a <think> switch (SmolLM3)."""

    thinking: Optional[bool] = Field(default=None, description="Reason in <think> before answering (default true)")


@dataclass(frozen=True)
class EngineOptions:
    """What an engine is made for: the options that change it (None: the defaults)."""

    n_ctx: int | None = None
    threads: int | None = None
    kv_cache: str | None = None
    rope_scaling: str | None = None
    rope_scale: float | None = None

    @classmethod
    def of(cls, opts) -> EngineOptions:
        return cls(opts.n_ctx, opts.threads, opts.kv_cache, opts.rope_scaling, opts.rope_scale)


@dataclass
class Loaded:
    """A model file in memory: its engine (weights + KV cache), chat template, and the
    lock that lets one generation at a time use the cache."""

    engine: Engine
    template: ChatTemplate
    made_for: EngineOptions  # the options it was loaded for
    lock: threading.Lock = field(default_factory=threading.Lock)


# Kept at module level, keyed by file, so a chat's next turn (and a second get_model())
# reuses the weights and the KV cache instead of loading again.
_loaded: dict[str, Loaded] = {}
_loaded_lock = threading.Lock()


def load_model(path: Path, want: EngineOptions) -> Loaded:
    """The model at path with an engine as `want` asks (n_ctx None: the whole window, as
    far as memory holds it), reusing the loaded one when it was made the same way."""
    from llm_smolq.chat.template import chat_template_from_metadata
    from llm_smolq.engine.engine import Engine
    from llm_smolq.engine.kv_types import DEFAULT_KV_TYPE
    from llm_smolq.model.model_file import open_model

    key = str(path.resolve())
    with _loaded_lock:
        hit = _loaded.get(key)
        if hit and replace(hit.made_for, threads=None) == replace(want, threads=None) and want.threads in (
                None, hit.engine.threads):
            return hit
        _loaded.pop(key, None)  # let a differently sized engine go before loading another
        try:
            model = open_model(path)
            engine = Engine(model, n_ctx=want.n_ctx, threads=want.threads, kv_dtype=want.kv_cache or DEFAULT_KV_TYPE,
                            rope_scaling=want.rope_scaling, rope_scale=want.rope_scale)
            engine.tokenizer  # built now, so a broken vocabulary is refused with the rest
            template = chat_template_from_metadata(model.metadata)
        except ValueError as exc:  # GGUFError, ResourceError, ChatTemplateError and bad sizes
            raise llm.ModelError(str(exc)) from None
        _loaded[key] = Loaded(engine, template, want)
        return _loaded[key]


class _SmolQ:
    can_stream = True
    supports_schema = True

    def __init__(self, model_id: str, tools: bool = False, thinking: bool = False):
        self.model_id = model_id
        self.supports_tools = tools  # its template has a tool format: see chat/tool_calls.py
        self.Options = ThinkingOptions if thinking else SmolQOptions

    def __str__(self) -> str:
        return f"SmolQ: {self.model_id}"

    def run(self, prompt: llm.Prompt, response, command: Command) -> Iterator[Union[str, StreamEvent]]:
        from llm_smolq.plugin.turn import answer

        opts = prompt.options
        try:
            path = catalog.resolve(self.model_id)
        except catalog.ModelNotFound as exc:
            raise llm.ModelError(str(exc)) from None
        loaded = load_model(path, EngineOptions.of(opts))
        return answer(loaded, prompt, response, self.model_id, path, command)


class SmolQModel(_SmolQ, llm.Model):
    def execute(self, prompt, stream, response, conversation):
        from llm_smolq.plugin.turn import Command

        yield from self.run(prompt, response, Command.current())


class AsyncSmolQModel(_SmolQ, llm.AsyncModel):
    async def execute(self, prompt, stream, response, conversation) -> AsyncIterator:
        from llm_smolq.plugin.turn import Command

        # The kernel releases the GIL, so a worker thread keeps the event loop free; the
        # command is looked up here, on the thread where click keeps it.
        chunks = await asyncio.to_thread(self.run, prompt, response, Command.current())
        done = object()
        while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
            yield chunk
