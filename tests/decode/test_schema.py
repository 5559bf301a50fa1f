"""Structured output: decoding constrained to a JSON schema (or any llguidance grammar).

The tiny SmolLM3 has random weights, so on its own it never writes JSON: every valid
value it produces here is the constraint's doing. SmolLM2 shows the same on a real model.
"""

import json

import jsonschema
import llm
import numpy as np
import pytest
from pydantic import BaseModel, Field

import llm_smolq.plugin.loaded as loaded_models
import llm_smolq
from llm_smolq.decode.constrained import Constraint, ConstraintError, close_objects, tool_call_grammar
from llm_smolq.decode.generate import Completion, generate
from llm_smolq.decode.sampling import SamplingParams
from helpers.llm_cli import last_logs, run

TINY = "tiny-smollm3-chat-Q8_0.gguf"

SCHEMAS = {
    "person (llm's DSL)": llm.schema_dsl("name, age int, likes_cats bool"),
    "people (DSL, multi)": llm.schema_dsl("name: first name, age int", multi=True),
    "nested objects": {
        "type": "object",
        "properties": {
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "geo": {
                        "type": "object",
                        "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                       "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                        "required": ["lat", "lon"],
                    },
                },
                "required": ["city", "geo"],
            }
        },
        "required": ["address"],
    },
    "array with min/max items": {
        "type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 7}, "minItems": 2, "maxItems": 5,
    },
    "enums": {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2.5, None, True, "XL"]}},
        "required": ["colour", "size"],
    },
    "numbers with bounds": {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "count": {"type": "integer", "minimum": 10, "maximum": 12},
            "negative": {"type": "number", "maximum": -0.5},
        },
        "required": ["ratio", "count", "negative"],
    },
    "booleans and nulls": {
        "type": "object",
        "properties": {"flag": {"type": "boolean"}, "nothing": {"type": "null"},
                       "maybe": {"type": ["string", "null"], "maxLength": 8}},
        "required": ["flag", "nothing", "maybe"],
    },
    "strings with escapes and unicode": {
        "type": "object",
        "properties": {
            "quote": {"enum": ['she said "hi"\n', "naïve ☃ C:\\path\t", "emoji 🎉"]},
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "free": {"type": "string", "maxLength": 30},
        },
        "required": ["quote", "code", "free"],
    },
    "required and optional fields": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                       "note": {"type": "string", "maxLength": 10},
                       "score": {"type": "number", "minimum": 0, "maximum": 5}},
        "required": ["id"],
    },
    "anyOf, const and tuples": {
        "type": "object",
        "properties": {
            "kind": {"const": "point"},
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 4}]},
            "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 3}],
                     "items": False},
        },
        "required": ["kind", "value", "pair"],
    },
}


class Pet(BaseModel):
    kind: str = Field(max_length=12)
    legs: int = Field(ge=0, le=8)


class Owner(BaseModel):
    name: str = Field(max_length=20)
    pets: list[Pet] = Field(max_length=3)


@pytest.fixture(scope="module")
def tiny_engine(reference_dir):
    # The F32 cache: these seeds were chosen on its logits (the random model writes a
    # quote or backslash in few of its strings: 6 answers in 104 seeds, 55 the first).
    return llm_smolq.load(reference_dir / TINY, n_ctx=2048, kv_dtype="f32")


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_gguf):
    return llm_smolq.load(smollm2_gguf, n_ctx=2048)


def chat_ids(engine, question: str) -> list[int]:
    return engine.tokenize(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", special=True)


def constrained_answer(engine, schema, seed, max_tokens=1024, temperature=1.0):
    done = Completion()
    params = SamplingParams(temperature=temperature, top_p=1.0, seed=seed)
    text = "".join(generate(engine, chat_ids(engine, "Answer in JSON."), params, max_tokens, [], done,
                            constraint=Constraint.for_json_schema(engine.tokenizer, schema)))
    return text, done


def assert_valid(text, schema):
    value = json.loads(text)
    jsonschema.validate(value, schema)
    # Objects carry only the properties their schema names.
    jsonschema.validate(value, close_objects(schema))
    return value


@pytest.mark.parametrize("name", SCHEMAS)
def test_random_weights_write_valid_json_for_every_schema(tiny_engine, name):
    """Valid whether the model ends the value itself or runs out of tokens in a free string
    (the closer then ends it: "length"), and it ends most by itself."""
    schema = SCHEMAS[name]
    stopped = 0
    for seed in range(3):
        text, done = constrained_answer(tiny_engine, schema, seed)
        assert done.finish_reason in ("stop", "length"), (seed, text)
        stopped += done.finish_reason == "stop"
        assert_valid(text, schema)
    assert stopped >= 2, name


def test_unconstrained_random_weights_do_not_write_json(tiny_engine):
    """The control for the test above: the same model and seeds without the constraint."""
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=0)
    text = "".join(generate(tiny_engine, chat_ids(tiny_engine, "Answer in JSON."), params, 40, []))
    with pytest.raises(ValueError):
        json.loads(text)


