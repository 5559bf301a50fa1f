"""Weights packed sixteen rows side by side (engine/packing.py): the same logits as the
file's layout on every path, the file itself untouched, each model packed once."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import llm_smolq
from llm_smolq._kernel import lib
from llm_smolq.engine.packing import pack_weights


def file_digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run(eng) -> list[np.ndarray]:
    """A prefill, decode steps, and a small batch (a lookup draft's check)."""
    prompt = [1, 5, 9, 200, 17, 33, 512, 7, 99, 3, 64, 128, 256, 11, 13, 15, 800, 4]
    out = [eng.eval(prompt, all_logits=True)]
    out += [eng.eval([t]) for t in (21, 400, 7)]
    out.append(eng.eval([22, 23, 24, 25, 26, 27, 28, 29, 30], all_logits=True))
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "IQ4_XS"])
def test_packed_weights_give_the_same_logits(kind, reference_dir, monkeypatch):
    path = reference_dir / f"tiny-smollm3-{kind}.gguf"
    before = file_digest(path)
    monkeypatch.setenv("SMOLQ_PACK", "0")
    plain = llm_smolq.load(path, n_ctx=64, threads=2)
    assert plain._packed == {}
    want = run(plain)
    monkeypatch.setenv("SMOLQ_PACK", "1")
    eng = llm_smolq.load(path, n_ctx=64, threads=2)
    # every matrix of the types that pack: the layers' and the (tied) embedding
    assert set(eng._packed) == {name for name, t in eng.model.tensors.items()
                                if lib.sq_rows16_packs(int(t.type)) and len(t.shape) == 2}
    assert kind.removesuffix("_M") in {eng.model.tensors[name].type.name for name in eng._packed}
    for name, at in eng._packed.items():  # the packed copy is the file's matrix, rearranged
        info = eng.model.tensors[name]
        copy = eng.model.packed_data[at:at + info.n_bytes]
        assert copy.tobytes() != plain.model.data[info.offset:info.offset + info.n_bytes].tobytes()
        assert np.array_equal(np.sort(copy), np.sort(plain.model.data[info.offset:info.offset + info.n_bytes]))
    prev = lib.sq_set_simd(1)
    try:
        for simd in (1, 0):  # the path the CPU has, reading packed rows, and the plain code
            lib.sq_set_simd(simd)
            eng.reset()
            got = run(eng)
            for a, b in zip(got, want):
                assert a.tobytes() == b.tobytes(), f"{kind} simd={simd}"
    finally:
        lib.sq_set_simd(prev)
    assert file_digest(path) == before  # the mapping is private: the file never changes


def test_a_model_is_packed_once(reference_dir, monkeypatch):
    monkeypatch.setenv("SMOLQ_PACK", "1")
    first = llm_smolq.load(reference_dir / "tiny-smollm3-Q8_0.gguf", n_ctx=32, threads=1)
    packed_bytes = first.model.packed_data.tobytes()
    second = llm_smolq.Engine(first.model, n_ctx=32, threads=1)
    assert second._packed == first._packed and pack_weights(first.model) == first._packed
    assert first.model.packed_data.tobytes() == packed_bytes
    assert second.eval([1, 2, 3]).tobytes() == first.eval([1, 2, 3]).tobytes()


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "IQ4_XS"])
def test_packed_where_the_path_wants_it(kind, reference_dir, monkeypatch):
    from llm_smolq._kernel import ffi
    from llm_smolq.engine.packing import packable

    monkeypatch.delenv("SMOLQ_PACK", raising=False)
    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    eng = llm_smolq.load(reference_dir / f"tiny-smollm3-{kind}.gguf", n_ctx=32, threads=1)
    assert set(eng._packed) == {name for name, info in eng.model.tensors.items()
                                if packable(info) and lib.sq_rows16_wanted(int(info.type))}
    path = ffi.string(lib.sq_simd_name()).decode()
    quantized = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "IQ4_XS", "Q6_K"}
    wanted = {name for name in quantized if lib.sq_rows16_wanted(getattr(lib, f"SQ_{name}"))}
    # the 512-bit kernels read every quantized type packed, the AVX2 ones Q4_K, others none
    assert wanted == {"avx512vnni": quantized, "avx2": {"Q4_K"}}.get(path, set())
    assert not lib.sq_rows16_wanted(lib.SQ_F32) and not lib.sq_rows16_wanted(lib.SQ_F16)
    if path != "scalar" and kind == "Q4_K_M":
        assert {eng.model.tensors[name].type.name for name in eng._packed} >= {"Q4_K"}
    if path == "avx512vnni" and kind in ("Q5_K_M", "IQ4_XS"):
        assert {eng.model.tensors[name].type.name for name in eng._packed} >= {kind.removesuffix("_M")}


