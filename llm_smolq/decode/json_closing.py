r"""The end of a JSON answer: the shortest way, in tokens, to finish what a schema
constraint has taken so far, so that an answer cut short is still a valid document.

    closer = JsonCloser(constraint)        # follows constraint.tokens as they grow
    closer.length()                        # tokens the closing takes now
    closer.reserve()                       # tokens to keep in hand before sampling one more
    closer.tokens()                        # the closing itself, checked by the grammar
    minimal_document_tokens(tokenizer, schema)      # the shortest whole answer
    check_max_tokens(tokenizer, schema, max_tokens) # refuses a budget below it

The decode loop: before each sampled token, if max_tokens - len(output) <= reserve(),
stop sampling and append tokens() instead (then the constraint is finished). Sampling
stops at end-of-turn as usual (decode/generate.py, Generation.next_token).

How. The schema (objects closed as json_schema_grammar closes them) is compiled into
nodes (anyOf/oneOf as alternatives, allOf and $ref merged), and a nondeterministic
pushdown automaton follows the answer's bytes the way llguidance's grammar reads them:
the compact layout (", " and ": "), listed properties in the schema's order and
additional ones after them, strings quoted as llguidance quotes them (\" \\ \b \f \n \r
\t, \u00XX for control characters only), patterns and formats as automata over code
points (with JSON Schema's search semantics; formats are llguidance's own regexes),
bounded numbers and multipleOf asked of a byte-level llguidance matcher for the number
alone (its range regexes have rules of their own: no "-0" below zero, no trailing zero
after a negative "0."). Its state is a set of stacks, one per reading still possible;
states are interned, item and property counts clipped where the schema stops caring, and
every transition and result is memoised, so a step inside a seen state is a dictionary
lookup.

From a state, the closing is built frame by frame, innermost first: the current lexeme
finished (escape, UTF-8 character, minLength, pattern, number within its bounds, rest of
a literal or key), then every open container completed with only what it requires:
required properties and minItems items at their minimal values, minProperties filled
with additional keys not yet used, the bracket. A node's minimal value is its
alternative (type, enum/const value, anyOf branch) with the fewest tokens, found by a
fixpoint over the nodes (so recursive schemas work); alternatives within a token of it
are kept, and each choice (a value, which listed key a partial key becomes, which
property follows a ", ", which filler brings a string to its minLength) is made by the
tokens of the closing text around it. That text is tokenized with the fewest tokens the
vocabulary allows (dynamic programming over a trie of every token: llguidance accepts
any tokenization of the right bytes).

Guarantees.
- tokens() is accepted by the constraint: the proposal is consumed on a fork of the
  matcher (Constraint.fork); if it were refused (a schema feature read differently from
  llguidance) a breadth-first search over the matcher's own masks finds a closing
  instead. After it the constraint is finished (or, for a top-level number, accepting)
  and the text is JSON valid for the schema. The constraint itself is never changed.
- Shortest: among completions that add nothing optional, with each value's alternative
  chosen as above, the closing has the fewest tokens, and its tokenization is exactly
  minimal. A shorter one would need an optional member, or a combination of choices
  whose tokens merge better than each choice made in its own context. The tests check,
  at random points of random answers, that no single allowed token validly ends what
  the closing ends in more, and that a breadth-first search over one-byte and
  punctuation tokens finds nothing shorter.
- reserve() >= length(), and reserve() >= the closing after any one token the automaton
  accepts here, so the loop above never exceeds max_tokens (one token can open more than
  it closes: a ", " that starts another array item whose minimal object is long). It is
  exact over every token that changes the structure (outside string content, and in it
  every token with a quote, backslash, control byte or partial UTF-8 character), and per
  character count for plain content (minLength/maxLength exactly; under a pattern, the
  longest shortest-completion over the pattern's states). Where the automaton is lost
  (below), reserve() is the closing found now plus 8, a margin and not a bound.

Cost (SmolLM2's 49k vocabulary, one core): indexing the vocabulary ~0.25 s once per
tokenizer; compiling a schema a few ms; then reserve() averages 0.1-0.6 ms a token over
an answer to a schema seen for the first time (new states cost a walk over the ~700
tokens that can change a string's state, or over the trie outside strings: 1-5 ms,
once per state), and a few microseconds once its states are known.

Not modelled (closed by the search, with no reserve bound): patterns with look-around,
back-references or flags, a pattern together with a format, several patterns or
different multipleOf on one value, allOf parts that conflict beyond simple keywords, and
not/if/then/else/dependent*/contains/uniqueItems (which llguidance mostly refuses).
Duplicate additional keys: llguidance counts {"a": 1, "a": 2} as two properties; the
closing counts keys of one character as JSON reads them, longer ones as written.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
import threading
import weakref
from collections import deque
from typing import Any, Iterable, Mapping

try:  # Python 3.11+
    from re import _constants as _sre_c
    from re import _parser as _sre_p
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_p  # type: ignore[no-redef]

import llguidance
import numpy as np

from llm_smolq.decode.constrained import Constraint, close_objects
from llm_smolq.errors import ConstraintError

__all__ = [
    "JsonCloser",
    "minimal_document_tokens",
    "check_max_tokens",
]

_INF = float("inf")


# --------------------------------------------------------------------------------------
# The vocabulary: token bytes, a trie for the fewest-tokens tokenization, and the tokens
# that can change a string's state (everything else inside a string is plain content).
# --------------------------------------------------------------------------------------

class _Trie:
    """Token bytes as a trie kept in flat containers (one dict of ints, two lists): a
    49k-token vocabulary as nested dicts is some 300k objects for Python's garbage
    collector to walk through, a pause of ~0.1 s at every full collection."""

    def __init__(self):
        self.edges: dict[int, int] = {}  # node * 256 + byte -> child node
        self.token: list[int] = [-1]  # per node: the token ending there, or -1
        self.kids: list[bytes] = [b""]  # per node: the bytes of its children
        self._kids: dict[int, bytearray] = {}

    def add(self, data: bytes, token: int) -> None:
        node = 0
        for c in data:
            key = node * 256 + c
            child = self.edges.get(key)
            if child is None:
                child = self.edges[key] = len(self.token)
                self.token.append(-1)
                self.kids.append(b"")
                self._kids.setdefault(node, bytearray()).append(c)
            node = child
        if self.token[node] < 0:
            self.token[node] = token

    def seal(self) -> None:
        for node, kids in self._kids.items():
            self.kids[node] = bytes(kids)
        self._kids = {}



def _plain_text(data: bytes) -> str | None:
    """The characters of a token that is nothing but ordinary string content (no quote,
    backslash or control character, whole UTF-8 characters), else None."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ch in '"\\' or ord(ch) < 0x20 or ch == "\x7f" for ch in text):
        return None
    return text


class _Vocabulary:
    def __init__(self, tokenizer: Any):
        self.size = tokenizer.vocab_size
        self.token_bytes: list[bytes] = []
        self.trie = _Trie()
        self.special_trie = _Trie()  # tokens that are not plain string content
        plain_counts: set[int] = set()
        self.single_byte: dict[int, int] = {}
        for i in range(self.size):
            data = b"" if tokenizer.is_control(i) else tokenizer.token_to_bytes(i)
            self.token_bytes.append(data)
            if not data:
                continue
            self.trie.add(data, i)
            if len(data) == 1:
                self.single_byte.setdefault(data[0], i)
            text = _plain_text(data)
            if text is None:
                self.special_trie.add(data, i)
            else:
                plain_counts.add(len(text))
        self.trie.seal()
        self.special_trie.seal()
        self.plain_char_counts = tuple(sorted(plain_counts))
        # Tokens of nothing but UTF-8 continuation bytes, by length: what finishes a
        # character whose first bytes came at the end of a token.
        self.continuations: dict[int, list[bytes]] = {}
        for data in self.token_bytes:
            if 1 <= len(data) <= 3 and all(0x80 <= c <= 0xBF for c in data):
                self.continuations.setdefault(len(data), []).append(data)
        self._costs: dict[bytes, float] = {}
        # Plain text that a token joins to a following quote ('."' or '{}"'): the ends a
        # string filled up to its minLength can take.
        heads: dict[bytes, int] = {}
        tails: dict[bytes, int] = {}
        for data in self.token_bytes:
            if b'"' in data:
                for found, part in ((heads, data[:data.index(b'"')]), (tails, data[data.rindex(b'"') + 1:])):
                    text = _plain_text(part) if part else None
                    if text is not None and len(text) <= 8:
                        found[part] = len(text)
        self.quote_heads = sorted(heads.items())
        self.quote_tails = sorted(tails.items())  # ...and what follows an opening quote
        # Tokens made only of JSON punctuation: what a search for a closing tries first.
        self.structural = sorted(i for i, b in enumerate(self.token_bytes)
                                 if b and all(c in b'"{}[],: ' for c in b))

    def shortest(self, text: bytes) -> list[int] | None:
        """The fewest tokens whose bytes are exactly `text` (None if some byte has none)."""
        n = len(text)
        best = [0.0] * (n + 1)
        pick = [0] * (n + 1)
        nxt = [0] * (n + 1)
        edges, token = self.trie.edges, self.trie.token
        for i in range(n - 1, -1, -1):
            node = 0
            j = i
            b = _INF
            while j < n:
                node = edges.get(node * 256 + text[j])
                if node is None:
                    break
                j += 1
                tok = token[node]
                if tok >= 0 and best[j] + 1 < b:
                    b = best[j] + 1
                    pick[i] = tok
                    nxt[i] = j
            best[i] = b
        if best[0] == _INF:
            return None
        out, i = [], 0
        while i < n:
            out.append(pick[i])
            i = nxt[i]
        return out

    def cost(self, text: bytes) -> float:
        """len(shortest(text)), memoised."""
        hit = self._costs.get(text)
        if hit is not None:
            return hit
        if len(self._costs) > 200_000:
            self._costs.clear()
        toks = self.shortest(text)
        value = _INF if toks is None else float(len(toks))
        self._costs[text] = value
        return value


_vocabularies: "weakref.WeakKeyDictionary[Any, _Vocabulary]" = weakref.WeakKeyDictionary()
_vocab_lock = threading.Lock()


def _vocabulary(tokenizer: Any) -> _Vocabulary:
    with _vocab_lock:
        vocab = _vocabularies.get(tokenizer)
        if vocab is None:
            vocab = _vocabularies[tokenizer] = _Vocabulary(tokenizer)
        return vocab


# --------------------------------------------------------------------------------------
# JSON text of characters and values, as llguidance writes them.
# --------------------------------------------------------------------------------------

_SHORT_ESCAPES = {'"': b'\\"', "\\": b"\\\\", "\b": b"\\b", "\f": b"\\f", "\n": b"\\n", "\r": b"\\r", "\t": b"\\t"}
_ESCAPE_LETTERS = {ord('"'): '"', ord("\\"): "\\", ord("b"): "\b", ord("f"): "\f", ord("n"): "\n",
                   ord("r"): "\r", ord("t"): "\t"}
