"""llm-smolq as llm users meet it: the CLI, chat, options, logs and the Python API."""

import asyncio
import json
import threading

import llm
import pytest
from click.testing import CliRunner
from llm.cli import cli

import llm_smolq.plugin.loaded as loaded_models
from helpers.llm_cli import QUICK, last_logs, run
from llm_smolq.chat.template import chat_template_from_gguf

@pytest.fixture
def france_ids(france):
    """llama.cpp's prompt ids for the conversation "What is the capital of France?"."""
    return france["prompt_ids"]


def test_prompt_streams_text_and_logs_token_counts(user_dir, france_ids):
    result = run("-m", "smollm2-q", *QUICK, "What is the capital of France?")
    assert result.exit_code == 0, result.output
    assert result.output.strip()
    row = last_logs(user_dir)[0]
    assert row["model"] == "smollm2-q"
    assert row["input_tokens"] == len(france_ids) and row["output_tokens"] == 6
    assert json.loads(row["response_json"])["finish_reason"] == "length"
    assert "cached" in json.loads(row["token_details"])


def test_no_stream_gives_the_same_text(user_dir):
    streamed = run("-m", "smollm2-q", *QUICK, "Name a colour.")
    whole = run("-m", "smollm2-q", *QUICK, "--no-stream", "Name a colour.")
    assert whole.exit_code == 0, whole.output
    assert whole.stdout == streamed.stdout and whole.stdout.strip()


def test_greedy_is_deterministic_and_seeded_sampling_repeats(user_dir):
    sampled = ["-o", "temperature", "1.2", "-o", "max_tokens", "8", "Tell me a story."]
    first = run("-m", "smollm2-q", "-o", "seed", "7", *sampled).stdout
    again = run("-m", "smollm2-q", "-o", "seed", "7", *sampled).stdout
    assert first == again and first.strip()
    assert run("-m", "smollm2-q", *QUICK, "Hello").stdout == run("-m", "smollm2-q", *QUICK, "Hello").stdout


def test_input_tokens_equal_the_chat_references_prompt_ids(user_dir, reference_dir):
    """What llm sends renders, through the GGUF's template, to exactly llama.cpp's ids."""
    cases = json.loads((reference_dir / "smollm2-chat-A.json").read_text())["cases"]
    model = llm.get_model("smollm2-q")
    build = {"system": llm.system, "user": llm.user, "assistant": llm.assistant}
    for case in cases:
        messages = [build[m["role"]](m["content"]) for m in case["messages"]]
        response = model.prompt(messages=messages, max_tokens=1, temperature=0)
        response.text()
        assert response.input_tokens == len(case["prompt_ids"]), case["messages"]
        engine = loaded_models.in_memory[str(model_path(user_dir))].engine
        assert engine.tokens[: len(case["prompt_ids"])] == case["prompt_ids"]


def model_path(user_dir):
    return (user_dir / "smolq" / "SmolLM2-135M-Instruct.Q4_1.gguf").resolve()


def test_chat_reuses_the_kv_cache_between_turns(user_dir):
    result = run("chat", "-m", "smollm2-q", *QUICK, input="Hi there\nWhat is two plus two?\nThanks!\nquit\n")
    assert result.exit_code == 0, result.output
    rows = last_logs(user_dir, 3)
    cached = [json.loads(r["token_details"])["cached"] for r in rows]
    inputs = [r["input_tokens"] for r in rows]
    assert len({r["thread_id"] for r in rows}) == 1
    assert inputs[0] < inputs[1] < inputs[2]
    # Each turn re-reads only what the previous turn did not leave in the cache.
    assert cached[1] > inputs[0] and cached[2] > inputs[1]


def test_get_model_twice_loads_the_weights_once(user_dir):
    a, b = llm.get_model("smollm2-q"), llm.get_model("smollm2-q")
    a.prompt("One", max_tokens=2, temperature=0).text()
    engine = loaded_models.in_memory[str(model_path(user_dir))].engine
    b.prompt("Two", max_tokens=2, temperature=0).text()
    assert loaded_models.in_memory[str(model_path(user_dir))].engine is engine


