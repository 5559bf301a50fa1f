"""Lookup decoding (decode/lookup.py): the drafts, the batches that check them, and an
output equal to plain decoding's, greedy, seeded, constrained and through llm."""

import json

import numpy as np
import pytest
from scipy.stats import chi2_contingency

import llm_smolq
from llm_smolq.decode.constrained import Constraint
from llm_smolq.decode.generate import Completion, generate
from llm_smolq.decode.lookup import Draft, DraftPolicy, NgramDrafter
from llm_smolq.decode.sampling import SamplingParams
from helpers.llm_cli import last_logs, run

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K",
         "IQ4_NL", "IQ4_XS"]
PARAGRAPH = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small brass lamp and "
             "a notebook in which he wrote the weather, the ships he saw, and the names of the birds that rested on "
             "the railing. In winter the wind came off the sea so hard that the glass hummed.")


# -- the drafter ---------------------------------------------------------------------------

def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_ending():
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3])
    assert d.draft(3) == [7, 8, 2]  # "2 3" last occurred before 7 8 (not before 4 5)
    d.append(7)
    assert d.draft(2) == [8, 2]  # now "2 3 7", found in its one earlier place
    assert d.draft(0) == []


def test_the_longest_matching_ngram_wins():
    # "5 6" was followed by 1 most recently, but "4 5 6" only ever by 2.
    d = NgramDrafter([4, 5, 6, 2, 0, 5, 6, 1, 0, 4, 5, 6], shortest=2, longest=3)
    assert d.draft(1) == [2]
    assert NgramDrafter([4, 5, 6, 2, 0, 5, 6, 1, 0, 4, 5, 6], shortest=2, longest=2).draft(1) == [1]


def test_no_draft_without_an_earlier_occurrence():
    assert NgramDrafter([1, 2, 3, 4]).draft(4) == []  # the ending "3 4" is only itself
    assert NgramDrafter([7]).draft(4) == []
    assert NgramDrafter([]).draft(4) == []
    with pytest.raises(ValueError, match="shortest <= longest"):
        NgramDrafter(shortest=3, longest=2)


def test_a_loop_drafts_its_own_continuation():
    d = NgramDrafter([5, 6, 5, 6, 5, 6])
    assert d.draft(4) == [5, 6, 5, 6]


def test_the_policy_drafts_longer_as_drafts_are_kept_and_stops_when_they_are_not():
    policy = DraftPolicy(8, rate=0.6, cost=0.5)
    assert policy.length(100) == 1  # 0.6 > 0.5, 0.36 < 0.5
    policy.stepped(0.010)
    for _ in range(6):
        policy.checked(4, 4, 0.012)  # every token kept; each cost a fifth of a step
    assert policy.cost < 0.3 and policy.rate(0) > 0.9
    assert policy.length(100) == 8 and policy.length(3) == 3 and policy.length(0) == 0
    for _ in range(10):
        policy.checked(4, 0, 0.030)  # missed at once, and checking cost half a step per token
    assert policy.rate(0) < policy.cost
    lengths = [policy.length(100) for _ in range(40)]
    assert lengths.count(1) == 2 and set(lengths) == {0, 1}  # only a probe now and then


def test_the_policy_keeps_a_rate_for_each_length_of_match():
    policy = DraftPolicy(8, rate=0.6, cost=0.3)
    policy.stepped(0.010)
    for _ in range(16):  # each drafted token costs a quarter of a step to check
        policy.checked(8, 8, 0.030, order=4)  # drafts after a 4-gram match: all kept
        policy.checked(8, 0, 0.030, order=2)  # after a 2-gram match: missed at once
    assert abs(policy.cost - 0.25) < 0.01
    assert policy.rate(4) > 0.9 and policy.rate(2) < 0.15 and policy.rate(3) == 0.6
    assert policy.length(100, 4) == 8
    assert policy.length(100, 2) == 0
    assert policy.length(100, 3) == 2  # no drafts of its own yet: the starting rate, 0.36 > 0.25


