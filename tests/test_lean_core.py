"""A lean install (`pip install adaflash`, no extras) runs the CLI: the core never imports the dashboard's
textual nor matplotlib, and the dashboard's entry point names the extra it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adaflash.extras import MissingExtraError, require

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("textual", "textual_plotext", "matplotlib")
# A meta-path finder that refuses the optional packages, as if they were not installed; then the command.
LEAN = f"""
import sys
BLOCKED = {BLOCKED!r}

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: a lean install)", name=name)
        return None

sys.meta_path.insert(0, Refuse())
module, argv = sys.argv[1], sys.argv[2:]
sys.argv = [module, *argv]
import importlib
importlib.import_module(module).main()
"""


def _lean(module: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LEAN, module, *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_the_cli_runs_without_textual_and_matplotlib(tmp_path: Path) -> None:
    shown = _lean("adaflash.cli.main", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "pipeline" in shown.stdout
    listed = _lean("adaflash.cli.main", "--workspace", str(tmp_path / "ws"), "data", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "gsm8k" in {row["name"] for row in json.loads(listed.stdout)}
    planned = _lean("adaflash.cli.main", "--workspace", str(tmp_path / "ws"), "run", "smollm2-cpu", "--dry-run")
    assert planned.returncode == 0, planned.stderr  # the control plane (jobs) too


def test_the_dashboard_names_its_extra_when_textual_is_missing() -> None:
    result = _lean("adaflash.cli.dashboard", "--help")
    assert result.returncode == 1
    assert 'pip install "adaflash[tui]"' in result.stderr and "Traceback" not in result.stderr


def test_require_names_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r'adaflash\[plots\]'):
        require("no_such_package_for_adaflash", "plots")
