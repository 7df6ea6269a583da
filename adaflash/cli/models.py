"""`adaflash models`: the built-in targets and their cached conversion."""

from __future__ import annotations

import json

import click

from adaflash.cli.common import emit_rows, fail
from adaflash.models import registry


@click.group()
def models() -> None:
    """List and prepare the built-in target models."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_models(as_json: bool) -> None:
    """The built-in targets, where each is cached and whether it is ready."""
    rows = [registry.describe(name) for name in registry.BUILTINS]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    emit_rows(rows, ["name", "ready", "cached_at", "source", "hub_id"], "table", title="Built-in targets")
    click.echo("Any Hugging Face id or local model folder is accepted wherever a target is asked for.")


@models.command("prepare")
@click.argument("name")
@click.option("--force", is_flag=True, help="Convert again even if a cached copy exists.")
def prepare_model(name: str, force: bool) -> None:
    """Convert a built-in target once into a cached safetensors folder."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if name not in registry.BUILTINS:
        fail(f"unknown built-in target {name!r}; built-ins: {', '.join(registry.BUILTINS)}")
    if registry.is_ready(name) and not force:
        click.echo(f"{name} is ready at {registry.builtin_folder(name)}")
        return
    stages = ["tokenizer", "dequantize", "rebuild", "save", "ready"]
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as progress:
        task = progress.add_task(f"preparing {name}", total=len(stages))

        def report(stage: str) -> None:
            progress.update(task, completed=stages.index(stage) + 1 if stage in stages else 0,
                            description=f"{name}: {stage}")

        try:
            folder = registry.prepare(name, report, force=force)
        except FileNotFoundError as err:
            fail(str(err))
    click.echo(f"{name} is ready at {folder}")
