"""The Launch form's choices -> the recipe `jobs` plans: commands and flags of each mode, checks of the
typed fields, overrides of a chosen recipe, and TOML that a TOML reader reads back."""

from __future__ import annotations

import sys
from pathlib import Path

from jobs.launch_checks import drafts_of
from jobs.launch_plan import HEADER, LaunchChoice, build, default_roles, method_recipe
from jobs.recipe import parse_recipe


def choice(**kw) -> LaunchChoice:
    roles = kw.pop("roles", {"inference": (0,), "training": (1, 2), "server": (0,)})
    return LaunchChoice(roles=tuple(sorted(roles.items())), **kw)


def test_pipeline_choice_becomes_a_launcher_job_on_both_roles() -> None:
    text, errors, _ = method_recipe(choice(mode="pipeline", preset="osd", draft="d", dataset="f.jsonl",
                                           max_samples="8"))
    assert errors == []
    recipe = parse_recipe(text, "tui.toml")
    (job,) = recipe.jobs.values()
    assert job.launcher and job.gpus == (0, 1, 2) and job.cuda_visible_devices is None
    assert job.command == ["adaflash", "pipeline", "--target", "smollm2-135m", "--draft", "d", "--data", "f.jsonl",
                           "--infer-gpus", "0", "--train-gpus", "1,2", "--preset", "osd", "--max-samples", "8"]
    assert job.argv(sys.executable)[:3] == [sys.executable, "-m", "adaflash.cli.main"]
    assert job.stop_grace == 120  # a stop lets the step in flight finish and a final version be published


def test_pipeline_choice_takes_new_tokens_batch_size_and_a_time_budget() -> None:
    text, errors, _ = method_recipe(choice(mode="pipeline", draft="d", dataset="f.jsonl", max_samples="16",
                                           max_new_tokens="64", batch_size="4", max_minutes="2.5"))
    assert errors == []
    (job,) = parse_recipe(text, "tui.toml").jobs.values()
    assert job.command[-8:] == ["--max-samples", "16", "--max-new-tokens", "64", "--batch-size", "4",
                                "--max-minutes", "2.5"]
    _, errors, _ = method_recipe(choice(mode="pipeline", draft="d", dataset="f.jsonl", max_new_tokens="0",
                                        batch_size="many", max_minutes="-1"))
    assert errors == ["max new tokens: expected 1..∞, got 0", "batch size: expected an integer, got 'many'",
                      "max minutes: expected a number > 0, got -1"]


def test_server_choice_is_a_service_with_a_readiness_check() -> None:
    text, errors, _ = method_recipe(choice(mode="server", method="eagle3", draft="e3", port="31000",
                                           roles={"server": None}))
    assert errors == []
    job = next(iter(parse_recipe(text, "tui.toml").jobs.values()))
    assert job.kind == "service" and job.role == "server" and job.gpus is None
    assert job.ready.http == "http://127.0.0.1:31000/health"
    assert job.command[-4:] == ["--port", "31000", "--gpus", "cpu"]


def test_an_adapting_server_puts_its_trainer_on_the_training_role() -> None:
    text, errors, _ = method_recipe(choice(mode="server", method="adaflash", adapt=True,
                                           roles={"server": (0,), "training": (1,)}))
    assert errors == []
    job = next(iter(parse_recipe(text, "tui.toml").jobs.values()))
    assert job.kind == "service" and job.launcher and job.gpus == (0, 1)
    assert job.command[-5:] == ["--gpus", "0", "--adapt", "--train-gpus", "1"]
    _, errors, _ = method_recipe(choice(mode="server", method="vanilla", adapt=True,
                                        roles={"server": (0,), "training": (1,)}))
    assert errors == ["learn the traffic: needs DFlash, AdaFlash or OSD (it trains DFlash drafters), not vanilla"]


def test_bench_choice_needs_drafters_and_valid_numbers() -> None:
    bad = choice(mode="bench", bench_methods=("vanilla", "dflash"), dataset="gsm8k", concurrency="1,x",
                 num_prompts="0", target="org/other-model")
    _, errors, _ = method_recipe(bad)
    assert any("drafter: required for dflash" in e for e in errors)
    assert any("concurrency" in e for e in errors) and any("prompts" in e for e in errors)
    # the built-in target's own drafter stands in for an empty field: the command leaves --draft to the CLI
    text, errors, _ = method_recipe(choice(mode="bench", bench_methods=("vanilla", "dflash"), dataset="gsm8k"))
    assert errors == [] and "--draft" not in next(iter(parse_recipe(text, "tui.toml").jobs.values())).command
    text, errors, _ = method_recipe(choice(mode="pipeline", dataset="gsm8k"))
    assert errors == [] and "--draft" not in next(iter(parse_recipe(text, "tui.toml").jobs.values())).command
    _, errors, _ = method_recipe(choice(mode="pipeline", dataset="gsm8k", target="org/other-model"))
    assert any("drafter: required" in e for e in errors)
    good = choice(mode="bench", bench_methods=("vanilla", "dflash", "adaflash"), dataset="gsm8k",
                  draft="dflash=/a,adaflash=/b", concurrency="1,4", num_prompts="8")
    text, errors, warnings = method_recipe(good)
    assert errors == [] and warnings == ["drafter of dflash '/a' does not exist yet (the job fails unless it is "
                                         "created first)", "drafter of adaflash '/b' does not exist yet (the job fails "
                                         "unless it is created first)"]
    command = next(iter(parse_recipe(text, "tui.toml").jobs.values())).command
    assert command.count("--draft") == 2 and "adaflash=/b" in command and "1,4" in command
    _, _, warnings = method_recipe(choice(mode="bench", bench_methods=("dflash",), dataset="g", draft="/d"))
    assert any("no Vanilla" in w for w in warnings)


