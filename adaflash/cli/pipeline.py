"""`adaflash pipeline`: the asynchronous on-policy pipeline (AdaFlash and OSD presets)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click

from adaflash.cli.common import emit_rows, fail, runlog_of, workspace_of

PRESETS = {
    "adaflash": {"loss": "rkl-mix", "length_head": True},
    "osd": {"loss": "fkl", "length_head": False},
}


@click.group(invoke_without_command=True)
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--draft", type=click.Path(file_okay=False), help="Initial drafter (offline-trained DFlash).")
@click.option("--data", type=click.Path(dir_okay=False), help="Prompts (normalized rows or {\"prompt\"} rows).")
@click.option("--infer-gpus", default="cpu", show_default=True, help="'cpu' or GPU indices for the inference worker.")
@click.option("--train-gpus", default="cpu", show_default=True, help="'cpu' or GPU indices (several = torchrun).")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default=None,
              help="adaflash = reverse-KL mixture + length head; osd = forward KL, no head.")
@click.option("--loss", type=click.Choice(["rkl-mix", "fkl", "ce"]), default=None, help="Overrides the preset's loss.")
@click.option("--length-head/--no-length-head", default=None, help="Overrides the preset.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.8, show_default=True)
@click.option("--kl-temperature", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True)
@click.option("--clip", type=click.FloatRange(0, min_open=True), default=0.01, show_default=True)
@click.option("--lr", type=float, default=1e-4, show_default=True)
@click.option("--swap-dir", type=click.Path(file_okay=False), default=None, help="Buffer + weights [default: RUN_DIR/swap].")
@click.option("--max-samples", type=click.IntRange(1), default=None, help="Stop after this many trajectories.")
@click.option("--loop/--no-loop", default=False, show_default=True, help="Cycle over the data until stopped.")
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=None, help="Stop after this many seconds.")
@click.option("--min-buffer", type=click.IntRange(1), default=8, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True, help="Inference batch.")
@click.option("--train-batch", type=click.IntRange(1), default=8, show_default=True, help="Trajectories per training step.")
@click.option("--publish-every", type=click.IntRange(1), default=2, show_default=True, help="Steps between versions.")
@click.option("--keep", type=click.IntRange(1), default=3, show_default=True, help="Versions kept on disk.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the worker command lines and exit.")
@click.pass_context
def pipeline(ctx: click.Context, target, draft, data, infer_gpus, train_gpus, preset, loss, length_head, alpha,
             kl_temperature, clip, lr, swap_dir, max_samples, loop, duration, min_buffer, batch_size, train_batch,
             publish_every, keep, max_new_tokens, temperature, dry_run) -> None:
    """Run the async on-policy pipeline: inference worker → swap buffer → training worker(s) → hot swap."""
    if ctx.invoked_subcommand is not None:
        return
    from adaflash.pipeline.inference import InferenceConfig
    from adaflash.pipeline.launch import Pipeline, parse_gpus
    from adaflash.pipeline.training import TrainingConfig
    from adaflash.workspace import runs_dir

    if not draft or not data:
        fail("--draft DIR and --data FILE are required (see `adaflash pipeline --help`)")
    if not Path(draft).is_dir():
        fail(f"--draft {draft}: no such drafter folder")
    if not Path(data).is_file():
        fail(f"--data {data}: no such file")
    chosen = dict(PRESETS[preset or "adaflash"])
    if loss:
        chosen["loss"] = loss
    if length_head is not None:
        chosen["length_head"] = length_head
    try:
        infer_list, train_list = parse_gpus(infer_gpus, "--infer-gpus"), parse_gpus(train_gpus, "--train-gpus")
    except ValueError as err:
        fail(str(err))
    workspace = workspace_of(ctx)
    log = runlog_of(ctx)
    method = preset or ("adaflash" if chosen["length_head"] else "osd")
    run_id = log.create_run("pipeline", method=method, target=target, draft=draft, dataset=data, status="pending")
    run_dir = runs_dir(workspace) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    swap = str(Path(swap_dir).resolve() if swap_dir else run_dir / "swap")
    device = lambda gpus: "cuda" if gpus else "cpu"  # noqa: E731  (CUDA_VISIBLE_DEVICES narrows it)
    infer = InferenceConfig(target=target, draft=str(Path(draft).resolve()), data=str(Path(data).resolve()), swap_dir=swap,
                            run_id=run_id, workspace=workspace, method="adaflash" if chosen["length_head"] else "dflash",
                            batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature,
                            max_samples=max_samples, loop=loop, duration=duration, device=device(infer_list))
    train = TrainingConfig(target=target, draft=str(Path(draft).resolve()), swap_dir=swap, run_id=run_id, workspace=workspace,
                           loss=chosen["loss"], alpha=alpha, kl_temperature=kl_temperature, clip=clip,
                           length_head=chosen["length_head"], lr=lr, min_buffer=min_buffer, train_batch=train_batch,
                           publish_every=publish_every, keep=keep, device=device(train_list))
    runner = Pipeline(log, run_id, run_dir, infer, train, infer_list, train_list)
    log.update_run(run_id, run_dir=str(run_dir), config={"preset": method, **chosen, "swap_dir": swap,
                                                         "infer_gpus": infer_gpus, "train_gpus": train_gpus,
                                                         "max_samples": max_samples, "loop": loop, "duration": duration})
    if dry_run:
        import shlex

        for role, command in runner.commands().items():
            click.echo(f"{role}: {shlex.join(command)}")
        log.finish_run(run_id, "finished", note="dry run")
        return
    log.update_run(run_id, status="running")
    click.echo(f"pipeline {run_id}: {method} (loss {chosen['loss']}, length head {chosen['length_head']}), "
               f"inference on {infer_gpus}, training on {train_gpus}; swap dir {swap}")
    previous = {sig: signal.signal(sig, lambda *_: runner.request_stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    runner.start()
    try:
        status = runner.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.finish_run(run_id, status)
    rows = tau_by_version(log, run_id)
    if rows:
        emit_rows(rows, ["drafter_version", "tau", "tokens_per_s", "samples"], "table", title=f"τ per drafter version ({run_id})")
    click.echo(f"pipeline {run_id} {status}")
    if status == "failed":
        raise SystemExit(1)


def tau_by_version(log, run_id: str) -> list[dict]:
    """Mean τ and throughput of the inference worker per drafter version, from the run log."""
    by_step: dict[int, dict[str, float]] = {}
    for row in log.metrics_since(0, run_id=run_id, names=["tau", "tokens_per_s", "drafter_version", "samples"]):
        by_step.setdefault(row["step"], {})[row["name"]] = row["value"]
    grouped: dict[int, list[dict[str, float]]] = {}
    for values in by_step.values():
        if "drafter_version" in values and "tau" in values:
            grouped.setdefault(int(values["drafter_version"]), []).append(values)
    return [{"drafter_version": v, "tau": sum(x["tau"] for x in xs) / len(xs),
             "tokens_per_s": sum(x["tokens_per_s"] for x in xs) / len(xs), "samples": int(max(x["samples"] for x in xs))}
            for v, xs in sorted(grouped.items())]


@pipeline.command("stop")
@click.argument("run_id")
@click.pass_context
def stop(ctx: click.Context, run_id: str) -> None:
    """Ask a running pipeline to stop cleanly (both workers finish their step and exit)."""
    from adaflash.pipeline.buffer import SwapBuffer

    log = runlog_of(ctx)
    try:
        run = log.get_run(run_id)
    except KeyError as err:
        fail(err.args[0])
    swap = (run.get("config") or {}).get("swap_dir")
    if run["kind"] != "pipeline" or not swap:
        fail(f"run {run['id']} is not a pipeline run")
    SwapBuffer(swap).request_stop()
    click.echo(f"stop requested for {run['id']} ({swap})")


@pipeline.command("status")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """τ per drafter version, buffer depth and the newest version of a pipeline run."""
    log = runlog_of(ctx)
    try:
        run = log.get_run(run_id)
    except KeyError as err:
        fail(err.args[0])
    rows = tau_by_version(log, run["id"])
    latest = log.last_metrics(run["id"])
    if as_json:
        click.echo(json.dumps({"run": run["id"], "status": run["status"], "versions": rows, "latest": latest}))
        return
    emit_rows(rows, ["drafter_version", "tau", "tokens_per_s", "samples"], "table", title=f"{run['id']} ({run['status']})")
    click.echo(f"buffer depth {latest.get('buffer_depth', 'N/A')}, published version {latest.get('published_version', 'N/A')}")
