"""`adaflash serve`: the embedded engine over HTTP (SGLang's dialect), or SGLang itself for a method."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import click

from adaflash.cli.common import DTYPE_HELP, chosen_drafter, fail, recorded_run, runlog_of, workspace_path_of
from adaflash.cli.engine_options import engine_options
from adaflash.cli.serve_adapt import adapt_config, adapt_options, build_adapter, rollback
from adaflash.engine.config import EngineConfig
from adaflash.methods import METHOD_NAMES, VANILLA

if TYPE_CHECKING:
    from adaflash.procs import ProcessGroup

DEFAULT_MAX_NEW_TOKENS_LIMIT = 2048  # one request may not hold a slot for longer than this many tokens


@click.group(invoke_without_command=True)
@click.option("--method", type=click.Choice(METHOD_NAMES), default=VANILLA, show_default=True)
@click.option("--target", default="smollm2-135m", show_default=True, help="Built-in name, HF id or local folder.")
@click.option("--draft", default=None, metavar="DIR|NAME",
              help="Drafter folder or built-in drafter's name (every method but vanilla; optional for mtp on SGLang; "
                   "dflash and adaflash default to the target's built-in drafter for each: `adaflash draft builtins`).")
@click.option("--engine", "engine_kind", type=click.Choice(["embedded", "sglang"]), default="embedded", show_default=True,
              help="embedded: our PyTorch engine (CPU or GPU); sglang: launch `python -m sglang.launch_server`.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=30000, show_default=True, help="Port (0: a free one).")
@click.option("--api-key", envvar="ADAFLASH_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' [env ADAFLASH_API_KEY].")
@click.option("--gpus", default=None, help="GPU indices (0,1) or 'cpu': indices of the GPUs we see (under CUDA_VISIBLE_DEVICES=2,3, 0 is GPU 2); sets the server's CUDA_VISIBLE_DEVICES (and --tp-size for SGLang).")
@click.option("--max-batch", type=click.IntRange(1, 4096), default=None,
              help="Requests decoded together (embedded default 16; SGLang --max-running-requests).")
@click.option("--max-new-tokens-limit", type=click.IntRange(0), default=DEFAULT_MAX_NEW_TOKENS_LIMIT, show_default=True,
              help="Embedded: refuse requests asking for more new tokens (0: only the context limits them).")
@click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Embedded: seconds a connection has to send a whole request head.")
@click.option("--keepalive-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Embedded: seconds an idle keep-alive connection stays open.")
@click.option("--served-model-name", default=None,
              help="The model id clients name and /v1/models lists (default: --target as given).")
@click.option("--max-connections", type=click.IntRange(1), default=None,
              help="Embedded: connections open at once; the oldest idle ones are closed to make room "
                   "(default: what the open-files limit allows).")
@engine_options(notes={
    "length_rate": "With --engine sglang: --thresh-head-threshold-rate.",
    "min_length": "With --engine sglang: --prob-head-candidate-len-min.",
    "num_steps": "With --engine sglang: --speculative-num-steps.",
    "admit_batch": "Embedded engine only.",
    "overlap": "With --engine sglang, --no-overlap passes SGLang's --disable-overlap-schedule.",
})
@click.option("--block-size", type=click.IntRange(2), default=None,
              help="SGLang DFlash: --speculative-dflash-block-size (default: the drafter's config).")
@click.option("--device", default="auto", show_default=True, help="Embedded: cpu, cuda, cuda:N or auto.")
@click.option("--dtype", default="bf16-if-native", show_default=True, help="Embedded: " + DTYPE_HELP)
@click.option("--sglang-arg", "sglang_args", multiple=True,
              help="Extra SGLang arguments, appended verbatim (repeatable; later flags override).")
@adapt_options
@click.option("--dry-run", is_flag=True, help="Print the command (SGLang) or the configuration (embedded) and exit.")
@click.pass_context
def serve(ctx: click.Context, method: str, target: str, draft: str | None, engine_kind: str, host: str, port: int,
          api_key: str | None, gpus: str | None, max_batch: int | None, max_new_tokens_limit: int,
          header_timeout: float, keepalive_timeout: float, max_connections: int | None, served_model_name: str | None,
          engine_cfg: EngineConfig, block_size: int | None, device: str, dtype: str, sglang_args: tuple[str, ...],
          dry_run: bool, **adapt: Any) -> None:
    """Serve a method over HTTP in SGLang's dialect (/generate, /health, /get_server_info, ...).

    The embedded engine batches requests from every client together; `--engine sglang` runs SGLang
    with the flags of the method instead (GPU clusters). The server prints
    `adaflash server ready on http://HOST:PORT` once it accepts requests and stops cleanly on
    SIGTERM/SIGINT; the run is recorded in the run log (kind "serve"). With `--adapt` it learns its
    own traffic (docs/http-api.md); `adaflash serve rollback --to N` undoes a version.
    """
    if ctx.invoked_subcommand is not None:
        return
    from adaflash.devices import child_devices

    try:  # the physical ids, read before anything below narrows CUDA_VISIBLE_DEVICES
        gpu_ids = child_devices(gpus, "--gpus") if gpus is not None else None
    except ValueError as err:
        fail(str(err))
    adapting = adapt_config(adapt, method, engine_kind, str(workspace_path_of(ctx)))
    if engine_kind == "sglang":
        if engine_cfg.admit_batch is not None:
            fail("--admit-batch applies to the embedded engine (SGLang schedules its own prefills)")
        extra = [*sglang_args, *(["--disable-overlap-schedule"] if engine_cfg.overlap is False else []),
                 *(["--served-model-name", served_model_name] if served_model_name else [])]
        _serve_sglang(ctx, method, target, draft, host, port, api_key, gpus, max_batch, engine_cfg, block_size, extra,
                      dry_run)
        return
    if sglang_args:
        fail("--sglang-arg only applies to --engine sglang")
    try:
        draft = chosen_drafter(method, draft, target)
    except ValueError as err:
        fail(str(err))
    if gpus is not None:
        if gpu_ids is None:
            device = "cpu"
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
            device = "cuda" if device == "auto" else device
            if len(gpu_ids) > 1:
                click.secho(f"note: the embedded engine uses one GPU; serving on GPU {gpu_ids[0]}", fg="yellow", err=True)
    engine_cfg = engine_cfg.replace(max_batch=max_batch) if max_batch else engine_cfg
    config = {"engine": "embedded", "method": method, "target": target, "draft": draft, "host": host, "port": port,
              "engine_config": engine_cfg.to_json(), "max_new_tokens_limit": max_new_tokens_limit or None,
              "header_timeout": header_timeout, "keepalive_timeout": keepalive_timeout, "max_connections": max_connections,
              "served_model_name": served_model_name, "device": device, "dtype": dtype, "gpus": gpus,
              "cuda_visible_devices": None if gpu_ids is None else ",".join(gpu_ids),
              "api_key": bool(api_key), "adapt": adapting}
    if dry_run:
        click.echo(json.dumps(config, indent=2))
        return
    _serve_embedded(ctx, config, api_key, engine_cfg)


def _serve_embedded(ctx: click.Context, config: dict, api_key: str | None, engine_cfg: EngineConfig) -> None:
    import asyncio

    from adaflash.engine.build import build_engine
    from adaflash.models.drafter_io import DrafterError
    from adaflash.serve.connections import ConnectionLimits
    from adaflash.serve.running import serve
    from adaflash.serve.server import READY_LINE, EmbeddedServer, hardware_name

    try:
        engine = build_engine(config["target"], config["method"], config["draft"], config=engine_cfg,
                              device=config["device"], dtype=config["dtype"])
    except (DrafterError, ValueError, FileNotFoundError, OSError) as err:
        fail(str(err))
    if engine.graphs.enabled:
        import time

        started = time.perf_counter()
        count = engine.capture_graphs()
        click.echo(f"captured {count} CUDA graphs in {time.perf_counter() - started:.1f} s", err=True)
    log = runlog_of(ctx)
    hardware = hardware_name(engine.device)
    config.update(device=str(engine.device), hardware=hardware, context_length=engine.max_len)
    with recorded_run(log, "serve", name=f"serve-{config['method']}{'-adapt' if config['adapt'] else ''}",
                      method=config["method"], target=config["target"], draft=config["draft"], config=config) as run:
        run_id = run.id
        adapter = None
        if config["adapt"]:
            from adaflash.workspace import runs_dir

            run_dir = runs_dir(log.root) / run_id
            try:
                adapter = build_adapter(config["adapt"], engine, target=config["target"], draft=config["draft"], log=log,
                                        run_id=run_id, run_dir=run_dir, seed=engine_cfg.seed)
            except (ValueError, OSError) as err:
                run.finish("failed", note=str(err))
                fail(str(err))
            log.update_run(run_id, run_dir=str(run_dir))

        def on_event(kind: str, data: dict) -> None:
            log.log_event(run_id, f"{kind}: {json.dumps(data)}")

        server = EmbeddedServer(engine, target=config["target"], draft=config["draft"], api_key=api_key,
                                max_new_tokens_limit=config["max_new_tokens_limit"], hardware=hardware, on_event=on_event,
                                served_model_name=config["served_model_name"], adapter=adapter,
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


def _serve_sglang(ctx: click.Context, method: str, target: str, draft: str | None, host: str, port: int,
                  api_key: str | None, gpus: str | None, max_batch: int | None, engine_cfg: EngineConfig, block_size: int | None,
                  extra: list[str], dry_run: bool) -> None:
    from adaflash.serve.sglang import build_sglang_command

    try:
        command = build_sglang_command(method, target, draft, host=host, port=port, gpus=gpus, api_key=api_key,
                                       max_batch=max_batch, length_rate=engine_cfg.length_rate,
                                       min_length=engine_cfg.min_length, steps=engine_cfg.num_steps,
                                       block_size=block_size, extra_args=extra)
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


serve.add_command(rollback)

SGLANG_STOP_GRACE = 60.0  # seconds SGLang gets to shut down after a stop signal before its group is killed


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
