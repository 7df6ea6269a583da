"""One rule for where prompts come from: a JSONL file, or a prepared dataset's name (train or test split)."""

import json

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.data.prompts import PromptFileError, prompt_source


@pytest.fixture()
def workspace(tmp_path):
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    for split, n in (("train", 3), ("test", 2)):
        rows = [{"id": f"{split}{i}", "conversations": [{"role": "user", "content": f"{split} {i}: add {i} and 4."}],
                 "reference": None} for i in range(n)]
        (ws / "data" / f"mini_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ws


def test_names_read_their_split_and_paths_stay_paths(workspace, tmp_path, monkeypatch):
    assert prompt_source("mini", workspace, "train") == workspace / "data" / "mini_train.jsonl"
    assert prompt_source("mini", workspace, "test") == workspace / "data" / "mini_test.jsonl"
    # a file in the working folder wins over a name; anything shaped like a path is a path, found or not
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mini").write_text('{"prompt": "local"}\n')
    assert prompt_source("mini", workspace, "train").resolve() == (tmp_path / "mini").resolve()
    assert prompt_source("gone.jsonl", workspace, "train").name == "gone.jsonl"
    assert prompt_source("sub/gone", workspace, "train").name == "gone"
    with pytest.raises(PromptFileError, match=r"nowhere: neither a file nor a prepared dataset .*nowhere_train\.jsonl"):
        prompt_source("nowhere", workspace, "train")


def test_data_vary_takes_a_prepared_name(workspace, tmp_path):
    out = tmp_path / "v.jsonl"
    result = CliRunner().invoke(cli, ["--workspace", str(workspace), "data", "vary", "--dataset", "mini",
                                      "--variants", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == ["train0", "train0~v1", "train1", "train1~v1", "train2", "train2~v1"]


def test_pipeline_and_training_resolve_names_or_say_what_is_missing(workspace, tmp_path):
    base = ["--workspace", str(workspace)]
    result = CliRunner().invoke(cli, [*base, "pipeline", "--draft", "smollm2-135m-dflash", "--data", "mini", "--dry-run"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("inference:"))
    assert json.loads(line[line.index("'{") + 1: line.rindex("}'") + 1])["data"] == str(
        (workspace / "data" / "mini_train.jsonl").resolve())
    assert not (workspace / "runs").exists()  # a dry run records no run and makes no run folder
    assert not (workspace / "runlog.sqlite").exists()

    result = CliRunner().invoke(cli, [*base, "pipeline", "--draft", "smollm2-135m-dflash", "--data", "nowhere", "--dry-run"])
    assert result.exit_code == 2 and "--data" in result.output and "data prepare nowhere" in result.output
    result = CliRunner().invoke(cli, [*base, "pipeline", "--draft", "smollm2-135m-dflash", "--data",
                                      str(tmp_path / "gone.jsonl"), "--dry-run"])
    assert result.exit_code == 2 and "gone.jsonl: no such file" in result.output
    result = CliRunner().invoke(cli, [*base, "train", "draft", "--method", "dflash", "--data", "mini", "--eval-data",
                                      "nowhere", "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "--eval-data" in result.output and "nowhere_test.jsonl" in result.output
    assert not (tmp_path / "d").exists()
