"""The closing step of schema answers (llm_smolq/decode/json_closing.py): from any point
of a constrained answer, the fewest tokens that make it a complete document valid for
its schema, and a reserve that keeps such a closing within max_tokens.

Answers here are random walks through the constraint's mask on SmolLM2's real 49k
vocabulary (any allowed token, as a model might pick), cut anywhere."""

import gc
import json
import random
import time

import jsonschema
import llm
import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from llm_smolq.decode.constrained import Constraint, ConstraintError, close_objects
from llm_smolq.decode.json_closing import (
    JsonCloser,
    check_max_tokens,
    minimal_document_tokens,
)
from llm_smolq.model.tokenizer import GGUFTokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    return GGUFTokenizer.from_gguf(smollm2_gguf)


@pytest.fixture(scope="module")
def structural(tokenizer):
    """Tokens that move a JSON document on (quotes, brackets, digits, separators...):
    half the walk's steps pick among these, so walks leave their strings."""
    out = np.zeros(tokenizer.vocab_size, bool)
    for i in range(tokenizer.vocab_size):
        data = b"" if tokenizer.is_control(i) else tokenizer.token_to_bytes(i)
        if data and (any(c in b'"\\{}[],:-0123456789' for c in data) or data in (b"true", b"false", b"null")):
            out[i] = True
    return out


def text_of(tokenizer, ids) -> str:
    return b"".join(tokenizer.token_to_bytes(int(t)) for t in ids).decode("utf-8")


def assert_valid(tokenizer, constraint, closing, schema):
    """The answer so far plus its closing: accepted by the grammar, a JSON value, valid
    against the schema (and with no property the schema does not name)."""
    done = constraint.fork()
    done.consume_all(closing)
    assert done.accepting
    text = text_of(tokenizer, constraint.tokens + list(closing))
    value = json.loads(text)
    jsonschema.validate(value, schema)
    jsonschema.validate(value, close_objects(schema))
    return text


def walk(constraint, rng, structural, steps, on_step=None, moving=0.5):
    """Consume up to `steps` random allowed tokens (never end-of-turn), a share
    `moving` of them among the structural ones."""
    for _ in range(steps):
        allowed = constraint.allowed()
        allowed[list(constraint.end_ids)] = False
        ids = np.flatnonzero(allowed)
        if ids.size == 0:
            return
        if rng.random() < moving:
            onward = np.flatnonzero(allowed & structural)
            if onward.size:
                ids = onward
        constraint.consume(int(ids[rng.randrange(ids.size)]))
        if on_step is not None:
            on_step()
        if constraint.finished:
            return


# -- schemas ---------------------------------------------------------------------------

PATTERNS = ["^[A-Z]{2}-[0-9]{3}$", "b+c", "^[a-z]+@[a-z]+\\.com$", "^(yes|no|maybe)$", "\\d{2,3}", "^x?y*z$"]
NAMES = ["a", "name", "age", "tags", "x_y", "été", 'q"t']

strings = st.one_of(
    st.just({"type": "string"}),
    st.builds(lambda lo, extra: {"type": "string", "minLength": lo, **({"maxLength": lo + extra} if extra is not None else {})},
              st.integers(0, 4), st.none() | st.integers(0, 4)),
    st.builds(lambda p: {"type": "string", "pattern": p}, st.sampled_from(PATTERNS)),
)


def _bounded(kind, lo, span, exclusive):
    schema = {"type": kind}
    if lo is not None:
        schema["exclusiveMinimum" if exclusive else "minimum"] = lo
        if span is not None:
            schema["maximum"] = lo + span + (1 if exclusive else 0)
    elif span is not None:
        schema["maximum"] = span
    return schema


numbers = st.one_of(
    st.builds(_bounded, st.just("integer"), st.none() | st.integers(-30, 30), st.none() | st.integers(0, 40), st.booleans()),
    st.builds(_bounded, st.just("number"), st.none() | st.sampled_from([-1.5, 0, 0.5, 2, 99]),
              st.none() | st.sampled_from([0, 0.25, 3, 250]), st.booleans()),
)
literals = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(["red", "green", 'a "q"\n', "naïve ☃", 1, 2.5, None, True]),
                                                 min_size=1, max_size=4, unique=True)),
    st.builds(lambda v: {"const": v}, st.sampled_from(["point", 7, False, None])),
)
leaves = st.one_of(strings, numbers, literals)


