"""The prompt cache on disk: the KV state a response leaves behind, kept between processes,
so `llm -c "follow-up"` prefills only the new turn.

A state is stored as a chain of blocks of up to 256 positions. Each block file holds its
token ids and the keys and values of those positions, and is named after a digest that
covers the model and *every* token before and in it (its parent's digest + its own ids).
Keys and values at a position depend on all earlier tokens and nothing later, so a block
is valid for any prompt that starts with the chain's tokens, and a prompt that agrees with
a block only part way can still use the block's first positions. A growing conversation
writes only the blocks it does not already have.

Nothing read back is trusted until checked: the format version, the model's identity (file
size, mtime and a hash of its header and first and last MiB), the kernel build and KV
layout (all folded into the chain's root digest), the block's place in the chain, its
size, and a SHA-256 of the whole file. A file that fails is deleted and the prompt is
prefilled as if it had never been there.

The file format is kv_blocks.py's. Files live in ``llm.user_dir() / "smolq-prompt-cache"``
(paths.py). Each model's blocks (those of one
chain root: one model file, kernel build and KV layout) are held under a budget, by default
twice the model file's size (SMOLQ_PROMPT_CACHE_SIZE sets another, 0 turns the cache off),
by deleting its least recently used blocks, deepest first, so a kept chain keeps its start.
(Windows cannot delete a block another process is reading: it stays for the next eviction.)
The chain a block belongs to is read from the file names alone (each names its parent).
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
from filelock import FileLock, Timeout

from llm_smolq.cache import in_use
from llm_smolq.cache.atomic_file import TEMP_PREFIX
from llm_smolq.store.kv_blocks import (
    HEADER_ESTIMATE,
    NAME,
    BlockHead,
    KVLayout,
    block_bytes,
    block_name,
    chain_digest,
    common_prefix,
    model_root,
    read_block,
    read_head,
    write_block,
)
from llm_smolq.paths import prompt_cache_dir
from llm_smolq.errors import BadBlock

if TYPE_CHECKING:
    from llm_smolq.engine.engine import Engine

SIZE_ENV = "SMOLQ_PROMPT_CACHE_SIZE"
MODEL_MULTIPLE = 2  # the default budget per model: this many times its file's size
MIN_DEFAULT_BYTES = 64 * 1000**2  # but never less: a tiny model's chats still fit
BLOCK_TOKENS = 256
_LOCK_TIMEOUT = 10.0  # a response never waits longer than this for another process's save
_STALE_TEMP_SECONDS = 3600  # a temporary file this old belongs to a writer that died
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}

log = logging.getLogger(__name__)


def parse_size(text: str) -> int:
    """'2GB', '500MB', '1.5GiB', '123456' (bytes), '0' or 'off' -> bytes."""
    value = text.strip().lower().replace(" ", "")
    if value in ("off", "false", "no"):
        return 0
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", value)
    if not match or match[2] not in _UNITS:
        raise ValueError(
            f"{SIZE_ENV}={text!r} is not a size: give bytes or a number with KB, MB, GB or TB "
            f"(e.g. {SIZE_ENV}=2GB), or 0 to turn the prompt cache off"
        )
    return int(float(match[1]) * _UNITS[match[2]])


def budget_from_environment() -> int | None:
    """SMOLQ_PROMPT_CACHE_SIZE in bytes per model (0: off), None when it is not set."""
    raw = os.environ.get(SIZE_ENV)
    return None if raw is None or not raw.strip() else parse_size(raw)


def default_budget(model_bytes: int) -> int:
    return max(MIN_DEFAULT_BYTES, MODEL_MULTIPLE * model_bytes)


# -- the cache --------------------------------------------------------------------------------
@dataclass
class CacheActivity:
    """What the cache did for one response; kept in the response's JSON."""

    read_tokens: int = 0
    read_seconds: float = 0.0
    written_tokens: int = 0
    write_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    first_write: bool = False  # this save made the cache directory: worth one line to the user
    budget: int = 0  # bytes the model's blocks may take (set by a save)
    directory: Path | None = None  # where (set by a save)

    def as_json(self) -> dict:
        out = {"read_tokens": self.read_tokens, "read_seconds": round(self.read_seconds, 4),
               "written_tokens": self.written_tokens, "write_seconds": round(self.write_seconds, 4)}
        return out | ({"problems": self.problems} if self.problems else {})


