"""GPU assignment of roles, validated before anything starts, and GPU leases between runs.

An assignment maps roles (inference, training, server, benchmark, ...) to GPU indices or to
"cpu". It is refused, with a message naming the role and the GPU, when an index is unknown, a
role has none (say "cpu" explicitly), "cpu" is mixed with indices, or one GPU goes to two
roles that cannot share it. Sharing rule: a role listed in `exclusive` (servers, by default)
never shares; other distinct roles share only when `share = true`.

Leases (why a file and not the run log): two `adaflash run` started at once must not both
get GPU 0, so check-and-take has to be one atomic step across processes and workspaces. A
small JSON file per host, guarded by flock, gives that; each lease records the owner pid and
its create time, so leases of dead owners are dropped on the next read (a crash never
locks a GPU forever).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaflash import procs
from adaflash.devices import CPU, parse_gpus, physical

DEFAULT_EXCLUSIVE = frozenset({"server"})
RESERVED_KEYS = ("share", "exclusive")
LEASES_ENV = "ADAFLASH_LEASES"


class AssignmentError(ValueError):
    """An invalid assignment; `errors` holds one message per problem."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


def format_gpus(gpus: tuple[int, ...] | None) -> str:
    """"0,1" for GPUs, "cpu" for none."""
    return CPU if gpus is None else ",".join(str(i) for i in gpus)


@dataclass(frozen=True)
class RoleGPUs:
    """The GPUs of one role (None: the role runs on CPU)."""

    role: str
    gpus: tuple[int, ...] | None

    @property
    def is_cpu(self) -> bool:
        return self.gpus is None

    @property
    def cuda_visible_devices(self) -> str:
        """Value of CUDA_VISIBLE_DEVICES: "" hides every GPU from a CPU role; indices count the GPUs we see
        (`adaflash.devices`), so under CUDA_VISIBLE_DEVICES=2,3 GPU 0 is "2"."""
        return "" if self.gpus is None else ",".join(physical(self.gpus, f"role {self.role!r}"))

    @property
    def nproc(self) -> int:
        """torchrun --nproc_per_node: one process per GPU, one on CPU."""
        return 1 if self.gpus is None else len(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "gpus": None if self.gpus is None else list(self.gpus),
                "label": format_gpus(self.gpus), "cuda_visible_devices": self.cuda_visible_devices,
                "nproc": self.nproc}


def known_indices(source: Any) -> set[int] | None:
    """GPU indices that exist: from a gpus.Snapshot, an iterable of ints, or None (do not check)."""
    if source is None:
        return None
    if hasattr(source, "gpus") and hasattr(source, "available"):
        return {g.index for g in source.gpus} if source.available else set()
    return {int(i) for i in source}


def _unknown_hint(known: set[int], source: Any) -> str:
    if known:
        return f"known GPUs: {', '.join(str(i) for i in sorted(known))}"
    reason = getattr(source, "reason", None)
    return f"this machine has no usable NVIDIA GPU{f' ({reason})' if reason else ''}; use \"cpu\""


@dataclass(frozen=True)
class Claim:
    """One GPU used by one role of one job (job None: a bare role, as in the TUI)."""

    role: str
    gpu: int
    job: str | None = None

    def label(self) -> str:
        return f"role {self.role!r}" + (f" (job {self.job!r})" if self.job else "")


@dataclass
class Assignment:
    """Roles -> GPUs plus the sharing rule."""

    roles: dict[str, RoleGPUs] = field(default_factory=dict)
    share: bool = False
    exclusive: frozenset[str] = DEFAULT_EXCLUSIVE

    @classmethod
    def from_mapping(
        cls, mapping: Mapping[str, Any], *, share: bool | None = None, exclusive: Iterable[str] | None = None
    ) -> Assignment:
        """Parse `{role: gpus, "share": bool, "exclusive": [roles]}`; AssignmentError lists every problem."""
        errors: list[str] = []
        roles: dict[str, RoleGPUs] = {}
        share_value = mapping.get("share", False) if share is None else share
        if not isinstance(share_value, bool):
            errors.append(f"share: expected true or false, got {share_value!r}")
            share_value = False
        excl_value = mapping.get("exclusive", sorted(DEFAULT_EXCLUSIVE)) if exclusive is None else exclusive
        if not isinstance(excl_value, (list, tuple, set, frozenset)) or not all(isinstance(r, str) for r in excl_value):
            errors.append(f"exclusive: expected a list of role names, got {excl_value!r}")
            excl_value = DEFAULT_EXCLUSIVE
        for role, value in mapping.items():
            if role in RESERVED_KEYS:
                continue
            try:
                roles[role] = RoleGPUs(role, parse_gpus(value, owner=f"role {role!r}"))
                roles[role].cuda_visible_devices  # noqa: B018  (an index beyond the visible GPUs fails here)
            except ValueError as err:
                errors.append(str(err))
        if errors:
            raise AssignmentError(errors)
        return cls(roles=roles, share=bool(share_value), exclusive=frozenset(excl_value))

    def __contains__(self, role: str) -> bool:
        return role in self.roles

    def gpus_of(self, role: str) -> tuple[int, ...] | None:
        return self.roles[role].gpus

    def env(self, role: str) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.roles[role].cuda_visible_devices}

    def nproc(self, role: str) -> int:
        return self.roles[role].nproc

    def gpus_in_use(self) -> set[int]:
        return {i for r in self.roles.values() for i in (r.gpus or ())}

    def can_share(self, role_a: str, role_b: str) -> bool:
        """Whether two roles may use one GPU at the same time."""
        if role_a in self.exclusive or role_b in self.exclusive:
            return False
        return role_a == role_b or self.share

    def claims(self) -> list[Claim]:
        return [Claim(r.role, i) for r in self.roles.values() for i in (r.gpus or ())]

    def validate(self, known: Any = None) -> list[str]:
        """Every problem, all roles taken as running at once (the TUI's view). [] when valid."""
        errors = check_known(self.claims(), known)
        errors += check_conflicts(self.claims(), self.can_share, exclusive=self.exclusive)
        return errors

    def check(self, known: Any = None) -> None:
        errors = self.validate(known)
        if errors:
            raise AssignmentError(errors)

    def to_dict(self) -> dict[str, Any]:
        return {"roles": {k: v.to_dict() for k, v in self.roles.items()}, "share": self.share,
                "exclusive": sorted(self.exclusive)}


