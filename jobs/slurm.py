"""Slurm backend: one sbatch script per recipe run, submitted with `sbatch --parsable`, tracked
through `squeue` (while queued or running) and `sacct` (once it has left the queue).

Why a generated script and no scheduler of our own: Slurm already places, starts and cancels;
the script only replays the recipe's graph inside the allocation. Layout inside the job:
- the batch script runs on the first node; jobs start in dependency order, each in the
  background with its log at `<run_dir>/<job>.log`; a task's exit code lands in
  `<run_dir>/.slurm/<job>.exit`, a service's readiness in `<job>.ready` (the tracker on the
  submitting host reads these files from the shared filesystem and fills the run log);
- torchrun jobs span `nodes` nodes (default: all) through `srun`, one launcher per node, with
  `--rdzv_backend c10d --rdzv_endpoint $MASTER_ADDR:<rdzv_port>`;
- other jobs run on node `node` (default 0, the batch host; others through `srun -w`); the
  recipe's GPU indices count within the node's allocation (mapped through the allocation's
  CUDA_VISIBLE_DEVICES), so a server gets its own GPUs on its node;
- services stop when every task is done; the script exits 1 if a task failed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adaflash.runlog import RunLog
from jobs.argv import torchrun_tail
from jobs.plan import PreparedRun
from jobs.recipe_spec import Recipe, SlurmSpec
from jobs.runner import RunResult

SCRIPT_NAME = "sbatch.sh"
STATE_DIR = ".slurm"
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "REVOKED"}


class SlurmError(RuntimeError):
    pass


def _q(text: str) -> str:
    return shlex.quote(str(text))


def _job_argv(prepared: PreparedRun, name: str, python: str, slurm: SlurmSpec) -> list[str]:
    """The job's argv inside the allocation: torchrun jobs rendezvous over c10d across nodes."""
    spec = prepared.recipe.jobs[name]
    if spec.torchrun_nproc is None:
        return spec.argv(python)
    nodes = spec.nodes or slurm.nodes
    return [
        python, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={spec.torchrun_nproc}",
        "--rdzv_id=$SLURM_JOB_ID", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"$MASTER_ADDR:{slurm.rdzv_port}",
        *spec.torchrun_args, *torchrun_tail(spec.command, python),
    ]


def _shell_argv(argv: list[str]) -> str:
    """Quote an argv for bash; only the rendezvous arguments we generate keep `$VAR` expandable."""
    out = []
    for arg in argv:
        if arg.startswith("--rdzv_id=$SLURM_JOB_ID") or arg.startswith("$MASTER_ADDR:"):
            out.append(f'"{arg}"')
        else:
            out.append(_q(arg))
    return " ".join(out)


_PRELUDE = r'''
mkdir -p "$RUN_DIR/.slurm"
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
export MASTER_ADDR="${NODES[0]}"
IFS=, read -ra ALLOC_GPUS <<< "${CUDA_VISIBLE_DEVICES:-}"
FAILED=0

pick_gpus() {  # recipe indices (within the node's allocation) -> this allocation's device ids
  local out="" i
  for i in ${1//,/ }; do
    if [ ${#ALLOC_GPUS[@]} -gt 0 ]; then i="${ALLOC_GPUS[$i]}"; fi
    out="${out:+$out,}$i"
  done
  echo "$out"
}

wait_task() {  # job: wait for its exit code; a failure fails the whole script
  while [ ! -f "$RUN_DIR/.slurm/$1.exit" ]; do sleep "${ADAFLASH_SLURM_POLL:-2}"; done
  if [ "$(cat "$RUN_DIR/.slurm/$1.exit")" != 0 ]; then
    echo "adaflash: job $1 failed (exit $(cat "$RUN_DIR/.slurm/$1.exit"))" >&2
    exit 1
  fi
}

wait_ready_http() {  # job url timeout
  local deadline=$(( $(date +%s) + $3 ))
  until "$ADAFLASH_PYTHON" -c "import sys, urllib.request; sys.exit(urllib.request.urlopen(sys.argv[1], timeout=2).status != 200)" "$2" 2>/dev/null; do
    if [ -f "$RUN_DIR/.slurm/$1.exit" ] || [ "$(date +%s)" -ge "$deadline" ]; then
      echo "adaflash: job $1 not ready ($2)" >&2; exit 1
    fi
    sleep "${ADAFLASH_SLURM_POLL:-2}"
  done
  touch "$RUN_DIR/.slurm/$1.ready"
}

wait_ready_log() {  # job regex timeout
  local deadline=$(( $(date +%s) + $3 ))
  until grep -qE -- "$2" "$RUN_DIR/$1.log" 2>/dev/null; do
    if [ -f "$RUN_DIR/.slurm/$1.exit" ] || [ "$(date +%s)" -ge "$deadline" ]; then
      echo "adaflash: job $1 not ready (log /$2/)" >&2; exit 1
    fi
    sleep "${ADAFLASH_SLURM_POLL:-2}"
  done
  touch "$RUN_DIR/.slurm/$1.ready"
}

cleanup() {  # every job of this script shares its process group: stop them all, services included
  trap '' TERM INT
  kill -TERM 0 2>/dev/null
  wait
}
trap cleanup EXIT
trap 'exit 143' TERM INT
'''


