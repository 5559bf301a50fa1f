"""Packed weights kept on disk (store/packed_cache.py): a second load maps what the first
packed, with the same logits; a damaged, torn or foreign entry is packed again; no room,
or the cache off, packs into memory as before; at most KEEP entries stay."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import llm_smolq
from llm_smolq.engine import packing
from llm_smolq.store import packed_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SMOLQ_PACK", "1")
    return tmp_path


@pytest.fixture
def packs(monkeypatch) -> list[str]:
    """The model files packed (rather than mapped from a kept entry), in order."""
    done: list[str] = []
    real = packing._pack_into

    def spy(model, *args):
        done.append(model.path)
        real(model, *args)

    monkeypatch.setattr(packing, "_pack_into", spy)
    return done


def replace(path, data: bytes) -> None:
    """path's bytes replaced by a new file (as a writer would), leaving mappings of the old one be."""
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    new.replace(path)


@pytest.fixture
def model(reference_dir, tmp_path):
    """A copy of a reference model of its own (its entry's name follows the file)."""
    path = tmp_path / "model.gguf"
    shutil.copyfile(reference_dir / "tiny-smollm3-Q4_K_M.gguf", path)
    return path


def entries(cache) -> list[str]:
    folder = cache / "packed"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def logits(eng) -> bytes:
    eng.reset()
    return eng.eval([1, 5, 9, 200, 17], all_logits=True).tobytes() + eng.eval([3]).tobytes()


def test_a_second_load_maps_what_the_first_packed(cache, model, monkeypatch, packs):
    first = llm_smolq.load(model, n_ctx=32, threads=2)
    assert first._packed and len(entries(cache)) == 1 and packs == [str(model)]
    second = llm_smolq.load(model, n_ctx=32, threads=2)
    assert second.model.packed_data is not first.model.packed_data
    assert packs == [str(model)]  # mapped from the kept file
    assert not second.model.packed_data.flags.writeable and not first.model.packed_data.flags.writeable
    assert second._packed == first._packed
    assert second.model.packed_data.tobytes() == first.model.packed_data.tobytes()
    assert logits(second) == logits(first)
    # and the same as the file's own layout
    monkeypatch.setenv("SMOLQ_PACK", "0")
    assert logits(llm_smolq.load(model, n_ctx=32, threads=2)) == logits(first)


@pytest.mark.parametrize("damage", ["a flipped byte", "torn off", "another sum", "another file's"])
def test_an_entry_that_does_not_check_out_is_packed_again(cache, model, damage, tmp_path, packs):
    want = llm_smolq.load(model, n_ctx=32, threads=1)
    (name,) = entries(cache)
    path = cache / "packed" / name
    data = bytearray(path.read_bytes())
    if damage == "a flipped byte":
        data[1000] ^= 0x10
    elif damage == "torn off":
        data = data[:-100]
    elif damage == "another sum":
        data[-1] ^= 1
    else:  # a good entry of another file of the same size, under this one's name
        other = tmp_path / "other.gguf"
        shutil.copyfile(model, other)
        st = os.stat(other)
        os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        data = llm_smolq.load(other, n_ctx=32, threads=1).model.packed_kept.read_bytes()
    replace(path, bytes(data))
    packs.clear()
    again = llm_smolq.load(model, n_ctx=32, threads=1)
    assert packs == [str(model)]  # packed anew, not mapped from the entry
    assert logits(again) == logits(want)
    kept = llm_smolq.load(model, n_ctx=32, threads=1)  # and kept again, good now
    assert packs == [str(model)] and logits(kept) == logits(want)


def test_a_changed_model_file_gets_a_new_entry(cache, model, packs):
    llm_smolq.load(model, n_ctx=32, threads=1)
    before = entries(cache)
    st = os.stat(model)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    llm_smolq.load(model, n_ctx=32, threads=1)
    assert packs == [str(model)] * 2 and len(entries(cache)) == 2 and before[0] in entries(cache)


