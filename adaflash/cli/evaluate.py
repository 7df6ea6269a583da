"""`adaflash eval`: compare methods offline through the embedded engine, recorded in the run log."""

from __future__ import annotations

import click

from adaflash.cli.common import (
    DTYPE_HELP,
    emit_rows,
    fail,
    note_builtin_drafter,
    recorded_run,
    runlog_of,
    workspace_of,
)
from adaflash.cli.engine_options import engine_options
from adaflash.engine.config import EngineConfig
from adaflash.methods import VANILLA, method_of


def _parse_methods(specs: tuple[str, ...], target: str) -> list[tuple[str, str | None]]:
    """(method, drafter) per --method, checked before anything loads: known methods, each once, and a
    drafter for each that needs one (given after `=`, or the target's built-in one)."""
    from adaflash.engine.build import drafter_for

    out: list[tuple[str, str | None]] = []
    for spec in specs:
        method, _, draft = (part.strip() for part in spec.partition("="))
        if method in (m for m, _ in out):
            fail(f"--method {method} is given twice: each method once (a speed-up is against the one Vanilla row)")
        try:
            out.append((method, drafter_for(method, draft or None, target, ask=f"--method {method}=DIR")))
        except ValueError as err:
            fail(str(err))
        if out[-1][1] and not draft:
            note_builtin_drafter(f"--method {method} runs", out[-1][1], f"--method {method}=DIR")
        if draft and not method_of(method).needs_drafter:
            fail(f"--method {spec}: vanilla runs without a drafter")
    return out


@click.command("eval")
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--method", "methods", multiple=True, required=True,
              help="METHOD or METHOD=DRAFT_DIR (repeatable), e.g. --method vanilla --method dflash=out/dflash.")
@click.option("--dataset", required=True, help="Prepared name (gsm8k → <workspace>/data/gsm8k_test.jsonl) or a JSONL file.")
@click.option("--num-prompts", type=click.IntRange(1), default=32, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True, help="Concurrency inside the engine.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True)
@click.option("--chat/--no-chat", default=True, show_default=True)
@engine_options()
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", default="bf16-if-native", show_default=True, help=DTYPE_HELP)
@click.option("--label", default=None)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown"]), default="table", show_default=True)
@click.pass_context
def evaluate(ctx: click.Context, target, methods, dataset, num_prompts, batch_size, max_new_tokens, temperature, chat,
             engine_cfg: EngineConfig, device, dtype, label, fmt) -> None:
    """Measure τ and throughput of each method on the same prompts, offline (one run, same hardware)."""

    from adaflash.data.prompts import PromptFileError, prompt_source, read_prompt_file
    from adaflash.engine.build import build_engine
    from adaflash.engine.measure import measure
    from adaflash.models.drafter_io import DrafterError
    from adaflash.models.loading import load_target

    chosen = _parse_methods(methods, target)
    engine_cfg = engine_cfg.replace(max_batch=batch_size)
    try:
        path = prompt_source(dataset, workspace_of(ctx), "test")
    except PromptFileError as err:
        fail(f"--dataset {err}")
    try:
        rows = read_prompt_file(path, num_prompts)
        tgt = load_target(target, device=device, dtype=dtype)
    except (PromptFileError, FileNotFoundError, ValueError) as err:
        fail(str(err))
    prompts = [tgt.render(r.prompt, chat=chat) for r in rows]
    log = runlog_of(ctx)
    config = {"methods": list(methods), "num_prompts": len(prompts), "batch_size": batch_size,
              "max_new_tokens": max_new_tokens, "temperature": temperature, "engine": "embedded-offline",
              "engine_config": engine_cfg.to_json()}
    results = []
    with recorded_run(log, "bench", expected=(DrafterError, ValueError, RuntimeError), name=label or "eval",
                      target=target, dataset=path.stem, config=config) as run:
        for method, draft in chosen:
            engine = build_engine(tgt, method, draft, config=engine_cfg)
            metrics, _ = measure(engine, prompts, max_new_tokens=max_new_tokens, temperature=temperature)
            record = {**metrics, "method": method, "draft": draft, "target": target, "dataset": path.stem,
                      "label": label, "hardware": str(engine.device), "backend": "embedded-offline"}
            log.add_bench_result(run.id, record)
            results.append(record)
            click.echo(f"{method}: τ={metrics['accept_length']:.2f} {metrics['output_throughput']:.1f} tok/s", err=True)
    run_id = run.id
    base = next((r["output_throughput"] for r in results if r["method"] == VANILLA), None)
    for r in results:
        r["speedup"] = r["output_throughput"] / base if base else None
    emit_rows(results, ["method", "accept_length", "accept_rate", "output_throughput", "speedup", "median_tpot_ms",
                        "mean_e2e_latency_ms", "completed"], fmt, title=f"{path.stem}: {len(prompts)} prompts, batch {batch_size} ({run_id})")
