"""What a new user meets in the first minutes, through llm's own CLI and Python API: list
stops, names another plugin owns, capabilities per model, answers cut by the context or
ended by the repetition guard, Ctrl-C's exit status, every README model id, the prompt
cache's size and first notice, and errors that name the real problem."""

import json
import re
import sqlite3

import llm
import pytest
from click.testing import CliRunner
from llm.cli import cli

import llm_smolq.plugin.loaded as loaded_models
from llm_smolq.store import catalog
from llm_smolq import paths
from llm_smolq.store import prompt_cache
from llm_smolq.decode.generate import RepetitionGuard
from llm_smolq.plugin.options import SmolQOptions

GREEDY = ["-o", "temperature", "0"]


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def last_log(user_dir):
    db = sqlite3.connect(user_dir / "logs.db")
    db.row_factory = sqlite3.Row
    return db.execute("select * from turns order by rowid desc limit 1").fetchone()


@pytest.fixture
def tiny3(user_dir, reference_dir):
    """The tiny SmolLM3 file with SmolLM3's chat template, registered as `tiny3`."""
    path = reference_dir / "tiny-smollm3-chat-Q8_0.gguf"
    assert run("smolq", "register", str(path), "--alias", "tiny3").exit_code == 0
    return path


# -- -o stop with a list --------------------------------------------------------------


def test_a_json_list_of_stops_is_a_list_and_literal_text_stays_possible():
    assert SmolQOptions(stop='["sea", "waves"]').stop == ["sea", "waves"]
    assert SmolQOptions(stop='["[1, 2]"]').stop == ["[1, 2]"]  # text that reads as a list
    assert SmolQOptions(stop="[not json").stop == "[not json"
    assert SmolQOptions(stop="[1, 2]").stop == "[1, 2]"  # a list, but not of strings
    assert SmolQOptions(stop=["a", "b"]).stop == ["a", "b"]
    with pytest.raises(ValueError, match="must not be empty"):
        SmolQOptions(stop='["sea", ""]')
    assert "JSON list" in SmolQOptions.model_fields["stop"].description


def test_stop_list_on_the_command_line_stops_at_the_first_of_them(user_dir):
    question = ["-o", "max_tokens", "24", "Name three colours."]
    free = run("-m", "smollm2-q", *GREEDY, *question).stdout
    words = free.split()
    first, later = words[2], words[-2]
    assert free.index(later) > free.index(first)
    stopped = run("-m", "smollm2-q", *GREEDY, "-o", "stop", json.dumps([later, first]), *question).stdout
    assert stopped.rstrip("\n") == free[:free.index(first)]


# -- names another plugin has ------------------------------------------------------------


def test_an_alias_another_plugins_model_has_is_refused(user_dir, reference_dir):
    taken = next(m for m in llm.get_models_with_aliases() if not m.model.model_id.startswith("smol"))
    name = taken.model.model_id
    result = run("smolq", "register", str(reference_dir / "tiny-smollm3-Q8_0.gguf"), "--alias", name)
    assert result.exit_code == 1
    assert f"the alias {name!r} is taken: `llm -m {name}` already means {name} from llm" in result.output
    assert llm.get_model(name).model_id == name and type(llm.get_model(name)).__module__.startswith("llm.")
    assert not (user_dir / "smolq" / "models.json").exists()


def test_a_users_alias_and_model_id_are_refused_too(user_dir, reference_dir):
    taken = next(m.model.model_id for m in llm.get_models_with_aliases() if not m.model.model_id.startswith("smol"))
    assert run("aliases", "set", "mine", taken).exit_code == 0
    tiny = str(reference_dir / "tiny-smollm3-Q8_0.gguf")
    result = run("smolq", "register", tiny, "--alias", "mine")
    assert result.exit_code == 1 and "through your alias (`llm aliases remove mine` frees it)" in result.output
    assert run("aliases", "set", "smolq/tiny-smollm3-q8_0", taken).exit_code == 0
    result = run("smolq", "register", tiny)
    assert result.exit_code == 1
    assert "the model id 'smolq/tiny-smollm3-q8_0' is taken" in result.output and "rename the file" in result.output
    assert run("aliases", "remove", "smolq/tiny-smollm3-q8_0").exit_code == 0
    assert run("smolq", "register", tiny, "--alias", "free-name").exit_code == 0


# -- capabilities per model ----------------------------------------------------------------


