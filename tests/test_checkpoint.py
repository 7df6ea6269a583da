"""Trainer checkpoints in parts: every value back, parts under the cap, nothing lost to a crash or a torn file."""

from __future__ import annotations

import json
import random

import pytest
import torch

from adaflash.train import checkpoint as ckpt
from adaflash.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def _blob(step: int = 7) -> dict:
    gen = torch.Generator().manual_seed(3)
    return {
        "state": {"step": step, "seconds": 1.5, "best": float("inf")},
        "drafter": {"embed.weight": torch.randn(300, 7, generator=gen), "norm": torch.ones(7, dtype=torch.bfloat16)},
        "opt": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(40, generator=gen)}},
                "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0]}]},
        "head_opt": None,
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 5),
        "python_rng": random.Random(5).getstate(),
    }


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_a_checkpoint_comes_back_whole_from_parts_under_the_cap(tmp_path):
    blob = _blob()
    folder = save_checkpoint(tmp_path / "c", blob, part_bytes=1000)  # the 300 x 7 float32 weight is 8,400 bytes
    parts = sorted(folder.glob("*.safetensors"))
    assert len(parts) >= 9
    assert all(p.stat().st_size <= 1000 + 512 for p in parts)  # a piece's bytes plus safetensors' header
    back = load_checkpoint(folder)
    assert _equal(blob, back)
    assert isinstance(back["python_rng"], tuple) and random.Random().setstate(back["python_rng"]) is None
    assert list(back["opt"]["state"]) == [0]  # integer keys stay integers (an optimizer's state needs them)


def test_a_save_replaces_the_last_one_and_a_crash_before_its_manifest_keeps_the_last_one(tmp_path, monkeypatch):
    folder = tmp_path / "c"
    save_checkpoint(folder, _blob(step=1), part_bytes=1000)
    first = set(folder.glob("*.safetensors"))
    save_checkpoint(folder, _blob(step=2), part_bytes=1000)
    assert load_checkpoint(folder)["state"]["step"] == 2
    assert not first & set(folder.glob("*.safetensors"))  # the old parts are gone

    def killed(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(folder, _blob(step=3), part_bytes=1000)
    monkeypatch.undo()
    assert load_checkpoint(folder)["state"]["step"] == 2  # the manifest still names the complete parts of step 2
    save_checkpoint(folder, _blob(step=4), part_bytes=1000)
    manifest = json.loads((folder / "checkpoint.json").read_text())
    assert {p.name for p in folder.glob("*.safetensors")} == {e["file"] for e in manifest["parts"]}  # leftovers swept


def test_a_torn_or_missing_part_is_named_and_foreign_folders_are_left_alone(tmp_path):
    folder = save_checkpoint(tmp_path / "c", _blob(), part_bytes=1000)
    part = sorted(folder.glob("*.safetensors"))[2]
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match=f"{part.name}: its size or SHA-256 differs"):
        load_checkpoint(folder)
    part.unlink()
    with pytest.raises(CheckpointError, match=f"{part.name}: missing"):
        load_checkpoint(folder)
    (folder / "checkpoint.json").write_text("{")
    with pytest.raises(CheckpointError, match="checkpoint.json: not valid JSON"):
        load_checkpoint(folder)
    with pytest.raises(CheckpointError, match="no trainer checkpoint"):
        load_checkpoint(tmp_path / "nothing")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="not a trainer checkpoint"):
        save_checkpoint(notes, _blob())
    assert [p.name for p in notes.iterdir()] == ["mine.txt"]
    with pytest.raises(CheckpointError, match="cannot be kept"):
        save_checkpoint(tmp_path / "odd", {"x": object()})
