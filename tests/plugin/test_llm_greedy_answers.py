"""Through llm itself, greedy answers are the engine's: `llm -m smollm2-q -o kv_cache f32
-o temperature 0 -o max_tokens 48` prints the greedy text the engine's own API gives each
conversation of smollm2-chat-A (the real SmolLM2-135M-Instruct Q4_1 file, F32 KV cache),
stopping at 48 tokens or at the end-of-turn token. Those answers are llama.cpp's, token for
token, up to the first step where llama.cpp's top two logits were within NEAR_TIE of each
other: at such near-ties its own two builds' answers part too (three of these six)."""

import json

import llm
import pytest
from click.testing import CliRunner
from llm.cli import cli
from helpers.llm_cli import last_logs

import llm_smolq

GREEDY = ["-o", "kv_cache", "f32", "-o", "temperature", "0", "-o", "max_tokens", "48"]
# Measured: this engine's answers part from llama.cpp's (either build) at steps where
# llama.cpp's top two were 0.02 to 0.30 apart; its builds' from each other at 0.01 to 0.07.
NEAR_TIE = 0.5


@pytest.fixture
def cases(smollm2_chat_cases):
    assert len(smollm2_chat_cases) == 6
    return smollm2_chat_cases


def finish(ids) -> str:
    """How a greedy answer ended: 2 is <|im_end|>, SmolLM2's end of turn."""
    return "stop" if ids[-1] == 2 else "length"


@pytest.mark.parametrize("index", range(6))
def test_llm_gives_the_engines_greedy_answer(index, cases, smollm2_greedy, smollm2_gguf, user_dir):
    case, ids = cases[index], smollm2_greedy[index]
    text = llm_smolq.load(smollm2_gguf, n_ctx=64).detokenize(ids[:-1] if finish(ids) == "stop" else ids)
    messages = case["messages"]
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    if len(turns) == 1:  # one question: the command line, as a user types it
        args = ["-m", "smollm2-q", *GREEDY, *(["-s", system[0]] if system else []), turns[0]["content"]]
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert result.stdout == text + "\n"
        row = last_logs(user_dir)[0]
        input_tokens, output_tokens = row["input_tokens"], row["output_tokens"]
        finish_reason = json.loads(row["response_json"])["finish_reason"]
    else:  # earlier turns given as they were: llm's Python API
        build = {"system": llm.system, "user": llm.user, "assistant": llm.assistant}
        model = llm.get_model("smollm2-q")
        response = model.prompt(messages=[build[m["role"]](m["content"]) for m in messages],
                                kv_cache="f32", temperature=0, max_tokens=48)
        assert response.text() == text
        input_tokens, output_tokens = response.input_tokens, response.output_tokens
        finish_reason = response.response_json["finish_reason"]
    assert input_tokens == len(case["prompt_ids"])
    # The ids end with the end-of-turn token where the answer stopped; the answer's count does not.
    assert output_tokens == len(ids) - (finish(ids) == "stop")
    assert finish_reason == finish(ids)


@pytest.mark.parametrize("build", ["smollm2-chat-A.avx2.json", "smollm2-chat-A.json"])
def test_greedy_answers_are_llama_cpps_up_to_a_near_tie(build, reference_dir, smollm2_greedy):
    theirs = json.loads((reference_dir / build).read_text())["cases"]
    same = 0
    for ours, case in zip(smollm2_greedy, theirs, strict=True):
        step = next((k for k, (a, b) in enumerate(zip(ours, case["greedy_ids"])) if a != b), None)
        if step is None:
            assert len(ours) == len(case["greedy_ids"]), (build, case["messages"])
            same += 1
            continue
        top = sorted((value for _, value in case["top10_per_step"][step]), reverse=True)
        assert top[0] - top[1] <= NEAR_TIE, (build, case["messages"], step, top[:2])
    assert same >= 2, f"{build}: only {same} of the six answers are llama.cpp's"
