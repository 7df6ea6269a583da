"""`adaflash train`: offline drafter training and the length head's offline initialization."""

from __future__ import annotations

import click

from adaflash.cli.common import drafter_folder, fail
from adaflash.cli.groups import given, use, uses
from adaflash.cli.resolve import prompts_path, required
from adaflash.cli.train_run import steps_in_budget  # noqa: F401  (where tests and callers know it)
from adaflash.engine.config import EngineConfig
from adaflash.methods import DRAFTER_ARCHITECTURES
from adaflash.options import (
    DrafterConfig,
    InputConfig,
    JobConfig,
    ModelConfig,
    ProfileConfig,
    SamplingConfig,
    TrainOptions,
)


@click.group()
def train() -> None:
    """Train drafters offline and initialize the AdaFlash length head."""


TRAIN_INPUTS = use(InputConfig, only=("data", "limit", "eval_data"))
MAX_LEN = use(EngineConfig, only=("max_len",))


@train.command("draft")
@uses(use(ModelConfig, only=("method", "target", "device")), TRAIN_INPUTS,
      use(EngineConfig, only=("max_len", "num_steps")), use(TrainOptions, skip=("eval_max_new_tokens",)),
      use(DrafterConfig, skip=("target_layer_ids", "mask_token_id")), use(SamplingConfig, only=("seed",)),
      use(JobConfig, only=("out", "resume", "max_minutes")), ProfileConfig, command="train draft")
@click.pass_context
def train_draft(ctx: click.Context, model: ModelConfig, inputs: InputConfig, engine: EngineConfig,
                train: TrainOptions, drafter: DrafterConfig, sampling: SamplingConfig, job: JobConfig,
                profile: ProfileConfig) -> None:
    """Train a DFlash, EAGLE-3 or MTP drafter on target-generated data (single process or torchrun).

    --method is the drafter's architecture: [dflash|eagle3|mtp].
    """
    from adaflash.cli.train_run import DraftTraining, run_draft_training

    method = _architecture(model)
    if drafter.layers is not None and drafter.layers > 8:
        fail(f"--layers {drafter.layers}: a drafter has at most 8 layers")
    data = _data(ctx, inputs)
    work = DraftTraining(method=method, target=model.target or "", device=model.device, data=data,
                         eval_data=prompts_path(ctx, inputs.eval_data, "test", "--eval-data"), limit=inputs.limit,
                         max_len=engine.max_len or 512, chain_steps=engine.num_steps or 6, train=train,
                         drafter=drafter, init=drafter_folder("--init", drafter.init), seed=sampling.seed or 0,
                         job=job, profile=profile, deepen=given(ctx, "layers"))
    run_draft_training(ctx, work)


def _architecture(model: ModelConfig) -> str:
    if len(model.method) != 1 or model.methods[0][1] or model.method[0] not in DRAFTER_ARCHITECTURES:
        fail(f"--method is required, once: the drafter's architecture, one of {', '.join(DRAFTER_ARCHITECTURES)}")
    return model.method[0]


def _data(ctx: click.Context, inputs: InputConfig) -> tuple[str, ...]:
    required(inputs.data, "--data", "training rows, or a prepared dataset's name")
    return tuple(prompts_path(ctx, value, "train", "--data") or "" for value in inputs.data)


@train.command("length-head")
@uses(use(ModelConfig, only=("target", "draft", "device"), notes={"draft": "Here: the trained DFlash drafter."}),
      TRAIN_INPUTS, MAX_LEN,
      use(TrainOptions, only=("steps", "lr", "batch_tokens", "blocks_per_seq", "eval_prompts", "eval_max_new_tokens")),
      use(SamplingConfig, only=("seed",)), use(JobConfig, only=("out",)), command="train length-head")
@click.pass_context
def train_length_head(ctx: click.Context, model: ModelConfig, inputs: InputConfig, engine: EngineConfig,
                      train: TrainOptions, sampling: SamplingConfig, job: JobConfig) -> None:
    """Fit the AdaFlash length head on a frozen DFlash drafter; report its error and τ vs fixed lengths."""
    if len(model.draft) != 1:
        fail("--draft is required, once: the trained DFlash drafter (a folder or a built-in drafter's name)")
    required(job.out, "--out", "the drafter folder to write")
    from adaflash.cli.train_run import fit_head

    fit_head(ctx, target=model.target or "", device=model.device, draft=drafter_folder("--draft", model.draft[0]) or "",
             data=_data(ctx, inputs), eval_data=prompts_path(ctx, inputs.eval_data, "test", "--eval-data"),
             limit=inputs.limit, max_len=engine.max_len or 512, train=train, seed=sampling.seed or 0, out=job.out or "")


@train.command("promote")
@click.argument("candidate")
@uses(use(ModelConfig, only=("target", "device", "dtype"), notes={"dtype": "Here: the promoted weights' dtype "
                                                                        "[default: the incumbent's]."}),
      use(InputConfig, only=("dataset", "num_prompts"), notes={"num_prompts": "Here: prompts per domain."}),
      use(SamplingConfig, only=("max_new_tokens",)), use(EngineConfig, only=("max_batch",)),
      use(TrainOptions, only=("incumbent", "min_gain", "domain_slack")), use(JobConfig, only=("dry_run",)),
      command="train promote")
@click.pass_context
def train_promote(ctx: click.Context, candidate: str, model: ModelConfig, inputs: InputConfig,
                  sampling: SamplingConfig, engine: EngineConfig, train: TrainOptions, job: JobConfig) -> None:
    """Replace a drafter (--over) with CANDIDATE only if CANDIDATE drafts better on held-out prompts.

    Both drafters answer the same prompts of --dataset (its test split), domain by domain, in this run; the
    verdict and τ per domain go to the run log. --dry-run compares without replacing. Exit status 1: not
    promoted.
    """
    required(train.incumbent, "--over", "the drafter to replace (a folder or a built-in drafter's name)")
    required(inputs.dataset, "--dataset", "held-out prompts, or a prepared dataset's name (its test split)")
    if model.dtype is not None and model.dtype not in ("bfloat16", "float16", "float32"):
        fail(f"--dtype: a promotion casts to bfloat16, float16 or float32, got {model.dtype!r}")
    from adaflash.cli.train_promote import promote

    promote(ctx, candidate=drafter_folder("CANDIDATE", candidate) or "",
            incumbent=drafter_folder("--over", train.incumbent) or "", model=model,
            dataset=prompts_path(ctx, inputs.dataset, "test", "--dataset") or "", per_domain=inputs.num_prompts,
            max_new_tokens=sampling.max_new_tokens, batch=engine.max_batch, train=train, dry_run=job.dry_run)
