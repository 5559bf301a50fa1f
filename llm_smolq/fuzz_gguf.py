"""Fuzz the GGUF loader: seeded mutations of small valid models, each loaded and run in a
child process, so that a crash or a hang is caught and named by its case.

    python -m llm_smolq.fuzz_gguf --cases 100000 --seed 1 [--jobs 2] [--fixture F.gguf ...]
    python -m llm_smolq.fuzz_gguf --seed 1 --case 4711      # replay one case, in-process

A case is a pure function of (seed, case number, fixture list). The fixtures are small
synthetic models (llm_smolq.synth) in several tensor types, plus any --fixture files. Each
case mutates one of them: header counts, string and array lengths, value types, metadata
values, tensor dimensions, types and offsets, general.alignment, truncation at a region
boundary, inserted or deleted bytes, flipped bytes, corrupted weights. It then loads the
result, runs a forward pass and, if the file gets that far, tokenizes.

A case passes when the file is refused with a GGUFError whose message says what is wrong,
or when it loads, every weight matrix the kernel will read lies inside the file by the
kernel's own block geometry, the forward pass gives finite logits (or a GGUFError), and
tokenizing gives ids (or a GGUFError). Anything else - another exception, a crash, a run
longer than --timeout - is a failure, reported with its seed and case number.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES

from .errors import GGUFError
from .gguf_file import SCALAR_CODES

V = GGUFValueType
DEFAULT_TARGET = "llm_smolq.fuzz_gguf:exercise"
N_CTX = 16
MAX_MESSAGE = 1000  # characters, besides the file's path
TEXT = "Hello world 123 <|im_start|>user\nhé🙂\t  x<|im_end|>"

# ---------------------------------------------------------------------------------------
# Fixtures: small valid models of the shapes the engine supports
# ---------------------------------------------------------------------------------------

#: (name, architecture, layers, tensor type). dim 256 is the smallest width the K-quants
#: allow; four smollm3 layers include one that skips RoPE.
FIXTURES = (
    ("smollm3-Q8_0", "smollm3", 4, "Q8_0"),
    ("smollm3-Q4_K_M", "smollm3", 4, "Q4_K_M"),
    ("smollm3-IQ4_XS", "smollm3", 4, "IQ4_XS"),
    ("llama-Q5_1", "llama", 2, "Q5_1"),
    ("llama-F16", "llama", 2, "F16"),
)


def make_fixtures(directory: str | os.PathLike[str]) -> list[Path]:
    """Write the synthetic fixtures into `directory` (kept if already there)."""
    from .synth import Preset, write_synthetic

    Path(directory).mkdir(parents=True, exist_ok=True)
    out = []
    for name, arch, layers, qtype in FIXTURES:
        path = Path(directory) / f"fixture-{name}.gguf"
        if not path.exists():
            preset = Preset(arch, 256, layers, 4, 2, 64, 256, 320, 64, 1e4 if arch == "llama" else 5e6, 1e-5)
            write_synthetic(path, preset, qtype, seed=7)
        out.append(path)
    return out


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


# ---------------------------------------------------------------------------------------
# One case: what the loader, the engine and the tokenizer must do with a file
# ---------------------------------------------------------------------------------------

class FuzzFailure(AssertionError):
    """A case that broke a rule without raising something else first."""


def check_message(err: GGUFError, path: str) -> None:
    """A GGUFError must say what is wrong, in a message a person can read."""
    text = str(err).replace(path, "").strip(" :")
    if not 12 <= len(text) <= MAX_MESSAGE:
        raise FuzzFailure(f"GGUFError message of {len(text)} characters: {str(err)[:MAX_MESSAGE]!r}")


def exercise(path: str) -> str:
    """Load, check what the kernel will read, run a forward pass, tokenize. Returns how far
    the file got; raises GGUFError if it was refused at load, anything else on a failure."""
    import numpy as np

    from .engine import Engine
    from .model_file import open_model

    model = open_model(path)
    # As the plugin does: the context capped at the model's own.
    eng = Engine(model, n_ctx=min(N_CTX, model.config.context_length), threads=1)
    check_extents(eng)
    vocab = model.config.vocab_size
    ids = [(7 * i + 1) % vocab for i in range(min(3, eng.n_ctx))]
    try:
        for batch in (ids, ids[:1]) if eng.n_ctx > len(ids) else (ids,):
            logits = eng.eval(batch)
            if logits.shape != (vocab,) or not np.isfinite(logits).all():
                raise FuzzFailure(f"eval gave {logits.shape} logits, finite: {np.isfinite(logits).all()}")
    except GGUFError as err:
        check_message(err, path)
        return "refused at eval"
    try:
        for special in (True, False):
            got = eng.tokenize(TEXT, special=special)
            if not all(isinstance(i, int) and 0 <= i < vocab for i in got):
                raise FuzzFailure(f"tokenize gave ids outside the vocabulary: {got}")
            eng.detokenize(got)
    except GGUFError as err:
        check_message(err, path)
        return "tokenizer refused"
    return "ran"


def check_extents(eng: Any) -> None:
    """Every matrix handed to C lies inside the file, by the kernel's own block sizes."""
    from ._kernel import ffi, lib

    base = int(ffi.cast("uintptr_t", eng._weights))
    size = len(eng.model.data)
    m = eng._c_model
    tensors = [("token_embd", m.token_embd), ("output_norm", m.output_norm), ("output", m.output)]
    for i in range(m.cfg.n_layers):
        layer = m.layers[i]
        tensors += [(f"blk.{i}.{f}", getattr(layer, f)) for f in
                    ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    for name, t in tensors:
        elems, block = lib.sq_block_elems(t.type), lib.sq_block_bytes(t.type)
        if elems <= 0 or t.cols % elems or t.rows < 1:
            raise FuzzFailure(f"{name}: type {t.type} with {t.cols} columns reached the kernel")
        start = int(ffi.cast("uintptr_t", t.data)) - base
        end = start + (t.rows - 1) * t.row_bytes + t.cols // elems * block
        if t.cols // elems * block > t.row_bytes or start < 0 or end > size:
            raise FuzzFailure(f"{name}: the kernel would read bytes {start}..{end} of a {size}-byte file")


# ---------------------------------------------------------------------------------------
# Running cases: a worker process runs a range; the parent watches it for crashes and hangs
# ---------------------------------------------------------------------------------------

def _load_target(spec: str) -> Callable[[str], str]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def run_one(seed: int, index: int, fixtures: Sequence[Layout], path: str,
            target: Callable[[str], str] = exercise) -> tuple[str, str, str | None]:
    """Write case `index` to `path` and run it: (mutation, outcome, failure detail or None)."""
    data, name, what = make_case(seed, index, fixtures)
    with open(path, "wb") as f:
        f.write(data)
    try:
        outcome = target(path)
    except GGUFError as err:
        try:
            check_message(err, path)
        except FuzzFailure as bad:
            return name, "failure", f"{what}\n{bad}"
        return name, "rejected", None
    except Exception as err:
        detail = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:])
        return name, "failure", f"{what}\n{type(err).__name__}: {err}\n{detail}"
    return name, outcome, None


