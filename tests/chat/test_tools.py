"""Tool calling: SmolLM3's <tool_call> format, the stream parser, and whole chains run by
llm's own machinery (Python API and `llm -T ... --td`)."""

import asyncio
import json
from datetime import datetime
from types import SimpleNamespace

import jsonschema
import llm
import numpy as np
import pytest
from click.testing import CliRunner
from llm.cli import cli
from llm.parts import Message, ReasoningPart, TextPart, ToolCallPart, ToolResultPart
from llm.tools import llm_version

import llm_smolq.plugin.loaded as loaded_models
import llm_smolq
import llm_smolq.decode.generate
import llm_smolq.decode.sampling
from llm_smolq.plugin import turn
from llm_smolq.chat.template import ChatTemplate, chat_template_from_gguf
from llm_smolq.chat.tool_calls import (
    ParsedCall,
    ToolCallParser,
    format_tool_call,
    template_tools,
    tool_call_schema,
    tool_spec,
)

TINY3 = "tiny-smollm3-chat-Q8_0.gguf"
CALL_VERSION = '<tool_call>\n{"name": "llm_version", "arguments": {}}\n</tool_call>'


def add(a: int, b: int = 2) -> int:
    """Add two numbers."""
    return a + b


# ───── the stream parser ─────


def parse(text, step=None):
    """Feed `text` in chunks of `step` characters (None: all at once); return the pieces
    with adjacent text joined, and the parser."""
    parser = ToolCallParser()
    step = step or len(text)
    chunks = [text[i:i + step] for i in range(0, len(text), step)]
    pieces = []
    for chunk in chunks:
        pieces += parser.push(chunk)
    pieces += parser.flush()
    joined = []
    for kind, value in pieces:
        if kind == "text" and joined and joined[-1][0] == "text":
            joined[-1] = ("text", joined[-1][1] + value)
        else:
            joined.append((kind, value))
    return joined, parser


TRICKY = (
    'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "a </tool_call> b {[\\"", '
    '"n": [1, {"deep": {}}]}}\n</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n\nDone.'
)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 11, None])
def test_calls_are_separated_from_text_however_the_stream_is_cut(step):
    pieces, parser = parse(TRICKY, step)
    assert pieces == [
        ("text", "Let me look."),
        ("call", ParsedCall("search", {"q": 'a </tool_call> b {["', "n": [1, {"deep": {}}]})),
        ("call", ParsedCall("add", {"a": 1})),
        ("text", "Done."),
    ]
    assert parser.errors == [] and len(parser.calls) == 2


def test_text_without_calls_passes_through_unchanged_and_partial_tags_are_held():
    text = "A <b>tag</b>, a <tool and a <tool_cal but no call.\n\n"
    assert parse(text, 1)[0] == [("text", text)]
    parser = ToolCallParser()
    assert parser.push("Hi <tool_ca") == [("text", "Hi")]  # the rest could still be a call
    assert parser.push("r") == [("text", " <tool_car")]
    assert parser.flush() == []


def test_a_malformed_call_stays_in_the_answer_as_written_and_parsing_goes_on():
    bad = '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
    pieces, parser = parse(f"First {bad} then {CALL_VERSION}", 4)
    assert pieces == [("text", f"First {bad} then"), ("call", ParsedCall("llm_version", {}))]
    assert len(parser.errors) == 1 and "not valid JSON" in parser.errors[0] and '"a": 1,' in parser.errors[0]


@pytest.mark.parametrize(
    "block, why",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>', "not closed"),  # a brace short
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "list"),
        ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', "not JSON"),
        ('<tool_call>add(a=1)</tool_call>', "no JSON object"),
        ('<tool_call>{"name": "add"} trailing</tool_call>', "text after"),
    ],
)
def test_each_kind_of_bad_block_is_text_with_a_reason(block, why):
    pieces, parser = parse(block + " ok", 3)
    assert pieces == [("text", block + " ok")]
    assert len(parser.errors) == 1 and why in parser.errors[0]


def test_lenient_forms_models_write():
    assert parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call>')[0] == [
        ("call", ParsedCall("add", {"a": 3}))]
    assert parse('<tool_call>{"name": "llm_version"}</tool_call>')[0] == [("call", ParsedCall("llm_version", {}))]


def test_the_end_of_the_answer_inside_a_block():
    # Complete JSON, close tag missing or cut: still the call the model made.
    assert parse('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool')[0] == [
        ("call", ParsedCall("add", {"a": 1}))]
    # Cut inside the JSON: the text, and why.
    pieces, parser = parse('Hm <tool_call>{"name": "add", "argu', 2)
    assert pieces == [("text", 'Hm <tool_call>{"name": "add", "argu')]
    assert "ended before </tool_call>" in parser.errors[0] and parser.cut
    assert not parse('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')[1].cut


# ───── tools in, history back ─────


