"""Reading a GGUF file into a validated model description.

The weights stay in the file's memory map: nothing is copied or dequantized here. Every
tensor the kernel will read is checked first (type known, byte size = shape x block size,
offset + size inside the file, alignment as the header says), so a hostile or truncated
file is a GGUFError at load, never a read past the mapping later.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from llm_smolq.errors import GGUFError, brief
from llm_smolq.model.gguf_file import GGUFHeader, read_header_cached, type_name
from llm_smolq.model.tensor_types import weight_types

ARCHITECTURES = ("smollm3", "llama")
C_INT_MAX = 2**31 - 1  # sizes reach the kernel as C int
MAX_HEADS = 1 << 16  # the kernel counts (token, head) tasks of a batch in an int
_F32_MIN_NORMAL, _F32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38  # floats reach it as float



@dataclass(frozen=True)
class LayerTensor:
    """A weight every layer has: its GGUF name (blk.N.<name>.weight), the sq_layer field
    the kernel reads it as (smolq.h), and its GGUF shape, contiguous dimension first, from
    the model's sizes: shape(dim, q, kv, ffn) with q = n_heads * head_dim and
    kv = n_kv_heads * head_dim. A norm (one dimension) is F32."""

    name: str
    field: str
    shape: Callable[[int, int, int, int], tuple[int, ...]]


#: The one list of a layer's tensors: the file check, the engine's kernel structs, the
#: synthetic-model writer and the fuzzer's kernel-view check all read it.
LAYER_TENSORS = (
    LayerTensor("attn_norm", "attn_norm", lambda dim, q, kv, ffn: (dim,)),
    LayerTensor("attn_q", "wq", lambda dim, q, kv, ffn: (dim, q)),
    LayerTensor("attn_k", "wk", lambda dim, q, kv, ffn: (dim, kv)),
    LayerTensor("attn_v", "wv", lambda dim, q, kv, ffn: (dim, kv)),
    LayerTensor("attn_output", "wo", lambda dim, q, kv, ffn: (q, dim)),
    LayerTensor("ffn_norm", "ffn_norm", lambda dim, q, kv, ffn: (dim,)),
    LayerTensor("ffn_gate", "ffn_gate", lambda dim, q, kv, ffn: (dim, ffn)),
    LayerTensor("ffn_up", "ffn_up", lambda dim, q, kv, ffn: (dim, ffn)),
    LayerTensor("ffn_down", "ffn_down", lambda dim, q, kv, ffn: (ffn, dim)),
)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    dim: int
    hidden_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int  # positions the model was trained for
    rope_theta: float
    rms_eps: float
    nope_layers: tuple[int, ...]  # layers that skip RoPE (SmolLM3: every 4th)
    tied_embeddings: bool
    rope_scaling: RopeScaling | None = None  # YaRN, where the file declares it

    @property
    def window(self) -> int:
        """Positions the model can attend over: its trained context, or YaRN's extension."""
        return self.context_length if self.rope_scaling is None else max(self.context_length,
                                                                          self.rope_scaling.window)

    def with_yarn(self, factor: float) -> ModelConfig:
        """This model with YaRN by `factor` over its own context (the user's choice)."""
        return replace(self, rope_scaling=RopeScaling(float(factor), self.context_length))


@dataclass(frozen=True)
class RopeScaling:
    """YaRN as llama.cpp applies it: the angles of the low frequencies interpolated by
    `factor` over the `original_context` positions the model was trained for, so that it
    attends over factor x as many (beta_fast, beta_slow: the ramp's corners)."""

    factor: float
    original_context: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @property
    def window(self) -> int:
        return int(self.original_context * self.factor)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: QT
    shape: tuple[int, ...]  # GGUF order: shape[0] is the contiguous dimension
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def rows(self) -> int:
        return math.prod(self.shape[1:])  # Python ints: no silent int64 wrap-around

    @property
    def row_bytes(self) -> int:
        return self.n_bytes // self.rows