def render_script(prepared: PreparedRun, *, python: str | None = None) -> str:
    """The sbatch script of a prepared run (pure: writes nothing)."""
    recipe = prepared.recipe
    slurm = recipe.slurm or SlurmSpec()
    python = slurm.python or python or _default_python()
    run_dir = prepared.run_dir
    head = ["#!/bin/bash", f"#SBATCH --job-name={slurm.job_name or 'adaflash-' + recipe.name}",
            f"#SBATCH --nodes={slurm.nodes}", "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --output={run_dir}/slurm-%j.out"]
    if slurm.gpus_per_node:
        head.append(f"#SBATCH --gpus-per-node={slurm.gpus_per_node}")
    for key, flag in (("partition", "partition"), ("account", "account"), ("time", "time"), ("qos", "qos"),
                      ("cpus_per_task", "cpus-per-task"), ("mem", "mem")):
        value = getattr(slurm, key)
        if value is not None:
            head.append(f"#SBATCH --{flag}={value}")
    head += [f"#SBATCH {flag}" for flag in slurm.sbatch]
    lines = head + [
        f"# generated by adaflash for recipe {recipe.name} ({recipe.path}), run {prepared.run_id}",
        "# Own session: the cleanup below signals this script's process group and nothing else.",
        'if [ -z "${ADAFLASH_IN_SESSION:-}" ]; then export ADAFLASH_IN_SESSION=1; exec setsid -w /bin/bash "$0" "$@"; fi',
        "set -o pipefail", *slurm.setup,
        f"export RUN_DIR={_q(run_dir)}", f"export ADAFLASH_WORKSPACE={_q(prepared.workspace)}",
        f"export ADAFLASH_RUN_ID={_q(prepared.run_id)}", f"export ADAFLASH_RUN_DIR={_q(run_dir)}",
        f"export ADAFLASH_PYTHON={_q(python)}", "export PYTHONUNBUFFERED=1",
        f"export MASTER_PORT={slurm.rdzv_port}", _PRELUDE,
    ]
    for name, spec in recipe.jobs.items():
        if spec.node >= slurm.nodes or (spec.nodes or 1) > slurm.nodes:
            raise SlurmError(f"job {name!r}: node {spec.node} / nodes {spec.nodes} do not fit the "
                             f"{slurm.nodes} node(s) of [slurm] (nodes count from 0)")
    tasks = []
    for name in recipe.order():
        spec = recipe.jobs[name]
        lines.append(f"# -- job {name} ({spec.kind}, GPUs {spec.gpus_label}) --")
        for dep in spec.after:
            dep_spec = recipe.jobs[dep]
            if dep_spec.kind == "task":
                lines.append(f"wait_task {_q(dep)}")
        env = " ".join(f"{k}={_q(v)}" for k, v in spec.env.items())
        env += f" ADAFLASH_JOB={_q(name)}"
        if spec.cuda_visible_devices is not None:
            visible = '""' if spec.gpus is None else f'"$(pick_gpus {spec.gpus_label})"'
            env += f" CUDA_VISIBLE_DEVICES={visible}"
        command = _shell_argv(_job_argv(prepared, name, python, slurm))
        if spec.torchrun_nproc is not None:
            nodes = spec.nodes or slurm.nodes
            launch = f"srun --overlap --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {command}"
        elif spec.node:
            launch = (f"srun --overlap --nodes=1 --ntasks=1 --nodelist=\"${{NODES[{spec.node}]}}\" "
                      f"{command}")
        else:
            launch = command
        cd = f"cd {_q(spec.cwd)} && " if spec.cwd else ""
        lines.append(
            f"( date +%s > \"$RUN_DIR/.slurm/{name}.started\"; {cd}env {env} {launch} "
            f">> \"$RUN_DIR/{name}.log\" 2>&1; echo $? > \"$RUN_DIR/.slurm/{name}.exit\" ) &"
        )
        if spec.kind == "service":
            if spec.ready is not None:
                if spec.ready.http:
                    lines.append(f"wait_ready_http {_q(name)} {_q(spec.ready.http)} {int(spec.ready.timeout)}")
                else:
                    lines.append(f"wait_ready_log {_q(name)} {_q(spec.ready.log or '')} {int(spec.ready.timeout)}")
            else:
                lines.append(f"touch \"$RUN_DIR/.slurm/{name}.ready\"")
        else:
            tasks.append(name)
        lines.append("")
    lines += [f"wait_task {_q(t)}" for t in tasks]
    lines += ["echo \"adaflash: every task finished\"", "exit 0", ""]
    return "\n".join(lines)


