"""One answer to an llm prompt: the conversation rendered with the model's own chat
template, generated under the prompt's options (schema, tools, prompt cache), streamed
back as llm's text, reasoning and tool-call events, and its usage recorded."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Union

import llm
from llm.parts import StreamEvent

from llm_smolq.decode import generate as generation
from llm_smolq.store import catalog
from llm_smolq.store.catalog import format_size
from llm_smolq.errors import ChatTemplateError, ConstraintError
from llm_smolq.chat.reasoning import ReasoningSplitter
from llm_smolq.decode.generate import Completion, RepetitionGuard, prompt_ids
from llm_smolq import defaults
from llm_smolq.plugin.abilities import no_thinking_mode
from llm_smolq.plugin.command import Command
from llm_smolq.plugin.loaded import Loaded
from llm_smolq.plugin.options import pick, sampling_params, stop_strings
from llm_smolq.plugin.progress import PrefillProgress
from llm_smolq.cache import packed_cache
from llm_smolq.store.prompt_cache import CacheActivity, PromptCache
from llm_smolq.chat.tool_calls import ToolCallGuard, ToolCallParser, message_content, result_messages, template_tools, to_llm

if TYPE_CHECKING:  # llguidance loads only for a prompt with a schema or tools
    from llm_smolq.decode.constrained import Constraint
    from llm_smolq.engine.engine import Engine


def answer(loaded: Loaded, prompt: llm.Prompt, response, model_id: str, path: Path, command: Command | None = None
           ) -> Iterator[Union[str, StreamEvent]]:
    engine, opts = loaded.engine, prompt.options
    command = command or Command(None)
    smollm3 = engine.config.arch == "smollm3"
    tools = [tool for tool in prompt.tools if isinstance(tool, llm.Tool)]
    schema = prompt.schema
    asked_thinking = getattr(opts, "thinking", None)
    if asked_thinking is not None and not smollm3:
        raise llm.ModelError(no_thinking_mode(model_id))
    max_tokens = opts.max_tokens or defaults.MAX_TOKENS
    constraint = schema_constraint(engine, schema, max_tokens) if schema is not None else None
    # With a schema the answer is the JSON alone: no <think> part before it.
    thinking = (pick(asked_thinking, defaults.THINKING) and schema is None) if smollm3 else None
    ids = conversation_ids(loaded, prompt, model_id, tools, thinking)
    disk = configured_prompt_cache(opts)
    disk_activity = CacheActivity()
    done = Completion()
    splitter = ReasoningSplitter() if smollm3 and schema is None else None
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
                guard = RepetitionGuard() if pick(opts.repeat_guard, defaults.REPEAT_GUARD) else None
                for chunk in generation.generate(engine, ids, sampling_params(opts, engine.config.arch),
                                                 max_tokens, stop_strings(opts), done,
                                                 constraint, progress=PrefillProgress.for_terminal(sys.stderr),
                                                 guard=guard, lookup=pick(opts.lookup, defaults.LOOKUP)):
                    yield from events(splitter.push(chunk) if splitter else [("text", chunk)])
            except KeyboardInterrupt:
                # Ctrl-C ends the answer: llm logs what was produced, then a one-shot
                # prompt exits 130 and `llm chat` goes on. The KV cache holds only
                # completed steps.
                done.finish_reason = "interrupted"
                command.exit_when_done(130)
            except ConstraintError as exc:  # a schema past llguidance's limits mid-answer
                raise llm.ModelError(f"the schema could not be followed: {exc}; simplify it") from None
            if splitter:
                yield from events(splitter.flush())
            if calls:
                yield from to_llm(calls.flush(), response)
            if disk:  # after the answer is out: the wait is not before the first token
                disk.save(engine, disk_activity)
    finally:
        record(response, done, path, disk_activity if disk else None, calls)
    tell_how_it_ended(command, done, engine, opts, disk_activity if disk else None, calls)


def tell_how_it_ended(command: Command, done: Completion, engine: Engine, opts, disk: CacheActivity | None,
                      calls: ToolCallParser | None = None) -> None:
    """One line on stderr for an answer that did not end by itself (and one more when it
    ended inside a tool call, which was then not made), the first time the prompt cache
    writes (where it is, how big it may grow, how to turn it off), and when the model's
    packed weights were kept on disk (where, how big, how many copies stay and how big they
    may grow, how to delete them)."""
    cut = ("its JSON was closed early with the shortest ending the schema allows" if done.closed_early
           else "the answer was cut there")
    if done.finish_reason == "length":
        closed = f": {cut};" if done.closed_early else ":"
        asked = opts.max_tokens or defaults.MAX_TOKENS
        command.tell(f"the answer reached max_tokens ({asked}){closed} -o max_tokens N lets it go further")
    elif done.finish_reason == "context":
        window = engine.config.window
        more = (f"-o n_ctx {min(engine.n_ctx * 2, window)} to go further" if engine.n_ctx < window
                else f"the model reads at most {window} tokens")
        command.tell(f"the context is full ({engine.n_ctx} tokens): {cut}; {more}")
    elif done.finish_reason == "repetition":
        command.tell(f"the answer was ended after repeating itself for {done.repeated_tokens} tokens"
                     f"{', and ' + cut if done.closed_early else ''} (-o repeat_guard false lets it run)")
    if calls is not None and calls.cut:
        command.tell("the answer ended inside a tool call, so that call was not made: its text stays in the "
                     "answer and `llm logs --json` shows it under tool_call_errors")
    if disk is not None and disk.first_write:
        command.tell(f"saving prompt states in {disk.directory} so `llm -c` is fast (up to "
                     f"{format_size(disk.budget)} for this model; -o prompt_cache false or SMOLQ_PROMPT_CACHE_SIZE=0 "
                     "turns it off)")
    kept, engine.model.packed_kept = engine.model.packed_kept, None
    if kept is not None:
        size = len(engine.model.packed_data)
        command.tell(f"kept this model's packed weights ({format_size(size)}) in {kept.parent} so its next load "
                     f"skips packing them; the {packed_cache.KEEP} last used copies are kept, up to "
                     f"{format_size(packed_cache.most_bytes_here(catalog.present_sizes(), size))} with the models here; "
                     "`llm smolq cache clear --packed` deletes them, SMOLQ_CACHE_DIR=off keeps none")


def conversation_ids(loaded: Loaded, prompt: llm.Prompt, model_id: str, tools: list[llm.Tool],
                     thinking: bool | None) -> list[int]:
    """The conversation rendered by the model's template (with its tools, the schema
    asked for, and SmolLM3's thinking switch when not None) as the ids to evaluate;
    a ModelError when they do not fit the context."""
    engine = loaded.engine
    extra = template_tools(tools, loaded.template.variables, model_id) if tools else {}
    messages = template_messages(prompt)
    if prompt.schema is not None:
        messages = with_schema_instruction(messages, prompt.schema)
    if thinking is not None:
        extra["enable_thinking"] = thinking
    try:
        text = loaded.template.render(messages, add_generation_prompt=True, **extra)
    except ChatTemplateError as exc:
        raise llm.ModelError(f"the model's chat template failed: {exc}") from None
    ids = prompt_ids(engine, text)
    if len(ids) >= engine.n_ctx:
        window = engine.config.window
        if len(ids) < window:
            fix = f"shorten it or raise the context with -o n_ctx {min(len(ids) * 2, window)}"
        elif engine.config.rope_scaling is None:
            fix = (f"shorten it: the model reads at most {window} tokens, or extend that with YaRN: "
                   f"-o rope_scaling yarn -o n_ctx {len(ids) * 2}")
        else:
            fix = f"shorten it: the model reads at most {window} tokens"
        raise llm.ModelError(f"the prompt is {len(ids)} tokens but the context holds {engine.n_ctx}; {fix}")
    return ids


def template_messages(prompt: llm.Prompt) -> list[dict[str, str]]:
    """llm's Message parts as the {role, content} dicts chat templates read. Reasoning
    from earlier turns is dropped (SmolLM3's template leaves it out as well); tool calls
    and results are written as SmolLM3 reads them (chat/tool_calls.py)."""
    out = []
    for message in prompt.messages:
        if message.role == "tool":
            out.extend(result_messages(message.parts))
            continue
        content = message_content(message.parts)
        if content or message.role != "assistant":
            out.append({"role": message.role, "content": content})
    return out


def schema_constraint(engine: Engine, schema: dict, max_tokens: int) -> Constraint:
    """The schema's constraint, refused before any work when the schema cannot be used or
    its shortest valid answer does not fit in max_tokens."""
    from llm_smolq.decode.constrained import Constraint
    from llm_smolq.decode.json_closing import minimal_document_tokens

    try:
        constraint = Constraint.for_json_schema(engine.tokenizer, schema)
        least = len(minimal_document_tokens(engine.tokenizer, schema))
    except ConstraintError as exc:
        raise llm.ModelError(f"the schema cannot be used: {exc}; fix it and try again") from None
    if max_tokens < least:
        raise llm.ModelError(f"max_tokens {max_tokens} is too few for this schema: its shortest valid answer takes "
                             f"{least} tokens; use -o max_tokens {least} or more")
    return constraint


def with_schema_instruction(messages: list[dict[str, str]], schema: dict) -> list[dict[str, str]]:
    """The messages with the schema asked for in the system prompt: the constraint makes
    the output valid, the instruction makes the model fill it with the right things."""
    from llm_smolq.decode.constrained import schema_instruction

    instruction = schema_instruction(schema)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def configured_prompt_cache(opts) -> PromptCache | None:
    if not pick(opts.prompt_cache, defaults.PROMPT_CACHE):
        return None
    try:
        return PromptCache.configured()
    except ValueError as exc:  # a malformed SMOLQ_PROMPT_CACHE_SIZE
        raise llm.ModelError(str(exc)) from None


def record(response, done: Completion, path: Path, disk: CacheActivity | None, calls: ToolCallParser | None) -> None:
    """Usage and what llm logs beside the answer, also for an answer cut short."""
    details = {"cached": done.cached_tokens}
    if done.drafted_tokens:  # lookup decoding: tokens drafted, and those the answer kept
        details |= {"drafted": done.drafted_tokens, "accepted": done.accepted_tokens}
    response.set_usage(input=done.prompt_tokens, output=len(done.output_ids), details=details)
    response.response_json = {
        "finish_reason": done.finish_reason or "error",
        "tokens_per_second": done.tokens_per_second,
        "prefill_seconds": round(done.prefill_seconds, 3),
        "model_file": str(path),
        **({"prompt_cache": disk.as_json()} if disk else {}),
        **({"closed_early": True} if done.closed_early else {}),
    }
    if calls and calls.errors:  # blocks that were kept as text, and why
        response.response_json["tool_call_errors"] = calls.errors