def test_a_draft_is_kept_token_by_token_and_judged_as_far_as_it_was_kept():
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    draft = Draft([7, 8, 9], rows, order=4, seconds=0.03)
    assert draft.expected == 7 and not draft.all_kept
    assert np.array_equal(draft.accept(), rows[0]) and draft.expected == 8
    assert np.array_equal(draft.accept(), rows[1]) and draft.accepted == 2 and not draft.all_kept
    judged, checked = DraftPolicy(8), DraftPolicy(8)
    for policy in (judged, checked):
        policy.stepped(0.010)
    judged.judged(draft)  # missed at its third token
    checked.checked(3, 2, 0.03, order=4)
    assert judged.rates == checked.rates and judged.cost == checked.cost
    assert np.array_equal(draft.accept(), rows[2]) and draft.all_kept


def test_the_drafter_says_how_long_its_match_is():
    d = NgramDrafter([1, 2, 3, 9, 5, 2, 3])
    assert d.order() == 2 and d.draft(2) == [9, 5]  # "2 3" occurred before; "5 2 3" did not
    d.append(9)
    assert d.order() == 3 and d.draft(1) == [5]  # now "2 3 9" did
    assert NgramDrafter([1, 2, 3, 4]).order() == 0


# -- a draft's check: the logits of as many one-token steps --------------------------------

# The KV caches and thread counts a check is tried on: the F32 cache for every type; the
# compact caches, whose attention is the same whatever the weights' type, for one type of
# 32-element blocks and one of super-blocks. Three threads for the model's two KV heads:
# the compact caches' attention then cuts the batch's tokens into three blocks, so that
# every thread has a task per head.
COMPACT_CACHES = (("f16", 2), ("q8_0", 2), ("f16", 3), ("q8_0", 3))


@pytest.mark.parametrize("kind", TYPES)
def test_a_batch_gives_each_tokens_one_step_logits(reference_dir, kind):
    """What lookup decoding rests on: a draft checked in one batch gets, row for row, the bits
    of the one-token steps plain decoding takes, on every KV cache type."""
    ids = [int(i) for i in np.random.default_rng(7).integers(3, 1000, 80)]
    for kv, threads in (("f32", 2),) + (COMPACT_CACHES if kind in ("Q4_0", "Q4_K_M") else ()):
        eng = llm_smolq.load(reference_dir / f"tiny-smollm3-{kind}.gguf", n_ctx=256, threads=threads, kv_dtype=kv)
        eng.eval(ids[:64])
        for n in (16, 9, 2):
            batch = eng.eval(ids[64:64 + n], all_logits=True)
            eng.truncate(64)
            steps = np.stack([eng.eval([t]) for t in ids[64:64 + n]])
            eng.truncate(64)
            assert batch.tobytes() == steps.tobytes(), (kind, kv, threads, n)


# -- generate: the same answer, the same cache --------------------------------------------

@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return llm_smolq.load(smollm2_gguf, n_ctx=2048)


