"""Packed weights kept on disk (store/packed_cache.py): a second load maps what the first
packed, with the same logits; a copy of the file under another name, or the kernel
installed again, maps it too, while a file whose weights differ gets its own; a damaged,
torn or foreign entry is packed again; no room, or the cache off, packs into memory as
before; at most KEEP entries stay, least recently used going first, and one a running
model has mapped keeps working once deleted; llm states the bound."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import llm_smolq
from llm_smolq.engine import packing
from llm_smolq.model.model_file import open_model
from llm_smolq.store import packed_cache
from llm_smolq.store.catalog import format_size


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SMOLQ_PACK", "1")
    return tmp_path / "cache"


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
    """A copy of a reference model of its own."""
    path = tmp_path / "model.gguf"
    shutil.copyfile(reference_dir / "tiny-smollm3-Q4_K_M.gguf", path)
    return path


def variant(model, i: int):
    """A copy of model whose weights differ from it (and from every other variant) in one
    byte of a packed matrix's codes."""
    path = model.with_name(f"variant{i}.gguf")
    data = bytearray(model.read_bytes())
    data[open_model(model).tensors["blk.1.ffn_up.weight"].offset + 100] ^= i + 1  # a Q4_K block's codes
    path.write_bytes(data)
    return path


def entries(cache) -> list[str]:
    folder = cache / "packed"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def age(cache, name: str, seconds_ago: float) -> None:
    """The entry's last use put seconds_ago (the clock's tick is too coarse to order loads)."""
    t = time.time() - seconds_ago
    os.utime(cache / "packed" / name, (t, t))


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
def test_an_entry_that_does_not_check_out_is_packed_again(cache, model, damage, packs):
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
    else:  # a good entry of a file of the same size whose weights differ, under this one's name
        data = llm_smolq.load(variant(model, 0), n_ctx=32, threads=1).model.packed_kept.read_bytes()
    replace(path, bytes(data))
    packs.clear()
    again = llm_smolq.load(model, n_ctx=32, threads=1)
    assert packs == [str(model)]  # packed anew, not mapped from the entry
    assert logits(again) == logits(want)
    kept = llm_smolq.load(model, n_ctx=32, threads=1)  # and kept again, good now
    assert packs == [str(model)] and logits(kept) == logits(want)


