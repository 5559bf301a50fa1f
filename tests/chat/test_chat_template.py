"""Chat templates: the prompts transformers renders, and a sandbox hostile templates cannot leave.

The reference renderings come from tests/data/reference: llama-cpp-python's jinja rendering of
SmolLM2's template (smollm2-chat-A.json) and transformers' `render_jinja_template` of
SmolLM3's template with the date frozen at 2026-11-29 (smollm3-template-A.json).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import tracemalloc
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llm_smolq.chat import template as chat_template
from llm_smolq.errors import ChatTemplateError
from llm_smolq.chat.template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    chat_template_from_gguf,
    chat_template_from_metadata,
)

FROZEN = datetime(2026, 11, 29, 12, 0)

# The inputs only, so parametrize ids exist without the reference files; the expected
# strings are read through the reference_dir fixture (which skips when they are absent).
SMOLLM2_CASES = range(6)
SMOLLM3_CASES = range(20)


def _load(reference_dir: Path, name: str) -> dict:
    return json.loads((reference_dir / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def smollm3_template(reference_dir: Path) -> ChatTemplate:
    """SmolLM3-3B's published template, as tiny-smollm3-chat-Q8_0.gguf carries it."""
    return chat_template_from_gguf(reference_dir / "tiny-smollm3-chat-Q8_0.gguf", now=lambda: FROZEN)


@pytest.fixture(scope="module")
def smollm2_template(reference_dir: Path) -> ChatTemplate:
    """SmolLM2's template: tiny-smollm3-Q8_0.gguf carries the same text as the real
    SmolLM2-135M-Instruct GGUF (test_real_smollm2_gguf_has_this_template checks it)."""
    return chat_template_from_gguf(reference_dir / "tiny-smollm3-Q8_0.gguf")


# ───── exact renderings ─────


@pytest.mark.parametrize("index", SMOLLM2_CASES)
def test_smollm2_prompts_match_reference(reference_dir: Path, smollm2_template: ChatTemplate, index: int) -> None:
    case = _load(reference_dir, "smollm2-chat-A.json")["cases"][index]
    assert smollm2_template.render(case["messages"], add_generation_prompt=True) == case["prompt"]