def listed(*args):
    result = run("models", "list", *args)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_tools_and_thinking_are_offered_only_where_the_template_has_them(user_dir, tiny3):
    tools = listed("--tools")
    assert "smollm3-q" in tools and "smolq/tiny-smollm3-chat-q8_0" in tools and "smollm2-q" not in tools
    assert "thinking" not in listed("--options", "-m", "smollm2-q")
    assert "thinking" in listed("--options", "-m", "smollm3-q")
    assert "thinking" in listed("--options", "-m", "tiny3")
    assert llm.get_model("smollm2-q").supports_tools is False and llm.get_model("tiny3").supports_tools is True
    registry = json.loads((user_dir / "smolq" / "models.json").read_text())
    assert registry["smolq/tiny-smollm3-chat-q8_0"] == {
        "path": str(tiny3.resolve()), "aliases": ["tiny3"], "tools": True, "thinking": True, "quant": "Q8_0"}


NO_THINKING = ("smollm2-q has no thinking mode (its chat template has no <think> switch): leave out -o thinking, "
               "or use a SmolLM3 model such as smollm3-q, which has one")


@pytest.mark.parametrize("value", ["true", "false"])
def test_thinking_on_smollm2_is_refused_naming_a_model_that_has_it(user_dir, value):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "thinking", value, "hi"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output == f"Error: thinking\n  {NO_THINKING}\n"
    assert not (user_dir / "logs.db").exists() or not last_log(user_dir)  # refused before it ran
    # the same from Python, and when set as a default option
    with pytest.raises(ValueError, match=re.escape(NO_THINKING)):
        llm.get_model("smollm2-q").prompt("hi", thinking=False)
    result = CliRunner().invoke(cli, ["models", "options", "set", "smollm2-q", "thinking", value])
    assert result.exit_code == 1 and NO_THINKING in result.output


def test_an_option_the_model_lacks_is_refused_with_the_nearest_name_and_the_list(user_dir):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "temprature", "0.2", "-o", "max_tokens", "x", "hi"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.removeprefix("Error: ").splitlines()
    refusal = lines[lines.index("temprature") + 1]
    assert refusal.startswith("  not an option of smollm2-q: did you mean temperature? Its options: max_tokens, ")
    assert refusal.endswith(" (`llm models list --options -m smollm2-q` says what each does)")
    named = refusal.split("Its options: ")[1].split(" (")[0].split(", ")
    assert all(f"    {name}: " in listed("--options", "-m", "smollm2-q") for name in named)
    assert "thinking" not in named  # smollm2-q has none
    # the other errors as pydantic words them
    assert lines[lines.index("max_tokens") + 1] == "  Input should be a valid integer, unable to parse string as an integer"
    # a name near none gets the list alone; SmolLM3's holds thinking, and Python hears the same
    result = CliRunner().invoke(cli, ["-m", "smollm3-q", "-o", "bogus", "1", "hi"])
    assert result.exit_code == 1 and result.output.startswith("Error: bogus\n  not an option of smollm3-q. Its options: ")
    assert "thinking" in result.output.split("Its options: ")[1]
    with pytest.raises(ValueError, match="not an option of smollm3-q: did you mean thinking?"):
        llm.get_model("smollm3-q").prompt("hi", thinkng=True)


NO_TOOLS = ("smollm2-q does not support tools (its chat template has no tool format): use a SmolLM3 model such "
            "as smollm3-q, e.g. llm -m smollm3-q -T ...")


@pytest.mark.parametrize("tools", [["-T", "llm_version"], ["--functions", "def two():\n    return 2"]],
                         ids=["toolbox", "functions"])
def test_tools_on_smollm2_are_refused_naming_a_smollm3_model(user_dir, tools):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", *tools, "hi"])
    assert (result.exit_code, result.output) == (1, f"Error: {NO_TOOLS}\n")
    # `llm chat` said it with a traceback; now the same line, before anything is generated
    result = CliRunner().invoke(cli, ["chat", "-m", "smollm2-q", *tools], input="hi\nquit\n")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # not a ValueError
    assert result.output.endswith(f"Error: {NO_TOOLS}\n")


def test_the_models_with_tools_named_include_registered_ones(user_dir, tiny3):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-T", "llm_version", "hi"])
    assert result.exit_code == 1
    assert ("use a SmolLM3 model such as smollm3-q or smolq/tiny-smollm3-chat-q8_0, e.g. llm -m smollm3-q -T ..."
            in result.output)