def test_a_copy_of_the_file_under_another_name_maps_the_same_entry(cache, model, tmp_path, packs):
    first = llm_smolq.load(model, n_ctx=32, threads=1)
    (entry,) = entries(cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copy = elsewhere / "Another Name.gguf"
    shutil.copyfile(model, copy)  # another inode, mtime and path
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = os.stat(model)  # and the file itself, only touched
    os.utime(model, ns=(touched.st_atime_ns, touched.st_mtime_ns + 5 * 10**9))
    loads = [llm_smolq.load(path, n_ctx=32, threads=1) for path in (copy, model)]
    assert packs == [str(model)] and entries(cache) == [entry]
    assert all(eng.model.packed_kept is None for eng in loads)  # mapped, nothing written
    assert {logits(eng) for eng in loads} == {logits(first)}


def test_a_file_that_differs_in_its_weights_gets_its_own_entry(cache, model, packs):
    original = llm_smolq.load(model, n_ctx=32, threads=1)
    other = llm_smolq.load(variant(model, 0), n_ctx=32, threads=1)
    assert packs == [str(model), str(variant(model, 0))] and len(entries(cache)) == 2
    assert other.model.packed_data.tobytes() != original.model.packed_data.tobytes()
    again = llm_smolq.load(model, n_ctx=32, threads=1)  # each maps its own
    assert len(packs) == 2 and again.model.packed_data.tobytes() == original.model.packed_data.tobytes()


def test_a_matrix_changed_deep_inside_a_large_file_gets_its_own_entry(cache, smollm2_gguf, tmp_path, packs):
    """A fine-tune merged into one matrix in the middle of the file, far from the first and
    last MiB and with the same header: the runs sampled along every packed matrix see it."""
    from llm_smolq.store.kernel_identity import weights_edges

    data = bytearray(smollm2_gguf.read_bytes())
    tensors = open_model(smollm2_gguf).tensors
    a, b = tensors["blk.15.attn_q.weight"], tensors["blk.16.attn_q.weight"]
    assert a.shape == b.shape and a.type == b.type
    data[a.offset:a.offset + a.n_bytes] = data[b.offset:b.offset + b.n_bytes]
    merged = tmp_path / "merged.gguf"
    merged.write_bytes(data)
    del data
    first = llm_smolq.load(smollm2_gguf, n_ctx=32, threads=2)
    second = llm_smolq.load(merged, n_ctx=32, threads=2)
    assert weights_edges(second.model) == weights_edges(first.model)  # the ends alone would not tell them apart
    assert second.model.digest == first.model.digest and len(second.model.data) == len(first.model.data)
    assert packs == [str(smollm2_gguf), str(merged)] and len(entries(cache)) == 2
    at = first._packed["blk.15.attn_q.weight"]
    assert (second.model.packed_data[at:at + a.n_bytes].tobytes()
            != first.model.packed_data[at:at + a.n_bytes].tobytes())


CHILD = """
import importlib.util, json, sys
import llm_smolq
spec = importlib.util.spec_from_file_location("llm_smolq._kernel", sys.argv[1])
kernel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel)
sys.modules["llm_smolq._kernel"] = llm_smolq._kernel = kernel
from llm_smolq.store.kernel_identity import kernel_fingerprint
eng = llm_smolq.load(sys.argv[2], n_ctx=32, threads=1)
eng.reset()
print(json.dumps({"kernel": kernel_fingerprint()["sha256"], "file": llm_smolq._kernel.__file__,
                  "kept": str(eng.model.packed_kept), "packed": len(eng._packed),
                  "logits": eng.eval([1, 5, 9, 200, 17], all_logits=True).tobytes().hex()}))
"""


def test_the_kernel_installed_again_maps_the_same_entry(cache, model, tmp_path):
    """The same kernel built and installed elsewhere: other bytes in the module file (paths,
    build ids), so another sha256, the same packing. Its process maps the entry kept."""
    from llm_smolq._kernel import __file__ as kernel_file
    from llm_smolq.store.kernel_identity import kernel_fingerprint

    eng = llm_smolq.load(model, n_ctx=32, threads=1)
    eng.reset()
    want = eng.eval([1, 5, 9, 200, 17], all_logits=True).tobytes().hex()
    (entry,) = entries(cache)
    reinstalled = tmp_path / "site-packages" / "llm_smolq" / os.path.basename(kernel_file)
    reinstalled.parent.mkdir(parents=True)
    reinstalled.write_bytes(open(kernel_file, "rb").read() + b"\0built in another directory\0")
    run = subprocess.run([sys.executable, "-c", CHILD, str(reinstalled), str(model)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "SMOLQ_CACHE_DIR": str(cache)})
    assert run.returncode == 0, run.stderr[-3000:]
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert child["file"] == str(reinstalled) and child["kernel"] != kernel_fingerprint()["sha256"]
    assert child["packed"] == len(eng._packed) and child["kept"] == "None"  # mapped, not packed and kept
    assert entries(cache) == [entry] and child["logits"] == want


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
    assert eng._packed and packs == [str(model)] * 2 and not cache.exists()


def test_at_most_keep_entries_stay_the_least_recently_used_going_first(cache, model, monkeypatch):
    keep = packed_cache.KEEP
    seen_at_reserve = []
    real = packed_cache._reserve

    def spy(path, n_bytes):  # how many entries there are when a new one's space is taken
        seen_at_reserve.append(len(entries(cache)))
        return real(path, n_bytes)

    monkeypatch.setattr(packed_cache, "_reserve", spy)
    names = []
    for i in range(keep):
        names.append(llm_smolq.load(variant(model, i), n_ctx=32, threads=1).model.packed_kept.name)
        age(cache, names[-1], 100 - i)  # the first made is the least recently used
    assert entries(cache) == sorted(names)
    again = llm_smolq.load(variant(model, 0), n_ctx=32, threads=1)  # the oldest used again: mapped
    assert again.model.packed_kept is None
    for i in range(keep, keep + 2):
        names.append(llm_smolq.load(variant(model, i), n_ctx=32, threads=1).model.packed_kept.name)
        age(cache, names[-1], 100 - i)
    # names[1] and names[2] went (least recently used); names[0] was used after them
    assert entries(cache) == sorted([names[0], *names[-(keep - 1):]])
    assert max(seen_at_reserve) == keep - 1 and len(seen_at_reserve) == keep + 2


def test_entries_another_process_made_meanwhile_are_counted_too(cache, model, monkeypatch):
    names = []
    for i in range(packed_cache.KEEP - 1):
        names.append(llm_smolq.load(variant(model, i), n_ctx=32, threads=1).model.packed_kept.name)
        age(cache, names[-1], 100 - i)
    real = packing._pack_into

    def meanwhile(*args):  # another process keeps a model while this one packs
        other = cache / "packed" / f"{'ab' * 16}{packed_cache.SUFFIX}"
        shutil.copyfile(cache / "packed" / names[-1], other)
        age(cache, other.name, 50)
        real(*args)

    monkeypatch.setattr(packing, "_pack_into", meanwhile)
    new = llm_smolq.load(variant(model, packed_cache.KEEP), n_ctx=32, threads=1).model.packed_kept.name
    assert entries(cache) == sorted([new, f"{'ab' * 16}{packed_cache.SUFFIX}", *names[1:]])
    assert len(entries(cache)) == packed_cache.KEEP


def test_a_copy_a_running_model_maps_keeps_working_once_deleted(cache, model):
    """On Linux a deleted file's pages stay while a mapping holds them: an entry evicted by
    another load (here, of this process; another process's is the same) leaves the model
    that mapped it with its weights."""
    mapped = llm_smolq.load(model, n_ctx=32, threads=1)  # packs and keeps
    mapped = llm_smolq.load(model, n_ctx=32, threads=1)  # maps the kept entry
    assert mapped.model.packed_kept is None
    (entry,) = entries(cache)
    want = logits(mapped)
    age(cache, entry, 100)
    for i in range(packed_cache.KEEP):
        llm_smolq.load(variant(model, i), n_ctx=32, threads=1)
    assert entry not in entries(cache) and len(entries(cache)) == packed_cache.KEEP
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    assert not maps or f"{cache / 'packed' / entry} (deleted)" in maps
    assert logits(mapped) == want


def test_the_word_sum_is_the_same_in_any_number_of_pieces():
    data = np.random.default_rng(3).integers(0, 256, 8 * 1001, dtype=np.uint8)
    want = int(data.view("<u8").astype(object).sum()) % (1 << 64)
    assert {packed_cache.word_sum(data, threads) for threads in (1, 2, 3, 7)} == {want}


def test_the_bound_is_keep_times_the_largest_model_here(cache, model, user_dir, smollm2_gguf):
    assert packed_cache.most_bytes([]) == 0
    assert packed_cache.most_bytes([5, 90, 7]) == packed_cache.KEEP * 90
    assert packed_cache.most_bytes_here() == packed_cache.KEEP * smollm2_gguf.stat().st_size  # the file in the store
    big = packed_cache.KEEP * smollm2_gguf.stat().st_size
    assert packed_cache.most_bytes_here(smollm2_gguf.stat().st_size + 1) == big + packed_cache.KEEP


def test_cache_info_and_clear_tell_of_the_packed_weights(cache, model, user_dir, smollm2_gguf):
    from llm.cli import cli
    from click.testing import CliRunner

    llm_smolq.load(model, n_ctx=32, threads=1)
    (entry,) = entries(cache)
    size = (cache / "packed" / entry).stat().st_size
    info = CliRunner().invoke(cli, ["smolq", "cache", "info"])
    assert info.exit_code == 0 and f"in 1 file in {cache / 'packed'}" in info.output
    most = format_size(packed_cache.KEEP * smollm2_gguf.stat().st_size)
    assert f"the {packed_cache.KEEP} last used copies are kept, up to {most} with the models here" in info.output
    assert f"  {entry}: {format_size(size)}, last used " in info.output
    cleared = CliRunner().invoke(cli, ["smolq", "cache", "clear", "--packed"])
    assert cleared.exit_code == 0 and cleared.output.startswith("Deleted 1 file (") and entries(cache) == []
    assert size > 0


def test_llm_says_once_where_the_packed_weights_were_kept_and_how_many(user_dir, monkeypatch, tmp_path,
                                                                        smollm2_gguf):
    from helpers.llm_cli import run

    from llm_smolq.plugin import loaded

    loaded.in_memory.clear()  # loaded here, not kept from another test
    cache = tmp_path / "cache"
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(cache))
    monkeypatch.setenv("SMOLQ_PACK", "1")
    first = run("-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "2", "Hi")
    (line,) = [line for line in first.stderr.splitlines() if "packed weights" in line]
    (entry,) = entries(cache)
    size = (cache / "packed" / entry).stat().st_size - packed_cache.TRAILER.size
    assert f"packed weights ({format_size(size)}) in " in line
    assert f"in {cache / 'packed'} so its next load skips packing them" in line
    most = format_size(packed_cache.KEEP * smollm2_gguf.stat().st_size)
    assert f"the {packed_cache.KEEP} last used copies are kept, up to {most} with the models here" in line
    assert "`llm smolq cache clear --packed` deletes them" in line
    loaded.in_memory.clear()  # a new process: the kept copy is mapped, nothing more to say
    again = run("-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "2", "Hi")
    assert "packed weights" not in again.stderr
    # the same file registered under another name, as a copy: the same kept copy, nothing said
    copy = tmp_path / "copies" / "SmolLM2 copy.gguf"
    copy.parent.mkdir()
    shutil.copyfile(smollm2_gguf, copy)
    assert run("smolq", "register", str(copy)).exit_code == 0
    loaded.in_memory.clear()
    third = run("-m", "smolq/smollm2-copy", "-o", "temperature", "0", "-o", "max_tokens", "2", "Hi")
    assert third.exit_code == 0 and "packed weights" not in third.stderr
    assert third.stdout == first.stdout and entries(cache) == [entry]


def test_each_set_of_packed_matrices_is_an_entry_of_its_own(cache, model, monkeypatch, packs):
    """The kernel's paths pack different sets (the AVX2 one only Q4_K): a copy packed for
    one set is never mapped for another, whatever its size."""
    everything = llm_smolq.load(model, n_ctx=32, threads=1)  # SMOLQ_PACK=1: every packable matrix
    monkeypatch.setattr(packing, "_wanted", lambda info: info.type.name == "Q4_K")
    only_q4_k = llm_smolq.load(model, n_ctx=32, threads=1)
    assert packs == [str(model)] * 2 and len(entries(cache)) == 2
    assert set(only_q4_k._packed) < set(everything._packed)
    assert logits(only_q4_k) == logits(everything)
    again = llm_smolq.load(model, n_ctx=32, threads=1)  # mapped from its own entry
    assert packs == [str(model)] * 2 and logits(again) == logits(everything)
