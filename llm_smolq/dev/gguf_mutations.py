"""Seeded mutations of a valid GGUF file, for fuzzing the loader (llm_smolq.dev.fuzz_gguf).

`parse` takes a well-formed little-endian GGUF apart: its metadata with their value types,
its tensor infos, the byte position and role of every number in the header, and the
boundaries between its regions. `serialize` writes (edited) parts back as a GGUF. Each
mutation takes the parsed file and a seeded `random.Random` and returns the bytes of a
damaged or unusual variant with a one-line description; `make_case` picks the fixture and
the mutation of one case from (seed, case number) alone, so any case can be replayed.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES

from llm_smolq.model.gguf_file import SCALAR_CODES

V = GGUFValueType

# ---------------------------------------------------------------------------------------
# A valid GGUF, taken apart: values with their types, byte positions of every field
# ---------------------------------------------------------------------------------------

@dataclass
class KV:
    key: str
    kind: int
    value: Any  # scalars and strings as Python values; arrays as (item kind, [values])
    raw: bytes | None = None  # the original encoding; None once edited


@dataclass
class TensorEntry:
    name: str
    dims: list[int]
    type_id: int
    offset: int  # relative to the data section
    raw: bytes | None = None


@dataclass
class Layout:
    """A parsed fixture. `fields` lists (role, position, struct code) of every number in
    the header; `boundaries` the (label, position) where each region starts or ends."""

    data: bytes
    kvs: list[KV]
    tensors: list[TensorEntry]
    alignment: int
    data_offset: int
    fields: dict[str, list[tuple[int, str]]]
    boundaries: list[tuple[str, int]]

    @property
    def blobs(self) -> list[bytes]:
        """Each tensor's bytes, in tensor order."""
        return [self.data[self.data_offset + t.offset:self.data_offset + t.offset + tensor_bytes(t)]
                for t in self.tensors]


def tensor_bytes(t: TensorEntry) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)]
    return math.prod(t.dims) // block * size


