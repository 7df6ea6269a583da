"""Run a check script in a fresh interpreter (own environment: Triton's interpreter, a kernel switch)
and read the JSON object it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_json_script(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 900) -> Any:
    done = subprocess.run([sys.executable, "-c", code, *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
