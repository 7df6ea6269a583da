"""The modes of what adaflash writes through temporary files.

`tempfile.mkstemp`, `tempfile.mkdtemp` and safetensors' `save_file` make owner-only files and
folders (0600, 0700). Renamed into place as they are, a drafter, a converted model or a data file
could not be read by a server or a colleague running under another account of the same group,
although any other file the user writes could. So before its rename each one gets the modes the
user's umask gives a new file or folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it where Linux reports it (threads may be writing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_usual_modes(path: Path) -> None:
    """`path` and, for a folder, everything under it: 0777 & ~umask for folders, 0666 & ~umask for files."""
    mask = umask()
    folder_mode, file_mode = 0o777 & ~mask, 0o666 & ~mask
    if not path.is_dir():
        os.chmod(path, file_mode)
        return
    for root, dirs, files in os.walk(path):
        for name in files:
            os.chmod(os.path.join(root, name), file_mode)
        for name in dirs:
            os.chmod(os.path.join(root, name), folder_mode)
    os.chmod(path, folder_mode)


def nearest_existing(path: Path) -> Path:
    """The closest of `path`'s ancestors that exists: where a folder for it would be made, or why it cannot be
    (a file there)."""
    return next(parent for parent in path.absolute().parents if parent.exists())


def write_json_atomic(path: Path, value: object) -> None:
    """`value` as JSON at `path`, all or nothing: written beside it, flushed to disk, renamed into place.
    A reader (or a restart after a crash) sees the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps(value))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
