"""Synthetic targets: the real architecture of an 8B model with seeded random weights.

Why: the verify-cost curve, memory and speed of an 8B target can be measured on a machine that cannot
download one (no hub here, and none in many users' CI). Random weights of the real shapes run at the real
speed and memory through the embedded engine; τ measured with them means nothing.

The embedded engine runs dense decoders only (Llama, Qwen2, Qwen3, Mistral): it has no mixture-of-experts
layer, so no MoE architecture (Qwen3-30B-A3B and the like) can be synthesized. The weight names and shapes
come from the engine's own `TargetModel`, so what is written is what it loads. The architecture table needs
no torch: `adaflash models list` reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaflash.files import give_usual_modes
from adaflash.models.synth_tokenizer import CHAT_FORMATS, ChatFormat, write_tokenizer

INIT_STD = 0.02  # every matrix ~ N(0, 0.02²); norms 1, biases 0: activations stay finite through every layer
MAX_SHARD_BYTES = 4 * 10**9  # ≤ 4 GB a shard, as hub checkpoints are cut
MARKER = "adaflash-synth.json"  # how the folder was made; also what lets --force replace it
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


class SynthError(ValueError):
    """A bad architecture name, option or output folder, in the words of the option."""


@dataclass(frozen=True)
class SynthArch:
    name: str
    description: str
    config: dict[str, Any]  # config.json less its token ids, which come from the chat format's tokenizer
    chat: str  # a key of CHAT_FORMATS


def _qwen3(**size: Any) -> dict[str, Any]:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "initializer_range": INIT_STD,
            "rope_scaling": None, "use_sliding_window": False, "sliding_window": None, "use_cache": True,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False, **size}


# Llama 3.1's rope: the engine implements the "llama3" scaling (adaflash/models/layers.py `_inv_freq`).
_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}


def _llama31(**size: Any) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "initializer_range": INIT_STD, "pretraining_tp": 1, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": dict(_LLAMA31_ROPE),
            "tie_word_embeddings": False, "use_cache": True, **size}


ARCHS: dict[str, SynthArch] = {arch.name: arch for arch in (
    SynthArch("qwen3-8b", "Qwen3-8B shapes: 36 layers, hidden 4096, 32/8 heads of 128, MLP 12288, "
              "vocab 151,936, q/k norms, untied (8.2B parameters, 16.4 GB in bf16)",
              _qwen3(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                     max_window_layers=36), "chatml"),
    SynthArch("llama-3.1-8b", "Llama-3.1-8B shapes: 32 layers, hidden 4096, 32/8 heads of 128, MLP 14336, "
              "vocab 128,256, llama3 rope scaling, untied (8.0B parameters, 16.1 GB in bf16)",
              _llama31(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                       max_position_embeddings=131072),
              "llama3"),
    SynthArch("smollm2-135m", "SmolLM2-135M shapes: 30 layers, hidden 576, 9/3 heads of 64, MLP 1536, vocab 49,152, "
              "tied embeddings (134.5M parameters, 269 MB in bf16): the built-in target's speed without its weights",
              _llama31(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                       num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                       rope_theta=100000.0, rope_scaling=None, tie_word_embeddings=True), "llama3"),
    SynthArch("qwen3-tiny", "Qwen3 layout at toy size for tests: 4 layers, hidden 128, 4/2 heads of 32, "
              "vocab 1,024 (about 2 MB)",
              _qwen3(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, vocab_size=1024, max_position_embeddings=4096,
                     max_window_layers=4), "chatml"),
    SynthArch("llama-tiny", "Llama 3.1 layout at toy size for tests: 4 layers, hidden 128, 4/2 heads of 32, "
              "vocab 1,024, llama3 rope scaling (about 2 MB)",
              _llama31(hidden_size=128, intermediate_size=448, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, vocab_size=1024, max_position_embeddings=131072),
              "llama3"),
)}


def arch_of(name: str) -> SynthArch:
    if name not in ARCHS:
        raise SynthError(f"unknown architecture {name!r}; choose from {', '.join(ARCHS)} "
                         "(dense decoders only: the embedded engine has no mixture-of-experts layer)")
    return ARCHS[name]


def synth_config(name: str, *, layers: int | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """config.json of architecture `name`, with `layers` decoder layers instead of its own if given."""
    arch = arch_of(name)
    if layers is not None and layers < 1:
        raise SynthError(f"--layers must be at least 1, got {layers}")
    chat = CHAT_FORMATS[arch.chat]
    config = {**arch.config, "torch_dtype": _dtype_name(dtype)}
    if layers is not None:
        config["num_hidden_layers"] = layers
        if "max_window_layers" in config:
            config["max_window_layers"] = layers
    ids = chat.ids()
    eos = ids["eos_token_id"]
    assert isinstance(eos, list)
    config.update(bos_token_id=ids["bos_token_id"], eos_token_id=eos[0])
    if chat.size > config["vocab_size"]:  # a table entry that could not hold its own tokenizer
        raise SynthError(f"{name}: vocabulary {config['vocab_size']} is smaller than the tokenizer "
                         f"({chat.size})")
    return config


def _dtype_name(dtype: str) -> str:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise SynthError(f"--dtype {dtype!r}: expected bf16, fp16 or fp32") from None


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    init: str  # "normal", "ones" or "zeros"

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


def tensor_plan(config: dict[str, Any]) -> list[TensorPlan]:
    """Every weight the engine loads for `config`, in checkpoint order, with how it is initialized.

    Taken from the engine's own model built on the meta device (no memory), so names and shapes are
    exactly what `load_target_model` expects.
    """
    import torch

    from adaflash.models.layers import DecoderConfig
    from adaflash.models.target import TargetModel

    cfg = DecoderConfig.from_hf(config)
    with torch.device("meta"):
        model = TargetModel(cfg)
    plan = []
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        init = "ones" if name.endswith("norm.weight") else "zeros" if name.endswith(".bias") else "normal"
        plan.append(TensorPlan(name, tuple(tensor.shape), init))
    return plan


def shard_plan(plan: list[TensorPlan], bytes_per_value: int, max_bytes: int) -> list[list[TensorPlan]]:
    """Tensors cut into shards in order, each at most `max_bytes` (a larger tensor gets a shard alone)."""
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for tensor in plan:
        nbytes = tensor.numel * bytes_per_value
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += nbytes
    return shards


def tensor_seed(seed: int, name: str) -> int:
    """Each tensor's own seed: its values depend on the seed and its name only, not on the order or
    the layer count, so `--layers 4` writes the first four layers of the full model (on the same device)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def make_tensor(tensor: TensorPlan, seed: int, *, dtype: Any, device: Any, std: float = INIT_STD) -> Any:
    import torch

    if tensor.init == "ones":
        return torch.ones(tensor.shape, dtype=dtype, device=device)
    if tensor.init == "zeros":
        return torch.zeros(tensor.shape, dtype=dtype, device=device)
    generator = torch.Generator(device=device).manual_seed(tensor_seed(seed, tensor.name))
    return torch.empty(tensor.shape, dtype=dtype, device=device).normal_(0.0, std, generator=generator)


