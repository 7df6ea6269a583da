"""The on-policy pipeline: buffer order, atomic versions, torn-version refusal, the whole run."""

import json

import pytest
import torch
from click.testing import CliRunner

from adaflash import procs
from adaflash.cli.main import cli
from adaflash.engine.config import EngineConfig
from adaflash.models.drafter_io import DrafterError, load_drafter, new_drafter, save_drafter
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog
from adaflash.train.checkpoint import load_checkpoint, save_checkpoint
from adaflash.train.losses import LossConfig


def test_buffer_appends_in_order_and_survives_a_torn_line(tmp_path):
    buffer = SwapBuffer(tmp_path)
    assert buffer.append([{"x": 1}, {"x": 2}]) == 2
    with buffer.path.open("a") as handle:
        handle.write('{"seq": 2, "x": 3')  # a writer killed mid-line
    assert buffer.count() == 2
    assert [r["x"] for r in buffer.read(0, 10)] == [1, 2]
    assert buffer.repair() == 2
    assert buffer.append([{"x": 3}]) == 3
    assert [r["seq"] for r in buffer.read(1, 5)] == [1, 2]


def test_buffer_readers_follow_appends_of_another_process(tmp_path):
    writer, reader = SwapBuffer(tmp_path), SwapBuffer(tmp_path)
    writer.append([{"x": i} for i in range(5)])
    assert reader.count() == 5 and [r["x"] for r in reader.read(3, 10)] == [3, 4]
    with writer.path.open("a") as handle:
        handle.write('{"seq": 5, "x"')  # half a line: not a row yet
    assert reader.count() == 5 and reader.read(5, 1) == []
    with writer.path.open("a") as handle:
        handle.write(': 5}\n')  # the line completed
    assert reader.count() == 6 and reader.read(5, 1) == [{"seq": 5, "x": 5}]
    assert [r["seq"] for r in reader.read(0, 3)] == [0, 1, 2]
    writer.path.unlink()  # a fresh buffer in the same place is indexed from scratch
    SwapBuffer(tmp_path).append([{"x": "new"}])
    assert reader.count() == 1 and reader.read(0, 5)[0]["x"] == "new"


def test_buffer_refuses_rows_out_of_sequence(tmp_path):
    buffer = SwapBuffer(tmp_path)
    buffer.path.write_text('{"seq": 0}\n{"seq": 7}\n')
    with pytest.raises(ValueError, match="line 2 has seq 7, expected 1"):
        buffer.read(0, 2)


def test_versions_publish_atomically_prune_and_refuse_torn(tmp_path, tiny_target):
    store = WeightStore(tmp_path)
    cfg = tiny_target.model.cfg
    drafter = new_drafter("dflash", cfg, block_size=8)
    for _ in range(4):
        store.publish(drafter, {"target": "tiny"}, keep=2, pointer_extra={"consumed": 3})
    assert store.latest_version() == 4
    assert store.versions() == [3, 4]
    assert store.pointer()["consumed"] == 3
    version, loaded = store.load(cfg)
    assert version == 4 and loaded.block_size == 8
    assert store.load(cfg, newer_than=4) is None
    weights = store.folder(4) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # torn
    with pytest.raises(DrafterError, match="checksum"):
        store.load(cfg)


def test_a_torn_newest_version_falls_back_to_the_newest_that_passes_its_checksums(tmp_path, tiny_target):
    """A truncated newest version stopped the trainer with a traceback; readers fell back to the initial drafter."""
    store = WeightStore(tmp_path)
    cfg = tiny_target.model.cfg
    for seed in range(4):
        store.publish(new_drafter("dflash", cfg, block_size=8, seed=seed), {"target": "tiny"}, keep=3,
                      extra_files={"trainer": lambda p: save_checkpoint(p, {"opt": torch.ones(4)})})
    assert store.versions() == [2, 3, 4]
    weights = store.folder(4) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # torn while the run was stopped
    part = next((store.folder(3) / "trainer").glob("*.safetensors"))
    part.write_bytes(part.read_bytes()[:-4])  # a torn trainer state is a torn version too
    found, skipped = store.newest_valid(target=cfg)
    assert found is not None and found[0] == 2 and found[1].block_size == 8
    assert [v for v, _ in skipped] == [4, 3]
    assert "version 4: " in skipped[0][1] and "model.safetensors does not match its checksum" in skipped[0][1]
    assert f"trainer/{part.name} does not match its checksum" in skipped[1][1]
    assert store.newest_valid(newer_than=2) == (None, skipped)
    assert store.publish(new_drafter("dflash", cfg, block_size=8), {"target": "tiny"}) == 5  # never reuses 4
    assert store.newest_valid()[0] == (5, None)


