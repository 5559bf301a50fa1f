"""Memory is checked before it is allocated: a context (or a model) too large for the
machine is refused with the bytes it needs, the bytes available and what to lower."""

import ctypes
import os
import re

import numpy as np
import pytest
from gguf import GGUFReader

import llm_smolq
from llm_smolq import GGUFError, ResourceError
from llm_smolq.engine import memory
from llm_smolq.engine.engine import MAX_BATCH
from llm_smolq.engine.kv_types import KV_TYPES

from helpers.mappings import THP_CONFIGURED, mapping_of

TINY = "tiny-smollm3-Q8_0.gguf"
F32 = 4  # bytes


def model_dims(path):
    """The model's sizes, as gguf's own reader finds them in the file."""
    fields = GGUFReader(path).fields
    arch = fields["general.architecture"].contents()
    d = {name: fields[f"{arch}.{key}"].contents() for name, key in [
        ("n_layers", "block_count"), ("n_heads", "attention.head_count"), ("n_kv_heads", "attention.head_count_kv"),
        ("dim", "embedding_length"), ("hidden_dim", "feed_forward_length")]}
    d["vocab"] = len(fields["tokenizer.ggml.tokens"].contents())
    assert f"{arch}.attention.key_length" not in fields  # so a head is dim / n_heads wide
    d["head_dim"] = d["dim"] // d["n_heads"]
    return d


