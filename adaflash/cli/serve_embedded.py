"""`adaflash serve` on the embedded engine: build it, record the run, serve, log metrics as it runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import click

from adaflash.cli.common import fail, recorded_run, runlog_of
from adaflash.cli.groups import setting_error
from adaflash.engine.config import EngineConfig
from adaflash.serve.adapt_config import AdaptConfig
from adaflash.settings import SettingError


def serve_embedded(ctx: click.Context, config: dict, api_key: str | None, engine_cfg: EngineConfig,
                   adapt: AdaptConfig | None) -> None:
    """Build the engine, record the run, serve until SIGTERM/SIGINT (the run ends as the server did).

    The engine runs in a process of its own (`serve/engine_process.py`), except with --adapt, whose trainer
    swaps drafters into the engine object, or where ADAFLASH_ENGINE_THREAD=1 asks for the engine thread (to
    measure one against the other)."""
    import asyncio

    from adaflash.models.drafter_io import DrafterError
    from adaflash.serve.connections import ConnectionLimits
    from adaflash.serve.engine_process import EngineProcess, EngineSpec, EngineStartError
    from adaflash.serve.running import serve
    from adaflash.serve.server import READY_LINE, EmbeddedServer, hardware_name

    spec = EngineSpec(config["target"], config["method"], config["draft"], engine_cfg, config["device"],
                      config["dtype"], config["stream_interval"])
    process = None
    try:
        if adapt is None and os.environ.get("ADAFLASH_ENGINE_THREAD") != "1":
            process = EngineProcess(spec)
            engine = process.start_engine()
            hardware = engine.hardware
        else:
            engine = spec.build()
            hardware = hardware_name(engine.device)
    except (DrafterError, EngineStartError, ValueError, FileNotFoundError, OSError) as err:
        fail(str(err))
    log = runlog_of(ctx)
    config.update(device=str(engine.device), hardware=hardware, context_length=engine.max_len,
                  engine_process=process is not None)
    with recorded_run(log, "serve", name=f"serve-{config['method']}{'-adapt' if config['adapt'] else ''}",
                      method=config["method"], target=config["target"], draft=config["draft"], config=config) as run:
        run_id = run.id
        adapter = None
        if adapt is not None:
            from adaflash.serve.adapt import Adapter
            from adaflash.workspace import runs_dir

            run_dir = runs_dir(log.root) / run_id
            try:
                adapter = Adapter(adapt.replace(max_len=min(engine.max_len, 2048)), engine, target=config["target"],
                                  draft=config["draft"], log=log, run_id=run_id, run_dir=run_dir)
                adapter.resume()
            except SettingError as err:
                run.finish("failed", note=setting_error(err))
                fail(setting_error(err))
            except (ValueError, OSError) as err:
                run.finish("failed", note=str(err))
                fail(str(err))
            log.update_run(run_id, run_dir=str(run_dir))

        def on_event(kind: str, data: dict) -> None:
            log.log_event(run_id, f"{kind}: {json.dumps(data)}")

        server = EmbeddedServer(engine, target=config["target"], draft=config["draft"], api_key=api_key,
                                max_new_tokens_limit=config["max_new_tokens_limit"], hardware=hardware, on_event=on_event,
                                served_model_name=config["served_model_name"], adapter=adapter,
                                stream_interval=config["stream_interval"], engine_process=process,
                                limits=ConnectionLimits(header_timeout=config["header_timeout"],
                                                        keepalive_timeout=config["keepalive_timeout"],
                                                        max_connections=config["max_connections"]))

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)

            def ready(url: str) -> None:
                log.update_run(run_id, config={**config, "url": url})
                log.log_event(run_id, f"ready on {url}")
                click.echo(READY_LINE.format(url=url))
                sys.stdout.flush()

            metrics = asyncio.create_task(_log_metrics(server, log, run_id, stop))
            try:
                await serve(server, config["host"], config["port"], stop, ready)
            finally:
                stop.set()
                await metrics

        try:
            asyncio.run(main())
        except OSError as err:  # the port is taken, the host is wrong
            run.finish("failed", note=str(err))
        finally:
            if process is not None:  # stopped with the server's app already, unless it never started
                process.stop()
            info = server.info()
            run.metrics({k: info[k] for k in ("requests_served", "completion_tokens", "verify_ct")
                         if info.get(k) is not None})
    if run.status == "failed":
        fail(f"the server stopped: {run.note}")
    click.echo("adaflash server stopped", err=True)


async def _log_metrics(server, log, run_id: str, stop) -> None:
    """Every few seconds, what the TUI follows: served requests, τ, throughput, queue depth."""
    import asyncio

    last = None
    failing = False
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=5.0)
        info = server.info()
        values = {"requests_served": info["requests_served"], "avg_spec_accept_length": info["avg_spec_accept_length"],
                  "gen_throughput": info["last_gen_throughput"], "queue_depth": info["queue_depth"],
                  "running_requests": info["running_requests"]}
        key = (values["requests_served"], values["queue_depth"], values["running_requests"])
        if key != last:
            try:
                await loop.run_in_executor(None, lambda v=values: log.log_metrics(run_id, v, job="server"))
            except Exception as err:  # out of file descriptors, a locked log: try again next time
                if not failing:
                    click.echo(f"adaflash serve: cannot write metrics to the run log ({err}); retrying", err=True)
                failing = True
                continue
            last, failing = key, False
