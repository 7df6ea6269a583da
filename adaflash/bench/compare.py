"""Comparison tables over benchmark records: pure functions the CLI and the TUI share.

A row is one record (method × dataset × concurrency × target). Its speed-up divides its output
throughput by the Vanilla row of the same group (the same bench matrix; results outside any matrix
form one "standalone" group) with the same target, dataset and concurrency. Rows that differ from
their Vanilla row in prompts, sampling, max tokens or hardware are flagged, never silently compared.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from adaflash.methods import METHOD_NAMES, VANILLA, method_for_algorithm, sglang_algorithms

STANDALONE = "standalone"
FAIRNESS_RULES = (
    "Fair comparison: within a group every row uses the same target, prompts (dataset, num_prompts), "
    "sampling (temperature, top_p), max new tokens (and their --length-spread), hardware and concurrency; speed-up = output tok/s "
    "divided by the Vanilla row of the same bench matrix (or of the standalone results) with the same "
    "target, dataset and concurrency. No Vanilla row, no speed-up. A suite's rows are per domain "
    "(suite/code, ...); its overall row gives the mean over domains of each domain's speed-up, τ and tok/s."
)
FAIRNESS_FIELDS = ("num_prompts", "temperature", "top_p", "max_new_tokens", "length_spread", "hardware")
COLUMNS = ["method", "target", "dataset", "concurrency", "label", "output_throughput", "speedup", "accept_length",
           "accept_rate", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
           "p99_itl_ms", "accuracy", "n"]
TITLES = {
    "concurrency": "conc", "output_throughput": "out tok/s", "speedup": "speed-up", "accept_length": "τ",
    "accept_rate": "accept rate", "median_ttft_ms": "TTFT p50 ms", "p99_ttft_ms": "TTFT p99 ms",
    "median_tpot_ms": "TPOT p50 ms", "p99_tpot_ms": "TPOT p99 ms", "median_itl_ms": "ITL p50 ms",
    "p99_itl_ms": "ITL p99 ms",
}
_ORDER = {m: i for i, m in enumerate(METHOD_NAMES)}


def group_of(record: dict[str, Any]) -> str:
    return record.get("matrix_run") or STANDALONE


def records_of(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run-log bench_results rows → records (their JSON data) with where each came from."""
    out = []
    for row in results:
        data = row.get("data")
        record = dict(data) if isinstance(data, dict) else {k: v for k, v in row.items() if k != "data"}
        record.setdefault("run_id", row.get("run_id"))
        record["result_id"] = row.get("id")
        out.append(record)
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def comparison_rows(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows sorted for reading, warnings about missing Vanilla rows and unfair pairs)."""
    vanilla: dict[tuple, dict[str, Any]] = {}
    for record in records:
        if record.get("method") == VANILLA:
            key = (group_of(record), record.get("target"), record.get("dataset"), record.get("concurrency"))
            if key not in vanilla or (record.get("result_id") or 0) >= (vanilla[key].get("result_id") or 0):
                vanilla[key] = record
    rows, warnings = [], []
    for record in records:
        key = (group_of(record), record.get("target"), record.get("dataset"), record.get("concurrency"))
        base = vanilla.get(key)
        out, base_out = _num(record.get("output_throughput")), _num(base.get("output_throughput")) if base else None
        row = {
            "group": key[0], "run_id": record.get("run_id"), "result_id": record.get("result_id"),
            "method": record.get("method"), "target": record.get("target"), "dataset": record.get("dataset"),
            "concurrency": record.get("concurrency"), "label": record.get("label"), "output_throughput": out,
            # a suite's overall row carries its own: the mean over domains of each domain's speed-up
            "speedup": _num(record.get("speedup")) if record.get("aggregate") else (
                out / base_out if out is not None and base_out else None),
            "accept_length": _num(record.get("accept_length")), "accept_rate": _num(record.get("accept_rate")),
            "accuracy": _num(record.get("accuracy")), "n": record.get("completed"), "fair": True,
        }
        for name in ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms"):
            row[name] = _num(record.get(name))
        where = f"{row['method']} on {row['dataset']} at concurrency {row['concurrency']}"
        if base is None:
            if row["method"] != VANILLA:
                warnings.append(f"{where} ({_group_name(key[0])}): no Vanilla row with the same target, dataset "
                                "and concurrency, so no speed-up")
        elif base is not record:
            for name in FAIRNESS_FIELDS:
                mine, theirs = record.get(name), base.get(name)
                if mine is not None and theirs is not None and mine != theirs:
                    row["fair"] = False
                    warnings.append(f"{where}: {name} differs from its Vanilla row ({mine!r} vs {theirs!r})")
        rows.append(row)
    rows.sort(key=lambda r: (str(r["group"]), str(r["target"]), str(r["dataset"]), r["concurrency"] or 0,
                             _ORDER.get(r["method"], len(_ORDER)), str(r["label"] or ""), r["result_id"] or 0))
    return rows, warnings


def overall_records(records: list[dict[str, Any]], suite: str, domains: list[str]) -> list[dict[str, Any]]:
    """One row per method and batch over a suite's domains: each figure the mean over domains of the
    per-domain figure (speed-up against that domain's Vanilla row), so no domain weighs more for having
    longer answers or more prompts. Only methods measured in every domain get one."""
    from statistics import fmean

    out = []
    keys = dict.fromkeys((r["method"], r["concurrency"]) for r in records if r.get("domain"))
    vanilla = {(r["domain"], r["concurrency"]): r for r in records if r.get("domain") and r["method"] == VANILLA}
    for method, batch in keys:
        rows = {r["domain"]: r for r in records if r.get("domain") and (r["method"], r["concurrency"]) == (method, batch)}
        if set(rows) != set(domains):
            continue
        speedups = [rows[d]["output_throughput"] / vanilla[(d, batch)]["output_throughput"]
                    for d in domains if (d, batch) in vanilla and vanilla[(d, batch)].get("output_throughput")]
        taus = [rows[d]["accept_length"] for d in domains if rows[d].get("accept_length") is not None]
        first = rows[domains[0]]
        record = {k: first.get(k) for k in ("method", "target", "draft", "label", "concurrency", "max_concurrency",
                                             "batch_size", "max_new_tokens", "temperature", "top_p", "hardware",
                                             "backend", "dtype", "matrix_run", "warmup", "order", "kernels")}
        mismatches = [rows[d].get("mismatches") for d in domains]
        record.update({
            "dataset": suite, "domain": None, "domains": list(domains), "aggregate": "mean over domains",
            "num_prompts": sum(rows[d].get("num_prompts") or 0 for d in domains),
            "completed": sum(rows[d].get("completed") or 0 for d in domains),
            "output_throughput": fmean(rows[d]["output_throughput"] for d in domains),
            "speedup": fmean(speedups) if len(speedups) == len(domains) else None,
            "accept_length": fmean(taus) if len(taus) == len(domains) else None,
            "mismatches": None if any(m is None for m in mismatches) else sum(mismatches),
            "identical": None if any(m is None for m in mismatches) else not any(mismatches),
            "per_domain": {d: {"output_throughput": rows[d]["output_throughput"],
                               "accept_length": rows[d].get("accept_length"),
                               "speedup": (rows[d]["output_throughput"] / vanilla[(d, batch)]["output_throughput"]
                                           if (d, batch) in vanilla else None)} for d in domains},
        })
        out.append(record)
    return out


def _group_name(group: str) -> str:
    return "standalone results" if group == STANDALONE else f"matrix {group}"


def columns_for(rows: list[dict[str, Any]]) -> list[str]:
    """COLUMNS without `label` when no row has one."""
    return [c for c in COLUMNS if c != "label" or any(r.get("label") for r in rows)]


def display_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows keyed by human column titles, values formatted (speed-up as 1.52x, rates as %)."""
    columns = columns_for(rows)
    titles = [TITLES.get(c, c) for c in columns]
    shown = []
    for row in rows:
        item = {}
        for column, title in zip(columns, titles):
            value = row.get(column)
            if value is None:
                item[title] = None
            elif column == "speedup":
                item[title] = f"{value:.2f}x" + ("" if row.get("fair", True) else "*")
            elif column in ("accept_rate", "accuracy"):
                item[title] = f"{100 * value:.1f}%"
            elif column == "output_throughput":
                item[title] = f"{value:.1f}"
            elif column == "accept_length":
                item[title] = f"{value:.2f}"
            elif isinstance(value, float):
                item[title] = f"{value:.1f}"
            else:
                item[title] = value
        shown.append(item)
    return shown, titles


def footer(warnings: list[str], rows: list[dict[str, Any]] | None = None) -> str:
    lines = [FAIRNESS_RULES]
    if rows and not all(r.get("fair", True) for r in rows):
        lines.append("* speed-up of a row that differs from its Vanilla row (see the warnings).")
    if warnings:
        lines.append("Warnings:")
        lines += [f"  - {w}" for w in dict.fromkeys(warnings)]
    return "\n".join(lines)


def markdown_table(rows: list[dict[str, Any]], warnings: list[str]) -> str:
    shown, titles = display_rows(rows)
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for item in shown:
        lines.append("| " + " | ".join("N/A" if item[t] is None else str(item[t]) for t in titles) + " |")
    return "\n".join(lines) + "\n\n" + footer(warnings, rows) + "\n"


# -- export -------------------------------------------------------------------------------------
def _flat(value: Any) -> Any:
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else value


def export_records(records: list[dict[str, Any]], fmt: str) -> str:
    """Full records (SGLang key names) as json, jsonl or csv; markdown is the comparison table."""
    if fmt == "json":
        return json.dumps(records, indent=2, default=str) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(r, default=str) + "\n" for r in records)
    if fmt == "csv":
        columns: list[str] = []
        for record in records:
            columns += [k for k in record if k not in columns and k != "server_info"]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for record in records:
            writer.writerow({k: _flat(v) for k, v in record.items()})
        return buffer.getvalue()
    if fmt == "markdown":
        rows, warnings = comparison_rows(records)
        return markdown_table(rows, warnings)
    raise ValueError(f"unknown format {fmt!r}: expected json, jsonl, csv or markdown")