def test_async_model(user_dir):
    async def ask():
        model = llm.get_async_model("smollm2-q")
        response = model.prompt("Say hi", max_tokens=4, temperature=0)
        return [chunk async for chunk in response], response

    chunks, response = asyncio.run(ask())
    sync = llm.get_model("smollm2-q").prompt("Say hi", max_tokens=4, temperature=0).text()
    assert "".join(chunks) == sync and sync.strip()


@pytest.mark.parametrize(
    "option, value, says",
    [("temperature", "-1", "temperature"), ("top_p", "1.5", "top_p"), ("max_tokens", "0", "max_tokens"),
     ("seed", "abc", "seed"), ("stop", "", "stop"), ("no_such_option", "1", "no_such_option")],
)
def test_bad_options_are_clear_errors(user_dir, option, value, says):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", option, value, "hi"])
    assert result.exit_code != 0
    assert says in result.output and "Traceback" not in result.output


def test_missing_weights_is_one_line_with_the_download_command(user_dir):
    result = CliRunner().invoke(cli, ["-m", "smollm3-q", "hi"])
    assert result.exit_code == 1
    assert "llm smolq download smollm3-q" in result.output and "GB" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_prompt_longer_than_the_context_is_refused_up_front(user_dir):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "n_ctx", "32", "-o", "max_tokens", "2", "a " * 100])
    assert result.exit_code == 1
    assert "context" in result.output and "n_ctx" in result.output