def test_launch_form_looks_for_datasets_drafters_and_targets_as_the_job_will(tmp_path) -> None:
    """A prepared dataset's name was warned about as missing (looked for as a file in the current folder),
    and a drafter for no chosen method or a target folder that does not exist passed silently."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gsm8k_train.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "data" / "gsm8k_test.jsonl").write_text('{"prompt": "hi"}\n')
    _, errors, warnings = method_recipe(choice(mode="pipeline", dataset="gsm8k"), tmp_path)
    assert errors == [] and warnings == []
    _, errors, warnings = method_recipe(choice(mode="bench", bench_methods=("vanilla", "dflash"),
                                               dataset="gsm8k,nosuchdataset", draft="nosuchmethod=/x"), tmp_path)
    assert errors == ["drafter: nosuchmethod= names no method of the matrix (vanilla, dflash)"]
    assert any(w.startswith("dataset nosuchdataset: neither a file nor a prepared dataset") for w in warnings)
    assert not any("gsm8k:" in w for w in warnings)
    _, _, warnings = method_recipe(choice(mode="server", target="/no/such/model", method="vanilla"), tmp_path)
    assert warnings == ["target '/no/such/model': no such folder (a built-in name, a hub id or a model folder)"]
    _, _, warnings = method_recipe(choice(mode="server", method="dflash", draft="smollm2-135m-dflash"), tmp_path)
    assert warnings == []  # a built-in drafter's name


def test_drafts_of_one_folder_or_pairs() -> None:
    errors: list[str] = []
    assert drafts_of("/d", ("vanilla", "dflash", "mtp"), errors) == ["dflash=/d", "mtp=/d"]
    assert drafts_of("osd=/o, adaflash=/a", ("osd",), errors) == ["osd=/o", "adaflash=/a"]
    drafts_of("osd=", ("osd",), errors)
    assert errors and "method=DIR" in errors[0]


def test_recipe_choice_overrides_only_what_the_user_changed(tmp_path: Path) -> None:
    c = choice(mode="recipe", recipe="smollm2-cpu", sets="vars.train_steps=3 'vars.note=a b'",
               roles={"inference": (1,), "training": None}, edited=("inference", "share"), share=True)
    built = build(c, tmp_path)
    assert built.recipe_text is None and built.errors == []
    assert built.overrides == ["gpus.inference=[1]", "gpus.share=true", "vars.train_steps=3", "vars.note=a b"]
    assert build(choice(mode="recipe", recipe=""), tmp_path).errors
    assert "expected KEY.PATH=VALUE" in build(choice(mode="recipe", recipe="x", sets="nope"), tmp_path).errors[0]


def test_method_choice_is_written_as_a_draft_then_a_final_recipe(tmp_path: Path) -> None:
    c = choice(mode="server", method="vanilla", roles={"server": (0,)})
    assert build(c, tmp_path).recipe_path == str(tmp_path / "tui-draft-server.toml")
    assert build(c, tmp_path, final="RUN").recipe_path == str(tmp_path / "tui-server-RUN.toml")


def test_default_roles() -> None:
    assert default_roles([]) == {"inference": None, "training": None, "server": None}
    assert default_roles([0]) == {"inference": (0,), "training": (0,), "server": (0,)}
    assert default_roles([0, 1, 2, 3]) == {"inference": (0,), "training": (1, 2, 3), "server": (0,)}


def test_the_recipe_is_written_by_a_toml_writer_so_any_text_reads_back() -> None:
    """Quotes, backslashes, newlines and non-ASCII in a field come back as typed, under the header line."""
    odd = 'models/"q\\w"\nü'
    text, errors, _ = method_recipe(choice(mode="server", method="dflash", target=odd, draft=odd, port="31000",
                                           roles={"server": (0, 1)}))
    assert errors == [] and text.startswith(HEADER)
    recipe = parse_recipe(text, "tui.toml")
    (job,) = recipe.jobs.values()
    assert job.command[job.command.index("--target") + 1] == odd
    assert job.command[job.command.index("--draft") + 1] == odd
    assert job.gpus == (0, 1)