def check_known(claims: Iterable[Claim], known: Any) -> list[str]:
    """Unknown GPU indices: one message per owner, naming each missing GPU."""
    indices = known_indices(known)
    if indices is None:
        return []
    missing: dict[str, list[int]] = {}
    for claim in claims:
        if claim.gpu not in indices:
            gpus = missing.setdefault(claim.label(), [])
            if claim.gpu not in gpus:
                gpus.append(claim.gpu)
    errors = []
    for label, gpus in missing.items():
        noun = "GPU" if len(gpus) == 1 else "GPUs"
        verb = "does" if len(gpus) == 1 else "do"
        errors.append(f"{label}: {noun} {', '.join(map(str, gpus))} {verb} not exist "
                      f"({_unknown_hint(indices, known)})")
    return errors


def check_conflicts(
    claims: Iterable[Claim],
    can_share: Callable[[str, str], bool],
    can_overlap: Callable[[str | None, str | None], bool] | None = None,
    exclusive: Iterable[str] = DEFAULT_EXCLUSIVE,
) -> list[str]:
    """A GPU claimed by two owners that may run at once and cannot share it."""
    claims, exclusive = list(claims), frozenset(exclusive)
    errors, seen = [], set()
    for i, a in enumerate(claims):
        for b in claims[i + 1:]:
            if a.gpu != b.gpu or (a.role == b.role and a.job == b.job):
                continue
            if can_overlap is not None and a.job != b.job and not can_overlap(a.job, b.job):
                continue
            if can_share(a.role, b.role):
                continue
            key = (a.gpu, a.label(), b.label())
            if key in seen:
                continue
            seen.add(key)
            why = ("servers and other exclusive roles never share a GPU"
                   if (a.role in exclusive or b.role in exclusive)
                   else "set share = true in [gpus] to let them share")
            when = " which may run at the same time" if can_overlap is not None else ""
            errors.append(f"GPU {a.gpu} is given to {a.label()} and {b.label()}{when}: {why}")
    return errors


# -- leases --------------------------------------------------------------------------------------


class LeaseError(RuntimeError):
    """A GPU is already leased by another live run."""


@dataclass
class Lease:
    run_id: str
    gpus: list[int]
    pid: int
    pid_start_time: float | None
    host: str
    time: float

    def alive(self) -> bool:
        return procs.is_ours(self.pid, self.pid_start_time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_leases_path() -> Path:
    """$ADAFLASH_LEASES, else one file per host in the adaflash cache (GPUs belong to the host)."""
    raw = os.environ.get(LEASES_ENV)
    if raw:
        return Path(raw).expanduser()
    from adaflash.workspace import cache_dir

    return cache_dir() / f"gpu-leases-{socket.gethostname()}.json"


class GpuLeases:
    """GPU leases shared by every run of this host: acquire refuses a GPU held by a live run."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else default_leases_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[Lease]]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                leases = [le for le in self._read() if le.alive()]
                yield leases
                self._write(leases)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read(self) -> list[Lease]:
        try:
            data = json.loads(self.path.read_text())
            return [Lease(**row) for row in data.get("leases", [])]
        except (FileNotFoundError, ValueError, TypeError):
            return []

    def _write(self, leases: list[Lease]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"leases": [le.to_dict() for le in leases]}, indent=1))
        os.replace(tmp, self.path)

    def active(self) -> list[Lease]:
        """Leases of live owners (stale ones are dropped as a side effect)."""
        with self._locked() as leases:
            return list(leases)

    def holder(self, gpu: int) -> Lease | None:
        return next((le for le in self.active() if gpu in le.gpus), None)

    def acquire(self, run_id: str, gpus: Iterable[int], pid: int | None = None) -> Lease | None:
        """Take `gpus` for `run_id` (owner `pid`, default this process). LeaseError names the holder."""
        wanted = sorted(set(gpus))
        if not wanted:
            return None
        pid = pid or os.getpid()
        with self._locked() as leases:
            errors = []
            for lease in leases:
                if lease.run_id == run_id:
                    continue
                for gpu in wanted:
                    if gpu in lease.gpus:
                        errors.append(f"GPU {gpu} is in use by run {lease.run_id} (pid {lease.pid})")
            if errors:
                raise LeaseError("; ".join(errors))
            leases[:] = [le for le in leases if le.run_id != run_id]
            lease = Lease(run_id, wanted, pid, procs.start_time(pid), socket.gethostname(), time.time())
            leases.append(lease)
            return lease

    def transfer(self, run_id: str, pid: int) -> None:
        """Hand a lease to another process (the detached supervisor)."""
        with self._locked() as leases:
            for lease in leases:
                if lease.run_id == run_id:
                    lease.pid, lease.pid_start_time = pid, procs.start_time(pid)

    def release(self, run_id: str) -> None:
        with self._locked() as leases:
            leases[:] = [le for le in leases if le.run_id != run_id]
