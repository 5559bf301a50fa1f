"""Packed weights kept on disk (cache/packed_cache.py): a second load maps what the first
packed, with the same logits; a copy of the file under another name, or the kernel
installed again, maps it too, while a file whose weights differ gets its own, however
small the difference and wherever it lies, the same file edited in place among them; the
weights are hashed once per state of the file, remembered in an index that is hashed
anew when damaged or full, and not remembered, nor an entry kept, for a file changed
moments ago or while it was read; a damaged, torn or foreign entry is packed again; no
room, or the cache off, packs into memory as before; at most KEEP entries stay, least
recently used going first, and one a running model has mapped keeps working once
deleted; llm states the bound."""

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
from llm_smolq.cache import packed_cache
from llm_smolq.store import catalog
from llm_smolq.store.catalog import format_size
from helpers.mappings import THP_CONFIGURED, mapping_of


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SMOLQ_PACK", "1")
    # The files here are written just before they are loaded: take them as settled (the
    # wait for that is tested on its own)
    monkeypatch.setattr(packed_cache, "SETTLED_SECONDS", 0.0)
    return tmp_path / "cache"


@pytest.fixture
def hashes(monkeypatch) -> list[str]:
    """The model files whose weights were hashed whole (their digest not remembered), in order."""
    done: list[str] = []
    real = packed_cache.weights_digest

    def spy(model, *args):
        done.append(model.path)
        return real(model, *args)

    monkeypatch.setattr(packed_cache, "weights_digest", spy)
    return done


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
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(packed_cache.SUFFIX)) if folder.exists() else []


def remembered(cache) -> list[list]:
    """The file states the index holds a digest for, least recently used first."""
    return [r["state"] for r in packed_cache._read_index(cache / "packed" / packed_cache.INDEX)]


def edit_in_place(path, at: int, flip: int, mtime_ns: int | None = None) -> None:
    """One byte of the file changed where it lies (the inode and size stay), as an editor
    writing into it would: the write moves its mtime and ctime on (or, given mtime_ns, the
    mtime is then set to that)."""
    before = os.stat(path)
    time.sleep(0.02)  # past the tick of the clock that stamped the file last
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ flip]))
    if mtime_ns is not None:
        os.utime(path, ns=(before.st_atime_ns, mtime_ns))
    after = os.stat(path)
    assert after.st_ino == before.st_ino and after.st_size == before.st_size
    assert after.st_ctime_ns != before.st_ctime_ns and (mtime_ns is not None or after.st_mtime_ns != before.st_mtime_ns)


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


def test_a_copy_of_the_file_under_another_name_maps_the_same_entry(cache, model, tmp_path, packs, hashes):
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
    assert hashes == [str(model), str(copy), str(model)]  # each a state not seen before: hashed, then found
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
    from llm_smolq.cache.kernel_identity import weights_edges

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


