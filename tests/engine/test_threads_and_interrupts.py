"""The Engine under threads and Ctrl-C: answers stay right, the KV cache stays consistent.

Ctrl-C is a KeyboardInterrupt that Python raises in the main thread at the first bytecode
after the signal arrives; during a kernel call that is just after the call returns. The
tests raise it at each such place: between the prefill's kernel calls, after a call but
before the engine counts its tokens, and during decode; one sends a real SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import numpy as np
import pytest

import llm_smolq
from llm_smolq.engine import engine as engine_module
from llm_smolq.engine.engine import MAX_BATCH, Engine
from llm_smolq.decode.generate import Completion, generate
from llm_smolq.decode.sampling import SamplingParams
from llm_smolq.model.model_file import open_model

GREEDY = SamplingParams(temperature=0)
PROMPT = [int(t) for t in np.random.default_rng(3).integers(0, 1024, 2 * MAX_BATCH + 88)]  # three batches


@pytest.fixture(scope="module")
def model_path(reference_dir):
    return reference_dir / "tiny-smollm3-Q8_0.gguf"


@pytest.fixture(scope="module")
def prompt_logits(model_path) -> np.ndarray:
    """The last position's logits for PROMPT, evaluated without interruption."""
    return fresh(model_path).eval(PROMPT)


def fresh(path, n_ctx=1024) -> Engine:
    return llm_smolq.load(path, n_ctx=n_ctx, threads=1)


def answer(engine: Engine, prompt: list[int], n: int = 12) -> list[int]:
    done = Completion()
    for _ in generate(engine, prompt, GREEDY, n, completion=done):
        pass
    return done.output_ids


class KernelSpy:
    """Stands in for the engine's `lib`: counts sq_forward calls, keeps `inside` set while
    one runs, and can raise KeyboardInterrupt just before or just after call number `at`."""

    def __init__(self, at: int | None = None, when: str = "after"):
        self.real, self.at, self.when = engine_module.lib, at, when
        self.calls = 0
        self.inside = threading.Event()

    def __getattr__(self, name):
        return getattr(self.real, name)

    def sq_forward(self, *args):
        call, self.calls = self.calls, self.calls + 1
        if call == self.at and self.when == "before":
            raise KeyboardInterrupt
        self.inside.set()
        try:
            rc = self.real.sq_forward(*args)
        finally:
            self.inside.clear()
        if call == self.at and self.when == "after":
            raise KeyboardInterrupt
        return rc


# -- threads ---------------------------------------------------------------------------


def test_two_threads_with_their_own_engines_answer_as_when_alone(model_path):
    """One ModelFile (one mapping of the weights), one Engine per thread: the kernel keeps
    no state between engines, so each thread's greedy answer is the one it gets alone."""
    prompts = [PROMPT[:300], PROMPT[300:340]]  # two batches and one
    alone = [answer(fresh(model_path), p, 16) for p in prompts]
    model = open_model(model_path)
    engines = [Engine(model, n_ctx=1024, threads=1) for _ in prompts]
    start = threading.Barrier(len(prompts))
    got: list[list[list[int]]] = [[] for _ in prompts]

    def run(i):
        for _ in range(3):
            start.wait()
            engines[i].reset()
            got[i].append(answer(engines[i], prompts[i], 16))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [[a] * 3 for a in alone]
    assert alone[0] != alone[1]


def test_every_share_of_a_pool_job_runs_once_whichever_thread_takes_it():
    """A pool job's shares go to whichever thread claims each first (native/pool.c): with
    more threads than cores the workers are often not yet scheduled and the caller takes
    their shares. Over many jobs every share must still run, and the caller return only
    when all have; and sq_read_all reads in runs (sq_pool_runs, as the products do),
    which a thread done with its own takes the ends of: every line must be read once, by
    whichever thread. sq_read_all's checksum (a sum of what each share read) is the whole
    buffer's every time."""
    from llm_smolq._kernel import ffi, lib

    data = np.random.default_rng(1).integers(0, 256, 64 * 4096, dtype=np.uint8)
    expected = int(data.view(np.uint64).sum(dtype=np.uint64))
    for threads in (2, 5, 8):
        pool = ffi.gc(lib.sq_pool_new(threads), lib.sq_pool_free)
        sums = {lib.sq_read_all(pool, ffi.from_buffer(data), data.size) for _ in range(400)}
        assert sums == {expected}, (threads, sums)


def test_concurrent_evals_on_one_engine_are_atomic(model_path):
    """Two threads append to one KV cache: each eval (even one of several batches) lands
    in one piece, and its logits are exactly those of a replay in the order they landed."""
    shared = fresh(model_path)
    rng = np.random.default_rng(7)
    # Disjoint token ranges tell whose chunk sits where; one chunk spans two batches.
    plans = [[rng.integers(lo, lo + 500, n).tolist() for n in sizes]
             for lo, sizes in ((0, [3, 1, 5, 2, 1, 4, 1, 2]), (500, [1, 2, MAX_BATCH + 20, 1, 3, 1, 1]))]
    results: list[list[np.ndarray]] = [[], []]
    start = threading.Barrier(2)

    def run(i):
        start.wait()
        for chunk in plans[i]:
            results[i].append(shared.eval(chunk))

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    tokens, order, pos, nxt = shared.tokens, [], 0, [0, 0]
    assert shared.n_past == len(tokens) == sum(map(len, plans[0] + plans[1]))
    while pos < len(tokens):
        i = 0 if tokens[pos] < 500 else 1
        chunk = plans[i][nxt[i]]
        assert tokens[pos:pos + len(chunk)] == chunk, f"an eval was split at position {pos}"
        order.append((i, nxt[i]))
        pos, nxt[i] = pos + len(chunk), nxt[i] + 1
    replay = fresh(model_path)
    for i, j in order:
        np.testing.assert_array_equal(replay.eval(plans[i][j]), results[i][j])


