"""`adaflash data`: prepare datasets into normalized rows, and regenerate answers with the target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import (
    DTYPE_HELP,
    RecordedRun,
    argv_of,
    chosen_drafter,
    emit_rows,
    fail,
    prompt_file,
    recorded_run,
    runlog_of,
    workspace_of,
    writable_file,
)
from adaflash.data.builtin_datasets import describe_builtins
from adaflash.data.column_map import parse_column_map
from adaflash.data.errors import DatasetError
from adaflash.data.prepare import prepare_dataset
from adaflash.data.resolve import resolve_dataset
from adaflash.methods import METHOD_NAMES, VANILLA


@click.group()
def data() -> None:
    """Prepare datasets into normalized rows, and regenerate answers with the target."""


def refuse_same_file(dataset_file: str, out_file: str) -> None:
    """Writing over the input would lose its rows (and a second run would vary the copies again)."""
    src, dst = Path(dataset_file).expanduser().resolve(), Path(out_file).expanduser().resolve()
    if src == dst:
        fail(f"--out {out_file} is the --dataset file itself: write the result to another file")


@data.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_datasets(as_json: bool) -> None:
    """The built-in datasets and where each offline copy is found."""
    rows = describe_builtins()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    emit_rows(rows, ["name", "found", "description"], "table", title="Built-in datasets")
    click.echo("Any local .jsonl/.json/.parquet file or hub id (owner/name) is accepted too.")


@data.command("prepare", short_help="Normalize a dataset into <name>_train.jsonl and <name>_test.jsonl.")
@click.argument("dataset")
@click.option("--source", type=click.Path(), default=None,
              help="Where the data is: a GSM8K folder, a file for a built-in, or the file when DATASET is a new name.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: <workspace>/data].")
@click.option("--name", default=None, help="Output name: <name>_train.jsonl, <name>_test.jsonl [default: from DATASET].")
@click.option("--split-seed", type=int, default=0, show_default=True, help="Seed of the hash split.")
@click.option("--test-fraction", type=click.FloatRange(0.0, 1.0), default=None,
              help="Share of rows in test [default: 0.1; 1.0 for humaneval and mt-bench; official splits are kept].")
@click.option("--limit", type=click.IntRange(1), default=None,
              help="Keep at most N valid rows (per split when the source has an official split).")
@click.option("--column-map", default=None, metavar="KEY=COL,...",
              help="Columns of a file or hub dataset: prompt=, answer=, id=, reference=, system=, conversations=.")
@click.option("--hub-config", default=None, help="Config (subset) of a hub dataset.")
@click.option("--code-packages", default=None, metavar="NAME,...|none",
              help="suite: installed packages whose documented functions become code prompts [default: "
                   "adaflash's own dependencies (data/code_prompts.py), those installed].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def prepare(ctx: click.Context, dataset: str, source: str | None, out_dir: str | None, name: str | None,
            split_seed: int, test_fraction: float | None, limit: int | None, column_map: str | None,
            hub_config: str | None, code_packages: str | None, as_json: bool) -> None:
    """Write DATASET as normalized rows to <out>/<name>_train.jsonl and <out>/<name>_test.jsonl.

    DATASET is gsm8k, humaneval, mt-bench, sharegpt, a local .jsonl/.json/.parquet file (or a
    folder with train.* and test.* files), or a hub id (owner/name, through `datasets`).

    `suite` builds the multi-domain suite from the offline sources: suite_test.jsonl holds held-out
    prompts per domain (math, code, chat, chat-turn2, open-chat) and suite_train.jsonl a general
    training corpus whose prompts never equal a test prompt.
    """
    if dataset.lower() == "suite":
        if source or name or column_map or hub_config or test_fraction is not None or limit is not None:
            fail("suite takes only --out and --code-packages (its sources and splits are fixed: see "
                 "`adaflash data prepare --help`)")
        _prepare_suite(ctx, Path(out_dir).expanduser() if out_dir else Path(workspace_of(ctx)) / "data",
                       code_packages, as_json)
        return
    if code_packages is not None:
        fail("--code-packages applies to the suite")
    try:
        mapping = parse_column_map(column_map)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--column-map") from None
    try:
        src = resolve_dataset(dataset, source, column_map=mapping, name=name, hub_config=hub_config)
    except DatasetError as err:
        fail(str(err))
    out = Path(out_dir).expanduser() if out_dir else Path(workspace_of(ctx)) / "data"
    log = runlog_of(ctx)
    config = {"command": "prepare", "source": src.location, "kind": src.kind, "split_seed": split_seed,
              "test_fraction": test_fraction, "limit": limit, "column_map": mapping, "hub_config": hub_config}
    with recorded_run(log, "data", expected=(DatasetError, OSError), name=f"prepare {src.name}", dataset=src.name,
                      run_dir=str(out), config=config) as run:
        summary = prepare_dataset(src, out, split_seed=split_seed, test_fraction=test_fraction, limit=limit)
        summary["run_id"] = run.id
        run.metrics({"rows_train": summary["rows"]["train"], "rows_test": summary["rows"]["test"],
                     "skipped": summary["skipped"]})
        run.finish(note=f"{summary['rows']['train']} train, {summary['rows']['test']} test, "
                        f"{summary['skipped']} skipped")
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    _print_summary(summary)


def _prepare_suite(ctx: click.Context, out: Path, code_packages: str | None, as_json: bool) -> None:
    from adaflash.data.code_prompts import CODE_PACKAGES, chosen_packages
    from adaflash.data.suite import build_suite

    try:
        packages = CODE_PACKAGES if code_packages is None else chosen_packages(code_packages)
    except ValueError as err:
        fail(f"--code-packages: {err}")
    log = runlog_of(ctx)
    with recorded_run(log, "data", expected=(DatasetError, OSError), name="prepare suite", dataset="suite",
                      run_dir=str(out), config={"command": "prepare", "dataset": "suite"}) as run:
        summary = build_suite(out, packages=packages)
        summary["run_id"] = run.id
        run.metrics({f"test_{d}": n for d, n in summary["test"].items()}
                    | {f"train_{d}": n for d, n in summary["train"].items()})
        run.finish(note=f"{sum(summary['test'].values())} test prompts in {len(summary['test'])} domains, "
                        f"{sum(summary['train'].values())} training prompts")
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    print_suite_summary(summary)


def print_suite_summary(summary: dict[str, Any]) -> None:
    run_id = summary["run_id"]
    click.echo(f"suite: {sum(summary['test'].values())} held-out prompts, {sum(summary['train'].values())} "
               f"training prompts (none equal to a held-out one; {summary['dropped_overlap']} dropped)")
    for domain in [*summary["test"], *(d for d in summary["train"] if d not in summary["test"])]:
        click.echo(f"  {domain:11} test {summary['test'].get(domain, 0):>6}  train {summary['train'].get(domain, 0):>6}  "
                   f"{summary['sources'].get(domain, '')}")
    packages = ", ".join(f"{name} {p['version']} ({p['licence']})" for name, p in summary["code_packages"].items())
    click.echo(f"  code prompts from: the standard library (Python {summary['python']}), {packages or 'no package'}")
    for split, path in summary["files"].items():
        click.echo(f"  {split:5} {path}")
    click.secho(f"  run {run_id}", fg="bright_black")


def _print_summary(summary: dict[str, Any]) -> None:
    split = "official split" if summary["split"] == "official" else (
        f"hash split, test fraction {summary['test_fraction']}, seed {summary['split_seed']}")
    click.echo(f"{summary['dataset']}: {summary['rows']['train']} train + {summary['rows']['test']} test rows "
               f"({split}) from {summary['source']}")
    for name in ("train", "test"):
        click.echo(f"  {name:5} {summary['rows'][name]:>7}  {summary['files'][name]}")
    click.echo(f"  skipped {summary['skipped']}")
    for reason, count in sorted(summary["skipped_reasons"].items(), key=lambda item: -item[1]):
        click.echo(f"    {count:>7}  {reason}")
    for example in summary["skipped_examples"]:
        click.secho(f"    e.g. {example}", fg="bright_black")
    for where in summary["truncated"]:
        click.echo(f"  the source is truncated at {where}: kept every complete row before it")
    click.secho(f"  run {summary['run_id']}", fg="bright_black")


@data.command("vary", short_help="Add variants of each prompt with its numbers redrawn (more answers to train on).")
@click.option("--dataset", "dataset_file", required=True, callback=prompt_file("train"),
              help='JSONL of normalized rows or {"prompt": ...} rows, or a prepared dataset\'s name (its train split).')
@click.option("--variants", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Redrawn copies per prompt, beside the original.")
@click.option("--num-samples", type=click.IntRange(1), default=None, help="Vary the first N prompts [default: all].")
@click.option("--skip", type=click.IntRange(0), default=0, show_default=True,
              help="Leave out the first N prompts (as `regenerate --skip`).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draws.")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), callback=writable_file,
              help="Output JSONL (written atomically).")
@click.pass_context
def vary(ctx: click.Context, dataset_file: str, variants: int, num_samples: int | None, skip: int, seed: int,
         out_file: str) -> None:
    """Write each prompt and VARIANTS copies whose integers are redrawn (half to twice each value).

    The target answers the copies anew (`adaflash data regenerate --dataset OUT`), so a drafter sees
    several answers per question and must read the numbers from the context instead of recalling them.
    Copies have ids `<id>~v1`, ... and no reference (the dataset's answer belongs to the original numbers).
    """
    from adaflash.data.io import write_jsonl_atomic
    from adaflash.data.prompts import PromptFileError, read_prompt_file
    from adaflash.data.vary import vary_rows

    refuse_same_file(dataset_file, out_file)
    try:
        prompts = read_prompt_file(dataset_file, num_samples, skip)
    except PromptFileError as err:
        fail(str(err))
    result = vary_rows(prompts, variants, seed=seed)
    log = runlog_of(ctx)
    with recorded_run(log, "data", expected=(OSError,), name="vary", dataset=str(dataset_file),
                      run_dir=str(Path(out_file).expanduser().resolve().parent),
                      config={"command": "vary", "out": str(out_file), "variants": variants, "seed": seed,
                              "num_samples": len(prompts), "skip": skip}) as run:
        path = write_jsonl_atomic(out_file, result.rows)
        run.metrics({"rows": len(result.rows), "prompts": len(prompts),
                     "without_numbers": result.without_numbers, "repeats": result.repeats})
        run.finish(note=f"{len(prompts)} prompts -> {len(result.rows)} rows -> {path}")
    run_id = run.id
    click.echo(f"{len(prompts)} prompts -> {len(result.rows)} rows -> {path}")
    if result.without_numbers:
        click.echo(f"  {result.without_numbers} prompts hold no integer: kept once, without variants")
    if result.repeats:
        click.echo(f"  {result.repeats} variants left out: their draws only repeated prompts already written")
    click.secho(f"  run {run_id}", fg="bright_black")


def regenerate_in_procs(ctx: click.Context, out_file: str, procs: int, as_json: bool) -> None:
    """`regenerate --procs N`: N copies of this command, one --shard each, merged into OUT."""
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from adaflash.data.regenerate_procs import (
        ShardError,
        child_command,
        combined,
        merge,
        run_shards,
        shards_of,
    )

    base = child_command() + argv_of(ctx, {"procs", "out_file", "shard", "as_json"})
    shards = shards_of(out_file, procs)
    log = runlog_of(ctx)
    with recorded_run(log, "data", expected=(OSError, ValueError, ShardError), name="regenerate",
                      target=ctx.params["target"], method=ctx.params["method"], dataset=str(ctx.params["dataset_file"]),
                      run_dir=str(Path(out_file).expanduser().resolve().parent),
                      config={"command": "regenerate", "out": str(out_file), "procs": procs}) as run:
        with Progress(TextColumn(f"[bold]regenerate × {procs}"), MofNCompleteColumn(), TextColumn("answers"),
                      TimeElapsedColumn(), console=Console(stderr=True), disable=as_json) as progress:
            task = progress.add_task("regenerate", total=None)
            summaries = run_shards(lambda s: base + [f"--shard={s.spec}", f"--out={s.out}", "--json"], shards,
                                   resume=bool(ctx.params["resume"]),
                                   on_poll=lambda done: progress.update(task, completed=done))
            progress.update(task, completed=sum(s["rows"] for s in summaries))
        rows = merge(shards, out_file)
        summary = {"run_id": run.id, "out": str(out_file), "procs": procs, **combined(summaries), "rows": rows}
        run.finish(note=record_regenerate(run, summary))
    report_regenerate(summary, as_json, how=f"{procs} processes", kept_in="the shards' partial files")


REGENERATE_METRICS = ("rows", "new_rows", "unfinished", "skipped", "completion_tokens", "output_throughput",
                      "answers_per_hour", "accept_length", "duration")


def record_regenerate(run: RecordedRun, summary: dict[str, Any]) -> str:
    """The run log's metrics, and its note (returned): alike for one process and for several."""
    run.metrics({key: summary[key] for key in REGENERATE_METRICS})
    left = f"; {summary['unfinished']} unfinished: --resume answers them" if summary["unfinished"] else ""
    return f"{summary['rows']} rows -> {summary['out']}{left}"


def report_regenerate(summary: dict[str, Any], as_json: bool, *, how: str, kept_in: str) -> None:
    """What the user reads: alike for one process and for several."""
    run_id, rows, unfinished = summary["run_id"], summary["rows"], summary["unfinished"]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"{rows} rows -> {summary['out']} ({summary['new_rows']} new, {summary['completion_tokens']} tokens, "
               f"{summary['output_throughput']:.1f} tok/s, {summary['answers_per_hour']:,.0f} answers an hour, "
               f"τ={summary['accept_length']:.2f}, {how})")
    if unfinished:
        click.secho(f"  time budget spent: {unfinished} prompts unfinished; run again with --resume (kept in "
                    f"{kept_in})", fg="yellow")
    skipped = list(summary["skipped_reasons"].items())
    for rid, why in skipped[:5]:
        click.secho(f"  skipped {rid}: {why}", fg="yellow")
    if len(skipped) > 5:
        click.secho(f"  ... and {len(skipped) - 5} more skipped", fg="yellow")
    click.secho(f"  run {run_id}", fg="bright_black")


