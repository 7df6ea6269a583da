"""`adaflash draft`: create and inspect drafter checkpoints."""

from __future__ import annotations

import json

import click

from adaflash.cli.common import emit_rows, fail
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import required
from adaflash.engine.config import EngineConfig
from adaflash.methods import DRAFTER_ARCHITECTURES, LENGTH_HEAD_DRAFTERS
from adaflash.options import DrafterConfig, JobConfig, ModelConfig, SamplingConfig


@click.group()
def draft() -> None:
    """Create and inspect drafters (DFlash/AdaFlash, EAGLE-3, MTP)."""


@draft.command("new")
@uses(use(ModelConfig, only=("method", "target")), use(JobConfig, only=("out", "force")),
      use(DrafterConfig, only=("layers", "block_size", "length_head", "target_layer_ids", "mask_token_id")),
      use(EngineConfig, only=("num_steps",)), use(SamplingConfig, only=("seed",)), command="draft new")
def new(model: ModelConfig, job: JobConfig, drafter: DrafterConfig, engine: EngineConfig,
        sampling: SamplingConfig) -> None:
    """Write an initialized drafter: config.json (DFlash/AdaFlash fields) + model.safetensors.

    --method is the drafter's architecture: [dflash|eagle3|mtp].
    """
    if len(model.method) != 1 or model.method[0] not in DRAFTER_ARCHITECTURES:
        fail(f"--method is required, once: one of {', '.join(DRAFTER_ARCHITECTURES)}")
    required(job.out, "--out", "the folder to write the drafter to")
    if drafter.layers is not None and drafter.layers > 8:
        fail(f"--layers {drafter.layers}: a drafter has at most 8 layers")
    _new(model.method[0], model.target or "", job.out or "", drafter.layers or 1, drafter.block_size or 16,
         engine.num_steps or 6, bool(drafter.length_head), drafter.target_layer_ids, drafter.mask_token_id,
         sampling.seed or 0, job.force)


def _new(method: str, target: str, out: str, layers: int, block_size: int, steps: int, length_head: bool,
         target_layer_ids: str | None, mask_token_id: int | None, seed: int, force: bool) -> None:
    from pathlib import Path

    from adaflash.models.drafter_io import DrafterError, new_drafter, save_drafter
    from adaflash.models.layers import DecoderConfig
    from adaflash.models.loading import local_folder
    from adaflash.models.target import read_hf_config

    if Path(out).exists() and Path(out).is_dir() and any(Path(out).iterdir()):
        if not force:
            fail(f"{out} exists and is not empty (use --force to overwrite)")
        if not (Path(out) / "config.json").is_file():
            import shutil

            shutil.rmtree(out)  # --force: the folder goes, whatever it held
    if length_head and method not in LENGTH_HEAD_DRAFTERS:
        fail("--length-head applies to DFlash drafters only")
    try:
        ids = [int(x) for x in target_layer_ids.split(",")] if target_layer_ids else None
    except ValueError:
        fail(f"--target-layer-ids must be comma-separated integers, got {target_layer_ids!r}")
    try:
        folder = local_folder(target)
        tcfg = DecoderConfig.from_hf(read_hf_config(folder))
        if mask_token_id is not None and not 0 <= mask_token_id < tcfg.vocab_size:
            fail(f"--mask-token-id {mask_token_id} is outside the target's vocabulary (0..{tcfg.vocab_size - 1})")
        drafter = new_drafter(method, tcfg, layers=layers, block_size=block_size, length_head=length_head,
                              target_layer_ids=ids, mask_token_id=mask_token_id, steps=steps, seed=seed)
        path = save_drafter(drafter, out, {"target": target, "num_target_layers": tcfg.num_hidden_layers,
                                           "version": 0})
    except (DrafterError, FileNotFoundError, ValueError) as err:
        fail(str(err))
    params = sum(p.numel() for p in drafter.parameters())
    click.echo(f"wrote {method} drafter ({params / 1e6:.1f}M parameters, target layers {drafter.target_layer_ids}) to {path}")


@draft.command("info")
@click.argument("folder", type=click.Path(file_okay=False))
@uses(use(ModelConfig, only=("target",)), Output(("text", "json"), help="text (indented JSON), or json: one line."),
      command="draft info")
def info(folder: str, model: ModelConfig, output: str) -> None:
    """Show a drafter's config and check it loads (optionally against --target)."""
    target, as_json = model.target, output == "json"
    from adaflash.models.drafter_io import DrafterError, load_drafter, read_drafter_config
    from adaflash.models.layers import DecoderConfig
    from adaflash.models.loading import local_folder
    from adaflash.models.target import read_hf_config

    try:
        tcfg = DecoderConfig.from_hf(read_hf_config(local_folder(target))) if target else None
        drafter = load_drafter(folder, tcfg)
        cfg = read_drafter_config(folder)
    except (DrafterError, FileNotFoundError) as err:
        fail(str(err))
    from adaflash.models.registry import resolve_drafter

    summary = {"folder": str(resolve_drafter(folder)), "method": drafter.method, "kind": drafter.kind, "block_size": drafter.block_size,
               "target_layer_ids": drafter.target_layer_ids,
               "length_head": getattr(drafter, "length_head", None) is not None,
               "parameters": sum(p.numel() for p in drafter.parameters()), "adaflash": cfg.get("adaflash", {})}
    click.echo(json.dumps(summary, indent=None if as_json else 2))


@draft.command("export")
@click.argument("folder")
@uses(use(JobConfig, only=("out",)), use(ModelConfig, only=("dtype",)), command="draft export")
def export(folder: str, job: JobConfig, model: ModelConfig) -> None:
    """Copy a drafter (a folder or a built-in's name) to OUT, checked, optionally cast to --dtype bfloat16,
    float16 or float32 (its floating-point weights; by default as they are, byte for byte).

    A pipeline's versions: `adaflash pipeline export`.
    """
    out, dtype = job.out or "", model.dtype
    required(job.out, "--out", "the folder to write")
    if dtype is not None and dtype not in ("bfloat16", "float16", "float32"):
        fail(f"--dtype: draft export casts to bfloat16, float16 or float32, got {dtype!r}")
    import torch

    from adaflash.models.drafter_io import DrafterError, export_drafter
    from adaflash.models.registry import resolve_drafter

    try:
        path = export_drafter(resolve_drafter(folder), out, getattr(torch, dtype) if dtype else None)
    except (DrafterError, FileNotFoundError) as err:
        fail(str(err))
    click.echo(f"exported {folder} -> {path}" + (f" ({dtype})" if dtype else ""))


@draft.command("builtins")
@uses(Output(("table", "json", "csv")), command="draft builtins")
def builtins(output: str) -> None:
    """The drafters shipped inside adaflash: pass a name wherever a drafter folder goes."""
    from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS

    rows = [{"name": d.name, "target": d.target, "default_for": ",".join(d.default_for),
             "installed": (d.folder / "config.json").is_file(), "folder": str(d.folder), "description": d.description}
            for d in BUILTIN_DRAFTERS.values()]
    emit_rows(rows, ["name", "target", "default_for", "installed", "folder", "description"], output)
