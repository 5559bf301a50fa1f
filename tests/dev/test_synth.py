"""The synthetic model writer: files load and run, types follow llama.cpp's rules, bytes are valid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import LlamaFileType
from gguf.quants import dequantize

import llm_smolq
from llm_smolq.dev import synth
from llm_smolq.model.gguf_file import read_header, type_name
from llm_smolq.model.model_file import open_model
from llm_smolq.dev.synth import PRESETS, TYPES, Preset, main, make_vocab, plan_tensors, write_synthetic

PLAIN = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS")
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# SmolLM2-135M's widths on two layers: rows of 576 (not a multiple of 256) and of 1536.
WIDE576 = Preset("llama", 576, 2, 9, 3, 64, 1536, 512, 2048, 1e5, 1e-5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """One tiny-preset file per type, seed 1."""
    d = tmp_path_factory.mktemp("synth")
    files = {}
    for t in TYPES:
        files[t] = d / f"tiny-{t}.gguf"
        write_synthetic(files[t], "tiny", t, seed=1)
    return files


def header_types(path: Path) -> dict[str, str]:
    return {t.name: type_name(t.type_id) for t in read_header(path).tensors}


def use_more_bits(i: int, n: int) -> bool:  # llama.cpp's, written out again for the check
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def test_all_requested_types_are_offered():
    assert set(PLAIN) | {"Q4_K_M", "Q5_K_M", "Q3_K_M"} <= set(TYPES)


# -- the files load and run ---------------------------------------------------------------

@pytest.mark.parametrize("type_", TYPES)
def test_tiny_file_loads_and_gives_finite_logits(tiny, type_):
    eng = llm_smolq.load(tiny[type_], n_ctx=64)
    assert eng.config.vocab_size == 1024 and eng.config.n_layers == 4 and eng.config.nope_layers == (3,)
    logits = eng.eval([1, 2, 3], all_logits=True)
    assert logits.shape == (3, 1024)
    assert np.isfinite(logits).all()
    assert 0.01 < logits.std() < 10  # random but not degenerate


@pytest.mark.parametrize("type_", TYPES)
def test_dequantized_weights_are_finite_and_small(tiny, type_):
    m = open_model(tiny[type_])
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.2.attn_v.weight", "blk.3.ffn_down.weight",
                 "blk.1.ffn_norm.weight"):
        t = m.tensors[name]
        raw = np.asarray(m.data[t.offset:t.offset + t.n_bytes]).reshape(t.rows, t.row_bytes)
        w = dequantize(raw, t.type)
        assert w.shape == (t.rows, t.shape[0])
        assert np.isfinite(w).all(), name
        if name.endswith("norm.weight"):
            assert np.abs(w - 1).max() < 0.1
        else:
            assert np.abs(w).max() <= 0.081, (name, t.type.name)
            assert 0.005 < w.std() < 0.03, (name, t.type.name)
            assert abs(w.mean()) < 0.005, (name, t.type.name)


def test_scale_fields_are_finite_normal_halves_or_small_subnormals(tiny):
    # Q4_K: d at byte 0, dmin at byte 2 of every 144-byte block; both finite and positive.
    m = open_model(tiny["Q4_K"])
    t = m.tensors["blk.0.ffn_up.weight"]
    blocks = np.asarray(m.data[t.offset:t.offset + t.n_bytes]).reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).ravel()
    dmin = blocks[:, 2:4].copy().view(np.float16).ravel()
    assert np.isfinite(d).all() and np.isfinite(dmin).all()
    assert (d > 0).all() and (dmin > 0).all()
    assert d.max() <= 0.05 / 945 * 1.01


def test_file_size_and_type_count(tiny):
    plan = plan_tensors("tiny", "Q4_K_M")
    assert len(plan) == 2 + 9 * 4
    assert tiny["Q4_K_M"].stat().st_size > sum(t.n_bytes for t in plan)


# -- metadata: what llama.cpp and this engine read ----------------------------------------

def test_metadata_for_llama_cpp(tiny):
    meta = read_header(tiny["Q4_K_M"]).metadata
    p = PRESETS["tiny"]
    expected = {
        "general.architecture": "smollm3",
        "general.file_type": int(LlamaFileType.MOSTLY_Q4_K_M),
        "general.quantization_version": 2,
        "smollm3.block_count": p.n_layers,
        "smollm3.context_length": p.context,
        "smollm3.embedding_length": p.dim,
        "smollm3.feed_forward_length": p.ffn,
        "smollm3.attention.head_count": p.n_heads,
        "smollm3.attention.head_count_kv": p.n_kv_heads,
        "smollm3.vocab_size": p.vocab,
        "smollm3.rope.dimension_count": p.head_dim,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    for key, value in expected.items():
        assert meta[key] == value, key
    assert meta["smollm3.rope.freq_base"] == pytest.approx(5e6)
    assert meta["smollm3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert meta["general.name"]
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == p.vocab
    assert tokens[1] == "<|im_start|>" and tokens[2] == "<|im_end|>" and types[1] == types[2] == 3
    assert meta["tokenizer.ggml.merges"]
    assert "output.weight" not in header_types(tiny["Q4_K_M"])  # tied embeddings


@pytest.mark.parametrize("type_", ["F32", "Q3_K", "Q4_K", "Q5_K", "Q3_K_M", "Q5_K_M", "IQ4_XS", "BF16"])
def test_file_type_is_llama_cpps_number(tiny, type_):
    ftype = {"F32": LlamaFileType.ALL_F32, "Q3_K": LlamaFileType.MOSTLY_Q3_K_S, "Q4_K": LlamaFileType.MOSTLY_Q4_K_S,
             "Q5_K": LlamaFileType.MOSTLY_Q5_K_S, "Q3_K_M": LlamaFileType.MOSTLY_Q3_K_M,
             "Q5_K_M": LlamaFileType.MOSTLY_Q5_K_M, "IQ4_XS": LlamaFileType.MOSTLY_IQ4_XS,
             "BF16": LlamaFileType.MOSTLY_BF16}[type_]
    assert read_header(tiny[type_]).metadata["general.file_type"] == int(ftype)


@pytest.mark.parametrize("vocab_size", [1024, 49152, 128256])
def test_vocab_is_valid_byte_level_bpe(vocab_size):
    tokens, types, merges = make_vocab(vocab_size)
    assert len(tokens) == len(types) == vocab_size
    assert len(set(tokens)) == vocab_size
    byte_tokens = tokens[3:259]
    assert len(set(byte_tokens)) == 256 and all(len(t) == 1 for t in byte_tokens)
    assert "Ġ" in byte_tokens and "Ċ" in byte_tokens and "!" in byte_tokens  # space, newline, printable
    vocab = set(tokens)
    for merge in merges:
        left, right = merge.split(" ")
        assert left in vocab and right in vocab and left + right in vocab
    assert types[:3] == [3, 3, 3] and set(types[3:]) == {1}


def test_engine_tokenizer_round_trips(tiny):
    tok = llm_smolq.load(tiny["Q8_0"], n_ctx=16).tokenizer
    text = "Hello world, abc 123\n<|im_start|>user é€😀"
    ids = tok.encode(text, special=True)
    assert 1 in ids and tok.decode(ids) == text


# -- tensor types: llama.cpp's mixes ------------------------------------------------------

def test_q4_k_m_layout_on_tiny(tiny):
    types = header_types(tiny["Q4_K_M"])
    assert types["token_embd.weight"] == "Q6_K"
    for i in range(4):
        for m in MATRICES:
            want = "Q6_K" if m in ("attn_v", "ffn_down") and use_more_bits(i, 4) else "Q4_K"
            assert types[f"blk.{i}.{m}.weight"] == want, (i, m)
        assert types[f"blk.{i}.attn_norm.weight"] == types[f"blk.{i}.ffn_norm.weight"] == "F32"
    assert types["output_norm.weight"] == "F32"
    assert [i for i in range(4) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == [2, 3]


def test_q4_k_m_and_q5_k_m_layout_on_3b_shapes():
    n = 36
    more = {i for i in range(n) if i < 4 or i >= 31 or (i - 4) % 3 == 2}
    assert {i for i in range(n) if use_more_bits(i, n)} == more
    for mix, base in (("Q4_K_M", QT.Q4_K), ("Q5_K_M", QT.Q5_K)):
        plan = {t.name: t.type for t in plan_tensors("smollm3-3b", mix)}
        assert plan["token_embd.weight"] == QT.Q6_K
        for i in range(n):
            for m in MATRICES:
                want = QT.Q6_K if m in ("attn_v", "ffn_down") and i in more else base
                assert plan[f"blk.{i}.{m}.weight"] == want, (mix, i, m)


def test_q3_k_m_layout_on_3b_shapes():
    plan = {t.name: t.type for t in plan_tensors("smollm3-3b", "Q3_K_M")}
    assert plan["token_embd.weight"] == QT.Q6_K
    for i in range(36):
        assert plan[f"blk.{i}.attn_v.weight"] == (QT.Q5_K if i < 2 else QT.Q4_K)
        assert plan[f"blk.{i}.ffn_down.weight"] == (QT.Q5_K if i < 36 // 16 else QT.Q4_K)
        assert plan[f"blk.{i}.attn_output.weight"] == QT.Q4_K
        for m in ("attn_q", "attn_k", "ffn_gate", "ffn_up"):
            assert plan[f"blk.{i}.{m}.weight"] == QT.Q3_K


@pytest.mark.parametrize("type_", PLAIN)
def test_plain_types_are_pure(tiny, type_):
    types = header_types(tiny[type_])
    for name, t in types.items():
        assert t == ("F32" if name.endswith("norm.weight") else type_), name


def test_llama_mix_matches_llama_cpps_quantizer_on_the_reference_files(reference_dir):
    """The reference tiny files were made by llama.cpp's own quantizer: same types, shapes and order."""
    checked = 0
    for path in sorted(reference_dir.glob("tiny-smollm3-*.gguf")):
        type_ = path.stem.removeprefix("tiny-smollm3-")
        if type_ not in TYPES:
            continue
        ref = [(t.name, type_name(t.type_id), t.shape) for t in read_header(path).tensors]
        plan = [(t.name, t.type.name, t.shape) for t in plan_tensors("tiny", type_, llama_mix=True)]
        assert sorted(plan) == sorted(ref), type_
        if type_ != "F32":  # converted, not quantized: a different order
            assert plan == ref, type_
        checked += 1
    assert checked >= 14