def _worker(args: argparse.Namespace) -> int:
    import faulthandler
    import resource

    faulthandler.enable()  # a crash prints the Python stack to stderr, which the parent keeps
    # A runaway allocation becomes a MemoryError (a failure) instead of a swapping machine.
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, hard))
    report = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the report stream
    fixtures = [parse(Path(p).read_bytes()) for p in args.fixture]
    target = _load_target(args.target)
    report.write("ready\n")
    for index in range(args.start, args.stop):
        report.write(f"start {index}\n")
        name, outcome, detail = run_one(args.seed, index, fixtures, args.case_file, target)
        if detail is not None and args.save_failures:
            _save(args.case_file, args.save_failures, args.seed, index)
        report.write(json.dumps({"case": index, "mutation": name, "outcome": outcome, "detail": detail}) + "\n")
    return 0


def _save(case_file: str | os.PathLike[str], directory: str | os.PathLike[str], seed: int, index: int) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)
    shutil.copy(case_file, Path(directory) / f"seed{seed}-case{index}.gguf")


@dataclass
class Report:
    seed: int
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_mutation: dict[str, Counter] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, case: int, mutation: str, outcome: str, detail: str | None = None) -> None:
        self.cases += 1
        self.outcomes[outcome] += 1
        self.by_mutation.setdefault(mutation, Counter())[outcome] += 1
        if detail is not None:
            self.failures.append({"case": case, "mutation": mutation, "kind": outcome, "detail": detail})

    @property
    def loaded(self) -> int:
        return sum(self.outcomes[k] for k in LOADED)

    def summary(self) -> str:
        lines = [f"seed {self.seed}: {self.cases} cases in {self.seconds:.1f} s "
                 f"({self.cases / max(self.seconds, 1e-9):.0f}/s); loaded {self.loaded}, "
                 f"rejected {self.outcomes['rejected']}, failures {len(self.failures)}",
                 "  outcomes: " + ", ".join(f"{k} {n}" for k, n in self.outcomes.most_common())]
        for name in sorted(self.by_mutation):
            counts = self.by_mutation[name]
            lines.append(f"  {name:10s} " + ", ".join(f"{k} {n}" for k, n in counts.most_common()))
        for f in self.failures[:20]:
            lines.append(f"FAILURE case {f['case']} ({f['kind']}, {f['mutation']}); replay with "
                         f"--seed {self.seed} --case {f['case']}:\n    " + f["detail"].replace("\n", "\n    "))
        return "\n".join(lines)


