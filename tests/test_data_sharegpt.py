"""Element-by-element decoding of a truncated JSON array (ShareGPT's packaged file is cut off)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.data.errors import DatasetError
from adaflash.data.json_array import JsonArrayReader


def conversation(i: int) -> dict:
    return {"id": f"sg{i}", "conversations": [
        {"from": "human", "value": f"question {i} with \"quotes\", [brackets] and {{braces}}"},
        {"from": "gpt", "value": f"answer {i}\nover two lines"},
    ]}


ELEMENTS = [
    conversation(0),
    {"id": "sys", "conversations": [{"from": "system", "value": "only a system prompt"}]},
    conversation(1),
    {"id": "empty", "conversations": []},
    conversation(2),
    conversation(3),
]


def truncated_text(cut_inside: int) -> str:
    """The array as indented JSON, cut in the middle of element `cut_inside`."""
    full = json.dumps(ELEMENTS, indent=2)
    start = full.index(json.dumps(ELEMENTS[cut_inside]["id"]))
    return full[: start + 30]


def decode(text: str, chunk_size: int) -> tuple[list, JsonArrayReader]:
    reader = JsonArrayReader(io.StringIO(text), Path("mem.json"), chunk_size=chunk_size)
    return [value for _, value in reader], reader


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1 << 20])
def test_truncated_array_yields_complete_elements(chunk_size):
    values, reader = decode(truncated_text(cut_inside=4), chunk_size)
    assert values == ELEMENTS[:4]
    assert reader.truncated
    full = json.dumps(ELEMENTS, indent=2)
    brace = full[: full.index('"sg2"')].rindex("{")  # where the cut element starts
    assert reader.truncated_line == full[:brace].count("\n") + 1


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1 << 20])
def test_each_element_is_named_by_the_line_it_starts_on(chunk_size):
    full = json.dumps(ELEMENTS, indent=2)
    starts = [full[: full.index(json.dumps(e["id"]))].rindex("{") for e in ELEMENTS]
    reader = JsonArrayReader(io.StringIO(full), Path("mem.json"), chunk_size=chunk_size)
    assert [where for where, _ in reader] == [f"mem.json:{full[:s].count(chr(10)) + 1}" for s in starts]


@pytest.mark.parametrize("chunk_size", [3, 1 << 20])
def test_cut_right_after_a_comma_and_complete_arrays(chunk_size):
    full = json.dumps(ELEMENTS, indent=2)
    values, reader = decode(full[: full.index('"sg1"')].rsplit("{", 1)[0], chunk_size)
    assert values == ELEMENTS[:2] and reader.truncated
    values, reader = decode(full, chunk_size)
    assert values == ELEMENTS and not reader.truncated
    values, reader = decode("[]", chunk_size)
    assert values == [] and not reader.truncated


def test_numbers_split_across_chunks_are_whole():
    values, reader = decode("[123456789, 2.5e10, -7]", chunk_size=2)
    assert values == [123456789, 2.5e10, -7] and not reader.truncated


def test_malformed_element_in_the_middle_is_an_error_with_line():
    text = '[\n  {"id": 1},\n  {"id": 2,, "x": 3},\n  {"id": 4}\n]'
    with pytest.raises(DatasetError, match=r"mem\.json:3: not valid JSON"):
        decode(text, chunk_size=4)
    with pytest.raises(DatasetError, match=r"mem\.json:1: expected a JSON array"):
        decode('{"id": 1}', chunk_size=4)


def test_prepare_sharegpt_from_a_truncated_file(tmp_path):
    source = tmp_path / "sharegpt.json"
    source.write_text(truncated_text(cut_inside=5))
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "data", "prepare", "sharegpt",
                                      "--source", str(source), "--test-fraction", "0", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    rows = [json.loads(line) for line in Path(summary["files"]["train"]).read_text().splitlines()]
    assert [r["id"] for r in rows] == ["sg0", "sg1", "sg2"]
    assert rows[0]["conversations"] == [
        {"role": "user", "content": ELEMENTS[0]["conversations"][0]["value"]},
        {"role": "assistant", "content": ELEMENTS[0]["conversations"][1]["value"]},
    ]
    assert summary["skipped_reasons"] == {"no user turn": 2, "truncated at the end of the file": 1}
    assert len(summary["truncated"]) == 1 and summary["truncated"][0].startswith(f"{source}:")