def test_export_copies_a_version_whole_or_not_at_all(tmp_path, tiny_target):
    swap = tmp_path / "swap"
    store = WeightStore(swap)
    cfg = tiny_target.model.cfg
    for seed in range(3):
        store.publish(new_drafter("dflash", cfg, block_size=8, seed=seed), {"target": "tiny"}, keep=2,
                      extra_files={"trainer": lambda p: save_checkpoint(p, {"opt": torch.ones(4)})})
    out = tmp_path / "exported"
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "pipeline", "export", "--swap-dir", str(swap),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "exported version 3" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no trainer state
    assert (out / "model.safetensors").read_bytes() == (store.folder(3) / "model.safetensors").read_bytes()
    loaded = load_drafter(out, cfg)
    assert torch.equal(loaded.state_dict()["fc.weight"], store.load(cfg)[1].state_dict()["fc.weight"])

    assert store.export(out, version=2)[0] == 2  # a kept older version, over the folder exported before
    assert (out / "model.safetensors").read_bytes() == (store.folder(2) / "model.safetensors").read_bytes()
    with pytest.raises(DrafterError, match=r"version 1 is not in .*kept: \[2, 3\]"):
        store.export(out, version=1)
    before = (out / "model.safetensors").read_bytes()
    weights = store.folder(3) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # torn
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "pipeline", "export", "--swap-dir", str(swap),
                                      "--out", str(out)])
    assert result.exit_code == 2 and "checksum" in result.output
    assert (out / "model.safetensors").read_bytes() == before  # the earlier export stays whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left


def test_inference_worker_refuses_a_torn_version_and_keeps_going(tmp_path, tiny_llama, tiny_target):
    from adaflash.pipeline.inference import InferenceConfig, run_inference

    cfg = tiny_target.model.cfg
    draft = save_drafter(new_drafter("dflash", cfg, block_size=8), tmp_path / "d0")
    store = WeightStore(tmp_path / "swap")
    store.publish(new_drafter("dflash", cfg, block_size=8, seed=1), {"target": "tiny"})
    store.publish(new_drafter("dflash", cfg, block_size=8, seed=2), {"target": "tiny"})
    weights = store.folder(2) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(5)))
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")
    produced = run_inference(InferenceConfig(target=str(tiny_llama), draft=str(draft), data=str(prompts),
                                             swap_dir=str(tmp_path / "swap"), run_id=run, workspace=str(tmp_path / "ws"),
                                             method="dflash", engine=EngineConfig(max_batch=2), max_new_tokens=8))
    assert produced == 5
    rows = SwapBuffer(tmp_path / "swap").read(0, 10)
    assert [r["seq"] for r in rows] == list(range(5))
    assert all(r["prompt_text"] and r["output_ids"] for r in rows)
    assert {r["drafter_version"] for r in rows} == {1}  # the newest version that passes its checksum, not v0
    events = [e["message"] for e in RunLog.open(tmp_path / "ws").events_since(0, run_id=run)]
    assert any("refused version 2" in m and "checksum" in m for m in events), events