def test_greedy_decoding_is_constrained_too(tiny_engine):
    schema = SCHEMAS["enums"]
    text, done = constrained_answer(tiny_engine, schema, seed=None, temperature=0)
    assert done.finish_reason == "stop"
    assert_valid(text, schema)
    assert constrained_answer(tiny_engine, schema, seed=None, temperature=0)[0] == text


def test_strings_come_out_escaped(tiny_engine):
    """Free strings from random weights pick up quotes, backslashes and control
    characters; the grammar makes the model write them as JSON escapes."""
    schema = {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 3, "maxItems": 3}
    decoded = []
    for seed in (55, 0, 1, 2):
        text, done = constrained_answer(tiny_engine, schema, seed)
        assert done.finish_reason == "stop"
        decoded += assert_valid(text, schema)  # json.loads refuses raw control characters
    assert any(ch in s for s in decoded for ch in '"\\\b\f\n\r\t')  # written as escapes, read back
    assert any(not s.isascii() for s in decoded)


def test_mask_allows_what_the_grammar_allows(tiny_engine):
    tok = tiny_engine.tokenizer
    constraint = Constraint.for_json_schema(tok, {"type": "object", "properties": {"a": {"type": "string"}},
                                                  "required": ["a"]})
    first = np.flatnonzero(constraint.allowed())
    assert first.size and all(tok.token_to_bytes(int(t)).startswith(b"{") for t in first)
    assert not constraint.end_ids & set(first.tolist())  # no ending before the JSON is complete
    constraint.consume_all(tok.encode('{"a": "x'))
    inside = constraint.allowed()
    controls = [i for i in range(tok.vocab_size) if tok.is_control(i)]
    assert not inside[controls].any()  # <|im_start|> etc. are not text
    assert not constraint.accepting
    constraint.consume_all(tok.encode('"}'))
    assert constraint.accepting and constraint.finished
    assert set(np.flatnonzero(constraint.allowed()).tolist()) == constraint.end_ids
    masked = constraint.mask(np.zeros(tok.vocab_size, np.float32))
    assert np.isfinite(masked).sum() == len(constraint.end_ids)
    with pytest.raises(ConstraintError):
        Constraint.for_json_schema(tok, {"type": "integer"}).consume(tok.encode("x")[0])


@pytest.mark.parametrize("name", ["nested objects", "array with min/max items", "strings with escapes and unicode"])
def test_max_tokens_closes_the_value_with_the_shortest_ending(tiny_engine, name):
    """Cut by max_tokens anywhere from the shortest answer up, the value is closed: valid,
    within max_tokens, finish_reason "length" and closed_early."""
    from llm_smolq.decode.json_closing import minimal_document_tokens

    schema = SCHEMAS[name]
    least = len(minimal_document_tokens(tiny_engine.tokenizer, schema))
    closed = 0
    for max_tokens in range(least, least + 40, 3):
        text, done = constrained_answer(tiny_engine, schema, seed=max_tokens, max_tokens=max_tokens)
        assert_valid(text, schema)
        assert len(done.output_ids) <= max_tokens
        assert (done.finish_reason, done.closed_early) in (("stop", False), ("length", True)), done.finish_reason
        closed += done.closed_early
    assert closed  # random weights run long: most of these were closed early


def test_max_tokens_below_the_shortest_answer_is_refused_before_generating(tiny_engine):
    from llm_smolq.decode.json_closing import minimal_document_tokens

    schema = SCHEMAS["nested objects"]
    least = len(minimal_document_tokens(tiny_engine.tokenizer, schema))
    before = tiny_engine.n_past
    with pytest.raises(ConstraintError, match=f"max_tokens={least - 1} is too few for this schema: its shortest "
                                              f"valid answer takes {least} tokens"):
        constrained_answer(tiny_engine, schema, seed=0, max_tokens=least - 1)
    assert tiny_engine.n_past == before  # refused before the prompt was evaluated
    text, done = constrained_answer(tiny_engine, schema, seed=0, max_tokens=least)
    assert_valid(text, schema)
    assert len(done.output_ids) <= least


