"""The training worker(s): consume the swap buffer in order, distil, publish versions.

Rank 0 decides how many rows the next step takes and broadcasts it, so every rank of a
torchrun job trains on the same rows (each on its slice, `rows[rank::world]`). One step is one
optimizer update over the whole slice set: each rank weights its mean loss by its share of the
batch and the gradients are summed over ranks, so every row counts exactly once however
unevenly the batch splits; a rank left without rows joins the all-reduce with zero gradients.
The consumed offset is saved inside each published version, which makes a restart resume right
after the last published sample: nothing is lost and nothing is learned twice. What each rank
took is written to the consumption ledger (ledger.py) for the run's integrity check.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from adaflash.models.drafter_io import load_drafter
from adaflash.models.drafters import DFlashDrafter
from adaflash.models.length_head import LengthHead
from adaflash.models.loading import load_target
from adaflash.models.memory import peak_memory_gib
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.ledger import ConsumeLedger
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog
from adaflash.train.checkpoint import MANIFEST, save_checkpoint
from adaflash.train.data import Sequence, row_to_sequence
from adaflash.train.loop import (
    TRAINER_DIR,
    TrainConfig,
    Trainer,
    gather_floats,
    rank_world,
    setup_distributed,
    warmed_up,
)
from adaflash.train.losses import LossConfig


@dataclass
class TrainingConfig:
    target: str
    draft: str
    swap_dir: str
    run_id: str
    workspace: str
    loss: LossConfig = field(default_factory=lambda: LossConfig("rkl-mix"))
    length_head: bool = True
    lr: float = 1e-4
    warmup_steps: int = 16  # the drafter arrives trained while Adam's state is fresh: ramp the rate up
    min_buffer: int = 8
    train_batch: int = 8
    publish_every: int = 2
    keep: int = 3
    blocks_per_seq: int = 8
    max_len: int = 1024
    poll_seconds: float = 0.5
    device: str | None = None
    seed: int = 0
    deadline: float | None = None  # wall clock (time.time()) at which to stop consuming and publish a final version
    lr_decay_seconds: float = 0.0  # the last seconds before the deadline anneal the rate linearly to zero
    # A restart from `draft` after a server's rollback: versions up to `restart_above` were set aside, so the
    # trainer resumes only from a newer one, else starts from `draft` reading the buffer at `start_consumed`.
    restart_above: int = 0
    start_consumed: int = 0

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TrainingConfig:
        """The config the launcher sent as JSON (`asdict`)."""
        return cls(**{**raw, "loss": LossConfig(**raw.get("loss") or {"kind": "rkl-mix"})})


def _rank_device(device: str | None) -> str | None:
    """Each torchrun rank on its own GPU (LOCAL_RANK of the visible ones); CPU ranks share the CPU."""
    _, world = rank_world()
    if world > 1 and device is not None and device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return f"cuda:{local}"
    return device


def _initial_trainer(cfg: TrainingConfig, target, store: WeightStore) -> tuple[Trainer, list[tuple[int, str]]]:
    """The trainer, resumed from the newest published version above `cfg.restart_above` that passes its
    checksums (else started from `cfg.draft` at `cfg.start_consumed`), and the newer versions it skipped as
    torn, with why."""
    tcfg = TrainConfig(method="dflash", out=str(store.root), lr=cfg.lr, warmup_steps=0, blocks_per_seq=cfg.blocks_per_seq,
                       length_head=cfg.length_head, seed=cfg.seed, loss=cfg.loss)
    found, skipped = store.newest_valid(newer_than=cfg.restart_above)
    folder = store.folder(found[0]) if found else None
    resume = folder is not None and (folder / TRAINER_DIR / MANIFEST).is_file()
    drafter = load_drafter(folder if resume else cfg.draft, target.model.cfg)
    if not isinstance(drafter, DFlashDrafter):
        raise ValueError(f"the pipeline trains DFlash drafters; {cfg.draft} is {drafter.method}")
    if cfg.length_head and drafter.length_head is None:
        drafter.length_head = LengthHead(target.model.cfg.hidden_size)
    if not cfg.length_head:
        drafter.length_head = None
    trainer = Trainer(tcfg, target, drafter)
    if resume:
        trainer.restore(folder / TRAINER_DIR)
    else:
        trainer.state.consumed = cfg.start_consumed
    return trainer, skipped


def _agree(values: list[float], device: torch.device) -> list[float]:
    """Rank 0's values on every rank (float64 carries the ints here exactly)."""
    _, world = rank_world()
    if world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return tensor.tolist()