@dataclass
class ModelFile:
    path: str
    config: ModelConfig
    tensors: dict[str, TensorInfo]
    metadata: dict[str, Any]
    data: np.memmap = field(repr=False)  # the whole file, read-only
    digest: str = ""  # of the header's bytes: names what is cached for this header
    # os.fstat of the file as it was mapped (the weights' digest is remembered by it).
    stat: os.stat_result | None = field(default=None, repr=False, compare=False)
    # The tensors packed for the kernel (engine/packing.py): where each starts in
    # packed_data, once decided.
    packed: dict[str, int] | None = field(default=None, repr=False)
    packed_data: np.ndarray | None = field(default=None, repr=False)
    # The entry this process wrote to keep them on disk (cache/packed_cache.py), until told.
    packed_kept: Path | None = field(default=None, repr=False)
    pack_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


def open_model(path: str | os.PathLike[str]) -> ModelFile:
    """Parse and validate a GGUF model file; raises GGUFError saying what is wrong."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GGUFError(f"{path}: no such file")
    header = read_header_cached(path)
    if not header.little_endian:
        raise GGUFError(f"{path}: the file is big-endian; llm-smolq reads little-endian weights only, "
                        "so use the model's ordinary (little-endian) GGUF")
    tensors = _tensor_infos(path, header)
    config = _config(path, header.metadata, tensors)
    _check_model_tensors(path, config, tensors)
    with open(path, "rb") as f:
        mapped = os.fstat(f.fileno())
        data = np.memmap(f, dtype=np.uint8, mode="r")
    return ModelFile(path=path, config=config, tensors=tensors, metadata=header.metadata, data=data,
                     digest=header.digest, stat=mapped)


def _tensor_infos(path: str, header: GGUFHeader) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    for t in header.tensors:
        where = f"{path}: tensor {brief(t.name)}"
        if t.type_id not in weight_types():
            known = t.type_id in {int(q) for q in QT}
            kind = f"type {type_name(t.type_id)}" if known else f"an unknown type ({t.type_id})"
            raise GGUFError(
                f"{where} has {kind}, which llm-smolq cannot read; supported: "
                + ", ".join(weight_types().values())
            )
        qtype = QT(t.type_id)
        if any(d <= 0 for d in t.shape):
            raise GGUFError(f"{where} has an invalid shape {list(t.shape)}")
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        if t.shape[0] % block:
            raise GGUFError(f"{where}: row length {t.shape[0]} is not a multiple of the {qtype.name} block ({block})")
        n_elements = 1
        for d in t.shape:  # Python ints: no overflow, however large the claim
            n_elements *= d
        n_bytes = n_elements // block * block_bytes
        if t.offset % header.alignment:
            raise GGUFError(f"{where}: offset {t.offset} is not aligned to {header.alignment} bytes")
        if t.offset + n_bytes > header.file_size:
            raise GGUFError(
                f"{where} (shape {list(t.shape)}, {n_bytes} bytes at offset {t.offset}) ends past the end of "
                f"the file ({header.file_size} bytes); the file is truncated or corrupt: download it again"
            )
        infos[t.name] = TensorInfo(t.name, qtype, t.shape, t.offset, n_bytes)
    return infos


def _config(path: str, meta: dict[str, Any], tensors: dict[str, TensorInfo]) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {brief(arch)} is not supported; llm-smolq runs {', '.join(ARCHITECTURES)} models"
        )

    def get(key: str, default: Any = None, kind: type = int) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"{path}: metadata key {arch}.{key} is missing")
        if kind is int and (type(value) is not int or not 0 < value <= C_INT_MAX):
            raise GGUFError(f"{path}: {arch}.{key} = {brief(value)} must be an integer from 1 to {C_INT_MAX}")
        if kind is float and (type(value) not in (int, float) or not _F32_MIN_NORMAL <= value <= _F32_MAX):
            raise GGUFError(f"{path}: {arch}.{key} = {brief(value)} must be a positive number that fits a float32 "
                            f"({_F32_MIN_NORMAL:.3g} to {_F32_MAX:.3g})")
        return kind(value)

    n_layers = get("block_count")
    if len(LAYER_TENSORS) * n_layers > len(tensors):  # bound the work before doing it per layer
        raise GGUFError(f"{path}: {arch}.block_count = {n_layers}, but the file has only {len(tensors)} tensors, "
                        f"fewer than the {len(LAYER_TENSORS)} every layer needs; the file is corrupt")
    dim = get("embedding_length")
    n_heads = get("attention.head_count")
    if n_heads > MAX_HEADS:
        raise GGUFError(f"{path}: {arch}.attention.head_count = {n_heads}; llm-smolq supports up to {MAX_HEADS} heads")
    n_kv_heads = get("attention.head_count_kv", n_heads)
    if dim % n_heads and f"{arch}.attention.key_length" not in meta:
        raise GGUFError(f"{path}: {arch}.embedding_length {dim} is not a multiple of {arch}.attention.head_count "
                        f"{n_heads}, and no {arch}.attention.key_length gives the head size")
    head_dim = get("attention.key_length", dim // n_heads)
    if n_heads * head_dim > C_INT_MAX:
        raise GGUFError(f"{path}: {n_heads} heads of size {head_dim} are wider than llm-smolq supports "
                        f"(at most {C_INT_MAX} values)")
    if get("attention.value_length", head_dim) != head_dim:
        raise GGUFError(f"{path}: key and value head sizes differ, which llm-smolq does not support")
    if n_heads % n_kv_heads:
        raise GGUFError(f"{path}: {n_heads} query heads cannot be grouped over {n_kv_heads} KV heads")
    if head_dim % 2 or get("rope.dimension_count", head_dim) != head_dim:
        raise GGUFError(f"{path}: partial or odd-sized RoPE is not supported (head size {head_dim})")
    rope_scaling = _rope_scaling(path, meta, arch, get)
    embd = tensors.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2:
        raise GGUFError(f"{path}: token_embd.weight is missing or not a matrix")
    vocab_size = embd.shape[1]
    if vocab_size > C_INT_MAX:
        raise GGUFError(f"{path}: a vocabulary of {vocab_size} tokens is more than llm-smolq supports ({C_INT_MAX})")
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) != vocab_size:
        raise GGUFError(f"{path}: the tokenizer has {len(tokens)} tokens but token_embd.weight has {vocab_size} "
                        "rows; they must match, so the file is corrupt")
    return ModelConfig(
        arch=arch,
        n_layers=n_layers,
        dim=dim,
        hidden_dim=get("feed_forward_length"),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        vocab_size=vocab_size,
        context_length=get("context_length"),
        rope_theta=get("rope.freq_base", 10000.0, float),
        rms_eps=get("attention.layer_norm_rms_epsilon", 1e-5, float),
        nope_layers=tuple(l for l in range(n_layers) if arch == "smollm3" and (l + 1) % 4 == 0),
        tied_embeddings="output.weight" not in tensors,
        rope_scaling=rope_scaling,
    )


def _rope_scaling(path: str, meta: dict[str, Any], arch: str, get) -> RopeScaling | None:
    """The file's RoPE scaling: none, or YaRN with its factor and original context."""
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind != "yarn":
        raise GGUFError(f"{path}: RoPE scaling {brief(kind)} is not supported (llm-smolq applies none or yarn)")
    factor = get("rope.scaling.factor", None, float)
    if not 1.0 <= factor <= 1024.0:
        raise GGUFError(f"{path}: {arch}.rope.scaling.factor = {brief(factor)} must be from 1 to 1024")
    return RopeScaling(factor, get("rope.scaling.original_context_length", get("context_length")),
                       get("rope.scaling.yarn_beta_fast", 32.0, float), get("rope.scaling.yarn_beta_slow", 1.0, float))


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, with its GGUF shape (contiguous dim first)."""
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.dim, c.vocab_size),
        "output_norm.weight": (c.dim,),
    }
    if not c.tied_embeddings:
        shapes["output.weight"] = (c.dim, c.vocab_size)
    per_layer = {t.name: t.shape(c.dim, q, kv, c.hidden_dim) for t in LAYER_TENSORS}
    for layer in range(c.n_layers):
        for name, shape in per_layer.items():
            shapes[f"blk.{layer}.{name}.weight"] = shape
    return shapes


def _check_model_tensors(path: str, c: ModelConfig, tensors: dict[str, TensorInfo]) -> None:
    for name, shape in expected_shapes(c).items():
        info = tensors.get(name)
        if info is None:
            raise GGUFError(f"{path}: tensor {name!r} is missing")
        if info.shape != shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {list(info.shape)}, the config implies {list(shape)}")
        if len(shape) == 1 and info.type != QT.F32:
            raise GGUFError(f"{path}: norm weight {name!r} is {info.type.name}; llm-smolq reads norms as F32")
        if info.offset % 4:
            raise GGUFError(f"{path}: tensor {name!r} at offset {info.offset} is not 4-byte aligned")
