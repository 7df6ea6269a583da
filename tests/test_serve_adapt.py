"""`serve --adapt`: the rollback rule, the request fields, and the whole flow on a CPU in real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.bench.shift import Sample, ShiftResult, summarize
from adaflash.engine.config import EngineConfig
from adaflash.serve.adapt_stats import RollbackRule, VersionTally
from adaflash.serve.protocol import BadRequest, parse_generate
from tests.processes import stop_with_sigterm


def _tally(rows: list[tuple[int, str | None, int, int]], held_out: bool = False, tally=None) -> VersionTally:
    tally = tally or VersionTally()
    for version, tag, tokens, verify in rows:
        tally.add(version, tag, tokens, verify, held_out=held_out)
    return tally


def test_the_rule_waits_for_enough_requests_then_compares_on_shared_tags():
    rule = RollbackRule(min_requests=4, drop=0.1)
    old = [(1, "chat", 30, 10)] * 8  # τ 3.0
    assert rule.verdict(_tally(old + [(2, "chat", 20, 10)] * 3), 2, 1) is None  # 3 < 4 requests
    verdict = rule.verdict(_tally(old + [(2, "chat", 20, 10)] * 4), 2, 1)
    assert verdict.worse and "2.00" in verdict.why and "3.00" in verdict.why
    verdict = rule.verdict(_tally(old + [(2, "chat", 28, 10)] * 4), 2, 1)  # 2.8 is within 10% of 3.0
    assert not verdict.worse and not verdict.better
    assert rule.verdict(_tally(old + [(2, "chat", 31, 10)] * 4), 2, 1).better


def test_a_shift_to_a_new_tag_is_not_taken_for_a_worse_version():
    rule = RollbackRule(min_requests=4, drop=0.1)
    tally = _tally([(1, "chat", 40, 10)] * 8 + [(2, "code", 12, 10)] * 8)  # v2 only saw code, which is harder
    verdict = rule.verdict(tally, 2, 1)
    assert not verdict.worse and verdict.better and "none of its tags" in verdict.why
    tally = _tally([(1, "chat", 40, 10)] * 8 + [(1, "code", 12, 10)] * 8 + [(2, "code", 20, 10)] * 8)
    assert rule.verdict(tally, 2, 1).worse is False  # better on code, the tag both served
    assert tally.as_json()[0]["tags"]["code"] == {"requests": 8, "tau": pytest.approx(1.2)}


def test_memorized_traffic_does_not_hide_a_worse_version_from_the_held_out_rule():
    # v2 learned the repeated prompts by heart (τ 6 on them) and drafts worse on prompts it never saw.
    tally = _tally([(1, "code", 20, 10)] * 8 + [(2, "code", 60, 10)] * 8)
    _tally([(1, "code", 20, 10)] * 4 + [(2, "code", 15, 10)] * 4, held_out=True, tally=tally)
    assert RollbackRule(min_requests=4, drop=0.1).verdict(tally, 2, 1).better  # all traffic: looks better
    verdict = RollbackRule(min_requests=4, drop=0.1, held_out=True).verdict(tally, 2, 1)
    assert verdict.worse and "held-out" in verdict.why and "over 4 requests" in verdict.why
    assert RollbackRule(min_requests=5, held_out=True).verdict(tally, 2, 1) is None  # 4 held-out requests
    assert tally.as_json()[1]["held_out"] == {"requests": 4, "tau": pytest.approx(1.5)}


def test_held_out_prompts_are_a_stable_share_chosen_by_their_tokens():
    from adaflash.serve.adapt import held_out_prompt

    prompts = [[i, i * 7 + 1, 42] for i in range(20000)]
    share = sum(held_out_prompt(p, 0.05) for p in prompts) / len(prompts)
    assert 0.04 < share < 0.06
    assert [held_out_prompt(p, 0.05) for p in prompts[:500]] == [held_out_prompt(list(p), 0.05) for p in prompts[:500]]
    assert not any(held_out_prompt(p, 0.0) for p in prompts[:500])


def test_the_shift_summary_finds_changed_answers_and_splits_latency_at_swaps():
    def sample(prompt, start, end, digest, holdout=True, phase="code", tokens=20):
        return Sample(phase, holdout, prompt, start, end, tokens=tokens, verify=10, version=1, digest=digest)

    result = ShiftResult(samples=[sample("a", 0, 1, "x"), sample("a", 5, 6, "x", tokens=30), sample("b", 0, 1, "y"),
                                  sample("b", 5, 6, "z", tokens=30), sample("t", 2, 4, "w", holdout=False),
                                  sample("a", 9, 9.5, "x", tokens=25), sample("b", 9, 9.5, "z", tokens=25)],
                         switches=[(0.0, "code")], swaps=[(0.0, 0), (3.0, 1)])
    summary = summarize(result)
    assert summary["holdout_answers_changed"] == ["code/b"] and summary["swaps"] == 1
    latency = summary["latency"]
    assert [latency[k]["requests"] for k in ("before_swaps", "during_swap", "after_swaps")] == [2, 1, 4]
    code = summary["phases"]["code"]
    assert code["tau"] == pytest.approx(2.0) and code["holdout_rounds"] == 3
    assert (code["holdout_tau_first"], code["holdout_tau_best"], code["holdout_tau_last"]) == \
        pytest.approx((2.0, 3.0, 2.5))
    assert code["holdout_best_after_s"] == pytest.approx(5.0) and code["holdout_tau_last_quarter"] == pytest.approx(2.5)


def test_adapt_and_tag_are_request_fields_checked_by_name():
    body = {"text": ["a", "b"], "adapt": False, "tag": "code"}
    items = parse_generate(body).items
    assert [(i.adapt, i.tag) for i in items] == [(False, "code")] * 2
    assert parse_generate({"text": "a"}).items[0].adapt is True
    with pytest.raises(BadRequest) as err:
        parse_generate({"text": "a", "adapt": "no"})
    assert err.value.param == "adapt"
    with pytest.raises(BadRequest) as err:
        parse_generate({"text": "a", "tag": "x" * 65})
    assert err.value.param == "tag"


def test_adapt_refuses_what_it_cannot_train(workspace):
    from adaflash.cli.main import cli

    for args, said in ((["--method", "vanilla"], "--method must be one of dflash, adaflash, osd"),
                       (["--method", "eagle3", "--draft", "x"], "--method must be one of"),
                       (["--method", "adaflash", "--adapt-preset", "osd"], "length head"),
                       (["--method", "dflash", "--engine", "sglang"], "embedded engine"),
                       (["--method", "dflash", "--train-gpus", "zero"], "--train-gpus")):
        result = CliRunner().invoke(cli, ["serve", "--adapt", "--dry-run", *args])
        assert result.exit_code == 2 and said in result.output, (args, result.output)
    result = CliRunner().invoke(cli, ["serve", "--swap-dir", "s", "--dry-run"])
    assert result.exit_code == 2 and "--swap-dir applies to --adapt" in result.output


def test_bench_shift_takes_one_length_or_one_per_phase(workspace):
    from adaflash.cli.main import cli

    phases = ["--phase", "a=suite:chat", "--phase", "b=suite:code"]
    for seconds, said in (("1,2,3", "3 lengths for 2 phases"), ("0.5", "expected seconds >= 1"),
                          ("60,x", "expected seconds >= 1")):
        result = CliRunner().invoke(cli, ["bench", "shift", *phases, "--seconds", seconds])
        assert result.exit_code == 2 and said in result.output and "--seconds" in result.output, result.output


# -- the whole flow, in processes --------------------------------------------------------------------
PROMPTS = ["Hello there", "What is 2+2?", "Tell me a story", "Name three colors.", "Why is the sky blue?",
           "Count to five", "Say hi", "A haiku about rain"]
MAX_NEW = 12


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _generate(url: str, text: str, **fields) -> list[int]:
    body = {"text": text, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True},
            **fields}
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())["output_ids"]


def _start(args: list[str], env: dict, err_path: Path) -> tuple[subprocess.Popen, str]:
    """The server, its stderr into a file: a pipe nobody reads while the test runs fills up (64 KB) and
    blocks whichever server thread writes next."""
    with err_path.open("a") as err:
        proc = subprocess.Popen([sys.executable, "-m", "adaflash.cli.main", *args], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env)
    line = proc.stdout.readline()
    assert "ready on" in line, (line, err_path.read_text()[-3000:] if proc.poll() is not None else "")
    return proc, line.strip().rsplit(" ", 1)[1]


def _serve_until(url: str, references: dict, done, err_path: Path, timeout: float = 240) -> int:
    """Send rounds of requests (every answer checked against Vanilla's) until done(info) holds."""
    deadline, sent = time.time() + timeout, 0
    while time.time() < deadline:
        for i, text in enumerate(PROMPTS):
            keep_out = i == 0  # one prompt in eight asks to stay out of training
            assert _generate(url, text, tag="chat" if i % 2 else "code", **({"adapt": False} if keep_out else {})) \
                == references[text], text
            sent += 1
        if done(_get(url + "/get_server_info")["adapt"]):
            return sent
    raise AssertionError(f"not reached in {timeout} s: {_get(url + '/get_server_info')['adapt']}\n"
                         f"the server's stderr ends: {err_path.read_text()[-3000:]}")


def _bench_shift(tmp_path, url: str) -> None:
    """Two short phases against the adapting server: τ recorded as it goes, a picture, answers unchanged."""
    from adaflash.cli.main import cli
    from adaflash.runlog import RunLog

    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{text} ({domain})", "domain": domain}) + "\n"
                            for domain in ("chat", "code") for text in PROMPTS[:5]))
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "bench", "shift", "--base-url", url,
                                      "--phase", f"chat={data}:chat", "--phase", f"code={data}:code", "--seconds", "1,2",
                                      "--holdout", "2", "--probe-every", "1", "--no-chat", "--max-new-tokens", "8",
                                      "--concurrency", "2", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["holdout_answers_changed"] == [] and summary["holdout_prompts"] == 4
    assert set(summary["phases"]) == {"chat", "code"} and all(p["requests"] > 0 for p in summary["phases"].values())
    picture = Path(summary["plot"])
    assert picture.suffix == ".svg" and "code" in picture.read_text()
    (_, chat), (switch, code) = json.loads((picture.parent / "shift.json").read_text())["switches"]
    assert (chat, code) == ("chat", "code") and switch >= 1  # each phase its own length
    log = RunLog.open(tmp_path / "ws")
    run = log.list_runs(kind="bench")[0]
    names = {row["name"] for row in log.metrics_since(0, run_id=run["id"])}
    assert {"tau", "holdout_tau"} <= names and run["status"] == "finished"
    assert any("phase code begins" in e["message"] for e in log.events_since(0, run_id=run["id"]))


