"""One click option per user-settable `EngineConfig` field, made from the field's rule (flag, help, range), so
`serve`, `generate`, `eval`, `bench engine` and `pipeline` cannot drift apart. The command receives them as
one `engine_cfg` (an EngineConfig; its `max_batch` is the default until the command sets its own)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from adaflash.cli.common import fail
from adaflash.engine.config import EngineConfig, Rule, engine_rules


def engine_options(*, skip: tuple[str, ...] = (), notes: dict[str, str] | None = None) -> Callable:
    """Decorate a command with the engine options, less the fields in `skip`; `notes` adds a command's own
    words to a field's help (e.g. what the option does on SGLang)."""
    chosen = {name: rule for name, rule in engine_rules().items() if rule.flag and name not in skip}
    defaults = EngineConfig()

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            settings = {name: kwargs.pop(name) for name in chosen}
            try:
                engine_cfg = EngineConfig(**settings)
            except ValueError as err:
                fail(str(err))
            return func(*args, engine_cfg=engine_cfg, **kwargs)

        for name, rule in reversed(chosen.items()):
            command = _option(name, rule, getattr(defaults, name), (notes or {}).get(name, ""))(command)
        return command

    return decorate


def _option(name: str, rule: Rule, default: Any, note: str) -> Callable:
    help_text = rule.help + (f" {note}" if note else "")
    if rule.kind is bool:
        return click.option(rule.flag, name, default=default, help=help_text)
    if rule.choices:
        kind: click.ParamType = click.Choice(rule.choices)
    elif rule.low is None:
        kind = click.INT if rule.kind is int else click.FLOAT
    elif rule.kind is int:
        kind = click.IntRange(int(rule.low), min_open=rule.low_open)
    else:
        kind = click.FloatRange(rule.low, min_open=rule.low_open)
    return click.option(rule.flag, name, type=kind, default=default, show_default=default is not None,
                        help=help_text)
