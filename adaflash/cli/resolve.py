"""What commands resolve from their groups before any work: the one method and drafter, prompt files,
drafter folders, output files; each a clean CLI error (exit 2) naming the flag."""

from __future__ import annotations

from pathlib import Path

import click

from adaflash.cli.common import chosen_drafter, drafter_folder, fail, workspace_of, writable_file
from adaflash.cli.groups import setting_error
from adaflash.methods import VANILLA
from adaflash.options import BenchConfig, ModelConfig
from adaflash.settings import SettingError


def one_model(model: ModelConfig, *, builtin: bool = True) -> tuple[str, str | None]:
    """The method and drafter of a command that runs one (a built-in target's own drafter when none is
    given and `builtin`)."""
    try:
        method, draft = model.one()
        method = method or VANILLA
        return method, chosen_drafter(method, draft, model.target or "") if builtin else draft
    except SettingError as err:
        fail(setting_error(err))
    except ValueError as err:
        fail(str(err))


def draft_map(model: ModelConfig) -> dict[str, str]:
    """METHOD=DIR per --draft, or a clean error."""
    try:
        return model.draft_map()
    except SettingError as err:
        fail(setting_error(err))


def warmup_count(bench: BenchConfig) -> int:
    """--warmup as a count of requests or passes (bench engine takes its words instead)."""
    try:
        return bench.warmup_count
    except SettingError as err:
        fail(setting_error(err))


def prompts_path(ctx: click.Context, value: str | None, split: str, flag: str) -> str | None:
    """A JSONL file, or a prepared dataset's name read as its `split` split; checked now."""
    from adaflash.data.prompts import PromptFileError, prompt_source

    if value is None:
        return None
    try:
        path = prompt_source(value, workspace_of(ctx), split)
    except PromptFileError as err:
        raise click.BadParameter(str(err), ctx=ctx, param_hint=f"'{flag}'") from None
    if not path.is_file():
        raise click.BadParameter(f"{value}: no such file", ctx=ctx, param_hint=f"'{flag}'")
    return str(path)


def required(value: object, flag: str, what: str = "") -> None:
    """A group field a command cannot do without."""
    if value in (None, (), ""):
        fail(f"{flag} is required{': ' + what if what else ''}")


def out_file(ctx: click.Context, value: str | None, flag: str = "--out") -> str:
    """An --out file that can be written, checked before the work that fills it."""
    required(value, flag)
    try:
        return str(writable_file(ctx, None, value))
    except click.BadParameter as err:
        raise click.BadParameter(err.message, ctx=ctx, param_hint=f"'{flag}'") from None


def folder_of_drafter(flag: str, value: str | None) -> str | None:
    """A drafter folder or built-in name -> its folder, checked before any model loads."""
    return drafter_folder(flag, value)


def same_file(dataset_file: str, out: str) -> None:
    """Writing over the input would lose its rows (and a second run would vary the copies again)."""
    if Path(dataset_file).expanduser().resolve() == Path(out).expanduser().resolve():
        fail(f"--out {out} is the --dataset file itself: write the result to another file")
