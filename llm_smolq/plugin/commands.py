"""The `llm smolq ...` commands: download, register, unregister, models, info, cache."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import click

from llm_smolq.errors import CatalogError, ModelNotFound, UnknownModel, UnknownQuant
from llm_smolq.store import catalog
from llm_smolq.store.download import fetch
from llm_smolq.paths import prompt_cache_dir


def register_commands(cli: click.Group) -> None:
    @cli.group(name="smolq")
    def smolq():
        "Quantized SmolLM3 / SmolLM2 GGUF models on the CPU: get, add and inspect model files"

    @smolq.command()
    @click.argument("model")
    @click.option("--quant", "-q", help="Quant to fetch: smollm3-q has Q4_K_M (default), Q8_0, F16")
    @click.option("--no-progress", is_flag=True, help="Do not show a progress bar")
    def download(model: str, quant: str | None, no_progress: bool):
        """Download a known model into the llm-smolq store

        \b
        llm smolq download smollm3-q             # SmolLM3-3B Q4_K_M, 1.9 GB
        llm smolq download smollm3-q --quant Q8_0
        llm smolq download smollm2-q             # SmolLM2-135M Q4_1, 98 MB
        """
        try:
            path = catalog.expected_path(model, quant)
        except UnknownModel:
            raise click.BadParameter(
                f"unknown model {model!r}; choose one of: {', '.join(_known_choices())}", param_hint="MODEL"
            )
        except UnknownQuant as exc:
            raise click.BadParameter(str(exc), param_hint="'--quant'")
        if path.is_file():
            click.echo(f"Already downloaded: {path}", err=True)
        else:
            known, chosen = catalog.pick_known(model, quant)
            qf = known.quants[chosen]
            click.echo(
                f"Downloading {known.model_id(chosen)} ({chosen}, {'~' if qf.approximate else ''}"
                f"{catalog.format_size(qf.size)}) from {known.source}",
                err=True,
            )
        try:
            path = fetch(model, quant, progress=not no_progress)
        except CatalogError as exc:
            raise click.ClickException(str(exc))
        click.echo(path)

    @smolq.command(name="register")
    @click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
    @click.option("--alias", "-a", help="Another name for the model")
    def register_(path: Path, alias: str | None):
        """Add a GGUF file from anywhere on disk as an llm model

        The file is checked first; its model id is smolq/ + its name, lowercased.
        """
        try:
            model_id = catalog.register(path, alias=alias)
        except CatalogError as exc:
            raise click.ClickException(str(exc))
        click.echo(f"Registered {model_id}: {catalog.resolve(model_id)}")
        click.echo(f"Try: llm -m {alias or model_id} 'Say hi'")

    @smolq.command()
    @click.argument("model_id")
    def unregister(model_id: str):
        "Forget a registered model; its file is not touched"
        try:
            path = catalog.unregister(model_id)
        except CatalogError as exc:
            raise click.ClickException(str(exc))
        click.echo(f"Unregistered {model_id} ({path})")

    @smolq.command()
    def models():
        "List llm-smolq models, their files and whether they are on disk"
        rows = [("id", "quant", "size", "present", "file")]
        for r in catalog.list_models():
            approx = "~" if not r.present and r.known and r.known.quants[r.quant].approximate else ""
            quant = r.quant
            if quant is None and r.known is None and r.present:  # registered before its quant was recorded
                quant = catalog.quant_of_file(r.path)
            rows.append((
                r.id + (f" (aliases: {', '.join(r.aliases)})" if r.aliases else ""),
                quant or "-",
                approx + catalog.format_size(r.size),
                "yes" if r.present else "no",
                str(r.path),
            ))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            click.echo("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])

    @smolq.command()
    @click.argument("path_or_model_id")
    def info(path_or_model_id: str):
        "Describe a GGUF model file: architecture, shapes, tensor types"
        from llm_smolq.errors import GGUFError
        from llm_smolq.model.model_file import open_model

        path = Path(path_or_model_id).expanduser()
        if path.is_dir():
            raise click.ClickException(f"{path} is a directory: give the path of a GGUF file in it, or a model id")
        if not path.is_file():
            try:
                path = catalog.resolve(path_or_model_id)
            except UnknownModel:
                if _looks_like_a_path(path_or_model_id):
                    raise click.ClickException(f"no such file: {path}")
                raise click.ClickException(
                    f"{path_or_model_id!r} is neither a file nor a model id: see `llm smolq models`")
            except ModelNotFound as exc:
                raise click.ClickException(str(exc))
        try:
            model = open_model(path)
        except GGUFError as exc:
            raise click.ClickException(str(exc))
        c = model.config
        types = Counter(t.type.name for t in model.tensors.values())
        name = model.metadata.get("general.name")
        lines = [
            ("File", f"{path} ({catalog.format_size(path.stat().st_size)})"),
            *([("Name", str(name))] if name else []),
            ("Architecture", c.arch),
            ("Layers", str(c.n_layers) + (f" (no RoPE in {len(c.nope_layers)})" if c.nope_layers else "")),
            ("Dimensions", f"{c.dim} embedding, {c.hidden_dim} feed-forward"),
            ("Heads", f"{c.n_heads} query, {c.n_kv_heads} key/value, {c.head_dim} wide"),
            ("Context length", str(c.context_length) + (
                f" (YaRN x{c.rope_scaling.factor:g} of {c.rope_scaling.original_context}: {c.window} positions)"
                if c.rope_scaling else "")),
            ("Vocabulary", f"{c.vocab_size} tokens"),
            ("Tied embeddings", "yes" if c.tied_embeddings else "no"),
            ("Tensors", f"{len(model.tensors)}: " + ", ".join(f"{t} x {n}" for t, n in types.most_common())),
        ]
        width = max(len(label) for label, _ in lines) + 1
        for label, value in lines:
            click.echo(f"{label + ':':<{width}} {value}")

    register_cache_commands(smolq)


def register_cache_commands(smolq: click.Group) -> None:
    @smolq.group()
    def cache():
        """The prompt cache: saved KV states that let `llm -c` skip re-reading a conversation;
        and the packed weights kept so that a model loads without packing them again

        \b
        Budget per model: SMOLQ_PROMPT_CACHE_SIZE (default twice the model file; 0 turns it off).
        Per prompt: -o prompt_cache false
        """

    @cache.command(name="info")
    def cache_info():
        "Where the cache is, its budget, and what it holds per model file"
        import time

        from llm_smolq.store import prompt_cache

        directory = prompt_cache_dir()
        try:
            budget = prompt_cache.budget_from_environment()
        except ValueError as exc:
            raise click.ClickException(str(exc))
        if budget is None:
            limit = (f"{prompt_cache.MODEL_MULTIPLE}x each model's file size, at least "
                     f"{catalog.format_size(prompt_cache.MIN_DEFAULT_BYTES)} (default)")
        else:
            limit = f"{catalog.format_size(budget)} per model (from {prompt_cache.SIZE_ENV})" if budget else "off"
        click.echo(f"Directory: {directory}")
        click.echo(f"Budget:    {limit}")
        per_model: dict[str, list] = {}  # model file -> [blocks, positions, bytes, last used]
        unreadable = 0
        for head in prompt_cache.PromptCache(directory).heads():
            try:
                used = os.stat(head.path).st_mtime
            except FileNotFoundError:
                continue
            if isinstance(head, prompt_cache.BlockFile):
                unreadable += 1
                continue
            row = per_model.setdefault(head.model_file, [0, 0, 0, 0.0])
            row[0] += 1
            row[1] += len(head.tokens)
            row[2] += head.size
            row[3] = max(row[3], used)
        blocks = sum(row[0] for row in per_model.values())
        total = catalog.format_size(sum(row[2] for row in per_model.values()))
        click.echo(f"Stored:    {total} in {blocks} block{'' if blocks == 1 else 's'}"
                   + (f" ({unreadable} unreadable: deleted when next met)" if unreadable else ""))
        for name, (n_blocks, positions, size, used) in sorted(per_model.items(), key=lambda item: -item[1][3]):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(used))
            click.echo(f"  {name}: {n_blocks} block{'' if n_blocks == 1 else 's'}, {positions} positions, "
                       f"{catalog.format_size(size)}, last used {when}")
        from llm_smolq.cache import packed_cache

        folder, packed = packed_cache.kept_entries()
        if folder is None:
            click.echo("Packed:    none kept (SMOLQ_CACHE_DIR=off)")
        elif not packed and not packed_cache.reserves_space():
            click.echo("Packed:    none kept on this system (it cannot reserve their disk space before writing): "
                       "weights are packed in memory on each load")
        else:
            size = catalog.format_size(sum(k.size for k in packed))
            most = catalog.format_size(packed_cache.most_bytes_here(catalog.present_sizes()))
            click.echo(f"Packed:    {size} in {len(packed)} file{'' if len(packed) == 1 else 's'} in {folder} "
                       f"(weights laid out for the SIMD kernels; the {packed_cache.KEEP} last used copies are kept, "
                       f"up to {most} with the models here; `llm smolq cache clear --packed` deletes them)")
            for k in packed:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(k.used))
                click.echo(f"  {k.path.name}: {catalog.format_size(k.size)}, last used {when}")

    @cache.command(name="clear")
    @click.option("--packed", is_flag=True, help="Delete the kept packed weights instead (remade on the next load)")
    def cache_clear(packed: bool):
        "Delete every saved state (--packed: the kept packed weights instead)"
        from filelock import Timeout

        from llm_smolq.cache import packed_cache
        from llm_smolq.store import prompt_cache

        if packed:
            folder, entries = packed_cache.kept_entries()
            size = sum(k.size for k in entries)
            for k in entries:
                try:
                    k.path.unlink(missing_ok=True)
                except OSError as exc:
                    raise click.ClickException(f"could not delete {k.path}: {exc.strerror}")
            click.echo(f"Deleted {len(entries)} file{'' if len(entries) == 1 else 's'} ({catalog.format_size(size)})"
                       + (f" from {folder}" if folder else ""))
            return
        try:
            files, size = prompt_cache.PromptCache(prompt_cache_dir()).clear()
        except Timeout:
            raise click.ClickException("another llm process is saving to the prompt cache; try again in a moment")
        click.echo(f"Deleted {files} file{'' if files == 1 else 's'} ({catalog.format_size(size)}) "
                   f"from {prompt_cache_dir()}")


def _looks_like_a_path(text: str) -> bool:
    """Whether text was meant as a file (model ids are like smollm3-q or smolq/name)."""
    return text.lower().endswith(".gguf") or text.startswith((".", "~", os.sep)) or (
        os.sep in text and not text.startswith("smolq/"))


def _known_choices() -> list[str]:
    return list(catalog.KNOWN_MODELS)