class _Walker:
    """Reads a header the way model/gguf_file.py does, but for a fixture, not a user's file:
    it records the position and role of every number, array items one by one, and keeps
    each array's item type, so a mutation can hit any field and the file can be written
    back. The loader's reader bounds every count and reads scalar arrays in one unpack;
    the value codes (SCALAR_CODES) are shared."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0
        self.fields: dict[str, list[tuple[int, str]]] = {}

    def num(self, code: str, role: str | None) -> Any:
        if role:
            self.fields.setdefault(role, []).append((self.pos, code))
        (value,) = struct.unpack_from("<" + code, self.data, self.pos)
        self.pos += struct.calcsize(code)
        return value

    def string(self, role: str) -> str:
        n = self.num("Q", role)
        text = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        if kind == V.STRING:
            return self.string("string length")
        if kind == V.ARRAY:
            item = self.num("I", "array item type")
            count = self.num("Q", "array count")
            return item, [self.value(item) for _ in range(count)]
        return self.num(SCALAR_CODES[kind], "scalar value")


def parse(data: bytes) -> Layout:
    """Take a valid little-endian GGUF apart (a fixture: not hardened against bad input)."""
    w = _Walker(data)
    bounds = [("start", 0)]
    w.num("I", None)
    for role, code in (("version", "I"), ("tensor count", "Q"), ("metadata count", "Q")):
        w.num(code, role)
        bounds.append((f"after {role}", w.pos))
    _, _, n_tensors, n_kv = struct.unpack_from("<IIQQ", data, 0)
    kvs = []
    for i in range(n_kv):
        start = w.pos
        bounds.append((f"metadata entry {i}", start))
        key = w.string("key length")
        kind = w.num("I", "value type")
        bounds.append((f"value of {key}", w.pos))
        kvs.append(KV(key, kind, w.value(kind), data[start:w.pos]))
    bounds.append(("end of metadata", w.pos))
    tensors = []
    for i in range(n_tensors):
        start = w.pos
        bounds.append((f"tensor info {i}", start))
        name = w.string("tensor name length")
        n_dims = w.num("I", "n_dims")
        dims = [w.num("Q", "dimension") for _ in range(n_dims)]
        type_id = w.num("I", "tensor type")
        offset = w.num("Q", "tensor offset")
        tensors.append(TensorEntry(name, dims, type_id, offset, data[start:w.pos]))
    bounds.append(("end of tensor infos", w.pos))
    alignment = next((kv.value for kv in kvs if kv.key == "general.alignment"), GGUF_DEFAULT_ALIGNMENT)
    data_offset = -(-w.pos // alignment) * alignment
    bounds.append(("data section", data_offset))
    for t in tensors:
        bounds.append((f"data of {t.name}", data_offset + t.offset))
        bounds.append((f"end of {t.name}", data_offset + t.offset + tensor_bytes(t)))
    bounds.append(("end of file", len(data)))
    return Layout(data, kvs, tensors, alignment, data_offset, w.fields, bounds)


# ---------------------------------------------------------------------------------------
# Writing a GGUF back from (possibly edited) parts
# ---------------------------------------------------------------------------------------

def _pack_string(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(raw)) + raw


def _pack_value(kind: int, value: Any) -> bytes:
    if kind == V.STRING:
        return _pack_string(value)
    if kind == V.ARRAY:
        item, items = value
        return struct.pack("<IQ", item, len(items)) + b"".join(_pack_value(item, v) for v in items)
    code = SCALAR_CODES.get(kind)
    if code is None:  # an unknown type: write something, the reader must refuse it
        return struct.pack("<Q", value if isinstance(value, int) else 0)
    if code in "fd" or code == "?":
        return struct.pack("<" + code, value)
    return struct.pack(_unsigned(code), int(value) % (1 << struct.calcsize(code) * 8))


def _pack_kv(kv: KV) -> bytes:
    if kv.raw is not None:
        return kv.raw
    return _pack_string(kv.key) + struct.pack("<I", kv.kind) + _pack_value(kv.kind, kv.value)


def _pack_tensor(t: TensorEntry) -> bytes:
    if t.raw is not None:
        return t.raw
    dims = b"".join(struct.pack("<Q", d % (1 << 64)) for d in t.dims)
    return (_pack_string(t.name) + struct.pack("<I", len(t.dims) % (1 << 32)) + dims
            + struct.pack("<IQ", t.type_id % (1 << 32), t.offset % (1 << 64)))


def serialize(kvs: Sequence[KV], tensors: Sequence[TensorEntry], data: bytes, pad_to: int) -> bytes:
    """A GGUF v3 file: header, metadata, tensor infos, zero padding to `pad_to`, then `data`."""
    out = bytearray(struct.pack("<IIQQ", GGUF_MAGIC, 3, len(tensors), len(kvs)))
    for kv in kvs:
        out += _pack_kv(kv)
    for t in tensors:
        out += _pack_tensor(t)
    out += bytes(-len(out) % pad_to)
    return bytes(out + data)


def with_metadata(data: bytes, changes: dict[str, tuple[int, Any]]) -> bytes:
    """The GGUF in `data` with metadata keys set (key -> (GGUFValueType, value)): an
    existing key's value replaced, a new one added at the end; tensors unchanged."""
    fix = parse(data)
    kvs = [KV(kv.key, *changes[kv.key]) if kv.key in changes else kv for kv in fix.kvs]
    kvs += [KV(key, kind, value) for key, (kind, value) in changes.items() if key not in {kv.key for kv in fix.kvs}]
    return serialize(kvs, fix.tensors, data[fix.data_offset:], fix.alignment)


def relayout(tensors: Sequence[TensorEntry], blobs: Sequence[bytes], alignment: int) -> tuple[list[TensorEntry], bytes]:
    """Pack the tensors' bytes one after another, each start a multiple of `alignment`."""
    data, placed = bytearray(), []
    for t, blob in zip(tensors, blobs):
        data += bytes(-len(data) % alignment)
        placed.append(replace(t, offset=len(data), raw=None))
        data += blob
    return placed, bytes(data)


