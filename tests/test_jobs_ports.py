"""Ports: refused before launch when taken, and readiness that only an answer from the job itself counts."""

from __future__ import annotations

import os
import socket
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from adaflash.runlog import RunLog
from jobs.detached import start_detached
from jobs.plan import prepare
from jobs.ports import PortBusyError, foreign_answer, port_free, url_endpoint
from jobs.recipe_spec import JobSpec, ReadyCheck
from jobs.runner import Runner

from .test_jobs_supervisor import sup, wait_for  # noqa: F401  (sup is a fixture)


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture()
def stranger() -> Iterator[int]:
    """An HTTP server of another program (this test process) answering 200 on a port; yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_port_free_and_local_endpoints(stranger: int) -> None:
    assert not port_free("127.0.0.1", stranger)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert port_free("127.0.0.1", port)
    assert url_endpoint(f"http://127.0.0.1:{port}/health") == ("127.0.0.1", port)
    assert url_endpoint("http://localhost/") == ("localhost", 80)
    assert url_endpoint("http://gpu-node-7:30000/health") is None  # another machine: nothing to check here
    why = foreign_answer(f"http://127.0.0.1:{stranger}/health", ours=set())
    assert why and f"pid {os.getpid()}" in why and f"port {stranger}" in why
    assert foreign_answer(f"http://127.0.0.1:{stranger}/health", ours={os.getpid()}) is None


def test_a_service_whose_port_is_taken_fails_at_once_naming_the_holder(sup, stranger: int) -> None:  # noqa: F811
    """The other server answered the health check, so the job showed "ready" while it could not bind."""
    job = sup.add(JobSpec(name="srv", command=["python", "-m", "http.server", str(stranger), "--bind", "127.0.0.1"],
                          kind="service", ready=ReadyCheck(http=f"http://127.0.0.1:{stranger}/", timeout=20,
                                                           interval=0.1)))
    sup.start("srv")
    assert job.status == "failed" and job.pid is None  # never started
    assert f"port {stranger} on 127.0.0.1 is already in use by pid {os.getpid()}" in job.message


def test_readiness_answered_by_another_process_is_not_ready(sup, stranger: int) -> None:  # noqa: F811
    """A job that never listens, while another process answers its health URL: failed, not ready."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    job = sup.add(JobSpec(name="quiet", command=["python", "-c", "import time; time.sleep(60)"], kind="service",
                          ready=ReadyCheck(http=f"http://127.0.0.1:{free}/", timeout=20, interval=0.1), stop_grace=0.5))
    sup.start("quiet")  # its port was free at start
    job.spec.ready.http = f"http://127.0.0.1:{stranger}/"  # then the answer comes from another program
    wait_for(lambda: (sup.poll(), job.status != "starting")[1])
    assert job.status == "failed", job.status
    assert f"is answered by pid {os.getpid()}" in job.message and "not by this job" in job.message


def test_a_recipe_whose_service_port_is_taken_is_refused_before_anything_is_recorded(tmp_path: Path,
                                                                                     stranger: int) -> None:
    recipe = tmp_path / "busy.toml"
    recipe.write_text(textwrap.dedent(f"""
        [run]
        name = "busy"
        [jobs.server]
        command = ["python", "-m", "http.server", "{stranger}", "--bind", "127.0.0.1"]
        kind = "service"
        ready = {{ http = "http://127.0.0.1:{stranger}/health", timeout = 20 }}
    """))
    for launch in ("foreground", "detached"):
        prepared = prepare(recipe, workspace=tmp_path / "ws")
        log = RunLog.open(prepared.workspace)
        with pytest.raises(PortBusyError, match=rf"job server \(http://127.0.0.1:{stranger}/health\): port {stranger} "
                                                rf"on 127.0.0.1 is already in use by pid {os.getpid()}"):
            if launch == "foreground":
                Runner(prepared, log).start()
            else:
                start_detached(prepared, log)
        assert log.list_runs() == []


def test_port_problem_names_a_taken_port_and_is_none_once_it_is_free() -> None:
    import socket

    from jobs.ports import port_problem

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        assert f"port {port} on 127.0.0.1 is already in use" in (port_problem("127.0.0.1", port) or "")
    finally:
        server.close()
    assert port_problem("127.0.0.1", port) is None