def _object(props, data):
    names = list(props)
    required = [n for n in names if data.draw(st.booleans())]
    return {"type": "object", "properties": props, "required": required}


def composites(children):
    return st.one_of(
        st.builds(lambda props, data: _object(props, data),
                  st.dictionaries(st.sampled_from(NAMES), children, min_size=1, max_size=4), st.data()),
        st.builds(lambda item, lo, extra: {"type": "array", "items": item, "minItems": lo,
                                           **({"maxItems": lo + extra} if extra is not None else {})},
                  children, st.integers(0, 2), st.none() | st.integers(0, 3)),
        st.builds(lambda alts: {"anyOf": alts}, st.lists(children, min_size=2, max_size=3)),
    )


schemas = st.recursive(leaves, composites, max_leaves=6)

# Schemas the generator above does not make: llm's own DSL, nesting with bounds, recursion,
# formats, minProperties, multipleOf, allOf, open objects, tuples.
CATALOGUE = {
    "person (llm DSL)": llm.schema_dsl("name, age int, bio, likes_cats bool"),
    "people (DSL, multi)": llm.schema_dsl("name: first name, age int", multi=True),
    "nested with bounds": {
        "type": "object",
        "properties": {"address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "geo": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                                     "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                    "required": ["lat", "lon"]}},
            "required": ["city", "geo"]}},
        "required": ["address"],
    },
    "formats": {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                                 "e": {"type": "string", "format": "email"},
                                                 "u": {"type": "string", "format": "uuid"}}, "required": ["d", "e", "u"]},
    "recursive tree": {"$defs": {"T": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                        "kids": {"type": "array", "items": {"$ref": "#/$defs/T"}}},
                                       "required": ["v", "kids"]}}, "$ref": "#/$defs/T"},
    "map with minProperties": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 3}, "minProperties": 2},
    "multiples": {"type": "object", "properties": {"q": {"type": "number", "multipleOf": 0.25, "minimum": 0.3},
                                                   "i": {"type": "integer", "multipleOf": 7, "minimum": 20}},
                  "required": ["q", "i"]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "string", "minLength": 2}}, "required": ["b"]}]},
    "open object": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
    "tuple": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 3}],
              "items": False, "minItems": 2},
    "anything": {},
}

any_schema = st.one_of(schemas, st.sampled_from(sorted(CATALOGUE)).map(CATALOGUE.get))


def constraint_for(tokenizer, schema):
    try:
        return Constraint.for_json_schema(tokenizer, schema)
    except ConstraintError:  # a schema llguidance itself refuses is not this module's case
        reject()  # that example is discarded; a skip here would skip the whole property


# -- properties ----------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, derandomize=True)
@given(schema=any_schema, seed=st.integers(0, 2**32 - 1), steps=st.integers(0, 90),
       moving=st.sampled_from([0.1, 0.3, 0.6]))
