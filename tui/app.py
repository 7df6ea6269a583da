"""adaflash-tui: the Textual dashboard over `jobs` and the run log.

Eight tabs (GPUs, Launch, Jobs, Monitor, Compare, History, Procs, SQL), one registry of actions behind the
keys, the footer, the help screen and the command palette, and a quit that asks what to do
with runs still going (they are detached: leaving them is safe, the next start shows them).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import App, ComposeResult, SystemCommand
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.theme import Theme
from textual.widget import MountError, Widget
from textual.widgets import Footer, Header, TabbedContent, TabPane

from tui.actions import BY_ID, REGISTRY, SCOPE_TITLES, TABS, Command, bindings_for
from tui.backend import Backend, InventoryLike
from tui.modals import HelpScreen, QuitScreen
from tui.panes.base import Pane

if TYPE_CHECKING:
    from jobs.rerun import Relaunch
    from tui.panes.gpus import GpusPane
    from tui.panes.monitor import MonitorPane

# Each tab's pane, imported when it is first shown or mounted: the first paint imports only its own.
PANES: dict[str, tuple[str, str]] = {
    "gpus": ("tui.panes.gpus", "GpusPane"), "launch": ("tui.panes.launch", "LaunchPane"),
    "jobs": ("tui.panes.jobs", "JobsPane"), "monitor": ("tui.panes.monitor", "MonitorPane"),
    "compare": ("tui.panes.compare", "ComparePane"), "history": ("tui.panes.history", "HistoryPane"),
    "procs": ("tui.panes.procs", "ProcsPane"), "query": ("tui.panes.query", "QueryPane"),
}


def pane_class(tab: str) -> type[Pane]:
    module, name = PANES[tab]
    return getattr(importlib.import_module(module), name)


class LazyPane(Widget):
    """Stands in for a tab's pane until the first paint is done, then imports and mounts it in its place
    (textual's Lazy takes a built widget, whose module is then imported before the first paint)."""

    DEFAULT_CSS = "LazyPane { display: none; }"

    def __init__(self, tab: str) -> None:
        super().__init__()
        self.tab = tab

    def on_mount(self) -> None:
        self.call_after_refresh(self._replace)

    async def _replace(self) -> None:
        parent = self.parent
        if not isinstance(parent, Widget) or not parent.is_attached:
            return
        try:
            await parent.mount(pane_class(self.tab)(id=f"{self.tab}-pane"), after=self)
        except MountError:
            return  # the app quit before its first refresh was over
        await self.remove()

DARK = Theme(
    name="adaflash", primary="#5FA8D3", secondary="#9D7CD8", accent="#F2B84B", warning="#F2B84B",
    error="#E5625E", success="#7BC67B", foreground="#D8DEE9", background="#11151C", surface="#171C25",
    panel="#202733", dark=True,
)
LIGHT = Theme(
    name="adaflash-light", primary="#1F6FA8", secondary="#6A4FB3", accent="#B7791F", warning="#B7791F",
    error="#C53030", success="#2F855A", foreground="#1A202C", background="#F7F9FC", surface="#EEF2F7",
    panel="#DDE3EC", dark=False,
)


class RegistryCommands(Provider):
    """The command palette over the registry: the active tab's actions first, then the rest."""

    def _ordered(self) -> list[Command]:
        app = self.app
        active = getattr(app, "active_tab", "")
        return sorted((c for c in REGISTRY if c.palette),
                      key=lambda c: (c.scope not in (active, "app"), c.scope != active, REGISTRY.index(c)))

    def _text(self, command: Command) -> str:
        return f"{SCOPE_TITLES[command.scope]}: {command.description}"

    def _runs(self) -> list[dict[str, Any]]:
        """Runs the History tab already read (no I/O here): the palette can open any of them."""
        history = self.app.pane("history")  # type: ignore[attr-defined]
        return list(history.runs) if history is not None else []

    async def discover(self) -> Hits:
        for command in self._ordered():
            yield DiscoveryHit(self._text(command), partial(self.app.run_command, command.id),  # type: ignore[attr-defined]
                               help=f"key {command.key_display}")

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in self._ordered():
            text = self._text(command)
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(self.app.run_command, command.id),  # type: ignore[attr-defined]
                          text=text, help=f"key {command.key_display}")
        for run in self._runs():
            text = f"Open run {run['id']} ({run.get('name') or run.get('kind')}, {run.get('status')})"
            score = matcher.match(text)
            if score > 0:
                yield Hit(score * 0.9, matcher.highlight(text), partial(self.app.open_run, run["id"]),  # type: ignore[attr-defined]
                          text=text, help="Jobs and Monitor follow it")


