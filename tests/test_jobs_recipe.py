"""Recipes: structure, messages with file/key/line, overrides, placeholders, the job graph."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.overrides import parse_override
from jobs.recipe import RecipeError, load_recipe, parse_recipe, shipped_recipes
from jobs.recipe_spec import Recipe
from jobs.toml_lines import key_lines

GOOD = """\
[run]
name = "demo"
description = "a demo"

[vars]
target = "smollm2-135m"
data = "{run_dir}/data"

[gpus]
inference = [0]
training = [1, 2]
share = true

[jobs.prep]
command = ["adaflash", "data", "prepare", "gsm8k", "--out", "{vars.data}"]

[jobs.train]
command = ["adaflash", "train", "draft", "--target", "{vars.target}", "--nproc", "{nproc.training}"]
role = "training"
after = ["prep"]
torchrun = { nproc = "auto" }
restart = "on-failure"
max_restarts = 2
backoff = 0.5

[jobs.pipeline]
command = ["adaflash", "pipeline", "--infer-gpus", "{gpus.inference}", "--train-gpus", "{gpus.training}"]
gpus = ["inference", "training"]
after = ["train"]
env = { OMP_NUM_THREADS = 2 }

[jobs.serve]
command = ["adaflash", "serve", "--port", "30000"]
kind = "service"
role = "server"
gpus = [0]
after = ["pipeline"]
ready = { http = "http://127.0.0.1:30000/health", timeout = 60 }
"""


def test_good_recipe_resolves_commands_gpus_and_placeholders() -> None:
    recipe = parse_recipe(GOOD, "demo.toml", context={"run_id": "R", "run_dir": "/w/runs/R", "workspace": "/w"})
    assert recipe.order() == ["prep", "train", "pipeline", "serve"]
    prep = recipe.jobs["prep"]
    assert prep.argv() == [sys.executable, "-m", "adaflash.cli.main", "data", "prepare", "gsm8k", "--out", "/w/runs/R/data"]
    assert prep.gpus is None and prep.cuda_visible_devices == ""  # no GPU: CUDA hidden
    train = recipe.jobs["train"]
    assert train.gpus == (1, 2) and train.cuda_visible_devices == "1,2" and train.torchrun_nproc == 2
    argv = train.argv()
    assert "--nproc_per_node" in argv and argv[argv.index("--nproc_per_node") + 1] == "2"
    assert argv[-8:] == ["-m", "adaflash.cli.main", "train", "draft", "--target", "smollm2-135m", "--nproc", "2"]
    assert train.restart.mode == "on-failure" and train.restart.max_restarts == 2
    assert train.restart.delay(0) == 0.5 and train.restart.delay(2) == 2.0
    pipe = recipe.jobs["pipeline"]
    assert pipe.launcher and pipe.cuda_visible_devices is None and pipe.gpus == (0, 1, 2)
    assert pipe.command[-4:] == ["--infer-gpus", "0", "--train-gpus", "1,2"]
    assert pipe.env == {"OMP_NUM_THREADS": "2"}
    serve = recipe.jobs["serve"]
    assert serve.kind == "service" and serve.ready.http.endswith("/health") and serve.ready.timeout == 60
    # pipeline (a task) ends before serve starts: GPU 0 is not shared at the same time.
    assert not recipe.may_overlap("pipeline", "serve")
    # The resolved recipe round-trips through JSON (it is the run's config in the run log).
    again = Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))
    assert again.jobs["train"].argv() == argv and again.order() == recipe.order()


def test_array_of_job_tables_is_accepted() -> None:
    text = '[run]\nname = "x"\n\n[[job]]\nname = "a"\ncommand = ["true"]\n\n[[job]]\nname = "b"\ncommand = ["true"]\nafter = ["a"]\n'
    recipe = parse_recipe(text, "x.toml")
    assert recipe.order() == ["a", "b"]


def _problems(text: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "bad.toml", overrides or [])
    return str(info.value)


def test_errors_name_file_key_line_and_expected_type() -> None:
    text = GOOD.replace('role = "training"\n', 'role = "training"\ncolour = "red"\n').replace(
        'gpus = [0]\n', 'gpus = 3.5\n')
    message = _problems(text)
    lines = text.splitlines()
    colour_line = next(i for i, line in enumerate(lines, 1) if line.startswith("colour"))
    gpus_line = next(i for i, line in enumerate(lines, 1) if line.startswith("gpus = 3.5"))
    assert f"bad.toml:{colour_line}: jobs.train.colour: unknown key" in message
    assert f"bad.toml:{gpus_line}: jobs.serve.gpus: expected a role name" in message
    assert "got 3.5 (float)" in message


def test_many_mistakes_are_listed_at_once() -> None:
    text = """\
[run]
name = "bad"

[gpus]
inference = []
training = [0, "cpu"]

[jobs.a]
command = "adaflash serve --port 1"
after = ["nope"]

[jobs.b]
command = ["x", 3]
kind = "daemon"
ready = { http = "localhost:80" }