def _default_python() -> str:
    import sys

    return sys.executable


def write_script(prepared: PreparedRun, *, python: str | None = None) -> Path:
    prepared.run_dir.mkdir(parents=True, exist_ok=True)
    path = prepared.run_dir / SCRIPT_NAME
    path.write_text(render_script(prepared, python=python))
    path.chmod(0o755)
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} not found on PATH: is this a Slurm login node?")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def submit(script: str | os.PathLike) -> str:
    """`sbatch --parsable SCRIPT` -> the Slurm job id."""
    done = _run(["sbatch", "--parsable", str(script)])
    if done.returncode != 0:
        raise SlurmError(f"sbatch failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    job_id = done.stdout.strip().splitlines()[-1].split(";")[0].strip() if done.stdout.strip() else ""
    if not job_id.isdigit():
        raise SlurmError(f"sbatch gave no job id: {done.stdout.strip()!r}")
    return job_id


@dataclass
class SlurmState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... or UNKNOWN
    exit_code: int | None = None
    source: str = "squeue"

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def query(job_id: str) -> SlurmState:
    """squeue while the job is in the queue, then sacct."""
    queued = _run(["squeue", "-h", "-j", str(job_id), "-o", "%T"])
    state = queued.stdout.strip().split()[0] if queued.returncode == 0 and queued.stdout.strip() else ""
    if state:
        return SlurmState(str(job_id), state.upper(), None, "squeue")
    acct = _run(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "State,ExitCode"])
    for line in acct.stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        raw_state = parts[0].split()[0].upper() if parts[0].strip() else "UNKNOWN"
        code = None
        if len(parts) > 1 and ":" in parts[1]:
            head = parts[1].split(":")[0]
            code = int(head) if head.isdigit() else None
        return SlurmState(str(job_id), raw_state, code, "sacct")
    return SlurmState(str(job_id), "UNKNOWN", None, "none")


def cancel(job_id: str) -> None:
    done = _run(["scancel", str(job_id)])
    if done.returncode != 0:
        raise SlurmError(f"scancel failed: {done.stderr.strip()}")