def test_the_gil_is_released_while_the_kernel_runs(model_path, monkeypatch):
    """Another Python thread keeps running during a long eval. The switch interval is
    raised so the main thread never hands the GIL over on its own: the counter can only
    run inside sq_forward if the call releases the GIL."""
    eng = fresh(model_path)
    spy = KernelSpy()
    monkeypatch.setattr(engine_module, "lib", spy)
    stop, ready = threading.Event(), threading.Event()
    counted = 0

    def count():
        nonlocal counted
        ready.set()
        while not stop.is_set():
            if spy.inside.is_set():
                counted += 1
            stop.wait(0.0005)  # blocks without the GIL, so the main thread gets it back

    counter = threading.Thread(target=count)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        counter.start()
        ready.wait()
        eng.eval(PROMPT)
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        counter.join()
    assert spy.calls == 3
    assert counted > 0, "no other thread ran while the kernel ran: the GIL was held"


# -- Ctrl-C ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "at, when, kept",
    [(0, "before", 0), (1, "before", MAX_BATCH), (1, "after", MAX_BATCH), (2, "after", 2 * MAX_BATCH)],
    ids=["before-the-first-batch", "between-batches", "after-a-call-before-counting", "after-the-last-call"],
)
def test_ctrl_c_during_prefill_keeps_the_finished_batches(model_path, prompt_logits, monkeypatch, at, when, kept):
    eng = fresh(model_path)
    monkeypatch.setattr(engine_module, "lib", KernelSpy(at, when))
    with pytest.raises(KeyboardInterrupt):
        eng.eval(PROMPT)
    assert eng.n_past == kept and eng.tokens == PROMPT[:kept]
    monkeypatch.undo()
    # Carrying on from what was kept gives the uninterrupted numbers, bit for bit.
    np.testing.assert_array_equal(eng.eval(PROMPT[kept:]), prompt_logits)


def test_ctrl_c_during_decode_leaves_a_usable_engine(model_path, monkeypatch):
    prompt = PROMPT[:40]
    expected = answer(fresh(model_path), prompt)
    eng = fresh(model_path)
    spy = KernelSpy(at=5, when="after")  # the prefill, then four decode steps, then this one
    monkeypatch.setattr(engine_module, "lib", spy)
    done = Completion()
    with pytest.raises(KeyboardInterrupt):
        for _ in generate(eng, prompt, GREEDY, 12, completion=done):
            pass
    assert done.output_ids == expected[:5]
    # The fifth token was being evaluated: its keys were written but are not counted.
    assert eng.n_past == 44 and eng.tokens == prompt + expected[:4]
    monkeypatch.undo()
    assert answer(eng, prompt) == expected
    assert eng.tokens == prompt + expected[:-1]


def test_real_sigint_during_a_long_eval(model_path, prompt_logits, monkeypatch):
    """SIGINT sent while the first batch runs: Python raises KeyboardInterrupt once the
    call returns, so the cache holds a whole number of batches, and carrying on from there
    gives the uninterrupted logits."""
    eng = fresh(model_path)
    sent = threading.Event()

    class Spy(KernelSpy):
        def sq_forward(self, *args):
            if self.calls == 1:  # a sender slowed down by a busy machine: wait for its signal
                sent.wait(timeout=60)
            return super().sq_forward(*args)

    spy = Spy()
    monkeypatch.setattr(engine_module, "lib", spy)

    def interrupt():
        if spy.inside.wait(timeout=60):
            os.kill(os.getpid(), signal.SIGINT)
        sent.set()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=interrupt)
    try:
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            eng.eval(PROMPT)
    finally:
        sender.join()
        signal.signal(signal.SIGINT, previous)
    assert spy.calls <= 2  # the interrupt stopped the eval before its last batch
    assert eng.n_past in (0, MAX_BATCH) and eng.tokens == PROMPT[:eng.n_past]
    monkeypatch.undo()
    np.testing.assert_array_equal(eng.eval(PROMPT[eng.n_past:]), prompt_logits)


def test_smolq_threads_sets_the_default_thread_count(model_path, monkeypatch):
    monkeypatch.setenv("SMOLQ_THREADS", "3")
    assert fresh_default(model_path).threads == 3
    assert llm_smolq.load(model_path, n_ctx=64, threads=1).threads == 1  # a count given wins
    monkeypatch.delenv("SMOLQ_THREADS")
    assert fresh_default(model_path).threads == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "two", "-1", "257", "1.5", "٣"])
def test_a_smolq_threads_that_is_not_a_count_is_refused_with_the_fix(model_path, monkeypatch, value):
    monkeypatch.setenv("SMOLQ_THREADS", value)
    with pytest.raises(ValueError, match=f"SMOLQ_THREADS='{value}' is not a thread count: set it to a whole number "
                                         "from 1 to 256, or unset it"):
        fresh_default(model_path)


def fresh_default(path) -> Engine:
    return llm_smolq.load(path, n_ctx=64)
