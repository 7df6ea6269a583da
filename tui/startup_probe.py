"""How long adaflash-tui takes from `python` to its first paint: `python -m tui.startup_probe [--tab T] [-n N]`.

A measuring tool, not a test (timings depend on the machine and its load). Each try starts a fresh
interpreter that runs the app headless on a throwaway workspace and exits at its first refresh;
the time from that child's process start (interpreter start included) to the refresh is what a
user waits for before seeing anything.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, time
from pathlib import Path
import psutil
import tui.app
from tui.app import AdaflashApp

class FirstPaint(AdaflashApp):
    CSS_PATH = str(Path(tui.app.__file__).with_name("app.tcss"))
    painted = False

    def _display(self, screen, renderable) -> None:  # where textual hands a frame to the terminal
        super()._display(screen, renderable)
        if renderable is not None and not self.painted:
            self.painted = True
            Path(sys.argv[3]).write_text(str(time.time() - psutil.Process().create_time()))
            self.call_later(self.exit)

FirstPaint(sys.argv[1], tab=sys.argv[2], live=False).run(headless=True)
"""


def measure(tab: str, tries: int) -> list[float]:
    """Seconds from each child's process start to its first frame (the workers it started may still run)."""
    times = []
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "painted"
        for _ in range(tries):
            subprocess.run([sys.executable, "-c", CHILD, folder, tab, str(out)], check=True, stdout=subprocess.DEVNULL)
            times.append(float(out.read_text()))
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tui.startup_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--tab", default="gpus", help="the tab shown first")
    parser.add_argument("-n", type=int, default=5, help="tries (the median is reported)")
    args = parser.parse_args(argv)
    times = measure(args.tab, args.n)
    print(f"first paint of the {args.tab} tab: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}, {len(times)} tries)")


if __name__ == "__main__":
    main()
