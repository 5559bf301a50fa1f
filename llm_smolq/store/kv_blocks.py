"""The prompt cache's file format: one block of a saved KV state per file, and what ties a
block to the engine that may read it (model file, kernel build, KV layout, the tokens
before it). The policy (which blocks to keep, when to read and write them) is in
prompt_cache.py.

A block file: MAGIC, the format version and the header's length (<8sII); a JSON header
(start position, parent and own digest, the KV layout, token count); the token ids, the
keys and the values; then a SHA-256 of everything before it. Its name,
``<start:08d>-<parent:16 hex>-<digest:16 hex>.kv``, places it in its chain.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from llm_smolq.engine.kv_types import KV_TYPES
from llm_smolq.errors import BadBlock
from llm_smolq.cache.atomic_file import replaced_atomically
from llm_smolq.cache.kernel_identity import kernel_fingerprint, weights_edges

if TYPE_CHECKING:
    from llm_smolq.engine.engine import Engine
    from llm_smolq.model.model_file import ModelFile

FORMAT_VERSION = 1
MAGIC = b"SMOLQKV\x00"
_PREFIX = struct.Struct("<8sII")  # magic, format version, header length
_DIGEST_BYTES = 32  # the SHA-256 of everything before it ends the file
_MAX_HEADER_BYTES = 1 << 16
HEADER_ESTIMATE = 512  # a block's JSON header is about 400 bytes
_MAX_BLOCK_TOKENS = 1 << 20
NAME = re.compile(r"^(\d{8})-([0-9a-f]{16})-([0-9a-f]{16})\.kv$")  # block_name()'s form


# -- what makes a saved state usable by an engine ---------------------------------------------
@dataclass(frozen=True)
class KVLayout:
    kv_dtype: str
    n_layers: int
    n_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, engine: Engine) -> KVLayout:
        c = engine.config
        return cls(engine.kv_dtype, c.n_layers, c.n_kv_heads, c.head_dim)

    @property
    def dtype(self) -> np.dtype:  # native byte order: the byte order is part of the chain's root
        return KV_TYPES[self.kv_dtype].dtype

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * KV_TYPES[self.kv_dtype].row_bytes(self.head_dim)

    def shape(self, n: int) -> tuple[int, int, int, int]:
        return (self.n_layers, self.n_kv_heads, n, KV_TYPES[self.kv_dtype].row_items(self.head_dim))


def model_fingerprint(model: ModelFile) -> dict:
    """Cheap but enough to notice a changed file: its size and mtime, the digest of its
    header (metadata, vocabulary, tensor table) taken when it was opened, and a hash of
    the first and last MiB of weights, read from the engine's own mapping, so it
    describes the weights the engine runs."""
    st = os.stat(model.path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "header": model.digest, "sha256": weights_edges(model)}


_roots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_root(engine: Engine) -> str:
    """The digest every chain for this engine starts from: blocks made by another model
    file, kernel build, KV layout, RoPE scaling or format version can never be found from
    it (the cached keys are rotated by the angles the scaling gives)."""
    root = _roots.get(engine)
    if root is None:
        scaling = engine.config.rope_scaling
        identity = {
            "format": FORMAT_VERSION,
            "model": model_fingerprint(engine.model),
            "kernel": kernel_fingerprint(),
            "byteorder": sys.byteorder,
            "layout": KVLayout.of(engine).__dict__,
            "rope_scaling": scaling.__dict__ if scaling else None,
        }
        root = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        _roots[engine] = root
    return root


def chain_digest(parent: str, tokens: np.ndarray) -> str:
    return hashlib.sha256(b"smolq-kv-block" + bytes.fromhex(parent) + _ids_bytes(tokens)).hexdigest()


def _ids_bytes(tokens: np.ndarray | Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(differ[0]) if len(differ) else n


# -- block files ----------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockHead:
    """A block file's header and token ids, read and checked without its keys and values."""

    path: Path
    parent: str
    digest: str
    start: int
    tokens: np.ndarray  # int32
    layout: KVLayout
    model_file: str
    size: int
    inode: int


def block_name(start: int, parent: str, digest: str) -> str:
    return f"{start:08d}-{parent[:16]}-{digest[:16]}.kv"


def block_bytes(header_len: int, n: int, layout: KVLayout) -> int:
    return _PREFIX.size + header_len + 4 * n + n * layout.bytes_per_token + _DIGEST_BYTES


def write_block(directory: Path, parent: str, start: int, tokens: np.ndarray, k: np.ndarray, v: np.ndarray,
                layout: KVLayout, model_file: str) -> Path:
    """Write one block atomically (a reader sees the whole file or none); a file torn by a
    crash fails its digest when read."""
    n = len(tokens)
    digest = chain_digest(parent, tokens)
    header = json.dumps({
        "parent": parent, "digest": digest, "start": start, "n_tokens": n, **layout.__dict__,
        "model_file": model_file, "created": time.time(),
    }, sort_keys=True).encode()
    k = np.ascontiguousarray(k, layout.dtype)
    v = np.ascontiguousarray(v, layout.dtype)
    if k.shape != layout.shape(n) or v.shape != layout.shape(n):
        raise ValueError(f"write_block: keys {k.shape} / values {v.shape} do not match {layout.shape(n)}")
    parts = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header, _ids_bytes(tokens),
             memoryview(k).cast("B"), memoryview(v).cast("B")]
    final = directory / block_name(start, parent, digest)
    h = hashlib.sha256()
    with replaced_atomically(final) as f:
        for part in parts:
            h.update(part)
            f.write(part)
        f.write(h.digest())
    return final


