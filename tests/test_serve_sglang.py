"""SGLang launch command lines per method and model, checked without SGLang installed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.devices import parse_gpus
from adaflash.serve.sglang import ADAFLASH_FLAGS, build_sglang_command


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_vanilla_is_plain_launch_server_with_tp_from_gpus():
    cmd = build_sglang_command("vanilla", "Qwen/Qwen3-8B", gpus="2,3", port=31000, max_batch=32)
    assert cmd.argv[1:3] == ["-m", "sglang.launch_server"]
    assert _flag(cmd.argv, "--model-path") == "Qwen/Qwen3-8B"
    assert _flag(cmd.argv, "--tp-size") == "2" and _flag(cmd.argv, "--port") == "31000"
    assert _flag(cmd.argv, "--host") == "127.0.0.1"
    assert _flag(cmd.argv, "--max-running-requests") == "32"
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "--speculative-algorithm" not in cmd.argv
    assert _flag(cmd.argv, "--attention-backend") == "fa3" and "--trust-remote-code" in cmd.argv


def test_dflash_reads_the_block_size_from_the_drafter_folder(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"block_size": 8, "dflash_config": {"block_size": 8}}))
    cmd = build_sglang_command("dflash", "Qwen/Qwen3-8B", str(draft))
    assert _flag(cmd.argv, "--speculative-algorithm") == "DFLASH"
    assert _flag(cmd.argv, "--speculative-draft-model-path") == str(draft)
    assert _flag(cmd.argv, "--speculative-dflash-block-size") == "8"
    assert not any(flag in cmd.argv for flag in ADAFLASH_FLAGS.values())
    hub = build_sglang_command("osd", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", block_size=16)
    assert _flag(hub.argv, "--speculative-algorithm") == "DFLASH"
    assert _flag(hub.argv, "--speculative-dflash-block-size") == "16"


def test_adaflash_adds_the_length_head_flags_and_enough_running_requests():
    cmd = build_sglang_command("adaflash", "Qwen/Qwen3-8B", "/ckpt/adaflash", length_rate=1.3, min_length=3)
    assert _flag(cmd.argv, "--speculative-algorithm") == "DFLASH"
    assert ADAFLASH_FLAGS["dynamic_verify"] in cmd.argv
    assert _flag(cmd.argv, ADAFLASH_FLAGS["length_rate"]) == "1.3"
    assert _flag(cmd.argv, ADAFLASH_FLAGS["min_length"]) == "3"
    assert int(_flag(cmd.argv, "--max-running-requests")) > 48
    low = build_sglang_command("adaflash", "Qwen/Qwen3-8B", "/ckpt/adaflash", max_batch=32)
    assert any("48" in note for note in low.notes)


def test_eagle3_uses_per_model_defaults_and_steps_override():
    qwen3 = build_sglang_command("eagle3", "Qwen/Qwen3-8B", "Tengyunw/qwen3_8b_eagle3")
    assert _flag(qwen3.argv, "--speculative-algorithm") == "EAGLE3"
    assert [_flag(qwen3.argv, f) for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                          "--speculative-num-draft-tokens")] == ["6", "10", "32"]
    coder = build_sglang_command("eagle3", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "d", steps=3)
    assert _flag(coder.argv, "--speculative-num-steps") == "3"
    assert coder.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"


def test_mtp_is_nextn_with_the_qwen35_extras():
    cmd = build_sglang_command("mtp", "Qwen/Qwen3.5-9B", gpus="0")
    assert _flag(cmd.argv, "--speculative-algorithm") == "NEXTN"
    assert [_flag(cmd.argv, f) for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                        "--speculative-num-draft-tokens")] == ["3", "1", "4"]
    assert _flag(cmd.argv, "--mamba-scheduler-strategy") == "extra_buffer"
    assert _flag(cmd.argv, "--reasoning-parser") == "qwen3"
    assert cmd.env["SGLANG_DISABLE_CUDNN_CHECK"] == "1"
    assert "--speculative-draft-model-path" not in cmd.argv and not cmd.notes
    other = build_sglang_command("mtp", "meta-llama/Llama-3.1-8B-Instruct")
    assert other.notes


def test_builtin_target_becomes_its_hub_id_and_extra_args_come_last():
    cmd = build_sglang_command("vanilla", "smollm2-135m", api_key="k", extra_args=["--mem-fraction-static 0.5"])
    assert _flag(cmd.argv, "--model-path") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cmd.argv[-2:] == ["--mem-fraction-static", "0.5"] and _flag(cmd.argv, "--api-key") == "k"


def test_refusals():
    with pytest.raises(ValueError, match="needs --draft"):
        build_sglang_command("dflash", "Qwen/Qwen3-8B")
    with pytest.raises(ValueError, match="GPUs only"):
        build_sglang_command("vanilla", "Qwen/Qwen3-8B", gpus="cpu")
    with pytest.raises(ValueError):
        parse_gpus("0,0")
    with pytest.raises(ValueError):
        build_sglang_command("medusa", "Qwen/Qwen3-8B")


def test_serve_dry_run_prints_the_command(workspace):
    from adaflash.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", "--engine", "sglang", "--method", "dflash", "--target", "Qwen/Qwen3.5-9B",
                                      "--draft", "z-lab/Qwen3.5-9B-DFlash", "--gpus", "0,1", "--port", "30001",
                                      "--dry-run"])
    assert result.exit_code == 0, result.output
    line = result.stdout.strip().splitlines()[-1]
    words = shlex.split(line)
    assert "CUDA_VISIBLE_DEVICES=0,1" in words and "SGLANG_ENABLE_SPEC_V2=1" in words
    argv = words[words.index("-m") - 1:]
    assert _flag(argv, "--tp-size") == "2" and _flag(argv, "--speculative-algorithm") == "DFLASH"
    embedded = CliRunner().invoke(cli, ["serve", "--method", "vanilla", "--dry-run", "--gpus", "cpu"])
    assert embedded.exit_code == 0 and json.loads(embedded.stdout)["device"] == "cpu"
    refused = CliRunner().invoke(cli, ["serve", "--engine", "sglang", "--method", "eagle3", "--dry-run"])
    assert refused.exit_code == 2 and "needs --draft" in refused.output
    grouped = CliRunner().invoke(cli, ["serve", "--method", "vanilla", "--dry-run", "--admit-batch", "4"])
    assert grouped.exit_code == 0 and json.loads(grouped.stdout)["engine_config"]["admit_batch"] == 4
    assert json.loads(grouped.stdout)["engine_config"]["overlap"] is None  # the engine's choice: on a GPU only
    plain = CliRunner().invoke(cli, ["serve", "--method", "vanilla", "--dry-run", "--no-overlap"])
    assert plain.exit_code == 0 and json.loads(plain.stdout)["engine_config"]["overlap"] is False
    # SGLang has its own overlap scheduler: --no-overlap turns it off the same way
    for flag, passed in (("--no-overlap", True), ("--overlap", False)):
        sglang = CliRunner().invoke(cli, ["serve", "--engine", "sglang", "--method", "vanilla", "--dry-run", flag])
        assert sglang.exit_code == 0, sglang.output
        assert ("--disable-overlap-schedule" in shlex.split(sglang.stdout.strip().splitlines()[-1])) is passed
    for args, message in ((["--admit-batch", "0"], "--admit-batch"),
                          (["--admit-batch", "2", "--engine", "sglang", "--draft", "d"], "embedded engine")):
        bad = CliRunner().invoke(cli, ["serve", "--method", "dflash", "--dry-run", *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_serve_limits_and_the_served_name_reach_both_engines(workspace):
    from adaflash.cli.main import cli

    embedded = CliRunner().invoke(cli, ["serve", "--dry-run", "--served-model-name", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                        "--header-timeout", "5", "--max-connections", "100",
                                        "--max-new-tokens-limit", "0"])
    config = json.loads(embedded.stdout)
    assert config["served_model_name"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and config["header_timeout"] == 5
    assert config["max_connections"] == 100 and config["max_new_tokens_limit"] is None
    assert json.loads(CliRunner().invoke(cli, ["serve", "--dry-run"]).stdout)["max_new_tokens_limit"] == 2048
    assert config["stream_interval"] == 1
    assert json.loads(CliRunner().invoke(cli, ["serve", "--dry-run", "--stream-interval", "8"]).stdout)["stream_interval"] == 8
    sglang = CliRunner().invoke(cli, ["serve", "--engine", "sglang", "--method", "vanilla", "--dry-run",
                                      "--served-model-name", "smol", "--stream-interval", "8"])
    launch = shlex.split(sglang.stdout.strip().splitlines()[-1])
    assert _flag(launch, "--served-model-name") == "smol" and _flag(launch, "--stream-interval") == "8"
    plain = CliRunner().invoke(cli, ["serve", "--engine", "sglang", "--method", "vanilla", "--dry-run"])
    assert "--stream-interval" not in plain.stdout  # SGLang's own default stands
    assert CliRunner().invoke(cli, ["serve", "--dry-run", "--stream-interval", "0"]).exit_code == 2
    refused = CliRunner().invoke(cli, ["serve", "--dry-run", "--header-timeout", "0"])
    assert refused.exit_code == 2 and "--header-timeout" in refused.output


def test_serve_without_sglang_installed_says_how_to_get_it(workspace):
    import importlib.util

    from adaflash.cli.main import cli

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here")
    result = CliRunner().invoke(cli, ["serve", "--engine", "sglang", "--method", "vanilla", "--gpus", "0"])
    assert result.exit_code == 2 and "adaflash[sglang]" in result.output


FAKE_SGLANG = '''\
import os, signal, subprocess, sys, time
def term(*_):
    open(os.environ["FAKE_SGLANG_MARK"], "w").write("term")
    os.killpg(0, signal.SIGKILL)  # as SGLang does: its whole process tree goes
signal.signal(signal.SIGTERM, term)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(os.environ["FAKE_SGLANG_PIDS"] + ".tmp", "w").write(f"{os.getpid()} {child.pid}")
os.replace(os.environ["FAKE_SGLANG_PIDS"] + ".tmp", os.environ["FAKE_SGLANG_PIDS"])
time.sleep(120)
'''


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_serve_command_leaves_no_sglang_behind(tmp_path):
    """`serve --engine sglang` killed with SIGKILL left SGLang running, orphaned, holding its GPUs and port."""
    import os
    import signal
    import subprocess
    import sys

    from adaflash.procs import start_time

    from .test_jobs_supervisor import wait_for

    env, pids, mark = _fake_sglang(tmp_path, FAKE_SGLANG)
    serve = subprocess.Popen([sys.executable, "-m", "adaflash.cli.main", "--workspace", str(tmp_path / "ws"), "serve",
                              "--engine", "sglang", "--method", "vanilla", "--gpus", "0", "--port", "9"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        leader, child = map(int, wait_for(lambda: pids.exists() and pids.read_text().split(), timeout=60))
        os.kill(serve.pid, signal.SIGKILL)
        serve.wait()
        for pid in (leader, child):
            wait_for(lambda pid=pid: start_time(pid) is None, timeout=20)
        assert mark.read_text() == "term"
    finally:
        if serve.poll() is None:
            serve.kill()


def _fake_sglang(tmp_path, source: str) -> tuple[dict, Path, Path]:
    """An importable `sglang.launch_server` running `source`: (env that finds it, its pid file, its mark file)."""
    import os

    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(source)
    pids, mark = tmp_path / "pids", tmp_path / "mark"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]),
           "FAKE_SGLANG_PIDS": str(pids), "FAKE_SGLANG_MARK": str(mark)}
    return env, pids, mark


DEAF_SGLANG = '''\
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: open(os.environ["FAKE_SGLANG_MARK"], "w").write("term"))
open(os.environ["FAKE_SGLANG_PIDS"] + ".tmp", "w").write(str(os.getpid()))
os.replace(os.environ["FAKE_SGLANG_PIDS"] + ".tmp", os.environ["FAKE_SGLANG_PIDS"])
time.sleep(120)
'''


def test_a_stopped_serve_command_kills_sglang_after_the_grace_and_reads_stopped(tmp_path):
    """SIGTERM goes to SGLang's group; one that ignores it is killed once the grace ran out (it was 60 s: 0.5 s
    here), and the serve run reads `stopped`, as the supervisor's jobs do, not `failed`."""
    import signal
    import subprocess
    import sys

    from adaflash.procs import start_time
    from adaflash.runlog import RunLog

    from .test_jobs_supervisor import wait_for

    env, pids, mark = _fake_sglang(tmp_path, DEAF_SGLANG)
    main = "import sys, adaflash.cli.serve_sglang as s; s.SGLANG_STOP_GRACE = 0.5; from adaflash.cli.main import main; main()"
    serve = subprocess.Popen([sys.executable, "-c", main, "--workspace", str(tmp_path / "ws"), "serve", "--engine",
                              "sglang", "--method", "vanilla", "--gpus", "0", "--port", "9"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        leader = int(wait_for(lambda: pids.exists() and pids.read_text(), timeout=60))
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
        assert mark.read_text() == "term" and start_time(leader) is None
        (run,) = RunLog.open(tmp_path / "ws").list_runs(kind="serve")
        assert run["status"] == "stopped" and run["note"] == "exit code -9 (killed after the stop grace)"
    finally:
        if serve.poll() is None:
            serve.kill()
