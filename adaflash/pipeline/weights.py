"""Versioned drafter weights: publish atomically, follow the pointer, refuse torn versions.

Publish: write the drafter (and the trainer state) to a temp folder, fsync, rename to
`weights/v{N}`, append the SHA-256 of each of its files to the `versions.jsonl` ledger (fsync),
then replace the `LATEST` pointer (temp file + fsync + rename) carrying the version, folder and
SHA-256 of the weights. Readers trust a version only if its checksums match and the drafter
loads and fits the target; otherwise it is refused and the previous one stays in use.

Why a ledger beside the pointer: the pointer only vouches for the newest version. When that one
is torn (a disk filled, a copy cut short while the run was stopped), a restarted trainer or
inference worker falls back to the newest older version whose recorded checksums still match,
and names the versions it skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from adaflash.files import write_json_atomic
from adaflash.models.drafter_io import DrafterError, export_drafter, load_drafter, save_drafter
from adaflash.models.drafters import Drafter
from adaflash.models.layers import DecoderConfig

POINTER = "LATEST"
LEDGER = "versions.jsonl"
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

    def records(self) -> dict[int, dict[str, str]]:
        """Version -> {file path in its folder: SHA-256} from the ledger and the pointer (complete ledger lines only)."""
        found: dict[int, dict[str, str]] = {}
        path = self.root / LEDGER
        if path.exists():
            data = path.read_bytes()
            for line in data[: data.rfind(b"\n") + 1].splitlines():
                try:
                    entry = json.loads(line)
                    found[int(entry["version"])] = {str(k): str(v) for k, v in entry["files"].items()}
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a damaged line vouches for nothing
        pointer = self.pointer()
        if pointer and pointer.get("sha256"):
            files = found.setdefault(int(pointer["version"]), {})
            files.setdefault("model.safetensors", str(pointer["sha256"]))
        return found

    def verify(self, version: int, records: dict[int, dict[str, str]] | None = None) -> None:
        """DrafterError unless the version's folder holds its weights and every recorded file matches."""
        files = (self.records() if records is None else records).get(version)
        folder = self.folder(version)
        if not files:
            raise DrafterError(f"version {version}: no checksum was recorded for {folder}")
        if "model.safetensors" not in files:
            raise DrafterError(f"version {version}: the ledger records no checksum of its weights")
        for name, expected in sorted(files.items()):
            path = folder / name
            if not path.is_file():
                raise DrafterError(f"version {version}: {path} is missing")
            if sha256(path) != expected:
                raise DrafterError(f"version {version}: {path} does not match its checksum (torn write)")

    def newest_valid(self, *, newer_than: int = 0, target: DecoderConfig | None = None,
                     skip: Collection[int] = ()) -> tuple[tuple[int, Drafter | None] | None, list[tuple[int, str]]]:
        """The newest version above `newer_than`, not in `skip`, whose files match their checksums (and, given
        `target`, whose drafter loads for it, returned alongside), or None; and the newer versions skipped, with why.

        A trainer resumes, and a reader starts, only from such a version: a torn newest one costs the
        steps since the one before it, never the run.
        """
        records, newest = self.records(), self.latest_version()
        skipped: list[tuple[int, str]] = []
        for version in sorted({*records, *self.versions()}, reverse=True):
            if version <= newer_than:
                break
            if version in skip:
                continue
            if not self.folder(version).is_dir():
                if version == newest:
                    skipped.append((version, f"version {version}: {self.folder(version)} is missing"))
                continue  # an older one was pruned: not a version any more
            try:
                self.verify(version, records)
                return (version, load_drafter(self.folder(version), target) if target is not None else None), skipped
            except (DrafterError, ValueError, OSError) as err:
                skipped.append((version, str(err)))
        return None, skipped

    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := VERSION_DIR.match(p.name)))

    def publish(self, drafter: Drafter, meta: dict[str, Any], *, keep: int = 3,
                extra_files: dict[str, Callable[[Path], None]] | None = None,
                pointer_extra: dict[str, Any] | None = None) -> int:
        version = max([self.latest_version(), *self.versions(), *self.records()], default=0) + 1
        folder = self.root / f"v{version}"
        save_drafter(drafter, folder, {**meta, "version": version}, extra_files=extra_files)
        files = {p.relative_to(folder).as_posix(): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}
        ledger = self.root / LEDGER
        torn_tail = ledger.exists() and ledger.stat().st_size and not ledger.read_bytes().endswith(b"\n")
        with ledger.open("a", encoding="utf-8") as handle:
            handle.write(("\n" if torn_tail else "") + json.dumps({"version": version, "path": folder.name, "files": files}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        pointer = {"version": version, "path": folder.name, "sha256": files["model.safetensors"],
                   **(pointer_extra or {}), "published_at": time.time()}  # the moment readers may see it
        write_json_atomic(self.root / POINTER, pointer)
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
        version = int(pointer["version"])
        return version, self.load_version(version, target)

    def load_version(self, version: int, target: DecoderConfig) -> Drafter:
        """Version `version`'s drafter, its checksums checked first; DrafterError if it is torn or invalid."""
        self.verify(version)
        return load_drafter(self.folder(version), target)

    def export(self, out: str | Path, version: int | None = None) -> tuple[int, Path]:
        """A version's drafter (config and weights; not the trainer's state) copied atomically to `out`.

        Why: versions are pruned as newer ones land; an exported drafter is a stable folder that
        `serve`, `bench` and `--init` take. The version is checked against its recorded checksums (swap
        folders written before the ledger existed vouch only for their newest version).
        """
        pointer = self.pointer()
        if pointer is None:
            raise DrafterError(f"{self.root}: no version has been published")
        newest = int(pointer["version"])
        version = newest if version is None else version
        folder = self.folder(version)
        if not (folder / "model.safetensors").is_file():
            raise DrafterError(f"version {version} is not in {self.root} (kept: {self.versions()})")
        records = self.records()
        if version == newest or version in records:
            self.verify(version, records)
        return version, export_drafter(folder, out)

