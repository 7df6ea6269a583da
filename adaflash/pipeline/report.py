"""The report of a pipeline run (`adaflash pipeline status`): run log + swap dir, no torch.

What it answers, each from records the workers keep per flush, per step or per version:
- τ per drafter version: mean over the requests that version finished (`served_*` rows of the
  inference worker, by their `version`), with n and the token-weighted τ beside it;
- inference output tokens/s while the trainers were stepping (their first to last step) and
  outside that span (`window_tokens` / `window_seconds` of each flush, split by overlap);
- training tokens/s per rank (`rank{r}_tokens` / `rank{r}_seconds` of every step);
- publish → hot-swap time of each version (`published_at` of its checkpoint, the time of the
  inference worker's `swapped_version` row); versions superseded before the worker looked are
  marked skipped;
- integrity: the buffer rows up to the last consumed offset against the consumption ledger
  (what each rank took at each step): rows missing, rows taken twice, ids repeated in the buffer.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from adaflash.pipeline.buffer import BUFFER_FILE, SwapBuffer
from adaflash.pipeline.ledger import LEDGER_FILE, ConsumeLedger
from adaflash.runlog import RunLog

RANK_METRIC = re.compile(r"^rank(\d+)_(samples|tokens|seconds)$")
SERVED = ("served_requests", "served_tau_sum", "served_tokens", "served_verify")


def _records(rows: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    """Rows written by one `log_metrics` call (same job, step and time) folded into one dict, oldest first."""
    out: dict[tuple[Any, Any], dict[str, Any]] = {}
    for row in rows:
        if row["job"] != job:
            continue
        record = out.setdefault((row["step"], row["time"]), {"step": row["step"], "time": row["time"]})
        record[row["name"]] = row["value"]
    return list(out.values())


def tau_by_window(log: RunLog, run_id: str) -> list[dict[str, Any]]:
    """Mean τ and throughput of the inference worker's flush windows per drafter version (older runs)."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    rows = log.metrics_since(0, run_id=run_id, names=["tau", "tokens_per_s", "drafter_version", "samples"])
    for values in _records(rows, "inference"):
        if "drafter_version" in values and "tau" in values:
            grouped.setdefault(int(values["drafter_version"]), []).append(values)
    return [{"drafter_version": v, "tau": sum(x["tau"] for x in xs) / len(xs),
             "tokens_per_s": sum(x["tokens_per_s"] for x in xs) / len(xs), "samples": int(max(x["samples"] for x in xs))}
            for v, xs in sorted(grouped.items())]


def _versions(rows: list[dict[str, Any]], checkpoints: list[dict[str, Any]], started: float) -> list[dict[str, Any]]:
    served: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["job"] == "inference" and row["name"] in SERVED and row.get("version") is not None:
            acc = served.setdefault(int(row["version"]), dict.fromkeys(SERVED, 0.0))
            acc[row["name"]] += row["value"]
    published: dict[int, float] = {}
    for ckpt in checkpoints:
        if ckpt.get("kind") == "drafter" and ckpt.get("version") is not None:
            metrics = ckpt.get("metrics") if isinstance(ckpt.get("metrics"), dict) else {}
            published.setdefault(int(ckpt["version"]), float(metrics.get("published_at") or ckpt["time"]))
    swapped: dict[int, float] = {}
    for row in rows:
        if row["job"] == "inference" and row["name"] == "swapped_version":
            swapped.setdefault(int(row["value"]), row["time"])
    newest_swap = max(swapped, default=0)
    out = []
    for version in sorted(set(served) | set(published) | set(swapped)):
        acc = served.get(version)
        n = int(acc["served_requests"]) if acc else 0
        pub, swap = published.get(version), swapped.get(version)
        if version == 0:
            state = "initial"
        elif swap is not None:
            state = "swapped"
        elif pub is not None and version < newest_swap:
            state = "skipped"  # a newer version was already out when the worker looked
        elif pub is not None:
            state = "not swapped"
        else:
            state = "loaded at start"
        out.append({
            "drafter_version": version,
            "requests": n,
            "tau": acc["served_tau_sum"] / n if n else None,
            "tau_tokens": acc["served_tokens"] / acc["served_verify"] if acc and acc["served_verify"] else None,
            "output_tokens": int(acc["served_tokens"]) if acc else 0,
            "published_s": pub - started if pub is not None else None,
            "swapped_s": swap - started if swap is not None else None,
            "publish_to_swap_s": swap - pub if pub is not None and swap is not None else None,
            "swap": state,
        })
    return out


