"""Streaming text and the reasoning split, without a model (sampling: test_sampling.py)."""

import pytest

from llm_smolq.chat.reasoning import ReasoningSplitter
from llm_smolq.decode.generate import TextStream


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
