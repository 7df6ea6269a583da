"""Ports: free before a service starts, and answered by that very service when it counts as ready.

Why: a service told to listen on a port another process holds fails to bind, yet its readiness
check (GET the URL) is answered by the other process, so the job showed "ready" while it was
dying. So a port a recipe's service will listen on is checked before launch, and readiness on
a local URL also asks who listens on the port: one of the job's own processes (the leader, its
descendants, its process group), or nobody else. The listener is found through the sockets
table (psutil), so it works for any server (the embedded one, SGLang, `python -m http.server`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

import psutil

from adaflash import procs
from jobs.assign import AssignmentError

LOCAL_NAMES = ("localhost", "")


class PortBusyError(AssignmentError):
    """A port a service needs is taken (an AssignmentError: the CLI and the TUI refuse the launch with it)."""


def port_free(host: str, port: int) -> bool:
    """True when a server could listen on host:port now (probed with SO_REUSEADDR, as servers bind,
    so connections lingering in TIME_WAIT do not count as taken)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError:
                return False
    return True


def url_endpoint(url: str) -> tuple[str, int] | None:
    """(host, port) of an http(s) URL on this machine; None for another host (nothing to check here)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    host = parts.hostname or ""
    if host in LOCAL_NAMES or host == socket.gethostname():
        return host or "127.0.0.1", port
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(host)
        if address.is_loopback or address.is_unspecified:
            return host, port
    return None


def listeners(port: int) -> list[int | None]:
    """Pids listening on TCP `port` on any address (None for a socket whose process we may not see)."""
    found: list[int | None] = []
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                found.append(conn.pid)
    return found


def describe_pid(pid: int | None) -> str:
    if pid is None:
        return "a process this user cannot see"
    try:
        proc = psutil.Process(pid)
        command = " ".join(proc.cmdline()[:4]) or proc.name()
    except psutil.Error:
        return f"pid {pid}"
    return f"pid {pid} ({command[:80]})"


def busy_message(host: str, port: int, what: str) -> str:
    owners = sorted({describe_pid(p) for p in listeners(port)})
    held = f" by {', '.join(owners)}" if owners else ""
    return f"{what}: port {port} on {host} is already in use{held}; choose another port or stop that process"


def port_problem(host: str, port: int, what: str = "server") -> str | None:
    """A sentence for a form or a CLI when the port is taken (naming who holds it), else None."""
    return None if port_free(host, port) else busy_message(host, port, what)


def check_port(host: str, port: int, what: str) -> None:
    """PortBusyError (naming who holds it, when visible) unless host:port is free."""
    if not port_free(host, port):
        raise PortBusyError([busy_message(host, port, what)])


def recipe_port_errors(services: Iterable[tuple[str, str]]) -> list[str]:
    """One message per (job name, readiness URL) whose local port is taken, or that two jobs share."""
    errors: list[str] = []
    seen: dict[int, str] = {}
    for name, url in services:
        endpoint = url_endpoint(url)
        if endpoint is None:
            continue
        host, port = endpoint
        if port in seen:
            errors.append(f"job {name}: port {port} is also the port of job {seen[port]} ({url})")
            continue
        seen[port] = name
        if not port_free(host, port):
            errors.append(busy_message(host, port, f"job {name} ({url})"))
    return errors


def job_processes(pid: int | None, pgid: int | None, recorded_start: float | None) -> set[int]:
    """The pids of a job: its leader (when it is still the recorded process), descendants, group members."""
    pids: set[int] = set()
    if pid and procs.is_ours(pid, recorded_start):
        pids.add(pid)
        pids.update(p.pid for p in procs.descendants(pid))
    if pgid:
        pids.update(p.pid for p in procs.group_members(pgid, not_before=recorded_start))
    return pids


def foreign_answer(url: str, ours: set[int]) -> str | None:
    """Why the answer at `url` is not from `ours` (a process of another job or program holds its port),
    or None when one of ours listens there, or the URL is not on this machine (nothing to check)."""
    endpoint = url_endpoint(url)
    if endpoint is None:
        return None
    pids = listeners(endpoint[1])
    if any(p in ours for p in pids if p is not None):
        return None
    holders = ", ".join(sorted({describe_pid(p) for p in pids})) or "a process this job did not start"
    return f"{url} is answered by {holders}, not by this job: another process holds port {endpoint[1]}"
