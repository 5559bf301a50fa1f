"""Sampling, streaming text and the reasoning split, without a model."""

import numpy as np
import pytest

from llm_smolq.generation import ReasoningSplitter, Sampler, SamplingParams, TextStream


def test_temperature_zero_is_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert Sampler(SamplingParams(temperature=0))(logits, []) == 1


def test_seeded_sampling_repeats_and_differs_by_seed():
    logits = np.random.default_rng(0).normal(size=500).astype(np.float32)

    def draws(seed):
        sampler = Sampler(SamplingParams(temperature=1.5, top_p=1.0, seed=seed))
        return [sampler(logits, []) for _ in range(40)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


def test_top_k_and_top_p_limit_the_choices():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    top_k = Sampler(SamplingParams(temperature=1.0, top_p=1.0, top_k=2, seed=0))
    assert {top_k(logits, []) for _ in range(200)} == {0, 1}
    top_p = Sampler(SamplingParams(temperature=1.0, top_p=0.75, seed=0))
    assert {top_p(logits, []) for _ in range(200)} == {0, 1}
    min_p = Sampler(SamplingParams(temperature=1.0, top_p=1.0, min_p=0.5, seed=0))
    assert {min_p(logits, []) for _ in range(200)} == {0, 1}


def test_repeat_penalty_turns_greedy_away_from_recent_tokens():
    logits = np.array([2.0, 1.9, 0.0])
    greedy = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5))
    assert greedy(logits, []) == 0
    assert greedy(logits, [0]) == 1


def test_text_stream_joins_split_utf8_and_holds_back_stop_prefixes():
    stream = TextStream(["STOP"])
    euro = "€".encode()
    assert stream.push(euro[:1]) == ""
    assert stream.push(euro[1:]) == "€"
    assert stream.push(b"abc ST") == "abc "  # "ST" might begin "STOP"
    assert stream.push(b"OP and more") == ""
    assert stream.stopped and stream.text == "€abc "


def test_text_stream_releases_a_held_prefix_that_was_not_a_stop():
    stream = TextStream(["STOP"])
    assert stream.push(b"ST") == ""
    assert stream.push(b"ART") == "START"
    assert stream.flush() == "" and not stream.stopped


@pytest.mark.parametrize("cut", range(1, 40))
def test_reasoning_splitter_any_chunking(cut):
    text = "<think>\nweighing it up</think>\n\nThe answer."
    splitter = ReasoningSplitter()
    pieces = []
    for i in range(0, len(text), cut):
        pieces += splitter.push(text[i:i + cut])
    pieces += splitter.flush()
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    answer = "".join(t for k, t in pieces if k == "text")
    assert (reasoning, answer) == ("weighing it up", "The answer.")


def test_reasoning_splitter_passes_plain_answers_through():
    splitter = ReasoningSplitter()
    assert splitter.push("<th") == []
    assert splitter.push("is is text") == [("text", "<this is text")]
