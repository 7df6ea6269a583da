"""Versioned drafter weights: publish atomically, follow the pointer, refuse torn versions.

Publish: write the drafter (and the trainer state) to a temp folder, fsync, rename to
`weights/v{N}`, then replace the `LATEST` pointer (temp file + fsync + rename) carrying the
version, folder and SHA-256 of the weights. Readers trust a version only if the checksum
matches and the drafter loads and fits the target; otherwise it is refused and the previous
one stays in use.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adaflash.models.drafter_io import DrafterError, export_drafter, load_drafter, save_drafter
from adaflash.models.drafters import Drafter
from adaflash.models.layers import DecoderConfig

POINTER = "LATEST"
VERSION_DIR = re.compile(r"^v(\d+)$")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class WeightStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root) / "weights"
        self.root.mkdir(parents=True, exist_ok=True)

    def pointer(self) -> dict[str, Any] | None:
        path = self.root / POINTER
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None

    def latest_version(self) -> int:
        pointer = self.pointer()
        return int(pointer["version"]) if pointer else 0

    def check_latest(self) -> int:
        """The newest version, its weights checked against the pointer's checksum (DrafterError if they do
        not match); 0 when none was published. A trainer resumes only from weights the readers would take."""
        pointer = self.pointer()
        if not pointer:
            return 0
        version = int(pointer["version"])
        _check_weights(self.root / str(pointer["path"]), version, pointer.get("sha256"))
        return version

    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := VERSION_DIR.match(p.name)))

    def publish(self, drafter: Drafter, meta: dict[str, Any], *, keep: int = 3,
                extra_files: dict[str, Callable[[Path], None]] | None = None,
                pointer_extra: dict[str, Any] | None = None) -> int:
        version = max([self.latest_version(), *self.versions()], default=0) + 1
        folder = self.root / f"v{version}"
        save_drafter(drafter, folder, {**meta, "version": version}, extra_files=extra_files)
        pointer = {"version": version, "path": folder.name, "sha256": sha256(folder / "model.safetensors"),
                   **(pointer_extra or {}), "published_at": time.time()}  # the moment readers may see it
        tmp = self.root / (POINTER + ".tmp")
        with tmp.open("w") as handle:
            handle.write(json.dumps(pointer))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.root / POINTER)
        self.prune(keep)
        return version

    def prune(self, keep: int) -> None:
        current = self.latest_version()
        old = [v for v in self.versions() if v != current]
        for version in old[: max(0, len(old) - max(keep - 1, 0))]:
            shutil.rmtree(self.root / f"v{version}", ignore_errors=True)

    def folder(self, version: int) -> Path:
        return self.root / f"v{version}"

    def load(self, target: DecoderConfig, *, newer_than: int = 0) -> tuple[int, Drafter] | None:
        """The newest version if it is newer than `newer_than`; DrafterError if it is torn or invalid."""
        pointer = self.pointer()
        if not pointer or int(pointer["version"]) <= newer_than:
            return None
        folder = self.root / str(pointer["path"])
        _check_weights(folder, int(pointer["version"]), pointer.get("sha256"))
        return int(pointer["version"]), load_drafter(folder, target)

    def export(self, out: str | Path, version: int | None = None) -> tuple[int, Path]:
        """A version's drafter (config and weights; not the trainer's state) copied atomically to `out`.

        Why: versions are pruned as newer ones land; an exported drafter is a stable folder that
        `serve`, `bench` and `--init` take. The newest is checked against the pointer's checksum.
        """
        pointer = self.pointer()
        if pointer is None:
            raise DrafterError(f"{self.root}: no version has been published")
        newest = int(pointer["version"])
        version = newest if version is None else version
        folder = self.folder(version)
        if not (folder / "model.safetensors").is_file():
            raise DrafterError(f"version {version} is not in {self.root} (kept: {self.versions()})")
        if version == newest:
            _check_weights(folder, version, pointer.get("sha256"))
        return version, export_drafter(folder, out)


def _check_weights(folder: Path, version: int, expected_sha256: str | None) -> None:
    """DrafterError unless the version's weights are there and match the pointer's checksum."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise DrafterError(f"version {version}: {weights} is missing")
    if sha256(weights) != expected_sha256:
        raise DrafterError(f"version {version}: {weights} does not match its checksum (torn write)")
