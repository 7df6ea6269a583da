"""`adaflash gpus`: every GPU, its processes and their adaflash jobs, and the host's CPU/RAM."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from adaflash.cli.groups import Output, use, uses
from adaflash.options import JobConfig, RunsConfig


def _runlog_if_any(ctx: click.Context) -> Any:
    """The workspace's run log when it exists (looking at GPUs never creates a workspace)."""
    from adaflash.runlog import RunLog
    from adaflash.workspace import DEFAULT_WORKSPACE, WORKSPACE_ENV

    root = ctx.find_root()
    raw = (root.obj or {}).get("workspace") or os.environ.get(WORKSPACE_ENV) or DEFAULT_WORKSPACE
    path = Path(raw).expanduser().resolve() / "runlog.sqlite"
    return RunLog(path) if path.exists() else None


def render_snapshot(snap: Any) -> Any:
    """A rich renderable of a jobs.gpus.Snapshot."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from jobs.gpus import fmt_bytes, fmt_num

    host = snap.host
    host_line = Text(
        f"host: CPU {fmt_num(host.cpu_percent, '%')} of {host.cpu_count or 'N/A'} cores, "
        f"RAM {fmt_bytes(host.memory_used)} / {fmt_bytes(host.memory_total)} ({fmt_num(host.memory_percent, '%')})"
    )
    if not snap.available:
        return Group(
            Text(f"No NVIDIA GPU available: {snap.reason}.", style="yellow"),
            Text("Workers can run on CPU: assign \"cpu\" to a role (e.g. --infer-gpus cpu)."),
            host_line,
        )
    table = Table(title=f"GPUs (driver {snap.driver_version or 'N/A'}, CUDA {snap.cuda_driver_version or 'N/A'})",
                  title_justify="left")
    for column in ("GPU", "name", "memory", "util", "temp", "power", "processes"):
        table.add_column(column, overflow="fold")
    for gpu in snap.gpus:
        mem = f"{fmt_bytes(gpu.memory_used)} / {fmt_bytes(gpu.memory_total)}"
        if gpu.memory_percent is not None:
            mem += f" ({gpu.memory_percent:.0f}%)"
        power = fmt_num(gpu.power, " W")
        if gpu.power_limit is not None:
            power += f" / {gpu.power_limit:.0f} W"
        processes = "\n".join(
            f"{p.pid} {p.name or '?'} {fmt_bytes(p.used_memory)}"
            + (f" [job {p.job.job} of {p.job.run_id}]" if p.job else "")
            for p in gpu.processes
        ) or "-"
        table.add_row(str(gpu.index), gpu.name or "N/A", mem, fmt_num(gpu.utilization, "%"),
                      fmt_num(gpu.temperature, " C"), power, processes)
    return Group(table, host_line)


@click.command("gpus")
@uses(Output(("table", "json"), help="table, or json: the snapshot (with --watch: one line each)."),
      use(JobConfig, only=("interval",), notes={"interval": "With --watch."}), use(RunsConfig, only=("watch",)),
      command="gpus")
@click.pass_context
def gpus(ctx: click.Context, output: str, job: JobConfig, runs: RunsConfig) -> None:
    """GPUs (memory, utilization, temperature, power, processes and their adaflash jobs) and host CPU/RAM.

    A machine without NVIDIA GPUs or driver says so and offers `cpu`.
    """
    from rich.console import Console

    from jobs.gpus import Inventory

    as_json, interval, watch = output == "json", job.interval, runs.watch

    console = Console()
    runlog = _runlog_if_any(ctx)
    with Inventory(runlog=runlog) as inventory:
        if not watch:
            snap = inventory.snapshot(cpu_interval=0.1)
            if as_json:
                click.echo(json.dumps(snap.to_dict(), indent=2))
            else:
                console.print(render_snapshot(snap))
            return
        try:
            if as_json:
                while True:
                    click.echo(json.dumps(inventory.snapshot().to_dict()))
                    time.sleep(interval)
            from rich.live import Live

            with Live(render_snapshot(inventory.snapshot(cpu_interval=0.1)), console=console,
                      auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(render_snapshot(inventory.snapshot()), refresh=True)
        except KeyboardInterrupt:
            return