def test_inference_worker_skips_prompts_too_long_for_its_context(tmp_path, tiny_llama, tiny_target):
    """A corpus with one conversation past the context (ShareGPT has them) stopped the pipeline with a
    traceback; now that prompt is skipped, named and counted, and a corpus where none fits says so."""
    from adaflash.pipeline.inference import InferenceConfig, run_inference

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "short0", "prompt": "Count to 3."}, {"id": "long", "prompt": "word " * 400},
            {"id": "short1", "prompt": "Count to 4."}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")

    def infer(data, swap) -> int:
        return run_inference(InferenceConfig(target=str(tiny_llama), draft=str(draft), data=str(data),
                                             swap_dir=str(tmp_path / swap), run_id=run, workspace=str(tmp_path / "ws"),
                                             method="dflash", engine=EngineConfig(max_batch=2, max_len=256),
                                             max_new_tokens=6))

    assert infer(prompts, "swap") == 2
    assert [r["id"] for r in SwapBuffer(tmp_path / "swap").read(0, 10)] == ["short0#0", "short1#2"]
    events = [e["message"] for e in log.events_since(0, run_id=run)]
    assert any(m.startswith("skipped prompt long: prompt (") for m in events), events
    assert [m["value"] for m in log.metrics_since(0, run_id=run) if m["name"] == "skipped_prompts"] == [1.0]
    only_long = tmp_path / "long.jsonl"
    only_long.write_text(json.dumps(rows[1]) + "\n")
    with pytest.raises(ValueError, match="the engine refuses every prompt"):
        infer(only_long, "swap2")


def test_inference_worker_restarted_after_a_kill_resumes_after_its_buffered_answers(tmp_path, tiny_llama, tiny_target):
    from adaflash.pipeline.inference import InferenceConfig, run_inference

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Count to {i}."}) + "\n" for i in range(4)))
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")

    def infer(max_samples: int) -> int:
        return run_inference(InferenceConfig(target=str(tiny_llama), draft=str(draft), data=str(prompts),
                                             swap_dir=str(tmp_path / "swap"), run_id=run, workspace=str(tmp_path / "ws"),
                                             method="dflash", engine=EngineConfig(max_batch=2), max_new_tokens=6, loop=True,
                                             max_samples=max_samples, flush_every=1))

    assert infer(3) == 3
    buffer = SwapBuffer(tmp_path / "swap")
    with buffer.path.open("a") as handle:  # a writer killed in the middle of an append
        handle.write('{"seq": 3, "id": "p3#3", "prompt_te')
    assert infer(6) == 6
    rows = SwapBuffer(tmp_path / "swap").read(0, 10)
    assert [r["seq"] for r in rows] == list(range(6))
    ids = sorted((r["id"] for r in rows), key=lambda rid: int(rid.split("#")[1]))
    assert ids == ["p0#0", "p1#1", "p2#2", "p3#3", "p0#4", "p1#5"]  # none lost or repeated
    assert all(json.loads(line) for line in buffer.path.read_text().splitlines())
    speeds = [m["value"] for m in log.metrics_since(0, run_id=run) if m["name"] == "tokens_per_s"]
    assert speeds and min(speeds) > 0  # a final flush with nothing new records no speed, not a zero


def test_pipeline_end_to_end_on_cpu(tmp_path, tiny_llama, tiny_target):
    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say the number {i} twice."}) + "\n" for i in range(12)))
    ws = tmp_path / "ws"
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "pipeline", "--target", str(tiny_llama), "--draft", str(draft),
                                      "--data", str(prompts), "--max-new-tokens", "12", "--min-buffer", "4",
                                      "--train-batch", "4", "--publish-every", "1", "--batch-size", "4",
                                      "--preset", "osd", "--skip", "2"])
    assert result.exit_code == 0, result.output
    log = RunLog.open(ws)
    run = log.list_runs(kind="pipeline")[0]
    assert run["status"] == "finished" and run["method"] == "osd"
    swap = run["config"]["swap_dir"]
    buffer, store = SwapBuffer(swap), WeightStore(swap)
    assert buffer.count() == 10 and buffer.producer_done() == 10
    assert "number 2 twice" in buffer.read(0, 1)[0]["prompt_text"]  # the first two prompts were skipped
    # the exact prompt tokens served travel with each answer: the trainer needs no tokenizer
    assert all(r["prompt_ids"] == tiny_target.encode(r["prompt_text"]) for r in buffer.read(0, 10))
    pointer = store.pointer()
    assert pointer["consumed"] == 10  # every sample learned from exactly once
    assert store.latest_version() >= 3
    state = load_checkpoint(store.folder(store.latest_version()) / "trainer")
    assert state["state"]["consumed"] == 10
    names = {m["name"] for m in log.metrics_since(0, run_id=run["id"])}
    assert {"tau", "tokens_per_s", "buffer_depth", "drafter_version", "loss_fkl", "published_version"} <= names
    assert {j["role"]: j["status"] for j in log.jobs(run["id"])} == {"inference": "finished", "training": "finished"}


