"""Malformed GGUF files are refused at load with a GGUFError that says why."""

import re
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES

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


# -- truncated files: what the error says is derived from the intact file's layout ---------

HEADER_BYTES = 24  # magic, version, tensor count, metadata count
# The smallest a metadata entry can be (key length, a one-byte key, type, a one-byte value)
# and a tensor info (name length, a one-byte name, dimension count, one dimension, type, offset).
MIN_KV_BYTES, MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 1, 8 + 1 + 4 + 8 + 4 + 8

NEEDS = re.compile(
    r": (?P<what>.+) needs (?:at least )?(?P<needs>\d+) bytes at byte (?P<pos>\d+), but the file ends at byte "
    r"(?P<end>\d+) \((?P<left>\d+) bytes left\); the file is truncated or corrupt: download it again$"
)


def header_parts(reader):
    """(start, what the loader calls it, items) of every part of the header after the
    counts, in file order, from gguf's own reader of the intact file; items is the length
    of an array of strings, else None."""
    parts = []
    kvs = [f for key, f in reader.fields.items() if not key.startswith("GGUF.")]
    for j, field in enumerate(kvs):
        key = repr(field.name)
        parts.append((byte_offset(reader, field.parts[0]), f"metadata key {j}", None))  # its length, then its bytes
        parts.append((byte_offset(reader, field.parts[2]), f"type of {key}", None))
        strings = field.types[:2] == [GGUFValueType.ARRAY, GGUFValueType.STRING]
        parts.append((byte_offset(reader, field.parts[3]), f"metadata {key}", len(field.data) if strings else None))
    for i, tensor in enumerate(reader.tensors):
        name, p = repr(tensor.name), tensor.field.parts
        parts.append((byte_offset(reader, p[0]), f"name of tensor {i}", None))
        parts.append((byte_offset(reader, p[2]), f"dimension count of tensor {name}", None))
        parts.append((byte_offset(reader, p[3]), f"shape of tensor {name}", None))
        parts.append((byte_offset(reader, p[4]), f"type of tensor {name}", None))
        parts.append((byte_offset(reader, p[5]), f"offset of tensor {name}", None))
    last = reader.tensors[-1].field.parts[5]
    return parts, byte_offset(reader, last) + last.nbytes


def check_truncation_message(reader, size, message):
    """The error for the intact file cut to `size` bytes says what is missing, and where."""
    if size == 0:
        assert message.endswith(": the file is empty"), message
        return
    if size < HEADER_BYTES:
        assert message.endswith(f": the file is {size} byte{'s' if size > 1 else ''} long, shorter than the "
                                f"{HEADER_BYTES}-byte GGUF header (magic, version, tensor and metadata counts); "
                                "it is truncated: download it again"), message
        return
    parts, header_end = header_parts(reader)
    n_kv, n_tensors = int(reader.fields["GGUF.kv_count"].parts[0][0]), len(reader.tensors)
    if size < header_end:
        left = size - HEADER_BYTES
        claim = (f": the header claims {n_kv} metadata entries and {n_tensors} tensors, more than the {left} bytes "
                 "after it can hold; the file is truncated or corrupt: download it again")
        if message.endswith(claim):  # then it must be true of any GGUF
            assert left < n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES, message
            return
        start, what, items = max((p for p in parts if p[0] <= size), key=lambda p: p[0])  # where the cut falls
        found = NEEDS.search(message)
        assert found, message
        pos, needs = int(found["pos"]), int(found["needs"])
        if items is not None and found["what"] != what:  # the strings cannot all fit: 8 bytes each at least
            assert (found["what"], needs) == (f"{what}: array of {items} items", 8 * items), message
            assert "needs at least" in message, message
        else:
            assert found["what"] == what, message
        assert start <= pos <= size and int(found["end"]) == size and int(found["left"]) == size - pos, message
        assert needs > size - pos, message
        return
    # The header is whole: the first tensor (in file order) whose data is cut is named.
    offsets = [t.data_offset for t in reader.tensors]
    assert offsets == sorted(offsets)  # the index lists them in file order, as the loader checks them
    tensor = next(t for t in reader.tensors if t.data_offset + t.n_bytes > size)
    shape = [int(d) for d in tensor.shape]
    assert message.endswith(
        f": tensor {tensor.name!r} (shape {shape}, {int(tensor.n_bytes)} bytes at offset {tensor.data_offset}) "
        f"ends past the end of the file ({size} bytes); the file is truncated or corrupt: download it again"
    ), message


