"""`adaflash eval`: compare methods offline through the embedded engine, recorded in the run log."""

from __future__ import annotations

from typing import Any

import click

from adaflash.cli.common import emit_rows, fail, note_builtin_drafter, recorded_run, runlog_of, workspace_of
from adaflash.cli.groups import Output, use, uses
from adaflash.engine.config import EngineConfig
from adaflash.methods import VANILLA, method_of
from adaflash.options import BenchConfig, InputConfig, ModelConfig, SamplingConfig

COLUMNS = ["method", "accept_length", "accept_rate", "output_throughput", "speedup", "median_tpot_ms",
           "mean_e2e_latency_ms", "completed"]


@click.command("eval")
@uses(use(ModelConfig, skip=("draft",)), use(InputConfig, only=("dataset", "num_prompts")),
      use(SamplingConfig, only=("max_new_tokens", "temperature", "top_p", "chat", "seed")), EngineConfig,
      use(BenchConfig, only=("label",)), Output(("table", "json", "csv", "markdown")), command="eval")
@click.pass_context
def evaluate(ctx: click.Context, model: ModelConfig, inputs: InputConfig, sampling: SamplingConfig,
             engine: EngineConfig, bench: BenchConfig, output: str) -> None:
    """Measure τ and throughput of each method on the same prompts, offline (one run, same hardware).

    Give --method once per method: METHOD or METHOD=DRAFT_DIR, e.g. --method vanilla --method dflash=out/dflash.
    """
    chosen = _parse_methods(model)
    engine = engine.replace(seed=sampling.seed or 0)
    path, tgt, prompts = _prompts(ctx, model, inputs, sampling.chat)
    config = {"methods": list(model.method), "num_prompts": len(prompts), "batch_size": engine.max_batch,
              "max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
              "top_p": sampling.top_p, "engine": "embedded-offline", "engine_config": engine.to_json()}
    log = runlog_of(ctx)
    from adaflash.models.drafter_io import DrafterError

    with recorded_run(log, "bench", expected=(DrafterError, ValueError, RuntimeError), name=bench.label or "eval",
                      target=model.target, dataset=path.stem, config=config) as run:
        base = {"target": model.target, "dataset": path.stem, "label": bench.label, "backend": "embedded-offline"}
        results = [_measure(log, run.id, tgt, method, draft, engine, prompts, sampling, base) for method, draft in chosen]
    speed = next((r["output_throughput"] for r in results if r["method"] == VANILLA), None)
    for r in results:
        r["speedup"] = r["output_throughput"] / speed if speed else None
    emit_rows(results, COLUMNS, output,
              title=f"{path.stem}: {len(prompts)} prompts, batch {engine.max_batch} ({run.id})")


def _parse_methods(model: ModelConfig) -> list[tuple[str, str | None]]:
    """(method, drafter) per --method, checked before anything loads: each method once, and a drafter for
    each that needs one (given after `=`, or the target's built-in one)."""
    from adaflash.engine.build import drafter_for

    if not model.method:
        fail("--method is required: METHOD or METHOD=DRAFT_DIR, once per method")
    out: list[tuple[str, str | None]] = []
    for method, draft in model.methods:
        if method in (m for m, _ in out):
            fail(f"--method {method} is given twice: each method once (a speed-up is against the one Vanilla row)")
        if draft and not method_of(method).needs_drafter:
            fail(f"--method {method}={draft}: vanilla runs without a drafter")
        try:
            out.append((method, drafter_for(method, draft, model.target or "", ask=f"--method {method}=DIR")))
        except ValueError as err:
            fail(str(err))
        if out[-1][1] and not draft:
            note_builtin_drafter(f"--method {method} runs", out[-1][1], f"--method {method}=DIR")
    return out


def _prompts(ctx: click.Context, model: ModelConfig, inputs: InputConfig, chat: bool) -> tuple[Any, Any, list[str]]:
    """(the dataset's file, the loaded target, the rendered prompts)."""
    from adaflash.data.prompts import PromptFileError, prompt_source, read_prompt_file
    from adaflash.models.loading import load_target

    if not inputs.dataset:
        fail("--dataset is required: a prepared name (gsm8k -> <workspace>/data/gsm8k_test.jsonl) or a JSONL file")
    try:
        path = prompt_source(inputs.dataset, workspace_of(ctx), "test")
    except PromptFileError as err:
        fail(f"--dataset {err}")
    try:
        rows = read_prompt_file(path, inputs.num_prompts)
        tgt = load_target(model.target, device=model.device, dtype=model.dtype)
    except (PromptFileError, FileNotFoundError, ValueError) as err:
        fail(str(err))
    return path, tgt, [tgt.render(r.prompt, chat=chat) for r in rows]


def _measure(log: Any, run_id: str, tgt: Any, method: str, draft: str | None, config: EngineConfig, prompts: list[str],
             sampling: SamplingConfig, base: dict[str, Any]) -> dict[str, Any]:
    """One method's row: measured, recorded, said on stderr."""
    from adaflash.engine.build import build_engine
    from adaflash.engine.measure import measure

    engine = build_engine(tgt, method, draft, config=config)
    metrics, _ = measure(engine, prompts, max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                         top_p=sampling.top_p)
    record = {**metrics, **base, "method": method, "draft": draft, "hardware": str(engine.device)}
    log.add_bench_result(run_id, record)
    click.echo(f"{method}: τ={metrics['accept_length']:.2f} {metrics['output_throughput']:.1f} tok/s", err=True)
    return record