class AdaflashApp(App[None]):
    """The dashboard. `inventory` and `run_ids` are for tests (a fake GPU inventory, fixed ids)."""

    TITLE = "adaflash"
    CSS_PATH = "app.tcss"
    BINDINGS = bindings_for("app")
    COMMANDS = App.COMMANDS | {RegistryCommands}

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's own, less its Quit: the registry's asks about running jobs (two entries named Quit)."""
        yield from (command for command in super().get_system_commands(screen) if command.title != "Quit")
    ENABLE_COMMAND_PALETTE = True
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-tiny"), (30, "-short"), (36, "-tall")]

    current_run_id: reactive[str | None] = reactive(None, init=False)

    class QuitChecked(Message):
        def __init__(self, runs: list[dict[str, Any]]) -> None:
            super().__init__()
            self.runs = runs

    class Stopped(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class StartRun(Message):
        def __init__(self, run_id: str | None) -> None:
            super().__init__()
            self.run_id = run_id

    def __init__(self, workspace: str | Path, *, inventory: InventoryLike | None = None, live: bool = True,
                 interval_scale: float = 1.0, run_id: str | None = None, tab: str = "gpus",
                 run_ids: Callable[[], str] | None = None) -> None:
        super().__init__()
        self.workspace = Path(workspace)
        self.backend = Backend(self.workspace, inventory=inventory, run_ids=run_ids)
        self.live = live
        self.interval_scale = interval_scale
        self.launched: list[str] = []
        self.panes: dict[str, Pane] = {}
        self.snapshot: Any = None  # the GPU inventory's latest snapshot
        self._initial_run = run_id
        self._initial_tab = tab if tab in PANES else "gpus"
        self._quitting = False
        self._tabs: TabbedContent | None = None
        self.register_theme(DARK)
        self.register_theme(LIGHT)
        self.theme = "adaflash"
        self.sub_title = str(self.workspace)

    def compose(self) -> ComposeResult:
        yield Header(icon="⚡")
        with TabbedContent(id="tabs", initial=self._initial_tab):
            for tab, title, key in TABS:
                with TabPane(f"{title} {key}", id=tab):
                    # Only the tab shown first is in the first paint; the others mount right after it.
                    yield pane_class(tab)(id=f"{tab}-pane") if tab == self._initial_tab else LazyPane(tab)
        yield Footer()

    def on_mount(self) -> None:
        if self._initial_run:
            self.current_run_id = self._initial_run
        else:  # after the first paint: the read imports the run log, which the first screen does not wait for
            self.call_after_refresh(self.run_worker, self._find_initial_run, thread=True, group="init",
                                    name="initial run", exit_on_error=False)
        self.call_after_refresh(self._focus_pane, self._initial_tab)

    def _find_initial_run(self) -> None:
        try:
            run_id = self.backend.initial_run()
        except Exception:  # noqa: BLE001 - an unreadable log shows in the panes themselves
            run_id = None
        self.post_message(self.StartRun(run_id))

    def on_adaflash_app_start_run(self, message: AdaflashApp.StartRun) -> None:
        if message.run_id and self.current_run_id is None:
            self.current_run_id = message.run_id

    def on_unmount(self) -> None:
        self.backend.close()

    # -- state shared by the panes ----------------------------------------------------------------------
    def pane(self, tab: str) -> Any:
        """The pane of a tab, or None in the instant before a lazy pane is mounted."""
        return self.panes.get(tab)

    def register_pane(self, pane: Pane) -> None:
        """Panes announce themselves once mounted (no DOM query on every lookup)."""
        self.panes[pane.SCOPE] = pane

    @property
    def active_tab(self) -> str:
        if self._tabs is None:
            found = self.query("#tabs").results(TabbedContent)
            self._tabs = next(iter(found), None)
        return self._tabs.active if self._tabs is not None else ""

    def watch_current_run_id(self, run_id: str | None) -> None:
        self.sub_title = f"{self.workspace} · run {run_id}" if run_id else str(self.workspace)
        for tab in ("jobs", "monitor"):
            pane = self.pane(tab)
            if pane is not None:  # else it takes the run when it mounts
                pane.set_run(run_id)

    def run_launched(self, run_id: str) -> None:
        self.launched.append(run_id)
        self.current_run_id = run_id
        self.show_tab("jobs")
        self.notify(f"Launched run {run_id} (detached: it goes on if you quit)")

    def open_run(self, run_id: str) -> None:
        """Follow a run: Jobs and Monitor show it."""
        self.current_run_id = run_id
        self.show_tab("jobs")

    def open_compare(self, run_ids: list[str] | None) -> None:
        pane = self.pane("compare")
        if pane is not None:
            pane.set_runs(run_ids)
        self.show_tab("compare")

    def load_recipe(self, path: str) -> None:
        """Launch shows this recipe (a past run's), planned afresh: check it, then launch it again."""
        pane = self.pane("launch")
        if pane is not None:
            pane.load_recipe(path)
        self.show_tab("launch")

    def load_relaunch(self, relaunch: Relaunch) -> None:
        """Launch shows a past run (its recipe, or the form filled from its record) to edit and launch again."""
        pane = self.pane("launch")
        if pane is not None:
            pane.load_relaunch(relaunch)
        self.show_tab("launch")

    def use_cpu_workers(self) -> None:
        pane = self.pane("launch")
        if pane is not None:
            pane.set_all_cpu()
        self.show_tab("launch")

    def on_gpus_pane_snapshot_taken(self, message: GpusPane.SnapshotTaken) -> None:
        self.snapshot = message.snapshot
        pane = self.pane("launch")
        if pane is not None:  # else it reads app.snapshot when it mounts
            pane.set_snapshot(message.snapshot)

    def on_monitor_pane_progress(self, message: MonitorPane.Progress) -> None:
        jobs = self.pane("jobs")
        if jobs is not None:
            jobs.show_progress(message.run_id, message.line)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id or ""
        pane = self.pane(tab) if tab in PANES else None
        if pane is not None:
            pane.on_show_pane()
            pane.refresh_data()

    # -- actions (the registry's app scope) ----------------------------------------------------------------
    def show_tab(self, tab: str) -> None:
        if tab not in PANES:
            return
        # A focused widget in the pane being hidden would hand focus to a sibling, and Textual then
        # switches back to the tab holding it: drop focus first, the new pane takes it after refresh.
        self.screen.set_focus(None)
        self.query_one("#tabs", TabbedContent).active = tab
        self.call_after_refresh(self._focus_pane, tab)

    def _focus_pane(self, tab: str) -> None:
        """Focus the pane's primary widget, unless the user moved focus into the pane meanwhile (a Tab
        pressed before this refresh): taking it back would send the next keys to the previous field."""
        pane = self.pane(tab)
        if pane is None or self.active_tab != tab:
            return
        focused = self.focused
        if focused is not None and pane in focused.ancestors:
            return
        pane.focus_primary()

    def action_show_tab(self, tab: str) -> None:
        self.show_tab(tab)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_refresh_all(self) -> None:
        for tab in PANES:
            pane = self.pane(tab)
            if pane is not None:
                pane.refresh_data()

    def action_toggle_theme(self) -> None:
        self.theme = "adaflash-light" if self.theme == "adaflash" else "adaflash"  # not a method

    async def run_command(self, command_id: str) -> None:
        """Run a registry command from the palette: a tab's command shows that tab first."""
        command = BY_ID[command_id]
        if command.scope == "app":
            await self.run_action(command.action)
            return
        self.show_tab(command.scope)
        pane = self.pane(command.scope)
        if pane is not None:
            await self.run_action(command.action, default_namespace=pane)

    # -- quitting ---------------------------------------------------------------------------------------
    async def action_quit(self) -> None:
        self.action_request_quit()

    def action_request_quit(self) -> None:
        """Quit; when runs started or followed here still run, ask whether to stop them."""
        if self._quitting or isinstance(self.screen, QuitScreen):
            return
        tracked = list(dict.fromkeys([*self.launched, *([self.current_run_id] if self.current_run_id else [])]))
        if not tracked:
            self.exit()
            return
        self._quitting = True
        self.run_worker(lambda: self.post_message(self.QuitChecked(self.backend.live_runs(tracked))),
                        thread=True, group="quit", name="live runs", exit_on_error=False)

    def on_adaflash_app_quit_checked(self, message: AdaflashApp.QuitChecked) -> None:
        self._quitting = False
        if not message.runs:
            self.exit()
            return
        self.push_screen(QuitScreen(message.runs), partial(self._quit_answer, [r["id"] for r in message.runs]))

    def _quit_answer(self, run_ids: list[str], answer: str | None) -> None:
        if answer == "leave":
            self.exit(message=f"left running: {', '.join(run_ids)} (adaflash runs attach RUN follows one)")
        elif answer == "stop":
            self.notify(f"stopping {len(run_ids)} run(s)… (a pipeline first finishes its step and publishes a "
                        "final version: on a CPU that may take a minute or two)", timeout=30)
            self._quitting = True
            self.run_worker(partial(self._stop_and_exit, run_ids), thread=True, group="quit", name="stop runs",
                            exit_on_error=False)

    def _stop_and_exit(self, run_ids: list[str]) -> None:
        try:
            done = self.backend.stop_runs(run_ids)
        except Exception as err:  # noqa: BLE001
            done = [f"stop failed: {err}"]
        self.post_message(self.Stopped("stopped: " + ", ".join(done)))

    def on_adaflash_app_stopped(self, message: AdaflashApp.Stopped) -> None:
        self.exit(message=message.text)


def main(argv: list[str] | None = None) -> None:
    """`adaflash-tui [--workspace DIR] [--run RUN_ID] [--tab TAB]`."""
    from adaflash.workspace import (
        DEFAULT_WORKSPACE,
        RUNLOG_FILE,
        WORKSPACE_ENV,
        workspace_dir,
        workspace_path,
    )

    parser = argparse.ArgumentParser(
        prog="adaflash-tui", description="The adaflash dashboard: GPUs, launch, jobs, live metrics, comparison, "
                                         "history. Press F1 inside for every key.")
    parser.add_argument("--workspace", metavar="DIR", default=None,
                        help=f"an existing workspace folder holding the run log [env {WORKSPACE_ENV}; "
                             f"default ./{DEFAULT_WORKSPACE}, created when missing]")
    parser.add_argument("--run", metavar="RUN_ID", default=None, help="open this run (id or unique prefix) in Jobs "
                                                                      "[default: the newest live run, else the newest "
                                                                      "run]")
    parser.add_argument("--tab", choices=list(PANES), default=None,
                        help="the tab shown first [default: jobs with --run, else gpus]")
    args = parser.parse_args(argv)
    if args.workspace is not None and not workspace_path(args.workspace).is_dir():
        # A typo must not become a new, empty workspace (the CLI refuses it the same way).
        parser.exit(2, f"adaflash-tui: --workspace {workspace_path(args.workspace)}: no such folder, so no run log "
                       "(a mistyped path?). Give an existing workspace, or create the folder first to start a new "
                       "workspace there.\n")
    workspace = workspace_dir(args.workspace)
    run_id = args.run
    if run_id is not None:
        run_id = _resolve_run(parser, workspace / RUNLOG_FILE, run_id)
    app = AdaflashApp(workspace, run_id=run_id, tab=args.tab or ("jobs" if run_id else "gpus"))
    app.run()
    if app.return_code:
        sys.exit(app.return_code)


def _resolve_run(parser: argparse.ArgumentParser, runlog: Path, run_id: str) -> str:
    """The full id of --run (an id or a unique prefix), or exit 2 naming what is wrong."""
    from adaflash.runlog import RunLog

    if not runlog.is_file():
        parser.exit(2, f"adaflash-tui: --run {run_id}: no run log in {runlog.parent} (nothing recorded there yet)\n")
    log = RunLog.open(runlog.parent)
    try:
        return str(log.get_run(run_id)["id"])
    except KeyError as err:
        parser.exit(2, f"adaflash-tui: --run: {err.args[0]}\n")
    finally:
        log.close()


if __name__ == "__main__":
    main()