def test_the_models_with_thinking_named_include_registered_ones(user_dir, tiny3):
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "thinking", "false", "hi"])
    assert result.exit_code == 1
    assert "use a SmolLM3 model such as smollm3-q or smolq/tiny-smollm3-chat-q8_0, which has one" in result.output
    assert "thinking" in listed("--options", "-m", "tiny3")  # and there it is an option


def test_a_file_registered_before_capabilities_were_recorded_refuses_thinking_when_run(user_dir, smollm2_gguf):
    registry = user_dir / "smolq" / "models.json"
    registry.write_text(json.dumps({"smolq/old": {"path": str(smollm2_gguf), "aliases": []}}))
    result = CliRunner().invoke(cli, ["-m", "smolq/old", "-o", "thinking", "true", "-o", "max_tokens", "2", "hi"])
    assert result.exit_code == 1
    assert "smolq/old has no thinking mode (its chat template has no <think> switch)" in result.output


# -- how an answer ended, on stderr --------------------------------------------------------


def test_an_answer_cut_by_the_context_says_so_on_stderr(user_dir):
    result = run("-m", "smollm2-q", *GREEDY, "-o", "n_ctx", "40", "Tell me about the ether.")
    assert result.exit_code == 0
    (line,) = [line for line in result.stderr.splitlines() if "context" in line]
    assert line == ("llm-smolq: the context is full (40 tokens): the answer was cut there; "
                    "-o n_ctx 80 to go further")
    assert json.loads(last_log(user_dir)["response_json"])["finish_reason"] == "context"
    assert result.stdout.strip() and "llm-smolq" not in result.stdout


def test_max_tokens_says_so_and_the_python_api_prints_nothing(user_dir, capsys):
    result = run("-m", "smollm2-q", *GREEDY, "-o", "max_tokens", "5", "Tell me a story.")
    assert "llm-smolq: the answer reached max_tokens (5): -o max_tokens N lets it go further" in result.stderr
    response = llm.get_model("smollm2-q").prompt("Tell me a story.", max_tokens=5, temperature=0)
    response.text()
    assert response.response_json["finish_reason"] == "length"
    assert "llm-smolq" not in capsys.readouterr().err


# -- the repetition guard -----------------------------------------------------------------------


def test_the_guard_fires_when_a_span_repeats_for_its_run():
    guard = RepetitionGuard(tokens=40, longest_span=8)
    intro = list(range(100, 130))  # distinct ids first
    span = [7, 8, 9, 7, 10]  # a 5-token span (with a repeated id inside)
    said = [guard.push(t) for t in intro + span * 12]
    fired = next(i for i, r in enumerate(said) if r)
    # the run counts tokens equal to the one 5 back: it reaches 40 at the 45th token of the loop
    assert fired == len(intro) + 5 + 40 - 1 and said[fired] == 45


def test_the_guard_leaves_text_that_varies_alone(smollm2_gguf):
    import llm_smolq

    engine = llm_smolq.load(smollm2_gguf, n_ctx=256, threads=1)
    text = (llm_smolq.__doc__ or "") + open(__file__).read()
    ids = engine.tokenize(text)
    assert len(ids) > 3000
    guard = RepetitionGuard()
    assert not any(guard.push(t) for t in ids)
    long_span = list(range(200, 300))  # a 100-token span repeated: longer than the guard looks
    guard = RepetitionGuard()
    assert not any(guard.push(t) for t in long_span * 5)
    guard = RepetitionGuard()
    assert any(guard.push(t) for t in long_span[:64] * 6)


def test_a_looping_answer_ends_with_finish_reason_repetition(user_dir):
    # SmolLM2-135M loops on this at temperature 0 (the README's old example)
    args = ["-m", "smollm2-q", *GREEDY, "-o", "max_tokens", "600", "-s", "Answer in French", "Good morning"]
    result = run(*args)
    row = last_log(user_dir)
    assert json.loads(row["response_json"])["finish_reason"] == "repetition"
    assert row["output_tokens"] < 600
    (line,) = [line for line in result.stderr.splitlines() if "repeating" in line]
    assert line.startswith("llm-smolq: the answer was ended after repeating itself for ")
    assert line.endswith(" tokens (-o repeat_guard false lets it run)")
    assert result.exit_code == 0
    off = run(*args, "-o", "repeat_guard", "false")
    assert json.loads(last_log(user_dir)["response_json"])["finish_reason"] == "length"
    assert off.stdout.startswith(result.stdout.rstrip("\n"))


# -- Ctrl-C ------------------------------------------------------------------------------------