def test_tool_spec_and_the_schema_a_call_must_match():
    tools = [llm.Tool.function(add), llm.Tool.function(llm_version)]
    assert tool_spec(tools[0]) == {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"properties": {"a": {"type": "integer"}, "b": {"default": 2, "type": "integer"}},
                       "required": ["a"], "type": "object"},
    }
    schema = tool_call_schema(tools)
    for good in ({"name": "add", "arguments": {"a": 1}}, {"name": "llm_version", "arguments": {}}):
        jsonschema.validate(good, schema)
        assert parse(format_tool_call(**good))[0] == [("call", ParsedCall(**good))]
    for bad in ({"name": "add", "arguments": {"a": "one"}}, {"name": "add", "arguments": {}},
                {"name": "sub", "arguments": {"a": 1}}, {"name": "add"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_a_template_without_a_tool_format_is_refused():
    chatml = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(llm.ModelError, match="smollm2-q cannot call tools.*llm -m smollm3-q -T"):
        template_tools([llm.Tool.function(add)], chatml.variables, "smollm2-q")


def test_a_chains_history_renders_as_transformers_renders_smollm3s_tool_turn(reference_dir):
    """llm's messages for a call and its result, through template_messages, give exactly
    the prompt transformers renders for SmolLM3's own tool-turn example."""
    case = next(c for c in json.loads((reference_dir / "smollm3-template-A.json").read_text())["cases"]
                if c["name"] == "tool result turn" and c["add_generation_prompt"])
    messages = [
        Message("user", [TextPart("Weather in Paris?")]),
        Message("assistant", [ReasoningPart("They want the weather."),
                              ToolCallPart(name="get_weather", arguments={"city": "Paris"}, tool_call_id="c1")]),
        Message("tool", [ToolResultPart(name="get_weather", output="18C, sunny", tool_call_id="c1")]),
    ]
    rendered_messages = turn.template_messages(SimpleNamespace(messages=messages))
    assert rendered_messages == case["messages"]
    template = chat_template_from_gguf(reference_dir / TINY3, now=lambda: datetime(2026, 11, 29))
    assert template.render(rendered_messages, add_generation_prompt=True, **case["kwargs"]) == case["rendered"]


def test_text_and_several_calls_and_results_keep_their_order():
    messages = [
        Message("assistant", [TextPart("Two sums."), ToolCallPart(name="add", arguments={"a": 1}),
                              ToolCallPart(name="add", arguments={"a": 2, "b": 5})]),
        Message("tool", [ToolResultPart(name="add", output="3"), ToolResultPart(name="add", output="Error: boom")]),
    ]
    assert turn.template_messages(SimpleNamespace(messages=messages)) == [
        {"role": "assistant", "content": 'Two sums.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
                                         '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 5}}\n</tool_call>'},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "Error: boom"},
    ]


# ───── whole chains through llm ─────


@pytest.fixture
def tiny3(user_dir, reference_dir):
    path = reference_dir / TINY3
    assert run("smolq", "register", str(path), "--alias", "tiny3").exit_code == 0
    return path


@pytest.fixture
def script(monkeypatch, tiny3):
    """The answers the model gives, one per generation: the sampler's choice is replaced by
    these texts' tokens (then end-of-turn). Everything else is real: the template, the
    tokenizer, prefill and the engine evaluating every token, the parsing, llm's chain."""
    engine = llm_smolq.load(tiny3, n_ctx=64, threads=1)
    end_of_turn = engine.tokenizer.token_id("<|im_end|>")
    answers: list[str] = []

    class Scripted:
        def __init__(self, params):
            self.ids = iter(engine.tokenize(answers.pop(0)) + [end_of_turn])

        def __call__(self, logits, recent):
            return next(self.ids)

    monkeypatch.setattr(llm_smolq.decode.generate, "Sampler", Scripted)
    return answers


@pytest.fixture
def renders(monkeypatch):
    """Every prompt the plugin renders: (messages, keyword arguments, text)."""
    seen = []
    real = ChatTemplate.render

    def spy(self, messages, **kwargs):
        text = real(self, messages, **kwargs)
        seen.append((list(messages), kwargs, text))
        return text

    monkeypatch.setattr(ChatTemplate, "render", spy)
    return seen


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_chain_runs_the_tool_and_sends_its_result_back_as_a_tool_turn(tiny3, script, renders):
    version = llm_version()
    script += [CALL_VERSION, f"You have llm {version}."]
    called = []
    chain = llm.get_model("tiny3").chain(
        "Which llm version?", tools=[llm_version], options={"thinking": False},
        after_call=lambda tool, call, result: called.append((call.name, call.arguments, result.output)),
    )
    assert chain.text() == f"You have llm {version}."
    first, second = chain._responses
    assert called == [("llm_version", {}, version)]
    assert [(c.name, c.arguments) for c in first.tool_calls()] == [("llm_version", {})]
    assert first.text() == ""  # the call is not answer text

    # Both prompts list the tool in the template's xml_tools section.
    spec = {"name": "llm_version", "description": "Return the installed version of llm",
            "parameters": {"properties": {}, "type": "object"}}
    assert [kwargs["xml_tools"] for _, kwargs, _ in renders] == [[spec], [spec]]
    assert "### Tools\n\nYou may call one or more functions" in renders[0][2]
    assert f"<tools>\n{spec}\n</tools>" in renders[0][2]
    # The second prompt carries the call and, as a tool turn, its result.
    assert renders[1][0] == [
        {"role": "user", "content": "Which llm version?"},
        {"role": "assistant", "content": CALL_VERSION},
        {"role": "tool", "content": version},
    ]
    assert renders[1][2].endswith(
        f"{CALL_VERSION}<|im_end|>\n<|im_start|>user\n{version}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n")
    # ...and is what reached the engine, reusing the cache up to the end of the call.
    engine = loaded_models.in_memory[str(tiny3.resolve())].engine
    prompt_ids = engine.tokenize(renders[1][2], special=True)
    assert second.input_tokens == len(prompt_ids) and engine.tokens[: len(prompt_ids)] == prompt_ids
    assert second.token_details["cached"] >= first.input_tokens + first.output_tokens


def test_the_cli_chain_with_tools_debug(tiny3, script, user_dir):
    version = llm_version()
    script += ["Checking.\n" + CALL_VERSION, f"It is {version}."]
    result = run("-m", "tiny3", "-o", "thinking", "false", "-T", "llm_version", "Which llm version?", "--td")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"Checking. It is {version}.\n"  # llm puts a space between a chain's answers
    assert "Tool call: llm_version({})" in result.stderr and version in result.stderr
    logged = json.loads(run("logs", "-n", "2", "--json").output)
    assert [entry["response"] for entry in logged] == ["Checking.", f"It is {version}."]
    assert [c["name"] for c in logged[0]["tool_calls"]] == ["llm_version"]
    assert [r["output"] for r in logged[1]["tool_results"]] == [version]


def test_a_call_cut_by_max_tokens_is_not_made_and_the_cli_says_so(tiny3, script, user_dir):
    script += ["Checking.\n" + CALL_VERSION]
    result = run("-m", "tiny3", "-o", "thinking", "false", "-o", "max_tokens", "24", "-T", "llm_version",
                 "Which llm version?", "--td")
    assert result.exit_code == 0, result.output
    assert "Tool call:" not in result.stderr
    assert "llm-smolq: the answer reached max_tokens (24)" in result.stderr
    assert ("llm-smolq: the answer ended inside a tool call, so that call was not made: its text stays in the "
            "answer and `llm logs --json` shows it under tool_call_errors") in result.stderr
    (logged,) = json.loads(run("logs", "-n", "1", "--json").output)
    assert logged["tool_calls"] == [] and logged["response"].startswith("Checking.\n<tool_call>")
    assert "ended before </tool_call>" in logged["response_json"]["tool_call_errors"][0]


def test_with_thinking_on_only_the_answers_call_counts(tiny3, script):
    script += ["<think>\nMaybe " + CALL_VERSION + " would help.\n</think>\n\n" + CALL_VERSION,
               "<think>\nNo " + CALL_VERSION + " needed.\n</think>\nIt is 4."]
    response = llm.get_model("tiny3").prompt("Version?", tools=[llm_version])
    assert response.text() == ""
    assert [(c.name, c.arguments) for c in response.tool_calls()] == [("llm_version", {})]
    reasoning = "".join(e.chunk for e in response.stream_events() if e.type == "reasoning")
    assert reasoning == "Maybe " + CALL_VERSION + " would help.\n"
    answer = llm.get_model("tiny3").prompt("2+2?", tools=[llm_version])
    assert answer.text() == "It is 4." and answer.tool_calls() == []


def test_a_malformed_call_is_shown_as_text_and_logged_not_run(tiny3, script):
    bad = '<tool_call>{"name": "llm_version", "arguments": {</tool_call>'
    script += [bad]
    chain = llm.get_model("tiny3").chain("Version?", tools=[llm_version], options={"thinking": False})
    assert chain.text() == bad
    (only,) = chain._responses
    assert only.tool_calls() == []
    assert "JSON object is not closed" in only.response_json["tool_call_errors"][0]


def test_async_chain(tiny3, script):
    version = llm_version()
    script += [CALL_VERSION, f"Version {version}."]

    async def ask():
        chain = llm.get_async_model("tiny3").chain("Version?", tools=[llm_version], options={"thinking": False})
        return await chain.text()

    assert asyncio.run(ask()) == f"Version {version}."


def test_smollm2_refuses_tools_with_the_fix(user_dir, smollm2_gguf):
    # smollm2-q does not declare tools, so llm itself refuses them
    with pytest.raises(ValueError, match="smollm2-q does not support tools"):
        llm.get_model("smollm2-q").prompt("hi", tools=[llm_version], max_tokens=1).text()
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-T", "llm_version", "hi"])
    assert result.exit_code == 1 and "does not support tools" in result.output
    assert "Traceback" not in result.output
    # a file registered before capabilities were recorded is offered tools, and refuses them when run
    (user_dir / "smolq" / "models.json").write_text(json.dumps({"smolq/old": {"path": str(smollm2_gguf)}}))
    result = CliRunner().invoke(cli, ["-m", "smolq/old", "-T", "llm_version", "hi"])
    assert result.exit_code == 1 and "cannot call tools" in result.output and "llm -m smollm3-q -T" in result.output


# ───── calls constrained to the tools' schemas ─────

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}


