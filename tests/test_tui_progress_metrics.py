"""The progress the dashboard shows from the first second: what the pipeline workers record before their
first flush (inference) and before each step ends (training)."""

from __future__ import annotations

import json

from adaflash.engine.config import EngineConfig
from adaflash.models.drafter_io import new_drafter, save_drafter
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.runlog import RunLog
from adaflash.train.losses import LossConfig


def test_inference_records_prompts_in_flight_and_tokens_before_its_first_flush(tmp_path, tiny_llama, tiny_target):
    from adaflash.pipeline.inference import InferenceConfig, run_inference

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(4)))
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")
    run_inference(InferenceConfig(target=str(tiny_llama), draft=str(draft), data=str(prompts),
                                  swap_dir=str(tmp_path / "swap"), run_id=run, workspace=str(tmp_path / "ws"),
                                  method="dflash", engine=EngineConfig(max_batch=2), max_new_tokens=6, flush_every=100))
    rows = log.metrics_since(0, run_id=run)
    first_flush = min(r["id"] for r in rows if r["name"] == "samples")
    early: dict[str, float] = {}
    for r in rows:  # the first progress record (under load a second one may come before the flush)
        if r["id"] < first_flush:
            early.setdefault(r["name"], r["value"])
    assert early["prompts_in_flight"] == 2 and early["answers_so_far"] == 0 and "tokens_so_far" in early


def test_training_records_the_step_under_way_before_it_ends(tmp_path, tiny_llama, tiny_target):
    from adaflash.pipeline.training import TrainingConfig, run_training

    draft = save_drafter(new_drafter("dflash", tiny_target.model.cfg, block_size=8), tmp_path / "d0")
    buffer = SwapBuffer(tmp_path / "swap")
    prompt = tiny_target.render("Count.")
    buffer.append([{"prompt_text": prompt, "response": f"one two three {i}", "output_ids": []} for i in range(4)])
    buffer.mark_done()
    log = RunLog.open(tmp_path / "ws")
    run = log.create_run("pipeline")
    run_training(TrainingConfig(target=str(tiny_llama), draft=str(draft), swap_dir=str(tmp_path / "swap"), run_id=run,
                                workspace=str(tmp_path / "ws"), loss=LossConfig("fkl"), length_head=False, min_buffer=2,
                                train_batch=2, publish_every=1, poll_seconds=0.05))
    rows = log.metrics_since(0, run_id=run)
    began = [(r["id"], r["value"]) for r in rows if r["name"] == "training_step"]
    ended = [(r["id"], r["step"]) for r in rows if r["name"] == "loss"]
    assert [v for _, v in began] == [1, 2] and [s for _, s in ended] == [1, 2]
    assert all(b < e for (b, _), (e, _) in zip(began, ended))  # each recorded before its step's loss