def chat(engine, question: str) -> list[int]:
    return engine.tokenize(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", special=True)


def answer(engine, ids, params, max_tokens, lookup, stops=(), constraint=None):
    engine.reset()
    done = Completion()
    text = "".join(generate(engine, ids, params, max_tokens, stops, done, constraint=constraint, lookup=lookup))
    return text, done, engine.tokens


@pytest.mark.parametrize("max_tokens, stops", [(160, ()), (37, ()), (160, ("railing",))])
def test_greedy_lookup_gives_plain_decodings_tokens_and_cache(smollm2, max_tokens, stops):
    ids = chat(smollm2, f"Repeat this paragraph word for word:\n\n{PARAGRAPH}")
    greedy = SamplingParams(temperature=0)
    text, plain, plain_cache = answer(smollm2, ids, greedy, max_tokens, 0, stops)
    text8, looked, lookup_cache = answer(smollm2, ids, greedy, max_tokens, 8, stops)
    assert looked.output_ids == plain.output_ids and text8 == text
    assert lookup_cache == plain_cache  # the KV cache ends where plain decoding's does
    assert looked.finish_reason == plain.finish_reason
    assert plain.drafted_tokens == 0
    assert looked.accepted_tokens > len(looked.output_ids) // 3  # the copy was drafted, and kept
    assert looked.drafted_tokens >= looked.accepted_tokens


def test_seeded_sampling_with_lookup_draws_the_same_answer(smollm2):
    ids = chat(smollm2, f"Repeat this paragraph word for word:\n\n{PARAGRAPH}")
    for seed in (1, 2):
        params = SamplingParams(temperature=0.5, top_p=0.95, top_k=40, repeat_penalty=1.02, seed=seed)
        _, plain, plain_cache = answer(smollm2, ids, params, 80, 0)
        _, looked, lookup_cache = answer(smollm2, ids, params, 80, 6)
        assert looked.output_ids == plain.output_ids and lookup_cache == plain_cache
        assert looked.accepted_tokens > 0


def test_lookup_sampling_keeps_the_distribution(reference_dir):
    """Token frequencies from different seeds, with and without lookup, are samples of one
    distribution: chi-square homogeneity test over the second output token (the first one drawn from a row that checks a draft), p > 1e-3. The
    prompt ends inside a loop the random model's greedy answer fell into, so drafts are
    made, and often kept, at this temperature."""
    eng = llm_smolq.load(reference_dir / "tiny-smollm3-Q8_0.gguf", n_ctx=512, threads=1, kv_dtype="f32")
    start = [int(i) for i in np.random.default_rng(2).integers(3, 1000, 12)]
    _, greedy, _ = answer(eng, start, SamplingParams(temperature=0), 40, 0)
    ids = start + greedy.output_ids
    counts: list[dict[int, int]] = [{}, {}]
    accepted = 0
    for which, lookup in enumerate((0, 6)):
        for seed in range(which * 800, which * 800 + 800):
            _, done, _ = answer(eng, ids, SamplingParams(temperature=0.5, top_k=4, seed=seed), 3, lookup)
            counts[which][done.output_ids[1]] = counts[which].get(done.output_ids[1], 0) + 1
            accepted += done.accepted_tokens
    assert accepted > 200  # drafts were kept: the lookup path is what was sampled
    tokens = sorted(set(counts[0]) | set(counts[1]))
    assert len(tokens) >= 2
    table = np.array([[c.get(t, 0) for t in tokens] for c in counts]) + 0.5  # no empty cells
    _, p, _, _ = chi2_contingency(table)
    assert p > 1e-3, (p, table)


def test_a_constrained_answer_is_the_same_with_lookup(reference_dir):
    eng = llm_smolq.load(reference_dir / "tiny-smollm3-Q8_0.gguf", n_ctx=1024, kv_dtype="f32")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
              "required": ["name", "tags"]}
    ids = chat(eng, 'Answer in JSON like {"name": "x", "tags": ["a", "b", "a", "b", "a"]}: '
                    '{"name": "x", "tags": ["a", "b", "a", "b", "a"]}')
    for seed in range(3):
        params = SamplingParams(temperature=1.0, seed=seed)
        runs = [answer(eng, ids, params, 200, lookup, constraint=Constraint.for_json_schema(eng.tokenizer, schema))
                for lookup in (0, 8)]
        (text, plain, cache), (text8, looked, cache8) = runs
        assert text8 == text and looked.output_ids == plain.output_ids and cache8 == cache
        json.loads(text)  # the constraint held
        assert looked.drafted_tokens > 0


# -- through llm ---------------------------------------------------------------------------

def test_llm_logs_what_lookup_drafted_and_kept(user_dir):
    prompt = f"Repeat this paragraph word for word:\n\n{PARAGRAPH}"
    base = ["-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "60", "-o", "prompt_cache", "false"]
    on = run("prompt", *base, prompt)
    off = run("prompt", *base, "-o", "lookup", "0", prompt)
    assert on.exit_code == 0 and off.exit_code == 0, (on.output, off.output)
    # The same answer and notices, but for the one that the model's packed weights were kept
    # on disk, which the session's first load of SmolLM2 gives (whichever test that is).
    assert without_packing_notice(on.output) == without_packing_notice(off.output)
    with_lookup, without = last_logs(user_dir, 2)
    details = json.loads(with_lookup["token_details"])
    assert details["accepted"] > 0 and details["drafted"] >= details["accepted"]
    assert "drafted" not in json.loads(without["token_details"])
    bad = run("prompt", *base, "-o", "lookup", "-1", prompt)
    assert bad.exit_code != 0 and "lookup" in bad.output


def without_packing_notice(output: str) -> str:
    return "".join(line for line in output.splitlines(keepends=True) if "packed weights" not in line)
