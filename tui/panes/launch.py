"""Launch: assign GPUs to roles, pick a recipe or a method, see the exact command lines, launch.

Every change re-plans in a worker through `jobs` (the recipe is validated, the GPUs checked
against the inventory and the leases) and the problems show inline; launching is refused
while there is one, and nothing here can raise into the app.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Button, Checkbox, Input, Label, RadioSet, Select, SelectionList, Static
from textual.widgets.select import InvalidSelectValueError

from adaflash.methods import ADAFLASH, DFLASH, VANILLA
from jobs.launch_plan import (
    DEFAULT_ROLES,
    PRESETS,
    SERVER_METHODS,
    Built,
    LaunchChoice,
    build,
    default_roles,
    prepare_recipe,
    roles_of,
)
from tui.actions import bindings_for
from tui.backend import RECIPES_DIR, LaunchPlan
from tui.panes.base import Pane
from tui.widgets import CPU, AssignGrid, Check, Checklist, Radio

if TYPE_CHECKING:
    from jobs.gpus import Snapshot
    from jobs.rerun import Relaunch

MODES = (("recipe", "Recipe"), ("pipeline", "Pipeline"), ("server", "Baseline server"),
         ("bench", "Benchmark matrix"))
FIELDS_OF_MODE = {
    "recipe": ("recipe-fields",),
    "pipeline": ("pipeline-fields", "model-fields", "dataset-fields"),
    "server": ("server-fields", "model-fields"),
    "bench": ("bench-fields", "model-fields", "dataset-fields"),
}
FIELD_GROUPS = ("recipe-fields", "pipeline-fields", "server-fields", "bench-fields", "model-fields", "dataset-fields")
# Each mode's hints: a field shared by modes says what it takes in the mode shown, never another's.
PLACEHOLDERS = {
    "pipeline": {"draft": "folder (empty: built-in)", "dataset": "name or prompts .jsonl"},
    "server": {"draft": "folder (empty: built-in)"},
    "bench": {"draft": "DIR or method=DIR,…", "dataset": "names or .jsonl: a,b"},
}

# Form fields (LaunchChoice names) -> their Input ids: a past run loaded from History fills them.
INPUT_OF_FIELD = {"target": "target", "draft": "draft", "dataset": "dataset", "max_samples": "max-samples",
                  "max_new_tokens": "max-new-tokens", "batch_size": "batch-size", "max_minutes": "max-minutes",
                  "port": "port", "concurrency": "concurrency", "num_prompts": "num-prompts"}


def field(label: str, widget: Any) -> ComposeResult:
    """One labelled form row (label left, control right): readable at 80 columns."""
    with Horizontal(classes="field"):
        yield Label(label, classes="field-label")
        yield widget


class LaunchPane(Pane):
    SCOPE = "launch"
    INTERVAL = None
    BINDINGS = bindings_for("launch")

    class Launched(Message):
        def __init__(self, run_id: str | None, error: str | None = None) -> None:
            super().__init__()
            self.run_id, self.error = run_id, error

    class Preparing(Message):
        """The run preparing datasets started (or could not)."""

        def __init__(self, run_id: str | None, datasets: list[str], error: str | None = None) -> None:
            super().__init__()
            self.run_id, self.datasets, self.error = run_id, datasets, error

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mode = "recipe"
        # Method modes: one assignment, first filled from the inventory, then the user's.
        self.method_roles: dict[str, tuple[int, ...] | None] = {r: None for r in DEFAULT_ROLES}
        self.method_share = False
        self.method_edited = False
        # Recipe mode: the recipe's own [gpus] (from its plan), and the user's edits on top (-> --set).
        self.recipe_share: bool | None = None
        self.recipe_edits: dict[str, tuple[int, ...] | None] = {}
        self.recipe_share_edit: bool | None = None
        self.snapshot: Snapshot | None = None
        self.recipe_roles: dict[str, tuple[int, ...] | None] = {}
        self.plan: LaunchPlan | None = None
        self.built: Built | None = None
        self.planned: LaunchChoice | None = None
        self.launching = False
        self._recipes: list[tuple[str, str]] = []
        # Runs preparing datasets the form asked for: run id -> datasets, and their last status.
        self.preparing: dict[str, list[str]] = {}
        self.prepare_state: dict[str, tuple[str, str | None]] = {}
        self._prepare_timer: Timer | None = None

    # -- layout ---------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="launch-columns"):
            with VerticalScroll(id="launch-form", can_focus=False):  # its fields are the Tab stops
                yield Label("What to launch", classes="section")
                with RadioSet(id="mode", compact=True):
                    for value, title in MODES:
                        yield Radio(title, value=value == "recipe", id=f"mode-{value}")
                with Vertical(id="recipe-fields", classes="fields"):
                    yield from field("recipe", Select([], prompt="pick a recipe", id="recipe-select", compact=True))
                    yield from field("or file", Input(placeholder="path/to/recipe.toml", id="recipe-path", compact=True))
                    yield from field("overrides", Input(placeholder="vars.train_steps=10 …", id="recipe-sets",
                                                        compact=True))
                with Vertical(id="pipeline-fields", classes="fields hidden"):
                    with RadioSet(id="preset", compact=True):
                        for value, title in PRESETS:
                            yield Radio(title, value=value == PRESETS[0][0], id=f"preset-{value}")
                    yield from field("samples", Input(placeholder="max samples (empty: all)", id="max-samples",
                                                      compact=True))
                    yield from field("new tokens", Input(placeholder="per answer (256)",
                                                         id="max-new-tokens", compact=True))
                    yield from field("batch size", Input(placeholder="inference (16)", id="batch-size",
                                                         compact=True))
                    yield from field("max minutes", Input(placeholder="budget (none)", id="max-minutes",
                                                          compact=True))
                with Vertical(id="server-fields", classes="fields hidden"):
                    yield from field("method", Select([(t, v) for v, t in SERVER_METHODS], value="vanilla",
                                                      allow_blank=False, id="server-method", compact=True))
                    yield from field("port", Input("30000", placeholder="port", id="port", compact=True))
                    yield Check("learn its traffic (--adapt)", False, id="adapt", compact=True)
                    yield Static("its trainer: the training role", classes="hint")
                with Vertical(id="bench-fields", classes="fields hidden"):
                    yield Checklist(*((t, v, v in (VANILLA, DFLASH, ADAFLASH))
                                           for v, t in SERVER_METHODS), id="bench-methods", compact=True)
                    yield from field("concurrency", Input("1", placeholder="e.g. 1,4", id="concurrency", compact=True))
                    yield from field("prompts", Input("16", placeholder="prompts per cell", id="num-prompts",
                                                      compact=True))
                with Vertical(id="model-fields", classes="fields hidden"):
                    yield from field("target", Input("smollm2-135m", placeholder="built-in, HF id or folder", id="target",
                                                     compact=True))
                    yield from field("drafter", Input(id="draft", compact=True))
                with Vertical(id="dataset-fields", classes="fields hidden"):
                    yield from field("dataset", Input(id="dataset", compact=True))
            with Vertical(id="launch-side"):
                yield Label("GPUs → roles (space/click toggles)", classes="section")
                yield AssignGrid(id="assign")
                yield Check("roles may share a GPU (^s)", False, id="share", compact=True)
                yield Static("", id="launch-problems", classes="hidden")
                with Horizontal(id="prepare-offer", classes="hidden"):
                    yield Button("Prepare (^o)", id="prepare-button", variant="warning", compact=True)
                    yield Static("", id="prepare-note")
                with VerticalScroll(id="plan-box") as plan_box:
                    plan_box.border_title = "plan · the exact command lines"
                    yield Static("planning…", id="launch-plan")
                with Horizontal(id="launch-actions"):
                    yield Button("Launch (^l)", id="launch-button", variant="success", compact=True, disabled=True)
                    yield Static("", id="launch-status", classes="pane-status")

    def _show_fields(self) -> None:
        """Only the fields of the mode shown, each with that mode's hint."""
        for fields in FIELD_GROUPS:
            self.query_one(f"#{fields}").set_class(fields not in FIELDS_OF_MODE[self.mode], "hidden")
        for widget_id, hint in PLACEHOLDERS.get(self.mode, {}).items():
            self.query_one(f"#{widget_id}", Input).placeholder = hint

    def on_mount(self) -> None:
        if self.adaflash.snapshot is not None:
            self.set_snapshot(self.adaflash.snapshot)
        self._draw_grid()

    # -- state -> choice ------------------------------------------------------------------------------
    def used_roles(self) -> list[str]:
        if self.mode == "recipe":
            return list(self.recipe_roles)
        return list(roles_of(self.mode, self.query_one("#adapt", Checkbox).value))

    def assignment(self) -> dict[str, tuple[int, ...] | None]:
        """Roles -> GPUs as the grid shows them for the current mode."""
        if self.mode == "recipe":
            return {**self.recipe_roles, **self.recipe_edits}
        return dict(self.method_roles)

    @property
    def share(self) -> bool:
        if self.mode == "recipe":
            return bool(self.recipe_share_edit if self.recipe_share_edit is not None else self.recipe_share)
        return self.method_share

    def _show_share(self) -> None:
        box = self.query_one("#share", Checkbox)
        if box.value != self.share:
            with box.prevent(Checkbox.Changed):
                box.value = self.share

    def choice(self) -> LaunchChoice:
        def value(widget_id: str) -> str:
            return self.query_one(f"#{widget_id}", Input).value

        select = self.query_one("#recipe-select", Select)
        recipe = value("recipe-path").strip() or ("" if select.value is Select.NULL else str(select.value))
        preset = "osd" if self.query_one("#preset-osd", Radio).value else "adaflash"
        method = self.query_one("#server-method", Select).value
        roles = self.assignment()
        edited = [*self.recipe_edits, *(["share"] if self.recipe_share_edit is not None else [])]
        return LaunchChoice(
            mode=self.mode, recipe=recipe, sets=value("recipe-sets"), preset=preset,
            method=str(method) if method is not Select.NULL else "vanilla",
            bench_methods=tuple(self.query_one("#bench-methods", SelectionList).selected),
            target=value("target"), draft=value("draft"), dataset=value("dataset"),
            max_samples=value("max-samples"), max_new_tokens=value("max-new-tokens"), batch_size=value("batch-size"),
            max_minutes=value("max-minutes"), port=value("port"), concurrency=value("concurrency"),
            num_prompts=value("num-prompts"), roles=tuple(sorted(roles.items())),
            edited=tuple(sorted(edited)), share=self.share, adapt=self.query_one("#adapt", Checkbox).value,
        )

    # -- planning -------------------------------------------------------------------------------------
    def replan(self) -> None:
        self.query_one("#launch-button", Button).disabled = True
        self.query_one("#launch-status", Static).update("[dim]checking…[/dim]")
        self.refresh_data()

    def request(self) -> Any:
        return self.choice(), self.snapshot, tuple(self.preparing)

    def read(self, request: Any) -> tuple[Built, LaunchPlan | None, list[tuple[str, str]], dict[str, Any]]:
        choice, snapshot, preparing = request
        backend = self.adaflash.backend
        recipes = backend.recipes()
        states = backend.run_statuses(list(preparing), group="launch") if preparing else {}
        built = build(choice, backend.workspace / RECIPES_DIR, workspace=backend.workspace)
        problem = self._port_problem(choice)
        if problem:
            built.errors.append(problem)
        if built.recipe_path is None:
            return built, None, recipes, states
        plan = backend.plan(built.recipe_path, built.overrides, snapshot, recipe_text=built.recipe_text,
                            warnings=built.warnings)
        return built, plan, recipes, states

    def _port_problem(self, choice: LaunchChoice) -> str | None:
        """A server's port held by another process (its health check would answer for our job): blocking."""
        if choice.mode != "server" or not choice.port.strip().isdigit() or not 0 < int(choice.port) < 65536:
            return None
        return self.adaflash.backend.port_problem(int(choice.port))

    def _set_recipes(self, recipes: list[tuple[str, str]]) -> None:
        """The recipe list (shipped and the workspace's); the first time, pick the local default."""
        first = not self._recipes
        self._recipes = recipes
        select = self.query_one("#recipe-select", Select)
        current = select.value
        with select.prevent(Select.Changed):
            select.set_options(recipes)
            paths = [path for _, path in recipes]
            if current in paths:
                select.value = current
            elif first:
                default = next((path for label, path in recipes if label == "smollm2-cpu"), None)
                if default:
                    select.value = default

    def apply(self, request: Any,
              result: tuple[Built, LaunchPlan | None, list[tuple[str, str]], dict[str, Any]]) -> None:
        choice = request[0]
        built, plan, recipes, states = result
        if recipes != self._recipes:
            self._set_recipes(recipes)
        self._prepare_progress(states)
        if choice != self.choice():
            self._again = True  # the form changed while planning: plan again
            return
        self.built, self.plan, self.planned = built, plan, choice
        if self.mode == "recipe" and plan is not None and plan.plan_text is not None:
            self.recipe_roles = dict(plan.roles)
            self.recipe_share = plan.share
        self._draw_grid()
        self._show_share()
        errors = list(built.errors) + (plan.errors if plan else [])
        warnings = list(plan.warnings if plan else built.warnings)
        problems = Text()
        for error in errors:
            problems.append(("\n" if problems else "") + "✗ " + error, style="bold red")
        for warning in warnings:
            problems.append(("\n" if problems else "") + "! " + warning, style="yellow")
        box = self.query_one("#launch-problems", Static)
        box.update(problems)
        box.set_class(not problems, "hidden")
        box.set_class(not errors, "warnings-only")
        plan_text = plan.plan_text if plan and plan.plan_text else "(no plan: fix the problems above)"
        self.query_one("#launch-plan", Static).update(Text(plan_text))
        ok = not errors and plan is not None and plan.plan_text is not None
        self.query_one("#launch-button", Button).disabled = not ok or self.launching
        warned = f" [yellow]· {len(warnings)} warning(s)[/yellow]" if warnings else ""
        self.query_one("#launch-status", Static).update(
            f"[green]ready to launch[/green]{warned}" if ok else
            f"[red]cannot launch: {len(errors)} problem(s)[/red]{warned}")
        self._show_prepare_offer()

    def failed(self, request: Any, error: BaseException) -> None:
        self.query_one("#launch-problems", Static).update(Text(f"✗ {error}", style="bold red"))
        self.query_one("#launch-problems").remove_class("hidden")
        self.query_one("#launch-status", Static).update("[red]cannot plan[/red]")

    @property
    def errors(self) -> list[str]:
        """Problems of the current plan (empty when it can launch)."""
        if self.built is None:
            return ["not planned yet"]
        return list(self.built.errors) + (self.plan.errors if self.plan else ["no plan"])

    # -- the grid -------------------------------------------------------------------------------------
    def set_snapshot(self, snapshot: Snapshot) -> None:
        first = self.snapshot is None
        changed = first or [g.index for g in snapshot.gpus] != [g.index for g in self.snapshot.gpus]
        self.snapshot = snapshot
        if first:
            indices = [g.index for g in snapshot.gpus] if snapshot.available else []
            if not self.method_edited:
                self.method_roles = default_roles(indices)
                self.method_share = len(indices) < 2
            self._show_share()
        if changed:
            self._draw_grid()
            self.replan()

    def _draw_grid(self) -> None:
        known = [g.index for g in self.snapshot.gpus] if self.snapshot and self.snapshot.available else []
        used = self.used_roles()
        assign = self.assignment()
        roles = list(dict.fromkeys([*used, *DEFAULT_ROLES]))
        for role in roles:
            assign.setdefault(role, self.method_roles.get(role))
        referenced = {i for r in roles for i in (assign.get(r) or ())}
        choices = [str(i) for i in sorted(set(known) | referenced)] + [CPU]
        self.query_one(AssignGrid).show(roles, choices, assign, set(used), referenced - set(known))

    def on_assign_grid_toggled(self, event: AssignGrid.Toggled) -> None:
        event.stop()
        self.toggle(event.role, event.choice)

    def toggle(self, role: str, choice: str) -> None:
        """One grid cell: cpu takes the role off the GPUs; a GPU is added to or removed from it."""
        current = self.assignment().get(role, self.method_roles.get(role))
        if choice == CPU:
            new: tuple[int, ...] | None = None
        else:
            index = int(choice)
            gpus = set(current or ())
            gpus.symmetric_difference_update({index})
            new = tuple(sorted(gpus))
        self._set_role(role, new)
        self._draw_grid()
        self.replan()

    def _set_role(self, role: str, gpus: tuple[int, ...] | None) -> None:
        if self.mode == "recipe":
            self.recipe_edits[role] = gpus
        else:
            self.method_roles[role] = gpus
            self.method_edited = True

    def action_all_cpu(self) -> None:
        """Every role on CPU workers, in every mode (the recipe's roles through overrides)."""
        for role in [*DEFAULT_ROLES, *self.method_roles]:
            self.method_roles[role] = None
        self.method_edited = True
        for role in self.recipe_roles:
            self.recipe_edits[role] = None
        self._draw_grid()
        self.replan()

    def action_toggle_share(self) -> None:
        share = self.query_one("#share", Checkbox)
        share.value = not share.value

    def action_focus_grid(self) -> None:
        self.query_one(AssignGrid).focus()

    # -- form events ----------------------------------------------------------------------------------
    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        event.stop()
        if event.radio_set.id == "mode":
            self.mode = (event.pressed.id or "mode-recipe").removeprefix("mode-")
            self._show_fields()
            self._draw_grid()
            self._show_share()
        self.replan()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.replan()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id == "recipe-select":
            self.recipe_roles, self.recipe_share = {}, None
            self.recipe_edits, self.recipe_share_edit = {}, None
        self.replan()

    def on_selection_list_selected_changed(self, event: SelectionList.SelectedChanged) -> None:
        event.stop()
        self.replan()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        event.stop()
        if event.checkbox.id == "adapt":
            self._draw_grid()
            self.replan()
        elif event.checkbox.id == "share":
            if self.mode == "recipe":
                self.recipe_share_edit = event.value
            else:
                self.method_share = event.value
                self.method_edited = True
            self.replan()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "launch-button":
            event.stop()
            self.action_launch()
        elif event.button.id == "prepare-button":
            event.stop()
            self.action_prepare_data()

    # -- launch ---------------------------------------------------------------------------------------
    def load_recipe(self, path: str) -> None:
        """Recipe mode with this file (History's load); the plan follows."""
        self.query_one("#mode-recipe", Radio).value = True
        self.mode = "recipe"
        self._show_fields()
        self.recipe_roles, self.recipe_share, self.recipe_edits, self.recipe_share_edit = {}, None, {}, None
        self.query_one("#recipe-path", Input).value = path
        self.replan()

    def load_relaunch(self, relaunch: Relaunch) -> None:
        """A past run in the form (History's load): its recipe, or its mode's fields and GPU roles."""
        if relaunch.mode == "recipe":
            self.load_recipe(relaunch.recipe)
            self.query_one("#recipe-sets", Input).value = relaunch.choice().sets
            return
        self.query_one(f"#mode-{relaunch.mode}", Radio).value = True
        self.mode = relaunch.mode
        self._show_fields()
        fields = relaunch.fields
        for name, value in fields.items():
            if name in INPUT_OF_FIELD:
                self.query_one(f"#{INPUT_OF_FIELD[name]}", Input).value = str(value)
        if fields.get("preset"):
            self.query_one(f"#preset-{fields['preset']}", Radio).value = True
        if fields.get("method"):
            method = self.query_one("#server-method", Select)
            with contextlib.suppress(InvalidSelectValueError):
                method.value = fields["method"]
        if "adapt" in fields:
            self.query_one("#adapt", Checkbox).value = bool(fields["adapt"])
        if fields.get("bench_methods"):
            methods = self.query_one("#bench-methods", SelectionList)
            methods.deselect_all()
            for value in fields["bench_methods"]:
                with contextlib.suppress(Exception):
                    methods.select(value)
        if relaunch.roles:
            self.method_roles.update(relaunch.roles)
            self.method_edited = True
            used = [g for gpus in relaunch.roles.values() for g in (gpus or ())]
            self.method_share = self.method_share or len(used) != len(set(used))
        self._draw_grid()
        self._show_share()
        self.replan()
        self.app.notify(f"Run {relaunch.run_id} loaded: edit it, then launch (^l).", timeout=4)

    def set_all_cpu(self) -> None:
        """The GPUs tab's offer on a machine without GPUs: every role on CPU workers."""
        self.action_all_cpu()

    def action_launch(self) -> None:
        if self.launching:
            self.app.notify("A launch is already in progress.", severity="warning")
            return
        if self._busy or self.planned != self.choice():
            self.app.notify("Still checking the plan; try again in a moment.", severity="warning")
            return
        errors = self.errors
        if errors:
            self.app.bell()
            self.app.notify(f"Cannot launch: {errors[0]}", severity="error")
            return
        assert self.plan is not None and self.built is not None
        choice, plan = self.planned, self.plan
        final = build(choice, self.adaflash.backend.workspace / RECIPES_DIR, final=plan.run_id,
                      workspace=self.adaflash.backend.workspace)
        self.launching = True
        self.query_one("#launch-button", Button).disabled = True
        self.query_one("#launch-status", Static).update(f"[yellow]launching {plan.run_id}…[/yellow]")
        snapshot = self.snapshot
        self.run_worker(lambda: self._launch(final, plan.run_id, snapshot, choice), thread=True, group="launch",
                        name="launch", exit_on_error=False)

    def _launch(self, built: Built, run_id: str | None, snapshot: Snapshot | None, choice: LaunchChoice) -> None:
        problem = self._port_problem(choice)  # taken since the plan was checked
        if problem:
            self.post_message(self.Launched(None, problem))
            return
        try:
            launched = self.adaflash.backend.launch(built.recipe_path or "", built.overrides, snapshot,
                                                    recipe_text=built.recipe_text, run_id=run_id)
        except Exception as err:  # noqa: BLE001 - RecipeError, AssignmentError, LeaseError, RuntimeError...
            self.post_message(self.Launched(None, str(err)))
        else:
            self.post_message(self.Launched(launched))

    def on_launch_pane_launched(self, message: LaunchPane.Launched) -> None:
        message.stop()
        self.launching = False
        self.plan = replace(self.plan, run_id=None) if self.plan else None
        self.replan()  # a fresh run id for the next launch
        if message.run_id is None:
            self.query_one("#launch-problems", Static).update(Text(f"✗ launch failed: {message.error}",
                                                                   style="bold red"))
            self.query_one("#launch-problems").remove_class("hidden")
            self.app.notify(f"Launch failed: {(message.error or '').splitlines()[0]}", severity="error")
            return
        self.adaflash.run_launched(message.run_id)

    # -- preparing datasets ---------------------------------------------------------------------------
    def _preparing_datasets(self) -> set[str]:
        return {d for datasets in self.preparing.values() for d in datasets}

    def _show_prepare_offer(self) -> None:
        """Offer to prepare the built-in datasets the plan lacks; say which are being prepared."""
        wanted = list(self.built.prepare) if self.built is not None else []
        busy = self._preparing_datasets()
        todo = [d for d in wanted if d not in busy]
        button = self.query_one("#prepare-button", Button)
        button.label = f"Prepare {', '.join(todo)} (^o)" if todo else "Prepare (^o)"
        button.display = bool(todo)
        notes = [f"preparing {', '.join(datasets)}: run {run_id} "
                 f"{(self.prepare_state.get(run_id) or ('starting', None))[0]}…"
                 for run_id, datasets in self.preparing.items()]
        if todo and not notes:
            notes = [f"a job: adaflash data prepare {' '.join(todo)}"]
        self.query_one("#prepare-note", Static).update(Text("  ".join(notes), style="dim"))
        self.query_one("#prepare-offer").set_class(not (todo or self.preparing), "hidden")

    def action_prepare_data(self) -> None:
        datasets = [d for d in (self.built.prepare if self.built else []) if d not in self._preparing_datasets()]
        if not datasets:
            self.app.notify("No built-in dataset to prepare for this launch.", severity="warning")
            return
        backend, snapshot = self.adaflash.backend, self.snapshot
        path = backend.workspace / RECIPES_DIR / "tui-data-prepare.toml"
        text = prepare_recipe(datasets)
        self.query_one("#prepare-button", Button).display = False
        self.run_worker(lambda: self._prepare(str(path), text, datasets, snapshot), thread=True,
                        group="launch-prepare", name="prepare datasets", exit_on_error=False)

    def _prepare(self, path: str, text: str, datasets: list[str], snapshot: Snapshot | None) -> None:
        try:
            run_id = self.adaflash.backend.launch(path, [], snapshot, recipe_text=text)
        except Exception as err:  # noqa: BLE001 - RecipeError, LeaseError, RuntimeError: shown, never a crash
            self.post_message(self.Preparing(None, datasets, str(err)))
        else:
            self.post_message(self.Preparing(run_id, datasets))

    def on_launch_pane_preparing(self, message: LaunchPane.Preparing) -> None:
        message.stop()
        if message.run_id is None:
            self.app.notify(f"Cannot prepare {', '.join(message.datasets)}: {message.error}", severity="error")
            self._show_prepare_offer()
            return
        self.preparing[message.run_id] = message.datasets
        self.adaflash.launched.append(message.run_id)  # the quit question knows it
        self.app.notify(f"Preparing {', '.join(message.datasets)}: run {message.run_id} (History lists it; "
                        "this form checks again when it ends)", timeout=6)
        if self._prepare_timer is None:
            self._prepare_timer = self.set_interval(1.0 * self.adaflash.interval_scale, self.refresh_data,
                                                    name="launch-prepare-poll")
        self._show_prepare_offer()
        self.refresh_data()

    def _prepare_progress(self, states: dict[str, tuple[str, str | None]]) -> None:
        """Fold the preparing runs' statuses: an ended one is announced and dropped."""
        for run_id, (status, note) in states.items():
            if run_id not in self.preparing:
                continue
            self.prepare_state[run_id] = (status, note)
            if status in ("pending", "running", "detached"):
                continue
            datasets = ", ".join(self.preparing.pop(run_id))
            if status == "finished":
                self.app.notify(f"Prepared {datasets} (run {run_id}).", timeout=5)
            else:
                self.app.notify(f"Preparing {datasets} {status}: {note or 'see its log in Jobs'}", severity="error",
                                timeout=10)
        if not self.preparing and self._prepare_timer is not None:
            self._prepare_timer.stop()
            self._prepare_timer = None

    def focus_primary(self) -> None:
        self.query_one("#mode").focus()
