"""`adaflash train promote`: a held-out, same-run comparison decides whether a drafter replaces another."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from adaflash.cli.common import emit_rows, recorded_run, runlog_of
from adaflash.options import ModelConfig, TrainOptions

COLUMNS = ["domain", "prompts", "tau_candidate", "tau_incumbent", "gain"]


def promote(ctx: click.Context, *, candidate: str, incumbent: str, model: ModelConfig, dataset: str, per_domain: int,
            max_new_tokens: int, batch: int, train: TrainOptions, dry_run: bool) -> None:
    import torch

    from adaflash.data.prompts import PromptFileError
    from adaflash.models.drafter_io import DrafterError
    from adaflash.models.loading import load_target
    from adaflash.train import promote as rule

    if Path(candidate).resolve() == Path(incumbent).resolve():
        raise click.BadParameter("CANDIDATE and --over are the same drafter", param_hint="--over")
    config = {"candidate": candidate, "incumbent": incumbent, "per_domain": per_domain,
              "max_new_tokens": max_new_tokens, "batch_size": batch, "min_gain": train.min_gain,
              "domain_slack": train.domain_slack, "dry_run": dry_run}
    with recorded_run(runlog_of(ctx), "train", expected=(DrafterError, PromptFileError, ValueError, FileNotFoundError),
                      name="promote", target=model.target, draft=candidate, dataset=Path(dataset).stem,
                      config=config) as run:
        target = load_target(model.target or "", device=model.device)
        prompts = held_out_prompts(dataset, target, per_domain)
        domains = rule.compare(target, candidate, incumbent, prompts, max_new_tokens=max_new_tokens, batch=batch)
        verdict = rule.decide(domains, min_gain=train.min_gain, domain_slack=train.domain_slack)
        for d in domains:
            run.metrics({f"tau_candidate/{d.domain}": d.candidate, f"tau_incumbent/{d.domain}": d.incumbent})
        run.metrics({"tau_candidate": verdict.candidate, "tau_incumbent": verdict.incumbent,
                     "promoted": float(verdict.promote and not dry_run)})
        rows = [{"domain": d.domain, "prompts": d.prompts, "tau_candidate": round(d.candidate, 3),
                 "tau_incumbent": round(d.incumbent, 3), "gain": round(d.gain, 3)} for d in domains]
        emit_rows(rows, COLUMNS, "table", title=f"{Path(candidate).name} against {Path(incumbent).name} ({run.id})")
        if verdict.promote and not dry_run:
            dtype = getattr(torch, model.dtype) if model.dtype else weights_dtype(incumbent)
            rule.install(candidate, incumbent, dtype)
            run.log.add_checkpoint(run.id, incumbent, kind="promoted", metrics={"tau": verdict.candidate})
        said = "promoted" if verdict.promote and not dry_run else "would promote" if verdict.promote else "kept"
        run.finish("finished", f"{said}: {verdict.reason}")
    click.echo(f"{said} {candidate} -> {incumbent}: {verdict.reason}" if verdict.promote
               else f"kept {incumbent}: {verdict.reason}")
    if not verdict.promote:
        sys.exit(1)


def held_out_prompts(dataset: str, target, per_domain: int) -> dict[str, list[str]]:
    """Up to `per_domain` exact prompt strings of each domain, in the file's order (rows without one: "all")."""
    from adaflash.data.prompts import read_prompt_file

    groups: dict[str, list[str]] = {}
    for row in read_prompt_file(dataset):
        group = groups.setdefault(row.domain or "all", [])
        if len(group) < per_domain:
            group.append(target.render(row.prompt))
    return groups


def weights_dtype(folder: str):
    """The floating dtype of a drafter's stored weights (None: it holds none): a promotion keeps it."""
    import torch
    from safetensors import safe_open

    floating = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as handle:
        stored = [handle.get_slice(key).get_dtype() for key in list(handle.keys())]
    return next((floating[d] for d in stored if d in floating), None)
