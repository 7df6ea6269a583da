"""Commands built from typed option groups: `@uses(ModelConfig, SamplingConfig, ..., command="generate")`.

Every click option of a group is made here from its field's `Rule` (flag, help, type, range, default), so a
flag has one declaration across all commands; the command receives one validated object per group (named by
the group's `GROUP`: `model`, `sampling`, `engine`, ...) instead of a keyword per option. A rule's
`per_command` default is looked up by the `command` path given here, and stated in the help. Each group's
values are kept on the click context, and `recorded_run` writes them into the run's record.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click
from click.core import ParameterSource

from adaflash.settings import Rule, SettingError, Settings, rules_of

GROUPS_KEY = "adaflash.groups"  # ctx.meta: {group: its values as JSON}, for the run log
GIVEN_KEY = "adaflash.given"  # ctx.meta: the fields set on the command line or from the environment


@dataclass(frozen=True)
class Use:
    """A group as one command takes it: some of its options (`only`, `skip`), with the command's own words
    added to a field's help (`notes`, e.g. what it does on SGLang)."""

    group: type
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    notes: tuple[tuple[str, str], ...] = ()

    def fields(self) -> dict[str, Rule]:
        rules = {name: rule for name, rule in rules_of(self.group).items() if rule.flag}
        if self.only:
            missing = [name for name in self.only if name not in rules]
            if missing:
                raise TypeError(f"{self.group.__name__} has no option field(s) {missing}")
            return {name: rules[name] for name in self.only}
        return {name: rule for name, rule in rules.items() if name not in self.skip}


@dataclass(frozen=True)
class Output:
    """The output format group: `--format` with a shortcut flag per format (`--json`); the first format is
    the default."""

    formats: tuple[str, ...] = ("table", "json")
    help: str = "Output format."
    GROUP = "output"


def use(group: type, *, only: Sequence[str] = (), skip: Sequence[str] = (),
        notes: dict[str, str] | None = None) -> Use:
    return Use(group, tuple(only), tuple(skip), tuple((notes or {}).items()))


def uses(*specs: type | Use | Output, command: str) -> Callable:
    """Decorate a click command function with the options of `specs` (groups); it is called with one
    keyword per group (`model=ModelConfig(...)`, `output="json"`, ...) and its other parameters."""
    chosen = [spec if isinstance(spec, (Use, Output)) else Use(spec) for spec in specs]
    claimed = _claim(chosen, command)

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            given = ctx.meta.setdefault(GIVEN_KEY, set())
            records = ctx.meta.setdefault(GROUPS_KEY, {})
            values: list[dict[str, Any]] = []  # every option taken out first: a group may share a field's name
            for spec in chosen:
                if isinstance(spec, Output):
                    values.append({"output": kwargs.pop("output_format")})
                    continue
                values.append({name: _merged(kwargs, name, rule, claimed) for name, rule in spec.fields().items()})
                given.update(name for name in spec.fields() if ctx.get_parameter_source(name)
                             in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT))
            for spec, taken in zip(chosen, values):
                if isinstance(spec, Output):
                    kwargs["output"] = taken["output"]
                    continue
                group = _build(spec, taken)
                records[spec.group.GROUP] = group.to_json()
                kwargs[spec.group.GROUP] = group
            return func(*args, **kwargs)

        command_fn = wrapper
        for spec in reversed(chosen):
            if isinstance(spec, Output):
                command_fn = _output_options(spec)(command_fn)
                continue
            defaults = {f.name: f.default for f in dataclasses.fields(spec.group)}
            notes = dict(spec.notes)
            for name, rule in reversed(spec.fields().items()):
                default = rule.default_for(command, defaults[name])
                note = " ".join(part for part in (notes.get(name, ""), rule.default_note(command, defaults[name]).strip())
                                if part)
                for option in reversed(_options(name, rule, default, note, claimed)):
                    command_fn = option(command_fn)
        return command_fn

    return decorate


def given(ctx: click.Context, name: str) -> bool:
    """Whether the option of field `name` was set on the command line (or from its environment variable)."""
    return name in ctx.meta.get(GIVEN_KEY, set())


def all_groups() -> list[type]:
    """Every option group, for error messages and the tests that keep one declaration per flag."""
    from adaflash import options
    from adaflash.engine.config import EngineConfig
    from adaflash.serve.adapt_config import AdaptConfig

    return [*(getattr(options, name) for name in options.__all__), EngineConfig, AdaptConfig]