def _monitor_shows_the_adapting_run(workspace) -> None:
    """The dashboard's Monitor model, fed the serve run's rows: τ over time and per tag, τ per version,
    the trainer's throughput and the buffer depth."""
    from adaflash.runlog import RunLog
    from tui.monitor_model import MonitorModel

    log = RunLog.open(workspace)
    run = log.list_runs(kind="serve")[0]
    model = MonitorModel(run["id"])
    model.ingest(run["id"], {run["id"]: ""}, {run["id"]: log.metrics_since(0, run_id=run["id"])})
    assert {label for label, _, _ in model.chart(["tau"])} >= {"tau", "tau@code", "tau@chat"}
    assert len(model.version_table()) >= 2
    assert model.chart(["train_tokens_per_s"]) and model.chart(["buffer_depth"])


def _stop(proc: subprocess.Popen, err_path: Path) -> str:
    stop_with_sigterm(proc, timeout=120)
    err = err_path.read_text()
    assert proc.returncode == 0, err[-3000:]
    return err


def test_an_adapting_server_trains_swaps_survives_a_killed_trainer_rolls_back_and_resumes(
        tmp_path, tiny_llama, tiny_target):
    from adaflash.engine.engine import Engine
    from adaflash.engine.params import Request, SamplingParams
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.pipeline.buffer import SwapBuffer
    from adaflash.pipeline.report import check_integrity
    from adaflash.pipeline.weights import WeightStore

    vanilla = Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=1, max_len=128))
    references = {text: vanilla.generate([Request(tiny_target.encode(text),
                                                   SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))])[0].output_ids
                  for text in PROMPTS}
    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=4, length_head=True), tmp_path / "d")
    swap = tmp_path / "swap"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = ["--workspace", str(tmp_path / "ws"), "serve", "--method", "adaflash", "--target", str(tiny_llama),
            "--draft", str(draft), "--device", "cpu", "--dtype", "float32", "--port", "0", "--max-batch", "4",
            "--context-length", "128", "--adapt", "--swap-dir", str(swap), "--adapt-train-batch", "4", "--adapt-publish-every", "1",
            "--adapt-lr", "0.0002", "--rollback-min-requests", "100000"]
    err_path = tmp_path / "serve.err"
    proc, url = _start(args, env, err_path)
    try:
        _serve_until(url, references, lambda a: a["drafter_version"] >= 2, err_path)  # trained, published, swapped twice
        info = _get(url + "/get_server_info")["adapt"]
        assert {v["version"] for v in info["versions"]} >= {0}  # v0 served the first requests
        assert info["trainer"]["status"] == "running" and info["lr"] == 0.0002
        os.kill(info["trainer"]["pid"], signal.SIGKILL)
        before = info["latest_published"]
        after = _serve_until(url, references, lambda a: a["trainer"]["restarts"] >= 1
                             and a["drafter_version"] > before, err_path)
        assert after > 0  # served while the trainer was down
        from adaflash.cli.main import cli

        result = CliRunner().invoke(cli, ["serve", "rollback", "--to", "9999", "--url", url])
        assert result.exit_code == 2 and "'to' must be a published version between 0 and" in result.output
        result = CliRunner().invoke(cli, ["serve", "rollback", "--to", "0", "--url", url])
        assert result.exit_code == 0 and "rolled back" in result.output, result.output
        info = _get(url + "/adapt")
        assert info["drafter_version"] == 0 and info["rollbacks"][-1]["to"] == 0
        set_aside = info["latest_published"]
        assert _generate(url, PROMPTS[3]) == references[PROMPTS[3]]
        _serve_until(url, references, lambda a: a["drafter_version"] > set_aside, err_path)  # the next version is tried
        rows = SwapBuffer(swap).read(0, 10_000)
        assert rows and all(r["rid"] and len(r["prompt_ids"]) and len(r["output_ids"]) == MAX_NEW for r in rows)
        assert len({r["drafter_version"] for r in rows}) >= 2
        assert tiny_target.encode(PROMPTS[0]) not in [r["prompt_ids"] for r in rows]  # it asked to stay out
        _bench_shift(tmp_path, url)
    finally:
        err = _stop(proc, err_path)
    assert "trainer exited with code -9" in err and "trainer restarted" in err, err[-3000:]
    _monitor_shows_the_adapting_run(tmp_path / "ws")
    report = check_integrity(swap)
    assert report["ok"] and report["consumed"] > 0, report  # nothing lost, nothing learned twice
    rejected = set(json.loads((swap / "adapt.json").read_text())["rejected"])
    newest = max(v for v in WeightStore(swap).versions() if v not in rejected)
    err_path = tmp_path / "serve-again.err"
    proc, url = _start(args, env, err_path)  # the same swap dir: the newest version not set aside, from the first request
    try:
        assert _get(url + "/adapt")["drafter_version"] == newest
        assert _generate(url, PROMPTS[5]) == references[PROMPTS[5]]
    finally:
        _stop(proc, err_path)


