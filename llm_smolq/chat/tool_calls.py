"""Tool calling in SmolLM3's format.

SmolLM3's chat template lists the tools in the system turn (the `xml_tools` variable) and
asks for each call as a JSON object inside tags:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

This module turns llm's Tools into what the template lists, separates those blocks from
the answer text as it streams, and writes a chain's history (earlier calls, their results)
back into template messages: a call as its `<tool_call>` text in the assistant turn, a
result as a `tool` turn (the template renders it as a user turn holding the output).

SmolLM2's template has no tool format, and a 135M model was not trained to call tools, so
tools on a model whose template does not read `xml_tools` are refused, not improvised.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence, Union

import llm
from llm.parts import StreamEvent, TextPart, ToolCallPart, ToolResultPart

from llm_smolq.chat.reasoning import ReasoningSplitter
from llm_smolq.decode.generate import partial_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: The template variable SmolLM3 reads its tool list from.
TEMPLATE_VARIABLE = "xml_tools"
_WHITESPACE = " \t\r\n"


def tool_spec(tool: llm.Tool) -> dict[str, Any]:
    """One tool as SmolLM3's model card passes it in `xml_tools`: name, description and
    the JSON schema of its arguments (the template prints each entry as it is)."""
    spec: dict[str, Any] = {"name": tool.name}
    if tool.description:
        spec["description"] = tool.description.strip()
    spec["parameters"] = tool.input_schema or {"type": "object", "properties": {}}
    return spec


def template_tools(tools: Sequence[llm.Tool], template_variables: Iterable[str], model_id: str) -> dict[str, Any]:
    """The keyword arguments that put `tools` into a chat template's prompt. Raises
    llm.ModelError when the template has no place for tools."""
    if TEMPLATE_VARIABLE not in template_variables:
        raise llm.ModelError(
            f"{model_id} cannot call tools: its chat template has no tool format (SmolLM3's "
            f"{TEMPLATE_VARIABLE}). Use a SmolLM3 model for tools, e.g. llm -m smollm3-q -T ..."
        )
    return {TEMPLATE_VARIABLE: [tool_spec(tool) for tool in tools]}


def tool_call_schema(tools: Sequence[llm.Tool]) -> dict[str, Any]:
    """The JSON schema the text between `<tool_call>` and `</tool_call>` must match: the
    name of one of `tools` and arguments valid for that tool's input schema."""
    from llm_smolq.decode.constrained import call_schema

    return call_schema({tool.name: tool.input_schema for tool in tools})


class ToolCallGuard:
    """Decoding constraint for an answer that may call tools: free text, but once the
    model opens a call, only tokens that keep it a valid call of one of the tools (with
    arguments valid for that tool) may follow, up to the closing tag; then text is free
    again. A `<tool_call>` inside the `<think>` reasoning is not a call and is left alone,
    as the parser leaves it. Used by generation like any Constraint (mask, consume)."""

    finished = False  # free text ends where the model ends it

    def __init__(self, tokenizer: Any, tools: Sequence[llm.Tool]):
        from llm_smolq.decode.constrained import tool_call_grammar

        self._tokenizer = tokenizer
        self._grammar = tool_call_grammar({t.name: t.input_schema for t in tools}, tokenizer, open_tag=None,
                                          close_tag=CLOSE)
        self._call: Any = None  # the Constraint of the call being written
        self._answer = ReasoningSplitter()  # calls are looked for in the answer, past any <think>
        self._text = ""  # answer text since the last call, as far as it is still needed
        self.skipped: list[str] = []  # calls left unguarded, and why

    def mask(self, logits):
        return self._call.mask(logits) if self._call is not None else logits

    def consume(self, token: int) -> None:
        from llm_smolq.decode.constrained import Constraint, ConstraintError

        if self._call is not None:
            try:
                self._call.consume(token)
            except ConstraintError as exc:  # only if the mask was not applied: let the parser judge
                self.skipped.append(str(exc))
                self._call = None
                return
            if self._call.finished:
                self._call = None
            return
        text = self._tokenizer.token_to_bytes(token).decode("utf-8", errors="replace")
        self._text += "".join(piece for kind, piece in self._answer.push(text) if kind == "text")
        at = self._text.find(OPEN)
        if at < 0:
            self._text = self._text[-(len(OPEN) - 1):]  # all that could still start a tag
            return
        # The token that completed the tag may carry the call's first characters.
        tail, self._text = self._text[at + len(OPEN):], ""
        call = Constraint(self._tokenizer, self._grammar)
        try:
            call.consume_all(self._tokenizer.encode(tail))
        except ConstraintError as exc:
            self.skipped.append(f"the call began with {tail!r}: {exc}")
            return
        self._call = None if call.finished else call


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call written the way the template's instructions ask for it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


