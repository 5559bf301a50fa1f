"""Constrained decoding: at each step only the tokens that keep the output inside a
grammar may be sampled, so the text always parses.

llguidance does the grammar work (JSON schema and Lark compilers, token masks); this
module feeds it the GGUF vocabulary and gives generation a small per-answer object:

    constraint = Constraint.for_json_schema(engine.tokenizer, {"type": "object", ...})
    logits = constraint.mask(logits)      # disallowed tokens become -inf
    constraint.consume(token)             # after sampling
    constraint.finished                   # nothing but end-of-turn can follow

An end-of-turn token is allowed only where the grammar is complete.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any, Iterable, Mapping

import llguidance
import numpy as np

from llm_smolq.errors import ConstraintError
from llm_smolq.model.tokenizer import GGUFTokenizer, end_of_turn_ids

# One compact layout for JSON: ", " and ": " between items and no other whitespace. With
# free whitespace a model can pad forever (a random-weight one does) without breaking the
# grammar; fixed separators keep every token on the way to a value.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class _VocabularyView:
    """What llguidance.TokenizerWrapper reads: every token's bytes, which ids are
    control tokens, the end token(s), and a bytes -> ids encoder."""

    def __init__(self, tokenizer: GGUFTokenizer, end_ids: list[int]):
        self._tokenizer = tokenizer
        self.tokens = [tokenizer.token_to_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_control(i)]
        self.eos_token_id = end_ids[0]
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", errors="replace"))


# Indexing a 49k vocabulary takes ~0.4 s, so it is done once per
# tokenizer (which the engine keeps for the model's lifetime).
_llg_tokenizers: "weakref.WeakKeyDictionary[GGUFTokenizer, llguidance.LLTokenizer]" = weakref.WeakKeyDictionary()
_llg_lock = threading.Lock()


def llg_tokenizer(tokenizer: GGUFTokenizer) -> llguidance.LLTokenizer:
    """The llguidance view of a GGUF vocabulary, built on first use and cached."""
    with _llg_lock:
        cached = _llg_tokenizers.get(tokenizer)
        if cached is None:
            ends = sorted(end_of_turn_ids(tokenizer))
            if not ends:
                raise ConstraintError(
                    "the vocabulary has no end-of-turn token (<|im_end|> or an eos id), so a "
                    "constrained answer could never end"
                )
            view = _VocabularyView(tokenizer, ends)
            cached = llguidance.LLTokenizer(llguidance.TokenizerWrapper(view), eos_token=ends)
            _llg_tokenizers[tokenizer] = cached
        return cached


def json_schema_grammar(schema: Mapping[str, Any], closed: bool = True) -> str:
    """An llguidance grammar for JSON values that validate against `schema`.

    closed: objects that list their properties get no others unless the schema says
    `additionalProperties` (as llama.cpp's grammars do): what someone who asks for
    "name, age" expects, and still valid against the schema as written."""
    if not isinstance(schema, Mapping):
        raise ConstraintError(f"a JSON schema must be an object (a dict), not {type(schema).__name__}")
    try:
        text = json.dumps(close_objects(schema) if closed else schema)
        return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_LAYOUT)
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"the schema is not valid JSON: {exc}") from None


# Where JSON Schema keeps subschemas: maps of them, single ones, and lists of them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames", "not",
               "if", "then", "else", "unevaluatedProperties", "unevaluatedItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_objects(schema: Any, close_here: bool = True) -> Any:
    """A copy of `schema` where each object schema with `properties` and nothing said
    about other properties gets `additionalProperties: false`. Branches of allOf stay
    open: closing each part would forbid the properties the other parts add."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: close_objects(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), Mapping):
            out[key] = close_objects(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(sub, close_here=key != "allOf") for sub in out[key]]
    if close_here and isinstance(out.get("properties"), Mapping) and not any(k in out for k in _OPEN_KEYS):
        out["additionalProperties"] = False
    return out


def lark_grammar(lark: str) -> str:
    """An llguidance grammar from Lark text; `%json{...}` embeds a JSON schema, and
    `<|im_end|>`-style names stand for control tokens."""
    return llguidance.LLMatcher.grammar_from_lark(lark)


def call_schema(tools: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """The JSON schema of one call's body, `{"name": ..., "arguments": {...}}`, with the
    arguments valid for the named tool's input schema (None: any object). Objects are
    closed as in json_schema_grammar."""
    if not tools:
        raise ConstraintError("a tool call grammar needs at least one tool")
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": close_objects(schema) if schema else {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, schema in tools.items()
    ]
    return {"anyOf": calls} if len(calls) > 1 else calls[0]


def tool_call_grammar(
    tools: Mapping[str, Mapping[str, Any] | None],
    tokenizer: GGUFTokenizer,
    open_tag: str | None = "<tool_call>",
    close_tag: str = "</tool_call>",
) -> str:
    """A grammar for one tool call in the Hermes/SmolLM3 format,
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (call_schema's body), or
    for what follows the opening tag when open_tag is None."""
    body = json.dumps({**call_schema(tools), "x-guidance": JSON_LAYOUT})
    opening = f"{_tag(open_tag, tokenizer)} " if open_tag else ""
    return lark_grammar(
        f"start: {opening}\"\\n\"? call \"\\n\"? {_tag(close_tag, tokenizer)}\n"
        f"call: %json {body}\n"
    )


def _tag(text: str, tokenizer: GGUFTokenizer) -> str:
    """A tag as a Lark terminal: a control token by name, anything else as its text."""
    token = tokenizer.token_id(text)
    if token is not None and tokenizer.is_control(token):
        return text
    return json.dumps(text)


class Constraint:
    """One answer's grammar state. Not reusable: make one per generation."""

    def __init__(self, tokenizer: GGUFTokenizer, grammar: str, schema: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        # The JSON schema the grammar was made from (objects closed), when it was one.
        self.schema = schema
        # Every token consumed so far, in order.
        self.tokens: list[int] = []
        llg_tok = llg_tokenizer(tokenizer)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, llg_tok)
        if failed:
            raise ConstraintError("; ".join(messages))
        self._matcher = llguidance.LLMatcher(llg_tok, grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(self._matcher.get_error())
        self.vocab_size = llg_tok.vocab_size
        self.end_ids = frozenset(llg_tok.eos_tokens)
        # Bitmask buffer llguidance writes into: one bit per token, 32 per int32.
        self._bits = np.zeros((self.vocab_size + 31) // 32, np.int32)

    @classmethod
    def for_json_schema(cls, tokenizer: GGUFTokenizer, schema: Mapping[str, Any]) -> "Constraint":
        grammar = json_schema_grammar(schema)
        return cls(tokenizer, grammar, schema=close_objects(schema))

    def fork(self) -> "Constraint":
        """An independent copy in the same state: what is consumed by one does not
        reach the other."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.tokens = list(self.tokens)
        twin._matcher = self._matcher.deep_copy()
        twin._bits = np.zeros_like(self._bits)
        return twin

    def allowed(self) -> np.ndarray:
        """Boolean [vocab]: the tokens that may come next."""
        self._raise_if_broken()
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._raise_if_broken()
        return np.unpackbits(self._bits.view(np.uint8), count=self.vocab_size, bitorder="little").view(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of logits with every disallowed token at -inf. Rows past the
        tokenizer's vocabulary (padding some files carry) are never allowed."""
        allowed = self.allowed()
        if logits.shape[-1] != allowed.size:
            allowed = np.pad(allowed, (0, max(logits.shape[-1] - allowed.size, 0)))[: logits.shape[-1]]
        return np.where(allowed, logits, np.float32(-np.inf))

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(int(token)):
            raise ConstraintError(f"token {token} is not allowed here: {self._matcher.get_error()}")
        self.tokens.append(int(token))

    def consume_all(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.consume(token)

    @property
    def accepting(self) -> bool:
        """The text so far is complete: an end-of-turn token may come next."""
        return self._matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """Complete, and nothing but an end-of-turn token can follow."""
        return self._matcher.is_stopped()

    def _raise_if_broken(self) -> None:
        if self._matcher.is_error():
            raise ConstraintError(self._matcher.get_error())


def schema_instruction(schema: Mapping[str, Any]) -> str:
    """What the prompt tells the model, so it writes the right values (the constraint
    only makes sure of the shape)."""
    return "Reply with only a JSON value that matches this JSON schema:\n" + json.dumps(schema)
