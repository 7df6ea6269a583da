"""`adaflash serve --engine sglang`: SGLang launched with the method's flags, supervised as one process group."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

import click

from adaflash.cli.common import fail, recorded_run, runlog_of
from adaflash.cli.groups import given
from adaflash.engine.config import EngineConfig
from adaflash.options import ServeConfig

if TYPE_CHECKING:
    from adaflash.procs import ProcessGroup

SGLANG_STOP_GRACE = 60.0  # seconds SGLang gets to shut down after a stop signal before its group is killed


def serve_sglang(ctx: click.Context, method: str, target: str, draft: str | None, serve: ServeConfig,
                 engine_cfg: EngineConfig, block_size: int | None, dry_run: bool) -> None:
    """Launch SGLang with the method's flags (or print the command), record the run, follow it until it ends."""
    from adaflash.serve.sglang import build_sglang_command

    if engine_cfg.admit_batch is not None:
        fail("--admit-batch applies to the embedded engine (SGLang schedules its own prefills)")
    host, port, api_key = serve.host, serve.port, serve.api_key
    extra = [*serve.sglang_args, *(["--disable-overlap-schedule"] if engine_cfg.overlap is False else []),
             *(["--served-model-name", serve.served_model_name] if serve.served_model_name else []),
             *(["--stream-interval", str(serve.stream_interval)] if serve.stream_interval != 1 else [])]
    try:
        command = build_sglang_command(method, target, draft, host=host, port=port, gpus=serve.gpus, api_key=api_key,
                                       max_batch=engine_cfg.max_batch if given(ctx, "max_batch") else None,
                                       length_rate=engine_cfg.length_rate, min_length=engine_cfg.min_length,
                                       steps=engine_cfg.num_steps, block_size=block_size, extra_args=extra)
    except ValueError as err:
        fail(str(err))
    for note in command.notes:
        click.secho(f"note: {note}", fg="yellow", err=True)
    if dry_run:
        click.echo(command.shell())
        return
    import importlib.util

    if importlib.util.find_spec("sglang") is None:  # looked up, never imported
        fail("SGLang is not installed in this environment: `pip install 'adaflash[sglang]'` on a GPU machine "
             "(or use --dry-run to see the command)")
    log = runlog_of(ctx)
    from adaflash import procs

    config = {"engine": "sglang", "argv": [a if a != api_key else "***" for a in command.argv], "env": command.env,
              "host": host, "port": port}
    with recorded_run(log, "serve", name=f"serve-{method}-sglang", method=method, target=target, draft=draft,
                      config=config) as run:
        try:  # its own group (SGLang starts scheduler and detokenizer processes), SIGTERM if we die
            group = procs.spawn(command.argv, log=None, env={**os.environ, **command.env}, stdin=None)
        except OSError as err:
            run.finish("failed", note=str(err))
            fail(f"cannot start SGLang ({err}); install it with `pip install 'adaflash[sglang]'`")
        for sig in (signal.SIGTERM, signal.SIGINT):  # to SGLang's whole group; killed if still up after the grace
            signal.signal(sig, lambda signum, _frame: group.ask_stop(signum))
        url = f"http://{host}:{port}"
        threading.Thread(target=_announce_when_ready, args=(group, url, api_key), daemon=True).start()
        while group.alive():
            group.kill_if_overdue(SGLANG_STOP_GRACE)
            time.sleep(0.2)
        group.stop(grace=5.0)  # whatever SGLang left in its group goes with it
        code = group.returncode
        assert code is not None
        # Ended by the stop signal it was sent: stopped as asked, as the embedded server's run reads.
        run.finish(group.ended_as(clean=(0, -signal.SIGTERM, -signal.SIGINT)),
                   note=f"exit code {code}" + (" (killed after the stop grace)" if group.killed else ""))
    sys.exit(0 if code < 0 else code)


def _announce_when_ready(group: ProcessGroup, url: str, api_key: str | None) -> None:
    """Print our ready line once SGLang answers /health, so supervisors match one line for both engines."""
    import urllib.error
    import urllib.request

    from adaflash.serve.server import READY_LINE

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while group.alive():
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/health", headers=headers), timeout=5) as resp:
                if resp.status == 200:
                    click.echo(READY_LINE.format(url=url))
                    sys.stdout.flush()
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(2)