def test_a_second_pipeline_on_the_same_swap_dir_continues_the_first(tmp_path, tiny_llama, tiny_target):
    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(3)))
    swap = tmp_path / "swap"
    ws = tmp_path / "ws"

    def pipeline(samples: int):
        return CliRunner().invoke(cli, ["--workspace", str(ws), "pipeline", "--target", str(tiny_llama), "--draft",
                                        str(draft), "--data", str(prompts), "--max-new-tokens", "6", "--min-buffer", "2",
                                        "--train-batch", "2", "--publish-every", "1", "--batch-size", "2", "--loop",
                                        "--max-samples", str(samples), "--swap-dir", str(swap), "--preset", "osd"])

    first = pipeline(4)
    assert first.exit_code == 0, first.output
    assert WeightStore(swap).pointer()["consumed"] == 4
    second = pipeline(8)  # the first run's producer was done; this one's is not until it says so
    assert second.exit_code == 0, second.output
    buffer, store = SwapBuffer(swap), WeightStore(swap)
    assert buffer.count() == 8 and buffer.producer_done() == 8
    assert store.pointer()["consumed"] == 8  # the new answers were learned too, each once
    assert sorted(int(r["id"].split("#")[1]) for r in buffer.read(0, 8)) == list(range(8))


def test_pipeline_bad_inputs(tmp_path, tiny_target):
    """Each is one line naming the option, before a run is recorded or a worker starts (a malformed --data,
    an EAGLE-3 drafter or a negative rate used to fail inside the workers with "exited with code 1")."""
    runner = CliRunner()
    ws = ["--workspace", str(tmp_path / "ws"), "pipeline", "--draft", "smollm2-135m-dflash"]
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "bad.jsonl").write_text('{"prompt": "hi"}\nnot json\n')
    (tmp_path / "empty.jsonl").write_text("")
    eagle = save_drafter(new_drafter("eagle3", tiny_target.model.cfg), tmp_path / "e3")
    cases = [
        (["--data", "nope.jsonl"], "nope.jsonl"),
        (["--data", str(tmp_path / "p.jsonl"), "--train-gpus", "0,x"], "--train-gpus"),
        (["--data", str(tmp_path / "p.jsonl"), "--skip", "1"], "only 1 prompts"),
        (["--data", str(tmp_path / "bad.jsonl")], "bad.jsonl:2"),
        (["--data", str(tmp_path / "empty.jsonl")], "holds no prompts"),
        (["--data", str(tmp_path / "p.jsonl"), "--lr", "-1"], "--lr"),
    ]
    for args, expected in cases:
        result = runner.invoke(cli, [*ws, *args])
        assert result.exit_code == 2 and expected in result.output, (args, result.output)
    result = runner.invoke(cli, ["--workspace", str(tmp_path / "ws"), "pipeline", "--draft", str(eagle), "--data",
                                 str(tmp_path / "p.jsonl")])
    assert result.exit_code == 2 and "is a eagle3 drafter; the pipeline trains DFlash drafters" in result.output
    assert RunLog.open(tmp_path / "ws").list_runs() == []


def test_the_adaflash_preset_refuses_a_drafter_without_a_length_head_before_anything_starts(tmp_path, tiny_llama,
                                                                                             tiny_target):
    """The inference worker used to serve such a drafter as plain DFlash without a word."""
    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    base = ["--workspace", str(tmp_path / "ws"), "pipeline", "--target", str(tiny_llama), "--draft", str(draft),
            "--data", str(tmp_path / "p.jsonl"), "--dry-run"]
    result = CliRunner().invoke(cli, base)
    assert result.exit_code == 2 and "needs a DFlash drafter with a length head" in result.output, result.output
    assert "--preset osd" in result.output and "Traceback" not in result.output
    assert CliRunner().invoke(cli, [*base, "--preset", "osd"]).exit_code == 0