def test_packing_on_several_threads_gives_the_same_bytes(reference_dir, monkeypatch):
    monkeypatch.setenv("SMOLQ_PACK", "1")
    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")  # both packed here, neither mapped from a kept copy
    path = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    one = llm_smolq.load(path, n_ctx=32, threads=1)
    three = llm_smolq.load(path, n_ctx=32, threads=3)
    assert one._packed == three._packed and one._packed
    assert one.model.packed_data.tobytes() == three.model.packed_data.tobytes()


def test_no_packing_without_room_for_the_copy(reference_dir, monkeypatch):
    from llm_smolq.engine import memory

    monkeypatch.setenv("SMOLQ_PACK", "1")
    from llm_smolq.model.model_file import open_model

    monkeypatch.setattr(memory, "available_memory", lambda: (1000, "a test"))
    assert pack_weights(open_model(reference_dir / "tiny-smollm3-Q4_1.gguf")) == {}


def test_the_packing_identity_is_what_packing_does(monkeypatch):
    """The same on every kernel path (they all read one layout), another when the kernel
    would lay a type out otherwise or pack another set of types."""
    from llm_smolq.engine import packing

    def fresh() -> str:
        monkeypatch.setattr(packing, "_packing_identity", None)
        return packing.packing_identity()

    want = fresh()
    assert packing.packing_identity() == want and len(want) == 64
    prev = lib.sq_set_simd(0)
    try:
        assert fresh() == want  # the plain code's path
    finally:
        lib.sq_set_simd(prev)

    class Kernel:  # the kernel as built, but for what the test changes
        def __getattr__(self, name):
            return getattr(lib, name)

    class MovesAByte(Kernel):
        def sq_rows16_pack(self, qtype, src, dst, rows, cols):
            done = lib.sq_rows16_pack(qtype, src, dst, rows, cols)
            if qtype == lib.SQ_Q6_K:  # one type's layout changed: two bytes trade places
                dst[0], dst[64] = dst[64], dst[0]
            return done

    class PacksNoQ8_0(Kernel):
        def sq_rows16_packs(self, qtype):
            return 0 if qtype == lib.SQ_Q8_0 else lib.sq_rows16_packs(qtype)

    for other in (MovesAByte(), PacksNoQ8_0()):
        monkeypatch.setattr(packing, "lib", other)
        assert fresh() != want, type(other).__name__
    monkeypatch.setattr(packing, "lib", Kernel())
    assert fresh() == want  # and the stand-in itself changes nothing