# ───── history: llm Messages -> template messages ─────


def message_content(parts: Sequence[Any]) -> str:
    """A user, system or assistant turn's text, with the assistant's tool calls written
    back as their `<tool_call>` blocks in the order they were made. Reasoning is left
    out (SmolLM3's template drops it from earlier turns as well)."""
    pieces: list[str] = []
    for part in parts:
        if isinstance(part, TextPart):
            pieces.append(part.text)
        elif isinstance(part, ToolCallPart) and not part.server_executed:
            # A newline separates a call from what comes before it, as the model writes it.
            if pieces and not pieces[-1].endswith("\n"):
                pieces.append("\n")
            pieces.append(format_tool_call(part.name, part.arguments or {}))
    return "".join(pieces)


def result_messages(parts: Sequence[Any]) -> list[dict[str, str]]:
    """A tool-role message as template messages: one `tool` turn per result, in the order
    of the calls. A failed call's output already says so ("Error: ...")."""
    out = []
    for part in parts:
        if isinstance(part, ToolResultPart):
            out.append({"role": "tool", "content": str(part.output)})
        elif isinstance(part, TextPart) and part.text:
            out.append({"role": "tool", "content": part.text})
    return out


# ───── the answer stream: text and <tool_call> blocks ─────


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]


Piece = tuple[str, Union[str, ParsedCall]]  # ("text", str) or ("call", ParsedCall)