def test_llama_mix_matches_the_real_smollm2_q4_1_file(smollm2_gguf):
    h = read_header(smollm2_gguf)
    ref = [(t.name, type_name(t.type_id), t.shape) for t in h.tensors]
    plan = [(t.name, t.type.name, t.shape) for t in plan_tensors("smollm2-135m", "Q4_1", llama_mix=True)]
    assert sorted(plan) == sorted(ref)
    p, meta = PRESETS["smollm2-135m"], h.metadata
    assert (meta["llama.embedding_length"], meta["llama.block_count"], meta["llama.attention.head_count"],
            meta["llama.attention.head_count_kv"], meta["llama.feed_forward_length"], meta["llama.context_length"],
            len(meta["tokenizer.ggml.tokens"])) == (p.dim, p.n_layers, p.n_heads, p.n_kv_heads, p.ffn, p.context,
                                                    p.vocab)
    assert meta["llama.rope.freq_base"] == pytest.approx(p.rope_base)


# -- rows of 576: llama.cpp's fallbacks ----------------------------------------------------

def test_576_wide_rows_fall_back_like_llama_cpp_in_the_135m_plan():
    plan = {t.name: t.type for t in plan_tensors("smollm2-135m", "Q4_K_M")}
    assert plan["token_embd.weight"] == QT.Q8_0  # output rule: 576 % 256 != 0 -> Q8_0
    for i in range(30):
        assert plan[f"blk.{i}.attn_v.weight"] == (QT.Q8_0 if use_more_bits(i, 30) else QT.Q5_0)  # Q6_K / Q4_K fell back
        assert plan[f"blk.{i}.ffn_down.weight"] == (QT.Q6_K if use_more_bits(i, 30) else QT.Q4_K)  # 1536-wide rows
        for m in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert plan[f"blk.{i}.{m}.weight"] == QT.Q5_0
    fallbacks = {"Q2_K": QT.Q4_0, "Q3_K": QT.Q4_0, "Q4_K": QT.Q5_0, "Q5_K": QT.Q5_1, "Q6_K": QT.Q8_0,
                 "IQ4_XS": QT.IQ4_NL, "Q4_0": QT.Q4_0, "F16": QT.F16}
    for type_, fb in fallbacks.items():
        plan = {t.name: t.type for t in plan_tensors("smollm2-135m", type_)}
        assert plan["blk.0.attn_q.weight"] == fb, type_
        assert plan["blk.0.ffn_down.weight"] == QT[type_], type_  # 1536 = 6 x 256: no fallback


