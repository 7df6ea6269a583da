"""Monitor: τ and throughput over time, τ per drafter version, training losses and buffer depth,
read incrementally (rows after the last id seen) while other processes write the run log."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Static
from textual_plotext import PlotextPlot

from tui.actions import bindings_for
from tui.backend import MetricsBatch
from tui.monitor_model import CHARTS, MonitorModel, fmt, spark
from tui.panes.base import Pane
from tui.widgets import Col, FitTable

MAX_LINES = 4  # series per chart
# The narrow terminal keeps the version, its requests and τ; the metric, its last value and its trend.
VERSION_COLUMNS = [Col("version", "version"), Col("requests", "requests", 1), Col("tau", "τ"),
                   Col("tau_tokens", "τ tokens", 4), Col("tps", "tok/s", 2), Col("samples", "samples", 3)]
METRIC_COLUMNS = [Col("metric", "metric"), Col("last", "last"), Col("mean", "mean", 2), Col("min", "min", 3),
                  Col("max", "max", 4), Col("n", "n", 5), Col("trend", "trend", 1)]
# Fixed line colours (the theme's blue, amber, green, red): the same chart always looks the same.
LINE_COLORS = ((95, 168, 211), (242, 184, 75), (123, 198, 123), (229, 98, 94))


class MonitorPane(Pane):
    SCOPE = "monitor"
    INTERVAL = 1.0
    BINDINGS = bindings_for("monitor")

    class Progress(Message):
        """The progress line changed (Jobs shows it too: a launch lands there)."""

        def __init__(self, run_id: str | None, line: str) -> None:
            super().__init__()
            self.run_id, self.line = run_id, line

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.progress_shown = ""
        self.model = MonitorModel()
        self.drawn = -1  # the model generation on screen
        # Bumped by every reset: a read begun before it carries old cursors and must not land in the
        # fresh model (it would move the cursors past everything older, losing the run's history).
        self.epoch = 0

    def compose(self) -> ComposeResult:
        yield Static("No run yet: launch one (2) or open one from History (6).", id="monitor-header",
                     classes="pane-status")
        yield Static("", id="monitor-progress", classes="hidden")
        with VerticalScroll(id="monitor-body"):
            with Grid(id="charts"):
                for i in range(len(CHARTS)):
                    yield PlotextPlot(id=f"chart-{i}", classes="chart" if i < 2 else "chart chart-secondary")
            yield from self._tables()

    def _tables(self) -> ComposeResult:
        with Horizontal(id="monitor-tables"):
            versions = FitTable(VERSION_COLUMNS, id="versions", cursor_type="row", zebra_stripes=True)
            versions.border_title = "τ per drafter version"
            yield versions
            yield FitTable(METRIC_COLUMNS, id="metrics", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.model.reset(self.adaflash.current_run_id)

    # -- run selection ------------------------------------------------------------------------------
    def set_run(self, run_id: str | None) -> None:
        if run_id == self.model.run_id:
            return
        self._reset(run_id)

    def action_reload(self) -> None:
        self._reset(self.model.run_id)

    def _reset(self, run_id: str | None) -> None:
        self.epoch += 1
        self.model.reset(run_id)
        self.drawn = -1
        self.redraw()
        self.refresh_data()

    # -- reading --------------------------------------------------------------------------------------
    def request(self) -> Any:
        if not self.model.run_id:
            return None
        return self.model.run_id, dict(self.model.cursors), self.epoch

    def read(self, request: Any) -> MetricsBatch:
        run_id, cursors, _epoch = request
        return self.adaflash.backend.metrics(run_id, cursors)

    def apply(self, request: Any, batch: MetricsBatch) -> None:
        if request[0] != self.model.run_id or request[2] != self.epoch:
            return
        self.model.ingest(request[0], batch.sources, batch.rows, batch.statuses)
        if batch.more:
            self._again = True  # catching up on a large log: read the next page at once,
            self._header()  # and draw the charts once caught up
        elif self.is_visible_pane():
            self.redraw()
        else:
            self._header()

    def failed(self, request: Any, error: BaseException) -> None:
        self.query_one("#monitor-header", Static).update(f"[red]cannot read the metrics: {error}[/red]")

    # -- drawing ------------------------------------------------------------------------------------
    def is_visible_pane(self) -> bool:
        return self.adaflash.active_tab == self.SCOPE

    def on_show_pane(self) -> None:
        self.redraw()

    def _header(self) -> None:
        model = self.model
        header = self.query_one("#monitor-header", Static)
        progress = self.query_one("#monitor-progress", Static)
        line = model.progress()
        progress.update(line)
        progress.set_class(not line, "hidden")
        if line != self.progress_shown:
            self.progress_shown = line
            self.post_message(self.Progress(model.run_id, line))
        if not model.run_id:
            header.update("No run yet: launch one (2) or open one from History (6).")
            return
        text = Text.assemble(("run ", "dim"), (model.run_id, "bold"), f"  {model.rows_seen:,} metric rows",
                             (f"  {len(model.series)} series · x: seconds since the first metric", "dim"))
        children = [label for label in model.sources.values() if label]
        if children:
            text.append(f"  (with runs of {', '.join(sorted(set(children)))})", style="dim")
        if not model.rows_seen:
            text.append("  waiting for the first metrics (the workers load their models)…", style="yellow")
        elif self._again:
            text.append("  catching up…", style="yellow")
        header.update(text)

    def redraw(self) -> None:
        """Charts and tables from the model, only when it changed since the last draw."""
        self._header()
        model = self.model
        if model.generation == self.drawn:
            return
        self.drawn = model.generation
        for i, (title, names, right_names) in enumerate(CHARTS):
            plot = self.query_one(f"#chart-{i}", PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.title(title)
            lines = [(*line, "left") for line in model.chart(names)]
            lines += [(*line, "right") for line in model.chart(right_names)]
            lines = lines[:MAX_LINES]
            for (label, xs, ys, side), color in zip(lines, LINE_COLORS):
                plt.plot(xs, ys, label=label, marker="braille", color=color, yside=side)
            if not lines:  # τ comes with the first finished answer (flushed at once); say so while it is under way
                waiting = i == 0 and model.progress() and model.ended() is None
                plt.title(f"{title}: {'with the first answer' if waiting else 'no data yet'}")
            plot.refresh()
        table = model.version_table()
        versions = self.query_one("#versions", FitTable)
        windows = any(not v.per_request for v in table)
        versions.border_title = "τ per drafter version" + (" (flush-window means)" if windows else "")
        versions.border_subtitle = "τ: mean per request" if table and not windows else ""
        versions.show([(f"{v.source}:{v.version}", {
            "version": model.label(v, f"v{v.version}"), "requests": str(v.requests) if v.per_request else "N/A",
            "tau": fmt(v.tau), "tau_tokens": fmt(v.tau_tokens), "tps": fmt(v.tokens_per_s), "samples": fmt(v.samples),
        }) for v in table])
        metrics = self.query_one("#metrics", FitTable)
        metrics.border_title = "latest metrics"
        metrics.show([(f"{s.source}:{s.name}", {
            "metric": model.label(s, s.name), "last": fmt(s.last), "mean": fmt(s.mean), "min": fmt(s.low),
            "max": fmt(s.high), "n": str(s.count), "trend": Text(spark(v for _, v in s.points), style="cyan"),
        }) for s in model.table()])

    def focus_primary(self) -> None:
        self.query_one("#monitor-body").focus()
