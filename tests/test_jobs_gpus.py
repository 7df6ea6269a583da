"""GPU inventory: a fake NVML for the GPU path, the real no-driver path of this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from adaflash.procs import start_time
from adaflash.runlog import RunLog
from jobs import gpus


class FakeNVMLError(Exception):
    pass


def make_fake_nvml(processes: dict[int, list[tuple[int, int | None]]], *, broken_power: bool = True,
                   count: int = 2) -> types.ModuleType:
    """A pynvml stand-in: 2 GPUs; GPU 1 cannot report power (N/A must not crash)."""
    calls = {"init": 0, "shutdown": 0}
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = FakeNVMLError
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.calls = calls

    def init() -> None:
        calls["init"] += 1

    def shutdown() -> None:
        calls["shutdown"] += 1

    def power(handle: int) -> int:
        if broken_power and handle == 1:
            raise FakeNVMLError("Not Supported")
        return 250_000 + handle

    nvml.nvmlInit = init
    nvml.nvmlShutdown = shutdown
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    nvml.nvmlSystemGetCudaDriverVersion = lambda: 12040
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h}"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30, total=141 * 2**30,
                                                                    free=0)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h, memory=10)
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 50 + h
    nvml.nvmlDeviceGetPowerUsage = power
    nvml.nvmlDeviceGetEnforcedPowerManagementLimit = lambda h: 700_000
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in processes.get(h, [])
    ]

    def graphics(h: int) -> list:
        raise FakeNVMLError("Not Supported")

    nvml.nvmlDeviceGetGraphicsRunningProcesses = graphics
    return nvml


def test_no_driver_here_is_reported_plainly_and_offers_cpu() -> None:
    snap = gpus.snapshot()
    if snap.available:  # pragma: no cover - only on a machine with a driver
        pytest.skip("this machine has NVIDIA GPUs")
    assert snap.gpus == [] and snap.reason and snap.choices() == ["cpu"]
    assert snap.host.memory_total and snap.host.cpu_count
    data = snap.to_dict()
    assert data["available"] is False and data["choices"] == ["cpu"] and "host" in data


def test_zero_gpus_and_failing_init_are_not_crashes() -> None:
    empty = gpus.snapshot(nvml=make_fake_nvml({}, count=0))
    assert not empty.available and empty.reason == "no NVIDIA GPU found"
    broken = make_fake_nvml({})

    def fail() -> None:
        raise FakeNVMLError("Driver Not Loaded")

    broken.nvmlInit = fail
    snap = gpus.snapshot(nvml=broken)
    assert not snap.available and "Driver Not Loaded" in snap.reason


def test_fake_gpus_with_processes_mapped_to_jobs_through_ancestors(tmp_path: Path) -> None:
    # A job (the leader) with a worker child: the GPU sees the child, the run log knows the leader.
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
         "print(c.pid, flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        child_pid = int(leader.stdout.readline())
        log = RunLog.open(tmp_path / "ws")
        run_id = log.create_run("recipe", name="fake")
        job_id = log.add_job(run_id, "pipeline", ["x"], gpus="0", status="running")
        log.update_job(job_id, pid=leader.pid, pgid=leader.pid, pid_start_time=start_time(leader.pid))
        stranger = os.getpid()  # on the GPU but not an adaflash job
        nvml = make_fake_nvml({0: [(child_pid, 3 * 2**30), (stranger, None)], 1: [(leader.pid, 2**63 + 5)]})
        with gpus.Inventory(nvml=nvml, runlog=log) as inventory:
            snap = inventory.snapshot()
            snap2 = inventory.snapshot()
        assert nvml.calls == {"init": 1, "shutdown": 1}  # NVML stays open between snapshots
        assert snap.available and snap.driver_version == "550.54.15" and snap.cuda_driver_version == "12.4"
        assert snap.choices() == ["0", "1", "cpu"] and len(snap2.gpus) == 2
        g0, g1 = snap.gpus
        assert (g0.name, g0.uuid, g0.memory_used, g0.utilization, g0.temperature) == (
            "NVIDIA H200", "GPU-fake-0", 2**30, 40, 50)
        assert g0.power == 250.0 and g0.power_limit == 700.0
        assert g1.power is None  # the failing field is N/A, the rest is there
        by_pid = {p.pid: p for p in g0.processes}
        assert by_pid[child_pid].job.job == "pipeline" and by_pid[child_pid].job.run_id == run_id
        assert by_pid[child_pid].used_memory == 3 * 2**30
        assert by_pid[stranger].job is None and by_pid[stranger].used_memory is None
        assert g1.processes[0].used_memory is None  # NVML's "not available" sentinel
        json.dumps(snap.to_dict())  # serializable as is
        # A recorded pid whose create time does not match is not ours: no mapping.
        log.update_job(job_id, pid_start_time=1.0)
        assert gpus.snapshot(log, make_fake_nvml({0: [(child_pid, 1)]})).gpus[0].processes[0].job is None
    finally:
        for proc in __import__("psutil").Process(leader.pid).children(recursive=True):
            proc.kill()
        leader.kill()
        leader.wait()


def test_gpus_command_json_with_a_fake_nvml(tmp_path: Path) -> None:
    # The CLI path: a fake pynvml module first on sys.path of the child process.
    fake_dir = tmp_path / "fake"
    fake_dir.mkdir()
    (fake_dir / "pynvml.py").write_text(
        "class NVMLError(Exception):\n    pass\n"
        "import types\n"
        "NVML_TEMPERATURE_GPU = 0\n"
        "def nvmlInit(): pass\n"
        "def nvmlShutdown(): pass\n"
        "def nvmlDeviceGetCount(): return 1\n"
        "def nvmlSystemGetDriverVersion(): return '550'\n"
        "def nvmlDeviceGetHandleByIndex(i): return i\n"
        "def nvmlDeviceGetName(h): return 'NVIDIA H200'\n"
        "def nvmlDeviceGetMemoryInfo(h): return types.SimpleNamespace(used=1, total=2)\n"
        "def nvmlDeviceGetTemperature(h, s): raise NVMLError('Not Supported')\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{fake_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "adaflash.cli.main", "--workspace", str(tmp_path / "ws"),
                           "gpus", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["available"] and data["gpus"][0]["name"] == "NVIDIA H200"
    assert data["gpus"][0]["temperature"] is None and data["gpus"][0]["utilization"] is None
    table = subprocess.run([sys.executable, "-m", "adaflash.cli.main", "gpus"], capture_output=True, text=True,
                           env=env, timeout=60, cwd=tmp_path)
    assert table.returncode == 0 and "NVIDIA H200" in table.stdout and "N/A" in table.stdout
    assert not (tmp_path / "adaflash-workspace").exists()  # looking at GPUs creates no workspace


def test_gpus_command_without_driver_says_so() -> None:
    done = subprocess.run([sys.executable, "-m", "adaflash.cli.main", "gpus"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    if "No NVIDIA GPU available" not in done.stdout:  # pragma: no cover - a machine with GPUs
        pytest.skip("this machine has NVIDIA GPUs")
    assert "cpu" in done.stdout and "host: CPU" in done.stdout