@data.command("regenerate", short_help="Answer a dataset's prompts with the target, for drafter training.")
@click.option("--target", default="smollm2-135m", show_default=True, help="Built-in name, HF id or local folder.")
@click.option("--method", type=click.Choice(METHOD_NAMES), default=VANILLA, show_default=True)
@click.option("--draft", default=None, metavar="DIR|NAME",
              help="Drafter folder or built-in drafter's name (methods other than vanilla; dflash and adaflash "
                   "default to the target's built-in drafter for each: `adaflash draft builtins`).")
@click.option("--dataset", "dataset_file", required=True, callback=prompt_file("train"),
              help='JSONL of normalized rows or {"prompt": ...} rows, or a prepared dataset\'s name (its train split).')
@click.option("--num-samples", type=click.IntRange(1), default=None, help="Answer the first N prompts [default: all].")
@click.option("--skip", type=click.IntRange(0), default=0, show_default=True,
              help="Leave out the first N prompts (e.g. those a drafter was already trained on).")
@click.option("--max-new-tokens", type=click.IntRange(1, 32768), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(0.0), default=0.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 1024), default=16, show_default=True)
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the chat template.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the engine's sampler.")
@click.option("--max-len", type=click.IntRange(16), default=None,
              help="KV-cache positions per prompt [default: fit the longest prompt + max-new-tokens, at most 4096]; "
                   "longer prompts are skipped.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--dtype", default="bf16-if-native", show_default=True, help=DTYPE_HELP)
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), callback=writable_file,
              help="Output JSONL, gzip-compressed when it ends in .gz (written atomically).")
