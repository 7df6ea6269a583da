"""`adaflash generate`: answer prompts with the target, through the embedded engine."""

from __future__ import annotations

import json
import sys
import time

import click

from adaflash.cli.common import DTYPE_HELP, chosen_drafter, fail, recorded_run, runlog_of
from adaflash.cli.engine_options import engine_options
from adaflash.engine.config import EngineConfig
from adaflash.methods import METHOD_NAMES, VANILLA


@click.command()
@click.option("--target", default="smollm2-135m", show_default=True, help="Built-in name, HF id or local folder.")
@click.option("--prompt", "prompts", multiple=True, help="A prompt (repeatable).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help='JSONL: {"prompt": ...} or a normalized row with "conversations" per line.')
@click.option("--limit", type=int, default=None, help="Read at most this many prompts from --prompts.")
@click.option("--method", type=click.Choice(METHOD_NAMES), default=VANILLA, show_default=True)
@click.option("--draft", default=None, metavar="DIR|NAME",
              help="Drafter folder or built-in drafter's name (methods other than vanilla; dflash and adaflash "
                   "default to the target's built-in drafter for each: `adaflash draft builtins`).")
@click.option("--max-new-tokens", type=click.IntRange(1, 32768), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(0.0), default=0.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=int, default=-1, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the chat template.")
@click.option("--batch-size", type=click.IntRange(1, 1024), default=16, show_default=True)
@engine_options()
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--dtype", default="bf16-if-native", show_default=True, help=DTYPE_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per prompt.")
@click.pass_context
def generate(ctx: click.Context, target: str, prompts: tuple[str, ...], prompts_file: str | None, limit: int | None,
             method: str, draft: str | None, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
             stop: tuple[str, ...], chat: bool, batch_size: int, engine_cfg: EngineConfig, device: str, dtype: str,
             as_json: bool) -> None:
    """Generate with a target (and a drafter) through the embedded engine."""
    from adaflash.data.prompts import PromptFileError, PromptRow, read_prompt_file
    from adaflash.engine.build import build_engine
    from adaflash.engine.params import Request, SamplingParams
    from adaflash.models.drafter_io import DrafterError

    rows = [PromptRow(f"prompt-{i}", p) for i, p in enumerate(prompts)]
    try:
        draft = chosen_drafter(method, draft, target)
        if prompts_file:
            rows += read_prompt_file(prompts_file, limit)
    except (PromptFileError, ValueError) as err:
        fail(str(err))
    if not rows:
        fail("give --prompt TEXT or --prompts FILE.jsonl")
    try:
        engine = build_engine(target, method, draft, config=engine_cfg.replace(max_batch=batch_size), device=device,
                              dtype=dtype)
    except (DrafterError, ValueError, FileNotFoundError, OSError) as err:
        fail(str(err))
    tgt = engine.target
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            stop=list(stop))
    requests = []
    for row in rows:
        text = tgt.render(row.prompt, chat=chat)
        requests.append(Request(tgt.encode(text), params, prompt_text=text, rid=row.id))
    log = runlog_of(ctx)
    config = {"max_new_tokens": max_new_tokens, "temperature": temperature, "prompts": len(rows), "chat": chat,
              "device": str(engine.device), "engine_config": engine.config.to_json()}
    from adaflash.serve.stream_text import shown_text

    stream = not as_json and len(requests) == 1
    printed = [0]

    def on_event(event) -> None:
        if stream:
            seq = next(iter(engine.active.values()), None)
            ids = seq.output_ids if seq is not None else (event.output.output_ids if event.output else [])
            # Until the end, print nothing a stop string may take back (it can span tokens).
            text = event.output.text if event.output else shown_text(tgt.decode(ids), list(stop))
            sys.stdout.write(text[printed[0]:])
            sys.stdout.flush()
            printed[0] = len(text)

    with recorded_run(log, "generate", expected=(ValueError, RuntimeError), method=method, target=target, draft=draft,
                      config=config) as run:
        started = time.perf_counter()
        outputs = engine.generate(requests, on_event=on_event)
        elapsed = time.perf_counter() - started
        tokens = sum(o.meta_info["completion_tokens"] for o in outputs)
        verify = sum(o.meta_info["spec_verify_ct"] for o in outputs)
        summary = {"completion_tokens": tokens, "output_throughput": tokens / elapsed,
                   "accept_length": tokens / max(verify, 1), "duration": elapsed, "requests": len(outputs)}
        run.metrics(summary)
    run_id = run.id
    if as_json:
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
    click.secho(f"[{run_id}] {tokens} tokens in {elapsed:.2f}s ({tokens / elapsed:.1f} tok/s, τ={summary['accept_length']:.2f})",
                fg="bright_black", err=True)