def test_a_loop_inside_a_schema_answer_is_closed_when_the_guard_ends_it(tiny_engine, monkeypatch):
    """The repetition guard ends a loop inside a string ("aaaa..."): the answer is
    closed (the string ended, the required keys given) rather than cut mid-string."""
    from llm_smolq.decode import generate as generation
    from llm_smolq.decode.generate import RepetitionGuard

    tok = tiny_engine.tokenizer
    lead = tok.encode('{"name": "')
    (a,) = tok.encode("a")

    class Looping:
        def __init__(self, params):
            self.lead = iter(lead)

        def __call__(self, logits, recent):
            return next(self.lead, a)

    monkeypatch.setattr(generation, "Sampler", Looping)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    done = Completion()
    text = "".join(generate(tiny_engine, chat_ids(tiny_engine, "Answer in JSON."), SamplingParams(temperature=0),
                            1000, [], done, constraint=Constraint.for_json_schema(tok, schema),
                            guard=RepetitionGuard(tokens=64, longest_span=8)))
    value = assert_valid(text, schema)
    assert done.finish_reason == "repetition" and done.closed_early and done.repeated_tokens >= 64
    assert value["name"].startswith("a" * 64) and value["age"] == 0
    assert len(done.output_ids) < 200


def test_close_objects_leaves_open_what_the_schema_opens():
    schema = {
        "type": "object",
        "properties": {"properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
                       "extra": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}},
        "allOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {"type": "string"}}}],
        "$defs": {"Thing": {"type": "object", "properties": {"y": {"type": "string"}}}},
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False  # a property named "properties"
    assert "additionalProperties" not in closed["properties"]["properties"]["properties"]["x"]
    assert closed["properties"]["extra"]["additionalProperties"] == {"type": "string"}
    assert all("additionalProperties" not in part for part in closed["allOf"])
    assert closed["$defs"]["Thing"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the caller's schema is not changed


def test_tool_call_grammar_gives_calls_whose_arguments_validate(tiny_engine):
    tools = {
        "get_weather": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                        "required": ["city", "days"]},
        "now": {"type": "object", "properties": {}},
    }
    grammar = tool_call_grammar(tools, tiny_engine.tokenizer)
    names = set()
    for seed in range(6):
        done = Completion()
        text = "".join(generate(tiny_engine, chat_ids(tiny_engine, "Weather?"), SamplingParams(temperature=1.0, seed=seed),
                                512, [], done, constraint=Constraint(tiny_engine.tokenizer, grammar)))
        assert done.finish_reason == "stop", text
        assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
        call = json.loads(text[len("<tool_call>"):-len("</tool_call>")])
        assert set(call) == {"name", "arguments"}
        jsonschema.validate(call["arguments"], close_objects(tools[call["name"]]))
        names.add(call["name"])
    assert names == set(tools)


def test_tool_call_tags_that_are_control_tokens_are_matched_as_tokens(tiny_engine):
    tok = tiny_engine.tokenizer
    constraint = Constraint(tok, tool_call_grammar({"f": None}, tok, open_tag="<|im_start|>"))
    assert np.flatnonzero(constraint.allowed()).tolist() == [tok.token_id("<|im_start|>")]
    with pytest.raises(ConstraintError, match="at least one tool"):
        tool_call_grammar({}, tok)


def test_smollm2_fills_schemas_through_llms_api(user_dir):
    model = llm.get_model("smollm2-q")
    cases = [("Invent a person.", SCHEMAS["person (llm's DSL)"]),
             ("Where is Paris?", SCHEMAS["nested objects"]),
             ("Pick a colour and a size.", SCHEMAS["enums"]),
             ("Make up a product code and a note.", SCHEMAS["strings with escapes and unicode"]),
             ("Give a few small numbers.", SCHEMAS["array with min/max items"]),
             ("Describe a pet owner.", Owner)]
    for seed, (question, schema) in enumerate(cases):  # a different seed for each
        response = model.prompt(question, schema=schema, temperature=0.7, seed=seed)
        text = response.text()
        assert response.response_json["finish_reason"] == "stop", text
        assert_valid(text, schema if isinstance(schema, dict) else schema.model_json_schema())
    assert Owner.model_validate_json(text)