# -- import of SGLang bench_serving results ------------------------------------------------------------
SERVER_INFO_KEEP = ("model_path", "speculative_algorithm", "speculative_draft_model_path", "tp_size",
                    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                    "speculative_dflash_block_size", "max_running_requests", "version", "method", "target", "draft",
                    "engine", "drafter_version", "hardware")


class ImportFormatError(ValueError):
    pass


def content_hash(obj: Any) -> str:
    """The identity of an imported result: SHA-256 of its canonical JSON (the same line imported twice is one
    result, whatever file it came from)."""
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def builtin_name(value: Any) -> Any:
    """A built-in target's name for its cached folder (`<cache>/models/<name>`), a built-in drafter's name for
    its folder, so imported rows carry the names native rows carry; anything else unchanged. (Read from the
    layout, not from the registry, which would bring torch into the dashboard.)"""
    if not isinstance(value, str) or not value.startswith(("/", "~", ".")):
        return value
    from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS
    from adaflash.workspace import cache_dir

    path = Path(value).expanduser().resolve()
    if path.parent == cache_dir() / "models" and (path / ".adaflash-ready").is_file():
        return path.name
    for name, drafter in BUILTIN_DRAFTERS.items():
        if path == drafter.folder:
            return name
    return value


def _method(obj: dict[str, Any], info: dict[str, Any]) -> str:
    """The result's own `method` (an adaflash server reports it), else SGLang's speculative_algorithm."""
    own = obj.get("method") if isinstance(obj.get("method"), str) else info.get("method")
    if own:
        if own not in METHOD_NAMES:
            raise ImportFormatError(f"method {own!r} is none of {', '.join(METHOD_NAMES)}: give --method")
        return str(own)
    if not info:
        raise ImportFormatError("cannot tell the method (no method, no server_info.speculative_algorithm): "
                                "give --method")
    algorithm = info.get("speculative_algorithm")
    method = method_for_algorithm(None if algorithm is None else str(algorithm))
    if method is None:
        raise ImportFormatError(
            f"server_info.speculative_algorithm {algorithm!r} is none of {', '.join(sglang_algorithms())} (or null "
            "for Vanilla): give --method to say which method these results measure")
    return method.name


