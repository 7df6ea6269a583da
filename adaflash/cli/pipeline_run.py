"""`adaflash pipeline`'s work: the plan its groups make, the two workers' configs, the recorded run."""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import (
    RecordedRun,
    emit_rows,
    fail,
    recorded_run,
    runlog_of,
    workspace_of,
    workspace_path_of,
)
from adaflash.engine.config import EngineConfig
from adaflash.methods import ADAFLASH, DFLASH, OSD
from adaflash.options import JobConfig, PipelineOptions, SamplingConfig, TrainOptions
from adaflash.pipeline.presets import PRESETS

VERSION_COLUMNS = ["drafter_version", "requests", "tau", "tau_tokens", "published_s", "swapped_s",
                   "publish_to_swap_s", "swap"]


@dataclass
class PipelinePlan:
    """One pipeline run as its options make it; `check_plan` fills the GPU lists."""

    target: str
    draft: str
    data: str
    skip: int
    pipeline: PipelineOptions
    train: TrainOptions
    length_head: bool | None
    job: JobConfig
    sampling: SamplingConfig
    engine: EngineConfig
    infer_list: list[str] = field(default_factory=list)
    train_list: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> dict[str, Any]:
        """The preset, with --loss and --length-head over it."""
        chosen = dict(PRESETS[self.pipeline.preset or "adaflash"])
        if self.train.loss:
            chosen["loss"] = self.train.loss
        if self.length_head is not None:
            chosen["length_head"] = self.length_head
        return chosen

    @property
    def served(self) -> str:
        """What the inference worker runs."""
        return ADAFLASH if self.chosen["length_head"] else DFLASH

    @property
    def method(self) -> str:
        return self.pipeline.preset or (ADAFLASH if self.chosen["length_head"] else OSD)


def check_plan(plan: PipelinePlan) -> None:
    """GPUs, trainer processes and the time budget, before anything is recorded."""
    from adaflash.pipeline.launch import parse_gpus

    p = plan.pipeline
    try:
        plan.infer_list, plan.train_list = parse_gpus(p.infer_gpus, "--infer-gpus"), parse_gpus(p.train_gpus, "--train-gpus")
    except ValueError as err:
        fail(str(err))
    if p.train_procs and plan.train_list and p.train_procs != len(plan.train_list):
        fail(f"--train-procs {p.train_procs}: on GPUs the trainers run one process per GPU ({len(plan.train_list)} in "
             f"--train-gpus {p.train_gpus})")
    decay, budget = p.lr_decay_minutes, plan.job.max_minutes
    if decay and not budget:
        fail("--lr-decay-minutes anneals towards the end of a time budget: it needs --max-minutes")
    if decay and budget and decay > budget:
        fail(f"--lr-decay-minutes {decay:g} is longer than --max-minutes {budget:g}")


def start_pipeline(ctx: click.Context, plan: PipelinePlan) -> None:
    """Record the run, then start and follow both workers (--dry-run: print their command lines only)."""
    from adaflash.pipeline.launch import Pipeline
    from adaflash.workspace import runs_dir

    with contextlib.ExitStack() as stack:  # the run, once one is recorded, ends with this command
        if plan.job.dry_run:  # the command lines only: nothing recorded, nothing created
            workspace, log, run, run_id = str(workspace_path_of(ctx)), None, None, "RUN_ID"
            run_dir = Path(workspace) / "runs" / run_id
        else:
            workspace, log = workspace_of(ctx), runlog_of(ctx)
            run = stack.enter_context(recorded_run(log, "pipeline", method=plan.method, target=plan.target,
                                                   draft=plan.draft, dataset=plan.data, status="pending"))
            run_id = run.id
            run_dir = runs_dir(workspace) / run_id
            run_dir.mkdir(parents=True, exist_ok=True)
        infer, train, deadline = _worker_configs(plan, workspace, run_id, run_dir)
        if run is None or log is None:
            _print_commands(infer, train, plan.infer_list, plan.train_list, plan.pipeline.train_procs)
            return
        runner = Pipeline(log, run_id, run_dir, infer, train, plan.infer_list, plan.train_list, deadline=deadline,
                          train_procs=plan.pipeline.train_procs)
        log.update_run(run_id, run_dir=str(run_dir), config=_record(plan, infer, deadline))
        run.set_status("running")
        p, chosen = plan.pipeline, plan.chosen
        click.echo(f"pipeline {run_id}: {plan.method} (loss {chosen['loss']}, length head {chosen['length_head']}), "
                   f"inference on {p.infer_gpus}, training on {p.train_gpus}; swap dir {infer.swap_dir}")
        _run_and_report(run, runner)


def _worker_configs(plan: PipelinePlan, workspace: str, run_id: str, run_dir: Path) -> tuple[Any, Any, float | None]:
    """(the inference worker's config, the training worker's, the deadline)."""
    from adaflash.pipeline.inference import InferenceConfig
    from adaflash.pipeline.training import TrainingConfig
    from adaflash.train.losses import LossConfig

    p, t, s, chosen = plan.pipeline, plan.train, plan.sampling, plan.chosen
    swap = str(Path(p.swap_dir).resolve() if p.swap_dir else run_dir / "swap")
    deadline = time.time() + plan.job.max_minutes * 60 if plan.job.max_minutes else None
    loop = plan.job.max_minutes is not None if p.loop is None else p.loop
    draft = str(Path(plan.draft).resolve())
    infer = InferenceConfig(target=plan.target, draft=draft, data=str(Path(plan.data).resolve()), swap_dir=swap,
                            run_id=run_id, workspace=workspace, method=plan.served, engine=plan.engine,
                            max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                            max_samples=p.max_samples,
                            skip=plan.skip, loop=loop, duration=p.duration,
                            device="cuda" if plan.infer_list else "cpu", deadline=deadline)
    train = TrainingConfig(target=plan.target, draft=draft, swap_dir=swap, run_id=run_id, workspace=workspace,
                           loss=LossConfig(chosen["loss"], t.alpha, t.kl_temperature, t.clip),
                           length_head=chosen["length_head"], lr=t.lr, warmup_steps=t.warmup_steps,
                           min_buffer=p.min_buffer, train_batch=p.train_batch, publish_every=p.publish_every,
                           keep=p.keep, device="cuda" if plan.train_list else "cpu", deadline=deadline,
                           lr_decay_seconds=p.lr_decay_minutes * 60)
    return infer, train, deadline


def _record(plan: PipelinePlan, infer: Any, deadline: float | None) -> dict[str, Any]:
    p = plan.pipeline
    return {"preset": plan.method, **plan.chosen, "swap_dir": infer.swap_dir, "infer_gpus": p.infer_gpus,
            "train_gpus": p.train_gpus, "train_procs": p.train_procs or len(plan.train_list) or 1,
            "max_samples": p.max_samples, "skip": plan.skip, "loop": infer.loop, "duration": p.duration,
            "max_minutes": plan.job.max_minutes, "deadline": deadline, "lr": plan.train.lr,
            "lr_decay_minutes": p.lr_decay_minutes, "engine_config": infer.engine.to_json()}


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
