"""`adaflash data regenerate`'s work: one process, or N copies of the command merged into one file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import RecordedRun, argv_of, fail, recorded_run, runlog_of
from adaflash.engine.config import EngineConfig
from adaflash.options import InputConfig, JobConfig, ModelConfig, SamplingConfig


@dataclass(frozen=True)
class Regeneration:
    """What one regeneration answers, with what, and where it writes."""

    model: ModelConfig
    method: str
    draft: str | None
    dataset_file: str
    inputs: InputConfig
    sampling: SamplingConfig
    engine: EngineConfig
    job: JobConfig
    out: str
    shard: str | None
    compact: bool
    quiet: bool  # --json: the summary only


def regenerate_in_procs(ctx: click.Context, work: Regeneration, procs: int) -> None:
    """`regenerate --procs N`: N copies of this command, one --shard each, merged into OUT."""
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from adaflash.data.regenerate_procs import (
        ShardError,
        child_command,
        combined,
        merge,
        run_shards,
        shards_of,
    )

    out_file, as_json = work.out, work.quiet
    base = child_command() + argv_of(ctx, {"procs", "out", "shard", "output_format"})
    shards = shards_of(out_file, procs)
    log = runlog_of(ctx)
    with recorded_run(log, "data", expected=(OSError, ValueError, ShardError), name="regenerate",
                      target=work.model.target, method=work.method, dataset=work.dataset_file,
                      run_dir=str(Path(out_file).expanduser().resolve().parent),
                      config={"command": "regenerate", "out": str(out_file), "procs": procs}) as run:
        with Progress(TextColumn(f"[bold]regenerate × {procs}"), MofNCompleteColumn(), TextColumn("answers"),
                      TimeElapsedColumn(), console=Console(stderr=True), disable=as_json) as progress:
            task = progress.add_task("regenerate", total=None)
            summaries = run_shards(lambda s: base + [f"--shard={s.spec}", f"--out={s.out}", "--json"], shards,
                                   resume=work.job.resume,
                                   on_poll=lambda done: progress.update(task, completed=done))
            progress.update(task, completed=sum(s["rows"] for s in summaries))
        rows = merge(shards, out_file)
        summary = {"run_id": run.id, "out": str(out_file), "procs": procs, **combined(summaries), "rows": rows}
        run.finish(note=record_regenerate(run, summary))
    report_regenerate(summary, as_json, how=f"{procs} processes", kept_in="the shards' partial files")


REGENERATE_METRICS = ("rows", "new_rows", "unfinished", "skipped", "completion_tokens", "output_throughput",
                      "answers_per_hour", "accept_length", "duration")


def record_regenerate(run: RecordedRun, summary: dict[str, Any]) -> str:
    """The run log's metrics, and its note (returned): alike for one process and for several."""
    run.metrics({key: summary[key] for key in REGENERATE_METRICS})
    left = f"; {summary['unfinished']} unfinished: --resume answers them" if summary["unfinished"] else ""
    return f"{summary['rows']} rows -> {summary['out']}{left}"


def report_regenerate(summary: dict[str, Any], as_json: bool, *, how: str, kept_in: str) -> None:
    """What the user reads: alike for one process and for several."""
    run_id, rows, unfinished = summary["run_id"], summary["rows"], summary["unfinished"]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"{rows} rows -> {summary['out']} ({summary['new_rows']} new, {summary['completion_tokens']} tokens, "
               f"{summary['output_throughput']:.1f} tok/s, {summary['answers_per_hour']:,.0f} answers an hour, "
               f"τ={summary['accept_length']:.2f}, {how})")
    if unfinished:
        click.secho(f"  time budget spent: {unfinished} prompts unfinished; run again with --resume (kept in "
                    f"{kept_in})", fg="yellow")
    skipped = list(summary["skipped_reasons"].items())
    for rid, why in skipped[:5]:
        click.secho(f"  skipped {rid}: {why}", fg="yellow")
    if len(skipped) > 5:
        click.secho(f"  ... and {len(skipped) - 5} more skipped", fg="yellow")
    click.secho(f"  run {run_id}", fg="bright_black")




