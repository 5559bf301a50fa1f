"""The sampler against distributions worked out here from llama.cpp's rules, and each
sampling option passed through `llm -o` and seen to act on the real SmolLM2-135M.

llama.cpp's default chain (common/common.h, src/llama-sampling.cpp) runs, of the stages
llm-smolq has: the repeat penalty over the last 64 tokens (penalty_last_n = 64; a seen
token's logit is divided by the penalty when > 0, multiplied when <= 0, once however often
it was seen), top-k (<= 0: no cut), top-p (softmax of what is left, the smallest prefix of
the sorted tokens whose cumulative probability is >= p), min-p (keep p_i >= min_p * p_max),
temperature (logits / T; <= 0 keeps only the argmax), then a draw from the softmax.
Top-p and min-p therefore see the logits before the temperature, i.e. at temperature 1.

Each distribution test draws DRAWS tokens from a seeded Sampler and compares the counts
with the reference below by a chi-square test: the right distribution must fit (p-value
> ALPHA) and draw nothing it excludes, and the same draws must reject (p-value < ALPHA)
the distribution a plausible mistake - another order of the stages, another penalty
rule - would give, so each test is seen to be able to fail.
"""

import functools
import sqlite3

import numpy as np
import pytest
import scipy.stats
from click.testing import CliRunner
from llm.cli import cli

import llm_smolq.plugin.loaded as loaded_models
import llm_smolq
from llm_smolq.decode.sampling import Sampler, SamplingParams, _head

DRAWS = 20_000
ALPHA = 1e-3  # a fit is accepted above this p-value and rejected below it
LLAMA_CPP_ORDER = ("penalty", "top_k", "top_p", "min_p", "temperature")


# -- the reference: llama.cpp's rules, stage by stage ----------------------------------------

