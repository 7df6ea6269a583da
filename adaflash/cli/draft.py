"""`adaflash draft`: create and inspect drafter checkpoints."""

from __future__ import annotations

import json

import click

from adaflash.cli.common import emit_rows, fail, output_format_option
from adaflash.methods import DRAFTER_ARCHITECTURES, LENGTH_HEAD_DRAFTERS


@click.group()
def draft() -> None:
    """Create and inspect drafters (DFlash/AdaFlash, EAGLE-3, MTP)."""


@draft.command("new")
@click.option("--method", type=click.Choice(DRAFTER_ARCHITECTURES), required=True)
@click.option("--target", default="smollm2-135m", show_default=True, help="Built-in name, HF id or local folder.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Folder to write the drafter to.")
@click.option("--layers", type=click.IntRange(1, 8), default=1, show_default=True, help="DFlash: decoder layers.")
@click.option("--block-size", type=click.IntRange(2, 64), default=16, show_default=True, help="DFlash: block size B.")
@click.option("--steps", type=click.IntRange(1, 32), default=6, show_default=True, help="EAGLE-3/MTP: chain length.")
@click.option("--length-head/--no-length-head", default=False, show_default=True, help="DFlash: add the AdaFlash length head.")
@click.option("--target-layer-ids", default=None, help="Comma-separated target layers to read (default: spread evenly).")
@click.option("--mask-token-id", type=int, default=None, help="DFlash: a spare token id for MASK (default: a learned embedding).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing folder.")
def new(method: str, target: str, out: str, layers: int, block_size: int, steps: int, length_head: bool,
        target_layer_ids: str | None, mask_token_id: int | None, seed: int, force: bool) -> None:
    """Write an initialized drafter: config.json (DFlash/AdaFlash fields) + model.safetensors."""
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
@click.option("--target", default=None, help="Also validate against this target.")
@click.option("--json", "as_json", is_flag=True)
def info(folder: str, target: str | None, as_json: bool) -> None:
    """Show a drafter's config and check it loads (optionally against a target)."""
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
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder to write (replaced atomically).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default=None,
              help="Cast the floating-point weights [default: as they are, byte for byte].")
def export(folder: str, out: str, dtype: str | None) -> None:
    """Copy a drafter (a folder or a built-in's name) to OUT, checked, optionally in another dtype.

    A pipeline's versions: `adaflash pipeline export`.
    """
    import torch

    from adaflash.models.drafter_io import DrafterError, export_drafter
    from adaflash.models.registry import resolve_drafter

    try:
        path = export_drafter(resolve_drafter(folder), out, getattr(torch, dtype) if dtype else None)
    except (DrafterError, FileNotFoundError) as err:
        fail(str(err))
    click.echo(f"exported {folder} -> {path}" + (f" ({dtype})" if dtype else ""))


@draft.command("builtins")
@output_format_option()
def builtins(fmt: str) -> None:
    """The drafters shipped inside adaflash: pass a name wherever a drafter folder goes."""
    from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS

    rows = [{"name": d.name, "target": d.target, "default_for": ",".join(d.default_for),
             "installed": (d.folder / "config.json").is_file(), "folder": str(d.folder), "description": d.description}
            for d in BUILTIN_DRAFTERS.values()]
    emit_rows(rows, ["name", "target", "default_for", "installed", "folder", "description"], fmt)
