"""GPU inventory: one NVML pass per snapshot, processes mapped to adaflash jobs, host CPU/RAM.

Why this shape (after nvitop's api/): the TUI refreshes often, so one snapshot = one walk over
the devices with every field read once; a field that NVML cannot give (old driver, MIG, no
permission) is None and formats as N/A, never a crash. A machine without the driver or without
GPUs yields `available=False` with the reason, and `cpu` is always offered as a placement.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

import psutil

from adaflash import procs

ACTIVE_JOB_STATUSES = ("starting", "running", "ready", "restarting")


@dataclass
class JobRef:
    """The adaflash job a GPU process belongs to."""

    run_id: str
    job: str
    job_id: int
    pid: int  # the job's recorded (leader) pid: the process itself or one of its ancestors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GpuProcess:
    pid: int
    name: str | None
    used_memory: int | None  # bytes
    kind: str  # "compute" | "graphics"
    job: JobRef | None = None
    sm_utilization: float | None = None  # percent of the GPU's SMs, recent samples (None: NVML gives none)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["job"] = self.job.to_dict() if self.job else None
        return out


@dataclass
class GpuInfo:
    index: int
    name: str | None = None
    uuid: str | None = None
    memory_used: int | None = None  # bytes
    memory_total: int | None = None  # bytes
    utilization: float | None = None  # percent
    memory_utilization: float | None = None  # percent (memory controller busy)
    temperature: float | None = None  # Celsius
    power: float | None = None  # watts
    power_limit: float | None = None  # watts
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def memory_percent(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return 100.0 * self.memory_used / self.memory_total

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["processes"] = [p.to_dict() for p in self.processes]
        out["memory_percent"] = self.memory_percent
        return out


@dataclass
class HostInfo:
    cpu_percent: float | None
    cpu_count: int | None
    memory_used: int | None
    memory_total: int | None
    memory_percent: float | None
    load_average: tuple[float, float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Snapshot:
    """Everything `adaflash gpus` and the TUI's GPU panel show, taken at one instant."""

    available: bool
    reason: str | None
    gpus: list[GpuInfo]
    host: HostInfo
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    time: float = field(default_factory=time.time)

    def choices(self) -> list[str]:
        """Placements to offer: every GPU index, and always "cpu"."""
        return [str(g.index) for g in self.gpus] + ["cpu"]

    @property
    def indices(self) -> list[int]:
        return [g.index for g in self.gpus]

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available, "reason": self.reason, "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version, "time": self.time,
            "gpus": [g.to_dict() for g in self.gpus], "host": self.host.to_dict(), "choices": self.choices(),
        }


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _try(func: Callable[[], Any]) -> Any:
    """NVML calls fail field by field (NotSupported, NoPermission, ...): such a field is None."""
    try:
        return func()
    except Exception:  # noqa: BLE001 - any NVML error means "not available", never a crash
        return None


def host_info(interval: float | None = None) -> HostInfo:
    """Host CPU% and RAM; `interval=None` compares with the previous call (cheap, for polling)."""
    cpu = _try(lambda: psutil.cpu_percent(interval=interval))
    mem = _try(psutil.virtual_memory)
    load = _try(psutil.getloadavg)
    return HostInfo(
        cpu_percent=cpu, cpu_count=_try(psutil.cpu_count),
        memory_used=getattr(mem, "used", None), memory_total=getattr(mem, "total", None),
        memory_percent=getattr(mem, "percent", None), load_average=tuple(load) if load else None,
    )


def active_jobs(runlog: Any) -> list[dict[str, Any]]:
    """Jobs of the run log that hold a process now (verified pid + create time)."""
    if runlog is None:
        return []
    marks = ", ".join("?" * len(ACTIVE_JOB_STATUSES))
    rows = list(runlog.db.query(
        f"SELECT id, run_id, name, pid, pid_start_time FROM jobs WHERE pid IS NOT NULL AND status IN ({marks})",
        list(ACTIVE_JOB_STATUSES),
    ))
    return [r for r in rows if procs.is_ours(r["pid"], r["pid_start_time"])]


def map_pid_to_job(pid: int, jobs_by_pid: dict[int, dict[str, Any]]) -> JobRef | None:
    """The job whose recorded pid is `pid` or one of its ancestors (workers are children of jobs)."""
    for candidate in procs.ancestors(pid):
        row = jobs_by_pid.get(candidate)
        if row is not None:
            return JobRef(run_id=row["run_id"], job=row["name"], job_id=row["id"], pid=row["pid"])
    return None


