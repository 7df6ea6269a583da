"""The training worker(s): consume the swap buffer in order, distil, publish versions.

Rank 0 decides how many rows the next step takes and broadcasts it, so every rank of a
torchrun job trains on the same rows (each on its slice). The consumed offset is saved inside
each published version, which makes a restart resume right after the last published sample:
nothing is lost and nothing is learned twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from adaflash.models.drafter_io import load_drafter
from adaflash.models.drafters import DFlashDrafter
from adaflash.models.length_head import LengthHead
from adaflash.models.loading import load_target
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog
from adaflash.train.data import row_to_sequence
from adaflash.train.loop import STATE_FILE, TrainConfig, Trainer, rank_world, setup_distributed
from adaflash.train.losses import LossConfig


@dataclass
class TrainingConfig:
    target: str
    draft: str
    swap_dir: str
    run_id: str
    workspace: str
    loss: str = "rkl-mix"
    alpha: float = 0.8
    kl_temperature: float = 1.0
    clip: float = 0.01
    length_head: bool = True
    lr: float = 1e-4
    min_buffer: int = 8
    train_batch: int = 8
    publish_every: int = 2
    keep: int = 3
    blocks_per_seq: int = 8
    max_len: int = 1024
    poll_seconds: float = 0.5
    device: str | None = None
    seed: int = 0


def _initial_trainer(cfg: TrainingConfig, target, store: WeightStore) -> Trainer:
    tcfg = TrainConfig(method="dflash", out=str(store.root), lr=cfg.lr, warmup_steps=0, blocks_per_seq=cfg.blocks_per_seq,
                       length_head=cfg.length_head, seed=cfg.seed,
                       loss=LossConfig(cfg.loss, cfg.alpha, cfg.kl_temperature, cfg.clip))
    version = store.latest_version()
    folder = store.folder(version) if version else None
    resume = folder is not None and (folder / STATE_FILE).is_file()
    drafter = load_drafter(folder if resume else cfg.draft, target.model.cfg)
    if not isinstance(drafter, DFlashDrafter):
        raise ValueError(f"the pipeline trains DFlash drafters; {cfg.draft} is {drafter.method}")
    if cfg.length_head and drafter.length_head is None:
        drafter.length_head = LengthHead(target.model.cfg.hidden_size)
    if not cfg.length_head:
        drafter.length_head = None
    trainer = Trainer(tcfg, target, drafter)
    if resume:
        trainer.restore(str(folder))
    return trainer


def _agree(values: list[int], device: torch.device) -> list[int]:
    """Rank 0's values on every rank."""
    _, world = rank_world()
    if world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.long, device=device)
    dist.broadcast(tensor, src=0)
    return tensor.tolist()


def run_training(cfg: TrainingConfig) -> int:
    rank, world = rank_world()
    target = load_target(cfg.target, device=cfg.device, dtype="float32")
    setup_distributed(target.device)
    log = RunLog.open(cfg.workspace) if rank == 0 else None
    buffer, store = SwapBuffer(cfg.swap_dir), WeightStore(cfg.swap_dir)
    trainer = _initial_trainer(cfg, target, store)
    loss_cfg = trainer.cfg.loss
    unpublished = 0
    last_step_at = time.perf_counter()

    def publish() -> int:
        nonlocal unpublished
        version = 0
        if rank == 0:
            meta = {"target": cfg.target, "num_target_layers": target.model.cfg.num_hidden_layers,
                    "consumed": trainer.state.consumed, "step": trainer.state.step, "loss": cfg.loss}
            version = store.publish(trainer.drafter, meta, keep=cfg.keep,
                                    extra_files={STATE_FILE: lambda p: torch.save(trainer.state_blob(), p)},
                                    pointer_extra={"consumed": trainer.state.consumed})
            log.log_metrics(cfg.run_id, {"published_version": version, "consumed": trainer.state.consumed},
                            step=trainer.state.step, job="training")
            log.add_checkpoint(cfg.run_id, str(store.folder(version)), kind="drafter", version=version,
                               step=trainer.state.step)
        unpublished = 0
        return version

    started = trainer.state.step > 0
    while True:
        available = buffer.count() - trainer.state.consumed
        done = buffer.producer_done() is not None
        started = started or available >= cfg.min_buffer or (done and available > 0)
        finish = buffer.stop_requested() or (done and available == 0)
        take = min(available, cfg.train_batch) if started and (available >= cfg.train_batch or done) else 0
        take, finish = _agree([take, int(finish)], target.device)
        if finish:
            break
        if take == 0:
            time.sleep(cfg.poll_seconds)
            continue
        rows = buffer.read(trainer.state.consumed, take)
        mine = rows[rank::world] or rows[:1]
        sequences = [s for i, r in enumerate(mine)
                     if (s := row_to_sequence(r, target, cfg.max_len, f"buffer seq {r['seq']}")) is not None]
        if sequences:
            stats = trainer.step_on(sequences, cfg.lr, loss_cfg)
            if log:
                now = time.perf_counter()
                stats["step_seconds"] = now - last_step_at
                last_step_at = now
                log.log_metrics(cfg.run_id, stats, step=trainer.state.step, job="training")
        trainer.state.consumed += take
        unpublished += 1
        if unpublished >= cfg.publish_every:
            publish()
    if unpublished or store.latest_version() == 0:
        publish()
    if log:
        log.log_event(cfg.run_id, f"training done: {trainer.state.consumed} samples, {trainer.state.step} steps, "
                      f"version {store.latest_version()}", job="training")
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()
    return trainer.state.consumed
