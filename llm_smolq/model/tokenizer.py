"""Tokenize text the way llama.cpp does for a GGUF file's byte-level BPE vocabulary.

The GGUF carries everything needed: the token strings, their types, the BPE merges and
a pre-tokenizer name (``tokenizer.ggml.pre``). llama.cpp does not store the split regex
in the file; it picks one by that name. We do the same, and build a
``tokenizers.Tokenizer`` from the pieces so the regex split and BPE merging run in Rust.

Ground truth for every rule here is llama.cpp's own output, kept in the tests' reference
folder (253 strings x 2 special modes x 3 pre-types, all matched by the tests).
"""

from __future__ import annotations

import functools
import json

import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from llm_smolq.errors import GGUFError, brief

# GGUF token types (tokenizer.ggml.token_type).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

SUPPORTED_MODELS = ("gpt2",)

# Control tokens that end an assistant turn in the SmolLM chat formats.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")

# The split rules llama.cpp applies for each pre-type name. Each entry is a list of
# patterns applied one after the other; every pattern keeps its matches as separate
# pieces ("isolated") and leaves the text between matches as pieces too.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_PATTERNS: dict[str, tuple[str, ...]] = {
    # SmolLM2: every digit on its own, then the GPT-2 split.
    "smollm": (r"\p{N}", _GPT2),
    # SmolLM3's converters write one of these two: the Llama-3 split (digits in threes).
    "smaug-bpe": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
}
# llama.cpp's "llama-bpe" (Llama-3) handling looks a whole piece up in the vocabulary
# before merging, and defaults to adding BOS; "smaug-bpe" does neither.
_IGNORE_MERGES = {"llama-bpe"}
_DEFAULT_ADD_BOS = {"llama-bpe"}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, the alphabet of byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


# str.translate table from a vocabulary character back to its byte (as a latin-1 char),
# so a token's bytes are token.translate(_UNMAP).encode("latin-1") - one C-level pass.
_UNMAP = {ord(ch): chr(b) for b, ch in bytes_to_unicode().items()}


def _normal_token_bytes(text: str) -> bytes:
    raw = text.translate(_UNMAP)
    try:
        return raw.encode("latin-1")
    except UnicodeEncodeError:
        # A character outside the byte table (not seen in real vocabularies): keep its
        # UTF-8 bytes rather than fail.
        return b"".join(
            c.encode("latin-1") if ord(c) < 256 else c.encode("utf-8") for c in raw
        )


