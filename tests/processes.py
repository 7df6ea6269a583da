"""Stopping a server started as a subprocess in a test, the way a user's Ctrl-C or a supervisor does."""

from __future__ import annotations

import signal
import subprocess


def stop_with_sigterm(proc: subprocess.Popen, timeout: float) -> str:
    """SIGTERM, wait up to `timeout` s (then kill), and return what it wrote on stderr."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err