# \uXXXX is accepted only for the characters that have no other form: controls and DEL.
_U_ESCAPES = tuple(f"{c:04x}" for c in list(range(0x20)) + [0x7F])


def _json_char(ch: str) -> bytes:
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    if ord(ch) < 0x20 or ch == "\x7f":
        return b"\\u%04x" % ord(ch)
    return ch.encode("utf-8")


def _json_text(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": ")).encode("utf-8")


# --------------------------------------------------------------------------------------
# Patterns and formats: a Thompson automaton over code points, built from Python's own
# regex parser (the subset JSON schemas use), with JSON Schema's search semantics.
# --------------------------------------------------------------------------------------

class _Unsupported(Exception):
    pass


_MAX_CHAR = 0x10FFFF
_ALL = ((0, _MAX_CHAR),)
_NOT_NL = ((0, 9), (11, _MAX_CHAR))
_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
          (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000))


def _normalize(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out, start = [], 0
    for lo, hi in _normalize(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _MAX_CHAR:
        out.append((start, _MAX_CHAR))
    return tuple(out)


def _contains(ranges: tuple[tuple[int, int], ...], c: int) -> bool:
    for lo, hi in ranges:
        if lo <= c <= hi:
            return True
    return False


_NICE = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ -_.,:;!?@#$%&*+=/<>()[]{}|~^`'"


def _pick(ranges: tuple[tuple[int, int], ...]) -> str:
    """A cheap character of a class: a letter or digit when it has one."""
    for ch in _NICE:
        if _contains(ranges, ord(ch)):
            return ch
    for lo, hi in ranges:
        for c in range(lo, min(hi, lo + 0x800) + 1):
            if not 0xD800 <= c <= 0xDFFF:
                return chr(c)
    raise _Unsupported("a character class with only surrogates")


_CATEGORIES = {
    _sre_c.CATEGORY_DIGIT: _DIGIT, _sre_c.CATEGORY_NOT_DIGIT: _complement(_DIGIT),
    _sre_c.CATEGORY_WORD: _WORD, _sre_c.CATEGORY_NOT_WORD: _complement(_WORD),
    _sre_c.CATEGORY_SPACE: _SPACE, _sre_c.CATEGORY_NOT_SPACE: _complement(_SPACE),
}


class _Regex:
    """An NFA for `pattern` found anywhere in a string (JSON Schema's `pattern`), or for
    the whole string when `whole` (formats). ^ and $ anchor to the string's ends."""

    def __init__(self, pattern: str, whole: bool = False):
        try:
            parsed = _sre_p.parse(pattern)
        except Exception as exc:  # re.error and friends
            raise _Unsupported(f"pattern {pattern!r}: {exc}") from None
        flags = parsed.state.flags
        if flags & (_sre_c.SRE_FLAG_IGNORECASE | _sre_c.SRE_FLAG_MULTILINE | _sre_c.SRE_FLAG_VERBOSE):
            raise _Unsupported(f"pattern {pattern!r}: flags")
        self.eps: list[list[int]] = []
        self.begin: list[list[int]] = []  # ^: followed only before the first character
        self.edges: list[list[tuple[tuple[tuple[int, int], ...], int]]] = []
        self.end = self._new()  # $ reached: accepting, nothing may follow
        start = self._new()
        body_end = self._seq(list(parsed), start, bool(flags & _sre_c.SRE_FLAG_DOTALL))
        accept = self._new()
        self.eps[body_end].append(accept)
        if not whole:
            self.edges[start].append((_ALL, start))  # the match may start anywhere...
            self.edges[accept].append((_ALL, accept))  # ...and anything may follow it
        else:
            self.eps[accept].append(self.end)
        self.accept = frozenset({accept, self.end})
        self.start = self._closure({start}, initial=True)
        self._steps: dict[tuple[frozenset, int], frozenset] = {}

    def _new(self) -> int:
        self.eps.append([])
        self.begin.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def _seq(self, items: list, cur: int, dotall: bool) -> int:
        for op, av in items:
            cur = self._item(op, av, cur, dotall)
        return cur

    def _item(self, op, av, cur: int, dotall: bool) -> int:
        c = _sre_c
        if op in (c.LITERAL, c.NOT_LITERAL, c.ANY, c.IN):
            if op is c.LITERAL:
                ranges = ((av, av),)
            elif op is c.NOT_LITERAL:
                ranges = _complement(((av, av),))
            elif op is c.ANY:
                ranges = _ALL if dotall else _NOT_NL
            else:
                ranges = self._class(av)
            nxt = self._new()
            self.edges[cur].append((ranges, nxt))
            return nxt
        if op is c.BRANCH:
            end = self._new()
            for branch in av[1]:
                s = self._new()
                self.eps[cur].append(s)
                self.eps[self._seq(list(branch), s, dotall)].append(end)
            return end
        if op is c.SUBPATTERN:
            _, add, remove, sub = av
            if add & (c.SRE_FLAG_IGNORECASE | c.SRE_FLAG_MULTILINE | c.SRE_FLAG_VERBOSE):
                raise _Unsupported("inline flags")
            inner = (dotall or bool(add & c.SRE_FLAG_DOTALL)) and not (remove & c.SRE_FLAG_DOTALL)
            return self._seq(list(sub), cur, inner)
        if op is getattr(c, "ATOMIC_GROUP", None):
            return self._seq(list(av), cur, dotall)
        if op in (c.MAX_REPEAT, c.MIN_REPEAT) or op is getattr(c, "POSSESSIVE_REPEAT", None):
            lo, hi, sub = av
            if lo > 1000 or (hi is not c.MAXREPEAT and hi > 1000):
                raise _Unsupported("a repetition over 1000")
            for _ in range(lo):
                cur = self._seq(list(sub), cur, dotall)
            if hi is c.MAXREPEAT:
                loop = self._new()
                self.eps[cur].append(loop)
                self.eps[self._seq(list(sub), loop, dotall)].append(loop)
                return loop
            end = self._new()
            for _ in range(hi - lo):
                self.eps[cur].append(end)
                cur = self._seq(list(sub), cur, dotall)
            self.eps[cur].append(end)
            return end
        if op is c.AT:
            if av in (c.AT_BEGINNING, c.AT_BEGINNING_STRING):
                nxt = self._new()
                self.begin[cur].append(nxt)
                return nxt
            if av in (c.AT_END, c.AT_END_STRING):
                self.eps[cur].append(self.end)
                return self._new()  # nothing after $ can match
            raise _Unsupported(f"anchor {av}")
        raise _Unsupported(f"regex operator {op}")

    def _class(self, items) -> tuple[tuple[int, int], ...]:
        c = _sre_c
        negate, ranges = False, []
        for op, av in items:
            if op is c.NEGATE:
                negate = True
            elif op is c.LITERAL:
                ranges.append((av, av))
            elif op is c.RANGE:
                ranges.append(av)
            elif op is c.CATEGORY and av in _CATEGORIES:
                ranges.extend(_CATEGORIES[av])
            else:
                raise _Unsupported(f"class item {op}")
        ranges = _normalize(ranges)
        return _complement(ranges) if negate else ranges

    def _closure(self, states: Iterable[int], initial: bool) -> frozenset:
        stack = list(states)
        seen = set(stack)
        while stack:
            s = stack.pop()
            targets = self.eps[s] + self.begin[s] if initial else self.eps[s]
            for t in targets:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    def step(self, states: frozenset, ch: int) -> frozenset:
        key = (states, ch)
        hit = self._steps.get(key)
        if hit is None:
            nxt = {t for s in states for ranges, t in self.edges[s] if _contains(ranges, ch)}
            hit = self._closure(nxt, False) if nxt else frozenset()
            if len(self._steps) < 500_000:
                self._steps[key] = hit
        return hit

    def accepts(self, states: frozenset) -> bool:
        return not self.accept.isdisjoint(states)

    def atoms(self) -> list[str]:
        """One character from each class of characters the automaton cannot tell apart."""
        cuts = {0, _MAX_CHAR + 1}
        for edges in self.edges:
            for ranges, _ in edges:
                for lo, hi in ranges:
                    cuts.add(lo)
                    cuts.add(hi + 1)
        points = sorted(cuts)
        out = []
        for lo, nxt in zip(points, points[1:]):
            try:
                out.append(_pick(((lo, nxt - 1),)))
            except _Unsupported:
                pass
        return out


# --------------------------------------------------------------------------------------
# Strings: length bounds and an optional pattern; the state is (automaton states, length).
# --------------------------------------------------------------------------------------

_FORMATS = {  # llguidance's formats (parser/src/json/formats.rs), matched whole
    "date-time": (
        r"(?P<date>[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]["
        r"0-9]|30)|(?:02)-(?:0[1-9]|1[0-9]|2[0-9])))[tT](?P<time>(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5]["
        r"0-9]|60)(?P<time_fraction>\.[0-9]+)?(?P<time_zone>[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]))"
    ),
    "time": (
        r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?P<time_fraction>\.[0-9]+)?(?P<time_zone>[zZ]|"
        r"[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
    ),
    "date": (
        r"(?:[0-9]{4}-(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01]))|(?:[0-9]{4}-(?:0[469]|11)-(?:0[1-9]|["
        r"12][0-9]|30))|(?:[0-9]{4}-02-(?:0[1-9]|1[0-9]|2[0-9]))"
    ),
    "duration": (
        r"P(?:(?P<dur_date>(?:(?P<dur_year>[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)|(?P<dur_month>[0-9]+M(?:[0-9]+"
        r"D)?)|(?P<dur_day>[0-9]+D))(?:T(?:(?P<dur_hour>[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?)|(?P<dur_minute>[0"
        r"-9]+M(?:[0-9]+S)?)|(?P<dur_second>[0-9]+S)))?)|(?P<dur_time>T(?:(?P<dur_hour2>[0-9]+H(?:[0-9]+M("
        r"?:[0-9]+S)?)?)|(?P<dur_minute2>[0-9]+M(?:[0-9]+S)?)|(?P<dur_second2>[0-9]+S)))|(?P<dur_week>[0-9"
        r"]+W))"
    ),
    "email": (
        r"(?P<local_part>(?P<dot_string>[a-zA-Z0-9!#$%&'*+\-/=?\^_`{|}~]+(\.[a-zA-Z0-9!#$%&'*+\-/=?\^_`{|}"
        r"~]+)*))@((?P<domain>(?P<sub_domain>[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)(\.(?P<sub_domain2>[a-"
        r"zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?))*)|\[(?P<ipv4>((([0-9])|(([1-9])[0-9]|(25[0-5]|(2[0-4]|(1)["
        r"0-9])[0-9])))\.){3}(([0-9])|(([1-9])[0-9]|(25[0-5]|(2[0-4]|(1)[0-9])[0-9]))))\])"
    ),
    "hostname": (
        r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"
    ),
    "ipv4": (
        r"((([0-9])|(([1-9])[0-9]|(25[0-5]|(2[0-4]|(1)[0-9])[0-9])))\.){3}(([0-9])|(([1-9])[0-9]|(25[0-5]|"
        r"(2[0-4]|(1)[0-9])[0-9])))"
    ),
    "ipv6": (
        r"(?:(?P<full>(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}))|(?:::(?:[0-9a-fA-F]{1,4}:){0,5}(?P<ls32>["
        r"0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}))|(?:(?P<h16_1>[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){0,4}(?"
        r"P<ls32_1>[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}))|(?:((?:[0-9a-fA-F]{1,4}:){0,1}[0-9a-fA-F]{1,4})?::("
        r"?:[0-9a-fA-F]{1,4}:){0,3}(?P<ls32_2>[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}))|(?:((?:[0-9a-fA-F]{1,4}:"
        r"){0,2}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){0,2}(?P<ls32_3>[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}"
        r"))|(?:((?:[0-9a-fA-F]{1,4}:){0,3}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}:(?P<ls32_4>[0-9a-fA-F]{1,4"
        r"}:[0-9a-fA-F]{1,4}))|(?:((?:[0-9a-fA-F]{1,4}:){0,4}[0-9a-fA-F]{1,4})?::(?P<ls32_5>[0-9a-fA-F]{1,"
        r"4}:[0-9a-fA-F]{1,4}))|(?:((?:[0-9a-fA-F]{1,4}:){0,5}[0-9a-fA-F]{1,4})?::(?P<h16_2>[0-9a-fA-F]{1,"
        r"4}))|(?:((?:[0-9a-fA-F]{1,4}:){0,6}[0-9a-fA-F]{1,4})?::)"
    ),
    "uuid": (
        r"(?P<time_low>[0-9a-fA-F]{8})-(?P<time_mid>[0-9a-fA-F]{4})-(?P<time_high_and_version>[0-9a-fA-F]{"
        r"4})-(?P<clock_seq_and_reserved>[0-9a-fA-F]{2})(?P<clock_seq_low>[0-9a-fA-F]{2})-(?P<node>[0-9a-f"
        r"A-F]{12})"
    ),
    "unknown": r"(?s:.*)",
    "uri": (
        r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+\-.]*):(?://(?:(?P<userinfo>(?:[a-zA-Z0-9\-._~!$&'()*+,;=:]|%[0-9a"
        r"-fA-F]{2})*)@)?(?P<host>\[(?:(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|(?:[0-9a-fA-F]{1,4}:){1,7}"
        r":|(?:[0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|(?:[0-9a-fA-F]{1,4}:){1,5}(?::[0-9a-fA-F]{1,4}){1,"
        r"2}|(?:[0-9a-fA-F]{1,4}:){1,4}(?::[0-9a-fA-F]{1,4}){1,3}|(?:[0-9a-fA-F]{1,4}:){1,3}(?::[0-9a-fA-F"
        r"]{1,4}){1,4}|(?:[0-9a-fA-F]{1,4}:){1,2}(?::[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:(?::[0-9a-fA-"
        r"F]{1,4}){1,6}|:(?::[0-9a-fA-F]{1,4}){1,7}|::|v[0-9a-fA-F]+\.[a-zA-Z0-9\-._~!$&'()*+,;=:]+)\]|(?:"
        r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
        r"|(?:[a-zA-Z0-9\-._~!$&'()*+,;=]|%[0-9a-fA-F]{2})*)(?::(?P<port>[0-9]*))?(?P<path_abempty>(?:/(?:"
        r"[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*)|(?P<path_absolute>/(?:(?:[a-zA-Z0-9\-._~!$&'("
        r")*+,;=:@]|%[0-9a-fA-F]{2})+(?:/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*)?)|(?P<path_"
        r"rootless>(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})+(?:/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|"
        r"%[0-9a-fA-F]{2})*)*)|(?P<path_empty>))(?:\?(?P<query>(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-f"
        r"A-F]{2})*))?(?:\#(?P<fragment>(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-fA-F]{2})*))?"
    ),
}

_STATE_CAP = 20_000


class _StringSpec:
    """What a string's content may be. State: (automaton states or None, length), the
    length clipped where the bounds stop caring."""

    def __init__(self, min_len: int = 0, max_len: int | None = None, regex: _Regex | None = None):
        self.min_len, self.max_len, self.regex = min_len, max_len, regex
        self.start = (regex.start if regex is not None else None, 0)
        self._dist: dict | None = None  # (rx, n) -> (chars to an end, next char, next state)
        self.worst_chars = 0  # the longest shortest-completion over reachable states
        if regex is None:
            self.worst_chars = min_len
        else:
            self._explore()

    def _clip(self, n: int) -> int:
        return n if self.max_len is not None else min(n, self.min_len)

    def _explore(self) -> None:
        rx = self.regex
        atoms = [ord(ch) for ch in rx.atoms()]
        seen = {self.start: None}
        order = [self.start]
        graph: dict = {}
        i = 0
        while i < len(order):
            state = order[i]
            i += 1
            sets, n = state
            if self.max_len is not None and n >= self.max_len:
                graph[state] = []
                continue
            outs = []
            for c in atoms:
                nxt = rx.step(sets, c)
                if not nxt:
                    continue
                st = (nxt, self._clip(n + 1))
                outs.append((c, st))
                if st not in seen:
                    seen[st] = None
                    order.append(st)
                    if len(order) > _STATE_CAP:
                        raise _Unsupported("a pattern with too many states")
            graph[state] = outs
        # Distance to an accepting state, backwards from every accepting one.
        back: dict = {}
        for st, outs in graph.items():
            for c, nxt in outs:
                back.setdefault(nxt, []).append((st, c))
        dist: dict = {}
        queue = deque()
        for st in order:
            if rx.accepts(st[0]) and st[1] >= self.min_len:
                dist[st] = (0, None, None)
                queue.append(st)
        while queue:
            st = queue.popleft()
            d = dist[st][0]
            for prev, c in back.get(st, ()):
                if prev not in dist:
                    dist[prev] = (d + 1, c, st)
                    queue.append(prev)
        if self.start not in dist:
            raise _Unsupported("a pattern no string of the allowed length matches")
        self._dist = dist
        self.worst_chars = max(d for d, _, _ in dist.values())

    def unbounded(self) -> "_StringSpec":
        """The same without its maxLength (no pattern)."""
        spec = getattr(self, "_unbounded", None)
        if spec is None:
            spec = self._unbounded = _StringSpec(self.min_len, None, None)
        return spec

    def viable(self, state: tuple) -> bool:
        if self.regex is None:
            return self.max_len is None or state[1] <= self.max_len
        return state in self._dist

    def add(self, state: tuple, ch: str) -> tuple | None:
        sets, n = state
        if self.regex is None:
            n += 1
            if self.max_len is not None and n > self.max_len:
                return None
            return (None, self._clip(n))
        nxt = (self.regex.step(sets, ord(ch)), self._clip(n + 1))
        return nxt if nxt in self._dist else None

    def room(self, state: tuple) -> bool:
        """Whether one more character may come."""
        return self.max_len is None or state[1] < self.max_len

    def can_end(self, state: tuple) -> bool:
        if self.regex is None:
            return state[1] >= self.min_len
        hit = self._dist.get(state)
        return hit is not None and hit[0] == 0

    def completion(self, state: tuple, filler: str = " ") -> str | None:
        """The fewest characters that let the string end here."""
        if self.regex is None:
            if not self.viable(state):
                return None
            return filler * max(0, self.min_len - state[1])
        out = []
        hit = self._dist.get(state)
        if hit is None:
            return None
        while hit[0]:
            out.append(chr(hit[1]))
            state = hit[2]
            hit = self._dist[state]
        return "".join(out)

    def extend(self, state: tuple, ch_range: tuple[int, int]) -> tuple[str, tuple] | None:
        """A character within [lo, hi] that keeps the string viable (to finish a
        partial UTF-8 sequence), and the state after it."""
        lo, hi = ch_range
        candidates = [c for c in range(lo, min(hi, lo + (64 if self.regex is not None else 2)) + 1)]
        if self.regex is not None:
            for s in state[0]:
                for ranges, _ in self.regex.edges[s]:
                    for a, b in ranges:
                        if a <= hi and b >= lo:
                            candidates.append(max(a, lo))
        best = None
        for c in candidates:
            if 0xD800 <= c <= 0xDFFF:
                continue
            nxt = self.add(state, chr(c))
            if nxt is None:
                continue
            rest = self.completion(nxt)
            if rest is not None and (best is None or len(rest) < len(best[2])):
                best = (chr(c), nxt, rest)
        return None if best is None else (best[0], best[1])


_ANY_STRING = _StringSpec()


class _KeySpec(_StringSpec):
    """An additional key whose text is remembered while it is one character or less
    (what minProperties' filling keys are chosen among)."""

    def __init__(self):
        super().__init__()
        self.start = ("", 0)

    def add(self, state: tuple, ch: str) -> tuple | None:
        short = state[0]
        return (short + ch if short is not None and len(short) < 1 else None, 0)

    def viable(self, state: tuple) -> bool:
        return True


_KEY_STRING = _KeySpec()


# --------------------------------------------------------------------------------------
# Numbers. Free ones follow JSON's syntax; bounded ones and multiples are llguidance's own
# regular expressions (it writes ranges digit by digit, with rules of its own such as no
# "-0" and no trailing zero after a negative "0."), so they are asked of a matcher for
# the number alone over a vocabulary of single bytes: a prefix is viable if it consumes,
# and its shortest completion is a breadth-first search over the bytes of numbers.
# --------------------------------------------------------------------------------------

class _ByteVocabulary:
    """What llguidance.TokenizerWrapper reads, for a vocabulary of the 256 bytes."""

    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)] + [b"<|end|>"]
        self.special_token_ids = [256]
        self.eos_token_id = 256
        self.bos_token_id = None

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_byte_tokenizer = None
_byte_lock = threading.Lock()


