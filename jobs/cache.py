"""Reusing finished jobs across runs: a job whose inputs did not change is not run again.

The rule, for a task that declares `outputs` (and not `cache = false`):

- its key is the SHA-256 of: the command as the recipe resolves it (not the interpreter's path),
  its env, cwd, torchrun settings and outputs; the code version (a digest of every source file
  of the packages in the recipe's `run.code`, by default `adaflash`, so an edit re-runs every
  cached job); for each job in `after`, the
  digest of that job's outputs, or a token unique to this run when that job caches nothing (so
  whatever follows a job that always runs, such as a benchmark, always runs too); and the digest
  of each path listed in `inputs`;
- after the job finishes (exit code 0), the key and the digest of its outputs are recorded in
  `<cache_dir>/.jobs/<job>.json`;
- a later run reuses it (status `cached`, nothing started) when the record has the same key and
  every output still exists with the digest recorded; otherwise the record and the outputs are
  removed (only inside the workspace or the cache folder) and the job runs.

Paths inside the workspace enter the key, the digests and the records relative to it, so a copied or
moved workspace reuses what it holds. Digests read the content of files up to 64 MiB and only size +
modification time above that.
A failed or stopped job records nothing, so a rerun resumes at the first job that did not finish.
Nothing here imports torch: the control plane stays fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from jobs.recipe_spec import JobSpec

RECORDS_DIR = ".jobs"
CONTENT_LIMIT = 64 * 1024 * 1024
KEY_VERSION = 2  # 2: paths inside the workspace count relative to it
_CODE_SUFFIXES = (".py", ".json", ".toml", ".jinja", ".safetensors")  # built-in drafters are code too
_code_cache: dict[str, str] = {}


def _hash_file(digest: Any, path: Path) -> None:
    stat = path.stat()
    digest.update(f"{stat.st_size}\0".encode())
    if stat.st_size > CONTENT_LIMIT:
        digest.update(f"mtime {stat.st_mtime_ns}\0".encode())
        return
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)


def path_digest(path: str | os.PathLike, *, skip: Iterable[str] = (RECORDS_DIR,)) -> str | None:
    """Digest of a file, or of a folder's files (relative names + contents); None when it is missing."""
    root = Path(path)
    if not root.exists():
        return None
    digest = hashlib.sha256()
    if root.is_file():
        _hash_file(digest, root)
        return digest.hexdigest()
    skipped = set(skip)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skipped)
        for name in sorted(files):
            file = Path(folder) / name
            digest.update(str(file.relative_to(root)).encode() + b"\0")
            if file.is_file():
                _hash_file(digest, file)
    return digest.hexdigest()


WORKSPACE_TOKEN = "{workspace}"


def portable(value: Any, workspace: str | os.PathLike | None) -> Any:
    """`value` with the workspace's absolute path written as {workspace} in every string (recursively), so a
    key or record does not change when the workspace is copied or moved."""
    if workspace is None:
        return value
    if isinstance(value, str):
        for root in dict.fromkeys((os.path.abspath(workspace), os.path.realpath(workspace))):
            if value == root:
                return WORKSPACE_TOKEN
            value = value.replace(root.rstrip(os.sep) + os.sep, WORKSPACE_TOKEN + "/")
        return value
    if isinstance(value, Mapping):
        return {portable(k, workspace): portable(v, workspace) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, workspace) for v in value]
    return value


def outputs_digest(paths: Iterable[str], workspace: str | os.PathLike | None = None) -> str | None:
    """One digest for every output (named relative to the workspace when inside it); None when one is missing."""
    digest = hashlib.sha256()
    for path in paths:
        one = path_digest(path)
        if one is None:
            return None
        digest.update(f"{portable(path, workspace)}\0{one}\0".encode())
    return digest.hexdigest()


def code_version(package: str = "adaflash") -> str:
    """A digest of a package's source files (found without importing anything heavy)."""
    if package in _code_cache:
        return _code_cache[package]
    import importlib.util

    found = importlib.util.find_spec(package)
    roots = list(found.submodule_search_locations or []) if found else []
    digest = hashlib.sha256(package.encode())
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(_CODE_SUFFIXES):
                    file = Path(folder) / name
                    digest.update(str(file.relative_to(root)).encode() + b"\0")
                    _hash_file(digest, file)
    _code_cache[package] = digest.hexdigest()
    return _code_cache[package]


