"""The prompt cache on disk: exact restores, `llm -c` in a new process, damaged and stale
files, the budget, two processes at once, and the switches that turn it off."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import llm
import numpy as np
import pytest

import llm_smolq.plugin.loaded as loaded_models
import llm_smolq
from llm_smolq import paths
from llm_smolq.dev import follow_up_bench
from llm_smolq.store import prompt_cache
from llm_smolq.engine.kv_types import KV_TYPES
from llm_smolq.store.kv_blocks import FORMAT_VERSION, KVLayout, block_bytes, read_block, read_head
from llm_smolq.store.prompt_cache import PromptCache, parse_size
from helpers.llm_cli import QUICK, last_logs, run

BLOCK = 16  # small blocks, so short prompts make chains of several


@pytest.fixture
def tiny(reference_dir):
    return reference_dir / "tiny-smollm3-chat-Q8_0.gguf"


def load(path, **kwargs):
    return llm_smolq.load(path, n_ctx=kwargs.pop("n_ctx", 512), **kwargs)


def random_ids(engine, n, seed):
    return np.random.default_rng(seed).integers(0, engine.config.vocab_size, n).tolist()


def blocks(directory):
    return sorted(directory.glob("*.kv"))


def saved_state(path, ids, cache, kv_dtype=None):
    """An engine that prefilled ids (one batch, as a prompt is) and saved its state."""
    engine = load(path, **({"kv_dtype": kv_dtype} if kv_dtype else {}))
    engine.eval(ids)
    activity = cache.save(engine)
    assert activity.written_tokens == len(ids) and not activity.problems
    return engine


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("model", ["tiny-smollm3-chat-Q8_0.gguf", "tiny-smollm3-Q4_K_M.gguf", "smollm2"])
def test_restore_then_prefill_gives_the_logits_of_the_live_cache_bit_for_bit(model, kv_dtype, reference_dir,
                                                                              smollm2_gguf, tmp_path):
    path = smollm2_gguf if model == "smollm2" else reference_dir / model
    cache = PromptCache(tmp_path, block_tokens=BLOCK)
    first = random_ids(load(path, n_ctx=16), 70, seed=1)
    saved = saved_state(path, first, cache, kv_dtype)
    assert len(blocks(tmp_path)) == 5  # 4 full blocks and the last 6 positions

    extended = first + random_ids(load(path, n_ctx=16), 20, seed=2)  # the next turn of this conversation
    branched = first[:41] + random_ids(load(path, n_ctx=16), 25, seed=3)  # agrees part way into a block
    for prompt, reusable in ((extended, 70), (branched, 41)):
        engine = load(path, kv_dtype=kv_dtype)
        activity = cache.restore(engine, prompt)
        assert activity.read_tokens == reusable and engine.tokens == prompt[:reusable] and not activity.problems
        assert engine.k_cache.dtype == saved.k_cache.dtype == KV_TYPES[kv_dtype].dtype
        n = reusable  # the restored positions hold the saved engine's bits
        assert np.array_equal(engine.k_cache[:, :, :n].view(np.uint8), saved.k_cache[:, :, :n].view(np.uint8))
        assert np.array_equal(engine.v_cache[:, :, :n].view(np.uint8), saved.v_cache[:, :, :n].view(np.uint8))
        warm = engine.eval(prompt[reusable:])
        # The same positions kept in memory instead: how the saved engine's process would go
        # on. (A prefill of the whole prompt at once need not give these bits: llama.cpp's
        # K-quant mat-muls, and so this engine's, round a row by where it falls in its batch.)
        live = load(path, kv_dtype=kv_dtype)
        live.eval(first)
        live.truncate(reusable)
        assert np.array_equal(warm.view(np.uint32), live.eval(prompt[reusable:]).view(np.uint32))


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "q8_0"])
def test_generated_positions_come_back_exactly_as_the_live_cache_held_them(kv_dtype, reference_dir, tmp_path):
    """Decode steps may round differently from a batched prefill of the same ids; what
    comes back from disk is what the engine held, so continuing from it equals continuing
    in the same process."""
    path = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    cache = PromptCache(tmp_path, block_tokens=BLOCK)
    live = load(path, kv_dtype=kv_dtype)
    prompt = random_ids(live, 30, seed=4)
    logits = live.eval(prompt)
    for _ in range(12):  # an answer, one token per step
        logits = live.eval([int(logits.argmax())])
    cache.save(live)
    follow_up = live.tokens + random_ids(live, 15, seed=5)

    restored = load(path, kv_dtype=kv_dtype)
    assert cache.restore(restored, follow_up).read_tokens == 42
    n = restored.n_past
    assert np.array_equal(restored.k_cache[:, :, :n], live.k_cache[:, :, :n])
    assert np.array_equal(restored.v_cache[:, :, :n], live.v_cache[:, :, :n])
    assert np.array_equal(restored.eval(follow_up[n:]), live.eval(follow_up[n:]))


def test_llm_continue_in_a_new_process_prefills_only_the_new_turn(user_dir, monkeypatch):
    first = run("-m", "smollm2-q", *QUICK, "-s", "Answer briefly.", "Name a large city in France.")
    assert first.exit_code == 0, first.output
    first_row = last_logs(user_dir)[0]
    assert json.loads(first_row["response_json"])["prompt_cache"]["written_tokens"] > first_row["input_tokens"]

    monkeypatch.setattr(loaded_models, "in_memory", {})  # a new process: no engine, nothing in memory
    follow = run("-c", *QUICK, "And one in Italy?")
    assert follow.exit_code == 0, follow.output
    row = last_logs(user_dir)[0]
    cached = json.loads(row["token_details"])["cached"]
    disk = json.loads(row["response_json"])["prompt_cache"]
    assert cached >= first_row["input_tokens"] and disk["read_tokens"] == cached
    assert row["input_tokens"] - cached < 30  # the new turn, and what re-tokenizing the answer changed

    # The same conversation kept in one process, the KV cache in memory and the disk not
    # used: the same reuse and, greedy, the same answer.
    monkeypatch.setattr(loaded_models, "in_memory", {})
    conversation = llm.get_model("smollm2-q").conversation()
    options = {"max_tokens": 6, "temperature": 0, "prompt_cache": False}
    conversation.prompt("Name a large city in France.", system="Answer briefly.", **options).text()
    again = conversation.prompt("And one in Italy?", **options)
    assert again.text() == follow.stdout.rstrip("\n")
    assert again.token_details["cached"] == cached


@pytest.mark.parametrize("thinking", ["true", "false"])
def test_smollm3_template_follow_up_reuses_at_least_the_first_prompt(thinking, user_dir, tiny, monkeypatch):
    assert run("smolq", "register", str(tiny), "--alias", "tiny3").exit_code == 0
    options = [*QUICK, "-o", "thinking", thinking]
    assert run("-m", "tiny3", *options, "Hi there").exit_code == 0
    first_tokens = last_logs(user_dir)[0]["input_tokens"]
    monkeypatch.setattr(loaded_models, "in_memory", {})
    assert run("-c", *options, "And then?").exit_code == 0
    row = last_logs(user_dir)[0]
    cached = json.loads(row["token_details"])["cached"]
    assert first_tokens <= cached == json.loads(row["response_json"])["prompt_cache"]["read_tokens"]


def test_the_follow_up_benchmark_runs_warm_and_cold_in_new_processes(tiny):
    cmd = [sys.executable, "-m", "llm_smolq.dev.bench", str(tiny), "--follow-up", "300", "--threads", "2",
           "--repeat", "1", "--json"]
    report = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    first, warm, cold = report["first_turn"], report["warm"], report["cold"]
    assert report["follow_up_tokens"] > first["first_prompt_tokens"] + first["answer_tokens"] // 2
    assert warm["read_tokens"] == warm["cached_tokens"] and warm["read_tokens"][0] >= first["first_prompt_tokens"]
    assert cold["cached_tokens"] == [0] and cold["read_tokens"] == [0]
    assert first["saved_tokens"] >= first["first_prompt_tokens"] and first["saved_bytes"] > 0
    assert report["ratio"] == report["warm_ttft_s"] / report["cold_ttft_s"] > 0
    text = follow_up_bench.format_report(report)  # the text report of the same figures
    assert f"cold re-prefill:   first token after {cold['ttft_s'][0]:.3f} ({cold['ttft_s'][0]:.3f}-" in text
    assert f"warm / cold: {report['ratio']:.3f}" in text


def flip(offset):
    def damage(path):
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x40
        path.write_bytes(bytes(data))
    return damage


def truncate(n):
    def damage(path):
        path.write_bytes(path.read_bytes()[:n])
    return damage


def newer_version(path):
    """A well-formed file of a format this version does not know (digest recomputed)."""
    data = bytearray(path.read_bytes()[:-32])
    data[8:12] = (FORMAT_VERSION + 1).to_bytes(4, "little")
    path.write_bytes(bytes(data) + hashlib.sha256(data).digest())


def from_another_model(path, reference_dir, tmp_path):
    """A block of another model's chain, put where this chain's block was."""
    other = PromptCache(tmp_path / "other", block_tokens=BLOCK)
    other_path = reference_dir / "tiny-smollm3-Q8_0.gguf"
    saved_state(other_path, random_ids(load(other_path, n_ctx=16), 40, seed=1), other)
    shutil.copyfile(next(p for p in blocks(other.directory) if p.name.startswith("00000016")), path)


DAMAGE = {
    "payload byte flipped": flip(-100),
    "header byte flipped": flip(30),
    "token id flipped": lambda path: flip(-32 - BLOCK * read_head(path).layout.bytes_per_token - 5)(path),
    "digest byte flipped": flip(-1),
    "truncated": truncate(-7),
    "cut inside the header": truncate(20),
    "emptied": truncate(0),
    "padded": lambda path: path.write_bytes(path.read_bytes() + b"\0" * 8),
    "newer format version": newer_version,
    "another model's block": from_another_model,
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_block_is_deleted_and_the_good_prefix_before_it_used(kind, tiny, reference_dir, tmp_path):
    cache = PromptCache(tmp_path / "cache", block_tokens=BLOCK)
    prompt = random_ids(load(tiny, n_ctx=16), 40, seed=6)
    saved_state(tiny, prompt, cache)
    second = blocks(cache.directory)[1]
    assert second.name.startswith("00000016")
    damage = DAMAGE[kind]
    damage(second, reference_dir, tmp_path) if kind == "another model's block" else damage(second)

    follow_up = prompt + random_ids(load(tiny, n_ctx=16), 8, seed=7)
    engine = load(tiny)
    activity = cache.restore(engine, follow_up)
    assert activity.read_tokens == BLOCK and engine.tokens == prompt[:BLOCK]
    assert len(activity.problems) == 1 and second.name in activity.problems[0]
    assert not second.exists()
    assert np.array_equal(engine.eval(follow_up[BLOCK:]), load(tiny).eval(follow_up))


def test_a_damaged_first_block_means_a_cold_prefill_with_the_right_answer(tiny, tmp_path):
    cache = PromptCache(tmp_path, block_tokens=BLOCK)
    prompt = random_ids(load(tiny, n_ctx=16), 40, seed=8)
    saved_state(tiny, prompt, cache)
    flip(-200)(blocks(tmp_path)[0])
    engine = load(tiny)
    assert cache.restore(engine, prompt + [1, 2, 3]).read_tokens == 0 and engine.n_past == 0
    assert np.array_equal(engine.eval(prompt + [1, 2, 3]), load(tiny).eval(prompt + [1, 2, 3]))


def test_a_changed_model_file_or_kv_dtype_finds_nothing(tiny, tmp_path):
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny, model)
    cache = PromptCache(tmp_path / "cache", block_tokens=BLOCK)
    prompt = random_ids(load(model, n_ctx=16), 40, seed=9)
    saved_state(model, prompt, cache)
    # the same file: found (all but the last position, which runs anyway for its logits)
    assert cache.restore(load(model), prompt).read_tokens == 39

    assert cache.restore(load(model, kv_dtype="f32"), prompt).read_tokens == 0  # another KV layout
    assert cache.restore(load(model, kv_dtype="q8_0"), prompt).read_tokens == 0
    assert cache.restore(load(model, rope_scaling="yarn"), prompt).read_tokens == 0  # other RoPE angles

    st = os.stat(model)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched (re-downloaded, say)
    assert cache.restore(load(model), prompt).read_tokens == 0

    data = bytearray(model.read_bytes())  # a weight changed, size and mtime put back as they were
    data[-1000] ^= 1
    model.write_bytes(bytes(data))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.restore(load(model), prompt).read_tokens == 0
    assert len(blocks(cache.directory)) == 3  # not damaged, only unreachable: left to the budget


def test_the_budget_evicts_the_least_recently_used_and_a_chain_loses_its_end_first(tiny, tmp_path):
    one_block = block_bytes(450, BLOCK, KVLayout.of(load(tiny, n_ctx=16)))
    cache = PromptCache(tmp_path, max_bytes=int(4.5 * one_block), block_tokens=BLOCK)
    a, b, c, d = (random_ids(load(tiny, n_ctx=16), BLOCK, seed=s) for s in (10, 11, 12, 13))
    long = random_ids(load(tiny, n_ctx=16), 3 * BLOCK, seed=14)
    saved_state(tiny, long, cache)
    saved_state(tiny, a, cache)
    assert len(blocks(tmp_path)) == 4
    saved_state(tiny, b, cache)  # over budget: the long chain's last block goes first
    assert cache.restore(load(tiny), long).read_tokens == 2 * BLOCK  # and is now the most recently used
    saved_state(tiny, c, cache)  # a is now the least recently used
    assert cache.restore(load(tiny), a).read_tokens == 0
    assert cache.restore(load(tiny), b).read_tokens == BLOCK - 1  # the last runs anyway
    assert cache.restore(load(tiny), long).read_tokens == 2 * BLOCK
    assert cache.total_bytes() <= cache.max_bytes

    tight = PromptCache(tmp_path, max_bytes=int(1.5 * one_block), block_tokens=BLOCK)
    engine = load(tiny)
    engine.eval(d * 3)
    assert tight.save(engine).written_tokens == BLOCK  # a state larger than the budget keeps its start
    assert tight.restore(load(tiny), d * 3).read_tokens == BLOCK
    assert len(blocks(tmp_path)) == 1



def test_each_model_has_its_own_budget(tiny, tmp_path):
    """One model's saves hold its own blocks to the budget and leave another model's be."""
    other = tmp_path / "other.gguf"
    shutil.copyfile(tiny, other)  # another file: another chain root
    one_block = block_bytes(450, BLOCK, KVLayout.of(load(tiny, n_ctx=16)))
    cache = PromptCache(tmp_path / "cache", max_bytes=int(2.5 * one_block), block_tokens=BLOCK)
    theirs = random_ids(load(other, n_ctx=16), 2 * BLOCK, seed=20)
    saved_state(other, theirs, cache)
    for seed in (21, 22, 23):  # three states of one block each: only two fit
        saved_state(tiny, random_ids(load(tiny, n_ctx=16), BLOCK, seed=seed), cache)
    assert len(blocks(tmp_path / "cache")) == 4  # two of tiny's, both of other's
    assert cache.restore(load(other), theirs + [1]).read_tokens == 2 * BLOCK
    assert cache.restore(load(tiny), random_ids(load(tiny, n_ctx=16), BLOCK, seed=21) + [1]).read_tokens == 0
    assert cache.restore(load(tiny), random_ids(load(tiny, n_ctx=16), BLOCK, seed=23) + [1]).read_tokens == BLOCK


def test_the_default_budget_is_twice_the_model_file(tiny, tmp_path, monkeypatch):
    monkeypatch.delenv(prompt_cache.SIZE_ENV, raising=False)
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    cache = PromptCache.configured()
    assert cache.max_bytes is None
    assert cache.budget_for(load(tiny)) == max(64 * 1000**2, 2 * tiny.stat().st_size)
    monkeypatch.setenv(prompt_cache.SIZE_ENV, "10MB")
    assert PromptCache.configured().budget_for(load(tiny)) == 10 * 1000**2
    monkeypatch.setenv(prompt_cache.SIZE_ENV, "0")
    assert PromptCache.configured() is None


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import llm_smolq
    from llm_smolq.store.prompt_cache import PromptCache

    model, directory, budget, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cache = PromptCache(directory, max_bytes=budget, block_tokens=16)
    rng = np.random.default_rng(seed)
    bases = [np.random.default_rng(s).integers(0, 1024, 48).tolist() for s in range(3)]  # shared by both writers
    read = written = 0
    for step in range(12):
        prompt = bases[step % 3][: int(rng.integers(17, 48))] + rng.integers(0, 1024, 8).tolist()
        engine = llm_smolq.load(model, n_ctx=256, threads=1)
        read += cache.restore(engine, prompt).read_tokens
        warm = engine.eval(prompt[engine.n_past:])
        cold = llm_smolq.load(model, n_ctx=256, threads=1).eval(prompt)
        assert np.array_equal(warm, cold), f"step {step}: restored state gave other logits"
        written += cache.save(engine).written_tokens
    print(read, written)
""")