class GGUFTokenizer:
    """llama.cpp-compatible tokenizer for a GGUF ``gpt2`` (byte-level BPE) vocabulary.

    Build it with :meth:`from_metadata` (a mapping of ``tokenizer.ggml.*`` keys to
    Python values, as the model loader has them) or :meth:`from_gguf` (a file path).
    ``encode`` never adds BOS: callers look at ``add_bos`` / ``bos_id`` and decide.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        pre: str,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        add_bos: bool | None = None,
        bpe_files: tuple[Path, Path] | None = None,
    ) -> None:
        if pre not in PRE_TOKENIZER_PATTERNS:
            raise GGUFError(
                f"tokenizer.ggml.pre is {brief(pre)}, which llm-smolq does not know how to "
                f"split; supported: {', '.join(PRE_TOKENIZER_PATTERNS)}"
            )
        if len(token_types) != len(tokens):
            raise GGUFError(
                f"tokenizer.ggml.token_type has {len(token_types)} entries but "
                f"tokenizer.ggml.tokens has {len(tokens)}; the file is inconsistent"
            )
        self.pre = pre
        self.tokens: list[str] = list(tokens)
        self.token_types: list[int] = [int(t) for t in token_types]
        self.vocab_size = len(self.tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = bool(pre in _DEFAULT_ADD_BOS if add_bos is None else add_bos)
        self.tokenizer = self._build(merges, bpe_files)
        # tokenizers has no per-call switch for "special token text is plain text", only
        # the encode_special_tokens attribute; flip it under a lock.
        self._lock = threading.Lock()
        # Raw bytes per id, for decode and streaming, worked out as ids are met.
        self._bytes: dict[int, bytes] = {}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], bpe_files: tuple[Path, Path] | None = None) -> "GGUFTokenizer":
        """Build from GGUF metadata values keyed by their GGUF names. bpe_files: the
        vocabulary and merges as bpe_file_contents() writes them for this metadata; read
        by tokenizers directly, they load faster and in less memory."""
        model = meta.get("tokenizer.ggml.model")
        if model not in SUPPORTED_MODELS:
            raise GGUFError(
                f"tokenizer.ggml.model is {brief(model)}; llm-smolq supports "
                f"{', '.join(SUPPORTED_MODELS)} (byte-level BPE) only"
            )
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in meta:
                raise GGUFError(f"the GGUF has no {key}; it cannot be tokenized")
        tokens = _array_of(meta, "tokenizer.ggml.tokens", str, "strings")
        types = _array_of(meta, "tokenizer.ggml.token_type", int, "integers")
        if types is None:
            types = [TOKEN_NORMAL] * len(tokens)

        def token_id(key: str) -> int | None:
            value = meta.get(key)
            if value is not None and (type(value) is not int or not 0 <= value < len(tokens)):
                raise GGUFError(f"{key} = {brief(value)} is not a token id (0 to {len(tokens) - 1}); the file is corrupt")
            return value

        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        if add_bos is not None and type(add_bos) not in (bool, int):
            raise GGUFError(f"tokenizer.ggml.add_bos_token = {brief(add_bos)} must be a boolean; the file is corrupt")
        return cls(
            tokens,
            types,
            _array_of(meta, "tokenizer.ggml.merges", str, "strings"),
            str(meta.get("tokenizer.ggml.pre", "(missing)")),
            bos_id=token_id("tokenizer.ggml.bos_token_id"),
            eos_id=token_id("tokenizer.ggml.eos_token_id"),
            add_bos=None if add_bos is None else bool(add_bos),
            bpe_files=bpe_files,
        )

    @classmethod
    def from_gguf(
        cls, path: str | Path, overrides: Mapping[str, Any] | None = None
    ) -> "GGUFTokenizer":
        """Read a GGUF file's tokenizer metadata and build from it; ``overrides``
        replace metadata keys, e.g. ``{"tokenizer.ggml.pre": "smollm"}``."""
        meta = read_tokenizer_metadata(path)
        meta.update(overrides or {})
        return cls.from_metadata(meta)

    def _build(self, merges: Sequence[str], bpe_files: tuple[Path, Path] | None) -> Tokenizer:
        ignore_merges = self.pre in _IGNORE_MERGES
        bpe = None
        if bpe_files is not None:
            try:
                bpe = models.BPE.from_file(str(bpe_files[0]), str(bpe_files[1]), ignore_merges=ignore_merges)
            except Exception:  # gone since it was checked (another process evicted it): build instead
                bpe = None
        if bpe is None:
            vocab = {text: i for i, text in enumerate(self.tokens)}
            bpe = models.BPE(vocab, usable_merges(self.tokens, merges), ignore_merges=ignore_merges)
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated")
                for pattern in PRE_TOKENIZER_PATTERNS[self.pre]
            ]
            # Map each byte to its vocabulary character; the splitting is done above.
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()
        # Control (and unknown) token text becomes the token only when asked: encode()
        # sets encode_special_tokens for special=False so it is split like any text.
        # User-defined tokens are always recognised, as in llama.cpp.
        added = []
        for text, kind in zip(self.tokens, self.token_types):
            if not text:
                continue
            if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN):
                added.append(AddedToken(text, special=True, normalized=False))
            elif kind == TOKEN_USER_DEFINED:
                added.append(AddedToken(text, special=False, normalized=False))
        if added:
            tok.add_tokens(added)
        return tok

    def encode(self, text: str, special: bool = False) -> list[int]:
        """Token ids for ``text``, without BOS.

        ``special=True`` turns control-token text such as ``<|im_start|>`` into that
        token; with ``special=False`` it is ordinary text (what untrusted input needs).
        """
        with self._lock:
            self.tokenizer.encode_special_tokens = not special
            return self.tokenizer.encode(text, add_special_tokens=False).ids

    def token_to_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for. A token may end inside a UTF-8 character,
        so streaming output should join bytes before decoding them."""
        if not 0 <= token_id < self.vocab_size:
            raise IndexError(f"token id {token_id} is outside 0..{self.vocab_size - 1}")
        kind = self.token_types[token_id]
        if not special and kind in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            return b""
        raw = self._bytes.get(token_id)
        if raw is None:
            text = self.tokens[token_id]
            raw = self._bytes[token_id] = (
                text.encode("utf-8") if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED)
                else _normal_token_bytes(text)
            )
        return raw

    def token_to_piece(self, token_id: int, special: bool = True) -> str:
        """One token's text (invalid UTF-8 from a partial character becomes U+FFFD)."""
        return self.token_to_bytes(token_id, special).decode("utf-8", errors="replace")

    def decode(self, ids: Sequence[int], special: bool = True) -> str:
        """Text for ``ids``; control tokens show as their text unless special=False."""
        data = b"".join(self.token_to_bytes(int(i), special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def is_control(self, token_id: int) -> bool:
        return self.token_types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN)

    def token_id(self, text: str) -> int | None:
        """Id of a token given its vocabulary text (e.g. ``"<|im_end|>"``), or None."""
        return self.tokenizer.token_to_id(text)


def usable_merges(tokens: Sequence[str], merges: Sequence[str]) -> list[tuple[str, str]]:
    """The merges as (left, right) pairs, without those tokenizers cannot take.

    The separator is the first space after the first character, as llama.cpp reads it
    (byte-level vocabularies spell a space as "Ġ", so there is one). tokenizers panics on
    a merge whose parts or result are not tokens, so those are left out (llama.cpp would
    keep it and spell the unknown result as single bytes; SmolLM2's merges have none,
    nor does its 1024 cut). Half of building a tokenizer is this loop: its result is
    what the index cache keeps."""
    vocab = set(tokens)
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        if cut < 0:
            raise GGUFError(f"tokenizer.ggml.merges entry {brief(merge)} has no space")
        left, right = merge[:cut], merge[cut + 1:]
        if left in vocab and right in vocab and left + right in vocab:
            pairs.append((left, right))
    return pairs


def bpe_file_contents(tokens: Sequence[str], merges: Sequence[str]) -> tuple[bytes, bytes] | None:
    """The vocabulary (JSON, text -> id, a repeated text keeping its last id as the dict
    built in memory does) and the usable merges (one "left right" line each) as files for
    tokenizers' BPE.from_file; None if some merge part holds a space, which that format
    cannot carry (byte-level vocabularies have none)."""
    pairs = usable_merges(tokens, merges)
    if any(" " in left or " " in right for left, right in pairs):
        return None
    vocab = json.dumps({text: i for i, text in enumerate(tokens)}, ensure_ascii=False).encode("utf-8")
    lines = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in pairs)
    return vocab, lines.encode("utf-8")


