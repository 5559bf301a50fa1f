"""The KV cache types (f16, the default; f32; q8_0) through the engine and kernel.attention:
the compact caches' single-pass attention against a float64 reference, the same bits
whatever the batch, thread count or SIMD path, and the gate's refusals."""

import numpy as np
import pytest
from helpers.simd_paths import simd_paths

import llm_smolq
from llm_smolq import LayoutError, Q8_0_BLOCK
from llm_smolq._kernel import ffi, lib
from llm_smolq.kernel import attention
from llm_smolq.engine.kv_types import DEFAULT_KV_TYPE, KV_TYPES

KV = ["f16", "f32", "q8_0"]


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of x's last axis, as llama.cpp makes them: d = max|x| / 127 (as a
    half), codes round(x / d) with d taken before its rounding."""
    blocks = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = amax / 127
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    out = np.empty(blocks.shape[:-1], Q8_0_BLOCK)
    out["d"] = d[..., 0].astype(np.float16)
    out["qs"] = np.rint(blocks * inv).astype(np.int8)
    return out


def dequantize_q8_0(b: np.ndarray) -> np.ndarray:
    values = b["d"].astype(np.float64)[..., None] * b["qs"].astype(np.float64)
    return values.reshape(*b.shape[:-1], -1)


def reference_attention(q, k, v, n_past):
    """GQA decode attention in float64 on the cache's values."""
    q = q.astype(np.float64)
    n_heads, head_dim = q.shape
    group = n_heads // k.shape[0]
    out = np.empty((n_heads, head_dim))
    for h in range(n_heads):
        scores = k[h // group, :n_past] @ q[h] / np.sqrt(head_dim)
        p = np.exp(scores - scores.max())
        out[h] = (p / p.sum()) @ v[h // group, :n_past]
    return out


@pytest.mark.parametrize("n_past", [1, 31, 32, 33, 255, 256, 257, 700, 1024])
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_compact_attention_matches_float64_across_block_and_chunk_edges(kind, n_past):
    """Key blocks are 32 keys, chunks 256: lengths on and off both edges."""
    rng = np.random.default_rng(n_past)
    q = rng.standard_normal((8, 64), dtype=np.float32) * 2
    k, v = (rng.standard_normal((2, 1024, 64), dtype=np.float32) for _ in range(2))
    if kind == "f16":
        kc, vc = k.astype(np.float16), v.astype(np.float16)
        kr, vr = kc.astype(np.float64), vc.astype(np.float64)
    else:
        kc, vc = quantize_q8_0(k), quantize_q8_0(v)
        kr, vr = dequantize_q8_0(kc), dequantize_q8_0(vc)
    assert kc.shape == (2, 1024, 64 if kind == "f16" else 2)
    out = attention(q, kc, vc, n_past)
    np.testing.assert_allclose(out, reference_attention(q, kr, vr, n_past), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_each_query_group_size_gives_the_plain_codes_bits(kind, group):
    """The SIMD kernels take a KV head's query rows four at a time and the rest as a
    group of one to three: every group size, against the plain code, bit for bit."""
    rng = np.random.default_rng(group)
    n_kv, n_past = 2, 300
    q = rng.standard_normal((n_kv * group, 64), dtype=np.float32) * 2
    k, v = (rng.standard_normal((n_kv, n_past, 64), dtype=np.float32) for _ in range(2))
    kc, vc = (k.astype(np.float16), v.astype(np.float16)) if kind == "f16" else (quantize_q8_0(k), quantize_q8_0(v))
    simd = attention(q, kc, vc, n_past)
    was = lib.sq_set_simd(0)
    try:
        plain = attention(q, kc, vc, n_past)
    finally:
        lib.sq_set_simd(was)
    assert np.array_equal(simd.view(np.uint32), plain.view(np.uint32))


def test_q8_0_attention_takes_the_engines_cache_rows(reference_dir):
    """kernel.attention reads a q8_0 engine's own cache as the forward pass wrote it."""
    eng = llm_smolq.load(reference_dir / "tiny-smollm3-Q8_0.gguf", n_ctx=64, threads=1, kv_dtype="q8_0")
    eng.eval(list(range(3, 43)))
    k, v = eng.k_cache[1], eng.v_cache[1]
    q = np.random.default_rng(0).standard_normal((eng.config.n_heads, eng.config.head_dim), dtype=np.float32)
    np.testing.assert_allclose(attention(q, k, v, 40), reference_attention(q, dequantize_q8_0(k), dequantize_q8_0(v), 40),
                               rtol=2e-5, atol=2e-5)


@pytest.fixture(scope="module")
def q8_model(reference_dir):
    return reference_dir / "tiny-smollm3-Q8_0.gguf"  # Q8_0 weights: mat-muls of any batch give the same bits


def ids(n, seed=0):
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_a_tokens_logits_do_not_depend_on_its_batch(q8_model, kv_dtype):
    """Prompt in one batch, in pieces, or one token at a time: the same bits."""
    eng = llm_smolq.load(q8_model, n_ctx=1024, kv_dtype=kv_dtype)
    prompt = ids(600)
    whole = eng.eval(prompt, all_logits=True)
    eng.reset()
    pieces = [eng.eval(prompt[a:b], all_logits=True) for a, b in ((0, 1), (1, 257), (257, 300), (300, 560))]
    steps = [eng.eval([t], all_logits=True) for t in prompt[560:]]
    assert np.array_equal(np.concatenate(pieces + steps).view(np.uint32), whole.view(np.uint32))


@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_thread_counts_and_the_plain_code_give_the_same_bits(reference_dir, kv_dtype):
    path = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    prompt, follow = ids(520), ids(6, seed=1)

    def run(threads):
        eng = llm_smolq.load(path, n_ctx=1024, threads=threads, kv_dtype=kv_dtype)
        rows = eng.eval(prompt, all_logits=True)
        return np.concatenate([rows, np.stack([eng.eval([t]) for t in follow])]).view(np.uint32)

    base = run(1)
    for threads in (2, 3, 4):
        assert np.array_equal(run(threads), base), threads
    was = lib.sq_set_simd(0)
    try:
        assert np.array_equal(run(2), base), "plain C"
    finally:
        lib.sq_set_simd(was)


def test_the_default_cache_is_f16_and_each_type_has_its_shape(q8_model):
    assert DEFAULT_KV_TYPE == "f16"
    assert llm_smolq.load(q8_model, n_ctx=32).k_cache.dtype == np.float16
    for name in KV:
        eng = llm_smolq.load(q8_model, n_ctx=32, kv_dtype=name)
        row = 64 // KV_TYPES[name].per_item
        assert eng.k_cache.shape == eng.v_cache.shape == (4, 2, 32, row) and eng.kv_dtype == name
        assert eng.k_cache.dtype == KV_TYPES[name].dtype


def test_an_unknown_cache_type_is_refused_with_the_choices(q8_model):
    with pytest.raises(ValueError, match="kv_dtype must be one of 'f16', 'f32', 'q8_0', got 'q4_0'"):
        llm_smolq.load(q8_model, n_ctx=32, kv_dtype="q4_0")


@pytest.mark.parametrize("kv_dtype", KV)
def test_truncate_and_reset_recompute_the_same_logits(q8_model, kv_dtype):
    eng = llm_smolq.load(q8_model, n_ctx=128, kv_dtype=kv_dtype)
    prompt = ids(90)
    first = eng.eval(prompt, all_logits=True)
    eng.truncate(50)
    assert eng.n_past == 50 and eng.tokens == prompt[:50]
    assert np.array_equal(eng.eval(prompt[50:], all_logits=True), first[50:])
    eng.reset()
    assert np.array_equal(eng.eval(prompt, all_logits=True), first)


@pytest.mark.parametrize("kv_dtype", KV)
def test_a_full_context_refuses_one_more_token_and_keeps_its_cache(q8_model, kv_dtype):
    eng = llm_smolq.load(q8_model, n_ctx=64, kv_dtype=kv_dtype)
    eng.eval(ids(64))
    before = eng.tokens, eng.k_cache.tobytes(), eng.v_cache.tobytes()
    with pytest.raises(ValueError, match="1 more tokens do not fit: 64 of the context's 64 positions are used"):
        eng.eval([5])
    assert (eng.tokens, eng.k_cache.tobytes(), eng.v_cache.tobytes()) == before


# -- the gate for Q8_0 caches -------------------------------------------------------------

def q8_caches(n_kv_heads=2, n_ctx=16, head_dim=64):
    x = np.random.default_rng(0).standard_normal((n_kv_heads, n_ctx, head_dim), dtype=np.float32)
    return quantize_q8_0(x), quantize_q8_0(x[::-1].copy())


def test_q8_0_caches_of_the_wrong_row_length_are_refused():
    k, v = q8_caches(head_dim=64)
    q = np.zeros((4, 96), np.float32)
    with pytest.raises(LayoutError, match="k_cache rows hold 64 values .* but q has head_dim 96"):
        attention(q, k, v, 4)


def test_mixed_cache_types_are_refused():
    k, _ = q8_caches()
    with pytest.raises(LayoutError, match="v_cache is float16 but k_cache is Q8_0 blocks .*same dtype"):
        attention(np.zeros((4, 64), np.float32), k, np.zeros((2, 16, 2), np.float16), 4)
    with pytest.raises(LayoutError, match=r"v_cache has shape \(2, 16, 64\); expected .*row=2"):
        attention(np.zeros((4, 64), np.float32), k, np.zeros((2, 16, 64), np.float16), 4)


def test_raw_bytes_are_not_taken_for_blocks():
    k, v = q8_caches()
    raw = k.view(np.uint8)
    with pytest.raises(LayoutError, match=r"k_cache has dtype uint8; expected float32 or float16 or Q8_0 blocks"):
        attention(np.zeros((4, 64), np.float32), raw, v, 4)


def test_a_misaligned_q8_0_cache_is_refused():
    k, v = q8_caches()
    buf = np.zeros(k.nbytes + 1, np.uint8)
    odd = buf[1:].view(Q8_0_BLOCK).reshape(k.shape)
    odd[...] = k
    with pytest.raises(LayoutError, match="not a multiple of 2 bytes.*Q8_0 blocks"):
        attention(np.zeros((4, 64), np.float32), odd, v, 4)


def test_a_q8_0_cache_view_that_is_not_contiguous_is_refused():
    k, v = q8_caches(n_ctx=32)
    with pytest.raises(LayoutError, match="not C-contiguous"):
        attention(np.zeros((4, 64), np.float32), k[:, ::2], v[:, ::2], 4)


def test_a_gpu_cache_is_refused_before_its_type_is_read():
    class OnGPU:
        def __dlpack_device__(self):
            return (2, 0)

    k, v = q8_caches()
    with pytest.raises(llm_smolq.DeviceError, match="k_cache is on cuda:0"):
        attention(np.zeros((4, 64), np.float32), OnGPU(), v, 4)


# (n_heads, n_kv_heads, head_dim): query groups of 1, 2, 3, 5 and 8 rows, and head_dims whose
# padded rows take every width of the kernels' output passes (32, 64, 96, 128).
PREFILL_SHAPES = [(4, 4, 64), (6, 3, 96), (9, 3, 64), (10, 2, 32), (8, 1, 128)]


@pytest.fixture(scope="module", params=PREFILL_SHAPES, ids=lambda s: "heads{}-kv{}-dim{}".format(*s))
def shaped_model(request, tmp_path_factory):
    from llm_smolq.dev.synth import Preset, write_synthetic
    n_heads, n_kv_heads, head_dim = request.param
    path = tmp_path_factory.mktemp("shapes") / f"h{n_heads}-kv{n_kv_heads}-d{head_dim}.gguf"
    # A residual stream narrower than the heads (the file gives the head size): the
    # attention is what is tested, and the projections cost less (a sanitized run's minutes).
    write_synthetic(path, Preset("smollm3", 128, 1, n_heads, n_kv_heads, head_dim, 256, 1024, 4096, 5e6, 1e-6),
                    "Q8_0")
    return path


@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_a_prefills_attention_gives_every_simd_paths_bits(shaped_model, kv_dtype, monkeypatch):
    """A prefill of many rows per KV head (the path the 512-bit kernels take) against the
    AVX2 and plain code, bit for bit, past key blocks (32), chunks (256), partial blocks
    on the diagonal and a second batch that starts mid-block; then batches of a draft
    check's size (tasks of 2 to 16 rows, read in place or widened) and one decode step."""
    prompt, more = ids(300, seed=2), ids(37, seed=3)
    results = {}
    was_on = lib.sq_set_simd(1)
    try:
        for set_path in simd_paths(monkeypatch):
            name = set_path()
            eng = llm_smolq.load(shaped_model, n_ctx=512, threads=2, kv_dtype=kv_dtype)
            rows = [eng.eval(prompt, all_logits=True), eng.eval(more, all_logits=True),
                    *(eng.eval(ids(k, seed=k), all_logits=True) for k in (2, 3, 4, 8)), eng.eval([5], all_logits=True)]
            results[name] = np.concatenate(rows).view(np.uint32)
    finally:  # the setting the run had (SMOLQ_SIMD=0 or avx2 in some runs), for the tests after
        monkeypatch.undo()
        lib.sq_set_simd(was_on)
    assert "scalar" in results and len(results) >= 2, results.keys()
    base = results.pop("scalar")
    for name, got in results.items():
        assert np.array_equal(got, base), f"{name} differs from the plain code"
