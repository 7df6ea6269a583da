"""The picture of a traffic shift: τ over time, the switch of domain marked, each drafter swap ticked.

Traffic τ is a rolling window over the requests that finished (tokens over verify steps of the last
`window`); held-out τ is one point per round of prompts the server never trains on. The file type
follows the extension (.svg or .png).
"""

from __future__ import annotations

from pathlib import Path

from adaflash.bench.shift import ShiftResult, probe_rounds, tau


def rolling_tau(result: ShiftResult, window: int = 16) -> list[tuple[float, float]]:
    traffic = sorted((s for s in result.samples if not s.holdout and s.error is None), key=lambda s: s.end)
    points = []
    for i in range(len(traffic)):
        value = tau(traffic[max(0, i - window + 1): i + 1])
        if value is not None:
            points.append((traffic[i].end, value))
    return points


def plot_shift(result: ShiftResult, path: str | Path, *, title: str = "") -> Path:
    from adaflash.extras import require

    require("matplotlib", "plots").use("Agg")  # files only, never a window
    plt = require("matplotlib.pyplot", "plots")

    path = Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise ValueError(f"{path}: the plot is written as .svg or .png")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    points = rolling_tau(result)
    if points:
        ax.plot([t / 60 for t, _ in points], [v for _, v in points], lw=1.2, color="tab:blue",
                label="traffic τ (last 16 requests)")
    colors = ("tab:orange", "tab:green", "tab:red", "tab:purple")
    for i, (_, name) in enumerate(result.switches):
        rounds = [(t, v) for t, v in probe_rounds(result.samples, name) if v is not None]
        if rounds:
            ax.plot([t / 60 for t, _ in rounds], [v for _, v in rounds], "o-", ms=4, color=colors[i % len(colors)],
                    label=f"held-out {name} τ")
    for when, name in result.switches[1:]:
        ax.axvline(when / 60, color="black", ls="--", lw=1)
        ax.annotate(f"→ {name}", (when / 60, 1.0), xycoords=("data", "axes fraction"), xytext=(4, -14),
                    textcoords="offset points")
    for when, version in result.swaps[1:]:
        ax.axvline(when / 60, ymax=0.04, color="gray", lw=1)
        ax.annotate(f"v{version}", (when / 60, 0.05), xycoords=("data", "axes fraction"), fontsize=7, color="gray",
                    ha="center")
    ax.set_xlabel("minutes")
    ax.set_ylabel("acceptance length τ")
    ax.set_title(title or "τ through a traffic shift (ticks: drafter swaps)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
