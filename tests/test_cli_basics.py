"""The CLI as a user meets it: help for every command, models, generate, runs."""

import json

from click.testing import CliRunner

from adaflash.cli.main import COMMANDS, cli


def test_help_lists_every_command_and_each_has_help():
    runner = CliRunner()
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, (_, _, description) in COMMANDS.items():
        assert name in result.output
        assert description.split()[0] in result.output
        sub = runner.invoke(cli, [name, "--help"])
        assert sub.exit_code == 0, (name, sub.output)
        assert "Usage:" in sub.output


def test_models_list_json_reports_the_builtin(smollm2_folder):
    result = CliRunner().invoke(cli, ["models", "list", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    smol = next(r for r in rows if r["name"] == "smollm2-135m")
    assert smol["ready"] is True
    assert smol["cached_at"] == str(smollm2_folder)


def test_generate_json_and_recorded_in_runs(tmp_path, smollm2_folder):
    runner = CliRunner()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 2+3?"}) + "\n"
                       + json.dumps({"id": "conv", "conversations": [{"role": "user", "content": "Say hi."},
                                                                      {"role": "assistant", "content": "Hi!"}]}) + "\n")
    ws = str(tmp_path / "ws")
    result = runner.invoke(cli, ["--workspace", ws, "generate", "--target", "smollm2-135m", "--prompts", str(prompts),
                                 "--max-new-tokens", "12", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2
    for row in lines:
        assert set(row) == {"text", "output_ids", "meta_info"}
        meta = row["meta_info"]
        assert {"prompt_tokens", "completion_tokens", "finish_reason", "e2e_latency"} <= set(meta)
        assert meta["completion_tokens"] == len(row["output_ids"]) <= 12
    assert "5" in lines[0]["text"]
    listing = runner.invoke(cli, ["--workspace", ws, "runs", "list", "--json"])
    runs = json.loads(listing.output)
    assert runs[0]["kind"] == "generate" and runs[0]["status"] == "finished"
    shown = runner.invoke(cli, ["--workspace", ws, "runs", "show", runs[0]["id"], "--json"])
    assert json.loads(shown.output)["metrics"]["completion_tokens"] > 0


def test_generate_bad_inputs_are_clear(tmp_path):
    runner = CliRunner()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    result = runner.invoke(cli, ["--workspace", str(tmp_path), "generate", "--prompts", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:2" in result.output and "not valid JSON" in result.output
    result = runner.invoke(cli, ["--workspace", str(tmp_path), "generate", "--prompt", "x", "--method", "osd"])
    assert result.exit_code == 2 and "--method osd needs --draft" in result.output  # no built-in OSD drafter
    result = runner.invoke(cli, ["--workspace", str(tmp_path), "generate", "--prompt", "x", "--target", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_unusable_paths_are_one_line_errors_not_tracebacks(tmp_path):
    """A damaged run log, a folder inside a file, an output folder that does not exist."""
    import subprocess
    import sys

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "runlog.sqlite").write_text("not a database\n")
    (tmp_path / "notes.txt").write_text("x\n")
    (tmp_path / "rows.jsonl").write_text('{"prompt": "hi"}\n')
    cases = [
        (["--workspace", str(tmp_path / "ws"), "runs", "list"], "runlog.sqlite: not a run log that can be opened"),
        (["draft", "new", "--method", "dflash", "--out", str(tmp_path / "notes.txt" / "d")],
         "notes.txt is a file, so no folder can be made inside it"),
        (["--workspace", str(tmp_path / "ok"), "data", "prepare", str(tmp_path / "rows.jsonl"), "--out",
          str(tmp_path / "notes.txt" / "data")], "notes.txt"),
    ]
    for argv, expected in cases:
        done = subprocess.run([sys.executable, "-m", "adaflash.cli.main", *argv], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode in (1, 2) and expected in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr


def test_runs_list_never_shortens_an_id(tmp_path):
    """Ids are copied into `runs show` and `runs compare`: a wide row cut them to `20261201-…-bench-mat…`."""
    from adaflash.runlog import RunLog

    log = RunLog.open(tmp_path)
    run_id = log.create_run("bench-matrix", draft="/very/long/" + "x" * 150, target="t" * 60, dataset="d" * 40)
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path), "runs", "list"])
    assert result.exit_code == 0 and run_id in result.output, result.output


def test_ctrl_c_exits_130_and_errors_keep_their_codes(monkeypatch, tmp_path, capsys):
    """click turns Ctrl-C into "Aborted!" and exit 1; `adaflash run` documents 130 for a stop."""
    import pytest

    from adaflash.cli import main as entry
    from adaflash.cli.runs import runs

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs.commands["list"], "callback", interrupted)
    for argv, code in ((["runs", "list"], 130), (["runs", "show", "nope"], 2), (["nosuch"], 2), (["--version"], 0)):
        monkeypatch.setattr("sys.argv", ["adaflash", "--workspace", str(tmp_path), *argv])
        with pytest.raises(SystemExit) as done:
            entry.main()
        err = capsys.readouterr().err
        assert done.value.code == code, (argv, err)
        assert ("interrupted" in err) == (code == 130) and "Traceback" not in err


def test_an_out_file_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"prompt": "What is 2 + 3?"}\n')
    (tmp_path / "notes.txt").write_text("x\n")
    for command in ("vary", "regenerate"):
        result = CliRunner().invoke(cli, ["--workspace", str(tmp_path), "data", command, "--dataset",
                                          str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / "notes.txt" / "o.jsonl")])
        assert result.exit_code == 2 and "notes.txt is a file, not a folder" in result.output, result.output


def test_generate_streams_nothing_a_stop_string_takes_back(tmp_path, smollm2_folder):
    """A stop string spanning tokens: the stream printed its first part, then the final text ended before it."""
    ws = str(tmp_path / "ws")
    base = ["--workspace", ws, "generate", "--prompt", "Count from 1 to 20, separated by commas.", "--max-new-tokens", "40"]
    full = json.loads(CliRunner().invoke(cli, [*base, "--json"]).stdout.splitlines()[0])["text"]
    stop = full[len(full) // 2: len(full) // 2 + 3]
    expected = json.loads(CliRunner().invoke(cli, [*base, "--stop", stop, "--json"]).stdout.splitlines()[0])["text"]
    streamed = CliRunner().invoke(cli, [*base, "--stop", stop])
    assert streamed.exit_code == 0, streamed.output
    assert expected == full[: full.find(stop)] and streamed.stdout in (expected, expected + "\n"), streamed.stdout


def test_reading_a_workspace_with_no_run_log_names_it_and_creates_nothing(tmp_path):
    """A mistyped --workspace must not become an empty workspace that lists nothing."""
    typo = tmp_path / "workpsace"
    for args in (["runs", "list"], ["runs", "show", "r1"], ["runs", "compare"], ["pipeline", "status"]):
        result = CliRunner().invoke(cli, ["--workspace", str(typo), *args])
        assert result.exit_code == 2, (args, result.output)
        assert f"no run log in workspace {typo}" in result.output, args
    assert not typo.exists()


def test_argv_of_spells_out_a_commands_values_so_a_child_parses_the_same():
    """What `data regenerate --procs` hands its child processes: every option, global ones included, in
    a form that parses back to the same values, without the ones left out."""
    import click

    from adaflash.cli.common import argv_of

    seen: list[tuple[list[str], dict]] = []

    @click.group()
    @click.option("--workspace", default=None)
    def root(workspace):
        pass

    @root.command("job")
    @click.option("--name", default="x")
    @click.option("--count", type=int, default=1)
    @click.option("--chat/--no-chat", default=True)
    @click.option("--fast", is_flag=True)
    @click.option("--tag", multiple=True)
    @click.option("--skip-me", default="a")
    @click.pass_context
    def job(ctx, **values):
        seen.append((argv_of(ctx, {"skip_me"}), values))

    args = ["--workspace", "-w dir", "job", "--name", "-dash", "--no-chat", "--fast", "--tag", "a", "--tag", "b",
            "--skip-me", "z"]
    assert CliRunner().invoke(root, args).exit_code == 0
    argv, values = seen[0]
    assert "--skip-me=z" not in argv and argv[:2] == ["--workspace=-w dir", "job"]
    assert CliRunner().invoke(root, argv).exit_code == 0
    assert seen[1][1] == {**values, "skip_me": "a"}