def test_a_walk_cut_anywhere_closes_into_a_valid_document(tokenizer, structural, schema, seed, steps, moving):
    """After every token of a random walk: the closing validates, it is what length()
    said, it fits in the reserve predicted before that token, and it came from the
    automaton (not from the search, which only covers what it does not model)."""
    constraint = constraint_for(tokenizer, schema)
    closer = JsonCloser(constraint)
    predicted = [closer.reserve()]

    def check():
        closing = closer.tokens()
        assert len(closing) == closer.length() <= closer.reserve()
        assert len(closing) <= predicted[-1], "one token grew the closing past the reserve"
        predicted.append(closer.reserve())

    walk(constraint, random.Random(seed), structural, steps, on_step=check, moving=moving)
    closing = closer.tokens()
    assert_valid(tokenizer, constraint, closing, schema)
    assert closer.searched == 0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(schema=any_schema, seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_no_single_token_closes_what_the_closing_does_in_several(tokenizer, structural, schema, seed, steps):
    """Minimality where it can be checked exhaustively: if one allowed token ends the
    document validly, the closing is that long. (The grammar also takes "}" after
    {"": 1, "": 2} for minProperties 2, which JSON reads as one property: the closing
    does not.)"""
    constraint = constraint_for(tokenizer, schema)
    walk(constraint, random.Random(seed), structural, steps)
    closing = JsonCloser(constraint).tokens()
    if len(closing) < 2:
        return
    allowed = constraint.allowed()
    allowed[list(constraint.end_ids)] = False
    for t in np.flatnonzero(allowed & structural).tolist():
        after = constraint.fork()
        after.consume(t)
        if after.accepting:
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(json.loads(text_of(tokenizer, after.tokens)), schema)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(schema=any_schema, seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_a_search_over_the_grammar_finds_no_shorter_closing(tokenizer, structural, schema, seed, steps):
    """The grammar's own breadth-first search (one-byte and punctuation tokens, plus the
    closing's own) finds nothing shorter than the closing."""
    from llm_smolq.decode.json_closing import _search, _vocabulary

    constraint = constraint_for(tokenizer, schema)
    walk(constraint, random.Random(seed), structural, steps)
    closing = JsonCloser(constraint).tokens()
    try:
        found = _search(constraint, _vocabulary(tokenizer), closing, budget=200)
    except ConstraintError:  # nothing within its limits (a long closing: uuid, email...)
        return
    assert len(found) >= len(closing), (text_of(tokenizer, constraint.tokens), text_of(tokenizer, closing),
                                         text_of(tokenizer, found))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(schema=any_schema, extra=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
def test_a_budgeted_generation_always_ends_valid_within_max_tokens(tokenizer, structural, schema, extra, seed):
    """The decode loop's rule: sample while max_tokens - len(output) > reserve(), then
    append the closing. From the minimal budget up, the answer is valid and fits."""
    least = len(minimal_document_tokens(tokenizer, schema))
    max_tokens = least + extra
    constraint = constraint_for(tokenizer, schema)
    closer = JsonCloser(constraint)
    rng = random.Random(seed)
    while not constraint.finished:
        if max_tokens - len(constraint.tokens) <= closer.reserve():
            constraint.consume_all(closer.tokens())
            break
        allowed = constraint.allowed()
        if constraint.accepting and rng.random() < 0.2:
            break  # the model chose end-of-turn
        allowed[list(constraint.end_ids)] = False
        moving = np.flatnonzero(allowed & structural)
        ids = moving if moving.size and rng.random() < 0.5 else np.flatnonzero(allowed)
        constraint.consume(int(ids[rng.randrange(ids.size)]))
    assert len(constraint.tokens) <= max_tokens
    value = json.loads(text_of(tokenizer, constraint.tokens))
    jsonschema.validate(value, schema)


# -- examples ----------------------------------------------------------------------------

@pytest.mark.parametrize("schema, text", [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]},
     '{"name": "", "age": 0}'),
    ({"type": "object", "properties": {"name": {"type": "string"}, "note": {"type": "string"}}, "required": ["name"]},
     '{"name": ""}'),  # optional properties are left out
    ({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, '"AA-000"'),
    ({"type": "integer", "minimum": 10, "maximum": 12}, "10"),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "1"),
    ({"type": "number", "minimum": -7.5, "maximum": -2.25}, "-3"),
    ({"enum": ["a long value", "short", 12345]}, '"short"'),
    ({"const": {"k": [1, "v"]}}, '{"k": [1, "v"]}'),
    ({"type": "array", "items": {"type": "boolean"}, "minItems": 2}, "[true, true]"),
    ({"type": ["null", "object"]}, "{}"),
    ({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"type": "null"}]}, "null"),
])
def test_minimal_documents(tokenizer, schema, text):
    ids = minimal_document_tokens(tokenizer, schema)
    assert text_of(tokenizer, ids) == text
    assert len(ids) <= len(tokenizer.encode(text))


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13])
def test_a_string_filled_to_its_min_length_takes_no_more_tokens_than_any_run(tokenizer, count):
    ids = minimal_document_tokens(tokenizer, {"type": "string", "minLength": count})
    value = json.loads(text_of(tokenizer, ids))
    assert len(value) == count
    runs = [len(tokenizer.encode(json.dumps(chr(c) * count))) for c in range(0x20, 0x7F)]
    assert len(ids) <= min(runs)