@dataclass(frozen=True)
class BlockFile:
    """A block as its file name and stat describe it (nothing read yet)."""

    path: Path
    start: int
    parent16: str
    digest16: str
    size: int
    mtime_ns: int


class PromptCache:
    def __init__(self, directory: Path, max_bytes: int | None = None, block_tokens: int = BLOCK_TOKENS):
        """max_bytes: what each model's blocks may take; None sizes it to the model file."""
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens

    @classmethod
    def configured(cls) -> PromptCache | None:
        """The user's cache, or None when SMOLQ_PROMPT_CACHE_SIZE turns it off; a
        malformed value is a ValueError saying how to write it."""
        budget = budget_from_environment()
        return None if budget == 0 else cls(prompt_cache_dir(), budget)

    def budget_for(self, engine: Engine) -> int:
        if self.max_bytes is not None:
            return self.max_bytes
        return default_budget(os.stat(engine.model.path).st_size)

    def _lock(self, timeout: float = _LOCK_TIMEOUT) -> FileLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.directory / ".lock"), timeout=timeout)

    # -- reading ------------------------------------------------------------------------------
    def restore(self, engine: Engine, prompt_ids: Sequence[int], activity: CacheActivity | None = None) -> CacheActivity:
        """Load into the engine the longest saved prefix of prompt_ids that is longer than
        what its KV cache already shares with them. Never raises for a bad or missing file."""
        activity = activity if activity is not None else CacheActivity()
        started = time.perf_counter()
        try:
            self._restore(engine, list(prompt_ids), activity)
        except OSError as exc:
            activity.problems.append(f"reading the prompt cache failed: {exc}")
            log.warning("llm-smolq: reading the prompt cache failed: %s", exc)
        activity.read_seconds += time.perf_counter() - started
        return activity

    def _restore(self, engine: Engine, ids: list[int], activity: CacheActivity) -> None:
        keep = common_prefix(engine.tokens, ids)
        if keep >= len(ids) - 1 or not self.directory.is_dir():
            return  # the last prompt token is evaluated anyway, for its logits
        plan = self._plan(model_root(engine), KVLayout.of(engine), ids, activity)
        pos, used = 0, []
        for head, use in plan:
            use = min(use, len(ids) - 1 - pos)  # the last token runs anyway: restore it and it is redone
            if use <= 0:
                break
            end = pos + use
            if end > keep:
                try:
                    k, v = read_block(head)
                except BadBlock as exc:
                    self._discard(head.path, exc, activity)
                    break
                except FileNotFoundError:  # evicted by another process since the plan
                    break
                first = max(keep, pos)
                # Block by block, each appended to what the cache holds: a bad block later
                # in the chain leaves a good, shorter prefix.
                engine.restore_kv(ids[:end], k[:, :, first - pos:use], v[:, :, first - pos:use], start=first)
                activity.read_tokens += end - first
            used.append(head.path)
            pos = end
        self._touch(used)

    def _plan(self, root: str, layout: KVLayout, ids: list[int], activity: CacheActivity) -> list[tuple[BlockHead, int]]:
        """Walk the chain from the model's root along the prompt: at each step the block
        (among those whose parent is the last one taken) that agrees with the most of the
        prompt's next tokens. Returns (block, positions to use) pairs."""
        by_parent: dict[str, list[BlockFile]] = {}
        for entry in self._entries():
            by_parent.setdefault(entry.parent16, []).append(entry)
        prompt = np.asarray(ids, np.int64)
        parent, pos, plan = root, 0, []
        while pos < len(prompt):
            best: tuple[BlockHead, int] | None = None
            for entry in by_parent.get(parent[:16], ()):
                if entry.start != pos:
                    continue
                try:
                    head = read_head(entry.path)
                except BadBlock as exc:
                    self._discard(entry.path, exc, activity)
                    continue
                except OSError:
                    continue
                if head.parent != parent:
                    continue  # 64-bit name prefixes agree by chance: someone else's block
                if head.layout != layout:  # the root digest covers the layout: this file lies
                    self._discard(entry.path, BadBlock("KV layout differs from its chain's", head.inode), activity)
                    continue
                agree = common_prefix(head.tokens, prompt[pos:])
                if agree and (best is None or agree > best[1]):
                    best = (head, agree)
            if best is None:
                break
            plan.append(best)
            pos += best[1]
            if best[1] < len(best[0].tokens):
                break  # the prompt leaves this block part way: nothing after it applies
            parent = best[0].digest
        return plan

    # -- writing ------------------------------------------------------------------------------
    def save(self, engine: Engine, activity: CacheActivity | None = None) -> CacheActivity:
        """Save the engine's KV state (every cached position), writing only the blocks not
        already on disk, then hold the cache under its budget. Never raises for I/O."""
        activity = activity if activity is not None else CacheActivity()
        started = time.perf_counter()
        try:
            self._save(engine, activity)
        except Timeout:
            activity.problems.append("another process held the prompt cache's lock; this state was not saved")
        except OSError as exc:
            activity.problems.append(f"saving the prompt cache failed: {exc}")
            log.warning("llm-smolq: saving the prompt cache failed: %s (set %s=0 to turn it off)", exc, SIZE_ENV)
        activity.write_seconds += time.perf_counter() - started
        return activity

    def _save(self, engine: Engine, activity: CacheActivity) -> None:
        ids = np.asarray(engine.tokens, np.int32)
        if not len(ids):
            return
        layout, root = KVLayout.of(engine), model_root(engine)
        parent, budget = root, self.budget_for(engine)
        activity.budget, activity.directory = budget, self.directory
        new_directory = not self.directory.exists()
        model_file = os.path.basename(engine.model.path)
        chain = []
        for start in range(0, len(ids), self.block_tokens):
            stop = min(start + self.block_tokens, len(ids))
            digest = chain_digest(parent, ids[start:stop])
            chain.append((start, stop, parent, digest))
            parent = digest
        with self._lock():
            room = budget
            kept: list[Path] = []
            for start, stop, parent, digest in chain:
                room -= block_bytes(HEADER_ESTIMATE, stop - start, layout)
                if room < 0:
                    break  # a state larger than the budget keeps its first blocks
                path = self.directory / block_name(start, parent, digest)
                if not path.exists():
                    tokens, k, v = engine.kv_snapshot(stop, start)
                    if tokens != ids[:stop].tolist():
                        break  # the engine moved on: not under this response's lock
                    write_block(self.directory, parent, start, ids[start:stop], k, v, layout, model_file)
                    activity.written_tokens += stop - start
                    self._drop_superseded(path, parent, start, ids[start:stop])
                kept.append(path)
            self._touch(kept)
            self._evict(root, budget)
        activity.first_write = new_directory and activity.written_tokens > 0

    def _drop_superseded(self, new: Path, parent: str, start: int, tokens: np.ndarray) -> None:
        """Delete sibling blocks that hold a strict prefix of the new block's tokens (the
        previous turn's last, shorter block): the new one serves every prompt they did."""
        for entry in self._entries():
            if entry.path == new or entry.start != start or entry.parent16 != parent[:16]:
                continue
            try:
                head = read_head(entry.path)
            except (BadBlock, OSError):
                continue
            if head.parent == parent and len(head.tokens) < len(tokens) and common_prefix(head.tokens, tokens) == len(
                    head.tokens):
                _unlink(entry.path)

    # -- bookkeeping --------------------------------------------------------------------------
    def _entries(self) -> list[BlockFile]:
        out = []
        try:
            listing = list(os.scandir(self.directory))
        except FileNotFoundError:
            return out
        for item in listing:
            match = NAME.match(item.name)
            if not match:
                continue
            try:
                st = item.stat()
            except FileNotFoundError:
                continue
            out.append(BlockFile(Path(item.path), int(match[1]), match[2], match[3], st.st_size, st.st_mtime_ns))
        return out

    def _touch(self, chain: list[Path]) -> None:
        """Mark a chain as just used, its first block the newest: eviction goes oldest
        first, so a chain loses its deepest blocks before its start."""
        now = time.time_ns()
        for i, path in enumerate(chain):
            try:
                os.utime(path, ns=(now - i * 1_000_000, now - i * 1_000_000))
            except FileNotFoundError:
                pass

    def _evict(self, root: str, budget: int) -> None:
        """Under the lock: delete orphans (blocks whose parent is gone can never be
        reached), leftovers of writers that died, then the least recently used blocks of
        the chains from `root` until they fit the budget. Other models' blocks are held
        to their own budgets when those models save."""
        now = time.time()
        for item in os.scandir(self.directory):
            if item.name.startswith(TEMP_PREFIX):
                try:
                    if now - item.stat().st_mtime > _STALE_TEMP_SECONDS:
                        _unlink(Path(item.path))
                except FileNotFoundError:
                    pass
        alive = {e.digest16: e for e in self._entries()}

        def drop(entry: BlockFile) -> None:
            if alive.pop(entry.digest16, None) is not None:
                _unlink(entry.path)

        def drop_orphans() -> None:
            while orphans := [e for e in alive.values() if e.start > 0 and e.parent16 not in alive]:
                for e in orphans:
                    drop(e)

        drop_orphans()
        ours = [e for e in alive.values() if _root16(e, alive) == root[:16]]
        total = sum(e.size for e in ours)
        for entry in sorted(ours, key=lambda e: (e.mtime_ns, -e.start)):
            if total <= budget:
                break
            if entry.digest16 not in alive:
                continue  # gone with its parent
            drop(entry)
            drop_orphans()
            total = sum(e.size for e in ours if e.digest16 in alive)

    def _discard(self, path: Path, problem: BadBlock, activity: CacheActivity) -> None:
        """Delete a block found bad, unless another process has already replaced it."""
        activity.problems.append(f"ignored {path.name}: {problem}")
        try:
            with self._lock(timeout=1.0):
                if problem.inode is not None and os.stat(path).st_ino == problem.inode:
                    _unlink(path)
        except (Timeout, OSError):
            pass

    # -- for `llm smolq cache` ----------------------------------------------------------------
    def heads(self) -> Iterator[BlockHead | BlockFile]:
        """Every block's checked header, or its BlockFile when the header is unreadable."""
        for entry in self._entries():
            try:
                yield read_head(entry.path)
            except (BadBlock, OSError):
                yield entry

    def clear(self) -> tuple[int, int]:
        """Delete every block (and leftover temporary file); returns (files, bytes). A block
        that Windows says another process is reading stays."""
        if not self.directory.is_dir():
            return 0, 0
        files = size = 0
        with self._lock():
            for item in os.scandir(self.directory):
                if NAME.match(item.name) or item.name.startswith(TEMP_PREFIX):
                    try:
                        n_bytes = item.stat().st_size
                    except FileNotFoundError:
                        continue
                    if in_use.remove(item.path):
                        files, size = files + 1, size + n_bytes
        return files, size

    def total_bytes(self) -> int:
        return sum(e.size for e in self._entries())


def _root16(entry: BlockFile, alive: dict[str, BlockFile]) -> str | None:
    """The chain root a block hangs from, by its name's parent links (None: an orphan)."""
    seen = 0
    while entry.start > 0:
        entry = alive.get(entry.parent16)
        seen += 1
        if entry is None or seen > len(alive):
            return None
    return entry.parent16


def _unlink(path: Path) -> None:
    """Delete a block (or a leftover), unless it is gone already; one that Windows says a
    reader holds open stays, for the next eviction."""
    in_use.remove(path)