# -- the adapter in process: rollback, restart, disk cap -------------------------------------------------
def _adapter(tmp_path, tiny_target, draft, **kw):
    from concurrent.futures import Future

    from adaflash.engine.engine import Engine
    from adaflash.models.drafter_io import load_drafter
    from adaflash.runlog import RunLog
    from adaflash.serve.adapt import AdaptConfig, Adapter

    engine = Engine(tiny_target, "adaflash", load_drafter(draft, tiny_target.model.cfg),
                    config=EngineConfig(max_batch=2, max_len=64))
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("serve")
    adapter = Adapter(AdaptConfig(swap_dir=str(tmp_path / "swap"), **kw), engine, target="tiny", draft=str(draft),
                      log=log, run_id=run, run_dir=tmp_path / "run")
    adapter.resume()

    def now(fn):  # the engine thread, here: run at once
        future: Future = Future()
        future.set_result(fn(engine))
        return future

    adapter.run_on_engine = now
    return adapter, engine


def _weights(engine) -> list:
    return [t.clone() for t in engine.drafter.state_dict().values()]


def _same(a: list, b: list) -> bool:
    return all(x.shape == y.shape and bool((x == y).all()) for x, y in zip(a, b))


def test_a_worse_version_is_rolled_back_to_the_accepted_one_and_stays_aside_after_a_restart(tmp_path, tiny_target):
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.pipeline.weights import WeightStore

    cfg = tiny_target.model.cfg
    draft = save_drafter(new_drafter("dflash", cfg, block_size=4, length_head=True), tmp_path / "d")
    adapter, engine = _adapter(tmp_path, tiny_target, draft, rollback=RollbackRule(min_requests=4, drop=0.1))
    start = _weights(engine)
    for _ in range(8):  # v0 serves code at τ 3
        adapter.record("r", [1, 2], [3, 4], "x", {"drafter_version": 0, "completion_tokens": 30,
                                                  "spec_verify_ct": 10}, tag="code", train=True)
    store = WeightStore(tmp_path / "swap")
    store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=5), {"target": "tiny"})
    adapter._follow()
    assert engine.drafter_version == 1 and not _same(_weights(engine), start)
    for _ in range(4):  # v1 serves the same tag at τ 2
        adapter.record("r", [1, 2], [3, 4], "x", {"drafter_version": 1, "completion_tokens": 20,
                                                  "spec_verify_ct": 10}, tag="code", train=True)
    adapter._judge()
    assert engine.drafter_version == 0 and _same(_weights(engine), start)
    assert adapter.rollbacks[0]["from"] == 1 and 1 in adapter.rejected
    adapter._follow()
    assert engine.drafter_version == 0  # v1 is not taken again
    restarted, engine2 = _adapter(tmp_path, tiny_target, draft)
    assert engine2.drafter_version == 0 and 1 in restarted.rejected
    assert restarted.trainer.cfg.restart_above == 1 and restarted.trainer.cfg.draft == str(draft)  # not from v1
    store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=6), {"target": "tiny"})
    restarted._follow()
    assert engine2.drafter_version == 2  # the next version is tried as usual
    assert "rolled back from v2 to v0" in restarted.rollback(0) and engine2.drafter_version == 0
    with pytest.raises(ValueError, match="between 0 and 2"):
        restarted.rollback(7)


