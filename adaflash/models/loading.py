"""Load a target (model + tokenizer) and turn prompts into the exact ids the engine sees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adaflash.models.cpu_flags import NATIVE_BF16_FLAGS, cpu_flags
from adaflash.models.registry import resolve_target
from adaflash.models.target import TargetModel, load_target_model

Conversation = list[dict[str, str]]


def pick_device(device: str | None = None) -> str:
    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(device: str, dtype: str | None = None) -> torch.dtype:
    """`auto`: bf16 on a GPU, float32 elsewhere. `bf16-if-native`: bf16 also on a CPU that multiplies it
    in hardware, where speculative decoding runs fastest and losslessly by construction (docs/engine.md);
    on other CPUs bf16 is emulated, slower than float32."""
    if dtype == "bf16-if-native":
        return torch.bfloat16 if device.startswith("cuda") or cpu_has_native_bf16() else torch.float32
    if dtype and dtype != "auto":
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
        except KeyError:
            raise ValueError(f"dtype {dtype!r}: expected float32, bfloat16, float16, auto or bf16-if-native") from None
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU's flags (`cpuinfo`, or this machine's) name a bf16 unit; False where they cannot be read."""
    return bool(cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS)


def local_folder(spec: str) -> Path:
    """A resolved target spec as a local folder; hub ids go through the HF cache (offline-aware)."""
    resolved = resolve_target(spec)
    path = Path(resolved)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(resolved, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]))


@dataclass
class Target:
    """The target model with its tokenizer; the one object every method and worker shares. A trainer, which
    mostly sees token ids, loads it with `with_tokenizer=False`: the tokenizer (and transformers' import,
    a second of a worker's start) then comes on first use, if ever."""

    name: str
    folder: Path
    model: TargetModel
    tokenizer: Any
    eos_ids: list[int]

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def max_context(self) -> int:
        return int(self.model.cfg.max_position_embeddings)

    def ensure_tokenizer(self) -> Any:
        """The tokenizer, loaded now if the target came without it (and with it the tokenizer's eos ids)."""
        if self.tokenizer is None:
            self.tokenizer = _load_tokenizer(self.folder)
            self.eos_ids = _eos_ids(self.tokenizer, self.folder)
        return self.tokenizer

    def render(self, prompt: str | Conversation, *, chat: bool = True) -> str:
        """The exact prompt string the engine feeds (chat template applied when asked)."""
        if isinstance(prompt, str):
            if not chat:
                return prompt
            prompt = [{"role": "user", "content": prompt}]
        if chat and getattr(self.ensure_tokenizer(), "chat_template", None):
            return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return "\n".join(m["content"] for m in prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.ensure_tokenizer()(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens left out. A fast tokenizer that cleans up no spaces decodes
        through its Rust backend directly: the same text (transformers' decode adds only that clean-up
        and argument checks), without ~2 µs of Python a call, which a server streaming 64 answers pays
        twice a token (`detokenize.TextSoFar`), beside the engine, on one interpreter lock."""
        tokenizer = self.ensure_tokenizer()
        if type(ids) is list and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
            backend = getattr(tokenizer, "backend_tokenizer", None)
            if backend is not None:
                return backend.decode(ids, skip_special_tokens=True)
        return tokenizer.decode(ids, skip_special_tokens=True)


def load_target(spec: str, *, device: str | None = None, dtype: str | None = None,
                with_tokenizer: bool = True) -> Target:
    folder = local_folder(spec)
    dev = pick_device(device)
    model = load_target_model(folder, device=dev, dtype=pick_dtype(dev, dtype))
    target = Target(name=spec, folder=folder, model=model, tokenizer=None, eos_ids=[])
    if with_tokenizer:
        target.ensure_tokenizer()
    return target


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _eos_ids(tokenizer: Any, folder: Path) -> list[int]:
    eos: list[int] = []
    for source in (tokenizer.eos_token_id, _generation_eos(folder)):
        for value in source if isinstance(source, list) else [source]:
            if value is not None and value not in eos:
                eos.append(int(value))
    return eos


def _generation_eos(folder: Path) -> list[int]:
    import json

    path = folder / "generation_config.json"
    if not path.is_file():
        return []
    value = json.loads(path.read_text()).get("eos_token_id")
    if value is None:
        return []
    return value if isinstance(value, list) else [value]
