"""`adaflash pipeline`: the asynchronous on-policy pipeline (AdaFlash and OSD presets)."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import (
    RecordedRun,
    drafter_folder,
    emit_rows,
    existing_runlog_of,
    fail,
    fmt_cell,
    note_builtin_drafter,
    output_format_option,
    prompt_file,
    recorded_run,
    run_or_fail,
    runlog_of,
    workspace_of,
    workspace_path_of,
)
from adaflash.cli.engine_options import engine_options
from adaflash.methods import ADAFLASH, DFLASH, OSD
from adaflash.pipeline.presets import PRESETS


@click.group(invoke_without_command=True)
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--draft", help="Initial drafter (offline-trained DFlash): a folder or a built-in drafter's name "
                             "[default: the built-in offline DFlash drafter of a built-in target].")
@click.option("--data", callback=prompt_file("train"),
              help="Prompts: normalized rows or {\"prompt\"} rows, or a prepared dataset's name (its train split).")
@click.option("--infer-gpus", default="cpu", show_default=True, help="'cpu' or GPU indices for the inference worker.")
@click.option("--train-gpus", default="cpu", show_default=True, help="'cpu' or GPU indices (several = torchrun).")
@click.option("--train-procs", type=click.IntRange(1), default=None,
              help="Training processes on CPU (torchrun, gloo) [default: 1]; on GPUs it is one per training GPU.")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default=None,
              help="adaflash = reverse-KL mixture + length head; osd = forward KL, no head.")
@click.option("--loss", type=click.Choice(["rkl-mix", "fkl", "ce"]), default=None, help="Overrides the preset's loss.")
@click.option("--length-head/--no-length-head", default=None, help="Overrides the preset.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.8, show_default=True)
@click.option("--kl-temperature", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True)
@click.option("--clip", type=click.FloatRange(0, min_open=True), default=0.01, show_default=True)
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=1e-4, show_default=True)
@click.option("--warmup-steps", type=click.IntRange(0), default=16, show_default=True,
              help="Training steps over which the learning rate (drafter and length head) ramps up to --lr.")
@click.option("--lr-decay-minutes", type=click.FloatRange(0), default=0.0, show_default=True,
              help="With --max-minutes: the budget's last M minutes anneal the learning rate linearly to zero "
                   "(warmup-stable-decay), so the final version is a settled one.")
@click.option("--swap-dir", type=click.Path(file_okay=False), default=None, help="Buffer + weights [default: RUN_DIR/swap].")
@click.option("--max-samples", type=click.IntRange(1), default=None, help="Stop after this many trajectories (without --loop, at most one per prompt).")
@click.option("--skip", type=click.IntRange(0), default=0, show_default=True,
              help="Leave out the first N prompts of --data (those the offline drafter was trained on).")
@click.option("--loop/--no-loop", default=None,
              help="Cycle over the data until stopped [default: on with --max-minutes, else off].")
@click.option("--max-minutes", type=click.FloatRange(0, min_open=True), default=None,
              help="Time budget of the whole run: at the deadline inference stops taking prompts (finishing those "
                   "in flight) and the trainers stop consuming, publish a final version and exit.")
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=None,
              help="Inference stops taking prompts this many seconds after it starts; the trainers then drain the buffer.")
@click.option("--min-buffer", type=click.IntRange(1), default=8, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True,
              help="Inference batch: prompts answered at once.")
@click.option("--train-batch", type=click.IntRange(1), default=8, show_default=True, help="Trajectories per training step.")
@click.option("--publish-every", type=click.IntRange(1), default=2, show_default=True, help="Steps between versions.")
@click.option("--keep", type=click.IntRange(1), default=3, show_default=True, help="Versions kept on disk.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True)
@engine_options()
@click.option("--dry-run", is_flag=True, help="Print the worker command lines and exit.")
@click.pass_context
def pipeline(ctx: click.Context, target, draft, data, infer_gpus, train_gpus, train_procs, preset, loss, length_head, alpha,
             kl_temperature, clip, lr, warmup_steps, lr_decay_minutes, swap_dir, max_samples, skip, loop, max_minutes, duration, min_buffer,
             batch_size, train_batch, publish_every, keep, max_new_tokens, temperature, engine_cfg, dry_run) -> None:
    """Run the async on-policy pipeline: inference worker → swap buffer → training worker(s) → hot swap.

    The engine options (--length-rate, --admit-batch, --overlap, ...) are the inference worker's.
    """
    if ctx.invoked_subcommand is not None:
        return
    from adaflash.pipeline.inference import InferenceConfig
    from adaflash.pipeline.launch import Pipeline, parse_gpus
    from adaflash.pipeline.training import TrainingConfig
    from adaflash.train.losses import LossConfig
    from adaflash.workspace import runs_dir

    if not data:
        fail("--data FILE is required: the prompts the inference worker answers (see `adaflash pipeline --help`)")
    draft = _initial_drafter(target, draft)
    chosen = dict(PRESETS[preset or "adaflash"])
    if loss:
        chosen["loss"] = loss
    if length_head is not None:
        chosen["length_head"] = length_head
    served = ADAFLASH if chosen["length_head"] else DFLASH  # what the inference worker runs
    _check_drafter(draft, target, served)
    _check_prompts(data, skip)
    try:
        infer_list, train_list = parse_gpus(infer_gpus, "--infer-gpus"), parse_gpus(train_gpus, "--train-gpus")
    except ValueError as err:
        fail(str(err))
    if train_procs and train_list and train_procs != len(train_list):
        fail(f"--train-procs {train_procs}: on GPUs the trainers run one process per GPU ({len(train_list)} in "
             f"--train-gpus {train_gpus})")
    _check_budget(lr_decay_minutes, max_minutes)
    if loop is None:
        loop = max_minutes is not None
    method = preset or (ADAFLASH if chosen["length_head"] else OSD)
    with contextlib.ExitStack() as stack:  # the run, once one is recorded, ends with this command
        if dry_run:  # the command lines only: nothing recorded, nothing created
            workspace = str(workspace_path_of(ctx))
            log, run_id = None, "RUN_ID"
            run_dir = Path(workspace) / "runs" / run_id
        else:
            workspace = workspace_of(ctx)
            log = runlog_of(ctx)
            run = stack.enter_context(recorded_run(log, "pipeline", method=method, target=target, draft=draft, dataset=data,
                                                   status="pending"))
            run_id = run.id
            run_dir = runs_dir(workspace) / run_id
            run_dir.mkdir(parents=True, exist_ok=True)
        swap = str(Path(swap_dir).resolve() if swap_dir else run_dir / "swap")
        deadline = time.time() + max_minutes * 60 if max_minutes else None
        device = lambda gpus: "cuda" if gpus else "cpu"  # noqa: E731  (CUDA_VISIBLE_DEVICES narrows it)
        infer = InferenceConfig(target=target, draft=str(Path(draft).resolve()), data=str(Path(data).resolve()), swap_dir=swap,
                                run_id=run_id, workspace=workspace, method=served,
                                engine=engine_cfg.replace(max_batch=batch_size), max_new_tokens=max_new_tokens,
                                temperature=temperature, max_samples=max_samples, skip=skip, loop=loop, duration=duration, device=device(infer_list),
                                deadline=deadline)
        train = TrainingConfig(target=target, draft=str(Path(draft).resolve()), swap_dir=swap, run_id=run_id, workspace=workspace,
                               loss=LossConfig(chosen["loss"], alpha, kl_temperature, clip),
                               length_head=chosen["length_head"], lr=lr, warmup_steps=warmup_steps, min_buffer=min_buffer, train_batch=train_batch,
                               publish_every=publish_every, keep=keep, device=device(train_list), deadline=deadline,
                               lr_decay_seconds=lr_decay_minutes * 60)
        if dry_run:
            _print_commands(infer, train, infer_list, train_list, train_procs)
            return
        assert log is not None
        runner = Pipeline(log, run_id, run_dir, infer, train, infer_list, train_list, deadline=deadline,
                          train_procs=train_procs)
        log.update_run(run_id, run_dir=str(run_dir), config={"preset": method, **chosen, "swap_dir": swap,
                                                             "infer_gpus": infer_gpus, "train_gpus": train_gpus,
                                                             "train_procs": train_procs or len(train_list) or 1,
                                                             "max_samples": max_samples, "skip": skip, "loop": loop, "duration": duration,
                                                             "max_minutes": max_minutes, "deadline": deadline,
                                                             "lr": lr, "lr_decay_minutes": lr_decay_minutes,
                                                             "engine_config": infer.engine.to_json()})
        run.set_status("running")
        click.echo(f"pipeline {run_id}: {method} (loss {chosen['loss']}, length head {chosen['length_head']}), "
                   f"inference on {infer_gpus}, training on {train_gpus}; swap dir {swap}")
        _run_and_report(run, runner)


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


def _check_budget(lr_decay_minutes: float, max_minutes: float | None) -> None:
    if lr_decay_minutes and not max_minutes:
        fail("--lr-decay-minutes anneals towards the end of a time budget: it needs --max-minutes")
    if lr_decay_minutes and max_minutes and lr_decay_minutes > max_minutes:
        fail(f"--lr-decay-minutes {lr_decay_minutes:g} is longer than --max-minutes {max_minutes:g}")


def _print_commands(infer: Any, train: Any, infer_gpus: list[str], train_gpus: list[str],
                    train_procs: int | None) -> None:
    """--dry-run: each worker's environment and command line, as it would start."""
    import os
    import shlex

    from adaflash.pipeline.launch import worker_commands, worker_env

    gpus = {"inference": infer_gpus, "training": train_gpus}
    for role, command in worker_commands(infer, train, train_gpus, train_procs).items():
        env = {"CUDA_VISIBLE_DEVICES": worker_env(gpus[role])["CUDA_VISIBLE_DEVICES"],
               **{k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}}
        click.echo(f"{role}: {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} {shlex.join(command)}")


