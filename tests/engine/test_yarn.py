"""YaRN: past the trained context, declared by the GGUF or asked for, against llama.cpp's
own logits for the same files (tests/data/yarn-tiny-Q8_0.npz, made by
tests/engine/make_yarn_reference.py with llama-cpp-python)."""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as V

import llm_smolq
from llm_smolq import GGUFError
from llm_smolq.dev.gguf_mutations import with_metadata
from make_yarn_reference import CONTEXT, FACTOR, N_CTX, yarn_files
from test_engine_reference import CROSS_BUILD_MAX, CROSS_BUILD_MEDIAN, assert_within

DATA = Path(__file__).resolve().parents[1] / "data" / "yarn-tiny-Q8_0.npz"


@pytest.fixture(scope="module")
def reference():
    return np.load(DATA)


@pytest.fixture(scope="module")
def files(reference_dir, tmp_path_factory):
    return yarn_files(reference_dir / "tiny-smollm3-Q8_0.gguf", tmp_path_factory.mktemp("yarn"))


def run(eng, ref, case):
    """The prompt in llama.cpp's batches of 512, then its greedy ids one at a time: the
    prompt's rows and each step's logits."""
    tokens, rows = ref["tokens"].tolist(), []
    for i in range(0, len(tokens), 512):
        rows.append(eng.eval(tokens[i:i + 512], all_logits=True))
    rows = np.concatenate(rows)
    return rows, [rows[-1]] + [eng.eval([t]) for t in ref[f"{case}_greedy"].tolist()[:-1]]


@pytest.mark.parametrize("case", ["declared", "asked"])
def test_yarn_stays_within_llama_cpps_spread_past_the_trained_context(case, files, reference):
    """Against llama.cpp's AVX2 build, held as the reference files are
    (test_engine_reference.py): measured 1.5e-2 median, 1.8e-2 worst row, the same top-1."""
    extra = {} if case == "declared" else {"rope_scaling": "yarn"}
    eng = llm_smolq.load(files[case], n_ctx=N_CTX, kv_dtype="f32", **extra)
    assert eng.config.rope_scaling.factor == FACTOR and eng.config.rope_scaling.original_context == CONTEXT
    rows, steps = run(eng, reference, case)
    assert eng.n_past > CONTEXT
    ours = np.concatenate([rows[reference["row_index"]], np.stack(steps)])
    theirs = np.concatenate([reference[f"{case}_rows"], reference[f"{case}_greedy_logits"]])
    err = assert_within(ours, theirs, CROSS_BUILD_MAX, f"YaRN {case}")
    assert np.median(err) <= CROSS_BUILD_MEDIAN, np.median(err)


def test_without_yarn_the_same_positions_are_far_off(files, reference):
    """The reference tells YaRN from plain RoPE: turned off, the rows it has within the
    trained context differ by most of their size (but the first, one key's attention)."""
    eng = llm_smolq.load(files["declared"], n_ctx=CONTEXT, threads=1, kv_dtype="f32", rope_scaling="none")
    within = (reference["row_index"] > 0) & (reference["row_index"] < CONTEXT)
    rows = eng.eval(reference["tokens"].tolist()[:CONTEXT], all_logits=True)[reference["row_index"][within]]
    ref = reference["declared_rows"][within]
    assert (np.linalg.norm(rows - ref, axis=1) / np.linalg.norm(ref, axis=1)).min() > 0.3


def test_the_default_cache_with_yarn_stays_within_llama_cpps_f16_spread(files, reference):
    eng = llm_smolq.load(files["declared"], n_ctx=N_CTX)
    rows, steps = run(eng, reference, "declared")
    ours = np.concatenate([rows[reference["row_index"]], np.stack(steps)])
    theirs = np.concatenate([reference["declared_rows"], reference["declared_greedy_logits"]])
    err = np.linalg.norm(ours - theirs, axis=1) / np.linalg.norm(theirs, axis=1)
    assert err.max() <= 6.5e-2 and np.median(err) <= 4.5e-2, (err.max(), np.median(err))


def test_the_window_is_the_trained_context_times_the_factor(files):
    eng = llm_smolq.load(files["declared"], threads=1)
    assert eng.config.window == eng.n_ctx == CONTEXT * FACTOR
    asked = llm_smolq.load(files["asked"], threads=1, rope_scaling="yarn", rope_scale=3.0)
    assert asked.n_ctx == CONTEXT * 3 and asked.config.rope_scaling.factor == 3.0


def test_past_the_window_without_scaling_is_a_clear_error(files):
    with pytest.raises(ValueError, match=rf"n_ctx={CONTEXT + 1} is past the model's window of {CONTEXT} positions; "
                                         r"lower n_ctx, or extend the window with YaRN: rope_scaling='yarn'"):
        llm_smolq.load(files["asked"], n_ctx=CONTEXT + 1, threads=1)
    with pytest.raises(ValueError, match=rf"n_ctx={N_CTX + 1} is past the model's window of {N_CTX} positions; "
                                         r"lower n_ctx$"):
        llm_smolq.load(files["declared"], n_ctx=N_CTX + 1, threads=1)


@pytest.mark.parametrize("kwargs, says", [
    ({"rope_scaling": "linear"}, "rope_scaling must be 'yarn' or 'none'"),
    ({"rope_scale": 2.0}, "rope_scale is YaRN's factor: give it with rope_scaling='yarn'"),
    ({"rope_scaling": "yarn", "rope_scale": 0.5}, "rope_scale must be a number from 1 to 1024"),
])
def test_bad_scaling_arguments_are_refused(files, kwargs, says):
    with pytest.raises(ValueError, match=says):
        llm_smolq.load(files["asked"], n_ctx=64, threads=1, **kwargs)


@pytest.mark.parametrize("changes, says", [
    ({"smollm3.rope.scaling.type": (V.STRING, "linear")}, "RoPE scaling 'linear' is not supported"),
    ({"smollm3.rope.scaling.type": (V.STRING, "yarn"), "smollm3.rope.scaling.factor": (V.FLOAT32, 0.5)},
     "smollm3.rope.scaling.factor = 0.5 must be from 1 to 1024"),
    ({"smollm3.rope.scaling.type": (V.STRING, "yarn")}, "metadata key smollm3.rope.scaling.factor is missing"),
])
def test_a_file_with_scaling_it_cannot_apply_is_refused(reference_dir, tmp_path, changes, says):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(with_metadata((reference_dir / "tiny-smollm3-Q8_0.gguf").read_bytes(), changes))
    with pytest.raises(GGUFError, match=says):
        llm_smolq.load(bad, n_ctx=64, threads=1)