def pick_generation_device(device: str | None) -> str:
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SynthError(f"--device {device}: no CUDA device here; use --device cpu")
    return device


Progress = Callable[[int, int], None]  # (bytes drawn so far, bytes in all)


def write_weights(folder: Path, config: dict[str, Any], *, seed: int, dtype: str, device: str,
                  max_shard_bytes: int = MAX_SHARD_BYTES, progress: Progress | None = None) -> list[str]:
    """The weights of `config` as safetensors shards (with model.safetensors.index.json when there are
    several). At most two shards are in host memory: one written to disk while the next is drawn."""
    import torch
    from safetensors.torch import save_file

    torch_dtype = getattr(torch, _dtype_name(dtype))
    width = torch.empty((), dtype=torch_dtype).element_size()
    shards = shard_plan(tensor_plan(config), width, max_shard_bytes)
    total = sum(t.numel for shard in shards for t in shard) * width
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    done = 0
    with ThreadPoolExecutor(1) as writer:
        pending: Future | None = None
        for shard, file in zip(shards, names):
            tensors = {}
            for tensor in shard:
                tensors[tensor.name] = make_tensor(tensor, seed, dtype=torch_dtype, device=device).cpu()
                done += tensor.numel * width
                if progress:
                    progress(done, total)
            if pending is not None:
                pending.result()
            pending = writer.submit(save_file, tensors, str(folder / file), {"format": "pt"})
        if pending is not None:
            pending.result()
    if len(shards) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {t.name: file for shard, file in zip(shards, names) for t in shard}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        names.append("model.safetensors.index.json")
    return names


