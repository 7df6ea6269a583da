"""`adaflash data`: prepare datasets into normalized rows, and regenerate answers with the target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import emit_rows, fail, recorded_run, runlog_of, workspace_of
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import one_model, out_file, prompts_path, required, same_file
from adaflash.data.builtin_datasets import describe_builtins
from adaflash.data.column_map import parse_column_map
from adaflash.data.errors import DatasetError
from adaflash.data.prepare import prepare_dataset
from adaflash.data.resolve import resolve_dataset
from adaflash.engine.config import EngineConfig
from adaflash.options import InputConfig, JobConfig, ModelConfig, PrepConfig, SamplingConfig


@click.group()
def data() -> None:
    """Prepare datasets into normalized rows, and regenerate answers with the target."""


@data.command("list")
@uses(Output(("table", "json")), command="data list")
def list_datasets(output: str) -> None:
    """The built-in datasets and where each offline copy is found."""
    rows = describe_builtins()
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    emit_rows(rows, ["name", "found", "description"], "table", title="Built-in datasets")
    click.echo("Any local .jsonl/.json/.parquet file or hub id (owner/name) is accepted too.")


@data.command("prepare", short_help="Normalize a dataset into <name>_train.jsonl and <name>_test.jsonl.")
@click.argument("dataset")
@uses(use(JobConfig, only=("out",)), use(InputConfig, only=("limit",)),
      use(PrepConfig, only=("source", "name", "split_seed", "test_fraction", "column_map", "hub_config", "code_packages")),
      Output(("text", "json")), command="data prepare")
@click.pass_context
def prepare(ctx: click.Context, dataset: str, job: JobConfig, inputs: InputConfig, prep: PrepConfig,
            output: str) -> None:
    """Write DATASET as normalized rows to <out>/<name>_train.jsonl and <out>/<name>_test.jsonl.

    DATASET is gsm8k, humaneval, mt-bench, sharegpt, a local .jsonl/.json/.parquet file (or a
    folder with train.* and test.* files), or a hub id (owner/name, through `datasets`).

    `suite` builds the multi-domain suite from the offline sources: suite_test.jsonl holds held-out
    prompts per domain (math, code, chat, chat-turn2, open-chat) and suite_train.jsonl a general
    training corpus whose prompts never equal a test prompt.
    """
    out = Path(job.out).expanduser() if job.out else Path(workspace_of(ctx)) / "data"
    source, name, column_map, hub_config, test_fraction = (prep.source, prep.name, prep.column_map, prep.hub_config,
                                                           prep.test_fraction)
    if dataset.lower() == "suite":
        if source or name or column_map or hub_config or test_fraction is not None or inputs.limit is not None:
            fail("suite takes only --out and --code-packages (its sources and splits are fixed: see "
                 "`adaflash data prepare --help`)")
        _prepare_suite(ctx, out, prep.code_packages, output == "json")
        return
    if prep.code_packages is not None:
        fail("--code-packages applies to the suite")
    try:
        mapping = parse_column_map(column_map)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--column-map") from None
    try:
        src = resolve_dataset(dataset, source, column_map=mapping, name=name, hub_config=hub_config)
    except DatasetError as err:
        fail(str(err))
    summary = _prepare(ctx, src, out, prep.split_seed, test_fraction, inputs.limit, mapping, hub_config)
    if output == "json":
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    _print_summary(summary)


def _prepare(ctx: click.Context, src: Any, out: Path, split_seed: int, test_fraction: float | None,
             limit: int | None, mapping: Any, hub_config: str | None) -> dict[str, Any]:
    """Prepare inside a recorded run; the summary, with its run id."""
    config = {"command": "prepare", "source": src.location, "kind": src.kind, "split_seed": split_seed,
              "test_fraction": test_fraction, "limit": limit, "column_map": mapping, "hub_config": hub_config}
    with recorded_run(runlog_of(ctx), "data", expected=(DatasetError, OSError), name=f"prepare {src.name}",
                      dataset=src.name, run_dir=str(out), config=config) as run:
        summary = prepare_dataset(src, out, split_seed=split_seed, test_fraction=test_fraction, limit=limit)
        summary["run_id"] = run.id
        run.metrics({"rows_train": summary["rows"]["train"], "rows_test": summary["rows"]["test"],
                     "skipped": summary["skipped"]})
        run.finish(note=f"{summary['rows']['train']} train, {summary['rows']['test']} test, "
                        f"{summary['skipped']} skipped")
    return summary


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
@uses(use(InputConfig, only=("dataset", "num_samples", "skip")), use(SamplingConfig, only=("seed",)),
      use(JobConfig, only=("out",)), use(PrepConfig, only=("variants",)), command="data vary")
@click.pass_context
def vary(ctx: click.Context, inputs: InputConfig, sampling: SamplingConfig, job: JobConfig, prep: PrepConfig) -> None:
    """Write each prompt and VARIANTS copies whose integers are redrawn (half to twice each value).

    The target answers the copies anew (`adaflash data regenerate --dataset OUT`), so a drafter sees
    several answers per question and must read the numbers from the context instead of recalling them.
    Copies have ids `<id>~v1`, ... and no reference (the dataset's answer belongs to the original numbers).
    """
    required(inputs.dataset, "--dataset")
    dataset_file = prompts_path(ctx, inputs.dataset, "train", "--dataset") or ""
    out = out_file(ctx, job.out)
    _vary(ctx, dataset_file, out, prep.variants, inputs.num_samples, inputs.skip, sampling.seed or 0)


def _vary(ctx: click.Context, dataset_file: str, out_file: str, variants: int, num_samples: int | None, skip: int,
          seed: int) -> None:
    from adaflash.data.io import write_jsonl_atomic
    from adaflash.data.prompts import PromptFileError, read_prompt_file
    from adaflash.data.vary import vary_rows

    same_file(dataset_file, out_file)
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


@data.command("regenerate", short_help="Answer a dataset's prompts with the target, for drafter training.")
@uses(ModelConfig, use(InputConfig, only=("dataset", "num_samples", "skip")),
      use(SamplingConfig, only=("max_new_tokens", "temperature", "top_p", "chat", "seed")),
      use(EngineConfig, only=("max_batch", "max_len"), notes={
          "max_len": "data regenerate: KV-cache positions per prompt [default: fit the longest prompt + "
                     "max-new-tokens, at most 4096]; longer prompts are skipped."}),
      use(JobConfig, only=("out", "max_minutes", "resume")), use(PrepConfig, only=("shard", "procs", "compact")),
      Output(("text", "json"), help="text, or json: the summary."), command="data regenerate")
@click.pass_context
def regenerate(ctx: click.Context, model: ModelConfig, inputs: InputConfig, sampling: SamplingConfig,
               engine: EngineConfig, job: JobConfig, prep: PrepConfig, output: str) -> None:
    """Answer the prompts of a dataset with the target; rows keep the exact prompt string it saw.

    Finished rows are also appended to OUT.partial as they come, so a run that is killed or runs out
    of --max-minutes continues with --resume; OUT itself is written once, atomically.
    """
    from adaflash.cli.data_regenerate import Regeneration, regenerate_here, regenerate_in_procs

    required(inputs.dataset, "--dataset")
    dataset_file = prompts_path(ctx, inputs.dataset, "train", "--dataset") or ""
    out = out_file(ctx, job.out)
    same_file(dataset_file, out)
    shard, procs = prep.shard, prep.procs
    method, draft = one_model(model, builtin=procs == 1)
    work = Regeneration(model=model, method=method, draft=draft, dataset_file=dataset_file, inputs=inputs,
                        sampling=sampling, engine=engine, job=job, out=out, shard=shard, compact=prep.compact,
                        quiet=output == "json")
    if procs > 1:
        if shard:
            fail("--procs splits the dataset itself: leave out --shard (or run one --shard I/N per process)")
        regenerate_in_procs(ctx, work, procs)
        return
    regenerate_here(ctx, work)


@data.command("ask", short_help="The target writes new prompts itself, each once and none held out.")
@uses(ModelConfig, use(InputConfig, only=("num_samples",), notes={"num_samples": "Here: prompts to write "
                                                                                  "[default: 1,000]."}),
      use(SamplingConfig, only=("max_new_tokens", "temperature", "top_p", "seed")),
      use(EngineConfig, only=("max_batch",)), use(JobConfig, only=("out",)), use(PrepConfig, only=("held_out",)),
      Output(("text", "json"), help="text, or json: the summary."), command="data ask")
@click.pass_context
def ask(ctx: click.Context, model: ModelConfig, inputs: InputConfig, sampling: SamplingConfig, engine: EngineConfig,
        job: JobConfig, prep: PrepConfig, output: str) -> None:
    """Write prompts the target makes up, for `data regenerate` to answer: more distinct answers to train on.

    The target continues a page of prompts people sent to an assistant, grouped by topic (about 250 topics
    of daily life, work, study, code, science and culture). Each prompt is kept once, by the hash of its
    normalized text, and none equal to a held-out prompt (--held-out), so measurements stay on prompts no
    drafter trained on. Rows: {"id", "domain": "ask", "topic", "conversations"}.
    """
    from adaflash.cli.data_ask import AskWork, run_ask

    method, draft = one_model(model)
    run_ask(ctx, AskWork(model=model, method=method, draft=draft, count=inputs.num_samples or 1000,
                         sampling=sampling, batch=engine.max_batch, out=out_file(ctx, job.out),
                         held_out=prep.held_out, quiet=output == "json"))
