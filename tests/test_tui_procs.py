"""The Processes tab (nvitop-style): the run's workers with CPU, RSS, GPU memory and utilization read in a
worker thread, N/A where NVML gives nothing, a sort that cycles, and a stop that asks first and goes
through `jobs` as the Jobs tab's does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from adaflash.runlog import RunLog
from jobs.gpus import GpuInfo, GpuProcess, HostInfo, Snapshot
from jobs.procstats import ProcessSampler, ProcRow, sort_rows
from tests.test_tui_fixtures import RECIPE_RUN, FakeInventory, fill_runlog, screen_text, settle, wait_for
from tests.test_tui_flows import SIZE, make_app
from tui.modals import ConfirmScreen
from tui.panes.procs import cells


class OneGpu:
    """A GPU whose one process is `pid` (2 GiB, 55 % of the SMs)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def snapshot(self) -> Snapshot:
        proc = GpuProcess(self.pid, "python", 2 * 2**30, "compute", None, 55.0)
        gpu = GpuInfo(index=0, name="NVIDIA H100", memory_used=3 * 2**30, memory_total=80 * 2**30,
                      utilization=60.0, processes=[proc])
        return Snapshot(True, None, [gpu], HostInfo(10.0, 16, 2**30, 2**34, 6.0))


@pytest.fixture()
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _live_run(ws: Path, pid: int) -> str:
    log = RunLog.open(ws)
    run_id = log.create_run("recipe", name="live", status="running")
    job = log.add_job(run_id, "server", ["python"], role="server", gpus="0", status="pending")
    log.update_job(job, status="running", pid=pid, pgid=pid, pid_start_time=psutil.Process(pid).create_time(),
                   started_at=psutil.Process(pid).create_time())
    return run_id


def test_rows_sort_with_missing_values_last_and_format_as_na() -> None:
    rows = [ProcRow("a", "r", "a", "a", True, "", "finished", 1, False),
            ProcRow("b", "r", "b", "b", True, "x", "running", 2, True, cpu=50.0, rss=2**30, started=1.0),
            ProcRow("c", "r", "c", "c", True, "y", "running", 3, True, cpu=5.0, rss=2**20, started=2.0)]
    assert [r.key for r in sort_rows(rows, "cpu", reverse=True)] == ["b", "c", "a"]
    assert [r.key for r in sort_rows(rows, "cpu")] == ["c", "b", "a"]
    assert [r.key for r in sort_rows(rows, "pid", reverse=True)] == ["c", "b", "a"]
    shown = cells(rows[0], now=10.0)
    assert (shown["cpu"], shown["rss"], shown["gpu_mem"], shown["gpu_util"], shown["uptime"]) == ("N/A",) * 5


def test_the_sampler_reads_a_live_job_and_its_gpu_share(sleeper) -> None:
    job = {"id": 1, "name": "server", "role": "server", "status": "running", "pid": sleeper.pid,
           "pid_start_time": psutil.Process(sleeper.pid).create_time()}
    gone = {"id": 2, "name": "old", "status": "running", "pid": 999_999_9, "pid_start_time": 1.0}
    gpu = [GpuProcess(sleeper.pid, "python", 2**30, "compute", None, 40.0)]
    sampler = ProcessSampler()
    live, dead = sampler.sample([("r", "server", True, job), ("r", "old", True, gone)], gpu)
    assert live.alive and live.rss and live.rss > 0 and live.cpu is not None and live.processes == 1
    assert (live.gpu_mem, live.gpu_util) == (2**30, 40.0)
    assert not dead.alive and dead.status == "gone" and dead.cpu is None


async def test_the_processes_tab_shows_sorts_and_stops_after_a_confirmation(tmp_path: Path, sleeper,
                                                                            monkeypatch) -> None:
    ws = tmp_path / "ws"
    run_id = _live_run(ws, sleeper.pid)
    app = make_app(ws, inventory=OneGpu(sleeper.pid), live=False, run_id=run_id, tab="procs")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        procs = app.pane("procs")
        await wait_for(pilot, lambda: procs.rows and procs.rows[0].alive, 10, "the process row")
        app.snapshot = OneGpu(sleeper.pid).snapshot()  # as the GPUs tab hands it over
        procs.refresh_data()
        await wait_for(pilot, lambda: procs.rows[0].gpu_mem is not None, 10, "the GPU figures")
        text = screen_text(app)
        assert str(sleeper.pid) in text and "2.0 GiB" in text and "55%" in text and "running" in text
        assert procs.sort_key == "cpu" and procs.reverse
        await pilot.press("o")
        assert procs.sort_key == "rss" and "sorted by RSS ▼" in screen_text(app)
        await pilot.press("O")
        assert not procs.reverse and "sorted by RSS ▲" in screen_text(app)
        calls = []
        monkeypatch.setattr(app.backend, "job_action", lambda *args: calls.append(args) or "stop of job requested")
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 10, "the dialog closed")
        assert calls == []
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: bool(calls), 10, "the stop request")
        assert calls == [(run_id, "stop", "server")]


async def test_without_nvml_the_gpu_columns_read_na_and_ended_jobs_cannot_be_stopped(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=RECIPE_RUN, tab="procs")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        procs = app.pane("procs")
        await wait_for(pilot, lambda: len(procs.rows) == 5, 10, "the rows")
        app.snapshot = FakeInventory(available=False).snapshot()
        procs.redraw()
        await pilot.pause()
        text = screen_text(app)
        assert "N/A" in text and "GPU: N/A (NVIDIA driver" in text
        await pilot.press("s")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("nothing to stop" in n.message or "created" in n.message for n in app._notifications)


def test_nvml_per_process_utilization_or_na_when_nvml_cannot_give_it() -> None:
    """One NVML pass gives each GPU process its SM share; a driver without the call leaves it None."""
    import types

    from jobs import gpus
    from tests.test_jobs_gpus import make_fake_nvml

    nvml = make_fake_nvml({0: [(4242, 2**30)], 1: [(4343, 2**30)]})
    nvml.nvmlDeviceGetProcessUtilization = lambda h, since: (
        [types.SimpleNamespace(pid=4242, smUtil=37, memUtil=5)] if h == 0 else (_ for _ in ()).throw(RuntimeError()))
    snap = gpus.snapshot(nvml=nvml, cpu_interval=None)
    assert snap.gpus[0].processes[0].sm_utilization == 37.0
    assert snap.gpus[1].processes[0].sm_utilization is None  # Not Supported: N/A, not a crash
    assert snap.to_dict()["gpus"][0]["processes"][0]["sm_utilization"] == 37.0
