"""The `llm smolq ...` commands: download, register, unregister, models, info."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from . import catalog


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
        except catalog.UnknownModel:
            raise click.BadParameter(
                f"unknown model {model!r}; choose one of: {', '.join(_known_choices())}", param_hint="MODEL"
            )
        except catalog.UnknownQuant as exc:
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
            path = catalog.download(model, quant, progress=not no_progress)
        except catalog.CatalogError as exc:
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
        except catalog.CatalogError as exc:
            raise click.ClickException(str(exc))
        click.echo(f"Registered {model_id}: {catalog.resolve(model_id)}")
        click.echo(f"Try: llm -m {alias or model_id} 'Say hi'")

    @smolq.command()
    @click.argument("model_id")
    def unregister(model_id: str):
        "Forget a registered model; its file is not touched"
        try:
            path = catalog.unregister(model_id)
        except catalog.CatalogError as exc:
            raise click.ClickException(str(exc))
        click.echo(f"Unregistered {model_id} ({path})")

    @smolq.command()
    def models():
        "List llm-smolq models, their files and whether they are on disk"
        rows = [("id", "quant", "size", "present", "file")]
        for r in catalog.list_models():
            approx = "~" if not r.present and r.known and r.known.quants[r.quant].approximate else ""
            rows.append((
                r.id + (f" (aliases: {', '.join(r.aliases)})" if r.aliases else ""),
                r.quant or "-",
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
        from .errors import GGUFError
        from .model_file import open_model

        path = Path(path_or_model_id).expanduser()
        if not path.is_file():
            try:
                path = catalog.resolve(path_or_model_id)
            except catalog.ModelNotFound as exc:
                raise click.ClickException(f"{exc} (or give the path of a GGUF file)")
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
            ("Context length", str(c.context_length)),
            ("Vocabulary", f"{c.vocab_size} tokens"),
            ("Tied embeddings", "yes" if c.tied_embeddings else "no"),
            ("Tensors", f"{len(model.tensors)}: " + ", ".join(f"{t} x {n}" for t, n in types.most_common())),
        ]
        width = max(len(label) for label, _ in lines) + 1
        for label, value in lines:
            click.echo(f"{label + ':':<{width}} {value}")


def _known_choices() -> list[str]:
    return list(catalog.KNOWN_MODELS)