def _serve(adapter, version: int, tau: float) -> None:
    """4 requests on held-out prompts ("adapt": false) and 4 trained on, all at τ `tau`."""
    for train in (False, True):
        for _ in range(4):
            adapter.record("r", [1, 2], [3, 4], "x", {"drafter_version": version, "completion_tokens": int(tau * 10),
                                                      "spec_verify_ct": 10}, tag="code", train=train)


def test_versions_are_judged_against_the_best_accepted_one_so_small_drops_cannot_add_up(tmp_path, tiny_target):
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.pipeline.buffer import SwapBuffer
    from adaflash.pipeline.weights import WeightStore

    cfg = tiny_target.model.cfg
    draft = save_drafter(new_drafter("dflash", cfg, block_size=4, length_head=True), tmp_path / "d")
    rule = RollbackRule(min_requests=4, drop=0.1, held_out=True)
    adapter, engine = _adapter(tmp_path, tiny_target, draft, rollback=rule, holdout=0.0)
    store = WeightStore(tmp_path / "swap")
    start = _weights(engine)
    _serve(adapter, 0, 3.0)
    for version, tau in ((1, 2.8), (2, 2.6)):  # each within 10% of the one before, not of v0
        store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=version), {"target": "tiny"})
        adapter._follow()
        _serve(adapter, version, tau)
        adapter._judge()
    assert adapter.rollbacks and adapter.rollbacks[0]["from"] == 2 and adapter.rollbacks[0]["to"] == 0
    assert "v0's 3.00" in adapter.rollbacks[0]["why"] and engine.drafter_version == 0 and _same(_weights(engine), start)
    assert {1, 2} <= adapter.rejected and adapter.trainer.cfg.draft == str(draft)  # the trainer starts over from v0
    adapter._flush()
    assert SwapBuffer(tmp_path / "swap").count() == 12  # the held-out requests were never recorded
    assert adapter.info()["versions"][0]["held_out"]["requests"] == 4
    adapter._log_metrics()  # the run log's tau rows: all requests since the last row, and the held-out ones
    for train, tokens in ((False, 30), (True, 10)):
        adapter.record("r", [1, 2], [3, 4], "x", {"drafter_version": 0, "completion_tokens": tokens,
                                                  "spec_verify_ct": 10}, tag="code", train=train)
    adapter._log_metrics()
    logged = {row["name"]: row["value"] for row in adapter.log.metrics_since(0, run_id=adapter.run_id)}
    assert logged["holdout_tau"] == pytest.approx(3.0) and logged["tau"] == pytest.approx(2.0)