def test_two_processes_writing_reading_and_evicting_at_once(tiny, tmp_path):
    layout = KVLayout.of(load(tiny, n_ctx=16))
    budget = int(8 * block_bytes(450, BLOCK, layout))  # small enough that both evict all the time
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tiny), str(tmp_path), str(budget), str(seed)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for seed in (1, 2)]
    read = written = 0
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        counts = [int(n) for n in out.split()]
        read, written = read + counts[0], written + counts[1]
    assert read > 0 and written * layout.bytes_per_token > 2 * budget  # both reused, and evicted, a lot
    assert not list(tmp_path.glob(".tmp-*"))
    assert 0 < PromptCache(tmp_path).total_bytes() <= budget
    for path in blocks(tmp_path):  # every file left whole and checked
        read_block(read_head(path))


def test_the_option_and_the_environment_turn_it_off(user_dir, monkeypatch):
    directory = user_dir / paths.PROMPT_CACHE_DIR
    assert run("-m", "smollm2-q", *QUICK, "-o", "prompt_cache", "false", "Hello").exit_code == 0
    assert not blocks(directory) and "prompt_cache" not in json.loads(last_logs(user_dir)[0]["response_json"])

    monkeypatch.setenv("SMOLQ_PROMPT_CACHE_SIZE", "0")
    assert run("-m", "smollm2-q", *QUICK, "Hello there").exit_code == 0
    assert not blocks(directory)

    monkeypatch.setenv("SMOLQ_PROMPT_CACHE_SIZE", "lots")
    with pytest.raises(llm.ModelError, match="SMOLQ_PROMPT_CACHE_SIZE='lots' is not a size.*2GB"):
        llm.get_model("smollm2-q").prompt("Hi", max_tokens=1).text()

    monkeypatch.delenv("SMOLQ_PROMPT_CACHE_SIZE")
    assert run("-m", "smollm2-q", *QUICK, "Hello there").exit_code == 0
    assert blocks(directory)


