"""`adaflash train`'s work: offline drafter training (single process or torchrun) and the length head's fit."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import RecordedRun, emit_rows, fail, recorded_run, runlog_of
from adaflash.methods import ADAFLASH, plain_method_for
from adaflash.options import DrafterConfig, JobConfig, ProfileConfig, TrainOptions


@dataclass(frozen=True)
class DraftTraining:
    """One `train draft` run as its options make it."""

    method: str
    target: str
    device: str
    data: tuple[str, ...]
    eval_data: str | None
    limit: int | None
    max_len: int
    chain_steps: int
    train: TrainOptions
    drafter: DrafterConfig
    init: str | None
    seed: int
    job: JobConfig
    profile: ProfileConfig
    deepen: bool  # --layers given with --init: deepen the drafter to it


def run_draft_training(ctx: click.Context, work: DraftTraining) -> None:
    """Build the trainer, train inside a recorded run (rank 0 records), print the summary as JSON."""
    from adaflash.train.loop import rank_world

    rank, world = rank_world()
    trainer, tgt, sequences, prompts = _trainer(work, rank, world)
    if trainer.drafter.method != work.method:
        fail(f"--init {work.init} is a {trainer.drafter.method} drafter, not {work.method}")
    log = runlog_of(ctx) if rank == 0 else None
    config = {"world_size": world, "sequences": len(sequences), **{k: str(v) for k, v in vars(trainer.cfg).items()}}
    recording = (recorded_run(log, "train", method=work.method, target=work.target, draft=work.job.out,
                              dataset=",".join(work.data), config=config) if log else contextlib.nullcontext(None))
    _sigterm_interrupts()
    p = work.profile
    with recording as run:
        before, final = _train_steps(run, trainer, tgt, sequences, prompts, work.method, work.job.resume, rank,
                                     work.job.max_minutes, (p.profile, p.profile_steps, p.profile_after))
        if run:
            _record_final(run, trainer, final, work)
    if run:
        _summary(run, trainer, before, final, work)


def _trainer(work: DraftTraining, rank: int, world: int) -> tuple[Any, Any, Any, list[str]]:
    """(trainer, target, sequences, evaluation prompts), or a clean error."""
    from adaflash.models.drafter_io import DrafterError, frequent_tokens, refuse_foreign_folder
    from adaflash.models.loading import load_target
    from adaflash.train.checkpoint import checkpoint_folder, refuse_foreign_checkpoint
    from adaflash.train.data import TrainDataError, load_sequences
    from adaflash.train.loop import TrainConfig, Trainer, build_drafter, setup_distributed
    from adaflash.train.losses import LossConfig

    t, d, out = work.train, work.drafter, work.job.out or ""
    try:
        refuse_foreign_folder(Path(out))  # before the training, not at its first checkpoint
        refuse_foreign_checkpoint(Path(t.checkpoint) if t.checkpoint else checkpoint_folder(out))
        loss_cfg = LossConfig(t.loss or "ce", t.alpha, t.kl_temperature, t.clip, t.gamma, t.greedy_chain)
        if t.greedy_chain and plain_method_for(work.method).kind != "block":
            raise ValueError(f"--greedy-chain trains DFlash blocks; {work.method} drafters learn a chain of their own drafts")
        # auto: bf16 on a GPU, where the trainer runs under bf16 autocast anyway: the frozen target takes half
        # the memory (16 GB, not 32, at 8B) and its features and teacher come from the residual stream a bf16
        # server has; float32 on a CPU, where the trainer runs in float32
        tgt = load_target(work.target, device=_device(work.device, rank, world), dtype="auto")
        setup_distributed(tgt.device)
        sequences = load_sequences(work.data, tgt, work.max_len, work.limit)
        cfg = TrainConfig(method=work.method, out=out, init=work.init, epochs=t.epochs, steps=t.steps, lr=t.lr,
                          warmup_steps=t.warmup_steps, batch_tokens=t.batch_tokens, blocks_per_seq=t.blocks_per_seq,
                          ttt_length=t.ttt_length, layers=d.layers or 1, block_size=d.block_size,
                          steps_chain=work.chain_steps, length_head=bool(d.length_head),
                          init_from_target=d.init_from_target, save_every=t.save_every, eval_every=t.eval_every,
                          seed=work.seed, resume=work.job.resume, checkpoint=t.checkpoint,
                          max_minutes=work.job.max_minutes,
                          schedule_minutes=t.schedule_minutes, memo_gb=t.feature_memo_gb, loss=loss_cfg)
        if work.init and d.init_from_target:
            raise ValueError("--init-from-target starts a new drafter from the target; --init continues an existing one")
        vocab = None
        if d.draft_vocab is not None:
            vocab = frequent_tokens([s.ids[s.response_start:] for s in sequences], d.draft_vocab,
                                    tgt.model.cfg.vocab_size, always=tgt.eos_ids)
        deepen = d.layers if work.init and work.deepen else None
        trainer = Trainer(cfg, tgt, build_drafter(cfg, tgt, vocab, deepen))
        prompts = _eval_prompts(work.eval_data, work.data[0], tgt, t.eval_prompts) if t.eval_prompts else []
    except (DrafterError, TrainDataError, ValueError, FileNotFoundError) as err:
        fail(str(err))
    return trainer, tgt, sequences, prompts


def _record_final(run: RecordedRun, trainer: Any, final: dict[str, Any], work: DraftTraining) -> None:
    evals = {k: v for k, v in final.items() if k.startswith("eval_")}
    if evals:
        run.metrics(evals, step=trainer.state.step, job="train")
    run.log.add_checkpoint(run.id, work.job.out, kind=work.method, step=trainer.state.step,
                           metrics={"eval_tau": final.get("eval_tau")})


def _summary(run: RecordedRun, trainer: Any, before: dict[str, Any], final: dict[str, Any],
             work: DraftTraining) -> None:
    from adaflash.train.loop import best_folder

    summary = {"run": run.id, "steps": trainer.state.step, "checkpoint": str(trainer.checkpoint), "loss": final.get("loss"),
               "eval_tau_before": before.get("eval_tau"), "eval_tau_after": final.get("eval_tau"),
               "tokens_per_s": final.get("tokens_per_s")}
    if "peak_memory_gib" in final:
        summary["peak_memory_gib"] = final["peak_memory_gib"]
    if trainer.state.best_step:
        best = str(best_folder(work.job.out))
        run.log.add_checkpoint(run.id, best, kind=work.method, step=trainer.state.best_step,
                               metrics={"eval_tau": trainer.state.best_eval_tau})
        summary.update(best=best, best_step=trainer.state.best_step, best_eval_tau=trainer.state.best_eval_tau)
    click.echo(json.dumps(summary))


def steps_in_budget(step: int, total: int, first_step: int, elapsed_s: float, max_minutes: float) -> int:
    """The step a time-budgeted run will stop at, at its pace so far (never past `total`)."""
    done = step - first_step
    if done <= 0 or elapsed_s <= 0:
        return total
    return max(step, min(total, first_step + round(done * max_minutes * 60 / elapsed_s)))


def fit_head(ctx: click.Context, *, target: str, device: str, draft: str, data: tuple[str, ...],
             eval_data: str | None, limit: int | None, max_len: int, train: TrainOptions, seed: int, out: str) -> None:
    """`train length-head`: fit the head on the frozen drafter, save it, compare verified length policies."""
    steps, lr, batch_tokens, blocks_per_seq = train.steps or 200, train.lr, train.batch_tokens, train.blocks_per_seq
    eval_prompts, eval_max_new_tokens = train.eval_prompts, train.eval_max_new_tokens
    from adaflash.models.drafter_io import DrafterError, load_drafter, refuse_foreign_folder, save_drafter
    from adaflash.models.drafters import DFlashDrafter
    from adaflash.models.loading import load_target
    from adaflash.train.data import TrainDataError, load_sequences
    from adaflash.train.length_head import compare_lengths, fit_length_head

    try:
        refuse_foreign_folder(Path(out))  # before the fit, not at its end
        tgt = load_target(target, device=_device(device, 0, 1), dtype="float32")
        drafter = load_drafter(draft, tgt.model.cfg)
        if not isinstance(drafter, DFlashDrafter):
            fail(f"{draft} is a {drafter.method} drafter; the length head sits on DFlash drafters")
        sequences = load_sequences(data, tgt, max_len, limit)
        prompts = _eval_prompts(eval_data, data[0], tgt, eval_prompts) if eval_prompts else []
    except (DrafterError, TrainDataError, ValueError, FileNotFoundError) as err:
        fail(str(err))
    log = runlog_of(ctx)
    with recorded_run(log, "train", name="length-head", method=ADAFLASH, target=target, draft=out,
                      dataset=",".join(data)) as run, _progress("length head") as progress:
        task = progress.add_task("length head", total=steps, info="")

        def on_step(step: int, total: int, stats: dict[str, float]) -> None:
            progress.update(task, completed=step, info=f"mse {stats['loss_length_head']:.4f}")
            run.metrics({k: v for k, v in stats.items() if "length_head" in k}, step=step, job="length-head")

        stats = fit_length_head(drafter, tgt, sequences, steps=steps, batch_tokens=batch_tokens,
                                blocks_per_seq=blocks_per_seq, lr=lr, seed=seed, on_step=on_step)
        save_drafter(drafter, out, {"target": target, "num_target_layers": tgt.model.cfg.num_hidden_layers,
                                    "init": draft, "length_head_mae_tokens": stats.get("length_head_mae_tokens")})
        log.add_checkpoint(run.id, out, kind=ADAFLASH, step=steps, metrics=stats)
        rows = compare_lengths(tgt, drafter, prompts, max_new_tokens=eval_max_new_tokens) if prompts else []
        for row in rows:
            run.metrics({f"{row['policy']}:{k}": v for k, v in row.items() if k != "policy"})
    click.echo(f"length head MAE {stats.get('length_head_mae_tokens', float('nan')):.2f} tokens "
               f"(MSE {stats.get('loss_length_head', float('nan')):.4f}); saved to {out}")
    if rows:
        emit_rows(rows, ["policy", "eval_tau", "eval_tok_s", "eval_seconds"], "table", title="Verified length policy")


def _progress(description: str, enabled: bool = True):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False, disable=not enabled)


def _eval_prompts(eval_data: str | None, data: str, target, count: int) -> list[str]:
    """Exact prompt strings for evaluation τ: --eval-data rows (held out), else the first training rows.

    Regenerated rows carry the exact `prompt_text` the engine saw; other rows are rendered. Rows with a
    `domain` (the suite) are taken in turn from each domain, so τ speaks for all of them.
    """
    from itertools import chain, zip_longest

    from adaflash.data.io import read_jsonl
    from adaflash.data.prompts import row_to_prompt

    groups: dict[str | None, list[str]] = {}
    for where, row in read_jsonl(eval_data or data):
        domain = row.get("domain") if isinstance(row.get("domain"), str) else None
        group = groups.setdefault(domain, [])
        if len(group) >= count:
            continue
        if isinstance(row.get("prompt_text"), str):
            group.append(row["prompt_text"])
        else:
            group.append(target.render(row_to_prompt(row, where).prompt))
        if domain is None and len(groups) == 1 and len(group) >= count:
            break
    turns = chain.from_iterable(zip_longest(*groups.values()))
    return [p for p in turns if p is not None][:count]


def _sigterm_interrupts() -> None:
    """SIGTERM (a supervisor stopping the job) unwinds like Ctrl-C, so the run is marked and saved."""
    import signal

    def interrupt(_signum, _frame) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _device(device: str, rank: int, world: int) -> str:
    import os

    import torch

    if device == "auto":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if torch.cuda.is_available() else "cpu"
    return device


def _train_steps(run: RecordedRun | None, trainer: Any, tgt: Any, sequences: Any, prompts: Any, method: str,
                 resume: bool, rank: int, max_minutes: float | None,
                 profile: tuple[str | None, int, int]) -> tuple[dict, dict]:
    """(eval before, final stats) of the training loop; a stop saves the work (`--resume` continues) and is
    recorded with its step, a failure with its error (`run` is None on ranks other than 0)."""
    from adaflash.train.profiling import StepProfiler

    before = trainer.evaluate(prompts) if prompts and rank == 0 and not resume else {}
    if run and before:
        run.metrics({"eval_tau_init": before["eval_tau"]}, step=0)
    profile_dir, profile_steps, profile_after = profile
    try:
        with _progress("train", enabled=rank == 0) as progress:
            task = progress.add_task(f"train {method}", total=None, info="")
            started, first_step = time.perf_counter(), trainer.state.step

            def on_step(step: int, total: int, stats: dict[str, float]) -> None:
                if max_minutes:  # the budget, not --steps, ends such a run: the bar shows where it will stop
                    total = steps_in_budget(step, total, first_step, time.perf_counter() - started, max_minutes)
                progress.update(task, completed=step, total=total,
                                info=f"loss {stats.get('loss', 0):.3f} acc_len {stats.get('block_accept_len', 0):.2f}")
                if run:
                    run.metrics(stats, step=step, job="train")

            profiler = StepProfiler(Path(profile_dir), steps=profile_steps, start=profile_after,
                                    on_cuda=tgt.device.type == "cuda") if profile_dir and rank == 0 else None
            final = trainer.run(sequences, eval_prompts=prompts, on_step=on_step, profiler=profiler)
            if profiler and profiler.table:
                click.echo(f"profile of {profiler.recorded} steps: {profiler.table}", err=True)
    except KeyboardInterrupt:
        if rank == 0 and trainer.state.step:
            trainer.save()  # stopping keeps the work: `--resume` continues from here
        if run:
            run.finish("stopped", note=f"stopped at step {trainer.state.step}")
        raise SystemExit(130) from None
    except (RuntimeError, ValueError, FileNotFoundError) as err:
        if run:
            run.finish("failed", note=str(err))
        fail(str(err))
    return before, final