def _bytes_tokenizer():
    global _byte_tokenizer
    with _byte_lock:
        if _byte_tokenizer is None:
            _byte_tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary()))
        return _byte_tokenizer


_NUMBER_CHARS = "0123456789.-eE+"


class _NumberSpec:
    def __init__(self, integer: bool = False, bounds: Mapping[str, Any] | None = None):
        self.integer = integer
        self.free = not bounds
        self._read: dict[str, tuple[bool, bool]] = {}
        self._memo: dict[str, str | None] = {}
        self._base = None
        self._modulus = None
        if bounds:
            schema = {"type": "integer" if integer else "number", **bounds}
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
            matcher = llguidance.LLMatcher(_bytes_tokenizer(), grammar, log_level=0)
            if matcher.is_error():
                raise _Unsupported(f"number {schema}: {matcher.get_error()}")
            self._base = matcher
            if "multipleOf" in bounds:
                self._modulus = max(1, Fraction(str(bounds["multipleOf"])).numerator)

    def read(self, text: str) -> tuple[bool, bool]:
        """(viable, complete): whether `text` can begin such a number, and is one."""
        hit = self._read.get(text)
        if hit is None:
            if len(self._read) > 100_000:
                self._read.clear()
            if self.free:
                suffix = self._free_completion(text)
                hit = (suffix is not None, suffix == "")
            else:
                m = self._base.deep_copy()
                data = list(text.encode())
                ok = m.try_consume_tokens(data) == len(data) and not m.is_error()
                hit = (ok, ok and m.is_accepting())
            self._read[text] = hit
        return hit

    def canonical(self, text: str) -> str:
        """A free number's text reduced to what its future depends on ("-12.50" and
        "-3.1" continue alike), so that its states repeat; bounded ones are kept."""
        if not self.free:
            return text
        parsed = _parse_number_prefix(text)
        if parsed is None:
            return text
        neg, intd, frac, exp = parsed
        out = ("-" if neg else "") + (intd if intd in ("", "0") else "1")
        if frac is not None:
            out += "." + ("0" if frac else "")
        if exp is not None:
            out += "e" + ("0" if any(ch.isdigit() for ch in exp) else exp)
        return out

    def complete(self, text: str) -> str | None:
        """The shortest suffix making `text` a number this spec allows ("" if it is one),
        None if no suffix can (or, for bounded numbers, none was found)."""
        hit = self._memo.get(text, False)
        if hit is False:
            if len(self._memo) > 100_000:
                self._memo.clear()
            if self.free:
                hit = self._free_completion(text)
            else:
                hit = self._search(text, merge=True)
                if hit is None and self.read(text)[0]:
                    hit = self._search(text, merge=False, depth=4)
            self._memo[text] = hit
        return hit

    def _free_completion(self, text: str) -> str | None:
        parsed = _parse_number_prefix(text)
        if parsed is None:
            return None
        _, intd, frac, exp = parsed
        if self.integer:
            if frac is not None or exp is not None:
                return None
            return "" if intd else "0"
        if not intd or frac == "" or (exp is not None and not exp.lstrip("+-")):
            return "0"
        return ""

    def _search(self, text: str, merge: bool, depth: int = 40) -> str | None:
        """Breadth-first over the bytes of numbers. With `merge`, states with the same
        next-byte mask (and, for multipleOf, the same remainder and decimals) are
        taken as one: llguidance writes ranges digit by digit, where that holds."""
        if not self.read(text)[0]:
            return None
        if self.read(text)[1]:
            return ""
        m = self._base.deep_copy()
        m.try_consume_tokens(list(text.encode()))
        frontier = [(m, text)]
        seen: set = set()
        for _ in range(depth):
            nxt = []
            for m, sofar in frontier:
                mask = m.compute_bitmask()
                if merge:
                    key = (mask, self._remainder(sofar))
                    if key in seen:
                        continue
                    seen.add(key)
                bits = int.from_bytes(mask, "little")
                for ch in _NUMBER_CHARS:
                    if bits >> ord(ch) & 1:
                        child = m.deep_copy()
                        child.consume_token(ord(ch))
                        if child.is_accepting():
                            return (sofar + ch)[len(text):]
                        nxt.append((child, sofar + ch))
            if not nxt:
                return None
            frontier = nxt
        return None

    def _remainder(self, text: str):
        if self._modulus is None:
            return None
        digits = "".join(ch for ch in text if ch.isdigit())
        decimals = len(text) - text.index(".") - 1 if "." in text else -1
        return int(digits or "0") % self._modulus, decimals


