"""The pipeline report: what the workers record, and what `adaflash pipeline status` makes of it."""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
import types

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.engine.config import EngineConfig
from adaflash.models.drafter_io import new_drafter, save_drafter
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.ledger import ConsumeLedger
from adaflash.pipeline.report import check_integrity, pipeline_report
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog
from adaflash.train.losses import LossConfig


class Clock:
    """The run log's clock, set by hand so the time spans of the report are exact."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch) -> Clock:
    fake = Clock(100.0)
    monkeypatch.setattr("adaflash.runlog.time", types.SimpleNamespace(
        time=fake.time, strftime=time.strftime, localtime=time.localtime))
    return fake


def _buffer(swap, n: int, repeat_id: bool = False) -> None:
    rows = [{"id": f"q{0 if repeat_id and i == n - 1 else i}#{i}", "prompt_text": "p", "response": "r"}
            for i in range(n)]
    if repeat_id:
        rows[-1]["id"] = rows[0]["id"]
    SwapBuffer(swap).append(rows)


def _synthetic_run(log: RunLog, clock: Clock, swap) -> str:
    """The records the workers write (same names, jobs and steps), at chosen times."""
    run = log.create_run("pipeline", method="adaflash", config={"swap_dir": str(swap), "infer_gpus": "0",
                                                                "train_gpus": "1,2"})
    at = clock

    def metrics(t, values, step, job, version=None):
        at.now = t
        log.log_metrics(run, values, step=step, job=job, version=version)

    # inference windows: [100, 110] alone, [110, 130] half beside training, [130, 140] beside
    metrics(110, {"tau": 1.5, "tokens_per_s": 10, "window_tokens": 100, "window_seconds": 10, "drafter_version": 0,
                  "samples": 3}, 3, "inference")
    metrics(110, {"served_requests": 3, "served_tau_sum": 4.5, "served_tokens": 100, "served_verify": 70}, None,
            "inference", 0)
    metrics(130, {"tau": 2.0, "tokens_per_s": 5, "window_tokens": 100, "window_seconds": 20, "drafter_version": 1,
                  "samples": 6}, 6, "inference")
    metrics(130, {"served_requests": 1, "served_tau_sum": 2.5, "served_tokens": 40, "served_verify": 16}, None,
            "inference", 0)
    metrics(130.0001, {"served_requests": 2, "served_tau_sum": 6.0, "served_tokens": 60, "served_verify": 20}, None,
            "inference", 1)
    metrics(140, {"tau": 3.0, "tokens_per_s": 5, "window_tokens": 50, "window_seconds": 10, "drafter_version": 3,
                  "samples": 6, "peak_memory_gib": 17.5}, 6, "inference")
    metrics(150, {"window_tokens": 50, "window_seconds": 10}, 6, "inference")
    # training: world 2, steps over [120, 140]
    metrics(100, {"world_size": 2}, 0, "training")
    for t in (125, 140):
        metrics(t, {"train_tokens": 400, "train_samples": 3, "step_compute_seconds": 5, "peak_memory_gib": t / 10,
                    "rank0_tokens": 300, "rank0_seconds": 4, "rank0_samples": 2,
                    "rank1_tokens": 100, "rank1_seconds": 5, "rank1_samples": 1}, int(t), "training")
    # versions: v1 swapped 2 s after its publish, v2 superseded by v3 before the worker looked, v4 final
    for version, published in ((1, 121.0), (2, 126.0), (3, 127.0), (4, 141.0)):
        at.now = published
        log.add_checkpoint(run, f"{swap}/weights/v{version}", version=version, step=version,
                           metrics={"published_at": published, "consumed": 3 * version})
    metrics(123, {"swapped_version": 1, "swap_load_seconds": 0.5, "swap_lag_seconds": 2.0}, 3, "inference")
    metrics(129, {"swapped_version": 3, "swap_load_seconds": 0.5, "swap_lag_seconds": 2.0}, 6, "inference")
    metrics(141, {"published_version": 4, "consumed": 6}, 2, "training")
    return run


def test_report_reads_versions_throughput_ranks_swaps_and_integrity(tmp_path, clock):
    ws, swap = tmp_path / "ws", tmp_path / "swap"
    log = RunLog.open(ws)
    _buffer(swap, 7)
    ledger = ConsumeLedger(swap)
    ledger.append({"step": 1, "from": 0, "to": 3, "ranks": [[0, 2], [1]], "unusable": []})
    ledger.append({"step": 2, "from": 3, "to": 6, "ranks": [[3, 5], [4]], "unusable": [4]})
    run = _synthetic_run(log, clock, swap)

    report = pipeline_report(log, log.get_run(run))
    versions = {v["drafter_version"]: v for v in report["versions"]}
    assert sorted(versions) == [0, 1, 2, 3, 4]
    assert versions[0]["requests"] == 4 and versions[0]["tau"] == pytest.approx((4.5 + 2.5) / 4)
    assert versions[0]["tau_tokens"] == pytest.approx(140 / 86) and versions[0]["swap"] == "initial"
    assert versions[1]["requests"] == 2 and versions[1]["tau"] == pytest.approx(3.0)
    assert versions[1]["publish_to_swap_s"] == pytest.approx(2.0) and versions[1]["swap"] == "swapped"
    assert versions[1]["published_s"] == pytest.approx(21.0) and versions[1]["swapped_s"] == pytest.approx(23.0)
    assert versions[2]["swap"] == "skipped" and versions[2]["publish_to_swap_s"] is None
    assert versions[3]["publish_to_swap_s"] == pytest.approx(2.0)
    assert versions[4]["swap"] == "not swapped" and versions[4]["requests"] == 0

    inference = report["inference"]
    # beside training [120, 140]: half of window 2 and all of window 3; the rest without
    assert inference["tokens_per_s_beside_training"] == pytest.approx((50 + 50) / (10 + 10))
    assert inference["seconds_beside_training"] == pytest.approx(20)
    assert inference["tokens_per_s_without_training"] == pytest.approx((100 + 50 + 50) / (10 + 10 + 10))
    assert inference["output_tokens"] == 300 and inference["peak_memory_gib"] == 17.5

    training = report["training"]
    assert training["world_size"] == 2 and training["steps"] == 2 and training["samples"] == 6
    assert training["peak_memory_gib"] == 14.0  # the larger of its steps'
    assert training["tokens_per_s"] == pytest.approx(800 / 10) and training["span_seconds"] == pytest.approx(20)
    assert [(r["rank"], r["tokens"], r["tokens_per_s"]) for r in training["ranks"]] == [
        (0, 600, pytest.approx(75.0)), (1, 200, pytest.approx(20.0))]

    integrity = report["integrity"]
    assert integrity["ok"] and integrity["checked"] and integrity["final_consumed_offset"] == 6
    assert integrity["missing"] == integrity["duplicated"] == 0 and integrity["unconsumed"] == 1
    assert integrity["unusable"] == 1 and integrity["buffer_rows"] == 7

    # the CLI: newest pipeline run by default, or the one of a swap dir; table, json and csv
    runner = CliRunner()
    other = log.create_run("pipeline", config={"swap_dir": str(tmp_path / "elsewhere")})
    result = runner.invoke(cli, ["--workspace", str(ws), "pipeline", "status", "--swap-dir", str(swap), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["run"] == run
    result = runner.invoke(cli, ["--workspace", str(ws), "pipeline", "status", "--format", "json"])
    assert json.loads(result.stdout)["run"] == other
    result = runner.invoke(cli, ["--workspace", str(ws), "pipeline", "status", run])
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "integrity OK" in out and "missing 0, duplicated 0" in out
    assert "5.000 beside training (20.0s), 6.667 without (30.0s)" in out
    assert "publish → hot swap: mean 2.00s, max 2.00s over 2 version(s)" in out
    assert "world size 2" in out and "75.000" in out
    assert "peak GPU memory (GiB, each worker's allocator): inference 17.500, training 14.000" in out
    result = runner.invoke(cli, ["--workspace", str(ws), "pipeline", "status", run, "--csv"])
    assert result.stdout.splitlines()[0].startswith("drafter_version,requests,tau,")
    assert len(result.stdout.splitlines()) == 6
    train_run = log.create_run("train")
    result = runner.invoke(cli, ["--workspace", str(ws), "pipeline", "status", train_run])
    assert result.exit_code == 2 and "not a pipeline run" in result.output


def test_integrity_counts_missing_repeated_and_foreign_samples(tmp_path):
    swap = tmp_path / "swap"
    assert not check_integrity(swap)["checked"]  # nothing there yet
    _buffer(swap, 6, repeat_id=True)
    ledger = ConsumeLedger(swap)
    ledger.append({"step": 1, "from": 0, "to": 3, "ranks": [[0, 2], [1]], "unusable": []})
    ledger.append({"step": 2, "from": 3, "to": 6, "ranks": [[3, 5], [3]], "unusable": []})  # 3 twice, 4 never
    report = check_integrity(swap)
    assert report["checked"] and not report["ok"]
    assert report["missing"] == 1 and report["missing_seqs"] == [4]
    assert report["duplicated"] == 1 and report["duplicated_seqs"] == [3]
    assert report["duplicate_ids_in_buffer"] == 1
    ledger.append({"step": 3, "from": 6, "to": 8, "ranks": [[6], [7]], "unusable": []})  # past the buffer's end
    assert check_integrity(swap)["not_in_buffer"] == 2


def test_ledger_rewinds_to_the_published_offset_and_drops_a_torn_line(tmp_path):
    ledger = ConsumeLedger(tmp_path)
    for start in (0, 4, 8):
        ledger.append({"step": start // 4 + 1, "from": start, "to": start + 4, "ranks": [[start]], "unusable": []})
    with ledger.path.open("a") as handle:
        handle.write('{"step": 4, "from": 12')  # a trainer killed mid-append
    assert [e["to"] for e in ledger.entries()] == [4, 8, 12]
    assert ledger.rewind(8) == 1  # version published at 8: the step 8..12 will be learned again
    assert [e["to"] for e in ledger.entries()] == [4, 8]
    assert ledger.path.read_bytes().endswith(b"\n")
    assert ledger.rewind(8) == 0


def test_inference_worker_records_served_requests_per_version_and_the_hot_swap(tmp_path, tiny_llama, tiny_target):
    from adaflash.pipeline.inference import InferenceConfig, run_inference

    cfg = tiny_target.model.cfg
    draft = save_drafter(new_drafter("dflash", cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(3)))
    ws, swap = tmp_path / "ws", tmp_path / "swap"
    log = RunLog.open(ws)
    run = log.create_run("pipeline", config={"swap_dir": str(swap)})
    failures: list[str] = []

    def trainer_stand_in() -> None:
        """Publishes v1 once trajectories flow, then stops the worker after v1 has served requests."""
        try:
            other = RunLog.open(ws)
            buffer, store = SwapBuffer(swap), WeightStore(swap)
            deadline = time.time() + 240

            def wait(cond) -> None:
                while not cond():
                    if time.time() > deadline:
                        raise TimeoutError("the inference worker did not get there")
                    time.sleep(0.05)

            wait(lambda: buffer.count() >= 2)
            version = store.publish(new_drafter("dflash", cfg, block_size=8, seed=5), {"target": "tiny"})
            other.add_checkpoint(run, str(store.folder(version)), version=version,
                                 metrics={"published_at": store.pointer()["published_at"]})
            wait(lambda: other.metrics_since(0, run_id=run, names=["swapped_version"]))
            served = buffer.count()
            wait(lambda: buffer.count() >= served + 2)
        except Exception as err:  # noqa: BLE001  (reported by the test below)
            failures.append(repr(err))
        finally:
            SwapBuffer(swap).request_stop()

    helper = threading.Thread(target=trainer_stand_in, daemon=True)
    helper.start()
    produced = run_inference(InferenceConfig(target=str(tiny_llama), draft=str(draft), data=str(prompts),
                                             swap_dir=str(swap), run_id=run, workspace=str(ws), method="dflash",
                                             engine=EngineConfig(max_batch=1), max_new_tokens=6, loop=True, flush_every=1))
    helper.join(timeout=60)
    assert not failures, failures
    rows = SwapBuffer(swap).read(0, produced)
    assert len(rows) == produced >= 4
    by_version: dict[int, list[float]] = {}
    for row in rows:
        by_version.setdefault(row["drafter_version"] or 0, []).append(row["tau"])
    assert sorted(by_version) == [0, 1]

    report = pipeline_report(log, log.get_run(run))
    versions = {v["drafter_version"]: v for v in report["versions"]}
    for version, taus in by_version.items():  # the report's τ is the mean over the requests in the buffer
        assert versions[version]["requests"] == len(taus)
        assert versions[version]["tau"] == pytest.approx(sum(taus) / len(taus))
    assert versions[1]["swap"] == "swapped" and versions[1]["publish_to_swap_s"] >= 0
    assert report["inference"]["output_tokens"] == sum(r["completion_tokens"] for r in rows)
    assert report["inference"]["tokens_per_s_without_training"] > 0  # no trainer ran
    swaps = log.metrics_since(0, run_id=run, names=["swapped_version", "swap_lag_seconds"])
    assert [r["value"] for r in swaps if r["name"] == "swapped_version"] == [1.0]


def test_a_time_budget_ends_both_workers_with_a_final_version(tmp_path, tiny_llama, tiny_target):
    from adaflash.pipeline.inference import InferenceConfig, run_inference
    from adaflash.pipeline.training import TrainingConfig, run_training

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Count."}) + "\n")
    ws, swap = tmp_path / "ws", tmp_path / "swap"
    log = RunLog.open(ws)
    run = log.create_run("pipeline")
    past = time.time() - 1
    # with --loop the worker would answer forever; the budget (already spent) ends it before it takes a prompt
    assert run_inference(InferenceConfig(target=str(tiny_llama), draft=str(draft), data=str(prompts),
                                         swap_dir=str(swap), run_id=run, workspace=str(ws), method="dflash",
                                         max_new_tokens=4, loop=True, deadline=past)) == 0
    assert SwapBuffer(swap).producer_done() == 0
    SwapBuffer(swap).clear_done()
    SwapBuffer(swap).append([{"prompt_text": tiny_target.render("Count."), "response": "one two three"}] * 4)
    # the producer is not done and rows wait, but the budget is spent: stop, publish a final version
    consumed = run_training(TrainingConfig(target=str(tiny_llama), draft=str(draft), swap_dir=str(swap), run_id=run,
                                           workspace=str(ws), loss=LossConfig("fkl"), length_head=False, min_buffer=1,
                                           deadline=past, poll_seconds=0.05))
    assert consumed == 0
    store = WeightStore(swap)
    assert store.latest_version() == 1 and store.pointer()["consumed"] == 0
    assert [c["version"] for c in log.checkpoints(run)] == [1]


def test_max_minutes_sets_a_deadline_and_loops(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    base = ["--workspace", str(tmp_path / "ws"), "pipeline", "--draft", "smollm2-135m-dflash", "--data",
            str(tmp_path / "p.jsonl"), "--dry-run"]
    before = time.time()
    result = CliRunner().invoke(cli, [*base, "--max-minutes", "2"])
    assert result.exit_code == 0, result.output
    infer, train = (_payload(result.stdout, role) for role in ("inference", "training"))
    assert infer["loop"] is True and before + 120 <= infer["deadline"] <= time.time() + 120
    assert train["deadline"] == infer["deadline"]
    result = CliRunner().invoke(cli, [*base, "--max-minutes", "2", "--no-loop"])
    assert _payload(result.stdout, "inference")["loop"] is False
    result = CliRunner().invoke(cli, base)
    payload = _payload(result.stdout, "inference")
    assert payload["loop"] is False and payload["deadline"] is None


def _payload(output: str, role: str) -> dict:
    """The JSON arguments of a worker command line that `pipeline --dry-run` printed."""
    lines = dict(line.split(": ", 1) for line in output.strip().splitlines())
    return json.loads(shlex.split(lines[role])[-1])


def test_the_launcher_stops_workers_that_outlive_the_budget(tmp_path):
    from adaflash.pipeline.inference import InferenceConfig
    from adaflash.pipeline.launch import Pipeline
    from adaflash.pipeline.training import TrainingConfig

    swap = tmp_path / "swap"
    stop_file = SwapBuffer(swap).root / "STOP"
    # a worker that ignores the deadline and only leaves on a stop request
    waiter = [sys.executable, "-c", "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)",
              str(stop_file)]

    class Stubborn(Pipeline):
        def commands(self) -> dict[str, list[str]]:
            return {"inference": waiter, "training": waiter}

    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")
    common = {"target": "t", "draft": "d", "swap_dir": str(swap), "run_id": run, "workspace": str(tmp_path / "ws")}
    runner = Stubborn(log, run, tmp_path, InferenceConfig(data="p", **common), TrainingConfig(**common), [], [],
                      grace=30.0, deadline=time.time() - 1)
    runner.budget_grace = 0.0
    runner.start()
    assert runner.wait(poll=0.05) == "finished"  # a budget reached is not a user's stop
    assert all(p.returncode == 0 for p in runner.procs.values())
    events = [e["message"] for e in log.events_since(0, run_id=run)]
    assert any("time budget passed" in m for m in events), events


def test_pipeline_stop_ends_a_looping_run_cleanly_and_marks_it_stopped(tmp_path, tiny_llama, tiny_target):
    import subprocess

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(3)))
    ws, swap = tmp_path / "ws", tmp_path / "swap"
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaflash.cli.main", "--workspace", str(ws), "pipeline", "--target", str(tiny_llama),
         "--draft", str(draft), "--data", str(prompts), "--loop", "--max-new-tokens", "6", "--min-buffer", "2",
         "--train-batch", "2", "--publish-every", "1", "--batch-size", "2", "--preset", "osd", "--swap-dir", str(swap)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not (SwapBuffer(swap).count() >= 4 and WeightStore(swap).latest_version() >= 1):
            assert proc.poll() is None and time.time() < deadline, "the looping pipeline did not get going"
            time.sleep(0.2)
        (run,) = RunLog.open(ws).list_runs(kind="pipeline")
        stopped = CliRunner().invoke(cli, ["--workspace", str(ws), "pipeline", "stop", run["id"]])
        assert stopped.exit_code == 0 and "stop requested" in stopped.output
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    log = RunLog.open(ws)
    run = log.get_run(run["id"])
    assert run["status"] == "stopped" and "stopped on request" in run["note"], run
    assert {j["role"]: j["status"] for j in log.jobs(run["id"])} == {"inference": "stopped", "training": "stopped"}
    buffer, store = SwapBuffer(swap), WeightStore(swap)
    assert buffer.producer_done() == buffer.count()  # the inference worker finished the requests it had
    integrity = pipeline_report(log, run)["integrity"]
    assert integrity["ok"] and integrity["missing"] == 0 and integrity["duplicated"] == 0
    assert store.pointer()["consumed"] == integrity["final_consumed_offset"] <= buffer.count()
    status = CliRunner().invoke(cli, ["--workspace", str(ws), "pipeline", "status", run["id"]])
    assert status.exit_code == 0 and "run note: stopped on request" in status.output
    assert "(stopped, " in status.output, status.output
    listed = CliRunner().invoke(cli, ["--workspace", str(ws), "runs", "list", "--json"])
    assert listed.exit_code == 0 and {r["id"]: r["status"] for r in json.loads(listed.output)}[run["id"]] == "stopped"
    again = CliRunner().invoke(cli, ["--workspace", str(ws), "pipeline", "stop", run["id"]])
    assert again.exit_code == 0 and "already ended (stopped)" in again.output


def test_a_trainer_killed_with_sigkill_then_a_torn_newest_version_lose_nothing_and_learn_nothing_twice(
        tmp_path, tiny_llama, tiny_target):
    """kill -9 of the training worker fails the run and names it; with the newest version then torn on disk, a
    second pipeline on the same swap dir resumes from the newest intact version (it used to exit with a
    traceback) and the ledger still shows every buffered answer learned exactly once."""
    import os
    import signal
    import subprocess

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(3)))
    ws, swap = tmp_path / "ws", tmp_path / "swap"
    args = ["--workspace", str(ws), "pipeline", "--target", str(tiny_llama), "--draft", str(draft), "--data",
            str(prompts), "--loop", "--max-new-tokens", "6", "--min-buffer", "2", "--train-batch", "2",
            "--publish-every", "1", "--batch-size", "2", "--preset", "osd", "--swap-dir", str(swap)]
    proc = subprocess.Popen([sys.executable, "-m", "adaflash.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    store, log = WeightStore(swap), RunLog.open(ws)
    try:
        deadline = time.time() + 240
        while not (SwapBuffer(swap).count() >= 4 and store.latest_version() >= 2):
            assert proc.poll() is None and time.time() < deadline, "the looping pipeline did not get going"
            time.sleep(0.2)
        (first,) = log.list_runs(kind="pipeline")
        trainer = next(j for j in log.jobs(first["id"]) if j["role"] == "training")
        os.kill(trainer["pid"], signal.SIGKILL)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output
    first = log.get_run(first["id"])
    assert first["status"] == "failed" and "training worker exited with code -9" in first["note"], first
    # the newest version on disk: a kill between a version's ledger line and the pointer leaves the pointer
    # one behind, and a resumed trainer rightly takes that complete version
    newest = max(store.versions())
    weights = store.folder(newest) / "model.safetensors"
    if weights.is_file():  # (killed inside the save, it is torn already)
        weights.write_bytes(weights.read_bytes()[:100])  # torn while the run was stopped
    produced = SwapBuffer(swap).count()
    second = CliRunner().invoke(cli, [*args, "--max-samples", str(produced + 4)])
    assert second.exit_code == 0, second.output
    run = next(r for r in log.list_runs(kind="pipeline") if r["id"] != first["id"])
    events = [e["message"] for e in log.events_since(0, run_id=run["id"])]
    assert any(m.startswith(f"skipped version {newest} on resume:") for m in events), events
    # the torn version is never served: inference refuses it, or a newer one was out before inference looked
    assert not any(m.startswith(f"hot-swapped drafter v{newest} ") for m in events), events
    assert (any(m.startswith(f"refused version {newest}:") for m in events)
            or any(m.startswith("hot-swapped drafter v") for m in events)
            or any(r["version"] > newest for r in log.metrics_since(0, run_id=run["id"]) if r.get("version"))), events
    buffer = SwapBuffer(swap)
    assert buffer.count() == produced + 4
    integrity = check_integrity(swap)
    assert integrity["ok"] and integrity["missing"] == 0 and integrity["duplicated"] == 0, integrity
    assert store.pointer()["consumed"] == integrity["final_consumed_offset"] == buffer.count()