def test_stop_strings_end_the_answer(user_dir):
    free = run("-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "12", "Count to five.").stdout
    word = free.split()[1]
    stopped = run("-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "12", "-o", "stop", word,
                  "Count to five.").stdout
    assert word not in stopped and free.startswith(stopped.rstrip("\n"))


@pytest.mark.parametrize("thinking", [True, False])
def test_smollm3_template_and_thinking_switch(user_dir, reference_dir, thinking):
    path = reference_dir / "tiny-smollm3-chat-Q8_0.gguf"
    assert run("smolq", "register", str(path), "--alias", "tiny3").exit_code == 0
    args = ["-m", "tiny3", *QUICK, "-s", "Be brief.", "Hi there"]
    result = run(*args) if thinking else run(*args, "-o", "thinking", "false")
    assert result.exit_code == 0, result.output
    template = chat_template_from_gguf(path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    rendered = template.render(messages, add_generation_prompt=True, enable_thinking=thinking)
    assert ("/no_think" in rendered) is not thinking
    engine = loaded_models.in_memory[str(path.resolve())].engine
    assert last_logs(user_dir)[0]["input_tokens"] == len(engine.tokenize(rendered, special=True))


def test_smollm3_reasoning_streams_as_reasoning_events(user_dir, reference_dir, monkeypatch):
    """A random-weight model never writes <think>; stand in for its text generator and
    check that llm receives the thought as reasoning and the rest as the answer."""
    import llm_smolq.decode.generate

    def scripted(engine, prompt_ids, params, max_tokens, stops, completion, constraint=None, progress=None, guard=None, lookup=0):
        completion.prompt_tokens = len(prompt_ids)
        completion.output_ids = [1, 2, 3]
        completion.finish_reason = "stop"
        yield from ["<th", "ink>\nLet me see", ". 2+2=4</thi", "nk>\n\nIt is ", "4."]

    monkeypatch.setattr(llm_smolq.decode.generate, "generate", scripted)
    assert run("smolq", "register", str(reference_dir / "tiny-smollm3-chat-Q8_0.gguf"), "--alias", "tiny3").exit_code == 0
    response = llm.get_model("tiny3").prompt("What is 2+2?")
    assert response.text() == "It is 4."
    reasoning = "".join(e.chunk for e in response.stream_events() if e.type == "reasoning")
    assert reasoning == "Let me see. 2+2=4"


def test_ctrl_c_keeps_what_was_produced_and_the_engine_usable(user_dir, monkeypatch, france_ids):
    import llm_smolq.decode.generate

    real = llm_smolq.decode.generate.generate

    def interrupted(*args, **kwargs):
        for i, chunk in enumerate(real(*args, **kwargs)):
            if i == 3:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(llm_smolq.decode.generate, "generate", interrupted)
    result = run("-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "20", "What is the capital of France?")
    assert result.exit_code == 130 and result.stdout.strip()  # as a script expects of Ctrl-C
    row = last_logs(user_dir)[0]
    assert json.loads(row["response_json"])["finish_reason"] == "interrupted"
    assert row["output_tokens"] >= 3
    monkeypatch.setattr(llm_smolq.decode.generate, "generate", real)
    again = run("-m", "smollm2-q", *QUICK, "What is the capital of France?").stdout
    fresh = llm_smolq.load(model_path(user_dir), n_ctx=256, threads=1)
    ids = loaded_models.in_memory[str(model_path(user_dir))].engine.tokens[:len(france_ids)]
    expected = fresh.detokenize([int(fresh.eval(ids).argmax())])
    assert again.startswith(expected)


def test_the_default_context_is_the_whole_window_and_the_engine_kept(user_dir):
    model = llm.get_model("smollm2-q")
    model.prompt("One", max_tokens=1, temperature=0).text()
    engine = loaded_models.in_memory[str(model_path(user_dir))].engine
    assert engine.n_ctx == engine.config.context_length == 8192
    model.prompt("Two", max_tokens=1, temperature=0).text()
    assert loaded_models.in_memory[str(model_path(user_dir))].engine is engine


def test_a_context_past_the_window_is_refused_with_the_way_to_extend_it(user_dir):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "n_ctx", "100000", *QUICK, "hi"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "n_ctx=100000 is past the model's window of 8192 positions" in result.output
    assert "-o rope_scaling yarn" in result.output
    result = run("-m", "smollm2-q", "-o", "n_ctx", "16384", "-o", "rope_scaling", "yarn", *QUICK, "hi")
    assert result.exit_code == 0 and result.output.strip()
    engine = loaded_models.in_memory[str(model_path(user_dir))].engine
    assert engine.n_ctx == 16384 and engine.config.rope_scaling.factor == 2.0


def test_two_threads_prompting_one_model_get_their_own_answers(user_dir):
    """Both threads share one engine; its lock runs one generation at a time, so each
    thread's greedy answer is the one it gets alone."""
    questions = ["What is the capital of France?", "Name three colours."]
    alone = [llm.get_model("smollm2-q").prompt(q, max_tokens=8, temperature=0).text() for q in questions]
    loaded = loaded_models.in_memory[str(model_path(user_dir))]
    start = threading.Barrier(2)
    got = [[], []]

    def ask(i):
        model = llm.get_model("smollm2-q")
        for _ in range(2):
            start.wait()
            got[i].append(model.prompt(questions[i], max_tokens=8, temperature=0).text())

    threads = [threading.Thread(target=ask, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [[alone[0]] * 2, [alone[1]] * 2]
    assert alone[0] != alone[1] and all(a.strip() for a in alone)
    assert loaded_models.in_memory[str(model_path(user_dir))] is loaded  # one engine served both threads


def test_concurrent_async_prompts_get_their_own_answers(user_dir):
    questions = ["Say hi", "Say bye"]
    alone = [llm.get_model("smollm2-q").prompt(q, max_tokens=4, temperature=0).text() for q in questions]

    async def ask_both():
        model = llm.get_async_model("smollm2-q")
        responses = [model.prompt(q, max_tokens=4, temperature=0) for q in questions]
        return await asyncio.gather(*(r.text() for r in responses))

    assert asyncio.run(ask_both()) == alone


def test_ctrl_c_during_prefill_logs_an_empty_answer_and_the_engine_usable(user_dir, monkeypatch, france_ids):
    import llm_smolq.engine.engine

    real = llm_smolq.engine.engine.lib

    class InterruptedPrefill:  # Ctrl-C arriving while the prompt's batch runs
        def __getattr__(self, name):
            return getattr(real, name)

        def sq_forward(self, *args):
            real.sq_forward(*args)
            raise KeyboardInterrupt

    question = "What is the capital of France?"
    expected = run("-m", "smollm2-q", *QUICK, question).stdout
    engine = loaded_models.in_memory[str(model_path(user_dir))].engine
    prompt_ids = engine.tokens[:len(france_ids)]
    run("-m", "smollm2-q", *QUICK, "Something else first, to be truncated.")
    monkeypatch.setattr(llm_smolq.engine.engine, "lib", InterruptedPrefill())
    result = run("-m", "smollm2-q", *QUICK, question)
    assert result.exit_code == 130 and not result.stdout.strip()
    row = last_logs(user_dir)[0]
    assert json.loads(row["response_json"])["finish_reason"] == "interrupted"
    assert row["input_tokens"] == len(france_ids) and row["output_tokens"] == 0
    # The cache keeps the prefix the two prompts share; the interrupted batch is not counted.
    assert loaded_models.in_memory[str(model_path(user_dir))].engine is engine
    assert 0 < engine.n_past < len(france_ids) and engine.tokens == prompt_ids[:engine.n_past]
    monkeypatch.setattr(llm_smolq.engine.engine, "lib", real)
    assert run("-m", "smollm2-q", *QUICK, question).stdout == expected


def test_a_context_too_large_for_memory_is_refused_with_the_n_ctx_that_fits(user_dir, monkeypatch):
    from llm_smolq.engine import memory

    # SmolLM2's 8,192 positions take 189 MB as halves, 100 MB as Q8_0 blocks
    monkeypatch.setattr(memory, "available_memory", lambda: (150 * 2**20, "a test figure"))
    monkeypatch.setattr(loaded_models, "in_memory", {})  # an engine another test left must not stand in
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "n_ctx", "8192", *QUICK, "hi"])
    assert result.exit_code == 1
    assert "n_ctx=8192 needs" in result.output and "-o n_ctx " in result.output and "a test figure" in result.output
    assert "-o kv_cache q8_0" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "n_ctx", "8192", "-o", "kv_cache", "q8_0", *QUICK, "hi"])
    assert result.exit_code == 0 and result.output.strip()


def test_a_broken_vocabulary_is_refused_at_load(user_dir, reference_dir, tmp_path):
    from gguf import GGUFReader

    source = reference_dir / "tiny-smollm3-chat-Q8_0.gguf"
    reader = GGUFReader(source)
    part = reader.fields["tokenizer.ggml.bos_token_id"].parts[-1]
    at = part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]
    data = bytearray(source.read_bytes())
    data[at:at + 4] = (5000).to_bytes(4, "little")
    bad = tmp_path / "bad-vocab.gguf"
    bad.write_bytes(bytes(data))
    assert run("smolq", "register", str(bad), "--alias", "badvocab").exit_code == 0
    with pytest.raises(llm.ModelError, match="bos_token_id = 5000 is not a token id"):
        llm.get_model("badvocab").prompt("hi", max_tokens=1).text()
    assert str(bad.resolve()) not in loaded_models.in_memory  # not kept for the next prompt to fail on