@pytest.mark.parametrize("type_", ["Q4_K_M", "Q2_K", "Q5_K", "IQ4_XS", "Q3_K_M"])
def test_576_wide_file_loads_and_runs(tmp_path, type_):
    path = tmp_path / "wide.gguf"
    plan = write_synthetic(path, WIDE576, type_, seed=3)
    types = header_types(path)
    assert types == {t.name: t.type.name for t in plan}
    assert types["blk.0.attn_q.weight"] != type_
    eng = llm_smolq.load(path, n_ctx=32)
    assert eng.config.arch == "llama" and eng.config.dim == 576 and eng.config.nope_layers == ()
    assert np.isfinite(eng.eval([5, 6, 7, 8], all_logits=True)).all()


def test_rows_that_fit_no_block_become_f16():
    odd = Preset("llama", 80, 1, 1, 1, 80, 96, 512, 512, 1e4, 1e-5)  # 80 % 32 != 0
    plan = {t.name: t.type for t in plan_tensors(odd, "Q4_K_M")}
    assert plan["blk.0.attn_q.weight"] == QT.F16
    assert plan["blk.0.ffn_down.weight"] == QT.Q8_0  # 96 = 3 x 32: Q6_K -> Q8_0 on a use_more_bits layer


# -- determinism, chunking, CLI -----------------------------------------------------------

