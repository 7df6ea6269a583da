"""`adaflash models`: the built-in targets and their cached conversion; synthetic 8B-shaped targets."""

from __future__ import annotations

import json
from pathlib import Path

import click

from adaflash.cli.common import emit_rows, fail
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import required
from adaflash.models import registry, synth
from adaflash.options import DrafterConfig, JobConfig, ModelConfig, SamplingConfig


@click.group()
def models() -> None:
    """List and prepare the built-in target models; write synthetic ones (`models synth`)."""


@models.command("list")
@uses(Output(("table", "json")), command="models list")
def list_models(output: str) -> None:
    """The built-in targets, where each is cached and whether it is ready; the architectures `models synth`
    writes."""
    as_json = output == "json"
    rows = [registry.describe(name) for name in registry.BUILTINS]
    archs = list(synth.describe_archs())
    if as_json:
        click.echo(json.dumps([*({"kind": "builtin", **row} for row in rows),
                               *({"kind": "synth", **row} for row in archs)], indent=2))
        return
    emit_rows(rows, ["name", "ready", "cached_at", "source", "hub_id"], "table", title="Built-in targets")
    emit_rows(archs, ["name", "model_type", "layers", "hidden", "vocab", "description"], "table",
              title="Synthetic architectures (adaflash models synth NAME --out DIR)")
    click.echo("Any Hugging Face id or local model folder is accepted wherever a target is asked for.")


@models.command("prepare")
@click.argument("name")
@uses(use(JobConfig, only=("force",)), command="models prepare")
def prepare_model(name: str, job: JobConfig) -> None:
    """Convert a built-in target once into a cached safetensors folder (--force: again)."""
    force = job.force
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


@models.command("synth")
@click.argument("name", metavar="NAME")
@uses(use(JobConfig, only=("out", "force", "max_shard_gb")), use(SamplingConfig, only=("seed",)),
      use(DrafterConfig, only=("layers",)), use(ModelConfig, only=("dtype", "device")), Output(("text", "json")),
      command="models synth")
def synth_model(name: str, job: JobConfig, sampling: SamplingConfig, drafter: DrafterConfig, model: ModelConfig,
                output: str) -> None:
    """Write a model folder of a real architecture with seeded random weights, for speed and memory.

    NAME is qwen3-8b, llama-3.1-8b, smollm2-135m (the built-in target's shapes), or qwen3-tiny / llama-tiny (a
    few MB, for tests). The folder (config.json,
    safetensors shards, a byte-level tokenizer with a chat template, generation_config.json) loads wherever a
    target is asked for. Random weights run at the real speed and memory; τ measured with them means nothing.
    Dense decoders only: the embedded engine has no mixture-of-experts layer, so there is no MoE architecture.
    llama-3.1-8b keeps Llama 3.1's llama3 rope scaling, which the engine implements. --dtype: bf16, fp16 or
    fp32; --seed: the same seed on the same kind of device gives the same weights.
    """
    required(job.out, "--out", "the model folder to write (new or empty)")
    if model.dtype not in ("bf16", "fp16", "fp32"):
        fail(f"--dtype: models synth writes bf16, fp16 or fp32, got {model.dtype!r}")
    _synth(name, job.out or "", sampling.seed or 0, drafter.layers, model.dtype, model.device, job.max_shard_gb,
           job.force, output == "json")


def _synth(name: str, out: str, seed: int, layers: int | None, dtype: str, device: str, max_shard_gb: float,
           force: bool, as_json: bool) -> None:
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        synth.arch_of(name)
        synth.check_out(Path(out).expanduser(), force)
    except synth.SynthError as err:
        fail(str(err))
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), disable=as_json or not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"{name} -> {out}", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            result = synth.write_synth(name, out, seed=seed, layers=layers, dtype=dtype, device=device,
                                       force=force, max_shard_bytes=int(max_shard_gb * 1e9), progress=report)
        except synth.SynthError as err:
            fail(str(err))
    if as_json:
        click.echo(json.dumps(result.as_json(), indent=2))
        return
    click.echo(f"{name}: {result.layers} layers, {_count(result.parameters, 'B', 'M')} parameters, "
               f"{_count(result.bytes, ' GB', ' MB')} in {result.dtype}, seed {seed}, "
               f"drawn on {result.device}, "
               f"written to {result.out} in {result.seconds:.1f} s")
    click.echo(f"use it as a target: adaflash bench cost --target {result.out}")


def _count(value: float, billions: str, millions: str) -> str:
    return f"{value / 1e9:.2f}{billions}" if value >= 1e8 else f"{value / 1e6:.1f}{millions}"