def pipeline_lr(cfg: TrainingConfig, step: int, now: float) -> float:
    """Warmup, a constant rate, then (with a deadline) a linear anneal to zero over its last seconds.

    A constant rate leaves the published drafter wherever the optimizer's noise has it; annealing at
    the end of a time budget (warmup-stable-decay) lets the last version settle. Ranks take rank 0's
    value: each computes it from its own clock.
    """
    lr = warmed_up(cfg.lr, step, cfg.warmup_steps)
    if cfg.deadline is None or cfg.lr_decay_seconds <= 0:
        return lr
    return lr * min(1.0, max(0.0, (cfg.deadline - now) / cfg.lr_decay_seconds))


def run_training(cfg: TrainingConfig) -> int:
    """Train on the buffer until the producer is done (or a stop or the deadline); returns samples consumed."""
    return TrainingWorker(cfg).run()


class TrainingWorker:
    """One rank of the training job; rank 0 also writes the run log, the ledger and the versions."""

    def __init__(self, cfg: TrainingConfig) -> None:
        self.cfg = cfg
        self.rank, self.world = rank_world()
        # bf16 on a GPU (the trainer runs under bf16 autocast there), float32 on a CPU: as train draft
        self.target = load_target(cfg.target, device=_rank_device(cfg.device), dtype="auto", with_tokenizer=False)
        setup_distributed(self.target.device)
        self.log = RunLog.open(cfg.workspace) if self.rank == 0 else None
        self.buffer, self.store = SwapBuffer(cfg.swap_dir), WeightStore(cfg.swap_dir)
        self.ledger = ConsumeLedger(cfg.swap_dir)
        self.trainer, skipped = _initial_trainer(cfg, self.target, self.store)
        self.unpublished = 0
        self.started = self.trainer.state.step > 0
        self.last_step_at = time.perf_counter()
        if self.log:
            consumed = self.trainer.state.consumed
            for version, why in skipped:
                self._event(f"skipped version {version} on resume: {why}", level="warning")
            dropped = self.ledger.rewind(consumed)
            if dropped:
                self._event(f"resumed at sample {consumed} (last published version); "
                            f"{dropped} unpublished step(s) will be learned again")
            self.log.log_metrics(cfg.run_id, {"world_size": self.world}, step=self.trainer.state.step, job="training")

    def run(self) -> int:
        cfg, state = self.cfg, self.trainer.state
        while True:
            take, finish, lr = self._decide()
            if finish:
                break
            if take == 0:
                time.sleep(cfg.poll_seconds)
                continue
            self._step(take, lr)
            self.unpublished += 1
            if self.unpublished >= cfg.publish_every:
                self._publish()
        if self.unpublished or self.store.latest_version() == 0:
            self._publish()
        if self.log:
            why = " (time budget reached)" if cfg.deadline is not None and time.time() >= cfg.deadline else ""
            self._event(f"training done{why}: {state.consumed} samples, {state.step} steps, "
                        f"version {self.store.latest_version()}")
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
        return state.consumed

    def _decide(self) -> tuple[int, bool, float]:
        """(rows the next step takes, whether to finish, learning rate), as rank 0 sees them.

        Training starts once `min_buffer` rows wait (or the producer is done); a step takes a whole
        `train_batch` unless the producer is done and fewer are left.
        """
        cfg, consumed = self.cfg, self.trainer.state.consumed
        available = self.buffer.count() - consumed
        done = self.buffer.producer_done() is not None
        self.started = self.started or available >= cfg.min_buffer or (done and available > 0)
        out_of_time = cfg.deadline is not None and time.time() >= cfg.deadline
        finish = self.buffer.stop_requested() or (done and available == 0) or out_of_time
        take = min(available, cfg.train_batch) if self.started and (available >= cfg.train_batch or done) else 0
        lr = pipeline_lr(cfg, self.trainer.state.step, time.time())
        take, finish, lr = _agree([take, int(finish), lr], self.target.device)
        return int(take), bool(finish), lr

    def _step(self, take: int, lr: float) -> None:
        """One optimizer update over rows [consumed, consumed + take), each rank on its slice."""
        began = time.perf_counter()
        start = self.trainer.state.consumed
        if self.log:  # the step under way (a CPU step can take a minute): dashboards show it at once
            self.log.log_metrics(self.cfg.run_id, {"training_step": self.trainer.state.step + 1, "training_rows": take},
                                 step=self.trainer.state.step + 1, job="training")
        mine = self.buffer.read(start, take)[self.rank::self.world]
        sequences: list[Sequence] = []
        usable: list[bool] = []
        for row in mine:
            seq = row_to_sequence(row, self.target, self.cfg.max_len, f"buffer seq {row['seq']}")
            usable.append(seq is not None)
            if seq is not None:
                sequences.append(seq)
        stats = self.trainer.step_on(sequences, lr, self.trainer.cfg.loss)
        seconds = time.perf_counter() - began
        # what every rank took and spent: [rows trained, tokens, seconds, loss·rows, then its seqs (-1 pad)];
        # seq s is sent as s (trained) or -2 - s (an unusable row, e.g. an empty answer)
        width = math.ceil(take / self.world)
        seqs = [float(r["seq"]) if ok else -2.0 - r["seq"] for r, ok in zip(mine, usable)]
        tokens = sum(len(s.ids) for s in sequences)
        loss_sum = (stats or {}).get("loss", 0.0) * len(sequences)
        shares = gather_floats([float(len(sequences)), float(tokens), seconds, loss_sum, *seqs,
                                *[-1.0] * (width - len(seqs))], self.target.device)
        self.trainer.state.consumed += take
        if self.log:
            self._record(stats or {}, shares, start, take)

    def _record(self, stats: dict[str, float], shares: list[list[float]], start: int, take: int) -> None:
        """Rank 0: the step's metrics (per rank too) and its ledger line for the integrity check."""
        state = self.trainer.state
        now = time.perf_counter()
        metrics: dict[str, float] = dict(stats)
        trained = sum(sh[0] for sh in shares)
        if self.world > 1 and trained:
            metrics["loss"] = sum(sh[3] for sh in shares) / trained
        slowest = max(sh[2] for sh in shares)
        tokens = sum(sh[1] for sh in shares)
        metrics.update({"step_seconds": now - self.last_step_at, "step_compute_seconds": slowest,
                        "train_samples": trained, "train_tokens": tokens,
                        "train_tokens_per_s": tokens / max(slowest, 1e-9), "consumed": state.consumed})
        for r, sh in enumerate(shares):
            metrics.update({f"rank{r}_samples": sh[0], f"rank{r}_tokens": sh[1], f"rank{r}_seconds": sh[2]})
        if (peak := peak_memory_gib(self.target.device)) is not None:
            metrics["peak_memory_gib"] = peak
        self.last_step_at = now
        self.log.log_metrics(self.cfg.run_id, metrics, step=state.step, job="training")
        ranks = [[int(v) if v >= 0 else int(-2 - v) for v in sh[4:] if v != -1.0] for sh in shares]
        unusable = sorted(int(-2 - v) for sh in shares for v in sh[4:] if v <= -2)
        self.ledger.append({"step": state.step, "from": start, "to": start + take, "ranks": ranks,
                            "unusable": unusable, "time": time.time()})

    def _publish(self) -> None:
        """Rank 0 publishes a version holding the drafter, the trainer's state and the consumed offset."""
        self.unpublished = 0
        if self.rank != 0:
            return
        cfg, state, store = self.cfg, self.trainer.state, self.store
        meta = {"target": cfg.target, "num_target_layers": self.target.model.cfg.num_hidden_layers,
                "consumed": state.consumed, "step": state.step, "loss": cfg.loss.kind}
        version = store.publish(self.trainer.drafter, meta, keep=cfg.keep,
                                extra_files={TRAINER_DIR: lambda p: save_checkpoint(p, self.trainer.state_blob(weights=False))},
                                pointer_extra={"consumed": state.consumed})
        published_at = float((store.pointer() or {}).get("published_at") or time.time())
        self.log.log_metrics(cfg.run_id, {"published_version": version, "consumed": state.consumed},
                             step=state.step, version=version, job="training")
        self.log.add_checkpoint(cfg.run_id, str(store.folder(version)), kind="drafter", version=version,
                                step=state.step, metrics={"published_at": published_at, "consumed": state.consumed})

    def _event(self, message: str, level: str = "info") -> None:
        print(f"adaflash training worker: {message}", flush=True)
        self.log.log_event(self.cfg.run_id, message, level=level, job="training")
