"""data ask: the target's own prompts, parsed from list pages, each kept once and never a held-out one."""

from __future__ import annotations

import json

from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.data.ask import ask, items, key
from adaflash.data.prompts import read_prompt_file


def test_items_are_read_up_to_the_end_of_the_list():
    assert items(' "How do tides work?"\n- Explain tides to a child.\n\nTopic: x\n- later') == [
        "How do tides work?", "Explain tides to a child."]
    assert items(" One question?\nNote: these are examples\n- not an item") == ["One question?"]
    assert key("What is a  Black Hole?") == key("what is a black hole") != key("what is a white hole")


def test_ask_keeps_each_prompt_once_and_none_held_out():
    seen_pages = []

    def complete(pages):
        seen_pages.extend(pages)
        return [" Why is the sky blue?\n- Why is the sky blue\n- ok\n- Write a haiku about rain, please."
                for _ in pages]

    asked = ask(complete, 5, seed=3, held_out=["write a haiku about RAIN please"], batch=4, max_pages=12)
    assert [r["conversations"][0]["content"] for r in asked.rows] == ["Why is the sky blue?"]  # the rest repeat
    assert (asked.pages, asked.items, asked.unusable, asked.held_out) == (12, 48, 12, 12)
    assert asked.repeats == 48 - 12 - 12 - 1
    texts = [text for text, _ in seen_pages]
    assert "Topic: cooking rice\n-" in texts[0] and texts[0].count("Topic:") == 3  # two worked topics, then its own
    assert len({seed for _, seed in seen_pages}) == 12  # each page draws with its own seed
    again = []
    ask(lambda pages: again.extend(pages) or ["" for _ in pages], 1, seed=3, batch=4, max_pages=4)
    assert again == seen_pages[:4]  # the same seed asks the same pages


def test_data_ask_cli_writes_prompt_rows_and_leaves_out_held_out_ones(tmp_path, tiny_llama):
    base = ["--workspace", str(tmp_path / "ws"), "data", "ask", "--target", str(tiny_llama), "--device", "cpu",
            "--num-samples", "4", "--max-new-tokens", "16", "--batch-size", "4", "--seed", "5", "--json"]
    first = tmp_path / "a.jsonl"
    result = CliRunner().invoke(cli, [*base, "--out", str(first)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    rows = read_prompt_file(first)  # rows any prompt-taking command reads
    assert len(rows) == summary["prompts"] >= 1 and all(r.domain == "ask" for r in rows)
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"prompt": rows[0].prompt[0]["content"].upper()}) + "\n")
    second = tmp_path / "b.jsonl"
    result = CliRunner().invoke(cli, [*base, "--out", str(second), "--held-out", str(held)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["held_out_matches"] >= 1
    assert rows[0].prompt not in [r.prompt for r in read_prompt_file(second)]
    result = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "c.jsonl"), "--held-out", "nothing-here"])
    assert result.exit_code == 2 and "--held-out" in result.output