class SlurmRun:
    """A recipe run on Slurm: submit the script, record the run, follow it into the run log."""

    def __init__(self, prepared: PreparedRun, runlog: RunLog, *, python: str | None = None) -> None:
        self.prepared = prepared
        self.runlog = runlog
        self.python = python
        self.job_id: str | None = None
        self.job_rows: dict[str, int] = {}

    @classmethod
    def resume(cls, runlog: RunLog, run_id: str) -> SlurmRun:
        """A tracker for a run submitted earlier (e.g. with --detach), to follow it again."""
        run = runlog.get_run(run_id)
        config = run["config"]
        if not isinstance(config, dict) or config.get("backend") != "slurm":
            raise SlurmError(f"run {run['id']} was not submitted to Slurm")
        recipe = Recipe.from_dict(config)
        workspace = Path(recipe.context.get("workspace") or runlog.path.parent)
        tracker = cls(PreparedRun(recipe, run["id"], Path(run["run_dir"]), workspace), runlog)
        tracker.job_id = str(config["slurm_job_id"])
        tracker.job_rows = {j["name"]: j["id"] for j in runlog.jobs(run["id"])}
        return tracker

    def submit(self) -> str:
        script = write_script(self.prepared, python=self.python)
        self.job_id = submit(script)
        recipe = self.prepared.recipe
        config = {**recipe.to_dict(), "backend": "slurm", "slurm_job_id": self.job_id}
        self.runlog.create_run("recipe", name=recipe.name, config=config, run_dir=str(self.prepared.run_dir),
                               run_id=self.prepared.run_id, status="running")
        self.runlog.update_run(self.prepared.run_id, note=f"slurm job {self.job_id}")
        (self.prepared.run_dir / "slurm.json").write_text(json.dumps({"job_id": self.job_id, "script": str(script)}))
        for name in recipe.order():
            spec = recipe.jobs[name]
            self.job_rows[name] = self.runlog.add_job(
                self.prepared.run_id, name, _job_argv(self.prepared, name, self.python or _default_python(),
                                                      recipe.slurm or SlurmSpec()),
                role=spec.role, gpus=spec.gpus_label, log_path=str(self.prepared.run_dir / f"{name}.log"))
        self.runlog.log_event(self.prepared.run_id, f"submitted to Slurm as job {self.job_id}")
        return self.job_id

    def _sync_jobs(self) -> None:
        """Job rows from the marker files the script writes on the shared filesystem."""
        folder = self.prepared.run_dir / STATE_DIR
        for name, job_id in self.job_rows.items():
            spec = self.prepared.recipe.jobs[name]
            exit_file, started, ready = folder / f"{name}.exit", folder / f"{name}.started", folder / f"{name}.ready"
            fields: dict[str, Any] = {}
            if exit_file.exists():
                text = exit_file.read_text().strip()
                code = int(text) if text.lstrip("-").isdigit() else None
                ok = code == 0 and spec.kind == "task"
                fields = {"status": "finished" if ok else ("stopped" if spec.kind == "service" and code in (0, 143)
                                                           else "failed"),
                          "exit_code": code, "ended_at": exit_file.stat().st_mtime}
            elif ready.exists():
                fields = {"status": "ready"}
            elif started.exists():
                fields = {"status": "running", "started_at": started.stat().st_mtime}
            if fields:
                self.runlog.update_job(job_id, **fields)

    def poll(self) -> SlurmState:
        assert self.job_id is not None
        state = query(self.job_id)
        self._sync_jobs()
        return state

    def track(self, *, interval: float = 10.0, on_tick: Callable[[SlurmState], None] | None = None) -> RunResult:
        """Follow the Slurm job until it leaves the queue; the run ends finished, failed or stopped."""
        while True:
            state = self.poll()
            if on_tick:
                on_tick(state)
            if state.done or state.state == "UNKNOWN":
                break
            time.sleep(interval)
        status = {"COMPLETED": "finished", "CANCELLED": "stopped"}.get(state.state, "failed")
        note = f"slurm job {self.job_id}: {state.state}" + (
            f" (exit {state.exit_code})" if state.exit_code is not None else "")
        self.runlog.finish_run(self.prepared.run_id, status, note=note)
        failed = [r["name"] for r in self.runlog.jobs(self.prepared.run_id) if r["status"] == "failed"]
        return RunResult(self.prepared.run_id, status, failed, note)
