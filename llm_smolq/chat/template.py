"""Rendering a GGUF's chat template the way transformers does, in a bounded sandbox.

A GGUF file carries its prompt format as a Jinja template (`tokenizer.chat_template`). The
prompt a model was trained on is what transformers' `render_jinja_template` makes of that
template, so this module reproduces transformers' environment exactly:

- jinja2's `ImmutableSandboxedEnvironment` with `trim_blocks=True, lstrip_blocks=True` and the
  `loopcontrols` extension (`{% break %}`, `{% continue %}`);
- the `{% generation %}...{% endgeneration %}` tag (transformers uses it to find assistant
  tokens for training masks; for rendering it emits its body unchanged);
- the globals `raise_exception(message)` and `strftime_now(format)` (local time, like
  transformers; injectable here so tests can freeze the date);
- a `tojson` filter that is plain `json.dumps` (no HTML escaping, `ensure_ascii=False`,
  `indent`, `separators` and `sort_keys=False` as in transformers);
- the variables `messages`, `tools` (None unless given), `documents` (None unless given),
  `add_generation_prompt`, the special token strings, and any extra keyword (SmolLM3 reads
  `enable_thinking`, `xml_tools` and `python_tools`).

The template comes from a downloaded file, so it is treated as hostile:

- Sandbox escapes (`''.__class__.__mro__`, `cycler.__init__.__globals__`,
  `self._TemplateReference__context`, ...) raise ChatTemplateError. jinja2 on its own
  renders a bare unsafe attribute as an empty string and only fails when it is used; here
  touching one at all is an error: the one deliberate difference from transformers in what a
  template may do (no real template reads underscore attributes). `{% import %}`/`{% include %}` have no loader.
- Work is bounded. Every loop iteration and every call (functions, methods, macros, filters)
  is a step: more than `max_steps`, or more than `timeout` seconds, stops the render. The
  prompt is streamed and stops at `max_output_chars`; text produced anywhere (macro bodies,
  `{% set %}` blocks) is capped at 4x that. Operations that can make a value much larger
  than their inputs are sized *before* they run: `~`, `+`, `*`, `**`, `%`, `str.format`,
  `join`, `replace`, `center`/`ljust`/`rjust`/`zfill`/`expandtabs`/`translate`, the
  `indent`, `wordwrap`, `center`, `format`, `tojson`, `pprint`, `batch`, `slice` filters and
  `lipsum`, so a template cannot allocate gigabytes in one step between two checks. The size
  of a value that gets turned into text (a list holding the same long string a million
  times) is estimated before it is.
  What is left: a single bounded operation on values within the caps (sorting a list of a
  million items, say) runs to completion before the next check, so the time limit can be
  overshot by a fraction of a second; memory is bounded by a small multiple of the caps,
  not measured.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import math
import os
import re
import string
import time
import types
from collections.abc import Mapping, MappingView, Sequence, Set
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator

from jinja2 import meta, nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

from llm_smolq.errors import ChatTemplateError

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "chat_template_from_gguf",
    "chat_template_from_metadata",
]

#: The template used when a GGUF has none: plain ChatML, the format SmolLM2 and SmolLM3
#: speak (SmolLM2's own template adds a default system prompt; this one adds nothing).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Longest template source accepted (real chat templates are a few KB to a few tens of KB).
MAX_TEMPLATE_CHARS = 256 * 1024
#: Largest integer a template may build with `*` or `**`, in bits.
MAX_INT_BITS = 1 << 16
#: Text produced anywhere during a render may be this many times `max_output_chars`.
EMITTED_FACTOR = 4


# ───── budget: the per-render counters every checkpoint consults ─────


class _Budget:
    """Steps, deadline and emitted text for one render (or one compile)."""

    __slots__ = ("max_steps", "steps", "timeout", "deadline", "max_emitted", "emitted")

    def __init__(self, max_steps: int, timeout: float, max_emitted: int):
        self.max_steps, self.steps = max_steps, 0
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self.max_emitted, self.emitted = max_emitted, 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise ChatTemplateError(
                f"chat template exceeded max_steps={self.max_steps} (loop iterations and calls); "
                "it loops too long or forever"
            )
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template exceeded timeout={self.timeout}s while rendering")

    def emit(self, n: int) -> None:
        self.emitted += n
        if self.emitted > self.max_emitted:
            raise ChatTemplateError(
                f"chat template exceeded its text budget: it produced more than {self.max_emitted} "
                f"characters in total ({EMITTED_FACTOR} x max_output_chars)"
            )


# A ContextVar, not an attribute of the environment: one ChatTemplate may render in several
# threads at once, and each render needs its own counters.
_ACTIVE: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("smolq_chat_budget", default=None)


def _tick() -> None:
    budget = _ACTIVE.get()
    if budget is not None:
        budget.tick()


# ───── size estimates ─────


def _size(value: Any, limit: int, indent: int = 0) -> int:
    """Roughly len(str(value)) (or of its JSON with `indent`), computed without building it.

    Stops counting once past `limit`, so a huge or self-referencing value costs at most
    about `limit` steps. Strings count exactly; containers count their items plus
    punctuation; objects jinja hands around (Undefined, macros, loops) have short reprs.
    """
    if isinstance(value, str):
        return len(value)
    total = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack and total <= limit:
        item, depth = stack.pop()
        pad = indent * depth + 1 if indent else 0
        if isinstance(item, str):
            total += len(item) + 2 + pad
        elif isinstance(item, (bytes, bytearray)):
            total += 4 * len(item) + 3 + pad
        elif isinstance(item, bool) or item is None:
            total += 5 + pad
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2 + pad
        elif isinstance(item, (float, range)):
            total += 24 + pad
        elif isinstance(item, Namespace):
            try:
                attrs = object.__getattribute__(item, "_Namespace__attrs")
            except AttributeError:
                attrs = {}
            total += 14 + pad
            stack.append((attrs, depth))
        elif isinstance(item, Mapping):
            total += 2 + pad + 4 * len(item)
            for key, val in item.items():
                stack.append((key, depth + 1))
                stack.append((val, depth + 1))
                if len(stack) > limit:
                    break
        elif isinstance(item, (Sequence, Set, MappingView)):
            total += 2 + pad + 2 * len(item)
            stack.extend((x, depth + 1) for x in itertools.islice(item, limit))
        else:
            total += 64 + pad
    return total


def _int_arg(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?")
_DIGITS = re.compile(r"\d+")


def _format_estimate(fmt: str, args: Iterable[Any], limit: int, *, percent: bool) -> int:
    """Upper estimate of `fmt % args` or `fmt.format(*args)`: the format, the arguments as
    text, and every width and precision the format asks for (widths pad, precisions of
    floats add digits)."""
    values = list(args)
    if len(values) == 1 and isinstance(values[0], Mapping):
        values = list(values[0].values())
    elif len(values) == 1 and isinstance(values[0], tuple) and percent:
        values = list(values[0])
    est = len(fmt) + sum(_size(v, limit) for v in values)
    star = False
    if percent:
        for width, precision in _PERCENT_SPEC.findall(fmt):
            for number in (width, precision):
                if number == "*":
                    star = True
                elif number:
                    est += int(number) if len(number) < 10 else limit + 1
    else:
        try:
            specs = [spec or "" for _, _, spec, _ in string.Formatter().parse(fmt)]
        except ValueError:
            specs = []
        for spec in specs:
            star = star or "{" in spec
            est += sum(int(n) if len(n) < 10 else limit + 1 for n in _DIGITS.findall(spec))
    if star:  # widths taken from the arguments
        est += sum(abs(_int_arg(v)) for v in values)
    return est


def _replace_estimate(s: Any, old: Any, new: Any, count: Any = None) -> int:
    s, old, new = str(s), str(old), str(new)
    hits = (s.count(old) if old else len(s) + 1) if count is None or _int_arg(count, -1) < 0 else count
    return len(s) + len(new) * hits


def _take(items: Iterable[Any], limit: int, what: str) -> list[Any]:
    """Materialize an iterable (a lazy `map`, say) so its size can be checked, up to limit."""
    if isinstance(items, list):
        return items
    taken = list(itertools.islice(items, limit + 1))
    if len(taken) > limit:
        raise ChatTemplateError(f"chat template exceeded max_output_chars={limit}: {what} has too many items")
    return taken


def _join_estimate(sep: Any, items: list[Any], limit: int) -> int:
    return sum(_size(x, limit) for x in items) + len(str(sep)) * max(len(items) - 1, 0)


def _translate_estimate(s: Any, table: Any) -> int:
    longest = 1
    if isinstance(table, Mapping):
        longest = max([len(v) for v in table.values() if isinstance(v, (str, bytes))] + [1])
    return len(s) * longest


def _wordwrap_estimate(s: Any, width: Any = 79, break_long_words: Any = True, wrapstring: Any = None,
                       break_on_hyphens: Any = True) -> int:
    # A line ends at whitespace, at a hyphen or at `width`: that bounds the number of lines.
    s = str(s)
    lines = sum(c.isspace() or c == "-" for c in s) + len(s) // max(_int_arg(width, 1), 1) + 1
    return len(s) + len(str(wrapstring) if wrapstring is not None else "\n") * lines


def _indent_estimate(s: Any, width: Any = 4, first: Any = False, blank: Any = False) -> int:
    s = str(s)
    pad = _int_arg(width) if not isinstance(width, str) else len(width)
    return len(s) + max(pad, 0) * (s.count("\n") + 1)


#: Estimators for string methods that can make their result much larger than their inputs:
#: (receiver, *args, **kwargs) -> characters. Other methods are checked after they return.
_METHOD_ESTIMATES: dict[str, Callable[..., int]] = {
    "center": lambda s, width, *a: max(len(s), _int_arg(width)),
    "ljust": lambda s, width, *a: max(len(s), _int_arg(width)),
    "rjust": lambda s, width, *a: max(len(s), _int_arg(width)),
    "zfill": lambda s, width: max(len(s), _int_arg(width)),
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t" if isinstance(s, str) else b"\t") * max(_int_arg(tabsize), 0),
    "replace": lambda s, old, new, count=-1: len(s) + len(new) * (
        _int_arg(count) if _int_arg(count, -1) >= 0 else (s.count(old) if old else len(s) + 1)
    ),
    "translate": _translate_estimate,
}

#: Filters that never turn their input into text (they count, pick, sort or regroup), so
#: their input is not size-checked (that would cost a walk of `messages` per call).
_STRUCTURAL_FILTERS = frozenset({
    "abs", "attr", "batch", "count", "d", "default", "dictsort", "first", "float", "groupby",
    "int", "items", "last", "length", "list", "map", "max", "min", "random", "reject",
    "rejectattr", "reverse", "round", "select", "selectattr", "slice", "sort", "sum", "unique",
})


# ───── the environment ─────


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant turns with it
    (to build training masks); for a prompt it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' `tojson`: json.dumps without jinja's HTML escaping."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' environment, plus the checkpoints and size checks described above."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, max_chars: int, now: Callable[[], datetime]):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
        self.max_chars = max_chars
        self.filters["tojson"] = _tojson
        self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}
        self.globals["raise_exception"] = self._raise_exception
        self.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        self.globals["lipsum"] = self._lipsum
        # The rewritten template reaches these as `environment.smolq_*`, out of the template's reach.
        self.smolq_iter = self._iter
        self.smolq_concat = self._concat
        self.smolq_emit = self._emit

    # -- checks --

    def _check(self, estimate: int, what: str) -> None:
        if estimate > self.max_chars:
            raise ChatTemplateError(
                f"chat template exceeded max_output_chars={self.max_chars}: {what} would make "
                f"about {estimate} characters"
            )

    def _check_result(self, value: Any, what: str) -> Any:
        if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) and len(value) > self.max_chars:
            self._check(len(value), what)
        return value

    def _text(self, parts: tuple[Any, ...], what: str) -> str:
        self._check(sum(_size(p, self.max_chars) for p in parts), what)
        return "".join(map(str, parts))

    # -- what the sandbox intercepts --

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        seqs = (str, bytes, list, tuple)
        if operator == "+" and isinstance(left, seqs) and isinstance(right, seqs):
            self._check(len(left) + len(right), "'+'")
        elif operator == "*":
            if isinstance(left, seqs) or isinstance(right, seqs):
                seq, n = (left, right) if isinstance(left, seqs) else (right, left)
                self._check(len(seq) * max(_int_arg(n, 1), 0), "'*'")
            elif isinstance(left, int) and isinstance(right, int):
                self._check_int_bits(left.bit_length() + right.bit_length())
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            self._check_int_bits(math.ceil(right * math.log2(abs(left))))
        elif operator == "%" and isinstance(left, str):
            self._check(_format_estimate(left, [right], self.max_chars, percent=True), "'%' formatting")
        return super().call_binop(context, operator, left, right)

    def _check_int_bits(self, bits: int) -> None:
        if bits > MAX_INT_BITS:
            raise ChatTemplateError(f"chat template tried to build an integer of about {bits} bits (limit {MAX_INT_BITS})")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        if __obj is __self.smolq_emit or __obj is __self.smolq_iter or __obj is __self.smolq_concat:
            return __obj(*args)  # our own checkpoints: they count what they do themselves
        _tick()
        target = getattr(__obj, "__wrapped__", __obj)  # str.format arrives wrapped by the sandbox
        name = getattr(target, "__name__", "")
        what = f"calling {name or type(__obj).__name__}"
        receiver = getattr(target, "__self__", None)
        if isinstance(target, types.BuiltinMethodType) and isinstance(receiver, (str, bytes)):
            if name in ("format", "format_map") and isinstance(receiver, str):
                __self._check(_format_estimate(receiver, [*args, *kwargs.values()], __self.max_chars, percent=False), what)
            elif name == "join" and len(args) == 1:
                args = (_take(args[0], __self.max_chars, what),)
                __self._check(_join_estimate(receiver, args[0], __self.max_chars), what)
            elif name in _METHOD_ESTIMATES:
                try:
                    estimate = _METHOD_ESTIMATES[name](receiver, *args, **kwargs)
                except (TypeError, ValueError, AttributeError):
                    estimate = 0  # bad arguments: the call itself will say so
                __self._check(estimate, what)
        return __self._check_result(super().call(__context, __obj, *args, **kwargs), what)

    def _guard_filter(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a filter: a step, its input sized, its growth estimated, its result checked."""
        skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # context/env first
        what = f"the |{name} filter"

        def guarded(*args: Any, **kwargs: Any) -> Any:
            _tick()
            if len(args) > skip:
                value, rest = args[skip], args[skip + 1:]
                if name == "join" and not isinstance(value, (str, Mapping)):
                    value = _take(value, self.max_chars, what)
                    args = (*args[:skip], value, *rest)
                if name not in _STRUCTURAL_FILTERS:
                    self._check(_size(value, self.max_chars), what)
                estimate = self._filter_estimate(name, value, rest, kwargs)
                if estimate:
                    self._check(estimate, what)
            return self._check_result(func(*args, **kwargs), what)

        guarded.__dict__.update(getattr(func, "__dict__", {}))  # keeps jinja_pass_arg
        guarded.__name__ = getattr(func, "__name__", name)
        return guarded

    def _filter_estimate(self, name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        limit = self.max_chars
        try:
            if name == "replace":
                return _replace_estimate(value, *args, **kwargs)
            if name == "join":
                sep = args[0] if args else kwargs.get("d", "")
                return _join_estimate(sep, list(value) if not isinstance(value, list) else value, limit)
            if name == "indent":
                return _indent_estimate(value, *args, **kwargs)
            if name == "wordwrap":
                return _wordwrap_estimate(value, *args, **kwargs)
            if name == "center":
                return max(_size(value, limit), _int_arg(args[0] if args else kwargs.get("width", 80)))
            if name == "format":
                return _format_estimate(str(value), [*args, *kwargs.values()], limit, percent=True)
            if name in ("tojson", "pprint"):
                indent = args[1] if len(args) > 1 else kwargs.get("indent", 1 if name == "pprint" else 0)
                return _size(value, limit, indent=len(indent) if isinstance(indent, str) else max(_int_arg(indent), 0))
            if name in ("batch", "slice"):
                return _int_arg(args[0] if args else kwargs.get("linecount", kwargs.get("slices", 0)))
        except (TypeError, ValueError, AttributeError, IndexError):
            return 0  # bad arguments: the filter itself will say so
        return 0

    # -- globals --

    def _raise_exception(self, message: Any) -> None:
        text = str(message) if _size(message, 10_000) <= 10_000 else f"{type(message).__name__} too long to show"
        raise ChatTemplateError(f"chat template raised an error: {text}", template_message=text)

    def _lipsum(self, n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
        self._check(_int_arg(n) * _int_arg(max) * 12, "lipsum()")
        return generate_lorem_ipsum(n, html, min, max)

    # -- what the rewritten template calls --

    def _iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            _tick()
            yield item

    def _concat(self, *parts: Any) -> str:
        return self._text(parts, "'~'")

    def _emit(self, *parts: Any) -> str:
        text = parts[0] if len(parts) == 1 and type(parts[0]) is str else self._text(parts, "an output")
        budget = _ACTIVE.get()
        if budget is not None:
            budget.emit(len(text))
        return text


class _Instrument(NodeTransformer):
    """Routes every loop, `~` and output of a parsed template through the environment's
    checkpoints: `for x in xs` -> `for x in environment.smolq_iter(xs)`, `a ~ b` ->
    `environment.smolq_concat(a, b)`, `{{ a }}text` -> `{{ environment.smolq_emit(a) }}{{ environment.smolq_emit('text') }}`.
    The rendered text is the same; the names are not reachable from the template."""

    def __init__(self, env: _Sandbox):
        self.env = env

    def _call(self, name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
        attr = nodes.EnvironmentAttribute(name, lineno=lineno, environment=self.env)
        return nodes.Call(attr, args, [], None, None, lineno=lineno, environment=self.env)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._call("smolq_iter", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return self._call("smolq_concat", node.nodes, node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [  # one call per piece, so errors keep the piece's own line number
            self._call("smolq_emit", [
                nodes.Const(child.data, lineno=child.lineno, environment=self.env)
                if isinstance(child, nodes.TemplateData) else child
            ], child.lineno)
            for child in node.nodes
        ]
        return node


# ───── the public class ─────


def _template_lineno(exc: BaseException) -> int | None:
    """The template line an exception came from: jinja rewrites tracebacks so that frames of
    the compiled template carry the template's own line numbers under '<template>'."""
    lineno = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return lineno


def _as_error(exc: Exception, doing: str) -> ChatTemplateError:
    if isinstance(exc, ChatTemplateError):  # ours, raised inside: add where it happened
        lineno = _template_lineno(exc)
        if exc.lineno is not None or lineno is None:
            return exc
        return ChatTemplateError(f"{exc} (template line {lineno})", template_message=exc.template_message, lineno=lineno)
    if isinstance(exc, TemplateSyntaxError):
        return ChatTemplateError(f"chat template syntax error on line {exc.lineno}: {exc.message}", lineno=exc.lineno)
    lineno = _template_lineno(exc)
    where = f" on line {lineno}" if lineno else ""
    if isinstance(exc, SecurityError):
        message = f"chat template blocked by the sandbox{where}: {exc}"
    elif isinstance(exc, RecursionError):
        message = f"chat template recursed too deeply{where} (a macro or recursive loop without an end?)"
    elif isinstance(exc, MemoryError):
        message = f"chat template ran out of memory{where}"
    else:
        message = f"chat template failed while {doing}{where}: {type(exc).__name__}: {exc}"
    return ChatTemplateError(message, lineno=lineno)


class ChatTemplate:
    """A chat template compiled once, rendered as transformers would render it.

    `source` is the Jinja text (GGUF key `tokenizer.chat_template`); `bos_token` and
    `eos_token` (and any other `special_tokens`, e.g. `pad_token`) are the strings the
    template may reference, as transformers' `apply_chat_template` passes them.
    `now` returns the time `strftime_now` formats (default: local time, as transformers).
    The limits bound every render: `max_output_chars` of prompt, `max_steps` loop
    iterations and calls, `timeout` seconds. A template that is too long, has a syntax error
    or breaks a rule raises ChatTemplateError.
    """

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        special_tokens: Mapping[str, str] | None = None,
        now: Callable[[], datetime] | None = None,
        max_output_chars: int = 1_000_000,
        max_steps: int = 1_000_000,
        timeout: float = 2.0,
        is_fallback: bool = False,
    ):
        if not isinstance(source, str):
            raise ChatTemplateError(f"a chat template must be text, not {type(source).__name__}")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(
                f"chat template is {len(source)} characters long, more than MAX_TEMPLATE_CHARS={MAX_TEMPLATE_CHARS}"
            )
        self.source = source
        self.special_tokens: dict[str, str] = {"bos_token": bos_token, "eos_token": eos_token, **(special_tokens or {})}
        self.max_output_chars, self.max_steps, self.timeout = max_output_chars, max_steps, timeout
        #: True when the GGUF had no template and CHATML_TEMPLATE stands in for it.
        self.is_fallback = is_fallback
        self._env = _Sandbox(max_output_chars, now or datetime.now)
        token = _ACTIVE.set(self._budget())  # filters on constants run while compiling
        try:
            ast = self._env.parse(source)
            #: The variables the template reads (e.g. SmolLM3: enable_thinking, xml_tools, ...).
            self.variables: frozenset[str] = frozenset(meta.find_undeclared_variables(ast))
            self._template = self._env.from_string(_Instrument(self._env).visit(ast))
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear error
            raise _as_error(exc, "compiling") from exc
        finally:
            _ACTIVE.reset(token)

    def _budget(self) -> _Budget:
        return _Budget(self.max_steps, self.timeout, EMITTED_FACTOR * self.max_output_chars)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt for `messages`, dicts with `role` and `content`.

        SmolLM3's template reads only those two keys: an assistant's tool call is its
        content text (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`), a tool
        result is a message with role `tool` (rendered as a user turn); `tool_calls` keys are
        ignored. Extra keywords become template variables (`enable_thinking=False`,
        `xml_tools=[...]`, `python_tools=[...]`) and override the special tokens. `tools`
        and `documents` are always defined (None by default) and `add_generation_prompt`
        defaults to False, as in transformers' `render_jinja_template`.
        """
        context = {
            **self.special_tokens,
            "messages": messages,
            "tools": tools,
            "documents": documents,
            "add_generation_prompt": add_generation_prompt,
            **kwargs,
        }
        limit = self.max_output_chars
        token = _ACTIVE.set(self._budget())
        chunks = self._template.generate(**context)
        try:
            parts: list[str] = []
            size = 0
            for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise ChatTemplateError(f"chat template exceeded max_output_chars={limit}: the prompt is longer")
                parts.append(chunk)
            return "".join(parts)
        except Exception as exc:  # noqa: BLE001
            raise _as_error(exc, "rendering") from exc
        finally:
            chunks.close()
            _ACTIVE.reset(token)


# ───── from GGUF metadata ─────


def _token(metadata: Mapping[str, Any], key: str) -> str | None:
    tokens = metadata.get("tokenizer.ggml.tokens")
    token_id = metadata.get(key)
    if token_id is None or not isinstance(tokens, Sequence):
        return None
    try:
        token = tokens[int(token_id)]
    except (IndexError, TypeError, ValueError):
        return None
    return token.decode("utf-8", errors="replace") if isinstance(token, bytes) else str(token)


def chat_template_from_metadata(metadata: Mapping[str, Any], name: str | None = None, **options: Any) -> ChatTemplate:
    """The ChatTemplate a GGUF's metadata describes (the mapping `ModelFile.metadata` holds).

    The source is `tokenizer.chat_template` (or `tokenizer.chat_template.<name>` for a named
    one such as "tool_use"); the special tokens are the strings of `tokenizer.ggml.tokens`
    at `bos_token_id`, `eos_token_id`, `padding_token_id` and `unknown_token_id`.
    A file without a template gets CHATML_TEMPLATE, plain ChatML, with `is_fallback=True`:
    SmolLM2 and SmolLM3 speak ChatML, but a model trained on another format would get a
    wrong prompt, so callers may want to warn. `options` go to ChatTemplate (`now`, limits).
    """
    key = "tokenizer.chat_template" + (f".{name}" if name else "")
    source = metadata.get(key)
    if isinstance(source, (bytes, bytearray)):
        source = bytes(source).decode("utf-8", errors="replace")
    if source is not None and not isinstance(source, str):
        raise ChatTemplateError(f"GGUF key {key} holds {type(source).__name__}, not a template")
    if source is None and name:
        raise ChatTemplateError(f"the GGUF has no chat template named {name!r} (no key {key})")
    special = {}
    for token_name, meta_key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                                 ("pad_token", "padding_token_id"), ("unk_token", "unknown_token_id")):
        value = _token(metadata, f"tokenizer.ggml.{meta_key}")
        if value is not None:
            special[token_name] = value
    return ChatTemplate(
        source if source is not None else CHATML_TEMPLATE,
        special.pop("bos_token", ""),
        special.pop("eos_token", ""),
        special_tokens=special,
        is_fallback=source is None,
        **options,
    )


def chat_template_from_gguf(path: str | os.PathLike[str], name: str | None = None, **options: Any) -> ChatTemplate:
    """chat_template_from_metadata for a GGUF file, reading only its key/value header."""
    from llm_smolq.model.tokenizer import read_tokenizer_metadata  # the fast header walk (GGUFReader takes seconds)

    return chat_template_from_metadata(read_tokenizer_metadata(path), name, **options)