def test_pipeline_refuses_a_drafter_that_does_not_fit_the_target_before_anything_starts(tmp_path, tiny_llama,
                                                                                        tiny_target):
    """A drafter of another hidden size (or vocabulary) recorded a run and started two workers that crashed;
    `generate` and `serve` refuse it up front, and so does the pipeline now."""
    from dataclasses import replace

    cfg = tiny_target.model.cfg
    wide = save_drafter(new_drafter("dflash", replace(cfg, hidden_size=cfg.hidden_size * 2), block_size=8),
                        tmp_path / "wide")
    words = save_drafter(new_drafter("dflash", replace(cfg, vocab_size=cfg.vocab_size + 8), block_size=8),
                         tmp_path / "words")
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    for draft, field in ((wide, "hidden_size"), (words, "vocab_size")):
        result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "pipeline", "--target", str(tiny_llama),
                                          "--draft", str(draft), "--data", str(tmp_path / "p.jsonl")])
        assert result.exit_code == 2, result.output
        assert f"--draft does not fit --target {tiny_llama}" in result.output and f"{field}=" in result.output
        assert "Traceback" not in result.output
    assert RunLog.open(tmp_path / "ws").list_runs() == []
    assert not (tmp_path / "ws" / "runs").exists() or not any((tmp_path / "ws" / "runs").iterdir())


def trainer_on_buffer(tmp_path, tiny_llama, tiny_target, *, total: int, first: int):
    """A swap dir whose buffer holds the first `first` of `total` rows (marked done) and a training
    worker's config over it: (swap dir, buffer, all rows, config)."""
    from adaflash.pipeline.training import TrainingConfig

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    swap = tmp_path / "swap"
    buffer = SwapBuffer(swap)
    prompt = tiny_target.render("Count.")
    rows = [{"prompt_text": prompt, "response": f"one two three {i}", "output_ids": []} for i in range(total)]
    buffer.append(rows[:first])
    buffer.mark_done()
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")
    cfg = TrainingConfig(target=str(tiny_llama), draft=str(draft), swap_dir=str(swap), run_id=run,
                         workspace=str(tmp_path / "ws"), loss=LossConfig("fkl"), length_head=False, min_buffer=2, train_batch=4,
                         publish_every=1, poll_seconds=0.05)
    return swap, buffer, rows, cfg


def test_training_worker_restart_resumes_after_last_published_sample(tmp_path, tiny_llama, tiny_target):
    from adaflash.pipeline.training import run_training

    swap, buffer, rows, cfg = trainer_on_buffer(tmp_path, tiny_llama, tiny_target, total=8, first=6)
    assert run_training(cfg) == 6
    store = WeightStore(swap)
    first = store.latest_version()
    assert store.pointer()["consumed"] == 6
    # the producer comes back with more samples; a restarted trainer continues after sample 6
    buffer.clear_done()
    buffer.append(rows[6:])
    buffer.mark_done()
    assert run_training(cfg) == 8
    assert store.latest_version() == first + 1
    state = load_checkpoint(store.folder(store.latest_version()) / "trainer")
    assert state["state"]["consumed"] == 8
    assert state["state"]["step"] == 3  # 4 + 2 rows, then the 2 new ones: no sample learned twice


def test_a_training_worker_resumes_past_a_torn_newest_version_and_learns_nothing_twice(tmp_path, tiny_llama,
                                                                                        tiny_target):
    from adaflash.pipeline.ledger import ConsumeLedger
    from adaflash.pipeline.training import run_training

    swap, buffer, rows, cfg = trainer_on_buffer(tmp_path, tiny_llama, tiny_target, total=10, first=8)
    assert run_training(cfg) == 8
    store = WeightStore(swap)
    assert store.latest_version() == 2 and store.pointer()["consumed"] == 8
    weights = store.folder(2) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # torn while the run was stopped
    buffer.clear_done()
    buffer.append(rows[8:])
    buffer.mark_done()
    assert run_training(cfg) == 10  # resumed from version 1 (consumed 4), not a traceback
    state = load_checkpoint(store.folder(store.latest_version()) / "trainer")
    assert store.latest_version() == 4 and state["state"]["consumed"] == 10
    assert state["state"]["step"] == 3  # v1's step, then rows 4-7 and 8-9 once each
    spans = [(e["from"], e["to"]) for e in ConsumeLedger(swap).entries()]
    assert spans == [(0, 4), (4, 8), (8, 10)]  # the ledger describes what the weights learned: each row once
    events = [e["message"] for e in RunLog.open(cfg.workspace).events_since(0, run_id=cfg.run_id)]
    assert any(m.startswith("skipped version 2 on resume: ") and "checksum" in m for m in events), events


