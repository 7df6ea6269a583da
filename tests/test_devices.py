"""One GPU-index parser with one meaning: indices of the GPUs this process sees (positions within
CUDA_VISIBLE_DEVICES when it is set), for serve, pipeline, recipes and the dashboard alike."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from adaflash.devices import child_devices, parse_gpus, physical
from jobs.assign import Assignment, AssignmentError


def test_indices_count_the_visible_gpus() -> None:
    assert parse_gpus("0, 2", owner="--gpus") == (0, 2) and parse_gpus("cpu", owner="--gpus") is None
    assert physical((0, 1), "--gpus", environ={}) == ["0", "1"]
    assert physical((1,), "--gpus", environ={"CUDA_VISIBLE_DEVICES": "2,3"}) == ["3"]
    assert child_devices("cpu", "--gpus", environ={"CUDA_VISIBLE_DEVICES": "2,3"}) is None


@pytest.mark.parametrize(("value", "fragment"), [("x", "--gpus: expected GPU indices or"),
                                                 ("0,0", "--gpus: GPU 0 is listed twice"),
                                                 ("", "--gpus has no GPU"),
                                                 ("2", "--gpus 2: CUDA_VISIBLE_DEVICES='2,3' leaves 2 GPU(s)")])
def test_errors_name_the_option_and_what_was_expected(value: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        child_devices(value, "--gpus", environ={"CUDA_VISIBLE_DEVICES": "2,3"})


def test_serve_and_its_trainer_land_on_the_visible_gpus_they_name(monkeypatch, tmp_path) -> None:
    """Under CUDA_VISIBLE_DEVICES=2,3, `serve --gpus 0 --train-gpus 1` is physical GPU 2 and GPU 3."""
    from adaflash.cli.main import cli

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # restored after the test (serve narrows it in-process)
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "serve", "--method", "dflash",
                                      "--gpus", "0", "--adapt", "--train-gpus", "1", "--dry-run"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.output[result.output.index("{"):])
    assert config["cuda_visible_devices"] == "2"
    assert config["adapt"]["train_gpus"] == ["3"]


def test_recipe_roles_use_the_same_meaning(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assignment = Assignment.from_mapping({"inference": "0", "training": [1]})
    assert assignment.env("inference") == {"CUDA_VISIBLE_DEVICES": "2"}
    assert assignment.env("training") == {"CUDA_VISIBLE_DEVICES": "3"}
    with pytest.raises(AssignmentError, match="role 'inference' 4: CUDA_VISIBLE_DEVICES='2,3' leaves 2"):
        Assignment.from_mapping({"inference": 4})
