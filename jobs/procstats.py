"""The processes of a run's jobs, nvitop-style: CPU %, RSS, GPU memory and utilization, uptime.

Why a sampler object: psutil's CPU % compares with the previous reading of the same Process object,
so the objects live between samples (keyed by pid and create time, so a reused pid is a new process).
A job's row counts its leader and the descendants that are not themselves a listed job (a recipe's
pipeline job is not billed for the worker rows shown below it). GPU figures come from the inventory's
snapshot (one NVML pass); absent NVML they are None, formatted N/A.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from adaflash import procs
from jobs.gpus import ACTIVE_JOB_STATUSES

SORT_KEYS = ("pid", "role", "cpu", "rss", "gpu_mem", "gpu_util", "uptime", "status")


@dataclass(frozen=True)
class ProcRow:
    key: str  # run id : job id
    run_id: str
    job: str  # as the supervisor knows it
    label: str  # as shown: a child run's job is prefixed by the job that created the run
    controllable: bool  # a job of the run itself (a child run's job is stopped through its parent job)
    role: str
    status: str  # the run log's job status, or "gone" for a live job whose process is not there
    pid: int | None
    alive: bool
    cpu: float | None = None  # percent of one core, summed over the job's processes
    rss: int | None = None  # bytes
    gpu_mem: int | None = None  # bytes
    gpu_util: float | None = None  # percent (SM), summed over its GPU processes
    started: float | None = None
    processes: int = 0

    def uptime(self, now: float | None = None) -> float | None:
        return max(0.0, (now or time.time()) - self.started) if self.started and self.alive else None

    def sort_value(self, key: str, now: float) -> Any:
        """The value a column sorts by (None sorts last, whichever way)."""
        return {"pid": self.pid, "role": self.role or None, "cpu": self.cpu, "rss": self.rss, "gpu_mem": self.gpu_mem,
                "gpu_util": self.gpu_util, "uptime": self.uptime(now), "status": self.status}[key]


def sort_rows(rows: list[ProcRow], key: str, reverse: bool = False, now: float | None = None) -> list[ProcRow]:
    now = now or time.time()
    present = [r for r in rows if r.sort_value(key, now) is not None]
    absent = [r for r in rows if r.sort_value(key, now) is None]
    return sorted(present, key=lambda r: r.sort_value(key, now), reverse=reverse) + absent


class ProcessSampler:
    """Samples the processes of jobs; keep one per view (CPU % needs the previous sample)."""

    def __init__(self) -> None:
        self._procs: dict[tuple[int, float], psutil.Process] = {}

    def _process(self, pid: int) -> psutil.Process | None:
        try:
            fresh = psutil.Process(pid)
            key = (pid, fresh.create_time())
        except psutil.Error:
            return None
        known = self._procs.get(key)
        if known is None:
            known = self._procs[key] = fresh
            try:
                known.cpu_percent(None)  # the first reading only starts the count
            except psutil.Error:
                return None
        return known

    def sample(self, jobs: Iterable[tuple[str, str, bool, dict[str, Any]]], gpu_processes: Iterable[Any] = ()
               ) -> list[ProcRow]:
        """One row per job with a recorded pid: (run id, label, controllable, job row) each."""
        gpu = {p.pid: p for p in gpu_processes}
        jobs = [j for j in jobs if j[3].get("pid")]
        leaders = {int(j[3]["pid"]) for j in jobs if procs.is_ours(j[3]["pid"], j[3].get("pid_start_time"))}
        rows = []
        for run_id, label, controllable, job in jobs:
            pid = int(job["pid"])
            base = dict(key=f"{run_id}:{job['id']}", run_id=run_id, job=job["name"], label=label,
                        controllable=controllable, role=job.get("role") or "", pid=pid)
            status = job.get("status") or ""
            leader = self._process(pid) if pid in leaders else None
            if leader is None:
                rows.append(ProcRow(**base, status="gone" if status in ACTIVE_JOB_STATUSES else status, alive=False))
                continue
            members = [leader, *self._descendants(leader, leaders - {pid})]
            cpu = rss = 0.0
            for member in members:
                try:
                    cpu += member.cpu_percent(None)
                    rss += member.memory_info().rss
                except psutil.Error:
                    continue
            mine = [gpu[m.pid] for m in members if m.pid in gpu]
            mem = [p.used_memory for p in mine if p.used_memory is not None]
            util = [p.sm_utilization for p in mine if getattr(p, "sm_utilization", None) is not None]
            rows.append(ProcRow(**base, status=status, alive=True, cpu=cpu, rss=int(rss),
                                gpu_mem=sum(mem) if mem else None, gpu_util=sum(util) if util else None,
                                started=leader.create_time(), processes=len(members)))
        self._forget()
        return rows

    def _descendants(self, leader: psutil.Process, others: set[int]) -> list[psutil.Process]:
        """The leader's descendants, less the subtrees of other listed jobs."""
        out, todo = [], [leader]
        while todo:
            try:
                children = todo.pop().children()
            except psutil.Error:
                continue
            for child in children:
                if child.pid in others:
                    continue
                known = self._process(child.pid)
                if known is not None:
                    out.append(known)
                    todo.append(known)
        return out

    def _forget(self) -> None:
        """Drop Process objects of processes gone (their pids may come back as others)."""
        for key in [k for k in self._procs if not procs.is_ours(k[0], k[1])]:
            del self._procs[key]