def test_versions_that_replace_each_other_before_a_verdict_are_judged_together(tmp_path, tiny_target):
    # A trainer publishing every second, 32 held-out requests taking several: no version alone reaches the
    # count, so a decline would never be judged. Together they do, and the reference comes back.
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.pipeline.weights import WeightStore

    cfg = tiny_target.model.cfg
    draft = save_drafter(new_drafter("dflash", cfg, block_size=4, length_head=True), tmp_path / "d")
    adapter, engine = _adapter(tmp_path, tiny_target, draft, rollback=RollbackRule(12, 0.1, held_out=True), holdout=0.0)
    store = WeightStore(tmp_path / "swap")
    start = _weights(engine)
    _serve(adapter, 0, 3.0)
    for version in (1, 2, 3):  # 4 held-out requests each, at τ 2.5: under 12 alone, 12 together
        store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=version), {"target": "tiny"})
        adapter._follow()
        assert engine.drafter_version == version
        adapter._judge()
        assert not adapter.rollbacks
        _serve(adapter, version, 2.5)
    adapter._judge()
    assert adapter.rollbacks[-1]["from"] == 3 and adapter.rollbacks[-1]["to"] == 0, adapter.rollbacks
    why = adapter.rollbacks[-1]["why"]
    assert why.startswith("v1-v3 rolled back: τ 2.50 against v0's 3.00") and "over 12 requests" in why
    assert engine.drafter_version == 0 and _same(_weights(engine), start) and {1, 2, 3} <= adapter.rejected
    assert adapter.checking == []
    # a group at least as good becomes the reference: the next group is judged against its newest
    store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=4), {"target": "tiny"})
    adapter._follow()
    for _ in range(3):
        _serve(adapter, 4, 3.0)
    adapter._judge()
    assert len(adapter.rollbacks) == 1 and adapter.baseline is None and engine.drafter_version == 4
    # the reference is measured on the whole group that was accepted, not on its newest version's few requests
    for version, rounds, tau in ((5, 2, 3.6), (6, 1, 2.4)):  # together τ 3.2: better than v4's 3.0
        store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=version), {"target": "tiny"})
        adapter._follow()
        for _ in range(rounds):
            _serve(adapter, version, tau)
    adapter._judge()
    assert adapter.accepted == [5, 6] and len(adapter.rollbacks) == 1
    store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=7), {"target": "tiny"})
    adapter._follow()
    for _ in range(3):
        _serve(adapter, 7, 2.8)  # above v6's own 2.4, more than 10% below the group's 3.2
    adapter._judge()
    assert adapter.rollbacks[-1]["to"] == 6 and "against v5-v6's 3.20" in adapter.rollbacks[-1]["why"]
    assert engine.drafter_version == 6


