"""`adaflash generate`: answer prompts with the target, through the embedded engine."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from adaflash.cli.common import fail, recorded_run, runlog_of
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import one_model, prompts_path
from adaflash.engine.config import EngineConfig
from adaflash.options import InputConfig, ModelConfig, SamplingConfig


@click.command()
@uses(ModelConfig, use(InputConfig, only=("prompt", "prompts", "limit")), SamplingConfig, EngineConfig,
      Output(("text", "json"), help="text, or json: one JSON object per prompt."), command="generate")
@click.pass_context
def generate(ctx: click.Context, model: ModelConfig, inputs: InputConfig, sampling: SamplingConfig,
             engine: EngineConfig, output: str) -> None:
    """Generate with a target (and a drafter) through the embedded engine."""
    method, draft = one_model(model)
    rows = _rows(ctx, inputs)
    eng = _engine(model, method, draft, engine.replace(seed=sampling.seed or 0))
    requests = _requests(eng, rows, sampling)
    config = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature, "prompts": len(rows),
              "chat": sampling.chat, "device": str(eng.device), "engine_config": eng.config.to_json()}
    stream = output == "text" and len(requests) == 1
    with recorded_run(runlog_of(ctx), "generate", expected=(ValueError, RuntimeError), method=method,
                      target=model.target, draft=draft, config=config) as run:
        started = time.perf_counter()
        outputs = eng.generate(requests, on_event=_streamer(eng, list(sampling.stop)) if stream else None)
        summary = _summary(outputs, time.perf_counter() - started)
        run.metrics(summary)
    _print(outputs, summary, run.id, output, stream)


def _rows(ctx: click.Context, inputs: InputConfig) -> list[Any]:
    from adaflash.data.prompts import PromptFileError, PromptRow, read_prompt_file

    rows = [PromptRow(f"prompt-{i}", p) for i, p in enumerate(inputs.prompt)]
    path = prompts_path(ctx, inputs.prompts, "test", "--prompts")
    try:
        rows += read_prompt_file(path, inputs.limit) if path else []
    except PromptFileError as err:
        fail(str(err))
    if not rows:
        fail("give --prompt TEXT or --prompts FILE.jsonl")
    return rows


def _engine(model: ModelConfig, method: str, draft: str | None, config: EngineConfig) -> Any:
    from adaflash.engine.build import build_engine
    from adaflash.models.drafter_io import DrafterError

    try:
        return build_engine(model.target, method, draft, config=config, device=model.device, dtype=model.dtype)
    except (DrafterError, ValueError, FileNotFoundError, OSError) as err:
        fail(str(err))


def _requests(engine: Any, rows: list[Any], sampling: SamplingConfig) -> list[Any]:
    from adaflash.engine.params import Request, SamplingParams

    params = SamplingParams(max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                            top_p=sampling.top_p, top_k=sampling.top_k, stop=list(sampling.stop))
    tgt = engine.target
    texts = [(row.id, tgt.render(row.prompt, chat=sampling.chat)) for row in rows]
    return [Request(tgt.encode(text), params, prompt_text=text, rid=rid) for rid, text in texts]


def _streamer(engine: Any, stop: list[str]) -> Any:
    """Print one answer as it grows; until the end, nothing a stop string may take back (it can span tokens)."""
    from adaflash.serve.stream_text import shown_text

    printed = [0]

    def on_event(event: Any) -> None:
        seq = next(iter(engine.active.values()), None)
        ids = seq.output_ids if seq is not None else (event.output.output_ids if event.output else [])
        text = event.output.text if event.output else shown_text(engine.target.decode(ids), stop)
        sys.stdout.write(text[printed[0]:])
        sys.stdout.flush()
        printed[0] = len(text)

    return on_event


def _summary(outputs: list[Any], elapsed: float) -> dict[str, Any]:
    tokens = sum(o.meta_info["completion_tokens"] for o in outputs)
    verify = sum(o.meta_info["spec_verify_ct"] for o in outputs)
    return {"completion_tokens": tokens, "output_throughput": tokens / elapsed,
            "accept_length": tokens / max(verify, 1), "duration": elapsed, "requests": len(outputs)}


def _print(outputs: list[Any], summary: dict[str, Any], run_id: str, output: str, stream: bool) -> None:
    if output == "json":
        for out in outputs:
            click.echo(json.dumps(out.to_json()))
        return
    if stream:
        click.echo()
        sys.stdout.flush()
    else:
        for out in outputs:
            click.secho(f"--- {out.rid}", fg="cyan")
            click.echo(out.text)
    tokens, elapsed = summary["completion_tokens"], summary["duration"]
    click.secho(f"[{run_id}] {tokens} tokens in {elapsed:.2f}s ({tokens / elapsed:.1f} tok/s, "
                f"τ={summary['accept_length']:.2f})", fg="bright_black", err=True)