def _generation_config(chat: ChatFormat) -> dict[str, Any]:
    ids = chat.ids()
    return {"bos_token_id": ids["bos_token_id"], "eos_token_id": ids["eos_token_id"],
            "pad_token_id": ids["pad_token_id"], "do_sample": False}


@dataclass
class SynthResult:
    out: Path
    architecture: str
    seed: int
    layers: int
    dtype: str
    device: str
    parameters: int
    bytes: int
    files: list[str]
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "out": str(self.out)}


def check_out(out: Path, force: bool) -> None:
    """Refuse a --out that holds anything but an earlier synthetic model (which --force replaces)."""
    if out.exists() and not out.is_dir():
        raise SynthError(f"--out {out}: a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise SynthError(f"--out {out}: the folder holds files that are not a synthetic model; "
                             "choose a new or empty folder")
        if not force:
            raise SynthError(f"--out {out}: a synthetic model is already there; add --force to replace it")


def write_synth(name: str, out: str | Path, *, seed: int = 0, layers: int | None = None, dtype: str = "bf16",
                device: str | None = "auto", force: bool = False, max_shard_bytes: int = MAX_SHARD_BYTES,
                progress: Progress | None = None) -> SynthResult:
    """Write the model folder of architecture `name` to `out`: config.json, generation_config.json, the
    tokenizer, the weights and `adaflash-synth.json`, built in a temporary sibling and renamed into place."""
    started = time.perf_counter()
    out = Path(out).expanduser()
    arch = arch_of(name)
    config = synth_config(name, layers=layers, dtype=dtype)
    if max_shard_bytes < 1:
        raise SynthError(f"--max-shard-gb must be positive, got {max_shard_bytes / 1e9:g}")
    check_out(out, force)
    chosen = pick_generation_device(device)
    chat = CHAT_FORMATS[arch.chat]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(_generation_config(chat), indent=2) + "\n")
        files = ["config.json", "generation_config.json"]
        files += write_tokenizer(tmp, chat, max_length=config["max_position_embeddings"])
        files += write_weights(tmp, config, seed=seed, dtype=dtype, device=chosen,
                               max_shard_bytes=max_shard_bytes, progress=progress)
        plan = tensor_plan(config)
        parameters = sum(t.numel for t in plan)
        width = {"bfloat16": 2, "float16": 2, "float32": 4}[config["torch_dtype"]]
        result = SynthResult(out=out, architecture=name, seed=seed, layers=config["num_hidden_layers"],
                             dtype=config["torch_dtype"], device=chosen, parameters=parameters,
                             bytes=parameters * width, files=[*files, MARKER], seconds=0.0)
        (tmp / MARKER).write_text(json.dumps({**result.as_json(), "out": None, "seconds": None,
                                              "note": "random weights: speed and memory are real, τ is not"},
                                             indent=2) + "\n")
        give_usual_modes(tmp)
        if out.exists():
            shutil.rmtree(out)  # empty, or an earlier synthetic model with --force (check_out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    result.seconds = time.perf_counter() - started
    return result


def describe_archs() -> Iterator[dict[str, Any]]:
    """One row per architecture, for `adaflash models list`."""
    for arch in ARCHS.values():
        config = arch.config
        yield {"name": arch.name, "model_type": config["model_type"], "layers": config["num_hidden_layers"],
               "hidden": config["hidden_size"], "vocab": config["vocab_size"],
               "description": arch.description}
