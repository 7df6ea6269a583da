"""Generate docs/cli.md from the click commands themselves, so the reference cannot drift from `--help`.

The page keeps two hand-written parts: the introduction above `MARK` and, in each command's section, the
notes after `END` (tables, prose that is too long for `--help`). Everything else (the command table, the
engine options, each command's usage, help and options) is rebuilt from click. The shared engine options
are shown once, in their own section, instead of once per command.

    python -m adaflash.cli.docgen            # rewrite docs/cli.md
    python -m adaflash.cli.docgen --check    # exit 1 if docs/cli.md is stale (tests/test_docs.py runs it)
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from adaflash.cli.main import COMMANDS, cli
from adaflash.engine.config import engine_rules

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
MARK = "<!-- Generated below by `python -m adaflash.cli.docgen` from the commands' help: edit that, not this. -->"
END = "<!-- end of generated help; notes below are hand-written and kept -->"
SECTION = re.compile(r"^### `adaflash ([^`]+)`\n", re.M)
ENGINE_ANCHOR = "#engine-options"
# The order of the page: the life of a drafter, then the control plane.
ORDER = ("models", "data", "draft", "train", "generate", "eval", "serve", "bench", "pipeline", "run", "runs", "gpus")

Commands = list[tuple[tuple[str, ...], click.Command, click.Context]]


def walk(command: click.Command, ctx: click.Context, path: tuple[str, ...] = ()) -> Iterator:
    """Every visible command below `command`, depth first in `list_commands` order, with its context."""
    if path:
        yield path, command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx), (*path, name))


def _rank(name: str) -> int:
    return ORDER.index(name) if name in ORDER else len(ORDER)


def _anchor(path: tuple[str, ...]) -> str:
    return "#adaflash-" + "-".join(path)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help_text(command: click.Command) -> str:
    """The command's docstring as click shows it: cut at \\f, \\b markers dropped, paragraphs kept."""
    text = inspect.cleandoc(command.help or command.short_help or "").split("\f", 1)[0]
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(p.replace("\b\n", "").strip() for p in paragraphs)


def _engine_shared(param: click.Parameter) -> bool:
    """An engine option with the common help: documented once under Engine options."""
    rule = engine_rules().get(param.name or "")
    return bool(rule and rule.flag and isinstance(param, click.Option) and param.help == rule.help)


def _options(command: click.Command, ctx: click.Context) -> tuple[list[tuple[str, str]], list[str]]:
    """(rows of the command's own options, flags of the shared engine options it takes)."""
    rows, engine = [], []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden or param is command.get_help_option(ctx):
            continue
        if _engine_shared(param):
            engine.append(param.opts[0])
            continue
        record = param.get_help_record(ctx)
        if record:
            rows.append(record)
    return rows, engine


def _section(path: tuple[str, ...], command: click.Command, ctx: click.Context) -> str:
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    lines = [f"### `adaflash {' '.join(path)}`", "", f"`{usage}`", ""]
    if help_text := _help_text(command):
        lines += [help_text, ""]
    rows, engine = _options(command, ctx)
    if rows:
        lines += ["| option | what it does |", "|---|---|"]
        lines += [f"| `{_cell(opts)}` | {_cell(help_)} |" for opts, help_ in rows]
        lines.append("")
    if engine:
        flags = ", ".join(f"`{flag}`" for flag in engine)
        lines += [f"[Engine options]({ENGINE_ANCHOR}): {flags}.", ""]
    return "\n".join(lines) + END + "\n"


def _engine_section(commands: Commands) -> str:
    """The shared engine options once, with the help of the first command that takes each."""
    rows: dict[str, tuple[str, str]] = {}
    takers: list[str] = []
    for path, command, ctx in commands:
        shared = [p for p in command.get_params(ctx) if _engine_shared(p)]
        if shared:
            takers.append(f"[`{' '.join(path)}`]({_anchor(path)})")
        for param in shared:
            record = param.get_help_record(ctx)
            if record:
                rows.setdefault(param.name or "", record)
    lines = ["## Engine options", "",
             f"Taken by {', '.join(takers)} (each lists those it takes); a command's own wording of one, where it "
             "has one, is in its table.", "", "| option | what it does |", "|---|---|"]
    lines += [f"| `{_cell(opts)}` | {_cell(help_)} |" for opts, help_ in rows.values()]
    return "\n".join(lines) + "\n"


def _command_table(commands: Commands) -> str:
    lines = ["## Commands", "", "| command | what it does |", "|---|---|"]
    for name in sorted(COMMANDS, key=_rank):
        subs = [path for path, _, _ in commands if len(path) == 2 and path[0] == name]
        links = " · ".join([f"[`adaflash {name}`]({_anchor((name,))})",
                            *(f"[`{path[1]}`]({_anchor(path)})" for path in subs)])
        lines.append(f"| {links} | {_cell(COMMANDS[name][2])} |")
    return "\n".join(lines) + "\n"


def notes_of(text: str) -> dict[tuple[str, ...], str]:
    """The hand-written notes after each section's END marker, by command path."""
    parts = SECTION.split(text)
    notes = {}
    for i in range(1, len(parts), 2):
        body = parts[i + 1]
        notes[tuple(parts[i].split())] = body.split(END + "\n", 1)[1] if END in body else ""
    return notes


def render(current: str) -> str:
    """The whole page: `current`'s introduction and notes, everything else from click."""
    if MARK not in current:
        raise SystemExit(f"{DOC}: no line {MARK!r} ends the hand-written introduction")
    intro = current.split(MARK, 1)[0]
    notes = notes_of(current.split(MARK, 1)[1])
    commands: Commands = list(walk(cli, click.Context(cli, info_name="adaflash", **cli.context_settings)))
    orphans = sorted(set(notes) - {path for path, _, _ in commands})
    if any(notes[path].strip() for path in orphans):
        raise SystemExit(f"{DOC}: notes for commands that no longer exist: {orphans}")
    sections = [_section(path, command, ctx) + notes.get(path, "\n").rstrip("\n") + "\n"
                for path, command, ctx in sorted(commands, key=lambda c: _rank(c[0][0]))]
    body = [_command_table(commands), _engine_section(commands), *sections]
    return intro + MARK + "\n\n" + "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    current = DOC.read_text(encoding="utf-8")
    fresh = render(current)
    if "--check" in args:
        if fresh != current:
            print(f"{DOC} is stale: run `python -m adaflash.cli.docgen` (or `make docs`)", file=sys.stderr)
            return 1
        return 0
    if fresh != current:
        DOC.write_text(fresh, encoding="utf-8")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
