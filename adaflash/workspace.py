"""Where a workspace lives and where converted models are cached.

Kept free of heavy imports: the control plane (`jobs`, the TUI) uses it too.
"""

from __future__ import annotations

import os
from pathlib import Path

WORKSPACE_ENV = "ADAFLASH_WORKSPACE"
CACHE_ENV = "ADAFLASH_CACHE"
DEFAULT_WORKSPACE = "adaflash-workspace"
RUNLOG_FILE = "runlog.sqlite"


def workspace_path(explicit: str | os.PathLike | None = None) -> Path:
    """The workspace: `--workspace`, else $ADAFLASH_WORKSPACE, else ./adaflash-workspace (not created)."""
    raw = explicit or os.environ.get(WORKSPACE_ENV) or DEFAULT_WORKSPACE
    return Path(raw).expanduser().resolve()


def workspace_dir(explicit: str | os.PathLike | None = None) -> Path:
    """`workspace_path`, created: for commands that record something there."""
    path = workspace_path(explicit)
    path.mkdir(parents=True, exist_ok=True)
    return path


def runlog_path(workspace: str | os.PathLike | None = None) -> Path:
    return workspace_dir(workspace) / RUNLOG_FILE


def runs_dir(workspace: str | os.PathLike | None = None) -> Path:
    path = workspace_dir(workspace) / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Converted models are shared by every workspace of a user: $ADAFLASH_CACHE or ~/.cache/adaflash."""
    raw = os.environ.get(CACHE_ENV)
    if raw:
        path = Path(raw).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "adaflash"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
