"""`adaflash bench engine`: every method through the embedded engine in this process, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from adaflash.cli.bench import _prompts
from adaflash.cli.common import emit_rows, fail, note_builtin_drafter, runlog_of
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import draft_map
from adaflash.engine.config import EngineConfig
from adaflash.methods import SPECULATIVE_NAMES, VANILLA
from adaflash.options import BenchConfig, InputConfig, ModelConfig, ProfileConfig, SamplingConfig


@click.command("engine")
@uses(use(ModelConfig, skip=("method",)), use(BenchConfig, only=("methods", "draft_dir", "batch_sizes", "warmup", "order", "compare_hf",
                                                             "prompt_lookup_tokens", "acceptance", "label",
                                                             "length_spread")),
      use(InputConfig, only=("prompts", "num_prompts")), use(SamplingConfig, only=("max_new_tokens", "chat", "seed")),
      use(EngineConfig, skip=("max_batch", "max_len"), notes={"admit_batch": "At most the smallest --batch-sizes."}),
      use(ProfileConfig, only=("profile", "profile_steps")),
      Output(("table", "markdown", "csv", "json"), help="How to print the results at the end."), command="bench engine")
@click.pass_context
def engine(ctx: click.Context, model: ModelConfig, bench: BenchConfig, inputs: InputConfig, sampling: SamplingConfig,
           engine: EngineConfig, profile: ProfileConfig, output: str) -> None:
    """Measure every method through the embedded engine side by side, greedy, on the same prompts.

    Per batch size: output tok/s, τ and whether greedy output is identical to our Vanilla's; with
    --compare-hf also transformers' own generate() (plain, and prompt-lookup assisted at batch 1).
    Every row lands in the run log: `adaflash runs compare RUN` shows the speed-ups again.
    """
    from adaflash.bench.engine_bench import EngineBenchEvents, run_engine_bench
    from adaflash.bench.engine_spec import EngineBenchError, EngineBenchSpec

    target = model.target or ""
    methods, sizes, drafts = _plan(model, bench, engine, bench.draft_dir)
    name, prompts = _prompts(ctx, inputs.prompts or "gsm8k", inputs.num_prompts, sampling.seed, sampling.chat, target)
    if bench.compare_hf and bench.length_spread:
        fail("--compare-hf with --length-spread: transformers' generate() gives every row of a batch one length, so "
             "it cannot answer each prompt within its own budget; drop one of them")
    if bench.warmup not in ("auto", "short", "full", "none"):
        fail(f"--warmup: bench engine takes auto, short, full or none, got {bench.warmup!r}")
    from adaflash.bench.cost import CostBenchError
    from adaflash.bench.width_gain import parse_acceptance

    try:
        acceptance = parse_acceptance(bench.acceptance) if bench.acceptance else None
    except CostBenchError as err:
        fail(str(err))
    spec = EngineBenchSpec(target=target, methods=methods, batch_sizes=sizes, drafts=drafts, dataset=name,
                           max_new_tokens=sampling.max_new_tokens, device=model.device, dtype=model.dtype,
                           compare_hf=bench.compare_hf, prompt_lookup_tokens=bench.prompt_lookup_tokens,
                           label=bench.label, warmup=bench.warmup, engine_config=engine, order=bench.order,
                           profile=str(Path(profile.profile).expanduser()) if profile.profile else None,
                           profile_steps=profile.profile_steps, acceptance=acceptance,
                           length_spread=bench.length_spread)
    try:
        run_id, records = run_engine_bench(spec, prompts, runlog_of(ctx), EngineBenchEvents(
            message=lambda m: click.echo(m, err=True)))
    except EngineBenchError as err:
        fail(str(err))
    _report(run_id, records, spec, name, len(prompts), output)


def _plan(model: ModelConfig, bench: BenchConfig, engine: EngineConfig,
          draft_dir: str | None) -> tuple[list[str], list[int], dict[str, str]]:
    """(methods, batch sizes, drafter per method), checked before anything loads."""
    from adaflash.bench.engine_spec import EngineBenchError, parse_batch_sizes, parse_methods, resolve_drafts
    from adaflash.models.builtin_drafters import builtin_drafter_of
    from adaflash.models.registry import resolve_drafter

    explicit = draft_map(model)
    if VANILLA in explicit:
        fail(f"--draft takes METHOD=DIR with METHOD one of {', '.join(SPECULATIVE_NAMES)}, got "
             f"{VANILLA}={explicit[VANILLA]!r}")
    try:
        methods, sizes = parse_methods(bench.methods or VANILLA), parse_batch_sizes(bench.batch_sizes)
        if engine.admit_batch is not None and engine.admit_batch > min(sizes):
            fail(f"--admit-batch {engine.admit_batch}: more than the smallest --batch-sizes ({min(sizes)}), whose "
                 f"engine would never admit a prompt while a row decodes")
        unused = [f"{m}={d}" for m, d in explicit.items() if m not in methods]
        if unused:  # a drafter given for a method that does not run: most likely a mistyped --methods
            fail(f"--draft {', '.join(unused)}: not in --methods {','.join(methods)}")
        if draft_dir and not Path(draft_dir).expanduser().is_dir():
            fail(f"--draft-dir {draft_dir}: no such folder")
        drafts = resolve_drafts(methods, draft_dir, explicit, model.target)
    except EngineBenchError as err:
        fail(str(err))
    for method, folder in drafts.items():
        builtin = builtin_drafter_of(model.target, method) if method not in explicit else None
        if builtin and folder == str(resolve_drafter(builtin)):
            note_builtin_drafter(f"{method} runs", builtin, f"--draft {method}=DIR")
    if VANILLA not in methods:
        click.secho("note: no vanilla in --methods: no speed-up column and no lossless check", fg="yellow", err=True)
    return methods, sizes, drafts


def _report(run_id: str, records: list[dict[str, Any]], spec: Any, name: str, count: int, output: str) -> None:
    from adaflash.bench.engine_table import (
        TABLE_COLUMNS,
        against_dflash,
        by_position,
        mismatch_notes,
        speedup_breakdown,
        table_rows,
    )

    rows = table_rows(records)
    if output == "json":
        click.echo(json.dumps({"run_id": run_id, "rows": rows, "records": records}, indent=2, default=str))
    else:
        emit_rows(rows, TABLE_COLUMNS, output, title=f"bench engine · {spec.target} · {name} · {count} prompts · "
                  f"{spec.max_new_tokens} max tokens · {records[0]['hardware'] if records else ''} [{run_id}]")
    for note in mismatch_notes(records):
        click.secho(note, fg="yellow", err=True)
    for title, lines in (("where the speed-up goes (engine pass timings):", speedup_breakdown(records)),
                         ("τ × throughput against the dflash row of the same batch:", against_dflash(records)),
                         ("acceptance by drafted position (of the steps that reached it):", by_position(records))):
        if lines:
            click.echo(title, err=True)
            for line in lines:
                click.echo(f"  {line}", err=True)
    click.secho(f"recorded in the run log: adaflash runs compare {run_id}", err=True)