def _parse_number_prefix(text: str):
    """(negative, integer digits, fraction digits or None, exponent text or None) for a
    prefix of a JSON number, None if it is not one."""
    i, n = 0, len(text)
    neg = text.startswith("-")
    if neg:
        i = 1
    j = i
    while j < n and text[j].isdigit():
        j += 1
    intd = text[i:j]
    if len(intd) > 1 and intd[0] == "0":
        return None
    frac = exp = None
    if j < n and text[j] == ".":
        if not intd:
            return None
        k = j + 1
        while k < n and text[k].isdigit():
            k += 1
        frac, j = text[j + 1:k], k
    if j < n and text[j] in "eE":
        if not intd or frac == "":
            return None
        k = j + 1
        if k < n and text[k] in "+-":
            k += 1
        while k < n and text[k].isdigit():
            k += 1
        exp, j = text[j + 1:k], k
    if j != n or not all(ch.isascii() for ch in text):
        return None
    return neg, intd, frac, exp


# --------------------------------------------------------------------------------------
# Schema nodes.
# --------------------------------------------------------------------------------------

_FREE_NUMBER = _NumberSpec()
_FREE_INTEGER = _NumberSpec(integer=True)
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_IGNORED = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
            "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "$defs", "definitions", "$anchor",
            "x-guidance"}
_HANDLED = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
            "additionalProperties", "patternProperties", "minProperties", "maxProperties", "items",
            "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
            "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}


class _Prop:
    __slots__ = ("name", "key", "node", "required")

    def __init__(self, name: str, node: "_Node", required: bool):
        self.name, self.key, self.node, self.required = name, _json_text(name), node, required


class _Node:
    def __init__(self):
        self.opaque: str | None = None
        self.alts: tuple[_Node, ...] | None = None
        self.types = _TYPES
        self.literals: tuple[bytes, ...] | None = None
        self.string = _ANY_STRING
        self.number = _FREE_NUMBER
        self.integer_number = _FREE_INTEGER
        self.props: tuple[_Prop, ...] = ()
        self.extra: _Node | None = None
        self.pattern_props: tuple[tuple[_StringSpec, _Node], ...] = ()
        self.min_props, self.max_props = 0, None
        self.prefix: tuple[_Node, ...] = ()
        self.items: _Node | None = None
        self.min_items, self.max_items = 0, None

    def item(self, i: int) -> "_Node | None":
        if self.max_items is not None and i >= self.max_items:
            return None
        return self.prefix[i] if i < len(self.prefix) else self.items

    def children(self) -> list["_Node"]:
        out = list(self.alts or ())
        out += [p.node for p in self.props] + [n for _, n in self.pattern_props] + list(self.prefix)
        out += [n for n in (self.extra, self.items) if n is not None]
        return out


