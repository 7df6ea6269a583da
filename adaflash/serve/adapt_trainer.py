"""The trainer beside an adapting server: the pipeline's training worker as a supervised subprocess.

Why a subprocess: training must never stall the engine thread, and a crash (or `kill -9`) of the
trainer must leave the server serving the version it has. The trainer resumes from the newest
published version that passes its checksums, right after the samples that version consumed, so a
restart learns nothing twice. A trainer that dies is started again after a back-off (1, 2, 4 ... 60 s);
after `max_restarts` deaths in a row, each within a minute of its start, the server gives up on it,
says so, and keeps serving.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from adaflash import procs
from adaflash.pipeline.launch import train_command, worker_env
from adaflash.pipeline.training import TrainingConfig
from adaflash.runlog import RunLog

QUICK_DEATH = 60.0  # seconds: a trainer that dies sooner counts towards giving up


class TrainerProcess:
    def __init__(self, cfg: TrainingConfig, gpus: list[str], log: RunLog, run_id: str, log_path: Path, *,
                 max_restarts: int = 5) -> None:
        self.cfg, self.gpus, self.log, self.run_id, self.log_path = cfg, gpus, log, run_id, log_path
        self.max_restarts = max_restarts
        self.group: procs.ProcessGroup | None = None
        self.job_id: int | None = None
        self.restarts = 0
        self.quick_deaths = 0
        self.started_at = 0.0
        self.retry_at: float | None = None
        self.last_exit: int | None = None
        self.status = "starting"
        self.stopping = False
        # check() runs on the adapt thread, halt()/restart() also on a rollback request's: one at a time,
        # or a check could take the trainer a restart just started for dead and start a second one
        self.lock = threading.RLock()

    @property
    def command(self) -> list[str]:
        return train_command(self.cfg, self.gpus)

    def start(self) -> None:
        with self.lock:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            if self.job_id is None:
                self.job_id = self.log.add_job(self.run_id, "training", self.command, role="training",
                                               gpus=",".join(self.gpus) or "cpu", log_path=str(self.log_path),
                                               status="starting")
            self.group = procs.spawn(self.command, log=self.log_path, env=worker_env(self.gpus))
            self.started_at, self.status, self.retry_at = time.time(), "running", None
            self.log.update_job(self.job_id, pid=self.group.pid, pgid=self.group.pgid,
                                pid_start_time=self.group.pid_start_time, status="running",
                                started_at=self.group.started_at, restarts=self.restarts)

    def check(self) -> str | None:
        """Restart a dead trainer when its back-off has passed; returns what happened, for the event log."""
        with self.lock:
            if self.stopping or self.group is None or self.status == "failed":
                return None
            if self.retry_at is not None:
                if time.time() < self.retry_at:
                    return None
                self.restarts += 1
                self.start()
                return f"trainer restarted (restart {self.restarts}); it resumes from the newest valid version"
            code = self.group.poll()
            if code is None:
                return None
            self.group.stop(grace=1.0)  # a torchrun rank it left behind goes with it
            self.last_exit = code
            self.quick_deaths = self.quick_deaths + 1 if time.time() - self.started_at < QUICK_DEATH else 1
            self.log.update_job(self.job_id, status="failed", exit_code=code, ended_at=time.time())
            if self.quick_deaths > self.max_restarts:
                self.status = "failed"
                return (f"trainer exited with code {code} {self.quick_deaths} times in a row within a minute of "
                        f"starting: not restarted, serving goes on with the current drafter (its log: {self.log_path})")
            delay = min(60.0, 2.0 ** (self.quick_deaths - 1))
            self.retry_at, self.status = time.time() + delay, "restarting"
            return f"trainer exited with code {code}; restarting in {delay:g} s (its log: {self.log_path})"

    def halt(self) -> None:
        """End the trainer now with SIGKILL (it must not publish again), without a restart."""
        with self.lock:
            if self.group is None or not self.group.alive():
                return
            self.group.kill()
            self.group.wait(timeout=30)
            self.group.stop(grace=1.0)  # a torchrun rank it left behind goes with it
            self.last_exit = self.group.returncode

    def restart(self, cfg: TrainingConfig) -> None:
        """Start the trainer anew with `cfg` (halting it first); one not started yet only takes the config."""
        with self.lock:
            self.cfg = cfg
            if self.group is None or self.stopping or self.status == "failed":
                return
            self.halt()
            self.quick_deaths, self.restarts = 0, self.restarts + 1
            self.start()

    def stop(self, grace: float) -> None:
        """After the STOP file is written: wait for its final version, then end its group."""
        with self.lock:
            self.stopping = True
            if self.group is None:
                return
            deadline = time.time() + grace
            while self.group.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            self.group.stop(grace=5.0)
            code = self.group.returncode
            self.status = "stopped"
            if self.job_id is not None:
                self.log.update_job(self.job_id, status="finished" if code == 0 else "failed", exit_code=code,
                                    ended_at=time.time())

    def info(self) -> dict[str, Any]:
        return {"status": self.status, "pid": self.group.pid if self.group else None, "restarts": self.restarts,
                "last_exit_code": self.last_exit, "log": str(self.log_path)}