def test_a_max_tokens_below_the_minimum_is_refused_with_the_minimum(tokenizer):
    schema = llm.schema_dsl("name, age int, likes_cats bool")
    least = len(minimal_document_tokens(tokenizer, schema))
    assert 5 < least < 20
    assert check_max_tokens(tokenizer, schema, least) == least
    with pytest.raises(ConstraintError, match=f"max_tokens={least - 1} is too few .* takes {least} tokens"):
        check_max_tokens(tokenizer, schema, least - 1)


def test_closing_leaves_the_constraint_as_it_was(tokenizer):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}, "required": ["tags"]}
    constraint = Constraint.for_json_schema(tokenizer, schema)
    constraint.consume_all(tokenizer.encode('{"tags": ["red", "gre'))
    before = list(constraint.tokens)
    closer = JsonCloser(constraint)
    closing = closer.tokens()
    assert text_of(tokenizer, closing) == '"]}'
    assert closer.length() == len(closing) <= closer.reserve()
    assert constraint.tokens == before and not constraint.accepting
    constraint.consume_all(tokenizer.encode('en", "blue"]}'))  # the answer goes on as if nothing happened
    assert constraint.finished
    assert closer.tokens() == []


def test_an_answer_caught_in_a_repetition_still_ends_valid(tokenizer):
    """What happened to smollm2-q: a list of strings repeated until max_tokens, cut
    mid-string. With the reserve kept in hand the last tokens close the document."""
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "items": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "items"]}
    max_tokens = 400
    constraint = Constraint.for_json_schema(tokenizer, schema)
    closer = JsonCloser(constraint)
    pending = tokenizer.encode('{"name": "Ann", "items": [')
    loop = tokenizer.encode('"items: [{", ')
    while max_tokens - len(constraint.tokens) > closer.reserve():
        if not pending:
            pending = list(loop)
        constraint.consume(pending.pop(0))
    constraint.consume_all(closer.tokens())
    assert len(constraint.tokens) <= max_tokens
    value = json.loads(text_of(tokenizer, constraint.tokens))
    assert value["name"] == "Ann" and value["items"][0] == "items: [{" and len(value["items"]) > 40


def test_what_the_automaton_does_not_model_is_closed_by_the_search(tokenizer):
    """A case-insensitive pattern: llguidance reads it, this module's pattern reader
    does not, so the closing comes from the search over the matcher, and is valid."""
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(?i)^ab[0-9]{2}$"}},
              "required": ["code"]}
    constraint = Constraint.for_json_schema(tokenizer, schema)
    constraint.consume_all(tokenizer.encode('{"code": "A'))
    closer = JsonCloser(constraint)
    assert closer.lost
    closing = closer.tokens()
    assert closer.searched == 1
    text = assert_valid(tokenizer, constraint, closing, schema)
    assert text.lower() == '{"code": "ab00"}'


def test_the_reserve_costs_well_under_a_decode_step(tokenizer, structural):
    """The loop asks reserve() at every token; over an answer to a schema seen for the
    first time (nothing cached) it must cost far less than a decode step (~5-15 ms).
    Garbage collection is held off while timing: its pauses belong to the process."""
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "occupation": {"type": "string", "maxLength": 40}, "hobbies": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                    "required": ["city", "country"]}},
        "required": ["name", "age", "hobbies", "address"], "title": f"person {time.time()}"}
    spent = []
    for seed in range(3):
        constraint = Constraint.for_json_schema(tokenizer, schema)
        closer = JsonCloser(constraint)
        rng = random.Random(seed)
        gc.disable()
        try:
            for _ in range(300):
                allowed = constraint.allowed()
                allowed[list(constraint.end_ids)] = False
                ids = np.flatnonzero(allowed)
                moving = np.flatnonzero(allowed & structural)
                if moving.size and rng.random() < 0.15:  # mostly content, as a model writes
                    ids = moving
                constraint.consume(int(ids[rng.randrange(ids.size)]))
                if constraint.finished:
                    break
                start = time.perf_counter()
                closer.reserve()
                spent.append(time.perf_counter() - start)
        finally:
            gc.enable()
    mean_ms = 1e3 * sum(spent) / len(spent)
    assert len(spent) > 100
    assert mean_ms < 1.0, f"reserve() costs {mean_ms:.3f} ms a step"