def cut_and_load(tmp_path, path, size):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:size])
    message = load_fails(cut)
    assert message.startswith(f"{cut}: "), message
    return message


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.3, 0.9, 0.999])
def test_truncated_file(tiny, tmp_path, fraction):
    path, reader = tiny
    size = int(path.stat().st_size * fraction)
    check_truncation_message(reader, size, cut_and_load(tmp_path, path, size))


def _field_part(key, index, plus):
    return lambda reader: byte_offset(reader, reader.fields[key].parts[index]) + plus


def _tensor_part(i, index, plus):
    return lambda reader: byte_offset(reader, reader.tensors[i].field.parts[index]) + plus


CUTS = {
    "after the magic": lambda reader: 4,
    "inside the counts": lambda reader: 19,
    "just after the counts": lambda reader: HEADER_BYTES + 4,
    "inside a metadata key's length": _field_part("tokenizer.ggml.token_type", 0, 5),
    "inside a metadata key": _field_part("tokenizer.ggml.token_type", 1, 3),
    "inside a metadata type": _field_part("tokenizer.ggml.merges", 2, 1),
    "inside a string array": _field_part("tokenizer.ggml.merges", 30, 0),
    "inside a scalar value": _field_part("tokenizer.ggml.bos_token_id", 3, 2),
    "inside a string value": _field_part("tokenizer.chat_template", 4, 100),
    "inside a tensor's name": _tensor_part(5, 1, 2),
    "inside a tensor's dimension count": _tensor_part(3, 2, 1),
    "inside a tensor's shape": _tensor_part(7, 3, 9),
    "inside a tensor's type": _tensor_part(9, 4, 1),
    "inside the last tensor's offset": _tensor_part(-1, 5, 4),
    "in the padding before the data": lambda reader: reader.data_offset - 1,
    "at the start of the data": lambda reader: reader.data_offset,
    "inside a tensor's data": lambda reader: reader.tensors[10].data_offset + reader.tensors[10].n_bytes // 2,
    "one byte short": lambda reader: len(reader.data) - 1,
}


@pytest.mark.parametrize("where", CUTS)
def test_truncated_file_says_which_part_is_cut(tiny, tmp_path, where):
    path, reader = tiny
    size = int(CUTS[where](reader))
    assert 0 < size < path.stat().st_size
    check_truncation_message(reader, size, cut_and_load(tmp_path, path, size))


def test_not_a_gguf_file(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("just some text, not a model\n" * 10)
    load_fails(text, "not a GGUF file")


def test_missing_file(tmp_path):
    load_fails(tmp_path / "nope.gguf", "no such file")


def test_tensor_offset_past_the_end(tiny, tmp_path):
    path, reader = tiny
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    part = tensor_part(reader, "blk.1.ffn_up.weight", 5)
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint64(10**9).tobytes())])
    shape = [int(d) for d in tensor.shape]
    load_fails(bad, f"tensor 'blk.1.ffn_up.weight' (shape {shape}, {int(tensor.n_bytes)} bytes at offset "
                    f"{reader.data_offset + 10**9}) ends past the end of the file ({path.stat().st_size} bytes)",
               "truncated or corrupt")


