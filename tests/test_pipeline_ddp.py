"""The training side under torchrun (2 CPU processes, gloo): every buffer row counted exactly once.

The batch of a step splits unevenly over the ranks (3 rows on 2 ranks, then a row that one rank
cannot use, then a single row that leaves rank 1 with nothing). The gradient of each step must be
the gradient of the mean over the step's usable rows, as a single process computes it, and the
ledger must show which rank took which row, none twice and none left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

from adaflash.models.drafter_io import new_drafter, save_drafter
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.ledger import ConsumeLedger
from adaflash.pipeline.report import check_integrity, pipeline_report
from adaflash.pipeline.training import TrainingConfig, run_training
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog
from adaflash.train.losses import LossConfig

WORDS = ["one", "two", "three", "four", "five", "six", "seven"]
UNUSABLE = 4  # an empty answer: consumed, never learned from


def _fill(swap, target) -> None:
    prompt = target.render("Count.")
    rows = [{"id": f"p{i}#{i}", "prompt_text": prompt, "response": "" if i == UNUSABLE else " ".join([w] * 5),
             "output_ids": []} for i, w in enumerate(WORDS)]
    buffer = SwapBuffer(swap)
    buffer.append(rows)
    buffer.mark_done()


def _grad_norms(log: RunLog, run_id: str) -> dict[int, float]:
    return {int(r["step"]): r["value"] for r in log.metrics_since(0, run_id=run_id, names=["grad_norm"])}


def test_torchrun_training_counts_every_row_once(tmp_path, tiny_llama, tiny_target):
    cfg_target = tiny_target.model.cfg
    lengths = {len(tiny_target.encode(" ".join([w] * 5))) for w in WORDS}
    assert len(lengths) == 1  # equal rows: the mean over rows is the mean over tokens, as one process sees it
    draft = save_drafter(new_drafter("dflash", cfg_target, block_size=8, seed=3), tmp_path / "d0")
    ws = tmp_path / "ws"
    log = RunLog.open(ws)

    def config(swap, run_id) -> TrainingConfig:
        # blocks_per_seq above the number of anchors: every anchor is used, so ranks and a single
        # process draw the same blocks whatever their random streams
        return TrainingConfig(target=str(tiny_llama), draft=str(draft), swap_dir=str(swap), run_id=run_id,
                              workspace=str(ws), loss=LossConfig("fkl"), length_head=True, min_buffer=1, train_batch=3,
                              publish_every=1, blocks_per_seq=64, poll_seconds=0.05, device="cpu")

    ddp_swap, ref_swap = tmp_path / "swap-ddp", tmp_path / "swap-ref"
    _fill(ddp_swap, tiny_target)
    _fill(ref_swap, tiny_target)
    ddp_run = log.create_run("pipeline", config={"swap_dir": str(ddp_swap)})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "adaflash.pipeline.worker", "train", json.dumps(asdict(config(ddp_swap, ddp_run)))]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    ref_run = log.create_run("pipeline", config={"swap_dir": str(ref_swap)})
    assert run_training(config(ref_swap, ref_run)) == len(WORDS)

    # what each rank took: rows[rank::2] of [0,1,2], [3,4,5], [6]; row 4 taken but unusable
    entries = ConsumeLedger(ddp_swap).entries()
    assert [(e["from"], e["to"]) for e in entries] == [(0, 3), (3, 6), (6, 7)]
    assert [e["ranks"] for e in entries] == [[[0, 2], [1]], [[3, 5], [4]], [[6], []]]
    assert [e["unusable"] for e in entries] == [[], [UNUSABLE], []]
    assert WeightStore(ddp_swap).pointer()["consumed"] == len(WORDS)

    # the same gradient as one process on the whole batch (old code: row 1 weighted 1/2, rows 0 and 2 1/4)
    ddp, ref = _grad_norms(log, ddp_run), _grad_norms(log, ref_run)
    assert sorted(ddp) == sorted(ref) == [1, 2, 3]
    assert abs(ddp[1] - ref[1]) <= 1e-4 * ref[1], (ddp, ref)
    for step in (2, 3):
        assert abs(ddp[step] - ref[step]) <= 2e-3 * ref[step], (ddp, ref)

    integrity = check_integrity(ddp_swap)
    assert integrity["ok"] and integrity["missing"] == 0 and integrity["duplicated"] == 0
    assert integrity["consumed"] == len(WORDS) and integrity["unusable"] == 1 and integrity["unconsumed"] == 0

    report = pipeline_report(log, log.get_run(ddp_run))
    training = report["training"]
    assert training["world_size"] == 2 and training["steps"] == 3 and training["samples"] == len(WORDS) - 1
    ranks = {r["rank"]: r for r in training["ranks"]}
    assert ranks[0]["samples"] == 5 and ranks[1]["samples"] == 1  # [0, 2] [3, 5] [6] and [1] (4 is unusable)
    assert ranks[0]["tokens"] > ranks[1]["tokens"] > 0 and all(r["tokens_per_s"] > 0 for r in ranks.values())
    assert [v["drafter_version"] for v in report["versions"]] == [1, 2, 3]
    assert report["integrity"]["ok"]