def from_sglang(obj: dict[str, Any], *, method: str | None = None, dataset: str | None = None,
                target: str | None = None, concurrency: int | None = None,
                source: str | None = None) -> dict[str, Any]:
    """One bench_serving result line → a record: its keys kept, our comparison keys filled in.

    The method is the line's own `method` or server_info's (an adaflash server reports it; its
    `speculative_algorithm` is DFLASH for dflash, adaflash and osd alike), else SGLang's
    speculative_algorithm. The target is server_info's target name, else its model_path, with a
    built-in's cached folder or hub id given as the built-in's name, as native rows have it.
    bench_serving's `concurrency` is the measured average; the configured cap is `max_concurrency`,
    which becomes our `concurrency` (the measured one is kept as `measured_concurrency`).
    """
    for name in ("completed", "output_throughput"):
        if name not in obj:
            raise ImportFormatError(f"no {name!r}: not a bench_serving result")
    info = obj.get("server_info") if isinstance(obj.get("server_info"), dict) else {}
    method = method or _method(obj, info)
    record = {k: v for k, v in obj.items() if k != "server_info"}
    accept = obj.get("accept_length")
    if accept is None:
        states = info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            accept = states[0].get("avg_spec_accept_length")
    cap = concurrency if concurrency is not None else obj.get("max_concurrency")
    record.update({
        "method": method,
        "target": target or builtin_name(info.get("target") or info.get("model_path") or obj.get("model_id")
                                         or obj.get("model")),
        "draft": builtin_name(info.get("draft") or info.get("speculative_draft_model_path")),
        "dataset": dataset or obj.get("dataset_name"),
        "concurrency": int(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) else cap,
        "max_concurrency": obj.get("max_concurrency"),
        "measured_concurrency": obj.get("concurrency"),
        "num_prompts": obj.get("num_prompts", obj.get("completed")),
        "accept_length": accept,
        "total_token_throughput": obj.get("total_token_throughput", obj.get("total_throughput")),
        "backend": obj.get("backend", "sglang"),
        "label": obj.get("tag") or obj.get("label"),
        "imported_from": source,
        "server_info": {k: info[k] for k in SERVER_INFO_KEEP if k in info},
    })
    if info.get("hardware") and "hardware" not in obj:
        record["hardware"] = info["hardware"]  # the fairness check compares it with the native rows'
    return record