# Bytes of one cached row of head_dim values: floats, halves, or Q8_0 blocks (a half scale
# and 32 byte codes per 32 values).
ROW_BYTES = {"f32": lambda hd: 4 * hd, "f16": lambda hd: 2 * hd, "q8_0": lambda hd: hd // 32 * 34}


def kv_cache_bytes(d, n_ctx, kv_dtype):
    """K and V: every layer, every KV head, n_ctx positions of one row each."""
    return 2 * d["n_layers"] * d["n_kv_heads"] * n_ctx * ROW_BYTES[kv_dtype](d["head_dim"])


def state_buffers(d, max_batch, n_ctx):
    """What sq_state_new in native/forward.c allocates, buffer by buffer (its shape comments)."""
    q, kv = d["n_heads"] * d["head_dim"], d["n_kv_heads"] * d["head_dim"]
    padded = -(-d["head_dim"] // 32) * 32  # flash_attention.c pads rows to 32 values
    return {
        "x": max_batch * d["dim"] * F32,            # [max_batch][dim]
        "xn": max_batch * d["dim"] * F32,           # [max_batch][dim]
        "q": max_batch * q * F32,                   # [max_batch][n_heads*head_dim]
        "k": max_batch * kv * F32,                  # [max_batch][n_kv_heads*head_dim]
        "v": max_batch * kv * F32,                  # [max_batch][n_kv_heads*head_dim]
        "att": max_batch * q * F32,                 # [max_batch][n_heads*head_dim]
        "gate": max_batch * d["hidden_dim"] * F32,  # [max_batch][hidden_dim]
        "up": max_batch * d["hidden_dim"] * F32,    # [max_batch][hidden_dim]
        "rope_cs": max_batch * (d["head_dim"] // 2) * 2 * F32,  # [max_batch][head_dim/2][2]
        "xq": max_batch * max(d["dim"], d["hidden_dim"], q) * 2,  # [max_batch][widest] 2-byte slots
        # per query head, per 256-key chunk: max, sum and a padded row of weighted sums
        "partials": d["n_heads"] * -(-n_ctx // 256) * (2 + padded) * F32,
    }


def thread_scratch(d):
    """One pool thread's attention scratch, allocated on the first pass (besides its row
    of n_ctx scores for the F32 path): flash_attention.c's blocks of 32 key and 32 value
    rows (padded), the 8 lanes of 4 rows' scores for 32 keys, for each row of a 16-token
    query block its 32 scores, its query, two maxima, two sums, a rescale factor and two
    sums of V rows, and up to 15 floats before each of 5 arrays that start on a 64-byte line."""
    padded = -(-d["head_dim"] // 32) * 32
    rows = 16 * (d["n_heads"] // d["n_kv_heads"])
    return (2 * 32 * padded + 4 * 32 * 8 + rows * (32 + 5 + 3 * padded) + 5 * 16) * F32


def buffer_bytes(d, n_ctx, threads, max_batch=MAX_BATCH):
    """The C state's buffers, each thread's scratch (with its n_ctx row of scores) and
    the row of logits Engine.eval returns."""
    return (sum(state_buffers(d, max_batch, n_ctx).values()) + threads * (n_ctx * F32 + thread_scratch(d))
            + d["vocab"] * F32)


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
    n_ctx = 10**9
    d = model_dims(long_context_tiny)
    kv, buffers = kv_cache_bytes(d, n_ctx, "f32"), buffer_bytes(d, n_ctx, threads=1)
    assert kv == 4096 * n_ctx  # the 4 KiB per position above
    with pytest.raises(ResourceError) as err:
        llm_smolq.load(long_context_tiny, n_ctx=n_ctx, threads=1, kv_dtype="f32")
    message = str(err.value)
    assert f"n_ctx={n_ctx} needs {kv + buffers:,} bytes" in message, message
    assert f"{kv:,} for the f32 KV cache of {d['n_layers']} layers and {buffers:,} for buffers" in message, message
    assert "are available (" in message and "Lower n_ctx to" in message
    assert "kv_dtype=" not in message  # no smaller cache type holds 10**9 positions either


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "q8_0"])
def test_the_n_ctx_the_message_suggests_is_the_largest_that_fits(reference_dir, monkeypatch, kv_dtype):
    path = reference_dir / TINY
    d = model_dims(path)
    free = kv_cache_bytes(d, 1000, kv_dtype) + buffer_bytes(d, 1000, threads=1) + 123
    monkeypatch.setattr(memory, "available_memory", lambda: (free, "a test figure"))
    with pytest.raises(ResourceError, match="a test figure") as err:
        llm_smolq.load(path, n_ctx=4096, threads=1, kv_dtype=kv_dtype)
    fits = int(re.search(r"Lower n_ctx to (\d+)", str(err.value)).group(1))
    assert fits == 1000  # 123 bytes are less than one more position
    assert llm_smolq.load(path, n_ctx=fits, threads=1, kv_dtype=kv_dtype).n_ctx == fits
    with pytest.raises(ResourceError):
        llm_smolq.load(path, n_ctx=fits + 1, threads=1, kv_dtype=kv_dtype)


def test_the_message_names_the_smaller_cache_types_that_fit(reference_dir, monkeypatch):
    """Room for 2,000 positions of Q8_0 blocks, not of halves: the message says so, and
    the Q8_0 engine loads."""
    path = reference_dir / TINY
    d = model_dims(path)
    free = kv_cache_bytes(d, 2000, "q8_0") + buffer_bytes(d, 2000, threads=1)
    assert kv_cache_bytes(d, 2000, "f16") + buffer_bytes(d, 2000, threads=1) > free
    monkeypatch.setattr(memory, "available_memory", lambda: (free, "a test figure"))
    with pytest.raises(ResourceError) as err:
        llm_smolq.load(path, n_ctx=2000, threads=1)  # the default cache type, f16
    message = str(err.value)
    assert "for the f16 KV cache" in message and "use kv_dtype='q8_0' (llm: -o kv_cache q8_0)" in message, message
    assert "kv_dtype='f32'" not in message  # larger, so no way out
    assert llm_smolq.load(path, n_ctx=2000, threads=1, kv_dtype="q8_0").n_ctx == 2000


def test_without_n_ctx_the_engine_takes_the_whole_window_or_what_memory_holds(reference_dir, monkeypatch):
    path = reference_dir / TINY
    d = model_dims(path)
    window = GGUFReader(path).fields["smollm3.context_length"].contents()
    assert llm_smolq.load(path, threads=1).n_ctx == window
    free = kv_cache_bytes(d, 1000, "f16") + buffer_bytes(d, 1000, threads=1)
    monkeypatch.setattr(memory, "available_memory", lambda: (free, "a test figure"))
    assert window > 1000
    assert llm_smolq.load(path, threads=1).n_ctx == 768  # whole chunks of 256 positions


def test_a_model_too_large_without_any_context_is_a_gguf_error(reference_dir, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: (1 << 20, "a test figure"))
    with pytest.raises(GGUFError, match=r"before any context, but 1,048,576 bytes .* are available"):
        llm_smolq.load(reference_dir / TINY, n_ctx=16, threads=1)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "q8_0"])
def test_the_kv_cache_figure_is_what_the_engine_allocates(reference_dir, kv_dtype):
    d = model_dims(reference_dir / TINY)
    eng = llm_smolq.load(reference_dir / TINY, n_ctx=48, threads=1, kv_dtype=kv_dtype)
    row = d["head_dim"] // 32 if kv_dtype == "q8_0" else d["head_dim"]
    for cache in (eng.k_cache, eng.v_cache):
        assert cache.shape == (d["n_layers"], d["n_kv_heads"], 48, row)
        assert cache.dtype.itemsize * row == ROW_BYTES[kv_dtype](d["head_dim"])
    expected = kv_cache_bytes(d, 48, kv_dtype)
    assert eng.k_cache.nbytes + eng.v_cache.nbytes == expected
    planned = memory.engine_memory(eng.config, 48, KV_TYPES[kv_dtype], MAX_BATCH, 1)
    assert (planned.kv_cache, planned.buffers) == (expected, buffer_bytes(d, 48, threads=1))


def _heap_in_use():
    """Bytes glibc's malloc has handed out and not taken back (arena and mapped blocks)."""
    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = Mallinfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def _has_mallinfo2():
    try:
        return hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="measures the heap with glibc's mallinfo2")
def test_the_c_state_allocates_the_buffers_counted(reference_dir):
    """sq_state_new's allocations, measured on the heap, are the buffers state_buffers
    counts (within malloc's headers and page rounding: under a page per allocation)."""
    from llm_smolq._kernel import ffi, lib

    d = model_dims(reference_dir / TINY)
    cfg = ffi.new("sq_config *", {"dim": d["dim"], "hidden_dim": d["hidden_dim"], "n_layers": d["n_layers"],
                                  "n_heads": d["n_heads"], "n_kv_heads": d["n_kv_heads"], "head_dim": d["head_dim"],
                                  "vocab_size": d["vocab"], "n_ctx": 16384, "rope_theta": 1e4, "rms_eps": 1e-6})
    buffers = state_buffers(d, MAX_BATCH, 16384)
    assert min(buffers.values()) > 4096 * (len(buffers) + 1)  # a missing buffer would show
    grown = []
    for _ in range(3):
        before = _heap_in_use()
        state = lib.sq_state_new(cfg, MAX_BATCH)
        grown.append(_heap_in_use() - before)
        assert state != ffi.NULL
        lib.sq_state_free(state)
    assert sum(buffers.values()) <= min(grown) <= sum(buffers.values()) + 4096 * (len(buffers) + 1), grown


def test_available_memory_is_a_real_figure():
    free, source = memory.available_memory()
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < free <= physical, (free, source)


def anonymous_rss_mb() -> float:
    """Resident memory that no file backs: the process's own (RssAnon) and any shared
    anonymous mapping's (RssShmem), where Linux counts what Python maps with fileno -1
    unless it asks for a private mapping."""
    with open("/proc/self/status") as f:
        kb = sum(int(line.split()[1]) for line in f if line.startswith(("RssAnon:", "RssShmem:")))
    return kb / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_a_large_context_costs_memory_only_for_the_positions_used(smollm2_gguf):
    """SmolLM2's F32 K and V caches for 4096 positions take 180 MiB; 30 tokens use 1.3 MiB
    of it. The cache is laid out head by head, so memory handed out in huge pages would
    make the whole of it resident at the first token."""
    engine = llm_smolq.load(smollm2_gguf, n_ctx=4096, threads=1, kv_dtype="f32")
    full = 2 * engine.k_cache.nbytes / 2**20
    assert full >= 180
    before = anonymous_rss_mb()
    engine.eval(list(range(1, 31)))
    assert anonymous_rss_mb() - before < full / 4
    # in small pages even where the system hands out huge ones unasked (THP "always")
    for cache in (engine.k_cache, engine.v_cache):
        perms, flags = mapping_of(cache)
        assert perms == "rw-p" and ("nh" in flags or not THP_CONFIGURED), (perms, flags)