def softmax(values) -> np.ndarray:
    x = np.asarray(values, np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def llama_penalty(logit: float, count: int, penalty: float) -> float:
    """llama.cpp: divided when positive, multiplied when <= 0, once for any count."""
    return logit / penalty if logit > 0 else logit * penalty


def reference(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0, recent=(),
              window=64, order=LLAMA_CPP_ORDER, penalize=llama_penalty) -> np.ndarray:
    """The probability of each token after the stages in `order`; 0 for tokens cut."""
    alive = {t: float(v) for t, v in enumerate(np.asarray(logits, np.float32))}  # token -> logit
    for stage in order:
        if stage == "penalty" and penalty != 1.0:
            looked_at = list(recent)[max(0, len(recent) - window):]
            for t in set(looked_at) & alive.keys():  # (after a cut, only the tokens left)
                alive[t] = penalize(alive[t], looked_at.count(t), penalty)
        elif stage == "top_k" and top_k > 0:
            alive = dict(sorted(alive.items(), key=lambda kv: -kv[1])[:top_k])
        elif stage == "top_p" and top_p < 1.0:
            ranked = sorted(alive.items(), key=lambda kv: -kv[1])
            prefix, total = {}, 0.0
            for (t, v), p in zip(ranked, softmax([v for _, v in ranked])):
                prefix[t] = v
                total += p
                if total >= top_p:
                    break
            alive = prefix
        elif stage == "min_p" and min_p > 0.0:
            probs = softmax(list(alive.values()))
            alive = {t: v for (t, v), p in zip(alive.items(), probs) if p >= min_p * probs.max()}
        elif stage == "temperature":
            alive = {t: v / temperature for t, v in alive.items()}
    out = np.zeros(len(logits))
    out[list(alive)] = softmax(list(alive.values()))
    return out


def kept(probs: np.ndarray) -> set[int]:
    return set(np.flatnonzero(probs).tolist())


def restricted(probs: np.ndarray, tokens) -> np.ndarray:
    """probs renormalized over `tokens` alone."""
    out = np.zeros_like(probs)
    out[tokens] = probs[tokens] / probs[tokens].sum()
    return out


# -- drawing and judging ---------------------------------------------------------------------

def draw(logits, recent=(), n=DRAWS, **params) -> np.ndarray:
    sampler = Sampler(SamplingParams(**params))
    z = np.asarray(logits, np.float32)
    counts = np.zeros(len(z), np.int64)
    for _ in range(n):
        counts[sampler(z, list(recent))] += 1
    return counts


def p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of the counts under probs (bins expected < 5 times pooled);
    0 when a token probs excludes was drawn at all."""
    if counts[probs == 0].any():
        return 0.0
    support = probs > 0
    expected, observed = probs[support] * counts.sum(), counts[support]
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    if len(expected) == 1:
        return 1.0  # everything drawn is the one token allowed
    return float(scipy.stats.chisquare(observed, expected).pvalue)


def assert_fits(counts, right, label, **wrong):
    """The draws fit `right` and never show a token it excludes; each wrong distribution
    (which must really differ from right) is rejected by the same draws."""
    assert counts[right == 0].sum() == 0, f"{label}: drew excluded tokens {np.flatnonzero(counts * (right == 0))}"
    fit = p_value(counts, right)
    print(f"\n{label}: p = {fit:.3g} (right)", end="")
    assert fit > ALPHA, f"{label}: the draws do not fit llama.cpp's distribution (p = {fit:.3g})"
    for name, probs in wrong.items():
        assert np.abs(probs - right).max() > 0.01, f"{label}: {name} is no different; the case proves nothing"
        p = p_value(counts, probs)
        print(f"; {name}: p = {p:.3g}", end="")
        assert p < ALPHA, f"{label}: the draws also fit {name} (p = {p:.3g}); the test could not tell them apart"


# -- sorting only the head of the order -------------------------------------------------------

def test_the_head_of_the_order_is_a_stable_sorts_first_tokens():
    """_head sorts only the tokens at or above the n-th largest logit, and must give what a
    stable sort of all of them gives: ties in token order, a schema's -inf masks included."""
    rng = np.random.default_rng(5)
    for trial in range(60):
        size = int(rng.choice([7, 100, 49_152]))
        z = rng.standard_normal(size)
        z[: size // 2] = np.round(z[: size // 2])  # many ties
        z[rng.integers(0, size, size // 4)] = -np.inf
        full = np.argsort(-z, kind="stable")
        for n in (1, 5, 64, size // 2, size - 1, size, size + 3):
            assert np.array_equal(_head(z, n), full[:n]), (trial, size, n)


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.95, 0.9999, 1 - 1e-15])
def test_top_p_sorts_as_far_as_its_cut_reaches(top_p):
    """Logits in layers 0, 9.5, 20 and 40 nats below the top, over SmolLM2's vocabulary, and
    a quarter masked: top-p 0.05 and 0.5 stop at the first cut (8 nats down), 0.95 and 0.9999
    take the second (16), 1 - 1e-15 the fourth (64). The tokens kept, and their
    probabilities, are those of a full stable sort."""
    rng = np.random.default_rng(6)
    z = np.concatenate([rng.normal(0, 0.5, 10), rng.normal(-9.5, 0.3, 30_000), rng.normal(-20, 1, 9_000),
                        rng.normal(-40, 2, 10_142)])
    rng.shuffle(z)
    z[rng.integers(0, len(z), len(z) // 4)] = -np.inf
    order, probs = Sampler(SamplingParams(temperature=1.0, top_p=top_p))._top(z)
    full = np.argsort(-z, kind="stable")
    p = softmax(z[full])
    keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
    assert np.array_equal(order, full[:keep])
    assert np.allclose(probs, p[:keep], rtol=1e-12, atol=0)


def test_a_draw_without_top_k_or_top_p_sorts_nothing(monkeypatch):
    """With neither cut (min-p alone, or nothing) there is no order to keep: the draw walks
    the vocabulary in token order and never sorts it (a full sort took longer than a step).
    The distribution is the reference's (the chi-square tests above, at top_p 1)."""
    z = np.random.default_rng(7).normal(0, 2, 49_152).astype(np.float32)
    expected = {}
    for min_p in (0.0, 0.05):
        sampler = Sampler(SamplingParams(temperature=0.8, top_p=1.0, min_p=min_p, seed=3))
        expected[min_p] = [sampler(z, []) for _ in range(5)]

    def no_sorting(*args, **kwargs):
        raise AssertionError("the uncut draw sorted the logits")

    monkeypatch.setattr(np, "argsort", no_sorting)
    monkeypatch.setattr(np, "partition", no_sorting)
    for min_p, draws in expected.items():
        sampler = Sampler(SamplingParams(temperature=0.8, top_p=1.0, min_p=min_p, seed=3))
        assert [sampler(z, []) for _ in range(5)] == draws
    # min-p's survivors: within ln(0.05) of the top logit
    kept_ids = {Sampler(SamplingParams(temperature=5.0, top_p=1.0, min_p=0.05, seed=s))(z, []) for s in range(200)}
    assert min(z[sorted(kept_ids)]) >= z.max() + np.log(0.05) - 1e-6


def test_nothing_to_draw_is_refused_on_every_path():
    """All logits -inf (nothing a constraint allows, say): a clear error, never a token id."""
    z = np.full(10, -np.inf, np.float32)
    for top_p in (1.0, 0.9):
        with np.errstate(invalid="ignore"), pytest.raises(ValueError, match="no token can be drawn"):
            Sampler(SamplingParams(temperature=0.8, top_p=top_p, seed=1))(z, [])


def test_a_cut_draws_what_rng_choice_draws():
    """The sorted paths pick as numpy's Generator.choice picks (the same seeded answers as
    before it was replaced), without its checks of the probabilities."""
    logits = np.array(NUCLEUS, np.float32)  # in descending order already
    z = logits.astype(np.float64)
    keep = int(np.searchsorted(np.cumsum(softmax(z)), 0.9)) + 1
    assert keep == 5
    ours, rng = Sampler(SamplingParams(temperature=1.3, top_p=0.9, seed=9)), np.random.default_rng(9)
    draws = [ours(logits, []) for _ in range(500)]
    assert draws == [int(rng.choice(keep, p=softmax(z[:keep] / 1.3))) for _ in range(500)]
    assert set(draws) == set(range(keep))


# -- temperature -----------------------------------------------------------------------------

# 12 tokens spread over 3 nats: every token is drawn often enough at both temperatures.
SPREAD = [1.5, 1.2, 0.9, 0.7, 0.4, 0.2, 0.0, -0.3, -0.6, -0.9, -1.2, -1.5]


@pytest.mark.parametrize("temperature, seed", [(0.5, 11), (2.0, 12)])
def test_temperature_scales_the_logits_before_the_softmax(temperature, seed):
    counts = draw(SPREAD, temperature=temperature, top_p=1.0, seed=seed)
    right = reference(SPREAD, temperature=temperature)
    assert np.allclose(right, softmax(np.array(SPREAD) / temperature))
    assert_fits(counts, right, f"temperature {temperature}",
                at_temperature_1=reference(SPREAD),
                temperature_inverted=reference(SPREAD, temperature=1 / temperature))


def test_temperature_zero_is_the_argmax_after_the_penalty():
    # Token 0 leads until penalized: 2.0 / 1.1 = 1.82 < 1.9. All-negative logits take the
    # other branch: -1.0 * 1.1 = -1.1 < -1.05 (dividing would have kept token 0 first).
    for logits in ([2.0, 1.9, 0.5, -3.0], [-1.0, -1.05, -2.0, -4.0]):
        z = np.array(logits, np.float32)
        for seed in range(5):
            assert Sampler(SamplingParams(temperature=0, seed=seed))(z, []) == 0
            greedy = Sampler(SamplingParams(temperature=0, top_p=0.5, top_k=3, min_p=0.2, repeat_penalty=1.1,
                                            seed=seed))
            assert [greedy(z, [0, 3]) for _ in range(50)] == [1] * 50, logits


# -- top-k, top-p, min-p, each alone ---------------------------------------------------------

# Probabilities at temperature 1, cumulative 0.35 0.60 0.75 0.85 0.91 0.95 0.98 1.00.
NUCLEUS = list(np.log([0.35, 0.25, 0.15, 0.10, 0.06, 0.04, 0.03, 0.02]))


def test_top_k_keeps_the_k_likeliest():
    logits = list(np.linspace(2.0, -2.0, 20))
    counts = draw(logits, temperature=1.0, top_p=1.0, top_k=6, seed=21)
    right = reference(logits, top_k=6)
    assert kept(right) == set(range(6))
    assert_fits(counts, right, "top_k 6", top_k_7=reference(logits, top_k=7), no_cut=reference(logits))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    counts = draw(NUCLEUS, temperature=1.0, top_p=0.7, seed=31)
    right = reference(NUCLEUS, top_p=0.7)
    assert kept(right) == {0, 1, 2}  # 0.60 < 0.7 <= 0.75
    # a cut that stops before the cumulative sum passes p would keep {0, 1}
    assert_fits(counts, right, "top_p 0.7", stops_below_p=restricted(reference(NUCLEUS), [0, 1]),
                no_cut=reference(NUCLEUS))
    assert kept(draw(NUCLEUS, n=200, temperature=1.0, top_p=0.01, seed=32)) == {0}  # at least one token


def test_min_p_keeps_tokens_near_the_top_probability():
    # min_p 0.2 keeps logits >= 1.0 + ln 0.2 = -0.61: tokens 0-4
    logits = [1.0, 0.6, 0.2, -0.4, -0.55, -0.7, -1.0, -1.5, -2.0, -2.5]
    counts = draw(logits, temperature=1.0, top_p=1.0, min_p=0.2, seed=41)
    right = reference(logits, min_p=0.2)
    assert kept(right) == {0, 1, 2, 3, 4}
    full = reference(logits)
    assert_fits(counts, right, "min_p 0.2", absolute_threshold=restricted(full, np.flatnonzero(full >= 0.2)),
                no_cut=full)


# -- the order of the stages -----------------------------------------------------------------

def test_top_p_sees_the_logits_before_the_temperature():
    # At T = 2 the cumulative sums are 0.23 0.43 0.58 0.70: top-p on tempered logits keeps 4.
    counts = draw(NUCLEUS, temperature=2.0, top_p=0.7, seed=51)
    right = reference(NUCLEUS, temperature=2.0, top_p=0.7)
    wrong = reference(NUCLEUS, temperature=2.0, top_p=0.7, order=("temperature", "top_p"))
    assert (kept(right), kept(wrong)) == ({0, 1, 2}, {0, 1, 2, 3})
    assert_fits(counts, right, "top_p 0.7 at T 2", temperature_first=wrong,
                no_temperature=reference(NUCLEUS, top_p=0.7))


def test_min_p_sees_the_logits_before_the_temperature():
    # At T = 0.5 the ratios to the top square: min-p on tempered logits keeps only 0-2.
    logits = [1.0, 0.6, 0.2, -0.4, -0.55, -0.7, -1.0, -1.5, -2.0, -2.5]
    counts = draw(logits, temperature=0.5, top_p=1.0, min_p=0.2, seed=61)
    right = reference(logits, temperature=0.5, min_p=0.2)
    wrong = reference(logits, temperature=0.5, min_p=0.2, order=("temperature", "min_p"))
    assert (kept(right), kept(wrong)) == ({0, 1, 2, 3, 4}, {0, 1, 2})
    assert_fits(counts, right, "min_p 0.2 at T 0.5", temperature_first=wrong)


def test_top_k_comes_before_top_p():
    # Over all 20 tokens the cumulative sums are 0.30 0.50 0.65 0.75: top-p 0.7 keeps 4, as
    # top-k 4 does. Renormalized over the top 4 they are 0.40 0.67 0.87: top-p keeps 3.
    probs = np.concatenate([[0.30, 0.20, 0.15, 0.10], 0.25 * softmax(-0.05 * np.arange(16))])
    logits = list(np.log(probs))
    counts = draw(logits, temperature=1.0, top_k=4, top_p=0.7, seed=71)
    right = reference(logits, top_k=4, top_p=0.7)
    wrong = reference(logits, top_k=4, top_p=0.7, order=("top_p", "top_k"))
    assert (kept(right), kept(wrong)) == ({0, 1, 2}, {0, 1, 2, 3})
    assert_fits(counts, right, "top_k 4 + top_p 0.7", top_p_first=wrong)


def test_the_penalty_comes_before_top_k():
    # Token 0 (3.0, recent) falls to 1.5 under penalty 2 and out of the top 3.
    logits = [3.0, 2.0, 1.8, 1.6, 1.0, 0.5, 0.0, -0.5]
    counts = draw(logits, [0], temperature=1.0, top_p=1.0, top_k=3, repeat_penalty=2.0, seed=81)
    right = reference(logits, top_k=3, penalty=2.0, recent=[0])
    wrong = reference(logits, top_k=3, penalty=2.0, recent=[0], order=("top_k", "penalty", "temperature"))
    assert (kept(right), kept(wrong)) == ({1, 2, 3}, {0, 1, 2})
    assert_fits(counts, right, "penalty 2 + top_k 3", top_k_first=wrong)


# -- the repeat penalty ----------------------------------------------------------------------

PENALIZED = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0, -2.5]


def test_repeat_penalty_divides_positive_multiplies_negative_and_counts_once():
    # Token 0 (2.0) is in `recent` twice, token 6 (-1.0) once: 2.0 -> 1.0 and -1.0 -> -2.0.
    recent = [0, 6, 9, 0]
    counts = draw(PENALIZED, recent, temperature=1.0, top_p=1.0, repeat_penalty=2.0, seed=91)
    right = reference(PENALIZED, penalty=2.0, recent=recent)
    assert np.allclose(right, softmax([1.0, 1.5, 1.0, 0.5, 0.0, -0.5, -2.0, -1.5, -2.0, -5.0]))
    assert right[6] < reference(PENALIZED)[6]  # a penalized negative logit is less likely
    assert_fits(counts, right, "penalty 2", no_penalty=reference(PENALIZED),
                negative_divided=reference(PENALIZED, penalty=2.0, recent=recent, penalize=lambda v, n, p: v / p),
                penalized_per_occurrence=reference(PENALIZED, penalty=2.0, recent=recent,
                                                   penalize=lambda v, n, p: llama_penalty(v, n, p ** n)))


def test_repeat_penalty_looks_back_64_tokens():
    # 65 recent tokens: token 0 only at position -65, token 1 only at -64, filler 9 after.
    recent = [0, 1] + [9] * 63
    counts = draw(PENALIZED, recent, temperature=1.0, top_p=1.0, repeat_penalty=2.0, seed=101)
    right = reference(PENALIZED, penalty=2.0, recent=recent)
    assert np.allclose(right, reference(PENALIZED, penalty=2.0, recent=[1, 9]))  # token 0 is not penalized
    assert_fits(counts, right, "penalty window", window_65=reference(PENALIZED, penalty=2.0, recent=recent, window=65),
                window_63=reference(PENALIZED, penalty=2.0, recent=recent, window=63))
    greedy = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    z = np.array(PENALIZED, np.float32)  # 2.0 (token 0) vs 1.5 (token 1); penalized 0 gives 1.0
    assert greedy(z, [0] + [9] * 64) == 0  # token 0 at -65: not penalized
    assert greedy(z, [0] + [9] * 63) == 1  # token 0 at -64: penalized
    assert greedy(z, [1, 0] + [9] * 63) == 1  # token 1 at -65 kept at 1.5, token 0 at -64 down to 1.0


# -- everything at once ----------------------------------------------------------------------

def test_all_stages_together():
    # Token 1 (0.4) is recent once and token 5 (-0.55) twice: 0.31 and -0.715. Penalized,
    # token 5 falls below min-p's bar (0.6 + ln 0.3 = -0.60); unpenalized it would stay.
    logits = [0.6, 0.4, 0.1, -0.1, -0.3, -0.55, -0.9, -1.1, -1.4, -1.6] + list(np.linspace(-2.2, -5.0, 14))
    recent = [1, 5, 5, 12]
    params = dict(temperature=0.7, top_k=8, top_p=0.9, min_p=0.3, penalty=1.3, recent=recent)
    counts = draw(logits, recent, temperature=0.7, top_k=8, top_p=0.9, min_p=0.3, repeat_penalty=1.3, seed=111)
    right = reference(logits, **params)
    stages = [kept(reference(logits, **params, order=LLAMA_CPP_ORDER[:i] + ("temperature",))) for i in range(1, 5)]
    assert [len(s) for s in stages] == [24, 8, 7, 5]  # top-k, top-p and min-p each cut something
    assert kept(right) == {0, 1, 2, 3, 4}
    assert_fits(counts, right, "all stages",
                temperature_first=reference(logits, **params,
                                            order=("penalty", "temperature", "top_k", "top_p", "min_p")),
                penalty_last=reference(logits, **params, order=("top_k", "top_p", "min_p", "penalty", "temperature")),
                negative_divided=reference(logits, **params, penalize=lambda v, n, p: v / p),
                no_penalty=reference(logits, **{**params, "penalty": 1.0}))


def test_seeded_sampling_repeats_and_differs_by_seed():
    logits = np.random.default_rng(0).normal(size=500).astype(np.float32)

    def draws(seed):
        sampler = Sampler(SamplingParams(temperature=1.5, top_p=1.0, seed=seed))
        return [sampler(logits, []) for _ in range(40)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


# -- the options through `llm -o` on SmolLM2-135M --------------------------------------------

PROMPT = "Tell me a story about a dragon."
REPEATING = "Write the word yes ten times."
SEEDS = (1, 2, 3)
HOT = ["-o", "temperature", "3", "-o", "max_tokens", "8"]


def llm_says(*args: str) -> str:
    result = CliRunner().invoke(cli, ["-m", "smollm2-q", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def model_path(user_dir):
    return (user_dir / "smolq" / "SmolLM2-135M-Instruct.Q4_1.gguf").resolve()


@functools.cache
def prompt_ids(path, prompt: str) -> tuple[int, ...]:
    """The ids llm evaluates for the prompt: the KV cache after a one-token answer."""
    llm_says("-o", "temperature", "0", "-o", "max_tokens", "1", prompt)
    return tuple(loaded_models.in_memory[str(path)].engine.tokens)


@functools.cache
def own_engine(path):
    return llm_smolq.load(path, n_ctx=512)


@functools.cache
def own_greedy(path, prompt: str, max_tokens: int, penalty: float = 1.0) -> str:
    """The answer as this test works it out: argmax of the logits, after the penalty over
    the last 64 ids (prompt included), until an end-of-turn token or max_tokens."""
    ids = list(prompt_ids(path, prompt))
    engine = own_engine(path)
    engine.reset()
    vocab = engine.tokenizer.tokens
    enders = {vocab.index("<|im_end|>"), vocab.index("<|endoftext|>"), engine.tokenizer.eos_id}
    history, answer = list(ids), []
    logits = engine.eval(ids)
    while len(answer) < max_tokens:
        z = logits.astype(np.float64)
        for t in set(history[-64:]) if penalty != 1.0 else ():
            z[t] = z[t] / penalty if z[t] > 0 else z[t] * penalty
        token = int(np.argmax(z))
        if token in enders:
            break
        answer.append(token)
        history.append(token)
        if len(answer) < max_tokens:
            logits = engine.eval([token])
    return engine.detokenize(answer) + "\n"  # llm ends the answer with a newline


def input_tokens(user_dir) -> int:
    db = sqlite3.connect(user_dir / "logs.db")
    return db.execute("select input_tokens from turns order by rowid desc limit 1").fetchone()[0]


def test_temperature_0_is_this_tests_greedy_answer(user_dir):
    path = model_path(user_dir)
    answer = llm_says("-o", "temperature", "0", "-o", "max_tokens", "8", PROMPT)
    assert input_tokens(user_dir) == len(prompt_ids(path, PROMPT))
    assert answer == own_greedy(path, PROMPT, 8) and answer.strip()


@pytest.mark.parametrize("cut", [["-o", "top_k", "1", "-o", "top_p", "1"],
                                 ["-o", "top_p", "0.00001"],  # below 1/vocab: only the top token
                                 ["-o", "min_p", "1", "-o", "top_p", "1"]], ids=["top_k", "top_p", "min_p"])
def test_a_tight_cut_at_a_high_temperature_is_greedy(user_dir, cut):
    greedy = own_greedy(model_path(user_dir), PROMPT, 8)
    assert any(text != greedy for text in uncut_answers()), "temperature 3 alone gave the greedy answer"
    assert [llm_says(*HOT, *cut, "-o", "seed", str(s), PROMPT) for s in SEEDS] == [greedy] * len(SEEDS)


@functools.cache
def uncut_answers() -> tuple[str, ...]:
    return tuple(llm_says(*HOT, "-o", "top_p", "1", "-o", "seed", str(s), PROMPT) for s in SEEDS)


def test_repeat_penalty_is_this_tests_penalized_greedy_answer(user_dir):
    path = model_path(user_dir)
    penalized = llm_says("-o", "temperature", "0", "-o", "repeat_penalty", "1.5", "-o", "max_tokens", "12", REPEATING)
    assert penalized == own_greedy(path, REPEATING, 12, penalty=1.5)
    assert penalized != own_greedy(path, REPEATING, 12)


def test_seed_repeats_and_differs(user_dir):
    sampled = ["-o", "temperature", "1.5", "-o", "top_p", "1", "-o", "max_tokens", "8", PROMPT]
    first, again, other = (llm_says("-o", "seed", s, *sampled) for s in ("5", "5", "6"))
    assert first == again and first.strip()
    assert other != first