def _parse_head(path: Path, data: bytes, file_size: int, inode: int) -> BlockHead:
    """Check what the first bytes of a block file claim; `data` holds at least the
    prefix, header and token ids (the whole file when it is being loaded)."""
    if len(data) < _PREFIX.size:
        raise BadBlock("shorter than its fixed header", inode)
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise BadBlock("not a prompt cache block", inode)
    if version != FORMAT_VERSION:
        raise BadBlock(f"format version {version}, this llm-smolq reads {FORMAT_VERSION}", inode)
    if not 0 < header_len <= _MAX_HEADER_BYTES or len(data) < _PREFIX.size + header_len:
        raise BadBlock("header length out of range", inode)
    try:
        meta = json.loads(data[_PREFIX.size:_PREFIX.size + header_len])
        layout = KVLayout(meta["kv_dtype"], meta["n_layers"], meta["n_kv_heads"], meta["head_dim"])
        parent, digest, start, n = meta["parent"], meta["digest"], meta["start"], meta["n_tokens"]
        model_file = meta["model_file"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadBlock(f"unreadable header ({exc})", inode) from None
    counts = (layout.n_layers, layout.n_kv_heads, layout.head_dim, n, start)
    if (not isinstance(layout.kv_dtype, str) or layout.kv_dtype not in KV_TYPES
            or not all(type(x) is int for x in counts)
            or not all(0 < x <= 1 << 16 for x in counts[:3]) or layout.head_dim % KV_TYPES[layout.kv_dtype].per_item
            or not 0 < n <= _MAX_BLOCK_TOKENS or start < 0
            or not all(isinstance(x, str) and re.fullmatch(r"[0-9a-f]{64}", x) for x in (parent, digest))
            or not isinstance(model_file, str)):
        raise BadBlock("header values out of range", inode)
    if path.name != block_name(start, parent, digest):
        raise BadBlock("its name does not match its header", inode)
    if file_size != block_bytes(header_len, n, layout):
        raise BadBlock(f"{file_size} bytes where the header implies {block_bytes(header_len, n, layout)} "
                       "(truncated or padded)", inode)
    at = _PREFIX.size + header_len
    if len(data) < at + 4 * n:
        raise BadBlock("token ids cut short", inode)
    tokens = np.frombuffer(data, "<i4", n, at).astype(np.int32)
    if chain_digest(parent, tokens) != digest:
        raise BadBlock("its token ids do not match its digest", inode)
    return BlockHead(path, parent, digest, start, tokens, layout, model_file, file_size, inode)


def read_head(path: Path) -> BlockHead:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        first = f.read(_PREFIX.size)
        header_len = _PREFIX.unpack_from(first)[2] if len(first) == _PREFIX.size else 0
        rest = f.read(min(header_len, _MAX_HEADER_BYTES))
        try:  # the token count is in the header; read just enough for the ids
            n = json.loads(rest)["n_tokens"]
            ids = f.read(4 * n) if type(n) is int and 0 < n <= _MAX_BLOCK_TOKENS else b""
        except (ValueError, KeyError, TypeError):
            ids = b""
    return _parse_head(path, first + rest + ids, st.st_size, st.st_ino)


def read_block(head: BlockHead) -> tuple[np.ndarray, np.ndarray]:
    """The block's keys and values, each [n_layers, n_kv_heads, n, row], after the
    whole file has matched its SHA-256 and the header read earlier."""
    with open(head.path, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read()
    if len(data) != st.st_size or len(data) < _DIGEST_BYTES:
        raise BadBlock("changed while being read", st.st_ino)
    body = memoryview(data)[:-_DIGEST_BYTES]
    if hashlib.sha256(body).digest() != data[-_DIGEST_BYTES:]:
        raise BadBlock("checksum mismatch (the file is damaged)", st.st_ino)
    again = _parse_head(head.path, data, len(data), st.st_ino)
    if (again.digest, again.start, again.layout) != (head.digest, head.start, head.layout):
        raise BadBlock("replaced by a different block while being read", st.st_ino)
    n, layout = len(again.tokens), again.layout
    shape = layout.shape(n)
    half = n * layout.bytes_per_token // 2  # keys, then values, just before the digest
    k_at = len(data) - _DIGEST_BYTES - 2 * half
    k = np.frombuffer(data, layout.dtype, half // layout.dtype.itemsize, k_at).reshape(shape)
    v = np.frombuffer(data, layout.dtype, half // layout.dtype.itemsize, k_at + half).reshape(shape)
    return k, v