def test_a_file_edited_in_place_gets_a_new_entry_with_the_edited_weights(cache, smollm2_gguf, tmp_path,
                                                                        monkeypatch, packs):
    """One byte changed halfway along a matrix in the middle of SmolLM2, in the file itself
    (the same path, inode, size and header), the mtime moved on as a write moves it: far
    from the first and last MiB, and between the runs a sample along the matrix would
    read. The next load packs the edited weights, and computes what they give."""
    from llm_smolq.cache.kernel_identity import EDGE_BYTES, weights_edges, weights_start

    path = tmp_path / "SmolLM2.gguf"
    shutil.copyfile(smollm2_gguf, path)
    first = llm_smolq.load(path, n_ctx=32, threads=2)
    want_before = logits(first)
    (entry,) = entries(cache)
    info = first.model.tensors["blk.15.attn_q.weight"]
    at = info.offset + info.n_bytes // 2 // 20 * 20 + 10  # a Q4_1 block's codes (2+2 bytes of scales, then 16)
    start = weights_start(first.model)
    assert start + EDGE_BYTES < at < len(first.model.data) - EDGE_BYTES
    span = info.n_bytes - 64
    assert all(not info.offset + span * i // 7 <= at < info.offset + span * i // 7 + 64 for i in range(8))
    edit_in_place(path, at, 0xFF)
    packs.clear()
    edited = llm_smolq.load(path, n_ctx=32, threads=2)
    assert packs == [str(path)] and edited.model.packed_kept is not None  # packed again, and kept
    assert sorted(entries(cache)) == sorted([entry, edited.model.packed_kept.name])
    assert edited.model.digest == first.model.digest and weights_edges(edited.model) == weights_edges(first.model)
    got = logits(edited)
    assert got != want_before
    monkeypatch.setenv("SMOLQ_PACK", "0")  # the edited file as it lies: what its weights give
    assert got == logits(llm_smolq.load(path, n_ctx=32, threads=2))
    monkeypatch.setenv("SMOLQ_PACK", "1")
    packs.clear()
    again = llm_smolq.load(path, n_ctx=32, threads=2)  # and the edited file's own entry from now on
    assert packs == [] and logits(again) == got


def test_an_edit_that_puts_the_mtime_back_is_seen_by_the_ctime(cache, model, monkeypatch, packs, hashes):
    """A tool that writes into the file and then sets its mtime back to what it was
    (touch -r, rsync --inplace -t) leaves path, inode, size and mtime alone; the ctime,
    which no tool can set, moves on."""
    first = llm_smolq.load(model, n_ctx=32, threads=1)
    want_before = logits(first)
    before = os.stat(model)
    edit_in_place(model, first.model.tensors["blk.1.ffn_up.weight"].offset + 100, 0x5A, before.st_mtime_ns)
    after = os.stat(model)
    assert after.st_mtime_ns == before.st_mtime_ns and after.st_ctime_ns != before.st_ctime_ns
    edited = llm_smolq.load(model, n_ctx=32, threads=1)
    assert packs == [str(model)] * 2 and hashes == [str(model)] * 2 and len(entries(cache)) == 2
    got = logits(edited)
    monkeypatch.setenv("SMOLQ_PACK", "0")
    assert got != want_before and got == logits(llm_smolq.load(model, n_ctx=32, threads=1))


def test_a_second_load_of_the_same_file_does_not_hash_it_again(cache, model, packs, hashes):
    first = llm_smolq.load(model, n_ctx=32, threads=2)
    st = os.stat(model)
    assert hashes == [str(model)]
    assert remembered(cache) == [[str(model.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                                  st.st_dev]]
    index = cache / "packed" / packed_cache.INDEX
    written = index.stat().st_mtime_ns
    for _ in range(2):
        again = llm_smolq.load(model, n_ctx=32, threads=2)
        assert again.model.packed_data is not first.model.packed_data and logits(again) == logits(first)
    assert hashes == [str(model)] and packs == [str(model)]  # the digest remembered, the entry mapped
    assert index.stat().st_mtime_ns == written  # nothing to write when the state is the most recent already


def test_the_digest_is_of_every_byte_of_the_weights_on_any_number_of_threads(model, tmp_path, monkeypatch):
    import hashlib

    from llm_smolq.cache import kernel_identity
    from llm_smolq.cache.kernel_identity import weights_digest, weights_start

    monkeypatch.setattr(kernel_identity, "PIECE_BYTES", 100_000)  # pieces of the tiny model: 16 of them
    one = open_model(model)
    start, data = weights_start(one), model.read_bytes()
    pieces = [hashlib.sha256(data[at:at + 100_000]).digest() for at in range(start, len(data), 100_000)]
    want = hashlib.sha256(f"smolq weights: {len(data) - start} bytes in pieces of 100000\n".encode()
                          + b"".join(pieces)).hexdigest()
    assert {weights_digest(one, threads) for threads in (1, 2, 5)} == {want}
    header = tmp_path / "header.gguf"  # a byte of the header (before the weights) is not the weights'
    header.write_bytes(data[:start - 1] + bytes([data[start - 1] ^ 1]) + data[start:])
    assert weights_digest(open_model(header)) == want
    for at in (start, (start + len(data)) // 2, len(data) - 1):
        changed = tmp_path / f"changed{at}.gguf"
        changed.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
        assert weights_digest(open_model(changed)) != want, at


@pytest.mark.parametrize("damage", ["garbage", "torn off", "a flipped byte", "another file's header",
                                    "records of another form"])
def test_a_damaged_index_is_not_trusted_but_hashed_again(cache, model, damage, packs, hashes):
    import hashlib

    want = logits(llm_smolq.load(model, n_ctx=32, threads=1))
    index = cache / "packed" / packed_cache.INDEX
    blob = index.read_bytes()
    head = len(packed_cache.INDEX_MAGIC) + 16
    (record,) = json.loads(blob[head:])

    def sealed(payload) -> bytes:  # an index that checks out, holding `payload`
        data = json.dumps(payload).encode()
        return packed_cache.INDEX_MAGIC + hashlib.blake2b(data, digest_size=16).digest() + data

    if damage == "garbage":
        blob = os.urandom(len(blob))
    elif damage == "torn off":
        blob = blob[:len(blob) // 2]
    elif damage == "a flipped byte":  # the digest remembered changed, the checksum not
        at = blob.index(record["weights"].encode())
        blob = blob[:at] + bytes([blob[at] ^ 1]) + blob[at + 1:]
    elif damage == "another file's header":  # the state remembered with another header's digest and weights
        blob = sealed([{**record, "header": "0" * 64, "weights": "1" * 64}])
    else:
        blob = sealed({"state": record["state"], "weights": "1" * 64})
    replace(index, blob)
    assert remembered(cache) == ([] if damage != "another file's header" else [record["state"]])
    again = llm_smolq.load(model, n_ctx=32, threads=1)
    assert hashes == [str(model)] * 2 and packs == [str(model)]  # hashed again; the entry found by its digest
    assert logits(again) == want
    assert remembered(cache) == [record["state"]] and packed_cache._read_index(index)[-1] == record
    llm_smolq.load(model, n_ctx=32, threads=1)
    assert hashes == [str(model)] * 2  # remembered again


def test_the_index_keeps_the_last_states(cache, model, monkeypatch, hashes):
    monkeypatch.setattr(packed_cache, "REMEMBERED", 3)
    paths = [variant(model, i) for i in range(4)]
    for path in paths:
        llm_smolq.load(path, n_ctx=32, threads=1)
    assert [state[0] for state in remembered(cache)] == [str(p.resolve()) for p in paths[1:]]
    llm_smolq.load(paths[1], n_ctx=32, threads=1)  # remembered: used again, now the most recent
    assert hashes == [str(p) for p in paths]
    assert [state[0] for state in remembered(cache)] == [str(p.resolve()) for p in (paths[2], paths[3], paths[1])]
    llm_smolq.load(paths[0], n_ctx=32, threads=1)  # forgotten: hashed again
    assert hashes == [str(p) for p in (*paths, paths[0])]
    assert [state[0] for state in remembered(cache)] == [str(p.resolve()) for p in (paths[3], paths[1], paths[0])]


def test_a_file_changed_moments_ago_is_neither_remembered_nor_kept(cache, model, monkeypatch, packs, hashes):
    """A change within the same tick of the clock would leave the file's timestamps as they
    are: a file changed less than SETTLED_SECONDS ago is hashed and packed into memory
    only. Once settled, it is remembered and kept."""
    monkeypatch.setattr(packed_cache, "SETTLED_SECONDS", 3600.0)  # the copy was just made
    first = llm_smolq.load(model, n_ctx=32, threads=1)
    assert first._packed and first.model.packed_kept is None and entries(cache) == [] and remembered(cache) == []
    monkeypatch.setattr(packed_cache, "SETTLED_SECONDS", 0.0)  # as if an hour had gone by
    second = llm_smolq.load(model, n_ctx=32, threads=1)
    assert second.model.packed_kept is not None and len(entries(cache)) == 1 and len(remembered(cache)) == 1
    llm_smolq.load(model, n_ctx=32, threads=1)
    assert hashes == [str(model)] * 2 and packs == [str(model)] * 2
    assert logits(second) == logits(first)


def test_a_file_dated_in_the_future_is_remembered_all_the_same(cache, model, packs, hashes):
    """An mtime is whatever a tool set (an archive's, a clock's elsewhere); whether the file
    has settled goes by its ctime, which this machine's clock gave it."""
    st = os.stat(model)
    os.utime(model, ns=(st.st_atime_ns, time.time_ns() + 86400 * 10**9))
    first = llm_smolq.load(model, n_ctx=32, threads=1)
    again = llm_smolq.load(model, n_ctx=32, threads=1)
    assert first.model.packed_kept is not None and len(remembered(cache)) == 1
    assert hashes == [str(model)] and packs == [str(model)] and logits(again) == logits(first)


def test_a_file_changed_while_it_is_packed_is_not_kept(cache, model, monkeypatch, packs, hashes):
    """What was packed may be the weights before or after the edit: nothing is kept under
    the digest taken before it, and the next load packs the edited file."""
    real = packing._pack_into
    at = open_model(model).tensors["blk.1.ffn_up.weight"].offset + 100

    def meanwhile(*args):
        edit_in_place(model, at, 0x5A)
        real(*args)

    monkeypatch.setattr(packing, "_pack_into", meanwhile)
    during = llm_smolq.load(model, n_ctx=32, threads=1)
    monkeypatch.setattr(packing, "_pack_into", real)
    assert during.model.packed_kept is None and entries(cache) == []
    after = llm_smolq.load(model, n_ctx=32, threads=1)
    assert after.model.packed_kept is not None and len(hashes) == 2
    got = logits(after)
    monkeypatch.setenv("SMOLQ_PACK", "0")
    assert got == logits(llm_smolq.load(model, n_ctx=32, threads=1))


def test_a_file_changed_after_it_was_mapped_is_hashed_from_the_mapping(cache, model, monkeypatch, packs, hashes):
    """The file remembered and kept, then opened, then edited before the engine packs it:
    the state it was mapped in is not the file's now, so the digest remembered for it is
    not taken; the mapping's weights are hashed (the edited ones), and neither remembered
    nor kept."""
    llm_smolq.load(model, n_ctx=32, threads=1)
    (entry,) = entries(cache)
    (state,) = remembered(cache)
    opened = open_model(model)
    edit_in_place(model, opened.tensors["blk.1.ffn_up.weight"].offset + 100, 0x5A)
    got = logits(llm_smolq.Engine(opened, n_ctx=32, threads=1))
    assert hashes == [str(model)] * 2 and packs == [str(model)] * 2
    assert remembered(cache) == [state] and entries(cache) == [entry]
    monkeypatch.setenv("SMOLQ_PACK", "0")
    assert got == logits(llm_smolq.load(model, n_ctx=32, threads=1))


CHILD = """
import importlib.util, json, sys
import llm_smolq
spec = importlib.util.spec_from_file_location("llm_smolq._kernel", sys.argv[1])
kernel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel)
sys.modules["llm_smolq._kernel"] = llm_smolq._kernel = kernel
from llm_smolq.cache.kernel_identity import kernel_fingerprint
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
    from llm_smolq.cache.kernel_identity import kernel_fingerprint

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
    assert [p.name for p in (cache / "packed").iterdir()] == [packed_cache.INDEX]  # no entry, no temporary file
    monkeypatch.setenv("SMOLQ_PACK", "0")
    assert logits(eng) == logits(llm_smolq.load(model, n_ctx=32, threads=1))


def test_the_cache_off_packs_into_memory(cache, model, monkeypatch, packs, hashes):
    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    eng = llm_smolq.load(model, n_ctx=32, threads=1)
    llm_smolq.load(model, n_ctx=32, threads=1)
    assert eng._packed and packs == [str(model)] * 2 and not cache.exists()  # no entry, no index
    assert hashes == []  # nothing to name


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
    assert packed_cache.most_bytes_here(catalog.present_sizes()) == packed_cache.KEEP * smollm2_gguf.stat().st_size  # the file in the store
    big = packed_cache.KEEP * smollm2_gguf.stat().st_size
    assert packed_cache.most_bytes_here(catalog.present_sizes(), smollm2_gguf.stat().st_size + 1) == big + packed_cache.KEEP


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


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc")
def test_the_packed_weights_ask_for_huge_pages(cache, model, monkeypatch, packs):
    """Written into a new entry, mapped from a kept one, or packed into memory with the cache
    off: each under MADV_HUGEPAGE ("hg"), the memory private (Python's default for fileno -1
    is shared memory, whose huge pages Linux systems leave off)."""
    written = llm_smolq.load(model, n_ctx=32, threads=1)
    mapped = llm_smolq.load(model, n_ctx=32, threads=1)
    monkeypatch.setenv("SMOLQ_CACHE_DIR", "off")
    in_memory = llm_smolq.load(model, n_ctx=32, threads=1)
    assert packs == [str(model)] * 2 and written.model.packed_kept is not None
    for eng in (written, mapped, in_memory):
        perms, flags = mapping_of(eng.model.packed_data)
        assert "hg" in flags or not THP_CONFIGURED, (perms, flags)
    assert mapping_of(in_memory.model.packed_data)[0] == "rw-p"
    assert mapping_of(mapped.model.packed_data)[0] == "r--s"