def job_key(spec: JobSpec, upstream: Mapping[str, str], code: str,
            workspace: str | os.PathLike | None = None) -> str:
    """The key of one job: same key, same outputs (see the module docstring)."""
    material = {
        "v": KEY_VERSION, "command": spec.command, "env": spec.env, "cwd": spec.cwd,
        "torchrun": [spec.torchrun_nproc, spec.torchrun_args], "outputs": spec.outputs, "code": code,
        "after": {name: upstream[name] for name in sorted(upstream)},
        "inputs": {path: path_digest(path) for path in spec.inputs},
    }
    return hashlib.sha256(json.dumps(portable(material, workspace), sort_keys=True).encode()).hexdigest()


def _removable(path: Path, roots: Iterable[Path], protected: Iterable[Path]) -> bool:
    """Strictly inside one of `roots`, and neither one of `protected` nor a folder holding one."""
    resolved = path.resolve()
    if not any(root in resolved.parents for root in roots):
        return False
    return not any(resolved == p or resolved in p.parents for p in protected)


class JobCache:
    """The records of one recipe's cache folder, and the decisions `adaflash run` takes with them."""

    def __init__(self, cache_dir: str | os.PathLike, *, safe_roots: Iterable[str | os.PathLike] = (),
                 protected: Iterable[str | os.PathLike] = (), packages: Iterable[str] = ("adaflash",),
                 workspace: str | os.PathLike | None = None) -> None:
        self.dir = Path(cache_dir)
        self.workspace = workspace
        self.records = self.dir / RECORDS_DIR
        self.safe_roots = [Path(r).resolve() for r in (self.dir, *safe_roots)]
        self.protected = [Path(p).resolve() for p in (self.records, *protected)]
        self.packages = list(packages)
        self._code: str | None = None

    @property
    def code(self) -> str:
        """The code version: one digest over the source of every package in `packages`."""
        if self._code is None:
            self._code = ",".join(f"{p}:{code_version(p)}" for p in self.packages)
        return self._code

    def key(self, spec: JobSpec, upstream: Mapping[str, str]) -> str:
        return job_key(spec, upstream, self.code, self.workspace)

    def record_path(self, name: str) -> Path:
        return self.records / f"{name}.json"

    def record(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.record_path(name).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def lookup(self, spec: JobSpec, key: str) -> dict[str, Any] | None:
        """The record to reuse when the key matches and the outputs are there, unchanged; else None."""
        record = self.record(spec.name)
        if not record or record.get("key") != key:
            return None
        if outputs_digest(spec.outputs, self.workspace) != record.get("outputs_digest"):
            return None
        return record

    def forget(self, spec: JobSpec) -> list[str]:
        """Before a job runs again: drop its record and remove its old outputs (only strictly inside the
        safe roots, and never the records, the run log or the runs folder)."""
        with contextlib.suppress(FileNotFoundError):
            self.record_path(spec.name).unlink()
        removed = []
        for output in spec.outputs:
            path = Path(output)
            if not path.exists() or not _removable(path, self.safe_roots, self.protected):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(str(path))
        return removed

    def save(self, spec: JobSpec, key: str, *, run_id: str, duration: float | None,
             log_path: str | None = None) -> dict[str, Any] | None:
        """Record a finished job; None (nothing recorded) when an output is missing."""
        digest = outputs_digest(spec.outputs, self.workspace)
        if digest is None:
            return None
        record = {"job": spec.name, "key": key, "outputs": portable(spec.outputs, self.workspace),
                  "outputs_digest": digest, "run_id": run_id, "finished_at": time.time(), "duration": duration,
                  "log_path": portable(log_path, self.workspace)}
        self.records.mkdir(parents=True, exist_ok=True)
        tmp = self.records / f".{spec.name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, self.record_path(spec.name))
        return record


__all__ = ["JobCache", "code_version", "job_key", "outputs_digest", "path_digest", "portable"]
