"""`adaflash train`: offline drafter training and the length head's offline initialization."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import (
    RecordedRun,
    drafter_folder,
    emit_rows,
    fail,
    prompt_file,
    recorded_run,
    runlog_of,
)
from adaflash.methods import ADAFLASH, DRAFTER_ARCHITECTURES, plain_method_for


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


def steps_in_budget(step: int, total: int, first_step: int, elapsed_s: float, max_minutes: float) -> int:
    """The step a time-budgeted run will stop at, at its pace so far (never past `total`)."""
    done = step - first_step
    if done <= 0 or elapsed_s <= 0:
        return total
    return max(step, min(total, first_step + round(done * max_minutes * 60 / elapsed_s)))


@click.group()
def train() -> None:
    """Train drafters offline and initialize the AdaFlash length head."""


def common_options(func):
    options = [
        click.option("--target", default="smollm2-135m", show_default=True),
        click.option("--data", required=True, multiple=True, callback=prompt_file("train"),
                     help="Training rows (regenerated: prompt_text + response; or normalized conversations), "
                          "or a prepared dataset's name (its train split). Repeat it to train on several files "
                          "(greedy and sampled answers, say) as one corpus."),
        click.option("--out", required=True, type=click.Path(file_okay=False), help="Drafter folder (checkpoints land here)."),
        click.option("--max-len", type=click.IntRange(8), default=512, show_default=True),
        click.option("--batch-tokens", type=click.IntRange(16), default=4096, show_default=True),
        click.option("--limit", type=int, default=None, help="Use at most this many rows."),
        click.option("--eval-data", callback=prompt_file("test"), default=None,
                     help="Held-out rows for evaluation τ, or a prepared dataset's name (its test split)."),
        click.option("--eval-prompts", type=click.IntRange(0), default=8, show_default=True),
        click.option("--device", default="auto", show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@train.command("draft")
@click.option("--method", type=click.Choice(DRAFTER_ARCHITECTURES), required=True)
@common_options
@click.option("--init", callback=lambda _c, _p, v: drafter_folder("--init", v), default=None,
              help="Start from this drafter: a folder or a built-in drafter's name (`adaflash draft builtins`).")
@click.option("--epochs", type=click.IntRange(1), default=1, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=None, help="Stop after this many steps (overrides --epochs).")
@click.option("--lr", type=float, default=3e-4, show_default=True)
@click.option("--warmup-steps", type=click.IntRange(0), default=10, show_default=True)
@click.option("--layers", type=click.IntRange(1, 8), default=1, show_default=True,
              help="A new drafter's depth; given with --init, a DFlash drafter is deepened to it (each new layer "
                   "starts adding nothing, so it drafts as before until trained).")
@click.option("--block-size", type=click.IntRange(2, 64), default=None,
              help="DFlash block (drafted tokens + 1). Default: 16, or the --init drafter's; given with --init, "
                   "the drafter is trained at this block (its weights do not depend on it).")
@click.option("--blocks-per-seq", type=click.IntRange(1), default=16, show_default=True, help="DFlash: anchors per sequence.")
@click.option("--ttt-length", type=click.IntRange(1, 16), default=4, show_default=True, help="EAGLE-3/MTP: unrolled steps.")
@click.option("--chain-steps", type=click.IntRange(1, 32), default=6, show_default=True, help="EAGLE-3/MTP: draft steps at inference.")
@click.option("--length-head/--no-length-head", default=False, show_default=True, help="DFlash: train the length head jointly.")
@click.option("--draft-vocab", type=click.IntRange(16), default=None,
              help="Score only the N most frequent tokens of --data (a draft vocabulary): drafting and training "
                   "cost N/V of the full lm_head. Default: the whole vocabulary, or the --init drafter's; given with "
                   "--init, its vocabulary is chosen anew (no weight depends on it).")
@click.option("--init-from-target/--random-init", default=False, show_default=True,
              help="A new drafter copies the target layers after its deepest feature layer (not with --init).")
@click.option("--loss", type=click.Choice(["ce", "rkl-mix", "fkl"]), default="ce", show_default=True)
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.8, show_default=True)
@click.option("--kl-temperature", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True)
@click.option("--clip", type=click.FloatRange(0, min_open=True), default=0.01, show_default=True)
@click.option("--gamma", type=click.FloatRange(0, min_open=True), default=7.0, show_default=True)
@click.option("--greedy-chain", is_flag=True,
              help="DFlash: each block position learns the target's own greedy token, and only while the row's "
                   "answer took the greedy token at every earlier position of the block: answers sampled at T > 0 "
                   "(`data regenerate --temperature`) then widen the contexts without teaching tokens greedy "
                   "verification would reject.")
@click.option("--save-every", type=click.IntRange(1), default=100, show_default=True)
@click.option("--eval-every", type=click.IntRange(0), default=0, show_default=True,
              help="Evaluate τ every N steps; the best evaluated drafter is kept in OUT-best.")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in --out, bit for bit.")
@click.option("--max-minutes", type=click.FloatRange(0, min_open=True), default=None,
              help="Wall-clock budget of this run: stop, evaluate and save when it runs out. The learning rate's "
                   "cosine ends with it (or at the last step, if that comes first), so the saved drafter is an "
                   "annealed one.")
@click.option("--schedule-minutes", type=click.FloatRange(0, min_open=True), default=None,
              help="The learning rate's cosine spans this many minutes of training, counted over every --resume "
                   "leg [default: up to the end of this run's --max-minutes]: training split over several time "
                   "budgets then follows one schedule (give the total, and each leg's --max-minutes).")
@click.option("--feature-memo-gb", type=click.FloatRange(0), default=None,
              help="Target features kept between epochs, in GB (each later epoch then runs no target pass for "
                   "them) [default: a third of a GPU's free memory, 4 on a CPU]. A corpus larger than it pays a "
                   "target pass for the rest in every epoch: tokens_per_s drops, feature_memo_gb says how full.")
@click.option("--profile", "profile_dir", type=click.Path(file_okay=False), default=None,
              help="Record --profile-steps training steps (after --profile-after) with torch.profiler into this "
                   "folder: train.top.txt (the kernels, or on a CPU the ops, by their own time) and a Chrome trace.")
@click.option("--profile-steps", type=click.IntRange(1), default=8, show_default=True,
              help="Steps --profile records.")
@click.option("--profile-after", type=click.IntRange(0), default=16, show_default=True,
              help="Steps of this run before --profile records: past the first epoch, the target's features come "
                   "from the memo and a step is the drafter's alone.")
@click.pass_context
def train_draft(ctx: click.Context, method, target, data, out, max_len, batch_tokens, limit, eval_data, eval_prompts,
                device, seed, init, epochs, steps, lr, warmup_steps, layers, block_size, blocks_per_seq, ttt_length,
                chain_steps, length_head, draft_vocab, init_from_target, loss, alpha, kl_temperature, clip, gamma, greedy_chain,
                save_every, eval_every,
                resume, max_minutes, schedule_minutes, feature_memo_gb, profile_dir, profile_steps, profile_after) -> None:
    """Train a DFlash, EAGLE-3 or MTP drafter on target-generated data (single process or torchrun)."""
    from adaflash.models.drafter_io import DrafterError, frequent_tokens, refuse_foreign_folder
    from adaflash.models.loading import load_target
    from adaflash.train.data import TrainDataError, load_sequences
    from adaflash.train.loop import (
        TrainConfig,
        Trainer,
        best_folder,
        build_drafter,
        rank_world,
        setup_distributed,
    )
    from adaflash.train.losses import LossConfig

    rank, world = rank_world()
    try:
        deepen = layers if init and ctx.get_parameter_source("layers") is click.core.ParameterSource.COMMANDLINE else None
        refuse_foreign_folder(Path(out))  # before the training, not at its first checkpoint
        loss_cfg = LossConfig(loss, alpha, kl_temperature, clip, gamma, greedy_chain)
        if greedy_chain and plain_method_for(method).kind != "block":
            raise ValueError(f"--greedy-chain trains DFlash blocks; {method} drafters learn a chain of their own drafts")
        tgt = load_target(target, device=_device(device, rank, world), dtype="float32")
        setup_distributed(tgt.device)
        sequences = load_sequences(data, tgt, max_len, limit)
        cfg = TrainConfig(method=method, out=out, init=init, epochs=epochs, steps=steps, lr=lr, warmup_steps=warmup_steps,
                          batch_tokens=batch_tokens, blocks_per_seq=blocks_per_seq, ttt_length=ttt_length, layers=layers,
                          block_size=block_size, steps_chain=chain_steps, length_head=length_head, init_from_target=init_from_target, save_every=save_every,
                          eval_every=eval_every, seed=seed, resume=resume, max_minutes=max_minutes,
                          schedule_minutes=schedule_minutes,
                          memo_gb=feature_memo_gb, loss=loss_cfg)
        if init and init_from_target:
            raise ValueError("--init-from-target starts a new drafter from the target; --init continues an existing one")
        vocab = None
        if draft_vocab is not None:
            vocab = frequent_tokens([s.ids[s.response_start:] for s in sequences], draft_vocab,
                                    tgt.model.cfg.vocab_size, always=tgt.eos_ids)
        trainer = Trainer(cfg, tgt, build_drafter(cfg, tgt, vocab, deepen))
        prompts = _eval_prompts(eval_data, data[0], tgt, eval_prompts) if eval_prompts else []
    except (DrafterError, TrainDataError, ValueError, FileNotFoundError) as err:
        fail(str(err))
    if trainer.drafter.method != method:
        fail(f"--init {init} is a {trainer.drafter.method} drafter, not {method}")
    log = runlog_of(ctx) if rank == 0 else None
    config = {"world_size": world, "sequences": len(sequences), **{k: str(v) for k, v in vars(cfg).items()}}
    recording = (recorded_run(log, "train", method=method, target=target, draft=out, dataset=",".join(data),
                              config=config) if log else contextlib.nullcontext(None))
    _sigterm_interrupts()
    with recording as run:
        before, final = _train_steps(run, trainer, tgt, sequences, prompts, method, resume, rank, max_minutes,
                                     (profile_dir, profile_steps, profile_after))
        if run:
            evals = {k: v for k, v in final.items() if k.startswith("eval_")}
            if evals:
                run.metrics(evals, step=trainer.state.step, job="train")
            log.add_checkpoint(run.id, out, kind=method, step=trainer.state.step,
                               metrics={"eval_tau": final.get("eval_tau")})
    if run:
        run_id = run.id
        summary = {"run": run_id, "steps": trainer.state.step, "loss": final.get("loss"),
                   "eval_tau_before": before.get("eval_tau"), "eval_tau_after": final.get("eval_tau")}
        if trainer.state.best_step:
            best = str(best_folder(out))
            log.add_checkpoint(run_id, best, kind=method, step=trainer.state.best_step,
                               metrics={"eval_tau": trainer.state.best_eval_tau})
            summary.update(best=best, best_step=trainer.state.best_step, best_eval_tau=trainer.state.best_eval_tau)
        click.echo(json.dumps(summary))


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


@train.command("length-head")
@common_options
@click.option("--draft", "draft", required=True, callback=lambda _c, _p, v: drafter_folder("--draft", v),
              help="The trained DFlash drafter: a folder or a built-in drafter's name.")
@click.option("--steps", type=click.IntRange(1), default=200, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--blocks-per-seq", type=click.IntRange(1), default=16, show_default=True)
@click.option("--eval-max-new-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.pass_context
def train_length_head(ctx: click.Context, target, data, out, max_len, batch_tokens, limit, eval_data, eval_prompts, device,
                      seed, draft, steps, lr, blocks_per_seq, eval_max_new_tokens) -> None:
    """Fit the AdaFlash length head on a frozen DFlash drafter; report its error and τ vs fixed lengths."""
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
