"""`adaflash serve`: the embedded engine over HTTP (SGLang's dialect), or SGLang itself for a method."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from adaflash.cli.common import fail, workspace_path_of
from adaflash.cli.groups import setting_error, use, uses
from adaflash.cli.resolve import one_model
from adaflash.cli.serve_adapt import rollback
from adaflash.engine.config import EngineConfig
from adaflash.options import DrafterConfig, JobConfig, ModelConfig, SamplingConfig, ServeConfig
from adaflash.serve.adapt_config import AdaptConfig
from adaflash.settings import SettingError

ENGINE_NOTES = {
    "length_rate": "With --engine sglang: --thresh-head-threshold-rate.",
    "min_length": "With --engine sglang: --prob-head-candidate-len-min.",
    "num_steps": "With --engine sglang: --speculative-num-steps.",
    "admit_batch": "Embedded engine only.",
    "overlap": "With --engine sglang, --no-overlap passes SGLang's --disable-overlap-schedule.",
}


@click.group(invoke_without_command=True)
@uses(ModelConfig, use(ServeConfig, skip=("base_url", "server_url", "serve_args", "ready_timeout")), use(EngineConfig, notes=ENGINE_NOTES),
      use(DrafterConfig, only=("block_size",)), use(SamplingConfig, only=("seed",)), use(AdaptConfig, skip=("rollback_to",)),
      use(JobConfig, only=("dry_run",)), command="serve")
@click.pass_context
def serve(ctx: click.Context, model: ModelConfig, serve: ServeConfig, engine: EngineConfig, drafter: DrafterConfig,
          sampling: SamplingConfig, adapt: AdaptConfig, job: JobConfig) -> None:
    """Serve a method over HTTP in SGLang's dialect (/generate, /health, /get_server_info, ...).

    The embedded engine batches requests from every client together; `--engine sglang` runs SGLang
    with the flags of the method instead (GPU clusters). The server prints
    `adaflash server ready on http://HOST:PORT` once it accepts requests and stops cleanly on
    SIGTERM/SIGINT; the run is recorded in the run log (kind "serve"). With `--adapt` it learns its
    own traffic (docs/http-api.md); `adaflash serve rollback --to N` undoes a version.
    """
    if ctx.invoked_subcommand is not None:
        return
    engine = engine.replace(seed=sampling.seed or 0)
    gpu_ids = _gpu_ids(serve.gpus)  # the physical ids, read before anything below narrows CUDA_VISIBLE_DEVICES
    method, draft = one_model(model, builtin=False)
    adapting = _adapting(ctx, adapt, method, serve.engine, sampling.seed or 0)
    if serve.engine == "sglang":
        from adaflash.cli.serve_sglang import serve_sglang

        serve_sglang(ctx, method, model.target or "", draft, serve, engine, drafter.block_size, job.dry_run)
        return
    if serve.sglang_args:
        fail("--sglang-arg only applies to --engine sglang")
    method, draft = one_model(model)
    device = _device(model.device, serve.gpus, gpu_ids)
    config = _config(model, method, draft, serve, engine, device, gpu_ids, adapting)
    if job.dry_run:
        click.echo(json.dumps(config, indent=2))
        return
    from adaflash.cli.serve_embedded import serve_embedded

    serve_embedded(ctx, config, serve.api_key, engine, adapting)


def _gpu_ids(gpus: str | None) -> list[str] | None:
    from adaflash.devices import child_devices

    try:
        return child_devices(gpus, "--gpus") if gpus is not None else None
    except ValueError as err:
        fail(str(err))


def _adapting(ctx: click.Context, adapt: AdaptConfig, method: str, engine: str, seed: int) -> AdaptConfig | None:
    """The adapt settings for this server (None without --adapt), its combinations checked."""
    if not adapt.enabled:
        return None
    try:
        return adapt.for_server(method, engine, str(workspace_path_of(ctx)), seed=seed)
    except SettingError as err:
        fail(setting_error(err))


def _device(device: str, gpus: str | None, gpu_ids: list[str] | None) -> str:
    """--gpus narrows the server's CUDA_VISIBLE_DEVICES (the embedded engine uses the first GPU)."""
    if gpus is None:
        return device
    if gpu_ids is None:
        return "cpu"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    if len(gpu_ids) > 1:
        click.secho(f"note: the embedded engine uses one GPU; serving on GPU {gpu_ids[0]}", fg="yellow", err=True)
    return "cuda" if device == "auto" else device


def _config(model: ModelConfig, method: str, draft: str | None, serve: ServeConfig, engine: EngineConfig,
            device: str, gpu_ids: list[str] | None, adapting: AdaptConfig | None) -> dict[str, Any]:
    """The server's record (the run log's config, and what --dry-run prints)."""
    return {"engine": "embedded", "method": method, "target": model.target, "draft": draft, "host": serve.host,
            "port": serve.port, "engine_config": engine.to_json(),
            "max_new_tokens_limit": serve.max_new_tokens_limit or None, "header_timeout": serve.header_timeout,
            "keepalive_timeout": serve.keepalive_timeout, "max_connections": serve.max_connections,
            "stream_interval": serve.stream_interval,
            "served_model_name": serve.served_model_name, "device": device, "dtype": model.dtype, "gpus": serve.gpus,
            "cuda_visible_devices": None if gpu_ids is None else ",".join(gpu_ids), "api_key": bool(serve.api_key),
            "adapt": adapting.to_json() if adapting else None}


serve.add_command(rollback)