[[job]]
name = "c"
command = ["y", "{vars.missing}"]
restart = "always"
"""
    message = _problems(text)
    assert "bad.toml:5: gpus.inference: role 'inference' has no GPU" in message
    assert "bad.toml:6: gpus.training: role 'training': \"cpu\" cannot be mixed with GPU indices" in message
    assert "bad.toml:9: jobs.a.command: expected a list of strings (argv, never a shell string)" in message
    assert "bad.toml:10: jobs.a.after: unknown job 'nope'" in message
    assert "bad.toml:13: jobs.b.command: item 1: expected a string, got 3 (integer)" in message
    assert "bad.toml:14: jobs.b.kind: expected one of task, service, got 'daemon'" in message
    assert "bad.toml:15: jobs.b.ready.http: expected an http:// URL" in message
    assert "bad.toml:19: job[0].command: unknown placeholder {vars.missing}" in message
    assert "bad.toml:20: job[0].restart: expected one of never, on-failure" in message


def test_a_misspelt_placeholder_is_named_with_its_likely_spelling() -> None:
    """`{run_dri}` or `{varz.x}` would reach the command as written; JSON and other brace words still pass."""
    text = """\
[run]
name = "typo"

[vars]
x = "1"
out = "{run_dri}/out"

[jobs.a]
command = ["y", "{varz.x}", "{pythn}", '{"json": 1}', "{value}"]
"""
    message = _problems(text)
    assert "bad.toml:6: vars.out: unknown placeholder {run_dri}: did you mean {run_dir}?" in message
    assert "bad.toml:9: jobs.a.command: unknown placeholder {varz.x}: did you mean {vars.x}?" in message
    assert "{json" not in message and "{value}" not in message


def test_cycles_self_dependencies_and_missing_sections() -> None:
    text = '[run]\nname = "c"\n[jobs.a]\ncommand = ["x"]\nafter = ["b"]\n[jobs.b]\ncommand = ["y"]\nafter = ["a"]\n'
    assert "dependency cycle: a -> b -> a" in _problems(text)
    assert "a job cannot wait for itself" in _problems('[run]\nname = "s"\n[jobs.a]\ncommand = ["x"]\nafter = ["a"]\n')
    message = _problems('[jobs.a]\ncommand = ["x"]\n')
    assert "run: required key missing (expected a table)" in message
    assert "jobs: the recipe has no jobs" in _problems('[run]\nname = "empty"\n')


def test_invalid_toml_reports_its_line() -> None:
    message = _problems('[run]\nname = "x"\n[jobs.a]\ncommand = ["a", oops]\n')
    assert message.startswith("bad.toml:4: invalid TOML")


def test_role_without_gpus_and_unknown_role_are_refused() -> None:
    text = '[run]\nname = "r"\n[gpus]\ninference = [0]\n[jobs.t]\ncommand = ["x"]\nrole = "training"\n'
    assert "bad.toml:7: jobs.t.role: role 'training' has no GPUs in [gpus]" in _problems(text)
    text = '[run]\nname = "r"\n[gpus]\ninference = [0]\n[jobs.t]\ncommand = ["x"]\ngpus = ["inference", "trainin"]\n'
    assert "unknown role(s) 'trainin'" in _problems(text)


def test_conflicting_roles_on_one_gpu_at_the_same_time() -> None:
    text = """\