def from_export(obj: dict[str, Any], *, method: str | None = None, dataset: str | None = None,
                target: str | None = None, concurrency: int | None = None,
                source: str | None = None) -> dict[str, Any]:
    """A record `adaflash runs export` wrote, for another workspace: its keys kept, its old ids as provenance."""
    record = {k: v for k, v in obj.items() if k not in ("result_id", "run_id", "content_hash")}
    record.update({"imported_from": source, "imported_run_id": obj.get("run_id"),
                   "imported_result_id": obj.get("result_id")})
    for key, value in (("method", method), ("dataset", dataset), ("target", target), ("concurrency", concurrency)):
        if value is not None:
            record[key] = value
    return record


def _result_objects(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(where, object) from a JSON array (`runs export --format json`) or JSON lines (bench_serving, jsonl)."""
    from adaflash.data.io import read_jsonl

    path = Path(path)
    if path.is_file():
        with path.open(encoding="utf-8") as handle:
            head = handle.read(4096).lstrip()
        if head.startswith("["):
            try:
                items = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ImportFormatError(f"{path}: not valid JSON ({err.msg})") from None
            yield from ((f"{path}[{i}]", item) for i, item in enumerate(items))
            return
    yield from read_jsonl(path, ImportFormatError)


def read_results(path: str | Path, **kw: Any) -> list[dict[str, Any]]:
    """Benchmark results to import: SGLang bench_serving lines, or records `adaflash runs export` wrote.

    Each record gets `content_hash` (of the line as read, before any option changed it), so the run log
    can tell a result it already holds; a line repeated within the file is kept once."""
    records, seen = [], set()
    for where, obj in _result_objects(path):
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{where}: expected a JSON object per result")
        digest = obj.get("content_hash") if isinstance(obj.get("content_hash"), str) else content_hash(obj)
        if digest in seen:
            continue
        seen.add(digest)
        convert = from_export if isinstance(obj.get("method"), str) and "result_id" in obj else from_sglang
        try:
            record = convert(obj, source=str(Path(path).resolve()), **kw)
        except ImportFormatError as err:
            raise ImportFormatError(f"{where}: {err}") from None
        record["content_hash"] = digest
        records.append(record)
    if not records:
        raise ImportFormatError(f"{path}: holds no results")
    return records


# -- picking results from the run log ---------------------------------------------------------------
def select_records(log: Any, run_ids: list[str] | None = None) -> tuple[list[dict[str, Any]], str]:
    """Records for RUN ids (a bench-matrix run brings every result it grouped); with none, the latest
    bench matrix, or every result when there is no matrix. Raises KeyError for an unknown run."""
    if not run_ids:
        latest = log.list_runs(kind="bench-matrix", limit=1)
        if not latest:
            return records_of(log.bench_results()), "all benchmark results"
        run_ids = [latest[0]["id"]]
    everything: list[dict[str, Any]] | None = None
    picked: dict[int, dict[str, Any]] = {}
    names = []
    for run_id in run_ids:
        run = log.get_run(run_id)
        names.append(run["id"])
        # A recipe run's benchmarks are recorded by the runs its jobs created (`bench matrix` in a job).
        family, seen = [run], set()
        while family:
            member = family.pop()
            if member["id"] in seen:
                continue
            seen.add(member["id"])
            own = records_of(log.bench_results([member["id"]]))
            if member.get("kind") == "bench-matrix":
                if everything is None:
                    everything = records_of(log.bench_results())
                own += [r for r in everything if r.get("matrix_run") == member["id"]]
            for record in own:
                picked[record["result_id"]] = record
            family += log.child_runs(member)
    return [picked[k] for k in sorted(picked)], ", ".join(names)