def test_cli_schema_dsl(user_dir):
    result = run("-m", "smollm2-q", "--schema", "name, age int", "-o", "seed", "3", "Invent a dog.")
    assert result.exit_code == 0, result.output
    value = json.loads(result.stdout)
    assert set(value) == {"name", "age"} and isinstance(value["name"], str) and type(value["age"]) is int
    row = last_logs(user_dir)[0]
    assert json.loads(row["response_json"])["finish_reason"] == "stop"
    assert row["schema_id"]  # llm logged the schema with the response


def test_cli_schema_cut_by_max_tokens_is_closed_and_says_so(user_dir):
    result = run("-m", "smollm2-q", "--schema", "name, age int, hobbies", "-o", "seed", "3", "-o", "max_tokens", "22",
                 "Invent a person who has many hobbies.")
    assert result.exit_code == 0, result.output
    value = json.loads(result.stdout)
    assert set(value) == {"name", "age", "hobbies"} and type(value["age"]) is int
    assert ("llm-smolq: the answer reached max_tokens (22): its JSON was closed early with the shortest ending the "
            "schema allows; -o max_tokens N lets it go further") in result.stderr
    logged = json.loads(last_logs(user_dir)[0]["response_json"])
    assert logged["finish_reason"] == "length" and logged["closed_early"] is True


def test_cli_schema_with_too_few_max_tokens_names_the_minimum(user_dir):
    result = run("-m", "smollm2-q", "--schema", "name, age int, hobbies", "-o", "max_tokens", "3", "Invent a person.")
    assert result.exit_code == 1 and not result.stdout
    least = int(result.stderr.split("takes ")[1].split(" ")[0])
    assert least > 3
    assert (f"max_tokens 3 is too few for this schema: its shortest valid answer takes {least} tokens; "
            f"use -o max_tokens {least} or more") in result.stderr
    ok = run("-m", "smollm2-q", "--schema", "name, age int, hobbies", "-o", "max_tokens", str(least), "Invent a person.")
    assert ok.exit_code == 0 and json.loads(ok.stdout)


def test_smollm3_with_a_schema_answers_without_thinking(user_dir, reference_dir):
    path = reference_dir / TINY
    assert run("smolq", "register", str(path), "--alias", "tiny3").exit_code == 0
    schema = SCHEMAS["booleans and nulls"]
    response = llm.get_model("tiny3").prompt("Is it on?", system="Be brief.", schema=schema, seed=5)
    text = response.text()
    assert_valid(text, schema)
    assert not [e for e in response.stream_events() if e.type == "reasoning"]
    engine = loaded_models.in_memory[str(path.resolve())].engine
    prompt = engine.detokenize(engine.tokens)
    assert "Reasoning Mode: /no_think" in prompt and "<think>\n\n</think>" in prompt
    assert "Be brief.\n\nReply with only a JSON value that matches this JSON schema:\n" + json.dumps(schema) in prompt


@pytest.mark.parametrize(
    "schema, says",
    [({"type": "strnig"}, "Invalid type: strnig"),
     ({"type": "integer", "minimum": 5, "maximum": 3}, "minimum (5) is greater than maximum (3)"),
     ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, "/$defs/Missing"),
     ({"type": "string", "pattern": "(unclosed"}, "unclosed group"),
     ({"not": {"type": "string"}}, "not")],
)
def test_a_schema_that_cannot_be_used_is_a_clear_model_error(user_dir, reference_dir, schema, says):
    assert run("smolq", "register", str(reference_dir / TINY), "--alias", "tiny3").exit_code == 0
    with pytest.raises(llm.ModelError, match="the schema cannot be used") as caught:
        llm.get_model("tiny3").prompt("hi", schema=schema).text()
    assert says in str(caught.value)


def test_a_schema_that_is_not_a_dict_is_refused(tiny_engine):
    with pytest.raises(ConstraintError, match="must be an object"):
        Constraint.for_json_schema(tiny_engine.tokenizer, ["type", "string"])


def test_a_constraint_failing_mid_answer_is_a_model_error(user_dir, reference_dir, monkeypatch):
    """Should the matcher refuse a token (llguidance hitting a limit, say), the answer
    stops with a ModelError, not a traceback from inside the grammar library."""
    assert run("smolq", "register", str(reference_dir / TINY), "--alias", "tiny3").exit_code == 0
    monkeypatch.setattr(Constraint, "mask", lambda self, logits: logits)  # sampling ignores the grammar
    with pytest.raises(llm.ModelError, match="the schema could not be followed: token .* is not allowed"):
        llm.get_model("tiny3").prompt("hi", schema={"type": "integer"}, temperature=0).text()
