"""The offline training loop shared by every drafter method: data order, checkpoints, resume, DDP, logs.

Resume is bit-for-bit: the epoch order is a function of (seed, epoch), the position in it is
saved with the optimizer and every RNG state, so stopping and resuming replays the same steps.
Multi-process (torchrun) runs shard each epoch's batches by rank and average gradients.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from adaflash.models.drafter_io import init_from_target, load_drafter, new_drafter, save_drafter
from adaflash.models.drafters import ChainDrafter, DFlashDrafter, Drafter
from adaflash.models.loading import Target
from adaflash.models.memory import peak_memory_gib
from adaflash.train.chain import chain_loss
from adaflash.train.checkpoint import checkpoint_folder, load_checkpoint, save_checkpoint
from adaflash.train.data import Sequence, epoch_batches, pad
from adaflash.train.dflash import dflash_loss
from adaflash.train.evaluate import eval_tau
from adaflash.train.features import FeatureMemo, FeatureSource
from adaflash.train.losses import LossConfig
from adaflash.train.profiling import StepProfiler

TRAINER_DIR = "trainer"  # a published pipeline version's trainer checkpoint, beside its drafter

HEAD_LR = 1e-3  # the length head's peak learning rate (its own AdamW), whatever the drafter's


@dataclass
class TrainConfig:
    method: str
    out: str
    init: str | None = None
    epochs: int = 1
    steps: int | None = None
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_tokens: int = 4096
    blocks_per_seq: int = 16
    ttt_length: int = 4
    layers: int = 1
    block_size: int | None = None  # DFlash; None: 16, or the --init drafter's
    steps_chain: int = 6
    length_head: bool = False
    init_from_target: bool = False  # a new drafter starts from the target's own layers
    save_every: int = 100
    eval_every: int = 0
    eval_max_new_tokens: int = 48
    seed: int = 0
    resume: bool = False
    checkpoint: str | None = None  # the trainer checkpoint's folder; None: OUT-train beside --out
    max_minutes: float | None = None  # wall-clock budget: stop, evaluate and save when it runs out
    # minutes of training (over every --resume leg) the learning rate's cosine spans; None: it ends
    # with this leg's --max-minutes, so a run cut by its budget still stops annealed
    schedule_minutes: float | None = None
    memo_gb: float | None = None  # target features kept between epochs; None: a third of a GPU's free memory, 4 GB on a CPU
    loss: LossConfig = field(default_factory=LossConfig)


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_index: int = 0
    tokens: int = 0
    consumed: int = 0  # on-policy: swap-buffer rows this state has learned from
    best_eval_tau: float = 0.0  # the best evaluation so far, kept in best_folder(out)
    best_step: int = 0
    seconds: float = 0.0  # training time over every leg: a time-budgeted schedule resumes where it was


def best_folder(out: str | Path) -> Path:
    """Where the drafter of the best periodic evaluation is kept: beside --out, which each save replaces."""
    out = Path(out)
    return out.with_name(f"{out.name}-best")


def _shape(tensor: torch.Tensor | None) -> str:
    return "absent" if tensor is None else "x".join(map(str, tensor.shape)) or "scalar"


def rank_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's list of floats (all lists the same length), on every rank."""
    _, world = rank_world()
    if world == 1:
        return [list(values)]
    local = torch.tensor(values, dtype=torch.float64, device=device)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local)
    return [p.tolist() for p in parts]


def setup_distributed(device: torch.device) -> None:
    _, world = rank_world()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def build_drafter(cfg: TrainConfig, target: Target, draft_vocab: torch.Tensor | None = None,
                  deepen: int | None = None) -> Drafter:
    """A new drafter, or `cfg.init` continued: at `cfg.block_size`, with `draft_vocab` and `deepen`
    layers when given (no weight depends on the first two; new layers start as identities)."""
    if cfg.init:
        drafter = load_drafter(cfg.init, target.model.cfg)
        if deepen is not None:
            if not isinstance(drafter, DFlashDrafter):
                raise ValueError(f"--layers deepens DFlash drafters; {cfg.init} is a {drafter.kind} drafter")
            drafter.deepen(deepen)
        if cfg.length_head and isinstance(drafter, DFlashDrafter) and drafter.length_head is None:
            from adaflash.models.length_head import LengthHead

            drafter.length_head = LengthHead(target.model.cfg.hidden_size)
        if cfg.block_size is not None and cfg.block_size != drafter.block_size:
            if not isinstance(drafter, DFlashDrafter):
                raise ValueError(f"--block-size applies to DFlash drafters; {cfg.init} is a {drafter.kind} drafter")
            drafter.block_size = cfg.block_size  # no weight depends on B: positions past the old block learn here
        if draft_vocab is not None:
            drafter.set_draft_vocab(draft_vocab)
        return drafter
    drafter = new_drafter(cfg.method, target.model.cfg, layers=cfg.layers, block_size=cfg.block_size or 16,
                          length_head=cfg.length_head, steps=cfg.steps_chain, seed=cfg.seed, draft_vocab=draft_vocab)
    if cfg.init_from_target:
        init_from_target(drafter, target.model)
    return drafter


