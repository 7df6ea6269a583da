"""How a `bench engine` run is shown: its table rows, and why rows that differ from Vanilla differ.

Apart from the run itself (engine_bench.py) because it reads only the records the run leaves.
"""

from __future__ import annotations

from typing import Any

from adaflash.engine.params import METHODS

HF_GENERATE = "hf-generate"
HF_PROMPT_LOOKUP = "hf-prompt-lookup"


def table_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for the printed table: speed-up vs our Vanilla row of the same batch size, τ, lossless check."""
    base = {r["concurrency"]: r["output_throughput"] for r in records if r["method"] == "vanilla"}
    order = {m: i for i, m in enumerate((*METHODS, HF_GENERATE, HF_PROMPT_LOOKUP))}
    rows = []
    for r in sorted(records, key=lambda r: (r["concurrency"], order.get(r["method"], len(order)))):
        vanilla = base.get(r["concurrency"])
        mismatches = r.get("mismatches")
        rows.append({
            "method": r["method"], "batch": r["concurrency"], "backend": r["backend"],
            "out tok/s": f"{r['output_throughput']:.1f}",
            "speed-up": f"{r['output_throughput'] / vanilla:.2f}x" if vanilla else None,
            "τ": None if r.get("accept_length") is None else f"{r['accept_length']:.2f}",
            "accept rate": None if r.get("accept_rate") is None else f"{100 * r['accept_rate']:.1f}%",
            "identical": (("ref" if r["method"] == "vanilla" else None) if mismatches is None
                          else "yes" if mismatches == 0 else f"no ({mismatches}/{r['completed']})"),
            "tokens": r["total_output_tokens"], "wall s": f"{r['duration']:.2f}", "n": r["completed"],
        })
    return rows


# `backend` stays in the rows (json/csv) but not in the table: the hf-* names already say it.
TABLE_COLUMNS = ["method", "batch", "out tok/s", "speed-up", "τ", "accept rate", "identical", "tokens", "wall s", "n"]


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