def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_synthetic(a, "tiny", "Q4_K_M", seed=7)
    write_synthetic(b, "tiny", "Q4_K_M", seed=7)
    write_synthetic(c, "tiny", "Q4_K_M", seed=8)
    assert a.read_bytes() == b.read_bytes()
    ra, rc = a.read_bytes(), c.read_bytes()
    assert len(ra) == len(rc) and ra != rc
    data_start = read_header(a).data_offset
    assert ra[:data_start] == rc[:data_start]  # only the weights differ


def test_chunked_generation_writes_the_same_layout(tmp_path, monkeypatch):
    monkeypatch.setattr(synth, "CHUNK_BYTES", 5000)  # many chunks per tensor, odd sizes
    path = tmp_path / "chunked.gguf"
    write_synthetic(path, "tiny", "Q5_K_M", seed=2)
    m = open_model(path)
    t = m.tensors["token_embd.weight"]
    w = dequantize(np.asarray(m.data[t.offset:t.offset + t.n_bytes]).reshape(t.rows, t.row_bytes), t.type)
    assert np.isfinite(w).all() and np.abs(w).max() <= 0.05
    assert np.isfinite(llm_smolq.load(path, n_ctx=16).eval([1, 2], all_logits=True)).all()


def test_cli_writes_the_file(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert main([str(out), "--preset", "tiny", "--type", "IQ4_NL", "--seed", "4"]) == 0
    assert out.exists() and "IQ4_NL" in capsys.readouterr().out
    assert header_types(out)["blk.0.attn_q.weight"] == "IQ4_NL"
    assert main([str(tmp_path / "mix.gguf"), "--preset", "tiny", "--type", "Q4_0", "--llama-mix"]) == 0
    assert header_types(tmp_path / "mix.gguf")["token_embd.weight"] == "Q6_K"
    with pytest.raises(SystemExit):
        main([str(out), "--preset", "tiny", "--type", "Q7_K"])
    assert not list(tmp_path.glob("*.tmp*"))


def test_cli_layers_keeps_the_shapes_with_fewer_layers(tmp_path, capsys):
    out = tmp_path / "two.gguf"
    assert main([str(out), "--preset", "tiny", "--type", "Q8_0", "--layers", "2"]) == 0
    config = llm_smolq.load(out, n_ctx=16, threads=1).config
    tiny = PRESETS["tiny"]
    assert (config.n_layers, config.dim, config.hidden_dim, config.n_heads) == (2, tiny.dim, tiny.ffn, tiny.n_heads)
    assert main([str(out), "--preset", "tiny", "--type", "Q8_0", "--layers", "0"]) == 1
    assert "--layers must be at least 1" in capsys.readouterr().err


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown type"):
        write_synthetic(tmp_path / "x.gguf", "tiny", "Q4_K_X")
    with pytest.raises(ValueError, match="unknown preset"):
        write_synthetic(tmp_path / "x.gguf", "smollm9", "Q4_0")
    with pytest.raises(ValueError, match="seed"):
        write_synthetic(tmp_path / "x.gguf", "tiny", "Q4_0", seed=-1)
    assert not list(tmp_path.iterdir())


@pytest.mark.may_skip_in_ci
def test_llama_cpp_loads_the_files_and_agrees(tiny):
    """Only where llama-cpp-python is installed (the `bench` extra). F32 KV cache and no
    flash attention, as the engine runs. The engine rounds in its own order
    (native/quants/types.h), so it is held to llama.cpp's spread between its own builds:
    2.5e-2 of a row's largest logit."""
    llama_cpp = pytest.importorskip("llama_cpp")
    for type_ in TYPES:
        path = tiny[type_]
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False,
                              type_k=0, type_v=0, flash_attn=False)
        llm.eval([1, 2, 3])
        theirs = np.array(llm.scores[:3], dtype=np.float32)
        ours = llm_smolq.load(path, n_ctx=64, kv_dtype="f32").eval([1, 2, 3], all_logits=True)
        assert np.isfinite(theirs).all(), type_
        rel = np.abs(theirs - ours).max(axis=1) / np.abs(theirs).max(axis=1)
        assert (rel < 2.5e-2).all(), (type_, rel)