def test_unknown_tensor_type(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "blk.0.attn_q.weight", 4)
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint32(77).tobytes())])
    assert 77 not in {int(q) for q in GGMLQuantizationType}
    load_fails(bad, "tensor 'blk.0.attn_q.weight' has an unknown type (77), which llm-smolq cannot read",
               "supported: ", "Q8_0")


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
    tensor = next(t for t in reader.tensors if t.name == "output_norm.weight")
    part = tensor_part(reader, "output_norm.weight", 3)
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint64(1 << 40).tobytes())])
    block, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
    claimed = (1 << 40) // block * block_bytes
    assert claimed > path.stat().st_size
    load_fails(bad, f"tensor 'output_norm.weight' (shape [{1 << 40}], {claimed} bytes at offset {tensor.data_offset}) "
                    f"ends past the end of the file ({path.stat().st_size} bytes)")


def test_row_length_not_a_whole_number_of_blocks(tiny, tmp_path):
    path, reader = tiny
    part = tensor_part(reader, "blk.0.ffn_gate.weight", 3)  # Q8_0 rows of 250: not x32
    bad = patched(tmp_path, path, [(byte_offset(reader, part), np.uint64(250).tobytes())])
    qtype = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight").tensor_type
    block = GGML_QUANT_SIZES[qtype][0]
    assert 250 % block
    load_fails(bad, f"tensor 'blk.0.ffn_gate.weight': row length 250 is not a multiple of the {qtype.name} "
                    f"block ({block})")


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
    load_fails(bad, "metadata key smollm3.block_count is missing")


@pytest.mark.parametrize("name", ["tiny-smollm3-Q4_K_M.gguf", "tiny-smollm3-chat-Q8_0.gguf", "SmolLM2"])
def test_header_reader_agrees_with_gguf_reader(reference_dir, smollm2_gguf, name):
    from llm_smolq.model.gguf_file import read_header

    path = smollm2_gguf if name == "SmolLM2" else reference_dir / name
    ours = read_header(path)
    theirs = GGUFReader(path)
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata.keys() == expected.keys()
    for key, value in expected.items():
        assert ours.metadata[key] == value, key
    assert [(t.name, t.type_id, t.shape, t.offset) for t in ours.tensors] == [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), t.data_offset) for t in theirs.tensors
    ]


# -- found by fuzzing (python -m llm_smolq.dev.fuzz_gguf): one test per class of bug -------

def field_value(reader, key):
    """Where metadata `key`'s (scalar) value sits in the file."""
    return byte_offset(reader, reader.fields[key].parts[-1])


def rewritten(tmp_path, source, edit, name="edited.gguf"):
    """`source` taken apart, changed by edit(layout), and written back as a valid GGUF."""
    from llm_smolq.dev.gguf_mutations import parse, serialize

    layout = parse(source.read_bytes())
    edit(layout)
    path = tmp_path / name
    path.write_bytes(serialize(layout.kvs, layout.tensors, layout.data[layout.data_offset:], layout.alignment))
    return path


@pytest.mark.parametrize(
    "count, says",
    [(2**31 - 1, "block_count = 2147483647, but the file has only 38 tensors"),
     (2**32 - 1, "must be an integer from 1 to 2147483647")],
)
def test_an_absurd_layer_count_is_refused_at_once(tiny, tmp_path, count, says):
    """Was a hang: the expected tensor names were listed for every declared layer first."""
    path, reader = tiny
    bad = patched(tmp_path, path, [(field_value(reader, "smollm3.block_count"), np.uint32(count).tobytes())])
    load_fails(bad, says)


@pytest.mark.parametrize(
    "key, value, says",
    [("smollm3.embedding_length", np.uint32(2**32 - 1), "from 1 to 2147483647"),
     ("smollm3.attention.head_count", np.uint32(1 << 20), "supports up to 65536 heads"),
     ("smollm3.attention.layer_norm_rms_epsilon", np.float32(0), "fits a float32"),
     ("smollm3.attention.layer_norm_rms_epsilon", np.float32(1e-45), "fits a float32"),
     ("smollm3.rope.freq_base", np.float32("inf"), "fits a float32")],
)
def test_sizes_and_constants_the_kernel_cannot_hold(tiny, tmp_path, key, value, says):
    """Config values reach C as int and float: each is checked to fit before it is used."""
    path, reader = tiny
    bad = patched(tmp_path, path, [(field_value(reader, key), value.tobytes())])
    load_fails(bad, key, says)


