"""Through llm itself, greedy answers are llama.cpp's: `llm -m smollm2-q -o kv_cache f32
-o temperature 0 -o max_tokens 48` prints the greedy text of each conversation in
smollm2-chat-A.avx2.json (llama.cpp built on an AVX2 CPU, the real SmolLM2-135M-Instruct
Q4_1 file, F32 KV cache), stopping where llama.cpp stopped: at 48 tokens or at its
end-of-turn token. (The default F16 cache attends in another order: its logits are held
to llama.cpp's spread in test_engine_reference.py.)"""

import json

import llm
import pytest
from click.testing import CliRunner
from llm.cli import cli
from helpers.llm_cli import last_logs

GREEDY = ["-o", "kv_cache", "f32", "-o", "temperature", "0", "-o", "max_tokens", "48"]


@pytest.fixture
def cases(smollm2_chat_cases):
    assert len(smollm2_chat_cases) == 6
    return smollm2_chat_cases


def finish(case) -> str:
    """How llama.cpp's answer ended: 2 is <|im_end|>, SmolLM2's end of turn."""
    return "stop" if case["greedy_ids"][-1] == 2 else "length"


@pytest.mark.parametrize("index", range(6))
def test_llm_gives_llama_cpps_greedy_answer(index, cases, user_dir):
    case = cases[index]
    messages = case["messages"]
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    if len(turns) == 1:  # one question: the command line, as a user types it
        args = ["-m", "smollm2-q", *GREEDY, *(["-s", system[0]] if system else []), turns[0]["content"]]
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert result.stdout == case["greedy_text"] + "\n"
        row = last_logs(user_dir)[0]
        input_tokens, output_tokens = row["input_tokens"], row["output_tokens"]
        finish_reason = json.loads(row["response_json"])["finish_reason"]
    else:  # earlier turns given as they were: llm's Python API
        build = {"system": llm.system, "user": llm.user, "assistant": llm.assistant}
        model = llm.get_model("smollm2-q")
        response = model.prompt(messages=[build[m["role"]](m["content"]) for m in messages],
                                kv_cache="f32", temperature=0, max_tokens=48)
        assert response.text() == case["greedy_text"]
        input_tokens, output_tokens = response.input_tokens, response.output_tokens
        finish_reason = response.response_json["finish_reason"]
    assert input_tokens == len(case["prompt_ids"])
    # llama.cpp's ids end with its end-of-turn token where it stopped; the answer's count does not.
    assert output_tokens == len(case["greedy_ids"]) - (finish(case) == "stop")
    assert finish_reason == finish(case)