def _training(records: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [r for r in records if "train_tokens" in r]
    world = int(max((r["world_size"] for r in records if "world_size" in r), default=0)) or None
    ranks: dict[int, dict[str, float]] = {}
    for record in steps:
        for name, value in record.items():
            match = RANK_METRIC.match(str(name))
            if match:
                acc = ranks.setdefault(int(match.group(1)), {"samples": 0.0, "tokens": 0.0, "seconds": 0.0})
                acc[match.group(2)] += value
    compute = sum(r.get("step_compute_seconds", 0.0) for r in steps)
    tokens = sum(r["train_tokens"] for r in steps)
    span = (min(r["time"] - r.get("step_compute_seconds", 0.0) for r in steps), max(r["time"] for r in steps)) \
        if steps else None
    return {
        "world_size": world or (len(ranks) or None),
        "steps": len(steps),
        "samples": int(sum(r.get("train_samples", 0.0) for r in steps)),
        "tokens": int(tokens),
        "tokens_per_s": tokens / compute if compute else None,
        "peak_memory_gib": _peak(records),
        "span": span,
        "ranks": [{"rank": r, "samples": int(a["samples"]), "tokens": int(a["tokens"]), "seconds": a["seconds"],
                   "tokens_per_s": a["tokens"] / a["seconds"] if a["seconds"] else None}
                  for r, a in sorted(ranks.items())],
    }


def _inference(records: list[dict[str, Any]], span: tuple[float, float] | None) -> dict[str, Any]:
    windows = [r for r in records if "window_tokens" in r and "window_seconds" in r]
    beside = {"tokens": 0.0, "seconds": 0.0}
    alone = {"tokens": 0.0, "seconds": 0.0}
    for w in windows:
        end, seconds, tokens = w["time"], w["window_seconds"], w["window_tokens"]
        begin = end - seconds
        overlap = max(0.0, min(end, span[1]) - max(begin, span[0])) if span else 0.0
        share = overlap / seconds if seconds > 0 else 0.0
        beside["tokens"] += tokens * share
        beside["seconds"] += seconds * share
        alone["tokens"] += tokens * (1 - share)
        alone["seconds"] += seconds * (1 - share)
    total_tokens = beside["tokens"] + alone["tokens"]
    total_seconds = beside["seconds"] + alone["seconds"]
    return {
        "tokens_per_s_beside_training": beside["tokens"] / beside["seconds"] if beside["seconds"] else None,
        "seconds_beside_training": beside["seconds"],
        "tokens_per_s_without_training": alone["tokens"] / alone["seconds"] if alone["seconds"] else None,
        "seconds_without_training": alone["seconds"],
        "tokens_per_s": total_tokens / total_seconds if total_seconds else None,
        "output_tokens": int(total_tokens),
        "peak_memory_gib": _peak(records),
    }


def _peak(records: list[dict[str, Any]]) -> float | None:
    """A worker's peak GPU memory (its allocator's), None on a CPU."""
    return max((r["peak_memory_gib"] for r in records if r.get("peak_memory_gib") is not None), default=None)


def check_integrity(swap_dir: str | Path) -> dict[str, Any]:
    """No sample lost or repeated between buffer and trainers: the ledger against the buffer."""
    root = Path(swap_dir)
    if not (root / BUFFER_FILE).exists():
        return {"checked": False, "reason": f"no buffer at {root / BUFFER_FILE}"}
    if not (root / LEDGER_FILE).exists():
        return {"checked": False, "reason": f"no consumption ledger at {root / LEDGER_FILE} (nothing consumed yet, "
                                            "or a run from before the ledger existed)"}
    entries = ConsumeLedger(root).entries()
    buffer = SwapBuffer(root)
    final = max((int(e["to"]) for e in entries), default=0)
    taken = Counter(int(seq) for e in entries for shard in e["ranks"] for seq in shard)
    try:
        held = buffer.read(0, final)
    except ValueError as err:
        return {"checked": False, "reason": f"buffer unreadable: {err}"}
    expected = {int(r["seq"]) for r in held}
    missing = sorted(expected - set(taken))
    repeated = sorted(seq for seq, count in taken.items() if count > 1)
    unknown = sorted(set(taken) - expected)
    ids = Counter(r["id"] for r in held if r.get("id") is not None)
    pointer_path = root / "weights" / "LATEST"
    published = None
    if pointer_path.exists():
        try:
            published = json.loads(pointer_path.read_text()).get("consumed")
        except json.JSONDecodeError:
            published = None
    report = {
        "checked": True,
        "buffer_rows": buffer.count(),
        "final_consumed_offset": final,
        "published_consumed": published,
        "steps": len(entries),
        "consumed": sum(taken.values()),
        "distinct": len(taken),
        "unusable": sum(len(e.get("unusable", [])) for e in entries),
        "missing": len(missing),
        "duplicated": sum(taken[s] - 1 for s in repeated),
        "not_in_buffer": len(unknown),
        "duplicate_ids_in_buffer": sum(c - 1 for c in ids.values() if c > 1),
        "unconsumed": buffer.count() - final,
        "missing_seqs": missing[:20],
        "duplicated_seqs": repeated[:20],
    }
    report["ok"] = (report["missing"] == 0 and report["duplicated"] == 0 and report["not_in_buffer"] == 0
                    and report["duplicate_ids_in_buffer"] == 0 and len(held) == final)
    return report


def pipeline_report(log: RunLog, run: dict[str, Any], *, integrity: bool = True) -> dict[str, Any]:
    rid = run["id"]
    rows = log.metrics_since(0, run_id=rid)
    started = float(run.get("created_at") or 0.0)
    training = _training(_records(rows, "training"))
    span = training.pop("span")
    versions = _versions(rows, log.checkpoints(rid), started)
    if not any(v["requests"] for v in versions):  # a run from before per-version records
        for old in tau_by_window(log, rid):
            versions.append({"drafter_version": old["drafter_version"], "requests": None, "tau": old["tau"],
                             "swap": "window mean"})
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    swap_dir = config.get("swap_dir")
    latest = log.last_metrics(rid)
    return {
        "run": rid,
        "status": run["status"],
        "note": run.get("note"),
        "method": run.get("method"),
        "infer_gpus": config.get("infer_gpus"),
        "train_gpus": config.get("train_gpus"),
        "swap_dir": swap_dir,
        "versions": versions,
        "inference": _inference(_records(rows, "inference"), span),
        "training": {**training, "span_seconds": span[1] - span[0] if span else None},
        "integrity": (check_integrity(swap_dir) if swap_dir else {"checked": False, "reason": "no swap dir recorded"})
        if integrity else {"checked": False, "reason": "not asked"},
        "latest": {"published_version": latest.get("published_version"), "buffer_depth": latest.get("buffer_depth"),
                   "samples": latest.get("samples"), "consumed": latest.get("consumed")},
    }
