"""GPU assignment of roles and GPU leases between runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.assign import Assignment, AssignmentError, GpuLeases, LeaseError, format_gpus, parse_gpus


def test_parse_gpus_accepts_the_usual_spellings() -> None:
    assert parse_gpus(0) == (0,)
    assert parse_gpus([1, 2]) == (1, 2)
    assert parse_gpus("1,2") == (1, 2)
    assert parse_gpus("cpu") is None and parse_gpus(["cpu"]) is None
    assert format_gpus((1, 2)) == "1,2" and format_gpus(None) == "cpu"
    for bad, fragment in ((-1, "integers >= 0"), ([0, 0], "listed twice"), ([0, "cpu"], "cannot be mixed"),
                          ([], "has no GPU"), ("", "has no GPU"), (1.5, "got 1.5"), (True, "got True")):
        with pytest.raises(ValueError, match=fragment):
            parse_gpus(bad, owner="role 'x'")


def test_assignment_gives_cuda_visible_devices_and_nproc() -> None:
    a = Assignment.from_mapping({"inference": [0], "training": "1,2,3", "server": "cpu"})
    assert a.env("inference") == {"CUDA_VISIBLE_DEVICES": "0"}
    assert a.env("training") == {"CUDA_VISIBLE_DEVICES": "1,2,3"} and a.nproc("training") == 3
    assert a.env("server") == {"CUDA_VISIBLE_DEVICES": ""} and a.nproc("server") == 1
    assert a.gpus_in_use() == {0, 1, 2, 3}
    assert a.validate(known=[0, 1, 2, 3]) == []


def test_invalid_assignments_are_refused_naming_role_and_gpu() -> None:
    with pytest.raises(AssignmentError) as info:
        Assignment.from_mapping({"inference": [], "training": [0, "cpu"], "share": "yes"})
    text = str(info.value)
    assert "role 'inference' has no GPU" in text and "role 'training': \"cpu\" cannot be mixed" in text
    assert "share: expected true or false" in text

    a = Assignment.from_mapping({"inference": [0], "training": [0, 5]})
    errors = a.validate(known=[0, 1])
    assert "role 'training': GPU 5 does not exist (known GPUs: 0, 1)" in errors
    assert any("GPU 0 is given to role 'inference' and role 'training'" in e and "share = true" in e
               for e in errors)
    # inference + training may share when asked; a server never shares.
    assert Assignment.from_mapping({"inference": [0], "training": [0], "share": True}).validate([0]) == []
    server = Assignment.from_mapping({"server": [0], "training": [0], "share": True}).validate([0])
    assert server and "exclusive" in server[0]
    custom = Assignment.from_mapping({"server": [0], "bench": [0]}, share=True, exclusive=[])
    assert custom.validate([0]) == []


def test_unknown_gpus_on_a_machine_without_gpus_point_to_cpu() -> None:
    from jobs.gpus import HostInfo, Snapshot

    snap = Snapshot(False, "no NVIDIA GPU found", [], HostInfo(None, None, None, None, None))
    errors = Assignment.from_mapping({"inference": [0], "training": "cpu"}).validate(snap)
    assert errors == ["role 'inference': GPU 0 does not exist (this machine has no usable NVIDIA GPU "
                      "(no NVIDIA GPU found); use \"cpu\")"]


def test_leases_refuse_a_gpu_held_by_a_live_run_and_drop_dead_owners(tmp_path: Path) -> None:
    leases = GpuLeases(tmp_path / "leases.json")
    assert leases.acquire("run-a", [0, 1]) is not None
    with pytest.raises(LeaseError, match=r"GPU 1 is in use by run run-a"):
        leases.acquire("run-b", [1, 2])
    assert leases.acquire("run-b", [2]) is not None  # a free GPU is fine
    assert leases.acquire("run-a", [0, 1]) is not None  # the same run again: idempotent
    assert leases.holder(0).run_id == "run-a"
    leases.release("run-a")
    assert leases.holder(0) is None

    # A lease whose owner died (or whose pid was recycled) does not block anyone.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leases.acquire("run-c", [3], pid=dead.pid)
    assert {le.run_id for le in leases.active()} == {"run-b"}
    assert leases.acquire("run-d", [3]) is not None


@pytest.mark.parametrize("bad", [3, "server", ["server", 1]])
def test_exclusive_must_be_a_list_of_role_names(bad):
    with pytest.raises(AssignmentError, match="exclusive: expected a list of role names"):
        Assignment.from_mapping({"server": [0], "exclusive": bad})
