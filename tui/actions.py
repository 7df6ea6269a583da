"""The one registry of user actions: key bindings, the footer, the help screen and the command
palette are all generated from it, so a key can never be documented in one place and bound
differently in another (Harlequin and Posting keep the same single source).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from textual.binding import Binding

# Scopes, in the order the help screen lists them: "app" is global, the others are tab panes.
SCOPES = ("app", "gpus", "launch", "jobs", "monitor", "compare", "history", "procs", "query")
SCOPE_TITLES = {
    "app": "Everywhere", "gpus": "GPUs", "launch": "Launch", "jobs": "Jobs", "monitor": "Monitor",
    "compare": "Compare", "history": "History", "procs": "Processes", "query": "Query",
}
# The tab panes in display order: (id, title, key that shows it).
TABS = (("gpus", "GPUs", "1"), ("launch", "Launch", "2"), ("jobs", "Jobs", "3"), ("monitor", "Monitor", "4"),
        ("compare", "Compare", "5"), ("history", "History", "6"), ("procs", "Procs", "7"), ("query", "SQL", "8"))


@dataclass(frozen=True)
class Command:
    """One user action: `action` is a Textual action string run on the app ("app") or on the pane."""

    id: str
    key: str
    label: str  # short: the footer
    description: str  # long: help screen, tooltips, palette
    action: str
    scope: str = "app"
    show: bool = True  # shown in the footer
    palette: bool = True  # offered by the command palette
    priority: bool = False

    @property
    def key_display(self) -> str:
        """Keys as people read them: "ctrl+l" -> "^l", "question_mark" -> "?"."""
        names = {"question_mark": "?", "slash": "/", "space": "space", "escape": "esc", "enter": "enter"}
        parts = []
        for key in self.key.split(","):
            key = names.get(key, key)
            parts.append("^" + key[5:] if key.startswith("ctrl+") else key)
        return " ".join(parts)


REGISTRY: tuple[Command, ...] = (
    # -- everywhere ----------------------------------------------------------------------------
    *(Command(f"tab.{tab}", key, title, f"Show the {title} tab", f"show_tab('{tab}')", show=False)
      for tab, title, key in TABS),
    Command("help", "f1,question_mark", "Help", "Help: every key and action", "help", show=True),
    Command("palette", "ctrl+p", "Palette", "Command palette", "command_palette", show=False, palette=False),
    Command("quit", "q,ctrl+q", "Quit", "Quit (asks about running jobs)", "request_quit", show=True, priority=False),
    Command("refresh", "ctrl+r", "Refresh", "Refresh every tab now", "refresh_all", show=False),
    Command("theme", "ctrl+t", "Theme", "Toggle light/dark theme", "toggle_theme", show=False),
    # -- GPUs --------------------------------------------------------------------------------
    Command("gpus.cpu", "c", "CPU workers", "Use CPU workers: every role on CPU in Launch", "use_cpu", scope="gpus"),
    # -- Launch --------------------------------------------------------------------------------
    Command("launch.go", "ctrl+l", "Launch", "Launch the plan (detached: jobs outlive the TUI)", "launch", scope="launch"),
    Command("launch.share", "ctrl+s", "Share GPUs", "Allow roles to share a GPU (toggle)", "toggle_share", scope="launch"),
    Command("launch.cpu", "ctrl+n", "All CPU", "Put every role on CPU", "all_cpu", scope="launch"),
    Command("launch.grid", "ctrl+g", "Grid", "Focus the GPU assignment grid", "focus_grid", scope="launch", show=False),
    Command("launch.prepare", "ctrl+o", "Prepare data", "Prepare the built-in datasets the form needs (a job: "
            "adaflash data prepare NAME)", "prepare_data", scope="launch", show=False),
    # -- Jobs ----------------------------------------------------------------------------------
    Command("jobs.stop", "s", "Stop job", "Stop the selected job (asks first)", "stop_job", scope="jobs"),
    Command("jobs.restart", "r", "Restart job", "Restart the selected job (asks first)", "restart_job", scope="jobs"),
    Command("jobs.stop_run", "x", "Stop run", "Stop the whole run (asks first)", "stop_run", scope="jobs"),
    Command("jobs.log", "l", "Full log", "The selected job's log full screen (l or esc: back)", "toggle_log",
            scope="jobs"),
    Command("jobs.monitor", "m", "Monitor", "Monitor this run", "app.show_tab('monitor')", scope="jobs"),
    Command("jobs.follow", "f", "Follow", "Follow the log's end, or hold it where it is (toggle)", "toggle_follow",
            scope="jobs"),
    Command("jobs.search", "slash", "Search", "Search the log, matches highlighted (enter: go, esc: clear)",
            "search_log", scope="jobs"),
    Command("jobs.next", "n", "Next match", "The log search's next match", "next_match", scope="jobs", show=False),
    Command("jobs.previous", "N", "Prev match", "The log search's previous match", "previous_match", scope="jobs",
            show=False),
    Command("jobs.wrap", "w", "Wrap", "Wrap the log's long lines, or cut them (toggle)", "toggle_wrap", scope="jobs"),
    Command("jobs.error", "e", "First error", "Jump to the log's first error (error, Traceback, failed)",
            "first_error", scope="jobs"),
    # -- Monitor -------------------------------------------------------------------------------
    Command("monitor.reload", "ctrl+o", "Reload", "Re-read every metric of the run from the start", "reload",
            scope="monitor"),
    # -- Compare -------------------------------------------------------------------------------
    Command("compare.sort", "s", "Sort", "Sort by the column under the cursor (again: reverse)", "sort", scope="compare"),
    Command("compare.filter", "slash", "Filter", "Filter rows (text or key=value)", "focus_filter", scope="compare"),
    Command("compare.markdown", "e", "Export .md", "Export the table to Markdown in the workspace", "export('markdown')",
            scope="compare"),
    Command("compare.csv", "v", "Export .csv", "Export the table to CSV in the workspace", "export('csv')", scope="compare"),
    Command("compare.clear", "escape", "Clear filter", "Clear the filter and go back to the table", "clear_filter",
            scope="compare", show=False),
    Command("compare.all", "a", "All results", "Compare every benchmark result (or the latest matrix)", "show_all",
            scope="compare"),
    # -- History -------------------------------------------------------------------------------
    Command("history.open", "o", "Open", "Open the run under the cursor (Jobs and Monitor follow it)", "open_run",
            scope="history"),
    Command("history.select", "space", "Select", "Select or unselect the run for comparison", "toggle_select",
            scope="history"),
    Command("history.compare", "c", "Compare", "Compare the selected runs", "compare_selected", scope="history"),
    Command("history.rerun", "r", "Rerun", "Launch the run again as it was, a new run (asks first)", "rerun",
            scope="history"),
    Command("history.load", "l", "Load", "Load the run into the Launch form to edit it (recipe, pipeline, server "
            "or benchmark), then launch", "load_run", scope="history"),
    Command("history.filter", "slash", "Filter", "Filter runs by text", "focus_filter", scope="history"),
    Command("history.clear", "escape", "Clear", "Clear filters and selection, back to the table", "clear_filters",
            scope="history"),
    # -- Processes -----------------------------------------------------------------------------------
    Command("procs.sort", "o", "Sort", "Sort by the next column (pid, role, CPU, RSS, GPU mem, GPU %, uptime, status)",
            "cycle_sort", scope="procs"),
    Command("procs.reverse", "O", "Reverse", "Reverse the sort", "reverse_sort", scope="procs"),
    Command("procs.stop", "s", "Stop", "Stop the selected process's job (asks first)", "stop_process", scope="procs"),
    # -- Query -----------------------------------------------------------------------------------------
    Command("query.run", "f5", "Run", "Run the SQL (read-only, over the run log)", "run_query", scope="query"),
    Command("query.csv", "f6", "Export .csv", "Export the rows shown to CSV in the workspace", "export('csv')",
            scope="query"),
    Command("query.markdown", "f7", "Export .md", "Export the rows shown to Markdown in the workspace",
            "export('markdown')", scope="query"),
    Command("query.editor", "f4", "Edit SQL", "Focus the SQL editor (esc leaves it: then 1-8 switch tabs)",
            "focus_editor", scope="query"),
)

BY_ID = {c.id: c for c in REGISTRY}
assert len(BY_ID) == len(REGISTRY), "command ids must be unique"


def commands_for(scope: str) -> list[Command]:
    return [c for c in REGISTRY if c.scope == scope]


def bindings_for(scope: str) -> list[Binding]:
    """Textual bindings of a scope, each with the command's id (Posting-style binding ids)."""
    return [
        Binding(c.key, c.action, c.label, show=c.show, id=c.id,
                tooltip=c.description, priority=c.priority)
        for c in commands_for(scope)
    ]


def help_rows(scopes: Iterable[str] = SCOPES) -> list[tuple[str, str, str, str]]:
    """(scope title, keys, description, id) for the help screen, in registry order."""
    return [(SCOPE_TITLES[c.scope], c.key_display, c.description, c.id)
            for scope in scopes for c in commands_for(scope)]