def _run_and_report(run: RecordedRun, runner: Any) -> None:
    """Start both workers, stop them cleanly on SIGINT/SIGTERM, record the end and print τ per version."""
    from adaflash.pipeline.report import pipeline_report

    log, run_id = run.log, run.id

    previous = {sig: signal.signal(sig, lambda *_: runner.request_stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    runner.start()
    try:
        status = runner.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    run.close(status, runner.note)  # now: the report below reads the ended run
    report = pipeline_report(log, log.get_run(run_id))
    if report["versions"]:
        emit_rows(report["versions"], VERSION_COLUMNS, "table", title=f"τ per drafter version ({run_id})")
    click.echo(f"pipeline {run_id} {status}" + (f" ({runner.note})" if runner.note else ""))
    if status == "failed":
        raise SystemExit(1)


VERSION_COLUMNS = ["drafter_version", "requests", "tau", "tau_tokens", "published_s", "swapped_s",
                   "publish_to_swap_s", "swap"]


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
@click.option("--swap-dir", type=click.Path(file_okay=False), default=None,
              help="Read this swap dir directly (another machine's run needs no run log entry here).")
@click.option("--version", "version", type=click.IntRange(1), default=None, help="A kept version [default: the newest].")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Drafter folder to write (replaced atomically).")
@click.pass_context
def export(ctx: click.Context, run_id: str | None, swap_dir: str | None, version: int | None, out: str) -> None:
    """Copy a pipeline's drafter version [default: RUN's newest, else the newest run's] to a stable folder.

    Versions are pruned as newer ones land; the exported folder is what `serve --draft`, `bench engine
    --draft adaflash=OUT` and `train draft --init` take.
    """
    from adaflash.models.drafter_io import DrafterError
    from adaflash.pipeline.weights import WeightStore

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
@click.option("--swap-dir", type=click.Path(file_okay=False), default=None,
              help="The newest pipeline run that used this swap dir (recipes know it, not the run id).")
@output_format_option()
@click.pass_context
def status(ctx: click.Context, run_id: str | None, swap_dir: str | None, fmt: str) -> None:
    """Report of a pipeline run [default: the newest]: τ per drafter version, inference tokens/s beside
    training, training tokens/s per rank, publish → hot-swap times, and that no sample was lost or
    repeated between buffer and trainers."""
    from adaflash.pipeline.report import pipeline_report

    log = existing_runlog_of(ctx)
    run = _find_run(log, run_id, swap_dir)
    report = pipeline_report(log, run)
    if fmt == "json":
        click.echo(json.dumps(report, indent=2, default=str))
        return
    if fmt == "csv":
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
