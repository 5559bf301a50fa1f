"""The end of the context: prompts of n_ctx - 1, n_ctx and n_ctx + 1 tokens, through the
engine, the generator and llm, and evals that would run past the last position."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from llm.cli import cli

import llm_smolq
from llm_smolq.engine.engine import MAX_BATCH
from llm_smolq.decode.generate import Completion, generate
from llm_smolq.decode.sampling import SamplingParams
from helpers.greedy import greedy_ids
from helpers.llm_cli import last_logs

N_CTX = 64
GREEDY = SamplingParams(temperature=0)


@pytest.fixture
def engine(reference_dir):
    return llm_smolq.load(reference_dir / "tiny-smollm3-Q8_0.gguf", n_ctx=N_CTX)


def ids(n, seed=0):
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


def state(eng):
    """Everything the cache holds: its ids and every byte of K and V."""
    return eng.tokens, eng.k_cache.tobytes(), eng.v_cache.tobytes()


@pytest.mark.parametrize("n", [N_CTX - 1, N_CTX])
def test_a_prompt_that_fits_fills_the_cache(engine, n):
    logits = engine.eval(ids(n), all_logits=True)
    assert logits.shape == (n, engine.config.vocab_size) and np.isfinite(logits).all()
    assert engine.n_past == n


@pytest.mark.parametrize("filled, more", [(0, N_CTX + 1), (N_CTX - 1, 2), (N_CTX, 1), (40, 25)])
def test_an_eval_past_the_end_is_refused_and_the_cache_unchanged(engine, filled, more):
    if filled:
        engine.eval(ids(filled))
    before = state(engine)
    with pytest.raises(ValueError) as err:
        engine.eval(ids(more, seed=1))
    message = str(err.value)
    assert f"{more} more tokens do not fit" in message and f"{filled} of the context's {N_CTX}" in message, message
    assert "larger n_ctx" in message
    assert state(engine) == before
    if filled < N_CTX:  # what still fits goes on from where the cache was
        engine.eval(ids(N_CTX - filled, seed=2))
        assert engine.n_past == N_CTX


def test_a_refused_eval_longer_than_a_batch_writes_no_batch(reference_dir):
    """Refused before the first of its batches runs, not after some were written."""
    eng = llm_smolq.load(reference_dir / "tiny-smollm3-Q8_0.gguf", n_ctx=MAX_BATCH + 44)
    eng.eval(ids(40))
    before = state(eng)
    with pytest.raises(ValueError, match="do not fit"):
        eng.eval(ids(MAX_BATCH + 5, seed=1))
    assert state(eng) == before


def run_generate(engine, prompt, max_tokens=50):
    done = Completion()
    text = "".join(generate(engine, prompt, GREEDY, max_tokens, completion=done))
    return text, done


def test_a_prompt_one_short_of_the_context_answers_two_tokens_then_stops_for_context(engine):
    """The prompt leaves one position: the first token is sampled from the prefill and
    stored there, the second from that step; then nothing more fits."""
    prompt = ids(N_CTX - 1)
    text, done = run_generate(engine, prompt)
    assert done.finish_reason == "context" and len(done.output_ids) == 2
    assert engine.n_past == N_CTX and engine.tokens == prompt + done.output_ids[:1]
    greedy = llm_smolq.load(engine.model.path, n_ctx=N_CTX, threads=1)  # the same, worked out step by step
    first = int(greedy.eval(prompt).argmax())
    assert done.output_ids == [first, int(greedy.eval([first]).argmax())]
    assert text == engine.detokenize(done.output_ids)


def test_a_prompt_of_the_whole_context_answers_one_token(engine):
    text, done = run_generate(engine, ids(N_CTX))
    assert done.finish_reason == "context" and len(done.output_ids) == 1 and engine.n_past == N_CTX


def test_a_prompt_past_the_context_is_refused_before_the_cache_is_touched(engine):
    engine.eval(ids(30))
    before = state(engine)
    with pytest.raises(ValueError, match=f"the prompt is {N_CTX + 1} tokens but the context holds {N_CTX}"):
        run_generate(engine, ids(30) + ids(N_CTX + 1 - 30, seed=3))
    assert state(engine) == before


# -- through llm ----------------------------------------------------------------------------

class CountingKernel:
    """The kernel, counting forward passes."""

    def __init__(self, real):
        self.real, self.forwards = real, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def sq_forward(self, *args):
        self.forwards += 1
        return self.real.sq_forward(*args)


@pytest.fixture
def kernel(monkeypatch):
    import llm_smolq.engine.engine

    counting = CountingKernel(llm_smolq.engine.engine.lib)
    monkeypatch.setattr(llm_smolq.engine.engine, "lib", counting)
    return counting


def ask(case, n_ctx):
    """The question of a one-message conversation, on the command line."""
    (message,) = case["messages"]
    return CliRunner().invoke(cli, ["-m", "smollm2-q", "-o", "temperature", "0", "-o", "n_ctx", str(n_ctx),
                                    message["content"]])


def test_llm_with_one_position_to_spare_answers_two_tokens_and_logs_context(user_dir, france, kernel):
    n = len(france["prompt_ids"])
    result = ask(france, n + 1)
    assert result.exit_code == 0, result.output
    row = last_logs(user_dir)[0]
    assert (row["input_tokens"], row["output_tokens"]) == (n, 2)
    assert json.loads(row["response_json"])["finish_reason"] == "context"
    assert kernel.forwards == 2  # the prompt's one batch, and the first token's step
    # The engine's first two greedy tokens on the same (default) cache, as text.
    engine = llm_smolq.load(user_dir / "smolq" / "SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=64)
    expected = engine.detokenize(greedy_ids(engine, france["prompt_ids"], 2))
    assert result.stdout == expected + "\n"


@pytest.mark.parametrize("spare", [0, -1])
def test_llm_refuses_a_prompt_that_fills_or_overflows_the_context_before_any_work(user_dir, france, kernel, spare):
    n = len(france["prompt_ids"])
    result = ask(france, n + spare)
    assert result.exit_code == 1
    assert f"the prompt is {n} tokens but the context holds {n + spare}" in result.output, result.output
    assert f"-o n_ctx {2 * n}" in result.output and "Traceback" not in result.output
    assert kernel.forwards == 0
    assert not (user_dir / "logs.db").exists() or not last_logs(user_dir)