def test_no_room_packs_into_memory(cache, model, monkeypatch, packs):
    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "posix_fallocate", full)
        eng = llm_smolq.load(model, n_ctx=32, threads=1)
    assert eng._packed and packs == [str(model)]
    assert [p.name for p in (cache / "packed").iterdir()] == []  # nothing kept, no temporary file left
    monkeypatch.setenv("SMOLQ_PACK", "0")
    assert logits(eng) == logits(llm_smolq.load(model, n_ctx=32, threads=1))


def test_the_cache_off_packs_into_memory(cache, model, monkeypatch, packs):
    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    eng = llm_smolq.load(model, n_ctx=32, threads=1)
    llm_smolq.load(model, n_ctx=32, threads=1)
    assert eng._packed and packs == [str(model)] * 2 and not (cache / "packed").exists()


def test_at_most_keep_entries_stay(cache, model, tmp_path):
    names = []
    for i in range(packed_cache.KEEP + 2):
        copy = tmp_path / f"copy{i}.gguf"
        shutil.copyfile(model, copy)
        names.append(llm_smolq.load(copy, n_ctx=32, threads=1).model.packed_kept.name)
        st = os.stat(cache / "packed" / names[-1])  # older than the next one
        os.utime(cache / "packed" / names[-1], ns=(st.st_atime_ns, st.st_mtime_ns - (10 - i) * 10**9))
    assert entries(cache) == sorted(names[-packed_cache.KEEP:])


def test_the_word_sum_is_the_same_in_any_number_of_pieces():
    data = np.random.default_rng(3).integers(0, 256, 8 * 1001, dtype=np.uint8)
    want = int(data.view("<u8").astype(object).sum()) % (1 << 64)
    assert {packed_cache.word_sum(data, threads) for threads in (1, 2, 3, 7)} == {want}


def test_cache_info_and_clear_tell_of_the_packed_weights(cache, model, user_dir):
    from llm.cli import cli
    from click.testing import CliRunner

    llm_smolq.load(model, n_ctx=32, threads=1)
    (entry,) = entries(cache)
    size = (cache / "packed" / entry).stat().st_size
    info = CliRunner().invoke(cli, ["smolq", "cache", "info"])
    assert info.exit_code == 0 and f"in 1 file in {cache / 'packed'}" in info.output
    cleared = CliRunner().invoke(cli, ["smolq", "cache", "clear", "--packed"])
    assert cleared.exit_code == 0 and cleared.output.startswith("Deleted 1 file (") and entries(cache) == []
    assert size > 0


def test_llm_says_once_where_the_packed_weights_were_kept(user_dir, monkeypatch, tmp_path):
    from helpers.llm_cli import run

    from llm_smolq.plugin import loaded

    loaded.in_memory.clear()  # loaded here, not kept from another test
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SMOLQ_PACK", "1")
    first = run("-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "2", "Hi")
    (line,) = [line for line in first.stderr.splitlines() if "packed weights" in line]
    assert f"in {tmp_path / 'cache' / 'packed'} so its next load skips packing them" in line
    assert "`llm smolq cache clear --packed` deletes them" in line
    loaded.in_memory.clear()  # a new process: the kept copy is mapped, nothing more to say
    again = run("-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "2", "Hi")
    assert "packed weights" not in again.stderr


def test_each_set_of_packed_matrices_is_an_entry_of_its_own(cache, model, monkeypatch, packs):
    """The kernel's paths pack different sets (the AVX2 one only Q4_K): a copy packed for
    one set is never mapped for another, whatever its size."""
    assert packed_cache.entry_path(model, "a@0") != packed_cache.entry_path(model, "b@0")
    everything = llm_smolq.load(model, n_ctx=32, threads=1)  # SMOLQ_PACK=1: every packable matrix
    monkeypatch.setattr(packing, "_wanted", lambda info: info.type.name == "Q4_K")
    only_q4_k = llm_smolq.load(model, n_ctx=32, threads=1)
    assert packs == [str(model)] * 2 and len(entries(cache)) == 2
    assert set(only_q4_k._packed) < set(everything._packed)
    assert logits(only_q4_k) == logits(everything)
    again = llm_smolq.load(model, n_ctx=32, threads=1)  # mapped from its own entry
    assert packs == [str(model)] * 2 and logits(again) == logits(everything)