def test_gpu_indices_count_the_visible_gpus():
    """Under CUDA_VISIBLE_DEVICES=2,3, `--infer-gpus 0` is GPU 2 (the CUDA/torch convention), not GPU 0."""
    from adaflash.pipeline.launch import parse_gpus

    assert parse_gpus("0,1", "--train-gpus", environ={}) == ["0", "1"]
    assert parse_gpus("1", "--infer-gpus", environ={"CUDA_VISIBLE_DEVICES": "2,3"}) == ["3"]
    assert parse_gpus("cpu", "--infer-gpus", environ={"CUDA_VISIBLE_DEVICES": ""}) == []
    with pytest.raises(ValueError, match=r"--infer-gpus 2: CUDA_VISIBLE_DEVICES='2,3' leaves 2 GPU"):
        parse_gpus("2", "--infer-gpus", environ={"CUDA_VISIBLE_DEVICES": "2,3"})
    with pytest.raises(ValueError, match="leaves 0 GPU"):
        parse_gpus("0", "--infer-gpus", environ={"CUDA_VISIBLE_DEVICES": ""})


def test_length_policy_reaches_the_inference_worker(tmp_path):
    import json as _json

    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    draft = tmp_path / "d"
    made = CliRunner().invoke(cli, ["draft", "new", "--method", "dflash", "--length-head", "--target", "smollm2-135m",
                                    "--block-size", "4", "--out", str(draft)])
    assert made.exit_code == 0, made.output
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "pipeline", "--draft", str(draft), "--data",
                                      str(rows), "--length-policy", "cost", "--dry-run"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("inference:"))
    payload = _json.loads(line[line.index("'{") + 1: line.rindex("}'") + 1])
    assert payload["engine"]["length_policy"] == "cost"


def test_learning_rate_warms_up_holds_then_anneals_to_zero_at_the_deadline():
    from adaflash.pipeline.training import TrainingConfig, pipeline_lr

    cfg = TrainingConfig(target="t", draft="d", swap_dir="s", run_id="r", workspace="w", lr=1e-3, warmup_steps=4,
                         deadline=1000.0, lr_decay_seconds=100.0)
    assert pipeline_lr(cfg, 0, 0.0) == pytest.approx(2.5e-4)  # warming up
    assert pipeline_lr(cfg, 10, 850.0) == pytest.approx(1e-3)  # stable until the decay window
    assert pipeline_lr(cfg, 10, 950.0) == pytest.approx(5e-4)  # half-way through it
    assert pipeline_lr(cfg, 10, 1001.0) == 0.0
    assert pipeline_lr(TrainingConfig(target="t", draft="d", swap_dir="s", run_id="r", workspace="w", lr=1e-3,
                                      warmup_steps=0, deadline=1000.0), 10, 999.0) == 1e-3  # no decay asked


def test_training_worker_anneals_what_it_logs(tmp_path, tiny_llama, tiny_target):
    import time

    from adaflash.pipeline.training import TrainingConfig, run_training

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    swap = tmp_path / "swap"
    buffer = SwapBuffer(swap)
    prompt = tiny_target.render("Count.")
    buffer.append([{"prompt_text": prompt, "response": f"one two three {i}", "output_ids": []} for i in range(6)])
    buffer.mark_done()
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")
    cfg = TrainingConfig(target=str(tiny_llama), draft=str(draft), swap_dir=str(swap), run_id=run,
                         workspace=str(tmp_path / "ws"), loss=LossConfig("fkl"), length_head=False, min_buffer=2, train_batch=2,
                         publish_every=1, poll_seconds=0.05, lr=1e-3, warmup_steps=0,
                         deadline=time.time() + 600, lr_decay_seconds=1200)
    assert run_training(cfg) == 6
    rates = [m["value"] for m in log.metrics_since(0, run_id=run) if m["name"] == "lr"]
    assert len(rates) == 3
    assert all(4.9e-4 < r < 5.1e-4 for r in rates)  # half-way into the 20-minute anneal
    assert rates[0] > rates[1] > rates[2]  # falling as the deadline nears


