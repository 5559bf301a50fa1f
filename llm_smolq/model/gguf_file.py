"""A bounds-checked reader for the GGUF header: metadata and tensor index.

gguf.GGUFReader builds a numpy view for every string of every array, which takes seconds
on a 49k-token vocabulary, and a malformed count or length surfaces from it as whatever
numpy raises. This reader walks the same format (constants from the `gguf` package) in
a fraction of a second, checks every length against the bytes that remain before using
it, and raises GGUFError saying what is wrong and where.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from llm_smolq.cache import header_cache
from llm_smolq.errors import GGUFError, brief

MAX_DIMS = 4  # ggml tensors have at most four dimensions
MAX_ARRAY_DEPTH = 4

SCALAR_CODES = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}


@dataclass(frozen=True)
class RawTensor:
    name: str
    type_id: int  # not yet checked against known types
    shape: tuple[int, ...]  # GGUF order: shape[0] is contiguous
    offset: int  # absolute byte offset in the file


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[RawTensor]
    alignment: int
    data_offset: int  # where the tensor data section starts
    file_size: int
    little_endian: bool = True
    header_bytes: int = 0  # length of the parsed part (everything before the padding)
    digest: str = ""  # blake2b of those bytes: equal digests and sizes parse equal


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: str, order: str):
        self.buf, self.path, self.order, self.pos = buf, path, order, 0

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what} (at byte {self.pos} of {len(self.buf)})")

    def need(self, n: int, what: str, at_least: bool = False) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            end, needs = len(self.buf), f"{'at least ' if at_least else ''}{n} bytes"
            raise GGUFError(
                f"{self.path}: {what} needs {needs} at byte {self.pos}, but the file ends at byte {end} "
                f"({end - self.pos} bytes left); the file is truncated or corrupt: download it again"
            )

    def scalar(self, code: str, what: str) -> Any:
        fmt = struct.Struct(self.order + code)
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string(what)
        if kind == GGUFValueType.ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
            item = self.scalar("I", what)
            count = self.scalar("Q", what)
            code = SCALAR_CODES.get(item)
            if code is not None:
                size = count * struct.calcsize(code)
                self.need(size, f"{what}: array of {count} items")
                values = list(struct.unpack_from(f"{self.order}{count}{code}", self.buf, self.pos))
                self.pos += size
                return values
            # strings / nested arrays take at least 8 bytes each: bound the count first
            self.need(count * 8, f"{what}: array of {count} items", at_least=True)
            return [self.value(item, what, depth + 1) for _ in range(count)]
        code = SCALAR_CODES.get(kind)
        if code is None:
            raise self.fail(f"{what} has unknown value type {kind}; the file is corrupt")
        return self.scalar(code, what)


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise GGUFError(f"{path}: the file is empty")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return _parse(buf, path)
    finally:
        buf.close()


def _parse(buf: mmap.mmap, path: str) -> GGUFHeader:
    magic = struct.pack("<I", GGUF_MAGIC)
    if buf[:4] != magic[:len(buf)]:
        raise GGUFError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
    if len(buf) < 24:  # a GGUF's start, cut short
        size = f"{len(buf)} byte{'s' if len(buf) > 1 else ''}"
        raise GGUFError(f"{path}: the file is {size} long, shorter than the 24-byte GGUF header (magic, version, "
                        "tensor and metadata counts); it is truncated: download it again")
    # A version whose low half is zero was written on a machine of the other byte order.
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
    cur = _Cursor(buf, path, order)
    cur.pos = 4
    version = cur.scalar("I", "version")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors = cur.scalar("Q", "tensor count")
    n_kv = cur.scalar("Q", "metadata count")
    remaining = len(buf) - cur.pos
    if n_kv > remaining // 12 or n_tensors > remaining // 24:  # smallest possible entries
        raise GGUFError(f"{path}: the header claims {n_kv} metadata entries and {n_tensors} tensors, more than the "
                        f"{remaining} bytes after it can hold; the file is truncated or corrupt: download it again")

    metadata: dict[str, Any] = {}
    for j in range(n_kv):
        key = cur.string(f"metadata key {j}")
        if key in metadata:  # which of the two would be meant is anyone's guess
            raise cur.fail(f"metadata key {brief(key)} appears twice; the file is corrupt")
        kind = cur.scalar("I", f"type of {brief(key)}")
        metadata[key] = cur.value(kind, f"metadata {brief(key)}")

    raw: list[tuple[str, int, tuple[int, ...], int]] = []
    for i in range(n_tensors):
        name = cur.string(f"name of tensor {i}")
        n_dims = cur.scalar("I", f"dimension count of tensor {brief(name)}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {brief(name)} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(cur.scalar("Q", f"shape of tensor {brief(name)}") for _ in range(n_dims))
        type_id = cur.scalar("I", f"type of tensor {brief(name)}")
        offset = cur.scalar("Q", f"offset of tensor {brief(name)}")
        raw.append((name, type_id, shape, offset))

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{path}: general.alignment = {brief(alignment)} is not a power of two; the file is corrupt")
    data_offset = -(-cur.pos // alignment) * alignment
    names = set()
    tensors = []
    for name, type_id, shape, offset in raw:
        if name in names:
            raise GGUFError(f"{path}: tensor {brief(name)} appears twice; the file is corrupt")
        names.add(name)
        tensors.append(RawTensor(name, type_id, shape, data_offset + offset))
    digest = hashlib.blake2b(buf[:cur.pos], digest_size=20).hexdigest()
    return GGUFHeader(version, metadata, tensors, alignment, data_offset, len(buf), order == "<", cur.pos, digest)


def read_header_cached(path: str) -> GGUFHeader:
    """read_header(path), from the header cache when the file's header is unchanged: an
    entry kept for the file's present state is used only if the file's size matches and
    its header bytes still hash to the digest recorded when it was parsed."""
    entry = header_cache.entry_for(path)
    if entry is not None:
        cached = header_cache.load(entry)
        if cached is not None:
            header = _header_from(cached)
            if (
                header is not None
                and header.file_size == os.path.getsize(path)
                and header_digest(path, header.header_bytes) == header.digest
            ):
                return header
    header = read_header(path)
    if entry is not None:
        header_cache.store(entry, _header_to(header))
    return header


def _header_to(h: GGUFHeader) -> tuple:
    """The header as plain values, which the header cache keeps (with marshal)."""
    tensors = [(t.name, t.type_id, t.shape, t.offset) for t in h.tensors]
    return (h.version, h.metadata, tensors, h.alignment, h.data_offset, h.file_size, h.little_endian,
            h.header_bytes, h.digest)


def _header_from(value) -> GGUFHeader | None:
    try:
        version, metadata, tensors, alignment, data_offset, file_size, little, n_bytes, digest = value
        return GGUFHeader(version, metadata, [RawTensor(*t) for t in tensors], alignment, data_offset,
                          file_size, little, n_bytes, digest)
    except (TypeError, ValueError):
        return None


def header_digest(path: str, n_bytes: int) -> str | None:
    """The digest a parse of path's first n_bytes would record, or None if the file
    is shorter or unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(n_bytes)
    except OSError:
        return None
    return hashlib.blake2b(data, digest_size=20).hexdigest() if len(data) == n_bytes else None


def type_name(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"unknown type {type_id}"