# ---------------------------------------------------------------------------------------
# Mutations. Each takes the fixture and a seeded Random and returns (file bytes, what it did).
# ---------------------------------------------------------------------------------------

def _unsigned(code: str) -> str:
    """The unsigned struct code of the same width (floats and bools as their bits)."""
    return "<" + {"f": "I", "d": "Q", "?": "B"}.get(code, code.upper())


def _interesting_int(rng: random.Random, bits: int, original: int = 0, file_size: int = 0) -> int:
    values = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64, 255, 256, 4096, 2**15, 2**16, 2**31 - 1, 2**31,
              2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, original - 1, original + 1, original * 2,
              original // 2, original ^ (1 << rng.randrange(bits)), file_size, file_size - 1, file_size // 2,
              rng.getrandbits(bits), rng.randrange(64)]
    return rng.choice(values) % (1 << bits)


_FLOATS = (0.0, -0.0, -1.0, 1.0, 0.5, 1e-45, 1e-30, 1e-8, 1e6, 1e38, 3.5e38, 1e300, 5e-324,
           float("nan"), float("inf"), float("-inf"))
_STRINGS = ("", " ", "x", "smollm3", "llama", "gpt2", "llama-bpe", "smaug-bpe", "smollm", "bert", "none",
            "linear", "\u0120", "a b", "a b c", "<|im_start|>", "\x00", "\ud800", "🙂" * 3, "x" * 5000)


def _random_value(rng: random.Random, kind: int, depth: int = 0) -> Any:
    if kind == V.STRING:
        return rng.choice(_STRINGS)
    if kind == V.BOOL:
        return rng.random() < 0.5
    if kind in (V.FLOAT32, V.FLOAT64):
        value = rng.choice(_FLOATS)
        if kind == V.FLOAT32 and abs(value) > 3.4e38 and math.isfinite(value):
            value = float("inf")
        return value
    if kind == V.ARRAY:
        item = rng.choice([V.UINT8, V.INT32, V.UINT32, V.FLOAT32, V.STRING, V.BOOL, V.UINT64]
                          + ([V.ARRAY] if depth < 2 else []))
        return item, [_random_value(rng, item, depth + 1) for _ in range(rng.choice([0, 1, 2, 5, 300]))]
    bits = struct.calcsize(SCALAR_CODES[kind]) * 8
    return _interesting_int(rng, bits)


_VALUE_KINDS = [k for k in V]


def _edited(fix: Layout, kvs: list[KV] | None = None, tensors: list[TensorEntry] | None = None,
            data: bytes | None = None, pad_to: int | None = None) -> bytes:
    return serialize(fix.kvs if kvs is None else kvs, fix.tensors if tensors is None else tensors,
                     fix.data[fix.data_offset:] if data is None else data, pad_to or fix.alignment)