[run]
name = "clash"
[gpus]
server = [0]
training = [0]
[jobs.serve]
command = ["s"]
role = "server"
kind = "service"
[jobs.train]
command = ["t"]
role = "training"
"""
    message = _problems(text)
    assert "GPU 0 is given to role 'server' (job 'serve') and role 'training' (job 'train')" in message
    assert "servers and other exclusive roles never share a GPU" in message
    # Sequential jobs may use the same GPU; inference + training share only with share = true.
    seq = text.replace('kind = "service"\n', "").replace('role = "training"\n', 'role = "training"\nafter = ["serve"]\n')
    assert parse_recipe(seq, "ok.toml").order() == ["serve", "train"]
    both = text.replace("server = [0]", "inference = [0]").replace('role = "server"', 'role = "inference"')
    assert "set share = true in [gpus]" in _problems(both)
    shared = both.replace("[gpus]\n", "[gpus]\nshare = true\n")
    assert parse_recipe(shared, "ok.toml").jobs["train"].gpus == (0,)


def test_overrides_parse_toml_literals_and_point_at_the_flag() -> None:
    assert parse_override("gpus.training=[1,2]") == (["gpus", "training"], [1, 2])
    assert parse_override("vars.target=Qwen/Qwen3-8B") == (["vars", "target"], "Qwen/Qwen3-8B")
    assert parse_override("jobs.a.max_restarts=3") == (["jobs", "a", "max_restarts"], 3)
    recipe = parse_recipe(GOOD, "demo.toml", ["vars.target=Qwen/Qwen3-8B", "gpus.training=[1,2,3]"])
    assert "Qwen/Qwen3-8B" in recipe.jobs["train"].command and recipe.jobs["train"].torchrun_nproc == 3
    message = _problems(GOOD, ["jobs.train.max_restarts=many"])
    assert "jobs.train.max_restarts: expected an integer >= 0, got 'many' (string) (from --set jobs.train.max_restarts=many)" in message
    with pytest.raises(RecipeError, match="expected key.path=value"):
        parse_recipe(GOOD, "demo.toml", ["novalue"])
    # a var or GPU role the recipe does not have (a typo) changed nothing and went unnoticed
    with pytest.raises(RecipeError, match=r"--set vars.targt=x: the recipe has no var 'targt' \(it has data, target\)"):
        parse_recipe(GOOD, "demo.toml", ["vars.targt=x"])
    with pytest.raises(RecipeError, match="the recipe has no GPU role 'trainig'"):
        parse_recipe(GOOD, "demo.toml", ["gpus.trainig=[1]"])
    assert parse_recipe(GOOD, "demo.toml", ["gpus.share=true"])  # a setting of [gpus], not a role


def test_key_lines_follow_tables_inline_tables_and_multiline_arrays() -> None:
    text = '[run]\nname = "x"\n\n[jobs.a]\ncommand = [\n  "a",\n  "b = c",\n]\nready = { http = "u", timeout = 3 }\n\n[[job]]\nname = "z"\n'
    lines = key_lines(text)
    assert lines["run.name"] == 2 and lines["jobs.a.command"] == 5 and lines["jobs.a.ready.timeout"] == 9
    assert "jobs.a.b" not in lines and lines["job[0].name"] == 12


def test_every_shipped_recipe_validates() -> None:
    names = {p.stem for p in shipped_recipes()}
    assert {"smollm2-cpu", "qwen3-8b", "qwen3-coder-30b-a3b", "qwen3.5-9b"} <= names
    for path in shipped_recipes():
        recipe = load_recipe(path, context={"run_id": "R", "run_dir": "/tmp/R", "workspace": "/tmp"})
        assert recipe.jobs, path
        for spec in recipe.jobs.values():
            text = " ".join(spec.command)
            assert not re.search(r"\{(vars|gpus|nproc)\.|\{run_(id|dir)\}", text), (path, text)
    cpu = load_recipe("smollm2-cpu")
    assert cpu.gpus_in_use() == set()  # the local default runs anywhere
    with pytest.raises(RecipeError, match=r"smollm2-cpux: no such recipe file, nor a shipped .*smollm2-cpu, "):
        load_recipe("smollm2-cpux")


@pytest.mark.parametrize("name", ["smollm2-cpu", "qwen3-8b", "qwen3-coder-30b-a3b", "qwen3.5-9b", "smollm2-drafter-h200",
                                  "smollm2-drafter-varied-h200", "smollm2-h200x2", "smollm2-compare-h200",
                                  "smollm2-general-more-h200"])
def test_dry_run_prints_the_plan_of_each_shipped_recipe(name: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "adaflash.cli.main", "--workspace", str(tmp_path / "ws"), "run", name, "--dry-run"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    recipe = load_recipe(name)
    for job in recipe.jobs:
        assert f". {job} [" in done.stdout
    assert "$ " in done.stdout and "adaflash.cli.main" in done.stdout
    # Nothing was started or recorded: a plan has no side effects.
    assert not (tmp_path / "ws").exists()


def test_the_export_job_copies_the_pipelines_newest_version(tmp_path: Path, tiny_target) -> None:
    # The pipeline publishes swap/weights/v{N} and a LATEST pointer; the benchmark needs one stable folder.
    from adaflash.models.drafter_io import new_drafter
    from adaflash.pipeline.weights import WeightStore

    store = WeightStore(tmp_path / "swap")
    for seed in (1, 2):
        store.publish(new_drafter("dflash", tiny_target.model.cfg, block_size=4, seed=seed), {"target": "tiny"})
    recipe = load_recipe("smollm2-cpu", context={"run_id": "R", "run_dir": str(tmp_path / "run"), "workspace": "/tmp",
                                                 "cache_dir": str(tmp_path)})
    done = subprocess.run(recipe.jobs["export_adaflash"].argv(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    exported = tmp_path / "drafters" / "adaflash-online" / "model.safetensors"
    assert exported.read_bytes() == (store.folder(2) / "model.safetensors").read_bytes()
    assert "adaflash=" + str(tmp_path / "drafters" / "adaflash-online") in recipe.jobs["bench"].command


def test_a_bad_gpus_setting_is_reported_once_not_as_unknown_roles() -> None:
    """A wrong `share`/`exclusive` names that key; the roles that did parse still resolve in the jobs."""
    message = _problems(GOOD.replace("share = true", 'share = true\nexclusive = "server"'))
    assert "gpus.exclusive: expected a list of role names" in message
    assert "unknown role" not in message and "unknown placeholder" not in message


def test_a_recipe_that_is_not_utf8_names_the_file(tmp_path) -> None:
    path = tmp_path / "m6.toml"
    path.write_bytes(b"\xff\xfe[run]\n")
    with pytest.raises(RecipeError, match=r"m6.toml: not UTF-8 text \(byte 0xff at offset 0\)"):
        load_recipe(path)

