"""The header/tokenizer cache: used when the file is unchanged, never trusted otherwise."""

import os
import shutil
import struct

import pytest

from llm_smolq.cache import header_cache
from llm_smolq.model import gguf_file
from llm_smolq.model import tokenizer as tokenizer_module
from llm_smolq.engine.engine import Engine
from llm_smolq.model.gguf_file import read_header
from llm_smolq.model.model_file import open_model
from llm_smolq.model.tokenizer import GGUFTokenizer

TINY = "tiny-smollm3-Q8_0.gguf"
ROPE_KEY = b"smollm3.rope.freq_base"
TEXTS = [
    "Hello world", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "  spaces\tand\nnewlines  ",
    "naïve café 東京 🙂", "12345 678", "don't won't they'll",
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(root))
    return root


@pytest.fixture
def model(tmp_path, reference_dir):
    path = tmp_path / TINY
    shutil.copyfile(reference_dir / TINY, path)
    return path


def no_parsing(monkeypatch):
    def refuse(path):
        raise AssertionError("the header was parsed although the cache holds it")
    monkeypatch.setattr(gguf_file, "read_header", refuse)


def test_a_second_open_reads_the_cache_and_gets_the_same_header(cache, model, monkeypatch):
    first = open_model(model)
    assert len(list(cache.glob("*.header"))) == 1
    no_parsing(monkeypatch)
    second = open_model(model)
    assert second.metadata == first.metadata
    assert second.tensors == first.tensors
    assert second.config == first.config
    assert second.digest == first.digest == read_header(model).digest


def set_rope_base(path, value):
    """Rewrite one metadata float in place, keeping size, inode and mtime."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    at = data.index(ROPE_KEY) + len(ROPE_KEY)
    assert struct.unpack_from("<I", data, at)[0] == 6  # a float32 follows
    struct.pack_into("<f", data, at + 4, value)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_ino == st.st_ino


def test_a_header_changed_behind_the_same_stat_is_parsed_again(cache, model):
    assert open_model(model).config.rope_theta == 5_000_000.0
    set_rope_base(model, 10_000.0)
    assert open_model(model).config.rope_theta == 10_000.0


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_damaged_entry_is_ignored_and_replaced(cache, model, damage):
    expected = open_model(model).metadata
    (entry,) = cache.glob("*.header")
    blob = bytearray(entry.read_bytes())
    if damage == "flip":
        blob[len(blob) // 2] ^= 0x40
    elif damage == "truncate":
        blob = blob[: len(blob) // 3]
    else:
        blob[:8] = b"SMOLQIX0"
    entry.write_bytes(bytes(blob))
    assert open_model(model).metadata == expected
    assert header_cache.load(entry) is not None  # written again, whole


def test_the_tokenizer_from_cached_files_encodes_as_a_freshly_built_one(cache, smollm2_gguf, monkeypatch):
    fresh = GGUFTokenizer.from_metadata(open_model(smollm2_gguf).metadata)
    Engine(open_model(smollm2_gguf), n_ctx=16, threads=1).tokenizer  # fills the cache
    assert len(list(cache.glob("*.vocab.json"))) == len(list(cache.glob("*.merges.txt"))) == 1

    def refuse(tokens, merges):
        raise AssertionError("the merges were worked out although the cache holds them")
    monkeypatch.setattr(tokenizer_module, "usable_merges", refuse)
    cached = Engine(open_model(smollm2_gguf), n_ctx=16, threads=1).tokenizer
    for text in TEXTS:
        for special in (True, False):
            assert cached.encode(text, special=special) == fresh.encode(text, special=special)
    assert cached.decode(range(500)) == fresh.decode(range(500))
    assert (cached.bos_id, cached.eos_id, cached.add_bos) == (fresh.bos_id, fresh.eos_id, fresh.add_bos)


@pytest.mark.parametrize("name", ["vocab.json", "merges.txt"])
def test_a_damaged_tokenizer_file_is_made_again(cache, model, name):
    expected = Engine(open_model(model), n_ctx=16, threads=1).tokenize("Hello world, again")
    (path,) = cache.glob(f"*.{name}")
    good = path.read_bytes()
    path.write_bytes(good.replace(b"1", b"2", 1))  # still parses: only the checksum can tell
    assert Engine(open_model(model), n_ctx=16, threads=1).tokenize("Hello world, again") == expected
    assert path.read_bytes() == good


def test_off_writes_nothing(tmp_path, model, monkeypatch):
    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    Engine(open_model(model), n_ctx=16, threads=1).tokenizer
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()


def test_the_default_place_is_the_xdg_cache(tmp_path, model, monkeypatch):
    monkeypatch.delenv("SMOLQ_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    open_model(model)
    assert list((tmp_path / "xdg" / "llm-smolq").glob("*.header"))


def test_an_unwritable_cache_is_no_cache_and_no_error(tmp_path, model, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(blocker / "cache"))
    assert open_model(model).config.n_layers == 4
    assert Engine(open_model(model), n_ctx=16, threads=1).tokenize("Hello")


def test_the_least_recently_used_entries_go_past_the_limit(cache, model, tmp_path, reference_dir, monkeypatch):
    monkeypatch.setattr(header_cache, "MAX_ENTRIES", 2)
    copies = []
    for i in range(3):
        copy = tmp_path / f"copy-{i}.gguf"
        shutil.copyfile(model, copy)
        os.utime(copy, ns=(0, 10**18 + i))  # distinct stat keys
        copies.append(copy)
    open_model(copies[0])
    os.utime(next(cache.glob("*.header")), ns=(0, 1))  # the oldest entry
    open_model(copies[1])
    open_model(copies[2])
    entries = sorted(cache.glob("*.header"))
    assert len(entries) == 2
    assert header_cache.entry_for(str(copies[0])) not in entries


def test_tokenizer_files_gone_before_they_are_read_mean_building_instead(tmp_path, model):
    meta = open_model(model).metadata
    expected = GGUFTokenizer.from_metadata(meta).encode("Hello world")
    missing = (tmp_path / "gone.vocab.json", tmp_path / "gone.merges.txt")
    assert GGUFTokenizer.from_metadata(meta, bpe_files=missing).encode("Hello world") == expected
