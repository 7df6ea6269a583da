"""The on-policy training presets, shared by `adaflash pipeline` and `serve --adapt` (torch-free: the CLI
lists them without loading torch)."""

from __future__ import annotations

PRESETS: dict[str, dict[str, str | bool]] = {
    "adaflash": {"loss": "rkl-mix", "length_head": True},  # mixture reverse KL + the length head
    "osd": {"loss": "fkl", "length_head": False},  # forward KL, no head
}