def test_the_packed_copy_is_named_by_content_not_by_place(reference_dir, tmp_path, monkeypatch):
    """Two copies of a file (other paths, names, mtimes) name one packed copy, and so does a
    file whose metadata alone differs; a change to any byte of the weights (the first, one
    halfway along a matrix, the last), or another layout of the packed matrices, names
    another."""
    import os
    import shutil

    from llm_smolq.engine.packing import packable, packed_identity
    from llm_smolq.model.model_file import open_model
    from llm_smolq.cache.kernel_identity import weights_start

    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    source = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    copy = tmp_path / "another name.gguf"
    shutil.copyfile(source, copy)
    os.utime(copy, ns=(0, 10**18))
    one, two = open_model(source), open_model(copy)
    todo = [info for info in one.tensors.values() if packable(info)]
    offsets = dict(zip([info.name for info in todo], range(0, 1 << 40, 1 << 20)))
    want = packed_identity(one, todo, offsets)
    assert packed_identity(two, todo, offsets) == want

    def changed(name: str, at: int) -> str:
        data = bytearray(source.read_bytes())
        data[at] ^= 1
        (tmp_path / name).write_bytes(data)
        return packed_identity(open_model(tmp_path / name), todo, offsets)

    name = one.metadata["general.name"].encode()
    renamed = source.read_bytes().index(name)  # a byte of the model's name, in the header
    assert renamed + len(name) < weights_start(one)
    assert changed("renamed.gguf", renamed) == want
    assert open_model(tmp_path / "renamed.gguf").digest != one.digest  # though the header's digest differs
    matrix = max(todo, key=lambda info: info.n_bytes)
    for at in (weights_start(one), matrix.offset + matrix.n_bytes // 2 + 7, len(one.data) - 1):
        assert changed(f"changed{at}.gguf", at) != want, at
    # the tensor table pointing two matrices of one shape and type at each other's bytes:
    # the same bytes of weights, other matrices
    import struct

    data = bytearray(source.read_bytes())
    fields = []
    for name in ("blk.0.attn_q.weight", "blk.0.attn_output.weight"):
        at = data.index(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
        (n_dims,) = struct.unpack_from("<I", data, at)
        fields.append(at + 4 + 8 * n_dims + 4)  # past the dimensions and the type: the offset
    (a,), (b,) = (struct.unpack_from("<Q", data, at) for at in fields)
    struct.pack_into("<Q", data, fields[0], b)
    struct.pack_into("<Q", data, fields[1], a)
    (tmp_path / "swapped.gguf").write_bytes(data)
    swapped = open_model(tmp_path / "swapped.gguf")
    assert swapped.tensors["blk.0.attn_q.weight"].offset == one.tensors["blk.0.attn_output.weight"].offset
    assert packed_identity(swapped, [swapped.tensors[info.name] for info in todo], offsets) != want
    moved = {**offsets, todo[0].name: 1 << 41}
    assert packed_identity(one, todo, moved) != want
    assert packed_identity(one, todo[1:], offsets) != want
    assert str(source) not in want


def test_a_byte_halfway_along_a_matrix_of_a_large_file_names_another_packed_copy(smollm2_gguf, tmp_path,
                                                                                monkeypatch):
    """SmolLM2's file, one byte changed in place halfway along a matrix in its middle: the
    first and last MiB of its weights are the same, the header too, yet the packed copy
    it names is another."""
    import shutil

    from llm_smolq.engine.packing import packable, packed_identity
    from llm_smolq.model.model_file import open_model
    from llm_smolq.cache.kernel_identity import EDGE_BYTES, weights_edges, weights_start

    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    path = tmp_path / "SmolLM2.gguf"
    shutil.copyfile(smollm2_gguf, path)
    before = open_model(path)
    todo = [info for info in before.tensors.values() if packable(info)]
    offsets = dict(zip([info.name for info in todo], range(0, 1 << 40, 1 << 24)))
    want = packed_identity(before, todo, offsets)
    matrix = before.tensors["blk.15.attn_q.weight"]
    at = matrix.offset + matrix.n_bytes // 2 + 3
    assert weights_start(before) + EDGE_BYTES < at < len(before.data) - EDGE_BYTES
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x40]))
    after = open_model(path)
    assert after.digest == before.digest and weights_edges(after) == weights_edges(before)
    assert packed_identity(after, todo, offsets) != want
