"""Entry point of `adaflash-tui`: the dashboard lives in `tui` and needs the `tui` extra (textual), which
a lean install leaves out; without it the command says so in one line instead of a traceback."""

from __future__ import annotations

import sys

from adaflash.extras import available, install_hint


def main(argv: list[str] | None = None) -> None:
    missing = [name for name in ("textual", "textual_plotext") if not available(name)]
    if missing:
        print(f"adaflash-tui: the dashboard needs {', '.join(missing)}: {install_hint('tui')}", file=sys.stderr)
        sys.exit(1)
    from tui.app import main as run_dashboard

    run_dashboard(argv)


if __name__ == "__main__":
    main()
