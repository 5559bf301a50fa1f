"""Work that a whole test run shares: a kernel build under sanitizers, for SIMDe or for arm64
takes a minute or more, and with pytest-xdist every worker would otherwise do it again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from filelock import FileLock


def run_folder(tmp_path_factory) -> Path:
    """The run's temporary folder: the workers' own folders sit inside it under xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory, name: str, make: Callable[[Path], dict]) -> dict:
    """make(folder)'s result, computed by the first process of the run that asks and read
    back from folder/result.json by the others. A make that raised is tried again by the
    next process that asks, which then reports the failure as well."""
    folder = run_folder(tmp_path_factory) / f"once-{name}"
    result = folder / "result.json"
    with FileLock(str(folder) + ".lock"):
        if result.exists():
            return json.loads(result.read_text())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        value = make(folder)
        result.write_text(json.dumps(value))
        return value
