"""One way to assemble an engine from user-facing names (CLI, server, workers)."""

from __future__ import annotations

import os

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine, fitting_drafter
from adaflash.methods import VANILLA, method_of
from adaflash.models.builtin_drafters import builtin_drafter_of
from adaflash.models.drafter_io import load_drafter
from adaflash.models.loading import Target, load_target


def drafter_for(method: str, draft: str | None, target: str | Target, *, ask: str = "--draft DIR") -> str | None:
    """The drafter a method runs: `--draft`, else the built-in drafter of a built-in target (DFlash, AdaFlash).
    `ask`: how the command takes a drafter, for the error when there is none."""
    if not method_of(method).needs_drafter:
        return None
    if draft:
        return draft
    builtin = builtin_drafter_of(target.name if isinstance(target, Target) else target, method)
    if builtin is None:
        raise ValueError(f"--method {method} needs {ask} (a drafter folder or a built-in drafter's name)")
    return builtin


def build_engine(
    target: str | Target,
    method: str = VANILLA,
    draft: str | None = None,
    *,
    config: EngineConfig | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> Engine:
    config = config or EngineConfig()
    draft = drafter_for(method, draft, target)
    loaded = target if isinstance(target, Target) else load_target(target, device=device, dtype=dtype)
    drafter = load_drafter(draft, loaded.model.cfg) if draft else None
    if drafter is not None:
        try:
            fitting_drafter(method_of(method), drafter)
        except ValueError as err:
            raise ValueError(f"--draft {draft}: {err}") from None
    graphs = os.environ.get("ADAFLASH_CUDA_GRAPHS", "").strip().lower()
    if graphs and config.cuda_graphs is None:
        if graphs not in ("0", "1", "false", "true", "off", "on"):
            raise ValueError(f"ADAFLASH_CUDA_GRAPHS={graphs!r}: expected 0 or 1")
        # The escape hatch for a GPU path problem: eager kernels, same outputs.
        config = config.replace(cuda_graphs=graphs in ("1", "true", "on") and loaded.device.type == "cuda")
    return Engine(loaded, method, drafter, config=config)