def test_lr_decay_needs_a_time_budget_that_holds_it(tmp_path):
    (tmp_path / "q.jsonl").write_text('{"prompt": "hi"}\n')
    base = ["--workspace", str(tmp_path / "ws"), "pipeline", "--draft", "smollm2-135m-dflash", "--data",
            str(tmp_path / "q.jsonl"), "--dry-run"]
    result = CliRunner().invoke(cli, [*base, "--lr-decay-minutes", "2"])
    assert result.exit_code == 2 and "--lr-decay-minutes" in result.output and "--max-minutes" in result.output
    result = CliRunner().invoke(cli, [*base, "--lr-decay-minutes", "5", "--max-minutes", "3"])
    assert result.exit_code == 2 and "longer than --max-minutes 3" in result.output
    result = CliRunner().invoke(cli, [*base, "--lr-decay-minutes", "1.5", "--max-minutes", "3"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("training:"))
    assert json.loads(line[line.index("'{") + 1: line.rindex("}'") + 1])["lr_decay_seconds"] == 90.0


def _bare_pipeline(tmp_path, grace: float):
    """A launcher over a fresh run and swap dir, for workers the test starts itself: (log, run, swap, pipeline)."""
    from types import SimpleNamespace

    from adaflash.pipeline.launch import Pipeline

    log = RunLog.open(tmp_path / "ws")
    run_id = log.create_run("pipeline")
    swap = tmp_path / "swap"
    swap.mkdir()
    return log, run_id, swap, Pipeline(log, run_id, tmp_path, SimpleNamespace(swap_dir=str(swap)), SimpleNamespace(),
                                       [], [], grace=grace)


def _job(log: RunLog, run_id: str, role: str, tmp_path) -> int:
    return log.add_job(run_id, role, ["worker"], role=role, gpus="cpu", log_path=str(tmp_path / "x"))


def test_a_worker_that_fails_after_a_stop_request_fails_the_run_and_is_named(tmp_path):
    """The run read `failed` with the note "stopped on request: both workers finished their step"."""
    import sys


    log, run_id, swap, pipe = _bare_pipeline(tmp_path, grace=30)
    wait_stop = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\nsys.exit(int(sys.argv[2]))"
    for role, code in (("inference", 3), ("training", 0)):
        pipe.procs[role] = procs.spawn([sys.executable, "-c", wait_stop, str(swap / "STOP"), str(code)])
        pipe.job_ids[role] = _job(log, run_id, role, tmp_path)
    pipe.request_stop()
    assert pipe.wait(poll=0.05) == "failed"
    assert pipe.note == f"inference worker exited with code 3 (its log: {tmp_path / 'inference.log'})"
    assert {j["name"]: j["status"] for j in log.jobs(run_id)} == {"inference": "failed", "training": "finished"}


def test_a_stop_the_workers_honour_between_two_polls_still_ends_the_run_stopped(tmp_path):
    """Both workers can see the STOP file and exit before the launcher's loop looks at it: the run then ended
    finished without its note (a flaky `pipeline stop` test under load). A user's stop reads `stopped`."""
    import sys
    import time


    log, run_id, swap, pipe = _bare_pipeline(tmp_path, grace=30)
    pipe.request_stop()
    for role in ("inference", "training"):
        pipe.procs[role] = procs.spawn([sys.executable, "-c", "pass"])
        pipe.job_ids[role] = _job(log, run_id, role, tmp_path)
    for proc in pipe.procs.values():
        proc.wait()
    time.sleep(0.1)
    assert pipe.wait(poll=0.05) == "stopped"
    assert pipe.note == "stopped on request: both workers finished their step, a final version published"
    assert {j["name"]: j["status"] for j in log.jobs(run_id)} == {"inference": "stopped", "training": "stopped"}


def test_a_worker_that_ignores_the_stop_is_killed_after_the_grace_and_reads_stopped(tmp_path):
    """Killed by the launcher once the grace ran out, the job read `failed` (exit -9) in a run `stopped`; the
    supervisor's jobs read `stopped` for the same end."""
    import sys


    log, run_id, swap, pipe = _bare_pipeline(tmp_path, grace=0.3)
    honours = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
    for role, code in (("inference", honours), ("training", "import time; time.sleep(60)")):
        pipe.procs[role] = procs.spawn([sys.executable, "-c", code, str(swap / "STOP")])
        pipe.job_ids[role] = _job(log, run_id, role, tmp_path)
    pipe.request_stop()
    assert pipe.wait(poll=0.05) == "stopped"
    assert pipe.note == "a worker did not stop within 0.3s of the stop request: killed"
    jobs = {j["name"]: j for j in log.jobs(run_id)}
    assert {n: j["status"] for n, j in jobs.items()} == {"inference": "stopped", "training": "stopped"}
    assert jobs["training"]["exit_code"] == -9


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="prctl is Linux's")
def test_a_worker_gets_sigterm_when_its_launcher_is_killed(tmp_path):
    """A pipeline killed with SIGKILL left its workers running, orphaned, with nothing able to stop them;
    a worker takes SIGTERM as a stop request."""
    import os
    import signal
    import subprocess
    import sys
    import time

    # The mark appears whole (written aside, then renamed): polling for its existence read it empty once,
    # between open() and the flush at exit.
    child = ("import os, signal, sys, time\n"
             "def term(*a):\n"
             "    with open(sys.argv[1] + '.tmp', 'w') as f: f.write('term')\n"
             "    os.replace(sys.argv[1] + '.tmp', sys.argv[1]); sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, term)\n"
             "open(sys.argv[1] + '.up', 'w').write('up')\n"
             "time.sleep(60)\n")
    launcher = ("import subprocess, sys, time\n"
                "from adaflash.procs import spawn\n"
                "spawn([sys.executable, '-c', sys.argv[1], sys.argv[2]], log=None)\n"
                "time.sleep(60)\n")
    mark = tmp_path / "mark"
    proc = subprocess.Popen([sys.executable, "-c", launcher, child, str(mark)])
    deadline = time.time() + 30
    while not (tmp_path / "mark.up").exists() and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    while not mark.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert mark.exists() and mark.read_text() == "term"