def interrupt_after(monkeypatch, chunks: int):
    import llm_smolq.decode.generate

    real = llm_smolq.decode.generate.generate

    def interrupted(*args, **kwargs):
        for i, chunk in enumerate(real(*args, **kwargs)):
            if i == chunks:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(llm_smolq.decode.generate, "generate", interrupted)


# (a one-shot prompt's exit status 130: test_plugin.py's Ctrl-C tests)


def test_ctrl_c_in_chat_goes_on_to_the_next_prompt(user_dir, monkeypatch):
    interrupt_after(monkeypatch, 2)
    result = run("chat", "-m", "smollm2-q", *GREEDY, "-o", "max_tokens", "8", input="Hello\nHi again\nquit\n")
    assert result.exit_code == 0, result.output
    db = sqlite3.connect(user_dir / "logs.db")
    reasons = [json.loads(r)["finish_reason"] for (r,) in db.execute("select response_json from turns")]
    assert len(reasons) == 2 and reasons[0] == "interrupted"  # the second prompt was answered


# -- every model id the README names ------------------------------------------------------------


def test_every_known_quant_is_a_model_that_says_how_to_get_it(user_dir):
    ids = {m.model.model_id for m in llm.get_models_with_aliases()}
    for known in catalog.KNOWN_MODELS.values():
        for quant, qf in known.quants.items():
            model_id = known.model_id(quant)
            assert model_id in ids
            if known is catalog.SMOLLM2:
                continue  # it is in the test store
            result = CliRunner().invoke(cli, ["-m", model_id, "hi"])
            assert result.exit_code == 1 and "Unknown model" not in result.output
            assert f"{model_id} is not downloaded ({'~' if qf.approximate else ''}{catalog.format_size(qf.size)})" \
                   f": run `{known.download_command(quant)}`" in result.output


def test_every_model_id_in_the_readme_resolves(user_dir):
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    named = set(re.findall(r"\bsmoll?m[23]-q(?:-[a-z0-9_]+)?\b", readme))
    assert {"smollm2-q", "smollm3-q", "smollm3-q-q8_0"} <= named
    ids = {m.model.model_id for m in llm.get_models_with_aliases()}
    assert named <= ids, named - ids


# -- the prompt cache --------------------------------------------------------------------------


def test_the_prompt_cache_is_sized_to_the_model_and_announced_once(user_dir, smollm2_gguf, monkeypatch):
    monkeypatch.delenv(prompt_cache.SIZE_ENV, raising=False)
    first = run("-m", "smollm2-q", *GREEDY, "-o", "max_tokens", "4", "Hello")
    budget = catalog.format_size(2 * smollm2_gguf.stat().st_size)
    directory = paths.prompt_cache_dir()
    (line,) = [line for line in first.stderr.splitlines() if "prompt states" in line]
    assert line == (f"llm-smolq: saving prompt states in {directory} so `llm -c` is fast (up to {budget} for "
                    "this model; -o prompt_cache false or SMOLQ_PROMPT_CACHE_SIZE=0 turns it off)")
    again = run("-m", "smollm2-q", *GREEDY, "-o", "max_tokens", "4", "Something else")
    assert "prompt states" not in again.stderr
    info = run("smolq", "cache", "info")
    assert "Budget:    2x each model's file size, at least 64.0 MB (default)" in info.stdout


def test_cached_tokens_are_counted_once(user_dir):
    run("-m", "smollm2-q", *GREEDY, "-o", "max_tokens", "4", "Tell me about the sea.")
    loaded_models.in_memory.clear()  # a new process: the state comes from disk
    run("-m", "smollm2-q", *GREEDY, "-o", "max_tokens", "4", "-c", "And the waves?")
    row = last_log(user_dir)
    cached = json.loads(row["token_details"])["cached"]
    assert cached > 0 and json.loads(row["response_json"])["prompt_cache"]["read_tokens"] == cached


# -- errors that name the real problem ---------------------------------------------------------


def test_info_on_a_directory_or_a_missing_file(user_dir, tmp_path):
    result = run("smolq", "info", str(tmp_path))
    assert result.exit_code == 1 and f"{tmp_path} is a directory" in result.output
    missing = tmp_path / "nothing-here.gguf"
    result = run("smolq", "info", str(missing))
    assert result.exit_code == 1 and f"no such file: {missing}" in result.output
    result = run("smolq", "info", "nope")
    assert result.exit_code == 1 and "'nope' is neither a file nor a model id" in result.output
    result = run("smolq", "register", str(missing))
    assert result.exit_code != 0 and "unknown model" not in result.output.lower()
