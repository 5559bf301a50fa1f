"""Malformed GGUF files are refused at load with a GGUFError that says why."""

import numpy as np
import pytest
from gguf import GGUFReader

import llm_smolq
from llm_smolq import GGUFError

TINY = "tiny-smollm3-Q8_0.gguf"


def byte_offset(reader: GGUFReader, part: np.ndarray) -> int:
    """Where a parsed field part sits in the file (parts are views into the map)."""
    return part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]


def patched(tmp_path, source, edits, name="bad.gguf"):
    data = bytearray(source.read_bytes())
    for offset, raw in edits:
        data[offset:offset + len(raw)] = raw
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def tensor_part(reader, name, index):
    """Part `index` of tensor `name`'s info: 2 n_dims, 3 dims, 4 type, 5 offset."""
    tensor = next(t for t in reader.tensors if t.name == name)
    return tensor.field.parts[index]


@pytest.fixture
def tiny(reference_dir):
    path = reference_dir / TINY
    return path, GGUFReader(path)


def load_fails(path, *needles):
    with pytest.raises(GGUFError) as err:
        llm_smolq.load(path, n_ctx=64, threads=1)
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    return message


def test_the_unmodified_file_loads_and_runs(tiny):
    path, _ = tiny
    eng = llm_smolq.load(path, n_ctx=64, threads=1)
    assert np.isfinite(eng.eval([1, 2, 3])).all()


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.3, 0.9, 0.999])
def test_truncated_file(tiny, tmp_path, fraction):
    path, _ = tiny
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * fraction)])
    load_fails(cut, str(cut))


def test_not_a_gguf_file(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("just some text, not a model\n" * 10)
    load_fails(text, "not a GGUF file")


def test_missing_file(tmp_path):
    load_fails(tmp_path / "nope.gguf", "no such file")


def test_tensor_offset_past_the_end(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "blk.1.ffn_up.weight", 5)
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint64(10**9).tobytes())])
    load_fails(bad, "blk.1.ffn_up.weight")


def test_unknown_tensor_type(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "blk.0.attn_q.weight", 4)
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint32(77).tobytes())])
    load_fails(bad)


def test_type_llm_smolq_cannot_read(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "blk.0.attn_q.weight", 4)  # Q8_0 -> IQ2_XXS (16)
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint32(16).tobytes())])
    load_fails(bad, "IQ2_XXS", "blk.0.attn_q.weight")


def test_shape_that_disagrees_with_the_model(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "blk.2.attn_k.weight", 3)  # [256, 128] -> [256, 64]
    offset = byte_offset(reader, part) + 8
    bad = patched(tmp_path, path, [(offset, np.uint64(64).tobytes())])
    load_fails(bad, "blk.2.attn_k.weight", "[256, 64]")


def test_shape_too_large_for_the_file(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "output_norm.weight", 3)
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint64(1 << 40).tobytes())])
    load_fails(bad, "output_norm.weight")


def test_row_length_not_a_whole_number_of_blocks(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "blk.0.ffn_gate.weight", 3)  # Q8_0 rows of 250: not x32
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint64(250).tobytes())])
    load_fails(bad, "blk.0.ffn_gate.weight")


def test_unknown_architecture(tiny, tmp_path):
    path, reader = tiny
    field = reader.fields["general.architecture"]
    value = field.parts[-1]  # the string's bytes: "smollm3" -> "gemma99"
    bad = patched(tmp_path, path, [(byte_offset(reader, value), b"gemma99")])
    load_fails(bad, "gemma99", "smollm3")


def test_missing_metadata_key(tiny, tmp_path):
    path, reader = tiny
    key = reader.fields["smollm3.block_count"].parts[1]  # rename the key
    bad = patched(tmp_path, path, [(byte_offset(reader, key), b"smollm3.block_xxxxx")])
    load_fails(bad, "block_count")


@pytest.mark.parametrize("name", ["tiny-smollm3-Q4_K_M.gguf", "tiny-smollm3-chat-Q8_0.gguf", "tok-llama-bpe.gguf"])
def test_header_reader_agrees_with_gguf_reader(reference_dir, name):
    from llm_smolq.gguf_file import read_header

    ours = read_header(reference_dir / name)
    theirs = GGUFReader(reference_dir / name)
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata.keys() == expected.keys()
    for key, value in expected.items():
        assert ours.metadata[key] == value, key
    assert [(t.name, t.type_id, t.shape, t.offset) for t in ours.tensors] == [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), t.data_offset) for t in theirs.tensors
    ]