def get_weather(city: str, days: int) -> str:
    """Weather forecast for a city."""
    return f"{city}: sunny for {days} days"


@pytest.fixture
def lead_then_sample(monkeypatch, tiny3):
    """The model is made to write a given lead-in (e.g. up to `<tool_call>`); from there on
    it samples freely from its own logits, as masked by the plugin's constraint. The tiny
    model's weights are random: whatever call it writes is valid only by the constraint."""
    engine = llm_smolq.load(tiny3, n_ctx=64, threads=1)
    real = llm_smolq.decode.generate.Sampler
    leads: list[str] = []

    class LeadThenSample:
        def __init__(self, params):
            self.forced = iter(engine.tokenize(leads.pop(0)) if leads else [])
            self.free = real(llm_smolq.decode.sampling.SamplingParams(temperature=1.0, seed=params.seed))

        def __call__(self, logits, recent):
            token = next(self.forced, None)
            return token if token is not None else self.free(logits, recent)

    monkeypatch.setattr(llm_smolq.decode.generate, "Sampler", LeadThenSample)
    return leads


def test_a_call_the_model_opens_is_always_a_valid_call(tiny3, lead_then_sample):
    # A bounded string: an unbounded one lets a random model write until max_tokens.
    weather = llm.Tool(name="get_weather", description="Weather forecast for a city.", input_schema=WEATHER,
                       implementation=get_weather)
    model = llm.get_model("tiny3")
    names = set()
    for seed in range(6):
        lead_then_sample.append("Let me check.\n<tool_call>")
        response = model.prompt("Weather in Paris?", tools=[weather, llm.Tool.function(add)],
                                options={"thinking": False, "seed": seed, "max_tokens": 200})
        text = response.text()
        calls = response.tool_calls()
        assert len(calls) == 1, (text, response.response_json)
        (call,) = calls
        schema = {"get_weather": WEATHER, "add": llm.Tool.function(add).input_schema}[call.name]
        jsonschema.validate(call.arguments, schema)
        names.add(call.name)
        assert "tool_call_errors" not in response.response_json
    assert names == {"get_weather", "add"}


