"""Start the inference and training workers as subprocesses on their devices and see them through.

Each worker is started with `adaflash.procs.spawn` (its own process group, SIGTERM if the launcher
dies, which it takes as a stop request), its log file in the run folder and CUDA_VISIBLE_DEVICES
from its role's GPUs (`cpu` hides every GPU); several training GPUs mean a torchrun job. A stop
request (signal or `adaflash pipeline stop`) is a STOP file both workers watch, and the run then reads
`stopped` (as a stopped server does); a worker that does not exit within the grace period is killed
with its group. With a time budget the workers
stop on their own at the deadline (the trainers publish a final version); the launcher only
steps in, as for a stop request, when one of them is still running a grace period later.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from adaflash import procs
from adaflash.devices import child_devices
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.inference import InferenceConfig
from adaflash.pipeline.training import TrainingConfig
from adaflash.runlog import RunLog


def parse_gpus(value: str, flag: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """`cpu` ([]), or comma-separated GPU indices, as the CUDA_VISIBLE_DEVICES its worker gets: indices count
    the GPUs this process may see (`adaflash.devices`)."""
    return child_devices(value, flag, environ) or []


def worker_env(gpus: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def infer_command(cfg: InferenceConfig) -> list[str]:
    return [sys.executable, "-m", "adaflash.pipeline.worker", "infer", json.dumps(asdict(cfg))]


def train_command(cfg: TrainingConfig, gpus: list[str], procs: int | None = None) -> list[str]:
    """One process per training GPU (torchrun when several); `procs` CPU processes (gloo) on CPU."""
    payload = json.dumps(asdict(cfg))
    nproc = len(gpus) if gpus else (procs or 1)
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", "adaflash.pipeline.worker", "train", payload]
    return [sys.executable, "-m", "adaflash.pipeline.worker", "train", payload]


def worker_commands(infer: InferenceConfig, train: TrainingConfig, train_gpus: list[str],
                    train_procs: int | None = None) -> dict[str, list[str]]:
    """Each worker's command line (what `pipeline --dry-run` prints and `Pipeline.start` runs)."""
    return {"inference": infer_command(infer), "training": train_command(train, train_gpus, train_procs)}


class Pipeline:
    def __init__(self, log: RunLog, run_id: str, run_dir: Path, infer: InferenceConfig, train: TrainingConfig,
                 infer_gpus: list[str], train_gpus: list[str], grace: float = 60.0,
                 deadline: float | None = None, train_procs: int | None = None) -> None:
        self.log, self.run_id, self.run_dir = log, run_id, run_dir
        self.infer, self.train = infer, train
        self.infer_gpus, self.train_gpus = infer_gpus, train_gpus
        self.grace = grace
        self.deadline = deadline
        self.budget_grace = max(grace, 300.0)  # requests in flight at the deadline are finished first
        self.train_procs = train_procs
        self.procs: dict[str, procs.ProcessGroup] = {}
        self.note: str | None = None  # how the run ended, when not simply by running out of work
        self.job_ids: dict[str, int] = {}

    def commands(self) -> dict[str, list[str]]:
        return worker_commands(self.infer, self.train, self.train_gpus, self.train_procs)

    def start(self) -> None:
        buffer = SwapBuffer(self.infer.swap_dir)
        buffer.clear_stop()
        buffer.clear_done()  # a run resumed on an earlier swap dir: its producer is not done until it says so
        gpus = {"inference": self.infer_gpus, "training": self.train_gpus}
        for role, command in self.commands().items():
            log_path = self.run_dir / f"{role}.log"
            job = self.log.add_job(self.run_id, role, command, role=role, gpus=",".join(gpus[role]) or "cpu",
                                   log_path=str(log_path), status="starting")
            group = procs.spawn(command, log=log_path, env=worker_env(gpus[role]))
            self.procs[role], self.job_ids[role] = group, job
            self.log.update_job(job, pid=group.pid, pgid=group.pgid, pid_start_time=group.pid_start_time,
                                status="running", started_at=group.started_at)

    def request_stop(self) -> None:
        SwapBuffer(self.infer.swap_dir).request_stop()

    def wait(self, poll: float = 1.0) -> str:
        """Until both workers exit; a failed worker stops the other. Returns the run status.

        A user's stop request (`adaflash pipeline stop`, Ctrl-C, SIGTERM) ends the run `stopped`, as a stopped
        server reads: honoured by both workers, the buffer and the last version are consistent and `note` says
        so (the workers' jobs read `stopped` too); workers killed after the grace period leave it `stopped` with
        a note saying they were killed. A time budget reached is not a user's stop: that run reads `finished`.
        """
        status = "finished"
        budget_stop = False
        while any(p.alive() for p in self.procs.values()):
            if self.deadline is not None and not budget_stop and time.time() > self.deadline + self.budget_grace:
                budget_stop = True
                self.log.log_event(self.run_id, f"time budget passed {self.budget_grace:g}s ago and a worker is "
                                   "still running: asking both to stop", level="warning")
                self.request_stop()
            for role, proc in self.procs.items():
                code = proc.poll()
                if code is not None and code != 0 and status != "failed":
                    status = "failed"
                    tail = _tail(self.run_dir / f"{role}.log")
                    self.log.log_event(self.run_id, f"{role} worker failed with exit code {code}: {tail}", level="error",
                                       job=role)
                    self.request_stop()
            if SwapBuffer(self.infer.swap_dir).stop_requested():
                for proc in self.procs.values():
                    proc.ask_stop(None)  # the STOP file is the request; the grace counts from here
            killed = [proc.kill_if_overdue(self.grace) for proc in self.procs.values()]
            if any(killed) and status == "finished":
                status = "stopped"
                self.note = f"a worker did not stop within {self.grace:g}s of the stop request: killed"
            time.sleep(poll)
        # Read after the workers exited: they may honour a request between two polls of this loop. With no
        # failure and no budget stop, the STOP file is the user's (or a signal's) request.
        asked = status == "finished" and not budget_stop and SwapBuffer(self.infer.swap_dir).stop_requested()
        failed, ended = [], {}
        for role, proc in self.procs.items():
            proc.stop(grace=5.0)  # what a worker left in its group (a torchrun rank) goes with it
            code = proc.returncode
            ended[role] = (proc.ended_as(), code, time.time())
            if code != 0 and status != "stopped":
                failed.append(f"{role} worker exited with code {code} (its log: {self.run_dir / f'{role}.log'})")
        if failed:
            status, self.note = "failed", "; ".join(failed)
        elif asked:
            status = "stopped"
            self.note = "stopped on request: both workers finished their step, a final version published"
        for role, (how, code, at) in ended.items():
            how = "stopped" if status == "stopped" and how == "finished" else how  # the user's stop, honoured
            self.log.update_job(self.job_ids[role], status=how, exit_code=code, ended_at=at)
        return status


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