def test_a_bad_smolq_threads_is_a_model_error_that_says_the_fix(user_dir, monkeypatch):
    monkeypatch.setattr(loaded_models, "in_memory", {})  # as in a new process: the engine is made now
    monkeypatch.setenv("SMOLQ_THREADS", "all")
    with pytest.raises(llm.ModelError, match="SMOLQ_THREADS='all' is not a thread count: set it to a whole number"):
        llm.get_model("smollm2-q").prompt("hi", max_tokens=1).text()


def test_llm_start_and_a_plain_prompt_import_only_what_they_use(user_dir):
    """`llm` loads the plugin on every start: that must not load the kernel, the GGUF
    reader, the tokenizer or jinja2; a prompt without a schema or tools must not load
    llguidance."""
    import os
    import subprocess
    import sys

    script = (
        "import json, sys, llm\n"
        "llm.get_models()  # what every llm start does: load plugins, register models\n"
        "start = set(sys.modules)\n"
        "llm.get_model('smollm2-q').prompt('Hi', max_tokens=2, temperature=0).text()\n"
        "after = set(sys.modules)\n"
        "print(json.dumps([sorted(start), sorted(after)]))\n"
    )
    env = {**os.environ, "LLM_LOAD_PLUGINS": "llm-smolq"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    start, after = (set(names) for names in json.loads(done.stdout.splitlines()[-1]))
    assert "llm_smolq.plugin" in start
    assert not {"llm_smolq._kernel", "llm_smolq.engine.engine", "gguf", "jinja2", "tokenizers", "llguidance"} & start
    assert {"llm_smolq._kernel", "gguf", "tokenizers"} <= after  # the prompt did run through the engine
    assert "llguidance" not in after
