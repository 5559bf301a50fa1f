"""The llm hooks: the models (sync and async) and the `llm smolq` commands. What they do
lives beside this file: options.py, loaded.py, turn.py (one answer), command.py, commands.py."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator, Iterator, Union

import llm
from llm.parts import StreamEvent

from llm_smolq.plugin.abilities import NAME_PREFIX
from llm_smolq.plugin.command import wrap_llm_commands
from llm_smolq.plugin.options import EngineOptions, options_for
from llm_smolq.errors import ModelNotFound
from llm_smolq.store import catalog

if TYPE_CHECKING:  # the kernel, gguf and jinja2 load on first use, not on every `llm` start
    from llm_smolq.plugin.command import Command


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
    wrap_llm_commands(cli)


class _SmolQ:
    can_stream = True
    supports_schema = True

    def __init__(self, model_id: str, tools: bool = False, thinking: bool = False):
        self.model_id = model_id
        self.supports_tools = tools  # its template has a tool format: see chat/tool_calls.py
        self.Options = options_for(model_id, thinking)

    def __str__(self) -> str:
        return f"{NAME_PREFIX}{self.model_id}"

    def run(self, prompt: llm.Prompt, response, command: Command) -> Iterator[Union[str, StreamEvent]]:
        from llm_smolq.plugin.turn import answer

        opts = prompt.options
        try:
            path = catalog.resolve(self.model_id)
        except ModelNotFound as exc:
            raise llm.ModelError(str(exc)) from None
        from llm_smolq.plugin.loaded import load_model

        loaded = load_model(path, EngineOptions.of(opts))
        return answer(loaded, prompt, response, self.model_id, path, command)


class SmolQModel(_SmolQ, llm.Model):
    def execute(self, prompt, stream, response, conversation):
        from llm_smolq.plugin.command import Command

        yield from self.run(prompt, response, Command.current())


class AsyncSmolQModel(_SmolQ, llm.AsyncModel):
    async def execute(self, prompt, stream, response, conversation) -> AsyncIterator:
        from llm_smolq.plugin.command import Command

        # The kernel releases the GIL, so a worker thread keeps the event loop free; the
        # command is looked up here, on the thread where click keeps it.
        chunks = await asyncio.to_thread(self.run, prompt, response, Command.current())
        done = object()
        while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
            yield chunk