def test_cache_info_and_clear_commands(user_dir, monkeypatch):
    assert run("-m", "smollm2-q", *QUICK, "What is the capital of France?").exit_code == 0
    info = run("smolq", "cache", "info")
    assert info.exit_code == 0
    assert str(user_dir / paths.PROMPT_CACHE_DIR) in info.output and "2x each model's file size" in info.output
    assert "SmolLM2-135M-Instruct.Q4_1.gguf: 1 block, 42 positions" in info.output  # 37 + 5 evaluated

    monkeypatch.setenv("SMOLQ_PROMPT_CACHE_SIZE", "500MB")
    assert "500.0 MB per model (from SMOLQ_PROMPT_CACHE_SIZE)" in run("smolq", "cache", "info").output
    cleared = run("smolq", "cache", "clear")
    assert cleared.exit_code == 0 and cleared.output.startswith("Deleted 1 file ")
    assert "Stored:    0 B in 0 blocks" in run("smolq", "cache", "info").output


@pytest.mark.parametrize("text, size", [("2GB", 2 * 10**9), ("500 MB", 5 * 10**8), ("1.5GiB", 3 * 2**29),
                                        ("123456", 123456), ("0", 0), ("off", 0)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2 parsecs", "-1GB", "1e9"])
def test_bad_sizes_say_how_to_write_one(text):
    with pytest.raises(ValueError, match="give bytes or a number with KB, MB, GB"):
        parse_size(text)


def test_engine_restore_refuses_what_does_not_fit(tiny):
    engine = load(tiny, n_ctx=64)
    ids = random_ids(engine, 20, seed=15)
    engine.eval(ids)
    tokens, k, v = engine.kv_snapshot()
    assert tokens == ids and k.shape == (4, 2, 20, 64) and k.flags.c_contiguous
    assert np.array_equal(engine.kv_snapshot(20, start=5)[1], k[:, :, 5:])
    with pytest.raises(ValueError, match="0 <= start <= n <= n_past"):
        engine.kv_snapshot(21)

    other = load(tiny, n_ctx=64)
    with pytest.raises(llm_smolq.LayoutError, match="float32, but this engine's KV cache is float16"):
        other.restore_kv(tokens, k.astype(np.float32), v.astype(np.float32))
    with pytest.raises(llm_smolq.LayoutError, match=r"shape \[4, 2, 19, 64\], expected \[4, 2, 20, 64\]"):
        other.restore_kv(tokens, k[:, :, 1:], v[:, :, 1:])
    with pytest.raises(ValueError, match="does not hold the first 5 of these tokens"):
        other.restore_kv(tokens, k[:, :, 5:], v[:, :, 5:], start=5)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        other.restore_kv([5000] + tokens[1:], k, v)
    with pytest.raises(ValueError, match="do not fit the context of 16"):
        load(tiny, n_ctx=16).restore_kv(tokens, k, v)
    assert other.n_past == 0
    other.restore_kv(tokens, k, v)
    assert np.array_equal(other.eval([1, 2]), engine.eval([1, 2]))
