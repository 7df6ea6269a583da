"""The picture of a verify-cost curve: ms per pass and the ratio to the narrowest pass, against k, per batch.

The file type follows the extension (.png or .svg).
"""

from __future__ import annotations

from pathlib import Path

from adaflash.bench.cost import CostResult


def plot_cost(result: CostResult, path: str | Path) -> Path:
    from adaflash.extras import require

    require("matplotlib", "plots").use("Agg")  # files only, never a window
    plt = require("matplotlib.pyplot", "plots")

    path = Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise ValueError(f"{path}: the plot is written as .svg or .png")
    spec = result.spec
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for batch in spec.batch_sizes:
        cells = [result.cell(batch, width) for width in spec.widths]
        left.plot(spec.widths, [c["ms"] for c in cells], "o-", ms=4, label=f"batch {batch}")
        right.plot(spec.widths, [c["ratio"] for c in cells], "o-", ms=4, label=f"batch {batch}")
    for row in result.roofline():
        if row["floor_ms"] is not None:
            left.axhline(row["floor_ms"], color="gray", lw=0.8, ls=":")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(spec.widths, [str(w) for w in spec.widths])
        ax.set_xlabel("tokens verified per row (k)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("ms per target pass")
    left.set_title("cost of one pass" + (" (dotted: memory floor of k=1)" if result.bandwidth_gbs else ""))
    right.set_ylabel(f"ratio to k={min(spec.widths)} at the same batch")
    right.set_title("verify cost against a decode step")
    fig.suptitle(f"{spec.target} · {result.hardware} · {result.dtype} · context {spec.context}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