class _NoFiles(Exception):
    pass


def cached_bpe_files(digest: str, tokens: Any, merges: Any) -> tuple[Path, Path] | None:
    """bpe_file_contents() as files in the index cache, under the header digest the
    tokens and merges came from: (vocabulary, merges), or None if the cache is off, the
    contents cannot be files, or the metadata is malformed (from_metadata then says how).
    The contents are worked out only when a file is missing or damaged."""
    from llm_smolq.cache.header_cache import cached_file

    @functools.cache
    def contents() -> tuple[bytes, bytes]:
        try:
            usable = all(isinstance(v, list) and set(map(type, v)) <= {str} for v in (tokens, merges))
            made = bpe_file_contents(tokens, merges) if usable else None
        except (TypeError, AttributeError, GGUFError):
            made = None
        if made is None:
            raise _NoFiles
        return made

    try:
        vocab = cached_file(digest, "vocab.json", lambda: contents()[0])
        pairs = cached_file(digest, "merges.txt", lambda: contents()[1])
    except _NoFiles:
        return None
    return (vocab, pairs) if vocab and pairs else None


def _array_of(meta: Mapping[str, Any], key: str, kind: type, what: str) -> list[Any] | None:
    """meta[key] if it is a list of `kind` (bool is not an int here), None if absent."""
    value = meta.get(key)
    if value is not None and (not isinstance(value, list) or not set(map(type, value)) <= {kind}):
        found = type(value).__name__ if not isinstance(value, list) else "an array with other values"
        raise GGUFError(f"{key} must be an array of {what}, but it is {found}; the file is corrupt")
    return value


def read_tokenizer_metadata(path: str | Path) -> dict[str, Any]:
    """The ``tokenizer.*`` metadata of a GGUF file as plain Python values."""
    from llm_smolq.model.gguf_file import read_header

    return {k: v for k, v in read_header(path).metadata.items() if k.startswith("tokenizer.")}

def end_of_turn_ids(tok: GGUFTokenizer) -> set[int]:
    """The tokens an answer ends at (a constrained answer's grammar ends there too)."""
    ids = {tok.token_id(t) for t in END_OF_TURN} | {tok.eos_id}
    return {i for i in ids if i is not None}