def test_without_loop_each_prompt_is_answered_once_whatever_max_samples_says():
    from adaflash.pipeline.inference import answers_in_all

    assert answers_in_all(10, False, 4) == 4  # it produced 10 answers from 4 prompts, ids #0..#9
    assert answers_in_all(2, False, 4) == 2 and answers_in_all(None, False, 4) == 4
    assert answers_in_all(10, True, 4) == 10 and answers_in_all(None, True, 4) is None


def test_inference_worker_flushes_its_first_answer_at_once(tmp_path, tiny_llama, tiny_target):
    """τ is in the run log (and `tau_per_version`) from the first answer, not `flush_every` answers later."""
    from adaflash.pipeline.inference import InferenceConfig, run_inference

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Count to {i}."}) + "\n" for i in range(4)))
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")
    produced = run_inference(InferenceConfig(target=str(tiny_llama), draft=str(draft), data=str(prompts),
                                             swap_dir=str(tmp_path / "swap"), run_id=run, workspace=str(tmp_path / "ws"),
                                             method="dflash", engine=EngineConfig(max_batch=1), max_new_tokens=6,
                                             flush_every=8))
    assert produced == 4
    rows = log.metrics_since(0, run_id=run)
    taus = [(m["step"], m["value"]) for m in rows if m["name"] == "tau"]
    assert [step for step, _ in taus] == [1, 4] and all(value >= 1 for _, value in taus)  # the first, then the rest
    served = sum(m["value"] for m in rows if m["name"] == "served_requests")
    view = log.db.execute("SELECT SUM(requests) FROM tau_per_version WHERE run_id = ?", [run]).fetchone()[0]
    assert served == view == 4  # every answer counted once, whatever the windows