class ToolCallParser:
    """Separates `<tool_call>{...}</tool_call>` blocks from the rest of an answer as it
    streams. push() and flush() return pieces: ("text", str) or ("call", ParsedCall).

    Text that could still be the start of `<tool_call>` is held back, as is whitespace
    next to a call (it is layout, not answer). The end of a call is found by following
    the JSON (strings, escapes, nesting), so a `</tool_call>` inside an argument string
    does not end it. A block that is not a valid call stays in the answer as the text the
    model wrote, and `errors` says why, so nothing the model produced is lost.
    """

    def __init__(self) -> None:
        self._buf = ""  # outside a call: text not released yet; inside: the call's body
        self._in_call = False
        self._after_call = False  # drop the whitespace that follows a call
        self._lead = ""  # whitespace held before the open tag, restored if the call fails
        self._scan = _JsonScan()
        self.calls: list[ParsedCall] = []
        self.errors: list[str] = []
        self.cut = False  # the answer ended inside a call's block: that call was not made

    def push(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            if not self._in_call:
                if not self._text_until_call(out):
                    return out
            elif not self._finish_call(out, final=False):
                return out

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        if self._in_call:
            self._finish_call(out, final=True)
        if self._buf:  # (whitespace after a call was dropped as it came)
            out.append(("text", self._buf))
        self._buf = ""
        return out

    # -- outside a call --

    def _text_until_call(self, out: list[Piece]) -> bool:
        """Release text up to an open tag; True when a call has begun."""
        if self._after_call:
            self._buf = self._buf.lstrip(_WHITESPACE)
            if not self._buf:
                return False
            self._after_call = False
        at = self._buf.find(OPEN)
        if at >= 0:
            before = self._buf[:at]
            text = before.rstrip(_WHITESPACE)
            if text:
                out.append(("text", text))
            self._lead = before[len(text):]
            self._buf, self._in_call, self._scan = self._buf[at + len(OPEN):], True, _JsonScan()
            return True
        # Hold a partial open tag, and the whitespace before it, until the next piece.
        keep = partial_suffix(self._buf, OPEN)
        release = len(self._buf[: len(self._buf) - keep].rstrip(_WHITESPACE))
        text, self._buf = self._buf[:release], self._buf[release:]
        if text:
            out.append(("text", text))
        return False

    # -- inside a call --

    def _finish_call(self, out: list[Piece], final: bool) -> bool:
        """Complete the call when its block has ended; True when it has."""
        scan = self._scan
        end = scan.feed(self._buf)
        if end is None and not final:
            return False
        if end is None:  # the answer ended inside the block
            body, rest = self._buf, ""
            self.cut = True
            json_text = scan.json_text(body) if scan.state == "tail" else None
            problem = "the answer ended before </tool_call>"
        else:
            body, rest = self._buf[:end], self._buf[end:]
            json_text = scan.json_text(body) if scan.state == "closed" else None
            problem = scan.problem or "not a tool call"
        call, why = _parse_call(json_text) if json_text is not None else (None, problem)
        if call is not None:
            self.calls.append(call)
            out.append(("call", call))
            self._after_call = True
        else:
            raw = self._lead + OPEN + body
            self.errors.append(f"{why}: {_clip(OPEN + body)}")
            out.append(("text", raw))
        self._buf, self._in_call, self._lead = rest, False, ""
        return True


class _JsonScan:
    """Follows the body of a tool-call block character by character: leading whitespace,
    one JSON object (strings and nesting tracked), whitespace, then `</tool_call>`. A
    body that departs from that shape falls back to the next literal close tag."""

    def __init__(self) -> None:
        self.state = "lead"  # lead -> json -> tail -> closed, or -> fallback -> closed
        self.pos = 0  # next body index to look at
        self.start = self.stop = 0  # the JSON object's span in the body
        self.depth = 0
        self.in_string = self.escaped = False
        self.problem: str | None = None

    def json_text(self, body: str) -> str:
        return body[self.start:self.stop]

    def feed(self, body: str) -> int | None:
        """The end of the block (just past `</tool_call>`) once it is in `body`, else None."""
        while self.pos < len(body):
            ch = body[self.pos]
            if self.state == "lead":
                if ch in _WHITESPACE:
                    self.pos += 1
                    continue
                if ch != "{":
                    return self._fall_back(body, "no JSON object after <tool_call>")
                self.state, self.start, self.depth = "json", self.pos, 1
            elif self.state == "json":
                if self.in_string:
                    if self.escaped:
                        self.escaped = False
                    elif ch == "\\":
                        self.escaped = True
                    elif ch == '"':
                        self.in_string = False
                elif ch == '"':
                    self.in_string = True
                elif ch in "{[":
                    self.depth += 1
                elif ch in "}]":
                    self.depth -= 1
                    if self.depth == 0:
                        self.state, self.stop = "tail", self.pos + 1
                elif ch == "<":  # never valid JSON outside a string: the object was left open
                    return self._fall_back(body, "the JSON object is not closed")
            elif self.state == "tail":
                if ch in _WHITESPACE:
                    self.pos += 1
                    continue
                ahead = body[self.pos:self.pos + len(CLOSE)]
                if ahead == CLOSE:
                    self.state = "closed"
                    return self.pos + len(CLOSE)
                if CLOSE.startswith(ahead):
                    return None  # a partial close tag: wait for more
                return self._fall_back(body, "text after the JSON object")
            elif self.state == "fallback":
                return self._fall_back(body, self.problem or "")
            self.pos += 1
        return None

    def _fall_back(self, body: str, problem: str) -> int | None:
        self.state, self.problem = "fallback", problem
        at = body.find(CLOSE, self.pos)
        if at < 0:
            # Keep looking from where a close tag could still begin.
            self.pos = max(self.pos, len(body) - len(CLOSE) + 1)
            return None
        self.pos = at + len(CLOSE)
        return self.pos


def _parse_call(json_text: str) -> tuple[ParsedCall | None, str]:
    try:
        value = json.loads(json_text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at character {exc.pos})"
    name = value.get("name") if isinstance(value, dict) else None
    if not isinstance(name, str) or not name.strip():
        return None, 'no "name" string in the call'
    arguments = value.get("arguments")
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, '"arguments" is a string that is not JSON'
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f'"arguments" is a {type(arguments).__name__}, not an object'
    return ParsedCall(name.strip(), arguments), ""


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


# ───── to llm ─────


def to_llm(pieces: Iterable[Piece], response: Any) -> Iterator[Union[str, StreamEvent]]:
    """Parser pieces as what a model's execute() yields: text as str, each call as its
    tool_call stream events (so it keeps its place among the message's parts) and
    response.add_tool_call() with the same id (so llm runs it)."""
    for kind, value in pieces:
        if kind == "text":
            yield value  # type: ignore[misc]
            continue
        call: ParsedCall = value  # type: ignore[assignment]
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        yield StreamEvent(type="tool_call_name", chunk=call.name, tool_call_id=call_id)
        yield StreamEvent(type="tool_call_args", chunk=json.dumps(call.arguments), tool_call_id=call_id)
        response.add_tool_call(llm.ToolCall(name=call.name, arguments=call.arguments, tool_call_id=call_id))