def warmed_up(lr: float, step: int, warmup_steps: int) -> float:
    """`lr` ramped linearly over the first `warmup_steps` steps (0-based `step`)."""
    return lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else lr


def lr_at(step: int, total: int, cfg: TrainConfig, seconds: float = 0.0, span_s: float | None = None) -> float:
    """Warmup, then a cosine to `min_lr_ratio` that ends at the run's last step or, with a time span,
    after `span_s` seconds of training, whichever comes first."""
    if step < cfg.warmup_steps:
        return warmed_up(cfg.lr, step, cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    if span_s:
        progress = max(progress, min(1.0, seconds / span_s))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def objective(drafter: Drafter, target: Target, ids, lens, starts, cfg: TrainConfig, gen: torch.Generator,
              loss_cfg: LossConfig | None = None, features: FeatureSource | None = None):
    loss_cfg = loss_cfg or cfg.loss
    if isinstance(drafter, DFlashDrafter):
        return dflash_loss(drafter, target.model, ids, lens, starts, blocks_per_seq=cfg.blocks_per_seq,
                           loss_cfg=loss_cfg, gen=gen, train_head=drafter.length_head is not None and cfg.length_head,
                           features=features)
    assert isinstance(drafter, ChainDrafter)
    return chain_loss(drafter, target.model, ids, lens, starts, ttt_length=cfg.ttt_length, loss_cfg=loss_cfg,
                      features=features)


def schedule_seconds(cfg: TrainConfig, seconds_before: float) -> float | None:
    """Seconds of training the cosine spans: --schedule-minutes, else up to the end of this leg's budget."""
    if cfg.schedule_minutes:
        return cfg.schedule_minutes * 60
    return seconds_before + cfg.max_minutes * 60 if cfg.max_minutes else None


def synced_clock(seconds: float, device: torch.device) -> float:
    """The slowest rank's training time: every rank then sets one rate and stops after the same step."""
    return max(row[0] for row in gather_floats([seconds], device))


class Trainer:
    """Owns drafter, optimizers and state; `run` trains, `step_on` is reused by the pipeline."""

    def __init__(self, cfg: TrainConfig, target: Target, drafter: Drafter | None = None) -> None:
        self.cfg = cfg
        self.target = target
        self.device = target.device
        for p in target.model.parameters():
            p.requires_grad_(False)
        self.drafter = (drafter or build_drafter(cfg, target)).to(self.device).float().train()
        head = list(self.drafter.length_head.parameters()) if getattr(self.drafter, "length_head", None) else []
        head_ids = {id(p) for p in head}
        body = [p for p in self.drafter.parameters() if id(p) not in head_ids]
        # fused on a GPU: one kernel for every parameter's update instead of a launch per tensor group
        fused = self.device.type == "cuda"
        self.opt = torch.optim.AdamW(body, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), fused=fused)
        self.head_opt = torch.optim.AdamW(head, lr=HEAD_LR, fused=fused) if head else None
        self.state = TrainState()
        self.gen = torch.Generator().manual_seed(cfg.seed + 7919 * rank_world()[0])
        self.memo: FeatureMemo | None = None  # offline runs reuse target features across epochs
        self.clock: Callable[[], float] = time.perf_counter  # what budgets and the time schedule read
        # On a GPU the drafter's master weights stay fp32 and its passes run in bf16 (autocast):
        # the tensor cores then carry the step, not fp32 arithmetic at a fifteenth of their rate.
        self.mixed = self.device.type == "cuda"
        if self.mixed:
            torch.backends.cuda.matmul.allow_tf32 = True
            # cuDNN's attention builds a plan for every new shape, which dominates a training step
            # where each batch has its own width. The flash and memory-efficient kernels plan
            # nothing. Only training turns it off: the engine's fixed-shape graphs plan once and
            # run markedly faster with it.
            torch.backends.cuda.enable_cudnn_sdp(False)

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.mixed else contextlib.nullcontext()

    # -- checkpoints ---------------------------------------------------------------------------
    @property
    def checkpoint(self) -> Path:
        return Path(self.cfg.checkpoint) if self.cfg.checkpoint else checkpoint_folder(self.cfg.out)

    def state_blob(self, *, weights: bool = True) -> dict[str, Any]:
        """Everything needed to continue bit for bit: counters, optimizers, RNG states and, with
        `weights`, the drafter's full-precision weights (a pipeline version keeps them beside it)."""
        return {
            "state": asdict(self.state),
            "drafter": self.drafter.state_dict() if weights else None,
            "opt": self.opt.state_dict(),
            "head_opt": self.head_opt.state_dict() if self.head_opt else None,
            "gen": self.gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "config": {k: v for k, v in asdict(self.cfg).items() if k != "loss"},
        }

    def meta(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a saved drafter's config records about its training."""
        return {"target": self.target.name, "num_target_layers": self.target.model.cfg.num_hidden_layers,
                "step": self.state.step, **(extra or {})}

    def save(self, extra: dict[str, Any] | None = None) -> Path:
        """The drafter into --out (what a server loads), then the trainer checkpoint into its own folder."""
        save_drafter(self.drafter, self.cfg.out, self.meta(extra))
        save_checkpoint(self.checkpoint, self.state_blob())
        return Path(self.cfg.out)

    def restore(self, folder: str | Path | None = None) -> None:
        """Continue from a trainer checkpoint (by default this run's); the drafter must have its shapes."""
        folder = Path(folder) if folder is not None else self.checkpoint
        saved = load_checkpoint(folder)
        if saved.get("drafter") is not None:
            mine = self.drafter.state_dict()
            theirs = saved["drafter"]
            for key in sorted(set(mine) | set(theirs)):
                if key not in theirs or key not in mine or mine[key].shape != theirs[key].shape:
                    raise ValueError(f"--resume: {folder} holds another drafter than this run builds ({key}: "
                                     f"{_shape(theirs.get(key))} in the checkpoint, {_shape(mine.get(key))} here); "
                                     "give the drafter options of the run it continues")
            self.drafter.load_state_dict(theirs)
        self.state = TrainState(**saved["state"])
        self.opt.load_state_dict(saved["opt"])
        if self.head_opt and saved.get("head_opt"):
            self.head_opt.load_state_dict(saved["head_opt"])
        self.gen.set_state(saved["gen"])
        torch.set_rng_state(saved["torch_rng"])
        random.setstate(saved["python_rng"])

    # -- one optimisation step ---------------------------------------------------------------------
    def step_on(self, sequences: list[Sequence], lr: float,
                loss_cfg: LossConfig | None = None) -> dict[str, float] | None:
        """One optimizer step over the rows of every rank, each row counted once.

        Rank r's loss is the mean over its n_r rows; scaled by n_r / N and summed over ranks (the
        gradient all-reduce) it is the mean over all N rows of the step. A rank with no rows runs
        no forward pass and contributes zero gradients, so it still joins every collective.
        Returns this rank's loss stats ({} without rows), or None when no rank had a row (all
        ranks skip the update alike).
        """
        _, world = rank_world()
        counts = [int(c[0]) for c in gather_floats([float(len(sequences))], self.device)]
        total = sum(counts)
        if total == 0:
            return None
        for group in self.opt.param_groups:
            group["lr"] = lr
        if self.head_opt:
            # the head follows the drafter's schedule (warmup, decay) at its own peak: fresh Adam state on a
            # trained head takes sign-sized first steps, which a warmup keeps from knocking it off
            for group in self.head_opt.param_groups:
                group["lr"] = HEAD_LR * lr / self.cfg.lr if self.cfg.lr > 0 else HEAD_LR
        self.opt.zero_grad(set_to_none=True)
        if self.head_opt:
            self.head_opt.zero_grad(set_to_none=True)
        stats: dict[str, float] = {}
        tokens = 0
        if sequences:
            ids, lens, starts = pad(sequences, self.device)
            features = None
            if self.memo is not None:
                features = self.memo.source([id(s) for s in sequences])
            with self.autocast():
                loss, stats = objective(self.drafter, self.target, ids, lens, starts, self.cfg, self.gen, loss_cfg,
                                        features)
            (loss * (len(sequences) / total)).backward()
            tokens = int(lens.sum())
        if world > 1:
            for p in self.drafter.parameters():
                if not p.requires_grad:
                    continue
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)  # SUM of the weighted shares = the mean over every row of the step
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(
            [p for g in self.opt.param_groups for p in g["params"]], self.cfg.grad_clip))
        self.opt.step()
        if self.head_opt:
            self.head_opt.step()
        self.state.step += 1
        self.state.tokens += tokens
        stats["lr"] = lr
        return stats

    # -- the offline loop ------------------------------------------------------------------------------
    def run(self, sequences: list[Sequence], *, eval_prompts: list[str] | None = None,
            on_step: Callable[[int, int, dict[str, float]], None] = lambda *_: None,
            profiler: StepProfiler | None = None) -> dict[str, float]:
        cfg = self.cfg
        rank, world = rank_world()
        if cfg.resume:
            self.restore()
        self.memo = FeatureMemo(self.target.model, self.drafter.target_layer_ids,
                                budget_bytes=None if cfg.memo_gb is None else cfg.memo_gb * 1e9,
                                keep_greedy=(cfg.length_head and cfg.loss.kind == "ce") or cfg.loss.greedy_chain,
                                store_dtype=torch.bfloat16 if self.mixed else None)
        per_epoch = [b for i, b in enumerate(epoch_batches(sequences, cfg.batch_tokens, cfg.seed, 0))
                     if i % world == rank]
        total = cfg.steps or cfg.epochs * len(per_epoch)
        if cfg.resume and self.state.step >= total:
            raise ValueError(f"--resume: the checkpoint in {self.checkpoint} is at step {self.state.step}, already the run's "
                             f"{total} steps (--steps/--epochs): ask for more steps to continue it")
        last: dict[str, float] = {}
        started, tokens_at_start, seconds_before = self.clock(), self.state.tokens, self.state.seconds
        span_s = schedule_seconds(cfg, seconds_before)

        def out_of_time() -> bool:
            return cfg.max_minutes is not None and self.state.seconds - seconds_before >= cfg.max_minutes * 60

        while self.state.step < total and not out_of_time():
            mine = [b for i, b in enumerate(epoch_batches(sequences, cfg.batch_tokens, cfg.seed, self.state.epoch))
                    if i % world == rank]
            while self.state.batch_index < len(mine) and self.state.step < total and not out_of_time():
                group = [sequences[i] for i in mine[self.state.batch_index]]
                self.state.batch_index += 1
                if profiler:
                    profiler.before_step()
                last = self.step_on(group, lr_at(self.state.step, total, cfg, self.state.seconds, span_s)) or {}
                self.state.seconds = synced_clock(seconds_before + self.clock() - started, self.device)
                if profiler:
                    profiler.after_step()
                last["tokens_per_s"] = (self.state.tokens - tokens_at_start) / max(self.state.seconds - seconds_before, 1e-9)
                # past its budget the memo stops storing and each batch pays a target pass again: the
                # throughput drops, and this says why
                last["feature_memo_gb"] = self.memo.used / 1e9
                last["epoch"] = self.state.epoch
                if (peak := peak_memory_gib(self.device)) is not None:  # what a batch size costs
                    last["peak_memory_gib"] = peak
                if eval_prompts and cfg.eval_every and self.state.step % cfg.eval_every == 0 and rank == 0:
                    last.update(self.evaluate(eval_prompts))
                    self.keep_best(last)
                if rank == 0 and (self.state.step % cfg.save_every == 0 or self.state.step == total or out_of_time()):
                    self.save()
                on_step(self.state.step, total, last)
            if self.state.batch_index >= len(mine):
                self.state.epoch += 1
                self.state.batch_index = 0
        if profiler:
            profiler.finish()
        if rank == 0 and eval_prompts:
            last.update(self.evaluate(eval_prompts))
            self.save({"eval_tau": last.get("eval_tau")})
            if cfg.eval_every:
                self.keep_best(last)
        return last

    def keep_best(self, stats: dict[str, float]) -> None:
        """A long run on little data overfits: its best evaluation is kept apart from its latest state.

        On a small corpus held-out τ peaks after a few thousand steps and then falls while the
        training acceptance still rises (the `smollm2-135m-dflash` model card gives its figures).
        """
        tau = stats.get("eval_tau")
        if tau is None or tau <= self.state.best_eval_tau:
            return
        self.state.best_eval_tau, self.state.best_step = float(tau), self.state.step
        save_drafter(self.drafter, best_folder(self.cfg.out), self.meta({"eval_tau": float(tau)}))

    def evaluate(self, prompts: list[str]) -> dict[str, float]:
        self.drafter.eval()
        try:
            return eval_tau(self.target, self.drafter, prompts, max_new_tokens=self.cfg.eval_max_new_tokens)
        finally:
            self.drafter.train()
