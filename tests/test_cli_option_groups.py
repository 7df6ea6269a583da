"""Commands are built from typed option groups: every flag has one declaration (a group's rule, or one
literal `click.option`), one meaning and one default; command bodies parse and delegate (<= 40 lines)."""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from adaflash.cli.groups import all_groups, setting_error
from adaflash.cli.main import COMMANDS, cli
from adaflash.settings import SettingError, rules_of

CLI = Path(__file__).resolve().parents[1] / "adaflash" / "cli"
MAX_COMMAND_LINES = 40


def _click_decorated(node: ast.FunctionDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        text = ast.unparse(target)
        if text.endswith((".command", ".group")) or text in ("command", "group"):
            return True
    return False


def _commands() -> list[tuple[str, int]]:
    found = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _click_decorated(node):
                found.append((f"{path.name}:{node.name}", node.end_lineno - node.lineno + 1))
    return found


def _literal_flags(paths: list[Path] | None = None) -> Counter[str]:
    flags: Counter[str] = Counter()
    for path in paths or sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "click.option" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                for flag in node.args[0].value.split("/"):
                    flags[flag] += 1
    return flags


def test_no_command_function_is_longer_than_40_lines():
    commands = _commands()
    assert len(commands) > 30  # the walk finds the commands
    too_long = {name: lines for name, lines in commands if lines > MAX_COMMAND_LINES}
    assert not too_long, f"command functions over {MAX_COMMAND_LINES} lines (move the work into helpers): {too_long}"


def test_no_flag_is_declared_by_hand_in_more_than_one_place():
    repeated = {flag: n for flag, n in _literal_flags().items() if n > 1}
    assert not repeated, f"flags declared by more than one click.option literal (use an option group): {repeated}"


def test_commands_take_their_options_from_groups_only():
    """The one literal click.option left is the output group's --format (its shortcuts are made from it)."""
    hand_made = {path.name: flags for path in sorted(CLI.glob("*.py"))
                 if (flags := _literal_flags([path]))}
    assert hand_made == {"groups.py": Counter({"--format": 1})}


def test_each_group_flag_has_one_declaring_rule_and_no_literal_restates_it():
    owners: dict[str, list[str]] = {}
    seen_rules: dict[int, str] = {}
    for group in all_groups():
        for name, rule in rules_of(group).items():
            if not rule.flag or id(rule) in seen_rules:  # a shared rule object (--swap-dir) is one declaration
                continue
            seen_rules[id(rule)] = f"{group.__name__}.{name}"
            for flag in rule.flag.split("/"):
                owners.setdefault(flag, []).append(f"{group.__name__}.{name}")
    shared = {flag: who for flag, who in owners.items() if len(who) > 1}
    assert not shared, f"flags declared by several group fields: {shared}"
    restated = sorted(set(owners) & set(_literal_flags()))
    assert not restated, f"group flags also declared by hand: {restated}"


def test_a_command_cannot_take_two_fields_of_one_name_or_flag():
    from adaflash.cli.groups import uses
    from adaflash.options import PipelineOptions
    from adaflash.serve.adapt_config import AdaptConfig

    with pytest.raises(TypeError, match="swap_dir|--swap-dir"):
        uses(PipelineOptions, AdaptConfig, command="nowhere")


def _walk(command: click.Command, path: tuple[str, ...] = ()):
    yield path, command
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            yield from _walk(command.get_command(click.Context(command), name), (*path, name))


def test_a_flag_means_one_thing_on_every_command():
    """Same flag, same type everywhere, and no command offers one flag twice."""
    seen: dict[str, tuple[str, tuple[str, ...]]] = {}
    for path, command in _walk(cli):
        flags = [opt for param in command.params if isinstance(param, click.Option)
                 for opt in (*param.opts, *param.secondary_opts)]
        assert len(flags) == len(set(flags)), (path, Counter(flags).most_common(3))
        for param in command.params:
            if isinstance(param, click.Option) and not (param.hidden or param.is_eager):  # --help, --version
                kind = type(param.type).__name__ + ("*" if param.multiple else "")
                first = seen.setdefault(param.opts[0], (kind, path))
                assert first[0] == kind, (param.opts[0], first, (kind, path))
    assert len(COMMANDS) == len(cli.list_commands(click.Context(cli)))


def test_every_group_serializes_for_the_run_log():
    import json

    from adaflash.serve.adapt_config import AdaptConfig

    for group in all_groups():
        fields = dataclasses.fields(group)
        assert all(f.default is not dataclasses.MISSING for f in fields), group  # every option has a default
        record = group().to_json()
        assert json.dumps(record), group
        assert {f.name for f in fields if "rule" in f.metadata} <= set(record) | ({"train_devices"} if group is AdaptConfig else set())


def test_a_group_error_names_the_flag_the_user_typed():
    from adaflash.serve.adapt_config import AdaptConfig

    with pytest.raises(SettingError) as err:
        AdaptConfig(enabled=False, swap_dir="s")
    assert str(err.value) == "adapt setting swap_dir applies to enabled"  # the library names fields
    assert setting_error(err.value) == "--swap-dir applies to --adapt"  # the CLI names flags


def test_per_command_defaults_are_stated_in_the_help():
    result = CliRunner().invoke(cli, ["generate", "--help"], terminal_width=200)
    assert "[generate's own default; elsewhere 256]" in result.output
    result = CliRunner().invoke(cli, ["eval", "--help"], terminal_width=200)
    assert "[eval's own default; elsewhere 16]" in result.output


def test_renamed_flags_keep_their_old_spelling(tmp_path):
    """--max-len (data regenerate, train), --max-batch (serve) and --steps (chain drafters) still work."""
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path), "serve", "--dry-run", "--max-batch", "5",
                                      "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert '"max_batch": 5' in result.output and '"num_steps": 3' in result.output
    result = CliRunner().invoke(cli, ["data", "regenerate", "--help"])
    assert "--max-len" not in result.output and "--context-length" in result.output


def test_pipeline_offers_no_chain_steps_it_would_refuse():
    result = CliRunner().invoke(cli, ["pipeline", "--help"], terminal_width=200)
    assert "--chain-steps" not in result.output and "--steps" not in result.output
