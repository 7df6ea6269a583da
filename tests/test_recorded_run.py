"""`recorded_run`: a command's run in the run log ends however the command ends, never left "running"."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaflash.cli.common import fail, recorded_run
from adaflash.runlog import RunLog


@pytest.fixture
def log(tmp_path: Path) -> RunLog:
    return RunLog(tmp_path / "log.sqlite")


def _only_run(log: RunLog) -> dict:
    (run,) = log.list_runs()
    return log.get_run(run["id"])


def test_a_body_that_returns_finishes_the_run_as_it_said(log: RunLog) -> None:
    with recorded_run(log, "data", name="x") as run:
        assert log.get_run(run.id)["status"] == "running"
        run.finish(note="3 rows")
    ended = _only_run(log)
    assert (ended["status"], ended["note"], ended["name"]) == ("finished", "3 rows", "x")
    assert ended["ended_at"] is not None


def test_an_expected_error_fails_the_run_and_becomes_a_cli_error(log: RunLog, capsys) -> None:
    with pytest.raises(SystemExit) as exited, recorded_run(log, "data", expected=(ValueError,)):
        raise ValueError("bad rows")
    assert exited.value.code == 2 and "bad rows" in capsys.readouterr().err
    assert (_only_run(log)["status"], _only_run(log)["note"]) == ("failed", "bad rows")


def test_ctrl_c_is_recorded_as_stopped_and_propagates(log: RunLog) -> None:
    with pytest.raises(KeyboardInterrupt), recorded_run(log, "train"):
        raise KeyboardInterrupt
    assert _only_run(log)["status"] == "stopped"


def test_an_unexpected_error_is_recorded_with_its_type(log: RunLog) -> None:
    with pytest.raises(RuntimeError), recorded_run(log, "bench"):
        raise RuntimeError("boom")
    assert (_only_run(log)["status"], _only_run(log)["note"]) == ("failed", "RuntimeError: boom")


def test_fail_and_exit_130_inside_the_body(log: RunLog) -> None:
    with pytest.raises(SystemExit), recorded_run(log, "serve") as run:
        run.finish("failed", note="port taken")
        fail("port taken")
    assert (_only_run(log)["status"], _only_run(log)["note"]) == ("failed", "port taken")
    with pytest.raises(SystemExit), recorded_run(log, "train") as second:
        second.finish("stopped", note="stopped at step 4")
        raise SystemExit(130)
    assert log.get_run(second.id)["status"] == "stopped" and log.get_run(second.id)["note"] == "stopped at step 4"
