"""GPU index lists, parsed one way and with one meaning everywhere (`serve --gpus/--train-gpus`, `pipeline
--infer-gpus/--train-gpus`, `bench matrix --gpus`, recipes' [gpus], the dashboard's roles).

An index counts the GPUs *this process may see*, as CUDA and torch count them: under
CUDA_VISIBLE_DEVICES=2,3, GPU 0 is physical GPU 2 and GPU 1 is physical GPU 3. With the variable unset the
indices are physical. A child is started with CUDA_VISIBLE_DEVICES set to the entries the indices stand for
(`physical`), so it lands where the user meant whatever the parent was given.

Torch-free: the control plane (`jobs`) parses with it too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

CPU = "cpu"
ENV = "CUDA_VISIBLE_DEVICES"


def _items(value: Any, owner: str) -> list[Any]:
    """The entries of a GPU list: from "0,1" / "cpu", an int, or a list of them."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == CPU:
            return [CPU]
        if text == "":
            raise ValueError(f"{owner} has no GPU: give it GPU indices or \"cpu\"")
        items: list[Any] = []
        for part in (p.strip() for p in text.split(",")):
            if part.lower() == CPU:
                items.append(CPU)
            elif part.isdigit():
                items.append(int(part))
            else:
                raise ValueError(f"{owner}: expected GPU indices or \"cpu\", got {value!r}")
        return items
    if isinstance(value, bool):
        raise ValueError(f"{owner}: expected a GPU index, a list of GPU indices or \"cpu\", got {value!r}")
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(
        f"{owner}: expected a GPU index, a list of GPU indices or \"cpu\", got {value!r} ({type(value).__name__})")


def parse_gpus(value: Any, *, owner: str = "value") -> tuple[int, ...] | None:
    """Visible GPU indices from "0,1", an int, a list of ints, or "cpu" (-> None). ValueError names `owner`
    (the option or recipe key) and what was expected."""
    items = _items(value, owner)
    if not items:
        raise ValueError(f"{owner} has no GPU: give it GPU indices or \"cpu\"")
    if any(isinstance(i, str) and i.lower() == CPU for i in items):
        if len(items) > 1:
            raise ValueError(f"{owner}: \"cpu\" cannot be mixed with GPU indices")
        return None
    out: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(f"{owner}: expected GPU indices (integers >= 0), got {item!r}")
        if item in out:
            raise ValueError(f"{owner}: GPU {item} is listed twice")
        out.append(item)
    return tuple(out)


def physical(indices: tuple[int, ...] | list[int], owner: str,
             environ: Mapping[str, str] | None = None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries that visible `indices` stand for (ids or UUIDs, as given to us)."""
    visible = (os.environ if environ is None else environ).get(ENV)
    if visible is None:
        return [str(i) for i in indices]
    shown = [v.strip() for v in visible.split(",") if v.strip()]
    beyond = [str(i) for i in indices if i >= len(shown)]
    if beyond:
        given = ",".join(str(i) for i in indices)
        raise ValueError(f"{owner} {given}: {ENV}={visible!r} leaves {len(shown)} GPU(s) visible (indices count "
                         f"those), so {', '.join(beyond)} does not exist; use 'cpu' or unset it")
    return [shown[i] for i in indices]


def child_devices(value: Any, owner: str, environ: Mapping[str, str] | None = None) -> list[str] | None:
    """What a child's CUDA_VISIBLE_DEVICES holds for an option's value (None: "cpu")."""
    indices = parse_gpus(value, owner=owner)
    return None if indices is None else physical(indices, owner, environ)