def test_head_width_whose_product_overflows_a_c_int(tiny, tmp_path):
    from llm_smolq.dev.gguf_mutations import KV
    from gguf import GGUFValueType

    path, _ = tiny
    bad = rewritten(tmp_path, path, lambda layout: layout.kvs.append(
        KV("smollm3.attention.key_length", GGUFValueType.UINT32, 2**30)))
    load_fails(bad, "4 heads of size 1073741824", "2147483647")


def test_tokenizer_larger_than_the_embedding(tiny, tmp_path):
    """Was: the tokenizer gave ids the model has no row for."""
    path, _ = tiny

    def add_tokens(layout):
        kv = next(kv for kv in layout.kvs if kv.key == "tokenizer.ggml.tokens")
        item, tokens = kv.value
        kv.value, kv.raw = (item, tokens + ["extra1", "extra2"]), None

    load_fails(rewritten(tmp_path, path, add_tokens), "1026 tokens", "1024 rows")


def test_tokenizer_metadata_of_the_wrong_type_fails_as_gguf_error(tiny, tmp_path):
    """Was a TypeError from inside the tokenizer; now a GGUFError on first use."""
    path, reader = tiny
    bad = patched(tmp_path, path, [(field_value(reader, "tokenizer.ggml.bos_token_id"), np.uint32(5000).tobytes())])
    eng = llm_smolq.load(bad, n_ctx=64, threads=1)
    with pytest.raises(GGUFError, match="bos_token_id = 5000 is not a token id"):
        eng.tokenize("hi")


def test_a_metadata_key_given_twice(tiny, tmp_path):
    path, reader = tiny
    key = reader.fields["tokenizer.ggml.eos_token_id"].parts[1]
    bad = patched(tmp_path, path, [(byte_offset(reader, key), b"tokenizer.ggml.bos_token_id")])
    load_fails(bad, "'tokenizer.ggml.bos_token_id' appears twice")


def test_a_big_endian_file(tmp_path):
    """The header reader understands either byte order; the kernel reads little-endian."""
    path = tmp_path / "be.gguf"
    path.write_bytes(struct.pack(">IIQQ", 0x47475546, 3, 0, 0) + bytes(64))
    load_fails(path, "big-endian")


def test_non_finite_weights_fail_at_eval_and_leave_the_cache_as_it_was(tiny, tmp_path):
    """Was: NaN logits returned as if fine (and sampled from)."""
    path, reader = tiny
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")  # tied: also the output
    bad = patched(tmp_path, path, [(embd.data_offset, b"\xff" * embd.n_bytes)])  # every scale a NaN
    eng = llm_smolq.load(bad, n_ctx=64, threads=1)
    with pytest.raises(GGUFError, match="not finite"):
        eng.eval([1, 2, 3])
    assert eng.n_past == 0


def test_messages_quote_damaged_names_briefly(tiny, tmp_path):
    """Was: a corrupt key length made the next 5000 bytes the key, all of it in the message."""
    path, reader = tiny
    length = reader.fields["general.name"].parts[0]
    bad = patched(tmp_path, path, [(byte_offset(reader, length), np.uint64(5000).tobytes())])
    # The key now runs 5000 bytes past its start; the 4 bytes after it are read as the value's type.
    key_start = byte_offset(reader, length) + 8
    (kind,) = struct.unpack_from("<I", path.read_bytes(), key_start + 5000)
    assert kind not in {int(t) for t in GGUFValueType}
    message = load_fails(bad, "metadata 'general.name", f"' has unknown value type {kind}; the file is corrupt",
                         f"(at byte {key_start + 5004} of {path.stat().st_size})")
    assert len(message) < 400 and "..." in message, message  # the key is quoted cut short