class Inventory:
    """Takes snapshots; keeps NVML initialised between them (call close(), or use `with`)."""

    def __init__(self, nvml: ModuleType | None = None, runlog: Any = None) -> None:
        self._nvml = nvml
        self.runlog = runlog
        self._initialised = False
        self._init_error: str | None = None
        host_info(None)  # prime psutil's CPU counter so the first polled value means something

    def _module(self) -> ModuleType | None:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as err:
                self._init_error = f"nvidia-ml-py is not installed ({err})"
                return None
        return self._nvml

    def _init(self) -> ModuleType | None:
        nvml = self._module()
        if nvml is None or self._initialised:
            return nvml if self._initialised else None
        try:
            nvml.nvmlInit()
        except Exception as err:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._init_error = f"NVIDIA driver not available: {_text(err) or type(err).__name__}"
            return None
        self._initialised = True
        self._init_error = None
        return nvml

    def close(self) -> None:
        if self._initialised and self._nvml is not None:
            _try(lambda: self._nvml.nvmlShutdown())
        self._initialised = False

    def __enter__(self) -> Inventory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def snapshot(self, *, cpu_interval: float | None = None) -> Snapshot:
        host = host_info(cpu_interval)
        nvml = self._init()
        if nvml is None:
            return Snapshot(False, self._init_error or "NVML unavailable", [], host)
        count = _try(lambda: nvml.nvmlDeviceGetCount())
        driver = _try(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda = _try(lambda: nvml.nvmlSystemGetCudaDriverVersion())
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None
        if not count:
            reason = "no NVIDIA GPU found" if count == 0 else "NVML could not count the GPUs"
            return Snapshot(False, reason, [], host, driver, cuda_text)
        jobs_by_pid = {row["pid"]: row for row in _try(lambda: active_jobs(self.runlog)) or []}
        gpus = [self._device(nvml, index, jobs_by_pid) for index in range(count)]
        return Snapshot(True, None, gpus, host, driver, cuda_text)

    def _device(self, nvml: ModuleType, index: int, jobs_by_pid: dict[int, dict[str, Any]]) -> GpuInfo:
        info = GpuInfo(index=index)
        handle = _try(lambda: nvml.nvmlDeviceGetHandleByIndex(index))
        if handle is None:
            return info
        info.name = _try(lambda: _text(nvml.nvmlDeviceGetName(handle)))
        info.uuid = _try(lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        mem = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        info.memory_used = getattr(mem, "used", None)
        info.memory_total = getattr(mem, "total", None)
        util = _try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        info.utilization = getattr(util, "gpu", None)
        info.memory_utilization = getattr(util, "memory", None)
        temp_sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        info.temperature = _try(lambda: nvml.nvmlDeviceGetTemperature(handle, temp_sensor))
        power = _try(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        info.power = power / 1000.0 if isinstance(power, (int, float)) else None
        limit = _try(lambda: nvml.nvmlDeviceGetEnforcedPowerManagementLimit(handle))
        info.power_limit = limit / 1000.0 if isinstance(limit, (int, float)) else None
        seen: set[int] = set()
        samples = _try(lambda: nvml.nvmlDeviceGetProcessUtilization(handle, 0)) or []
        sm = {getattr(x, "pid", None): getattr(x, "smUtil", None) for x in samples}
        for kind, getter in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                             ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            func = getattr(nvml, getter, None)
            entries = _try(lambda func=func: func(handle)) if func else None
            for entry in entries or []:
                pid = getattr(entry, "pid", None)
                if pid is None or pid in seen:
                    continue
                seen.add(pid)
                used = getattr(entry, "usedGpuMemory", None)
                if not isinstance(used, int) or used < 0 or used >= 2**63:  # NVML_VALUE_NOT_AVAILABLE
                    used = None
                name = _try(lambda pid=pid: psutil.Process(pid).name())
                util = sm.get(pid)
                info.processes.append(GpuProcess(pid, name, used, kind, map_pid_to_job(pid, jobs_by_pid),
                                                 float(util) if isinstance(util, (int, float)) else None))
        return info


def snapshot(runlog: Any = None, nvml: ModuleType | None = None, *, cpu_interval: float | None = 0.1) -> Snapshot:
    """One snapshot (NVML opened and closed around it): for one-shot callers like `adaflash gpus`."""
    with Inventory(nvml=nvml, runlog=runlog) as inventory:
        return inventory.snapshot(cpu_interval=cpu_interval)


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "N/A"
    gib = value / 2**30
    return f"{gib:.1f} GiB" if gib >= 1 else f"{value / 2**20:.0f} MiB"


def fmt_num(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "N/A" if value is None else f"{value:.{digits}f}{unit}"