LOADED = ("ran", "refused at eval", "tokenizer refused")
WORKER_MEMORY = 8 << 30  # address space per worker


class _Job:
    """A worker process running cases [start, stop), and what the parent knows of it."""

    def __init__(self, cmd: list[str], start: int, stop: int, work: Path, number: int, timeout: float):
        self.stop = stop
        self.current: int | None = None  # the case it started and has not reported
        self.case_file = work / f"case-{number}.gguf"
        self.log_path = work / f"worker-{number}.log"
        self.log = open(self.log_path, "wb")
        # The workers import this same package, wherever the parent found it.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            cmd + ["--start", str(start), "--stop", str(stop), "--case-file", str(self.case_file)],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        self.buffer = b""
        self.deadline = time.monotonic() + timeout + 120  # imports and fixture parsing come first

    def stderr_tail(self) -> str:
        self.log.flush()
        return self.log_path.read_bytes()[-3000:].decode("utf-8", "replace").strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


def _fast_tmp() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def run(seed: int, cases: int, fixture_paths: Sequence[str | os.PathLike[str]], *, start: int = 0,
        jobs: int = 1, timeout: float = 20.0, workdir: str | os.PathLike[str] | None = None,
        target: str = DEFAULT_TARGET, progress: Callable[[str], None] | None = None,
        save_failures: str | os.PathLike[str] | None = None) -> Report:
    """Run cases [start, start + cases) in `jobs` worker processes and report what happened.
    A worker that dies, or takes longer than `timeout` seconds on a case, is recorded as a
    crash or a hang of that case, and a new worker carries on after it."""
    work = Path(workdir or tempfile.mkdtemp(prefix="gguf-fuzz-", dir=_fast_tmp()))
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "llm_smolq.fuzz_gguf", "--worker", "--seed", str(seed), "--target", target]
    for p in fixture_paths:
        cmd += ["--fixture", os.fspath(p)]
    if save_failures is not None:
        cmd += ["--save-failures", os.fspath(save_failures)]
    fixtures = [parse(Path(p).read_bytes()) for p in fixture_paths]
    report = Report(seed)
    began = last_note = time.monotonic()
    cuts = [start + cases * j // jobs for j in range(jobs + 1)]
    pending = [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if lo < hi]
    running: list[_Job] = []
    spawned = 0

    def lost(job: _Job, kind: str, detail: str) -> None:
        """The worker died or hung in its current case: record it, go on after it."""
        index = job.current
        _, name, what = make_case(seed, index, fixtures)
        report.add(index, name, kind, f"{what}\n{detail}")
        if save_failures is not None:
            _save(job.case_file, save_failures, seed, index)
        if index + 1 < job.stop:
            pending.append((index + 1, job.stop))

    try:
        while pending or running:
            while pending:
                spawned += 1
                running.append(_Job(cmd, *pending.pop(), work, spawned, timeout))
            wait = max(0.0, min(j.deadline for j in running) - time.monotonic())
            ready, _, _ = select.select([j.proc.stdout for j in running], [], [], wait)
            for job in list(running):
                if job.proc.stdout in ready:
                    chunk = os.read(job.proc.stdout.fileno(), 1 << 16)
                    if not chunk:  # the worker has exited
                        rc = job.proc.wait()
                        if job.current is not None:
                            why = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
                            lost(job, "crash", f"the worker died ({why}); its stderr ends:\n{job.stderr_tail()}")
                        elif rc != 0:
                            raise RuntimeError(f"a fuzz worker failed outside any case:\n{job.stderr_tail()}")
                        running.remove(job)
                        job.close()
                        continue
                    job.buffer += chunk
                    *lines, job.buffer = job.buffer.split(b"\n")
                    for line in lines:
                        if line.startswith(b"start "):
                            job.current = int(line[6:])
                        elif line.startswith(b"{"):
                            rec = json.loads(line)
                            report.add(rec["case"], rec["mutation"], rec["outcome"], rec["detail"])
                            job.current = None
                    job.deadline = time.monotonic() + timeout
                elif time.monotonic() > job.deadline:
                    running.remove(job)
                    job.close()
                    if job.current is None:
                        raise RuntimeError(f"a fuzz worker did not start in time:\n{job.stderr_tail()}")
                    lost(job, "hang", f"no result after {timeout:g} s; the worker was killed")
            if progress and time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                progress(f"{report.cases}/{cases} cases, {report.loaded} loaded, "
                         f"{len(report.failures)} failures, {last_note - began:.0f} s")
    finally:
        for job in running:
            job.close()
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    report.seconds = time.monotonic() - began
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llm_smolq.fuzz_gguf", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--case", type=int, help="replay this one case in this process and show what it did")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds a case may take before it is a hang")
    ap.add_argument("--fixture", action="append", default=[], help="another valid GGUF to mutate (repeatable)")
    ap.add_argument("--workdir", help="keep fixtures and case files here (default: a temporary directory)")
    ap.add_argument("--save-failures", metavar="DIR", help="copy the file of every failing case into DIR")
    ap.add_argument("--target", default=DEFAULT_TARGET, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--case-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)

    scratch = args.workdir or tempfile.mkdtemp(prefix="gguf-fuzz-", dir=_fast_tmp())
    try:
        fixtures = [str(p) for p in make_fixtures(scratch)] + [os.path.abspath(f) for f in args.fixture]
        if args.case is not None:
            layouts = [parse(Path(p).read_bytes()) for p in fixtures]
            path = os.path.join(scratch, f"case-{args.case}.gguf")
            name, outcome, detail = run_one(args.seed, args.case, layouts, path, _load_target(args.target))
            print(f"case {args.case} ({name}): {make_case(args.seed, args.case, layouts)[2]}\n-> {outcome}")
            if detail:
                print(detail)
                if args.save_failures:
                    _save(path, args.save_failures, args.seed, args.case)
            return 1 if detail else 0
        report = run(args.seed, args.cases, fixtures, start=args.start, jobs=args.jobs, timeout=args.timeout,
                     workdir=os.path.join(scratch, "cases"), target=args.target, save_failures=args.save_failures,
                     progress=lambda note: print(note, file=sys.stderr, flush=True))
    finally:
        if not args.workdir:
            shutil.rmtree(scratch, ignore_errors=True)
    print(report.summary())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
