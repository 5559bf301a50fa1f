"""llama.cpp's reference files, as the tests read them: tests/data/reference/ keeps what
cannot be made here, and the rest is rebuilt from it, byte for byte, on first use.

A GGUF that llama.cpp made from the tiny F32 model in a type that `gguf`'s quantizer also
writes (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) is kept as its header alone: its tensors
are quantized again from tiny-smollm3-F32.gguf by `gguf`, and its Q6_K token embedding
(the one tensor of another type) is copied from tiny-smollm3-Q6_K.gguf, which llama.cpp
quantized from the same weights. The file rebuilt must hash to the sha256 of llama.cpp's
own file, kept in generated.json, or the run stops. The K-quant and IQ files stay whole.

The two tokenizer GGUFs (SmolLM2's vocabulary under the smaug-bpe and llama-bpe split
rules) are not kept at all: the tokenizer tests build from the real SmolLM2 file with the
pre-type set, after checking that its vocabulary hashes to what those files held
(`vocabulary_digest`).

To refresh from a complete reference folder (llama.cpp's outputs, with its README):

    python tests/helpers/reference_data.py PATH/TO/reference
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from llm_smolq.store.pypi_models import sha256_of as sha256

STORED = Path(__file__).resolve().parents[1] / "data" / "reference"
MANIFEST = STORED / "generated.json"
HEADERS = STORED / "headers"
F32_SOURCE = "tiny-smollm3-F32.gguf"
Q6_K_SOURCE = "tiny-smollm3-Q6_K.gguf"
# The types `gguf.quants.quantize` writes with llama.cpp's bits (checked by the sha256).
REQUANTIZED = {"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}
# The keys byte-level BPE reads, besides the pre-type the tests set.
VOCABULARY_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token")
TOKENIZER_FILES = ("tok-smaug-bpe.gguf", "tok-llama-bpe.gguf")


def vocabulary_digest(gguf_path: Path) -> str:
    """A hash of what a GGUF's byte-level BPE tokenizer is built from, bar the pre-type."""
    from llm_smolq.model.tokenizer import read_tokenizer_metadata

    meta = read_tokenizer_metadata(gguf_path)
    chosen = {key: meta.get(key) for key in VOCABULARY_KEYS}
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def tensor_bytes(tensor, sources: dict) -> bytes:
    """One tensor of a rebuilt file: requantized from F32, or copied as it is."""
    from gguf import quants

    kind = tensor.tensor_type.name
    f32 = sources[F32_SOURCE][tensor.name]
    if kind == "F32":
        return np.asarray(f32.data).tobytes()
    if kind in REQUANTIZED:
        return quants.quantize(np.asarray(f32.data), tensor.tensor_type).tobytes()
    if kind == "Q6_K":
        return np.asarray(sources[Q6_K_SOURCE][tensor.name].data).tobytes()
    raise ValueError(f"{tensor.name}: no way to rebuild a {kind} tensor")


def rebuild(name: str, entry: dict, out: Path, sources: dict) -> None:
    """Writes llama.cpp's file `name` into `out`: its kept header, then every tensor."""
    from gguf import GGUFReader

    header = (HEADERS / f"{name}.header").read_bytes()
    tmp = out.with_name(out.name + ".part")
    # The header's tensor infos point past its end: padded out to the file's size it is a
    # GGUF the reader opens, and its data section is then filled tensor by tensor.
    data = bytearray(header) + bytearray(entry["size"] - len(header))
    tmp.write_bytes(data)
    tensors = list(GGUFReader(tmp).tensors)
    for tensor in tensors:
        piece = tensor_bytes(tensor, sources)
        if len(piece) != tensor.n_bytes:
            raise ValueError(f"{name}: {tensor.name} rebuilt as {len(piece)} bytes, the header says {tensor.n_bytes}")
        data[tensor.data_offset:tensor.data_offset + len(piece)] = piece
    del tensors
    tmp.write_bytes(data)
    digest = sha256(tmp)
    if digest != entry["sha256"]:
        tmp.unlink()
        raise RuntimeError(
            f"{name} rebuilt from tests/data/reference hashes to {digest}, not to llama.cpp's "
            f"{entry['sha256']}: the installed gguf package quantizes differently. "
            "Point SMOLQ_REFERENCE at a complete copy of the reference folder instead.")
    os.replace(tmp, out)


def materialize(folder: Path) -> Path:
    """`folder` made to hold every reference file the tests read: the kept files linked
    (or copied where links are not allowed), the others rebuilt. Safe to call from
    several processes at once; a complete folder is reused."""
    from filelock import FileLock
    from gguf import GGUFReader

    folder.mkdir(parents=True, exist_ok=True)
    entries = manifest()["files"]
    with FileLock(str(folder) + ".lock"):
        for stored in sorted(STORED.iterdir()):
            if stored.is_file() and stored.name != MANIFEST.name:
                _link(stored, folder / stored.name)
        missing = [name for name, entry in entries.items()
                   if not (folder / name).exists() or sha256(folder / name) != entry["sha256"]]
        if missing:
            sources = {name: {t.name: t for t in GGUFReader(STORED / name).tensors}
                       for name in (F32_SOURCE, Q6_K_SOURCE)}
            for name in missing:
                rebuild(name, entries[name], folder / name, sources)
    return folder


def _link(source: Path, target: Path) -> None:
    if target.is_symlink() or target.exists():
        if target.is_symlink() and target.resolve() == source.resolve():
            return
        if not target.is_symlink() and target.stat().st_size == source.stat().st_size and sha256(target) == sha256(source):
            return
        target.unlink()
    try:
        target.symlink_to(source)
    except OSError:
        shutil.copyfile(source, target)


def refresh(reference: Path) -> None:
    """Rewrites tests/data/reference from a complete reference folder."""
    from gguf import GGUFReader

    files = {}
    HEADERS.mkdir(parents=True, exist_ok=True)
    for path in sorted(reference.glob("tiny-smollm3-*.gguf")):
        reader = GGUFReader(path)
        kinds = {t.tensor_type.name for t in reader.tensors}
        if path.name in (F32_SOURCE, Q6_K_SOURCE) or not kinds <= REQUANTIZED | {"F32", "Q6_K"}:
            continue
        (HEADERS / f"{path.name}.header").write_bytes(path.read_bytes()[:reader.data_offset])
        files[path.name] = {"sha256": sha256(path), "size": path.stat().st_size}
    digests = {name: vocabulary_digest(reference / name) for name in TOKENIZER_FILES}
    if len(set(digests.values())) != 1:
        raise SystemExit(f"the tokenizer files do not share one vocabulary: {digests}")
    for path in sorted(reference.iterdir()):
        keep = path.suffix in (".npz", ".json") or (
            path.suffix == ".gguf" and path.name not in files and path.name not in TOKENIZER_FILES)
        if keep:
            shutil.copyfile(path, STORED / path.name)
    pre = {name: GGUFReader(reference / name).fields["tokenizer.ggml.pre"].contents() for name in TOKENIZER_FILES}
    MANIFEST.write_text(json.dumps({
        "files": files,
        "tokenizer_files": {"pre": pre, "vocabulary_sha256": next(iter(digests.values()))},
    }, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    refresh(Path(sys.argv[1]))