def test_real_smollm2_gguf_has_this_template(smollm2_gguf: Path, smollm2_template: ChatTemplate,
                                            reference_dir: Path) -> None:
    """The file the SmolLM2 references were made with: its template and special tokens."""
    real = chat_template_from_gguf(smollm2_gguf)
    assert real.source == smollm2_template.source
    assert not real.is_fallback
    assert (real.special_tokens["bos_token"], real.special_tokens["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    for case in _load(reference_dir, "smollm2-chat-A.json")["cases"]:
        assert real.render(case["messages"], add_generation_prompt=True) == case["prompt"]


@pytest.mark.parametrize("index", SMOLLM3_CASES)
def test_smollm3_renderings_match_transformers(reference_dir: Path, smollm3_template: ChatTemplate,
                                              index: int) -> None:
    data = _load(reference_dir, "smollm3-template-A.json")
    assert data["frozen_date"] == FROZEN.date().isoformat()
    assert len(data["cases"]) == len(SMOLLM3_CASES)
    case = data["cases"][index]
    rendered = smollm3_template.render(
        case["messages"], add_generation_prompt=case["add_generation_prompt"], **case["kwargs"]
    )
    assert rendered == case["rendered"], case["name"]


def test_smollm3_template_reads_the_variables_we_pass(smollm3_template: ChatTemplate) -> None:
    """What a caller can set: the SmolLM3 template's free variables."""
    assert {"enable_thinking", "xml_tools", "python_tools", "add_generation_prompt", "messages"} <= smollm3_template.variables


def test_strftime_now_defaults_to_the_local_date(reference_dir: Path) -> None:
    """Like transformers, the date is the local date at render time unless frozen."""
    template = chat_template_from_gguf(reference_dir / "tiny-smollm3-chat-Q8_0.gguf")
    before = datetime.now().strftime("%d %B %Y")
    rendered = template.render([{"role": "user", "content": "hi"}])
    assert f"Today Date: {before}" in rendered or f"Today Date: {datetime.now():%d %B %Y}" in rendered


# ───── transformers' environment ─────


def _transformers_like(source: str, **context) -> str:
    """The environment transformers builds (its facts: sandbox, trim/lstrip, loopcontrols,
    plain-json tojson), without our instrumentation, to check the instrumentation changes
    nothing. `{% generation %}` is left out: plain jinja2 does not know it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return env.from_string(source).render(**context)


MESSAGES = [
    {"role": "system", "content": "Sys <b>&</b> ü"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": "é"}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": "again"},
]

FEATURES = {
    "loop variables": "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if loop.last %}L{% endif %}"
                      "{{ loop.revindex }}{{ loop.cycle('a', 'b') }}{{ loop.previtem.role if loop.previtem }}|{% endfor %}",
    "for-else, filtered loop": "{% for m in [] %}x{% else %}empty{% endfor %}"
                               "{% for m in messages if m.role != 'system' %}{{ m.role }}{% endfor %}",
    "break/continue": "{% for m in messages %}{% if m.role == 'user' %}{% continue %}{% endif %}"
                      "{% if loop.index > 3 %}{% break %}{% endif %}{{ m.role }}{% endfor %}",
    "recursive loop": "{% for x in [[1, [2, 3]], 4] recursive %}{% if x is iterable %}[{{ loop(x) }}]"
                      "{% else %}{{ x }}{% endif %}{% endfor %}",
    "macro, call, set and filter blocks": "{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}"
                                          "{% set x %}a{{ messages|length }}{% endset %}{{ x ~ x }}"
                                          "{% filter upper %}up{{ 'per' }}{% endfilter %}",
    "namespace": "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                 "{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}",
    "whitespace control": "  {% for m in messages %}\n    {{- m.role }}\n  {% endfor %}\n{%- if true %}\n  yes\n{% endif %}",
    "operators": "{{ 1 + 2 }}{{ 'a' + 'b' }}{{ 'ab' * 3 }}{{ 2 ** 10 }}{{ '%s-%03d' % ('x', 5) }}{{ [1] + [2] }}"
                 "{{ 'x' ~ 1 ~ none }}{{ '{}:{}'.format(1, 2) }}{{ 'a b'.split() }}",
    "tojson": "{{ messages|tojson }}\n{{ messages[2].tool_calls|tojson(indent=2) }}",
    "undefined": "{{ foo }}{% if foo is defined %}d{% endif %}{% for x in foo %}{% endfor %}{{ 'x' in foo }}"
                 "{% if tools is none and documents is none %}none{% endif %}",
    "filters": "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(', ') }}"
               "{{ 'x'|center(5) }}|{{ 'a\nb'|indent(2, true) }}|{{ [1, 2, 3]|batch(2)|list }}{{ 'abc'|replace('b', 'X') }}"
               "{{ messages|map(attribute='role')|map('upper')|unique|list }}",
}


@pytest.mark.parametrize("name", FEATURES)
def test_instrumentation_renders_like_plain_jinja(name: str) -> None:
    """Our loop, output and `~` checkpoints leave the text exactly as transformers' plain
    environment renders it."""
    source = FEATURES[name]
    context = {"messages": MESSAGES, "tools": None, "documents": None, "add_generation_prompt": True}
    ours = ChatTemplate(source).render(MESSAGES, add_generation_prompt=True)
    assert ours == _transformers_like(source, **context)


def test_generation_tag_renders_its_body() -> None:
    source = "{% for m in messages %}{% generation %}\n{{ m.role }}\n{% endgeneration %}{% endfor %}"
    plain = source.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    assert ChatTemplate(source).render(MESSAGES) == _transformers_like(plain, messages=MESSAGES)


def test_tojson_is_transformers_tojson() -> None:
    """No HTML escaping, non-ASCII kept, key order kept, indent and sort_keys honoured."""
    template = ChatTemplate("{{ x|tojson }}|{{ x|tojson(indent=1) }}|{{ x|tojson(sort_keys=true) }}")
    x = {"z": "<é>", "a": [1]}
    assert template.render([], x=x) == "|".join(
        [json.dumps(x, ensure_ascii=False), json.dumps(x, ensure_ascii=False, indent=1),
         json.dumps(x, ensure_ascii=False, sort_keys=True)]
    )


def test_special_tokens_and_render_defaults() -> None:
    template = ChatTemplate("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools }}{{ documents }}", "<s>", "</s>")
    assert template.render([]) == "<s></s>FalseNoneNone"
    assert template.render([], bos_token="B", add_generation_prompt=True) == "B</s>TrueNoneNone"


def test_raise_exception_carries_the_template_message() -> None:
    template = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('Only user roles!') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="Only user roles!") as info:
        template.render([{"role": "bot", "content": ""}])
    assert info.value.template_message == "Only user roles!"


# ───── GGUF metadata ─────


def test_metadata_without_template_falls_back_to_chatml() -> None:
    metadata = {"tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"], "tokenizer.ggml.bos_token_id": 1,
                "tokenizer.ggml.eos_token_id": 2}
    template = chat_template_from_metadata(metadata)
    assert template.is_fallback and template.source == CHATML_TEMPLATE
    assert template.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    rendered = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_metadata_named_template_and_bad_ids() -> None:
    metadata = {"tokenizer.chat_template": "default", "tokenizer.chat_template.tool_use": "tools",
                "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.bos_token_id": 7}
    assert chat_template_from_metadata(metadata, "tool_use").render([]) == "tools"
    assert chat_template_from_metadata(metadata).special_tokens["bos_token"] == ""  # id past the vocabulary
    with pytest.raises(ChatTemplateError, match="no chat template named 'rag'"):
        chat_template_from_metadata(metadata, "rag")


# ───── hostile templates ─────


ESCAPES = {
    "mro walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "bare dunder": "{% if ''.__class__ %}x{% endif %}",
    "cycler globals": "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "joiner globals": "{{ joiner.__init__.__globals__['os'].system('touch {marker}') }}",
    "lipsum globals": "{{ lipsum.__globals__['os'].popen('touch {marker}') }}",
    "template context": "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch {marker}') }}",
    "subscript dunder": "{{ namespace['__init__']['__globals__']['os'].popen('touch {marker}') }}",
    "format field": "{{ '{0.__class__.__init__.__globals__}'.format(range) }}",
    "mutating a list": "{% set x = [] %}{{ x.append('touch {marker}') }}",
    "import": "{% import 'os' as os %}{{ os.popen('touch {marker}') }}",
    "include": "{% include '/etc/passwd' %}",
}


@pytest.mark.parametrize("name", ESCAPES)
def test_sandbox_escapes_raise_and_run_nothing(name: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    source = ESCAPES[name].replace("{marker}", str(marker))
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    assert not marker.exists()


def test_sandbox_error_names_the_attribute() -> None:
    with pytest.raises(ChatTemplateError, match=r"sandbox on line 2: .*'__globals__'"):
        ChatTemplate("ok\n{{ cycler.next.__globals__ }}").render([])


# ───── work limits ─────
#
# What stops a runaway, and after how much work, must not depend on how fast the machine
# is: the module's clock is replaced by one the test drives (standing still, or advancing a
# fixed amount per reading), and the work is measured: the budget's steps, the characters
# emitted, and the memory allocated during the render.

RUNAWAY_LIMITS = {"max_output_chars": 100_000, "max_steps": 10_000, "timeout": 1.0}
#: "text produced anywhere ... is capped at 4x" max_output_chars (the module's documented rule).
TEXT_FACTOR = 4
#: Peak bytes a stopped runaway may have allocated during the render. Every value is sized
#: before it is made and refused past max_output_chars (one-byte characters here), so at
#: most about one value at the cap is alive, plus the copy being made of it, plus the
#: interpreter's own small objects: 3 x max_output_chars.
TEXT_PEAK = 3 * RUNAWAY_LIMITS["max_output_chars"]
#: A recursion is stopped by Python's recursion limit, not by a cap of this module: its
#: frames (under 2 KiB per Python frame) are what it holds.
FRAMES_PEAK = 2048 * sys.getrecursionlimit()

FLOOD_PIECE = "0123456789" * 10
# name -> (source, most steps it may take given (max_steps, max_output_chars)); the name
# says which bound stops it.
RUNAWAYS = {
    "nested ranges -> max_steps": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        lambda steps, chars: steps + 1),
    "nested strings -> max_steps": (
        "{% for a in 'xxxxxxxxxx' %}{% for b in 'xxxxxxxxxx' %}{% for c in 'xxxxxxxxxx' %}"
        "{% for d in 'xxxxxxxxxx' %}{% for e in 'xxxxxxxxxx' %}{% for f in 'xxxxxxxxxx' %}"
        "{% endfor %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}",
        lambda steps, chars: steps + 1),
    "exponential macro -> max_steps": (  # 2**21 calls
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(20) }}",
        lambda steps, chars: steps + 1),
    # One call (one step) per level, and each level more than one Python frame.
    "endless recursion -> recursed": (
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        lambda steps, chars: sys.getrecursionlimit()),
    "endless recursive loop -> recursed": (
        "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}",
        lambda steps, chars: sys.getrecursionlimit()),
    # The prompt passes max_output_chars at inner iteration chars // 100 + 1; plus the
    # first outer iteration and the two range() calls.
    "output flood -> max_output_chars": (
        "{% for i in range(100000) %}{% for j in range(100000) %}" + FLOOD_PIECE + "{% endfor %}{% endfor %}",
        lambda steps, chars: chars // len(FLOOD_PIECE) + 4),
    # 90,000 characters per iteration pass the text budget at iteration 4 * chars // 90000 + 1;
    # plus the calls of range() and m().
    "text in a discarded macro -> text budget": (
        "{% set s = 'x' * 90000 %}{% macro m() %}{% for i in range(1000) %}{{ s }}"
        "{% endfor %}{% endmacro %}{% set y = m() %}",
        lambda steps, chars: TEXT_FACTOR * chars // 90000 + 3),
    # The doubling that would pass max_output_chars is refused: iteration chars.bit_length();
    # plus the calls of namespace() and range().
    "doubling with ~ -> max_output_chars": (
        "{% set ns = namespace(s='x') %}{% for i in range(80) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        lambda steps, chars: chars.bit_length() + 2),
    # Refused before the one operation that would make the value: at most that call's step.
    "string times huge -> max_output_chars": ("{{ 'a' * 10 ** 12 }}", lambda steps, chars: 1),
    "huge power -> integer": ("{{ 10 ** (10 ** 9) }}", lambda steps, chars: 1),
    "format width -> max_output_chars": (
        "{{ '%999999999999s' % 'x' }}{{ '{:>999999999999}'.format('x') }}", lambda steps, chars: 1),
    "center width -> max_output_chars": ("{{ 'x'|center(999999999999) }}", lambda steps, chars: 1),
    "replace every gap -> max_output_chars": (
        "{% set s = 'x' * 90000 %}{{ s.replace('', s) }}", lambda steps, chars: 1),
    "repr of many refs -> max_output_chars": ("{% set s = 'x' * 90000 %}{{ [s] * 1000 }}", lambda steps, chars: 1),
    "indent many lines -> max_output_chars": (
        "{% set s = '\n' * 90000 %}{{ s|indent(90000) }}", lambda steps, chars: 1),
}


class _Clock:
    """Stands in for the `time` module llm_smolq.chat.template reads: reading n of
    monotonic() (counting from 0) returns n * tick. After `runaway_after` readings it jumps
    to infinity, so that a render whose work limits failed ends at once on the deadline
    (which the test then reports as the wrong limit) instead of running for hours."""

    def __init__(self, tick: float = 0.0, runaway_after: int | None = None):
        self.tick, self.runaway_after, self.readings = tick, runaway_after, 0

    def monotonic(self) -> float:
        n = self.readings
        self.readings += 1
        if self.runaway_after is not None and n >= self.runaway_after:
            return math.inf
        return n * self.tick

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def budgets(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every _Budget made while the test runs (one per compile, one per render)."""
    made: list = []

    class Recorded(chat_template._Budget):
        __slots__ = ()

        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(chat_template, "_Budget", Recorded)
    return made


def _render_budget(template: ChatTemplate, budgets: list, monkeypatch: pytest.MonkeyPatch, clock: _Clock,
                   *args, **kwargs):
    """Render with `clock` as the module's clock: (the text or the ChatTemplateError,
    the render's budget, peak bytes allocated during the render)."""
    budgets.clear()
    monkeypatch.setattr(chat_template, "time", clock)
    tracemalloc.start()
    try:
        try:
            result = template.render(*args, **kwargs)
        except ChatTemplateError as exc:
            result = exc
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        monkeypatch.setattr(chat_template, "time", time)
    (budget,) = budgets
    return result, budget, peak


@pytest.mark.parametrize("name", RUNAWAYS)
def test_runaway_templates_are_stopped_by_the_named_limit(name: str, budgets: list,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With the clock standing still only the work limits can stop a runaway: the named one
    does, after at most the steps it allows, within the text budget and TEXT_PEAK bytes
    (FRAMES_PEAK for a recursion)."""
    source, most_steps = RUNAWAYS[name]
    max_steps, max_chars = RUNAWAY_LIMITS["max_steps"], RUNAWAY_LIMITS["max_output_chars"]
    template = ChatTemplate(source, **RUNAWAY_LIMITS)
    clock = _Clock(runaway_after=10 * max_steps)
    error, budget, peak = _render_budget(template, budgets, monkeypatch, clock, [])
    bound = name.split("-> ")[1]
    assert isinstance(error, ChatTemplateError), error
    assert re.search(bound, str(error)), str(error)
    if bound == "max_steps":
        assert budget.steps == max_steps + 1
    assert budget.steps <= most_steps(max_steps, max_chars), budget.steps
    # The last piece emitted is within max_output_chars, the total before it within the text budget.
    assert budget.emitted <= (TEXT_FACTOR + 1) * max_chars, budget.emitted
    assert peak <= (FRAMES_PEAK if bound == "recursed" else TEXT_PEAK), peak


def test_default_limits_stop_an_endless_loop_after_a_million_steps(budgets: list,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the defaults an endless loop does at most max_steps = 1,000,000 steps; the clock
    stands still, so the step limit alone stops it."""
    template = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    budgets.clear()
    monkeypatch.setattr(chat_template, "time", _Clock(runaway_after=2_000_000))
    with pytest.raises(ChatTemplateError, match=r"max_steps=1000000 "):
        template.render([])
    (budget,) = budgets
    assert (budget.steps, budget.emitted) == (1_000_001, 0)


def test_the_deadline_stops_a_render_whatever_max_steps(budgets: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a huge step allowance the deadline stops the render. The clock advances `tick`
    at every reading: one when the render starts (the deadline is that + timeout) and one
    per step, so step timeout / tick + 1 is the first to read a time past the deadline."""
    tick, timeout = 2.0**-10, 0.25  # exact in binary: n * tick is never rounded
    template = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                            max_steps=10**12, timeout=timeout)
    clock = _Clock(tick=tick)
    error, budget, _ = _render_budget(template, budgets, monkeypatch, clock, [])
    assert isinstance(error, ChatTemplateError) and "timeout=0.25s" in str(error), error
    expected = round(timeout / tick) + 1
    assert budget.steps == expected == 257
    assert clock.readings == expected + 1


def test_bounds_leave_ordinary_templates_alone(smollm3_template: ChatTemplate, budgets: list,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A long conversation with tools renders under the default limits (1,000,000 steps,
    1,000,000 characters), using a small part of them; the clock stands still."""
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 2000, "parameters": {}}}
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} " * 50} for i in range(400)]
    rendered, budget, _ = _render_budget(smollm3_template, budgets, monkeypatch, _Clock(runaway_after=10**7),
                                         messages, add_generation_prompt=True, xml_tools=[tool] * 20)
    assert isinstance(rendered, str), rendered
    assert rendered.count("<|im_start|>") == 402
    assert budget.steps <= 1_000_000 // 10, budget.steps
    assert len(rendered) <= budget.emitted <= 1_000_000 // 2, budget.emitted


@pytest.mark.parametrize(
    ("source", "line"),
    [("{% for x in %}", 1), ("ok\n\n{{ foo( }}", 3), ("{% if x %}\nno end", 2), ("{% generation %}x", 1)],
)
def test_syntax_errors_name_the_line(source: str, line: int) -> None:
    with pytest.raises(ChatTemplateError, match=rf"syntax error on line {line}\b") as info:
        ChatTemplate(source)
    assert info.value.lineno == line


def test_oversized_and_non_text_sources_are_refused() -> None:
    with pytest.raises(ChatTemplateError, match="MAX_TEMPLATE_CHARS"):
        ChatTemplate("x" * (300 * 1024))
    with pytest.raises(ChatTemplateError, match="must be text"):
        ChatTemplate(b"{{ x }}")  # type: ignore[arg-type]
