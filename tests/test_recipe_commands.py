"""Every job of every shipped recipe names a command and options the CLI has today: a renamed option
fails here, not an hour into `make run` or a GPU recipe."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from adaflash.cli.main import cli
from jobs.recipe import parse_recipe

RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs" / "recipes").glob("*.toml"))


def _parse(argv: list[str]) -> None:
    """Resolve the subcommands of `adaflash ARGV` and parse its options (no callback runs)."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="adaflash")
    args = list(argv)
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        found = command.get_command(ctx, args[0])
        assert found is not None, f"no command {args[0]!r} in `adaflash {' '.join(argv)}`"
        ctx = click.Context(found, info_name=args[0], parent=ctx)
        command, args = found, args[1:]
    command.make_context(command.name or "", args, parent=ctx.parent, resilient_parsing=False).close()


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_job_parses_with_the_cli(path: Path, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # option callbacks that look at paths see an empty folder
    recipe = parse_recipe(path.read_text(encoding="utf-8"), str(path))
    checked = 0
    for name, job in recipe.jobs.items():
        if job.command[0] != "adaflash":
            continue
        try:
            _parse(job.command[1:])
        except click.UsageError as err:  # BadParameter, NoSuchOption, MissingParameter
            if isinstance(err, click.BadParameter) and any(m in str(err) for m in ("does not exist", "no such file", "no such drafter")):
                continue  # an input a previous job writes (the option names were parsed before its check)
            raise AssertionError(f"{path.name} job {name}: `{' '.join(job.command)}`: {err}") from None
        checked += 1
    assert checked, f"{path.name}: no adaflash job checked"
