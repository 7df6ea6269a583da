"""The user docs stay short, true and free of a development diary.

README.md and docs/*.md are read by users: every relative link must lead to a file, every
`adaflash ...` command shown in a README code block must exist with the options it shows,
docs/cli.md must cover every command and show only options they have, and neither the pages nor the
recipe headers may narrate how the project got here (numbered sessions or rounds of work, labels of
past benchmark runs). How a figure was reached belongs in commit messages.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.toml"))
DRAFTER_CARDS = sorted((ROOT / "adaflash" / "drafters").glob("*/README.md"))
MAX_README_LINES = 250

# Pages other branches add; links to them are allowed while they are missing here.
WRITTEN_ELSEWHERE: set[str] = set()

DIARY = {
    "a numbered session": re.compile(r"\b[Ss]essions? \d+"),
    "a numbered round of work": re.compile(r"\b[Rr]ounds? \d+"),
    "a past run label": re.compile(r"\bs\d+[a-z]?-[a-z0-9-]+"),
    "a figure from an earlier run": re.compile(r"\b[Ee]arlier (?:this|it|run|runs|session|sessions) gave\b"),
    "a script outside the repository": re.compile(r"`\.dev`|\.dev/"),
    "a date in prose": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a run id": re.compile(r"\b20\d{6}-\d{6}-[a-z]"),
}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _diary_hits(path: Path) -> list[str]:
    hits = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for what, pattern in DIARY.items():
            if match := pattern.search(line):
                hits.append(f"{path.name}:{number}: {what}: {match.group(0)!r}")
    return hits


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; at most {MAX_README_LINES}"


@pytest.mark.parametrize("path", [README, *DOCS, *RECIPES, *DRAFTER_CARDS], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_development_diary(path: Path) -> None:
    assert _diary_hits(path) == []


def test_diary_patterns_catch_a_diary(tmp_path: Path) -> None:
    page = tmp_path / "diary.md"
    page.write_text("In session 22 (`s22-p-b32`), round 3 of work, earlier this gave 1.9x; see `.dev`.\n"
                    "Measured 2026-12-04 (run 20261204-050943-bench-matrix-878e).\n")
    assert len(_diary_hits(page)) == len(DIARY)


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(path: Path) -> None:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        relative = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved)
        if not resolved.exists() and relative not in WRITTEN_ELSEWHERE:
            broken.append(target)
    assert broken == [], f"{path.relative_to(ROOT)} links to missing files: {broken}"


def _readme_commands() -> list[list[str]]:
    """Each `adaflash ...` invocation in README's code blocks, as argv after `adaflash`."""
    commands = []
    for block in FENCE.findall(README.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0]
            for part in re.split(r"&&|\|\||[|;&]", line):
                words = shlex.split(part, posix=True) if "'" not in part else part.split()
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
                    words.pop(0)  # VAR=value before the command
                if words and (words[0] == "adaflash" or words[0].endswith("/adaflash")):
                    commands.append(words[1:])
    return commands


def _option_names(command: click.Command, ctx: click.Context) -> set[str]:
    return {name for param in command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)}


def _resolve(argv: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """(command path, the command, the options it was given), walking groups as click does."""
    path: list[str] = []
    command: click.Command = cli
    ctx = click.Context(cli, info_name="adaflash")
    given: list[str] = []
    words = list(argv)
    while words:
        word = words.pop(0)
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            given.append(name)
            option = next((p for p in command.get_params(ctx) if name in (*p.opts, *p.secondary_opts)), None)
            takes_value = isinstance(option, click.Option) and not option.is_flag and not option.count
            if takes_value and "=" not in word and words:
                words.pop(0)
            continue
        if isinstance(command, click.Group):
            sub = command.get_command(ctx, word)
            assert sub is not None, f"adaflash {' '.join(path)}: no command {word!r}"
            path.append(word)
            command = sub
            ctx = click.Context(sub, info_name=word, parent=ctx)
            given = []  # options before a subcommand belong to its group
            continue
        break  # an argument of a command
    return path, command, given


def test_readme_shows_commands() -> None:
    assert len(_readme_commands()) >= 10


@pytest.mark.parametrize("argv", _readme_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_readme_commands_exist(argv: list[str]) -> None:
    path, command, given = _resolve(argv)
    assert path, f"`adaflash {' '.join(argv)}` names no command"
    ctx = click.Context(command, info_name=path[-1])
    unknown = sorted(set(given) - _option_names(command, ctx))
    assert unknown == [], f"`adaflash {' '.join(path)}` has no option {unknown}"
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output


def _command_paths(command: click.Command, ctx: click.Context, path: tuple[str, ...] = ()) -> dict:
    found = {path: (command, ctx)} if path else {}
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            found.update(_command_paths(sub, click.Context(sub, info_name=name, parent=ctx), (*path, name)))
    return found


def _cli_md_sections() -> dict[tuple[str, ...], str]:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    parts = re.split(r"^### `adaflash ([^`]+)`\n", text, flags=re.M)
    return {tuple(parts[i].split()): parts[i + 1] for i in range(1, len(parts), 2)}


def test_cli_md_documents_every_command_and_only_real_options() -> None:
    commands = _command_paths(cli, click.Context(cli, info_name="adaflash"))
    sections = _cli_md_sections()
    assert sorted(sections) == sorted(commands), "docs/cli.md's sections differ from the commands"
    for path, body in sections.items():
        command, ctx = commands[path]
        shown = {name for row in re.findall(r"^\| `([^`]+)`", body, flags=re.M)
                 for name in re.findall(r"(?<![\w-])--?[a-z][a-z0-9-]*", row)}
        unknown = sorted(shown - _option_names(command, ctx) - {"-h"})
        assert unknown == [], f"docs/cli.md shows options `adaflash {' '.join(path)}` does not have: {unknown}"


def test_cli_md_is_generated_from_the_commands() -> None:
    """docs/cli.md's generated parts are what `python -m adaflash.cli.docgen` writes now."""
    from adaflash.cli import docgen

    current = docgen.DOC.read_text(encoding="utf-8")
    assert docgen.render(current) == current, "docs/cli.md is stale: run `make docs`"


def test_cli_md_keeps_notes_and_drops_gone_commands() -> None:
    from adaflash.cli import docgen

    current = docgen.DOC.read_text(encoding="utf-8")
    marked = current.replace(docgen.END + "\n", docgen.END + "\nA NOTE\n", 1)
    assert "A NOTE" in docgen.render(marked)
    orphan = current + "### `adaflash no-such-command`\n" + docgen.END + "\nwords\n"
    with pytest.raises(SystemExit, match="no longer exist"):
        docgen.render(orphan)


def test_readme_says_what_configs_holds() -> None:
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"configs/[^\n]*JSON", text), "configs/ holds recipes (TOML), no drafter JSON"