def m_set_field(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """A count, length, type, dimension or offset in the header set to an edge value."""
    role = rng.choice(sorted(fix.fields))
    pos, code = rng.choice(fix.fields[role])
    bits = struct.calcsize(code) * 8
    unsigned = _unsigned(code)
    (old,) = struct.unpack_from(unsigned, fix.data, pos)
    new = _interesting_int(rng, bits, old, len(fix.data))
    data = bytearray(fix.data)
    struct.pack_into(unsigned, data, pos, new)
    return bytes(data), f"{role} at byte {pos}: {old} -> {new}"


def m_truncate(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """The file cut at (or a few bytes around) a region boundary."""
    label, pos = rng.choice(fix.boundaries)
    delta = rng.choice([0, 0, 0, -1, 1, -2, 2, -4, 4, -8, 8, -rng.randrange(64)])
    cut = min(max(pos + delta, 0), len(fix.data) - 1)
    return fix.data[:cut], f"truncated to {cut} bytes ({label} {delta:+d})"


def m_splice(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """Bytes inserted or deleted at a region boundary: everything after it shifts."""
    label, pos = rng.choice(fix.boundaries)
    n = rng.choice([1, 2, 4, 7, 8, 16, 31, 32])
    if rng.random() < 0.5:
        fill = rng.randbytes(n) if rng.random() < 0.5 else bytes(n)
        return fix.data[:pos] + fill + fix.data[pos:], f"{n} bytes inserted at {label}"
    return fix.data[:pos] + fix.data[pos + n:], f"{n} bytes deleted at {label}"


def m_flip(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """Random bytes changed, mostly in the header (metadata and tensor infos)."""
    return _flip(rng, fix.data, fix.data_offset)


def _flip(rng: random.Random, data: bytes, header_end: int) -> tuple[bytes, str]:
    out = bytearray(data)
    n = rng.choice([1, 1, 2, 3, 4, 8, 16])
    header = rng.random() < 0.75
    for _ in range(n):
        pos = rng.randrange(min(header_end, len(out)) if header else len(out))
        out[pos] ^= rng.choice([1 << rng.randrange(8), 0xFF, rng.randrange(1, 256)])
    return bytes(out), f"{n} byte(s) flipped in the {'header' if header else 'file'}"


def m_retype(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """A metadata entry re-encoded as a value of another type (or an unknown type)."""
    i = rng.randrange(len(fix.kvs))
    old = fix.kvs[i]
    kind = rng.choice(_VALUE_KINDS + [13, 99, 2**31])
    value = _random_value(rng, kind) if kind in _VALUE_KINDS else rng.getrandbits(64)
    kvs = list(fix.kvs)
    kvs[i] = KV(old.key, kind, value)
    return _edited(fix, kvs), f"{old.key}: {V(old.kind).name} -> type {kind} = {_short(value)}"


def m_value(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """A scalar or string metadata value replaced by an edge value of the same type."""
    candidates = [i for i, kv in enumerate(fix.kvs) if kv.kind != V.ARRAY]
    i = rng.choice(candidates)
    old = fix.kvs[i]
    if old.kind in (V.STRING, V.BOOL) or old.kind in (V.FLOAT32, V.FLOAT64):
        value = _random_value(rng, old.kind)
    else:
        value = _interesting_int(rng, struct.calcsize(SCALAR_CODES[old.kind]) * 8, old.value, 0)
    kvs = list(fix.kvs)
    kvs[i] = KV(old.key, old.kind, value)
    return _edited(fix, kvs), f"{old.key} = {_short(old.value)} -> {_short(value)}"


_EXTRA_KEYS = ("general.alignment", "{arch}.attention.key_length", "{arch}.attention.value_length",
               "{arch}.rope.scaling.type", "{arch}.rope.dimension_count", "{arch}.attention.head_count_kv",
               "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.token_type",
               "general.architecture", "tokenizer.ggml.pre")


def m_keys(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """A metadata key dropped, given twice, or added with a random value."""
    kvs = list(fix.kvs)
    arch = next(kv.value for kv in kvs if kv.key == "general.architecture")
    action = rng.choice(["drop", "duplicate", "add"])
    if action == "drop":
        old = kvs.pop(rng.randrange(len(kvs)))
        return _edited(fix, kvs), f"dropped {old.key}"
    if action == "duplicate":
        old = rng.choice(kvs)
        value = old.value if rng.random() < 0.5 else _random_value(rng, old.kind)
        kvs.insert(rng.randrange(len(kvs) + 1), KV(old.key, old.kind, value))
        return _edited(fix, kvs), f"{old.key} given twice"
    key = rng.choice(_EXTRA_KEYS).format(arch=arch)
    kind = rng.choice([V.UINT32, V.INT32, V.UINT64, V.STRING, V.FLOAT32, V.BOOL, V.ARRAY])
    value = _random_value(rng, kind)
    kvs.insert(rng.randrange(len(kvs) + 1), KV(key, kind, value))
    return _edited(fix, kvs), f"added {key} ({V(kind).name}) = {_short(value)}"


def m_alignment(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """general.alignment set, with the data laid out to match it or left as it was."""
    value = rng.choice([0, 1, 2, 3, 4, 8, 16, 24, 48, 64, 128, 4096, 65536, 2**31, 2**32 - 1])
    kvs = [kv for kv in fix.kvs if kv.key != "general.alignment"]
    kvs.insert(rng.randrange(len(kvs) + 1), KV("general.alignment", V.UINT32, value))
    if value and not value & (value - 1) and value <= 65536 and rng.random() < 0.7:
        tensors, data = relayout(fix.tensors, fix.blobs, value)
        return _edited(fix, kvs, tensors, data, value), f"general.alignment = {value}, data laid out for it"
    return _edited(fix, kvs), f"general.alignment = {value}, data left at {fix.alignment}"


def m_array(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """An array (token list, types, merges) shortened, extended, or with an odd element."""
    i = rng.choice([i for i, kv in enumerate(fix.kvs) if kv.kind == V.ARRAY])
    old = fix.kvs[i]
    item, items = old.value
    items = list(items)
    action = rng.choice(["shorten", "extend", "element", "element", "swap"])
    if action == "shorten":
        n = rng.choice([0, 1, len(items) // 2, len(items) - 1, rng.randrange(len(items) + 1)])
        items, what = items[:n], f"cut to {n} items"
    elif action == "extend":
        n = rng.choice([1, 2, 17, 1000])
        items += [rng.choice(items) if rng.random() < 0.5 else _random_value(rng, item) for _ in range(n)]
        what = f"{n} items added"
    elif action == "element":
        j = rng.randrange(len(items))
        items[j] = _random_value(rng, item) if rng.random() < 0.8 else items[rng.randrange(len(items))]
        what = f"item {j} = {_short(items[j])}"
    else:
        j, k = rng.randrange(len(items)), rng.randrange(len(items))
        items[j], items[k] = items[k], items[j]
        what = f"items {j} and {k} swapped"
    kvs = list(fix.kvs)
    kvs[i] = KV(old.key, old.kind, (item, items))
    return _edited(fix, kvs), f"{old.key}: {what}"


def m_heads(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """The attention heads re-cut: another head size over the same q/k/v widths, with the
    head counts and RoPE size to match (a shape the kernel must run), or one of them off."""
    arch = next(kv.value for kv in fix.kvs if kv.key == "general.architecture")
    values = {kv.key: kv.value for kv in fix.kvs}
    q_width = values[f"{arch}.embedding_length"]
    kv_width = q_width * values[f"{arch}.attention.head_count_kv"] // values[f"{arch}.attention.head_count"]
    head_dim = rng.choice([d for d in (2, 4, 8, 16, 32, 64, 128, 256) if kv_width % d == 0])
    new = {"attention.head_count": q_width // head_dim, "attention.head_count_kv": kv_width // head_dim,
           "rope.dimension_count": head_dim}
    if rng.random() < 0.3:
        new["attention.key_length"] = new["attention.value_length"] = head_dim
    if rng.random() < 0.2:  # one of them inconsistent
        key = rng.choice(sorted(new))
        new[key] = rng.choice([new[key] * 2, new[key] + 1, max(new[key] // 2, 1)])
    kvs = [kv for kv in fix.kvs if kv.key.removeprefix(f"{arch}.") not in new]
    kvs += [KV(f"{arch}.{key}", V.UINT32, value) for key, value in new.items()]
    return _edited(fix, kvs), "heads: " + ", ".join(f"{k} {v}" for k, v in new.items())


_TYPE_IDS = [int(t) for t in GGMLQuantizationType]


def m_tensor(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """One tensor's dimensions, type, offset or name changed (the data left as it is)."""
    tensors = list(fix.tensors)
    i = rng.randrange(len(tensors))
    t = tensors[i]
    action = rng.choice(["n_dims", "dim", "dim", "type", "type", "offset", "offset", "name", "drop", "duplicate"])
    if action == "n_dims":
        dims = rng.choice([t.dims + [1], t.dims + [2], t.dims[:-1], t.dims + [1, 1, 1, 1], [], t.dims[::-1]])
        new, what = replace(t, dims=dims, raw=None), f"dims {t.dims} -> {dims}"
    elif action == "dim":
        j = rng.randrange(len(t.dims))
        dims = list(t.dims)
        block = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)][0]
        dims[j] = rng.choice([0, 1, block - 1, block + 1, dims[j] - block, dims[j] + block, dims[j] * 2,
                              dims[j] // 2, 2**31, 2**32, 2**62, 2**63, 2**64 - 1, _interesting_int(rng, 64)])
        new, what = replace(t, dims=dims, raw=None), f"dims {t.dims} -> {dims}"
    elif action == "type":
        type_id = rng.choice(_TYPE_IDS + [4, 5, 40, 99, 2**31, 2**32 - 1])
        new, what = replace(t, type_id=type_id, raw=None), f"type {t.type_id} -> {type_id}"
    elif action == "offset":
        offset = rng.choice([0, 1, 2, 4, t.offset + 1, t.offset - fix.alignment, t.offset + fix.alignment,
                             rng.choice(fix.tensors).offset, len(fix.data) - fix.data_offset,
                             len(fix.data), 2**63, 2**64 - fix.alignment, _interesting_int(rng, 64)])
        new, what = replace(t, offset=offset % (1 << 64), raw=None), f"offset {t.offset} -> {offset}"
    elif action == "name":
        name = rng.choice([rng.choice(fix.tensors).name, "", t.name + "x", t.name.replace("0", "9"), "\u00e9" * 3])
        new, what = replace(t, name=name, raw=None), f"renamed to {name!r}"
    elif action == "drop":
        del tensors[i]
        return _edited(fix, tensors=tensors), f"dropped tensor {t.name}"
    else:
        tensors.insert(rng.randrange(len(tensors) + 1), t)
        return _edited(fix, tensors=tensors), f"tensor {t.name} listed twice"
    tensors[i] = new
    return _edited(fix, tensors=tensors), f"tensor {t.name}: {what}"


def m_weights(rng: random.Random, fix: Layout) -> tuple[bytes, str]:
    """One tensor's bytes overwritten (all 0xFF is NaN in every float and scale format)."""
    t = rng.choice(fix.tensors)
    start = fix.data_offset + t.offset
    n = tensor_bytes(t)
    fill = rng.choice([b"\xff", b"\x00", b"\x7f\x7c", b"\x00\x7c", b"random"])
    if fill == b"random":
        blob = rng.randbytes(min(n, 4096)) * (n // 4096 + 1)
    else:
        blob = fill * (n // len(fill) + 1)
    return fix.data[:start] + blob[:n] + fix.data[start + n:], f"tensor {t.name} filled with {fill!r}"


MUTATIONS: dict[str, tuple[float, Callable[[random.Random, Layout], tuple[bytes, str]]]] = {
    "set-field": (20, m_set_field), "truncate": (10, m_truncate), "splice": (5, m_splice),
    "flip": (13, m_flip), "retype": (9, m_retype), "value": (12, m_value), "keys": (5, m_keys),
    "alignment": (5, m_alignment), "array": (8, m_array), "tensor": (10, m_tensor), "weights": (3, m_weights),
    "heads": (4, m_heads),
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def make_case(seed: int, index: int, fixtures: Sequence[Layout]) -> tuple[bytes, str, str]:
    """(file bytes, mutation name, description) of case `index`; the same every time."""
    rng = random.Random(f"gguf-fuzz/{seed}/{index}")
    fi = rng.randrange(len(fixtures))
    names = list(MUTATIONS)
    name = rng.choices(names, weights=[MUTATIONS[n][0] for n in names])[0]
    data, what = MUTATIONS[name][1](rng, fixtures[fi])
    if data and rng.random() < 0.1 and name != "flip":  # now and then, a second fault on top
        data, more = _flip(rng, data, fixtures[fi].data_offset)
        what = f"{what}; {more}"
    return data, name, f"fixture {fi}: {what}"
