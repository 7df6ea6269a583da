"""`adaflash bench shift`: replay a traffic shift against an adapting server, plot τ through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import fail, recorded_run, runlog_of, workspace_of
from adaflash.cli.groups import Output, use, uses
from adaflash.options import BenchConfig, InputConfig, ModelConfig, SamplingConfig, ServeConfig


def _phase(text: str) -> tuple[str, str, str | None]:
    """NAME=DATASET[:DOMAIN] -> (name, dataset, domain)."""
    name, sep, source = text.partition("=")
    if not sep or not name or not source:
        raise click.BadParameter(f"expected NAME=DATASET[:DOMAIN] (e.g. code=suite:code), got {text!r}",
                                 param_hint="'--phase'")
    dataset, _, domain = source.partition(":")
    return name, dataset, domain or None


@click.command("shift")
@uses(use(ServeConfig, only=("base_url", "api_key"), notes={"base_url": "Started with `adaflash serve --adapt` to "
                                                                        "see it learn."}),
      use(BenchConfig, only=("phases", "seconds", "concurrency", "holdout", "probe_every", "plot")), use(InputConfig, only=("num_prompts",)),
      use(SamplingConfig, only=("max_new_tokens", "chat")), use(ModelConfig, only=("target",)),
      Output(("text", "json"), help="text, or json: the summary."), command="bench shift")
@click.pass_context
def shift(ctx: click.Context, serve: ServeConfig, bench: BenchConfig, inputs: InputConfig, sampling: SamplingConfig,
          model: ModelConfig, output: str) -> None:
    """Replay traffic that shifts from one domain to another against one server and plot τ over time.

    Each phase runs its --seconds; its held-out prompts measure what the drafter learned of the domain,
    and their answers must stay identical across every drafter swap (exit 1 otherwise). The run log
    gets τ as it goes (the dashboard's Monitor charts it), the run folder the samples (shift.json)
    and the picture.
    """
    from adaflash.bench.shift import ShiftSettings
    from adaflash.cli.bench import _server_info, one_level

    phases, holdout, probe_every, plot_path = bench.phases, bench.holdout, bench.probe_every, bench.plot
    if not phases:
        fail("--phase NAME=DATASET[:DOMAIN] is required, once per phase")
    parsed = [_phase(p) for p in phases]
    seconds = _seconds(bench.seconds, len(parsed))
    if len({name for name, _, _ in parsed}) != len(parsed):
        fail("--phase names must differ")
    if plot_path and Path(plot_path).suffix.lower() not in (".svg", ".png"):
        fail(f"--plot {plot_path}: the picture is written as .svg or .png")
    info = _server_info(serve.url or "", serve.api_key)
    if not info.get("adapt"):
        click.secho("note: the server does not adapt (no `--adapt`): this measures a fixed drafter", fg="yellow", err=True)
    plan = _plan(ctx, parsed, seconds, inputs.num_prompts, holdout, sampling.chat, model.target or info.get("target"))
    settings = ShiftSettings(serve.url, concurrency=one_level(bench), max_new_tokens=sampling.max_new_tokens,
                             probe_every=probe_every, api_key=serve.api_key)
    config = {"base_url": serve.url, "phases": list(phases), "seconds": seconds, "concurrency": settings.concurrency,
              "max_new_tokens": sampling.max_new_tokens, "holdout": holdout, "probe_every": probe_every,
              "server": {k: info.get(k) for k in ("method", "target", "draft", "hardware")}}
    summary, picture = _replay(ctx, settings, plan, info, config, plot_path, [n for n, _, _ in parsed])
    _print(summary, picture, output == "json")
    changed = summary["holdout_answers_changed"]
    if changed:
        fail(f"greedy answers changed across drafter versions for {', '.join(changed)}: the engine is not lossless",
             code=1)


def _plan(ctx: click.Context, parsed: list[tuple[str, str, str | None]], seconds: list[float], num_prompts: int,
          holdout: int, chat: bool, target: str | None) -> list[Any]:
    """The phases, their prompts rendered in one pass (held-out ones first)."""
    from adaflash.bench.shift import Phase
    from adaflash.cli.bench import render_prompts

    rows = [_phase_rows(ctx, name, dataset, domain, num_prompts, holdout) for name, dataset, domain in parsed]
    prompts = iter(render_prompts([r for phase in rows for r in phase], chat, target))
    plan = []
    for (name, _, _), phase, length in zip(parsed, rows, seconds):
        mine = [next(prompts) for _ in phase]
        plan.append(Phase(name, mine[holdout:], mine[:holdout], length))
    return plan


def _replay(ctx: click.Context, settings: Any, plan: list[Any], info: dict[str, Any], config: dict[str, Any],
            plot_path: str | None, names: list[str]) -> tuple[dict[str, Any], Path]:
    """Replay inside a recorded run: (the summary, the picture)."""
    import asyncio

    from adaflash.bench.shift import replay
    from adaflash.bench.shift_plot import plot_shift
    from adaflash.workspace import runs_dir

    log = runlog_of(ctx)
    with recorded_run(log, "bench", name="shift", method=info.get("method"), target=info.get("target"),
                      config=config) as run:
        run_dir = runs_dir(workspace_of(ctx)) / run.id
        run_dir.mkdir(parents=True, exist_ok=True)
        live = _LiveLog(log, run.id)
        result = asyncio.run(replay(settings, plan, on_sample=live.sample, on_switch=live.switch))
        data = result.as_json()
        (run_dir / "shift.json").write_text(json.dumps(data))
        picture = plot_shift(result, plot_path or run_dir / "shift.svg",
                             title=f"{info.get('method')} on {info.get('target')}: " + " → ".join(names))
        summary = data["summary"]
        log.update_run(run.id, run_dir=str(run_dir), config={**config, "summary": summary, "plot": str(picture)})
        if summary["holdout_answers_changed"]:
            run.finish("failed", note=f"held-out answers changed: {', '.join(summary['holdout_answers_changed'])}")
    return summary, picture


def _seconds(text: str, phases: int) -> list[float]:
    """--seconds: one length for every phase, or one per phase."""
    try:
        lengths = [float(part) for part in text.split(",")]
    except ValueError:
        lengths = []
    if not lengths or any(not length >= 1 for length in lengths):
        raise click.BadParameter(f"expected seconds >= 1, one number or one per phase (60,600), got {text!r}",
                                 param_hint="'--seconds'")
    if len(lengths) == 1:
        return lengths * phases
    if len(lengths) != phases:
        raise click.BadParameter(f"{len(lengths)} lengths for {phases} phases: give one, or one per --phase",
                                 param_hint="'--seconds'")
    return lengths


def _phase_rows(ctx: click.Context, name: str, dataset: str, domain: str | None, num_prompts: int,
                holdout: int) -> list:
    """The prompt rows of one phase, its held-out ones first."""
    from adaflash.bench.prompts import BenchDataError, load_rows

    try:
        _, rows = load_rows(dataset, workspace_of(ctx))
    except BenchDataError as err:
        fail(f"--phase {name}: {err}")
    if domain is not None:
        rows = [r for r in rows if r.domain == domain]
        if not rows:
            fail(f"--phase {name}={dataset}:{domain}: {dataset} has no prompts of domain {domain!r}")
    rows = rows[:num_prompts]
    if len(rows) <= holdout:
        fail(f"--phase {name}: {len(rows)} prompts leave none for traffic after --holdout {holdout}")
    return rows


class _LiveLog:
    """τ in the run log while the replay runs: every 8 traffic requests, and every held-out round."""

    def __init__(self, log, run_id: str) -> None:
        self.log, self.run_id = log, run_id
        self.recent: list[Any] = []
        self.count = 0
        self.rounds: dict[str, list[Any]] = {}

    def switch(self, name: str) -> None:
        self.log.log_event(self.run_id, f"phase {name} begins")

    def sample(self, sample) -> None:
        from adaflash.bench.shift import tau

        if sample.error is not None:
            return
        self.count += 1
        if sample.holdout:
            group = self.rounds.setdefault(sample.phase, [])
            group.append(sample)
            return
        self.recent = (self.recent + [sample])[-16:]
        if self.count % 8 == 0:
            self.log.log_metrics(self.run_id, {"tau": tau(self.recent), "drafter_version": sample.version},
                                 step=self.count, version=sample.version, job=sample.phase)
            for phase, group in self.rounds.items():
                if group:
                    self.log.log_metrics(self.run_id, {"holdout_tau": tau(group)}, step=self.count, job=phase)
            self.rounds.clear()


def _print(summary: dict[str, Any], picture: Path, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({**summary, "plot": str(picture)}, indent=2))
        return

    def f(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}"

    for name, p in summary["phases"].items():
        click.echo(f"{name}: {p['requests']} requests, τ {f(p['tau_first_tenth'])} → {f(p['tau_last_tenth'])} "
                   f"(first and last tenth); held-out τ {f(p['holdout_tau_first'])} → {f(p['holdout_tau_last'])} "
                   f"over {p['holdout_rounds']} rounds (best {f(p['holdout_tau_best'])} after "
                   f"{f(p['holdout_best_after_s'])} s; last quarter of rounds {f(p['holdout_tau_last_quarter'])})")
    for label, lat in summary["latency"].items():
        ms = {k: None if lat[k] is None else lat[k] * 1000 for k in ("p50", "p99")}
        click.echo(f"latency {label.replace('_', ' ')}: {lat['requests']} requests, p50 {f(ms['p50'])} ms, "
                   f"p99 {f(ms['p99'])} ms")
    click.echo(f"{summary['swaps']} drafter swaps; held-out answers identical across them: "
               f"{'no' if summary['holdout_answers_changed'] else 'yes'} ({summary['holdout_prompts']} prompts)")
    click.echo(f"plot: {picture}")
