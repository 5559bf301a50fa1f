"""Memory is checked before it is allocated: a context (or a model) too large for the
machine is refused with the bytes it needs, the bytes available and what to lower."""

import os
import re

import numpy as np
import pytest
from gguf import GGUFReader

import llm_smolq
from llm_smolq import GGUFError, ResourceError, memory
from llm_smolq.model_file import open_model

TINY = "tiny-smollm3-Q8_0.gguf"


@pytest.fixture
def long_context_tiny(reference_dir, tmp_path):
    """The tiny model claiming a context of 2**31 - 1 positions."""
    source = reference_dir / TINY
    reader = GGUFReader(source)
    part = reader.fields["smollm3.context_length"].parts[-1]
    offset = part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]
    data = bytearray(source.read_bytes())
    data[offset:offset + 4] = np.uint32(2**31 - 1).tobytes()
    path = tmp_path / "long.gguf"
    path.write_bytes(bytes(data))
    return path


def test_a_context_larger_than_memory_is_refused_before_numpy_allocates(long_context_tiny):
    # 4 layers x 2 KV heads x 64 x 4 bytes x 2 (K and V) = 4 KiB per position: 4 TB here.
    # Had numpy tried first, this would be numpy's MemoryError, not ResourceError.
    with pytest.raises(ResourceError) as err:
        llm_smolq.load(long_context_tiny, n_ctx=10**9, threads=1)
    message = str(err.value)
    assert "n_ctx=1000000000 needs 4,100,002,691,072 bytes" in message, message
    assert "4,096,000,000,000 for the f32 KV cache" in message
    assert "are available (" in message and "Lower n_ctx to" in message and "kv_dtype='f16'" in message


def test_the_n_ctx_the_message_suggests_is_the_largest_that_fits(reference_dir, monkeypatch):
    path = reference_dir / TINY
    cfg = open_model(path).config
    free = memory.engine_memory(cfg, 1000, 4, 256, 1).total + 123
    monkeypatch.setattr(memory, "available_memory", lambda: (free, "a test figure"))
    with pytest.raises(ResourceError, match="a test figure") as err:
        llm_smolq.load(path, n_ctx=4096, threads=1)
    fits = int(re.search(r"Lower n_ctx to (\d+)", str(err.value)).group(1))
    assert fits == 1000  # 123 bytes are less than one more position
    assert llm_smolq.load(path, n_ctx=fits, threads=1).n_ctx == fits
    with pytest.raises(ResourceError):
        llm_smolq.load(path, n_ctx=fits + 1, threads=1)


def test_a_model_too_large_without_any_context_is_a_gguf_error(reference_dir, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: (1 << 20, "a test figure"))
    with pytest.raises(GGUFError, match=r"before any context, but 1,048,576 bytes .* are available"):
        llm_smolq.load(reference_dir / TINY, n_ctx=16, threads=1)


def test_the_kv_cache_figure_is_what_the_engine_allocates(reference_dir):
    for kv_dtype, itemsize in (("f32", 4), ("f16", 2)):
        eng = llm_smolq.load(reference_dir / TINY, n_ctx=48, threads=1, kv_dtype=kv_dtype)
        planned = memory.engine_memory(eng.config, 48, itemsize, 256, 1).kv_cache
        assert planned == eng.k_cache.nbytes + eng.v_cache.nbytes


def test_available_memory_is_a_real_figure():
    free, source = memory.available_memory()
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < free <= physical, (free, source)


def anonymous_rss_mb() -> float:
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
    return kb / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_a_large_context_costs_memory_only_for_the_positions_used(smollm2_gguf):
    """SmolLM2's K and V caches for 4096 positions take 180 MiB; 30 tokens use 1.3 MiB of it.
    The cache is laid out head by head, so memory handed out in huge pages would make
    the whole of it resident at the first token."""
    engine = llm_smolq.load(smollm2_gguf, n_ctx=4096, threads=1)
    full = 2 * engine.k_cache.nbytes / 2**20
    assert full >= 180
    before = anonymous_rss_mb()
    engine.eval(list(range(1, 31)))
    assert anonymous_rss_mb() - before < full / 4
