"""`adaflash pipeline`: the asynchronous on-policy pipeline (AdaFlash and OSD presets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import (
    drafter_folder,
    emit_rows,
    existing_runlog_of,
    fail,
    fmt_cell,
    note_builtin_drafter,
    run_or_fail,
)
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.pipeline_run import VERSION_COLUMNS
from adaflash.cli.resolve import prompts_path, required
from adaflash.engine.config import EngineConfig
from adaflash.options import (
    DrafterConfig,
    InputConfig,
    JobConfig,
    ModelConfig,
    PipelineOptions,
    SamplingConfig,
    TrainOptions,
)


@click.group(invoke_without_command=True)
@uses(use(ModelConfig, only=("target", "draft"), notes={"draft": "Here: the initial drafter (offline-trained DFlash) "
                                                                "[default: the built-in offline DFlash drafter of a "
                                                                "built-in target]."}),
      use(InputConfig, only=("data", "skip")), use(PipelineOptions, skip=("version",)),
      use(TrainOptions, only=("loss", "alpha", "kl_temperature", "clip", "lr", "warmup_steps")),
      use(DrafterConfig, only=("length_head",)), use(JobConfig, only=("max_minutes", "dry_run")),
      use(SamplingConfig, only=("max_new_tokens", "temperature", "top_p", "seed")),
      use(EngineConfig, skip=("num_steps",), notes={"max_batch": "Here: the inference batch."}), command="pipeline")
@click.pass_context
def pipeline(ctx: click.Context, model: ModelConfig, inputs: InputConfig, pipeline: PipelineOptions,
             train: TrainOptions, drafter: DrafterConfig, job: JobConfig, sampling: SamplingConfig,
             engine: EngineConfig) -> None:
    """Run the async on-policy pipeline: inference worker → swap buffer → training worker(s) → hot swap.

    The engine options (--length-rate, --admit-batch, --overlap, ...) are the inference worker's.
    """
    if ctx.invoked_subcommand is not None:
        return
    from adaflash.cli.pipeline_run import PipelinePlan, check_plan, start_pipeline

    if len(inputs.data) != 1:
        fail("--data FILE is required, once: the prompts the inference worker answers (see `adaflash pipeline --help`)")
    data = prompts_path(ctx, inputs.data[0], "train", "--data") or ""
    if len(model.draft) > 1:
        fail("--draft is given once here: the initial drafter")
    draft = _initial_drafter(model.target or "", model.draft[0] if model.draft else None)
    plan = PipelinePlan(target=model.target or "", draft=draft, data=data, skip=inputs.skip, pipeline=pipeline,
                        train=train, length_head=drafter.length_head, job=job, sampling=sampling,
                        engine=engine.replace(seed=sampling.seed or 0))
    check_plan(plan)
    _check_drafter(draft, model.target or "", plan.served)
    _check_prompts(data, inputs.skip)
    start_pipeline(ctx, plan)


def _initial_drafter(target: str, draft: str | None) -> str:
    """--draft as a folder, else the built-in drafter of a built-in target (said on stderr)."""
    if not draft:
        from adaflash.models.builtin_drafters import OFFLINE_INIT, builtin_drafter_of

        draft = builtin_drafter_of(target, OFFLINE_INIT)
        if draft is None:
            fail(f"--draft DIR is required: no built-in drafter ships for {target}")
        note_builtin_drafter("starting from", draft, "--draft")
    return drafter_folder("--draft", draft)


def _check_prompts(data: str, skip: int) -> None:
    """Every row of --data read now, not by a worker after the run started (which then failed with code 1)."""
    from adaflash.data.prompts import read_prompt_file

    try:
        count = len(read_prompt_file(data))
    except ValueError as err:
        fail(f"--data {err}")
    if not count:
        fail(f"--data {data}: holds no prompts")
    if skip >= count:
        fail(f"--skip {skip}: {data} holds only {count} prompts, none would be left")


def _check_drafter(draft: str, target: str, served: str) -> None:
    """The pipeline trains DFlash drafters that fit the target and the method its inference worker serves
    (AdaFlash reads the length head from the first step, so the drafter must have one).

    The fit is the check `generate` and `serve` make when they build their engine (hidden size, vocabulary,
    target layer ids, weights against config, the method's needs), made here against the target's config
    alone, so a mismatched drafter is refused before a run is recorded, not by two workers failing with
    tracebacks.
    """
    from adaflash.engine.engine import fitting_drafter
    from adaflash.methods import ONLINE_DRAFTERS, method_of
    from adaflash.models.drafter_io import DrafterError, drafter_method, load_drafter, read_drafter_config
    from adaflash.models.layers import DecoderConfig
    from adaflash.models.loading import local_folder
    from adaflash.models.target import read_hf_config

    try:
        method = drafter_method(read_drafter_config(draft), draft)
    except DrafterError as err:
        fail(f"--draft {err}")
    if method not in ONLINE_DRAFTERS:
        fail(f"--draft {draft} is a {method} drafter; the pipeline trains DFlash drafters (both presets)")
    try:
        target_cfg = DecoderConfig.from_hf(read_hf_config(local_folder(target)))
    except (OSError, ValueError, KeyError) as err:
        fail(f"--target {target}: {err}")
    try:
        drafter = load_drafter(draft, target_cfg)
    except DrafterError as err:
        fail(f"--draft does not fit --target {target}: {err}")
    try:
        fitting_drafter(method_of(served), drafter)
    except ValueError as err:
        fail(f"--draft {draft}: {err}; or train without one (--preset osd or --no-length-head)")


@pipeline.command("stop")
@click.argument("run_id")
@click.pass_context
def stop(ctx: click.Context, run_id: str) -> None:
    """Ask a running pipeline to stop cleanly (both workers finish their step and exit)."""
    from adaflash.pipeline.buffer import SwapBuffer
    from adaflash.runlog import LIVE_RUN_STATUSES

    log = existing_runlog_of(ctx)
    run = run_or_fail(log, run_id)
    swap = (run.get("config") or {}).get("swap_dir")
    if run["kind"] != "pipeline" or not swap:
        fail(f"run {run['id']} is not a pipeline run")
    if run["status"] not in LIVE_RUN_STATUSES:
        click.echo(f"run {run['id']} has already ended ({run['status']}); nothing to stop")
        return
    SwapBuffer(swap).request_stop()
    click.echo(f"stop requested for {run['id']} ({swap})")


@pipeline.command("export")
@click.argument("run_id", required=False)
@uses(use(PipelineOptions, only=("swap_dir", "version")), use(JobConfig, only=("out",)), command="pipeline export")
@click.pass_context
def export(ctx: click.Context, run_id: str | None, pipeline: PipelineOptions, job: JobConfig) -> None:
    """Copy a pipeline's drafter version [default: RUN's newest, else the newest run's] to a stable folder.

    Versions are pruned as newer ones land; the exported folder is what `serve --draft`, `bench engine
    --draft adaflash=OUT` and `train draft --init` take.
    """
    from adaflash.models.drafter_io import DrafterError
    from adaflash.pipeline.weights import WeightStore

    swap_dir, out, version = pipeline.swap_dir, job.out, pipeline.version
    required(out, "--out", "the drafter folder to write")
    if swap_dir and run_id:
        fail("give RUN_ID or --swap-dir, not both")
    if not swap_dir:
        run = _find_run(existing_runlog_of(ctx), run_id, None)
        swap_dir = (run.get("config") or {}).get("swap_dir")
        if not swap_dir:
            fail(f"run {run['id']} records no swap dir")
    if not Path(swap_dir, "weights").is_dir():
        fail(f"--swap-dir {swap_dir}: no weights/ folder (not a pipeline's swap dir)")
    try:
        exported, folder = WeightStore(swap_dir).export(out, version)
    except DrafterError as err:
        fail(str(err))
    click.echo(f"exported version {exported} of {swap_dir} -> {folder}")


@pipeline.command("status")
@click.argument("run_id", required=False)
@uses(use(PipelineOptions, only=("swap_dir",)), Output(("table", "json", "csv")), command="pipeline status")
@click.pass_context
def status(ctx: click.Context, run_id: str | None, pipeline: PipelineOptions, output: str) -> None:
    """Report of a pipeline run [default: the newest]: τ per drafter version, inference tokens/s beside
    training, training tokens/s per rank, publish → hot-swap times, and that no sample was lost or
    repeated between buffer and trainers."""
    from adaflash.pipeline.report import pipeline_report

    log = existing_runlog_of(ctx)
    run = _find_run(log, run_id, pipeline.swap_dir)
    report = pipeline_report(log, run)
    if output == "json":
        click.echo(json.dumps(report, indent=2, default=str))
        return
    if output == "csv":
        emit_rows(report["versions"], VERSION_COLUMNS, "csv")
        return
    _print_report(report)


def _find_run(log, run_id: str | None, swap_dir: str | None) -> dict[str, Any]:
    if run_id:
        run = run_or_fail(log, run_id)
        if run["kind"] != "pipeline":
            fail(f"run {run['id']} is a {run['kind']} run, not a pipeline run")
        return run
    runs = log.list_runs(kind="pipeline")
    if swap_dir:
        wanted = Path(swap_dir).resolve()
        runs = [r for r in runs if (r.get("config") or {}).get("swap_dir")
                and Path(r["config"]["swap_dir"]).resolve() == wanted]
    runs = [r for r in runs if (r.get("note") or "") != "dry run"]
    if not runs:
        fail(f"no pipeline run{f' with swap dir {swap_dir}' if swap_dir else ''} in {log.path}")
    return runs[0]


def _print_report(report: dict[str, Any]) -> None:
    head = f"{report['run']} ({report['status']}, {report['method']}; inference on {report['infer_gpus']}, " \
           f"training on {report['train_gpus']})"
    emit_rows(report["versions"], VERSION_COLUMNS, "table", title=f"τ per drafter version: {head}")
    if report.get("note"):
        click.echo(f"run note: {report['note']}")
    inf, tr, ok = report["inference"], report["training"], report["integrity"]
    click.echo(f"inference output tokens/s: {fmt_cell(inf['tokens_per_s_beside_training'])} beside training "
               f"({inf['seconds_beside_training']:.1f}s), {fmt_cell(inf['tokens_per_s_without_training'])} without "
               f"({inf['seconds_without_training']:.1f}s); {inf['output_tokens']} tokens in all")
    if tr["ranks"]:
        emit_rows(tr["ranks"], ["rank", "samples", "tokens", "seconds", "tokens_per_s"], "table",
                  title="training tokens/s per rank" + (" (one GPU each)" if report["train_gpus"] != "cpu" else ""))
    click.echo(f"training: {tr['steps']} steps, {tr['samples']} samples, world size {fmt_cell(tr['world_size'])}, "
               f"{fmt_cell(tr['tokens_per_s'])} tokens/s in all")
    if inf.get("peak_memory_gib") is not None or tr.get("peak_memory_gib") is not None:
        click.echo(f"peak GPU memory (GiB, each worker's allocator): inference {fmt_cell(inf.get('peak_memory_gib'))}, "
                   f"training {fmt_cell(tr.get('peak_memory_gib'))}")
    lags = [v["publish_to_swap_s"] for v in report["versions"] if v.get("publish_to_swap_s") is not None]
    if lags:
        click.echo(f"publish → hot swap: mean {sum(lags) / len(lags):.2f}s, max {max(lags):.2f}s over {len(lags)} "
                   f"version(s)")
    if ok.get("checked"):
        verdict = "OK" if ok["ok"] else "PROBLEM"
        click.echo(f"integrity {verdict}: buffer {ok['buffer_rows']} rows, consumed up to offset "
                   f"{ok['final_consumed_offset']} (published {ok['published_consumed']}) in {ok['steps']} steps; "
                   f"missing {ok['missing']}, duplicated {ok['duplicated']}, not in buffer {ok['not_in_buffer']}, "
                   f"repeated ids {ok['duplicate_ids_in_buffer']}, unusable {ok['unusable']}, "
                   f"not yet consumed {ok['unconsumed']}")
    else:
        click.echo(f"integrity not checked: {ok.get('reason')}")
    latest = report["latest"]
    version = latest["published_version"]
    click.echo(f"newest published version {'N/A' if version is None else int(version)}"
               + (f", buffer depth {int(latest['buffer_depth'])} at the last inference flush"
                  if report["status"] == "running" and latest["buffer_depth"] is not None else ""))