def test_a_freely_written_call_runs_through_the_chain(tiny3, lead_then_sample):
    lead_then_sample += ["<tool_call>", "Done."]
    ran = []
    chain = llm.get_model("tiny3").chain(
        "Add something.", tools=[add], options={"thinking": False, "seed": 3, "max_tokens": 200},
        after_call=lambda tool, call, result: ran.append((call.arguments, result.output)),
    )
    chain.text()
    ((arguments, output),) = ran
    assert isinstance(arguments["a"], int) and output == str(add(**arguments))


def test_reasoning_is_not_constrained_and_the_answer_is(reference_dir):
    from llm_smolq.chat.tool_calls import ToolCallGuard

    engine = llm_smolq.load(reference_dir / TINY3, n_ctx=16, threads=1)
    guard = ToolCallGuard(engine.tokenizer, [llm.Tool.function(add)])
    logits = np.zeros(engine.config.vocab_size, np.float32)
    for token in engine.tokenize("<think>\nA <tool_call>{not json"):
        assert np.isfinite(guard.mask(logits)).all()  # reasoning: everything allowed
        guard.consume(token)
    for token in engine.tokenize("</think>\nSure.\n<tool_call>"):
        assert np.isfinite(guard.mask(logits)).all()
        guard.consume(token)
    allowed = np.flatnonzero(np.isfinite(guard.mask(logits)))  # inside a call now: the JSON must start
    assert 0 < len(allowed) < 20
    assert all(engine.tokenizer.decode([t]).lstrip("\n")[:1] in ("{", "") for t in allowed)
    for token in engine.tokenize('\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'):
        assert np.isfinite(guard.mask(logits)[token])
        guard.consume(token)
    assert np.isfinite(guard.mask(logits)).all() and not guard.skipped  # free again after the call