class _Compiler:
    """JSON schema -> nodes. A node is the intersection of a tuple of schema parts
    (allOf), memoised by the parts' identities so recursive $refs end."""

    def __init__(self, root: Any):
        self.root = root
        self.memo: dict[tuple, _Node] = {}
        self.keep: list[Any] = []  # the parts memoised by id stay alive
        self._split: dict[tuple, dict] = {}

    def node(self, parts: tuple) -> _Node:
        key = tuple(id(p) for p in parts)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        self.keep.append(parts)
        node = self.memo[key] = _Node()
        try:
            self._fill(node, parts)
        except _Unsupported as exc:
            node.opaque = str(exc) or "unsupported"
        return node

    def _without(self, part: Mapping, keys: tuple) -> dict:
        """`part` less some keywords: one object per part, so memo keys stay stable
        (a recursive $ref with siblings would otherwise never meet itself again)."""
        key = (id(part), keys)
        hit = self._split.get(key)
        if hit is None:
            hit = self._split[key] = {k: v for k, v in part.items() if k not in keys}
            self.keep.append(part)
        return hit

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise _Unsupported(f"$ref {ref!r}")
        target = self.root
        for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
            part = part.replace("~1", "/").replace("~0", "~")
            try:
                target = target[int(part)] if isinstance(target, list) else target[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise _Unsupported(f"$ref {ref!r} not found") from None
        return target

    def _flatten(self, parts: tuple) -> list:
        out: list = []
        stack = list(reversed(parts))
        while stack:
            part = stack.pop()
            if part is True or part == {}:
                continue
            if part is False:
                out.append(False)
                continue
            if not isinstance(part, Mapping):
                raise _Unsupported("a schema that is not an object")
            if "$ref" in part or "allOf" in part:
                rest = self._without(part, ("$ref", "allOf"))
                more = []
                if "$ref" in part:
                    more.append(self._resolve(part["$ref"]))
                more += list(part.get("allOf") or [])
                if rest:
                    self.keep.append(rest)
                    more.append(rest)
                stack.extend(reversed(more))
                continue
            out.append(part)
        return out

    def _fill(self, node: _Node, parts: tuple) -> None:
        flat = self._flatten(parts)
        if any(p is False for p in flat):
            node.types = frozenset()
            return
        branched = [p for p in flat if "anyOf" in p or "oneOf" in p]
        if branched:
            first = branched[0]
            key = "anyOf" if "anyOf" in first else "oneOf"
            rest = self._without(first, (key,))
            others = tuple(p for p in flat if p is not first) + ((rest,) if rest else ())
            node.alts = tuple(self.node(others + (branch,)) for branch in first[key])
            return
        for p in flat:
            for k in p:
                if k not in _HANDLED and k not in _IGNORED and not k.startswith("x-"):
                    raise _Unsupported(f"keyword {k!r}")
        # type
        types = set(_TYPES)
        for p in flat:
            if "type" in p:
                t = p["type"]
                these = set(t) if isinstance(t, list) else {t}
                if "number" in these:
                    these.add("integer")
                types &= these
        node.types = frozenset(types)
        # enum / const: strings are matched as llguidance quotes them (a newline may be
        # written \n or \u000a), by a pattern of the alternatives; other values as text.
        values = None
        for p in flat:
            for given in ([p["const"]] if "const" in p else None, p.get("enum")):
                if given is None:
                    continue
                kept = {_json_text(v): v for v in given if _json_type_ok(v, types)}
                values = kept if values is None else {t: v for t, v in values.items() if t in kept}
        if values is not None:
            strings = [v for v in values.values() if isinstance(v, str)]
            texts = tuple(t for t, v in values.items() if not isinstance(v, str))
            string_node = None
            if strings:
                string_node = _Node()
                string_node.types = frozenset({"string"})
                pattern = "^(?:" + "|".join(re.escape(v) for v in strings) + ")$"
                string_node.string = _StringSpec(regex=_Regex(pattern))
            if strings and texts:
                literal_node = _Node()
                literal_node.literals = texts
                node.alts = (literal_node, string_node)
            elif strings:
                node.types, node.string = string_node.types, string_node.string
            else:
                node.literals = texts
            return
        # strings
        min_len = max([int(p["minLength"]) for p in flat if "minLength" in p], default=0)
        maxes = [int(p["maxLength"]) for p in flat if "maxLength" in p]
        patterns = [_Regex(p["pattern"]) for p in flat if "pattern" in p]
        for p in flat:
            if "format" in p:
                fmt = _FORMATS.get(p["format"])
                if fmt is None:
                    raise _Unsupported(f"format {p['format']!r}")
                patterns.append(_Regex(fmt, whole=True))
        if len(patterns) > 1:
            raise _Unsupported("several patterns on one string")
        if "string" in types:
            if min_len or maxes or patterns:
                node.string = _StringSpec(min_len, min(maxes) if maxes else None, patterns[0] if patterns else None)
        # numbers
        if ("number" in types or "integer" in types):
            bounds: dict[str, Any] = {}
            for p in flat:
                for key in ("minimum", "exclusiveMinimum"):
                    if key in p:
                        old = bounds.get("minimum", bounds.get("exclusiveMinimum"))
                        if old is None or p[key] > old or (p[key] == old and key.startswith("exclusive")):
                            bounds.pop("minimum", None)
                            bounds.pop("exclusiveMinimum", None)
                            bounds[key] = p[key]
                for key in ("maximum", "exclusiveMaximum"):
                    if key in p:
                        old = bounds.get("maximum", bounds.get("exclusiveMaximum"))
                        if old is None or p[key] < old or (p[key] == old and key.startswith("exclusive")):
                            bounds.pop("maximum", None)
                            bounds.pop("exclusiveMaximum", None)
                            bounds[key] = p[key]
                if "multipleOf" in p:
                    if "multipleOf" in bounds and bounds["multipleOf"] != p["multipleOf"]:
                        raise _Unsupported("several multipleOf")
                    bounds["multipleOf"] = p["multipleOf"]
            if any(isinstance(v, bool) for v in bounds.values()):
                raise _Unsupported("draft-4 exclusive bounds")
            if "number" in types:
                node.number = _NumberSpec(False, bounds)
            else:
                node.integer_number = _NumberSpec(True, bounds)
        # objects
        if "object" in types:
            names: dict[str, list] = {}
            for p in flat:
                for name, sub in (p.get("properties") or {}).items():
                    names.setdefault(name, []).append(sub)
            required: list[str] = []
            for p in flat:
                for name in p.get("required") or []:
                    if name not in required:
                        required.append(name)
            extras = [p["additionalProperties"] for p in flat if "additionalProperties" in p]
            pattern_props = [(pat, sub) for p in flat for pat, sub in (p.get("patternProperties") or {}).items()]
            for name in required:
                if name not in names:  # required but not listed: from patternProperties or additionalProperties
                    subs = []
                    for pat, sub in pattern_props:
                        rx = _Regex(pat)
                        if rx.accepts(_run(rx, name)):
                            subs.append(sub)
                    names[name] = subs or extras or [True]
            node.props = tuple(_Prop(name, self.node(tuple(subs)), name in required) for name, subs in names.items())
            if any(e is False for e in extras):
                node.extra = None
            else:
                node.extra = self.node(tuple(extras))
            node.pattern_props = tuple((_StringSpec(regex=_Regex(pat)), self.node((sub,))) for pat, sub in pattern_props)
            node.min_props = max([int(p["minProperties"]) for p in flat if "minProperties" in p], default=0)
            maxp = [int(p["maxProperties"]) for p in flat if "maxProperties" in p]
            node.max_props = min(maxp) if maxp else None
        # arrays
        if "array" in types:
            prefixes = [p["prefixItems"] for p in flat if "prefixItems" in p]
            if len(prefixes) > 1:
                raise _Unsupported("several prefixItems")
            items = [p["items"] for p in flat if "items" in p]
            if any(isinstance(i, list) for i in items):
                raise _Unsupported("items as a list")
            node.prefix = tuple(self.node((sub,)) for sub in (prefixes[0] if prefixes else []))
            node.items = None if any(i is False for i in items) else self.node(tuple(items))
            node.min_items = max([int(p["minItems"]) for p in flat if "minItems" in p], default=0)
            maxi = [int(p["maxItems"]) for p in flat if "maxItems" in p]
            node.max_items = min(maxi) if maxi else None


def _run(rx: _Regex, text: str) -> frozenset:
    states = rx.start
    for ch in text:
        states = rx.step(states, ord(ch))
    return states


def _json_type_ok(value: Any, types: set) -> bool:
    if value is None:
        return "null" in types
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return "integer" in types
    if isinstance(value, float):
        return "number" in types or ("integer" in types and value.is_integer())
    if isinstance(value, str):
        return "string" in types
    if isinstance(value, list):
        return "array" in types
    return "object" in types


# --------------------------------------------------------------------------------------
# The plan for one (vocabulary, schema): minimal values, the automaton, closings.
#
# Frames (tuples, hashable):
#   ("V", node)                          a value of node starts with the next byte
#   ("S", spec, sstate, esc, part, then) string content; then = value node after a key
#   ("K", onode, candidates, pos)        a listed key's literal text, pos bytes matched
#   ("N", spec, text)                    a number so far
#   ("L", texts, pos)                    one of some literal texts (enum, const, true...)
#   ("O", node, idx, count, phase, vnode, used) an object; idx = next listed property
#                                        allowed, count = properties (counted at their
#                                        key), used = additional keys of one character
#   ("A", node, count, phase)            an array
#   ("D",)                               the document is complete
#   ("X", reason)                        a part of the schema this module does not model
# A container under a value is in phase "value" with idx/count already advanced.
# --------------------------------------------------------------------------------------

_DIGITS = frozenset(b"0123456789")
_NUMBER_BYTES = frozenset(b"0123456789.-+eE")


class _Plan:
    def __init__(self, vocab: _Vocabulary, schema: Any):
        self.vocab = vocab
        self.lock = threading.RLock()
        compiler = _Compiler(schema)
        self.root = compiler.node((schema,))
        self.nodes = self._all_nodes()
        self.opaque = sorted({n.opaque for n in self.nodes if n.opaque})
        self.minimal: dict[_Node, bytes | None] = {}
        self.options: dict[_Node, list[bytes]] = {}
        self._sid: dict[frozenset, int] = {}
        self._states: list[frozenset] = []
        self._next: dict[int, int] = {}  # state * 256 + byte -> state
        self._closing: dict[int, tuple[float, bytes] | None] = {}
        self._reserve: dict[int, float] = {}
        self._reserve_cfgs: dict[tuple, float] = {}
        self._rest: dict[tuple, bytes | None] = {}
        self._fillers: dict[int, str] = {}
        self._minimal_values()
        self._rest.clear()  # rests computed while the minimal values were still settling
        self.start = self._intern(frozenset({(("V", self.root),)}))
        self.dead = self._intern(frozenset())

    # -- nodes and their minimal values ---------------------------------------------------

    def _all_nodes(self) -> list[_Node]:
        seen, order = {id(self.root): self.root}, [self.root]
        i = 0
        while i < len(order):
            for child in order[i].children():
                if id(child) not in seen:
                    seen[id(child)] = child
                    order.append(child)
            i += 1
        return order

    def _minimal_values(self) -> None:
        """Fixpoint: each node's value with the fewest tokens, given its children's; then
        the few alternatives within a token of it, since which is shortest can depend on
        what comes around it (' ""' is one token, ' 0' two)."""
        table = self.minimal
        for node in self.nodes:
            table[node] = None
        for _ in range(len(self.nodes) + 2):
            self._rest.clear()  # rests depend on the values being settled
            changed = False
            for node in self.nodes:
                text = self._cheapest(self._minimal_options(node))
                if text is not None:
                    old = table[node]
                    if old is None or self.vocab.cost(text) < self.vocab.cost(old):
                        table[node] = text
                        changed = True
            if not changed:
                break
        self._rest.clear()
        for node in self.nodes:
            best = table[node]
            if best is None:
                self.options[node] = []
                continue
            limit = self.vocab.cost(best) + 1
            found = sorted({t for t in self._minimal_options(node) if self.vocab.cost(t) <= limit},
                           key=lambda t: (self.vocab.cost(t), len(t)))
            self.options[node] = ([best] + [t for t in found if t != best])[:6]
        self._rest.clear()

    def _values(self, node: _Node | None) -> list[bytes]:
        """A node's minimal value and its near alternatives, best first."""
        if node is None:
            return []
        found = self.options.get(node)
        if found is None:  # during the fixpoint
            best = self.minimal.get(node)
            return [] if best is None else [best]
        return found

    def _minimal_options(self, node: _Node) -> list[bytes]:
        if node.opaque:
            return []
        options: list[bytes] = []
        if node.alts is not None:
            options = [t for t in (self.minimal.get(a) for a in node.alts) if t is not None]
        elif node.literals is not None:
            options = list(node.literals)
        else:
            t = node.types
            if "null" in t:
                options.append(b"null")
            if "boolean" in t:
                options += [b"true", b"false"]
            for spec in self._number_specs(node):
                rest = spec.complete("")
                if rest is not None:
                    options.append(rest.encode())
            if "string" in t:
                for content in self._string_completions(node.string, node.string.start, fresh=True):
                    options.append(b'"' + content + b'"')
            if "object" in t:
                body = self._object_rest(node, 0, 0, "open")
                if body is not None:
                    options.append(b"{" + body)
            if "array" in t:
                body = self._array_rest(node, 0, "open")
                if body is not None:
                    options.append(b"[" + body)
        return options

    def _choose(self, pieces: list[list[bytes]], tail: bytes = b"") -> bytes | None:
        """Pieces in order, each one of its alternatives, picked left to right by the
        tokens of the text so far followed by the next piece (or the tail)."""
        acc = b""
        for i, alts in enumerate(pieces):
            if not alts:
                return None
            if len(alts) == 1:
                acc += alts[0]
                continue
            ahead = pieces[i + 1][0] if i + 1 < len(pieces) and pieces[i + 1] else tail
            acc += min(alts, key=lambda a: (self.vocab.cost(acc + a + ahead), len(a)))
        return acc + tail

    def _cheapest(self, options: Iterable[bytes], suffix: bytes = b"") -> bytes | None:
        best, best_cost = None, _INF
        for text in options:
            c = self.vocab.cost(text + suffix)
            if c < best_cost or (c == best_cost and best is not None and len(text) < len(best)):
                best, best_cost = text, c
        return best

    @staticmethod
    def _number_specs(node: _Node) -> list[_NumberSpec]:
        if "number" in node.types:
            return [node.number]
        if "integer" in node.types:
            return [node.integer_number]
        return []

    def _fill(self, count: int, fresh: bool) -> list[bytes]:
        """Ways to write `count` free characters that end a string: runs of one cheap
        character, ending with what a token joins to the closing quote (`.` when `."` is
        one token) and, in a string just opened (`fresh`), starting with what a token
        joins to the opening quote. The few cheapest, best first."""
        key = (count, fresh)
        hit = self._fillers.get(key)
        if hit is None:
            runs = sorted(" -a=_.*#", key=lambda ch: (self.vocab.cost((ch * count).encode() + b'"'), ch != " "))
            run = runs[0]
            ends = [(b"", 0)] + [(h, c) for h, c in self.vocab.quote_heads if c <= count]
            starts = [(b"", 0)] + ([(t, c) for t, c in self.vocab.quote_tails if c <= count] if fresh else [])
            found = {(runs[1] * count).encode()}
            for start, c1 in starts:
                for end, c2 in ends:
                    if c1 + c2 <= count and (c1 + c2 < count or start or end):
                        found.add(start + (run * (count - c1 - c2)).encode() + end)
            opening = b'": "' if fresh else b""
            # The bytes break ties, so that the choice never follows a set's order (the
            # hash seed); the few best in an object's context, the best anywhere kept too.
            ranked = sorted(found, key=lambda t: (self.vocab.cost(opening + t + b'"}'), len(t), t))
            alone = sorted(found, key=lambda t: (self.vocab.cost(b'"' + t + b'"'), len(t), t))
            hit = list(dict.fromkeys(ranked[:6] + alone[:2]))
            self._fillers[key] = hit
        return hit

    def _string_completions(self, spec: _StringSpec, state: tuple, fresh: bool = False) -> list[bytes]:
        """The cheapest ways to end a string's content from `state` (its quote not
        included): for a free string, fillers up to minLength; for a pattern, the
        automaton's shortest completion."""
        if spec.regex is None:
            if not spec.viable(state):
                return []
            need = max(0, spec.min_len - state[1])
            return self._fill(need, fresh) if need else [b""]
        text = spec.completion(state)
        return [] if text is None else [b"".join(_json_char(ch) for ch in text)]

    # -- container rests ------------------------------------------------------------------

    def _object_rest(self, node: _Node, idx: int, count: int, phase: str, used: frozenset = frozenset()) -> bytes | None:
        """What closes an object from `phase` ("open": after "{", "after": after a value,
        "comma_sp": after ",", "next": after ", ") with listed properties from idx on."""
        key = ("O", node, idx, count, phase, used)
        if key in self._rest:
            return self._rest[key]
        parts: list[list[bytes]] = []
        for p in node.props[idx:]:
            if p.required:
                parts.append([p.key + b": " + v for v in self._values(p.node)])
        need = node.min_props - count - len(parts)
        taken = {p.name for p in node.props} | used
        if need > 0:
            fill = self._fill_keys(node, need, taken)
            if fill is None:
                self._rest[key] = None
                return None
            parts += [[f] for f in fill]
        if phase in ("comma_sp", "next") and not parts:
            options = []
            for p in node.props[idx:]:
                options += [p.key + b": " + v for v in self._values(p.node)]
            if node.max_props is None or count < node.max_props:
                fill = self._fill_keys(node, 1, taken)
                if fill:
                    options.append(fill[0])
            parts = [options]
        if node.max_props is not None and count + len(parts) > node.max_props:
            self._rest[key] = None
            return None
        text = self._members(parts, phase, b"}")
        self._rest[key] = text
        return text

    def _members(self, parts: list[list[bytes]], phase: str, close: bytes) -> bytes | None:
        """One alternative per member (picked by _choose), comma-separated, then close:
        after a member ("after") each takes a leading comma; otherwise the first does not,
        and "comma_sp" (a comma written, its space not) owes the space first."""
        if phase == "after":
            pieces = [[b", " + a for a in alts] for alts in parts]
        else:
            pieces = [[b", " + a for a in alts] if i else alts for i, alts in enumerate(parts)]
            if phase == "comma_sp":
                pieces.insert(0, [b" "])
        return self._choose(pieces, close)

    def _fill_keys(self, node: _Node, need: int, taken: set) -> list[bytes] | None:
        """`need` additional properties with distinct keys (for minProperties)."""
        out = []
        if node.extra is not None and self.minimal.get(node.extra) is not None:
            value = self._values(node.extra)[0]
            names = ["", *"abcdefghijklmnopqrstuvwxyz", *(f"k{i}" for i in range(need))]
            for name in names:
                if len(out) == need:
                    break
                if name not in taken:
                    out.append(_json_text(name) + b": " + value)
            return out if len(out) == need else None
        for spec, sub in node.pattern_props:
            text = spec.completion(spec.start)
            value = self.minimal.get(sub)
            if text is not None and value is not None and text not in taken and len(out) < need:
                out.append(_json_text(text) + b": " + value)
                taken = taken | {text}
        return out if len(out) == need else None

    def _array_rest(self, node: _Node, count: int, phase: str) -> bytes | None:
        key = ("A", node, count, phase)
        if key in self._rest:
            return self._rest[key]
        need = max(0, node.min_items - count)
        if phase == "comma_sp":
            need = max(need, 1)
        items = [self._values(node.item(count + j)) for j in range(need)]
        text = self._members(items, phase, b"]")
        self._rest[key] = text
        return text

    # -- the automaton -----------------------------------------------------------------------

    def _intern(self, state: frozenset) -> int:
        sid = self._sid.get(state)
        if sid is None:
            sid = self._sid[state] = len(self._states)
            self._states.append(state)
        return sid

    def step(self, sid: int, byte: int) -> int:
        key = sid * 256 + byte
        hit = self._next.get(key)
        if hit is None:
            out: set = set()
            for cfg in self._states[sid]:
                out.update(self._step(cfg, byte))
            hit = self._next[key] = self._intern(frozenset(out))
        return hit

    def feed(self, sid: int, data: bytes) -> int:
        for b in data:
            sid = self.step(sid, b)
        return sid

    def _step(self, cfg: tuple, b: int) -> list[tuple]:
        top = cfg[-1]
        kind = top[0]
        below = cfg[:-1]
        if kind == "V":
            return self._start_value(below, top[1], b)
        if kind == "S":
            return self._step_string(below, top, b)
        if kind == "O":
            return self._step_object(below, top, b)
        if kind == "A":
            return self._step_array(below, top, b)
        if kind == "K":
            _, onode, cands, pos = top
            out = []
            keep = [i for i in cands if onode.props[i].key[pos] == b]
            for i in keep:
                if len(onode.props[i].key) == pos + 1:
                    o = below[-1]
                    out.append(below[:-1] + (("O", onode, i + 1, _props_seen(onode, o[3] + 1), "colon",
                                              onode.props[i].node, o[6]),))
            rest = tuple(i for i in keep if len(onode.props[i].key) > pos + 1)
            if rest:
                out.append(below + (("K", onode, rest, pos + 1),))
            return out
        if kind == "N":
            _, spec, text = top
            out = []
            if b in _NUMBER_BYTES:
                longer = spec.canonical(text + chr(b))
                if spec.read(longer)[0]:
                    out.append(below + (("N", spec, longer),))
            if spec.read(text)[1]:
                out += self._step(self._complete(below), b)
            return out
        if kind == "L":
            _, texts, pos = top
            out = []
            keep = tuple(t for t in texts if len(t) > pos and t[pos] == b)
            if keep:
                out.append(below + (("L", keep, pos + 1),))
            if any(len(t) == pos for t in texts):
                out += self._step(self._complete(below), b)
            return out
        if kind == "X":
            return [cfg]
        return []  # "D": nothing may follow

    def _complete(self, below: tuple) -> tuple:
        if not below:
            return (("D",),)
        p = below[-1]
        if p[0] == "O":
            return below[:-1] + (("O", p[1], p[2], p[3], "after", None, p[6]),)
        return below[:-1] + (("A", p[1], p[2], "after"),)

    def _start_value(self, below: tuple, node: _Node, b: int) -> list[tuple]:
        if node.opaque:
            return [below + (("X", node.opaque),)]
        if node.alts is not None:
            out = []
            for alt in node.alts:
                out += self._start_value(below, alt, b)
            return out
        if node.literals is not None:
            texts = tuple(t for t in node.literals if t[0] == b)
            return [below + (("L", texts, 1),)] if texts else []
        t = node.types
        if b == 0x22 and "string" in t:
            return [below + (("S", node.string, node.string.start, "", b"", None),)]
        if b == 0x7B and "object" in t:
            return [below + (("O", node, 0, 0, "open", None, frozenset()),)]
        if b == 0x5B and "array" in t:
            return [below + (("A", node, 0, "open"),)]
        if b == 0x2D or b in _DIGITS:
            out = []
            for spec in self._number_specs(node):
                if spec.read(chr(b))[0]:
                    out.append(below + (("N", spec, chr(b)),))
            return out
        if b == 0x74 and "boolean" in t:
            return [below + (("L", (b"true",), 1),)]
        if b == 0x66 and "boolean" in t:
            return [below + (("L", (b"false",), 1),)]
        if b == 0x6E and "null" in t:
            return [below + (("L", (b"null",), 1),)]
        return []

    def _step_string(self, below: tuple, top: tuple, b: int) -> list[tuple]:
        _, spec, st, esc, part, then = top
        if esc:
            if esc == "\\":
                ch = _ESCAPE_LETTERS.get(b)
                if ch is not None:
                    return self._add_char(below, top, ch)
                if b == 0x75:  # u
                    return [below + (("S", spec, st, "\\u", b"", then),)]
                return []
            hexd = esc[2:] + chr(b).lower()
            if not chr(b).isascii() or not any(u.startswith(hexd) for u in _U_ESCAPES):
                return []
            if len(hexd) < 4:
                return [below + (("S", spec, st, "\\u" + hexd, b"", then),)]
            return self._add_char(below, top, chr(int(hexd, 16)))
        if part:
            if not 0x80 <= b <= 0xBF or not _utf8_second_ok(part, b):
                return []
            part += bytes([b])
            if len(part) < _utf8_length(part[0]):
                return [below + (("S", spec, st, "", part, then),)]
            return self._add_char(below, top, part.decode("utf-8"))
        if b == 0x22:
            if not spec.can_end(st):
                return []
            if then is None:
                return [self._complete(below)]
            o = below[-1]
            count, used = _key_written(o, st)
            return [below[:-1] + (("O", o[1], len(o[1].props), count, "colon", then, used),)]
        if b == 0x5C:
            return [below + (("S", spec, st, "\\", b"", then),)] if spec.room(st) else []
        if b < 0x20 or b == 0x7F:
            return []
        if b < 0x80:
            return self._add_char(below, top, chr(b))
        if 0xC2 <= b <= 0xF4 and spec.room(st):
            return [below + (("S", spec, st, "", bytes([b]), then),)]
        return []

    @staticmethod
    def _add_char(below: tuple, top: tuple, ch: str) -> list[tuple]:
        _, spec, st, _, _, then = top
        nxt = spec.add(st, ch)
        return [] if nxt is None else [below + (("S", spec, nxt, "", b"", then),)]

    def _step_object(self, below: tuple, top: tuple, b: int) -> list[tuple]:
        _, node, idx, count, phase, vnode, used = top
        if phase in ("open", "next"):
            if b == 0x22:
                return self._key_start(below, top)
            if b == 0x7D and phase == "open" and self._can_close(node, idx, count):
                return [self._complete(below)]
            return []
        if phase == "colon":
            return [below + (("O", node, idx, count, "colon_sp", vnode, used),)] if b == 0x3A else []
        if phase == "colon_sp":
            return [below + (("O", node, idx, count, "value", None, used), ("V", vnode))] if b == 0x20 else []
        if phase == "after":
            if b == 0x2C and self._more_keys(node, idx, count):
                return [below + (("O", node, idx, count, "comma_sp", None, used),)]
            if b == 0x7D and self._can_close(node, idx, count):
                return [self._complete(below)]
            return []
        if phase == "comma_sp":
            return [below + (("O", node, idx, count, "next", None, used),)] if b == 0x20 else []
        return []

    @staticmethod
    def _can_close(node: _Node, idx: int, count: int) -> bool:
        return not any(p.required for p in node.props[idx:]) and count >= node.min_props

    @staticmethod
    def _more_keys(node: _Node, idx: int, count: int) -> bool:
        if node.max_props is not None and count >= node.max_props:
            return False
        return idx < len(node.props) or node.extra is not None or bool(node.pattern_props)

    def _key_start(self, below: tuple, top: tuple) -> list[tuple]:
        _, node, idx, count, _, _, used = top
        if node.max_props is not None and count >= node.max_props:
            return []
        cands = []
        required_left = False
        for i in range(idx, len(node.props)):
            cands.append(i)
            if node.props[i].required:
                required_left = True
                break
        here = below + (("O", node, idx, count, "key", None, used),)
        out = []
        if cands:
            out.append(here + (("K", node, tuple(cands), 1),))
        if not required_left:
            if node.extra is not None:
                spec = _KEY_STRING if node.min_props else _ANY_STRING
                out.append(here + (("S", spec, spec.start, "", b"", node.extra),))
            for spec, sub in node.pattern_props:
                out.append(here + (("S", spec, spec.start, "", b"", sub),))
        return out

    def _step_array(self, below: tuple, top: tuple, b: int) -> list[tuple]:
        _, node, count, phase = top
        if phase == "open":
            if b == 0x5D and node.min_items == 0:
                return [self._complete(below)]
            sub = node.item(0)
            if sub is None:
                return []
            return self._start_value(below + (("A", node, _items_seen(node, 1), "value"),), sub, b)
        if phase == "after":
            if b == 0x2C and node.item(count) is not None:
                return [below + (("A", node, count, "comma_sp"),)]
            if b == 0x5D and count >= node.min_items:
                return [self._complete(below)]
            return []
        if phase == "comma_sp" and b == 0x20:
            return [below + (("A", node, _items_seen(node, count + 1), "value"), ("V", node.item(count)))]
        return []

    # -- closings ----------------------------------------------------------------------------

    def closing(self, sid: int) -> tuple[float, bytes] | None:
        """(tokens, text) of the cheapest closing from a state, None if unknown."""
        if sid in self._closing:
            return self._closing[sid]
        best = None
        for cfg in self._states[sid]:
            text = self._close_cfg(cfg)
            if text is None:
                continue
            cost = self.vocab.cost(text)
            if best is None or cost < best[0] or (cost == best[0] and len(text) < len(best[1])):
                best = (cost, text)
        self._closing[sid] = best
        return best

    def _frame_rest(self, frame: tuple) -> bytes | None:
        """What closes a container waiting for its child's value."""
        if frame[0] == "O":
            return self._object_rest(frame[1], frame[2], frame[3], "after", frame[6])
        return self._array_rest(frame[1], frame[2], "after")

    def _close_cfg(self, cfg: tuple) -> bytes | None:
        top = cfg[-1]
        kind = top[0]
        if kind == "X":
            return None
        if kind == "D":
            return b""
        below = cfg[:-1]
        owner = None
        if kind == "K" or (kind == "S" and top[-1] is not None):
            owner = cfg[-2]  # the object in phase "key": the key's closing covers it
            below = below[:-1]
        suffix = self._frames_rest(below)
        if suffix is None:
            return None
        options = self._top_options(top, owner)
        if not options:
            return None
        best = self._cheapest(options, suffix)
        return None if best is None else best + suffix

    def _top_options(self, top: tuple, owner: tuple | None) -> list[bytes]:
        kind = top[0]
        if kind == "V":
            return self._values(top[1])
        if kind == "L":
            _, texts, pos = top
            return [t[pos:] for t in texts]
        if kind == "N":
            rest = top[1].complete(top[2])
            return [] if rest is None else [rest.encode()]
        if kind == "O":
            _, node, idx, count, phase, vnode, used = top
            if phase in ("colon", "colon_sp"):
                rest = self._object_rest(node, idx, count, "after", used)
                if rest is None:
                    return []
                return [(b": " if phase == "colon" else b" ") + v + rest for v in self._values(vnode)]
            rest = self._object_rest(node, idx, count, phase, used)
            return [] if rest is None else [rest]
        if kind == "A":
            _, node, count, phase = top
            rest = self._array_rest(node, count, phase)
            return [] if rest is None else [rest]
        if kind == "K":
            _, onode, cands, pos = top
            count, used = _props_seen(onode, owner[3] + 1), owner[6]
            out = []
            for i in cands:
                p = onode.props[i]
                rest = self._object_rest(onode, i + 1, count, "after", used)
                if rest is not None:
                    out += [p.key[pos:] + b": " + v + rest for v in self._values(p.node)]
            return out
        if kind == "S":
            contents = self._finish_string(top)
            then = top[-1]
            if then is None:
                return [c + b'"' for c in contents]
            onode = owner[1]
            count, used = _key_written(owner, _key_after(top))
            rest = self._object_rest(onode, len(onode.props), count, "after", used)
            if rest is None:
                return []
            return [c + b'": ' + v + rest for c in contents for v in self._values(then)]
        return []

    def _finish_string(self, top: tuple) -> list[bytes]:
        """Ways to finish a string's content (not its closing quote)."""
        _, spec, st, esc, part, _ = top
        if esc:
            hexd = esc[2:] if esc != "\\" else None
            options = []
            if hexd is None:
                for letter, ch in _ESCAPE_LETTERS.items():
                    nxt = spec.add(st, ch)
                    if nxt is not None:
                        options += [bytes([letter]) + r for r in self._string_completions(spec, nxt)]
            for u in _U_ESCAPES:
                if hexd is None or u.startswith(hexd):
                    nxt = spec.add(st, chr(int(u, 16)))
                    if nxt is not None:
                        head = b"u" + u.encode() if hexd is None else u[len(hexd):].encode()
                        options += [head + r for r in self._string_completions(spec, nxt)]
            best = self._cheapest(options, b'"')
            return [] if best is None else [best]
        if part:
            need = _utf8_length(part[0]) - len(part)
            tails = list(self.vocab.continuations.get(need, ()))
            found = spec.extend(st, _utf8_range(part))
            if found is not None:
                tails.append(found[0].encode("utf-8")[len(part):])
            options = []
            for tail in reversed(tails):  # one token if the vocabulary has one, else byte by byte
                try:
                    ch = (part + tail).decode("utf-8")
                except UnicodeDecodeError:
                    continue
                nxt = spec.add(st, ch)
                if nxt is not None:
                    options += [tail + r for r in self._string_completions(spec, nxt)]
                    if len(options) >= 2:
                        break
            return options
        return self._string_completions(spec, st)

    # -- the reserve -------------------------------------------------------------------------

    def reserve(self, sid: int) -> float:
        """An upper bound on the closing after any one token (at least the closing now)."""
        hit = self._reserve.get(sid)
        if hit is not None:
            return hit
        now = self.closing(sid)
        worst = now[0] if now is not None else _INF
        for cfg in self._states[sid]:
            cfg = self._loosen(cfg)
            bound = self._reserve_cfgs.get(cfg)
            if bound is None:
                bound = self._reserve_cfgs[cfg] = self._reserve_cfg(cfg)
            worst = max(worst, bound)
            if worst == _INF:
                break
        self._reserve[sid] = worst
        return worst

    @staticmethod
    def _loosen(cfg: tuple) -> tuple:
        """For the reserve, a string with a maxLength is taken at the start of its
        content, with no maximum: every token allowed later is allowed there, and after
        it the closing is the same (a string's closing does not depend on how long it
        is, past minLength). So the bound holds, and is worked out once per string."""
        top = cfg[-1]
        if top[0] != "S" or top[1].regex is not None or top[1].max_len is None:
            return cfg
        spec, st = top[1], top[2]
        return cfg[:-1] + (("S", spec.unbounded(), (None, min(st[1], spec.min_len))) + top[3:],)

    def _reserve_cfg(self, cfg: tuple) -> float:
        single = self._intern(frozenset({cfg}))
        top = cfg[-1]
        if top[0] == "X":
            return _INF
        worst = 0.0
        if top[0] == "S" and not top[3] and not top[4]:
            # Plain content only adds characters: by count, or by the pattern's worst state.
            spec, st = top[1], top[2]
            if spec.regex is None:
                if spec.min_len or spec.max_len is not None:
                    counts = set(self.vocab.plain_char_counts)
                    nxt = st
                    for k in range(1, max(counts, default=0) + 1):
                        nxt = spec.add(nxt, "a")
                        if nxt is None:
                            break
                        if k in counts:
                            after = self.closing(self._intern(frozenset({cfg[:-1] + (top[:2] + (nxt,) + top[3:],)})))
                            if after is not None:
                                worst = max(worst, after[0])
                else:
                    after = self.closing(single)
                    worst = max(worst, after[0] if after is not None else _INF)
            else:
                ended = self._string_tail_cost(cfg)
                per_char = max((self.vocab.cost(_json_char(ch)) for ch in spec.regex.atoms()), default=1.0)
                worst = max(worst, ended + spec.worst_chars * per_char)
            trie = self.vocab.special_trie
        else:
            trie = self.vocab.trie
        return max(worst, self._walk(single, trie))

    def _frames_rest(self, frames: tuple) -> bytes | None:
        """What closes each of these frames, innermost (last) first; None if one cannot close."""
        suffix = b""
        for frame in frames:
            rest = self._frame_rest(frame)
            if rest is None:
                return None
            suffix = rest + suffix
        return suffix

    def _string_tail_cost(self, cfg: tuple) -> float:
        """Tokens of a closing after the string on top ends here ("  + the rest)."""
        top = cfg[-1]
        owner = cfg[-2] if top[-1] is not None else None
        below = cfg[:-2] if owner is not None else cfg[:-1]
        suffix = self._frames_rest(below)
        if suffix is None:
            return _INF
        if owner is None:
            return self.vocab.cost(b'"' + suffix)
        onode = owner[1]
        count, used = _key_written(owner, _key_after(top))
        value = self.minimal.get(top[-1])
        rest = self._object_rest(onode, len(onode.props), count, "after", used)
        if value is None or rest is None:
            return _INF
        return self.vocab.cost(b'": ' + value + rest + suffix)

    def _walk(self, sid: int, trie: _Trie) -> float:
        """The largest closing after a token of `trie` the automaton accepts from sid."""
        worst = 0.0
        stack = [(0, sid)]
        dead = self.dead
        edges, token, kids = trie.edges, trie.token, trie.kids
        while stack:
            node, s = stack.pop()
            for b in kids[node]:
                nxt = self.step(s, b)
                if nxt == dead:
                    continue
                child = edges[node * 256 + b]
                if token[child] >= 0:
                    after = self.closing(nxt)
                    if after is None:
                        return _INF
                    if after[0] > worst:
                        worst = after[0]
                if kids[child]:
                    stack.append((child, nxt))
        return worst


def _items_seen(node: _Node, count: int) -> int:
    """An array's item count as far as its schema can tell counts apart (so that the
    states of item 7 and item 8 of a long list are one state)."""
    if node.max_items is not None:
        return count
    return min(count, max(node.min_items, len(node.prefix)))


def _props_seen(node: _Node, count: int) -> int:
    return count if node.max_props is not None else min(count, node.min_props)


def _key_written(owner: tuple, state: tuple) -> tuple[int, frozenset]:
    """An object's (count, used) once an additional key in `state` is written: a key of
    one character seen before (json.loads keeps one of them) does not count again."""
    node, count, used = owner[1], owner[3], owner[6]
    short = state[0] if isinstance(state[0], str) else None
    if short is not None and node.min_props:
        if short in used:
            return count, used
        used = used | {short}
    return _props_seen(node, count + 1), used


def _key_after(top: tuple) -> tuple:
    """The state of a key string once its pending escape or UTF-8 character is written
    (a character that is never one of the filling keys' letters)."""
    spec, state, esc, part = top[1], top[2], top[3], top[4]
    if isinstance(spec, _KeySpec) and (esc or part):
        return spec.add(state, "\x00")
    return state


def _utf8_length(lead: int) -> int:
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def _utf8_second_ok(part: bytes, b: int) -> bool:
    if len(part) != 1:
        return True
    lead = part[0]
    if lead == 0xE0:
        return b >= 0xA0
    if lead == 0xED:
        return b <= 0x9F
    if lead == 0xF0:
        return b >= 0x90
    if lead == 0xF4:
        return b <= 0x8F
    return True


def _utf8_range(part: bytes) -> tuple[int, int]:
    """The code points whose UTF-8 encoding starts with `part`."""
    n = _utf8_length(part[0])
    lo = part + b"\x80" * (n - len(part))
    hi = part + b"\xbf" * (n - len(part))
    if len(part) == 1:
        lo = part + bytes([{0xE0: 0xA0, 0xF0: 0x90}.get(part[0], 0x80)]) + b"\x80" * (n - 2)
        hi = part + bytes([{0xED: 0x9F, 0xF4: 0x8F}.get(part[0], 0xBF)]) + b"\xbf" * (n - 2)
    return ord(lo.decode("utf-8")), ord(hi.decode("utf-8"))


_plans: "weakref.WeakKeyDictionary[Any, dict[str, _Plan]]" = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()
_PLANS_KEPT = 16
_PLAN_STATES_KEPT = 200_000


def _plan(tokenizer: Any, schema: Any) -> _Plan:
    """The plan for a schema (as the constraint uses it: objects closed), shared by the
    answers that use the same tokenizer and schema."""
    key = json.dumps(schema, sort_keys=True)
    vocab = _vocabulary(tokenizer)
    with _plans_lock:
        per = _plans.setdefault(tokenizer, {})
        plan = per.pop(key, None)
        if plan is None or len(plan._states) > _PLAN_STATES_KEPT:
            plan = _Plan(vocab, schema)  # answers still using a grown one keep it
        per[key] = plan  # most recently used last
        while len(per) > _PLANS_KEPT:
            per.pop(next(iter(per)))
        return plan


# --------------------------------------------------------------------------------------
# Following a constraint, and checking closings against it.
# --------------------------------------------------------------------------------------

class JsonCloser:
    """Follows one answer's Constraint (by its `tokens`) and says how to close it.

    Nothing here consumes tokens in the constraint: closings are tried on a fork."""

    def __init__(self, constraint: Constraint, schema: Mapping[str, Any] | None = None):
        if schema is None:
            schema = constraint.schema
        elif isinstance(schema, Mapping):
            schema = close_objects(schema)
        if schema is None:
            raise ConstraintError("closing a constraint needs the JSON schema it was made from")
        self._constraint = constraint
        self._plan = _plan(constraint.tokenizer, schema)
        self._vocab = self._plan.vocab
        self._read = 0
        self._sid = self._plan.start
        self._checked: tuple[int, int, list[int]] | None = None  # (state, tokens read, closing)
        # How many closings came from the search (the automaton's proposal refused or
        # missing): 0 wherever this module models the schema as llguidance does.
        self.searched = 0

    # -- following -------------------------------------------------------------------------

    def _sync(self) -> None:
        tokens = self._constraint.tokens
        if self._read == len(tokens):
            return
        plan = self._plan
        with plan.lock:
            sid = self._sid
            for t in tokens[self._read:]:
                sid = plan.feed(sid, self._vocab.token_bytes[t])
            self._sid = sid
        self._read = len(tokens)

    @property
    def lost(self) -> bool:
        """The answer went where this module's model of the schema does not follow (a
        feature it does not model): closings then come from the search alone."""
        self._sync()
        plan = self._plan
        with plan.lock:
            return self._sid == plan.dead or plan.closing(self._sid) is None

    # -- the closing -------------------------------------------------------------------------

    def _proposal(self) -> list[int] | None:
        plan = self._plan
        with plan.lock:
            found = plan.closing(self._sid)
        if found is None:
            return None
        return self._vocab.shortest(found[1])

    def tokens(self) -> list[int]:
        """The closing: the fewest tokens after which the constraint is finished (or, for
        a top-level number, accepting). Always accepted by the constraint."""
        self._sync()
        checked = self._checked
        if checked is not None and checked[1] == self._read:
            return list(checked[2])
        if checked is not None and checked[0] == self._sid and self._accepted(checked[2]):
            closing = checked[2]  # same state of the structure: the same closing
        else:
            proposal = self._proposal()
            if proposal is not None and self._accepted(proposal):
                closing = proposal
            else:
                closing = _search(self._constraint, self._vocab, proposal or [])
                self.searched += 1
        self._checked = (self._sid, self._read, closing)
        return list(closing)

    def _accepted(self, tokens: list[int]) -> bool:
        matcher = self._constraint.fork()._matcher
        if matcher.try_consume_tokens(list(tokens)) != len(tokens):
            return False
        return matcher.is_stopped() or matcher.is_accepting()

    def length(self) -> int:
        """len(tokens()), checked against the grammar whenever the structure's state
        changed (once per state: inside a string this is a dictionary lookup)."""
        self._sync()
        checked = self._checked
        if checked is not None and (checked[1] == self._read or (checked[0] == self._sid and not self.lost)):
            return len(checked[2])
        return len(self.tokens())

    def reserve(self) -> int:
        """How many tokens to keep in hand before sampling one more: at least length(),
        and at least the closing after any single next token. Sample only while
        max_tokens - len(output) > reserve(); then append tokens()."""
        now = self.length()
        if self.lost:
            return now + _LOST_MARGIN  # a margin, not a bound
        plan = self._plan
        with plan.lock:
            bound = plan.reserve(self._sid)
        return max(now, int(bound)) if bound != _INF else max(now, _FALLBACK_RESERVE)

    def length_after(self, token: int) -> int | None:
        """The closing's length (as this module computes it, unchecked) after `token`,
        None if the token leaves the schema or this module's model of it."""
        self._sync()
        plan = self._plan
        with plan.lock:
            sid = plan.feed(self._sid, self._vocab.token_bytes[int(token)])
            found = plan.closing(sid)
        return None if found is None else int(found[0])


_FALLBACK_RESERVE = 64
_LOST_MARGIN = 8


def _search(constraint: Constraint, vocab: _Vocabulary, hint: list[int], budget: int = 400,
            max_depth: int = 256, width: int = 512) -> list[int]:
    """A closing found by the grammar alone: breadth-first over `hint`'s tokens, the JSON
    punctuation tokens and tokens of one byte (tried in that order), merging paths that
    wrote the same bytes, and states that took as many bytes and that the matcher's
    next-token masks cannot tell apart; at most `budget` masks and `width` states a
    level. For what the automaton above does not model."""
    root = constraint.fork()._matcher
    if root.is_stopped() or root.is_accepting():
        return []
    order = list(dict.fromkeys(list(hint) + vocab.structural + sorted(vocab.single_byte.values())))
    pool = np.array(order, dtype=np.int64)
    ends = constraint.end_ids
    frontier = [(root, [], b"")]
    written: set[bytes] = {b""}
    seen: set[tuple[bytes, int]] = set()
    masks = 0
    for _ in range(max_depth):
        nxt = []
        for matcher, toks, data in frontier:
            if masks >= budget:
                break
            mask = matcher.compute_bitmask()
            masks += 1
            if (mask, len(data)) in seen:
                continue
            seen.add((mask, len(data)))
            words = np.frombuffer(mask, dtype=np.uint32)
            allowed = pool[((words[pool >> 5] >> (pool & 31).astype(np.uint32)) & 1).astype(bool)]
            for t in allowed.tolist():
                more = data + vocab.token_bytes[t]
                if t in ends or more in written:
                    continue
                written.add(more)
                child = matcher.deep_copy()
                if not child.consume_token(t):
                    continue
                if child.is_stopped() or child.is_accepting():
                    return toks + [t]
                nxt.append((child, toks + [t], more))
        if not nxt or masks >= budget:
            break
        frontier = nxt[:width]
    raise ConstraintError("no way to close this JSON answer was found within the search's limits")


# --------------------------------------------------------------------------------------
# Functions for the decode loop.
# --------------------------------------------------------------------------------------

def minimal_document_tokens(tokenizer: Any, schema: Mapping[str, Any]) -> list[int]:
    """The shortest whole answer the schema allows, in tokens."""
    return JsonCloser(Constraint.for_json_schema(tokenizer, schema)).tokens()


def check_max_tokens(tokenizer: Any, schema: Mapping[str, Any], max_tokens: int) -> int:
    """Refuse a budget in which no valid answer fits; returns the minimum."""
    least = len(minimal_document_tokens(tokenizer, schema))
    if max_tokens < least:
        raise ConstraintError(
            f"max_tokens={max_tokens} is too few for this schema: its shortest valid answer takes "
            f"{least} tokens; ask for at least {least}"
        )
    return least
