"""Drafter checkpoints: config.json in the DFlash/AdaFlash (or EAGLE-3) layout + model.safetensors.

Saving is atomic (temp folder, fsync, rename) so a reader never sees half a checkpoint, and
loading validates the config against the target before any weight is trusted.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from adaflash.files import give_usual_modes, nearest_existing
from adaflash.methods import DRAFTER_ARCHITECTURES
from adaflash.models.drafters import ChainDrafter, DFlashDrafter, Drafter
from adaflash.models.layers import DecoderConfig
from adaflash.models.registry import resolve_drafter
from adaflash.models.target import TargetModel

# The `architectures` entry of a drafter folder's config.json, per drafter architecture (methods.py names them).
ARCHITECTURES = {"dflash": "DFlashDraftModel", "eagle3": "LlamaForCausalLMEagle3", "mtp": "AdaFlashMTPModel"}


class DrafterError(ValueError):
    """A drafter folder that cannot be used, with the file and field named."""


def spread_layers(num_layers: int, count: int) -> list[int]:
    """`count` target layers spread evenly, skipping the first and the last few (DFlash's rule)."""
    count = max(1, min(count, num_layers))
    if count == 1:
        return [num_layers - 1]
    start, end = (1, num_layers - 3) if num_layers >= 8 else (0, num_layers - 1)
    return sorted({round(start + i * (end - start) / (count - 1)) for i in range(count)})


def default_layer_ids(method: str, num_layers: int) -> list[int]:
    if method == "dflash":
        return spread_layers(num_layers, 5 if num_layers >= 20 else 3)
    if method == "eagle3":
        return spread_layers(num_layers, 3)
    return [num_layers - 1]


def drafter_decoder_config(target: DecoderConfig, layers: int) -> DecoderConfig:
    """The drafter's layers: the target's widths, Qwen3-style attention (q/k norm), as DFlash ships."""
    return DecoderConfig(
        hidden_size=target.hidden_size, intermediate_size=target.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=target.num_attention_heads, num_key_value_heads=target.num_key_value_heads,
        head_dim=target.head_dim, vocab_size=target.vocab_size, rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta, rope_scaling=target.rope_scaling,
        max_position_embeddings=target.max_position_embeddings, attention_bias=False, qk_norm=True,
        tie_word_embeddings=False, model_type="qwen3",
    )


def new_drafter(
    method: str,
    target: DecoderConfig,
    *,
    layers: int = 1,
    block_size: int = 16,
    length_head: bool = False,
    target_layer_ids: list[int] | None = None,
    mask_token_id: int | None = None,
    steps: int = 6,
    seed: int = 0,
    draft_vocab: torch.Tensor | None = None,
) -> Drafter:
    if method not in DRAFTER_ARCHITECTURES:
        raise DrafterError(f"--method must be one of {', '.join(DRAFTER_ARCHITECTURES)}, got {method!r}")
    if method == "dflash" and not 1 <= layers <= 8:
        raise DrafterError(f"--layers must be between 1 and 8 for a DFlash drafter, got {layers}")
    if method == "dflash" and not 2 <= block_size <= 64:
        raise DrafterError(f"--block-size must be between 2 and 64, got {block_size}")
    ids = target_layer_ids or default_layer_ids(method, target.num_hidden_layers)
    _check_layer_ids(ids, target.num_hidden_layers, "target_layer_ids")
    torch.manual_seed(seed)
    size = None if draft_vocab is None else int(draft_vocab.numel())
    if draft_vocab is not None:
        check_draft_vocab(draft_vocab, target.vocab_size, "draft vocabulary")
    if method == "dflash":
        cfg = drafter_decoder_config(target, layers)
        drafter: Drafter = DFlashDrafter(cfg, ids, block_size, mask_token_id, length_head, draft_vocab_size=size)
    else:
        cfg = drafter_decoder_config(target, 1)
        drafter = ChainDrafter(cfg, ids, method, steps, draft_vocab_size=size)
    _init_weights(drafter)
    if draft_vocab is not None:
        drafter.draft_vocab.copy_(draft_vocab)
    return drafter


@torch.no_grad()
def init_from_target(drafter: Drafter, target: TargetModel) -> list[int]:
    """Start the drafter where the target already is: its layers copy the target layers that follow
    the deepest feature layer, `fc` passes that layer's output through, and the norms are the
    target's. A random drafter spends its first minutes learning what the target knows; on a CPU
    those minutes are the whole budget. Returns the target layers copied (empty: nothing fit)."""
    deepest = max(drafter.target_layer_ids)
    n = target.cfg.num_hidden_layers
    layers = drafter.layers if isinstance(drafter, DFlashDrafter) else [drafter.midlayer]
    copied: list[int] = []
    for i, layer in enumerate(layers):
        index = min(deepest + 1 + i, n - 1)
        theirs, ours = target.model.layers[index].state_dict(), layer.state_dict()
        if any(key in ours and ours[key].shape != value.shape for key, value in theirs.items()):
            return copied
        layer.load_state_dict(theirs, strict=False)  # q/k norms (the target has none) stay at 1
        copied.append(index)
    drafter.norm.load_state_dict(target.model.norm.state_dict())
    if isinstance(drafter, DFlashDrafter):
        hidden = drafter.cfg.hidden_size
        chunk = drafter.target_layer_ids.index(deepest)
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, chunk * hidden:(chunk + 1) * hidden] = torch.eye(hidden)
        drafter.hidden_norm.load_state_dict(target.model.layers[copied[0]].input_layernorm.state_dict())
    return copied


