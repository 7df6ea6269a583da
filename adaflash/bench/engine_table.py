"""How a `bench engine` run is shown: its table rows, and why rows that differ from Vanilla differ.

Apart from the run itself (engine_bench.py) because it reads only the records the run leaves.
"""

from __future__ import annotations

from typing import Any

from adaflash.methods import DFLASH, METHOD_NAMES, VANILLA

HF_GENERATE = "hf-generate"
HF_PROMPT_LOOKUP = "hf-prompt-lookup"


def table_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for the printed table: speed-up vs our Vanilla row of the same dataset (a suite's domain) and
    batch size, τ, lossless check. A suite's overall row shows its own speed-up: the mean over domains."""
    base = {_cell(r): r["output_throughput"] for r in records if r["method"] == VANILLA}
    order = {m: i for i, m in enumerate((*METHOD_NAMES, HF_GENERATE, HF_PROMPT_LOOKUP))}
    rows = []
    for r in sorted(records, key=lambda r: (r["concurrency"], str(r.get("dataset")),
                                            order.get(r["method"], len(order)))):
        vanilla = base.get(_cell(r))
        mismatches = r.get("mismatches")
        speedup = r.get("speedup") if r.get("aggregate") else (r["output_throughput"] / vanilla if vanilla else None)
        rows.append({
            "method": r["method"], "dataset": r.get("dataset"), "batch": r["concurrency"], "backend": r["backend"],
            "out tok/s": f"{r['output_throughput']:.1f}",
            "speed-up": f"{speedup:.2f}x" if speedup else None,
            "τ": None if r.get("accept_length") is None else f"{r['accept_length']:.2f}",
            "accept rate": None if r.get("accept_rate") is None else f"{100 * r['accept_rate']:.1f}%",
            "identical": (("ref" if r["method"] == VANILLA else None) if mismatches is None
                          else "yes" if mismatches == 0 else f"no ({mismatches}/{r['completed']})"),
            "tokens": r.get("total_output_tokens"),
            "wall s": f"{r['duration']:.2f}" if r.get("duration") is not None else None, "n": r["completed"],
        })
    return rows


def _cell(record: dict[str, Any]) -> tuple[Any, Any]:
    """What a row is compared within: its dataset (a suite's domain) and batch size."""
    return record.get("dataset"), record["concurrency"]


# `backend` stays in the rows (json/csv) but not in the table: the hf-* names already say it.
TABLE_COLUMNS = ["method", "dataset", "batch", "out tok/s", "speed-up", "τ", "accept rate", "identical", "tokens",
                 "wall s", "n"]


def mismatch_notes(records: list[dict[str, Any]]) -> list[str]:
    """One line per kind of row whose greedy output differs from Vanilla's, with the likely reason
    where the record shows one: bf16/fp16 without the batch-invariant kernels rounds a verify pass
    differently from a one-token pass, and transformers rounds its own way; otherwise a real loss."""
    half = ("bfloat16", "float16")
    notes = []
    differing = [r for r in records if r.get("mismatches")]
    rounding = [r for r in differing if r.get("backend") == "embedded" and r.get("dtype") in half
                and r.get("kernels") == "eager"]
    hf = [r for r in differing if r.get("backend") != "embedded" and r.get("dtype") in half]
    other = [r for r in differing if r not in rounding and r not in hf]
    if rounding:
        notes.append(f"greedy output differs from Vanilla for {_cells(rounding)}: {rounding[0]['dtype']} without the "
                     "batch-invariant kernels (a CPU, no Triton, or ADAFLASH_TRITON=0) rounds a verify pass unlike a "
                     "one-token pass, so near-ties part; float32, or a GPU with Triton, is exact")
    if hf:
        notes.append(f"greedy output differs from Vanilla for {_cells(hf)}: transformers rounds its own way in "
                     f"{hf[0]['dtype']}")
    if other:
        notes.append(f"greedy output differs from Vanilla for {_cells(other)} (see `identical`)")
    return notes


def _cells(records: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['method']}@b{r['concurrency']}" for r in records)


def speedup_breakdown(records: list[dict[str, Any]]) -> list[str]:
    """Where each speculative row's speed-up over Vanilla goes, from the engine's pass timings.

    Why: a speed-up below τ has three places to go, and they call for different work: a speculative
    step dearer than Vanilla's (`a step costs`), prefills, which take the same time in both and so a
    larger share of the faster run (`with prefills`), and host time between passes (`measured`).
    Rates are tokens per second of each part, so rows whose outputs differ compare fairly too.
    """
    vanilla = {_cell(r): r for r in records if r["method"] == VANILLA and r.get("passes")}
    lines = []
    for r in records:
        base = vanilla.get(_cell(r))
        if r["method"] == VANILLA or base is None or not r.get("passes") or r.get("backend") != "embedded":
            continue
        mine, ref = _pass_totals(r), _pass_totals(base)
        if not (mine["steps"] and ref["steps"] and mine["step_s"] and ref["step_s"]):
            continue
        step_cost = (mine["step_s"] / mine["steps"]) / (ref["step_s"] / ref["steps"])
        tokens, ref_tokens = r["total_output_tokens"], base["total_output_tokens"]
        steps_only = (tokens / mine["step_s"]) / (ref_tokens / ref["step_s"])
        with_prefills = (tokens / (mine["step_s"] + mine["prefill_s"])) / (ref_tokens / (ref["step_s"] + ref["prefill_s"]))
        measured = r["output_throughput"] / base["output_throughput"]
        host, ref_host = r["duration"] - mine["all_s"], base["duration"] - ref["all_s"]
        lines.append(f"{_name(r)}: a step costs {step_cost:.3f} of Vanilla's; steps alone "
                     f"{steps_only:.2f}x, with prefills {with_prefills:.2f}x, measured {measured:.2f}x "
                     f"(host time outside the passes {host:.2f} s against Vanilla's {ref_host:.2f} s)")
    return lines


def against_dflash(records: list[dict[str, Any]]) -> list[str]:
    """τ × throughput of each other drafter row over the DFlash row of the same batch size.

    Why: the pipeline comparison's measure (AdaFlash or OSD drafters against the offline DFlash drafter
    they started from, goal 1.15×) weighs τ, which saves verify work, and tokens per second together.
    """
    dflash = {_cell(r): r for r in records if r["method"] == DFLASH and r.get("accept_length")}
    lines = []
    for r in records:
        base = dflash.get(_cell(r))
        if base is None or r["method"] in (VANILLA, DFLASH) or not r.get("accept_length") \
                or r.get("backend") != "embedded" or not base.get("output_throughput"):
            continue
        tau, speed = r["accept_length"] / base["accept_length"], r["output_throughput"] / base["output_throughput"]
        lines.append(f"{_name(r)}: {tau * speed:.3f}x (τ {r['accept_length']:.2f} against "
                     f"{base['accept_length']:.2f}, throughput {speed:.3f}x)")
    return lines


def by_position(records: list[dict[str, Any]]) -> list[str]:
    """Per speculative row, the share of steps that accepted each drafted position among those that
    reached it: the first positions are where a drafter gains the most per step."""
    lines = []
    for r in records:
        shares = r.get("accept_by_position")
        if r["method"] == VANILLA or not shares:
            continue
        lines.append(f"{_name(r)}: " + " ".join("-" if share is None else f"{share:.2f}" for share in shares))
    return lines


def _name(record: dict[str, Any]) -> str:
    where = f" on {record['dataset']}" if record.get("domain") or record.get("aggregate") else ""
    return f"{record['method']}@b{record['concurrency']}{where}"


def _pass_totals(record: dict[str, Any]) -> dict[str, float]:
    """Decode-step count and seconds (every kind but prefill), prefill seconds, and all pass seconds."""
    passes = record["passes"]
    steps = {kind: p for kind, p in passes.items() if kind != "prefill"}
    return {"steps": sum(p["steps"] for p in steps.values()), "step_s": sum(p["seconds"] for p in steps.values()),
            "prefill_s": passes.get("prefill", {}).get("seconds", 0.0),
            "all_s": sum(p["seconds"] for p in passes.values())}
