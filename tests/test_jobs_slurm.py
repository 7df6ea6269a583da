"""The Slurm backend: generated sbatch scripts (also executed with fake Slurm tools), submission and
tracking with fake sbatch/squeue/sacct on PATH."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adaflash.runlog import RunLog
from jobs import slurm
from jobs.plan import prepare

CLI = [sys.executable, "-m", "adaflash.cli.main"]

CLUSTER = """
[run]
name = "cluster"
[gpus]
inference = [0]
training = [1, 2, 3]
server = [0]
[slurm]
nodes = 2
gpus_per_node = 4
partition = "gpu"
time = "02:00:00"
rdzv_port = 29555
sbatch = ["--exclusive"]
setup = ["module load cuda"]
[jobs.prep]
command = ["adaflash", "data", "prepare", "gsm8k", "--out", "{run_dir}/data"]
[jobs.train]
command = ["adaflash", "train", "draft", "--method", "dflash", "--data", "{run_dir}/data/x.jsonl"]
role = "training"
torchrun = { nproc = "auto" }
after = ["prep"]
[jobs.serve]
command = ["adaflash", "serve", "--port", "30000"]
role = "server"
kind = "service"
node = 1
ready = { http = "http://127.0.0.1:30000/health", timeout = 600 }
after = ["train"]
[jobs.bench]
command = ["adaflash", "bench", "--base-url", "http://127.0.0.1:30000"]
after = ["serve"]
"""


def executable(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_script_has_resources_rendezvous_and_server_placement(tmp_path: Path) -> None:
    recipe = tmp_path / "cluster.toml"
    recipe.write_text(CLUSTER)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    script = slurm.render_script(prepared, python="/venv/bin/python")
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu",
                 "#SBATCH --time=02:00:00", "#SBATCH --exclusive", "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --output={prepared.run_dir}/slurm-%j.out", "module load cuda"):
        assert line in script, line
    train = next(line for line in script.splitlines() if "torch.distributed.run" in line)
    assert "srun --overlap --nodes=2 --ntasks-per-node=1" in train
    assert "--nnodes=2 --nproc_per_node=3" in train
    assert '"--rdzv_id=$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:29555"' in train
    assert "-m adaflash.cli.main train draft --method dflash" in train
    assert 'CUDA_VISIBLE_DEVICES="$(pick_gpus 1,2,3)"' in train
    serve = next(line for line in script.splitlines() if " serve --port 30000" in line)
    assert '--nodelist="${NODES[1]}"' in serve and 'CUDA_VISIBLE_DEVICES="$(pick_gpus 0)"' in serve
    assert "wait_ready_http serve http://127.0.0.1:30000/health 600" in script
    # Order of the graph: prep -> train -> serve (ready) -> bench.
    assert script.index("wait_task prep") < script.index("torch.distributed.run") < script.index("wait_ready_http serve")
    bash = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert bash.returncode == 0, bash.stderr


def _fake_cluster(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    executable(bin_dir / "scontrol", 'printf "127.0.0.1\\n127.0.0.1\\n"\n')
    # srun: drop its own --options, run the command here.
    executable(bin_dir / "srun", 'while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node1",
            "SLURM_JOB_ID": "77", "ADAFLASH_SLURM_POLL": "0.1"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_generated_script_runs_the_graph(tmp_path: Path) -> None:
    port = _free_port()
    recipe = tmp_path / "local.toml"
    recipe.write_text(textwrap.dedent(f"""
        [run]
        name = "local"
        [slurm]
        nodes = 2
        [jobs.first]
        command = ["python", "-c", "print('first ran')"]
        [jobs.server]
        command = ["python", "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
        kind = "service"
        node = 1
        ready = {{ http = "http://127.0.0.1:{port}/", timeout = 30 }}
        after = ["first"]
        [jobs.client]
        command = ["python", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/').status)"]
        after = ["server"]
    """))
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    script = slurm.write_script(prepared)
    done = subprocess.run(["bash", str(script)], env=_fake_cluster(tmp_path), capture_output=True, text=True,
                          timeout=120, start_new_session=True)
    assert done.returncode == 0, done.stdout + done.stderr
    state = prepared.run_dir / slurm.STATE_DIR
    assert (state / "first.exit").read_text().strip() == "0" and (state / "client.exit").read_text().strip() == "0"
    assert (state / "server.ready").exists()
    assert (prepared.run_dir / "client.log").read_text().strip().endswith("200")

    failing = tmp_path / "failing.toml"
    failing.write_text('[run]\nname = "f"\n[jobs.a]\ncommand = ["python", "-c", "raise SystemExit(3)"]\n'
                       '[jobs.b]\ncommand = ["python", "-c", "print(1)"]\nafter = ["a"]\n')
    prepared = prepare(failing, workspace=tmp_path / "ws")
    done = subprocess.run(["bash", str(slurm.write_script(prepared))], env=_fake_cluster(tmp_path),
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    assert done.returncode == 1 and "adaflash: job a failed (exit 3)" in done.stderr
    assert not (prepared.run_dir / slurm.STATE_DIR / "b.exit").exists()


@pytest.fixture()
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch/squeue/sacct/scancel stand-ins that record their calls; squeue says RUNNING twice."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    executable(bin_dir / "sbatch", f'echo "sbatch $*" >> {calls}\necho "4242;cluster"\n')
    executable(bin_dir / "squeue", f"""\
        echo "squeue $*" >> {calls}
        n=$(grep -c '^squeue' {calls})
        if [ "$n" -le 2 ]; then echo RUNNING; fi
    """)
    executable(bin_dir / "sacct", f'echo "sacct $*" >> {calls}\necho "COMPLETED|0:0"\n')
    executable(bin_dir / "scancel", f'echo "scancel $*" >> {calls}\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_submit_and_track_with_fake_sbatch_squeue_sacct(tmp_path: Path, fake_slurm: Path) -> None:
    recipe = tmp_path / "cluster.toml"
    recipe.write_text(CLUSTER)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    tracker = slurm.SlurmRun(prepared, log)
    assert tracker.submit() == "4242"
    script = prepared.run_dir / slurm.SCRIPT_NAME
    assert f"sbatch --parsable {script}" in fake_slurm.read_text()
    # The script reports job progress through marker files on the shared filesystem.
    state = prepared.run_dir / slurm.STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    (state / "prep.started").write_text("1")
    (state / "prep.exit").write_text("0\n")
    (state / "train.started").write_text("1")
    states = []
    result = tracker.track(interval=0.01, on_tick=lambda s: states.append(s.state))
    assert states == ["RUNNING", "RUNNING", "COMPLETED"]
    assert result.status == "finished" and result.exit_code == 0
    run = log.get_run(prepared.run_id)
    assert run["status"] == "finished" and run["config"]["slurm_job_id"] == "4242"
    jobs = {j["name"]: j for j in log.jobs(prepared.run_id)}
    assert jobs["prep"]["status"] == "finished" and jobs["train"]["status"] == "running"
    assert "sacct -n -P -X -j 4242 -o State,ExitCode" in fake_slurm.read_text()


def test_cli_slurm_dry_run_submit_detach_and_stop(tmp_path: Path, fake_slurm: Path) -> None:
    recipe = tmp_path / "cluster.toml"
    recipe.write_text(CLUSTER)
    ws = tmp_path / "ws"
    dry = subprocess.run([*CLI, "--workspace", str(ws), "run", str(recipe), "--backend", "slurm", "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and dry.stdout.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in dry.stdout
    assert "sbatch" not in (fake_slurm.read_text() if fake_slurm.exists() else "")
    sub = subprocess.run([*CLI, "--workspace", str(ws), "run", str(recipe), "--backend", "slurm", "--detach"],
                         capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    assert "submitted as Slurm job 4242" in sub.stdout
    run_id = RunLog.open(ws).list_runs()[0]["id"]
    stop = subprocess.run([*CLI, "--workspace", str(ws), "runs", "stop", run_id], capture_output=True, text=True,
                          timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert "scancel 4242" in fake_slurm.read_text()
    assert RunLog.open(ws).get_run(run_id)["status"] == "stopped"
    assert json.loads((ws / "runs" / run_id / "slurm.json").read_text())["job_id"] == "4242"


def test_a_job_on_a_node_outside_the_allocation_is_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "cluster.toml"
    recipe.write_text(CLUSTER.replace("nodes = 2", "nodes = 1"))
    with pytest.raises(slurm.SlurmError, match="job 'serve': node 1"):
        slurm.render_script(prepare(recipe, workspace=tmp_path / "ws"))


def test_sbatch_failure_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "sbatch", 'echo "sbatch: error: invalid partition specified: gpu" >&2\nexit 1\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(slurm.SlurmError, match="invalid partition"):
        slurm.submit(tmp_path / "x.sh")


def test_one_follower_serves_run_and_attach(tmp_path: Path, fake_slurm: Path) -> None:
    # `adaflash run --backend slurm` and `adaflash runs attach` follow through adaflash.cli.run_display.follow_slurm.
    from adaflash.cli.run_display import follow_slurm

    recipe = tmp_path / "cluster.toml"
    recipe.write_text(CLUSTER)
    prepared = prepare(recipe, workspace=tmp_path / "ws")
    log = RunLog.open(prepared.workspace)
    slurm.SlurmRun(prepared, log).submit()
    tracker = slurm.SlurmRun.resume(log, prepared.run_id)  # what attach does
    lines: list[str] = []
    with pytest.raises(SystemExit) as exited:
        follow_slurm(tracker, lines.append, interrupt_code=0, interval=0.01)
    assert exited.value.code == 0
    # Each state once, then the outcome.
    assert [line.split(": ", 1)[1] for line in lines[:-1]] == ["RUNNING", "COMPLETED"]
    assert lines[-1] == f"run {prepared.run_id} finished: slurm job 4242: COMPLETED (exit 0)"
    assert log.get_run(prepared.run_id)["status"] == "finished"
