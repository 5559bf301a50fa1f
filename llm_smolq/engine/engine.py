"""The Engine: one loaded model, its KV cache, and the kernel calls that run it."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from functools import cached_property
from typing import Callable, Iterable

import numpy as np

from llm_smolq import pages
from llm_smolq.engine import memory
from llm_smolq._kernel import ffi, lib
from llm_smolq.engine.buffer_gate import Dims, check_buffer
from llm_smolq.errors import GGUFError, LayoutError
from llm_smolq.engine.structs import c_config
from llm_smolq.engine.kv_types import DEFAULT_KV_TYPE, kv_type
from llm_smolq.engine.packing import pack_weights
from llm_smolq.model.model_file import LAYER_TENSORS, ModelConfig, ModelFile, TensorInfo, open_model
from llm_smolq.model.tokenizer import GGUFTokenizer, cached_bpe_files

MAX_BATCH = 256  # tokens per kernel pass during prefill

_FORWARD_ERRORS = {
    lib.SQ_ERR_ARGS: "invalid arguments",
    lib.SQ_ERR_TOKEN: "a token id outside the vocabulary",
    lib.SQ_ERR_CONTEXT: "the context is full",
}


def default_threads() -> int:
    """$SMOLQ_THREADS when set (for a shared machine, or processes side by side), else every
    CPU this process may run on."""
    chosen = os.environ.get("SMOLQ_THREADS", "").strip()
    if chosen:
        if not (chosen.isascii() and chosen.isdigit() and 1 <= int(chosen) <= 256):
            raise ValueError(f"SMOLQ_THREADS={chosen!r} is not a thread count: set it to a whole number "
                             "from 1 to 256, or unset it to use every core")
        return int(chosen)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array whose pages become resident only once written, in small pages
    (pages.small_anonymous). np.zeros asks the kernel for huge pages on big arrays, and a
    cache laid out head by head touches every 2 MiB page with its first few positions: the
    whole cache would count towards RSS."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(pages.small_anonymous(nbytes), dtype, count=int(np.prod(shape))).reshape(shape)


def load(path: str | os.PathLike[str], n_ctx: int | None = None, threads: int | None = None,
         kv_dtype: str = DEFAULT_KV_TYPE, rope_scaling: str | None = None, rope_scale: float | None = None
         ) -> "Engine":
    """Open a GGUF model: validate it, map its weights, and allocate an empty KV cache of
    n_ctx positions (None: the model's whole window, or as much of it as memory holds).
    rope_scaling="yarn" extends the window by YaRN (by rope_scale, else by n_ctx over the
    trained context, else 2x) where the file declares no scaling of its own; "none"
    turns off a file's YaRN."""
    return Engine(open_model(path), n_ctx=n_ctx, threads=threads, kv_dtype=kv_dtype, rope_scaling=rope_scaling,
                  rope_scale=rope_scale)


def scaled_config(cfg: ModelConfig, rope_scaling: str | None, rope_scale: float | None,
                  n_ctx: int | None) -> ModelConfig:
    """The model's configuration with the RoPE scaling asked for."""
    if rope_scaling is None:
        if rope_scale is not None:
            raise ValueError("rope_scale is YaRN's factor: give it with rope_scaling='yarn'")
        return cfg
    if rope_scaling == "none":
        return replace(cfg, rope_scaling=None)
    if rope_scaling != "yarn":
        raise ValueError(f"rope_scaling must be 'yarn' or 'none', got {rope_scaling!r}")
    if rope_scale is None and cfg.rope_scaling is not None:
        return cfg  # the file's own YaRN
    factor = rope_scale if rope_scale is not None else (
        n_ctx / cfg.context_length if n_ctx and n_ctx > cfg.context_length else 2.0)
    if not isinstance(factor, (int, float)) or not 1.0 <= factor <= 1024.0:
        raise ValueError(f"rope_scale must be a number from 1 to 1024, got {factor!r}")
    return cfg.with_yarn(factor)


def default_n_ctx(cfg: ModelConfig, kv_dtype: str, threads: int) -> int:
    """The model's whole window where memory holds its cache, else the most that fits
    (in whole KV chunks of 256 positions). Pages are only used as positions fill, but
    a cache that cannot fill would end a long answer with the process killed."""
    available = memory.available_memory()
    if available is None:
        return cfg.window
    fits = memory.largest_fitting_n_ctx(cfg, kv_type(kv_dtype), MAX_BATCH, threads, available[0])
    return cfg.window if fits >= cfg.window else max(fits // 256 * 256, min(fits, 256))


class Engine:
    """One model's KV cache and kernel state over its mapped weights.

    Each eval, truncate and reset runs under a lock, so threads sharing an engine never
    corrupt it; but a conversation is a sequence of calls, so run one conversation per
    engine: engines made from one ModelFile (``Engine(model)`` per thread) share the weights."""

    def __init__(self, model: ModelFile, n_ctx: int | None = None, threads: int | None = None,
                 kv_dtype: str = DEFAULT_KV_TYPE, rope_scaling: str | None = None, rope_scale: float | None = None):
        threads = default_threads() if threads is None else threads
        if not isinstance(threads, int) or not 1 <= threads <= 256:
            raise ValueError(f"threads must be an integer from 1 to 256, got {threads!r}")
        kv = kv_type(kv_dtype)
        cfg = scaled_config(model.config, rope_scaling, rope_scale, n_ctx)
        row_items = kv.row_items(cfg.head_dim)
        if n_ctx is None:
            n_ctx = default_n_ctx(cfg, kv_dtype, threads)
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 1:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        if n_ctx > cfg.window:
            fix = ("lower n_ctx" if cfg.rope_scaling else
                   "lower n_ctx, or extend the window with YaRN: rope_scaling='yarn' (llm: -o rope_scaling yarn)")
            raise ValueError(f"n_ctx={n_ctx} is past the model's window of {cfg.window} positions; {fix}")

        self.model = model
        self.config: ModelConfig = cfg
        self.n_ctx = n_ctx
        self.threads = threads
        self.kv_dtype = kv_dtype
        self._kv_type = kv.kernel_type
        memory.check_engine_memory(model.path, cfg, n_ctx, kv, MAX_BATCH, threads)
        cache_shape = (cfg.n_layers, cfg.n_kv_heads, n_ctx, row_items)
        # Both go through the gate once, here: the engine owns them and hands the same
        # pointers to every kernel call after.
        dims = Dims("the model config", n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, n_ctx=n_ctx,
                    row=row_items)
        cache_dims = ("n_layers", "n_kv_heads", "n_ctx", "row")
        self._k, self._v = (check_buffer(name, _lazy_zeros(cache_shape, kv.dtype), kv.dtype, cache_dims, output=True,
                                         align=kv.align, dims=dims) for name in ("k_cache", "v_cache"))
        self._tokens: list[int] = []  # the ids whose keys and values are in the cache
        self._lock = threading.Lock()

        self._packed = pack_weights(model, threads)  # tensors the kernel reads sixteen rows side by side
        self.weights = ffi.from_buffer("uint8_t[]", model.data)  # the mapped file, as the kernel reads it
        self.packed_weights = ffi.from_buffer("uint8_t[]", model.packed_data)  # and those, packed
        self.c_model, self._c_layers = self._build_c_model(n_ctx)  # sq_model: views into weights
        self._pool = ffi.gc(lib.sq_pool_new(threads), lib.sq_pool_free)
        self._state = ffi.gc(lib.sq_state_new(ffi.addressof(self.c_model.cfg), MAX_BATCH), lib.sq_state_free)
        if self._pool == ffi.NULL or self._state == ffi.NULL:
            raise MemoryError("could not allocate the kernel's thread pool or activation buffers")

    # -- the C view of the model -------------------------------------------------------
    def _tensor(self, info: TensorInfo):
        at = self._packed.get(info.name)
        return {
            "data": self.weights + info.offset if at is None else self.packed_weights + at,
            "type": int(info.type),
            "rows": info.rows,
            "cols": info.shape[0],
            "row_bytes": info.row_bytes,
            "packed16": int(at is not None),
        }

    def _build_c_model(self, n_ctx: int):
        cfg, t = self.config, self.model.tensors
        layers = ffi.new("sq_layer[]", cfg.n_layers)
        for i in range(cfg.n_layers):
            for tensor in LAYER_TENSORS:
                setattr(layers[i], tensor.field, self._tensor(t[f"blk.{i}.{tensor.name}.weight"]))
            layers[i].use_rope = i not in cfg.nope_layers
        m = ffi.new("sq_model *")
        m.cfg = c_config(cfg, n_ctx)[0]
        m.token_embd = self._tensor(t["token_embd.weight"])
        m.output_norm = self._tensor(t["output_norm.weight"])
        m.output = self._tensor(t["token_embd.weight" if cfg.tied_embeddings else "output.weight"])
        m.layers = layers
        return m, layers

    # -- tokens ---------------------------------------------------------------------------
    @cached_property
    def tokenizer(self) -> GGUFTokenizer:
        meta = self.model.metadata
        files = cached_bpe_files(self.model.digest, meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges"))
        return GGUFTokenizer.from_metadata(meta, bpe_files=files)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, special=special)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # -- the KV cache ---------------------------------------------------------------------
    @property
    def k_cache(self) -> np.ndarray:
        """[n_layers, n_kv_heads, n_ctx, row] of the KV type's dtype (row = head_dim, or
        head_dim / 32 Q8_0 blocks); positions >= n_past are stale."""
        return self._k.array

    @property
    def v_cache(self) -> np.ndarray:
        return self._v.array

    @property
    def n_past(self) -> int:
        """Tokens now in the KV cache."""
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        """A copy of the ids now in the KV cache, oldest first."""
        return list(self._tokens)

    def reset(self) -> None:
        self.truncate(0)

    def truncate(self, n: int) -> None:
        """Keep the first n cached tokens; later positions are overwritten by the next eval."""
        if not isinstance(n, (int, np.integer)) or not 0 <= n <= self.n_past:
            raise ValueError(f"truncate(n) needs 0 <= n <= n_past ({self.n_past}), got {n!r}")
        with self._lock:
            del self._tokens[int(n):]

    def kv_snapshot(self, n: int | None = None, start: int = 0) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Copies of the first n cached token ids (all when n is None) and of the keys and
        values at positions start..n-1, each [n_layers, n_kv_heads, n - start, row]."""
        with self._lock:
            n = len(self._tokens) if n is None else n
            if not isinstance(n, (int, np.integer)) or not isinstance(start, (int, np.integer)) or not (
                0 <= start <= n <= len(self._tokens)
            ):
                raise ValueError(f"kv_snapshot(n, start) needs 0 <= start <= n <= n_past ({self.n_past}), "
                                 f"got n={n!r}, start={start!r}")
            n, start = int(n), int(start)
            return self._tokens[:n], self._k.array[:, :, start:n].copy(), self._v.array[:, :, start:n].copy()

    def restore_kv(self, tokens: Iterable[int], k: np.ndarray, v: np.ndarray, start: int = 0) -> None:
        """Make the cache hold `tokens`, with the keys and values of positions start.. taken
        from k and v (as kv_snapshot(len(tokens), start) returns them) and the first `start`
        positions kept: the cache must already hold tokens[:start]."""
        ids = list(tokens)
        if ids:
            ids = self._check_tokens(ids).tolist()
        n = len(ids)
        if not isinstance(start, (int, np.integer)) or not 0 <= start <= n:
            raise ValueError(f"restore_kv: start must be between 0 and len(tokens) ({n}), got {start!r}")
        start = int(start)
        if n > self.n_ctx:
            raise ValueError(f"restore_kv: {n} tokens do not fit the context of {self.n_ctx}; load with a larger n_ctx")
        cfg, dtype = self.config, self._k.array.dtype
        want = (cfg.n_layers, cfg.n_kv_heads, n - start, self._k.array.shape[3])
        for name, arr in (("k", k), ("v", v)):
            if not isinstance(arr, np.ndarray):
                raise LayoutError(f"restore_kv: {name} must be a numpy array, got {type(arr).__name__}")
            if arr.dtype != dtype:
                raise LayoutError(f"restore_kv: {name} is {arr.dtype}, but this engine's KV cache is {dtype} "
                                  f"(kv_dtype={self.kv_dtype!r}); values are not converted, since that changes them")
            if arr.shape != want:
                raise LayoutError(f"restore_kv: {name} has shape {list(arr.shape)}, expected {list(want)} "
                                  "[n_layers, n_kv_heads, len(tokens) - start, row]")
        with self._lock:
            if self._tokens[:start] != ids[:start]:
                raise ValueError(f"restore_kv: the cache does not hold the first {start} of these tokens, "
                                 "so they cannot be kept; pass start=0 with every position")
            # Emptied first: should the copy be interrupted, the cache claims nothing it lacks.
            del self._tokens[start:]
            self._k.array[:, :, start:n] = k
            self._v.array[:, :, start:n] = v
            self._tokens.extend(ids[start:])

    def weight_read_seconds(self, repeats: int = 3) -> float:
        """The fastest of `repeats` reads of the whole model file by the engine's threads,
        each its share of the pages: what one decode step's weights take at the least."""
        best = float("inf")
        with self._lock:
            for _ in range(repeats):
                started = time.perf_counter()
                lib.sq_read_all(self._pool, self.weights, len(self.model.data))
                best = min(best, time.perf_counter() - started)
        return best

    def int8_macs_per_second(self, repeats: int = 3) -> float:
        """The engine's threads' int8 multiply-adds per second, the best of `repeats`: each
        thread runs the multiply-add instruction of the SIMD setting in use on registers
        alone (sq_int8_peak), for about 50 ms. What a prompt's or a draft check's matrix
        products take at the least is their multiply-adds at this rate."""
        checksum = ffi.new("uint64_t *")
        with self._lock:
            rounds = 1 << 12
            while True:  # rounds enough for 50 ms, so the pool's wake-up is lost in it
                started = time.perf_counter()
                lib.sq_int8_peak(self._pool, rounds, 1, 1, checksum)
                if time.perf_counter() - started > 0.05:
                    break
                rounds *= 2
            best = 0.0
            for _ in range(repeats):
                started = time.perf_counter()
                macs = lib.sq_int8_peak(self._pool, rounds, 1, 1, checksum)
                best = max(best, macs / (time.perf_counter() - started))
        return best

    # -- running the model ----------------------------------------------------------------
    def eval(self, ids: Iterable[int], all_logits: bool = False,
             progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Append ids to the KV cache and return float32 logits: [len(ids), vocab] when
        all_logits, else [vocab] for the last position. Each row has the bits evaluating
        the ids one at a time gives it, in any batch or chunking. progress, if given, is
        called with (ids done, len(ids)) after each batch of the kernel."""
        tokens = self._check_tokens(ids)
        n, vocab = len(tokens), self.config.vocab_size
        # tokens and logits are made right here, C-contiguous and aligned by numpy.
        logits = np.empty((n, vocab) if all_logits else (vocab,), np.float32)
        flags = lib.SQ_ALL_LOGITS if all_logits else 0
        with self._lock:
            n_past = len(self._tokens)
            if n_past + n > self.n_ctx:
                raise ValueError(
                    f"{n} more tokens do not fit: {n_past} of the context's {self.n_ctx} positions are used; "
                    "call reset()/truncate() or load with a larger n_ctx"
                )
            # One kernel call per batch, each counted once it has returned: Ctrl-C (which
            # Python delivers between calls) leaves n_past at the batches that finished,
            # and positions written but not counted are overwritten by the next eval.
            for start in range(0, n, MAX_BATCH):
                batch = tokens[start:start + MAX_BATCH]
                rows = logits[start:start + len(batch)] if all_logits else logits
                rc = lib.sq_forward(
                    self.c_model, self._state, self._pool,
                    self._k.ptr, self._v.ptr,
                    self._kv_type, ffi.from_buffer("int32_t[]", batch), len(batch), n_past + start,
                    ffi.from_buffer("float[]", rows, require_writable=True), flags,
                )
                if rc != lib.SQ_OK:
                    raise RuntimeError(f"the kernel refused the batch: {_FORWARD_ERRORS.get(rc, rc)}")
                if not np.isfinite(rows).all():  # the cache keeps only the batches before this one
                    raise GGUFError(
                        f"{self.model.path}: the forward pass gave logits that are not finite (NaN or infinity), so "
                        "the weights hold such values or values too large to compute with; the file is damaged: "
                        "download or convert it again"
                        + (", or load with kv_dtype='f32'" if self._kv_type != lib.SQ_F32 else "")
                    )
                self._tokens.extend(batch.tolist())
                if progress is not None:
                    progress(start + len(batch), n)
        return logits

    def _check_tokens(self, ids: Iterable[int]) -> np.ndarray:
        ids = list(ids)
        if not ids:
            raise ValueError("eval() needs at least one token id")
        vocab = self.config.vocab_size
        for i in ids:
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < vocab:
                raise ValueError(f"token id {i!r} is not in the vocabulary (0..{vocab - 1})")
        return np.asarray(ids, dtype=np.int32)