def check_draft_vocab(vocab: torch.Tensor, vocab_size: int, where: str) -> None:
    ids = vocab.tolist()
    if not ids or any(not 0 <= i < vocab_size for i in ids) or len(set(ids)) != len(ids):
        raise DrafterError(f"{where}: expected distinct token ids in [0, {vocab_size}), got {len(ids)} ids")


def frequent_tokens(sequences: list[list[int]], size: int, vocab_size: int, always: list[int] = ()) -> torch.Tensor:
    """The `size` most frequent ids of `sequences` (plus `always`, e.g. eos), sorted: a draft vocabulary."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids in sequences:
        counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size)[:vocab_size]
    keep = [i for i in always if 0 <= i < vocab_size]
    counts[keep] = counts.max() + 1
    size = min(size, vocab_size)
    return counts.topk(size).indices.sort().values


def _init_weights(module: torch.nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear):
            torch.nn.init.normal_(sub.weight, std=0.02)
            if sub.bias is not None:
                torch.nn.init.zeros_(sub.bias)


def _check_layer_ids(ids: list[int], num_layers: int, where: str) -> None:
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < num_layers]
    if bad or not ids:
        raise DrafterError(f"{where}: layer ids {bad or ids} out of range for a target with {num_layers} layers")


def drafter_config(drafter: Drafter, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = drafter.cfg.to_hf()
    cfg["architectures"] = [ARCHITECTURES[drafter.method]]
    cfg["num_target_layers"] = (extra or {}).get("num_target_layers")
    if isinstance(drafter, DFlashDrafter):
        cfg["block_size"] = drafter.block_size
        cfg["dflash_config"] = {
            "block_size": drafter.block_size,
            "mask_token_id": drafter.mask_token_id,
            "target_layer_ids": drafter.target_layer_ids,
            "mask_embedding": "learned" if drafter.mask_token_id is None else "token",
            "use_length_head": drafter.length_head is not None,
            "length_head_hidden_size": drafter.length_head.proj_in.out_features if drafter.length_head else None,
        }
    else:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": drafter.target_layer_ids,
                               "num_steps": drafter.max_draft}
    cfg["draft_vocab_size"] = drafter.draft_vocab_size
    cfg["adaflash"] = {"method": drafter.method, **(extra or {})}
    return cfg


def save_drafter(drafter: Drafter, out: str | Path, extra: dict[str, Any] | None = None,
                 extra_files: dict[str, Callable[[Path], None]] | None = None) -> Path:
    """Write atomically: a temp sibling folder, fsync'd, then renamed over `out`.

    `extra_files` writers (e.g. the trainer state) land in the same folder, in the same rename.
    """
    out = Path(out)
    with staged_folder(out) as tmp:
        state = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()
                 if not k.startswith("rotary.")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(drafter_config(drafter, extra), indent=2) + "\n")
        for name, writer in (extra_files or {}).items():
            writer(tmp / name)
    return out


def export_drafter(src: str | Path, out: str | Path, dtype: torch.dtype | None = None) -> Path:
    """A checked copy of a drafter folder, atomically: byte for byte, or its floating weights cast to `dtype`.

    Why a cast: a drafter trained in float32 ships in bf16 (half the size); the engine casts weights to its
    own dtype when it loads them.
    """
    src = Path(src)
    load_drafter(src)  # the config and the weights' shapes agree
    out = Path(out).expanduser()
    if out.resolve() == src.resolve():
        raise DrafterError(f"{out}: the export would replace the drafter it reads")
    with staged_folder(out) as tmp:
        shutil.copy2(src / "config.json", tmp / "config.json")
        if dtype is None:
            shutil.copy2(src / "model.safetensors", tmp / "model.safetensors")
        else:
            state = load_file(str(src / "model.safetensors"))
            save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()},
                      str(tmp / "model.safetensors"), metadata={"format": "pt"})
    return out


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A temp sibling of `out` to write into; on success it becomes `out` (see install_folder), else it goes."""
    refuse_foreign_folder(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        install_folder(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def refuse_foreign_folder(out: Path) -> None:
    """A drafter replaces only a drafter (or an empty folder): the rename would delete whatever else `out`
    holds, a workspace's run log or a user's notes."""
    if out.exists() and not out.is_dir():
        raise DrafterError(f"{out}: exists and is a file, not a drafter folder")
    parent = nearest_existing(out)
    if not parent.is_dir():
        raise DrafterError(f"{out}: {parent} is a file, so no folder can be made inside it")
    if out.is_dir() and not (out / "config.json").is_file():
        held = sorted(p.name for p in out.iterdir())
        if held:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise DrafterError(f"{out}: not a drafter folder (it holds {shown}); a drafter is written only to a "
                               "new or empty folder or over another drafter")


def install_folder(tmp: Path, out: Path) -> None:
    """Make a fully written sibling folder `out`: its files fsync'd, then renamed over whatever was there.

    A reader sees the old folder or the new one, never a mix; a crash leaves at most a hidden temp folder.
    """
    for path in (p for p in tmp.rglob("*") if p.is_file()):
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    give_usual_modes(tmp)
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
    _fsync_dir(out.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_drafter_config(folder: str | Path) -> dict[str, Any]:
    folder = resolve_drafter(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise DrafterError(f"{folder}: no config.json (not a drafter folder)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DrafterError(f"{path}: not valid JSON ({err})") from None


def drafter_method(cfg: dict[str, Any], where: str) -> str:
    arch = (cfg.get("architectures") or [None])[0]
    for method, name in ARCHITECTURES.items():
        if arch == name:
            return method
    if "dflash_config" in cfg:
        return "dflash"
    raise DrafterError(f"{where}: architectures={arch!r} is not a known drafter ({', '.join(ARCHITECTURES.values())})")


def load_drafter(folder: str | Path, target: DecoderConfig | None = None) -> Drafter:
    """Build a drafter from its folder (or a built-in drafter's name), checking it fits `target`
    (hidden size, vocab, layer ids)."""
    folder = resolve_drafter(folder)
    cfg = read_drafter_config(folder)
    where = str(folder / "config.json")
    method = drafter_method(cfg, where)
    try:
        dec = DecoderConfig.from_hf({**cfg, "model_type": "qwen3" if cfg.get("model_type") in (None, "qwen3") else cfg["model_type"]})
    except KeyError as err:
        raise DrafterError(f"{where}: missing field {err.args[0]!r}") from None
    if method == "dflash":
        dcfg = cfg.get("dflash_config") or {}
        ids = dcfg.get("target_layer_ids")
        block = dcfg.get("block_size", cfg.get("block_size", 16))
        if not isinstance(ids, list):
            raise DrafterError(f"{where}: dflash_config.target_layer_ids must be a list of integers")
    else:
        ecfg = cfg.get("eagle_config") or {}
        ids = ecfg.get("eagle_aux_hidden_state_layer_ids")
        if not isinstance(ids, list):
            raise DrafterError(f"{where}: eagle_config.eagle_aux_hidden_state_layer_ids must be a list of integers")
    if target is not None:
        for name, mine, theirs in (("hidden_size", dec.hidden_size, target.hidden_size),
                                   ("vocab_size", dec.vocab_size, target.vocab_size)):
            if mine != theirs:
                raise DrafterError(f"{where}: {name}={mine} does not match the target's {name}={theirs}")
        _check_layer_ids(ids, target.num_hidden_layers, f"{where}: target layer ids")
    vocab = cfg.get("draft_vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or not 0 < vocab <= dec.vocab_size):
        raise DrafterError(f"{where}: draft_vocab_size must be an integer in [1, {dec.vocab_size}] or null, got {vocab!r}")
    if method == "dflash":
        drafter: Drafter = DFlashDrafter(dec, ids, int(block), dcfg.get("mask_token_id"),
                                         bool(dcfg.get("use_length_head")),
                                         int(dcfg.get("length_head_hidden_size") or 256), draft_vocab_size=vocab)
    else:
        drafter = ChainDrafter(dec, ids, method, int((cfg.get("eagle_config") or {}).get("num_steps", 6)),
                               draft_vocab_size=vocab)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise DrafterError(f"{folder}: no model.safetensors")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise DrafterError(f"{weights}: unreadable or torn weights file ({err})") from None
    expected = {k: v.shape for k, v in drafter.state_dict().items() if not k.startswith("rotary.")}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected) - {"embed_tokens.weight", "lm_head.weight"})
    if missing or unexpected:
        raise DrafterError(f"{weights}: parameters do not match config.json (missing {missing[:4]}, unexpected {unexpected[:4]})")
    for name, shape in expected.items():
        if tuple(state[name].shape) != tuple(shape):
            raise DrafterError(f"{weights}: {name} has shape {tuple(state[name].shape)}, config.json implies {tuple(shape)}")
    drafter.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    if drafter.draft_vocab is not None:
        check_draft_vocab(drafter.draft_vocab, dec.vocab_size, f"{weights}: draft_vocab")
    return drafter.eval()