def flag_named(name: str, group: str | None = None) -> str:
    """The flag of a field, found in its group first, then in any group; the name itself if none has it."""
    groups = sorted(all_groups(), key=lambda g: group != g.GROUP)
    for candidate in groups:
        rule = rules_of(candidate).get(name)
        if rule and rule.flag:
            return rule.flag.split("/")[0]
    return name


def setting_error(err: SettingError) -> str:
    """A group's error as the CLI says it: every field named by its flag."""
    return err.render(lambda name: flag_named(name, err.group))


def _build(spec: Use, values: dict[str, Any]) -> Settings:
    from adaflash.cli.common import fail

    try:
        return spec.group(**values)
    except SettingError as err:
        fail(setting_error(err))
    except ValueError as err:
        fail(str(err))


def _claim(chosen: list[Use | Output], command: str) -> dict[str, str]:
    """flag -> the field that owns it on this command: primary flags must differ; an alias another field's
    flag takes is left out here."""
    claimed: dict[str, str] = {}
    fields = [(name, rule) for spec in chosen if isinstance(spec, Use) for name, rule in spec.fields().items()]
    names = [name for name, _ in fields]
    if len(names) != len(set(names)):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise TypeError(f"{command}: two groups have a field named {', '.join(twice)}")
    for name, rule in fields:
        assert rule.flag
        for flag in rule.flag.split("/"):
            if flag in claimed:
                raise TypeError(f"{command}: {flag} is declared by {claimed[flag]} and {name}")
            claimed[flag] = name
    for name, rule in fields:
        for alias in rule.aliases:
            claimed.setdefault(alias, name)
    groups = [spec.GROUP if isinstance(spec, Output) else spec.group.GROUP for spec in chosen]
    if len(groups) != len(set(groups)):
        raise TypeError(f"{command}: a group is taken twice")
    return claimed


def _merged(kwargs: dict[str, Any], name: str, rule: Rule, claimed: dict[str, str]) -> Any:
    """The field's value: its option's, or an alias's where one was given."""
    value = kwargs.pop(name)
    for i, alias in enumerate(rule.aliases):
        if claimed.get(alias) != name:
            continue
        other = kwargs.pop(f"{name}__alias{i}")
        if other not in (None, ()):
            value = other
    return value


def _click_type(rule: Rule) -> click.ParamType:
    if rule.choices:
        return click.Choice(rule.choices)
    if rule.kind is int:
        if rule.low is None and rule.high is None:
            return click.INT
        return click.IntRange(None if rule.low is None else int(rule.low), None if rule.high is None else int(rule.high),
                              min_open=rule.low_open, max_open=rule.high_open)
    if rule.kind is float:
        if rule.low is None and rule.high is None:
            return click.FLOAT
        return click.FloatRange(rule.low, rule.high, min_open=rule.low_open, max_open=rule.high_open)
    return click.STRING


def _options(name: str, rule: Rule, default: Any, note: str, claimed: dict[str, str]) -> list[Callable]:
    assert rule.flag
    help_text = " ".join(part for part in (rule.help, note) if part)
    common: dict[str, Any] = {"help": help_text, "envvar": rule.envvar, "metavar": rule.metavar, "hidden": rule.hidden}
    if rule.kind is bool:
        flag_kw = {} if "/" in rule.flag else {"is_flag": True}
        options = [click.option(rule.flag, name, default=default, show_default=default is not None and "/" in rule.flag,
                                **flag_kw, **common)]
    else:
        options = [click.option(rule.flag, name, type=_click_type(rule), default=default, multiple=rule.multiple,
                                show_default=default not in (None, ()), **common)]
    for i, alias in enumerate(rule.aliases):
        if claimed.get(alias) == name:  # another field of this command may own the spelling
            options.append(click.option(alias, f"{name}__alias{i}", type=_click_type(rule), default=None,
                                        multiple=rule.multiple, hidden=True))
    return options


def _output_options(spec: Output) -> Callable:
    def decorate(func: Callable) -> Callable:
        func = click.option("--format", "output_format", type=click.Choice(list(spec.formats)),
                            default=spec.formats[0], show_default=True, help=spec.help)(func)
        for name in spec.formats:
            if name != "text":
                func = click.option(f"--{name}", "output_format", flag_value=name,
                                    help=f"Same as --format {name}.")(func)
        return func

    return decorate
