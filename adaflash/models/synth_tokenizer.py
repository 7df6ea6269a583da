"""A byte-level tokenizer for synthetic targets, built here rather than downloaded or copied.

Why bytes: a synthetic target's weights are random, so its tokenizer only has to turn any text into ids
the embedding holds, carry a chat template and an end-of-turn token, and load offline through
transformers' AutoTokenizer. Each byte is one token (ids 0-255), the chat format's special tokens follow
(256 on); every id is far below an 8B model's vocabulary. Ids past the tokenizer, which a random model
emits most of the time, decode to nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BYTE_TOKENS = 256

_CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class ChatFormat:
    """The special tokens and chat template of one model family, in its own spelling."""

    name: str
    specials: tuple[str, ...]
    eos: str  # ends an assistant turn: the engine stops a row on it
    pad: str
    template: str
    bos: str | None = None
    extra_eos: tuple[str, ...] = ()  # further stop tokens (generation_config.json)

    def token_id(self, token: str) -> int:
        return BYTE_TOKENS + self.specials.index(token)

    @property
    def size(self) -> int:
        return BYTE_TOKENS + len(self.specials)

    def ids(self) -> dict[str, int | list[int] | None]:
        """Token ids as config.json and generation_config.json name them."""
        return {"bos_token_id": self.token_id(self.bos) if self.bos else None,
                "eos_token_id": [self.token_id(t) for t in (self.eos, *self.extra_eos)],
                "pad_token_id": self.token_id(self.pad)}


CHAT_FORMATS: dict[str, ChatFormat] = {
    "chatml": ChatFormat("chatml", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>",
                         pad="<|endoftext|>", template=_CHATML_TEMPLATE, extra_eos=("<|endoftext|>",)),
    "llama3": ChatFormat("llama3", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                    "<|end_header_id|>", "<|eot_id|>"),
                         eos="<|eot_id|>", pad="<|end_of_text|>", template=_LLAMA3_TEMPLATE,
                         bos="<|begin_of_text|>", extra_eos=("<|end_of_text|>",)),
}


def byte_symbols() -> list[str]:
    """The printable character that stands for each byte in a byte-level vocabulary (the convention
    the `tokenizers` ByteLevel pre-tokenizer and decoder use): printable Latin-1 bytes stand for
    themselves, every other byte for a character from 256 on, in byte order."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = [], 0
    for byte in range(BYTE_TOKENS):
        if byte in keep:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(BYTE_TOKENS + extra))
            extra += 1
    return symbols


def build_tokenizer(chat: ChatFormat):
    """A `tokenizers.Tokenizer`: one token per byte (id = byte value), then the format's special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in chat.specials])
    return tokenizer


def write_tokenizer(folder: Path, chat: ChatFormat, *, max_length: int) -> list[str]:
    """tokenizer.json, tokenizer_config.json (with the chat template) and special_tokens_map.json into
    `folder`; returns the file names."""
    build_tokenizer(chat).save(str(folder / "tokenizer.json"))
    named = {"eos_token": chat.eos, "pad_token": chat.pad, "bos_token": chat.bos}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **named, "unk_token": None,
              "chat_template": chat.template, "model_max_length": max_length,
              "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    specials = {key: value for key, value in named.items() if value is not None}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