@click.option("--shard", default=None, metavar="I/N",
              help="Answer only every N-th prompt from the I-th (0-based): N processes or GPUs split one dataset.")
@click.option("--procs", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Run N processes side by side on the device, each answering every N-th prompt, then write one "
                   "OUT: one process leaves a GPU mostly idle (on an H200, 8 answered about 6x as many prompts an hour as 1).")
@click.option("--max-minutes", type=click.FloatRange(0, min_open=True), default=None,
              help="Time budget: then start no new prompt, let those in flight finish, write the rows, and leave "
                   "the rest to --resume.")
@click.option("--resume", is_flag=True,
              help="Keep the rows a killed or timed-out run left in OUT.partial and answer only the others.")
@click.option("--compact", is_flag=True,
              help="Rows hold the prompt string and the answer's token ids only (what training reads): a third "
                   "of the size.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def regenerate(ctx: click.Context, target: str, method: str, draft: str | None, dataset_file: str,
               num_samples: int | None, skip: int, max_new_tokens: int, temperature: float, top_p: float,
               batch_size: int, chat: bool, seed: int, max_len: int | None, device: str, dtype: str, out_file: str,
               shard: str | None, procs: int, max_minutes: float | None, resume: bool, compact: bool,
               as_json: bool) -> None:
    """Answer the prompts of a dataset with the target; rows keep the exact prompt string it saw.

    Finished rows are also appended to OUT.partial as they come, so a run that is killed or runs out
    of --max-minutes continues with --resume; OUT itself is written once, atomically.
    """
    refuse_same_file(dataset_file, out_file)
    if procs > 1:
        if shard:
            fail("--procs splits the dataset itself: leave out --shard (or run one --shard I/N per process)")
        regenerate_in_procs(ctx, out_file, procs, as_json)
        return
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from adaflash.data.io import write_jsonl_atomic
    from adaflash.data.prompts import PromptFileError, read_prompt_file
    from adaflash.data.regenerate import PartialRows, fit_max_len, shard_of
    from adaflash.data.regenerate import regenerate as run_regenerate
    from adaflash.engine.build import build_engine
    from adaflash.engine.config import EngineConfig
    from adaflash.engine.params import SamplingParams
    from adaflash.models.drafter_io import DrafterError
    from adaflash.models.loading import load_target

    try:
        draft = chosen_drafter(method, draft, target)
        prompts = read_prompt_file(dataset_file, num_samples, skip)
        if shard:
            prompts = shard_of(prompts, shard)
    except (PromptFileError, ValueError) as err:
        fail(str(err))
    progress_file = PartialRows(out_file, resume=resume)
    answered = dict(progress_file.rows)  # what earlier runs left: the file grows from here
    todo = [p for p in prompts if p.id not in answered]
    try:
        loaded = load_target(target, device=device, dtype=dtype)
        cache_len = (min(max_len, loaded.max_context) if max_len else
                     fit_max_len(loaded, todo or prompts, chat=chat, max_new_tokens=max_new_tokens))
        engine = build_engine(loaded, method, draft,
                              config=EngineConfig(max_batch=batch_size, max_len=cache_len, seed=seed))
    except (DrafterError, ValueError, FileNotFoundError, OSError) as err:
        fail(str(err))
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    log = runlog_of(ctx)
    config = {"command": "regenerate", "out": str(out_file), "num_samples": len(prompts), "skip": skip,
              "shard": shard, "resume": resume, "resumed_rows": len(answered), "max_minutes": max_minutes,
              "compact": compact, "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
              "chat": chat, "seed": seed, "batch_size": batch_size, "max_len": engine.max_len,
              "device": str(engine.device)}
    console = Console(stderr=True)
    with recorded_run(log, "data", expected=(ValueError, RuntimeError, OSError), name="regenerate", method=method,
                      target=target, draft=draft, dataset=str(dataset_file),
                      run_dir=str(Path(out_file).expanduser().resolve().parent), config=config) as run:
        with Progress(TextColumn("[bold]regenerate"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[tokens]} tok"), TimeElapsedColumn(), console=console,
                      disable=as_json) as progress:
            task = progress.add_task("regenerate", total=len(prompts), tokens=0, completed=len(answered))
            tokens = [0]

            def on_done(row: dict[str, Any]) -> None:
                progress_file.add(row)
                tokens[0] += row["meta"]["completion_tokens"] or 0
                progress.update(task, advance=1, tokens=tokens[0])

            deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
            try:
                result = run_regenerate(engine, todo, params, chat=chat, on_done=on_done, compact=compact,
                                        deadline=deadline)
            finally:
                progress_file.close(done=False)
        rows = [progress_file.rows[p.id] for p in prompts if p.id in progress_file.rows]
        path = write_jsonl_atomic(out_file, rows)
        if not result.unfinished:
            progress_file.close(done=True)
        summary = {
            "run_id": run.id, "out": str(path), "rows": len(rows), "new_rows": len(result.rows),
            "resumed_rows": len(answered), "unfinished": result.unfinished, "skipped": len(result.skipped),
            "skipped_reasons": result.skipped, "completion_tokens": result.completion_tokens,
            "accept_length": result.accept_length, "output_throughput": result.output_throughput,
            "duration": result.duration,
        }
        summary["answers_per_hour"] = 3600 * len(result.rows) / result.duration if result.duration > 0 else 0.0
        run.finish(note=record_regenerate(run, summary))
    report_regenerate(summary, as_json, how="1 process", kept_in=str(progress_file.path))
