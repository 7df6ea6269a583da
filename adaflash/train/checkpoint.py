"""A trainer's checkpoint as a folder of small files: weights, optimizer moments, schedule and RNG states.

Why parts: a drafter's training accumulates over many GPU sessions on many machines, and what moves
between them (a lent machine's output files, a release asset) is capped per file. Each part is a
safetensors file of at most `PART_BYTES`; a tensor larger than that is cut into pieces along its
flattened storage. `checkpoint.json` holds everything that is not a tensor (counters, the optimizer's
hyper-parameters, Python's RNG state, the config) and says which part holds each piece, with every
part's size and SHA-256.

Why it survives a crash: a save writes its parts under names of its own (the step and a nonce), then
replaces `checkpoint.json` atomically, then deletes the parts the new manifest does not name. At any
moment the manifest names complete parts, so a killed trainer leaves the previous checkpoint or the
new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from adaflash.files import give_usual_modes, nearest_existing, write_json_atomic

MANIFEST = "checkpoint.json"
FORMAT = "adaflash-trainer-checkpoint"
PART_BYTES = 15 * 2**20  # under 16 MB with safetensors' header to spare
_TENSOR = "__tensor__"
_TUPLE = "__tuple__"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read or written; the message names the file and what is wrong."""


def checkpoint_folder(out: str | Path) -> Path:
    """Where `train draft --out OUT` keeps its trainer checkpoint by default: OUT-train beside OUT, so
    the drafter folder holds only what a server loads."""
    out = Path(out)
    return out.with_name(f"{out.name}-train")


def save_checkpoint(folder: str | Path, blob: dict[str, Any], *, part_bytes: int = PART_BYTES) -> Path:
    """Write `blob` (nested dicts, lists, tuples, numbers, strings and tensors) into `folder` in parts."""
    folder = Path(folder)
    refuse_foreign_checkpoint(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    tree = _split(blob, tensors, "")
    stem = f"s{int(blob.get('state', {}).get('step', 0)):09d}-{secrets.token_hex(3)}"
    pieces, parts = _pack(tensors, part_bytes)
    entries = []
    for index, part in enumerate(parts):
        path = folder / f"{stem}-{index:03d}.safetensors"
        save_file(part, str(path))
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        give_usual_modes(path)
        entries.append({"file": path.name, "bytes": path.stat().st_size, "sha256": _sha256(path)})
    pieces = {name: [[entries[p]["file"], key] for p, key in where] for name, where in pieces.items()}
    meta = {name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for name, t in tensors.items()}
    manifest = {"format": FORMAT, "version": 1, "parts": entries, "tensors": {
        name: {**meta[name], "pieces": pieces[name]} for name in tensors}, "tree": tree}
    write_json_atomic(folder / MANIFEST, manifest)
    give_usual_modes(folder / MANIFEST)
    kept = {e["file"] for e in entries}
    for stale in folder.glob("*.safetensors"):
        if stale.name not in kept:
            stale.unlink(missing_ok=True)
    return folder


def load_checkpoint(folder: str | Path) -> dict[str, Any]:
    """The blob `save_checkpoint` wrote, every part checked against its recorded size and SHA-256."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{path}: not found (no trainer checkpoint in {folder})")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: 'format' is not {FORMAT!r}")
    loaded: dict[str, dict[str, torch.Tensor]] = {}
    for entry in manifest.get("parts", []):
        part = folder / entry["file"]
        if not part.is_file():
            raise CheckpointError(f"{part}: missing (named in {path})")
        if part.stat().st_size != entry["bytes"] or _sha256(part) != entry["sha256"]:
            raise CheckpointError(f"{part}: its size or SHA-256 differs from {path} (a torn or altered part)")
        loaded[entry["file"]] = load_file(str(part))
    tensors = {}
    for name, info in manifest["tensors"].items():
        flat = torch.cat([loaded[file][key] for file, key in info["pieces"]]) if info["pieces"] else None
        dtype = getattr(torch, info["dtype"])
        tensors[name] = (flat if flat is not None else torch.empty(0, dtype=dtype)).view(info["shape"])
    return _join(manifest["tree"], tensors)


def _split(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    """`value` with each tensor replaced by a reference to its entry in `tensors` (JSON from here on)."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().to("cpu").contiguous()
        return {_TENSOR: path}
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int)) for k in value):
            raise CheckpointError(f"{path or 'the blob'}: keys must be strings or integers")
        return {"__dict__": [[k, _split(v, tensors, f"{path}.{k}")] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_split(v, tensors, f"{path}.{i}") for i, v in enumerate(value)]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CheckpointError(f"{path or 'the blob'}: a {type(value).__name__} cannot be kept in a checkpoint")


def _join(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_join(v, tensors) for v in value]
    if isinstance(value, dict):
        if _TENSOR in value:
            return tensors[value[_TENSOR]]
        if _TUPLE in value:
            return tuple(_join(v, tensors) for v in value[_TUPLE])
        return {k: _join(v, tensors) for k, v in value["__dict__"]}
    return value


def _pack(tensors: dict[str, torch.Tensor], part_bytes: int
          ) -> tuple[dict[str, list[tuple[int, str]]], list[dict[str, torch.Tensor]]]:
    """Each tensor's flattened storage in pieces of at most `part_bytes`, filled into parts in order:
    (where each tensor's pieces went, the parts)."""
    parts: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    where: dict[str, list[tuple[int, str]]] = {}
    for name, tensor in tensors.items():
        flat = tensor.reshape(-1)
        where[name] = []
        start = 0
        while start < flat.numel():
            room = (part_bytes - used) // flat.element_size()
            if room <= 0:
                parts.append({})
                used = 0
                continue
            piece = flat[start:start + room].clone()  # safetensors refuses views sharing one storage
            key = f"t{len(parts[-1])}"
            parts[-1][key] = piece
            where[name].append((len(parts) - 1, key))
            used += piece.numel() * piece.element_size()
            start += piece.numel()
    return where, parts


def refuse_foreign_checkpoint(folder: Path) -> None:
    """A checkpoint replaces only a checkpoint: parts are deleted by name, so a folder of anything else is
    left alone."""
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder}: exists and is a file, not a checkpoint folder")
    if not nearest_existing(folder / "x").is_dir():
        raise CheckpointError(f"{folder}: a file stands where its folder would be made")
    if folder.is_dir() and not (folder / MANIFEST).is_file() and any(folder.iterdir()):
        raise CheckpointError(f"{folder}: not a trainer checkpoint (no {MANIFEST}) and not empty; a checkpoint is "
                              "written only to a new or empty folder or over another checkpoint")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
