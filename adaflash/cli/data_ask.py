"""`adaflash data ask`'s work: held-out prompts gathered, the target asked page by page, rows written once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click

from adaflash.cli.common import recorded_run, runlog_of, workspace_of
from adaflash.cli.resolve import prompts_path
from adaflash.options import ModelConfig, SamplingConfig

STOP = "\n\n"  # a page's list ends at its first blank line


@dataclass(frozen=True)
class AskWork:
    model: ModelConfig
    method: str
    draft: str | None
    count: int
    sampling: SamplingConfig
    batch: int
    out: str
    held_out: str | None
    quiet: bool


def held_out_files(ctx: click.Context, spec: str | None) -> list[Path]:
    """--held-out's files; by default the prepared suite's test split if there is one."""
    if spec is None:
        suite = Path(workspace_of(ctx)) / "data" / "suite_test.jsonl"
        return [suite] if suite.is_file() else []
    return [Path(prompts_path(ctx, name, "test", "--held-out") or "")
            for name in (part.strip() for part in spec.split(",")) if name]


def run_ask(ctx: click.Context, work: AskWork) -> None:
    from adaflash.data.ask import ask, prompt_texts
    from adaflash.data.io import read_jsonl, write_jsonl_atomic
    from adaflash.engine.build import build_engine
    from adaflash.engine.config import EngineConfig
    from adaflash.engine.params import Request, SamplingParams
    from adaflash.models.drafter_io import DrafterError

    files = held_out_files(ctx, work.held_out)
    held = [text for path in files for text in prompt_texts(row for _, row in read_jsonl(path))]
    s = work.sampling
    config = {"command": "ask", "out": work.out, "count": work.count, "temperature": s.temperature, "top_p": s.top_p,
              "max_new_tokens": s.max_new_tokens, "seed": s.seed, "held_out": [str(p) for p in files]}
    with recorded_run(runlog_of(ctx), "data", expected=(OSError, ValueError, DrafterError), name="ask",
                      target=work.model.target, method=work.method,
                      run_dir=str(Path(work.out).expanduser().resolve().parent), config=config) as run:
        engine = build_engine(work.model.target or "", work.method, work.draft, device=work.model.device,
                              dtype=work.model.dtype, config=EngineConfig(max_batch=work.batch, max_len=1024))
        target = engine.target

        def complete(pages: list[tuple[str, int]]) -> list[str]:
            params = [SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                     stop=[STOP], seed=seed) for _, seed in pages]
            requests = [Request(target.encode(text), p, prompt_text=text) for (text, _), p in zip(pages, params)]
            return [o.text for o in engine.generate(requests)]

        def progress(so_far) -> None:
            if not work.quiet:
                click.echo(f"  {so_far.pages} pages: {len(so_far.rows)} prompts kept", err=True)

        asked = ask(complete, work.count, seed=s.seed or 0, held_out=held, batch=max(work.batch, 16),
                    on_page=progress)
        path = write_jsonl_atomic(work.out, asked.rows)
        summary = {"run": run.id, "out": str(path), "prompts": len(asked.rows), "pages": asked.pages,
                   "items": asked.items, "unusable": asked.unusable, "repeats": asked.repeats,
                   "held_out_matches": asked.held_out, "held_out_prompts": len(held)}
        run.metrics({k: v for k, v in summary.items() if isinstance(v, int)})
        run.finish(note=f"{len(asked.rows)} prompts from {asked.pages} pages -> {path}")
    if work.quiet:
        click.echo(json.dumps(summary))
        return
    click.echo(f"{len(asked.rows)} prompts from {asked.pages} pages -> {path}")
    click.echo(f"  of {asked.items} items: {asked.unusable} unusable, {asked.repeats} repeats, {asked.held_out} "
               f"equal to one of {len(held)} held-out prompts")
    if len(asked.rows) < work.count:
        click.echo(f"  fewer than the {work.count} asked for: the target repeated itself for {asked.pages} pages "
                   "(try another --seed or a higher --temperature)")