def regenerate_here(ctx: click.Context, work: Regeneration) -> None:
    """Answer in this process: rows appended to OUT.partial as they come, OUT written once at the end."""
    from adaflash.data.regenerate import PartialRows

    prompts = _prompts(work)
    partial = PartialRows(work.out, resume=work.job.resume)
    answered = dict(partial.rows)  # what earlier runs left: the file grows from here
    todo = [p for p in prompts if p.id not in answered]
    engine = _engine(work, todo or prompts)
    s = work.sampling
    config = {"command": "regenerate", "out": str(work.out), "num_samples": len(prompts), "skip": work.inputs.skip,
              "shard": work.shard, "resume": work.job.resume, "resumed_rows": len(answered),
              "max_minutes": work.job.max_minutes, "compact": work.compact, "max_new_tokens": s.max_new_tokens,
              "temperature": s.temperature, "top_p": s.top_p, "chat": s.chat, "seed": s.seed,
              "batch_size": work.engine.max_batch, "max_len": engine.max_len, "device": str(engine.device)}
    with recorded_run(runlog_of(ctx), "data", expected=(ValueError, RuntimeError, OSError), name="regenerate",
                      method=work.method, target=work.model.target, draft=work.draft, dataset=work.dataset_file,
                      run_dir=str(Path(work.out).expanduser().resolve().parent), config=config) as run:
        result = _answer(work, engine, todo, partial, len(prompts), len(answered))
        summary = _written(work, run, result, partial, prompts, len(answered))
        run.finish(note=record_regenerate(run, summary))
    report_regenerate(summary, work.quiet, how="1 process", kept_in=str(partial.path))


def _prompts(work: Regeneration) -> list[Any]:
    from adaflash.data.prompts import PromptFileError, read_prompt_file
    from adaflash.data.regenerate import shard_of

    try:
        prompts = read_prompt_file(work.dataset_file, work.inputs.num_samples, work.inputs.skip)
        return shard_of(prompts, work.shard) if work.shard else prompts
    except (PromptFileError, ValueError) as err:
        fail(str(err))


def _engine(work: Regeneration, prompts: list[Any]) -> Any:
    """The engine, its cache sized for the longest prompt + --max-new-tokens unless --context-length says."""
    from adaflash.data.regenerate import fit_max_len
    from adaflash.engine.build import build_engine
    from adaflash.models.drafter_io import DrafterError
    from adaflash.models.loading import load_target

    try:
        loaded = load_target(work.model.target, device=work.model.device, dtype=work.model.dtype)
        max_len = work.engine.max_len
        cache_len = (min(max_len, loaded.max_context) if max_len else
                     fit_max_len(loaded, prompts, chat=work.sampling.chat, max_new_tokens=work.sampling.max_new_tokens))
        config = EngineConfig(max_batch=work.engine.max_batch, max_len=cache_len, seed=work.sampling.seed or 0)
        return build_engine(loaded, work.method, work.draft, config=config)
    except (DrafterError, ValueError, FileNotFoundError, OSError) as err:
        fail(str(err))


def _answer(work: Regeneration, engine: Any, todo: list[Any], partial: Any, total: int, resumed: int) -> Any:
    """Answer `todo` under a progress bar, each row appended to the partial file as it finishes."""
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from adaflash.data.regenerate import regenerate as run_regenerate
    from adaflash.engine.params import SamplingParams

    s = work.sampling
    params = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)
    with Progress(TextColumn("[bold]regenerate"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[tokens]} tok"), TimeElapsedColumn(), console=Console(stderr=True),
                  disable=work.quiet) as progress:
        task = progress.add_task("regenerate", total=total, tokens=0, completed=resumed)
        tokens = [0]

        def on_done(row: dict[str, Any]) -> None:
            partial.add(row)
            tokens[0] += row["meta"]["completion_tokens"] or 0
            progress.update(task, advance=1, tokens=tokens[0])

        deadline = time.monotonic() + 60 * work.job.max_minutes if work.job.max_minutes else None
        try:
            return run_regenerate(engine, todo, params, chat=s.chat, on_done=on_done, compact=work.compact,
                                  deadline=deadline)
        finally:
            partial.close(done=False)


def _written(work: Regeneration, run: RecordedRun, result: Any, partial: Any, prompts: list[Any],
             resumed: int) -> dict[str, Any]:
    """Write OUT (every answered row, in the dataset's order) and sum the run up."""
    from adaflash.data.io import write_jsonl_atomic

    rows = [partial.rows[p.id] for p in prompts if p.id in partial.rows]
    path = write_jsonl_atomic(work.out, rows)
    if not result.unfinished:
        partial.close(done=True)
    return {"run_id": run.id, "out": str(path), "rows": len(rows), "new_rows": len(result.rows),
            "resumed_rows": resumed, "unfinished": result.unfinished, "skipped": len(result.skipped),
            "skipped_reasons": result.skipped, "completion_tokens": result.completion_tokens,
            "accept_length": result.accept_length, "output_throughput": result.output_throughput,
            "duration": result.duration,
            "answers_per_hour": 3600 * len(result.rows) / result.duration if result.duration > 0 else 0.0}
