"""`adaflash data prepare suite`: held-out prompts per domain, and a training corpus disjoint from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.data.suite import DOMAINS, MAX_PROMPT_CHARS, check_disjoint, prompt_key

# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_data_suite")


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict:
    ws = tmp_path_factory.mktemp("suite-ws")
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "data", "prepare", "suite", "--json",
                                      "--code-packages", "click,rich,textual"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").split("\n") if line]


def test_every_domain_has_held_out_prompts_and_the_corpus_covers_math_code_and_chat(suite):
    assert set(suite["test"]) == set(DOMAINS) and all(suite["test"][d] > 0 for d in DOMAINS)
    assert suite["test"]["math"] == 1319 and suite["test"]["code"] == 164 and suite["test"]["chat"] == 80
    for domain in ("math", "code", "open-chat", "chat-turn2", "chat-later"):
        assert suite["train"][domain] > 100
    train = rows(suite["files"]["train"])
    later = [r for r in train if r["domain"] == "chat-later"]
    added = [r["domain"] == "chat-later" or r["id"].startswith("pkg-") for r in train]
    assert not any(added[:added.index(True)]) and all(added[added.index(True):])  # last: the rows before
    # them do not depend on them
    for r in later:  # the conversation so far, ShareGPT's own answers between the user's turns
        roles = [t["role"] for t in r["conversations"]]
        assert len(roles) >= 5 and roles == ["user", "assistant"] * (len(roles) // 2) + ["user"], r["id"]
        assert sum(len(t["content"]) for t in r["conversations"]) <= MAX_PROMPT_CHARS
    test = rows(suite["files"]["test"])
    turn2 = [r for r in test if r["domain"] == "chat-turn2"]
    assert turn2 and all([t["role"] for t in r["conversations"]] == ["user", "assistant", "user"] for r in turn2)
    assert all(r["conversations"][-1]["role"] == "user" for r in test)  # prompts, never answers


def test_no_training_prompt_equals_a_held_out_prompt(suite):
    test, train = rows(suite["files"]["test"]), rows(suite["files"]["train"])
    assert not {r["id"] for r in test} & {r["id"] for r in train}
    assert check_disjoint(suite["files"]["test"], suite["files"]["train"]) == []
    # GSM8K's own test questions are nowhere in the corpus, whitespace and case aside
    math = {prompt_key(r["conversations"][0]["content"]) for r in test if r["domain"] == "math"}
    assert not math & {prompt_key(t["content"]) for r in train for t in r["conversations"] if t["role"] == "user"}


def test_the_disjointness_check_finds_a_planted_overlap(suite, tmp_path):
    test = rows(suite["files"]["test"])
    planted = tmp_path / "train.jsonl"
    copy = {"id": "planted", "conversations": [{"role": "user",
                                                "content": "  " + test[5]["conversations"][0]["content"].upper()}]}
    planted.write_text(json.dumps(copy) + "\n")
    assert check_disjoint(suite["files"]["test"], planted) == ["planted"]


def test_stdlib_code_prompts_are_function_signatures_with_docstrings(suite):
    found = [r for r in rows(suite["files"]["train"]) if r["id"].startswith("stdlib-")]
    assert len(found) > 1000 and len({r["id"] for r in found}) == len(found)
    text = found[0]["conversations"][0]["content"]
    assert "```python\ndef " in text and '"""' in text


def test_installed_packages_add_code_prompts_each_once(suite):
    train = rows(suite["files"]["train"])
    code = [r for r in train if r["domain"] == "code"]
    from_packages = [r for r in code if r["id"].startswith("pkg-")]
    assert len(from_packages) > 1000 and set(suite["code_packages"]) == {"click", "rich", "textual"}
    assert suite["code_packages"]["textual"]["licence"] == "MIT"
    assert {r["id"].split(".")[0] for r in from_packages} >= {"pkg-click", "pkg-rich", "pkg-textual"}
    keys = [prompt_key(r["conversations"][0]["content"]) for r in from_packages]
    assert len(keys) == len(set(keys))  # a function copied from one module to another is asked once
    assert not set(keys) & {prompt_key(r["conversations"][0]["content"]) for r in code if r["id"].startswith("stdlib-")}
    assert all("```python\ndef " in r["conversations"][0]["content"] for r in from_packages)


def test_suite_refuses_options_that_do_not_apply(tmp_path):
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "data", "prepare", "suite", "--limit", "3"])
    assert result.exit_code != 0 and "suite takes only --out" in result.output
    for args, said in ((["suite", "--code-packages", "no_such_package"], "no_such_package is not installed"),
                       (["suite", "--code-packages", ","], "expected package names"),
                       (["gsm8k", "--code-packages", "click"], "--code-packages applies to the suite")):
        result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "data", "prepare", *args])
        assert result.exit_code == 2 and said in result.output, result.output


def test_the_printed_summary_names_every_training_domain_and_the_code_sources(suite, capsys):
    from adaflash.cli.data import print_suite_summary

    print_suite_summary(suite)
    out = capsys.readouterr().out
    assert "chat-later  test      0  train" in out and "code prompts from: the standard library (Python " in out
    assert "click " in out and "(BSD-3-Clause)" in out


def test_chosen_packages_are_found_by_import_name_with_their_licence_and_version():
    from adaflash.data.code_prompts import chosen_packages, installed_versions

    chosen = chosen_packages("yaml, click")  # yaml is installed by the distribution PyYAML
    assert set(chosen) == {"yaml", "click"} and chosen["click"] == "BSD-3-Clause" and chosen["yaml"] != "unknown"
    versions = installed_versions(chosen)
    assert all(v["version"] != "unknown" for v in versions.values()) and chosen_packages("none") == {}
