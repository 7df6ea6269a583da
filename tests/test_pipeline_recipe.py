"""The multi-GPU SmolLM2 recipe, planned without GPUs: the exact commands down to the torchrun workers."""

from __future__ import annotations

import json
import shlex
import time

from click.testing import CliRunner

from adaflash.cli.main import cli


def _plan(ws, *sets: str) -> dict:
    args = ["--workspace", str(ws), "run", "smollm2-h200x2", "--dry-run", "--json"]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stderr may hold notes about this machine's GPUs


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _workers(tmp_path, ws, argv: list[str], env: dict[str, str]) -> dict[str, str]:
    """What `adaflash pipeline ... --dry-run` prints for the recipe's pipeline job: role -> command line."""
    args = list(argv[argv.index("pipeline"):])
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    args[args.index("--draft") + 1] = "smollm2-135m-dflash"  # the recipe's own drafter is made by its jobs
    args[args.index("--data") + 1] = str(tmp_path / "prompts.jsonl")
    result = CliRunner().invoke(cli, ["--workspace", str(ws), *args, "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    return dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())


def test_h200x2_recipe_places_inference_on_gpu0_and_torchrun_training_on_the_rest(tmp_path):
    ws = tmp_path / "ws"
    plan = _plan(ws)
    jobs = {row["name"]: row for row in plan["jobs"]}
    assert list(jobs) == ["prepare", "vary", "pipeline", "report"]
    pipe = jobs["pipeline"]
    argv = pipe["argv"]
    assert argv[argv.index("-m") + 1] == "adaflash.cli.main" and "pipeline" in argv
    assert _option(argv, "--infer-gpus") == "0" and _option(argv, "--train-gpus") == "1"
    assert _option(argv, "--max-minutes") == "15" and _option(argv, "--preset") == "adaflash"
    assert _option(argv, "--draft") == "smollm2-135m-dflash" and "--skip" not in argv
    vary = jobs["vary"]["argv"]  # the prompts the drafter has not seen, with redrawn-number copies
    assert _option(vary, "--skip") == "6000" and _option(vary, "--variants") == "3"
    assert _option(vary, "--out") == _option(argv, "--data") and jobs["vary"]["after"] == ["prepare"]
    assert pipe["env"] == {"NCCL_NVLS_ENABLE": "0"}
    assert pipe["cuda_visible_devices"] is None  # a launcher: the pipeline gives each worker its GPUs
    assert jobs["pipeline"]["after"] == ["vary"] and jobs["report"]["after"] == ["pipeline"]
    swap = _option(argv, "--swap-dir")
    assert jobs["report"]["argv"][-4:] == ["pipeline", "status", "--swap-dir", swap]

    # the text plan shows the same exact command line
    text = CliRunner().invoke(cli, ["--workspace", str(ws), "run", "smollm2-h200x2", "--dry-run"])
    assert text.exit_code == 0 and "env: NCCL_NVLS_ENABLE=0" in text.output
    assert "--infer-gpus 0 --train-gpus 1" in text.output and "pipeline status --swap-dir" in text.output

    # one level down: the worker commands the pipeline starts (with the job's env, as the runner gives it)
    before = time.time()
    workers = _workers(tmp_path, ws, argv, pipe["env"])
    assert workers["inference"].startswith("CUDA_VISIBLE_DEVICES=0 NCCL_NVLS_ENABLE=0 ")
    assert workers["training"].startswith("CUDA_VISIBLE_DEVICES=1 NCCL_NVLS_ENABLE=0 ")
    train = shlex.split(workers["training"])
    assert "torch.distributed.run" not in train  # one training GPU: a single process
    payload = json.loads(train[-1])
    assert payload["device"] == "cuda" and payload["loss"]["kind"] == "rkl-mix" and payload["length_head"] is True
    assert before + 15 * 60 - 5 <= payload["deadline"] <= time.time() + 15 * 60
    assert payload["lr_decay_seconds"] == 0.0  # a constant rate unless the recipe's vars ask
    assert json.loads(shlex.split(workers["inference"])[-1])["loop"] is True  # a budget cycles over the prompts


def test_h200x2_recipe_scales_training_and_fits_one_gpu(tmp_path):
    ws = tmp_path / "ws"
    wide = {row["name"]: row for row in _plan(ws, "gpus.training=[1,2,3]", "vars.minutes=30",
                                              "vars.lr_decay_minutes=6")["jobs"]}
    argv = wide["pipeline"]["argv"]
    assert _option(argv, "--train-gpus") == "1,2,3" and _option(argv, "--max-minutes") == "30"
    workers = _workers(tmp_path, ws, argv, wide["pipeline"]["env"])
    train = shlex.split(workers["training"])
    assert json.loads(train[-1])["lr_decay_seconds"] == 360.0  # the recipe's anneal reaches every trainer
    assert train[:2] == ["CUDA_VISIBLE_DEVICES=1,2,3", "NCCL_NVLS_ENABLE=0"]
    assert train[train.index("torch.distributed.run") + 1:][:2] == ["--standalone", "--nproc_per_node=3"]
    assert train[-3:-1] == ["adaflash.pipeline.worker", "train"]

    one = {row["name"]: row for row in _plan(ws, "gpus.training=[0]", "vars.preset=osd")["jobs"]}
    argv = one["pipeline"]["argv"]
    assert _option(argv, "--infer-gpus") == "0" and _option(argv, "--train-gpus") == "0"
    assert _option(argv, "--preset") == "osd"
    workers = _workers(tmp_path, ws, argv, one["pipeline"]["env"])
    assert workers["inference"].startswith("CUDA_VISIBLE_DEVICES=0 ")
    assert workers["training"].startswith("CUDA_VISIBLE_DEVICES=0 ")
    assert json.loads(shlex.split(workers["training"])[-1])["loss"]["kind"] == "fkl"

    # without share = true the one-GPU variant is refused (the recipe turns sharing on for it)
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "run", "smollm2-h200x2", "--dry-run",
                                      "--set", "gpus.training=[0]", "--set", "gpus.share=false"])
    assert result.exit_code == 2 and "share" in result.output
