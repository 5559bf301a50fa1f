"""Synthetic GGUF models: the real shapes of a SmolLM preset, random weights of one type.

    python -m llm_smolq.dev.synth OUT.gguf --preset smollm3-3b --type Q4_K_M [--seed N] [--llama-mix]

The file carries everything both this engine and llama.cpp need to load it (architecture
metadata, a byte-level BPE tokenizer, ``general.file_type``), so the same file can be
benchmarked on both. Weights are random but valid: the quantized bits are random bytes,
and every fp16 scale or min is set so a decoded weight stays within about +-0.05 (a
standard deviation near 0.02), which keeps the forward pass finite.

Which tensor gets which type follows llama.cpp's quantizer (src/llama-quant.cpp):
- the mixes (Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M) apply its per-tensor rules for that file
  type, e.g. Q4_K_M: Q4_K, with Q6_K for token_embd (tied output) and for attn_v and
  ffn_down on the layers ``use_more_bits`` picks;
- a plain type (Q4_0, Q6_K, IQ4_XS, ...) puts every matrix in that type, as
  ``llama-quantize --pure`` does; with ``llama_mix=True`` (``--llama-mix``) it gets the
  mix llama-quantize applies by default for that file type instead (token_embd Q6_K, ...;
  plain Q3_K / Q4_K / Q5_K then mean llama.cpp's Q3_K_S / Q4_K_S / Q5_K_S);
- either way, a matrix whose rows are not a multiple of the type's block gets llama.cpp's
  fallback type (SmolLM2's 576-wide rows: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
  Q2_K / Q3_K -> Q4_0, IQ4_XS -> IQ4_NL; F16 where even 32 does not divide the row).
Norm weights are F32 (ones plus a little noise); embeddings are tied (no output.weight).

Tensors are generated and written one row chunk at a time, so memory stays at a few
tens of MB whatever the model size. Same seed, preset and type: identical bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, LlamaFileType
from gguf.constants import GGML_QUANT_SIZES

from llm_smolq.model.model_file import LAYER_TENSORS
from llm_smolq.model.tokenizer import bytes_to_unicode

__all__ = [
    "PRESETS", "TYPES", "Preset", "TensorPlan", "plan_tensors", "llama_tensor_type", "fallback_type", "make_vocab",
    "write_synthetic", "main",
]


# ---------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    arch: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    rope_base: float
    rms_eps: float


PRESETS: dict[str, Preset] = {
    "smollm3-3b": Preset("smollm3", 2048, 36, 16, 4, 128, 11008, 128256, 65536, 5e6, 1e-6),
    "smollm2-135m": Preset("llama", 576, 30, 9, 3, 64, 1536, 49152, 8192, 1e5, 1e-5),
    "tiny": Preset("smollm3", 256, 4, 4, 2, 64, 512, 1024, 4096, 5e6, 1e-6),
}


# ---------------------------------------------------------------------------------------
# Types: what each name means as a llama.cpp file type
# ---------------------------------------------------------------------------------------

F = LlamaFileType


@dataclass(frozen=True)
class _TypeSpec:
    default: QT  # the type most matrices get (llama.cpp's llama_ftype_get_default_type)
    ftype: LlamaFileType  # general.file_type
    mix: bool  # llama.cpp's per-tensor rules apply even without llama_mix


_TYPE_SPECS: dict[str, _TypeSpec] = {
    "F32": _TypeSpec(QT.F32, F.ALL_F32, False),
    "F16": _TypeSpec(QT.F16, F.MOSTLY_F16, False),
    "BF16": _TypeSpec(QT.BF16, F.MOSTLY_BF16, False),
    "Q8_0": _TypeSpec(QT.Q8_0, F.MOSTLY_Q8_0, False),
    "Q4_0": _TypeSpec(QT.Q4_0, F.MOSTLY_Q4_0, False),
    "Q4_1": _TypeSpec(QT.Q4_1, F.MOSTLY_Q4_1, False),
    "Q5_0": _TypeSpec(QT.Q5_0, F.MOSTLY_Q5_0, False),
    "Q5_1": _TypeSpec(QT.Q5_1, F.MOSTLY_Q5_1, False),
    "Q2_K": _TypeSpec(QT.Q2_K, F.MOSTLY_Q2_K, False),
    "Q3_K": _TypeSpec(QT.Q3_K, F.MOSTLY_Q3_K_S, False),
    "Q4_K": _TypeSpec(QT.Q4_K, F.MOSTLY_Q4_K_S, False),
    "Q5_K": _TypeSpec(QT.Q5_K, F.MOSTLY_Q5_K_S, False),
    "Q6_K": _TypeSpec(QT.Q6_K, F.MOSTLY_Q6_K, False),
    "IQ4_NL": _TypeSpec(QT.IQ4_NL, F.MOSTLY_IQ4_NL, False),
    "IQ4_XS": _TypeSpec(QT.IQ4_XS, F.MOSTLY_IQ4_XS, False),
    # llama.cpp's mixes
    "Q3_K_S": _TypeSpec(QT.Q3_K, F.MOSTLY_Q3_K_S, True),
    "Q3_K_M": _TypeSpec(QT.Q3_K, F.MOSTLY_Q3_K_M, True),
    "Q3_K_L": _TypeSpec(QT.Q3_K, F.MOSTLY_Q3_K_L, True),
    "Q4_K_S": _TypeSpec(QT.Q4_K, F.MOSTLY_Q4_K_S, True),
    "Q4_K_M": _TypeSpec(QT.Q4_K, F.MOSTLY_Q4_K_M, True),
    "Q5_K_S": _TypeSpec(QT.Q5_K, F.MOSTLY_Q5_K_S, True),
    "Q5_K_M": _TypeSpec(QT.Q5_K, F.MOSTLY_Q5_K_M, True),
}
TYPES: tuple[str, ...] = tuple(_TYPE_SPECS)
_UNQUANTIZED = (QT.F32, QT.F16, QT.BF16)


# ---------------------------------------------------------------------------------------
# llama.cpp's type choice per tensor (llama_tensor_get_type_impl + tensor_type_fallback),
# restricted to the file types above and to dense, non-Falcon models without imatrix.
# ---------------------------------------------------------------------------------------

def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _block_size(t: QT) -> int:
    return GGML_QUANT_SIZES[t][0]


def llama_tensor_type(ftype: LlamaFileType, default: QT, role: str, layer: int, n_layers: int, n_gqa: int,
                      row_len: int) -> QT:
    """The type llama.cpp's quantizer picks for a tensor before the shape fallback.

    role: token_embd (tied, so it takes the output tensor's rules) or the layer tensor's
    short name (attn_q, attn_v, ffn_down, ...); layer: its block index (counted like
    llama.cpp's i_attention_wv / i_ffn_down, which equal the layer for these models).
    """
    t = default
    if role == "token_embd":  # tied embeddings: quantized as the output tensor
        if row_len % _block_size(t):
            return QT.Q8_0
        return t if t == QT.Q8_0 else QT.Q6_K
    if role == "attn_v":
        if ftype == F.MOSTLY_Q2_K:
            t = QT.Q4_K if n_gqa >= 4 else QT.Q3_K
        elif ftype == F.MOSTLY_Q3_K_M:
            t = QT.Q5_K if layer < 2 else QT.Q4_K
        elif ftype == F.MOSTLY_Q3_K_L:
            t = QT.Q5_K
        elif ftype in (F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS) and n_gqa >= 4:
            t = QT.Q5_K
        elif ftype in (F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M) and _use_more_bits(layer, n_layers):
            t = QT.Q6_K
        elif ftype == F.MOSTLY_Q4_K_S and layer < 4:
            t = QT.Q5_K
    elif role == "ffn_down":
        if ftype == F.MOSTLY_Q2_K:
            t = QT.Q3_K
        elif ftype == F.MOSTLY_Q3_K_M:
            t = QT.Q5_K if layer < n_layers // 16 else QT.Q4_K  # (Q3_K only on Falcon)
        elif ftype == F.MOSTLY_Q3_K_L:
            t = QT.Q5_K
        elif ftype == F.MOSTLY_Q4_K_M:
            if _use_more_bits(layer, n_layers):
                t = QT.Q6_K
        elif layer < n_layers // 8 and ftype in (F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS):
            t = QT.Q5_K
        elif ftype == F.MOSTLY_Q5_K_M and _use_more_bits(layer, n_layers):
            t = QT.Q6_K
        elif ftype == F.MOSTLY_Q4_K_S and layer < n_layers // 8:
            t = QT.Q5_K
    elif role == "attn_output":
        if ftype == F.MOSTLY_Q2_K:
            t = QT.Q3_K
        elif ftype == F.MOSTLY_Q3_K_M:
            t = QT.Q4_K
        elif ftype == F.MOSTLY_Q3_K_L:
            t = QT.Q5_K
    # attn_q, attn_k, ffn_gate, ffn_up: no rule for these file types.
    return t


def fallback_type(t: QT, row_len: int) -> QT:
    """llama.cpp's tensor_type_fallback: the type used when row_len is not a multiple of t's block."""
    if row_len % _block_size(t) == 0:
        return t
    if t in _UNQUANTIZED:
        return t
    fb = {QT.IQ4_XS: QT.IQ4_NL, QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0, QT.Q4_K: QT.Q5_0,
          QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}.get(t, t)  # 32-blocks have nothing smaller
    return fb if row_len % _block_size(fb) == 0 else QT.F16


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # GGUF order: shape[0] is the row length
    type: QT

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.type]
        return self.shape[0] // block * size

    @property
    def n_bytes(self) -> int:
        return self.rows * self.row_bytes


def _type_spec(type_name: str) -> _TypeSpec:
    spec = _TYPE_SPECS.get(type_name)
    if spec is None:
        raise ValueError(f"unknown type {type_name!r}; choose one of {', '.join(TYPES)}")
    return spec


def _preset(preset: str | Preset) -> Preset:
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[preset]


def plan_tensors(preset: str | Preset, type_name: str, llama_mix: bool = False) -> list[TensorPlan]:
    """Every tensor of the file, in llama.cpp's quantizer order, with the type it gets."""
    p, spec = _preset(preset), _type_spec(type_name)
    mix = (spec.mix or llama_mix) and spec.default not in _UNQUANTIZED
    n_gqa = p.n_heads // p.n_kv_heads

    def choose(role: str, layer: int, shape: tuple[int, ...]) -> QT:
        if len(shape) == 1:
            return QT.F32
        t = spec.default
        if mix:
            t = llama_tensor_type(spec.ftype, t, role, layer, p.n_layers, n_gqa, shape[0])
        return fallback_type(t, shape[0])

    plan = [TensorPlan("output_norm.weight", (p.dim,), QT.F32)]
    plan.append(TensorPlan("token_embd.weight", (p.dim, p.vocab), choose("token_embd", -1, (p.dim, p.vocab))))
    for i in range(p.n_layers):
        for tensor in sorted(LAYER_TENSORS, key=lambda t: t.name):  # the quantizer's order: by name
            shape = tensor.shape(p.dim, p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim, p.ffn)
            plan.append(TensorPlan(f"blk.{i}.{tensor.name}.weight", shape, choose(tensor.name, i, shape)))
    return plan


# ---------------------------------------------------------------------------------------
# Random blocks
# ---------------------------------------------------------------------------------------

W_MAX = 0.05  # largest |weight| a block can decode to (at the top of its scale's range)


@dataclass(frozen=True)
class _Half:
    """An fp16 field of a block: at byte `offset`, value d0 * U(0.5, 1) per block, or, with
    `of`, `ratio` times the value of the field at offset `of` (a min that centres the block)."""
    offset: int
    d0: float = 0.0
    of: int | None = None
    ratio: float = 0.0


# For each type: the fp16 fields and their scale. d0 is W_MAX over the largest
# |code x sub-scale| product the type's random bits can make; mins are set so the
# expected weight over random codes and sub-scales is 0.
_BLOCK_FIELDS: dict[QT, tuple[_Half, ...]] = {
    QT.Q8_0: (_Half(0, W_MAX / 128),),  # d * int8
    QT.Q4_0: (_Half(0, W_MAX / 8),),  # d * (q4 - 8)
    QT.Q4_1: (_Half(0, 2 * W_MAX / 15), _Half(2, of=0, ratio=-7.5)),  # d * q4 + m
    QT.Q5_0: (_Half(0, W_MAX / 16),),  # d * (q5 - 16)
    QT.Q5_1: (_Half(0, 2 * W_MAX / 31), _Half(2, of=0, ratio=-15.5)),  # d * q5 + m
    QT.Q2_K: (_Half(80, W_MAX / (15 * 3)), _Half(82, of=80, ratio=1.5)),  # d * sc4 * q2 - dmin * m4
    QT.Q3_K: (_Half(108, W_MAX / (32 * 4)),),  # d * (sc6 - 32) * (q3 - 4)
    QT.Q4_K: (_Half(0, W_MAX / (63 * 15)), _Half(2, of=0, ratio=7.5)),  # d * sc6 * q4 - dmin * m6
    QT.Q5_K: (_Half(0, W_MAX / (63 * 31)), _Half(2, of=0, ratio=15.5)),  # d * sc6 * q5 - dmin * m6
    QT.Q6_K: (_Half(208, W_MAX / (128 * 32)),),  # d * int8 scale * (q6 - 32)
    QT.IQ4_NL: (_Half(0, W_MAX / 127),),  # d * grid[q4], grid in -127..113
    QT.IQ4_XS: (_Half(0, W_MAX / (32 * 127)),),  # d * (sc6 - 32) * grid[q4]
}

CHUNK_BYTES = 32 << 20  # generate and write at most this much of a tensor at a time


def _quant_rows(rng: np.random.Generator, t: QT, n_rows: int, row_len: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[t]
    nb = n_rows * (row_len // block)
    blocks = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    values: dict[int, np.ndarray] = {}
    for field in _BLOCK_FIELDS[t]:
        if field.of is None:
            v = (field.d0 * (0.5 + 0.5 * rng.random(nb, dtype=np.float32))).astype(np.float16)
        else:  # from the rounded scale, so the min centres exactly what is decoded
            v = (values[field.of].astype(np.float32) * np.float32(field.ratio)).astype(np.float16)
        values[field.offset] = v
        blocks[:, field.offset:field.offset + 2] = v.view(np.uint8).reshape(nb, 2)
    return blocks


def _float_rows(rng: np.random.Generator, t: QT, n_rows: int, row_len: int) -> np.ndarray:
    w = rng.standard_normal((n_rows, row_len), dtype=np.float32)
    w *= np.float32(0.02)
    np.clip(w, -4 * 0.02, 4 * 0.02, out=w)
    if t == QT.F32:
        return w
    if t == QT.F16:
        return w.astype(np.float16)
    return (w.view(np.uint32) >> 16).astype(np.uint16)  # BF16: the top half of the float


def _tensor_chunks(rng: np.random.Generator, t: TensorPlan) -> Iterator[np.ndarray]:
    if len(t.shape) == 1:  # a norm: ones plus a little noise
        yield (1.0 + 0.01 * rng.standard_normal(t.shape[0])).astype(np.float32)
        return
    row_len, rows = t.shape[0], t.rows
    make = _float_rows if t.type in _UNQUANTIZED else _quant_rows
    step = max(1, CHUNK_BYTES // t.row_bytes)
    for start in range(0, rows, step):
        yield make(rng, t.type, min(step, rows - start), row_len)


# ---------------------------------------------------------------------------------------
# Tokenizer: GPT-2 byte-level BPE with fillers
# ---------------------------------------------------------------------------------------

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2
BOS_ID, EOS_ID, UNK_ID, PAD_ID = 1, 2, 0, 2
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_vocab(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """tokens, token types and merges: the specials, the 256 byte tokens, then fillers.

    Fillers are two-character strings (then pair + character) over 'Ġ' (the space byte),
    letters and digits; each has the merge that builds it from two tokens before it, so
    every merge is valid and every token reachable.
    """
    byte_chars = bytes_to_unicode()
    byte_tokens = [byte_chars[b] for b in range(256)]
    tokens = [*SPECIAL_TOKENS, *byte_tokens]
    if vocab_size < len(tokens):
        raise ValueError(f"vocab_size {vocab_size} is below the {len(tokens)} special and byte tokens")
    alphabet = ["Ġ", *"abcdefghijklmnopqrstuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ", *"0123456789"]
    n_fill = vocab_size - len(tokens)
    merges: list[str] = []
    pairs = [(a, b) for a in alphabet for b in alphabet]
    for a, b in pairs[:n_fill]:
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    n_fill -= min(n_fill, len(pairs))
    triples = ((a + b, c) for a, b in pairs for c in alphabet)
    for _ in range(n_fill):
        try:
            left, right = next(triples)
        except StopIteration:  # > 250k tokens: not a SmolLM size
            raise ValueError(f"vocab_size {vocab_size} is too large for the filler scheme") from None
        tokens.append(left + right)
        merges.append(f"{left} {right}")
    types = [TOKEN_CONTROL] * len(SPECIAL_TOKENS) + [TOKEN_NORMAL] * (vocab_size - len(SPECIAL_TOKENS))
    return tokens, types, merges


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------

def _add_metadata(w: GGUFWriter, p: Preset, name: str, ftype: LlamaFileType) -> None:
    w.add_name(name)
    w.add_block_count(p.n_layers)
    w.add_context_length(p.context)
    w.add_embedding_length(p.dim)
    w.add_feed_forward_length(p.ffn)
    w.add_head_count(p.n_heads)
    w.add_head_count_kv(p.n_kv_heads)
    w.add_rope_freq_base(p.rope_base)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_vocab_size(p.vocab)
    w.add_rope_dimension_count(p.head_dim)
    if p.n_heads * p.head_dim != p.dim:  # otherwise readers take the head size from dim / n_heads
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
    tokens, types, merges = make_vocab(p.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_quantization_version(2)
    w.add_file_type(int(ftype))


def _check(p: Preset) -> None:
    if p.dim <= 0 or p.n_layers <= 0 or p.n_heads <= 0 or p.n_kv_heads <= 0 or p.n_heads % p.n_kv_heads:
        raise ValueError(f"invalid preset {p}")


def write_synthetic(path: str | os.PathLike[str], preset: str | Preset, type: str, seed: int = 0,
                    llama_mix: bool = False) -> list[TensorPlan]:
    """Write a synthetic GGUF of `preset`'s shapes with weights of `type`; returns the plan.

    preset: a name from PRESETS (or a Preset); type: a name from TYPES. Deterministic: the
    same (preset, type, seed, llama_mix) gives the same bytes.
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    p = _preset(preset)
    _check(p)
    spec = _type_spec(type)
    plan = plan_tensors(p, type, llama_mix)
    label = preset if isinstance(preset, str) else f"{p.arch}-{p.dim}x{p.n_layers}"

    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    w = GGUFWriter(tmp, p.arch)
    try:
        _add_metadata(w, p, f"synthetic-{label}-{type}", spec.ftype)
        for t in plan:
            # numpy order (rows first); the dtype only matters for the unquantized types
            w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.n_bytes, raw_dtype=t.type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = w.fout[0]
        w.write_padding(fout, fout.tell())
        for index, t in enumerate(plan):
            rng = np.random.default_rng([int(seed), index])
            written = 0
            for chunk in _tensor_chunks(rng, t):
                chunk.tofile(fout)
                written += chunk.nbytes
            if written != t.n_bytes:  # a bug here would misplace every later tensor
                raise AssertionError(f"{t.name}: wrote {written} bytes, planned {t.n_bytes}")
            w.write_padding(fout, t.n_bytes)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return plan


def _summary(plan: Sequence[TensorPlan]) -> str:
    counts = Counter(t.type.name for t in plan)
    return ", ".join(f"{n} x {name}" for name, n in counts.most_common())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m llm_smolq.dev.synth",
        description="Write a GGUF with a SmolLM preset's real shapes and valid random weights of one type, "
                    "loadable by llm-smolq and by llama.cpp.",
    )
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--preset", required=True, choices=list(PRESETS))
    ap.add_argument("--type", required=True, choices=list(TYPES), metavar="TYPE",
                    help="tensor type or llama.cpp mix: " + ", ".join(TYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-mix", action="store_true",
                    help="for a plain type, use the mix llama-quantize makes for it (e.g. token_embd Q6_K) "
                         "instead of that type everywhere")
    ap.add_argument("--layers", type=int, metavar="N",
                    help="the preset's layer shapes, N of them (a smaller file for long-context benchmarks)")
    args = ap.parse_args(argv)
    try:
        start = time.perf_counter()
        preset = args.preset
        if args.layers is not None:
            if args.layers < 1:
                raise ValueError(f"--layers must be at least 1, got {args.layers}")
            preset = replace(PRESETS[args.preset], n_layers=args.layers)
        plan = write_synthetic(args.out, preset, args.type, args.seed, args.llama_mix)
        elapsed = time.perf_counter() - start
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    size = os.path.getsize(args.out)
    print(f"{args.out}: {size:,} bytes in {elapsed:.1f} s; {len(plan)} tensors: {_summary(plan)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
