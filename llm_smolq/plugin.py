"""The llm hooks: models, their options, and the `llm smolq` commands."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Iterator, Optional, Union

import llm
from llm.parts import StreamEvent
from pydantic import Field, field_validator

from . import catalog

if TYPE_CHECKING:  # the kernel, gguf and jinja2 load on first use, not on every `llm` start
    from .chat_template import ChatTemplate
    from .constrained import Constraint
    from .engine import Engine

DEFAULT_MAX_TOKENS = 1024


@llm.hookimpl
def register_models(register):
    for record in catalog.list_models():
        register(SmolQModel(record.id), AsyncSmolQModel(record.id), aliases=tuple(record.aliases))


@llm.hookimpl
def register_commands(cli):
    from .commands import register_commands as add_commands

    add_commands(cli)


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
    stop: Optional[Union[str, list[str]]] = Field(default=None, description="Stop when this text (or any of these) appears")
    n_ctx: Optional[int] = Field(
        default=None, ge=16, le=131072, description="Context length in tokens (default 4096; capped at the model's own)"
    )
    threads: Optional[int] = Field(default=None, ge=1, le=256, description="CPU threads (default: all cores)")
    thinking: Optional[bool] = Field(default=None, description="SmolLM3: reason in <think> before answering (default true)")
    prompt_cache: Optional[bool] = Field(
        default=None, description="Keep the prompt's state on disk so `llm -c` skips re-reading it (default true)"
    )

    @field_validator("stop")
    @classmethod
    def _stops_are_text(cls, value):
        stops = [value] if isinstance(value, str) else value
        if stops is not None and not all(stops):
            raise ValueError("stop strings must not be empty")
        return value


@dataclass
class Loaded:
    """A model file in memory: its engine (weights + KV cache), chat template, and the
    lock that lets one generation at a time use the cache."""

    engine: Engine
    template: ChatTemplate
    lock: threading.Lock = field(default_factory=threading.Lock)


# Kept at module level, keyed by file, so a chat's next turn (and a second get_model())
# reuses the weights and the KV cache instead of loading again.
_loaded: dict[str, Loaded] = {}
_loaded_lock = threading.Lock()


def load_model(path: Path, n_ctx: int, threads: int | None) -> Loaded:
    from .chat_template import chat_template_from_metadata
    from .engine import Engine
    from .model_file import open_model

    key = str(path.resolve())
    with _loaded_lock:
        hit = _loaded.get(key)
        if hit and hit.engine.n_ctx == min(n_ctx, hit.engine.config.context_length) and threads in (
            None, hit.engine.threads
        ):
            return hit
        _loaded.pop(key, None)  # let a differently sized engine go before loading another
        try:
            model = open_model(path)
            engine = Engine(model, n_ctx=min(n_ctx, model.config.context_length), threads=threads)
            engine.tokenizer  # built now, so a broken vocabulary is refused with the rest
            template = chat_template_from_metadata(model.metadata)
        except ValueError as exc:  # GGUFError, ResourceError, ChatTemplateError and bad sizes
            raise llm.ModelError(str(exc)) from None
        _loaded[key] = Loaded(engine, template)
        return _loaded[key]


class _SmolQ:
    can_stream = True
    supports_tools = True  # for templates that have a tool format: see tool_calls.py
    supports_schema = True
    Options = SmolQOptions

    def __init__(self, model_id: str):
        self.model_id = model_id

    def __str__(self) -> str:
        return f"SmolQ: {self.model_id}"

    def run(self, prompt: llm.Prompt, response) -> Iterator[Union[str, StreamEvent]]:
        from .chat_template import ChatTemplateError
        from .errors import ConstraintError
        from .generation import Completion, ReasoningSplitter, SamplingParams, generate, prompt_ids
        from .prompt_cache import CacheActivity, PromptCache
        from .tool_calls import ToolCallGuard, ToolCallParser, template_tools, to_llm

        opts = prompt.options
        try:
            path = catalog.resolve(self.model_id)
        except catalog.ModelNotFound as exc:
            raise llm.ModelError(str(exc)) from None
        loaded = load_model(path, opts.n_ctx or 4096, opts.threads)
        engine = loaded.engine
        smollm3 = engine.config.arch == "smollm3"
        tools = [tool for tool in prompt.tools if isinstance(tool, llm.Tool)]
        extra = template_tools(tools, loaded.template.variables, self.model_id) if tools else {}
        messages = template_messages(prompt)
        constraint = None
        if prompt.schema is not None:
            constraint = schema_constraint(engine, prompt.schema)
            messages = with_schema_instruction(messages, prompt.schema)
        try:
            text = loaded.template.render(
                messages, add_generation_prompt=True,
                # With a schema the answer is the JSON alone: no <think> part before it.
                **({"enable_thinking": opts.thinking is not False and constraint is None} if smollm3 else {}),
                **extra,
            )
        except ChatTemplateError as exc:
            raise llm.ModelError(f"the model's chat template failed: {exc}") from None
        ids = prompt_ids(engine, text)
        if len(ids) >= engine.n_ctx:
            limit = engine.config.context_length
            fix = (f"shorten it or raise the context with -o n_ctx {min(len(ids) * 2, limit)}" if len(ids) < limit
                   else f"shorten it: the model reads at most {limit} tokens")
            raise llm.ModelError(f"the prompt is {len(ids)} tokens but the context holds {engine.n_ctx}; {fix}")
        params = SamplingParams(
            temperature=_pick(opts.temperature, 0.6 if smollm3 else 0.2),
            top_p=_pick(opts.top_p, 0.95 if smollm3 else 0.9),
            top_k=_pick(opts.top_k, 0),
            min_p=_pick(opts.min_p, 0.0),
            repeat_penalty=_pick(opts.repeat_penalty, 1.0),
            seed=opts.seed,
        )
        stops = [opts.stop] if isinstance(opts.stop, str) else list(opts.stop or [])
        try:
            disk = PromptCache.configured() if opts.prompt_cache is not False else None
        except ValueError as exc:  # a malformed SMOLQ_PROMPT_CACHE_SIZE
            raise llm.ModelError(str(exc)) from None
        disk_activity = CacheActivity()
        done = Completion()
        splitter = ReasoningSplitter() if smollm3 and constraint is None else None
        calls = ToolCallParser() if tools else None
        if tools and constraint is None:  # a schema'd answer has no room for calls
            constraint = ToolCallGuard(engine.tokenizer, tools)

        def events(pieces):
            for kind, piece in pieces:
                if kind == "reasoning":
                    yield StreamEvent(type="reasoning", chunk=piece)
                elif calls is None:
                    yield piece
                else:  # tool calls are read from the answer, never from the reasoning
                    yield from to_llm(calls.push(piece), response)

        try:
            with loaded.lock:
                if disk:
                    disk.restore(engine, ids, disk_activity)
                try:
                    for chunk in generate(engine, ids, params, opts.max_tokens or DEFAULT_MAX_TOKENS, stops, done,
                                          constraint):
                        yield from events(splitter.push(chunk) if splitter else [("text", chunk)])
                except KeyboardInterrupt:
                    # Ctrl-C ends the answer, not the program: llm logs what was produced
                    # and `llm chat` goes on. The KV cache holds only completed steps.
                    done.finish_reason = "interrupted"
                except ConstraintError as exc:  # a schema past llguidance's limits mid-answer
                    raise llm.ModelError(f"the schema could not be followed: {exc}; simplify it") from None
                if splitter:
                    yield from events(splitter.flush())
                if calls:
                    yield from to_llm(calls.flush(), response)
                if disk:  # after the answer is out: the wait is not before the first token
                    disk.save(engine, disk_activity)
        finally:
            response.set_usage(
                input=done.prompt_tokens, output=len(done.output_ids), details={"cached": done.cached_tokens}
            )
            response.response_json = {
                "finish_reason": done.finish_reason or "error",
                "tokens_per_second": done.tokens_per_second,
                "prefill_seconds": round(done.prefill_seconds, 3),
                "model_file": str(path),
                **({"prompt_cache": disk_activity.as_json()} if disk else {}),
            }
            if calls and calls.errors:  # blocks that were kept as text, and why
                response.response_json["tool_call_errors"] = calls.errors


def schema_constraint(engine: Engine, schema: dict) -> Constraint:
    from .constrained import Constraint, ConstraintError

    try:
        return Constraint.for_json_schema(engine.tokenizer, schema)
    except ConstraintError as exc:
        raise llm.ModelError(f"the schema cannot be used: {exc}; fix it and try again") from None


def with_schema_instruction(messages: list[dict[str, str]], schema: dict) -> list[dict[str, str]]:
    """The messages with the schema asked for in the system prompt: the constraint makes
    the output valid, the instruction makes the model fill it with the right things."""
    from .constrained import schema_instruction

    instruction = schema_instruction(schema)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def _pick(value, default):
    return default if value is None else value


def template_messages(prompt: llm.Prompt) -> list[dict[str, str]]:
    """llm's Message parts as the {role, content} dicts chat templates read. Reasoning
    from earlier turns is dropped (SmolLM3's template leaves it out as well); tool calls
    and results are written as SmolLM3 reads them (tool_calls.py)."""
    from .tool_calls import message_content, result_messages

    out = []
    for message in prompt.messages:
        if message.role == "tool":
            out.extend(result_messages(message.parts))
            continue
        content = message_content(message.parts)
        if content or message.role != "assistant":
            out.append({"role": message.role, "content": content})
    return out


class SmolQModel(_SmolQ, llm.Model):
    def execute(self, prompt, stream, response, conversation):
        yield from self.run(prompt, response)


class AsyncSmolQModel(_SmolQ, llm.AsyncModel):
    async def execute(self, prompt, stream, response, conversation) -> AsyncIterator:
        # The kernel releases the GIL, so a worker thread keeps the event loop free.
        chunks = self.run(prompt, response)
        done = object()
        while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
            yield chunk