def test_a_rollback_restarts_the_trainer_from_the_version_restored_where_the_traffic_was(tmp_path, tiny_target):
    from adaflash.models.drafter_io import load_drafter, new_drafter, save_drafter
    from adaflash.pipeline.training import _initial_trainer
    from adaflash.pipeline.weights import WeightStore

    cfg = tiny_target.model.cfg
    draft = save_drafter(new_drafter("dflash", cfg, block_size=4, length_head=True), tmp_path / "d")
    adapter, engine = _adapter(tmp_path, tiny_target, draft, rollback=RollbackRule(4, 0.1, held_out=True), holdout=0.0)
    store = WeightStore(tmp_path / "swap")
    _serve(adapter, 0, 3.0)
    for version, tau, consumed in ((1, 3.5, 8), (2, 2.0, 16)):  # v1 better: the reference; v2 worse
        store.publish(new_drafter("dflash", cfg, block_size=4, length_head=True, seed=version), {"target": "tiny"},
                      pointer_extra={"consumed": consumed})
        adapter._follow()
        _serve(adapter, version, tau)
        adapter._judge()
    v1 = [t.clone() for t in load_drafter(store.folder(1), cfg).state_dict().values()]
    assert adapter.rollbacks[-1]["to"] == 1 and engine.drafter_version == 1 and 2 in adapter.rejected
    restarted = adapter.trainer.cfg
    assert (restarted.restart_above, restarted.start_consumed) == (2, 16)
    assert _same([t for t in load_drafter(restarted.draft, cfg).state_dict().values()], v1)
    # the trainer starts from that copy of v1, reading the buffer after what v2 learned
    trainer, _ = _initial_trainer(restarted, tiny_target, store)
    assert trainer.state.consumed == 16 and trainer.state.step == 0
    assert _same([t for t in trainer.drafter.state_dict().values() if t.dtype.is_floating_point][:3],
                 [t for t in v1 if t.dtype.is_floating_point][:3])


def test_recording_pauses_at_the_disk_cap_and_serving_goes_on(tmp_path, tiny_target):
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.pipeline.buffer import SwapBuffer

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=4, length_head=True), tmp_path / "d")
    adapter, _ = _adapter(tmp_path, tiny_target, draft, max_disk_mb=0.001)  # 1,000 bytes
    meta = {"drafter_version": 0, "completion_tokens": 4, "spec_verify_ct": 2}
    for _ in range(20):
        adapter.record("r", list(range(20)), list(range(20)), "x", meta, tag=None, train=True)
    adapter._flush()
    assert adapter.capped and SwapBuffer(tmp_path / "swap").count() == 20
    adapter.record("r", [1, 2], [3, 4], "x", meta, tag=None, train=True)
    adapter._flush()
    assert adapter.dropped_at_cap == 1 and SwapBuffer(tmp_path / "swap").count() == 20
    assert adapter.info()["recording"] is False and adapter.tally.requests(0) == 21  # still counted for τ
    events = [e["message"] for e in adapter.log.events_since(0, run_id=adapter.run_id)]
    assert any("recording paused" in m for m in events)
